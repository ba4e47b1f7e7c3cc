//! The churn soak (issue 11): hundreds of pairs connecting, exchanging and leaving beside idle
//! hosts, for 10 minutes by default, against an `orca-relay` process it starts itself (the
//! binary next to this example, on a temporary SQLite file). Each churner cycles through four
//! desktop identities of its own that leave and come back (re-resolving through `/v1/assign`),
//! whose phones pair anew by invite or resume. RSS, open fds and live runtime tasks come from the
//! server's own `/metrics`, the cell's reserved request units from `cell-status`, every 10 s;
//! after the load stops they must return within ±10 % of the baseline. Prints the series; exits
//! 1 if the process did not return.
//!
//! ```text
//! cargo build --release --bin orca-relay --example soak
//! ulimit -n 8192; target/release/examples/soak --minutes 10 --churners 200 --idle-hosts 300
//! ```
//! The per-pairing source (`X-Forwarded-For`) needs the server to trust one proxy hop, which the
//! started server does. `tests/soak_short.rs` runs the same code for about a minute in CI.

#[path = "../tests/support/mod.rs"]
mod support;
use support::soak;

use std::time::Duration;

#[tokio::main]
async fn main() {
    let mut minutes = 10u64;
    let mut churners = 200usize;
    let mut idle_hosts = 300usize;
    let mut sample_s = 10u64;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for w in argv.chunks(2) {
        let v = w.get(1).expect("flag value");
        match w[0].as_str() {
            "--minutes" => minutes = v.parse().expect("--minutes"),
            "--churners" => churners = v.parse().expect("--churners"),
            "--idle-hosts" => idle_hosts = v.parse().expect("--idle-hosts"),
            "--sample-seconds" => sample_s = v.parse().expect("--sample-seconds"),
            other => panic!("unknown flag {other}"),
        }
    }
    let exe = std::env::current_exe().expect("own path");
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("orca-relay"))
        .expect("target dir");
    let dir = tempfile::tempdir().expect("temp dir");
    let server = soak::spawn_server(&bin, dir.path());
    eprintln!(
        "soak: server {} (pid {}), {minutes} min, {churners} churners, {idle_hosts} idle hosts{}",
        server.url,
        server.child.id(),
        std::env::vars()
            .filter(|(k, _)| k.starts_with("MALLOC_"))
            .map(|(k, v)| format!(", {k}={v}"))
            .collect::<String>()
    );
    let report = soak::run(
        &server.url,
        soak::Plan {
            churners,
            idle_hosts,
            warmup: Duration::from_secs(20),
            load: Duration::from_secs(minutes * 60),
            sample_every: Duration::from_secs(sample_s),
            settle: Duration::from_secs(90),
            frames_per_pair: 8,
            desks_per_churner: 4,
            pairings_per_visit: 10,
            tolerance: 0.10,
        },
    )
    .await;
    report.print();
    if let Err(e) = report.returned() {
        eprintln!("did not return to the baseline: {e}");
        std::process::exit(1);
    }
}
