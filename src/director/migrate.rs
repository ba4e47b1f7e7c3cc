//! The director's migrate service: evacuations and migrations (docs/operations.md) and the per-host
//! sweep steps. Each transaction locks the assignment row first, then the host's rows, then
//! the cells it touches in one statement (through the store's primitives), asks the pure rules and
//! writes what they decide; events are logged after commit.

use serde_json::{json, Value as Json};

use super::assign::CELL_WAIT_MS;
use super::liveness::{Admission, CellView};
use super::placement::{select, HostView, Scope};
use crate::model::{ActivityId, HostKey, Lease, LeaseKind, Migration, OpenMigration};
use crate::store::assignments::{
    charge_cell, delete_lease, insert_lease, lock_host as lock_host_rows, lock_leases, move_row,
    refresh_row, release_epoch_reservations, reserve_connection, set_lease_expiry,
};
use crate::store::cells::{self, lock_cells, Reader, Which};
use crate::store::migrations::{
    self as rows, abort_migration, hosts_without_migration, NewEvacuation, OpenFilter,
};
use crate::store::{Db, DbError, RetryClass, Tx};

/// Migration window of an evacuation and lease lifetime of its leases.
pub const EVACUATION_WINDOW_MS: i64 = 900_000;
/// A migration older than this is settled by `expire-aged-migrations`.
pub const MIGRATION_MAX_AGE_MS: i64 = 86_400_000;

/// Grace past a reservation's timeout before `release-connection-reservations` frees it: late
/// arrivals stay counted 10 min.
pub const RESERVATION_LATE_GRACE_MS: i64 = 600_000;
/// Age past expiry at which `release-expired-region-decisions` deletes a decision.
pub const REGION_DECISION_RETENTION_MS: i64 = 30 * 86_400_000;
/// Items per sweep step.
pub const SWEEP_BATCH: i64 = 100;
/// Expired leases per `release-expired-activity-leases` pass.
pub const EXPIRED_LEASE_BATCH: i64 = 500;

/// The Migration object.
pub fn migration_json(m: &Migration) -> Json {
    json!({
        "userId": m.host.user_id,
        "relayHostId": m.host.relay_host_id,
        "kind": m.kind,
        "sourceCellId": m.source_cell_id,
        "targetCellId": m.target_cell_id,
        "previousEpoch": m.previous_epoch,
        "assignmentEpoch": m.assignment_epoch,
        "sourceRequestUnits": m.source_request_units,
        "targetReservedUnits": m.target_reserved_units,
        "arrivalDeadline": m.arrival_deadline,
        "expiresAt": m.expires_at,
        "targetRegisteredAt": m.target_registered_at,
        "completedAt": m.completed_at,
        "abortedAt": m.aborted_at,
        "abortReason": m.abort_reason,
        "createdAt": m.created_at,
    })
}

/// Refusals of the migration operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationError {
    /// 404 `cell_not_found`.
    CellNotFound,
    /// 409 with this code.
    Refused(&'static str),
    Db(DbError),
}

impl From<DbError> for MigrationError {
    fn from(e: DbError) -> Self {
        MigrationError::Db(e)
    }
}

impl RetryClass for MigrationError {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            MigrationError::Db(e) => e.retry_code(),
            _ => None,
        }
    }
    fn db_error(&self) -> Option<&crate::store::DbError> {
        match self {
            MigrationError::Db(e) => Some(e),
            _ => None,
        }
    }
}

fn busy(e: DbError) -> MigrationError {
    match e {
        DbError::LockUnavailable => MigrationError::Refused("assignment_row_busy"),
        e => MigrationError::Db(e),
    }
}

/// Locks the host's row NOWAIT and its rows; `None` when there is no row.
async fn lock_host(tx: &mut Tx, host: &HostKey) -> Result<Option<HostView>, MigrationError> {
    lock_host_rows(tx, host, None).await.map_err(busy)
}

/// `evacuate` to `target_cell_id`; `target_cell_id` = `None` picks `select(source region,
/// require)` else `select(¬source region)` among candidates for the host's units + 1.
pub async fn evacuate(
    db: &Db,
    host: &HostKey,
    target_cell_id: Option<&str>,
    now: i64,
) -> Result<Json, MigrationError> {
    crate::transaction!(db, "migration", |tx| {
        evacuate_tx(tx, host, target_cell_id, now).await
    })
}

/// One evacuation: an open migration to the same target answers itself (idempotent); otherwise
/// the cells are picked, the move checked, then written, and the new migration returned.
async fn evacuate_tx(
    tx: &mut Tx,
    host: &HostKey,
    target_cell_id: Option<&str>,
    now: i64,
) -> Result<Json, MigrationError> {
    let hv = lock_host(tx, host)
        .await?
        .ok_or(MigrationError::Refused("assignment_not_found"))?;
    if let Some(m) = &hv.open_migration {
        if Some(m.target_cell_id.as_str()) == target_cell_id {
            let r = rows::read(tx, host, m.assignment_epoch)
                .await?
                .ok_or(MigrationError::Refused("migration_in_progress"))?;
            return Ok(migration_json(&r));
        }
        return Err(MigrationError::Refused("migration_in_progress"));
    }
    let source_id = hv.row.cell_id.clone();
    let src = hv.units_on(&source_id);
    tx.set_lock_timeout(CELL_WAIT_MS).await?;
    let (source, target) = evacuation_cells(tx, &source_id, target_cell_id, src, now).await?;
    if let Some(refusal) = evacuation_refusal(source.as_ref(), &target, src, now) {
        return Err(MigrationError::Refused(refusal));
    }
    let e = hv.row.assignment_epoch + 1;
    write_evacuation(
        tx,
        host,
        hv.row.assignment_epoch,
        (source.as_ref(), &source_id),
        &target,
        src,
        now,
    )
    .await?;
    let r = rows::read(tx, host, e)
        .await?
        .ok_or(MigrationError::Refused("migration_not_found"))?;
    Ok(migration_json(&r))
}

/// The source cell (if it still exists) and the target: the named one, or the best cell for
/// the host's units + 1 inside the source's region, else outside it.
async fn evacuation_cells(
    tx: &mut Tx,
    source_id: &str,
    target_cell_id: Option<&str>,
    src: i64,
    now: i64,
) -> Result<(Option<CellView>, CellView), MigrationError> {
    if let Some(t) = target_cell_id {
        let cells = cells::views(Reader::Tx(tx), Which::Pair(source_id, t), true).await?;
        let target = cells
            .iter()
            .find(|c| c.cell_id == t)
            .cloned()
            .ok_or(MigrationError::CellNotFound)?;
        if t == source_id {
            return Err(MigrationError::Refused("target_matches_source"));
        }
        return Ok((cells.into_iter().find(|c| c.cell_id == source_id), target));
    }
    let cells = cells::views(Reader::Tx(tx), Which::All, true).await?;
    let source = cells.iter().find(|c| c.cell_id == source_id).cloned();
    let region = source
        .as_ref()
        .map(|c| c.region.clone())
        .unwrap_or_default();
    let target = select(
        &cells,
        Scope::Require(&region),
        src + 1,
        Some(source_id),
        now,
    )
    .or_else(|| {
        select(
            &cells,
            Scope::Outside(&region),
            src + 1,
            Some(source_id),
            now,
        )
    })
    .cloned()
    .ok_or(MigrationError::Refused("target_cell_unavailable"))?;
    Ok((source, target))
}

/// Why the move of `src` units (+1 for the control) from `source` to `target` is refused, if it
/// is: both cells live, the target admitting with connection headroom and request capacity.
fn evacuation_refusal(
    source: Option<&CellView>,
    target: &CellView,
    src: i64,
    now: i64,
) -> Option<&'static str> {
    if !target.admission.enabled() || !target.live(now) {
        return Some("target_cell_unavailable");
    }
    if !source.is_some_and(|s| s.live(now)) {
        return Some("source_cell_unavailable");
    }
    if !target.headroom(now) {
        return Some("relay_connection_headroom_exhausted");
    }
    if target.reserved_requests + src + 1 > target.capacity_requests {
        return Some("relay_capacity_exhausted");
    }
    None
}

/// The evacuation's writes at the next epoch: the old epoch's reservations released, the row
/// moved, the target charged, its `control-pending` and `migration` leases, a connection
/// reservation on a capped target, the evacuation record and the row's counters.
async fn write_evacuation(
    tx: &mut Tx,
    host: &HostKey,
    previous_epoch: i64,
    (source, source_id): (Option<&CellView>, &str),
    target: &CellView,
    src: i64,
    now: i64,
) -> Result<(), MigrationError> {
    let e = previous_epoch + 1;
    release_epoch_reservations(tx, host, previous_epoch, now).await?;
    let deadline = now + EVACUATION_WINDOW_MS;
    move_row(tx, host, &target.cell_id, e, None, now).await?;
    if !charge_cell(tx, &target.cell_id, src + 1, now).await? {
        return Err(MigrationError::Refused("relay_capacity_exhausted"));
    }
    insert_lease(
        tx,
        host,
        &ActivityId::ControlPending { epoch: e }.to_string(),
        LeaseKind::Control,
        &target.cell_id,
        1,
        deadline,
        now,
    )
    .await?;
    insert_lease(
        tx,
        host,
        &ActivityId::Migration { epoch: e }.to_string(),
        LeaseKind::Migration,
        &target.cell_id,
        src,
        deadline,
        now,
    )
    .await?;
    if target.capped() {
        reserve_connection(tx, host, e, &target.cell_id, now).await?;
    }
    let incarnation = source
        .and_then(|s| s.runtime.as_ref())
        .map(|r| r.cell_incarnation.clone());
    rows::insert_evacuation(
        tx,
        host,
        &NewEvacuation {
            assignment_epoch: e,
            source_cell_id: source_id,
            source_cell_incarnation: incarnation.as_deref(),
            target_cell_id: &target.cell_id,
            previous_epoch,
            source_request_units: src,
            target_reserved_units: src + 1,
            deadline,
        },
        now,
    )
    .await?;
    refresh_row(tx, host, Some(now), now).await?;
    Ok(())
}

/// `evacuate-cell`: `(started, skipped, remaining)`.
pub async fn evacuate_cell(
    db: &Db,
    source_id: &str,
    target_id: Option<&str>,
    limit: i64,
    now: i64,
) -> Result<(i64, i64, i64), MigrationError> {
    let all = cells::views(Reader::Db(db), Which::All, false).await?;
    let source = all
        .iter()
        .find(|c| c.cell_id == source_id)
        .ok_or(MigrationError::CellNotFound)?;
    if let Some(t) = target_id {
        let target = all
            .iter()
            .find(|c| c.cell_id == t)
            .ok_or(MigrationError::CellNotFound)?;
        if t == source_id {
            return Err(MigrationError::Refused("target_matches_source"));
        }
        if !target.admission.enabled() || !target.live(now) {
            return Err(MigrationError::Refused("target_cell_unavailable"));
        }
    }
    if !source.live(now) {
        return Err(MigrationError::Refused("source_cell_unavailable"));
    }
    let hosts = hosts_without_migration(db, source_id, Some(limit)).await?;
    let (mut started, mut skipped) = (0, 0);
    for h in hosts {
        match evacuate(db, &h, target_id, now).await {
            Ok(_) => started += 1,
            Err(MigrationError::Db(e)) if !e.is_transient() => return Err(MigrationError::Db(e)),
            Err(_) => skipped += 1,
        }
    }
    let remaining = hosts_without_migration(db, source_id, None).await?.len() as i64;
    Ok((started, skipped, remaining))
}

/// `migration-complete`.
pub async fn complete(
    db: &Db,
    host: &HostKey,
    epoch: i64,
    now: i64,
) -> Result<Json, MigrationError> {
    crate::transaction!(db, "migration", |tx| complete_tx(tx, host, epoch, now)
        .await)
}

async fn complete_tx(
    tx: &mut Tx,
    host: &HostKey,
    epoch: i64,
    now: i64,
) -> Result<Json, MigrationError> {
    let hv = lock_host(tx, host)
        .await?
        .ok_or(MigrationError::Refused("migration_not_found"))?;
    let m = match &hv.open_migration {
        Some(m) if m.assignment_epoch == epoch => m.clone(),
        _ => return Err(MigrationError::Refused("migration_not_found")),
    };
    completion_check(tx, &hv, &m, now).await?;
    settle(tx, host, &hv, &m, now).await?;
    let r = rows::read(tx, host, epoch)
        .await?
        .ok_or(MigrationError::Refused("migration_not_found"))?;
    Ok(migration_json(&r))
}

/// The conditions after "exists and open".
async fn completion_check(
    tx: &mut Tx,
    hv: &HostView,
    m: &OpenMigration,
    now: i64,
) -> Result<(), MigrationError> {
    if hv.row.cell_id != m.target_cell_id || hv.row.assignment_epoch != m.assignment_epoch {
        return Err(MigrationError::Refused("migration_assignment_mismatch"));
    }
    if m.target_registered_at.is_none() {
        return Err(MigrationError::Refused("migration_target_not_registered"));
    }
    if hv.leases.iter().any(|l| l.cell_id == m.source_cell_id) {
        return Err(MigrationError::Refused("migration_source_still_active"));
    }
    let target = cells::views(Reader::Tx(tx), Which::One(&m.target_cell_id), false)
        .await?
        .into_iter()
        .next();
    let active = target.as_ref().is_some_and(|t| {
        let rt = match (&t.runtime, t.live(now)) {
            (Some(rt), true) => rt,
            _ => return false,
        };
        hv.leases.iter().any(|l| {
            matches!(ActivityId::parse(&l.activity_id),
                Some(ActivityId::Control { cell_id, .. }) if cell_id == m.target_cell_id)
                && l.cell_incarnation.as_deref() == Some(rt.cell_incarnation.as_str())
                && l.renewed_at.is_some_and(|r| r >= rt.started_at)
        })
    });
    if !active {
        return Err(MigrationError::Refused("migration_target_not_active"));
    }
    Ok(())
}

/// Deletes `migration:<e>` (freeing its units) and completes the migration.
async fn settle(
    tx: &mut Tx,
    host: &HostKey,
    hv: &HostView,
    m: &OpenMigration,
    now: i64,
) -> Result<(), DbError> {
    let id = ActivityId::Migration {
        epoch: m.assignment_epoch,
    }
    .to_string();
    if let Some(l) = hv.leases.iter().find(|l| l.activity_id == id) {
        lock_cells(tx, std::slice::from_ref(&l.cell_id)).await?;
        delete_lease(tx, host, l, now).await?;
    }
    rows::mark_completed(tx, host, m.assignment_epoch, now).await?;
    refresh_row(tx, host, None, now).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Sweep steps. Each returns (done, skipped-busy).

/// Outcome of one sweep step.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepCount {
    pub done: u64,
    pub skipped: u64,
}

/// Runs `f` per host in its own transaction; a busy row counts as skipped.
macro_rules! per_host {
    ($db:expr, $items:expr, |$tx:ident, $host:ident, $epoch:ident| $body:expr) => {{
        let mut count = SweepCount::default();
        for ($host, $epoch) in $items {
            let r: Result<bool, MigrationError> =
                crate::transaction!($db, "migration", |$tx| { $body });
            match r {
                Ok(true) => count.done += 1,
                Ok(false) => {}
                Err(MigrationError::Refused("assignment_row_busy")) => count.skipped += 1,
                Err(MigrationError::Db(e)) => return Err(e),
                Err(_) => {}
            }
        }
        Ok(count)
    }};
}

/// `refresh-migrations`.
pub async fn refresh_migrations(db: &Db, now: i64) -> Result<SweepCount, DbError> {
    let items = rows::open_migrations(
        db,
        OpenFilter::RegisteredSince(now - MIGRATION_MAX_AGE_MS),
        SWEEP_BATCH,
    )
    .await?;
    per_host!(db, items, |tx, host, epoch| {
        let hv = match lock_host(tx, &host).await? {
            Some(h) => h,
            None => return Ok(false),
        };
        if hv.open_migration.as_ref().map(|m| m.assignment_epoch) != Some(epoch) {
            return Ok(false);
        }
        let exp = now + EVACUATION_WINDOW_MS;
        rows::set_expiry(tx, &host, epoch, exp, now).await?;
        let id = ActivityId::Migration { epoch }.to_string();
        set_lease_expiry(tx, &host, &id, exp, now).await?;
        refresh_row(tx, &host, None, now).await?;
        Ok(true)
    })
}

/// `complete-ready-migrations`.
pub async fn complete_ready(db: &Db, now: i64) -> Result<SweepCount, DbError> {
    let items = rows::open_migrations(db, OpenFilter::Registered, SWEEP_BATCH).await?;
    per_host!(db, items, |tx, host, epoch| {
        let hv = match lock_host(tx, &host).await? {
            Some(h) => h,
            None => return Ok(false),
        };
        let m = match &hv.open_migration {
            Some(m) if m.assignment_epoch == epoch => m.clone(),
            _ => return Ok(false),
        };
        match completion_check(tx, &hv, &m, now).await {
            Ok(()) => {}
            Err(MigrationError::Refused(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
        settle(tx, &host, &hv, &m, now).await?;
        Ok(true)
    })
}

/// `expire-unarrived-migrations`: rollback to a live source, else settle on the target.
pub async fn expire_unarrived(db: &Db, now: i64) -> Result<SweepCount, DbError> {
    let items = rows::open_migrations(db, OpenFilter::UnarrivedBy(now), SWEEP_BATCH).await?;
    let mut events = Vec::new();
    let out = per_host!(db, items, |tx, host, epoch| {
        let hv = match lock_host(tx, &host).await? {
            Some(h) => h,
            None => return Ok(false),
        };
        let m = match &hv.open_migration {
            Some(m) if m.assignment_epoch == epoch && m.target_registered_at.is_none() => m.clone(),
            _ => return Ok(false),
        };
        tx.set_lock_timeout(CELL_WAIT_MS).await?;
        let cells = cells::views(
            Reader::Tx(tx),
            Which::Pair(&m.source_cell_id, &m.target_cell_id),
            true,
        )
        .await?;
        let source = cells.iter().find(|c| c.cell_id == m.source_cell_id);
        let rollback = source.is_some_and(|s| {
            s.live(now)
                && if m.kind == "idle-rehome" {
                    s.admission == Admission::General
                } else {
                    s.admission != Admission::ExistingOnly
                }
        });
        if !rollback || hv.row.cell_id != m.target_cell_id || hv.row.assignment_epoch != epoch {
            settle(tx, &host, &hv, &m, now).await?;
            return Ok(true);
        }
        for id in [
            ActivityId::ControlPending { epoch }.to_string(),
            ActivityId::Migration { epoch }.to_string(),
        ] {
            if let Some(l) = hv
                .leases
                .iter()
                .find(|l| l.activity_id == id && l.cell_id == m.target_cell_id)
            {
                delete_lease(tx, &host, l, now).await?;
            }
        }
        release_epoch_reservations(tx, &host, epoch, now).await?;
        let reason = if m.kind == "idle-rehome" {
            "host_not_arrived"
        } else {
            "target_not_registered"
        };
        move_row(tx, &host, &m.source_cell_id, epoch + 1, None, now).await?;
        abort_migration(tx, &host, epoch, reason, now).await?;
        refresh_row(tx, &host, None, now).await?;
        events.push(json!({"kind": m.kind, "sourceCellId": m.source_cell_id, "targetCellId": m.target_cell_id, "reason": reason}));
        Ok(true)
    });
    for e in events {
        crate::logging::event("orca_relay_migration_rolled_back", e);
    }
    out
}

/// `expire-aged-migrations`.
pub async fn expire_aged(db: &Db, now: i64) -> Result<SweepCount, DbError> {
    let items = rows::open_migrations(
        db,
        OpenFilter::CreatedBy(now - MIGRATION_MAX_AGE_MS),
        SWEEP_BATCH,
    )
    .await?;
    per_host!(db, items, |tx, host, epoch| {
        let hv = match lock_host(tx, &host).await? {
            Some(h) => h,
            None => return Ok(false),
        };
        let m = match &hv.open_migration {
            Some(m) if m.assignment_epoch == epoch => m.clone(),
            _ => return Ok(false),
        };
        let migration_id = ActivityId::Migration { epoch }.to_string();
        let doomed: Vec<&Lease> = hv
            .leases
            .iter()
            .filter(|l| l.cell_id == m.source_cell_id || l.activity_id == migration_id)
            .collect();
        let ids: Vec<String> = doomed.iter().map(|l| l.cell_id.clone()).collect();
        lock_cells(tx, &ids).await?;
        for l in doomed {
            delete_lease(tx, &host, l, now).await?;
        }
        // An idle-rehome attempt is aborted, not completed, by the aged settle.
        crate::store::region::abort_attempt(tx, &host, epoch, "max_refresh_expired", now).await?;
        rows::mark_completed(tx, &host, epoch, now).await?;
        refresh_row(tx, &host, None, now).await?;
        Ok(true)
    })
}

/// One batch of `release-expired-activity-leases`: the hosts of up to 500 expired leases after
/// `after`, each in its own transaction (every expired lease of the host is released, except the
/// pending control and migration lease of an open migration at its epoch). Returns the count and
/// the cursor of the next batch (`None`: nothing expired is left past this one). The sweep calls
/// it until the cursor runs out, so a crash burst is drained in one run (issue 11).
pub async fn release_expired_leases(
    db: &Db,
    now: i64,
    after: Option<&rows::LeaseCursor>,
) -> Result<(SweepCount, Option<rows::LeaseCursor>), DbError> {
    let (hosts, next) =
        rows::hosts_with_expired_leases(db, now, after, EXPIRED_LEASE_BATCH).await?;
    let items: Vec<(HostKey, i64)> = hosts.into_iter().map(|h| (h, 0)).collect();
    let count = release_hosts_expired_leases(db, now, items).await?;
    Ok((count, next))
}

async fn release_hosts_expired_leases(
    db: &Db,
    now: i64,
    items: Vec<(HostKey, i64)>,
) -> Result<SweepCount, DbError> {
    per_host!(db, items, |tx, host, _e| {
        let hv = match lock_host(tx, &host).await? {
            Some(h) => h,
            None => {
                // Orphan leases of a host without a row: free them too.
                let leases = lock_leases(tx, &host).await?;
                let ids: Vec<String> = leases.iter().map(|l| l.cell_id.clone()).collect();
                lock_cells(tx, &ids).await?;
                for l in leases.iter().filter(|l| l.expires_at <= now) {
                    delete_lease(tx, &host, l, now).await?;
                }
                return Ok(true);
            }
        };
        let keep = hv.open_migration.as_ref().map(|m| {
            let epoch = m.assignment_epoch;
            [
                ActivityId::ControlPending { epoch }.to_string(),
                ActivityId::Migration { epoch }.to_string(),
            ]
        });
        let doomed: Vec<&Lease> = hv
            .leases
            .iter()
            .filter(|l| l.expires_at <= now)
            .filter(|l| !keep.as_ref().is_some_and(|k| k.contains(&l.activity_id)))
            .collect();
        if doomed.is_empty() {
            return Ok(false);
        }
        let ids: Vec<String> = doomed.iter().map(|l| l.cell_id.clone()).collect();
        lock_cells(tx, &ids).await?;
        for l in doomed {
            delete_lease(tx, &host, l, now).await?;
        }
        refresh_row(tx, &host, None, now).await?;
        Ok(true)
    })
}

/// `release-connection-reservations`: late arrivals stay counted 10 min past their timeout.
pub async fn release_old_reservations(db: &Db, now: i64) -> Result<u64, DbError> {
    rows::release_old_reservations(db, now, RESERVATION_LATE_GRACE_MS).await
}

/// `release-expired-region-decisions`.
pub async fn release_old_decisions(db: &Db, now: i64) -> Result<u64, DbError> {
    rows::delete_region_decisions_before(db, now - REGION_DECISION_RETENTION_MS).await
}

/// Hosts the dead-cell sweep may move: home not live and either uncapped without an open
/// migration or carrying a valid fence; grouped by cell, up to 100.
pub async fn dead_cell_hosts(db: &Db, now: i64) -> Result<Vec<(String, HostKey)>, DbError> {
    let all = cells::views(Reader::Db(db), Which::All, false).await?;
    let mut out = Vec::new();
    for c in all.iter().filter(|c| !c.live(now)) {
        let fence = c.fence_valid(now);
        if !fence && c.capped() {
            continue;
        }
        let left = SWEEP_BATCH - out.len() as i64;
        for h in rows::hosts_on_cell(db, &c.cell_id, fence, left).await? {
            out.push((c.cell_id.clone(), h));
        }
        if out.len() as i64 >= SWEEP_BATCH {
            break;
        }
    }
    Ok(out)
}
