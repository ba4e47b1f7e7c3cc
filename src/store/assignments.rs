//! Assignment and activity-lease operations called by cells (ARCHITECTURE.md, docs/reference/websocket.md).
//!
//! These are the durable half of the "at most one cell serves a host" invariant: the cell checks its
//! authority here before activating a control and on every renewal.
//!
//! The row primitives here (lock, read, charge, insert, refresh) are what the director's services
//! compose into their own transactions; the cell-driven operations at the end are single
//! transactions of their own.

use super::{Db, DbError, Tx};
use crate::contract::limits;
pub use crate::model::{
    parse_control_id, parse_decimal, ActivityId, ActivityKind, AssignmentRow, AssignmentView,
    HostKey, HostView, Lease, LeaseCounts, LeaseKind, OpenMigration,
};
use crate::{params, transaction};

/// Refusals of the activity operations; `code()` is the spec's error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivityError {
    WrongAssignment,
    AssignmentNotFound,
    ActivityCellNotAuthoritative,
    RelayCapacityExhausted,
    InvalidActivityId,
    InvalidActivityKind,
    InvalidActivityExpiry,
    Db(DbError),
}

impl ActivityError {
    pub fn code(&self) -> &'static str {
        match self {
            ActivityError::WrongAssignment => "wrong_assignment",
            ActivityError::AssignmentNotFound => "assignment_not_found",
            ActivityError::ActivityCellNotAuthoritative => "activity_cell_not_authoritative",
            ActivityError::RelayCapacityExhausted => "relay_capacity_exhausted",
            ActivityError::InvalidActivityId => "invalid_activity_id",
            ActivityError::InvalidActivityKind => "invalid_activity_kind",
            ActivityError::InvalidActivityExpiry => "invalid_activity_expiry",
            ActivityError::Db(_) => "database_error",
        }
    }
}

impl From<DbError> for ActivityError {
    fn from(e: DbError) -> Self {
        ActivityError::Db(e)
    }
}

impl super::RetryClass for ActivityError {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            ActivityError::Db(e) => e.retry_code(),
            _ => None,
        }
    }
    fn db_error(&self) -> Option<&crate::store::DbError> {
        match self {
            ActivityError::Db(e) => Some(e),
            _ => None,
        }
    }
}

/// `activateControl` input (docs/reference/websocket.md, ARCHITECTURE.md).
#[derive(Debug, Clone)]
pub struct ActivateControl {
    pub cell_id: String,
    pub assignment_epoch: i64,
    pub generation: i64,
    pub connection_inclusion_watermark: Option<i64>,
    pub idle_regional_rehome: bool,
    pub cell_incarnation: String,
}

/// One row of a `renewControlActivities` batch.
#[derive(Debug, Clone)]
pub struct RenewalRow {
    pub host: HostKey,
    pub activity_id: String,
    pub expires_at: i64,
}

/// Per-row outcome of a renewal batch (ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalOutcome {
    Renewed,
    InvalidActivityId,
    InvalidActivityExpiry,
    AssignmentLockUnavailable,
    AssignmentNotFound,
    ActivityCellNotAuthoritative,
    ControlActivityNotFound,
    ControlActivityMoved,
    DatabaseError,
}

// ---------------------------------------------------------------------------------------------------
// Shared row helpers (also used by placement, sweeps and migrations).

/// Lease TTL of a grant's `control-pending:<epoch>` and of a default activity (ARCHITECTURE.md).
pub const LEASE_TTL_MS: i64 = limits::DEFAULT_ACTIVITY_LEASE_MS;
/// Wait for an assignment row in cell-driven operations (ARCHITECTURE.md).
pub const CELL_DRIVEN_WAIT_MS: u64 = 1_000;

/// Columns of [`AssignmentRow`], in order.
pub const ROW_COLUMNS: &str = "cell_id, assignment_epoch, lease_expires_at, last_activity_at, \
     reserved_controls, reserved_splices, reserved_invites, pending_installs, pending_confirmations, \
     migration_leases, preferred_region";

/// An [`AssignmentRow`] read with [`ROW_COLUMNS`].
pub fn row_from(r: &super::Row) -> AssignmentRow {
    AssignmentRow {
        cell_id: r.str(0),
        assignment_epoch: r.i64(1),
        lease_expires_at: r.i64(2),
        last_activity_at: r.i64(3),
        counters: LeaseCounts {
            controls: r.i64(4),
            splices: r.i64(5),
            invites: r.i64(6),
            installs: r.i64(7),
            confirmations: r.i64(8),
            migrations: r.i64(9),
        },
        preferred_region: r.opt_str(10),
    }
}

/// Columns of [`Lease`], in order.
pub const LEASE_COLUMNS: &str = "activity_id, activity_kind, cell_id, request_units, expires_at, \
     control_generation, cell_incarnation, idle_regional_rehome, renewed_at";

/// A [`Lease`] read with [`LEASE_COLUMNS`].
pub fn lease_from(r: &super::Row) -> Lease {
    Lease {
        activity_id: r.str(0),
        kind: LeaseKind::from_stored(&r.str(1)),
        cell_id: r.str(2),
        request_units: r.i64(3),
        expires_at: r.i64(4),
        control_generation: r.opt_i64(5),
        cell_incarnation: r.opt_str(6),
        idle_regional_rehome: r.bool(7),
        renewed_at: r.opt_i64(8),
    }
}

/// Locks the host's assignment row: `NOWAIT` when `wait_ms` is `None`, else a bounded wait.
/// A lock that is not granted is `DbError::LockUnavailable`.
pub async fn lock_row(
    tx: &mut Tx,
    host: &HostKey,
    wait_ms: Option<u64>,
) -> Result<Option<AssignmentRow>, DbError> {
    let sql = match wait_ms {
        None => format!(
            "SELECT {ROW_COLUMNS} FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2 FOR UPDATE NOWAIT"
        ),
        Some(ms) => {
            tx.set_lock_timeout(ms).await?;
            format!(
                "SELECT {ROW_COLUMNS} FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2 FOR UPDATE"
            )
        }
    };
    let row = tx
        .query_opt(&sql, params![&host.user_id, &host.relay_host_id])
        .await?;
    Ok(row.as_ref().map(row_from))
}

/// Plain read of the host's row.
pub async fn read_row(db: &Db, host: &HostKey) -> Result<Option<AssignmentRow>, DbError> {
    let rows = db
        .query(
            &format!(
                "SELECT {ROW_COLUMNS} FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2"
            ),
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(rows.first().map(row_from))
}

/// The host's leases, locked (tier 2).
pub async fn lock_leases(tx: &mut Tx, host: &HostKey) -> Result<Vec<Lease>, DbError> {
    let rows = tx
        .query(
            &format!(
                "SELECT {LEASE_COLUMNS} FROM relay_assignment_activity_leases \
                 WHERE user_id = $1 AND relay_host_id = $2 ORDER BY activity_id FOR UPDATE"
            ),
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(rows.iter().map(lease_from).collect())
}

/// The host's open migration (tier 2, locked).
pub async fn lock_open_migration(
    tx: &mut Tx,
    host: &HostKey,
) -> Result<Option<OpenMigration>, DbError> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT {MIGRATION_COLUMNS} FROM relay_assignment_migrations \
                 WHERE user_id = $1 AND relay_host_id = $2 AND completed_at IS NULL AND aborted_at IS NULL \
                 ORDER BY assignment_epoch DESC FOR UPDATE"
            ),
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(row.as_ref().map(migration_from))
}

/// Locks the host's row (`NOWAIT` when `wait_ms` is `None`), then its leases, open migration and
/// reservations, in the order of ARCHITECTURE.md; `None` when the host has no row.
pub async fn lock_host(
    tx: &mut Tx,
    host: &HostKey,
    wait_ms: Option<u64>,
) -> Result<Option<HostView>, DbError> {
    let row = match lock_row(tx, host, wait_ms).await? {
        Some(r) => r,
        None => return Ok(None),
    };
    let leases = lock_leases(tx, host).await?;
    let open_migration = lock_open_migration(tx, host).await?;
    lock_reservations(tx, host).await?;
    Ok(Some(HostView {
        row,
        leases,
        open_migration,
    }))
}

/// Open-migration columns of [`lock_open_migration`], in order.
pub(crate) const MIGRATION_COLUMNS: &str =
    "assignment_epoch, kind, source_cell_id, target_cell_id, \
     previous_epoch, target_registered_at, created_at";

fn migration_from(r: &super::Row) -> OpenMigration {
    OpenMigration {
        assignment_epoch: r.i64(0),
        kind: r.str(1),
        source_cell_id: r.str(2),
        target_cell_id: r.str(3),
        previous_epoch: r.i64(4),
        target_registered_at: r.opt_i64(5),
        created_at: r.i64(6),
    }
}

/// What the sticky grant reads under its locks: the host's rows and a plain read of its home.
pub type StickyRead = (HostView, Option<super::cells::CellView>);

const ROW_WIDTH: usize = 11;

/// The one statement of [`lock_sticky`]. Its CTEs lock, in the order of ARCHITECTURE.md, the
/// assignment row (`NOWAIT`), then the leases and open migrations (tier 2) and the live
/// reservations (tier 3), each only once the row is held (`EXISTS` on the row's CTE is a one-time
/// filter evaluated first); the home cell row is read plainly (no tier-4 lock before branching).
/// It answers one row: the assignment row, the joined home, the leases and the open migrations
/// each as one JSON array of arrays (columns in [`LEASE_COLUMNS`] / [`MIGRATION_COLUMNS`] order,
/// NULL or `[]` when there are none) and the count of locked reservations. One narrow row instead
/// of a four-part `UNION ALL` of wide rows: the executor's start-up of the wide union was the
/// largest part of the statement's server CPU (issue 12).
fn sticky_sql(kind: super::DbKind) -> &'static str {
    use std::sync::OnceLock;
    static PG: OnceLock<String> = OnceLock::new();
    static LITE: OnceLock<String> = OnceLock::new();
    let (cell, build) = match kind {
        super::DbKind::Postgres => (&PG, ("json_agg", "json_build_array")),
        super::DbKind::Sqlite => (&LITE, ("json_group_array", "json_array")),
    };
    cell.get_or_init(|| {
        use super::cells::{joined_columns, JOINED_FROM};
        let (agg, array) = build;
        let pre = |cols: &str, p: &str| {
            cols.split(", ")
                .map(|c| format!("{p}.{}", c.trim()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let host = "user_id = $1 AND relay_host_id = $2";
        let held = "EXISTS (SELECT 1 FROM sticky_row)";
        format!(
            "WITH sticky_row AS (SELECT {ROW_COLUMNS} FROM relay_assignments WHERE {host} FOR UPDATE NOWAIT), \
             sticky_leases AS (SELECT {LEASE_COLUMNS} FROM relay_assignment_activity_leases \
               WHERE {host} AND {held} ORDER BY activity_id FOR UPDATE), \
             sticky_migrations AS (SELECT {MIGRATION_COLUMNS} FROM relay_assignment_migrations \
               WHERE {host} AND completed_at IS NULL AND aborted_at IS NULL AND {held} \
               ORDER BY assignment_epoch DESC FOR UPDATE), \
             sticky_reservations AS (SELECT reservation_id FROM relay_connection_reservations \
               WHERE {host} AND state <> 'released' AND {held} FOR UPDATE) \
             SELECT {row}, {cell}, \
               (SELECT CAST({agg}({array}({lease})) AS TEXT) FROM sticky_leases l), \
               (SELECT CAST({agg}({array}({mig})) AS TEXT) FROM sticky_migrations m), \
               (SELECT COUNT(*) FROM sticky_reservations) \
             FROM sticky_row s LEFT JOIN relay_cells c ON c.cell_id = s.cell_id {JOINED_FROM}",
            row = pre(ROW_COLUMNS, "s"),
            cell = joined_columns(),
            lease = pre(LEASE_COLUMNS, "l"),
            mig = pre(MIGRATION_COLUMNS, "m"),
        )
    })
}

/// The rows of one JSON array of arrays from [`sticky_sql`] (NULL: none), as store rows.
fn json_rows(text: Option<String>) -> Result<Vec<super::Row>, DbError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let rows: Vec<Vec<serde_json::Value>> =
        serde_json::from_str(&text).map_err(|e| DbError::Fatal(format!("sticky read: {e}")))?;
    rows.into_iter()
        .map(|cols| {
            cols.into_iter()
                .map(|v| match v {
                    serde_json::Value::Null => Ok(super::Value::Null),
                    serde_json::Value::Bool(b) => Ok(super::Value::Bool(b)),
                    serde_json::Value::String(s) => Ok(super::Value::Text(s)),
                    serde_json::Value::Number(n) => n
                        .as_i64()
                        .map(super::Value::Int)
                        .ok_or_else(|| DbError::Fatal(format!("sticky read: number {n}"))),
                    other => Err(DbError::Fatal(format!("sticky read: value {other}"))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(super::Row)
        })
        .collect()
}

/// The sticky grant's read (ARCHITECTURE.md A.2–A.3 and the home of A.4) in one statement and
/// one round trip: locks the host's row `NOWAIT` (busy → `DbError::LockUnavailable`), then its
/// leases, open migrations and reservations, and reads the home with runtime, fence and
/// outstanding reservations. `None` when the host has no row.
pub async fn lock_sticky(tx: &mut Tx, host: &HostKey) -> Result<Option<StickyRead>, DbError> {
    let sql = sticky_sql(tx.kind());
    let rows = tx
        .query(sql, params![&host.user_id, &host.relay_host_id])
        .await?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    sticky_read_at(r, 0).map(Some)
}

/// One host's sticky read from a result row whose assignment row starts at column `row_at`,
/// followed by the joined home cell and the leases' and open migrations' JSON aggregates
/// ([`lock_sticky`] reads one host, the sticky batch many).
pub(super) fn sticky_read_at(r: &super::Row, row_at: usize) -> Result<StickyRead, DbError> {
    use super::cells::JOINED_WIDTH;
    let part = |from: usize, n: usize| super::Row(r.0[from..from + n].to_vec());
    let cell_at = row_at + ROW_WIDTH;
    let json_at = cell_at + JOINED_WIDTH;
    let home =
        (!r.is_null(cell_at)).then(|| super::cells::joined_from_row(&part(cell_at, JOINED_WIDTH)));
    let row = row_from(&part(row_at, ROW_WIDTH));
    let mut leases: Vec<Lease> = json_rows(r.opt_str(json_at))?
        .iter()
        .map(lease_from)
        .collect();
    let mut migrations: Vec<OpenMigration> = json_rows(r.opt_str(json_at + 1))?
        .iter()
        .map(migration_from)
        .collect();
    // The aggregate keeps no promised order: restore each part's own.
    leases.sort_by(|a, b| a.activity_id.cmp(&b.activity_id));
    migrations.sort_by_key(|m| std::cmp::Reverse(m.assignment_epoch));
    let hv = HostView {
        row,
        leases,
        open_migration: migrations.into_iter().next(),
    };
    Ok((hv, home))
}

/// The sticky grant's only write (A.5), run as the transaction's last statement and pipelined with
/// `COMMIT`: counters from the locked leases, `lease_expires_at` = max(itself, now + 90 000, the
/// leases' latest expiry), `last_activity_at` = now, and the request's `preferredRegion` if given.
/// Returns the row's `lease_expires_at`. Correct only while the caller holds the locks of
/// [`lock_sticky`] (or [`lock_host`]) and wrote no lease since.
pub async fn stamp_grant(
    tx: &mut Tx,
    hv: &HostView,
    host: &HostKey,
    preferred_region: Option<&str>,
    now: i64,
) -> Result<i64, DbError> {
    let c = LeaseCounts::of_leases(&hv.leases);
    let lease_until = hv
        .leases
        .iter()
        .map(|l| l.expires_at)
        .fold(now + LEASE_TTL_MS, i64::max);
    let rows = tx
        .finish_with(
            "UPDATE relay_assignments SET reserved_controls = $3, reserved_splices = $4, reserved_invites = $5, \
             pending_installs = $6, pending_confirmations = $7, migration_leases = $8, \
             lease_expires_at = CASE WHEN lease_expires_at >= $9 THEN lease_expires_at ELSE $9 END, \
             last_activity_at = $10, updated_at = $10, \
             preferred_region = CASE WHEN CAST($11 AS TEXT) IS NULL THEN preferred_region ELSE CAST($11 AS TEXT) END, \
             preferred_region_observed_at = CASE WHEN CAST($11 AS TEXT) IS NULL THEN preferred_region_observed_at ELSE $10 END \
             WHERE user_id = $1 AND relay_host_id = $2 RETURNING lease_expires_at",
            params![
                &host.user_id,
                &host.relay_host_id,
                c.controls,
                c.splices,
                c.invites,
                c.installs,
                c.confirmations,
                c.migrations,
                lease_until,
                now,
                preferred_region
            ],
        )
        .await?;
    Ok(rows.first().map_or(lease_until, |r| r.i64(0)))
}

/// The row's `lease_expires_at`, read inside the transaction that holds it.
pub async fn lease_expires_at(tx: &mut Tx, host: &HostKey) -> Result<Option<i64>, DbError> {
    Ok(tx
        .query_opt(
            "SELECT lease_expires_at FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2",
            params![&host.user_id, &host.relay_host_id],
        )
        .await?
        .map(|r| r.i64(0)))
}

/// Records the host's preferred region.
pub async fn set_preferred_region(
    tx: &mut Tx,
    host: &HostKey,
    region: &str,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignments SET preferred_region = $3, preferred_region_observed_at = $4 \
         WHERE user_id = $1 AND relay_host_id = $2",
        params![&host.user_id, &host.relay_host_id, region, now],
    )
    .await?;
    Ok(())
}

/// Raises `lease_expires_at` to `lease_until` (never lowering it) and sets `last_activity_at`.
pub async fn touch_row(
    tx: &mut Tx,
    host: &HostKey,
    lease_until: i64,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignments SET lease_expires_at = CASE WHEN lease_expires_at >= $3 \
         THEN lease_expires_at ELSE $3 END, last_activity_at = $4, updated_at = $4 \
         WHERE user_id = $1 AND relay_host_id = $2",
        params![&host.user_id, &host.relay_host_id, lease_until, now],
    )
    .await?;
    Ok(())
}

/// Points the row at `cell_id` with `epoch` (the caller checked the epoch under the row lock),
/// setting `lease_expires_at` when given.
pub async fn move_row(
    tx: &mut Tx,
    host: &HostKey,
    cell_id: &str,
    epoch: i64,
    lease_expires_at: Option<i64>,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignments SET cell_id = $3, assignment_epoch = $4, \
         lease_expires_at = CASE WHEN CAST($5 AS BIGINT) IS NULL THEN lease_expires_at ELSE CAST($5 AS BIGINT) END, \
         last_activity_at = $6, updated_at = $6 WHERE user_id = $1 AND relay_host_id = $2",
        params![
            &host.user_id,
            &host.relay_host_id,
            cell_id,
            epoch,
            lease_expires_at,
            now
        ],
    )
    .await?;
    Ok(())
}

/// Inserts a first assignment row; `DbError::UniqueViolation` when another transaction placed
/// the host first. Returns its epoch: 1, or 1 above the epoch floor a Postgres failover left
/// ([`super::timeline`]), so a host whose row a failover lost never gets an epoch it saw again.
pub async fn insert_row(
    tx: &mut Tx,
    host: &HostKey,
    cell_id: &str,
    lease_expires_at: i64,
    preferred_region: Option<&str>,
    now: i64,
) -> Result<i64, DbError> {
    let rows = tx
        .query(
            "INSERT INTO relay_assignments (user_id, relay_host_id, cell_id, assignment_epoch, \
             lease_expires_at, last_activity_at, preferred_region, preferred_region_observed_at, \
             created_at, updated_at) VALUES ($1, $2, $3, \
             1 + (SELECT CAST(COALESCE(MAX(epoch_floor), 0) AS BIGINT) FROM relay_store_timeline), \
             $4, $5, $6, $7, $5, $5) RETURNING assignment_epoch",
            params![
                &host.user_id,
                &host.relay_host_id,
                cell_id,
                lease_expires_at,
                now,
                preferred_region,
                preferred_region.map(|_| now)
            ],
        )
        .await?;
    Ok(rows.first().map(|r| r.i64(0)).unwrap_or(1))
}

/// Locks the host's connection reservations (tier 3).
pub async fn lock_reservations(tx: &mut Tx, host: &HostKey) -> Result<(), DbError> {
    tx.query(
        "SELECT reservation_id FROM relay_connection_reservations \
         WHERE user_id = $1 AND relay_host_id = $2 AND state <> 'released' FOR UPDATE",
        params![&host.user_id, &host.relay_host_id],
    )
    .await?;
    Ok(())
}

/// Charges `units` to `cell_id` if it fits its capacity; false when it does not.
pub async fn charge_cell(
    tx: &mut Tx,
    cell_id: &str,
    units: i64,
    now: i64,
) -> Result<bool, DbError> {
    if units == 0 {
        return Ok(true);
    }
    let n = tx
        .execute(
            "UPDATE relay_cells SET reserved_requests = reserved_requests + $2, updated_at = $3 \
             WHERE cell_id = $1 AND reserved_requests + $2 <= capacity_requests",
            params![cell_id, units, now],
        )
        .await?;
    Ok(n == 1)
}

/// Frees `units` on `cell_id`.
pub async fn free_cell(tx: &mut Tx, cell_id: &str, units: i64, now: i64) -> Result<(), DbError> {
    if units == 0 {
        return Ok(());
    }
    tx.execute(
        "UPDATE relay_cells SET reserved_requests = CASE WHEN reserved_requests >= $2 \
         THEN reserved_requests - $2 ELSE 0 END, updated_at = $3 WHERE cell_id = $1",
        params![cell_id, units, now],
    )
    .await?;
    Ok(())
}

/// Deletes one lease and frees its units.
pub async fn delete_lease(
    tx: &mut Tx,
    host: &HostKey,
    lease: &Lease,
    now: i64,
) -> Result<(), DbError> {
    if delete_lease_row(tx, host, &lease.activity_id).await? {
        free_cell(tx, &lease.cell_id, lease.request_units, now).await?;
    }
    Ok(())
}

/// Deletes one lease row; true when it was there (its units are then the caller's to free).
async fn delete_lease_row(tx: &mut Tx, host: &HostKey, activity_id: &str) -> Result<bool, DbError> {
    let n = tx
        .execute(
            "DELETE FROM relay_assignment_activity_leases WHERE user_id = $1 AND relay_host_id = $2 AND activity_id = $3",
            params![&host.user_id, &host.relay_host_id, activity_id],
        )
        .await?;
    Ok(n > 0)
}

/// Sets one lease's expiry.
pub async fn set_lease_expiry(
    tx: &mut Tx,
    host: &HostKey,
    activity_id: &str,
    expires_at: i64,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignment_activity_leases SET expires_at = $4, updated_at = $5 WHERE user_id = $1 AND relay_host_id = $2 AND activity_id = $3",
        params![&host.user_id, &host.relay_host_id, activity_id, expires_at, now],
    )
    .await?;
    Ok(())
}

/// Inserts a lease row (the caller charged its units).
#[allow(clippy::too_many_arguments)]
pub async fn insert_lease(
    tx: &mut Tx,
    host: &HostKey,
    activity_id: &str,
    kind: LeaseKind,
    cell_id: &str,
    units: i64,
    expires_at: i64,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO relay_assignment_activity_leases (user_id, relay_host_id, activity_id, activity_kind, \
         cell_id, request_units, expires_at, idle_regional_rehome, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)",
        params![
            &host.user_id,
            &host.relay_host_id,
            activity_id,
            kind.as_str(),
            cell_id,
            units,
            expires_at,
            false,
            now
        ],
    )
    .await?;
    Ok(())
}

/// Recomputes the six counters from the lease rows and raises `lease_expires_at` to the leases'
/// latest expiry (never lowering it); optionally sets `last_activity_at`.
pub async fn refresh_row(
    tx: &mut Tx,
    host: &HostKey,
    last_activity_at: Option<i64>,
    now: i64,
) -> Result<(), DbError> {
    let counts = tx
        .query(
            "SELECT activity_kind, COUNT(*), MAX(expires_at) FROM relay_assignment_activity_leases \
             WHERE user_id = $1 AND relay_host_id = $2 GROUP BY activity_kind",
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    let mut c = LeaseCounts::default();
    let mut max_exp = 0i64;
    for r in &counts {
        *c.of_mut(LeaseKind::from_stored(&r.str(0))) = r.i64(1);
        max_exp = max_exp.max(r.i64(2));
    }
    tx.execute(
        "UPDATE relay_assignments SET reserved_controls = $3, reserved_splices = $4, reserved_invites = $5, \
         pending_installs = $6, pending_confirmations = $7, migration_leases = $8, \
         lease_expires_at = CASE WHEN lease_expires_at >= $9 THEN lease_expires_at ELSE $9 END, \
         last_activity_at = CASE WHEN CAST($10 AS BIGINT) IS NULL THEN last_activity_at ELSE CAST($10 AS BIGINT) END, \
         updated_at = $11 WHERE user_id = $1 AND relay_host_id = $2",
        params![
            &host.user_id,
            &host.relay_host_id,
            c.controls,
            c.splices,
            c.invites,
            c.installs,
            c.confirmations,
            c.migrations,
            max_exp,
            last_activity_at,
            now
        ],
    )
    .await?;
    Ok(())
}

/// Inserts a `reserved` reservation for (host, epoch, cell) unless one exists (invariant 6).
pub async fn reserve_connection(
    tx: &mut Tx,
    host: &HostKey,
    epoch: i64,
    cell_id: &str,
    now: i64,
) -> Result<(), DbError> {
    let exists = tx
        .query_opt(
            "SELECT reservation_id FROM relay_connection_reservations WHERE user_id = $1 AND relay_host_id = $2 \
             AND assignment_epoch = $3 AND cell_id = $4 AND state = 'reserved'",
            params![&host.user_id, &host.relay_host_id, epoch, cell_id],
        )
        .await?;
    if exists.is_none() {
        tx.execute(
            "INSERT INTO relay_connection_reservations (reservation_id, user_id, relay_host_id, assignment_epoch, \
             cell_id, state, created_at, timeout_at) VALUES ($1, $2, $3, $4, $5, 'reserved', $6, $7)",
            params![
                uuid::Uuid::new_v4().to_string(),
                &host.user_id,
                &host.relay_host_id,
                epoch,
                cell_id,
                now,
                now + LEASE_TTL_MS
            ],
        )
        .await?;
    }
    Ok(())
}

/// The host's `reserved` reservations of `epoch` → `released` (a move off that epoch).
pub async fn release_epoch_reservations(
    tx: &mut Tx,
    host: &HostKey,
    epoch: i64,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_connection_reservations SET state = 'released', released_at = $4 \
         WHERE user_id = $1 AND relay_host_id = $2 AND assignment_epoch = $3 AND state = 'reserved'",
        params![&host.user_id, &host.relay_host_id, epoch, now],
    )
    .await?;
    Ok(())
}

/// Checks an activity id against its kind (ARCHITECTURE.md).
pub fn check_activity_id(id: &str, kind: ActivityKind) -> Result<(), ActivityError> {
    if ActivityId::director_only(id) {
        return Err(ActivityError::InvalidActivityKind);
    }
    let ok = ActivityId::parse(id).is_some_and(|a| a.kind() == kind.lease_kind());
    if ok {
        Ok(())
    } else {
        Err(ActivityError::InvalidActivityId)
    }
}

/// Request units of a kind (ARCHITECTURE.md).
pub fn kind_units(kind: ActivityKind) -> i64 {
    kind.units()
}

// ---------------------------------------------------------------------------------------------------
// The operations of ARCHITECTURE.md

/// True iff the host's row names `cell_id` at exactly `epoch` (plain read).
pub async fn verify_cell_assignment(
    db: &Db,
    host: &HostKey,
    cell_id: &str,
    epoch: i64,
) -> Result<bool, DbError> {
    Ok(read_row(db, host)
        .await?
        .is_some_and(|r| r.cell_id == cell_id && r.assignment_epoch == epoch))
}

/// The host's home, epoch and lease (plain read, no side effects).
pub async fn resolve_assignment(
    db: &Db,
    host: &HostKey,
) -> Result<Option<AssignmentView>, DbError> {
    let rows = db
        .query(
            "SELECT a.cell_id, c.cell_url, a.assignment_epoch, a.lease_expires_at FROM relay_assignments a \
             JOIN relay_cells c ON c.cell_id = a.cell_id WHERE a.user_id = $1 AND a.relay_host_id = $2",
            params![&host.user_id, &host.relay_host_id],
        )
        .await?;
    Ok(rows.first().map(|r| AssignmentView {
        cell_id: r.str(0),
        cell_url: r.str(1),
        assignment_epoch: r.i64(2),
        lease_expires_at: r.i64(3),
    }))
}

/// The control lease `id` for the activation: kept if it exists (the epoch's `control-pending`
/// then deleted), else the pending lease renamed to it, else a new lease charged to the cell.
async fn take_control_lease(
    tx: &mut Tx,
    host: &HostKey,
    req: &ActivateControl,
    leases: &[Lease],
    (id, epoch): (&str, i64),
    now: i64,
) -> Result<(), ActivityError> {
    let pending_id = ActivityId::ControlPending { epoch }.to_string();
    let pending = leases
        .iter()
        .find(|l| l.activity_id == pending_id && l.cell_id == req.cell_id);
    let existing = leases.iter().find(|l| l.activity_id == id);
    match (existing, pending) {
        (Some(_), Some(p)) => delete_lease(tx, host, p, now).await?,
        (Some(_), None) => {}
        (None, Some(_)) => {
            tx.execute(
                "UPDATE relay_assignment_activity_leases SET activity_id = $4 \
                 WHERE user_id = $1 AND relay_host_id = $2 AND activity_id = $3",
                params![&host.user_id, &host.relay_host_id, &pending_id, id],
            )
            .await?;
        }
        (None, None) => {
            if !charge_cell(tx, &req.cell_id, 1, now).await? {
                return Err(ActivityError::RelayCapacityExhausted);
            }
            insert_lease(
                tx,
                host,
                id,
                LeaseKind::Control,
                &req.cell_id,
                1,
                now + LEASE_TTL_MS,
                now,
            )
            .await?;
        }
    }
    Ok(())
}

/// Converts `control-pending:<epoch>` (or charges 1) into `control:<cellId>:<generation>`; returns
/// the activity id.
pub async fn activate_control(
    db: &Db,
    host: &HostKey,
    req: &ActivateControl,
    now: i64,
) -> Result<String, ActivityError> {
    activate(db, host, req, now, false).await
}

/// The cell's activation step: [`activate_control`] then [`mark_migration_target_registered`],
/// in one transaction. The row [`activate_control`] locks is the one the mark needs, so this saves
/// the mark's own transaction and row lock (five statements on Postgres) per control handshake;
/// either both take effect or neither does, so a failure leaves no activity to release.
pub async fn activate_control_registered(
    db: &Db,
    host: &HostKey,
    req: &ActivateControl,
    now: i64,
) -> Result<String, ActivityError> {
    activate(db, host, req, now, true).await
}

async fn activate(
    db: &Db,
    host: &HostKey,
    req: &ActivateControl,
    now: i64,
    register: bool,
) -> Result<String, ActivityError> {
    let id = control_activity_id(req);
    transaction!(db, "activity-lease", |tx| {
        activate_in(tx, host, req, &id, now).await?;
        if register {
            register_migration_target(tx, host, &req.cell_id, req.assignment_epoch, now).await?;
        }
        Ok(id.clone())
    })
}

fn control_activity_id(req: &ActivateControl) -> String {
    ActivityId::Control {
        cell_id: req.cell_id.clone(),
        generation: req.generation,
    }
    .to_string()
}

/// [`activate_control`]'s body, under the transaction's lock of the host's row.
async fn activate_in(
    tx: &mut Tx,
    host: &HostKey,
    req: &ActivateControl,
    id: &str,
    now: i64,
) -> Result<(), ActivityError> {
    let incarnation = req.cell_incarnation.to_ascii_lowercase();
    let row = lock_row(tx, host, Some(CELL_DRIVEN_WAIT_MS)).await?;
    let row = match row {
        Some(r) if r.cell_id == req.cell_id && r.assignment_epoch == req.assignment_epoch => r,
        _ => return Err(ActivityError::WrongAssignment),
    };
    let leases = lock_leases(tx, host).await?;
    lock_reservations(tx, host).await?;
    take_control_lease(tx, host, req, &leases, (id, row.assignment_epoch), now).await?;
    tx.execute(
        "UPDATE relay_assignment_activity_leases SET control_generation = $4, cell_incarnation = $5, \
         idle_regional_rehome = $6, renewed_at = $7, expires_at = $8, updated_at = $7 \
         WHERE user_id = $1 AND relay_host_id = $2 AND activity_id = $3",
        params![
            &host.user_id,
            &host.relay_host_id,
            id,
            req.generation,
            &incarnation,
            req.idle_regional_rehome,
            now,
            now + LEASE_TTL_MS
        ],
    )
    .await?;
    for l in &leases {
        if let Some((cell, g)) = parse_control_id(&l.activity_id) {
            if cell == req.cell_id && g < req.generation {
                delete_lease(tx, host, l, now).await?;
            }
        }
    }
    tx.execute(
        "UPDATE relay_connection_reservations SET state = 'claimed', cell_incarnation = $5, \
         inclusion_watermark = $6, claimed_at = $7 WHERE user_id = $1 AND relay_host_id = $2 \
         AND assignment_epoch = $3 AND cell_id = $4 AND state = 'reserved'",
        params![
            &host.user_id,
            &host.relay_host_id,
            req.assignment_epoch,
            &req.cell_id,
            &incarnation,
            req.connection_inclusion_watermark,
            now
        ],
    )
    .await?;
    refresh_row(tx, host, Some(now), now).await?;
    Ok(())
}

/// Marks the open migration targeting `cell_id` at `epoch` as registered.
pub async fn mark_migration_target_registered(
    db: &Db,
    host: &HostKey,
    cell_id: &str,
    epoch: i64,
    now: i64,
) -> Result<(), DbError> {
    transaction!(db, "migration", |tx| {
        lock_row(tx, host, Some(CELL_DRIVEN_WAIT_MS)).await?;
        register_migration_target(tx, host, cell_id, epoch, now).await
    })
}

/// [`mark_migration_target_registered`]'s update, under a lock of the host's row.
async fn register_migration_target(
    tx: &mut Tx,
    host: &HostKey,
    cell_id: &str,
    epoch: i64,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignment_migrations SET target_registered_at = $5, updated_at = $5 \
         WHERE user_id = $1 AND relay_host_id = $2 AND target_cell_id = $3 AND assignment_epoch = $4 \
         AND completed_at IS NULL AND aborted_at IS NULL AND target_registered_at IS NULL",
        params![&host.user_id, &host.relay_host_id, cell_id, epoch, now],
    )
    .await?;
    Ok(())
}

/// Acquires or extends `activity_id` on `cell_id` (default expiry now + 90 000).
pub async fn acquire_activity(
    db: &Db,
    host: &HostKey,
    activity_id: &str,
    kind: ActivityKind,
    cell_id: &str,
    expires_at: Option<i64>,
    now: i64,
) -> Result<(), ActivityError> {
    check_activity_id(activity_id, kind)?;
    let expires_at = expires_at.unwrap_or(now + LEASE_TTL_MS);
    let max = if kind == ActivityKind::Control {
        limits::CONTROL_ACTIVITY_EXPIRY_MAX_MS
    } else {
        limits::ACTIVITY_EXPIRY_MAX_MS
    };
    if expires_at <= now || expires_at > now + max {
        return Err(ActivityError::InvalidActivityExpiry);
    }
    transaction!(db, "activity-lease", |tx| {
        let row = match lock_row(tx, host, Some(CELL_DRIVEN_WAIT_MS)).await? {
            Some(r) => r,
            None => return Err(ActivityError::AssignmentNotFound),
        };
        let leases = lock_leases(tx, host).await?;
        let migration = lock_open_migration(tx, host).await?;
        let authoritative = row.cell_id == cell_id
            || (kind != ActivityKind::Control
                && migration
                    .as_ref()
                    .is_some_and(|m| m.source_cell_id == cell_id));
        if !authoritative {
            return Err(ActivityError::ActivityCellNotAuthoritative);
        }
        match leases.iter().find(|l| l.activity_id == activity_id) {
            Some(l) => {
                tx.execute(
                    "UPDATE relay_assignment_activity_leases SET expires_at = $4, updated_at = $5 \
                     WHERE user_id = $1 AND relay_host_id = $2 AND activity_id = $3",
                    params![
                        &host.user_id,
                        &host.relay_host_id,
                        activity_id,
                        l.expires_at.max(expires_at),
                        now
                    ],
                )
                .await?;
            }
            None => {
                let units = kind_units(kind);
                if !charge_cell(tx, cell_id, units, now).await? {
                    return Err(ActivityError::RelayCapacityExhausted);
                }
                insert_lease(
                    tx,
                    host,
                    activity_id,
                    kind.lease_kind(),
                    cell_id,
                    units,
                    expires_at,
                    now,
                )
                .await?;
            }
        }
        refresh_row(tx, host, Some(now), now).await?;
        Ok(())
    })
}

/// Deletes the lease if present and frees its units (idempotent).
pub async fn release_activity(
    db: &Db,
    host: &HostKey,
    activity_id: &str,
    now: i64,
) -> Result<(), DbError> {
    release_activity_traced(db, host, activity_id, now, &mut ReleaseTrace::default()).await
}

/// Where a release transaction spent its time (issue 12: a drained cell's releases stayed in
/// flight for seconds and nobody knew where). Filled by the release calls, logged by the cell.
#[derive(Debug, Default, Clone)]
pub struct ReleaseTrace {
    /// Attempts of the transaction (a lock timeout or serialization failure retries it).
    pub attempts: u32,
    /// Call → first statement of the first attempt: the pool checkout and `BEGIN`.
    pub begin: std::time::Duration,
    /// First attempt's first statement → last attempt's first statement: failed attempts.
    pub retried: std::time::Duration,
    /// The last attempt's assignment-row and lease locks (waits on rows held elsewhere).
    pub rows: std::time::Duration,
    /// The last attempt's `relay_cells` update (waits on the cell's row).
    pub cells: std::time::Duration,
    /// The last attempt's end of body → the call's end: the commit.
    pub commit: std::time::Duration,
    /// Items skipped because their assignment row was locked elsewhere.
    pub skipped: usize,
    /// The server's `synchronous_commit` for the last attempt (`off` on Postgres: the commit
    /// did not wait for the WAL flush; empty on SQLite).
    pub synchronous_commit: String,
}

/// Turns off `synchronous_commit` for a release transaction on Postgres and returns the value the
/// server now holds for it. Under I/O pressure (the roll benchmark's shared machine) a `COMMIT`
/// waited seconds for the WAL flush, and the deleted lease stayed visible to every other
/// transaction until then, next to the control the host had already activated on another cell.
/// Without the wait the delete is visible once committed. A release lost in a database crash
/// leaves the lease (and its units, same transaction) as if it had not landed: it expires with
/// the lease (≤ [`limits::CONTROL_ACTIVITY_EXPIRY_MAX_MS`]); a later durable commit flushes the
/// earlier WAL, so nothing durable can depend on a lost release.
async fn release_commit_async(tx: &mut Tx) -> Result<String, DbError> {
    match tx.kind() {
        super::DbKind::Postgres => {
            let rows = tx
                .query("SELECT set_config('synchronous_commit', 'off', true)", &[])
                .await?;
            Ok(rows.first().map(|r| r.str(0)).unwrap_or_default())
        }
        super::DbKind::Sqlite => Ok(String::new()),
    }
}

/// Times one transaction's phases into a [`ReleaseTrace`].
struct Phases {
    called: std::time::Instant,
    first: Option<std::time::Instant>,
    at: std::time::Instant,
}

impl Phases {
    fn new() -> Phases {
        let now = std::time::Instant::now();
        Phases {
            called: now,
            first: None,
            at: now,
        }
    }

    /// An attempt's first statement is about to run.
    fn attempt(&mut self, t: &mut ReleaseTrace) {
        let now = std::time::Instant::now();
        t.attempts += 1;
        match self.first {
            None => {
                self.first = Some(now);
                t.begin = now - self.called;
            }
            Some(first) => t.retried = now - first,
        }
        self.at = now;
    }

    /// Time since the last mark.
    fn lap(&mut self) -> std::time::Duration {
        let now = std::time::Instant::now();
        let d = now - self.at;
        self.at = now;
        d
    }
}

/// [`release_activity`], timed into `trace`.
pub async fn release_activity_traced(
    db: &Db,
    host: &HostKey,
    activity_id: &str,
    now: i64,
    trace: &mut ReleaseTrace,
) -> Result<(), DbError> {
    let mut ph = Phases::new();
    let out = transaction!(db, "activity-lease", |tx| {
        ph.attempt(trace);
        trace.synchronous_commit = release_commit_async(tx).await?;
        if lock_row(tx, host, Some(CELL_DRIVEN_WAIT_MS))
            .await?
            .is_none()
        {
            trace.rows = ph.lap();
            return Ok(());
        }
        let leases = lock_leases(tx, host).await?;
        trace.rows = ph.lap();
        if let Some(l) = leases.iter().find(|l| l.activity_id == activity_id) {
            if delete_lease_row(tx, host, &l.activity_id).await? {
                ph.lap();
                free_cell(tx, &l.cell_id, l.request_units, now).await?;
                trace.cells = ph.lap();
            }
            refresh_row(tx, host, Some(now), now).await?;
        }
        ph.lap();
        Ok::<_, DbError>(())
    });
    trace.commit = ph.lap();
    out
}

/// Releases several activities in one transaction (a cell's batched releases): assignment rows
/// in key order `FOR UPDATE SKIP LOCKED`, each host's leases, then the freed units once per
/// cell. Per item: `true` when done (released, or nothing left to release), `false` when the
/// host's row was locked elsewhere (skipped; the caller tries again). Many releases of one cell
/// at once (a drain) otherwise each lock that cell's row in turn, queueing behind one another
/// and behind the directors' moves off the cell.
pub async fn release_activities(
    db: &Db,
    items: &[(HostKey, String)],
    now: i64,
    trace: &mut ReleaseTrace,
) -> Result<Vec<bool>, DbError> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|a, b| {
        let (x, y) = (&items[*a].0, &items[*b].0);
        (&x.user_id, &x.relay_host_id).cmp(&(&y.user_id, &y.relay_host_id))
    });
    let mut ph = Phases::new();
    let out = transaction!(db, "activity-lease", |tx| {
        ph.attempt(trace);
        trace.synchronous_commit = release_commit_async(tx).await?;
        let mut done = vec![false; items.len()];
        let mut freed: std::collections::BTreeMap<String, i64> = Default::default();
        let mut locked: Option<(&HostKey, bool)> = None;
        for &i in &order {
            let (host, activity_id) = &items[i];
            let held = match locked {
                Some((k, held)) if k == host => held,
                _ => {
                    let got = tx
                        .query_opt(
                            "SELECT 1 FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2 \
                             FOR UPDATE SKIP LOCKED",
                            params![&host.user_id, &host.relay_host_id],
                        )
                        .await?
                        .is_some();
                    let held = got
                        || tx
                            .query_opt(
                                "SELECT 1 FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2",
                                params![&host.user_id, &host.relay_host_id],
                            )
                            .await?
                            .is_none();
                    // `held` without the lock: no row at all, nothing to release.
                    locked = Some((host, held && got));
                    if !got {
                        done[i] = held;
                        continue;
                    }
                    true
                }
            };
            if !held {
                continue;
            }
            let leases = lock_leases(tx, host).await?;
            if let Some(l) = leases.iter().find(|l| &l.activity_id == activity_id) {
                if delete_lease_row(tx, host, &l.activity_id).await? {
                    *freed.entry(l.cell_id.clone()).or_default() += l.request_units;
                }
                refresh_row(tx, host, Some(now), now).await?;
            }
            done[i] = true;
        }
        trace.rows = ph.lap();
        for (cell, units) in &freed {
            free_cell(tx, cell, *units, now).await?;
        }
        trace.cells = ph.lap();
        trace.skipped = done.iter().filter(|d| !**d).count();
        Ok::<_, DbError>(done)
    });
    trace.commit = ph.lap();
    out
}

/// Renews a batch of control activities of one cell, one outcome per row, in order; a failed
/// batch reads as `DatabaseError` for every row (see [`try_renew_control_activities`] for the
/// error itself).
pub async fn renew_control_activities(
    db: &Db,
    cell_id: &str,
    cell_incarnation: &str,
    rows: &[RenewalRow],
    now: i64,
) -> Vec<RenewalOutcome> {
    try_renew_control_activities(db, cell_id, cell_incarnation, rows, now)
        .await
        .unwrap_or_else(|_| vec![RenewalOutcome::DatabaseError; rows.len()])
}

/// [`renew_control_activities`] that hands a failed batch's error to the caller (the cell logs
/// it; the store logs nothing).
pub async fn try_renew_control_activities(
    db: &Db,
    cell_id: &str,
    cell_incarnation: &str,
    rows: &[RenewalRow],
    now: i64,
) -> Result<Vec<RenewalOutcome>, DbError> {
    let incarnation = cell_incarnation.to_ascii_lowercase();
    let pre: Vec<Option<RenewalOutcome>> = rows
        .iter()
        .map(|r| renewal_precheck(r, cell_id, now))
        .collect();
    let mut hosts: Vec<&HostKey> = rows
        .iter()
        .zip(&pre)
        .filter(|(_, p)| p.is_none())
        .map(|(r, _)| &r.host)
        .collect();
    hosts.sort();
    hosts.dedup();
    let result: Result<Vec<RenewalOutcome>, DbError> = transaction!(db, "activity-lease", |tx| {
        let locked = lock_renewal_hosts(tx, &hosts).await?;
        let mut out = Vec::with_capacity(rows.len());
        for (r, p) in rows.iter().zip(&pre) {
            if let Some(p) = p {
                out.push(*p);
                continue;
            }
            let row = locked.get(&r.host).cloned().flatten();
            out.push(renew_one(tx, r, row, cell_id, &incarnation, now).await?);
        }
        Ok::<_, DbError>(out)
    });
    result
}

/// The checks that need no database: the activity is a control of this cell, and its new expiry
/// lies in the future within the maximum. `None` when the row goes on to the store.
fn renewal_precheck(r: &RenewalRow, cell_id: &str, now: i64) -> Option<RenewalOutcome> {
    match parse_control_id(&r.activity_id) {
        Some((c, _)) if c == cell_id => {
            if r.expires_at <= now || r.expires_at > now + limits::CONTROL_ACTIVITY_EXPIRY_MAX_MS {
                Some(RenewalOutcome::InvalidActivityExpiry)
            } else {
                None
            }
        }
        _ => Some(RenewalOutcome::InvalidActivityId),
    }
}

/// Tier 1 in key order, skipping rows locked elsewhere: each host's assignment row, `None` when
/// skipped or absent.
async fn lock_renewal_hosts<'h>(
    tx: &mut Tx,
    hosts: &[&'h HostKey],
) -> Result<std::collections::HashMap<&'h HostKey, Option<AssignmentRow>>, DbError> {
    let mut locked = std::collections::HashMap::new();
    for h in hosts {
        let r = tx
            .query_opt(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2 \
                     FOR UPDATE SKIP LOCKED"
                ),
                params![&h.user_id, &h.relay_host_id],
            )
            .await?;
        locked.insert(*h, r.map(|r| row_from(&r)));
    }
    Ok(locked)
}

/// Renews one control activity whose host row is `row` (locked, or `None`): the row must be
/// assigned to this cell and the lease still this cell's (and this incarnation's, once it has
/// one). A renewal also extends the host's splice and confirmation leases on this cell.
async fn renew_one(
    tx: &mut Tx,
    r: &RenewalRow,
    row: Option<AssignmentRow>,
    cell_id: &str,
    incarnation: &str,
    now: i64,
) -> Result<RenewalOutcome, DbError> {
    let Some(row) = row else {
        // Skipped by the locking read, or absent: a plain read tells which.
        let seen = tx
            .query_opt(
                "SELECT cell_id FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2",
                params![&r.host.user_id, &r.host.relay_host_id],
            )
            .await?;
        return Ok(if seen.is_some() {
            RenewalOutcome::AssignmentLockUnavailable
        } else {
            RenewalOutcome::AssignmentNotFound
        });
    };
    if row.cell_id != cell_id {
        return Ok(RenewalOutcome::ActivityCellNotAuthoritative);
    }
    let lease = tx
        .query_opt(
            &format!(
                "SELECT {LEASE_COLUMNS} FROM relay_assignment_activity_leases \
                 WHERE user_id = $1 AND relay_host_id = $2 AND activity_id = $3 FOR UPDATE"
            ),
            params![&r.host.user_id, &r.host.relay_host_id, &r.activity_id],
        )
        .await?
        .map(|x| lease_from(&x));
    let Some(lease) = lease else {
        return Ok(RenewalOutcome::ControlActivityNotFound);
    };
    if lease.cell_id != cell_id
        || lease
            .cell_incarnation
            .as_deref()
            .is_some_and(|i| i != incarnation)
    {
        return Ok(RenewalOutcome::ControlActivityMoved);
    }
    let generation = parse_control_id(&r.activity_id).map(|(_, g)| g);
    tx.execute(
        "UPDATE relay_assignment_activity_leases SET expires_at = $4, renewed_at = $5, updated_at = $5, \
         cell_incarnation = CASE WHEN cell_incarnation IS NULL THEN CAST($6 AS TEXT) ELSE cell_incarnation END, \
         control_generation = CASE WHEN control_generation IS NULL THEN CAST($7 AS BIGINT) ELSE control_generation END \
         WHERE user_id = $1 AND relay_host_id = $2 AND activity_id = $3",
        params![
            &r.host.user_id,
            &r.host.relay_host_id,
            &r.activity_id,
            r.expires_at,
            now,
            incarnation,
            generation
        ],
    )
    .await?;
    tx.execute(
        "UPDATE relay_assignment_activity_leases SET expires_at = $4, updated_at = $5 \
         WHERE user_id = $1 AND relay_host_id = $2 AND cell_id = $3 AND expires_at > $5 \
         AND expires_at < $4 AND activity_kind IN ('splice', 'confirmation')",
        params![
            &r.host.user_id,
            &r.host.relay_host_id,
            cell_id,
            r.expires_at,
            now
        ],
    )
    .await?;
    refresh_row(tx, &r.host, Some(now), now).await?;
    Ok(RenewalOutcome::Renewed)
}

#[cfg(test)]
mod renewal_tests {
    use super::*;

    fn row(activity_id: &str, expires_at: i64) -> RenewalRow {
        RenewalRow {
            host: HostKey {
                user_id: "u".into(),
                relay_host_id: "h".into(),
            },
            activity_id: activity_id.into(),
            expires_at,
        }
    }

    #[test]
    fn precheck_needs_a_control_of_this_cell_and_an_expiry_in_range() {
        let now = 1_000;
        let max = now + limits::CONTROL_ACTIVITY_EXPIRY_MAX_MS;
        assert_eq!(
            renewal_precheck(&row("control:A:3", now + 1), "A", now),
            None
        );
        assert_eq!(renewal_precheck(&row("control:A:3", max), "A", now), None);
        for expires in [now, max + 1] {
            assert_eq!(
                renewal_precheck(&row("control:A:3", expires), "A", now),
                Some(RenewalOutcome::InvalidActivityExpiry)
            );
        }
        for id in ["control:B:3", "splice:x", "control:A"] {
            assert_eq!(
                renewal_precheck(&row(id, now + 1), "A", now),
                Some(RenewalOutcome::InvalidActivityId),
                "{id}"
            );
        }
    }
}
