//! docs/metrics.md is generated from what a fresh single-node process exports: a new series, a
//! changed help text or a new label value fails here until the page is regenerated with
//! `ORCA_RELAY_BLESS=1 cargo test --test docs_metrics`.

mod support;
use support::push as push_support;

use orca_relay::store::testing::TestDb;
use push_support::{Server, ADMIN};

/// `/metrics` of a fresh single-node process (all roles, SQLite).
async fn fresh_metrics() -> String {
    let db = TestDb::sqlite().await;
    let s = Server::all_with(&db.url, &[]).await;
    s.metrics_text(ADMIN).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_matches_the_registry() {
    let text = fresh_metrics().await;
    let page = orca_relay::metrics::reference::page(&text);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md");
    if std::env::var_os("ORCA_RELAY_BLESS").is_some() {
        std::fs::write(&path, &page).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == page,
        "docs/metrics.md is out of date: run ORCA_RELAY_BLESS=1 cargo test --test docs_metrics"
    );
}

/// Series that only exist in a configuration this test server does not have (a TLS listener).
const CONFIG_ONLY: &[&str] = &["orca_relay_tls_certificate_expiry_timestamp_seconds"];

/// Every query of deploy/grafana/orca-relay.json names only series a live process exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_dashboard_names_only_exported_series() {
    let text = fresh_metrics().await;
    let exported: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/orca-relay.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "a dashboard of {} panels", panels.len());
    let mut checked = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let names = series_names(expr);
            assert!(!names.is_empty(), "{expr}: names no series");
            for name in names {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(b)))
                    .unwrap_or(&name);
                assert!(
                    exported.contains(family) || CONFIG_ONLY.contains(&family),
                    "panel {:?} queries {name}, which /metrics does not export",
                    panel["title"]
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 15, "only {checked} series checked");
}

/// The metric names in a PromQL expression: identifiers of our two prefixes, outside label
/// matchers and strings.
fn series_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut in_str) = (0, false);
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if in_str {
            in_str = c != '"';
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if depth == 0 && (word.starts_with("orca_") || word.starts_with("process_")) {
            out.push(std::mem::take(&mut word));
        }
        word.clear();
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            '"' => in_str = true,
            _ => {}
        }
    }
    out
}
