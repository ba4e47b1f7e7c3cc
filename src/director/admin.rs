//! Operator routes (docs/reference/http.md): admin token, strict bodies, and the Cell / Fence /
//! HostView / Migration objects.

// Handlers return the finished reply as their error value (`Result<_, Response>`), like
// `http::parse`; boxing it would only add noise.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value as Json};
use warp::filters::BoxedFilter;
use warp::Filter;

use super::liveness::{Admission, CellView};
use super::migrate::migration_json;
use super::placement::{dormant, HostView};
use super::web::{bytes, db_unavailable, post};
use super::Director;
use crate::clock;
use crate::contract::limits::{CONNECTION_HARD_CAP_MAX, CONNECTION_HARD_CAP_MIN, CONTROL_RESERVE};
use crate::contract::validate::{check_origin, is_cell_id, is_opaque_id};
use crate::http::{self as h, Body, Response};
use crate::model::HostKey;
use crate::store::cells::{self, CellError, CellSpec, Reader, Which};
use crate::store::{migrations, overview, Db, DbError};

/// The overview's window for regional-rehome attempts (docs/reference/http.md: the last 24 h, the
/// window of docs/reference/http.md).
const OVERVIEW_WINDOW_MS: i64 = 86_400_000;

pub fn routes(d: Arc<Director>) -> BoxedFilter<(Response,)> {
    macro_rules! admin {
        ($path:expr, $method:ident) => {
            admin!($path, $method, false)
        };
        ($path:expr, $method:ident, $read:expr) => {
            post(d.clone(), $path, |d, hd, b| async move {
                match d.admin_gate(&hd, b, $read) {
                    Ok(bytes) => d.$method(&bytes).await,
                    Err(r) => r,
                }
            })
        };
    }
    admin!("/v1/admin/cells", cells_route)
        .or(admin!("/v1/admin/cell-state", cell_state_route))
        .unify()
        .or(admin!("/v1/admin/cell-fence", cell_fence_route))
        .unify()
        // A read of the dashboard: the metrics token is enough.
        .or(admin!("/v1/admin/cell-status", cell_status_route, true))
        .unify()
        .or(admin!("/v1/admin/host-whereabouts", whereabouts_route))
        .unify()
        .or(admin!("/v1/admin/evacuate", evacuate_route))
        .unify()
        .or(admin!("/v1/admin/evacuate-cell", evacuate_cell_route))
        .unify()
        .or(admin!(
            "/v1/admin/migration-complete",
            migration_complete_route
        ))
        .unify()
        .or(admin!(
            "/v1/admin/regional-rehome-control",
            rehome_control_route
        ))
        .unify()
        .or(overview_route(d.clone()))
        .unify()
        .boxed()
}

fn parse<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, Response> {
    h::parse(b)
}

/// Fuzzing entry (`fuzz/fuzz_targets/admin_bodies.rs`): decodes `bytes` as the body of the admin
/// route at `path` with that handler's own schema, as its first step does; `None` for a path this
/// module does not own. (`regional-rehome-control` is decoded by `rehome::rules`.)
#[doc(hidden)]
pub fn decode_body_for_fuzzing(path: &str, bytes: &[u8]) -> Option<Result<(), Response>> {
    Some(match path {
        "/v1/admin/cells" => parse::<CellsReq>(bytes).map(drop),
        "/v1/admin/cell-state" => parse::<CellStateReq>(bytes).map(drop),
        "/v1/admin/cell-fence" => parse::<FenceReq>(bytes).map(drop),
        "/v1/admin/cell-status" => parse::<StatusReq>(bytes).map(drop),
        "/v1/admin/host-whereabouts" => parse::<WhereaboutsReq>(bytes).map(drop),
        "/v1/admin/evacuate" => parse::<EvacuateReq>(bytes).map(drop),
        "/v1/admin/evacuate-cell" => parse::<EvacuateCellReq>(bytes).map(drop),
        "/v1/admin/migration-complete" => parse::<CompleteReq>(bytes).map(drop),
        _ => return None,
    })
}

pub(crate) fn not_found() -> Response {
    h::error(StatusCode::NOT_FOUND, "cell_not_found")
}

pub(crate) fn conflict(code: &str) -> Response {
    h::error(StatusCode::CONFLICT, code)
}

fn cell_error(e: CellError) -> Response {
    match e {
        CellError::NotFound => not_found(),
        CellError::Refused(c) => conflict(c),
        CellError::Db(_) => db_unavailable(),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CellsReq {
    v: u8,
    cell_id: String,
    cell_url: String,
    region: String,
    capacity_requests: i64,
    #[serde(default)]
    connection_hard_cap: Option<i64>,
    #[serde(default)]
    connection_unobserved_bound: Option<i64>,
    #[serde(default)]
    initial_state: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CellStateReq {
    v: u8,
    cell_id: String,
    state: String,
    #[serde(default)]
    roll_isolated: Option<bool>,
    #[serde(default)]
    roll_isolated_at: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FenceReq {
    v: u8,
    cell_id: String,
    cell_incarnation: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StatusReq {
    v: u8,
    #[serde(default)]
    cell_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WhereaboutsReq {
    v: u8,
    relay_host_id: String,
    #[serde(default)]
    user_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct EvacuateReq {
    pub v: u8,
    pub user_id: String,
    pub relay_host_id: String,
    pub target_cell_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct EvacuateCellReq {
    pub v: u8,
    pub source_cell_id: String,
    #[serde(default)]
    pub target_cell_id: Option<String>,
    pub limit: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CompleteReq {
    pub v: u8,
    pub user_id: String,
    pub relay_host_id: String,
    pub assignment_epoch: i64,
}

impl Director {
    /// Admin token (or, for a `read`, the metrics token too), then the body limit.
    fn admin_gate(
        &self,
        headers: &HeaderMap,
        body: Body,
        read: bool,
    ) -> Result<bytes::Bytes, Response> {
        let secrets = &self.ctx.config.secrets;
        let allowed = if read {
            h::is_reader(headers, secrets)
        } else {
            h::is_admin(headers, secrets.admin_token.as_deref())
        };
        if !allowed {
            return Err(h::invalid_token());
        }
        bytes(body)
    }

    async fn cells_route(&self, b: &[u8]) -> Response {
        let r: CellsReq = match parse(b) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let cap_and_bound = match (r.connection_hard_cap, r.connection_unobserved_bound) {
            (None, None) => None,
            (Some(c), Some(b))
                if (CONNECTION_HARD_CAP_MIN..=CONNECTION_HARD_CAP_MAX).contains(&c)
                    && (0..=c - CONTROL_RESERVE as i64 - 1).contains(&b) =>
            {
                Some((c, b))
            }
            _ => return h::bad_request(),
        };
        let initial = match r.initial_state.as_deref() {
            None => Admission::General,
            Some(s) => match Admission::parse(s) {
                Some(a) => a,
                None => return h::bad_request(),
            },
        };
        if r.v != 1
            || !is_cell_id(&r.cell_id)
            || r.cell_id == "director"
            || check_origin(&r.cell_url).is_err()
            || !self.ctx.config.regions.contains(&r.region)
            || !(1..=1_000_000).contains(&r.capacity_requests)
        {
            return h::bad_request();
        }
        let spec = CellSpec {
            cell_id: r.cell_id.clone(),
            cell_url: r.cell_url,
            region: r.region,
            capacity_requests: r.capacity_requests,
            cap_and_bound,
            initial_state: initial,
        };
        let now = clock::now_ms();
        let res = crate::transaction!(self.ctx.db, "cells", |tx| {
            cells::upsert_in(tx, &spec, now).await
        });
        match res {
            Ok(created) => match self.cell_objects(Some(&r.cell_id)).await {
                Ok(mut v) if !v.is_empty() => h::json(
                    StatusCode::OK,
                    &json!({"v":1,"created":created,"cell":v.remove(0)}),
                ),
                _ => db_unavailable(),
            },
            Err(e) => cell_error(e),
        }
    }

    async fn cell_state_route(&self, b: &[u8]) -> Response {
        let r: CellStateReq = match parse(b) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let now = clock::now_ms();
        let state = match Admission::parse(&r.state) {
            Some(s) => s,
            None => return h::bad_request(),
        };
        if r.v != 1 || !is_cell_id(&r.cell_id) {
            return h::bad_request();
        }
        if r.roll_isolated == Some(true) && state != Admission::MigrationOnly {
            return h::bad_request();
        }
        if let Some(at) = r.roll_isolated_at {
            if r.roll_isolated != Some(true) || at < now - 30 * 86_400_000 || at > now {
                return h::bad_request();
            }
        }
        match cells::set_state(
            &self.ctx.db,
            &r.cell_id,
            state,
            r.roll_isolated,
            r.roll_isolated_at,
            now,
        )
        .await
        {
            Ok(()) => match self.cell_objects(Some(&r.cell_id)).await {
                Ok(mut v) if !v.is_empty() => {
                    h::json(StatusCode::OK, &json!({"v":1,"cell":v.remove(0)}))
                }
                _ => db_unavailable(),
            },
            Err(e) => cell_error(e),
        }
    }

    async fn cell_fence_route(&self, b: &[u8]) -> Response {
        let r: FenceReq = match parse(b) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if r.v != 1 || !is_cell_id(&r.cell_id) || r.cell_incarnation.is_empty() {
            return h::bad_request();
        }
        let inc = r.cell_incarnation.to_ascii_lowercase();
        let now = clock::now_ms();
        let fence = crate::model::Fence {
            cell_incarnation: inc,
            attested_at: now,
            expires_at: now + super::liveness::FENCE_TTL_MS,
        };
        let heard_by = now - super::liveness::HEARTBEAT_TTL_MS;
        match cells::attest_fence(&self.ctx.db, &r.cell_id, &fence, heard_by).await {
            Ok(f) => h::json(
                StatusCode::OK,
                &json!({"v":1,"fence":{"cellId":r.cell_id,"cellIncarnation":f.cell_incarnation,
                    "attestedAt":f.attested_at,"expiresAt":f.expires_at,"valid":true}}),
            ),
            Err(e) => cell_error(e),
        }
    }

    async fn cell_status_route(&self, b: &[u8]) -> Response {
        let r: StatusReq = match parse(b) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if r.v != 1 || r.cell_id.as_deref().is_some_and(|c| !is_cell_id(c)) {
            return h::bad_request();
        }
        match self.cell_objects(r.cell_id.as_deref()).await {
            Ok(v) if v.is_empty() && r.cell_id.is_some() => not_found(),
            Ok(v) => h::json(StatusCode::OK, &json!({"v":1,"cells":v})),
            Err(_) => db_unavailable(),
        }
    }

    /// Cell objects, by `cellId`.
    pub async fn cell_objects(&self, one: Option<&str>) -> Result<Vec<Json>, DbError> {
        let db = &self.ctx.db;
        let which = match one {
            Some(id) => Which::One(id),
            None => Which::All,
        };
        let views = cells::views(Reader::Db(db), which, false).await?;
        let counts = overview::cell_counts(db).await?;
        let count = |rows: &[(String, i64)], id: &str| {
            rows.iter().find(|(c, _)| c == id).map_or(0, |(_, n)| *n)
        };
        let now = clock::now_ms();
        Ok(views
            .iter()
            .map(|c| {
                let t = counts.times.iter().find(|(id, ..)| *id == c.cell_id);
                cell_json(
                    c,
                    now,
                    count(&counts.assignments, &c.cell_id),
                    count(&counts.migrations_in, &c.cell_id),
                    count(&counts.migrations_out, &c.cell_id),
                    t.map_or(0, |t| t.1),
                    t.map_or(0, |t| t.2),
                )
            })
            .collect())
    }

    async fn whereabouts_route(&self, b: &[u8]) -> Response {
        let r: WhereaboutsReq = match parse(b) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if r.v != 1
            || !is_opaque_id(&r.relay_host_id)
            || r.user_id.as_deref().is_some_and(|u| !is_opaque_id(u))
        {
            return h::bad_request();
        }
        match host_views(&self.ctx.db, &r.relay_host_id, r.user_id.as_deref()).await {
            Ok(list) => h::json(
                StatusCode::OK,
                &json!({"v":1,"relayHostId":r.relay_host_id,
                    "hostDigest":crate::logging::digest(&r.relay_host_id),"assignments":list}),
            ),
            Err(_) => db_unavailable(),
        }
    }
}

/// The Cell object.
fn cell_json(
    c: &CellView,
    now: i64,
    assignments: i64,
    open_in: i64,
    open_out: i64,
    created_at: i64,
    updated_at: i64,
) -> Json {
    let runtime = c.runtime.as_ref().map(|r| {
        let safety_clean = r
            .safety_json
            .as_deref()
            .and_then(|s| serde_json::from_str::<crate::contract::wire::Safety>(s).ok())
            .is_some_and(|s| {
                s.sql_failures <= 3
                    && s.reconnects <= 20
                    && s.control_activity_recovery_failures == 0
                    && s.database_pool_waiting <= 2
                    && s.database_pool_wait_ms_max <= 1_000
            });
        json!({
            "cellIncarnation": r.cell_incarnation,
            "startedAt": r.started_at,
            "ready": r.ready,
            "observedRequests": r.observed_requests,
            "lastHeartbeatAt": r.last_heartbeat_at,
            "connections": r.telemetry.as_ref().map(|t| json!({
                "totalConnections": t.total_connections,
                "inFlightConnections": t.in_flight_connections,
                "reservedConnectionUnits": t.reserved_connection_units,
                "enforcedConnectionUnits": t.enforced_connection_units,
                "inclusionWatermark": t.inclusion_watermark,
                "observedAt": t.observed_at,
            })),
            "regionalRehomeProtocol": r.regional_rehome_protocol,
            "safetyClean": safety_clean,
        })
    });
    let fence = c.fence.as_ref().map(|f| {
        json!({"cellId": c.cell_id, "cellIncarnation": f.cell_incarnation, "attestedAt": f.attested_at,
            "expiresAt": f.expires_at, "valid": c.fence_valid(now)})
    });
    json!({
        "cellId": c.cell_id,
        "cellUrl": c.cell_url,
        "region": c.region,
        "capacityRequests": c.capacity_requests,
        "reservedRequests": c.reserved_requests,
        "admissionState": c.admission.as_str(),
        "rollIsolatedAt": c.roll_isolated_at,
        "rollIsolated": c.roll_stamp_active(now),
        "connectionHardCap": c.connection_hard_cap,
        "connectionUnobservedBound": c.connection_unobserved_bound,
        "live": c.live(now),
        "cause": c.cause(now).map(|x| x.as_str()),
        "headroom": c.headroom(now),
        "outstandingReservations": c.outstanding,
        "runtime": runtime,
        "fence": fence,
        "assignments": assignments,
        "openMigrationsIn": open_in,
        "openMigrationsOut": open_out,
        "createdAt": created_at,
        "updatedAt": updated_at,
    })
}

/// HostView objects of `relay_host_id` (optionally one user), by `userId`.
async fn host_views(
    db: &Db,
    relay_host_id: &str,
    user: Option<&str>,
) -> Result<Vec<Json>, DbError> {
    let rows = overview::host_rows(db, relay_host_id, user).await?;
    let now = clock::now_ms();
    let mut out = Vec::new();
    for (host, row) in rows {
        let user_id = host.user_id.clone();
        let leases = overview::leases(db, &host).await?;
        let mig = migrations::read_open(db, &host).await?;
        let open_migration = mig.as_ref().map(|m| m.open());
        let home = cells::view(db, &row.cell_id).await?;
        let decision = super::region::region_decision_json(db, &host).await?;
        let hv = HostView {
            row,
            leases,
            open_migration,
        };
        let r = &hv.row;
        out.push(json!({
            "userId": user_id,
            "cellId": r.cell_id,
            "assignmentEpoch": r.assignment_epoch,
            "leaseExpiresAt": r.lease_expires_at,
            "lastActivityAt": r.last_activity_at,
            "dormant": hv.dormant(now),
            "requestUnits": hv.units(),
            "counters": {"controls": r.counters.controls, "splices": r.counters.splices,
                "invites": r.counters.invites, "installs": r.counters.installs,
                "confirmations": r.counters.confirmations, "migrations": r.counters.migrations},
            "preferredRegion": r.preferred_region,
            "leases": hv.leases.iter().map(|l| json!({"activityId": l.activity_id, "kind": l.kind.as_str(),
                "cellId": l.cell_id, "requestUnits": l.request_units, "expiresAt": l.expires_at})).collect::<Vec<_>>(),
            "openMigration": mig.as_ref().map(migration_json),
            "home": {
                "live": home.as_ref().is_some_and(|c| c.live(now)),
                "cause": super::liveness::cause(home.as_ref(), now).map(|c| c.as_str()),
                "admissionState": home.as_ref().map(|c| c.admission.as_str()),
                "rollIsolated": hv.roll_isolated(home.as_ref(), now),
                "rollReplaced": hv.roll_replaced(home.as_ref(), now),
            },
            "regionDecision": decision,
        }));
    }
    Ok(out)
}

fn migration_error(e: super::migrate::MigrationError) -> Response {
    use super::migrate::MigrationError as E;
    match e {
        E::CellNotFound => not_found(),
        E::Refused(c) => conflict(c),
        E::Db(_) => db_unavailable(),
    }
}

impl Director {
    async fn evacuate_route(&self, b: &[u8]) -> Response {
        let r: EvacuateReq = match parse(b) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if r.v != 1
            || !is_opaque_id(&r.user_id)
            || !is_opaque_id(&r.relay_host_id)
            || !is_cell_id(&r.target_cell_id)
        {
            return h::bad_request();
        }
        let host = HostKey {
            user_id: r.user_id,
            relay_host_id: r.relay_host_id,
        };
        match super::migrate::evacuate(
            &self.ctx.db,
            &host,
            Some(&r.target_cell_id),
            clock::now_ms(),
        )
        .await
        {
            Ok(m) => h::json(StatusCode::OK, &json!({"v":1,"migration":m})),
            Err(e) => migration_error(e),
        }
    }

    async fn evacuate_cell_route(&self, b: &[u8]) -> Response {
        let r: EvacuateCellReq = match parse(b) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if r.v != 1
            || !is_cell_id(&r.source_cell_id)
            || r.target_cell_id.as_deref().is_some_and(|t| !is_cell_id(t))
            || !(1..=100).contains(&r.limit)
        {
            return h::bad_request();
        }
        match super::migrate::evacuate_cell(
            &self.ctx.db,
            &r.source_cell_id,
            r.target_cell_id.as_deref(),
            r.limit,
            clock::now_ms(),
        )
        .await
        {
            Ok((started, skipped, remaining)) => h::json(
                StatusCode::OK,
                &json!({"v":1,"started":started,"skipped":skipped,"remaining":remaining}),
            ),
            Err(e) => migration_error(e),
        }
    }

    async fn migration_complete_route(&self, b: &[u8]) -> Response {
        let r: CompleteReq = match parse(b) {
            Ok(r) => r,
            Err(e) => return e,
        };
        if r.v != 1
            || !is_opaque_id(&r.user_id)
            || !is_opaque_id(&r.relay_host_id)
            || r.assignment_epoch < 1
        {
            return h::bad_request();
        }
        let host = HostKey {
            user_id: r.user_id,
            relay_host_id: r.relay_host_id,
        };
        match super::migrate::complete(&self.ctx.db, &host, r.assignment_epoch, clock::now_ms())
            .await
        {
            Ok(m) => h::json(StatusCode::OK, &json!({"v":1,"migration":m})),
            Err(e) => migration_error(e),
        }
    }
}

/// `GET /v1/admin/overview` (docs/reference/http.md), with the `push` section when that role runs here.
fn overview_route(d: Arc<Director>) -> BoxedFilter<(Response,)> {
    warp::path!("v1" / "admin" / "overview")
        .and(warp::get())
        .and(warp::header::headers_cloned())
        .then(move |hd: HeaderMap| {
            let d = d.clone();
            async move {
                if !h::is_reader(&hd, &d.ctx.config.secrets) {
                    return h::invalid_token();
                }
                match d.overview().await {
                    Ok(v) => h::json(StatusCode::OK, &v),
                    Err(_) => db_unavailable(),
                }
            }
        })
        .boxed()
}

impl Director {
    /// The overview object (docs/reference/http.md).
    pub async fn overview(&self) -> Result<Json, DbError> {
        let db = &self.ctx.db;
        let now = clock::now_ms();
        let cells = cells::views(Reader::Db(db), Which::All, false).await?;
        let cells: Vec<Json> = cells
            .iter()
            .map(|c| {
                let rt = c.runtime.as_ref();
                json!({
                    "cellId": c.cell_id, "cellUrl": c.cell_url, "region": c.region,
                    "admissionState": c.admission.as_str(), "rollIsolatedAt": c.roll_isolated_at,
                    "live": c.live(now), "cause": c.cause(now).map(|x| x.as_str()),
                    "cellIncarnation": rt.map(|r| r.cell_incarnation.clone()),
                    "startedAt": rt.map(|r| r.started_at),
                    "lastHeartbeatAt": rt.map(|r| r.last_heartbeat_at),
                    "reservedRequests": c.reserved_requests, "capacityRequests": c.capacity_requests,
                    "observedRequests": rt.map(|r| r.observed_requests),
                    "totalConnections": rt.and_then(|r| r.telemetry.as_ref()).map(|t| t.total_connections),
                })
            })
            .collect();
        let rows = overview::all_rows(db).await?;
        let total = rows.len() as i64;
        let dormant = rows.iter().filter(|r| dormant(r, now)).count() as i64;
        let open = overview::open_migration_count(db).await?;
        // The same trailing-24 h attempt counts as the control route's `outcomes` (docs/reference/http.md
        //): `committed` = attempts committed in the window, `aborted` summed over reasons.
        let outcomes = crate::store::region::outcome_counts(db, now - OVERVIEW_WINDOW_MS).await?;
        let committed = outcomes.committed;
        let aborted: i64 = outcomes.aborted.iter().map(|(_, n)| n).sum();
        let deferred = self.rehome_deferred.since(now);
        let enabled = overview::rehome_enabled(db).await?;
        let mut out = json!({
            "v": 1,
            "at": now,
            "cells": cells,
            "assignments": {"total": total, "active": total - dormant, "dormant": dormant},
            "migrations": {"open": open},
            "regionalRehome": {"enabled": enabled, "committed": committed, "deferred": deferred, "aborted": aborted},
        });
        // `push` only when that role runs in this process (docs/reference/http.md): `server.rs` attaches
        // it then.
        if let Some(push) = self.push_overview.get() {
            out["push"] = push.push_section().await.map_err(DbError::Transient)?;
        }
        Ok(out)
    }
}
