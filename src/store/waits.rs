//! Who is waiting for the database, and for how long.
//!
//! The cell sheds control upgrades when store calls queue (docs/reference/websocket.md "store pressure shed"),
//! and heartbeats report pool waits in their safety object. Both read this tracker, which every
//! `Db::begin` passes through while it waits for a connection (SQLite: the single writer slot).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug, Default)]
pub struct WaitTracker {
    next: AtomicU64,
    inner: Mutex<Inner>,
    /// Failed statements and transaction starts, since start-up (the safety object's
    /// `sqlFailures`).
    sql_failures: AtomicU64,
    /// Connection-level failures (pool acquire, class 08, I/O): each forces a reconnect (the safety
    /// object's `reconnects`).
    reconnects: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    waiting: HashMap<u64, Instant>,
    window_waiters_max: u64,
    window_wait_ms_max: u64,
}

/// A point-in-time view of the wait queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PressureSnapshot {
    pub waiting: u64,
    pub oldest_wait_ms: u64,
}

/// Removes its waiter from the tracker when dropped (acquired or cancelled).
pub struct WaitGuard<'a> {
    tracker: &'a WaitTracker,
    id: u64,
}

impl WaitTracker {
    pub fn enter(&self) -> WaitGuard<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut inner = crate::sync::lock(&self.inner);
        inner.waiting.insert(id, Instant::now());
        let n = inner.waiting.len() as u64;
        inner.window_waiters_max = inner.window_waiters_max.max(n);
        WaitGuard { tracker: self, id }
    }

    pub fn snapshot(&self) -> PressureSnapshot {
        let inner = crate::sync::lock(&self.inner);
        let oldest = inner
            .waiting
            .values()
            .map(|t| t.elapsed().as_millis() as u64)
            .max()
            .unwrap_or(0);
        PressureSnapshot {
            waiting: inner.waiting.len() as u64,
            oldest_wait_ms: oldest,
        }
    }

    /// Counts a failed database call.
    pub fn record_error(&self, e: &super::DbError) {
        self.sql_failures.fetch_add(1, Ordering::Relaxed);
        if matches!(e, super::DbError::Transient(_)) {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (sql failures, reconnects) since start-up.
    pub fn failure_totals(&self) -> (u64, u64) {
        (
            self.sql_failures.load(Ordering::Relaxed),
            self.reconnects.load(Ordering::Relaxed),
        )
    }

    /// Returns (max waiters, max wait ms) since the previous call and starts a new window.
    pub fn take_window_maxima(&self) -> (u64, u64) {
        let mut inner = crate::sync::lock(&self.inner);
        let out = (inner.window_waiters_max, inner.window_wait_ms_max);
        inner.window_waiters_max = inner.waiting.len() as u64;
        inner.window_wait_ms_max = 0;
        out
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut inner = crate::sync::lock(&self.tracker.inner);
        if let Some(start) = inner.waiting.remove(&self.id) {
            let ms = start.elapsed().as_millis() as u64;
            inner.window_wait_ms_max = inner.window_wait_ms_max.max(ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_waiters_and_maxima() {
        let t = WaitTracker::default();
        {
            let _a = t.enter();
            let _b = t.enter();
            assert_eq!(t.snapshot().waiting, 2);
        }
        assert_eq!(t.snapshot().waiting, 0);
        let (n, _) = t.take_window_maxima();
        assert_eq!(n, 2);
        assert_eq!(t.take_window_maxima().0, 0);
    }
}
