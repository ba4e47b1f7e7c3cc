//! Batched control-activity renewal (docs/reference/websocket.md): rows of all hosts of the cell are flushed
//! together 1 000 ms after the first row or at 200 rows, one store call per batch.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::app::Ctx;
use crate::contract::limits;
use crate::store::assignments::{self as store, RenewalOutcome, RenewalRow};

type Job = (RenewalRow, oneshot::Sender<RenewalOutcome>);

pub struct Renewer {
    tx: mpsc::Sender<Job>,
}

impl Renewer {
    pub fn start(ctx: Ctx) -> Renewer {
        let (tx, rx) = mpsc::channel(4 * limits::RENEWAL_BATCH_ROWS);
        ctx.clone().spawn("cell-renewer", batcher(ctx, rx));
        Renewer { tx }
    }

    /// Renews one row; a batch failure or a full queue reads as `DatabaseError` (retried next tick).
    pub async fn renew(&self, row: RenewalRow) -> RenewalOutcome {
        let (tx, rx) = oneshot::channel();
        if self.tx.try_send((row, tx)).is_err() {
            return RenewalOutcome::DatabaseError;
        }
        rx.await.unwrap_or(RenewalOutcome::DatabaseError)
    }
}

async fn batcher(ctx: Ctx, mut rx: mpsc::Receiver<Job>) {
    // Ends with the process shutdown (a renewal asked after it reads as a database error).
    let stop = ctx.child_token();
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return,
            j = rx.recv() => match j {
                Some(j) => j,
                None => return,
            },
        };
        let mut jobs = vec![first];
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(limits::RENEWAL_BATCH_FLUSH_MS);
        while jobs.len() < limits::RENEWAL_BATCH_ROWS {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(j)) => {
                    // One row per host per batch: a second row for a host waits for the next batch.
                    if jobs.iter().any(|(r, _)| r.host == j.0.host) {
                        let _ = j.1.send(RenewalOutcome::AssignmentLockUnavailable);
                        continue;
                    }
                    jobs.push(j)
                }
                _ => break,
            }
        }
        let rows: Vec<RenewalRow> = jobs.iter().map(|(r, _)| r.clone()).collect();
        let outcomes = match store::try_renew_control_activities(
            &ctx.db,
            &ctx.config.cell_id,
            &ctx.incarnation,
            &rows,
            crate::clock::now_ms(),
        )
        .await
        {
            Ok(v) => v,
            Err(e) => {
                log::warn!("[orca-relay] control renewal batch failed: {e}");
                vec![RenewalOutcome::DatabaseError; rows.len()]
            }
        };
        for (i, (_, reply)) in jobs.into_iter().enumerate() {
            let _ = reply.send(
                outcomes
                    .get(i)
                    .copied()
                    .unwrap_or(RenewalOutcome::DatabaseError),
            );
        }
    }
}
