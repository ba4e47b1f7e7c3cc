//! Control leases of sessions that can no longer be served (issue 12's roll benchmark): a host
//! that leaves a draining cell on its own has its control lease released at once (a draining cell
//! refuses every activation, so the orphaned session can never be rebound, protocol.md §11 step 1),
//! while on a cell that is not draining the lease stays through the orphan grace (§4.5, a rebind
//! is still possible) until a drain starts; and SIGTERM with no grace retires orphaned sessions too, releasing their
//! leases before the process closes its database. SQLite and, with
//! `ORCA_RELAY_TEST_POSTGRES_URL`, Postgres.

#[path = "support/cell/mod.rs"]
mod support;

use std::time::Duration;

use orca_relay::cell::session::State;
use orca_relay::params;
use orca_relay::store::Db;
use serde_json::json;
use support::*;

/// The host's activated control leases (`control:<cell>:<generation>`) and its row's
/// `reserved_controls`.
async fn controls(db: &Db, host: &Host) -> (Vec<String>, i64) {
    let leases = db
        .query(
            "SELECT activity_id FROM relay_assignment_activity_leases \
             WHERE user_id = $1 AND relay_host_id = $2 AND activity_kind = 'control' \
             AND activity_id NOT LIKE 'control-pending:%'",
            params![&host.id.user_id, &host.id.relay_host_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.str(0))
        .collect();
    let counted = db
        .query(
            "SELECT reserved_controls FROM relay_assignments \
             WHERE user_id = $1 AND relay_host_id = $2",
            params![&host.id.user_id, &host.id.relay_host_id],
        )
        .await
        .unwrap()
        .first()
        .map(|r| r.i64(0))
        .unwrap_or(-1);
    (leases, counted)
}

async fn drain(s: &Server, grace_ms: u64) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/admin/drain", s.url))
        .bearer_auth(ADMIN)
        .json(&json!({"v":1,"graceMs":grace_ms}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn host_leaving_a_draining_cell_has_its_control_released_at_once() {
    for t in dbs().await {
        let s = start_on(&t.url, &[]).await;
        // Not draining: a host that closes its control keeps the lease through the orphan grace.
        let stays = Host::assigned(&s, "leave-live").await;
        let mut c = stays.connect(&s).await;
        assert_eq!(controls(&t.db, &stays).await.0.len(), 1);
        c.ws.close(None).await.unwrap();
        let orphaned = || s.session_state(&stays.key()) == Some(State::Orphaned);
        assert!(real_eventually(SEC * 10, orphaned).await, "orphaned");
        let (leases, counted) = controls(&t.db, &stays).await;
        assert_eq!((leases.len(), counted), (1, 1), "kept for a rebind");

        // Draining (grace 60 s, far beyond this test): the host is told, leaves, and its control
        // lease is gone long before the forced close, while the orphaned session remains.
        let leaves = Host::assigned(&s, "leave-drained").await;
        let mut c = leaves.connect(&s).await;
        drain(&s, 60_000).await;
        assert_eq!(
            c.recv(SEC * 10).await.unwrap(),
            json!({"type":"drain","graceMs":60000,"recovery":"resolve-director"})
        );
        assert_eq!(
            controls(&t.db, &leaves).await.0.len(),
            1,
            "told, not yet left"
        );
        // The session orphaned before the drain can no longer be rebound either.
        let released = || async { controls(&t.db, &stays).await == (vec![], 0) };
        assert!(
            eventually_async(SEC * 10, released).await,
            "orphan's lease released by the drain"
        );
        c.ws.close(None).await.unwrap();
        let released = || async { controls(&t.db, &leaves).await == (vec![], 0) };
        assert!(
            eventually_async(SEC * 10, released).await,
            "control lease released: {:?}",
            controls(&t.db, &leaves).await
        );
        assert_eq!(
            s.session_state(&leaves.key()),
            Some(State::Orphaned),
            "the session itself waits for its grace"
        );
        s.running.shutdown().await;
    }
}

#[tokio::test]
async fn shutdown_releases_the_controls_of_orphaned_sessions() {
    for t in dbs().await {
        let s = start_on(&t.url, &[]).await;
        let hosts = [
            Host::assigned(&s, "term-orphan-1").await,
            Host::assigned(&s, "term-orphan-2").await,
        ];
        for h in &hosts {
            let mut c = h.connect(&s).await;
            c.ws.close(None).await.unwrap();
            let orphaned = || s.session_state(&h.key()) == Some(State::Orphaned);
            assert!(real_eventually(SEC * 10, orphaned).await, "orphaned");
            assert_eq!(controls(&t.db, h).await.0.len(), 1);
        }
        let started = std::time::Instant::now();
        s.running.shutdown().await;
        assert!(started.elapsed() < Duration::from_secs(10));
        // The process's database is closed now; the test's own handle reads what it left.
        for h in &hosts {
            assert_eq!(
                controls(&t.db, h).await,
                (vec![], 0),
                "no control lease left behind"
            );
        }
    }
}
