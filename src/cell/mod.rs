//! The cell role: the three WebSocket legs, host sessions, phone admission and splicing
//! (docs/reference/websocket.md).
//!
//! - [`legs`]: upgrade gates (raw refusals) and dispatch to the leg handlers.
//! - [`ledger`]: pure connection-ledger bookkeeping (pre-auth admission and the socket toolkit are
//!   [`crate::leg`]).
//! - [`control`]: host handshake, activation, control loop and tick.
//! - [`phone`]: phone admission, data-leg attach, splice lifecycle.
//! - [`splice`]: the hot path.
//! - [`drain`]: `POST /v1/admin/drain` and SIGTERM.
//! - [`renew`]: batched control-activity renewal.

pub mod control;
pub mod drain;
pub mod frame_rewrite;
pub mod frames;
pub mod heartbeat;
pub mod heartbeat_client;
pub mod idle_rehome;
pub mod ledger;
pub mod legs;
pub mod phone;
pub mod release;
pub mod renew;
pub mod session;
pub mod splice;
pub mod testkit;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use warp::filters::BoxedFilter;
use warp::Filter;

use crate::app::Ctx;
use crate::contract::heartbeat::HeartbeatSink;
use crate::crypto::{HostTokenVerifier, JwksSource};
use crate::http::Response;
use crate::leg::admission::PreAuthGate;
use crate::leg::Leg;
use crate::store::assignments::HostKey;

use ledger::Ledger;
use session::{Registry, SignedOut};

/// The cell of this process.
pub struct Cell {
    pub ctx: Ctx,
    pub verifier: HostTokenVerifier,
    pub preauth: PreAuthGate,
    /// Capped cells only.
    pub ledger: Option<Mutex<Ledger>>,
    /// Open leg sockets (uncapped accounting).
    pub open: AtomicU64,
    pub budget: splice::Budget,
    pub splice_limits: splice::Limits,
    /// The splice frame and byte counters, looked up once for every splice of the cell.
    pub splice_meter: SpliceMeter,
    /// Wakes quiet splices once a round so they can park (memory per idle socket).
    pub sweep: Arc<splice::IdleSweep>,
    pub registry: Mutex<Registry>,
    pub signed_out: Mutex<SignedOut>,
    /// Set once by the first drain (or SIGTERM), never cleared; shared with the release tasks,
    /// which keep retrying only on a draining cell (see [`Cell::release_activity_then`]).
    pub draining: Arc<AtomicBool>,
    /// Bumped by every drain: a later drain cancels the earlier one's pending sends and closes.
    pub drain_epoch: AtomicU64,
    pub renewer: renew::Renewer,
    pub releaser: release::Releaser,
    pub counts: Counts,
    /// Idle regional rehome: running attempts and held idle-work tokens.
    pub idle: Arc<Mutex<idle_rehome::IdleRehome>>,
    /// The 30 s window of the cell's own safety counters.
    pub safety: Mutex<crate::rehome::rules::SafetyWindow>,
}

/// Live counts for `/v1/admin/runtime-status` and heartbeats.
#[derive(Default)]
pub struct Counts {
    pub controls: AtomicI64,
    pub splices: AtomicI64,
    pub pending: AtomicI64,
    /// Control activities whose re-acquire failed: the safety object's
    /// `controlActivityRecoveryFailures`.
    pub recovery_failures: AtomicI64,
    /// Times an idle control socket gave its codec back (see `control::control_loop`).
    pub control_parks: AtomicI64,
}

impl Counts {
    pub fn recovery_failures(&self) -> i64 {
        self.recovery_failures.load(Ordering::Relaxed)
    }
}

impl Cell {
    /// Starts the cell; with a `heartbeat` sink its first beat is delivered before this returns.
    pub async fn start(
        ctx: Ctx,
        heartbeat: Option<Arc<dyn HeartbeatSink>>,
    ) -> Result<Arc<Cell>, String> {
        let signing = ctx
            .config
            .secrets
            .assignment_signing_key
            .clone()
            .ok_or("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY is required for role cell")?;
        let jwks = match (&ctx.config.jwks_url, &ctx.config.auth_issuer) {
            (Some(url), Some(issuer)) => Some(JwksSource {
                issuer: issuer.clone(),
                url: url.clone(),
            }),
            _ => None,
        };
        let verifier = HostTokenVerifier::new(crate::crypto::self_hosted_key(&signing), jwks);
        let ledger = ctx.config.hard_cap.map(|c| Mutex::new(Ledger::new(c.cap)));
        let renewer = renew::Renewer::start(ctx.clone());
        let draining = Arc::new(AtomicBool::new(false));
        let releaser = release::Releaser::start(ctx.clone(), draining.clone());
        let cell = Arc::new(Cell {
            verifier,
            preauth: PreAuthGate::default(),
            ledger,
            open: AtomicU64::new(0),
            budget: splice::Budget::default(),
            splice_limits: splice::Limits::default(),
            splice_meter: SpliceMeter::new(&ctx.metrics),
            sweep: Default::default(),
            registry: Mutex::new(Registry::default()),
            signed_out: Mutex::new(SignedOut::default()),
            draining,
            drain_epoch: AtomicU64::new(0),
            renewer,
            releaser,
            counts: Counts::default(),
            idle: Default::default(),
            safety: Mutex::new(crate::rehome::rules::SafetyWindow::new(ctx.started_at)),
            ctx,
        });
        {
            let (sweep, stop) = (cell.sweep.clone(), cell.ctx.child_token());
            cell.ctx.spawn("splice-idle-sweep", async move {
                let mut every = tokio::time::interval(splice::SWEEP_INTERVAL);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = every.tick() => sweep.tick(),
                        _ = stop.cancelled() => break,
                    }
                }
            });
        }
        if let Some(sink) = heartbeat {
            let sink: Arc<dyn HeartbeatSink> = Arc::new(idle_rehome::StatusAfterBeat {
                inner: sink,
                cell: Arc::downgrade(&cell),
            });
            let c = cell.clone();
            let body = move || {
                let c = c.clone();
                async move {
                    let ready = c.ctx.readiness.check().await.is_ready();
                    c.heartbeat_body(ready)
                }
            };
            heartbeat::start(&cell.ctx, sink, body).await;
        }
        Ok(cell)
    }

    /// HTTP routes of the cell role: drain and idle rehome.
    pub fn routes(self: &Arc<Self>) -> BoxedFilter<(Response,)> {
        drain::route(self.clone())
            .or(idle_rehome::route(self.clone()))
            .unify()
            .boxed()
    }

    /// Handles a request on a WebSocket leg path (`/v1/host/control`, `/v1/host/data/…`,
    /// `/v1/connect/…`): the upgrade gates, then the leg.
    pub async fn upgrade(
        self: &Arc<Self>,
        req: http::Request<Incoming>,
        peer: SocketAddr,
    ) -> Response {
        legs::upgrade(self, req, peer).await
    }

    /// The `runtime` object of `/v1/admin/runtime-status`.
    pub fn runtime_counts(&self) -> serde_json::Value {
        serde_json::json!({
            "controls": self.counts.controls.load(Ordering::Relaxed),
            "splices": self.counts.splices.load(Ordering::Relaxed),
            "pendingSplices": self.counts.pending.load(Ordering::Relaxed),
            "preAuth": self.preauth().awaiting(),
            "queuedBytes": self.budget.used(),
        })
    }

    /// pre-auth sockets + live controls + splices + pending phones (heartbeat `observedRequests`).
    pub fn observed_requests(&self) -> i64 {
        self.preauth().awaiting() as i64
            + self.counts.controls.load(Ordering::Relaxed)
            + self.counts.splices.load(Ordering::Relaxed)
            + self.counts.pending.load(Ordering::Relaxed)
    }

    /// True once a drain was requested.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// SIGTERM: drain with the shutdown grace and close every socket (docs/operations.md).
    pub async fn shutdown(self: &Arc<Self>) {
        // Activity releases run on the process tracker, which `server.rs` waits for before it
        // closes the database.
        drain::shutdown(self).await;
    }

    pub fn preauth(&self) -> &PreAuthGate {
        &self.preauth
    }

    pub fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        crate::sync::lock(&self.registry)
    }

    pub fn with_ledger<T>(&self, f: impl FnOnce(&mut Ledger) -> T) -> Option<T> {
        self.ledger.as_ref().map(|l| f(&mut crate::sync::lock(l)))
    }

    /// Releases an activity in the background (idempotent in the store; failures are logged).
    /// Releases run on the process tracker so shutdown waits for them: a drained process must not leave its
    /// control leases charged to the cell after it exits.
    pub fn release_activity(&self, key: &HostKey, activity_id: String) {
        self.release_activity_then(key, activity_id, || {});
    }

    /// As [`Cell::release_activity`], then runs `then` once the first attempt has ended (landed or
    /// failed) or [`release::RELEASE_DEADLINE`] has passed, whichever comes first: a stuck
    /// database never keeps a socket open. Releases are batched ([`release`]).
    ///
    /// An attempt that misses the deadline is not cancelled; it goes on until the store answers
    /// (each statement is bounded by the backend). One that fails is retried on a draining cell,
    /// every [`release::RELEASE_RETRY_MIN`] doubling to [`release::RELEASE_RETRY_MAX`], until one
    /// lands or the lease could no longer be live anyway
    /// ([`crate::contract::limits::CONTROL_ACTIVITY_EXPIRY_MAX_MS`] after the first attempt;
    /// shutdown's bounded task wait ends it earlier). A draining cell activates nothing
    /// (docs/operations.md step 1), so the id cannot have been given to a new session of this process
    /// meanwhile, and the release is idempotent: the late delete can only remove the lease this
    /// process gave up. Before, an attempt was cancelled at 2 s and never retried: the lease of a
    /// host that left, still attributed to this running process, stayed until it expired (up to
    /// 105 s after its last renewal) next to the control the host activated on another cell
    /// (issue 12's roll under database pressure). Off a drain a failed attempt is not retried, as
    /// before: the session ids of a live cell can be reused (a new session starts again at
    /// generation 1), and the renewal and the expiry sweep settle it.
    pub fn release_activity_then(
        &self,
        key: &HostKey,
        activity_id: String,
        then: impl FnOnce() + Send + 'static,
    ) {
        self.releaser.submit(release::Release::new(
            key.clone(),
            activity_id,
            Box::new(then),
            crate::clock::now_ms(),
        ));
    }

    /// Releases an activity and returns once the first attempt has ended (landed, failed, or
    /// [`release::RELEASE_DEADLINE`] passed; retries continue as in [`Cell::release_activity_then`]). For
    /// a relay-initiated close the host will act on: the host hears it only after its lease here
    /// is gone, so a host that re-resolves at once never finds its old control still held by
    /// this process next to the new one.
    pub async fn release_activity_before_close(&self, key: &HostKey, activity_id: String) {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.release_activity_then(key, activity_id, move || {
            let _ = done.send(());
        });
        let _ = wait.await;
    }
}

/// One open leg socket's share of the connection accounting; released on drop.
impl Cell {
    /// A relay-initiated close of a `leg` socket (`ws::close`), counted in
    /// `orca_relay_ws_closes_total{leg,code}`.
    pub async fn close_leg<S>(
        &self,
        leg: Leg,
        ws: &mut tokio_tungstenite::WebSocketStream<S>,
        code: u16,
        reason: &str,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        self.count_close(leg, code);
        crate::leg::ws::close(ws, code, reason).await;
    }

    /// Counts a relay-initiated close done elsewhere (the splice teardown closes both at once).
    pub fn count_close(&self, leg: Leg, code: u16) {
        debug_assert!(
            crate::metrics::labels::CLOSE_CODES.contains(&code),
            "close code {code}"
        );
        self.ctx
            .metrics
            .ws_closes
            .with_label_values(&[leg.name(), &code.to_string()])
            .inc();
    }
}

pub struct ConnGuard {
    cell: Arc<Cell>,
    leg: Leg,
}

impl ConnGuard {
    /// The socket's handshake completed: its in-flight unit becomes physical.
    pub fn opened(cell: &Arc<Cell>, leg: Leg) -> ConnGuard {
        cell.with_ledger(|l| l.complete());
        cell.open.fetch_add(1, Ordering::Relaxed);
        cell.ctx
            .metrics
            .connections
            .with_label_values(&[leg.name()])
            .inc();
        ConnGuard {
            cell: cell.clone(),
            leg,
        }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.cell.with_ledger(|l| l.close());
        self.cell.open.fetch_sub(1, Ordering::Relaxed);
        self.cell
            .ctx
            .metrics
            .connections
            .with_label_values(&[self.leg.name()])
            .dec();
    }
}

/// Where live splices fold their counts (`orca_relay_splice_frames_total` and
/// `orca_relay_splice_bytes_total` by direction): the four series resolved once per cell.
pub struct SpliceMeter {
    frames: [prometheus::IntCounter; 2],
    bytes: [prometheus::IntCounter; 2],
}

impl SpliceMeter {
    fn new(m: &crate::metrics::Metrics) -> SpliceMeter {
        let dirs = ["to_host", "to_phone"];
        SpliceMeter {
            frames: dirs.map(|d| m.splice_frames.with_label_values(&[d])),
            bytes: dirs.map(|d| m.splice_bytes.with_label_values(&[d])),
        }
    }

    /// Adds one fold of a splice's counts.
    pub fn fold(&self, d: splice::Stats) {
        self.frames[0].inc_by(d.frames_to_host);
        self.frames[1].inc_by(d.frames_to_phone);
        self.bytes[0].inc_by(d.bytes_to_host);
        self.bytes[1].inc_by(d.bytes_to_phone);
    }
}
