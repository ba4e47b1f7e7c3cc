//! ACME against a real RFC 8555 server on loopback (Debian's `pebble`, issue 13): the first start
//! obtains a certificate over TLS-ALPN-01 answered by the relay's own listener, a restart serves
//! the cached certificate without a new order, and a forced renewal (SIGHUP) swaps the served
//! certificate while a live splice keeps flowing.
//!
//! Skips with a note when `pebble` is not installed, unless `CI=true` (then it fails).

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use orca_relay::cell::testkit::{self, Pair};
use orca_relay::store::testing::temp_dir;
use support::tls::{served_cert, splice_works, Relay, TestCa};

const SIGNING: &str = "tls-acme-signing-key-tls-acme-signing-key-01";
const SELF_HOSTED: &str = "tls-acme-self-hosted-key-tls-acme-self-hosted";
const ADMIN: &str = "tls-acme-admin-token-tls-acme-admin-token-01";
const CLUSTER: &str = "tls-acme-cluster-key-tls-acme-cluster-key-01";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn pebble_installed() -> bool {
    Command::new("pebble")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

struct Pebble(Child);

impl Drop for Pebble {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts pebble with its HTTPS listener certified by `ca`, validating TLS-ALPN-01 on `tls_port`.
fn start_pebble(dir: &std::path::Path, ca: &TestCa, tls_port: u16) -> (Pebble, u16, u16) {
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    std::fs::write(dir.join("pebble-cert.pem"), cert).unwrap();
    std::fs::write(dir.join("pebble-key.pem"), key).unwrap();
    let (api, mgmt) = (free_port(), free_port());
    let config = serde_json::json!({"pebble": {
        "listenAddress": format!("127.0.0.1:{api}"),
        "managementListenAddress": format!("127.0.0.1:{mgmt}"),
        "certificate": dir.join("pebble-cert.pem"),
        "privateKey": dir.join("pebble-key.pem"),
        "httpPort": free_port(),
        "tlsPort": tls_port,
        "ocspResponderURL": "",
        "externalAccountBindingRequired": false,
    }});
    let path = dir.join("pebble-config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let mut child = Command::new("pebble")
        .arg("-config")
        .arg(&path)
        .env("PEBBLE_VA_NOSLEEP", "1")
        .env("PEBBLE_WFE_NONCEREJECT", "0")
        .env("PEBBLE_AUTHZREUSE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pebble");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if std::env::var("TLS_TEST_VERBOSE").is_ok() {
                eprintln!("pebble: {line}");
            }
            if line.contains("ACME directory available") {
                let _ = tx.send(());
            }
        }
    });
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if std::env::var("TLS_TEST_VERBOSE").is_ok() {
                eprintln!("pebble: {line}");
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("pebble did not start");
    (Pebble(child), api, mgmt)
}

async fn pair(public: &str) -> (testkit::HostControl, Pair) {
    let (_, control, p) = support::tls::paired(public, SIGNING, "acme-user").await;
    (control, p)
}

/// A cell without a certificate heartbeats not ready: hosts are placed on it only once a
/// heartbeat after the certificate arrived says ready (`/ready` 200 first).
async fn wait_placeable(public: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let host = testkit::HostIdentity::generate("acme-probe");
        let token = host.token(SIGNING, public);
        match testkit::assign(public, &token, &host.relay_host_id).await {
            Ok(_) => return,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not placeable yet: {e:?}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("the cell never became placeable: {e:?}"),
        }
    }
}

fn count(relay: &Relay, needle: &str) -> usize {
    relay.lines().iter().filter(|l| l.contains(needle)).count()
}

#[tokio::test]
async fn acme_obtains_caches_and_renews_against_pebble() {
    if !pebble_installed() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "pebble is required under CI=true (.ci/run installs it)"
        );
        eprintln!("note: pebble not installed (apt-get install pebble); skipping the ACME test");
        return;
    }
    let dir = temp_dir("orca-relay-acme");
    let ca = TestCa::new("orca acme test ca");
    let ca_path = ca.write(&dir);
    testkit::trust_extra_ca(ca.pem.as_bytes());
    let port = free_port();
    let (_pebble, api, mgmt) = start_pebble(&dir, &ca, port);
    let envs = vec![
        ("ORCA_RELAY_LISTEN", format!("127.0.0.1:{port}")),
        (
            "ORCA_RELAY_DATA_DIR",
            dir.join("data").display().to_string(),
        ),
        ("ORCA_RELAY_TLS_ACME_DOMAINS", "localhost".to_string()),
        ("ORCA_RELAY_TLS_ACME_EMAIL", "ops@example.org".to_string()),
        (
            "ORCA_RELAY_TLS_ACME_DIRECTORY",
            format!("https://127.0.0.1:{api}/dir"),
        ),
        ("ORCA_RELAY_TLS_EXTRA_CA", ca_path.display().to_string()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING.into()),
        ("ORCA_RELAY_SELF_HOSTED_KEY", SELF_HOSTED.into()),
        ("ORCA_RELAY_ADMIN_TOKEN", ADMIN.into()),
        ("ORCA_RELAY_CLUSTER_KEY", CLUSTER.into()),
    ];
    let relay = Relay::spawn(&dir, &envs);
    let public = format!("https://localhost:{port}");
    assert!(
        relay.wait_log("ACME certificate obtained", Duration::from_secs(90)),
        "first start obtains a certificate: {:?}",
        relay.lines()
    );
    // Pebble's issuing root (fresh per pebble run), from its management interface.
    let root = testkit::http_client()
        .get(format!("https://127.0.0.1:{mgmt}/roots/0"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    testkit::trust_extra_ca(root.as_bytes());
    let addr = format!("127.0.0.1:{port}");
    let first = served_cert(&addr, "localhost", support::tls::client_config(&root))
        .await
        .expect("the ACME certificate verifies against pebble's root");
    wait_placeable(&public).await;
    let (_c, mut p) = pair(&public).await;
    splice_works(&mut p, "first").await;
    drop(p);
    assert_eq!(relay.terminate(), 0);
    let cache: Vec<String> = std::fs::read_dir(dir.join("data/acme"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        cache.iter().any(|n| n.starts_with("account-")),
        "the account is cached: {cache:?}"
    );
    // Certificate and key in one file, written whole: never a certificate beside another key.
    let certs: Vec<&String> = cache.iter().filter(|n| n.starts_with("cert-")).collect();
    assert_eq!(certs.len(), 1, "one combined certificate file: {cache:?}");
    let both = std::fs::read_to_string(dir.join("data/acme").join(certs[0])).unwrap();
    assert!(both.contains("BEGIN CERTIFICATE") && both.contains("PRIVATE KEY"));

    // A restart serves the cached certificate and orders nothing.
    let relay = Relay::spawn(&dir, &envs);
    assert!(relay.wait_log(
        "serving the cached ACME certificate",
        Duration::from_secs(10)
    ));
    let again = served_cert(&addr, "localhost", support::tls::client_config(&root))
        .await
        .unwrap();
    assert_eq!(again, first, "the cached certificate is reused");
    wait_placeable(&public).await;
    let (_c, mut p) = pair(&public).await;
    splice_works(&mut p, "restarted").await;
    assert_eq!(count(&relay, "ACME certificate obtained"), 0);

    // Forced renewal with a live splice: a new certificate, the splice untouched.
    relay.signal(libc::SIGHUP);
    assert!(
        relay.wait_log("ACME certificate obtained", Duration::from_secs(90)),
        "{:?}",
        relay.lines()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut renewed = again.clone();
    while Instant::now() < deadline && renewed == again {
        renewed = served_cert(&addr, "localhost", support::tls::client_config(&root))
            .await
            .unwrap();
    }
    assert_ne!(renewed, again, "the renewal swapped the served certificate");
    splice_works(&mut p, "after-renewal").await;
    let (_c2, mut p2) = pair(&public).await;
    splice_works(&mut p2, "new-after-renewal").await;
    assert_eq!(relay.terminate(), 0);
}

/// A CA that cannot be reached: the relay keeps its listener up without a certificate and retries
/// on a short schedule (5 s, then 10 s, jittered down by at most a fifth), not minutes apart.
#[tokio::test]
async fn acme_retries_a_ca_outage_within_seconds() {
    let dir = temp_dir("orca-relay-acme-outage");
    let port = free_port();
    let dead = free_port();
    let envs = vec![
        ("ORCA_RELAY_LISTEN", format!("127.0.0.1:{port}")),
        (
            "ORCA_RELAY_DATA_DIR",
            dir.join("data").display().to_string(),
        ),
        ("ORCA_RELAY_TLS_ACME_DOMAINS", "localhost".to_string()),
        (
            "ORCA_RELAY_TLS_ACME_DIRECTORY",
            format!("https://127.0.0.1:{dead}/dir"),
        ),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING.into()),
        ("ORCA_RELAY_SELF_HOSTED_KEY", SELF_HOSTED.into()),
        ("ORCA_RELAY_ADMIN_TOKEN", ADMIN.into()),
        ("ORCA_RELAY_CLUSTER_KEY", CLUSTER.into()),
    ];
    let relay = Relay::spawn(&dir, &envs);
    assert!(
        relay.wait_log("ACME order failed", Duration::from_secs(30)),
        "{:?}",
        relay.lines()
    );
    assert!(
        relay.wait_more("ACME order failed", 1, Duration::from_secs(20)),
        "a second attempt within seconds: {:?}",
        relay.lines()
    );
    let waits: Vec<u64> = relay
        .lines()
        .iter()
        .filter(|l| l.contains("ACME order failed"))
        .filter_map(|l| {
            l.rsplit("retrying in ")
                .next()?
                .trim_end_matches('s')
                .trim()
                .parse()
                .ok()
        })
        .collect();
    assert!(waits.len() >= 2, "{waits:?}");
    assert!(
        (4..=5).contains(&waits[0]),
        "first retry 5 s (jittered): {waits:?}"
    );
    assert!(
        (8..=10).contains(&waits[1]),
        "then 10 s (jittered): {waits:?}"
    );
    assert_eq!(relay.terminate(), 0);
}
