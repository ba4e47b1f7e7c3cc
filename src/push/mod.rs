//! The push gateway role (docs/reference/http.md): host challenge and sessions, the device registry, `/v1/send`
//! with quotas, idempotency and dismissal fences, and the durable delivery worker that talks to APNs
//! and FCM.
//!
//! Layout: [`model`] (schemas and pure rules), [`ratelimit`] (buckets and admission, pure),
//! [`store`] (all push SQL), [`routes`] (HTTP glue), [`worker`] (claim/lease/finish),
//! [`apns`] / [`fcm`] (providers), [`jobs`] (prune, counters, gauge).

pub mod apns;
pub mod fcm;
pub mod jobs;
pub mod model;
pub mod provider;
pub mod ratelimit;
pub mod routes;
pub mod worker;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use warp::filters::BoxedFilter;

use crate::app::Ctx;
use crate::config::PushMode;
use crate::contract::overview::{PushOverview, PushSectionFuture};
use crate::http::Response;
use crate::store::push::{self as store, Limits as StoreLimits};
use ratelimit::{Admission, Buckets};

/// A host session's lifetime (docs/reference/http.md).
pub const SESSION_TTL_MS: i64 = 86_400_000;
/// A delivery lease (ARCHITECTURE.md).
pub const LEASE_MS: i64 = 30_000;
/// Events per host and kind per quota window (docs/reference/http.md).
pub const EVENT_QUOTA: i64 = 300;
pub const EVENT_QUOTA_WINDOW_MS: i64 = 900_000;
/// Retention of delivered events, recipients and fences (docs/reference/http.md).
pub const RETENTION_MS: i64 = 86_400_000;

/// The policy numbers handed to the push statements.
pub const LIMITS: StoreLimits = StoreLimits {
    session_ttl_ms: SESSION_TTL_MS,
    lease_ms: LEASE_MS,
    event_quota: EVENT_QUOTA,
    event_quota_window_ms: EVENT_QUOTA_WINDOW_MS,
    notification_ttl_ms: model::NOTIFICATION_TTL_MS,
    max_devices: model::MAX_DEVICES,
};

/// Push's part of the shutdown must end within 9 s of the signal.
const SHUTDOWN_BUDGET: Duration = Duration::from_millis(8_500);
const COUNTERS_EVERY: Duration = Duration::from_secs(60);

/// The per-process buckets of docs/reference/http.md.
pub struct Limits {
    pub unauth: Buckets,
    pub auth: Buckets,
    pub invalid_bearer: Buckets,
    pub per_host: Buckets,
}

/// The push gateway of this process.
pub struct Push {
    pub ctx: Ctx,
    validation: bool,
    limits: Mutex<Limits>,
    admission: Admission,
    worker: Option<Arc<worker::Worker>>,
    counters: Arc<jobs::Counters>,
    /// In-flight push requests (awaited at shutdown).
    requests: TaskTracker,
    /// Stops prune, counters and gauge timers.
    stop: CancellationToken,
}

impl Push {
    pub async fn start(ctx: Ctx) -> Result<Arc<Push>, String> {
        let cfg = &ctx.config.push;
        let validation = cfg.mode == PushMode::Validation;
        let apns = match &cfg.apns {
            Some(a) => Some(Arc::new(apns::Apns::new(
                a,
                &cfg.apns_topic,
                cfg.apns_base_url.clone(),
            )?)),
            None => None,
        };
        let fcm = match &cfg.fcm {
            Some(f) => Some(Arc::new(fcm::Fcm::new(
                f,
                &cfg.fcm_base_url,
                &cfg.oauth_token_url,
            )?)),
            None => None,
        };
        let stop = ctx.child_token();
        let counters = Arc::new(jobs::Counters::new());
        let worker = if validation {
            None
        } else {
            let w = worker::Worker::new(ctx.clone(), apns, fcm);
            w.spawn();
            // Deliveries left by a previous process are due already.
            w.wake();
            jobs::spawn_prune(ctx.clone(), stop.clone());
            Some(w)
        };
        jobs::spawn_counters(ctx.clone(), counters.clone(), COUNTERS_EVERY, stop.clone());
        if !validation {
            jobs::spawn_gauge(ctx.clone(), stop.clone());
        }
        Ok(Arc::new(Push {
            ctx,
            validation,
            limits: Mutex::new(Limits {
                unauth: Buckets::new(30),
                auth: Buckets::new(6000),
                invalid_bearer: Buckets::new(30),
                per_host: Buckets::new(600),
            }),
            admission: Admission::new(4, 32),
            worker,
            counters,
            requests: TaskTracker::new(),
            stop,
        }))
    }

    /// The push routes.
    pub fn routes(self: &Arc<Self>) -> BoxedFilter<(Response,)> {
        routes::filter(self.clone())
    }

    /// Extra `/health` fields of the push role.
    pub fn health_fields(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "pushProtocol": 1, "deliveryProtocol": 2 });
        if self.validation {
            v["pushMode"] = "validation".into();
        }
        v
    }

    /// The admin overview's `push` object (docs/reference/http.md).
    pub async fn overview(&self) -> Result<serde_json::Value, crate::store::DbError> {
        let now = crate::clock::now_ms();
        let depth = store::queue_depth(&self.ctx.db, now).await?;
        let dead = store::dead_registrations(&self.ctx.db).await?;
        Ok(serde_json::json!({ "queueDepth": depth, "deadRegistrations": dead }))
    }

    /// Waits until the delivery worker made an idle pass that started after this call (see
    /// [`worker::Worker::settled`]); at once without a worker (validation mode).
    pub async fn worker_settled(&self) {
        if let Some(w) = &self.worker {
            w.settled().await;
        }
    }

    /// The worker's (runs started, runs failed) since start-up.
    pub fn worker_run_counts(&self) -> (u64, u64) {
        self.worker.as_ref().map_or((0, 0), |w| w.run_counts())
    }

    /// Logs the `orca_push_counters` line now if any counter moved.
    pub fn emit_counters(&self) -> bool {
        self.counters.emit(&self.ctx)
    }

    /// SIGTERM: refuse new requests, await in-flight ones, stop timers, stop claiming and let
    /// in-flight deliveries finish (≤ 9 s in all), then log a final counters line.
    /// Returns false when push missed its deadline (the process then exits non-zero).
    pub async fn shutdown(&self) -> bool {
        self.stop.cancel();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_BUDGET;
        self.requests.close();
        let worker_done = async {
            match &self.worker {
                Some(w) => w.shutdown(SHUTDOWN_BUDGET).await,
                None => true,
            }
        };
        let requests_done = tokio::time::timeout_at(deadline, self.requests.wait());
        let (worker_ok, requests_ok) = tokio::join!(worker_done, requests_done);
        let ok = worker_ok && requests_ok.is_ok();
        if !ok {
            crate::logging::event_warn(
                "orca_push_shutdown_failed",
                serde_json::json!({"error": "deadline", "target": if worker_ok { "requests" } else { "worker" }}),
            );
        }
        self.emit_counters();
        ok
    }

    fn stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    fn limits(&self) -> MutexGuard<'_, Limits> {
        crate::sync::lock(&self.limits)
    }

    fn wake_worker(&self) {
        if let Some(w) = &self.worker {
            w.wake();
        }
    }
}

impl PushOverview for Push {
    fn push_section(&self) -> PushSectionFuture<'_> {
        Box::pin(async move { self.overview().await.map_err(|e| e.to_string()) })
    }
}
