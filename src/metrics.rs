//! Every Prometheus series of the process, named in one place (docs/metrics.md).
//!
//! Labels are bounded sets (leg, code, reason, outcome, route, cell id, region, store op), never
//! host ids. Every labelled family whose label values form a known finite set (all but `cell`,
//! whose values are the cells the operator registered, and `region`, the configured regions) is
//! exposed at zero from start-up, so an alert on it reads 0 rather than "no data"; the sets are in
//! [`labels`].

pub mod process;
pub mod reference;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// The help text of each of [`PUSH_COUNTERS`], shown by `/metrics` and docs/metrics.md.
fn push_counter_help(name: &str) -> &'static str {
    match name {
        "ip_rate_limited" => "push requests refused by the per-IP rate limit",
        "request_error" => "push requests that failed on a database error",
        "challenge_issued" => "host challenges issued",
        "challenge_rejected" => "host challenge requests refused",
        "session_issued" => "push sessions issued to hosts that proved their key",
        "session_rejected" => "push session requests refused (bad or expired proof)",
        "device_registered" => "phone devices registered or refreshed",
        "device_rejected" => "device registrations refused",
        "device_deleted" => "devices deleted",
        "send_queued" => "send recipients accepted and queued (committed)",
        "send_dead" => "send recipients whose device is dead",
        "send_rate_limited" => "send recipients refused by a quota",
        "send_error" => "send recipients unknown or failed",
        "delivery_sent" => "deliveries accepted by APNs or FCM",
        "delivery_dead" => "deliveries whose token the provider reported unregistered",
        "delivery_error" => "delivery attempts the provider answered with an error",
        "delivery_retry" => "delivery attempts scheduled for a retry",
        "delivery_expired" => "deliveries dropped after their time to live",
        _ => "push gateway counter",
    }
}

/// The push gateway's counters, in the order of docs/metrics.md.
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

/// Histogram buckets (seconds) for work that usually takes well under a millisecond: one store
/// operation, one step of the cell. 50 µs … 5 s.
pub const FAST_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
];

/// Histogram buckets (seconds) for a whole request that may hold a transaction, its retries and a
/// token check: 250 µs … 10 s.
pub const REQUEST_BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
];

/// The known label values of the labelled families. The code that moves a series asserts (in
/// debug builds) that its value is one of these, and `tests/metrics.rs` checks that no series
/// appears after start-up that was not already there at zero.
pub mod labels {
    use crate::contract::close;
    use crate::leg::Leg;

    /// `leg` of `orca_relay_connections` and `orca_relay_ws_closes_total`.
    pub fn legs() -> impl Iterator<Item = &'static str> {
        Leg::ALL.into_iter().map(Leg::name)
    }

    /// `code` of `orca_relay_ws_closes_total`: every close code the relay sends.
    pub const CLOSE_CODES: &[u16] = &[
        close::BAD_OUTER_CREDENTIAL,
        close::HOST_OFFLINE,
        close::PEER_DROPPED,
        close::WRONG_CELL,
        close::LIMIT_EXCEEDED,
        close::DRAINING,
        close::MESSAGE_TOO_BIG,
        close::PROTOCOL_ERROR,
        close::INVALID_PAYLOAD,
    ];

    /// `direction` of `orca_relay_splice_frames_total` and `orca_relay_splice_bytes_total`.
    pub const SPLICE_DIRECTIONS: &[&str] = &["to_host", "to_phone"];

    /// `outcome` of `orca_relay_host_proofs_total`.
    pub const HOST_PROOF_OUTCOMES: &[&str] = &["ok", "timeout", "invalid"];

    /// `reason` of `orca_relay_admission_rejections_total`: the gate that refused. The pre-gates
    /// every leg passes first, then the cell's own gates.
    pub const ADMISSION_REASONS: &[&str] = &[
        "bad_handshake",
        "shutting_down",
        "query_string",
        "unknown_path",
        "invalid_id",
        "capacity",
        "preauth",
        "host_token",
        "store_pressure",
    ];

    /// `route` of `orca_relay_assignments_total` and `orca_relay_assignment_seconds`.
    pub const ASSIGNMENT_ROUTES: &[&str] = &["assign", "resolve"];

    /// `outcome` of `orca_relay_assignments_total`: `granted` or the answer's error code
    /// (`invalid_request` for any other refusal of the request itself).
    pub const ASSIGNMENT_OUTCOMES: &[&str] = &[
        "granted",
        "invalid_request",
        "assignments_temporarily_unavailable",
        "assignment_row_busy",
        "relay_capacity_exhausted",
        "relay_connection_headroom_exhausted",
        "relay_home_cell_unavailable",
    ];

    /// `outcome` of `orca_relay_heartbeats_total` (the director's receipts): `ok`, the refusal
    /// code, or `database_unavailable`.
    pub const HEARTBEAT_OUTCOMES: &[&str] = &[
        "ok",
        "database_unavailable",
        "cell_not_found",
        "cell_origin_mismatch",
        "cell_region_mismatch",
        "stale_cell_incarnation",
        "cell_connection_telemetry_mismatch",
        "cell_connection_limit_not_configured",
        "stale_connection_snapshot",
    ];

    /// `outcome` of `orca_relay_heartbeats_sent_total` (the cell's sends).
    pub const HEARTBEAT_SEND_OUTCOMES: &[&str] = &["ok", "failed"];

    /// `op` of `orca_relay_db_seconds` and `orca_relay_db_errors_total`.
    pub const DB_OPS: &[&str] = crate::store::OPS;

    /// `kind` of `orca_relay_db_errors_total`.
    pub const DB_ERROR_KINDS: &[&str] = crate::store::ERROR_KINDS;

    /// Whether `value` is one of `set` (for the debug assertions at the counting sites).
    pub fn known(set: &[&str], value: &str) -> bool {
        set.contains(&value)
    }
}

/// Creates the series of every combination of `sets` (one set per label, in label order).
fn zero<B: prometheus::core::MetricVecBuilder>(
    vec: &prometheus::core::MetricVec<B>,
    sets: &[Vec<String>],
) {
    let mut combos: Vec<Vec<String>> = vec![Vec::new()];
    for set in sets {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                set.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push(v.clone());
                    c
                })
            })
            .collect();
    }
    for c in combos {
        let refs: Vec<&str> = c.iter().map(String::as_str).collect();
        let _ = vec.with_label_values(&refs);
    }
}

/// The cell's heartbeat sends (registered by the cell's heartbeat loop, created here at zero).
pub const HEARTBEATS_SENT: &str = "orca_relay_heartbeats_sent_total";

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
    pub cells_ready: IntGaugeVec,
    pub heartbeats: IntCounterVec,
    pub db_seconds: HistogramVec,
    pub db_errors: IntCounterVec,
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
    /// Registers every metric (docs/metrics.md is generated from the registry).
    // function-length: allow(a registration table, one entry per metric, each under its name and help)
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
        let histogram_vec = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                    labels,
                )
                .unwrap(),
            )
        };
        let push_counters = PUSH_COUNTERS
            .iter()
            .map(|n| {
                reg(
                    &r,
                    IntCounter::new(format!("orca_push_{n}_total"), push_counter_help(n)).unwrap(),
                )
            })
            .collect();
        let m = Metrics {
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
                REQUEST_BUCKETS,
            ),
            cell_live: gauge_vec(
                "orca_relay_cell_live",
                "cell liveness seen by this director",
                &["cell"],
            ),
            cells_ready: gauge_vec(
                "orca_relay_cells_ready",
                "live cells open to new hosts (admission general), by region, seen by this director",
                &["region"],
            ),
            heartbeats: counter_vec(
                "orca_relay_heartbeats_total",
                "heartbeat outcomes",
                &["outcome"],
            ),
            db_seconds: histogram_vec(
                "orca_relay_db_seconds",
                "store operation latency",
                &["op"],
                FAST_BUCKETS,
            ),
            db_errors: counter_vec(
                "orca_relay_db_errors_total",
                "failed store calls, by operation and kind",
                &["op", "kind"],
            ),
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
        };
        m.zero_known_labels();
        m
    }

    /// Creates every series whose label values are known (see [`labels`]), at zero.
    fn zero_known_labels(&self) {
        let owned = |it: &mut dyn Iterator<Item = &str>| it.map(str::to_owned).collect::<Vec<_>>();
        let set = |s: &[&str]| owned(&mut s.iter().copied());
        let legs = owned(&mut labels::legs());
        let codes: Vec<String> = labels::CLOSE_CODES.iter().map(u16::to_string).collect();
        zero(&self.connections, std::slice::from_ref(&legs));
        zero(&self.ws_closes, &[legs, codes]);
        zero(&self.splice_frames, &[set(labels::SPLICE_DIRECTIONS)]);
        zero(&self.splice_bytes, &[set(labels::SPLICE_DIRECTIONS)]);
        zero(&self.host_proofs, &[set(labels::HOST_PROOF_OUTCOMES)]);
        zero(
            &self.admission_rejections,
            &[set(labels::ADMISSION_REASONS)],
        );
        zero(
            &self.assignments,
            &[
                set(labels::ASSIGNMENT_ROUTES),
                set(labels::ASSIGNMENT_OUTCOMES),
            ],
        );
        zero(&self.assignment_seconds, &[set(labels::ASSIGNMENT_ROUTES)]);
        zero(&self.heartbeats, &[set(labels::HEARTBEAT_OUTCOMES)]);
        zero(&self.db_seconds, &[set(labels::DB_OPS)]);
        zero(
            &self.db_errors,
            &[set(labels::DB_OPS), set(labels::DB_ERROR_KINDS)],
        );
        let sent = self.register_counter_vec(
            HEARTBEATS_SENT,
            "heartbeats this cell sent, by outcome (ok or failed)",
            &["outcome"],
        );
        zero(&sent, &[set(labels::HEARTBEAT_SEND_OUTCOMES)]);
    }

    /// Creates `orca_relay_cells_ready{region}` at zero for each configured region (the director
    /// calls this once; its sweep then keeps the values current).
    pub fn zero_regions(&self, regions: &[String]) {
        zero(&self.cells_ready, &[regions.to_vec()]);
    }

    /// Registers a labelled counter owned by the module that moves it (a module registers its own
    /// series; the core table of docs/metrics.md is above). Call once per process.
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

    #[test]
    fn known_label_values_exist_at_zero() {
        let text = super::Metrics::new().render();
        for line in [
            "orca_relay_connections{leg=\"phone\"} 0",
            "orca_relay_ws_closes_total{code=\"4503\",leg=\"control\"} 0",
            "orca_relay_db_seconds_count{op=\"push_session\"} 0",
            "orca_relay_db_errors_total{kind=\"transient\",op=\"assignment\"} 0",
            "orca_relay_heartbeats_sent_total{outcome=\"failed\"} 0",
            "orca_relay_assignments_total{outcome=\"granted\",route=\"resolve\"} 0",
            "orca_relay_db_seconds_bucket{op=\"ping\",le=\"0.00005\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing");
        }
    }
}
