//! Idle regional rehome, cell side (docs/reference/http.md): P-40..P-42 against a real `serve` process
//! (role `all`: cell `local` in us-central1 with its in-process director) and a second cell C in
//! asia-east2 whose heartbeats and rehome status the test sends. The host is a real WebSocket
//! desktop advertising `idle-regional-rehome-v1`. Also P-43 (an evacuated host's old cell closes
//! its control), a database cut during a commit (Postgres, through `support/pgproxy.rs`) and the
//! rule that no log line of an attempt names the user or the host.

mod support;
use support::pgproxy;

use std::time::Duration;

use orca_relay::cell::testkit::{self, Hello};
use orca_relay::rehome::rules;
use orca_relay::store::testing::TestDb;
use serde_json::{json, Value};
use support::node::*;

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
    fixture_at(&t.url, capable).await
}

/// [`fixture`] on a server reaching its database at `db_url` (e.g. through a proxy).
async fn fixture_at(db_url: &str, capable: bool) -> Fx {
    let s = start_on(
        db_url,
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

/// Captures this test binary's `orca_relay*` log lines (every level), so a test can prove that no
/// line names a user or a host.
mod capture {
    use std::sync::Mutex;

    static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
    struct Capture;
    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata) -> bool {
            true
        }
        fn log(&self, r: &log::Record) {
            if r.target().starts_with("orca_relay") {
                LINES.lock().unwrap().push(r.args().to_string());
            }
        }
        fn flush(&self) {}
    }

    pub fn install() {
        if log::set_boxed_logger(Box::new(Capture)).is_ok() {
            log::set_max_level(log::LevelFilter::Trace);
        }
    }

    /// The captured lines containing `needle`.
    pub fn lines_with(needle: &str) -> Vec<String> {
        LINES
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    pub fn count() -> usize {
        LINES.lock().unwrap().len()
    }
}

/// P-41: an idle capable host → `committed`; its control closes 4503 `resolve configured
/// director`; `/v1/assign` names the target at epoch + 1; redelivery → `committed`. Neither the
/// control route's `outcomes` nor any log line names the user or the host (issue 8: digests only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p41_idle_host_is_committed_and_closed() {
    capture::install();
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
        let (st, c) = post(
            &format!("{}/v1/admin/regional-rehome-control", fx.s.url),
            Some(ADMIN),
            &json!({"v":1,"action":"inspect"}),
        )
        .await;
        assert_eq!(st, 200, "{c}");
        assert_eq!(c["outcomes"]["attempts"]["committed"], 1, "{c}");
        let (st, o) = get_overview(&fx.s).await;
        assert_eq!(st, 200, "{o}");
        assert_eq!(
            o["regionalRehome"],
            json!({"enabled": true, "committed": 1, "deferred": 0, "aborted": 0}),
            "the overview shows the same trailing-24 h counts"
        );
        let id = fx.host.id.relay_host_id.clone();
        for (what, v) in [("outcomes", &c["outcomes"]), ("overview", &o)] {
            let text = v.to_string();
            assert!(
                !text.contains(&id) && !text.contains("alice"),
                "{what} names the host: {text}"
            );
        }
        assert!(capture::count() > 0, "the capture sees the server's lines");
        assert!(
            !capture::lines_with("orca_relay_idle_rehome_source_outcome").is_empty(),
            "the attempt was logged"
        );
        for needle in [id.as_str(), "\"alice\"", "userId\":\"alice"] {
            let hits = capture::lines_with(needle);
            assert!(hits.is_empty(), "log lines name {needle}: {hits:?}");
        }
        fx.s.running.shutdown().await;
    }
}

async fn get_overview(s: &Server) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(format!("{}/v1/admin/overview", s.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// P-42, the data leg: a `conn-open` issued before the gate closed, attached while an idle
/// cutover holds the host's gate → the data leg closes 4409 `idle cutover in progress`. A real
/// attempt cannot register while a connection is pending (the host is not idle), so the gate is
/// held with the cell's test hook; the refusal path itself is the production one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p42_data_leg_refused_during_cutover() {
    for t in dbs().await {
        let mut fx = fixture(&t, true).await;
        let invite = fx.control.create_invite("r0", "d0").await.expect("invite");
        let _phone =
            testkit::connect_phone(&fx.s.cell_url, &fx.host.id.relay_host_id, &invite, &[])
                .await
                .unwrap();
        let open = fx.control.recv(Duration::from_secs(10)).await.unwrap();
        assert_eq!(open["type"], "conn-open", "{open}");
        let key = orca_relay::store::assignments::HostKey {
            user_id: "alice".into(),
            relay_host_id: fx.host.id.relay_host_id.clone(),
        };
        let cell = fx.s.running.cell.clone().expect("cell role");
        let hold = cell
            .hold_idle_gate(&key, &uuid::Uuid::new_v4().to_string())
            .expect("gate free");
        let mut data = testkit::connect_data(&fx.s.cell_url, &open, fx.control.generation, &[])
            .await
            .unwrap();
        let (code, reason) = testkit::recv_close(&mut data, Duration::from_secs(5)).await;
        assert_eq!(
            (code, reason.as_str()),
            (4409, "idle cutover in progress"),
            "{:?}",
            t.kind()
        );
        drop(hold);
        assert!(!cell.idle_gate_closed(&key));
        fx.s.running.shutdown().await;
    }
}

/// P-43 (two cells: `local` and C): evacuating a connected host to C → within 50 s the old cell
/// closes the control 4503 with one of the three authority reasons; a hello at the old epoch →
/// 4409. On the test clock (current-thread runtime): the 15 s ticks are jumped, not waited.
#[tokio::test]
async fn p43_evacuated_host_is_closed_by_the_old_cell() {
    for t in dbs().await {
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
        let host = Host::assigned(&s, "bob").await;
        let mut control = host.connect(&s).await;
        let (st, m) = post(
            &format!("{}/v1/admin/evacuate", s.url),
            Some(ADMIN),
            &json!({"v":1,"userId":"bob","relayHostId":host.id.relay_host_id,"targetCellId":"C"}),
        )
        .await;
        assert_eq!(st, 200, "{m}");
        assert_eq!(m["migration"]["assignmentEpoch"], host.epoch + 1, "{m}");
        let started = tokio::time::Instant::now();
        let closed = loop {
            assert!(
                started.elapsed() < Duration::from_secs(50),
                "no close within 50 s ({:?})",
                t.kind()
            );
            match control.recv(Duration::from_secs(3)).await {
                Err((0, why)) if why == "timeout" => jump(Duration::from_secs(15)).await,
                Ok(_) => {}
                Err(c) => break c,
            }
        };
        let within = started.elapsed();
        assert_eq!(closed.0, 4503, "{closed:?}");
        assert!(
            [
                "control migration completed",
                "control assignment missing",
                "control activity moved"
            ]
            .contains(&closed.1.as_str()),
            "{closed:?}"
        );
        assert!(within < Duration::from_secs(50), "{within:?}");
        let again = host.connect_with(&s, &host.hello()).await;
        assert_eq!(
            again.err().map(|e| e.0),
            Some(4409),
            "hello at the old epoch"
        );
        s.running.shutdown().await;
    }
}

/// A database cut while an idle-rehome commit is in flight (Postgres behind a closable proxy):
/// the commit fails with its outcome unknown, the admission gate stays closed while reconcile
/// cannot reach the store, and reopens only once reconcile answers `not-committed` (→ `deferred`).
/// Nothing is half written: no attempt, no migration, the assignment unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_cut_keeps_the_gate_closed_until_reconcile() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipped: ORCA_RELAY_TEST_POSTGRES_URL not set");
        return;
    };
    let proxy = pgproxy::PgProxy::start().await;
    let mut fx = fixture_at(&proxy.url(&t.url), true).await;
    let inc = incarnation(&fx);
    let key = orca_relay::store::assignments::HostKey {
        user_id: "alice".into(),
        relay_host_id: fx.host.id.relay_host_id.clone(),
    };
    let cell = fx.s.running.cell.clone().expect("cell role");
    capture::install();
    // No byte moves: the commit's first statement hangs in flight.
    proxy.black_hole();
    let body = dispatch_body(&fx, fx.control.generation, &inc);
    let attempt = format!(
        "attemptId={}",
        body["attemptId"].as_str().expect("attemptId")
    );
    let url = format!("{}/v1/admin/host-idle-rehome", fx.s.url);
    let held = tokio::spawn(async move { post(&url, Some(&cluster("director")), &body).await });
    assert!(eventually(Duration::from_secs(5), || cell.idle_gate_closed(&key)).await);
    // The database goes away under it: every connection closes, new ones are refused.
    proxy.cut();
    let invite_refused = {
        fx.control
            .send(json!({"type":"invite-create","reqId":"r1","relayDeviceId":"d1"}))
            .await;
        testkit::recv_close(&mut fx.control.ws, Duration::from_secs(5)).await
    };
    assert_eq!(
        (invite_refused.0, invite_refused.1.as_str()),
        (4503, "resolve-director")
    );
    // Reconcile keeps failing (100 ms doubling): after three failed tries the gate is still
    // closed and the attempt unanswered.
    assert!(
        eventually(Duration::from_secs(10), || {
            capture::lines_with(&attempt)
                .iter()
                .filter(|l| l.contains("reconcile failed"))
                .count()
                >= 3
        })
        .await,
        "reconcile retried while the store is cut"
    );
    assert!(
        cell.idle_gate_closed(&key),
        "gate closed while the store is cut"
    );
    assert!(!held.is_finished(), "no answer without the store");
    proxy.resume();
    let (st, answer) = tokio::time::timeout(Duration::from_secs(20), held)
        .await
        .expect("answered once the store is back")
        .unwrap();
    assert_eq!(st, 200, "{answer}");
    assert_eq!(answer, json!({"v":1,"outcome":"deferred"}), "not committed");
    assert!(!cell.idle_gate_closed(&key), "the gate reopens");
    let attempts =
        t.db.query("SELECT COUNT(*) FROM relay_region_rehome_attempts", &[])
            .await
            .unwrap();
    let migrations =
        t.db.query("SELECT COUNT(*) FROM relay_assignment_migrations", &[])
            .await
            .unwrap();
    let home =
        t.db.query(
            "SELECT cell_id, assignment_epoch FROM relay_assignments WHERE user_id = 'alice'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((attempts[0].i64(0), migrations[0].i64(0)), (0, 0));
    assert_eq!(
        (home[0].str(0), home[0].i64(1)),
        ("local".to_string(), fx.host.epoch)
    );
    fx.s.running.shutdown().await;
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
