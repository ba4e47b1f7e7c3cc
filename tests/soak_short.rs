//! The short churn soak run in CI (issue 11): about a minute and a half of the churn in
//! `support/soak.rs` (40 churners, each cycling through two desktop identities that leave and
//! come back, their phones pairing anew or resuming, beside 40 idle hosts; 20 s of load after an
//! 8 s warm-up and its settle) on a real `orca-relay` process over SQLite. Once the orphan grace
//! of the last desktops has run out and the process is quiet, its RSS, open fds, live runtime
//! tasks and the cell's reserved request units must be back within ±10 % of the baseline (fds
//! and tasks come back exactly). Prints the series. The 10-minute version is `examples/soak.rs`
//! (docs/benchmarks.md).

mod support;
use support::soak;

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
            settle: Duration::from_secs(60),
            frames_per_pair: 4,
            desks_per_churner: 2,
            pairings_per_visit: 4,
            tolerance: 0.10,
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
