//! Load generator: pairs N hosts/phones through a running `orca-relay serve` with the real protocol
//! (host token, `/v1/assign`, host proof, invite, phone, data leg) and reports JSON:
//! frames/s relayed for 64 B and 16 KiB frames in both directions with a fixed number of frames in
//! flight per pair and direction, p50/p99 one-hop latency at a moderate rate, and the server's RSS
//! per idle paired connection (from `/proc/<pid>/status`).
//!
//! ```text
//! cargo run --release --example loadgen -- --url http://127.0.0.1:8080 --signing-key <key> \
//!     --server-pid <pid> --pairs 100 --inflight 16 --seconds 10 --idle-pairs 9000
//! ```
//! `--tls-url https://… [--ca test-ca.pem] [--tls-server-pid <pid>]` adds a second server with
//! built-in TLS: its pairs dial `wss://` and each throughput run is repeated over TLS right after
//! the plain one, reported under `wss` with the frames/s ratio.
//!
//! `--plain-url ws://…` measures a plain relay instead (pairs by `/a/<key>` and `/b/<key>`:
//! `examples/node_relay`, `examples/c_relay`), `--no-relay 1` measures the generator against
//! itself over loopback (its own floor and ceiling); `examples/compare.rs` runs all of them side by
//! side. `--latency-pairs N` runs the latency rounds on the first N pairs only.
//!
//! The server should trust one proxy hop (`ORCA_RELAY_TRUSTED_PROXY_HOPS=1`): every pair sends its
//! own `X-Forwarded-For` so pre-auth windows (30 per source per minute) are per pair.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use orca_relay::cell::testkit::{self, ClientWs, Hello, HostControl, HostIdentity, Pair};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;

struct Args {
    url: String,
    public_url: Option<String>,
    signing_key: String,
    server_pid: Option<u32>,
    pairs: usize,
    inflight: usize,
    seconds: u64,
    idle_pairs: usize,
    phones_per_host: usize,
    latency_rate: u64,
    /// A second server with built-in TLS: the same throughput runs over `wss://`, interleaved.
    tls_url: Option<String>,
    tls_public_url: Option<String>,
    tls_server_pid: Option<u32>,
    /// PEM CA the TLS server's certificate chains to (besides the system roots).
    ca: Option<String>,
    /// A plain relay (`examples/node_relay`, `ws://host:port`): latency rounds alternate between
    /// this server's pairs and pairs through the plain relay, medians reported.
    plain_relay: Option<String>,
    latency_rounds: usize,
    skip_throughput: bool,
    /// Measure a plain relay (`ws://host:port`, paired by `/a/<key>` and `/b/<key>`) instead of
    /// orca-relay: throughput and latency run on its pairs (`examples/compare.rs` uses this).
    plain_url: Option<String>,
    /// Measure no relay at all: each pair is one loopback TCP connection between the generator's
    /// own client and server sockets, the generator's floor (latency) and ceiling (throughput).
    no_relay: bool,
    /// Pairs used for the latency rounds (the first N of `--pairs`; default all of them).
    latency_pairs: Option<usize>,
    latency_seconds: u64,
    skip_latency: bool,
}

fn args() -> Args {
    let mut a = Args {
        url: "http://127.0.0.1:8080".into(),
        public_url: None,
        signing_key: std::env::var("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY").unwrap_or_default(),
        server_pid: None,
        pairs: 100,
        inflight: 16,
        seconds: 10,
        idle_pairs: 0,
        phones_per_host: 8,
        latency_rate: 10,
        tls_url: None,
        tls_public_url: None,
        tls_server_pid: None,
        ca: None,
        plain_relay: None,
        latency_rounds: 1,
        skip_throughput: false,
        plain_url: None,
        no_relay: false,
        latency_pairs: None,
        latency_seconds: 10,
        skip_latency: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        match argv[i].as_str() {
            "--url" => a.url = v,
            "--public-url" => a.public_url = Some(v),
            "--signing-key" => a.signing_key = v,
            "--server-pid" => a.server_pid = v.parse().ok(),
            "--pairs" => a.pairs = v.parse().expect("--pairs"),
            "--inflight" => a.inflight = v.parse().expect("--inflight"),
            "--seconds" => a.seconds = v.parse().expect("--seconds"),
            "--idle-pairs" => a.idle_pairs = v.parse().expect("--idle-pairs"),
            "--phones-per-host" => a.phones_per_host = v.parse().expect("--phones-per-host"),
            "--latency-rate" => a.latency_rate = v.parse().expect("--latency-rate"),
            "--tls-url" => a.tls_url = Some(v),
            "--tls-public-url" => a.tls_public_url = Some(v),
            "--tls-server-pid" => a.tls_server_pid = v.parse().ok(),
            "--ca" => a.ca = Some(v),
            "--plain-relay" => a.plain_relay = Some(v),
            "--latency-rounds" => a.latency_rounds = v.parse().expect("--latency-rounds"),
            "--skip-throughput" => a.skip_throughput = v == "1" || v == "true",
            "--plain-url" => a.plain_url = Some(v),
            "--no-relay" => a.no_relay = v == "1" || v == "true",
            "--latency-pairs" => a.latency_pairs = Some(v.parse().expect("--latency-pairs")),
            "--latency-seconds" => a.latency_seconds = v.parse().expect("--latency-seconds"),
            "--skip-latency" => a.skip_latency = v == "1" || v == "true",
            other => panic!("unknown flag {other}"),
        }
        i += 2;
    }
    a
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// utime + stime of a process, in seconds (clock ticks of 100 Hz).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Per thread name of a process: (CPU ticks, voluntary, involuntary context switches). An
/// involuntary switch is the OS taking the core from a thread that still had work: the scheduler's
/// share of a tail, told apart by thread (the runtime's workers, the store's threads, …).
fn sched_counters(pid: u32) -> Option<std::collections::BTreeMap<String, [u64; 3]>> {
    let mut out = std::collections::BTreeMap::<String, [u64; 3]>::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let mut name = String::new();
        let (mut vol, mut invol) = (0, 0);
        for l in status.lines() {
            let num = |p: &str| l.strip_prefix(p).and_then(|v| v.trim().parse::<u64>().ok());
            if let Some(n) = l.strip_prefix("Name:") {
                // Numbered threads of one pool count together ("sqlite-3" → "sqlite-").
                name = n
                    .trim()
                    .trim_end_matches(|c: char| c.is_ascii_digit())
                    .to_string();
            } else if let Some(v) = num("voluntary_ctxt_switches:") {
                vol = v;
            } else if let Some(v) = num("nonvoluntary_ctxt_switches:") {
                invol = v;
            }
        }
        let e = out.entry(name).or_default();
        e[0] += tick(11) + tick(12);
        e[1] += vol;
        e[2] += invol;
    }
    Some(out)
}

/// What the relay's threads did between two [`sched_counters`] readings.
fn sched_delta(
    before: &std::collections::BTreeMap<String, [u64; 3]>,
    after: &std::collections::BTreeMap<String, [u64; 3]>,
) -> serde_json::Value {
    let mut threads = serde_json::Map::new();
    let mut total = [0u64; 3];
    for (name, e) in after {
        let b = before.get(name).copied().unwrap_or_default();
        let d = [0, 1, 2].map(|i| e[i].saturating_sub(b[i]));
        if d.iter().any(|v| *v > 0) {
            threads.insert(
                name.clone(),
                json!({"cpuTicks": d[0], "voluntary": d[1], "involuntary": d[2]}),
            );
        }
        for i in 0..3 {
            total[i] += d[i];
        }
    }
    json!({
        "serverCpuSeconds": total[0] as f64 / 100.0,
        "serverVoluntaryContextSwitches": total[1],
        "serverInvoluntaryContextSwitches": total[2],
        "serverThreads": threads,
    })
}

static SOURCE: AtomicU64 = AtomicU64::new(1);

/// A distinct client source per pair (the server trusts one proxy hop).
fn source_header() -> Vec<(&'static str, String)> {
    let n = SOURCE.fetch_add(1, Ordering::Relaxed);
    vec![(
        "x-forwarded-for",
        format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255),
    )]
}

/// Keeps a host's control alive: answers pings until the socket closes.
fn keep_alive(mut c: HostControl) {
    tokio::spawn(async move { while c.recv(Duration::from_secs(3600)).await.is_ok() {} });
}

/// Sets up `hosts` hosts with `per_host` phones each; returns the pairs.
async fn setup(
    a: &Arc<Args>,
    tls: bool,
    tag: &str,
    hosts: usize,
    per_host: usize,
    concurrency: usize,
) -> Vec<Pair> {
    let (url, public) = if tls {
        (a.tls_url.clone().unwrap(), a.tls_public_url.clone())
    } else {
        (a.url.clone(), a.public_url.clone())
    };
    let profile = public.unwrap_or_else(|| url.clone());
    let sem = Arc::new(Semaphore::new(concurrency));
    let mut tasks = Vec::new();
    for h in 0..hosts {
        let a = a.clone();
        let sem = sem.clone();
        let profile = profile.clone();
        let url = url.clone();
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            let id = HostIdentity::generate(&format!("lg-{tag}-{h}"));
            let token = id.token(&a.signing_key, &profile);
            let mut attempt = 0;
            let (cell_url, epoch) = loop {
                match testkit::assign(&url, &token, &id.relay_host_id).await {
                    Ok(x) => break x,
                    Err(e) if attempt < 20 => {
                        attempt += 1;
                        eprintln!("assign retry: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("assign: {e}"),
                }
            };
            let hello = Hello {
                epoch,
                ..Hello::default()
            };
            let mut c = testkit::connect_control(&cell_url, &id, &token, &profile, &hello)
                .await
                .expect("control");
            let mut pairs = Vec::new();
            for p in 0..per_host {
                let invite = c
                    .create_invite(&format!("r{p}"), &format!("d{p}"))
                    .await
                    .expect("invite");
                let pair = testkit::pair_phone(
                    &cell_url,
                    &mut c,
                    &id.relay_host_id,
                    &invite,
                    &source_header(),
                )
                .await
                .expect("pair");
                pairs.push(pair);
            }
            keep_alive(c);
            pairs
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.extend(t.await.unwrap());
    }
    out
}

/// One client→server frame: binary, masked (fixed mask: the server must unmask any key).
fn masked_frame(size: usize) -> Vec<u8> {
    let mut f = vec![0x82u8];
    match size {
        0..=125 => f.push(0x80 | size as u8),
        126..=65535 => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(size as u16).to_be_bytes());
        }
        _ => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(size as u64).to_be_bytes());
        }
    }
    let mask = [0x37u8, 0xfa, 0x21, 0x3d];
    f.extend_from_slice(&mask);
    f.extend((0..size).map(|i| 0xa5 ^ mask[i % 4]));
    f
}

/// Length of one server→client frame of `size` payload bytes (unmasked).
fn server_frame_len(size: usize) -> usize {
    size + match size {
        0..=125 => 2,
        126..=65535 => 4,
        _ => 10,
    }
}

/// One direction of a raw driver: batch writes of pre-encoded frames, arrivals counted by bytes.
struct RawDir {
    out: usize,
    write_pos: usize,
    write_end: usize,
    acc: usize,
    frames: u64,
}

/// Drives one pair on the raw TCP streams under the WebSockets (at a frame boundary): up to
/// `inflight` frames outstanding per direction, windows refilled in batches. The generator stays
/// cheap (no per-frame parsing or masking), so the server is what gets measured.
///
/// `direct`: the pair is one loopback connection (`--no-relay`), `data` being the server end: the
/// masked frames written on one end arrive as they are on the other.
#[allow(clippy::too_many_arguments)]
async fn drive(
    phone: ClientWs,
    data: ClientWs,
    size: usize,
    inflight: usize,
    stop: Instant,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
    direct: bool,
) -> (ClientWs, ClientWs) {
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::MaybeTlsStream;
    let cfg = Some(testkit::client_config());
    let wrap = |s, role| tokio_tungstenite::WebSocketStream::from_raw_socket(s, role, cfg);
    let data_role = if direct { Role::Server } else { Role::Client };
    let in_len = if direct {
        masked_frame(size).len()
    } else {
        server_frame_len(size)
    };
    match (phone.into_inner(), data.into_inner()) {
        (MaybeTlsStream::Plain(p), MaybeTlsStream::Plain(d)) => {
            let (p, d) = drive_raw(p, d, size, in_len, inflight, stop, up, down).await;
            (
                wrap(MaybeTlsStream::Plain(p), Role::Client).await,
                wrap(MaybeTlsStream::Plain(d), data_role).await,
            )
        }
        (MaybeTlsStream::Rustls(p), MaybeTlsStream::Rustls(d)) => {
            let (p, d) = drive_raw(p, d, size, in_len, inflight, stop, up, down).await;
            (
                wrap(MaybeTlsStream::Rustls(p), Role::Client).await,
                wrap(MaybeTlsStream::Rustls(d), data_role).await,
            )
        }
        _ => panic!("both legs plain or both TLS"),
    }
}

/// [`drive`] on the byte streams (plain TCP, or the TLS client streams of `wss://`); `in_len` is
/// the length of one arriving frame.
#[allow(clippy::too_many_arguments)]
async fn drive_raw<S>(
    p: S,
    d: S,
    size: usize,
    in_len: usize,
    inflight: usize,
    stop: Instant,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
) -> (S, S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut p_r, mut p_w) = tokio::io::split(p);
    let (mut d_r, mut d_w) = tokio::io::split(d);
    let frame = masked_frame(size);
    let batch: Vec<u8> = frame
        .iter()
        .copied()
        .cycle()
        .take(frame.len() * inflight)
        .collect();
    let refill_at = inflight.saturating_sub((inflight / 4).max(1));
    let new_dir = || RawDir {
        out: 0,
        write_pos: 0,
        write_end: 0,
        acc: 0,
        frames: 0,
    };
    let (mut u, mut w) = (new_dir(), new_dir()); // u: phone→host, w: host→phone
    let mut bp = vec![0u8; 64 * 1024];
    let mut bd = vec![0u8; 64 * 1024];
    let mut check = 0u32;
    let mut sending = true;
    loop {
        check += 1;
        if check % 64 == 0 {
            sending = Instant::now() < stop;
        }
        for dir in [&mut u, &mut w] {
            if sending && dir.write_pos == dir.write_end && dir.out <= refill_at {
                let n = inflight - dir.out;
                dir.out = inflight;
                dir.write_pos = 0;
                dir.write_end = n * frame.len();
            }
        }
        if !sending
            && u.out == 0
            && w.out == 0
            && u.write_pos == u.write_end
            && w.write_pos == w.write_end
        {
            break;
        }
        let (uw, ww) = (u.write_pos < u.write_end, w.write_pos < w.write_end);
        tokio::select! {
            r = p_w.write(&batch[u.write_pos..u.write_end]), if uw => u.write_pos += r.expect("phone write"),
            r = d_w.write(&batch[w.write_pos..w.write_end]), if ww => w.write_pos += r.expect("data write"),
            r = d_r.read(&mut bd) => {
                let n = r.expect("data read");
                assert!(n > 0, "data leg closed");
                u.acc += n;
                let k = u.acc / in_len;
                u.acc %= in_len;
                u.out -= k;
                u.frames += k as u64;
            }
            r = p_r.read(&mut bp) => {
                let n = r.expect("phone read");
                assert!(n > 0, "phone closed");
                w.acc += n;
                let k = w.acc / in_len;
                w.acc %= in_len;
                w.out -= k;
                w.frames += k as u64;
            }
        }
    }
    let _ = (p_w.flush().await, d_w.flush().await);
    up.fetch_add(u.frames, Ordering::Relaxed);
    down.fetch_add(w.frames, Ordering::Relaxed);
    (p_r.unsplit(p_w), d_r.unsplit(d_w))
}

async fn throughput(
    pairs: Vec<Pair>,
    size: usize,
    inflight: usize,
    seconds: u64,
    pid: Option<u32>,
    direct: bool,
) -> (serde_json::Value, Vec<Pair>) {
    let cpu0 = pid.and_then(cpu_seconds);
    let up = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let stop = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    let mut meta = Vec::new();
    for p in pairs {
        meta.push((p.hello, p.conn_id));
        tasks.push(tokio::spawn(drive(
            p.phone,
            p.data,
            size,
            inflight,
            stop,
            up.clone(),
            down.clone(),
            direct,
        )));
    }
    let mut back = Vec::new();
    for (t, (hello, conn_id)) in tasks.into_iter().zip(meta) {
        let (phone, data) = t.await.unwrap();
        back.push(Pair {
            phone,
            data,
            hello,
            conn_id,
        });
    }
    let secs = started.elapsed().as_secs_f64();
    let (u, d) = (up.load(Ordering::Relaxed), down.load(Ordering::Relaxed));
    let fps = (u + d) as f64 / secs;
    let server_cpu = match (cpu0, pid.and_then(cpu_seconds)) {
        (Some(a), Some(b)) => b - a,
        _ => 0.0,
    };
    (
        json!({
            "serverCpuSeconds": server_cpu,
            "framesPerServerCpuSecond": if server_cpu > 0.0 { ((u + d) as f64 / server_cpu).round() } else { 0.0 },
            "frameBytes": size,
            "seconds": (secs * 100.0).round() / 100.0,
            "framesPhoneToHost": u,
            "framesHostToPhone": d,
            "framesPerSecond": fps.round(),
            "megabytesPerSecond": ((fps * size as f64) / 1e6 * 10.0).round() / 10.0,
        }),
        back,
    )
}

type Tx = futures_util::stream::SplitSink<ClientWs, Message>;
type Rx = futures_util::stream::SplitStream<ClientWs>;

/// Sends `n` timestamps (ns since `epoch`, 8 bytes) from `first` on, one per `period`.
async fn send_timestamps(
    mut tx: Tx,
    first: tokio::time::Instant,
    period: Duration,
    n: usize,
    epoch: Instant,
) -> Tx {
    let mut tick = tokio::time::interval_at(first, period);
    for _ in 0..n {
        tick.tick().await;
        let t = (epoch.elapsed().as_nanos() as u64).to_be_bytes();
        tx.send(Message::binary(t.to_vec())).await.unwrap();
    }
    tx
}

/// Reads `n` timestamps; returns (send time, one-way latency) in ns per message.
async fn receive_timestamps(mut rx: Rx, n: usize, epoch: Instant) -> (Vec<(u64, u64)>, Rx) {
    let mut samples = Vec::with_capacity(n);
    while samples.len() < n {
        match rx.next().await {
            Some(Ok(Message::Binary(b))) if b.len() == 8 => {
                let sent = u64::from_be_bytes(b[..8].try_into().unwrap());
                samples.push((sent, epoch.elapsed().as_nanos() as u64 - sent));
            }
            Some(Ok(_)) => {} // pings (answered by tungstenite), pongs
            other => panic!("latency socket ended: {other:?}"),
        }
    }
    (samples, rx)
}

/// One-way latency at `rate` messages/s per pair and direction: the send time rides in the
/// payload. The 2 × pairs senders are spread evenly over one period (pair i's phone→host at slot
/// 2i, host→phone at 2i+1), so the relay sees a steady stream (1,000 msgs/s is one message per
/// millisecond), not one burst per period; every socket has its own reader, so a late message on
/// one socket never delays reading another. The slowest samples are reported with their send
/// times, to see whether the tail is periodic (a timer in the relay) or scattered.
async fn latency(pairs: Vec<Pair>, rate: u64, seconds: u64) -> (serde_json::Value, Vec<Pair>) {
    let epoch = Instant::now();
    let period = Duration::from_micros(1_000_000 / rate.max(1));
    let n = (rate * seconds) as usize;
    let slots = 2 * pairs.len().max(1) as u32;
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let at = |slot: usize| start + period * slot as u32 / slots;
    let mut tasks = Vec::new();
    for (i, p) in pairs.into_iter().enumerate() {
        let (hello, conn_id) = (p.hello, p.conn_id);
        let (ptx, prx) = p.phone.split();
        let (dtx, drx) = p.data.split();
        let up = tokio::spawn(send_timestamps(ptx, at(2 * i), period, n, epoch));
        let down = tokio::spawn(send_timestamps(dtx, at(2 * i + 1), period, n, epoch));
        let up_rx = tokio::spawn(receive_timestamps(drx, n, epoch));
        let down_rx = tokio::spawn(receive_timestamps(prx, n, epoch));
        tasks.push(async move {
            let (mut a, drx) = up_rx.await.unwrap();
            let (b, prx) = down_rx.await.unwrap();
            let (ptx, dtx) = (up.await.unwrap(), down.await.unwrap());
            a.extend(b);
            let pair = Pair {
                phone: ptx.reunite(prx).expect("same socket"),
                data: dtx.reunite(drx).expect("same socket"),
                hello,
                conn_id,
            };
            (a, pair)
        });
    }
    let mut all = Vec::new();
    let mut back = Vec::new();
    for t in tasks {
        let (samples, pair) = t.await;
        all.extend(samples);
        back.push(pair);
    }
    let mut lat: Vec<u64> = all.iter().map(|s| s.1).collect();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    all.sort_unstable_by_key(|s| std::cmp::Reverse(s.1));
    let t0 = all.iter().map(|s| s.0).min().unwrap_or(0);
    let worst: Vec<_> = all
        .iter()
        .take(8)
        .map(|&(sent, l)| json!([((sent - t0) as f64 / 1e6).round(), (l as f64 / 1e3).round()]))
        .collect();
    (
        json!({
            "ratePerPairAndDirection": rate,
            "samples": lat.len(),
            "p50Micros": pct(0.50),
            "p99Micros": pct(0.99),
            "p999Micros": pct(0.999),
            "maxMicros": pct(1.0),
            "worstSendMsAndMicros": worst,
        }),
        back,
    )
}

/// `n` pairs through a plain relay: `/a/<key>` and `/b/<key>` are paired by it.
async fn plain_pairs(relay: &str, n: usize) -> Vec<Pair> {
    let mut out = Vec::new();
    for i in 0..n {
        let dial = |side: &str| {
            let url = format!("{relay}/{side}/lg{i}");
            async move {
                let (ws, _) = tokio_tungstenite::connect_async_with_config(
                    url,
                    Some(testkit::client_config()),
                    true,
                )
                .await
                .expect("plain relay dial");
                ws
            }
        };
        out.push(Pair {
            phone: dial("a").await,
            data: dial("b").await,
            hello: json!(null),
            conn_id: String::new(),
        });
    }
    out
}

/// `n` pairs with no relay between them (`--no-relay`): the phone end dials the generator's own
/// loopback listener with the same client stack, and the data end is the accepted socket as a
/// server-role WebSocket (Nagle off on both ends, as every relay here sets it).
async fn direct_pairs(n: usize) -> Vec<Pair> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("ws://{}/direct", listener.local_addr().expect("addr"));
    let mut out = Vec::new();
    for _ in 0..n {
        let accept = async {
            let (tcp, _) = listener.accept().await.expect("accept");
            tcp.set_nodelay(true).expect("nodelay");
            tokio_tungstenite::accept_async_with_config(
                tokio_tungstenite::MaybeTlsStream::Plain(tcp),
                Some(testkit::client_config()),
            )
            .await
            .expect("accept handshake")
        };
        let dial = async {
            let (ws, _) = tokio_tungstenite::connect_async_with_config(
                url.as_str(),
                Some(testkit::client_config()),
                true,
            )
            .await
            .expect("dial");
            ws
        };
        let (data, phone) = tokio::join!(accept, dial);
        out.push(Pair {
            phone,
            data,
            hello: json!(null),
            conn_id: String::new(),
        });
    }
    out
}

/// The median of one field over rounds.
fn median(rounds: &[serde_json::Value], key: &str) -> f64 {
    let mut v: Vec<f64> = rounds.iter().filter_map(|r| r[key].as_f64()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = Arc::new(args());
    let mut report = serde_json::Map::new();
    let t = Instant::now();
    if let Some(ca) = &a.ca {
        testkit::trust_extra_ca(&std::fs::read(ca).expect("--ca file"));
    }
    let pairs = if a.no_relay {
        direct_pairs(a.pairs).await
    } else if let Some(url) = &a.plain_url {
        plain_pairs(url, a.pairs).await
    } else {
        setup(&a, false, "tp", a.pairs, 1, 32).await
    };
    report.insert("pairs".into(), json!(pairs.len()));
    report.insert("setupSeconds".into(), json!(t.elapsed().as_secs_f64()));
    let mut tls_pairs = match &a.tls_url {
        Some(_) => Some(setup(&a, true, "tls", a.pairs, 1, 32).await),
        None => None,
    };
    let mut tls_report = serde_json::Map::new();
    let mut pairs = pairs;
    let sizes: &[(usize, &str)] = if a.skip_throughput {
        &[]
    } else {
        &[(64, "throughput64B"), (16 * 1024, "throughput16KiB")]
    };
    for &(size, key) in sizes {
        let (plain, back) =
            throughput(pairs, size, a.inflight, a.seconds, a.server_pid, a.no_relay).await;
        pairs = back;
        eprintln!("{key} ws: {plain}");
        // Interleaved with the plain run, so both see the same machine load.
        if let Some(tp) = tls_pairs.take() {
            let (tls, back) =
                throughput(tp, size, a.inflight, a.seconds, a.tls_server_pid, false).await;
            tls_pairs = Some(back);
            eprintln!("{key} wss: {tls}");
            let ratio = tls["framesPerSecond"].as_f64().unwrap_or(0.0)
                / plain["framesPerSecond"].as_f64().unwrap_or(1.0).max(1.0);
            tls_report.insert(key.into(), tls);
            tls_report.insert(
                format!("{key}WssToWsRatio"),
                json!((ratio * 1000.0).round() / 1000.0),
            );
        }
        report.insert(key.into(), plain);
    }
    if !tls_report.is_empty() {
        report.insert("wss".into(), serde_json::Value::Object(tls_report));
    }
    drop(tls_pairs);
    let latency_pairs = a.latency_pairs.unwrap_or(a.pairs).min(pairs.len());
    let mut plain = match &a.plain_relay {
        Some(r) => Some(plain_pairs(r, latency_pairs).await),
        None => None,
    };
    // Alternating rounds (ours, plain, ours, plain, …): both see the same machine load.
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let rounds = if a.skip_latency {
        0
    } else {
        a.latency_rounds.max(1)
    };
    for round in 0..rounds {
        let rest = pairs.split_off(latency_pairs);
        let before = a.server_pid.and_then(sched_counters);
        let (mut lat, back) = latency(pairs, a.latency_rate, a.latency_seconds).await;
        if let (Some(b), Some(e)) = (before, a.server_pid.and_then(sched_counters)) {
            if let (Some(l), serde_json::Value::Object(d)) =
                (lat.as_object_mut(), sched_delta(&b, &e))
            {
                l.extend(d);
            }
        }
        pairs = back;
        pairs.extend(rest);
        eprintln!("latency round {round}: {lat}");
        ours.push(lat);
        if let Some(pp) = plain.take() {
            let (lat, back) = latency(pp, a.latency_rate, a.latency_seconds).await;
            plain = Some(back);
            eprintln!("plain relay latency round {round}: {lat}");
            theirs.push(lat);
        }
    }
    let summary = |r: &[serde_json::Value]| {
        json!({
            "rounds": r,
            "medianP50Micros": median(r, "p50Micros"),
            "medianP99Micros": median(r, "p99Micros"),
            "medianP999Micros": median(r, "p999Micros"),
        })
    };
    if !ours.is_empty() {
        report.insert("latency".into(), summary(&ours));
    }
    if !theirs.is_empty() {
        report.insert("plainRelayLatency".into(), summary(&theirs));
    }
    drop(plain);
    if a.idle_pairs > 0 {
        let pid = a.server_pid.expect("--server-pid for the idle measurement");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = rss_kib(pid).unwrap_or(0);
        let per_host = a.phones_per_host.max(1);
        let hosts = a.idle_pairs.div_ceil(per_host);
        let t = Instant::now();
        let idle = setup(&a, false, "idle", hosts, per_host, 32).await;
        let setup_s = t.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = rss_kib(pid).unwrap_or(0);
        let sockets = idle.len() * 2 + hosts;
        let grown = after.saturating_sub(before) as f64;
        report.insert(
            "idle".into(),
            json!({
                "pairs": idle.len(),
                "hosts": hosts,
                "webSockets": sockets,
                "setupSeconds": setup_s,
                "serverRssKiBBefore": before,
                "serverRssKiBAfter": after,
                "kibPerWebSocket": (grown / sockets as f64 * 100.0).round() / 100.0,
                "kibPerPairedConnection": (grown / idle.len() as f64 * 100.0).round() / 100.0,
            }),
        );
        drop(idle);
    }
    println!("{}", serde_json::Value::Object(report));
}
