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
//! The server should trust one proxy hop (`ORCA_RELAY_TRUSTED_PROXY_HOPS=1`): every pair sends its
//! own `X-Forwarded-For` so pre-auth windows (30 per source per minute) are per pair.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
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
    tag: &str,
    hosts: usize,
    per_host: usize,
    concurrency: usize,
) -> Vec<Pair> {
    let profile = a.public_url.clone().unwrap_or_else(|| a.url.clone());
    let sem = Arc::new(Semaphore::new(concurrency));
    let mut tasks = Vec::new();
    for h in 0..hosts {
        let a = a.clone();
        let sem = sem.clone();
        let profile = profile.clone();
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            let id = HostIdentity::generate(&format!("lg-{tag}-{h}"));
            let token = id.token(&a.signing_key, &profile);
            let mut attempt = 0;
            let (cell_url, epoch) = loop {
                match testkit::assign(&a.url, &token, &id.relay_host_id).await {
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

/// Drives one pair: `inflight` frames outstanding in each direction, both sockets in one task.
async fn drive(
    mut phone: ClientWs,
    mut data: ClientWs,
    payload: Bytes,
    inflight: usize,
    stop: Instant,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
) -> (ClientWs, ClientWs) {
    let (mut up_out, mut down_out) = (0usize, 0usize);
    let (mut n_up, mut n_down) = (0u64, 0u64);
    loop {
        let sending = Instant::now() < stop;
        if sending {
            if up_out < inflight {
                while up_out < inflight {
                    phone.feed(Message::Binary(payload.clone())).await.unwrap();
                    up_out += 1;
                }
                phone.flush().await.unwrap();
            }
            if down_out < inflight {
                while down_out < inflight {
                    data.feed(Message::Binary(payload.clone())).await.unwrap();
                    down_out += 1;
                }
                data.flush().await.unwrap();
            }
        } else if up_out == 0 && down_out == 0 {
            break;
        }
        tokio::select! {
            m = data.next() => { if matches!(m, Some(Ok(Message::Binary(_)))) { up_out -= 1; n_up += 1; } else { break } }
            m = phone.next() => { if matches!(m, Some(Ok(Message::Binary(_)))) { down_out -= 1; n_down += 1; } else { break } }
        }
    }
    up.fetch_add(n_up, Ordering::Relaxed);
    down.fetch_add(n_down, Ordering::Relaxed);
    (phone, data)
}

async fn throughput(
    pairs: Vec<Pair>,
    size: usize,
    inflight: usize,
    seconds: u64,
) -> (serde_json::Value, Vec<Pair>) {
    let payload = Bytes::from(vec![0xa5u8; size]);
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
            payload.clone(),
            inflight,
            stop,
            up.clone(),
            down.clone(),
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
    (
        json!({
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

/// One-hop latency at `rate` messages/s per pair and direction: timestamps ride in the payload.
async fn latency(pairs: Vec<Pair>, rate: u64, seconds: u64) -> serde_json::Value {
    let epoch = Instant::now();
    let mut tasks = Vec::new();
    for p in pairs {
        tasks.push(tokio::spawn(async move {
            let (mut ptx, mut prx) = p.phone.split();
            let (mut dtx, mut drx) = p.data.split();
            let period = Duration::from_micros(1_000_000 / rate.max(1));
            let n = rate * seconds;
            let sender = tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                for _ in 0..n {
                    tick.tick().await;
                    let t = (epoch.elapsed().as_nanos() as u64).to_be_bytes().to_vec();
                    ptx.send(Message::binary(t.clone())).await.unwrap();
                    dtx.send(Message::binary(t)).await.unwrap();
                }
            });
            let mut samples = Vec::with_capacity(2 * n as usize);
            let read = |m: Option<Result<Message, _>>| -> Option<u64> {
                match m {
                    Some(Ok(Message::Binary(b))) if b.len() == 8 => {
                        let sent = u64::from_be_bytes(b[..8].try_into().unwrap());
                        Some(epoch.elapsed().as_nanos() as u64 - sent)
                    }
                    _ => None,
                }
            };
            for _ in 0..n {
                samples.extend(read(drx.next().await));
                samples.extend(read(prx.next().await));
            }
            sender.await.unwrap();
            samples
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    json!({"ratePerPairAndDirection": rate, "samples": all.len(), "p50Micros": pct(0.50), "p99Micros": pct(0.99)})
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = Arc::new(args());
    let mut report = serde_json::Map::new();
    let t = Instant::now();
    let pairs = setup(&a, "tp", a.pairs, 1, 32).await;
    report.insert("pairs".into(), json!(pairs.len()));
    report.insert("setupSeconds".into(), json!(t.elapsed().as_secs_f64()));
    let (small, pairs) = throughput(pairs, 64, a.inflight, a.seconds).await;
    eprintln!("64 B: {small}");
    report.insert("throughput64B".into(), small);
    let (large, pairs) = throughput(pairs, 16 * 1024, a.inflight, a.seconds).await;
    eprintln!("16 KiB: {large}");
    report.insert("throughput16KiB".into(), large);
    let lat = latency(pairs, a.latency_rate, a.seconds.min(10)).await;
    eprintln!("latency: {lat}");
    report.insert("latency".into(), lat);
    if a.idle_pairs > 0 {
        let pid = a.server_pid.expect("--server-pid for the idle measurement");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = rss_kib(pid).unwrap_or(0);
        let per_host = a.phones_per_host.max(1);
        let hosts = a.idle_pairs.div_ceil(per_host);
        let t = Instant::now();
        let idle = setup(&a, "idle", hosts, per_host, 32).await;
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
