//! Built-in TLS through the real binary, with a CA generated at test time (issue 13):
//! a host and a phone pair and splice over `wss://`; a wrong SNI and a plain-HTTP request get a
//! clean refusal (an alert / a `400`, connection closed, no hang, nothing at error level, a
//! counter); replacing the certificate files switches the served certificate without closing
//! live splices; a bad replacement is refused and logged while the old pair keeps serving; and
//! start-up refuses a certificate that does not cover the public URL or a key that does not match.

mod support;

use std::time::{Duration, Instant};

use orca_relay::cell::testkit::{self, Pair};
use orca_relay::store::testing::temp_dir;
use support::tls::{first_der, served_cert, splice_works, write_pair, Relay, TestCa};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SIGNING: &str = "tls-test-signing-key-tls-test-signing-key-01";
const SELF_HOSTED: &str = "tls-self-hosted-key-tls-self-hosted-key-01";
const ADMIN: &str = "tls-admin-token-tls-admin-token-tls-admin-01";
const CLUSTER: &str = "tls-cluster-key-tls-cluster-key-tls-cluster-1";
const NAMES: &[&str] = &["localhost", "127.0.0.1"];

fn envs(cert: &std::path::Path, key: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("ORCA_RELAY_LISTEN", "127.0.0.1:0".into()),
        ("ORCA_RELAY_TLS_CERT", cert.display().to_string()),
        ("ORCA_RELAY_TLS_KEY", key.display().to_string()),
        ("ORCA_RELAY_TLS_RELOAD_INTERVAL_MS", "200".into()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING.into()),
        ("ORCA_RELAY_SELF_HOSTED_KEY", SELF_HOSTED.into()),
        ("ORCA_RELAY_ADMIN_TOKEN", ADMIN.into()),
        ("ORCA_RELAY_CLUSTER_KEY", CLUSTER.into()),
    ]
}

/// A host with a control socket and one paired phone, all over TLS.
async fn paired(public: &str) -> (testkit::HostControl, Pair) {
    let (cell_url, control, pair) = support::tls::paired(public, SIGNING, "tls-user").await;
    assert_eq!(
        cell_url, public,
        "with TLS on the cell URL defaults to https"
    );
    (control, pair)
}

async fn metric(relay: &Relay, series: &str) -> f64 {
    let text = testkit::http_client()
        .get(format!("https://{}/metrics", relay.addr))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn wait_served(addr: &str, ca: &str, want: &rustls::pki_types::CertificateDer<'_>) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(c) = served_cert(addr, "localhost", support::tls::client_config(ca)).await {
            if &c == want {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn wss_pair_splice_and_clean_refusals() {
    let dir = temp_dir("orca-relay-tls");
    let ca = TestCa::new("orca tls test ca");
    let (cert, key) = ca.issue(NAMES);
    let (cp, kp) = write_pair(&dir, &cert, &key);
    let mport = support::tls::common::ports::free_port();
    let mut env = envs(&cp, &kp);
    env.push(("ORCA_RELAY_METRICS_LISTEN", format!("127.0.0.1:{mport}")));
    env.push(("ORCA_RELAY_METRICS_TLS", "1".into()));
    let relay = Relay::spawn(&dir, &env);
    let public = format!("https://{}", relay.addr);
    testkit::trust_extra_ca(ca.pem.as_bytes());

    // The separate metrics listener serves TLS too when asked.
    let m = testkit::http_client()
        .get(format!("https://127.0.0.1:{mport}/metrics"))
        .send()
        .await
        .expect("metrics over https");
    assert_eq!(m.status(), 200);

    let health: serde_json::Value = testkit::http_client()
        .get(format!("{public}/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["ok"], true);

    let (_control, mut pair) = paired(&public).await;
    splice_works(&mut pair, "first").await;

    // Wrong SNI: a TLS alert, promptly.
    let started = Instant::now();
    let wrong = served_cert(
        &relay.addr,
        "wrong.example",
        support::tls::client_config(&ca.pem),
    )
    .await;
    let err = wrong.expect_err("a name the certificate does not cover is refused");
    assert!(err.contains("AccessDenied"), "a TLS alert: {err}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Plain HTTP to the TLS port: a 400 naming https, then the connection closes.
    let mut tcp = tokio::net::TcpStream::connect(&relay.addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer))
        .await
        .expect("closed, no hang")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("https://"), "{answer}");

    // A TCP connection that sends nothing is not the accept loop's problem: others still work.
    let _idle = tokio::net::TcpStream::connect(&relay.addr).await.unwrap();
    splice_works(&mut pair, "after-refusals").await;

    assert!(
        metric(
            &relay,
            "orca_relay_tls_handshake_failures_total{reason=\"plain_http\"}"
        )
        .await
            >= 1.0
    );
    assert!(
        metric(
            &relay,
            "orca_relay_tls_handshake_failures_total{reason=\"unknown_name\"}"
        )
        .await
            >= 1.0
    );
    let lines = relay.lines();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(" ERROR ") || l.contains("[ERROR")),
        "refusals are not errors: {lines:?}"
    );
    assert_eq!(relay.terminate(), 0);
}

#[tokio::test]
async fn cert_files_reload_without_closing_splices() {
    let dir = temp_dir("orca-relay-tls-reload");
    let ca = TestCa::new("orca tls reload ca");
    let (cert_a, key_a) = ca.issue(NAMES);
    let (cp, kp) = write_pair(&dir, &cert_a, &key_a);
    let relay = Relay::spawn(&dir, &envs(&cp, &kp));
    let public = format!("https://{}", relay.addr);
    testkit::trust_extra_ca(ca.pem.as_bytes());
    assert!(wait_served(&relay.addr, &ca.pem, &first_der(&cert_a)).await);

    let (_control, mut pair) = paired(&public).await;
    splice_works(&mut pair, "a").await;

    // A new pair: new handshakes get it, the live splice is untouched.
    let (cert_b, key_b) = ca.issue(NAMES);
    write_pair(&dir, &cert_b, &key_b);
    assert!(
        wait_served(&relay.addr, &ca.pem, &first_der(&cert_b)).await,
        "the replaced certificate is served: {:?}",
        relay.lines()
    );
    assert!(relay.wait_log("tls certificate reloaded", Duration::from_secs(5)));
    splice_works(&mut pair, "after-swap").await;
    let (_control2, mut pair2) = paired(&public).await;
    splice_works(&mut pair2, "new-conn").await;

    // A bad replacement: a certificate with someone else's key. Refused, logged, B keeps serving.
    let (cert_c, _) = ca.issue(NAMES);
    let before = relay.count("tls reload refused");
    write_pair(&dir, &cert_c, &key_b);
    assert!(
        relay.wait_more("tls reload refused", before, Duration::from_secs(10)),
        "the refusal is logged: {:?}",
        relay.lines()
    );
    let refusal = relay
        .lines()
        .into_iter()
        .rfind(|l| l.contains("tls reload refused"))
        .unwrap();
    assert!(
        refusal.contains("ORCA_RELAY_TLS_KEY does not match"),
        "{refusal}"
    );
    assert!(!refusal.contains("PRIVATE KEY"), "no key material in logs");
    let served = served_cert(
        &relay.addr,
        "localhost",
        support::tls::client_config(&ca.pem),
    )
    .await
    .unwrap();
    assert_eq!(served, first_der(&cert_b), "the old pair keeps serving");
    // A certificate that no longer covers the public host is refused too.
    let (cert_d, key_d) = ca.issue(&["elsewhere.example"]);
    write_pair(&dir, &cert_d, &key_d);
    assert!(relay.wait_log(
        "ORCA_RELAY_TLS_CERT does not cover",
        Duration::from_secs(10)
    ));
    let served = served_cert(
        &relay.addr,
        "localhost",
        support::tls::client_config(&ca.pem),
    )
    .await
    .unwrap();
    assert_eq!(served, first_der(&cert_b));

    // SIGHUP re-reads at once; a good pair again.
    let (cert_e, key_e) = ca.issue(NAMES);
    write_pair(&dir, &cert_e, &key_e);
    relay.signal(libc::SIGHUP);
    assert!(wait_served(&relay.addr, &ca.pem, &first_der(&cert_e)).await);
    splice_works(&mut pair, "end").await;
    splice_works(&mut pair2, "end").await;
    assert_eq!(relay.terminate(), 0);
}

#[test]
fn start_up_refuses_bad_tls_settings() {
    let dir = temp_dir("orca-relay-tls-config");
    let ca = TestCa::new("orca tls config ca");
    let (cert, key) = ca.issue(&["relay.example"]);
    let (cp, kp) = write_pair(&dir, &cert, &key);
    let base = |cert: String, key: String| {
        vec![
            ("ORCA_RELAY_TLS_CERT", cert),
            ("ORCA_RELAY_TLS_KEY", key),
            (
                "ORCA_RELAY_DATA_DIR",
                dir.join("data").display().to_string(),
            ),
        ]
    };
    let c = cp.display().to_string();
    let k = kp.display().to_string();

    // The default public URL (https://127.0.0.1:<port>) is not covered by relay.example.
    let (code, err) = support::tls::refused_start(&dir, &base(c.clone(), k.clone()));
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        "ORCA_RELAY_TLS_CERT does not cover the host of ORCA_RELAY_PUBLIC_URL (127.0.0.1)"
    );
    // Covered once the public URL names the certificate's host.
    let mut ok = base(c.clone(), k.clone());
    ok.push(("ORCA_RELAY_PUBLIC_URL", "https://relay.example".into()));
    let mut e = ok.clone();
    e.push(("ORCA_RELAY_CELL_URL", "https://cell.other.example".into()));
    let (code, err) = support::tls::refused_start(&dir, &e);
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        "ORCA_RELAY_TLS_CERT does not cover the host of ORCA_RELAY_CELL_URL (cell.other.example)"
    );
    // Unreadable key.
    let mut e = base(c.clone(), dir.join("missing.pem").display().to_string());
    e.push(("ORCA_RELAY_PUBLIC_URL", "https://relay.example".into()));
    let (code, err) = support::tls::refused_start(&dir, &e);
    assert_eq!(code, 2);
    assert!(
        err.trim().starts_with("ORCA_RELAY_TLS_KEY: cannot read "),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1);
    // A key of another certificate.
    let (_, other_key) = ca.issue(&["relay.example"]);
    let other = dir.join("other-key.pem");
    std::fs::write(&other, other_key).unwrap();
    let mut e = base(c.clone(), other.display().to_string());
    e.push(("ORCA_RELAY_PUBLIC_URL", "https://relay.example".into()));
    let (code, err) = support::tls::refused_start(&dir, &e);
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        "ORCA_RELAY_TLS_KEY does not match ORCA_RELAY_TLS_CERT"
    );
    // Not PEM at all.
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let mut e = base(junk.display().to_string(), k.clone());
    e.push(("ORCA_RELAY_PUBLIC_URL", "https://relay.example".into()));
    let (code, err) = support::tls::refused_start(&dir, &e);
    assert_eq!(code, 2);
    assert_eq!(err.trim(), "ORCA_RELAY_TLS_CERT holds no PEM certificate");
    // Both or neither.
    let (code, err) = support::tls::refused_start(&dir, &[("ORCA_RELAY_TLS_CERT", c.clone())]);
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        "ORCA_RELAY_TLS_KEY is required with ORCA_RELAY_TLS_CERT"
    );
    let (code, err) = support::tls::refused_start(&dir, &[("ORCA_RELAY_TLS_KEY", k.clone())]);
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        "ORCA_RELAY_TLS_CERT is required with ORCA_RELAY_TLS_KEY"
    );
    // Manual and ACME at once.
    let mut e = ok.clone();
    e.push(("ORCA_RELAY_TLS_ACME_DOMAINS", "relay.example".into()));
    let (code, err) = support::tls::refused_start(&dir, &e);
    assert_eq!(code, 2);
    assert!(err.contains("mutually exclusive"), "{err}");
}

/// The separate metrics listener bounds its connections and the time a client may take to send
/// its request headers, counting each refusal: over the bound a new connection is closed at
/// once; a connection that sends nothing, or half a request, is closed after the header-read
/// timeout.
#[tokio::test]
async fn metrics_listener_bounds_connections_and_header_reads() {
    use orca_relay::contract::limits::{HEADER_READ_TIMEOUT_S, METRICS_CONNECTIONS_MAX};
    let dir = temp_dir("orca-relay-tls-metrics");
    let ca = TestCa::new("orca tls metrics ca");
    let (cert, key) = ca.issue(NAMES);
    let (cp, kp) = write_pair(&dir, &cert, &key);
    let mport = support::tls::common::ports::free_port();
    let maddr = format!("127.0.0.1:{mport}");
    let mut env = envs(&cp, &kp);
    env.push(("ORCA_RELAY_METRICS_LISTEN", maddr.clone()));
    let _relay = Relay::spawn(&dir, &env);

    // Fill the bound: silent connections, and one that sends half a request.
    let started = Instant::now();
    let mut held = Vec::new();
    for i in 0..METRICS_CONNECTIONS_MAX {
        let mut s = tokio::net::TcpStream::connect(&maddr).await.unwrap();
        if i == 0 {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
        }
        held.push(s);
    }
    // One more: accepted after all of them, closed at once.
    let mut extra = tokio::net::TcpStream::connect(&maddr).await.unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), extra.read_to_end(&mut buf))
        .await
        .expect("a connection over the bound is closed at once")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");

    // The held ones are closed by the header-read timeout, not kept forever.
    let limit = Duration::from_secs(HEADER_READ_TIMEOUT_S + 10);
    for s in held.iter_mut() {
        let mut buf = Vec::new();
        tokio::time::timeout(limit, s.read_to_end(&mut buf))
            .await
            .expect("closed by the header-read timeout")
            .ok();
    }
    assert!(started.elapsed() >= Duration::from_secs(HEADER_READ_TIMEOUT_S - 1));

    // Both limits are counted.
    let text = testkit::http_client()
        .get(format!("http://{maddr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        value("orca_relay_metrics_listener_refused_total{reason=\"connections\"}") >= 1.0,
        "{text}"
    );
    assert!(
        value("orca_relay_metrics_listener_refused_total{reason=\"header_timeout\"}")
            >= METRICS_CONNECTIONS_MAX as f64,
        "{text}"
    );
}
