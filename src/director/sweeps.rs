//! The sweep chain (ARCHITECTURE.md), every 30 s ± 20 % while the director runs
//! (`ORCA_RELAY_SWEEP_INTERVAL_MS`). Each step is
//! isolated; items are locked NOWAIT and skipped when busy, so concurrent directors are safe.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::assign::{assign, AssignError, AssignOptions};
use super::migrate::{self as m, SweepCount};
use super::Director;
use crate::contract::limits::INVITE_COOLDOWN_MS;
use crate::model::ActivityId;
use crate::store::DbError;
use crate::store::{assignments, credentials};

/// Invites expired per `credential-cleanup` pass.
const INVITE_BATCH: i64 = 500;
/// Rate windows are kept 24 h.
const RATE_WINDOW_RETENTION_MS: i64 = 86_400_000;
/// The dead-cell sweep waits up to 1 s for cell rows (ARCHITECTURE.md).
const DEAD_CELL_WAIT_MS: u64 = 1_000;

/// Starts the loop; it stops when `stop` (or the process shutdown) is cancelled. The period is
/// `ORCA_RELAY_SWEEP_INTERVAL_MS` ± 20 % (ARCHITECTURE.md: 30 s; shorter only in tests and
/// benchmarks).
pub fn spawn(d: Arc<Director>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    let every_ms = d.ctx.config.sweep_interval_ms as f64;
    d.ctx.clone().spawn("director-sweeps", async move {
        loop {
            let jitter = 0.8 + rand::random::<f64>() * 0.4;
            let wait = Duration::from_millis((every_ms * jitter) as u64);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = d.ctx.shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = run_once(&d) => {}
            }
        }
    })
}

fn report(step: &str, r: Result<SweepCount, DbError>) {
    match r {
        Ok(c) if c.skipped > 0 => crate::logging::event(
            "orca_relay_sweep_busy",
            json!({"sweep": step, "skipped": c.skipped}),
        ),
        Ok(_) => {}
        Err(e) => {
            log::warn!("[orca-relay] assignment cleanup failed: {step}");
            log::debug!("[orca-relay] sweep {step}: {e}");
        }
    }
}

/// One pass of the chain, in order.
pub async fn run_once(d: &Director) {
    let db = &d.ctx.db;
    let now = crate::clock::now_ms();
    // `orca_relay_cell_live` follows silence too, not only heartbeats.
    if let Ok(cells) = crate::store::cells::views(
        crate::store::cells::Reader::Db(db),
        crate::store::cells::Which::All,
        false,
    )
    .await
    {
        let m = &d.ctx.metrics;
        let mut ready: std::collections::BTreeMap<&str, i64> = d
            .ctx
            .config
            .regions
            .iter()
            .map(|r| (r.as_str(), 0))
            .collect();
        for c in &cells {
            let live = c.live(now);
            m.cell_live
                .with_label_values(&[&c.cell_id])
                .set(live as i64);
            if live && c.admission == crate::model::Admission::General {
                *ready.entry(c.region.as_str()).or_default() += 1;
            }
        }
        // `orca_relay_cells_ready{region}`: the cells a new host can be placed on.
        for (region, n) in ready {
            m.cells_ready.with_label_values(&[region]).set(n);
        }
    }
    report("refresh-migrations", m::refresh_migrations(db, now).await);
    report(
        "complete-ready-migrations",
        m::complete_ready(db, now).await,
    );
    report(
        "expire-unarrived-migrations",
        m::expire_unarrived(db, now).await,
    );
    report("expire-aged-migrations", m::expire_aged(db, now).await);
    report(
        "release-expired-activity-leases",
        release_expired_leases(db, now).await,
    );
    report(
        "release-connection-reservations",
        m::release_old_reservations(db, now)
            .await
            .map(|_| SweepCount::default()),
    );
    report(
        "release-expired-region-decisions",
        m::release_old_decisions(db, now)
            .await
            .map(|_| SweepCount::default()),
    );
    report("evacuate-dead-cells", evacuate_dead_cells(d, now).await);
    report("credential-cleanup", credential_cleanup(d, now).await);
    // An attempt aborted by any step (or by a forced move) disables the control, in a transaction
    // of its own after the abort committed.
    match crate::rehome::service::disable_after_aborts(&d.ctx.db, now).await {
        Ok(Some((name, fields))) => crate::logging::event(name, fields),
        Ok(None) => {}
        Err(e) => log::warn!("[orca-relay] assignment cleanup failed: regional-rehome-aborts {e}"),
    }
}

/// `release-expired-activity-leases`, drained: batches of 500 leases (one transaction per host)
/// until every lease expired at `now` was visited, instead of one batch per 30 s sweep. The walk
/// moves a cursor forward, so busy or kept leases are passed over, not retried in a loop.
async fn release_expired_leases(db: &crate::store::Db, now: i64) -> Result<SweepCount, DbError> {
    let mut total = SweepCount::default();
    let mut cursor = None;
    loop {
        let (c, next) = m::release_expired_leases(db, now, cursor.as_ref()).await?;
        total.done += c.done;
        total.skipped += c.skipped;
        match next {
            Some(n) => cursor = Some(n),
            None => return Ok(total),
        }
    }
}

/// `credential-cleanup` (docs/reference/websocket.md): expire invites (releasing their `invite-offer:*`
/// activity), lapsed `reserved` invites → `cooldown`, deactivate bases past their deadline, consume
/// lapsed direct authorizations, delete rate windows older than 24 h.
async fn credential_cleanup(d: &Director, now: i64) -> Result<SweepCount, DbError> {
    let db = &d.ctx.db;
    let mut count = SweepCount::default();
    for inv in credentials::expiring_invites(db, now, INVITE_BATCH).await? {
        if !credentials::expire_invite(db, &inv.token_hash, now).await? {
            continue;
        }
        count.done += 1;
        if let Some(req) = inv.offer_req_id {
            let id = ActivityId::InviteOffer(req).to_string();
            match assignments::release_activity(db, &inv.host, &id, now).await {
                Ok(()) => {}
                Err(DbError::LockUnavailable) => count.skipped += 1,
                Err(e) => return Err(e),
            }
        }
    }
    credentials::cool_down_lapsed_reservations(db, now, now + INVITE_COOLDOWN_MS).await?;
    credentials::deactivate_lapsed_bases(db, now).await?;
    credentials::consume_lapsed_authorizations(db, now).await?;
    credentials::delete_rate_windows_before(db, now - RATE_WINDOW_RETENTION_MS).await?;
    Ok(count)
}

/// `evacuate-dead-cells`: `assign` without a region hint and with a 1 000 ms cell-row wait,
/// no rejection lines.
async fn evacuate_dead_cells(d: &Director, now: i64) -> Result<SweepCount, DbError> {
    let hosts = m::dead_cell_hosts(&d.ctx.db, now).await?;
    let mut per_cell: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut count = SweepCount::default();
    for (cell, host) in hosts {
        let r = assign(
            &d.ctx.db,
            &host,
            None,
            &d.ctx.config.regions,
            AssignOptions {
                cell_wait_ms: DEAD_CELL_WAIT_MS,
                spare_serving: true,
            },
        )
        .await;
        let e = per_cell.entry(cell).or_default();
        match r {
            Ok(g) if g.moved.is_some() => {
                e.0 += 1;
                count.done += 1;
            }
            Ok(_) => {}
            Err(AssignError::RowBusy) => count.skipped += 1,
            // Still served there (an unexpired control lease): left until it ends or lapses.
            Err(AssignError::Spared) => {}
            Err(_) => e.1 += 1,
        }
    }
    for (cell, (moved, failed)) in per_cell {
        if moved + failed > 0 {
            crate::logging::event(
                "orca_relay_dead_cell_evacuation",
                json!({"cellId": cell, "moved": moved, "failed": failed}),
            );
        }
    }
    Ok(count)
}
