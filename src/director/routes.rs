//! HTTP glue of the director (docs/reference/http.md): authentication, body limits, strict schemas, lanes,
//! then the store operations. Every refusal is a concrete response with the spec's status, code
//! and headers.

// Handlers return the finished reply as their error value (`Result<_, Response>`), like
// `http::parse`; boxing it would only add noise.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::json;
use warp::filters::BoxedFilter;
use warp::Filter;

use super::assign::{self as sp, AssignError, AssignOptions};
use super::heartbeat::{self, HeartbeatRefusal};
use super::lanes::{LanePermit, LaneReject};
use super::rejections::Rejection;
use super::web::{bytes, db_unavailable, post};
use super::Director;
use crate::clock;
use crate::contract::wire::{CellHeartbeat, CellRehomeStatus};
use crate::crypto;
use crate::director::placement::Refusal;
use crate::http::{self as h, Body, Response};
use crate::metrics::labels;
use crate::rehome::rules::RegionCorrection;
use crate::store::assignments::HostKey;

const UNAVAILABLE: &str = "assignments_temporarily_unavailable";

/// The public and node director routes (the operator routes are `admin::routes`).
pub fn all(d: Arc<Director>) -> BoxedFilter<(Response,)> {
    super::host_token::route(d.clone())
        .or(post(d.clone(), "/v1/assign", |d, hd, b| async move {
            let t = Instant::now();
            let r = d.clone().assign_route(hd, b).await;
            d.observe("assign", t, &r);
            r
        }))
        .unify()
        .or(post(d.clone(), "/v1/resolve", |d, _hd, b| async move {
            let t = Instant::now();
            let r = d.clone().resolve_route(b).await;
            d.observe("resolve", t, &r);
            r
        }))
        .unify()
        .or(post(
            d.clone(),
            "/v1/admin/cell-heartbeat",
            |d, hd, b| async move { d.heartbeat_route(hd, b).await },
        ))
        .unify()
        .or(post(
            d.clone(),
            "/v1/admin/cell-rehome-status",
            |d, hd, b| async move { d.rehome_status_route(hd, b).await },
        ))
        .unify()
        .or(regions_route(d))
        .unify()
        .boxed()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AssignRequest {
    v: u8,
    relay_host_id: String,
    #[serde(default)]
    reconnect: Option<bool>,
    #[serde(default)]
    preferred_region: Option<String>,
    /// Present-but-`null` stays `Some(Null)` so the strict schema rejects it.
    #[serde(default, deserialize_with = "present")]
    region_correction: Option<serde_json::Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResolveRequest {
    v: u8,
    relay_host_id: String,
    resume_token: String,
}

/// The body checks of `POST /v1/assign` before any store call: strict schema, `v`, the id's
/// shape, a configured `preferredRegion` and a well-formed `regionCorrection`.
fn decode_assign(
    bytes: &[u8],
    regions: &[String],
) -> Result<(AssignRequest, Option<RegionCorrection>), Response> {
    let req: AssignRequest = h::parse(bytes)?;
    if req.v != 1
        || !crypto::ident::is_relay_host_id(&req.relay_host_id)
        || req
            .preferred_region
            .as_ref()
            .is_some_and(|r| !regions.contains(r))
    {
        return Err(h::bad_request());
    }
    let rc = match &req.region_correction {
        None => None,
        Some(v) => Some(
            crate::rehome::rules::parse_region_correction(v, regions).ok_or_else(h::bad_request)?,
        ),
    };
    Ok((req, rc))
}

/// The body checks of `POST /v1/resolve` before any store call.
fn decode_resolve(bytes: &[u8]) -> Result<ResolveRequest, Response> {
    let req: ResolveRequest = h::parse(bytes)?;
    if req.v != 1
        || !crypto::ident::is_relay_host_id(&req.relay_host_id)
        || !is_b64u32(&req.resume_token)
    {
        return Err(h::bad_request());
    }
    Ok(req)
}

/// Fuzzing entry (`fuzz/fuzz_targets/relay_bodies.rs`): the body checks of `/v1/assign` and
/// `/v1/resolve` exactly as their handlers run them; `None` for a path this module does not own.
#[doc(hidden)]
pub fn decode_body_for_fuzzing(
    path: &str,
    bytes: &[u8],
    regions: &[String],
) -> Option<Result<(), Response>> {
    match path {
        "/v1/assign" => Some(decode_assign(bytes, regions).map(drop)),
        "/v1/resolve" => Some(decode_resolve(bytes).map(drop)),
        _ => None,
    }
}

/// Which lane ran the work, for log lines.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    route: &'a str,
    lane: &'a str,
    hinted: bool,
    retry_after: u64,
}

impl Director {
    /// `orca_relay_assignment_seconds{route}` and `orca_relay_assignments_total{route,outcome}`:
    /// the outcome is `granted` or the answer's error code (stored in an extension by [`coded`]).
    fn observe(&self, route: &str, started: Instant, r: &Response) {
        let m = &self.ctx.metrics;
        m.assignment_seconds
            .with_label_values(&[route])
            .observe(started.elapsed().as_secs_f64());
        let outcome = if r.status() == StatusCode::OK {
            "granted"
        } else {
            r.extensions()
                .get::<Outcome>()
                .map_or("invalid_request", |o| o.0)
        };
        debug_assert!(
            labels::known(labels::ASSIGNMENT_OUTCOMES, outcome),
            "{outcome}"
        );
        m.assignments.with_label_values(&[route, outcome]).inc();
    }

    fn reject(&self, c: Ctx<'_>, reason: &str, host: &HostKey, home: Option<(&str, &str)>) {
        let digest = crate::logging::digest(&host.relay_host_id);
        self.rejects.reject(&Rejection {
            route: c.route,
            lane: c.lane,
            hinted: c.hinted,
            reason,
            host_digest: &digest,
            cause: home.map(|x| x.0),
            cell: home.map(|x| x.1),
        });
    }

    fn lane_rejected(&self, c: Ctx<'_>, r: LaneReject, host: &HostKey) -> Response {
        self.reject(c, r.reason(), host, None);
        coded(
            h::error_retry(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE, c.retry_after),
            UNAVAILABLE,
        )
    }

    /// Maps an `assign` failure to its answer and rejection line.
    fn assign_failed(&self, c: Ctx<'_>, e: AssignError, host: &HostKey) -> Response {
        match e {
            AssignError::Refused(r) => {
                match &r {
                    Refusal::HomeUnavailable { cause, cell_id } => {
                        self.reject(c, r.code(), host, Some((cause.as_str(), cell_id)))
                    }
                    _ => self.reject(c, r.code(), host, None),
                }
                coded(
                    h::error(StatusCode::SERVICE_UNAVAILABLE, r.code()),
                    r.code(),
                )
            }
            AssignError::RowBusy => {
                self.reject(c, "assignment_row_busy", host, None);
                coded(
                    h::error_retry(StatusCode::SERVICE_UNAVAILABLE, "assignment_row_busy", 1),
                    "assignment_row_busy",
                )
            }
            AssignError::Db(e) => {
                log::warn!("[orca-relay] assignment failed: {e}");
                self.reject(c, "database_unavailable", host, None);
                coded(
                    h::error_retry(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE, c.retry_after),
                    UNAVAILABLE,
                )
            }
            AssignError::Restart
            | AssignError::NotSticky
            | AssignError::VerifyFailed(_)
            | AssignError::Spared => {
                self.reject(c, "database_unavailable", host, None);
                coded(
                    h::error_retry(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE, c.retry_after),
                    UNAVAILABLE,
                )
            }
        }
    }

    async fn assign_route(self: Arc<Self>, headers: HeaderMap, body: Body) -> Response {
        let now = clock::now_ms();
        let token = match h::bearer(&headers) {
            Some(t) if t.len() <= crate::contract::limits::HOST_TOKEN_MAX_CHARS => t,
            _ => return h::invalid_token(),
        };
        let claims = match self.verifier.verify(token, now).await {
            Ok(c) => c,
            Err(_) => return h::invalid_token(),
        };
        let bytes = match bytes(body) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let (req, rc) = match decode_assign(&bytes, &self.ctx.config.regions) {
            Ok(r) => r,
            Err(r) => return r,
        };
        let report = matches!(rc, Some(RegionCorrection::Report(_)));
        if req.relay_host_id != claims.relay_host_id {
            return h::error(StatusCode::FORBIDDEN, "host_identity_mismatch");
        }
        let host = HostKey {
            user_id: claims.sub.clone(),
            relay_host_id: req.relay_host_id.clone(),
        };
        let hinted = req.reconnect == Some(true);
        let sticky_retry = self.sticky_lane.cfg.retry_after_s;
        if hinted && !report {
            let c = Ctx {
                route: "assign",
                lane: "sticky",
                hinted,
                retry_after: sticky_retry,
            };
            let ask = sp::StickyAsk {
                host: host.clone(),
                preferred_region: req.preferred_region.clone(),
            };
            // Batched: the slot's holder grants every queued sticky host in one transaction
            // (`assign_sticky_batch`); an unverified host joins the placement lane.
            match self
                .sticky_lane
                .run_batched(&host, ask, &self.sticky_batch)
                .await
            {
                Err(r) => return self.lane_rejected(c, r, &host),
                Ok(result) => {
                    let result = result
                        .map(|g| (g.cell_id, g.cell_url, g.assignment_epoch, Some(g.region)))
                        .map_err(Some);
                    if let Some(r) = self
                        .answer_assign(c, host.clone(), rc.clone(), now, result)
                        .await
                    {
                        return r;
                    }
                }
            }
        }
        let c = Ctx {
            route: "assign",
            lane: "placement",
            hinted,
            retry_after: self.placement_lane.cfg.retry_after_s,
        };
        match self.placement_lane.enter(&host).await {
            Err(r) => self.lane_rejected(c, r, &host),
            Ok(permit) => self
                .run_assign(permit, c, host, req.preferred_region, rc, now)
                .await
                .unwrap_or_else(|| {
                    h::error_retry(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE, c.retry_after)
                }),
        }
    }

    /// Runs the placement lane's work in the held slot, in its own task so it completes even if
    /// the client leaves, then answers it ([`Self::answer_assign`]).
    async fn run_assign(
        self: &Arc<Self>,
        permit: LanePermit,
        c: Ctx<'static>,
        host: HostKey,
        preferred: Option<String>,
        rc: Option<RegionCorrection>,
        now: i64,
    ) -> Option<Response> {
        let report = matches!(rc, Some(RegionCorrection::Report(_)));
        permit.started();
        let me = self.clone();
        let task_host = host.clone();
        let task = tokio::spawn(async move {
            let _permit = permit;
            assign_work(&me, &task_host, preferred.as_deref(), report).await
        });
        let result = match task.await {
            Ok(r) => r,
            Err(_) => Err(Some(AssignError::Db(crate::store::DbError::Transient(
                "assign task failed".into(),
            )))),
        };
        self.answer_assign(c, host, rc, now, result).await
    }

    /// The answer to a lane's assign work: `None` when a sticky grant did not verify (the
    /// request belongs to the placement lane).
    async fn answer_assign(
        &self,
        c: Ctx<'static>,
        host: HostKey,
        rc: Option<RegionCorrection>,
        now: i64,
        result: Result<Placed, Option<AssignError>>,
    ) -> Option<Response> {
        Some(match result {
            Err(Some(AssignError::NotSticky)) => return None,
            Err(Some(AssignError::VerifyFailed(e))) => {
                log::warn!("[orca-relay] assignment verify failed: {e}");
                let v = Ctx {
                    route: "assign-verify",
                    lane: "none",
                    ..c
                };
                self.reject(v, "database_unavailable", &host, None);
                h::error_retry(
                    StatusCode::SERVICE_UNAVAILABLE,
                    UNAVAILABLE,
                    self.sticky_lane.cfg.retry_after_s,
                )
            }
            Ok((cell_id, cell_url, epoch, home_region)) => {
                let cfg = &self.ctx.config;
                let lease = crypto::jwt::mint_assignment_lease(
                    cfg.secrets.assignment_signing_key.as_deref().unwrap_or(""),
                    &cfg.public_url,
                    &host.user_id,
                    &cell_id,
                    &cell_url,
                    epoch,
                    &host.relay_host_id,
                    now,
                );
                if c.hinted {
                    log::info!(
                        "[orca-relay] assignment granted lane={} hinted=true host={} cell={}",
                        c.lane,
                        crate::logging::digest(&host.relay_host_id),
                        cell_id
                    );
                }
                let mut body =
                    json!({"v":1,"cellUrl":cell_url,"assignmentEpoch":epoch,"lease":lease});
                match self
                    .region_correction(&host, rc, epoch, home_region, now)
                    .await
                {
                    Ok(Some(v)) => body["regionCorrection"] = v,
                    Ok(None) => {}
                    Err(r) => return Some(r),
                }
                h::json(StatusCode::OK, &body)
            }
            Err(None) => h::error(StatusCode::CONFLICT, "assignment_not_found"),
            Err(Some(e)) => self.assign_failed(c, e, &host),
        })
    }

    async fn resolve_route(self: Arc<Self>, body: Body) -> Response {
        let bytes = match bytes(body) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let req = match decode_resolve(&bytes) {
            Ok(r) => r,
            Err(r) => return r,
        };
        let c = Ctx {
            route: "resolve",
            lane: "none",
            hinted: false,
            retry_after: self.placement_lane.cfg.retry_after_s,
        };
        let now = clock::now_ms();
        let found = crate::store::credentials::resolve_resume(
            &self.ctx.db,
            &req.relay_host_id,
            &req.resume_token,
            now,
        )
        .await;
        let user_id = match found {
            Ok(Some(r)) => r.user_id().to_string(),
            Ok(None) => return h::error(StatusCode::UNAUTHORIZED, "invalid_credential"),
            Err(e) => {
                let host = HostKey {
                    user_id: String::new(),
                    relay_host_id: req.relay_host_id.clone(),
                };
                return self.assign_failed(c, AssignError::Db(e), &host);
            }
        };
        let host = HostKey {
            user_id,
            relay_host_id: req.relay_host_id,
        };
        let permit = match self.resolve_lane.enter(&host).await {
            Ok(p) => p,
            Err(r) => return self.lane_rejected(c, r, &host),
        };
        permit.started();
        let me = self.clone();
        let task_host = host.clone();
        let task = tokio::spawn(async move {
            let _permit = permit;
            sp::resolve(&me.ctx.db, &task_host, &me.ctx.config.regions).await
        });
        match task.await {
            Ok(Ok(r)) => h::json(
                StatusCode::OK,
                &json!({"v":1,"cellUrl":r.cell_url,"assignmentEpoch":r.assignment_epoch,"leaseExpiresAt":r.lease_expires_at}),
            ),
            Ok(Err(e)) => self.assign_failed(c, e, &host),
            Err(_) => self.assign_failed(
                c,
                AssignError::Db(crate::store::DbError::Transient(
                    "resolve task failed".into(),
                )),
                &host,
            ),
        }
    }

    /// Cluster-token check: `Ok(sub)` or the 401 answer.
    pub(crate) fn cluster_sub(&self, headers: &HeaderMap) -> Result<String, Response> {
        let key = match &self.ctx.config.secrets.cluster_key {
            Some(k) => k,
            None => return Err(h::invalid_token()),
        };
        let token = h::bearer(headers).ok_or_else(h::invalid_token)?;
        crypto::jwt::verify_cluster_token(key.as_bytes(), token, clock::now_ms())
            .map_err(|_| h::invalid_token())
    }

    async fn heartbeat_route(self: Arc<Self>, headers: HeaderMap, body: Body) -> Response {
        let sub = match self.cluster_sub(&headers) {
            Ok(s) => s,
            Err(r) => return r,
        };
        let bytes = match bytes(body) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let hb: CellHeartbeat = match h::parse(&bytes) {
            Ok(r) => r,
            Err(r) => return r,
        };
        let beat = match heartbeat::validate(&hb, &self.ctx.config.regions) {
            Ok(b) => b,
            Err(HeartbeatRefusal::Invalid(msg)) => {
                log::warn!("[orca-relay] cell heartbeat invalid: {msg}");
                return h::bad_request();
            }
            Err(_) => return h::bad_request(),
        };
        if sub != hb.cell_id {
            return h::error(StatusCode::FORBIDDEN, "cell_identity_mismatch");
        }
        match self.apply_beat(&beat).await {
            Ok(()) => h::json(StatusCode::OK, &json!({"v":1,"ok":true})),
            Err(HeartbeatRefusal::Refused(code)) => h::error(StatusCode::CONFLICT, code),
            Err(HeartbeatRefusal::Unavailable) => db_unavailable(),
            Err(_) => h::bad_request(),
        }
    }

    async fn rehome_status_route(self: Arc<Self>, headers: HeaderMap, body: Body) -> Response {
        let sub = match self.cluster_sub(&headers) {
            Ok(s) => s,
            Err(r) => return r,
        };
        let bytes = match bytes(body) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let st: CellRehomeStatus = match h::parse(&bytes) {
            Ok(r) => r,
            Err(r) => return r,
        };
        if !heartbeat::validate_rehome_status(&st) {
            return h::bad_request();
        }
        if sub != st.cell_id {
            return h::error(StatusCode::FORBIDDEN, "cell_identity_mismatch");
        }
        match self.rehome_status(&st).await {
            Ok(()) => h::json(StatusCode::OK, &json!({"v":1,"ok":true})),
            Err(HeartbeatRefusal::Refused(code)) => h::error(StatusCode::CONFLICT, code),
            Err(_) => db_unavailable(),
        }
    }

    ///, also used in-process.
    pub async fn rehome_status(&self, st: &CellRehomeStatus) -> Result<(), HeartbeatRefusal> {
        let now = clock::now_ms();
        let inc = st.cell_incarnation.to_ascii_lowercase();
        let safety = serde_json::to_string(&st.safety).unwrap_or_default();
        let r = super::heartbeat::apply_rehome_status(
            &self.ctx.db,
            &st.cell_id,
            &inc,
            st.regional_rehome_protocol,
            &safety,
            now,
        )
        .await;
        match r {
            Ok(()) => Ok(()),
            Err(super::heartbeat::BeatError::Refused(c)) => Err(HeartbeatRefusal::Refused(c)),
            Err(_) => Err(HeartbeatRefusal::Unavailable),
        }
    }
}

fn is_b64u32(s: &str) -> bool {
    crypto::b64::is_b64u32(s)
}

/// `GET /v1/regions`.
fn regions_route(d: Arc<Director>) -> BoxedFilter<(Response,)> {
    warp::path!("v1" / "regions")
        .and(warp::get())
        .then(move || {
            let d = d.clone();
            async move { d.regions().await }
        })
        .boxed()
}

impl Director {
    async fn regions(&self) -> Response {
        let mut cache = self.regions_cache.lock().await;
        if let Some((at, body)) = cache.as_ref() {
            if at.elapsed() < Duration::from_secs(30) {
                return h::json(StatusCode::OK, body);
            }
        }
        let now = clock::now_ms();
        let cells = match crate::store::cells::views(
            crate::store::cells::Reader::Db(&self.ctx.db),
            crate::store::cells::Which::General,
            false,
        )
        .await
        {
            Ok(c) => c,
            Err(_) => {
                return h::error_retry(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "region_catalog_temporarily_unavailable",
                    5,
                )
            }
        };
        let mut out = Vec::new();
        for r in &self.ctx.config.regions {
            let origins: Vec<&str> = cells
                .iter()
                .filter(|c| &c.region == r && c.live(now))
                .take(2)
                .map(|c| c.cell_url.as_str())
                .collect();
            if !origins.is_empty() {
                out.push(json!({"region": r, "probeOrigins": origins}));
            }
        }
        let body = json!({"v":1,"regions":out});
        *cache = Some((Instant::now(), body.clone()));
        h::json(StatusCode::OK, &body)
    }
}

/// The error code of an assign/resolve answer, for the metrics label.
#[derive(Clone, Copy)]
struct Outcome(&'static str);

/// Tags an error response with its code.
fn coded(mut r: Response, code: &'static str) -> Response {
    r.extensions_mut().insert(Outcome(code));
    r
}

/// What an assign or a report's resolve placed: cell id, cell URL, epoch and (for an assign) the
/// home region.
type Placed = (String, String, i64, Option<String>);

/// The placement lane's work: a region-correction report resolves the host's current assignment
/// (`Err(None)` when it has none); otherwise a placement assign.
async fn assign_work(
    me: &Director,
    host: &HostKey,
    preferred: Option<&str>,
    report: bool,
) -> Result<Placed, Option<AssignError>> {
    let db = &me.ctx.db;
    let regions = &me.ctx.config.regions;
    if report {
        return match crate::store::assignments::read_row(db, host).await {
            Ok(None) => Err(None),
            Ok(Some(_)) => sp::resolve(db, host, regions)
                .await
                .map(|r| (r.cell_id, r.cell_url, r.assignment_epoch, None))
                .map_err(Some),
            Err(e) => Err(Some(AssignError::Db(e))),
        };
    }
    sp::assign(db, host, preferred, regions, AssignOptions::default())
        .await
        .map(|g| (g.cell_id, g.cell_url, g.assignment_epoch, Some(g.region)))
        .map_err(Some)
}
