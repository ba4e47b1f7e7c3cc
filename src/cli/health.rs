//! `orca-relay health`: one `GET /ready` against a server, for container health checks and
//! scripts. Exit 0 only on `200`; one line on stdout either way:
//!
//! - `ready` (or `ready (degraded: sql)` while the database blips within its grace period);
//! - `not ready: 503 dependency_unavailable` (the status and the body's `error`);
//! - `unreachable: connection refused (http://127.0.0.1:8080)`.
//!
//! Without `--url` (or `ORCA_RELAY_URL`) the target is this machine's own listener, from the same
//! variables `serve` reads: `ORCA_RELAY_LISTEN` (a wildcard address becomes loopback) and, when
//! built-in TLS is on, `https://` with the certificate's name (`ORCA_RELAY_PUBLIC_URL`'s host, or
//! the first of `ORCA_RELAY_TLS_ACME_DOMAINS`) connected to that listener, so the certificate is
//! verified as a phone would verify it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use clap::Args;

/// Flags of `orca-relay health`.
#[derive(Args, Debug, Clone)]
pub struct HealthArgs {
    /// Server origin to probe [env: ORCA_RELAY_URL] [default: this machine's listener, from
    /// ORCA_RELAY_LISTEN and the TLS settings].
    #[arg(long = "url", id = "health_url", value_name = "URL")]
    pub url: Option<String>,
    /// Seconds the whole probe may take, 1..300.
    #[arg(long, default_value = "5", value_parser = clap::value_parser!(u64).range(1..=300))]
    pub timeout: u64,
}

/// The `--help` footer: the variables the default target is built from.
pub const HEALTH_ENV_HELP: &str = "Environment (when --url is not given):\n  ORCA_RELAY_URL              server origin [default: derived from the variables below]\n  ORCA_RELAY_LISTEN           the listener to probe; 0.0.0.0 / [::] mean loopback [default: 127.0.0.1:8080]\n  ORCA_RELAY_TLS_CERT         built-in TLS is on: probe https:// with the certificate's name\n  ORCA_RELAY_TLS_ACME_DOMAINS built-in TLS with ACME: the first domain is the certificate's name\n  ORCA_RELAY_PUBLIC_URL       its host is the certificate's name (preferred over the ACME domain)\nExit status: 0 when GET /ready answers 200, 1 otherwise, 2 for a bad --url or listen address.";

/// Where the probe goes: a URL and, for a TLS listener probed by name, the address that name
/// is pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub url: String,
    pub pin: Option<(String, SocketAddr)>,
}

/// The settings the default target is derived from (the process environment in `main`).
#[derive(Debug, Clone, Default)]
pub struct Local {
    pub listen: Option<String>,
    pub tls_cert: Option<String>,
    pub acme_domains: Option<String>,
    pub public_url: Option<String>,
}

impl Local {
    pub fn from_env() -> Local {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Local {
            listen: var("ORCA_RELAY_LISTEN"),
            tls_cert: var("ORCA_RELAY_TLS_CERT"),
            acme_domains: var("ORCA_RELAY_TLS_ACME_DOMAINS"),
            public_url: var("ORCA_RELAY_PUBLIC_URL"),
        }
    }
}

/// The probe for an explicit origin (`--url`): `<origin>/ready`.
pub fn explicit(url: &str) -> Result<Probe, String> {
    let base = url.trim().trim_end_matches('/');
    let rest = base
        .strip_prefix("http://")
        .or_else(|| base.strip_prefix("https://"))
        .ok_or_else(|| format!("--url must be an http:// or https:// origin, got {base:?}"))?;
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ']) {
        return Err(format!(
            "--url must be an origin (scheme://host[:port]) without a path, got {base:?}"
        ));
    }
    Ok(Probe {
        url: format!("{base}/ready"),
        pin: None,
    })
}

/// The probe of this machine's own listener (see the module documentation).
pub fn local(l: &Local) -> Result<Probe, String> {
    let listen = l.listen.as_deref().unwrap_or("127.0.0.1:8080").trim();
    let addr: SocketAddr = listen
        .parse()
        .map_err(|_| format!("ORCA_RELAY_LISTEN must be a socket address, got {listen:?}"))?;
    let ip = match addr.ip() {
        IpAddr::V4(v) if v.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v) if v.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let target = SocketAddr::new(ip, addr.port());
    if l.tls_cert.is_none() && l.acme_domains.is_none() {
        return Ok(Probe {
            url: format!("http://{target}/ready"),
            pin: None,
        });
    }
    let from_public = l
        .public_url
        .as_deref()
        .and_then(|u| u.trim().strip_prefix("https://"))
        .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or(""))
        .and_then(|authority| {
            let host = if authority.starts_with('[') {
                authority.split_inclusive(']').next().unwrap_or("")
            } else {
                authority.split(':').next().unwrap_or("")
            };
            (!host.is_empty()).then(|| host.to_string())
        });
    let from_acme = l
        .acme_domains
        .as_deref()
        .and_then(|d| d.split(',').map(str::trim).find(|d| !d.is_empty()))
        .map(str::to_string);
    let Some(name) = from_public.or(from_acme) else {
        return Err(
            "built-in TLS is on (ORCA_RELAY_TLS_CERT) but no certificate name is known: \
                    set ORCA_RELAY_PUBLIC_URL=https://<name> or pass --url"
                .into(),
        );
    };
    if name.starts_with('[') {
        // An IP literal: nothing to pin, connect to the listener by address.
        return Ok(Probe {
            url: format!("https://{target}/ready"),
            pin: None,
        });
    }
    Ok(Probe {
        url: format!("https://{name}:{}/ready", addr.port()),
        pin: Some((name, target)),
    })
}

/// The verdict: `(ready, the one line to print)`.
pub async fn probe(p: &Probe, timeout: Duration) -> (bool, String) {
    let extra = match crate::tls::parse_extra_ca(&crate::tls::TlsArgs {
        tls_extra_ca: std::env::var("ORCA_RELAY_TLS_EXTRA_CA").ok(),
        ..Default::default()
    }) {
        Ok(e) => e,
        Err(e) => return (false, format!("unreachable: {e}")),
    };
    let mut b = crate::tls::client::cluster_client_builder(&extra)
        .no_proxy()
        .timeout(timeout);
    if let Some((name, addr)) = &p.pin {
        b = b.resolve(name, *addr);
    }
    let client = match b.build() {
        Ok(c) => c,
        Err(e) => return (false, format!("unreachable: http client: {e}")),
    };
    let origin = super::net::origin(&p.url).to_string();
    let resp = match client.get(&p.url).send().await {
        Ok(r) => r,
        Err(e) => {
            return (
                false,
                format!("unreachable: {} ({origin})", super::net::cause(&e)),
            )
        }
    };
    let status = resp.status();
    // /ready answers a few bytes; a long body is not ours.
    let body = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => {
            return (
                false,
                format!("unreachable: {} ({origin})", super::net::cause(&e)),
            )
        }
    };
    verdict(status.as_u16(), &body)
}

/// The line for a `/ready` answer (`status`, `body`).
pub fn verdict(status: u16, body: &[u8]) -> (bool, String) {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    if status == 200 {
        let degraded = json
            .as_ref()
            .is_some_and(|j| j.get("degraded") == Some(&serde_json::Value::Bool(true)));
        if degraded {
            let deps: Vec<String> = json
                .as_ref()
                .and_then(|j| j.get("dependency"))
                .and_then(|d| d.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_str().map(printable)).collect())
                .unwrap_or_default();
            return (true, format!("ready (degraded: {})", deps.join(", ")));
        }
        return (true, "ready".into());
    }
    let cause = match json
        .as_ref()
        .and_then(|j| j.get("error"))
        .and_then(|e| e.as_str())
    {
        Some(e) => printable(e),
        None => printable(&String::from_utf8_lossy(body)),
    };
    if cause.is_empty() {
        (false, format!("not ready: {status}"))
    } else {
        (false, format!("not ready: {status} {cause}"))
    }
}

/// At most 120 characters, control characters replaced: a body is not trusted to be one line.
fn printable(s: &str) -> String {
    s.trim()
        .chars()
        .take(120)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_with(listen: &str) -> Local {
        Local {
            listen: Some(listen.into()),
            ..Local::default()
        }
    }

    #[test]
    fn the_default_is_the_default_listener() {
        let p = local(&Local::default()).unwrap();
        assert_eq!(p.url, "http://127.0.0.1:8080/ready");
        assert_eq!(p.pin, None);
    }

    #[test]
    fn wildcard_listeners_are_probed_on_loopback() {
        assert_eq!(
            local(&local_with("0.0.0.0:9000")).unwrap().url,
            "http://127.0.0.1:9000/ready"
        );
        assert_eq!(
            local(&local_with("[::]:9000")).unwrap().url,
            "http://[::1]:9000/ready"
        );
        assert_eq!(
            local(&local_with("10.1.2.3:80")).unwrap().url,
            "http://10.1.2.3:80/ready"
        );
    }

    #[test]
    fn a_bad_listen_address_is_named() {
        let e = local(&local_with("8080")).unwrap_err();
        assert!(
            e.starts_with("ORCA_RELAY_LISTEN must be a socket address"),
            "{e}"
        );
    }

    #[test]
    fn tls_probes_the_certificate_name_pinned_to_the_listener() {
        let l = Local {
            listen: Some("0.0.0.0:443".into()),
            acme_domains: Some(" relay.example.org , b.example.org".into()),
            ..Local::default()
        };
        let p = local(&l).unwrap();
        assert_eq!(p.url, "https://relay.example.org:443/ready");
        assert_eq!(
            p.pin,
            Some(("relay.example.org".into(), "127.0.0.1:443".parse().unwrap()))
        );
        let l = Local {
            public_url: Some("https://pub.example.org:8443".into()),
            ..l
        };
        let p = local(&l).unwrap();
        assert_eq!(p.url, "https://pub.example.org:443/ready");
        assert_eq!(p.pin.unwrap().0, "pub.example.org");
    }

    #[test]
    fn tls_without_a_name_asks_for_one() {
        let l = Local {
            tls_cert: Some("/etc/cert.pem".into()),
            public_url: Some("http://plain.example".into()),
            ..Local::default()
        };
        let e = local(&l).unwrap_err();
        assert!(e.contains("ORCA_RELAY_PUBLIC_URL"), "{e}");
    }

    #[test]
    fn explicit_urls_are_origins() {
        assert_eq!(
            explicit("http://127.0.0.1:1/").unwrap().url,
            "http://127.0.0.1:1/ready"
        );
        for bad in [
            "127.0.0.1:8080",
            "ftp://x",
            "http://",
            "http://h/ready",
            "http://h x",
        ] {
            let e = explicit(bad).unwrap_err();
            assert!(e.starts_with("--url must be"), "{bad}: {e}");
        }
    }

    #[test]
    fn verdict_lines() {
        assert_eq!(verdict(200, br#"{"ok":true}"#), (true, "ready".into()));
        assert_eq!(
            verdict(200, br#"{"ok":true,"degraded":true,"dependency":["sql"]}"#),
            (true, "ready (degraded: sql)".into())
        );
        assert_eq!(
            verdict(503, br#"{"error":"dependency_unavailable"}"#),
            (false, "not ready: 503 dependency_unavailable".into())
        );
        assert_eq!(
            verdict(502, b"bad\ngateway"),
            (false, "not ready: 502 bad gateway".into())
        );
        assert_eq!(verdict(404, b""), (false, "not ready: 404".into()));
    }
}
