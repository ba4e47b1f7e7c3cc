//! docs/reference/http.md log format, checked line by line on a process's stderr: env_logger's header
//! `[<RFC 3339 ms>Z <LEVEL> <target>]`, then a plain line starting `[orca-relay] ` or
//! `[orca-push] `, or one JSON object with an `event` string.
#![allow(dead_code)]

/// Why `line` breaks the format, if it does.
pub fn violation(line: &str) -> Option<&'static str> {
    let Some(rest) = line.strip_prefix('[') else {
        return Some("no header");
    };
    let Some((header, body)) = rest.split_once("] ") else {
        return Some("unterminated header");
    };
    let mut parts = header.split_whitespace();
    let ts = parts.next().unwrap_or("");
    let ts_ok = ts.len() == 24
        && ts.ends_with('Z')
        && ts.as_bytes()[10] == b'T'
        && ts.as_bytes()[19] == b'.'
        && ts[..4].bytes().all(|b| b.is_ascii_digit());
    if !ts_ok {
        return Some("bad timestamp");
    }
    if !matches!(
        parts.next(),
        Some("ERROR" | "WARN" | "INFO" | "DEBUG" | "TRACE")
    ) {
        return Some("bad level");
    }
    if parts.next().is_none_or(str::is_empty) || parts.next().is_some() {
        return Some("bad target");
    }
    if body.starts_with("[orca-relay] ") || body.starts_with("[orca-push] ") {
        return None;
    }
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(m)) if m.get("event").is_some_and(|e| e.is_string()) => None,
        _ => Some("body is neither a prefixed plain line nor an event object"),
    }
}

/// Panics naming every line that breaks the format.
pub fn assert_lines(lines: &[String]) {
    assert!(!lines.is_empty(), "no log lines captured");
    let bad: Vec<String> = lines
        .iter()
        .filter_map(|l| violation(l).map(|why| format!("{why}: {l}")))
        .collect();
    assert!(
        bad.is_empty(),
        "lines breaking docs/reference/http.md:\n{}",
        bad.join("\n")
    );
}

/// The target of a well-formed line.
pub fn target(line: &str) -> Option<&str> {
    let header = line.strip_prefix('[')?.split_once("] ")?.0;
    header.split_whitespace().nth(2)
}
