//! The Postgres timeline check (`store::timeline`): a connection that finds the server on another
//! timeline than the one recorded advances every epoch once, raises the epoch floor, and a host
//! placed for the first time afterwards starts above the floor. The timeline change is simulated by
//! recording a different timeline; `tests/fault_pg_failover.rs` does it with a real promotion. A
//! write refused by a read-only server is a transient failure (a retryable 503), not a fatal one.
//! Postgres only; skipped without ORCA_RELAY_TEST_POSTGRES_URL.

use orca_relay::model::HostKey;
use orca_relay::params;
use orca_relay::store::restore::JUMP_MARGIN;
use orca_relay::store::testing::TestDb;
use orca_relay::store::{assignments, Db};

async fn one_i64(db: &Db, sql: &str) -> i64 {
    db.query(sql, params![]).await.unwrap()[0].i64(0)
}

#[tokio::test]
async fn a_new_timeline_advances_epochs_once_and_new_hosts_start_above_the_floor() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipping: ORCA_RELAY_TEST_POSTGRES_URL unset");
        return;
    };
    let now = orca_relay::clock::now_ms();
    t.db.execute(
        "INSERT INTO relay_assignments (user_id, relay_host_id, cell_id, assignment_epoch, \
         lease_expires_at, last_activity_at, created_at, updated_at) \
         VALUES ('u1', 'h1', 'c1', 3, 0, $1, $1, $1)",
        params![now],
    )
    .await
    .unwrap();
    // The migration recorded the server's timeline; record another, as a promotion would leave.
    let real = one_i64(
        &t.db,
        "SELECT timeline FROM relay_store_timeline WHERE id = 1",
    )
    .await;
    assert!(real >= 1);
    t.db.execute(
        "UPDATE relay_store_timeline SET timeline = $1 WHERE id = 1",
        params![real + 7],
    )
    .await
    .unwrap();

    // A new pool: its first connection sees the change before it is used.
    let db = Db::connect(&t.url, 2).await.unwrap();
    let epoch = one_i64(
        &db,
        "SELECT assignment_epoch FROM relay_assignments WHERE relay_host_id = 'h1'",
    )
    .await;
    let floor = one_i64(&db, "SELECT epoch_floor FROM relay_store_timeline").await;
    let recorded = one_i64(&db, "SELECT timeline FROM relay_store_timeline").await;
    assert!(epoch >= 3 + JUMP_MARGIN, "epoch {epoch} not advanced");
    assert_eq!(floor, epoch - 3, "the floor rose by the jump");
    assert_eq!(recorded, real, "the server's timeline recorded");

    // Once per timeline: another pool finds nothing to do.
    let again = Db::connect(&t.url, 2).await.unwrap();
    assert_eq!(
        one_i64(
            &again,
            "SELECT assignment_epoch FROM relay_assignments WHERE relay_host_id = 'h1'"
        )
        .await,
        epoch
    );

    // A host placed for the first time starts above the floor.
    let host = HostKey {
        user_id: "u2".into(),
        relay_host_id: "h2".into(),
    };
    let mut tx = again.begin().await.unwrap();
    let first = assignments::insert_row(&mut tx, &host, "c1", now, None, now)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(first, floor + 1);
    again.close();
    db.close();
}

#[tokio::test]
async fn a_write_refused_as_read_only_is_transient() {
    let Some(t) = TestDb::postgres().await else {
        eprintln!("skipping: ORCA_RELAY_TEST_POSTGRES_URL unset");
        return;
    };
    // What a write meets on a standby, or on a primary being demoted: SQLSTATE 25006.
    let mut tx = t.db.begin().await.unwrap();
    tx.execute_batch("SET TRANSACTION READ ONLY").await.unwrap();
    let e = tx
        .execute(
            "UPDATE relay_store_timeline SET settled_at = 0 WHERE id = 1",
            params![],
        )
        .await
        .unwrap_err();
    tx.rollback().await;
    assert!(
        matches!(e, orca_relay::store::DbError::Transient(_)),
        "{e:?}"
    );
}
