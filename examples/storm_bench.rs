//! Reconnect storm benchmark: `--hosts` desktop hosts, each with a paired phone holding a resume
//! token, connected to one `orca-relay serve` node (role all; SQLite, or Postgres with
//! `--postgres URL`; plain, or the relay's own TLS with `--tls`). The node is killed with SIGKILL
//! and started again on the same data and port; every desktop and phone reconnects as the Orca apps
//! do: the desktop re-resolves (`POST /v1/assign` with `reconnect:true`), backs off 250 ms ×2 up to
//! 10 s with ±20 % jitter, honours `Retry-After`, then redoes the control handshake; the phone
//! redials its cell with its resume token (after `POST /v1/resolve` when told `4409`/`4503`) with
//! the same backoff, and the desktop answers its `conn-open` with a data leg.
//!
//! ```text
//! cargo build --release && cargo run --release --example storm_bench -- [--hosts 4000] [--tls] \
//!     [--postgres postgres://postgres@127.0.0.1:5432/test] [--relay-env KEY=VALUE ...] \
//!     [--handshakes 2000]
//! ```
//!
//! (The bench runs `target/<profile>/orca-relay`, or `ORCA_RELAY_BIN`.) Prints, from the new
//! process's first `200` on `/ready`: when every control was active again and when every phone was
//! paired again, p50/p99/max per host; refusals by status and cause (HTTP refusals with and
//! without `Retry-After`, WebSocket refusals by close code, transport errors before and after
//! `/ready`); the relay's peak RSS and open files and its CPU during the storm; connections
//! (TLS handshakes with `--tls`) per second. `--handshakes N` first runs N full TLS handshakes
//! and N resumed ones (TLS 1.3 tickets), each followed by one `GET /health` read to its end (so
//! the tickets are taken in), against the idle node and prints handshakes per relay CPU-second
//! (`/proc/<pid>/stat` utime+stime). Exits non-zero when the goal is missed
//! (`--goal-ms`, default 8 000) or a refusal lacked `Retry-After`.

#[path = "common/relay_bin.rs"]
mod relay_bin;
use relay_bin::relay_bin;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use orca_relay::cell::testkit::{self, ClientWs, Hello, HostControl, HostIdentity};
use orca_relay::crypto::{random_b64u32, token_hash};
use orca_relay::store::testing::TestDb;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

#[derive(Parser)]
struct Args {
    /// Hosts, each with one paired phone.
    #[arg(long, default_value = "4000")]
    hosts: usize,
    /// Serve over the relay's own TLS listener (a CA generated at run time).
    #[arg(long)]
    tls: bool,
    /// Postgres server to run on (a fresh schema is created and dropped); SQLite otherwise.
    #[arg(long)]
    postgres: Option<String>,
    /// Extra `KEY=VALUE` settings for the relay (e.g. lane settings), repeatable.
    #[arg(long = "relay-env")]
    relay_env: Vec<String>,
    /// Hosts set up at once before the kill.
    #[arg(long, default_value = "48")]
    setup_concurrency: usize,
    /// With `--tls`: N full and N resumed handshakes against the idle node first.
    #[arg(long, default_value = "0")]
    handshakes: usize,
    /// Handshakes in flight at once in that measurement.
    #[arg(long, default_value = "16")]
    handshake_concurrency: usize,
    /// Every host must be back within this long after `/ready` (controls and phones).
    #[arg(long, default_value = "8000")]
    goal_ms: u64,
    /// Give up waiting for the storm to settle after this long.
    #[arg(long, default_value = "180")]
    timeout_s: u64,
}

const SIGNING: &str = "storm-bench-signing-key-storm-bench-signing-01";
const CLUSTER: &str = "storm-bench-cluster-key-storm-bench-cluster-01";
const ADMIN: &str = "storm-bench-admin-token-storm-bench-admin-0001";
const WAIT: Duration = Duration::from_secs(15);

/// Raises the open-file soft limit to the hard limit; the relay inherits it.
fn raise_nofile() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        r.rlim_cur
    }
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// utime + stime of a process, in seconds (clock ticks of 100 Hz).
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(at) = s.rfind(')') else { return 0.0 };
    let f: Vec<&str> = s[at + 2..].split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// The apps' retry: 250 ms doubling to 10 s, ±20 % jitter.
fn backoff(attempt: u32) -> Duration {
    let base = 250u64.saturating_mul(1 << attempt.min(6)).min(10_000);
    Duration::from_millis((base as f64 * (0.8 + rand::random::<f64>() * 0.4)) as u64)
}

/// What to wait after a refusal: its `Retry-After` (plus up to 20 % jitter) or the backoff.
fn retry_delay(retry_after: Option<u64>, attempt: u32) -> Duration {
    match retry_after {
        Some(s) => {
            Duration::from_millis((s as f64 * 1000.0 * (1.0 + rand::random::<f64>() * 0.2)) as u64)
        }
        None => backoff(attempt),
    }
}

/// The relay process and what restarting it needs.
struct Relay {
    bin: PathBuf,
    dir: PathBuf,
    envs: Vec<(String, String)>,
    public: String,
    child: Option<Child>,
}

impl Relay {
    fn start(&mut self) -> u32 {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("relay.log"))
            .expect("relay log");
        let mut cmd = Command::new(&self.bin);
        cmd.arg("serve")
            .current_dir(&self.dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn orca-relay");
        let pid = child.id();
        self.child = Some(child);
        pid
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    /// Polls `/ready` every 5 ms until `200`: the instant it was first seen.
    async fn ready(&self, within: Duration) -> Instant {
        let client = testkit::http_client();
        let deadline = Instant::now() + within;
        loop {
            let r = client
                .get(format!("{}/ready", self.public))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if r.is_ok_and(|r| r.status() == 200) {
                return Instant::now();
            }
            assert!(
                Instant::now() < deadline,
                "relay not ready; see {}/relay.log",
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A test CA and a certificate for 127.0.0.1 and localhost: (CA PEM, cert path, key path).
fn tls_files(dir: &Path) -> (String, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let p = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let cert = p.signed_by(&key, &issuer).unwrap();
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (ca_cert.pem(), c, k)
}

/// Refusals and recoveries, shared by every client task.
#[derive(Default)]
struct Shared {
    /// Set once the new process answered `/ready`: refusals are counted from then on.
    ready: AtomicBool,
    /// Set at the kill: recoveries are recorded from then on.
    killed: AtomicBool,
    /// cause → (count, of them without Retry-After).
    refusals: Mutex<BTreeMap<String, (u64, u64)>>,
    /// Per host: when its control was active again / its phone paired again.
    control_back: Mutex<Vec<Option<Instant>>>,
    phone_back: Mutex<Vec<Option<Instant>>>,
    /// WebSocket dials that completed the upgrade after the kill (one TLS handshake each).
    dials: AtomicU64,
    /// Pre-`/ready` transport errors (the node is down) are counted apart.
    down_errors: AtomicU64,
}

impl Shared {
    /// `retry_after`: `None` = not an HTTP refusal (no header expected), `Some(None)` = an HTTP
    /// refusal without the header.
    fn refuse(&self, cause: String, retry_after: Option<Option<u64>>) {
        if !self.ready.load(Ordering::SeqCst) && cause.contains(" transport") {
            self.down_errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut m = self.refusals.lock().unwrap();
        let e = m.entry(cause).or_default();
        e.0 += 1;
        if retry_after == Some(None) {
            e.1 += 1;
        }
    }

    fn back(&self, which: &Mutex<Vec<Option<Instant>>>, i: usize) {
        if self.killed.load(Ordering::SeqCst) {
            let mut v = which.lock().unwrap();
            v[i].get_or_insert_with(Instant::now);
        }
    }
}

/// An HTTP refusal: status, `error`, `Retry-After` seconds.
struct Refused {
    cause: String,
    retry_after: Option<Option<u64>>,
}

/// `POST {path}` with `body` (and the host token): the JSON of a `200`, or the refusal.
async fn post(
    public: &str,
    path: &str,
    token: Option<&str>,
    body: Value,
) -> Result<Value, Refused> {
    let what = path.trim_start_matches("/v1/");
    let mut req = testkit::http_client()
        .post(format!("{public}{path}"))
        .timeout(WAIT)
        .json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    match req.send().await {
        Ok(r) => {
            let ok = r.status().is_success();
            let (status, headers) = (r.status(), r.headers().clone());
            let v: Value = r.json().await.unwrap_or(Value::Null);
            if ok {
                return Ok(v);
            }
            let ra = headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            Err(Refused {
                cause: format!(
                    "{what} {} {}",
                    status.as_u16(),
                    v["error"].as_str().unwrap_or("?")
                ),
                retry_after: Some(ra),
            })
        }
        Err(e) => Err(Refused {
            cause: format!(
                "{what} transport ({})",
                if e.is_timeout() {
                    "no answer within the client's timeout"
                } else if e.is_connect() {
                    "connect"
                } else {
                    "connection closed or reset"
                }
            ),
            retry_after: None,
        }),
    }
}

/// A WebSocket dial error: `http 503 retry-after=1` is an HTTP refusal, anything else transport.
fn dial_refusal(what: &str, e: &str) -> Refused {
    if let Some(rest) = e.strip_prefix("http ") {
        let status = rest.split(' ').next().unwrap_or("?");
        let ra = rest
            .split("retry-after=")
            .nth(1)
            .and_then(|v| v.trim().parse().ok());
        return Refused {
            cause: format!("{what} upgrade {status}"),
            retry_after: Some(ra),
        };
    }
    // The error's text without numbers (ports, os error codes), so the report groups by kind.
    let kind: String = e.chars().filter(|c| !c.is_ascii_digit()).take(60).collect();
    Refused {
        cause: format!("{what} transport ({kind})"),
        retry_after: None,
    }
}

/// One host as set up before the kill.
struct Host {
    i: usize,
    id: HostIdentity,
    public: String,
    cell_url: String,
    resume: String,
    source: Vec<(&'static str, String)>,
}

/// Assign, control, invite, phone, data leg, resume token installed: the host and its live sockets.
async fn setup_host(
    i: usize,
    public: &str,
) -> Result<(Host, HostControl, ClientWs, ClientWs), String> {
    let id = HostIdentity::generate(&format!("storm-{i}"));
    let token = id.token(SIGNING, public);
    let (cell_url, epoch) = testkit::assign(public, &token, &id.relay_host_id).await?;
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let mut c = testkit::connect_control(&cell_url, &id, &token, public, &hello)
        .await
        .map_err(|e| format!("control {e:?}"))?;
    let invite = c
        .create_invite("r1", "d1")
        .await
        .map_err(|e| e.to_string())?;
    let source = vec![(
        "x-forwarded-for",
        format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255),
    )];
    let pair = testkit::pair_phone(&cell_url, &mut c, &id.relay_host_id, &invite, &source).await?;
    let resume = random_b64u32();
    c.send(
        json!({"type":"device-credential-install","v":1,"reqId":"i1","relayDeviceId":"d1",
        "newResumeTokenHash": token_hash(&resume),
        "authorization":{"mode":"relay-basis","basisConnId": pair.conn_id}}),
    )
    .await;
    let got = c.recv(WAIT).await.map_err(|e| format!("install {e:?}"))?;
    if got["type"] != "device-credential-installed" {
        return Err(format!("install: {got}"));
    }
    let host = Host {
        i,
        id,
        public: public.to_owned(),
        cell_url,
        resume,
        source,
    };
    Ok((host, c, pair.phone, pair.data))
}

/// Keeps a socket read (pings answered) until it closes.
async fn drain(mut ws: ClientWs) {
    while let Some(Ok(_)) = ws.next().await {}
}

/// The desktop: holds its control (answering `conn-open` with a data leg), and after it drops
/// re-resolves and reconnects with the apps' backoff.
async fn run_desktop(h: Arc<Host>, mut control: HostControl, sh: Arc<Shared>) {
    loop {
        while let Ok(frame) = control.recv(Duration::from_secs(3600)).await {
            if frame["type"] != "conn-open" {
                continue;
            }
            let (cell, src, generation) =
                (h.cell_url.clone(), h.source.clone(), control.generation);
            match testkit::connect_data(&cell, &frame, generation, &src).await {
                Ok(data) => {
                    sh.dials.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(drain(data));
                }
                Err(e) => {
                    let r = dial_refusal("data", &e);
                    sh.refuse(r.cause, r.retry_after);
                }
            }
            if frame["kind"] == "resume" {
                control
                    .send(json!({"type":"device-resume-confirm","v":1,"reqId":"c1","basisConnId":frame["connId"]}))
                    .await;
            }
        }
        control = reconnect_desktop(&h, &sh).await;
        sh.back(&sh.control_back, h.i);
    }
}

async fn reconnect_desktop(h: &Host, sh: &Shared) -> HostControl {
    let mut attempt = 0u32;
    loop {
        let token = h.id.token(SIGNING, &h.public);
        let body = json!({"v":1,"relayHostId":h.id.relay_host_id,"reconnect":true});
        let r = match post(&h.public, "/v1/assign", Some(&token), body).await {
            Ok(v) => {
                let hello = Hello {
                    epoch: v["assignmentEpoch"].as_i64().unwrap_or(0),
                    ..Hello::default()
                };
                let cell = v["cellUrl"].as_str().unwrap_or_default().to_owned();
                match testkit::connect_control(&cell, &h.id, &token, &h.public, &hello).await {
                    Ok(c) => {
                        sh.dials.fetch_add(1, Ordering::Relaxed);
                        return c;
                    }
                    Err((0, e)) => dial_refusal("control", &e),
                    Err((code, reason)) => Refused {
                        cause: format!("control close {code} {reason}"),
                        retry_after: None,
                    },
                }
            }
            Err(r) => r,
        };
        let ra = r.retry_after.flatten();
        sh.refuse(r.cause, r.retry_after);
        tokio::time::sleep(retry_delay(ra, attempt)).await;
        attempt += 1;
    }
}

/// The phone: holds its socket; after it drops, redials with its resume token (resolving first
/// when told the host moved) with the apps' backoff.
async fn run_phone(h: Arc<Host>, mut phone: ClientWs, sh: Arc<Shared>) {
    loop {
        drain(phone).await;
        phone = reconnect_phone(&h, &sh).await;
        sh.back(&sh.phone_back, h.i);
    }
}

async fn reconnect_phone(h: &Host, sh: &Shared) -> ClientWs {
    let mut attempt = 0u32;
    let mut cell = h.cell_url.clone();
    loop {
        let r = match testkit::connect_phone(&cell, &h.id.relay_host_id, &h.resume, &h.source).await
        {
            Err(e) => dial_refusal("phone", &e),
            Ok(mut ws) => {
                sh.dials.fetch_add(1, Ordering::Relaxed);
                match testkit::recv_json(&mut ws, WAIT).await {
                    Ok(v) if v["ok"] == true => return ws,
                    Ok(v) => {
                        let code = v["code"].as_i64().unwrap_or(0);
                        if code == 4409 || code == 4503 {
                            let body = json!({"v":1,"relayHostId":h.id.relay_host_id,"resumeToken":h.resume});
                            match post(&h.public, "/v1/resolve", None, body).await {
                                Ok(v) => cell = v["cellUrl"].as_str().unwrap_or(&cell).to_owned(),
                                Err(r) => sh.refuse(r.cause, r.retry_after),
                            }
                        }
                        Refused {
                            cause: format!("phone relay-hello {code}"),
                            retry_after: None,
                        }
                    }
                    Err((code, reason)) => Refused {
                        cause: format!("phone close {code} {reason}"),
                        retry_after: None,
                    },
                }
            }
        };
        sh.refuse(r.cause, r.retry_after);
        tokio::time::sleep(backoff(attempt)).await;
        attempt += 1;
    }
}

fn quantile(xs: &[Duration], p: f64) -> Duration {
    if xs.is_empty() {
        return Duration::ZERO;
    }
    let i = ((xs.len() as f64 - 1.0) * p).round() as usize;
    xs[i.min(xs.len() - 1)]
}

/// Per host, time from `ready` to its recovery: (sorted durations, hosts still missing).
fn since_ready(v: &[Option<Instant>], ready: Instant) -> (Vec<Duration>, usize) {
    let mut d: Vec<Duration> = v
        .iter()
        .flatten()
        .map(|t| t.saturating_duration_since(ready))
        .collect();
    d.sort();
    let missing = v.len() - d.len();
    (d, missing)
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// N handshakes, `conc` at a time, with `cfg`: (done, resumed, wall seconds, relay CPU seconds).
async fn handshake_round(
    addr: &str,
    cfg: Arc<rustls::ClientConfig>,
    n: usize,
    conc: usize,
    pid: u32,
) -> (usize, usize, f64, f64) {
    let sem = Arc::new(Semaphore::new(conc));
    let cpu0 = cpu_seconds(pid);
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (sem, cfg, addr) = (sem.clone(), cfg.clone(), addr.to_owned());
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire_owned().await.unwrap();
            let tcp = tokio::net::TcpStream::connect(&addr).await.ok()?;
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await
                .ok()?;
            let kind = tls.get_ref().1.handshake_kind();
            // One request read to its end, so the TLS 1.3 tickets sent after the handshake are
            // taken in (each resumption spends one).
            tls.write_all(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut sink = Vec::new();
            let _ = tls.read_to_end(&mut sink).await;
            Some(kind == Some(rustls::HandshakeKind::Resumed))
        }));
    }
    let (mut done, mut resumed) = (0, 0);
    for t in tasks {
        if let Ok(Some(r)) = t.await {
            done += 1;
            resumed += usize::from(r);
        }
    }
    let wall = t.elapsed().as_secs_f64();
    // The relay finishes its side of the last handshakes (and closes) right after.
    tokio::time::sleep(Duration::from_millis(200)).await;
    (done, resumed, wall, cpu_seconds(pid) - cpu0)
}

/// Full and resumed handshakes per relay CPU-second against the idle node.
async fn handshake_bench(addr: &str, ca_pem: &str, n: usize, conc: usize, pid: u32) {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let build = || {
        let mut c = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        c
    };
    let mut full = build();
    full.resumption = rustls::client::Resumption::disabled();
    let resuming = Arc::new(build());
    // Warm the ticket store: one ticket per concurrent slot at least.
    let _ = handshake_round(addr, resuming.clone(), conc * 2, conc, pid).await;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    for (what, cfg) in [("full", Arc::new(full)), ("resumed", resuming)] {
        let (done, resumed, wall, cpu) = handshake_round(addr, cfg, n, conc, pid).await;
        println!(
            "handshakes {what}: {done} done ({resumed} resumed) in {wall:.2} s = {:.0}/s wall, relay CPU {cpu:.2} s = {:.0} per relay CPU-second (loadavg {})",
            done as f64 / wall,
            done as f64 / cpu.max(0.01),
            load.trim()
        );
    }
}

/// Samples the relay's RSS and open files every 50 ms until `stop`: (peak RSS KiB, peak fds).
fn sample_peaks(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, usize)> {
    std::thread::spawn(move || {
        let (mut rss, mut fds) = (0u64, 0usize);
        while !stop.load(Ordering::SeqCst) {
            rss = rss.max(status_kib(pid, "VmRSS:"));
            fds = fds.max(open_fds(pid));
            std::thread::sleep(Duration::from_millis(50));
        }
        (rss.max(status_kib(pid, "VmHWM:")), fds)
    })
}

/// Sets up every host (bounded concurrency) and starts its desktop and phone tasks.
async fn setup_all(a: &Args, public: &str, sh: &Arc<Shared>) {
    let sem = Arc::new(Semaphore::new(a.setup_concurrency));
    let mut tasks = Vec::new();
    for i in 0..a.hosts {
        let (sem, public) = (sem.clone(), public.to_owned());
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire_owned().await.unwrap();
            // Setup runs at full speed too and may be refused (503 + Retry-After): retried.
            let mut attempt = 0;
            loop {
                match setup_host(i, &public).await {
                    Ok(h) => return Ok(h),
                    Err(e) if attempt == 20 => return Err(e),
                    Err(_) => tokio::time::sleep(backoff(attempt.min(3))).await,
                }
                attempt += 1;
            }
        }));
    }
    for t in tasks {
        let (host, control, phone, data) =
            t.await.unwrap().unwrap_or_else(|e| panic!("setup: {e}"));
        let host = Arc::new(host);
        tokio::spawn(drain(data));
        tokio::spawn(run_desktop(host.clone(), control, sh.clone()));
        tokio::spawn(run_phone(host, phone, sh.clone()));
    }
}

/// Waits until every host's control and phone are back, or the timeout.
async fn wait_back(sh: &Shared, hosts: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let c = sh.control_back.lock().unwrap().iter().flatten().count();
        let p = sh.phone_back.lock().unwrap().iter().flatten().count();
        if c == hosts && p == hosts {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Prints when `what` were all back, from `/ready` and from the restart (`started`: hosts
/// reconnect as soon as the listener takes connections, which can be before `/ready`).
fn report_back(what: &str, v: &[Option<Instant>], ready: Instant, started: Instant) -> Duration {
    let (d, missing) = since_ready(v, ready);
    let max = d.last().copied().unwrap_or_default();
    let from_start = since_ready(v, started)
        .0
        .last()
        .copied()
        .unwrap_or_default();
    println!(
        "{what}: all back {} ms after /ready, {} ms after the restart ({} back, {missing} missing); per host from /ready p50 {} ms, p99 {} ms, max {} ms",
        if missing == 0 { ms(max).to_string() } else { "never".into() },
        if missing == 0 { ms(from_start).to_string() } else { "never".into() },
        d.len(),
        ms(quantile(&d, 0.5)),
        ms(quantile(&d, 0.99)),
        ms(max)
    );
    if missing > 0 {
        Duration::MAX
    } else {
        max
    }
}

fn relay_envs(a: &Args, port: u16, public: &str, db_url: &str) -> Vec<(String, String)> {
    let mut envs: Vec<(String, String)> = [
        ("ORCA_RELAY_LISTEN", format!("127.0.0.1:{port}")),
        ("ORCA_RELAY_PUBLIC_URL", public.to_owned()),
        ("ORCA_RELAY_DATABASE_URL", db_url.to_owned()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING.to_owned()),
        ("ORCA_RELAY_TRUSTED_PROXY_HOPS", "1".to_owned()),
        ("ORCA_RELAY_CELL_MAX_CONNECTIONS", "100000".to_owned()),
        ("ORCA_RELAY_CELL_CAPACITY", "1000000".to_owned()),
        // Reads /metrics for the relay's own counts of the storm.
        ("ORCA_RELAY_ADMIN_TOKEN", ADMIN.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if db_url.starts_with("postgres") {
        // The director role on Postgres (a cluster-capable store) needs a cluster key.
        envs.push(("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()));
    }
    for kv in &a.relay_env {
        let (k, v) = kv.split_once('=').expect("--relay-env KEY=VALUE");
        envs.push((k.to_owned(), v.to_owned()));
    }
    envs
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let nofile = raise_nofile();
    let dir = tempfile::tempdir().expect("temp dir");
    let pg = match &a.postgres {
        Some(url) => {
            std::env::set_var("ORCA_RELAY_TEST_POSTGRES_URL", url);
            Some(TestDb::postgres().await.expect("postgres"))
        }
        None => None,
    };
    let db_url = pg.as_ref().map_or_else(
        || format!("sqlite://{}/orca-relay.sqlite3", dir.path().display()),
        |t| t.url.clone(),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let scheme = if a.tls { "https" } else { "http" };
    let public = format!("{scheme}://127.0.0.1:{port}");
    let mut envs = relay_envs(&a, port, &public, &db_url);
    let mut ca_pem = String::new();
    if a.tls {
        let (ca, c, k) = tls_files(dir.path());
        testkit::trust_extra_ca(ca.as_bytes());
        envs.push(("ORCA_RELAY_TLS_CERT".into(), c.display().to_string()));
        envs.push(("ORCA_RELAY_TLS_KEY".into(), k.display().to_string()));
        ca_pem = ca;
    }
    let mut relay = Relay {
        bin: relay_bin(),
        dir: dir.path().to_path_buf(),
        envs,
        public: public.clone(),
        child: None,
    };
    let pid = relay.start();
    relay.ready(Duration::from_secs(60)).await;
    let backend = if pg.is_some() { "postgres" } else { "sqlite" };
    println!(
        "storm_bench: {} hosts (+1 phone each), {backend}, {scheme}, nofile {nofile}, relay env {:?}",
        a.hosts, a.relay_env
    );
    if a.tls && a.handshakes > 0 {
        let addr = format!("127.0.0.1:{port}");
        handshake_bench(&addr, &ca_pem, a.handshakes, a.handshake_concurrency, pid).await;
    }
    let ok = storm(&a, &mut relay, pid).await;
    drop(relay);
    drop(pg);
    if !ok {
        std::process::exit(1);
    }
}

async fn storm(a: &Args, relay: &mut Relay, pid: u32) -> bool {
    let sh = Arc::new(Shared {
        control_back: Mutex::new(vec![None; a.hosts]),
        phone_back: Mutex::new(vec![None; a.hosts]),
        ..Shared::default()
    });
    let t = Instant::now();
    setup_all(a, &relay.public, &sh).await;
    println!(
        "setup: {} hosts paired in {:.1} s; relay RSS {} KiB, {} open files",
        a.hosts,
        t.elapsed().as_secs_f64(),
        status_kib(pid, "VmRSS:"),
        open_fds(pid)
    );
    sh.killed.store(true, Ordering::SeqCst);
    relay.kill();
    let killed = Instant::now();
    let pid = relay.start();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let peaks = sample_peaks(pid, stop.clone());
    let ready = relay.ready(Duration::from_secs(60)).await;
    sh.ready.store(true, Ordering::SeqCst);
    let cpu0 = cpu_seconds(pid);
    let dials0 = sh.dials.load(Ordering::SeqCst);
    println!(
        "restart: /ready {} ms after SIGKILL, {} ms after the new process started",
        ms(ready - killed),
        ms(ready - started)
    );
    wait_back(&sh, a.hosts, Duration::from_secs(a.timeout_s)).await;
    let storm_s = ready.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu0;
    stop.store(true, Ordering::SeqCst);
    let (rss, fds) = peaks.join().unwrap();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let c = report_back("controls", &sh.control_back.lock().unwrap(), ready, started);
    let p = report_back("phones", &sh.phone_back.lock().unwrap(), ready, started);
    let dials = sh.dials.load(Ordering::SeqCst) - dials0;
    println!(
        "relay during the storm: peak RSS {rss} KiB, peak open files {fds}, CPU {cpu:.2} s over {storm_s:.1} s; {dials} WebSocket connections{} = {:.0}/s; loadavg {}",
        if a.tls { " (TLS handshakes)" } else { "" },
        dials as f64 / storm_s,
        load.trim()
    );
    println!(
        "transport errors while the node was down: {}",
        sh.down_errors.load(Ordering::SeqCst)
    );
    let (mut without, mut without_429) = (0, 0);
    println!("refusals after /ready (cause: count, without Retry-After):");
    for (cause, (n, no_ra)) in sh.refusals.lock().unwrap().iter() {
        println!("  {cause}: {n}, {no_ra}");
        // A WebSocket upgrade's 429 (pre-auth limits) carries no Retry-After by contract
        // (docs/reference/websocket.md); every 503 must.
        if cause.contains(" upgrade 429") {
            without_429 += no_ra;
        } else {
            without += no_ra;
        }
    }
    println!("refusals without Retry-After: {without} (+ {without_429} upgrade 429s, which carry none by contract)");
    relay_counters(&relay.public).await;
    let goal = Duration::from_millis(a.goal_ms);
    let ok = c <= goal && p <= goal && without == 0;
    println!(
        "goal (every control and phone back within {} ms, no HTTP refusal without Retry-After): {}",
        a.goal_ms,
        if ok { "met" } else { "MISSED" }
    );
    ok
}

/// The relay's own counts of the storm: connections over its HTTP connection cap (answered 503,
/// or closed before the answer), sticky assigns by path (batched or one by one), the cells'
/// refused upgrades by gate and the director's assign outcomes.
async fn relay_counters(public: &str) {
    let got = testkit::http_client()
        .get(format!("{public}/metrics"))
        .bearer_auth(ADMIN)
        .timeout(WAIT)
        .send()
        .await;
    let text = match got {
        Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
        Ok(r) => {
            println!("relay counters: /metrics answered {}", r.status());
            return;
        }
        Err(e) => {
            println!("relay counters: /metrics failed: {e}");
            return;
        }
    };
    println!("relay counters (since the restart):");
    for l in text.lines().filter(|l| {
        l.starts_with("orca_relay_http_connections_refused_total")
            || l.starts_with("orca_relay_sticky_batch_hosts_total")
            || l.starts_with("orca_relay_http_keepalive_declined_total")
            || (l.starts_with("orca_relay_tls_handshake_failures_total") && !l.ends_with(" 0"))
            || l.starts_with("orca_relay_admission_rejections_total")
            || (l.starts_with("orca_relay_assignments_total") && !l.ends_with(" 0"))
    }) {
        println!("  {l}");
    }
}
