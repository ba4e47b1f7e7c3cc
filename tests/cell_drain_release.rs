//! Control leases of sessions that can no longer be served (issue 12's roll benchmark): a host
//! that leaves a draining cell on its own has its control lease released at once (a draining cell
//! refuses every activation, so the orphaned session can never be rebound, docs/operations.md step 1),
//! while on a cell that is not draining the lease stays through the orphan grace (a rebind
//! is still possible) until a drain starts; SIGTERM with no grace retires orphaned sessions too, releasing their
//! leases before the process closes its database; a host whose activation a drain overtakes
//! (step 4) hears its 4503 only once its lease is gone; and a release that misses its
//! deadline on a draining cell still lands (not cancelled, retried if it fails) instead of
//! leaving the lease to expire.
//! SQLite and, with `ORCA_RELAY_TEST_POSTGRES_URL`, Postgres.

mod support;
use support::row_lock;
use support::write_block;

use std::time::Duration;

use orca_relay::cell::session::State;
use orca_relay::params;
use orca_relay::store::Db;
use serde_json::json;
use support::node::*;
use write_block::block_host_writes;

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

/// Every control-kind lease of the host, `control-pending:<epoch>` included (present until an
/// activation converts it).
async fn any_controls(db: &Db, host: &Host) -> Vec<String> {
    db.query(
        "SELECT activity_id FROM relay_assignment_activity_leases \
         WHERE user_id = $1 AND relay_host_id = $2 AND activity_kind = 'control'",
        params![&host.id.user_id, &host.id.relay_host_id],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.str(0))
    .collect()
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

/// step 4 with a drain that starts while the activation is in the store: the activation
/// lands, the cell sees the drain and refuses the host 4503 `relay draining`, and the host, which
/// re-resolves on that close at once (docs/deploy/cluster.md), must not find its control still held by
/// this running process when it activates on the next cell. So the close comes only after the
/// release: read the moment the close arrives, the host has no control lease left (the grant's
/// `control-pending` is gone too, which shows the activation did land first). Before, the close
/// went out at once beside a release in the background (issue 12's roll: controls activated on a
/// draining cell well under a second before the one on the next cell).
#[tokio::test]
async fn a_drain_overtaking_an_activation_releases_the_control_before_the_close() {
    for t in dbs().await {
        let s = start_on(&t.url, &[]).await;
        let host = Host::assigned(&s, "drain-mid-activation").await;
        assert_eq!(
            any_controls(&t.db, &host).await.len(),
            1,
            "the grant's pending lease"
        );
        let key = host.key();
        let cell = s.running.cell.clone().expect("cell role");
        let block = block_host_writes(&t, &key.user_id, &key.relay_host_id).await;
        let hello = host.hello();
        let handshake = host.connect_with(&s, &hello);
        let drive = async {
            // The handshake holds the host's activation turn from its proof until its session is
            // installed; held while the store's writes are held up, it is in the activation.
            let activating = || {
                cell.registry()
                    .activation
                    .get(&key)
                    .is_some_and(|m| m.try_lock().is_err())
            };
            assert!(
                real_eventually(SEC * 10, activating).await,
                "activation in flight"
            );
            drain(&s, 60_000).await;
            block.release().await;
        };
        let (refused, ()) = tokio::join!(handshake, drive);
        let Err(refused) = refused else {
            panic!("the activation was accepted on a draining cell")
        };
        // Read at once: nothing may still be in flight here.
        let left = any_controls(&t.db, &host).await;
        let counted = controls(&t.db, &host).await.1;
        assert_eq!(refused, (4503, "relay draining".to_string()));
        assert_eq!((left, counted), (vec![], 0), "released before the close");
        s.running.shutdown().await;
    }
}

/// A release that misses its 2 s deadline on a draining cell (the store held up, as under the
/// roll's database pressure) still lands once the store lets it (the attempt goes on past the
/// deadline and, if it fails, is retried): the host that left keeps no lease of this running
/// process beside the control it activates elsewhere. Before, the attempt was cancelled at the
/// deadline and the lease stayed until it expired (up to 105 s).
#[tokio::test]
async fn a_release_that_misses_its_deadline_on_a_draining_cell_still_lands() {
    support::node::common::logs::install();
    for t in dbs().await {
        let s = start_on(&t.url, &[]).await;
        let host = Host::assigned(&s, "late-release").await;
        let mut c = host.connect(&s).await;
        drain(&s, 60_000).await;
        assert_eq!(c.recv(SEC * 10).await.unwrap()["type"], "drain");
        let key = host.key();
        let block = block_host_writes(&t, &key.user_id, &key.relay_host_id).await;
        c.ws.close(None).await.unwrap();
        // The first attempt cannot land while the writes are held: it misses its deadline.
        let digest = orca_relay::logging::digest(&host.id.relay_host_id);
        let missed = || {
            support::node::common::logs::texts("orca_relay")
                .iter()
                .any(|l| {
                    (l.contains("activity release slow") || l.contains("activity release failed"))
                        && l.contains(&digest)
                })
        };
        assert!(
            real_eventually(SEC * 20, missed).await,
            "first release attempt missed its deadline"
        );
        assert_eq!(controls(&t.db, &host).await.0.len(), 1, "still held");
        block.release().await;
        let released = || async { controls(&t.db, &host).await == (vec![], 0) };
        assert!(
            eventually_async(SEC * 15, released).await,
            "released by a retry: {:?}",
            controls(&t.db, &host).await
        );
        s.running.shutdown().await;
    }
}

/// A drained host's release whose assignment row is locked elsewhere (a director moving the
/// host, its activation on the next cell) is tried again with the following batches and never
/// waits for the row: a waiting release held one of the cell's pool connections for up to three
/// 1 s lock waits, and a drain's hosts all race their directors for their rows, so the pool filled
/// with waiters and the cell's other releases (hosts that had already left) stalled for seconds
/// (issue 12's roll benchmark). Here, while one host's row stays locked, no backend of the cell
/// waits for it, another host's release lands, and the locked one lands once the row is free.
/// Postgres only (SQLite takes no row locks).
#[tokio::test]
async fn a_release_whose_row_is_locked_elsewhere_does_not_wait_for_it() {
    for t in dbs().await {
        if !t.url.starts_with("postgres") {
            continue;
        }
        let s = start_on(&t.url, &[]).await;
        let cell = s.running.cell.clone().expect("cell role");
        let busy = Host::assigned(&s, "row-busy").await;
        let other = Host::assigned(&s, "row-free").await;
        let mut cb = busy.connect(&s).await;
        let mut co = other.connect(&s).await;
        drain(&s, 60_000).await;
        assert_eq!(cb.recv(SEC * 10).await.unwrap()["type"], "drain");
        assert_eq!(co.recv(SEC * 10).await.unwrap()["type"], "drain");
        let key = busy.key();
        let lock = row_lock::lock_assignment(&t.url, &key.user_id, &key.relay_host_id).await;
        let before = cell.releaser.row_busy_retries();
        cb.ws.close(None).await.unwrap();
        // Skipped by a few batches in turn, not waited for.
        let retried = || cell.releaser.row_busy_retries() >= before + 3;
        assert!(real_eventually(SEC * 10, retried).await, "retried");
        co.ws.close(None).await.unwrap();
        let released = || async { controls(&t.db, &other).await == (vec![], 0) };
        assert!(
            eventually_async(SEC * 10, released).await,
            "the other host's release lands while the row is locked: {:?}",
            controls(&t.db, &other).await
        );
        let retried = || cell.releaser.row_busy_retries() >= before + 6;
        assert!(real_eventually(SEC * 10, retried).await, "still retried");
        assert_eq!(lock.waiters().await, 0, "nothing waits for the locked row");
        assert_eq!(controls(&t.db, &busy).await.0.len(), 1, "not released yet");
        lock.release().await;
        let released = || async { controls(&t.db, &busy).await == (vec![], 0) };
        assert!(
            eventually_async(SEC * 10, released).await,
            "released once the row is free: {:?}",
            controls(&t.db, &busy).await
        );
        s.running.shutdown().await;
    }
}

/// A release commits without waiting for the WAL flush on Postgres (`synchronous_commit` off for
/// its transaction, as the server reports inside it): under I/O pressure a synchronous `COMMIT`
/// waited seconds, and the lease it deletes stayed visible to everyone until then. Both the
/// batched and the lone release; SQLite has no such setting.
#[tokio::test]
async fn releases_commit_without_waiting_for_the_wal_flush() {
    use orca_relay::store::assignments::{self as store, ReleaseTrace};
    for t in dbs().await {
        let s = start_on(&t.url, &[]).await;
        let expected = if t.url.starts_with("postgres") {
            "off"
        } else {
            ""
        };
        let hosts = [
            Host::assigned(&s, "async-batch").await,
            Host::assigned(&s, "async-alone").await,
        ];
        let mut controls_open = Vec::new();
        for h in &hosts {
            controls_open.push(h.connect(&s).await);
        }
        let ids: Vec<String> = {
            let mut v = Vec::new();
            for h in &hosts {
                let (leases, _) = controls(&t.db, h).await;
                assert_eq!(leases.len(), 1);
                v.push(leases[0].clone());
            }
            v
        };
        let now = orca_relay::clock::now_ms();
        let mut trace = ReleaseTrace::default();
        let done =
            store::release_activities(&t.db, &[(hosts[0].key(), ids[0].clone())], now, &mut trace)
                .await
                .unwrap();
        assert_eq!(done, vec![true]);
        assert_eq!(trace.synchronous_commit, expected, "batched release");
        assert_eq!(trace.attempts, 1);
        let mut trace = ReleaseTrace::default();
        store::release_activity_traced(&t.db, &hosts[1].key(), &ids[1], now, &mut trace)
            .await
            .unwrap();
        assert_eq!(trace.synchronous_commit, expected, "lone release");
        for h in &hosts {
            assert_eq!(controls(&t.db, h).await, (vec![], 0), "released");
        }
        drop(controls_open);
        s.running.shutdown().await;
    }
}
