//! Wall-clock time in epoch milliseconds: the one clock every rule compares against.
//!
//! Decision code takes `now: i64` as a parameter so tests can pass any instant; only the glue reads
//! the clock.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
