//! The per-recipient send transaction (`store::push::send_recipient`, docs/reference/http.md) on every
//! backend: the registration check and the accept steps in one transaction per recipient, with
//! the rows each answer leaves behind (Postgres writes the event, the delivery and the recipient
//! in one statement pipelined with `COMMIT`; SQLite runs them one by one: the rows must agree).

use orca_relay::params;
use orca_relay::push::LIMITS;
use orca_relay::store::push::{self as store, Accept, NewEvent};
use orca_relay::store::testing::backends;
use orca_relay::store::Db;

async fn register(db: &Db, reg: &str, fp: &str, dead: bool, now: i64) {
    let dead_at = if dead { Some(now) } else { None };
    db.execute(
        "INSERT INTO push_devices (registration_id, host_fingerprint, device_id, platform, token, apns_environment, dead_at, created_at, updated_at) VALUES ($1, $2, $1, 'ios', 'aabb', 'sandbox', $3, $4, $4)",
        params![reg, fp, dead_at, now],
    )
    .await
    .unwrap();
}

async fn count(db: &Db, sql: &str) -> i64 {
    db.query(sql, &[]).await.unwrap()[0].i64(0)
}

/// `(events, deliveries, recipients)` rows.
async fn rows(db: &Db) -> (i64, i64, i64) {
    (
        count(db, "SELECT COUNT(*) FROM push_events").await,
        count(db, "SELECT COUNT(*) FROM push_deliveries").await,
        count(db, "SELECT COUNT(*) FROM push_event_recipients").await,
    )
}

fn event<'a>(kind: &'a str, id: &'a str, content: &'a str, seq: i64) -> NewEvent<'a> {
    NewEvent {
        kind,
        event_id: id,
        content,
        payload: r#"{"notificationId":"n","notificationSeq":1,"notificationEpoch":"e","source":"plugin","agentState":null,"title":"T","body":"B"}"#,
        notification_id: Some("n"),
        notification_seq: seq,
        notification_epoch: "e",
        expires_at: None,
    }
}

#[tokio::test]
async fn send_recipient_answers_and_rows() {
    for t in backends().await {
        let db = &t.db;
        let k = t.kind();
        let now = orca_relay::clock::now_ms();
        register(db, "live", "fp", false, now).await;
        register(db, "gone", "fp", true, now).await;
        register(db, "other", "fp2", false, now).await;
        let send = |e: NewEvent<'static>, reg: &'static str| async move {
            store::send_recipient(db, "fp", &e, reg, &LIMITS, now)
                .await
                .unwrap()
        };

        // No registration of the caller's (unknown, or another host's) and a dead one: no rows.
        assert_eq!(
            send(event("alert", "e1", "c1", 1), "nope").await,
            Accept::Unknown
        );
        assert_eq!(
            send(event("alert", "e1", "c1", 1), "other").await,
            Accept::Unknown
        );
        assert_eq!(
            send(event("alert", "e1", "c1", 1), "gone").await,
            Accept::Dead
        );
        assert_eq!(rows(db).await, (0, 0, 0), "{k:?}");

        // Enqueued: the event, one delivery due now, one recipient.
        assert_eq!(
            send(event("alert", "e1", "c1", 1), "live").await,
            Accept::Enqueued
        );
        assert_eq!(rows(db).await, (1, 1, 1), "{k:?}");
        let d = db
            .query(
                "SELECT registration_id, kind, notification_seq, due_at, expires_at, lease_until, attempts, created_at, host_fingerprint FROM push_deliveries",
                &[],
            )
            .await
            .unwrap();
        let d = &d[0];
        assert_eq!(
            (d.str(0), d.str(1), d.i64(2)),
            ("live".into(), "alert".into(), 1)
        );
        assert_eq!((d.i64(3), d.i64(7)), (now, now));
        assert_eq!(d.i64(4), now + LIMITS.notification_ttl_ms);
        assert_eq!((d.i64(5), d.i64(6)), (0, 0));
        assert_eq!(d.str(8), "fp");
        let e = db
            .query("SELECT host_fingerprint, kind, fingerprint, created_at, expires_at FROM push_events", &[])
            .await
            .unwrap();
        assert_eq!(
            (
                e[0].str(0),
                e[0].str(1),
                e[0].str(2),
                e[0].i64(3),
                e[0].i64(4)
            ),
            ("fp".into(), "alert".into(), "c1".into(), now, d.i64(4))
        );

        // A replay is queued with nothing new; other content under the same id is an error.
        assert_eq!(
            send(event("alert", "e1", "c1", 1), "live").await,
            Accept::Queued
        );
        assert_eq!(
            send(event("alert", "e1", "other", 1), "live").await,
            Accept::Error
        );
        assert_eq!(rows(db).await, (1, 1, 1), "{k:?}");

        // An existing event to a new recipient: one more delivery and recipient, no new event.
        register(db, "second", "fp", false, now).await;
        assert_eq!(
            send(event("alert", "e1", "c1", 1), "second").await,
            Accept::Enqueued
        );
        assert_eq!(rows(db).await, (1, 2, 2), "{k:?}");

        // A dismiss at seq 5 deletes the unleased covered alert of its registration only, and
        // fences later alerts up to seq 5: queued, counted as an event, no delivery.
        assert_eq!(
            send(event("dismiss", "x5", "cx", 5), "live").await,
            Accept::Enqueued
        );
        let left = db
            .query(
                "SELECT registration_id, kind FROM push_deliveries ORDER BY registration_id",
                &[],
            )
            .await
            .unwrap();
        let left: Vec<(String, String)> = left.iter().map(|r| (r.str(0), r.str(1))).collect();
        assert_eq!(
            left,
            [
                ("live".into(), "dismiss".into()),
                ("second".into(), "alert".into())
            ],
            "{k:?}"
        );
        assert_eq!(
            send(event("alert", "a4", "c4", 4), "live").await,
            Accept::Queued
        );
        assert_eq!(
            rows(db).await,
            (3, 2, 3),
            "{k:?}: the fenced alert's event counts"
        );
        assert_eq!(
            send(event("alert", "a6", "c6", 6), "live").await,
            Accept::Enqueued
        );
        assert_eq!(rows(db).await, (4, 3, 4), "{k:?}");

        // Quota: with the host's window full, a new event is rate limited, a replay is not.
        let quota = count(db, "SELECT COUNT(*) FROM push_events WHERE kind = 'alert'").await;
        for i in quota..LIMITS.event_quota {
            db.execute(
                "INSERT INTO push_events (event_id, host_fingerprint, kind, fingerprint, created_at, expires_at) VALUES ($1, 'fp', 'alert', 'f', $2, $3)",
                params![format!("fill{i}"), now, now + 1_000],
            )
            .await
            .unwrap();
        }
        assert_eq!(
            send(event("alert", "new", "cn", 9), "live").await,
            Accept::RateLimited
        );
        assert_eq!(
            send(event("alert", "e1", "c1", 1), "live").await,
            Accept::Queued
        );
        assert_eq!(
            count(db, "SELECT COUNT(*) FROM push_deliveries").await,
            3,
            "{k:?}"
        );
    }
}

/// Postgres: an alert recipient (enqueued, replayed, unknown registration) is one round trip of
/// four statements (`BEGIN`, the scope, the accept statement, `COMMIT`) once its statements are
/// prepared on the connection.
#[tokio::test]
async fn alert_recipient_is_one_round_trip_on_postgres() {
    for t in backends().await {
        if t.kind() != orca_relay::store::DbKind::Postgres {
            continue;
        }
        // One connection, so the warm-up prepares on the connection that is measured.
        let db = &Db::connect(&t.url, 1).await.unwrap();
        let now = orca_relay::clock::now_ms();
        register(db, "live", "fp", false, now).await;
        let send = |e: NewEvent<'static>, reg: &'static str| async move {
            let start = db.wire_stats();
            let a = store::send_recipient(db, "fp", &e, reg, &LIMITS, now)
                .await
                .unwrap();
            (a, db.wire_stats() - start)
        };
        send(event("alert", "warm", "cw", 1), "live").await;
        for (e, reg, want) in [
            (event("alert", "e1", "c1", 2), "live", Accept::Enqueued),
            (event("alert", "e1", "c1", 2), "live", Accept::Queued),
            (event("alert", "e2", "c2", 3), "nope", Accept::Unknown),
        ] {
            let (a, cost) = send(e, reg).await;
            assert_eq!(a, want);
            assert_eq!(
                (cost.round_trips, cost.statements, cost.prepares),
                (1, 4, 0),
                "{want:?}: {cost:?}"
            );
        }
        assert_eq!(rows(db).await, (2, 2, 2));
    }
}

/// Concurrent recipients of one host wait for each other's scope, and each decides on what the
/// previous holder committed: with 5 events of quota left, 20 new events sent at once on 8
/// connections enqueue exactly 5 (a statement deciding on a snapshot taken before the lock would
/// let more through).
#[tokio::test]
async fn concurrent_accepts_of_one_host_keep_the_quota() {
    for t in backends().await {
        let db = &Db::connect(&t.url, 8).await.unwrap();
        let k = t.kind();
        let now = orca_relay::clock::now_ms();
        register(db, "live", "fp", false, now).await;
        for i in 0..LIMITS.event_quota - 5 {
            db.execute(
                "INSERT INTO push_events (event_id, host_fingerprint, kind, fingerprint, created_at, expires_at) VALUES ($1, 'fp', 'alert', 'f', $2, $3)",
                params![format!("fill{i}"), now, now + 1_000],
            )
            .await
            .unwrap();
        }
        let ids: Vec<String> = (0..20).map(|i| format!("c{i}")).collect();
        let answers = futures_util::future::join_all(ids.iter().enumerate().map(|(i, id)| {
            let e = NewEvent {
                kind: "alert",
                event_id: id,
                content: id,
                payload: "{}",
                notification_id: Some(id),
                notification_seq: i as i64,
                notification_epoch: "e",
                expires_at: None,
            };
            async move {
                store::send_recipient(db, "fp", &e, "live", &LIMITS, now)
                    .await
                    .unwrap()
            }
        }))
        .await;
        let enqueued = answers.iter().filter(|a| **a == Accept::Enqueued).count();
        let limited = answers
            .iter()
            .filter(|a| **a == Accept::RateLimited)
            .count();
        assert_eq!((enqueued, limited), (5, 15), "{k:?}: {answers:?}");
        assert_eq!(rows(db).await, (LIMITS.event_quota, 5, 5), "{k:?}");
    }
}
