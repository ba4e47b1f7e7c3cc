//! Budgets and limits (docs/reference/limits.md, docs/configuration.md). Milliseconds unless named.

pub const RELAY_BODY_MAX: usize = 4096;
/// A request body must arrive completely within this long after the handler starts reading it;
/// a slower one is treated as broken off (`400 invalid_request`, connection closed).
pub const BODY_READ_MS: u64 = 10_000;
/// Plain HTTP connections (WebSocket handshakes up to the 101 included) served at once; above
/// it a new TCP connection is answered `503 server_busy` (see [`BUSY_ANSWERS_MAX`]). Upgraded legs are not counted here but by the
/// cell's connection limits (`ORCA_RELAY_CELL_MAX_CONNECTIONS` or the hard cap), so the open-file
/// limit should exceed that ceiling plus this bound plus the database pool.
pub const HTTP_CONNECTIONS_MAX: usize = 1024;
/// Connections over [`HTTP_CONNECTIONS_MAX`] being answered `503 server_busy` at once. With every
/// serving slot and every answering permit taken the accept loop stops accepting (new connections
/// wait in the kernel's listen backlog) until one frees, so none is accepted and closed without
/// an answer. Counted in `orca_relay_http_connections_refused_total` (`answered`, or `closed` when
/// the client left or sent no request head within [`BUSY_ANSWER_MS`]).
pub const BUSY_ANSWERS_MAX: usize = 64;
/// Time allowed for one such answer, TLS handshake included.
pub const BUSY_ANSWER_MS: u64 = 2_000;
/// Free serving slots (of [`HTTP_CONNECTIONS_MAX`]) below which the process keeps no connection
/// alive: responses other than a `101` carry `Connection: close` (counted in
/// `orca_relay_http_keepalive_declined_total`). Idle keep-alive connections would otherwise hold
/// slots a storm's upgrades need.
pub const KEEPALIVE_FREE_MIN: usize = 256;
/// Most queued sticky requests one slot of the sticky lane grants together, in one transaction
/// (counted by path in `orca_relay_sticky_batch_hosts_total`).
pub const STICKY_BATCH_MAX: usize = 128;
/// TLS handshakes run at once on one listener (the accept limiter); a connection past it waits
/// for a slot, holding no TLS state, at most [`TLS_HANDSHAKE_WAIT_MS`], then it is closed and
/// counted (`orca_relay_tls_handshake_failures_total{reason="busy"}`). Waiting connections count
/// against [`HTTP_CONNECTIONS_MAX`], so the wait is bounded in number as well as in time.
pub const TLS_HANDSHAKES_MAX: usize = 64;
/// Longest wait for a handshake slot (within the 10 s handshake deadline).
pub const TLS_HANDSHAKE_WAIT_MS: u64 = 5_000;
/// Open connections on the separate metrics listener (`ORCA_RELAY_METRICS_LISTEN`); over it a new
/// connection is closed at once and counted (`orca_relay_metrics_listener_refused_total`).
pub const METRICS_CONNECTIONS_MAX: usize = 64;
/// Seconds a connection (main or metrics listener) may take to send a request's headers.
pub const HEADER_READ_TIMEOUT_S: u64 = 10;
pub const PUSH_BODY_MAX: usize = 16384;
pub const HOST_TOKEN_MAX_CHARS: usize = 8192;
pub const SELF_HOSTED_TOKEN_TTL_S: i64 = 900;

pub const FIRST_FRAME_MS: u64 = 2_000;
pub const PROOF_WINDOW_MS: i64 = 10_000;
pub const ACTIVATION_QUEUE_WAIT_MS: u64 = 30_000;
pub const CLOSE_FORCE_MS: u64 = 1_000;
pub const CONTROL_MAX_MESSAGE: usize = 1_048_576;
pub const DATA_MAX_MESSAGE: usize = 8_388_608;
pub const PHONE_MAX_MESSAGE: usize = 8_388_608;
pub const PER_HOST_CONNECTIONS: usize = 8;
pub const HELLO_ACK_LIST_MAX: usize = 8;
pub const ATTACH_DEADLINE_MS: u64 = 10_000;
pub const INVITE_TTL_MS: i64 = 570_000;
pub const INVITE_MAX_ATTEMPTS: i64 = 5;
pub const INVITE_RESERVATION_LEASE_MS: i64 = 15_000;
pub const INVITE_COOLDOWN_MS: i64 = 2_000;
pub const INVITE_MINT_PER_MINUTE: i64 = 30;
pub const RESUME_BASIS_DEADLINE_MS: i64 = 30_000;
pub const RESUME_TTL_MS: i64 = 2_592_000_000;
pub const RESUME_GRACE_MS: i64 = 86_400_000;
pub const EXPIRED_TOKEN_GRACE_MS: i64 = 60_000;
pub const CONTROL_TICK_MS: u64 = 15_000;
pub const CONTROL_SILENCE_MS: i64 = 75_000;
pub const ORPHAN_GRACE_MS: u64 = 30_000;
pub const CONTROL_LEASE_MS: i64 = 6 * 3_600_000;
pub const CONTROL_LEASE_JITTER_MS: i64 = 30 * 60_000;
pub const CONTROL_RENEWAL_INTERVAL_MS: i64 = 30_000;
pub const CONTROL_RENEWAL_REQUEST_MS: i64 = 105_000;
pub const DEFAULT_ACTIVITY_LEASE_MS: i64 = 90_000;
/// How far ahead a control activity's expiry may be set (ARCHITECTURE.md).
pub const CONTROL_ACTIVITY_EXPIRY_MAX_MS: i64 = 120_000;
/// How far ahead any other activity's expiry may be set (ARCHITECTURE.md).
pub const ACTIVITY_EXPIRY_MAX_MS: i64 = 600_000;
/// Bounds of a cell's `connectionHardCap` (docs/reference/http.md).
pub const CONNECTION_HARD_CAP_MIN: i64 = 200;
pub const CONNECTION_HARD_CAP_MAX: i64 = 1_000_000;
pub const RENEWAL_BATCH_FLUSH_MS: u64 = 1_000;
pub const RENEWAL_BATCH_ROWS: usize = 200;
pub const PREAUTH_CELL_MAX: usize = 45;
pub const PREAUTH_SOURCE_MAX: usize = 4;
pub const PREAUTH_ATTEMPTS_PER_WINDOW: u32 = 30;
pub const PREAUTH_WINDOW_MS: i64 = 60_000;
pub const PREAUTH_SOURCES: usize = 4_096;
pub const CONTROL_RESERVE: u64 = 100;
pub const DATA_RESERVE_EXTRA: u64 = 150;
pub const STORE_SHED_WAIT_MS: u64 = 1_000;
pub const SPLICE_LOW_WATER: usize = 64 * 1024;
pub const SPLICE_HIGH_WATER: usize = 256 * 1024;
pub const SPLICE_OVERFLOW_DIRECTION_MAX: usize = 8 * 1024 * 1024 + 256 * 1024;
pub const SPLICE_OVERFLOW_PROCESS_MAX: usize = 64 * 1024 * 1024;
pub const WEDGE_TIMEOUT_MS: u64 = 10_000;
pub const SIGNED_OUT_MEMORY_MS: i64 = 86_400_000;
pub const SIGNED_OUT_MEMORY_MAX: usize = 50_000;
pub const CAPABILITY_TOKENS_MAX: usize = 16;
pub const DRAIN_GRACE_MAX_MS: u64 = 3_600_000;
pub const DRAIN_PACE_MAX_MS: u64 = 300_000;
pub const SHUTDOWN_EXIT_MS: u64 = 10_000;
pub const HEARTBEAT_INTERVAL_MS: u64 = 15_000;
pub const HEARTBEAT_TIMEOUT_MS: u64 = 10_000;
pub const HEARTBEAT_TTL_MS: i64 = 45_000;
pub const DIRECTOR_SAFETY_MAX_AGE_MS: i64 = 60_000;
pub const READINESS_CACHE_MS: u64 = 10_000;
