//! The durable delivery worker (push.md §7): the database is the queue.
//!
//! Up to 12 drains run at once; each claims, delivers and finishes up to 25 deliveries and stops when a
//! claim finds nothing. A 1 s tick and every enqueue start drains for the free slots, so a drain blocked
//! on a slow provider never delays other registrations. Leases (30 s, renewed every 10 s during the
//! call) make delivery at-least-once across crashes and processes.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{Notify, Semaphore};
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
        })
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
        while let Ok(permit) = self.drains.clone().try_acquire_owned() {
            let w = self.clone();
            self.tasks.spawn(async move {
                w.drain().await;
                drop(permit);
            });
        }
    }

    async fn drain(&self) {
        for _ in 0..CLAIMS_PER_DRAIN {
            if self.stop.is_cancelled() {
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
                Ok(Some(c)) => self.deliver(c).await,
                Ok(None) => return,
                Err(e) => {
                    logging::event_warn(
                        "orca_push_worker_failed",
                        json!({"error": db_class(&e), "target": "claim"}),
                    );
                    return;
                }
            }
        }
        // A full drain may have left work: go again at once.
        self.wake();
    }

    /// Stops claiming and waits up to `limit` for in-flight deliveries; true when all finished.
    pub async fn shutdown(&self, limit: Duration) -> bool {
        self.stop.cancel();
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }

    async fn deliver(&self, c: Claimed) {
        let m = &self.ctx.metrics;
        let now = now_ms();
        if now >= c.expires_at {
            if self.finish_delete(&c).await {
                m.push_inc("delivery_expired");
            }
            return;
        }
        let target = match store::device_target(&self.ctx.db, &c.registration_id).await {
            Ok(t) => t,
            Err(e) => {
                self.fail_in_send_path(&c, &e.to_string()).await;
                return;
            }
        };
        let target = match target {
            Some(t) if !t.dead => t,
            // registration_unavailable: no call, counter or log.
            _ => {
                self.finish_delete(&c).await;
                return;
            }
        };
        let Some(n) = Notification::from_payload(&c.payload_json) else {
            self.fail_in_send_path(&c, "payload").await;
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
        let outcome = self.call_provider(&c, &n, &target, &env).await;
        self.finish(&c, &target, &env, outcome).await;
    }

    /// The provider call with lease renewal every 10 s.
    async fn call_provider(&self, c: &Claimed, n: &Notification, t: &Target, env: &str) -> Outcome {
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
                        logging::event_warn("orca_push_worker_failed", json!({"error": db_class(&e), "target": "renew"}));
                    }
                }
            }
        }
    }

    async fn finish(&self, c: &Claimed, t: &Target, env: &str, outcome: Outcome) {
        let m = &self.ctx.metrics;
        let host = logging::digest(&c.host_fingerprint);
        match outcome {
            Outcome::Sent => {
                m.push_inc("delivery_sent");
                self.finish_delete(c).await;
            }
            Outcome::Dead { reason, status } => {
                m.push_inc("delivery_dead");
                log_failed(&t.platform, status, &reason, &host);
                let _slot = self.db_slots.acquire().await;
                if let Err(e) = store::finish_dead(&self.ctx.db, c, t, env, now_ms()).await {
                    logging::event_warn(
                        "orca_push_worker_failed",
                        json!({"error": db_class(&e), "target": "retire"}),
                    );
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
                    self.retry(c, backoff_ms(c.attempts, retry_after_ms)).await;
                } else {
                    self.finish_delete(c).await;
                }
            }
        }
    }

    async fn fail_in_send_path(&self, c: &Claimed, _what: &str) {
        logging::event_warn(
            "orca_push_worker_failed",
            json!({"error": "send_path", "target": "deliver"}),
        );
        self.retry(c, EXCEPTION_DELAY_MS).await;
    }

    /// Retry at `now + max(1000, delay)`, or delete when that is not before the deadline.
    async fn retry(&self, c: &Claimed, delay: i64) {
        let retry_at = now_ms() + delay.max(1000);
        if retry_at >= c.expires_at {
            if self.finish_delete(c).await {
                self.ctx.metrics.push_inc("delivery_expired");
            }
            return;
        }
        let _slot = self.db_slots.acquire().await;
        if let Err(e) = store::finish_retry(&self.ctx.db, c, retry_at).await {
            logging::event_warn(
                "orca_push_worker_failed",
                json!({"error": db_class(&e), "target": "finish"}),
            );
        }
    }

    async fn finish_delete(&self, c: &Claimed) -> bool {
        let _slot = self.db_slots.acquire().await;
        match store::finish_delete(&self.ctx.db, c).await {
            Ok(done) => done,
            Err(e) => {
                logging::event_warn(
                    "orca_push_worker_failed",
                    json!({"error": db_class(&e), "target": "finish"}),
                );
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
