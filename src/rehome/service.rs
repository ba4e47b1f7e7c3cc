//! The transactions of idle regional correction: measurement windows and reports, the
//! control row, `commitIdleRegionalRehome`, `reconcileIdleRegionalRehome`
//!, disabling after aborts and the outcome counts.
//!
//! Locks follow ARCHITECTURE.md: control row (0), assignment row (1), the host's leases, migration,
//! attempts and decision (2), reservations (3), then one cell row (4). Runtime, fence and decision
//! reads are plain. Each function returns the log events its caller emits after commit.

use serde_json::{json, Value as Json};

use super::cell_facts;
use super::rules::{self, AttemptRecord, CellFacts, Control, RehomeRequest, ReportStatus};
use crate::contract::wire::Safety;
use crate::model::LeaseKind;
use crate::store::assignments::{
    insert_lease, lock_leases, lock_open_migration, lock_reservations, lock_row, refresh_row,
    release_epoch_reservations, reserve_connection, HostKey, CELL_DRIVEN_WAIT_MS,
};
use crate::store::cells::{self, Reader, Which};
use crate::store::region::{self, NewMigration, ReserveRefusal};
use crate::store::{Db, DbError, RetryClass, Tx};

/// Lifetime of the target's `control-pending` and `migration` leases of a move (docs/operations.md).
pub const MOVE_LEASE_MS: i64 = 900_000;
/// Trailing window of the outcome counts.
pub const OUTCOME_WINDOW_MS: i64 = 86_400_000;

/// An event to log after commit: name and fields (never a host identity).
pub type Event = (&'static str, Json);

async fn facts(tx: &mut Tx, now: i64) -> Result<Vec<CellFacts>, DbError> {
    Ok(cells::views(Reader::Tx(tx), Which::All, false)
        .await?
        .iter()
        .map(|c| cell_facts(c, now))
        .collect())
}

/// Rehome facts of every cell (plain read).
pub async fn all_cell_facts(db: &Db, now: i64) -> Result<Vec<CellFacts>, DbError> {
    Ok(cells::views(Reader::Db(db), Which::All, false)
        .await?
        .iter()
        .map(|c| cell_facts(c, now))
        .collect())
}

/// The worker's page of (plain reads): up to `limit` distinct hosts with a conclusive
/// preference for another region, continuing after `cursor` and wrapping at the end *within* the
/// page (a short read after the cursor is filled from the first key through the cursor), so every
/// poll sees up to `limit` hosts. Returns the page and the next poll's cursor
/// ([`rules::join_page`]).
pub async fn candidate_page(
    db: &Db,
    cursor: Option<&HostKey>,
    limit: usize,
) -> Result<(Vec<region::PageHost>, Option<HostKey>), DbError> {
    let first = region::candidate_page(db, cursor, None, limit as i64).await?;
    let wrap = match rules::wrap_read(cursor.is_some(), first.len(), limit) {
        Some(n) => region::candidate_page(db, None, cursor, n as i64).await?,
        None => Vec::new(),
    };
    Ok(rules::join_page(first, wrap, limit, |p| &p.host))
}

// ---------------------------------------------------------------------------------------------------
// windows and reports

/// `issue-window` after a grant at `epoch` on a home in `incumbent_region`: the window object.
pub async fn issue_window(
    db: &Db,
    host: &HostKey,
    epoch: i64,
    incumbent_region: &str,
    now: i64,
) -> Result<Json, DbError> {
    let bucket = rules::cohort_bucket(&host.user_id, &host.relay_host_id);
    let expires_at = now + rules::WINDOW_TTL_MS;
    let generation = crate::transaction!(db, "regional-rehome", |tx| {
        region::upsert_window(
            tx,
            host,
            epoch,
            incumbent_region,
            rules::POLICY_VERSION,
            bucket,
            expires_at,
            now,
        )
        .await
    })?;
    Ok(json!({
        "generation": generation,
        "expiresAt": expires_at,
        "assignmentEpoch": epoch,
        "incumbentRegion": incumbent_region,
        "policyVersion": rules::POLICY_VERSION,
    }))
}

/// A report's status, and the events of an accepted one.
pub async fn report(
    db: &Db,
    host: &HostKey,
    report: &rules::Report,
    regions: &[String],
    now: i64,
) -> Result<(ReportStatus, Vec<Event>), DbError> {
    crate::transaction!(db, "regional-rehome", |tx| {
        let Some(row) = lock_row(tx, host, Some(CELL_DRIVEN_WAIT_MS)).await? else {
            return Ok((ReportStatus::BasisChanged, vec![]));
        };
        let decision = region::lock_decision(tx, host).await?;
        let home_region = cells::view_in(tx, &row.cell_id)
            .await?
            .map(|c| c.region)
            .unwrap_or_default();
        let status = rules::report_status(
            decision.as_ref(),
            report,
            row.assignment_epoch,
            &home_region,
            now,
        );
        let mut events = Vec::new();
        if status != ReportStatus::Accepted {
            return Ok((status, events));
        }
        let d = decision.expect("accepted implies a decision");
        match &report.outcome {
            rules::ReportOutcome::Conclusive(m) => {
                let preferred = rules::preferred_region(m, &d.incumbent_region, regions);
                let mut obj = serde_json::Map::new();
                for (k, v) in m {
                    obj.insert(k.clone(), json!(v));
                }
                let text = Json::Object(obj).to_string();
                region::accept_report(
                    tx,
                    host,
                    "conclusive",
                    preferred.as_deref(),
                    Some(&text),
                    None,
                    now,
                )
                .await?;
                if d.cohort_bucket < 10 {
                    let inc = m
                        .iter()
                        .find(|(k, _)| *k == d.incumbent_region)
                        .map(|x| x.1);
                    let best = regions
                        .iter()
                        .filter(|r| **r != d.incumbent_region)
                        .filter_map(|r| m.iter().find(|(k, _)| k == r))
                        .min_by_key(|(_, v)| *v);
                    events.push((
                        "orca_relay_region_comparison",
                        json!({
                            "incumbentRegion": d.incumbent_region,
                            "incumbentRttMs": inc,
                            "bestOtherRegion": best.map(|b| b.0.clone()),
                            "bestOtherRttMs": best.map(|b| b.1),
                            "preferred": preferred,
                        }),
                    ));
                }
            }
            rules::ReportOutcome::Inconclusive(reason) => {
                region::accept_report(tx, host, "inconclusive", None, None, Some(reason), now)
                    .await?;
            }
        }
        Ok((status, events))
    })
}

// ---------------------------------------------------------------------------------------------------
// control

/// Refusal of `apply`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    GenerationMismatch,
    Db(DbError),
}

impl From<DbError> for ControlError {
    fn from(e: DbError) -> Self {
        ControlError::Db(e)
    }
}

impl RetryClass for ControlError {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            ControlError::Db(e) => e.retry_code(),
            _ => None,
        }
    }
    fn db_error(&self) -> Option<&crate::store::DbError> {
        match self {
            ControlError::Db(e) => Some(e),
            _ => None,
        }
    }
}

/// `apply` with the generation check.
pub async fn apply_control(db: &Db, a: &rules::Apply, now: i64) -> Result<Control, ControlError> {
    crate::transaction!(db, "regional-rehome", |tx| {
        let c = region::lock_control(tx, false).await?;
        if c.generation != a.expected_generation {
            return Err(ControlError::GenerationMismatch);
        }
        let n = rules::applied(&c, a, now);
        region::write_control(tx, &n).await?;
        Ok(n)
    })
}

/// An automatic disable with `reason` (no-op when already disabled with that reason); the
/// `orca_relay_regional_rehome_safety_disabled` event when it happened.
pub async fn disable(db: &Db, reason: &str, now: i64) -> Result<Option<Event>, DbError> {
    crate::transaction!(db, "regional-rehome", |tx| {
        let c = region::lock_control(tx, false).await?;
        if !c.enabled && c.disabled_reason.as_deref() == Some(reason) {
            return Ok(None);
        }
        let n = rules::disabled(&c, reason, now);
        region::write_control(tx, &n).await?;
        Ok(Some(disabled_event(&n)))
    })
}

fn disabled_event(c: &Control) -> Event {
    (
        "orca_relay_regional_rehome_safety_disabled",
        json!({"reason": c.disabled_reason, "generation": c.generation}),
    )
}

/// After attempts were aborted: disables the control with the latest abort reason when an
/// attempt was aborted after the control row last changed. Runs in its own transaction after the
/// abort committed, because the control row precedes assignment rows in the lock order.
pub async fn disable_after_aborts(db: &Db, now: i64) -> Result<Option<Event>, DbError> {
    let c = region::read_control(db).await?;
    match region::latest_abort_after(db, c.updated_at).await? {
        Some(reason) => disable(db, &reason, now).await,
        None => Ok(None),
    }
}

/// A dispatch answer's effect on the failure budget: `failed` counts one failure (three
/// in a row pause 5 min and disable `failure-budget`), otherwise the count resets after a commit.
/// The disable yields two events: `orca_relay_regional_rehome_failure_budget_disabled` with the
/// budget's figures, and `orca_relay_regional_rehome_safety_disabled {reason, generation}` like
/// every automatic disable; no event otherwise.
pub async fn record_dispatch(db: &Db, failed: bool, now: i64) -> Result<Vec<Event>, DbError> {
    crate::transaction!(db, "regional-rehome", |tx| {
        let mut c = region::lock_control(tx, false).await?;
        if !failed {
            if c.consecutive_failures != 0 {
                c.consecutive_failures = 0;
                region::write_control(tx, &c).await?;
            }
            return Ok(Vec::new());
        }
        c.consecutive_failures += 1;
        if c.consecutive_failures >= rules::FAILURE_BUDGET {
            c.paused_until = now + rules::FAILURE_PAUSE_MS;
            let n = rules::disabled(&c, "failure-budget", now);
            region::write_control(tx, &n).await?;
            return Ok(vec![
                (
                    "orca_relay_regional_rehome_failure_budget_disabled",
                    json!({"consecutiveFailures": n.consecutive_failures, "pausedUntil": n.paused_until}),
                ),
                disabled_event(&n),
            ]);
        }
        region::write_control(tx, &c).await?;
        Ok(Vec::new())
    })
}

/// The Outcomes object over the trailing 24 h.
pub async fn outcomes(db: &Db, now: i64) -> Result<Json, DbError> {
    let o = region::outcome_counts(db, now - OUTCOME_WINDOW_MS).await?;
    let aborted: serde_json::Map<String, Json> =
        o.aborted.into_iter().map(|(r, n)| (r, json!(n))).collect();
    let migrations: Vec<Json> = o
        .migrations
        .into_iter()
        .map(|(s, t, st, n)| json!({"sourceCellId": s, "targetCellId": t, "state": st, "count": n}))
        .collect();
    Ok(json!({
        "decisions": {"issued": o.issued, "conclusive": o.conclusive, "inconclusive": o.inconclusive, "preferOther": o.prefer_other},
        "attempts": {"committed": o.committed, "completed": o.completed, "aborted": aborted},
        "migrations": migrations,
    }))
}

// ---------------------------------------------------------------------------------------------------
// reconcile

/// `reconcileIdleRegionalRehome` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    Committed,
    NotCommitted,
    Stale,
}

impl Reconciled {
    pub fn as_str(self) -> &'static str {
        match self {
            Reconciled::Committed => "committed",
            Reconciled::NotCommitted => "not-committed",
            Reconciled::Stale => "stale",
        }
    }
}

fn key_of(r: &RehomeRequest) -> HostKey {
    HostKey {
        user_id: r.user_id.clone(),
        relay_host_id: r.relay_host_id.clone(),
    }
}

/// Locks the assignment row (≤ 1 000 ms) before reading the attempt. A lock or database failure
/// is an error, never an answer.
pub async fn reconcile(db: &Db, req: &RehomeRequest, now: i64) -> Result<Reconciled, DbError> {
    crate::transaction!(db, "regional-rehome", |tx| reconcile_tx(tx, req, now).await)
}

async fn reconcile_tx(tx: &mut Tx, req: &RehomeRequest, now: i64) -> Result<Reconciled, DbError> {
    let host = key_of(req);
    let row = lock_row(tx, &host, Some(CELL_DRIVEN_WAIT_MS)).await?;
    if let Some(a) = region::lock_attempt(tx, &req.attempt_id).await? {
        return Ok(if rules::attempt_matches(&a, req) {
            Reconciled::Committed
        } else {
            Reconciled::Stale
        });
    }
    let Some(row) = row else {
        return Ok(Reconciled::Stale);
    };
    if row.cell_id != req.source_cell_id || row.assignment_epoch != req.source_assignment_epoch {
        return Ok(Reconciled::Stale);
    }
    let source = cells::view_in(tx, &req.source_cell_id).await?;
    let source_ok = source.as_ref().is_some_and(|s| {
        s.live(now)
            && s.runtime
                .as_ref()
                .is_some_and(|r| r.cell_incarnation == req.source_cell_incarnation)
    });
    let lease_id = format!("control:{}:{}", req.source_cell_id, req.source_generation);
    let leases = lock_leases(tx, &host).await?;
    let lease_ok = leases.iter().any(|l| l.activity_id == lease_id);
    Ok(if source_ok && lease_ok {
        Reconciled::NotCommitted
    } else {
        Reconciled::Stale
    })
}

// ---------------------------------------------------------------------------------------------------
// commit

/// `commitIdleRegionalRehome` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    Committed,
    Stale,
    Deferred(&'static str),
}

enum CommitFail {
    /// Roll everything back: the target reserve was refused.
    Rollback(&'static str),
    Db(DbError),
}

impl From<DbError> for CommitFail {
    fn from(e: DbError) -> Self {
        CommitFail::Db(e)
    }
}

impl RetryClass for CommitFail {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            CommitFail::Db(e) => e.retry_code(),
            _ => None,
        }
    }
    fn db_error(&self) -> Option<&crate::store::DbError> {
        match self {
            CommitFail::Db(e) => Some(e),
            _ => None,
        }
    }
}

const INELIGIBLE: &str = "candidate-ineligible";

/// Runs the exact request: reconcile first, then the locked re-check and the move. `safety` is the
/// merged director and source safety. Never chooses another host or destination.
pub async fn commit(
    db: &Db,
    req: &RehomeRequest,
    safety: &Safety,
    cohort_percent: i64,
    now: i64,
) -> Result<(Committed, Vec<Event>), DbError> {
    match reconcile(db, req, now).await? {
        Reconciled::Committed => return Ok((Committed::Committed, vec![])),
        Reconciled::Stale => return Ok((Committed::Stale, vec![])),
        Reconciled::NotCommitted => {}
    }
    if !(1..=100).contains(&cohort_percent) {
        return Ok((Committed::Deferred("cohort-closed"), vec![]));
    }
    if !rules::safety_clean(safety) {
        return Ok((Committed::Deferred("fleet-safety"), vec![]));
    }
    let r: Result<(Committed, Vec<Event>), CommitFail> =
        crate::transaction!(db, "regional-rehome", |tx| {
            commit_tx(tx, req, cohort_percent, now).await
        });
    match r {
        Ok(x) => Ok(x),
        Err(CommitFail::Rollback(cause)) => Ok((
            Committed::Deferred(INELIGIBLE),
            vec![(
                "orca_relay_idle_rehome_target_deferred",
                json!({"attemptId": req.attempt_id, "targetCellId": req.target_cell_id, "cause": cause}),
            )],
        )),
        Err(CommitFail::Db(e)) => Err(e),
    }
}

/// `commitIdleRegionalRehome` in one transaction, in its lock order: the budget (control row and
/// concurrency), fleet safety, the host under lock and its eligibility, the move's writes, the
/// rate slot, and last the conditional reserve on the target row.
async fn commit_tx(
    tx: &mut Tx,
    req: &RehomeRequest,
    cohort_percent: i64,
    now: i64,
) -> Result<(Committed, Vec<Event>), CommitFail> {
    let deferred = |r: &'static str| Ok((Committed::Deferred(r), vec![]));
    let mut control = match lock_budget(tx, now).await? {
        Ok(c) => c,
        Err(gate) => return deferred(gate),
    };
    // 3.3 fleet safety: failing it disables the control, and that disable commits.
    let cells = facts(tx, now).await?;
    if !rules::fleet_safe(&cells, now) {
        let n = rules::disabled(&control, "fleet-safety", now);
        region::write_control(tx, &n).await?;
        return Ok((
            Committed::Deferred("fleet-safety"),
            vec![disabled_event(&n)],
        ));
    }
    // 3.4 the host under lock.
    let host = key_of(req);
    let Some(locked) = lock_host(tx, &host).await? else {
        return deferred(INELIGIBLE);
    };
    let source = cells.iter().find(|c| c.cell_id == req.source_cell_id);
    let target = cells.iter().find(|c| c.cell_id == req.target_cell_id);
    let (Some(source), Some(target)) = (source, target) else {
        return deferred(INELIGIBLE);
    };
    let preferred = match move_decision(
        req,
        &locked,
        (source, target),
        &control,
        cohort_percent,
        now,
    ) {
        Ok(p) => p,
        Err(r) => return deferred(r),
    };
    // 3.5 the writes of (kind idle-rehome, arrival 5 min) and the attempt.
    let src = source_units(&locked.leases, &req.source_cell_id);
    write_move(tx, req, &host, &locked.row, (target, src), &preferred, now).await?;
    // 3.6 the rate slot.
    // `updated_at` tracks operator and automatic changes only (see `disable_after_aborts`).
    control.next_dispatch_at = now + rules::dispatch_interval_ms(control.rate_per_minute);
    region::write_control(tx, &control).await?;
    // 3.7 last: the conditional reserve on the target row, NOWAIT.
    match region::reserve_on_general_target(tx, &target.cell_id, src + 1, now).await? {
        Ok(()) => Ok((Committed::Committed, vec![])),
        Err(ReserveRefusal::RowBusy) => Err(CommitFail::Rollback("target-row-busy")),
        Err(ReserveRefusal::NotAdmitting) => Err(CommitFail::Rollback("target-not-admitting")),
    }
}

/// 3.1 the control row NOWAIT and its gates, 3.2 the concurrency limit. `Ok(Err(reason))` defers:
/// a busy control row means another commit is writing its dispatch slot right now, so the budget
/// is, for this instant, taken.
async fn lock_budget(tx: &mut Tx, now: i64) -> Result<Result<Control, &'static str>, CommitFail> {
    let control = match region::lock_control(tx, true).await {
        Ok(c) => c,
        Err(DbError::LockUnavailable) => return Ok(Err("budget-closed")),
        Err(e) => return Err(e.into()),
    };
    if let Some(gate) = rules::control_gate(&control, now) {
        return Ok(Err(gate));
    }
    if region::count_open_idle_migrations(tx).await? >= rules::MAX_OPEN_IDLE_MIGRATIONS {
        return Ok(Err("concurrency-limit"));
    }
    Ok(Ok(control))
}

/// The host's rows the commit reads under lock (3.4); its reservations are locked too.
struct LockedHost {
    row: crate::model::AssignmentRow,
    leases: Vec<crate::model::Lease>,
    open: Option<crate::model::OpenMigration>,
    decision: Option<region::Decision>,
    last_attempt: Option<i64>,
}

/// Locks the host in the lock order; `None` when its row is gone or busy (NOWAIT).
async fn lock_host(tx: &mut Tx, host: &HostKey) -> Result<Option<LockedHost>, CommitFail> {
    let row = match lock_row(tx, host, None).await {
        Ok(Some(r)) => r,
        Ok(None) | Err(DbError::LockUnavailable) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let leases = lock_leases(tx, host).await?;
    let open = lock_open_migration(tx, host).await?;
    let decision = region::lock_decision(tx, host).await?;
    let last_attempt = region::lock_latest_attempt_at(tx, host).await?;
    lock_reservations(tx, host).await?;
    Ok(Some(LockedHost {
        row,
        leases,
        open,
        decision,
        last_attempt,
    }))
}

/// Whether the locked host may move from `source` to `target` now; the preferred region when it
/// may, the deferral reason when not. The request must still describe the host (its home, epoch,
/// and idle-capable control lease on the source's current incarnation); the host's preference
/// must be valid and inside the cohort; no open migration, no attempt within the cooldown; the
/// target in the preferred region, eligible, with headroom.
fn move_decision(
    req: &RehomeRequest,
    locked: &LockedHost,
    (source, target): (&CellFacts, &CellFacts),
    control: &Control,
    cohort_percent: i64,
    now: i64,
) -> Result<String, &'static str> {
    let row = &locked.row;
    let lease_id = format!("control:{}:{}", req.source_cell_id, req.source_generation);
    let source_ok = row.cell_id == req.source_cell_id
        && row.assignment_epoch == req.source_assignment_epoch
        && rules::rehome_eligible(source, now)
        && source.incarnation.as_deref() == Some(req.source_cell_incarnation.as_str())
        && locked.leases.iter().any(|l| {
            l.activity_id == lease_id
                && l.cell_id == req.source_cell_id
                && l.cell_incarnation.as_deref() == Some(req.source_cell_incarnation.as_str())
                && l.idle_regional_rehome
        });
    if !source_ok {
        return Err(INELIGIBLE);
    }
    let Some(d) = locked.decision.as_ref().filter(|d| {
        rules::valid_preference(
            d,
            row.assignment_epoch,
            &source.region,
            control.preference_max_age_ms,
            now,
        )
    }) else {
        return Err(INELIGIBLE);
    };
    if d.cohort_bucket >= cohort_percent.min(control.cohort_percent) {
        return Err("cohort-closed");
    }
    let preferred = d.preferred_region.clone().unwrap_or_default();
    if locked.open.is_some()
        || locked
            .last_attempt
            .is_some_and(|t| t > now - control.host_cooldown_ms)
        || target.region != preferred
        || !rules::rehome_eligible(target, now)
        || !target.headroom
    {
        return Err(INELIGIBLE);
    }
    Ok(preferred)
}

/// The request units the host's leases hold on the source: what the move carries to the target.
fn source_units(leases: &[crate::model::Lease], source_cell_id: &str) -> i64 {
    leases
        .iter()
        .filter(|l| l.cell_id == source_cell_id)
        .map(|l| l.request_units)
        .sum()
}

/// 3.5 the move's writes: the epoch's reservations released, the home set to the target at the
/// next epoch, the target's `control-pending` and `migration` leases, a connection reservation on
/// a capped target, the idle-rehome migration and the attempt record, the row's counters.
async fn write_move(
    tx: &mut Tx,
    req: &RehomeRequest,
    host: &HostKey,
    row: &crate::model::AssignmentRow,
    (target, src): (&CellFacts, i64),
    preferred: &str,
    now: i64,
) -> Result<(), CommitFail> {
    let e = row.assignment_epoch + 1;
    let lease_exp = now + MOVE_LEASE_MS;
    release_epoch_reservations(tx, host, row.assignment_epoch, now).await?;
    region::set_home(tx, host, &target.cell_id, e, now).await?;
    insert_lease(
        tx,
        host,
        &format!("control-pending:{e}"),
        LeaseKind::Control,
        &target.cell_id,
        1,
        lease_exp,
        now,
    )
    .await?;
    insert_lease(
        tx,
        host,
        &format!("migration:{e}"),
        LeaseKind::Migration,
        &target.cell_id,
        src,
        lease_exp,
        now,
    )
    .await?;
    if target.capped {
        reserve_connection(tx, host, e, &target.cell_id, now).await?;
    }
    region::insert_migration(
        tx,
        host,
        &NewMigration {
            kind: "idle-rehome",
            assignment_epoch: e,
            source_cell_id: &req.source_cell_id,
            source_cell_incarnation: Some(&req.source_cell_incarnation),
            target_cell_id: &target.cell_id,
            previous_epoch: row.assignment_epoch,
            source_request_units: src,
            arrival_deadline: now + rules::IDLE_ARRIVAL_MS,
            expires_at: lease_exp,
        },
        now,
    )
    .await?;
    region::insert_attempt(
        tx,
        &AttemptRecord {
            attempt_id: req.attempt_id.clone(),
            user_id: req.user_id.clone(),
            relay_host_id: req.relay_host_id.clone(),
            previous_epoch: row.assignment_epoch,
            assignment_epoch: e,
            source_cell_id: req.source_cell_id.clone(),
            source_cell_incarnation: req.source_cell_incarnation.clone(),
            source_generation: req.source_generation,
            target_cell_id: target.cell_id.clone(),
            created_at: now,
            aborted: false,
        },
        preferred,
        now,
    )
    .await?;
    refresh_row(tx, host, Some(now), now).await?;
    Ok(())
}
