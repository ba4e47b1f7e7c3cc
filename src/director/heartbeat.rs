//! Heartbeat validation and handling (docs/reference/http.md), shared by the HTTP route and the
//! in-process beat of a process that also runs `cell`.

use super::liveness::{incarnation_verdict, IncarnationVerdict};
use crate::contract::heartbeat::{BeatFuture, HeartbeatSink};
use crate::contract::limits::{CONNECTION_HARD_CAP_MAX, CONNECTION_HARD_CAP_MIN, CONTROL_RESERVE};
use crate::contract::validate::{check_origin, is_cell_id, is_safe_integer, is_uuid};
use crate::contract::wire::{CellHeartbeat, CellRehomeStatus};
use crate::model::{Beat, BeatTelemetry};
use crate::store::{cells, Db, DbError, RetryClass, Tx};

/// Why a heartbeat was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatRefusal {
    /// 400 `invalid_request`.
    InvalidRequest,
    /// 400 `invalid_request` and the log line `[orca-relay] cell heartbeat invalid: <message>`.
    Invalid(&'static str),
    /// 409 `{"error":"<code>"}`.
    Refused(&'static str),
    /// 503 `database_temporarily_unavailable`.
    Unavailable,
}

pub const TELEMETRY_INCOMPLETE: &str = "connection telemetry must be complete";
pub const TELEMETRY_SUM: &str = "connection telemetry sum does not match";
pub const TELEMETRY_BOUND: &str =
    "connection unobserved bound must leave ordinary admission capacity";

/// The schema.
pub fn validate(hb: &CellHeartbeat, regions: &[String]) -> Result<Beat, HeartbeatRefusal> {
    use HeartbeatRefusal::InvalidRequest as Bad;
    if hb.v != 1
        || !is_cell_id(&hb.cell_id)
        || check_origin(&hb.cell_url).is_err()
        || !regions.contains(&hb.region)
        || !is_uuid(&hb.cell_incarnation)
        || hb.started_at < 1
        || !is_safe_integer(hb.started_at)
        || !(0..=1_000_000).contains(&hb.observed_requests)
    {
        return Err(Bad);
    }
    let group = [
        hb.total_connections,
        hb.in_flight_connections,
        hb.reserved_connection_units,
        hb.enforced_connection_units,
        hb.connection_hard_cap,
        hb.connection_unobserved_bound,
        hb.connection_inclusion_watermark,
    ];
    let present = group.iter().filter(|x| x.is_some()).count();
    let telemetry = match present {
        0 => None,
        7 => {
            let t = group.map(|x| x.unwrap_or(0));
            if t[..4].iter().any(|v| !(0..=1_000_000).contains(v))
                || !(CONNECTION_HARD_CAP_MIN..=CONNECTION_HARD_CAP_MAX).contains(&t[4])
                || t[5] < 0
                || !is_safe_integer(t[6])
            {
                return Err(Bad);
            }
            if t[3] != t[0] + t[1] + t[2] {
                return Err(HeartbeatRefusal::Invalid(TELEMETRY_SUM));
            }
            if t[5] > t[4] - CONTROL_RESERVE as i64 - 1 {
                return Err(HeartbeatRefusal::Invalid(TELEMETRY_BOUND));
            }
            Some(BeatTelemetry {
                total_connections: t[0],
                in_flight_connections: t[1],
                reserved_connection_units: t[2],
                enforced_connection_units: t[3],
                connection_hard_cap: t[4],
                connection_unobserved_bound: t[5],
                connection_inclusion_watermark: t[6],
            })
        }
        _ => return Err(HeartbeatRefusal::Invalid(TELEMETRY_INCOMPLETE)),
    };
    Ok(Beat {
        cell_id: hb.cell_id.clone(),
        cell_url: hb.cell_url.clone(),
        region: hb.region.clone(),
        cell_incarnation: hb.cell_incarnation.to_ascii_lowercase(),
        started_at: hb.started_at,
        ready: hb.ready,
        observed_requests: hb.observed_requests,
        telemetry,
    })
}

/// Refusals of the heartbeat transaction (409 codes) or a database failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeatError {
    Refused(&'static str),
    Db(DbError),
}

impl From<DbError> for BeatError {
    fn from(e: DbError) -> Self {
        BeatError::Db(e)
    }
}

impl RetryClass for BeatError {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            BeatError::Db(e) => e.retry_code(),
            _ => None,
        }
    }
    fn db_error(&self) -> Option<&crate::store::DbError> {
        match self {
            BeatError::Db(e) => Some(e),
            _ => None,
        }
    }
}

/// Wait for the cell row in the heartbeat transaction (ARCHITECTURE.md).
const CELL_ROW_WAIT_MS: u64 = 1_000;

/// Applies an accepted heartbeat, then releases reservations it settles. A refused beat of
/// an existing cell still deletes the cell's fence.
pub async fn apply(db: &Db, beat: &Beat, now: i64) -> Result<(), BeatError> {
    let result: Result<bool, BeatError> =
        crate::transaction!(db, "cell-runtime", |tx| apply_tx(tx, beat, now).await);
    match result {
        Ok(_) => {
            let watermark = beat.telemetry.map(|t| t.connection_inclusion_watermark);
            let _ = cells::release_settled_reservations(
                db,
                &beat.cell_id,
                &beat.cell_incarnation,
                watermark,
                now,
            )
            .await;
            Ok(())
        }
        Err(BeatError::Refused(code)) => {
            if code != "cell_not_found" {
                let _ = cells::delete_fence(db, &beat.cell_id).await;
            }
            Err(BeatError::Refused(code))
        }
        Err(e) => Err(e),
    }
}

/// The heartbeat transaction: cell row, runtime row, the checks, the runtime write and the
/// fence delete. Returns whether the runtime was reset (a new row or a takeover).
async fn apply_tx(tx: &mut Tx, beat: &Beat, now: i64) -> Result<bool, BeatError> {
    tx.set_lock_timeout(CELL_ROW_WAIT_MS).await?;
    let cell = cells::lock_cell(tx, &beat.cell_id)
        .await?
        .ok_or(BeatError::Refused("cell_not_found"))?;
    if cell.cell_url != beat.cell_url {
        return Err(BeatError::Refused("cell_origin_mismatch"));
    }
    if cell.region != beat.region {
        return Err(BeatError::Refused("cell_region_mismatch"));
    }
    let stored = cells::lock_runtime(tx, &beat.cell_id).await?;
    let verdict = incarnation_verdict(
        stored
            .as_ref()
            .map(|r| (r.cell_incarnation.as_str(), r.started_at)),
        &beat.cell_incarnation,
        beat.started_at,
    );
    if verdict == IncarnationVerdict::Stale {
        return Err(BeatError::Refused("stale_cell_incarnation"));
    }
    match (cell.connection_hard_cap, &beat.telemetry) {
        (Some(cap), Some(t)) => {
            if t.connection_hard_cap != cap
                || Some(t.connection_unobserved_bound) != cell.connection_unobserved_bound
            {
                return Err(BeatError::Refused("cell_connection_telemetry_mismatch"));
            }
        }
        (Some(_), None) => return Err(BeatError::Refused("cell_connection_telemetry_mismatch")),
        (None, Some(_)) => return Err(BeatError::Refused("cell_connection_limit_not_configured")),
        (None, None) => {}
    }
    if let (Some(s), Some(t), IncarnationVerdict::Accept) = (&stored, &beat.telemetry, verdict) {
        if s.telemetry
            .as_ref()
            .is_some_and(|st| t.connection_inclusion_watermark <= st.inclusion_watermark)
        {
            return Err(BeatError::Refused("stale_connection_snapshot"));
        }
    }
    let reset = stored.is_none() || verdict == IncarnationVerdict::Takeover;
    cells::write_runtime(tx, beat, stored.is_none(), reset, now).await?;
    cells::delete_fence_in(tx, &beat.cell_id).await?;
    Ok(reset)
}

///: stores a cell's regional-rehome protocol and safety report on its runtime row, when the
/// cell and its runtime exist and the report comes from the current incarnation (lowercased).
pub async fn apply_rehome_status(
    db: &Db,
    cell_id: &str,
    incarnation: &str,
    protocol: i64,
    safety_json: &str,
    now: i64,
) -> Result<(), BeatError> {
    crate::transaction!(db, "cell-runtime", |tx| {
        let cell = cells::lock_cell(tx, cell_id).await?;
        let rt = cells::lock_runtime(tx, cell_id).await?;
        let rt = match (cell, rt) {
            (Some(_), Some(rt)) => rt,
            _ => return Err(BeatError::Refused("cell_not_found")),
        };
        if rt.cell_incarnation != incarnation {
            return Err(BeatError::Refused("stale_cell_incarnation"));
        }
        cells::set_rehome_status(tx, cell_id, protocol, safety_json, now).await?;
        Ok(())
    })
}

/// The schema.
pub fn validate_rehome_status(s: &CellRehomeStatus) -> bool {
    let f = &s.safety;
    let nonneg = |v: i64| (0..=(1i64 << 53) - 1).contains(&v);
    s.v == 1
        && is_cell_id(&s.cell_id)
        && is_uuid(&s.cell_incarnation)
        && (0..=3).contains(&s.regional_rehome_protocol)
        && nonneg(f.observed_at)
        && nonneg(f.sql_failures)
        && nonneg(f.reconnects)
        && nonneg(f.control_activity_recovery_failures)
        && (0..=100).contains(&f.database_pool_waiting)
        && nonneg(f.database_pool_waiters_max)
        && nonneg(f.database_pool_wait_ms_max)
        && f.database_pool_total.is_none_or(nonneg)
        && f.database_pool_idle.is_none_or(nonneg)
        && f.database_pool_oldest_wait_ms.is_none_or(nonneg)
}

/// The in-process transport of a process that runs both roles: the same validation and
/// transaction as `POST /v1/admin/cell-heartbeat`, with the HTTP client's failure reasons.
impl HeartbeatSink for super::Director {
    fn rehome_status<'a>(
        &'a self,
        body: &'a crate::contract::wire::CellRehomeStatus,
    ) -> BeatFuture<'a> {
        Box::pin(async move {
            if !validate_rehome_status(body) {
                return Err("director_rehome_status_400".into());
            }
            self.rehome_status(body).await.map_err(|e| match e {
                HeartbeatRefusal::Refused(code) => format!("director_rehome_status_409 {code}"),
                _ => "director_rehome_status_503".into(),
            })
        })
    }

    fn beat<'a>(&'a self, body: &'a CellHeartbeat) -> BeatFuture<'a> {
        Box::pin(async move {
            self.heartbeat(body).await.map_err(|e| match e {
                HeartbeatRefusal::Refused(code) => format!("director_heartbeat_409 {code}"),
                HeartbeatRefusal::Unavailable => "director_heartbeat_503".into(),
                HeartbeatRefusal::InvalidRequest | HeartbeatRefusal::Invalid(_) => {
                    "director_heartbeat_400".into()
                }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb() -> CellHeartbeat {
        CellHeartbeat {
            v: 1,
            cell_id: "A".into(),
            cell_url: "http://127.0.0.1:9".into(),
            region: "us-central1".into(),
            cell_incarnation: "0E0B3C2A-1111-4222-8333-944445555666".into(),
            started_at: 100,
            ready: true,
            observed_requests: 0,
            total_connections: Some(1),
            in_flight_connections: Some(2),
            reserved_connection_units: Some(3),
            enforced_connection_units: Some(6),
            connection_hard_cap: Some(600),
            connection_unobserved_bound: Some(0),
            connection_inclusion_watermark: Some(1),
        }
    }

    fn regions() -> Vec<String> {
        vec!["us-central1".into()]
    }

    #[test]
    fn accepts_and_lowercases() {
        let b = validate(&hb(), &regions()).unwrap();
        assert_eq!(b.cell_incarnation, "0e0b3c2a-1111-4222-8333-944445555666");
        assert_eq!(
            b.telemetry,
            Some(BeatTelemetry {
                total_connections: 1,
                in_flight_connections: 2,
                reserved_connection_units: 3,
                enforced_connection_units: 6,
                connection_hard_cap: 600,
                connection_unobserved_bound: 0,
                connection_inclusion_watermark: 1,
            })
        );
    }

    #[test]
    fn telemetry_messages() {
        let mut h = hb();
        h.enforced_connection_units = Some(7);
        assert_eq!(
            validate(&h, &regions()),
            Err(HeartbeatRefusal::Invalid(TELEMETRY_SUM))
        );
        let mut h = hb();
        h.connection_inclusion_watermark = None;
        assert_eq!(
            validate(&h, &regions()),
            Err(HeartbeatRefusal::Invalid(TELEMETRY_INCOMPLETE))
        );
        let mut h = hb();
        h.connection_unobserved_bound = Some(500);
        assert_eq!(
            validate(&h, &regions()),
            Err(HeartbeatRefusal::Invalid(TELEMETRY_BOUND))
        );
        h.connection_unobserved_bound = Some(499);
        assert!(validate(&h, &regions()).is_ok());
    }

    #[test]
    fn schema() {
        let mut h = hb();
        h.region = "eu-west1".into();
        assert_eq!(
            validate(&h, &regions()),
            Err(HeartbeatRefusal::InvalidRequest)
        );
        let mut h = hb();
        h.started_at = 0;
        assert_eq!(
            validate(&h, &regions()),
            Err(HeartbeatRefusal::InvalidRequest)
        );
        let mut h = hb();
        h.cell_incarnation = "nope".into();
        assert_eq!(
            validate(&h, &regions()),
            Err(HeartbeatRefusal::InvalidRequest)
        );
        let mut h = hb();
        h.connection_hard_cap = Some(100);
        assert_eq!(
            validate(&h, &regions()),
            Err(HeartbeatRefusal::InvalidRequest)
        );
    }
}
