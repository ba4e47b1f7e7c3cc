//! Keep-alive near the HTTP connection cap ([`HTTP_CONNECTIONS_MAX`]).
//!
//! A connection kept alive after its response holds one of the process's serving slots while it
//! waits for its client's next request, up to [`HEADER_READ_TIMEOUT_S`]. In a reconnect storm
//! every desktop's `POST /v1/assign` leaves such a connection behind, and the slots they hold
//! push the WebSocket upgrades that follow (the same desktops' controls, their phones) over the
//! cap, where they are answered `503 server_busy` and start over. So while fewer than
//! [`KEEPALIVE_FREE_MIN`] slots are free, a response other than a `101` upgrade carries
//! `Connection: close` and the connection ends with it. Counted in [`DECLINED_TOTAL`].
//!
//! Only a response closes a connection: closing one that waits idle for its next request would
//! race a request its client may already be sending, which would then get no answer at all.
//!
//! [`HTTP_CONNECTIONS_MAX`]: crate::contract::limits::HTTP_CONNECTIONS_MAX
//! [`HEADER_READ_TIMEOUT_S`]: crate::contract::limits::HEADER_READ_TIMEOUT_S
//! [`KEEPALIVE_FREE_MIN`]: crate::contract::limits::KEEPALIVE_FREE_MIN

use std::sync::Arc;

use http::{header, HeaderValue, StatusCode};
use prometheus::IntCounter;
use tokio::sync::Semaphore;

use crate::contract::limits::KEEPALIVE_FREE_MIN;
use crate::metrics::Metrics;

/// The counter's name: responses sent with `Connection: close` because the process was crowded.
pub const DECLINED_TOTAL: &str = "orca_relay_http_keepalive_declined_total";

/// Whether a process with `free` serving slots is crowded: it keeps no connection alive.
pub fn crowded(free: usize) -> bool {
    free < KEEPALIVE_FREE_MIN
}

/// Whether a response with `status` may carry `Connection: close` (a `101` hands the connection
/// to the upgraded protocol instead).
pub fn closable(status: StatusCode) -> bool {
    status != StatusCode::SWITCHING_PROTOCOLS
}

/// The keep-alive policy of one listener over its serving slots.
#[derive(Clone)]
pub struct KeepAlive {
    slots: Arc<Semaphore>,
    declined: IntCounter,
}

impl KeepAlive {
    pub fn new(metrics: &Metrics, slots: Arc<Semaphore>) -> KeepAlive {
        let declined = metrics
            .register_counter_vec(
                DECLINED_TOTAL,
                "responses sent with Connection: close (the connection not kept alive) because \
                 the process was near its HTTP connection cap",
                &[],
            )
            .with_label_values(&[] as &[&str]);
        KeepAlive { slots, declined }
    }

    /// Marks `resp` `Connection: close` when the process is crowded.
    pub fn decide<B>(&self, resp: &mut http::Response<B>) {
        if closable(resp.status()) && crowded(self.slots.available_permits()) {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            self.declined.inc();
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
    async fn marks_responses_only_while_crowded() {
        let metrics = Metrics::new();
        let slots = Arc::new(Semaphore::new(KEEPALIVE_FREE_MIN + 1));
        let ka = KeepAlive::new(&metrics, slots.clone());
        let mut ok = http::Response::new(());
        ka.decide(&mut ok);
        assert!(ok.headers().get(header::CONNECTION).is_none());

        let held = slots.clone().acquire_many_owned(2).await.unwrap();
        let mut ok = http::Response::new(());
        ka.decide(&mut ok);
        assert_eq!(ok.headers()[header::CONNECTION], "close");
        let mut up = http::Response::new(());
        *up.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        ka.decide(&mut up);
        assert!(up.headers().get(header::CONNECTION).is_none());
        assert_eq!(ka.declined.get(), 1);

        drop(held);
        let mut ok = http::Response::new(());
        ka.decide(&mut ok);
        assert!(ok.headers().get(header::CONNECTION).is_none());
        assert_eq!(ka.declined.get(), 1);
    }
}
