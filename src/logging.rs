//! Log helpers that apply the redaction rules (docs/reference/http.md) by construction.
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
///
/// Every line keeps env_logger's header (`[time LEVEL target]`) and then follows docs/reference/http.md even
/// when it comes from a dependency: see [`line_body`]. Dependencies (tokio-postgres, deadpool,
/// hyper, rustls, …) are admitted at `info` and above only, whatever `RUST_LOG` says, because their
/// debug and trace output carries statement parameters, headers and payloads (see [`admitted`]).
pub fn init() {
    let inner = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(|buf, record| {
            use std::io::Write;
            let msg = record.args().to_string();
            writeln!(
                buf,
                "[{} {:<5} {}] {}",
                buf.timestamp_millis(),
                record.level(),
                record.target(),
                line_body(record.target(), &msg)
            )
        })
        .build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(Gate { inner })).is_ok() {
        log::set_max_level(max);
    }
}

/// env_logger behind the dependency level cap.
struct Gate {
    inner: env_logger::Logger,
}

impl log::Log for Gate {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        admitted(m.target(), m.level()) && self.inner.enabled(m)
    }

    fn log(&self, record: &log::Record<'_>) {
        if admitted(record.target(), record.level()) {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// True when `target` is this crate (its own lines are built by the helpers above).
fn own(target: &str) -> bool {
    target == "orca_relay" || target.starts_with("orca_relay::")
}

/// Dependencies log at `info` and above only: tokio-postgres logs every statement's parameters at
/// debug, h2/hyper headers at trace.
pub fn admitted(target: &str, level: log::Level) -> bool {
    own(target) || level <= log::Level::Info
}

/// Longest dependency message kept (the rest is cut at a character boundary).
const DEPENDENCY_MESSAGE_MAX: usize = 300;

/// The text after env_logger's header, in the docs/reference/http.md form: a plain line starting with
/// `[orca-relay]`/`[orca-push]` or one JSON object with an `event` key, on one line.
///
/// Our own conforming lines pass unchanged; our own other lines (debug details) get the prefix of
/// their area; a dependency's line becomes `[orca-relay] <target>: <message>`, cut to
/// [`DEPENDENCY_MESSAGE_MAX`] characters. Control characters (a multi-line error) are escaped so
/// one record is always one line.
pub fn line_body(target: &str, msg: &str) -> String {
    let conforming = msg.starts_with("[orca-relay] ")
        || msg.starts_with("[orca-push] ")
        || (msg.starts_with("{\"event\":") && msg.ends_with('}'));
    let mut out = String::with_capacity(msg.len() + 16);
    if own(target) {
        if !conforming {
            out.push_str(if target.starts_with("orca_relay::push") {
                "[orca-push] "
            } else {
                "[orca-relay] "
            });
        }
        push_escaped(&mut out, msg, usize::MAX);
    } else {
        out.push_str("[orca-relay] ");
        push_escaped(&mut out, target, 64);
        out.push_str(": ");
        push_escaped(&mut out, msg, DEPENDENCY_MESSAGE_MAX);
    }
    out
}

/// Appends up to `max` characters of `s`, control characters escaped.
fn push_escaped(out: &mut String, s: &str, max: usize) {
    for (i, c) in s.chars().enumerate() {
        if i == max {
            out.push('…');
            return;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
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
        StoreEvent::TimelineSettled(s) => event_warn(
            "orca_relay_postgres_timeline_settled",
            serde_json::json!({"fromTimeline": s.from, "toTimeline": s.to, "epochJump": s.jump,
                "hosts": s.hosts}),
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

    #[test]
    fn own_lines_pass_or_get_a_prefix() {
        use super::line_body;
        let ev = super::event_line("e", serde_json::json!({"a":"x\ny"}));
        assert_eq!(line_body("orca_relay::cell", &ev), ev);
        let plain = "[orca-relay] listening on http://127.0.0.1:1";
        assert_eq!(line_body("orca_relay::server", plain), plain);
        assert_eq!(
            line_body("orca_relay::director::sweeps", "sweep x: boom"),
            "[orca-relay] sweep x: boom"
        );
        assert_eq!(
            line_body("orca_relay::push::worker", "detail"),
            "[orca-push] detail"
        );
        assert_eq!(
            line_body("orca_relay", "two\nlines"),
            "[orca-relay] two\\nlines"
        );
    }

    #[test]
    fn dependency_lines_are_wrapped_on_one_line() {
        use super::line_body;
        assert_eq!(
            line_body("deadpool.postgres", "Connection error: connection closed"),
            "[orca-relay] deadpool.postgres: Connection error: connection closed"
        );
        assert_eq!(
            line_body(
                "tokio_postgres::connection",
                "NOTICE: relation \"x\" already exists, skipping"
            ),
            "[orca-relay] tokio_postgres::connection: NOTICE: relation \"x\" already exists, skipping"
        );
        // A dependency line that looks like ours is still wrapped (it is not ours).
        let fake = "{\"event\":\"orca_relay_process_started\"}";
        assert!(line_body("hyper::proto", fake).starts_with("[orca-relay] hyper::proto: {"));
        let long = "é\r\n".repeat(400);
        let body = line_body("rustls::conn", &long);
        assert!(!body.contains('\n') && !body.contains('\r'), "{body}");
        assert!(body.ends_with('…'));
        assert!(body.chars().count() < 300 * 3 + 40);
    }

    #[test]
    fn dependencies_capped_at_info() {
        use super::admitted;
        use log::Level;
        assert!(admitted("orca_relay::store", Level::Trace));
        assert!(admitted("tokio_postgres::connection", Level::Info));
        assert!(admitted("deadpool.postgres", Level::Warn));
        assert!(!admitted("tokio_postgres::query", Level::Debug));
        assert!(!admitted("h2::codec", Level::Trace));
        assert!(!admitted("orca_relayx", Level::Debug));
    }
}
