//! Delivery scenarios against the fake APNs and fake FCM (docs/reference/http.md: U-21..U-39, U-41, U-46, U-48,
//! U-49), each on SQLite and, when configured, on Postgres.

mod support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use support::push::fakes::{self, Answer, Fake};
use support::push::*;
use tokio_util::sync::CancellationToken;

const DELIVERED: Duration = Duration::from_secs(5);

struct World {
    s: Server,
    apns: Fake,
    fcm: Fake,
    h: Host,
    tok: String,
}

async fn world(t: &orca_relay::store::testing::TestDb) -> World {
    let apns = fakes::apns().await;
    let fcm = fakes::fcm().await;
    let s = Server::start(
        &t.url,
        Opts {
            apns: Some(apns.base_url()),
            fcm: Some((fcm.base_url(), fcm.token_url())),
            ..Default::default()
        },
    )
    .await;
    let h = Host::new();
    let tok = h.session(&s).await;
    World {
        s,
        apns,
        fcm,
        h,
        tok,
    }
}

impl World {
    async fn ios(&self, device: &str) -> (String, String) {
        let token = ios_token();
        (
            self.s.register(&self.tok, device, "ios", &token).await,
            token,
        )
    }
    async fn android(&self, device: &str) -> (String, String) {
        let token = android_token();
        (
            self.s.register(&self.tok, device, "android", &token).await,
            token,
        )
    }
    async fn send(&self, ids: &[&str], n: Value) -> Vec<String> {
        self.s.send(&self.tok, ids, n).await
    }
    /// The secrets this world used (U-48).
    fn secrets(&self, extra: &[&str]) -> Vec<String> {
        let mut v = vec![self.tok.clone(), self.h.fp.clone()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    }
    async fn stop(self) {
        self.s.stop().await;
        self.apns.stop();
        self.fcm.stop();
    }
}

/// Waits for the worker's idle pass that started after the call (nothing due, nothing in flight),
/// then returns the delivery rows still stored: 0 means nothing can be sent any more. This replaces
/// fixed "nothing else happens" windows.
async fn settled(s: &Server) -> i64 {
    let push = s.running().push.clone().expect("push role");
    tokio::time::timeout(Duration::from_secs(10), push.worker_settled())
        .await
        .expect("the worker goes idle");
    orca_relay::store::push::pending_count(&s.running().ctx.db)
        .await
        .unwrap()
}

fn all_auth_ok(seen: &[fakes::Seen]) {
    for s in seen {
        assert!(s.auth_ok, "provider auth rejected: {}", s.auth_problem);
    }
}

/// U-21, U-22, U-39 (provider side), U-48, U-49.
#[tokio::test]
async fn u21_u22_u39_apns_alert_and_dismiss() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (id, token) = w.ios("d1").await;
        let sent_before = w.s.counter("delivery_sent");
        let send_ms = orca_relay::clock::now_ms();
        assert_eq!(w.send(&[&id], alert("n1", 1)).await, ["queued"]);
        let seen = w.apns.wait_for(&token, 1, DELIVERED).await;
        assert_eq!(seen.len(), 1);
        all_auth_ok(&seen);
        let r = &seen[0];
        assert_eq!(r.path, format!("/3/device/{token}"));
        assert_eq!(r.headers["apns-topic"], "com.stably.orca.mobile");
        assert_eq!(r.headers["apns-push-type"], "alert");
        assert_eq!(r.headers["apns-priority"], "10");
        assert_eq!(r.headers["content-type"], "application/json");
        assert_eq!(
            r.headers["content-length"].parse::<usize>().unwrap(),
            r.body.to_string().len()
        );
        let exp: i64 = r.headers["apns-expiration"].parse().unwrap();
        assert!(exp <= (send_ms + 300_000 + 2000) / 1000 && exp >= (send_ms + 300_000) / 1000 - 2);
        let collapse = orca_relay::push::model::collapse_id(&w.h.fp, Some("n1"), "", 0);
        assert_eq!(r.headers["apns-collapse-id"], collapse);
        assert_eq!(
            r.body,
            json!({"aps":{"alert":{"title":"Title n1 1","body":"Body text n1 1"},"sound":"default","thread-id":w.h.fp},
                "orca":{"hostFingerprint":w.h.fp,"notificationId":"n1","notificationSeq":1,"notificationEpoch":"epoch-1",
                "source":"agent-task-complete","agentState":"finished"}})
        );
        assert!(eventually(DELIVERED, || async { w.s.counter("delivery_sent") > sent_before }).await);
        // U-22
        assert_eq!(w.send(&[&id], dismiss("n1", 1)).await, ["queued"]);
        let mut silent = alert("n2", 2);
        silent["sound"] = false.into();
        let far = orca_relay::clock::now_ms() + 60_000;
        silent["expiresAt"] = far.into();
        assert_eq!(w.send(&[&id], silent).await, ["queued"]);
        let seen = w.apns.wait_for(&token, 3, DELIVERED).await;
        assert_eq!(seen.len(), 3);
        all_auth_ok(&seen);
        let d = &seen[1];
        assert_eq!(d.headers["apns-push-type"], "background");
        assert_eq!(d.headers["apns-priority"], "5");
        assert!(!d.headers.contains_key("apns-collapse-id"));
        assert_eq!(d.body["aps"], json!({"content-available":1}));
        assert_eq!(d.body["orca"]["kind"], "dismiss");
        let a = &seen[2];
        assert!(a.body["aps"].get("sound").is_none());
        // U-39: expiresAt = now + 60 s → apns-expiration = floor(expiresAt/1000).
        assert_eq!(a.headers["apns-expiration"], (far / 1000).to_string());
        // U-49
        let (st, _, _) = w.s.call(Method::GET, "/metrics", None, None).await;
        assert_eq!(st, 401);
        let text = w
            .s
            .client
            .get(format!("{}/metrics", w.s.base))
            .header("authorization", format!("Bearer {ADMIN}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let sent_line = text
            .lines()
            .find(|l| l.starts_with("orca_push_delivery_sent_total"))
            .unwrap();
        assert!(sent_line.split(' ').nth(1).unwrap().parse::<u64>().unwrap() >= 1);
        assert!(text.contains("orca_push_queue_depth"));
        assert!(w.s.running().push.as_ref().unwrap().emit_counters());
        let line = logs()
            .into_iter()
            .rev()
            .find(|l| l.contains("\"event\":\"orca_push_counters\""))
            .expect("counters line");
        let v: Value = serde_json::from_str(line.split_once(' ').unwrap().1).unwrap();
        assert!(v["delivery_sent"].as_u64().unwrap() >= 1);
        assert_logs_clean(&w.secrets(&[&token, "Title n1 1", "Body text n1 1", "n1"]));
        w.stop().await;
    })
    .await;
}

/// U-23, U-24, U-25 (token cache part).
#[tokio::test]
async fn u23_u24_u25_fcm() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (id, token) = w.android("a1").await;
        let mut silent = alert("f1", 1);
        silent["sound"] = false.into();
        assert_eq!(w.send(&[&id], silent).await, ["queued"]);
        assert_eq!(w.send(&[&id], alert("f2", 2)).await, ["queued"]);
        // The dismiss would cancel a still-pending f2 alert: let both alerts go first.
        assert_eq!(w.fcm.wait_for(&token, 2, DELIVERED).await.len(), 2);
        assert_eq!(w.send(&[&id], dismiss("f2", 2)).await, ["queued"]);
        let seen = w.fcm.wait_for(&token, 3, DELIVERED).await;
        assert_eq!(seen.len(), 3);
        all_auth_ok(&seen);
        let tr = w.fcm.token_requests();
        assert_eq!(tr.len(), 1, "one token request for three sends");
        assert!(tr[0].1, "assertion invalid: {}", tr[0].2);
        let m = &seen[0];
        assert_eq!(m.path, "/v1/projects/orca-test/messages:send");
        assert_eq!(m.headers["authorization"], "Bearer fake-access-1");
        let msg = &m.body["message"];
        assert_eq!(msg["token"], token.as_str());
        assert_eq!(msg["notification"], json!({"title":"Title f1 1","body":"Body text f1 1"}));
        let collapse = orca_relay::push::model::collapse_id(&w.h.fp, Some("f1"), "", 0);
        let android = &msg["android"];
        assert_eq!(android["priority"], "HIGH");
        let ttl = android["ttl"].as_str().unwrap();
        let secs: i64 = ttl.strip_suffix('s').unwrap().parse().unwrap();
        assert!((295..=300).contains(&secs), "{ttl}");
        let ck = android["collapse_key"].as_str().unwrap();
        assert_eq!(ck.len(), 32);
        assert_eq!(ck, &orca_relay::crypto::sha256_hex(collapse.as_bytes())[..32]);
        assert_eq!(
            android["notification"],
            json!({"channel_id":"orca-desktop-silent","tag":collapse})
        );
        assert_eq!(
            msg["data"],
            json!({"hostFingerprint":w.h.fp,"notificationId":"f1","notificationSeq":"1",
                "notificationEpoch":"epoch-1","source":"agent-task-complete","agentState":"finished"})
        );
        assert_eq!(seen[1].body["message"]["android"]["notification"]["channel_id"], "orca-desktop");
        // U-24
        let d = &seen[2].body["message"];
        assert!(d.get("notification").is_none());
        assert!(d["android"].get("notification").is_none());
        assert_eq!(d["data"]["kind"], "dismiss");
        assert_logs_clean(&w.secrets(&[&token, "fake-access-1", "Title f1 1"]));
        w.stop().await;
    })
    .await;
}

/// U-25: after a restart the token endpoint fails for 3 s; no FCM request while it fails.
#[tokio::test]
async fn u25_token_endpoint_failure() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (id, token) = w.android("a1").await;
        w.fcm.set_token_endpoint(500, "{}");
        let t0 = Instant::now();
        assert_eq!(w.send(&[&id], alert("t1", 1)).await, ["queued"]);
        // The worker tried it against the failing token endpoint, rescheduled it and went idle.
        assert_eq!(settled(&w.s).await, 1, "still pending after the failed try");
        assert!(
            w.fcm.seen_for(&token).is_empty(),
            "no FCM request while the token fails"
        );
        assert!(!w.fcm.token_requests().is_empty());
        w.fcm.set_token_endpoint(
            200,
            r#"{"access_token":"fake-access-1","expires_in":3600,"token_type":"Bearer"}"#,
        );
        let seen = w.fcm.wait_for(&token, 1, Duration::from_secs(15)).await;
        assert_eq!(seen.len(), 1);
        assert!(t0.elapsed() < Duration::from_secs(15));
        assert_eq!(settled(&w.s).await, 0);
        assert_eq!(w.fcm.seen_for(&token).len(), 1, "delivered once");
        w.stop().await;
    })
    .await;
}

async fn device_dead(w: &World, id: &str) -> bool {
    w.s.devices(&w.tok)
        .await
        .into_iter()
        .find(|d| d["registrationId"] == id)
        .unwrap()["dead"]
        .as_bool()
        .unwrap()
}

/// U-26, U-27.
#[tokio::test]
async fn u26_u27_apns_dead_tokens() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (id, token) = w.ios("d1").await;
        w.apns.script(
            &token,
            vec![Answer::status(410, r#"{"reason":"Unregistered"}"#)],
        );
        assert_eq!(w.send(&[&id], alert("n1", 1)).await, ["queued"]);
        assert!(eventually(DELIVERED, || async { device_dead(&w, &id).await }).await);
        assert_eq!(w.send(&[&id], alert("n2", 2)).await, ["dead"]);
        assert_eq!(w.s.register(&w.tok, "d1", "ios", &token).await, id);
        assert!(!device_dead(&w, &id).await);
        // U-27
        let (b, btok) = w.ios("d2").await;
        let (c, ctok) = w.ios("d3").await;
        w.apns.script(
            &btok,
            vec![Answer::status(400, r#"{"reason":"BadDeviceToken"}"#)],
        );
        w.apns.script(
            &ctok,
            vec![Answer::status(
                400,
                r#"{"reason":"DeviceTokenNotForTopic"}"#,
            )],
        );
        let errors = w.s.counter("delivery_error");
        assert_eq!(
            w.send(&[&b, &c], alert("n3", 3)).await,
            ["queued", "queued"]
        );
        assert!(eventually(DELIVERED, || async { device_dead(&w, &b).await }).await);
        assert!(
            eventually(DELIVERED, || async {
                w.s.counter("delivery_error") > errors
            })
            .await
        );
        assert!(!device_dead(&w, &c).await);
        assert_eq!(w.s.counter("delivery_error"), errors + 1);
        assert_eq!(settled(&w.s).await, 0, "nothing left to retry");
        assert_eq!(w.apns.seen_for(&ctok).len(), 1, "not retried");
        let host = orca_relay::logging::digest(&w.h.fp);
        assert!(logs()
            .iter()
            .any(|l| l.contains("orca_push_delivery_failed")
                && l.contains("DeviceTokenNotForTopic")
                && l.contains(&format!("\"host\":\"{host}\""))));
        assert_logs_clean(&w.secrets(&[&token, &btok, &ctok]));
        w.stop().await;
    })
    .await;
}

/// U-28.
#[tokio::test]
async fn u28_fcm_dead_tokens() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (a, at) = w.android("a").await;
        let (b, bt) = w.android("b").await;
        let (c, ct) = w.android("c").await;
        w.fcm.script(&at, vec![Answer::status(404, r#"{"error":{"status":"NOT_FOUND","details":[{"errorCode":"UNREGISTERED"}]}}"#)]);
        w.fcm.script(&bt, vec![Answer::status(400, r#"{"error":{"status":"INVALID_ARGUMENT","message":"The registration token is not a valid FCM registration token"}}"#)]);
        w.fcm.script(&ct, vec![Answer::status(400, r#"{"error":{"status":"INVALID_ARGUMENT","message":"bad ttl"}}"#)]);
        assert_eq!(w.send(&[&a, &b, &c], alert("n1", 1)).await, ["queued"; 3]);
        assert!(eventually(DELIVERED, || async { device_dead(&w, &a).await && device_dead(&w, &b).await }).await);
        assert!(w.fcm.wait_for(&ct, 1, DELIVERED).await.len() == 1);
        assert_eq!(settled(&w.s).await, 0, "nothing left to retry");
        assert!(!device_dead(&w, &c).await);
        assert_eq!(w.fcm.seen_for(&ct).len(), 1, "not retried");
        w.stop().await;
    })
    .await;
}

/// U-29: a stale dead outcome never retires a re-registered token.
#[tokio::test]
async fn u29_stale_outcome() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (id, t1) = w.ios("d1").await;
        let hold = CancellationToken::new();
        w.apns.script(
            &t1,
            vec![Answer::status(410, r#"{"reason":"Unregistered"}"#).hold(hold.clone())],
        );
        assert_eq!(w.send(&[&id], alert("n1", 1)).await, ["queued"]);
        assert_eq!(w.apns.wait_for(&t1, 1, DELIVERED).await.len(), 1);
        let t2 = ios_token();
        assert_eq!(w.s.register(&w.tok, "d1", "ios", &t2).await, id);
        let dead = w.s.counter("delivery_dead");
        hold.cancel();
        assert!(eventually(DELIVERED, || async { w.s.counter("delivery_dead") > dead }).await);
        assert!(!device_dead(&w, &id).await);
        assert_eq!(w.send(&[&id], alert("n2", 2)).await, ["queued"]);
        assert_eq!(w.apns.wait_for(&t2, 1, DELIVERED).await.len(), 1);
        w.stop().await;
    })
    .await;
}

/// U-30: 503 once then 200: retry 2–3.5 s after the first answer.
#[tokio::test]
async fn u30_retry_backoff() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (id, token) = w.ios("d1").await;
        w.apns.script(
            &token,
            vec![Answer::status(503, r#"{"reason":"ServiceUnavailable"}"#)],
        );
        let retries = w.s.counter("delivery_retry");
        assert_eq!(w.send(&[&id], alert("n1", 1)).await, ["queued"]);
        let seen = w.apns.wait_for(&token, 2, Duration::from_secs(8)).await;
        assert_eq!(seen.len(), 2);
        let gap = seen[1].at - seen[0].answered_at.unwrap();
        assert!(
            gap >= Duration::from_millis(1900) && gap <= Duration::from_millis(3500),
            "{gap:?}"
        );
        assert_eq!(seen[1].status, 200);
        assert_eq!(w.s.counter("delivery_retry"), retries + 1);
        assert_eq!(settled(&w.s).await, 0);
        assert_eq!(w.apns.seen_for(&token).len(), 2);
        // 403 ExpiredProviderToken: retried with a freshly minted provider token.
        let (id2, token2) = w.ios("d2").await;
        w.apns.script(
            &token2,
            vec![Answer::status(403, r#"{"reason":"ExpiredProviderToken"}"#)],
        );
        assert_eq!(w.send(&[&id2], alert("n2", 2)).await, ["queued"]);
        let seen = w.apns.wait_for(&token2, 2, Duration::from_secs(8)).await;
        assert_eq!(seen.len(), 2);
        all_auth_ok(&seen);
        assert_ne!(
            seen[0].headers["authorization"],
            seen[1].headers["authorization"]
        );
        w.stop().await;
    })
    .await;
}

/// U-31: APNs 429 + Retry-After 5; FCM 503 → at least 10 s.
#[tokio::test]
async fn u31_retry_after() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (id, token) = w.ios("d1").await;
        let (aid, atok) = w.android("a1").await;
        w.apns.script(
            &token,
            vec![Answer::status(429, r#"{"reason":"TooManyRequests"}"#).header("retry-after", "5")],
        );
        w.fcm.script(
            &atok,
            vec![Answer::status(503, r#"{"error":{"status":"UNAVAILABLE"}}"#)],
        );
        assert_eq!(
            w.send(&[&id, &aid], alert("n1", 1)).await,
            ["queued", "queued"]
        );
        let (a, f) = tokio::join!(
            w.apns.wait_for(&token, 2, Duration::from_secs(9)),
            w.fcm.wait_for(&atok, 2, Duration::from_secs(14))
        );
        assert_eq!(a.len(), 2);
        assert!(a[1].at - a[0].answered_at.unwrap() >= Duration::from_millis(4900));
        assert_eq!(f.len(), 2);
        assert!(f[1].at - f[0].answered_at.unwrap() >= Duration::from_millis(9900));
        w.stop().await;
    })
    .await;
}

/// U-32: the deadline ends retries.
#[tokio::test]
async fn u32_expiry() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (id, token) = w.ios("d1").await;
        w.apns.default_answer(&token, Answer::status(503, ""));
        let expired = w.s.counter("delivery_expired");
        let mut n = alert("n1", 1);
        n["expiresAt"] = (orca_relay::clock::now_ms() + 6000).into();
        assert_eq!(w.send(&[&id], n).await, ["queued"]);
        let db = t.db.clone();
        assert!(
            eventually(Duration::from_secs(10), || async {
                db.query("SELECT COUNT(*) FROM push_deliveries", &[])
                    .await
                    .unwrap()[0]
                    .i64(0)
                    == 0
            })
            .await
        );
        assert_eq!(w.apns.seen_for(&token).len(), 2, "exactly two requests");
        assert_eq!(w.s.counter("delivery_expired"), expired + 1);
        w.stop().await;
    })
    .await;
}

/// U-33, U-34.
#[tokio::test]
async fn u33_u34_one_in_flight_per_registration() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (a, atok) = w.ios("a").await;
        let (b, btok) = w.ios("b").await;
        w.apns.script(
            &atok,
            vec![Answer::status(200, "").delay(Duration::from_secs(1))],
        );
        assert_eq!(w.send(&[&a], alert("a1", 1)).await, ["queued"]);
        // a1 is in flight (its answer held 1 s) before a2 is queued.
        assert_eq!(w.apns.wait_for(&atok, 1, DELIVERED).await.len(), 1);
        assert_eq!(w.send(&[&a], alert("a2", 2)).await, ["queued"]);
        assert_eq!(w.send(&[&b], alert("b1", 3)).await, ["queued"]);
        let sa = w.apns.wait_for(&atok, 2, DELIVERED).await;
        let sb = w.apns.wait_for(&btok, 1, DELIVERED).await;
        assert_eq!(sa.len(), 2);
        assert_eq!(sa[0].body["orca"]["notificationId"], "a1");
        assert!(
            sa[1].at >= sa[0].answered_at.unwrap(),
            "a2 after a1's answer"
        );
        assert!(
            sb[0].at < sa[0].answered_at.unwrap(),
            "b1 before a1's answer"
        );
        assert_eq!(w.apns.max_open(&atok), 1);
        // U-34
        let (c, ctok) = w.ios("c").await;
        w.apns.script(&ctok, vec![Answer::status(503, "")]);
        assert_eq!(w.send(&[&c], alert("c1", 4)).await, ["queued"]);
        assert_eq!(w.apns.wait_for(&ctok, 1, DELIVERED).await.len(), 1);
        assert_eq!(w.send(&[&c], alert("c2", 5)).await, ["queued"]);
        let sc = w.apns.wait_for(&ctok, 3, Duration::from_secs(8)).await;
        assert_eq!(sc.len(), 3);
        assert_eq!(
            sc[1].body["orca"]["notificationId"], "c2",
            "c2 before c1's retry"
        );
        assert_eq!(sc[2].body["orca"]["notificationId"], "c1");
        w.stop().await;
    })
    .await;
}

/// U-35, U-36, U-37 (one request).
#[tokio::test]
async fn u35_u36_u37_dismissal_and_idempotency() {
    run_all(|t| async move {
        let w = world(&t).await;
        let (a, atok) = w.ios("a").await;
        let hold = CancellationToken::new();
        w.apns
            .script(&atok, vec![Answer::status(200, "").hold(hold.clone())]);
        assert_eq!(w.send(&[&a], alert("n1", 1)).await, ["queued"]);
        assert_eq!(w.apns.wait_for(&atok, 1, DELIVERED).await.len(), 1);
        assert_eq!(w.send(&[&a], alert("n2", 2)).await, ["queued"]);
        assert_eq!(w.send(&[&a], dismiss("n2", 2)).await, ["queued"]);
        hold.cancel();
        let seen = w.apns.wait_for(&atok, 2, DELIVERED).await;
        assert_eq!(settled(&w.s).await, 0);
        let seen_all = w.apns.seen_for(&atok);
        assert_eq!(
            seen_all.len(),
            2,
            "{:?}",
            seen_all.iter().map(|s| s.body.clone()).collect::<Vec<_>>()
        );
        assert_eq!(seen[0].body["orca"]["notificationId"], "n1");
        assert_eq!(seen[1].body["orca"]["notificationId"], "n2");
        assert_eq!(seen[1].body["orca"]["kind"], "dismiss");
        // U-36
        let (b, btok) = w.ios("b").await;
        assert_eq!(w.send(&[&b], dismiss("n3", 5)).await, ["queued"]);
        assert_eq!(w.send(&[&b], alert("n3", 4)).await, ["queued"]);
        assert_eq!(w.send(&[&b], alert("n3", 6)).await, ["queued"]);
        let sb = w.apns.wait_for(&btok, 2, DELIVERED).await;
        assert_eq!(settled(&w.s).await, 0);
        assert_eq!(w.apns.seen_for(&btok).len(), 2);
        assert_eq!(sb[0].body["orca"]["kind"], "dismiss");
        assert_eq!(sb[1].body["orca"]["notificationSeq"], 6);
        // U-37: one provider request for the whole family.
        let (c, ctok) = w.ios("c").await;
        let n = alert("n7", 7);
        assert_eq!(w.send(&[&c], n.clone()).await, ["queued"]);
        assert_eq!(w.send(&[&c], n.clone()).await, ["queued"]);
        let mut sound = n.clone();
        sound["sound"] = true.into();
        assert_eq!(w.send(&[&c], sound).await, ["queued"]);
        assert_eq!(w.apns.wait_for(&ctok, 1, DELIVERED).await.len(), 1);
        assert_eq!(settled(&w.s).await, 0);
        assert_eq!(w.apns.seen_for(&ctok).len(), 1);
        w.stop().await;
    })
    .await;
}

/// U-46: no APNs configuration.
#[tokio::test]
async fn u46_apns_not_configured() {
    run_all(|t| async move {
        let s = Server::start(&t.url, Opts::default()).await;
        let h = Host::new();
        let tok = h.session(&s).await;
        let token = ios_token();
        let id = s.register(&tok, "d", "ios", &token).await;
        let errors = s.counter("delivery_error");
        assert_eq!(s.send(&tok, &[&id], alert("n1", 1)).await, ["queued"]);
        assert!(eventually(DELIVERED, || async { s.counter("delivery_error") > errors }).await);
        let digest = orca_relay::logging::digest(&h.fp);
        assert!(logs()
            .iter()
            .any(|l| l.contains("apns_not_configured") && l.contains(&digest)));
        assert_eq!(s.devices(&tok).await[0]["dead"], false);
        s.stop().await;
    })
    .await;
}

/// U-41: two push processes on one Postgres database.
#[tokio::test]
async fn u41_two_processes() {
    let Some(t) = orca_relay::store::testing::TestDb::postgres().await else {
        return;
    };
    let apns = fakes::apns().await;
    let o = Opts {
        apns: Some(apns.base_url()),
        ..Default::default()
    };
    let p1 = Server::start(&t.url, o.clone()).await;
    let p2 = Server::start(&t.url, o).await;
    let h = Host::new();
    let tok = h.session(&p1).await;
    let mut devs = Vec::new();
    for i in 0..5 {
        let token = ios_token();
        apns.default_answer(
            &token,
            Answer::status(200, "").delay(Duration::from_millis(20)),
        );
        devs.push((
            p1.register(&tok, &format!("d{i}"), "ios", &token).await,
            token,
        ));
    }
    for k in 0..10u64 {
        for (i, (id, _)) in devs.iter().enumerate() {
            let p = if (k as usize + i) % 2 == 0 { &p1 } else { &p2 };
            assert_eq!(
                p.send(&tok, &[id], alert(&format!("m{k}"), k)).await,
                ["queued"]
            );
        }
        // The next round is created 2 ms later on the test clock: the send order is the
        // creation order.
        jump(Duration::from_millis(2)).await;
    }
    for (_, token) in &devs {
        let seen = apns.wait_for(token, 10, Duration::from_secs(10)).await;
        assert_eq!(seen.len(), 10);
        let seqs: Vec<i64> = seen
            .iter()
            .map(|s| s.body["orca"]["notificationSeq"].as_i64().unwrap())
            .collect();
        assert_eq!(seqs, (0..10).collect::<Vec<_>>(), "per-token send order");
        assert_eq!(apns.max_open(token), 1);
    }
    let (a, b) = tokio::join!(settled(&p1), settled(&p2));
    assert_eq!((a, b), (0, 0));
    assert_eq!(apns.seen().len(), 50, "no duplicate");
    p1.stop().await;
    p2.stop().await;
}
