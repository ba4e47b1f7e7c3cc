//! Keep-alive near the HTTP connection cap ([`HTTP_CONNECTIONS_MAX`]).
//!
//! A connection kept alive after its response holds one of the process's serving slots while it
//! waits for its client's next request, up to [`HEADER_READ_TIMEOUT_S`]. In a reconnect storm
//! every desktop's `POST /v1/assign` leaves such a connection behind, and the slots they hold
//! push the WebSocket upgrades that follow (the same desktops' controls, their phones) over the
//! cap, where they are answered `503 server_busy` and start over. So while fewer than
//! [`KEEPALIVE_FREE_MIN`] slots are free the process stops keeping connections alive: a response
//! other than a `101` upgrade carries `Connection: close`, and a connection that has answered a
//! request is closed when crowding begins (after its request in progress, at once when idle).
//! Counted in [`DECLINED_TOTAL`] by `at` (`response`, or `connection` for one open when crowding
//! began).
//!
//! [`HTTP_CONNECTIONS_MAX`]: crate::contract::limits::HTTP_CONNECTIONS_MAX
//! [`HEADER_READ_TIMEOUT_S`]: crate::contract::limits::HEADER_READ_TIMEOUT_S
//! [`KEEPALIVE_FREE_MIN`]: crate::contract::limits::KEEPALIVE_FREE_MIN

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{header, HeaderValue, StatusCode};
use prometheus::IntCounter;

use tokio::sync::{watch, Semaphore};

use crate::contract::limits::KEEPALIVE_FREE_MIN;
use crate::metrics::Metrics;

/// The counter's name: responses and idle connections closed instead of kept alive.
pub const DECLINED_TOTAL: &str = "orca_relay_http_keepalive_declined_total";

/// Whether a process with `free` serving slots is crowded: it keeps no connection alive.
pub fn crowded(free: usize) -> bool {
    free < KEEPALIVE_FREE_MIN
}

/// Whether a response with `status` may still carry `Connection: close` (a `101` hands the
/// connection to the upgraded protocol instead).
pub fn closable(status: StatusCode) -> bool {
    status != StatusCode::SWITCHING_PROTOCOLS
}

/// The keep-alive policy of one listener: its serving slots, and a signal to connections
/// waiting for their next request.
#[derive(Clone)]
pub struct KeepAlive {
    slots: Arc<Semaphore>,
    crowded: Arc<watch::Sender<bool>>,
    declined: IntCounter,
    closed_open: IntCounter,
}

impl KeepAlive {
    pub fn new(metrics: &Metrics, slots: Arc<Semaphore>) -> KeepAlive {
        let vec = metrics.register_counter_vec(
            DECLINED_TOTAL,
            "connections not kept alive because the process was near its HTTP connection cap: \
             a response sent with Connection: close, or a kept-alive connection open when \
             crowding began closed after its request in progress (at once when idle)",
            &["at"],
        );
        KeepAlive {
            slots,
            crowded: Arc::new(watch::Sender::new(false)),
            declined: vec.with_label_values(&["response"]),
            closed_open: vec.with_label_values(&["connection"]),
        }
    }

    /// Re-reads the free slots and tells waiting connections when crowding begins (the accept
    /// loop calls it after every accept and the connections when they end).
    pub fn refresh(&self) {
        let now = crowded(self.slots.available_permits());
        self.crowded
            .send_if_modified(|c| std::mem::replace(c, now) != now);
    }

    /// Marks `resp` `Connection: close` when the process is crowded, and marks the connection
    /// `served` once it has answered a request it could be kept alive after.
    pub fn decide<B>(&self, resp: &mut http::Response<B>, served: &AtomicBool) {
        if !closable(resp.status()) {
            return;
        }
        served.store(true, Ordering::Relaxed);
        if crowded(self.slots.available_permits()) {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            self.declined.inc();
        }
    }

    /// A connection's view of crowding, taken when it opens.
    pub fn watch(&self) -> Crowding {
        Crowding {
            rx: self.crowded.subscribe(),
            closed: self.closed_open.clone(),
        }
    }
}

/// One connection's view of crowding: resolves when crowding *begins* after the connection
/// opened and once it has answered a request (a connection opened while crowded learns it from
/// [`KeepAlive::decide`] instead). One that has answered nothing yet is left alone: closing it
/// could drop a request already on its way, unanswered.
pub struct Crowding {
    rx: watch::Receiver<bool>,
    closed: IntCounter,
}

impl Crowding {
    /// Waits until crowding begins on a connection that has answered a request (`served`), then
    /// counts it as told to close.
    pub async fn begins(&mut self, served: &AtomicBool) {
        loop {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            if *self.rx.borrow_and_update() && served.load(Ordering::Relaxed) {
                self.closed.inc();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crowded_below_the_free_minimum_only() {
        assert!(crowded(0));
        assert!(crowded(KEEPALIVE_FREE_MIN - 1));
        assert!(!crowded(KEEPALIVE_FREE_MIN));
        assert!(!crowded(crate::contract::limits::HTTP_CONNECTIONS_MAX));
    }

    #[test]
    fn upgrades_are_never_marked() {
        assert!(!closable(StatusCode::SWITCHING_PROTOCOLS));
        assert!(closable(StatusCode::OK));
        assert!(closable(StatusCode::SERVICE_UNAVAILABLE));
    }

    #[tokio::test]
    async fn marks_responses_and_signals_only_while_crowded() {
        let metrics = Metrics::new();
        let slots = Arc::new(Semaphore::new(KEEPALIVE_FREE_MIN + 1));
        let ka = KeepAlive::new(&metrics, slots.clone());
        let served = AtomicBool::new(false);
        let mut ok = http::Response::new(());
        ka.decide(&mut ok, &served);
        assert!(ok.headers().get(header::CONNECTION).is_none());
        assert!(served.load(Ordering::Relaxed));

        let held = slots.clone().acquire_many_owned(2).await.unwrap();
        ka.refresh();
        let mut ok = http::Response::new(());
        ka.decide(&mut ok, &served);
        assert_eq!(ok.headers()[header::CONNECTION], "close");
        let upgraded = AtomicBool::new(false);
        let mut up = http::Response::new(());
        *up.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        ka.decide(&mut up, &upgraded);
        assert!(up.headers().get(header::CONNECTION).is_none());
        assert!(
            !upgraded.load(Ordering::Relaxed),
            "an upgrade is never closed"
        );
        assert_eq!(ka.declined.get(), 1);

        // A connection opened while crowded is not told again; one open before crowding began
        // is, once it has answered a request; one that has answered none is left alone.
        let mut opened_crowded = ka.watch();
        drop(held);
        ka.refresh();
        let mut opened_free = ka.watch();
        let mut unanswered = ka.watch();
        let served = Arc::new(served);
        let s2 = served.clone();
        let begins = tokio::spawn(async move { opened_free.begins(&s2).await });
        let fresh = Arc::new(AtomicBool::new(false));
        let f2 = fresh.clone();
        let never = tokio::spawn(async move { unanswered.begins(&f2).await });
        tokio::task::yield_now().await;
        assert!(!begins.is_finished());
        let _held = slots.clone().acquire_many_owned(2).await.unwrap();
        ka.refresh();
        begins.await.unwrap();
        assert_eq!(ka.closed_open.get(), 1);
        // The first connection saw crowding end and begin again: it is told too.
        opened_crowded.begins(&served).await;
        assert_eq!(ka.closed_open.get(), 2);
        tokio::task::yield_now().await;
        assert!(
            !never.is_finished(),
            "a connection that answered nothing was told to close"
        );
        never.abort();
    }
}
