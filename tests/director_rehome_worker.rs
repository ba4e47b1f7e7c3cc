//! The director's idle-rehome worker (docs/reference/http.md) end to end: D-65, D-66 and D-67 on real
//! processes (a director, cell A in us-central1, cell C in asia-east2, one Postgres database) and
//! a real desktop host advertising `idle-regional-rehome-v1` over the control handshake. D-67
//! puts a fault-injecting proxy in front of A that answers `host-idle-rehome` with 500, or never
//! answers, while forwarding everything else.
//!
//! Postgres only (the clustered shape); each test skips without ORCA_RELAY_TEST_POSTGRES_URL.
//! The pure decisions (gates, candidates, answer table, skip list) are unit-tested in
//! `src/rehome/rules.rs`.

mod support;
use support::cluster;
use support::rehome_worker;

use std::time::{Duration, Instant};

use cluster::wait_until;
use orca_relay::store::testing::TestDb;
use rehome_worker::*;
use serde_json::{json, Value};

fn now() -> i64 {
    orca_relay::clock::now_ms()
}

/// D-65: with the control enabled and cohort 100, within a few polls the idle host is on C at
/// epoch + 1; the attempt is recorded; `outcomes` counts it; neither `outcomes` nor any log line
/// of the three processes holds the `userId` or `relayHostId`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d65_idle_host_moves_to_its_preferred_region() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipped: ORCA_RELAY_TEST_POSTGRES_URL not set");
        return;
    };
    let started = Instant::now();
    let rig = start_rig(&t.url, false).await;
    let user = "d65-user-5f1c9e";
    let host = desktop_host(&rig, user).await;
    rig.apply(true, 100).await;
    let enabled_at = Instant::now();

    // The worker dispatches, A commits and closes the control 4503 for the host to re-resolve.
    wait_until("the control closed", Duration::from_secs(30), || async {
        host.seen.lock().unwrap().closed.is_some()
    })
    .await;
    let closed = host.seen.lock().unwrap().closed.clone().unwrap();
    assert_eq!(closed, (4503, "resolve configured director".to_string()));
    let moved_after = enabled_at.elapsed();
    let (st, g) = assign_with(&rig, &host.token, &host.id.relay_host_id, None).await;
    assert_eq!(st, 200, "{g}");
    assert_eq!(
        (
            g["cellUrl"].as_str().unwrap(),
            g["assignmentEpoch"].as_i64()
        ),
        (rig.c_url.as_str(), Some(host.epoch + 1))
    );
    let w = rig.whereabouts(&host.id).await;
    assert_eq!(w["cellId"], "C");
    assert_eq!(w["openMigration"]["kind"], "idle-rehome", "{w}");

    // The director logged the commit and a summary stopped by it.
    let committed = rig.events("orca_relay_idle_rehome_committed");
    assert_eq!(committed.len(), 1, "{committed:?}");
    assert_eq!(
        (&committed[0]["sourceCellId"], &committed[0]["targetCellId"]),
        (&json!("A"), &json!("C"))
    );
    let summaries = rig.events("orca_relay_idle_rehome_dispatch_summary");
    assert!(
        summaries.iter().any(|s| s["stoppedBy"] == "committed"
            && s["dispatched"] == 1
            && s["candidates"] == 1
            && s["outcomes"]["committed"] == 1),
        "{summaries:?}"
    );
    // The attempt row, and the outcomes that count it.
    let rows =
        t.db.query(
            "SELECT attempt_id, source_cell_id, target_cell_id, previous_epoch, assignment_epoch \
             FROM relay_region_rehome_attempts",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].str(0), committed[0]["attemptId"].as_str().unwrap());
    assert_eq!(
        (
            rows[0].str(1),
            rows[0].str(2),
            rows[0].i64(3),
            rows[0].i64(4)
        ),
        ("A".to_string(), "C".to_string(), host.epoch, host.epoch + 1)
    );
    let answer = rig.control(json!({"v":1,"action":"inspect"})).await;
    let outcomes = &answer["outcomes"];
    assert_eq!(outcomes["attempts"]["committed"], 1, "{outcomes}");
    assert!(
        outcomes["migrations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["sourceCellId"] == "A" && m["targetCellId"] == "C" && m["count"] == 1),
        "{outcomes}"
    );
    assert_eq!(answer["control"]["consecutiveFailures"], 0);
    // No identity anywhere.
    let text = outcomes.to_string();
    for secret in [user, host.id.relay_host_id.as_str()] {
        assert!(!text.contains(secret), "outcomes hold an identity");
        let leaks: Vec<String> = rig
            .all_lines()
            .into_iter()
            .filter(|l| l.contains(secret))
            .collect();
        assert!(leaks.is_empty(), "log lines hold an identity: {leaks:?}");
    }
    host.task.abort();
    println!(
        "d65: moved {:.1} s after enabling; test wall {:.1} s",
        moved_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// D-66: with the control disabled, and then enabled with cohort 0, the host stays; the summaries
/// show `dispatched:0` and `stoppedBy` `control-closed`, then `cohort-zero`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d66_closed_control_or_cohort_zero_moves_nothing() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipped: ORCA_RELAY_TEST_POSTGRES_URL not set");
        return;
    };
    let started = Instant::now();
    let rig = start_rig(&t.url, false).await;
    let host = desktop_host(&rig, "d66-user").await;
    // Disabled (the default row): every summary is control-closed.
    let n = rig.events("orca_relay_idle_rehome_dispatch_summary").len();
    let s = rig.summaries_after(n, 1, Duration::from_secs(20)).await;
    for x in &s {
        assert_eq!(
            (&x["stoppedBy"], &x["dispatched"], &x["candidates"]),
            (&json!("control-closed"), &json!(0), &json!(0)),
            "{x}"
        );
    }
    // Enabled with cohort 0.
    rig.apply(true, 0).await;
    let n = rig.events("orca_relay_idle_rehome_dispatch_summary").len();
    let s = rig.summaries_after(n, 2, Duration::from_secs(25)).await;
    // The first may have been read before the apply; the last is after it.
    let last: &Value = s.last().unwrap();
    assert_eq!(
        (&last["stoppedBy"], &last["dispatched"]),
        (&json!("cohort-zero"), &json!(0)),
        "{s:?}"
    );
    assert!(s.iter().all(|x| x["dispatched"] == 0), "{s:?}");
    // Nothing was dispatched or moved.
    assert!(rig.events("orca_relay_idle_rehome_committed").is_empty());
    assert!(host.seen.lock().unwrap().closed.is_none(), "control intact");
    let w = rig.whereabouts(&host.id).await;
    assert_eq!(
        (&w["cellId"], &w["assignmentEpoch"]),
        (&json!("A"), &json!(host.epoch))
    );
    let rows =
        t.db.query("SELECT COUNT(*) FROM relay_region_rehome_attempts", &[])
            .await
            .unwrap();
    assert_eq!(rows[0].i64(0), 0);
    host.task.abort();
    println!("d66: test wall {:.1} s", started.elapsed().as_secs_f64());
}

/// D-67: a dispatch that times out (the proxy never answers) counts no failure; then the source
/// answers 500: three dispatches disable the control with `disabledReason:"failure-budget"` and
/// `pausedUntil` ≈ now + 5 min, and the host stays where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d67_three_failed_dispatches_spend_the_failure_budget() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipped: ORCA_RELAY_TEST_POSTGRES_URL not set");
        return;
    };
    let started = Instant::now();
    let rig = start_rig(&t.url, true).await;
    let proxy = rig.proxy.as_ref().unwrap();
    let host = desktop_host(&rig, "d67-user").await;

    // A timeout: ambiguous, logged, no failure counted.
    proxy.set(Fault::Blackhole);
    rig.apply(true, 100).await;
    wait_until("a timed-out dispatch", Duration::from_secs(30), || async {
        rig.events("orca_relay_idle_rehome_request_failed")
            .iter()
            .any(|e| e["error"] == "timeout")
    })
    .await;
    let failed = rig.events("orca_relay_idle_rehome_request_failed");
    assert_eq!(failed[0]["sourceCellId"], "A");
    assert!(failed[0]["attemptId"].is_string());
    let c = rig.control(json!({"v":1,"action":"inspect"})).await["control"].clone();
    assert_eq!(
        (&c["enabled"], &c["consecutiveFailures"]),
        (&json!(true), &json!(0)),
        "{c}"
    );

    // Now 500s: three counted failures spend the budget.
    proxy.set(Fault::Fail500);
    wait_until(
        "the failure budget spent",
        Duration::from_secs(45),
        || async {
            rig.control(json!({"v":1,"action":"inspect"})).await["control"]["disabledReason"]
                == "failure-budget"
        },
    )
    .await;
    let at = now();
    let c = rig.control(json!({"v":1,"action":"inspect"})).await["control"].clone();
    assert_eq!(c["enabled"], false, "{c}");
    assert_eq!(c["consecutiveFailures"], 3, "{c}");
    let paused = c["pausedUntil"].as_i64().unwrap();
    assert!(
        (paused - (at + 300_000)).abs() < 20_000,
        "pausedUntil {paused} ≈ now + 5 min ({at})"
    );
    assert_eq!(proxy.dispatches(Fault::Fail500), 3, "exactly three 500s");
    assert!(proxy.dispatches(Fault::Blackhole) >= 1);
    let budget = rig.events("orca_relay_regional_rehome_failure_budget_disabled");
    assert_eq!(budget.len(), 1, "{budget:?}");
    assert_eq!(budget[0]["consecutiveFailures"], 3);
    assert_eq!(budget[0]["pausedUntil"].as_i64(), Some(paused));
    // Like every automatic disable (docs/reference/http.md), for operators alerting on it.
    let disabled = rig.events("orca_relay_regional_rehome_safety_disabled");
    assert_eq!(disabled.len(), 1, "{disabled:?}");
    assert_eq!(disabled[0]["reason"], "failure-budget");
    assert_eq!(disabled[0]["generation"], c["generation"]);
    let errors: Vec<Value> = rig
        .events("orca_relay_idle_rehome_request_failed")
        .into_iter()
        .map(|e| e["error"].clone())
        .collect();
    assert_eq!(
        errors.iter().filter(|e| **e == "http_500").count(),
        3,
        "{errors:?}"
    );
    // The following summaries are stopped by the closed control; the host never moved.
    let n = rig.events("orca_relay_idle_rehome_dispatch_summary").len();
    let s = rig.summaries_after(n, 1, Duration::from_secs(20)).await;
    assert_eq!(s[0]["stoppedBy"], "control-closed", "{s:?}");
    assert!(host.seen.lock().unwrap().closed.is_none(), "control intact");
    let w = rig.whereabouts(&host.id).await;
    assert_eq!(
        (&w["cellId"], &w["assignmentEpoch"]),
        (&json!("A"), &json!(host.epoch))
    );
    host.task.abort();
    println!("d67: test wall {:.1} s", started.elapsed().as_secs_f64());
}
