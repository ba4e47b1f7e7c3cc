//! Behaviour tests of the cell-facing assignment operations (ARCHITECTURE.md) and the `assign`
//! transaction, on SQLite and (when configured) Postgres, checking the invariants of after
//! every step.

mod support;

use orca_relay::director::assign::{assign, AssignError, AssignOptions};
use orca_relay::model::Admission;
use orca_relay::model::{BeatTelemetry, LeaseCounts};
use orca_relay::store::assignments::*;
use orca_relay::store::cells::{self, Beat, CellSpec};
use orca_relay::store::testing::backends;
use orca_relay::store::Db;
use support::director::check_invariants;

const US: &str = "us-central1";

fn regions() -> Vec<String> {
    vec![US.into(), "asia-east2".into()]
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

async fn cell(db: &Db, id: &str, capacity: i64, capped: bool) {
    cells::upsert_all(
        db,
        &[CellSpec {
            cell_id: id.into(),
            cell_url: format!("https://{}.cells.test", id.to_lowercase()),
            region: US.into(),
            capacity_requests: capacity,
            cap_and_bound: capped.then_some((600, 0)),
            initial_state: Admission::General,
        }],
        now(),
    )
    .await
    .unwrap();
    beat(db, id, capped, 1).await;
}

async fn beat(db: &Db, id: &str, capped: bool, watermark: i64) {
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
            telemetry: capped.then_some(BeatTelemetry {
                total_connections: 0,
                in_flight_connections: 0,
                reserved_connection_units: 0,
                enforced_connection_units: 0,
                connection_hard_cap: 600,
                connection_unobserved_bound: 0,
                connection_inclusion_watermark: watermark,
            }),
        },
        now(),
    )
    .await
    .unwrap();
}

async fn reserved(db: &Db, id: &str) -> i64 {
    db.query(
        "SELECT reserved_requests FROM relay_cells WHERE cell_id = $1",
        &[id.into()],
    )
    .await
    .unwrap()[0]
        .i64(0)
}

async fn leases(db: &Db, h: &HostKey) -> Vec<(String, String, i64)> {
    db.query(
        "SELECT activity_id, cell_id, request_units FROM relay_assignment_activity_leases \
         WHERE user_id = $1 AND relay_host_id = $2 ORDER BY activity_id",
        &[h.user_id.clone().into(), h.relay_host_id.clone().into()],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.str(0), r.str(1), r.i64(2)))
    .collect()
}

#[tokio::test]
async fn verify_and_resolve_are_plain_reads() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A", 900, false).await;
        let h = host(1);
        assert!(!verify_cell_assignment(db, &h, "A", 1).await.unwrap());
        assert_eq!(resolve_assignment(db, &h).await.unwrap(), None);
        let g = assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        assert_eq!((g.cell_id.as_str(), g.assignment_epoch), ("A", 1));
        assert!(verify_cell_assignment(db, &h, "A", 1).await.unwrap());
        assert!(!verify_cell_assignment(db, &h, "A", 2).await.unwrap());
        assert!(!verify_cell_assignment(db, &h, "B", 1).await.unwrap());
        let v = resolve_assignment(db, &h).await.unwrap().unwrap();
        assert_eq!(v.cell_id, "A");
        assert_eq!(v.cell_url, "https://a.cells.test");
        assert_eq!(v.assignment_epoch, 1);
        assert!(v.lease_expires_at >= now() + 80_000);
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn activate_control_converts_pending_and_claims_reservation() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A", 900, true).await;
        let h = host(1);
        assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        assert_eq!(reserved(db, "A").await, 1);
        let req = ActivateControl {
            cell_id: "A".into(),
            assignment_epoch: 1,
            generation: 7,
            connection_inclusion_watermark: Some(3),
            idle_regional_rehome: true,
            cell_incarnation: "00000000-0000-4000-8000-00000000000A".into(),
        };
        // Wrong epoch or cell → wrong_assignment.
        let mut bad = req.clone();
        bad.assignment_epoch = 2;
        assert_eq!(
            activate_control(db, &h, &bad, now()).await,
            Err(ActivityError::WrongAssignment)
        );
        let mut bad = req.clone();
        bad.cell_id = "B".into();
        assert_eq!(
            activate_control(db, &h, &bad, now()).await,
            Err(ActivityError::WrongAssignment)
        );
        assert_eq!(
            activate_control(db, &host(9), &req, now()).await,
            Err(ActivityError::WrongAssignment)
        );
        let id = activate_control(db, &h, &req, now()).await.unwrap();
        assert_eq!(id, "control:A:7");
        assert_eq!(
            leases(db, &h).await,
            vec![("control:A:7".into(), "A".into(), 1)]
        );
        assert_eq!(reserved(db, "A").await, 1, "conversion charges nothing");
        let r = db
            .query(
                "SELECT state, cell_incarnation, inclusion_watermark FROM relay_connection_reservations",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].str(0), "claimed");
        assert_eq!(r[0].str(1), "00000000-0000-4000-8000-00000000000a");
        assert_eq!(r[0].i64(2), 3);
        let l = db
            .query(
                "SELECT control_generation, cell_incarnation, idle_regional_rehome, renewed_at FROM relay_assignment_activity_leases",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(l[0].i64(0), 7);
        assert!(l[0].bool(2));
        assert!(!l[0].is_null(3));
        // Refresh the same id: no new charge.
        activate_control(db, &h, &req, now()).await.unwrap();
        assert_eq!(reserved(db, "A").await, 1);
        // A newer generation charges 1 and deletes the lower one.
        let mut g8 = req.clone();
        g8.generation = 8;
        assert_eq!(
            activate_control(db, &h, &g8, now()).await.unwrap(),
            "control:A:8"
        );
        assert_eq!(
            leases(db, &h).await,
            vec![("control:A:8".into(), "A".into(), 1)]
        );
        assert_eq!(reserved(db, "A").await, 1);
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn activate_control_capacity() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A", 1, false).await;
        let h = host(1);
        assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        let req = ActivateControl {
            cell_id: "A".into(),
            assignment_epoch: 1,
            generation: 1,
            connection_inclusion_watermark: None,
            idle_regional_rehome: false,
            cell_incarnation: "00000000-0000-4000-8000-000000000001".into(),
        };
        activate_control(db, &h, &req, now()).await.unwrap();
        // generation 2 replaces 1, but it must be charged before the old one is freed: capacity 1
        // is full → relay_capacity_exhausted.
        let mut g2 = req.clone();
        g2.generation = 2;
        assert_eq!(
            activate_control(db, &h, &g2, now()).await,
            Err(ActivityError::RelayCapacityExhausted)
        );
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn acquire_release_and_validation() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A", 900, false).await;
        cell(db, "B", 900, false).await;
        let h = host(1);
        let n = now();
        assert_eq!(
            acquire_activity(db, &h, "splice:c1", ActivityKind::Splice, "A", None, n).await,
            Err(ActivityError::AssignmentNotFound)
        );
        assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        let cases: Vec<(&str, ActivityKind, ActivityError)> = vec![
            (
                "splice:",
                ActivityKind::Splice,
                ActivityError::InvalidActivityId,
            ),
            (
                "invite:c1",
                ActivityKind::Splice,
                ActivityError::InvalidActivityId,
            ),
            (
                "control-pending:1",
                ActivityKind::Control,
                ActivityError::InvalidActivityKind,
            ),
            (
                "migration:1",
                ActivityKind::Splice,
                ActivityError::InvalidActivityKind,
            ),
            (
                "control:A:x",
                ActivityKind::Control,
                ActivityError::InvalidActivityId,
            ),
        ];
        for (id, kind, err) in cases {
            assert_eq!(
                acquire_activity(db, &h, id, kind, "A", None, n).await,
                Err(err),
                "{id}"
            );
        }
        assert_eq!(
            acquire_activity(db, &h, "splice:c1", ActivityKind::Splice, "A", Some(n), n).await,
            Err(ActivityError::InvalidActivityExpiry)
        );
        assert_eq!(
            acquire_activity(
                db,
                &h,
                "splice:c1",
                ActivityKind::Splice,
                "A",
                Some(n + 600_001),
                n
            )
            .await,
            Err(ActivityError::InvalidActivityExpiry)
        );
        assert_eq!(
            acquire_activity(
                db,
                &h,
                "control:A:1",
                ActivityKind::Control,
                "A",
                Some(n + 120_001),
                n
            )
            .await,
            Err(ActivityError::InvalidActivityExpiry)
        );
        assert_eq!(
            acquire_activity(db, &h, "splice:c1", ActivityKind::Splice, "B", None, n).await,
            Err(ActivityError::ActivityCellNotAuthoritative)
        );
        acquire_activity(db, &h, "splice:c1", ActivityKind::Splice, "A", None, n)
            .await
            .unwrap();
        acquire_activity(
            db,
            &h,
            "invite-offer:r1",
            ActivityKind::Invite,
            "A",
            None,
            n,
        )
        .await
        .unwrap();
        acquire_activity(
            db,
            &h,
            "install:r2",
            ActivityKind::Install,
            "A",
            Some(n + 600_000),
            n,
        )
        .await
        .unwrap();
        acquire_activity(
            db,
            &h,
            "confirmation:c1",
            ActivityKind::Confirmation,
            "A",
            None,
            n,
        )
        .await
        .unwrap();
        assert_eq!(reserved(db, "A").await, 1 + 2 + 1 + 1 + 1);
        // Extending an existing id charges nothing.
        acquire_activity(
            db,
            &h,
            "splice:c1",
            ActivityKind::Splice,
            "A",
            Some(n + 500_000),
            n,
        )
        .await
        .unwrap();
        assert_eq!(reserved(db, "A").await, 6);
        check_invariants(db).await;
        let row = read_row(db, &h).await.unwrap().unwrap();
        assert_eq!(
            row.counters,
            LeaseCounts {
                controls: 1,
                splices: 1,
                invites: 1,
                installs: 1,
                confirmations: 1,
                migrations: 0
            }
        );
        assert!(row.lease_expires_at >= n + 600_000);
        release_activity(db, &h, "splice:c1", n).await.unwrap();
        release_activity(db, &h, "splice:c1", n).await.unwrap();
        release_activity(db, &host(9), "splice:c1", n)
            .await
            .unwrap();
        assert_eq!(reserved(db, "A").await, 4);
        let row = read_row(db, &h).await.unwrap().unwrap();
        assert_eq!(
            row.counters,
            LeaseCounts {
                controls: 1,
                splices: 0,
                invites: 1,
                installs: 1,
                confirmations: 1,
                migrations: 0
            }
        );
        assert!(
            row.lease_expires_at >= n + 600_000,
            "never lowered between moves"
        );
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn acquire_capacity_exhausted() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A", 2, false).await;
        let h = host(1);
        assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        assert_eq!(
            acquire_activity(db, &h, "splice:c1", ActivityKind::Splice, "A", None, now()).await,
            Err(ActivityError::RelayCapacityExhausted)
        );
        acquire_activity(db, &h, "invite:c1", ActivityKind::Invite, "A", None, now())
            .await
            .unwrap();
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn renewals_outcomes() {
    for t in backends().await {
        let db = &t.db;
        cell(db, "A", 900, false).await;
        cell(db, "B", 900, false).await;
        let h = host(1);
        assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        let inc = "00000000-0000-4000-8000-000000000001";
        let req = ActivateControl {
            cell_id: "A".into(),
            assignment_epoch: 1,
            generation: 3,
            connection_inclusion_watermark: None,
            idle_regional_rehome: false,
            cell_incarnation: inc.into(),
        };
        activate_control(db, &h, &req, now()).await.unwrap();
        let n = now();
        acquire_activity(
            db,
            &h,
            "splice:s1",
            ActivityKind::Splice,
            "A",
            Some(n + 10_000),
            n,
        )
        .await
        .unwrap();
        let row = |host: HostKey, id: &str, exp: i64| RenewalRow {
            host,
            activity_id: id.into(),
            expires_at: exp,
        };
        let out = renew_control_activities(
            db,
            "A",
            inc,
            &[
                row(h.clone(), "control:A:3", n + 100_000),
                row(h.clone(), "control:B:3", n + 100_000),
                row(h.clone(), "control:A:3", n + 120_001),
                row(host(9), "control:A:1", n + 100_000),
                row(h.clone(), "control:A:4", n + 100_000),
            ],
            n,
        )
        .await;
        assert_eq!(
            out,
            vec![
                RenewalOutcome::Renewed,
                RenewalOutcome::InvalidActivityId,
                RenewalOutcome::InvalidActivityExpiry,
                RenewalOutcome::AssignmentNotFound,
                RenewalOutcome::ControlActivityNotFound,
            ]
        );
        // The live splice was extended with the control.
        let exp = db
            .query(
                "SELECT expires_at FROM relay_assignment_activity_leases WHERE activity_id = 'splice:s1'",
                &[],
            )
            .await
            .unwrap()[0]
            .i64(0);
        assert_eq!(exp, n + 100_000);
        // Another incarnation: moved.
        let out = renew_control_activities(
            db,
            "A",
            "00000000-0000-4000-8000-000000000002",
            &[row(h.clone(), "control:A:3", n + 100_000)],
            n,
        )
        .await;
        assert_eq!(out, vec![RenewalOutcome::ControlActivityMoved]);
        // The host moved away: not authoritative.
        db.execute(
            "UPDATE relay_assignments SET cell_id = 'B', assignment_epoch = 2",
            &[],
        )
        .await
        .unwrap();
        let out = renew_control_activities(
            db,
            "A",
            inc,
            &[row(h.clone(), "control:A:3", n + 100_000)],
            n,
        )
        .await;
        assert_eq!(out, vec![RenewalOutcome::ActivityCellNotAuthoritative]);
        // A lease without incarnation (re-acquired) gets the batch's on renewal.
        db.execute(
            "UPDATE relay_assignments SET cell_id = 'A', assignment_epoch = 1",
            &[],
        )
        .await
        .unwrap();
        db.execute(
            "UPDATE relay_assignment_activity_leases SET cell_incarnation = NULL, control_generation = NULL WHERE activity_id = 'control:A:3'",
            &[],
        )
        .await
        .unwrap();
        let out = renew_control_activities(
            db,
            "A",
            inc,
            &[row(h.clone(), "control:A:3", n + 100_000)],
            n,
        )
        .await;
        assert_eq!(out, vec![RenewalOutcome::Renewed]);
        let l = db
            .query(
                "SELECT cell_incarnation, control_generation FROM relay_assignment_activity_leases WHERE activity_id = 'control:A:3'",
                &[],
            )
            .await
            .unwrap();
        assert_eq!((l[0].str(0), l[0].i64(1)), (inc.to_string(), 3));
        check_invariants(db).await;
    }
}

#[tokio::test]
async fn renewal_skips_a_locked_row_on_postgres() {
    for t in backends().await {
        if t.kind() != orca_relay::store::DbKind::Postgres {
            continue;
        }
        let db = &t.db;
        cell(db, "A", 900, false).await;
        let h = host(1);
        assign(db, &h, None, &regions(), AssignOptions::default())
            .await
            .unwrap();
        let inc = "00000000-0000-4000-8000-000000000001";
        let req = ActivateControl {
            cell_id: "A".into(),
            assignment_epoch: 1,
            generation: 1,
            connection_inclusion_watermark: None,
            idle_regional_rehome: false,
            cell_incarnation: inc.into(),
        };
        activate_control(db, &h, &req, now()).await.unwrap();
        let mut tx = db.begin().await.unwrap();
        tx.query("SELECT user_id FROM relay_assignments FOR UPDATE", &[])
            .await
            .unwrap();
        let out = renew_control_activities(
            db,
            "A",
            inc,
            &[RenewalRow {
                host: h.clone(),
                activity_id: "control:A:1".into(),
                expires_at: now() + 60_000,
            }],
            now(),
        )
        .await;
        assert_eq!(out, vec![RenewalOutcome::AssignmentLockUnavailable]);
        tx.rollback().await;
        // And `assign` refuses the busy row on a live general home only after waiting ≤ 1 s.
        let mut tx = db.begin().await.unwrap();
        tx.query("SELECT user_id FROM relay_assignments FOR UPDATE", &[])
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let r = assign(db, &h, None, &regions(), AssignOptions::default()).await;
        assert_eq!(r, Err(AssignError::RowBusy));
        assert!(started.elapsed() >= std::time::Duration::from_millis(900));
        tx.rollback().await;
    }
}

/// Host 1 placed on cell A, with an open evacuation at epoch 1 from cell B to A; the host and
/// the time the evacuation started.
async fn placed_on_a_with_evacuation(db: &Db) -> (HostKey, i64) {
    cell(db, "A", 900, false).await;
    let h = host(1);
    assign(db, &h, None, &regions(), AssignOptions::default())
        .await
        .unwrap();
    let n = now();
    open_evacuation_to_a(db, &h, n).await;
    (h, n)
}

/// An open evacuation of `h` at epoch 1 from cell B to cell A, started at `n`.
async fn open_evacuation_to_a(db: &Db, h: &HostKey, n: i64) {
    db.execute(
        "INSERT INTO relay_assignment_migrations (user_id, relay_host_id, assignment_epoch, kind, source_cell_id, \
         target_cell_id, previous_epoch, source_request_units, target_reserved_units, arrival_deadline, expires_at, \
         created_at, updated_at) VALUES ($1, $2, 1, 'evacuation', 'B', 'A', 0, 1, 2, $3, $3, $4, $4)",
        &[h.user_id.clone().into(), h.relay_host_id.clone().into(), (n + 900_000).into(), n.into()],
    )
    .await
    .unwrap();
}

/// The one migration's `target_registered_at`.
async fn registered_at(db: &Db) -> Option<i64> {
    db.query(
        "SELECT target_registered_at FROM relay_assignment_migrations",
        &[],
    )
    .await
    .unwrap()[0]
        .opt_i64(0)
}

#[tokio::test]
async fn mark_migration_target_registered_only_open_matching() {
    for t in backends().await {
        let db = &t.db;
        let (h, n) = placed_on_a_with_evacuation(db).await;
        mark_migration_target_registered(db, &h, "B", 1, n)
            .await
            .unwrap();
        mark_migration_target_registered(db, &h, "A", 2, n)
            .await
            .unwrap();
        let reg = || registered_at(db);
        assert_eq!(reg().await, None);
        mark_migration_target_registered(db, &h, "A", 1, n)
            .await
            .unwrap();
        assert_eq!(reg().await, Some(n));
        mark_migration_target_registered(db, &h, "A", 1, n + 5)
            .await
            .unwrap();
        assert_eq!(reg().await, Some(n), "set only if null");
    }
}

/// The cell's activation step in one transaction: the lease and the registration of the open
/// migration targeting the cell both take effect; a refused activation leaves neither.
#[tokio::test]
async fn activate_control_registered_writes_both_or_neither() {
    for t in backends().await {
        let db = &t.db;
        let (h, n) = placed_on_a_with_evacuation(db).await;
        let reg = || registered_at(db);
        let req = ActivateControl {
            cell_id: "A".into(),
            assignment_epoch: 1,
            generation: 3,
            connection_inclusion_watermark: None,
            idle_regional_rehome: false,
            cell_incarnation: "00000000-0000-4000-8000-00000000000A".into(),
        };
        let mut bad = req.clone();
        bad.assignment_epoch = 2;
        assert_eq!(
            activate_control_registered(db, &h, &bad, n).await,
            Err(ActivityError::WrongAssignment)
        );
        assert_eq!(reg().await, None, "a refused activation registers nothing");
        assert!(
            !leases(db, &h)
                .await
                .iter()
                .any(|l| l.0.starts_with("control:")),
            "a refused activation leaves no control lease"
        );
        let id = activate_control_registered(db, &h, &req, n).await.unwrap();
        assert_eq!(id, "control:A:3");
        assert_eq!(reg().await, Some(n));
        assert!(leases(db, &h).await.iter().any(|l| l.0 == "control:A:3"));
    }
}
