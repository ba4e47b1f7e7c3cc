//! Background jobs (docs/reference/http.md / docs/metrics.md): prune timers, the 60 s counters line, the queue-depth gauge.
//!
//! Each job is a chained timer: the next run is scheduled after the previous one ends, so a job never
//! overlaps itself.

use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::RETENTION_MS;
use crate::app::Ctx;
use crate::clock::now_ms;
use crate::logging;
use crate::store::push::{self as store, PruneTarget};

const BATCH: i64 = 2000;
const MAX_BATCHES: usize = 50;
/// A late proof after pruning must read `invalid_proof`, not `invalid_challenge`: keep 30 s extra.
const CHALLENGE_PRUNE_LAG_MS: i64 = 30_000;

pub fn spawn_prune(ctx: Ctx, stop: CancellationToken) {
    let every = |secs: u64| Duration::from_secs(secs);
    for (name, interval) in [
        ("challenges", every(60)),
        ("sessions", every(600)),
        ("deliveries", every(60)),
    ] {
        let ctx = ctx.clone();
        let stop = stop.clone();
        ctx.clone().spawn("push-prune", async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
                let started = Instant::now();
                if let Err((target, e)) = sweep(&ctx, name).await {
                    logging::event_warn(
                        "orca_push_prune_failed",
                        json!({"target": target, "error": super::worker::db_class(&e)}),
                    );
                }
                if started.elapsed() > interval {
                    logging::event_warn("orca_push_prune_overdue", json!({"target": name}));
                }
            }
        });
    }
}

/// One sweep of a job; a full last batch reruns the sweep at once.
pub async fn sweep(ctx: &Ctx, job: &str) -> Result<(), (&'static str, crate::store::DbError)> {
    loop {
        let now = now_ms();
        let mut again = false;
        let targets: &[(&PruneTarget, i64)] = match job {
            "challenges" => &[(&store::PRUNE_CHALLENGES[0], now - CHALLENGE_PRUNE_LAG_MS)],
            "sessions" => &[(&store::PRUNE_SESSIONS[0], now)],
            _ => &[
                (&store::PRUNE_DELIVERIES[0], now),
                (&store::PRUNE_DELIVERIES[1], now - RETENTION_MS),
            ],
        };
        for (t, bound) in targets {
            again |= prune_table(ctx, t, *bound).await.map_err(|e| (t.name, e))?;
        }
        if job == "deliveries" {
            for _ in 0..MAX_BATCHES {
                let n = store::prune_composite(&ctx.db, now - RETENTION_MS, BATCH)
                    .await
                    .map_err(|e| ("recipients", e))?;
                if n < BATCH as u64 {
                    break;
                }
            }
        }
        if !again {
            return Ok(());
        }
    }
}

/// Up to 50 batches; true when the last batch was full.
async fn prune_table(
    ctx: &Ctx,
    t: &PruneTarget,
    bound: i64,
) -> Result<bool, crate::store::DbError> {
    for _ in 0..MAX_BATCHES {
        let n = store::prune_target(&ctx.db, t, bound, BATCH).await?;
        if n < BATCH as u64 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The counters emitter: every `interval`, one line with the increases since the last line, if any.
pub struct Counters {
    last: std::sync::Mutex<Vec<u64>>,
}

impl Counters {
    pub fn new() -> Counters {
        Counters {
            last: std::sync::Mutex::new(vec![0; crate::metrics::PUSH_COUNTERS.len()]),
        }
    }

    /// Logs the line when any counter moved; returns whether it did.
    pub fn emit(&self, ctx: &Ctx) -> bool {
        let now = ctx.metrics.push_values();
        let mut last = crate::sync::lock(&self.last);
        let mut fields = Map::new();
        let mut moved = false;
        for (i, (name, v)) in now.iter().enumerate() {
            let d = v.saturating_sub(last[i]);
            moved |= d > 0;
            fields.insert((*name).into(), d.into());
            last[i] = *v;
        }
        if moved {
            logging::event("orca_push_counters", Value::Object(fields));
        }
        moved
    }
}

impl Default for Counters {
    fn default() -> Self {
        Self::new()
    }
}

pub fn spawn_counters(
    ctx: Ctx,
    counters: std::sync::Arc<Counters>,
    interval: Duration,
    stop: CancellationToken,
) {
    ctx.clone().spawn("push-counters", async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            counters.emit(&ctx);
        }
    });
}

/// Samples `orca_push_queue_depth` every 10 s.
pub fn spawn_gauge(ctx: Ctx, stop: CancellationToken) {
    ctx.clone().spawn("push-gauge", async move {
        loop {
            if let Ok(n) = store::queue_depth(&ctx.db, now_ms()).await {
                ctx.metrics.push_queue_depth.set(n);
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
    });
}
