//! Storage primitives of idle regional correction (ARCHITECTURE.md / docs/reference/http.md): region decisions, the
//! global rehome control row, rehome attempts, idle-rehome migration rows and the 24 h outcome
//! counts. Plain rows in and out; every rule that decides with them lives in `crate::rehome`.

use super::assignments::HostKey;
use super::{Db, DbError, Row, Tx};
use crate::params;

/// A stored `relay_region_decisions` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub generation: i64,
    pub assignment_epoch: i64,
    pub incumbent_region: String,
    pub policy_version: i64,
    pub cohort_bucket: i64,
    pub outcome: String,
    pub preferred_region: Option<String>,
    pub expires_at: i64,
    pub observed_at: Option<i64>,
}

const DECISION_COLUMNS: &str = "generation, assignment_epoch, incumbent_region, policy_version, \
     cohort_bucket, outcome, preferred_region, expires_at, observed_at";

fn decision_from(r: &Row) -> Decision {
    Decision {
        generation: r.i64(0),
        assignment_epoch: r.i64(1),
        incumbent_region: r.str(2),
        policy_version: r.i64(3),
        cohort_bucket: r.i64(4),
        outcome: r.str(5),
        preferred_region: r.opt_str(6),
        expires_at: r.i64(7),
        observed_at: r.opt_i64(8),
    }
}

/// A new window: the decision row upserted with `generation` + 1 (1 first) and every report field
/// cleared. Returns the new generation.
#[allow(clippy::too_many_arguments)]
pub async fn upsert_window(
    tx: &mut Tx,
    host: &HostKey,
    assignment_epoch: i64,
    incumbent_region: &str,
    policy_version: i64,
    cohort_bucket: i64,
    expires_at: i64,
    now: i64,
) -> Result<i64, DbError> {
    let old = tx
        .query_opt(
            "SELECT generation FROM relay_region_decisions WHERE user_id = $1 AND relay_host_id = $2 FOR UPDATE",
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    let generation = old.map_or(1, |r| r.i64(0) + 1);
    if generation == 1 {
        tx.execute(
            "INSERT INTO relay_region_decisions (user_id, relay_host_id, generation, assignment_epoch, \
             incumbent_region, policy_version, cohort_bucket, outcome, issued_at, expires_at, updated_at) \
             VALUES ($1, $2, 1, $3, $4, $5, $6, 'pending', $7, $8, $7)",
            params![
                &host.user_id,
                &host.relay_host_id,
                assignment_epoch,
                incumbent_region,
                policy_version,
                cohort_bucket,
                now,
                expires_at
            ],
        )
        .await?;
    } else {
        tx.execute(
            "UPDATE relay_region_decisions SET generation = $3, assignment_epoch = $4, incumbent_region = $5, \
             policy_version = $6, cohort_bucket = $7, outcome = 'pending', preferred_region = NULL, \
             measurements_json = NULL, inconclusive_reason = NULL, issued_at = $8, expires_at = $9, \
             observed_at = NULL, updated_at = $8 WHERE user_id = $1 AND relay_host_id = $2",
            params![
                &host.user_id,
                &host.relay_host_id,
                generation,
                assignment_epoch,
                incumbent_region,
                policy_version,
                cohort_bucket,
                now,
                expires_at
            ],
        )
        .await?;
    }
    Ok(generation)
}

/// The host's decision, locked (tier 2).
pub async fn lock_decision(tx: &mut Tx, host: &HostKey) -> Result<Option<Decision>, DbError> {
    let r = tx
        .query_opt(
            &format!(
                "SELECT {DECISION_COLUMNS} FROM relay_region_decisions WHERE user_id = $1 AND relay_host_id = $2 FOR UPDATE"
            ),
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(r.as_ref().map(decision_from))
}

/// The host's decision (plain read).
pub async fn read_decision(db: &Db, host: &HostKey) -> Result<Option<Decision>, DbError> {
    let r = db
        .query(
            &format!(
                "SELECT {DECISION_COLUMNS} FROM relay_region_decisions WHERE user_id = $1 AND relay_host_id = $2"
            ),
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(r.first().map(decision_from))
}

/// Stores the first accepted report.
pub async fn accept_report(
    tx: &mut Tx,
    host: &HostKey,
    outcome: &str,
    preferred_region: Option<&str>,
    measurements_json: Option<&str>,
    inconclusive_reason: Option<&str>,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_region_decisions SET outcome = $3, preferred_region = $4, measurements_json = $5, \
         inconclusive_reason = $6, observed_at = $7, updated_at = $7 WHERE user_id = $1 AND relay_host_id = $2",
        params![
            &host.user_id,
            &host.relay_host_id,
            outcome,
            preferred_region,
            measurements_json,
            inconclusive_reason,
            now
        ],
    )
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// The control row (tier 0)

/// The `relay_region_rehome_control` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub generation: i64,
    pub enabled: bool,
    pub not_before: i64,
    pub rate_per_minute: i64,
    pub cohort_percent: i64,
    pub host_cooldown_ms: i64,
    pub preference_max_age_ms: i64,
    pub next_dispatch_at: i64,
    pub paused_until: i64,
    pub consecutive_failures: i64,
    pub disabled_reason: Option<String>,
    pub updated_at: i64,
}

impl Default for Control {
    /// The lazily created row's defaults.
    fn default() -> Control {
        Control {
            generation: 0,
            enabled: false,
            not_before: 0,
            rate_per_minute: 10,
            cohort_percent: 0,
            host_cooldown_ms: 604_800_000,
            preference_max_age_ms: 86_400_000,
            next_dispatch_at: 0,
            paused_until: 0,
            consecutive_failures: 0,
            disabled_reason: None,
            updated_at: 0,
        }
    }
}

const CONTROL_COLUMNS: &str = "generation, enabled, not_before, rate_per_minute, cohort_percent, \
     host_cooldown_ms, preference_max_age_ms, next_dispatch_at, paused_until, consecutive_failures, \
     disabled_reason, updated_at";

fn control_from(r: &Row) -> Control {
    Control {
        generation: r.i64(0),
        enabled: r.bool(1),
        not_before: r.i64(2),
        rate_per_minute: r.i64(3),
        cohort_percent: r.i64(4),
        host_cooldown_ms: r.i64(5),
        preference_max_age_ms: r.i64(6),
        next_dispatch_at: r.i64(7),
        paused_until: r.i64(8),
        consecutive_failures: r.i64(9),
        disabled_reason: r.opt_str(10),
        updated_at: r.i64(11),
    }
}

/// Locks the control row (NOWAIT when `nowait`), creating it with the defaults first if missing.
/// A lock not granted is `DbError::LockUnavailable`.
pub async fn lock_control(tx: &mut Tx, nowait: bool) -> Result<Control, DbError> {
    let sql = format!(
        "SELECT {CONTROL_COLUMNS} FROM relay_region_rehome_control WHERE control_id = 'global' FOR UPDATE{}",
        if nowait { " NOWAIT" } else { "" }
    );
    if let Some(r) = tx.query_opt(&sql, &[]).await? {
        return Ok(control_from(&r));
    }
    tx.execute(
        "INSERT INTO relay_region_rehome_control (control_id, updated_at) VALUES ('global', 0) \
         ON CONFLICT (control_id) DO NOTHING",
        &[],
    )
    .await?;
    let r = tx
        .query_opt(&sql, &[])
        .await?
        .ok_or_else(|| DbError::Fatal("control row missing".into()))?;
    Ok(control_from(&r))
}

/// The control row (plain read); the defaults when it was never created.
pub async fn read_control(db: &Db) -> Result<Control, DbError> {
    let rows = db
        .query(
            &format!(
                "SELECT {CONTROL_COLUMNS} FROM relay_region_rehome_control WHERE control_id = 'global'"
            ),
            &[],
        )
        .await?;
    Ok(rows.first().map(control_from).unwrap_or_default())
}

/// Writes every field of the (locked) control row.
pub async fn write_control(tx: &mut Tx, c: &Control) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_region_rehome_control SET generation = $1, enabled = $2, not_before = $3, \
         rate_per_minute = $4, cohort_percent = $5, host_cooldown_ms = $6, preference_max_age_ms = $7, \
         next_dispatch_at = $8, paused_until = $9, consecutive_failures = $10, disabled_reason = $11, \
         updated_at = $12 WHERE control_id = 'global'",
        params![
            c.generation,
            c.enabled,
            c.not_before,
            c.rate_per_minute,
            c.cohort_percent,
            c.host_cooldown_ms,
            c.preference_max_age_ms,
            c.next_dispatch_at,
            c.paused_until,
            c.consecutive_failures,
            c.disabled_reason.as_deref(),
            c.updated_at
        ],
    )
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Attempts and idle-rehome migrations (tier 2)

/// The identity fields of a stored attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    pub attempt_id: String,
    pub user_id: String,
    pub relay_host_id: String,
    pub previous_epoch: i64,
    pub assignment_epoch: i64,
    pub source_cell_id: String,
    pub source_cell_incarnation: String,
    pub source_generation: i64,
    pub target_cell_id: String,
    pub created_at: i64,
    pub aborted: bool,
}

const ATTEMPT_COLUMNS: &str = "attempt_id, user_id, relay_host_id, previous_epoch, assignment_epoch, \
     source_cell_id, source_cell_incarnation, source_generation, target_cell_id, created_at, aborted_at";

fn attempt_from(r: &Row) -> AttemptRecord {
    AttemptRecord {
        attempt_id: r.str(0),
        user_id: r.str(1),
        relay_host_id: r.str(2),
        previous_epoch: r.i64(3),
        assignment_epoch: r.i64(4),
        source_cell_id: r.str(5),
        source_cell_incarnation: r.str(6),
        source_generation: r.i64(7),
        target_cell_id: r.str(8),
        created_at: r.i64(9),
        aborted: !r.is_null(10),
    }
}

/// The attempt with this id, locked.
pub async fn lock_attempt(tx: &mut Tx, attempt_id: &str) -> Result<Option<AttemptRecord>, DbError> {
    let r = tx
        .query_opt(
            &format!(
                "SELECT {ATTEMPT_COLUMNS} FROM relay_region_rehome_attempts WHERE attempt_id = $1 FOR UPDATE"
            ),
            params![attempt_id],
        )
        .await?;
    Ok(r.as_ref().map(attempt_from))
}

/// `created_at` of the host's latest attempt, locked inside a transaction.
pub async fn lock_latest_attempt_at(tx: &mut Tx, host: &HostKey) -> Result<Option<i64>, DbError> {
    let rows = tx
        .query(
            "SELECT created_at FROM relay_region_rehome_attempts WHERE user_id = $1 AND relay_host_id = $2 \
             ORDER BY created_at DESC FOR UPDATE",
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(rows.first().map(|r| r.i64(0)))
}

/// `created_at` of the host's latest attempt (plain read).
pub async fn latest_attempt_at(db: &Db, host: &HostKey) -> Result<Option<i64>, DbError> {
    let rows = db
        .query(
            "SELECT MAX(created_at) FROM relay_region_rehome_attempts WHERE user_id = $1 AND relay_host_id = $2",
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(rows.first().and_then(|r| r.opt_i64(0)))
}

/// Inserts a committed attempt.
pub async fn insert_attempt(
    tx: &mut Tx,
    a: &AttemptRecord,
    preferred_region: &str,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO relay_region_rehome_attempts (attempt_id, user_id, relay_host_id, previous_epoch, \
         assignment_epoch, source_cell_id, source_cell_incarnation, source_generation, target_cell_id, \
         preferred_region, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)",
        params![
            &a.attempt_id,
            &a.user_id,
            &a.relay_host_id,
            a.previous_epoch,
            a.assignment_epoch,
            &a.source_cell_id,
            &a.source_cell_incarnation,
            a.source_generation,
            &a.target_cell_id,
            preferred_region,
            now
        ],
    )
    .await?;
    Ok(())
}

/// Completes the host's open attempt at `epoch` (mirrors a completed idle-rehome migration).
pub async fn complete_attempt(
    tx: &mut Tx,
    host: &HostKey,
    epoch: i64,
    now: i64,
) -> Result<u64, DbError> {
    tx.execute(
        "UPDATE relay_region_rehome_attempts SET completed_at = $4, updated_at = $4 WHERE user_id = $1 \
         AND relay_host_id = $2 AND assignment_epoch = $3 AND completed_at IS NULL AND aborted_at IS NULL",
        params![&host.user_id, &host.relay_host_id, epoch, now],
    )
    .await
}

/// Aborts the host's open attempt at `epoch` with `reason`; the number of rows aborted.
pub async fn abort_attempt(
    tx: &mut Tx,
    host: &HostKey,
    epoch: i64,
    reason: &str,
    now: i64,
) -> Result<u64, DbError> {
    tx.execute(
        "UPDATE relay_region_rehome_attempts SET aborted_at = $4, abort_reason = $5, updated_at = $4 \
         WHERE user_id = $1 AND relay_host_id = $2 AND assignment_epoch = $3 AND completed_at IS NULL AND aborted_at IS NULL",
        params![&host.user_id, &host.relay_host_id, epoch, now, reason],
    )
    .await
}

/// The reason of the latest attempt aborted after `since`, if any (the control is disabled with
/// it in a transaction of its own).
pub async fn latest_abort_after(db: &Db, since: i64) -> Result<Option<String>, DbError> {
    let rows = db
        .query(
            "SELECT abort_reason FROM relay_region_rehome_attempts WHERE aborted_at > $1 \
             ORDER BY aborted_at DESC LIMIT 1",
            params![since],
        )
        .await?;
    Ok(rows.first().and_then(|r| r.opt_str(0)))
}

/// Open idle-rehome migrations, cluster-wide.
pub async fn count_open_idle_migrations(tx: &mut Tx) -> Result<i64, DbError> {
    let r = tx
        .query_opt(
            "SELECT COUNT(*) FROM relay_assignment_migrations WHERE kind = 'idle-rehome' \
             AND completed_at IS NULL AND aborted_at IS NULL",
            &[],
        )
        .await?;
    Ok(r.map_or(0, |r| r.i64(0)))
}

/// Open idle-rehome migrations (plain read).
pub async fn open_idle_migrations(db: &Db) -> Result<i64, DbError> {
    let r = db
        .query(
            "SELECT COUNT(*) FROM relay_assignment_migrations WHERE kind = 'idle-rehome' \
             AND completed_at IS NULL AND aborted_at IS NULL",
            &[],
        )
        .await?;
    Ok(r.first().map_or(0, |r| r.i64(0)))
}

/// A migration row to insert (docs/operations.md writes).
#[derive(Debug, Clone)]
pub struct NewMigration<'a> {
    pub kind: &'a str,
    pub assignment_epoch: i64,
    pub source_cell_id: &'a str,
    pub source_cell_incarnation: Option<&'a str>,
    pub target_cell_id: &'a str,
    pub previous_epoch: i64,
    pub source_request_units: i64,
    pub arrival_deadline: i64,
    pub expires_at: i64,
}

pub async fn insert_migration(
    tx: &mut Tx,
    host: &HostKey,
    m: &NewMigration<'_>,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO relay_assignment_migrations (user_id, relay_host_id, assignment_epoch, kind, source_cell_id, \
         source_cell_incarnation, target_cell_id, previous_epoch, source_request_units, target_reserved_units, \
         arrival_deadline, expires_at, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)",
        params![
            &host.user_id,
            &host.relay_host_id,
            m.assignment_epoch,
            m.kind,
            m.source_cell_id,
            m.source_cell_incarnation,
            m.target_cell_id,
            m.previous_epoch,
            m.source_request_units,
            m.source_request_units + 1,
            m.arrival_deadline,
            m.expires_at,
            now
        ],
    )
    .await?;
    Ok(())
}

/// Moves the (locked) assignment row to `cell_id` at `epoch`.
pub async fn set_home(
    tx: &mut Tx,
    host: &HostKey,
    cell_id: &str,
    epoch: i64,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignments SET cell_id = $3, assignment_epoch = $4, last_activity_at = $5, updated_at = $5 \
         WHERE user_id = $1 AND relay_host_id = $2",
        params![&host.user_id, &host.relay_host_id, cell_id, epoch, now],
    )
    .await?;
    Ok(())
}

/// Why a conditional target reserve did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveRefusal {
    /// The target row is locked elsewhere (NOWAIT).
    RowBusy,
    /// No longer `general`, or no room for the units.
    NotAdmitting,
}

/// Locks the target cell row NOWAIT and charges `units` if it is still `general` with room.
pub async fn reserve_on_general_target(
    tx: &mut Tx,
    cell_id: &str,
    units: i64,
    now: i64,
) -> Result<Result<(), ReserveRefusal>, DbError> {
    match tx
        .query_opt(
            "SELECT cell_id FROM relay_cells WHERE cell_id = $1 FOR UPDATE NOWAIT",
            params![cell_id],
        )
        .await
    {
        Ok(Some(_)) => {}
        Ok(None) => return Ok(Err(ReserveRefusal::NotAdmitting)),
        Err(DbError::LockUnavailable) => return Ok(Err(ReserveRefusal::RowBusy)),
        Err(e) => return Err(e),
    }
    let n = tx
        .execute(
            "UPDATE relay_cells SET reserved_requests = reserved_requests + $2, updated_at = $3 \
             WHERE cell_id = $1 AND admission_state = 'general' AND reserved_requests + $2 <= capacity_requests",
            params![cell_id, units, now],
        )
        .await?;
    Ok(if n == 1 {
        Ok(())
    } else {
        Err(ReserveRefusal::NotAdmitting)
    })
}

// ---------------------------------------------------------------------------------------------------
// Candidate pages and outcomes (plain reads)

/// One host of a candidate page: its key, home, epoch and decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageHost {
    pub host: HostKey,
    pub cell_id: String,
    pub assignment_epoch: i64,
    pub decision: Decision,
}

const PAGE_COLUMNS: &str = "SELECT a.user_id, a.relay_host_id, a.cell_id, a.assignment_epoch, d.generation, \
     d.assignment_epoch, d.incumbent_region, d.policy_version, d.cohort_bucket, d.outcome, d.preferred_region, \
     d.expires_at, d.observed_at FROM relay_region_decisions d JOIN relay_assignments a \
     ON a.user_id = d.user_id AND a.relay_host_id = d.relay_host_id \
     WHERE d.outcome = 'conclusive' AND d.preferred_region IS NOT NULL \
     AND (a.user_id > $1 OR (a.user_id = $1 AND a.relay_host_id > $2))";

/// Up to `limit` hosts with a conclusive decision preferring another region, in key order after
/// `after` (exclusive; `None` = from the first key) and up to `through` (inclusive; `None` = to
/// the last key). The worker's wrapping page is two of these reads: after its cursor, then from
/// the first key through the cursor.
pub async fn candidate_page(
    db: &Db,
    after: Option<&HostKey>,
    through: Option<&HostKey>,
    limit: i64,
) -> Result<Vec<PageHost>, DbError> {
    let (u, h) = after
        .map(|k| (k.user_id.clone(), k.relay_host_id.clone()))
        .unwrap_or_default();
    let rows = match through {
        None => {
            db.query(
                &format!("{PAGE_COLUMNS} ORDER BY a.user_id, a.relay_host_id LIMIT $3"),
                params![u, h, limit],
            )
            .await?
        }
        Some(t) => {
            db.query(
                &format!(
                    "{PAGE_COLUMNS} AND (a.user_id < $4 OR (a.user_id = $4 AND a.relay_host_id <= $5)) \
                     ORDER BY a.user_id, a.relay_host_id LIMIT $3"
                ),
                params![u, h, limit, &t.user_id, &t.relay_host_id],
            )
            .await?
        }
    };
    Ok(rows
        .iter()
        .map(|r| PageHost {
            host: HostKey {
                user_id: r.str(0),
                relay_host_id: r.str(1),
            },
            cell_id: r.str(2),
            assignment_epoch: r.i64(3),
            decision: Decision {
                generation: r.i64(4),
                assignment_epoch: r.i64(5),
                incumbent_region: r.str(6),
                policy_version: r.i64(7),
                cohort_bucket: r.i64(8),
                outcome: r.str(9),
                preferred_region: r.opt_str(10),
                expires_at: r.i64(11),
                observed_at: r.opt_i64(12),
            },
        })
        .collect())
}

/// The host's leases (plain read).
pub async fn read_leases(
    db: &Db,
    host: &HostKey,
) -> Result<Vec<super::assignments::Lease>, DbError> {
    let rows = db
        .query(
            &format!(
                "SELECT {} FROM relay_assignment_activity_leases WHERE user_id = $1 AND relay_host_id = $2 ORDER BY activity_id",
                super::assignments::LEASE_COLUMNS
            ),
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(rows.iter().map(super::assignments::lease_from).collect())
}

/// True when the host has an open migration (plain read).
pub async fn has_open_migration(db: &Db, host: &HostKey) -> Result<bool, DbError> {
    let rows = db
        .query(
            "SELECT 1 FROM relay_assignment_migrations WHERE user_id = $1 AND relay_host_id = $2 \
             AND completed_at IS NULL AND aborted_at IS NULL",
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(!rows.is_empty())
}

/// Trailing-window counts of decisions, attempts and idle-rehome migrations (never identities).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    pub issued: i64,
    pub conclusive: i64,
    pub inconclusive: i64,
    pub prefer_other: i64,
    pub committed: i64,
    pub completed: i64,
    pub aborted: Vec<(String, i64)>,
    /// (source, target, state, count), state `open` | `completed` | `aborted`.
    pub migrations: Vec<(String, String, String, i64)>,
}

pub async fn outcome_counts(db: &Db, since: i64) -> Result<OutcomeCounts, DbError> {
    let d = db
        .query(
            "SELECT \
             COALESCE(SUM(CASE WHEN issued_at >= $1 THEN 1 ELSE 0 END), 0), \
             COALESCE(SUM(CASE WHEN outcome = 'conclusive' AND observed_at >= $1 THEN 1 ELSE 0 END), 0), \
             COALESCE(SUM(CASE WHEN outcome = 'inconclusive' AND observed_at >= $1 THEN 1 ELSE 0 END), 0), \
             COALESCE(SUM(CASE WHEN outcome = 'conclusive' AND observed_at >= $1 AND preferred_region IS NOT NULL \
             AND preferred_region <> incumbent_region THEN 1 ELSE 0 END), 0) FROM relay_region_decisions",
            params![since],
        )
        .await?;
    let a = db
        .query(
            "SELECT COALESCE(SUM(CASE WHEN created_at >= $1 THEN 1 ELSE 0 END), 0), \
             COALESCE(SUM(CASE WHEN completed_at >= $1 THEN 1 ELSE 0 END), 0) FROM relay_region_rehome_attempts",
            params![since],
        )
        .await?;
    let ab = db
        .query(
            "SELECT abort_reason, COUNT(*) FROM relay_region_rehome_attempts WHERE aborted_at >= $1 \
             GROUP BY abort_reason ORDER BY abort_reason",
            params![since],
        )
        .await?;
    let m = db
        .query(
            "SELECT source_cell_id, target_cell_id, CASE WHEN completed_at IS NOT NULL THEN 'completed' \
             WHEN aborted_at IS NOT NULL THEN 'aborted' ELSE 'open' END AS st, COUNT(*) \
             FROM relay_assignment_migrations WHERE kind = 'idle-rehome' AND created_at >= $1 \
             GROUP BY source_cell_id, target_cell_id, st ORDER BY source_cell_id, target_cell_id, st",
            params![since],
        )
        .await?;
    let num = |rows: &[Row], i: usize| rows.first().map_or(0, |r| r.i64(i));
    Ok(OutcomeCounts {
        issued: num(&d, 0),
        conclusive: num(&d, 1),
        inconclusive: num(&d, 2),
        prefer_other: num(&d, 3),
        committed: num(&a, 0),
        completed: num(&a, 1),
        aborted: ab
            .iter()
            .map(|r| (r.opt_str(0).unwrap_or_default(), r.i64(1)))
            .collect(),
        migrations: m
            .iter()
            .map(|r| (r.str(0), r.str(1), r.str(2), r.i64(3)))
            .collect(),
    })
}

// ---------------------------------------------------------------------------------------------------
// The worker lease (single-flight across directors)

/// Takes or renews the worker lease for `holder` until `expires_at` when it is free, expired or
/// already `holder`'s; one statement, so two directors cannot both win. True when `holder` holds it.
pub async fn take_worker_lease(
    db: &Db,
    holder: &str,
    expires_at: i64,
    now: i64,
) -> Result<bool, DbError> {
    let n = db
        .execute(
            "INSERT INTO relay_region_rehome_worker_lease (lease_id, holder, expires_at, updated_at) \
             VALUES ('global', $1, $2, $3) ON CONFLICT (lease_id) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at, updated_at = excluded.updated_at \
             WHERE relay_region_rehome_worker_lease.holder = excluded.holder \
             OR relay_region_rehome_worker_lease.expires_at <= $3",
            params![holder, expires_at, now],
        )
        .await?;
    Ok(n == 1)
}

/// Gives the lease up if `holder` has it (the next director need not wait for its expiry).
pub async fn release_worker_lease(db: &Db, holder: &str, now: i64) -> Result<(), DbError> {
    db.execute(
        "UPDATE relay_region_rehome_worker_lease SET expires_at = $2, updated_at = $2 \
         WHERE lease_id = 'global' AND holder = $1",
        params![holder, now],
    )
    .await?;
    Ok(())
}
