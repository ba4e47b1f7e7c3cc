//! The sticky grant's cost and guarantees: a hinted reconnect of a host holding a
//! control on its live `general` home is granted in at most 4 statements and 2 round trips,
//! counted where they leave the store ([`orca_relay::store::wire`]), with the same result as the
//! general path: same epoch, lease raised, activity stamped, counters equal to the leases, the
//! preference stored. The sticky lane's verification refuses a host without a row or on a
//! roll-isolated home without writing. Both backends.
//!
//! The sticky lane's batched grant: one transaction grants every queued host the single sticky
//! grant would grant at the same epoch, with the same rows written, in two round trips on
//! Postgres whatever the batch's size; every other host (no row, roll-isolated home, row locked
//! elsewhere) gets the single path's own answer. The many-host read equals the single read.
//! Both backends.

mod support;

use orca_relay::director::assign::{
    assign, assign_sticky, assign_sticky_batch, AssignError, AssignOptions, StickyAsk,
};
use orca_relay::model::Admission;
use orca_relay::store::assignments::*;
use orca_relay::store::cells::{self, Beat, CellSpec};
use orca_relay::store::sticky_batch::lock_sticky_many;
use orca_relay::store::testing::backends;
use orca_relay::store::{Db, DbKind};
use support::director::check_invariants;

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
        // Hold the row for 300 ms: the NOWAIT attempt fails, the path waits (≤ 1 s on a live
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

/// The one-statement read returns what the step-by-step locks of `lock_host` return (several
/// leases with every column set, an open and a finished migration, live and released
/// reservations, text that needs JSON escaping), and on Postgres it holds the lease, migration and
/// reservation rows it read.
#[tokio::test]
async fn sticky_read_equals_the_step_by_step_locks() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A").await;
        let h = host(7);
        let g = assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        let at = now();
        let (u, id) = (h.user_id.as_str(), h.relay_host_id.as_str());
        db.execute(
            "INSERT INTO relay_assignment_activity_leases (user_id, relay_host_id, activity_id, activity_kind, \
             cell_id, request_units, expires_at, control_generation, cell_incarnation, idle_regional_rehome, \
             renewed_at, created_at, updated_at) VALUES ($1, $2, $3, 'control', 'A', 0, $4, 3, $5, $6, $4, $4, $4)",
            orca_relay::params![u, id, "control:A:3", at + 5_000, "inc \"quoted\" \\ é", true],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO relay_assignment_activity_leases (user_id, relay_host_id, activity_id, activity_kind, \
             cell_id, request_units, expires_at, idle_regional_rehome, created_at, updated_at) \
             VALUES ($1, $2, 'splice:s1', 'splice', 'A', 2, $3, $4, $3, $3)",
            orca_relay::params![u, id, at + 7_000, false],
        )
        .await
        .unwrap();
        for (epoch, completed) in [(5i64, Some(at)), (6, None)] {
            db.execute(
                "INSERT INTO relay_assignment_migrations (user_id, relay_host_id, assignment_epoch, kind, \
                 source_cell_id, target_cell_id, previous_epoch, source_request_units, target_reserved_units, \
                 arrival_deadline, expires_at, target_registered_at, completed_at, created_at, updated_at) \
                 VALUES ($1, $2, $3, 'evacuation', 'A', 'B', $4, 1, 1, $5, $5, NULL, $6, $5, $5)",
                orca_relay::params![u, id, epoch, epoch - 1, at, completed],
            )
            .await
            .unwrap();
        }
        for (rid, state) in [("r-live", "reserved"), ("r-old", "released")] {
            db.execute(
                "INSERT INTO relay_connection_reservations (reservation_id, user_id, relay_host_id, \
                 assignment_epoch, cell_id, state, created_at, timeout_at) VALUES ($1, $2, $3, 1, 'A', $4, $5, $5)",
                orca_relay::params![rid, u, id, state, at],
            )
            .await
            .unwrap();
        }
        let mut tx = db.begin().await.unwrap();
        let want = lock_host(&mut tx, &h, None).await.unwrap().unwrap();
        let want_home = cells::view_in(&mut tx, &g.cell_id).await.unwrap();
        tx.rollback().await;
        let mut tx = db.begin().await.unwrap();
        let (got, got_home) = lock_sticky(&mut tx, &h).await.unwrap().unwrap();
        assert_eq!(got.row, want.row);
        assert_eq!(got.leases, want.leases);
        assert_eq!(got.leases.len(), 3, "{:?}", got.leases);
        assert_eq!(got.open_migration, want.open_migration);
        assert_eq!(
            got.open_migration.as_ref().map(|m| m.assignment_epoch),
            Some(6)
        );
        assert_eq!(got_home, want_home);
        assert_eq!(got_home.as_ref().map(|c| c.outstanding), Some(1));
        if t.kind() == DbKind::Postgres {
            for sql in [
                "SELECT 1 FROM relay_assignment_activity_leases WHERE user_id = $1 AND relay_host_id = $2 FOR UPDATE NOWAIT",
                "SELECT 1 FROM relay_assignment_migrations WHERE user_id = $1 AND relay_host_id = $2 \
                 AND completed_at IS NULL FOR UPDATE NOWAIT",
                "SELECT 1 FROM relay_connection_reservations WHERE user_id = $1 AND relay_host_id = $2 \
                 AND state = 'reserved' FOR UPDATE NOWAIT",
            ] {
                let mut other = db.begin().await.unwrap();
                let r = other.query(sql, orca_relay::params![u, id]).await;
                assert!(r.is_err(), "not held by the sticky read: {sql}");
                other.rollback().await;
            }
        }
        tx.rollback().await;
        // No row: nothing.
        let mut tx = db.begin().await.unwrap();
        assert!(lock_sticky(&mut tx, &host(8)).await.unwrap().is_none());
        tx.rollback().await;
    }
}

// The batched grant.

fn ask(n: u32, region: Option<&str>) -> StickyAsk {
    StickyAsk {
        host: host(n),
        preferred_region: region.map(str::to_string),
    }
}

async fn place(db: &Db, n: u32) -> String {
    assign(db, &host(n), None, &regions(), AssignOptions::default())
        .await
        .unwrap()
        .cell_id
}

#[tokio::test]
async fn a_batch_grants_its_hosts_in_one_transaction() {
    for t in backends().await {
        // One pooled connection, so the statements are prepared once and the count is exact.
        let db = &Db::connect(&t.url, 1).await.unwrap();
        cell(db, "A").await;
        for n in 1..=20 {
            place(db, n).await;
        }
        let asks: Vec<StickyAsk> = (1..=20)
            .map(|n| ask(n, (n % 2 == 0).then_some(ASIA)))
            .collect();
        // Warm the statement cache, then measure.
        assign_sticky_batch(db, &asks, &regions()).await;
        let before: Vec<_> = rows_of(db, 1..=20).await;
        let start = db.wire_stats();
        let (results, batched) = assign_sticky_batch(db, &asks, &regions()).await;
        let cost = db.wire_stats() - start;
        eprintln!("{:?} batch of 20: {cost:?}", t.kind());
        assert_eq!(batched, 20);
        assert!(cost.statements <= 4, "{cost:?}");
        if t.kind() == DbKind::Postgres {
            assert!(cost.round_trips <= 2, "{cost:?}");
        }
        for (i, r) in results.into_iter().enumerate() {
            let n = i as u32 + 1;
            let g = r.unwrap();
            assert_eq!((g.cell_id.as_str(), g.assignment_epoch), ("A", 1));
            assert!(g.moved.is_none());
            let row = read_row(db, &host(n)).await.unwrap().unwrap();
            assert_eq!(row.assignment_epoch, 1);
            assert_eq!(row.lease_expires_at, g.lease_expires_at);
            assert!(row.lease_expires_at >= before[i].lease_expires_at);
            assert!(row.last_activity_at >= before[i].last_activity_at);
            let want = if n % 2 == 0 { Some(ASIA) } else { None };
            assert_eq!(row.preferred_region.as_deref(), want);
            assert_eq!(row.counters.controls, 1);
        }
        check_invariants(db).await;
    }
}

async fn rows_of(db: &Db, ns: std::ops::RangeInclusive<u32>) -> Vec<AssignmentRow> {
    let mut out = Vec::new();
    for n in ns {
        out.push(read_row(db, &host(n)).await.unwrap().unwrap());
    }
    out
}

#[tokio::test]
async fn hosts_the_batch_cannot_grant_get_the_single_answer() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A").await;
        cell(db, "B").await;
        place(db, 1).await;
        let isolated = place(db, 2).await;
        cells::set_state(
            db,
            &isolated,
            Admission::MigrationOnly,
            Some(true),
            None,
            now(),
        )
        .await
        .unwrap();
        let before = read_row(db, &host(2)).await.unwrap().unwrap();
        // Host 3 has no row; host 2's home is roll-isolated: neither is the sticky lane's.
        let asks = [ask(3, None), ask(2, None), ask(1, None)];
        let (results, batched) = assign_sticky_batch(db, &asks, &regions()).await;
        assert_eq!(batched, 1);
        assert_eq!(results[0], Err(AssignError::NotSticky));
        assert_eq!(results[1], Err(AssignError::NotSticky));
        assert_eq!(results[2].as_ref().unwrap().assignment_epoch, 1);
        assert!(read_row(db, &host(3)).await.unwrap().is_none());
        assert_eq!(read_row(db, &host(2)).await.unwrap().unwrap(), before);
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn a_row_locked_elsewhere_is_skipped_not_waited_for() {
    for t in backends().await {
        if t.kind() != DbKind::Postgres {
            continue;
        }
        let db = &t.db;
        cell(db, "A").await;
        for n in 1..=3 {
            place(db, n).await;
        }
        let h = host(2);
        let mut tx = db.begin().await.unwrap();
        tx.query(
            "SELECT user_id FROM relay_assignments WHERE user_id = $1 AND relay_host_id = $2 FOR UPDATE",
            orca_relay::params![&h.user_id, &h.relay_host_id],
        )
        .await
        .unwrap();
        let asks = [ask(1, None), ask(2, None), ask(3, None)];
        let (results, batched) = assign_sticky_batch(db, &asks, &regions()).await;
        tx.commit().await.unwrap();
        // The batch granted the free rows; the locked one went the single way, waited its
        // bounded wait and was answered busy.
        assert_eq!(batched, 2);
        assert!(results[0].is_ok() && results[2].is_ok());
        assert_eq!(results[1], Err(AssignError::RowBusy));
        check_invariants(db).await;
    }
}

/// The many-host read returns, for each host, what the single read returns (several leases, text
/// that needs JSON escaping, an open migration, a live reservation), and nothing for a host
/// without a row.
#[tokio::test]
async fn the_many_host_read_equals_the_single_read() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A").await;
        for n in 1..=3 {
            place(db, n).await;
        }
        let h = host(2);
        let at = now();
        let (u, id) = (h.user_id.as_str(), h.relay_host_id.as_str());
        db.execute(
            "INSERT INTO relay_assignment_activity_leases (user_id, relay_host_id, activity_id, activity_kind, \
             cell_id, request_units, expires_at, control_generation, cell_incarnation, idle_regional_rehome, \
             renewed_at, created_at, updated_at) VALUES ($1, $2, $3, 'control', 'A', 0, $4, 3, $5, $6, $4, $4, $4)",
            orca_relay::params![u, id, "control:A:3", at + 5_000, "inc \"quoted\" \\ é", true],
        )
        .await
        .unwrap();
        db.execute(
            "INSERT INTO relay_assignment_migrations (user_id, relay_host_id, assignment_epoch, kind, \
             source_cell_id, target_cell_id, previous_epoch, source_request_units, target_reserved_units, \
             arrival_deadline, expires_at, target_registered_at, completed_at, created_at, updated_at) \
             VALUES ($1, $2, 6, 'evacuation', 'A', 'B', 5, 1, 1, $3, $3, NULL, NULL, $3, $3)",
            orca_relay::params![u, id, at],
        )
        .await
        .unwrap();
        let hosts: Vec<HostKey> = (1..=4).map(host).collect();
        let mut tx = db.begin().await.unwrap();
        let many = lock_sticky_many(&mut tx, &hosts).await.unwrap();
        assert_eq!(many.len(), 3, "host 4 has no row");
        for h in &hosts[..3] {
            let one = lock_sticky(&mut tx, h).await.unwrap().unwrap();
            let got = &many[h];
            assert_eq!(format!("{got:?}"), format!("{one:?}"), "{h:?}");
        }
        tx.rollback().await;
    }
}
