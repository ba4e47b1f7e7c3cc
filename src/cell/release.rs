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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// Pause before a batch retries the releases whose host row was locked elsewhere (a director
/// moving the host, the host's activation on the next cell): such a row is free again within
/// one of those short transactions.
pub const ROW_BUSY_PAUSE: Duration = Duration::from_millis(20);

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
    /// When (wall ms) the release was first asked for, and when this attempt was queued.
    pub asked_at: i64,
    pub queued: Instant,
    /// When the release was first asked for (its `then` is due [`RELEASE_DEADLINE`] later).
    pub asked: Instant,
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
            asked_at: now,
            queued: Instant::now(),
            asked: Instant::now(),
        }
    }

    /// A release that lands this long after it was asked for is logged with where it waited.
    const LATE_MS: i64 = 1_000;

    /// Logs a landed release that took longer than [`Release::LATE_MS`]: how long since it was
    /// asked for, its wait in the queue, and the transaction's phases (host digest only).
    fn log_if_late(&self, path: &str, queue: Duration, t: &store::ReleaseTrace) {
        let waited = crate::clock::now_ms() - self.asked_at;
        if waited < Self::LATE_MS {
            return;
        }
        log::info!(
            "[orca-relay] activity release late host={} kind={} path={path} attempt={} asked_at={} waited_ms={waited} queue_ms={} {}",
            crate::logging::digest(&self.key.relay_host_id),
            self.kind(),
            self.attempt,
            self.asked_at,
            queue.as_millis(),
            phases(t)
        );
    }

    fn kind(&self) -> &str {
        self.activity_id.split(':').next().unwrap_or("")
    }

    /// Its deadline passed before its first attempt ended: `then` runs now, the release goes on.
    fn slow(&mut self) {
        if let Some(then) = self.then.take() {
            log::warn!(
                "[orca-relay] activity release slow host={} kind={} attempt={} waited_ms={}",
                crate::logging::digest(&self.key.relay_host_id),
                self.kind(),
                self.attempt,
                self.asked.elapsed().as_millis()
            );
            then();
        }
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

/// A trace's phases as `key=value` pairs (ms) for the log lines.
fn phases(t: &store::ReleaseTrace) -> String {
    format!(
        "attempts={} begin_ms={} retried_ms={} rows_ms={} cells_ms={} commit_ms={} skipped={}",
        t.attempts,
        t.begin.as_millis(),
        t.retried.as_millis(),
        t.rows.as_millis(),
        t.cells.as_millis(),
        t.commit.as_millis(),
        t.skipped
    )
}

/// Awaits a release to its end; once a release's [`RELEASE_DEADLINE`] (from when it was asked
/// for) has passed, its `then` runs (the socket waiting for it closes) while the release itself
/// goes on. A slow release is not cancelled: it would only start again from nothing, and a batch
/// holds many hosts' releases.
async fn past_deadline<T>(call: impl std::future::Future<Output = T>, rs: &mut [Release]) -> T {
    tokio::pin!(call);
    loop {
        let due = rs
            .iter()
            .filter(|r| r.then.is_some())
            .map(|r| r.asked + RELEASE_DEADLINE)
            .min();
        let Some(due) = due else {
            return call.await;
        };
        tokio::select! {
            out = &mut call => return out,
            _ = tokio::time::sleep_until(due.into()) => {}
        }
        let now = Instant::now();
        for r in rs.iter_mut() {
            if r.then.is_some() && r.asked + RELEASE_DEADLINE <= now {
                r.slow();
            }
        }
    }
}

#[derive(Clone)]
pub struct Releaser {
    tx: mpsc::Sender<Release>,
    ctx: Ctx,
    draining: Arc<AtomicBool>,
    /// Releases put back for the next batch because their host row was locked elsewhere.
    row_busy: Arc<AtomicU64>,
}

impl Releaser {
    pub fn start(ctx: Ctx, draining: Arc<AtomicBool>) -> Releaser {
        let (tx, rx) = mpsc::channel(QUEUE_MAX);
        let r = Releaser {
            tx,
            ctx,
            draining,
            row_busy: Arc::new(AtomicU64::new(0)),
        };
        r.ctx
            .clone()
            .spawn("activity-releaser", r.clone().batcher(rx));
        r
    }

    /// How many times a release was put back for the next batch because its host's row was
    /// locked elsewhere.
    pub fn row_busy_retries(&self) -> u64 {
        self.row_busy.load(Ordering::Relaxed)
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
            let queue = r.queued.elapsed();
            let (key, id) = (r.key.clone(), r.activity_id.clone());
            let mut trace = store::ReleaseTrace::default();
            let release = store::release_activity_traced(&self.ctx.db, &key, &id, now, &mut trace);
            let outcome = past_deadline(release, std::slice::from_mut(&mut r)).await;
            let error = match &outcome {
                Ok(()) => {
                    r.log_if_late("alone", queue, &trace);
                    String::new()
                }
                Err(e) => e.to_string(),
            };
            if !r.ended(error.is_empty(), &error, &self.draining) {
                return;
            }
            tokio::time::sleep(r.pause).await;
            r.pause = (r.pause * 2).min(RELEASE_RETRY_MAX);
            r.attempt += 1;
            r.queued = Instant::now();
        }
    }

    /// Retries `r` after its pause.
    fn retry(&self, mut r: Release) {
        let me = self.clone();
        self.ctx.spawn("activity-release-retry", async move {
            tokio::time::sleep(r.pause).await;
            r.pause = (r.pause * 2).min(RELEASE_RETRY_MAX);
            r.attempt += 1;
            r.queued = Instant::now();
            me.submit(r);
        });
    }

    /// Releases what the queue brings, in batches of up to `BATCH_MAX`, until the queue is closed
    /// and drained.
    async fn batcher(self, mut rx: mpsc::Receiver<Release>) {
        // At shutdown the queue closes (later releases run alone) and what it holds is still
        // released here; then the batcher ends.
        let mut intake = Intake {
            stop: self.ctx.child_token(),
            closed: false,
            drained: false,
        };
        // Releases whose host row was locked elsewhere: retried with the next batch, never waited
        // for. A release that waits for a row holds a pool connection the whole time (a drain's
        // hosts all race their directors' moves for their rows, and a full pool stalled the
        // cell's every release for seconds); retried here they cost one connection in all.
        let mut busy: Vec<Release> = Vec::new();
        loop {
            match intake.next_batch(&mut rx, &mut busy).await {
                Next::Batch(batch) => self.release_batch(batch, &mut busy).await,
                Next::Again => continue,
                Next::Stop => return,
            }
        }
    }

    /// Releases one batch in one store call and settles each release: landed, its row busy
    /// (kept for the next batch), or failed (retried).
    async fn release_batch(&self, mut batch: Vec<Release>, busy: &mut Vec<Release>) {
        let items: Vec<(HostKey, String)> = batch
            .iter()
            .map(|r| (r.key.clone(), r.activity_id.clone()))
            .collect();
        let now = crate::clock::now_ms();
        let started = Instant::now();
        let queue = batch
            .iter()
            .map(|r| started.saturating_duration_since(r.queued))
            .max()
            .unwrap_or_default();
        let mut trace = store::ReleaseTrace::default();
        let call = store::release_activities(&self.ctx.db, &items, now, &mut trace);
        let outcome = past_deadline(call, &mut batch).await;
        if self.draining.load(Ordering::SeqCst) {
            log::info!(
                "[orca-relay] activity release batch n={} queue_ms={} total_ms={} {}",
                items.len(),
                queue.as_millis(),
                started.elapsed().as_millis(),
                phases(&trace)
            );
        }
        for (i, mut r) in batch.into_iter().enumerate() {
            let (landed, error) = match &outcome {
                Ok(done) if done.get(i) == Some(&true) => {
                    r.log_if_late("batch", started.saturating_duration_since(r.queued), &trace);
                    (true, String::new())
                }
                Ok(_) => {
                    self.row_busy_again(r, busy);
                    continue;
                }
                Err(e) => (false, e.to_string()),
            };
            if r.ended(landed, &error, &self.draining) {
                self.retry(r);
            }
        }
    }

    /// The host's row is locked elsewhere: its first attempt has not ended; the next batch tries
    /// it again (past its give-up no lease of this process can be live any more). Over the busy
    /// list's bound it runs alone.
    fn row_busy_again(&self, mut r: Release, busy: &mut Vec<Release>) {
        self.row_busy.fetch_add(1, Ordering::Relaxed);
        r.queued = Instant::now();
        if crate::clock::now_ms() >= r.give_up {
            r.ended(false, "assignment row locked elsewhere", &self.draining);
        } else if busy.len() < QUEUE_MAX {
            busy.push(r);
        } else {
            let me = self.clone();
            self.ctx.spawn("activity-release", me.alone(r));
        }
    }
}

/// What the batcher does next.
enum Next {
    Batch(Vec<Release>),
    /// Nothing to release yet (the queue was just closed): wait again.
    Again,
    /// The queue is closed and drained, and nothing is busy.
    Stop,
}

/// The batcher's side of the queue: the shutdown token, and whether the queue is closed (no new
/// releases) and drained (nothing left in it).
struct Intake {
    stop: tokio_util::sync::CancellationToken,
    closed: bool,
    drained: bool,
}

impl Intake {
    /// The next batch: waits for a release, or with busy releases waiting, for a short pause
    /// (or a release arriving); then fills the batch from the queue without waiting.
    async fn next_batch(
        &mut self,
        rx: &mut mpsc::Receiver<Release>,
        busy: &mut Vec<Release>,
    ) -> Next {
        let mut batch = Vec::new();
        if busy.is_empty() {
            if self.drained {
                return Next::Stop;
            }
            tokio::select! {
                biased;
                r = rx.recv() => match r {
                    Some(r) => batch.push(r),
                    None => return Next::Stop,
                },
                _ = self.stop.cancelled(), if !self.closed => {
                    rx.close();
                    self.closed = true;
                    return Next::Again;
                }
            }
        } else {
            // The rows' holders are short transactions: try again shortly, or at once with
            // a release that arrives meanwhile.
            tokio::select! {
                biased;
                r = rx.recv(), if !self.drained => match r {
                    Some(r) => batch.push(r),
                    None => self.drained = true,
                },
                _ = self.stop.cancelled(), if !self.closed => {
                    rx.close();
                    self.closed = true;
                }
                _ = tokio::time::sleep(ROW_BUSY_PAUSE) => {}
            }
            let take = busy.len().min(BATCH_MAX - batch.len());
            batch.extend(busy.drain(..take));
        }
        while batch.len() < BATCH_MAX && !self.drained {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        Next::Batch(batch)
    }
}
