//! Two-region cluster of the rehome-worker tests: a director (`us-central1`), cell A in
//! `us-central1` and cell C in `asia-east2`, each a real `orca-relay serve` process on one
//! Postgres database; optionally a fault-injecting TCP proxy in front of A (A's registered and
//! advertised `cellUrl` is then the proxy's); and a real desktop host advertising
//! `idle-regional-rehome-v1` with a conclusive preference for asia.
//!
//! Needs `mod cluster` (support/cluster/mod.rs) declared next to it by the test file.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::cluster::{
    admin_post, cell_status, free_port, wait_until, Proc, ADMIN, CLUSTER, SIGNING,
};

pub const US: &str = "us-central1";
pub const ASIA: &str = "asia-east2";
const DISPATCH_PATH: &[u8] = b"POST /v1/admin/host-idle-rehome ";

/// What the proxy does with a `host-idle-rehome` request (everything else is forwarded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    Forward = 0,
    /// Answer `500 {"error":"injected"}` without forwarding.
    Fail500 = 1,
    /// Read the request and never answer (the director's 10 s timeout fires).
    Blackhole = 2,
}

/// A TCP proxy to `backend` that inspects the first request of every connection.
pub struct FaultProxy {
    pub url: String,
    mode: Arc<AtomicU8>,
    /// Dispatches seen, per mode at the time.
    pub dispatches: Arc<Mutex<Vec<Fault>>>,
}

impl FaultProxy {
    pub fn set(&self, f: Fault) {
        self.mode.store(f as u8, Ordering::SeqCst);
    }

    pub fn dispatches(&self, f: Fault) -> usize {
        self.dispatches
            .lock()
            .unwrap()
            .iter()
            .filter(|x| **x == f)
            .count()
    }
}

fn fault_of(v: u8) -> Fault {
    match v {
        1 => Fault::Fail500,
        2 => Fault::Blackhole,
        _ => Fault::Forward,
    }
}

/// Starts the proxy on `port`, forwarding to 127.0.0.1:`backend`.
pub async fn start_proxy(port: u16, backend: u16) -> FaultProxy {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let mode = Arc::new(AtomicU8::new(Fault::Forward as u8));
    let dispatches = Arc::new(Mutex::new(Vec::new()));
    let (m, seen) = (mode.clone(), dispatches.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let (m, seen) = (m.clone(), seen.clone());
            tokio::spawn(async move {
                // The request head (bounded), then the verdict.
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65_536 {
                    match client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if head.starts_with(DISPATCH_PATH) {
                    let f = fault_of(m.load(Ordering::SeqCst));
                    seen.lock().unwrap().push(f);
                    match f {
                        Fault::Fail500 => {
                            let body = r#"{"error":"injected"}"#;
                            let resp = format!(
                                "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n\
                                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = client.write_all(resp.as_bytes()).await;
                            let _ = client.shutdown().await;
                            return;
                        }
                        Fault::Blackhole => {
                            while let Ok(n) = client.read(&mut buf).await {
                                if n == 0 {
                                    return;
                                }
                            }
                            return;
                        }
                        Fault::Forward => {}
                    }
                }
                let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", backend)).await
                else {
                    return;
                };
                if server.write_all(&head).await.is_err() {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    FaultProxy {
        url: format!("http://127.0.0.1:{port}"),
        mode,
        dispatches,
    }
}

/// The running cluster.
pub struct Rig {
    pub director: String,
    pub dproc: Proc,
    pub a: Proc,
    pub c: Proc,
    /// A's and C's `cellUrl` (A's is the proxy's when there is one).
    pub a_url: String,
    pub c_url: String,
    pub proxy: Option<FaultProxy>,
}

impl Rig {
    /// Every log line of the three processes.
    pub fn all_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in [&self.dproc, &self.a, &self.c] {
            out.extend(p.log.lock().unwrap().iter().cloned());
        }
        out
    }

    /// The director's structured lines of `event`, parsed.
    pub fn events(&self, event: &str) -> Vec<Value> {
        let tag = format!("\"event\":\"{event}\"");
        self.dproc
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(&tag))
            .filter_map(|l| l.find('{').and_then(|i| serde_json::from_str(&l[i..]).ok()))
            .collect()
    }

    pub async fn control(&self, body: Value) -> Value {
        admin_post(&self.director, "/v1/admin/regional-rehome-control", body).await
    }

    /// `apply` on the current generation.
    pub async fn apply(&self, enabled: bool, cohort: i64) -> Value {
        let g = self.control(json!({"v":1,"action":"inspect"})).await["control"]["generation"]
            .as_i64()
            .unwrap();
        self.control(json!({"v":1,"action":"apply","expectedGeneration":g,"enabled":enabled,
            "ratePerMinute":120,"cohortPercent":cohort,"hostCooldownMs":60000,
            "preferenceMaxAgeMs":86400000,
            "confirmation": if enabled {"ENABLE_REGIONAL_REHOMING"} else {"DISABLE_REGIONAL_REHOMING"}}))
            .await
    }

    pub async fn whereabouts(&self, host: &HostIdentity) -> Value {
        admin_post(
            &self.director,
            "/v1/admin/host-whereabouts",
            json!({"v":1,"relayHostId":host.relay_host_id,"userId":host.user_id}),
        )
        .await["assignments"][0]
            .clone()
    }

    /// Waits until the director has logged `n` dispatch summaries after the first `from`.
    pub async fn summaries_after(&self, from: usize, n: usize, within: Duration) -> Vec<Value> {
        wait_until("dispatch summaries", within, || async {
            self.events("orca_relay_idle_rehome_dispatch_summary").len() >= from + n
        })
        .await;
        self.events("orca_relay_idle_rehome_dispatch_summary")[from..].to_vec()
    }
}

/// Starts the director, A (behind a proxy when `proxied`) and C, and waits until both cells are
/// live and have reported protocol 3 with clean safety.
pub async fn start_rig(db_url: &str, proxied: bool) -> Rig {
    let (dport, aport, cport) = (free_port(), free_port(), free_port());
    let director = format!("http://127.0.0.1:{dport}");
    let proxy = if proxied {
        Some(start_proxy(free_port(), aport).await)
    } else {
        None
    };
    let a_url = proxy
        .as_ref()
        .map(|p| p.url.clone())
        .unwrap_or_else(|| format!("http://127.0.0.1:{aport}"));
    let c_url = format!("http://127.0.0.1:{cport}");
    let cells = json!([
        {"id":"A","url":a_url,"region":US,"capacityRequests":1000},
        {"id":"C","url":c_url,"region":ASIA,"capacityRequests":1000},
    ]);
    let common = vec![
        ("ORCA_RELAY_DATABASE_URL".to_string(), db_url.to_string()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY".into(), SIGNING.into()),
        ("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()),
        ("ORCA_RELAY_ADMIN_TOKEN".into(), ADMIN.into()),
        ("ORCA_RELAY_DATABASE_POOL_MAX".into(), "4".into()),
        ("ORCA_RELAY_REGIONS".into(), format!("{US},{ASIA}")),
        ("ORCA_RELAY_PUBLIC_URL".into(), director.clone()),
        (
            "ORCA_RELAY_PUBLIC_ASSIGNMENT_RETRY_AFTER_SECONDS".into(),
            "1".into(),
        ),
        (
            "ORCA_RELAY_PUBLIC_STICKY_RETRY_AFTER_SECONDS".into(),
            "1".into(),
        ),
    ];
    let mut denvs = common.clone();
    denvs.push(("ORCA_RELAY_CELLS".into(), cells.to_string()));
    denvs.push(("ORCA_RELAY_REGION".into(), US.into()));
    let mut dproc = Proc::new(
        "d1",
        vec![
            "--role".into(),
            "director".into(),
            "--listen".into(),
            format!("127.0.0.1:{dport}"),
        ],
        denvs,
    );
    dproc.start();
    let cell = |id: &str, port: u16, url: &str, region: &str| {
        let mut envs = common.clone();
        envs.retain(|(k, _)| k != "ORCA_RELAY_PUBLIC_URL");
        envs.push(("ORCA_RELAY_REGION".into(), region.into()));
        envs.push(("ORCA_RELAY_CELL_URL".into(), url.into()));
        Proc::new(
            id,
            vec![
                "--role".into(),
                "cell".into(),
                "--cell-id".into(),
                id.into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--director-url".into(),
                director.clone(),
            ],
            envs,
        )
    };
    let mut a = cell("A", aport, &a_url, US);
    let mut c = cell("C", cport, &c_url, ASIA);
    a.start();
    c.start();
    wait_until(
        "A and C live with protocol 3 and clean safety",
        Duration::from_secs(30),
        || async {
            let cs = cell_status(&director).await;
            cs.len() == 2
                && cs.iter().all(|c| {
                    c["live"] == true
                        && c["runtime"]["regionalRehomeProtocol"] == 3
                        && c["runtime"]["safetyClean"] == true
                })
        },
    )
    .await;
    Rig {
        director,
        dproc,
        a,
        c,
        a_url,
        c_url,
        proxy,
    }
}

/// What the host's control socket saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// The close code and reason, once closed.
    pub closed: Option<(u16, String)>,
}

/// A desktop host: placed, connected with `idle-regional-rehome-v1`, measured.
pub struct DesktopHost {
    pub id: HostIdentity,
    pub token: String,
    pub cell_url: String,
    pub epoch: i64,
    pub seen: Arc<Mutex<Seen>>,
    pub task: tokio::task::JoinHandle<()>,
}

/// `/v1/assign` with an optional `regionCorrection`, retried while the per-host lane interval
/// (1 s here) answers 503.
pub async fn assign_with(rig: &Rig, token: &str, id: &str, rc: Option<Value>) -> (u16, Value) {
    let mut body = json!({"v":1,"relayHostId":id});
    if let Some(rc) = rc {
        body["regionCorrection"] = rc;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/assign", rig.director))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let st = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if st != 503 || Instant::now() > deadline {
            return (st, v);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Places `user`'s host (on A: the first configured region), connects its control with the
/// capability, and records a conclusive report preferring asia (125 ms vs 100 ms).
pub async fn desktop_host(rig: &Rig, user: &str) -> DesktopHost {
    let id = HostIdentity::generate(user);
    let token = id.token(SIGNING, &rig.director);
    let (st, g) = assign_with(rig, &token, &id.relay_host_id, None).await;
    assert_eq!(st, 200, "{g}");
    let cell_url = g["cellUrl"].as_str().unwrap().to_string();
    let epoch = g["assignmentEpoch"].as_i64().unwrap();
    assert_eq!(cell_url, rig.a_url, "placed on A");
    let hello = Hello {
        epoch,
        capabilities: vec!["idle-regional-rehome-v1".into()],
        ..Hello::default()
    };
    let mut control = testkit::connect_control(&cell_url, &id, &token, &rig.director, &hello)
        .await
        .expect("control handshake");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            match control.recv(Duration::from_secs(3600)).await {
                Ok(_) => {}
                Err(close) => {
                    s.lock().unwrap().closed = Some(close);
                    return;
                }
            }
        }
    });
    let (st, w) = assign_with(
        rig,
        &token,
        &id.relay_host_id,
        Some(json!({"v":1,"action":"issue-window"})),
    )
    .await;
    assert_eq!(st, 200, "{w}");
    let w = w["regionCorrection"]["window"].clone();
    let (st, r) = assign_with(
        rig,
        &token,
        &id.relay_host_id,
        Some(json!({"v":1,"action":"report","generation":w["generation"],
            "assignmentEpoch":w["assignmentEpoch"],"policyVersion":1,"outcome":"conclusive",
            "measurements":{US:125, ASIA:100}})),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["regionCorrection"]["reportStatus"], "accepted", "{r}");
    DesktopHost {
        id,
        token,
        cell_url,
        epoch,
        seen,
        task,
    }
}
