//! Phone credentials through the control socket and the phone leg, on both backends
//! (P-17, P-18, P-19, P-20, P-21).

mod support;

use orca_relay::cell::testkit::{self, recv_close, recv_json};
use orca_relay::crypto::{random_b64u32, token_hash};
use serde_json::json;
use support::node::*;

#[tokio::test]
async fn install_resume_confirm_rotate_revoke() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "creds").await;
        let mut c = host.connect(&s).await;
        let invite = c.create_invite("r1", "d1").await.unwrap();
        let p = testkit::pair_phone(&s.cell_url, &mut c, &host.id.relay_host_id, &invite, &[])
            .await
            .unwrap();
        // P-17: relay-basis install.
        let r1 = random_b64u32();
        let install = json!({"type":"device-credential-install","v":1,"reqId":"i1","relayDeviceId":"d1",
            "newResumeTokenHash": token_hash(&r1), "authorization":{"mode":"relay-basis","basisConnId": p.conn_id}});
        c.send(install.clone()).await;
        let got = c.recv(SEC * 5).await.unwrap();
        let now = orca_relay::clock::now_ms();
        assert_eq!(got["type"], "device-credential-installed");
        assert_eq!(got["v"], 1);
        assert_eq!(got["reqId"], "i1");
        assert_eq!(got["authorizationMode"], "relay-basis");
        assert_eq!(got["currentVersion"], 1);
        assert!((got["resumeExpiresAt"].as_i64().unwrap() - (now + 2_592_000_000)).abs() < 10_000);
        assert!(got.get("graceExpiresAt").is_none());
        c.send(install).await;
        assert_eq!(c.recv(SEC * 5).await.unwrap(), got);
        c.send(json!({"type":"device-credential-install-status","v":1,"reqId":"i1","relayDeviceId":"d1"})).await;
        let st = c.recv(SEC * 5).await.unwrap();
        assert_eq!(st["state"], "committed");
        let mut expected = got.clone();
        expected.as_object_mut().unwrap().remove("type");
        assert_eq!(st["result"], expected);
        c.send(json!({"type":"device-credential-install-status","v":1,"reqId":"i9","relayDeviceId":"d1"})).await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap(),
            json!({"type":"device-credential-install-status-result","v":1,"reqId":"i9","state":"not-found"})
        );
        let mut consumed =
            testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &invite, &[])
                .await
                .unwrap();
        assert_eq!(
            recv_json(&mut consumed, SEC * 5).await.unwrap()["code"],
            4409
        );
        // P-18: resume with R1.
        let mut phone = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &r1, &[])
            .await
            .unwrap();
        let open = c.recv(SEC * 5).await.unwrap();
        assert_eq!(open["kind"], "resume");
        let _data = testkit::connect_data(&s.cell_url, &open, c.generation, &[])
            .await
            .unwrap();
        let hello = recv_json(&mut phone, SEC * 5).await.unwrap();
        assert_eq!(hello["ok"], true);
        assert_eq!(hello["credentialKind"], "resume");
        assert_eq!(hello["acceptedCredentialVersion"], 1);
        assert_eq!(hello["acceptedAs"], "current");
        assert_eq!(hello["resumeExpiresAt"], got["resumeExpiresAt"]);
        assert!(hello.get("graceExpiresAt").is_none());
        // P-19: confirm within 30 s; repeat identical; another basis → mismatch.
        let basis = open["connId"].as_str().unwrap().to_owned();
        c.send(json!({"type":"device-resume-confirm","v":1,"reqId":"c1","basisConnId":basis}))
            .await;
        let conf = c.recv(SEC * 5).await.unwrap();
        assert_eq!(conf["type"], "device-resume-confirmed");
        assert_eq!(conf["currentVersion"], 1);
        assert_eq!(conf["acceptedAs"], "current");
        assert_eq!(conf["renewed"], true);
        c.send(json!({"type":"device-resume-confirm","v":1,"reqId":"c1","basisConnId":basis}))
            .await;
        assert_eq!(c.recv(SEC * 5).await.unwrap(), conf);
        c.send(json!({"type":"device-resume-confirm","v":1,"reqId":"c1","basisConnId":"other"}))
            .await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap()["code"],
            "confirmation_tuple_mismatch"
        );
        drop(phone);
        assert!(
            eventually(SEC * 5, || s
                .session(&host.key(), |st| st.active.contains_key(&basis))
                == Some(false))
            .await,
            "the cell saw the basis connection end"
        );
        c.send(json!({"type":"device-resume-confirm","v":1,"reqId":"c2","basisConnId":basis}))
            .await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap()["code"],
            "confirmation_not_active"
        );
        // P-20: authenticated-direct install rotates R1 into grace.
        let r2 = random_b64u32();
        c.send(json!({"type":"device-credential-install","v":1,"reqId":"i2","relayDeviceId":"d1","newResumeTokenHash":token_hash(&r2),
            "expectedCurrentHash": token_hash(&random_b64u32()), "authorization":{"mode":"authenticated-direct","directAuthId":"x0"}})).await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap()["code"],
            "current_hash_mismatch"
        );
        c.send(json!({"type":"device-credential-install","v":1,"reqId":"i3","relayDeviceId":"d1","newResumeTokenHash":token_hash(&r2),
            "expectedCurrentHash": token_hash(&r1), "authorization":{"mode":"authenticated-direct","directAuthId":"x1"}})).await;
        let rot = c.recv(SEC * 5).await.unwrap();
        assert_eq!(rot["currentVersion"], 2);
        let now = orca_relay::clock::now_ms();
        assert!((rot["graceExpiresAt"].as_i64().unwrap() - (now + 86_400_000)).abs() < 10_000);
        c.send(json!({"type":"device-credential-install","v":1,"reqId":"i4","relayDeviceId":"d1","newResumeTokenHash":token_hash(&r2),
            "authorization":{"mode":"relay-basis","basisConnId":"unknown"}})).await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap()["code"],
            "invalid_relay_basis"
        );
        let mut phone = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &r1, &[])
            .await
            .unwrap();
        let open = c.recv(SEC * 5).await.unwrap();
        let _data = testkit::connect_data(&s.cell_url, &open, c.generation, &[])
            .await
            .unwrap();
        let hello = recv_json(&mut phone, SEC * 5).await.unwrap();
        assert_eq!(hello["acceptedAs"], "grace");
        assert_eq!(hello["acceptedCredentialVersion"], 1);
        assert!(hello["graceExpiresAt"].as_i64().is_some());
        c.send(
            json!({"type":"device-resume-confirm","v":1,"reqId":"c3","basisConnId":open["connId"]}),
        )
        .await;
        let g = c.recv(SEC * 5).await.unwrap();
        assert_eq!(g["renewed"], false);
        assert_eq!(g["acceptedAs"], "grace");
        // P-21: revoke → resume with R2 → 4409.
        c.send(json!({"type":"device-revoke","reqId":"v1","relayDeviceId":"d1"}))
            .await;
        assert_eq!(
            c.recv(SEC * 5).await.unwrap(),
            json!({"type":"device-revoked","reqId":"v1"})
        );
        let mut revoked = testkit::connect_phone(&s.cell_url, &host.id.relay_host_id, &r2, &[])
            .await
            .unwrap();
        assert_eq!(
            recv_json(&mut revoked, SEC * 5).await.unwrap()["code"],
            4409
        );
        assert_eq!(recv_close(&mut revoked, SEC * 2).await.0, 4409);
        s.running.shutdown().await;
    }
}
