//! Admission lanes (docs/reference/http.md): bounded FIFO queues in front of the database with a
//! per-host in-flight and minimum-interval rule. Per process; nothing here touches the database.
//!
//! A lane is entered one request per slot ([`Lane::enter`]) or batched ([`Lane::run_batched`]):
//! there the holder of a slot takes every queued job, up to a bound, and runs them together, so
//! a lane of concurrency 1 can start many queued requests per unit of time while its queue,
//! wait and `Retry-After` keep their meaning.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::config::LaneConfig;
use crate::store::assignments::HostKey;

/// Most hosts remembered for the per-host rules; older idle entries are pruned first.
const HOST_TABLE_MAX: usize = 65_536;

/// Why a lane refused a request (the log's `reason=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneReject {
    QueueFull,
    WaitTimeout,
    HostInFlight,
    HostRateLimited,
}

impl LaneReject {
    pub fn reason(self) -> &'static str {
        match self {
            LaneReject::QueueFull => "queue-full",
            LaneReject::WaitTimeout => "wait-timeout",
            LaneReject::HostInFlight => "host-in-flight",
            LaneReject::HostRateLimited => "host-rate-limited",
        }
    }
}

#[derive(Default)]
struct HostSlot {
    busy: bool,
    last_start: Option<Instant>,
}

/// One lane.
pub struct Lane {
    pub name: &'static str,
    pub cfg: LaneConfig,
    sem: Arc<Semaphore>,
    queued: AtomicUsize,
    /// Per-host minimum interval in ms; 0 disables the per-host rules (resolve lane).
    interval_ms: AtomicU64,
    hosts: Mutex<HashMap<HostKey, HostSlot>>,
}

/// A host's in-flight mark in a lane with per-host rules (none on other lanes). Dropping it
/// clears the mark.
struct HostMark {
    lane: Arc<Lane>,
    host: Option<HostKey>,
}

impl HostMark {
    /// Records that work started (the per-host interval counts from here).
    fn started(&self) {
        if let Some(h) = &self.host {
            let mut hosts = crate::sync::lock(&self.lane.hosts);
            if let Some(s) = hosts.get_mut(h) {
                s.last_start = Some(Instant::now());
            }
        }
    }
}

impl Drop for HostMark {
    fn drop(&mut self) {
        if let Some(h) = &self.host {
            let mut hosts = crate::sync::lock(&self.lane.hosts);
            if let Some(s) = hosts.get_mut(h) {
                s.busy = false;
            }
        }
    }
}

/// A held lane slot. Dropping it frees the slot and the host's in-flight mark.
pub struct LanePermit {
    mark: HostMark,
    _permit: OwnedSemaphorePermit,
}

impl LanePermit {
    /// Records that work started (the per-host interval counts from here).
    pub fn started(&self) {
        self.mark.started();
    }
}

/// Runs one batch of jobs; answers one result per job, in the jobs' order.
/// Spawns a batch's task; the composition root passes the process's task tracker
/// (`Ctx::spawn`), so shutdown waits for a batch that has started.
pub type SpawnBatch = Arc<dyn Fn(Pin<Box<dyn Future<Output = ()> + Send>>) + Send + Sync>;

type RunBatch<J, R> =
    Arc<dyn Fn(Vec<J>) -> Pin<Box<dyn Future<Output = Vec<R>> + Send>> + Send + Sync>;

/// The queue of a batched lane ([`Lane::run_batched`]) and the work a batch runs.
pub struct Batcher<J, R> {
    queue: Mutex<VecDeque<Queued<J, R>>>,
    next_id: AtomicU64,
    /// Most jobs one batch takes.
    max: usize,
    run: RunBatch<J, R>,
    spawn: SpawnBatch,
}

/// A job waiting for a batch, with its host's mark and where its result goes.
struct Queued<J, R> {
    id: u64,
    job: J,
    mark: HostMark,
    reply: oneshot::Sender<R>,
}

impl<J, R> Batcher<J, R> {
    fn queued(&self, id: u64) -> bool {
        crate::sync::lock(&self.queue).iter().any(|q| q.id == id)
    }

    /// Takes job `id` out of the queue; false when a batch has taken it (it has started).
    fn remove(&self, id: u64) -> bool {
        let removed = {
            let mut q = crate::sync::lock(&self.queue);
            q.iter().position(|q| q.id == id).and_then(|i| q.remove(i))
        };
        removed.is_some()
    }
}

impl<J: Send + 'static, R: Send + 'static> Batcher<J, R> {
    /// `work` answers one result per job of a batch, in the jobs' order; at most `max` jobs.
    pub fn new<F, Fut>(max: usize, spawn: SpawnBatch, work: F) -> Arc<Batcher<J, R>>
    where
        F: Fn(Vec<J>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<R>> + Send + 'static,
    {
        let run: RunBatch<J, R> = Arc::new(
            move |jobs| -> Pin<Box<dyn Future<Output = Vec<R>> + Send>> { Box::pin(work(jobs)) },
        );
        Arc::new(Batcher {
            queue: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(0),
            max: max.max(1),
            run,
            spawn,
        })
    }

    /// Starts a batch in the slot `permit`: the queue's first jobs, up to the bound, run in
    /// their own task (so they complete even if their callers leave), the slot held until done.
    fn start(&self, permit: OwnedSemaphorePermit) {
        let taken: Vec<Queued<J, R>> = {
            let mut q = crate::sync::lock(&self.queue);
            let n = q.len().min(self.max);
            q.drain(..n).collect()
        };
        if taken.is_empty() {
            return;
        }
        let run = self.run.clone();
        (self.spawn)(Box::pin(async move {
            let _permit = permit;
            let mut jobs = Vec::with_capacity(taken.len());
            let mut replies = Vec::with_capacity(taken.len());
            for q in taken {
                q.mark.started();
                jobs.push(q.job);
                replies.push((q.reply, q.mark));
            }
            let results = run(jobs).await;
            for ((reply, mark), r) in replies.into_iter().zip(results) {
                let _ = reply.send(r);
                drop(mark);
            }
        }));
    }
}

/// Takes a queued job back out of its batcher's queue if its caller leaves before it started.
struct Waiting<'a, J, R> {
    batcher: &'a Batcher<J, R>,
    id: u64,
}

impl<J, R> Drop for Waiting<'_, J, R> {
    fn drop(&mut self) {
        self.batcher.remove(self.id);
    }
}

impl Lane {
    /// `per_host`: the lane enforces host-in-flight and the interval (= its Retry-After).
    pub fn new(name: &'static str, cfg: LaneConfig, per_host: bool) -> Arc<Lane> {
        Arc::new(Lane {
            name,
            sem: Arc::new(Semaphore::new(cfg.concurrency)),
            queued: AtomicUsize::new(0),
            interval_ms: AtomicU64::new(if per_host {
                cfg.retry_after_s * 1000
            } else {
                0
            }),
            hosts: Mutex::new(HashMap::new()),
            cfg,
        })
    }

    /// Overrides the per-host interval (tests that issue many requests for one host).
    pub fn set_interval(&self, d: Duration) {
        self.interval_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }

    fn per_host(&self) -> bool {
        self.interval_ms.load(Ordering::Relaxed) > 0
    }

    /// The per-host rules: refuses a host in flight or started less than the interval ago, else
    /// marks it in flight until the returned mark is dropped.
    fn claim(self: &Arc<Self>, host: &HostKey) -> Result<HostMark, LaneReject> {
        let per_host = self.per_host();
        if per_host {
            let interval = Duration::from_millis(self.interval_ms.load(Ordering::Relaxed));
            let mut hosts = crate::sync::lock(&self.hosts);
            if hosts.len() >= HOST_TABLE_MAX {
                hosts.retain(|_, s| s.busy || s.last_start.is_some_and(|t| t.elapsed() < interval));
            }
            let slot = hosts.entry(host.clone()).or_default();
            if slot.busy {
                return Err(LaneReject::HostInFlight);
            }
            if slot.last_start.is_some_and(|t| t.elapsed() < interval) {
                return Err(LaneReject::HostRateLimited);
            }
            slot.busy = true;
        }
        Ok(HostMark {
            lane: self.clone(),
            host: per_host.then(|| host.clone()),
        })
    }

    /// Waits (bounded) for a slot.
    pub async fn enter(self: &Arc<Self>, host: &HostKey) -> Result<LanePermit, LaneReject> {
        let mark = self.claim(host)?;
        let permit = match self.sem.clone().try_acquire_owned() {
            Ok(p) if self.queued.load(Ordering::SeqCst) == 0 => p,
            other => {
                drop(other);
                if self.queued.fetch_add(1, Ordering::SeqCst) >= self.cfg.queue_max {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    return Err(LaneReject::QueueFull);
                }
                let r = tokio::time::timeout(
                    Duration::from_millis(self.cfg.wait_ms),
                    self.sem.clone().acquire_owned(),
                )
                .await;
                self.queued.fetch_sub(1, Ordering::SeqCst);
                match r {
                    Ok(Ok(p)) => p,
                    _ => return Err(LaneReject::WaitTimeout),
                }
            }
        };
        Ok(LanePermit {
            mark,
            _permit: permit,
        })
    }

    /// The batched entry: [`Lane::enter`]'s per-host rules, queue bound (`queue-full`) and wait
    /// (`wait-timeout`: not started within it), but whoever gets a slot starts a batch of the
    /// queue's first jobs (this caller's or not), and each caller waits for its own result. A
    /// job taken into a batch has started: it runs to completion, even if its caller leaves.
    pub async fn run_batched<J: Send + 'static, R: Send + 'static>(
        self: &Arc<Self>,
        host: &HostKey,
        job: J,
        batcher: &Arc<Batcher<J, R>>,
    ) -> Result<R, LaneReject> {
        let mark = self.claim(host)?;
        let (reply, mut rx) = oneshot::channel();
        let id = batcher.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut q = crate::sync::lock(&batcher.queue);
            let free = q.is_empty() && self.sem.available_permits() > 0;
            if !free && q.len() >= self.cfg.queue_max {
                drop(q);
                return Err(LaneReject::QueueFull);
            }
            q.push_back(Queued {
                id,
                job,
                mark,
                reply,
            });
        }
        let _waiting = Waiting {
            batcher: batcher.as_ref(),
            id,
        };
        if let Ok(p) = self.sem.clone().try_acquire_owned() {
            batcher.start(p);
        }
        let deadline = tokio::time::sleep(Duration::from_millis(self.cfg.wait_ms));
        tokio::pin!(deadline);
        while batcher.queued(id) {
            tokio::select! {
                biased;
                r = &mut rx => return r.map_err(|_| LaneReject::WaitTimeout),
                p = self.sem.clone().acquire_owned() => match p {
                    Ok(p) => batcher.start(p),
                    Err(_) => return Err(LaneReject::WaitTimeout),
                },
                _ = &mut deadline => {
                    if batcher.remove(id) {
                        return Err(LaneReject::WaitTimeout);
                    }
                }
            }
        }
        rx.await.map_err(|_| LaneReject::WaitTimeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(n: u32) -> HostKey {
        HostKey {
            user_id: "u".into(),
            relay_host_id: format!("h{n}"),
        }
    }

    fn cfg(c: usize, q: usize, w: u64) -> LaneConfig {
        LaneConfig {
            concurrency: c,
            queue_max: q,
            wait_ms: w,
            retry_after_s: 1,
        }
    }

    #[tokio::test]
    async fn queue_full_and_wait_timeout() {
        let lane = Lane::new("placement", cfg(1, 1, 50), true);
        let p1 = lane.enter(&host(1)).await.unwrap();
        let l2 = lane.clone();
        let waiter = tokio::spawn(async move { l2.enter(&host(2)).await.map(|_| ()) });
        tokio::task::yield_now().await;
        assert_eq!(
            lane.enter(&host(3)).await.err(),
            Some(LaneReject::QueueFull)
        );
        assert_eq!(waiter.await.unwrap(), Err(LaneReject::WaitTimeout));
        drop(p1);
        assert!(lane.enter(&host(3)).await.is_ok());
    }

    #[tokio::test]
    async fn per_host_rules() {
        let lane = Lane::new("sticky", cfg(4, 4, 50), true);
        lane.set_interval(Duration::from_millis(100));
        let p = lane.enter(&host(1)).await.unwrap();
        assert_eq!(
            lane.enter(&host(1)).await.err(),
            Some(LaneReject::HostInFlight)
        );
        p.started();
        drop(p);
        assert_eq!(
            lane.enter(&host(1)).await.err(),
            Some(LaneReject::HostRateLimited)
        );
        // Real time: the interval is measured with std::time::Instant.
        tokio::time::sleep(Duration::from_millis(110)).await;
        let p = lane.enter(&host(1)).await.unwrap();
        // Not started: leaving without work does not rate-limit.
        drop(p);
        assert!(lane.enter(&host(1)).await.is_ok());
    }

    #[tokio::test]
    async fn no_per_host_rules_on_resolve_lane() {
        let lane = Lane::new("resolve", cfg(1, 128, 5000), false);
        let p = lane.enter(&host(1)).await.unwrap();
        p.started();
        drop(p);
        let p = lane.enter(&host(1)).await.unwrap();
        p.started();
    }

    /// A batcher whose batches wait at `gate` (closed until the test adds a permit), record
    /// their sizes and answer each job doubled.
    fn doubling(gate: Arc<Semaphore>, sizes: Arc<Mutex<Vec<usize>>>) -> Arc<Batcher<u32, u32>> {
        let spawn: SpawnBatch = Arc::new(|f| {
            tokio::spawn(f);
        });
        Batcher::new(8, spawn, move |jobs: Vec<u32>| {
            let (gate, sizes) = (gate.clone(), sizes.clone());
            async move {
                crate::sync::lock(&sizes).push(jobs.len());
                let _open = gate.acquire().await;
                jobs.into_iter().map(|j| j * 2).collect()
            }
        })
    }

    async fn until_queued(b: &Batcher<u32, u32>, n: usize) {
        while crate::sync::lock(&b.queue).len() < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn the_slot_holder_runs_every_queued_job_in_one_batch() {
        let lane = Lane::new("sticky", cfg(1, 8, 5_000), true);
        let gate = Arc::new(Semaphore::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let b = doubling(gate.clone(), sizes.clone());
        let call = |n: u32| {
            let (lane, b) = (lane.clone(), b.clone());
            tokio::spawn(async move { lane.run_batched(&host(n), n, &b).await })
        };
        let first = call(1);
        while crate::sync::lock(&sizes).is_empty() {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (2..=5).map(call).collect();
        until_queued(&b, 4).await;
        // The same host again while in flight: refused by the per-host rule.
        assert_eq!(
            lane.run_batched(&host(3), 0, &b).await.err(),
            Some(LaneReject::HostInFlight)
        );
        gate.add_permits(1);
        assert_eq!(first.await.unwrap(), Ok(2));
        for (n, r) in (2..=5).zip(rest) {
            assert_eq!(r.await.unwrap(), Ok(n * 2));
        }
        assert_eq!(*crate::sync::lock(&sizes), vec![1, 4]);
    }

    #[tokio::test]
    async fn a_batched_lane_keeps_its_queue_bound_and_wait() {
        let lane = Lane::new("sticky", cfg(1, 1, 50), true);
        let gate = Arc::new(Semaphore::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let b = doubling(gate.clone(), sizes.clone());
        let (l1, b1) = (lane.clone(), b.clone());
        let running = tokio::spawn(async move { l1.run_batched(&host(1), 1, &b1).await });
        while crate::sync::lock(&sizes).is_empty() {
            tokio::task::yield_now().await;
        }
        let (l2, b2) = (lane.clone(), b.clone());
        let queued = tokio::spawn(async move { l2.run_batched(&host(2), 2, &b2).await });
        until_queued(&b, 1).await;
        assert_eq!(
            lane.run_batched(&host(3), 3, &b).await.err(),
            Some(LaneReject::QueueFull)
        );
        // Not started within the wait: out of the queue, its host free again.
        assert_eq!(queued.await.unwrap(), Err(LaneReject::WaitTimeout));
        assert!(crate::sync::lock(&b.queue).is_empty());
        gate.add_permits(1);
        assert_eq!(running.await.unwrap(), Ok(2));
        assert_eq!(lane.run_batched(&host(2), 2, &b).await, Ok(4));
    }

    #[tokio::test]
    async fn fifo_handoff() {
        let lane = Lane::new("placement", cfg(1, 8, 5_000), true);
        let p1 = lane.enter(&host(1)).await.unwrap();
        let l2 = lane.clone();
        let w = tokio::spawn(async move { l2.enter(&host(2)).await.is_ok() });
        tokio::task::yield_now().await;
        drop(p1);
        assert!(w.await.unwrap());
    }
}
