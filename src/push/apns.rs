//! APNs over HTTP/2 (docs/reference/http.md): ES256 provider token, one multiplexed connection per origin.
//!
//! reqwest keeps one HTTP/2 connection per origin and honours the peer's stream limit; `http://`
//! bases (local fakes) use cleartext prior knowledge, `https://` negotiates `h2` over TLS.

use std::sync::Mutex;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use p256::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use p256::SecretKey;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use serde_json::{json, Value};

use super::model::Notification;
use super::provider::{parse_retry_after, Outcome};
use crate::config::ApnsConfig;

/// Provider token age before re-minting.
const JWT_MAX_AGE_MS: i64 = 3_000_000;
pub const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Apns {
    key: EncodingKey,
    key_id: String,
    team_id: String,
    topic: String,
    base_url: Option<String>,
    client: reqwest::Client,
    /// `(jwt, minted_at_ms)`.
    token: Mutex<Option<(String, i64)>>,
}

/// Reads a P-256 key: the first private key in a PEM text, PKCS#8 or SEC1 (`openssl ecparam
/// -genkey` output, `EC PARAMETERS` block included), handed to the JWT library as PKCS#8.
pub fn load_key(pem: &str) -> Result<EncodingKey, String> {
    let bad = || "ORCA_PUSH_APNS_KEY must be a P-256 private key (PKCS#8 or SEC1 PEM)".to_string();
    let key = match PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| bad())? {
        PrivateKeyDer::Sec1(der) => SecretKey::from_sec1_der(der.secret_sec1_der()).ok(),
        PrivateKeyDer::Pkcs8(der) => SecretKey::from_pkcs8_der(der.secret_pkcs8_der()).ok(),
        _ => None,
    }
    .ok_or_else(bad)?;
    let pkcs8 = key.to_pkcs8_der().map_err(|_| bad())?;
    Ok(EncodingKey::from_ec_der(pkcs8.as_bytes()))
}

impl Apns {
    pub fn new(cfg: &ApnsConfig, topic: &str, base_url: Option<String>) -> Result<Apns, String> {
        let key = load_key(&cfg.key_pem)?;
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .timeout(PROVIDER_TIMEOUT)
            .connect_timeout(PROVIDER_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .http2_keep_alive_interval(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("APNs client: {e}"))?;
        let apns = Apns {
            key,
            key_id: cfg.key_id.clone(),
            team_id: cfg.team_id.clone(),
            topic: topic.to_string(),
            base_url,
            client,
            token: Mutex::new(None),
        };
        // Mint once now so a key jsonwebtoken cannot sign with fails start-up, not deliveries.
        apns.provider_token(crate::clock::now_ms())
            .map_err(|_| "ORCA_PUSH_APNS_KEY cannot sign ES256 provider tokens".to_string())?;
        Ok(apns)
    }

    fn provider_token(&self, now: i64) -> Result<String, String> {
        let mut slot = crate::sync::lock(&self.token);
        if let Some((t, at)) = slot.as_ref() {
            if now - at < JWT_MAX_AGE_MS {
                return Ok(t.clone());
            }
        }
        let mut header = Header::new(Algorithm::ES256);
        header.typ = None;
        header.kid = Some(self.key_id.clone());
        #[derive(serde::Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            iat: i64,
        }
        let jwt = jsonwebtoken::encode(
            &header,
            &Claims {
                iss: &self.team_id,
                iat: now / 1000,
            },
            &self.key,
        )
        .map_err(|e| e.to_string())?;
        *slot = Some((jwt.clone(), now));
        Ok(jwt)
    }

    fn drop_token(&self) {
        *crate::sync::lock(&self.token) = None;
    }

    fn origin(&self, environment: &str) -> &str {
        match &self.base_url {
            Some(u) => u,
            None if environment == "sandbox" => "https://api.sandbox.push.apple.com",
            None => "https://api.push.apple.com",
        }
    }

    /// Sends one notification to `token`.
    pub async fn send(
        &self,
        fp: &str,
        n: &Notification,
        token: &str,
        environment: &str,
        expires_at: i64,
        now: i64,
    ) -> Outcome {
        let expiration_s = expires_at.div_euclid(1000);
        if expiration_s * 1000 <= now {
            return Outcome::error("expired", None, false);
        }
        let jwt = match self.provider_token(now) {
            Ok(j) => j,
            Err(_) => return Outcome::error("apns_transport_error", None, true),
        };
        let dismiss = n.effective_kind() == "dismiss";
        let body = apns_body(fp, n);
        let url = format!("{}/3/device/{}", self.origin(environment), token);
        let mut req = self
            .client
            .post(url)
            .header("authorization", format!("bearer {jwt}"))
            .header("apns-topic", &self.topic)
            .header(
                "apns-push-type",
                if dismiss { "background" } else { "alert" },
            )
            .header("apns-priority", if dismiss { "5" } else { "10" })
            .header("apns-expiration", expiration_s.to_string())
            .header("content-type", "application/json");
        if !dismiss {
            req = req.header("apns-collapse-id", n.collapse_id(fp));
        }
        let resp = match req.body(body).send().await {
            Ok(r) => r,
            Err(e) => return transport_outcome(&e),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => return transport_outcome(&e),
        };
        let outcome = classify(
            status,
            &bytes,
            retry_after.as_deref(),
            crate::clock::now_ms(),
        );
        if let Outcome::Error { reason, .. } = &outcome {
            if reason == "ExpiredProviderToken" {
                self.drop_token();
            }
        }
        outcome
    }
}

fn transport_outcome(e: &reqwest::Error) -> Outcome {
    if e.is_timeout() {
        Outcome::error("apns_timeout", None, true)
    } else if e.is_connect() {
        Outcome::error("apns_transport_error", None, true)
    } else if e.is_request() || e.is_body() {
        Outcome::error("apns_stream_closed", None, true)
    } else {
        Outcome::error("apns_transport_error", None, true)
    }
}

/// The APNs JSON body (docs/reference/http.md).
pub fn apns_body(fp: &str, n: &Notification) -> String {
    let orca = Value::Object(n.orca_object(fp));
    let v = if n.effective_kind() == "dismiss" {
        let mut orca = orca;
        // The dismiss body always names its kind, even when the notification carried it implicitly.
        if let Value::Object(m) = &mut orca {
            if !m.contains_key("kind") {
                let mut with = serde_json::Map::new();
                with.insert("kind".into(), "dismiss".into());
                with.extend(std::mem::take(m));
                *m = with;
            }
        }
        json!({"aps": {"content-available": 1}, "orca": orca})
    } else {
        let mut aps = serde_json::Map::new();
        aps.insert("alert".into(), json!({"title": n.title, "body": n.body}));
        if n.sound != Some(false) {
            aps.insert("sound".into(), "default".into());
        }
        aps.insert("thread-id".into(), fp.into());
        json!({"aps": Value::Object(aps), "orca": orca})
    };
    v.to_string()
}

/// Maps an APNs answer to an outcome (docs/reference/http.md table).
pub fn classify(status: u16, body: &[u8], retry_after: Option<&str>, now: i64) -> Outcome {
    if status == 200 {
        return Outcome::Sent;
    }
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        "unknown".to_string()
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => v
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
            Err(_) => "unparseable".to_string(),
        }
    };
    let s = Some(status);
    match status {
        410 => Outcome::Dead { reason, status: s },
        400 if reason == "BadDeviceToken" || reason == "Unregistered" => {
            Outcome::Dead { reason, status: s }
        }
        403 if reason == "ExpiredProviderToken" => Outcome::Error {
            reason,
            status: s,
            retryable: true,
            retry_after_ms: None,
        },
        429 | 500..=599 => Outcome::Error {
            reason,
            status: s,
            retryable: true,
            retry_after_ms: parse_retry_after(retry_after, now),
        },
        _ => Outcome::Error {
            reason,
            status: s,
            retryable: false,
            retry_after_ms: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(classify(200, b"", None, 0), Outcome::Sent);
        assert!(
            matches!(classify(410, br#"{"reason":"Unregistered"}"#, None, 0), Outcome::Dead { reason, .. } if reason == "Unregistered")
        );
        assert!(
            matches!(classify(410, b"", None, 0), Outcome::Dead { reason, .. } if reason == "unknown")
        );
        assert!(matches!(
            classify(400, br#"{"reason":"BadDeviceToken"}"#, None, 0),
            Outcome::Dead { .. }
        ));
        assert!(matches!(
            classify(400, br#"{"reason":"DeviceTokenNotForTopic"}"#, None, 0),
            Outcome::Error {
                retryable: false,
                ..
            }
        ));
        assert!(matches!(
            classify(403, br#"{"reason":"ExpiredProviderToken"}"#, None, 0),
            Outcome::Error {
                retryable: true,
                ..
            }
        ));
        assert!(matches!(
            classify(429, b"{}", Some("5"), 0),
            Outcome::Error {
                retryable: true,
                retry_after_ms: Some(5000),
                ..
            }
        ));
        assert!(
            matches!(classify(503, b"<html>", None, 0), Outcome::Error { reason, retryable: true, .. } if reason == "unparseable")
        );
        assert!(matches!(
            classify(404, b"", None, 0),
            Outcome::Error {
                retryable: false,
                ..
            }
        ));
    }

    #[test]
    fn bodies() {
        let n = Notification {
            notification_id: Some("n1".into()),
            notification_seq: 3,
            notification_epoch: "e".into(),
            source: "plugin".into(),
            agent_state: None,
            title: "T".into(),
            body: "B".into(),
            worktree_id: None,
            pane_key: Some("p".into()),
            sound: Some(false),
            kind: None,
            expires_at: None,
        };
        assert_eq!(
            apns_body("fp", &n),
            r#"{"aps":{"alert":{"title":"T","body":"B"},"thread-id":"fp"},"orca":{"hostFingerprint":"fp","paneKey":"p","notificationId":"n1","notificationSeq":3,"notificationEpoch":"e","source":"plugin","agentState":null}}"#
        );
        let mut d = n.clone();
        d.kind = Some("dismiss".into());
        assert_eq!(
            apns_body("fp", &d),
            r#"{"aps":{"content-available":1},"orca":{"kind":"dismiss","hostFingerprint":"fp","paneKey":"p","notificationId":"n1","notificationSeq":3,"notificationEpoch":"e","source":"plugin","agentState":null}}"#
        );
    }
}
