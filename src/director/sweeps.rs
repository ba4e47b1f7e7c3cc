//! The sweep chain (director.md §5.6), every 30 s ± 20 % while the director runs. Each step is
//! isolated; items are locked NOWAIT and skipped when busy, so concurrent directors are safe.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::assign::{assign, AssignError, AssignOptions};
use super::migrate::{self as m, SweepCount};
use super::Director;
use crate::store::DbError;

/// Starts the loop; it stops when `stop` (or the process shutdown) is cancelled.
pub fn spawn(d: Arc<Director>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let jitter = 0.8 + rand::random::<f64>() * 0.4;
            let wait = Duration::from_millis((30_000.0 * jitter) as u64);
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
            log::debug!("sweep {step}: {e}");
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
        for c in cells {
            d.ctx
                .metrics
                .cell_live
                .with_label_values(&[&c.cell_id])
                .set(c.live(now) as i64);
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
        m::release_expired_leases(db, now).await,
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
}

/// `credential-cleanup` (protocol.md §7): expire invites (releasing their `invite-offer:*`
/// activity), lapsed `reserved` invites → `cooldown`, deactivate bases past their deadline, consume
/// lapsed direct authorizations, delete rate windows older than 24 h.
async fn credential_cleanup(d: &Director, now: i64) -> Result<SweepCount, DbError> {
    let db = &d.ctx.db;
    let expiring = db
        .query(
            "SELECT token_hash, user_id, relay_host_id, offer_req_id FROM relay_invites \
             WHERE state IN ('available', 'reserved', 'cooldown') AND expires_at <= $1 LIMIT 500",
            crate::params![now],
        )
        .await?;
    let mut count = SweepCount::default();
    for r in &expiring {
        let n = db
            .execute(
                "UPDATE relay_invites SET state = 'expired', updated_at = $2 WHERE token_hash = $1 \
                 AND state IN ('available', 'reserved', 'cooldown')",
                crate::params![r.str(0), now],
            )
            .await?;
        if n == 0 {
            continue;
        }
        count.done += 1;
        if let Some(req) = r.opt_str(3) {
            let host = crate::store::assignments::HostKey {
                user_id: r.str(1),
                relay_host_id: r.str(2),
            };
            match crate::store::assignments::release_activity(
                db,
                &host,
                &format!("invite-offer:{req}"),
                now,
            )
            .await
            {
                Ok(()) => {}
                Err(DbError::LockUnavailable) => count.skipped += 1,
                Err(e) => return Err(e),
            }
        }
    }
    db.execute(
        "UPDATE relay_invites SET state = 'cooldown', cooldown_until = $2, updated_at = $1 \
         WHERE state = 'reserved' AND reservation_expires_at IS NOT NULL AND reservation_expires_at <= $1",
        crate::params![now, now + 2_000],
    )
    .await?;
    db.execute(
        "UPDATE relay_connection_bases SET active = $2 WHERE active = $3 AND deadline < $1",
        crate::params![now, false, true],
    )
    .await?;
    db.execute(
        "UPDATE relay_direct_authorizations SET consumed_at = $1 WHERE consumed_at IS NULL AND deadline < $1",
        crate::params![now],
    )
    .await?;
    db.execute(
        "DELETE FROM relay_rate_windows WHERE window_start < $1",
        crate::params![now - 86_400_000],
    )
    .await?;
    Ok(count)
}

/// `evacuate-dead-cells` (§6.4): `assign` without a region hint and with a 1 000 ms cell-row wait,
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
                cell_wait_ms: 1_000,
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
