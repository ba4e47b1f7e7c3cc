//! `GET /ready` (operations.md §1): a cached, single-flight database probe with a grace period.
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
}

impl Verdict {
    /// True unless unavailable (degraded still serves).
    pub fn is_ready(self) -> bool {
        !matches!(self, Verdict::Unavailable)
    }
}

pub struct Readiness {
    db: Db,
    grace_ms: u64,
    state: Mutex<State>,
    probe: tokio::sync::Mutex<()>,
}

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
        }
    }

    fn cached(&self) -> Option<Verdict> {
        let st = crate::sync::lock(&self.state);
        st.cached
            .filter(|(at, _)| at.elapsed() < Duration::from_millis(READINESS_CACHE_MS))
            .map(|(_, v)| v)
    }

    /// The current verdict, probing the database at most once per cache period.
    pub async fn check(&self) -> Verdict {
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
