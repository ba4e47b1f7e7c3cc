//! Idle regional correction (docs/reference/http.md): a domain module both roles use.
//!
//! The director issues measurement windows, records reports, keeps the control row and dispatches
//! attempts; the *source cell* commits and reconciles them against the shared database. Both halves
//! need the same rules, so they live here, below the roles: [`rules`] (pure functions over plain
//! data) and [`service`] (the transactions, composed from `store::region` primitives in the lock
//! order of ARCHITECTURE.md). This module names no role and does no logging: services return the
//! events to log, and the caller logs them after commit.

pub mod rules;
pub mod service;

use crate::store::cells::CellView;
use rules::CellFacts;

/// The rehome facts of a cell view at `now`.
pub fn cell_facts(c: &CellView, now: i64) -> CellFacts {
    let rt = c.runtime.as_ref();
    CellFacts {
        cell_id: c.cell_id.clone(),
        cell_url: c.cell_url.clone(),
        region: c.region.clone(),
        general: c.admission.as_str() == "general",
        live: c.live(now),
        headroom: c.headroom(now),
        capped: c.capped(),
        capacity_requests: c.capacity_requests,
        reserved_requests: c.reserved_requests,
        observed_requests: rt.map_or(0, |r| r.observed_requests),
        incarnation: rt.map(|r| r.cell_incarnation.clone()),
        started_at: rt.map(|r| r.started_at),
        protocol: rt.map_or(0, |r| r.regional_rehome_protocol),
        safety: rules::parse_safety(rt.and_then(|r| r.safety_json.as_deref())),
        safety_received_at: rt.and_then(|r| r.safety_received_at),
    }
}

/// A reading of a process's store counters for its safety window (docs/reference/http.md): SQL
/// failures and reconnects since start-up, pool waiters and wait maxima since the previous
/// reading, pool size. `recovery_failures` is the caller's own control-activity recovery count
/// (0 for a director, which recovers no activities).
///
/// The wait maxima are taken (reset) by each reading, so in a role-`all` process the director's
/// and the cell's windows each see part of them; the cell merges the director's safety with its
/// own field-wise before committing (docs/reference/http.md step 7), so together they see every maximum.
pub fn store_reading(db: &crate::store::Db, recovery_failures: i64) -> rules::SafetyReading {
    let (sql, reconnects) = db.waits().failure_totals();
    let (waiters_max, wait_ms_max) = db.waits().take_window_maxima();
    let p = db.pressure();
    rules::SafetyReading {
        totals: [sql as i64, reconnects as i64, recovery_failures],
        waiting: p.waiting as i64,
        waiters_max: waiters_max as i64,
        wait_ms_max: wait_ms_max as i64,
        pool: db.pool_status().map(|(t, i)| (t as i64, i as i64)),
        oldest_wait_ms: p.oldest_wait_ms as i64,
    }
}
