//! Log helpers that apply the redaction rules (README §6) by construction.
//!
//! A host appears only as [`digest`]; structured lines are one JSON object with an `event` key, built
//! by [`event`], so adding a log line cannot leak a token by accident as long as callers pass
//! counters, codes and digests (never raw ids, tokens or payloads).

use serde_json::{Map, Value};

/// The only form of a host in a log line: first 12 hex chars of SHA-256(relayHostId).
pub fn digest(relay_host_id: &str) -> String {
    crate::crypto::ident::host_digest(relay_host_id)
}

/// Logs `{"event":name, ...fields}` at info level.
pub fn event(name: &str, fields: Value) {
    log::info!("{}", event_line(name, fields));
}

/// Logs `{"event":name, ...fields}` at warn level.
pub fn event_warn(name: &str, fields: Value) {
    log::warn!("{}", event_line(name, fields));
}

/// The JSON text of an event line.
pub fn event_line(name: &str, fields: Value) -> String {
    let mut obj = Map::new();
    obj.insert("event".into(), Value::String(name.into()));
    if let Value::Object(m) = fields {
        obj.extend(m);
    }
    Value::Object(obj).to_string()
}

/// Initialises env_logger with `RUST_LOG` (default `info`), once.
pub fn init() {
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .try_init();
}

/// The store's observer (installed by the composition root): the store's own reports become the
/// retry event lines.
pub fn store_event(e: crate::store::StoreEvent<'_>) {
    use crate::store::StoreEvent;
    match e {
        StoreEvent::Retry {
            phase,
            code,
            attempt,
        } => event(
            "orca_relay_postgres_transaction_retry",
            serde_json::json!({"code": code, "attempt": attempt, "phase": phase}),
        ),
        StoreEvent::RetryExhausted {
            phase,
            code,
            attempts,
        } => event_warn(
            "orca_relay_postgres_transaction_retry_exhausted",
            serde_json::json!({"code": code, "attempts": attempts, "phase": phase}),
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_has_event_key_first() {
        let line = super::event_line("x", serde_json::json!({"a":1}));
        assert!(line.starts_with("{\"event\":\"x\""), "{line}");
    }
}
