//! Issue 11: a black-holed database (the proxy keeps every socket open and forwards nothing, so no
//! RST, no server-side timeout and no TCP keepalive failure ever arrives). A real `orca-relay serve`
//! process (all roles, so the push worker claims throughout) on Postgres through
//! `support/pgproxy.rs`:
//! - requests waiting on the store answer a retryable 503 with `Retry-After` within the client-side
//!   call deadline instead of hanging;
//! - after the proxy resumes, `/ready` is plain ready again and new requests succeed within the
//!   stated bound (readiness cache + one call deadline), with no restart;
//! - SIGTERM during a black hole exits 0 within the 10 s deadline, with no
//!   `orca_push_shutdown_failed`;
//! - every stderr line of the run follows docs/reference/http.md.
//!
//! Postgres only: a SQLite file cannot be partitioned.

mod support;
use support::cluster;
use support::logfmt;
use support::pgproxy;

use std::time::{Duration, Instant};

use cluster::{free_port, Proc, ADMIN, CLUSTER, SIGNING};
use orca_relay::cell::testkit::HostIdentity;
use orca_relay::store::testing::{temp_dir, TestDb};
use pgproxy::PgProxy;
use serde_json::json;

/// The store's client-side call deadline (`store::postgres::CALL_DEADLINE`).
const CALL_DEADLINE: Duration = Duration::from_secs(6);
/// `/ready` caches its verdict this long (docs/reference/http.md).
const READY_CACHE: Duration = Duration::from_secs(10);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);

struct Node {
    proc: Proc,
    url: String,
    http: reqwest::Client,
}

impl Node {
    fn start(db_url: &str) -> Node {
        let port = free_port();
        let data = temp_dir("orca-relay-blackhole");
        let mut proc = Proc::new(
            "node",
            vec![
                "--role".into(),
                "all".into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--data-dir".into(),
                data.display().to_string(),
            ],
            vec![
                ("ORCA_RELAY_DATABASE_URL".into(), db_url.into()),
                ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY".into(), SIGNING.into()),
                ("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()),
                ("ORCA_RELAY_ADMIN_TOKEN".into(), ADMIN.into()),
                ("ORCA_RELAY_DATABASE_POOL_MAX".into(), "4".into()),
            ],
        );
        tokio::task::block_in_place(|| proc.start());
        Node {
            proc,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(40))
                .build()
                .unwrap(),
        }
    }

    /// `POST /v1/assign` for a new host: (status, Retry-After, body).
    async fn assign(&self, user: &str) -> (u16, Option<String>, serde_json::Value) {
        let host = HostIdentity::generate(user);
        let token = host.token(SIGNING, &self.url);
        let r = self
            .http
            .post(format!("{}/v1/assign", self.url))
            .bearer_auth(token)
            .json(&json!({"v":1,"relayHostId":host.relay_host_id}))
            .send()
            .await
            .expect("assign answered");
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        (status, retry, r.json().await.unwrap_or(json!(null)))
    }

    /// `GET /ready`: (status, body).
    async fn ready(&self) -> (u16, serde_json::Value) {
        let r = self
            .http
            .get(format!("{}/ready", self.url))
            .send()
            .await
            .expect("ready answered");
        (r.status().as_u16(), r.json().await.unwrap_or(json!(null)))
    }

    fn log(&self) -> Vec<String> {
        self.proc.log.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_database_answers_503_recovers_and_shuts_down_cleanly() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!(
            "skipping: {} unset",
            orca_relay::store::testing::POSTGRES_ENV
        );
        return;
    };
    let proxy = PgProxy::start().await;
    let node = Node::start(&proxy.url(&t.url));
    let (st, _, body) = node.assign("before").await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(node.ready().await.0, 200);

    // 1. Black hole: requests already waiting and new ones answer a retryable 503.
    proxy.black_hole();
    let started = Instant::now();
    let answers = futures_util::future::join_all((0..6).map(|i| {
        let node = &node;
        async move {
            let r = node.assign(&format!("hole-{i}")).await;
            (r, started.elapsed())
        }
    }))
    .await;
    for ((st, retry, body), took) in &answers {
        assert_eq!(*st, 503, "{body}");
        assert_eq!(
            body,
            &json!({"error":"assignments_temporarily_unavailable"})
        );
        let secs: u64 = retry.as_deref().expect("Retry-After").parse().unwrap();
        assert!(secs >= 1, "{secs}");
        assert!(
            *took <= CALL_DEADLINE + SLACK,
            "answered after {took:?}, deadline {CALL_DEADLINE:?}"
        );
    }
    let slowest = answers.iter().map(|(_, d)| *d).max().unwrap();
    eprintln!("black hole: 6 assigns answered 503 + Retry-After, slowest after {slowest:?}");

    // 2. The database comes back: no restart, ready again within cache + one call deadline.
    // `/ready` notices once its cached verdict lapses (degraded: the grace window, else 503).
    let bound = READY_CACHE + CALL_DEADLINE + SLACK;
    loop {
        let (st, body) = node.ready().await;
        if st == 503 || body["degraded"] == json!(true) {
            eprintln!(
                "black hole: /ready {st} {body} after {:?}",
                started.elapsed()
            );
            break;
        }
        assert!(started.elapsed() < bound, "/ready still {st} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    proxy.resume();
    let resumed = Instant::now();
    loop {
        let (st, body) = node.ready().await;
        if st == 200 && body.get("degraded").is_none() {
            break;
        }
        assert!(
            resumed.elapsed() < bound,
            "not ready {bound:?} after resume: {st} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready_after = resumed.elapsed();
    let (st, _, body) = node.assign("after").await;
    assert_eq!(st, 200, "{body}");
    eprintln!(
        "resume: /ready plain ready after {ready_after:?}, assign ok after {:?} (bound {bound:?})",
        resumed.elapsed()
    );

    // 3. SIGTERM in a black hole: the push worker's claims and every other store call give up by
    // their deadline, so the process exits 0 before the 10 s hard deadline.
    proxy.black_hole();
    // Let the worker's 1 s tick start claims that now hang.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut node = node;
    let stopping = Instant::now();
    tokio::task::block_in_place(|| node.proc.terminate());
    let stop_took = stopping.elapsed();
    eprintln!("SIGTERM in a black hole: exit 0 after {stop_took:?}");
    let log = node.log();
    assert!(
        !log.iter().any(|l| l.contains("orca_push_shutdown_failed")),
        "{log:#?}"
    );
    logfmt::assert_lines(&log);
    proxy.resume();
}
