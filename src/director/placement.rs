//! Placement decisions (ARCHITECTURE.md / docs/deploy/cluster.md) as pure functions over plain rows and `now`.
//!
//! The store locks rows and feeds them here; what comes back says what to write. Keeping every
//! rule here (dormant, stranded, roll-isolated, roll-replaced, fences, ranking) means the rules are
//! exhaustively unit-tested and identical on both placement paths and both backends.

use std::cmp::Ordering;

use super::liveness::{Admission, Cause, CellView, HEARTBEAT_TTL_MS};
pub use crate::model::assignment::HostView;
use crate::model::{ActivityId, AssignmentRow};

/// Dormancy: no lease and no activity for 24 h (ARCHITECTURE.md).
pub const DORMANT_AFTER_MS: i64 = 86_400_000;
/// Stranded window on a decommissioning home.
pub const STRANDED_MIN_MS: i64 = 60_000;
pub const STRANDED_MAX_MS: i64 = 900_000;

/// Dormancy of an assignment row: all six counters 0 and a day without activity. The one
/// statement of the rule; the operator overview counts rows with it too.
pub fn dormant(row: &AssignmentRow, now: i64) -> bool {
    row.counters.is_zero() && now >= row.last_activity_at + DORMANT_AFTER_MS
}

impl HostView {
    /// Σ units of the host's leases.
    pub fn units(&self) -> i64 {
        self.leases.iter().map(|l| l.request_units).sum()
    }

    /// Units charged to `cell_id`.
    pub fn units_on(&self, cell_id: &str) -> i64 {
        self.leases
            .iter()
            .filter(|l| l.cell_id == cell_id)
            .map(|l| l.request_units)
            .sum()
    }

    /// All six counters 0 and a day without activity.
    pub fn dormant(&self, now: i64) -> bool {
        dormant(&self.row, now)
    }

    /// Home `existing-only`, idle 1–15 min, no unexpired lease but `control-pending:*`.
    pub fn stranded(&self, home: Option<&CellView>, now: i64) -> bool {
        let idle = now - self.row.last_activity_at;
        home.is_some_and(|h| h.admission == Admission::ExistingOnly)
            && (STRANDED_MIN_MS..STRANDED_MAX_MS).contains(&idle)
            && !self
                .leases
                .iter()
                .any(|l| l.expires_at > now && !is_pending(&l.activity_id))
    }

    /// An activated control (`control:<X>:<g>`) whose lease on X has not expired: as far as the
    /// store knows, X is serving the host right now.
    pub fn serving_control_on(&self, cell_id: &str, now: i64) -> bool {
        self.leases.iter().any(|l| {
            l.expires_at > now
                && matches!(ActivityId::parse(&l.activity_id),
                    Some(ActivityId::Control { cell_id: c, .. }) if c == cell_id)
        })
    }

    /// A `control-pending:<current epoch>` lease on X, or a `control:<X>:<g>` lease.
    pub fn holds_control_on(&self, cell_id: &str) -> bool {
        let epoch = self.row.assignment_epoch;
        self.leases
            .iter()
            .any(|l| match ActivityId::parse(&l.activity_id) {
                Some(ActivityId::ControlPending { epoch: e }) => e == epoch && l.cell_id == cell_id,
                Some(ActivityId::Control { cell_id: c, .. }) => c == cell_id,
                _ => false,
            })
    }

    ///: the home carries a live roll stamp and the host has no migration lease or open
    /// migration. Liveness is ignored.
    pub fn roll_isolated(&self, home: Option<&CellView>, now: i64) -> bool {
        home.is_some_and(|h| h.roll_stamp_active(now))
            && self.row.counters.migrations == 0
            && self.open_migration.is_none()
    }

    ///: the process heartbeating for a roll-isolated home started after the stamp, is fresh
    /// and, on a capped cell, reports no connection at all in telemetry stored within 45 s.
    pub fn roll_replaced(&self, home: Option<&CellView>, now: i64) -> bool {
        if !self.roll_isolated(home, now) {
            return false;
        }
        let home = match home {
            Some(h) => h,
            None => return false,
        };
        let (stamp, runtime) = match (home.roll_isolated_at, home.runtime.as_ref()) {
            (Some(s), Some(r)) => (s, r),
            _ => return false,
        };
        if runtime.started_at <= stamp {
            return false;
        }
        if !home.fresh(now) {
            return false;
        }
        if home.capped() {
            return match &runtime.telemetry {
                Some(t) => {
                    t.observed_at > now - HEARTBEAT_TTL_MS
                        && t.total_connections == 0
                        && t.in_flight_connections == 0
                }
                None => false,
            };
        }
        true
    }
}

/// A `control-pending:<epoch>` id.
fn is_pending(activity_id: &str) -> bool {
    matches!(
        ActivityId::parse(activity_id),
        Some(ActivityId::ControlPending { .. })
    )
}

/// Candidate for `n` units.
pub fn candidate(cell: &CellView, n: i64, now: i64) -> bool {
    cell.admission == Admission::General
        && cell.live(now)
        && cell.reserved_requests + n <= cell.capacity_requests
        && cell.headroom(now)
}

fn load(cell: &CellView) -> (i128, i128) {
    let observed = cell.runtime.as_ref().map_or(0, |r| r.observed_requests);
    (
        i128::from(cell.reserved_requests + observed),
        i128::from(cell.capacity_requests.max(1)),
    )
}

/// Ranking order: ascending load ratio, then `cell_id` bytes.
pub fn rank(a: &CellView, b: &CellView) -> Ordering {
    let (an, ad) = load(a);
    let (bn, bd) = load(b);
    (an * bd)
        .cmp(&(bn * ad))
        .then_with(|| a.cell_id.as_bytes().cmp(b.cell_id.as_bytes()))
}

/// Region scope of a selection.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Best in the region, else best anywhere (spill).
    Prefer(&'a str),
    /// Best in the region or none.
    Require(&'a str),
    /// Best outside the region.
    Outside(&'a str),
}

/// The best candidate for `n` units in `scope`, never `exclude`.
pub fn select<'a>(
    cells: &'a [CellView],
    scope: Scope<'_>,
    n: i64,
    exclude: Option<&str>,
    now: i64,
) -> Option<&'a CellView> {
    let best = |pred: &dyn Fn(&CellView) -> bool| {
        cells
            .iter()
            .filter(|c| Some(c.cell_id.as_str()) != exclude)
            .filter(|c| pred(c) && candidate(c, n, now))
            .min_by(|a, b| rank(a, b))
    };
    match scope {
        Scope::Prefer(r) => best(&|c| c.region == r).or_else(|| best(&|_| true)),
        Scope::Require(r) => best(&|c| c.region == r),
        Scope::Outside(r) => best(&|c| c.region != r),
    }
}

/// Refusals of `assign` (rows 8–10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    CapacityExhausted,
    HeadroomExhausted,
    HomeUnavailable { cause: Cause, cell_id: String },
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::CapacityExhausted => "relay_capacity_exhausted",
            Refusal::HeadroomExhausted => "relay_connection_headroom_exhausted",
            Refusal::HomeUnavailable { .. } => "relay_home_cell_unavailable",
        }
    }
}

/// The no-target error: headroom when some `general` live cell with request room was excluded only
/// for lack of headroom.
pub fn no_target(cells: &[CellView], n: i64, exclude: Option<&str>, now: i64) -> Refusal {
    let headroom_only = cells.iter().any(|c| {
        Some(c.cell_id.as_str()) != exclude
            && c.admission == Admission::General
            && c.live(now)
            && c.reserved_requests + n <= c.capacity_requests
            && !c.headroom(now)
    });
    if headroom_only {
        Refusal::HeadroomExhausted
    } else {
        Refusal::CapacityExhausted
    }
}

/// Kinds of move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveKind {
    /// A new row, or a dormant host placed anew.
    Fresh,
    /// Off a roll-isolated home; leases kept.
    Isolated { source_live: bool },
    /// Off a home without connection headroom; leases kept.
    Headroom,
    /// Stranded or dead home; leases deleted, open migration aborted.
    Forced,
}

impl MoveKind {
    pub fn keeps_leases(self) -> bool {
        matches!(self, MoveKind::Isolated { .. } | MoveKind::Headroom)
    }
}

/// What the transaction must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A.5: the host holds a control on its home: extend and grant the same epoch.
    /// `deferred`: an isolated move found no target.
    Grant {
        deferred: bool,
    },
    /// A.7: charge 1 on the home (re-checked under the home row lock) and grant the same epoch.
    /// `deferred`: an isolated move found no target.
    ChargeHome {
        deferred: bool,
    },
    Move {
        target: String,
        kind: MoveKind,
    },
    Refuse(Refusal),
}

/// The first step of `assign` (A.4–A.7) with only the home known: `None` means the all-rows
/// path (or P) must decide with every cell.
pub fn decide_sticky(host: &HostView, home: Option<&CellView>, now: i64) -> Option<Decision> {
    let home_ref = home?;
    if host.dormant(now)
        || host.stranded(home, now)
        || host.roll_isolated(home, now)
        || !home_ref.live(now)
    {
        return None;
    }
    if host.holds_control_on(&home_ref.cell_id) {
        return Some(Decision::Grant { deferred: false });
    }
    if !home_ref.headroom(now) {
        if host.units() == 0 && home_ref.admission == Admission::General {
            return None;
        }
        return Some(Decision::Refuse(Refusal::HeadroomExhausted));
    }
    Some(Decision::ChargeHome { deferred: false })
}

/// The dead-cell sweep's spare (`AssignOptions::spare_serving`): a move off a home that is not
/// live but still holds the host's unexpired control lease, which the sweep leaves alone. A
/// valid fence (the operator's word that the process is gone) lifts it.
pub fn spared(hv: &HostView, cells: &[CellView], d: &Decision, now: i64) -> bool {
    let home_id = hv.row.cell_id.as_str();
    let home = cells.iter().find(|c| c.cell_id == home_id);
    let gone = home.is_some_and(|c| c.live(now) || c.fence_valid(now));
    matches!(d, Decision::Move { .. }) && !gone && hv.serving_control_on(home_id, now)
}

/// The full decision (P and M) with every cell row at hand. `host` is `None` for a host
/// without a row.
pub fn decide(
    host: Option<&HostView>,
    cells: &[CellView],
    placement_region: &str,
    now: i64,
) -> Decision {
    let fresh = |exclude: Option<&str>, kind: MoveKind| match select(
        cells,
        Scope::Prefer(placement_region),
        1,
        exclude,
        now,
    ) {
        Some(t) => Decision::Move {
            target: t.cell_id.clone(),
            kind,
        },
        None => Decision::Refuse(no_target(cells, 1, exclude, now)),
    };
    let host = match host {
        Some(h) => h,
        None => return fresh(None, MoveKind::Fresh),
    };
    let home_id = host.row.cell_id.as_str();
    let home = cells.iter().find(|c| c.cell_id == home_id);
    // 1. Dormant: placed anew.
    if host.dormant(now) {
        return fresh(None, MoveKind::Fresh);
    }
    // 2. Stranded: forced off the decommissioning cell.
    if host.stranded(home, now) {
        return fresh(Some(home_id), MoveKind::Forced);
    }
    let live = home.is_some_and(|h| h.live(now));
    // 3. Roll-isolated and (live or roll-replaced): same region first, then elsewhere.
    if host.roll_isolated(home, now) && (live || host.roll_replaced(home, now)) {
        let region = home.map(|h| h.region.as_str()).unwrap_or("");
        let target = select(cells, Scope::Require(region), 1, Some(home_id), now)
            .or_else(|| select(cells, Scope::Outside(region), 1, Some(home_id), now));
        return match target {
            Some(t) => Decision::Move {
                target: t.cell_id.clone(),
                kind: MoveKind::Isolated { source_live: live },
            },
            None if live => pin(host, home, cells, placement_region, true, now),
            None => Decision::Refuse(no_target(cells, 1, Some(home_id), now)),
        };
    }
    // 4. Live home: the sticky grant, or a headroom move.
    if live {
        return pin(host, home, cells, placement_region, false, now);
    }
    // 5. Dead-cell path.
    let capped = home.is_some_and(|h| h.capped());
    let fence_required = capped || host.open_migration.is_some();
    if fence_required && !home.is_some_and(|h| h.fence_valid(now)) {
        return Decision::Refuse(Refusal::HomeUnavailable {
            cause: super::liveness::cause(home, now).unwrap_or(Cause::Booting),
            cell_id: home_id.to_string(),
        });
    }
    fresh(Some(home_id), MoveKind::Forced)
}

/// A.5–A.7 on a live home; A.6's headroom move goes to the best other cell.
fn pin(
    host: &HostView,
    home: Option<&CellView>,
    cells: &[CellView],
    placement_region: &str,
    deferred: bool,
    now: i64,
) -> Decision {
    let home = match home {
        Some(h) => h,
        None => return Decision::Refuse(Refusal::CapacityExhausted),
    };
    if host.holds_control_on(&home.cell_id) {
        return Decision::Grant { deferred };
    }
    if !home.headroom(now) {
        if host.units() == 0
            && home.admission == Admission::General
            && host.open_migration.is_none()
        {
            return match select(
                cells,
                Scope::Prefer(placement_region),
                1,
                Some(&home.cell_id),
                now,
            ) {
                Some(t) => Decision::Move {
                    target: t.cell_id.clone(),
                    kind: MoveKind::Headroom,
                },
                None => Decision::Refuse(Refusal::HeadroomExhausted),
            };
        }
        return Decision::Refuse(Refusal::HeadroomExhausted);
    }
    if home.reserved_requests + 1 > home.capacity_requests {
        return Decision::Refuse(Refusal::CapacityExhausted);
    }
    Decision::ChargeHome { deferred }
}

/// Placement region: the request's, else the stored preference, else the first configured region.
pub fn placement_region<'a>(
    requested: Option<&'a str>,
    stored: Option<&'a str>,
    regions: &'a [String],
) -> &'a str {
    requested
        .or(stored)
        .unwrap_or_else(|| regions.first().map(String::as_str).unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::super::liveness::tests::{capped, cell, runtime, NOW};
    use super::super::liveness::{Fence, Telemetry};
    use super::*;
    use crate::model::{Lease, LeaseCounts, LeaseKind, OpenMigration};

    const US: &str = "us-central1";
    const ASIA: &str = "asia-east2";

    fn lease(id: &str, cell: &str, units: i64, expires_in: i64) -> Lease {
        let kind = id.split(':').next().unwrap();
        let kind = match kind {
            "control-pending" => "control",
            "invite-offer" => "invite",
            k => k,
        };
        Lease {
            activity_id: id.into(),
            kind: LeaseKind::from_stored(kind),
            cell_id: cell.into(),
            request_units: units,
            expires_at: NOW + expires_in,
            control_generation: None,
            cell_incarnation: None,
            idle_regional_rehome: false,
            renewed_at: None,
        }
    }

    fn host(home: &str, epoch: i64, leases: Vec<Lease>) -> HostView {
        let counters = LeaseCounts::of_leases(&leases);
        HostView {
            row: AssignmentRow {
                cell_id: home.into(),
                assignment_epoch: epoch,
                lease_expires_at: NOW + 90_000,
                last_activity_at: NOW - 1_000,
                counters,
                preferred_region: None,
            },
            leases,
            open_migration: None,
        }
    }

    #[test]
    fn a_dead_home_still_holding_an_unexpired_control_is_spared_by_the_sweep() {
        let serving = host("A", 3, vec![lease("control:A:2", "A", 1, 10_000)]);
        assert!(serving.serving_control_on("A", NOW));
        assert!(!serving.serving_control_on("B", NOW));
        let lapsed = host("A", 3, vec![lease("control:A:2", "A", 1, -1)]);
        assert!(!lapsed.serving_control_on("A", NOW));
        let pending = host("A", 3, vec![lease("control-pending:3", "A", 1, 10_000)]);
        assert!(!pending.serving_control_on("A", NOW));

        // A heard from 60 s ago (past the 45 s TTL): the rule moves the host to B, and the
        // sweep's spare applies only while A's control lease is unexpired.
        let mut cells = fleet();
        cells[0].runtime = Some(runtime(true, 60_000));
        let d = decide(Some(&serving), &cells, US, NOW);
        assert!(matches!(d, Decision::Move { .. }), "{d:?}");
        assert!(spared(&serving, &cells, &d, NOW));
        let d = decide(Some(&lapsed), &cells, US, NOW);
        assert!(!spared(&lapsed, &cells, &d, NOW));
        // A valid fence (the operator says the process is gone) lifts the spare.
        let mut fenced = cells.clone();
        fenced[0].admission = Admission::ExistingOnly;
        fenced[0].fence = Some(Fence {
            cell_incarnation: "inc-1".into(),
            attested_at: NOW - 1_000,
            expires_at: NOW + 200_000,
        });
        let d = decide(Some(&serving), &fenced, US, NOW);
        assert!(!spared(&serving, &fenced, &d, NOW));
        // A live home is never a spare case (no move happens there).
        let live = fleet();
        let d = decide(Some(&serving), &live, US, NOW);
        assert!(!spared(&serving, &live, &d, NOW));
    }

    fn fleet() -> Vec<CellView> {
        vec![cell("A", US), cell("B", US), cell("C", ASIA)]
    }

    fn moved(target: &str, kind: MoveKind) -> Decision {
        Decision::Move {
            target: target.into(),
            kind,
        }
    }

    /// Fixture R: A capped and roll-isolated at stamp S; the new process `ready:false`.
    fn fixture_r(new_process: bool) -> (Vec<CellView>, HostView) {
        let s = NOW - 600_000;
        let mut a = capped(cell("A", US), 0, 0, 0);
        a.admission = Admission::MigrationOnly;
        a.roll_isolated_at = Some(s);
        let r = a.runtime.as_mut().unwrap();
        r.ready = false;
        r.started_at = if new_process { s + 1 } else { s - 5_000_000 };
        let b = capped(cell("B", US), 0, 0, 0);
        let c = capped(cell("C", ASIA), 0, 0, 0);
        let h = host("A", 3, vec![lease("control-pending:3", "A", 1, 60_000)]);
        (vec![a, b, c], h)
    }

    #[test]
    fn fresh_placement_ranks_and_spills() {
        let mut cells = fleet();
        assert_eq!(decide(None, &cells, US, NOW), moved("A", MoveKind::Fresh));
        cells[0].runtime.as_mut().unwrap().observed_requests = 400;
        assert_eq!(decide(None, &cells, US, NOW), moved("B", MoveKind::Fresh));
        assert_eq!(decide(None, &cells, ASIA, NOW), moved("C", MoveKind::Fresh));
        cells[2].runtime = Some(runtime(false, 0));
        assert_eq!(decide(None, &cells, ASIA, NOW), moved("B", MoveKind::Fresh));
        // Ratio, not absolute load: 10/20 beats 300/900? 0.5 > 0.33 → the bigger cell wins.
        let mut a = cell("A", US);
        a.capacity_requests = 20;
        a.reserved_requests = 10;
        let mut b = cell("B", US);
        b.reserved_requests = 300;
        assert_eq!(rank(&a, &b), Ordering::Greater);
    }

    #[test]
    fn no_target_errors() {
        let mut cells = fleet();
        for c in &mut cells {
            c.admission = Admission::MigrationOnly;
        }
        assert_eq!(
            decide(None, &cells, US, NOW),
            Decision::Refuse(Refusal::CapacityExhausted)
        );
        let mut a = capped(cell("A", US), 499, 499, 0);
        a.outstanding = 1;
        assert_eq!(
            decide(None, &[a.clone()], US, NOW),
            Decision::Refuse(Refusal::HeadroomExhausted)
        );
        a.capacity_requests = 0;
        assert_eq!(
            decide(None, &[a], US, NOW),
            Decision::Refuse(Refusal::CapacityExhausted)
        );
        let mut one = cell("A", US);
        one.capacity_requests = 1;
        one.reserved_requests = 1;
        assert_eq!(
            decide(None, &[one], US, NOW),
            Decision::Refuse(Refusal::CapacityExhausted)
        );
    }

    #[test]
    fn sticky_grant_and_charge() {
        let cells = fleet();
        let h = host("A", 1, vec![lease("control-pending:1", "A", 1, 10_000)]);
        assert_eq!(
            decide_sticky(&h, Some(&cells[0]), NOW),
            Some(Decision::Grant { deferred: false })
        );
        let h = host("A", 2, vec![lease("control-pending:1", "A", 1, 10_000)]);
        assert_eq!(
            decide_sticky(&h, Some(&cells[0]), NOW),
            Some(Decision::ChargeHome { deferred: false })
        );
        let h = host("A", 2, vec![lease("control:A:7", "A", 1, 10_000)]);
        assert_eq!(
            decide_sticky(&h, Some(&cells[0]), NOW),
            Some(Decision::Grant { deferred: false })
        );
        let h = host("A", 2, vec![lease("control:B:7", "B", 1, 10_000)]);
        assert!(!h.holds_control_on("A"));
    }

    #[test]
    fn headroom_move_only_for_unit_free_hosts_on_general() {
        let mut cells = fleet();
        cells[0] = capped(cell("A", US), 500, 500, 0);
        let h = host("A", 1, vec![]);
        assert_eq!(decide_sticky(&h, Some(&cells[0]), NOW), None);
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("B", MoveKind::Headroom)
        );
        let h2 = host("A", 1, vec![lease("splice:x", "A", 2, 10_000)]);
        assert_eq!(
            decide(Some(&h2), &cells, US, NOW),
            Decision::Refuse(Refusal::HeadroomExhausted)
        );
        let mut h3 = host("A", 1, vec![]);
        h3.open_migration = Some(OpenMigration {
            assignment_epoch: 1,
            kind: "evacuation".into(),
            source_cell_id: "B".into(),
            target_cell_id: "A".into(),
            previous_epoch: 0,
            target_registered_at: None,
            created_at: NOW,
        });
        assert_eq!(
            decide(Some(&h3), &cells, US, NOW),
            Decision::Refuse(Refusal::HeadroomExhausted)
        );
    }

    #[test]
    fn dormant_and_stranded() {
        let cells = fleet();
        let mut h = host("A", 4, vec![]);
        h.row.last_activity_at = NOW - DORMANT_AFTER_MS;
        assert!(h.dormant(NOW));
        assert_eq!(decide_sticky(&h, Some(&cells[0]), NOW), None);
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("A", MoveKind::Fresh)
        );
        h.row.last_activity_at = NOW - DORMANT_AFTER_MS + 1;
        assert!(!h.dormant(NOW));

        let mut cells = fleet();
        cells[0].admission = Admission::ExistingOnly;
        let mut h = host("A", 4, vec![lease("control-pending:4", "A", 1, 10_000)]);
        h.row.last_activity_at = NOW - 60_000;
        assert!(h.stranded(Some(&cells[0]), NOW));
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("B", MoveKind::Forced)
        );
        h.row.last_activity_at = NOW - 59_999;
        assert!(!h.stranded(Some(&cells[0]), NOW));
        h.row.last_activity_at = NOW - 900_000;
        assert!(!h.stranded(Some(&cells[0]), NOW));
        h.row.last_activity_at = NOW - 100_000;
        h.leases.push(lease("splice:s", "A", 2, 10_000));
        assert!(!h.stranded(Some(&cells[0]), NOW));
    }

    #[test]
    fn live_isolated_moves_and_defers() {
        let mut cells = fleet();
        cells[0].admission = Admission::MigrationOnly;
        cells[0].roll_isolated_at = Some(NOW - 1_000);
        let h = host("A", 2, vec![lease("control-pending:2", "A", 1, 10_000)]);
        assert_eq!(decide_sticky(&h, Some(&cells[0]), NOW), None);
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("B", MoveKind::Isolated { source_live: true })
        );
        cells[1].admission = Admission::MigrationOnly;
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("C", MoveKind::Isolated { source_live: true })
        );
        cells[2].runtime = None;
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            Decision::Grant { deferred: true }
        );
        let h = host("A", 3, vec![lease("control-pending:2", "A", 1, 10_000)]);
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            Decision::ChargeHome { deferred: true }
        );
        // Without a stamp: no isolation, stays.
        cells[0].roll_isolated_at = None;
        assert_eq!(
            decide_sticky(&h, Some(&cells[0]), NOW),
            Some(Decision::ChargeHome { deferred: false })
        );
    }

    #[test]
    fn roll_isolation_conditions() {
        let (cells, mut h) = fixture_r(true);
        assert!(h.roll_isolated(Some(&cells[0]), NOW));
        h.row.counters.migrations = 1;
        assert!(!h.roll_isolated(Some(&cells[0]), NOW));
        h.row.counters.migrations = 0;
        h.open_migration = Some(OpenMigration {
            assignment_epoch: 3,
            kind: "evacuation".into(),
            source_cell_id: "B".into(),
            target_cell_id: "A".into(),
            previous_epoch: 2,
            target_registered_at: None,
            created_at: NOW,
        });
        assert!(!h.roll_isolated(Some(&cells[0]), NOW));
        assert!(!h.roll_isolated(None, NOW));
    }

    // The seed change: each residual refusal and the move.

    #[test]
    fn roll_replaced_moves_off_not_ready_new_process() {
        let (cells, h) = fixture_r(true);
        assert!(h.roll_replaced(Some(&cells[0]), NOW));
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("B", MoveKind::Isolated { source_live: false })
        );
    }

    #[test]
    fn roll_replaced_uncapped_moves_keeping_leases() {
        let (mut cells, h) = fixture_r(true);
        cells[0].connection_hard_cap = None;
        cells[0].connection_unobserved_bound = None;
        cells[0].runtime.as_mut().unwrap().telemetry = None;
        let d = decide(Some(&h), &cells, US, NOW);
        assert_eq!(d, moved("B", MoveKind::Isolated { source_live: false }));
        assert!(MoveKind::Isolated { source_live: false }.keeps_leases());
    }

    fn refused(cells: &[CellView], h: &HostView, cause: Cause) {
        assert_eq!(
            decide(Some(h), cells, US, NOW),
            Decision::Refuse(Refusal::HomeUnavailable {
                cause,
                cell_id: "A".into()
            })
        );
    }

    #[test]
    fn pre_isolation_incarnation_refused() {
        let (cells, h) = fixture_r(false);
        assert!(!h.roll_replaced(Some(&cells[0]), NOW));
        refused(&cells, &h, Cause::NotReady);
        // started_at == stamp is not after it.
        let (mut cells, h) = fixture_r(true);
        cells[0].runtime.as_mut().unwrap().started_at = cells[0].roll_isolated_at.unwrap();
        refused(&cells, &h, Cause::NotReady);
    }

    #[test]
    fn reported_connections_refused() {
        for (total, in_flight) in [(1, 0), (0, 1)] {
            let (mut cells, h) = fixture_r(true);
            let t = cells[0]
                .runtime
                .as_mut()
                .unwrap()
                .telemetry
                .as_mut()
                .unwrap();
            t.total_connections = total;
            t.in_flight_connections = in_flight;
            t.enforced_connection_units = total + in_flight;
            refused(&cells, &h, Cause::NotReady);
        }
    }

    #[test]
    fn new_process_unheard_refused() {
        let (mut cells, h) = fixture_r(true);
        let r = cells[0].runtime.as_mut().unwrap();
        r.last_heartbeat_at = NOW - 46_000;
        r.telemetry.as_mut().unwrap().observed_at = NOW - 46_000;
        refused(&cells, &h, Cause::Unheard);
        // Fresh heartbeat but telemetry stale is refused too (capped).
        let (mut cells, h) = fixture_r(true);
        cells[0]
            .runtime
            .as_mut()
            .unwrap()
            .telemetry
            .as_mut()
            .unwrap()
            .observed_at = NOW - 45_000;
        refused(&cells, &h, Cause::NotReady);
    }

    #[test]
    fn telemetry_missing_refused() {
        let (mut cells, h) = fixture_r(true);
        cells[0].runtime.as_mut().unwrap().telemetry = None;
        refused(&cells, &h, Cause::NotReady);
    }

    #[test]
    fn stale_stamp_and_unstamped_refused() {
        let (mut cells, h) = fixture_r(true);
        cells[0].roll_isolated_at = Some(NOW - 7_200_000);
        cells[0].runtime.as_mut().unwrap().started_at = NOW - 1_000;
        refused(&cells, &h, Cause::NotReady);
        let (mut cells, h) = fixture_r(true);
        cells[0].roll_isolated_at = None;
        refused(&cells, &h, Cause::NotReady);
        let (mut cells, h) = fixture_r(true);
        cells[0].roll_isolated_at = None;
        cells[0].admission = Admission::General;
        refused(&cells, &h, Cause::NotReady);
    }

    #[test]
    fn unheard_window_refused_and_booting() {
        let (mut cells, h) = fixture_r(false);
        let r = cells[0].runtime.as_mut().unwrap();
        r.ready = true;
        r.last_heartbeat_at = NOW - 46_000;
        refused(&cells, &h, Cause::Unheard);
        let (mut cells, h) = fixture_r(true);
        cells[0].runtime = None;
        refused(&cells, &h, Cause::Booting);
    }

    #[test]
    fn roll_replaced_without_target_is_no_target_error() {
        let (mut cells, h) = fixture_r(true);
        cells[1].admission = Admission::MigrationOnly;
        cells[2].runtime = None;
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            Decision::Refuse(Refusal::CapacityExhausted)
        );
        // Narrow path: B unavailable → C in another region.
        let (mut cells, h) = fixture_r(true);
        cells[1].admission = Admission::MigrationOnly;
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("C", MoveKind::Isolated { source_live: false })
        );
    }

    #[test]
    fn open_migration_or_migration_lease_takes_dead_cell_path_with_fence() {
        let (cells, mut h) = fixture_r(true);
        h.row.counters.migrations = 1;
        refused(&cells, &h, Cause::NotReady);
        // Uncapped home without open migration: forced move.
        let (mut cells, h) = fixture_r(false);
        cells[0].connection_hard_cap = None;
        cells[0].connection_unobserved_bound = None;
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("B", MoveKind::Forced)
        );
    }

    #[test]
    fn fence_allows_forced_move() {
        let mut cells = fleet();
        cells[0] = capped(cell("A", US), 0, 0, 0);
        cells[0].admission = Admission::ExistingOnly;
        cells[0].runtime.as_mut().unwrap().last_heartbeat_at = NOW - 46_000;
        let h = host("A", 5, vec![lease("control-pending:5", "A", 1, 10_000)]);
        refused(&cells, &h, Cause::Draining);
        cells[0].fence = Some(Fence {
            cell_incarnation: "inc-1".into(),
            attested_at: NOW - 1_000,
            expires_at: NOW + 200_000,
        });
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("B", MoveKind::Forced)
        );
    }

    #[test]
    fn ordinary_dip_refused_on_capped_general() {
        let mut cells = fleet();
        cells[0] = capped(cell("A", US), 0, 0, 0);
        cells[0].runtime.as_mut().unwrap().ready = false;
        let h = host("A", 1, vec![]);
        refused(&cells, &h, Cause::NotReady);
        // Uncapped: forced move.
        let mut cells = fleet();
        cells[0].runtime.as_mut().unwrap().ready = false;
        assert_eq!(
            decide(Some(&h), &cells, US, NOW),
            moved("B", MoveKind::Forced)
        );
    }

    #[test]
    fn telemetry_struct_is_used() {
        let t = Telemetry {
            total_connections: 0,
            in_flight_connections: 0,
            reserved_connection_units: 0,
            enforced_connection_units: 0,
            inclusion_watermark: 0,
            observed_at: NOW,
        };
        assert_eq!(t.enforced_connection_units, 0);
        assert_eq!(placement_region(None, None, &[US.to_string()]), US);
        assert_eq!(placement_region(None, Some(ASIA), &[US.to_string()]), ASIA);
        assert_eq!(placement_region(Some(US), Some(ASIA), &[]), US);
    }
}
