//! The sticky lane's batched grant: one transaction grants every queued host the single sticky
//! grant would grant at the same epoch, with the same rows written, in two round trips on
//! Postgres whatever the batch's size; every other host (no row, roll-isolated home, row locked
//! elsewhere) gets the single path's own answer. The many-host read equals the single read.
//! Both backends.

mod support;

use orca_relay::director::assign::{
    assign, assign_sticky_batch, AssignError, AssignOptions, StickyAsk,
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

fn ask(n: u32, region: Option<&str>) -> StickyAsk {
    StickyAsk {
        host: host(n),
        preferred_region: region.map(str::to_string),
    }
}

async fn cell(db: &Db, id: &str) {
    let url = format!("https://{}.cells.test", id.to_lowercase());
    cells::upsert_all(
        db,
        &[CellSpec {
            cell_id: id.into(),
            cell_url: url.clone(),
            region: US.into(),
            capacity_requests: 900,
            cap_and_bound: None,
            initial_state: Admission::General,
        }],
        now(),
    )
    .await
    .unwrap();
    let beat = Beat {
        cell_id: id.into(),
        cell_url: url,
        region: US.into(),
        cell_incarnation: "00000000-0000-4000-8000-000000000001".into(),
        started_at: 1,
        ready: true,
        observed_requests: 0,
        telemetry: None,
    };
    orca_relay::director::heartbeat::apply(db, &beat, now())
        .await
        .unwrap();
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
