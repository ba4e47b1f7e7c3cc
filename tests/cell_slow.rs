//! Control timers that need real minutes (run in parallel with the rest): ping and silence
//! (P-09), an expiring host token (P-34).

#[path = "support/cell/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use futures_util::SinkExt;
use orca_relay::cell::testkit::{self, recv_close, recv_json};
use serde_json::json;
use support::*;
use tokio_tungstenite::tungstenite::Message;

/// P-09: `ping` within 16 s; ponging keeps the control; silence → 4408 75–91 s after the last pong.
#[tokio::test]
async fn ping_pong_and_silence_timeout() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "silence").await;
    let mut c = host.connect(&s).await;
    let t = Instant::now();
    let ping = recv_json(&mut c.ws, Duration::from_secs(17)).await.unwrap();
    assert_eq!(ping["type"], "ping");
    assert!(t.elapsed() <= Duration::from_secs(16));
    c.send(json!({"type":"pong","t":ping["t"]})).await;
    let last_pong = Instant::now();
    // From now on never pong (WebSocket-level pongs do not count).
    loop {
        match recv_json(&mut c.ws, Duration::from_secs(100)).await {
            Ok(v) => assert_eq!(v["type"], "ping"),
            Err(close) => {
                assert_eq!(close, (4408, "control silence timeout".into()));
                break;
            }
        }
    }
    let el = last_pong.elapsed();
    assert!(
        el >= Duration::from_secs(75) && el <= Duration::from_secs(92),
        "{el:?}"
    );
    s.running.shutdown().await;
}

/// P-34: a token with 20 s left. Past `exp`: `invite-create` → `authorization_expired`, new phones
/// 4404, splices run; a refresh restores `active`; without one → 4401 `relay authorization expired`
/// on the first tick after `exp` + 60 s.
#[tokio::test]
async fn expiring_token_drain_only_then_closed() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "expiry").await;
    let k = orca_relay::crypto::self_hosted_key(SIGNING);
    let (short, exp_ms) = orca_relay::crypto::mint_host_token(
        &k,
        &host.id.user_id,
        &s.public_url,
        &host.id.relay_host_id,
        orca_relay::clock::now_ms() - 880_000,
    );
    let short_host = Host {
        id: host.id.clone(),
        token: short,
        epoch: host.epoch,
    };
    let mut c = short_host.connect(&s).await;
    let invite = c.create_invite("r1", "d1").await.unwrap();
    let invite2 = c.create_invite("r2", "d2").await.unwrap();
    let mut p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
        .await
        .unwrap();
    // Wait for the first tick past exp (ticks every 15 s; pong to stay alive).
    while orca_relay::clock::now_ms() <= exp_ms + 15_500 {
        let v = recv_json(&mut c.ws, Duration::from_secs(40))
            .await
            .expect("control open");
        assert_eq!(v["type"], "ping");
        c.send(json!({"type":"pong","t":v["t"]})).await;
    }
    c.send(json!({"type":"invite-create","reqId":"late","relayDeviceId":"d3"}))
        .await;
    assert_eq!(
        c.recv(SEC * 5).await.unwrap(),
        json!({"type":"control-error","reqId":"late","code":"authorization_expired"})
    );
    let mut phone = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite2, &[])
        .await
        .unwrap();
    assert_eq!(recv_json(&mut phone, SEC * 5).await.unwrap()["code"], 4404);
    p.phone.send(Message::text("splice runs")).await.unwrap();
    assert_eq!(
        recv_json(&mut p.data, SEC * 5).await,
        Err((0, "not JSON: splice runs".into()))
    );
    // A refresh restores active.
    c.send(json!({"type":"auth-refresh","relayJwt": host.token}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(c.create_invite("again", "d4").await.is_ok());
    // Without a refresh: a second short-lived control is closed 4401 after exp + 60 s.
    let (short2, exp2) = orca_relay::crypto::mint_host_token(
        &k,
        &host.id.user_id,
        &s.public_url,
        &host.id.relay_host_id,
        orca_relay::clock::now_ms() - 895_000,
    );
    let h2 = Host {
        id: host.id.clone(),
        token: short2,
        epoch: host.epoch,
    };
    let mut c2 = h2.connect(&s).await;
    let closed = loop {
        match c2.recv(Duration::from_secs(100)).await {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(closed, (4401, "relay authorization expired".into()));
    let now = orca_relay::clock::now_ms();
    assert!(
        now > exp2 + 60_000 && now <= exp2 + 60_000 + 16_250,
        "{}",
        now - exp2
    );
    drop(recv_close(&mut c.ws, Duration::from_millis(10)).await);
    s.running.shutdown().await;
}
