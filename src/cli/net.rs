//! What went wrong when a command could not talk to a server, in words an operator can act on.
//!
//! reqwest's own message (`error sending request for url (…)`) hides the cause several sources
//! down its error chain; [`cause`] walks the chain and names the innermost reason: `connection
//! refused`, `timed out`, a DNS failure, a certificate the client does not trust, …

use std::error::Error as _;

use serde_json::Value;

/// The innermost cause of a failed request, short and lower-case (`connection refused`).
pub fn cause(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    let mut io_kind = None;
    let mut innermost = e.to_string();
    let mut dns = false;
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            io_kind = Some(io.kind());
        }
        let text = s.to_string();
        // hyper-util names a resolver failure `dns error` one level above the resolver's own.
        if text.starts_with("dns error") {
            dns = true;
        }
        innermost = text;
        source = s.source();
    }
    use std::io::ErrorKind as K;
    let phrase = match io_kind {
        Some(K::ConnectionRefused) => Some("connection refused"),
        Some(K::ConnectionReset) => Some("connection reset by the server"),
        Some(K::ConnectionAborted) => Some("connection aborted"),
        Some(K::TimedOut) => Some("timed out"),
        Some(K::UnexpectedEof) => Some("the server closed the connection"),
        Some(K::AddrNotAvailable) => Some("address not available"),
        _ => None,
    };
    match phrase {
        Some(p) => p.into(),
        None if dns => format!("cannot resolve the host name: {}", strip_os(&innermost)),
        None => strip_os(&innermost),
    }
}

/// `Network is unreachable (os error 101)` → `network is unreachable`.
fn strip_os(s: &str) -> String {
    let s = match s.find(" (os error ") {
        Some(i) => &s[..i],
        None => s,
    };
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

/// `cannot reach <origin>: <cause>`, the origin without path or query (what the operator typed).
pub fn unreachable(url: &str, e: &reqwest::Error) -> String {
    format!("cannot reach {}: {}", origin(url), cause(e))
}

/// The scheme and authority of `url` (`http://127.0.0.1:1/v1/x` → `http://127.0.0.1:1`).
pub fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    match url[after..].find(['/', '?', '#']) {
        Some(i) => &url[..after + i],
        None => url,
    }
}

/// A non-2xx answer in one line: the URL, the status, the body's `error` and what to check.
/// The relay's refusals carry only an error code (`{"error":"invalid_request"}`), so the
/// commands check each field themselves before sending ([`super::fields::check_admin`]) and name it there.
pub fn refusal(url: &str, status: reqwest::StatusCode, body: &Value) -> String {
    let path = &url[origin(url).len()..];
    let path = if path.is_empty() { "/" } else { path };
    let code = match body {
        Value::Object(o) => o
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| body.to_string()),
        Value::String(s) => s.trim().chars().take(200).collect(),
        other => other.to_string(),
    };
    let bearer = if path == "/v1/host-token" {
        "ORCA_RELAY_SELF_HOSTED_KEY"
    } else {
        "ORCA_RELAY_ADMIN_TOKEN"
    };
    let hint = match (status.as_u16(), code.as_str()) {
        (401, _) => format!(
            "; the server refused the bearer: check {bearer} (or the data directory's secrets.json)"
        ),
        (400, "invalid_request") => {
            "; the server refused the request body (a field out of its range or format)".into()
        }
        (404, "cell_not_found") => "; the director knows no such cell".into(),
        (404, "") | (404, "not_found") => {
            "; this server does not run the role that answers this route".into()
        }
        (503, "shutting_down") => "; the server is shutting down".into(),
        _ => String::new(),
    };
    let code = if code.is_empty() {
        String::new()
    } else {
        format!(": {code}")
    };
    format!("{url}: {status}{code}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_drops_the_path() {
        assert_eq!(
            origin("http://127.0.0.1:1/v1/admin/drain"),
            "http://127.0.0.1:1"
        );
        assert_eq!(origin("https://relay.example"), "https://relay.example");
        assert_eq!(origin("http://h:2?x=1"), "http://h:2");
    }

    #[test]
    fn os_error_suffix_is_dropped() {
        assert_eq!(
            strip_os("Network is unreachable (os error 101)"),
            "network is unreachable"
        );
        assert_eq!(strip_os(""), "");
    }

    #[tokio::test]
    async fn a_closed_port_is_connection_refused() {
        // Bind, learn the port, close: nothing listens there now.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}/ready");
        let e = reqwest::get(&url).await.unwrap_err();
        assert_eq!(
            unreachable(&url, &e),
            format!("cannot reach http://127.0.0.1:{port}: connection refused")
        );
    }

    #[test]
    fn refusals_name_the_route_the_code_and_what_to_check() {
        use reqwest::StatusCode as S;
        use serde_json::json;
        let u = "http://127.0.0.1:9/v1/admin/drain";
        assert_eq!(
            refusal(u, S::UNAUTHORIZED, &json!({"error": "invalid_token"})),
            "http://127.0.0.1:9/v1/admin/drain: 401 Unauthorized: invalid_token; the server refused the bearer: \
             check ORCA_RELAY_ADMIN_TOKEN (or the data directory's secrets.json)"
        );
        assert!(refusal(
            "http://h/v1/host-token",
            S::UNAUTHORIZED,
            &json!({"error": "invalid_token"})
        )
        .contains("check ORCA_RELAY_SELF_HOSTED_KEY"));
        assert_eq!(
            refusal(u, S::BAD_REQUEST, &json!({"error": "invalid_request"})),
            "http://127.0.0.1:9/v1/admin/drain: 400 Bad Request: invalid_request; the server refused the request \
             body (a field out of its range or format)"
        );
        assert_eq!(
            refusal(u, S::NOT_FOUND, &json!({"error": "cell_not_found"})),
            "http://127.0.0.1:9/v1/admin/drain: 404 Not Found: cell_not_found; the director knows no such cell"
        );
        assert_eq!(
            refusal(u, S::CONFLICT, &json!({"error": "cell_not_live"})),
            "http://127.0.0.1:9/v1/admin/drain: 409 Conflict: cell_not_live"
        );
        assert_eq!(
            refusal(
                u,
                S::BAD_GATEWAY,
                &serde_json::Value::String("upstream\n".into())
            ),
            "http://127.0.0.1:9/v1/admin/drain: 502 Bad Gateway: upstream"
        );
    }
}
