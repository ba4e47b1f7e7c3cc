//! A real host desktop and phone speaking the cell protocol over real sockets: used by the
//! integration tests, `examples/host.rs`, `examples/phone.rs` and `examples/loadgen.rs`.
//!
//! The host has its own X25519 key, mints a self-hosted token with K (docs/reference/http.md), asks
//! `/v1/assign`, proves the challenge and drives its control socket; the phone dials with a
//! credential and reads `relay-hello`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::crypto::{self, HostBinding, HostChallengeFrame, X25519Keypair};

pub type ClientWs = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Client socket configuration: small buffers, large enough messages for every leg test.
pub fn client_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(16 * 1024)
        .write_buffer_size(16 * 1024)
        .max_message_size(Some(64 << 20))
        .max_frame_size(Some(64 << 20))
}

/// `http://…` → `ws://…` (and https → wss).
pub fn ws_origin(http_origin: &str) -> String {
    if let Some(rest) = http_origin.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = http_origin.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        http_origin.to_owned()
    }
}

/// What `wss://` dials and `https://` requests of this kit trust: the system roots plus the
/// extra CA given to [`trust_extra_ca`] (a test CA), like a phone with a private CA installed.
struct Trust {
    rustls: Arc<rustls::ClientConfig>,
    http: reqwest::Client,
}

static TRUST: RwLock<Option<Arc<Trust>>> = RwLock::new(None);
/// Every CA given so far: tests running side by side in one process each add their own.
static EXTRA: RwLock<Vec<rustls::pki_types::CertificateDer<'static>>> = RwLock::new(Vec::new());

fn trust() -> Arc<Trust> {
    if let Some(t) = TRUST.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return t.clone();
    }
    trust_extra_ca(&[]);
    trust()
}

/// Trusts `pem` (PEM CA certificates) besides the system roots (and the CAs given before) for
/// every later dial/request.
pub fn trust_extra_ca(pem: &[u8]) {
    // The CA list stays locked until the new trust is published: two tests adding their CAs at
    // once must not publish in the reverse order and leave one CA out.
    let mut all = EXTRA.write().unwrap_or_else(|e| e.into_inner());
    all.extend(crate::tls::server::pem_certs(pem));
    let extra = crate::tls::ExtraCa {
        path: None,
        certs: all.clone(),
    };
    let t = Trust {
        rustls: crate::tls::client::client_config(&extra, &[b"http/1.1"]),
        http: crate::tls::client::cluster_client_builder(&extra)
            .build()
            .expect("test http client"),
    };
    *TRUST.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(t));
    drop(all);
}

/// The kit's HTTP client (trusting the extra CA when one was given).
pub fn http_client() -> reqwest::Client {
    trust().http.clone()
}

/// Dials a leg; `headers` are added to the upgrade request. `wss://` runs TLS over rustls.
pub async fn dial(url: &str, headers: &[(&str, String)]) -> Result<ClientWs, String> {
    let mut req = url.into_client_request().map_err(|e| e.to_string())?;
    for (k, v) in headers {
        req.headers_mut().append(
            http::header::HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?,
            http::HeaderValue::from_str(v).map_err(|e| e.to_string())?,
        );
    }
    let connector = url
        .starts_with("wss://")
        .then(|| tokio_tungstenite::Connector::Rustls(trust().rustls.clone()));
    let (ws, _) = tokio_tungstenite::connect_async_tls_with_config(
        req,
        Some(client_config()),
        true,
        connector,
    )
    .await
    .map_err(|e| match e {
        tokio_tungstenite::tungstenite::Error::Http(r) => {
            // A refusal's Retry-After is kept for the clients that honour it (storm_bench).
            match r.headers().get("retry-after").and_then(|v| v.to_str().ok()) {
                Some(ra) => format!("http {} retry-after={ra}", r.status().as_u16()),
                None => format!("http {}", r.status().as_u16()),
            }
        }
        other => other.to_string(),
    })?;
    Ok(ws)
}

/// Reads the next text frame as JSON, skipping WebSocket pings; `Err` carries the close.
pub async fn recv_json(ws: &mut ClientWs, within: Duration) -> Result<Value, (u16, String)> {
    let read = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    return serde_json::from_str(t.as_str())
                        .map_err(|_| (0, format!("not JSON: {t}")))
                }
                Some(Ok(Message::Close(f))) => {
                    return Err(f
                        .map(|f| (u16::from(f.code), f.reason.as_str().to_owned()))
                        .unwrap_or((1005, String::new())))
                }
                Some(Ok(Message::Binary(_))) => return Err((0, "unexpected binary".into())),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err((1006, e.to_string())),
                None => return Err((1006, "eof".into())),
            }
        }
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or(Err((0, "timeout".into())))
}

/// Waits for the peer's close frame: (code, reason).
pub async fn recv_close(ws: &mut ClientWs, within: Duration) -> (u16, String) {
    let read = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(f))) => {
                    return f
                        .map(|f| (u16::from(f.code), f.reason.as_str().to_owned()))
                        .unwrap_or((1005, String::new()))
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return (1006, String::new()),
            }
        }
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or((0, "timeout".into()))
}

/// A desktop host identity.
#[derive(Clone)]
pub struct HostIdentity {
    pub keys: X25519Keypair,
    pub relay_host_id: String,
    pub user_id: String,
}

impl HostIdentity {
    pub fn generate(user_id: &str) -> HostIdentity {
        let keys = X25519Keypair::generate();
        HostIdentity {
            relay_host_id: crypto::relay_host_id(&keys.public),
            keys,
            user_id: user_id.to_owned(),
        }
    }

    pub fn public_b64(&self) -> String {
        crypto::std_encode(&self.keys.public)
    }

    /// A self-hosted host token (15 min) signed with K derived from the assignment signing key.
    pub fn token(&self, signing_key: &str, public_url: &str) -> String {
        let k = crypto::self_hosted_key(signing_key);
        crypto::mint_host_token(
            &k,
            &self.user_id,
            public_url,
            &self.relay_host_id,
            crate::clock::now_ms(),
        )
        .0
    }
}

/// `POST /v1/assign` → (cellUrl, assignmentEpoch).
pub async fn assign(
    director: &str,
    token: &str,
    relay_host_id: &str,
) -> Result<(String, i64), String> {
    let r = http_client()
        .post(format!("{director}/v1/assign"))
        .bearer_auth(token)
        .json(&json!({"v":1,"relayHostId":relay_host_id}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let body: Value = r.json().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("assign {status}: {body}"));
    }
    Ok((
        body["cellUrl"].as_str().unwrap_or_default().to_owned(),
        body["assignmentEpoch"].as_i64().unwrap_or(0),
    ))
}

/// Options of one control handshake.
#[derive(Clone, Default)]
pub struct Hello {
    pub epoch: i64,
    pub previous_generation: Option<i64>,
    pub resume_secret: Option<String>,
    pub capabilities: Vec<String>,
}

/// An activated control socket.
pub struct HostControl {
    pub ws: ClientWs,
    pub ack: Value,
    pub generation: i64,
    pub secret: String,
    /// Whether the challenge transcript carried `resumeRequested` = 1.
    pub resumed: bool,
}

/// Dials `/v1/host/control` and runs the handshake to `host-hello-ack`. `Err` = the close (or an
/// HTTP refusal as `(status, "http")`).
pub async fn connect_control(
    cell_url: &str,
    host: &HostIdentity,
    token: &str,
    profile: &str,
    hello: &Hello,
) -> Result<HostControl, (u16, String)> {
    let mut headers = vec![("authorization", format!("Bearer {token}"))];
    if !hello.capabilities.is_empty() {
        headers.push(("x-orca-host-capabilities", hello.capabilities.join(",")));
    }
    let mut ws = dial(
        &format!("{}/v1/host/control", ws_origin(cell_url)),
        &headers,
    )
    .await
    .map_err(|e| (0, e))?;
    let mut frame = json!({"type":"host-hello","v":1,"relayHostId":host.relay_host_id,
        "assignmentEpoch":hello.epoch,"hostPublicKeyB64":host.public_b64(),"appVersion":"orca-test/1"});
    if let Some(g) = hello.previous_generation {
        frame["previousGeneration"] = json!(g);
    }
    if let Some(s) = &hello.resume_secret {
        frame["controlResumeSecret"] = json!(s);
    }
    ws.send(Message::text(frame.to_string()))
        .await
        .map_err(|e| (0, e.to_string()))?;
    let challenge = recv_json(&mut ws, Duration::from_secs(5)).await?;
    let (proof, resumed) =
        answer(cell_url, host, profile, hello, &challenge).map_err(|e| (0, e))?;
    ws.send(Message::text(
        json!({"type":"host-challenge-ack","challengeId":challenge["challengeId"],"proofB64":crypto::std_encode(&proof)})
            .to_string(),
    ))
    .await
    .map_err(|e| (0, e.to_string()))?;
    let ack = recv_json(&mut ws, Duration::from_secs(10)).await?;
    if ack["type"] != "host-hello-ack" {
        return Err((0, format!("unexpected {ack}")));
    }
    Ok(HostControl {
        generation: ack["generation"].as_i64().unwrap_or(0),
        secret: ack["controlResumeSecret"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        ws,
        ack,
        resumed,
    })
}

/// The host side of the proof: verifies the 16 fields and returns (proof, resumeRequested).
pub fn answer(
    cell_url: &str,
    host: &HostIdentity,
    profile: &str,
    hello: &Hello,
    challenge: &Value,
) -> Result<([u8; 32], bool), String> {
    let mut c = challenge.clone();
    if let Value::Object(m) = &mut c {
        m.remove("type");
    }
    let frame: HostChallengeFrame =
        serde_json::from_value(c).map_err(|e| format!("challenge: {e}"))?;
    let binding = HostBinding {
        relay_origin: cell_url.to_owned(),
        user_id: host.user_id.clone(),
        profile_id: profile.to_owned(),
        organization_id: String::new(),
        relay_host_id: host.relay_host_id.clone(),
        host_public: host.keys.public,
        assignment_epoch: hello.epoch as u64,
        previous_generation: hello.previous_generation.map(|g| g as u64),
        resume_requested: hello.resume_secret.is_some(),
    };
    let proof =
        crypto::answer_host_challenge(&host.keys.secret, &frame, &binding, crate::clock::now_ms())?;
    // Which value of resumeRequested the cell used: try the strict non-resume binding.
    let strict = HostBinding {
        resume_requested: false,
        ..binding
    };
    let resumed =
        crypto::answer_host_challenge(&host.keys.secret, &frame, &strict, crate::clock::now_ms())
            .is_err();
    Ok((proof, resumed))
}

impl HostControl {
    pub async fn send(&mut self, v: Value) {
        let _ = self.ws.send(Message::text(v.to_string())).await;
    }

    /// Next control frame that is not a `ping` (answered with `pong` on the way).
    pub async fn recv(&mut self, within: Duration) -> Result<Value, (u16, String)> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let v = recv_json(&mut self.ws, left).await?;
            if v["type"] == "ping" {
                self.send(json!({"type":"pong","t":v["t"]})).await;
                continue;
            }
            return Ok(v);
        }
    }

    /// `invite-create` → the invite token.
    pub async fn create_invite(&mut self, req_id: &str, device: &str) -> Result<String, Value> {
        self.send(json!({"type":"invite-create","reqId":req_id,"relayDeviceId":device}))
            .await;
        let v = self
            .recv(Duration::from_secs(10))
            .await
            .map_err(|e| json!({"close": e.0, "reason": e.1}))?;
        match v["inviteToken"].as_str() {
            Some(t) if v["type"] == "invite-created" => Ok(t.to_owned()),
            _ => Err(v),
        }
    }
}

/// Dials the phone leg and sends `relay-auth`.
pub async fn connect_phone(
    cell_url: &str,
    relay_host_id: &str,
    credential: &str,
    headers: &[(&str, String)],
) -> Result<ClientWs, String> {
    let mut ws = dial(
        &format!("{}/v1/connect/{relay_host_id}", ws_origin(cell_url)),
        headers,
    )
    .await?;
    ws.send(Message::text(
        json!({"type":"relay-auth","v":1,"mode":"connect","credential":credential}).to_string(),
    ))
    .await
    .map_err(|e| e.to_string())?;
    Ok(ws)
}

/// Dials the data leg for a `conn-open` and sends `host-data-auth`.
pub async fn connect_data(
    cell_url: &str,
    conn_open: &Value,
    generation: i64,
    headers: &[(&str, String)],
) -> Result<ClientWs, String> {
    let conn_id = conn_open["connId"].as_str().unwrap_or_default();
    let mut ws = dial(
        &format!("{}/v1/host/data/{conn_id}", ws_origin(cell_url)),
        headers,
    )
    .await?;
    ws.send(Message::text(
        json!({"type":"host-data-auth","v":1,"connTicket":conn_open["connTicket"],"generation":generation}).to_string(),
    ))
    .await
    .map_err(|e| e.to_string())?;
    Ok(ws)
}

/// A phone paired through a host: the phone socket, the host's data socket and the `relay-hello`.
pub struct Pair {
    pub phone: ClientWs,
    pub data: ClientWs,
    pub hello: Value,
    pub conn_id: String,
}

impl Pair {
    /// One text frame each way through the splice, within `within`.
    pub async fn echo(&mut self, tag: &str, within: Duration) -> Result<(), String> {
        let run = async {
            let m = Message::text(format!("to-host {tag}"));
            self.phone
                .send(m.clone())
                .await
                .map_err(|e| e.to_string())?;
            match self.data.next().await {
                Some(Ok(got)) if got == m => {}
                other => return Err(format!("data leg got {other:?}")),
            }
            let m = Message::text(format!("to-phone {tag}"));
            self.data.send(m.clone()).await.map_err(|e| e.to_string())?;
            match self.phone.next().await {
                Some(Ok(got)) if got == m => Ok(()),
                other => Err(format!("phone got {other:?}")),
            }
        };
        tokio::time::timeout(within, run)
            .await
            .unwrap_or_else(|_| Err("timeout".into()))
    }
}

/// Invite → phone → `conn-open` → data leg → `relay-hello`. `headers` go on both legs (e.g. a
/// distinct `X-Forwarded-For` per pair behind a trusted proxy).
pub async fn pair_phone(
    cell_url: &str,
    control: &mut HostControl,
    relay_host_id: &str,
    credential: &str,
    headers: &[(&str, String)],
) -> Result<Pair, String> {
    let mut phone = connect_phone(cell_url, relay_host_id, credential, headers).await?;
    let open = control
        .recv(Duration::from_secs(10))
        .await
        .map_err(|e| format!("control closed {e:?}"))?;
    if open["type"] != "conn-open" {
        return Err(format!("expected conn-open, got {open}"));
    }
    let data = connect_data(cell_url, &open, control.generation, headers).await?;
    let hello = recv_json(&mut phone, Duration::from_secs(10))
        .await
        .map_err(|e| format!("phone closed {e:?}"))?;
    if hello["ok"] != true {
        return Err(format!("relay-hello {hello}"));
    }
    Ok(Pair {
        phone,
        data,
        hello,
        conn_id: open["connId"].as_str().unwrap_or_default().to_owned(),
    })
}
