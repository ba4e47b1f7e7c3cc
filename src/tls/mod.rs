//! TLS built into the listener (docs/configuration.md "Deployment shapes").
//!
//! Three shapes share one accept path: plain HTTP on loopback (development, the default), built-in
//! TLS (manual PEM files that reload, or ACME certificates renewed in the background), and plain
//! HTTP behind a terminating proxy (`ORCA_RELAY_TRUSTED_PROXY_HOPS`). Everything after the
//! handshake — hyper, the WebSocket upgrade, the splice — is the same code for plain and TLS.
//!
//! Settings are validated once at start-up with the rest of the configuration (file reads happen
//! there, before the runtime starts); [`server`] builds the acceptor and the reloader, [`acme`]
//! obtains and renews certificates, [`client`] builds the one HTTPS client cluster traffic uses,
//! [`stream`] is an accepted connection (rustls' unbuffered API: nothing buffered while idle),
//! [`record`] the TLS 1.3 record layer it runs after the handshake (no rustls state while idle).

pub mod acme;
pub mod certs;
pub mod client;
pub mod record;
pub mod server;
pub mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;

use crate::flags::{err as cfg_err, int_in, opt_trimmed as opt, switch, ConfigError};

/// The deployment shapes, printed under `orca-relay serve --help`.
pub const SHAPES_HELP: &str = "\
Deployment shapes:
  1. Development: plain HTTP on loopback (the default, http://127.0.0.1:8080). Phones cannot use
     it: the Orca apps dial wss:// only and accept only https origins.
  2. Small install, built-in TLS: ORCA_RELAY_TLS_CERT + ORCA_RELAY_TLS_KEY (PEM files, reloaded
     when they change or on SIGHUP), or ORCA_RELAY_TLS_ACME_DOMAINS for automatic certificates
     (TLS-ALPN-01 on this listener, so listen on :443). Set ORCA_RELAY_PUBLIC_URL to
     https://<your host> (the ACME default is https://<first domain>).
  3. Cluster behind a load balancer or proxy that terminates TLS: plain HTTP here, the public
     https origins in ORCA_RELAY_PUBLIC_URL / ORCA_RELAY_CELL_URL, and
     ORCA_RELAY_TRUSTED_PROXY_HOPS set to the number of proxies appending X-Forwarded-For.
Origins: offers, resolve answers and relay-moved carry the canonical https origins configured
here; cluster calls over https trust the system roots plus ORCA_RELAY_TLS_EXTRA_CA.";

/// Let's Encrypt's production directory: the ACME default.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// The TLS flags of `orca-relay serve` (each with its environment variable).
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// PEM certificate chain for built-in TLS (with --tls-key). Reloaded when the file changes
    /// or on SIGHUP.
    #[arg(long, env = "ORCA_RELAY_TLS_CERT")]
    pub tls_cert: Option<String>,
    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "ORCA_RELAY_TLS_KEY")]
    pub tls_key: Option<String>,
    /// How often the certificate files are checked for changes, 100..3600000 ms.
    #[arg(
        long,
        env = "ORCA_RELAY_TLS_RELOAD_INTERVAL_MS",
        default_value = "5000"
    )]
    pub tls_reload_interval_ms: String,
    /// Serve the separate metrics listener over TLS too (`1`/`true`), with the same certificate.
    #[arg(long, env = "ORCA_RELAY_METRICS_TLS", default_value = "0")]
    pub metrics_tls: String,
    /// Extra PEM CA file trusted (besides the system roots) for cluster traffic and ACME.
    #[arg(long, env = "ORCA_RELAY_TLS_EXTRA_CA")]
    pub tls_extra_ca: Option<String>,
    /// Comma list of domains to obtain a certificate for over ACME (TLS-ALPN-01 on the listener).
    #[arg(long, env = "ORCA_RELAY_TLS_ACME_DOMAINS")]
    pub tls_acme_domains: Option<String>,
    /// Contact e-mail given to the ACME CA.
    #[arg(long, env = "ORCA_RELAY_TLS_ACME_EMAIL")]
    pub tls_acme_email: Option<String>,
    /// ACME directory URL [default: Let's Encrypt production].
    #[arg(long, env = "ORCA_RELAY_TLS_ACME_DIRECTORY")]
    pub tls_acme_directory: Option<String>,
    /// Where the ACME account and certificates are kept [default: <data dir>/acme].
    #[arg(long, env = "ORCA_RELAY_TLS_ACME_CACHE_DIR")]
    pub tls_acme_cache_dir: Option<String>,
    /// Renew when the certificate expires within this many days, 1..3650. SIGHUP renews at once.
    #[arg(
        long,
        env = "ORCA_RELAY_TLS_ACME_RENEW_BEFORE_DAYS",
        default_value = "30"
    )]
    pub tls_acme_renew_before_days: String,
}

/// Where the served certificate comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Operator-managed PEM files, watched for changes.
    Files {
        cert: PathBuf,
        key: PathBuf,
        initial: Arc<CertifiedKey>,
        reload_every: Duration,
    },
    /// ACME: obtained and renewed by the process.
    Acme(acme::AcmeSettings),
}

/// Validated TLS settings of the main listener.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    pub source: Source,
    pub metrics_tls: bool,
}

/// Extra trust anchors for outgoing HTTPS (cluster traffic, ACME directory).
#[derive(Clone, Debug, Default)]
pub struct ExtraCa {
    pub path: Option<PathBuf>,
    pub certs: Vec<CertificateDer<'static>>,
}

/// Reads `ORCA_RELAY_TLS_EXTRA_CA` (at least one PEM certificate).
pub fn parse_extra_ca(a: &TlsArgs) -> Result<ExtraCa, ConfigError> {
    let Some(path) = opt(&a.tls_extra_ca) else {
        return Ok(ExtraCa::default());
    };
    let bytes = std::fs::read(&path)
        .or_else(|e| cfg_err(format!("ORCA_RELAY_TLS_EXTRA_CA: cannot read {path}: {e}")))?;
    let certs = server::pem_certs(&bytes);
    if certs.is_empty() {
        return cfg_err(format!(
            "ORCA_RELAY_TLS_EXTRA_CA: no PEM certificate in {path}"
        ));
    }
    Ok(ExtraCa {
        path: Some(PathBuf::from(path)),
        certs,
    })
}

/// Validates the listener's TLS settings; `None` = plain HTTP. Reads the certificate files.
pub fn parse_settings(a: &TlsArgs, data_dir: &Path) -> Result<Option<TlsSettings>, ConfigError> {
    parse_settings_in(a, data_dir, true)
}

/// [`parse_settings`]; with `create_dirs` false the ACME cache directory is not created
/// (`orca-relay config check`).
pub fn parse_settings_in(
    a: &TlsArgs,
    data_dir: &Path,
    create_dirs: bool,
) -> Result<Option<TlsSettings>, ConfigError> {
    let metrics_tls = switch("ORCA_RELAY_METRICS_TLS", &a.metrics_tls)?;
    let cert = opt(&a.tls_cert);
    let key = opt(&a.tls_key);
    let domains = opt(&a.tls_acme_domains);
    let source = match (cert, key, domains) {
        (None, None, None) => {
            if metrics_tls {
                return cfg_err(
                    "ORCA_RELAY_METRICS_TLS requires ORCA_RELAY_TLS_CERT or ORCA_RELAY_TLS_ACME_DOMAINS",
                );
            }
            return Ok(None);
        }
        (Some(_), Some(_), Some(_)) | (Some(_), None, Some(_)) | (None, Some(_), Some(_)) => {
            return cfg_err(
                "ORCA_RELAY_TLS_ACME_DOMAINS and ORCA_RELAY_TLS_CERT/ORCA_RELAY_TLS_KEY are mutually exclusive",
            )
        }
        (Some(_), None, None) => {
            return cfg_err("ORCA_RELAY_TLS_KEY is required with ORCA_RELAY_TLS_CERT")
        }
        (None, Some(_), None) => {
            return cfg_err("ORCA_RELAY_TLS_CERT is required with ORCA_RELAY_TLS_KEY")
        }
        (Some(cert), Some(key), None) => {
            let reload_ms = int_in(
                "ORCA_RELAY_TLS_RELOAD_INTERVAL_MS",
                &a.tls_reload_interval_ms,
                100,
                3_600_000,
            )? as u64;
            let (cert, key) = (PathBuf::from(cert), PathBuf::from(key));
            let (c, k) = server::read_pair_files(&cert, &key).map_err(ConfigError)?;
            let initial = server::load_pair(&c, &k).map_err(ConfigError)?;
            Source::Files {
                cert,
                key,
                initial,
                reload_every: Duration::from_millis(reload_ms),
            }
        }
        (None, None, Some(domains)) => Source::Acme(acme::parse(a, &domains, data_dir, create_dirs)?),
    };
    Ok(Some(TlsSettings {
        source,
        metrics_tls,
    }))
}

impl TlsSettings {
    /// The host a default public URL names: the first ACME domain, else loopback.
    pub fn default_host(&self) -> String {
        match &self.source {
            Source::Acme(a) => a.domains[0].clone(),
            Source::Files { .. } => "127.0.0.1".to_string(),
        }
    }

    /// Stops start-up when the certificate cannot serve the origin `url` (named by `var`).
    pub fn check_origin(&self, var: &str, url: &str) -> Result<(), ConfigError> {
        let Some(host) = origin_host(url) else {
            return Ok(());
        };
        match &self.source {
            Source::Files { initial, .. } => {
                if !server::covers(initial, &host) {
                    return cfg_err(format!(
                        "ORCA_RELAY_TLS_CERT does not cover the host of {var} ({host})"
                    ));
                }
            }
            Source::Acme(a) => {
                if !a.domains.iter().any(|d| d.eq_ignore_ascii_case(&host)) {
                    return cfg_err(format!(
                        "ORCA_RELAY_TLS_ACME_DOMAINS must include the host of {var} ({host})"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The host of an `https://host[:port]` origin (brackets of an IPv6 literal removed).
pub fn origin_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().map(str::to_string);
    }
    Some(
        authority
            .rsplit_once(':')
            .map_or(authority, |(h, _)| h)
            .to_string(),
    )
}

/// Installs ring as the process's rustls provider (idempotent); every config here also names
/// it explicitly, this only covers libraries that ask for the process default.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> TlsArgs {
        crate::config::ServeArgs::parse_flags(Vec::<String>::new())
            .expect("defaults parse")
            .tls
    }

    #[test]
    fn origin_hosts() {
        assert_eq!(
            origin_host("https://relay.example").as_deref(),
            Some("relay.example")
        );
        assert_eq!(
            origin_host("https://relay.example:8443").as_deref(),
            Some("relay.example")
        );
        assert_eq!(
            origin_host("https://127.0.0.1:8080").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(origin_host("https://[::1]:8080").as_deref(), Some("::1"));
        assert_eq!(origin_host("relay.example"), None);
    }

    #[test]
    fn plain_by_default_and_pairs_required_together() {
        let dir = std::env::temp_dir();
        assert!(parse_settings(&args(), &dir).unwrap().is_none());
        let mut a = args();
        a.metrics_tls = "1".into();
        assert_eq!(
            parse_settings(&a, &dir).unwrap_err().0,
            "ORCA_RELAY_METRICS_TLS requires ORCA_RELAY_TLS_CERT or ORCA_RELAY_TLS_ACME_DOMAINS"
        );
        a.metrics_tls = "yes".into();
        assert_eq!(
            parse_settings(&a, &dir).unwrap_err().0,
            "ORCA_RELAY_METRICS_TLS must be 0, 1, true or false"
        );
        let mut a = args();
        a.tls_cert = Some("/nonexistent/cert.pem".into());
        a.tls_key = Some("/nonexistent/key.pem".into());
        a.tls_reload_interval_ms = "10".into();
        assert_eq!(
            parse_settings(&a, &dir).unwrap_err().0,
            "ORCA_RELAY_TLS_RELOAD_INTERVAL_MS must be an integer in 100..3600000"
        );
        a.tls_reload_interval_ms = "5000".into();
        let e = parse_settings(&a, &dir).unwrap_err().0;
        assert!(
            e.starts_with("ORCA_RELAY_TLS_CERT: cannot read /nonexistent/cert.pem"),
            "{e}"
        );
    }

    #[test]
    fn acme_settings_rules() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = args();
        a.tls_acme_domains = Some("relay.example, Relay.Example ,b.example".into());
        let s = parse_settings(&a, dir.path()).unwrap().unwrap();
        let Source::Acme(acme) = &s.source else {
            panic!("acme source")
        };
        assert_eq!(acme.domains, vec!["relay.example", "b.example"]);
        assert_eq!(acme.directory, LETS_ENCRYPT);
        assert_eq!(acme.cache_dir, dir.path().join("acme"));
        assert_eq!(acme.renew_before, Duration::from_secs(30 * 86_400));
        assert_eq!(s.default_host(), "relay.example");
        assert!(s
            .check_origin("ORCA_RELAY_PUBLIC_URL", "https://relay.example")
            .is_ok());
        assert_eq!(
            s.check_origin("ORCA_RELAY_PUBLIC_URL", "https://other.example").unwrap_err().0,
            "ORCA_RELAY_TLS_ACME_DOMAINS must include the host of ORCA_RELAY_PUBLIC_URL (other.example)"
        );
        for bad in ["127.0.0.1", "bad domain", ",", "a..b"] {
            a.tls_acme_domains = Some(bad.into());
            assert_eq!(
                parse_settings(&a, dir.path()).unwrap_err().0,
                "ORCA_RELAY_TLS_ACME_DOMAINS must be a comma list of DNS names",
                "{bad}"
            );
        }
        a.tls_acme_domains = Some("relay.example".into());
        a.tls_acme_directory = Some("http://acme.example/dir".into());
        assert_eq!(
            parse_settings(&a, dir.path()).unwrap_err().0,
            "ORCA_RELAY_TLS_ACME_DIRECTORY must be an https URL"
        );
        a.tls_acme_directory = None;
        a.tls_acme_email = Some("not an address".into());
        assert_eq!(
            parse_settings(&a, dir.path()).unwrap_err().0,
            "ORCA_RELAY_TLS_ACME_EMAIL must be an e-mail address"
        );
        a.tls_acme_email = None;
        a.tls_acme_renew_before_days = "0".into();
        assert_eq!(
            parse_settings(&a, dir.path()).unwrap_err().0,
            "ORCA_RELAY_TLS_ACME_RENEW_BEFORE_DAYS must be an integer in 1..3650"
        );
    }
}
