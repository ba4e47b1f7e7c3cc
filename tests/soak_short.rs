//! The short churn soak run in CI (issue 11): about a minute of the churn in `support/soak.rs`
//! (40 churners pairing and leaving beside 40 idle hosts, 20 s of load after an 8 s warm-up and its settle) on a
//! real `orca-relay` process over SQLite, then the process's RSS, open fds and live runtime tasks
//! must come back within ±20 % of the baseline. Prints the series. The 10-minute version is
//! `examples/soak.rs` (README, Benchmarks) and holds the issue's ±10 %: over 20 s of load the
//! allocator's retained arenas are a larger share of a ~33 MB baseline (seen +3..+8 % RSS, with fds
//! and tasks back exactly), so the CI bound leaves room for that noise without hiding a leak,
//! which grows with pairings.

#[path = "support/soak.rs"]
mod soak;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_returns_to_baseline() {
    let dir = orca_relay::store::testing::temp_dir("soak-short");
    let server = soak::spawn_server(std::path::Path::new(env!("CARGO_BIN_EXE_orca-relay")), &dir);
    let report = soak::run(
        &server.url,
        soak::Plan {
            churners: 40,
            idle_hosts: 40,
            warmup: Duration::from_secs(8),
            load: Duration::from_secs(20),
            sample_every: Duration::from_secs(5),
            settle: Duration::from_secs(40),
            frames_per_pair: 4,
            desks_per_churner: 2,
            pairings_per_visit: 4,
            tolerance: 0.20,
        },
    )
    .await;
    report.print();
    assert!(
        report.pairings >= 100,
        "the churn ran: {} pairings",
        report.pairings
    );
    assert!(
        report.resumes * 4 >= report.pairings && report.rebinds > 0,
        "phones resumed ({} of {}) and desktops rebound ({})",
        report.resumes,
        report.pairings,
        report.rebinds
    );
    assert!(
        report.returns >= report.identities as u64,
        "identities came back: {} returning visits by {} identities",
        report.returns,
        report.identities
    );
    assert!(
        report.failures * 20 <= report.pairings,
        "{} failures for {} pairings",
        report.failures,
        report.pairings
    );
    if let Err(e) = report.returned() {
        panic!("did not return to the baseline: {e}");
    }
}
