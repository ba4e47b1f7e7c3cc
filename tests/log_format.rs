//! Issue 11: every line a run writes to stderr follows docs/reference/http.md, including lines from
//! dependencies (warp, hyper, tungstenite, tokio-postgres, deadpool, rustls…), even with
//! `RUST_LOG=trace`, and dependencies never log below `info` (their debug output carries statement
//! parameters and headers). A real `orca-relay serve` process on SQLite and, when configured,
//! Postgres: assign, a control WebSocket, a rejected request, SIGTERM.

mod support;
use support::cluster;
use support::logfmt;

use std::time::{Duration, Instant};

use cluster::{free_port, Proc, ADMIN, CLUSTER, SIGNING};
use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::store::testing::{backends, temp_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stderr_line_follows_the_log_format() {
    for t in backends().await {
        let started = Instant::now();
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let data = temp_dir("orca-relay-logfmt");
        let mut proc = Proc::new(
            t.kind().as_str(),
            vec![
                "--role".into(),
                "all".into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--data-dir".into(),
                data.display().to_string(),
            ],
            vec![
                ("RUST_LOG".into(), "trace".into()),
                ("ORCA_RELAY_DATABASE_URL".into(), t.url.clone()),
                ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY".into(), SIGNING.into()),
                ("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()),
                ("ORCA_RELAY_ADMIN_TOKEN".into(), ADMIN.into()),
            ],
        );
        // `Proc` reads RUST_LOG=info by default; the env list above overrides it.
        tokio::task::block_in_place(|| proc.start());
        let http = reqwest::Client::new();
        for path in ["/health", "/ready", "/metrics", "/nope"] {
            http.get(format!("{url}{path}")).send().await.unwrap();
        }
        // A rejected body.
        http.post(format!("{url}/v1/assign"))
            .body("[1]")
            .send()
            .await
            .unwrap();
        let host = HostIdentity::generate("logfmt");
        let token = host.token(SIGNING, &url);
        let (cell_url, epoch) = testkit::assign(&url, &token, &host.relay_host_id)
            .await
            .expect("assign");
        let hello = Hello {
            epoch,
            ..Hello::default()
        };
        let control = testkit::connect_control(&cell_url, &host, &token, &url, &hello)
            .await
            .expect("control");
        drop(control);
        tokio::time::sleep(Duration::from_millis(200)).await;
        tokio::task::block_in_place(|| proc.terminate());
        let lines = proc.log.lock().unwrap().clone();
        logfmt::assert_lines(&lines);
        let deps: Vec<&String> = lines
            .iter()
            .filter(|l| {
                logfmt::target(l)
                    .is_some_and(|t| t != "orca_relay" && !t.starts_with("orca_relay::"))
            })
            .collect();
        for l in &deps {
            assert!(
                l.contains(" INFO ") || l.contains(" WARN ") || l.contains(" ERROR "),
                "a dependency logged below info: {l}"
            );
        }
        eprintln!(
            "{}: {} lines ({} from dependencies) all in format, {:?}",
            t.kind().as_str(),
            lines.len(),
            deps.len(),
            started.elapsed()
        );
    }
}
