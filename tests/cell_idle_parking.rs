//! Idle parking of control sockets (issue 12, memory per idle socket): a control that is quiet for
//! a sweep round gives its codec back, and a parked control still serves both directions — a
//! host command wakes it from the socket side, a `conn-open` for a new phone wakes it from the
//! relay side — and parks again once quiet. Its pairs' splices park too and still forward.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use orca_relay::cell::testkit;
use support::node::*;
use tokio_tungstenite::tungstenite::Message;

/// Control parks so far on the server's cell.
fn control_parks(s: &Server) -> i64 {
    let cell = s.running.cell.as_ref().expect("cell role");
    cell.counts.control_parks.load(Ordering::Relaxed)
}

/// Waits (up to 10 s: parking takes two 1 s sweep rounds) until the cell counted more than `n`
/// control parks.
async fn parked_after(s: &Server, n: i64) -> i64 {
    let ok = real_eventually(Duration::from_secs(10), || control_parks(s) > n).await;
    assert!(ok, "no control parked (still {n})");
    control_parks(s)
}

#[tokio::test]
async fn a_parked_control_serves_both_directions() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "parking").await;
        let mut c = host.connect(&s).await;
        let parks = parked_after(&s, 0).await;

        // Socket side: a command on a parked control is read and answered.
        let invite = c.create_invite("r1", "d1").await.expect("invite");
        let parks = parked_after(&s, parks).await;

        // Relay side: a phone's `conn-open` goes out on a parked control; the pair splices.
        let mut pair =
            testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
                .await
                .expect("pair");
        let parks = parked_after(&s, parks).await;

        // The control still answers after several parks, and the (idle, parked) splice forwards
        // both ways.
        c.create_invite("r2", "d2").await.expect("second invite");
        parked_after(&s, parks).await;
        pair.phone.send(Message::text("up")).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), pair.data.next())
            .await
            .expect("frame to host")
            .expect("open")
            .unwrap();
        assert_eq!(got, Message::text("up"));
        pair.data
            .send(Message::binary(vec![1u8, 2, 3]))
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), pair.phone.next())
            .await
            .expect("frame to phone")
            .expect("open")
            .unwrap();
        assert_eq!(got, Message::binary(vec![1u8, 2, 3]));
        s.running.shutdown().await;
    }
}
