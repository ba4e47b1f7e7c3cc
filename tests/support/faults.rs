//! Shared pieces of the fault, soak, abuse and log-scan tests (issue 11), on top of
//! `support/cluster` (include that module as `cluster` beside this one): kill -9, the
//! double-serving sampler, epoch checks over what hosts saw, a single-node process, a spliced
//! pair on a given cell, an echo round trip, `/metrics` scraping and the log scan.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orca_relay::cell::testkit::{self, Hello, HostControl, HostIdentity, Pair};
use orca_relay::store::Db;

use super::cluster::{double_served, free_port, HostLog, Proc, ADMIN, CLUSTER, SIGNING};

/// SIGKILL (no shutdown path runs) and reap; returns when the process is gone.
pub fn kill9(p: &mut Proc) -> Instant {
    let mut child = p.child.take().expect("running");
    let _ = child.kill();
    let _ = child.wait();
    Instant::now()
}

pub fn pid(p: &Proc) -> u32 {
    p.child.as_ref().expect("running").id()
}

/// Samples [`double_served`] every 50 ms until finished: no host may ever have live control
/// leases on two cells.
pub struct LeaseSampler {
    stop: Arc<AtomicBool>,
    violations: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<u64>,
}

impl LeaseSampler {
    pub fn start(db: Db) -> LeaseSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (stop.clone(), violations.clone());
        let task = tokio::spawn(async move {
            let mut n = 0u64;
            while !s.load(Ordering::SeqCst) {
                let bad = double_served(&db).await;
                v.lock().unwrap().extend(bad);
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            n
        });
        LeaseSampler {
            stop,
            violations,
            task,
        }
    }

    /// Stops sampling; (samples taken, violations seen).
    pub async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        let n = self.task.await.unwrap();
        let v = self.violations.lock().unwrap().clone();
        (n, v)
    }
}

/// Asserts that every host's epochs never went down and rose on every move between cells;
/// returns the number of moves.
pub fn check_epochs(logs: &[Arc<Mutex<HostLog>>]) -> usize {
    let mut moves = 0;
    for (i, log) in logs.iter().enumerate() {
        let l = log.lock().unwrap();
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
    }
    moves
}

/// The last cell each host was granted, by host index.
pub fn current_cells(logs: &[Arc<Mutex<HostLog>>]) -> Vec<Option<String>> {
    logs.iter()
        .map(|l| l.lock().unwrap().grants.last().map(|g| g.0.clone()))
        .collect()
}

/// A single node (`--role all`) on `db_url` on a free loopback port, not started yet.
pub fn single_node(
    name: &str,
    db_url: &str,
    data_dir: &str,
    extra: &[(&str, &str)],
) -> (Proc, String) {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut envs = vec![
        ("ORCA_RELAY_DATABASE_URL".to_string(), db_url.to_string()),
        ("ORCA_RELAY_DATA_DIR".into(), data_dir.into()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY".into(), SIGNING.into()),
        ("ORCA_RELAY_CLUSTER_KEY".into(), CLUSTER.into()),
        ("ORCA_RELAY_ADMIN_TOKEN".into(), ADMIN.into()),
        ("ORCA_RELAY_PUBLIC_URL".into(), url.clone()),
    ];
    for (k, v) in extra {
        envs.push((k.to_string(), v.to_string()));
    }
    let p = Proc::new(
        name,
        vec![
            "--role".into(),
            "all".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
        ],
        envs,
    );
    (p, url)
}

/// A host assigned by `director`, its control on the granted cell, one invite and one phone
/// paired through it: (host, control, the pair, cell url, epoch).
pub async fn spliced(
    director: &str,
    public_url: &str,
    user: &str,
) -> Result<(HostIdentity, HostControl, Pair, String, i64), String> {
    let host = HostIdentity::generate(user);
    let token = host.token(SIGNING, public_url);
    let (cell, epoch) = testkit::assign(director, &token, &host.relay_host_id).await?;
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let mut control = testkit::connect_control(&cell, &host, &token, public_url, &hello)
        .await
        .map_err(|e| format!("control {e:?}"))?;
    let invite = control
        .create_invite("r1", "d1")
        .await
        .map_err(|e| format!("invite {e}"))?;
    let pair = testkit::pair_phone(&cell, &mut control, &host.relay_host_id, &invite, &[]).await?;
    Ok((host, control, pair, cell, epoch))
}

/// One text frame each way through a splice, within `within`.
pub async fn echo(pair: &mut Pair, tag: &str, within: Duration) -> Result<(), String> {
    pair.echo(tag, within).await
}

/// `/metrics` of a cluster process as name (with labels, as printed) → value.
pub async fn scrape(url: &str) -> HashMap<String, f64> {
    super::common::metrics::scrape(url, ADMIN).await
}

/// The process's own RSS (bytes), open fds and live runtime tasks, from its `/metrics`.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub rss: f64,
    pub fds: f64,
    pub tasks: f64,
}

pub async fn usage(url: &str) -> Usage {
    let m = scrape(url).await;
    let get = |n: &str| {
        *m.get(n)
            .unwrap_or_else(|| panic!("{n} missing from /metrics"))
    };
    Usage {
        rss: get("process_resident_memory_bytes"),
        fds: get("process_open_fds"),
        tasks: get("orca_relay_runtime_alive_tasks"),
    }
}

/// Lines of `log` holding any of `needles` (label, secret): (label, line) for each hit.
pub fn scan(log: &[String], needles: &[(String, String)]) -> Vec<(String, String)> {
    let mut hits = Vec::new();
    for line in log {
        for (label, secret) in needles {
            if !secret.is_empty() && line.contains(secret.as_str()) {
                hits.push((label.clone(), line.clone()));
            }
        }
    }
    hits
}

/// N directors + M cells as separate processes: the cluster harness's `start_fleet` under the name
/// the fault tests use.
#[allow(unused_imports)] // each test binary includes this module and uses a part of it
pub use super::cluster::start_fleet as start_shape;

/// Store rows that only a half-finished write could leave: an assignment whose reservation
/// counters disagree with its leases, a lease without its assignment, an assignment or lease on
/// an unknown cell, a cell whose reserved requests disagree with the units its leases hold.
pub async fn half_written(db: &Db) -> Vec<String> {
    let mut bad = Vec::new();
    let q = |sql: &'static str| async move { db.query(sql, orca_relay::params![]).await.unwrap() };
    for r in q("SELECT a.relay_host_id, a.reserved_controls, a.reserved_splices, a.reserved_invites, \
                (SELECT COUNT(*) FROM relay_assignment_activity_leases l WHERE l.user_id = a.user_id \
                   AND l.relay_host_id = a.relay_host_id AND l.activity_kind = 'control'), \
                (SELECT COUNT(*) FROM relay_assignment_activity_leases l WHERE l.user_id = a.user_id \
                   AND l.relay_host_id = a.relay_host_id AND l.activity_kind = 'splice'), \
                (SELECT COUNT(*) FROM relay_assignment_activity_leases l WHERE l.user_id = a.user_id \
                   AND l.relay_host_id = a.relay_host_id AND l.activity_kind = 'invite') \
                FROM relay_assignments a")
    .await
    {
        let (stored, counted) = (
            (r.i64(1), r.i64(2), r.i64(3)),
            (r.i64(4), r.i64(5), r.i64(6)),
        );
        if stored != counted {
            bad.push(format!(
                "{}: counters {stored:?} but leases {counted:?}",
                &r.str(0)[..8]
            ));
        }
    }
    for r in q(
        "SELECT l.relay_host_id, l.activity_id FROM relay_assignment_activity_leases l \
                WHERE NOT EXISTS (SELECT 1 FROM relay_assignments a WHERE a.user_id = l.user_id \
                AND a.relay_host_id = l.relay_host_id)",
    )
    .await
    {
        bad.push(format!("lease {} without an assignment", r.str(1)));
    }
    for r in q("SELECT relay_host_id, cell_id FROM relay_assignments \
                WHERE cell_id NOT IN (SELECT cell_id FROM relay_cells)")
    .await
    {
        bad.push(format!("assignment on unknown cell {}", r.str(1)));
    }
    for r in q("SELECT c.cell_id, c.reserved_requests, \
                (SELECT CAST(COALESCE(SUM(l.request_units), 0) AS BIGINT) FROM relay_assignment_activity_leases l \
                 WHERE l.cell_id = c.cell_id) FROM relay_cells c")
    .await
    {
        if r.i64(1) != r.i64(2) {
            bad.push(format!(
                "cell {}: reserved_requests {} but leases hold {}",
                r.str(0),
                r.i64(1),
                r.i64(2)
            ));
        }
    }
    bad
}
