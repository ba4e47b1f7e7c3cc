//! kill -9 of a cell with live splices (issue 11, fault tests): 1 director and 2 cells as separate
//! processes on one Postgres database, hosts speaking the real protocol, two phones spliced. One cell
//! is killed with SIGKILL (no drain, no goodbye): its hosts must be re-granted on the other cell by
//! the dead-cell path (or a fence), the splice on the surviving cell keeps flowing, no host ever
//! has live controls on two cells (sampled from the database throughout) and every host's epochs
//! only go up. Prints how long the re-grant took.
//!
//! Postgres only (the clustered shape); skipped without ORCA_RELAY_TEST_POSTGRES_URL.

mod support;
use support::cluster;
use support::faults;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::*;
use faults::*;
use orca_relay::cell::testkit::{self, HostIdentity};
use orca_relay::store::testing::TestDb;

const HOSTS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_a_cell_regrants_its_hosts_elsewhere() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipping: ORCA_RELAY_TEST_POSTGRES_URL unset");
        return;
    };
    let mut c = start_cluster(&t.url, 2).await;
    let director = c.director.clone();

    let stop = Arc::new(AtomicBool::new(false));
    let logs: Vec<Arc<Mutex<HostLog>>> = (0..HOSTS).map(|_| Arc::default()).collect();
    let ids: Vec<HostIdentity> = (0..HOSTS)
        .map(|i| HostIdentity::generate(&format!("kill-user-{i}")))
        .collect();
    let mut tasks = Vec::new();
    for (id, log) in ids.iter().zip(&logs) {
        tasks.push(tokio::spawn(run_host(
            id.clone(),
            vec![director.clone()],
            director.clone(),
            log.clone(),
            stop.clone(),
        )));
    }
    wait_until("all hosts connected", Duration::from_secs(30), || {
        let logs = logs.clone();
        async move { logs.iter().all(|l| l.lock().unwrap().connected) }
    })
    .await;

    // Live splices: pair phones until both cells carry one.
    let mut splices = Vec::new();
    for i in 0..8 {
        let s = spliced(&director, &director, &format!("splice-user-{i}"))
            .await
            .expect("pair");
        if !splices.iter().any(|x: &(_, _, _, String, i64)| x.3 == s.3) {
            splices.push(s);
        }
        if splices.len() == 2 {
            break;
        }
    }
    assert_eq!(splices.len(), 2, "a splice on each cell");
    for (i, s) in splices.iter_mut().enumerate() {
        echo(&mut s.2, &format!("before {i}"), Duration::from_secs(5))
            .await
            .expect("splice flows before the kill");
    }
    let victim_url = splices[0].3.clone();
    let victim = c.cell_urls.iter().position(|u| *u == victim_url).unwrap();
    let survivor_url = c.cell_urls[1 - victim].clone();
    let on_victim: Vec<(usize, usize)> = logs
        .iter()
        .enumerate()
        .filter_map(|(h, l)| {
            let l = l.lock().unwrap();
            (l.grants.last().map(|g| &g.0) == Some(&victim_url)).then_some((h, l.grants.len()))
        })
        .collect();

    let sampler = LeaseSampler::start(t.db.clone());
    let killed = kill9(&mut c.cprocs[victim]);
    eprintln!(
        "killed c{} with {} hosts and 1 splice on it",
        victim + 1,
        on_victim.len()
    );

    // The splice on the survivor keeps flowing; the one on the victim is gone.
    echo(&mut splices[1].2, "after", Duration::from_secs(5))
        .await
        .expect("the surviving cell's splice keeps flowing");
    assert!(
        echo(&mut splices[0].2, "dead", Duration::from_secs(5))
            .await
            .is_err(),
        "a splice through a killed cell cannot flow"
    );

    // Every host of the victim is re-granted on the survivor and connected again.
    wait_until(
        "hosts of the killed cell re-granted",
        Duration::from_secs(120),
        || {
            let logs = logs.clone();
            let on_victim = on_victim.clone();
            let survivor = survivor_url.clone();
            async move {
                on_victim.iter().all(|(h, n)| {
                    let l = logs[*h].lock().unwrap();
                    l.grants.len() > *n && l.connected && l.grants.last().unwrap().0 == survivor
                })
            }
        },
    )
    .await;
    let regrant = killed.elapsed();

    // The spliced host of the victim asks again as a reconnecting desktop would.
    let (host, _, _, _, old_epoch) = &splices[0];
    let token = host.token(SIGNING, &director);
    let again = loop {
        if let Ok((cell, epoch)) = testkit::assign(&director, &token, &host.relay_host_id).await {
            if cell == survivor_url {
                break epoch;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(150),
            "spliced host never re-granted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(again > *old_epoch, "epoch {old_epoch} -> {again}");

    let (samples, violations) = sampler.finish().await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    assert!(violations.is_empty(), "hosts on two cells: {violations:?}");
    let moves = check_epochs(&logs);
    assert!(
        moves >= on_victim.len(),
        "{moves} moves for {} hosts",
        on_victim.len()
    );
    // The database agrees: every host's assignment epoch is at least the last one it saw.
    for (id, l) in ids.iter().zip(&logs) {
        let last = l.lock().unwrap().grants.last().unwrap().1;
        let rows =
            t.db.query(
                "SELECT assignment_epoch FROM relay_assignments WHERE relay_host_id = $1",
                orca_relay::params![id.relay_host_id.clone()],
            )
            .await
            .unwrap();
        assert!(rows[0].i64(0) >= last, "stored epoch below the granted one");
    }
    println!(
        "fault_cell_kill: {HOSTS} hosts, {} on the killed cell, re-granted after {} ms; {moves} moves, {samples} invariant samples, 0 double-served",
        on_victim.len(),
        regrant.as_millis()
    );
    c.dproc.terminate();
    c.cprocs[1 - victim].terminate();
}
