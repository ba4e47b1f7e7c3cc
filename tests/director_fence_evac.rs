//! Fences, evacuations and sweeps: D-53..D-60 (ARCHITECTURE.md), on SQLite and Postgres. Time
//! passes by editing timestamps with SQL, then running one sweep pass directly.

mod support;

use orca_relay::director::sweeps;
use orca_relay::store::assignments::{self as sa, ActivateControl, HostKey};
use orca_relay::store::testing::backends;
use serde_json::json;
use support::director::*;

async fn placed(d: &Dir, capped: bool) -> (Host, String) {
    d.register("A", US, capped).await;
    d.register("B", US, capped).await;
    d.register("C", ASIA, capped).await;
    let ia = uuid();
    d.hb_obs("A", US, true, &ia, 100, capped, 0).await;
    d.hb_obs("B", US, true, &uuid(), 100, capped, 300).await;
    d.hb_obs("C", ASIA, true, &uuid(), 100, capped, 300).await;
    let h = d.host("U").await;
    assert_eq!(
        d.assign(&h, json!({})).await.body["cellUrl"],
        json!(cell_url("A"))
    );
    (h, ia)
}

#[tokio::test]
async fn d53_fence_refusals() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, true).await;
        let ia = uuid();
        d.hb("A", US, true, &ia, 100, true).await;
        let f = |inc: &str| json!({"v":1,"cellId":"A","cellIncarnation":inc});
        let r = d.admin("cell-fence", f(&ia)).await;
        assert_eq!((r.status, r.error()), (409, "cell_fence_admission_enabled"));
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"existing-only"}),
        )
        .await;
        let r = d.admin("cell-fence", f(&ia)).await;
        assert_eq!((r.status, r.error()), (409, "cell_fence_runtime_not_stale"));
        let r = d.admin("cell-fence", f(&uuid())).await;
        assert_eq!((r.status, r.error()), (409, "cell_fence_runtime_mismatch"));
        let r = d
            .admin(
                "cell-fence",
                json!({"v":1,"cellId":"Z","cellIncarnation":ia}),
            )
            .await;
        assert_eq!((r.status, r.error()), (404, "cell_not_found"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d54_fence_lets_host_leave() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, ia) = placed(&d, true).await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"existing-only"}),
        )
        .await;
        d.age_runtime("A", 46_000).await; // 46 s silent
        let r = d.assign(&h, json!({})).await;
        assert_eq!((r.status, r.error()), (503, "relay_home_cell_unavailable"));
        assert!(!lines_with(&[&format!("host={} cause=draining cell=A", h.digest())]).is_empty());
        let r = d
            .admin(
                "cell-fence",
                json!({"v":1,"cellId":"A","cellIncarnation":ia}),
            )
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["fence"]["valid"], json!(true));
        assert_eq!(r.body["fence"]["cellIncarnation"], json!(ia));
        let r = d.assign(&h, json!({})).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("B")));
        assert_eq!(r.body["assignmentEpoch"], json!(2));
        let w = d.whereabouts(&h).await;
        assert!(w["leases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["cellId"] != json!("A")));
        assert_eq!(d.cell_status("A").await["reservedRequests"], json!(0));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d55_any_heartbeat_deletes_the_fence() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (_h, ia) = placed(&d, true).await;
        let h2 = d.host("U2").await;
        // h2 also on A (A is least loaded).
        assert_eq!(
            d.assign(&h2, json!({})).await.body["cellUrl"],
            json!(cell_url("A"))
        );
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"existing-only"}),
        )
        .await;
        d.age_runtime("A", 46_000).await;
        let r = d
            .admin(
                "cell-fence",
                json!({"v":1,"cellId":"A","cellIncarnation":ia}),
            )
            .await;
        assert_eq!(r.status, 200);
        assert!(d.cell_status("A").await["fence"].is_object());
        // A stale incarnation's beat is refused, and still deletes the fence.
        let b = d.hb_body("A", US, true, &uuid(), 50, 0, Some((0, 0, 0)));
        let r = d.send_hb(&b).await;
        assert_eq!((r.status, r.error()), (409, "stale_cell_incarnation"));
        assert_eq!(d.cell_status("A").await["fence"], json!(null));
        let r = d.assign(&h2, json!({})).await;
        assert_eq!((r.status, r.error()), (503, "relay_home_cell_unavailable"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d56_evacuate() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, _) = placed(&d, true).await;
        let body = json!({"v":1,"userId":h.user,"relayHostId":h.id,"targetCellId":"B"});
        let r = d.admin("evacuate", body.clone()).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let m = &r.body["migration"];
        assert_eq!(m["kind"], json!("evacuation"));
        assert_eq!(
            (m["sourceCellId"].clone(), m["targetCellId"].clone()),
            (json!("A"), json!("B"))
        );
        assert_eq!(m["assignmentEpoch"], json!(2));
        assert_eq!(m["sourceRequestUnits"], json!(1));
        assert_eq!(m["targetReservedUnits"], json!(2));
        let g = d.assign(&h, json!({})).await;
        assert_eq!(g.body["cellUrl"], json!(cell_url("B")));
        assert_eq!(g.body["assignmentEpoch"], json!(2));
        let again = d.admin("evacuate", body).await;
        assert_eq!(again.body["migration"], r.body["migration"]);
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d57_evacuate_refusals() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, _) = placed(&d, true).await;
        d.register("D", US, true).await; // never heard: not live
        let ev =
            |target: &str| json!({"v":1,"userId":h.user,"relayHostId":h.id,"targetCellId":target});
        let r = d.admin("evacuate", ev("A")).await;
        assert_eq!((r.status, r.error()), (409, "target_matches_source"));
        let r = d.admin("evacuate", ev("D")).await;
        assert_eq!((r.status, r.error()), (409, "target_cell_unavailable"));
        let r = d.admin("evacuate", ev("Z")).await;
        assert_eq!((r.status, r.error()), (404, "cell_not_found"));
        assert_eq!(d.admin("evacuate", ev("B")).await.status, 200);
        let r = d.admin("evacuate", ev("C")).await;
        assert_eq!((r.status, r.error()), (409, "migration_in_progress"));
        let r = d
            .admin(
                "evacuate",
                json!({"v":1,"userId":"nobody","relayHostId":h.id,"targetCellId":"B"}),
            )
            .await;
        assert_eq!((r.status, r.error()), (409, "assignment_not_found"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d58_complete_needs_registration_then_completes() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, _) = placed(&d, false).await;
        let r = d
            .admin(
                "evacuate",
                json!({"v":1,"userId":h.user,"relayHostId":h.id,"targetCellId":"B"}),
            )
            .await;
        assert_eq!(r.status, 200);
        let done = json!({"v":1,"userId":h.user,"relayHostId":h.id,"assignmentEpoch":2});
        let r = d.admin("migration-complete", done.clone()).await;
        assert_eq!(
            (r.status, r.error()),
            (409, "migration_target_not_registered")
        );
        // The host attaches on B: activation, registration; its A lease is still there.
        let key = HostKey {
            user_id: h.user.clone(),
            relay_host_id: h.id.clone(),
        };
        let b_inc = d.cell_status("B").await["runtime"]["cellIncarnation"]
            .as_str()
            .unwrap()
            .to_string();
        sa::activate_control(
            &d.db,
            &key,
            &ActivateControl {
                cell_id: "B".into(),
                assignment_epoch: 2,
                generation: 1,
                connection_inclusion_watermark: None,
                idle_regional_rehome: false,
                cell_incarnation: b_inc,
            },
            now(),
        )
        .await
        .unwrap();
        sa::mark_migration_target_registered(&d.db, &key, "B", 2, now())
            .await
            .unwrap();
        let r = d.admin("migration-complete", done.clone()).await;
        assert_eq!(
            (r.status, r.error()),
            (409, "migration_source_still_active")
        );
        sa::release_activity(&d.db, &key, "control-pending:1", now())
            .await
            .unwrap();
        let r = d.admin("migration-complete", done.clone()).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert!(r.body["migration"]["completedAt"].is_i64());
        let r = d.admin("migration-complete", done).await;
        assert_eq!((r.status, r.error()), (409, "migration_not_found"));
        let w = d.whereabouts(&h).await;
        assert_eq!(w["counters"]["migrations"], json!(0));
        assert_eq!(w["openMigration"], json!(null));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d59_evacuate_cell_limit() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (_h, _) = placed(&d, true).await;
        for u in ["U2", "U3"] {
            let h = d.host(u).await;
            assert_eq!(
                d.assign(&h, json!({})).await.body["cellUrl"],
                json!(cell_url("A"))
            );
        }
        let r = d
            .admin("evacuate-cell", json!({"v":1,"sourceCellId":"A","limit":2}))
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(
            (r.body["started"].clone(), r.body["remaining"].clone()),
            (json!(2), json!(1))
        );
        let r = d
            .admin(
                "evacuate-cell",
                json!({"v":1,"sourceCellId":"A","targetCellId":"A","limit":2}),
            )
            .await;
        assert_eq!((r.status, r.error()), (409, "target_matches_source"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d60_unregistered_evacuation_rolls_back() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, _) = placed(&d, true).await;
        let r = d
            .admin(
                "evacuate",
                json!({"v":1,"userId":h.user,"relayHostId":h.id,"targetCellId":"B"}),
            )
            .await;
        assert_eq!(r.status, 200);
        // 15 minutes pass (arrival deadline moved into the past), then one sweep.
        d.db.execute(
            "UPDATE relay_assignment_migrations SET arrival_deadline = arrival_deadline - 900001",
            &[],
        )
        .await
        .unwrap();
        sweeps::run_once(d.director()).await;
        let w = d.whereabouts(&h).await;
        assert_eq!(
            (w["cellId"].clone(), w["assignmentEpoch"].clone()),
            (json!("A"), json!(3))
        );
        let m =
            d.db.query("SELECT abort_reason FROM relay_assignment_migrations", &[])
                .await
                .unwrap();
        assert_eq!(m[0].str(0), "target_not_registered");
        assert!(logs()
            .iter()
            .any(|l| l.contains("orca_relay_migration_rolled_back")
                && l.contains("target_not_registered")));
        assert_eq!(d.cell_status("B").await["reservedRequests"], json!(0));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn sweeps_release_expired_leases_and_evacuate_dead_uncapped_cells() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, ia) = placed(&d, false).await;
        // The pending control expires.
        d.db.execute(
            "UPDATE relay_assignment_activity_leases SET expires_at = 1",
            &[],
        )
        .await
        .unwrap();
        sweeps::run_once(d.director()).await;
        let w = d.whereabouts(&h).await;
        assert_eq!(w["leases"], json!([]));
        assert_eq!(d.cell_status("A").await["reservedRequests"], json!(0));
        // A dies (uncapped, no open migration): the sweep moves H off it.
        d.hb("A", US, false, &ia, 100, false).await;
        sweeps::run_once(d.director()).await;
        let w = d.whereabouts(&h).await;
        assert_eq!(w["cellId"], json!("B"));
        assert!(logs().iter().any(
            |l| l.contains("orca_relay_dead_cell_evacuation") && l.contains("\"cellId\":\"A\"")
        ));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn sweep_credential_cleanup() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, _) = placed(&d, false).await;
        let key = HostKey {
            user_id: h.user.clone(),
            relay_host_id: h.id.clone(),
        };
        sa::acquire_activity(
            &d.db,
            &key,
            "invite-offer:r1",
            sa::ActivityKind::Invite,
            "A",
            None,
            now(),
        )
        .await
        .unwrap();
        let n = now();
        let ins = "INSERT INTO relay_invites (token_hash, user_id, relay_host_id, relay_device_id, state, attempt_count, \
                   max_attempts, expires_at, reservation_id, reservation_expires_at, offer_req_id, created_at, updated_at) \
                   VALUES ($1, $2, $3, 'dev', $4, 0, 5, $5, NULL, $6, $7, $8, $8)";
        d.db.execute(
            ins,
            &[
                "h1".into(),
                h.user.clone().into(),
                h.id.clone().into(),
                "available".into(),
                (n - 1).into(),
                orca_relay::store::Value::Null,
                "r1".into(),
                n.into(),
            ],
        )
        .await
        .unwrap();
        d.db.execute(
            ins,
            &[
                "h2".into(),
                h.user.clone().into(),
                h.id.clone().into(),
                "reserved".into(),
                (n + 100_000).into(),
                (n - 1).into(),
                orca_relay::store::Value::Null,
                n.into(),
            ],
        )
        .await
        .unwrap();
        d.db.execute(
            "INSERT INTO relay_rate_windows (scope, kind, window_start, count) VALUES ('account:u', 'invite-mint', 0, 1)",
            &[],
        )
        .await
        .unwrap();
        sweeps::run_once(d.director()).await;
        let st =
            d.db.query(
                "SELECT token_hash, state FROM relay_invites ORDER BY token_hash",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(
            (st[0].str(1), st[1].str(1)),
            ("expired".to_string(), "cooldown".to_string())
        );
        let w = d.whereabouts(&h).await;
        assert!(w["leases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["activityId"] != json!("invite-offer:r1")));
        assert!(d
            .db
            .query("SELECT scope FROM relay_rate_windows", &[])
            .await
            .unwrap()
            .is_empty());
        d.shutdown().await;
    }
}

#[tokio::test]
async fn operator_route_errors() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, _) = placed(&d, false).await;
        for path in [
            "cells",
            "cell-state",
            "cell-fence",
            "cell-status",
            "evacuate",
            "evacuate-cell",
            "migration-complete",
            "host-whereabouts",
        ] {
            let r = d
                .post(&format!("/v1/admin/{path}"), None, &json!({"v":1}))
                .await;
            assert_eq!((r.status, r.error()), (401, "invalid_token"), "{path}");
            let r = d
                .post(
                    &format!("/v1/admin/{path}"),
                    Some("wrong-token-0123456789abcdef0123456789"),
                    &json!({"v":1}),
                )
                .await;
            assert_eq!(r.status, 401, "{path}");
            let r = d
                .post_raw(&format!("/v1/admin/{path}"), Some(ADMIN), vec![b' '; 5000])
                .await;
            assert_eq!((r.status, r.error()), (413, "request_too_large"), "{path}");
            let r = d.admin(path, json!({"v":1,"bogus":true})).await;
            assert_eq!((r.status, r.error()), (400, "invalid_request"), "{path}");
        }
        let r = d.admin("cell-status", json!({"v":1,"cellId":"Z"})).await;
        assert_eq!((r.status, r.error()), (404, "cell_not_found"));
        let r = d.admin("cell-status", json!({"v":1})).await;
        let ids: Vec<&str> = r.body["cells"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["cellId"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec!["A", "B", "C"]);
        let r = d
            .admin(
                "host-whereabouts",
                json!({"v":1,"relayHostId":"AAAAAAAAAAAAAAAA"}),
            )
            .await;
        assert_eq!(r.body["assignments"], json!([]));
        assert_eq!(r.body["hostDigest"].as_str().unwrap().len(), 12);
        let w = d
            .admin("host-whereabouts", json!({"v":1,"relayHostId":h.id}))
            .await;
        assert_eq!(w.body["assignments"][0]["home"]["live"], json!(true));
        assert_eq!(w.body["assignments"][0]["counters"]["controls"], json!(1));
        let r = d
            .admin("evacuate-cell", json!({"v":1,"sourceCellId":"A","limit":0}))
            .await;
        assert_eq!(r.status, 400);
        let r = d
            .admin("evacuate-cell", json!({"v":1,"sourceCellId":"Z","limit":1}))
            .await;
        assert_eq!((r.status, r.error()), (404, "cell_not_found"));
        let r = d
            .admin(
                "evacuate-cell",
                json!({"v":1,"sourceCellId":"A","targetCellId":"Z","limit":1}),
            )
            .await;
        assert_eq!((r.status, r.error()), (404, "cell_not_found"));
        let r = d
            .admin("cell-state", json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true,"rollIsolatedAt":now() - 31 * 86_400_000i64}))
            .await;
        assert_eq!(r.status, 400);
        let r = d
            .admin(
                "cell-state",
                json!({"v":1,"cellId":"A","state":"migration-only","rollIsolatedAt":now()}),
            )
            .await;
        assert_eq!(r.status, 400);
        let r = d
            .admin("cells", json!({"v":1,"cellId":"Q","cellUrl":"http://q.example.com","region":US,"capacityRequests":5}))
            .await;
        assert_eq!(r.status, 400, "http outside loopback");
        let r = d
            .admin("cells", json!({"v":1,"cellId":"Q","cellUrl":cell_url("Q"),"region":US,"capacityRequests":5,"connectionHardCap":600,"connectionUnobservedBound":500}))
            .await;
        assert_eq!(r.status, 400, "bound > cap - 101");
        let r = d
            .admin(
                "migration-complete",
                json!({"v":1,"userId":h.user,"relayHostId":h.id,"assignmentEpoch":1}),
            )
            .await;
        assert_eq!((r.status, r.error()), (409, "migration_not_found"));
        // Source not live.
        let ia = d.cell_status("A").await["runtime"]["cellIncarnation"]
            .as_str()
            .unwrap()
            .to_string();
        d.hb("A", US, false, &ia, 100, false).await;
        let r = d
            .admin(
                "evacuate",
                json!({"v":1,"userId":h.user,"relayHostId":h.id,"targetCellId":"B"}),
            )
            .await;
        assert_eq!((r.status, r.error()), (409, "source_cell_unavailable"));
        let r = d
            .admin("evacuate-cell", json!({"v":1,"sourceCellId":"A","limit":1}))
            .await;
        assert_eq!((r.status, r.error()), (409, "source_cell_unavailable"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn overview() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let (h, _) = placed(&d, true).await;
        let r = d
            .http
            .get(format!("{}/v1/admin/overview", d.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        let r = d
            .http
            .get(format!("{}/v1/admin/overview", d.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["cells"].as_array().unwrap().len(), 3);
        assert_eq!(v["cells"][0]["totalConnections"], json!(0));
        assert_eq!(v["assignments"], json!({"total":1,"active":1,"dormant":0}));
        assert_eq!(v["migrations"], json!({"open":0}));
        assert!(!v.to_string().contains(&h.id));
        d.shutdown().await;
    }
}
