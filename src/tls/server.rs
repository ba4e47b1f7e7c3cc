//! The listener side of TLS: the acceptor with its handshake deadline and the reloader that
//! watches the certificate files (the certificates and the resolver are `certs`).
//!
//! Refusals are quiet: a wrong SNI gets a TLS `access_denied` alert, a plain-HTTP request gets a
//! one-line `400` telling it to use https, a stalled handshake is closed after
//! [`HANDSHAKE_TIMEOUT`]. None of these logs above debug; each counts in
//! `orca_relay_tls_handshake_failures_total{reason}`.
//!
//! At most [`TLS_HANDSHAKES_MAX`] handshakes run at once (the accept limiter): a connection past
//! it waits for a slot before any TLS state is allocated for it, at most
//! [`TLS_HANDSHAKE_WAIT_MS`]; then it is closed and counted (`reason="busy"`). The waiting
//! connections are bounded by the listener's connection cap, so a storm of handshakes costs a
//! bounded amount of memory and at most this many handshakes' CPU at a time.
//!
//! [`TLS_HANDSHAKES_MAX`]: crate::contract::limits::TLS_HANDSHAKES_MAX
//! [`TLS_HANDSHAKE_WAIT_MS`]: crate::contract::limits::TLS_HANDSHAKE_WAIT_MS

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use super::certs::{
    covers, load_pair, not_after, pem_certs, read_pair_files, Resolver, ACME_TLS_ALPN,
};
use super::stream::TlsIo;
use super::{Source, TlsSettings};

/// A TLS handshake (and the first byte before it) must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS front of a listener.
pub struct Tls {
    config: Arc<rustls::ServerConfig>,
    pub resolver: Arc<Resolver>,
    failures: IntCounterVec,
    /// Handshake slots (the accept limiter) and how long a connection waits for one.
    handshakes: Arc<Semaphore>,
    handshake_max: usize,
    handshake_wait: Duration,
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
        // TLS 1.3 connections run on our own record layer after the handshake (tls::record).
        super::record::enable(&mut config);
        Ok(Tls {
            config: Arc::new(config),
            resolver,
            failures,
            handshakes: Arc::new(Semaphore::new(crate::contract::limits::TLS_HANDSHAKES_MAX)),
            handshake_max: crate::contract::limits::TLS_HANDSHAKES_MAX,
            handshake_wait: Duration::from_millis(crate::contract::limits::TLS_HANDSHAKE_WAIT_MS),
        })
    }

    /// Replaces the accept limiter's bound and wait (tests of the limiter itself).
    pub fn with_handshake_limit(mut self, max: usize, wait: Duration) -> Tls {
        self.handshakes = Arc::new(Semaphore::new(max));
        self.handshake_max = max;
        self.handshake_wait = wait;
        self
    }

    /// Handshakes holding a slot of the accept limiter now.
    pub fn handshakes_in_flight(&self) -> usize {
        self.handshake_max - self.handshakes.available_permits()
    }

    fn refuse(&self, reason: &str) -> Option<TlsIo> {
        debug_assert!(FAILURE_REASONS.contains(&reason), "{reason}");
        self.failures.with_label_values(&[reason]).inc();
        None
    }

    /// Runs the handshake on an accepted connection. `None` = refused (already counted and
    /// closed); ACME validation connections end here too.
    pub async fn accept(&self, mut tcp: TcpStream) -> Option<TlsIo> {
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
            // The accept limiter: no TLS state exists for a connection until it has a slot.
            let slot = self.handshakes.acquire();
            let Ok(Ok(_slot)) = tokio::time::timeout(self.handshake_wait, slot).await else {
                return Err("busy");
            };
            TlsIo::accept(tcp, self.config.clone())
                .await
                .map_err(|e| reason_of(&e))
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, work).await {
            Err(_) => self.refuse("timeout"),
            Ok(Err(reason)) => {
                log::debug!("[orca-relay] tls handshake refused: {reason}");
                self.refuse(reason)
            }
            Ok(Ok(mut tls)) => {
                if tls.alpn_protocol() == Some(ACME_TLS_ALPN) {
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

/// Registers the certificate-expiry gauge (only a process with TLS on its listener has it).
pub fn expiry_gauge(registry: &prometheus::Registry) -> prometheus::Gauge {
    let g = prometheus::Gauge::new(
        "orca_relay_tls_certificate_expiry_timestamp_seconds",
        "notAfter of the certificate the listener serves, in seconds since the epoch",
    )
    .expect("tls gauge");
    let _ = registry.register(Box::new(g.clone()));
    g
}

/// Every `reason` of `orca_relay_tls_handshake_failures_total` ([`reason_of`] and the acceptor's
/// own refusals), created at zero.
pub const FAILURE_REASONS: &[&str] = &[
    "timeout",
    "busy",
    "plain_http",
    "eof",
    "protocol",
    "unknown_name",
    "alpn",
    "peer_alert",
    "incompatible",
];

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
    for r in FAILURE_REASONS {
        c.with_label_values(&[r]);
    }
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
    let _ = resolver.expiry.set(expiry_gauge(registry));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_gauge_follows_the_served_certificate() {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let pair = load_pair(
            ck.cert.pem().as_bytes(),
            ck.signing_key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let registry = prometheus::Registry::new();
        let resolver = Resolver::default();
        let _ = resolver.expiry.set(expiry_gauge(&registry));
        resolver.set(pair.clone());
        let want = not_after(&pair).unwrap() as f64;
        let now = crate::clock::now_ms() as f64 / 1000.0;
        assert!(want > now, "a fresh certificate expires in the future");
        assert_eq!(resolver.expiry.get().unwrap().get(), want);
        let text = {
            let mut buf = Vec::new();
            prometheus::Encoder::encode(
                &prometheus::TextEncoder::new(),
                &registry.gather(),
                &mut buf,
            )
            .unwrap();
            String::from_utf8(buf).unwrap()
        };
        assert!(text.contains("orca_relay_tls_certificate_expiry_timestamp_seconds "));
    }
}
