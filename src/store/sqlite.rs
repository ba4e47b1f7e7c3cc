//! SQLite backend: rusqlite on dedicated threads.
//!
//! One writer connection lives on its own OS thread; a transaction holds the single writer slot
//! (a semaphore) from `BEGIN IMMEDIATE` to commit, and each statement is a job sent to that thread,
//! so no rusqlite call ever runs on a tokio worker. Plain reads use a second connection on a second
//! thread (WAL lets it see the last committed state while a write transaction is open); an
//! in-memory database has no second connection and reads through the writer slot.
//!
//! Both queues are bounded and visible to the store-pressure signal ([`WaitTracker`]): a writer
//! waits for the writer slot, a reader for the reader slot, each registered as a waiter while it
//! waits, and the slot's permit travels with the job to the database thread, so each thread's
//! channel holds at most one job of a live caller even when callers are cancelled. At most
//! [`READ_QUEUE_MAX`] plain reads wait at once; one more fails at once with a retryable error
//! instead of growing the queue.

use std::borrow::Cow;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::driver::{scope_key, Backend};
use super::wire::WireStats;
use super::{DbError, Row, Value, WaitTracker};

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A connection owned by one OS thread, fed with jobs.
#[derive(Clone)]
struct Worker {
    jobs: mpsc::Sender<Job>,
}

impl Worker {
    fn spawn(name: &str, mut conn: Connection) -> Worker {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job(&mut conn);
                }
            })
            .expect("spawn sqlite thread");
        Worker { jobs }
    }

    async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, DbError> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Box::new(move |c| {
                let _ = tx.send(f(c));
            }))
            .map_err(|_| DbError::Transient("sqlite thread gone".into()))?;
        rx.await
            .map_err(|_| DbError::Transient("sqlite thread gone".into()))
    }

    fn fire(&self, f: impl FnOnce(&mut Connection) + Send + 'static) {
        let _ = self.jobs.send(Box::new(f));
    }
}

/// Plain reads waiting for (or running on) the reader thread at most.
pub const READ_QUEUE_MAX: usize = 256;

/// Page cache per connection, KiB (`PRAGMA cache_size = -N`), instead of SQLite's 2 MiB: the
/// file grows with paired devices and terminal invites, and a full default cache on both
/// connections is ~4.4 MiB resident for good. The hot rows (assignments, leases, cells) are few;
/// the OS page cache holds the rest of the file.
pub const PAGE_CACHE_KIB: i64 = 512;

pub struct SqliteDb {
    writer: Worker,
    reader: Option<Worker>,
    slot: Arc<Semaphore>,
    /// The reader thread's one slot, and the bound on reads queued for it.
    read_slot: Arc<Semaphore>,
    read_queue: Arc<Semaphore>,
    pub(super) waits: WaitTracker,
    /// Statements sent to the database threads (each job is one round trip to its thread).
    pub(super) wire: Arc<WireStats>,
}

fn open_conn(path: Option<&str>, read_only: bool) -> Result<Connection, DbError> {
    let conn = match path {
        None => Connection::open_in_memory(),
        Some(p) => {
            let flags = if read_only {
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
            } else {
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
            };
            Connection::open_with_flags(p, flags)
        }
    }
    .map_err(map_err)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(map_err)?;
    if path.is_some() && !read_only {
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(map_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(map_err)?;
    }
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(map_err)?;
    conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)
        .map_err(map_err)?;
    conn.set_prepared_statement_cache_capacity(256);
    Ok(conn)
}

impl SqliteDb {
    pub async fn open(path: Option<&str>, read_only: bool) -> Result<SqliteDb, DbError> {
        let path = path.map(str::to_owned);
        // Opening touches the file system: do it off the runtime.
        let (writer, reader) = tokio::task::spawn_blocking(move || {
            if let Some(p) = &path {
                if let Some(parent) = std::path::Path::new(p).parent() {
                    if !parent.as_os_str().is_empty() {
                        std::fs::create_dir_all(parent).map_err(|e| {
                            DbError::Fatal(format!("create {}: {e}", parent.display()))
                        })?;
                    }
                }
            }
            let writer = open_conn(path.as_deref(), read_only)?;
            let reader = match &path {
                Some(_) => Some(open_conn(path.as_deref(), read_only)?),
                None => None,
            };
            Ok::<_, DbError>((writer, reader))
        })
        .await
        .map_err(|e| DbError::Fatal(e.to_string()))??;
        Ok(SqliteDb {
            writer: Worker::spawn("orca-sqlite-writer", writer),
            reader: reader.map(|c| Worker::spawn("orca-sqlite-reader", c)),
            slot: Arc::new(Semaphore::new(1)),
            read_slot: Arc::new(Semaphore::new(1)),
            read_queue: Arc::new(Semaphore::new(READ_QUEUE_MAX)),
            waits: WaitTracker::default(),
            wire: Arc::default(),
        })
    }

    pub async fn begin(&self) -> Result<SqliteTx, DbError> {
        let permit = {
            let _wait = self.waits.enter();
            self.slot
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| DbError::Transient("sqlite closed".into()))?
        };
        self.wire.flight(1);
        // A caller cancelled while its BEGIN waits (a timeout around a store call, with the file
        // busy) gives its slot back, but the job still runs: the transaction it opens would have
        // no owner to finish it, and every later BEGIN on this connection would fail ("cannot
        // start a transaction within a transaction") for as long as the process lives. The job
        // rolls back a BEGIN nobody waits for any more, and, as the slot is exclusive, any
        // transaction still open when a new one begins is such an orphan (a caller dropped
        // between the reply and taking it), rolled back before the new BEGIN.
        let (done, began) = oneshot::channel();
        self.writer.fire(move |c| {
            if !c.is_autocommit() {
                let _ = c.execute_batch("ROLLBACK");
            }
            let r = c.execute_batch("BEGIN IMMEDIATE").map_err(map_err);
            if let Err(Ok(())) = done.send(r) {
                let _ = c.execute_batch("ROLLBACK");
            }
        });
        began
            .await
            .map_err(|_| DbError::Transient("sqlite thread gone".into()))??;
        Ok(SqliteTx {
            worker: self.writer.clone(),
            _permit: Some(permit),
            open: true,
            wire: self.wire.clone(),
        })
    }

    pub async fn read(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        match &self.reader {
            Some(r) => {
                let _queued = self
                    .read_queue
                    .try_acquire()
                    .map_err(|_| DbError::Transient("sqlite read queue full".into()))?;
                let permit = {
                    let _wait = self.waits.enter();
                    self.read_slot
                        .clone()
                        .acquire_owned()
                        .await
                        .map_err(|_| DbError::Transient("sqlite closed".into()))?
                };
                self.wire.flight(1);
                run_query(r, sql, params, Some(permit)).await
            }
            None => {
                let mut tx = self.begin().await?;
                let rows = tx.query(sql, params).await;
                tx.commit().await?;
                rows
            }
        }
    }
}

/// An open `BEGIN IMMEDIATE` transaction holding the writer slot.
pub struct SqliteTx {
    worker: Worker,
    _permit: Option<OwnedSemaphorePermit>,
    open: bool,
    wire: Arc<WireStats>,
}

impl SqliteTx {
    fn check_open(&self) -> Result<(), DbError> {
        if self.open {
            Ok(())
        } else {
            Err(DbError::Fatal("transaction already finished".into()))
        }
    }

    async fn finish(&mut self) -> Result<(), DbError> {
        self.open = false;
        self.wire.flight(1);
        let r = self
            .worker
            .call(|c| {
                let r = c.execute_batch("COMMIT").map_err(map_err);
                if r.is_err() {
                    let _ = c.execute_batch("ROLLBACK");
                }
                r
            })
            .await;
        self._permit = None;
        r?
    }
}

impl Backend for SqliteTx {
    async fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        self.check_open()?;
        self.wire.flight(1);
        run_query(&self.worker, sql, params, None).await
    }

    async fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        self.check_open()?;
        self.wire.flight(1);
        let sql = rewrite(sql).into_owned();
        let params = params.to_vec();
        self.worker
            .call(move |c| {
                let mut stmt = c.prepare_cached(&sql).map_err(map_err)?;
                let n = stmt
                    .execute(rusqlite::params_from_iter(params.iter().map(Bind)))
                    .map_err(map_err)?;
                Ok(n as u64)
            })
            .await?
    }

    async fn execute_batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.check_open()?;
        self.wire.flight(1);
        let sql = sql.to_owned();
        self.worker
            .call(move |c| c.execute_batch(&sql).map_err(map_err))
            .await?
    }

    async fn set_lock_timeout(&mut self, _ms: u64) -> Result<(), DbError> {
        Ok(())
    }

    async fn scope_lock(&mut self, scope: &str) -> Result<(), DbError> {
        let _ = scope_key(scope);
        Ok(())
    }

    async fn try_scope_lock(&mut self, _scope: &str) -> Result<bool, DbError> {
        Ok(true)
    }

    /// No network to save here: the statement, then `COMMIT`.
    async fn finish_with(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        let rows = self.query(sql, params).await?;
        self.finish().await?;
        Ok(rows)
    }

    async fn commit(mut self) -> Result<(), DbError> {
        if !self.open {
            // Already committed by `finish_with`.
            return Ok(());
        }
        self.finish().await
    }

    async fn rollback(mut self) {
        if !self.open {
            return;
        }
        self.open = false;
        self.wire.flight(1);
        let _ = self
            .worker
            .call(|c| {
                let _ = c.execute_batch("ROLLBACK");
            })
            .await;
    }
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        if self.open {
            // Jobs run in order, so this lands before the next holder's BEGIN.
            self.worker.fire(|c| {
                let _ = c.execute_batch("ROLLBACK");
            });
        }
    }
}

/// Runs a query on `worker`'s thread; `slot` (if any) is released there once the query ran.
async fn run_query(
    worker: &Worker,
    sql: &str,
    params: &[Value],
    slot: Option<OwnedSemaphorePermit>,
) -> Result<Vec<Row>, DbError> {
    let sql = rewrite(sql).into_owned();
    let params = params.to_vec();
    worker
        .call(move |c| {
            let _slot = slot;
            let mut stmt = c.prepare_cached(&sql).map_err(map_err)?;
            let ncols = stmt.column_count();
            let mut rows = stmt
                .query(rusqlite::params_from_iter(params.iter().map(Bind)))
                .map_err(map_err)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(map_err)? {
                let mut vals = Vec::with_capacity(ncols);
                for i in 0..ncols {
                    vals.push(match r.get_ref(i).map_err(map_err)? {
                        ValueRef::Null => Value::Null,
                        ValueRef::Integer(v) => Value::Int(v),
                        ValueRef::Real(v) => Value::Int(v as i64),
                        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                        ValueRef::Blob(b) => Value::Text(String::from_utf8_lossy(b).into_owned()),
                    });
                }
                out.push(Row(vals));
            }
            Ok(out)
        })
        .await?
}

struct Bind<'a>(&'a Value);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self.0 {
            Value::Null => ToSqlOutput::Owned(SqlValue::Null),
            Value::Int(v) => ToSqlOutput::Owned(SqlValue::Integer(*v)),
            Value::Bool(b) => ToSqlOutput::Owned(SqlValue::Integer(*b as i64)),
            Value::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
        })
    }
}

/// Turns Postgres syntax into SQLite syntax: `$n` → `?n`; row-locking clauses removed.
pub(crate) fn rewrite(sql: &str) -> Cow<'_, str> {
    if !sql.contains('$') && !sql.contains("FOR UPDATE") {
        return Cow::Borrowed(sql);
    }
    let mut s = sql.replace('$', "?");
    for clause in [
        " FOR UPDATE SKIP LOCKED",
        " FOR UPDATE NOWAIT",
        " FOR UPDATE",
    ] {
        s = s.replace(clause, "");
    }
    Cow::Owned(s)
}

fn map_err(e: rusqlite::Error) -> DbError {
    use rusqlite::ErrorCode;
    match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::ConstraintViolation
                if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
            {
                DbError::UniqueViolation
            }
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                DbError::Transient("sqlite busy".into())
            }
            ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::CannotOpen
            | ErrorCode::ReadOnly => DbError::Transient(format!("sqlite {:?}", f.code)),
            _ => DbError::Fatal(e.to_string()),
        },
        _ => DbError::Fatal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads queued behind a busy reader count as store waiters (so the cell's pressure shed sees
    /// them), at most `READ_QUEUE_MAX` wait, and the next one is refused at once.
    #[tokio::test]
    async fn queued_reads_are_bounded_and_visible_to_pressure() {
        let dir = crate::store::testing::temp_dir("sqlite-read-queue");
        let path = dir.join("q.db");
        let db = Arc::new(SqliteDb::open(path.to_str(), false).await.unwrap());
        assert_eq!(db.read("SELECT 1", &[]).await.unwrap().len(), 1);
        // Occupy the reader slot, as a long read would.
        let busy = db.read_slot.clone().acquire_owned().await.unwrap();
        let mut queued = Vec::new();
        for _ in 0..READ_QUEUE_MAX {
            let db = db.clone();
            queued.push(tokio::spawn(async move { db.read("SELECT 1", &[]).await }));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while db.waits.snapshot().waiting < READ_QUEUE_MAX as u64 {
            assert!(std::time::Instant::now() < deadline, "reads never queued");
            tokio::task::yield_now().await;
        }
        assert_eq!(db.waits.snapshot().waiting, READ_QUEUE_MAX as u64);
        match db.read("SELECT 1", &[]).await {
            Err(DbError::Transient(m)) => assert_eq!(m, "sqlite read queue full"),
            other => panic!("expected a full queue, got {other:?}"),
        }
        drop(busy);
        for q in queued {
            assert_eq!(q.await.unwrap().unwrap().len(), 1);
        }
        assert_eq!(db.waits.snapshot().waiting, 0);
    }

    /// A `begin` cancelled while the file is busy (another connection holds its write lock)
    /// leaves no transaction behind on the writer connection: the next one begins and commits.
    #[tokio::test]
    async fn a_begin_cancelled_while_the_file_is_busy_leaves_no_transaction_open() {
        let dir = crate::store::testing::temp_dir("sqlite-cancelled-begin");
        let path = dir.join("c.db");
        let db = SqliteDb::open(path.to_str(), false).await.unwrap();
        let mut tx = db.begin().await.unwrap();
        tx.execute_batch("CREATE TABLE t (x INTEGER)")
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        // The BEGIN waits in the busy handler for `other`; its caller gives up.
        let cancelled =
            tokio::time::timeout(std::time::Duration::from_millis(200), db.begin()).await;
        assert!(cancelled.is_err(), "begin could not have finished");
        other.execute_batch("ROLLBACK").unwrap();
        for x in 0..2 {
            let mut tx = db.begin().await.expect("begin after a cancelled begin");
            tx.execute("INSERT INTO t (x) VALUES ($1)", &[Value::Int(x)])
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        let n = db.read("SELECT COUNT(*) FROM t", &[]).await.unwrap();
        assert_eq!(n[0].i64(0), 2);
    }

    #[test]
    fn rewrites_placeholders_and_locks() {
        assert_eq!(
            rewrite("SELECT a FROM t WHERE b = $1 AND c = $12 FOR UPDATE NOWAIT"),
            "SELECT a FROM t WHERE b = ?1 AND c = ?12"
        );
        assert_eq!(rewrite("SELECT 1"), "SELECT 1");
        assert_eq!(
            rewrite("SELECT x FROM t FOR UPDATE SKIP LOCKED"),
            "SELECT x FROM t"
        );
    }
}
