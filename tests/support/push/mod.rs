//! Shared harness of the push tests (docs/reference/http.md): an in-process server on an ephemeral port, the
//! host helper H, request helpers, fake providers and a log capture used by the log scan (U-48).

#![allow(dead_code)]

pub use super::common;
pub mod fakes;
pub mod keys;

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use orca_relay::crypto::b64::std_encode;
use orca_relay::crypto::push_proof::{answer_push_challenge, PushChallengeResponse};
use orca_relay::crypto::X25519Keypair;
use orca_relay::server::Running;
use orca_relay::store::testing::{backends, temp_dir, TestDb};
use serde_json::{json, Value};

pub const ADMIN: &str = "admin-token-for-push-tests-0123456789abcdef";

// ------------------------------------------------------------------ log capture

/// Installs the capturing logger (the common capture: info level, like the default `RUST_LOG`).
pub fn init_logs() {
    common::logs::install();
}

/// Every captured line as `target text`.
pub fn logs() -> Vec<String> {
    common::logs::lines()
        .into_iter()
        .map(|l| format!("{} {}", l.target, l.text))
        .collect()
}

static SECRETS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

/// Records a value that must never be logged (push token, session token, proof, title, body,
/// fingerprint); every server stop scans all captured lines for all recorded values.
pub fn remember(secret: &str) {
    if secret.len() >= 6 {
        SECRETS
            .get_or_init(Default::default)
            .lock()
            .unwrap()
            .push(secret.to_string());
    }
}

/// U-48: no captured line contains any of `secrets` or of the remembered values.
pub fn assert_logs_clean(secrets: &[String]) {
    let lines = logs();
    let mut all: Vec<String> = SECRETS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .clone();
    all.extend(secrets.iter().cloned());
    for s in all.iter().filter(|s| s.len() >= 6) {
        for l in &lines {
            assert!(!l.contains(s.as_str()), "log line leaks a secret: {l}");
        }
    }
}

// ------------------------------------------------------------------ server

/// Options of a test server.
#[derive(Default, Clone)]
pub struct Opts {
    pub role: Option<String>,
    pub apns: Option<String>,
    pub fcm: Option<(String, String)>,
    pub extra: Vec<(String, String)>,
}

pub struct Server {
    pub running: Option<Running>,
    pub base: String,
    pub client: reqwest::Client,
    pub xff: String,
    pub data: PathBuf,
}

/// Writes the test service-account file.
pub fn credentials_file(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("sa.json");
    std::fs::write(
        &p,
        json!({"type":"service_account","project_id":"orca-test","client_email":"push@orca-test.example",
            "private_key_id":"k1","private_key":keys::FCM_KEY_PEM,"token_uri":"https://ignored.example/token"})
        .to_string(),
    )
    .unwrap();
    p
}

/// The command-line arguments of a push server for `db_url`.
pub fn server_args(db_url: &str, data: &std::path::Path, o: &Opts) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "orca-relay".into(),
        "--role".into(),
        o.role.clone().unwrap_or_else(|| "push".into()),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--database-url".into(),
        db_url.into(),
        "--data-dir".into(),
        data.display().to_string(),
        "--admin-token".into(),
        ADMIN.into(),
        "--trusted-proxy-hops".into(),
        "1".into(),
        // Many servers share one Postgres (max_connections 100) during a test run.
        "--database-pool-max".into(),
        "4".into(),
    ];
    if let Some(base) = &o.apns {
        a.push(format!("--push-apns-key={}", keys::APNS_KEY_PEM));
        a.extend(
            [
                "--push-apns-key-id",
                "KEYID12345",
                "--push-apple-team-id",
                "TEAM123456",
                "--push-apns-base-url",
                base,
            ]
            .map(String::from),
        );
    }
    if let Some((base, token_url)) = &o.fcm {
        let creds = credentials_file(data);
        a.extend(
            [
                "--push-fcm-project-id",
                "orca-test",
                "--push-fcm-credentials",
                &creds.display().to_string(),
                "--push-fcm-base-url",
                base,
                "--push-oauth-token-url",
                token_url,
            ]
            .map(String::from),
        );
    }
    for (k, v) in &o.extra {
        a.push(k.clone());
        a.push(v.clone());
    }
    a
}

impl Server {
    pub async fn start(db_url: &str, o: Opts) -> Server {
        init_logs();
        let data = temp_dir("orca-push-data");
        let running = common::serve::start(&server_args(db_url, &data, &o)).await;
        let base = format!("http://{}", running.addr);
        Server {
            running: Some(running),
            base,
            client: reqwest::Client::new(),
            xff: format!("10.0.{}.{}", rand::random::<u8>(), rand::random::<u8>()),
            data,
        }
    }

    /// A `--role all` node with these extra `(flag, value)` pairs (keys, tokens).
    pub async fn all_with(db_url: &str, flags: &[(&str, &str)]) -> Server {
        let extra = flags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let o = Opts {
            role: Some("all".into()),
            extra,
            ..Opts::default()
        };
        Server::start(db_url, o).await
    }

    /// The `/metrics` text, read with `token`.
    pub async fn metrics_text(&self, token: &str) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .bearer_auth(token)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics body")
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().unwrap()
    }

    pub fn counter(&self, name: &str) -> u64 {
        self.running()
            .ctx
            .metrics
            .push_values()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .unwrap()
    }

    /// Waits until the delivery worker made an idle pass that started after this call:
    /// everything due before it was delivered or rescheduled and nothing is in flight. In
    /// process, the worker's own signal; in another process, its `orca_push_worker_runs_total`
    /// idle count moving by two (the second idle run started after the first was counted).
    pub async fn worker_settled(&self) {
        const WITHIN: std::time::Duration = std::time::Duration::from_secs(10);
        if let Some(r) = &self.running {
            let push = r.push.clone().expect("push role");
            tokio::time::timeout(WITHIN, push.worker_settled())
                .await
                .expect("the worker goes idle");
            return;
        }
        let before = self.idle_runs().await;
        common::wait::wait_until("two idle worker runs", WITHIN, || async {
            self.idle_runs().await >= before + 2
        })
        .await;
    }

    /// `orca_push_worker_runs_total{end="idle"}` of the process behind `base`.
    pub async fn idle_runs(&self) -> u64 {
        let series = r#"orca_push_worker_runs_total{end="idle"}"#;
        let v = common::metrics::scrape(&self.base, ADMIN).await;
        *v.get(series)
            .unwrap_or_else(|| panic!("{series} not exported")) as u64
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
        assert_logs_clean(&[]);
    }

    /// A request with this scenario's `X-Forwarded-For`.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<String>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        self.call_as(&self.xff, method, path, bearer, body).await
    }

    pub async fn call_as(
        &self,
        xff: &str,
        method: reqwest::Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<String>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut r = self
            .client
            .request(method, format!("{}{}", self.base, path))
            .header("x-forwarded-for", xff);
        if let Some(b) = bearer {
            r = r.header("authorization", format!("Bearer {b}"));
        }
        if let Some(b) = body {
            r = r.body(b);
        }
        let resp = r.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap_or_default();
        let v = serde_json::from_str(&text).unwrap_or(Value::Null);
        (status, headers, v)
    }

    pub async fn post(&self, path: &str, bearer: Option<&str>, body: Value) -> (u16, Value) {
        let (s, _, v) = self
            .call(reqwest::Method::POST, path, bearer, Some(body.to_string()))
            .await;
        (s, v)
    }

    pub async fn register(
        &self,
        bearer: &str,
        device: &str,
        platform: &str,
        token: &str,
    ) -> String {
        let mut body = json!({"v":1,"deviceId":device,"platform":platform,"token":token});
        if platform == "ios" {
            body["apnsEnvironment"] = "sandbox".into();
        }
        let (s, v) = self.post("/v1/devices", Some(bearer), body).await;
        assert_eq!(s, 200, "{v}");
        v["registrationId"].as_str().unwrap().to_string()
    }

    pub async fn devices(&self, bearer: &str) -> Vec<Value> {
        let (s, _, v) = self
            .call(reqwest::Method::GET, "/v1/devices", Some(bearer), None)
            .await;
        assert_eq!(s, 200);
        v["devices"].as_array().unwrap().clone()
    }

    /// `POST /v1/send`; returns the statuses.
    pub async fn send(&self, bearer: &str, ids: &[&str], n: Value) -> Vec<String> {
        let (s, v) = self
            .post(
                "/v1/send",
                Some(bearer),
                json!({"v":1,"registrationIds":ids,"notification":n}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_str().unwrap().to_string())
            .collect()
    }
}

/// A minimal valid alert.
pub fn alert(id: &str, seq: u64) -> Value {
    remember(&format!("Title {id} {seq}"));
    remember(&format!("Body text {id} {seq}"));
    json!({"notificationId":id,"notificationSeq":seq,"notificationEpoch":"epoch-1",
        "source":"agent-task-complete","agentState":"finished","title":format!("Title {id} {seq}"),
        "body":format!("Body text {id} {seq}")})
}

pub fn dismiss(id: &str, seq: u64) -> Value {
    let mut v = alert(id, seq);
    v["kind"] = "dismiss".into();
    v
}

/// A 64-hex APNs token unique per call.
pub fn ios_token() -> String {
    let a: [u8; 32] = rand::random();
    a.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn android_token() -> String {
    format!(
        "fcm-{}:{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

// ------------------------------------------------------------------ host helper H

pub struct Host {
    pub key: X25519Keypair,
    pub fp: String,
}

impl Default for Host {
    fn default() -> Self {
        Self::new()
    }
}

impl Host {
    pub fn new() -> Host {
        let key = X25519Keypair::generate();
        let fp = orca_relay::crypto::relay_host_id(&key.public);
        remember(&fp);
        Host { key, fp }
    }

    pub fn public_b64(&self) -> String {
        std_encode(&self.key.public)
    }

    pub async fn challenge(&self, s: &Server) -> PushChallengeResponse {
        let (status, v) = s
            .post(
                "/v1/host/challenge",
                None,
                json!({"v":1,"hostPublicKeyB64":self.public_b64()}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        serde_json::from_value(v).unwrap()
    }

    /// Opens the box with the checks and returns `proofB64`.
    pub fn answer(&self, s: &Server, c: &PushChallengeResponse) -> String {
        let proof =
            answer_push_challenge(&self.key.secret, &s.base, c, orca_relay::clock::now_ms())
                .expect("challenge checks");
        remember(&std_encode(&proof));
        std_encode(&proof)
    }

    /// Challenge + proof + session: the session token.
    pub async fn session(&self, s: &Server) -> String {
        let c = self.challenge(s).await;
        let proof = self.answer(s, &c);
        let (status, v) = s
            .post(
                "/v1/host/session",
                None,
                json!({"v":1,"challengeId":c.challenge_id,"proofB64":proof}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        remember(v["sessionToken"].as_str().unwrap());
        v["sessionToken"].as_str().unwrap().to_string()
    }
}

// ------------------------------------------------------------------ misc

pub async fn all_backends() -> Vec<TestDb> {
    backends().await
}

/// Runs `case` on every backend concurrently (the timing-heavy scenarios would double otherwise).
pub async fn run_all<F, Fut>(case: F)
where
    F: Fn(TestDb) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let all = backends().await;
    futures_util::future::join_all(all.into_iter().map(case)).await;
}

/// Polls the asynchronous `f` until it is true or `within` passes (the common one).
#[allow(unused_imports)]
pub use common::time::jump;
pub use common::wait::eventually_async as eventually;
