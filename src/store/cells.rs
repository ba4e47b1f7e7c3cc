//! Cell rows, runtime rows and fences (ARCHITECTURE.md / docs/reference/http.md / docs/operations.md): reads into the plain
//! [`CellView`] the placement rules take, the row writes of the heartbeat transaction (which the
//! director's heartbeat service composes), cell upserts and state changes.

use super::{Db, DbError, Row, Tx, Value};
pub use crate::model::{Admission, Beat, BeatTelemetry, CellView, Fence, Runtime, Telemetry};
use crate::params;

/// Columns of a cell row, in the order [`cell_from_row`] reads them.
const CELL_COLUMNS: &str = "cell_id, cell_url, region, capacity_requests, reserved_requests, \
     admission_state, roll_isolated_at, connection_hard_cap, connection_unobserved_bound";
const RUNTIME_COLUMNS: &str = "cell_id, cell_incarnation, started_at, ready, observed_requests, \
     last_heartbeat_at, total_connections, in_flight_connections, reserved_connection_units, \
     enforced_connection_units, connection_inclusion_watermark, connection_observed_at, \
     regional_rehome_protocol, safety_json, safety_received_at";

/// Which cell rows to read.
#[derive(Debug, Clone, Copy)]
pub enum Which<'a> {
    All,
    General,
    One(&'a str),
    /// Two cells (source and target), locked together in one statement.
    Pair(&'a str, &'a str),
    /// The `general` cells other than `exclude`, inside `region` (`inside`) or outside it: the
    /// narrow isolated-replacement path (ARCHITECTURE.md I).
    Region {
        region: &'a str,
        exclude: &'a str,
        inside: bool,
    },
}

/// Either a plain read on the pool or a read inside a transaction.
pub enum Reader<'a> {
    Db(&'a Db),
    Tx(&'a mut Tx),
}

impl Reader<'_> {
    pub async fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        match self {
            Reader::Db(db) => db.query(sql, params).await,
            Reader::Tx(tx) => tx.query(sql, params).await,
        }
    }
}

fn cell_from_row(r: &Row) -> CellView {
    CellView {
        cell_id: r.str(0),
        cell_url: r.str(1),
        region: r.str(2),
        capacity_requests: r.i64(3),
        reserved_requests: r.i64(4),
        admission: Admission::parse(&r.str(5)).unwrap_or(Admission::ExistingOnly),
        roll_isolated_at: r.opt_i64(6),
        connection_hard_cap: r.opt_i64(7),
        connection_unobserved_bound: r.opt_i64(8),
        runtime: None,
        fence: None,
        outstanding: 0,
    }
}

fn runtime_from_row(r: &Row) -> Runtime {
    let telemetry = match (r.opt_i64(6), r.opt_i64(9), r.opt_i64(10), r.opt_i64(11)) {
        (Some(total), Some(enforced), Some(watermark), Some(observed_at)) => Some(Telemetry {
            total_connections: total,
            in_flight_connections: r.i64(7),
            reserved_connection_units: r.i64(8),
            enforced_connection_units: enforced,
            inclusion_watermark: watermark,
            observed_at,
        }),
        _ => None,
    };
    Runtime {
        cell_incarnation: r.str(1),
        started_at: r.i64(2),
        ready: r.bool(3),
        observed_requests: r.i64(4),
        last_heartbeat_at: r.i64(5),
        telemetry,
        regional_rehome_protocol: r.i64(12),
        safety_json: r.opt_str(13),
        safety_received_at: r.opt_i64(14),
    }
}

/// The `WHERE` clause of the cell rows `which` names, with its parameters.
fn cell_filter(which: Which<'_>) -> (&'static str, Vec<Value>) {
    match which {
        Which::All => ("", vec![]),
        Which::General => (" WHERE admission_state = 'general'", vec![]),
        Which::One(id) => (" WHERE cell_id = $1", vec![Value::from(id)]),
        Which::Pair(a, b) => (
            " WHERE cell_id IN ($1, $2)",
            vec![Value::from(a), Value::from(b)],
        ),
        Which::Region {
            region,
            exclude,
            inside,
        } => (
            if inside {
                " WHERE admission_state = 'general' AND cell_id <> $1 AND region = $2"
            } else {
                " WHERE admission_state = 'general' AND cell_id <> $1 AND region <> $2"
            },
            vec![Value::from(exclude), Value::from(region)],
        ),
    }
}

/// Reads cells with runtime, fence and outstanding reservations, ascending by `cell_id`. With
/// `lock`, the cell rows are locked in one statement (tier 4); runtime, fence and reservation
/// reads are plain (ARCHITECTURE.md).
pub async fn views(
    mut r: Reader<'_>,
    which: Which<'_>,
    lock: bool,
) -> Result<Vec<CellView>, DbError> {
    let (filter, p) = cell_filter(which);
    if !lock {
        return joined_views(r, filter, &p).await;
    }
    let lock_sql = " FOR UPDATE";
    let rows = r
        .query(
            &format!("SELECT {CELL_COLUMNS} FROM relay_cells{filter} ORDER BY cell_id{lock_sql}"),
            &p,
        )
        .await?;
    let mut cells: Vec<CellView> = rows.iter().map(cell_from_row).collect();
    if cells.is_empty() {
        return Ok(cells);
    }
    let rt_filter = match which {
        Which::One(_) => " WHERE cell_id = $1",
        Which::Pair(..) => " WHERE cell_id IN ($1, $2)",
        _ => "",
    };
    let p: Vec<Value> = match which {
        Which::One(_) | Which::Pair(..) => p,
        _ => vec![],
    };
    let runtimes = r
        .query(
            &format!("SELECT {RUNTIME_COLUMNS} FROM relay_cell_runtime{rt_filter}"),
            &p,
        )
        .await?;
    let fences = r
        .query(
            &format!(
                "SELECT cell_id, cell_incarnation, attested_at, expires_at FROM relay_cell_fences{rt_filter}"
            ),
            &p,
        )
        .await?;
    let outstanding = r
        .query(
            &format!(
                "SELECT cell_id, COUNT(*) FROM relay_connection_reservations WHERE state IN ('reserved', 'claimed'){} GROUP BY cell_id",
                match which {
                    Which::One(_) => " AND cell_id = $1",
                    Which::Pair(..) => " AND cell_id IN ($1, $2)",
                    _ => "",
                }
            ),
            &p,
        )
        .await?;
    for c in &mut cells {
        c.runtime = runtimes
            .iter()
            .find(|x| x.str(0) == c.cell_id)
            .map(runtime_from_row);
        c.fence = fences
            .iter()
            .find(|x| x.str(0) == c.cell_id)
            .map(|x| Fence {
                cell_incarnation: x.str(1),
                attested_at: x.i64(2),
                expires_at: x.i64(3),
            });
        c.outstanding = outstanding
            .iter()
            .find(|x| x.str(0) == c.cell_id)
            .map_or(0, |x| x.i64(1));
    }
    Ok(cells)
}

/// One cell, read inside a transaction without locking it.
pub async fn view_in(tx: &mut Tx, cell_id: &str) -> Result<Option<CellView>, DbError> {
    Ok(views(Reader::Tx(tx), Which::One(cell_id), false)
        .await?
        .into_iter()
        .next())
}

/// One cell (plain read).
pub async fn view(db: &Db, cell_id: &str) -> Result<Option<CellView>, DbError> {
    Ok(views(Reader::Db(db), Which::One(cell_id), false)
        .await?
        .into_iter()
        .next())
}

// ---------------------------------------------------------------------------------------------------
// Heartbeats (docs/reference/http.md): the primitives of the director's heartbeat transaction.

/// Locks the cell row (tier 4) and reads it without runtime or fence.
pub async fn lock_cell(tx: &mut Tx, cell_id: &str) -> Result<Option<CellView>, DbError> {
    Ok(tx
        .query_opt(
            &format!("SELECT {CELL_COLUMNS} FROM relay_cells WHERE cell_id = $1 FOR UPDATE"),
            params![cell_id],
        )
        .await?
        .map(|r| cell_from_row(&r)))
}

/// Locks and reads the cell's runtime row.
pub async fn lock_runtime(tx: &mut Tx, cell_id: &str) -> Result<Option<Runtime>, DbError> {
    Ok(tx
        .query_opt(
            &format!(
                "SELECT {RUNTIME_COLUMNS} FROM relay_cell_runtime WHERE cell_id = $1 FOR UPDATE"
            ),
            params![cell_id],
        )
        .await?
        .map(|r| runtime_from_row(&r)))
}

/// Writes the runtime row of an accepted beat: inserts it when `insert`, else updates it, clearing
/// the regional-rehome protocol and safety report when `reset` (a new process).
pub async fn write_runtime(
    tx: &mut Tx,
    beat: &Beat,
    insert: bool,
    reset: bool,
    now: i64,
) -> Result<(), DbError> {
    let t = beat.telemetry;
    let (total, in_flight, reserved, enforced, watermark) = (
        t.map(|t| t.total_connections),
        t.map(|t| t.in_flight_connections),
        t.map(|t| t.reserved_connection_units),
        t.map(|t| t.enforced_connection_units),
        t.map(|t| t.connection_inclusion_watermark),
    );
    let observed_at = t.map(|_| now);
    if insert {
        tx.execute(
            "INSERT INTO relay_cell_runtime (cell_id, cell_incarnation, started_at, ready, observed_requests, \
             last_heartbeat_at, total_connections, in_flight_connections, reserved_connection_units, \
             enforced_connection_units, connection_inclusion_watermark, connection_observed_at, \
             regional_rehome_protocol, safety_json, safety_received_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 0, NULL, NULL, $6)",
            params![
                &beat.cell_id,
                &beat.cell_incarnation,
                beat.started_at,
                beat.ready,
                beat.observed_requests,
                now,
                total,
                in_flight,
                reserved,
                enforced,
                watermark,
                observed_at
            ],
        )
        .await?;
    } else {
        tx.execute(
            "UPDATE relay_cell_runtime SET cell_incarnation = $2, started_at = $3, ready = $4, \
             observed_requests = $5, last_heartbeat_at = $6, total_connections = $7, in_flight_connections = $8, \
             reserved_connection_units = $9, enforced_connection_units = $10, connection_inclusion_watermark = $11, \
             connection_observed_at = $12, updated_at = $6, \
             regional_rehome_protocol = CASE WHEN $13 THEN 0 ELSE regional_rehome_protocol END, \
             safety_json = CASE WHEN $13 THEN NULL ELSE safety_json END, \
             safety_received_at = CASE WHEN $13 THEN NULL ELSE safety_received_at END \
             WHERE cell_id = $1",
            params![
                &beat.cell_id,
                &beat.cell_incarnation,
                beat.started_at,
                beat.ready,
                beat.observed_requests,
                now,
                total,
                in_flight,
                reserved,
                enforced,
                watermark,
                observed_at,
                reset
            ],
        )
        .await?;
    }
    Ok(())
}

/// Stores the cell's regional-rehome protocol and safety report (docs/reference/http.md).
pub async fn set_rehome_status(
    tx: &mut Tx,
    cell_id: &str,
    protocol: i64,
    safety_json: &str,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_cell_runtime SET regional_rehome_protocol = $2, safety_json = $3, \
         safety_received_at = $4, updated_at = $4 WHERE cell_id = $1",
        params![cell_id, protocol, safety_json, now],
    )
    .await?;
    Ok(())
}

/// Deletes the cell's fence inside the caller's transaction (which holds the cell row).
pub async fn delete_fence_in(tx: &mut Tx, cell_id: &str) -> Result<(), DbError> {
    tx.execute(
        "DELETE FROM relay_cell_fences WHERE cell_id = $1",
        params![cell_id],
    )
    .await?;
    Ok(())
}

///: claimed reservations of this cell that a beat accounts for (same incarnation and
/// watermark ≤ W) or that belong to another incarnation → `released`.
pub async fn release_settled_reservations(
    db: &Db,
    cell_id: &str,
    incarnation: &str,
    watermark: Option<i64>,
    now: i64,
) -> Result<(), DbError> {
    db.execute(
        "UPDATE relay_connection_reservations SET state = 'released', released_at = $4 \
         WHERE cell_id = $1 AND state = 'claimed' AND (cell_incarnation IS NULL OR cell_incarnation <> $2 \
         OR (CAST($3 AS BIGINT) IS NOT NULL AND inclusion_watermark IS NOT NULL AND inclusion_watermark <= CAST($3 AS BIGINT)))",
        params![cell_id, incarnation, watermark, now],
    )
    .await?;
    Ok(())
}

/// Deletes the cell's fence in a small transaction of its own (cell row first).
pub async fn delete_fence(db: &Db, cell_id: &str) -> Result<(), DbError> {
    crate::transaction!(db, "cell-runtime", |tx| {
        tx.query(
            "SELECT cell_id FROM relay_cells WHERE cell_id = $1 FOR UPDATE",
            params![cell_id],
        )
        .await?;
        delete_fence_in(tx, cell_id).await?;
        Ok::<_, DbError>(())
    })
}

// ---------------------------------------------------------------------------------------------------
// Upserts and admission (docs/reference/http.md)

/// A cell as registered by `cells`, `ORCA_RELAY_CELLS` or the local cell.
#[derive(Debug, Clone)]
pub struct CellSpec {
    pub cell_id: String,
    pub cell_url: String,
    pub region: String,
    pub capacity_requests: i64,
    pub cap_and_bound: Option<(i64, i64)>,
    pub initial_state: Admission,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellError {
    NotFound,
    Refused(&'static str),
    Db(DbError),
}

impl From<DbError> for CellError {
    fn from(e: DbError) -> Self {
        CellError::Db(e)
    }
}

impl super::RetryClass for CellError {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            CellError::Db(e) => e.retry_code(),
            _ => None,
        }
    }
    fn db_error(&self) -> Option<&crate::store::DbError> {
        match self {
            CellError::Db(e) => Some(e),
            _ => None,
        }
    }
}

/// Creates the cell or updates URL, region, capacity, cap and bound (never the state or stamp).
/// Returns `created`. A changed cap or bound nulls the runtime telemetry.
pub async fn upsert_in(tx: &mut Tx, spec: &CellSpec, now: i64) -> Result<bool, CellError> {
    let other = tx
        .query_opt(
            "SELECT cell_id FROM relay_cells WHERE cell_url = $1 AND cell_id <> $2",
            params![&spec.cell_url, &spec.cell_id],
        )
        .await?;
    if other.is_some() {
        return Err(CellError::Refused("cell_url_conflict"));
    }
    let existing = tx
        .query_opt(
            "SELECT connection_hard_cap, connection_unobserved_bound FROM relay_cells WHERE cell_id = $1 FOR UPDATE",
            params![&spec.cell_id],
        )
        .await?;
    let (cap, bound) = match spec.cap_and_bound {
        Some((c, b)) => (Some(c), Some(b)),
        None => (None, None),
    };
    let res = match existing {
        None => {
            tx.execute(
                "INSERT INTO relay_cells (cell_id, cell_url, region, capacity_requests, reserved_requests, \
                 admission_state, roll_isolated_at, connection_hard_cap, connection_unobserved_bound, \
                 admission_changed_at, created_at, updated_at) VALUES ($1, $2, $3, $4, 0, $5, NULL, $6, $7, $8, $8, $8)",
                params![
                    &spec.cell_id,
                    &spec.cell_url,
                    &spec.region,
                    spec.capacity_requests,
                    spec.initial_state.as_str(),
                    cap,
                    bound,
                    now
                ],
            )
            .await
            .map(|_| true)
        }
        Some(r) => {
            let changed = r.opt_i64(0) != cap || r.opt_i64(1) != bound;
            let res = tx
                .execute(
                    "UPDATE relay_cells SET cell_url = $2, region = $3, capacity_requests = $4, \
                     connection_hard_cap = $5, connection_unobserved_bound = $6, updated_at = $7 WHERE cell_id = $1",
                    params![
                        &spec.cell_id,
                        &spec.cell_url,
                        &spec.region,
                        spec.capacity_requests,
                        cap,
                        bound,
                        now
                    ],
                )
                .await;
            if res.is_ok() && changed {
                null_telemetry(tx, &spec.cell_id, now).await?;
            }
            res.map(|_| false)
        }
    };
    match res {
        Ok(created) => Ok(created),
        Err(DbError::UniqueViolation) => Err(CellError::Refused("cell_url_conflict")),
        Err(e) => Err(e.into()),
    }
}

async fn null_telemetry(tx: &mut Tx, cell_id: &str, now: i64) -> Result<(), DbError> {
    tx.execute(
        "UPDATE relay_cell_runtime SET total_connections = NULL, in_flight_connections = NULL, \
         reserved_connection_units = NULL, enforced_connection_units = NULL, \
         connection_inclusion_watermark = NULL, connection_observed_at = NULL, updated_at = $2 WHERE cell_id = $1",
        params![cell_id, now],
    )
    .await?;
    Ok(())
}

/// Upserts every spec in one transaction (all or nothing).
pub async fn upsert_all(db: &Db, specs: &[CellSpec], now: i64) -> Result<Vec<bool>, CellError> {
    crate::transaction!(db, "cells", |tx| {
        let mut out = Vec::new();
        let mut sorted: Vec<&CellSpec> = specs.iter().collect();
        sorted.sort_by(|a, b| a.cell_id.cmp(&b.cell_id));
        for s in sorted {
            out.push(upsert_in(tx, s, now).await?);
        }
        Ok::<_, CellError>(out)
    })
}

/// `cell-state`: sets the admission state and the roll stamp by the table. Leaving
/// `existing-only` deletes the fence.
pub async fn set_state(
    db: &Db,
    cell_id: &str,
    state: Admission,
    roll_isolated: Option<bool>,
    roll_isolated_at: Option<i64>,
    now: i64,
) -> Result<(), CellError> {
    crate::transaction!(db, "cells", |tx| {
        let row = tx
            .query_opt(
                "SELECT admission_state, roll_isolated_at FROM relay_cells WHERE cell_id = $1 FOR UPDATE",
                params![cell_id],
            )
            .await?
            .ok_or(CellError::NotFound)?;
        let old_state = Admission::parse(&row.str(0)).unwrap_or(Admission::General);
        let old_stamp = row.opt_i64(1);
        let stamp = match (state, roll_isolated) {
            (Admission::MigrationOnly, Some(true)) => old_stamp.or(roll_isolated_at).or(Some(now)),
            (Admission::MigrationOnly, Some(false)) => None,
            (Admission::MigrationOnly, None) => old_stamp,
            _ => None,
        };
        tx.execute(
            "UPDATE relay_cells SET admission_state = $2, roll_isolated_at = $3, updated_at = $4, \
             admission_changed_at = CASE WHEN admission_state = $2 THEN admission_changed_at ELSE $4 END \
             WHERE cell_id = $1",
            params![cell_id, state.as_str(), stamp, now],
        )
        .await?;
        if old_state == Admission::ExistingOnly && state != Admission::ExistingOnly {
            tx.execute(
                "DELETE FROM relay_cell_fences WHERE cell_id = $1",
                params![cell_id],
            )
            .await?;
        }
        Ok::<_, CellError>(())
    })
}

/// `cell-fence`: writes `fence` when the cell is `existing-only` and its runtime row belongs
/// to the fence's incarnation and was last heard at or before `heard_by` (the caller's staleness
/// bound).
pub async fn attest_fence(
    db: &Db,
    cell_id: &str,
    fence: &Fence,
    heard_by: i64,
) -> Result<Fence, CellError> {
    let incarnation = fence.cell_incarnation.as_str();
    crate::transaction!(db, "cells", |tx| {
        let row = tx
            .query_opt(
                "SELECT admission_state FROM relay_cells WHERE cell_id = $1 FOR UPDATE",
                params![cell_id],
            )
            .await?
            .ok_or(CellError::NotFound)?;
        if row.str(0) != "existing-only" {
            return Err(CellError::Refused("cell_fence_admission_enabled"));
        }
        let rt = tx
            .query_opt(
                "SELECT cell_incarnation, last_heartbeat_at FROM relay_cell_runtime WHERE cell_id = $1 FOR UPDATE",
                params![cell_id],
            )
            .await?;
        let rt = match rt {
            Some(r) if r.str(0) == incarnation => r,
            _ => return Err(CellError::Refused("cell_fence_runtime_mismatch")),
        };
        if rt.i64(1) > heard_by {
            return Err(CellError::Refused("cell_fence_runtime_not_stale"));
        }
        tx.execute(
            "INSERT INTO relay_cell_fences (cell_id, cell_incarnation, attested_at, expires_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (cell_id) DO UPDATE SET cell_incarnation = $2, attested_at = $3, expires_at = $4",
            params![cell_id, incarnation, fence.attested_at, fence.expires_at],
        )
        .await?;
        Ok(fence.clone())
    })
}

/// Locks the given cell rows in one statement, ascending (tier 4).
pub async fn lock_cells(tx: &mut Tx, ids: &[String]) -> Result<(), DbError> {
    let mut ids: Vec<&String> = ids.iter().collect();
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        return Ok(());
    }
    let marks: Vec<String> = (1..=ids.len()).map(|i| format!("${i}")).collect();
    let p: Vec<Value> = ids.iter().map(|s| Value::from(s.as_str())).collect();
    tx.query(
        &format!(
            "SELECT cell_id FROM relay_cells WHERE cell_id IN ({}) ORDER BY cell_id FOR UPDATE",
            marks.join(", ")
        ),
        &p,
    )
    .await?;
    Ok(())
}

/// The select list of a cell read with its runtime, fence and outstanding reservation count:
/// [`JOINED_WIDTH`] columns over [`JOINED_FROM`] (cell `c`, runtime `r`, fence `f`), parsed by
/// [`joined_from_row`]. The sticky grant's one locking read embeds it.
pub(crate) fn joined_columns() -> String {
    let cols: String = CELL_COLUMNS
        .split(", ")
        .map(|c| format!("c.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ");
    let rt: String = RUNTIME_COLUMNS
        .split(", ")
        .map(|c| format!("r.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{cols}, {rt}, f.cell_incarnation, f.attested_at, f.expires_at, \
         (SELECT COUNT(*) FROM relay_connection_reservations x WHERE x.cell_id = c.cell_id AND x.state IN ('reserved', 'claimed'))"
    )
}

/// The joins [`joined_columns`] reads from, after `relay_cells c`.
pub(crate) const JOINED_FROM: &str = "LEFT JOIN relay_cell_runtime r ON r.cell_id = c.cell_id \
     LEFT JOIN relay_cell_fences f ON f.cell_id = c.cell_id";

/// Columns of [`joined_columns`].
pub(crate) const JOINED_WIDTH: usize = N + M + 4;
const N: usize = 9;
const M: usize = 15;

/// A [`CellView`] from the [`joined_columns`] of `row`.
pub(crate) fn joined_from_row(row: &Row) -> CellView {
    let mut c = cell_from_row(row);
    if !row.is_null(N) {
        c.runtime = Some(runtime_from_row(&Row(row.0[N..N + M].to_vec())));
    }
    if !row.is_null(N + M) {
        c.fence = Some(Fence {
            cell_incarnation: row.str(N + M),
            attested_at: row.i64(N + M + 1),
            expires_at: row.i64(N + M + 2),
        });
    }
    c.outstanding = row.i64(N + M + 3);
    c
}

/// The plain-read form of [`views`]: one statement joining runtime, fence and the outstanding
/// reservation count (the hot sticky path reads a home this way several times per request).
async fn joined_views(
    mut r: Reader<'_>,
    filter: &str,
    p: &[Value],
) -> Result<Vec<CellView>, DbError> {
    let filter = filter
        .replace("cell_id", "c.cell_id")
        .replace("admission_state", "c.admission_state");
    let rows = r
        .query(
            &format!(
                "SELECT {} FROM relay_cells c {JOINED_FROM}{filter} ORDER BY c.cell_id",
                joined_columns()
            ),
            p,
        )
        .await?;
    Ok(rows.iter().map(joined_from_row).collect())
}
