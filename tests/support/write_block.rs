//! Holding up the server's store writes for one host from the test, on either backend, so a test
//! can put a cell's activation or release "in flight" and decide when it may land:
//!
//! - Postgres: a transaction of the test's own locks the host's assignment row
//!   ([`super::row_lock`]); every cell-driven operation on that host (activation, release) waits
//!   ≤ 1 000 ms per try for it and fails while it is held.
//! - SQLite: a connection of the test's own holds the file's write lock (`BEGIN IMMEDIATE`); every
//!   write of the server waits in its busy handler (5 s per try) until the lock is let go.
#![allow(dead_code)]

use orca_relay::store::testing::TestDb;
use orca_relay::store::DbKind;

pub enum WriteBlock {
    Postgres(super::row_lock::RowLock),
    Sqlite {
        release: std::sync::mpsc::Sender<()>,
        done: std::thread::JoinHandle<()>,
    },
}

/// Blocks the writes that touch (`user_id`, `relay_host_id`) (Postgres) or every write (SQLite).
pub async fn block_host_writes(t: &TestDb, user_id: &str, relay_host_id: &str) -> WriteBlock {
    match t.kind() {
        DbKind::Postgres => WriteBlock::Postgres(
            super::row_lock::lock_assignment(&t.url, user_id, relay_host_id).await,
        ),
        DbKind::Sqlite => {
            let path = t
                .url
                .strip_prefix("sqlite://")
                .expect("a sqlite:// URL")
                .to_owned();
            let (locked_tx, locked) = tokio::sync::oneshot::channel();
            let (release, wait) = std::sync::mpsc::channel::<()>();
            let done = std::thread::spawn(move || {
                let conn = rusqlite::Connection::open(path).expect("open the test's sqlite file");
                conn.busy_timeout(std::time::Duration::from_secs(10))
                    .unwrap();
                conn.execute_batch("BEGIN IMMEDIATE")
                    .expect("take the write lock");
                let _ = locked_tx.send(());
                let _ = wait.recv();
                conn.execute_batch("ROLLBACK")
                    .expect("let the write lock go");
            });
            locked.await.expect("write lock taken");
            WriteBlock::Sqlite { release, done }
        }
    }
}

impl WriteBlock {
    /// Lets the held-up writes go.
    pub async fn release(self) {
        match self {
            WriteBlock::Postgres(lock) => lock.release().await,
            WriteBlock::Sqlite { release, done } => {
                let _ = release.send(());
                tokio::task::spawn_blocking(move || done.join().expect("lock thread"))
                    .await
                    .unwrap();
            }
        }
    }
}
