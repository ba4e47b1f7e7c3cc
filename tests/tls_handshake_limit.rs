//! The TLS accept limiter on a real TLS listener: with every handshake slot held by a stalled
//! client, a storm of further handshakes waits (holding no TLS state) and is then closed and
//! counted `busy`; a connection waiting when a slot frees completes; the process's open files come
//! back down; nothing hangs.

mod support;

use std::sync::Arc;
use std::time::Duration;

use orca_relay::tls::server::{failures_counter, load_pair, Resolver, Tls};
use rustls::pki_types::ServerName;
use support::common::wait::eventually;
use support::tls::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: usize = 2;
const WAIT: Duration = Duration::from_millis(1500);
const STORM: usize = 200;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A client that sends its ClientHello and then never answers: the server's handshake stays in
/// flight (holding a slot) until this socket closes.
async fn stalled(addr: &str, cfg: &Arc<rustls::ClientConfig>) -> TcpStream {
    let mut conn =
        rustls::ClientConnection::new(cfg.clone(), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&hello).await.unwrap();
    tcp
}

/// A full handshake; `Ok` once the server's Finished was read and a byte echoed.
async fn handshake(addr: &str, cfg: &Arc<rustls::ClientConfig>) -> Result<(), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(cfg.clone());
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(b"x").await.map_err(|e| e.to_string())?;
    let mut b = [0u8; 1];
    tls.read_exact(&mut b).await.map_err(|e| e.to_string())?;
    Ok(())
}

fn busy(c: &prometheus::IntCounterVec) -> u64 {
    c.with_label_values(&["busy"]).get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_storm_waits_bounded_then_is_refused_and_counted() {
    let ca = TestCa::new("handshake limit ca");
    let (cert, key) = ca.issue(&["localhost"]);
    let resolver = Arc::new(Resolver::default());
    resolver.set(load_pair(cert.as_bytes(), key.as_bytes()).unwrap());
    let registry = prometheus::Registry::new();
    let failures = failures_counter(&registry);
    let tls = Arc::new(
        Tls::new(resolver, false, failures.clone())
            .unwrap()
            .with_handshake_limit(LIMIT, WAIT),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tls.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let tls = server.clone();
            tokio::spawn(async move {
                if let Some(mut s) = tls.accept(tcp).await {
                    let mut b = [0u8; 1];
                    if s.read_exact(&mut b).await.is_ok() {
                        let _ = s.write_all(&b).await;
                    }
                }
            });
        }
    });
    let cfg = support::tls::client_config(&ca.pem);
    handshake(&addr, &cfg)
        .await
        .expect("a handshake with free slots");
    let baseline = open_fds();

    // Every slot held by a stalled client.
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        held.push(stalled(&addr, &cfg).await);
    }
    assert!(
        eventually(Duration::from_secs(10), || tls.handshakes_in_flight()
            == LIMIT)
        .await,
        "the stalled clients hold every slot"
    );

    // The storm: every one waits, never gets a slot, and is closed by the server (EOF or reset).
    let storm: Vec<_> = (0..STORM)
        .map(|_| {
            let (addr, cfg) = (addr.clone(), cfg.clone());
            tokio::spawn(async move {
                let mut tcp = stalled(&addr, &cfg).await;
                let mut buf = [0u8; 4096];
                let read = tcp.read(&mut buf);
                tokio::time::timeout(Duration::from_secs(20), read).await
            })
        })
        .collect();
    for t in storm {
        match t.await.unwrap() {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(n)) => panic!("a refused connection got {n} bytes of handshake"),
            Err(_) => panic!("a connection past the limit hung"),
        }
    }
    assert_eq!(busy(&failures), STORM as u64, "each refusal counted once");
    assert_eq!(tls.handshakes_in_flight(), LIMIT, "the limit held");
    assert!(
        eventually(Duration::from_secs(10), || open_fds()
            <= baseline + LIMIT + 4)
        .await,
        "the refused sockets are closed: {} open, {baseline} before",
        open_fds()
    );

    // A handshake waiting when a slot frees gets it.
    let waiting = {
        let (addr, cfg) = (addr.clone(), cfg.clone());
        tokio::spawn(async move { handshake(&addr, &cfg).await })
    };
    drop(held.pop());
    tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("no hang")
        .unwrap()
        .expect("the waiting handshake completes once a slot frees");
    drop(held);
    assert!(
        eventually(Duration::from_secs(10), || tls.handshakes_in_flight() == 0).await,
        "slots come back when the stalled clients leave"
    );
    handshake(&addr, &cfg).await.expect("served again");
    assert_eq!(busy(&failures), STORM as u64);
    assert!(failures.with_label_values(&["eof"]).get() >= LIMIT as u64);
}
