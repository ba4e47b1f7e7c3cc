//! Admission lanes (docs/reference/http.md): bounded FIFO queues in front of the database with a
//! per-host in-flight and minimum-interval rule. Per process; nothing here touches the database.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// A held lane slot. Dropping it frees the slot and the host's in-flight mark.
pub struct LanePermit {
    lane: Arc<Lane>,
    host: Option<HostKey>,
    _permit: OwnedSemaphorePermit,
}

impl LanePermit {
    /// Records that work started (the per-host interval counts from here).
    pub fn started(&self) {
        if let Some(h) = &self.host {
            let mut hosts = crate::sync::lock(&self.lane.hosts);
            if let Some(s) = hosts.get_mut(h) {
                s.last_start = Some(Instant::now());
            }
        }
    }
}

impl Drop for LanePermit {
    fn drop(&mut self) {
        if let Some(h) = &self.host {
            let mut hosts = crate::sync::lock(&self.lane.hosts);
            if let Some(s) = hosts.get_mut(h) {
                s.busy = false;
            }
        }
    }
}

/// Clears a host's in-flight mark if the request gives up before getting a slot.
struct BusyGuard<'a> {
    lane: &'a Lane,
    host: Option<&'a HostKey>,
    armed: bool,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Some(h) = self.host {
                if let Some(s) = crate::sync::lock(&self.lane.hosts).get_mut(h) {
                    s.busy = false;
                }
            }
        }
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

    /// Waits (bounded) for a slot.
    pub async fn enter(self: &Arc<Self>, host: &HostKey) -> Result<LanePermit, LaneReject> {
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
        let mut guard = BusyGuard {
            lane: self,
            host: per_host.then_some(host),
            armed: true,
        };
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
        guard.armed = false;
        Ok(LanePermit {
            lane: self.clone(),
            host: per_host.then(|| host.clone()),
            _permit: permit,
        })
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
