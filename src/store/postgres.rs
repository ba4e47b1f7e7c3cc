//! Postgres backend: tokio-postgres through a deadpool pool, READ COMMITTED, explicit row locks.
//!
//! Each connection starts with the session defaults of director.md §2 (`statement_timeout` 5 s,
//! `lock_timeout` 1 s, `idle_in_transaction_session_timeout` 5 s). A transaction owns its pooled
//! connection; dropping it unfinished sends `ROLLBACK` before the connection returns to the pool.
//!
//! Server-side timeouts cannot fire when no packet reaches the server (a black-holed network), so
//! every call also has a client-side deadline, [`CALL_DEADLINE`]: a plain read or write covers the
//! pool wait and its statement with it, `begin` the pool wait and `BEGIN`, and every statement of an
//! open transaction (and its `COMMIT`/`ROLLBACK`) gets its own. A connection whose statement ran out
//! of time, or whose caller was cancelled mid-statement, still has a request in flight: it is
//! detached from the pool and closed ([`Object::take`]), never handed to the next caller.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::NoTls;

use super::backend::{scope_key, Backend};
use super::{DbError, Row, Value, WaitTracker};

pub struct PgDb {
    pool: Pool,
    pub(super) waits: WaitTracker,
}

/// The client-side deadline of one store call: the server's `statement_timeout` (5 s) plus 1 s for
/// the network, so a statement the server times out reports the server's error first, while a
/// statement whose packets go nowhere fails as transient after 6 s instead of hanging.
pub const CALL_DEADLINE: Duration = Duration::from_secs(6);

const SESSION_OPTIONS: &str =
    "-c statement_timeout=5000 -c lock_timeout=1000 -c idle_in_transaction_session_timeout=5000";

impl PgDb {
    pub fn open(url: &str, pool_max: usize, read_only: bool) -> Result<PgDb, DbError> {
        let mut cfg = tokio_postgres::Config::from_str(url)
            .map_err(|e| DbError::Fatal(format!("invalid postgres url: {e}")))?;
        let mut options = cfg.get_options().unwrap_or_default().to_owned();
        if !options.is_empty() {
            options.push(' ');
        }
        options.push_str(SESSION_OPTIONS);
        if read_only {
            options.push_str(" -c default_transaction_read_only=on");
        }
        cfg.options(&options);
        cfg.connect_timeout(Duration::from_secs(5));
        // A black-holed network sends no RST and `statement_timeout` cannot fire when no packet
        // reaches the server: TCP keepalive and a user timeout let the kernel fail a stuck
        // connection so it errors (and is discarded) instead of hanging its pool slot.
        cfg.keepalives(true);
        cfg.keepalives_idle(Duration::from_secs(5));
        cfg.keepalives_interval(Duration::from_secs(2));
        cfg.keepalives_retries(3);
        cfg.tcp_user_timeout(Duration::from_secs(10));
        cfg.application_name("orca-relay");
        let mgr = Manager::from_config(
            cfg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(pool_max.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(5)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| DbError::Fatal(format!("postgres pool: {e}")))?;
        Ok(PgDb {
            pool,
            waits: WaitTracker::default(),
        })
    }

    async fn get(&self) -> Result<Conn, DbError> {
        let _wait = self.waits.enter();
        self.pool
            .get()
            .await
            .map(Conn::new)
            .map_err(|e| DbError::Transient(format!("pool: {e}")))
    }

    pub async fn begin(&self) -> Result<PgTx, DbError> {
        let started = tokio::time::Instant::now();
        let mut conn = within(CALL_DEADLINE, self.get()).await?;
        conn.batch_execute_by(
            started + CALL_DEADLINE,
            "BEGIN ISOLATION LEVEL READ COMMITTED",
        )
        .await?;
        Ok(PgTx { conn: Some(conn) })
    }

    pub async fn read(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        let started = tokio::time::Instant::now();
        let mut conn = within(CALL_DEADLINE, self.get()).await?;
        conn.query_by(started + CALL_DEADLINE, sql, params).await
    }

    pub fn pool_status(&self) -> (u64, u64) {
        let s = self.pool.status();
        (s.size as u64, s.available as u64)
    }

    pub fn close(&self) {
        self.pool.close();
    }
}

/// Runs the statement future `$fut` (which may use `$obj: &Object`) on `$conn` by `$deadline`,
/// marked in flight while it runs: if the caller's future is dropped meanwhile, `Conn`'s `Drop`
/// sees the mark and discards the connection. Evaluates to `None` when the connection is gone.
macro_rules! guarded {
    ($conn:ident, $deadline:expr, |$obj:ident| $fut:expr) => {
        match $conn.obj.as_ref() {
            Some($obj) => {
                $conn.in_flight = true;
                Some(tokio::time::timeout_at($deadline, $fut).await)
            }
            None => None,
        }
    };
}

/// A pooled connection with the one rule that keeps a pool healthy through a black hole: a
/// connection that may still have a statement in flight (timed out, or its caller's future was
/// dropped mid-statement) is detached from the pool and closed instead of being returned.
pub(super) struct Conn {
    obj: Option<Object>,
    in_flight: bool,
}

impl Conn {
    fn new(obj: Object) -> Conn {
        Conn {
            obj: Some(obj),
            in_flight: false,
        }
    }

    /// What a guarded statement came to: clears the in-flight mark and discards the connection
    /// when the deadline passed (`None`: it was already discarded).
    fn settle<T>(
        &mut self,
        r: Option<Result<Result<T, DbError>, tokio::time::error::Elapsed>>,
    ) -> Result<T, DbError> {
        self.in_flight = false;
        match r {
            Some(Ok(r)) => r,
            Some(Err(_)) => {
                self.discard();
                Err(DbError::Transient("postgres call deadline exceeded".into()))
            }
            None => Err(DbError::Transient("postgres connection discarded".into())),
        }
    }

    async fn query_by(
        &mut self,
        deadline: tokio::time::Instant,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<Row>, DbError> {
        let r = guarded!(self, deadline, |obj| run_query(obj, sql, params));
        self.settle(r)
    }

    async fn execute_by(
        &mut self,
        deadline: tokio::time::Instant,
        sql: &str,
        params: &[Value],
    ) -> Result<u64, DbError> {
        let r = guarded!(self, deadline, |obj| async {
            let stmt = obj.prepare_cached(sql).await.map_err(map_err)?;
            let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
            obj.execute(&stmt, &refs).await.map_err(map_err)
        });
        self.settle(r)
    }

    async fn batch_execute_by(
        &mut self,
        deadline: tokio::time::Instant,
        sql: &str,
    ) -> Result<(), DbError> {
        let r = guarded!(self, deadline, |obj| async {
            obj.batch_execute(sql).await.map_err(map_err)
        });
        self.settle(r)
    }

    /// Detaches the connection from the pool and closes it (its slot is free for a new one).
    fn discard(&mut self) {
        if let Some(obj) = self.obj.take() {
            drop(Object::take(obj));
        }
    }

    /// `ROLLBACK` with a deadline; a connection that cannot answer is discarded.
    async fn rollback(mut self) {
        let _ = self
            .batch_execute_by(tokio::time::Instant::now() + CALL_DEADLINE, "ROLLBACK")
            .await;
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.in_flight {
            self.discard();
        }
    }
}

fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + CALL_DEADLINE
}

/// `fut` by `limit`, a timeout being a transient failure.
async fn within<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, DbError>>,
) -> Result<T, DbError> {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| Err(DbError::Transient("postgres call deadline exceeded".into())))
}

/// An open transaction owning its connection.
pub struct PgTx {
    conn: Option<Conn>,
}

impl PgTx {
    fn conn(&mut self) -> Result<&mut Conn, DbError> {
        self.conn
            .as_mut()
            .ok_or_else(|| DbError::Fatal("transaction already finished".into()))
    }
}

impl Backend for PgTx {
    async fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        self.conn()?.query_by(deadline(), sql, params).await
    }

    async fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.conn()?.execute_by(deadline(), sql, params).await
    }

    async fn execute_batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.conn()?.batch_execute_by(deadline(), sql).await
    }

    async fn set_lock_timeout(&mut self, ms: u64) -> Result<(), DbError> {
        self.conn()?
            .batch_execute_by(deadline(), &format!("SET LOCAL lock_timeout = {ms}"))
            .await
    }

    async fn scope_lock(&mut self, scope: &str) -> Result<(), DbError> {
        self.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[Value::Int(scope_key(scope))],
        )
        .await
        .map(|_| ())
    }

    async fn try_scope_lock(&mut self, scope: &str) -> Result<bool, DbError> {
        let rows = self
            .query(
                "SELECT pg_try_advisory_xact_lock($1)",
                &[Value::Int(scope_key(scope))],
            )
            .await?;
        Ok(rows.first().map(|r| r.bool(0)).unwrap_or(false))
    }

    async fn commit(mut self) -> Result<(), DbError> {
        let mut conn = self.conn.take().expect("transaction already finished");
        match conn.batch_execute_by(deadline(), "COMMIT").await {
            Ok(()) => Ok(()),
            Err(e) => {
                // A timed-out COMMIT has an unknown outcome: the connection is gone and the
                // caller sees a transient failure.
                conn.rollback().await;
                Err(e)
            }
        }
    }

    async fn rollback(mut self) {
        if let Some(conn) = self.conn.take() {
            conn.rollback().await;
        }
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            if conn.in_flight {
                // Cancelled mid-statement: never reuse it.
                conn.discard();
                return;
            }
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(conn.rollback());
            }
        }
    }
}

async fn run_query(obj: &Object, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
    let stmt = obj.prepare_cached(sql).await.map_err(map_err)?;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
    let rows = obj.query(&stmt, &refs).await.map_err(map_err)?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut vals = Vec::with_capacity(r.len());
        for (i, col) in r.columns().iter().enumerate() {
            let v = match *col.type_() {
                Type::INT8 => r.get::<_, Option<i64>>(i).map(Value::Int),
                Type::INT4 => r.get::<_, Option<i32>>(i).map(|v| Value::Int(v as i64)),
                Type::INT2 => r.get::<_, Option<i16>>(i).map(|v| Value::Int(v as i64)),
                Type::BOOL => r.get::<_, Option<bool>>(i).map(Value::Bool),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
                    r.get::<_, Option<String>>(i).map(Value::Text)
                }
                Type::VOID => None,
                ref other => {
                    // Sums are NUMERIC in Postgres: statements cast them (`CAST(SUM(x) AS BIGINT)`).
                    return Err(DbError::Fatal(format!("unsupported column type {other}")));
                }
            };
            vals.push(v.unwrap_or(Value::Null));
        }
        out.push(Row(vals));
    }
    Ok(out)
}

fn map_err(e: tokio_postgres::Error) -> DbError {
    if let Some(code) = e.code() {
        if *code == SqlState::T_R_SERIALIZATION_FAILURE {
            return DbError::Serialization("40001");
        }
        if *code == SqlState::T_R_DEADLOCK_DETECTED {
            return DbError::Serialization("40P01");
        }
        if *code == SqlState::LOCK_NOT_AVAILABLE {
            return DbError::LockUnavailable;
        }
        if *code == SqlState::UNIQUE_VIOLATION {
            return DbError::UniqueViolation;
        }
        let c = code.code();
        if c == "57014" || c == "53300" || c == "57P03" || c == "57P01" || c.starts_with("08") {
            return DbError::Transient(format!("postgres {c}"));
        }
        return DbError::Fatal(format!(
            "postgres {c}: {}",
            e.as_db_error().map(|d| d.message()).unwrap_or("")
        ));
    }
    DbError::Transient(format!("postgres connection: {e}"))
}
