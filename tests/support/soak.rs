//! The churn soak (issue 11), shared by `examples/soak.rs` (10 minutes, by hand) and
//! `tests/soak_short.rs` (about a minute, in CI): an `orca-relay serve --role all` process on its
//! own SQLite file, idle hosts holding their controls, and churners that each drive one host
//! through invite → phone → data leg → a few frames each way → both legs closed, over and over;
//! every 20 pairings (under the per-host invite mint limit) the host itself leaves and a new one
//! is placed. The server's own `/metrics` (RSS, open fds, live runtime tasks) is sampled every
//! `sample_every`.
//!
//! The baseline is taken after a short warm-up round of churn and a settle (so one-time
//! allocations, the database pool and lazily built state are in it); after the load stops the
//! process must come back within the tolerance of that baseline on all three series.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use orca_relay::cell::testkit::{self, Hello, HostControl, HostIdentity};
use tokio_tungstenite::tungstenite::Message;

pub const SIGNING: &str = "soak-signing-key-soak-signing-key-0001";
pub const ADMIN: &str = "soak-admin-token-soak-admin-token-0001";
const CLUSTER: &str = "soak-cluster-key-soak-cluster-key-0001";
const PAIRINGS_PER_HOST: u64 = 20;

/// A server process with its stderr kept.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin serve --role all` on a free port over SQLite in `data_dir`, trusting one proxy
/// hop (every pair sends its own `X-Forwarded-For`, so the per-source pre-auth windows are per
/// pair, as behind a load balancer).
pub fn spawn_server(bin: &Path, data_dir: &Path) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(bin)
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("ORCA_RELAY_LISTEN", format!("127.0.0.1:{port}"))
        .env("ORCA_RELAY_PUBLIC_URL", &url)
        .env("ORCA_RELAY_DATA_DIR", data_dir)
        .env(
            "ORCA_RELAY_DATABASE_URL",
            format!("sqlite://{}/relay.sqlite3", data_dir.display()),
        )
        .env("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING)
        .env("ORCA_RELAY_ADMIN_TOKEN", ADMIN)
        .env("ORCA_RELAY_CLUSTER_KEY", CLUSTER)
        .env("ORCA_RELAY_TRUSTED_PROXY_HOPS", "1")
        .env("ORCA_RELAY_PUBLIC_ASSIGNMENT_CONCURRENCY", "4")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn orca-relay");
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on http://") {
                let _ = tx.send(());
            }
            let mut l = sink.lock().unwrap();
            // Keep the tail only: a 10-minute soak logs a lot.
            if l.len() > 10_000 {
                l.drain(..5_000);
            }
            l.push(line);
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("server did not start: {:?}", log.lock().unwrap()));
    Server { child, url, log }
}

pub struct Plan {
    pub churners: usize,
    pub idle_hosts: usize,
    pub warmup: Duration,
    pub load: Duration,
    pub sample_every: Duration,
    /// Longest wait for the process to come back after the load stops.
    pub settle: Duration,
    pub frames_per_pair: usize,
    /// Allowed distance from the baseline, as a fraction (0.10 = ±10 %).
    pub tolerance: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub t_s: u64,
    pub phase: &'static str,
    pub rss_kib: u64,
    pub fds: u64,
    pub tasks: u64,
    pub pairings: u64,
    pub failures: u64,
}

pub struct Report {
    pub series: Vec<Sample>,
    pub baseline: Sample,
    pub after: Sample,
    pub pairings: u64,
    pub failures: u64,
    pub host_moves: u64,
    pub load_s: f64,
    pub settled_in: Duration,
    pub tolerance: f64,
}

impl Report {
    /// The series as a table, one line per sample.
    pub fn print(&self) {
        println!("t_s phase    rss_kib  fds  tasks pairings failures");
        for s in &self.series {
            println!(
                "{:>4} {:<8} {:>7} {:>4} {:>6} {:>8} {:>8}",
                s.t_s, s.phase, s.rss_kib, s.fds, s.tasks, s.pairings, s.failures
            );
        }
        let pct = |a: u64, b: u64| (a as f64 - b as f64) * 100.0 / b.max(1) as f64;
        println!(
            "soak: {} pairings ({:.0}/s), {} hosts replaced, {} failed attempts in {:.0} s of load; \
             baseline rss {} KiB fds {} tasks {} -> after rss {} KiB ({:+.1} %) fds {} ({:+.1} %) tasks {} ({:+.1} %), settled in {} ms",
            self.pairings,
            self.pairings as f64 / self.load_s.max(1.0),
            self.host_moves,
            self.failures,
            self.load_s,
            self.baseline.rss_kib,
            self.baseline.fds,
            self.baseline.tasks,
            self.after.rss_kib,
            pct(self.after.rss_kib, self.baseline.rss_kib),
            self.after.fds,
            pct(self.after.fds, self.baseline.fds),
            self.after.tasks,
            pct(self.after.tasks, self.baseline.tasks),
            self.settled_in.as_millis()
        );
    }

    /// Whether the after-load sample is within the tolerance of the baseline on every series.
    pub fn returned(&self) -> Result<(), String> {
        returned(&self.baseline, &self.after, self.tolerance)
    }
}

fn returned(base: &Sample, now: &Sample, tol: f64) -> Result<(), String> {
    let check = |name: &str, b: u64, n: u64| {
        let limit = (b as f64 * tol).max(1.0);
        if (n as f64 - b as f64).abs() <= limit {
            Ok(())
        } else {
            Err(format!("{name}: baseline {b}, now {n} (±{limit:.0})"))
        }
    };
    check("rss_kib", base.rss_kib, now.rss_kib)?;
    check("fds", base.fds, now.fds)?;
    check("tasks", base.tasks, now.tasks)
}

/// RSS (KiB), open fds and live tasks from the server's own `/metrics`.
pub async fn usage(url: &str) -> (u64, u64, u64) {
    let text = reqwest::Client::new()
        .get(format!("{url}/metrics"))
        .bearer_auth(ADMIN)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    let get = |n: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(n)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{n} missing from /metrics")) as u64
    };
    (
        get("process_resident_memory_bytes") / 1024,
        get("process_open_fds"),
        get("orca_relay_runtime_alive_tasks"),
    )
}

static SOURCE: AtomicU64 = AtomicU64::new(1);

/// A distinct client source per pairing (the server trusts one proxy hop).
fn source() -> Vec<(&'static str, String)> {
    // 2 048 sources in turn: the cell's per-source table (4 096, LRU) fills during the warm-up
    // instead of growing through the measured load, and each source stays far below its
    // 30 attempts a minute.
    let n = SOURCE.fetch_add(1, Ordering::Relaxed) % 2048 + 1;
    vec![(
        "x-forwarded-for",
        format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255),
    )]
}

/// A placed host with its control open.
async fn place(url: &str, user: &str) -> Result<(HostIdentity, HostControl, String), String> {
    let host = HostIdentity::generate(user);
    let token = host.token(SIGNING, url);
    let (cell, epoch) = testkit::assign(url, &token, &host.relay_host_id).await?;
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let control = testkit::connect_control(&cell, &host, &token, url, &hello)
        .await
        .map_err(|e| format!("control {e:?}"))?;
    Ok((host, control, cell))
}

/// One pairing through `control`: invite, phone, data leg, `frames` frames each way, both closed.
async fn one_pairing(
    cell: &str,
    host: &HostIdentity,
    control: &mut HostControl,
    n: u64,
    frames: usize,
) -> Result<(), String> {
    let invite = control
        .create_invite(&format!("r{n}"), &format!("d{n}"))
        .await
        .map_err(|e| format!("invite {e}"))?;
    let mut pair =
        testkit::pair_phone(cell, control, &host.relay_host_id, &invite, &source()).await?;
    for i in 0..frames {
        let m = Message::text(format!("soak {n} {i}"));
        pair.phone
            .send(m.clone())
            .await
            .map_err(|e| e.to_string())?;
        match pair.data.next().await {
            Some(Ok(got)) if got == m => {}
            other => return Err(format!("data leg got {other:?}")),
        }
        pair.data
            .send(Message::binary(vec![i as u8; 256]))
            .await
            .map_err(|e| e.to_string())?;
        match pair.phone.next().await {
            Some(Ok(Message::Binary(_))) => {}
            other => return Err(format!("phone got {other:?}")),
        }
    }
    // The phone installs its resume credential on the basis of this pairing, as the app does:
    // that consumes the invite and releases its `invite-offer` activity (an invite paired but
    // never installed stays valid, and holds its request unit, until it expires).
    control
        .send(serde_json::json!({"type":"device-credential-install","v":1,"reqId":format!("i{n}"),
            "relayDeviceId":format!("d{n}"),
            "newResumeTokenHash": orca_relay::crypto::token_hash(&orca_relay::crypto::random_b64u32()),
            "authorization":{"mode":"relay-basis","basisConnId": pair.conn_id}}))
        .await;
    let installed = control
        .recv(Duration::from_secs(10))
        .await
        .map_err(|e| format!("install {e:?}"))?;
    if installed["type"] != "device-credential-installed" {
        return Err(format!("install {installed}"));
    }
    let _ = pair.phone.close(None).await;
    let _ = pair.data.close(None).await;
    // Wait for the cell's side of both closes, so the next pairing starts clean.
    let _ = testkit::recv_close(&mut pair.phone, Duration::from_secs(5)).await;
    let _ = testkit::recv_close(&mut pair.data, Duration::from_secs(5)).await;
    Ok(())
}

struct Counters {
    pairings: AtomicU64,
    failures: AtomicU64,
    moves: AtomicU64,
}

/// Churners until `stop`: each places a host, pairs through it, replaces it every
/// [`PAIRINGS_PER_HOST`] pairings (or after a failure).
fn churn(
    url: &str,
    churners: usize,
    stop: Arc<AtomicBool>,
    c: Arc<Counters>,
    frames: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..churners)
        .map(|w| {
            let (url, stop, c) = (url.to_string(), stop.clone(), c.clone());
            tokio::spawn(async move {
                let mut gen = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    gen += 1;
                    let Ok((host, mut control, cell)) =
                        place(&url, &format!("soak-{w}-{gen}")).await
                    else {
                        c.failures.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    };
                    for n in 0..PAIRINGS_PER_HOST {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        match one_pairing(&cell, &host, &mut control, n, frames).await {
                            Ok(()) => {
                                c.pairings.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                c.failures.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                    // The host leaves: its control closes.
                    let _ = control.ws.close(None).await;
                    c.moves.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect()
}

async fn sample(url: &str, start: Instant, phase: &'static str, c: &Counters) -> Sample {
    let (rss_kib, fds, tasks) = usage(url).await;
    Sample {
        t_s: start.elapsed().as_secs(),
        phase,
        rss_kib,
        fds,
        tasks,
        pairings: c.pairings.load(Ordering::Relaxed),
        failures: c.failures.load(Ordering::Relaxed),
    }
}

async fn run_phase(
    url: &str,
    plan: &Plan,
    len: Duration,
    phase: &'static str,
    start: Instant,
    c: &Arc<Counters>,
    series: &mut Vec<Sample>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = churn(
        url,
        plan.churners,
        stop.clone(),
        c.clone(),
        plan.frames_per_pair,
    );
    let until = Instant::now() + len;
    while Instant::now() < until {
        tokio::time::sleep(plan.sample_every.min(until - Instant::now())).await;
        series.push(sample(url, start, phase, c).await);
        println!("{:?}", series.last().unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
}

/// Waits until the process is back within the tolerance of `base` (or `within` passes), sampling
/// every second; the last sample.
async fn settle(
    url: &str,
    base: Option<&Sample>,
    tol: f64,
    within: Duration,
    start: Instant,
    c: &Counters,
    series: &mut Vec<Sample>,
) -> (Sample, Duration) {
    let t0 = Instant::now();
    let mut last_logged = Instant::now();
    let mut prev: Option<Sample> = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = sample(url, start, "settle", c).await;
        let done = match base {
            Some(b) if b.phase == "idle" => {
                // Before the baseline: settled when tasks and fds are back near the idle sample
                // (the orphan grace of the hosts that left has run out) and stopped moving.
                let near =
                    |a: u64, b: u64| (a as f64 - b as f64).abs() <= (b as f64 * tol).max(1.0);
                near(s.tasks, b.tasks)
                    && near(s.fds, b.fds)
                    && prev.is_some_and(|p| p.tasks == s.tasks && p.fds == s.fds)
            }
            Some(b) => returned(b, &s, tol).is_ok(),
            None => prev.is_some_and(|p| p.tasks == s.tasks && p.fds == s.fds),
        };
        if done || t0.elapsed() >= within || last_logged.elapsed() >= Duration::from_secs(10) {
            series.push(s);
            last_logged = Instant::now();
        }
        if done || t0.elapsed() >= within {
            return (s, t0.elapsed());
        }
        prev = Some(s);
    }
}

pub async fn run(url: &str, plan: Plan) -> Report {
    let start = Instant::now();
    let c = Arc::new(Counters {
        pairings: AtomicU64::new(0),
        failures: AtomicU64::new(0),
        moves: AtomicU64::new(0),
    });
    let mut series = Vec::new();
    // Idle hosts, held for the whole run.
    let mut idle = Vec::new();
    for i in 0..plan.idle_hosts {
        idle.push(
            place(url, &format!("idle-{i}"))
                .await
                .expect("idle host placed"),
        );
    }
    let keep_idle = Arc::new(AtomicBool::new(false));
    let idle_tasks: Vec<_> = idle
        .into_iter()
        .map(|(_, mut control, _)| {
            let stop = keep_idle.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    match control.recv(Duration::from_millis(500)).await {
                        Ok(_) => {}
                        Err((0, r)) if r == "timeout" => {}
                        Err(_) => break,
                    }
                }
            })
        })
        .collect();
    let idle = sample(url, start, "idle", &c).await;
    series.push(idle);
    run_phase(url, &plan, plan.warmup, "warmup", start, &c, &mut series).await;
    let (baseline, _) = settle(
        url,
        Some(&idle),
        plan.tolerance,
        plan.settle,
        start,
        &c,
        &mut series,
    )
    .await;
    let mut baseline = baseline;
    baseline.phase = "baseline";
    series.push(baseline);
    let before = c.pairings.load(Ordering::Relaxed);
    let load_start = Instant::now();
    run_phase(url, &plan, plan.load, "load", start, &c, &mut series).await;
    let load_s = load_start.elapsed().as_secs_f64();
    let pairings = c.pairings.load(Ordering::Relaxed) - before;
    let (after, settled_in) = settle(
        url,
        Some(&baseline),
        plan.tolerance,
        plan.settle,
        start,
        &c,
        &mut series,
    )
    .await;
    let mut after = after;
    after.phase = "after";
    series.push(after);
    keep_idle.store(true, Ordering::SeqCst);
    for t in idle_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    Report {
        series,
        baseline,
        after,
        pairings,
        failures: c.failures.load(Ordering::Relaxed),
        host_moves: c.moves.load(Ordering::Relaxed),
        load_s,
        settled_in,
        tolerance: plan.tolerance,
    }
}
