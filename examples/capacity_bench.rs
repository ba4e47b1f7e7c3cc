//! Per-operation costs for the capacity model (docs/scaling.md): what one placement grant, one
//! sticky grant, one control activation, one control renewal (in the cell's batches) and one cell
//! heartbeat cost the database and the relay process, on SQLite and Postgres in one run.
//!
//! ```text
//! ORCA_RELAY_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release --example capacity_bench -- [--hosts 4000] [--rounds 3] [--concurrency 8] [--backend sqlite|postgres|both]
//! ```
//!
//! The bench drives the store operations the director and the cell run (the same functions, on a
//! fresh database: a schema of its own on Postgres, dropped afterwards; a temporary SQLite file),
//! `concurrency` tasks at a time over `hosts` hosts on 8 cells. Per operation it prints, as JSON:
//! operations per second at that concurrency, statements and round trips sent to the database
//! (counted where they leave the process), and CPU µs per operation split between this process
//! (`relay`: the store client's share of a relay's work; HTTP and WebSocket handling are not in
//! it), this process's Postgres backends and Postgres' WAL writer/background writers. Renewals are
//! sent in batches of the cell's batch size and costed per renewed control. Push accepts are
//! costed by `push_bench` (`wirePerAccept`, `cpuMicrosPerQueued`).
//! Then the steady state it implies: statements and Postgres CPU per second for `hosts` connected
//! hosts (a renewal per control every renewal interval, a heartbeat per cell every heartbeat
//! interval), the figures docs/scaling.md scales up.

#[path = "common/cpu.rs"]
mod cpu;

use std::sync::Arc;
use std::time::Instant;

use cpu::{per, CpuMeter};
use futures_util::future::join_all;
use orca_relay::contract::limits;
use orca_relay::director::assign::{assign, assign_sticky, AssignOptions};
use orca_relay::model::cell::Beat;
use orca_relay::model::Admission;
use orca_relay::store::assignments::{
    activate_control_registered, renew_control_activities, ActivateControl, HostKey,
    RenewalOutcome, RenewalRow,
};
use orca_relay::store::cells::{self, CellSpec};
use orca_relay::store::testing::TestDb;
use orca_relay::store::Db;
use serde_json::json;

const REGION: &str = "us-central1";
const CELLS: usize = 8;
const INCARNATION: &str = "00000000-0000-4000-8000-00000000000";

struct Args {
    hosts: usize,
    rounds: usize,
    concurrency: usize,
    backend: String,
}

fn args() -> Args {
    let mut a = Args {
        hosts: 4_000,
        rounds: 3,
        concurrency: 8,
        backend: "both".into(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let v = pair.get(1).cloned().unwrap_or_default();
        let n = || v.parse::<usize>().expect("a number");
        match pair[0].as_str() {
            "--hosts" => a.hosts = n(),
            "--rounds" => a.rounds = n(),
            "--concurrency" => a.concurrency = n().max(1),
            "--backend" => a.backend = v.clone(),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn now() -> i64 {
    orca_relay::clock::now_ms()
}

fn host(n: usize) -> HostKey {
    HostKey {
        user_id: format!("user-{n}"),
        relay_host_id: format!("hostid{n:010}"),
    }
}

fn cell_id(i: usize) -> String {
    format!("cell-{i}")
}

fn beat(i: usize) -> Beat {
    Beat {
        cell_id: cell_id(i),
        cell_url: format!("https://cell-{i}.cells.test"),
        region: REGION.into(),
        cell_incarnation: format!("{INCARNATION}{i}"),
        started_at: 1,
        ready: true,
        observed_requests: 0,
        telemetry: None,
    }
}

/// Eight live `general` cells with room for every host.
async fn cells(db: &Db, hosts: usize) {
    let specs: Vec<CellSpec> = (0..CELLS)
        .map(|i| CellSpec {
            cell_id: cell_id(i),
            cell_url: format!("https://cell-{i}.cells.test"),
            region: REGION.into(),
            capacity_requests: (hosts * 4) as i64,
            cap_and_bound: None,
            initial_state: Admission::General,
        })
        .collect();
    cells::upsert_all(db, &specs, now()).await.unwrap();
    for i in 0..CELLS {
        orca_relay::director::heartbeat::apply(db, &beat(i), now())
            .await
            .unwrap();
    }
}

/// What one phase measured.
struct Phase {
    name: &'static str,
    ops: usize,
    seconds: f64,
    figures: serde_json::Value,
}

/// Runs `items` through `op`, `concurrency` at a time, and costs the phase per operation.
async fn phase<T, F, Fut>(
    name: &'static str,
    db: &Db,
    meter: &CpuMeter,
    concurrency: usize,
    items: Vec<T>,
    ops_per_item: impl Fn(&T) -> usize,
    op: F,
) -> Phase
where
    T: Send + 'static,
    F: Fn(Db, T) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let ops: usize = items.iter().map(&ops_per_item).sum();
    let op = Arc::new(op);
    let mut lanes: Vec<Vec<T>> = (0..concurrency).map(|_| Vec::new()).collect();
    for (i, it) in items.into_iter().enumerate() {
        lanes[i % concurrency].push(it);
    }
    let (cpu0, wire0, t0) = (meter.sample(db).await, db.wire_stats(), Instant::now());
    join_all(lanes.into_iter().map(|lane| {
        let (db, op) = (db.clone(), op.clone());
        tokio::spawn(async move {
            for it in lane {
                op(db.clone(), it).await;
            }
        })
    }))
    .await
    .into_iter()
    .for_each(|r| r.unwrap());
    let seconds = t0.elapsed().as_secs_f64();
    let (cpu1, wire1) = (meter.sample(db).await, db.wire_stats());
    Phase {
        name,
        ops,
        seconds,
        figures: json!({
            "operations": ops,
            "perSecond": (ops as f64 / seconds).round(),
            "wire": per(wire1 - wire0, ops),
            "cpuMicros": cpu1.minus(&cpu0).per(ops),
        }),
    }
}

/// One round of every operation over `hosts` fresh hosts.
async fn round(db: &Db, meter: &CpuMeter, a: &Args, first: usize) -> Vec<Phase> {
    let hosts: Vec<usize> = (first..first + a.hosts).collect();
    let regions = Arc::new(vec![REGION.to_string()]);
    let c = a.concurrency;
    let mut out = Vec::new();
    let r = regions.clone();
    out.push(
        phase(
            "placementGrant",
            db,
            meter,
            c,
            hosts.clone(),
            |_| 1,
            move |db, n| {
                let r = r.clone();
                async move {
                    assign(&db, &host(n), None, &r, AssignOptions::default())
                        .await
                        .expect("placement grant");
                }
            },
        )
        .await,
    );
    let r = regions.clone();
    out.push(
        phase(
            "stickyGrant",
            db,
            meter,
            c,
            hosts.clone(),
            |_| 1,
            move |db, n| {
                let r = r.clone();
                async move {
                    assign_sticky(&db, &host(n), None, &r)
                        .await
                        .expect("sticky grant");
                }
            },
        )
        .await,
    );
    // Activations: each host's control on the cell its grant named.
    let mut homes = Vec::with_capacity(hosts.len());
    for &n in &hosts {
        let row = orca_relay::store::assignments::read_row(db, &host(n))
            .await
            .unwrap()
            .expect("a placed host has a row");
        homes.push((n, row.cell_id, row.assignment_epoch));
    }
    out.push(
        phase(
            "controlActivation",
            db,
            meter,
            c,
            homes.clone(),
            |_| 1,
            |db, (n, cell, epoch)| async move {
                let i: usize = cell.trim_start_matches("cell-").parse().unwrap();
                let req = ActivateControl {
                    cell_id: cell,
                    assignment_epoch: epoch,
                    generation: 1,
                    connection_inclusion_watermark: None,
                    idle_regional_rehome: false,
                    cell_incarnation: format!("{INCARNATION}{i}"),
                };
                // The cell's activation step: the lease and the migration registration.
                activate_control_registered(&db, &host(n), &req, now())
                    .await
                    .expect("activation");
            },
        )
        .await,
    );
    // Renewals in the cell's batches: one batch per cell per RENEWAL_BATCH_ROWS controls.
    let mut batches: Vec<(String, Vec<usize>)> = Vec::new();
    for i in 0..CELLS {
        let mine: Vec<usize> = homes
            .iter()
            .filter(|(_, cell, _)| *cell == cell_id(i))
            .map(|(n, _, _)| *n)
            .collect();
        for chunk in mine.chunks(limits::RENEWAL_BATCH_ROWS) {
            batches.push((cell_id(i), chunk.to_vec()));
        }
    }
    out.push(
        phase(
            "controlRenewal",
            db,
            meter,
            c,
            batches,
            |b| b.1.len(),
            |db, (cell, ns)| async move {
                let i: usize = cell.trim_start_matches("cell-").parse().unwrap();
                let at = now();
                let rows: Vec<RenewalRow> = ns
                    .iter()
                    .map(|n| RenewalRow {
                        host: host(*n),
                        activity_id: format!("control:{cell}:1"),
                        expires_at: at + limits::CONTROL_RENEWAL_REQUEST_MS,
                    })
                    .collect();
                let outcomes =
                    renew_control_activities(&db, &cell, &format!("{INCARNATION}{i}"), &rows, at)
                        .await;
                assert!(
                    outcomes.iter().all(|o| *o == RenewalOutcome::Renewed),
                    "renewal outcomes {outcomes:?}"
                );
            },
        )
        .await,
    );
    let beats: Vec<usize> = (0..CELLS * 50).map(|k| k % CELLS).collect();
    out.push(
        phase(
            "heartbeat",
            db,
            meter,
            c.min(CELLS),
            beats,
            |_| 1,
            |db, i| async move {
                orca_relay::director::heartbeat::apply(&db, &beat(i), now())
                    .await
                    .expect("heartbeat");
            },
        )
        .await,
    );
    out
}

/// The median of one figure (by its path) over the rounds.
fn median(rounds: &[Vec<Phase>], name: &str, path: &[&str]) -> f64 {
    let mut v: Vec<f64> = rounds
        .iter()
        .filter_map(|r| r.iter().find(|p| p.name == name))
        .filter_map(|p| {
            let mut x = &p.figures;
            for k in path {
                x = x.get(*k)?;
            }
            x.as_f64()
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Steady state for `hosts` connected hosts: renewals every interval, heartbeats per cell.
fn steady_state(rounds: &[Vec<Phase>], hosts: usize) -> serde_json::Value {
    let renewals_per_s = hosts as f64 / (limits::CONTROL_RENEWAL_INTERVAL_MS as f64 / 1e3);
    let beats_per_s = CELLS as f64 / (limits::HEARTBEAT_INTERVAL_MS as f64 / 1e3);
    let cost = |name: &str, path: &[&str]| median(rounds, name, path);
    let pg = |name: &str| {
        cost(name, &["cpuMicros", "postgresBackends"])
            + cost(name, &["cpuMicros", "postgresWalAndWriters"])
    };
    let pg_cores = (renewals_per_s * pg("controlRenewal") + beats_per_s * pg("heartbeat")) / 1e6;
    let statements = renewals_per_s * cost("controlRenewal", &["wire", "statements"])
        + beats_per_s * cost("heartbeat", &["wire", "statements"]);
    json!({
        "hosts": hosts,
        "cells": CELLS,
        "renewalsPerSecond": renewals_per_s.round(),
        "heartbeatsPerSecond": (beats_per_s * 100.0).round() / 100.0,
        "statementsPerSecond": statements.round(),
        "postgresCores": (pg_cores * 1000.0).round() / 1000.0,
    })
}

async fn bench(backend: &str, t: &TestDb, a: &Args) -> serde_json::Value {
    let db = &t.db;
    cells(db, a.hosts * a.rounds).await;
    let meter = CpuMeter::new(&[]);
    let mut rounds = Vec::new();
    for k in 0..a.rounds {
        let phases = round(db, &meter, a, k * a.hosts).await;
        for p in &phases {
            eprintln!(
                "{backend} round {k} {}: {} ops in {:.2} s {}",
                p.name, p.ops, p.seconds, p.figures
            );
        }
        rounds.push(phases);
    }
    let names = [
        "placementGrant",
        "stickyGrant",
        "controlActivation",
        "controlRenewal",
        "heartbeat",
    ];
    let mut medians = serde_json::Map::new();
    for name in names {
        let m = |path: &[&str]| median(&rounds, name, path);
        medians.insert(
            name.into(),
            json!({
                "perSecond": m(&["perSecond"]),
                "statements": m(&["wire", "statements"]),
                "roundTrips": m(&["wire", "roundTrips"]),
                "relayCpuMicros": m(&["cpuMicros", "relay"]),
                "postgresCpuMicros": m(&["cpuMicros", "postgresBackends"]),
                "postgresWalCpuMicros": m(&["cpuMicros", "postgresWalAndWriters"]),
            }),
        );
    }
    json!({
        "backend": backend,
        "hosts": a.hosts,
        "rounds": a.rounds,
        "concurrency": a.concurrency,
        "load": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "medians": medians,
        "steadyState": steady_state(&rounds, a.hosts),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let mut dbs = Vec::new();
    if a.backend != "postgres" {
        dbs.push(("sqlite", TestDb::sqlite().await));
    }
    if a.backend != "sqlite" {
        match TestDb::postgres().await {
            Some(t) => dbs.push(("postgres", t)),
            None if a.backend == "postgres" => {
                panic!("--backend postgres needs ORCA_RELAY_TEST_POSTGRES_URL")
            }
            None => eprintln!("postgres skipped: ORCA_RELAY_TEST_POSTGRES_URL is unset"),
        }
    }
    for (name, t) in &dbs {
        println!("{}", bench(name, t, &a).await);
    }
}
