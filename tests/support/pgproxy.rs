//! A loopback TCP proxy in front of the test Postgres with three modes, for fault tests:
//! `forward`, `cut` (close every proxied connection, refuse new ones: a crashed or unreachable
//! server) and `black_hole` (keep every socket open but move no bytes, accept new connections
//! and hold them: a partitioned network where no RST ever arrives). Leaving the black hole
//! delivers what was held, as TCP retransmission would.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const FORWARD: u8 = 0;
const CUT: u8 = 1;
const BLACK_HOLE: u8 = 2;

pub struct PgProxy {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::AbortHandle,
}

/// The test Postgres address the proxy forwards to.
pub const UPSTREAM: &str = "127.0.0.1:5432";

impl PgProxy {
    pub async fn start() -> PgProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(FORWARD));
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (m, cs) = (mode.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                if m.load(Ordering::SeqCst) == CUT {
                    drop(down);
                    continue;
                }
                let m = m.clone();
                let task = tokio::spawn(async move {
                    // Held in the black hole before even dialing upstream.
                    if !wait_forward(&m).await {
                        return;
                    }
                    let Ok(up) = TcpStream::connect(UPSTREAM).await else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::select! {
                        _ = pump(dr, uw, m.clone()) => {}
                        _ = pump(ur, dw, m.clone()) => {}
                    }
                });
                cs.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        PgProxy {
            addr,
            mode,
            conns,
            accept,
        }
    }

    /// `url` (a test Postgres URL on [`UPSTREAM`]) rewritten to go through the proxy.
    pub fn url(&self, url: &str) -> String {
        assert!(
            url.contains(UPSTREAM),
            "the test Postgres must be at {UPSTREAM}"
        );
        url.replacen(UPSTREAM, &self.addr.to_string(), 1)
    }

    /// Closes every proxied connection and refuses new ones.
    pub fn cut(&self) {
        self.mode.store(CUT, Ordering::SeqCst);
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    /// Keeps every socket open and moves no byte in either direction.
    pub fn black_hole(&self) {
        self.mode.store(BLACK_HOLE, Ordering::SeqCst);
    }

    /// Back to forwarding (held bytes flow again; after a cut, new connections are accepted).
    pub fn resume(&self) {
        self.mode.store(FORWARD, Ordering::SeqCst);
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

/// Waits while in the black hole; `false` once cut.
async fn wait_forward(m: &AtomicU8) -> bool {
    loop {
        match m.load(Ordering::SeqCst) {
            FORWARD => return true,
            CUT => return false,
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    m: Arc<AtomicU8>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !wait_forward(&m).await {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !wait_forward(&m).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
