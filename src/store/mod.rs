//! Durable state: one transaction interface, two backends.
//!
//! Every domain operation is written once against [`Tx`] using Postgres placeholders (`$1`) and
//! Postgres locking clauses (`FOR UPDATE`, `NOWAIT`, `SKIP LOCKED`). The SQLite backend rewrites
//! placeholders, drops locking clauses (its single writer under `BEGIN IMMEDIATE` already serialises
//! transactions) and runs every call on a dedicated database thread, never on a tokio worker. The
//! Postgres backend runs at READ COMMITTED through a deadpool pool. [`transaction!`] wraps an
//! operation in begin/commit and retries it on serialization failures, deadlocks and lock timeouts
//! (3 attempts, 0–25 ms full jitter) as ARCHITECTURE.md prescribes.
//!
//! Area operations live beside this module (`assignments`, `credentials`, and `push::store`);
//! decisions are pure functions in the role modules, fed with rows read here.

pub mod assignments;
mod backend;
pub mod cells;
pub mod credentials;
mod driver;
pub mod migrate;
pub mod migrations;
pub mod overview;
mod postgres;
pub mod push;
pub mod region;
pub mod restore;
mod sqlite;
pub mod sticky_batch;
pub mod testing;
pub mod timeline;
mod value;
mod waits;
pub mod wire;

pub use backend::{Backend, Db, DbKind, Tx};
pub use value::{Row, Value};
pub use waits::{PressureSnapshot, WaitTracker};

use std::fmt;

/// A database failure, classified the way the retry loop and the HTTP layer need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbError {
    /// `55P03`: a `NOWAIT` or `lock_timeout` lock was not granted. Operations that asked for
    /// `NOWAIT` map this to their own "busy" answer; the retry loop retries it otherwise.
    LockUnavailable,
    /// `40001` or `40P01`: retry the whole transaction.
    Serialization(&'static str),
    /// Unique-key violation (`23505` / SQLite constraint).
    UniqueViolation,
    /// Connection, pool, timeout or I/O trouble: the caller answers a retryable 503.
    Transient(String),
    /// Anything else (bad SQL, constraint other than unique): a bug or corrupted input.
    Fatal(String),
}

/// Every operation name of `orca_relay_db_seconds{op}` / `orca_relay_db_errors_total{op}`: the
/// phases given to [`transaction!`] and the plain entry points of [`Db`].
pub const OPS: &[&str] = &[
    "activity-lease",
    "assignment",
    "cell-runtime",
    "cells",
    "credential-install",
    "device-revoke",
    "invite-create",
    "invite-fail",
    "invite-reserve",
    "migration",
    "push_accept",
    "push_claim",
    "push_device_delete",
    "push_device_upsert",
    "push_finish",
    "push_retire",
    "push_session",
    "regional-rehome",
    "resume-confirm",
    "query",
    "execute",
    "ping",
];

/// Every [`DbError::kind`].
pub const ERROR_KINDS: &[&str] = &[
    "lock_unavailable",
    "serialization",
    "unique_violation",
    "transient",
    "fatal",
];

impl DbError {
    /// The metrics label of the error's class (one of [`ERROR_KINDS`]).
    pub fn kind(&self) -> &'static str {
        match self {
            DbError::LockUnavailable => "lock_unavailable",
            DbError::Serialization(_) => "serialization",
            DbError::UniqueViolation => "unique_violation",
            DbError::Transient(_) => "transient",
            DbError::Fatal(_) => "fatal",
        }
    }

    /// The SQLSTATE to log when the retry loop may run the transaction again.
    pub fn retry_code(&self) -> Option<&'static str> {
        match self {
            DbError::LockUnavailable => Some("55P03"),
            DbError::Serialization(code) => Some(code),
            _ => None,
        }
    }

    /// True when the client should be told to come back later (503 + `Retry-After`).
    pub fn is_transient(&self) -> bool {
        !matches!(self, DbError::Fatal(_) | DbError::UniqueViolation)
    }
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DbError::LockUnavailable => write!(f, "lock unavailable"),
            DbError::Serialization(code) => write!(f, "serialization failure {code}"),
            DbError::UniqueViolation => write!(f, "unique violation"),
            DbError::Transient(m) => write!(f, "transient database failure: {m}"),
            DbError::Fatal(m) => write!(f, "database error: {m}"),
        }
    }
}

impl std::error::Error for DbError {}

/// Errors that may carry a retryable database failure, so [`transaction!`] can decide to retry
/// domain operations that return their own error type.
pub trait RetryClass {
    fn retry_code(&self) -> Option<&'static str>;
    /// The database failure this error carries, if any (counted in `orca_relay_db_errors_total`).
    fn db_error(&self) -> Option<&DbError> {
        None
    }
}

impl RetryClass for DbError {
    fn retry_code(&self) -> Option<&'static str> {
        DbError::retry_code(self)
    }
    fn db_error(&self) -> Option<&DbError> {
        Some(self)
    }
}

/// Attempts per transaction (ARCHITECTURE.md).
pub const TX_ATTEMPTS: u32 = 3;

/// What the store reports about itself. Storage knows no logger (tests/layering.rs): the
/// composition root installs an observer with [`observe`] that turns these into log events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreEvent<'a> {
    /// A transaction is retried after a retryable error.
    Retry {
        phase: &'a str,
        code: &'a str,
        attempt: u32,
    },
    /// A transaction's retries ran out.
    RetryExhausted {
        phase: &'a str,
        code: &'a str,
        attempts: u32,
    },
    /// The Postgres server runs on a new timeline (a promoted standby): epochs and generations
    /// were advanced ([`timeline`]).
    TimelineSettled(&'a timeline::TimelineSettled),
}

static OBSERVER: std::sync::OnceLock<fn(StoreEvent<'_>)> = std::sync::OnceLock::new();

/// Installs the process's store observer (the first call wins; later ones are ignored, so every
/// in-process server of a test binary may call it).
pub fn observe(f: fn(StoreEvent<'_>)) {
    let _ = OBSERVER.set(f);
}

fn report(e: StoreEvent<'_>) {
    if let Some(f) = OBSERVER.get() {
        f(e);
    }
}

/// Sleeps 0–25 ms (full jitter) before a retry and reports the retry.
pub async fn retry_pause(phase: &str, code: &str, attempt: u32) {
    report(StoreEvent::Retry {
        phase,
        code,
        attempt,
    });
    let ms: u64 = rand::random::<u64>() % 26;
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// Reports that the retries ran out.
pub fn retry_exhausted(phase: &str, code: &str, attempts: u32) {
    report(StoreEvent::RetryExhausted {
        phase,
        code,
        attempts,
    });
}

/// Runs `$body` inside a transaction on `$db`, committing on `Ok` and rolling back on `Err`, and
/// retries the whole body on `40001`/`40P01`/`55P03` up to [`TX_ATTEMPTS`] times. `$phase` (a
/// `&'static str` from a small fixed set) names the operation in the retry log lines and in
/// `orca_relay_db_seconds{op}`, observed once per call, retries included.
///
/// `$body` is an expression (usually a block) that may `.await` and use `$tx: &mut Tx`; it evaluates
/// to `Result<T, E>` with `E: From<DbError> + RetryClass`.
///
/// ```ignore
/// let n = transaction!(db, "assignment", |tx| {
///     tx.execute("UPDATE t SET a = $1", params![1]).await
/// })?;
/// ```
#[macro_export]
macro_rules! transaction {
    ($db:expr, $phase:expr, |$tx:ident| $body:expr) => {{
        #[allow(unused_imports)]
        use $crate::store::RetryClass as _;
        let __db: &$crate::store::Db = &$db;
        let __phase: &'static str = $phase;
        let __started = ::std::time::Instant::now();
        let mut __attempt: u32 = 0;
        let __out = loop {
            __attempt += 1;
            let mut __tx = match __db.begin().await {
                Ok(t) => t,
                Err(e) => break Err(e.into()),
            };
            let __result = {
                let $tx: &mut $crate::store::Tx = &mut __tx;
                #[allow(unused_braces)]
                let __body = async { $body };
                __body.await
            };
            let __retry = match __result {
                Ok(v) => match __tx.commit().await {
                    Ok(()) => break Ok(v),
                    Err(e) => match $crate::store::RetryClass::retry_code(&e) {
                        Some(code) if __attempt < $crate::store::TX_ATTEMPTS => code,
                        Some(code) => {
                            $crate::store::retry_exhausted(__phase, code, __attempt);
                            break Err(e.into());
                        }
                        None => break Err(e.into()),
                    },
                },
                Err(e) => {
                    __tx.rollback().await;
                    match $crate::store::RetryClass::retry_code(&e) {
                        Some(code) if __attempt < $crate::store::TX_ATTEMPTS => code,
                        Some(code) => {
                            $crate::store::retry_exhausted(__phase, code, __attempt);
                            break Err(e);
                        }
                        None => break Err(e),
                    }
                }
            };
            $crate::store::retry_pause(__phase, __retry, __attempt).await;
        };
        __db.observe(__phase, __started);
        if let Err(e) = &__out {
            if let Some(d) = $crate::store::RetryClass::db_error(e) {
                __db.count_error(__phase, d);
            }
        }
        __out
    }};
}
