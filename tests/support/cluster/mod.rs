//! Shared pieces of the cluster tests: `orca-relay` processes on loopback ports against one
//! Postgres database, hosts speaking the real protocol (assign, control, reconnect on close), the
//! operator routes, and the invariant sampler (no host with live controls on two cells).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::store::Db;

pub const SIGNING: &str = "cluster-signing-key-cluster-signing-key-0001";
pub const CLUSTER: &str = "cluster-node-key-cluster-node-key-0001";
pub const ADMIN: &str = "cluster-admin-token-cluster-admin-token-01";

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Proc {
    pub name: String,
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    pub child: Option<Child>,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn new(name: &str, args: Vec<String>, envs: Vec<(String, String)>) -> Proc {
        Proc {
            name: name.into(),
            args,
            envs,
            child: None,
            log: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Starts the process and waits for its listener.
    pub fn start(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orca-relay"));
        cmd.arg("serve")
            .args(&self.args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn orca-relay");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = self.log.clone();
        let name = self.name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on http://") {
                    let _ = tx.send(());
                }
                if std::env::var("CLUSTER_TEST_VERBOSE").is_ok() {
                    eprintln!("[{name}] {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "{} did not start: {:?}",
                    self.name,
                    self.log.lock().unwrap()
                )
            });
        self.child = Some(child);
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) {
        let mut child = self.child.take().expect("running");
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(11),
                "{} ignored SIGTERM",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            status.code(),
            Some(0),
            "{} exit: {:?}",
            self.name,
            self.log
                .lock()
                .unwrap()
                .iter()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What one host saw.
#[derive(Default)]
pub struct HostLog {
    /// (cell url, epoch) of every activated control, in order.
    pub grants: Vec<(String, i64)>,
    pub connected: bool,
    /// When the current run of refusals started.
    pub refused_since: Option<Instant>,
    pub longest_refusal: Duration,
}

pub async fn admin_post(director: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
    let r = reqwest::Client::new()
        .post(format!("{director}{path}"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(status.is_success(), "{path}: {status} {v}");
    v
}

pub async fn cell_status(director: &str) -> Vec<serde_json::Value> {
    admin_post(
        director,
        "/v1/admin/cell-status",
        serde_json::json!({"v": 1}),
    )
    .await["cells"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One host: assign (alternating directors), connect, keep the control alive, reconnect on close.
pub async fn run_host(
    host: HostIdentity,
    directors: Vec<String>,
    public_url: String,
    log: Arc<Mutex<HostLog>>,
    stop: Arc<AtomicBool>,
) {
    let mut turn = 0usize;
    let mut hinted = false;
    while !stop.load(Ordering::SeqCst) {
        let director = &directors[turn % directors.len()];
        turn += 1;
        let token = host.token(SIGNING, &public_url);
        let mut body = serde_json::json!({"v": 1, "relayHostId": host.relay_host_id});
        if hinted {
            body["reconnect"] = serde_json::json!(true);
        }
        let resp = reqwest::Client::new()
            .post(format!("{director}/v1/assign"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await;
        let grant = match resp {
            Ok(r) if r.status().is_success() => {
                let v: serde_json::Value = r.json().await.unwrap();
                Some((
                    v["cellUrl"].as_str().unwrap().to_string(),
                    v["assignmentEpoch"].as_i64().unwrap(),
                ))
            }
            _ => None,
        };
        let Some((cell_url, epoch)) = grant else {
            mark_refused(&log);
            tokio::time::sleep(Duration::from_millis(150)).await;
            continue;
        };
        hinted = true;
        let hello = Hello {
            epoch,
            ..Hello::default()
        };
        let mut control =
            match testkit::connect_control(&cell_url, &host, &token, &public_url, &hello).await {
                Ok(c) => c,
                Err(_) => {
                    mark_refused(&log);
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    continue;
                }
            };
        {
            let mut l = log.lock().unwrap();
            if let Some(since) = l.refused_since.take() {
                let d = since.elapsed();
                if d > l.longest_refusal {
                    l.longest_refusal = d;
                }
            }
            l.grants.push((cell_url.clone(), epoch));
            l.connected = true;
        }
        // Hold the control until the cell closes it (drain, move) or the test stops.
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            match control.recv(Duration::from_millis(200)).await {
                Ok(_) => {}
                Err((0, reason)) if reason == "timeout" => {}
                Err(_) => break,
            }
        }
        let mut l = log.lock().unwrap();
        l.connected = false;
        l.refused_since = Some(Instant::now());
    }
}

pub fn mark_refused(log: &Mutex<HostLog>) {
    log.lock()
        .unwrap()
        .refused_since
        .get_or_insert_with(Instant::now);
}

/// Hosts whose live control leases sit on more than one cell right now.
pub async fn double_served(db: &Db) -> Vec<String> {
    let now = orca_relay::clock::now_ms();
    let hosts: Vec<String> = db
        .query(
            "SELECT relay_host_id, COUNT(DISTINCT cell_id) FROM relay_assignment_activity_leases \
             WHERE activity_kind = 'control' AND activity_id NOT LIKE 'control-pending:%' AND expires_at > $1 \
             GROUP BY user_id, relay_host_id HAVING COUNT(DISTINCT cell_id) > 1",
            orca_relay::params![now],
        )
        .await
        .map(|rows| rows.iter().map(|r| r.str(0)).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for h in hosts {
        let rows = db
            .query(
                "SELECT activity_id, cell_incarnation, expires_at - $2, renewed_at - $2 FROM relay_assignment_activity_leases \
                 WHERE relay_host_id = $1 AND activity_kind = 'control'",
                orca_relay::params![h.clone(), now],
            )
            .await
            .unwrap_or_default();
        let a = db
            .query(
                "SELECT cell_id, assignment_epoch FROM relay_assignments WHERE relay_host_id = $1",
                orca_relay::params![h.clone()],
            )
            .await
            .unwrap_or_default();
        out.push(format!(
            "{h}: home {:?} leases {:?}",
            a.first().map(|r| (r.str(0), r.i64(1))),
            rows.iter()
                .map(|r| (r.str(0), r.opt_str(1), r.i64(2), r.opt_i64(3)))
                .collect::<Vec<_>>()
        ));
    }
    out
}

/// One director and `cells` cells (`c1`, `c2`, …, region us-central1, capacity 1000) as separate
/// processes against the database at `db_url`, all live when this returns.
pub struct Cluster {
    pub director: String,
    pub dproc: Proc,
    pub cell_urls: Vec<String>,
    pub cprocs: Vec<Proc>,
}

pub async fn start_cluster(db_url: &str, cells: usize) -> Cluster {
    let dport = free_port();
    let cports: Vec<u16> = (0..cells).map(|_| free_port()).collect();
    let director = format!("http://127.0.0.1:{dport}");
    let cell_urls: Vec<String> = cports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let cells_json = serde_json::to_string(
        &cell_urls
            .iter()
            .enumerate()
            .map(|(i, u)| {
                serde_json::json!({"id": format!("c{}", i + 1), "url": u,
                    "region": "us-central1", "capacityRequests": 1000})
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let common = vec![
        ("ORCA_RELAY_DATABASE_URL".to_string(), db_url.to_string()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY".into(), SIGNING.into()),
        ("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()),
        ("ORCA_RELAY_ADMIN_TOKEN".into(), ADMIN.into()),
        ("ORCA_RELAY_DATABASE_POOL_MAX".into(), "4".into()),
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
    denvs.push(("ORCA_RELAY_CELLS".into(), cells_json));
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
    let mut cprocs: Vec<Proc> = cports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Proc::new(
                &format!("c{}", i + 1),
                vec![
                    "--role".into(),
                    "cell".into(),
                    "--cell-id".into(),
                    format!("c{}", i + 1),
                    "--listen".into(),
                    format!("127.0.0.1:{p}"),
                    "--director-url".into(),
                    director.clone(),
                ],
                common.clone(),
            )
        })
        .collect();
    for c in cprocs.iter_mut() {
        c.start();
    }
    wait_until("all cells live", Duration::from_secs(30), || async {
        let cs = cell_status(&director).await;
        cs.len() == cells && cs.iter().all(|c| c["live"] == true)
    })
    .await;
    Cluster {
        director,
        dproc,
        cell_urls,
        cprocs,
    }
}
