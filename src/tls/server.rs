//! The listener side of TLS: PEM loading and checks, the certificate resolver (hot-swappable, with
//! the ACME challenge certificates beside it), the acceptor with its handshake deadline, and the
//! reloader that watches the certificate files.
//!
//! Refusals are quiet: a wrong SNI gets a TLS `access_denied` alert, a plain-HTTP request gets a
//! one-line `400` telling it to use https, a stalled handshake is closed after
//! [`HANDSHAKE_TIMEOUT`]. None of these logs above debug; each counts in
//! `orca_relay_tls_handshake_failures_total{reason}`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus::IntCounterVec;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{Source, TlsSettings};

/// A TLS handshake (and the first byte before it) must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
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
    challenges: RwLock<HashMap<String, Arc<CertifiedKey>>>,
}

impl Resolver {
    pub fn set(&self, ck: Arc<CertifiedKey>) {
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

/// The TLS front of a listener.
pub struct Tls {
    acceptor: TlsAcceptor,
    pub resolver: Arc<Resolver>,
    failures: IntCounterVec,
}

impl Tls {
    /// A server configuration with modern defaults (TLS 1.2 and 1.3, ring), ALPN `http/1.1`
    /// (and `acme-tls/1` when ACME runs) and session resumption tickets.
    pub fn new(
        resolver: Arc<Resolver>,
        acme: bool,
        failures: IntCounterVec,
    ) -> Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("tls: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        if acme {
            config.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
        }
        if let Ok(t) = rustls::crypto::ring::Ticketer::new() {
            config.ticketer = t;
        }
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            resolver,
            failures,
        })
    }

    fn refuse(&self, reason: &str) -> Option<TlsStream<TcpStream>> {
        self.failures.with_label_values(&[reason]).inc();
        None
    }

    /// Runs the handshake on an accepted connection. `None` = refused (already counted and
    /// closed); ACME validation connections end here too.
    pub async fn accept(&self, mut tcp: TcpStream) -> Option<TlsStream<TcpStream>> {
        let work = async {
            // A TLS connection opens with a handshake record (0x16); an ASCII letter is an
            // HTTP method: answer in HTTP so a person with curl sees why.
            let mut first = [0u8; 1];
            match tcp.peek(&mut first).await {
                Ok(0) | Err(_) => return Err("eof"),
                Ok(_) => {}
            }
            if first[0].is_ascii_alphabetic() {
                let body = "this port serves TLS: use https:// or wss://\n";
                let resp = format!(
                    "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(resp.as_bytes()).await;
                let _ = tcp.shutdown().await;
                return Err("plain_http");
            }
            self.acceptor.accept(tcp).await.map_err(|e| reason_of(&e))
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, work).await {
            Err(_) => self.refuse("timeout"),
            Ok(Err(reason)) => {
                log::debug!("[orca-relay] tls handshake refused: {reason}");
                self.refuse(reason)
            }
            Ok(Ok(mut tls)) => {
                if tls.get_ref().1.alpn_protocol() == Some(ACME_TLS_ALPN) {
                    // The validation happened in the handshake; nothing is served on it.
                    let _ = tls.shutdown().await;
                    return None;
                }
                Some(tls)
            }
        }
    }
}

/// A bounded label for a failed handshake.
fn reason_of(e: &std::io::Error) -> &'static str {
    match e.get_ref().and_then(|x| x.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidMessage(_)) => "protocol",
        Some(rustls::Error::General(_)) => "unknown_name",
        Some(rustls::Error::NoApplicationProtocol) => "alpn",
        Some(rustls::Error::AlertReceived(_)) => "peer_alert",
        Some(rustls::Error::PeerIncompatible(_)) => "incompatible",
        Some(_) => "protocol",
        None => "eof",
    }
}

/// The counter of refused handshakes, registered in the process registry.
pub fn failures_counter(registry: &prometheus::Registry) -> IntCounterVec {
    let c = IntCounterVec::new(
        prometheus::Opts::new(
            "orca_relay_tls_handshake_failures_total",
            "TLS connections refused before HTTP, by reason",
        ),
        &["reason"],
    )
    .expect("tls counter");
    // A second listener in the same process shares the series.
    let _ = registry.register(Box::new(c.clone()));
    c
}

/// Builds the main listener's TLS front and starts what keeps its certificate fresh: the file
/// reloader or the ACME loop. `hosts` are the origins' hosts the certificate must keep covering.
pub fn start(
    settings: &TlsSettings,
    extra_ca: &super::ExtraCa,
    hosts: Vec<String>,
    registry: &prometheus::Registry,
    shutdown: CancellationToken,
) -> Result<Arc<Tls>, String> {
    let resolver = Arc::new(Resolver::default());
    let acme = matches!(settings.source, Source::Acme(_));
    let tls = Arc::new(Tls::new(
        resolver.clone(),
        acme,
        failures_counter(registry),
    )?);
    match &settings.source {
        Source::Files {
            cert,
            key,
            initial,
            reload_every,
        } => {
            resolver.set(initial.clone());
            spawn_reloader(
                resolver,
                cert.clone(),
                key.clone(),
                *reload_every,
                hosts,
                shutdown,
            );
        }
        Source::Acme(a) => {
            super::acme::spawn(a.clone(), extra_ca.clone(), resolver, shutdown)?;
        }
    }
    Ok(tls)
}

fn digest(c: &[u8], k: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((c.len() as u64).to_be_bytes());
    h.update(c);
    h.update(k);
    h.finalize().into()
}

/// Checks a candidate pair the way start-up does.
fn validate(c: &[u8], k: &[u8], hosts: &[String]) -> Result<Arc<CertifiedKey>, String> {
    let ck = load_pair(c, k)?;
    if let Some(h) = hosts.iter().find(|h| !covers(&ck, h)) {
        return Err(format!("ORCA_RELAY_TLS_CERT does not cover {h}"));
    }
    Ok(ck)
}

/// Polls the files (content digest, so a same-second rewrite is seen) and re-reads at once on
/// SIGHUP. A bad pair is refused with one warning per distinct content; the old one keeps serving.
fn spawn_reloader(
    resolver: Arc<Resolver>,
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
    hosts: Vec<String>,
    shutdown: CancellationToken,
) {
    // Registered before returning: from here on SIGHUP means "reload", never the default "exit".
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    tokio::spawn(async move {
        let read = {
            let (cert, key) = (cert.clone(), key.clone());
            move || read_pair_files(&cert, &key)
        };
        let mut seen = match tokio::task::spawn_blocking(read.clone()).await {
            Ok(Ok((c, k))) => Some(digest(&c, &k)),
            _ => None,
        };
        loop {
            #[cfg(unix)]
            let hup_recv = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let hup_recv = std::future::pending::<()>();
            let forced = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => false,
                _ = hup_recv => true,
            };
            let (c, k) = match tokio::task::spawn_blocking(read.clone()).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(e)) => {
                    if forced {
                        log::warn!("[orca-relay] tls reload refused: {e}; keeping the previous certificate");
                    }
                    continue;
                }
                Err(_) => continue,
            };
            let d = digest(&c, &k);
            if seen == Some(d) && !forced {
                continue;
            }
            seen = Some(d);
            let hosts = hosts.clone();
            match tokio::task::spawn_blocking(move || validate(&c, &k, &hosts)).await {
                Ok(Ok(ck)) => {
                    let same = resolver
                        .current()
                        .is_some_and(|cur| cur.cert.first() == ck.cert.first());
                    resolver.set(ck);
                    if !same {
                        log::info!("[orca-relay] tls certificate reloaded");
                    }
                }
                Ok(Err(e)) => {
                    log::warn!(
                        "[orca-relay] tls reload refused: {e}; keeping the previous certificate"
                    );
                }
                Err(_) => {}
            }
        }
    });
}
