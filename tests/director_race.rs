//! Cluster correctness under concurrency: 200 concurrent `/v1/assign` for 50 hosts across two
//! directors on one database. Each host ends with exactly one assignment (one cell, epoch 1, every
//! grant naming it), no cell exceeds its capacity, and the invariants hold.

mod support;

use std::collections::HashMap;

use orca_relay::store::testing::backends;
use serde_json::json;
use support::director::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_200_assigns_50_hosts_2_directors() {
    for t in backends().await {
        let lanes = [
            "--public-assignment-concurrency",
            "4",
            "--public-sticky-concurrency",
            "4",
        ];
        let d1 = start(&t, &lanes).await;
        let d2 = start(&t, &lanes).await;
        d1.fast_lanes();
        d2.fast_lanes();
        for (id, region) in [("A", US), ("B", US), ("C", ASIA)] {
            d1.register_with(id, region, true, 20).await;
            d1.hb(id, region, true, &uuid(), 100, true).await;
        }
        let mut hosts = Vec::new();
        for i in 0..50 {
            hosts.push(d1.host(&format!("user-{i}")).await);
        }
        let mut futs = Vec::new();
        for round in 0..4 {
            for (i, h) in hosts.iter().enumerate() {
                let d = if (i + round) % 2 == 0 { &d1 } else { &d2 };
                let hinted = round % 2 == 1;
                futs.push(async move { (i, d.assign(h, json!({"reconnect": hinted})).await) });
            }
        }
        let results = futures_util::future::join_all(futs).await;
        let mut cell_of: HashMap<usize, String> = HashMap::new();
        let mut ok = 0;
        for (i, r) in &results {
            match r.status {
                200 => {
                    ok += 1;
                    assert_eq!(r.body["assignmentEpoch"], json!(1), "no move in this test");
                    let url = r.body["cellUrl"].as_str().unwrap().to_string();
                    let prev = cell_of.entry(*i).or_insert_with(|| url.clone());
                    assert_eq!(prev, &url, "host {i} granted two different cells");
                }
                503 => assert!(
                    ["assignment_row_busy", "assignments_temporarily_unavailable"]
                        .contains(&r.error()),
                    "{:?}",
                    r.body
                ),
                s => panic!("unexpected {s}: {:?}", r.body),
            }
        }
        assert!(ok >= 50, "only {ok} grants");
        let rows = d1
            .db
            .query(
                "SELECT user_id, COUNT(*) FROM relay_assignments GROUP BY user_id",
                &[],
            )
            .await
            .unwrap();
        assert!(rows.iter().all(|r| r.i64(1) == 1));
        let cells = d1
            .db
            .query(
                "SELECT cell_id, reserved_requests, capacity_requests FROM relay_cells",
                &[],
            )
            .await
            .unwrap();
        for c in &cells {
            assert!(c.i64(1) <= c.i64(2), "cell {} over capacity", c.str(0));
        }
        let total: i64 = cells.iter().map(|c| c.i64(1)).sum();
        assert_eq!(total as usize, rows.len(), "one pending control per host");
        for (i, h) in hosts.iter().enumerate() {
            if let Some(url) = cell_of.get(&i) {
                let w = d1.whereabouts(h).await;
                assert_eq!(cell_url(w["cellId"].as_str().unwrap()), *url);
            }
        }
        check_invariants(&d1.db).await;
        d2.shutdown().await;
        d1.shutdown().await;
    }
}

/// Concurrent moves: 20 hosts on A, A roll-isolated, then 100 concurrent hinted assigns over two
/// directors. Every host moves exactly once (epoch 1 → 2, never further, never back), every grant
/// for a host names the same cell at the same epoch, and the invariants hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_concurrent_isolated_moves_bump_epochs_once() {
    for t in backends().await {
        let lanes = [
            "--public-assignment-concurrency",
            "4",
            "--public-sticky-concurrency",
            "4",
        ];
        let d1 = start(&t, &lanes).await;
        let d2 = start(&t, &lanes).await;
        d1.fast_lanes();
        d2.fast_lanes();
        d1.register("A", US, true).await;
        d1.hb("A", US, true, &uuid(), 100, true).await;
        let mut hosts = Vec::new();
        for i in 0..20 {
            let h = d1.host(&format!("mover-{i}")).await;
            assert_eq!(
                d1.assign(&h, json!({})).await.body["cellUrl"],
                json!(cell_url("A"))
            );
            hosts.push(h);
        }
        for (id, region) in [("B", US), ("C", ASIA)] {
            d1.register(id, region, true).await;
            d1.hb(id, region, true, &uuid(), 100, true).await;
        }
        d1.admin(
            "cell-state",
            json!({"v":1,"cellId":"A","state":"migration-only","rollIsolated":true}),
        )
        .await;
        let mut futs = Vec::new();
        for round in 0..5 {
            for (i, h) in hosts.iter().enumerate() {
                let d = if (i + round) % 2 == 0 { &d1 } else { &d2 };
                futs.push(async move { (i, d.assign(h, json!({"reconnect": true})).await) });
            }
        }
        let results = futures_util::future::join_all(futs).await;
        let mut seen: HashMap<usize, (String, i64)> = HashMap::new();
        for (i, r) in &results {
            if r.status != 200 {
                assert!(
                    ["assignment_row_busy", "assignments_temporarily_unavailable"]
                        .contains(&r.error()),
                    "{:?}",
                    r.body
                );
                continue;
            }
            let g = (
                r.body["cellUrl"].as_str().unwrap().to_string(),
                r.body["assignmentEpoch"].as_i64().unwrap(),
            );
            assert_eq!(g.1, 2, "exactly one move");
            assert_ne!(g.0, cell_url("A"));
            let prev = seen.entry(*i).or_insert_with(|| g.clone());
            assert_eq!(*prev, g, "host {i} got two different grants");
        }
        for h in &hosts {
            let w = d1.whereabouts(h).await;
            assert!(w["assignmentEpoch"].as_i64().unwrap() <= 2);
        }
        check_invariants(&d1.db).await;
        d2.shutdown().await;
        d1.shutdown().await;
    }
}
