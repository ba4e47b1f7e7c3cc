//! Upgrade gates, first frames, handshake failures and control messages over real sockets, on both
//! backends; every bad input leaves other sessions served (P-04, P-06, P-07, P-08, P-10, P-12,
//! P-22, P-24, P-25, P-26, P-27, P-28).

mod support;

use std::time::{Duration, Instant};

use futures_util::SinkExt;
use orca_relay::cell::testkit::{self, recv_close, recv_json, Hello};
use serde_json::json;
use support::node::*;
use tokio_tungstenite::tungstenite::Message;

fn status(resp: &str) -> &str {
    resp.split("\r\n").next().unwrap_or("")
}

#[tokio::test]
async fn upgrade_gates_answer_raw_statuses() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let a = s.running.addr;
        let host = Host::assigned(&s, "gates").await;
        let bearer = format!("Authorization: Bearer {}\r\n", host.token);
        // P-04
        let r = raw_upgrade(a, "/v1/host/control?x=1", &bearer).await;
        assert_eq!(status(&r), "HTTP/1.1 400 Bad Request");
        assert!(r.to_ascii_lowercase().contains("connection: close"));
        assert!(r.to_ascii_lowercase().contains("content-length: 0"));
        assert_eq!(
            status(&raw_upgrade(a, "/v1/host/controls", &bearer).await),
            "HTTP/1.1 404 Not Found"
        );
        assert_eq!(
            status(&raw_upgrade(a, "/v1/host/control", "").await),
            "HTTP/1.1 401 Unauthorized"
        );
        let foreign = orca_relay::crypto::mint_host_token(
            &[7u8; 32],
            "u",
            &s.public_url,
            &host.id.relay_host_id,
            orca_relay::clock::now_ms(),
        )
        .0;
        let r = raw_upgrade(
            a,
            "/v1/host/control",
            &format!("Authorization: Bearer {foreign}\r\n"),
        )
        .await;
        assert_eq!(status(&r), "HTTP/1.1 401 Unauthorized");
        let k = orca_relay::crypto::self_hosted_key(SIGNING);
        let expired = orca_relay::crypto::mint_host_token(
            &k,
            "u",
            &s.public_url,
            &host.id.relay_host_id,
            orca_relay::clock::now_ms() - 1_000_000,
        )
        .0;
        let r = raw_upgrade(
            a,
            "/v1/host/control",
            &format!("Authorization: Bearer {expired}\r\n"),
        )
        .await;
        assert_eq!(status(&r), "HTTP/1.1 401 Unauthorized");
        // P-26, P-27 gates.
        assert_eq!(
            status(&raw_upgrade(a, "/v1/connect/short", "").await),
            "HTTP/1.1 429 Too Many Requests"
        );
        let r = raw_upgrade(a, &format!("/v1/connect/{}?a", host.id.relay_host_id), "").await;
        assert_eq!(status(&r), "HTTP/1.1 400 Bad Request");
        let r = raw_upgrade(a, &format!("/v1/connect/{}?", host.id.relay_host_id), "").await;
        assert_eq!(status(&r), "HTTP/1.1 400 Bad Request");
        let r = raw_upgrade(a, &format!("/v1/host/data/{}", "c".repeat(129)), "").await;
        assert_eq!(status(&r), "HTTP/1.1 429 Too Many Requests");
        assert_eq!(
            status(&raw_upgrade(a, "/v1/host/data/%zz", "").await),
            "HTTP/1.1 429 Too Many Requests"
        );
        assert_eq!(
            status(&raw_upgrade(a, "/v1/elsewhere", "").await)
                .split(' ')
                .nth(1),
            Some("404")
        );
        // The host is still served after all that.
        let mut c = host.connect(&s).await;
        assert!(c.create_invite("r", "d").await.is_ok());
        s.running.shutdown().await;
    }
}

#[tokio::test]
async fn phone_and_data_first_frames() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "first").await;
        let mut c = host.connect(&s).await;
        let phone_url = format!(
            "{}/v1/connect/{}",
            testkit::ws_origin(&s.cell_url),
            host.id.relay_host_id
        );
        // P-26: silent phone → 4401 first frame timeout, no relay-hello.
        let mut silent = testkit::dial(&phone_url, &[]).await.unwrap();
        let t = Instant::now();
        assert_eq!(
            recv_json(&mut silent, SEC * 5).await,
            Err((4401, "first frame timeout".into()))
        );
        assert!(
            t.elapsed() >= Duration::from_millis(1_900)
                && t.elapsed() < Duration::from_millis(3_300)
        );
        let mut bin = testkit::dial(&phone_url, &[]).await.unwrap();
        bin.send(Message::binary(vec![1u8])).await.unwrap();
        assert_eq!(
            recv_json(&mut bin, SEC * 5).await,
            Err((4401, "first frame must be text".into()))
        );
        let mut bad = testkit::dial(&phone_url, &[]).await.unwrap();
        bad.send(Message::text(r#"{"type":"relay-auth"}"#))
            .await
            .unwrap();
        assert_eq!(
            recv_json(&mut bad, SEC * 5).await.unwrap(),
            json!({"type":"relay-hello","ok":false,"code":4401})
        );
        assert_eq!(
            recv_close(&mut bad, SEC * 2).await,
            (4401, "invalid relay auth".into())
        );
        let random = orca_relay::crypto::random_b64u32();
        let mut unknown = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &random, &[])
            .await
            .unwrap();
        assert_eq!(
            recv_json(&mut unknown, SEC * 5).await.unwrap(),
            json!({"type":"relay-hello","ok":false,"code":4409})
        );
        assert_eq!(
            recv_close(&mut unknown, SEC * 2).await,
            (4409, "relay connection rejected".into())
        );
        // P-27: data leg with a wrong ticket or generation, bad schema, then the right one attaches.
        let invite = c.create_invite("r1", "d1").await.unwrap();
        let mut phone = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        let open = c.recv(SEC * 5).await.unwrap();
        let mut wrong = open.clone();
        wrong["connTicket"] = json!(orca_relay::crypto::random_b64u32());
        let mut d = testkit::connect_data(&s.cell_url, &wrong, 1, &[])
            .await
            .unwrap();
        assert_eq!(
            recv_close(&mut d, SEC * 5).await,
            (4401, "invalid host data ticket".into())
        );
        let mut d = testkit::connect_data(&s.cell_url, &open, 2, &[])
            .await
            .unwrap();
        assert_eq!(
            recv_close(&mut d, SEC * 5).await,
            (4401, "invalid host data ticket".into())
        );
        let data_url = format!(
            "{}/v1/host/data/{}",
            testkit::ws_origin(&s.cell_url),
            open["connId"].as_str().unwrap()
        );
        let mut d = testkit::dial(&data_url, &[]).await.unwrap();
        d.send(Message::text(r#"{"type":"host-data-auth","v":1}"#))
            .await
            .unwrap();
        assert_eq!(
            recv_close(&mut d, SEC * 5).await,
            (4401, "invalid host data auth".into())
        );
        let mut d = testkit::dial(&data_url, &[]).await.unwrap();
        d.send(Message::binary(vec![0u8])).await.unwrap();
        assert_eq!(
            recv_close(&mut d, SEC * 5).await,
            (4401, "first frame must be text".into())
        );
        let mut good = testkit::connect_data(&s.cell_url, &open, 1, &[])
            .await
            .unwrap();
        assert_eq!(recv_json(&mut phone, SEC * 5).await.unwrap()["ok"], true);
        // A used ticket is refused the same way.
        let mut reuse = testkit::connect_data(&s.cell_url, &open, 1, &[])
            .await
            .unwrap();
        assert_eq!(
            recv_close(&mut reuse, SEC * 5).await,
            (4401, "invalid host data ticket".into())
        );
        phone.send(Message::text("still spliced")).await.unwrap();
        assert_eq!(
            recv_json(&mut good, SEC * 5).await,
            Err((0, "not JSON: still spliced".into()))
        );
        s.running.shutdown().await;
    }
}

#[tokio::test]
async fn hello_and_proof_failures() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "hello").await;
        let url = format!("{}/v1/host/control", testkit::ws_origin(&s.cell_url));
        let auth = vec![("authorization", format!("Bearer {}", host.token))];
        let dial = || testkit::dial(&url, &auth);
        // P-06
        let mut ws = dial().await.unwrap();
        assert_eq!(
            recv_close(&mut ws, SEC * 5).await,
            (4401, "host hello timeout".into())
        );
        let mut ws = dial().await.unwrap();
        ws.send(Message::binary(vec![1u8])).await.unwrap();
        assert_eq!(
            recv_close(&mut ws, SEC * 5).await,
            (4401, "host hello must be text".into())
        );
        let hello = json!({"type":"host-hello","v":1,"relayHostId":host.id.relay_host_id,"assignmentEpoch":host.epoch,
            "hostPublicKeyB64":host.id.public_b64(),"appVersion":"t"});
        let mut extra = hello.clone();
        extra["x"] = json!(1);
        let mut ws = dial().await.unwrap();
        ws.send(Message::text(extra.to_string())).await.unwrap();
        assert_eq!(
            recv_close(&mut ws, SEC * 5).await,
            (4401, "invalid host hello".into())
        );
        // Non-zero padding bits: last char before '=' changes the unused bits.
        let key = host.id.public_b64();
        let last = key.as_bytes()[42];
        let alt = (b'A'..=b'Z')
            .chain(b'a'..=b'z')
            .find(|c| {
                *c != last
                    && orca_relay::crypto::decode_key32(&format!("{}{}=", &key[..42], *c as char))
                        .is_none()
            })
            .unwrap();
        let mut padded = hello.clone();
        padded["hostPublicKeyB64"] = json!(format!("{}{}=", &key[..42], alt as char));
        let mut ws = dial().await.unwrap();
        ws.send(Message::text(padded.to_string())).await.unwrap();
        assert_eq!(
            recv_close(&mut ws, SEC * 5).await,
            (4401, "invalid host public key".into())
        );
        let mut other = hello.clone();
        other["relayHostId"] = json!("AAAAAAAAAAAAAAAA");
        let mut ws = dial().await.unwrap();
        ws.send(Message::text(other.to_string())).await.unwrap();
        assert_eq!(
            recv_close(&mut ws, SEC * 5).await,
            (4401, "host key binding mismatch".into())
        );
        let mut nonderiving = hello.clone();
        nonderiving["hostPublicKeyB64"] = json!(orca_relay::crypto::std_encode(&[9u8; 32]));
        let mut ws = dial().await.unwrap();
        ws.send(Message::text(nonderiving.to_string()))
            .await
            .unwrap();
        assert_eq!(
            recv_close(&mut ws, SEC * 5).await,
            (4401, "host key binding mismatch".into())
        );
        // P-07: epoch + 1, and an unassigned host.
        let wrong = Hello {
            epoch: host.epoch + 1,
            ..Hello::default()
        };
        assert_eq!(
            host.connect_with(&s, &wrong).await.err(),
            Some((4409, "wrong assignment epoch".into()))
        );
        let stranger = orca_relay::cell::testkit::HostIdentity::generate("nobody");
        let t = stranger.token(SIGNING, &s.public_url);
        let r = testkit::connect_control(
            &s.cell_url,
            &stranger,
            &t,
            &s.public_url,
            &Hello {
                epoch: 1,
                ..Hello::default()
            },
        )
        .await;
        assert_eq!(r.err(), Some((4409, "wrong assignment epoch".into())));
        // P-08: wrong proof, wrong challengeId, no ack.
        for (id, proof) in [
            (None, Some(orca_relay::crypto::std_encode(&[0u8; 32]))),
            (Some("other"), None),
            (None, None),
        ] {
            let mut ws = dial().await.unwrap();
            ws.send(Message::text(hello.to_string())).await.unwrap();
            let ch = recv_json(&mut ws, SEC * 5).await.unwrap();
            assert_eq!(ch["type"], "host-challenge");
            assert_eq!(ch["relayEphemeralPublicKeyB64"].as_str().unwrap().len(), 44);
            assert_eq!(ch["nonceB64"].as_str().unwrap().len(), 32);
            if id.is_none() && proof.is_none() {
                let t = Instant::now();
                assert_eq!(
                    recv_close(&mut ws, SEC * 15).await,
                    (4401, "host proof timeout".into())
                );
                assert!(t.elapsed() >= Duration::from_millis(9_500));
                continue;
            }
            let (good, _) =
                testkit::answer(&s.cell_url, &host.id, &s.public_url, &host.hello(), &ch).unwrap();
            let ack = json!({"type":"host-challenge-ack","challengeId": id.map(|s| json!(s)).unwrap_or(ch["challengeId"].clone()),
                "proofB64": proof.unwrap_or(orca_relay::crypto::std_encode(&good))});
            ws.send(Message::text(ack.to_string())).await.unwrap();
            assert_eq!(
                recv_close(&mut ws, SEC * 5).await,
                (4401, "invalid host proof".into())
            );
        }
        // Still served.
        let mut c = host.connect(&s).await;
        assert!(c.create_invite("r", "d").await.is_ok());
        s.running.shutdown().await;
    }
}

#[tokio::test]
async fn control_messages_and_invite_rate() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "ctl").await;
        let mut c = host.connect(&s).await;
        // P-10
        c.ws.send(Message::binary(vec![1u8, 2])).await.unwrap();
        c.send(json!({"type":"nope"})).await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap(),
            json!({"type":"control-error","code":"unknown_control_message"})
        );
        c.send(json!({"type":"invite-create","reqId":"r"})).await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap(),
            json!({"type":"control-error","reqId":"r","code":"invalid_control_message"})
        );
        c.send(json!({"noType":1})).await;
        c.send(json!({"type":"host-hello"})).await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap()["code"],
            "unknown_control_message"
        );
        // P-12: 31 invite-creates within one fixed minute. On the test clock, start early in a
        // minute (jumping to the next one if needed) instead of rerunning when straddling.
        let into = orca_relay::clock::now_ms() % 60_000;
        if into > 30_000 {
            jump(Duration::from_millis((60_001 - into) as u64)).await;
        }
        let minute = orca_relay::clock::now_ms() / 60_000;
        let mut limited = None;
        for i in 0..31 {
            c.send(json!({"type":"invite-create","reqId":format!("q{i}"),"relayDeviceId":format!("d{i}")})).await;
            limited = Some(c.recv(SEC * 5).await.unwrap());
        }
        assert_eq!(orca_relay::clock::now_ms() / 60_000, minute);
        assert_eq!(
            limited.unwrap(),
            json!({"type":"control-error","reqId":"q30","code":"rate_limit_exceeded"})
        );
        // Non-JSON closes the control.
        c.ws.send(Message::text("{not json")).await.unwrap();
        assert_eq!(
            recv_close(&mut c.ws, SEC * 5).await,
            (4401, "invalid control JSON".into())
        );
        s.running.shutdown().await;
    }
}

#[tokio::test]
async fn per_host_cap_held_invite_and_host_offline() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "cap").await;
        // P-24: no control → 4404.
        {
            let mut c = host.connect(&s).await;
            let invite = c.create_invite("r0", "d0").await.unwrap();
            drop(c);
            // The control is gone (orphaned): phones get 4404 relay connection rejected.
            assert!(
                eventually(SEC * 5, || s.session_state(&host.key())
                    == Some(orca_relay::cell::session::State::Orphaned))
                .await,
                "the cell saw the control go"
            );
            let mut p = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite, &[])
                .await
                .unwrap();
            assert_eq!(recv_json(&mut p, SEC * 5).await.unwrap()["code"], 4404);
            let got = Some(recv_close(&mut p, SEC * 2).await);
            assert_eq!(got, Some((4404, "relay connection rejected".into())));
        }
        // A new control without the secret: generation 2.
        let mut c = host.connect(&s).await;
        assert_eq!(c.generation, 2);
        // P-25: 8 pending/active phones, the 9th → 4429.
        let mut pairs = Vec::new();
        for i in 0..8 {
            let inv = c
                .create_invite(&format!("r{i}"), &format!("d{i}"))
                .await
                .unwrap();
            pairs.push(
                testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &inv, &[])
                    .await
                    .unwrap(),
            );
        }
        let inv = c.create_invite("r9", "d9").await.unwrap();
        let mut ninth = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &inv, &[])
            .await
            .unwrap();
        assert_eq!(
            recv_json(&mut ninth, SEC * 5).await.unwrap(),
            json!({"type":"relay-hello","ok":false,"code":4429})
        );
        assert_eq!(
            recv_close(&mut ninth, SEC * 2).await,
            (4429, "relay connection rejected".into())
        );
        // P-22: a second phone with an invite held by a pending phone → 4401.
        drop(pairs.pop());
        assert!(
            eventually(SEC * 5, || s.session(&host.key(), |st| st.load())
                == Some(7))
            .await,
            "the cell saw the phone go"
        );
        let inv = c.create_invite("r10", "d10").await.unwrap();
        let mut first = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &inv, &[])
            .await
            .unwrap();
        let open = c.recv(SEC * 5).await.unwrap();
        assert_eq!(open["type"], "conn-open");
        let mut second = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &inv, &[])
            .await
            .unwrap();
        assert_eq!(
            recv_json(&mut second, SEC * 5).await.unwrap(),
            json!({"type":"relay-hello","ok":false,"code":4401})
        );
        assert_eq!(
            recv_close(&mut second, SEC * 2).await,
            (4401, "relay connection rejected".into())
        );
        let _data = testkit::connect_data(&s.cell_url, &open, c.generation, &[])
            .await
            .unwrap();
        assert_eq!(recv_json(&mut first, SEC * 5).await.unwrap()["ok"], true);
        s.running.shutdown().await;
    }
}

/// P-28: five silent sockets from one source → 5th 429; 31st attempt in 60 s → 429;
/// `X-Forwarded-For: a, b, c` with 2 trusted hops → source `b`.
#[tokio::test]
async fn pre_auth_admission_per_source() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &["--trusted-proxy-hops", "2"]).await;
    let a = s.running.addr;
    let id = orca_relay::cell::testkit::HostIdentity::generate("x");
    let path = format!("/v1/connect/{}", id.relay_host_id);
    let xff = |src: &str| format!("X-Forwarded-For: z, {src}, c\r\n");
    let url = format!("{}{}", testkit::ws_origin(&s.cell_url), path);
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(
            testkit::dial(&url, &[("x-forwarded-for", "q, b1, c".to_string())])
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        status(&raw_upgrade(a, &path, &xff("b1")).await),
        "HTTP/1.1 429 Too Many Requests"
    );
    // Another source (the entry two from the right differs) is admitted.
    assert_eq!(
        status(&raw_upgrade(a, &path, &xff("b2")).await),
        "HTTP/1.1 101 Switching Protocols"
    );
    drop(silent);
    // 30 admitted attempts per 60 s window for source b3.
    for i in 0..30 {
        let mut ws = testkit::dial(&url, &[("x-forwarded-for", "b3, c".to_string())])
            .await
            .unwrap_or_else(|e| panic!("attempt {i}: {e}"));
        let _ = ws.close(None).await;
    }
    assert_eq!(
        status(&raw_upgrade(a, &path, &xff("b3")).await),
        "HTTP/1.1 429 Too Many Requests"
    );
    s.running.shutdown().await;
}
