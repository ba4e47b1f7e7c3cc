//! Every setting of `orca-relay serve`, validated once into typed values.
//!
//! [`settings::SETTINGS`] is the one table of settings: each has an environment variable, a flag
//! and a key of the optional TOML file (precedence default < file < env < flag, see [`layers`]).
//! Values arrive as text and are checked here, so an invalid value stops start-up with one line
//! that names the variable and the rule — clap's own type errors would not say which was wrong.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::contract::validate::check_origin;
pub use crate::flags::ConfigError;
pub(crate) use crate::flags::{err, int_in, opt};

mod args;
mod cells;
pub mod docs;
pub mod env_scan;
pub mod file;
pub mod layers;
mod push;
mod secrets;
pub mod settings;
mod steps;

pub use args::ServeArgs;
pub use cells::parse_cells;
pub use secrets::read_secrets_file;
pub use steps::database as database_settings;

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

/// `ORCA_PUSH_APNS_TOPIC` when unset (docs/configuration.md).
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

/// An admission lane's limits (docs/configuration.md / docs/reference/http.md).
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
    /// Read-only bearer for /metrics and the dashboard's reads (never an admin action).
    pub metrics_token: Option<String>,
    pub cluster_key: Option<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets { <redacted> }")
    }
}

/// The validated configuration of one process (its `Debug` hides the metrics token).
#[derive(Clone)]
pub struct Config {
    pub roles: Roles,
    pub listen: SocketAddr,
    pub public_url: String,
    pub database_url: String,
    pub database_pool_max: usize,
    pub data_dir: PathBuf,
    pub secrets: Secrets,
    /// Read-only bearer for `/metrics` (`ORCA_RELAY_METRICS_TOKEN`); `None` = not configured.
    pub metrics_token: Option<String>,
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

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("roles", &self.roles)
            .field("listen", &self.listen)
            .field("public_url", &self.public_url)
            .field("database_url", &self.database_url)
            .field("database_pool_max", &self.database_pool_max)
            .field("data_dir", &self.data_dir)
            .field("secrets", &self.secrets)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<set>"),
            )
            .field("secrets_file", &self.secrets_file)
            .field("auth_issuer", &self.auth_issuer)
            .field("jwks_url", &self.jwks_url)
            .field("cell_id", &self.cell_id)
            .field("cell_url", &self.cell_url)
            .field("region", &self.region)
            .field("regions", &self.regions)
            .field("cell_capacity", &self.cell_capacity)
            .field("hard_cap", &self.hard_cap)
            .field("max_connections", &self.max_connections)
            .field("director_url", &self.director_url)
            .field("cells", &self.cells)
            .field("trusted_proxy_hops", &self.trusted_proxy_hops)
            .field("placement_lane", &self.placement_lane)
            .field("sticky_lane", &self.sticky_lane)
            .field("metrics_listen", &self.metrics_listen)
            .field("readiness_sql_grace_ms", &self.readiness_sql_grace_ms)
            .field("shutdown_grace_ms", &self.shutdown_grace_ms)
            .field("region_rehome_poll_ms", &self.region_rehome_poll_ms)
            .field("sweep_interval_ms", &self.sweep_interval_ms)
            .field("push", &self.push)
            .field("tls", &self.tls)
            .field("extra_ca", &self.extra_ca)
            .field("url_base", &self.url_base)
            .field("url_defaults", &self.url_defaults)
            .finish()
    }
}

pub(super) fn origin(var: &str, v: &str) -> Result<String, ConfigError> {
    match check_origin(v) {
        Ok(()) => Ok(v.to_string()),
        Err(rule) => err(format!("{var} {rule}")),
    }
}

/// An absolute `https` URL, or `http` on a loopback host.
pub(super) fn absolute_url(var: &str, v: &str) -> Result<String, ConfigError> {
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

impl Config {
    /// Validates `args`; in the single-node shape also loads or generates the secrets file
    /// (file-system work: call before the runtime starts or from a blocking context).
    pub fn from_args(a: &ServeArgs) -> Result<Config, ConfigError> {
        Config::from_args_in(a, steps::Mode::Serve)
    }

    /// Validates `args` exactly like [`Config::from_args`] but creates nothing: no data dir, no
    /// secrets file, no ACME cache (`orca-relay config check`). Secrets a single node would
    /// generate stay `None`.
    pub fn check_args(a: &ServeArgs) -> Result<Config, ConfigError> {
        Config::from_args_in(a, steps::Mode::CheckOnly)
    }

    fn from_args_in(a: &ServeArgs, mode: steps::Mode) -> Result<Config, ConfigError> {
        let roles = steps::roles(a)?;
        let listen = steps::listen(a)?;
        let data_dir = PathBuf::from(a.data_dir.trim());
        let create_dirs = mode == steps::Mode::Serve;
        let tls = crate::tls::parse_settings_in(&a.tls, &data_dir, create_dirs)?;
        let extra_ca = crate::tls::parse_extra_ca(&a.tls)?;
        let url_base = match &tls {
            Some(t) => format!("https://{}", t.default_host()),
            None => "http://127.0.0.1".to_string(),
        };
        let public_url = match opt(&a.public_url) {
            Some(u) => origin("ORCA_RELAY_PUBLIC_URL", &u)?,
            None if tls.is_some() && listen.port() == 443 => url_base.clone(),
            None => format!("{url_base}:{}", listen.port()),
        };
        let (database_url, database_pool_max) = steps::database(a)?;
        let is_postgres = database_url.starts_with("postgres");
        let (mut secrets, metrics_token) = steps::given_secrets(a)?;
        let (auth_issuer, jwks_url) = steps::auth(a)?;
        let cell = steps::cell(a, &public_url)?;
        let (director_url, cells) = steps::cluster(a, roles, &cell.regions)?;
        let trusted_proxy_hops =
            int_in("ORCA_RELAY_TRUSTED_PROXY_HOPS", &a.trusted_proxy_hops, 0, 8)? as usize;
        let (placement_lane, sticky_lane) = steps::lanes(a, roles, is_postgres, database_pool_max)?;
        let timers = steps::timers(a)?;
        let push = push::parse_push(a, &public_url, roles)?;
        if let Some(t) = &tls {
            // The origins this listener answers for must be covered by what it serves.
            t.check_origin("ORCA_RELAY_PUBLIC_URL", &public_url)?;
            if opt(&a.cell_url).is_some() && roles.cell {
                t.check_origin("ORCA_RELAY_CELL_URL", &cell.cell_url)?;
            }
        }
        let secrets_file =
            steps::complete_secrets(&mut secrets, roles, is_postgres, &data_dir, mode)?;
        Ok(Config {
            roles,
            listen,
            public_url,
            database_url,
            database_pool_max,
            data_dir,
            secrets,
            metrics_token,
            secrets_file,
            auth_issuer,
            jwks_url,
            cell_id: cell.cell_id,
            cell_url: cell.cell_url,
            region: cell.region,
            regions: cell.regions,
            cell_capacity: cell.cell_capacity,
            hard_cap: cell.hard_cap,
            max_connections: cell.max_connections,
            director_url,
            cells,
            trusted_proxy_hops,
            placement_lane,
            sticky_lane,
            metrics_listen: timers.metrics_listen,
            readiness_sql_grace_ms: timers.readiness_sql_grace_ms,
            shutdown_grace_ms: timers.shutdown_grace_ms,
            region_rehome_poll_ms: timers.region_rehome_poll_ms,
            sweep_interval_ms: timers.sweep_interval_ms,
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
