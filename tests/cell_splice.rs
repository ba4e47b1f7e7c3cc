//! The data path over real sockets on both backends: handshake to splice (P-05, P-11, P-13, P-14,
//! P-16), 10 000 frames each way byte-identical, message limits (P-15), and a phone that stops
//! reading (docs/reference/websocket.md).

mod support;

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use orca_relay::cell::testkit::{self, recv_close, recv_json, Hello};
use serde_json::json;
use support::node::*;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn handshake_invite_and_splice() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "self-hosted").await;
        let hello = Hello {
            capabilities: vec!["pending-conn-details".into()],
            ..host.hello()
        };
        let before = orca_relay::clock::now_ms();
        let mut c = host.connect_with(&s, &hello).await.expect("handshake");
        // P-05
        let ack = &c.ack;
        assert_eq!(ack["v"], 1);
        assert_eq!(ack["generation"], 1);
        assert_eq!(ack["activeConnIds"], json!([]));
        assert_eq!(ack["pendingConns"], json!([]));
        assert_eq!(ack["controlResumeSecret"].as_str().unwrap().len(), 43);
        let lease = ack["leaseExpiresAt"].as_i64().unwrap();
        assert!(
            lease >= before + 5 * 3_600_000 + 1_800_000
                && lease <= before + 7 * 3_600_000 - 1_800_000 + 5_000
        );
        assert_eq!(ack.as_object().unwrap().len(), 7);
        assert!(!c.resumed);
        // P-11
        c.send(json!({"type":"invite-create","reqId":"r1","relayDeviceId":"d1"}))
            .await;
        let created = c.recv(SEC * 5).await.unwrap();
        assert_eq!(created["type"], "invite-created");
        assert_eq!(created["reqId"], "r1");
        assert_eq!(created["maxAttempts"], 5);
        let exp = created["expiresAt"].as_i64().unwrap();
        let now = orca_relay::clock::now_ms();
        assert!((exp - (now + 570_000)).abs() < 5_000);
        let invite = created["inviteToken"].as_str().unwrap().to_owned();
        assert_eq!(created.as_object().unwrap().len(), 5);
        // P-13
        let mut phone = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        let open = c.recv(SEC * 5).await.unwrap();
        assert_eq!(open["type"], "conn-open");
        assert_eq!(open["kind"], "invite");
        assert_eq!(open["relayDeviceId"], "d1");
        assert_eq!(open["attachDeadlineMs"], 10_000);
        assert_eq!(open["connTicket"].as_str().unwrap().len(), 43);
        assert_eq!(open.as_object().unwrap().len(), 6);
        let mut data = testkit::connect_data(&s.cell_url, &open, 1, &[])
            .await
            .unwrap();
        let hello = recv_json(&mut phone, SEC * 5).await.unwrap();
        assert_eq!(hello["type"], "relay-hello");
        assert_eq!(hello["ok"], true);
        assert_eq!(hello["credentialKind"], "invite");
        assert!(hello["leaseExpiresAt"].as_i64().is_some());
        assert_eq!(hello.as_object().unwrap().len(), 4);
        // P-14
        phone.send(Message::text("hi")).await.unwrap();
        assert_eq!(data.next().await.unwrap().unwrap(), Message::text("hi"));
        data.send(Message::binary(vec![0u8, 0xff, 0x10]))
            .await
            .unwrap();
        assert_eq!(
            phone.next().await.unwrap().unwrap(),
            Message::binary(vec![0u8, 0xff, 0x10])
        );
        for i in 0..100u32 {
            let m = if i % 2 == 0 {
                Message::text(format!("m{i}"))
            } else {
                Message::binary(i.to_le_bytes().to_vec())
            };
            phone.send(m.clone()).await.unwrap();
            data.send(m).await.unwrap();
        }
        for i in 0..100u32 {
            let m = if i % 2 == 0 {
                Message::text(format!("m{i}"))
            } else {
                Message::binary(i.to_le_bytes().to_vec())
            };
            assert_eq!(data.next().await.unwrap().unwrap(), m);
            assert_eq!(phone.next().await.unwrap().unwrap(), m);
        }
        // Nothing else arrives on either side.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), phone.next())
                .await
                .is_err()
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(200), data.next())
                .await
                .is_err()
        );
        // P-16: phone closes 1000 → data leg 4408 within 1 s.
        phone.close(None).await.unwrap();
        let t = Instant::now();
        assert_eq!(
            recv_close(&mut data, SEC * 2).await,
            (4408, "peer connection dropped".into())
        );
        assert!(t.elapsed() < SEC);
        // And the reverse, with a second phone (P-11: a second invite for d1 voids the first).
        let invite2 = c.create_invite("r2", "d1").await.unwrap();
        let invite3 = c.create_invite("r3", "d1").await.unwrap();
        let mut stale = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite2, &[])
            .await
            .unwrap();
        assert_eq!(
            recv_json(&mut stale, SEC * 5).await.unwrap(),
            json!({"type":"relay-hello","ok":false,"code":4409})
        );
        assert_eq!(recv_close(&mut stale, SEC * 2).await.0, 4409);
        let mut p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite3, &[])
            .await
            .unwrap();
        p.data.close(None).await.unwrap();
        let t = Instant::now();
        assert_eq!(
            recv_close(&mut p.phone, SEC * 2).await,
            (4408, "peer connection dropped".into())
        );
        assert!(t.elapsed() < SEC);
        s.running.shutdown().await;
    }
}

/// 10 000 frames each way, text and binary, byte-identical, through the server.
#[tokio::test]
async fn ten_thousand_frames_each_way_byte_identical() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "bulk").await;
        let mut c = host.connect(&s).await;
        let invite = c.create_invite("r1", "d1").await.unwrap();
        let p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        let (mut phone_tx, mut phone_rx) = p.phone.split();
        let (mut data_tx, mut data_rx) = p.data.split();
        fn frame(i: u32, dir: u8) -> Message {
            let len = (i as usize * 7919) % 3000;
            let body: Vec<u8> = (0..len)
                .map(|j| (j as u32 ^ i ^ dir as u32) as u8)
                .collect();
            if i % 2 == 0 {
                let text: String = body.iter().map(|b| (b'a' + b % 26) as char).collect();
                Message::text(format!("{dir}:{i}:{text}"))
            } else {
                let mut b = body;
                b.extend_from_slice(&i.to_be_bytes());
                Message::binary(b)
            }
        }
        const N: u32 = 10_000;
        let up = tokio::spawn(async move {
            for i in 0..N {
                phone_tx.feed(frame(i, 1)).await.unwrap();
            }
            phone_tx.flush().await.unwrap();
            phone_tx
        });
        let down = tokio::spawn(async move {
            for i in 0..N {
                data_tx.feed(frame(i, 2)).await.unwrap();
            }
            data_tx.flush().await.unwrap();
            data_tx
        });
        let check_up = tokio::spawn(async move {
            for i in 0..N {
                assert_eq!(
                    data_rx.next().await.unwrap().unwrap(),
                    frame(i, 1),
                    "phone→host frame {i}"
                );
            }
        });
        let check_down = tokio::spawn(async move {
            for i in 0..N {
                assert_eq!(
                    phone_rx.next().await.unwrap().unwrap(),
                    frame(i, 2),
                    "host→phone frame {i}"
                );
            }
        });
        tokio::time::timeout(Duration::from_secs(60), async {
            check_up.await.unwrap();
            check_down.await.unwrap();
        })
        .await
        .expect("all frames within 60 s");
        drop((up.await.unwrap(), down.await.unwrap()));
        s.running.shutdown().await;
    }
}

/// P-15: 8 MiB crosses intact; 8 MiB + 1 → sender 1009, peer 4408; control 1 MiB + 1 → 1009.
#[tokio::test]
async fn message_size_limits() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "sizes").await;
        let mut c = host.connect(&s).await;
        let invite = c.create_invite("r1", "d1").await.unwrap();
        let mut p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        let big: Vec<u8> = (0..8 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let (tx, rx) = (p.phone.send(Message::binary(big.clone())), p.data.next());
        let (sent, got) = tokio::join!(tx, rx);
        sent.unwrap();
        assert_eq!(got.unwrap().unwrap(), Message::binary(big.clone()));
        let mut over = big;
        over.push(1);
        let _ = p.phone.send(Message::binary(over)).await;
        assert_eq!(
            recv_close(&mut p.data, SEC * 5).await,
            (4408, "peer connection dropped".into())
        );
        assert_eq!(recv_close(&mut p.phone, SEC * 5).await.0, 1009);
        // Control leg: 1 MiB + 1.
        let _ = c.ws.send(Message::text("x".repeat(1_048_577))).await;
        assert_eq!(recv_close(&mut c.ws, SEC * 5).await.0, 1009);
        s.running.shutdown().await;
    }
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A phone that stops reading while its host sends 64 MiB: memory stays bounded (the measure is
/// this whole test process, clients included) and the splice closes 4429 within the wedge timeout.
#[tokio::test]
async fn phone_that_stops_reading_is_bounded_and_closed() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "stall").await;
    let mut c = host.connect(&s).await;
    let invite = c.create_invite("r1", "d1").await.unwrap();
    let p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
        .await
        .unwrap();
    let mut phone = p.phone; // never read from here on
    let (mut data_tx, mut data_rx) = p.data.split();
    let base = rss_kib();
    let sender = tokio::spawn(async move {
        let chunk = vec![0x5au8; 64 * 1024];
        for _ in 0..1024 {
            if data_tx.send(Message::binary(chunk.clone())).await.is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut peak = base;
    let close = loop {
        tokio::select! {
            m = data_rx.next() => match m {
                Some(Ok(Message::Close(f))) => break f.map(|f| (u16::from(f.code), f.reason.as_str().to_owned())),
                Some(Ok(_)) => {}
                _ => break None,
            },
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                peak = peak.max(rss_kib());
                assert!(started.elapsed() < Duration::from_secs(20), "no close within the wedge timeout");
            }
        }
    };
    let elapsed = started.elapsed();
    let growth_mib = (peak.saturating_sub(base)) as f64 / 1024.0;
    eprintln!("stalled phone: closed {close:?} after {elapsed:?}, RSS growth {growth_mib:.1} MiB");
    let (code, reason) = close.expect("close frame");
    assert_eq!(code, 4429);
    assert!(reason == "wedged relay link" || reason == "relay queue limit exceeded");
    assert!(
        elapsed < Duration::from_millis(10_000 + 1_250 + 2_000),
        "{elapsed:?}"
    );
    assert!(growth_mib < 12.0, "RSS grew {growth_mib:.1} MiB");
    sender.abort();
    drop(phone.close(None).await);
    // The control is unaffected.
    c.send(json!({"type":"nope"})).await;
    assert_eq!(
        c.recv(SEC * 5).await.unwrap()["code"],
        "unknown_control_message"
    );
    s.running.shutdown().await;
}
