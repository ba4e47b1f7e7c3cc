//! Automatic certificates over ACME (RFC 8555) with TLS-ALPN-01 (RFC 8737) on the main listener.
//!
//! Why TLS-ALPN-01 and `instant-acme`: the challenge is answered by the listener the relay
//! already runs (port 443 for a public install), so no port 80 has to be opened and nothing but
//! the relay has to answer; the handshake of a validation connection (ALPN `acme-tls/1`) gets a
//! challenge certificate from the same resolver that serves the real one, and ordinary
//! connections never see it. `instant-acme` speaks the protocol (account, order, nonce handling,
//! polling) and leaves the serving to us, which is what lets the challenge live in our resolver
//! and the certificate swap be one pointer store: connections already established keep the
//! session they negotiated, new handshakes get the new certificate, nothing is dropped.
//!
//! Cache (`<data dir>/acme` by default): the account credentials (`account-<dir>.json`) and the
//! certificate with its key in one file (`cert-<dir,domains>.pem`, written whole: a temp file,
//! then a rename), all mode 0600. A restart
//! serves the cached certificate at once and orders only when it is within the renewal window
//! (`ORCA_RELAY_TLS_ACME_RENEW_BEFORE_DAYS`). SIGHUP orders a new certificate now (an operator's
//! forced renewal; mind the CA's rate limits).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, BodyWrapper, ChallengeType, HttpClient,
    Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::certs::{covers, load_pair, Resolver};
use super::{ExtraCa, TlsArgs};
use crate::flags::{err as cfg_err, int_in, ConfigError};

/// Validated ACME settings.
#[derive(Clone, Debug)]
pub struct AcmeSettings {
    pub domains: Vec<String>,
    pub email: Option<String>,
    pub directory: String,
    pub cache_dir: PathBuf,
    pub renew_before: Duration,
}

/// First retry after a failed order; doubles up to [`RETRY_MAX`], so a CA outage cannot stretch
/// the wait of a listener without a certificate past minutes.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// The wait before retry number `failures` (1 = after the first failure): 5 s doubling to 5 min,
/// then jittered by `jitter` in [0, 1) to between 80 % and 100 % of it, so many cells that lost
/// the same CA do not come back in step.
fn retry_delay(failures: u32, jitter: f64) -> Duration {
    let doubled = RETRY_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled
        .min(RETRY_MAX)
        .mul_f64(1.0 - 0.2 * jitter.clamp(0.0, 1.0))
}

pub(super) fn parse(
    a: &TlsArgs,
    domains: &str,
    data_dir: &Path,
    create_dirs: bool,
) -> Result<AcmeSettings, ConfigError> {
    let mut list = Vec::new();
    for d in domains.split(',').map(|d| d.trim().to_ascii_lowercase()) {
        let dns_ok = !d.is_empty()
            && d.parse::<std::net::IpAddr>().is_err()
            && rustls::pki_types::DnsName::try_from(d.as_str()).is_ok();
        if !dns_ok {
            return cfg_err("ORCA_RELAY_TLS_ACME_DOMAINS must be a comma list of DNS names");
        }
        if !list.contains(&d) {
            list.push(d);
        }
    }
    let email = match a.tls_acme_email.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(e) => {
            let ok = e.contains('@') && !e.contains(char::is_whitespace) && !e.contains(',');
            if !ok {
                return cfg_err("ORCA_RELAY_TLS_ACME_EMAIL must be an e-mail address");
            }
            Some(e.to_string())
        }
    };
    let directory = match a.tls_acme_directory.as_deref().map(str::trim) {
        None | Some("") => super::LETS_ENCRYPT.to_string(),
        Some(u) => {
            if !u.starts_with("https://") || u.len() <= "https://".len() {
                return cfg_err("ORCA_RELAY_TLS_ACME_DIRECTORY must be an https URL");
            }
            u.to_string()
        }
    };
    let cache_dir = match a.tls_acme_cache_dir.as_deref().map(str::trim) {
        None | Some("") => data_dir.join("acme"),
        Some(p) => PathBuf::from(p),
    };
    let days = int_in(
        "ORCA_RELAY_TLS_ACME_RENEW_BEFORE_DAYS",
        &a.tls_acme_renew_before_days,
        1,
        3650,
    )? as u64;
    if create_dirs {
        std::fs::create_dir_all(&cache_dir).or_else(|e| {
            cfg_err(format!(
                "ORCA_RELAY_TLS_ACME_CACHE_DIR: cannot create {}: {e}",
                cache_dir.display()
            ))
        })?;
    }
    Ok(AcmeSettings {
        domains: list,
        email,
        directory,
        cache_dir,
        renew_before: Duration::from_secs(days * 86_400),
    })
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    crate::crypto::ident::hex(&h.finalize()[..8])
}

impl AcmeSettings {
    fn account_path(&self) -> PathBuf {
        self.cache_dir
            .join(format!("account-{}.json", short_hash(&[&self.directory])))
    }

    /// The cached certificate chain and its key, in one file written whole (temp file, then
    /// rename): a crash can never leave a certificate beside another order's key.
    fn cert_path(&self) -> PathBuf {
        let mut parts = vec![self.directory.as_str()];
        parts.extend(self.domains.iter().map(String::as_str));
        let h = short_hash(&parts);
        self.cache_dir.join(format!("cert-{h}.pem"))
    }
}

/// A certificate this process holds, with its expiry (unix seconds).
struct Held {
    key: Arc<CertifiedKey>,
    not_after: i64,
}

/// `notAfter` of the end-entity certificate.
fn not_after(ck: &CertifiedKey) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(ck.cert.first()?.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}

fn now_s() -> i64 {
    crate::clock::now_ms() / 1000
}

/// The cached certificate if it is usable: chain and key from the one combined file, matching
/// (`load_pair` checks), covering every domain and not expired.
fn load_cached(s: &AcmeSettings) -> Option<Held> {
    let both = std::fs::read(s.cert_path()).ok()?;
    let key = load_pair(&both, &both).ok()?;
    if !s.domains.iter().all(|d| covers(&key, d)) {
        return None;
    }
    let not_after = not_after(&key)?;
    (not_after > now_s()).then_some(Held { key, not_after })
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

/// The ACME client's HTTPS: the same roots as cluster traffic (system + extra CA).
fn http_client(extra: &ExtraCa) -> Box<dyn HttpClient> {
    let cfg = (*super::client::client_config(extra, &[])).clone();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_only()
        .enable_http1()
        .build();
    let client: hyper_util::client::legacy::Client<_, BodyWrapper<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https);
    Box::new(client)
}

/// The ACME account: the one this process already holds, else the cached credentials, else a
/// new one. A new account is kept in `held` even when its credentials cannot be written, so a
/// failing disk does not create a new account on every retry.
async fn account(
    s: &AcmeSettings,
    extra: &ExtraCa,
    held: &mut Option<Account>,
) -> Result<Account, String> {
    if let Some(a) = held {
        return Ok(a.clone());
    }
    let a = load_or_create_account(s, extra).await?;
    *held = Some(a.clone());
    Ok(a)
}

async fn load_or_create_account(s: &AcmeSettings, extra: &ExtraCa) -> Result<Account, String> {
    let extra = extra.clone();
    // Loading the system roots reads files: off the async workers.
    let http = tokio::task::spawn_blocking(move || http_client(&extra))
        .await
        .map_err(|_| "http client setup failed".to_string())?;
    let path = s.account_path();
    if let Ok(text) = tokio::fs::read_to_string(&path).await {
        if let Ok(creds) = serde_json::from_str::<AccountCredentials>(&text) {
            return Account::builder_with_http(http)
                .from_credentials(creds)
                .await
                .map_err(|e| format!("account: {e}"));
        }
    }
    let contact = s.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (acct, creds) = Account::builder_with_http(http)
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            s.directory.clone(),
            None,
        )
        .await
        .map_err(|e| format!("new account: {e}"))?;
    let bytes = serde_json::to_vec(&creds).map_err(|e| e.to_string())?;
    let saved = tokio::task::spawn_blocking(move || write_private(&path, &bytes)).await;
    if !matches!(saved, Ok(Ok(()))) {
        // Kept in memory by the caller: the next restart creates another account, not every retry.
        log::warn!(
            "[orca-relay] tls: cannot write the ACME account file; keeping the account in memory"
        );
    }
    Ok(acct)
}

/// A self-signed certificate carrying the `acmeIdentifier` extension for `domain`.
fn challenge_cert(domain: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(vec![domain.to_string()]).map_err(|e| e.to_string())?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(CertifiedKey::new(
        vec![CertificateDer::from(cert.der().to_vec())],
        signing,
    )))
}

/// One order: challenges answered on the listener, a fresh key, the issued chain.
async fn obtain(
    s: &AcmeSettings,
    extra: &ExtraCa,
    resolver: &Resolver,
    held_account: &mut Option<Account>,
) -> Result<(Held, String), String> {
    let account = account(s, extra, held_account).await?;
    let ids: Vec<Identifier> = s.domains.iter().cloned().map(Identifier::Dns).collect();
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .map_err(|e| format!("new order: {e}"))?;
    let mut staged = Vec::new();
    let staging = async {
        let mut authzs = order.authorizations();
        while let Some(a) = authzs.next().await {
            let mut a = a.map_err(|e| format!("authorization: {e}"))?;
            match a.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => return Err(format!("authorization is {other:?}")),
            }
            let Identifier::Dns(domain) = a.identifier().identifier.clone() else {
                return Err("the CA returned a non-DNS identifier".into());
            };
            let mut ch = a
                .challenge(ChallengeType::TlsAlpn01)
                .ok_or("the CA offers no tls-alpn-01 challenge")?;
            let digest = ch.key_authorization().digest();
            resolver.set_challenge(&domain, Some(challenge_cert(&domain, digest.as_ref())?));
            staged.push(domain);
            ch.set_ready()
                .await
                .map_err(|e| format!("challenge: {e}"))?;
        }
        Ok::<(), String>(())
    };
    let staged_ok = staging.await;
    let ready = match staged_ok {
        Ok(()) => order
            .poll_ready(&RetryPolicy::new().timeout(Duration::from_secs(120)))
            .await
            .map_err(|e| format!("order: {e}")),
        Err(e) => Err(e),
    };
    for d in &staged {
        resolver.set_challenge(d, None);
    }
    match ready? {
        OrderStatus::Ready => {}
        other => return Err(format!("order is {other:?}")),
    }
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let csr = rcgen::CertificateParams::new(s.domains.clone())
        .and_then(|p| p.serialize_request(&key))
        .map_err(|e| format!("csr: {e}"))?;
    order
        .finalize_csr(csr.der())
        .await
        .map_err(|e| format!("finalize: {e}"))?;
    let chain = order
        .poll_certificate(&RetryPolicy::new().timeout(Duration::from_secs(120)))
        .await
        .map_err(|e| format!("certificate: {e}"))?;
    let combined = combined_pem(&chain, &key.serialize_pem());
    let ck = load_pair(combined.as_bytes(), combined.as_bytes())?;
    let not_after = not_after(&ck).ok_or("the issued certificate does not parse")?;
    Ok((Held { key: ck, not_after }, combined))
}

/// The chain, then the key, as one PEM file.
fn combined_pem(chain: &str, key_pem: &str) -> String {
    let mut out = chain.trim_end().to_string();
    out.push('\n');
    out.push_str(key_pem.trim_end());
    out.push('\n');
    out
}

/// Starts the certificate loop: the cached certificate first, an order when none is usable or
/// renewal is due, SIGHUP for a renewal now.
pub fn spawn(
    s: AcmeSettings,
    extra: ExtraCa,
    resolver: Arc<Resolver>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("SIGHUP handler: {e}"))?;
    tokio::spawn(async move {
        let mut sched = Schedule {
            expires: serve_cached(&s, &resolver).await,
            renew_before: s.renew_before.as_secs() as i64,
            force: false,
            failures: 0,
            retry: RETRY_FIRST,
        };
        let mut held_account = None;
        loop {
            let wait = if sched.due() {
                let attempt = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = obtain(&s, &extra, &resolver, &mut held_account) => r,
                };
                sched.settle(&s, &resolver, attempt).await
            } else {
                sched.idle_wait()
            };
            #[cfg(unix)]
            let hup_recv = hup.recv();
            #[cfg(not(unix))]
            let hup_recv = std::future::pending::<Option<()>>();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = hup_recv => {
                    log::info!("[orca-relay] tls: SIGHUP, renewing the ACME certificate");
                    sched.force = true;
                }
            }
        }
    });
    Ok(())
}

/// Serves the cached certificate, if there is a usable one; returns its expiry.
async fn serve_cached(s: &AcmeSettings, resolver: &Resolver) -> Option<i64> {
    let s = s.clone();
    let h = tokio::task::spawn_blocking(move || load_cached(&s))
        .await
        .ok()
        .flatten()?;
    log::info!("[orca-relay] tls: serving the cached ACME certificate");
    resolver.set(h.key);
    Some(h.not_after)
}

/// When the certificate loop orders next.
struct Schedule {
    /// The served certificate's expiry (Unix seconds), if one is served.
    expires: Option<i64>,
    renew_before: i64,
    /// A renewal asked for by SIGHUP.
    force: bool,
    failures: u32,
    retry: Duration,
}

impl Schedule {
    fn due(&self) -> bool {
        self.force
            || self
                .expires
                .is_none_or(|na| now_s() >= na - self.renew_before)
    }

    /// The wait until renewal is due (at most an hour, so a changed clock is noticed), or the
    /// retry delay while no certificate is served.
    fn idle_wait(&self) -> Duration {
        match self.expires {
            Some(na) => {
                Duration::from_secs((na - self.renew_before - now_s()).clamp(1, 3600) as u64)
            }
            None => self.retry,
        }
    }

    /// Serves and caches a new certificate, or schedules the retry; returns the wait.
    async fn settle(
        &mut self,
        s: &AcmeSettings,
        resolver: &Resolver,
        attempt: Result<(Held, String), String>,
    ) -> Duration {
        self.force = false;
        match attempt {
            Ok((held, combined)) => {
                let path = s.cert_path();
                let saved =
                    tokio::task::spawn_blocking(move || write_private(&path, combined.as_bytes()))
                        .await;
                if !matches!(saved, Ok(Ok(()))) {
                    log::warn!("[orca-relay] tls: cannot write the ACME certificate cache");
                }
                resolver.set(held.key);
                self.expires = Some(held.not_after);
                self.failures = 0;
                log::info!("[orca-relay] tls: ACME certificate obtained");
                self.idle_wait()
            }
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                self.retry = retry_delay(self.failures, rand::random::<f64>());
                log::warn!(
                    "[orca-relay] tls: ACME order failed: {e}; retrying in {}s",
                    self.retry.as_secs()
                );
                self.retry
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_start_at_5s_and_double_to_5_min() {
        let secs = |n| retry_delay(n, 0.0).as_secs();
        assert_eq!(
            (1..=8).map(secs).collect::<Vec<_>>(),
            vec![5, 10, 20, 40, 80, 160, 300, 300]
        );
        assert_eq!(secs(u32::MAX), 300, "no overflow after many failures");
    }

    #[test]
    fn retries_are_jittered_down_by_at_most_a_fifth() {
        for n in [1, 4, 20] {
            let full = retry_delay(n, 0.0);
            for j in [0.0, 0.3, 0.999, 5.0, -1.0] {
                let d = retry_delay(n, j);
                assert!(d <= full && d >= full.mul_f64(0.8), "{n} {j}: {d:?}");
            }
        }
        assert!(retry_delay(3, 0.5) < retry_delay(3, 0.0));
    }

    /// The chain and key come back from the one combined file, matching.
    #[test]
    fn the_combined_file_holds_a_matching_pair() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["relay.example".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let both = combined_pem(&cert.pem(), &key.serialize_pem());
        let ck = load_pair(both.as_bytes(), both.as_bytes()).expect("pair");
        assert!(covers(&ck, "relay.example"));
        // Another order's key beside this certificate is refused, never served.
        let other = rcgen::KeyPair::generate().unwrap();
        let mixed = combined_pem(&cert.pem(), &other.serialize_pem());
        assert!(load_pair(mixed.as_bytes(), mixed.as_bytes()).is_err());
    }
}
