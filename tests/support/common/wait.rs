//! Waiting for a condition: poll with a deadline, never sleep a fixed time and hope.
//!
//! The polling pause is a tokio sleep, so these run on tokio's clock: under a paused clock that
//! auto-advances they still end; under [`super::time::ManualTime`] (no auto-advance) use
//! [`super::time::real_deadline`] around an awaited event instead.

use std::future::Future;
use std::time::Duration;

/// How often a condition is polled.
pub const POLL: Duration = Duration::from_millis(10);

/// How often [`wait_until`] polls: its conditions usually cost a request to another process.
pub const POLL_REQUEST: Duration = Duration::from_millis(50);

/// Polls `f` every [`POLL`] until it is true or `within` passes; returns its last answer.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    eventually_async(within, || std::future::ready(f())).await
}

/// [`eventually`] for an asynchronous condition (an HTTP request, a store read).
pub async fn eventually_async<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls the asynchronous `f` every [`POLL_REQUEST`] and fails the test, naming `what`, when
/// `within` passes first.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(POLL_REQUEST).await;
    }
}

/// The blocking form for code outside a runtime (process logs read by a thread): polls `f` in
/// real time.
pub fn eventually_blocking(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}
