//! FCM HTTP v1 (docs/reference/http.md): service-account OAuth (RS256 jwt-bearer assertion), a single-flight
//! access-token cache, and `messages:send`.

use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Map, Value};

use super::apns::PROVIDER_TIMEOUT;
use super::model::Notification;
use super::provider::{parse_retry_after, Outcome};
use crate::config::FcmConfig;
use crate::crypto::ident::sha256_hex;

const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
const ASSERTION_LIFE_S: i64 = 3600;
const TOKEN_MARGIN_MS: i64 = 60_000;

pub struct Fcm {
    key: EncodingKey,
    client_email: String,
    key_id: Option<String>,
    project_id: String,
    base_url: String,
    token_url: String,
    client: reqwest::Client,
    /// `(access token, expires_at_ms)`; the async mutex makes refreshes single-flight.
    token: tokio::sync::Mutex<Option<(String, i64)>>,
}

impl Fcm {
    pub fn new(cfg: &FcmConfig, base_url: &str, token_url: &str) -> Result<Fcm, String> {
        let key = EncodingKey::from_rsa_pem(cfg.private_key_pem.as_bytes()).map_err(|_| {
            "ORCA_PUSH_FCM_CREDENTIALS private_key must be an RSA private key PEM".to_string()
        })?;
        let client = reqwest::Client::builder()
            .timeout(PROVIDER_TIMEOUT)
            .connect_timeout(PROVIDER_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("FCM client: {e}"))?;
        let fcm = Fcm {
            key,
            client_email: cfg.client_email.clone(),
            key_id: cfg.private_key_id.clone(),
            project_id: cfg.project_id.clone(),
            base_url: base_url.to_string(),
            token_url: token_url.to_string(),
            client,
            token: tokio::sync::Mutex::new(None),
        };
        fcm.assertion(crate::clock::now_ms()).map_err(|_| {
            "ORCA_PUSH_FCM_CREDENTIALS private_key cannot sign RS256 assertions".to_string()
        })?;
        Ok(fcm)
    }

    fn assertion(&self, now: i64) -> Result<String, String> {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = self.key_id.clone();
        #[derive(serde::Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            scope: &'a str,
            aud: &'a str,
            iat: i64,
            exp: i64,
        }
        let iat = now / 1000;
        jsonwebtoken::encode(
            &header,
            &Claims {
                iss: &self.client_email,
                scope: SCOPE,
                aud: &self.token_url,
                iat,
                exp: iat + ASSERTION_LIFE_S,
            },
            &self.key,
        )
        .map_err(|e| e.to_string())
    }

    /// A cached access token or a fresh one; `None` on any failure (failures are not cached).
    async fn access_token(&self) -> Option<String> {
        let mut slot = self.token.lock().await;
        let now = crate::clock::now_ms();
        if let Some((t, exp)) = slot.as_ref() {
            if now < exp - TOKEN_MARGIN_MS {
                return Some(t.clone());
            }
        }
        let assertion = self.assertion(now).ok()?;
        let form = format!(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={assertion}"
        );
        let resp = self
            .client
            .post(&self.token_url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let v: Value = resp.json().await.ok()?;
        let token = v.get("access_token")?.as_str()?.to_string();
        if token.is_empty() {
            return None;
        }
        let expires_in = v.get("expires_in").and_then(Value::as_i64).unwrap_or(3600);
        *slot = Some((token.clone(), crate::clock::now_ms() + expires_in * 1000));
        Some(token)
    }

    async fn drop_token(&self) {
        *self.token.lock().await = None;
    }

    pub async fn send(&self, fp: &str, n: &Notification, token: &str, expires_at: i64) -> Outcome {
        if crate::clock::now_ms() >= expires_at {
            return Outcome::error("expired", None, false);
        }
        let Some(access) = self.access_token().await else {
            return Outcome::error("fcm_access_token_unavailable", None, true);
        };
        let now = crate::clock::now_ms();
        if now >= expires_at {
            return Outcome::error("expired", None, false);
        }
        let body = fcm_body(fp, n, token, expires_at, now);
        let url = format!(
            "{}/v1/projects/{}/messages:send",
            self.base_url, self.project_id
        );
        let resp = self
            .client
            .post(url)
            .header("authorization", format!("Bearer {access}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Outcome::error("fcm_timeout", None, true),
            Err(_) => return Outcome::error("fcm_transport_error", None, true),
        };
        let status = resp.status().as_u16();
        if resp.status().is_redirection() {
            return Outcome::error("fcm_transport_error", Some(status), true);
        }
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) if e.is_timeout() => return Outcome::error("fcm_timeout", None, true),
            Err(_) => return Outcome::error("fcm_transport_error", None, true),
        };
        let outcome = classify(
            status,
            &bytes,
            retry_after.as_deref(),
            crate::clock::now_ms(),
        );
        if status == 401 {
            self.drop_token().await;
        }
        outcome
    }
}

/// The `messages:send` body (docs/reference/http.md).
pub fn fcm_body(fp: &str, n: &Notification, token: &str, expires_at: i64, now: i64) -> String {
    let collapse = n.collapse_id(fp);
    let dismiss = n.effective_kind() == "dismiss";
    let ttl_s = ((expires_at - now).max(0) + 999) / 1000;
    let mut android = Map::new();
    android.insert("priority".into(), "HIGH".into());
    android.insert("ttl".into(), format!("{ttl_s}s").into());
    android.insert(
        "collapse_key".into(),
        sha256_hex(collapse.as_bytes())[..32].to_string().into(),
    );
    let mut message = Map::new();
    message.insert("token".into(), token.into());
    if !dismiss {
        message.insert(
            "notification".into(),
            json!({"title": n.title, "body": n.body}),
        );
        let channel = if n.sound == Some(false) {
            "orca-desktop-silent"
        } else {
            "orca-desktop"
        };
        android.insert(
            "notification".into(),
            json!({"channel_id": channel, "tag": collapse}),
        );
    }
    message.insert("android".into(), Value::Object(android));
    let mut data = Map::new();
    for (k, v) in n.orca_object(fp) {
        match v {
            Value::Null => {}
            Value::String(s) => {
                data.insert(k, s.into());
            }
            other => {
                data.insert(k, other.to_string().into());
            }
        }
    }
    message.insert("data".into(), Value::Object(data));
    json!({ "message": Value::Object(message) }).to_string()
}

/// Maps an FCM answer to an outcome (docs/reference/http.md table).
pub fn classify(status: u16, body: &[u8], retry_after: Option<&str>, now: i64) -> Outcome {
    if (200..300).contains(&status) {
        return Outcome::Sent;
    }
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    let err_status = err
        .and_then(|e| e.get("status"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let unregistered = err_status.as_deref() == Some("UNREGISTERED")
        || err
            .and_then(|e| e.get("details"))
            .and_then(Value::as_array)
            .is_some_and(|d| {
                d.iter()
                    .any(|x| x.get("errorCode").and_then(Value::as_str) == Some("UNREGISTERED"))
            });
    let s = Some(status);
    if unregistered {
        return Outcome::Dead {
            reason: "UNREGISTERED".into(),
            status: s,
        };
    }
    let message = err
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if err_status.as_deref() == Some("INVALID_ARGUMENT")
        && message.to_ascii_lowercase().contains("token")
    {
        return Outcome::Dead {
            reason: "INVALID_ARGUMENT".into(),
            status: s,
        };
    }
    let reason = match (&err_status, &parsed) {
        (Some(st), _) => st.clone(),
        (None, Some(_)) => "unknown".into(),
        (None, None) if body.iter().all(u8::is_ascii_whitespace) => "unknown".into(),
        (None, None) => "unparseable".into(),
    };
    let ra = parse_retry_after(retry_after, now);
    let (retryable, retry_after_ms) = match status {
        401 => (true, None),
        429 => (true, Some(ra.unwrap_or(0).max(60_000))),
        500..=599 => (true, Some(ra.unwrap_or(0).max(10_000))),
        _ => (false, None),
    };
    Outcome::Error {
        reason,
        status: s,
        retryable,
        retry_after_ms,
    }
}

/// Used by tests: how long a token stays cached before refresh.
pub const fn token_margin() -> Duration {
    Duration::from_millis(TOKEN_MARGIN_MS as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(classify(200, b"{}", None, 0), Outcome::Sent);
        assert!(
            matches!(classify(404, br#"{"error":{"status":"NOT_FOUND","details":[{"errorCode":"UNREGISTERED"}]}}"#, None, 0), Outcome::Dead { reason, .. } if reason == "UNREGISTERED")
        );
        assert!(
            matches!(classify(400, br#"{"error":{"status":"INVALID_ARGUMENT","message":"The registration Token is not valid"}}"#, None, 0), Outcome::Dead { reason, .. } if reason == "INVALID_ARGUMENT")
        );
        assert!(matches!(
            classify(
                400,
                br#"{"error":{"status":"INVALID_ARGUMENT","message":"bad ttl"}}"#,
                None,
                0
            ),
            Outcome::Error {
                retryable: false,
                ..
            }
        ));
        assert!(matches!(
            classify(429, b"", Some("1"), 0),
            Outcome::Error {
                retryable: true,
                retry_after_ms: Some(60_000),
                ..
            }
        ));
        assert!(matches!(
            classify(503, b"", Some("20"), 0),
            Outcome::Error {
                retryable: true,
                retry_after_ms: Some(20_000),
                ..
            }
        ));
        assert!(
            matches!(classify(401, br#"{"error":{"status":"UNAUTHENTICATED"}}"#, None, 0), Outcome::Error { retryable: true, reason, .. } if reason == "UNAUTHENTICATED")
        );
    }
}
