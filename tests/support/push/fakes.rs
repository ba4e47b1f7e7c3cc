//! Fake providers on loopback: APNs (HTTP/2 prior knowledge, verifies the ES256 provider JWT) and
//! FCM with its OAuth token endpoint (HTTP/1.1, verifies the RS256 assertion). Both record every
//! request and answer per device token from a script (status, body, headers, delay, hold).

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::keys;

/// One scripted answer.
#[derive(Clone, Default)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
    pub delay: Duration,
    /// Held until cancelled (released).
    pub hold: Option<CancellationToken>,
}

impl Answer {
    pub fn status(status: u16, body: &str) -> Answer {
        Answer {
            status,
            body: body.to_string(),
            ..Default::default()
        }
    }
    pub fn header(mut self, k: &str, v: &str) -> Answer {
        self.headers.push((k.into(), v.into()));
        self
    }
    pub fn delay(mut self, d: Duration) -> Answer {
        self.delay = d;
        self
    }
    pub fn hold(mut self, t: CancellationToken) -> Answer {
        self.hold = Some(t);
        self
    }
}

/// What a fake saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    /// The device token (APNs path tail, FCM `message.token`).
    pub token: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
    pub at: Instant,
    pub answered_at: Option<Instant>,
    pub status: u16,
    /// Provider-auth verification result (JWT or access token).
    pub auth_ok: bool,
    pub auth_problem: String,
}

#[derive(Default)]
struct State {
    scripts: HashMap<String, VecDeque<Answer>>,
    /// Answer used when a token's script is empty.
    default_for: HashMap<String, Answer>,
    seen: Vec<Seen>,
    open: HashMap<String, usize>,
    max_open: HashMap<String, usize>,
    // FCM token endpoint
    token_requests: Vec<(HashMap<String, String>, bool, String)>,
    token_status: u16,
    token_body: String,
    /// APNs provider tokens that verified, and when: the same JWT (re-used for up to 50 minutes)
    /// is checked again after a minute, not on every request (the benchmark's thousands a second).
    verified_jwts: HashMap<String, Instant>,
}

/// A fake provider server.
#[derive(Clone)]
pub struct Fake {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

impl Fake {
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn token_url(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    /// Queues answers for `token` (then 200).
    pub fn script(&self, token: &str, answers: Vec<Answer>) {
        let mut s = self.state.lock().unwrap();
        s.scripts
            .entry(token.to_string())
            .or_default()
            .extend(answers);
    }

    /// The answer for `token` once its script runs out.
    pub fn default_answer(&self, token: &str, a: Answer) {
        self.state
            .lock()
            .unwrap()
            .default_for
            .insert(token.to_string(), a);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    pub fn seen_count(&self) -> usize {
        self.state.lock().unwrap().seen.len()
    }

    pub fn seen_for(&self, token: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.token == token)
            .collect()
    }

    pub fn max_open(&self, token: &str) -> usize {
        *self.state.lock().unwrap().max_open.get(token).unwrap_or(&0)
    }

    pub fn set_token_endpoint(&self, status: u16, body: &str) {
        let mut s = self.state.lock().unwrap();
        s.token_status = status;
        s.token_body = body.to_string();
    }

    /// `(form fields, assertion valid, problem)` per token request.
    pub fn token_requests(&self) -> Vec<(HashMap<String, String>, bool, String)> {
        self.state.lock().unwrap().token_requests.clone()
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Polls until `count` requests for `token` were seen, or `within` passes.
    pub async fn wait_for(&self, token: &str, count: usize, within: Duration) -> Vec<Seen> {
        let deadline = Instant::now() + within;
        loop {
            let s = self.seen_for(token);
            if s.len() >= count || Instant::now() >= deadline {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn new_state() -> Arc<Mutex<State>> {
    Arc::new(Mutex::new(State {
        token_status: 200,
        token_body: r#"{"access_token":"fake-access-1","expires_in":3600,"token_type":"Bearer"}"#
            .into(),
        ..Default::default()
    }))
}

fn respond(status: u16, body: String, headers: &[(String, String)]) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    for (k, v) in headers {
        r.headers_mut().insert(
            hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    r
}

fn header_map(req: &Request<Incoming>) -> HashMap<String, String> {
    req.headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect()
}

fn b64url(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap_or_default()
}

/// Verifies the APNs provider token: header exactly `{"alg":"ES256","kid":"KEYID12345"}`, `iss`
/// `TEAM123456`, a fresh `iat`, a 64-byte signature valid for the test key.
pub fn verify_apns_jwt(auth: Option<&String>) -> Result<(), String> {
    let jwt = auth
        .and_then(|a| a.strip_prefix("bearer "))
        .ok_or("authorization is not `bearer <jwt>`")?;
    let parts: Vec<&str> = jwt.split('.').collect();
    if parts.len() != 3 {
        return Err("not a JWS".into());
    }
    let header: Value = serde_json::from_slice(&b64url(parts[0])).map_err(|e| e.to_string())?;
    if header != serde_json::json!({"alg":"ES256","kid":"KEYID12345"}) {
        return Err(format!("header {header}"));
    }
    if b64url(parts[2]).len() != 64 {
        return Err("signature is not 64 raw bytes".into());
    }
    let key = jsonwebtoken::DecodingKey::from_ec_pem(keys::APNS_PUBLIC_PEM.as_bytes()).unwrap();
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    v.required_spec_claims.clear();
    v.validate_exp = false;
    v.set_issuer(&["TEAM123456"]);
    let data = jsonwebtoken::decode::<Value>(jwt, &key, &v).map_err(|e| e.to_string())?;
    let iat = data.claims["iat"].as_i64().ok_or("no iat")?;
    let now = chrono::Utc::now().timestamp();
    if (now - iat).abs() > 3600 {
        return Err("stale iat".into());
    }
    Ok(())
}

/// [`verify_apns_jwt`], remembering a verified token for 60 s.
fn verify_apns_jwt_cached(f: &Fake, auth: Option<&String>) -> Result<(), String> {
    let fresh = |at: &Instant| at.elapsed() < Duration::from_secs(60);
    if let Some(a) = auth {
        if f.state
            .lock()
            .unwrap()
            .verified_jwts
            .get(a)
            .is_some_and(fresh)
        {
            return Ok(());
        }
    }
    verify_apns_jwt(auth)?;
    if let Some(a) = auth {
        let mut s = f.state.lock().unwrap();
        s.verified_jwts.retain(|_, at| fresh(at));
        s.verified_jwts.insert(a.clone(), Instant::now());
    }
    Ok(())
}

/// Starts the fake APNs (HTTP/2 cleartext, prior knowledge).
pub async fn apns() -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = Fake {
        addr: listener.local_addr().unwrap(),
        state: new_state(),
        stop: CancellationToken::new(),
    };
    let f = fake.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                _ = f.stop.cancelled() => return,
            };
            let f2 = f.clone();
            let svc = hyper::service::service_fn(move |req| {
                let f = f2.clone();
                async move { Ok::<_, Infallible>(apns_answer(f, req).await) }
            });
            let stop = f.stop.clone();
            tokio::spawn(async move {
                let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
    fake
}

async fn apns_answer(f: Fake, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let at = Instant::now();
    let path = req.uri().path().to_string();
    let headers = header_map(&req);
    let token = path.strip_prefix("/3/device/").unwrap_or("").to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let auth = verify_apns_jwt_cached(&f, headers.get("authorization"));
    let answer = {
        let mut s = f.state.lock().unwrap();
        let open = s.open.entry(token.clone()).or_default();
        *open += 1;
        let now_open = *open;
        let m = s.max_open.entry(token.clone()).or_default();
        *m = (*m).max(now_open);
        let scripted = s.scripts.get_mut(&token).and_then(VecDeque::pop_front);
        let a = scripted
            .or_else(|| s.default_for.get(&token).cloned())
            .unwrap_or_else(|| Answer::status(200, ""));
        let a = if auth.is_err() {
            Answer::status(403, r#"{"reason":"InvalidProviderToken"}"#)
        } else {
            a
        };
        s.seen.push(Seen {
            path,
            token: token.clone(),
            headers,
            body,
            at,
            answered_at: None,
            status: a.status,
            auth_ok: auth.is_ok(),
            auth_problem: auth.err().unwrap_or_default(),
        });
        a
    };
    finish_answer(&f, &token, at, answer).await
}

/// Counts a stream as closed when its handler ends, even if the connection died and hyper dropped
/// the handler unfinished.
struct OpenGuard {
    state: Arc<Mutex<State>>,
    token: String,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = s.open.get_mut(&self.token) {
            *o -= 1;
        }
    }
}

async fn finish_answer(f: &Fake, token: &str, at: Instant, a: Answer) -> Response<Full<Bytes>> {
    let guard = OpenGuard {
        state: f.state.clone(),
        token: token.to_string(),
    };
    if !a.delay.is_zero() {
        tokio::time::sleep(a.delay).await;
    }
    if let Some(h) = &a.hold {
        h.cancelled().await;
    }
    drop(guard);
    let mut s = f.state.lock().unwrap();
    if let Some(seen) = s
        .seen
        .iter_mut()
        .rev()
        .find(|x| x.token == token && x.at == at)
    {
        seen.answered_at = Some(Instant::now());
    }
    respond(a.status, a.body, &a.headers)
}

/// Starts the fake FCM and its token endpoint (`/token`) on one HTTP/1.1 listener.
pub async fn fcm() -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake = Fake {
        addr: listener.local_addr().unwrap(),
        state: new_state(),
        stop: CancellationToken::new(),
    };
    let f = fake.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                _ = f.stop.cancelled() => return,
            };
            let f2 = f.clone();
            let svc = hyper::service::service_fn(move |req| {
                let f = f2.clone();
                async move { Ok::<_, Infallible>(fcm_answer(f, req).await) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    fake
}

fn verify_assertion(assertion: &str, token_url: &str) -> Result<(), String> {
    let parts: Vec<&str> = assertion.split('.').collect();
    if parts.len() != 3 {
        return Err("not a JWS".into());
    }
    let header: Value = serde_json::from_slice(&b64url(parts[0])).map_err(|e| e.to_string())?;
    if header != serde_json::json!({"alg":"RS256","typ":"JWT","kid":"k1"}) {
        return Err(format!("header {header}"));
    }
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(keys::FCM_PUBLIC_PEM.as_bytes()).unwrap();
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    v.set_audience(&[token_url]);
    v.set_issuer(&["push@orca-test.example"]);
    let data = jsonwebtoken::decode::<Value>(assertion, &key, &v).map_err(|e| e.to_string())?;
    let c = data.claims;
    if c["scope"] != "https://www.googleapis.com/auth/firebase.messaging" {
        return Err("scope".into());
    }
    if c["exp"].as_i64().unwrap_or(0) - c["iat"].as_i64().unwrap_or(0) != 3600 {
        return Err("exp - iat".into());
    }
    Ok(())
}

fn form(body: &[u8]) -> HashMap<String, String> {
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.replace("%3A", ":")))
        .collect()
}

async fn fcm_answer(f: Fake, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let at = Instant::now();
    let path = req.uri().path().to_string();
    let headers = header_map(&req);
    let raw = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if path == "/token" {
        let fields = form(&raw);
        let check = verify_assertion(
            fields.get("assertion").map(String::as_str).unwrap_or(""),
            &f.token_url(),
        );
        let ok = check.is_ok()
            && fields.get("grant_type").map(String::as_str)
                == Some("urn:ietf:params:oauth:grant-type:jwt-bearer");
        let (status, body) = {
            let mut s = f.state.lock().unwrap();
            s.token_requests
                .push((fields, ok, check.err().unwrap_or_default()));
            (s.token_status, s.token_body.clone())
        };
        return respond(
            status,
            body,
            &[("content-type".into(), "application/json".into())],
        );
    }
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let token = body["message"]["token"].as_str().unwrap_or("").to_string();
    let auth_ok = headers.get("authorization").map(String::as_str) == Some("Bearer fake-access-1");
    let answer = {
        let mut s = f.state.lock().unwrap();
        let open = s.open.entry(token.clone()).or_default();
        *open += 1;
        let now_open = *open;
        let m = s.max_open.entry(token.clone()).or_default();
        *m = (*m).max(now_open);
        let a = s
            .scripts
            .get_mut(&token)
            .and_then(VecDeque::pop_front)
            .or_else(|| s.default_for.get(&token).cloned())
            .unwrap_or_else(|| Answer::status(200, r#"{"name":"projects/orca-test/messages/1"}"#));
        s.seen.push(Seen {
            path,
            token: token.clone(),
            headers,
            body,
            at,
            answered_at: None,
            status: a.status,
            auth_ok,
            auth_problem: String::new(),
        });
        a
    };
    finish_answer(&f, &token, at, answer).await
}
