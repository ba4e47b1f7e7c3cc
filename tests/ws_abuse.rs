//! Abuse (issue 11): a real `orca-relay` process (single node, SQLite, one trusted proxy hop so
//! each attacker can claim its own source) under four attacks at once:
//!
//! - slow-header sockets: 200 HTTP requests that send one header byte a second;
//! - never-first-frame sockets: phone legs upgraded from 8 sources, 4 each (the per-source
//!   pre-auth limit), that never send a frame, re-opened as soon as the cell closes them;
//! - phones that never read: 3 spliced phones whose hosts send 1 MiB frames at them;
//! - a flood of bad first frames (not JSON, wrong type, unknown keys, oversized) from hundreds of
//!   sources.
//!
//! Asserts: the over-limit pre-auth sockets are refused, the never-first-frame ones are closed by
//! the first-frame deadline, the stalled phones' splices are closed (wedge) instead of buffering
//! without end, the process's fds and RSS stay within the bounds docs/development.md, "Resource bounds" documents
//! (and fds return to the baseline afterwards), and a legitimate host and phone pair during the
//! attack. Prints the peaks and the pairing time.

mod support;
use support::cluster;
use support::faults;
use support::raw_ws;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::*;
use faults::*;
use futures_util::SinkExt;
use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::contract::limits::{
    FIRST_FRAME_MS, PREAUTH_CELL_MAX, PREAUTH_SOURCE_MAX, SPLICE_OVERFLOW_DIRECTION_MAX,
};
use orca_relay::store::testing::temp_dir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const SLOW_HEADERS: usize = 200;
const SILENT_SOURCES: usize = 8;
const STALLED: usize = 3;
const BAD_FRAMES: usize = 400;
/// The flood's sockets in flight at once.
const FLOOD_CONCURRENCY: usize = 16;
/// Allocator, per-socket buffers and runtime growth allowed on top of the documented buffers.
const RSS_SLACK: u64 = 64 << 20;
/// fds allowed on top of the attack's own sockets (pool, listeners, legit legs, timing).
const FD_SLACK: u64 = 64;

fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// Raw upgrade of `path` claiming source `xff`: the socket after a 101, or the status line.
async fn upgrade(addr: SocketAddr, path: &str, xff: &str) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Forwarded-For: {xff}\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await {
            Ok(Ok(1)) => got.push(b[0]),
            _ => return Err(format!("closed: {}", String::from_utf8_lossy(&got))),
        }
    }
    let head = String::from_utf8_lossy(&got).to_string();
    if head.starts_with("HTTP/1.1 101") {
        Ok(s)
    } else {
        Err(head.lines().next().unwrap_or("").to_string())
    }
}

/// A masked client text frame.
fn frame(payload: &[u8]) -> Vec<u8> {
    raw_ws::frame(0x81, payload, Some([0x5a, 0x21, 0x0f, 0x77]))
}

/// Reads until the server closes (EOF or error) or `within` passes: true if it closed.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_stay_bounded_and_a_legit_pair_still_works() {
    let dir = temp_dir("ws-abuse");
    let db_url = format!("sqlite://{}/relay.sqlite3", dir.display());
    let (mut node, url) = single_node(
        "node",
        &db_url,
        &dir.display().to_string(),
        &[("ORCA_RELAY_TRUSTED_PROXY_HOPS", "1")],
    );
    node.start();
    let pid = pid(&node);
    let addr: SocketAddr = url.trim_start_matches("http://").parse().unwrap();

    // The victims of the never-reading attack and the attack's target host, placed first.
    let (host, mut control, _, cell, _) = {
        let h = HostIdentity::generate("abuse-target");
        let token = h.token(SIGNING, &url);
        let (cell, epoch) = testkit::assign(&url, &token, &h.relay_host_id)
            .await
            .unwrap();
        let hello = Hello {
            epoch,
            ..Hello::default()
        };
        let c = testkit::connect_control(&cell, &h, &token, &url, &hello)
            .await
            .unwrap();
        (h, c, (), cell, epoch)
    };
    let mut stalled = Vec::new();
    for i in 0..STALLED {
        let invite = control
            .create_invite(&format!("s{i}"), &format!("ds{i}"))
            .await
            .unwrap();
        let xff = vec![("x-forwarded-for", format!("10.9.0.{}", i + 1))];
        stalled.push(
            testkit::pair_phone(&cell, &mut control, &host.relay_host_id, &invite, &xff)
                .await
                .unwrap(),
        );
    }
    let phone_path = format!("/v1/connect/{}", host.relay_host_id);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base_rss = rss(pid);
    let base_fds = fds(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    // 1. Slow headers: one byte a second; hyper's header read timeout (10 s) closes them.
    let slow: Vec<_> = (0..SLOW_HEADERS)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.ok()?;
                let t0 = Instant::now();
                let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").await;
                let mut buf = [0u8; 256];
                for _ in 0..40 {
                    if s.write_all(b"X").await.is_err() {
                        return Some(t0.elapsed());
                    }
                    match tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
                        Ok(Ok(0)) | Ok(Err(_)) => return Some(t0.elapsed()),
                        _ => {}
                    }
                }
                None
            })
        })
        .collect();

    // 2. Never-first-frame phone legs, SILENT_SOURCES sources up to their limit, re-opened.
    let admitted = Arc::new(AtomicU64::new(0));
    let refused_over_limit = Arc::new(AtomicU64::new(0));
    let late_close = Arc::new(AtomicU64::new(0));
    let mut silent = Vec::new();
    for src in 0..SILENT_SOURCES {
        for slot in 0..=PREAUTH_SOURCE_MAX {
            let (stop, admitted, refused, late, path) = (
                stop.clone(),
                admitted.clone(),
                refused_over_limit.clone(),
                late_close.clone(),
                phone_path.clone(),
            );
            silent.push(tokio::spawn(async move {
                let xff = format!("10.7.{src}.1");
                // Slot PREAUTH_SOURCE_MAX is one over the per-source limit: it opens after the
                // others hold theirs and must be refused while they do.
                if slot == PREAUTH_SOURCE_MAX {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                while !stop.load(Ordering::SeqCst) {
                    match upgrade(addr, &path, &xff).await {
                        Ok(mut s) => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            let t0 = Instant::now();
                            if !closed_within(&mut s, Duration::from_millis(FIRST_FRAME_MS + 3_000))
                                .await
                            {
                                late.fetch_add(1, Ordering::Relaxed);
                            }
                            let _ = t0;
                        }
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            }));
        }
    }

    // 3. Phones that never read: their hosts push 1 MiB frames until the cell stops them.
    let pushed = Arc::new(AtomicU64::new(0));
    let mut phones = Vec::new();
    let mut pushers = Vec::new();
    for p in stalled {
        let testkit::Pair {
            phone, mut data, ..
        } = p;
        phones.push(phone);
        let pushed = pushed.clone();
        pushers.push(tokio::spawn(async move {
            let chunk = vec![7u8; 1 << 20];
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(30) {
                match tokio::time::timeout(
                    Duration::from_secs(30),
                    data.send(Message::binary(chunk.clone())),
                )
                .await
                {
                    Ok(Ok(())) => {
                        pushed.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => return (t0.elapsed(), true),
                }
            }
            (t0.elapsed(), false)
        }));
    }

    // 4. A flood of bad first frames from many sources.
    let flood = {
        let path = phone_path.clone();
        tokio::spawn(async move {
            let gate = Arc::new(tokio::sync::Semaphore::new(FLOOD_CONCURRENCY));
            let closed = Arc::new(AtomicU64::new(0));
            let refused = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for i in 0..BAD_FRAMES {
                let permit = gate.clone().acquire_owned().await.unwrap();
                let (path, closed, refused) = (path.clone(), closed.clone(), refused.clone());
                tasks.push(tokio::spawn(async move {
                    let _permit = permit;
                    let xff = format!("10.{}.{}.{}", 20 + i / 65536, (i / 256) % 256, i % 256);
                    let payload: Vec<u8> = match i % 4 {
                        0 => b"not json at all".to_vec(),
                        1 => br#"{"type":"host-hello","v":1}"#.to_vec(),
                        2 => br#"{"type":"relay-auth","v":1,"mode":"connect","credential":"x","extra":1}"#.to_vec(),
                        _ => vec![b'x'; 64 * 1024],
                    };
                    match upgrade(addr, &path, &xff).await {
                        Ok(mut s) => {
                            let _ = s.write_all(&frame(&payload)).await;
                            if closed_within(&mut s, Duration::from_secs(5)).await {
                                closed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            (
                closed.load(Ordering::Relaxed),
                refused.load(Ordering::Relaxed),
            )
        })
    };

    // Sample the process while the attacks run.
    let sampler = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut peak_rss, mut peak_fds) = (0, 0);
            while !stop.load(Ordering::SeqCst) {
                peak_rss = peak_rss.max(rss(pid));
                peak_fds = peak_fds.max(fds(pid));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (peak_rss, peak_fds)
        })
    };

    // Meanwhile a legitimate host and phone pair, retrying like a phone app.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let legit_started = Instant::now();
    let legit = loop {
        let attempt = spliced_with_source(&url, "abuse-legit", "10.250.0.1").await;
        match attempt {
            Ok(p) => break p,
            Err(e) => {
                assert!(
                    legit_started.elapsed() < Duration::from_secs(30),
                    "no legitimate pairing during the attack: {e}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    let legit_took = legit_started.elapsed();
    let mut legit_pair = legit.2;
    echo(&mut legit_pair, "legit", Duration::from_secs(5))
        .await
        .expect("the legitimate splice flows during the attack");

    let (flood_closed, flood_refused) = flood.await.unwrap();
    let mut slow_closed = Vec::new();
    for s in slow {
        if let Some(t) = s.await.unwrap() {
            slow_closed.push(t);
        }
    }
    let mut wedged = 0;
    for p in pushers {
        let (_, stopped) = p.await.unwrap();
        wedged += stopped as usize;
    }
    stop.store(true, Ordering::SeqCst);
    for s in silent {
        let _ = tokio::time::timeout(Duration::from_secs(10), s).await;
    }
    let (peak_rss, peak_fds) = sampler.await.unwrap();
    drop(phones);
    let attack = started.elapsed();

    // Documented bounds (docs/development.md, "Resource bounds").
    let rss_bound = base_rss
        + STALLED as u64 * SPLICE_OVERFLOW_DIRECTION_MAX as u64
        + PREAUTH_CELL_MAX as u64 * orca_relay::leg::preauth_io::PREAUTH_READ_BUDGET as u64
        + RSS_SLACK;
    let fd_bound = base_fds
        + SLOW_HEADERS as u64
        + PREAUTH_CELL_MAX as u64
        + FLOOD_CONCURRENCY as u64
        + 2 * 2
        + FD_SLACK;
    println!(
        "ws_abuse: {} s of attack; slow headers closed {}/{SLOW_HEADERS} after {:?}..{:?}; \
         silent legs admitted {} refused {} closed late {}; flood {BAD_FRAMES}: closed {flood_closed} refused {flood_refused}; \
         never-reading phones: {} MiB pushed, {wedged}/{STALLED} stopped by the cell; \
         rss {} -> peak {} KiB (bound {} KiB); fds {base_fds} -> peak {peak_fds} (bound {fd_bound}); legit pair in {} ms",
        attack.as_secs(),
        slow_closed.len(),
        slow_closed.iter().min(),
        slow_closed.iter().max(),
        admitted.load(Ordering::Relaxed),
        refused_over_limit.load(Ordering::Relaxed),
        late_close.load(Ordering::Relaxed),
        pushed.load(Ordering::Relaxed),
        base_rss / 1024,
        peak_rss / 1024,
        rss_bound / 1024,
        legit_took.as_millis()
    );
    assert_eq!(
        slow_closed.len(),
        SLOW_HEADERS,
        "every slow-header socket closed"
    );
    assert!(slow_closed.iter().all(|t| *t < Duration::from_secs(20)));
    assert_eq!(
        late_close.load(Ordering::Relaxed),
        0,
        "silent legs outlived the first-frame deadline"
    );
    assert!(
        refused_over_limit.load(Ordering::Relaxed) > 0,
        "over-limit sources refused"
    );
    assert_eq!(
        flood_closed + flood_refused,
        BAD_FRAMES as u64,
        "every bad first frame ended"
    );
    assert_eq!(
        wedged, STALLED,
        "never-reading phones' splices were stopped"
    );
    assert!(
        peak_rss <= rss_bound,
        "rss peak {peak_rss} over {rss_bound}"
    );
    assert!(peak_fds <= fd_bound, "fds peak {peak_fds} over {fd_bound}");
    // After the attack the fds return (legit control + 2 legs still open).
    wait_until(
        "fds back after the attack",
        Duration::from_secs(20),
        || async { fds(pid) <= base_fds + 8 },
    )
    .await;
    drop(legit_pair);
    node.terminate();
}

/// [`spliced`] with the phone and data legs claiming `xff` as their source.
async fn spliced_with_source(
    url: &str,
    user: &str,
    xff: &str,
) -> Result<(HostIdentity, testkit::HostControl, testkit::Pair), String> {
    let host = HostIdentity::generate(user);
    let token = host.token(SIGNING, url);
    let (cell, epoch) = testkit::assign(url, &token, &host.relay_host_id).await?;
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let mut control = testkit::connect_control(&cell, &host, &token, url, &hello)
        .await
        .map_err(|e| format!("control {e:?}"))?;
    let invite = control
        .create_invite("r1", "d1")
        .await
        .map_err(|e| format!("invite {e}"))?;
    let headers = vec![("x-forwarded-for", xff.to_string())];
    let pair =
        testkit::pair_phone(&cell, &mut control, &host.relay_host_id, &invite, &headers).await?;
    Ok((host, control, pair))
}
