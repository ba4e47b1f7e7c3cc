//! The start-up lines about the URLs this process hands to clients: the public URL (assign
//! answers, host tokens, push) and the cell URL phones and hosts dial. A relay reachable from
//! other machines that advertises a plain `http://` URL is unusable by the Orca apps (they accept
//! `https` origins only, `http` for loopback development), so start-up says so in one warning
//! naming what to set.

use std::net::SocketAddr;

/// The info line, and the warning when one is due.
pub fn startup_lines(
    listen: SocketAddr,
    public_url: &str,
    cell_url: Option<&str>,
) -> (String, Option<String>) {
    let info = match cell_url {
        Some(c) => format!("[orca-relay] advertising public URL {public_url}, cell URL {c}"),
        None => format!("[orca-relay] advertising public URL {public_url}"),
    };
    if listen.ip().is_loopback() {
        return (info, None);
    }
    let mut plain: Vec<String> = Vec::new();
    if public_url.starts_with("http://") {
        plain.push(format!("ORCA_RELAY_PUBLIC_URL ({public_url})"));
    }
    if let Some(c) = cell_url.filter(|c| c.starts_with("http://")) {
        plain.push(format!("ORCA_RELAY_CELL_URL ({c})"));
    }
    if plain.is_empty() {
        return (info, None);
    }
    let warn = format!(
        "[orca-relay] listener {listen} is not loopback but advertising plain http: {}; the Orca \
         apps refuse http origins other than loopback. Set ORCA_RELAY_PUBLIC_URL and \
         ORCA_RELAY_CELL_URL to the https origin of the TLS proxy in front of this listener, or \
         turn on built-in TLS (ORCA_RELAY_TLS_CERT + ORCA_RELAY_TLS_KEY, or \
         ORCA_RELAY_TLS_ACME_DOMAINS)",
        plain.join(", ")
    );
    (info, Some(warn))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_development_gets_no_warning() {
        let (info, warn) = startup_lines(
            addr("127.0.0.1:8080"),
            "http://127.0.0.1:8080",
            Some("http://127.0.0.1:8080"),
        );
        assert_eq!(
            info,
            "[orca-relay] advertising public URL http://127.0.0.1:8080, cell URL http://127.0.0.1:8080"
        );
        assert_eq!(warn, None);
        assert_eq!(
            startup_lines(addr("[::1]:80"), "http://[::1]", None).1,
            None
        );
    }

    #[test]
    fn a_wildcard_listener_advertising_http_is_warned_about() {
        let (_, warn) = startup_lines(
            addr("0.0.0.0:8080"),
            "http://127.0.0.1:8080",
            Some("http://127.0.0.1:8080"),
        );
        let w = warn.expect("a warning");
        assert!(
            w.contains("ORCA_RELAY_PUBLIC_URL (http://127.0.0.1:8080), ORCA_RELAY_CELL_URL"),
            "{w}"
        );
        assert!(w.contains("ORCA_RELAY_TLS_ACME_DOMAINS"), "{w}");
        assert!(!w.contains('\n'));
    }

    #[test]
    fn only_the_plain_url_is_named() {
        let (info, warn) = startup_lines(
            addr("10.0.0.5:8080"),
            "https://relay.example.org",
            Some("http://10.0.0.5:8080"),
        );
        assert!(info.ends_with("cell URL http://10.0.0.5:8080"), "{info}");
        let w = warn.unwrap();
        assert!(
            w.contains("ORCA_RELAY_CELL_URL (http://10.0.0.5:8080)"),
            "{w}"
        );
        assert!(!w.contains("ORCA_RELAY_PUBLIC_URL (https"), "{w}");
    }

    #[test]
    fn https_everywhere_is_quiet() {
        let (info, warn) = startup_lines(addr("0.0.0.0:443"), "https://relay.example.org", None);
        assert_eq!(
            info,
            "[orca-relay] advertising public URL https://relay.example.org"
        );
        assert_eq!(warn, None);
    }
}
