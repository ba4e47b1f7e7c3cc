//! Postgres backend: tokio-postgres through a deadpool pool, READ COMMITTED, explicit row locks.
//!
//! Each connection starts with the session defaults of ARCHITECTURE.md (`statement_timeout` 5 s,
//! `lock_timeout` 1 s, `idle_in_transaction_session_timeout` 5 s). A transaction owns its pooled
//! connection; dropping it unfinished sends `ROLLBACK` before the connection returns to the pool.
//!
//! Round trips are what a hot path pays for on a networked database, so a transaction's `BEGIN`
//! is not sent on its own: it goes out pipelined with the first statement (one flight), and
//! [`Backend::finish_with`] pipelines a last statement with `COMMIT`. A transaction that never ran
//! a statement costs nothing. Every statement is prepared once per connection and cached.
//!
//! Server-side timeouts cannot fire when no packet reaches the server (a black-holed network), so
//! every call also has a client-side deadline, [`CALL_DEADLINE`]: a plain read covers the pool
//! wait and its statement with it, `begin` the pool wait, and every statement of an open
//! transaction (and its `COMMIT`/`ROLLBACK`) gets its own. A connection whose statement ran out of
//! time, or whose caller was cancelled mid-statement, still has a request in flight: it is
//! detached from the pool and closed ([`Object::take`]), never handed to the next caller.
//!
//! Failover: the URL may name several hosts with `target_session_attrs=read-write`; each new
//! connection tries them in order and keeps the first that accepts writes. A connection whose
//! server went away is closed, and the pool's recycling check (`is_closed`) drops it instead of
//! handing it out, so the pool refills from whichever host is writable now. Before a new
//! connection is handed out it runs [`super::timeline::check`] (epochs never repeat after a
//! promotion).

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    HookError, Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
};
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::NoTls;

use super::driver::{scope_key, Backend};
use super::wire::WireStats;
use super::{DbError, Row, Value, WaitTracker};

pub struct PgDb {
    pool: Pool,
    pub(super) waits: WaitTracker,
    pub(super) wire: Arc<WireStats>,
}

/// The client-side deadline of one store call: the server's `statement_timeout` (5 s) plus 1 s for
/// the network, so a statement the server times out reports the server's error first, while a
/// statement whose packets go nowhere fails as transient after 6 s instead of hanging.
pub const CALL_DEADLINE: Duration = Duration::from_secs(6);

fn deadline_exceeded() -> DbError {
    DbError::Transient("postgres call deadline exceeded".into())
}

/// `fut` by [`CALL_DEADLINE`], a timeout being a transient failure.
async fn within<T>(
    fut: impl std::future::Future<Output = Result<T, DbError>>,
) -> Result<T, DbError> {
    tokio::time::timeout(CALL_DEADLINE, fut)
        .await
        .unwrap_or_else(|_| Err(deadline_exceeded()))
}

/// Detaches a connection from the pool and closes it (its slot is free for a new one).
fn discard(obj: Object) {
    drop(Object::take(obj));
}

/// Holds a connection while a statement may be in flight: dropped armed (timeout, or the caller's
/// future dropped mid-statement) it discards the connection instead of returning it.
struct InFlight(Option<Object>);

impl InFlight {
    fn disarm(mut self) -> Option<Object> {
        self.0.take()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(obj) = self.0.take() {
            discard(obj);
        }
    }
}

const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

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
            // Its own sessions are read-only: a read-write target would refuse every host.
            cfg.target_session_attrs(TargetSessionAttrs::Any);
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
        // The timeline this process last confirmed (0: none yet); see store::timeline.
        let known = Arc::new(AtomicI64::new(0));
        let mut builder = Pool::builder(mgr);
        if !read_only {
            builder = builder.post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
                let known = known.clone();
                Box::pin(async move {
                    let (confirmed, settled) =
                        super::timeline::check(client, known.load(Ordering::Relaxed))
                            .await
                            .map_err(HookError::Backend)?;
                    known.store(confirmed, Ordering::Relaxed);
                    if let Some(s) = settled {
                        super::report(super::StoreEvent::TimelineSettled(&s));
                    }
                    Ok(())
                })
            }));
        }
        let pool = builder
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
            wire: Arc::default(),
        })
    }

    async fn get(&self) -> Result<Object, DbError> {
        let _wait = self.waits.enter();
        self.pool.get().await.map_err(|e| match e {
            // A statement of the timeline check failed: classified like any other statement.
            PoolError::PostCreateHook(HookError::Backend(e)) => match map_err(e) {
                DbError::Fatal(m) => DbError::Transient(format!("pool: timeline check: {m}")),
                other => other,
            },
            e => DbError::Transient(format!("pool: {e}")),
        })
    }

    /// Takes a connection; `BEGIN` is sent with the transaction's first statement.
    pub async fn begin(&self) -> Result<PgTx, DbError> {
        let obj = within(self.get()).await?;
        Ok(PgTx {
            obj: Some(obj),
            in_flight: AtomicBool::new(false),
            begun: false,
            finished: false,
            wire: self.wire.clone(),
        })
    }

    pub async fn read(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        let started = tokio::time::Instant::now();
        let guard = InFlight(Some(within(self.get()).await?));
        let r = tokio::time::timeout_at(started + CALL_DEADLINE, async {
            let obj = guard.0.as_ref().expect("held");
            let stmt = prepare(obj, sql, &self.wire).await?;
            self.wire.flight(1);
            run_prepared(obj, &stmt, params).await
        })
        .await;
        match r {
            Ok(rows) => {
                drop(guard.disarm());
                rows_of(rows?)
            }
            // The guard drops armed: the connection is discarded.
            Err(_) => Err(deadline_exceeded()),
        }
    }

    pub fn pool_status(&self) -> (u64, u64) {
        let s = self.pool.status();
        (s.size as u64, s.available as u64)
    }

    pub fn close(&self) {
        self.pool.close();
    }
}

/// An open transaction owning its connection.
pub struct PgTx {
    obj: Option<Object>,
    /// `BEGIN` has been sent (with the first statement).
    begun: bool,
    /// [`Backend::finish_with`] committed it.
    finished: bool,
    /// A statement is running: dropped now, the connection must be discarded.
    in_flight: AtomicBool,
    wire: Arc<WireStats>,
}

impl PgTx {
    fn conn(&self) -> Result<&Object, DbError> {
        self.obj
            .as_ref()
            .ok_or_else(|| DbError::Fatal("transaction already finished".into()))
    }

    /// Runs one prepared statement, pipelined with `BEGIN` when it is the first.
    async fn run(
        &mut self,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<tokio_postgres::Row>, DbError> {
        let conn = self.conn()?;
        let stmt = prepare(conn, sql, &self.wire).await?;
        if self.begun {
            self.wire.flight(1);
            return run_prepared(conn, &stmt, params).await;
        }
        self.wire.flight(2);
        let (b, r) = tokio::join!(conn.batch_execute(BEGIN), run_prepared(conn, &stmt, params));
        self.begun = true;
        b.map_err(map_err)?;
        r
    }

    /// Sends `sql` (a simple statement without parameters), pipelined with `BEGIN` when first.
    async fn simple(&mut self, sql: &str) -> Result<(), DbError> {
        let conn = self.conn()?;
        if self.begun {
            self.wire.flight(1);
            return conn.batch_execute(sql).await.map_err(map_err);
        }
        self.wire.flight(2);
        let (b, r) = tokio::join!(conn.batch_execute(BEGIN), conn.batch_execute(sql));
        self.begun = true;
        b.map_err(map_err)?;
        r.map_err(map_err)
    }
}

/// Runs `$fut` (a statement of `$tx`) by [`CALL_DEADLINE`], marked in flight meanwhile; on timeout
/// the connection is discarded.
macro_rules! bounded {
    ($tx:ident, $fut:expr) => {{
        $tx.in_flight.store(true, Ordering::Relaxed);
        let r = tokio::time::timeout(CALL_DEADLINE, $fut).await;
        $tx.in_flight.store(false, Ordering::Relaxed);
        match r {
            Ok(r) => r,
            Err(_) => {
                if let Some(obj) = $tx.obj.take() {
                    discard(obj);
                }
                Err(deadline_exceeded())
            }
        }
    }};
}

impl Backend for PgTx {
    async fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        bounded!(self, self.raw_query(sql, params))
    }

    async fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        bounded!(self, self.raw_execute(sql, params))
    }

    async fn execute_batch(&mut self, sql: &str) -> Result<(), DbError> {
        bounded!(self, self.simple(sql))
    }

    async fn set_lock_timeout(&mut self, ms: u64) -> Result<(), DbError> {
        let sql = format!("SET LOCAL lock_timeout = {ms}");
        bounded!(self, self.simple(&sql))
    }

    async fn scope_lock(&mut self, scope: &str) -> Result<(), DbError> {
        self.execute(SCOPE_LOCK, &[Value::Int(scope_key(scope))])
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

    async fn finish_with(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        bounded!(self, self.raw_finish_with(sql, params))
    }

    async fn commit(mut self) -> Result<(), DbError> {
        let Some(obj) = self.obj.take() else {
            return if self.finished {
                Ok(())
            } else {
                Err(DbError::Fatal("transaction already finished".into()))
            };
        };
        if !self.begun {
            return Ok(());
        }
        self.wire.flight(1);
        let guard = InFlight(Some(obj));
        let r = tokio::time::timeout(CALL_DEADLINE, async {
            let obj = guard.0.as_ref().expect("held");
            match obj.batch_execute("COMMIT").await {
                Ok(()) => Ok(()),
                Err(e) => {
                    let _ = obj.batch_execute("ROLLBACK").await;
                    Err(map_err(e))
                }
            }
        })
        .await;
        match r {
            Ok(r) => {
                drop(guard.disarm());
                r
            }
            // An unknown outcome: the connection is discarded (guard), the caller sees transient.
            Err(_) => Err(deadline_exceeded()),
        }
    }

    async fn rollback(mut self) {
        if let Some(obj) = self.obj.take() {
            if self.begun {
                self.wire.flight(1);
                rollback_bounded(obj).await;
            }
        }
    }
}

/// `ROLLBACK` by [`CALL_DEADLINE`]; a connection that cannot answer is discarded.
async fn rollback_bounded(obj: Object) {
    let guard = InFlight(Some(obj));
    let done = tokio::time::timeout(CALL_DEADLINE, async {
        let _ = guard
            .0
            .as_ref()
            .expect("held")
            .batch_execute("ROLLBACK")
            .await;
    })
    .await
    .is_ok();
    if done {
        drop(guard.disarm());
    }
}

impl PgTx {
    async fn raw_query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        rows_of(self.run(sql, params).await?)
    }

    async fn raw_execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let conn = self.conn()?;
        let stmt = prepare(conn, sql, &self.wire).await?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        if self.begun {
            self.wire.flight(1);
            return conn.execute(&stmt, &refs).await.map_err(map_err);
        }
        self.wire.flight(2);
        let (b, r) = tokio::join!(conn.batch_execute(BEGIN), conn.execute(&stmt, &refs));
        self.begun = true;
        b.map_err(map_err)?;
        r.map_err(map_err)
    }

    async fn raw_finish_with(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        self.pipelined_finish(None, sql, params).await
    }
}

/// The advisory lock a scope takes ([`PgTx::scope_lock`], [`PgTx::locked_finish_with`]).
const SCOPE_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

impl PgTx {
    /// Takes the advisory lock `key`, runs `sql` and commits, all in one flight: the server runs
    /// them in order, so `sql` starts (and takes its READ COMMITTED snapshot) only once the lock
    /// is held, and sees everything the lock's previous holder committed.
    pub(super) async fn locked_finish_with(
        &mut self,
        key: i64,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<Row>, DbError> {
        bounded!(self, self.pipelined_finish(Some(key), sql, params))
    }

    /// `BEGIN` (when not yet sent), the advisory lock `lock` (when given), `sql` and `COMMIT` in
    /// one flight. After a failed lock or statement the server turns `COMMIT` into `ROLLBACK`, so
    /// the connection is clean when all answers are in, and the first error is the one reported.
    async fn pipelined_finish(
        &mut self,
        lock: Option<i64>,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<Row>, DbError> {
        let obj = self
            .obj
            .take()
            .ok_or_else(|| DbError::Fatal("transaction already finished".into()))?;
        let prepared = async {
            let lock_stmt = match lock {
                Some(_) => Some(prepare(&obj, SCOPE_LOCK, &self.wire).await?),
                None => None,
            };
            let stmt = prepare(&obj, sql, &self.wire).await?;
            Ok::<_, DbError>((lock_stmt, stmt))
        }
        .await;
        let (lock_stmt, stmt) = match prepared {
            Ok(s) => s,
            Err(e) => {
                self.obj = Some(obj);
                return Err(e);
            }
        };
        let begun = self.begun;
        let begin = async {
            if begun {
                Ok(())
            } else {
                obj.batch_execute(BEGIN).await
            }
        };
        let locked = async {
            match (&lock_stmt, lock) {
                (Some(l), Some(key)) => run_prepared(&obj, l, &[Value::Int(key)]).await.map(drop),
                _ => Ok(()),
            }
        };
        self.wire
            .flight(2 + u64::from(!begun) + u64::from(lock_stmt.is_some()));
        let (b, l, r, c) = tokio::join!(
            begin,
            locked,
            run_prepared(&obj, &stmt, params),
            obj.batch_execute("COMMIT")
        );
        self.begun = true;
        self.finished = true;
        b.map_err(map_err)?;
        l?;
        let rows = r?;
        if let Err(e) = c {
            let _ = obj.batch_execute("ROLLBACK").await;
            return Err(map_err(e));
        }
        rows_of(rows)
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        if let Some(obj) = self.obj.take() {
            if self.in_flight.load(Ordering::Relaxed) {
                // Cancelled mid-statement: never reuse it.
                discard(obj);
                return;
            }
            if !self.begun {
                return;
            }
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(rollback_bounded(obj));
            }
        }
    }
}

/// The cached prepared statement for `sql`; preparing it (first use on this connection) is a
/// round trip of its own.
async fn prepare(
    obj: &Object,
    sql: &str,
    wire: &WireStats,
) -> Result<tokio_postgres::Statement, DbError> {
    let before = obj.statement_cache.size();
    let stmt = obj.prepare_cached(sql).await.map_err(map_err)?;
    if obj.statement_cache.size() > before {
        wire.prepare();
    }
    Ok(stmt)
}

async fn run_prepared(
    obj: &Object,
    stmt: &tokio_postgres::Statement,
    params: &[Value],
) -> Result<Vec<tokio_postgres::Row>, DbError> {
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
    obj.query(stmt, &refs).await.map_err(map_err)
}

fn rows_of(rows: Vec<tokio_postgres::Row>) -> Result<Vec<Row>, DbError> {
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
        // 25006: a write reached a read-only server (a standby, or a primary being demoted);
        // 57P01/57P02/57P03: the server is shutting down, crashed or not yet accepting.
        if c == "57014"
            || c == "53300"
            || c == "57P03"
            || c == "57P01"
            || c == "57P02"
            || c == "25006"
            || c.starts_with("08")
        {
            return DbError::Transient(format!("postgres {c}"));
        }
        return DbError::Fatal(format!(
            "postgres {c}: {}",
            e.as_db_error().map(|d| d.message()).unwrap_or("")
        ));
    }
    DbError::Transient(format!("postgres connection: {e}"))
}
