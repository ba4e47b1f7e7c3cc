//! `commitIdleRegionalRehome` and `reconcileIdleRegionalRehome` (docs/reference/http.md), the
//! control row and reports, on SQLite and (when configured) Postgres, checking the invariants
//! after every write.

mod support;

use orca_relay::contract::wire::Safety;
use orca_relay::director::assign::{assign, AssignOptions};
use orca_relay::model::Admission;
use orca_relay::rehome::rules::{self, Apply, RehomeRequest, Report, ReportOutcome, ReportStatus};
use orca_relay::rehome::service::{self, Committed, Reconciled};
use orca_relay::store::assignments::{activate_control, ActivateControl, HostKey};
use orca_relay::store::cells::{self, Beat, CellSpec};
use orca_relay::store::testing::backends;
use orca_relay::store::{region, Db};
use support::director::check_invariants;

const US: &str = "us-central1";
const ASIA: &str = "asia-east2";
const INC_A: &str = "00000000-0000-4000-8000-00000000000a";
const INC_C: &str = "00000000-0000-4000-8000-00000000000c";

fn regions() -> Vec<String> {
    vec![US.into(), ASIA.into()]
}

fn now() -> i64 {
    orca_relay::clock::now_ms()
}

fn url(id: &str) -> String {
    format!("https://{}.cells.test", id.to_lowercase())
}

async fn cell(db: &Db, id: &str, region: &str, capacity: i64, inc: &str) {
    cells::upsert_all(
        db,
        &[CellSpec {
            cell_id: id.into(),
            cell_url: url(id),
            region: region.into(),
            capacity_requests: capacity,
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
            cell_url: url(id),
            region: region.into(),
            cell_incarnation: inc.into(),
            started_at: 1,
            ready: true,
            observed_requests: 0,
            telemetry: None,
        },
        now(),
    )
    .await
    .unwrap();
    status(db, id, &clean()).await;
}

fn clean() -> Safety {
    Safety {
        observed_at: now(),
        ..Safety::default()
    }
}

/// The status: protocol 3 and this safety, received now.
async fn status(db: &Db, id: &str, s: &Safety) {
    db.execute(
        "UPDATE relay_cell_runtime SET regional_rehome_protocol = 3, safety_json = $2, safety_received_at = $3 WHERE cell_id = $1",
        &[id.into(), serde_json::to_string(s).unwrap().into(), now().into()],
    )
    .await
    .unwrap();
}

fn host(n: u32) -> HostKey {
    HostKey {
        user_id: format!("user-{n}"),
        relay_host_id: format!("hostid{n:010}"),
    }
}

/// Two regions, control enabled with cohort 100 and a high rate, a host on A with an idle-capable
/// control of generation 1 and a conclusive preference for asia.
async fn fixture(db: &Db) -> (HostKey, RehomeRequest) {
    cell(db, "A", US, 900, INC_A).await;
    cell(db, "C", ASIA, 900, INC_C).await;
    let h = host(1);
    let g = assign(db, &h, Some(US), &regions(), AssignOptions::default())
        .await
        .unwrap();
    assert_eq!(g.cell_id, "A");
    activate_control(
        db,
        &h,
        &ActivateControl {
            cell_id: "A".into(),
            assignment_epoch: g.assignment_epoch,
            generation: 1,
            connection_inclusion_watermark: None,
            idle_regional_rehome: true,
            cell_incarnation: INC_A.into(),
        },
        now(),
    )
    .await
    .unwrap();
    let w = service::issue_window(db, &h, g.assignment_epoch, US, now())
        .await
        .unwrap();
    let (st, _) = service::report(
        db,
        &h,
        &Report {
            generation: w["generation"].as_i64().unwrap(),
            assignment_epoch: g.assignment_epoch,
            policy_version: 1,
            outcome: ReportOutcome::Conclusive(vec![(US.into(), 125), (ASIA.into(), 100)]),
        },
        &regions(),
        now(),
    )
    .await
    .unwrap();
    assert_eq!(st, ReportStatus::Accepted);
    enable(db, 100).await;
    let req = request(&h, g.assignment_epoch, 1, "C");
    (h, req)
}

fn request(h: &HostKey, epoch: i64, generation: i64, target: &str) -> RehomeRequest {
    RehomeRequest {
        attempt_id: rules::attempt_id(
            &h.user_id,
            &h.relay_host_id,
            "A",
            INC_A,
            epoch,
            generation,
            target,
        ),
        user_id: h.user_id.clone(),
        relay_host_id: h.relay_host_id.clone(),
        source_cell_id: "A".into(),
        source_cell_incarnation: INC_A.into(),
        source_assignment_epoch: epoch,
        source_generation: generation,
        target_cell_id: target.into(),
    }
}

async fn enable(db: &Db, cohort: i64) {
    let c = region::read_control(db).await.unwrap();
    service::apply_control(
        db,
        &Apply {
            expected_generation: c.generation,
            enabled: true,
            rate_per_minute: 120,
            cohort_percent: cohort,
            host_cooldown_ms: 60_000,
            preference_max_age_ms: 86_400_000,
            not_before: 0,
        },
        now(),
    )
    .await
    .unwrap();
}

async fn home(db: &Db, h: &HostKey) -> (String, i64) {
    let r = orca_relay::store::assignments::read_row(db, h)
        .await
        .unwrap()
        .unwrap();
    (r.cell_id, r.assignment_epoch)
}

async fn count(db: &Db, sql: &str) -> i64 {
    db.query(sql, &[]).await.unwrap()[0].i64(0)
}

/// The exact request commits: home → target at epoch + 1, an idle-rehome migration with a 5 min
/// arrival, the attempt row, the target charged; redelivery answers `committed` again; an altered
/// request is `stale`.
#[tokio::test]
async fn commit_moves_the_exact_host_and_redelivery_is_committed() {
    for t in backends().await {
        let db = &t.db;
        let (h, req) = fixture(db).await;
        let t0 = now();
        assert_eq!(
            service::reconcile(db, &req, t0).await.unwrap(),
            Reconciled::NotCommitted
        );
        let (out, events) = service::commit(db, &req, &clean(), 100, t0).await.unwrap();
        assert_eq!(out, Committed::Committed, "{:?}", t.kind());
        assert!(events.is_empty());
        assert_eq!(home(db, &h).await, ("C".into(), 2));
        check_invariants(db).await;
        let m = db
            .query(
                "SELECT kind, source_cell_id, target_cell_id, previous_epoch, arrival_deadline - created_at, \
                 source_request_units, target_reserved_units, source_cell_incarnation FROM relay_assignment_migrations",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].str(0), m[0].str(1), m[0].str(2), m[0].i64(3)),
            ("idle-rehome".into(), "A".into(), "C".into(), 1)
        );
        assert_eq!(m[0].i64(4), 300_000);
        assert_eq!((m[0].i64(5), m[0].i64(6)), (1, 2));
        assert_eq!(m[0].str(7), INC_A);
        let a = db
            .query(
                "SELECT attempt_id, previous_epoch, assignment_epoch, source_generation, preferred_region FROM relay_region_rehome_attempts",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].str(0), req.attempt_id);
        assert_eq!((a[0].i64(1), a[0].i64(2), a[0].i64(3)), (1, 2, 1));
        assert_eq!(a[0].str(4), ASIA);
        // The source keeps its control lease until the cell releases it; the target carries the
        // pending control and the migration lease.
        assert_eq!(
            count(
                db,
                "SELECT reserved_requests FROM relay_cells WHERE cell_id = 'C'"
            )
            .await,
            2
        );
        let c = region::read_control(db).await.unwrap();
        assert_eq!(c.next_dispatch_at, t0 + 500, "⌈60 000 / 120⌉");
        // Redelivery keeps its identity and answers from the durable record.
        let (again, _) = service::commit(db, &req, &clean(), 100, now())
            .await
            .unwrap();
        assert_eq!(again, Committed::Committed);
        assert_eq!(
            count(db, "SELECT COUNT(*) FROM relay_region_rehome_attempts").await,
            1
        );
        // Same id, another authority → stale; the host moved, so an unknown id is stale too.
        let mut other = req.clone();
        other.source_generation = 2;
        assert_eq!(
            service::reconcile(db, &other, now()).await.unwrap(),
            Reconciled::Stale
        );
        let moved = request(&h, 1, 3, "C");
        assert_eq!(
            service::reconcile(db, &moved, now()).await.unwrap(),
            Reconciled::Stale
        );
        check_invariants(db).await;
    }
}

/// Every deferral of answers its reason and leaves the host where it was.
#[tokio::test]
async fn commit_deferrals_leave_the_host() {
    for t in backends().await {
        let db = &t.db;
        let (h, req) = fixture(db).await;
        let n = now();
        let defer = |r: &'static str| (Committed::Deferred(r), ());
        let ask = |cohort: i64, s: Safety| {
            let req = req.clone();
            async move {
                let (o, _) = service::commit(db, &req, &s, cohort, now()).await.unwrap();
                (o, ())
            }
        };
        // Cohort outside 1..100 or the director's own safety dirty.
        assert_eq!(ask(0, clean()).await, defer("cohort-closed"));
        let mut dirty = clean();
        dirty.sql_failures = 4;
        assert_eq!(ask(100, dirty).await, defer("fleet-safety"));
        // The host's bucket is not below min(request, control) cohort.
        let bucket = rules::cohort_bucket(&h.user_id, &h.relay_host_id);
        if bucket > 0 {
            assert_eq!(ask(bucket, clean()).await, defer("cohort-closed"));
        }
        // Disabled control / not_before in the future → control-closed.
        service::disable(db, "operator-test", n).await.unwrap();
        assert_eq!(ask(100, clean()).await, defer("control-closed"));
        enable(db, 100).await;
        // Budget: next_dispatch_at in the future.
        db.execute(
            "UPDATE relay_region_rehome_control SET next_dispatch_at = $1",
            &[(now() + 60_000).into()],
        )
        .await
        .unwrap();
        assert_eq!(ask(100, clean()).await, defer("budget-closed"));
        db.execute(
            "UPDATE relay_region_rehome_control SET next_dispatch_at = 0",
            &[],
        )
        .await
        .unwrap();
        // Target not rehome-eligible (protocol 2) → candidate-ineligible.
        db.execute(
            "UPDATE relay_cell_runtime SET regional_rehome_protocol = 2 WHERE cell_id = 'C'",
            &[],
        )
        .await
        .unwrap();
        assert_eq!(ask(100, clean()).await, defer("candidate-ineligible"));
        status(db, "C", &clean()).await;
        // A wrong target region is never substituted.
        cell(db, "B", US, 900, "00000000-0000-4000-8000-00000000000b").await;
        let wrong = request(&h, 1, 1, "B");
        let (o, _) = service::commit(db, &wrong, &clean(), 100, now())
            .await
            .unwrap();
        assert_eq!(o, Committed::Deferred("candidate-ineligible"));
        // Fleet safety fails (C dirty) → deferred and the control disabled `fleet-safety`.
        let mut dirty = clean();
        dirty.reconnects = 21;
        status(db, "C", &dirty).await;
        let (o, events) = service::commit(db, &req, &clean(), 100, now())
            .await
            .unwrap();
        assert_eq!(o, Committed::Deferred("fleet-safety"));
        assert_eq!(events[0].0, "orca_relay_regional_rehome_safety_disabled");
        let c = region::read_control(db).await.unwrap();
        assert!(!c.enabled);
        assert_eq!(c.disabled_reason.as_deref(), Some("fleet-safety"));
        assert_eq!(home(db, &h).await, ("A".into(), 1));
        assert_eq!(
            count(db, "SELECT COUNT(*) FROM relay_region_rehome_attempts").await,
            0
        );
        check_invariants(db).await;
    }
}

/// The conditional target reserve is the last statement: a refused reserve rolls back every write
/// of the commit and answers `deferred` `candidate-ineligible` with the target-deferred event.
#[tokio::test]
async fn refused_target_reserve_rolls_everything_back() {
    for t in backends().await {
        let db = &t.db;
        let (h, req) = fixture(db).await;
        // Capacity 1: the host's units (1) + 1 do not fit.
        db.execute(
            "UPDATE relay_cells SET capacity_requests = 1 WHERE cell_id = 'C'",
            &[],
        )
        .await
        .unwrap();
        let (o, events) = service::commit(db, &req, &clean(), 100, now())
            .await
            .unwrap();
        assert_eq!(o, Committed::Deferred("candidate-ineligible"));
        assert_eq!(events[0].0, "orca_relay_idle_rehome_target_deferred");
        assert_eq!(events[0].1["cause"], "target-not-admitting");
        assert_eq!(events[0].1["attemptId"], req.attempt_id.as_str());
        assert_eq!(home(db, &h).await, ("A".into(), 1));
        for table in [
            "relay_region_rehome_attempts",
            "relay_assignment_migrations",
        ] {
            assert_eq!(
                count(db, &format!("SELECT COUNT(*) FROM {table}")).await,
                0,
                "{table}"
            );
        }
        assert_eq!(region::read_control(db).await.unwrap().next_dispatch_at, 0);
        assert_eq!(
            service::reconcile(db, &req, now()).await.unwrap(),
            Reconciled::NotCommitted
        );
        check_invariants(db).await;
    }
}

/// `not-committed` needs the exact live source authority; anything else without an attempt is
/// `stale`.
#[tokio::test]
async fn reconcile_needs_the_exact_source_authority() {
    for t in backends().await {
        let db = &t.db;
        let (h, req) = fixture(db).await;
        for (label, r) in [
            ("generation", {
                let mut r = req.clone();
                r.source_generation = 2;
                r
            }),
            ("incarnation", {
                let mut r = req.clone();
                r.source_cell_incarnation = "00000000-0000-4000-8000-0000000000ff".into();
                r
            }),
            ("epoch", {
                let mut r = req.clone();
                r.source_assignment_epoch = 2;
                r
            }),
        ] {
            assert_eq!(
                service::reconcile(db, &r, now()).await.unwrap(),
                Reconciled::Stale,
                "{label}"
            );
        }
        // The source not live → stale.
        db.execute(
            "UPDATE relay_cell_runtime SET ready = $1 WHERE cell_id = 'A'",
            &[false.into()],
        )
        .await
        .unwrap();
        assert_eq!(
            service::reconcile(db, &req, now()).await.unwrap(),
            Reconciled::Stale
        );
        let _ = h;
    }
}

/// The control row: lazy defaults, generation-checked apply, disables.
#[tokio::test]
async fn control_defaults_generation_and_disable() {
    for t in backends().await {
        let db = &t.db;
        let c = region::read_control(db).await.unwrap();
        assert_eq!(c, region::Control::default());
        let a = Apply {
            expected_generation: 5,
            enabled: true,
            rate_per_minute: 10,
            cohort_percent: 10,
            host_cooldown_ms: 60_000,
            preference_max_age_ms: 60_000,
            not_before: 0,
        };
        assert_eq!(
            service::apply_control(db, &a, now()).await,
            Err(service::ControlError::GenerationMismatch)
        );
        let ok = Apply {
            expected_generation: 0,
            ..a
        };
        let c = service::apply_control(db, &ok, now()).await.unwrap();
        assert_eq!((c.generation, c.enabled, c.cohort_percent), (1, true, 10));
        // Three recorded failures: paused 5 min and disabled `failure-budget`.
        assert!(service::record_dispatch(db, true, now())
            .await
            .unwrap()
            .is_empty());
        assert!(service::record_dispatch(db, true, now())
            .await
            .unwrap()
            .is_empty());
        let t3 = now();
        let e = service::record_dispatch(db, true, t3).await.unwrap();
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!(e[0].0, "orca_relay_regional_rehome_failure_budget_disabled");
        // Like every automatic disable (docs/reference/http.md).
        assert_eq!(e[1].0, "orca_relay_regional_rehome_safety_disabled");
        assert_eq!(e[1].1["reason"], "failure-budget");
        assert_eq!(e[1].1["generation"], 2);
        let c = region::read_control(db).await.unwrap();
        assert_eq!(c.disabled_reason.as_deref(), Some("failure-budget"));
        assert_eq!(c.paused_until, t3 + 300_000);
        assert_eq!((c.generation, c.consecutive_failures), (2, 3));
        // Enabling clears failures, pause and reason.
        let c = service::apply_control(
            db,
            &Apply {
                expected_generation: 2,
                ..ok
            },
            now(),
        )
        .await
        .unwrap();
        assert_eq!((c.consecutive_failures, c.paused_until), (0, 0));
        assert_eq!(c.disabled_reason, None);
    }
}

/// A database cut during a commit (Postgres through a closable TCP proxy): the call fails as an
/// error, not an answer, nothing is half written, and once the database is back reconcile answers
/// `not-committed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_cut_during_commit_writes_nothing() {
    let Some(t) = orca_relay::store::testing::TestDb::postgres().await else {
        return;
    };
    let db = &t.db;
    let (h, req) = fixture(db).await;
    let upstream = "127.0.0.1:5432";
    assert!(t.url.contains(upstream));
    let proxy = support::director::PgProxy::open("127.0.0.1:0".parse().unwrap(), upstream).await;
    let cut_url = t.url.replace(upstream, &proxy.addr.to_string());
    let cut_db = Db::connect(&cut_url, 2).await.unwrap();
    assert_eq!(
        service::reconcile(&cut_db, &req, now()).await.unwrap(),
        Reconciled::NotCommitted
    );
    proxy.close();
    let r = service::commit(&cut_db, &req, &clean(), 100, now()).await;
    assert!(r.is_err(), "a cut is an error, never an answer: {r:?}");
    assert_eq!(home(db, &h).await, ("A".into(), 1));
    assert_eq!(
        count(db, "SELECT COUNT(*) FROM relay_region_rehome_attempts").await,
        0
    );
    let proxy = support::director::PgProxy::open(proxy.addr, upstream).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let answer = loop {
        match service::reconcile(&cut_db, &req, now()).await {
            Ok(a) => break a,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(e) => panic!("reconcile never answered: {e}"),
        }
    };
    assert_eq!(answer, Reconciled::NotCommitted);
    check_invariants(db).await;
    proxy.close();
    cut_db.close();
}

///: an idle-rehome migration that never arrives is rolled back to its live `general`
/// source; the attempt is aborted `host_not_arrived` and, in its own transaction afterwards, the
/// control is disabled with that reason. Outcomes count it without host identities.
#[tokio::test]
async fn unarrived_idle_rehome_rolls_back_aborts_and_disables() {
    for t in backends().await {
        let db = &t.db;
        let (h, req) = fixture(db).await;
        let (o, _) = service::commit(db, &req, &clean(), 100, now())
            .await
            .unwrap();
        assert_eq!(o, Committed::Committed);
        let later = now() + 301_000;
        db.execute(
            "UPDATE relay_cell_runtime SET last_heartbeat_at = $1, safety_received_at = $1",
            &[later.into()],
        )
        .await
        .unwrap();
        let n = orca_relay::director::migrate::expire_unarrived(db, later)
            .await
            .unwrap();
        assert_eq!(n.done, 1);
        assert_eq!(
            home(db, &h).await,
            ("A".into(), 3),
            "rolled back at epoch + 1"
        );
        let a = db
            .query(
                "SELECT abort_reason FROM relay_region_rehome_attempts WHERE attempt_id = $1",
                &[req.attempt_id.clone().into()],
            )
            .await
            .unwrap();
        assert_eq!(a[0].opt_str(0).as_deref(), Some("host_not_arrived"));
        let e = service::disable_after_aborts(db, later)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.0, "orca_relay_regional_rehome_safety_disabled");
        let c = region::read_control(db).await.unwrap();
        assert!(!c.enabled);
        assert_eq!(c.disabled_reason.as_deref(), Some("host_not_arrived"));
        assert!(
            service::disable_after_aborts(db, later)
                .await
                .unwrap()
                .is_none(),
            "once"
        );
        let o = service::outcomes(db, later).await.unwrap();
        assert_eq!(o["attempts"]["committed"], 1);
        assert_eq!(o["attempts"]["aborted"]["host_not_arrived"], 1);
        assert_eq!(o["migrations"][0]["state"], "aborted");
        let text = o.to_string();
        assert!(!text.contains(&h.user_id) && !text.contains(&h.relay_host_id));
        check_invariants(db).await;
    }
}
