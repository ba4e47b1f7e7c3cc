//! `deploy/prometheus/alerts.yml`: `promtool check rules` passes (when promtool is installed;
//! required under `CI=true`), and every series an alert names is exported by a live `/metrics`
//! of a fresh server (role `all`), read with the metrics token.

mod support;
use support::push as push_support;

use orca_relay::store::testing::TestDb;
use push_support::Server;

const METRICS: &str = "metrics-read-only-token-metrics-read-0001";
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yml");

/// Every `orca_*` / `process_*` series name in the rules' `expr:` lines, without the histogram
/// suffixes (`_bucket`, `_sum`, `_count`).
fn series_in_rules(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in text.lines() {
        let Some(expr) = line.trim().strip_prefix("expr:") else {
            continue;
        };
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("orca_") || word.starts_with("process_") {
                names.push(word.to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

fn exported(metrics: &str, name: &str) -> bool {
    metrics.lines().filter(|l| !l.starts_with('#')).any(|l| {
        let n = l.split(['{', ' ']).next().unwrap_or_default();
        n == name
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_name_only_exported_series() {
    let text = std::fs::read_to_string(RULES).unwrap();
    let names = series_in_rules(&text);
    assert!(names.len() >= 6, "{names:?}");

    let db = TestDb::sqlite().await;
    let s = Server::all_with(
        &db.url,
        &[
            (
                "--assignment-signing-key",
                "0123456789abcdef0123456789abcdef",
            ),
            ("--self-hosted-key", "self-hosted-key-self-hosted-key-0001"),
            ("--cluster-key", "cluster-key-cluster-key-cluster-key-0001"),
            ("--metrics-token", METRICS),
        ],
    )
    .await;
    let metrics = s.metrics_text(METRICS).await;
    for n in &names {
        // Exported only with TLS on the listener; its presence is tested in `tls::server`.
        if n == "orca_relay_tls_certificate_expiry_timestamp_seconds"
            || n == "orca_relay_tls_handshake_failures_total"
        {
            continue;
        }
        assert!(
            exported(&metrics, n),
            "alerts.yml names {n}, which /metrics does not export"
        );
    }
    s.stop().await;
}

/// Runs promtool with `args`; skipped with a note where it is not installed (required under CI).
fn promtool(args: &[&str]) {
    let out = match std::process::Command::new("promtool").args(args).output() {
        Ok(o) => o,
        Err(_) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "promtool is required under CI=true (.ci/run installs the Debian package prometheus)"
            );
            println!(
                "note: promtool not installed; `promtool {}` skipped",
                args.join(" ")
            );
            return;
        }
    };
    assert!(
        out.status.success(),
        "promtool {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_check_rules() {
    promtool(&["check", "rules", RULES]);
}

/// `promtool test rules`: every alert fires on the fault it names and stays quiet on healthy series
/// (deploy/prometheus/alerts_test.yml).
#[test]
fn promtool_test_rules() {
    promtool(&[
        "test",
        "rules",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/prometheus/alerts_test.yml"
        ),
    ]);
}
