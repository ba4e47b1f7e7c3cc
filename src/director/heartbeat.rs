//! Heartbeat validation and handling (director.md §3.6–§3.7), shared by the HTTP route and the
//! in-process beat of a process that also runs `cell`.

use crate::contract::heartbeat::{BeatFuture, HeartbeatSink};
use crate::contract::validate::{check_origin, is_cell_id, is_safe_integer, is_uuid};
use crate::contract::wire::{CellHeartbeat, CellRehomeStatus};
use crate::store::cells::Beat;

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

/// The schema of §3.6.
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
                || !(200..=1_000_000).contains(&t[4])
                || t[5] < 0
                || !is_safe_integer(t[6])
            {
                return Err(Bad);
            }
            if t[3] != t[0] + t[1] + t[2] {
                return Err(HeartbeatRefusal::Invalid(TELEMETRY_SUM));
            }
            if t[5] > t[4] - 101 {
                return Err(HeartbeatRefusal::Invalid(TELEMETRY_BOUND));
            }
            Some(t)
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

/// The schema of §3.7.
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
        assert_eq!(b.telemetry, Some([1, 2, 3, 6, 600, 0, 1]));
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
