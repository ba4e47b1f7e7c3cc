//! Idle regional rehome, cell side (protocol.md §13): P-40..P-42 against a real `serve` process
//! (role `all`: cell `local` in us-central1 with its in-process director) and a second cell C in
//! asia-east2 whose heartbeats and rehome status the test sends. The host is a real WebSocket
//! desktop advertising `idle-regional-rehome-v1`.

#[path = "support/cell/mod.rs"]
mod support;

use std::time::Duration;

use orca_relay::cell::testkit::{self, Hello};
use orca_relay::rehome::rules;
use orca_relay::store::testing::TestDb;
use serde_json::{json, Value};
use support::*;

const US: &str = "us-central1";
const ASIA: &str = "asia-east2";
const C_URL: &str = "https://c.cells.test";

fn now() -> i64 {
    orca_relay::clock::now_ms()
}

async fn post(url: &str, bearer: Option<&str>, body: &Value) -> (u16, Value) {
    let mut rb = reqwest::Client::new().post(url).json(body);
    if let Some(b) = bearer {
        rb = rb.bearer_auth(b);
    }
    let r = rb.send().await.unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

fn cluster(sub: &str) -> String {
    orca_relay::crypto::jwt::mint_cluster_token(CLUSTER.as_bytes(), sub, now())
}

fn safety(observed_at: i64) -> Value {
    json!({"observedAt":observed_at,"sqlFailures":0,"reconnects":0,"controlActivityRecoveryFailures":0,
        "databasePoolWaiting":0,"databasePoolWaitersMax":0,"databasePoolWaitMsMax":0})
}

struct Fx {
    s: Server,
    host: Host,
    control: testkit::HostControl,
}

/// The server, cell C live with protocol 3 and clean safety, rehoming enabled with cohort 100,
/// and a capable host on `local` with a conclusive preference for asia.
async fn fixture(t: &TestDb, capable: bool) -> Fx {
    let s = start_on(
        &t.url,
        &[
            "--regions",
            "us-central1,asia-east2",
            "--public-assignment-retry-after-seconds",
            "1",
        ],
    )
    .await;
    let (st, b) = post(
        &format!("{}/v1/admin/cells", s.url),
        Some(ADMIN),
        &json!({"v":1,"cellId":"C","cellUrl":C_URL,"region":ASIA,"capacityRequests":900}),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    beat_c(&s).await;
    let host = Host::assigned(&s, "alice").await;
    let hello = Hello {
        capabilities: if capable {
            vec!["idle-regional-rehome-v1".into()]
        } else {
            vec![]
        },
        ..host.hello()
    };
    let control = host.connect_with(&s, &hello).await.expect("control");
    // The measurement exchange through the in-process director.
    let assign = |rc: Value| {
        let (url, token, id) = (
            s.url.clone(),
            host.token.clone(),
            host.id.relay_host_id.clone(),
        );
        async move {
            // Retried while the lane's per-host interval (1 s here) refuses it.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let r = post(
                    &format!("{url}/v1/assign"),
                    Some(&token),
                    &json!({"v":1,"relayHostId":id,"regionCorrection":rc}),
                )
                .await;
                if r.0 != 503 || tokio::time::Instant::now() > deadline {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let (st, w) = assign(json!({"v":1,"action":"issue-window"})).await;
    assert_eq!(st, 200, "{w}");
    let w = w["regionCorrection"]["window"].clone();
    let (st, r) = assign(json!({"v":1,"action":"report","generation":w["generation"],
        "assignmentEpoch":w["assignmentEpoch"],"policyVersion":1,"outcome":"conclusive",
        "measurements":{US:125, ASIA:100}}))
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["regionCorrection"]["reportStatus"], "accepted");
    let (st, b) = post(
        &format!("{}/v1/admin/regional-rehome-control", s.url),
        Some(ADMIN),
        &json!({"v":1,"action":"apply","expectedGeneration":0,"enabled":true,"ratePerMinute":120,
            "cohortPercent":100,"hostCooldownMs":60000,"preferenceMaxAgeMs":86400000,"confirmation":"ENABLE_REGIONAL_REHOMING"}),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    Fx { s, host, control }
}

async fn beat_c(s: &Server) {
    let inc = "00000000-0000-4000-8000-00000000000c";
    let (st, b) = post(
        &format!("{}/v1/admin/cell-heartbeat", s.url),
        Some(&cluster("C")),
        &json!({"v":1,"cellId":"C","cellUrl":C_URL,"region":ASIA,"cellIncarnation":inc,
            "startedAt":1,"ready":true,"observedRequests":0}),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    let (st, b) = post(
        &format!("{}/v1/admin/cell-rehome-status", s.url),
        Some(&cluster("C")),
        &json!({"v":1,"cellId":"C","cellIncarnation":inc,"regionalRehomeProtocol":3,"safety":safety(now())}),
    )
    .await;
    assert_eq!(st, 200, "{b}");
}

fn dispatch_body(fx: &Fx, generation: i64, incarnation: &str) -> Value {
    let id = &fx.host.id.relay_host_id;
    let attempt = rules::attempt_id(
        "alice",
        id,
        "local",
        incarnation,
        fx.host.epoch,
        generation,
        "C",
    );
    json!({"v":1,"attemptId":attempt,"userId":"alice","relayHostId":id,"sourceCellId":"local",
        "sourceCellIncarnation":incarnation,"sourceAssignmentEpoch":fx.host.epoch,
        "sourceGeneration":generation,"targetCellId":"C","cohortPercent":100,"directorSafety":safety(now())})
}

async fn dispatch(fx: &Fx, body: &Value) -> (u16, Value) {
    post(
        &format!("{}/v1/admin/host-idle-rehome", fx.s.url),
        Some(&cluster("director")),
        body,
    )
    .await
}

fn incarnation(fx: &Fx) -> String {
    fx.s.running.ctx.incarnation.clone()
}

/// P-40: foreign incarnation → 409; no token → 401; 61 s old safety → `director-safety-stale`;
/// live splice → `busy`; stale generation → `stale`; a host without the capability →
/// `host-unsupported`; bad bodies → 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p40_idle_rehome_refusals() {
    let t = TestDb::sqlite().await;
    let mut fx = fixture(&t, true).await;
    let inc = incarnation(&fx);
    let ok = dispatch_body(&fx, fx.control.generation, &inc);
    let foreign = dispatch_body(
        &fx,
        fx.control.generation,
        "00000000-0000-4000-8000-0000000000ff",
    );
    assert_eq!(
        dispatch(&fx, &foreign).await,
        (
            409,
            json!({"error":"regional_rehome_source_generation_mismatch"})
        )
    );
    let (st, b) = post(
        &format!("{}/v1/admin/host-idle-rehome", fx.s.url),
        None,
        &ok,
    )
    .await;
    assert_eq!((st, b), (401, json!({"error":"invalid_token"})));
    let (st, _) = post(
        &format!("{}/v1/admin/host-idle-rehome", fx.s.url),
        Some(&cluster("local")),
        &ok,
    )
    .await;
    assert_eq!(st, 401, "sub must be director");
    let mut old = ok.clone();
    old["directorSafety"] = safety(now() - 61_000);
    assert_eq!(
        dispatch(&fx, &old).await,
        (
            200,
            json!({"v":1,"outcome":"deferred","reason":"director-safety-stale"})
        )
    );
    let mut stale = dispatch_body(&fx, fx.control.generation + 1, &inc);
    stale["directorSafety"] = safety(now());
    assert_eq!(
        dispatch(&fx, &stale).await,
        (200, json!({"v":1,"outcome":"stale"}))
    );
    for (k, v) in [
        ("cohortPercent", json!(101)),
        ("attemptId", json!(null)),
        ("sourceGeneration", json!(0)),
    ] {
        let mut b = ok.clone();
        b[k] = v;
        assert_eq!(
            dispatch(&fx, &b).await,
            (400, json!({"error":"invalid_request"})),
            "{k}"
        );
    }
    // A live splice → busy, and nothing moved.
    let invite = fx.control.create_invite("r1", "d1").await.expect("invite");
    let _pair = testkit::pair_phone(
        &fx.s.cell_url,
        &mut fx.control,
        &fx.host.id.relay_host_id,
        &invite,
        &[],
    )
    .await
    .expect("splice");
    assert_eq!(
        dispatch(&fx, &dispatch_body(&fx, fx.control.generation, &inc)).await,
        (200, json!({"v":1,"outcome":"busy"}))
    );
    fx.s.running.shutdown().await;

    // Without the capability → host-unsupported.
    let t = TestDb::sqlite().await;
    let fx = fixture(&t, false).await;
    let inc = incarnation(&fx);
    assert_eq!(
        dispatch(&fx, &dispatch_body(&fx, fx.control.generation, &inc)).await,
        (
            200,
            json!({"v":1,"outcome":"deferred","reason":"host-unsupported"})
        )
    );
    fx.s.running.shutdown().await;
}

/// P-41: an idle capable host → `committed`; its control closes 4503 `resolve configured
/// director`; `/v1/assign` names the target at epoch + 1; redelivery → `committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p41_idle_host_is_committed_and_closed() {
    for t in dbs().await {
        let mut fx = fixture(&t, true).await;
        let inc = incarnation(&fx);
        let body = dispatch_body(&fx, fx.control.generation, &inc);
        assert_eq!(
            dispatch(&fx, &body).await,
            (200, json!({"v":1,"outcome":"committed"})),
            "{:?}",
            t.kind()
        );
        let (code, reason) = testkit::recv_close(&mut fx.control.ws, Duration::from_secs(5)).await;
        assert_eq!(
            (code, reason.as_str()),
            (4503, "resolve configured director")
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let (url, epoch) = loop {
            match testkit::assign(&fx.s.url, &fx.host.token, &fx.host.id.relay_host_id).await {
                Ok(x) => break x,
                Err(e) if e.contains("503") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!((url.as_str(), epoch), (C_URL, fx.host.epoch + 1));
        assert_eq!(
            dispatch(&fx, &body).await,
            (200, json!({"v":1,"outcome":"committed"}))
        );
        fx.s.running.shutdown().await;
    }
}

/// P-42 (held commit, Postgres): while the host's assignment row is locked elsewhere the commit
/// cannot finish, the gate stays closed and reconcile keeps retrying: a new phone gets 4409, another `attemptId` `busy`, `invite-create` closes
/// the control 4503 `resolve-director`. Once the lock is gone the attempt answers and the gate
/// reopens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p42_gate_holds_while_commit_is_held() {
    let Some(t) = TestDb::postgres().await else {
        return;
    };
    let mut fx = fixture(&t, true).await;
    let inc = incarnation(&fx);
    // An invite made before the cutover, for the phone that must be refused during it.
    let invite = fx.control.create_invite("r0", "d0").await.expect("invite");
    let mut lock = t.db.begin().await.unwrap();
    lock.query(
        "SELECT cell_id FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2 FOR UPDATE",
        &["alice".into(), fx.host.id.relay_host_id.clone().into()],
    )
    .await
    .unwrap();
    let body = dispatch_body(&fx, fx.control.generation, &inc);
    let (url, b2) = (
        format!("{}/v1/admin/host-idle-rehome", fx.s.url),
        body.clone(),
    );
    let held = tokio::spawn(async move { post(&url, Some(&cluster("director")), &b2).await });
    // The gate closes once the attempt registers.
    let key = orca_relay::store::assignments::HostKey {
        user_id: "alice".into(),
        relay_host_id: fx.host.id.relay_host_id.clone(),
    };
    let cell = fx.s.running.cell.clone().expect("cell role");
    assert!(eventually(Duration::from_secs(5), || cell.idle_gate_closed(&key)).await);
    let mut other = body.clone();
    other["attemptId"] = json!(uuid::Uuid::new_v4().to_string());
    assert_eq!(
        dispatch(&fx, &other).await,
        (200, json!({"v":1,"outcome":"busy"}))
    );
    let mut phone = testkit::connect_phone(&fx.s.cell_url, &fx.host.id.relay_host_id, &invite, &[])
        .await
        .unwrap();
    let hello = testkit::recv_json(&mut phone, Duration::from_secs(5)).await;
    assert_eq!(
        hello.map(|h| h["code"].clone()),
        Ok(json!(4409)),
        "new phone refused"
    );
    fx.control
        .send(json!({"type":"invite-create","reqId":"r1","relayDeviceId":"d1"}))
        .await;
    let (code, reason) = testkit::recv_close(&mut fx.control.ws, Duration::from_secs(5)).await;
    assert_eq!((code, reason.as_str()), (4503, "resolve-director"));
    // Still closed while the lock is held (reconcile retries).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(cell.idle_gate_closed(&key));
    assert!(!held.is_finished());
    lock.rollback().await;
    let (st, answer) = held.await.unwrap();
    assert_eq!(st, 200, "{answer}");
    assert!(
        ["committed", "deferred", "stale"].contains(&answer["outcome"].as_str().unwrap()),
        "{answer}"
    );
    assert!(!cell.idle_gate_closed(&key), "the gate reopens");
    fx.s.running.shutdown().await;
}
