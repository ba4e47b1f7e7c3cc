//! The transactions of idle regional correction: measurement windows and reports (§8.1), the
//! control row (§8.2, §3.8), `commitIdleRegionalRehome` (§8.4), `reconcileIdleRegionalRehome`
//! (§8.5), disabling after aborts and the outcome counts (§8.6).
//!
//! Locks follow director.md §2: control row (0), assignment row (1), the host's leases, migration,
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

/// Lifetime of the target's `control-pending` and `migration` leases of a move (director.md §7.1).
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

/// The worker's page of §8.3 (plain reads): up to `limit` distinct hosts with a conclusive
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
// §8.1 windows and reports

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
// §8.2 control

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

/// After attempts were aborted (§8.6): disables the control with the latest abort reason when an
/// attempt was aborted after the control row last changed. Runs in its own transaction after the
/// abort committed, because the control row precedes assignment rows in the lock order.
pub async fn disable_after_aborts(db: &Db, now: i64) -> Result<Option<Event>, DbError> {
    let c = region::read_control(db).await?;
    match region::latest_abort_after(db, c.updated_at).await? {
        Some(reason) => disable(db, &reason, now).await,
        None => Ok(None),
    }
}

/// A dispatch answer's effect on the failure budget (§8.3): `failed` counts one failure (three
/// in a row pause 5 min and disable `failure-budget`), otherwise the count resets after a commit.
pub async fn record_dispatch(db: &Db, failed: bool, now: i64) -> Result<Option<Event>, DbError> {
    crate::transaction!(db, "regional-rehome", |tx| {
        let mut c = region::lock_control(tx, false).await?;
        if !failed {
            if c.consecutive_failures != 0 {
                c.consecutive_failures = 0;
                region::write_control(tx, &c).await?;
            }
            return Ok(None);
        }
        c.consecutive_failures += 1;
        if c.consecutive_failures >= rules::FAILURE_BUDGET {
            c.paused_until = now + rules::FAILURE_PAUSE_MS;
            let n = rules::disabled(&c, "failure-budget", now);
            region::write_control(tx, &n).await?;
            return Ok(Some((
                "orca_relay_regional_rehome_failure_budget_disabled",
                json!({"consecutiveFailures": n.consecutive_failures, "pausedUntil": n.paused_until}),
            )));
        }
        region::write_control(tx, &c).await?;
        Ok(None)
    })
}

/// The Outcomes object (§8.6) over the trailing 24 h.
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
// §8.5 reconcile

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
// §8.4 commit

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

async fn commit_tx(
    tx: &mut Tx,
    req: &RehomeRequest,
    cohort_percent: i64,
    now: i64,
) -> Result<(Committed, Vec<Event>), CommitFail> {
    let deferred = |r: &'static str| Ok((Committed::Deferred(r), vec![]));
    // 3.1 control row NOWAIT. Busy means another commit is writing its dispatch slot right now:
    // the budget is, for this instant, taken.
    let mut control = match region::lock_control(tx, true).await {
        Ok(c) => c,
        Err(DbError::LockUnavailable) => return deferred("budget-closed"),
        Err(e) => return Err(e.into()),
    };
    if let Some(gate) = rules::control_gate(&control, now) {
        return deferred(gate);
    }
    // 3.2 concurrency.
    if region::count_open_idle_migrations(tx).await? >= rules::MAX_OPEN_IDLE_MIGRATIONS {
        return deferred("concurrency-limit");
    }
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
    let row = match lock_row(tx, &host, None).await {
        Ok(Some(r)) => r,
        Ok(None) | Err(DbError::LockUnavailable) => return deferred(INELIGIBLE),
        Err(e) => return Err(e.into()),
    };
    let leases = lock_leases(tx, &host).await?;
    let open = lock_open_migration(tx, &host).await?;
    let decision = region::lock_decision(tx, &host).await?;
    let last_attempt = region::lock_latest_attempt_at(tx, &host).await?;
    lock_reservations(tx, &host).await?;
    let source = cells.iter().find(|c| c.cell_id == req.source_cell_id);
    let target = cells.iter().find(|c| c.cell_id == req.target_cell_id);
    let (Some(source), Some(target)) = (source, target) else {
        return deferred(INELIGIBLE);
    };
    let lease_id = format!("control:{}:{}", req.source_cell_id, req.source_generation);
    let source_ok = row.cell_id == req.source_cell_id
        && row.assignment_epoch == req.source_assignment_epoch
        && rules::rehome_eligible(source, now)
        && source.incarnation.as_deref() == Some(req.source_cell_incarnation.as_str())
        && leases.iter().any(|l| {
            l.activity_id == lease_id
                && l.cell_id == req.source_cell_id
                && l.cell_incarnation.as_deref() == Some(req.source_cell_incarnation.as_str())
                && l.idle_regional_rehome
        });
    if !source_ok {
        return deferred(INELIGIBLE);
    }
    let Some(d) = decision.filter(|d| {
        rules::valid_preference(
            d,
            row.assignment_epoch,
            &source.region,
            control.preference_max_age_ms,
            now,
        )
    }) else {
        return deferred(INELIGIBLE);
    };
    if d.cohort_bucket >= cohort_percent.min(control.cohort_percent) {
        return deferred("cohort-closed");
    }
    let preferred = d.preferred_region.clone().unwrap_or_default();
    if open.is_some()
        || last_attempt.is_some_and(|t| t > now - control.host_cooldown_ms)
        || target.region != preferred
        || !rules::rehome_eligible(target, now)
        || !target.headroom
    {
        return deferred(INELIGIBLE);
    }
    // 3.5 the writes of §7.1 (kind idle-rehome, arrival 5 min) and the attempt.
    let src: i64 = leases
        .iter()
        .filter(|l| l.cell_id == req.source_cell_id)
        .map(|l| l.request_units)
        .sum();
    let e = row.assignment_epoch + 1;
    let lease_exp = now + MOVE_LEASE_MS;
    release_epoch_reservations(tx, &host, row.assignment_epoch, now).await?;
    region::set_home(tx, &host, &target.cell_id, e, now).await?;
    insert_lease(
        tx,
        &host,
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
        &host,
        &format!("migration:{e}"),
        LeaseKind::Migration,
        &target.cell_id,
        src,
        lease_exp,
        now,
    )
    .await?;
    if target.capped {
        reserve_connection(tx, &host, e, &target.cell_id, now).await?;
    }
    region::insert_migration(
        tx,
        &host,
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
        &preferred,
        now,
    )
    .await?;
    refresh_row(tx, &host, Some(now), now).await?;
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
