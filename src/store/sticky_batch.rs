//! The sticky lane's batched grant (docs/scaling.md): many hosts' sticky reads and grants in one
//! transaction, so a storm of reconnecting hosts costs one commit per batch instead of one per
//! host.
//!
//! The rows are those of the single grant ([`lock_sticky`], [`stamp_grant`]) and locked in the
//! same order: every host's assignment row first, then the leases, open migrations and live
//! reservations of the rows held, the home cell rows read plainly. A row locked elsewhere is
//! skipped (`SKIP LOCKED`, the batch's form of the single grant's `NOWAIT`): nothing is read or
//! written for it, and the caller serves it on the single path, which sees it busy.
//!
//! [`lock_sticky`]: super::assignments::lock_sticky
//! [`stamp_grant`]: super::assignments::stamp_grant

use std::collections::HashMap;
use std::sync::OnceLock;

use super::assignments::{StickyRead, LEASE_COLUMNS, LEASE_TTL_MS, MIGRATION_COLUMNS, ROW_COLUMNS};
use super::{DbError, DbKind, Tx};
use crate::model::{HostKey, HostView, LeaseCounts};
use crate::params;

/// The rows of a JSON array of arrays passed as the statement's one parameter (`$1`), as a table
/// `x` whose column `value` is one inner array (`x.value ->> i` is its i-th element as text).
fn json_table(kind: DbKind) -> &'static str {
    match kind {
        DbKind::Postgres => "json_array_elements(CAST(CAST($1 AS TEXT) AS json)) AS x(value)",
        DbKind::Sqlite => "json_each($1) AS x",
    }
}

/// `[[user_id, relay_host_id], …]`.
fn hosts_param(hosts: &[HostKey]) -> String {
    let v: Vec<[&str; 2]> = hosts
        .iter()
        .map(|h| [h.user_id.as_str(), h.relay_host_id.as_str()])
        .collect();
    serde_json::json!(v).to_string()
}

/// The one statement of [`lock_sticky_many`]: [`lock_sticky`](super::assignments::lock_sticky)'s
/// statement over a list of hosts, one answer row per row held.
fn many_sql(kind: DbKind) -> &'static str {
    static PG: OnceLock<String> = OnceLock::new();
    static LITE: OnceLock<String> = OnceLock::new();
    let (cell, agg, array) = match kind {
        DbKind::Postgres => (&PG, "json_agg", "json_build_array"),
        DbKind::Sqlite => (&LITE, "json_group_array", "json_array"),
    };
    cell.get_or_init(|| {
        use super::cells::{joined_columns, JOINED_FROM};
        let pre = |cols: &str, p: &str| {
            cols.split(", ")
                .map(|c| format!("{p}.{}", c.trim()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let held = "(user_id, relay_host_id) IN (SELECT user_id, relay_host_id FROM sticky_row)";
        let same = |a: &str| format!("{a}.user_id = s.user_id AND {a}.relay_host_id = s.relay_host_id");
        format!(
            "WITH wanted AS (SELECT x.value ->> 0 AS user_id, x.value ->> 1 AS relay_host_id FROM {table}), \
             sticky_row AS (SELECT user_id, relay_host_id, {ROW_COLUMNS} FROM relay_assignments \
               WHERE (user_id, relay_host_id) IN (SELECT user_id, relay_host_id FROM wanted) \
               ORDER BY user_id, relay_host_id FOR UPDATE SKIP LOCKED), \
             sticky_leases AS (SELECT user_id, relay_host_id, {LEASE_COLUMNS} FROM relay_assignment_activity_leases \
               WHERE {held} ORDER BY user_id, relay_host_id, activity_id FOR UPDATE), \
             sticky_migrations AS (SELECT user_id, relay_host_id, {MIGRATION_COLUMNS} FROM relay_assignment_migrations \
               WHERE completed_at IS NULL AND aborted_at IS NULL AND {held} \
               ORDER BY user_id, relay_host_id, assignment_epoch DESC FOR UPDATE), \
             sticky_reservations AS (SELECT user_id, relay_host_id FROM relay_connection_reservations \
               WHERE state <> 'released' AND {held} FOR UPDATE) \
             SELECT s.user_id, s.relay_host_id, {row}, {cells}, \
               (SELECT CAST({agg}({array}({lease})) AS TEXT) FROM sticky_leases l WHERE {sl}), \
               (SELECT CAST({agg}({array}({mig})) AS TEXT) FROM sticky_migrations m WHERE {sm}), \
               (SELECT COUNT(*) FROM sticky_reservations v WHERE {sv}) \
             FROM sticky_row s LEFT JOIN relay_cells c ON c.cell_id = s.cell_id {JOINED_FROM}",
            table = json_table(kind),
            row = pre(ROW_COLUMNS, "s"),
            cells = joined_columns(),
            lease = pre(LEASE_COLUMNS, "l"),
            mig = pre(MIGRATION_COLUMNS, "m"),
            sl = same("l"),
            sm = same("m"),
            sv = same("v"),
        )
    })
}

/// The sticky read of every host in `hosts` whose assignment row this transaction could lock
/// without waiting, in one statement and one round trip (a host with no row, or whose row is
/// locked elsewhere, is absent). Correct only inside the transaction that then writes the grants.
pub async fn lock_sticky_many(
    tx: &mut Tx,
    hosts: &[HostKey],
) -> Result<HashMap<HostKey, StickyRead>, DbError> {
    if hosts.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = tx
        .query(many_sql(tx.kind()), params![hosts_param(hosts)])
        .await?;
    let mut out = HashMap::with_capacity(rows.len());
    for r in &rows {
        let host = HostKey {
            user_id: r.str(0),
            relay_host_id: r.str(1),
        };
        out.insert(host, super::assignments::sticky_read_at(r, 2)?);
    }
    Ok(out)
}

/// One host's grant for [`stamp_grants`]: its locked view and the request's `preferredRegion`.
pub struct Stamp<'a> {
    pub host: &'a HostKey,
    pub hv: &'a HostView,
    pub preferred_region: Option<&'a str>,
}

/// The one statement of [`stamp_grants`]: [`stamp_grant`](super::assignments::stamp_grant)'s
/// `UPDATE` with each row's values from the JSON parameter.
fn stamp_sql(kind: DbKind) -> &'static str {
    static PG: OnceLock<String> = OnceLock::new();
    static LITE: OnceLock<String> = OnceLock::new();
    let cell = match kind {
        DbKind::Postgres => &PG,
        DbKind::Sqlite => &LITE,
    };
    cell.get_or_init(|| {
        let int = |i: usize| format!("CAST(x.value ->> {i} AS BIGINT)");
        format!(
            "UPDATE relay_assignments AS a SET reserved_controls = v.c, reserved_splices = v.s, \
             reserved_invites = v.i, pending_installs = v.n, pending_confirmations = v.f, \
             migration_leases = v.m, \
             lease_expires_at = CASE WHEN a.lease_expires_at >= v.until THEN a.lease_expires_at ELSE v.until END, \
             last_activity_at = v.now, updated_at = v.now, \
             preferred_region = CASE WHEN v.region IS NULL THEN a.preferred_region ELSE v.region END, \
             preferred_region_observed_at = CASE WHEN v.region IS NULL THEN a.preferred_region_observed_at ELSE v.now END \
             FROM (SELECT x.value ->> 0 AS uid, x.value ->> 1 AS hid, {c} AS c, {s} AS s, \
               {i} AS i, {n} AS n, {f} AS f, {m} AS m, {until} AS until, {now} AS now, \
               x.value ->> 10 AS region FROM {table}) AS v \
             WHERE a.user_id = v.uid AND a.relay_host_id = v.hid \
             RETURNING user_id, relay_host_id, lease_expires_at",
            c = int(2),
            s = int(3),
            i = int(4),
            n = int(5),
            f = int(6),
            m = int(7),
            until = int(8),
            now = int(9),
            table = json_table(kind),
        )
    })
}

/// The sticky grants' only write (A.5) for every host of `stamps`, in one statement run as the
/// transaction's last and pipelined with `COMMIT`; returns each host's `lease_expires_at`.
/// Correct only while the caller holds the locks of [`lock_sticky_many`] and wrote no lease since.
pub async fn stamp_grants(
    tx: &mut Tx,
    stamps: &[Stamp<'_>],
    now: i64,
) -> Result<HashMap<HostKey, i64>, DbError> {
    let mut values = Vec::with_capacity(stamps.len());
    for s in stamps {
        let c = LeaseCounts::of_leases(&s.hv.leases);
        let until =
            s.hv.leases
                .iter()
                .map(|l| l.expires_at)
                .fold(now + LEASE_TTL_MS, i64::max);
        values.push(serde_json::json!([
            s.host.user_id,
            s.host.relay_host_id,
            c.controls,
            c.splices,
            c.invites,
            c.installs,
            c.confirmations,
            c.migrations,
            until,
            now,
            s.preferred_region
        ]));
    }
    let param = serde_json::Value::from(values).to_string();
    let rows = tx.finish_with(stamp_sql(tx.kind()), params![param]).await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                HostKey {
                    user_id: r.str(0),
                    relay_host_id: r.str(1),
                },
                r.i64(2),
            )
        })
        .collect())
}
