//! Control timers measured in minutes, on manual time (`support::node::ManualTime`): tokio's clock, and
//! with it `clock::now_ms`, stands still except when the test moves it, so the server's 15 s
//! ticks fire exactly where the test puts them, whatever the machine's load: ping and silence
//! (P-09), an expiring host token (P-34). The minutes take well under a second.

mod support;

use std::time::Duration;

use futures_util::SinkExt;
use orca_relay::cell::testkit::{self, recv_json, ClientWs};
use orca_relay::clock::now_ms;
use serde_json::{json, Value};
use support::node::*;
use tokio_tungstenite::tungstenite::Message;

const TICK: Duration = Duration::from_millis(orca_relay::contract::limits::CONTROL_TICK_MS);

/// The next text frame (or the close) of a socket, failing after 20 s of real time: under
/// manual time a tokio timeout never fires, so `recv_json`'s own is set out of reach.
async fn next(ws: &mut ClientWs) -> Result<Value, (u16, String)> {
    real_deadline(SEC * 20, "next frame", recv_json(ws, SEC * 3_600)).await
}

/// P-09: `ping` within 16 s; ponging keeps the control; silence → 4408 75–91 s after the last pong.
#[tokio::test(start_paused = true)]
async fn ping_pong_and_silence_timeout() {
    let time = ManualTime::start();
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "silence").await;
    let mut c = host.connect(&s).await;
    let t0 = now_ms();
    // Nothing before the first tick…
    time.advance(TICK - SEC).await;
    barrier(&mut c).await;
    // …and the ping at 15 s.
    time.advance(SEC).await;
    let ping = next(&mut c.ws).await.unwrap();
    assert_eq!(ping["type"], "ping");
    let at = ping["t"].as_i64().unwrap();
    assert!(at - t0 <= 16_000, "first ping {} ms after the ack", at - t0);
    c.send(json!({"type":"pong","t":ping["t"]})).await;
    barrier(&mut c).await;
    let last_pong = now_ms();
    // From now on never pong (WebSocket-level pongs do not count): a ping every tick until the
    // silence close.
    let mut pings = 0;
    let close = loop {
        time.advance(TICK).await;
        match next(&mut c.ws).await {
            Ok(v) => {
                assert_eq!(v["type"], "ping");
                pings += 1;
            }
            Err(close) => break close,
        }
    };
    assert_eq!(close, (4408, "control silence timeout".into()));
    let el = now_ms() - last_pong;
    assert!(
        (75_000..=91_000).contains(&el),
        "closed {el} ms after the last pong"
    );
    assert_eq!(pings, 5, "pings at 15, 30, 45, 60 and 75 s of silence");
    time.resume();
    s.running.shutdown().await;
}

/// P-34: a token with 20 s left. Past `exp`: `invite-create` → `authorization_expired`, new phones
/// 4404, splices run; a refresh restores `active`; without one → 4401 `relay authorization expired`
/// on the first tick after `exp` + 60 s.
#[tokio::test(start_paused = true)]
async fn expiring_token_drain_only_then_closed() {
    let time = ManualTime::start();
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "expiry").await;
    let k = orca_relay::crypto::self_hosted_key(SIGNING);
    let (short, exp_ms) = orca_relay::crypto::mint_host_token(
        &k,
        &host.id.user_id,
        &s.public_url,
        &host.id.relay_host_id,
        now_ms() - 880_000,
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
    // Tick by tick past exp (pong to stay alive).
    while now_ms() <= exp_ms + 15_500 {
        time.advance(TICK).await;
        let v = next(&mut c.ws).await.expect("control open");
        assert_eq!(v["type"], "ping");
        c.send(json!({"type":"pong","t":v["t"]})).await;
    }
    c.send(json!({"type":"invite-create","reqId":"late","relayDeviceId":"d3"}))
        .await;
    assert_eq!(
        next(&mut c.ws).await.unwrap(),
        json!({"type":"control-error","reqId":"late","code":"authorization_expired"})
    );
    let mut phone = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite2, &[])
        .await
        .unwrap();
    assert_eq!(next(&mut phone).await.unwrap()["code"], 4404);
    p.phone.send(Message::text("splice runs")).await.unwrap();
    assert_eq!(
        next(&mut p.data).await,
        Err((0, "not JSON: splice runs".into()))
    );
    // A refresh restores active (the barrier: the refresh has been applied).
    c.send(json!({"type":"auth-refresh","relayJwt": host.token}))
        .await;
    barrier(&mut c).await;
    assert!(c.create_invite("again", "d4").await.is_ok());
    // Without a refresh: a second short-lived control is closed 4401 after exp + 60 s.
    let (short2, exp2) = orca_relay::crypto::mint_host_token(
        &k,
        &host.id.user_id,
        &s.public_url,
        &host.id.relay_host_id,
        now_ms() - 895_000,
    );
    let h2 = Host {
        id: host.id.clone(),
        token: short2,
        epoch: host.epoch,
    };
    let mut c2 = h2.connect(&s).await;
    let closed = loop {
        time.advance(TICK).await;
        match next(&mut c2.ws).await {
            // Pong, so that only the token can close it.
            Ok(v) if v["type"] == "ping" => c2.send(json!({"type":"pong","t":v["t"]})).await,
            Ok(v) => panic!("unexpected {v}"),
            Err(e) => break e,
        }
    };
    assert_eq!(closed, (4401, "relay authorization expired".into()));
    let now = now_ms();
    assert!(
        now > exp2 + 60_000 && now <= exp2 + 60_000 + 16_250,
        "{}",
        now - exp2
    );
    time.resume();
    s.running.shutdown().await;
}
