//! The durable delivery worker (push.md §7): the database is the queue.
//!
//! Up to 12 drains run at once; each claims, delivers and finishes up to 25 deliveries and stops when a
//! claim finds nothing. A 1 s tick and every enqueue start drains for the free slots, so a drain blocked
//! on a slow provider never delays other registrations. Leases (30 s, renewed every 10 s during the
//! call) make delivery at-least-once across crashes and processes.
//!
//! A *run* is the set of drains one tick or wake starts. Failures inside a run are collected and
//! logged once when its last drain ends (`orca_push_worker_failed`, push.md §7 "a failed run
//! logs"), so a database outage costs one line per tick, not one per drain. A run whose drains all
//! ended on an empty claim, with no drain of any run still going, is an *idle pass*: nothing was
//! due when it looked. [`Worker::settled`] waits for an idle pass that started after the call,
//! which is what tests wait for instead of fixed windows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{watch, Notify, Semaphore};
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
use crate::store::push::{self as store, Claimed, Target};

const TICK: Duration = Duration::from_millis(1000);
const DRAINS: usize = 12;
const CLAIMS_PER_DRAIN: usize = 25;
const RENEW_EVERY: Duration = Duration::from_millis(10_000);
/// Delay after an unexpected failure in the send path.
const EXCEPTION_DELAY_MS: i64 = 5000;

pub struct Worker {
    ctx: Ctx,
    apns: Option<Arc<Apns>>,
    fcm: Option<Arc<Fcm>>,
    wake: Notify,
    drains: Arc<Semaphore>,
    /// Bounds the worker's database connections to pool_max − 1 so requests always find one.
    db_slots: Arc<Semaphore>,
    /// Stops claiming (shutdown).
    stop: CancellationToken,
    tasks: TaskTracker,
    /// Runs started so far (the sequence number of the latest run).
    runs: AtomicU64,
    /// Runs that failed (each logged once).
    failed_runs: AtomicU64,
    /// The sequence number of the latest idle pass.
    idle: watch::Sender<u64>,
}

/// One run's shared record: the first failure of any of its drains, and whether every drain
/// ended on an empty claim.
struct Run {
    seq: u64,
    failure: Mutex<Option<(&'static str, &'static str)>>,
    busy: AtomicBool,
}

impl Run {
    fn fail(&self, error: &'static str, target: &'static str) {
        let mut f = crate::sync::lock(&self.failure);
        if f.is_none() {
            *f = Some((error, target));
        }
    }
}

impl Worker {
    pub fn new(ctx: Ctx, apns: Option<Arc<Apns>>, fcm: Option<Arc<Fcm>>) -> Arc<Worker> {
        let slots = ctx.config.database_pool_max.saturating_sub(1).max(1);
        let stop = ctx.child_token();
        Arc::new(Worker {
            ctx,
            apns,
            fcm,
            wake: Notify::new(),
            drains: Arc::new(Semaphore::new(DRAINS)),
            db_slots: Arc::new(Semaphore::new(slots)),
            stop,
            tasks: TaskTracker::new(),
            runs: AtomicU64::new(0),
            failed_runs: AtomicU64::new(0),
            idle: watch::Sender::new(0),
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
        self.wake.notify_one();
    }

    /// The loop: tick or wake → fill the free drain slots.
    pub fn spawn(self: &Arc<Self>) {
        let w = self.clone();
        self.ctx.spawn("push-worker", async move {
            loop {
                tokio::select! {
                    _ = w.stop.cancelled() => break,
                    _ = tokio::time::sleep(TICK) => {}
                    _ = w.wake.notified() => {}
                }
                w.start_drains();
            }
        });
    }

    fn start_drains(self: &Arc<Self>) {
        let mut run: Option<Arc<Run>> = None;
        while let Ok(permit) = self.drains.clone().try_acquire_owned() {
            let run = run
                .get_or_insert_with(|| {
                    Arc::new(Run {
                        seq: self.runs.fetch_add(1, Ordering::SeqCst) + 1,
                        failure: Mutex::new(None),
                        busy: AtomicBool::new(false),
                    })
                })
                .clone();
            let w = self.clone();
            self.tasks.spawn(async move {
                w.drain(&run).await;
                drop(permit);
                if let Some(run) = Arc::into_inner(run) {
                    w.end_run(run);
                }
            });
        }
    }

    /// The last drain of `run` ended: one log line if it failed, else maybe an idle pass.
    fn end_run(&self, run: Run) {
        let failure = run.failure.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some((error, target)) = failure {
            self.failed_runs.fetch_add(1, Ordering::SeqCst);
            logging::event_warn(
                "orca_push_worker_failed",
                json!({"error": error, "target": target}),
            );
            return;
        }
        if !run.busy.load(Ordering::SeqCst) && self.drains.available_permits() == DRAINS {
            self.idle.send_if_modified(|seq| {
                let newer = run.seq > *seq;
                if newer {
                    *seq = run.seq;
                }
                newer
            });
        }
    }

    async fn drain(&self, run: &Run) {
        for _ in 0..CLAIMS_PER_DRAIN {
            if self.stop.is_cancelled() {
                run.busy.store(true, Ordering::SeqCst);
                return;
            }
            // Shutdown waits for deliveries, not for claims: a claim stuck on an unreachable
            // database would hold the worker until the store's call deadline.
            let claimed = tokio::select! {
                _ = self.stop.cancelled() => return,
                r = async {
                    let _slot = self.db_slots.acquire().await;
                    store::claim(&self.ctx.db, &LIMITS, now_ms()).await
                } => r,
            };
            match claimed {
                Ok(Some(c)) => self.deliver(run, c).await,
                Ok(None) => return,
                Err(e) => {
                    run.fail(db_class(&e), "claim");
                    return;
                }
            }
        }
        // A full drain may have left work: go again at once.
        run.busy.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Stops claiming and waits up to `limit` for in-flight deliveries; true when all finished.
    pub async fn shutdown(&self, limit: Duration) -> bool {
        self.stop.cancel();
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }

    async fn deliver(&self, run: &Run, c: Claimed) {
        let m = &self.ctx.metrics;
        let now = now_ms();
        if now >= c.expires_at {
            if self.finish_delete(run, &c).await {
                m.push_inc("delivery_expired");
            }
            return;
        }
        let target = match store::device_target(&self.ctx.db, &c.registration_id).await {
            Ok(t) => t,
            Err(e) => {
                run.fail(db_class(&e), "deliver");
                self.retry(run, &c, EXCEPTION_DELAY_MS).await;
                return;
            }
        };
        let target = match target {
            Some(t) if !t.dead => t,
            // registration_unavailable: no call, counter or log.
            _ => {
                self.finish_delete(run, &c).await;
                return;
            }
        };
        let Some(n) = Notification::from_payload(&c.payload_json) else {
            self.fail_in_send_path(run, &c).await;
            return;
        };
        if c.attempts > 1 {
            m.push_inc("delivery_retry");
        }
        let env = if target.platform == "ios" {
            target
                .apns_environment
                .clone()
                .unwrap_or_else(|| "production".into())
        } else {
            String::new()
        };
        let outcome = self.call_provider(run, &c, &n, &target, &env).await;
        self.finish(run, &c, &target, &env, outcome).await;
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

    async fn finish(&self, run: &Run, c: &Claimed, t: &Target, env: &str, outcome: Outcome) {
        let m = &self.ctx.metrics;
        let host = logging::digest(&c.host_fingerprint);
        match outcome {
            Outcome::Sent => {
                m.push_inc("delivery_sent");
                self.finish_delete(run, c).await;
            }
            Outcome::Dead { reason, status } => {
                m.push_inc("delivery_dead");
                log_failed(&t.platform, status, &reason, &host);
                let _slot = self.db_slots.acquire().await;
                if let Err(e) = store::finish_dead(&self.ctx.db, c, t, env, now_ms()).await {
                    run.fail(db_class(&e), "retire");
                }
            }
            Outcome::Error {
                reason,
                status,
                retryable,
                retry_after_ms,
            } => {
                m.push_inc("delivery_error");
                log_failed(&t.platform, status, &reason, &host);
                if retryable {
                    self.retry(run, c, backoff_ms(c.attempts, retry_after_ms))
                        .await;
                } else {
                    self.finish_delete(run, c).await;
                }
            }
        }
    }

    async fn fail_in_send_path(&self, run: &Run, c: &Claimed) {
        run.fail("send_path", "deliver");
        self.retry(run, c, EXCEPTION_DELAY_MS).await;
    }

    /// Retry at `now + max(1000, delay)`, or delete when that is not before the deadline.
    async fn retry(&self, run: &Run, c: &Claimed, delay: i64) {
        let retry_at = now_ms() + delay.max(1000);
        if retry_at >= c.expires_at {
            if self.finish_delete(run, c).await {
                self.ctx.metrics.push_inc("delivery_expired");
            }
            return;
        }
        let _slot = self.db_slots.acquire().await;
        if let Err(e) = store::finish_retry(&self.ctx.db, c, retry_at).await {
            run.fail(db_class(&e), "finish");
        }
    }

    async fn finish_delete(&self, run: &Run, c: &Claimed) -> bool {
        let _slot = self.db_slots.acquire().await;
        match store::finish_delete(&self.ctx.db, c).await {
            Ok(done) => done,
            Err(e) => {
                run.fail(db_class(&e), "finish");
                false
            }
        }
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
