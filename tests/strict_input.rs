//! Strict input everywhere (issue 11, docs/reference/websocket.md, docs/reference/http.md): every request body and every
//! frame is an object with exactly the documented keys; a JSON array where an object belongs and
//! `null` for an optional field are refused with the route's documented error.
//!
//! Table-driven over real HTTP and real WebSockets against an in-process `--role all` server.

mod support;

use std::time::Duration;

use futures_util::SinkExt;
use orca_relay::cell::testkit::{self, recv_close};
use orca_relay::crypto;
use serde_json::{json, Value};
use support::node::{dbs, start_on, Host, Server, ADMIN, CLUSTER, SELF_HOSTED};
use tokio_tungstenite::tungstenite::Message;

fn now() -> i64 {
    orca_relay::clock::now_ms()
}

async fn post(s: &Server, path: &str, bearer: Option<&str>, body: &str) -> (u16, Value) {
    let mut rb = reqwest::Client::new()
        .post(format!("{}{}", s.url, path))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(b) = bearer {
        rb = rb.bearer_auth(b);
    }
    let r = rb.send().await.expect("request");
    let status = r.status().as_u16();
    let v = serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null);
    (status, v)
}

#[tokio::test]
async fn http_bodies_refuse_arrays_nulls_and_duplicates() {
    let t = dbs().await.remove(0);
    let s = start_on(&t.url, &[]).await;
    let host = Host::assigned(&s, "strict-user").await;
    let kp = crypto::nacl::X25519Keypair::from_secret([0x21; 32]);
    let key = crypto::b64::std_encode(&kp.public);
    let rid = crypto::ident::relay_host_id(&kp.public);
    let cell_id = s.running.ctx.config.cell_id.clone();
    let cluster = crypto::jwt::mint_cluster_token(CLUSTER.as_bytes(), &cell_id, now());
    let tok = host.token.as_str();
    let hid = host.id.relay_host_id.as_str();

    // Sanity: the valid forms are accepted, so a refusal below is about the form alone.
    let (st, _) = post(
        &s,
        "/v1/host/challenge",
        None,
        &json!({"v":1,"hostPublicKeyB64":key}).to_string(),
    )
    .await;
    assert_eq!(st, 200, "valid challenge body");
    let (st, _) = post(
        &s,
        "/v1/host-token",
        Some(SELF_HOSTED),
        &json!({"relayHostId":rid,"hostPublicKeyB64":key}).to_string(),
    )
    .await;
    assert_eq!(st, 200, "valid host-token body");

    // (route, bearer, body, expected status, expected error)
    let cases: Vec<(&str, Option<&str>, String)> = vec![
        // arrays where the object belongs
        ("/v1/host/challenge", None, json!([1, key]).to_string()),
        ("/v1/host/session", None, json!([1, "c", "p"]).to_string()),
        (
            "/v1/host-token",
            Some(SELF_HOSTED),
            json!([rid, key]).to_string(),
        ),
        ("/v1/assign", Some(tok), json!([1, hid]).to_string()),
        ("/v1/resolve", None, json!([1, hid, "x"]).to_string()),
        (
            "/v1/admin/cell-heartbeat",
            Some(&cluster),
            json!([1, cell_id]).to_string(),
        ),
        (
            "/v1/admin/cell-rehome-status",
            Some(&cluster),
            json!([1]).to_string(),
        ),
        ("/v1/admin/cells", Some(ADMIN), json!([1, "c1"]).to_string()),
        (
            "/v1/admin/cell-state",
            Some(ADMIN),
            json!([1, "c1", "general"]).to_string(),
        ),
        ("/v1/admin/cell-fence", Some(ADMIN), json!([1]).to_string()),
        ("/v1/admin/cell-status", Some(ADMIN), json!([1]).to_string()),
        (
            "/v1/admin/host-whereabouts",
            Some(ADMIN),
            json!([1, hid]).to_string(),
        ),
        (
            "/v1/admin/evacuate",
            Some(ADMIN),
            json!([1, "u", hid, "c"]).to_string(),
        ),
        (
            "/v1/admin/evacuate-cell",
            Some(ADMIN),
            json!([1, "c", "d", 1]).to_string(),
        ),
        (
            "/v1/admin/migration-complete",
            Some(ADMIN),
            json!([1, "u", hid, 1]).to_string(),
        ),
        (
            "/v1/admin/runtime-status",
            Some(ADMIN),
            json!([1]).to_string(),
        ),
        ("/v1/admin/drain", Some(ADMIN), json!([1, 1000]).to_string()),
        // null for an optional field
        (
            "/v1/host-token",
            Some(SELF_HOSTED),
            json!({"relayHostId":rid,"hostPublicKeyB64":key,"userId":null}).to_string(),
        ),
        (
            "/v1/host-token",
            Some(SELF_HOSTED),
            json!({"relayHostId":rid,"hostPublicKeyB64":key,"v":null}).to_string(),
        ),
        (
            "/v1/assign",
            Some(tok),
            json!({"v":1,"relayHostId":hid,"reconnect":null}).to_string(),
        ),
        (
            "/v1/assign",
            Some(tok),
            json!({"v":1,"relayHostId":hid,"preferredRegion":null}).to_string(),
        ),
        (
            "/v1/assign",
            Some(tok),
            json!({"v":1,"relayHostId":hid,"regionCorrection":null}).to_string(),
        ),
        (
            "/v1/admin/cell-status",
            Some(ADMIN),
            json!({"v":1,"cellId":null}).to_string(),
        ),
        (
            "/v1/admin/host-whereabouts",
            Some(ADMIN),
            json!({"v":1,"relayHostId":hid,"userId":null}).to_string(),
        ),
        (
            "/v1/admin/evacuate-cell",
            Some(ADMIN),
            json!({"v":1,"sourceCellId":cell_id,"targetCellId":null,"limit":1}).to_string(),
        ),
        (
            "/v1/admin/drain",
            Some(ADMIN),
            json!({"v":1,"graceMs":1000,"paceWindowMs":null}).to_string(),
        ),
        // duplicate keys
        (
            "/v1/host/challenge",
            None,
            format!(r#"{{"v":1,"hostPublicKeyB64":"{key}","v":1}}"#),
        ),
        (
            "/v1/host-token",
            Some(SELF_HOSTED),
            format!(
                r#"{{"relayHostId":"{rid}","hostPublicKeyB64":"{key}","relayHostId":"{rid}"}}"#
            ),
        ),
        // a bare value, not an object
        ("/v1/admin/runtime-status", Some(ADMIN), "null".to_string()),
        ("/v1/assign", Some(tok), "1".to_string()),
    ];
    let mut failures = Vec::new();
    for (path, bearer, body) in &cases {
        let (st, v) = post(&s, path, *bearer, body).await;
        if st != 400 || v["error"] != "invalid_request" {
            failures.push(format!("{path} {body} → {st} {v}"));
        }
    }
    assert!(
        failures.is_empty(),
        "not refused as documented:\n{}",
        failures.join("\n")
    );
    drop(s);
    drop(t);
}

/// A `control-error` for the command `reqId`, or the frame that came instead.
async fn command_error(c: &mut testkit::HostControl, frame: Value) -> Value {
    c.send(frame).await;
    c.recv(Duration::from_secs(10))
        .await
        .expect("control stays open")
}

#[tokio::test]
async fn control_commands_refuse_nulls_and_arrays() {
    for t in dbs().await {
        let s = start_on(&t.url, &[]).await;
        let host = Host::assigned(&s, "strict-ctl").await;
        let mut c = host.connect(&s).await;
        let hash = "A".repeat(43);
        let bad: Vec<Value> = vec![
            json!({"type":"device-credential-install","v":1,"reqId":"r1","relayDeviceId":"d",
                   "newResumeTokenHash":hash,"expectedCurrentHash":null,
                   "authorization":{"mode":"authenticated-direct","directAuthId":"a1"}}),
            json!({"type":"device-credential-install","v":1,"reqId":"r2","relayDeviceId":"d",
                   "newResumeTokenHash":hash,
                   "authorization":{"mode":"authenticated-direct","directAuthId":"a1","basisConnId":null}}),
            json!({"type":"device-credential-install","v":1,"reqId":"r3","relayDeviceId":"d",
                   "newResumeTokenHash":hash,
                   "authorization":{"mode":"relay-basis","basisConnId":"c1","directAuthId":null}}),
            json!({"type":"device-credential-install","v":1,"reqId":"r4","relayDeviceId":"d",
                   "newResumeTokenHash":hash,"authorization":["relay-basis","c1"]}),
            json!({"type":"invite-create","reqId":"r5","relayDeviceId":null}),
            json!({"type":"device-credential-install-status","v":1,"reqId":"r6","relayDeviceId":["d"]}),
            json!({"type":"device-resume-confirm","v":1,"reqId":"r7","basisConnId":null}),
            json!({"type":"device-revoke","reqId":"r8","relayDeviceId":null}),
        ];
        for frame in bad {
            let req = frame["reqId"].clone();
            let v = command_error(&mut c, frame.clone()).await;
            assert_eq!(
                v,
                json!({"type":"control-error","reqId":req,"code":"invalid_control_message"}),
                "{} on {}",
                frame,
                t.url
            );
        }
        // A duplicate key is not JSON the relay accepts: the control closes `invalid_control_json`.
        let _ =
            c.ws.send(Message::text(
                r#"{"type":"invite-create","reqId":"r9","relayDeviceId":"d","reqId":"r9"}"#,
            ))
            .await;
        let (code, reason) = recv_close(&mut c.ws, Duration::from_secs(10)).await;
        assert_eq!(code, 4401, "duplicate key on {}", t.url);
        assert!(!reason.is_empty());
        drop(s);
    }
}

#[tokio::test]
async fn first_frames_refuse_nulls_and_arrays() {
    let t = dbs().await.remove(0);
    let s = start_on(&t.url, &[]).await;
    let host = Host::assigned(&s, "strict-first").await;
    let ws_base = testkit::ws_origin(&s.cell_url);
    let hello = json!({"type":"host-hello","v":1,"relayHostId":host.id.relay_host_id,
        "assignmentEpoch":host.epoch,"hostPublicKeyB64":host.id.public_b64(),"appVersion":"orca-test/1"});
    let mut null_prev = hello.clone();
    null_prev["previousGeneration"] = Value::Null;
    let mut null_secret = hello.clone();
    null_secret["controlResumeSecret"] = Value::Null;
    let arr = json!([
        "host-hello",
        1,
        host.id.relay_host_id,
        host.epoch,
        host.id.public_b64(),
        "orca-test/1"
    ]);
    let cred = "A".repeat(43);
    let connect = format!("{ws_base}/v1/connect/{}", host.id.relay_host_id);
    let data = format!("{ws_base}/v1/host/data/conn-1");
    let control = format!("{ws_base}/v1/host/control");
    let auth = vec![("authorization", format!("Bearer {}", host.token))];
    type Case<'a> = (&'a str, &'a [(&'a str, String)], String, &'a str);
    let cases: Vec<Case> = vec![
        (&control, &auth, null_prev.to_string(), "invalid host hello"),
        (
            &control,
            &auth,
            null_secret.to_string(),
            "invalid host hello",
        ),
        (&control, &auth, arr.to_string(), "invalid host hello"),
        (
            &connect,
            &[],
            json!(["relay-auth", 1, "connect", cred]).to_string(),
            "invalid relay auth",
        ),
        (
            &connect,
            &[],
            json!({"type":"relay-auth","v":1,"mode":"connect","credential":null}).to_string(),
            "invalid relay auth",
        ),
        (
            &connect,
            &[],
            format!(
                r#"{{"type":"relay-auth","v":1,"mode":"connect","credential":"{cred}","v":1}}"#
            ),
            "invalid relay auth",
        ),
        (
            &data,
            &[],
            json!(["host-data-auth", 1, cred, 1]).to_string(),
            "invalid host data auth",
        ),
        (
            &data,
            &[],
            json!({"type":"host-data-auth","v":1,"connTicket":cred,"generation":null}).to_string(),
            "invalid host data auth",
        ),
    ];
    for (url, headers, text, reason) in cases {
        let mut ws = testkit::dial(url, headers).await.expect("dial");
        ws.send(Message::text(text.clone())).await.unwrap();
        let (code, r) = recv_close(&mut ws, Duration::from_secs(10)).await;
        assert_eq!((code, r.as_str()), (4401, reason), "{url} {text}");
    }
}
