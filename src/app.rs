//! What every role of one process shares: configuration, database, metrics, identity, and the
//! lifecycle: one shutdown token and one task tracker.
//!
//! Lifecycle: every background task a role starts goes through [`Ctx::spawn`], so the process
//! tracker knows it and shutdown can wait for it (and name what is still running when the wait
//! times out). Roles never mint their own cancellation tokens; they take
//! [`Ctx::child_token`]s of the process token, so SIGTERM reaches every loop, and a role can still
//! stop its own loops early by cancelling its child.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::store::Db;

/// Shared process context (cheap to clone).
#[derive(Clone)]
pub struct Ctx(Arc<Shared>);

pub struct Shared {
    pub config: Config,
    pub db: Db,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// UUID v4 minted once per process: the cell incarnation (docs/reference/http.md).
    pub incarnation: String,
    /// Process start, epoch ms.
    pub started_at: i64,
    /// Cancelled when SIGTERM/SIGINT arrives: stop accepting, drain, finish.
    pub shutdown: CancellationToken,
    /// Every background task of the process ([`Ctx::spawn`]).
    tasks: TaskTracker,
    /// Live tasks by name, for the shutdown report.
    live: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

/// Counts one live task under its name until dropped (also when the task panics or is aborted).
struct Live {
    live: Arc<Mutex<BTreeMap<&'static str, usize>>>,
    name: &'static str,
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = crate::sync::lock(&self.live);
        if let Some(n) = live.get_mut(self.name) {
            *n -= 1;
            if *n == 0 {
                live.remove(self.name);
            }
        }
    }
}

impl std::ops::Deref for Ctx {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl Ctx {
    pub fn new(config: Config, db: Db, metrics: Arc<Metrics>) -> Ctx {
        let readiness = Readiness::new(db.clone(), config.readiness_sql_grace_ms);
        Ctx(Arc::new(Shared {
            config,
            db,
            metrics,
            readiness,
            incarnation: uuid::Uuid::new_v4().to_string(),
            started_at: crate::clock::now_ms(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            live: Default::default(),
        }))
    }

    /// Spawns a background task on the process tracker, counted under `name` while it runs.
    pub fn spawn<F>(&self, name: &'static str, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        *crate::sync::lock(&self.live).entry(name).or_default() += 1;
        let live = Live {
            live: self.live.clone(),
            name,
        };
        self.tasks.spawn(async move {
            let _live = live;
            fut.await
        })
    }

    /// A token cancelled with the process shutdown (or earlier, by its holder).
    pub fn child_token(&self) -> CancellationToken {
        self.shutdown.child_token()
    }

    /// Names and counts of the tasks still running.
    pub fn running_tasks(&self) -> Vec<(&'static str, usize)> {
        crate::sync::lock(&self.live)
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Waits up to `limit` for every tracked task; false (after logging the names of the tasks
    /// still running) when the limit passed first. Call after [`Ctx::shutdown`] was cancelled.
    pub async fn wait_tasks(&self, limit: Duration) -> bool {
        self.tasks.close();
        if tokio::time::timeout(limit, self.tasks.wait()).await.is_ok() {
            return true;
        }
        let running: Vec<String> = self
            .running_tasks()
            .iter()
            .map(|(name, n)| format!("{name}={n}"))
            .collect();
        log::warn!(
            "[orca-relay] shutdown: tasks still running {}",
            running.join(",")
        );
        false
    }

    pub fn shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }
}
