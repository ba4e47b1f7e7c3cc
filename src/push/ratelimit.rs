//! Per-process rate limits and auth admission (docs/reference/http.md): pure data structures, no I/O.
//!
//! Buckets refill continuously (`capacity` per 60 s) and keep at most [`MAX_KEYS`] keys, evicting the
//! least recently touched, so a flood of distinct sources costs bounded memory. Admission bounds the
//! concurrent session look-ups (4 active, 32 FIFO waiters) so a bearer flood cannot exhaust the pool.

use std::collections::hash_map::RandomState;
use std::net::IpAddr;
use std::sync::Arc;

use hashlink::LruCache;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Keys per bucket set.
pub const MAX_KEYS: usize = 10_000;
const WINDOW_MS: f64 = 60_000.0;

struct Entry {
    tokens: f64,
    at_ms: i64,
}

/// Token buckets keyed by a string (client IP or host fingerprint).
pub struct Buckets {
    capacity: f64,
    /// Least recently touched first; SipHash because the keys come from clients.
    entries: LruCache<String, Entry, RandomState>,
}

impl Buckets {
    pub fn new(capacity_per_minute: u32) -> Buckets {
        Self::with_max_keys(capacity_per_minute, MAX_KEYS)
    }

    pub fn with_max_keys(capacity_per_minute: u32, max_keys: usize) -> Buckets {
        Buckets {
            capacity: capacity_per_minute as f64,
            // At least one key, so the bucket just inserted is never the one evicted.
            entries: LruCache::with_hasher(max_keys.max(1), RandomState::new()),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Refills and touches `key`, creating a full bucket when unknown (evicting the least
    /// recently touched key when full).
    fn refill(&mut self, key: &str, now_ms: i64) -> &mut Entry {
        let cap = self.capacity;
        if self.entries.get_mut(key).is_none() {
            self.entries.insert(
                key.to_string(),
                Entry {
                    tokens: cap,
                    at_ms: now_ms,
                },
            );
        }
        let e = self.entries.get_mut(key).expect("entry just touched");
        let elapsed = (now_ms - e.at_ms).max(0) as f64;
        e.tokens = (e.tokens + elapsed * cap / WINDOW_MS).min(cap);
        e.at_ms = now_ms;
        e
    }

    /// Spends one token if one is left. `Err(retry_after_s)` when empty.
    pub fn allow(&mut self, key: &str, now_ms: i64) -> Result<(), u64> {
        let cap = self.capacity;
        let e = self.refill(key, now_ms);
        if e.tokens >= 1.0 {
            e.tokens -= 1.0;
            Ok(())
        } else {
            Err(retry_after_s(e.tokens, cap))
        }
    }

    /// Looks without spending. `Err(retry_after_s)` when empty.
    pub fn peek(&mut self, key: &str, now_ms: i64) -> Result<(), u64> {
        let cap = self.capacity;
        let e = self.refill(key, now_ms);
        if e.tokens >= 1.0 {
            Ok(())
        } else {
            Err(retry_after_s(e.tokens, cap))
        }
    }

    /// Spends a token whether or not one is left (a bad bearer always costs).
    pub fn spend(&mut self, key: &str, now_ms: i64) {
        let e = self.refill(key, now_ms);
        e.tokens = (e.tokens - 1.0).max(0.0);
    }
}

/// Whole seconds until the bucket holds one token, at least 1.
fn retry_after_s(tokens: f64, capacity: f64) -> u64 {
    let missing = (1.0 - tokens).max(0.0);
    let ms = missing * WINDOW_MS / capacity;
    ((ms / 1000.0).ceil() as u64).max(1)
}

/// The rate-limit key of a client source string (docs/reference/http.md): IPv4-mapped IPv6 as IPv4, other IPv6
/// by /64, anything that is not an IP `unknown`.
pub fn ip_key(source: &str) -> String {
    let trimmed = source.trim().trim_start_matches('[').trim_end_matches(']');
    match trimmed.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.to_string(),
        Ok(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        Err(_) => "unknown".to_string(),
    }
}

/// Auth admission: at most `active` concurrent session resolutions and `waiting` queued (FIFO).
#[derive(Clone)]
pub struct Admission {
    sem: Arc<Semaphore>,
    waiting: Arc<std::sync::atomic::AtomicUsize>,
    max_waiting: usize,
}

/// Admission refused: `503 busy`.
#[derive(Debug, PartialEq, Eq)]
pub struct Busy;

impl Admission {
    pub fn new(active: usize, waiting: usize) -> Admission {
        Admission {
            sem: Arc::new(Semaphore::new(active)),
            waiting: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            max_waiting: waiting,
        }
    }

    /// Waits for a slot in FIFO order, or refuses at once when the waiting line is full.
    pub async fn enter(&self) -> Result<OwnedSemaphorePermit, Busy> {
        use std::sync::atomic::Ordering;
        if let Ok(p) = self.sem.clone().try_acquire_owned() {
            return Ok(p);
        }
        let prev = self.waiting.fetch_add(1, Ordering::SeqCst);
        if prev >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Busy);
        }
        let permit = self.sem.clone().acquire_owned().await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        permit.map_err(|_| Busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_spends_and_refills() {
        let mut b = Buckets::new(30);
        for _ in 0..30 {
            assert!(b.allow("a", 0).is_ok());
        }
        assert_eq!(b.allow("a", 0), Err(2));
        // 1 token per 2 s.
        assert_eq!(b.allow("a", 1999), Err(1));
        assert!(b.allow("a", 2000).is_ok());
        assert!(b.allow("b", 2000).is_ok());
        assert!(b.peek("a", 2000).is_err());
    }

    #[test]
    fn peek_does_not_spend() {
        let mut b = Buckets::new(1);
        assert!(b.peek("a", 0).is_ok());
        assert!(b.peek("a", 0).is_ok());
        b.spend("a", 0);
        assert_eq!(b.peek("a", 0), Err(60));
        b.spend("a", 0);
        assert_eq!(b.peek("a", 30_000), Err(30));
    }

    #[test]
    fn evicts_least_recently_touched() {
        let mut b = Buckets::with_max_keys(1, 3);
        b.spend("a", 0);
        b.spend("b", 0);
        b.spend("c", 0);
        b.spend("a", 0); // a is now the most recent
        b.spend("d", 0); // evicts b
        assert_eq!(b.len(), 3);
        assert!(b.peek("a", 0).is_err());
        assert!(b.peek("b", 0).is_ok(), "b was evicted and is fresh again");
        assert_eq!(b.len(), 3);
        let mut big = Buckets::new(1);
        for i in 0..20_000 {
            big.spend(&i.to_string(), 0);
        }
        assert_eq!(big.len(), MAX_KEYS);
    }

    #[test]
    fn ip_keys() {
        assert_eq!(ip_key("198.51.100.7"), "198.51.100.7");
        assert_eq!(ip_key("::ffff:1.2.3.4"), "1.2.3.4");
        assert_eq!(ip_key("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
        assert_eq!(ip_key("[2001:db8:1:2::9]"), "2001:db8:1:2::/64");
        assert_eq!(ip_key("not-an-ip"), "unknown");
    }

    /// U-44: 4 held and 32 waiting, one more is refused.
    #[tokio::test]
    async fn admission_refuses_the_37th() {
        let a = Admission::new(4, 32);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(a.enter().await.unwrap());
        }
        let mut waiters = Vec::new();
        for _ in 0..32 {
            let a = a.clone();
            waiters.push(tokio::spawn(async move { a.enter().await.map(|_| ()) }));
        }
        // Let the waiters queue.
        for _ in 0..100 {
            if a.waiting.load(std::sync::atomic::Ordering::SeqCst) == 32 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(a.waiting.load(std::sync::atomic::Ordering::SeqCst), 32);
        assert_eq!(a.enter().await.err(), Some(Busy));
        drop(held);
        for w in waiters {
            assert!(w.await.unwrap().is_ok());
        }
        assert!(a.enter().await.is_ok());
    }
}
