//! Reads behind the operator views (docs/reference/http.md Cell and HostView objects, docs/reference/http.md
//! overview): plain reads outside any transaction, returned as model types and counts. The rules
//! that classify them (dormant, live, roll-isolated) stay with the director.

use super::assignments::{lease_from, row_from, LEASE_COLUMNS, ROW_COLUMNS};
use super::{Db, DbError, Row};
use crate::model::{AssignmentRow, HostKey, Lease};
use crate::params;

fn counts(rows: &[Row]) -> Vec<(String, i64)> {
    rows.iter().map(|r| (r.str(0), r.i64(1))).collect()
}

/// Per-cell counts behind the Cell object.
#[derive(Debug, Clone, Default)]
pub struct CellCounts {
    /// Assignment rows homed on each cell.
    pub assignments: Vec<(String, i64)>,
    /// Open migrations into each cell.
    pub migrations_in: Vec<(String, i64)>,
    /// Open migrations out of each cell.
    pub migrations_out: Vec<(String, i64)>,
    /// `(cell_id, created_at, updated_at)` of each cell row.
    pub times: Vec<(String, i64, i64)>,
}

pub async fn cell_counts(db: &Db) -> Result<CellCounts, DbError> {
    let assignments = db
        .query(
            "SELECT cell_id, COUNT(*) FROM relay_assignments GROUP BY cell_id",
            &[],
        )
        .await?;
    let mig_in = db
        .query(
            "SELECT target_cell_id, COUNT(*) FROM relay_assignment_migrations \
             WHERE completed_at IS NULL AND aborted_at IS NULL GROUP BY target_cell_id",
            &[],
        )
        .await?;
    let mig_out = db
        .query(
            "SELECT source_cell_id, COUNT(*) FROM relay_assignment_migrations \
             WHERE completed_at IS NULL AND aborted_at IS NULL GROUP BY source_cell_id",
            &[],
        )
        .await?;
    let times = db
        .query(
            "SELECT cell_id, created_at, updated_at FROM relay_cells",
            &[],
        )
        .await?;
    Ok(CellCounts {
        assignments: counts(&assignments),
        migrations_in: counts(&mig_in),
        migrations_out: counts(&mig_out),
        times: times
            .iter()
            .map(|r| (r.str(0), r.i64(1), r.i64(2)))
            .collect(),
    })
}

/// The assignment rows of `relay_host_id` (optionally one user), by `userId`.
pub async fn host_rows(
    db: &Db,
    relay_host_id: &str,
    user: Option<&str>,
) -> Result<Vec<(HostKey, AssignmentRow)>, DbError> {
    let rows = db
        .query(
            &format!(
                "SELECT user_id, {ROW_COLUMNS} FROM relay_assignments WHERE relay_host_id = $1 \
                 AND (CAST($2 AS TEXT) IS NULL OR user_id = CAST($2 AS TEXT)) ORDER BY user_id"
            ),
            params![relay_host_id, user],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let host = HostKey {
                user_id: r.str(0),
                relay_host_id: relay_host_id.to_string(),
            };
            (host, row_from(&Row(r.0[1..].to_vec())))
        })
        .collect())
}

/// The host's leases by activity id (plain read).
pub async fn leases(db: &Db, host: &HostKey) -> Result<Vec<Lease>, DbError> {
    Ok(db
        .query(
            &format!(
                "SELECT {LEASE_COLUMNS} FROM relay_assignment_activity_leases WHERE user_id = $1 AND relay_host_id = $2 ORDER BY activity_id"
            ),
            params![&host.user_id, &host.relay_host_id],
        )
        .await?
        .iter()
        .map(lease_from)
        .collect())
}

/// Every assignment row (the overview classifies them with the director's dormancy rule).
pub async fn all_rows(db: &Db) -> Result<Vec<AssignmentRow>, DbError> {
    Ok(db
        .query(&format!("SELECT {ROW_COLUMNS} FROM relay_assignments"), &[])
        .await?
        .iter()
        .map(row_from)
        .collect())
}

/// Open migrations in all.
pub async fn open_migration_count(db: &Db) -> Result<i64, DbError> {
    Ok(db
        .query(
            "SELECT COUNT(*) FROM relay_assignment_migrations WHERE completed_at IS NULL AND aborted_at IS NULL",
            &[],
        )
        .await?
        .first()
        .map_or(0, |r| r.i64(0)))
}

/// The global regional-rehome switch.
pub async fn rehome_enabled(db: &Db) -> Result<bool, DbError> {
    Ok(db
        .query(
            "SELECT enabled FROM relay_region_rehome_control WHERE control_id = 'global'",
            &[],
        )
        .await?
        .first()
        .is_some_and(|r| r.bool(0)))
}
