//! Postgres failover under load: a primary and a streaming standby of its own
//! (`support/pgpair.rs`, two local Postgres servers in a temp dir), the relay as real processes (one
//! director, two cells) on the multi-host URL with `target_session_attrs=read-write`.
//!
//! During the run: hosts holding controls (reconnecting on close), phones spliced, and writers
//! making new pairings (assign, control, invite, phone), every acknowledged step recorded with the
//! epoch it named. Then the primary is stopped with `pg_ctl stop -m immediate` and the standby
//! promoted. Asserts: the same processes (no restart) answer `/ready` 200 again and pair new phones
//! within [`RECOVERY_BOUND`] of the promotion; no host ever has live controls on two cells
//! (sampled throughout); every host assigned after the failover gets an epoch strictly greater
//! than any epoch a client saw for it before. Synchronous replication: every acknowledged write is
//! on the new primary. Asynchronous replication: what was lost is printed (often nothing on
//! loopback). Prints a history summary: operations acknowledged, faults injected, violations,
//! time to recover.
//!
//! Needs the Postgres server binaries (not a running server): skipped with a printed reason
//! without them, never under `CI=true`.

mod support;
use support::cluster;
use support::faults;
use support::pgpair;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::*;
use faults::*;
use orca_relay::cell::testkit::{self, Hello, HostControl, HostIdentity, Pair};
use orca_relay::store::Db;
use pgpair::{PgPair, Replication};

/// Live hosts holding a control for the whole run.
const HOSTS: usize = 4;
/// Tasks making new pairings for the whole run.
const WRITERS: usize = 2;
/// Load before the fault.
const BEFORE: Duration = Duration::from_secs(5);
/// Asynchronous mode: how long the standby receives nothing before the crash.
const LAG: Duration = Duration::from_secs(2);
/// From the promotion to `/ready` 200 on every process and a new pairing.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);

/// One acknowledged write, as the client saw it.
#[derive(Clone, Debug)]
enum Ack {
    /// `/v1/assign` answered 200 naming `epoch` on `cell`.
    Grant {
        host: String,
        epoch: i64,
        after_fault: bool,
    },
    /// The control answered `invite-created`.
    Invite { host: String, after_fault: bool },
    /// The phone was spliced (`relay-hello` ok).
    Paired { host: String, after_fault: bool },
}

#[derive(Default)]
struct History {
    acks: Vec<Ack>,
    /// Hosts whose writes were (at least partly) acknowledged.
    hosts: HashMap<String, HostIdentity>,
    failed_attempts: u64,
}

impl History {
    fn max_epoch_seen(&self, host: &str, before_fault: bool) -> Option<i64> {
        self.acks
            .iter()
            .filter_map(|a| match a {
                Ack::Grant {
                    host: h,
                    epoch,
                    after_fault,
                } if h == host && (!before_fault || !after_fault) => Some(*epoch),
                _ => None,
            })
            .max()
    }
}

/// The next pairing's client address (`X-Forwarded-For`).
static SOURCES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// One pairing, each acknowledged step recorded as it is acknowledged.
async fn pair_once(
    director: &str,
    user: &str,
    history: &Mutex<History>,
    fault: &AtomicBool,
) -> Result<(HostControl, Pair), String> {
    let host = HostIdentity::generate(user);
    let token = host.token(SIGNING, director);
    let (cell, epoch) = testkit::assign(director, &token, &host.relay_host_id).await?;
    let id = host.relay_host_id.clone();
    {
        let mut h = history.lock().unwrap();
        h.hosts.insert(id.clone(), host.clone());
        h.acks.push(Ack::Grant {
            host: id.clone(),
            epoch,
            after_fault: fault.load(Ordering::SeqCst),
        });
    }
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let mut control = testkit::connect_control(&cell, &host, &token, director, &hello)
        .await
        .map_err(|e| format!("control {e:?}"))?;
    let invite = control
        .create_invite("r1", "d1")
        .await
        .map_err(|e| format!("invite {e}"))?;
    history.lock().unwrap().acks.push(Ack::Invite {
        host: id.clone(),
        after_fault: fault.load(Ordering::SeqCst),
    });
    let source = SOURCES.fetch_add(1, Ordering::Relaxed);
    let xff = format!(
        "10.{}.{}.{}",
        (source >> 16) & 255,
        (source >> 8) & 255,
        source & 255
    );
    let pair = testkit::pair_phone(
        &cell,
        &mut control,
        &id,
        &invite,
        &[("x-forwarded-for", xff)],
    )
    .await?;
    history.lock().unwrap().acks.push(Ack::Paired {
        host: id,
        after_fault: fault.load(Ordering::SeqCst),
    });
    Ok((control, pair))
}

async fn ready(url: &str) -> (u16, String) {
    match reqwest::Client::new()
        .get(format!("{url}/ready"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
    {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

async fn failover(mode: Replication) {
    let started = Instant::now();
    let Some(mut pg) = tokio::task::spawn_blocking(move || PgPair::start(mode))
        .await
        .unwrap()
    else {
        return;
    };
    let tag = match mode {
        Replication::Sync => "sync",
        Replication::Async => "async",
    };
    let pair_up = started.elapsed();
    let url = pg.url();
    // Every pairing comes from its own address behind one trusted hop, so the per-source pre-auth
    // windows (30 legs a minute) do not throttle the writers.
    let mut fleet = start_fleet_with(&url, 1, 2, &[("ORCA_RELAY_TRUSTED_PROXY_HOPS", "1")]).await;
    let fleet_up = started.elapsed();
    let director = fleet.directors[0].clone();
    let mut procs: Vec<String> = fleet.directors.clone();
    procs.extend(fleet.cell_urls.iter().cloned());
    let pids: Vec<u32> = fleet
        .dprocs
        .iter()
        .chain(fleet.cprocs.iter())
        .map(pid)
        .collect();
    let db = Db::connect_with(&url, 2, false).await.expect("test db");
    let sampler = Sampler::start(&db);

    let stop = Arc::new(AtomicBool::new(false));
    let fault = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::default()));

    // Live hosts: assign, hold the control, reconnect on close.
    let logs: Vec<Arc<Mutex<HostLog>>> = (0..HOSTS).map(|_| Arc::default()).collect();
    let live: Vec<HostIdentity> = (0..HOSTS)
        .map(|i| HostIdentity::generate(&format!("{tag}-live-{i}")))
        .collect();
    let mut tasks = Vec::new();
    for (id, log) in live.iter().zip(&logs) {
        tasks.push(tokio::spawn(run_host(
            id.clone(),
            vec![director.clone()],
            director.clone(),
            log.clone(),
            stop.clone(),
        )));
    }

    // Writers: new pairings back to back; the pairs stay open (phones spliced).
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (stop, fault, history, director) = (
            stop.clone(),
            fault.clone(),
            history.clone(),
            director.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let user = format!("{tag}-w{w}-{n}");
                n += 1;
                let r = tokio::time::timeout(
                    Duration::from_secs(15),
                    pair_once(&director, &user, &history, &fault),
                )
                .await;
                match r {
                    Ok(Ok(p)) => kept.push(p),
                    _ => history.lock().unwrap().failed_attempts += 1,
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            kept.len()
        }));
    }

    // /ready of every process every 250 ms: (ms since the crash, process, status, degraded).
    let crash_at = Arc::new(Mutex::new(None::<Instant>));
    let ready_log = Arc::new(Mutex::new(Vec::<(i128, usize, u16, bool)>::new()));
    let ready_task = {
        let (stop, procs, crash_at, log) = (
            stop.clone(),
            procs.clone(),
            crash_at.clone(),
            ready_log.clone(),
        );
        tokio::spawn(async move {
            let mut last: Vec<Option<(u16, bool)>> = vec![None; procs.len()];
            while !stop.load(Ordering::SeqCst) {
                for (i, p) in procs.iter().enumerate() {
                    let (st, body) = ready(p).await;
                    let now = (st, body.contains("degraded"));
                    if last[i] != Some(now) {
                        last[i] = Some(now);
                        let at = crash_at
                            .lock()
                            .unwrap()
                            .map(|c| c.elapsed().as_millis() as i128)
                            .unwrap_or(-1);
                        log.lock().unwrap().push((at, i, now.0, now.1));
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    wait_until("live hosts connected", Duration::from_secs(30), || {
        let logs = logs.clone();
        async move { logs.iter().all(|l| l.lock().unwrap().connected) }
    })
    .await;
    tokio::time::sleep(BEFORE).await;
    let acked_before = history.lock().unwrap().acks.len();
    assert!(acked_before > 0, "no write acknowledged before the fault");
    // Asynchronous mode: the standby stops receiving for a while first, so the primary
    // acknowledges writes the standby never gets and the failover loses them.
    let frozen = match mode {
        Replication::Async => {
            let pid = tokio::task::block_in_place(|| pg.freeze_receiver());
            tokio::time::sleep(LAG).await;
            Some(pid)
        }
        Replication::Sync => None,
    };
    let acked_before_crash = history.lock().unwrap().acks.len();
    let live_before: Vec<Option<i64>> = logs
        .iter()
        .map(|l| l.lock().unwrap().grants.iter().map(|g| g.1).max())
        .collect();
    let live_grants_before: Vec<usize> = logs
        .iter()
        .map(|l| l.lock().unwrap().grants.len())
        .collect();

    // The fault: the primary crashes, the standby is promoted.
    fault.store(true, Ordering::SeqCst);
    let crash = tokio::task::block_in_place(|| pg.crash_primary());
    *crash_at.lock().unwrap() = Some(crash);
    if let Some(pid) = frozen {
        tokio::task::block_in_place(|| pg.kill_receiver(pid));
    }
    let promoted = tokio::task::block_in_place(|| pg.promote_standby());
    let promote_took = promoted - crash;

    // Recovery: every process ready again (a fresh answer after the promotion) and a new pairing.
    let deadline = promoted + RECOVERY_BOUND;
    // A new pairing, tried from the promotion on, beside the /ready polling.
    let pairing = {
        let director = director.clone();
        tokio::spawn(async move {
            let history = Mutex::new(History::default());
            let after = AtomicBool::new(true);
            let mut errors = Vec::new();
            for attempt in 1.. {
                let user = format!("{tag}-after-{attempt}");
                match pair_once(&director, &user, &history, &after).await {
                    Ok(p) => return Ok((p, promoted.elapsed(), errors)),
                    Err(e) => {
                        errors.push((promoted.elapsed().as_millis(), e));
                        if Instant::now() >= deadline {
                            return Err(errors);
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            unreachable!()
        })
    };
    let ready_again = loop {
        let mut all = true;
        for p in &procs {
            let (st, body) = ready(p).await;
            all &= st == 200 && !body.contains("degraded");
        }
        if all {
            break promoted.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{tag}: /ready not 200 on every process {RECOVERY_BOUND:?} after the promotion: {:?}",
            ready_log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (fresh, paired_again, pair_errors) = pairing.await.unwrap().unwrap_or_else(|errors| {
        panic!("{tag}: no new pairing {RECOVERY_BOUND:?} after the promotion: {errors:?}")
    });
    wait_until("live hosts connected again", RECOVERY_BOUND, || {
        let logs = logs.clone();
        async move { logs.iter().all(|l| l.lock().unwrap().connected) }
    })
    .await;
    // Some writes on the new primary too.
    let acked_at_recovery = history.lock().unwrap().acks.len();
    wait_until("writes after the failover", Duration::from_secs(20), || {
        let h = history.clone();
        async move { h.lock().unwrap().acks.len() >= acked_at_recovery + 3 }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let mut pairs_kept = 0;
    for w in writers {
        pairs_kept += w.await.unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
    let _ = ready_task.await;
    let (samples, mut violations) = sampler.stop().await;

    // No restart: the same processes are running.
    for (p, want) in fleet
        .dprocs
        .iter_mut()
        .chain(fleet.cprocs.iter_mut())
        .zip(&pids)
    {
        let child = p.child.as_mut().expect("running");
        assert_eq!(child.id(), *want);
        assert!(
            child.try_wait().unwrap().is_none(),
            "{tag}: {} exited: {:?}",
            p.name,
            common::proc::lines(&p.log)
                .iter()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
        );
    }

    // The history against the rows of the new primary.
    let history = Arc::try_unwrap(history).ok().unwrap().into_inner().unwrap();
    let rows = db
        .query(
            "SELECT relay_host_id, assignment_epoch FROM relay_assignments",
            orca_relay::params![],
        )
        .await
        .expect("rows");
    let epochs: HashMap<String, i64> = rows.iter().map(|r| (r.str(0), r.i64(1))).collect();
    let invites: HashMap<String, i64> = db
        .query(
            "SELECT relay_host_id, COUNT(*) FROM relay_invites GROUP BY relay_host_id",
            orca_relay::params![],
        )
        .await
        .expect("invites")
        .iter()
        .map(|r| (r.str(0), r.i64(1)))
        .collect();
    let mut lost = Vec::new();
    for a in &history.acks {
        match a {
            Ack::Grant { host, epoch, .. } => {
                if epochs.get(host).is_none_or(|e| e < epoch) {
                    lost.push(a.clone());
                }
            }
            Ack::Invite { host, .. } => {
                if !invites.contains_key(host) {
                    lost.push(a.clone());
                }
            }
            Ack::Paired { host, .. } => {
                if !epochs.contains_key(host) {
                    lost.push(a.clone());
                }
            }
        }
    }
    for (i, l) in logs.iter().enumerate() {
        let last = l.lock().unwrap().grants.last().map(|g| g.1);
        if let Some(e) = last {
            if epochs
                .get(&live[i].relay_host_id)
                .is_none_or(|have| *have < e)
            {
                lost.push(Ack::Grant {
                    host: live[i].relay_host_id.clone(),
                    epoch: e,
                    after_fault: true,
                });
            }
        }
    }

    // Every host granted after the failover names an epoch above any it was seen with before.
    let mut regrants = 0;
    let mut epoch_violations = Vec::new();
    let mut check = |id: &HostIdentity, seen: Option<i64>, got: i64| {
        regrants += 1;
        if let Some(seen) = seen {
            if got <= seen {
                epoch_violations.push(format!(
                    "{}…: epoch {got} after the failover, {seen} seen before",
                    &id.relay_host_id[..8]
                ));
            }
        }
    };
    for (i, l) in logs.iter().enumerate() {
        let l = l.lock().unwrap();
        let seen = live_before[i];
        // The grants this host took after the fault (it reconnected).
        for g in &l.grants[live_grants_before[i]..] {
            check(&live[i], seen, g.1);
        }
    }
    let mut assign_retries = 0;
    let mut ids: Vec<&HostIdentity> = history.hosts.values().collect();
    ids.extend(live.iter());
    for id in ids {
        let token = id.token(SIGNING, &director);
        // A retryable 503 (the lanes' wait) is retried as a client would.
        let until = Instant::now() + Duration::from_secs(20);
        let got = loop {
            match testkit::assign(&director, &token, &id.relay_host_id).await {
                Ok((_, e)) => break e,
                Err(e) if e.contains("503") && Instant::now() < until => {
                    assign_retries += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!("{tag}: assign after the failover: {e}"),
            }
        };
        let seen = history.max_epoch_seen(&id.relay_host_id, true).or_else(|| {
            live.iter()
                .position(|l| l.relay_host_id == id.relay_host_id)
                .and_then(|i| live_before[i])
        });
        check(id, seen, got);
    }
    let moves = check_epochs(&logs);
    let bad = half_written(&db).await;
    violations.extend(bad);
    let timeline = db
        .query(
            "SELECT timeline, epoch_floor FROM relay_store_timeline",
            orca_relay::params![],
        )
        .await
        .expect("timeline row");
    let (timeline, floor) = (timeline[0].i64(0), timeline[0].i64(1));
    violations.extend(epoch_violations);

    let settled: Vec<String> = fleet
        .dprocs
        .iter()
        .chain(fleet.cprocs.iter())
        .flat_map(|p| {
            common::proc::lines(&p.log)
                .into_iter()
                .filter(|l| l.contains("orca_relay_postgres_timeline_settled"))
                .collect::<Vec<_>>()
        })
        .collect();
    let acked = history.acks.len();
    let lost_after_crash = lost
        .iter()
        .filter(|a| match a {
            Ack::Grant { after_fault, .. }
            | Ack::Invite { after_fault, .. }
            | Ack::Paired { after_fault, .. } => *after_fault,
        })
        .count();
    let writes_again = promote_took + paired_again;
    let live_regrants: usize = logs
        .iter()
        .zip(&live_grants_before)
        .map(|(l, n)| l.lock().unwrap().grants.len() - n)
        .sum();
    let grants = history
        .acks
        .iter()
        .filter(|a| matches!(a, Ack::Grant { .. }))
        .count();
    println!(
        "fault_pg_failover[{tag}]: {acked} operations acknowledged ({grants} grants, {acked_before} \
         before the fault, {acked_before_crash} before the crash, {} failed attempts), {pairs_kept} pairs held; faults injected: 1 \
         (primary stopped -m immediate, standby promoted in {} ms); /ready 200 on all 3 processes \
         {} ms and a new pairing {} ms after the promotion ({} ms after the crash); /ready transitions (ms since crash, \
         process, status, degraded): {:?}; lost acknowledged writes: {} ({lost_after_crash} acknowledged after the crash began) {:?}; {regrants} grants \
         checked after the failover ({assign_retries} retried 503s), {moves} host moves, {live_regrants} new grants of the {HOSTS} live hosts; {samples} samples; timeline now {timeline}, \
         epoch floor {floor}, settles logged by the relay: {}; pairing errors after the promotion (ms, error): {:?}; violations: {}; wall {} ms (pair up {} ms, relay up {} ms)",
        history.failed_attempts,
        promote_took.as_millis(),
        ready_again.as_millis(),
        paired_again.as_millis(),
        writes_again.as_millis(),
        ready_log.lock().unwrap(),
        lost.len(),
        lost,
        settled.len(),
        pair_errors,
        violations.len(),
        started.elapsed().as_millis(),
        pair_up.as_millis(),
        fleet_up.as_millis(),
    );
    for s in &settled {
        println!("  {s}");
    }
    assert!(violations.is_empty(), "{tag}: violations: {violations:?}");
    if mode == Replication::Sync {
        assert!(
            lost.is_empty(),
            "sync: acknowledged writes missing on the new primary: {lost:?}"
        );
    }
    drop(fresh);
    drop(db);
    for p in fleet.cprocs.iter_mut().chain(fleet.dprocs.iter_mut()) {
        p.terminate();
    }
    drop(pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_replication_failover_loses_nothing_acknowledged() {
    failover(Replication::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_replication_failover_never_repeats_an_epoch() {
    failover(Replication::Async).await;
}
