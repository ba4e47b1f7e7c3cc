//! The server skeleton over real HTTP: health and readiness, role routing, body limits, the admin
//! bearer, and `POST /v1/host-token` (docs/reference/http.md, P-01/P-02).

mod support;
use support::common;

use orca_relay::crypto;
use orca_relay::server::Running;
use orca_relay::store::testing::temp_dir;

const SIGNING: &str = "0123456789abcdef0123456789abcdef";
const SELF_HOSTED: &str = "self-hosted-key-self-hosted-key-0001";
const ADMIN: &str = "admin-token-admin-token-admin-token-0001";
const CLUSTER: &str = "cluster-key-cluster-key-cluster-key-0001";

async fn start(role: &str, extra: &[&str]) -> Running {
    let dir = temp_dir("orca-relay-server");
    let db = format!("sqlite://{}/relay.sqlite3", dir.display());
    let data = dir.display().to_string();
    let mut args = vec![
        "orca-relay",
        "--listen",
        "127.0.0.1:0",
        "--role",
        role,
        "--data-dir",
        &data,
        "--database-url",
        &db,
        "--assignment-signing-key",
        SIGNING,
        "--self-hosted-key",
        SELF_HOSTED,
        "--admin-token",
        ADMIN,
        "--cluster-key",
        CLUSTER,
    ];
    if role.contains("cell") && !role.contains("director") && role != "all" {
        args.extend(["--director-url", "http://127.0.0.1:9"]);
    }
    args.extend_from_slice(extra);
    common::serve::start(&args).await
}

fn url(r: &Running, path: &str) -> String {
    format!("http://{}{}", r.addr, path)
}

fn key_and_id() -> (String, String) {
    let kp = crypto::nacl::X25519Keypair::from_secret([0x11; 32]);
    (
        crypto::b64::std_encode(&kp.public),
        crypto::ident::relay_host_id(&kp.public),
    )
}

#[tokio::test]
async fn health_ready_and_role_routing() {
    let r = start("director", &[]).await;
    let c = reqwest::Client::new();
    let h: serde_json::Value = c
        .get(url(&r, "/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        h,
        serde_json::json!({"ok": true, "roles": ["director"], "connectionCapacityProtocol": 2})
    );
    let ready = c.get(url(&r, "/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(ready.text().await.unwrap(), r#"{"ok":true}"#);
    for (path, method, code) in [
        ("/v1/host/challenge", "POST", "push_only"),
        ("/v1/devices", "GET", "push_only"),
        ("/v1/devices/abc", "DELETE", "push_only"),
        ("/v1/send", "POST", "push_only"),
        ("/v1/admin/drain", "POST", "cell_only"),
        ("/v1/host/control", "GET", "cell_only"),
        ("/v1/host/data/abc", "GET", "cell_only"),
        ("/nope", "GET", "not_found"),
    ] {
        let resp = c
            .request(method.parse().unwrap(), url(&r, path))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{path}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body, serde_json::json!({ "error": code }), "{path}");
    }
    r.shutdown().await;

    let r = start("push", &[]).await;
    let h: serde_json::Value = c
        .get(url(&r, "/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["roles"], serde_json::json!(["push"]));
    assert_eq!(h["pushProtocol"], 1);
    assert_eq!(h["deliveryProtocol"], 2);
    for path in [
        "/v1/host-token",
        "/v1/assign",
        "/v1/admin/cells",
        "/v1/admin/overview",
    ] {
        let resp = c.post(url(&r, path)).send().await.unwrap();
        assert_eq!(resp.status(), 404);
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "director_only", "{path}");
    }
    r.shutdown().await;
}

#[tokio::test]
async fn metrics_and_runtime_status_need_the_admin_token() {
    let r = start("all", &[]).await;
    let c = reqwest::Client::new();
    let resp = c.get(url(&r, "/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = c
        .get(url(&r, "/metrics"))
        .bearer_auth("wrong-wrong-wrong-wrong-wrong-wrong-wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let text = c
        .get(url(&r, "/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("orca_push_queue_depth"), "{text}");

    let resp = c
        .post(url(&r, "/v1/admin/runtime-status"))
        .bearer_auth(ADMIN)
        .body(r#"{"v":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["v"], 1);
    assert_eq!(body["cellId"], "local");
    assert_eq!(body["cellIncarnation"].as_str().unwrap().len(), 36);
    assert_eq!(body["connectionCapacity"], serde_json::Value::Null);
    assert_eq!(body["draining"], false);
    let resp = c
        .post(url(&r, "/v1/admin/runtime-status"))
        .bearer_auth(ADMIN)
        .body(r#"{"v":1,"x":2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    r.shutdown().await;
}

#[tokio::test]
async fn host_token_mints_verifiable_tokens() {
    let r = start("director", &[]).await;
    let c = reqwest::Client::new();
    let (key, id) = key_and_id();
    let before = orca_relay::clock::now_ms();
    let resp = c
        .post(url(&r, "/v1/host-token"))
        .bearer_auth(SELF_HOSTED)
        .json(&serde_json::json!({"relayHostId": id, "hostPublicKeyB64": key, "v": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["cache-control"], "no-store");
    let body: serde_json::Value = resp.json().await.unwrap();
    let expires_at = body["expiresAt"].as_i64().unwrap();
    assert!(expires_at > before && expires_at <= before + 15 * 60_000 + 1000);
    let token = body["relayToken"].as_str().unwrap();
    // The token verifies with K = HMAC(signing key, label) and carries the documented claims.
    let verifier = crypto::jwt::HostTokenVerifier::new(crypto::jwt::self_hosted_key(SIGNING), None);
    let claims = verifier
        .verify(token, orca_relay::clock::now_ms())
        .await
        .unwrap();
    assert_eq!(claims.sub, "self-hosted");
    assert_eq!(claims.relay_host_id, id);
    assert_eq!(claims.prof, format!("http://{}", r.addr));
    assert_eq!(claims.iss, format!("http://{}", r.addr));
    assert_eq!(claims.org, None);
    assert_eq!(claims.exp * 1000, expires_at);
    let payload: serde_json::Value = serde_json::from_slice(
        &base64::Engine::decode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            token.split('.').nth(1).unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(payload["purpose"], "host-control");
    assert_eq!(payload["aud"], "orca-relay");
    let header = token.split('.').next().unwrap();
    assert_eq!(
        base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, header).unwrap(),
        br#"{"alg":"HS256","typ":"JWT"}"#
    );

    let resp = c
        .post(url(&r, "/v1/host-token"))
        .bearer_auth(SELF_HOSTED)
        .json(&serde_json::json!({"relayHostId": id, "hostPublicKeyB64": key, "userId": "alice"}))
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = resp.json().await.unwrap();
    let claims = verifier
        .verify(
            body["relayToken"].as_str().unwrap(),
            orca_relay::clock::now_ms(),
        )
        .await
        .unwrap();
    assert_eq!(claims.sub, "alice");
    r.shutdown().await;
}

#[tokio::test]
async fn host_token_rejects_bad_input() {
    let r = start("all", &[]).await;
    let c = reqwest::Client::new();
    let (key, id) = key_and_id();
    let post = |bearer: Option<&str>, body: String| {
        let mut req = c.post(url(&r, "/v1/host-token")).body(body);
        if let Some(b) = bearer {
            req = req.header("authorization", b);
        }
        req.send()
    };
    let good = serde_json::json!({"relayHostId": id, "hostPublicKeyB64": key}).to_string();
    for bearer in [
        None,
        Some("Bearer wrong-key-wrong-key-wrong-key-wrong".to_string()),
        Some(format!("bearer {SELF_HOSTED}")),
        Some(format!("Bearer  {SELF_HOSTED}")),
        Some(format!("Bearer {}", "x".repeat(300))),
    ] {
        let resp = post(bearer.as_deref(), good.clone()).await.unwrap();
        assert_eq!(resp.status(), 401, "{bearer:?}");
        assert_eq!(resp.headers()["cache-control"], "no-store");
        assert_eq!(resp.text().await.unwrap(), r#"{"error":"invalid_token"}"#);
    }
    let auth = format!("Bearer {SELF_HOSTED}");
    let mut non_canonical = key.clone().into_bytes();
    // Flip the last data char so the padding bits are non-zero: same bytes would need 'M'→'N'.
    let last = non_canonical.len() - 2;
    non_canonical[last] = if non_canonical[last] == b'A' {
        b'B'
    } else {
        b'A'
    };
    let non_canonical = String::from_utf8(non_canonical).unwrap();
    let other_id = crypto::ident::relay_host_id(&[2u8; 32]);
    let bad_bodies = [
        serde_json::json!({"relayHostId": other_id, "hostPublicKeyB64": key}).to_string(),
        serde_json::json!({"relayHostId": id, "hostPublicKeyB64": non_canonical}).to_string(),
        serde_json::json!({"relayHostId": id, "hostPublicKeyB64": key, "extra": 1}).to_string(),
        serde_json::json!({"relayHostId": id, "hostPublicKeyB64": key, "userId": "u".repeat(129)})
            .to_string(),
        serde_json::json!({"relayHostId": id, "hostPublicKeyB64": key, "userId": ""}).to_string(),
        serde_json::json!({"relayHostId": id, "hostPublicKeyB64": key, "v": 2}).to_string(),
        "not json".to_string(),
        String::new(),
    ];
    for body in bad_bodies {
        let resp = post(Some(&auth), body.clone()).await.unwrap();
        assert_eq!(resp.status(), 400, "{body}");
        assert_eq!(resp.text().await.unwrap(), r#"{"error":"invalid_request"}"#);
    }
    let resp = post(Some(&auth), "x".repeat(5000)).await.unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(
        resp.text().await.unwrap(),
        r#"{"error":"request_too_large"}"#
    );

    // A chunked body (no Content-Length) is limited on the bytes actually read.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 1000])).collect();
    let resp = c
        .post(url(&r, "/v1/host-token"))
        .header("authorization", &auth)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    r.shutdown().await;
}

#[tokio::test]
async fn unconfigured_self_hosted_key_always_refuses() {
    let dir = temp_dir("orca-relay-server");
    let db = format!("sqlite://{}/relay.sqlite3", dir.display());
    let args = vec![
        "orca-relay",
        "--listen",
        "127.0.0.1:0",
        "--role",
        "director",
        "--database-url",
        &db,
        "--assignment-signing-key",
        SIGNING,
        "--admin-token",
        ADMIN,
        "--cluster-key",
        CLUSTER,
    ];
    let r = common::serve::start(&args).await;
    let (key, id) = key_and_id();
    let resp = reqwest::Client::new()
        .post(url(&r, "/v1/host-token"))
        .bearer_auth(SELF_HOSTED)
        .json(&serde_json::json!({"relayHostId": id, "hostPublicKeyB64": key}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    r.shutdown().await;
}

#[tokio::test]
async fn overview_carries_push_only_when_push_runs() {
    let c = reqwest::Client::new();
    for (role, has_push) in [("all", true), ("director", false)] {
        let r = start(role, &[]).await;
        let v: serde_json::Value = c
            .get(url(&r, "/v1/admin/overview"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["v"], 1, "{v}");
        assert_eq!(v.get("push").is_some(), has_push, "{role}: {v}");
        if has_push {
            assert_eq!(
                v["push"],
                serde_json::json!({"queueDepth": 0, "deadRegistrations": 0})
            );
        }
        r.shutdown().await;
    }
}
