//! The side-by-side relay comparison of issue 12, in one go: orca-relay (release build), the
//! minimal Node.js `ws` relay (`examples/node_relay`), a raw C epoll relay
//! (`examples/c_relay/relay.c`, compiled here with `cc -O2`) and no relay at all (the load
//! generator's own loopback floor), each measured by the same load generator (`examples/loadgen`):
//! 64 B frames/s and 16 KiB MB/s with `--pairs` pairs and `--inflight` frames in flight per pair and
//! direction, then one-way latency with `--latency-pairs` pairs at `--latency-rate` messages/s per
//! pair and direction (10 × 50 × 2 = 1,000 msgs/s). Every relay is pinned to one core and the load
//! generator to the other (`taskset`, when present), one relay process at a time, and the rounds
//! rotate the order so each relay sees the same machine. Prints a table of medians over the rounds
//! (stdout) and every round's JSON (stderr, one line per measurement).
//!
//! ```text
//! cargo run --release --example compare                  # 3 rounds, everything
//! cargo run --release --example compare -- --rounds 5 --only ours,node --ours-env TOKIO_WORKER_THREADS=2
//! # before/after: an earlier commit's binary beside this one, throughput under SCHED_FIFO too
//! cargo run --release --example compare -- --only ours --base-bin /path/to/old/orca-relay --rt-throughput 1
//! # the splice over TLS beside plain (ours over its own TLS listener, a test CA made for the run),
//! # before/after: prints ours/base per relay CPU-second against the C relay and TLS/plain ratios
//! cargo run --release --example compare -- --only ours,c --tls 1 --base-bin /path/to/old/orca-relay
//! # latency only (no throughput phase), e.g. five rounds against Node and the C relay
//! cargo run --release --example compare -- --skip-throughput 1 --rounds 5 --only ours,node,c
//! ```
//! It builds `orca-relay` and `loadgen` itself (`cargo build --release`, the binary without the
//! test-only features examples turn on), runs `npm ci` in `examples/node_relay` when its
//! `node_modules` is missing, and skips (with a note) a relay whose toolchain is absent.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

const SIGNING: &str = "compare-bench-signing-key-0123456789abcdef";
/// `ours`: `--role all` (the single-node default); `cell`: `--role director,cell` (no push worker);
/// `node`, `c`: the plain relays; `none`: the load generator against itself; `base`: `--role all`
/// from the binary `--base-bin` names (a build of an earlier commit), for before/after figures;
/// `tls`, `base-tls`: `ours` and `base` over their own TLS listener (`wss://`, a test CA made for
/// the run, ECDSA P-256), added by `--tls 1`.
const KINDS: [&str; 8] = [
    "ours", "cell", "node", "c", "none", "base", "tls", "base-tls",
];

struct Args {
    rounds: usize,
    pairs: usize,
    inflight: usize,
    seconds: u64,
    latency_pairs: usize,
    latency_rate: u64,
    latency_seconds: u64,
    relay_core: usize,
    loadgen_core: usize,
    only: Vec<String>,
    ours_env: Vec<(String, String)>,
    build: bool,
    /// Niceness for the relays and the load generator (`nice -n`; negative needs root): on a
    /// shared machine it keeps other processes' CPU bursts out of the measured tail, equally for
    /// every relay.
    nice: i32,
    /// SCHED_FIFO priority of the second latency run (relay and load generator), 0 = none: the
    /// relays' own tails without other processes' time slices in them (needs root).
    rt: u32,
    /// The throughput phase under SCHED_FIFO as well (`--rt-throughput 1`): on a machine shared
    /// with builds, the relay's core and the generator's are then theirs alone, so two builds of
    /// the relay can be compared by frames/s and not by how much CPU each happened to get.
    rt_throughput: bool,
    /// `orca-relay` of an earlier commit: adds the `base` relay.
    base_bin: Option<PathBuf>,
    /// Latency runs only (`--skip-throughput 1`): a latency before/after in a fraction of the time,
    /// and without the throughput phase's allocation peaks in the relay before it is measured.
    skip_throughput: bool,
    /// `--tls 1`: adds `tls` (and `base-tls` with `--base-bin`), ours over `wss://`.
    tls: bool,
}

fn args() -> Args {
    let mut a = Args {
        rounds: 3,
        pairs: 100,
        inflight: 16,
        seconds: 4,
        latency_pairs: 10,
        latency_rate: 50,
        latency_seconds: 10,
        relay_core: 0,
        loadgen_core: 1,
        only: KINDS[..5].iter().map(|k| k.to_string()).collect(),
        ours_env: Vec::new(),
        build: true,
        nice: 0,
        rt: 5,
        rt_throughput: false,
        base_bin: None,
        skip_throughput: false,
        tls: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        let num = |what: &str| -> u64 { v.parse().unwrap_or_else(|_| panic!("{what}: a number")) };
        match argv[i].as_str() {
            "--rounds" => a.rounds = num("--rounds") as usize,
            "--pairs" => a.pairs = num("--pairs") as usize,
            "--inflight" => a.inflight = num("--inflight") as usize,
            "--seconds" => a.seconds = num("--seconds"),
            "--latency-pairs" => a.latency_pairs = num("--latency-pairs") as usize,
            "--latency-rate" => a.latency_rate = num("--latency-rate"),
            "--latency-seconds" => a.latency_seconds = num("--latency-seconds"),
            "--relay-core" => a.relay_core = num("--relay-core") as usize,
            "--loadgen-core" => a.loadgen_core = num("--loadgen-core") as usize,
            "--only" => a.only = v.split(',').map(String::from).collect(),
            "--ours-env" => {
                let (k, val) = v.split_once('=').expect("--ours-env K=V");
                a.ours_env.push((k.into(), val.into()));
            }
            "--build" => a.build = v != "0",
            "--nice" => a.nice = v.parse().expect("--nice: an integer"),
            "--rt" => a.rt = num("--rt") as u32,
            "--rt-throughput" => a.rt_throughput = v != "0",
            "--base-bin" => a.base_bin = Some(PathBuf::from(&v)),
            "--skip-throughput" => a.skip_throughput = v != "0",
            "--tls" => a.tls = v != "0",
            other => panic!("unknown flag {other}"),
        }
        i += 2;
    }
    for r in &a.only {
        assert!(
            KINDS.contains(&r.as_str()),
            "--only takes a comma list of ours,cell,node,c,none,base,tls,base-tls"
        );
    }
    let mut add = |k: &str| {
        if !a.only.iter().any(|o| o == k) {
            a.only.push(k.into());
        }
    };
    if a.base_bin.is_some() {
        add("base");
    }
    if a.tls {
        add("tls");
        if a.base_bin.is_some() {
            add("base-tls");
        }
    }
    assert!(
        a.base_bin.is_some() || !a.only.iter().any(|k| k.starts_with("base")),
        "the base relay needs --base-bin PATH"
    );
    a
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(status.success(), "{what} failed: {status}");
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// A relay process; killed on drop.
struct Relay {
    child: Child,
    /// `http://…` for orca-relay, `ws://…` for the plain relays.
    url: String,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `program` pinned to `core` with taskset (when `pin`), at niceness `nice` (when not 0).
fn pinned(pin: bool, nice: i32, core: usize, program: &Path) -> Command {
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if nice != 0 {
        argv.extend(["nice".into(), "-n".into(), nice.to_string().into()]);
    }
    if pin {
        argv.extend(["taskset".into(), "-c".into(), core.to_string().into()]);
    }
    argv.push(program.into());
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..]);
    c
}

/// Waits for the first line of `stream` containing `marker`; returns what follows it.
fn wait_for_line(stream: impl Read + Send + 'static, marker: &'static str) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if !sent {
                if let Some(i) = line.find(marker) {
                    let _ = tx.send(line[i + marker.len()..].trim().to_string());
                    sent = true;
                }
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("relay did not print {marker:?}"))
}

struct Paths {
    root: PathBuf,
    /// The run's test CA (PEM) and the certificate and key it issued for 127.0.0.1.
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    orca: PathBuf,
    loadgen: PathBuf,
    c_relay: PathBuf,
}

fn start(kind: &str, a: &Args, p: &Paths, pin: bool) -> Option<Relay> {
    match kind {
        "ours" | "cell" | "base" | "tls" | "base-tls" => {
            let dir = tempfile::tempdir().expect("temp dir");
            let bin = match (kind, &a.base_bin) {
                ("base" | "base-tls", Some(b)) => b.as_path(),
                _ => p.orca.as_path(),
            };
            let mut cmd = pinned(pin, a.nice, a.relay_core, bin);
            cmd.env_clear();
            if kind == "cell" {
                cmd.env("ORCA_RELAY_ROLE", "director,cell")
                    .env(
                        "ORCA_RELAY_CLUSTER_KEY",
                        "compare-bench-cluster-key-0123456789abcdef",
                    )
                    .env(
                        "ORCA_RELAY_ADMIN_TOKEN",
                        "compare-bench-admin-token-0123456789abcdef",
                    );
            }
            if kind.ends_with("tls") {
                cmd.env("ORCA_RELAY_TLS_CERT", &p.cert)
                    .env("ORCA_RELAY_TLS_KEY", &p.key);
            }
            cmd.arg("serve")
                .current_dir(dir.path())
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("RUST_LOG", "warn,orca_relay=info")
                .env("ORCA_RELAY_LISTEN", "127.0.0.1:0")
                .env("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING)
                .env("ORCA_RELAY_TRUSTED_PROXY_HOPS", "1")
                .envs(a.ours_env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = cmd.spawn().expect("spawn orca-relay");
            let stderr = child.stderr.take().unwrap();
            // Owned before waiting: a relay that never starts is still killed (on unwind).
            let mut relay = Relay {
                child,
                url: String::new(),
                _dir: Some(dir),
            };
            relay.url = wait_for_line(stderr, "listening on ");
            Some(relay)
        }
        "node" | "c" => {
            let mut cmd = if kind == "node" {
                let mut c = pinned(pin, a.nice, a.relay_core, Path::new("node"));
                c.arg("relay.js")
                    .current_dir(p.root.join("examples/node_relay"))
                    .env("PORT", "0");
                c
            } else {
                let mut c = pinned(pin, a.nice, a.relay_core, &p.c_relay);
                c.arg("0");
                c
            };
            cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
            let mut child = cmd.spawn().ok()?;
            let stdout = child.stdout.take().unwrap();
            let mut relay = Relay {
                child,
                url: String::new(),
                _dir: None,
            };
            relay.url = format!("ws://127.0.0.1:{}", wait_for_line(stdout, "listening on "));
            Some(relay)
        }
        _ => None,
    }
}

/// Which part of the load generator's work a run does.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Throughput,
    Latency,
    /// Latency with the relay and the load generator under SCHED_FIFO.
    LatencyRt,
}

/// One load generator run against `relay` (or none); its JSON report.
fn measure(
    kind: &str,
    phase: Phase,
    relay: Option<&Relay>,
    a: &Args,
    p: &Paths,
    pin: bool,
) -> Value {
    let s = |v: &dyn ToString| v.to_string();
    let fifo = phase == Phase::LatencyRt || (phase == Phase::Throughput && a.rt_throughput);
    let mut cmd = if fifo {
        if let Some(r) = relay {
            // Every thread of the running relay (threads it starts later inherit the policy).
            run(
                Command::new("chrt")
                    .args(["-a", "-f", "-p", &s(&a.rt), &s(&r.child.id())])
                    .stdout(Stdio::null()),
                "chrt -p (the relay)",
            );
        }
        let mut c = Command::new("chrt");
        c.args(["-f", &s(&a.rt)]);
        if pin {
            c.args(["taskset", "-c", &s(&a.loadgen_core)]);
        }
        c.arg(&p.loadgen);
        c
    } else {
        pinned(pin, a.nice, a.loadgen_core, &p.loadgen)
    };
    cmd.args(["--inflight", &s(&a.inflight)])
        .args(["--seconds", &s(&a.seconds)])
        .args(["--latency-rate", &s(&a.latency_rate)])
        .args(["--latency-seconds", &s(&a.latency_seconds)]);
    match phase {
        Phase::Throughput => cmd.args(["--pairs", &s(&a.pairs), "--skip-latency", "1"]),
        _ => cmd.args(["--pairs", &s(&a.latency_pairs), "--skip-throughput", "1"]),
    };
    match (kind, relay) {
        ("ours" | "cell" | "base", Some(r)) => {
            cmd.args(["--url", &r.url, "--signing-key", SIGNING]);
        }
        ("tls" | "base-tls", Some(r)) => {
            cmd.args(["--url", &r.url, "--signing-key", SIGNING]);
            cmd.arg("--ca").arg(&p.ca);
        }
        (_, Some(r)) => {
            cmd.args(["--plain-url", &r.url]);
        }
        _ => {
            cmd.args(["--no-relay", "1"]);
        }
    }
    if let Some(r) = relay {
        cmd.args(["--server-pid", &s(&r.child.id())]);
    }
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .expect("run the load generator");
    assert!(
        out.status.success(),
        "loadgen against {kind} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("loadgen JSON")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let a = args();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    let certs = tempfile::tempdir().expect("temp dir");
    let (ca, cert, key) = test_ca(certs.path());
    let p = Paths {
        ca,
        cert,
        key,
        orca: target.join("release/orca-relay"),
        loadgen: target.join("release/examples/loadgen"),
        c_relay: target.join("release/c_relay"),
        root: root.clone(),
    };
    let mut kinds = a.only.clone();
    if a.build {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        // Two builds: built together, the binary would link the library with the features the
        // examples' dev-dependency turns on (the test clock).
        for what in [&["--bin", "orca-relay"][..], &["--example", "loadgen"][..]] {
            run(
                Command::new(&cargo)
                    .args(["build", "--release", "--locked"])
                    .args(what)
                    .current_dir(&root),
                "cargo build",
            );
        }
    }
    if kinds.iter().any(|k| k == "node") {
        let dir = root.join("examples/node_relay");
        if !have("node") || !have("npm") {
            eprintln!("note: node/npm not found, the Node relay is skipped");
            kinds.retain(|k| k != "node");
        } else if !dir.join("node_modules/ws").exists() {
            run(
                Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund"])
                    .current_dir(&dir),
                "npm ci (examples/node_relay)",
            );
        }
    }
    if kinds.iter().any(|k| k == "c") {
        if have("cc") {
            run(
                Command::new("cc")
                    .args(["-O2", "-Wall", "-o"])
                    .arg(&p.c_relay)
                    .arg(root.join("examples/c_relay/relay.c")),
                "cc examples/c_relay/relay.c",
            );
        } else {
            eprintln!("note: cc not found, the C relay is skipped");
            kinds.retain(|k| k != "c");
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = have("taskset") && cores >= 2 && a.relay_core != a.loadgen_core;
    if !pin {
        eprintln!("note: not pinned (taskset missing or fewer than 2 cores)");
    }
    // SCHED_FIFO needs the privilege; without it the second latency run is skipped.
    let mut rt = a.rt;
    if rt > 0
        && !Command::new("chrt")
            .args(["-f", &rt.to_string(), "true"])
            .status()
            .is_ok_and(|s| s.success())
    {
        eprintln!("note: chrt -f {rt} not permitted here, the SCHED_FIFO latency run is skipped");
        rt = 0;
    }
    // (index in `results`, phase): the table reads the throughput at 0, latency at 1, FIFO at 2.
    let phases: Vec<(usize, Phase)> = [Phase::Throughput, Phase::Latency, Phase::LatencyRt]
        .into_iter()
        .enumerate()
        .filter(|&(_, ph)| !(ph == Phase::Throughput && a.skip_throughput))
        .filter(|&(_, ph)| ph != Phase::LatencyRt || rt > 0)
        .collect();
    let a = Args {
        rt,
        rt_throughput: a.rt_throughput && rt > 0,
        ..a
    };
    let load_before = loadavg();
    // results[kind][phase] = one report per round
    let mut results: Vec<Vec<Vec<Value>>> = vec![vec![Vec::new(); 3]; kinds.len()];
    for round in 0..a.rounds {
        // Rotate the order so no relay always runs first (or right after a build).
        for i in 0..kinds.len() {
            let k = (i + round) % kinds.len();
            let kind = kinds[k].as_str();
            let relay = start(kind, &a, &p, pin);
            for &(pi, phase) in &phases {
                let r = measure(kind, phase, relay.as_ref(), &a, &p, pin);
                eprintln!("round {round} {kind} phase {pi}: {r}");
                results[k][pi].push(r);
            }
            drop(relay);
        }
    }
    let label = |k: &str| match k {
        "ours" => "orca-relay (role all)",
        "cell" => "orca-relay (director+cell)",
        "base" => "orca-relay base (role all)",
        "tls" => "orca-relay over TLS",
        "base-tls" => "orca-relay base over TLS",
        "node" => "Node.js ws",
        "c" => "C epoll",
        _ => "no relay (loadgen floor)",
    };
    println!(
        "side by side, medians of {} rounds; relay on core {}, loadgen on core {}{}, nice {}; load average {} before, {} after",
        a.rounds,
        a.relay_core,
        a.loadgen_core,
        if pin { "" } else { " (NOT pinned)" },
        a.nice,
        load_before,
        loadavg(),
    );
    let cell = |v: f64, digits: usize| {
        if v.is_nan() || v == 0.0 {
            "-".to_string()
        } else {
            format!("{v:.digits$}")
        }
    };
    let rule = |widths: &[usize]| {
        let parts: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
        println!("|{}|", parts.join("|"));
    };
    let pick = |rounds: &[Value], path: &[&str]| -> f64 {
        let mut v: Vec<f64> = rounds
            .iter()
            .filter_map(|r| {
                path.iter()
                    .try_fold(r, |v, k| match k.parse::<usize>() {
                        Ok(i) => v.get(i),
                        Err(_) => v.get(k),
                    })?
                    .as_f64()
            })
            .collect();
        median(&mut v)
    };
    println!(
        "\nthroughput: {} pairs x {} frames in flight per direction, {} s per size{}",
        a.pairs,
        a.inflight,
        a.seconds,
        if a.rt_throughput {
            format!(", relay and load generator under SCHED_FIFO {}", a.rt)
        } else {
            String::new()
        }
    );
    println!(
        "| {:<26} | {:>11} | {:>14} | {:>11} | {:>14} |",
        "relay", "64 B fr/s", "64 B fr/CPU-s", "16 KiB MB/s", "16 KiB fr/CPU-s"
    );
    rule(&[26, 11, 14, 11, 14]);
    let mut summary = serde_json::Map::new();
    for (k, kind) in kinds.iter().enumerate() {
        let t = &results[k][0];
        let v = [
            pick(t, &["throughput64B", "framesPerSecond"]),
            pick(t, &["throughput64B", "framesPerServerCpuSecond"]),
            pick(t, &["throughput16KiB", "megabytesPerSecond"]),
            pick(t, &["throughput16KiB", "framesPerServerCpuSecond"]),
        ];
        println!(
            "| {:<26} | {:>11} | {:>14} | {:>11} | {:>14} |",
            label(kind),
            cell(v[0], 0),
            cell(v[1], 0),
            cell(v[2], 1),
            cell(v[3], 0)
        );
        summary.insert(
            kind.clone(),
            json!({"framesPerSecond64B": v[0], "framesPerRelayCpuSecond64B": v[1],
                   "megabytesPerSecond16KiB": v[2], "framesPerRelayCpuSecond16KiB": v[3]}),
        );
    }
    ratios(&summary);
    println!(
        "\none-way latency: {} pairs x {} msgs/s x 2 directions = {} msgs/s, {} s per run, senders spread evenly over the period",
        a.latency_pairs,
        a.latency_rate,
        a.latency_pairs as u64 * a.latency_rate * 2,
        a.latency_seconds
    );
    let mut heads = vec!["p50 µs", "p99 µs", "p999 µs", "invol. cs"];
    if rt > 0 {
        heads.extend(["FIFO p50", "FIFO p99", "FIFO p999"]);
    }
    print!("| {:<26} |", "relay");
    for h in &heads {
        print!(" {h:>10} |");
    }
    println!();
    rule(
        &std::iter::once(26)
            .chain(heads.iter().map(|_| 10))
            .collect::<Vec<_>>(),
    );
    for (k, kind) in kinds.iter().enumerate() {
        let lat = |pi: usize, key: &str| pick(&results[k][pi], &["latency", "rounds", "0", key]);
        let mut v = vec![
            lat(1, "p50Micros"),
            lat(1, "p99Micros"),
            lat(1, "p999Micros"),
            lat(1, "serverInvoluntaryContextSwitches"),
        ];
        if rt > 0 {
            v.extend([
                lat(2, "p50Micros"),
                lat(2, "p99Micros"),
                lat(2, "p999Micros"),
            ]);
        }
        print!("| {:<26} |", label(kind));
        for x in &v {
            print!(" {:>10} |", cell(*x, 0));
        }
        println!();
        if let Some(Value::Object(o)) = summary.get_mut(kind.as_str()) {
            o.insert("latencyMicros".into(), json!(v[..3]));
            o.insert("relayInvoluntaryContextSwitches".into(), json!(v[3]));
            if rt > 0 {
                o.insert("fifoLatencyMicros".into(), json!(v[4..]));
            }
        }
    }
    eprintln!("summary: {}", Value::Object(summary));
}

/// A CA made for this run and a certificate it issued for 127.0.0.1 (ECDSA P-256, as rcgen makes
/// by default), written to `dir`: (CA PEM, certificate chain, key).
fn test_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut cp = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    cp.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    cp.distinguished_name
        .push(DnType::CommonName, "compare bench CA");
    let ca = cp.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(cp, ca_key);
    let key = KeyPair::generate().expect("server key");
    let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let sp = CertificateParams::new(names).expect("server params");
    let cert = sp.signed_by(&key, &issuer).expect("server certificate");
    let paths = ["ca.pem", "cert.pem", "key.pem"].map(|f| dir.join(f));
    for (path, pem) in paths
        .iter()
        .zip([ca.pem(), cert.pem(), key.serialize_pem()])
    {
        std::fs::write(path, pem).expect("write a test certificate");
    }
    let [a, b, c] = paths;
    (a, b, c)
}

/// The acceptance ratios of the run's medians, where both sides were measured: ours (and base)
/// per relay CPU-second against the C relay, and over TLS against plain.
fn ratios(summary: &serde_json::Map<String, Value>) {
    let get = |k: &str, key: &str| {
        summary
            .get(k)
            .and_then(|v| v.get(key))
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    let line = |what: String, num: &str, den: &str, keys: [&str; 2]| {
        let r: Vec<String> = keys
            .iter()
            .map(|key| match (get(num, key), get(den, key)) {
                (Some(n), Some(d)) => format!("{:.2}x", n / d),
                _ => "-".into(),
            })
            .collect();
        if r.iter().any(|x| x != "-") {
            println!("{what}: 64 B {}, 16 KiB {}", r[0], r[1]);
        }
    };
    let cpu = ["framesPerRelayCpuSecond64B", "framesPerRelayCpuSecond16KiB"];
    let rate = ["framesPerSecond64B", "megabytesPerSecond16KiB"];
    println!();
    for k in ["ours", "base"] {
        line(format!("{k} / C epoll per relay CPU-second"), k, "c", cpu);
    }
    for (t, k) in [("tls", "ours"), ("base-tls", "base")] {
        line(format!("{t} / {k} per second"), t, k, rate);
        line(format!("{t} / {k} per relay CPU-second"), t, k, cpu);
    }
    if get("tls", cpu[0]).is_some() {
        record_cipher_ceiling(get("ours", cpu[0]), get("ours", cpu[1]));
    }
}

/// What the record cipher alone costs a relay per spliced frame over TLS 1.3 (one record opened
/// from the sender and one sealed to the receiver, ring's AEADs on this CPU, one thread), and the
/// best TLS/plain ratio per relay CPU-second that leaves: plain per-frame cost / (plain + cipher).
/// An upper bound, whatever the rest of the TLS path costs.
fn record_cipher_ceiling(plain64: Option<f64>, plain16k: Option<f64>) {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM};
    // A spliced frame in its record: WebSocket header (2 or 4 bytes) + payload + content type.
    let sizes = [(64 + 2 + 1, plain64), (16 * 1024 + 4 + 1, plain16k)];
    println!();
    for (name, alg) in [("AES-128-GCM", &AES_128_GCM), ("AES-256-GCM", &AES_256_GCM)] {
        let key = LessSafeKey::new(UnboundKey::new(alg, &vec![7u8; alg.key_len()]).expect("key"));
        let mut parts = Vec::new();
        for &(len, plain) in &sizes {
            let mut buf = vec![0u8; len];
            // A timing loop, not a channel: one nonce for every record is fine here.
            let nonce = || Nonce::assume_unique_for_key([1u8; 12]);
            // Enough rounds for ~0.2 s of work at either size.
            let rounds = (400_000_000 / (len * 8 + 4_000)).max(1);
            let start = std::time::Instant::now();
            for _ in 0..rounds {
                let tag = key
                    .seal_in_place_separate_tag(nonce(), Aad::empty(), &mut buf)
                    .expect("seal");
                let mut rec = std::mem::take(&mut buf);
                rec.extend_from_slice(tag.as_ref());
                let n = key
                    .open_in_place(nonce(), Aad::empty(), &mut rec)
                    .expect("open")
                    .len();
                rec.truncate(n);
                buf = rec;
            }
            let ns = start.elapsed().as_nanos() as f64 / rounds as f64;
            let ceiling = plain.map_or("-".to_string(), |fps| {
                let plain_ns = 1e9 / fps;
                format!("{:.2}x", plain_ns / (plain_ns + ns))
            });
            parts.push(format!("{} B {:.0} ns, ceiling {ceiling}", len, ns));
        }
        println!(
            "record cipher {name} open + seal per frame: {}",
            parts.join("; ")
        );
    }
}
