//! Shared pieces of the cluster tests: `orca-relay` processes on loopback ports against one
//! Postgres database, hosts speaking the real protocol (assign, control, reconnect on close), the
//! operator routes, and the invariant sampler (no host with live controls on two cells).
#![allow(dead_code)]

pub use super::common;

use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use common::wait::wait_until;

use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::store::Db;

pub const SIGNING: &str = "cluster-signing-key-cluster-signing-key-0001";
pub const CLUSTER: &str = "cluster-node-key-cluster-node-key-0001";
pub const ADMIN: &str = "cluster-admin-token-cluster-admin-token-01";

pub use common::ports::free_port;

pub struct Proc {
    pub name: String,
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    pub child: Option<Child>,
    pub log: Arc<Mutex<Vec<String>>>,
    /// The thread reading the running child's stderr (joined after its exit).
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    pub fn new(name: &str, args: Vec<String>, envs: Vec<(String, String)>) -> Proc {
        Proc {
            name: name.into(),
            args,
            envs,
            child: None,
            log: Arc::new(Mutex::new(Vec::new())),
            reader: None,
        }
    }

    /// Starts the process and waits for its listener.
    pub fn start(&mut self) {
        let spec = common::proc::Spec {
            verbose_env: "CLUSTER_TEST_VERBOSE",
            ..common::proc::Spec::new(&self.name, &self.args, &self.envs)
        };
        let spawned = common::proc::spawn_serve(&spec, &self.log, Duration::from_secs(30))
            .unwrap_or_else(|()| {
                panic!(
                    "{} did not start: {:?}",
                    self.name,
                    common::proc::lines(&self.log)
                )
            });
        self.child = Some(spawned.child);
        self.reader = Some(spawned.reader);
    }

    /// SIGTERM and wait for a clean exit; then every line the process wrote is in `log`.
    pub fn terminate(&mut self) {
        let mut child = self.child.take().expect("running");
        let status = common::proc::terminate(&mut child, Duration::from_secs(11), &self.name);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        assert_eq!(
            status.code(),
            Some(0),
            "{} exit: {:?}",
            self.name,
            common::proc::lines(&self.log)
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
            common::proc::kill(&mut c);
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

/// `directors` directors (`d1`, …) and `cells` cells (`c1`, `c2`, …, region us-central1, capacity
/// 1000; cell `i` heartbeats to director `i mod directors`) as separate processes against the
/// database at `db_url`, all cells live when this returns.
pub struct Fleet {
    pub directors: Vec<String>,
    pub dprocs: Vec<Proc>,
    pub cell_urls: Vec<String>,
    pub cprocs: Vec<Proc>,
}

pub async fn start_fleet(db_url: &str, directors: usize, cells: usize) -> Fleet {
    start_fleet_with(db_url, directors, cells, &[]).await
}

/// [`start_fleet`] with `extra` settings for every process.
pub async fn start_fleet_with(
    db_url: &str,
    directors: usize,
    cells: usize,
    extra: &[(&str, &str)],
) -> Fleet {
    let dports: Vec<u16> = (0..directors).map(|_| free_port()).collect();
    let cports: Vec<u16> = (0..cells).map(|_| free_port()).collect();
    let director_urls: Vec<String> = dports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
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
    let mut common = vec![
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
    common.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut dprocs: Vec<Proc> = dports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut envs = common.clone();
            envs.push(("ORCA_RELAY_CELLS".into(), cells_json.clone()));
            Proc::new(
                &format!("d{}", i + 1),
                vec![
                    "--role".into(),
                    "director".into(),
                    "--listen".into(),
                    format!("127.0.0.1:{p}"),
                ],
                envs,
            )
        })
        .collect();
    for d in dprocs.iter_mut() {
        d.start();
    }
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
                    director_urls[i % directors].clone(),
                ],
                common.clone(),
            )
        })
        .collect();
    for c in cprocs.iter_mut() {
        c.start();
    }
    wait_until("all cells live", Duration::from_secs(30), || async {
        let cs = cell_status(&director_urls[0]).await;
        cs.len() == cells && cs.iter().all(|c| c["live"] == true)
    })
    .await;
    Fleet {
        directors: director_urls,
        dprocs,
        cell_urls,
        cprocs,
    }
}

/// One director and `cells` cells (see [`start_fleet`]).
pub struct Cluster {
    pub director: String,
    pub dproc: Proc,
    pub cell_urls: Vec<String>,
    pub cprocs: Vec<Proc>,
}

pub async fn start_cluster(db_url: &str, cells: usize) -> Cluster {
    let mut f = start_fleet(db_url, 1, cells).await;
    Cluster {
        director: f.directors.remove(0),
        dproc: f.dprocs.remove(0),
        cell_urls: f.cell_urls,
        cprocs: f.cprocs,
    }
}

/// The invariant sampler: reads [`double_served`] from the database every 50 ms until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, Vec<String>)>,
}

impl Sampler {
    pub fn start(db: &Db) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (db, stop) = (db.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut samples, mut violations) = (0u64, Vec::new());
                while !stop.load(Ordering::SeqCst) {
                    violations.extend(double_served(&db).await);
                    samples += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (samples, violations)
            })
        };
        Sampler { stop, task }
    }

    /// Stops sampling: (samples taken, every violation seen).
    pub async fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("sampler")
    }
}
