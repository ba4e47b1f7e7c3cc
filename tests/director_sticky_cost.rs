//! The sticky grant's cost and guarantees (issue 12): a hinted reconnect of a host holding a
//! control on its live `general` home is granted in at most 4 statements and 2 round trips,
//! counted where they leave the store ([`orca_relay::store::wire`]), with the same result as the
//! general path: same epoch, lease raised, activity stamped, counters equal to the leases, the
//! preference stored. The sticky lane's verification refuses a host without a row or on a
//! roll-isolated home without writing. Both backends.

mod director_common;

use director_common::check_invariants;
use orca_relay::director::assign::{assign, assign_sticky, AssignError, AssignOptions};
use orca_relay::model::Admission;
use orca_relay::store::assignments::*;
use orca_relay::store::cells::{self, Beat, CellSpec};
use orca_relay::store::testing::backends;
use orca_relay::store::{Db, DbKind};

const US: &str = "us-central1";
const ASIA: &str = "asia-east2";

fn regions() -> Vec<String> {
    vec![US.into(), ASIA.into()]
}

fn now() -> i64 {
    orca_relay::clock::now_ms()
}

fn host(n: u32) -> HostKey {
    HostKey {
        user_id: format!("user-{n}"),
        relay_host_id: format!("hostid{n:010}"),
    }
}

async fn cell(db: &Db, id: &str) {
    cells::upsert_all(
        db,
        &[CellSpec {
            cell_id: id.into(),
            cell_url: format!("https://{}.cells.test", id.to_lowercase()),
            region: US.into(),
            capacity_requests: 900,
            cap_and_bound: None,
            initial_state: Admission::General,
        }],
        now(),
    )
    .await
    .unwrap();
    orca_relay::director::heartbeat::apply(
        db,
        &Beat {
            cell_id: id.into(),
            cell_url: format!("https://{}.cells.test", id.to_lowercase()),
            region: US.into(),
            cell_incarnation: "00000000-0000-4000-8000-000000000001".into(),
            started_at: 1,
            ready: true,
            observed_requests: 0,
            telemetry: None,
        },
        now(),
    )
    .await
    .unwrap();
}

async fn row_count(db: &Db) -> i64 {
    db.query("SELECT COUNT(*) FROM relay_assignments", &[])
        .await
        .unwrap()[0]
        .i64(0)
}

#[tokio::test]
async fn sticky_grant_in_four_statements_and_two_round_trips() {
    for t in backends().await {
        // One pooled connection, so the statements are prepared once and the count is exact.
        let db = &Db::connect(&t.url, 1).await.unwrap();
        cell(db, "A").await;
        let h = host(1);
        let placed = assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        assert_eq!(placed.assignment_epoch, 1);
        // Warm the statement cache, then measure.
        assign_sticky(db, &h, None, &regions()).await.unwrap();
        let before_row = read_row(db, &h).await.unwrap().unwrap();
        let start = db.wire_stats();
        let g = assign_sticky(db, &h, Some(ASIA), &regions()).await.unwrap();
        let cost = db.wire_stats() - start;
        eprintln!("{:?} sticky grant: {cost:?}", t.kind());
        assert!(cost.statements <= 4, "{cost:?}");
        assert_eq!(cost.prepares, 0, "{cost:?}");
        if t.kind() == DbKind::Postgres {
            assert!(cost.round_trips <= 2, "{cost:?}");
        }
        // Same epoch and home, lease raised, activity stamped, preference stored.
        assert_eq!(g.cell_id, "A");
        assert_eq!(g.assignment_epoch, 1);
        assert!(g.moved.is_none());
        let row = read_row(db, &h).await.unwrap().unwrap();
        assert_eq!(row.assignment_epoch, 1);
        assert_eq!(row.lease_expires_at, g.lease_expires_at);
        assert!(row.lease_expires_at >= before_row.lease_expires_at);
        assert!(row.last_activity_at >= before_row.last_activity_at);
        assert_eq!(row.preferred_region.as_deref(), Some(ASIA));
        assert_eq!(row.counters.controls, 1);
        // The plain `assign` takes the same fast path.
        let start = db.wire_stats();
        let g2 = assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        let cost = db.wire_stats() - start;
        assert!(cost.statements <= 4, "{cost:?}");
        assert_eq!(g2.assignment_epoch, 1);
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn sticky_verification_refuses_without_writing() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A").await;
        cell(db, "B").await;
        let (h1, h2) = (host(1), host(2));
        // No row: not the sticky lane's, nothing placed.
        assert_eq!(
            assign_sticky(db, &h1, None, &regions()).await,
            Err(AssignError::NotSticky)
        );
        assert_eq!(row_count(db).await, 0);
        // A roll-isolated home: not the sticky lane's either; the row is untouched.
        let g = assign(db, &h2, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        cells::set_state(
            db,
            &g.cell_id,
            Admission::MigrationOnly,
            Some(true),
            None,
            now(),
        )
        .await
        .unwrap();
        let before = read_row(db, &h2).await.unwrap().unwrap();
        assert_eq!(
            assign_sticky(db, &h2, None, &regions()).await,
            Err(AssignError::NotSticky)
        );
        assert_eq!(read_row(db, &h2).await.unwrap().unwrap(), before);
        // The placement lane's `assign` moves it off the isolated home.
        let moved = assign(db, &h2, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        assert_ne!(moved.cell_id, g.cell_id);
        assert_eq!(moved.assignment_epoch, 2);
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn busy_row_falls_back_to_the_waiting_path() {
    for t in backends().await {
        if t.kind() != DbKind::Postgres {
            continue;
        }
        let db = &t.db;
        cell(db, "A").await;
        let h = host(1);
        assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        // Hold the row for 300 ms: the NOWAIT attempt fails, the §5.2 path waits (≤ 1 s on a live
        // general home) and grants once the holder commits.
        let mut tx = db.begin().await.unwrap();
        tx.query("SELECT user_id FROM relay_assignments FOR UPDATE", &[])
            .await
            .unwrap();
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let holder = tokio::spawn(async move {
            let _ = wait.await;
            tx.commit().await.unwrap();
        });
        let db2 = db.clone();
        let h2 = h.clone();
        let grant = tokio::spawn(async move { assign_sticky(&db2, &h2, None, &regions()).await });
        // Let the grant reach its wait, then release the row.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let waiting = db
                .query(
                    "SELECT COUNT(*) FROM pg_locks w WHERE NOT w.granted AND w.locktype = 'transactionid' \
                     AND w.pid IN (SELECT l.pid FROM pg_locks l WHERE l.relation = 'relay_assignments'::regclass)",
                    &[],
                )
                .await
                .unwrap()[0]
                .i64(0);
            if waiting > 0 || std::time::Instant::now() > deadline {
                break;
            }
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        holder.await.unwrap();
        let g = grant.await.unwrap().unwrap();
        assert_eq!(g.assignment_epoch, 1);
        check_invariants(db).await;
    }
}
