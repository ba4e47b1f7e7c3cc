//! Request schemas and the pure rules of docs/reference/http.md: validation, canonical JSON, event identity,
//! content fingerprint and collapse id. No I/O.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::crypto::ident::sha256_hex;

/// Largest integer the JSON numbers may carry (2^53 − 1).
pub const MAX_SAFE: u64 = (1 << 53) - 1;
pub const MAX_DEVICES: i64 = 64;
pub const MAX_IDS_PER_SEND: usize = 20;
pub const NOTIFICATION_TTL_MS: i64 = 300_000;
pub const CANONICAL_MAX_BYTES: usize = 3000;

/// Distinguishes an absent key (`None`) from an explicit `null` (`Some(None)`).
fn some<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `agentState`: a required key whose value is a string or `null` (the spec's one nullable field).
fn agent_state<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    crate::contract::strict::nullable(d).map(Some)
}

fn chars(s: &str) -> usize {
    s.chars().count()
}

fn chars_in(s: &str, lo: usize, hi: usize) -> bool {
    (lo..=hi).contains(&chars(s))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeRequest {
    pub v: u8,
    #[serde(rename = "hostPublicKeyB64")]
    pub host_public_key_b64: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    pub v: u8,
    #[serde(rename = "challengeId")]
    pub challenge_id: String,
    #[serde(rename = "proofB64")]
    pub proof_b64: String,
}

impl SessionRequest {
    pub fn valid(&self) -> bool {
        self.v == 1 && chars_in(&self.challenge_id, 1, 128) && chars_in(&self.proof_b64, 1, 128)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRequest {
    pub v: u8,
    #[serde(rename = "deviceId")]
    pub device_id: String,
    pub platform: String,
    pub token: String,
    #[serde(rename = "apnsEnvironment", default, deserialize_with = "some")]
    pub apns_environment: Option<Option<String>>,
}

pub use crate::model::push::Device;

impl DeviceRequest {
    /// docs/reference/http.md refinements; `None` → `400 invalid_request`.
    pub fn validate(self) -> Option<Device> {
        if self.v != 1 || !chars_in(&self.device_id, 1, 128) {
            return None;
        }
        let env = match self.platform.as_str() {
            "ios" => {
                let t = &self.token;
                let hex = !t.is_empty()
                    && t.len() % 2 == 0
                    && t.len() <= 4096
                    && t.bytes().all(|b| b.is_ascii_hexdigit());
                if !hex {
                    return None;
                }
                match self.apns_environment {
                    Some(Some(e)) if e == "sandbox" || e == "production" => Some(e),
                    _ => return None,
                }
            }
            "android" => {
                let t = &self.token;
                let ok = (32..=4096).contains(&t.len())
                    && t.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'.' | b'-')
                    });
                if !ok || self.apns_environment.is_some() {
                    return None;
                }
                None
            }
            _ => return None,
        };
        Some(Device {
            device_id: self.device_id,
            platform: self.platform,
            token: self.token,
            apns_environment: env,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    pub v: u8,
    #[serde(rename = "registrationIds")]
    pub registration_ids: Vec<String>,
    pub notification: NotificationIn,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotificationIn {
    #[serde(rename = "notificationId")]
    notification_id: Option<String>,
    #[serde(rename = "notificationSeq")]
    notification_seq: u64,
    #[serde(rename = "notificationEpoch")]
    notification_epoch: String,
    source: String,
    /// Required key, nullable value.
    #[serde(rename = "agentState", deserialize_with = "agent_state")]
    agent_state: Option<Option<String>>,
    title: String,
    body: String,
    #[serde(rename = "worktreeId")]
    worktree_id: Option<String>,
    #[serde(rename = "paneKey")]
    pane_key: Option<String>,
    sound: Option<bool>,
    kind: Option<String>,
    #[serde(rename = "expiresAt")]
    expires_at: Option<u64>,
}

/// A validated notification (docs/reference/http.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub notification_id: Option<String>,
    pub notification_seq: u64,
    pub notification_epoch: String,
    pub source: String,
    pub agent_state: Option<String>,
    pub title: String,
    pub body: String,
    pub worktree_id: Option<String>,
    pub pane_key: Option<String>,
    pub sound: Option<bool>,
    /// As given (`None` = absent).
    pub kind: Option<String>,
    pub expires_at: Option<u64>,
}

impl NotificationIn {
    pub fn validate(self) -> Option<Notification> {
        let opt_ok = |o: &Option<String>| o.as_ref().is_none_or(|s| chars_in(s, 1, 2048));
        if let Some(id) = &self.notification_id {
            if !chars_in(id, 1, 2048) || !id.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
                return None;
            }
        }
        let agent_state = self.agent_state?;
        let ok = self.notification_seq <= MAX_SAFE
            && chars_in(&self.notification_epoch, 1, 128)
            && matches!(
                self.source.as_str(),
                "agent-task-complete" | "terminal-bell" | "plugin"
            )
            && agent_state
                .as_deref()
                .is_none_or(|s| s == "needs-input" || s == "finished")
            && chars_in(&self.title, 1, 80)
            && chars(&self.body) <= 180
            && opt_ok(&self.worktree_id)
            && opt_ok(&self.pane_key)
            && self
                .kind
                .as_deref()
                .is_none_or(|k| k == "alert" || k == "dismiss")
            && self.expires_at.is_none_or(|e| (1..=MAX_SAFE).contains(&e));
        if !ok {
            return None;
        }
        let n = Notification {
            notification_id: self.notification_id,
            notification_seq: self.notification_seq,
            notification_epoch: self.notification_epoch,
            source: self.source,
            agent_state,
            title: self.title,
            body: self.body,
            worktree_id: self.worktree_id,
            pane_key: self.pane_key,
            sound: self.sound,
            kind: self.kind,
            expires_at: self.expires_at,
        };
        if n.effective_kind() == "dismiss" && n.notification_id.is_none() {
            return None;
        }
        if n.canonical_json().len() > CANONICAL_MAX_BYTES {
            return None;
        }
        Some(n)
    }
}

impl Notification {
    /// `K` = `kind` or `alert`.
    pub fn effective_kind(&self) -> &str {
        self.kind.as_deref().unwrap_or("alert")
    }

    /// Canonical members in canonical order; `with_sound_kind` false leaves out `sound` and `kind`.
    fn members(&self, with_sound_kind: bool) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(id) = &self.notification_id {
            m.insert("notificationId".into(), id.clone().into());
        }
        m.insert("notificationSeq".into(), self.notification_seq.into());
        m.insert(
            "notificationEpoch".into(),
            self.notification_epoch.clone().into(),
        );
        m.insert("source".into(), self.source.clone().into());
        m.insert(
            "agentState".into(),
            self.agent_state.clone().map_or(Value::Null, Value::from),
        );
        m.insert("title".into(), self.title.clone().into());
        m.insert("body".into(), self.body.clone().into());
        if let Some(w) = &self.worktree_id {
            m.insert("worktreeId".into(), w.clone().into());
        }
        if let Some(p) = &self.pane_key {
            m.insert("paneKey".into(), p.clone().into());
        }
        if with_sound_kind {
            if let Some(s) = self.sound {
                m.insert("sound".into(), s.into());
            }
            if let Some(k) = &self.kind {
                m.insert("kind".into(), k.clone().into());
            }
        }
        if let Some(e) = self.expires_at {
            m.insert("expiresAt".into(), e.into());
        }
        m
    }

    /// Compact canonical JSON of the present fields (serde_json's escaping is the spec's).
    pub fn canonical_json(&self) -> String {
        Value::Object(self.members(true)).to_string()
    }

    /// `event_id` = hex SHA-256 of `[fp, K, epoch, seq]`.
    pub fn event_id(&self, fp: &str) -> String {
        event_id(
            fp,
            self.effective_kind(),
            &self.notification_epoch,
            self.notification_seq,
        )
    }

    /// Content fingerprint: `{"kind":K, …canonical fields but sound and kind}`.
    pub fn content_fingerprint(&self) -> String {
        let mut m = Map::new();
        m.insert("kind".into(), self.effective_kind().into());
        m.extend(self.members(false));
        sha256_hex(Value::Object(m).to_string().as_bytes())
    }

    pub fn collapse_id(&self, fp: &str) -> String {
        collapse_id(
            fp,
            self.notification_id.as_deref(),
            &self.notification_epoch,
            self.notification_seq,
        )
    }

    /// Parses stored `payload_json` back (written by [`Notification::canonical_json`]).
    pub fn from_payload(json: &str) -> Option<Notification> {
        let n: NotificationIn = serde_json::from_str(json).ok()?;
        Some(Notification {
            notification_id: n.notification_id,
            notification_seq: n.notification_seq,
            notification_epoch: n.notification_epoch,
            source: n.source,
            agent_state: n.agent_state?,
            title: n.title,
            body: n.body,
            worktree_id: n.worktree_id,
            pane_key: n.pane_key,
            sound: n.sound,
            kind: n.kind,
            expires_at: n.expires_at,
        })
    }

    /// The `orca` object of both providers (docs/reference/http.md), in order.
    pub fn orca_object(&self, fp: &str) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(k) = &self.kind {
            m.insert("kind".into(), k.clone().into());
        }
        m.insert("hostFingerprint".into(), fp.into());
        if let Some(p) = &self.pane_key {
            m.insert("paneKey".into(), p.clone().into());
        }
        if let Some(w) = &self.worktree_id {
            m.insert("worktreeId".into(), w.clone().into());
        }
        if let Some(id) = &self.notification_id {
            m.insert("notificationId".into(), id.clone().into());
        }
        m.insert("notificationSeq".into(), self.notification_seq.into());
        m.insert(
            "notificationEpoch".into(),
            self.notification_epoch.clone().into(),
        );
        m.insert("source".into(), self.source.clone().into());
        m.insert(
            "agentState".into(),
            self.agent_state.clone().map_or(Value::Null, Value::from),
        );
        m
    }
}

pub fn event_id(fp: &str, kind: &str, epoch: &str, seq: u64) -> String {
    sha256_hex(
        serde_json::json!([fp, kind, epoch, seq])
            .to_string()
            .as_bytes(),
    )
}

pub fn collapse_id(fp: &str, id: Option<&str>, epoch: &str, seq: u64) -> String {
    let v = match id {
        Some(id) => serde_json::json!([fp, id]),
        None => serde_json::json!([fp, [epoch, seq]]),
    };
    sha256_hex(v.to_string().as_bytes())
}

/// Unique ids in first-occurrence order, or `None` when the list breaks.
pub fn unique_ids(ids: &[String]) -> Option<Vec<String>> {
    if ids.is_empty() || ids.len() > MAX_IDS_PER_SEND || !ids.iter().all(|i| chars_in(i, 1, 128)) {
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    for i in ids {
        if !out.contains(i) {
            out.push(i.clone());
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_vectors() {
        assert_eq!(
            event_id("qqj_9wO1CyKX9Pbh", "alert", "epoch-a", 7),
            "89b59552ac4ed981d3ceed12621049d5eab99f7f936cd1ad5496c3635631f783"
        );
        assert_eq!(
            collapse_id("qqj_9wO1CyKX9Pbh", Some("pane-7:done"), "x", 0),
            "6de50ef4f2eab1d2f5cd5d44b07b977f521c5f1578599e6d9f1aedf8cdcdf68d"
        );
        assert_eq!(
            collapse_id("qqj_9wO1CyKX9Pbh", None, "epoch-a", 7),
            "18d3360156993a062cf8446a4c6a2f620ac34fcf5eaf8149d123b5148272ac39"
        );
    }

    fn parse(v: serde_json::Value) -> Option<Notification> {
        crate::contract::strict::from_value::<NotificationIn>(v)
            .ok()
            .and_then(NotificationIn::validate)
    }

    fn base() -> serde_json::Value {
        serde_json::json!({"notificationSeq":1,"notificationEpoch":"e","source":"plugin",
            "agentState":null,"title":"t","body":""})
    }

    #[test]
    fn canonical_order_and_fingerprint() {
        let mut v = base();
        v["kind"] = "alert".into();
        v["sound"] = false.into();
        v["notificationId"] = "n\"1".into();
        v["expiresAt"] = 5.into();
        let n = parse(v).unwrap();
        assert_eq!(
            n.canonical_json(),
            r#"{"notificationId":"n\"1","notificationSeq":1,"notificationEpoch":"e","source":"plugin","agentState":null,"title":"t","body":"","sound":false,"kind":"alert","expiresAt":5}"#
        );
        let mut w = base();
        w["notificationId"] = "n\"1".into();
        w["expiresAt"] = 5.into();
        let m = parse(w).unwrap();
        assert_eq!(n.content_fingerprint(), m.content_fingerprint());
        assert_eq!(n.event_id("fp"), m.event_id("fp"));
        assert_eq!(Notification::from_payload(&n.canonical_json()).unwrap(), n);
    }

    #[test]
    fn refinements() {
        assert!(parse(base()).is_some());
        let mut v = base();
        v.as_object_mut().unwrap().remove("agentState");
        assert!(parse(v).is_none());
        let mut v = base();
        v["kind"] = "dismiss".into();
        assert!(parse(v).is_none());
        let mut v = base();
        v["title"] = "x".repeat(81).into();
        assert!(parse(v).is_none());
        let mut v = base();
        v["title"] = "é".repeat(80).into();
        assert!(parse(v).is_some());
        let mut v = base();
        v["notificationSeq"] = (-1).into();
        assert!(parse(v).is_none());
        let mut v = base();
        v["notificationSeq"] = (MAX_SAFE + 1).into();
        assert!(parse(v).is_none());
        let mut v = base();
        v["paneKey"] = "p".repeat(2048).into();
        v["worktreeId"] = "w".repeat(1000).into();
        assert!(parse(v).is_none(), "canonical JSON over 3000 bytes");
        assert!(unique_ids(&vec!["a".to_string(); 21]).is_none());
        assert_eq!(
            unique_ids(&["b".into(), "a".into(), "b".into()]).unwrap(),
            vec!["b", "a"]
        );
    }

    #[test]
    fn devices() {
        let d = |v: serde_json::Value| {
            crate::contract::strict::from_value::<DeviceRequest>(v)
                .ok()
                .and_then(DeviceRequest::validate)
        };
        assert!(d(serde_json::json!({"v":1,"deviceId":"d","platform":"ios","token":"ab","apnsEnvironment":"sandbox"})).is_some());
        assert!(
            d(serde_json::json!({"v":1,"deviceId":"d","platform":"ios","token":"ab"})).is_none()
        );
        assert!(d(serde_json::json!({"v":1,"deviceId":"d","platform":"ios","token":"abc","apnsEnvironment":"sandbox"})).is_none());
        let tok = "a".repeat(32);
        assert!(
            d(serde_json::json!({"v":1,"deviceId":"d","platform":"android","token":tok})).is_some()
        );
        assert!(d(serde_json::json!({"v":1,"deviceId":"d","platform":"android","token":tok,"apnsEnvironment":null})).is_none());
        assert!(d(
            serde_json::json!({"v":1,"deviceId":"d","platform":"android","token":"a".repeat(31)})
        )
        .is_none());
    }
}
