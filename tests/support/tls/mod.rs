//! Shared pieces of the TLS tests: a CA generated at test time, `orca-relay` processes whose
//! stderr is captured, and a raw TLS probe that reports the certificate a listener serves.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Relay {
    /// Starts the binary in `cwd` with only `envs` (and PATH) set; waits for its listener.
    pub fn spawn(cwd: &Path, envs: &[(&str, String)]) -> Relay {
        Relay::try_spawn(cwd, envs).unwrap_or_else(|log| panic!("did not start: {log:?}"))
    }

    pub fn try_spawn(cwd: &Path, envs: &[(&str, String)]) -> Result<Relay, Vec<String>> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orca-relay"));
        cmd.arg("serve")
            .current_dir(cwd)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info,orca_relay=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn orca-relay");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                for scheme in ["https://", "http://"] {
                    let marker = format!("listening on {scheme}");
                    if let Some(i) = line.find(&marker) {
                        let _ = tx.send(line[i + marker.len()..].trim().to_string());
                    }
                }
                if std::env::var("TLS_TEST_VERBOSE").is_ok() {
                    eprintln!("relay: {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => Ok(Relay { child, addr, log }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(log.lock().unwrap().clone())
            }
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    pub fn lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// How many log lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits until more than `seen` log lines contain `needle`.
    pub fn wait_more(&self, needle: &str, seen: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.count(needle) > seen {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits until a log line contains `needle`.
    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.lines().iter().any(|l| l.contains(needle)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    pub fn signal(&self, sig: i32) {
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// SIGTERM and wait for the exit code.
    pub fn terminate(mut self) -> i32 {
        self.signal(libc::SIGTERM);
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(
                start.elapsed() < Duration::from_secs(12),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `orca-relay serve` expecting a configuration refusal: (exit code, stderr).
pub fn refused_start(cwd: &Path, envs: &[(&str, String)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orca-relay"));
    cmd.arg("serve")
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ORCA_RELAY_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
