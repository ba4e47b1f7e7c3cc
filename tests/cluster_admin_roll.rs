//! `orca-relay admin roll` against a real cluster (issue 10, acceptance): one director and two
//! cells as separate processes on one Postgres database, hosts connected with the real protocol.
//!
//! 1. `admin roll --cell c1 --restart '<kill the process>'` (a supervisor thread plays systemd's
//!    `Restart=always`): exit 0, progress lines for every step, every host that was on c1 is
//!    re-granted and reconnected, c1 ends `general` with a new incarnation.
//! 2. `admin roll --cell c2 --restart 'exit 3'`: non-zero exit, the message names the state the
//!    cell was left in, and the director agrees (migration-only, roll-isolated); c2's hosts moved.
//!
//! Throughout, the invariant sampler checks that no host is served by two cells at once.
//! Postgres only; skipped without ORCA_RELAY_TEST_POSTGRES_URL.

mod support;
use support::cluster;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::*;
use orca_relay::cell::testkit::HostIdentity;
use orca_relay::store::testing::TestDb;

const HOSTS: usize = 4;

/// Runs `orca-relay admin roll …` and returns (exit code, stdout, stderr).
async fn roll(director: &str, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_orca-relay"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ORCA_RELAY_ADMIN_TOKEN", ADMIN)
        .args(["admin", "roll"])
        .args(args)
        .args(["--url", director])
        .output()
        .await
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    println!("--- admin roll {args:?}: {:?}\n{o}{e}", out.status.code());
    (out.status.code().unwrap_or(-1), o, e)
}

/// Restarts the process whenever it exits (with status 0), like a service manager would.
fn supervise(p: Arc<Mutex<Proc>>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let mut restarts = 0;
        while !stop.load(Ordering::SeqCst) {
            {
                let mut p = p.lock().unwrap();
                let exited = p.child.as_mut().and_then(|c| c.try_wait().unwrap());
                if let Some(status) = exited {
                    assert_eq!(status.code(), Some(0), "{} exit on SIGTERM", p.name);
                    p.child = None;
                    p.start();
                    restarts += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        restarts
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_roll_restarts_a_cell_and_names_the_state_it_leaves() {
    let Some(t) = TestDb::postgres().await else {
        return;
    };
    let c = start_cluster(&t.url, 2).await;
    let director = c.director.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let logs: Vec<Arc<Mutex<HostLog>>> = (0..HOSTS)
        .map(|_| Arc::new(Mutex::new(HostLog::default())))
        .collect();
    let mut tasks = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        tasks.push(tokio::spawn(run_host(
            HostIdentity::generate(&format!("roll-user-{i}")),
            vec![director.clone()],
            director.clone(),
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

    let sampler = Sampler::start(&t.db);
    let on_cell = |url: &str| -> Vec<(usize, usize)> {
        logs.iter()
            .enumerate()
            .filter_map(|(h, l)| {
                let l = l.lock().unwrap();
                (l.grants.last().map(|g| g.0.as_str()) == Some(url)).then_some((h, l.grants.len()))
            })
            .collect()
    };
    let regranted = |hosts: Vec<(usize, usize)>| {
        let logs = logs.clone();
        async move {
            hosts.iter().all(|(h, n)| {
                let l = logs[*h].lock().unwrap();
                l.grants.len() > *n && l.connected
            }) && logs.iter().all(|l| l.lock().unwrap().connected)
        }
    };
    let [c1, c2]: [Proc; 2] = c.cprocs.try_into().ok().unwrap();
    let (c1, c2) = (Arc::new(Mutex::new(c1)), Arc::new(Mutex::new(c2)));
    let sup_stop = Arc::new(AtomicBool::new(false));
    let sup = supervise(c1.clone(), sup_stop.clone());

    // 1. A successful roll of c1.
    let old = cell_status(&director).await;
    let old_inc = old.iter().find(|x| x["cellId"] == "c1").unwrap()["runtime"]["cellIncarnation"]
        .as_str()
        .unwrap()
        .to_owned();
    let moved = on_cell(&c.cell_urls[0]);
    let pid = c1.lock().unwrap().child.as_ref().unwrap().id();
    let restart = format!("kill -TERM {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.05; done");
    let started = std::time::Instant::now();
    let (code, out, err) = roll(
        &director,
        &[
            "--cell",
            "c1",
            "--restart",
            &restart,
            "--grace-ms",
            "2000",
            "--pace-window-ms",
            "300",
            "--timeout",
            "60",
            "--poll",
            "0.2",
        ],
    )
    .await;
    let took = started.elapsed();
    assert_eq!(code, 0, "roll c1 failed: {err}");
    for needle in [
        "roll c1: state general, live true, incarnation ",
        "roll c1: state migration-only, rollIsolatedAt ",
        "roll c1: drain sent to ",
        "roll c1: hosts still attached: 0",
        "roll c1: running restart command",
        "roll c1: restart command done",
        "roll c1: incarnation seen ",
        "roll c1: state general; rolled in ",
    ] {
        assert!(out.contains(needle), "roll output lacks {needle:?}:\n{out}");
    }
    let now = cell_status(&director).await;
    let c1_now = now.iter().find(|x| x["cellId"] == "c1").unwrap();
    assert_eq!(c1_now["admissionState"], "general");
    assert_eq!(c1_now["rollIsolatedAt"], serde_json::Value::Null);
    assert_eq!(c1_now["live"], true);
    let new_inc = c1_now["runtime"]["cellIncarnation"].as_str().unwrap();
    assert_ne!(new_inc, old_inc);
    assert!(
        out.contains(&format!("incarnation seen {new_inc} (live)")),
        "{out}"
    );
    wait_until("hosts of c1 re-granted", Duration::from_secs(40), || {
        regranted(moved.clone())
    })
    .await;
    sup_stop.store(true, Ordering::SeqCst);
    assert_eq!(sup.join().unwrap(), 1, "c1 restarted once");

    // 2. A failing restart command: c2 is left isolated and drained, and says so.
    let moved = on_cell(&c.cell_urls[1]);
    let (code, out, err) = roll(
        &director,
        &[
            "--cell",
            "c2",
            "--restart",
            "echo cannot restart >&2; exit 3",
            "--grace-ms",
            "2000",
            "--pace-window-ms",
            "300",
            "--timeout",
            "60",
            "--poll",
            "0.2",
        ],
    )
    .await;
    assert_eq!(code, 1);
    assert!(out.contains("roll c2: hosts still attached: 0"), "{out}");
    assert!(
        err.contains(
            "roll c2: restart command failed (exit 3); cell c2 left migration-only (roll-isolated), drained"
        ),
        "{err}"
    );
    let now = cell_status(&director).await;
    let c2_now = now.iter().find(|x| x["cellId"] == "c2").unwrap();
    assert_eq!(c2_now["admissionState"], "migration-only");
    assert_eq!(c2_now["rollIsolated"], true);
    wait_until("hosts of c2 re-granted", Duration::from_secs(40), || {
        regranted(moved.clone())
    })
    .await;

    // 3. A flag error: neither --cell nor --all.
    let (code, _, err) = roll(&director, &[]).await;
    assert_eq!(code, 2, "{err}");

    let (samples, violations) = sampler.stop().await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    assert!(
        violations.is_empty(),
        "hosts with controls on two cells: {violations:?}"
    );
    for (i, l) in logs.iter().enumerate() {
        let l = l.lock().unwrap();
        for w in l.grants.windows(2) {
            assert!(w[1].1 >= w[0].1, "host {i}: epoch went down");
        }
    }
    println!(
        "admin roll: {HOSTS} hosts, c1 rolled in {} ms, {} hosts moved off c2, {samples} invariant samples",
        took.as_millis(),
        moved.len()
    );
    let mut dproc = c.dproc;
    dproc.terminate();
    c1.lock().unwrap().terminate();
    c2.lock().unwrap().terminate();
}
