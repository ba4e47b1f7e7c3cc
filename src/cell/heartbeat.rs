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

/// The first retry after a failed beat; each further failure doubles it, up to [`INTERVAL`].
pub const RETRY_FIRST: Duration = Duration::from_secs(1);

/// How long after the start of the last beat the next one is due, given how many beats in a
/// row have failed. A cell whose beat failed (a director restarting, a cut link) tries again
/// soon instead of staying out of the director's view for a whole interval, and backs off so a
/// dead director is not hammered.
pub fn next_beat_after(failed_in_a_row: u32) -> Duration {
    if failed_in_a_row == 0 {
        return INTERVAL;
    }
    let doublings = (failed_in_a_row - 1).min(16);
    RETRY_FIRST.saturating_mul(1 << doublings).min(INTERVAL)
}

/// Starts the heartbeat loop (docs/reference/http.md): the first beat is awaited here, so a process that
/// also runs the director has its local cell live before it answers any request; then one beat
/// every 15 s counted from the start of the last one (a beat slower than that is followed at
/// once), sooner after a failure ([`next_beat_after`]), until the process shutdown. `body`
/// builds each beat's body when it is due.
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
            if let Err(reason) = &outcome {
                log::warn!("[orca-relay] cell heartbeat failed {reason}");
            }
            outcome.is_ok()
        }
    };
    let mut started = tokio::time::Instant::now();
    let mut failed = u32::from(!beat().await);
    ctx.spawn("cell-heartbeat", async move {
        loop {
            let due = started + next_beat_after(failed);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(due) => {}
            }
            started = tokio::time::Instant::now();
            failed = if beat().await {
                0
            } else {
                failed.saturating_add(1)
            };
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_beat_is_retried_sooner_with_backoff_up_to_the_interval() {
        assert_eq!(next_beat_after(0), INTERVAL);
        let secs: Vec<u64> = (1..=6).map(|n| next_beat_after(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 15, 15]);
        assert_eq!(next_beat_after(u32::MAX), INTERVAL);
    }
}
