//! P-39 (docs/reference/http.md / docs/reference/websocket.md): the real binary in role `cell` beats to a remote director over
//! HTTP with a cluster token: first beat at start-up, then every 15 s; exactly the fields,
//! the seven telemetry fields only when capped; a restart gets a new incarnation.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use orca_relay::store::testing::{temp_dir, TestDb};
use serde_json::Value;
use tokio::sync::mpsc;

const CLUSTER_KEY: &str = "cluster-key-0123456789abcdef0123456789abcdef";
const SIGNING_KEY: &str = "assignment-key-0123456789abcdef0123456789abcdef";
const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef0123456789abcdef";

/// One recorded `POST /v1/admin/cell-heartbeat`.
#[derive(Debug)]
struct Beat {
    at: Instant,
    authorization: Option<String>,
    body: Value,
}

/// A fake director on loopback that records every heartbeat and answers `200 {"v":1,"ok":true}`.
async fn fake_director() -> (SocketAddr, mpsc::Receiver<Beat>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let at = Instant::now();
                        let ok = req.method() == hyper::Method::POST
                            && req.uri().path() == "/v1/admin/cell-heartbeat";
                        let authorization = req
                            .headers()
                            .get(hyper::header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let bytes = req.into_body().collect().await?.to_bytes();
                        let status = if ok {
                            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                            let _ = tx
                                .send(Beat {
                                    at,
                                    authorization,
                                    body,
                                })
                                .await;
                            200
                        } else {
                            404
                        };
                        let resp = hyper::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(br#"{"v":1,"ok":true}"#)))
                            .unwrap();
                        Ok::<_, hyper::Error>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, rx)
}

/// The real binary, killed on drop.
struct Proc {
    child: Child,
    log: support::node::common::proc::Log,
}

impl Drop for Proc {
    fn drop(&mut self) {
        support::node::common::proc::kill(&mut self.child);
    }
}

fn spawn_cell(cwd: &Path, db_url: &str, director: SocketAddr, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = [
        "--role",
        "cell",
        "--listen",
        "127.0.0.1:0",
        "--cell-id",
        "c9",
        "--director-url",
        &format!("http://{director}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let envs: Vec<(String, String)> = [
        ("ORCA_RELAY_DATABASE_URL", db_url),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING_KEY),
        ("ORCA_RELAY_CLUSTER_KEY", CLUSTER_KEY),
        ("ORCA_RELAY_ADMIN_TOKEN", ADMIN_TOKEN),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let spec = support::node::common::proc::Spec {
        cwd: Some(cwd),
        ..support::node::common::proc::Spec::new("cell", &args, &envs)
    };
    let log = support::node::common::proc::Log::default();
    let spawned = support::node::common::proc::spawn_serve(&spec, &log, Duration::from_secs(30))
        .unwrap_or_else(|()| {
            panic!(
                "cell did not start: {:?}",
                support::node::common::proc::lines(&log)
            )
        });
    Proc {
        child: spawned.child,
        log,
    }
}

async fn next_beat(rx: &mut mpsc::Receiver<Beat>, within: Duration, p: &Proc) -> Beat {
    match tokio::time::timeout(within, rx.recv()).await {
        Ok(Some(b)) => b,
        _ => panic!(
            "no heartbeat within {within:?}: {:?}",
            p.log.lock().unwrap()
        ),
    }
}

const BASE_FIELDS: [&str; 8] = [
    "v",
    "cellId",
    "cellUrl",
    "region",
    "cellIncarnation",
    "startedAt",
    "ready",
    "observedRequests",
];
const TELEMETRY_FIELDS: [&str; 7] = [
    "totalConnections",
    "inFlightConnections",
    "reservedConnectionUnits",
    "enforcedConnectionUnits",
    "connectionHardCap",
    "connectionUnobservedBound",
    "connectionInclusionWatermark",
];

fn keys(body: &Value) -> Vec<String> {
    let mut k: Vec<String> = body.as_object().expect("object").keys().cloned().collect();
    k.sort();
    k
}

fn sorted(fields: &[&str]) -> Vec<String> {
    let mut k: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
    k.sort();
    k
}

/// The bearer is a cluster token for `c9` signed with the shared cluster key.
fn check_auth(b: &Beat) {
    let auth = b.authorization.as_deref().expect("authorization header");
    let token = auth.strip_prefix("Bearer ").expect("bearer scheme");
    let sub = orca_relay::crypto::jwt::verify_cluster_token(
        CLUSTER_KEY.as_bytes(),
        token,
        orca_relay::clock::now_ms(),
    )
    .expect("cluster token verifies");
    assert_eq!(sub, "c9");
}

fn check_base(b: &Beat) {
    let body = &b.body;
    assert_eq!(body["v"], 1);
    assert_eq!(body["cellId"], "c9");
    assert!(body["cellUrl"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(body["region"].as_str().is_some_and(|r| !r.is_empty()));
    assert!(body["cellIncarnation"]
        .as_str()
        .is_some_and(|r| !r.is_empty()));
    assert!(body["startedAt"].as_i64().is_some_and(|t| t > 0));
    assert!(body["ready"].is_boolean());
    assert!(body["observedRequests"].as_i64().is_some_and(|n| n >= 0));
}

fn interval_ok(first: &Beat, second: &Beat) {
    let gap = second.at.duration_since(first.at);
    assert!(
        gap >= Duration::from_secs(14) && gap <= Duration::from_secs(16),
        "second beat {gap:?} after the first, want 15 s ± 1 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cell_heartbeats_to_remote_director_uncapped_and_capped() {
    let db_a = TestDb::sqlite().await;
    let db_b = TestDb::sqlite().await;
    let cwd_a = temp_dir("orca-relay-hb-a");
    let cwd_b = temp_dir("orca-relay-hb-b");
    let (dir_a, mut rx_a) = fake_director().await;
    let (dir_b, mut rx_b) = fake_director().await;

    // Uncapped process first; the capped one is its "restart" (started after its first beat).
    let spawned_a = Instant::now();
    let a = spawn_cell(&cwd_a, &db_a.url, dir_a, &[]);
    let a1 = next_beat(&mut rx_a, Duration::from_secs(10), &a).await;
    assert!(
        a1.at.duration_since(spawned_a) < Duration::from_secs(5),
        "first beat must come right after start-up"
    );

    let spawned_b = Instant::now();
    let b = spawn_cell(
        &cwd_b,
        &db_b.url,
        dir_b,
        &[
            "--cell-connection-hard-cap",
            "600",
            "--cell-connection-unobserved-bound",
            "0",
        ],
    );
    let b1 = next_beat(&mut rx_b, Duration::from_secs(10), &b).await;
    assert!(b1.at.duration_since(spawned_b) < Duration::from_secs(5));

    let a2 = next_beat(&mut rx_a, Duration::from_secs(17), &a).await;
    let b2 = next_beat(&mut rx_b, Duration::from_secs(17), &b).await;

    // Uncapped: exactly the fields, interval, stable identity.
    for beat in [&a1, &a2] {
        check_auth(beat);
        check_base(beat);
        assert_eq!(keys(&beat.body), sorted(&BASE_FIELDS), "{}", beat.body);
        for f in TELEMETRY_FIELDS {
            assert!(beat.body.get(f).is_none(), "uncapped beat carries {f}");
        }
    }
    interval_ok(&a1, &a2);
    assert_eq!(a1.body["cellIncarnation"], a2.body["cellIncarnation"]);
    assert_eq!(a1.body["startedAt"], a2.body["startedAt"]);

    // Capped: the seven telemetry fields, consistent, watermark strictly rising.
    let mut all: Vec<&str> = BASE_FIELDS.to_vec();
    all.extend(TELEMETRY_FIELDS);
    for beat in [&b1, &b2] {
        check_auth(beat);
        check_base(beat);
        let body = &beat.body;
        assert_eq!(keys(body), sorted(&all), "{body}");
        let n = |f: &str| body[f].as_i64().unwrap_or_else(|| panic!("{f} integer"));
        assert_eq!(
            n("enforcedConnectionUnits"),
            n("totalConnections") + n("inFlightConnections") + n("reservedConnectionUnits")
        );
        assert_eq!(n("connectionHardCap"), 600);
        assert_eq!(n("connectionUnobservedBound"), 0);
    }
    interval_ok(&b1, &b2);
    assert!(
        b2.body["connectionInclusionWatermark"].as_i64().unwrap()
            > b1.body["connectionInclusionWatermark"].as_i64().unwrap()
    );
    assert_eq!(b1.body["cellIncarnation"], b2.body["cellIncarnation"]);
    assert_eq!(b1.body["startedAt"], b2.body["startedAt"]);

    // The restarted process has a new incarnation and a later start.
    assert_ne!(a1.body["cellIncarnation"], b1.body["cellIncarnation"]);
    assert!(b1.body["startedAt"].as_i64().unwrap() > a1.body["startedAt"].as_i64().unwrap());

    drop(a);
    drop(b);
}

// ---------------------------------------------------------------------------------------------------
// P-50 (second half): the store goes away during host-hello → close 4429.

mod support;

/// A loopback TCP proxy to the test Postgres with a switch that drops every proxied connection
/// and refuses new ones (a store outage as the cell sees it).
struct Proxy {
    addr: SocketAddr,
    cut: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start(upstream: &'static str) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (c, cs) = (cut.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    drop(down);
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                cs.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy { addr, cut, conns }
    }

    /// Refuses new connections and closes every current one (both sides).
    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

#[tokio::test]
async fn store_outage_during_hello_closes_4429() {
    let Some(pg) = TestDb::postgres().await else {
        eprintln!(
            "skipping: {} unset",
            orca_relay::store::testing::POSTGRES_ENV
        );
        return;
    };
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let url = pg
        .url
        .replacen("127.0.0.1:5432", &proxy.addr.to_string(), 1);
    assert_ne!(url, pg.url, "test Postgres must be on 127.0.0.1:5432");
    let s = support::node::start_on(&url, &[]).await;
    let host = support::node::Host::assigned(&s, "outage").await;

    proxy.cut();
    let started = Instant::now();
    let got = host.connect_with(&s, &host.hello()).await.err();
    assert_eq!(
        got,
        Some((4429, "relay temporarily unavailable".to_string())),
        "after {:?}",
        started.elapsed()
    );
    s.running.shutdown().await;
}
