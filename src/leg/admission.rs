//! Pre-auth admission of phone and data legs (docs/reference/websocket.md): sockets awaiting their first
//! frame (45 cell-wide, 4 per source) and per-source attempt windows (30 per 60 s, 4 096 sources,
//! least recently used evicted). Pure: the caller supplies the clock and the open-connection verdict.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use hashlink::LruCache;

use crate::contract::limits;

#[derive(Debug, Clone, Copy)]
pub struct PreAuthLimits {
    pub cell_max: usize,
    pub source_max: usize,
    pub attempts: u32,
    pub window_ms: i64,
    pub sources: usize,
}

impl Default for PreAuthLimits {
    fn default() -> Self {
        PreAuthLimits {
            cell_max: limits::PREAUTH_CELL_MAX,
            source_max: limits::PREAUTH_SOURCE_MAX,
            attempts: limits::PREAUTH_ATTEMPTS_PER_WINDOW,
            window_ms: limits::PREAUTH_WINDOW_MS,
            sources: limits::PREAUTH_SOURCES,
        }
    }
}

#[derive(Debug)]
struct Window {
    start: i64,
    count: u32,
}

/// Pre-auth state of a cell.
#[derive(Debug)]
pub struct PreAuth {
    limits: PreAuthLimits,
    awaiting: usize,
    awaiting_by_source: HashMap<String, usize>,
    /// Least recently used source first; SipHash because the keys come from clients.
    windows: LruCache<String, Window, RandomState>,
}

impl Default for PreAuth {
    fn default() -> Self {
        PreAuth::new(PreAuthLimits::default())
    }
}

impl PreAuth {
    pub fn new(limits: PreAuthLimits) -> PreAuth {
        PreAuth {
            limits,
            awaiting: 0,
            awaiting_by_source: HashMap::new(),
            // At least one source, so the window just inserted is never the one evicted.
            windows: LruCache::with_hasher(limits.sources.max(1), RandomState::new()),
        }
    }

    /// Sockets awaiting a first frame, cell-wide.
    pub fn awaiting(&self) -> usize {
        self.awaiting
    }

    /// Admits one attempt from `source` if every rule of holds (`capacity_ok` = the
    /// open-connection rule); an admitted socket counts as awaiting until [`PreAuth::leave`].
    pub fn try_admit(&mut self, source: &str, now_ms: i64, capacity_ok: bool) -> bool {
        let by_source = self.awaiting_by_source.get(source).copied().unwrap_or(0);
        if self.awaiting >= self.limits.cell_max
            || by_source >= self.limits.source_max
            || !capacity_ok
        {
            return false;
        }
        let window_ms = self.limits.window_ms;
        // A touch (even a refused attempt) makes the source the most recently used.
        if self.windows.get_mut(source).is_none() {
            let fresh = Window {
                start: now_ms,
                count: 0,
            };
            self.windows.insert(source.to_owned(), fresh);
        }
        let w = self.windows.get_mut(source).expect("window just touched");
        if now_ms - w.start >= window_ms {
            w.start = now_ms;
            w.count = 0;
        }
        if w.count >= self.limits.attempts {
            return false;
        }
        w.count += 1;
        self.awaiting += 1;
        *self
            .awaiting_by_source
            .entry(source.to_owned())
            .or_insert(0) += 1;
        true
    }

    /// The socket got its first frame, hit its deadline or closed.
    pub fn leave(&mut self, source: &str) {
        self.awaiting = self.awaiting.saturating_sub(1);
        if let Some(n) = self.awaiting_by_source.get_mut(source) {
            *n -= 1;
            if *n == 0 {
                self.awaiting_by_source.remove(source);
            }
        }
    }

    /// Number of sources with a window (≤ 4 096).
    pub fn window_count(&self) -> usize {
        self.windows.len()
    }
}

/// One process-wide pre-auth table behind a mutex (what a cell or the director's invite redirect
/// holds). Critical sections are short and never await; a poisoned lock is recovered, because
/// every mutation leaves the table consistent before it can panic (see `ARCHITECTURE.md`, "Mutex
/// poisoning").
#[derive(Debug, Default)]
pub struct PreAuthGate(Mutex<PreAuth>);

impl PreAuthGate {
    pub fn new(limits: PreAuthLimits) -> PreAuthGate {
        PreAuthGate(Mutex::new(PreAuth::new(limits)))
    }

    fn lock(&self) -> MutexGuard<'_, PreAuth> {
        crate::sync::lock(&self.0)
    }

    /// [`PreAuth::try_admit`].
    pub fn admit(&self, source: &str, now_ms: i64, capacity_ok: bool) -> bool {
        self.lock().try_admit(source, now_ms, capacity_ok)
    }

    /// [`PreAuth::leave`].
    pub fn leave(&self, source: &str) {
        self.lock().leave(source)
    }

    /// Sockets awaiting a first frame.
    pub fn awaiting(&self) -> usize {
        self.lock().awaiting()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_source_awaiting_cap_is_four() {
        let mut p = PreAuth::new(PreAuthLimits::default());
        for _ in 0..4 {
            assert!(p.try_admit("a", 0, true));
        }
        assert!(
            !p.try_admit("a", 0, true),
            "5th silent socket from one source"
        );
        assert!(p.try_admit("b", 0, true));
        p.leave("a");
        assert!(p.try_admit("a", 0, true));
    }

    #[test]
    fn cell_wide_cap_is_45() {
        let mut p = PreAuth::new(PreAuthLimits::default());
        for i in 0..45 {
            assert!(p.try_admit(&format!("s{i}"), 0, true));
        }
        assert!(!p.try_admit("x", 0, true));
        assert_eq!(p.awaiting(), 45);
    }

    #[test]
    fn thirty_attempts_per_window_then_new_window() {
        let mut p = PreAuth::new(PreAuthLimits::default());
        for i in 0..30 {
            assert!(p.try_admit("a", i, true));
            p.leave("a");
        }
        assert!(
            !p.try_admit("a", 59_999, true),
            "31st attempt in the window"
        );
        assert!(
            p.try_admit("a", 60_000, true),
            "window started by the first attempt"
        );
    }

    #[test]
    fn capacity_refusal_is_not_counted() {
        let mut p = PreAuth::new(PreAuthLimits::default());
        for _ in 0..40 {
            assert!(!p.try_admit("a", 0, false));
        }
        for _ in 0..30 {
            assert!(p.try_admit("a", 0, true));
            p.leave("a");
        }
    }

    #[test]
    fn lru_keeps_4096_sources() {
        let mut p = PreAuth::new(PreAuthLimits::default());
        // Exhaust "hot", then touch 4095 others: "hot" is still remembered (recently used).
        for _ in 0..30 {
            assert!(p.try_admit("hot", 0, true));
            p.leave("hot");
        }
        for i in 0..4095 {
            assert!(p.try_admit(&format!("s{i}"), 1, true));
            p.leave(&format!("s{i}"));
        }
        assert!(!p.try_admit("hot", 2, true));
        assert_eq!(p.window_count(), 4096);
        // 4096 more new sources evict it.
        for i in 0..4096 {
            assert!(p.try_admit(&format!("t{i}"), 3, true));
            p.leave(&format!("t{i}"));
        }
        assert_eq!(p.window_count(), 4096);
        assert!(p.try_admit("hot", 4, true));
    }
}
