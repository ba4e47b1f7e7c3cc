//! Director acceptance scenarios D-01..D-31 (ARCHITECTURE.md) over HTTP, on SQLite and Postgres.

mod support;

use orca_relay::store::testing::backends;
use serde_json::json;
use support::director::*;

// ---------------------------------------------------------------------------------------------
// Heartbeats, liveness, regions

#[tokio::test]
async fn d01_heartbeat_identity_refusals() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        let inc = uuid();
        let b = d.hb_body("A", US, true, &inc, 100, 0, None);
        let r = d.send_hb(&b).await;
        assert_eq!((r.status, r.error()), (409, "cell_not_found"));
        d.register("A", US, false).await;
        let mut b2 = b.clone();
        b2["cellUrl"] = json!("https://other.cells.test");
        let r = d.send_hb(&b2).await;
        assert_eq!((r.status, r.error()), (409, "cell_origin_mismatch"));
        let mut b3 = b.clone();
        b3["region"] = json!(ASIA);
        let r = d.send_hb(&b3).await;
        assert_eq!((r.status, r.error()), (409, "cell_region_mismatch"));
        assert_eq!(d.send_hb(&b).await.status, 200);
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d02_heartbeat_tokens() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, false).await;
        let b = d.hb_body("A", US, true, &uuid(), 100, 0, None);
        let r = d.post("/v1/admin/cell-heartbeat", None, &b).await;
        assert_eq!((r.status, r.error()), (401, "invalid_token"));
        let r = d.post("/v1/admin/cell-heartbeat", Some(ADMIN), &b).await;
        assert_eq!((r.status, r.error()), (401, "invalid_token"));
        let tok = orca_relay::crypto::jwt::mint_cluster_token(CLUSTER.as_bytes(), "B", now());
        let r = d.post("/v1/admin/cell-heartbeat", Some(&tok), &b).await;
        assert_eq!((r.status, r.error()), (403, "cell_identity_mismatch"));
        // The cluster token does not open operator routes.
        let tok = orca_relay::crypto::jwt::mint_cluster_token(CLUSTER.as_bytes(), "A", now());
        let r = d
            .post("/v1/admin/cell-status", Some(&tok), &json!({"v":1}))
            .await;
        assert_eq!((r.status, r.error()), (401, "invalid_token"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d03_telemetry_validation() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, true).await;
        let inc = uuid();
        let mut b = d.hb_body("A", US, true, &inc, 100, 0, Some((1, 0, 1)));
        b["enforcedConnectionUnits"] = json!(2);
        let r = d.send_hb(&b).await;
        assert_eq!((r.status, r.error()), (400, "invalid_request"));
        assert!(!lines_with(&[
            "[orca-relay] cell heartbeat invalid: connection telemetry sum does not match"
        ])
        .is_empty());
        let mut b = d.hb_body("A", US, true, &inc, 100, 0, Some((0, 0, 0)));
        b.as_object_mut()
            .unwrap()
            .remove("connectionInclusionWatermark");
        let r = d.send_hb(&b).await;
        assert_eq!(r.status, 400);
        assert!(!lines_with(&[
            "[orca-relay] cell heartbeat invalid: connection telemetry must be complete"
        ])
        .is_empty());
        let mut b = d.hb_body("A", US, true, &inc, 100, 0, Some((0, 0, 0)));
        b["connectionUnobservedBound"] = json!(500);
        let r = d.send_hb(&b).await;
        assert_eq!(r.status, 400);
        assert!(!lines_with(&["[orca-relay] cell heartbeat invalid: connection unobserved bound must leave ordinary admission capacity"]).is_empty());
        // Unknown field and oversize body.
        let mut b = d.hb_body("A", US, true, &inc, 100, 0, Some((0, 0, 0)));
        b["extra"] = json!(1);
        assert_eq!(d.send_hb(&b).await.status, 400);
        let tok = orca_relay::crypto::jwt::mint_cluster_token(CLUSTER.as_bytes(), "A", now());
        let r = d
            .post_raw("/v1/admin/cell-heartbeat", Some(&tok), vec![b' '; 5000])
            .await;
        assert_eq!((r.status, r.error()), (413, "request_too_large"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d04_telemetry_against_cell_configuration() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, true).await;
        d.register("U", US, false).await;
        let inc = uuid();
        let r = d
            .send_hb(&d.hb_body("A", US, true, &inc, 100, 0, None))
            .await;
        assert_eq!(
            (r.status, r.error()),
            (409, "cell_connection_telemetry_mismatch")
        );
        let mut b = d.hb_body("A", US, true, &inc, 100, 0, Some((0, 0, 0)));
        b["connectionHardCap"] = json!(1000);
        let r = d.send_hb(&b).await;
        assert_eq!(
            (r.status, r.error()),
            (409, "cell_connection_telemetry_mismatch")
        );
        let r = d
            .send_hb(&d.hb_body("U", US, true, &inc, 100, 0, Some((0, 0, 0))))
            .await;
        assert_eq!(
            (r.status, r.error()),
            (409, "cell_connection_limit_not_configured")
        );
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d05_incarnations() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, false).await;
        let (i1, i2) = (uuid(), uuid());
        let send = |inc: &str, s: i64| d.hb_body("A", US, true, inc, s, 0, None);
        assert_eq!(d.send_hb(&send(&i1, 100)).await.status, 200);
        let r = d.send_hb(&send(&i1, 101)).await;
        assert_eq!((r.status, r.error()), (409, "stale_cell_incarnation"));
        let r = d.send_hb(&send(&i2, 100)).await;
        assert_eq!((r.status, r.error()), (409, "stale_cell_incarnation"));
        assert_eq!(d.send_hb(&send(&i2.to_uppercase(), 200)).await.status, 200);
        assert_eq!(
            d.cell_status("A").await["runtime"]["cellIncarnation"],
            json!(i2)
        );
        assert_eq!(d.send_hb(&send(&i1, 100)).await.status, 409);
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d06_connection_snapshots() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, true).await;
        let i1 = uuid();
        let mut b = d.hb_body("A", US, true, &i1, 100, 0, Some((0, 0, 0)));
        b["connectionInclusionWatermark"] = json!(5);
        assert_eq!(d.send_hb(&b).await.status, 200);
        let r = d.send_hb(&b).await;
        assert_eq!((r.status, r.error()), (409, "stale_connection_snapshot"));
        let mut b = d.hb_body("A", US, true, &uuid(), 200, 0, Some((0, 0, 0)));
        b["connectionInclusionWatermark"] = json!(0);
        assert_eq!(d.send_hb(&b).await.status, 200);
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d07_liveness_causes() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, false).await;
        let s = d.cell_status("A").await;
        assert_eq!(
            (s["live"].clone(), s["cause"].clone()),
            (json!(false), json!("booting"))
        );
        let inc = uuid();
        d.hb("A", US, false, &inc, 100, false).await;
        assert_eq!(d.cell_status("A").await["cause"], json!("not_ready"));
        d.hb("A", US, true, &inc, 100, false).await;
        let s = d.cell_status("A").await;
        assert_eq!(
            (s["live"].clone(), s["cause"].clone()),
            (json!(true), json!(null))
        );
        d.age_runtime("A", 46_000).await; // 46 s silent
        assert_eq!(d.cell_status("A").await["cause"], json!("unheard"));
        let r = d
            .admin(
                "cell-state",
                json!({"v":1,"cellId":"A","state":"existing-only"}),
            )
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(d.cell_status("A").await["cause"], json!("draining"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d08_regions_catalog() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        for (id, region) in [("A", US), ("B", US), ("C", ASIA), ("D", ASIA)] {
            d.register(id, region, false).await;
            d.hb(id, region, true, &uuid(), 100, false).await;
        }
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"D","state":"migration-only"}),
        )
        .await;
        let r = d.get("/v1/regions").await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.body,
            json!({"v":1,"regions":[
                {"region":US,"probeOrigins":[cell_url("A"),cell_url("B")]},
                {"region":ASIA,"probeOrigins":[cell_url("C")]}]})
        );
        let c_inc = d.cell_status("C").await["runtime"]["cellIncarnation"]
            .as_str()
            .unwrap()
            .to_string();
        d.hb("C", ASIA, false, &c_inc, 100, false).await;
        // Cached for 30 s...
        assert_eq!(
            d.get("/v1/regions").await.body["regions"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        // ...and after the 30 s (expired here instead of waited for):
        d.director().expire_regions_cache().await;
        assert_eq!(
            d.get("/v1/regions").await.body,
            json!({"v":1,"regions":[{"region":US,"probeOrigins":[cell_url("A"),cell_url("B")]}]})
        );
        d.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Placement

async fn live_fleet(d: &Dir, capped: bool) {
    for (id, region) in [("A", US), ("B", US), ("C", ASIA)] {
        d.register(id, region, capped).await;
        d.hb(id, region, true, &uuid(), 100, capped).await;
    }
}

#[tokio::test]
async fn d09_d10_first_assign_and_lease() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        live_fleet(&d, false).await;
        let h = d.host("U").await;
        let r = d.assign(&h, json!({})).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["assignmentEpoch"], json!(1));
        assert_eq!(r.body["cellUrl"], json!(cell_url("A")));
        let lease = r.body["lease"].as_str().unwrap();
        let c = orca_relay::crypto::jwt::verify_assignment_lease(SIGNING, lease, now()).unwrap();
        assert_eq!(c.aud, "orca-relay-cell");
        assert_eq!(c.purpose, "cell-assignment");
        assert_eq!(
            (c.cell_id.as_str(), c.cell_url.as_str()),
            ("A", cell_url("A").as_str())
        );
        assert_eq!(
            (c.sub.as_str(), c.relay_host_id.as_str()),
            ("U", h.id.as_str())
        );
        assert_eq!(c.exp - c.iat, 300);
        assert_eq!(c.iss, d.run.ctx.config.public_url);
        // D-10
        let r = d.assign(&h, json!({})).await;
        assert_eq!(
            (r.body["cellUrl"].clone(), r.body["assignmentEpoch"].clone()),
            (json!(cell_url("A")), json!(1))
        );
        let w = d.whereabouts(&h).await;
        assert_eq!(w["leases"].as_array().unwrap().len(), 1);
        assert_eq!(w["leases"][0]["activityId"], json!("control-pending:1"));
        assert_eq!(w["leases"][0]["requestUnits"], json!(1));
        assert_eq!(d.cell_status("A").await["reservedRequests"], json!(1));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d11_least_loaded() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        d.register("A", US, false).await;
        d.register("B", US, false).await;
        d.hb_obs("A", US, true, &uuid(), 100, false, 400).await;
        d.hb_obs("B", US, true, &uuid(), 100, false, 0).await;
        let h = d.host("U").await;
        assert_eq!(
            d.assign(&h, json!({})).await.body["cellUrl"],
            json!(cell_url("B"))
        );
        d.shutdown().await;
    }
    // Equal loads: the lower cell id.
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, false).await;
        d.register("B", US, false).await;
        d.hb("A", US, true, &uuid(), 100, false).await;
        d.hb("B", US, true, &uuid(), 100, false).await;
        let h = d.host("U").await;
        assert_eq!(
            d.assign(&h, json!({})).await.body["cellUrl"],
            json!(cell_url("A"))
        );
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d12_region_preference_and_spill() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        live_fleet(&d, false).await;
        let h = d.host("U").await;
        let r = d.assign(&h, json!({"preferredRegion":ASIA})).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("C")));
        let c_inc = d.cell_status("C").await["runtime"]["cellIncarnation"]
            .as_str()
            .unwrap()
            .to_string();
        d.hb("C", ASIA, false, &c_inc, 100, false).await;
        let h2 = d.host("U2").await;
        let r = d.assign(&h2, json!({"preferredRegion":ASIA})).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("A")));
        let r = d.assign(&h2, json!({"preferredRegion":"eu-west1"})).await;
        assert_eq!((r.status, r.error()), (400, "invalid_request"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d13_no_general_live_cell() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        d.register("A", US, false).await;
        d.register("B", US, false).await;
        d.register("C", ASIA, false).await;
        d.hb("A", US, true, &uuid(), 100, false).await;
        d.hb("B", US, true, &uuid(), 100, false).await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"migration-only"}),
        )
        .await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"B","state":"existing-only"}),
        )
        .await;
        let h = d.host("U").await;
        let r = d.assign(&h, json!({})).await;
        assert_eq!((r.status, r.error()), (503, "relay_capacity_exhausted"));
        assert_eq!(r.retry_after, None);
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d14_capacity() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        d.register_with("A", US, false, 1).await;
        d.hb("A", US, true, &uuid(), 100, false).await;
        let h1 = d.host("U1").await;
        assert_eq!(d.assign(&h1, json!({})).await.status, 200);
        let h2 = d.host("U2").await;
        let r = d.assign(&h2, json!({})).await;
        assert_eq!((r.status, r.error()), (503, "relay_capacity_exhausted"));
        let m = &d.run.ctx.metrics;
        assert_eq!(
            m.assignments
                .with_label_values(&["assign", "granted"])
                .get(),
            1
        );
        assert_eq!(
            m.assignments
                .with_label_values(&["assign", "relay_capacity_exhausted"])
                .get(),
            1
        );
        assert_eq!(
            m.assignment_seconds
                .with_label_values(&["assign"])
                .get_sample_count(),
            2
        );
        assert_eq!(m.heartbeats.with_label_values(&["ok"]).get(), 1);
        assert_eq!(m.cell_live.with_label_values(&["A"]).get(), 1);
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d15_headroom() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        d.register("A", US, true).await;
        let b = d.hb_body("A", US, true, &uuid(), 100, 0, Some((499, 0, 499)));
        assert_eq!(d.send_hb(&b).await.status, 200);
        let h1 = d.host("U1").await;
        assert_eq!(
            d.assign(&h1, json!({})).await.body["cellUrl"],
            json!(cell_url("A"))
        );
        let h2 = d.host("U2").await;
        let r = d.assign(&h2, json!({})).await;
        assert_eq!(
            (r.status, r.error()),
            (503, "relay_connection_headroom_exhausted")
        );
        assert_eq!(r.retry_after, None);
        d.register("B", US, false).await;
        d.hb("B", US, true, &uuid(), 100, false).await;
        assert_eq!(
            d.assign(&h2, json!({})).await.body["cellUrl"],
            json!(cell_url("B"))
        );
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d16_adding_a_cap_removes_headroom_until_next_beat() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        d.register("A", US, false).await;
        d.register("B", US, false).await;
        let ia = uuid();
        d.hb_obs("A", US, true, &ia, 100, false, 0).await;
        d.hb_obs("B", US, true, &uuid(), 100, false, 100).await;
        d.register("A", US, true).await;
        assert_eq!(d.cell_status("A").await["headroom"], json!(false));
        let h = d.host("U").await;
        assert_eq!(
            d.assign(&h, json!({})).await.body["cellUrl"],
            json!(cell_url("B"))
        );
        d.hb("A", US, true, &ia, 100, true).await;
        assert_eq!(d.cell_status("A").await["headroom"], json!(true));
        let h2 = d.host("U2").await;
        assert_eq!(
            d.assign(&h2, json!({})).await.body["cellUrl"],
            json!(cell_url("A"))
        );
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d17_uncapped_dead_home_forced_move() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        d.register("A", US, false).await;
        d.register("B", US, false).await;
        let ia = uuid();
        d.hb("A", US, true, &ia, 100, false).await;
        d.hb_obs("B", US, true, &uuid(), 100, false, 300).await;
        let h = d.host("U").await;
        assert_eq!(
            d.assign(&h, json!({})).await.body["cellUrl"],
            json!(cell_url("A"))
        );
        d.hb("A", US, false, &ia, 100, false).await;
        let r = d.assign(&h, json!({})).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("B")));
        assert_eq!(r.body["assignmentEpoch"], json!(2));
        let w = d.whereabouts(&h).await;
        let leases = w["leases"].as_array().unwrap();
        assert!(
            leases.iter().all(|l| l["cellId"] == json!("B")),
            "{leases:?}"
        );
        assert_eq!(d.cell_status("A").await["reservedRequests"], json!(0));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d18_capped_dead_home_refused() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        d.register("A", US, true).await;
        d.register("B", US, true).await;
        let ia = uuid();
        d.hb("A", US, true, &ia, 100, true).await;
        d.hb_obs("B", US, true, &uuid(), 100, true, 300).await;
        let h = d.host("U").await;
        assert_eq!(
            d.assign(&h, json!({})).await.body["cellUrl"],
            json!(cell_url("A"))
        );
        d.hb("A", US, false, &ia, 100, true).await;
        let r = d.assign(&h, json!({})).await;
        assert_eq!((r.status, r.error()), (503, "relay_home_cell_unavailable"));
        assert_eq!(r.retry_after, None);
        let line = format!(
            "reason=relay_home_cell_unavailable host={} cause=not_ready cell=A",
            h.digest()
        );
        assert!(
            !lines_with(&[&line]).is_empty(),
            "{:?}",
            lines_with(&[&h.digest()])
        );
        d.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Requests, lanes, resolve

#[tokio::test]
async fn d19_request_errors() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        live_fleet(&d, false).await;
        let h = d.host("U").await;
        let r = d
            .post("/v1/assign", None, &json!({"v":1,"relayHostId":h.id}))
            .await;
        assert_eq!((r.status, r.error()), (401, "invalid_token"));
        let r = d
            .post(
                "/v1/assign",
                Some("garbage"),
                &json!({"v":1,"relayHostId":h.id}),
            )
            .await;
        assert_eq!((r.status, r.error()), (401, "invalid_token"));
        let r = d.assign(&h, json!({"unknown":1})).await;
        assert_eq!((r.status, r.error()), (400, "invalid_request"));
        let r = d
            .post_raw("/v1/assign", Some(&h.token), vec![b' '; 5000])
            .await;
        assert_eq!((r.status, r.error()), (413, "request_too_large"));
        let other = d.host("U").await;
        let r = d
            .post(
                "/v1/assign",
                Some(&h.token),
                &json!({"v":1,"relayHostId":other.id}),
            )
            .await;
        assert_eq!((r.status, r.error()), (403, "host_identity_mismatch"));
        let report = json!({"regionCorrection":{"v":1,"action":"report","generation":1,"assignmentEpoch":1,
            "policyVersion":1,"outcome":"inconclusive","reason":"x"}});
        let r = d.assign(&h, report).await;
        assert_eq!((r.status, r.error()), (409, "assignment_not_found"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d20_per_host_interval() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        live_fleet(&d, false).await;
        let h = d.host("U").await;
        assert_eq!(d.assign(&h, json!({})).await.status, 200);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await; // the scenario's 0.2 s
        let r = d.assign(&h, json!({})).await;
        assert_eq!(
            (r.status, r.error()),
            (503, "assignments_temporarily_unavailable")
        );
        assert_eq!(r.retry_after.as_deref(), Some("1"));
        assert!(
            !lines_with(&["lane=placement", "reason=host-rate-limited", &h.digest()]).is_empty()
        );
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d21_placement_lane_bounds() {
    for t in backends().await {
        let d = start(
            &t,
            &[
                "--public-assignment-concurrency",
                "1",
                "--public-assignment-queue-max",
                "1",
                "--public-assignment-wait-ms",
                "50",
            ],
        )
        .await;
        live_fleet(&d, false).await;
        let mut hosts = Vec::new();
        for i in 0..20 {
            hosts.push(d.host(&format!("U{i}")).await);
        }
        let futs = hosts.iter().map(|h| d.assign(h, json!({})));
        let results = futures_util::future::join_all(futs).await;
        let mut refused = 0;
        for r in &results {
            if r.status == 200 {
                let lease = r.body["lease"].as_str().unwrap();
                orca_relay::crypto::jwt::verify_assignment_lease(SIGNING, lease, now()).unwrap();
            } else {
                assert_eq!(
                    (r.status, r.error()),
                    (503, "assignments_temporarily_unavailable")
                );
                assert_eq!(r.retry_after.as_deref(), Some("1"));
                refused += 1;
            }
        }
        assert!(refused > 0);
        let lines = lines_with(&["route=assign lane=placement"]);
        assert!(lines
            .iter()
            .any(|l| l.contains("reason=queue-full") || l.contains("reason=wait-timeout")));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d22_hinted_lanes() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        live_fleet(&d, false).await;
        let h = d.host("U").await;
        assert_eq!(d.assign(&h, json!({"reconnect":true})).await.status, 200);
        let g = format!(
            "[orca-relay] assignment granted lane=placement hinted=true host={} cell=A",
            h.digest()
        );
        assert_eq!(lines_with(&[&g]).len(), 1);
        assert_eq!(d.assign(&h, json!({"reconnect":true})).await.status, 200);
        let g = format!(
            "[orca-relay] assignment granted lane=sticky hinted=true host={} cell=A",
            h.digest()
        );
        assert_eq!(lines_with(&[&g]).len(), 1);
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d23_rejection_rate_limit() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        // The 10 s window, shortened for the test.
        d.director()
            .rejects
            .set_window(std::time::Duration::from_millis(1500));
        d.register_with("A", US, false, 1).await;
        d.hb("A", US, true, &uuid(), 100, false).await;
        let first = d.host("first").await;
        assert_eq!(d.assign(&first, json!({})).await.status, 200);
        let mut hosts = Vec::new();
        for i in 0..6 {
            let h = d.host(&format!("R{i}")).await;
            let r = d.assign(&h, json!({})).await;
            assert_eq!(r.error(), "relay_capacity_exhausted");
            hosts.push(h);
        }
        let mine = |l: &String| hosts.iter().any(|h| l.contains(&h.digest()));
        let rejected: Vec<String> = lines_with(&["assignment rejected route=assign lane=placement hinted=false reason=relay_capacity_exhausted"])
            .into_iter()
            .filter(mine)
            .collect();
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let s: Vec<String> = lines_with(&["reason=relay_capacity_exhausted", " suppressed=5"])
                .into_iter()
                .filter(mine)
                .collect();
            if s.len() == 1 {
                assert!(s[0].ends_with(" suppressed=5"));
                assert!(s[0].contains(&format!("host={}", hosts[5].digest())));
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no suppressed line");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        for h in &hosts {
            assert!(
                logs().iter().all(|l| !l.contains(&h.id)),
                "a log line holds a relayHostId"
            );
        }
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d24_resolve() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        live_fleet(&d, false).await;
        let h = d.host("U").await;
        let g = d.assign(&h, json!({})).await;
        let rt = d.resume_token(&h).await;
        let r = d
            .resolve(&h, &orca_relay::crypto::ident::random_b64u32())
            .await;
        assert_eq!((r.status, r.error()), (401, "invalid_credential"));
        let before = d.whereabouts(&h).await;
        let r = d.resolve(&h, &rt).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["cellUrl"], g.body["cellUrl"]);
        assert_eq!(r.body["assignmentEpoch"], json!(1));
        assert_eq!(r.body["leaseExpiresAt"], before["leaseExpiresAt"]);
        let after = d.whereabouts(&h).await;
        assert_eq!(before, after, "resolve on a live home writes nothing");
        // Schema and size.
        let r = d
            .post("/v1/resolve", None, &json!({"v":1,"relayHostId":h.id}))
            .await;
        assert_eq!(r.status, 400);
        let r = d.post_raw("/v1/resolve", None, vec![b' '; 5000]).await;
        assert_eq!(r.status, 413);
        d.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Admission state, live roll isolation

#[tokio::test]
async fn d25_cell_state_stamps() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, false).await;
        let st = |body: serde_json::Value| d.admin("cell-state", body);
        let r = st(json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true})).await;
        let t1 = r.body["cell"]["rollIsolatedAt"].as_i64().unwrap();
        assert_eq!(r.body["cell"]["rollIsolated"], json!(true));
        let r = st(json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true})).await;
        assert_eq!(r.body["cell"]["rollIsolatedAt"], json!(t1));
        let r = st(json!({"v":1,"cellId":"A","state":"migration-only"})).await;
        assert_eq!(r.body["cell"]["rollIsolatedAt"], json!(t1));
        let r = st(json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":false})).await;
        assert_eq!(r.body["cell"]["rollIsolatedAt"], json!(null));
        st(json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true})).await;
        let r = st(json!({"v":1,"cellId":"A","state":"general"})).await;
        assert_eq!(r.body["cell"]["rollIsolatedAt"], json!(null));
        let r = st(json!({"v":1,"cellId":"A","state":"general","rollIsolated":true})).await;
        assert_eq!((r.status, r.error()), (400, "invalid_request"));
        let r = st(json!({"v":1,"cellId":"Z","state":"general"})).await;
        assert_eq!((r.status, r.error()), (404, "cell_not_found"));
        let r = d
            .post(
                "/v1/admin/cell-state",
                None,
                &json!({"v":1,"cellId":"A","state":"general"}),
            )
            .await;
        assert_eq!((r.status, r.error()), (401, "invalid_token"));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d26_cells_upsert() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        let body = json!({"v":1,"cellId":"A","cellUrl":cell_url("A"),"region":US,"capacityRequests":900,"initialState":"migration-only"});
        let r = d.admin("cells", body.clone()).await;
        assert_eq!(r.body["created"], json!(true));
        assert_eq!(r.body["cell"]["admissionState"], json!("migration-only"));
        let mut upd = body.clone();
        upd["capacityRequests"] = json!(1000);
        upd["initialState"] = json!("general");
        let r = d.admin("cells", upd).await;
        assert_eq!(r.body["created"], json!(false));
        assert_eq!(r.body["cell"]["admissionState"], json!("migration-only"));
        assert_eq!(r.body["cell"]["capacityRequests"], json!(1000));
        let r = d
            .admin("cells", json!({"v":1,"cellId":"B","cellUrl":cell_url("A"),"region":US,"capacityRequests":9}))
            .await;
        assert_eq!((r.status, r.error()), (409, "cell_url_conflict"));
        let r = d
            .admin("cells", json!({"v":1,"cellId":"B","cellUrl":cell_url("B"),"region":US,"capacityRequests":9,"connectionUnobservedBound":0}))
            .await;
        assert_eq!((r.status, r.error()), (400, "invalid_request"));
        d.shutdown().await;
    }
}

/// H placed on live A (capped or not) with B and C loaded so H lands on A.
async fn h_on_a(d: &Dir, capped: bool) -> Host {
    d.register("A", US, capped).await;
    d.register("B", US, capped).await;
    d.register("C", ASIA, capped).await;
    d.hb_obs("A", US, true, &uuid(), 100, capped, 0).await;
    d.hb_obs("B", US, true, &uuid(), 100, capped, 300).await;
    d.hb_obs("C", ASIA, true, &uuid(), 100, capped, 300).await;
    let h = d.host("U").await;
    let r = d.assign(&h, json!({})).await;
    assert_eq!(r.body["cellUrl"], json!(cell_url("A")));
    h
}

#[tokio::test]
async fn d27_live_isolated_move() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let h = h_on_a(&d, true).await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true}),
        )
        .await;
        let r = d.assign(&h, json!({})).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("B")));
        assert_eq!(r.body["assignmentEpoch"], json!(2));
        assert!(logs().iter().any(
            |l| l.contains("orca_relay_sticky_replaced_off_isolated_cell")
                && l.contains("\"fromCellId\":\"A\"")
                && l.contains("\"toCellId\":\"B\"")
                && l.contains("\"sourceLive\":true")
                && l.contains("\"admissionState\":\"migration-only\"")
        ));
        let w = d.whereabouts(&h).await;
        let leases = w["leases"].as_array().unwrap();
        assert!(leases
            .iter()
            .any(|l| l["cellId"] == json!("A") && l["activityId"] == json!("control-pending:1")));
        assert!(leases
            .iter()
            .any(|l| l["cellId"] == json!("B") && l["activityId"] == json!("control-pending:2")));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d28_isolated_move_crosses_region() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let h = h_on_a(&d, true).await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"B","state":"migration-only"}),
        )
        .await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true}),
        )
        .await;
        let r = d.assign(&h, json!({})).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("C")));
        assert_eq!(r.body["assignmentEpoch"], json!(2));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d29_isolated_pin_deferred() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let h = h_on_a(&d, true).await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"B","state":"migration-only"}),
        )
        .await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"C","state":"existing-only"}),
        )
        .await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true}),
        )
        .await;
        let r = d.assign(&h, json!({})).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("A")));
        assert_eq!(r.body["assignmentEpoch"], json!(1));
        assert!(logs()
            .iter()
            .any(|l| l.contains("orca_relay_sticky_replacement_deferred")
                && l.contains("\"reason\":\"no_replacement_headroom\"")
                && l.contains("\"cellId\":\"A\"")));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d30_unstamped_migration_only_keeps_host() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let h = h_on_a(&d, true).await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"migration-only"}),
        )
        .await;
        let r = d.assign(&h, json!({"reconnect":true})).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("A")));
        assert_eq!(r.body["assignmentEpoch"], json!(1));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn d31_resolve_on_live_isolated_home() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        let h = h_on_a(&d, true).await;
        let rt = d.resume_token(&h).await;
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true}),
        )
        .await;
        let r = d.resolve(&h, &rt).await;
        assert_eq!(r.body["cellUrl"], json!(cell_url("A")));
        assert_eq!(r.body["assignmentEpoch"], json!(1));
        d.shutdown().await;
    }
}

/// Transient database failures (ARCHITECTURE.md / docs/reference/http.md): every route answers its retryable 503.
/// Closing the pool makes every later acquire fail, on Postgres (SQLite has no pool to close).
#[tokio::test]
async fn transient_failures_answer_retryable_503() {
    for t in backends().await {
        if t.kind() != orca_relay::store::DbKind::Postgres {
            continue;
        }
        let d = start(&t, &[]).await;
        d.fast_lanes();
        live_fleet(&d, false).await;
        let h = d.host("U").await;
        assert_eq!(d.assign(&h, json!({})).await.status, 200);
        let rt = d.resume_token(&h).await;
        d.db.close();
        let r = d.assign(&h, json!({"reconnect":true})).await;
        assert_eq!(
            (r.status, r.error()),
            (503, "assignments_temporarily_unavailable")
        );
        assert_eq!(r.retry_after.as_deref(), Some("1"));
        assert!(!lines_with(&[
            "route=assign-verify lane=none hinted=true reason=database_unavailable",
            &h.digest()
        ])
        .is_empty());
        let h2 = d.host("U2").await;
        let r = d.assign(&h2, json!({})).await;
        assert_eq!(
            (r.status, r.error(), r.retry_after.as_deref()),
            (503, "assignments_temporarily_unavailable", Some("1"))
        );
        assert!(!lines_with(&[
            "route=assign lane=placement hinted=false reason=database_unavailable",
            &h2.digest()
        ])
        .is_empty());
        let r = d.resolve(&h, &rt).await;
        assert_eq!(
            (r.status, r.error()),
            (503, "assignments_temporarily_unavailable")
        );
        let r = d
            .send_hb(&d.hb_body("A", US, true, &uuid(), 100, 0, None))
            .await;
        assert_eq!(
            (r.status, r.error(), r.retry_after.as_deref()),
            (503, "database_temporarily_unavailable", Some("5"))
        );
        let r = d.admin("cell-status", json!({"v":1})).await;
        assert_eq!(
            (r.status, r.error()),
            (503, "database_temporarily_unavailable")
        );
        d.director().expire_regions_cache().await;
        let r = d.get("/v1/regions").await;
        assert_eq!(
            (r.status, r.error(), r.retry_after.as_deref()),
            (503, "region_catalog_temporarily_unavailable", Some("5"))
        );
        d.shutdown().await;
    }
}
