//! Cell gates that need a store or a full process (docs/reference/websocket.md): the capped
//! connection ledger refusing real phone, data and control upgrades with 503 `Retry-After: 2`
//! (P-48's store side: `wrong_assignment` leaves no control activity), on both backends.

mod support;

use orca_relay::cell::testkit::{self, HostIdentity};
use orca_relay::params;
use orca_relay::store::assignments::{self as store, ActivateControl, ActivityError, HostKey};
use support::node::*;

fn status(resp: &str) -> &str {
    resp.split("\r\n").next().unwrap_or("")
}

fn has_header(resp: &str, line: &str) -> bool {
    resp.split("\r\n").any(|l| l.eq_ignore_ascii_case(line))
}

/// gates 3/5: with hard cap 200 the normal limit is 100 enforced units. Ten live
/// controls (1 unit each) and 45 silent phones (1 in-flight→physical + 1 reserved each) fill it;
/// the next phone, a fresh data leg and a new (non-rebind) control are refused with a raw 503
/// carrying `Retry-After: 2`. The phones' first-frame deadline returns their units.
#[tokio::test]
async fn capped_ledger_refuses_upgrades_at_the_normal_limit() {
    for db in dbs().await {
        let s = start_on(
            &db.url,
            &[
                "--cell-connection-hard-cap",
                "200",
                "--cell-connection-unobserved-bound",
                "0",
                "--trusted-proxy-hops",
                "1",
            ],
        )
        .await;
        let a = s.running.addr;
        let cell = s.running.cell.clone().expect("cell role");
        let enforced = || cell.with_ledger(|l| l.enforced()).expect("capped cell");

        let mut controls = Vec::new();
        for i in 0..10 {
            let host = Host::assigned(&s, &format!("cap-{i}")).await;
            controls.push(host.connect(&s).await);
        }
        assert_eq!(enforced(), 10, "one unit per live control");
        let spare = Host::assigned(&s, "cap-spare").await;

        // 45 silent phones, each from its own source (4 per source, 45 per cell pre-auth caps).
        let phone_id = HostIdentity::generate("cap-phone");
        let path = format!("/v1/connect/{}", phone_id.relay_host_id);
        let url = format!("{}{}", testkit::ws_origin(&s.cell_url), path);
        let dials = (0..45).map(|i| {
            let url = url.clone();
            async move {
                testkit::dial(&url, &[("x-forwarded-for", format!("10.9.0.{i}"))])
                    .await
                    .unwrap_or_else(|e| panic!("phone {i}: {e}"))
            }
        });
        let phones = futures_util::future::join_all(dials).await;
        assert_eq!(
            enforced(),
            100,
            "ledger filled to the normal limit (H − 100)"
        );

        let r = raw_upgrade(a, &path, "X-Forwarded-For: 10.9.1.1\r\n").await;
        assert_eq!(status(&r), "HTTP/1.1 503 Service Unavailable", "{r}");
        assert!(has_header(&r, "retry-after: 2"), "{r}");
        assert!(has_header(&r, "connection: close"), "{r}");

        let r = raw_upgrade(
            a,
            "/v1/host/data/conn-not-bound",
            "X-Forwarded-For: 10.9.1.2\r\n",
        )
        .await;
        assert_eq!(status(&r), "HTTP/1.1 503 Service Unavailable", "{r}");
        assert!(has_header(&r, "retry-after: 2"), "{r}");

        let bearer = format!("Authorization: Bearer {}\r\n", spare.token);
        let r = raw_upgrade(a, "/v1/host/control", &bearer).await;
        assert_eq!(status(&r), "HTTP/1.1 503 Service Unavailable", "{r}");
        assert!(has_header(&r, "retry-after: 2"), "{r}");
        assert_eq!(enforced(), 100, "refusals charge nothing");

        // The silent phones hit their 2 s first-frame deadline; their units come back.
        assert!(
            eventually(SEC * 6, || enforced() == 10).await,
            "phone units returned, enforced = {}",
            enforced()
        );
        let r = raw_upgrade(a, &path, "X-Forwarded-For: 10.9.1.3\r\n").await;
        assert_eq!(status(&r), "HTTP/1.1 101 Switching Protocols", "{r}");
        drop(phones);
        drop(controls);
        s.running.shutdown().await;
    }
}

/// P-48 (store side): `activateControl` with a changed assignment (wrong epoch or wrong cell) is
/// `wrong_assignment` and leaves no `control:*` activity for the host.
#[tokio::test]
async fn activate_control_wrong_assignment_leaves_no_activity() {
    for t in orca_relay::store::testing::backends().await {
        let host = HostKey {
            user_id: "u-wrong".into(),
            relay_host_id: HostIdentity::generate("u-wrong").relay_host_id,
        };
        let now = orca_relay::clock::now_ms();
        t.db.execute(
            "INSERT INTO relay_assignments (user_id, relay_host_id, cell_id, assignment_epoch, \
             lease_expires_at, last_activity_at, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6, $6)",
            params![
                &host.user_id,
                &host.relay_host_id,
                "cell-a",
                3i64,
                now + 600_000,
                now
            ],
        )
        .await
        .expect("assignment row");
        let req = |cell: &str, epoch: i64| ActivateControl {
            cell_id: cell.into(),
            assignment_epoch: epoch,
            generation: 1,
            connection_inclusion_watermark: None,
            idle_regional_rehome: false,
            cell_incarnation: "0123456789abcdef0123456789abcdef".into(),
        };
        for (cell, epoch) in [("cell-a", 2), ("cell-a", 4), ("cell-b", 3)] {
            let got = store::activate_control(&t.db, &host, &req(cell, epoch), now).await;
            assert_eq!(
                got,
                Err(ActivityError::WrongAssignment),
                "{cell} epoch {epoch}"
            );
            assert_eq!(got.unwrap_err().code(), "wrong_assignment");
        }
        let leases =
            t.db.query(
                "SELECT activity_id FROM relay_assignment_activity_leases \
                 WHERE user_id = $1 AND relay_host_id = $2",
                params![&host.user_id, &host.relay_host_id],
            )
            .await
            .unwrap();
        assert!(leases.is_empty(), "no activity left behind");
        let row = store::read_row(&t.db, &host).await.unwrap().expect("row");
        assert_eq!(row.assignment_epoch, 3, "assignment untouched");
        assert!(row.counters.is_zero(), "nothing charged");
    }
}

/// control gate 4: while `databasePoolMax` store callers wait and the oldest has waited
/// ≥ 1 s, a new control upgrade is shed with a raw 503 `Retry-After: 2`; a rebind over a live
/// control is exempt; once the store frees, new controls are admitted again.
#[tokio::test]
async fn store_pressure_sheds_new_controls() {
    for db in dbs().await {
        let s = start_on(
            &db.url,
            &[
                "--database-pool-max",
                "3",
                "--public-assignment-concurrency",
                "1",
                "--public-sticky-concurrency",
                "1",
            ],
        )
        .await;
        let a = s.running.addr;
        let live = Host::assigned(&s, "shed-live").await;
        let _control = live.connect(&s).await;
        let fresh = Host::assigned(&s, "shed-new").await;

        // 6 callers each take a transaction and hold it until released: the pool (Postgres: 3
        // connections; SQLite: the one writer slot) is exhausted and ≥ 3 callers queue behind it.
        let store = s.running.ctx.db.clone();
        let release = tokio_util::sync::CancellationToken::new();
        let holders: Vec<_> = (0..6)
            .map(|_| {
                let (store, release) = (store.clone(), release.clone());
                tokio::spawn(async move {
                    let tx = store.begin().await.expect("begin");
                    release.cancelled().await;
                    tx.rollback().await;
                })
            })
            .collect();
        assert!(
            eventually(SEC * 5, || {
                let p = store.pressure();
                p.waiting >= 3 && p.oldest_wait_ms >= 1_100
            })
            .await,
            "callers wait ≥ 1 s: {:?}",
            store.pressure()
        );

        let bearer = |h: &Host| format!("Authorization: Bearer {}\r\n", h.token);
        let r = raw_upgrade(a, "/v1/host/control", &bearer(&fresh)).await;
        assert_eq!(status(&r), "HTTP/1.1 503 Service Unavailable", "{r}");
        assert!(has_header(&r, "retry-after: 2"), "{r}");
        let r = raw_upgrade(a, "/v1/host/control", &bearer(&live)).await;
        assert_eq!(
            status(&r),
            "HTTP/1.1 101 Switching Protocols",
            "rebind over a live control is exempt: {r}"
        );

        release.cancel();
        for h in holders {
            h.await.unwrap();
        }
        assert!(eventually(SEC * 5, || store.pressure().waiting == 0).await);
        let r = raw_upgrade(a, "/v1/host/control", &bearer(&fresh)).await;
        assert_eq!(status(&r), "HTTP/1.1 101 Switching Protocols", "{r}");
        s.running.shutdown().await;
    }
}
