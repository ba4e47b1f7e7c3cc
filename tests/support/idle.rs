//! Idle-memory measurement shared by `tests/memory_idle.rs` and `examples/idle_bench.rs` (part of the
//! support tree): a real `orca-relay serve` process on an ephemeral port, N idle pairs
//! through the real protocol (host token, `/v1/assign`, control, invite, phone, data leg), and the
//! server's RSS growth per WebSocket from `/proc/<pid>/status`. With TLS the server listens with a
//! certificate from a CA made for the run (ECDSA P-256), and every leg and request is `https`/`wss`.

use super::tls;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orca_relay::cell::testkit::{self, Hello, HostControl, HostIdentity, Pair};
use tokio::sync::Semaphore;

pub const SIGNING: &str = "0123456789abcdef0123456789abcdef";

/// Raises the open-file soft limit to the hard limit (children inherit it); returns the limit.
pub fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
    r.rlim_cur
}

pub struct Server {
    pub child: Child,
    pub url: String,
    pub tls: bool,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin serve` (role all, SQLite in a temp dir, one trusted proxy hop so every pair is its
/// own pre-auth source) with `envs` added; with `tls` on its own listener (a test CA's certificate
/// for 127.0.0.1, trusted by this process's test clients).
pub fn spawn(bin: &str, envs: &[(String, String)], tls: bool) -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut tls_env = Vec::new();
    if tls {
        let ca = tls::TestCa::new("orca idle bench ca");
        let (cert, key) = ca.issue(&["127.0.0.1", "localhost"]);
        let (c, k) = tls::write_pair(dir.path(), &cert, &key);
        testkit::trust_extra_ca(ca.pem.as_bytes());
        tls_env.push(("ORCA_RELAY_TLS_CERT", c.display().to_string()));
        tls_env.push(("ORCA_RELAY_TLS_KEY", k.display().to_string()));
    }
    let bin = std::fs::canonicalize(bin).unwrap_or_else(|_| bin.into());
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn,orca_relay=info")
        .env("ORCA_RELAY_LISTEN", "127.0.0.1:0")
        .env("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING)
        .env("ORCA_RELAY_TRUSTED_PROXY_HOPS", "1")
        .env("ORCA_RELAY_CELL_MAX_CONNECTIONS", "100000")
        .env("ORCA_RELAY_CELL_CAPACITY", "1000000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in tls_env {
        cmd.env(k, v);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn orca-relay");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(i) = line
                .find("listening on http://")
                .or_else(|| line.find("listening on https://"))
            {
                let _ = tx.send(line[i + "listening on ".len()..].trim().to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server did not start");
    Server {
        child,
        url,
        tls,
        _dir: dir,
    }
}

pub fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The idle connections of one run: keep them alive until the measurement is taken.
pub struct Idle {
    pub pairs: Vec<Pair>,
    pub controls: Vec<HostControl>,
}

/// A host's assign and control; a `503` (a busy lane on a loaded machine: it carries
/// `Retry-After`) is retried after a pause, as the apps do, at most 20 times.
async fn control(url: &str, id: &HostIdentity, token: &str) -> (String, HostControl) {
    let mut tries = 0;
    loop {
        let (cell_url, epoch) = match testkit::assign(url, token, &id.relay_host_id).await {
            Ok(a) => a,
            Err(e) if e.contains("503") && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => panic!("assign: {e}"),
        };
        let hello = Hello {
            epoch,
            ..Hello::default()
        };
        match testkit::connect_control(&cell_url, id, token, url, &hello).await {
            Ok(c) => return (cell_url, c),
            Err((_, e)) if e.contains("503") && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("control: {e:?}"),
        }
    }
}

/// `hosts` hosts with `per_host` idle pairs each, `concurrency` hosts being set up at a time.
pub async fn idle_pairs(
    url: &str,
    label: &str,
    hosts: usize,
    per_host: usize,
    concurrency: usize,
) -> Idle {
    static SOURCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let sem = Arc::new(Semaphore::new(concurrency));
    let mut tasks = Vec::new();
    for h in 0..hosts {
        let sem = sem.clone();
        let url = url.to_owned();
        let user = format!("{label}-{h}");
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.expect("semaphore");
            let id = HostIdentity::generate(&user);
            let token = id.token(SIGNING, &url);
            let (cell_url, mut c) = control(&url, &id, &token).await;
            let mut pairs = Vec::new();
            for p in 0..per_host {
                let invite = c
                    .create_invite(&format!("r{p}"), &format!("d{p}"))
                    .await
                    .expect("invite");
                let n = SOURCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let source = vec![(
                    "x-forwarded-for",
                    format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255),
                )];
                let pair =
                    testkit::pair_phone(&cell_url, &mut c, &id.relay_host_id, &invite, &source)
                        .await
                        .expect("pair");
                pairs.push(pair);
            }
            (pairs, c)
        }));
    }
    let mut idle = Idle {
        pairs: Vec::new(),
        controls: Vec::new(),
    };
    for t in tasks {
        let (p, c) = t.await.expect("host task");
        idle.pairs.extend(p);
        idle.controls.push(c);
    }
    idle
}

/// The server's RSS once idle: idle splices park within two sweep rounds (2 s), so no sample is
/// taken before 3 s; then every 500 ms until two samples in a row do not drop, at most `limit`.
pub async fn settled_rss(pid: u32, limit: Duration) -> u64 {
    let until = Instant::now() + limit;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut last = rss_kib(pid);
    let mut steady = 0;
    while Instant::now() < until && steady < 2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = rss_kib(pid);
        steady = if now + 16 >= last { steady + 1 } else { 0 };
        last = now;
    }
    last
}

/// Hosts (each with its phones) set up and closed before the baseline is taken.
pub const WARM_UP_HOSTS: usize = 4;

/// One measurement: RSS before, after, and per WebSocket (pairs × 2 + controls).
#[derive(Debug, Clone, Copy)]
pub struct Measure {
    pub pairs: usize,
    pub sockets: usize,
    /// RSS before the warm-up (see [`measure`]).
    pub cold_before_kib: u64,
    pub before_kib: u64,
    pub after_kib: u64,
    pub setup_secs: f64,
}

impl Measure {
    pub fn kib_per_socket(&self) -> f64 {
        self.after_kib.saturating_sub(self.before_kib) as f64 / self.sockets as f64
    }
    /// The same growth counted from before the warm-up (one-off costs charged to the sockets).
    pub fn kib_per_socket_cold(&self) -> f64 {
        self.after_kib.saturating_sub(self.cold_before_kib) as f64 / self.sockets as f64
    }
}

/// Sets up `pairs` idle pairs on `server` and measures; returns the connections too (dropping them
/// closes everything).
///
/// The baseline is taken after a warm-up (a few hosts' pairs set up and closed again), so it
/// already holds what a process that has served anything holds once, whatever the number of
/// connections: the code paths' pages, the runtime's worker and store allocations. The figure
/// is what each further idle WebSocket costs; `cold_before_kib` is the RSS before the warm-up.
pub async fn measure(server: &Server, pairs: usize, per_host: usize) -> (Measure, Idle) {
    let pid = server.child.id();
    let cold_before = settled_rss(pid, Duration::from_secs(5)).await;
    drop(idle_pairs(&server.url, "warm-up", WARM_UP_HOSTS, per_host, 32).await);
    let before = settled_rss(pid, Duration::from_secs(5)).await;
    let hosts = pairs.div_ceil(per_host);
    let t = Instant::now();
    let idle = idle_pairs(&server.url, "idle", hosts, per_host, 32).await;
    let setup_secs = t.elapsed().as_secs_f64();
    let after = settled_rss(pid, Duration::from_secs(15)).await;
    let m = Measure {
        pairs: idle.pairs.len(),
        sockets: idle.pairs.len() * 2 + idle.controls.len(),
        cold_before_kib: cold_before,
        before_kib: before,
        after_kib: after,
        setup_secs,
    };
    (m, idle)
}
