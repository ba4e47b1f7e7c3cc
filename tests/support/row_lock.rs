//! A Postgres transaction held open by the test that locks one host's assignment row, the way a
//! long transaction of another process would: every statement that locks the row (the source
//! cell's `reconcileIdleRegionalRehome`, which waits ≤ 1 000 ms per try, docs/reference/http.md) waits
//! and fails until [`RowLock::release`].
#![allow(dead_code)]

pub struct RowLock {
    client: tokio_postgres::Client,
    pid: i32,
}

/// Opens a connection to `url` (the test schema's URL), begins a transaction and locks the
/// assignment row of (`user_id`, `relay_host_id`); panics when the row does not exist.
pub async fn lock_assignment(url: &str, user_id: &str, relay_host_id: &str) -> RowLock {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect for the row lock");
    tokio::spawn(conn);
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    client.batch_execute("BEGIN").await.unwrap();
    let rows = client
        .query(
            "SELECT 1 FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2 FOR UPDATE",
            &[&user_id, &relay_host_id],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "the host has an assignment row");
    RowLock { client, pid }
}

impl RowLock {
    /// Backends waiting for this transaction's locks right now.
    pub async fn waiters(&self) -> i64 {
        // A second connection would see the same; asking on this one keeps the lock's
        // transaction open (a plain read inside it changes nothing).
        self.client
            .query_one(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                &[&self.pid],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Ends the transaction: the row is free again.
    pub async fn release(self) {
        self.client.batch_execute("ROLLBACK").await.unwrap();
    }
}
