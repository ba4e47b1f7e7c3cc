//! Bytes a client sends before the 101 (in the same write as its upgrade request): hyper has read
//! them already, and the leg socket takes them over when it unwraps hyper's upgraded IO into the
//! raw `TcpStream` (`leg::ws::LegIo`). They must reach the WebSocket codec and count against the
//! pre-auth budget exactly like bytes read later: a pipelined first frame is answered, a pipelined
//! framing violation is closed with its code, a pipelined oversized first frame is closed 1009.

mod support;
use support::raw_ws;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use raw_ws::upgrade_with;
use support::node::*;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A masked client frame (`first` = FIN/RSV/opcode byte).
fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
    raw_ws::frame(first, payload, Some([0x21, 0x43, 0x65, 0x87]))
}

/// Every message the relay sends until its close frame: (texts, close code), within `within`.
async fn until_close(s: TcpStream, within: Duration) -> (Vec<String>, Option<u16>) {
    let mut ws = WebSocketStream::from_raw_socket(s, Role::Client, None).await;
    let deadline = Instant::now() + within;
    let mut texts = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => texts.push(t.as_str().to_owned()),
            Ok(Some(Ok(Message::Close(f)))) => return (texts, f.map(|f| u16::from(f.code))),
            Ok(Some(Ok(_))) => {}
            _ => return (texts, None),
        }
    }
}

#[tokio::test]
async fn bytes_sent_before_the_101_reach_the_leg() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "early-bytes").await;
    let addr = s.running.addr;
    let phone_path = format!("/v1/connect/{}", host.id.relay_host_id);

    // A pipelined `relay-auth` is read as the phone's first frame and answered (an unknown
    // credential: relay-hello ok:false, then the close with the same code), not left to time out.
    let auth = br#"{"type":"relay-auth","v":1,"credential":"no-such-credential"}"#;
    let sock = upgrade_with(addr, &phone_path, "", &frame(0x81, auth)).await;
    let (texts, code) = until_close(sock, Duration::from_secs(5)).await;
    let hello: serde_json::Value = serde_json::from_str(texts.first().expect("relay-hello"))
        .unwrap_or_else(|e| panic!("{texts:?}: {e}"));
    assert_eq!(hello["type"], "relay-hello", "{hello}");
    assert_eq!(hello["ok"], false, "{hello}");
    let code = code.expect("close frame");
    assert_eq!(hello["code"], code, "{hello}");

    // Pipelined framing violations are closed with their code on every leg.
    let bearer = format!("Authorization: Bearer {}\r\n", host.token);
    let legs = [
        (phone_path.clone(), String::new()),
        ("/v1/host/data/conn-early".to_string(), String::new()),
        ("/v1/host/control".to_string(), bearer),
    ];
    for (path, extra) in &legs {
        for (name, bytes, want) in [
            ("RSV1 set", frame(0xc1, b"{}"), 1002u16),
            ("invalid UTF-8", frame(0x81, &[0x7b, 0xff, 0x7d]), 1007),
        ] {
            let sock = upgrade_with(addr, path, extra, &bytes).await;
            let (_, got) = until_close(sock, Duration::from_secs(5)).await;
            assert_eq!(got, Some(want), "{path}: {name}");
        }
    }

    // A pipelined first frame over the pre-auth budget (16 KiB of a declared 1 MiB message, all
    // before the 101) is closed 1009 at once.
    let mut big = vec![0x81u8, 0x80 | 127];
    big.extend_from_slice(&(1u64 << 20).to_be_bytes());
    big.extend_from_slice(&[0, 0, 0, 0]);
    big.extend_from_slice(&[b'a'; 16 * 1024]);
    let sock = upgrade_with(addr, &phone_path, "", &big).await;
    let (_, got) = until_close(sock, Duration::from_secs(5)).await;
    assert_eq!(got, Some(1009));
    s.running.shutdown().await;
}
