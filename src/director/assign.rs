//! The director's assign service (ARCHITECTURE.md): each transaction locks rows in the order
//! of through the store's primitives, hands the plain rows to the pure rules of
//! [`super::placement`], writes what they decide, and logs its events after commit.

use serde_json::{json, Value as Json};

use super::liveness::{Admission, CellView};
use super::placement::{
    decide, decide_sticky, placement_region, select, spared, Decision, HostView, MoveKind, Refusal,
    Scope,
};
use crate::model::{ActivityId, HostKey, LeaseCounts, LeaseKind};
use crate::store::assignments::{
    charge_cell, delete_lease, insert_lease, insert_row, lease_expires_at, lock_host, lock_leases,
    lock_open_migration, lock_reservations, lock_row, lock_sticky, move_row, read_row, refresh_row,
    release_epoch_reservations, reserve_connection, set_preferred_region, stamp_grant, touch_row,
    StickyRead, LEASE_TTL_MS,
};
use crate::store::cells::{self, Reader, Which};
use crate::store::migrations::abort_migration;
use crate::store::sticky_batch::{lock_sticky_many, stamp_grants, Stamp};
use crate::store::{Db, DbError, RetryClass, Tx};
use std::collections::HashMap;

/// Wait for cell rows in request paths.
pub const CELL_WAIT_MS: u64 = 500;
/// Wait for a live `general` home's assignment row.
pub const STICKY_ROW_WAIT_MS: u64 = 1_000;

/// A successful `assign`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub cell_id: String,
    pub cell_url: String,
    pub region: String,
    pub assignment_epoch: i64,
    pub lease_expires_at: i64,
    /// The move this grant wrote, if any.
    pub moved: Option<MoveKind>,
}

/// Why `assign` did not grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssignError {
    Refused(Refusal),
    /// The host's row is locked elsewhere (`assignment_row_busy`).
    RowBusy,
    Db(DbError),
    /// Internal: the row changed under us; run A again.
    Restart,
    /// [`assign_sticky`] only: the host has no row or its home is roll-isolated; nothing
    /// was written, the request belongs to the placement lane.
    NotSticky,
    /// [`assign_sticky`] only: the verification read failed (`route=assign-verify`).
    VerifyFailed(DbError),
    /// [`AssignOptions::spare_serving`] only: the home is not live but still holds the host's
    /// unexpired control lease; nothing was written.
    Spared,
}

impl From<DbError> for AssignError {
    fn from(e: DbError) -> Self {
        AssignError::Db(e)
    }
}

impl RetryClass for AssignError {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            AssignError::Db(e) => e.retry_code(),
            _ => None,
        }
    }
    fn db_error(&self) -> Option<&crate::store::DbError> {
        match self {
            AssignError::Db(e) => Some(e),
            _ => None,
        }
    }
}

/// Knobs of one `assign` call.
#[derive(Debug, Clone, Copy)]
pub struct AssignOptions {
    /// Wait for cell rows: 500 ms on request paths, 1 000 ms for the dead-cell sweep.
    pub cell_wait_ms: u64,
    /// The dead-cell sweep: do not move a host off a home that is not live while that home
    /// still holds the host's unexpired control lease. A home that stopped heartbeating may
    /// only be cut off from the director and still be serving the host; it ends the session
    /// itself before the lease lapses when it cannot renew it, and a host that asks again
    /// itself is moved by the request path.
    pub spare_serving: bool,
}

impl Default for AssignOptions {
    fn default() -> Self {
        AssignOptions {
            cell_wait_ms: CELL_WAIT_MS,
            spare_serving: false,
        }
    }
}

/// `assign(host, preferredRegion?)`.
pub async fn assign(
    db: &Db,
    host: &HostKey,
    preferred_region: Option<&str>,
    regions: &[String],
    opts: AssignOptions,
) -> Result<Grant, AssignError> {
    assign_with(db, host, preferred_region, regions, opts, false).await
}

/// The sticky lane's `assign`: the lane's verification (row exists, home not roll-isolated
/// ignoring liveness) is made on the rows A reads under its locks, so a verified sticky grant
/// costs two round trips in all (see [`Mode::Fast`]). Unverified → [`AssignError::NotSticky`]
/// with nothing written. When the row is busy the verification is the plain read.
pub async fn assign_sticky(
    db: &Db,
    host: &HostKey,
    preferred_region: Option<&str>,
    regions: &[String],
) -> Result<Grant, AssignError> {
    assign_with(
        db,
        host,
        preferred_region,
        regions,
        AssignOptions::default(),
        true,
    )
    .await
}

/// One request of a sticky batch: the host and its `preferredRegion`.
#[derive(Debug, Clone)]
pub struct StickyAsk {
    pub host: HostKey,
    pub preferred_region: Option<String>,
}

/// The sticky lane's batched grant: one transaction locks every asking host's rows
/// ([`lock_sticky_many`]) and grants, in one write, each host the single grant's first attempt
/// would grant at the same epoch ([`batch_grants`]). Every other host (row busy or absent, home
/// roll-isolated, not live, or needing a charge, a move or a refusal) then goes through
/// [`assign_sticky`] on its own, as does every host when the batch's transaction fails; so each
/// result is the one the single path gives. Results in the order of `asks`, and how many the
/// batch's transaction granted.
pub async fn assign_sticky_batch(
    db: &Db,
    asks: &[StickyAsk],
    regions: &[String],
) -> (Vec<Result<Grant, AssignError>>, usize) {
    let granted = match batch_tx(db, asks).await {
        Ok(g) => g,
        Err(e) => {
            log::debug!(
                "[orca-relay] sticky batch of {} failed, granting one by one: {e}",
                asks.len()
            );
            HashMap::new()
        }
    };
    let mut out = Vec::with_capacity(asks.len());
    for ask in asks {
        out.push(match granted.get(&ask.host) {
            Some(g) => Ok(g.clone()),
            None => assign_sticky(db, &ask.host, ask.preferred_region.as_deref(), regions).await,
        });
    }
    (out, granted.len())
}

/// Whether the batch grants a host itself: A.5, the home granted at the same epoch with nothing
/// but the row's stamp written (the host holds a control on its live, not roll-isolated home).
pub fn batch_grants(hv: &HostView, home: Option<&CellView>, now: i64) -> bool {
    matches!(
        decide_sticky(hv, home, now),
        Some(Decision::Grant { deferred: false })
    )
}

/// The batch's one transaction: the many-host sticky read, then one stamp for every host
/// [`batch_grants`] grants; returns those hosts' grants.
async fn batch_tx(db: &Db, asks: &[StickyAsk]) -> Result<HashMap<HostKey, Grant>, DbError> {
    let hosts: Vec<HostKey> = asks.iter().map(|a| a.host.clone()).collect();
    let now = crate::clock::now_ms();
    crate::transaction!(db, "assignment", |tx| {
        let reads = lock_sticky_many(tx, &hosts).await?;
        let grants: Vec<(&StickyAsk, &HostView, &CellView)> = asks
            .iter()
            .filter_map(|a| {
                let (hv, home) = reads.get(&a.host)?;
                let home = home.as_ref()?;
                batch_grants(hv, Some(home), now).then_some((a, hv, home))
            })
            .collect();
        if grants.is_empty() {
            return Ok(HashMap::new());
        }
        let stamps: Vec<Stamp<'_>> = grants
            .iter()
            .map(|(a, hv, _)| Stamp {
                host: &a.host,
                hv,
                preferred_region: a.preferred_region.as_deref(),
            })
            .collect();
        let leases = stamp_grants(tx, &stamps, now).await?;
        Ok(grants
            .iter()
            .map(|(a, hv, home)| {
                let grant = Grant {
                    cell_id: home.cell_id.clone(),
                    cell_url: home.cell_url.clone(),
                    region: home.region.clone(),
                    assignment_epoch: hv.row.assignment_epoch,
                    lease_expires_at: leases.get(&a.host).copied().unwrap_or(now + LEASE_TTL_MS),
                    moved: None,
                };
                (a.host.clone(), grant)
            })
            .collect())
    })
}

/// The sticky lane's verification as a plain read: the host has a row whose home is not
/// roll-isolated (liveness ignored).
pub async fn verify_sticky(db: &Db, host: &HostKey) -> Result<bool, DbError> {
    let row = match read_row(db, host).await? {
        Some(r) => r,
        None => return Ok(false),
    };
    let home = cells::view(db, &row.cell_id).await?;
    let stamped = home.is_some_and(|c| c.roll_stamp_active(crate::clock::now_ms()));
    if !stamped || row.counters.migrations > 0 {
        return Ok(true);
    }
    let open = crate::store::migrations::read_open(db, host).await?;
    Ok(open.is_some())
}

/// What one assign asks: the host, its preferred region, the known regions and the options.
#[derive(Clone, Copy)]
struct Ask<'a> {
    host: &'a HostKey,
    preferred_region: Option<&'a str>,
    regions: &'a [String],
    opts: AssignOptions,
}

/// Events a transaction leaves to log after its commit.
type Events = Vec<(&'static str, Json)>;

/// The assign's entries in turn: the fast attempt (A), sticky (A after a plain read), the
/// roll-isolated moves (I) and all rows (M); at most six rounds.
async fn assign_with(
    db: &Db,
    host: &HostKey,
    preferred_region: Option<&str>,
    regions: &[String],
    opts: AssignOptions,
    verify: bool,
) -> Result<Grant, AssignError> {
    let ask = Ask {
        host,
        preferred_region,
        regions,
        opts,
    };
    let mut last = AssignError::Restart;
    let mut mode = Mode::Fast;
    for _ in 0..6 {
        let now = crate::clock::now_ms();
        let mut events: Events = Vec::new();
        let result: Result<Step, AssignError> = if mode == Mode::Fast {
            match fast_attempt(db, ask, verify, now, &mut events).await? {
                Some(r) => r,
                None => {
                    mode = Mode::Sticky;
                    continue;
                }
            }
        } else {
            locked_attempt(db, ask, mode, now, &mut events).await
        };
        match result {
            Err(AssignError::Restart) => {
                last = AssignError::Restart;
                mode = Mode::Sticky;
                continue;
            }
            Ok(Step::Done(g)) => {
                log_events(events);
                return Ok(g);
            }
            Ok(Step::Isolated) => {
                if let Some(g) = isolated_moves(db, host, opts).await? {
                    return Ok(g);
                }
                mode = Mode::AllRows;
            }
            Err(e) => return Err(e),
        }
    }
    Err(match last {
        AssignError::Restart => AssignError::Db(DbError::Serialization("40001")),
        e => e,
    })
}

fn log_events(events: Events) {
    for (name, fields) in events {
        crate::logging::event(name, fields);
    }
}

/// A's fast attempt (no plain read first). `Ok(None)`: the row was busy, so the assign goes on
/// sticky (a verifying assign first checks the host is still sticky by a plain read); a store
/// error before the host was verified is a failed verification.
async fn fast_attempt(
    db: &Db,
    ask: Ask<'_>,
    verify: bool,
    now: i64,
    events: &mut Events,
) -> Result<Option<Result<Step, AssignError>>, AssignError> {
    let mut verified = !verify;
    let r = crate::transaction!(db, "assignment", |tx| {
        events.clear();
        assign_tx(
            tx,
            ask.host,
            None,
            None,
            ask.preferred_region,
            ask.regions,
            ask.opts,
            Mode::Fast,
            now,
            &mut *events,
            if verify { Some(&mut verified) } else { None },
        )
        .await
    });
    match r {
        Err(AssignError::RowBusy) => {
            // Contended: A as writes it, its plain read choosing the wait.
            if verify
                && !verify_sticky(db, ask.host)
                    .await
                    .map_err(AssignError::VerifyFailed)?
            {
                return Err(AssignError::NotSticky);
            }
            Ok(None)
        }
        Err(AssignError::Db(e)) if !verified => Err(AssignError::VerifyFailed(e)),
        r => Ok(Some(r)),
    }
}

/// A sticky or all-rows attempt. A.1: a plain read of the row and its home chooses how long to
/// wait for the row lock (a live general home is worth waiting for).
async fn locked_attempt(
    db: &Db,
    ask: Ask<'_>,
    mode: Mode,
    now: i64,
    events: &mut Events,
) -> Result<Step, AssignError> {
    let plain = read_row(db, ask.host).await?;
    let wait = match (&plain, mode) {
        (Some(row), Mode::Sticky) => match cells::view(db, &row.cell_id).await? {
            Some(home) if home.live(now) && home.admission == Admission::General => {
                Some(STICKY_ROW_WAIT_MS)
            }
            _ => None,
        },
        _ => None,
    };
    let plain_cell = plain.map(|r| r.cell_id);
    crate::transaction!(db, "assignment", |tx| {
        events.clear();
        assign_tx(
            tx,
            ask.host,
            plain_cell.as_deref(),
            wait,
            ask.preferred_region,
            ask.regions,
            ask.opts,
            mode,
            now,
            &mut *events,
            None,
        )
        .await
    })
}

/// I: tier 1 (home region), tier 2 (other regions), each its own transaction. `None` when
/// nothing was found or the host no longer qualifies: the assign continues with M.
async fn isolated_moves(
    db: &Db,
    host: &HostKey,
    opts: AssignOptions,
) -> Result<Option<Grant>, AssignError> {
    for inside in [true, false] {
        let mut events: Events = Vec::new();
        let r: Result<IStep, AssignError> = crate::transaction!(db, "assignment", |tx| {
            events.clear();
            isolated_tx(tx, host, inside, opts, crate::clock::now_ms(), &mut events).await
        });
        match r? {
            IStep::Moved(g) => {
                log_events(events);
                return Ok(Some(g));
            }
            IStep::NoTarget => continue,
            IStep::ToAllRows => break,
        }
    }
    Ok(None)
}

/// Which entry of a transaction plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A's first attempt in two round trips: `BEGIN` pipelined with one statement that locks the
    /// row `NOWAIT` and the host rows and reads the home ([`lock_sticky`]); a grant at the same
    /// epoch (A.5) is then one `UPDATE` pipelined with `COMMIT` ([`stamp_grant`]). No plain read
    /// comes first: it only chooses how long to wait for a busy row, and a busy row sends the
    /// request to [`Mode::Sticky`], which makes it. The same rows are locked in the same order,
    /// so the outcome is the one prescribes.
    Fast,
    /// A (then P or M in the same transaction).
    Sticky,
    /// M entered from I: its own transaction, assignment row NOWAIT.
    AllRows,
}

/// What the first transaction concluded.
enum Step {
    Done(Grant),
    /// A.4 found a roll-isolated home for a simple host: take the narrow path I.
    Isolated,
}

/// Outcome of one tier of I.
enum IStep {
    Moved(Grant),
    NoTarget,
    ToAllRows,
}

/// Simple host: every lease charged to the home and invariant 2 holds.
pub fn simple(hv: &HostView) -> bool {
    hv.leases.iter().all(|l| l.cell_id == hv.row.cell_id)
        && LeaseCounts::of_leases(&hv.leases) == hv.row.counters
}

/// One tier of the isolated-replacement path: never locks or writes the home row.
async fn isolated_tx(
    tx: &mut Tx,
    host: &HostKey,
    inside: bool,
    opts: AssignOptions,
    now: i64,
    events: &mut Vec<(&'static str, Json)>,
) -> Result<IStep, AssignError> {
    let hv = match lock_host(tx, host, None).await.map_err(busy)? {
        Some(hv) => hv,
        None => return Ok(IStep::ToAllRows),
    };
    let home = cells::view_in(tx, &hv.row.cell_id).await?;
    let live = home.as_ref().is_some_and(|h| h.live(now));
    if !(hv.roll_isolated(home.as_ref(), now)
        && (live || hv.roll_replaced(home.as_ref(), now))
        && simple(&hv))
    {
        return Ok(IStep::ToAllRows);
    }
    let home = home.expect("roll-isolated implies a cell row");
    tx.set_lock_timeout(opts.cell_wait_ms).await?;
    let cells = cells::views(
        Reader::Tx(tx),
        Which::Region {
            region: &home.region,
            exclude: &home.cell_id,
            inside,
        },
        true,
    )
    .await?;
    let scope = if inside {
        Scope::Require(&home.region)
    } else {
        Scope::Outside(&home.region)
    };
    let target = match select(&cells, scope, 1, Some(&home.cell_id), now) {
        Some(t) => t,
        None => return Ok(IStep::NoTarget),
    };
    let kind = MoveKind::Isolated { source_live: live };
    let epoch = write_move(tx, host, Some(&hv), target, kind, None, now).await?;
    events.push((
        "orca_relay_sticky_replaced_off_isolated_cell",
        json!({
            "fromCellId": home.cell_id,
            "fromRegion": home.region,
            "admissionState": home.admission.as_str(),
            "toCellId": target.cell_id,
            "region": target.region,
            "sourceLive": live,
        }),
    ));
    let lease = lease_expires_at(tx, host)
        .await?
        .unwrap_or(now + LEASE_TTL_MS);
    Ok(IStep::Moved(Grant {
        cell_id: target.cell_id.clone(),
        cell_url: target.cell_url.clone(),
        region: target.region.clone(),
        assignment_epoch: epoch,
        lease_expires_at: lease,
        moved: Some(kind),
    }))
}

#[allow(clippy::too_many_arguments)]
async fn assign_tx(
    tx: &mut Tx,
    host: &HostKey,
    plain_cell: Option<&str>,
    wait: Option<u64>,
    preferred: Option<&str>,
    regions: &[String],
    opts: AssignOptions,
    mode: Mode,
    now: i64,
    events: &mut Vec<(&'static str, Json)>,
    verified: Option<&mut bool>,
) -> Result<Step, AssignError> {
    // A.2–A.3: the assignment row, then the host rows; the home by plain read.
    let locked = lock_for_assign(tx, host, plain_cell, wait, mode).await?;
    if let Some(v) = verified {
        match &locked {
            Some((hv, home)) if !hv.roll_isolated(home.as_ref(), now) => *v = true,
            _ => return Err(AssignError::NotSticky),
        }
    }
    let Some((mut hv, home)) = locked else {
        return fresh_placement(tx, host, preferred, regions, opts, now, events).await;
    };
    if let Some(p) = preferred {
        hv.row.preferred_region = Some(p.to_string());
    }
    let region =
        placement_region(preferred, hv.row.preferred_region.as_deref(), regions).to_string();
    let sticky = if mode == Mode::AllRows {
        None
    } else {
        decide_sticky(&hv, home.as_ref(), now)
    };
    if let (Some(Decision::Grant { deferred: false }), Some(home)) = (&sticky, &home) {
        // A.5: one write, the transaction's last statement, sent with COMMIT.
        let lease = stamp_grant(tx, &hv, host, preferred, now).await?;
        return Ok(Step::Done(Grant {
            cell_id: home.cell_id.clone(),
            cell_url: home.cell_url.clone(),
            region: home.region.clone(),
            assignment_epoch: hv.row.assignment_epoch,
            lease_expires_at: lease,
            moved: None,
        }));
    }
    if let Some(p) = preferred {
        set_preferred_region(tx, host, p, now).await?;
    }
    if mode != Mode::AllRows {
        if let Some(d) = sticky {
            let cells: Vec<CellView> = home.into_iter().collect();
            return apply(tx, host, Some(&hv), &cells, d, preferred, now, events)
                .await
                .map(Step::Done);
        }
        // A.4: roll-isolated (liveness ignored) → I, for simple hosts that are not dormant or
        // stranded (those rules come first and belong to M).
        if hv.roll_isolated(home.as_ref(), now)
            && !hv.dormant(now)
            && !hv.stranded(home.as_ref(), now)
            && simple(&hv)
        {
            return Ok(Step::Isolated);
        }
    }
    every_row_decision(tx, host, &hv, &region, preferred, opts, now, events).await
}

/// P (dormant) or M: every cell row the rule may need, locked in one statement, then the
/// decision applied (or the host spared, for the dead-cell sweep).
#[allow(clippy::too_many_arguments)]
async fn every_row_decision(
    tx: &mut Tx,
    host: &HostKey,
    hv: &HostView,
    region: &str,
    preferred: Option<&str>,
    opts: AssignOptions,
    now: i64,
    events: &mut Vec<(&'static str, Json)>,
) -> Result<Step, AssignError> {
    tx.set_lock_timeout(opts.cell_wait_ms).await?;
    let which = if hv.dormant(now) {
        Which::General
    } else {
        Which::All
    };
    let cells = cells::views(Reader::Tx(tx), which, true).await?;
    let d = decide(Some(hv), &cells, region, now);
    if opts.spare_serving && spared(hv, &cells, &d, now) {
        return Err(AssignError::Spared);
    }
    apply(tx, host, Some(hv), &cells, d, preferred, now, events)
        .await
        .map(Step::Done)
}

/// A.2–A.3 under lock: the fast entry's one-statement read ([`lock_sticky`]), or the row (with
/// the wait the plain read chose) and then the host rows and the home. A row whose cell is not
/// the one the plain read saw restarts the assign.
async fn lock_for_assign(
    tx: &mut Tx,
    host: &HostKey,
    plain_cell: Option<&str>,
    wait: Option<u64>,
    mode: Mode,
) -> Result<Option<StickyRead>, AssignError> {
    let locked: Option<StickyRead> = match mode {
        Mode::Fast => lock_sticky(tx, host).await.map_err(busy)?,
        _ => match lock_row(tx, host, wait).await.map_err(busy)? {
            None => None,
            Some(row) => {
                if plain_cell != Some(row.cell_id.as_str()) {
                    return Err(AssignError::Restart);
                }
                let leases = lock_leases(tx, host).await?;
                let open_migration = lock_open_migration(tx, host).await?;
                lock_reservations(tx, host).await?;
                let home = cells::views(Reader::Tx(tx), Which::One(&row.cell_id), false)
                    .await?
                    .into_iter()
                    .next();
                Some((
                    HostView {
                        row,
                        leases,
                        open_migration,
                    },
                    home,
                ))
            }
        },
    };
    Ok(locked)
}

/// P: fresh placement over the general rows (the host has no assignment row).
async fn fresh_placement(
    tx: &mut Tx,
    host: &HostKey,
    preferred: Option<&str>,
    regions: &[String],
    opts: AssignOptions,
    now: i64,
    events: &mut Events,
) -> Result<Step, AssignError> {
    tx.set_lock_timeout(opts.cell_wait_ms).await?;
    let cells = cells::views(Reader::Tx(tx), Which::General, true).await?;
    let region = placement_region(preferred, None, regions);
    apply(
        tx,
        host,
        None,
        &cells,
        decide(None, &cells, region, now),
        preferred,
        now,
        events,
    )
    .await
    .map(Step::Done)
}

fn busy(e: DbError) -> AssignError {
    match e {
        DbError::LockUnavailable => AssignError::RowBusy,
        e => AssignError::Db(e),
    }
}

#[allow(clippy::too_many_arguments)]
async fn apply(
    tx: &mut Tx,
    host: &HostKey,
    hv: Option<&HostView>,
    cells: &[CellView],
    decision: Decision,
    preferred: Option<&str>,
    now: i64,
    events: &mut Vec<(&'static str, Json)>,
) -> Result<Grant, AssignError> {
    match decision {
        Decision::Refuse(r) => Err(AssignError::Refused(r)),
        Decision::Grant { deferred } | Decision::ChargeHome { deferred } => {
            let hv = hv.ok_or(AssignError::Refused(Refusal::CapacityExhausted))?;
            let home = cells
                .iter()
                .find(|c| c.cell_id == hv.row.cell_id)
                .ok_or(AssignError::Refused(Refusal::CapacityExhausted))?;
            if matches!(decision, Decision::ChargeHome { .. }) {
                charge_home(tx, host, hv, home, now).await?;
            }
            touch_row(tx, host, now + LEASE_TTL_MS, now).await?;
            refresh_row(tx, host, Some(now), now).await?;
            if deferred {
                events.push((
                    "orca_relay_sticky_replacement_deferred",
                    json!({"reason":"no_replacement_headroom","cellId":home.cell_id,"region":home.region}),
                ));
            }
            let lease = lease_expires_at(tx, host)
                .await?
                .unwrap_or(now + LEASE_TTL_MS);
            Ok(Grant {
                cell_id: home.cell_id.clone(),
                cell_url: home.cell_url.clone(),
                region: home.region.clone(),
                assignment_epoch: hv.row.assignment_epoch,
                lease_expires_at: lease,
                moved: None,
            })
        }
        Decision::Move { target, kind } => {
            let target = cells
                .iter()
                .find(|c| c.cell_id == target)
                .ok_or(AssignError::Refused(Refusal::CapacityExhausted))?;
            let epoch = write_move(tx, host, hv, target, kind, preferred, now).await?;
            if let (MoveKind::Isolated { source_live }, Some(hv)) = (kind, hv) {
                let from = cells.iter().find(|c| c.cell_id == hv.row.cell_id);
                events.push((
                    "orca_relay_sticky_replaced_off_isolated_cell",
                    json!({
                        "fromCellId": hv.row.cell_id,
                        "fromRegion": from.map(|c| c.region.clone()),
                        "admissionState": from.map(|c| c.admission.as_str()),
                        "toCellId": target.cell_id,
                        "region": target.region,
                        "sourceLive": source_live,
                    }),
                ));
            }
            let lease = lease_expires_at(tx, host)
                .await?
                .unwrap_or(now + LEASE_TTL_MS);
            Ok(Grant {
                cell_id: target.cell_id.clone(),
                cell_url: target.cell_url.clone(),
                region: target.region.clone(),
                assignment_epoch: epoch,
                lease_expires_at: lease,
                moved: Some(kind),
            })
        }
    }
}

/// A.7: charges the home for the host's control: the home row (≤ 500 ms), capacity, then the
/// epoch's `control-pending` lease (replacing one left over) and, on a capped home, a connection
/// reservation.
async fn charge_home(
    tx: &mut Tx,
    host: &HostKey,
    hv: &HostView,
    home: &CellView,
    now: i64,
) -> Result<(), AssignError> {
    tx.set_lock_timeout(CELL_WAIT_MS).await?;
    if !charge_cell(tx, &home.cell_id, 1, now).await? {
        return Err(AssignError::Refused(Refusal::CapacityExhausted));
    }
    let id = ActivityId::ControlPending {
        epoch: hv.row.assignment_epoch,
    }
    .to_string();
    if let Some(old) = hv.leases.iter().find(|l| l.activity_id == id) {
        delete_lease(tx, host, old, now).await?;
    }
    insert_lease(
        tx,
        host,
        &id,
        LeaseKind::Control,
        &home.cell_id,
        1,
        now + LEASE_TTL_MS,
        now,
    )
    .await?;
    if home.capped() {
        reserve_connection(tx, host, hv.row.assignment_epoch, &home.cell_id, now).await?;
    }
    Ok(())
}

/// Writes a move to `target`, whose row the caller holds; returns the new epoch.
pub async fn write_move(
    tx: &mut Tx,
    host: &HostKey,
    hv: Option<&HostView>,
    target: &CellView,
    kind: MoveKind,
    preferred: Option<&str>,
    now: i64,
) -> Result<i64, AssignError> {
    let new_epoch = match hv {
        Some(hv) => {
            if !kind.keeps_leases() {
                for l in &hv.leases {
                    delete_lease(tx, host, l, now).await?;
                }
                if let Some(m) = &hv.open_migration {
                    abort_migration(tx, host, m.assignment_epoch, "superseded", now).await?;
                }
            }
            release_epoch_reservations(tx, host, hv.row.assignment_epoch, now).await?;
            let e = hv.row.assignment_epoch + 1;
            move_row(tx, host, &target.cell_id, e, Some(now + LEASE_TTL_MS), now).await?;
            e
        }
        None => {
            let r = insert_row(
                tx,
                host,
                &target.cell_id,
                now + LEASE_TTL_MS,
                preferred,
                now,
            )
            .await;
            match r {
                Ok(epoch) => epoch,
                Err(DbError::UniqueViolation) => return Err(AssignError::Restart),
                Err(e) => return Err(e.into()),
            }
        }
    };
    if !charge_cell(tx, &target.cell_id, 1, now).await? {
        return Err(AssignError::Refused(Refusal::CapacityExhausted));
    }
    insert_lease(
        tx,
        host,
        &ActivityId::ControlPending { epoch: new_epoch }.to_string(),
        LeaseKind::Control,
        &target.cell_id,
        1,
        now + LEASE_TTL_MS,
        now,
    )
    .await?;
    if target.capped() {
        reserve_connection(tx, host, new_epoch, &target.cell_id, now).await?;
    }
    refresh_row(tx, host, Some(now), now).await?;
    Ok(new_epoch)
}

/// What `/v1/resolve` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub cell_id: String,
    pub cell_url: String,
    pub assignment_epoch: i64,
    pub lease_expires_at: i64,
}

/// `resolve(host)`: a plain read; a live home answers unchanged, anything else goes through
/// `assign` without a region hint.
pub async fn resolve(db: &Db, host: &HostKey, regions: &[String]) -> Result<Resolved, AssignError> {
    let now = crate::clock::now_ms();
    if let Some(row) = read_row(db, host).await? {
        if let Some(home) = cells::view(db, &row.cell_id).await? {
            if home.live(now) {
                return Ok(Resolved {
                    cell_id: home.cell_id,
                    cell_url: home.cell_url,
                    assignment_epoch: row.assignment_epoch,
                    lease_expires_at: row.lease_expires_at,
                });
            }
        }
    }
    let g = assign(db, host, None, regions, AssignOptions::default()).await?;
    Ok(Resolved {
        cell_id: g.cell_id,
        cell_url: g.cell_url,
        assignment_epoch: g.assignment_epoch,
        lease_expires_at: g.lease_expires_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AssignmentRow, Lease};

    fn lease(id: &str, kind: LeaseKind, cell: &str) -> Lease {
        Lease {
            activity_id: id.into(),
            kind,
            cell_id: cell.into(),
            request_units: 1,
            expires_at: 0,
            control_generation: None,
            cell_incarnation: None,
            idle_regional_rehome: false,
            renewed_at: None,
        }
    }

    #[test]
    fn simple_hosts() {
        let mut hv = HostView {
            row: AssignmentRow {
                cell_id: "A".into(),
                assignment_epoch: 1,
                lease_expires_at: 0,
                last_activity_at: 0,
                counters: LeaseCounts {
                    controls: 1,
                    splices: 1,
                    ..LeaseCounts::default()
                },
                preferred_region: None,
            },
            leases: vec![
                lease("control-pending:1", LeaseKind::Control, "A"),
                lease("splice:x", LeaseKind::Splice, "A"),
            ],
            open_migration: None,
        };
        assert!(simple(&hv));
        hv.row.counters.splices = 2;
        assert!(!simple(&hv), "invariant 2 broken");
        hv.row.counters.splices = 1;
        hv.leases[1].cell_id = "B".into();
        assert!(!simple(&hv), "a lease charged elsewhere");
    }
}
