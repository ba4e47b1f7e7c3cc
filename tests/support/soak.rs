//! The churn soak (issue 11), shared by `examples/soak.rs` (10 minutes, by hand) and
//! `tests/soak_short.rs` (about a minute, in CI): an `orca-relay serve --role all` process on its
//! own SQLite file, idle hosts holding their controls, and churners that each cycle through a
//! small pool of desktop identities. A desktop's visit: `POST /v1/assign`, the control
//! handshake (with its last generation), pairings of its phones (new pairings by invite with a
//! credential install, and resumes with `device-resume-confirm`; each with a few frames each way
//! and both legs closed), halfway through every other visit a dropped control socket rebound
//! with the resume secret, then the control closes and the desktop leaves. The same identity
//! comes back a few visits later, as a real desktop does, so nothing the relay keeps per host
//! grows with the length of the run. The server's own `/metrics` (RSS, open fds, live runtime
//! tasks) and the cell's reserved request units (`cell-status`) are sampled every
//! `sample_every`.
//!
//! The baseline is taken after a short warm-up round of churn and a settle (so one-time
//! allocations, the database pool and lazily built state are in it); after the load stops the
//! process must come back within the tolerance of that baseline on every series.
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
/// Phones (devices) per desktop.
const PHONES_PER_DESK: usize = 2;
/// Every `INVITE_EVERY`th pairing of a visit is a new pairing by invite; the others resume
/// (a phone without a credential yet always pairs by invite). This keeps each account far below
/// its 30 invites a minute.
const INVITE_EVERY: u64 = 4;

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
    let _ = DATA_DIR.set(data_dir.to_owned());
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
        // glibc allocator tuning, passed through for the RSS investigation (docs/benchmarks.md, soak).
        .envs(std::env::vars().filter(|(k, _)| k.starts_with("MALLOC_")))
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
    /// Desktop identities per churner: reused for the whole run (a desktop leaves and later
    /// comes back as itself), so assignment rows, devices and leases stay bounded by the pool.
    pub desks_per_churner: usize,
    /// Pairings a desktop serves per visit.
    pub pairings_per_visit: u64,
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
    /// The cell's `reservedRequests` (request units charged by live leases).
    pub reserved: u64,
    /// The SQLite database plus WAL on disk.
    pub db_kib: u64,
    pub pairings: u64,
    pub failures: u64,
}

pub struct Report {
    pub series: Vec<Sample>,
    pub baseline: Sample,
    pub after: Sample,
    pub pairings: u64,
    pub resumes: u64,
    pub failures: u64,
    /// Failed attempts during the measured load (each may leave an invite's lease charged
    /// until the invite expires, at most 10 min later: the slack of the reserved-units check).
    pub load_failures: u64,
    /// Failed attempts by kind: how many, and the first one's text.
    pub errors: Vec<(String, u64, String)>,
    pub assign_retries: u64,
    pub visits: u64,
    /// Visits of an identity that had been connected before.
    pub returns: u64,
    pub rebinds: u64,
    pub identities: usize,
    /// Highest `reservedRequests` seen during the load.
    pub peak_reserved: u64,
    pub load_s: f64,
    pub settled_in: Duration,
    pub tolerance: f64,
}

impl Report {
    /// The series as a table, one line per sample.
    pub fn print(&self) {
        println!("t_s phase    rss_kib  fds  tasks reserved  db_kib pairings failures");
        for s in &self.series {
            println!(
                "{:>4} {:<8} {:>7} {:>4} {:>6} {:>8} {:>7} {:>8} {:>8}",
                s.t_s,
                s.phase,
                s.rss_kib,
                s.fds,
                s.tasks,
                s.reserved,
                s.db_kib,
                s.pairings,
                s.failures
            );
        }
        let pct = |a: u64, b: u64| (a as f64 - b as f64) * 100.0 / b.max(1) as f64;
        println!(
            "soak: {} pairings ({:.0}/s; {} resumes) in {:.0} s of load by {} desktop identities \
             ({} visits, {} of them returns, {} rebinds, {} assign answers waited out by their \
             Retry-After), {} failed attempts; reserved units peaked at {}",
            self.pairings,
            self.pairings as f64 / self.load_s.max(1.0),
            self.resumes,
            self.load_s,
            self.identities,
            self.visits,
            self.returns,
            self.rebinds,
            self.assign_retries,
            self.failures,
            self.peak_reserved,
        );
        for (kind, n, first) in &self.errors {
            println!("soak: {n} failed at {kind}, first: {first}");
        }
        println!(
            "soak: baseline rss {} KiB fds {} tasks {} reserved {} -> after rss {} KiB ({:+.1} %) \
             fds {} ({:+.1} %) tasks {} ({:+.1} %) reserved {} ({:+.1} %), settled in {} ms",
            self.baseline.rss_kib,
            self.baseline.fds,
            self.baseline.tasks,
            self.baseline.reserved,
            self.after.rss_kib,
            pct(self.after.rss_kib, self.baseline.rss_kib),
            self.after.fds,
            pct(self.after.fds, self.baseline.fds),
            self.after.tasks,
            pct(self.after.tasks, self.baseline.tasks),
            self.after.reserved,
            pct(self.after.reserved, self.baseline.reserved),
            self.settled_in.as_millis()
        );
    }

    /// Whether the after-load sample is within the tolerance of the baseline on every series.
    pub fn returned(&self) -> Result<(), String> {
        returned(
            &self.baseline,
            &self.after,
            self.tolerance,
            self.load_failures,
        )
    }
}

/// Every series within `tol` of the baseline; reserved units may also exceed it by `slack`
/// (failed pairings whose invite still holds its unit until it expires).
fn returned(base: &Sample, now: &Sample, tol: f64, slack: u64) -> Result<(), String> {
    let check = |name: &str, b: u64, n: u64| {
        let mut limit = (b as f64 * tol).max(1.0);
        if name == "reserved" && n > b {
            limit += slack as f64;
        }
        if (n as f64 - b as f64).abs() <= limit {
            Ok(())
        } else {
            Err(format!("{name}: baseline {b}, now {n} (±{limit:.0})"))
        }
    };
    check("rss_kib", base.rss_kib, now.rss_kib)?;
    check("fds", base.fds, now.fds)?;
    check("tasks", base.tasks, now.tasks)?;
    check("reserved", base.reserved, now.reserved)
}

/// The single cell's `reservedRequests` from `POST /v1/admin/cell-status`.
pub async fn reserved_units(url: &str) -> u64 {
    let v: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/v1/admin/cell-status"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"v":1}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("cell-status")
        .json()
        .await
        .expect("cell-status body");
    v["cells"][0]["reservedRequests"]
        .as_u64()
        .unwrap_or_else(|| panic!("reservedRequests missing: {v}"))
}

/// RSS (KiB), open fds and live tasks from the server's own `/metrics`.
pub async fn usage(url: &str) -> (u64, u64, u64) {
    let m = super::common::metrics::scrape(url, ADMIN).await;
    let get = |n: &str| -> u64 {
        *m.get(n)
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

/// A placed host with its control open (the idle hosts).
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

/// Request ids, unique over the run (install and confirmation results are remembered per
/// request id, and the identities are reused).
static REQ: AtomicU64 = AtomicU64::new(1);

fn req_id(kind: &str) -> String {
    format!("{kind}{}", REQ.fetch_add(1, Ordering::Relaxed))
}

/// A phone of one desktop: its device id and, once installed, its resume token.
struct Phone {
    device: String,
    resume: Option<String>,
}

/// One desktop identity of a churner's pool, and what the desktop remembers between its visits
/// (the last generation it was granted, its phones' credentials).
struct Desk {
    host: HostIdentity,
    generation: Option<i64>,
    phones: Vec<Phone>,
}

impl Desk {
    fn new(user: &str) -> Desk {
        Desk {
            host: HostIdentity::generate(user),
            generation: None,
            phones: (0..PHONES_PER_DESK)
                .map(|p| Phone {
                    device: format!("{user}-p{p}"),
                    resume: None,
                })
                .collect(),
        }
    }

    /// Connects the way the desktop does: a fresh host token, `POST /v1/assign` (which re-resolves
    /// the home and grants the same epoch while the host holds a control there; `reconnect`
    /// after a lost socket, honouring `Retry-After`), then the control handshake with the last
    /// generation it saw and, for a rebind, its control resume secret.
    async fn connect(
        &mut self,
        url: &str,
        resume_secret: Option<String>,
        c: &Counters,
    ) -> Result<(HostControl, String), String> {
        let token = self.host.token(SIGNING, url);
        let reconnect = resume_secret.is_some();
        let (cell, epoch) = assign(url, &token, &self.host.relay_host_id, reconnect, c).await?;
        let hello = Hello {
            epoch,
            previous_generation: self.generation,
            resume_secret,
            ..Hello::default()
        };
        let control = testkit::connect_control(&cell, &self.host, &token, url, &hello)
            .await
            .map_err(|e| format!("control {e:?}"))?;
        self.generation = Some(control.generation);
        Ok((control, cell))
    }
}

/// Longest a desktop follows `Retry-After` before it counts the attempt as failed.
const ASSIGN_RETRY_BUDGET: Duration = Duration::from_secs(20);

/// `POST /v1/assign` as the desktop sends it (`reconnect: true` when it redials after losing
/// its socket): a 503 with `Retry-After` is waited out and retried, as the desktop does, within
/// [`ASSIGN_RETRY_BUDGET`]. → (cellUrl, assignmentEpoch).
async fn assign(
    url: &str,
    token: &str,
    relay_host_id: &str,
    reconnect: bool,
    c: &Counters,
) -> Result<(String, i64), String> {
    let mut body = serde_json::json!({"v":1,"relayHostId":relay_host_id});
    if reconnect {
        body["reconnect"] = serde_json::json!(true);
    }
    let deadline = Instant::now() + ASSIGN_RETRY_BUDGET;
    loop {
        let r = testkit::http_client()
            .post(format!("{url}/v1/assign"))
            .bearer_auth(token)
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| format!("assign {e}"))?;
        let status = r.status();
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let v: serde_json::Value = r.json().await.map_err(|e| format!("assign {e}"))?;
        if status.is_success() {
            return Ok((
                v["cellUrl"].as_str().unwrap_or_default().to_owned(),
                v["assignmentEpoch"].as_i64().unwrap_or(0),
            ));
        }
        match retry_after {
            Some(s) if Instant::now() + Duration::from_secs(s) < deadline => {
                c.assign_retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(s)).await;
            }
            _ => return Err(format!("assign {status} {v}")),
        }
    }
}

/// `frames` frames each way through a fresh pair, then both legs closed and their closes seen.
async fn exchange(pair: &mut testkit::Pair, frames: usize) -> Result<(), String> {
    for i in 0..frames {
        let m = Message::text(format!("soak {} {i}", pair.conn_id));
        pair.phone
            .send(m.clone())
            .await
            .map_err(|e| format!("phone send {e}"))?;
        match pair.data.next().await {
            Some(Ok(got)) if got == m => {}
            other => return Err(format!("data leg got {other:?}")),
        }
        pair.data
            .send(Message::binary(vec![i as u8; 256]))
            .await
            .map_err(|e| format!("data send {e}"))?;
        match pair.phone.next().await {
            Some(Ok(Message::Binary(_))) => {}
            other => return Err(format!("phone got {other:?}")),
        }
    }
    Ok(())
}

async fn close_pair(mut pair: testkit::Pair) {
    let _ = pair.phone.close(None).await;
    let _ = pair.data.close(None).await;
    // Wait for the cell's side of both closes, so the next pairing starts clean.
    let _ = testkit::recv_close(&mut pair.phone, Duration::from_secs(5)).await;
    let _ = testkit::recv_close(&mut pair.data, Duration::from_secs(5)).await;
}

/// A new pairing of `phone` through `control`: invite, phone leg, data leg, `frames` each way,
/// then the phone installs a new resume credential on the basis of this pairing, as the app
/// does (that consumes the invite and releases its `invite-offer` activity; an invite paired
/// but never installed stays valid, and holds its request unit, until it expires).
async fn invite_pairing(
    cell: &str,
    host: &HostIdentity,
    control: &mut HostControl,
    phone: &mut Phone,
    frames: usize,
) -> Result<(), String> {
    let invite = control
        .create_invite(&req_id("r"), &phone.device)
        .await
        .map_err(|e| format!("invite {e}"))?;
    let src = source();
    let mut pair = testkit::pair_phone(cell, control, &host.relay_host_id, &invite, &src)
        .await
        .map_err(|e| format!("pair {e}"))?;
    if pair.hello["credentialKind"] != "invite" {
        return Err(format!("pair {}", pair.hello));
    }
    exchange(&mut pair, frames).await?;
    let token = orca_relay::crypto::random_b64u32();
    control
        .send(
            serde_json::json!({"type":"device-credential-install","v":1,"reqId":req_id("i"),
            "relayDeviceId":phone.device,
            "newResumeTokenHash": orca_relay::crypto::token_hash(&token),
            "authorization":{"mode":"relay-basis","basisConnId": pair.conn_id}}),
        )
        .await;
    let installed = control
        .recv(Duration::from_secs(10))
        .await
        .map_err(|e| format!("install {e:?}"))?;
    if installed["type"] != "device-credential-installed" {
        return Err(format!("install {installed}"));
    }
    phone.resume = Some(token);
    close_pair(pair).await;
    Ok(())
}

/// A returning phone: its resume token on the phone leg, the data leg, `frames` each way, and
/// the host's `device-resume-confirm` for the connection (which renews the credential and
/// releases the `confirmation` activity).
async fn resume_pairing(
    cell: &str,
    host: &HostIdentity,
    control: &mut HostControl,
    token: &str,
    frames: usize,
) -> Result<(), String> {
    let src = source();
    let mut pair = testkit::pair_phone(cell, control, &host.relay_host_id, token, &src)
        .await
        .map_err(|e| format!("resume {e}"))?;
    if pair.hello["credentialKind"] != "resume" {
        return Err(format!("resume {}", pair.hello));
    }
    exchange(&mut pair, frames).await?;
    control
        .send(
            serde_json::json!({"type":"device-resume-confirm","v":1,"reqId":req_id("c"),
            "basisConnId": pair.conn_id}),
        )
        .await;
    let confirmed = control
        .recv(Duration::from_secs(10))
        .await
        .map_err(|e| format!("confirm {e:?}"))?;
    if confirmed["type"] != "device-resume-confirmed" {
        return Err(format!("confirm {confirmed}"));
    }
    close_pair(pair).await;
    Ok(())
}

#[derive(Default)]
struct Counters {
    pairings: AtomicU64,
    resumes: AtomicU64,
    failures: AtomicU64,
    visits: AtomicU64,
    /// Visits of an identity that had been connected before.
    returns: AtomicU64,
    rebinds: AtomicU64,
    /// `/v1/assign` answers waited out by their `Retry-After`.
    assign_retries: AtomicU64,
    /// Failed attempts by their first word (`assign`, `control`, `invite`, `pair`, …): how
    /// many, and the first one's text.
    errors: Mutex<std::collections::BTreeMap<String, (u64, String)>>,
}

impl Counters {
    fn failed(&self, e: &str) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let class = e.split([' ', '(']).next().unwrap_or_default().to_owned();
        let mut errors = self.errors.lock().unwrap();
        let entry = errors
            .entry(class)
            .or_insert_with(|| (0, e.chars().take(200).collect()));
        entry.0 += 1;
    }
}

/// One visit of a desktop: it connects, serves `pairings` phones (every
/// [`INVITE_EVERY`]th one, and any phone without a credential yet, pairs anew by invite; the
/// others resume), and leaves (its control closes; the cell keeps the session through the
/// orphan grace, then releases it). Every other visit the control socket drops halfway without
/// a close and the desktop redials at once with its resume secret: a rebind of the same session.
async fn visit(
    url: &str,
    desk: &mut Desk,
    visit_no: u64,
    stop: &AtomicBool,
    c: &Counters,
    (pairings, frames): (u64, usize),
) -> Result<(), String> {
    let (mut control, mut cell) = desk.connect(url, None, c).await?;
    for k in 0..pairings {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if visit_no % 2 == 1 && k == pairings / 2 {
            let secret = control.secret.clone();
            drop(control);
            let (again, at) = desk.connect(url, Some(secret), c).await?;
            if !again.resumed {
                return Err("rebind refused: a new generation".into());
            }
            (control, cell) = (again, at);
            c.rebinds.fetch_add(1, Ordering::Relaxed);
        }
        let host = desk.host.clone();
        let phone = &mut desk.phones[k as usize % PHONES_PER_DESK];
        let result = match phone.resume.clone() {
            Some(token) if k % INVITE_EVERY != 0 => {
                let r = resume_pairing(&cell, &host, &mut control, &token, frames).await;
                if r.is_ok() {
                    c.resumes.fetch_add(1, Ordering::Relaxed);
                }
                r
            }
            _ => invite_pairing(&cell, &host, &mut control, phone, frames).await,
        };
        if let Err(e) = result {
            let _ = control.ws.close(None).await;
            return Err(e);
        }
        c.pairings.fetch_add(1, Ordering::Relaxed);
    }
    // The desktop leaves: its control closes.
    let _ = control.ws.close(None).await;
    Ok(())
}

/// Churners until `stop`: each cycles through its own pool of desktop identities (reused for the
/// whole run, like real desktops coming and going), one visit at a time.
fn churn(
    url: &str,
    pools: &Arc<Vec<tokio::sync::Mutex<Vec<Desk>>>>,
    stop: Arc<AtomicBool>,
    c: Arc<Counters>,
    shape: (u64, usize),
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..pools.len())
        .map(|w| {
            let (url, stop, c, pools) = (url.to_string(), stop.clone(), c.clone(), pools.clone());
            tokio::spawn(async move {
                let mut desks = pools[w].lock().await;
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let no = n;
                    n += 1;
                    let len = desks.len();
                    let desk = &mut desks[(no as usize) % len];
                    c.visits.fetch_add(1, Ordering::Relaxed);
                    if desk.generation.is_some() {
                        c.returns.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Err(e) = visit(&url, desk, no / len as u64, &stop, &c, shape).await {
                        c.failed(&e);
                        // Pacing after a failure, as a desktop backs off before redialling.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            })
        })
        .collect()
}

/// The started server's data directory (one server per soak process).
static DATA_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Size of the server's SQLite database and its WAL, in KiB (its page cache grows with it).
fn db_kib() -> u64 {
    let Some(dir) = DATA_DIR.get() else { return 0 };
    ["relay.sqlite3", "relay.sqlite3-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len() / 1024)
        .sum()
}

async fn sample(url: &str, start: Instant, phase: &'static str, c: &Counters) -> Sample {
    let (rss_kib, fds, tasks) = usage(url).await;
    let reserved = reserved_units(url).await;
    let db_kib = db_kib();
    Sample {
        t_s: start.elapsed().as_secs(),
        phase,
        rss_kib,
        fds,
        tasks,
        reserved,
        db_kib,
        pairings: c.pairings.load(Ordering::Relaxed),
        failures: c.failures.load(Ordering::Relaxed),
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_phase(
    url: &str,
    plan: &Plan,
    pools: &Arc<Vec<tokio::sync::Mutex<Vec<Desk>>>>,
    len: Duration,
    phase: &'static str,
    start: Instant,
    c: &Arc<Counters>,
    series: &mut Vec<Sample>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let shape = (plan.pairings_per_visit, plan.frames_per_pair);
    let tasks = churn(url, pools, stop.clone(), c.clone(), shape);
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

/// Waits until the process is quiet (every orphan-grace timer of a desktop that left has fired,
/// and tasks, fds and reserved units have not moved for three samples) and, after the load,
/// back within the tolerance of `base` (or `within` passes), sampling every second; the last
/// sample.
#[allow(clippy::too_many_arguments)]
async fn settle(
    url: &str,
    base: &Sample,
    check: Option<(f64, u64)>,
    within: Duration,
    start: Instant,
    c: &Counters,
    series: &mut Vec<Sample>,
) -> (Sample, Duration) {
    let t0 = Instant::now();
    let grace = Duration::from_millis(orca_relay::contract::limits::ORPHAN_GRACE_MS + 2_000);
    let mut last_logged = Instant::now();
    let mut recent: Vec<Sample> = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = sample(url, start, "settle", c).await;
        recent.push(s);
        if recent.len() > 3 {
            recent.remove(0);
        }
        let quiet = t0.elapsed() >= grace
            && recent.len() == 3
            && recent
                .iter()
                .all(|p| (p.tasks, p.fds, p.reserved) == (s.tasks, s.fds, s.reserved));
        let done = quiet && check.is_none_or(|(tol, slack)| returned(base, &s, tol, slack).is_ok());
        if done || t0.elapsed() >= within || last_logged.elapsed() >= Duration::from_secs(10) {
            series.push(s);
            last_logged = Instant::now();
        }
        if done || t0.elapsed() >= within {
            return (s, t0.elapsed());
        }
    }
}

pub async fn run(url: &str, plan: Plan) -> Report {
    let start = Instant::now();
    let c = Arc::new(Counters::default());
    let pools: Arc<Vec<_>> = Arc::new(
        (0..plan.churners)
            .map(|w| {
                tokio::sync::Mutex::new(
                    (0..plan.desks_per_churner)
                        .map(|d| Desk::new(&format!("soak-{w}-{d}")))
                        .collect(),
                )
            })
            .collect(),
    );
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
    run_phase(
        url,
        &plan,
        &pools,
        plan.warmup,
        "warmup",
        start,
        &c,
        &mut series,
    )
    .await;
    let (baseline, _) = settle(url, &idle, None, plan.settle, start, &c, &mut series).await;
    let mut baseline = baseline;
    baseline.phase = "baseline";
    series.push(baseline);
    let before = c.pairings.load(Ordering::Relaxed);
    let failures_before = c.failures.load(Ordering::Relaxed);
    let resumes_before = c.resumes.load(Ordering::Relaxed);
    let load_start = Instant::now();
    let load_from = series.len();
    run_phase(
        url,
        &plan,
        &pools,
        plan.load,
        "load",
        start,
        &c,
        &mut series,
    )
    .await;
    let load_s = load_start.elapsed().as_secs_f64();
    let pairings = c.pairings.load(Ordering::Relaxed) - before;
    let resumes = c.resumes.load(Ordering::Relaxed) - resumes_before;
    let peak_reserved = series[load_from..]
        .iter()
        .map(|s| s.reserved)
        .max()
        .unwrap_or_default();
    let load_failures = c.failures.load(Ordering::Relaxed) - failures_before;
    let (after, settled_in) = settle(
        url,
        &baseline,
        Some((plan.tolerance, load_failures)),
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
    let errors: Vec<(String, u64, String)> = c
        .errors
        .lock()
        .unwrap()
        .iter()
        .map(|(k, (n, first))| (k.clone(), *n, first.clone()))
        .collect();
    Report {
        series,
        baseline,
        after,
        pairings,
        resumes,
        failures: c.failures.load(Ordering::Relaxed),
        load_failures,
        errors,
        visits: c.visits.load(Ordering::Relaxed),
        rebinds: c.rebinds.load(Ordering::Relaxed),
        returns: c.returns.load(Ordering::Relaxed),
        assign_retries: c.assign_retries.load(Ordering::Relaxed),
        identities: plan.churners * plan.desks_per_churner,
        peak_reserved,
        load_s,
        settled_in,
        tolerance: plan.tolerance,
    }
}
