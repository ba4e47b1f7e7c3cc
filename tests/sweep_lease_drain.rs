//! Issue 11: after a crash burst the sweep must release every expired `control-pending` lease in
//! one run (batches of 500 leases, one transaction per host), not 500 per 30 s sweep. On SQLite
//! and Postgres.

mod support;

use std::time::Instant;

use orca_relay::director::sweeps;
use orca_relay::store::testing::backends;
use serde_json::json;
use support::director::*;

/// Hosts granted in the burst (each left with an expired `control-pending` lease): more than
/// three batches.
const BURST: i64 = 1_600;

#[tokio::test]
async fn one_sweep_releases_every_expired_lease_of_a_burst() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.fast_lanes();
        d.register_with("A", US, false, 100_000).await;
        d.hb_obs("A", US, true, &uuid(), 100, false, 0).await;
        let h = d.host("U").await;
        let r = d.assign(&h, json!({})).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        // The burst: BURST more hosts granted on A exactly like H (row + pending control lease,
        // charged to A), copied from H's rows so the state is what real grants leave.
        let copy = |table: &str, cols: &str| {
            format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {BURST}) \
                 INSERT INTO {table} (user_id, relay_host_id, {cols}) \
                 SELECT 'burst', 'h' || CAST(n.i AS TEXT), {cols} FROM n CROSS JOIN {table} a \
                 WHERE a.user_id = $1 AND a.relay_host_id = $2"
            )
        };
        let key = || vec![h.user.clone().into(), h.id.clone().into()];
        let n = d
            .db
            .execute(
                &copy(
                    "relay_assignments",
                    "cell_id, assignment_epoch, lease_expires_at, last_activity_at, reserved_controls, \
                     reserved_splices, reserved_invites, pending_installs, pending_confirmations, \
                     migration_leases, created_at, updated_at",
                ),
                &key(),
            )
            .await
            .unwrap();
        assert_eq!(n as i64, BURST);
        let n = d
            .db
            .execute(
                &copy(
                    "relay_assignment_activity_leases",
                    "activity_id, activity_kind, cell_id, request_units, expires_at, created_at, updated_at",
                ),
                &key(),
            )
            .await
            .unwrap();
        assert_eq!(n as i64, BURST, "one pending control lease per burst host");
        d.db.execute(
            "UPDATE relay_cells SET reserved_requests = (SELECT CAST(SUM(request_units) AS BIGINT) \
             FROM relay_assignment_activity_leases) WHERE cell_id = 'A'",
            &[],
        )
        .await
        .unwrap();
        check_invariants(&d.db).await;
        let reserved = d.cell_status("A").await["reservedRequests"]
            .as_i64()
            .unwrap();
        assert!(reserved > BURST, "{reserved}");
        // Nobody connected: every pending control expires.
        d.db.execute(
            "UPDATE relay_assignment_activity_leases SET expires_at = 1",
            &[],
        )
        .await
        .unwrap();
        let started = Instant::now();
        sweeps::run_once(d.director()).await;
        eprintln!(
            "{}: {} expired leases released by one sweep in {:?}",
            t.kind().as_str(),
            BURST + 1,
            started.elapsed()
        );
        let left =
            d.db.query("SELECT COUNT(*) FROM relay_assignment_activity_leases", &[])
                .await
                .unwrap();
        assert_eq!(left[0].i64(0), 0, "{}: leases left", t.kind().as_str());
        assert_eq!(d.cell_status("A").await["reservedRequests"], json!(0));
        assert_eq!(d.whereabouts(&h).await["leases"], json!([]));
        check_invariants(&d.db).await;
        d.shutdown().await;
    }
}
