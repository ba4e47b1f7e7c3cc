//! Every required series of docs/metrics.md moves where its event happens (issue 10, acceptance).
//!
//! One real single-node server (role `all` with push, SQLite) is driven through refused upgrades,
//! an assign, a host proof, two pairings with splices (one ended by the phone, one by an oversize
//! frame), a drain that closes the control, the in-process heartbeat and a push challenge,
//! session and send. `/metrics` is parsed line by line before and after and each series is checked
//! for the exact increase; `promtool check metrics` runs on the text when promtool is installed
//! (required under `CI=true`).

mod support;
use support::push as push_support;

use std::collections::HashMap;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use orca_relay::cell::testkit::{self, recv_close, Hello, HostIdentity};
use orca_relay::store::testing::TestDb;
use push_support::{Server, ADMIN};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

const SIGNING: &str = "0123456789abcdef0123456789abcdef";
const SELF_HOSTED: &str = "self-hosted-key-self-hosted-key-0001";
const CLUSTER: &str = "cluster-key-cluster-key-cluster-key-0001";
const SEC: Duration = Duration::from_secs(1);

/// One scrape: series (`name` + sorted label pairs) → value.
#[derive(Debug, Clone)]
struct Scrape {
    text: String,
    series: HashMap<(String, Vec<(String, String)>), f64>,
}

fn parse(text: &str) -> Scrape {
    let mut series = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (head, value) = line.rsplit_once(' ').expect("series line");
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut pairs: Vec<(String, String)> = body
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once("=\"").expect("label pair");
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                pairs.sort();
                (n.to_string(), pairs)
            }
            None => (head.to_string(), Vec::new()),
        };
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().expect("value"),
        };
        series.insert((name, labels), v);
    }
    Scrape {
        text: text.to_string(),
        series,
    }
}

impl Scrape {
    /// The value of `name` with exactly `labels` (0 when absent).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut l: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.sort();
        self.series
            .get(&(name.to_string(), l))
            .copied()
            .unwrap_or(0.0)
    }
    fn has(&self, name: &str) -> bool {
        self.series.keys().any(|(n, _)| n == name)
    }
    /// Every family named by a `# TYPE` line.
    fn families(&self) -> Vec<String> {
        self.text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect()
    }
    /// Whether the family `name` has a sample (histograms and summaries through their `_count`).
    fn has_family_sample(&self, name: &str) -> bool {
        self.has(name) || self.has(&format!("{name}_count"))
    }
}

/// Labelled families whose label values are not a fixed set: the cells the operator registered.
/// Their series appear as the director learns of the cells.
const OPEN_LABEL_FAMILIES: &[&str] = &["orca_relay_cell_live"];

async fn scrape(base: &str) -> Scrape {
    let r = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    parse(&r.text().await.unwrap())
}

/// Sends a raw upgrade and returns the status code.
async fn raw_upgrade(addr: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(SEC * 5, s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let line = String::from_utf8_lossy(&buf[..n]).to_string();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `promtool check metrics` on the text: Ok(false) when promtool is missing (and CI is not true).
fn promtool(text: &str) -> bool {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(_) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "promtool is required under CI=true (.ci/run installs the Debian package prometheus)"
            );
            println!("note: promtool not installed; `promtool check metrics` skipped");
            return false;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_required_series_moves() {
    let db = TestDb::sqlite().await;
    let s = Server::all_with(
        &db.url,
        &[
            ("--assignment-signing-key", SIGNING),
            ("--self-hosted-key", SELF_HOSTED),
            ("--cluster-key", CLUSTER),
        ],
    )
    .await;
    let addr = s.running().addr;
    let cfg = &s.running().ctx.config;
    let (public_url, cell_url) = (cfg.public_url.clone(), cfg.cell_url.clone());
    let before = scrape(&s.base).await;
    // A fresh process has a sample for every family: alerts read 0, never "no data".
    let families = before.families();
    assert!(families.len() >= 30, "{families:?}");
    for f in &families {
        assert!(
            before.has_family_sample(f),
            "family {f} has no sample at start-up"
        );
    }

    // Refused upgrades: a query string (400) and a malformed host id (429).
    assert_eq!(raw_upgrade(addr, "/v1/connect/abc?x=1").await, 400);
    assert_eq!(raw_upgrade(addr, "/v1/connect/short").await, 429);

    // An assign and a control handshake (host proof ok).
    let host = HostIdentity::generate("metrics-user");
    let token = host.token(SIGNING, &public_url);
    let (_, epoch) = testkit::assign(&s.base, &token, &host.relay_host_id)
        .await
        .unwrap();
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let mut control = testkit::connect_control(&cell_url, &host, &token, &public_url, &hello)
        .await
        .expect("control");

    // Pairing 1: frames both ways, counted while the splice lives; then the phone leaves (4408).
    let invite = control.create_invite("r1", "d1").await.unwrap();
    let mut p = testkit::pair_phone(&cell_url, &mut control, &host.relay_host_id, &invite, &[])
        .await
        .unwrap();
    for _ in 0..5 {
        p.phone.send(Message::text("12345678")).await.unwrap();
        p.data.next().await.unwrap().unwrap();
    }
    for _ in 0..3 {
        p.data.send(Message::binary(vec![7u8; 100])).await.unwrap();
        p.phone.next().await.unwrap().unwrap();
    }
    let live = loop {
        let m = scrape(&s.base).await;
        let up = m.get(
            "orca_relay_splice_frames_total",
            &[("direction", "to_host")],
        ) - before.get(
            "orca_relay_splice_frames_total",
            &[("direction", "to_host")],
        );
        let down = m.get(
            "orca_relay_splice_frames_total",
            &[("direction", "to_phone")],
        ) - before.get(
            "orca_relay_splice_frames_total",
            &[("direction", "to_phone")],
        );
        if up == 5.0 && down == 3.0 {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(live.get("orca_relay_splices_active", &[]), 1.0);
    assert_eq!(live.get("orca_relay_connections", &[("leg", "phone")]), 1.0);
    assert_eq!(live.get("orca_relay_connections", &[("leg", "data")]), 1.0);
    assert_eq!(
        live.get("orca_relay_connections", &[("leg", "control")]),
        1.0
    );
    p.phone.close(None).await.unwrap();
    let (code, _) = recv_close(&mut p.data, SEC * 5).await;
    assert_eq!(code, 4408);

    // Pairing 2: the phone sends a message over its leg maximum: phone 1009, data 4408.
    let invite = control.create_invite("r2", "d2").await.unwrap();
    let mut p = testkit::pair_phone(&cell_url, &mut control, &host.relay_host_id, &invite, &[])
        .await
        .unwrap();
    let big = vec![0u8; orca_relay::contract::limits::PHONE_MAX_MESSAGE + 1];
    let _ = p.phone.send(Message::binary(big)).await;
    let (code, _) = recv_close(&mut p.data, SEC * 10).await;
    assert_eq!(code, 4408);

    // Drain with no grace: the control is closed 4503.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/admin/drain", s.base))
        .bearer_auth(ADMIN)
        .json(&json!({"v":1,"graceMs":0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let code = loop {
        match control.recv(SEC * 10).await {
            Ok(_) => continue,
            Err((code, _)) => break code,
        }
    };
    assert_eq!(code, 4503);

    // Push: challenge, session, a send to an unknown registration (`error`).
    let ph = push_support::Host::new();
    let session = ph.session(&s).await;
    let statuses = s
        .send(
            &session,
            &["reg-unknown-0000000000000000"],
            push_support::alert("n1", 1),
        )
        .await;
    assert_eq!(statuses, vec!["error"]);

    // Closes are counted when the relay's close frame goes out; wait for every connection to go.
    let after = loop {
        let m = scrape(&s.base).await;
        let open: f64 = ["control", "data", "phone"]
            .iter()
            .map(|l| m.get("orca_relay_connections", &[("leg", l)]))
            .sum();
        if open == 0.0 && m.get("orca_relay_splices_active", &[]) == 0.0 {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let d =
        |name: &str, labels: &[(&str, &str)]| after.get(name, labels) - before.get(name, labels);

    // Every labelled series the run moved already existed, at zero, at start-up: the label sets
    // of `orca_relay::metrics::labels` are complete for what happened here.
    for (name, labels) in after.series.keys() {
        if labels.is_empty() || OPEN_LABEL_FAMILIES.contains(&name.as_str()) {
            continue;
        }
        assert!(
            before.series.contains_key(&(name.clone(), labels.clone())),
            "{name}{labels:?} appeared after start-up"
        );
    }

    for name in [
        "orca_relay_connections",
        "orca_relay_splices_active",
        "orca_relay_splice_frames_total",
        "orca_relay_splice_bytes_total",
        "orca_relay_ws_closes_total",
        "orca_relay_host_proofs_total",
        "orca_relay_admission_rejections_total",
        "orca_relay_assignments_total",
        "orca_relay_assignment_seconds_count",
        "orca_relay_cell_live",
        "orca_relay_heartbeats_total",
        "orca_relay_heartbeats_sent_total",
        "orca_relay_db_seconds_count",
        "orca_push_queue_depth",
        "orca_push_challenge_issued_total",
        "orca_push_delivery_sent_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds_total",
        "process_start_time_seconds",
    ] {
        assert!(after.has(name), "{name} missing from /metrics");
    }
    assert_eq!(
        d(
            "orca_relay_admission_rejections_total",
            &[("reason", "query_string")]
        ),
        1.0
    );
    assert_eq!(
        d(
            "orca_relay_admission_rejections_total",
            &[("reason", "invalid_id")]
        ),
        1.0
    );
    assert_eq!(
        d(
            "orca_relay_assignments_total",
            &[("route", "assign"), ("outcome", "granted")]
        ),
        1.0
    );
    assert_eq!(
        d(
            "orca_relay_assignment_seconds_count",
            &[("route", "assign")]
        ),
        1.0
    );
    assert_eq!(d("orca_relay_host_proofs_total", &[("outcome", "ok")]), 1.0);
    // Frames: 5 up + 3 down on the first splice; the oversize message is not relayed.
    assert_eq!(
        d(
            "orca_relay_splice_frames_total",
            &[("direction", "to_host")]
        ),
        5.0
    );
    assert_eq!(
        d(
            "orca_relay_splice_frames_total",
            &[("direction", "to_phone")]
        ),
        3.0
    );
    assert_eq!(
        d("orca_relay_splice_bytes_total", &[("direction", "to_host")]),
        40.0
    );
    assert_eq!(
        d(
            "orca_relay_splice_bytes_total",
            &[("direction", "to_phone")]
        ),
        300.0
    );
    // Closes of each kind: peer dropped on both splices' data legs and on the first phone, 1009
    // on the oversize phone, 4503 on the drained control.
    let closes = |leg, code| {
        d(
            "orca_relay_ws_closes_total",
            &[("leg", leg), ("code", code)],
        )
    };
    assert_eq!(closes("data", "4408"), 2.0);
    assert_eq!(closes("phone", "4408"), 1.0);
    assert_eq!(closes("phone", "1009"), 1.0);
    assert_eq!(closes("control", "4503"), 1.0);
    assert_eq!(after.get("orca_relay_splices_active", &[]), 0.0);
    // Heartbeats: the in-process beat is one send and one receipt, in separate series.
    let sent = after.get("orca_relay_heartbeats_sent_total", &[("outcome", "ok")]);
    let received = after.get("orca_relay_heartbeats_total", &[("outcome", "ok")]);
    assert!(sent >= 1.0, "no heartbeat sent");
    assert!(
        (sent - received).abs() <= 1.0,
        "one heartbeat counted once per side: sent {sent}, received {received}"
    );
    let cell_id = s.running().ctx.config.cell_id.clone();
    assert_eq!(
        after.get("orca_relay_cell_live", &[("cell", cell_id.as_str())]),
        1.0
    );
    // Store operations: assignment transactions and push session writes were timed.
    assert!(d("orca_relay_db_seconds_count", &[("op", "assignment")]) >= 1.0);
    assert!(d("orca_relay_db_seconds_count", &[("op", "push_session")]) >= 1.0);
    // Push counters (docs/metrics.md).
    assert_eq!(d("orca_push_challenge_issued_total", &[]), 1.0);
    assert_eq!(d("orca_push_session_issued_total", &[]), 1.0);
    assert_eq!(d("orca_push_send_error_total", &[]), 1.0);
    // Process series.
    assert!(after.get("process_resident_memory_bytes", &[]) > 1e6);
    assert!(after.get("process_open_fds", &[]) >= 3.0);
    let start = after.get("process_start_time_seconds", &[]);
    let now = orca_relay::clock::now_ms() as f64 / 1000.0;
    assert!(start > now - 3600.0 && start <= now + 1.0, "start {start}");

    promtool(&after.text);
    s.stop().await;
}
