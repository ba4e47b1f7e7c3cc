//! A multi-region fleet of real `orca-relay` processes on one Postgres database, desktop hosts that
//! behave like the Orca desktop (assign, control with capabilities, the region measurement,
//! re-resolve and retry with backoff after every close or refusal), and the invariant sampler.
//! Shared by `tests/cluster_region.rs` and `examples/roll_bench.rs`, so it takes the binary's path
//! instead of `env!("CARGO_BIN_EXE_orca-relay")` (only integration tests have that variable).
//!
//! Everything a host records is kept per host behind one short std mutex; nothing here logs a host
//! or user identity, and [`identity_leaks`] checks that the processes did not either.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::store::Db;
use serde_json::{json, Value};

pub const SIGNING: &str = "region-signing-key-region-signing-key-0001";
pub const CLUSTER: &str = "region-cluster-key-region-cluster-key-01";
pub const ADMIN: &str = "region-admin-token-region-admin-token-01";
pub const CAP_IDLE_REHOME: &str = "idle-regional-rehome-v1";

pub use super::common::ports::free_port;
use super::common::proc;

/// One `orca-relay serve` process; its stderr lines are kept for the log checks.
pub struct Node {
    pub name: String,
    pub bin: PathBuf,
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    pub child: Option<Child>,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Node {
    pub fn new(bin: &Path, name: &str, args: Vec<String>, envs: Vec<(String, String)>) -> Node {
        Node {
            name: name.into(),
            bin: bin.to_path_buf(),
            args,
            envs,
            child: None,
            log: Arc::default(),
        }
    }

    /// Starts the process and waits (≤ 30 s) for its listener.
    pub fn start(&mut self) {
        let spec = proc::Spec {
            verbose_env: "CLUSTER_TEST_VERBOSE",
            bin: Some(&self.bin),
            ..proc::Spec::new(&self.name, &self.args, &self.envs)
        };
        let spawned =
            proc::spawn_serve(&spec, &self.log, Duration::from_secs(30)).unwrap_or_else(|()| {
                panic!("{} did not start: {:?}", self.name, proc::lines(&self.log))
            });
        self.child = Some(spawned.child);
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM and wait (≤ 11 s) for exit 0.
    pub fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let status = proc::terminate(&mut child, Duration::from_secs(11), &self.name);
        assert_eq!(status.code(), Some(0), "{} exit", self.name);
    }

    pub fn lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Restarts the node whenever it exits (status 0 expected), like `Restart=always`; returns the
/// number of restarts when `stop` is set.
pub fn supervise(node: Arc<Mutex<Node>>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let mut restarts = 0;
        while !stop.load(Ordering::SeqCst) {
            {
                let mut n = node.lock().unwrap();
                let exited = n.child.as_mut().and_then(|c| c.try_wait().unwrap());
                if let Some(status) = exited {
                    assert_eq!(status.code(), Some(0), "{} exit on SIGTERM", n.name);
                    n.child = None;
                    n.start();
                    restarts += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        restarts
    })
}

/// What to start.
pub struct FleetSpec {
    /// One region per director (its `ORCA_RELAY_REGION`).
    pub directors: Vec<String>,
    /// `(cellId, region)`.
    pub cells: Vec<(String, String)>,
    pub capacity_requests: i64,
    pub pool_max: usize,
    /// Extra environment for every director.
    pub director_env: Vec<(String, String)>,
}

pub struct CellNode {
    pub id: String,
    pub region: String,
    pub url: String,
    pub node: Arc<Mutex<Node>>,
}

pub struct Fleet {
    pub directors: Vec<String>,
    pub dnodes: Vec<Node>,
    pub cells: Vec<CellNode>,
}

impl Fleet {
    pub fn cell_of_url(&self, url: &str) -> Option<&CellNode> {
        self.cells.iter().find(|c| c.url == url)
    }

    /// Every process's log lines so far.
    pub fn all_lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.dnodes.iter().flat_map(Node::lines).collect();
        for c in &self.cells {
            out.extend(c.node.lock().unwrap().lines());
        }
        out
    }

    /// SIGTERM to every process, cells first.
    pub fn stop(mut self) {
        for c in &self.cells {
            c.node.lock().unwrap().terminate();
        }
        for d in self.dnodes.iter_mut() {
            d.terminate();
        }
    }
}

pub fn regions_of(spec: &FleetSpec) -> String {
    let mut r: Vec<String> = Vec::new();
    for x in spec.directors.iter().chain(spec.cells.iter().map(|c| &c.1)) {
        if !r.contains(x) {
            r.push(x.clone());
        }
    }
    r.join(",")
}

/// Starts the directors, then the cells (each cell's heartbeats go to the first director), and
/// waits until every cell is live.
pub async fn start_fleet(bin: &Path, db_url: &str, spec: &FleetSpec) -> Fleet {
    let regions = regions_of(spec);
    let dports: Vec<u16> = spec.directors.iter().map(|_| free_port()).collect();
    let cports: Vec<u16> = spec.cells.iter().map(|_| free_port()).collect();
    let directors: Vec<String> = dports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let cell_urls: Vec<String> = cports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let cells_json = serde_json::to_string(
        &spec
            .cells
            .iter()
            .zip(&cell_urls)
            .map(|((id, region), url)| {
                json!({"id": id, "url": url, "region": region,
                    "capacityRequests": spec.capacity_requests})
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let common = vec![
        ("ORCA_RELAY_DATABASE_URL".to_string(), db_url.to_string()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY".into(), SIGNING.into()),
        ("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()),
        ("ORCA_RELAY_ADMIN_TOKEN".into(), ADMIN.into()),
        ("ORCA_RELAY_REGIONS".into(), regions),
        (
            "ORCA_RELAY_DATABASE_POOL_MAX".into(),
            spec.pool_max.to_string(),
        ),
        (
            "ORCA_RELAY_PUBLIC_ASSIGNMENT_RETRY_AFTER_SECONDS".into(),
            "1".into(),
        ),
        (
            "ORCA_RELAY_PUBLIC_STICKY_RETRY_AFTER_SECONDS".into(),
            "1".into(),
        ),
    ];
    let mut dnodes = Vec::new();
    for (i, (region, port)) in spec.directors.iter().zip(&dports).enumerate() {
        let mut envs = common.clone();
        envs.push(("ORCA_RELAY_CELLS".into(), cells_json.clone()));
        envs.push(("ORCA_RELAY_REGION".into(), region.clone()));
        // Every director signs host tokens for one public origin, the first director's.
        envs.push(("ORCA_RELAY_PUBLIC_URL".into(), directors[0].clone()));
        envs.extend(spec.director_env.iter().cloned());
        let mut n = Node::new(
            bin,
            &format!("d{}", i + 1),
            vec![
                "--role".into(),
                "director".into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
            ],
            envs,
        );
        n.start();
        dnodes.push(n);
    }
    let mut cells = Vec::new();
    for (((id, region), port), url) in spec.cells.iter().zip(&cports).zip(&cell_urls) {
        let mut envs = common.clone();
        envs.push(("ORCA_RELAY_REGION".into(), region.clone()));
        envs.push(("ORCA_RELAY_PUBLIC_URL".into(), directors[0].clone()));
        envs.push(("ORCA_RELAY_CELL_URL".into(), url.clone()));
        let mut n = Node::new(
            bin,
            id,
            vec![
                "--role".into(),
                "cell".into(),
                "--cell-id".into(),
                id.clone(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--director-url".into(),
                directors[0].clone(),
            ],
            envs,
        );
        n.start();
        cells.push(CellNode {
            id: id.clone(),
            region: region.clone(),
            url: url.clone(),
            node: Arc::new(Mutex::new(n)),
        });
    }
    let fleet = Fleet {
        directors,
        dnodes,
        cells,
    };
    let n = spec.cells.len();
    wait_until("all cells live", Duration::from_secs(60), || async {
        let cs = cell_status(&fleet.directors[0]).await;
        cs.len() == n && cs.iter().all(|c| c["live"] == true)
    })
    .await;
    fleet
}

pub fn client() -> reqwest::Client {
    static C: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .pool_max_idle_per_host(64)
            .build()
            .unwrap()
    })
    .clone()
}

/// An operator POST; `Err((status, body))` on a non-2xx answer.
pub async fn admin(director: &str, path: &str, body: Value) -> Result<Value, (u16, Value)> {
    let r = client()
        .post(format!("{director}{path}"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .map_err(|e| (0, json!(e.to_string())))?;
    let st = r.status();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    if st.is_success() {
        Ok(v)
    } else {
        Err((st.as_u16(), v))
    }
}

pub async fn cell_status(director: &str) -> Vec<Value> {
    admin(director, "/v1/admin/cell-status", json!({"v": 1}))
        .await
        .map(|v| v["cells"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default()
}

pub async fn overview(director: &str) -> Value {
    let r = client()
        .get(format!("{director}/v1/admin/overview"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    r.json().await.unwrap_or(Value::Null)
}

/// Polls `f` every 100 ms until it holds; panics after `within`.
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

/// What a host does besides holding its control.
#[derive(Clone, Default)]
pub struct HostPlan {
    /// Advertise `idle-regional-rehome-v1`.
    pub capable: bool,
    /// After the first grant: `issue-window`, then a conclusive report with these RTTs (ms).
    pub measurements: Option<Vec<(String, i64)>>,
    /// Pair a phone after every activation and keep the splice open (the host is never idle).
    pub splice: bool,
    /// Pair a phone (once per activation) as soon as this flag is set: the host is idle until
    /// then and never idle after.
    pub splice_on: Option<Arc<AtomicBool>>,
    /// On a cell's `drain` frame, close the control at once and re-resolve through the director
    /// (docs/deploy/cluster.md: told hosts re-ask `/v1/assign`); otherwise hold it until the cell
    /// closes it at the drain grace.
    pub leave_on_drain: bool,
}

/// One activation.
#[derive(Clone, Debug)]
pub struct Grant {
    pub cell_url: String,
    pub epoch: i64,
}

/// What one host saw.
#[derive(Default)]
pub struct HostStats {
    pub grants: Vec<Grant>,
    pub connected: bool,
    /// Since when the host has had no activated control (None while connected).
    pub down_since: Option<Instant>,
    /// Every completed period without a control (after the first activation).
    pub downs: Vec<Duration>,
    /// Refusals by cause (`assign 503 assignments_temporarily_unavailable`, `control 4409 …`).
    pub refusals: BTreeMap<String, u64>,
    /// Whether the region report was accepted.
    pub reported: bool,
    /// Splices paired.
    pub splices: u32,
    /// When the first splice was paired.
    pub first_splice_at: Option<Instant>,
    /// When (wall clock, epoch ms) the host's control on a cell (by URL) last ended (the host
    /// left or the cell closed it), and when one was last activated there.
    pub left: BTreeMap<String, i64>,
    pub joined: BTreeMap<String, i64>,
}

impl HostStats {
    /// Moves: activations on another cell than the previous one.
    pub fn moves(&self) -> usize {
        self.grants
            .windows(2)
            .filter(|w| w[0].cell_url != w[1].cell_url)
            .count()
    }

    pub fn last_cell(&self) -> Option<&str> {
        self.grants.last().map(|g| g.cell_url.as_str())
    }

    /// The current period without a control, if any.
    pub fn down_now(&self) -> Option<Duration> {
        self.down_since.map(|s| s.elapsed())
    }
}

/// Wall-clock epoch ms (comparable with the database server's clock on this machine).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn refuse(stats: &Mutex<HostStats>, cause: String) {
    *stats.lock().unwrap().refusals.entry(cause).or_default() += 1;
}

/// The desktop's retry: 100 ms doubling to 2 s with ±20 % jitter, reset after an activation.
fn backoff(attempt: u32) -> Duration {
    let base = 100u64.saturating_mul(1 << attempt.min(5)).min(2_000);
    let jitter = rand::random::<f64>() * 0.4 + 0.8;
    Duration::from_millis((base as f64 * jitter) as u64)
}

async fn assign_call(director: &str, token: &str, body: &Value) -> Result<Value, String> {
    match client()
        .post(format!("{director}/v1/assign"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
    {
        Ok(r) => {
            let st = r.status();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            if st.is_success() {
                Ok(v)
            } else {
                Err(format!(
                    "assign {} {}",
                    st.as_u16(),
                    v["error"].as_str().unwrap_or("?")
                ))
            }
        }
        Err(e) if e.is_timeout() => Err("assign timeout".into()),
        Err(_) => Err("assign transport".into()),
    }
}

/// `regionCorrection` through `/v1/assign`, retried while the per-host interval refuses it.
async fn region_exchange(director: &str, token: &str, id: &str, rc: Value) -> Option<Value> {
    for _ in 0..40 {
        let body = json!({"v":1,"relayHostId":id,"reconnect":true,"regionCorrection":rc});
        match assign_call(director, token, &body).await {
            Ok(v) => return Some(v),
            Err(e) if e.starts_with("assign 503") => {
                tokio::time::sleep(Duration::from_millis(300)).await
            }
            Err(_) => return None,
        }
    }
    None
}

/// Reads and drops every frame of a socket until it closes (keeps pings answered).
fn drain_socket(mut ws: testkit::ClientWs) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { while let Some(Ok(_)) = ws.next().await {} })
}

/// One desktop host until `stop`: assign (the directors in turn on failures; `reconnect:true` after
/// the first grant, as the desktop's re-resolve), connect the control with the plan's
/// capabilities, run the plan, hold the control answering pings until the cell closes it, then
/// start over with backoff.
pub async fn run_host(
    host: HostIdentity,
    directors: Vec<String>,
    public_url: String,
    plan: HostPlan,
    stats: Arc<Mutex<HostStats>>,
    stop: Arc<AtomicBool>,
) {
    let mut turn = 0usize;
    let mut attempt = 0u32;
    let mut granted_once = false;
    let caps: Vec<String> = if plan.capable {
        vec![CAP_IDLE_REHOME.into()]
    } else {
        vec![]
    };
    stats.lock().unwrap().down_since = Some(Instant::now());
    while !stop.load(Ordering::SeqCst) {
        let director = directors[turn % directors.len()].clone();
        let token = host.token(SIGNING, &public_url);
        let mut body = json!({"v": 1, "relayHostId": host.relay_host_id});
        if granted_once {
            body["reconnect"] = json!(true);
        }
        let grant = match assign_call(&director, &token, &body).await {
            Ok(v) => (
                v["cellUrl"].as_str().unwrap_or_default().to_string(),
                v["assignmentEpoch"].as_i64().unwrap_or(0),
            ),
            Err(cause) => {
                refuse(&stats, cause);
                turn += 1;
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
                continue;
            }
        };
        let hello = Hello {
            epoch: grant.1,
            capabilities: caps.clone(),
            ..Hello::default()
        };
        let mut control =
            match testkit::connect_control(&grant.0, &host, &token, &public_url, &hello).await {
                Ok(c) => c,
                Err((code, reason)) => {
                    let reason = if code == 0 { "transport" } else { &reason };
                    refuse(&stats, format!("control {code} {reason}"));
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                    continue;
                }
            };
        attempt = 0;
        granted_once = true;
        {
            let mut s = stats.lock().unwrap();
            if let Some(since) = s.down_since.take() {
                if !s.grants.is_empty() {
                    s.downs.push(since.elapsed());
                }
            }
            s.grants.push(Grant {
                cell_url: grant.0.clone(),
                epoch: grant.1,
            });
            s.connected = true;
            s.joined.insert(grant.0.clone(), wall_ms());
        }
        let mut held: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        if let Some(m) = plan
            .measurements
            .as_ref()
            .filter(|_| !stats.lock().unwrap().reported)
        {
            let id = &host.relay_host_id;
            let w = region_exchange(
                &director,
                &token,
                id,
                json!({"v":1,"action":"issue-window"}),
            )
            .await;
            let w = w.map(|w| w["regionCorrection"]["window"].clone());
            if let Some(w) = w.filter(|w| w.is_object()) {
                let measurements: serde_json::Map<String, Value> =
                    m.iter().map(|(r, v)| (r.clone(), json!(v))).collect();
                let r = region_exchange(
                    &director,
                    &token,
                    id,
                    json!({"v":1,"action":"report","generation":w["generation"],
                        "assignmentEpoch":w["assignmentEpoch"],"policyVersion":1,
                        "outcome":"conclusive","measurements":measurements}),
                )
                .await;
                if r.is_some_and(|r| r["regionCorrection"]["reportStatus"] == "accepted") {
                    stats.lock().unwrap().reported = true;
                }
            }
        }
        let mut spliced = false;
        // Hold the control until the cell closes it (drain, move, roll) or the run stops.
        loop {
            if stop.load(Ordering::SeqCst) {
                for h in held {
                    h.abort();
                }
                return;
            }
            let wanted = plan.splice
                || plan
                    .splice_on
                    .as_ref()
                    .is_some_and(|f| f.load(Ordering::SeqCst));
            if wanted && !spliced {
                spliced = true;
                if let Ok(invite) = control.create_invite("r1", "d1").await {
                    if let Ok(pair) = testkit::pair_phone(
                        &grant.0,
                        &mut control,
                        &host.relay_host_id,
                        &invite,
                        &[],
                    )
                    .await
                    {
                        let mut s = stats.lock().unwrap();
                        s.splices += 1;
                        s.first_splice_at.get_or_insert_with(Instant::now);
                        held.push(drain_socket(pair.phone));
                        held.push(drain_socket(pair.data));
                    }
                }
            }
            match control.recv(Duration::from_millis(250)).await {
                Ok(v) if plan.leave_on_drain && v["type"] == "drain" => {
                    let _ = control.ws.close(None).await;
                    break;
                }
                Ok(_) => {}
                Err((0, reason)) if reason == "timeout" => {}
                Err(_) => break,
            }
        }
        for h in held {
            h.abort();
        }
        let mut s = stats.lock().unwrap();
        s.connected = false;
        s.down_since = Some(Instant::now());
        s.left.insert(grant.0.clone(), wall_ms());
    }
}

/// What the invariant sampler saw.
#[derive(Default, Debug)]
pub struct Samples {
    pub samples: u64,
    /// Hosts whose unexpired, activated control leases held by the cells' *current* incarnations
    /// (running processes) sit on two cells: double serving. Must stay empty.
    pub violations: Vec<String>,
    /// Hosts with unexpired control leases on two cells where one belongs to an incarnation that
    /// is no longer the cell's runtime (a stopped process whose release did not land: no process
    /// serves through it, it expires with its lease). Counted, not a violation.
    pub stale_leases: u64,
}

/// The invariant sampler: every `every`, [`double_served`]. Returns what it saw at stop.
pub fn start_sampler(
    db: Db,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Samples> {
    tokio::spawn(async move {
        let mut out = Samples::default();
        while !stop.load(Ordering::SeqCst) {
            let (live, stale) = double_served(&db).await;
            out.violations.extend(live);
            out.stale_leases += stale;
            out.samples += 1;
            tokio::time::sleep(every).await;
        }
        out
    })
}

/// One control lease seen: (cell, incarnation prefix, generation, ms to expiry, of the current
/// incarnation).
type LeaseSeen = (String, String, i64, i64, bool);

/// Hosts with unexpired activated control leases on two cells right now: `(violations, stale)`.
/// A violation names the host by digest with its leases (cell, incarnation prefix, generation,
/// ms to expiry); `stale` counts hosts whose second cell's lease is of a stopped incarnation.
pub async fn double_served(db: &Db) -> (Vec<String>, u64) {
    let now = orca_relay::clock::now_ms();
    let rows = db
        .query(
            "SELECT l.user_id, l.relay_host_id, l.cell_id, COALESCE(l.cell_incarnation, ''), \
             COALESCE(l.control_generation, 0), l.expires_at - $1, \
             CASE WHEN r.cell_incarnation = l.cell_incarnation THEN 1 ELSE 0 END \
             FROM relay_assignment_activity_leases l \
             LEFT JOIN relay_cell_runtime r ON r.cell_id = l.cell_id \
             WHERE l.activity_kind = 'control' AND l.activity_id NOT LIKE 'control-pending:%' \
             AND l.expires_at > $1 AND (l.user_id, l.relay_host_id) IN ( \
               SELECT user_id, relay_host_id FROM relay_assignment_activity_leases \
               WHERE activity_kind = 'control' AND activity_id NOT LIKE 'control-pending:%' \
               AND expires_at > $1 GROUP BY user_id, relay_host_id HAVING COUNT(DISTINCT cell_id) > 1) \
             ORDER BY l.user_id, l.relay_host_id, l.cell_id",
            orca_relay::params![now],
        )
        .await
        .unwrap_or_default();
    let mut by_host: BTreeMap<(String, String), Vec<LeaseSeen>> = BTreeMap::new();
    for r in &rows {
        by_host.entry((r.str(0), r.str(1))).or_default().push((
            r.str(2),
            r.str(3).chars().take(8).collect(),
            r.i64(4),
            r.i64(5),
            r.i64(6) == 1,
        ));
    }
    let mut violations = Vec::new();
    let mut stale = 0;
    for ((_, host), leases) in by_host {
        let mut live_cells: Vec<&str> = leases
            .iter()
            .filter(|l| l.4)
            .map(|l| l.0.as_str())
            .collect();
        live_cells.dedup();
        if live_cells.len() > 1 {
            violations.push(format!(
                "host {}: {:?}",
                orca_relay::logging::digest(&host),
                leases
            ));
        } else {
            stale += 1;
        }
    }
    (violations, stale)
}

/// Epochs a host was granted only ever increase.
pub fn epochs_increase(stats: &HostStats) -> bool {
    stats.grants.windows(2).all(|w| w[1].epoch >= w[0].epoch)
}

/// Log lines that contain any of `secrets` (user ids, relay host ids).
pub fn identity_leaks(lines: &[String], secrets: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| secrets.iter().any(|s| l.contains(s.as_str())))
        .cloned()
        .collect()
}

/// The `p`-quantile (0..=1) of `xs` (nearest rank), zero when empty.
pub fn quantile(xs: &[Duration], p: f64) -> Duration {
    if xs.is_empty() {
        return Duration::ZERO;
    }
    let mut v = xs.to_vec();
    v.sort();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A counter shared by tasks (e.g. samples).
pub type Counter = Arc<AtomicU64>;
