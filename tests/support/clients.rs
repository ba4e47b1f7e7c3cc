//! Host and phone helpers over the crate's `orca_relay::cell::testkit` (the one host/phone
//! implementation): a [`Host`] assigned by a [`super::node`] server and its control socket, a
//! control-socket [`barrier`], and a raw upgrade request for refusal tests.

use std::time::Duration;

use orca_relay::cell::testkit::{self, Hello, HostControl, HostIdentity};

use super::common::time::real_deadline;
use super::node::{Server, SEC, SIGNING};

/// A host that has a token, an assignment and (after `connect`) a control socket.
pub struct Host {
    pub id: HostIdentity,
    pub token: String,
    pub epoch: i64,
}

impl Host {
    pub async fn assigned(s: &Server, user: &str) -> Host {
        let id = HostIdentity::generate(user);
        let token = id.token(SIGNING, &s.public_url);
        let (cell_url, epoch) = testkit::assign(&s.url, &token, &id.relay_host_id)
            .await
            .expect("assign");
        assert_eq!(cell_url, s.cell_url);
        assert!(epoch >= 1);
        Host { id, token, epoch }
    }

    /// The key the cell files this host's session under.
    pub fn key(&self) -> orca_relay::store::assignments::HostKey {
        orca_relay::store::assignments::HostKey {
            user_id: self.id.user_id.clone(),
            relay_host_id: self.id.relay_host_id.clone(),
        }
    }

    pub fn hello(&self) -> Hello {
        Hello {
            epoch: self.epoch,
            ..Hello::default()
        }
    }

    pub async fn connect(&self, s: &Server) -> HostControl {
        self.connect_with(s, &self.hello())
            .await
            .expect("control handshake")
    }

    pub async fn connect_with(
        &self,
        s: &Server,
        hello: &Hello,
    ) -> Result<HostControl, (u16, String)> {
        testkit::connect_control(&s.cell_url, &self.id, &self.token, &s.public_url, hello).await
    }
}

/// A raw HTTP/1.1 upgrade request: returns the status line and headers of the answer.
pub async fn raw_upgrade(addr: std::net::SocketAddr, path: &str, extra_headers: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra_headers}\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                got.extend_from_slice(&buf[..n]);
                if got.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// A sync point on a control socket: sends a frame of an unknown type and waits for its
/// `unknown_control_message` error. The cell reads a control socket in order and handles `pong`
/// and `auth-refresh` before it reads the next frame, so when this returns every frame sent
/// before it has taken effect. Pings met on the way are skipped, not answered.
pub async fn barrier(c: &mut HostControl) {
    c.send(serde_json::json!({"type":"test-barrier"})).await;
    loop {
        let v = real_deadline(
            SEC * 20,
            "barrier reply",
            testkit::recv_json(&mut c.ws, Duration::from_secs(3_600)),
        )
        .await
        .expect("control open");
        if v["type"] == "ping" {
            continue;
        }
        assert_eq!(
            v,
            serde_json::json!({"type":"control-error","code":"unknown_control_message"})
        );
        return;
    }
}
