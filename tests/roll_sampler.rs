//! The roll benchmark's double-serving verdict (`tests/support/roll_sampler.rs`) on hand-made
//! lease sets: what counts as two running processes serving one host, and what does not.

mod support;
use support::region;
use support::roll_sampler;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use roll_sampler::*;

const A: &str = "http://127.0.0.1:1001";
const B: &str = "http://127.0.0.1:1002";

fn lease(cell: &str, inc: Option<&str>) -> LeaseSeen {
    LeaseSeen {
        cell: cell.into(),
        incarnation: inc.map(str::to_owned),
        generation: 1,
        ms_left: 80_000,
        renewed_ago: None,
    }
}

fn urls() -> BTreeMap<String, String> {
    [("c1", A), ("c2", B)]
        .iter()
        .map(|(c, u)| (c.to_string(), u.to_string()))
        .collect()
}

fn running(pairs: &[(&str, &[&str])]) -> Running {
    pairs
        .iter()
        .map(|(c, incs)| {
            (
                c.to_string(),
                incs.iter().map(|i| i.to_string()).collect::<BTreeSet<_>>(),
            )
        })
        .collect()
}

/// The snapshot's time in these cases.
const SNAP: i64 = 1_000_000;

/// Joined A long ago, then B: nothing recorded as left.
fn on_b() -> HostView {
    HostView {
        left_at: BTreeMap::new(),
        joined_at: [(A.to_string(), SNAP - 60_000), (B.to_string(), SNAP - 10)]
            .into_iter()
            .collect(),
    }
}

/// Joined A, left it `ago` ms before the snapshot, joined B.
fn left_a(ago: i64) -> HostView {
    let mut v = on_b();
    v.left_at.insert(A.into(), SNAP - ago);
    v
}

#[test]
fn one_cell_is_not_judged() {
    let r = running(&[("c1", &["i1"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c1", Some("i1"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls(), SNAP), Verdict::One);
}

#[test]
fn two_running_processes_are_double_serving() {
    let r = running(&[("c1", &["i1"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls(), SNAP), Verdict::Double);
    // A lease with no incarnation (re-acquired) counts as its cell's running process's.
    let l = [lease("c1", None), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls(), SNAP), Verdict::Double);
    // A process seen running before or after the query counts (the union of both reads).
    let r2 = running(&[("c1", &["i0", "i1"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r2, &on_b(), &urls(), SNAP), Verdict::Double);
}

#[test]
fn a_stopped_processes_lease_is_not_serving() {
    // c1 now runs i9; the lease is of i1, which has exited.
    let r = running(&[("c1", &["i9"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls(), SNAP), Verdict::Stopped);
    // c1 runs nothing: even a lease without incarnation is nobody's.
    let r = running(&[("c1", &[]), ("c2", &["i2"])]);
    let l = [lease("c1", None), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls(), SNAP), Verdict::Stopped);
}

#[test]
fn a_release_in_flight_is_excused_only_briefly() {
    let r = running(&[("c1", &["i1"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c2", Some("i2"))];
    let v = judge(&l, &r, &left_a(300), &urls(), SNAP);
    assert_eq!(v, Verdict::ReleaseInFlight);
    // Past the cell's release deadline the lease counts again: a cell that never releases is
    // caught.
    let window = RELEASE_WINDOW.as_millis() as i64;
    let v = judge(&l, &r, &left_a(window), &urls(), SNAP);
    assert_eq!(v, Verdict::Double);
    // A departure after the snapshot does not excuse what the snapshot saw.
    let v = judge(&l, &r, &left_a(-5), &urls(), SNAP);
    assert_eq!(v, Verdict::Double);
    // A host that left A, joined B, and joined A again while B's lease is still there: served
    // by both (it never left B).
    let mut back = left_a(300);
    back.joined_at.insert(B.into(), SNAP - 250);
    back.joined_at.insert(A.into(), SNAP - 100);
    assert_eq!(judge(&l, &r, &back, &urls(), SNAP), Verdict::Double);
    // …and had it left B before joining A again, B's lease is the release in flight.
    back.left_at.insert(B.into(), SNAP - 150);
    assert_eq!(
        judge(&l, &r, &back, &urls(), SNAP),
        Verdict::ReleaseInFlight
    );
}

#[test]
fn incarnation_is_read_from_the_latest_start_line() {
    let log = Mutex::new(vec![
        r#"[1 INFO  orca_relay::server] {"event":"orca_relay_process_started","incarnation":"aaaa","roles":["cell"]}"#.to_string(),
        "[2 INFO  orca_relay::server] [orca-relay] listening on http://127.0.0.1:1".to_string(),
        r#"[3 INFO  orca_relay::server] {"event":"orca_relay_process_started","incarnation":"bbbb","roles":["cell"]}"#.to_string(),
        r#"[4 INFO  orca_relay::cell] {"event":"orca_relay_host_control_activated","generation":1}"#.to_string(),
    ]);
    assert_eq!(latest_incarnation(&log).as_deref(), Some("bbbb"));
    assert_eq!(latest_incarnation(&Mutex::new(vec![])), None);
}

#[test]
fn moves_raise_the_epoch() {
    let g = |url: &str, epoch| region::Grant {
        cell_url: url.into(),
        epoch,
    };
    assert!(epochs_ok(&[g(A, 1), g(A, 1), g(B, 2), g(A, 3)]));
    assert!(
        !epochs_ok(&[g(A, 2), g(B, 2)]),
        "a move must add to the epoch"
    );
    assert!(!epochs_ok(&[g(A, 2), g(A, 1)]), "never down");
}
