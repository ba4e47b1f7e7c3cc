//! `GET /ready` (docs/reference/http.md): a cached, single-flight database probe with a grace period.
//!
//! The verdict is cached for 10 s and computed by one caller at a time. A database that answered
//! within the grace window and fails now yields `degraded` instead of `503`, so one blip does not
//! pull every node out of a load balancer; one that never answered gets no grace.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::contract::limits::READINESS_CACHE_MS;
use crate::store::Db;

/// The verdict `/ready` answers and a cell reports in its heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ready,
    /// The database fails now but answered within the grace window.
    Degraded,
    Unavailable,
    /// The TLS listener has no certificate to serve (ACME has not obtained one yet): nobody can
    /// reach this process, whatever its database says.
    TlsUnavailable,
}

impl Verdict {
    /// True unless unavailable (degraded still serves).
    pub fn is_ready(self) -> bool {
        !matches!(self, Verdict::Unavailable | Verdict::TlsUnavailable)
    }
}

pub struct Readiness {
    db: Db,
    grace_ms: u64,
    state: Mutex<State>,
    probe: tokio::sync::Mutex<()>,
    /// Whether the TLS listener can serve a handshake, when TLS is on.
    tls_serving: std::sync::OnceLock<TlsServing>,
}

/// Answers whether the TLS listener holds a certificate now.
pub type TlsServing = Box<dyn Fn() -> bool + Send + Sync>;

#[derive(Default)]
struct State {
    cached: Option<(Instant, Verdict)>,
    last_ok: Option<Instant>,
}

impl Readiness {
    pub fn new(db: Db, grace_ms: u64) -> Readiness {
        Readiness {
            db,
            grace_ms,
            state: Mutex::new(State::default()),
            probe: tokio::sync::Mutex::new(()),
            tls_serving: std::sync::OnceLock::new(),
        }
    }

    /// Makes readiness depend on the TLS listener: not ready while `serving` answers false.
    pub fn gate_on_tls(&self, serving: TlsServing) {
        let _ = self.tls_serving.set(serving);
    }

    fn cached(&self) -> Option<Verdict> {
        let st = crate::sync::lock(&self.state);
        st.cached
            .filter(|(at, _)| at.elapsed() < Duration::from_millis(READINESS_CACHE_MS))
            .map(|(_, v)| v)
    }

    /// The current verdict, probing the database at most once per cache period.
    pub async fn check(&self) -> Verdict {
        if self.tls_serving.get().is_some_and(|serving| !serving()) {
            return Verdict::TlsUnavailable;
        }
        if let Some(v) = self.cached() {
            return v;
        }
        let _flight = self.probe.lock().await;
        if let Some(v) = self.cached() {
            return v;
        }
        let ok = tokio::time::timeout(Duration::from_secs(5), self.db.ping())
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false);
        let mut st = crate::sync::lock(&self.state);
        let now = Instant::now();
        let verdict = if ok {
            st.last_ok = Some(now);
            Verdict::Ready
        } else {
            match st.last_ok {
                Some(t)
                    if self.grace_ms > 0 && t.elapsed() < Duration::from_millis(self.grace_ms) =>
                {
                    Verdict::Degraded
                }
                _ => Verdict::Unavailable,
            }
        };
        st.cached = Some((now, verdict));
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A TLS listener without a certificate makes the process not ready, whatever the database
    /// says, and ready again as soon as a certificate is held.
    #[tokio::test]
    async fn no_tls_certificate_is_not_ready() {
        let t = crate::store::testing::TestDb::sqlite().await;
        let r = Readiness::new(t.db.clone(), 0);
        assert_eq!(r.check().await, Verdict::Ready);
        let serving = Arc::new(AtomicBool::new(false));
        let s = serving.clone();
        r.gate_on_tls(Box::new(move || s.load(Ordering::SeqCst)));
        assert_eq!(r.check().await, Verdict::TlsUnavailable);
        assert!(!Verdict::TlsUnavailable.is_ready());
        serving.store(true, Ordering::SeqCst);
        assert_eq!(r.check().await, Verdict::Ready);
    }
}
