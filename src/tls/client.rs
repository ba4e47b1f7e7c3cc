//! The one HTTPS client configuration for traffic between nodes (cell → director heartbeats,
//! director → cell dispatch) and for the ACME directory: the system roots (plus the bundled
//! Mozilla roots, for hosts without a CA store) and, when set, `ORCA_RELAY_TLS_EXTRA_CA` for
//! private CAs and tests. Plain `http://` loopback URLs keep working through the same client.

use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;

use super::ExtraCa;

/// The cluster reqwest client: call this instead of `reqwest::Client::builder()` for node-to-node
/// requests, so every such request trusts the same roots.
pub fn cluster_client(extra: &ExtraCa, timeout: Duration) -> Result<reqwest::Client, String> {
    cluster_client_builder(extra)
        .timeout(timeout)
        .build()
        .map_err(|e| format!("cluster http client: {e}"))
}

/// The builder behind [`cluster_client`], for callers that set more options.
pub fn cluster_client_builder(extra: &ExtraCa) -> reqwest::ClientBuilder {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(true)
        .redirect(reqwest::redirect::Policy::none());
    for der in &extra.certs {
        if let Ok(c) = reqwest::Certificate::from_der(der) {
            b = b.add_root_certificate(c);
        }
    }
    b
}

/// System roots + bundled roots + `extra`, for clients built on rustls directly.
pub fn root_store(extra: &ExtraCa) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let native = rustls_native_certs::load_native_certs();
    for c in native.certs {
        let _ = roots.add(c);
    }
    for c in &extra.certs {
        let _ = roots.add(c.clone());
    }
    roots
}

/// A rustls client configuration over [`root_store`] (ring provider, TLS 1.2+1.3).
pub fn client_config(extra: &ExtraCa, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(root_store(extra))
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(c)
}
