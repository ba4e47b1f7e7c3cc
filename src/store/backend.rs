//! The handle that dispatches to the configured backend (the trait it dispatches to is `driver`).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use prometheus::{HistogramVec, IntCounterVec};

use super::driver::scope_key;
pub use super::driver::Backend;
use super::postgres::{PgDb, PgTx};
use super::sqlite::{SqliteDb, SqliteTx};
use super::{DbError, PressureSnapshot, Row, Value, WaitTracker};

/// Which backend a [`Db`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Sqlite,
    Postgres,
}

impl DbKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DbKind::Sqlite => "sqlite",
            DbKind::Postgres => "postgres",
        }
    }
}

/// A shared handle on the database (cheap to clone).
#[derive(Clone)]
pub struct Db {
    inner: Arc<Inner>,
    /// Where every operation's duration and failure go (`orca_relay_db_seconds{op}`,
    /// `orca_relay_db_errors_total{op,kind}`); set once by the composition root. The store knows
    /// only the two series, not who registered them.
    observer: Arc<OnceLock<(HistogramVec, IntCounterVec)>>,
}

enum Inner {
    Sqlite(SqliteDb),
    Postgres(PgDb),
}

impl Db {
    /// Opens `sqlite://PATH`, `sqlite::memory:` or `postgres://…` with at most `pool_max` Postgres
    /// connections. SQLite parent directories are created.
    pub async fn connect(url: &str, pool_max: usize) -> Result<Db, DbError> {
        Self::connect_with(url, pool_max, false).await
    }

    /// As [`Db::connect`], read-only when `read_only` (push validation mode).
    pub async fn connect_with(url: &str, pool_max: usize, read_only: bool) -> Result<Db, DbError> {
        let inner = if url == "sqlite::memory:" {
            Inner::Sqlite(SqliteDb::open(None, read_only).await?)
        } else if let Some(path) = url.strip_prefix("sqlite://") {
            Inner::Sqlite(SqliteDb::open(Some(path), read_only).await?)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Inner::Postgres(PgDb::open(url, pool_max, read_only)?)
        } else {
            return Err(DbError::Fatal("unsupported database url".into()));
        };
        Ok(Db {
            inner: Arc::new(inner),
            observer: Arc::new(OnceLock::new()),
        })
    }

    /// Sends every later operation's duration to `h` (one label: the operation) and every failed
    /// operation to `errors` (labels: the operation, [`DbError::kind`]). First call wins.
    pub fn observe_with(&self, h: HistogramVec, errors: IntCounterVec) {
        let _ = self.observer.set((h, errors));
    }

    /// Counts that store operation `op` failed with `e`. Called by [`crate::transaction!`] once
    /// per failed call (after its retries) and by the plain entry points below.
    pub fn count_error(&self, op: &'static str, e: &DbError) {
        if let Some((_, errors)) = self.observer.get() {
            errors.with_label_values(&[op, e.kind()]).inc();
        }
    }

    /// Records that store operation `op` (a bounded, caller-given name) took since `started`.
    /// Called by [`crate::transaction!`] once per operation (retries included) and by the plain
    /// entry points below.
    pub fn observe(&self, op: &'static str, started: Instant) {
        if let Some((h, _)) = self.observer.get() {
            h.with_label_values(&[op])
                .observe(started.elapsed().as_secs_f64());
        }
    }

    pub fn kind(&self) -> DbKind {
        match &*self.inner {
            Inner::Sqlite(_) => DbKind::Sqlite,
            Inner::Postgres(_) => DbKind::Postgres,
        }
    }

    /// Opens a transaction (SQLite: `BEGIN IMMEDIATE`; Postgres: READ COMMITTED).
    pub async fn begin(&self) -> Result<Tx, DbError> {
        let r = match &*self.inner {
            Inner::Sqlite(db) => db.begin().await.map(Tx::Sqlite),
            Inner::Postgres(db) => db.begin().await.map(Tx::Postgres),
        };
        r.inspect_err(|e| self.waits().record_error(e))
    }

    /// A plain read outside any transaction (sees the latest committed state).
    pub async fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        self.read_as("query", sql, params).await
    }

    /// [`Db::query`] observed under `op`.
    pub async fn read_as(
        &self,
        op: &'static str,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<Row>, DbError> {
        let started = Instant::now();
        let r = match &*self.inner {
            Inner::Sqlite(db) => db.read(sql, params).await,
            Inner::Postgres(db) => db.read(sql, params).await,
        };
        self.observe(op, started);
        r.inspect_err(|e| {
            self.waits().record_error(e);
            self.count_error(op, e);
        })
    }

    /// A single-statement write in its own transaction.
    pub async fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let started = Instant::now();
        let r = self.execute_once(sql, params).await;
        self.observe("execute", started);
        r.inspect_err(|e| self.count_error("execute", e))
    }

    async fn execute_once(&self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let mut tx = self.begin().await?;
        match tx.execute(sql, params).await {
            Ok(n) => {
                tx.commit().await?;
                Ok(n)
            }
            Err(e) => {
                tx.rollback().await;
                self.waits().record_error(&e);
                Err(e)
            }
        }
    }

    /// `SELECT 1` (readiness).
    pub async fn ping(&self) -> Result<(), DbError> {
        self.read_as("ping", "SELECT 1", &[]).await.map(|_| ())
    }

    /// Callers waiting for a connection right now.
    pub fn pressure(&self) -> PressureSnapshot {
        self.waits().snapshot()
    }

    /// Statements and round trips sent so far (see [`super::wire`]).
    pub fn wire_stats(&self) -> super::wire::WireSnapshot {
        match &*self.inner {
            Inner::Sqlite(db) => db.wire.snapshot(),
            Inner::Postgres(db) => db.wire.snapshot(),
        }
    }

    pub fn waits(&self) -> &WaitTracker {
        match &*self.inner {
            Inner::Sqlite(db) => &db.waits,
            Inner::Postgres(db) => &db.waits,
        }
    }

    /// Pool size and idle connections (Postgres only).
    pub fn pool_status(&self) -> Option<(u64, u64)> {
        match &*self.inner {
            Inner::Sqlite(_) => None,
            Inner::Postgres(db) => Some(db.pool_status()),
        }
    }

    /// Closes pooled connections (shutdown).
    pub fn close(&self) {
        if let Inner::Postgres(db) = &*self.inner {
            db.close();
        }
    }
}

/// An open transaction on either backend. Dropping it without `commit` rolls it back.
pub enum Tx {
    Sqlite(SqliteTx),
    Postgres(PgTx),
}

macro_rules! dispatch {
    ($self:ident, $tx:ident => $e:expr) => {
        match $self {
            Tx::Sqlite($tx) => $e,
            Tx::Postgres($tx) => $e,
        }
    };
}

impl Tx {
    pub fn kind(&self) -> DbKind {
        match self {
            Tx::Sqlite(_) => DbKind::Sqlite,
            Tx::Postgres(_) => DbKind::Postgres,
        }
    }

    pub async fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        dispatch!(self, t => t.query(sql, params).await)
    }

    /// The first row, if any.
    pub async fn query_opt(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, params).await?.into_iter().next())
    }

    pub async fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        dispatch!(self, t => t.execute(sql, params).await)
    }

    pub async fn execute_batch(&mut self, sql: &str) -> Result<(), DbError> {
        dispatch!(self, t => t.execute_batch(sql).await)
    }

    pub async fn set_lock_timeout(&mut self, ms: u64) -> Result<(), DbError> {
        dispatch!(self, t => t.set_lock_timeout(ms).await)
    }

    pub async fn scope_lock(&mut self, scope: &str) -> Result<(), DbError> {
        dispatch!(self, t => t.scope_lock(scope).await)
    }

    pub async fn try_scope_lock(&mut self, scope: &str) -> Result<bool, DbError> {
        dispatch!(self, t => t.try_scope_lock(scope).await)
    }

    /// Tries every scope in one round trip (Postgres: one `SELECT` of `pg_try_advisory_xact_lock`
    /// calls, evaluated left to right); one answer per scope. SQLite: all succeed (ARCHITECTURE.md).
    pub async fn try_scope_locks(&mut self, scopes: &[String]) -> Result<Vec<bool>, DbError> {
        match self {
            Tx::Sqlite(_) => Ok(vec![true; scopes.len()]),
            Tx::Postgres(_) if scopes.is_empty() => Ok(Vec::new()),
            Tx::Postgres(t) => {
                let cols: Vec<String> = (1..=scopes.len())
                    .map(|i| format!("pg_try_advisory_xact_lock(${i})"))
                    .collect();
                let keys: Vec<Value> = scopes.iter().map(|s| Value::Int(scope_key(s))).collect();
                let rows = t
                    .query(&format!("SELECT {}", cols.join(", ")), &keys)
                    .await?;
                let row = rows.into_iter().next().unwrap_or_default();
                Ok((0..scopes.len()).map(|i| row.bool(i)).collect())
            }
        }
    }

    /// Waits for the scope, runs the transaction's last statement and commits. Postgres sends
    /// all of it (with `BEGIN` when first) in one flight, the statement running only once the
    /// lock is held; SQLite (scopes are no-ops) runs the statement and commits.
    pub async fn scoped_finish_with(
        &mut self,
        scope: &str,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<Row>, DbError> {
        match self {
            Tx::Sqlite(t) => {
                t.scope_lock(scope).await?;
                t.finish_with(sql, params).await
            }
            Tx::Postgres(t) => t.locked_finish_with(scope_key(scope), sql, params).await,
        }
    }

    /// See [`Backend::finish_with`].
    pub async fn finish_with(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        dispatch!(self, t => t.finish_with(sql, params).await)
    }

    pub async fn commit(self) -> Result<(), DbError> {
        dispatch!(self, t => t.commit().await)
    }

    pub async fn rollback(self) {
        dispatch!(self, t => t.rollback().await)
    }
}
