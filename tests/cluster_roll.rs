//! The cluster under a rolling restart (issue: director, acceptance): 2 directors and 3 cells as
//! separate `orca-relay` processes on loopback ports against one Postgres database; hosts connected
//! with the real protocol; each cell rolled in turn (isolate with the roll stamp, SIGTERM, restart as a
//! new incarnation, restore `general`).
//!
//! Asserts: every host is re-granted and reconnected after every roll; no host ever holds live control
//! leases on two cells at once (sampled from the database throughout); each host's epochs never go
//! down and strictly increase on every move. Prints the longest time any host was refused.
//!
//! Postgres only (it is the clustered shape); skipped without ORCA_RELAY_TEST_POSTGRES_URL.

mod support;
use support::cluster;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::*;
use orca_relay::cell::testkit::HostIdentity;
use orca_relay::store::testing::TestDb;

const HOSTS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_of_every_cell_keeps_one_server_per_host() {
    let Some(t) = TestDb::postgres().await else {
        return;
    };
    let Fleet {
        directors,
        mut dprocs,
        cell_urls,
        mut cprocs,
    } = start_fleet(&t.url, 2, 3).await;

    // Hosts connect with the real protocol.
    let stop = Arc::new(AtomicBool::new(false));
    let logs: Vec<Arc<Mutex<HostLog>>> = (0..HOSTS)
        .map(|_| Arc::new(Mutex::new(HostLog::default())))
        .collect();
    let mut tasks = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        let host = HostIdentity::generate(&format!("user-{i}"));
        tasks.push(tokio::spawn(run_host(
            host,
            directors.clone(),
            directors[0].clone(),
            log.clone(),
            stop.clone(),
        )));
    }
    let all_connected = || {
        let logs = logs.clone();
        async move { logs.iter().all(|l| l.lock().unwrap().connected) }
    };
    wait_until(
        "all hosts connected",
        Duration::from_secs(30),
        all_connected,
    )
    .await;

    // Invariant sampler: no host with live controls on two cells, ever.
    let sampler = Sampler::start(&t.db);

    // Roll every cell in turn.
    let mut rolled_hosts = 0;
    for (i, cell) in cprocs.iter_mut().enumerate() {
        let id = format!("c{}", i + 1);
        let before = cell_status(&directors[0]).await;
        let old_incarnation = before.iter().find(|c| c["cellId"] == id.as_str()).unwrap()
            ["runtime"]["cellIncarnation"]
            .clone();
        // Hosts served by this cell right now, and how many grants each has seen so far.
        let url = cell_urls[i].clone();
        let on_cell: Vec<(usize, usize)> = logs
            .iter()
            .enumerate()
            .filter_map(|(h, l)| {
                let l = l.lock().unwrap();
                (l.grants.last().map(|g| &g.0) == Some(&url)).then_some((h, l.grants.len()))
            })
            .collect();
        admin_post(
            &directors[i % 2],
            "/v1/admin/cell-state",
            serde_json::json!({"v": 1, "cellId": id, "state": "migration-only", "rollIsolated": true}),
        )
        .await;
        cell.terminate();
        cell.start();
        wait_until(
            &format!("{id} heard as a new incarnation"),
            Duration::from_secs(30),
            || {
                let d = directors[0].clone();
                let id = id.clone();
                let old = old_incarnation.clone();
                async move {
                    cell_status(&d).await.iter().any(|c| {
                        c["cellId"] == id.as_str()
                            && c["live"] == true
                            && c["runtime"]["cellIncarnation"] != old
                    })
                }
            },
        )
        .await;
        admin_post(
            &directors[(i + 1) % 2],
            "/v1/admin/cell-state",
            serde_json::json!({"v": 1, "cellId": id, "state": "general"}),
        )
        .await;
        // Every host the roll disconnected got a new grant and is connected again.
        wait_until(
            &format!("hosts re-granted after rolling {id}"),
            Duration::from_secs(40),
            || {
                let logs = logs.clone();
                let on_cell = on_cell.clone();
                async move {
                    on_cell.iter().all(|(h, n)| {
                        let l = logs[*h].lock().unwrap();
                        l.grants.len() > *n && l.connected
                    }) && logs.iter().all(|l| l.lock().unwrap().connected)
                }
            },
        )
        .await;
        rolled_hosts += on_cell.len();
    }

    let (samples, violations) = sampler.stop().await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }

    assert!(
        violations.is_empty(),
        "hosts with controls on two cells: {violations:?}"
    );
    let mut longest = Duration::ZERO;
    let mut moves = 0;
    for (i, log) in logs.iter().enumerate() {
        let l = log.lock().unwrap();
        assert!(!l.grants.is_empty(), "host {i} was never granted");
        for w in l.grants.windows(2) {
            let ((c0, e0), (c1, e1)) = (&w[0], &w[1]);
            assert!(e1 >= e0, "host {i}: epoch went down {e0} -> {e1}");
            if c0 != c1 {
                moves += 1;
                assert!(
                    e1 > e0,
                    "host {i}: moved {c0} -> {c1} without an epoch bump"
                );
            }
        }
        longest = longest.max(l.longest_refusal);
    }
    assert!(
        rolled_hosts >= HOSTS,
        "every host was on a rolled cell at least once"
    );
    assert!(moves >= 1, "the roll moved hosts between cells");
    let grants: HashMap<usize, usize> = logs
        .iter()
        .enumerate()
        .map(|(i, l)| (i, l.lock().unwrap().grants.len()))
        .collect();
    println!(
        "cluster roll: {HOSTS} hosts, 3 cells rolled, {moves} moves, {samples} invariant samples, grants per host {grants:?}, longest refusal {} ms",
        longest.as_millis()
    );
    for d in dprocs.iter_mut() {
        d.terminate();
    }
    for c in cprocs.iter_mut() {
        c.terminate();
    }
}
