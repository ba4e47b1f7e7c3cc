//! The roll benchmark's double-serving sampler (issue 12), attributing every control lease to the
//! process that holds it.
//!
//! The invariant (docs/deploy/cluster.md, "one process serves a cell id at a time"; the seed's "the old
//! socket served by the old process while its clients go to the new cell"): no host may hold
//! unexpired, activated control leases on two cells whose processes are both running. A lease
//! belongs to a running process when its `cell_incarnation` is the incarnation that process minted
//! at start (read from the process's own `orca_relay_process_started` line, not from the runtime
//! table, which still names a stopped process until its successor's first heartbeat and does not
//! yet name a new process before it). A lease with no incarnation (re-acquired through
//! `acquireActivity`, docs/reference/websocket.md) is counted as its cell's running process's. The running set
//! of a sample is the union of the sets read just before and just after the lease query, so a
//! process that starts or stops during the query is counted as running: the sampler can only
//! over-count, never hide a violation. A lease of a process that has exited (its release never
//! landed) is reported apart: no process serves through it. So is a lease on a cell the host
//! itself closed its control to (its last event there is leaving) before the query's snapshot and
//! less than [`RELEASE_WINDOW`] (the cell's release deadline) before it: the process holds no
//! socket of the host and cannot rebind one (a draining cell refuses activations), only its
//! release has not landed yet. A lease that outlives that window counts again, so a cell that
//! does not release is still caught.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use orca_relay::store::Db;
use serde_json::Value;

use super::region::{CellNode, Node};

/// What the sampler saw.
#[derive(Default, Debug)]
pub struct RollSamples {
    pub samples: u64,
    /// Samples whose lease query failed (nothing was observed in them).
    pub failed: u64,
    /// Host-samples with activated control leases of two running processes: double serving.
    pub violations: Vec<String>,
    /// Host-samples where the second running process's lease is one the host had already left
    /// less than [`RELEASE_WINDOW`] before the query (its socket closed by the host, the cell's
    /// release not landed yet); not serving.
    pub releases_in_flight: u64,
    /// Host-samples with unexpired control leases on two cells where all but one belong to a
    /// process that has exited (a release that did not land); not serving.
    pub stopped_leases: u64,
}

/// How long after a host closed its control a cell's lease of it may still be in the table
/// without counting: the cell's release deadline (`Cell::release_activity_then`, 2 s). A lease
/// that outlives it counts as serving, so a cell that does not release is still caught.
pub const RELEASE_WINDOW: Duration = Duration::from_secs(2);

/// The sampler's verdict for one host.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Control leases on fewer than two cells.
    One,
    /// Leases of two running processes: double serving.
    Double,
    /// Two running processes' leases, but the host left all but one of them within
    /// [`RELEASE_WINDOW`].
    ReleaseInFlight,
    /// At most one running process's lease; the others are of exited processes.
    Stopped,
}

/// What a host had recorded, read right after the sample's query: when (wall clock ms) it last
/// left and last joined each cell (by URL).
#[derive(Debug, Default, Clone)]
pub struct HostView {
    pub left_at: BTreeMap<String, i64>,
    pub joined_at: BTreeMap<String, i64>,
}

/// The incarnation a node's latest process minted: the last `orca_relay_process_started` line of
/// its log (each start appends to the same log).
pub fn latest_incarnation(log: &std::sync::Mutex<Vec<String>>) -> Option<String> {
    let log = log.lock().unwrap();
    log.iter()
        .rev()
        .find(|l| l.contains("\"orca_relay_process_started\""))
        .and_then(|l| l.find('{').map(|i| &l[i..]))
        .and_then(|j| serde_json::from_str::<Value>(j).ok())
        .and_then(|v| v["incarnation"].as_str().map(str::to_owned))
}

/// Cell id → incarnations of its running process (at most one per read).
pub type Running = BTreeMap<String, BTreeSet<String>>;

/// One watched cell: its id, its node, the node's log.
type Watched = (String, Arc<Mutex<Node>>, Arc<Mutex<Vec<String>>>);

/// Adds each cell's running incarnation. A node whose lock is held is being restarted by its
/// supervisor (the old process has exited; the new one may already listen): its latest
/// incarnation counts as running. A node without a child runs nothing.
fn read_running(cells: &[Watched], into: &mut Running) {
    for (id, node, log) in cells {
        let runs = match node.try_lock() {
            Ok(n) => n.child.is_some(),
            Err(TryLockError::WouldBlock) => true,
            Err(TryLockError::Poisoned(_)) => true,
        };
        let set = into.entry(id.clone()).or_default();
        if runs {
            set.extend(latest_incarnation(log));
        }
    }
}

/// One control lease seen: cell, incarnation (None when unset), generation, ms to expiry, and
/// ms since its activation or last renewal (None when unset).
#[derive(Debug, Clone)]
pub struct LeaseSeen {
    pub cell: String,
    pub incarnation: Option<String>,
    pub generation: i64,
    pub ms_left: i64,
    pub renewed_ago: Option<i64>,
}

/// The pure verdict for one host's unexpired activated control leases, seen in a snapshot taken
/// at `snapshot_ms` (the statement's start on the database server). `url_of` maps a cell id to
/// the URL the host dialled. A running process's lease is excused only when the host's last
/// event on that cell is leaving it, no later than the snapshot and less than
/// [`RELEASE_WINDOW`] before it.
pub fn judge(
    leases: &[LeaseSeen],
    running: &Running,
    host: &HostView,
    url_of: &BTreeMap<String, String>,
    snapshot_ms: i64,
) -> Verdict {
    let cells: BTreeSet<&str> = leases.iter().map(|l| l.cell.as_str()).collect();
    if cells.len() < 2 {
        return Verdict::One;
    }
    let of_running = |l: &&LeaseSeen| {
        let run = running.get(&l.cell);
        match &l.incarnation {
            Some(i) => run.is_some_and(|r| r.contains(i)),
            None => run.is_some_and(|r| !r.is_empty()),
        }
    };
    let window = RELEASE_WINDOW.as_millis() as i64;
    let left_just_before = |l: &&LeaseSeen| {
        let Some(url) = url_of.get(&l.cell) else {
            return false;
        };
        let Some(&left) = host.left_at.get(url) else {
            return false;
        };
        let rejoined = host.joined_at.get(url).is_some_and(|&j| j > left);
        !rejoined && left <= snapshot_ms && snapshot_ms - left < window
    };
    let running_cells: BTreeSet<&str> = leases
        .iter()
        .filter(of_running)
        .map(|l| l.cell.as_str())
        .collect();
    let serving: BTreeSet<&str> = leases
        .iter()
        .filter(of_running)
        .filter(|l| !left_just_before(l))
        .map(|l| l.cell.as_str())
        .collect();
    if serving.len() > 1 {
        Verdict::Double
    } else if running_cells.len() > 1 {
        Verdict::ReleaseInFlight
    } else {
        Verdict::Stopped
    }
}

/// The hosts the sampler judges: relay host id → what the host records.
pub type Hosts = BTreeMap<String, Arc<Mutex<super::region::HostStats>>>;

fn host_views(hosts: &Hosts) -> BTreeMap<String, HostView> {
    hosts
        .iter()
        .map(|(id, s)| {
            let s = s.lock().unwrap();
            let view = HostView {
                left_at: s.left.clone(),
                joined_at: s.joined.clone(),
            };
            (id.clone(), view)
        })
        .collect()
}

/// One sample: the hosts with unexpired activated control leases on two cells, judged against
/// the running processes. `Err` when the query failed.
pub async fn sample(
    db: &Db,
    cells: &[Watched],
    hosts: &Hosts,
    url_of: &BTreeMap<String, String>,
    out: &mut RollSamples,
) -> Result<(), String> {
    let mut running = Running::new();
    read_running(cells, &mut running);
    let now = orca_relay::clock::now_ms();
    let rows = db
        .query(
            "SELECT l.user_id, l.relay_host_id, l.cell_id, l.cell_incarnation, \
             COALESCE(l.control_generation, 0), l.expires_at - $1, \
             (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT, l.renewed_at \
             FROM relay_assignment_activity_leases l \
             WHERE l.activity_kind = 'control' AND l.activity_id NOT LIKE 'control-pending:%' \
             AND l.expires_at > $1 AND (l.user_id, l.relay_host_id) IN ( \
               SELECT user_id, relay_host_id FROM relay_assignment_activity_leases \
               WHERE activity_kind = 'control' AND activity_id NOT LIKE 'control-pending:%' \
               AND expires_at > $1 GROUP BY user_id, relay_host_id HAVING COUNT(DISTINCT cell_id) > 1) \
             ORDER BY l.user_id, l.relay_host_id, l.cell_id",
            orca_relay::params![now],
        )
        .await
        .map_err(|e| e.to_string())?;
    read_running(cells, &mut running);
    // After the query: every departure that preceded the snapshot is recorded by now.
    let views = host_views(hosts);
    let snapshot_ms = rows.first().map_or(0, |r| r.i64(6));
    let mut by_host: BTreeMap<(String, String), Vec<LeaseSeen>> = BTreeMap::new();
    for r in &rows {
        by_host
            .entry((r.str(0), r.str(1)))
            .or_default()
            .push(LeaseSeen {
                cell: r.str(2),
                incarnation: r.opt_str(3),
                generation: r.i64(4),
                ms_left: r.i64(5),
                renewed_ago: r.opt_i64(7).map(|at| snapshot_ms - at),
            });
    }
    for ((_, host), leases) in by_host {
        let view = views.get(&host).cloned().unwrap_or_default();
        match judge(&leases, &running, &view, url_of, snapshot_ms) {
            Verdict::Double => {
                out.violations.push(format!(
                    "host {}: {}",
                    orca_relay::logging::digest(&host),
                    describe(&leases, &view, url_of, snapshot_ms)
                ));
            }
            Verdict::ReleaseInFlight => out.releases_in_flight += 1,
            Verdict::Stopped => out.stopped_leases += 1,
            Verdict::One => {}
        }
    }
    Ok(())
}

/// One violation's leases, each with what the host recorded on that cell, times relative to the
/// snapshot (negative: before it): `c2 inc 1a2b3c4d gen 3, 89000 ms left, renewed -1200, host
/// joined -1300 left -400`.
fn describe(
    leases: &[LeaseSeen],
    host: &HostView,
    url_of: &BTreeMap<String, String>,
    snapshot_ms: i64,
) -> String {
    let rel = |at: Option<&i64>| at.map_or("never".to_string(), |t| format!("{}", t - snapshot_ms));
    leases
        .iter()
        .map(|l| {
            let url = url_of.get(&l.cell);
            format!(
                "{} inc {} gen {}, {} ms left, renewed {}, host joined {} left {}",
                l.cell,
                l.incarnation
                    .as_deref()
                    .map_or("none".into(), |i| i.chars().take(8).collect::<String>()),
                l.generation,
                l.ms_left,
                l.renewed_ago.map_or("never".into(), |a| format!("{}", -a)),
                rel(url.and_then(|u| host.joined_at.get(u))),
                rel(url.and_then(|u| host.left_at.get(u))),
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Samples every `every` until `stop`; returns what it saw.
pub fn start_roll_sampler(
    db: Db,
    cells: &[CellNode],
    hosts: Hosts,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<RollSamples> {
    let url_of: BTreeMap<String, String> = cells
        .iter()
        .map(|c| (c.id.clone(), c.url.clone()))
        .collect();
    let cells: Vec<Watched> = cells
        .iter()
        .map(|c| {
            let log = c.node.lock().unwrap().log.clone();
            (c.id.clone(), c.node.clone(), log)
        })
        .collect();
    tokio::spawn(async move {
        let mut out = RollSamples::default();
        while !stop.load(Ordering::SeqCst) {
            if sample(&db, &cells, &hosts, &url_of, &mut out)
                .await
                .is_err()
            {
                out.failed += 1;
            }
            out.samples += 1;
            tokio::time::sleep(every).await;
        }
        out
    })
}

/// Epochs a host was granted never go down, and every move to another cell raises it.
pub fn epochs_ok(grants: &[super::region::Grant]) -> bool {
    grants.windows(2).all(|w| {
        if w[0].cell_url == w[1].cell_url {
            w[1].epoch >= w[0].epoch
        } else {
            w[1].epoch > w[0].epoch
        }
    })
}
