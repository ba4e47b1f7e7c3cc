//! Behaviour of the transaction interface, written once and run on every backend available
//! (SQLite always; Postgres when ORCA_RELAY_TEST_POSTGRES_URL is set).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use orca_relay::params;
use orca_relay::store::testing::{backends, TestDb};
use orca_relay::store::{migrate, Db, DbError, DbKind};
use orca_relay::transaction;

async fn make_table(db: &Db, name: &str) {
    let mut tx = db.begin().await.unwrap();
    tx.execute_batch(&format!(
        "CREATE TABLE {name} (k TEXT PRIMARY KEY, n BIGINT NOT NULL, flag BOOLEAN NOT NULL, note TEXT NULL)"
    ))
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn migrations_apply_once_and_record_versions() {
    for t in backends().await {
        // `backends()` already migrated; a second run applies nothing.
        assert!(
            migrate::apply(&t.db, orca_relay::clock::now_ms())
                .await
                .unwrap()
                .is_empty(),
            "{:?}",
            t.kind()
        );
        assert!(migrate::is_current(&t.db).await.unwrap());
        let rows =
            t.db.query(
                "SELECT version, name FROM schema_migrations ORDER BY version",
                &[],
            )
            .await
            .unwrap();
        let versions: Vec<i64> = rows.iter().map(|r| r.i64(0)).collect();
        assert_eq!(versions, vec![1, 2, 3, 4, 5], "{:?}", t.kind());
        assert_eq!(rows[0].str(1), "core");
        // Every core table exists on both backends.
        for table in [
            "relay_cells",
            "relay_cell_runtime",
            "relay_cell_fences",
            "relay_assignments",
            "relay_assignment_activity_leases",
            "relay_connection_reservations",
            "relay_assignment_migrations",
            "relay_region_decisions",
            "relay_region_rehome_control",
            "relay_region_rehome_attempts",
            "relay_region_rehome_worker_lease",
            "relay_invites",
            "relay_devices",
            "relay_connection_bases",
            "relay_direct_authorizations",
            "relay_install_results",
            "relay_confirm_results",
            "relay_rate_windows",
            "relay_audit_events",
        ] {
            t.db.query(&format!("SELECT COUNT(*) FROM {table}"), &[])
                .await
                .unwrap_or_else(|e| panic!("{table} on {:?}: {e}", t.kind()));
        }
    }
}

#[tokio::test]
async fn values_round_trip_and_nulls() {
    for t in backends().await {
        make_table(&t.db, "kv").await;
        t.db.execute(
            "INSERT INTO kv (k, n, flag, note) VALUES ($1, $2, $3, $4)",
            params!["a", 1i64 << 53, true, None::<String>],
        )
        .await
        .unwrap();
        let row =
            t.db.query("SELECT k, n, flag, note FROM kv WHERE k = $1", params!["a"])
                .await
                .unwrap()
                .remove(0);
        assert_eq!(row.str(0), "a");
        assert_eq!(row.i64(1), 1i64 << 53);
        assert!(row.bool(2));
        assert!(row.is_null(3));
        assert_eq!(row.opt_str(3), None);
        // An untyped parameter compared with IS NULL needs a cast: that form works on both.
        let n =
            t.db.query(
                "SELECT COUNT(*) FROM kv WHERE CAST($1 AS TEXT) IS NULL OR k = $1",
                params![None::<String>],
            )
            .await
            .unwrap()[0]
                .i64(0);
        assert_eq!(n, 1);
        let sum =
            t.db.query("SELECT CAST(SUM(n) AS BIGINT) FROM kv", &[])
                .await
                .unwrap()[0]
                .i64(0);
        assert_eq!(sum, 1i64 << 53);
    }
}

#[tokio::test]
async fn error_rolls_back_everything_written() {
    for t in backends().await {
        make_table(&t.db, "kv").await;
        let r: Result<(), DbError> = transaction!(t.db, "test", |tx| {
            tx.execute(
                "INSERT INTO kv (k, n, flag) VALUES ($1, $2, $3)",
                params!["x", 1i64, false],
            )
            .await?;
            Err(DbError::Fatal("refused".into()))
        });
        assert!(matches!(r, Err(DbError::Fatal(_))));
        let n = t.db.query("SELECT COUNT(*) FROM kv", &[]).await.unwrap()[0].i64(0);
        assert_eq!(n, 0, "{:?}: nothing half written", t.kind());
        // A dropped (unfinished) transaction rolls back too, and the next one proceeds.
        {
            let mut tx = t.db.begin().await.unwrap();
            tx.execute(
                "INSERT INTO kv (k, n, flag) VALUES ($1, $2, $3)",
                params!["y", 1i64, false],
            )
            .await
            .unwrap();
        }
        let mut tx = t.db.begin().await.unwrap();
        let n = tx.query("SELECT COUNT(*) FROM kv", &[]).await.unwrap()[0].i64(0);
        tx.commit().await.unwrap();
        assert_eq!(n, 0);
    }
}

#[tokio::test]
async fn retryable_failures_are_retried_three_times_at_most() {
    for t in backends().await {
        make_table(&t.db, "kv").await;
        // Fails once with a serialization failure, then succeeds: committed once.
        let attempts = AtomicU32::new(0);
        let r: Result<u32, DbError> = transaction!(t.db, "test", |tx| {
            let a = attempts.fetch_add(1, Ordering::SeqCst) + 1;
            tx.execute(
                "INSERT INTO kv (k, n, flag) VALUES ($1, $2, $3)",
                params!["r", a as i64, false],
            )
            .await?;
            if a == 1 {
                return Err(DbError::Serialization("40001"));
            }
            Ok(a)
        });
        assert_eq!(r.unwrap(), 2);
        let rows = t.db.query("SELECT n FROM kv", &[]).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].i64(0), 2);

        // Always failing: three attempts, then the error surfaces.
        let attempts = AtomicU32::new(0);
        let r: Result<(), DbError> = transaction!(t.db, "test", |tx| {
            attempts.fetch_add(1, Ordering::SeqCst);
            tx.query("SELECT 1", &[]).await?;
            Err(DbError::Serialization("40P01"))
        });
        assert_eq!(r, Err(DbError::Serialization("40P01")));
        assert_eq!(attempts.load(Ordering::SeqCst), 3);

        // Non-retryable errors are not retried.
        let attempts = AtomicU32::new(0);
        let r: Result<(), DbError> = transaction!(t.db, "test", |tx| {
            attempts.fetch_add(1, Ordering::SeqCst);
            tx.query("SELECT 1", &[]).await?;
            Err(DbError::Fatal("no".into()))
        });
        assert!(r.is_err());
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn unique_violation_is_classified() {
    for t in backends().await {
        make_table(&t.db, "kv").await;
        let ins = "INSERT INTO kv (k, n, flag) VALUES ($1, $2, $3)";
        t.db.execute(ins, params!["u", 1i64, true]).await.unwrap();
        let e =
            t.db.execute(ins, params!["u", 2i64, true])
                .await
                .unwrap_err();
        assert_eq!(e, DbError::UniqueViolation, "{:?}", t.kind());
        assert!(!e.is_transient());
    }
}

/// Two tasks race to create the same row: exactly one insert wins, the loser sees the winner's
/// committed row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_inserts_one_winner_loser_sees_committed_state() {
    for t in backends().await {
        make_table(&t.db, "kv").await;
        let db = Arc::new(t.db.clone());
        let mut tasks = Vec::new();
        for i in 0..2i64 {
            let db = db.clone();
            tasks.push(tokio::spawn(async move {
                let r: Result<bool, DbError> = transaction!(*db, "race", |tx| {
                    let existing = tx
                        .query_opt("SELECT n FROM kv WHERE k = $1 FOR UPDATE", params!["row"])
                        .await?;
                    if existing.is_some() {
                        return Ok(false);
                    }
                    match tx
                        .execute(
                            "INSERT INTO kv (k, n, flag) VALUES ($1, $2, $3)",
                            params!["row", i, true],
                        )
                        .await
                    {
                        Ok(_) => Ok(true),
                        Err(DbError::UniqueViolation) => Ok(false),
                        Err(e) => Err(e),
                    }
                });
                (i, r.unwrap())
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            let (i, won) = task.await.unwrap();
            if won {
                winners.push(i);
            }
        }
        assert_eq!(winners.len(), 1, "{:?}: exactly one winner", t.kind());
        let n = db
            .query("SELECT n FROM kv WHERE k = $1", params!["row"])
            .await
            .unwrap()[0]
            .i64(0);
        assert_eq!(n, winners[0], "the committed row is the winner's");
    }
}

/// Compare-and-set on a counter from many tasks: every increment lands exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_locked_increments_do_not_lose_updates() {
    for t in backends().await {
        make_table(&t.db, "kv").await;
        t.db.execute(
            "INSERT INTO kv (k, n, flag) VALUES ($1, $2, $3)",
            params!["c", 0i64, false],
        )
        .await
        .unwrap();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let db = t.db.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let r: Result<(), DbError> = transaction!(db, "cas", |tx| {
                        let n = tx
                            .query("SELECT n FROM kv WHERE k = $1 FOR UPDATE", params!["c"])
                            .await?[0]
                            .i64(0);
                        let changed = tx
                            .execute(
                                "UPDATE kv SET n = $1 WHERE k = $2 AND n = $3",
                                params![n + 1, "c", n],
                            )
                            .await?;
                        assert_eq!(changed, 1, "the row lock makes the CAS succeed");
                        Ok(())
                    });
                    r.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let n =
            t.db.query("SELECT n FROM kv WHERE k = $1", params!["c"])
                .await
                .unwrap()[0]
                .i64(0);
        assert_eq!(n, 40, "{:?}", t.kind());
    }
}

/// Postgres only: a `NOWAIT` lock on a row held elsewhere fails at once with `LockUnavailable`,
/// and a real deadlock is retried by `transaction!` until both sides commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_nowait_and_deadlock_retry() {
    let Some(t) = TestDb::postgres().await else {
        return;
    };
    assert_eq!(t.kind(), DbKind::Postgres);
    make_table(&t.db, "kv").await;
    for k in ["a", "b"] {
        t.db.execute(
            "INSERT INTO kv (k, n, flag) VALUES ($1, 0, FALSE)",
            params![k],
        )
        .await
        .unwrap();
    }
    // NOWAIT against a held lock.
    let mut holder = t.db.begin().await.unwrap();
    holder
        .query("SELECT n FROM kv WHERE k = $1 FOR UPDATE", params!["a"])
        .await
        .unwrap();
    let mut other = t.db.begin().await.unwrap();
    let started = std::time::Instant::now();
    let e = other
        .query(
            "SELECT n FROM kv WHERE k = $1 FOR UPDATE NOWAIT",
            params!["a"],
        )
        .await
        .unwrap_err();
    assert_eq!(e, DbError::LockUnavailable);
    assert!(started.elapsed().as_millis() < 500, "NOWAIT does not wait");
    other.rollback().await;
    holder.rollback().await;

    // Opposite lock orders: Postgres breaks the deadlock (or a lock timeout fires); the loser is
    // retried and both transactions finally commit.
    let attempts = Arc::new(AtomicU32::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let mut tasks = Vec::new();
    for (first, second) in [("a", "b"), ("b", "a")] {
        let db = t.db.clone();
        let attempts = attempts.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut round = 0;
            let r: Result<(), DbError> = transaction!(db, "deadlock-test", |tx| {
                round += 1;
                attempts.fetch_add(1, Ordering::SeqCst);
                tx.execute("UPDATE kv SET n = n + 1 WHERE k = $1", params![first])
                    .await?;
                if round == 1 {
                    barrier.wait().await;
                }
                tx.execute("UPDATE kv SET n = n + 1 WHERE k = $1", params![second])
                    .await?;
                Ok(())
            });
            r
        }));
    }
    for task in tasks {
        task.await.unwrap().expect("both commit after retry");
    }
    assert!(attempts.load(Ordering::SeqCst) >= 3, "one side was retried");
    let total =
        t.db.query("SELECT CAST(SUM(n) AS BIGINT) FROM kv", &[])
            .await
            .unwrap()[0]
            .i64(0);
    assert_eq!(total, 4);
}

/// A database that goes away answers transient errors, not panics or hangs.
#[tokio::test]
async fn unreachable_postgres_is_transient() {
    let db = Db::connect("postgres://postgres@127.0.0.1:1/none", 2)
        .await
        .unwrap();
    let e = db.ping().await.unwrap_err();
    assert!(e.is_transient(), "{e}");
}

/// SQLite plain reads see only committed state while a write transaction is open.
#[tokio::test]
async fn sqlite_reads_see_committed_state_only() {
    let t = TestDb::sqlite().await;
    make_table(&t.db, "kv").await;
    let mut tx = t.db.begin().await.unwrap();
    tx.execute(
        "INSERT INTO kv (k, n, flag) VALUES ($1, 1, 1)",
        params!["pending"],
    )
    .await
    .unwrap();
    let n = t.db.query("SELECT COUNT(*) FROM kv", &[]).await.unwrap()[0].i64(0);
    assert_eq!(n, 0);
    tx.commit().await.unwrap();
    let n = t.db.query("SELECT COUNT(*) FROM kv", &[]).await.unwrap()[0].i64(0);
    assert_eq!(n, 1);
}
