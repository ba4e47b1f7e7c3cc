//! Migration rows (docs/operations.md) and the reads the sweep chain starts from. The
//! director's migrate service composes these into its transactions.

use super::{Db, DbError, Row, Tx};
use crate::model::{HostKey, Migration};
use crate::params;

/// Columns of [`Migration`], in the order [`migration_from`] reads them.
pub const MIGRATION_COLUMNS: &str = "user_id, relay_host_id, kind, source_cell_id, target_cell_id, \
     previous_epoch, assignment_epoch, source_request_units, target_reserved_units, arrival_deadline, \
     expires_at, target_registered_at, completed_at, aborted_at, abort_reason, created_at";

/// A [`Migration`] read with [`MIGRATION_COLUMNS`].
pub fn migration_from(r: &Row) -> Migration {
    Migration {
        host: HostKey {
            user_id: r.str(0),
            relay_host_id: r.str(1),
        },
        kind: r.str(2),
        source_cell_id: r.str(3),
        target_cell_id: r.str(4),
        previous_epoch: r.i64(5),
        assignment_epoch: r.i64(6),
        source_request_units: r.i64(7),
        target_reserved_units: r.i64(8),
        arrival_deadline: r.i64(9),
        expires_at: r.i64(10),
        target_registered_at: r.opt_i64(11),
        completed_at: r.opt_i64(12),
        aborted_at: r.opt_i64(13),
        abort_reason: r.opt_str(14),
        created_at: r.i64(15),
    }
}

fn host_from(r: &Row) -> HostKey {
    HostKey {
        user_id: r.str(0),
        relay_host_id: r.str(1),
    }
}

/// The host's migration at `epoch`, open or not.
pub async fn read(tx: &mut Tx, host: &HostKey, epoch: i64) -> Result<Option<Migration>, DbError> {
    Ok(tx
        .query_opt(
            &format!(
                "SELECT {MIGRATION_COLUMNS} FROM relay_assignment_migrations WHERE user_id = $1 AND relay_host_id = $2 AND assignment_epoch = $3"
            ),
            params![&host.user_id, &host.relay_host_id, epoch],
        )
        .await?
        .as_ref()
        .map(migration_from))
}

/// The host's open migration (plain read, no lock).
pub async fn read_open(db: &Db, host: &HostKey) -> Result<Option<Migration>, DbError> {
    Ok(db
        .query(
            &format!(
                "SELECT {MIGRATION_COLUMNS} FROM relay_assignment_migrations WHERE user_id = $1 AND relay_host_id = $2 \
                 AND completed_at IS NULL AND aborted_at IS NULL"
            ),
            params![&host.user_id, &host.relay_host_id],
        )
        .await?
        .first()
        .map(migration_from))
}

/// What an evacuation writes (docs/operations.md).
#[derive(Debug, Clone)]
pub struct NewEvacuation<'a> {
    pub assignment_epoch: i64,
    pub source_cell_id: &'a str,
    pub source_cell_incarnation: Option<&'a str>,
    pub target_cell_id: &'a str,
    pub previous_epoch: i64,
    pub source_request_units: i64,
    pub target_reserved_units: i64,
    /// Arrival deadline and expiry.
    pub deadline: i64,
}

/// Inserts an `evacuation` migration row.
pub async fn insert_evacuation(
    tx: &mut Tx,
    host: &HostKey,
    m: &NewEvacuation<'_>,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO relay_assignment_migrations (user_id, relay_host_id, assignment_epoch, kind, source_cell_id, \
         source_cell_incarnation, target_cell_id, previous_epoch, source_request_units, target_reserved_units, \
         arrival_deadline, expires_at, created_at, updated_at) VALUES ($1, $2, $3, 'evacuation', $4, $5, $6, $7, $8, $9, $10, $10, $11, $11)",
        params![
            &host.user_id,
            &host.relay_host_id,
            m.assignment_epoch,
            m.source_cell_id,
            m.source_cell_incarnation,
            m.target_cell_id,
            m.previous_epoch,
            m.source_request_units,
            m.target_reserved_units,
            m.deadline,
            now
        ],
    )
    .await?;
    Ok(())
}

/// Sets the migration's expiry.
pub async fn set_expiry(
    tx: &mut Tx,
    host: &HostKey,
    epoch: i64,
    expires_at: i64,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignment_migrations SET expires_at = $4, updated_at = $5 WHERE user_id = $1 AND relay_host_id = $2 AND assignment_epoch = $3",
        params![&host.user_id, &host.relay_host_id, epoch, expires_at, now],
    )
    .await?;
    Ok(())
}

/// Marks the migration completed, and the idle-rehome attempt that wrote it (docs/reference/http.md).
pub async fn mark_completed(
    tx: &mut Tx,
    host: &HostKey,
    epoch: i64,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignment_migrations SET completed_at = $4, updated_at = $4 WHERE user_id = $1 \
         AND relay_host_id = $2 AND assignment_epoch = $3",
        params![&host.user_id, &host.relay_host_id, epoch, now],
    )
    .await?;
    super::region::complete_attempt(tx, host, epoch, now).await?;
    Ok(())
}

/// Aborts an open migration (the caller holds the host rows).
pub async fn abort_migration(
    tx: &mut Tx,
    host: &HostKey,
    epoch: i64,
    reason: &str,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_assignment_migrations SET aborted_at = $4, abort_reason = $5, updated_at = $4 \
         WHERE user_id = $1 AND relay_host_id = $2 AND assignment_epoch = $3 AND completed_at IS NULL AND aborted_at IS NULL",
        params![&host.user_id, &host.relay_host_id, epoch, now, reason],
    )
    .await?;
    // Aborting the migration aborts its idle-rehome attempt with the same reason.
    super::region::abort_attempt(tx, host, epoch, reason, now).await?;
    Ok(())
}

/// Hosts homed on `cell_id` without an open migration, in key order, at most `limit`.
pub async fn hosts_without_migration(
    db: &Db,
    cell_id: &str,
    limit: Option<i64>,
) -> Result<Vec<HostKey>, DbError> {
    hosts_on_cell(db, cell_id, false, limit.unwrap_or(i64::MAX / 2)).await
}

/// Hosts homed on `cell_id`, in key order, at most `limit`; those with an open migration only when
/// `with_migrating`.
pub async fn hosts_on_cell(
    db: &Db,
    cell_id: &str,
    with_migrating: bool,
    limit: i64,
) -> Result<Vec<HostKey>, DbError> {
    let rows = db
        .query(
            "SELECT a.user_id, a.relay_host_id FROM relay_assignments a WHERE a.cell_id = $1 AND ($2 OR NOT EXISTS \
             (SELECT 1 FROM relay_assignment_migrations m WHERE m.user_id = a.user_id AND m.relay_host_id = a.relay_host_id \
             AND m.completed_at IS NULL AND m.aborted_at IS NULL)) ORDER BY a.user_id, a.relay_host_id LIMIT $3",
            params![cell_id, with_migrating, limit],
        )
        .await?;
    Ok(rows.iter().map(host_from).collect())
}

/// Which open migrations a sweep step visits.
#[derive(Debug, Clone, Copy)]
pub enum OpenFilter {
    /// Target registered, created after the instant.
    RegisteredSince(i64),
    /// Target registered.
    Registered,
    /// Target not registered and arrival deadline at or before the instant.
    UnarrivedBy(i64),
    /// Created at or before the instant.
    CreatedBy(i64),
}

/// Open migrations matching `filter`: `(host, epoch)` in key order, at most `limit`.
pub async fn open_migrations(
    db: &Db,
    filter: OpenFilter,
    limit: i64,
) -> Result<Vec<(HostKey, i64)>, DbError> {
    let (extra, at) = match filter {
        OpenFilter::RegisteredSince(t) => (
            " AND target_registered_at IS NOT NULL AND created_at > CAST($2 AS BIGINT)",
            Some(t),
        ),
        OpenFilter::Registered => (
            " AND target_registered_at IS NOT NULL AND CAST($2 AS BIGINT) IS NULL",
            None,
        ),
        OpenFilter::UnarrivedBy(t) => (
            " AND target_registered_at IS NULL AND arrival_deadline <= CAST($2 AS BIGINT)",
            Some(t),
        ),
        OpenFilter::CreatedBy(t) => (" AND created_at <= CAST($2 AS BIGINT)", Some(t)),
    };
    let rows = db
        .query(
            &format!(
                "SELECT user_id, relay_host_id, assignment_epoch FROM relay_assignment_migrations \
                 WHERE completed_at IS NULL AND aborted_at IS NULL{extra} ORDER BY user_id, relay_host_id LIMIT $1"
            ),
            params![limit, at],
        )
        .await?;
    Ok(rows.iter().map(|r| (host_from(r), r.i64(2))).collect())
}

/// Where a walk over expired leases stands: the last lease listed, in
/// (`expires_at`, `user_id`, `relay_host_id`, `activity_id`) order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCursor {
    pub expires_at: i64,
    pub host: HostKey,
    pub activity_id: String,
}

/// Hosts with one of the next `limit` leases expired at `now` after `after` (from the start when
/// `None`), soonest expiry first, and the cursor past them: `None` when fewer than `limit` leases
/// were left, so a walk ends after one pass over what was expired when it began.
pub async fn hosts_with_expired_leases(
    db: &Db,
    now: i64,
    after: Option<&LeaseCursor>,
    limit: i64,
) -> Result<(Vec<HostKey>, Option<LeaseCursor>), DbError> {
    let (at, user, host, activity) = match after {
        Some(c) => (
            c.expires_at,
            c.host.user_id.as_str(),
            c.host.relay_host_id.as_str(),
            c.activity_id.as_str(),
        ),
        None => (i64::MIN, "", "", ""),
    };
    let rows = db
        .query(
            "SELECT user_id, relay_host_id, expires_at, activity_id FROM relay_assignment_activity_leases \
             WHERE expires_at <= $1 AND (expires_at, user_id, relay_host_id, activity_id) > ($2, $3, $4, $5) \
             ORDER BY expires_at, user_id, relay_host_id, activity_id LIMIT $6",
            params![now, at, user, host, activity, limit],
        )
        .await?;
    let next = match rows.last() {
        Some(r) if rows.len() as i64 >= limit => Some(LeaseCursor {
            expires_at: r.i64(2),
            host: host_from(r),
            activity_id: r.str(3),
        }),
        _ => None,
    };
    let mut hosts: Vec<HostKey> = Vec::with_capacity(rows.len());
    for r in &rows {
        let h = host_from(r);
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    Ok((hosts, next))
}

/// `reserved` reservations whose timeout passed at least `grace_ms` before `now` → `released`.
pub async fn release_old_reservations(db: &Db, now: i64, grace_ms: i64) -> Result<u64, DbError> {
    db.execute(
        "UPDATE relay_connection_reservations SET state = 'released', released_at = $1 \
         WHERE state = 'reserved' AND timeout_at + $2 <= $1",
        params![now, grace_ms],
    )
    .await
}

/// Deletes region decisions that expired before `before`.
pub async fn delete_region_decisions_before(db: &Db, before: i64) -> Result<u64, DbError> {
    db.execute(
        "DELETE FROM relay_region_decisions WHERE expires_at < $1",
        params![before],
    )
    .await
}
