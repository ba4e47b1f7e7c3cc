//! The cell's heartbeat body (protocol.md §12). The transport (in-process director for role `all`
//! without `ORCA_RELAY_DIRECTOR_URL`, else HTTP with a cluster token) is the director's
//! `heartbeat_client`; this module builds the body from one ledger snapshot.

use crate::contract::wire::CellHeartbeat;

use super::Cell;

impl Cell {
    /// One heartbeat body; capped cells add the seven ledger fields from a single snapshot (which
    /// advances the inclusion watermark).
    pub fn heartbeat_body(&self, ready: bool) -> CellHeartbeat {
        let cfg = &self.ctx.config;
        let snap = self.with_ledger(|l| l.snapshot());
        let bound = cfg.hard_cap.map(|c| c.unobserved_bound as i64);
        CellHeartbeat {
            v: 1,
            cell_id: cfg.cell_id.clone(),
            cell_url: cfg.cell_url.clone(),
            region: cfg.region.clone(),
            cell_incarnation: self.ctx.incarnation.clone(),
            started_at: self.ctx.started_at,
            ready,
            observed_requests: self.observed_requests(),
            total_connections: snap.map(|s| s.physical as i64),
            in_flight_connections: snap.map(|s| s.in_flight as i64),
            reserved_connection_units: snap.map(|s| s.reserved as i64),
            enforced_connection_units: snap.map(|s| s.enforced as i64),
            connection_hard_cap: snap.map(|s| s.hard_cap as i64),
            connection_unobserved_bound: snap.and(bound),
            connection_inclusion_watermark: snap.map(|s| s.watermark as i64),
        }
    }
}
