//! The read-only metrics token (`ORCA_RELAY_METRICS_TOKEN`): accepted by `/metrics` and by the
//! dashboard's reads (runtime status, overview, cell status), refused with the admin routes' own
//! `401 invalid_token` by every action; validated like the admin token at start-up.

mod support;
use support::push as push_support;

use orca_relay::config::{Config, ServeArgs};
use orca_relay::store::testing::TestDb;
use push_support::{Server, ADMIN};
use serde_json::json;

const SIGNING: &str = "0123456789abcdef0123456789abcdef";
const SELF_HOSTED: &str = "self-hosted-key-self-hosted-key-0001";
const CLUSTER: &str = "cluster-key-cluster-key-cluster-key-0001";
const METRICS: &str = "metrics-read-only-token-metrics-read-0001";

/// `Config::from_args` for `serve` flags; the error text on refusal.
fn config(extra: &[&str]) -> Result<Config, String> {
    let mut argv = vec!["--listen", "127.0.0.1:0"];
    argv.extend_from_slice(extra);
    let flags = ServeArgs::parse_flags(argv).map_err(|e| e.to_string())?;
    Config::from_args(&flags).map_err(|e| e.0)
}

#[test]
fn metrics_token_is_validated_like_the_admin_token() {
    let ok = config(&["--metrics-token", METRICS]).expect("valid token");
    assert_eq!(ok.secrets.metrics_token.as_deref(), Some(METRICS));
    assert!(config(&[]).unwrap().secrets.metrics_token.is_none());
    let too_long = "x".repeat(257);
    for bad in [
        "short-token",     // under 32 characters
        too_long.as_str(), // over 256
        "metrics token with spaces 0000000000",
        "metrics-token-\u{e9}\u{e9}-0000000000000000000", // not ASCII
        "metrics-token-\t-000000000000000000000000",      // a control character
    ] {
        let Err(e) = config(&["--metrics-token", bad]) else {
            panic!("accepted a bad metrics token")
        };
        assert!(
            e.contains("ORCA_RELAY_METRICS_TOKEN must be 32..256 visible ASCII characters"),
            "{e}"
        );
        assert!(!e.contains(bad), "the refusal must not echo the value: {e}");
    }
    // The boundaries are accepted.
    for good in ["a".repeat(32), "~".repeat(256)] {
        config(&["--metrics-token", &good]).expect("boundary accepted");
    }
}

async fn server() -> (TestDb, Server) {
    let db = TestDb::sqlite().await;
    let s = Server::all_with(
        &db.url,
        &[
            ("--assignment-signing-key", SIGNING),
            ("--self-hosted-key", SELF_HOSTED),
            ("--cluster-key", CLUSTER),
            ("--metrics-token", METRICS),
        ],
    )
    .await;
    (db, s)
}

async fn call(s: &Server, method: &str, path: &str, token: &str, body: Option<&str>) -> u16 {
    let c = reqwest::Client::new();
    let url = format!("{}{path}", s.base);
    let r = match method {
        "GET" => c.get(url),
        _ => c
            .post(url)
            .header("content-type", "application/json")
            .body(body.unwrap_or("{\"v\":1}").to_string()),
    };
    r.bearer_auth(token).send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_accept_it_actions_refuse_it() {
    let (_db, s) = server().await;

    // The reads: /metrics and the dashboard's three views.
    let reads = [
        ("GET", "/metrics", None),
        ("POST", "/v1/admin/runtime-status", Some("{\"v\":1}")),
        ("GET", "/v1/admin/overview", None),
        ("POST", "/v1/admin/cell-status", Some("{\"v\":1}")),
    ];
    for (m, path, body) in reads {
        assert_eq!(call(&s, m, path, METRICS, body).await, 200, "{m} {path}");
        assert_eq!(call(&s, m, path, ADMIN, body).await, 200, "{m} {path}");
        let wrong = format!("{METRICS}x");
        assert_eq!(call(&s, m, path, &wrong, body).await, 401, "{m} {path}");
    }
    let text = s.metrics_text(METRICS).await;
    assert!(text.contains("orca_relay_connections{leg=\"control\"}"));

    // Every action: the metrics token gets the same 401 as no token at all. Bodies are valid
    // enough that the admin token is not refused for lack of authority (the route is real).
    let actions: Vec<(&str, String)> = vec![
        (
            "/v1/admin/cells",
            json!({"v":1,"cellId":"c2","cellUrl":"http://127.0.0.1:1","region":"default","capacityRequests":10}).to_string(),
        ),
        ("/v1/admin/cell-state", json!({"v":1,"cellId":"local","state":"general"}).to_string()),
        ("/v1/admin/cell-fence", json!({"v":1,"cellId":"local"}).to_string()),
        (
            "/v1/admin/host-whereabouts",
            json!({"v":1,"relayHostId":"h"}).to_string(),
        ),
        (
            "/v1/admin/evacuate",
            json!({"v":1,"userId":"u","relayHostId":"h","targetCellId":"local"}).to_string(),
        ),
        (
            "/v1/admin/evacuate-cell",
            json!({"v":1,"sourceCellId":"local","limit":1}).to_string(),
        ),
        (
            "/v1/admin/migration-complete",
            json!({"v":1,"userId":"u","relayHostId":"h","assignmentEpoch":1}).to_string(),
        ),
        ("/v1/admin/regional-rehome-control", json!({"v":1}).to_string()),
        ("/v1/admin/drain", json!({"v":1,"graceMs":0}).to_string()),
        ("/v1/admin/cell-heartbeat", json!({"v":1}).to_string()),
        ("/v1/admin/cell-rehome-status", json!({"v":1}).to_string()),
        ("/v1/admin/host-idle-rehome", json!({"v":1}).to_string()),
    ];
    for (path, body) in &actions {
        assert_eq!(
            call(&s, "POST", path, METRICS, Some(body)).await,
            401,
            "POST {path} accepted the metrics token"
        );
    }
    // The admin token passes the gate of the operator actions (any answer but 401); the drain
    // goes last so the other routes ran on a serving cell.
    for (path, body) in &actions[..8] {
        let status = call(&s, "POST", path, ADMIN, Some(body)).await;
        assert_ne!(status, 401, "POST {path} refused the admin token");
    }
    s.stop().await;
}
