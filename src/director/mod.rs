//! The director role: placement, heartbeats and liveness, rolling restarts, fences, evacuations
//! (docs/reference/http.md, docs/deploy/cluster.md), plus `POST /v1/host-token` (docs/reference/http.md).
//!
//! Decisions are pure functions (`liveness`, `placement`); durable work is in `store::{cells,
//! placement, assignments, migrations}`; this module and `routes` are the glue.

pub mod admin;
pub mod assign;
pub mod connect_redirect;
pub mod heartbeat;
pub mod host_token;
pub mod lanes;
pub mod liveness;
pub mod migrate;
pub mod placement;
pub mod region;
pub mod rehome_worker;
pub mod rejections;
pub mod routes;
pub mod sweeps;
pub mod web;

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use warp::filters::BoxedFilter;
use warp::Filter;

use crate::app::Ctx;
use crate::contract::overview::PushOverview;
use crate::contract::wire::CellHeartbeat;
use crate::crypto::jwt::{HostTokenVerifier, JwksSource};
use crate::http::Response;
use crate::store::cells::{self, CellSpec};
use heartbeat::BeatError;

pub use heartbeat::HeartbeatRefusal;
use lanes::{Batcher, Lane};
use liveness::Admission;
use rejections::RejectLog;

/// One sticky request's outcome.
pub type StickyResult = Result<assign::Grant, assign::AssignError>;

/// The sticky lane's batcher: a batch of at most [`STICKY_BATCH_MAX`] queued hosts runs
/// [`assign::assign_sticky_batch`]; its hosts are counted by path
/// (`orca_relay_sticky_batch_hosts_total`).
///
/// [`STICKY_BATCH_MAX`]: crate::contract::limits::STICKY_BATCH_MAX
fn sticky_batcher(ctx: &Ctx) -> Arc<Batcher<assign::StickyAsk, StickyResult>> {
    let db = ctx.db.clone();
    let regions = Arc::new(ctx.config.regions.clone());
    let hosts = ctx.metrics.register_counter_vec(
        "orca_relay_sticky_batch_hosts_total",
        "sticky assigns by path: granted by a batch's one transaction, or on the single path \
         (row busy, charge, move, refusal or not sticky)",
        &["path"],
    );
    for path in ["batch", "single"] {
        let _ = hosts.with_label_values(&[path]);
    }
    let tasks = ctx.clone();
    let spawn: lanes::SpawnBatch = Arc::new(move |batch| {
        tasks.spawn("sticky-batch", batch);
    });
    Batcher::new(
        crate::contract::limits::STICKY_BATCH_MAX,
        spawn,
        move |asks: Vec<assign::StickyAsk>| {
            let (db, regions, hosts) = (db.clone(), regions.clone(), hosts.clone());
            async move {
                let (results, batched) = assign::assign_sticky_batch(&db, &asks, &regions).await;
                hosts.with_label_values(&["batch"]).inc_by(batched as u64);
                hosts
                    .with_label_values(&["single"])
                    .inc_by(asks.len().saturating_sub(batched) as u64);
                results
            }
        },
    )
}

/// The director of this process.
pub struct Director {
    pub ctx: Ctx,
    /// K of docs/reference/http.md: the HS256 key of self-hosted host tokens.
    pub host_token_key: [u8; 32],
    pub verifier: HostTokenVerifier,
    pub placement_lane: Arc<Lane>,
    pub sticky_lane: Arc<Lane>,
    /// The sticky lane's batches ([`assign::assign_sticky_batch`]).
    pub sticky_batch: Arc<Batcher<assign::StickyAsk, StickyResult>>,
    pub resolve_lane: Arc<Lane>,
    pub rejects: Arc<RejectLog>,
    /// `/v1/regions` cache (30 s, single-flight).
    pub(crate) regions_cache: tokio::sync::Mutex<Option<(std::time::Instant, serde_json::Value)>>,
    /// Pre-auth admission of the invite redirect's phone sockets.
    pub redirect_admission: connect_redirect::RedirectAdmission,
    stop: CancellationToken,
    sweeps: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The idle-rehome worker, when it runs.
    rehome_worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The overview's `push` section, when the push role runs in this process.
    push_overview: std::sync::OnceLock<Arc<dyn PushOverview>>,
    /// `deferred` answers the idle-rehome worker received (the overview's trailing-24 h count).
    pub rehome_deferred: region::DeferredTally,
}

impl Director {
    pub async fn start(ctx: Ctx) -> Result<Arc<Director>, String> {
        let signing = ctx
            .config
            .secrets
            .assignment_signing_key
            .clone()
            .ok_or("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY is required for role director")?;
        let key = crate::crypto::jwt::self_hosted_key(&signing);
        let jwks = match (&ctx.config.auth_issuer, &ctx.config.jwks_url) {
            (Some(issuer), Some(url)) => Some(JwksSource {
                issuer: issuer.clone(),
                url: url.clone(),
            }),
            _ => None,
        };
        let cfg = &ctx.config;
        ctx.metrics.zero_regions(&cfg.regions);
        let resolve_cfg = crate::config::LaneConfig {
            concurrency: 1,
            queue_max: 128,
            wait_ms: 5_000,
            retry_after_s: cfg.placement_lane.retry_after_s,
        };
        let director = Arc::new(Director {
            host_token_key: key,
            verifier: HostTokenVerifier::new(key, jwks),
            placement_lane: Lane::new("placement", cfg.placement_lane, true),
            sticky_lane: Lane::new("sticky", cfg.sticky_lane, true),
            sticky_batch: sticky_batcher(&ctx),
            resolve_lane: Lane::new("resolve", resolve_cfg, false),
            rejects: RejectLog::new(),
            regions_cache: tokio::sync::Mutex::new(None),
            redirect_admission: Default::default(),
            stop: ctx.child_token(),
            sweeps: Mutex::new(None),
            rehome_worker: Mutex::new(None),
            push_overview: std::sync::OnceLock::new(),
            rehome_deferred: Default::default(),
            ctx,
        });
        director.register_configured_cells().await?;
        let handle = sweeps::spawn(director.clone(), director.stop.clone());
        *crate::sync::lock(&director.sweeps) = Some(handle);
        let worker = rehome_worker::spawn(director.clone(), director.stop.clone());
        *crate::sync::lock(&director.rehome_worker) = worker;
        director.start_outcomes_log();
        Ok(director)
    }

    /// `ORCA_RELAY_CELLS` (all or nothing) and the local cell of a process that also runs `cell`.
    async fn register_configured_cells(&self) -> Result<(), String> {
        let cfg = &self.ctx.config;
        let mut specs: Vec<CellSpec> = cfg
            .cells
            .iter()
            .map(|c| CellSpec {
                cell_id: c.id.clone(),
                cell_url: c.url.clone(),
                region: c.region.clone(),
                capacity_requests: c.capacity_requests,
                cap_and_bound: c.connection_hard_cap.zip(c.connection_unobserved_bound),
                initial_state: c
                    .initial_state
                    .as_deref()
                    .and_then(Admission::parse)
                    .unwrap_or(Admission::General),
            })
            .collect();
        if cfg.roles.cell && !specs.iter().any(|s| s.cell_id == cfg.cell_id) {
            specs.push(CellSpec {
                cell_id: cfg.cell_id.clone(),
                cell_url: cfg.cell_url.clone(),
                region: cfg.region.clone(),
                capacity_requests: cfg.cell_capacity,
                cap_and_bound: cfg
                    .hard_cap
                    .map(|h| (h.cap as i64, h.unobserved_bound as i64)),
                initial_state: Admission::General,
            });
        }
        if specs.is_empty() {
            return Ok(());
        }
        cells::upsert_all(&self.ctx.db, &specs, crate::clock::now_ms())
            .await
            .map(|_| ())
            .map_err(|e| format!("ORCA_RELAY_CELLS: cannot register cells: {e:?}"))
    }

    /// A heartbeat that entered in-process or through `POST /v1/admin/cell-heartbeat` (after the
    /// token checks): the same validation and transaction either way.
    pub async fn heartbeat(&self, body: &CellHeartbeat) -> Result<(), HeartbeatRefusal> {
        let beat = match heartbeat::validate(body, &self.ctx.config.regions) {
            Ok(b) => b,
            Err(HeartbeatRefusal::Invalid(msg)) => {
                log::warn!("[orca-relay] cell heartbeat invalid: {msg}");
                return Err(HeartbeatRefusal::Invalid(msg));
            }
            Err(e) => return Err(e),
        };
        self.apply_beat(&beat).await
    }

    pub(crate) async fn apply_beat(
        &self,
        beat: &crate::model::Beat,
    ) -> Result<(), HeartbeatRefusal> {
        let r = heartbeat::apply(&self.ctx.db, beat, crate::clock::now_ms()).await;
        let outcome = match &r {
            Ok(()) => "ok",
            Err(BeatError::Refused(code)) => code,
            Err(BeatError::Db(_)) => "database_unavailable",
        };
        debug_assert!(
            crate::metrics::labels::known(crate::metrics::labels::HEARTBEAT_OUTCOMES, outcome),
            "{outcome}"
        );
        self.ctx
            .metrics
            .heartbeats
            .with_label_values(&[outcome])
            .inc();
        if r.is_ok() {
            self.ctx
                .metrics
                .cell_live
                .with_label_values(&[&beat.cell_id])
                .set(beat.ready as i64);
        }
        match r {
            Ok(()) => Ok(()),
            Err(BeatError::Refused(code)) => Err(HeartbeatRefusal::Refused(code)),
            Err(BeatError::Db(e)) => {
                log::warn!("[orca-relay] cell heartbeat failed: {e}");
                Err(HeartbeatRefusal::Unavailable)
            }
        }
    }

    /// Gives the admin overview its `push` section (the composition root calls this when the push
    /// role runs in this process). A second call is ignored.
    pub fn attach_push_overview(&self, push: Arc<dyn PushOverview>) {
        let _ = self.push_overview.set(push);
    }

    /// The director's HTTP routes.
    pub fn routes(self: &Arc<Self>) -> BoxedFilter<(Response,)> {
        routes::all(self.clone())
            .or(admin::routes(self.clone()))
            .unify()
            .boxed()
    }

    /// `/v1/connect/<relayHostId>` on a director without a cell: the invite redirect of
    /// docs/reference/websocket.md.
    pub async fn connect_redirect(
        self: &Arc<Self>,
        req: http::Request<hyper::body::Incoming>,
        peer: std::net::SocketAddr,
    ) -> Response {
        connect_redirect::handle(self, req, peer).await
    }

    /// Stops background loops (sweeps, workers) at shutdown.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let handles = [
            crate::sync::lock(&self.sweeps).take(),
            crate::sync::lock(&self.rehome_worker).take(),
        ];
        for h in handles.into_iter().flatten() {
            let _ = h.await;
        }
    }
}

impl Director {
    /// Drops the `/v1/regions` cache (what 30 s of waiting does).
    pub async fn expire_regions_cache(&self) {
        *self.regions_cache.lock().await = None;
    }
}
