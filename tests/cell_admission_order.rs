//! docs/reference/websocket.md: the drain check (step 2) comes before the credential reservation (step 4),
//! so a phone arriving at a draining host spends no invite attempt and always gets 4503.

mod support;

use orca_relay::cell::testkit::{self, recv_close, recv_json};
use orca_relay::params;
use serde_json::json;
use support::node::*;

#[tokio::test]
async fn phone_at_a_draining_host_spends_no_invite_attempt() {
    for t in dbs().await {
        let s = start_on(&t.url, &[]).await;
        let host = Host::assigned(&s, "drain-order").await;
        let mut c = host.connect(&s).await;
        let invite = c.create_invite("r1", "dev-1").await.expect("invite");
        let r = reqwest::Client::new()
            .post(format!("{}/v1/admin/drain", s.url))
            .bearer_auth(ADMIN)
            .json(&json!({"v":1,"graceMs":30000}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(c.recv(SEC * 5).await.unwrap()["type"], "drain");
        // Two phones back to back: with reserve-first the second met a cooldown invite (4401).
        for i in 0..2 {
            let mut phone =
                testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite, &[])
                    .await
                    .unwrap();
            let hello = recv_json(&mut phone, SEC * 5).await.unwrap();
            assert_eq!(
                hello,
                json!({"type":"relay-hello","ok":false,"code":4503}),
                "phone {i} on {}",
                t.url
            );
            assert_eq!(
                recv_close(&mut phone, SEC * 5).await,
                (4503, "relay connection rejected".into())
            );
        }
        let rows =
            t.db.query(
                "SELECT attempt_count, state FROM relay_invites WHERE relay_host_id = $1",
                params![&host.id.relay_host_id],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].i64(0), 0, "no attempt spent on {}", t.url);
        assert_eq!(rows[0].str(1), "available");
        s.running.shutdown().await;
    }
}
