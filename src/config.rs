//! Every setting of `orca-relay serve`, validated once into typed values (README §3).
//!
//! Each setting is a flag with a matching environment variable (the flag wins). Values arrive as
//! text and are checked here, so an invalid value stops start-up with one line that names the
//! variable and the rule — clap's own type errors would not say which variable was wrong.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::contract::validate::{check_origin, is_cell_id};

/// The flags (and environment variables) of `orca-relay serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// `all` or a comma list of `director`, `cell`, `push`.
    #[arg(long, env = "ORCA_RELAY_ROLE", default_value = "all")]
    pub role: String,
    /// Socket address to listen on.
    #[arg(long, env = "ORCA_RELAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Canonical public origin [default: http://127.0.0.1:<port>].
    #[arg(long, env = "ORCA_RELAY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// `sqlite://PATH`, `sqlite::memory:` or `postgres://…` [default: sqlite://<data dir>/orca-relay.sqlite3].
    #[arg(long, env = "ORCA_RELAY_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Postgres pool size, 1..100.
    #[arg(long, env = "ORCA_RELAY_DATABASE_POOL_MAX", default_value = "10")]
    pub database_pool_max: String,
    /// Where the SQLite file and generated secrets live.
    #[arg(long, env = "ORCA_RELAY_DATA_DIR", default_value = "./data")]
    pub data_dir: String,
    /// Signs assignment leases and (derived) self-hosted host tokens; at least 32 bytes.
    #[arg(
        long,
        env = "ORCA_RELAY_ASSIGNMENT_SIGNING_KEY",
        hide_env_values = true
    )]
    pub assignment_signing_key: Option<String>,
    /// Bearer for `POST /v1/host-token`; 32..256 chars of [A-Za-z0-9_-].
    #[arg(long, env = "ORCA_RELAY_SELF_HOSTED_KEY", hide_env_values = true)]
    pub self_hosted_key: Option<String>,
    /// Bearer for the operator routes and /metrics; 32..256 visible ASCII chars.
    #[arg(long, env = "ORCA_RELAY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Signs node-to-node cluster tokens; at least 32 bytes.
    #[arg(long, env = "ORCA_RELAY_CLUSTER_KEY", hide_env_values = true)]
    pub cluster_key: Option<String>,
    /// External host-token issuer (with --jwks-url).
    #[arg(long, env = "ORCA_RELAY_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,
    /// JWKS of the external issuer (with --auth-issuer).
    #[arg(long, env = "ORCA_RELAY_JWKS_URL")]
    pub jwks_url: Option<String>,
    /// This process's cell id.
    #[arg(long, env = "ORCA_RELAY_CELL_ID", default_value = "local")]
    pub cell_id: String,
    /// Origin phones and hosts dial for this cell [default: the public URL].
    #[arg(long, env = "ORCA_RELAY_CELL_URL")]
    pub cell_url: Option<String>,
    /// This cell's region (one of --regions).
    #[arg(long, env = "ORCA_RELAY_REGION", default_value = "us-central1")]
    pub region: String,
    /// Ordered region list; the first is the default region.
    #[arg(
        long,
        env = "ORCA_RELAY_REGIONS",
        default_value = "us-central1,asia-east2"
    )]
    pub regions: String,
    /// Request units of the local cell, 1..1000000.
    #[arg(long, env = "ORCA_RELAY_CELL_CAPACITY", default_value = "20000")]
    pub cell_capacity: String,
    /// Hard connection cap, 200..1000000 (with the unobserved bound).
    #[arg(long, env = "ORCA_RELAY_CELL_CONNECTION_HARD_CAP")]
    pub cell_connection_hard_cap: Option<String>,
    /// Unobserved connection bound, 0..hardCap-101 (with the hard cap).
    #[arg(long, env = "ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND")]
    pub cell_connection_unobserved_bound: Option<String>,
    /// Open-connection ceiling of an uncapped cell, 1000..1000000.
    #[arg(
        long,
        env = "ORCA_RELAY_CELL_MAX_CONNECTIONS",
        default_value = "100000"
    )]
    pub cell_max_connections: String,
    /// Director origin for a cell without the director role.
    #[arg(long, env = "ORCA_RELAY_DIRECTOR_URL")]
    pub director_url: Option<String>,
    /// JSON array of cells the director registers at start-up.
    #[arg(long, env = "ORCA_RELAY_CELLS")]
    pub cells: Option<String>,
    /// Trusted proxies appending to X-Forwarded-For, 0..8.
    #[arg(long, env = "ORCA_RELAY_TRUSTED_PROXY_HOPS", default_value = "0")]
    pub trusted_proxy_hops: String,
    /// Placement lane concurrency, 1..100.
    #[arg(
        long,
        env = "ORCA_RELAY_PUBLIC_ASSIGNMENT_CONCURRENCY",
        default_value = "2"
    )]
    pub public_assignment_concurrency: String,
    /// Placement lane queue, 1..4096.
    #[arg(
        long,
        env = "ORCA_RELAY_PUBLIC_ASSIGNMENT_QUEUE_MAX",
        default_value = "128"
    )]
    pub public_assignment_queue_max: String,
    /// Placement lane wait, 1..30000 ms.
    #[arg(
        long,
        env = "ORCA_RELAY_PUBLIC_ASSIGNMENT_WAIT_MS",
        default_value = "4000"
    )]
    pub public_assignment_wait_ms: String,
    /// Placement Retry-After and per-host interval, 1..300 s.
    #[arg(
        long,
        env = "ORCA_RELAY_PUBLIC_ASSIGNMENT_RETRY_AFTER_SECONDS",
        default_value = "5"
    )]
    pub public_assignment_retry_after_seconds: String,
    /// Sticky lane concurrency, 1..100.
    #[arg(
        long,
        env = "ORCA_RELAY_PUBLIC_STICKY_CONCURRENCY",
        default_value = "1"
    )]
    pub public_sticky_concurrency: String,
    /// Sticky lane queue, 1..4096.
    #[arg(long, env = "ORCA_RELAY_PUBLIC_STICKY_QUEUE_MAX", default_value = "64")]
    pub public_sticky_queue_max: String,
    /// Sticky lane wait, 1..30000 ms.
    #[arg(long, env = "ORCA_RELAY_PUBLIC_STICKY_WAIT_MS", default_value = "2000")]
    pub public_sticky_wait_ms: String,
    /// Sticky Retry-After and per-host interval, 1..60 s.
    #[arg(
        long,
        env = "ORCA_RELAY_PUBLIC_STICKY_RETRY_AFTER_SECONDS",
        default_value = "2"
    )]
    pub public_sticky_retry_after_seconds: String,
    /// Separate unauthenticated /metrics listener.
    #[arg(long, env = "ORCA_RELAY_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Readiness grace for a database that answered recently, 0..3600000 ms.
    #[arg(
        long,
        env = "ORCA_RELAY_READINESS_SQL_GRACE_MS",
        default_value = "180000"
    )]
    pub readiness_sql_grace_ms: String,
    /// Drain grace on SIGTERM, 0..8000 ms.
    #[arg(long, env = "ORCA_RELAY_SHUTDOWN_GRACE_MS", default_value = "0")]
    pub shutdown_grace_ms: String,
    /// Idle-rehome worker poll period, 100..600000 ms, jittered ±20 % (director.md §8.3 says 6000;
    /// shorter periods are for tests and benchmarks).
    #[arg(long, env = "ORCA_RELAY_REGION_REHOME_POLL_MS", default_value = "6000")]
    pub region_rehome_poll_ms: String,
    /// Director sweep period, 1000..600000 ms, jittered ±20 % (director.md §5.6 says 30000;
    /// shorter periods are for tests and benchmarks).
    #[arg(long, env = "ORCA_RELAY_SWEEP_INTERVAL_MS", default_value = "30000")]
    pub sweep_interval_ms: String,
    /// Push gateway origin bound into host challenges [default: the public URL].
    #[arg(long, env = "ORCA_PUSH_PUBLIC_URL")]
    pub push_public_url: Option<String>,
    /// `active` or `validation`.
    #[arg(long, env = "ORCA_PUSH_MODE", default_value = "active")]
    pub push_mode: String,
    /// APNs P-256 key (PEM text).
    #[arg(long, env = "ORCA_PUSH_APNS_KEY", hide_env_values = true)]
    pub push_apns_key: Option<String>,
    /// APNs key id (10 chars).
    #[arg(long, env = "ORCA_PUSH_APNS_KEY_ID")]
    pub push_apns_key_id: Option<String>,
    /// Apple team id (10 chars).
    #[arg(long, env = "ORCA_PUSH_APPLE_TEAM_ID")]
    pub push_apple_team_id: Option<String>,
    /// APNs topic.
    #[arg(
        long,
        env = "ORCA_PUSH_APNS_TOPIC",
        default_value = DEFAULT_APNS_TOPIC
    )]
    pub push_apns_topic: String,
    /// FCM project id.
    #[arg(long, env = "ORCA_PUSH_FCM_PROJECT_ID")]
    pub push_fcm_project_id: Option<String>,
    /// Path of the FCM service-account JSON file.
    #[arg(long, env = "ORCA_PUSH_FCM_CREDENTIALS")]
    pub push_fcm_credentials: Option<String>,
    /// APNs origin override (tests, staging).
    #[arg(long, env = "ORCA_PUSH_APNS_BASE_URL")]
    pub push_apns_base_url: Option<String>,
    /// FCM origin override.
    #[arg(long, env = "ORCA_PUSH_FCM_BASE_URL")]
    pub push_fcm_base_url: Option<String>,
    /// OAuth token endpoint override.
    #[arg(long, env = "ORCA_PUSH_OAUTH_TOKEN_URL")]
    pub push_oauth_token_url: Option<String>,
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
}

impl ServeArgs {
    /// Parses `serve` flags (environment variables still apply), for tests and embedding.
    pub fn parse_flags<I, T>(args: I) -> Result<ServeArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            args: ServeArgs,
        }
        let argv = std::iter::once(std::ffi::OsString::from("orca-relay"))
            .chain(args.into_iter().map(Into::into));
        Flags::try_parse_from(argv).map(|f| f.args)
    }
}

/// Which roles this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Roles {
    pub director: bool,
    pub cell: bool,
    pub push: bool,
}

impl Roles {
    pub const ALL: Roles = Roles {
        director: true,
        cell: true,
        push: true,
    };

    pub fn parse(s: &str) -> Option<Roles> {
        let s = s.trim();
        if s == "all" {
            return Some(Roles::ALL);
        }
        let mut r = Roles::default();
        for part in s.split(',') {
            match part.trim() {
                "director" => r.director = true,
                "cell" => r.cell = true,
                "push" => r.push = true,
                _ => return None,
            }
        }
        Some(r)
    }

    /// The role names in the spec's order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.director {
            v.push("director");
        }
        if self.cell {
            v.push("cell");
        }
        if self.push {
            v.push("push");
        }
        v
    }
}

/// `ORCA_PUSH_APNS_TOPIC` when unset (push.md §1).
pub const DEFAULT_APNS_TOPIC: &str = "com.stably.orca.mobile";

/// A cell registered from `ORCA_RELAY_CELLS`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CellSpec {
    pub id: String,
    pub url: String,
    pub region: String,
    pub capacity_requests: i64,
    #[serde(default)]
    pub connection_hard_cap: Option<i64>,
    #[serde(default)]
    pub connection_unobserved_bound: Option<i64>,
    #[serde(default)]
    pub initial_state: Option<String>,
}

/// An admission lane's limits (director.md §0, §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneConfig {
    pub concurrency: usize,
    pub queue_max: usize,
    pub wait_ms: u64,
    pub retry_after_s: u64,
}

/// The connection cap of a capped cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HardCap {
    pub cap: u64,
    pub unobserved_bound: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushMode {
    Active,
    Validation,
}

#[derive(Debug, Clone)]
pub struct ApnsConfig {
    pub key_pem: String,
    pub key_id: String,
    pub team_id: String,
}

/// The parts of an FCM service-account file the gateway uses.
#[derive(Debug, Clone)]
pub struct FcmConfig {
    pub project_id: String,
    pub client_email: String,
    pub private_key_pem: String,
    pub private_key_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct PushConfig {
    pub public_url: String,
    pub mode: PushMode,
    pub apns: Option<ApnsConfig>,
    pub apns_topic: String,
    pub fcm: Option<FcmConfig>,
    pub apns_base_url: Option<String>,
    pub fcm_base_url: String,
    pub oauth_token_url: String,
}

/// Node secrets. `None` only where the roles do not need it.
#[derive(Clone, Default)]
pub struct Secrets {
    pub assignment_signing_key: Option<String>,
    pub self_hosted_key: Option<String>,
    pub admin_token: Option<String>,
    pub cluster_key: Option<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets { <redacted> }")
    }
}

/// The validated configuration of one process.
#[derive(Debug, Clone)]
pub struct Config {
    pub roles: Roles,
    pub listen: SocketAddr,
    pub public_url: String,
    pub database_url: String,
    pub database_pool_max: usize,
    pub data_dir: PathBuf,
    pub secrets: Secrets,
    /// Where generated secrets were stored (single node only).
    pub secrets_file: Option<PathBuf>,
    pub auth_issuer: Option<String>,
    pub jwks_url: Option<String>,
    pub cell_id: String,
    pub cell_url: String,
    pub region: String,
    pub regions: Vec<String>,
    pub cell_capacity: i64,
    pub hard_cap: Option<HardCap>,
    pub max_connections: u64,
    pub director_url: Option<String>,
    pub cells: Vec<CellSpec>,
    pub trusted_proxy_hops: usize,
    pub placement_lane: LaneConfig,
    pub sticky_lane: LaneConfig,
    pub metrics_listen: Option<SocketAddr>,
    pub readiness_sql_grace_ms: u64,
    pub shutdown_grace_ms: u64,
    /// The director's idle-rehome poll period before jitter (`ORCA_RELAY_REGION_REHOME_POLL_MS`).
    pub region_rehome_poll_ms: i64,
    /// The director's sweep period before jitter (`ORCA_RELAY_SWEEP_INTERVAL_MS`).
    pub sweep_interval_ms: i64,
    pub push: PushConfig,
    /// Built-in TLS of the listener; `None` = plain HTTP.
    pub tls: Option<crate::tls::TlsSettings>,
    /// Extra trust anchors for cluster HTTPS (`ORCA_RELAY_TLS_EXTRA_CA`).
    pub extra_ca: crate::tls::ExtraCa,
    /// Scheme and host of the default URLs (`http://127.0.0.1`, or https with TLS on).
    url_base: String,
    /// Which URLs were derived from the listen port (and follow the bound port).
    url_defaults: (bool, bool, bool),
}

/// One line naming the variable and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

// The flag-value shapes every settings parser shares (this file's and `tls`'s): one error form,
// bounded integers, optional values, on/off switches.

/// A configuration refusal with this message.
pub(crate) fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// `raw` as an integer in `lo..=hi`, else "`var` must be an integer in lo..hi".
pub(crate) fn int_in(var: &str, raw: &str, lo: i64, hi: i64) -> Result<i64, ConfigError> {
    match raw.trim().parse::<i64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => err(format!("{var} must be an integer in {lo}..{hi}")),
    }
}

/// Treats empty and whitespace-only values as unset.
pub(crate) fn opt(v: &Option<String>) -> Option<String> {
    v.as_ref()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.to_string())
}

/// [`opt`], trimmed (paths and lists, where surrounding blanks are never meant).
pub(crate) fn opt_trimmed(v: &Option<String>) -> Option<String> {
    opt(v).map(|s| s.trim().to_string())
}

/// An on/off switch: empty, `0` or `false` is off; `1` or `true` is on.
pub(crate) fn switch(var: &str, raw: &str) -> Result<bool, ConfigError> {
    match raw.trim() {
        "" | "0" | "false" => Ok(false),
        "1" | "true" => Ok(true),
        _ => err(format!("{var} must be 0, 1, true or false")),
    }
}

fn origin(var: &str, v: &str) -> Result<String, ConfigError> {
    match check_origin(v) {
        Ok(()) => Ok(v.to_string()),
        Err(rule) => err(format!("{var} {rule}")),
    }
}

/// An absolute `https` URL, or `http` on a loopback host.
fn absolute_url(var: &str, v: &str) -> Result<String, ConfigError> {
    let (scheme, rest) = match v.split_once("://") {
        Some(x) => x,
        None => return err(format!("{var} must be an absolute URL")),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || (scheme != "http" && scheme != "https") {
        return err(format!("{var} must be an absolute URL"));
    }
    check_origin(&format!("{scheme}://{authority}"))
        .or_else(|rule| err(format!("{var} {rule}")))?;
    Ok(v.to_string())
}

fn check_signing_key(var: &str, v: &str) -> Result<(), ConfigError> {
    if v.len() < 32 {
        return err(format!("{var} must be at least 32 bytes"));
    }
    Ok(())
}

fn check_self_hosted_key(v: &str) -> Result<(), ConfigError> {
    let ok = (32..=256).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        return err("ORCA_RELAY_SELF_HOSTED_KEY must be 32..256 characters of [A-Za-z0-9_-]");
    }
    Ok(())
}

fn check_admin_token(v: &str) -> Result<(), ConfigError> {
    let ok = (32..=256).contains(&v.len()) && v.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if !ok {
        return err(
            "ORCA_RELAY_ADMIN_TOKEN must be 32..256 visible ASCII characters without spaces",
        );
    }
    Ok(())
}

/// The generated-secrets file of the single-node shape (README §3).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SecretsFile {
    v: u32,
    assignment_signing_key: String,
    self_hosted_key: String,
    admin_token: String,
    cluster_key: String,
}

/// Random URL-safe text of `bytes` random bytes (43 chars for 32 bytes).
fn random_secret(bytes: usize) -> String {
    use base64::Engine;
    let mut buf = vec![0u8; bytes];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut buf);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

/// Loads `<data dir>/secrets.json`, or creates it (mode 0600) with fresh values.
fn load_or_create_secrets(dir: &Path) -> Result<(SecretsFile, PathBuf), ConfigError> {
    let path = dir.join("secrets.json");
    if path.exists() {
        let text = std::fs::read_to_string(&path).or_else(|e| {
            err(format!(
                "ORCA_RELAY_DATA_DIR: cannot read {}: {e}",
                path.display()
            ))
        })?;
        let file: SecretsFile = serde_json::from_str(&text).or_else(|_| {
            err(format!(
                "ORCA_RELAY_DATA_DIR: {} is not a valid secrets file",
                path.display()
            ))
        })?;
        if file.v != 1 {
            return err(format!(
                "ORCA_RELAY_DATA_DIR: {} has an unknown version",
                path.display()
            ));
        }
        return Ok((file, path));
    }
    std::fs::create_dir_all(dir).or_else(|e| {
        err(format!(
            "ORCA_RELAY_DATA_DIR: cannot create {}: {e}",
            dir.display()
        ))
    })?;
    let file = SecretsFile {
        v: 1,
        assignment_signing_key: random_secret(48),
        self_hosted_key: random_secret(32),
        admin_token: random_secret(32),
        cluster_key: random_secret(48),
    };
    let text = serde_json::to_string(&file).expect("serialize secrets");
    write_private(&path, text.as_bytes()).or_else(|e| {
        err(format!(
            "ORCA_RELAY_DATA_DIR: cannot write {}: {e}",
            path.display()
        ))
    })?;
    Ok((file, path))
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

/// Reads the single-node secrets file without creating it (for the admin CLI).
pub fn read_secrets_file(data_dir: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(data_dir.join("secrets.json")).ok()?;
    let f: SecretsFile = serde_json::from_str(&text).ok()?;
    Some((f.admin_token, f.self_hosted_key))
}

impl Config {
    /// Validates `args`; in the single-node shape also loads or generates the secrets file
    /// (file-system work: call before the runtime starts or from a blocking context).
    pub fn from_args(a: &ServeArgs) -> Result<Config, ConfigError> {
        let roles = match Roles::parse(&a.role) {
            Some(r) => r,
            None => {
                return err("ORCA_RELAY_ROLE must be all or a comma list of director, cell, push")
            }
        };
        let listen: SocketAddr = a
            .listen
            .trim()
            .parse()
            .or_else(|_| err("ORCA_RELAY_LISTEN must be a socket address"))?;
        let data_dir = PathBuf::from(a.data_dir.trim());
        let tls = crate::tls::parse_settings(&a.tls, &data_dir)?;
        let extra_ca = crate::tls::parse_extra_ca(&a.tls)?;
        let url_base = match &tls {
            Some(t) => format!("https://{}", t.default_host()),
            None => "http://127.0.0.1".to_string(),
        };
        let default_url = |port: u16| match &tls {
            Some(_) if port == 443 => url_base.clone(),
            _ => format!("{url_base}:{port}"),
        };
        let public_url = match opt(&a.public_url) {
            Some(u) => origin("ORCA_RELAY_PUBLIC_URL", &u)?,
            None => default_url(listen.port()),
        };
        let database_url = match opt(&a.database_url) {
            Some(u) => {
                if !(u == "sqlite::memory:"
                    || (u.starts_with("sqlite://") && u.len() > "sqlite://".len())
                    || u.starts_with("postgres://")
                    || u.starts_with("postgresql://"))
                {
                    return err(
                        "ORCA_RELAY_DATABASE_URL must be sqlite://PATH, sqlite::memory: or postgres://…",
                    );
                }
                u
            }
            None => format!("sqlite://{}", data_dir.join("orca-relay.sqlite3").display()),
        };
        let is_postgres = database_url.starts_with("postgres");
        let database_pool_max =
            int_in("ORCA_RELAY_DATABASE_POOL_MAX", &a.database_pool_max, 1, 100)? as usize;

        let mut secrets = Secrets {
            assignment_signing_key: opt(&a.assignment_signing_key),
            self_hosted_key: opt(&a.self_hosted_key),
            admin_token: opt(&a.admin_token),
            cluster_key: opt(&a.cluster_key),
        };
        if let Some(k) = &secrets.assignment_signing_key {
            check_signing_key("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", k)?;
        }
        if let Some(k) = &secrets.self_hosted_key {
            check_self_hosted_key(k)?;
        }
        if let Some(k) = &secrets.admin_token {
            check_admin_token(k)?;
        }
        if let Some(k) = &secrets.cluster_key {
            check_signing_key("ORCA_RELAY_CLUSTER_KEY", k)?;
        }

        let auth_issuer = opt(&a.auth_issuer);
        let jwks_url = opt(&a.jwks_url);
        if auth_issuer.is_some() != jwks_url.is_some() {
            return err("ORCA_RELAY_AUTH_ISSUER and ORCA_RELAY_JWKS_URL must be set together");
        }
        if let Some(u) = &jwks_url {
            absolute_url("ORCA_RELAY_JWKS_URL", u)?;
        }

        let cell_id = a.cell_id.trim().to_string();
        if !is_cell_id(&cell_id) || cell_id == "director" {
            return err(
                "ORCA_RELAY_CELL_ID must be 1..128 characters of [A-Za-z0-9_.-] and not director",
            );
        }
        let cell_url = match opt(&a.cell_url) {
            Some(u) => origin("ORCA_RELAY_CELL_URL", &u)?,
            None => public_url.clone(),
        };
        let regions: Vec<String> = a
            .regions
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let region_ok = |r: &str| {
            (1..=64).contains(&r.len())
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if regions.is_empty() || !regions.iter().all(|r| region_ok(r)) {
            return err("ORCA_RELAY_REGIONS must be a comma list of region names");
        }
        let region = a.region.trim().to_string();
        if !regions.contains(&region) {
            return err("ORCA_RELAY_REGION must be one of ORCA_RELAY_REGIONS");
        }
        let cell_capacity = int_in("ORCA_RELAY_CELL_CAPACITY", &a.cell_capacity, 1, 1_000_000)?;
        let hard_cap = match (
            opt(&a.cell_connection_hard_cap),
            opt(&a.cell_connection_unobserved_bound),
        ) {
            (None, None) => None,
            (Some(c), Some(b)) => {
                let cap = int_in("ORCA_RELAY_CELL_CONNECTION_HARD_CAP", &c, 200, 1_000_000)?;
                let bound = int_in(
                    "ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND",
                    &b,
                    0,
                    cap - 101,
                )?;
                Some(HardCap {
                    cap: cap as u64,
                    unobserved_bound: bound as u64,
                })
            }
            (Some(_), None) => {
                return err(
                    "ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND is required with ORCA_RELAY_CELL_CONNECTION_HARD_CAP",
                )
            }
            (None, Some(_)) => {
                return err(
                    "ORCA_RELAY_CELL_CONNECTION_HARD_CAP is required with ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND",
                )
            }
        };
        let max_connections = int_in(
            "ORCA_RELAY_CELL_MAX_CONNECTIONS",
            &a.cell_max_connections,
            1000,
            1_000_000,
        )? as u64;
        let director_url = match opt(&a.director_url) {
            Some(u) => Some(origin("ORCA_RELAY_DIRECTOR_URL", &u)?),
            None => None,
        };
        if roles.cell && !roles.director && director_url.is_none() {
            return err("ORCA_RELAY_DIRECTOR_URL is required for role cell");
        }
        let cells = match opt(&a.cells) {
            None => Vec::new(),
            Some(text) => parse_cells(&text, &regions)?,
        };
        let trusted_proxy_hops =
            int_in("ORCA_RELAY_TRUSTED_PROXY_HOPS", &a.trusted_proxy_hops, 0, 8)? as usize;

        let lane = |prefix: &str,
                    c: &str,
                    q: &str,
                    w: &str,
                    r: &str,
                    r_max: i64|
         -> Result<LaneConfig, ConfigError> {
            Ok(LaneConfig {
                concurrency: int_in(&format!("{prefix}_CONCURRENCY"), c, 1, 100)? as usize,
                queue_max: int_in(&format!("{prefix}_QUEUE_MAX"), q, 1, 4096)? as usize,
                wait_ms: int_in(&format!("{prefix}_WAIT_MS"), w, 1, 30_000)? as u64,
                retry_after_s: int_in(&format!("{prefix}_RETRY_AFTER_SECONDS"), r, 1, r_max)?
                    as u64,
            })
        };
        let placement_lane = lane(
            "ORCA_RELAY_PUBLIC_ASSIGNMENT",
            &a.public_assignment_concurrency,
            &a.public_assignment_queue_max,
            &a.public_assignment_wait_ms,
            &a.public_assignment_retry_after_seconds,
            300,
        )?;
        let sticky_lane = lane(
            "ORCA_RELAY_PUBLIC_STICKY",
            &a.public_sticky_concurrency,
            &a.public_sticky_queue_max,
            &a.public_sticky_wait_ms,
            &a.public_sticky_retry_after_seconds,
            60,
        )?;
        if roles.director
            && is_postgres
            && placement_lane.concurrency + sticky_lane.concurrency + 1 > database_pool_max
        {
            return err("sticky and placement admission together must fit the database pool");
        }
        let metrics_listen = match opt(&a.metrics_listen) {
            Some(s) => Some(
                s.trim()
                    .parse()
                    .or_else(|_| err("ORCA_RELAY_METRICS_LISTEN must be a socket address"))?,
            ),
            None => None,
        };
        let readiness_sql_grace_ms = int_in(
            "ORCA_RELAY_READINESS_SQL_GRACE_MS",
            &a.readiness_sql_grace_ms,
            0,
            3_600_000,
        )? as u64;
        let shutdown_grace_ms = int_in(
            "ORCA_RELAY_SHUTDOWN_GRACE_MS",
            &a.shutdown_grace_ms,
            0,
            8000,
        )? as u64;

        let region_rehome_poll_ms = int_in(
            "ORCA_RELAY_REGION_REHOME_POLL_MS",
            &a.region_rehome_poll_ms,
            100,
            600_000,
        )?;
        let sweep_interval_ms = int_in(
            "ORCA_RELAY_SWEEP_INTERVAL_MS",
            &a.sweep_interval_ms,
            1000,
            600_000,
        )?;

        let push = parse_push(a, &public_url, roles)?;
        if let Some(t) = &tls {
            // The origins this listener answers for must be covered by what it serves.
            t.check_origin("ORCA_RELAY_PUBLIC_URL", &public_url)?;
            if opt(&a.cell_url).is_some() && roles.cell {
                t.check_origin("ORCA_RELAY_CELL_URL", &cell_url)?;
            }
        }

        // Secrets: generated only in the single-node shape, required otherwise.
        let single_node = roles == Roles::ALL && !is_postgres;
        let mut secrets_file = None;
        if single_node {
            let missing = secrets.assignment_signing_key.is_none()
                || secrets.self_hosted_key.is_none()
                || secrets.admin_token.is_none()
                || secrets.cluster_key.is_none();
            if missing {
                let (file, path) = load_or_create_secrets(&data_dir)?;
                secrets
                    .assignment_signing_key
                    .get_or_insert(file.assignment_signing_key);
                secrets.self_hosted_key.get_or_insert(file.self_hosted_key);
                secrets.admin_token.get_or_insert(file.admin_token);
                secrets.cluster_key.get_or_insert(file.cluster_key);
                secrets_file = Some(path);
            }
        } else {
            let first_role = |needs_director_or_cell: bool| -> &'static str {
                if needs_director_or_cell {
                    if roles.director {
                        "director"
                    } else {
                        "cell"
                    }
                } else {
                    roles.names()[0]
                }
            };
            let dc = roles.director || roles.cell;
            if dc && secrets.assignment_signing_key.is_none() {
                return err(format!(
                    "ORCA_RELAY_ASSIGNMENT_SIGNING_KEY is required for role {}",
                    first_role(true)
                ));
            }
            if dc && secrets.cluster_key.is_none() {
                return err(format!(
                    "ORCA_RELAY_CLUSTER_KEY is required for role {}",
                    first_role(true)
                ));
            }
            if secrets.admin_token.is_none() {
                return err(format!(
                    "ORCA_RELAY_ADMIN_TOKEN is required for role {}",
                    first_role(false)
                ));
            }
        }

        Ok(Config {
            roles,
            listen,
            public_url,
            database_url,
            database_pool_max,
            data_dir,
            secrets,
            secrets_file,
            auth_issuer,
            jwks_url,
            cell_id,
            cell_url,
            region,
            regions,
            cell_capacity,
            hard_cap,
            max_connections,
            director_url,
            cells,
            trusted_proxy_hops,
            placement_lane,
            sticky_lane,
            metrics_listen,
            readiness_sql_grace_ms,
            shutdown_grace_ms,
            region_rehome_poll_ms,
            sweep_interval_ms,
            url_defaults: (
                opt(&a.public_url).is_none(),
                opt(&a.cell_url).is_none(),
                opt(&a.push_public_url).is_none(),
            ),
            push,
            tls,
            extra_ca,
            url_base,
        })
    }

    /// After binding port 0, the default URLs name the real port.
    pub fn adopt_bound_port(&mut self, port: u16) {
        let (public, cell, push) = self.url_defaults;
        if public {
            self.public_url = if port == 443 && self.tls.is_some() {
                self.url_base.clone()
            } else {
                format!("{}:{port}", self.url_base)
            };
        }
        if cell {
            self.cell_url = self.public_url.clone();
        }
        if push {
            self.push.public_url = self.public_url.clone();
        }
    }

    pub fn database_kind(&self) -> &'static str {
        if self.database_url.starts_with("postgres") {
            "postgres"
        } else {
            "sqlite"
        }
    }
}

/// `ORCA_RELAY_CELLS`: a JSON array of cells, each checked against `regions`; every error names
/// the variable. Public as the fuzzing entry of `fuzz/fuzz_targets/cells_config.rs`.
pub fn parse_cells(text: &str, regions: &[String]) -> Result<Vec<CellSpec>, ConfigError> {
    // Strict like every other JSON the relay reads: each cell an object with exactly its keys, no
    // `null` optionals, no duplicate keys (a plain serde derive would take a cell given as an array).
    let cells: Vec<CellSpec> = crate::contract::strict::parse_value(text.as_bytes())
        .and_then(crate::contract::strict::from_value)
        .or_else(|e| {
            err(format!(
                "ORCA_RELAY_CELLS must be a JSON array of cells: {e}"
            ))
        })?;
    for c in &cells {
        if !is_cell_id(&c.id) || c.id == "director" {
            return err("ORCA_RELAY_CELLS has an invalid cell id");
        }
        if check_origin(&c.url).is_err() {
            return err("ORCA_RELAY_CELLS has a cell url that is not a canonical origin");
        }
        if !regions.contains(&c.region) {
            return err("ORCA_RELAY_CELLS names a region outside ORCA_RELAY_REGIONS");
        }
        if !(1..=1_000_000).contains(&c.capacity_requests) {
            return err("ORCA_RELAY_CELLS capacityRequests must be in 1..1000000");
        }
        match (c.connection_hard_cap, c.connection_unobserved_bound) {
            (None, None) => {}
            (Some(cap), Some(b))
                if (200..=1_000_000).contains(&cap) && (0..=cap - 101).contains(&b) => {}
            _ => {
                return err(
                    "ORCA_RELAY_CELLS connection cap and bound must be set together and in range",
                )
            }
        }
        if let Some(s) = &c.initial_state {
            if !matches!(s.as_str(), "general" | "migration-only" | "existing-only") {
                return err("ORCA_RELAY_CELLS initialState must be general, migration-only or existing-only");
            }
        }
    }
    Ok(cells)
}

fn parse_push(a: &ServeArgs, public_url: &str, roles: Roles) -> Result<PushConfig, ConfigError> {
    let public = match opt(&a.push_public_url) {
        Some(u) => origin("ORCA_PUSH_PUBLIC_URL", &u)?,
        None => public_url.to_string(),
    };
    let mode = match a.push_mode.trim() {
        "" | "active" => PushMode::Active,
        "validation" => {
            if roles
                != (Roles {
                    push: true,
                    ..Roles::default()
                })
            {
                return err("ORCA_PUSH_MODE=validation requires ORCA_RELAY_ROLE=push");
            }
            PushMode::Validation
        }
        _ => return err("ORCA_PUSH_MODE must be active or validation"),
    };
    let apns = match (
        opt(&a.push_apns_key),
        opt(&a.push_apns_key_id),
        opt(&a.push_apple_team_id),
    ) {
        (None, None, None) => None,
        (Some(key), Some(id), Some(team)) => {
            let ten = |s: &str| {
                s.len() == 10
                    && s.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
            };
            if !key.contains("-----BEGIN") {
                return err("ORCA_PUSH_APNS_KEY must be PEM text");
            }
            if !ten(&id) {
                return err("ORCA_PUSH_APNS_KEY_ID must be 10 characters of [A-Z0-9]");
            }
            if !ten(&team) {
                return err("ORCA_PUSH_APPLE_TEAM_ID must be 10 characters of [A-Z0-9]");
            }
            Some(ApnsConfig {
                key_pem: key,
                key_id: id,
                team_id: team,
            })
        }
        _ => {
            return err(
                "ORCA_PUSH_APNS_KEY, ORCA_PUSH_APNS_KEY_ID and ORCA_PUSH_APPLE_TEAM_ID must be configured together",
            )
        }
    };
    // push.md §1: a whitespace-only ORCA_PUSH_* value is unset, so a blank topic is the default.
    let topic = match a.push_apns_topic.trim() {
        "" => DEFAULT_APNS_TOPIC.to_string(),
        t => t.to_string(),
    };
    if !(1..=255).contains(&topic.chars().count()) {
        return err("ORCA_PUSH_APNS_TOPIC must be 1..255 characters");
    }
    let fcm = match (opt(&a.push_fcm_project_id), opt(&a.push_fcm_credentials)) {
        (None, None) => None,
        (Some(project), Some(path)) => {
            let ok = (4..=64).contains(&project.len())
                && project
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return err("ORCA_PUSH_FCM_PROJECT_ID must match ^[a-z0-9-]{4,64}$");
            }
            Some(read_service_account(&project, &path)?)
        }
        _ => return err(
            "ORCA_PUSH_FCM_PROJECT_ID and ORCA_PUSH_FCM_CREDENTIALS must be configured together",
        ),
    };
    let apns_base_url = match opt(&a.push_apns_base_url) {
        Some(u) => Some(origin("ORCA_PUSH_APNS_BASE_URL", &u)?),
        None => None,
    };
    let fcm_base_url = match opt(&a.push_fcm_base_url) {
        Some(u) => origin("ORCA_PUSH_FCM_BASE_URL", &u)?,
        None => "https://fcm.googleapis.com".to_string(),
    };
    let oauth_token_url = match opt(&a.push_oauth_token_url) {
        Some(u) => absolute_url("ORCA_PUSH_OAUTH_TOKEN_URL", &u)?,
        None => "https://oauth2.googleapis.com/token".to_string(),
    };
    Ok(PushConfig {
        public_url: public,
        mode,
        apns,
        apns_topic: topic,
        fcm,
        apns_base_url,
        fcm_base_url,
        oauth_token_url,
    })
}

fn read_service_account(project_id: &str, path: &str) -> Result<FcmConfig, ConfigError> {
    #[derive(Deserialize)]
    struct Sa {
        #[serde(rename = "type")]
        kind: Option<String>,
        client_email: Option<String>,
        private_key: Option<String>,
        private_key_id: Option<String>,
    }
    let bad = || err("ORCA_PUSH_FCM_CREDENTIALS must name a readable service-account JSON file");
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(_) => return bad(),
    };
    let sa: Sa = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(_) => return bad(),
    };
    if sa.kind.as_deref().is_some_and(|k| k != "service_account") {
        return bad();
    }
    let email = sa.client_email.filter(|s| !s.is_empty());
    let key = sa
        .private_key
        .filter(|s| s.contains("-----BEGIN") && s.contains("PRIVATE KEY"));
    match (email, key) {
        (Some(client_email), Some(private_key_pem)) => Ok(FcmConfig {
            project_id: project_id.to_string(),
            client_email,
            private_key_pem,
            private_key_id: sa.private_key_id.filter(|s| !s.is_empty()),
        }),
        _ => bad(),
    }
}

#[cfg(test)]
mod cells_tests {
    use super::parse_cells;

    const REGIONS: &[&str] = &["us-central1"];

    fn parse(text: &str) -> Result<usize, String> {
        let regions: Vec<String> = REGIONS.iter().map(|r| r.to_string()).collect();
        parse_cells(text, &regions)
            .map(|c| c.len())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn cells_json_is_strict() {
        let ok = r#"[{"id":"c1","url":"http://127.0.0.1:9001","region":"us-central1","capacityRequests":10}]"#;
        assert_eq!(parse(ok), Ok(1));
        for bad in [
            // a cell as an array (fields by position)
            r#"[["c1","http://127.0.0.1:9001","us-central1",10]]"#,
            // null for an optional field
            r#"[{"id":"c1","url":"http://127.0.0.1:9001","region":"us-central1","capacityRequests":10,"initialState":null}]"#,
            // duplicate key
            r#"[{"id":"c1","id":"c2","url":"http://127.0.0.1:9001","region":"us-central1","capacityRequests":10}]"#,
            // unknown key
            r#"[{"id":"c1","url":"http://127.0.0.1:9001","region":"us-central1","capacityRequests":10,"x":1}]"#,
            // top level not an array
            r#"{"id":"c1"}"#,
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(
                e.contains("ORCA_RELAY_CELLS must be a JSON array of cells"),
                "{bad}: {e}"
            );
        }
    }
}
