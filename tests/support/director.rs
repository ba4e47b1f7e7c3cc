//! Harness of the director acceptance tests (ARCHITECTURE.md): an in-process `--role director`
//! server on a fresh database, cells registered through `POST /v1/admin/cells` and played by
//! POSTing heartbeats with cluster tokens.
//!
//! Time-based scenarios never sleep: they age runtime rows with SQL (e.g. `last_heartbeat_at` −
//! 46 000 for "46 s silent"), which is exactly what the rules read.

#![allow(dead_code)]

pub use super::common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use orca_relay::server::Running;
use orca_relay::store::testing::TestDb;
use orca_relay::store::Db;
use serde_json::{json, Value};

pub const US: &str = "us-central1";
pub const ASIA: &str = "asia-east2";
pub const SIGNING: &str = "assignment-signing-key-0123456789abcdef";
pub const SELF_HOSTED: &str = "selfhostedkey_0123456789abcdef_ABCDEF";
pub const ADMIN: &str = "admin-token-0123456789abcdef-0123456789";
pub const CLUSTER: &str = "cluster-key-0123456789abcdef-0123456789";

/// Installs the capturing logger once per test binary (the common capture).
pub fn capture_logs() {
    common::logs::install();
}

/// Every line the crate logged so far (all tests of the binary).
pub fn logs() -> Vec<String> {
    common::logs::texts("orca_relay")
}

/// Lines containing every needle.
pub fn lines_with(needles: &[&str]) -> Vec<String> {
    logs()
        .into_iter()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .collect()
}

pub fn now() -> i64 {
    orca_relay::clock::now_ms()
}

pub fn cell_url(id: &str) -> String {
    format!("https://{}.cells.test", id.to_lowercase())
}

/// A running director and its client.
pub struct Dir {
    pub run: Running,
    pub base: String,
    pub http: reqwest::Client,
    pub db: Db,
    /// Last watermark sent per cell (capped cells send an increasing one).
    watermarks: Mutex<HashMap<String, i64>>,
}

pub struct Resp {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: Value,
}

impl Resp {
    pub fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
}

/// Starts `--role director` on `t` with both Retry-After tunables at 1 and `extra` flags.
pub async fn start(t: &TestDb, extra: &[&str]) -> Dir {
    capture_logs();
    let dir = orca_relay::store::testing::temp_dir("orca-director-test");
    let mut args: Vec<String> = [
        "x",
        "--role",
        "director",
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        &t.url,
        "--data-dir",
        dir.to_str().unwrap(),
        "--assignment-signing-key",
        SIGNING,
        "--self-hosted-key",
        SELF_HOSTED,
        "--admin-token",
        ADMIN,
        "--cluster-key",
        CLUSTER,
        "--regions",
        "us-central1,asia-east2",
        "--public-assignment-retry-after-seconds",
        "1",
        "--public-sticky-retry-after-seconds",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if extra.contains(&"--role") {
        args.drain(1..3);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let run = common::serve::start(&args).await;
    let base = format!("http://{}", run.addr);
    Dir {
        db: run.ctx.db.clone(),
        run,
        base,
        http: reqwest::Client::new(),
        watermarks: Mutex::new(HashMap::new()),
    }
}

impl Dir {
    pub fn director(&self) -> &std::sync::Arc<orca_relay::director::Director> {
        self.run.director.as_ref().unwrap()
    }

    /// Most scenarios issue several requests per host back to back: turn the per-host rules off
    /// (D-20 tests the real ones on its own director). Not a 1 ms interval: two requests on a
    /// local Postgres can start less than 1 ms apart, which made D-54 flaky.
    pub fn fast_lanes(&self) {
        self.director().placement_lane.set_interval(Duration::ZERO);
        self.director().sticky_lane.set_interval(Duration::ZERO);
    }

    pub async fn post(&self, path: &str, bearer: Option<&str>, body: &Value) -> Resp {
        self.post_raw(path, bearer, serde_json::to_vec(body).unwrap())
            .await
    }

    pub async fn post_raw(&self, path: &str, bearer: Option<&str>, body: Vec<u8>) -> Resp {
        let mut rb = self
            .http
            .post(format!("{}{}", self.base, path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(b) = bearer {
            rb = rb.bearer_auth(b);
        }
        let r = rb.send().await.expect("request");
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let text = r.text().await.unwrap();
        Resp {
            status,
            retry_after,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        let r = self
            .http
            .get(format!("{}{}", self.base, path))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        Resp {
            status,
            retry_after,
            body: r.json().await.unwrap_or(Value::Null),
        }
    }

    pub async fn admin(&self, path: &str, body: Value) -> Resp {
        self.post(&format!("/v1/admin/{path}"), Some(ADMIN), &body)
            .await
    }

    /// Registers a cell (capacity 900 unless given); `capped` = cap 600, bound 0.
    pub async fn register(&self, id: &str, region: &str, capped: bool) {
        self.register_with(id, region, capped, 900).await
    }

    pub async fn register_with(&self, id: &str, region: &str, capped: bool, capacity: i64) {
        let mut body = json!({"v":1,"cellId":id,"cellUrl":cell_url(id),"region":region,"capacityRequests":capacity});
        if capped {
            body["connectionHardCap"] = json!(600);
            body["connectionUnobservedBound"] = json!(0);
        }
        let r = self.admin("cells", body).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }

    /// A heartbeat body; `telemetry` = (total, inFlight, enforced) for capped cells.
    #[allow(clippy::too_many_arguments)]
    pub fn hb_body(
        &self,
        id: &str,
        region: &str,
        ready: bool,
        inc: &str,
        started_at: i64,
        observed: i64,
        telemetry: Option<(i64, i64, i64)>,
    ) -> Value {
        let mut b = json!({"v":1,"cellId":id,"cellUrl":cell_url(id),"region":region,"cellIncarnation":inc,
            "startedAt":started_at,"ready":ready,"observedRequests":observed});
        if let Some((total, in_flight, enforced)) = telemetry {
            let wm = {
                let mut w = self.watermarks.lock().unwrap();
                let e = w.entry(id.to_string()).or_insert(0);
                *e += 1;
                *e
            };
            b["totalConnections"] = json!(total);
            b["inFlightConnections"] = json!(in_flight);
            b["reservedConnectionUnits"] = json!(enforced - total - in_flight);
            b["enforcedConnectionUnits"] = json!(enforced);
            b["connectionHardCap"] = json!(600);
            b["connectionUnobservedBound"] = json!(0);
            b["connectionInclusionWatermark"] = json!(wm);
        }
        b
    }

    pub async fn send_hb(&self, body: &Value) -> Resp {
        let id = body["cellId"].as_str().unwrap().to_string();
        let token = orca_relay::crypto::jwt::mint_cluster_token(CLUSTER.as_bytes(), &id, now());
        self.post("/v1/admin/cell-heartbeat", Some(&token), body)
            .await
    }

    /// `hb(X, ready, inc, startedAt)` with zero telemetry when `capped`; asserts 200.
    pub async fn hb(
        &self,
        id: &str,
        region: &str,
        ready: bool,
        inc: &str,
        started_at: i64,
        capped: bool,
    ) {
        self.hb_obs(id, region, ready, inc, started_at, capped, 0)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn hb_obs(
        &self,
        id: &str,
        region: &str,
        ready: bool,
        inc: &str,
        started_at: i64,
        capped: bool,
        observed: i64,
    ) {
        let b = self.hb_body(
            id,
            region,
            ready,
            inc,
            started_at,
            observed,
            capped.then_some((0, 0, 0)),
        );
        let r = self.send_hb(&b).await;
        assert_eq!(r.status, 200, "hb {id}: {:?}", r.body);
    }

    /// Makes a cell silent for `ms` (ages its runtime row; no sleeping).
    pub async fn age_runtime(&self, id: &str, ms: i64) {
        self.db
            .execute(
                "UPDATE relay_cell_runtime SET last_heartbeat_at = last_heartbeat_at - $2, \
                 connection_observed_at = CASE WHEN connection_observed_at IS NULL THEN NULL ELSE connection_observed_at - $2 END \
                 WHERE cell_id = $1",
                &[id.into(), ms.into()],
            )
            .await
            .unwrap();
    }

    pub async fn cell_status(&self, id: &str) -> Value {
        let r = self.admin("cell-status", json!({"v":1,"cellId":id})).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body["cells"][0].clone()
    }

    pub async fn whereabouts(&self, h: &Host) -> Value {
        let r = self
            .admin(
                "host-whereabouts",
                json!({"v":1,"relayHostId":h.id,"userId":h.user}),
            )
            .await;
        assert_eq!(r.status, 200);
        r.body["assignments"][0].clone()
    }

    /// A host with a fresh key and a self-hosted host token.
    pub async fn host(&self, user: &str) -> Host {
        let key: [u8; 32] = rand::random();
        let id = orca_relay::crypto::ident::relay_host_id(&key);
        let r = self
            .post(
                "/v1/host-token",
                Some(SELF_HOSTED),
                &json!({"relayHostId":id,"hostPublicKeyB64":orca_relay::crypto::b64::std_encode(&key),"userId":user}),
            )
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        Host {
            user: user.to_string(),
            id,
            token: r.body["relayToken"].as_str().unwrap().to_string(),
        }
    }

    pub async fn assign(&self, h: &Host, extra: Value) -> Resp {
        let mut body = json!({"v":1,"relayHostId":h.id});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                body[k] = v;
            }
        }
        self.post("/v1/assign", Some(&h.token), &body).await
    }

    /// Installs a resume credential for `h` (the device table, as a cell would) and returns it.
    pub async fn resume_token(&self, h: &Host) -> String {
        let rt = orca_relay::crypto::ident::random_b64u32();
        let n = now();
        self.db
            .execute(
                "INSERT INTO relay_devices (user_id, relay_host_id, relay_device_id, current_hash, current_version, \
                 current_expires_at, created_at, updated_at) VALUES ($1, $2, 'dev-1', $3, 1, $4, $5, $5)",
                &[
                    h.user.clone().into(),
                    h.id.clone().into(),
                    orca_relay::crypto::ident::token_hash(&rt).into(),
                    (n + 2_592_000_000).into(),
                    n.into(),
                ],
            )
            .await
            .unwrap();
        rt
    }

    pub async fn resolve(&self, h: &Host, rt: &str) -> Resp {
        self.post(
            "/v1/resolve",
            None,
            &json!({"v":1,"relayHostId":h.id,"resumeToken":rt}),
        )
        .await
    }

    pub async fn shutdown(self) {
        self.run.shutdown().await;
    }
}

pub struct Host {
    pub user: String,
    pub id: String,
    pub token: String,
}

impl Host {
    pub fn digest(&self) -> String {
        orca_relay::crypto::ident::host_digest(&self.id)
    }
}

pub fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// invariants 1, 2, 3, 5, 6.
pub async fn check_invariants(db: &orca_relay::store::Db) {
    let bad = db
        .query(
            "SELECT c.cell_id FROM relay_cells c WHERE c.reserved_requests <> \
             (SELECT CAST(COALESCE(SUM(l.request_units), 0) AS BIGINT) FROM relay_assignment_activity_leases l WHERE l.cell_id = c.cell_id)",
            &[],
        )
        .await
        .unwrap();
    assert!(
        bad.is_empty(),
        "invariant 1 broken on {:?}",
        bad.iter().map(|r| r.str(0)).collect::<Vec<_>>()
    );
    for (col, kind) in [
        ("reserved_controls", "control"),
        ("reserved_splices", "splice"),
        ("reserved_invites", "invite"),
        ("pending_installs", "install"),
        ("pending_confirmations", "confirmation"),
        ("migration_leases", "migration"),
    ] {
        let bad = db
            .query(
                &format!(
                    "SELECT a.user_id FROM relay_assignments a WHERE a.{col} <> (SELECT COUNT(*) FROM \
                     relay_assignment_activity_leases l WHERE l.user_id = a.user_id AND l.relay_host_id = a.relay_host_id \
                     AND l.activity_kind = '{kind}')"
                ),
                &[],
            )
            .await
            .unwrap();
        assert!(bad.is_empty(), "invariant 2 broken for {col}");
    }
    let bad = db
        .query(
            "SELECT m.user_id FROM relay_assignment_migrations m JOIN relay_assignments a ON a.user_id = m.user_id \
             AND a.relay_host_id = m.relay_host_id WHERE m.completed_at IS NULL AND m.aborted_at IS NULL \
             AND (m.assignment_epoch <> a.assignment_epoch OR m.target_cell_id <> a.cell_id)",
            &[],
        )
        .await
        .unwrap();
    assert!(bad.is_empty(), "invariant 3 broken");
    let bad = db
        .query(
            "SELECT cell_id FROM relay_cells WHERE roll_isolated_at IS NOT NULL AND admission_state <> 'migration-only'",
            &[],
        )
        .await
        .unwrap();
    assert!(bad.is_empty(), "invariant 5 broken");
    let bad = db
        .query(
            "SELECT user_id FROM relay_connection_reservations WHERE state = 'reserved' \
             GROUP BY user_id, relay_host_id, assignment_epoch, cell_id HAVING COUNT(*) > 1",
            &[],
        )
        .await
        .unwrap();
    assert!(bad.is_empty(), "invariant 6 broken");
}

/// A TCP proxy to Postgres that can be closed (dropping every connection) and reopened on the
/// same port: a database cut for fault tests.
pub struct PgProxy {
    pub addr: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
}

impl PgProxy {
    pub async fn open(addr: std::net::SocketAddr, upstream: &str) -> PgProxy {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let (s2, up) = (stop.clone(), upstream.to_string());
        tokio::spawn(async move {
            loop {
                let (mut inbound, _) = tokio::select! {
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                    _ = s2.cancelled() => return,
                };
                let (s3, up) = (s2.clone(), up.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&up).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = s3.cancelled() => {}
                    }
                });
            }
        });
        PgProxy { addr, stop }
    }

    pub fn close(&self) {
        self.stop.cancel();
    }
}
