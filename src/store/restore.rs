//! The first start after a restore from `orca-relay backup` (SQLite, single node).
//!
//! A backup copy carries a marker table, [`MARKER_TABLE`], holding the time the copy was taken. The
//! live database never has it. When a process starts on a database that has the marker, [`settle`]
//! runs once, in one transaction, before any role starts:
//!
//! - every host's assignment epoch, every region decision's generation and epoch and the rehome
//!   control's generation advance by the jump `J` = (now − taken_at) + [`JUMP_MARGIN`], so no epoch or
//!   generation issued between the backup and the restore (lost with the restore) is issued again
//!   for a different grant: a client holding a newer epoch than the restored rows is refused at
//!   `host-hello` and asks for a grant again, which names a strictly greater epoch;
//! - activity leases, reservations, open migrations and rehome attempts, connection bases and
//!   unused invites are settled: the processes that held them are gone, and an invite that may have
//!   been used after the backup must not become usable again.
//!
//! The bound: an epoch grows by one per move of its host, and a move is one committed write of the
//! host's row. `J` covers one move per host per millisecond between the backup and the restore,
//! plus [`JUMP_MARGIN`] for clock steps; hosts move far less often (a move follows the loss of a
//! cell, a migration or a rehome). Epochs stay below 2^53: a restore adds about 3.2·10^10 per
//! year elapsed.

use super::{Db, DbError, DbKind};
use crate::params;

/// The table `orca-relay backup` writes into the copy.
pub const MARKER_TABLE: &str = "orca_relay_restore_marker";

/// Headroom added to the elapsed milliseconds.
pub const JUMP_MARGIN: i64 = 1_000_000;

/// The abort reason written on migrations and rehome attempts open at the backup.
pub const ABORT_REASON: &str = "restored_from_backup";

/// What [`settle`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub taken_at: i64,
    pub jump: i64,
    pub hosts: u64,
}

/// The jump applied for a backup taken at `taken_at` and restored at `now`.
pub fn jump(taken_at: i64, now: i64) -> i64 {
    (now - taken_at).max(0) + JUMP_MARGIN
}

/// Settles a restored database (see the module docs); `None` when there is no marker.
pub async fn settle(db: &Db, now: i64) -> Result<Option<Settled>, DbError> {
    if db.kind() != DbKind::Sqlite {
        return Ok(None);
    }
    let mut tx = db.begin().await?;
    let exists = tx
        .query_opt(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1",
            params![MARKER_TABLE],
        )
        .await?
        .map(|r| r.i64(0) > 0)
        .unwrap_or(false);
    if !exists {
        tx.rollback().await;
        return Ok(None);
    }
    let taken_at = tx
        .query_opt(
            &format!("SELECT CAST(MAX(taken_at) AS BIGINT) FROM {MARKER_TABLE}"),
            params![],
        )
        .await?
        .map(|r| r.opt_i64(0).unwrap_or(0))
        .unwrap_or(0);
    let j = jump(taken_at, now);
    let hosts = tx
        .execute(
            "UPDATE relay_assignments SET assignment_epoch = assignment_epoch + $1, \
             reserved_controls = 0, reserved_splices = 0, reserved_invites = 0, pending_installs = 0, \
             pending_confirmations = 0, migration_leases = 0, updated_at = $2",
            params![j, now],
        )
        .await?;
    for (sql, values) in settle_steps(j, now) {
        tx.execute(sql, &values).await?;
    }
    tx.execute_batch(&format!("DROP TABLE {MARKER_TABLE}"))
        .await?;
    tx.commit().await?;
    Ok(Some(Settled {
        taken_at,
        jump: j,
        hosts,
    }))
}

/// The settle's statements after the epoch jump, with their parameters: leases, cell
/// reservations and connection reservations cleared, open migrations and rehome attempts
/// aborted, decision and control generations advanced by the jump, credentials in flight ended.
fn settle_steps(j: i64, now: i64) -> Vec<(&'static str, Vec<crate::store::Value>)> {
    use crate::store::Value;
    let (jv, nowv, why) = (Value::from(j), Value::from(now), Value::from(ABORT_REASON));
    vec![
        ("DELETE FROM relay_assignment_activity_leases", vec![]),
        (
            "UPDATE relay_cells SET reserved_requests = 0, updated_at = $1",
            vec![nowv.clone()],
        ),
        (
            "UPDATE relay_connection_reservations SET state = 'released', released_at = $1 \
             WHERE state <> 'released'",
            vec![nowv.clone()],
        ),
        (
            "UPDATE relay_assignment_migrations SET aborted_at = $1, abort_reason = $2, updated_at = $1 \
             WHERE completed_at IS NULL AND aborted_at IS NULL",
            vec![nowv.clone(), why.clone()],
        ),
        (
            "UPDATE relay_region_rehome_attempts SET aborted_at = $1, abort_reason = $2, updated_at = $1 \
             WHERE completed_at IS NULL AND aborted_at IS NULL",
            vec![nowv.clone(), why],
        ),
        (
            "UPDATE relay_region_decisions SET generation = generation + $1, \
             assignment_epoch = assignment_epoch + $1, updated_at = $2",
            vec![jv.clone(), nowv.clone()],
        ),
        (
            "UPDATE relay_region_rehome_control SET generation = generation + $1, updated_at = $2",
            vec![jv, nowv.clone()],
        ),
        (
            "UPDATE relay_invites SET state = 'invalidated', updated_at = $1 \
             WHERE state IN ('available', 'reserved', 'cooldown')",
            vec![nowv],
        ),
        (
            "UPDATE relay_connection_bases SET active = 0 WHERE active = 1",
            vec![],
        ),
        (
            "DELETE FROM relay_direct_authorizations WHERE consumed_at IS NULL",
            vec![],
        ),
    ]
}
