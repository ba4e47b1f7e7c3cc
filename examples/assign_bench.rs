//! Sticky-reconnect `/v1/assign` throughput against an in-process director, side by side with
//! `pgbench` simple-update on the same Postgres server in the same run (issue 12).
//!
//! `cargo run --release --example assign_bench -- <postgres-url|sqlite> [seconds] [clients] [hosts] [rounds] [sticky-concurrency]`
//! (defaults 10, 8, 200, 3, `clients`).
//!
//! For each backend the bench starts a director on a database of its own, registers three live
//! uncapped cells, places `hosts` hosts, then `clients` concurrent HTTP clients send
//! `{"reconnect":true}` assigns round-robin over the hosts for `seconds` (one phase). The per-host
//! minimum interval is lowered to 1 ms so the number measures the lane and the database, not the
//! interval. The sticky lane's concurrency (`ORCA_RELAY_PUBLIC_STICKY_CONCURRENCY`, default 1 in
//! production) is `clients` unless given, so as many grant transactions are in flight as pgbench
//! has sessions (`-c`); with fewer, the grants queue in the lane in front of the database.
//!
//! With a `postgres://` URL (any database on the server; the bench only creates and drops its own)
//! it creates two scratch databases, `orca_bench_<id>` for the director and `orca_pgbench_<id>`,
//! initialised with `pgbench -i -q -s 1`, and runs `rounds` rounds of
//! `pgbench -N -c <clients> -j 2 -T <seconds>` and one assign phase, alternating which goes first,
//! printing both figures and their ratio per round and the medians; then the same assign phase on a
//! temporary SQLite file. Both scratch databases are dropped at the end (also after a panic).
//! On Debian 12 `pgbench` is in the server package `postgresql-15` (installed wherever the local
//! server runs; `apt-get install postgresql-15` otherwise) and `createdb`/`dropdb` in
//! `postgresql-client-15`; the bench says so and stops if one is missing. With `sqlite` it
//! runs the SQLite phases only.
//!
//! Each backend ends with one phase of plain assigns (no `reconnect`) of the same hosts, which go
//! through the placement lane's `assign` (backend `…-placement-lane`; its lane concurrency is the
//! same). Lines are `key=value`: `phase=...` per phase, `summary ...` with the medians.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use orca_relay::config::{Config, ServeArgs};
use orca_relay::server::Running;
use serde_json::json;

/// The director runs in this process: give it the binary's allocator (`src/main.rs`), so the
/// relay's CPU per grant is the one production pays.
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
struct W {
    #[command(flatten)]
    serve: ServeArgs,
}

const ADMIN: &str = "admin-token-0123456789abcdef-0123456789";
const CLUSTER: &str = "cluster-key-0123456789abcdef-0123456789";
const SHK: &str = "selfhostedkey_0123456789abcdef_ABCDEF";

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url_arg = args.get(1).cloned().unwrap_or_else(|| "sqlite".into());
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let clients: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);
    let nhosts: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(200);
    let rounds: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(3);
    let lane: usize = args
        .get(6)
        .and_then(|s| s.parse().ok())
        .unwrap_or(clients)
        .clamp(1, 100);
    println!(
        "machine cpus={} loadavg_before={}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let mut summary = Vec::new();
    if url_arg != "sqlite" {
        for tool in ["pgbench", "createdb", "dropdb"] {
            if !on_path(tool) {
                eprintln!(
                    "{tool} not found: on Debian 12 pgbench comes with postgresql-15, \
                     createdb and dropdb with postgresql-client-15 (apt-get install ...)"
                );
                std::process::exit(2);
            }
        }
        let scratch = Scratch {
            maintenance_url: url_arg.clone(),
            names: vec![format!("orca_bench_{id}"), format!("orca_pgbench_{id}")],
        };
        for name in &scratch.names {
            run_tool("createdb", &[&format!("--maintenance-db={url_arg}"), name]).await;
        }
        let relay_url = with_database(&url_arg, &scratch.names[0]);
        let pgbench_url = with_database(&url_arg, &scratch.names[1]);
        run_tool("pgbench", &["-i", "-q", "-s", "1", &pgbench_url]).await;
        let bench = Bench::start(&relay_url, clients, nhosts, lane).await;
        let tick = bench.tick;
        let (mut tps, mut rps) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let pgbench_first = round % 2 == 1;
            let mut t = 0.0;
            let mut r = None;
            for step in 0..2 {
                if (step == 0) == pgbench_first {
                    let (tps, own, backends) =
                        pgbench(&pgbench_url, &scratch.names[1], clients, secs, tick).await;
                    t = tps;
                    println!(
                        "phase=pgbench round={round} clients={clients} seconds={secs} tps={t:.0} \
                         cpu_us_per_txn: pgbench={own:.0} postgres_backends={backends:.0}"
                    );
                } else {
                    let p = bench.phase(secs, true).await;
                    p.print("postgres", round);
                    r = Some(p.rps);
                }
            }
            let r = r.expect("assign phase ran");
            println!(
                "phase=ratio round={round} assign_rps={r:.0} pgbench_tps={t:.0} ratio={:.1}%",
                100.0 * r / t
            );
            tps.push(t);
            rps.push(r);
        }
        // The non-sticky path on the same rows (placement lane, plain `assign`), once.
        let p = bench.phase(secs, false).await;
        p.print("postgres-placement-lane", 1);
        bench.stop().await;
        drop(scratch);
        let (t, r) = (median(&mut tps), median(&mut rps));
        summary.push(format!(
            "summary backend=postgres clients={clients} sticky_concurrency={lane} hosts={nhosts} seconds={secs} rounds={rounds} \
             median_assign_rps={r:.0} median_pgbench_tps={t:.0} ratio_of_medians={:.1}%",
            100.0 * r / t
        ));
    }
    let dir = std::env::temp_dir().join(format!("assign-bench-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite_url = format!("sqlite://{}/bench.sqlite3", dir.display());
    let bench = Bench::start(&sqlite_url, clients, nhosts, lane).await;
    let mut rps = Vec::new();
    for round in 1..=rounds {
        let p = bench.phase(secs, true).await;
        p.print("sqlite", round);
        rps.push(p.rps);
    }
    let p = bench.phase(secs, false).await;
    p.print("sqlite-placement-lane", 1);
    bench.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    summary.push(format!(
        "summary backend=sqlite clients={clients} sticky_concurrency={lane} hosts={nhosts} seconds={secs} rounds={rounds} median_assign_rps={:.0}",
        median(&mut rps)
    ));
    for line in summary {
        println!("{line}");
    }
    println!("machine loadavg_after={}", loadavg());
}

/// A director with its cells and placed hosts.
struct Bench {
    run: Running,
    /// Heartbeats the three cells every 5 s.
    beats: tokio::task::JoinHandle<()>,
    base: String,
    hosts: Arc<Vec<(String, String)>>,
    clients: usize,
    /// The load generator's own runtime (threads named `loadgen`, 2 workers) and HTTP client, so
    /// its CPU is told apart from the relay's.
    loadgen: tokio::runtime::Runtime,
    http: reqwest::Client,
    /// The director's database name on a local Postgres (for its backends' CPU), if any.
    database: Option<String>,
    tick: f64,
}

/// One assign phase's figures.
struct Phase {
    clients: usize,
    hosts: usize,
    elapsed: f64,
    ok: usize,
    errors: u64,
    rps: f64,
    p50: Duration,
    p99: Duration,
    cpu: Cpu,
    postgres_cpu: f64,
}

impl Phase {
    fn print(&self, backend: &str, round: usize) {
        let per = |s: f64| 1e6 * s / self.ok.max(1) as f64;
        println!(
            "phase=assign backend={backend} round={round} clients={} hosts={} seconds={:.1} ok={} errors={} rps={:.0} p50={:?} p99={:?} \
             cpu_us_per_req: relay={:.0} loadgen={:.0} postgres_backends={:.0}",
            self.clients,
            self.hosts,
            self.elapsed,
            self.ok,
            self.errors,
            self.rps,
            self.p50,
            self.p99,
            per(self.cpu.relay),
            per(self.cpu.loadgen),
            per(self.postgres_cpu),
        );
    }
}

impl Bench {
    async fn start(url: &str, clients: usize, nhosts: usize, lane: usize) -> Bench {
        let dir = std::env::temp_dir().join(format!(
            "assign-bench-data-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let concurrency = lane.to_string();
        let pool = (2 * lane + 8).to_string();
        let w = W::try_parse_from([
            "x",
            "--role",
            "director",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            url,
            "--data-dir",
            dir.to_str().unwrap(),
            "--assignment-signing-key",
            "assignment-signing-key-0123456789abcdef",
            "--self-hosted-key",
            SHK,
            "--admin-token",
            ADMIN,
            "--cluster-key",
            CLUSTER,
            "--public-sticky-concurrency",
            &concurrency,
            "--public-assignment-concurrency",
            &concurrency,
            "--database-pool-max",
            &pool,
        ])
        .unwrap();
        let run = orca_relay::server::start(Config::from_args(&w.serve).unwrap())
            .await
            .unwrap();
        let d = run.director.clone().unwrap();
        d.sticky_lane.set_interval(Duration::from_millis(1));
        d.placement_lane.set_interval(Duration::from_millis(1));
        let base = format!("http://{}", run.addr);
        let http = reqwest::Client::new();
        let cells: Vec<(&str, &str, String)> = [
            ("a", "us-central1"),
            ("b", "us-central1"),
            ("c", "asia-east2"),
        ]
        .into_iter()
        .map(|(id, region)| (id, region, uuid::Uuid::new_v4().to_string()))
        .collect();
        for (id, region, _) in &cells {
            let url = format!("https://{id}.bench.test");
            let r = http
                .post(format!("{base}/v1/admin/cells"))
                .bearer_auth(ADMIN)
                .json(&json!({"v":1,"cellId":id,"cellUrl":url,"region":region,"capacityRequests":1000000}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{}", r.status());
        }
        assert!(heartbeat(&http, &base, &cells).await, "heartbeats refused");
        // The cells stay live for the whole run (a heartbeat older than the TTL is not fresh).
        let beats = {
            let (http, base) = (http.clone(), base.clone());
            let cells: Vec<(String, String, String)> = cells
                .iter()
                .map(|(a, b, c)| (a.to_string(), b.to_string(), c.clone()))
                .collect();
            tokio::spawn(async move {
                let cells: Vec<(&str, &str, String)> = cells
                    .iter()
                    .map(|(a, b, c)| (a.as_str(), b.as_str(), c.clone()))
                    .collect();
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    if !heartbeat(&http, &base, &cells).await {
                        eprintln!("a cell heartbeat was refused");
                    }
                }
            })
        };
        let mut hosts = Vec::new();
        for i in 0..nhosts {
            let key: [u8; 32] = rand::random();
            let id = orca_relay::crypto::ident::relay_host_id(&key);
            let r: serde_json::Value = http
                .post(format!("{base}/v1/host-token"))
                .bearer_auth(SHK)
                .json(&json!({"relayHostId":id,"hostPublicKeyB64":orca_relay::crypto::b64::std_encode(&key),"userId":format!("u{i}")}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let token = r["relayToken"].as_str().unwrap().to_string();
            let r = http
                .post(format!("{base}/v1/assign"))
                .bearer_auth(&token)
                .json(&json!({"v":1,"relayHostId":id}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            hosts.push((id, token));
        }
        let _ = std::fs::remove_dir_all(dir);
        let loadgen = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("loadgen")
            .enable_all()
            .build()
            .unwrap();
        let database = url.starts_with("postgres").then(|| {
            url.rsplit('/')
                .next()
                .unwrap_or("")
                .split('?')
                .next()
                .unwrap_or("")
                .to_string()
        });
        Bench {
            run,
            beats,
            base,
            hosts: Arc::new(hosts),
            clients,
            loadgen,
            http: reqwest::Client::new(),
            database,
            tick: clock_tick(),
        }
    }

    /// `clients` concurrent clients send assigns for `secs`: sticky reconnects (`hinted`), or
    /// plain assigns of the same placed hosts, which take the placement lane.
    async fn phase(&self, secs: u64, hinted: bool) -> Phase {
        let clients = self.clients;
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = self
            .database
            .as_deref()
            .map(|d| BackendCpu::start(d, self.tick));
        let cpu0 = cpu_now(self.tick);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (hosts, stop, http) = (self.hosts.clone(), stop.clone(), self.http.clone());
            let url = format!("{}/v1/assign", self.base);
            tasks.push(self.loadgen.spawn(async move {
                let bodies: Vec<bytes::Bytes> = hosts
                    .iter()
                    .map(|(id, _)| {
                        let body = if hinted {
                            json!({"v":1,"relayHostId":id,"reconnect":true})
                        } else {
                            json!({"v":1,"relayHostId":id})
                        };
                        serde_json::to_vec(&body).unwrap().into()
                    })
                    .collect();
                let mut lat = Vec::new();
                let mut errors = 0u64;
                let mut i = c;
                while !stop.load(Ordering::Relaxed) {
                    let n = i % hosts.len();
                    i += clients;
                    let t = Instant::now();
                    let r = http
                        .post(&url)
                        .bearer_auth(&hosts[n].1)
                        .header("content-type", "application/json")
                        .body(bodies[n].clone())
                        .send()
                        .await
                        .unwrap();
                    let ok = r.status() == 200;
                    let _ = r.bytes().await;
                    if ok {
                        lat.push(t.elapsed());
                    } else {
                        errors += 1;
                    }
                }
                (lat, errors)
            }));
        }
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        let mut errors = 0;
        for t in tasks {
            let (l, e) = t.await.unwrap();
            all.extend(l);
            errors += e;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = cpu_now(self.tick) - cpu0;
        let postgres_cpu = match sampler {
            Some(s) => s.stop().await,
            None => 0.0,
        };
        all.sort();
        let p = |q: f64| {
            all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Phase {
            clients,
            hosts: self.hosts.len(),
            elapsed,
            ok: all.len(),
            errors,
            rps: all.len() as f64 / elapsed,
            p50: p(0.50),
            p99: p(0.99),
            cpu,
            postgres_cpu,
        }
    }

    async fn stop(self) {
        self.beats.abort();
        self.loadgen.shutdown_background();
        self.run.shutdown().await;
    }
}

/// One heartbeat per cell (ready, same incarnation every time); whether all were accepted.
async fn heartbeat(http: &reqwest::Client, base: &str, cells: &[(&str, &str, String)]) -> bool {
    let mut ok = true;
    for (id, region, incarnation) in cells {
        let tok = orca_relay::crypto::jwt::mint_cluster_token(
            CLUSTER.as_bytes(),
            id,
            orca_relay::clock::now_ms(),
        );
        let r = http
            .post(format!("{base}/v1/admin/cell-heartbeat"))
            .bearer_auth(tok)
            .json(&json!({"v":1,"cellId":id,"cellUrl":format!("https://{id}.bench.test"),"region":region,
                "cellIncarnation":incarnation,"startedAt":1,"ready":true,"observedRequests":0}))
            .send()
            .await;
        ok &= r.is_ok_and(|r| r.status() == 200);
    }
    ok
}

/// The scratch databases; dropped (with `dropdb`) when this goes out of scope, panics included.
struct Scratch {
    maintenance_url: String,
    names: Vec<String>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for name in &self.names {
            let ok = std::process::Command::new("dropdb")
                .args([
                    "--if-exists",
                    "--force",
                    &format!("--maintenance-db={}", self.maintenance_url),
                    name,
                ])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("could not drop scratch database {name}");
            }
        }
    }
}

/// `url` with its database replaced by `name` (query string kept).
fn with_database(url: &str, name: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let (head, rest) = url.split_at(scheme_end);
    let query = rest.find('?').map_or("", |i| &rest[i..]);
    let authority = rest[..rest.len() - query.len()]
        .split('/')
        .next()
        .unwrap_or("");
    format!("{head}{authority}/{name}{query}")
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Runs a client tool to completion; its failure ends the bench (the scratch guard cleans up).
async fn run_tool(tool: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `pgbench -N -c <clients> -j 2 -T <secs>` on `database`: its TPS (without the initial
/// connection time) and CPU µs per transaction of pgbench itself and of its backends.
async fn pgbench(
    url: &str,
    database: &str,
    clients: usize,
    secs: u64,
    tick: f64,
) -> (f64, f64, f64) {
    let c = clients.to_string();
    let t = secs.to_string();
    let sampler = BackendCpu::start(database, tick);
    let cpu0 = cpu_now(tick);
    let out = run_tool("pgbench", &["-N", "-c", &c, "-j", "2", "-T", &t, url]).await;
    let cpu = cpu_now(tick) - cpu0;
    let backends = sampler.stop().await;
    let tps: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no tps line in pgbench's output:\n{out}"));
    let txns = (tps * secs as f64).max(1.0);
    (tps, 1e6 * cpu.children / txns, 1e6 * backends / txns)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

/// CPU seconds of this process's threads, split into the load generator's (threads named
/// `loadgen`) and the rest (the relay), and of the children it has waited for (pgbench).
#[derive(Clone, Copy, Default)]
struct Cpu {
    relay: f64,
    loadgen: f64,
    children: f64,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, o: Cpu) -> Cpu {
        Cpu {
            relay: self.relay - o.relay,
            loadgen: self.loadgen - o.loadgen,
            children: self.children - o.children,
        }
    }
}

/// `(comm, utime + stime, cutime + cstime)` in seconds from a `/proc/.../stat` file.
fn stat_times(path: &std::path::Path, tick: f64) -> Option<(String, f64, f64)> {
    let s = std::fs::read_to_string(path).ok()?;
    let (open, close) = (s.find('(')?, s.rfind(')')?);
    let comm = s[open + 1..close].to_string();
    // The fields after the comm start at field 3 (state); utime is field 14.
    let f: Vec<&str> = s[close + 2..].split_whitespace().collect();
    let n = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Some((comm, (n(14) + n(15)) / tick, (n(16) + n(17)) / tick))
}

fn clock_tick() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn cpu_now(tick: f64) -> Cpu {
    let (_, total, children) = stat_times("/proc/self/stat".as_ref(), tick).unwrap_or_default();
    let (mut loadgen, mut sampler) = (0.0, 0.0);
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Some((comm, own, _)) = stat_times(&t.path().join("stat"), tick) {
                if comm.starts_with("loadgen") {
                    loadgen += own;
                } else if comm.starts_with("cpusampler") {
                    sampler += own;
                }
            }
        }
    }
    Cpu {
        relay: total - loadgen - sampler,
        loadgen,
        children,
    }
}

/// CPU seconds of the local Postgres backends serving `database` (their command line names it),
/// sampled every 100 ms by a thread of its own (`cpusampler`, not counted as the relay's) until
/// stopped; `/proc` is rescanned for new backends every second. Each backend counts from its first
/// sample (from birth if it started during the phase) to its last, so one that exits loses at most
/// its last 100 ms. 0 when the server is not local.
struct BackendCpu {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<f64>,
}

impl BackendCpu {
    fn start(database: &str, tick: f64) -> BackendCpu {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, needle) = (stop.clone(), format!(" {database} "));
        let thread = std::thread::Builder::new()
            .name("cpusampler".into())
            .spawn(move || {
                let mut seen: std::collections::HashMap<u32, (f64, f64)> = Default::default();
                let mut round = 0u64;
                loop {
                    let last = flag.load(Ordering::Relaxed);
                    if round % 10 == 0 {
                        for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                            let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
                                continue;
                            };
                            if seen.contains_key(&pid) {
                                continue;
                            }
                            let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
                            if !String::from_utf8_lossy(&cmd).contains(&needle) {
                                continue;
                            }
                            if let Some((_, own, _)) = stat_times(&p.path().join("stat"), tick) {
                                seen.insert(pid, (if round == 0 { own } else { 0.0 }, own));
                            }
                        }
                    }
                    for (pid, (_, latest)) in seen.iter_mut() {
                        let path = format!("/proc/{pid}/stat");
                        if let Some((_, own, _)) = stat_times(path.as_ref(), tick) {
                            *latest = own;
                        }
                    }
                    if last {
                        return seen.values().map(|(a, b)| b - a).sum();
                    }
                    round += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
            .expect("sampler thread");
        BackendCpu { stop, thread }
    }

    async fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join().unwrap_or(0.0))
            .await
            .unwrap_or(0.0)
    }
}
