//! Shared pieces of the TLS tests: a CA generated at test time, `orca-relay` processes whose
//! stderr is captured, and a raw TLS probe that reports the certificate a listener serves.
#![allow(dead_code)]

pub use super::common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::Duration;

use common::proc::{self as cproc, Log, Spec};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

/// A certificate authority that exists only for one test.
pub struct TestCa {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).unwrap();
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(p, key),
        }
    }

    /// A server certificate for `names` (DNS names or IP literals): (chain PEM, key PEM).
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
        p.distinguished_name.push(DnType::CommonName, names[0]);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("test-ca.pem");
        std::fs::write(&path, &self.pem).unwrap();
        path
    }
}

/// Writes a pair atomically-per-file (temp + rename), key first.
pub fn write_pair(dir: &Path, cert: &str, key: &str) -> (PathBuf, PathBuf) {
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    for (path, text) in [(&k, key), (&c, cert)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    (c, k)
}

/// One `orca-relay serve` process.
pub struct Relay {
    pub child: Child,
    pub addr: String,
    pub log: Log,
}

fn owned(envs: &[(&str, String)]) -> Vec<(String, String)> {
    envs.iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

impl Relay {
    /// Starts the binary in `cwd` with only `envs` (and PATH) set; waits for its listener.
    pub fn spawn(cwd: &Path, envs: &[(&str, String)]) -> Relay {
        Relay::try_spawn(cwd, envs).unwrap_or_else(|log| panic!("did not start: {log:?}"))
    }

    pub fn try_spawn(cwd: &Path, envs: &[(&str, String)]) -> Result<Relay, Vec<String>> {
        let envs = owned(envs);
        let spec = Spec {
            cwd: Some(cwd),
            rust_log: "info,orca_relay=debug",
            verbose_env: "TLS_TEST_VERBOSE",
            ..Spec::new("relay", &[], &envs)
        };
        let log = Log::default();
        match cproc::spawn_serve(&spec, &log, Duration::from_secs(30)) {
            Ok(s) => Ok(Relay {
                child: s.child,
                addr: s.addr,
                log,
            }),
            Err(()) => Err(cproc::lines(&log)),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    pub fn lines(&self) -> Vec<String> {
        cproc::lines(&self.log)
    }

    /// How many log lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        cproc::count(&self.log, needle)
    }

    /// Waits until more than `seen` log lines contain `needle`.
    pub fn wait_more(&self, needle: &str, seen: usize, within: Duration) -> bool {
        cproc::wait_more(&self.log, needle, seen, within)
    }

    /// Waits until a log line contains `needle`.
    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        cproc::wait_more(&self.log, needle, 0, within)
    }

    pub fn signal(&self, sig: i32) {
        cproc::signal(&self.child, sig);
    }

    /// SIGTERM and wait for the exit code.
    pub fn terminate(mut self) -> i32 {
        cproc::terminate(&mut self.child, Duration::from_secs(12), "relay")
            .code()
            .unwrap_or(-1)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        cproc::kill(&mut self.child);
    }
}

/// Runs `orca-relay serve` expecting a configuration refusal: (exit code, stderr).
pub fn refused_start(cwd: &Path, envs: &[(&str, String)]) -> (i32, String) {
    let mut envs = owned(envs);
    if !envs.iter().any(|(k, _)| k == "ORCA_RELAY_LISTEN") {
        envs.insert(0, ("ORCA_RELAY_LISTEN".into(), "127.0.0.1:0".into()));
    }
    cproc::run_to_exit(&Spec {
        cwd: Some(cwd),
        ..Spec::new("relay", &[], &envs)
    })
}

/// A client configuration trusting exactly `ca_pem`.
pub fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// Handshakes with `addr` as `sni`; the end-entity certificate served, or the error text.
pub async fn served_cert(
    addr: &str,
    sni: &str,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<CertificateDer<'static>, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(sni.to_string()).map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(cfg);
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake hang".to_string())?
        .map_err(|e| e.to_string())?;
    let (_, conn) = tls.get_ref();
    Ok(conn.peer_certificates().ok_or("no certificate")?[0].clone())
}

/// The DER of the first certificate of a PEM chain.
pub fn first_der(pem: &str) -> CertificateDer<'static> {
    rustls::pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
}

/// A host assigned through `public` (tokens signed with `signing`), its control, and a paired
/// phone: (the cell URL the director granted, control, pair).
pub async fn paired(
    public: &str,
    signing: &str,
    user: &str,
) -> (
    String,
    orca_relay::cell::testkit::HostControl,
    orca_relay::cell::testkit::Pair,
) {
    use orca_relay::cell::testkit::{self, Hello, HostIdentity};
    let host = HostIdentity::generate(user);
    let token = host.token(signing, public);
    let (cell, epoch) = testkit::assign(public, &token, &host.relay_host_id)
        .await
        .expect("assign");
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let mut control = testkit::connect_control(&cell, &host, &token, public, &hello)
        .await
        .expect("control");
    let invite = control
        .create_invite("r1", "phone-1")
        .await
        .expect("invite");
    let p = testkit::pair_phone(&cell, &mut control, &host.relay_host_id, &invite, &[])
        .await
        .expect("phone pairs");
    (cell, control, p)
}

/// Both directions of the splice still carry frames (a text up, a 16 KiB binary down).
pub async fn splice_works(p: &mut orca_relay::cell::testkit::Pair, tag: &str) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let within = Duration::from_secs(10);
    p.phone
        .send(Message::text(format!("up-{tag}")))
        .await
        .unwrap();
    let got = tokio::time::timeout(within, p.data.next()).await.unwrap();
    assert_eq!(got.unwrap().unwrap(), Message::text(format!("up-{tag}")));
    let blob = vec![7u8; 16 * 1024];
    p.data.send(Message::binary(blob.clone())).await.unwrap();
    let got = tokio::time::timeout(within, p.phone.next()).await.unwrap();
    assert_eq!(got.unwrap().unwrap(), Message::binary(blob));
}
