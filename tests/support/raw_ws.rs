//! WebSocket by hand over raw TCP, for the framing tests: an upgrade request written byte for byte
//! (optionally with bytes pipelined behind it in the same write) and client frames built from their
//! first byte, masked or not, so a test can send what no well-behaved client library would.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// RFC 6455's sample `Sec-WebSocket-Key`.
pub const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// Upgrades `path` with `extra` header lines and `early` bytes in the same write; returns the
/// socket right after the `101` head (panics on any other answer or a close mid-handshake).
pub async fn upgrade_with(addr: SocketAddr, path: &str, extra: &str, early: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n{extra}\r\n"
    )
    .into_bytes();
    req.extend_from_slice(early);
    s.write_all(&req).await.unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .expect("answer")
            .unwrap();
        assert_eq!(
            n,
            1,
            "closed during the handshake: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.push(b[0]);
    }
    let head = String::from_utf8_lossy(&got);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

/// One client frame: `first` byte (FIN/RSV/opcode), the length, then `payload` masked with `mask`
/// (a client must mask; `None` sends it bare).
pub fn frame(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = vec![first];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n < 65536 => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
    out
}
