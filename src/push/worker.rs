//! The durable delivery worker (ARCHITECTURE.md): the database is the queue.
//!
//! One claimer loop per process claims due deliveries in batches (one transaction leases up to
//! [`CLAIM_BATCH`] heads of distinct registrations, see [`store::claim_batch`]), hands each to its
//! own task, and the tasks call the providers concurrently, at most [`IN_FLIGHT`] at once: APNs
//! multiplexes them as streams over one reused HTTP/2 connection per origin (the peer's stream limit
//! queues the rest). Outcomes go to one finisher task that applies whatever has accumulated in one
//! transaction ([`store::finish_batch`]: one `DELETE`, one `UPDATE`), so commits group themselves
//! under load and cost one round trip each when idle. A delivery keeps its in-flight slot until its
//! finish is committed; the claimer claims again whenever a slot frees, an enqueue wakes it, or the
//! 1 s tick passes. Leases (30 s, renewed every 10 s during the call) make delivery at-least-once
//! across crashes and processes: a crash between the provider's answer and the finish leaves the
//! lease to lapse, and the row is claimed and sent again.
//!
//! Where the spec's "12 drains × 25 claims of one row" and this batched claimer differ, the
//! guarantees are the same ones: at most one delivery in flight per registration across every
//! process, heads in due order, every finish matching its lease token, the same retry, backoff,
//! expiry, fence and retire rules.
//!
//! A *run* is one pass of the claimer: it starts on a tick or wake and ends when a claim finds
//! nothing while nothing is in flight, or on a failure. Failures inside a run (its claims, and the
//! deliveries and finishes of what it claimed) are collected and logged once when the run and all
//! its deliveries are done (`orca_push_worker_failed`), so a database outage costs one line per
//! tick. A run that ended on an empty claim with nothing in flight is an *idle pass*: nothing was
//! due when it looked. [`Worker::settled`] waits for an idle pass that started after the call,
//! which is what in-process tests wait for instead of fixed windows; `orca_push_worker_runs_total`
//! counts runs by how they ended (`idle`, `failed`, `stopped`), so a test of another process waits
//! for its idle count to move by two (the second idle pass started after the first was counted).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus::IntCounterVec;
use serde_json::json;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::apns::Apns;
use super::fcm::Fcm;
use super::model::Notification;
use super::provider::{backoff_ms, Outcome};
use super::LIMITS;
use crate::app::Ctx;
use crate::clock::now_ms;
use crate::logging;
use crate::store::push::{self as store, Claimed, Finish, Target};

const TICK: Duration = Duration::from_millis(1000);
/// Deliveries in flight at once (provider calls plus finishes not yet committed).
pub const IN_FLIGHT: usize = 256;
/// Rows one claim transaction leases at most.
pub const CLAIM_BATCH: usize = 128;
/// After a finish, claim again only once this many slots are free (or nothing is in flight). With
/// a backlog, a claim's cost is mostly the scan past the queued rows of registrations already in
/// flight (each fails the head rule), which grows with what is in flight: claiming when half the
/// slots are free keeps that cost per delivered row small. A wake or the tick claims whatever is
/// free, so a new send never waits for this.
const CLAIM_MIN: usize = IN_FLIGHT / 2;
/// Finishes one finish transaction applies at most.
const FINISH_BATCH: usize = 256;
const RENEW_EVERY: Duration = Duration::from_millis(10_000);
/// While deliveries are in flight, a wake claims once this many rows were enqueued since the
/// last claim, or [`WAKE_DELAY`] after the wake, whichever comes first. Under a stream of sends
/// every accepted recipient wakes the worker; claiming on each wake made claims of one or two rows,
/// each a transaction of four round trips. With nothing in flight a wake claims at once, so an
/// idle gateway adds no latency.
const WAKE_BATCH: usize = 64;
/// The longest a wake waits for company while deliveries are in flight.
const WAKE_DELAY: Duration = Duration::from_millis(5);
/// Delay after an unexpected failure in the send path.
const EXCEPTION_DELAY_MS: i64 = 5000;

pub struct Worker {
    ctx: Ctx,
    apns: Option<Arc<Apns>>,
    fcm: Option<Arc<Fcm>>,
    wake: Notify,
    /// Rows enqueued (wakes) since the claimer last claimed.
    woken: AtomicUsize,
    /// A finish was committed (a slot and maybe a registration freed).
    finished: Notify,
    in_flight: Arc<Semaphore>,
    /// Bounds the worker's database connections to pool_max − 1 so requests always find one.
    db_slots: Arc<Semaphore>,
    /// Stops claiming (shutdown).
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Where deliveries send their outcomes. Unbounded in type only: every entry holds one of the
    /// [`IN_FLIGHT`] slots. Taken at shutdown, so the finisher ends once the last run and
    /// delivery dropped their clones and everything sent was committed.
    finishes: Mutex<Option<mpsc::UnboundedSender<Done>>>,
    finish_rx: Mutex<Option<mpsc::UnboundedReceiver<Done>>>,
    /// Runs started so far (the sequence number of the latest run).
    runs: AtomicU64,
    /// Runs that failed (each logged once).
    failed_runs: AtomicU64,
    /// The sequence number of the latest idle pass.
    idle: watch::Sender<u64>,
    /// `orca_push_worker_runs_total{end}`.
    ends: IntCounterVec,
}

/// The `end` label values of `orca_push_worker_runs_total`.
const RUN_ENDS: [&str; 3] = ["idle", "failed", "stopped"];

/// One run's shared record: the first failure of its claims or deliveries, and whether it ended
/// on an empty claim with nothing in flight. Ends (logs or marks an idle pass) when the last
/// reference, held by the claimer and by each delivery it claimed, is dropped.
struct Run {
    seq: u64,
    failure: Mutex<Option<(&'static str, &'static str)>>,
    busy: AtomicBool,
    worker: Weak<Worker>,
}

impl Run {
    fn fail(&self, error: &'static str, target: &'static str) {
        let mut f = crate::sync::lock(&self.failure);
        if f.is_none() {
            *f = Some((error, target));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let failure = crate::sync::lock(&self.failure).take();
        if let Some(w) = self.worker.upgrade() {
            w.end_run(self.seq, failure, self.busy.load(Ordering::SeqCst));
        }
    }
}

/// A delivery whose outcome waits to be committed, with its slot.
struct Done {
    claimed: Claimed,
    finish: Finish,
    /// Count `delivery_expired` when the delete lands.
    expired: bool,
    run: Arc<Run>,
    _slot: OwnedSemaphorePermit,
}

impl Worker {
    pub fn new(ctx: Ctx, apns: Option<Arc<Apns>>, fcm: Option<Arc<Fcm>>) -> Arc<Worker> {
        let slots = ctx.config.database_pool_max.saturating_sub(1).max(1);
        let stop = ctx.child_token();
        let (finishes, rx) = mpsc::unbounded_channel();
        let ends = ctx.metrics.register_counter_vec(
            "orca_push_worker_runs_total",
            "push delivery worker runs by how they ended: idle (nothing due, nothing in flight), failed (logged as orca_push_worker_failed), stopped (shutdown)",
            &["end"],
        );
        for end in RUN_ENDS {
            ends.with_label_values(&[end]);
        }
        Arc::new(Worker {
            ctx,
            apns,
            fcm,
            wake: Notify::new(),
            woken: AtomicUsize::new(0),
            finished: Notify::new(),
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
            db_slots: Arc::new(Semaphore::new(slots)),
            stop,
            tasks: TaskTracker::new(),
            finishes: Mutex::new(Some(finishes)),
            finish_rx: Mutex::new(Some(rx)),
            runs: AtomicU64::new(0),
            failed_runs: AtomicU64::new(0),
            idle: watch::Sender::new(0),
            ends,
        })
    }

    /// Waits for an idle pass (see the module docs) of a run started after this call: everything
    /// due before the call has been delivered or rescheduled and nothing is in flight.
    pub async fn settled(&self) {
        let after = self.runs.load(Ordering::SeqCst);
        let mut rx = self.idle.subscribe();
        let _ = rx.wait_for(|&seq| seq > after).await;
    }

    /// Runs started and runs that failed, since start-up.
    pub fn run_counts(&self) -> (u64, u64) {
        (
            self.runs.load(Ordering::SeqCst),
            self.failed_runs.load(Ordering::SeqCst),
        )
    }

    /// Wake-on-enqueue.
    pub fn wake(&self) {
        self.woken.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// The claimer loop (tick or wake → a run) and the finisher.
    pub fn spawn(self: &Arc<Self>) {
        if let Some(rx) = crate::sync::lock(&self.finish_rx).take() {
            let w = self.clone();
            self.tasks.spawn(async move { w.finisher(rx).await });
        }
        let w = self.clone();
        self.ctx.spawn("push-worker", async move {
            loop {
                tokio::select! {
                    _ = w.stop.cancelled() => break,
                    _ = tokio::time::sleep(TICK) => {}
                    _ = w.wake.notified() => {}
                }
                w.run().await;
            }
        });
    }

    fn free_slots(&self) -> usize {
        self.in_flight.available_permits()
    }

    /// One run: claim while anything is due, deliver concurrently, end on an empty claim with
    /// nothing in flight, on a failure or at shutdown.
    async fn run(self: &Arc<Self>) {
        let Some(finishes) = crate::sync::lock(&self.finishes).clone() else {
            return;
        };
        let run = Arc::new(Run {
            seq: self.runs.fetch_add(1, Ordering::SeqCst) + 1,
            failure: Mutex::new(None),
            busy: AtomicBool::new(false),
            worker: Arc::downgrade(self),
        });
        let mut claim_now = true;
        loop {
            if self.stop.is_cancelled() {
                run.busy.store(true, Ordering::SeqCst);
                return;
            }
            let free = self.free_slots();
            let was_idle = free == IN_FLIGHT;
            if free == 0 || (!claim_now && free < CLAIM_MIN && !was_idle) {
                claim_now = self.pause().await;
                continue;
            }
            let asked = free.min(CLAIM_BATCH);
            // Shutdown waits for deliveries, not for claims: a claim stuck on an unreachable
            // database would hold the worker until the store's call deadline.
            let claimed = tokio::select! {
                _ = self.stop.cancelled() => {
                    run.busy.store(true, Ordering::SeqCst);
                    return;
                }
                r = async {
                    let _slot = self.db_slots.acquire().await;
                    // Rows enqueued from here on are for the next claim to find.
                    self.woken.store(0, Ordering::Relaxed);
                    store::claim_batch(&self.ctx.db, &LIMITS, now_ms(), asked).await
                } => r,
            };
            let batch = match claimed {
                Ok(b) => b,
                Err(e) => {
                    run.fail(db_class(&e), "claim");
                    return;
                }
            };
            let progressed = batch.progressed();
            // A claim that found fewer rows than it asked for took everything claimable: more
            // comes with a wake (an enqueue) or a finish (a registration freed), so claiming again
            // at once would find nothing. A full claim or deleted fenced alerts (their
            // registrations' next rows are due) may leave more.
            let more = batch.claimed.len() >= asked || batch.fenced > 0;
            claim_now = false;
            for c in batch.claimed {
                // The claim asked for at most `free` rows and only this loop takes slots, so this
                // never waits (and the semaphore is never closed).
                let Ok(slot) = self.in_flight.clone().acquire_owned().await else {
                    break;
                };
                let (w, run, tx) = (self.clone(), run.clone(), finishes.clone());
                self.tasks
                    .spawn(async move { w.deliver(run, c, slot, tx).await });
            }
            if more {
                continue;
            }
            if progressed {
                claim_now = self.pause().await;
                continue;
            }
            if was_idle && batch.busy == 0 {
                // Nothing due and nothing was in flight when it looked: an idle pass.
                return;
            }
            // Wait for a slot's registration to free (or another claimer's transaction to end).
            claim_now = self.pause().await;
        }
    }

    /// Waits for a committed finish (false), a wake, the tick or shutdown (true: claim at once).
    async fn pause(&self) -> bool {
        tokio::select! {
            _ = self.finished.notified() => false,
            _ = self.wake.notified() => {
                self.gather_wakes().await;
                true
            }
            _ = tokio::time::sleep(TICK) => true,
            _ = self.stop.cancelled() => true,
        }
    }

    /// After a wake while deliveries are in flight: waits until [`WAKE_BATCH`] rows were
    /// enqueued since the last claim, [`WAKE_DELAY`] passed or shutdown, so one claim takes them
    /// together. With nothing in flight it returns at once.
    async fn gather_wakes(&self) {
        if self.free_slots() == IN_FLIGHT {
            return;
        }
        let until = tokio::time::Instant::now() + WAKE_DELAY;
        while self.woken.load(Ordering::Relaxed) < WAKE_BATCH {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(until) => return,
                _ = self.stop.cancelled() => return,
            }
        }
    }

    /// The last reference to run `seq` was dropped: one log line if it failed, else maybe an
    /// idle pass.
    fn end_run(&self, seq: u64, failure: Option<(&'static str, &'static str)>, busy: bool) {
        let end = match (&failure, busy) {
            (Some(_), _) => "failed",
            (None, true) => "stopped",
            (None, false) => "idle",
        };
        self.ends.with_label_values(&[end]).inc();
        if let Some((error, target)) = failure {
            self.failed_runs.fetch_add(1, Ordering::SeqCst);
            logging::event_warn(
                "orca_push_worker_failed",
                json!({"error": error, "target": target}),
            );
            return;
        }
        if !busy {
            self.idle.send_if_modified(|s| {
                let newer = seq > *s;
                if newer {
                    *s = seq;
                }
                newer
            });
        }
    }

    /// Stops claiming and waits up to `limit` for in-flight deliveries and their finishes; true
    /// when all finished.
    pub async fn shutdown(&self, limit: Duration) -> bool {
        self.stop.cancel();
        crate::sync::lock(&self.finishes).take();
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }

    async fn deliver(
        self: Arc<Self>,
        run: Arc<Run>,
        c: Claimed,
        slot: OwnedSemaphorePermit,
        finishes: mpsc::UnboundedSender<Done>,
    ) {
        let (finish, expired) = self.outcome(&run, &c).await;
        let done = Done {
            claimed: c,
            finish,
            expired,
            run,
            _slot: slot,
        };
        // The finisher ends only after every sender is gone, so it is still receiving.
        let _ = finishes.send(done);
    }

    /// Pre-send checks, the provider call and its outcome: how the row finishes, and whether a
    /// delete is an expiry.
    async fn outcome(&self, run: &Run, c: &Claimed) -> (Finish, bool) {
        let m = &self.ctx.metrics;
        if now_ms() >= c.expires_at {
            return (Finish::Delete, true);
        }
        let target = match &c.target {
            Some(t) if !t.dead => t,
            // registration_unavailable: no call, counter or log.
            _ => return (Finish::Delete, false),
        };
        let Some(n) = Notification::from_payload(&c.payload_json) else {
            run.fail("send_path", "deliver");
            return retry_at(c, EXCEPTION_DELAY_MS);
        };
        if c.attempts > 1 {
            m.push_inc("delivery_retry");
        }
        let env = if target.platform == "ios" {
            target.apns_environment.as_deref().unwrap_or("production")
        } else {
            ""
        };
        let outcome = self.call_provider(run, c, &n, target, env).await;
        let host = || logging::digest(&c.host_fingerprint);
        match outcome {
            Outcome::Sent => {
                m.push_inc("delivery_sent");
                (Finish::Delete, false)
            }
            Outcome::Dead { reason, status } => {
                m.push_inc("delivery_dead");
                log_failed(&target.platform, status, &reason, &host());
                // Rare: its own transaction (delete + retire), then nothing left to finish.
                let _slot = self.db_slots.acquire().await;
                if let Err(e) = store::finish_dead(&self.ctx.db, c, target, env, now_ms()).await {
                    run.fail(db_class(&e), "retire");
                }
                (Finish::Delete, false)
            }
            Outcome::Error {
                reason,
                status,
                retryable,
                retry_after_ms,
            } => {
                m.push_inc("delivery_error");
                log_failed(&target.platform, status, &reason, &host());
                if retryable {
                    retry_at(c, backoff_ms(c.attempts, retry_after_ms))
                } else {
                    (Finish::Delete, false)
                }
            }
        }
    }

    /// The provider call with lease renewal every 10 s.
    async fn call_provider(
        &self,
        run: &Run,
        c: &Claimed,
        n: &Notification,
        t: &Target,
        env: &str,
    ) -> Outcome {
        let fp = &c.host_fingerprint;
        let call = async {
            if t.platform == "ios" {
                match &self.apns {
                    Some(a) => a.send(fp, n, &t.token, env, c.expires_at, now_ms()).await,
                    None => Outcome::error("apns_not_configured", None, false),
                }
            } else {
                match &self.fcm {
                    Some(f) => f.send(fp, n, &t.token, c.expires_at).await,
                    None => Outcome::error("fcm_not_configured", None, false),
                }
            }
        };
        tokio::pin!(call);
        let mut renew =
            tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
        loop {
            tokio::select! {
                out = &mut call => return out,
                _ = renew.tick() => {
                    if let Err(e) = store::renew(&self.ctx.db, c, &LIMITS, now_ms()).await {
                        run.fail(db_class(&e), "renew");
                    }
                }
            }
        }
    }

    /// Commits finishes in batches: whatever accumulated while the previous batch was being
    /// committed goes in the next one. Ends at shutdown once every sender is gone and everything
    /// sent was committed.
    async fn finisher(&self, mut rx: mpsc::UnboundedReceiver<Done>) {
        let mut batch: Vec<Done> = Vec::with_capacity(FINISH_BATCH);
        while rx.recv_many(&mut batch, FINISH_BATCH).await > 0 {
            self.commit(&batch).await;
            // Runs and slots go back only after the commit.
            batch.clear();
            self.finished.notify_one();
        }
    }

    async fn commit(&self, batch: &[Done]) {
        // A dead outcome's row is already gone (retired in its own transaction); its delete here
        // matches nothing, which is what a lost lease looks like too.
        let items: Vec<(&Claimed, Finish)> = batch.iter().map(|d| (&d.claimed, d.finish)).collect();
        let result = {
            let _slot = self.db_slots.acquire().await;
            store::finish_batch(&self.ctx.db, &items).await
        };
        match result {
            Ok(changed) => {
                for (d, changed) in batch.iter().zip(changed) {
                    if d.expired && changed {
                        self.ctx.metrics.push_inc("delivery_expired");
                    }
                }
            }
            Err(e) => {
                // The leases lapse and the rows are claimed again (at-least-once).
                for d in batch {
                    d.run.fail(db_class(&e), "finish");
                }
            }
        }
    }
}

/// Retry at `now + max(1000, delay)`, or delete (an expiry) when that is not before the deadline.
fn retry_at(c: &Claimed, delay: i64) -> (Finish, bool) {
    let at = now_ms() + delay.max(1000);
    if at >= c.expires_at {
        (Finish::Delete, true)
    } else {
        (Finish::Retry(at), false)
    }
}

fn log_failed(platform: &str, status: Option<u16>, reason: &str, host: &str) {
    logging::event_warn(
        "orca_push_delivery_failed",
        json!({"platform": platform, "status": status, "reason": reason, "host": host}),
    );
}

/// The class name of a database error (never its details).
pub fn db_class(e: &crate::store::DbError) -> &'static str {
    use crate::store::DbError::*;
    match e {
        LockUnavailable => "lock_unavailable",
        Serialization(_) => "serialization",
        UniqueViolation => "unique_violation",
        Transient(_) => "database_unavailable",
        Fatal(_) => "database_error",
    }
}
