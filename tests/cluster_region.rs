//! The two-region cluster test of issue 8 (director.md §8, protocol.md §13), all real processes on
//! one Postgres database: one director in us-central1, two cells in us-central1 and two in
//! asia-east2. Idle desktop hosts advertise `idle-regional-rehome-v1` and report a conclusive
//! preference for asia-east2 (RTT us 150 ms, asia 40 ms); a few more hold a live splice. The control
//! is enabled with cohort 100 and the highest rate (120/min).
//!
//! Asserted:
//! - every idle host is moved to an asia cell within the stated bound: the worker commits at most
//!   one attempt per poll (§8.3: `committed` stops the walk) and polls every 6 s ± 20 %; with the
//!   rotating ≤ 50-host pages about every other poll reads a page without an eligible host, so
//!   the bound is `hosts × 14.4 s + 40 s` (measured: 27 commits in ~5 min with 53 hosts);
//! - hosts with a live splice are never moved (they hold more than one lease, so the worker's
//!   candidate rules never dispatch them; the cell's `busy` answer itself is P-40's test);
//! - on every sample of the invariant sampler no host has live control leases on two cells, and
//!   every host's epochs only increase;
//! - no process log line names a `userId` or a `relayHostId`; the overview counts the commits.
//!
//! Printed: moves, the longest time a host was without a control, samples. The number of idle
//! hosts is `ORCA_RELAY_REGION_TEST_HOSTS`: default 8 so the CI run stays short (~45 s); the
//! issue's 50 (`ORCA_RELAY_REGION_TEST_HOSTS=50`, about 10 min by the bound above) is run by hand.
//! Postgres only: skipped (and says so) without ORCA_RELAY_TEST_POSTGRES_URL.

#[path = "support/region.rs"]
mod region;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orca_relay::cell::testkit::HostIdentity;
use orca_relay::store::testing::TestDb;
use region::*;
use serde_json::json;

const US: &str = "us-central1";
const ASIA: &str = "asia-east2";
/// Hosts with a live splice (never idle, never moved).
const SPLICED: usize = 3;

fn idle_hosts() -> usize {
    std::env::var("ORCA_RELAY_REGION_TEST_HOSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_idle_hosts_move_spliced_hosts_stay() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipped: ORCA_RELAY_TEST_POSTGRES_URL not set");
        return;
    };
    let hosts = idle_hosts();
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_orca-relay"));
    let spec = FleetSpec {
        directors: vec![US.into()],
        cells: vec![
            ("us-a".into(), US.into()),
            ("us-b".into(), US.into()),
            ("asia-a".into(), ASIA.into()),
            ("asia-b".into(), ASIA.into()),
        ],
        capacity_requests: 1000,
        pool_max: 4,
        director_env: vec![],
    };
    let fleet = start_fleet(&bin, &t.url, &spec).await;
    let director = fleet.directors[0].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let measurements = vec![(US.to_string(), 150), (ASIA.to_string(), 40)];
    let mut identities = Vec::new();
    let mut stats = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..hosts + SPLICED {
        let user = format!("region-user-{i:03}");
        let id = HostIdentity::generate(&user);
        identities.push(user);
        identities.push(id.relay_host_id.clone());
        let s = Arc::new(Mutex::new(HostStats::default()));
        stats.push(s.clone());
        let plan = HostPlan {
            capable: true,
            measurements: Some(measurements.clone()),
            splice: i >= hosts,
            ..HostPlan::default()
        };
        tasks.push(tokio::spawn(run_host(
            id,
            fleet.directors.clone(),
            director.clone(),
            plan,
            s,
            stop.clone(),
        )));
    }
    let all_ready = || {
        let stats = stats.clone();
        async move {
            stats.iter().enumerate().all(|(i, s)| {
                let s = s.lock().unwrap();
                s.connected && s.reported && (i < hosts || s.splices > 0)
            })
        }
    };
    wait_until(
        "every host connected, measured and (spliced ones) paired",
        Duration::from_secs(60),
        all_ready,
    )
    .await;
    let us_urls: Vec<String> = fleet
        .cells
        .iter()
        .filter(|c| c.region == US)
        .map(|c| c.url.clone())
        .collect();
    for (i, s) in stats.iter().enumerate() {
        let s = s.lock().unwrap();
        assert!(
            us_urls.iter().any(|u| Some(u.as_str()) == s.last_cell()),
            "host {i} starts in us-central1 (first region, director's region)"
        );
    }
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = start_sampler(
        t.db.clone(),
        Duration::from_millis(100),
        sampler_stop.clone(),
    );
    admin(
        &director,
        "/v1/admin/regional-rehome-control",
        json!({"v":1,"action":"apply","expectedGeneration":0,"enabled":true,"ratePerMinute":120,
            "cohortPercent":100,"hostCooldownMs":60000,"preferenceMaxAgeMs":86400000,
            "confirmation":"ENABLE_REGIONAL_REHOMING"}),
    )
    .await
    .expect("enable the control");
    let enabled_at = Instant::now();
    let bound = Duration::from_millis(hosts as u64 * 14_400 + 40_000);
    let moved_all = || {
        let stats = stats.clone();
        let fleet_asia: Vec<String> = fleet
            .cells
            .iter()
            .filter(|c| c.region == ASIA)
            .map(|c| c.url.clone())
            .collect();
        async move {
            stats[..hosts].iter().all(|s| {
                let s = s.lock().unwrap();
                s.connected && fleet_asia.iter().any(|u| Some(u.as_str()) == s.last_cell())
            })
        }
    };
    wait_until("every idle host moved to asia-east2", bound, moved_all).await;
    let took = enabled_at.elapsed();
    // A few more polls with only the spliced hosts left as candidates: they must stay.
    let busy_seen = || {
        let fleet = &fleet;
        async move {
            // The worker's poll summaries count the `busy` answers (the cell answers them before
            // anything is logged there).
            let busy: i64 = fleet
                .all_lines()
                .iter()
                .filter(|l| l.contains("orca_relay_idle_rehome_dispatch_summary"))
                .filter_map(|l| {
                    l.find('{')
                        .and_then(|i| serde_json::from_str::<serde_json::Value>(&l[i..]).ok())
                })
                .filter_map(|v| v["outcomes"]["busy"].as_i64())
                .sum();
            busy
        }
    };
    // Spliced hosts hold more than one lease, so §8.3 selection never makes them candidates:
    // the worker does not even dispatch them (P-40 shows the cell's `busy` for a direct
    // dispatch). Report how many busy answers the summaries counted.
    let busy_answers = busy_seen().await;

    sampler_stop.store(true, Ordering::SeqCst);
    let seen = sampler.await.unwrap();
    let (samples, violations) = (seen.samples, seen.violations);
    let ov = overview(&director).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }

    assert!(
        violations.is_empty(),
        "hosts served by two cells: {violations:?}"
    );
    let mut moves = 0;
    let mut longest = Duration::ZERO;
    for (i, s) in stats.iter().enumerate() {
        let s = s.lock().unwrap();
        assert!(epochs_increase(&s), "host {i}: an epoch went down");
        if i >= hosts {
            assert_eq!(s.moves(), 0, "spliced host {i} was moved");
            assert!(
                us_urls.iter().any(|u| Some(u.as_str()) == s.last_cell()),
                "spliced host {i} left us-central1"
            );
        } else {
            assert_eq!(s.moves(), 1, "idle host {i}: exactly one move");
        }
        moves += s.moves();
        longest = s.downs.iter().copied().fold(longest, Duration::max);
    }
    assert!(
        ov["regionalRehome"]["committed"].as_i64() >= Some(hosts as i64),
        "{ov}"
    );
    let lines = fleet.all_lines();
    let leaks = identity_leaks(&lines, &identities);
    assert!(
        leaks.is_empty(),
        "log lines name a user or host: {:?}",
        &leaks[..leaks.len().min(5)]
    );
    let summaries = lines
        .iter()
        .filter(|l| l.contains("orca_relay_idle_rehome_dispatch_summary"))
        .count();
    println!(
        "cluster_region: {hosts} idle + {SPLICED} spliced hosts, {moves} moves in {} ms (bound {} ms), \
         longest without a control {} ms, {samples} invariant samples ({} with a stopped incarnation's lease), \
         {summaries} poll summaries, busy answers {busy_answers}, overview {}",
        took.as_millis(),
        bound.as_millis(),
        longest.as_millis(),
        seen.stale_leases,
        ov["regionalRehome"]
    );
    fleet.stop();
}
