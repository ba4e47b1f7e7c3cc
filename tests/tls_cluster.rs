//! Cluster traffic over https (issue 13): a director process and a cell process, each serving
//! built-in TLS with certificates from a CA generated at test time. The cell heartbeats to the
//! director over https trusting that CA through `ORCA_RELAY_TLS_EXTRA_CA`; a second cell without
//! the CA file cannot (its beats fail verification), which shows the check is real. A host then
//! assigns at the director and connects its control leg to the cell over `wss://`.

mod support;

use std::time::{Duration, Instant};

use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::store::testing::temp_dir;
use support::tls::common::ports::free_port;
use support::tls::{write_pair, Relay, TestCa};

const SIGNING: &str = "tls-cluster-signing-key-tls-cluster-signing-1";
const ADMIN: &str = "tls-cluster-admin-token-tls-cluster-admin-01";
const CLUSTER: &str = "tls-cluster-node-key-tls-cluster-node-key-01";

async fn cell_runtime(director: &str, cell_id: &str) -> serde_json::Value {
    let v: serde_json::Value = testkit::http_client()
        .post(format!("{director}/v1/admin/cell-status"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"v": 1, "cellId": cell_id}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["cells"][0]["runtime"].clone()
}

#[tokio::test]
async fn cell_heartbeats_to_director_over_https() {
    let dir = temp_dir("orca-relay-tls-cluster");
    let ca = TestCa::new("orca cluster test ca");
    let ca_path = ca.write(&dir);
    testkit::trust_extra_ca(ca.pem.as_bytes());
    let (dport, cport, bport) = (free_port(), free_port(), free_port());
    let director_url = format!("https://localhost:{dport}");
    let cell_url = format!("https://localhost:{cport}");
    let db = format!("sqlite://{}", dir.join("cluster.sqlite3").display());
    let cells = serde_json::json!([
        {"id": "cell-a", "url": cell_url, "region": "us-central1", "capacityRequests": 100},
        {"id": "cell-b", "url": format!("https://localhost:{bport}"), "region": "us-central1", "capacityRequests": 100},
    ]);
    let common = |name: &str, port: u16| {
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let (cert, key) = ca.issue(&["localhost"]);
        let (cp, kp) = write_pair(&sub, &cert, &key);
        vec![
            ("ORCA_RELAY_LISTEN", format!("127.0.0.1:{port}")),
            ("ORCA_RELAY_PUBLIC_URL", format!("https://localhost:{port}")),
            ("ORCA_RELAY_TLS_CERT", cp.display().to_string()),
            ("ORCA_RELAY_TLS_KEY", kp.display().to_string()),
            ("ORCA_RELAY_DATABASE_URL", db.clone()),
            ("ORCA_RELAY_DATA_DIR", sub.display().to_string()),
            ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", SIGNING.into()),
            ("ORCA_RELAY_ADMIN_TOKEN", ADMIN.into()),
            ("ORCA_RELAY_CLUSTER_KEY", CLUSTER.into()),
        ]
    };
    let mut d_env = common("director", dport);
    d_env.push(("ORCA_RELAY_ROLE", "director".into()));
    d_env.push(("ORCA_RELAY_CELLS", cells.to_string()));
    let director = Relay::spawn(&dir, &d_env);

    let cell_env = |name: &str, port: u16, with_ca: bool| {
        let mut e = common(name, port);
        e.push(("ORCA_RELAY_ROLE", "cell".into()));
        e.push(("ORCA_RELAY_CELL_ID", name.into()));
        e.push(("ORCA_RELAY_DIRECTOR_URL", director_url.clone()));
        if with_ca {
            e.push(("ORCA_RELAY_TLS_EXTRA_CA", ca_path.display().to_string()));
        }
        e
    };
    let cell = Relay::spawn(&dir, &cell_env("cell-a", cport, true));
    let stranger = Relay::spawn(&dir, &cell_env("cell-b", bport, false));

    // cell-a's beats arrive: the director holds its runtime row.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut runtime = serde_json::Value::Null;
    while Instant::now() < deadline {
        runtime = cell_runtime(&director_url, "cell-a").await;
        if runtime["lastHeartbeatAt"].as_i64().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        runtime["lastHeartbeatAt"].as_i64().is_some(),
        "cell-a beat over https: {runtime} {:?}",
        cell.lines()
    );
    assert!(!cell
        .lines()
        .iter()
        .any(|l| l.contains("cell heartbeat failed")));
    // cell-b does not trust the test CA: its first beat fails and the director never hears it.
    assert!(
        stranger.wait_log("cell heartbeat failed", Duration::from_secs(20)),
        "{:?}",
        stranger.lines()
    );
    assert!(cell_runtime(&director_url, "cell-b").await.is_null());

    // The whole chain: assign at the director over https, control leg to the cell over wss.
    let host = HostIdentity::generate("cluster-user");
    let token = host.token(SIGNING, &director_url);
    let (got_cell, epoch) = testkit::assign(&director_url, &token, &host.relay_host_id)
        .await
        .expect("assign");
    assert_eq!(got_cell, cell_url);
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let control = testkit::connect_control(&got_cell, &host, &token, &director_url, &hello).await;
    assert!(control.is_ok(), "control over wss: {:?}", control.err());

    drop(stranger);
    assert_eq!(cell.terminate(), 0);
    assert_eq!(director.terminate(), 0);
}
