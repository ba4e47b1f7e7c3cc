//! Shared set-up of the cell integration tests: an in-process `orca-relay serve` (role `all` unless
//! told otherwise) on an ephemeral port, over SQLite and, when `ORCA_RELAY_TEST_POSTGRES_URL` is
//! set, Postgres; plus host/phone helpers from `orca_relay::cell::testkit`.
#![allow(dead_code)]

#[path = "../common/mod.rs"]
pub mod common;

use std::time::Duration;

use orca_relay::cell::testkit::{self, Hello, HostControl, HostIdentity};
use orca_relay::server::Running;
use orca_relay::store::testing::{backends, temp_dir, TestDb};

#[allow(unused_imports)]
pub use common::time::{real_deadline, real_eventually, ManualTime};
#[allow(unused_imports)]
pub use common::wait::{eventually, eventually_async, wait_until};

pub const SIGNING: &str = "0123456789abcdef0123456789abcdef";
pub const SELF_HOSTED: &str = "self-hosted-key-self-hosted-key-0001";
pub const ADMIN: &str = "admin-token-admin-token-admin-token-0001";
pub const CLUSTER: &str = "cluster-key-cluster-key-cluster-key-0001";

pub struct Server {
    pub running: Running,
    pub url: String,
    pub public_url: String,
    pub cell_url: String,
}

/// Starts a server on `db` (a `TestDb` URL) with extra flags.
pub async fn start_on(db_url: &str, extra: &[&str]) -> Server {
    let dir = temp_dir("orca-relay-cell");
    let data = dir.display().to_string();
    let mut args = vec![
        "orca-relay",
        "--listen",
        "127.0.0.1:0",
        "--role",
        "all",
        "--data-dir",
        &data,
        "--database-url",
        db_url,
        "--assignment-signing-key",
        SIGNING,
        "--self-hosted-key",
        SELF_HOSTED,
        "--admin-token",
        ADMIN,
        "--cluster-key",
        CLUSTER,
    ];
    args.extend_from_slice(extra);
    let running = common::serve::start(&args).await;
    Server {
        url: format!("http://{}", running.addr),
        public_url: running.ctx.config.public_url.clone(),
        cell_url: running.ctx.config.cell_url.clone(),
        running,
    }
}

impl Server {
    /// `f` of the cell's session for `key`, if it has one (the test's view of server state for
    /// "wait until the cell saw it" conditions).
    pub fn session<T>(
        &self,
        key: &orca_relay::store::assignments::HostKey,
        f: impl FnOnce(&orca_relay::cell::session::Inner) -> T,
    ) -> Option<T> {
        let cell = self.running.cell.as_ref().expect("cell role");
        let session = cell.registry().get(key)?;
        let st = session.lock();
        Some(f(&st))
    }

    /// The state of the cell's session for `key`, if it has one.
    pub fn session_state(
        &self,
        key: &orca_relay::store::assignments::HostKey,
    ) -> Option<orca_relay::cell::session::State> {
        self.session(key, |st| st.state)
    }
}

/// Every backend to run a behaviour test on.
pub async fn dbs() -> Vec<TestDb> {
    backends().await
}

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

pub const SEC: Duration = Duration::from_secs(1);

/// Moves tokio's clock forward by `d` at once; with the test clock (`clock::now_ms` follows tokio
/// time in this crate's tests) the in-process server's rules see `d` pass too, and its timers due
/// in between fire. Real time then runs on from the new instant.
pub async fn jump(d: Duration) {
    const _: () = assert!(orca_relay::clock::TEST_CLOCK, "tests run on the test clock");
    tokio::time::pause();
    tokio::time::advance(d).await;
    tokio::time::resume();
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
