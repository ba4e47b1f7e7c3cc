//! The cell's heartbeats (docs/reference/http.md): the body, built from one ledger snapshot, and the beat
//! loop. Where beats go is a [`HeartbeatSink`] chosen by `server.rs` (the in-process director for a
//! process running both roles without `ORCA_RELAY_DIRECTOR_URL`, else the HTTP client of
//! [`super::heartbeat_client`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::app::Ctx;
use crate::contract::heartbeat::HeartbeatSink;
use crate::contract::wire::CellHeartbeat;

use super::Cell;

impl Cell {
    /// One heartbeat body; capped cells add the seven ledger fields from a single snapshot (which
    /// advances the inclusion watermark).
    pub fn heartbeat_body(&self, ready: bool) -> CellHeartbeat {
        let cfg = &self.ctx.config;
        let snap = self.with_ledger(|l| l.snapshot());
        let bound = cfg.hard_cap.map(|c| c.unobserved_bound as i64);
        CellHeartbeat {
            v: 1,
            cell_id: cfg.cell_id.clone(),
            cell_url: cfg.cell_url.clone(),
            region: cfg.region.clone(),
            cell_incarnation: self.ctx.incarnation.clone(),
            started_at: self.ctx.started_at,
            ready,
            observed_requests: self.observed_requests(),
            total_connections: snap.map(|s| s.physical as i64),
            in_flight_connections: snap.map(|s| s.in_flight as i64),
            reserved_connection_units: snap.map(|s| s.reserved as i64),
            enforced_connection_units: snap.map(|s| s.enforced as i64),
            connection_hard_cap: snap.map(|s| s.hard_cap as i64),
            connection_unobserved_bound: snap.and(bound),
            connection_inclusion_watermark: snap.map(|s| s.watermark as i64),
        }
    }
}

/// Beat interval.
pub const INTERVAL: Duration = Duration::from_secs(15);

/// Starts the heartbeat loop (docs/reference/http.md): the first beat is awaited here, so a process that
/// also runs the director has its local cell live before it answers any request; then one beat
/// every 15 s, single-flight (a slow beat delays the next tick, missed ticks are skipped), until
/// the process shutdown. `body` builds each beat's body when it is due.
pub async fn start<F, Fut>(
    ctx: &Ctx,
    sink: Arc<dyn HeartbeatSink>,
    body: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = CellHeartbeat> + Send,
{
    let stop = ctx.child_token();
    let metrics = ctx.metrics.clone();
    // The cell's sends, apart from the director's receipts (`orca_relay_heartbeats_total`): on a
    // single node one heartbeat is one send and one receipt, never two of the same series.
    let sent = metrics.register_counter_vec(
        crate::metrics::HEARTBEATS_SENT,
        "heartbeats this cell sent, by outcome (ok or failed)",
        &["outcome"],
    );
    let beat = move || {
        let sink = sink.clone();
        let sent = sent.clone();
        let next = body();
        async move {
            let body = next.await;
            let outcome = sink.beat(&body).await;
            let label = if outcome.is_ok() { "ok" } else { "failed" };
            sent.with_label_values(&[label]).inc();
            if let Err(reason) = outcome {
                log::warn!("[orca-relay] cell heartbeat failed {reason}");
            }
        }
    };
    beat().await;
    ctx.spawn("cell-heartbeat", async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + INTERVAL, INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            beat().await;
        }
    })
}
