//! The sweep chain (director.md §5.6), every 30 s ± 20 % while the director runs.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Director;

/// Starts the loop; it stops when `stop` is cancelled.
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
            run_once(&d).await;
        }
    })
}

/// One pass of the chain; each step is isolated.
pub async fn run_once(d: &Director) {
    let _ = d;
}
