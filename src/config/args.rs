//! The flags (and environment variables) of `orca-relay serve`; [`super::settings`] describes each.

use clap::Args;

use super::DEFAULT_APNS_TOPIC;

/// The flags (and environment variables) of `orca-relay serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Optional TOML file of settings (below environment variables and flags).
    #[arg(long, env = "ORCA_RELAY_CONFIG", value_name = "PATH")]
    pub config: Option<String>,
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
    /// Read-only bearer for `/metrics`; 32..256 visible ASCII chars.
    #[arg(long, env = "ORCA_RELAY_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
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
    /// Idle-rehome worker poll period, 100..600000 ms, jittered ±20 % (docs/reference/http.md says 6000;
    /// shorter periods are for tests and benchmarks).
    #[arg(long, env = "ORCA_RELAY_REGION_REHOME_POLL_MS", default_value = "6000")]
    pub region_rehome_poll_ms: String,
    /// Director sweep period, 1000..600000 ms, jittered ±20 % (ARCHITECTURE.md says 30000;
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
