//! Generic first-frame parsing (docs/reference/websocket.md): a frame is one JSON object with a string `type`;
//! the rest is validated strictly by a schema that denies unknown fields plus a [`Check`] for what
//! serde cannot express. Parsing is split in two so callers can tell "not JSON" from "JSON without a
//! string type" from "schema failure". Also the phone leg's `relay-auth`, which both the cell
//! and the director's invite redirect read.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::contract::strict;
use crate::crypto::b64::is_b64u32;

/// Largest Generation / EpochMs value (2^53 − 1).
pub const MAX_SAFE: u64 = (1u64 << 53) - 1;

/// Outcome of splitting a text frame into its `type` and the rest.
pub enum Split {
    NotJson,
    /// JSON, but not an object with a string `type`.
    NoType,
    Typed(String, Map<String, Value>),
}

pub fn split(text: &str) -> Split {
    match strict::parse_value(text.as_bytes()) {
        Err(_) => Split::NotJson,
        Ok(Value::Object(mut m)) => match m.remove("type") {
            Some(Value::String(t)) => Split::Typed(t, m),
            _ => Split::NoType,
        },
        Ok(_) => Split::NoType,
    }
}

/// Decodes the object minus `type` into `T` with the strict decoder ([`crate::contract::strict`]),
/// then `check`s it.
pub fn body<T: DeserializeOwned + Check>(m: Map<String, Value>) -> Option<T> {
    let t: T = strict::from_map(m).ok()?;
    t.check().then_some(t)
}

/// Range and pattern checks serde cannot express.
pub trait Check {
    fn check(&self) -> bool;
}

/// Is the character count of `s` within `lo..=hi`?
pub fn chars_in(s: &str, lo: usize, hi: usize) -> bool {
    let n = s.chars().count();
    (lo..=hi).contains(&n)
}

/// `relay-auth`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayAuth {
    pub v: u64,
    pub mode: String,
    pub credential: String,
}

impl Check for RelayAuth {
    fn check(&self) -> bool {
        self.v == 1 && self.mode == "connect" && is_b64u32(&self.credential)
    }
}

/// The credential of a text frame that is a strict `relay-auth`.
pub fn relay_auth(text: &str) -> Option<RelayAuth> {
    match split(text) {
        Split::Typed(t, m) if t == "relay-auth" => body::<RelayAuth>(m),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_kinds() {
        assert!(matches!(split("nope"), Split::NotJson));
        assert!(matches!(split("[1]"), Split::NoType));
        assert!(matches!(split(r#"{"type":1}"#), Split::NoType));
        assert!(matches!(split(r#"{"type":"x"}"#), Split::Typed(t, _) if t == "x"));
    }

    #[test]
    fn relay_auth_is_strict() {
        let c = "BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU";
        let ok = format!(r#"{{"type":"relay-auth","v":1,"mode":"connect","credential":"{c}"}}"#);
        assert_eq!(relay_auth(&ok).map(|a| a.credential).as_deref(), Some(c));
        assert!(relay_auth(r#"{"type":"relay-auth"}"#).is_none());
        assert!(relay_auth("nope").is_none());
        let extra =
            format!(r#"{{"type":"relay-auth","v":1,"mode":"connect","credential":"{c}","x":1}}"#);
        assert!(relay_auth(&extra).is_none());
        let other = ok.replace("relay-auth", "relay-auths");
        assert!(relay_auth(&other).is_none());
    }
}
