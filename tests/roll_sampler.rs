//! The roll benchmark's double-serving verdict (`tests/support/roll_sampler.rs`) on hand-made
//! lease sets: what counts as two running processes serving one host, and what does not.

#[path = "support/region.rs"]
mod region;
#[path = "support/roll_sampler.rs"]
mod roll_sampler;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use roll_sampler::*;

const A: &str = "http://127.0.0.1:1001";
const B: &str = "http://127.0.0.1:1002";

fn lease(cell: &str, inc: Option<&str>) -> LeaseSeen {
    LeaseSeen {
        cell: cell.into(),
        incarnation: inc.map(str::to_owned),
        generation: 1,
        ms_left: 80_000,
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

fn on_b() -> HostView {
    HostView {
        connected_to: Some(B.into()),
        left_ago: BTreeMap::new(),
    }
}

fn left_a(ago: Duration) -> HostView {
    HostView {
        connected_to: Some(B.into()),
        left_ago: [(A.to_string(), ago)].into_iter().collect(),
    }
}

#[test]
fn one_cell_is_not_judged() {
    let r = running(&[("c1", &["i1"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c1", Some("i1"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls()), Verdict::One);
}

#[test]
fn two_running_processes_are_double_serving() {
    let r = running(&[("c1", &["i1"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls()), Verdict::Double);
    // A lease with no incarnation (re-acquired) counts as its cell's running process's.
    let l = [lease("c1", None), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls()), Verdict::Double);
    // A process seen running before or after the query counts (the union of both reads).
    let r2 = running(&[("c1", &["i0", "i1"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r2, &on_b(), &urls()), Verdict::Double);
}

#[test]
fn a_stopped_processes_lease_is_not_serving() {
    // c1 now runs i9; the lease is of i1, which has exited.
    let r = running(&[("c1", &["i9"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls()), Verdict::Stopped);
    // c1 runs nothing: even a lease without incarnation is nobody's.
    let r = running(&[("c1", &[]), ("c2", &["i2"])]);
    let l = [lease("c1", None), lease("c2", Some("i2"))];
    assert_eq!(judge(&l, &r, &on_b(), &urls()), Verdict::Stopped);
}

#[test]
fn a_release_in_flight_is_excused_only_briefly() {
    let r = running(&[("c1", &["i1"]), ("c2", &["i2"])]);
    let l = [lease("c1", Some("i1")), lease("c2", Some("i2"))];
    let v = judge(&l, &r, &left_a(Duration::from_millis(300)), &urls());
    assert_eq!(v, Verdict::ReleaseInFlight);
    // Past the cell's release deadline the lease counts again: a cell that never releases is
    // caught.
    let v = judge(&l, &r, &left_a(RELEASE_WINDOW), &urls());
    assert_eq!(v, Verdict::Double);
    // A host connected to the old cell again is served there, however recently it left it.
    let back = HostView {
        connected_to: Some(A.into()),
        left_ago: [(A.to_string(), Duration::from_millis(10))]
            .into_iter()
            .collect(),
    };
    assert_eq!(judge(&l, &r, &back, &urls()), Verdict::Double);
    // Left the other one just now: that one is the release in flight.
    let back = HostView {
        connected_to: Some(A.into()),
        left_ago: [(B.to_string(), Duration::from_millis(10))]
            .into_iter()
            .collect(),
    };
    assert_eq!(judge(&l, &r, &back, &urls()), Verdict::ReleaseInFlight);
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
