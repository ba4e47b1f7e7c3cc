//! Host sessions over real sockets on both backends: rebind and generations (P-30, P-31, P-35),
//! `auth-refresh` (P-33), attach deadline (P-23), orphan grace (P-32), drain (P-36, P-37) and
//! shutdown (P-38).

mod support;

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use orca_relay::cell::session::State;
use orca_relay::cell::testkit::{self, recv_close, recv_json, ClientWs, Hello};
use orca_relay::clock::now_ms;
use serde_json::json;
use support::node::*;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn rebind_keeps_splices_new_generation_replaces() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "rebind").await;
        let mut c1 = host.connect(&s).await;
        let invite = c1.create_invite("r1", "d1").await.unwrap();
        let mut p = testkit::pair_phone(&s.cell_url, &mut c1, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        // P-30: drop the control TCP, reconnect with the secret.
        let secret = c1.secret.clone();
        drop(c1);
        assert!(
            eventually(SEC * 5, || s.session_state(&host.key())
                == Some(State::Orphaned))
            .await,
            "the cell saw the control go"
        );
        let hello = Hello {
            resume_secret: Some(secret.clone()),
            previous_generation: Some(1),
            ..host.hello()
        };
        let mut c2 = host.connect_with(&s, &hello).await.expect("rebind");
        assert_eq!(c2.generation, 1);
        assert_eq!(c2.secret, secret);
        assert!(c2.resumed, "resumeRequested = 1");
        assert_eq!(c2.ack["activeConnIds"], json!([p.conn_id]));
        p.phone.send(Message::text("after rebind")).await.unwrap();
        assert_eq!(
            p.data.next().await.unwrap().unwrap(),
            Message::text("after rebind")
        );
        // Rebinding while the old control is open closes it 4408 control rebound.
        let mut c3 = host.connect_with(&s, &hello).await.expect("second rebind");
        assert_eq!(
            recv_close(&mut c2.ws, SEC * 5).await,
            (4408, "control rebound".into())
        );
        assert_eq!(c3.generation, 1);
        // P-35: a pending phone shows in pendingConns; details only with the capability.
        let inv2 = c3.create_invite("r2", "d2").await.unwrap();
        let mut pending_phone =
            testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &inv2, &[])
                .await
                .unwrap();
        let open = c3.recv(SEC * 5).await.unwrap();
        let plain = host.connect_with(&s, &hello).await.unwrap();
        assert_eq!(
            plain.ack["pendingConns"],
            json!([{"connId": open["connId"], "connTicket": open["connTicket"]}])
        );
        let detailed = Hello {
            capabilities: vec!["pending-conn-details".into()],
            ..hello.clone()
        };
        let mut c4 = host.connect_with(&s, &detailed).await.unwrap();
        assert_eq!(
            c4.ack["pendingConns"],
            json!([{"connId": open["connId"], "connTicket": open["connTicket"], "kind": "invite", "relayDeviceId": "d2"}])
        );
        // P-31: a control without the secret → generation 2; the old control, splices and pending phones 4408.
        let c5 = host.connect(&s).await;
        assert_eq!(c5.generation, 2);
        assert_ne!(c5.secret, secret);
        assert_eq!(
            recv_close(&mut c4.ws, SEC * 5).await,
            (4408, "replaced by a newer generation".into())
        );
        assert_eq!(
            recv_close(&mut p.phone, SEC * 5).await,
            (4408, "peer connection dropped".into())
        );
        assert_eq!(
            recv_close(&mut p.data, SEC * 5).await,
            (4408, "peer connection dropped".into())
        );
        assert_eq!(
            recv_json(&mut pending_phone, SEC * 5).await.unwrap(),
            json!({"type":"relay-hello","ok":false,"code":4408})
        );
        assert_eq!(recv_close(&mut pending_phone, SEC * 2).await.0, 4408);
        s.running.shutdown().await;
    }
}

#[tokio::test]
async fn auth_refresh_identity_rules() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "refresh").await;
        let mut c = host.connect(&s).await;
        // Valid refresh → no reply; invalid payload ignored.
        c.send(json!({"type":"auth-refresh","relayJwt": host.id.token(SIGNING, &s.public_url)}))
            .await;
        c.send(json!({"type":"auth-refresh"})).await;
        c.send(json!({"type":"nope"})).await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap()["code"],
            "unknown_control_message"
        );
        // P-33: another sub → 4401 refresh identity changed.
        let other = orca_relay::cell::testkit::HostIdentity {
            user_id: "someone-else".into(),
            ..host.id.clone()
        };
        c.send(json!({"type":"auth-refresh","relayJwt": other.token(SIGNING, &s.public_url)}))
            .await;
        assert_eq!(
            recv_close(&mut c.ws, SEC * 5).await,
            (4401, "refresh identity changed".into())
        );
        let mut c = host.connect(&s).await;
        c.send(json!({"type":"auth-refresh","relayJwt": "not-a-jwt"}))
            .await;
        assert_eq!(
            recv_close(&mut c.ws, SEC * 5).await,
            (4401, "refresh identity changed".into())
        );
        s.running.shutdown().await;
    }
}

/// P-23: the host ignores `conn-open` → phone 4404 at 10 s ± 0.5 s; immediate retry → 4401;
/// after 2 s reservable again. On manual time: the deadline fires where the test moves the clock.
#[tokio::test(start_paused = true)]
async fn attach_deadline_and_invite_cooldown() {
    let mut time = ManualTime::start();
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "deadline").await;
        let mut c = host.connect(&s).await;
        let invite = c.create_invite("r1", "d1").await.unwrap();
        let mut phone = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        let open = next(&mut c.ws).await.unwrap();
        assert_eq!(open["type"], "conn-open");
        let t = now_ms();
        // Nothing at 9.5 s (the barrier lets every timer due by then run)…
        time.advance(Duration::from_millis(9_500)).await;
        barrier(&mut c).await;
        assert!(
            futures_util::FutureExt::now_or_never(phone.next()).is_none(),
            "the phone heard something before the deadline"
        );
        // …the refusal by 10 s.
        time.advance(Duration::from_millis(500)).await;
        assert_eq!(
            next(&mut phone).await.unwrap(),
            json!({"type":"relay-hello","ok":false,"code":4404})
        );
        let el = now_ms() - t;
        assert!((9_500..=10_750).contains(&el), "{el} ms");
        assert_eq!(
            next(&mut phone).await,
            Err((4404, "relay connection rejected".into()))
        );
        let mut again = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        assert_eq!(next(&mut again).await.unwrap()["code"], 4401);
        // The 2 s cooldown, on the clock.
        time.advance(Duration::from_millis(2_100)).await;
        let p =
            testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[]).await;
        assert!(p.is_ok(), "{:?}", p.err());
        time.auto(s.running.shutdown()).await;
    }
    time.resume();
}

/// The next text frame (or the close) of a socket, failing after 20 s of real time: under
/// manual time a tokio timeout never fires, so `recv_json`'s own is set out of reach.
async fn next(ws: &mut ClientWs) -> Result<serde_json::Value, (u16, String)> {
    real_deadline(SEC * 20, "next frame", recv_json(ws, SEC * 3_600)).await
}

/// P-32: control gone for good → splices 4408 at 30 s ± 1 s; new phone → 4404. On manual time.
#[tokio::test(start_paused = true)]
async fn orphan_grace_closes_splices() {
    let time = ManualTime::start();
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "orphan").await;
    let mut c = host.connect(&s).await;
    let invite = c.create_invite("r1", "d1").await.unwrap();
    let inv2 = c.create_invite("r2", "d2").await.unwrap();
    let mut p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
        .await
        .unwrap();
    c.ws.close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
        code: 1000u16.into(),
        reason: "signed-out".into(),
    }))
    .await
    .unwrap();
    // The grace starts when the cell has seen the close.
    assert!(
        real_eventually(SEC * 5, || s.session_state(&host.key())
            == Some(State::Orphaned))
        .await
    );
    let t = now_ms();
    // During the grace: the splice keeps forwarding, new phones get 4404 signed-out.
    p.phone.send(Message::text("still here")).await.unwrap();
    assert_eq!(
        next(&mut p.data).await,
        Err((0, "not JSON: still here".into()))
    );
    let mut late = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &inv2, &[])
        .await
        .unwrap();
    assert_eq!(next(&mut late).await.unwrap()["code"], 4404);
    assert_eq!(next(&mut late).await, Err((4404, "signed-out".into())));
    // Still forwarding at 29 s…
    time.advance(SEC * 29).await;
    p.phone.send(Message::text("at 29 s")).await.unwrap();
    assert_eq!(
        next(&mut p.data).await,
        Err((0, "not JSON: at 29 s".into()))
    );
    // …closed by 30 s.
    time.advance(SEC).await;
    assert_eq!(
        next(&mut p.phone).await,
        Err((4408, "peer connection dropped".into()))
    );
    let el = now_ms() - t;
    assert!((29_000..=31_250).contains(&el), "{el} ms");
    time.resume();
    s.running.shutdown().await;
}

fn drain_req(s: &Server, body: serde_json::Value, bearer: Option<&str>) -> reqwest::RequestBuilder {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/admin/drain", s.url))
        .json(&body);
    match bearer {
        Some(b) => r.bearer_auth(b),
        None => r,
    }
}

/// P-36: drain with grace 2 s. On manual time.
#[tokio::test(start_paused = true)]
async fn drain_tells_hosts_then_closes() {
    let mut time = ManualTime::start();
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "drain").await;
        let mut c = host.connect(&s).await;
        let invite = c.create_invite("r1", "d1").await.unwrap();
        let inv2 = c.create_invite("r2", "d2").await.unwrap();
        let mut p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        let r = drain_req(&s, json!({"v":1,"graceMs":2000}), None)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        let r = drain_req(&s, json!({"v":1,"graceMs":3600001}), Some(ADMIN))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let t = now_ms();
        let r = drain_req(&s, json!({"v":1,"graceMs":2000}), Some(ADMIN))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.json::<serde_json::Value>().await.unwrap(),
            json!({"ok":true,"paceWindowMs":0})
        );
        assert_eq!(
            next(&mut c.ws).await.unwrap(),
            json!({"type":"drain","graceMs":2000,"recovery":"resolve-director"})
        );
        let mut phone = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &inv2, &[])
            .await
            .unwrap();
        assert_eq!(next(&mut phone).await.unwrap()["code"], 4503);
        let r = host.connect_with(&s, &host.hello()).await;
        assert_eq!(r.err(), Some((4503, "relay draining".into())));
        // The splice lives through the grace…
        time.advance(Duration::from_millis(1_500)).await;
        p.phone.send(Message::text("in grace")).await.unwrap();
        assert_eq!(
            next(&mut p.data).await,
            Err((0, "not JSON: in grace".into()))
        );
        // …and is closed at its end.
        time.advance(Duration::from_millis(500)).await;
        assert_eq!(
            next(&mut p.phone).await,
            Err((4503, "relay draining".into()))
        );
        let el = now_ms() - t;
        assert!((1_500..=2_750).contains(&el), "{el} ms");
        assert_eq!(
            next(&mut p.data).await,
            Err((4503, "relay draining".into()))
        );
        assert_eq!(
            next(&mut c.ws).await,
            Err((4503, "resolve configured director".into()))
        );
        time.auto(s.running.shutdown()).await;
    }
    time.resume();
}

/// P-37: three hosts, pace 2 s, grace 60 s → drains at ≈ 0, 1, 2 s; the third host's phone is
/// admitted at 0.5 s. On manual time.
#[tokio::test(start_paused = true)]
async fn paced_drain() {
    let time = ManualTime::start();
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let mut hosts = Vec::new();
    for i in 0..3 {
        let h = Host::assigned(&s, &format!("pace{i}")).await;
        let c = h.connect(&s).await;
        hosts.push((h, c));
    }
    let invite = hosts[2].1.create_invite("r", "d").await.unwrap();
    let t = now_ms();
    let r = drain_req(
        &s,
        json!({"v":1,"graceMs":60000,"paceWindowMs":2000}),
        Some(ADMIN),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap(),
        json!({"ok":true,"paceWindowMs":2000})
    );
    let d0 = next(&mut hosts[0].1.ws).await.unwrap();
    assert_eq!(d0["type"], "drain");
    assert_eq!(now_ms() - t, 0);
    time.advance(Duration::from_millis(500)).await;
    let (h2, c2) = &mut hosts[2];
    let p = testkit::pair_phone(&s.cell_url, c2, &h2.id.relay_host_id, &invite, &[]).await;
    assert!(p.is_ok(), "third host still ordinary: {:?}", p.err());
    time.advance(Duration::from_millis(500)).await;
    assert_eq!(next(&mut hosts[1].1.ws).await.unwrap()["type"], "drain");
    let e1 = now_ms() - t;
    assert!((900..=1_500).contains(&e1), "{e1} ms");
    time.advance(SEC).await;
    assert_eq!(next(&mut hosts[2].1.ws).await.unwrap()["type"], "drain");
    let e2 = now_ms() - t;
    assert!((1_900..=2_500).contains(&e2), "{e2} ms");
    time.resume();
    s.running.shutdown().await;
}

/// P-38 (in process): shutdown with a live splice → `drain {graceMs:0}`, splice 4503, control 4503.
#[tokio::test]
async fn shutdown_drains_with_grace_zero() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "term").await;
    let mut c = host.connect(&s).await;
    let invite = c.create_invite("r1", "d1").await.unwrap();
    let mut p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
        .await
        .unwrap();
    let t = Instant::now();
    let stop = tokio::spawn(s.running.shutdown());
    assert_eq!(
        c.recv(SEC * 5).await.unwrap(),
        json!({"type":"drain","graceMs":0,"recovery":"resolve-director"})
    );
    assert_eq!(
        recv_close(&mut p.phone, SEC * 5).await,
        (4503, "relay draining".into())
    );
    assert_eq!(
        recv_close(&mut c.ws, SEC * 5).await,
        (4503, "resolve configured director".into())
    );
    stop.await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
}
