//! Wall-clock time in epoch milliseconds: the one clock every rule compares against.
//!
//! Decision code takes `now: i64` as a parameter so tests can pass any instant; only the glue reads
//! the clock.
//!
//! With the `test-clock` feature (enabled only by this crate's own dev-dependency on itself, so
//! `cargo test` has it and `cargo build --release` does not), [`now_ms`] follows tokio's clock:
//! the wall time at the first call plus the tokio time elapsed since. A test that pauses tokio time
//! and advances it (`tokio::time::advance`) moves every store rule, token expiry and lease of the
//! in-process server by exactly that much, together with the server's timers.

/// Whether this build carries the test clock.
pub const TEST_CLOCK: bool = cfg!(feature = "test-clock");

/// Milliseconds since the Unix epoch.
#[cfg(not(feature = "test-clock"))]
pub fn now_ms() -> i64 {
    wall_ms()
}

/// Milliseconds since the Unix epoch, following tokio's (pausable) clock.
#[cfg(feature = "test-clock")]
pub fn now_ms() -> i64 {
    use std::sync::OnceLock;
    static BASE: OnceLock<(i64, std::time::Instant)> = OnceLock::new();
    let (wall, at) = *BASE.get_or_init(|| (wall_ms(), std::time::Instant::now()));
    let now = tokio::time::Instant::now().into_std();
    // Signed nanoseconds, floored to ms: differences of two readings are exact.
    let ns = match now.checked_duration_since(at) {
        Some(d) => d.as_nanos() as i128,
        None => -(at.duration_since(now).as_nanos() as i128),
    };
    wall + ns.div_euclid(1_000_000) as i64
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(all(test, feature = "test-clock"))]
mod tests {
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_tokio_time() {
        let t0 = super::now_ms();
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(super::now_ms() - t0, 90_000);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(super::now_ms() - t0, 91_500);
    }
}
