//! The seed change and its residual refusals (docs/deploy/cluster.md): D-32..D-52, for hinted
//! `/v1/assign` and `/v1/resolve`, on SQLite and Postgres. "46 s silent" ages the runtime row with
//! SQL instead of sleeping.

mod support;

use orca_relay::store::testing::backends;
use serde_json::{json, Value};
use support::director::*;

/// Fixture R: A, B, C capped and live; B and C report 300 so H lands on A at epoch 1. A's
/// process is (IA1, T0). Returns the host, its resume token, IA1 and T0.
struct R {
    d: Dir,
    h: Host,
    rt: String,
    ia1: String,
    t0: i64,
}

async fn fixture(t: &orca_relay::store::testing::TestDb, capped_a: bool) -> R {
    let d = start(t, &[]).await;
    d.fast_lanes();
    d.register("A", US, capped_a).await;
    d.register("B", US, true).await;
    d.register("C", ASIA, true).await;
    let ia1 = uuid();
    let t0 = now() - 3_600_000;
    d.hb("A", US, true, &ia1, t0, capped_a).await;
    d.hb_obs("B", US, true, &uuid(), 100, true, 300).await;
    d.hb_obs("C", ASIA, true, &uuid(), 100, true, 300).await;
    let h = d.host("U").await;
    let r = d.assign(&h, json!({})).await;
    assert_eq!(r.body["cellUrl"], json!(cell_url("A")));
    assert_eq!(r.body["assignmentEpoch"], json!(1));
    let rt = d.resume_token(&h).await;
    R { d, h, rt, ia1, t0 }
}

/// The operator isolates A; returns the stamp S.
async fn isolate(d: &Dir, cell: &str) -> i64 {
    let r = d
        .admin(
            "cell-state",
            json!({"v":1,"cellId":cell,"state":"migration-only","rollIsolated":true}),
        )
        .await;
    r.body["cell"]["rollIsolatedAt"].as_i64().unwrap()
}

#[derive(Clone, Copy, PartialEq)]
enum Route {
    Assign,
    Resolve,
}

async fn ask(r: &R, route: Route) -> Resp {
    match route {
        Route::Assign => r.d.assign(&r.h, json!({"reconnect":true})).await,
        Route::Resolve => r.d.resolve(&r.h, &r.rt).await,
    }
}

fn granted(resp: &Resp, cell: &str, epoch: i64) {
    assert_eq!(resp.status, 200, "{:?}", resp.body);
    assert_eq!(resp.body["cellUrl"], json!(cell_url(cell)));
    assert_eq!(resp.body["assignmentEpoch"], json!(epoch));
}

/// A refusal: 503 `relay_home_cell_unavailable`, no Retry-After, epoch unchanged, and the exact
/// rejection line.
async fn refused(r: &R, route: Route, resp: &Resp, lane: &str, cause: Option<&str>) {
    assert_eq!(
        (resp.status, resp.error()),
        (503, "relay_home_cell_unavailable"),
        "{:?}",
        resp.body
    );
    assert_eq!(resp.retry_after, None);
    assert_eq!(r.d.whereabouts(&r.h).await["assignmentEpoch"], json!(1));
    let prefix = match route {
        Route::Assign => format!("route=assign lane={lane} hinted=true"),
        Route::Resolve => "route=resolve lane=none hinted=false".to_string(),
    };
    let mut line = format!(
        "[orca-relay] assignment rejected {prefix} reason=relay_home_cell_unavailable host={}",
        r.h.digest()
    );
    if let Some(c) = cause {
        line.push_str(&format!(" cause={c} cell=A"));
    }
    assert!(
        !lines_with(&[&line]).is_empty(),
        "missing `{line}` in {:?}",
        lines_with(&[&r.h.digest()])
    );
}

async fn new_process(d: &Dir, s: i64, capped: bool) -> String {
    let ia2 = uuid();
    d.hb("A", US, false, &ia2, s + 1, capped).await;
    ia2
}

// D-32 / D-33
async fn moves_off_roll_replaced(route: Route) {
    for t in backends().await {
        let r = fixture(&t, true).await;
        let s = isolate(&r.d, "A").await;
        new_process(&r.d, s, true).await;
        let resp = ask(&r, route).await;
        granted(&resp, "B", 2);
        if route == Route::Assign {
            let g = format!(
                "[orca-relay] assignment granted lane=placement hinted=true host={} cell=B",
                r.h.digest()
            );
            assert_eq!(lines_with(&[&g]).len(), 1);
        }
        assert!(logs().iter().any(
            |l| l.contains("orca_relay_sticky_replaced_off_isolated_cell")
                && l.contains("\"sourceLive\":false")
                && l.contains("\"toCellId\":\"B\"")
        ));
        // Leases kept: A's pending control stays where it is.
        let w = r.d.whereabouts(&r.h).await;
        assert!(w["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["cellId"] == json!("A")));
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d32_assign_moves_off_roll_replaced_cell() {
    moves_off_roll_replaced(Route::Assign).await
}

#[tokio::test]
async fn d33_resolve_moves_off_roll_replaced_cell() {
    moves_off_roll_replaced(Route::Resolve).await
}

// D-34 / D-35
async fn pre_isolation_incarnation(route: Route) {
    for t in backends().await {
        let r = fixture(&t, true).await;
        isolate(&r.d, "A").await;
        r.d.hb("A", US, false, &r.ia1, r.t0, true).await;
        let resp = ask(&r, route).await;
        refused(&r, route, &resp, "placement", Some("not_ready")).await;
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d34_assign_refused_pre_isolation_incarnation() {
    pre_isolation_incarnation(Route::Assign).await
}

#[tokio::test]
async fn d35_resolve_refused_pre_isolation_incarnation() {
    pre_isolation_incarnation(Route::Resolve).await
}

// D-36 / D-37
async fn reported_connections(route: Route) {
    for t in backends().await {
        let r = fixture(&t, true).await;
        let s = isolate(&r.d, "A").await;
        let b =
            r.d.hb_body("A", US, false, &uuid(), s + 1, 0, Some((1, 0, 1)));
        assert_eq!(r.d.send_hb(&b).await.status, 200);
        let resp = ask(&r, route).await;
        refused(&r, route, &resp, "placement", Some("not_ready")).await;
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d36_assign_refused_with_reported_connections() {
    reported_connections(Route::Assign).await
}

#[tokio::test]
async fn d37_resolve_refused_with_reported_connections() {
    reported_connections(Route::Resolve).await
}

// D-38 / D-39
async fn new_process_unheard(route: Route) {
    for t in backends().await {
        let r = fixture(&t, true).await;
        let s = isolate(&r.d, "A").await;
        new_process(&r.d, s, true).await;
        r.d.age_runtime("A", 46_000).await; // then 46 s silent
        let resp = ask(&r, route).await;
        refused(&r, route, &resp, "placement", Some("unheard")).await;
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d38_assign_refused_new_process_unheard() {
    new_process_unheard(Route::Assign).await
}

#[tokio::test]
async fn d39_resolve_refused_new_process_unheard() {
    new_process_unheard(Route::Resolve).await
}

// D-40 / D-41
async fn stale_stamp(route: Route) {
    for t in backends().await {
        let r = fixture(&t, true).await;
        r.d.admin("cell-state", json!({"v":1,"cellId":"A","state":"general"}))
            .await;
        let old = now() - 7_200_000 - 60_000;
        let resp = r
            .d
            .admin("cell-state", json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true,"rollIsolatedAt":old}))
            .await;
        assert_eq!(resp.body["cell"]["rollIsolatedAt"], json!(old));
        assert_eq!(resp.body["cell"]["rollIsolated"], json!(false));
        r.d.hb("A", US, false, &uuid(), now(), true).await;
        let resp = ask(&r, route).await;
        refused(&r, route, &resp, "sticky", Some("not_ready")).await;
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d40_assign_refused_stale_stamp() {
    stale_stamp(Route::Assign).await
}

#[tokio::test]
async fn d41_resolve_refused_stale_stamp() {
    stale_stamp(Route::Resolve).await
}

// D-42 / D-43
async fn ordinary_dip(route: Route) {
    for t in backends().await {
        let r = fixture(&t, true).await;
        r.d.hb("A", US, false, &r.ia1, r.t0, true).await;
        let resp = ask(&r, route).await;
        refused(&r, route, &resp, "sticky", Some("not_ready")).await;
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d42_assign_refused_ordinary_readiness_dip() {
    ordinary_dip(Route::Assign).await
}

#[tokio::test]
async fn d43_resolve_refused_ordinary_readiness_dip() {
    ordinary_dip(Route::Resolve).await
}

// D-44 / D-45
async fn unstamped_migration_only(route: Route) {
    for t in backends().await {
        let r = fixture(&t, true).await;
        r.d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"migration-only"}),
        )
        .await;
        r.d.hb("A", US, false, &uuid(), now(), true).await;
        let resp = ask(&r, route).await;
        refused(&r, route, &resp, "sticky", Some("not_ready")).await;
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d44_assign_refused_unstamped_migration_only() {
    unstamped_migration_only(Route::Assign).await
}

#[tokio::test]
async fn d45_resolve_refused_unstamped_migration_only() {
    unstamped_migration_only(Route::Resolve).await
}

// D-46 / D-47
async fn unheard_window(route: Route) {
    for t in backends().await {
        let r = fixture(&t, true).await;
        let s = isolate(&r.d, "A").await;
        r.d.hb("A", US, true, &r.ia1, r.t0, true).await;
        r.d.age_runtime("A", 46_000).await; // 46 s of silence
        let resp = ask(&r, route).await;
        refused(&r, route, &resp, "placement", Some("unheard")).await;
        new_process(&r.d, s, true).await;
        granted(&ask(&r, route).await, "B", 2);
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d46_assign_unheard_window_then_moves() {
    unheard_window(Route::Assign).await
}

#[tokio::test]
async fn d47_resolve_unheard_window_then_moves() {
    unheard_window(Route::Resolve).await
}

#[tokio::test]
async fn d48_narrow_path_cross_region() {
    for route in [Route::Assign, Route::Resolve] {
        for t in backends().await {
            let r = fixture(&t, true).await;
            r.d.admin(
                "cell-state",
                json!({"v":1,"cellId":"B","state":"migration-only"}),
            )
            .await;
            let s = isolate(&r.d, "A").await;
            new_process(&r.d, s, true).await;
            granted(&ask(&r, route).await, "C", 2);
            r.d.shutdown().await;
        }
    }
}

#[tokio::test]
async fn d49_all_rows_path_second_isolation() {
    for route in [Route::Assign, Route::Resolve] {
        for t in backends().await {
            let r = fixture(&t, true).await;
            isolate(&r.d, "A").await;
            // H leaves the live isolated A for B, keeping its A lease.
            granted(&r.d.assign(&r.h, json!({})).await, "B", 2);
            let w = r.d.whereabouts(&r.h).await;
            assert!(w["leases"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l["cellId"] == json!("A")));
            // Within 60 s B is isolated and its new process heartbeats not ready.
            let sb = isolate(&r.d, "B").await;
            r.d.hb("B", US, false, &uuid(), sb + 1, true).await;
            granted(&ask(&r, route).await, "C", 3);
            r.d.shutdown().await;
        }
    }
}

#[tokio::test]
async fn d50_cap_added_after_new_process_beat() {
    for t in backends().await {
        let r = fixture(&t, false).await;
        let s = isolate(&r.d, "A").await;
        new_process(&r.d, s, false).await;
        r.d.register("A", US, true).await; // cap 600 added: telemetry nulled
        let resp = ask(&r, Route::Assign).await;
        refused(&r, Route::Assign, &resp, "placement", Some("not_ready")).await;
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d51_uncapped_pre_isolation_dead_cell_path() {
    for t in backends().await {
        let r = fixture(&t, false).await;
        isolate(&r.d, "A").await;
        r.d.hb("A", US, false, &r.ia1, r.t0, false).await;
        granted(&ask(&r, Route::Assign).await, "B", 2);
        let w = r.d.whereabouts(&r.h).await;
        assert!(
            w["leases"]
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["cellId"] != json!("A")),
            "{w}"
        );
        assert_eq!(r.d.cell_status("A").await["reservedRequests"], json!(0));
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d52_old_process_cannot_come_back() {
    for t in backends().await {
        let r = fixture(&t, true).await;
        let s = isolate(&r.d, "A").await;
        new_process(&r.d, s, true).await;
        granted(&ask(&r, Route::Assign).await, "B", 2);
        let b = r.d.hb_body("A", US, true, &r.ia1, r.t0, 0, Some((0, 0, 0)));
        let resp = r.d.send_hb(&b).await;
        assert_eq!((resp.status, resp.error()), (409, "stale_cell_incarnation"));
        let w: Value = r.d.whereabouts(&r.h).await;
        assert_eq!(
            (w["cellId"].clone(), w["assignmentEpoch"].clone()),
            (json!("B"), json!(2))
        );
        granted(&ask(&r, Route::Assign).await, "B", 2);
        r.d.shutdown().await;
    }
}

/// row 14 for D-38/D-39's window: an uncapped new process that went unheard is not
/// roll-replaced (condition 3, freshness), so the host leaves by the dead-cell path with its leases
/// deleted, not by an isolated move that keeps them.
async fn uncapped_new_process_unheard(route: Route) {
    for t in backends().await {
        let r = fixture(&t, false).await;
        let s = isolate(&r.d, "A").await;
        new_process(&r.d, s, false).await;
        r.d.age_runtime("A", 46_000).await;
        granted(&ask(&r, route).await, "B", 2);
        let w = r.d.whereabouts(&r.h).await;
        assert!(
            w["leases"]
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["cellId"] != json!("A")),
            "forced move deletes the A leases: {w}"
        );
        r.d.shutdown().await;
    }
}

#[tokio::test]
async fn d38_uncapped_unheard_new_process_takes_dead_cell_path() {
    uncapped_new_process_unheard(Route::Assign).await
}

#[tokio::test]
async fn d39_uncapped_unheard_new_process_takes_dead_cell_path_resolve() {
    uncapped_new_process_unheard(Route::Resolve).await
}
