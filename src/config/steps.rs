//! The validation steps of [`super::Config::from_args`], in the order start-up checks them (the
//! first broken rule is the one reported).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::secrets::{
    check_admin_token, check_metrics_token, check_self_hosted_key, check_signing_key,
    load_or_create_secrets, load_secrets,
};
use super::{
    absolute_url, err, int_in, opt, origin, parse_cells, CellSpec, ConfigError, HardCap,
    LaneConfig, Roles, Secrets, ServeArgs,
};
use crate::contract::validate::is_cell_id;

/// Whether validation may touch the file system (create the data dir, the secrets file, the ACME
/// cache): `serve` may, `config check` must not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Serve,
    CheckOnly,
}

pub(super) fn roles(a: &ServeArgs) -> Result<Roles, ConfigError> {
    match Roles::parse(&a.role) {
        Some(r) => Ok(r),
        None => err("ORCA_RELAY_ROLE must be all or a comma list of director, cell, push"),
    }
}

pub(super) fn listen(a: &ServeArgs) -> Result<SocketAddr, ConfigError> {
    a.listen
        .trim()
        .parse()
        .or_else(|_| err("ORCA_RELAY_LISTEN must be a socket address"))
}

/// `ORCA_RELAY_DATABASE_URL` (or its default under the data dir) and the pool size: everything
/// `migrate` reads.
pub fn database(a: &ServeArgs) -> Result<(String, usize), ConfigError> {
    let data_dir = PathBuf::from(a.data_dir.trim());
    let url = match opt(&a.database_url) {
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
    let pool = int_in("ORCA_RELAY_DATABASE_POOL_MAX", &a.database_pool_max, 1, 100)? as usize;
    Ok((url, pool))
}

/// The secrets given explicitly, each checked against its rule.
pub(super) fn given_secrets(a: &ServeArgs) -> Result<(Secrets, Option<String>), ConfigError> {
    let secrets = Secrets {
        assignment_signing_key: opt(&a.assignment_signing_key),
        self_hosted_key: opt(&a.self_hosted_key),
        admin_token: opt(&a.admin_token),
        metrics_token: opt(&a.metrics_token),
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
    let metrics_token = opt(&a.metrics_token);
    if let Some(k) = &metrics_token {
        check_metrics_token(k)?;
    }
    Ok((secrets, metrics_token))
}

/// The external host-token issuer: both or neither.
pub(super) fn auth(a: &ServeArgs) -> Result<(Option<String>, Option<String>), ConfigError> {
    let auth_issuer = opt(&a.auth_issuer);
    let jwks_url = opt(&a.jwks_url);
    if auth_issuer.is_some() != jwks_url.is_some() {
        return err("ORCA_RELAY_AUTH_ISSUER and ORCA_RELAY_JWKS_URL must be set together");
    }
    if let Some(u) = &jwks_url {
        absolute_url("ORCA_RELAY_JWKS_URL", u)?;
    }
    Ok((auth_issuer, jwks_url))
}

/// This process's cell: id, origin, regions and capacity.
pub(super) struct CellPart {
    pub cell_id: String,
    pub cell_url: String,
    pub region: String,
    pub regions: Vec<String>,
    pub cell_capacity: i64,
    pub hard_cap: Option<HardCap>,
    pub max_connections: u64,
}

pub(super) fn cell(a: &ServeArgs, public_url: &str) -> Result<CellPart, ConfigError> {
    let cell_id = a.cell_id.trim().to_string();
    if !is_cell_id(&cell_id) || cell_id == "director" {
        return err(
            "ORCA_RELAY_CELL_ID must be 1..128 characters of [A-Za-z0-9_.-] and not director",
        );
    }
    let cell_url = match opt(&a.cell_url) {
        Some(u) => origin("ORCA_RELAY_CELL_URL", &u)?,
        None => public_url.to_string(),
    };
    let (region, regions) = regions(a)?;
    let cell_capacity = int_in("ORCA_RELAY_CELL_CAPACITY", &a.cell_capacity, 1, 1_000_000)?;
    let hard_cap = hard_cap(a)?;
    let max_connections = int_in(
        "ORCA_RELAY_CELL_MAX_CONNECTIONS",
        &a.cell_max_connections,
        1000,
        1_000_000,
    )? as u64;
    Ok(CellPart {
        cell_id,
        cell_url,
        region,
        regions,
        cell_capacity,
        hard_cap,
        max_connections,
    })
}

fn regions(a: &ServeArgs) -> Result<(String, Vec<String>), ConfigError> {
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
    Ok((region, regions))
}

fn hard_cap(a: &ServeArgs) -> Result<Option<HardCap>, ConfigError> {
    match (
        opt(&a.cell_connection_hard_cap),
        opt(&a.cell_connection_unobserved_bound),
    ) {
        (None, None) => Ok(None),
        (Some(c), Some(b)) => {
            let cap = int_in("ORCA_RELAY_CELL_CONNECTION_HARD_CAP", &c, 200, 1_000_000)?;
            let bound = int_in(
                "ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND",
                &b,
                0,
                cap - 101,
            )?;
            Ok(Some(HardCap {
                cap: cap as u64,
                unobserved_bound: bound as u64,
            }))
        }
        (Some(_), None) => err(
            "ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND is required with ORCA_RELAY_CELL_CONNECTION_HARD_CAP",
        ),
        (None, Some(_)) => err(
            "ORCA_RELAY_CELL_CONNECTION_HARD_CAP is required with ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND",
        ),
    }
}

/// The director this cell reports to, and the cells a director registers.
pub(super) fn cluster(
    a: &ServeArgs,
    roles: Roles,
    regions: &[String],
) -> Result<(Option<String>, Vec<CellSpec>), ConfigError> {
    let director_url = match opt(&a.director_url) {
        Some(u) => Some(origin("ORCA_RELAY_DIRECTOR_URL", &u)?),
        None => None,
    };
    if roles.cell && !roles.director && director_url.is_none() {
        return err("ORCA_RELAY_DIRECTOR_URL is required for role cell");
    }
    let cells = match opt(&a.cells) {
        None => Vec::new(),
        Some(text) => parse_cells(&text, regions)?,
    };
    Ok((director_url, cells))
}

fn lane(prefix: &str, [c, q, w, r]: [&str; 4], r_max: i64) -> Result<LaneConfig, ConfigError> {
    Ok(LaneConfig {
        concurrency: int_in(&format!("{prefix}_CONCURRENCY"), c, 1, 100)? as usize,
        queue_max: int_in(&format!("{prefix}_QUEUE_MAX"), q, 1, 4096)? as usize,
        wait_ms: int_in(&format!("{prefix}_WAIT_MS"), w, 1, 30_000)? as u64,
        retry_after_s: int_in(&format!("{prefix}_RETRY_AFTER_SECONDS"), r, 1, r_max)? as u64,
    })
}

/// The placement and sticky admission lanes; on Postgres both must fit the pool.
pub(super) fn lanes(
    a: &ServeArgs,
    roles: Roles,
    is_postgres: bool,
    pool_max: usize,
) -> Result<(LaneConfig, LaneConfig), ConfigError> {
    let placement = lane(
        "ORCA_RELAY_PUBLIC_ASSIGNMENT",
        [
            &a.public_assignment_concurrency,
            &a.public_assignment_queue_max,
            &a.public_assignment_wait_ms,
            &a.public_assignment_retry_after_seconds,
        ],
        300,
    )?;
    let sticky = lane(
        "ORCA_RELAY_PUBLIC_STICKY",
        [
            &a.public_sticky_concurrency,
            &a.public_sticky_queue_max,
            &a.public_sticky_wait_ms,
            &a.public_sticky_retry_after_seconds,
        ],
        60,
    )?;
    if roles.director && is_postgres && placement.concurrency + sticky.concurrency + 1 > pool_max {
        return err("sticky and placement admission together must fit the database pool");
    }
    Ok((placement, sticky))
}

/// Periods and graces, in the order of the table.
pub(super) struct Timers {
    pub metrics_listen: Option<SocketAddr>,
    pub readiness_sql_grace_ms: u64,
    pub shutdown_grace_ms: u64,
    pub region_rehome_poll_ms: i64,
    pub sweep_interval_ms: i64,
}

pub(super) fn timers(a: &ServeArgs) -> Result<Timers, ConfigError> {
    let metrics_listen = match opt(&a.metrics_listen) {
        Some(s) => Some(
            s.trim()
                .parse()
                .or_else(|_| err("ORCA_RELAY_METRICS_LISTEN must be a socket address"))?,
        ),
        None => None,
    };
    Ok(Timers {
        metrics_listen,
        readiness_sql_grace_ms: int_in(
            "ORCA_RELAY_READINESS_SQL_GRACE_MS",
            &a.readiness_sql_grace_ms,
            0,
            3_600_000,
        )? as u64,
        shutdown_grace_ms: int_in(
            "ORCA_RELAY_SHUTDOWN_GRACE_MS",
            &a.shutdown_grace_ms,
            0,
            8000,
        )? as u64,
        region_rehome_poll_ms: int_in(
            "ORCA_RELAY_REGION_REHOME_POLL_MS",
            &a.region_rehome_poll_ms,
            100,
            600_000,
        )?,
        sweep_interval_ms: int_in(
            "ORCA_RELAY_SWEEP_INTERVAL_MS",
            &a.sweep_interval_ms,
            1000,
            600_000,
        )?,
    })
}

/// Secrets are generated only in the single-node shape (all roles, SQLite) and required otherwise.
/// Returns the secrets file used, if any. In [`Mode::CheckOnly`] an absent file stays absent.
pub(super) fn complete_secrets(
    secrets: &mut Secrets,
    roles: Roles,
    is_postgres: bool,
    data_dir: &Path,
    mode: Mode,
) -> Result<Option<PathBuf>, ConfigError> {
    if roles == Roles::ALL && !is_postgres {
        let missing = secrets.assignment_signing_key.is_none()
            || secrets.self_hosted_key.is_none()
            || secrets.admin_token.is_none()
            || secrets.cluster_key.is_none();
        if !missing {
            return Ok(None);
        }
        let loaded = match mode {
            Mode::Serve => Some(load_or_create_secrets(data_dir)?),
            Mode::CheckOnly => load_secrets(data_dir)?,
        };
        let Some((file, path)) = loaded else {
            return Ok(None);
        };
        secrets
            .assignment_signing_key
            .get_or_insert(file.assignment_signing_key);
        secrets.self_hosted_key.get_or_insert(file.self_hosted_key);
        secrets.admin_token.get_or_insert(file.admin_token);
        secrets.cluster_key.get_or_insert(file.cluster_key);
        return Ok(Some(path));
    }
    let dc = roles.director || roles.cell;
    let first = if !dc {
        roles.names()[0]
    } else if roles.director {
        "director"
    } else {
        "cell"
    };
    if dc && secrets.assignment_signing_key.is_none() {
        return err(format!(
            "ORCA_RELAY_ASSIGNMENT_SIGNING_KEY is required for role {first}"
        ));
    }
    if dc && secrets.cluster_key.is_none() {
        return err(format!(
            "ORCA_RELAY_CLUSTER_KEY is required for role {first}"
        ));
    }
    if secrets.admin_token.is_none() {
        return err(format!(
            "ORCA_RELAY_ADMIN_TOKEN is required for role {}",
            roles.names()[0]
        ));
    }
    Ok(None)
}
