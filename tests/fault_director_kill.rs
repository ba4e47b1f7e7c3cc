//! kill -9 of a director during an assign burst (issue 11, fault tests): 2 directors and 2 cells as
//! separate processes on one Postgres database. Hundreds of new hosts ask `/v1/assign` of both
//! directors at once; a third of the way in, one director is killed with SIGKILL. A host whose
//! request failed asks the other director, as the desktop does.
//!
//! Asserts: no half-written assignment (counters match leases, no lease without its assignment,
//! cell reservations match the units held), no lost epoch (every granted epoch is at or below
//! the stored one and a later assign never answers lower), every host is granted, the surviving
//! director keeps serving (and its grants open a control on the cell). Prints the figures.
//!
//! Postgres only; skipped without ORCA_RELAY_TEST_POSTGRES_URL.

mod support;
use support::cluster;
use support::faults;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::*;
use faults::*;
use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::store::testing::TestDb;
use tokio::sync::Semaphore;

const HOSTS: usize = 300;
const CONCURRENCY: usize = 24;

/// What one host's assigns saw: granted (director index, cell, epoch) in order, and failures.
#[derive(Default, Clone)]
struct Seen {
    grants: Vec<(usize, String, i64)>,
    failures: Vec<(usize, String)>,
}

async fn assign_once(director: &str, token: &str, id: &str) -> Result<(String, i64), String> {
    testkit::assign(director, token, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_a_director_mid_burst_loses_nothing() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipping: ORCA_RELAY_TEST_POSTGRES_URL unset");
        return;
    };
    let mut shape = start_shape(&t.url, 2, 2).await;
    let directors = shape.directors.clone();
    // Tokens name the first director's URL as the profile, as in the other cluster tests.
    let profile = directors[0].clone();
    let ids: Vec<HostIdentity> = (0..HOSTS)
        .map(|i| HostIdentity::generate(&format!("burst-user-{}", i % 40)))
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(CONCURRENCY));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let (id, directors, done, gate, profile) = (
            id.clone(),
            directors.clone(),
            done.clone(),
            gate.clone(),
            profile.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let mut seen = Seen::default();
            let mut turn = i % 2;
            let deadline = Instant::now() + Duration::from_secs(60);
            // Two grants per host (a desktop asks again on reconnect): the second must not go back.
            while seen.grants.len() < 2 && Instant::now() < deadline {
                let d = turn % 2;
                let token = id.token(SIGNING, &profile);
                match assign_once(&directors[d], &token, &id.relay_host_id).await {
                    Ok((cell, epoch)) => seen.grants.push((d, cell, epoch)),
                    Err(e) => {
                        seen.failures.push((d, e));
                        turn += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            done.fetch_add(1, Ordering::SeqCst);
            (id, seen)
        }));
    }
    wait_until("a third of the burst", Duration::from_secs(60), || {
        let done = done.clone();
        async move { done.load(Ordering::SeqCst) >= HOSTS / 3 }
    })
    .await;
    let killed_at = started.elapsed();
    kill9(&mut shape.dprocs[0]);
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let burst = started.elapsed();

    let mut d1_failures = 0;
    let mut d2_after_kill = 0;
    for (id, seen) in &results {
        assert_eq!(
            seen.grants.len(),
            2,
            "host {} not granted twice: {:?}",
            &id.relay_host_id[..8],
            seen.failures
        );
        d1_failures += seen.failures.iter().filter(|f| f.0 == 0).count();
        assert!(
            seen.failures
                .iter()
                .all(|f| f.0 == 0 || f.1.contains("503")),
            "the surviving director failed a request: {:?}",
            seen.failures
        );
        d2_after_kill += seen.grants.iter().filter(|g| g.0 == 1).count();
        let (e0, e1) = (seen.grants[0].2, seen.grants[1].2);
        assert!(e1 >= e0, "epoch went back {e0} -> {e1}");
        let rows = t
            .db
            .query(
                "SELECT assignment_epoch, cell_id FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2",
                orca_relay::params![id.user_id.clone(), id.relay_host_id.clone()],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "one assignment row per granted host");
        assert!(rows[0].i64(0) >= e1, "stored epoch below a granted one");
    }
    let bad = half_written(&t.db).await;
    assert!(bad.is_empty(), "half-written rows: {bad:?}");

    // The surviving director keeps serving: a fresh grant opens a control on its cell.
    let (id, _) = &results[0];
    let token = id.token(SIGNING, &profile);
    let (cell, epoch) = assign_once(&directors[1], &token, &id.relay_host_id)
        .await
        .expect("surviving director grants");
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    testkit::connect_control(&cell, id, &token, &profile, &hello)
        .await
        .expect("control on the granted cell");
    let bad = half_written(&t.db).await;
    assert!(
        bad.is_empty(),
        "half-written rows after the control: {bad:?}"
    );
    println!(
        "fault_director_kill: {HOSTS} hosts x 2 assigns, d1 killed at {} ms, burst done in {} ms; \
         {d1_failures} requests failed on the killed director, {d2_after_kill} grants by the survivor; \
         0 half-written rows, no epoch lost",
        killed_at.as_millis(),
        burst.as_millis()
    );
    shape.dprocs[1].terminate();
    for c in shape.cprocs.iter_mut() {
        c.terminate();
    }
}
