//! Roll benchmark (issue 12): `hosts` desktop hosts connected with the real protocol across
//! `cells` cells (separate `orca-relay` processes) and `directors` directors on one Postgres
//! database; every cell is rolled in turn exactly as `orca-relay admin roll` does it (roll-isolate,
//! paced drain, stop, new incarnation, restore `general`), with a supervisor restarting the stopped
//! process like `Restart=always`. Hosts reconnect as the Orca desktop does: on the cell's `drain`
//! they close the control and re-resolve through a director (`reconnect:true`, docs/deploy/cluster.md;
//! `--on-drain hold` keeps the control until the cell closes it at the grace instead), retry with
//! backoff (100 ms doubling to 2 s, ±20 %), the directors in turn after a failure.
//!
//! ```text
//! cargo build && ORCA_RELAY_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --example roll_bench -- [--hosts 1000] [--cells 4] [--directors 2] [--on-drain leave|hold]
//! ```
//!
//! `--kill-one` SIGKILLs the first cell instead and leaves it down (its hosts move once the
//! director sees its heartbeat expire).
//!
//! (`cargo build` first: the bench runs `target/<profile>/orca-relay`, or `ORCA_RELAY_BIN`.)
//! Prints hosts, moves, the longest and p99 time a host was without a grant (an activated
//! control), refused assigns and control handshakes by cause, and the invariant sampler's
//! double-serving host-samples (must be 0; `tests/support/roll_sampler.rs` says what counts);
//! exits non-zero when double serving was seen, a sample failed, an epoch went down or a roll
//! failed. The goal is no host without a grant for longer than one heartbeat interval (15 s).

#[path = "common/relay_bin.rs"]
mod relay_bin;
#[path = "../tests/support/mod.rs"]
mod support;
use relay_bin::relay_bin;
use support::{region, roll_sampler};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use orca_relay::cell::testkit::HostIdentity;
use orca_relay::store::testing::TestDb;
use region::*;
use roll_sampler::{epochs_ok, start_roll_sampler};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "1000")]
    hosts: usize,
    #[arg(long, default_value = "4")]
    cells: usize,
    #[arg(long, default_value = "2")]
    directors: usize,
    /// Drain grace of each roll (admin roll --grace-ms).
    #[arg(long, default_value = "10000")]
    grace_ms: u64,
    /// Drain pace window of each roll (admin roll --pace-window-ms).
    #[arg(long, default_value = "5000")]
    pace_window_ms: u64,
    /// Database pool of every process.
    #[arg(long, default_value = "8")]
    pool_max: usize,
    /// Database pool of the cells only (default: `--pool-max`); a small one puts the cells' store
    /// calls (activations, releases, renewals) under pressure while the directors keep theirs.
    #[arg(long)]
    cell_pool_max: Option<usize>,
    /// What a host does when its cell sends `drain`: `leave` closes the control and re-resolves at
    /// once (docs/deploy/cluster.md, the desktop); `hold` keeps it until the cell closes it at the grace.
    #[arg(long, default_value = "leave", value_parser = ["leave", "hold"])]
    on_drain: String,
    /// Invariant sampler period (ms).
    #[arg(long, default_value = "100")]
    sample_ms: u64,
    /// Instead of rolling: SIGKILL the first cell and leave it down; its hosts move to the others
    /// once the director sees its heartbeat expire. Prints the time from the kill until every
    /// host holds a control again.
    #[arg(long)]
    kill_one: bool,
}

const REGION: &str = "us-central1";
const GOAL: Duration = Duration::from_secs(15);

/// SIGKILLs the first cell (left down) and waits until every host holds a control again,
/// printing how long that took and the per-host time without a control of the hosts it served.
async fn kill_one(fleet: &Fleet, stats: &[Arc<Mutex<HostStats>>]) {
    let victim = &fleet.cells[0];
    let on_victim: Vec<_> = stats
        .iter()
        .filter(|s| s.lock().unwrap().last_cell() == Some(victim.url.as_str()))
        .cloned()
        .collect();
    let killed = Instant::now();
    {
        let mut node = victim.node.lock().unwrap();
        if let Some(mut child) = node.child.take() {
            support::common::proc::kill(&mut child);
        }
    }
    println!(
        "roll_bench: cell {} killed with SIGKILL (left down), {} hosts on it",
        victim.id,
        on_victim.len()
    );
    let back = || {
        let stats = stats.to_vec();
        async move { stats.iter().all(|s| s.lock().unwrap().connected) }
    };
    wait_until(
        "every host back after the kill",
        Duration::from_secs(240),
        back,
    )
    .await;
    let all_back = killed.elapsed();
    let downs: Vec<Duration> = on_victim
        .iter()
        .filter_map(|s| s.lock().unwrap().downs.last().copied())
        .collect();
    println!(
        "roll_bench: every host back {} ms after the kill; the killed cell's hosts without a control p50 {} ms, p99 {} ms, max {} ms",
        all_back.as_millis(),
        quantile(&downs, 0.5).as_millis(),
        quantile(&downs, 0.99).as_millis(),
        downs.iter().max().copied().unwrap_or_default().as_millis()
    );
}

/// The value of `key=<n>` in a log line.
fn field(line: &str, key: &str) -> Option<u64> {
    let pat = format!(" {key}=");
    let at = line.find(&pat)? + pat.len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Where the draining cells' release batches and late releases spent their time: p50 / p99 / max
/// of each phase the cells log (`src/cell/release.rs`).
fn release_phases(lines: &[String]) {
    const PHASES: [&str; 8] = [
        "queue_ms",
        "begin_ms",
        "retried_ms",
        "rows_ms",
        "cells_ms",
        "commit_ms",
        "total_ms",
        "waited_ms",
    ];
    for (what, label) in [
        (
            "activity release batch",
            "release batches on draining cells",
        ),
        ("activity release late", "releases landed > 1 s after asked"),
    ] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.contains(what)).collect();
        let mut parts = Vec::new();
        for key in PHASES {
            let mut v: Vec<Duration> = hits
                .iter()
                .filter_map(|l| field(l, key))
                .map(Duration::from_millis)
                .collect();
            if v.is_empty() {
                continue;
            }
            v.sort();
            parts.push(format!(
                "{key} {}/{}/{}",
                quantile(&v, 0.5).as_millis(),
                quantile(&v, 0.99).as_millis(),
                v.last().unwrap().as_millis()
            ));
        }
        let retried = hits
            .iter()
            .filter(|l| field(l, "attempts").is_some_and(|a| a > 1))
            .count();
        let paths: BTreeMap<&str, usize> = hits.iter().fold(BTreeMap::new(), |mut m, l| {
            if let Some(at) = l.find(" path=") {
                let p = l[at + 6..].split(' ').next().unwrap_or("");
                *m.entry(p).or_default() += 1;
            }
            m
        });
        println!(
            "roll_bench: {label}: {} ({retried} with > 1 attempt{}), p50/p99/max ms: {}",
            hits.len(),
            if paths.is_empty() {
                String::new()
            } else {
                format!(", paths {paths:?}")
            },
            parts.join(", ")
        );
    }
}

/// Raises the open-file soft limit to the hard limit (1 000 hosts need a few thousand sockets);
/// the spawned processes inherit it.
fn raise_nofile() -> u64 {
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        r.rlim_cur
    }
}

async fn admin_roll(director: &str, cell: &str, pid: u32, a: &Args) -> (i32, String) {
    let restart = format!("kill -TERM {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.05; done");
    let out = tokio::process::Command::new(relay_bin())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ORCA_RELAY_ADMIN_TOKEN", ADMIN)
        .args(["admin", "roll", "--cell", cell, "--restart", &restart])
        .args(["--grace-ms", &a.grace_ms.to_string()])
        .args(["--pace-window-ms", &a.pace_window_ms.to_string()])
        .args(["--timeout", "180", "--poll", "0.2", "--url", director])
        .output()
        .await
        .expect("run admin roll");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = Args::parse();
    let nofile = raise_nofile();
    let Some(t) = TestDb::postgres().await else {
        eprintln!(
            "roll_bench needs ORCA_RELAY_TEST_POSTGRES_URL (a Postgres it may create schemas in)"
        );
        std::process::exit(2);
    };
    let bin = relay_bin();
    let spec = FleetSpec {
        directors: vec![REGION.to_string(); a.directors],
        cells: (1..=a.cells)
            .map(|i| (format!("c{i}"), REGION.to_string()))
            .collect(),
        capacity_requests: (a.hosts as i64 * 2).max(100),
        pool_max: a.cell_pool_max.unwrap_or(a.pool_max),
        director_env: vec![(
            "ORCA_RELAY_DATABASE_POOL_MAX".into(),
            a.pool_max.to_string(),
        )],
    };
    let started = Instant::now();
    let fleet = start_fleet(&bin, &t.url, &spec).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut stats = Vec::new();
    let mut by_id = roll_sampler::Hosts::new();
    let mut by_digest = BTreeMap::new();
    let mut tasks = Vec::new();
    for i in 0..a.hosts {
        let s = Arc::new(Mutex::new(HostStats::default()));
        stats.push(s.clone());
        let host = HostIdentity::generate(&format!("roll-user-{i:04}"));
        by_id.insert(host.relay_host_id.clone(), s.clone());
        by_digest.insert(
            orca_relay::logging::digest(&host.relay_host_id),
            (i, s.clone()),
        );
        // Each host's own director first (the desktop's configured one), the others after a failure.
        let mut ds = fleet.directors.clone();
        let n = ds.len();
        ds.rotate_left(i % n);
        tasks.push(tokio::spawn(run_host(
            host,
            ds,
            fleet.directors[0].clone(),
            HostPlan {
                leave_on_drain: a.on_drain == "leave",
                ..HostPlan::default()
            },
            s,
            stop.clone(),
        )));
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let connected = || {
        let stats = stats.clone();
        async move { stats.iter().all(|s| s.lock().unwrap().connected) }
    };
    wait_until("every host connected", Duration::from_secs(180), connected).await;
    let ramp = started.elapsed();
    // Only what happens during the rolls counts: forget the ramp's refusals and downs.
    for s in &stats {
        let mut s = s.lock().unwrap();
        s.refusals.clear();
        s.downs.clear();
    }
    let per_cell = |url: &str| {
        stats
            .iter()
            .filter(|s| s.lock().unwrap().last_cell() == Some(url))
            .count()
    };
    let spread: Vec<String> = fleet
        .cells
        .iter()
        .map(|c| format!("{} {}", c.id, per_cell(&c.url)))
        .collect();
    println!(
        "roll_bench: {} hosts connected in {} ms across {} cells ({}), {} directors, open files {nofile}",
        a.hosts,
        ramp.as_millis(),
        a.cells,
        spread.join(", "),
        a.directors
    );
    println!(
        "roll_bench: on drain {}, drain grace {} ms, pace window {} ms, pool {} per director and {} per cell, sampling every {} ms, binary {}",
        a.on_drain,
        a.grace_ms,
        a.pace_window_ms,
        a.pool_max,
        a.cell_pool_max.unwrap_or(a.pool_max),
        a.sample_ms,
        bin.display()
    );
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = start_roll_sampler(
        t.db.clone(),
        &fleet.cells,
        by_id,
        Duration::from_millis(a.sample_ms),
        sampler_stop.clone(),
    );
    let sup_stop = Arc::new(AtomicBool::new(false));
    // A killed cell stays down: no supervisor restarts it.
    let sups: Vec<_> = fleet
        .cells
        .iter()
        .skip(usize::from(a.kill_one))
        .map(|c| supervise(c.node.clone(), sup_stop.clone()))
        .collect();
    let rolls_started = Instant::now();
    let mut failed_rolls = 0;
    let rolled: &[CellNode] = if a.kill_one {
        kill_one(&fleet, &stats).await;
        &[]
    } else {
        &fleet.cells
    };
    for c in rolled {
        let pid = c.node.lock().unwrap().pid().expect("cell running");
        let t0 = Instant::now();
        let (code, out) = admin_roll(&fleet.directors[0], &c.id, pid, &a).await;
        let last = out.lines().last().unwrap_or_default().to_string();
        println!(
            "roll_bench: roll {} exit {code} in {} ms: {last}",
            c.id,
            t0.elapsed().as_millis()
        );
        if code != 0 {
            failed_rolls += 1;
            eprintln!("{out}");
        }
        // The next roll starts once every host holds a control again (as an operator would wait).
        let back = || {
            let stats = stats.clone();
            async move { stats.iter().all(|s| s.lock().unwrap().connected) }
        };
        wait_until("every host reconnected", Duration::from_secs(120), back).await;
    }
    let rolls = rolls_started.elapsed();
    sampler_stop.store(true, Ordering::SeqCst);
    let seen = sampler.await.unwrap();
    let (samples, violations) = (seen.samples, &seen.violations);
    sup_stop.store(true, Ordering::SeqCst);
    let restarts: u32 = sups.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }

    let mut downs = Vec::new();
    let mut causes: BTreeMap<String, u64> = BTreeMap::new();
    let mut moves = 0;
    let mut epochs_good = true;
    for s in &stats {
        let s = s.lock().unwrap();
        downs.extend(s.downs.iter().copied());
        for (k, n) in &s.refusals {
            *causes.entry(k.clone()).or_default() += n;
        }
        moves += s.moves();
        epochs_good &= epochs_ok(&s.grants);
    }
    let longest = downs.iter().copied().max().unwrap_or_default();
    let p99 = quantile(&downs, 0.99);
    let p50 = quantile(&downs, 0.50);
    let over_goal = downs.iter().filter(|d| **d > GOAL).count();
    if !a.kill_one {
        println!(
            "roll_bench: {} cells rolled in {} ms ({} restarts, {failed_rolls} failed rolls)",
            a.cells,
            rolls.as_millis(),
            restarts
        );
    }
    println!(
        "roll_bench: hosts {}, moves {moves}, periods without a grant {}, p50 {} ms, p99 {} ms, longest {} ms, over 15 s: {over_goal}",
        a.hosts,
        downs.len(),
        p50.as_millis(),
        p99.as_millis(),
        longest.as_millis()
    );
    let total: u64 = causes.values().sum();
    println!("roll_bench: refused {total} (by cause):");
    for (k, n) in &causes {
        println!("  {n:>7}  {k}");
    }
    println!(
        "roll_bench: double-serving host-samples {} in {samples} samples ({} failed), epochs only increase (+1 or more per move): {epochs_good}",
        violations.len(),
        seen.failed
    );
    println!(
        "roll_bench: host-samples not serving: {} with the lease of a cell the host left < {} ms before (release in flight), {} with a stopped process's lease",
        seen.releases_in_flight,
        roll_sampler::RELEASE_WINDOW.as_millis(),
        seen.stopped_leases
    );
    // The first sample of each host seen double served (up to 20 hosts), then how many samples
    // each had.
    let mut per_host: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for v in violations {
        let host = v.split(':').next().unwrap_or_default();
        per_host.entry(host).or_insert((0, v.as_str())).0 += 1;
    }
    let lines = fleet.all_lines();
    for (host, (n, first)) in per_host.iter().take(20) {
        println!("  {n} samples, first: {first}");
        // Where that host's late releases waited (the cells log a release landing > 1 s after it
        // was asked for), with when the host left each cell (wall ms).
        let digest = host.trim_start_matches("host ");
        if let Some((_, s)) = by_digest.get(digest) {
            let left = s.lock().unwrap().left.clone();
            println!("    host left (wall ms): {left:?}");
        }
        for l in lines
            .iter()
            .filter(|l| l.contains("activity release late") && l.contains(digest))
        {
            let at = l.find("host=").unwrap_or(0);
            println!("    {}", &l[at..]);
        }
    }
    release_phases(&lines);
    // What the processes logged about releases and renewals that did not land.
    for what in [
        "activity release failed",
        "activity release landed",
        "control renewal failed",
        "control re-acquire failed",
        "orca_relay_postgres_transaction_retry_exhausted",
    ] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.contains(what)).collect();
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for l in &hits {
            let tail = l
                .find("error=")
                .or_else(|| l.find("attempts="))
                .or_else(|| l.find("outcome="))
                .or_else(|| l.find('{'))
                .map_or("", |i| &l[i..]);
            *kinds.entry(tail.chars().take(120).collect()).or_default() += 1;
        }
        println!("roll_bench: log lines '{what}': {}", hits.len());
        for (k, n) in kinds.iter().take(6) {
            println!("  {n:>6}  {k}");
        }
    }
    if !a.kill_one {
        println!(
            "roll_bench: goal (no host without a grant > 15 s): {}",
            if longest <= GOAL { "met" } else { "MISSED" }
        );
    }
    fleet.stop();
    if !violations.is_empty() || seen.failed > 0 || !epochs_good || failed_rolls > 0 {
        std::process::exit(1);
    }
}
