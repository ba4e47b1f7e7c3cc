//! Every Prometheus series of the process, named in one place (operations.md §2, push.md §12).
//!
//! Labels are bounded sets (leg, code, reason, outcome, route, cell id, store op), never host ids.

pub mod process;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// The push gateway's counters, in the order of push.md §12.
pub const PUSH_COUNTERS: &[&str] = &[
    "ip_rate_limited",
    "request_error",
    "challenge_issued",
    "challenge_rejected",
    "session_issued",
    "session_rejected",
    "device_registered",
    "device_rejected",
    "device_deleted",
    "send_queued",
    "send_dead",
    "send_rate_limited",
    "send_error",
    "delivery_sent",
    "delivery_dead",
    "delivery_error",
    "delivery_retry",
    "delivery_expired",
];

pub struct Metrics {
    pub registry: Registry,
    pub connections: IntGaugeVec,
    pub splices_active: IntGauge,
    pub splice_frames: IntCounterVec,
    pub splice_bytes: IntCounterVec,
    pub ws_closes: IntCounterVec,
    pub host_proofs: IntCounterVec,
    pub admission_rejections: IntCounterVec,
    pub assignments: IntCounterVec,
    pub assignment_seconds: HistogramVec,
    pub cell_live: IntGaugeVec,
    pub heartbeats: IntCounterVec,
    pub db_seconds: HistogramVec,
    pub push_queue_depth: IntGauge,
    push_counters: Vec<IntCounter>,
    /// Series registered by the modules that move them, by name.
    owned: Mutex<HashMap<String, IntCounterVec>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone())).expect("register metric");
    c
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            reg(&r, IntGaugeVec::new(Opts::new(name, help), labels).unwrap())
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                IntCounterVec::new(Opts::new(name, help), labels).unwrap(),
            )
        };
        let histogram_vec = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                HistogramVec::new(HistogramOpts::new(name, help), labels).unwrap(),
            )
        };
        let push_counters = PUSH_COUNTERS
            .iter()
            .map(|n| {
                reg(
                    &r,
                    IntCounter::new(format!("orca_push_{n}_total"), format!("push {n}")).unwrap(),
                )
            })
            .collect();
        Metrics {
            connections: gauge_vec("orca_relay_connections", "open WebSockets by leg", &["leg"]),
            splices_active: reg(
                &r,
                IntGauge::new("orca_relay_splices_active", "live splices").unwrap(),
            ),
            splice_frames: counter_vec(
                "orca_relay_splice_frames_total",
                "frames relayed",
                &["direction"],
            ),
            splice_bytes: counter_vec(
                "orca_relay_splice_bytes_total",
                "payload bytes relayed",
                &["direction"],
            ),
            ws_closes: counter_vec(
                "orca_relay_ws_closes_total",
                "relay-initiated closes",
                &["leg", "code"],
            ),
            host_proofs: counter_vec(
                "orca_relay_host_proofs_total",
                "host proof outcomes",
                &["outcome"],
            ),
            admission_rejections: counter_vec(
                "orca_relay_admission_rejections_total",
                "refused upgrades and admissions",
                &["reason"],
            ),
            assignments: counter_vec(
                "orca_relay_assignments_total",
                "assign/resolve outcomes",
                &["route", "outcome"],
            ),
            assignment_seconds: histogram_vec(
                "orca_relay_assignment_seconds",
                "assign/resolve latency",
                &["route"],
            ),
            cell_live: gauge_vec(
                "orca_relay_cell_live",
                "cell liveness seen by this director",
                &["cell"],
            ),
            heartbeats: counter_vec(
                "orca_relay_heartbeats_total",
                "heartbeat outcomes",
                &["outcome"],
            ),
            db_seconds: histogram_vec("orca_relay_db_seconds", "store operation latency", &["op"]),
            push_queue_depth: reg(
                &r,
                IntGauge::new("orca_push_queue_depth", "pending push deliveries").unwrap(),
            ),
            push_counters,
            owned: Mutex::new(HashMap::new()),
            registry: {
                r.register(Box::new(process::ProcessCollector::new()))
                    .expect("register process collector");
                r
            },
        }
    }

    /// Registers a labelled counter owned by the module that moves it (a module registers its own
    /// series; the core table of operations.md §2 is above). Call once per process.
    /// Registering the same name again returns the first registration's series.
    pub fn register_counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let mut owned = crate::sync::lock(&self.owned);
        owned
            .entry(name.to_owned())
            .or_insert_with(|| {
                reg(
                    &self.registry,
                    IntCounterVec::new(Opts::new(name, help), labels).expect("counter opts"),
                )
            })
            .clone()
    }

    /// Registers a collector (e.g. one sampled at scrape time) owned by another module.
    pub fn register_collector(&self, c: Box<dyn prometheus::core::Collector>) {
        self.registry.register(c).expect("register collector");
    }

    /// Adds 1 to the push counter `name` (one of [`PUSH_COUNTERS`]).
    pub fn push_inc(&self, name: &str) {
        if let Some(i) = PUSH_COUNTERS.iter().position(|n| *n == name) {
            self.push_counters[i].inc();
        } else {
            debug_assert!(false, "unknown push counter {name}");
        }
    }

    /// Current value of every push counter, in [`PUSH_COUNTERS`] order.
    pub fn push_values(&self) -> Vec<(&'static str, u64)> {
        PUSH_COUNTERS
            .iter()
            .zip(&self.push_counters)
            .map(|(n, c)| (*n, c.get()))
            .collect()
    }

    /// Times a store operation under `op`.
    pub fn db_timer(&self, op: &str) -> prometheus::HistogramTimer {
        self.db_seconds.with_label_values(&[op]).start_timer()
    }

    /// [`Metrics::render`] on the blocking pool: gathering reads `/proc/self` (process series).
    pub async fn render_blocking(self: &Arc<Self>) -> String {
        let m = self.clone();
        // The runtime's handle goes along so the process collector can read its task count.
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let _rt = rt.enter();
            m.render()
        })
        .await
        .unwrap_or_default()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encode metrics");
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_required_series() {
        let m = super::Metrics::new();
        m.push_inc("delivery_sent");
        m.connections.with_label_values(&["control"]).set(1);
        let text = m.render();
        assert!(text.contains("orca_push_delivery_sent_total 1"));
        assert!(text.contains("orca_relay_connections{leg=\"control\"} 1"));
        assert!(text.contains("orca_push_queue_depth"));
    }
}
