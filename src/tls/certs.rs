//! Certificates as the listener and the ACME client both see them: PEM loading and checks, the
//! name check, and the hot-swappable resolver with the ACME challenge certificates beside it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The ALPN protocol of TLS-ALPN-01 validation connections (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Every certificate in a PEM text.
pub fn pem_certs(bytes: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(bytes)
        .filter_map(Result::ok)
        .collect()
}

/// Reads both files; errors name the variable (never the content).
pub fn read_pair_files(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), String> {
    let c = std::fs::read(cert)
        .map_err(|e| format!("ORCA_RELAY_TLS_CERT: cannot read {}: {e}", cert.display()))?;
    let k = std::fs::read(key)
        .map_err(|e| format!("ORCA_RELAY_TLS_KEY: cannot read {}: {e}", key.display()))?;
    Ok((c, k))
}

/// Parses a certificate chain and its key and checks that they belong together.
pub fn load_pair(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let chain = pem_certs(cert_pem);
    if chain.is_empty() {
        return Err("ORCA_RELAY_TLS_CERT holds no PEM certificate".into());
    }
    if ParsedCertificate::try_from(&chain[0]).is_err() {
        return Err("ORCA_RELAY_TLS_CERT: the first certificate does not parse".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| "ORCA_RELAY_TLS_KEY holds no PEM private key".to_string())?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|_| "ORCA_RELAY_TLS_KEY is not a usable RSA, ECDSA or Ed25519 key".to_string())?;
    let ck = CertifiedKey::new(chain, signing);
    match ck.keys_match() {
        Ok(()) => Ok(Arc::new(ck)),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(Arc::new(ck)),
        Err(_) => Err("ORCA_RELAY_TLS_KEY does not match ORCA_RELAY_TLS_CERT".into()),
    }
}

/// Whether the end-entity certificate is valid for `host` (a DNS name or an IP literal).
pub fn covers(ck: &CertifiedKey, host: &str) -> bool {
    let Some(ee) = ck.cert.first() else {
        return false;
    };
    let Ok(parsed) = ParsedCertificate::try_from(ee) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(host.to_string()) else {
        return false;
    };
    rustls::client::verify_server_name(&parsed, &name).is_ok()
}

/// The certificate the listener serves, swapped whole on reload or renewal; ACME challenge
/// certificates are answered only to `acme-tls/1` handshakes.
#[derive(Debug, Default)]
pub struct Resolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// `orca_relay_tls_certificate_expiry_timestamp_seconds`: the served certificate's notAfter.
    pub(super) expiry: std::sync::OnceLock<prometheus::Gauge>,
    challenges: RwLock<HashMap<String, Arc<CertifiedKey>>>,
}

impl Resolver {
    pub fn set(&self, ck: Arc<CertifiedKey>) {
        if let (Some(g), Some(t)) = (self.expiry.get(), not_after(&ck)) {
            g.set(t as f64);
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(ck);
    }

    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_challenge(&self, domain: &str, ck: Option<Arc<CertifiedKey>>) {
        let mut map = self.challenges.write().unwrap_or_else(|e| e.into_inner());
        match ck {
            Some(ck) => map.insert(domain.to_ascii_lowercase(), ck),
            None => map.remove(&domain.to_ascii_lowercase()),
        };
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let acme = hello
            .alpn()
            .is_some_and(|mut protos| protos.any(|p| p == ACME_TLS_ALPN));
        if acme {
            let sni = hello.server_name()?.to_ascii_lowercase();
            return self
                .challenges
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&sni)
                .cloned();
        }
        let current = self.current()?;
        // No SNI (clients dialling an IP literal) gets the certificate; a name it does not
        // cover is refused rather than answered with a certificate the client will reject.
        match hello.server_name() {
            Some(sni) if !covers(&current, sni) => None,
            _ => Some(current),
        }
    }
}

/// The end-entity certificate's notAfter, in seconds since the epoch.
pub fn not_after(ck: &CertifiedKey) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(ck.cert.first()?.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}
