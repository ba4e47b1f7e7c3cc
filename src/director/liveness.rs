//! Liveness, causes, headroom, incarnations and fences (docs/operations.md) as pure functions over
//! plain rows, so every rule is unit-tested without a database.

use crate::contract::limits::CONTROL_RESERVE;
/// Heartbeat TTL: a runtime row older than this is not fresh (docs/operations.md).
pub use crate::contract::limits::HEARTBEAT_TTL_MS;
/// Fence lifetime (docs/operations.md).
pub const FENCE_TTL_MS: i64 = 300_000;
/// Age beyond which a roll stamp no longer isolates (docs/deploy/cluster.md).
pub const ROLL_STAMP_MAX_AGE_MS: i64 = 7_200_000;

pub use crate::model::cell::{Admission, CellView, Fence, Runtime, Telemetry};

/// Why a cell is not live (docs/operations.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Booting,
    Draining,
    Unheard,
    NotReady,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Booting => "booting",
            Cause::Draining => "draining",
            Cause::Unheard => "unheard",
            Cause::NotReady => "not_ready",
        }
    }
}

/// Fresh: a runtime row heard within the TTL.
pub fn fresh(runtime: Option<&Runtime>, now: i64) -> bool {
    runtime.is_some_and(|r| r.last_heartbeat_at > now - HEARTBEAT_TTL_MS)
}

impl CellView {
    pub fn capped(&self) -> bool {
        self.connection_hard_cap.is_some()
    }

    pub fn fresh(&self, now: i64) -> bool {
        fresh(self.runtime.as_ref(), now)
    }

    /// Live = fresh and ready.
    pub fn live(&self, now: i64) -> bool {
        self.fresh(now) && self.runtime.as_ref().is_some_and(|r| r.ready)
    }

    /// `None` when live, else the first matching cause.
    pub fn cause(&self, now: i64) -> Option<Cause> {
        cause(Some(self), now)
    }

    /// Connection headroom (docs/operations.md).
    pub fn headroom(&self, now: i64) -> bool {
        let (cap, bound) = match (self.connection_hard_cap, self.connection_unobserved_bound) {
            (Some(c), Some(b)) => (c, b),
            _ => return true,
        };
        match self.runtime.as_ref().and_then(|r| r.telemetry.as_ref()) {
            Some(t) if t.observed_at > now - HEARTBEAT_TTL_MS => {
                t.enforced_connection_units + self.outstanding + bound
                    < cap - CONTROL_RESERVE as i64
            }
            _ => false,
        }
    }

    /// The Cell object's `rollIsolated`: conditions (1)–(2).
    pub fn roll_stamp_active(&self, now: i64) -> bool {
        self.admission == Admission::MigrationOnly
            && self
                .roll_isolated_at
                .is_some_and(|s| now - s < ROLL_STAMP_MAX_AGE_MS)
    }

    /// A valid fence (docs/operations.md).
    pub fn fence_valid(&self, now: i64) -> bool {
        match (&self.fence, &self.runtime) {
            (Some(f), Some(r)) => {
                f.expires_at > now
                    && self.admission == Admission::ExistingOnly
                    && f.cell_incarnation == r.cell_incarnation
                    && f.attested_at >= r.last_heartbeat_at
            }
            _ => false,
        }
    }
}

/// Cause of a possibly missing cell: `None` when live.
pub fn cause(cell: Option<&CellView>, now: i64) -> Option<Cause> {
    let cell = match cell {
        Some(c) => c,
        None => return Some(Cause::Booting),
    };
    if cell.live(now) {
        return None;
    }
    let runtime = match &cell.runtime {
        Some(r) => r,
        None => return Some(Cause::Booting),
    };
    if cell.admission == Admission::ExistingOnly {
        return Some(Cause::Draining);
    }
    if runtime.last_heartbeat_at <= now - HEARTBEAT_TTL_MS {
        return Some(Cause::Unheard);
    }
    Some(Cause::NotReady)
}

/// How a heartbeat relates to the stored runtime row (docs/operations.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncarnationVerdict {
    /// No row yet, or the same process.
    Accept,
    /// A newer process of the cell.
    Takeover,
    /// An older (or inconsistent) process: `stale_cell_incarnation`.
    Stale,
}

/// `incarnation` must already be lowercased.
pub fn incarnation_verdict(
    stored: Option<(&str, i64)>,
    incarnation: &str,
    started_at: i64,
) -> IncarnationVerdict {
    match stored {
        None => IncarnationVerdict::Accept,
        Some((inc, started)) if inc == incarnation => {
            if started == started_at {
                IncarnationVerdict::Accept
            } else {
                IncarnationVerdict::Stale
            }
        }
        Some((_, started)) => {
            if started_at > started {
                IncarnationVerdict::Takeover
            } else {
                IncarnationVerdict::Stale
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub const NOW: i64 = 1_800_000_000_000;

    pub fn runtime(ready: bool, heard_ago: i64) -> Runtime {
        Runtime {
            cell_incarnation: "inc-1".into(),
            started_at: NOW - 1_000_000,
            ready,
            observed_requests: 0,
            last_heartbeat_at: NOW - heard_ago,
            telemetry: None,
            regional_rehome_protocol: 0,
            safety_json: None,
            safety_received_at: None,
        }
    }

    pub fn cell(id: &str, region: &str) -> CellView {
        CellView {
            cell_id: id.into(),
            cell_url: format!("https://{id}.test"),
            region: region.into(),
            capacity_requests: 900,
            reserved_requests: 0,
            admission: Admission::General,
            roll_isolated_at: None,
            connection_hard_cap: None,
            connection_unobserved_bound: None,
            runtime: Some(runtime(true, 1_000)),
            fence: None,
            outstanding: 0,
        }
    }

    pub fn capped(mut c: CellView, enforced: i64, total: i64, in_flight: i64) -> CellView {
        c.connection_hard_cap = Some(600);
        c.connection_unobserved_bound = Some(0);
        if let Some(r) = c.runtime.as_mut() {
            r.telemetry = Some(Telemetry {
                total_connections: total,
                in_flight_connections: in_flight,
                reserved_connection_units: enforced - total - in_flight,
                enforced_connection_units: enforced,
                inclusion_watermark: 1,
                observed_at: r.last_heartbeat_at,
            });
        }
        c
    }

    #[test]
    fn causes_in_order() {
        assert_eq!(cause(None, NOW), Some(Cause::Booting));
        let mut c = cell("a", "r");
        assert_eq!(c.cause(NOW), None);
        assert!(c.live(NOW));
        c.runtime = Some(runtime(false, 1_000));
        assert_eq!(c.cause(NOW), Some(Cause::NotReady));
        c.runtime = Some(runtime(true, 45_000));
        assert_eq!(c.cause(NOW), Some(Cause::Unheard));
        c.runtime = Some(runtime(true, 44_999));
        assert_eq!(c.cause(NOW), None);
        c.runtime = Some(runtime(true, 46_000));
        c.admission = Admission::ExistingOnly;
        assert_eq!(c.cause(NOW), Some(Cause::Draining));
        c.runtime = None;
        assert_eq!(c.cause(NOW), Some(Cause::Booting));
        // existing-only but fresh and ready is live.
        c.runtime = Some(runtime(true, 0));
        assert_eq!(c.cause(NOW), None);
    }

    #[test]
    fn headroom_rule() {
        let c = cell("a", "r");
        assert!(c.headroom(NOW), "uncapped always has headroom");
        let mut c = capped(cell("a", "r"), 498, 498, 0);
        c.connection_hard_cap = Some(600);
        assert!(c.headroom(NOW)); // 498 + 0 + 0 < 500
        c.outstanding = 2;
        assert!(!c.headroom(NOW)); // 500 < 500 false
        let mut c = capped(cell("a", "r"), 0, 0, 0);
        c.connection_unobserved_bound = Some(499);
        assert!(c.headroom(NOW));
        c.connection_unobserved_bound = Some(500);
        assert!(!c.headroom(NOW));
        let mut c = capped(cell("a", "r"), 0, 0, 0);
        c.runtime
            .as_mut()
            .unwrap()
            .telemetry
            .as_mut()
            .unwrap()
            .observed_at = NOW - 45_000;
        assert!(!c.headroom(NOW), "stale telemetry");
        c.runtime.as_mut().unwrap().telemetry = None;
        assert!(!c.headroom(NOW), "missing telemetry");
    }

    #[test]
    fn incarnations() {
        use IncarnationVerdict::*;
        assert_eq!(incarnation_verdict(None, "i1", 100), Accept);
        assert_eq!(incarnation_verdict(Some(("i1", 100)), "i1", 100), Accept);
        assert_eq!(incarnation_verdict(Some(("i1", 100)), "i1", 101), Stale);
        assert_eq!(incarnation_verdict(Some(("i1", 100)), "i2", 100), Stale);
        assert_eq!(incarnation_verdict(Some(("i1", 100)), "i2", 99), Stale);
        assert_eq!(incarnation_verdict(Some(("i1", 100)), "i2", 200), Takeover);
    }

    #[test]
    fn fences() {
        let mut c = cell("a", "r");
        c.runtime = Some(runtime(true, 60_000));
        c.admission = Admission::ExistingOnly;
        c.fence = Some(Fence {
            cell_incarnation: "inc-1".into(),
            attested_at: NOW - 10,
            expires_at: NOW + FENCE_TTL_MS,
        });
        assert!(c.fence_valid(NOW));
        assert!(!c.fence_valid(NOW + FENCE_TTL_MS));
        let mut d = c.clone();
        d.admission = Admission::MigrationOnly;
        assert!(!d.fence_valid(NOW));
        let mut d = c.clone();
        d.runtime.as_mut().unwrap().cell_incarnation = "inc-2".into();
        assert!(!d.fence_valid(NOW));
        let mut d = c.clone();
        d.runtime.as_mut().unwrap().last_heartbeat_at = NOW - 5;
        assert!(!d.fence_valid(NOW), "a later heartbeat invalidates it");
        let mut d = c;
        d.fence = None;
        assert!(!d.fence_valid(NOW));
    }

    #[test]
    fn roll_stamp() {
        let mut c = cell("a", "r");
        c.admission = Admission::MigrationOnly;
        assert!(!c.roll_stamp_active(NOW));
        c.roll_isolated_at = Some(NOW - ROLL_STAMP_MAX_AGE_MS + 1);
        assert!(c.roll_stamp_active(NOW));
        c.roll_isolated_at = Some(NOW - ROLL_STAMP_MAX_AGE_MS);
        assert!(!c.roll_stamp_active(NOW));
        c.roll_isolated_at = Some(NOW);
        c.admission = Admission::General;
        assert!(!c.roll_stamp_active(NOW));
    }
}
