//! A Jepsen-style history of what the clients of a partition test saw acknowledged, plus the
//! store rows sampled meanwhile, and the checker: plain data and plain functions, so the checker
//! is tested on hand-made histories (tests/fault_partition.rs).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One observation. Hosts, cells and phones are plain names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `/v1/assign` answered 200 with this cell and epoch.
    Grant {
        host: String,
        cell: String,
        epoch: i64,
    },
    /// `host-hello-ack`: the control is active on `cell` (socket `conn`).
    ControlUp {
        host: String,
        cell: String,
        epoch: i64,
        conn: u64,
    },
    /// The control socket `conn` ended with this close code (0: transport error, no close frame).
    ControlDown {
        host: String,
        cell: String,
        conn: u64,
        code: u16,
    },
    /// `invite-created`: a credential the store acknowledged (`device` names it).
    Invite {
        host: String,
        cell: String,
        device: String,
    },
    /// `relay-hello ok`: a phone spliced to `host` through `cell`.
    SpliceStart {
        host: String,
        cell: String,
        phone: String,
    },
    SpliceEnd {
        host: String,
        cell: String,
        phone: String,
        code: u16,
    },
    /// A store snapshot of one host, read in one statement: its assignment (home cell, epoch)
    /// and the cells holding an unexpired activated control lease.
    Sample {
        host: String,
        home: Option<(String, i64)>,
        live_controls: Vec<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Milliseconds since the history started.
    pub at: u64,
    pub op: Op,
}

/// The shared, append-only record.
#[derive(Clone)]
pub struct History {
    start: Instant,
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Default for History {
    fn default() -> Self {
        History {
            start: Instant::now(),
            entries: Arc::default(),
        }
    }
}

impl History {
    pub fn record(&self, op: Op) {
        let at = self.start.elapsed().as_millis() as u64;
        self.entries.lock().unwrap().push(Entry { at, op });
    }

    /// Records `op` as of `at` (a time taken before the operation began, so that what the store
    /// showed before it started is ordered before it).
    pub fn record_at(&self, at: u64, op: Op) {
        self.entries.lock().unwrap().push(Entry { at, op });
    }

    pub fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The entries in time order (stable: equal times keep their recording order).
    pub fn entries(&self) -> Vec<Entry> {
        let mut v = self.entries.lock().unwrap().clone();
        v.sort_by_key(|e| e.at);
        v
    }
}

/// What must hold, checked over a finished history. Each violation is a readable line.
pub fn check(entries: &[Entry]) -> Vec<String> {
    let mut v = Vec::new();
    v.extend(two_open_controls(entries));
    v.extend(two_live_leases(entries));
    v.extend(epochs_go_back(entries));
    v.extend(splice_off_authority(entries));
    v.extend(served_without_lease(entries, LEASE_GRACE_MS));
    v
}

/// How long a control may stay open on a cell after the store stopped showing that cell's live
/// lease for the host: a relay-initiated close releases the lease before the host hears the
/// close (up to a 2 s release deadline), plus delivery and sampling.
pub const LEASE_GRACE_MS: u64 = 5_000;

/// A cell serving a host (its control open, as the host saw it) while the store's sampled rows
/// showed no live control lease of that cell for longer than `grace_ms`: past its lease a cell
/// no longer holds the host in the store, which may give it to another cell.
pub fn served_without_lease(entries: &[Entry], grace_ms: u64) -> Vec<String> {
    // Per host: open controls (conn -> (cell, up at, unleased since)).
    type Open<'a> = BTreeMap<u64, (&'a str, u64, Option<u64>)>;
    let mut open: BTreeMap<&str, Open> = BTreeMap::new();
    let mut out = Vec::new();
    for e in entries {
        match &e.op {
            Op::ControlUp {
                host, cell, conn, ..
            } => {
                open.entry(host)
                    .or_default()
                    .insert(*conn, (cell, e.at, None));
            }
            Op::ControlDown { host, conn, .. } => {
                if let Some(h) = open.get_mut(host.as_str()) {
                    h.remove(conn);
                }
            }
            Op::Sample {
                host,
                live_controls,
                ..
            } => {
                let Some(h) = open.get_mut(host.as_str()) else {
                    continue;
                };
                for (conn, (cell, _, since)) in h.iter_mut() {
                    if live_controls.iter().any(|c| c == cell) {
                        *since = None;
                        continue;
                    }
                    let from = *since.get_or_insert(e.at);
                    if e.at > from + grace_ms {
                        out.push(format!(
                            "host {host}: control {conn} open on {cell} with no live lease there from {from} ms to {} ms",
                            e.at
                        ));
                        // One line per episode.
                        *since = Some(u64::MAX / 2);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// A host with open controls on two cells at once, as its clients saw it.
pub fn two_open_controls(entries: &[Entry]) -> Vec<String> {
    let mut open: BTreeMap<&str, BTreeMap<u64, &str>> = BTreeMap::new();
    let mut out = Vec::new();
    for e in entries {
        match &e.op {
            Op::ControlUp {
                host, cell, conn, ..
            } => {
                let h = open.entry(host).or_default();
                if let Some((c, other)) = h.iter().find(|(_, c)| **c != cell.as_str()) {
                    out.push(format!(
                        "at {} ms host {host}: control up on {cell} while conn {c} on {other} is open",
                        e.at
                    ));
                }
                h.insert(*conn, cell);
            }
            Op::ControlDown { host, conn, .. } => {
                if let Some(h) = open.get_mut(host.as_str()) {
                    h.remove(conn);
                }
            }
            _ => {}
        }
    }
    out
}

/// A sampled host with unexpired activated control leases on two cells.
pub fn two_live_leases(entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| match &e.op {
            Op::Sample {
                host,
                live_controls,
                ..
            } if live_controls.iter().collect::<BTreeSet<_>>().len() > 1 => Some(format!(
                "at {} ms host {host}: live control leases on {live_controls:?}",
                e.at
            )),
            _ => None,
        })
        .collect()
}

/// A host granted or activated at an epoch below one it was granted before, or on another cell
/// at the same epoch (a move always raises the epoch).
pub fn epochs_go_back(entries: &[Entry]) -> Vec<String> {
    let mut last: BTreeMap<&str, (&str, i64)> = BTreeMap::new();
    let mut out = Vec::new();
    for e in entries {
        let (host, cell, epoch) = match &e.op {
            Op::Grant { host, cell, epoch }
            | Op::ControlUp {
                host, cell, epoch, ..
            } => (host.as_str(), cell.as_str(), *epoch),
            _ => continue,
        };
        if let Some((c0, e0)) = last.get(host) {
            if epoch < *e0 || (epoch == *e0 && cell != *c0) {
                out.push(format!(
                    "at {} ms host {host}: {cell}@{epoch} after {c0}@{e0}",
                    e.at
                ));
            }
        }
        if last.get(host).is_none_or(|(_, e0)| epoch >= *e0) {
            last.insert(host, (cell, epoch));
        }
    }
    out
}

/// A phone spliced through a cell that is not the host's authoritative one: the splice started
/// on a cell other than the one of the host's open control, or after a store sample showed the
/// host's home elsewhere at an epoch above the one that control was activated at.
pub fn splice_off_authority(entries: &[Entry]) -> Vec<String> {
    // Per host: the open controls (conn -> (cell, epoch)) and the newest sampled home.
    let mut open: BTreeMap<&str, BTreeMap<u64, (&str, i64)>> = BTreeMap::new();
    let mut home: BTreeMap<&str, (&str, i64)> = BTreeMap::new();
    let mut out = Vec::new();
    for e in entries {
        match &e.op {
            Op::ControlUp {
                host,
                cell,
                epoch,
                conn,
            } => {
                open.entry(host).or_default().insert(*conn, (cell, *epoch));
            }
            Op::ControlDown { host, conn, .. } => {
                if let Some(h) = open.get_mut(host.as_str()) {
                    h.remove(conn);
                }
            }
            Op::Sample {
                host,
                home: Some((c, ep)),
                ..
            } => {
                home.insert(host, (c, *ep));
            }
            Op::SpliceStart { host, cell, phone } => {
                let controls = open.get(host.as_str());
                let on = controls.and_then(|h| h.values().find(|(c, _)| *c == cell.as_str()));
                match (on, home.get(host.as_str())) {
                    (None, _) => out.push(format!(
                        "at {} ms phone {phone} spliced to {host} through {cell} with no open control there",
                        e.at
                    )),
                    (Some((_, ep)), Some((hc, hep))) if *hc != cell.as_str() && *hep > *ep => {
                        out.push(format!(
                            "at {} ms phone {phone} spliced to {host} through {cell}@{ep}, home {hc}@{hep}",
                            e.at
                        ))
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    out
}

/// Counts for the printed summary.
#[derive(Debug, Default)]
pub struct Summary {
    pub grants: usize,
    pub controls: usize,
    pub invites: usize,
    pub splices: usize,
    pub samples: usize,
    /// Close codes the controls saw, with counts.
    pub control_closes: BTreeMap<u16, usize>,
    pub splice_closes: BTreeMap<u16, usize>,
}

pub fn summary(entries: &[Entry]) -> Summary {
    let mut s = Summary::default();
    for e in entries {
        match &e.op {
            Op::Grant { .. } => s.grants += 1,
            Op::ControlUp { .. } => s.controls += 1,
            Op::Invite { .. } => s.invites += 1,
            Op::SpliceStart { .. } => s.splices += 1,
            Op::Sample { .. } => s.samples += 1,
            Op::ControlDown { code, .. } => *s.control_closes.entry(*code).or_default() += 1,
            Op::SpliceEnd { code, .. } => *s.splice_closes.entry(*code).or_default() += 1,
        }
    }
    s
}
