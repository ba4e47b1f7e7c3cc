//! Manual time for tests of minute-long timers (control ping/silence, token expiry, orphan
//! grace, attach deadlines, drain pacing).
//!
//! Under the crate's `test-clock` feature `clock::now_ms` follows tokio's clock, so pausing tokio
//! time moves the in-process server's rules (token expiry, leases, silence) together with its
//! timers (`interval`, `sleep`). Plain `tokio::time::pause` is not enough: a paused
//! current-thread runtime *auto-advances* to the next timer whenever it has nothing to run, and it
//! has nothing to run while it waits for real work off the runtime (the SQLite thread, a socket
//! of another process). Then the clock jumps while a reply is in flight, and a test that meant to
//! pong at 15 s pongs at 30 s (the earlier jumped `cell_slow.rs` overran its 75–91 s window
//! that way under load). [`ManualTime`] therefore also keeps one blocking task parked, which
//! tokio counts as work in flight and which stops auto-advance: the clock moves only in
//! [`ManualTime::advance`], by exactly the step asked, however slow the machine is.
//!
//! Consequence: with manual time on, a tokio timeout never fires on its own. Awaits that could
//! hang are wrapped in [`real_deadline`], a deadline in real time.

use std::future::Future;
use std::time::Duration;

/// Tokio time paused and moved only by [`ManualTime::advance`] (a current-thread runtime started
/// paused: `#[tokio::test(start_paused = true)]`).
pub struct ManualTime {
    hold: Option<std::sync::mpsc::Sender<()>>,
}

impl ManualTime {
    /// Stops the paused clock from auto-advancing. Call it first in a
    /// `#[tokio::test(start_paused = true)]`: a runtime that starts paused has its timer grid
    /// and its clock on the same instant, so a timer set `d` ahead fires on an advance of exactly
    /// `d` (a clock paused later sits between two 1 ms timer ticks, and such a timer would need
    /// up to 1 ms more); and no await can auto-advance before the hold is in place.
    pub fn start() -> ManualTime {
        const _: () = assert!(orca_relay::clock::TEST_CLOCK, "tests run on the test clock");
        assert_eq!(
            tokio::time::Instant::now(),
            tokio::time::Instant::now(),
            "ManualTime needs #[tokio::test(start_paused = true)]"
        );
        ManualTime { hold: Some(hold()) }
    }

    /// Moves the clock forward by `d`: `clock::now_ms` reads `d` later and every timer due by
    /// then fires (the server's work they start runs in real time at the new instant).
    pub async fn advance(&self, d: Duration) {
        tokio::time::advance(d).await;
    }

    /// Runs `fut` with tokio's ordinary paused-clock behaviour (auto-advance to the next timer
    /// whenever nothing can run), then holds the clock again. For phases whose timing no test
    /// asserts and that wait on many timers, such as a server's shutdown between two backends.
    pub async fn auto<F: Future>(&mut self, fut: F) -> F::Output {
        self.hold.take();
        let out = fut.await;
        self.hold = Some(hold());
        out
    }

    /// Real time runs again from the current instant (before shutting a server down: its
    /// shutdown waits on timers).
    pub fn resume(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if self.hold.take().is_some() {
            tokio::time::resume();
        }
    }
}

impl Drop for ManualTime {
    fn drop(&mut self) {
        // Dropped while unwinding from a failed assertion, the runtime may be gone: no panic.
        if self.hold.is_some() && tokio::runtime::Handle::try_current().is_ok() {
            self.release();
        }
    }
}

/// Parks a blocking task until the returned sender is dropped: tokio does not auto-advance a
/// paused current-thread runtime while one of its blocking tasks is in flight.
fn hold() -> std::sync::mpsc::Sender<()> {
    let (hold, parked) = std::sync::mpsc::channel::<()>();
    drop(tokio::task::spawn_blocking(move || {
        let _ = parked.recv();
    }));
    hold
}

/// `fut`, or a panic naming `what` if it has not finished after `within` of real (wall) time.
/// The deadline is a thread, not a tokio timer, so it holds under [`ManualTime`].
pub async fn real_deadline<F: Future>(within: Duration, what: &str, fut: F) -> F::Output {
    let (fire, fired) = tokio::sync::oneshot::channel::<()>();
    let (cancel, cancelled) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = cancelled.recv_timeout(within) {
            let _ = fire.send(());
        }
    });
    let out = tokio::select! {
        v = fut => v,
        Ok(()) = fired => panic!("{what}: not within {within:?} of real time"),
    };
    drop(cancel);
    out
}

/// Polls `f` until it is true or `within` of real time passes (the pause between polls is real
/// time too, spent on a blocking thread), for conditions under [`ManualTime`], where
/// [`super::wait::eventually`]'s tokio sleep would never end.
pub async fn real_eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::task::spawn_blocking(|| std::thread::sleep(super::wait::POLL))
            .await
            .expect("poll pause");
    }
}

/// Moves tokio's clock forward by `d` at once; with the test clock (`clock::now_ms` follows tokio
/// time in this crate's tests) the in-process server's rules see `d` pass too, and its timers due
/// in between fire. Real time then runs on from the new instant.
pub async fn jump(d: Duration) {
    const _: () = assert!(orca_relay::clock::TEST_CLOCK, "tests run on the test clock");
    tokio::time::pause();
    tokio::time::advance(d).await;
    tokio::time::resume();
}
