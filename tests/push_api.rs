//! Push gateway HTTP scenarios (docs/reference/http.md: U-01..U-20, U-36..U-39 accept rules, U-42..U-45), each
//! on SQLite and, when configured, on Postgres.

mod support;

use std::time::Duration;

use orca_relay::params;
use reqwest::Method;
use serde_json::json;
use support::director::PgProxy;
use support::push::*;

async fn server(t: &orca_relay::store::testing::TestDb) -> Server {
    Server::start(&t.url, Opts::default()).await
}

/// U-01, U-02.
#[tokio::test]
async fn u01_u02_health_and_role() {
    run_all(|t| async move {
        let s = server(&t).await;
        let (st, _, v) = s.call(Method::GET, "/health", None, None).await;
        assert_eq!(st, 200);
        assert_eq!(v["pushProtocol"], 1);
        assert_eq!(v["deliveryProtocol"], 2);
        s.stop().await;

        let o = Opts {
            role: Some("director".into()),
            extra: vec![
                ("--assignment-signing-key".into(), "k".repeat(40)),
                ("--cluster-key".into(), "c".repeat(40)),
            ],
            ..Default::default()
        };
        let d = Server::start(&t.url, o).await;
        let (st, v) = d
            .post(
                "/v1/host/challenge",
                None,
                json!({"v":1,"hostPublicKeyB64":Host::new().public_b64()}),
            )
            .await;
        assert_eq!((st, v), (404, json!({"error":"push_only"})));
        let (st, _, v) = d.call(Method::GET, "/v1/devices", None, None).await;
        assert_eq!((st, v), (404, json!({"error":"push_only"})));
        d.stop().await;
    })
    .await;
}

/// U-05, U-06, U-07, U-08.
#[tokio::test]
async fn u05_to_u08_challenge_and_session() {
    run_all(|t| async move {
        let s = server(&t).await;
        let h = Host::new();
        let before = s.counter("challenge_issued");
        let c = h.challenge(&s).await;
        assert_eq!(s.counter("challenge_issued"), before + 1);
        assert_eq!(c.challenge_id.len(), 36);
        assert!(uuid::Uuid::parse_str(&c.challenge_id).is_ok());
        assert_eq!(c.challenge_id, c.challenge_id.to_lowercase());
        assert_eq!(c.gateway_ephemeral_public_key_b64.len(), 44);
        assert_eq!(c.nonce_b64.len(), 32);
        assert!(!c.nonce_b64.contains('='));
        assert!(c.ciphertext_b64.len() <= 16384);
        let now = orca_relay::clock::now_ms();
        assert!((c.expires_at - now - 10_000).abs() < 2_000);
        // The box opens and all ten fields check against the configured origin (helper does).
        let proof = h.answer(&s, &c);
        // U-06
        let rejected = s.counter("challenge_rejected");
        let pk = h.public_b64();
        let mut pad_bits = "A".repeat(42);
        pad_bits.push_str("B=");
        for bad in [
            pk.trim_end_matches('=').to_string(),
            "B6N8vBQgk8i3VdwbEOhstCY3StFqqFPtC9_AsrhtHHw=".to_string(),
            pad_bits,
            std_b64(&[7u8; 33]),
            String::new(),
        ] {
            let (st, v) = s
                .post(
                    "/v1/host/challenge",
                    None,
                    json!({"v":1,"hostPublicKeyB64":bad}),
                )
                .await;
            assert_eq!((st, v), (400, json!({"error":"invalid_request"})), "{bad}");
        }
        assert_eq!(s.counter("challenge_rejected"), rejected + 5);
        // U-07
        for body in [
            json!({"hostPublicKeyB64":pk}).to_string(),
            json!({"v":2,"hostPublicKeyB64":pk}).to_string(),
            json!({"v":1,"hostPublicKeyB64":pk,"x":1}).to_string(),
            format!(r#"{{"v":1,"v":1,"hostPublicKeyB64":"{pk}"}}"#),
            json!({"v":"1","hostPublicKeyB64":pk}).to_string(),
            "not json".to_string(),
            String::new(),
        ] {
            let (st, _, v) = s
                .call(Method::POST, "/v1/host/challenge", None, Some(body.clone()))
                .await;
            assert_eq!((st, v), (400, json!({"error":"invalid_request"})), "{body}");
        }
        // U-08
        let (st, v) = s
            .post(
                "/v1/host/session",
                None,
                json!({"v":1,"challengeId":c.challenge_id,"proofB64":proof}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 3);
        let token = v["sessionToken"].as_str().unwrap();
        assert_eq!(token.len(), 43);
        assert!(token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        let exp = v["expiresAt"].as_i64().unwrap();
        assert!((exp - orca_relay::clock::now_ms() - 86_400_000).abs() < 5_000);
        assert_eq!(v["hostFingerprint"], h.fp.as_str());
        assert_logs_clean(&[token.to_string(), proof]);
        s.stop().await;
    })
    .await;
}

fn std_b64(b: &[u8]) -> String {
    orca_relay::crypto::b64::std_encode(b)
}

async fn session_call(s: &Server, id: &str, proof: &str) -> (u16, serde_json::Value) {
    s.post(
        "/v1/host/session",
        None,
        json!({"v":1,"challengeId":id,"proofB64":proof}),
    )
    .await
}

/// U-09, U-10, U-12.
#[tokio::test]
async fn u09_u10_u12_proofs_and_single_session() {
    run_all(|t| async move {
        let s = server(&t).await;
        let a = Host::new();
        let b = Host::new();
        let rejected = s.counter("session_rejected");
        // U-09
        let (st, v) = session_call(&s, &uuid::Uuid::new_v4().to_string(), &std_b64(&[1; 32])).await;
        assert_eq!((st, v), (401, json!({"error":"invalid_challenge"})));
        let ca = a.challenge(&s).await;
        let cb = b.challenge(&s).await;
        let pa = a.answer(&s, &ca);
        let (st, v) = session_call(&s, &cb.challenge_id, &pa).await;
        assert_eq!((st, v), (401, json!({"error":"invalid_proof"})));
        // A proof over another gatewayOrigin: the host computes it for a different origin.
        let mut transcript_ctx = ca.clone();
        transcript_ctx.challenge_id = ca.challenge_id.clone();
        let other = orca_relay::crypto::push_proof::answer_push_challenge(
            &a.key.secret,
            "https://other.example",
            &ca,
            orca_relay::clock::now_ms(),
        );
        assert!(other.is_err(), "the host refuses a foreign origin");
        let forged = orca_relay::crypto::hmac_sha256(&[9; 32], b"other origin");
        let (st, v) = session_call(&s, &ca.challenge_id, &std_b64(&forged)).await;
        assert_eq!((st, v), (401, json!({"error":"invalid_proof"})));
        // Right proof 11 s after issue: make the row expired instead of waiting.
        let c_late = a.challenge(&s).await;
        let p_late = a.answer(&s, &c_late);
        t.db.execute(
            "UPDATE push_challenges SET expires_at = expires_at - 11000 WHERE challenge_id = $1",
            params![c_late.challenge_id.as_str()],
        )
        .await
        .unwrap();
        let (st, v) = session_call(&s, &c_late.challenge_id, &p_late).await;
        assert_eq!((st, v), (401, json!({"error":"invalid_proof"})));
        // U-10: wrong proof does not consume; right proof works; a replay fails.
        let (st, _) = session_call(&s, &ca.challenge_id, &std_b64(&[3; 32])).await;
        assert_eq!(st, 401);
        let (st, v1) = session_call(&s, &ca.challenge_id, &pa).await;
        assert_eq!(st, 200, "{v1}");
        let (st, v) = session_call(&s, &ca.challenge_id, &pa).await;
        assert_eq!((st, v), (401, json!({"error":"invalid_proof"})));
        assert_eq!(s.counter("session_rejected"), rejected + 6);
        // U-12
        let first = v1["sessionToken"].as_str().unwrap().to_string();
        let second = a.session(&s).await;
        let (st, _, v) = s.call(Method::GET, "/v1/devices", Some(&first), None).await;
        assert_eq!((st, v), (401, json!({"error":"invalid_token"})));
        let (st, _, _) = s
            .call(Method::GET, "/v1/devices", Some(&second), None)
            .await;
        assert_eq!(st, 200);
        s.stop().await;
    })
    .await;
}

/// U-11: 20 concurrent right proofs, one wins.
#[tokio::test]
async fn u11_concurrent_proofs() {
    run_all(|t| async move {
        let s = std::sync::Arc::new(server(&t).await);
        let h = Host::new();
        let c = h.challenge(&s).await;
        let proof = h.answer(&s, &c);
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let s = s.clone();
            let (id, p) = (c.challenge_id.clone(), proof.clone());
            tasks.push(tokio::spawn(async move { session_call(&s, &id, &p).await }));
        }
        let mut ok = 0;
        let mut invalid = 0;
        for t in tasks {
            match t.await.unwrap() {
                (200, _) => ok += 1,
                (401, v) if v == json!({"error":"invalid_proof"}) => invalid += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((ok, invalid), (1, 19));
        std::sync::Arc::try_unwrap(s).ok().unwrap().stop().await;
    })
    .await;
}

/// U-13, U-14.
#[tokio::test]
async fn u13_u14_bearers() {
    run_all(|t| async move {
        let s = server(&t).await;
        let h = Host::new();
        let token = h.session(&s).await;
        let get = |auth: Option<String>| {
            let s = &s;
            async move {
                let mut r = s
                    .client
                    .get(format!("{}/v1/devices", s.base))
                    .header("x-forwarded-for", &s.xff);
                if let Some(a) = auth {
                    r = r.header("authorization", a);
                }
                let resp = r.send().await.unwrap();
                let st = resp.status().as_u16();
                (
                    st,
                    resp.json::<serde_json::Value>().await.unwrap_or_default(),
                )
            }
        };
        let random = orca_relay::crypto::random_b64u32();
        for a in [
            None,
            Some("Basic x".to_string()),
            Some("Bearer   ".to_string()),
            Some(format!("Bearer {random}")),
        ] {
            assert_eq!(get(a).await, (401, json!({"error":"invalid_token"})));
        }
        let (st, _) = get(Some(format!("bearer {token}"))).await;
        assert_eq!(st, 200);
        // U-14
        t.db.execute(
            "UPDATE push_sessions SET expires_at = $1 WHERE host_fingerprint = $2",
            params![orca_relay::clock::now_ms() - 1, h.fp.as_str()],
        )
        .await
        .unwrap();
        assert_eq!(
            get(Some(format!("Bearer {token}"))).await,
            (401, json!({"error":"session_expired"}))
        );
        s.stop().await;
    })
    .await;
}

/// U-15, U-16, U-17.
#[tokio::test]
async fn u15_to_u17_registry() {
    run_all(|t| async move {
        let s = server(&t).await;
        let h = Host::new();
        let tok = h.session(&s).await;
        let id1 = s.register(&tok, "d1", "ios", &ios_token()).await;
        let id2 = s.register(&tok, "d1", "ios", &ios_token()).await;
        assert_eq!(id1, id2);
        let list = s.devices(&tok).await;
        assert_eq!(
            list,
            vec![json!({"registrationId":id1,"deviceId":"d1","platform":"ios","dead":false})]
        );
        // U-16
        let rejected = s.counter("device_rejected");
        let a32 = "a".repeat(32);
        for body in [
            json!({"v":1,"deviceId":"x","platform":"ios","token":"abcd"}),
            json!({"v":1,"deviceId":"x","platform":"ios","token":"abc","apnsEnvironment":"sandbox"}),
            json!({"v":1,"deviceId":"x","platform":"ios","token":"zz","apnsEnvironment":"sandbox"}),
            json!({"v":1,"deviceId":"x","platform":"android","token":a32,"apnsEnvironment":"sandbox"}),
            json!({"v":1,"deviceId":"x","platform":"android","token":a32,"apnsEnvironment":null}),
            json!({"v":1,"deviceId":"x","platform":"android","token":"a".repeat(31)}),
            json!({"v":1,"deviceId":"x","platform":"android","token":format!("{a32} x")}),
            json!({"v":1,"deviceId":"x","platform":"web","token":a32}),
        ] {
            let (st, v) = s.post("/v1/devices", Some(&tok), body.clone()).await;
            assert_eq!((st, v), (400, json!({"error":"invalid_request"})), "{body}");
        }
        assert_eq!(s.counter("device_rejected"), rejected + 8);
        // U-17
        for i in 2..=64 {
            s.register(&tok, &format!("d{i}"), "android", &android_token()).await;
        }
        let (st, v) = s
            .post(
                "/v1/devices",
                Some(&tok),
                json!({"v":1,"deviceId":"d65","platform":"android","token":android_token()}),
            )
            .await;
        assert_eq!((st, v), (409, json!({"error":"too_many_devices"})));
        assert_eq!(s.register(&tok, "d1", "ios", &ios_token()).await, id1);
        assert_eq!(s.devices(&tok).await.len(), 64);
        s.stop().await;
    })
    .await;
}

/// U-18.
#[tokio::test]
async fn u18_ownership() {
    run_all(|t| async move {
        let s = server(&t).await;
        let (h, j) = (Host::new(), Host::new());
        let (th, tj) = (h.session(&s).await, j.session(&s).await);
        let hid = s.register(&th, "dh", "ios", &ios_token()).await;
        let jid = s.register(&tj, "dj", "ios", &ios_token()).await;
        let jl = s.devices(&tj).await;
        assert_eq!(jl.len(), 1);
        assert_eq!(jl[0]["registrationId"], jid.as_str());
        let del = |tok: &str, id: &str| {
            let (s, tok, id) = (&s, tok.to_string(), id.to_string());
            async move {
                let (st, _, v) = s
                    .call(
                        Method::DELETE,
                        &format!("/v1/devices/{id}"),
                        Some(&tok),
                        None,
                    )
                    .await;
                (st, v)
            }
        };
        assert_eq!(del(&tj, &hid).await, (404, json!({"error":"not_found"})));
        assert_eq!(s.devices(&th).await.len(), 1);
        assert_eq!(del(&th, &hid).await.0, 204);
        assert_eq!(del(&th, &hid).await, (404, json!({"error":"not_found"})));
        s.stop().await;
    })
    .await;
}

/// U-19, U-20.
#[tokio::test]
async fn u19_u20_send_validation_and_ownership() {
    run_all(|t| async move {
        let s = server(&t).await;
        let (h, j) = (Host::new(), Host::new());
        let (th, tj) = (h.session(&s).await, j.session(&s).await);
        let own = s.register(&th, "d", "ios", &ios_token()).await;
        let jid = s.register(&tj, "d", "ios", &ios_token()).await;
        let ids21: Vec<String> = (0..21).map(|i| format!("id{i}")).collect();
        let mut no_id = alert("x", 1);
        no_id.as_object_mut().unwrap().remove("notificationId");
        no_id["kind"] = "dismiss".into();
        let mut long_title = alert("x", 1);
        long_title["title"] = "t".repeat(81).into();
        let mut big = alert("x", 1);
        big["paneKey"] = "p".repeat(2000).into();
        big["worktreeId"] = "w".repeat(900).into();
        let mut no_state = alert("x", 1);
        no_state.as_object_mut().unwrap().remove("agentState");
        let mut neg = alert("x", 1);
        neg["notificationSeq"] = (-1).into();
        for body in [
            json!({"v":1,"registrationIds":ids21,"notification":alert("x",1)}),
            json!({"v":1,"registrationIds":[own],"notification":no_id}),
            json!({"v":1,"registrationIds":[own],"notification":long_title}),
            json!({"v":1,"registrationIds":[own],"notification":big}),
            json!({"v":1,"registrationIds":[own],"notification":no_state}),
            json!({"v":1,"registrationIds":[own],"notification":neg}),
        ] {
            let (st, v) = s.post("/v1/send", Some(&th), body).await;
            assert_eq!((st, v), (400, json!({"error":"invalid_request"})));
        }
        let unknown = uuid::Uuid::new_v4().to_string();
        let (st, v) = s
            .post(
                "/v1/send",
                Some(&th),
                json!({"v":1,"registrationIds":[unknown, jid, own, own],"notification":alert("n",1)}),
            )
            .await;
        assert_eq!(st, 200);
        assert_eq!(
            v,
            json!({"results":[
                {"registrationId":unknown,"status":"error"},
                {"registrationId":jid,"status":"error"},
                {"registrationId":own,"status":"queued"}]})
        );
        s.stop().await;
    })
    .await;
}

/// U-36 (accept side), U-37, U-38, U-39 (accept side): quotas, idempotency and fences without a
/// provider (no APNs configured, so nothing is sent; fence decisions are checked in the rows).
#[tokio::test]
async fn u37_u38_u39_accept_rules() {
    run_all(|t| async move {
        let s = server(&t).await;
        let h = Host::new();
        let tok = h.session(&s).await;
        let a = s.register(&tok, "a", "ios", &ios_token()).await;
        let b = s.register(&tok, "b", "ios", &ios_token()).await;
        // U-37
        let n = alert("n1", 1);
        assert_eq!(s.send(&tok, &[&a], n.clone()).await, ["queued"]);
        assert_eq!(s.send(&tok, &[&a], n.clone()).await, ["queued"]);
        let mut retitled = n.clone();
        retitled["title"] = "Other".into();
        assert_eq!(s.send(&tok, &[&a], retitled).await, ["error"]);
        let mut sound = n.clone();
        sound["sound"] = false.into();
        assert_eq!(s.send(&tok, &[&a], sound).await, ["queued"]);
        let mut explicit = n.clone();
        explicit["kind"] = "alert".into();
        assert_eq!(s.send(&tok, &[&a], explicit).await, ["queued"]);
        let rows =
            t.db.query("SELECT COUNT(*) FROM push_event_recipients", &[])
                .await
                .unwrap();
        assert_eq!(rows[0].i64(0), 1, "one recipient, so one provider request");
        // U-39
        let mut past = alert("p", 1);
        past["expiresAt"] = (orca_relay::clock::now_ms() - 1).into();
        assert_eq!(s.send(&tok, &[&a], past).await, ["error"]);
        // U-36 accept side: a dismiss fence at seq 5 swallows the seq-4 alert.
        assert_eq!(s.send(&tok, &[&a], dismiss("n3", 5)).await, ["queued"]);
        assert_eq!(s.send(&tok, &[&a], alert("n3", 4)).await, ["queued"]);
        let fenced = orca_relay::push::model::event_id(&h.fp, "alert", "epoch-1", 4);
        let rows =
            t.db.query(
                "SELECT COUNT(*) FROM push_event_recipients WHERE event_id = $1",
                params![fenced.as_str()],
            )
            .await
            .unwrap();
        assert_eq!(
            rows[0].i64(0),
            0,
            "a fenced alert gets no recipient and no delivery"
        );
        // U-38: 298 more distinct alerts fill the quota of 300 (n1 and n3 counted once each).
        for i in 0..298u64 {
            let r = s
                .send(&tok, &[&a, &b], alert(&format!("q{i}"), 1000 + i))
                .await;
            assert_eq!(r, ["queued", "queued"], "alert {i}");
        }
        assert_eq!(
            s.send(&tok, &[&a, &b], alert("over", 99_999)).await,
            ["rate_limited", "rate_limited"]
        );
        assert_eq!(s.send(&tok, &[&a], dismiss("q0", 1000)).await, ["queued"]);
        assert_eq!(
            s.send(&tok, &[&a, &b], alert("q1", 1001)).await,
            ["queued", "queued"]
        );
        s.stop().await;
    })
    .await;
}

/// U-42: unauth-IP bucket keyed by the trusted X-Forwarded-For entry.
#[tokio::test]
async fn u42_unauth_rate_limit() {
    run_all(|t| async move {
        let s = server(&t).await;
        let body = json!({"v":1,"hostPublicKeyB64":Host::new().public_b64()}).to_string();
        let xff = "1.2.3.4, 198.51.100.7";
        for i in 0..30 {
            let (st, _, _) = s
                .call_as(
                    xff,
                    Method::POST,
                    "/v1/host/challenge",
                    None,
                    Some(body.clone()),
                )
                .await;
            assert_eq!(st, 200, "call {i}");
        }
        let limited = s.counter("ip_rate_limited");
        let (st, hd, v) = s
            .call_as(
                xff,
                Method::POST,
                "/v1/host/challenge",
                None,
                Some(body.clone()),
            )
            .await;
        assert_eq!((st, v), (429, json!({"error":"rate_limited"})));
        let ra: u64 = hd["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(ra >= 1);
        let (st, _, _) = s
            .call_as(
                xff,
                Method::POST,
                "/v1/host/session",
                None,
                Some(json!({"v":1,"challengeId":"x","proofB64":"y"}).to_string()),
            )
            .await;
        assert_eq!(st, 429);
        assert_eq!(s.counter("ip_rate_limited"), limited + 2);
        let (st, _, _) = s
            .call_as(
                "198.51.100.8",
                Method::POST,
                "/v1/host/challenge",
                None,
                Some(body),
            )
            .await;
        assert_eq!(st, 200);
        s.stop().await;
    })
    .await;
}

/// U-43: invalid-bearer bucket per IP, per-host bucket.
#[tokio::test]
async fn u43_bearer_and_host_limits() {
    run_all(|t| async move {
        let s = server(&t).await;
        let h = Host::new();
        let tok = h.session(&s).await;
        let (x, y) = ("203.0.113.10", "203.0.113.11");
        for _ in 0..30 {
            let bad = orca_relay::crypto::random_b64u32();
            let (st, _, _) = s
                .call_as(x, Method::GET, "/v1/devices", Some(&bad), None)
                .await;
            assert_eq!(st, 401);
        }
        let (st, _, v) = s
            .call_as(x, Method::GET, "/v1/devices", Some(&tok), None)
            .await;
        assert_eq!((st, v), (429, json!({"error":"rate_limited"})));
        let (st, _, _) = s
            .call_as(y, Method::GET, "/v1/devices", Some(&tok), None)
            .await;
        assert_eq!(st, 200);
        let started = std::time::Instant::now();
        let mut ok = 1u64; // the call from Y
        let mut first_429 = None;
        for i in 0..700u64 {
            let (st, _, _) = s
                .call_as(y, Method::GET, "/v1/devices", Some(&tok), None)
                .await;
            match st {
                200 => ok += 1,
                429 => {
                    first_429 = Some(i + 2);
                    break;
                }
                other => panic!("{other}"),
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        let call = first_429.expect("a 429 came");
        assert!(ok >= 600, "{ok}");
        assert!(
            (call as f64) < 600.0 + 10.0 * elapsed + 2.0,
            "{call} after {elapsed}s"
        );
        s.stop().await;
    })
    .await;
}

/// U-45: body limits.
#[tokio::test]
async fn u45_body_limits() {
    run_all(|t| async move {
        let s = server(&t).await;
        let big = "x".repeat(16385);
        let (st, _, v) = s
            .call(Method::POST, "/v1/host/challenge", None, Some(big))
            .await;
        assert_eq!((st, v), (413, json!({"error":"request_too_large"})));
        // Chunked: no Content-Length.
        let chunks: Vec<Result<hyper::body::Frame<bytes::Bytes>, std::io::Error>> = (0..20)
            .map(|_| {
                Ok(hyper::body::Frame::data(bytes::Bytes::from(vec![
                    b' ';
                    1000
                ])))
            })
            .collect();
        let resp = s
            .client
            .post(format!("{}/v1/host/challenge", s.base))
            .header("x-forwarded-for", &s.xff)
            .body(reqwest::Body::wrap(http_body_util::StreamBody::new(
                futures_util::stream::iter(chunks),
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 413);
        let mut padded = json!({"v":1,"hostPublicKeyB64":Host::new().public_b64()}).to_string();
        padded.push_str(&" ".repeat(16384 - padded.len()));
        assert_eq!(padded.len(), 16384);
        let (st, _, _) = s
            .call(Method::POST, "/v1/host/challenge", None, Some(padded))
            .await;
        assert_eq!(st, 200);
        let (st, _, v) = s
            .call(Method::POST, "/v1/send", None, Some("y".repeat(20000)))
            .await;
        assert_eq!((st, v), (401, json!({"error":"invalid_token"})));
        s.stop().await;
    })
    .await;
}

/// Drain: a push request during shutdown answers `503 shutting_down`.
#[tokio::test]
async fn shutting_down_refuses() {
    let t = orca_relay::store::testing::TestDb::sqlite().await;
    let s = server(&t).await;
    s.running().ctx.shutdown.cancel();
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let resp = fresh
        .get(format!("{}/v1/devices", s.base))
        .header("authorization", "Bearer x")
        .send()
        .await;
    // U-50 allows either answer: `503 shutting_down` or a refused/closed connection.
    if let Ok(resp) = resp {
        let (st, hd) = (resp.status().as_u16(), resp.headers().clone());
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!((st, v), (503, json!({"error":"shutting_down"})));
        assert_eq!(hd["retry-after"], "1");
    }
    s.stop().await;
}

/// U-04: the normative vector of docs/reference/http.md through the public API.
#[test]
fn u04_normative_vector() {
    use orca_relay::crypto::push_proof::{
        answer_push_challenge, issue_push_challenge_with, secret_hash,
    };
    use orca_relay::crypto::{sha256_hex, ChallengeRandomness, X25519Keypair};
    let seq = |first: u8| -> [u8; 32] { std::array::from_fn(|i| first + i as u8) };
    let host = X25519Keypair::from_secret(seq(0x01));
    let random = ChallengeRandomness {
        ephemeral_secret: seq(0x21),
        nonce: std::array::from_fn(|i| 0x41 + i as u8),
        challenge_secret: seq(0x61),
        challenge_id: "0b7e4c2a-5d1f-4e8b-9a3c-6f2d8e1b7a40".into(),
    };
    let (resp, hash) = issue_push_challenge_with(
        "https://push.example.test",
        &host.public,
        1_767_225_600_000,
        &random,
    );
    let sealed = orca_relay::crypto::b64::std_decode_canonical(&resp.ciphertext_b64).unwrap();
    assert_eq!(sealed.len(), 488);
    assert_eq!(
        sha256_hex(&sealed),
        "0707378218aea2f56d54b0d5483e4764b4d7bd4daa7ea5a61e43bbe6df02d6ff"
    );
    assert_eq!(
        resp.gateway_ephemeral_public_key_b64,
        "WGmv9FBUlzLLqu1eXfmzCm2jHLDldCutWtShp2jxpns="
    );
    assert_eq!(resp.expires_at, 1_767_225_610_000);
    assert_eq!(hash, "VrqJezT_4dry8mHbyKVeVYz4MGtIlazDvrD1HBzYUL0");
    let proof = answer_push_challenge(
        &host.secret,
        "https://push.example.test",
        &resp,
        1_767_225_600_000,
    )
    .unwrap();
    assert_eq!(
        std_b64(&proof),
        "e3cFfP3o64AwWVR7l1LmhFOnCg6p3++1aXXtc6wdvfQ="
    );
    assert_eq!(secret_hash(&proof), hash);
}

/// APNs keys: PKCS#8 and SEC1 PEM both load, SEC1 also after the `EC PARAMETERS` block that
/// `openssl ecparam -genkey` writes first; anything else is refused.
#[test]
fn apns_key_formats() {
    use orca_relay::push::apns::load_key;
    let with_params = format!(
        "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{}",
        keys::APNS_KEY_SEC1_PEM
    );
    for pem in [keys::APNS_KEY_PEM, keys::APNS_KEY_SEC1_PEM, &with_params] {
        let key = load_key(pem).unwrap();
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some("KEYID12345".into());
        header.typ = None;
        let jwt = jsonwebtoken::encode(
            &header,
            &json!({"iss":"TEAM123456","iat":orca_relay::clock::now_ms() / 1000}),
            &key,
        )
        .expect("signs");
        support::push::fakes::verify_apns_jwt(Some(&format!("bearer {jwt}"))).unwrap();
    }
    assert!(load_key(keys::FCM_KEY_PEM).is_err());
    assert!(load_key(
        "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
    )
    .is_err());
    assert!(load_key("").is_err());
}

/// Validation mode: `/health` says so, push routes answer `503 validation_only`.
#[tokio::test]
async fn validation_mode() {
    let t = orca_relay::store::testing::TestDb::sqlite().await;
    let s = Server::start(
        &t.url,
        Opts {
            extra: vec![("--push-mode".into(), "validation".into())],
            ..Default::default()
        },
    )
    .await;
    let (st, _, v) = s.call(Method::GET, "/health", None, None).await;
    assert_eq!(st, 200);
    assert_eq!(v["pushMode"], "validation");
    let (st, v) = s
        .post(
            "/v1/host/challenge",
            None,
            json!({"v":1,"hostPublicKeyB64":Host::new().public_b64()}),
        )
        .await;
    assert_eq!((st, v), (503, json!({"error":"validation_only"})));
    s.stop().await;
}

/// The claim rules of ARCHITECTURE.md at the store level: one live lease per registration, due order,
/// a row in backoff does not block newer due rows, every finish matches the lease token.
#[tokio::test]
async fn claim_rules() {
    use orca_relay::push::LIMITS;
    use orca_relay::store::push as store;
    run_all(|t| async move {
        let now = orca_relay::clock::now_ms();
        let payload = serde_json::to_string(&alert("x", 1)).unwrap();
        let ins = |id: &str, reg: &str, created: i64| {
            let (db, payload) = (t.db.clone(), payload.clone());
            let (id, reg) = (id.to_string(), reg.to_string());
            async move {
                db.execute(
                    "INSERT INTO push_deliveries (delivery_id, host_fingerprint, registration_id, kind, notification_epoch, notification_id, notification_seq, payload_json, due_at, expires_at, lease_token, lease_until, attempts, created_at) \
                     VALUES ($1, 'fp', $2, 'alert', 'e', NULL, 1, $3, $4, $5, NULL, 0, 0, $4)",
                    params![id.as_str(), reg.as_str(), payload.as_str(), created, now + 100_000],
                )
                .await
                .unwrap();
            }
        };
        ins("a1", "A", now - 30).await;
        ins("a2", "A", now - 20).await;
        ins("b1", "B", now - 10).await;
        let c1 = store::claim(&t.db, &LIMITS, now).await.unwrap().unwrap();
        assert_eq!((c1.delivery_id.as_str(), c1.attempts), ("a1", 1));
        let c2 = store::claim(&t.db, &LIMITS, now).await.unwrap().unwrap();
        assert_eq!(c2.delivery_id, "b1", "A has a live lease");
        assert!(store::claim(&t.db, &LIMITS, now).await.unwrap().is_none());
        assert!(store::finish_delete(&t.db, &c2).await.unwrap());
        assert!(store::renew(&t.db, &c1, &LIMITS, now).await.unwrap());
        let mut stale = c1.clone();
        stale.lease_token = "other".into();
        assert!(!store::renew(&t.db, &stale, &LIMITS, now).await.unwrap());
        assert!(!store::finish_delete(&t.db, &stale).await.unwrap());
        assert!(store::finish_retry(&t.db, &c1, now + 5_000).await.unwrap());
        let c3 = store::claim(&t.db, &LIMITS, now).await.unwrap().unwrap();
        assert_eq!(c3.delivery_id, "a2", "a row in backoff does not block newer due rows");
        assert!(store::finish_delete(&t.db, &c3).await.unwrap());
        let c4 = store::claim(&t.db, &LIMITS, now + 5_000).await.unwrap().unwrap();
        assert_eq!((c4.delivery_id.as_str(), c4.attempts), ("a1", 2));
        // Lease lapse: a crashed worker's row is claimable again after 30 s.
        let c5 = store::claim(&t.db, &LIMITS, now + 5_000 + 30_000).await.unwrap().unwrap();
        assert_eq!(c5.delivery_id, "a1");
        assert!(!store::finish_delete(&t.db, &c4).await.unwrap(), "the lost lease changes nothing");
        assert!(store::finish_delete(&t.db, &c5).await.unwrap());
    })
    .await;
}

/// Prune sweeps (docs/reference/http.md).
#[tokio::test]
async fn prune_sweeps() {
    run_all(|t| async move {
        let s = Server::start(&t.url, Opts::default()).await;
        let now = orca_relay::clock::now_ms();
        let db = &t.db;
        for (id, exp) in [("old", now - 31_000), ("late", now - 1_000)] {
            db.execute(
                "INSERT INTO push_challenges (challenge_id, host_fingerprint, secret_hash, expires_at, consumed_at) VALUES ($1, 'fp', 'h', $2, NULL)",
                params![id, exp],
            )
            .await
            .unwrap();
        }
        db.execute(
            "INSERT INTO push_sessions (token_hash, host_fingerprint, expires_at, created_at) VALUES ('t1', 'fp1', $1, 0), ('t2', 'fp2', $2, 0)",
            params![now - 1, now + 100_000],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO push_events (event_id, host_fingerprint, kind, fingerprint, created_at, expires_at) VALUES ('e1', 'fp', 'alert', 'f', $1, 0), ('e2', 'fp', 'alert', 'f', $2, 0)",
            params![now - 86_400_001, now],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO push_event_recipients (event_id, registration_id, created_at) VALUES ('e1', 'r', $1)",
            params![now - 86_400_001],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO push_dismissed_events (host_fingerprint, notification_epoch, notification_id, notification_seq, created_at) VALUES ('fp', 'e', 'n', 1, $1)",
            params![now - 86_400_001],
        )
        .await
        .unwrap();
        let ctx = &s.running().ctx;
        for job in ["challenges", "sessions", "deliveries"] {
            orca_relay::push::jobs::sweep(ctx, job).await.map_err(|(t, _)| t).unwrap();
        }
        let count = |sql: &'static str| async move { db.query(sql, &[]).await.unwrap()[0].i64(0) };
        assert_eq!(count("SELECT COUNT(*) FROM push_challenges").await, 1);
        assert_eq!(count("SELECT COUNT(*) FROM push_sessions").await, 1);
        assert_eq!(count("SELECT COUNT(*) FROM push_events").await, 1);
        assert_eq!(count("SELECT COUNT(*) FROM push_event_recipients").await, 0);
        assert_eq!(count("SELECT COUNT(*) FROM push_dismissed_events").await, 0);
        s.stop().await;
    })
    .await;
}

/// U-03: readiness follows the database (no grace), through a proxy that closes and reopens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn u03_readiness_follows_postgres() {
    let Some(t) = orca_relay::store::testing::TestDb::postgres().await else {
        return;
    };
    let upstream = "127.0.0.1:5432";
    assert!(
        t.url.contains(upstream),
        "the test Postgres must be at {upstream}"
    );
    let proxy = PgProxy::open("127.0.0.1:0".parse().unwrap(), upstream).await;
    let url = t.url.replace(upstream, &proxy.addr.to_string());
    let s = Server::start(
        &url,
        Opts {
            extra: vec![("--readiness-sql-grace-ms".into(), "0".into())],
            ..Default::default()
        },
    )
    .await;
    let ready = || async {
        let (st, _, v) = s.call(Method::GET, "/ready", None, None).await;
        (st, v)
    };
    assert_eq!(ready().await, (200, json!({"ok":true})));
    proxy.close();
    assert!(
        eventually(Duration::from_secs(12), || async {
            ready().await == (503, json!({"error":"dependency_unavailable"}))
        })
        .await
    );
    let proxy = PgProxy::open(proxy.addr, upstream).await;
    assert!(
        eventually(Duration::from_secs(12), || async {
            ready().await == (200, json!({"ok":true}))
        })
        .await
    );
    proxy.close();
    s.stop().await;
}
