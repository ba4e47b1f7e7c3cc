//! The batched claim and finish of the delivery worker (ARCHITECTURE.md, `store::push::claim_batch` and
//! `finish_batch`) on every backend: heads only and one live lease per registration, even with
//! concurrent claimers; a lapsed lease is reclaimed and the lost lease's finish changes nothing
//! (at-least-once); finishes match their lease token; fenced heads are deleted, not leased.

use std::collections::{HashMap, HashSet};

use orca_relay::params;
use orca_relay::push::LIMITS;
use orca_relay::store::push::{self as store, Claimed, Finish};
use orca_relay::store::testing::backends;
use orca_relay::store::Db;

const PAYLOAD: &str = r#"{"notificationId":"x","notificationSeq":1,"notificationEpoch":"e","source":"plugin","agentState":null,"title":"T","body":"B"}"#;

/// Inserts a due alert row `id` for registration `reg`, created (and due) at `at`.
async fn insert(db: &Db, id: &str, reg: &str, at: i64, expires: i64) {
    insert_alert(db, id, reg, at, expires, None, 1).await;
}

async fn insert_alert(
    db: &Db,
    id: &str,
    reg: &str,
    at: i64,
    expires: i64,
    notification_id: Option<&str>,
    seq: i64,
) {
    db.execute(
        "INSERT INTO push_deliveries (delivery_id, host_fingerprint, registration_id, kind, notification_epoch, notification_id, notification_seq, payload_json, due_at, expires_at, lease_token, lease_until, attempts, created_at) \
         VALUES ($1, 'fp', $2, 'alert', 'e', $3, $4, $5, $6, $7, NULL, 0, 0, $6)",
        params![id, reg, notification_id, seq, PAYLOAD, at, expires],
    )
    .await
    .unwrap();
}

async fn register(db: &Db, reg: &str, now: i64) {
    db.execute(
        "INSERT INTO push_devices (registration_id, host_fingerprint, device_id, platform, token, apns_environment, dead_at, created_at, updated_at) VALUES ($1, 'fp', $1, 'ios', 'aabb', 'sandbox', NULL, $2, $2)",
        params![reg, now],
    )
    .await
    .unwrap();
}

fn ids(cs: &[Claimed]) -> Vec<&str> {
    cs.iter().map(|c| c.delivery_id.as_str()).collect()
}

/// Registrations with more than one live lease at `now`.
async fn doubly_leased(db: &Db, now: i64) -> i64 {
    db.query(
        "SELECT COUNT(*) FROM (SELECT registration_id FROM push_deliveries WHERE lease_until > $1 GROUP BY registration_id HAVING COUNT(*) > 1) x",
        params![now],
    )
    .await
    .unwrap()[0]
        .i64(0)
}

/// One claim leases the heads of distinct registrations in due order, with their targets; rows
/// behind a leased head wait; a retried head in backoff does not block the next due row.
#[tokio::test]
async fn batch_claims_heads_one_per_registration() {
    for t in backends().await {
        let db = &t.db;
        let now = orca_relay::clock::now_ms();
        let exp = now + 100_000;
        register(db, "A", now).await;
        register(db, "B", now).await;
        insert(db, "a1", "A", now - 60, exp).await;
        insert(db, "b1", "B", now - 50, exp).await;
        insert(db, "a2", "A", now - 40, exp).await;
        insert(db, "c1", "C", now - 30, exp).await;
        insert(db, "a3", "A", now - 20, exp).await;
        insert(db, "b2", "B", now - 10, exp).await;
        // Not due yet: never claimed before its time.
        insert(db, "d1", "D", now + 1_000, exp).await;

        let first = store::claim_batch(db, &LIMITS, now, 10).await.unwrap();
        assert_eq!(ids(&first.claimed), ["a1", "b1", "c1"], "{:?}", t.kind());
        assert!(first.claimed.iter().all(|c| c.attempts == 1));
        assert_eq!(
            first.claimed[0].target.as_ref().map(|t| t.token.as_str()),
            Some("aabb")
        );
        assert!(first.claimed[2].target.is_none(), "C is not registered");
        let token = &first.claimed[0].lease_token;
        assert!(first.claimed.iter().all(|c| &c.lease_token == token));
        assert_eq!(doubly_leased(db, now).await, 0);

        let none = store::claim_batch(db, &LIMITS, now, 10).await.unwrap();
        assert!(
            none.claimed.is_empty(),
            "every registration with due work is leased"
        );
        assert!(!none.progressed());

        // a1 sent, b1 retried in 5 s, c1 left in flight.
        let (a1, b1) = (&first.claimed[0], &first.claimed[1]);
        let done = store::finish_batch(
            db,
            &[(a1, Finish::Delete), (b1, Finish::Retry(now + 5_000))],
        )
        .await
        .unwrap();
        assert_eq!(done, [true, true]);
        let second = store::claim_batch(db, &LIMITS, now, 10).await.unwrap();
        assert_eq!(
            ids(&second.claimed),
            ["a2", "b2"],
            "b1 in backoff does not block b2"
        );
        assert_eq!(doubly_leased(db, now).await, 0);

        // A batch limit takes the earliest heads only.
        let second_done: Vec<(&Claimed, Finish)> =
            second.claimed.iter().map(|c| (c, Finish::Delete)).collect();
        assert_eq!(
            store::finish_batch(db, &second_done).await.unwrap(),
            [true, true]
        );
        let later = now + 5_000;
        let limited = store::claim_batch(db, &LIMITS, later, 1).await.unwrap();
        assert_eq!(ids(&limited.claimed), ["a3"], "the earliest head first");
        let rest = store::claim_batch(db, &LIMITS, later, 10).await.unwrap();
        assert_eq!(ids(&rest.claimed), ["d1", "b1"], "C is still leased");
        assert_eq!(rest.claimed[1].attempts, 2, "b1's second attempt");
    }
}

/// At-least-once: a worker that crashed between the provider's answer and its finish leaves the
/// lease to lapse; after 30 s the same rows are claimed again (attempts + 1, a new token), and
/// the crashed worker's late finishes change nothing.
#[tokio::test]
async fn lapsed_lease_is_reclaimed_and_the_lost_lease_finishes_nothing() {
    for t in backends().await {
        let db = &t.db;
        let now = orca_relay::clock::now_ms();
        let exp = now + 200_000;
        for r in 0..5 {
            insert(db, &format!("r{r}-1"), &format!("R{r}"), now - 100 + r, exp).await;
            insert(db, &format!("r{r}-2"), &format!("R{r}"), now - 50 + r, exp).await;
        }
        let crashed = store::claim_batch(db, &LIMITS, now, 64).await.unwrap();
        assert_eq!(crashed.claimed.len(), 5);
        // Still leased 1 ms before the lease ends.
        let before = now + LIMITS.lease_ms - 1;
        assert!(store::claim_batch(db, &LIMITS, before, 64)
            .await
            .unwrap()
            .claimed
            .is_empty());
        let lapsed = now + LIMITS.lease_ms;
        let again = store::claim_batch(db, &LIMITS, lapsed, 64).await.unwrap();
        assert_eq!(ids(&again.claimed), ids(&crashed.claimed), "{:?}", t.kind());
        assert!(again.claimed.iter().all(|c| c.attempts == 2));
        assert_ne!(again.claimed[0].lease_token, crashed.claimed[0].lease_token);

        let stale: Vec<(&Claimed, Finish)> = crashed
            .claimed
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let f = if i % 2 == 0 {
                    Finish::Delete
                } else {
                    Finish::Retry(lapsed + 2_000)
                };
                (c, f)
            })
            .collect();
        let done = store::finish_batch(db, &stale).await.unwrap();
        assert_eq!(done, [false; 5], "the lost lease changes nothing");
        assert_eq!(store::pending_count(db).await.unwrap(), 10);
        assert!(!store::renew(db, &crashed.claimed[0], &LIMITS, lapsed)
            .await
            .unwrap());

        // The live lease finishes (a mix in one batch) and the next heads follow.
        let live: Vec<(&Claimed, Finish)> =
            again.claimed.iter().map(|c| (c, Finish::Delete)).collect();
        assert_eq!(store::finish_batch(db, &live).await.unwrap(), [true; 5]);
        let next = store::claim_batch(db, &LIMITS, lapsed, 64).await.unwrap();
        assert_eq!(ids(&next.claimed), ["r0-2", "r1-2", "r2-2", "r3-2", "r4-2"]);
    }
}

/// A head alert covered by a dismissal fence is deleted instead of leased; the registration's
/// next row is its head on the next claim.
#[tokio::test]
async fn fenced_head_is_deleted_not_leased() {
    for t in backends().await {
        let db = &t.db;
        let now = orca_relay::clock::now_ms();
        let exp = now + 100_000;
        insert_alert(db, "f1", "F", now - 30, exp, Some("n1"), 3).await;
        insert_alert(db, "f2", "F", now - 20, exp, Some("n2"), 1).await;
        insert_alert(db, "g1", "G", now - 10, exp, Some("n1"), 9).await;
        db.execute(
            "INSERT INTO push_dismissed_events (host_fingerprint, notification_epoch, notification_id, notification_seq, created_at) VALUES ('fp', 'e', 'n1', 5, $1)",
            params![now],
        )
        .await
        .unwrap();
        let b = store::claim_batch(db, &LIMITS, now, 10).await.unwrap();
        assert_eq!(b.fenced, 1, "{:?}", t.kind());
        assert_eq!(ids(&b.claimed), ["g1"], "seq 9 is above the fence");
        assert!(b.progressed());
        let b = store::claim_batch(db, &LIMITS, now, 10).await.unwrap();
        assert_eq!(ids(&b.claimed), ["f2"]);
        assert_eq!(store::pending_count(db).await.unwrap(), 2);
    }
}

/// Eight claimers at once over 40 registrations of 5 rows each, each finishing what it claimed:
/// never two live leases for one registration, every row delivered exactly once here (nobody
/// crashed), and each registration's rows in due order.
#[tokio::test]
async fn concurrent_claimers_keep_one_in_flight_per_registration() {
    for t in backends().await {
        let db = t.db.clone();
        let now = orca_relay::clock::now_ms();
        let exp = now + 100_000;
        for k in 0..5 {
            for r in 0..40 {
                insert(
                    &db,
                    &format!("r{r:02}-{k}"),
                    &format!("R{r:02}"),
                    now - 1_000 + k * 100 + r,
                    exp,
                )
                .await;
            }
        }
        // Claim order across all claimers, appended between a claim and its finish.
        let finished = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (db, finished) = (db.clone(), finished.clone());
            tasks.push(tokio::spawn(async move {
                let mut empty = 0;
                while empty < 20 {
                    let b = store::claim_batch(&db, &LIMITS, now, 7).await.unwrap();
                    if b.claimed.is_empty() {
                        empty += 1;
                        tokio::task::yield_now().await;
                        continue;
                    }
                    empty = 0;
                    // Recorded before the finish that makes the next row claimable.
                    finished
                        .lock()
                        .unwrap()
                        .extend(b.claimed.iter().map(|c| c.delivery_id.clone()));
                    let live = doubly_leased(&db, now).await;
                    assert_eq!(live, 0, "two live leases for one registration");
                    let items: Vec<(&Claimed, Finish)> =
                        b.claimed.iter().map(|c| (c, Finish::Delete)).collect();
                    let done = store::finish_batch(&db, &items).await.unwrap();
                    assert!(done.iter().all(|d| *d));
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let delivered = finished.lock().unwrap().clone();
        let unique: HashSet<&String> = delivered.iter().collect();
        assert_eq!(delivered.len(), 200, "{:?}", t.kind());
        assert_eq!(unique.len(), 200, "no row delivered twice");
        assert_eq!(store::pending_count(&db).await.unwrap(), 0);
        // A registration's next row is claimable only once its head's finish committed, so the
        // claims of one registration are in due order.
        let mut last: HashMap<&str, u32> = HashMap::new();
        for id in &delivered {
            let (reg, k) = id.split_once('-').unwrap();
            let k: u32 = k.parse().unwrap();
            if let Some(prev) = last.insert(reg, k) {
                assert_eq!(k, prev + 1, "{id} after {reg}-{prev}");
            }
        }
    }
}

/// A finish batch mixing the leases of several claims (the finisher commits whatever
/// accumulated): each entry changes its row only under its own lease token, a stale entry (a
/// lapsed and re-leased row) or one under another claim's token changes nothing, and token
/// groups longer than 4 (their id lists padded to 8) delete exactly their rows.
#[tokio::test]
async fn finish_batch_matches_each_rows_own_token() {
    for t in backends().await {
        let db = &t.db;
        let now = orca_relay::clock::now_ms();
        let exp = now + 200_000;
        for r in 0..13 {
            insert(
                db,
                &format!("r{r:02}"),
                &format!("R{r:02}"),
                now - 100 + r,
                exp,
            )
            .await;
            insert(
                db,
                &format!("s{r:02}"),
                &format!("R{r:02}"),
                now - 50 + r,
                exp,
            )
            .await;
        }
        // r00's first lease lapses and r00 is leased again: the first lease is stale.
        let stale = store::claim_batch(db, &LIMITS, now, 1)
            .await
            .unwrap()
            .claimed;
        let later = now + LIMITS.lease_ms;
        let fresh = store::claim_batch(db, &LIMITS, later, 1)
            .await
            .unwrap()
            .claimed;
        assert_eq!(
            (ids(&stale), ids(&fresh)),
            (vec!["r00"], vec!["r00"]),
            "{:?}",
            t.kind()
        );
        let a = store::claim_batch(db, &LIMITS, later, 6)
            .await
            .unwrap()
            .claimed;
        let b = store::claim_batch(db, &LIMITS, later, 6)
            .await
            .unwrap()
            .claimed;
        assert_eq!(ids(&a), ["r01", "r02", "r03", "r04", "r05", "r06"]);
        assert_eq!(ids(&b), ["r07", "r08", "r09", "r10", "r11", "r12"]);
        assert_ne!(a[0].lease_token, b[0].lease_token);
        // r01 under b's token matches nothing.
        let mut swapped = a[0].clone();
        swapped.lease_token = b[0].lease_token.clone();

        let mut items: Vec<(&Claimed, Finish)> =
            vec![(&swapped, Finish::Delete), (&stale[0], Finish::Delete)];
        for c in a[1..].iter().chain(&b[..5]) {
            items.push((c, Finish::Delete));
        }
        items.push((&b[5], Finish::Retry(later + 5_000)));
        let done = store::finish_batch(db, &items).await.unwrap();
        let mut want = vec![false, false];
        want.extend([true; 11]);
        assert_eq!(done, want, "{:?}", t.kind());
        let mut left: Vec<String> = db
            .query("SELECT delivery_id FROM push_deliveries", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.str(0))
            .collect();
        left.sort();
        let mut expected: Vec<String> = ["r00", "r01", "r12"].map(String::from).to_vec();
        expected.extend((0..13).map(|r| format!("s{r:02}")));
        assert_eq!(left, expected, "{:?}", t.kind());
        assert_eq!(doubly_leased(db, later).await, 0);
        // r01 is still leased under a's token and r00 under the fresh one.
        let done = store::finish_batch(db, &[(&a[0], Finish::Delete), (&fresh[0], Finish::Delete)])
            .await
            .unwrap();
        assert_eq!(done, [true, true]);
    }
}
