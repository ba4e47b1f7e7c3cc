//! The `assignment rejected` log line with its per-`route:lane:reason` 10 s rate limiter
//! (docs/deploy/cluster.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The default window.
pub const WINDOW: Duration = Duration::from_secs(10);

struct Window {
    started: Instant,
    suppressed: u64,
    last: String,
}

/// Rate-limited emitter of rejection lines.
pub struct RejectLog {
    window: Mutex<Duration>,
    windows: Mutex<HashMap<String, Window>>,
}

/// One rejection.
pub struct Rejection<'a> {
    pub route: &'a str,
    pub lane: &'a str,
    pub hinted: bool,
    pub reason: &'a str,
    pub host_digest: &'a str,
    pub cause: Option<&'a str>,
    pub cell: Option<&'a str>,
}

impl Rejection<'_> {
    pub fn line(&self) -> String {
        let mut s = format!(
            "[orca-relay] assignment rejected route={} lane={} hinted={} reason={} host={}",
            self.route, self.lane, self.hinted, self.reason, self.host_digest
        );
        if let Some(c) = self.cause {
            s.push_str(&format!(" cause={c}"));
        }
        if let Some(c) = self.cell {
            s.push_str(&format!(" cell={c}"));
        }
        s
    }
}

impl RejectLog {
    pub fn new() -> Arc<RejectLog> {
        Arc::new(RejectLog {
            window: Mutex::new(WINDOW),
            windows: Mutex::new(HashMap::new()),
        })
    }

    /// Shortens the window (tests).
    pub fn set_window(&self, d: Duration) {
        *crate::sync::lock(&self.window) = d;
    }

    /// Logs `r` now, or counts it and prints one `suppressed=<n>` line when its window ends.
    pub fn reject(self: &Arc<Self>, r: &Rejection<'_>) {
        let key = format!("{}:{}:{}", r.route, r.lane, r.reason);
        let line = r.line();
        let window = *crate::sync::lock(&self.window);
        let mut windows = crate::sync::lock(&self.windows);
        match windows.get_mut(&key) {
            Some(w) if w.started.elapsed() < window => {
                w.suppressed += 1;
                w.last = line;
                if w.suppressed == 1 {
                    let me = self.clone();
                    let wait = window.saturating_sub(w.started.elapsed());
                    let key = key.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        me.flush(&key);
                    });
                }
            }
            _ => {
                windows.insert(
                    key,
                    Window {
                        started: Instant::now(),
                        suppressed: 0,
                        last: line.clone(),
                    },
                );
                drop(windows);
                log::warn!("{line}");
            }
        }
    }

    fn flush(&self, key: &str) {
        let w = crate::sync::lock(&self.windows).remove(key);
        if let Some(w) = w {
            if w.suppressed > 0 {
                log::warn!("{} suppressed={}", w.last, w.suppressed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_format() {
        let r = Rejection {
            route: "assign",
            lane: "placement",
            hinted: true,
            reason: "relay_home_cell_unavailable",
            host_digest: "0123456789ab",
            cause: Some("not_ready"),
            cell: Some("A"),
        };
        assert_eq!(
            r.line(),
            "[orca-relay] assignment rejected route=assign lane=placement hinted=true \
             reason=relay_home_cell_unavailable host=0123456789ab cause=not_ready cell=A"
        );
        let r = Rejection {
            route: "resolve",
            lane: "none",
            hinted: false,
            reason: "queue-full",
            host_digest: "0123456789ab",
            cause: None,
            cell: None,
        };
        assert_eq!(
            r.line(),
            "[orca-relay] assignment rejected route=resolve lane=none hinted=false reason=queue-full host=0123456789ab"
        );
    }
}
