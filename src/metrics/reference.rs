//! `docs/metrics.md`, generated from what a fresh process exports (tests/docs_metrics.rs keeps the
//! page and the registry in sync): every family with its type, help and label values.

use std::collections::{BTreeMap, BTreeSet};

/// One family as read from the text exposition.
#[derive(Default)]
struct Family {
    kind: String,
    help: String,
    labels: BTreeMap<String, BTreeSet<String>>,
}

/// Label values that depend on this process's configuration, listed as such instead of by value.
const CONFIGURED_LABELS: &[&str] = &["cell", "region"];

/// Reads a Prometheus text exposition (one `/metrics` answer) into families, by name.
fn families(exposition: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_string()).or_default().help = help.replace("\\n", " ");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_string()).or_default().kind = kind.to_string();
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let head = line.rsplit_once(' ').map_or(line, |(h, _)| h);
            let (series, body) = head.split_once('{').unwrap_or((head, ""));
            let family = family_of(&out, series);
            let entry = out.entry(family).or_default();
            for pair in body
                .trim_end_matches('}')
                .split("\",")
                .filter(|p| !p.is_empty())
            {
                if let Some((k, v)) = pair.split_once("=\"") {
                    if k != "le" && k != "quantile" {
                        entry
                            .labels
                            .entry(k.to_string())
                            .or_default()
                            .insert(v.trim_end_matches('"').to_string());
                    }
                }
            }
        }
    }
    out
}

/// The family a sample belongs to: its own name, or a histogram's without `_bucket`/`_sum`/`_count`.
fn family_of(known: &BTreeMap<String, Family>, series: &str) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = series.strip_suffix(suffix) {
            if known.get(base).is_some_and(|f| f.kind == "histogram") {
                return base.to_string();
            }
        }
    }
    series.to_string()
}

/// The Markdown page: a fixed introduction, then one section per family.
pub fn page(exposition: &str) -> String {
    let mut md = String::from(HEADER);
    for (name, f) in families(exposition) {
        md.push_str(&format!("\n### `{name}`\n\n{} — {}\n", f.kind, f.help));
        if !f.labels.is_empty() {
            md.push('\n');
        }
        for (label, values) in &f.labels {
            let shown = if CONFIGURED_LABELS.contains(&label.as_str()) {
                "one per configured value".to_string()
            } else {
                values
                    .iter()
                    .map(|v| format!("`{v}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            md.push_str(&format!("- `{label}`: {shown}\n"));
        }
    }
    md
}

const HEADER: &str = "# Metrics

This page is generated from the series a fresh single-node process (`--role all`) exports; a test
fails when the code and the page disagree (`ORCA_RELAY_BLESS=1 cargo test --test docs_metrics`
rewrites it).

## Scraping

`GET /metrics` on the main listener (or on the separate metrics listener when
`ORCA_RELAY_METRICS_LISTEN` is set) answers the Prometheus text format. It needs a bearer: the
read-only `ORCA_RELAY_METRICS_TOKEN` (also accepted by the dashboard's reads, never by an admin
action) or the admin token.

```yaml
scrape_configs:
  - job_name: orca-relay
    scheme: https
    authorization:
      credentials_file: /etc/prometheus/orca-relay-metrics-token
    static_configs:
      - targets: [\"relay.example.org\"]
```

Every labelled family exposes each of its known label values at zero from start-up, so an alert
on a family reads 0 rather than \"no data\". Store and request latencies use sub-millisecond
buckets (from 50 µs).

## Alerts and dashboard

[`deploy/prometheus/alerts.yml`](../deploy/prometheus/alerts.yml) holds the alert rules:

| alert | what it means | what to do |
| --- | --- | --- |
| `OrcaRelayCellDown` | the director has had no fresh heartbeat from a cell for 2 minutes | check the cell process, its `/ready`, and its route to the director |
| `OrcaRelayNoReadyCellInRegion` | no cell in a region is live and open to new hosts | start or undrain a cell in that region |
| `OrcaRelayAdmissionRefusalsRising` | a cell refuses WebSocket upgrades at its capacity, store-pressure or pre-auth gates | add cells or raise limits; for store pressure, check the database |
| `OrcaRelayAssignmentRefusalsRising` | the director refuses to place hosts | capacity exhausted: add cells; `unavailable`: check the database and the director |
| `OrcaRelayConnectionsRefused` | a process answers connections over its HTTP connection cap with `503 server_busy` (or closes them) for 5 minutes | a reconnect storm settles by itself; if it lasts, add cells or directors |
| `OrcaRelayTlsHandshakesRefused` | a TLS listener closes connections that waited 5 s for one of its 64 handshake slots, for 5 minutes | a reconnect storm settles by itself; if it lasts, add cells |
| `OrcaRelayDatabaseErrors` | transactions fail after their retries | check the database's health, connections and disk |
| `OrcaRelayDatabaseSlow` | the store's p99 latency is over 250 ms | check database load, locks and the network to it |
| `OrcaRelayPushQueueGrowing` | push deliveries do not keep up | check APNs/FCM reachability and `orca_push_delivery_error_total` |
| `OrcaRelayCertificateExpiring` | the served certificate expires within 14 days | fix ACME reachability, or replace the certificate files (reloaded without a restart) |

[`deploy/grafana/orca-relay.json`](../deploy/grafana/orca-relay.json) is a Grafana dashboard over
these series.

Series that only exist in some configurations: `orca_relay_tls_certificate_expiry_timestamp_seconds`
(a listener with TLS) and the `cell`/`region` labels (one per registered cell or configured region).

## Series
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_fold_their_suffixes_and_drop_le() {
        let text = "# HELP a_seconds A.\n# TYPE a_seconds histogram\n\
                    a_seconds_bucket{op=\"x\",le=\"0.1\"} 0\na_seconds_sum{op=\"x\"} 0\n\
                    a_seconds_count{op=\"x\"} 0\n# HELP b_total B.\n# TYPE b_total counter\nb_total 3\n";
        let f = families(text);
        assert_eq!(f.len(), 2);
        assert_eq!(f["a_seconds"].kind, "histogram");
        assert_eq!(f["a_seconds"].labels.keys().collect::<Vec<_>>(), vec!["op"]);
        assert!(page(text).contains("### `b_total`\n\ncounter — B.\n"));
    }
}
