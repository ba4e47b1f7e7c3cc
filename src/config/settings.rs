//! The settings table: every setting of `orca-relay serve` once, with its environment variable,
//! flag, file key, type, default, allowed range, the roles that read it, whether it is secret, and
//! one line of help. The flags themselves are [`super::ServeArgs`] (a unit test keeps the two in
//! step); `docs/configuration.md` and `deploy/orca-relay.toml` are generated from this table.
//!
//! Naming: the file key is the setting's name (snake_case); the flag is the name with `-` for
//! `_`; the variable is `ORCA_RELAY_` (push gateway: `ORCA_PUSH_`) plus the name in upper case.

/// The value shape of a setting, as the file must spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Free text.
    Text,
    /// A decimal integer (a TOML integer in the file).
    Int,
    /// `0`/`1`/`true`/`false` (a TOML boolean in the file).
    Bool,
    /// A comma list (a string, or an array of strings, in the file).
    List,
    /// An origin or URL.
    Url,
    /// A socket address `IP:PORT`.
    Addr,
    /// A file-system path.
    Path,
    /// JSON text.
    Json,
}

impl Kind {
    /// The type column of the documentation.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Text => "string",
            Kind::Int => "integer",
            Kind::Bool => "boolean",
            Kind::List => "list",
            Kind::Url => "URL",
            Kind::Addr => "socket address",
            Kind::Path => "path",
            Kind::Json => "JSON",
        }
    }
}

/// What a setting is when nothing sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingDefault {
    /// This literal value (also clap's default).
    Value(&'static str),
    /// Derived from other settings, described in words.
    Derived(&'static str),
    /// Unset.
    Unset,
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// File key and clap id (snake_case).
    pub name: &'static str,
    pub env: &'static str,
    pub kind: Kind,
    pub default: SettingDefault,
    /// Allowed values, in words.
    pub range: &'static str,
    /// The roles that read it (`all` or a comma list).
    pub roles: &'static str,
    /// Secret: never printed, and also read from `<VAR>_FILE` / `<key>_file`.
    pub secret: bool,
    pub help: &'static str,
}

impl Setting {
    /// The command-line flag, e.g. `--database-url`.
    pub fn flag(&self) -> String {
        format!("--{}", self.name.replace('_', "-"))
    }

    /// The variable naming a file that holds a secret's value (`ORCA_RELAY_ADMIN_TOKEN_FILE`).
    pub fn env_file(&self) -> Option<String> {
        self.secret.then(|| format!("{}_FILE", self.env))
    }

    /// The file key naming a file that holds a secret's value (`admin_token_file`).
    pub fn key_file(&self) -> Option<String> {
        self.secret.then(|| format!("{}_file", self.name))
    }
}

/// The setting with this file key / clap id.
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// The setting with this environment variable.
pub fn find_env(var: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.env == var)
}

/// The closest of `candidates` to a misspelled `word`, when it is close enough to be meant.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&word, &c.to_ascii_lowercase()), c))
        .filter(|(score, _)| *score >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

const fn s(
    name: &'static str,
    env: &'static str,
    kind: Kind,
    default: SettingDefault,
    range: &'static str,
    roles: &'static str,
    help: &'static str,
) -> Setting {
    Setting {
        name,
        env,
        kind,
        default,
        range,
        roles,
        secret: false,
        help,
    }
}

const fn secret(
    name: &'static str,
    env: &'static str,
    range: &'static str,
    roles: &'static str,
    help: &'static str,
) -> Setting {
    Setting {
        name,
        env,
        kind: Kind::Text,
        default: SettingDefault::Unset,
        range,
        roles,
        secret: true,
        help,
    }
}

use Kind::{Addr, Bool, Int, Json, List, Path, Text, Url};
use SettingDefault::{Derived, Unset, Value};

const ALL: &str = "all";
const DIRECTOR: &str = "director";
const CELL: &str = "cell";
const PUSH: &str = "push";
const DIRECTOR_CELL: &str = "director, cell";

/// Every setting, in the order of the documentation.
pub static SETTINGS: &[Setting] = &[
    // process shape
    s(
        "role",
        "ORCA_RELAY_ROLE",
        List,
        Value("all"),
        "`all` or a comma list of `director`, `cell`, `push`",
        ALL,
        "Which roles this process runs.",
    ),
    s(
        "listen",
        "ORCA_RELAY_LISTEN",
        Addr,
        Value("127.0.0.1:8080"),
        "IP:PORT (port 0 = any free port)",
        ALL,
        "Socket address of the main listener.",
    ),
    s(
        "public_url",
        "ORCA_RELAY_PUBLIC_URL",
        Url,
        Derived("http://127.0.0.1:<listen port> (https://<host> with TLS)"),
        "an origin; https outside loopback",
        ALL,
        "Canonical public origin of this process.",
    ),
    s(
        "data_dir",
        "ORCA_RELAY_DATA_DIR",
        Path,
        Value("./data"),
        "a directory",
        ALL,
        "Where the SQLite file, generated secrets and ACME cache live.",
    ),
    // database
    s(
        "database_url",
        "ORCA_RELAY_DATABASE_URL",
        Url,
        Derived("sqlite://<data dir>/orca-relay.sqlite3"),
        "`sqlite://PATH`, `sqlite::memory:` or `postgres://…`",
        ALL,
        "The database.",
    ),
    s(
        "database_pool_max",
        "ORCA_RELAY_DATABASE_POOL_MAX",
        Int,
        Value("10"),
        "1..100",
        ALL,
        "Postgres connection pool size.",
    ),
    // secrets
    secret(
        "assignment_signing_key",
        "ORCA_RELAY_ASSIGNMENT_SIGNING_KEY",
        "at least 32 bytes; required for director and cell unless generated",
        DIRECTOR_CELL,
        "Signs assignment leases and self-hosted host tokens.",
    ),
    secret(
        "self_hosted_key",
        "ORCA_RELAY_SELF_HOSTED_KEY",
        "32..256 characters of [A-Za-z0-9_-]",
        DIRECTOR,
        "Bearer for `POST /v1/host-token`.",
    ),
    secret(
        "admin_token",
        "ORCA_RELAY_ADMIN_TOKEN",
        "32..256 visible ASCII characters; always required unless generated",
        ALL,
        "Bearer for the operator routes and /metrics.",
    ),
    secret(
        "metrics_token",
        "ORCA_RELAY_METRICS_TOKEN",
        "32..256 visible ASCII characters",
        ALL,
        "Read-only bearer for /metrics.",
    ),
    secret(
        "cluster_key",
        "ORCA_RELAY_CLUSTER_KEY",
        "at least 32 bytes; required for director and cell unless generated",
        DIRECTOR_CELL,
        "Signs node-to-node cluster tokens.",
    ),
    // external host tokens
    s(
        "auth_issuer",
        "ORCA_RELAY_AUTH_ISSUER",
        Text,
        Unset,
        "set together with jwks_url",
        DIRECTOR_CELL,
        "Issuer of externally minted host tokens.",
    ),
    s(
        "jwks_url",
        "ORCA_RELAY_JWKS_URL",
        Url,
        Unset,
        "an absolute URL; set together with auth_issuer",
        DIRECTOR_CELL,
        "JWKS of the external host-token issuer.",
    ),
    // cell
    s(
        "cell_id",
        "ORCA_RELAY_CELL_ID",
        Text,
        Value("local"),
        "1..128 characters of [A-Za-z0-9_.-], not `director`",
        CELL,
        "This process's cell id.",
    ),
    s(
        "cell_url",
        "ORCA_RELAY_CELL_URL",
        Url,
        Derived("the public URL"),
        "an origin",
        CELL,
        "Origin phones and hosts dial for this cell.",
    ),
    s(
        "region",
        "ORCA_RELAY_REGION",
        Text,
        Value("us-central1"),
        "one of regions",
        ALL,
        "This cell's region.",
    ),
    s(
        "regions",
        "ORCA_RELAY_REGIONS",
        List,
        Value("us-central1,asia-east2"),
        "comma list of [a-z0-9-]{1,64}",
        ALL,
        "Ordered region list; the first is the default region.",
    ),
    s(
        "cell_capacity",
        "ORCA_RELAY_CELL_CAPACITY",
        Int,
        Value("20000"),
        "1..1000000",
        DIRECTOR,
        "Request units of the local cell.",
    ),
    s(
        "cell_connection_hard_cap",
        "ORCA_RELAY_CELL_CONNECTION_HARD_CAP",
        Int,
        Unset,
        "200..1000000; set together with cell_connection_unobserved_bound",
        DIRECTOR_CELL,
        "Hard connection cap of this cell.",
    ),
    s(
        "cell_connection_unobserved_bound",
        "ORCA_RELAY_CELL_CONNECTION_UNOBSERVED_BOUND",
        Int,
        Unset,
        "0..(hard cap - 101); set together with cell_connection_hard_cap",
        DIRECTOR_CELL,
        "Connections the director may place without observing them.",
    ),
    s(
        "cell_max_connections",
        "ORCA_RELAY_CELL_MAX_CONNECTIONS",
        Int,
        Value("100000"),
        "1000..1000000",
        CELL,
        "Open-connection ceiling of an uncapped cell.",
    ),
    s(
        "director_url",
        "ORCA_RELAY_DIRECTOR_URL",
        Url,
        Unset,
        "an origin; required for role cell without director",
        CELL,
        "Director origin a cell reports to.",
    ),
    s(
        "cells",
        "ORCA_RELAY_CELLS",
        Json,
        Unset,
        "JSON array of {id, url, region, capacityRequests, …}",
        DIRECTOR,
        "Cells the director registers at start-up.",
    ),
    s(
        "trusted_proxy_hops",
        "ORCA_RELAY_TRUSTED_PROXY_HOPS",
        Int,
        Value("0"),
        "0..8",
        ALL,
        "Trusted proxies appending to X-Forwarded-For.",
    ),
    // admission lanes
    s(
        "public_assignment_concurrency",
        "ORCA_RELAY_PUBLIC_ASSIGNMENT_CONCURRENCY",
        Int,
        Value("2"),
        "1..100",
        DIRECTOR,
        "Placement lane concurrency.",
    ),
    s(
        "public_assignment_queue_max",
        "ORCA_RELAY_PUBLIC_ASSIGNMENT_QUEUE_MAX",
        Int,
        Value("128"),
        "1..4096",
        DIRECTOR,
        "Placement lane queue length.",
    ),
    s(
        "public_assignment_wait_ms",
        "ORCA_RELAY_PUBLIC_ASSIGNMENT_WAIT_MS",
        Int,
        Value("4000"),
        "1..30000 ms",
        DIRECTOR,
        "Placement lane wait.",
    ),
    s(
        "public_assignment_retry_after_seconds",
        "ORCA_RELAY_PUBLIC_ASSIGNMENT_RETRY_AFTER_SECONDS",
        Int,
        Value("5"),
        "1..300 s",
        DIRECTOR,
        "Placement Retry-After and per-host interval.",
    ),
    s(
        "public_sticky_concurrency",
        "ORCA_RELAY_PUBLIC_STICKY_CONCURRENCY",
        Int,
        Value("1"),
        "1..100",
        DIRECTOR,
        "Sticky lane concurrency.",
    ),
    s(
        "public_sticky_queue_max",
        "ORCA_RELAY_PUBLIC_STICKY_QUEUE_MAX",
        Int,
        Value("64"),
        "1..4096",
        DIRECTOR,
        "Sticky lane queue length.",
    ),
    s(
        "public_sticky_wait_ms",
        "ORCA_RELAY_PUBLIC_STICKY_WAIT_MS",
        Int,
        Value("2000"),
        "1..30000 ms",
        DIRECTOR,
        "Sticky lane wait.",
    ),
    s(
        "public_sticky_retry_after_seconds",
        "ORCA_RELAY_PUBLIC_STICKY_RETRY_AFTER_SECONDS",
        Int,
        Value("2"),
        "1..60 s",
        DIRECTOR,
        "Sticky Retry-After and per-host interval.",
    ),
    // operations
    s(
        "metrics_listen",
        "ORCA_RELAY_METRICS_LISTEN",
        Addr,
        Unset,
        "IP:PORT",
        ALL,
        "Separate unauthenticated /metrics listener.",
    ),
    s(
        "readiness_sql_grace_ms",
        "ORCA_RELAY_READINESS_SQL_GRACE_MS",
        Int,
        Value("180000"),
        "0..3600000 ms",
        ALL,
        "Readiness grace for a database that answered recently.",
    ),
    s(
        "shutdown_grace_ms",
        "ORCA_RELAY_SHUTDOWN_GRACE_MS",
        Int,
        Value("0"),
        "0..8000 ms",
        CELL,
        "Drain grace on SIGTERM.",
    ),
    s(
        "region_rehome_poll_ms",
        "ORCA_RELAY_REGION_REHOME_POLL_MS",
        Int,
        Value("6000"),
        "100..600000 ms",
        DIRECTOR,
        "Idle-rehome worker poll period (jittered ±20 %).",
    ),
    s(
        "sweep_interval_ms",
        "ORCA_RELAY_SWEEP_INTERVAL_MS",
        Int,
        Value("30000"),
        "1000..600000 ms",
        DIRECTOR,
        "Director sweep period (jittered ±20 %).",
    ),
    // push gateway
    s(
        "push_public_url",
        "ORCA_PUSH_PUBLIC_URL",
        Url,
        Derived("the public URL"),
        "an origin",
        PUSH,
        "Push gateway origin bound into host challenges.",
    ),
    s(
        "push_mode",
        "ORCA_PUSH_MODE",
        Text,
        Value("active"),
        "`active` or `validation` (validation: role push only)",
        PUSH,
        "Deliver notifications, or only validate requests.",
    ),
    secret(
        "push_apns_key",
        "ORCA_PUSH_APNS_KEY",
        "PEM text; set together with push_apns_key_id and push_apple_team_id",
        PUSH,
        "APNs P-256 signing key.",
    ),
    s(
        "push_apns_key_id",
        "ORCA_PUSH_APNS_KEY_ID",
        Text,
        Unset,
        "10 characters of [A-Z0-9]",
        PUSH,
        "APNs key id.",
    ),
    s(
        "push_apple_team_id",
        "ORCA_PUSH_APPLE_TEAM_ID",
        Text,
        Unset,
        "10 characters of [A-Z0-9]",
        PUSH,
        "Apple team id.",
    ),
    s(
        "push_apns_topic",
        "ORCA_PUSH_APNS_TOPIC",
        Text,
        Value(super::DEFAULT_APNS_TOPIC),
        "1..255 characters",
        PUSH,
        "APNs topic (the app's bundle id).",
    ),
    s(
        "push_fcm_project_id",
        "ORCA_PUSH_FCM_PROJECT_ID",
        Text,
        Unset,
        "[a-z0-9-]{4,64}; set together with push_fcm_credentials",
        PUSH,
        "FCM project id.",
    ),
    s(
        "push_fcm_credentials",
        "ORCA_PUSH_FCM_CREDENTIALS",
        Path,
        Unset,
        "a readable service-account JSON file",
        PUSH,
        "Path of the FCM service-account JSON file.",
    ),
    s(
        "push_apns_base_url",
        "ORCA_PUSH_APNS_BASE_URL",
        Url,
        Unset,
        "an origin",
        PUSH,
        "APNs origin override (tests, staging).",
    ),
    s(
        "push_fcm_base_url",
        "ORCA_PUSH_FCM_BASE_URL",
        Url,
        Derived("https://fcm.googleapis.com"),
        "an origin",
        PUSH,
        "FCM origin override.",
    ),
    s(
        "push_oauth_token_url",
        "ORCA_PUSH_OAUTH_TOKEN_URL",
        Url,
        Derived("https://oauth2.googleapis.com/token"),
        "an absolute URL",
        PUSH,
        "OAuth token endpoint override.",
    ),
    // TLS
    s(
        "tls_cert",
        "ORCA_RELAY_TLS_CERT",
        Path,
        Unset,
        "PEM certificate chain; set together with tls_key",
        ALL,
        "Certificate of the built-in TLS listener (reloaded on change or SIGHUP).",
    ),
    s(
        "tls_key",
        "ORCA_RELAY_TLS_KEY",
        Path,
        Unset,
        "PEM private key (PKCS#8, PKCS#1 or SEC1)",
        ALL,
        "Private key of tls_cert.",
    ),
    s(
        "tls_reload_interval_ms",
        "ORCA_RELAY_TLS_RELOAD_INTERVAL_MS",
        Int,
        Value("5000"),
        "100..3600000 ms",
        ALL,
        "How often the certificate files are checked for changes.",
    ),
    s(
        "metrics_tls",
        "ORCA_RELAY_METRICS_TLS",
        Bool,
        Value("0"),
        "0, 1, true or false",
        ALL,
        "Serve the separate metrics listener over TLS too.",
    ),
    s(
        "tls_extra_ca",
        "ORCA_RELAY_TLS_EXTRA_CA",
        Path,
        Unset,
        "a PEM file with at least one certificate",
        ALL,
        "Extra CA trusted for cluster traffic and ACME.",
    ),
    s(
        "tls_acme_domains",
        "ORCA_RELAY_TLS_ACME_DOMAINS",
        List,
        Unset,
        "comma list of DNS names; not with tls_cert",
        ALL,
        "Domains to obtain a certificate for over ACME (TLS-ALPN-01).",
    ),
    s(
        "tls_acme_email",
        "ORCA_RELAY_TLS_ACME_EMAIL",
        Text,
        Unset,
        "an e-mail address",
        ALL,
        "Contact e-mail given to the ACME CA.",
    ),
    s(
        "tls_acme_directory",
        "ORCA_RELAY_TLS_ACME_DIRECTORY",
        Url,
        Derived("Let's Encrypt production"),
        "an https URL",
        ALL,
        "ACME directory URL.",
    ),
    s(
        "tls_acme_cache_dir",
        "ORCA_RELAY_TLS_ACME_CACHE_DIR",
        Path,
        Derived("<data dir>/acme"),
        "a directory",
        ALL,
        "Where the ACME account and certificates are kept.",
    ),
    s(
        "tls_acme_renew_before_days",
        "ORCA_RELAY_TLS_ACME_RENEW_BEFORE_DAYS",
        Int,
        Value("30"),
        "1..3650",
        ALL,
        "Renew when the certificate expires within this many days.",
    ),
];

/// Variables under `ORCA_RELAY_`/`ORCA_PUSH_` that are not settings of `serve` but are read
/// elsewhere (other commands, tests, tools); they never draw an unknown-variable warning.
pub const OTHER_VARIABLES: &[&str] = &[
    "ORCA_RELAY_CONFIG",
    "ORCA_RELAY_URL",
    "ORCA_RELAY_ROLL_CELL",
    "ORCA_RELAY_BIN",
    "ORCA_RELAY_BLESS",
    "ORCA_RELAY_TEST_POSTGRES_URL",
    "ORCA_RELAY_REGION_TEST_HOSTS",
];

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[derive(clap::Parser)]
    struct Probe {
        #[command(flatten)]
        args: super::super::ServeArgs,
    }

    /// The table and the clap definitions agree: same ids, variables, flags and defaults.
    #[test]
    fn table_matches_the_flags() {
        let cmd = Probe::command();
        let mut ids = Vec::new();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "config" || id == "help" {
                continue;
            }
            ids.push(id.to_string());
            let s = find(id).unwrap_or_else(|| panic!("{id} is missing from SETTINGS"));
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env.as_deref(), Some(s.env), "{id}");
            assert_eq!(
                arg.get_long().map(|l| format!("--{l}")),
                Some(s.flag()),
                "{id}"
            );
            let dflt: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            match s.default {
                Value(v) => assert_eq!(dflt, vec![v.to_string()], "{id}"),
                Derived(_) | Unset => assert!(dflt.is_empty(), "{id}: {dflt:?}"),
            }
            assert_eq!(s.secret, arg.is_hide_env_values_set(), "{id}");
        }
        assert_eq!(ids.len(), SETTINGS.len(), "a SETTINGS entry has no flag");
    }

    #[test]
    fn names_are_unique_and_variables_follow_the_naming_rule() {
        for (i, s) in SETTINGS.iter().enumerate() {
            assert!(SETTINGS[..i].iter().all(|o| o.name != s.name), "{}", s.name);
            let upper = s.name.to_ascii_uppercase();
            let ok = s.env == format!("ORCA_RELAY_{upper}")
                || upper
                    .strip_prefix("PUSH_")
                    .is_some_and(|rest| s.env == format!("ORCA_PUSH_{rest}"));
            assert!(ok, "{} / {}", s.name, s.env);
        }
    }
}
