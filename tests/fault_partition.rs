//! Network partitions with real processes on a real network (`support/netns.rs`): a director and
//! two cells, each in its own network namespace, a private PostgreSQL 15 on the bridge, the test's
//! clients in the root namespace. Live hosts hold controls and pair a new phone every couple of
//! seconds for the whole run (each pairing keeps its splice until the next one), while a nemesis
//! cuts links with nftables or slows them. Every grant, control activation and close, invite,
//! splice start and end the clients saw goes into a history, together with the store's assignment
//! and control-lease rows sampled every 250 ms; `support/history.rs` checks it:
//!
//! - no host with live controls on two cells (as the clients saw them, and in the sampled rows);
//! - no phone spliced through a cell other than the one of the host's control, nor through a cell
//!   after the store moved the host elsewhere at a higher epoch;
//! - epochs only go up, and a move always raises them;
//! - nothing acknowledged is lost: every granted host has its assignment at an epoch at least the
//!   granted one, every acknowledged invite has its row;
//! - after the heal, every host is granted and connected and pairs a new phone within
//!   [`RECOVERY`], with no process restarted.
//!
//! The heartbeat TTL (45 s) and the control lease (105 s a renewal asks for) are the defaults; only
//! the sweep interval is shortened (`ORCA_RELAY_SWEEP_INTERVAL_MS=5000` instead of 30 s) so the
//! dead-cell path and the expired-lease sweep act within a scenario's minute instead of up to 36 s
//! later.
//!
//! Postgres comes from the test itself (not ORCA_RELAY_TEST_POSTGRES_URL). Skipped with a printed
//! reason when not root or `ip`/`nft`/PostgreSQL 15 are missing; under `CI=true` that fails.

mod support;
use support::history;
use support::netns;
use support::tls;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use history::{Entry, History, Op};
use netns::{DelayProxy, Dir, Net, Node, NsProc, Postgres};
use orca_relay::cell::testkit::{self, Hello, HostControl, HostIdentity, Pair};
use orca_relay::store::Db;
use tls::common::wait::{wait_until, POLL_REQUEST};

const SIGNING: &str = "partition-signing-key-partition-signing-key-01";
const CLUSTER: &str = "partition-node-key-partition-node-key-000001";
const ADMIN: &str = "partition-admin-token-partition-admin-token-1";

/// Live hosts per scenario.
const HOSTS: usize = 4;
/// The port every relay listens on inside its own namespace.
const PORT: u16 = 7000;
/// After a heal: every host granted, connected and paired again within this long.
const RECOVERY: Duration = Duration::from_secs(60);
/// From the processes' start to both cells live in the director's view.
const CELLS_LIVE_WITHIN: Duration = Duration::from_secs(120);
/// How often a connected host pairs a new phone.
const PAIR_EVERY: Duration = Duration::from_millis(2_000);

static CONN: AtomicU64 = AtomicU64::new(1);
/// Phone sources: each pairing comes from its own `X-Forwarded-For` address (the cells trust one
/// proxy hop), as phones on the internet would, so the per-source pre-auth limit (30 legs a
/// minute) is not spent by the test's single real source address.
static SOURCE: AtomicU64 = AtomicU64::new(0);

/// A director and two cells in their namespaces, the private Postgres and the run's history.
struct World {
    net: Net,
    pg: Postgres,
    db: Db,
    director_node: Node,
    cell_nodes: Vec<Node>,
    director: String,
    cells: Vec<String>,
    procs: Vec<NsProc>,
    history: History,
    stop: Arc<AtomicBool>,
    hosts: Vec<Arc<Mutex<HostState>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    proxy: Option<DelayProxy>,
    _dir: TempDir,
}

/// The certificates' directory, removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one host task knows (for the recovery checks).
#[derive(Default)]
struct HostState {
    connected: bool,
    /// History time (ms) of the last successful pairing and control activation.
    last_pair: Option<u64>,
    last_up: Option<u64>,
    /// The cell of the current (or last) control.
    cell: String,
    /// The slowest successful pairing (invite asked → splice echoed), ms.
    slowest_pair: u64,
    /// Failed pairing attempts by cause (printed; refusals during a fault are expected).
    failures: std::collections::BTreeMap<String, usize>,
}

impl World {
    /// Starts everything; `cells_via_proxy` points the cells at a [`DelayProxy`] in front of
    /// Postgres instead of Postgres itself.
    async fn start(test: &str, cells_via_proxy: bool) -> Option<World> {
        let net = Net::new(test)?;
        let pg = Postgres::start(&net);
        let db = Db::connect(&pg.url(), 4)
            .await
            .expect("connect to the private postgres");
        let director_node = net.add_node("d");
        let cell_nodes = vec![net.add_node("c1"), net.add_node("c2")];
        // Plain http is for loopback only: every node serves TLS with a certificate for its
        // address from a CA made for this test, which the cells and the clients trust.
        let director = format!("https://{}:{PORT}", director_node.addr);
        let cells: Vec<String> = cell_nodes
            .iter()
            .map(|n| format!("https://{}:{PORT}", n.addr))
            .collect();
        let ca = tls::TestCa::new("orca partition test ca");
        let dir = TempDir(orca_relay::store::testing::temp_dir("orca-partition"));
        let ca_path = ca.write(&dir.0);
        testkit::trust_extra_ca(ca.pem.as_bytes());
        let tls_env = |node: &Node| {
            let sub = dir.0.join(&node.name);
            std::fs::create_dir_all(&sub).unwrap();
            let (cert, key) = ca.issue(&[node.addr.as_str()]);
            let (cp, kp) = tls::write_pair(&sub, &cert, &key);
            vec![
                (
                    "ORCA_RELAY_PUBLIC_URL".to_string(),
                    format!("https://{}:{PORT}", node.addr),
                ),
                ("ORCA_RELAY_TLS_CERT".to_string(), cp.display().to_string()),
                ("ORCA_RELAY_TLS_KEY".to_string(), kp.display().to_string()),
                (
                    "ORCA_RELAY_TLS_EXTRA_CA".to_string(),
                    ca_path.display().to_string(),
                ),
            ]
        };
        let proxy = if cells_via_proxy {
            Some(DelayProxy::start(&net.gateway(), format!("{}:{}", pg.addr, pg.port)).await)
        } else {
            None
        };
        let cells_json = serde_json::to_string(
            &cells
                .iter()
                .enumerate()
                .map(|(i, u)| {
                    serde_json::json!({"id": format!("c{}", i + 1), "url": u,
                        "region": "us-central1", "capacityRequests": 1000})
                })
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let common = |db_url: String| {
            vec![
                ("ORCA_RELAY_DATABASE_URL".to_string(), db_url),
                ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY".into(), SIGNING.into()),
                ("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()),
                ("ORCA_RELAY_ADMIN_TOKEN".into(), ADMIN.into()),
                ("ORCA_RELAY_DATABASE_POOL_MAX".into(), "4".into()),
                ("ORCA_RELAY_SWEEP_INTERVAL_MS".into(), "5000".into()),
                (
                    "ORCA_RELAY_PUBLIC_ASSIGNMENT_RETRY_AFTER_SECONDS".into(),
                    "1".into(),
                ),
                (
                    "ORCA_RELAY_PUBLIC_STICKY_RETRY_AFTER_SECONDS".into(),
                    "1".into(),
                ),
            ]
        };
        let mut procs = Vec::new();
        let mut denv = common(pg.url());
        denv.push(("ORCA_RELAY_CELLS".into(), cells_json));
        denv.extend(tls_env(&director_node));
        procs.push(NsProc::start(
            &director_node,
            &[
                "--role".into(),
                "director".into(),
                "--listen".into(),
                format!("{}:{PORT}", director_node.addr),
            ],
            &denv,
        ));
        let cell_db = match &proxy {
            Some(p) => format!(
                "postgres://postgres@{}:{}/postgres?connect_timeout=5",
                net.gateway(),
                p.port
            ),
            None => pg.url(),
        };
        for (i, node) in cell_nodes.iter().enumerate() {
            procs.push(NsProc::start(
                node,
                &[
                    "--role".into(),
                    "cell".into(),
                    "--cell-id".into(),
                    format!("c{}", i + 1),
                    "--listen".into(),
                    format!("{}:{PORT}", node.addr),
                    "--director-url".into(),
                    director.clone(),
                    "--trusted-proxy-hops".into(),
                    "1".into(),
                ],
                &[common(cell_db.clone()), tls_env(node)].concat(),
            ));
        }
        // Four worlds start at once on a small machine (a private Postgres and three debug
        // processes each), so the first heartbeats can take a while; on a timeout the director's
        // view and every process's last lines say which part did not come up.
        let deadline = tokio::time::Instant::now() + CELLS_LIVE_WITHIN;
        let mut last = cell_status(&director).await;
        while !last
            .as_ref()
            .is_ok_and(|l| l.len() == 2 && l.iter().all(|c| c["live"] == true))
        {
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(POLL_REQUEST).await;
            last = cell_status(&director).await;
        }
        if tokio::time::Instant::now() >= deadline {
            let logs: Vec<String> = procs
                .iter()
                .map(|p| {
                    let lines = p.lines();
                    let tail = &lines[lines.len().saturating_sub(40)..];
                    format!("--- {} ---\n{}", p.name, tail.join("\n"))
                })
                .collect();
            panic!(
                "{test}: cells not live within {CELLS_LIVE_WITHIN:?}; director's cell status: {last:?}\n{}",
                logs.join("\n")
            );
        }
        Some(World {
            net,
            pg,
            db,
            director_node,
            cell_nodes,
            director,
            cells,
            procs,
            history: History::default(),
            stop: Arc::new(AtomicBool::new(false)),
            hosts: Vec::new(),
            tasks: Vec::new(),
            proxy,
            _dir: dir,
        })
    }

    /// Starts the hosts and the row sampler; returns once every host is connected and paired.
    async fn run_workload(&mut self, test: &str) {
        for i in 0..HOSTS {
            let id = HostIdentity::generate(&format!("{test}-user-{i}"));
            let state = Arc::new(Mutex::new(HostState::default()));
            self.hosts.push(state.clone());
            self.tasks.push(tokio::spawn(host_loop(
                id,
                self.director.clone(),
                self.cells.clone(),
                self.history.clone(),
                state,
                self.stop.clone(),
            )));
        }
        self.tasks.push(tokio::spawn(sampler(
            self.db.clone(),
            self.history.clone(),
            self.stop.clone(),
        )));
        let hosts = self.hosts.clone();
        wait_until(
            "every host connected and paired",
            Duration::from_secs(60),
            || {
                let hosts = hosts.clone();
                async move {
                    hosts.iter().all(|h| {
                        let h = h.lock().unwrap();
                        h.connected && h.last_pair.is_some()
                    })
                }
            },
        )
        .await;
    }

    /// Waits until every host is connected and has paired a phone after `healed` (history ms);
    /// returns how long that took.
    async fn recovered_after(&self, healed: u64) -> Duration {
        let started = Instant::now();
        let hosts = self.hosts.clone();
        wait_until(
            "every host granted, connected and paired after the heal",
            RECOVERY,
            || {
                let hosts = hosts.clone();
                async move {
                    hosts.iter().all(|h| {
                        let h = h.lock().unwrap();
                        h.connected && h.last_pair.is_some_and(|p| p > healed)
                    })
                }
            },
        )
        .await;
        started.elapsed()
    }

    /// Stops the clients, checks the history and the rows, prints the summary.
    async fn finish(mut self, test: &str, recovery: Duration) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
        }
        for p in self.procs.iter_mut() {
            assert!(p.running(), "{test}: {} exited (a restart)", p.name);
        }
        let entries = self.history.entries();
        let mut violations = history::check(&entries);
        violations.extend(lost_acknowledgements(&self.db, &entries, &self.cells).await);
        let s = history::summary(&entries);
        let faults = self.net.faults.lock().unwrap().clone();
        let mut failures = std::collections::BTreeMap::<String, usize>::new();
        for h in &self.hosts {
            for (k, n) in &h.lock().unwrap().failures {
                *failures.entry(k.clone()).or_default() += n;
            }
        }
        let slowest = self
            .hosts
            .iter()
            .map(|h| h.lock().unwrap().slowest_pair)
            .max()
            .unwrap_or(0);
        println!("{test}: failed pairings {failures:?}; slowest pairing {slowest} ms");
        println!(
            "{test}: {} grants, {} control activations, {} invites, {} splices acknowledged; \
             {} row samples; faults {faults:?}; control closes {:?}; violations {}; \
             recovered {} ms after the heal",
            s.grants,
            s.controls,
            s.invites,
            s.splices,
            s.samples,
            s.control_closes,
            violations.len(),
            recovery.as_millis()
        );
        assert!(violations.is_empty(), "{test}: violations {violations:#?}");
        for p in self.procs.iter_mut() {
            if let Some(mut c) = p.child.take() {
                tls::common::proc::terminate(&mut c, Duration::from_secs(12), &p.name);
            }
        }
    }
}

/// The director's cell view (over https, trusting the test CA).
/// The director's cell objects, or what went wrong asking for them (printed on a start timeout).
async fn cell_status(director: &str) -> Result<Vec<serde_json::Value>, String> {
    let r = testkit::http_client()
        .post(format!("{director}/v1/admin/cell-status"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"v": 1}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| format!("request: {e:?}"))?;
    let status = r.status();
    let v = r
        .json::<serde_json::Value>()
        .await
        .map_err(|e| format!("{status}: body: {e}"))?;
    v["cells"]
        .as_array()
        .cloned()
        .ok_or_else(|| format!("{status}: {v}"))
}

fn cell_name(cells: &[String], url: &str) -> String {
    cells
        .iter()
        .position(|u| u == url)
        .map(|i| format!("c{}", i + 1))
        .unwrap_or_else(|| url.to_string())
}

/// Acknowledged grants and invites the store no longer has.
async fn lost_acknowledgements(db: &Db, entries: &[Entry], _cells: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut granted: std::collections::BTreeMap<&str, i64> = Default::default();
    for e in entries {
        if let Op::Grant { host, epoch, .. } = &e.op {
            let g = granted.entry(host).or_default();
            *g = (*g).max(*epoch);
        }
    }
    for (host, epoch) in granted {
        let rows = db
            .query(
                "SELECT assignment_epoch FROM relay_assignments WHERE relay_host_id = $1",
                orca_relay::params![host.to_string()],
            )
            .await
            .expect("read assignments");
        match rows.first().map(|r| r.i64(0)) {
            Some(e) if e >= epoch => {}
            other => out.push(format!("grant {host}@{epoch} lost: row {other:?}")),
        }
    }
    for e in entries {
        if let Op::Invite { host, device, .. } = &e.op {
            let rows = db
                .query(
                    "SELECT state FROM relay_invites WHERE relay_host_id = $1 AND relay_device_id = $2",
                    orca_relay::params![host.clone(), device.clone()],
                )
                .await
                .expect("read invites");
            if rows.is_empty() {
                out.push(format!("invite {device} of {host} acknowledged but gone"));
            }
        }
    }
    out
}

/// Every 250 ms: each host's assignment and the cells holding its unexpired activated control
/// leases, in one statement (one snapshot).
async fn sampler(db: Db, history: History, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let now = orca_relay::clock::now_ms();
        if let Ok(rows) = db
            .query(
                "SELECT a.relay_host_id, a.cell_id, a.assignment_epoch, \
                 (SELECT string_agg(DISTINCT l.cell_id, ',') FROM relay_assignment_activity_leases l \
                  WHERE l.user_id = a.user_id AND l.relay_host_id = a.relay_host_id \
                  AND l.activity_kind = 'control' AND l.activity_id NOT LIKE 'control-pending:%' \
                  AND l.expires_at > $1) FROM relay_assignments a",
                orca_relay::params![now],
            )
            .await
        {
            for r in rows {
                history.record(Op::Sample {
                    host: r.str(0),
                    home: Some((r.str(1), r.i64(2))),
                    live_controls: r
                        .opt_str(3)
                        .map(|s| s.split(',').map(String::from).collect())
                        .unwrap_or_default(),
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One live host: assign, activate its control on the granted cell, pair a new phone every
/// [`PAIR_EVERY`] (keeping the last splice open), answer pings; on any close start over.
async fn host_loop(
    host: HostIdentity,
    director: String,
    cells: Vec<String>,
    history: History,
    state: Arc<Mutex<HostState>>,
    stop: Arc<AtomicBool>,
) {
    let hid = host.relay_host_id.clone();
    let mut reconnect = false;
    let mut phones = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let token = host.token(SIGNING, &director);
        let mut body = serde_json::json!({"v": 1, "relayHostId": hid});
        if reconnect {
            body["reconnect"] = serde_json::json!(true);
        }
        let resp = testkit::http_client()
            .post(format!("{director}/v1/assign"))
            .bearer_auth(&token)
            .json(&body)
            .timeout(Duration::from_secs(15))
            .send()
            .await;
        let grant = match resp {
            Ok(r) if r.status().is_success() => {
                r.json::<serde_json::Value>().await.ok().and_then(|v| {
                    Some((
                        v["cellUrl"].as_str()?.to_string(),
                        v["assignmentEpoch"].as_i64()?,
                    ))
                })
            }
            _ => None,
        };
        let Some((cell_url, epoch)) = grant else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let cell = cell_name(&cells, &cell_url);
        history.record(Op::Grant {
            host: hid.clone(),
            cell: cell.clone(),
            epoch,
        });
        reconnect = true;
        let hello = Hello {
            epoch,
            ..Hello::default()
        };
        let connect = testkit::connect_control(&cell_url, &host, &token, &director, &hello);
        let mut control = match tokio::time::timeout(Duration::from_secs(20), connect).await {
            Ok(Ok(c)) => c,
            _ => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        let conn = CONN.fetch_add(1, Ordering::SeqCst);
        history.record(Op::ControlUp {
            host: hid.clone(),
            cell: cell.clone(),
            epoch,
            conn,
        });
        {
            let mut s = state.lock().unwrap();
            s.connected = true;
            s.last_up = Some(history.now());
            s.cell = cell.clone();
        }
        let code = hold_control(
            &mut control,
            &hid,
            &cell,
            &cell_url,
            &history,
            &state,
            &stop,
            &mut phones,
        )
        .await;
        state.lock().unwrap().connected = false;
        history.record(Op::ControlDown {
            host: hid.clone(),
            cell: cell.clone(),
            conn,
            code,
        });
        if stop.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// Holds an active control until it closes (its close code, 0 without a close frame) or the
/// test stops (1000); pairs phones meanwhile.
#[allow(clippy::too_many_arguments)]
async fn hold_control(
    control: &mut HostControl,
    hid: &str,
    cell: &str,
    cell_url: &str,
    history: &History,
    state: &Mutex<HostState>,
    stop: &AtomicBool,
    phones: &mut u64,
) -> u16 {
    let mut splice: Option<(String, Pair)> = None;
    let mut next_pair = Instant::now();
    let end = |splice: &mut Option<(String, Pair)>, code: u16| {
        if let Some((phone, _)) = splice.take() {
            history.record(Op::SpliceEnd {
                host: hid.into(),
                cell: cell.into(),
                phone,
                code,
            });
        }
    };
    loop {
        if stop.load(Ordering::SeqCst) {
            end(&mut splice, 1000);
            return 1000;
        }
        if Instant::now() >= next_pair {
            next_pair = Instant::now() + PAIR_EVERY;
            let asked = Instant::now();
            *phones += 1;
            let device = format!("{}-p{phones}", &hid[..8]);
            let invite = match create_invite(control, &format!("r{phones}"), &device).await {
                Ok(t) => t,
                Err(v) => {
                    if v["close"] == 0 && v["reason"] == "timeout" {
                        // No answer within 10 s (a slow store): the control stays open.
                        *state
                            .lock()
                            .unwrap()
                            .failures
                            .entry("invite: no answer in 10 s".into())
                            .or_default() += 1;
                        continue;
                    }
                    if let Some(code) = v["close"].as_u64() {
                        let why: String = v["reason"]
                            .as_str()
                            .unwrap_or("")
                            .chars()
                            .take(60)
                            .collect();
                        *state
                            .lock()
                            .unwrap()
                            .failures
                            .entry(format!("invite: control closed {code} {why}"))
                            .or_default() += 1;
                        end(&mut splice, code as u16);
                        return code as u16;
                    }
                    let code = v["code"].as_str().or(v["type"].as_str()).unwrap_or("?");
                    *state
                        .lock()
                        .unwrap()
                        .failures
                        .entry(format!("invite {code}"))
                        .or_default() += 1;
                    continue; // refused (store unreachable): the control stays, try later
                }
            };
            history.record(Op::Invite {
                host: hid.into(),
                cell: cell.into(),
                device: device.clone(),
            });
            let n = SOURCE.fetch_add(1, Ordering::SeqCst);
            let source = format!("198.18.{}.{}", (n / 250) % 250, n % 250 + 1);
            let began = history.now();
            let paired = tokio::time::timeout(
                Duration::from_secs(20),
                testkit::pair_phone(
                    cell_url,
                    control,
                    hid,
                    &invite,
                    &[("X-Forwarded-For", source)],
                ),
            )
            .await;
            let failed = |why: String| {
                let why: String = why.chars().take(60).collect();
                *state.lock().unwrap().failures.entry(why).or_default() += 1;
            };
            match paired {
                Err(_) => failed("pair timeout".into()),
                Ok(Err(ref e)) => failed(format!("pair {e}")),
                Ok(Ok(_)) => {}
            }
            if let Ok(Ok(mut pair)) = paired {
                let echoed = pair.echo(&device, Duration::from_secs(10)).await;
                if let Err(e) = &echoed {
                    failed(format!("echo {e}"));
                }
                if echoed.is_ok() {
                    end(&mut splice, 1000);
                    history.record_at(
                        began,
                        Op::SpliceStart {
                            host: hid.into(),
                            cell: cell.into(),
                            phone: device.clone(),
                        },
                    );
                    let mut st = state.lock().unwrap();
                    st.last_pair = Some(history.now());
                    st.slowest_pair = st.slowest_pair.max(asked.elapsed().as_millis() as u64);
                    drop(st);
                    splice = Some((device, pair));
                }
            }
            continue;
        }
        match control.recv(Duration::from_millis(200)).await {
            Ok(_) => {}
            Err((0, reason)) if reason == "timeout" => {}
            Err((code, reason)) => {
                if code == 0 {
                    let why: String = reason.chars().take(60).collect();
                    *state
                        .lock()
                        .unwrap()
                        .failures
                        .entry(format!("control {why}"))
                        .or_default() += 1;
                }
                end(&mut splice, code);
                return code;
            }
        }
    }
}

/// `invite-create` → the invite token, matched by `reqId`: a late answer to an earlier request
/// (one that got no answer within 10 s) is skipped, not taken for this one. Errors as
/// `HostControl::create_invite`: `{"close": code, "reason": …}` when the control closed (code 0
/// and reason `timeout` when nothing matching came within 10 s), else the refusal.
async fn create_invite(
    control: &mut HostControl,
    req_id: &str,
    device: &str,
) -> Result<String, serde_json::Value> {
    control
        .send(serde_json::json!({"type":"invite-create","reqId":req_id,"relayDeviceId":device}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = control
            .recv(left)
            .await
            .map_err(|e| serde_json::json!({"close": e.0, "reason": e.1}))?;
        if v["reqId"] != req_id {
            continue;
        }
        return match v["inviteToken"].as_str() {
            Some(t) if v["type"] == "invite-created" => Ok(t.to_owned()),
            _ => Err(v),
        };
    }
}

/// Lets the workload run `d` (real time) while faults hold.
async fn hold(d: Duration) {
    tokio::time::sleep(d).await;
}

/// The checker finds what it must: hand-made histories with and without violations.
#[test]
fn checker_flags_violating_histories() {
    let at = |at, op| Entry { at, op };
    let up = |host: &str, cell: &str, epoch, conn| Op::ControlUp {
        host: host.into(),
        cell: cell.into(),
        epoch,
        conn,
    };
    let down = |host: &str, cell: &str, conn| Op::ControlDown {
        host: host.into(),
        cell: cell.into(),
        conn,
        code: 4503,
    };
    let splice = |host: &str, cell: &str| Op::SpliceStart {
        host: host.into(),
        cell: cell.into(),
        phone: "p".into(),
    };
    let sample = |host: &str, home: &str, epoch, live: &[&str]| Op::Sample {
        host: host.into(),
        home: Some((home.into(), epoch)),
        live_controls: live.iter().map(|s| s.to_string()).collect(),
    };
    // A clean move: c1 closes, c2 activates at a higher epoch, the splice goes through c2.
    let clean = vec![
        at(0, up("h", "c1", 1, 1)),
        at(5, sample("h", "c1", 1, &["c1"])),
        at(10, splice("h", "c1")),
        at(20, down("h", "c1", 1)),
        at(25, sample("h", "c2", 2, &[])),
        at(30, up("h", "c2", 2, 2)),
        at(40, splice("h", "c2")),
    ];
    assert_eq!(history::check(&clean), Vec::<String>::new());

    // Two open controls on two cells.
    let two = vec![at(0, up("h", "c1", 1, 1)), at(10, up("h", "c2", 2, 2))];
    assert_eq!(history::two_open_controls(&two).len(), 1);
    // Live leases on two cells in one sample.
    let leases = vec![at(0, sample("h", "c2", 2, &["c1", "c2"]))];
    assert_eq!(history::two_live_leases(&leases).len(), 1);
    // A move without an epoch bump, and an epoch going back.
    let same = vec![
        at(0, up("h", "c1", 3, 1)),
        at(1, down("h", "c1", 1)),
        at(2, up("h", "c2", 3, 2)),
    ];
    assert_eq!(history::epochs_go_back(&same).len(), 1);
    let back = vec![
        at(
            0,
            Op::Grant {
                host: "h".into(),
                cell: "c1".into(),
                epoch: 4,
            },
        ),
        at(
            1,
            Op::Grant {
                host: "h".into(),
                cell: "c1".into(),
                epoch: 3,
            },
        ),
    ];
    assert_eq!(history::epochs_go_back(&back).len(), 1);
    // A splice through the old cell after the store moved the host away.
    let stale = vec![
        at(0, up("h", "c1", 1, 1)),
        at(10, sample("h", "c2", 2, &[])),
        at(20, splice("h", "c1")),
    ];
    assert_eq!(history::splice_off_authority(&stale).len(), 1);
    assert_eq!(history::check(&stale).len(), 1);
    // A cell that keeps serving a host past its lease: the control stays open on c1 while the
    // samples show no live lease of c1 for longer than the grace.
    let unleased = vec![
        at(0, up("h", "c1", 1, 1)),
        at(1_000, sample("h", "c1", 1, &["c1"])),
        at(2_000, sample("h", "c2", 2, &[])),
        at(9_000, sample("h", "c2", 2, &[])),
    ];
    assert_eq!(history::served_without_lease(&unleased, 5_000).len(), 1);
    let closed_in_time = vec![
        at(0, up("h", "c1", 1, 1)),
        at(2_000, sample("h", "c2", 2, &[])),
        at(4_000, down("h", "c1", 1)),
        at(9_000, sample("h", "c2", 2, &[])),
    ];
    assert_eq!(
        history::served_without_lease(&closed_in_time, 5_000),
        Vec::<String>::new()
    );
    // A splice with no control open on that cell.
    let orphan = vec![at(0, up("h", "c1", 1, 1)), at(5, splice("h", "c2"))];
    assert_eq!(history::splice_off_authority(&orphan).len(), 1);
}

/// A cell cut from Postgres and from the director (both directions) for 110 s, longer than the
/// heartbeat TTL (45 s) and the control lease a renewal asks for (105 s); its clients still reach
/// it. Then healed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cell_cut_from_postgres_and_director() {
    let test = "cell_cut";
    let Some(mut w) = World::start(test, false).await else {
        return;
    };
    w.run_workload(test).await;
    let (c1, pg) = (w.cell_nodes[0].clone(), w.pg.addr.clone());
    w.net.cut(&c1, &pg, Some(w.pg.port), Dir::Both);
    w.net.cut(&c1, &w.director_node.addr, None, Dir::Both);
    let cut = Instant::now();
    let cut_at = w.history.now();
    // Before the heal: c1 ends its sessions before their leases lapse, and every host is served
    // by c2 and pairs phones there.
    let hosts = w.hosts.clone();
    wait_until(
        "every host re-served by c2 during the cut",
        Duration::from_secs(105),
        || {
            let hosts = hosts.clone();
            async move {
                hosts.iter().all(|h| {
                    let h = h.lock().unwrap();
                    h.connected && h.cell == "c2" && h.last_pair.is_some_and(|p| p > cut_at)
                })
            }
        },
    )
    .await;
    let moved = cut.elapsed();
    println!(
        "{test}: every host served by c2 and paired again {} ms into the cut",
        moved.as_millis()
    );
    hold(Duration::from_secs(110).saturating_sub(cut.elapsed())).await;
    w.net.heal(&c1);
    let healed = w.history.now();
    let recovery = w.recovered_after(healed).await;
    w.finish(test, recovery).await;
}

/// The director cut from Postgres for 50 s while the cells serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn director_cut_from_postgres() {
    let test = "director_cut";
    let Some(mut w) = World::start(test, false).await else {
        return;
    };
    w.run_workload(test).await;
    let d = w.director_node.clone();
    w.net
        .cut(&d, &w.pg.addr.clone(), Some(w.pg.port), Dir::Both);
    hold(Duration::from_secs(50)).await;
    w.net.heal(&d);
    let healed = w.history.now();
    let recovery = w.recovered_after(healed).await;
    w.finish(test, recovery).await;
}

/// Asymmetric: c1 reaches Postgres but not the director's heartbeat endpoint for 60 s, then c2
/// reaches the director but not Postgres for 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asymmetric_cells() {
    let test = "asymmetric";
    let Some(mut w) = World::start(test, false).await else {
        return;
    };
    w.run_workload(test).await;
    let (c1, c2) = (w.cell_nodes[0].clone(), w.cell_nodes[1].clone());
    w.net
        .cut(&c1, &w.director_node.addr.clone(), Some(PORT), Dir::Out);
    hold(Duration::from_secs(60)).await;
    w.net.heal(&c1);
    let healed = w.history.now();
    let first = w.recovered_after(healed).await;
    w.net
        .cut(&c2, &w.pg.addr.clone(), Some(w.pg.port), Dir::Both);
    hold(Duration::from_secs(60)).await;
    w.net.heal(&c2);
    let healed = w.history.now();
    let second = w.recovered_after(healed).await;
    w.finish(test, first.max(second)).await;
}

/// 200 ms delay and 5 % loss between both cells and Postgres for a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_lossy_postgres_links() {
    let test = "slow_lossy";
    let Some(mut w) = World::start(test, true).await else {
        return;
    };
    w.run_workload(test).await;
    let proxy_port = w.proxy.as_ref().unwrap().port;
    let gw = w.net.gateway();
    w.proxy
        .as_ref()
        .unwrap()
        .set_delay(Duration::from_millis(200));
    for c in w.cell_nodes.clone() {
        w.net.lossy(&c, &gw, proxy_port, 5);
    }
    w.net
        .faults
        .lock()
        .unwrap()
        .push("200 ms delay cells <-> postgres".into());
    hold(Duration::from_secs(60)).await;
    w.proxy.as_ref().unwrap().set_delay(Duration::ZERO);
    for c in w.cell_nodes.clone() {
        w.net.heal(&c);
    }
    let healed = w.history.now();
    let recovery = w.recovered_after(healed).await;
    w.finish(test, recovery).await;
}
