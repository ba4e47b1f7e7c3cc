//! Scalar rules of docs/reference/websocket.md and docs/configuration.md, as plain predicates.

/// `OpaqueId`: 1..128 chars.
pub fn is_opaque_id(s: &str) -> bool {
    let n = s.chars().count();
    (1..=128).contains(&n)
}

/// A cell id: 1..128 chars of `[A-Za-z0-9_.-]`.
pub fn is_cell_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// `EpochMs` / `Generation`: 0..2^53−1.
pub fn is_safe_integer(v: i64) -> bool {
    (0..=(1i64 << 53) - 1).contains(&v)
}

/// A lowercase-able UUID in canonical hyphenated form.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36 && uuid::Uuid::parse_str(s).is_ok()
}

/// Canonical origin: `scheme://host[:port]`, no path, query, fragment, userinfo or trailing slash;
/// `https`, or `http` when the host is loopback (`localhost`, `127.0.0.1`, `[::1]`).
pub fn check_origin(s: &str) -> Result<(), &'static str> {
    let (scheme, rest) = s.split_once("://").ok_or("must be an origin")?;
    if scheme != "http" && scheme != "https" {
        return Err("must be an origin");
    }
    if rest.is_empty()
        || rest.contains('/')
        || rest.contains('?')
        || rest.contains('#')
        || rest.contains('@')
        || rest.contains(char::is_whitespace)
    {
        return Err("must be an origin");
    }
    let host = origin_host(rest).ok_or("must be an origin")?;
    if host.is_empty() {
        return Err("must be an origin");
    }
    if scheme == "http" && !is_loopback_host(host) {
        return Err("must use HTTPS outside loopback development");
    }
    Ok(())
}

fn origin_host(authority: &str) -> Option<&str> {
    if let Some(rest) = authority.strip_prefix('[') {
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        if !after.is_empty() {
            let port = after.strip_prefix(':')?;
            if port.is_empty() || port.parse::<u16>().is_err() {
                return None;
            }
        }
        return Some(&authority[..end + 2]);
    }
    match authority.split_once(':') {
        Some((h, port)) => {
            if port.is_empty() || port.parse::<u16>().is_err() {
                return None;
            }
            Some(h)
        }
        None => Some(authority),
    }
}

/// `localhost`, `127.0.0.1` or `[::1]`.
pub fn is_loopback_host(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert!(check_origin("https://relay.example.com").is_ok());
        assert!(check_origin("http://127.0.0.1:8080").is_ok());
        assert!(check_origin("http://[::1]:9").is_ok());
        assert!(check_origin("http://localhost").is_ok());
        assert_eq!(
            check_origin("http://push.example.com"),
            Err("must use HTTPS outside loopback development")
        );
        assert!(check_origin("https://x.test/").is_err());
        assert!(check_origin("https://x.test/a").is_err());
        assert!(check_origin("ftp://x.test").is_err());
        assert!(check_origin("https://x.test:").is_err());
        assert!(check_origin("http://10.0.0.5").is_err());
    }

    #[test]
    fn ids() {
        assert!(is_cell_id("local"));
        assert!(!is_cell_id(""));
        assert!(!is_cell_id("a/b"));
        assert!(is_opaque_id("x"));
        assert!(!is_opaque_id(&"x".repeat(129)));
    }
}
