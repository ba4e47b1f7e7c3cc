//! Strict JSON frame schemas of the cell's legs (docs/reference/websocket.md), on top of the leg
//! toolkit's generic parsing ([`crate::leg::frame`]).
//!
//! Every schema denies unknown fields; fraction/exponent or out-of-range values are invalid.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::contract::validate::is_opaque_id;
use crate::crypto::b64::is_b64u32;
pub use crate::leg::frame::{body, chars_in, split, Check, RelayAuth, Split, MAX_SAFE};

fn is_key32_shape(s: &str) -> bool {
    s.len() == 44
        && s.ends_with('=')
        && s[..43]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// `host-hello`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostHello {
    pub v: u64,
    pub relay_host_id: String,
    pub assignment_epoch: u64,
    pub host_public_key_b64: String,
    pub app_version: String,
    #[serde(default)]
    pub previous_generation: Option<u64>,
    #[serde(default)]
    pub control_resume_secret: Option<String>,
}

impl Check for HostHello {
    fn check(&self) -> bool {
        self.v == 1
            && self.assignment_epoch <= MAX_SAFE
            && self.previous_generation.is_none_or(|g| g <= MAX_SAFE)
            && is_key32_shape(&self.host_public_key_b64)
            && chars_in(&self.app_version, 1, 128)
            && self.control_resume_secret.as_deref().is_none_or(is_b64u32)
    }
}

/// `host-challenge-ack`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChallengeAck {
    pub challenge_id: String,
    pub proof_b64: String,
}

impl Check for ChallengeAck {
    fn check(&self) -> bool {
        is_opaque_id(&self.challenge_id) && is_key32_shape(&self.proof_b64)
    }
}

/// `host-data-auth`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostDataAuth {
    pub v: u64,
    pub conn_ticket: String,
    pub generation: u64,
}

impl Check for HostDataAuth {
    fn check(&self) -> bool {
        self.v == 1 && is_b64u32(&self.conn_ticket) && self.generation <= MAX_SAFE
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pong {
    pub t: u64,
}
impl Check for Pong {
    fn check(&self) -> bool {
        self.t <= MAX_SAFE
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthRefresh {
    pub relay_jwt: String,
}
impl Check for AuthRefresh {
    fn check(&self) -> bool {
        chars_in(&self.relay_jwt, 1, 8192)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InviteCreate {
    pub req_id: String,
    pub relay_device_id: String,
}
impl Check for InviteCreate {
    fn check(&self) -> bool {
        is_opaque_id(&self.req_id) && is_opaque_id(&self.relay_device_id)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstallAuthorization {
    pub mode: String,
    #[serde(default)]
    pub basis_conn_id: Option<String>,
    #[serde(default)]
    pub direct_auth_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Install {
    pub v: u64,
    pub req_id: String,
    pub relay_device_id: String,
    pub new_resume_token_hash: String,
    #[serde(default)]
    pub expected_current_hash: Option<String>,
    pub authorization: InstallAuthorization,
}
impl Check for Install {
    fn check(&self) -> bool {
        let a = &self.authorization;
        let auth_ok = match a.mode.as_str() {
            "relay-basis" => {
                a.direct_auth_id.is_none() && a.basis_conn_id.as_deref().is_some_and(is_opaque_id)
            }
            "authenticated-direct" => {
                a.basis_conn_id.is_none() && a.direct_auth_id.as_deref().is_some_and(is_opaque_id)
            }
            _ => false,
        };
        self.v == 1
            && auth_ok
            && is_opaque_id(&self.req_id)
            && is_opaque_id(&self.relay_device_id)
            && is_b64u32(&self.new_resume_token_hash)
            && self.expected_current_hash.as_deref().is_none_or(is_b64u32)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstallStatus {
    pub v: u64,
    pub req_id: String,
    pub relay_device_id: String,
}
impl Check for InstallStatus {
    fn check(&self) -> bool {
        self.v == 1 && is_opaque_id(&self.req_id) && is_opaque_id(&self.relay_device_id)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumeConfirm {
    pub v: u64,
    pub req_id: String,
    pub basis_conn_id: String,
}
impl Check for ResumeConfirm {
    fn check(&self) -> bool {
        self.v == 1 && is_opaque_id(&self.req_id) && is_opaque_id(&self.basis_conn_id)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Revoke {
    pub req_id: String,
    pub relay_device_id: String,
}
impl Check for Revoke {
    fn check(&self) -> bool {
        is_opaque_id(&self.req_id) && is_opaque_id(&self.relay_device_id)
    }
}

/// The `reqId` of an invalid command payload, echoed only if it is itself valid.
pub fn valid_req_id(m: &Map<String, Value>) -> Option<String> {
    match m.get("reqId") {
        Some(Value::String(s)) if is_opaque_id(s) => Some(s.clone()),
        _ => None,
    }
}

/// Parses the `x-orca-host-capabilities` header values: comma-separated, trimmed, 1..64
/// chars kept, first 16 only.
pub fn capabilities<'a>(values: impl Iterator<Item = &'a str>) -> Vec<String> {
    values
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| chars_in(t, 1, 64))
        .take(crate::contract::limits::CAPABILITY_TOKENS_MAX)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;

    fn parse<T: DeserializeOwned + Check>(text: &str) -> Option<T> {
        match split(text) {
            Split::Typed(_, m) => body(m),
            _ => None,
        }
    }

    const KEY: &str = "e06Qm75//kTEZaIgA31gjuNYl9Me+XLwf3SJLLD3PxM=";

    #[test]
    fn hello_is_strict() {
        let ok = format!(
            r#"{{"type":"host-hello","v":1,"relayHostId":"0Zvz8IJ4LIe3g_5x","assignmentEpoch":1,"hostPublicKeyB64":"{KEY}","appVersion":"1.0"}}"#
        );
        assert!(parse::<HostHello>(&ok).is_some());
        let extra = ok.replace("\"v\":1", "\"v\":1,\"x\":1");
        assert!(parse::<HostHello>(&extra).is_none());
        let frac = ok.replace("\"assignmentEpoch\":1", "\"assignmentEpoch\":1.0");
        assert!(parse::<HostHello>(&frac).is_none());
        let exp = ok.replace("\"assignmentEpoch\":1", "\"assignmentEpoch\":1e0");
        assert!(parse::<HostHello>(&exp).is_none());
        let big = ok.replace(
            "\"assignmentEpoch\":1",
            "\"assignmentEpoch\":9007199254740992",
        );
        assert!(parse::<HostHello>(&big).is_none());
        let empty_app = ok.replace("\"1.0\"", "\"\"");
        assert!(parse::<HostHello>(&empty_app).is_none());
        let null_prev = ok.replace("\"v\":1", "\"v\":1,\"previousGeneration\":null");
        // `null` is not an integer.
        assert!(
            parse::<HostHello>(&null_prev).is_none()
                || parse::<HostHello>(&null_prev)
                    .unwrap()
                    .previous_generation
                    .is_none()
        );
    }

    #[test]
    fn data_auth() {
        let c = "BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU";
        assert!(parse::<HostDataAuth>(&format!(
            r#"{{"type":"host-data-auth","v":1,"connTicket":"{c}","generation":1}}"#
        ))
        .is_some());
        assert!(parse::<HostDataAuth>(&format!(
            r#"{{"type":"host-data-auth","v":2,"connTicket":"{c}","generation":1}}"#
        ))
        .is_none());
    }

    #[test]
    fn capability_header() {
        let caps = capabilities(
            [" pending-conn-details , ,x", "idle-regional-rehome-v1"]
                .iter()
                .copied(),
        );
        assert_eq!(
            caps,
            vec!["pending-conn-details", "x", "idle-regional-rehome-v1"]
        );
        let many: Vec<String> = (0..20).map(|i| format!("c{i}")).collect();
        assert_eq!(
            capabilities([many.join(",").as_str()].into_iter()).len(),
            16
        );
    }
}
