//! The cluster under a rolling restart (issue: director, acceptance): 2 directors and 3 cells as
//! separate `orca-relay` processes on loopback ports against one Postgres database; hosts connected
//! with the real protocol; each cell rolled in turn (isolate with the roll stamp, SIGTERM, restart as a
//! new incarnation, restore `general`).
//!
//! Asserts: every host is re-granted and reconnected after every roll; no host ever holds live control
//! leases on two cells at once (sampled from the database throughout); each host's epochs never go
//! down and strictly increase on every move. Prints the longest time any host was refused.
//!
//! Postgres only (it is the clustered shape); skipped without ORCA_RELAY_TEST_POSTGRES_URL.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::store::testing::TestDb;
use orca_relay::store::Db;

const SIGNING: &str = "cluster-signing-key-cluster-signing-key-0001";
const CLUSTER: &str = "cluster-node-key-cluster-node-key-0001";
const ADMIN: &str = "cluster-admin-token-cluster-admin-token-01";
const HOSTS: usize = 6;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Proc {
    name: String,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn new(name: &str, args: Vec<String>, envs: Vec<(String, String)>) -> Proc {
        Proc {
            name: name.into(),
            args,
            envs,
            child: None,
            log: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Starts the process and waits for its listener.
    fn start(&mut self) {
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
    fn terminate(&mut self) {
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
struct HostLog {
    /// (cell url, epoch) of every activated control, in order.
    grants: Vec<(String, i64)>,
    connected: bool,
    /// When the current run of refusals started.
    refused_since: Option<Instant>,
    longest_refusal: Duration,
}

async fn admin_post(director: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
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

async fn cell_status(director: &str) -> Vec<serde_json::Value> {
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

async fn wait_until<F, Fut>(what: &str, within: Duration, mut f: F)
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
async fn run_host(
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

fn mark_refused(log: &Mutex<HostLog>) {
    log.lock()
        .unwrap()
        .refused_since
        .get_or_insert_with(Instant::now);
}

/// Hosts whose live control leases sit on more than one cell right now.
async fn double_served(db: &Db) -> Vec<String> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_of_every_cell_keeps_one_server_per_host() {
    let Some(t) = TestDb::postgres().await else {
        return;
    };
    let dports = [free_port(), free_port()];
    let cports = [free_port(), free_port(), free_port()];
    let directors: Vec<String> = dports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let cells_json = serde_json::to_string(
        &cports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                serde_json::json!({"id": format!("c{}", i + 1), "url": format!("http://127.0.0.1:{p}"),
                    "region": "us-central1", "capacityRequests": 1000})
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let common = vec![
        ("ORCA_RELAY_DATABASE_URL".to_string(), t.url.clone()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY".into(), SIGNING.into()),
        ("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()),
        ("ORCA_RELAY_ADMIN_TOKEN".into(), ADMIN.into()),
        (
            "ORCA_RELAY_PUBLIC_ASSIGNMENT_RETRY_AFTER_SECONDS".into(),
            "1".into(),
        ),
        (
            "ORCA_RELAY_PUBLIC_STICKY_RETRY_AFTER_SECONDS".into(),
            "1".into(),
        ),
    ];
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
                    directors[i % 2].clone(),
                ],
                common.clone(),
            )
        })
        .collect();
    for c in cprocs.iter_mut() {
        c.start();
    }
    wait_until("all cells live", Duration::from_secs(30), || async {
        let cells = cell_status(&directors[0]).await;
        cells.len() == 3 && cells.iter().all(|c| c["live"] == true)
    })
    .await;

    // Hosts connect with the real protocol.
    let stop = Arc::new(AtomicBool::new(false));
    let logs: Vec<Arc<Mutex<HostLog>>> = (0..HOSTS)
        .map(|_| Arc::new(Mutex::new(HostLog::default())))
        .collect();
    let mut tasks = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        let host = HostIdentity::generate(&format!("user-{i}"));
        tasks.push(tokio::spawn(run_host(
            host,
            directors.clone(),
            directors[0].clone(),
            log.clone(),
            stop.clone(),
        )));
    }
    let all_connected = || {
        let logs = logs.clone();
        async move { logs.iter().all(|l| l.lock().unwrap().connected) }
    };
    wait_until(
        "all hosts connected",
        Duration::from_secs(30),
        all_connected,
    )
    .await;

    // Invariant sampler: no host with live controls on two cells, ever.
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let sampler = {
        let db = t.db.clone();
        let stop = sampler_stop.clone();
        let violations = violations.clone();
        tokio::spawn(async move {
            let mut samples = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let bad = double_served(&db).await;
                violations.lock().unwrap().extend(bad);
                samples += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            samples
        })
    };

    // Roll every cell in turn.
    let mut rolled_hosts = 0;
    for (i, cell) in cprocs.iter_mut().enumerate() {
        let id = format!("c{}", i + 1);
        let before = cell_status(&directors[0]).await;
        let old_incarnation = before.iter().find(|c| c["cellId"] == id.as_str()).unwrap()
            ["runtime"]["cellIncarnation"]
            .clone();
        // Hosts served by this cell right now, and how many grants each has seen so far.
        let url = format!("http://127.0.0.1:{}", cports[i]);
        let on_cell: Vec<(usize, usize)> = logs
            .iter()
            .enumerate()
            .filter_map(|(h, l)| {
                let l = l.lock().unwrap();
                (l.grants.last().map(|g| &g.0) == Some(&url)).then_some((h, l.grants.len()))
            })
            .collect();
        admin_post(
            &directors[i % 2],
            "/v1/admin/cell-state",
            serde_json::json!({"v": 1, "cellId": id, "state": "migration-only", "rollIsolated": true}),
        )
        .await;
        cell.terminate();
        cell.start();
        wait_until(
            &format!("{id} heard as a new incarnation"),
            Duration::from_secs(30),
            || {
                let d = directors[0].clone();
                let id = id.clone();
                let old = old_incarnation.clone();
                async move {
                    cell_status(&d).await.iter().any(|c| {
                        c["cellId"] == id.as_str()
                            && c["live"] == true
                            && c["runtime"]["cellIncarnation"] != old
                    })
                }
            },
        )
        .await;
        admin_post(
            &directors[(i + 1) % 2],
            "/v1/admin/cell-state",
            serde_json::json!({"v": 1, "cellId": id, "state": "general"}),
        )
        .await;
        // Every host the roll disconnected got a new grant and is connected again.
        wait_until(
            &format!("hosts re-granted after rolling {id}"),
            Duration::from_secs(40),
            || {
                let logs = logs.clone();
                let on_cell = on_cell.clone();
                async move {
                    on_cell.iter().all(|(h, n)| {
                        let l = logs[*h].lock().unwrap();
                        l.grants.len() > *n && l.connected
                    }) && logs.iter().all(|l| l.lock().unwrap().connected)
                }
            },
        )
        .await;
        rolled_hosts += on_cell.len();
    }

    sampler_stop.store(true, Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }

    let violations = violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "hosts with controls on two cells: {violations:?}"
    );
    let mut longest = Duration::ZERO;
    let mut moves = 0;
    for (i, log) in logs.iter().enumerate() {
        let l = log.lock().unwrap();
        assert!(!l.grants.is_empty(), "host {i} was never granted");
        for w in l.grants.windows(2) {
            let ((c0, e0), (c1, e1)) = (&w[0], &w[1]);
            assert!(e1 >= e0, "host {i}: epoch went down {e0} -> {e1}");
            if c0 != c1 {
                moves += 1;
                assert!(
                    e1 > e0,
                    "host {i}: moved {c0} -> {c1} without an epoch bump"
                );
            }
        }
        longest = longest.max(l.longest_refusal);
    }
    assert!(
        rolled_hosts >= HOSTS,
        "every host was on a rolled cell at least once"
    );
    assert!(moves >= 1, "the roll moved hosts between cells");
    let grants: HashMap<usize, usize> = logs
        .iter()
        .enumerate()
        .map(|(i, l)| (i, l.lock().unwrap().grants.len()))
        .collect();
    println!(
        "cluster roll: {HOSTS} hosts, 3 cells rolled, {moves} moves, {samples} invariant samples, grants per host {grants:?}, longest refusal {} ms",
        longest.as_millis()
    );
    for d in dprocs.iter_mut() {
        d.terminate();
    }
    for c in cprocs.iter_mut() {
        c.terminate();
    }
}
