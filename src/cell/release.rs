//! Batched activity releases: every release of the cell goes through one queue and one
//! transaction per batch ([`store::release_activities`]), one batch in flight at a time; the
//! releases that arrive while one runs form the next. A drain releases most of the cell's control
//! leases within its pace window: one transaction each, they all locked the cell's row in turn
//! (and waited behind the directors' moves off the cell), so under database pressure many missed
//! their deadline and the hosts, already activated on the next cell, were still charged here.
//!
//! Each release carries its `then` (run once its first attempt has ended, see
//! [`super::Cell::release_activity_then`]) and is retried as described there. With no batcher
//! (the queue full, or the batcher gone at shutdown) a release runs on its own task as before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::app::Ctx;
use crate::contract::limits;
use crate::store::assignments::{self as store, HostKey};

/// At most this many releases per transaction.
pub const BATCH_MAX: usize = 200;
/// Releases waiting for a batch at most (beyond it a release runs on its own task).
pub const QUEUE_MAX: usize = 4_096;
/// How long a relay-initiated close waits for the control's release before it goes ahead.
pub const RELEASE_DEADLINE: Duration = Duration::from_secs(2);
/// First pause before a draining cell retries a release that did not land; doubles per attempt.
pub const RELEASE_RETRY_MIN: Duration = Duration::from_millis(200);
/// Longest pause between two release attempts.
pub const RELEASE_RETRY_MAX: Duration = Duration::from_secs(2);

pub type Then = Box<dyn FnOnce() + Send>;

/// One release on its way.
pub struct Release {
    pub key: HostKey,
    pub activity_id: String,
    pub then: Option<Then>,
    pub attempt: u32,
    /// Past this (ms) no lease of this process can be live: no more retries.
    pub give_up: i64,
    pub pause: Duration,
}

impl Release {
    pub fn new(key: HostKey, activity_id: String, then: Then, now: i64) -> Release {
        Release {
            key,
            activity_id,
            then: Some(then),
            attempt: 1,
            give_up: now + limits::CONTROL_ACTIVITY_EXPIRY_MAX_MS,
            pause: RELEASE_RETRY_MIN,
        }
    }

    fn kind(&self) -> &str {
        self.activity_id.split(':').next().unwrap_or("")
    }

    /// The attempt ended: run `then` if it has not run, log a miss, and say whether to retry.
    fn ended(&mut self, landed: bool, error: &str, draining: &AtomicBool) -> bool {
        if !landed {
            log::warn!(
                "[orca-relay] activity release failed host={} kind={} attempt={} error={error}",
                crate::logging::digest(&self.key.relay_host_id),
                self.kind(),
                self.attempt
            );
        } else if self.attempt > 1 {
            log::info!(
                "[orca-relay] activity release landed host={} kind={} attempts={}",
                crate::logging::digest(&self.key.relay_host_id),
                self.kind(),
                self.attempt
            );
        }
        if let Some(then) = self.then.take() {
            then();
        }
        !landed
            && draining.load(Ordering::SeqCst)
            && crate::clock::now_ms() + (self.pause.as_millis() as i64) < self.give_up
    }
}

/// Awaits a release to its end; once [`RELEASE_DEADLINE`] has passed, the releases' `then`s run
/// (the sockets waiting for them close) while the release itself goes on. A slow release is not
/// cancelled: it would only start again from nothing, and a batch holds many hosts' releases.
async fn past_deadline<T>(call: impl std::future::Future<Output = T>, rs: &mut [Release]) -> T {
    tokio::pin!(call);
    tokio::select! {
        out = &mut call => return out,
        _ = tokio::time::sleep(RELEASE_DEADLINE) => {}
    }
    for r in rs.iter_mut() {
        if let Some(then) = r.then.take() {
            log::warn!(
                "[orca-relay] activity release slow host={} kind={} attempt={} waited_ms={}",
                crate::logging::digest(&r.key.relay_host_id),
                r.kind(),
                r.attempt,
                RELEASE_DEADLINE.as_millis()
            );
            then();
        }
    }
    call.await
}

#[derive(Clone)]
pub struct Releaser {
    tx: mpsc::Sender<Release>,
    ctx: Ctx,
    draining: Arc<AtomicBool>,
}

impl Releaser {
    pub fn start(ctx: Ctx, draining: Arc<AtomicBool>) -> Releaser {
        let (tx, rx) = mpsc::channel(QUEUE_MAX);
        let r = Releaser { tx, ctx, draining };
        r.ctx
            .clone()
            .spawn("activity-releaser", r.clone().batcher(rx));
        r
    }

    /// Queues a release (or runs it on its own task when the queue cannot take it).
    pub fn submit(&self, r: Release) {
        if let Err(e) = self.tx.try_send(r) {
            let r = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r,
            };
            let me = self.clone();
            self.ctx.spawn("activity-release", me.alone(r));
        }
    }

    /// One release on its own, attempts and retries included.
    async fn alone(self, mut r: Release) {
        loop {
            let now = crate::clock::now_ms();
            let (key, id) = (r.key.clone(), r.activity_id.clone());
            let release = store::release_activity(&self.ctx.db, &key, &id, now);
            let outcome = past_deadline(release, std::slice::from_mut(&mut r)).await;
            let error = match &outcome {
                Ok(()) => String::new(),
                Err(e) => e.to_string(),
            };
            if !r.ended(error.is_empty(), &error, &self.draining) {
                return;
            }
            tokio::time::sleep(r.pause).await;
            r.pause = (r.pause * 2).min(RELEASE_RETRY_MAX);
            r.attempt += 1;
        }
    }

    /// Retries `r` after its pause.
    fn retry(&self, mut r: Release) {
        let me = self.clone();
        self.ctx.spawn("activity-release-retry", async move {
            tokio::time::sleep(r.pause).await;
            r.pause = (r.pause * 2).min(RELEASE_RETRY_MAX);
            r.attempt += 1;
            me.submit(r);
        });
    }

    async fn batcher(self, mut rx: mpsc::Receiver<Release>) {
        // At shutdown the queue closes (later releases run alone) and what it holds is still
        // released here; then the batcher ends.
        let stop = self.ctx.child_token();
        let mut closed = false;
        loop {
            let first = tokio::select! {
                biased;
                r = rx.recv() => match r {
                    Some(r) => r,
                    None => return,
                },
                _ = stop.cancelled(), if !closed => {
                    rx.close();
                    closed = true;
                    continue;
                }
            };
            let mut batch = vec![first];
            while batch.len() < BATCH_MAX {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            let items: Vec<(HostKey, String)> = batch
                .iter()
                .map(|r| (r.key.clone(), r.activity_id.clone()))
                .collect();
            let now = crate::clock::now_ms();
            let call = store::release_activities(&self.ctx.db, &items, now);
            let outcome = past_deadline(call, &mut batch).await;
            for (i, mut r) in batch.into_iter().enumerate() {
                let (landed, error) = match &outcome {
                    Ok(done) if done.get(i) == Some(&true) => (true, String::new()),
                    Ok(_) => {
                        // The host's row is locked elsewhere (a director moving it): this one
                        // waits for the row on its own (≤ 1 000 ms per try), as a lone release
                        // does; its first attempt has not ended.
                        let me = self.clone();
                        self.ctx.spawn("activity-release", me.alone(r));
                        continue;
                    }
                    Err(e) => (false, e.to_string()),
                };
                if r.ended(landed, &error, &self.draining) {
                    self.retry(r);
                }
            }
        }
    }
}
