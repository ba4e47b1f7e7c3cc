//! Hostile WebSocket framing over raw TCP (issue 11): protocol violations on a first frame get a
//! close frame (1002, 1007 for invalid UTF-8) instead of a bare TCP drop; an invalid
//! `Sec-WebSocket-Key` is refused 400; an oversized unauthenticated first frame is closed 1009
//! after a few KiB, and 45 such sockets do not balloon the process.

mod support;
use support::raw_ws;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::node::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Upgrades `path` over raw TCP; returns the socket after the 101 (panics otherwise).
async fn upgrade(addr: SocketAddr, path: &str, extra: &str) -> TcpStream {
    raw_ws::upgrade_with(addr, path, extra, b"").await
}

/// One client frame: `first` byte (FIN/RSV/opcode), payload, masked or not.
fn frame(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    raw_ws::frame(first, payload, masked.then_some([0x12, 0x34, 0x56, 0x78]))
}

/// Reads server frames until a close frame: `Some(code)`, or `None` on a bare drop / timeout.
async fn close_code<R: tokio::io::AsyncRead + Unpin>(s: &mut R, within: Duration) -> Option<u16> {
    let deadline = Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // Parse whatever frames are complete.
        let mut i = 0;
        while buf.len() >= i + 2 {
            let op = buf[i] & 0x0f;
            let len7 = (buf[i + 1] & 0x7f) as usize;
            let (len, hdr) = match len7 {
                126 if buf.len() >= i + 4 => {
                    (u16::from_be_bytes([buf[i + 2], buf[i + 3]]) as usize, 4)
                }
                127 if buf.len() >= i + 10 => (
                    u64::from_be_bytes(buf[i + 2..i + 10].try_into().unwrap()) as usize,
                    10,
                ),
                126 | 127 => break,
                n => (n, 2),
            };
            if buf.len() < i + hdr + len {
                break;
            }
            if op == 0x8 {
                let p = &buf[i + hdr..i + hdr + len];
                return Some(if p.len() >= 2 {
                    u16::from_be_bytes([p[0], p[1]])
                } else {
                    1005
                });
            }
            i += hdr + len;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn framing_violations_on_a_first_frame_get_a_close_frame() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "hostile").await;
    let addr = s.running.addr;
    let auth = format!("Authorization: Bearer {}\r\n", host.token);
    let legs = [
        (
            format!("/v1/connect/{}", host.id.relay_host_id),
            String::new(),
        ),
        ("/v1/host/data/conn-1".to_string(), String::new()),
        ("/v1/host/control".to_string(), auth),
    ];
    let hello = br#"{"type":"relay-auth","v":1}"#;
    let cases: [(&str, Vec<u8>, u16); 6] = [
        ("unmasked client frame", frame(0x81, hello, false), 1002),
        (
            "invalid UTF-8 text",
            frame(0x81, &[0x7b, 0xff, 0xfe, 0x7d], true),
            1007,
        ),
        ("RSV1 set", frame(0xc1, hello, true), 1002),
        ("RSV3 set", frame(0x91, hello, true), 1002),
        ("reserved opcode 0x3", frame(0x83, hello, true), 1002),
        ("stray continuation", frame(0x80, hello, true), 1002),
    ];
    let mut failures = Vec::new();
    for (path, extra) in &legs {
        for (name, bytes, want) in &cases {
            let mut sock = upgrade(addr, path, extra).await;
            sock.write_all(bytes).await.unwrap();
            let got = close_code(&mut sock, Duration::from_secs(5)).await;
            if got != Some(*want) {
                failures.push(format!("{path}: {name} → {got:?}, want {want}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // An empty or malformed Sec-WebSocket-Key is refused 400, not upgraded.
    for key in ["", "abc", "dGhlIHNhbXBsZSBub25jZQ"] {
        let head = raw_upgrade_with_key(addr, &legs[0].0, key).await;
        assert!(head.starts_with("HTTP/1.1 400"), "key {key:?}: {head}");
    }
    s.running.shutdown().await;
}

async fn raw_upgrade_with_key(addr: SocketAddr, path: &str, key: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut got))
        .await
        .map(|r| r.unwrap_or(0))
        .unwrap_or(0);
    String::from_utf8_lossy(&got[..n]).into_owned()
}

/// 45 unauthenticated phone and data sockets (distinct sources behind a trusted proxy, up to the
/// cell's pre-auth limit) each start an 8 MiB first frame and keep sending: each is closed 1009
/// after the pre-auth budget and the resident set stays far below 45 × 8 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_first_frames_are_closed_early_and_memory_stays_flat() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &["--trusted-proxy-hops", "1"]).await;
    let host = Host::assigned(&s, "hostile-mem").await;
    let addr = s.running.addr;
    let before = rss_kib();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..45 {
        let path = if i % 2 == 0 {
            format!("/v1/connect/{}", host.id.relay_host_id)
        } else {
            format!("/v1/host/data/conn-{i}")
        };
        let xff = format!("X-Forwarded-For: 10.9.{}.{}\r\n", i / 200, i % 200 + 1);
        tasks.push(tokio::spawn(async move {
            let mut sock = upgrade(addr, &path, &xff).await;
            let total = 8 * 1024 * 1024 - 16;
            // Header declaring the whole (allowed) 8 MiB message, then payload in 64 KiB chunks
            // while the server lets us.
            let mut hdr = vec![0x81u8, 0x80 | 127];
            hdr.extend_from_slice(&(total as u64).to_be_bytes());
            hdr.extend_from_slice(&[1, 2, 3, 4]);
            // The header and the first 16 KiB in one write: over the pre-auth budget at once.
            hdr.extend_from_slice(&[b'a' ^ 1; 16 * 1024]);
            sock.write_all(&hdr).await.unwrap();
            let (mut rd, mut wr) = sock.into_split();
            let writer = tokio::spawn(async move {
                let chunk = vec![b'a' ^ 1; 64 * 1024];
                let mut sent = 16 * 1024;
                while sent < total {
                    match tokio::time::timeout(Duration::from_secs(3), wr.write_all(&chunk)).await {
                        Ok(Ok(())) => sent += chunk.len(),
                        _ => break,
                    }
                }
                sent
            });
            let t0 = Instant::now();
            let code = close_code(&mut rd, Duration::from_secs(10)).await;
            let took = t0.elapsed();
            writer.abort();
            (code, took)
        }));
    }
    let mut peak = before;
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
        peak = peak.max(rss_kib());
    }
    let after = rss_kib();
    let slowest = results.iter().map(|r| r.1).max().unwrap();
    eprintln!(
        "45 oversized first frames: RSS before {before} KiB, peak {peak} KiB, after {after} KiB; \
         slowest 1009 after {slowest:?}; all done in {:?}",
        started.elapsed()
    );
    let codes: Vec<_> = results.iter().map(|r| r.0).collect();
    assert!(codes.iter().all(|c| *c == Some(1009)), "closes: {codes:?}");
    assert!(
        peak.saturating_sub(before) < 64 * 1024,
        "RSS grew {} KiB (before {before}, peak {peak})",
        peak - before
    );
    s.running.shutdown().await;
}
