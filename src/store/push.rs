//! Every push SQL statement (docs/reference/http.md), written once for both backends. The numbers of the
//! push policy (session lifetime, quotas, lease length) come from `push` in [`Limits`]; the proof
//! check comes in as a function, so this module knows rows, not rules.
//!
//! Scopes: `orca-push-session:<fp>`, `orca-push-device-cap:<fp>`, `orca-push-events:<fp>` (waiting)
//! and `orca-push-device:<registrationId>` (try only). No transaction takes two scopes; only the
//! session verification holds a row lock before its scope, and no other transaction takes that
//! scope's row, so no lock cycle exists (ARCHITECTURE.md).

use super::{Db, DbError, Tx, Value};
use crate::model::push::Device;
use crate::params;
use crate::transaction;

/// The push policy numbers the statements apply (docs/reference/http.md / ARCHITECTURE.md).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub session_ttl_ms: i64,
    pub lease_ms: i64,
    pub event_quota: i64,
    pub event_quota_window_ms: i64,
    pub notification_ttl_ms: i64,
    pub max_devices: i64,
}

/// One notification event as `accept` stores it, derived by `push` from the validated
/// notification.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    /// `K`: `kind` or `alert`.
    pub kind: &'a str,
    pub event_id: &'a str,
    /// The content fingerprint a replay must match.
    pub content: &'a str,
    /// Canonical JSON, sent as is by the worker.
    pub payload: &'a str,
    pub notification_id: Option<&'a str>,
    pub notification_seq: i64,
    pub notification_epoch: &'a str,
    pub expires_at: Option<i64>,
}

// ---------------------------------------------------------------- challenges and sessions

pub async fn insert_challenge(
    db: &Db,
    challenge_id: &str,
    fp: &str,
    secret_hash: &str,
    expires_at: i64,
) -> Result<(), DbError> {
    db.execute(
        "INSERT INTO push_challenges (challenge_id, host_fingerprint, secret_hash, expires_at, consumed_at) VALUES ($1, $2, $3, $4, NULL)",
        params![challenge_id, fp, secret_hash, expires_at],
    )
    .await
    .map(|_| ())
}

/// Result of `POST /v1/host/session` (docs/reference/http.md).
#[derive(Debug, PartialEq, Eq)]
pub enum Verify {
    /// Session created for this fingerprint.
    Ok {
        fp: String,
    },
    UnknownChallenge,
    InvalidProof,
}

/// Verifies the proof and, in the same transaction, replaces the host's session with `token_hash`.
pub async fn verify_and_open_session(
    db: &Db,
    challenge_id: &str,
    proof_matches: &(dyn Fn(&str) -> bool + Sync),
    token_hash: &str,
    limits: &Limits,
    now: i64,
) -> Result<Verify, DbError> {
    transaction!(db, "push_session", |tx| {
        let row = tx
            .query_opt(
                "SELECT host_fingerprint, secret_hash, expires_at, consumed_at FROM push_challenges WHERE challenge_id = $1 FOR UPDATE",
                params![challenge_id],
            )
            .await?;
        let Some(row) = row else {
            return Ok(Verify::UnknownChallenge);
        };
        let fp = row.str(0);
        if !row.is_null(3) || now > row.i64(2) {
            return Ok(Verify::InvalidProof);
        }
        if !proof_matches(&row.str(1)) {
            return Ok(Verify::InvalidProof);
        }
        let n = tx
            .execute(
                "UPDATE push_challenges SET consumed_at = $1 WHERE challenge_id = $2 AND consumed_at IS NULL",
                params![now, challenge_id],
            )
            .await?;
        if n != 1 {
            return Ok(Verify::InvalidProof);
        }
        tx.scope_lock(&format!("orca-push-session:{fp}")).await?;
        tx.execute(
            "DELETE FROM push_sessions WHERE host_fingerprint = $1",
            params![fp.as_str()],
        )
        .await?;
        tx.execute(
            "INSERT INTO push_sessions (token_hash, host_fingerprint, expires_at, created_at) VALUES ($1, $2, $3, $4)",
            params![token_hash, fp.as_str(), now + limits.session_ttl_ms, now],
        )
        .await?;
        Ok::<_, DbError>(Verify::Ok { fp })
    })
}

/// `(fingerprint, expires_at)` of a session.
pub async fn resolve_session(db: &Db, token_hash: &str) -> Result<Option<(String, i64)>, DbError> {
    let rows = db
        .query(
            "SELECT host_fingerprint, expires_at FROM push_sessions WHERE token_hash = $1",
            params![token_hash],
        )
        .await?;
    Ok(rows.first().map(|r| (r.str(0), r.i64(1))))
}

// ---------------------------------------------------------------- devices

/// `Ok(None)`: the host already has 64 devices.
pub async fn upsert_device(
    db: &Db,
    fp: &str,
    d: &Device,
    limits: &Limits,
    now: i64,
) -> Result<Option<String>, DbError> {
    transaction!(db, "push_device_upsert", |tx| {
        tx.scope_lock(&format!("orca-push-device-cap:{fp}")).await?;
        let existing = tx
            .query_opt(
                "SELECT registration_id FROM push_devices WHERE host_fingerprint = $1 AND device_id = $2",
                params![fp, d.device_id.as_str()],
            )
            .await?;
        if let Some(row) = existing {
            let id = row.str(0);
            tx.execute(
                "UPDATE push_devices SET platform = $1, token = $2, apns_environment = $3, dead_at = NULL, updated_at = $4 WHERE registration_id = $5",
                params![
                    d.platform.as_str(),
                    d.token.as_str(),
                    d.apns_environment.clone(),
                    now,
                    id.as_str()
                ],
            )
            .await?;
            return Ok(Some(id));
        }
        let count = tx
            .query_opt(
                "SELECT COUNT(*) FROM push_devices WHERE host_fingerprint = $1",
                params![fp],
            )
            .await?
            .map(|r| r.i64(0))
            .unwrap_or(0);
        if count >= limits.max_devices {
            return Ok(None);
        }
        let id = uuid::Uuid::new_v4().to_string();
        tx.execute(
            "INSERT INTO push_devices (registration_id, host_fingerprint, device_id, platform, token, apns_environment, dead_at, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $7)",
            params![
                id.as_str(),
                fp,
                d.device_id.as_str(),
                d.platform.as_str(),
                d.token.as_str(),
                d.apns_environment.clone(),
                now
            ],
        )
        .await?;
        Ok::<_, DbError>(Some(id))
    })
}

/// `(registrationId, deviceId, platform, dead)` of the host's devices.
pub async fn list_devices(
    db: &Db,
    fp: &str,
) -> Result<Vec<(String, String, String, bool)>, DbError> {
    let rows = db
        .query(
            "SELECT registration_id, device_id, platform, dead_at FROM push_devices WHERE host_fingerprint = $1 ORDER BY created_at, registration_id LIMIT 64",
            params![fp],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.str(0), r.str(1), r.str(2), !r.is_null(3)))
        .collect())
}

/// True when the caller's registration was deleted (its pending deliveries go with it, except one
/// already leased, which finishes on its own).
pub async fn delete_device(
    db: &Db,
    fp: &str,
    registration_id: &str,
    now: i64,
) -> Result<bool, DbError> {
    transaction!(db, "push_device_delete", |tx| {
        tx.scope_lock(&format!("orca-push-device-cap:{fp}")).await?;
        let n = tx
            .execute(
                "DELETE FROM push_devices WHERE registration_id = $1 AND host_fingerprint = $2",
                params![registration_id, fp],
            )
            .await?;
        if n == 1 {
            tx.execute(
                "DELETE FROM push_deliveries WHERE registration_id = $1 AND lease_until <= $2",
                params![registration_id, now],
            )
            .await?;
        }
        Ok::<_, DbError>(n == 1)
    })
}

/// The registration's current target, for the worker.
#[derive(Debug, Clone)]
pub struct Target {
    pub platform: String,
    pub token: String,
    pub apns_environment: Option<String>,
    pub dead: bool,
}

/// Rows of devices with `dead_at` set (admin overview).
pub async fn dead_registrations(db: &Db) -> Result<i64, DbError> {
    let rows = db
        .query(
            "SELECT COUNT(*) FROM push_devices WHERE dead_at IS NOT NULL",
            &[],
        )
        .await?;
    Ok(rows.first().map(|r| r.i64(0)).unwrap_or(0))
}

// ---------------------------------------------------------------- send

/// Per-recipient result of `accept` (docs/reference/http.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// A delivery row was inserted (wake the worker).
    Enqueued,
    /// Nothing new to deliver (replay or fenced alert), but the answer is `queued`.
    Queued,
    RateLimited,
    Error,
    /// The caller has no registration with this id (`send_recipient` only): `error`.
    Unknown,
    /// The registration is dead (`send_recipient` only): `dead`.
    Dead,
}

/// The accept transaction for one recipient, under scope `orca-push-events:<fp>`.
pub async fn accept(
    db: &Db,
    fp: &str,
    n: &NewEvent<'_>,
    registration_id: &str,
    limits: &Limits,
    now: i64,
) -> Result<Accept, DbError> {
    accept_tx(db, fp, n, registration_id, false, limits, now).await
}

/// One recipient of `POST /v1/send` (docs/reference/http.md): the registration check (`Unknown` → `error`,
/// `Dead` → `dead`) and then [`accept`], in the recipient's own transaction. Three round trips
/// on Postgres: `BEGIN` with the scope, one read of everything the steps decide on, and the
/// writes pipelined with `COMMIT`.
pub async fn send_recipient(
    db: &Db,
    fp: &str,
    n: &NewEvent<'_>,
    registration_id: &str,
    limits: &Limits,
    now: i64,
) -> Result<Accept, DbError> {
    accept_tx(db, fp, n, registration_id, true, limits, now).await
}

/// The recipient's own transaction under scope `orca-push-events:<fp>`; `check_device`
/// as in [`accept_in`].
async fn accept_tx(
    db: &Db,
    fp: &str,
    n: &NewEvent<'_>,
    registration_id: &str,
    check_device: bool,
    limits: &Limits,
    now: i64,
) -> Result<Accept, DbError> {
    let scope = format!("orca-push-events:{fp}");
    if db.kind() == super::DbKind::Postgres && n.kind == "alert" {
        // One flight: `BEGIN`, the scope, [`ACCEPT_ALERT_PG`], `COMMIT`.
        let sql = &ACCEPT_ALERT_PG[usize::from(check_device)];
        let delivery_id = uuid::Uuid::new_v4().to_string();
        let cap = now + limits.notification_ttl_ms;
        let p = params![
            registration_id,
            fp,
            n.event_id,
            n.kind,
            now - limits.event_quota_window_ms,
            n.notification_epoch,
            n.notification_id,
            n.notification_seq,
            now,
            n.expires_at.map_or(cap, |e| e.min(cap)),
            limits.event_quota,
            n.content,
            delivery_id.as_str(),
            n.payload
        ];
        return transaction!(db, "push_accept", |tx| {
            let rows = tx.scoped_finish_with(&scope, sql, p).await?;
            Ok::<_, DbError>(accept_outcome(
                &rows.first().map(|r| r.str(0)).unwrap_or_default(),
            ))
        });
    }
    transaction!(db, "push_accept", |tx| {
        tx.scope_lock(&scope).await?;
        accept_in(tx, fp, n, registration_id, check_device, limits, now).await
    })
}

/// The answer [`ACCEPT_ALERT_PG`] decided.
fn accept_outcome(s: &str) -> Accept {
    match s {
        "enqueued" => Accept::Enqueued,
        "queued" => Accept::Queued,
        "rate_limited" => Accept::RateLimited,
        "unknown" => Accept::Unknown,
        "dead" => Accept::Dead,
        _ => Accept::Error,
    }
}

/// Postgres, an alert: every accept step of docs/reference/http.md in one statement, run under the scope
/// (the statement's snapshot is taken after the lock is held). `r` reads what the steps decide
/// on (as [`ACCEPT_READ`]), `s` decides in the steps' order (unknown, dead, conflict, deadline,
/// quota, replay or fence, enqueue) and the inserts run only for the answers that write: the event
/// when new and `queued`/`enqueued` (a fenced alert's event still counts), the delivery and the
/// recipient when `enqueued`. `[0]` skips the registration check ([`accept`]), `[1]` makes it
/// ([`send_recipient`]). Parameters: `$1` registration, `$2` fp, `$3` event id, `$4` kind, `$5`
/// quota window start, `$6` epoch, `$7` notification id, `$8` seq, `$9` now, `$10` a new event's
/// deadline, `$11` quota, `$12` content fingerprint, `$13` delivery id, `$14` payload. A dismiss
/// (fence upsert and deletes first) takes the stepwise [`accept_in`].
static ACCEPT_ALERT_PG: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    let sql = |device: &str| {
        format!(
            "WITH r AS MATERIALIZED (SELECT \
               (SELECT CASE WHEN v.dead_at IS NULL THEN 0 ELSE 1 END FROM push_devices v WHERE v.registration_id = $1 AND v.host_fingerprint = $2) AS dev, \
               (SELECT e.fingerprint FROM push_events e WHERE e.event_id = $3) AS efp, \
               (SELECT e.expires_at FROM push_events e WHERE e.event_id = $3) AS eexp, \
               CASE WHEN EXISTS (SELECT 1 FROM push_events e WHERE e.event_id = $3) THEN 0 \
                 ELSE (SELECT COUNT(*) FROM push_events q WHERE q.host_fingerprint = $2 AND q.kind = $4 AND q.created_at > $5) END AS used, \
               EXISTS (SELECT 1 FROM push_event_recipients x WHERE x.event_id = $3 AND x.registration_id = $1) AS seen, \
               EXISTS (SELECT 1 FROM push_dismissed_events f WHERE f.host_fingerprint = $2 AND f.notification_epoch = $6 \
                 AND f.notification_id = $7 AND f.notification_seq >= $8) AS fenced), \
             s AS (SELECT r.efp, COALESCE(r.eexp, $10) AS deadline, CASE {device} \
               WHEN r.efp IS NOT NULL AND r.efp <> $12 THEN 'error' \
               WHEN COALESCE(r.eexp, $10) <= $9 THEN 'error' \
               WHEN r.efp IS NULL AND r.used >= $11 THEN 'rate_limited' \
               WHEN r.seen OR r.fenced THEN 'queued' \
               ELSE 'enqueued' END AS outcome FROM r), \
             e AS (INSERT INTO push_events (event_id, host_fingerprint, kind, fingerprint, created_at, expires_at) \
               SELECT $3, $2, $4, $12, $9, s.deadline FROM s WHERE s.efp IS NULL AND s.outcome IN ('queued', 'enqueued')), \
             d AS (INSERT INTO push_deliveries (delivery_id, host_fingerprint, registration_id, kind, notification_epoch, notification_id, notification_seq, payload_json, due_at, expires_at, lease_token, lease_until, attempts, created_at) \
               SELECT CAST($13 AS TEXT), $2, $1, $4, $6, $7, $8, CAST($14 AS TEXT), $9, s.deadline, NULL, 0, 0, $9 FROM s WHERE s.outcome = 'enqueued'), \
             c AS (INSERT INTO push_event_recipients (event_id, registration_id, created_at) SELECT $3, $1, $9 FROM s WHERE s.outcome = 'enqueued') \
             SELECT outcome FROM s"
        )
    };
    [
        sql(""),
        sql("WHEN r.dev IS NULL THEN 'unknown' WHEN r.dev = 1 THEN 'dead'"),
    ]
});

/// Every read the accept steps decide on, in one statement: the registration (`NULL` unknown,
/// 0 live, 1 dead), the event's content fingerprint and deadline, the host's quota use for `K`
/// (only when the event is new), whether the recipient exists, and whether a fence covers this
/// alert (`$7` is `NULL` for a dismiss or an alert without an id: no fence applies).
const ACCEPT_READ: &str = "SELECT \
     (SELECT CASE WHEN v.dead_at IS NULL THEN 0 ELSE 1 END FROM push_devices v WHERE v.registration_id = $1 AND v.host_fingerprint = $2), \
     (SELECT e.fingerprint FROM push_events e WHERE e.event_id = $3), \
     (SELECT e.expires_at FROM push_events e WHERE e.event_id = $3), \
     CASE WHEN EXISTS (SELECT 1 FROM push_events e WHERE e.event_id = $3) THEN 0 \
       ELSE (SELECT COUNT(*) FROM push_events q WHERE q.host_fingerprint = $2 AND q.kind = $4 AND q.created_at > $5) END, \
     CASE WHEN EXISTS (SELECT 1 FROM push_event_recipients r WHERE r.event_id = $3 AND r.registration_id = $1) THEN 1 ELSE 0 END, \
     CASE WHEN EXISTS (SELECT 1 FROM push_dismissed_events f WHERE f.host_fingerprint = $2 AND f.notification_epoch = $6 \
       AND f.notification_id = $7 AND f.notification_seq >= $8) THEN 1 ELSE 0 END";

const INSERT_EVENT: &str = "INSERT INTO push_events (event_id, host_fingerprint, kind, fingerprint, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6)";
const INSERT_DELIVERY: &str = "INSERT INTO push_deliveries (delivery_id, host_fingerprint, registration_id, kind, notification_epoch, notification_id, notification_seq, payload_json, due_at, expires_at, lease_token, lease_until, attempts, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, 0, 0, $9)";
const INSERT_RECIPIENT: &str =
    "INSERT INTO push_event_recipients (event_id, registration_id, created_at) VALUES ($1, $2, $3)";
/// Postgres: the delivery, the recipient and (`{event}`, when new) the event in one statement,
/// parameters `$1..$10` as [`INSERT_DELIVERY`], `$11` event id, `$12` content fingerprint.
const INSERT_ENQUEUE_PG: &str = "WITH {event}d AS (INSERT INTO push_deliveries (delivery_id, host_fingerprint, registration_id, kind, notification_epoch, notification_id, notification_seq, payload_json, due_at, expires_at, lease_token, lease_until, attempts, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, 0, 0, $9)) \
     INSERT INTO push_event_recipients (event_id, registration_id, created_at) VALUES ($11, $3, $9)";
const INSERT_ENQUEUE_PG_EVENT: &str = "e AS (INSERT INTO push_events (event_id, host_fingerprint, kind, fingerprint, created_at, expires_at) VALUES ($11, $2, $4, $12, $9, $10)), ";

/// Accepts one event for one registration: the gates on one read (device, content, deadline,
/// quota, replay or fence), a dismiss's cleanup, then the event, delivery and recipient rows.
#[allow(clippy::too_many_arguments)]
async fn accept_in(
    tx: &mut Tx,
    fp: &str,
    n: &NewEvent<'_>,
    registration_id: &str,
    check_device: bool,
    limits: &Limits,
    now: i64,
) -> Result<Accept, DbError> {
    let (kind, event_id, content) = (n.kind, n.event_id, n.content);
    let (seq, epoch) = (n.notification_seq, n.notification_epoch);
    let fence_id = if kind == "alert" {
        n.notification_id
    } else {
        None
    };
    let read = tx
        .query_opt(
            ACCEPT_READ,
            params![
                registration_id,
                fp,
                event_id,
                kind,
                now - limits.event_quota_window_ms,
                epoch,
                fence_id,
                seq
            ],
        )
        .await?
        .unwrap_or_default();
    let gate = match accept_gate(&read, n, check_device, limits, now) {
        Ok(g) => g,
        Err(answer) => return Ok(answer),
    };
    if gate.replay {
        // Replay or fenced alert: `queued`, no recipient, no delivery; a new event still counts.
        if !gate.exists {
            tx.finish_with(
                INSERT_EVENT,
                params![event_id, fp, kind, content, now, gate.deadline],
            )
            .await?;
        }
        return Ok(Accept::Queued);
    }
    if let (Some(id), "dismiss") = (n.notification_id, kind) {
        dismiss_older(tx, fp, registration_id, (epoch, id, seq), now).await?;
    }
    enqueue(tx, fp, n, registration_id, &gate, now).await?;
    Ok(Accept::Enqueued)
}

/// What [`accept_gate`] let through: whether the event row exists, the delivery deadline, and
/// whether this is a replay (or a fenced alert) that queues nothing.
struct AcceptGate {
    exists: bool,
    deadline: i64,
    replay: bool,
}

/// The accept's checks on its one read, in order: an unknown or dead device (when checked), a
/// known event id with other content, a deadline already past, a new event over the quota.
fn accept_gate(
    read: &super::Row,
    n: &NewEvent<'_>,
    check_device: bool,
    limits: &Limits,
    now: i64,
) -> Result<AcceptGate, Accept> {
    if check_device {
        if read.is_null(0) {
            return Err(Accept::Unknown);
        }
        if read.bool(0) {
            return Err(Accept::Dead);
        }
    }
    let exists = !read.is_null(1);
    let deadline = if exists {
        if read.str(1) != n.content {
            return Err(Accept::Error);
        }
        read.i64(2)
    } else {
        let cap = now + limits.notification_ttl_ms;
        n.expires_at.map_or(cap, |e| e.min(cap))
    };
    if deadline <= now {
        return Err(Accept::Error);
    }
    if !exists && read.i64(3) >= limits.event_quota {
        return Err(Accept::RateLimited);
    }
    Ok(AcceptGate {
        exists,
        deadline,
        replay: read.bool(4) || read.bool(5),
    })
}

/// A dismiss remembers the highest dismissed sequence of its notification and drops the
/// registration's unleased deliveries of that alert up to it.
async fn dismiss_older(
    tx: &mut Tx,
    fp: &str,
    registration_id: &str,
    (epoch, id, seq): (&str, &str, i64),
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO push_dismissed_events (host_fingerprint, notification_epoch, notification_id, notification_seq, created_at) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (host_fingerprint, notification_epoch, notification_id) DO UPDATE SET \
         notification_seq = CASE WHEN excluded.notification_seq > push_dismissed_events.notification_seq THEN excluded.notification_seq ELSE push_dismissed_events.notification_seq END, \
         created_at = excluded.created_at",
        params![fp, epoch, id, seq, now],
    )
    .await?;
    tx.execute(
        "DELETE FROM push_deliveries WHERE registration_id = $1 AND kind = 'alert' AND notification_epoch = $2 AND notification_id = $3 AND notification_seq <= $4 AND lease_until <= $5",
        params![registration_id, epoch, id, seq, now],
    )
    .await?;
    Ok(())
}

/// Writes the delivery, its recipient and (when new) the event: one statement on Postgres, three
/// on SQLite; the last statement goes with the commit.
async fn enqueue(
    tx: &mut Tx,
    fp: &str,
    n: &NewEvent<'_>,
    registration_id: &str,
    gate: &AcceptGate,
    now: i64,
) -> Result<(), DbError> {
    let (kind, event_id, content, exists, deadline) =
        (n.kind, n.event_id, n.content, gate.exists, gate.deadline);
    let delivery_id = uuid::Uuid::new_v4().to_string();
    let delivery = params![
        delivery_id.as_str(),
        fp,
        registration_id,
        kind,
        n.notification_epoch,
        n.notification_id,
        n.notification_seq,
        n.payload,
        now,
        deadline
    ];
    if tx.kind() == super::DbKind::Postgres {
        let sql =
            INSERT_ENQUEUE_PG.replace("{event}", if exists { "" } else { INSERT_ENQUEUE_PG_EVENT });
        let mut p = delivery.to_vec();
        p.push(Value::from(event_id));
        if !exists {
            p.push(Value::from(content));
        }
        tx.finish_with(&sql, &p).await?;
        return Ok(());
    }
    if !exists {
        tx.execute(
            INSERT_EVENT,
            params![event_id, fp, kind, content, now, deadline],
        )
        .await?;
    }
    tx.execute(INSERT_DELIVERY, delivery).await?;
    tx.finish_with(INSERT_RECIPIENT, params![event_id, registration_id, now])
        .await?;
    Ok(())
}

// ---------------------------------------------------------------- worker

/// A leased delivery, with the registration's target as the claim read it.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub delivery_id: String,
    pub lease_token: String,
    pub host_fingerprint: String,
    pub registration_id: String,
    pub payload_json: String,
    pub expires_at: i64,
    pub attempts: i64,
    /// `None`: the registration is gone.
    pub target: Option<Target>,
}

/// What one batched claim did.
#[derive(Debug, Default)]
pub struct ClaimBatch {
    /// Leased deliveries, in due order, at most one per registration.
    pub claimed: Vec<Claimed>,
    /// Fenced alerts deleted instead of leased (their registrations' next rows are due now).
    pub fenced: usize,
    /// Candidates left alone because another claimer holds their registration.
    pub busy: usize,
}

impl ClaimBatch {
    /// True when another claim may find more right away.
    pub fn progressed(&self) -> bool {
        !self.claimed.is_empty() || self.fenced > 0
    }
}

/// Claims the next due delivery (ARCHITECTURE.md): a batch of one.
pub async fn claim(db: &Db, limits: &Limits, now: i64) -> Result<Option<Claimed>, DbError> {
    Ok(claim_batch(db, limits, now, 1)
        .await?
        .claimed
        .into_iter()
        .next())
}

/// `$first, $first+1, …` for `n` values.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The length an `IN` list of `n` values is padded to: `n` up to 4, else the next power of two.
/// A batch statement then comes in a few shapes, each prepared once per connection, instead of
/// one shape (and one prepare round trip) per batch size.
fn padded(n: usize) -> usize {
    if n <= 4 {
        n
    } else {
        n.next_power_of_two()
    }
}

/// Appends `values` to `p`, padded to [`padded`] length by repeating the last one (a repeated
/// value in an `IN` list changes nothing), and returns their placeholders.
fn push_in_list(p: &mut Vec<Value>, values: Vec<Value>) -> String {
    let first = p.len() + 1;
    let n = padded(values.len());
    let last = values.last().cloned().unwrap_or(Value::Null);
    p.extend(values);
    p.resize(first - 1 + n, last);
    placeholders(first, n)
}

/// "No unexpired row of the same registration sorts before `{t}`" (the head rule of ARCHITECTURE.md).
const IS_HEAD: &str = "NOT EXISTS (SELECT 1 FROM push_deliveries e WHERE e.registration_id = {t}.registration_id AND e.expires_at > $1 \
     AND (e.due_at, e.created_at, e.delivery_id) < ({t}.due_at, {t}.created_at, {t}.delivery_id))";
/// "No row of the same registration holds a live lease."
const NO_LIVE_LEASE: &str = "NOT EXISTS (SELECT 1 FROM push_deliveries o WHERE o.registration_id = {t}.registration_id AND o.lease_until > $1)";

/// Appended to the `RETURNING` list of the worker's writes (lease, finish) on Postgres: turns off
/// `synchronous_commit` for that transaction only, so its `COMMIT` does not wait for the WAL
/// flush. At-least-once holds: a claim or finish lost in a database crash leaves the row pending
/// (unleased, or leased until its lease lapses) and it is sent again; a later durable commit
/// flushes the earlier WAL, so nothing durable can depend on a lost one. Accepts stay
/// synchronous (a `queued` answer means committed). Evaluated per written row: a transaction
/// that wrote nothing has nothing to flush.
fn async_commit(tx: &Tx) -> &'static str {
    match tx.kind() {
        super::DbKind::Postgres => ", set_config('synchronous_commit', 'off', true)",
        super::DbKind::Sqlite => "",
    }
}

/// Claims up to `max` due deliveries in one transaction (ARCHITECTURE.md, batched): each candidate is
/// the head of its registration (earliest unexpired row in due order), due, unleased, and its
/// registration holds no live lease. On Postgres the candidates are locked `FOR UPDATE SKIP
/// LOCKED`, then the try-scopes `orca-push-device:<registrationId>` are taken in one statement, and
/// the lease statement re-checks the head and live-lease rules under those scopes, so at most one
/// delivery per registration is in flight across every process. Fenced alerts are deleted
/// instead. The registrations' targets are read in the same transaction (pipelined with `COMMIT`).
pub async fn claim_batch(
    db: &Db,
    limits: &Limits,
    now: i64,
    max: usize,
) -> Result<ClaimBatch, DbError> {
    if max == 0 {
        return Ok(ClaimBatch::default());
    }
    transaction!(db, "push_claim", |tx| claim_batch_in(tx, limits, now, max)
        .await)
}

/// One claim: the due head deliveries without a live lease (locked, skipping locked ones);
/// fenced alerts among them are deleted, the rest leased if their device's scope lock is free,
/// and returned with their devices, in the candidates' order.
async fn claim_batch_in(
    tx: &mut Tx,
    limits: &Limits,
    now: i64,
    max: usize,
) -> Result<ClaimBatch, DbError> {
    let rows = claim_candidates(tx, limits, now, max).await?;
    let mut batch = ClaimBatch::default();
    if rows.is_empty() {
        return Ok(batch);
    }
    let (fenced, live): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r.bool(2));
    if !fenced.is_empty() {
        batch.fenced = delete_fenced(tx, &fenced, now).await?;
    }
    if live.is_empty() {
        return Ok(batch);
    }
    let ids = lock_device_scopes(tx, &live).await?;
    batch.busy = live.len() - ids.len();
    if ids.is_empty() {
        return Ok(batch);
    }
    let (leased, lease_token) = lease_deliveries(tx, &ids, limits, now).await?;
    if leased.is_empty() {
        return Ok(batch);
    }
    batch.claimed = claimed_with_devices(tx, &leased, &ids, &lease_token).await?;
    Ok(batch)
}

/// The claim's candidates: `(delivery id, registration id, fenced)` of due, unexpired head
/// deliveries without a live lease, oldest first, locked skipping those locked elsewhere.
async fn claim_candidates(
    tx: &mut Tx,
    limits: &Limits,
    now: i64,
    max: usize,
) -> Result<Vec<super::Row>, DbError> {
    let candidates_sql = format!(
        "SELECT d.delivery_id, d.registration_id, \
         CASE WHEN d.kind = 'alert' AND d.notification_id IS NOT NULL AND EXISTS (SELECT 1 FROM push_dismissed_events f \
           WHERE f.host_fingerprint = d.host_fingerprint AND f.notification_epoch = d.notification_epoch \
           AND f.notification_id = d.notification_id AND f.notification_seq >= d.notification_seq) THEN 1 ELSE 0 END \
         FROM push_deliveries d WHERE d.lease_until <= $1 AND d.expires_at > $1 AND d.due_at <= $1 AND d.due_at > $2 \
         AND {} AND {} ORDER BY d.due_at, d.created_at, d.delivery_id LIMIT $3 FOR UPDATE SKIP LOCKED",
        NO_LIVE_LEASE.replace("{t}", "d"),
        IS_HEAD.replace("{t}", "d"),
    );
    tx.query(
        &candidates_sql,
        params![now, now - limits.notification_ttl_ms, max as i64],
    )
    .await
}

/// Deletes the fenced alerts (a later dismiss covers them) that are still unleased.
async fn delete_fenced(tx: &mut Tx, fenced: &[&super::Row], now: i64) -> Result<usize, DbError> {
    let mut p: Vec<Value> = vec![Value::Int(now)];
    let list = push_in_list(
        &mut p,
        fenced.iter().map(|r| Value::Text(r.str(0))).collect(),
    );
    let sql =
        format!("DELETE FROM push_deliveries WHERE lease_until <= $1 AND delivery_id IN ({list})");
    Ok(tx.execute(&sql, &p).await? as usize)
}

/// Tries each live delivery's device scope lock; returns the ids of those whose lock it got.
async fn lock_device_scopes(tx: &mut Tx, live: &[&super::Row]) -> Result<Vec<String>, DbError> {
    let mut scopes: Vec<String> = live
        .iter()
        .map(|r| format!("orca-push-device:{}", r.str(1)))
        .collect();
    // Padded like the `IN` lists: trying a scope this transaction already holds succeeds again
    // and changes nothing; only the first answers are read.
    let last = scopes.last().cloned().unwrap_or_default();
    scopes.resize(padded(live.len()), last);
    let locked = tx.try_scope_locks(&scopes).await?;
    Ok(live
        .iter()
        .zip(&locked)
        .filter(|(_, ok)| **ok)
        .map(|(r, _)| r.str(0))
        .collect())
}

/// Leases the deliveries (still claimable) under one new lease token; returns the leased rows
/// and the token.
async fn lease_deliveries(
    tx: &mut Tx,
    ids: &[String],
    limits: &Limits,
    now: i64,
) -> Result<(Vec<super::Row>, String), DbError> {
    let lease_token = uuid::Uuid::new_v4().to_string();
    let mut p: Vec<Value> = vec![
        Value::Int(now),
        Value::Text(lease_token.clone()),
        Value::Int(now + limits.lease_ms),
    ];
    let list = push_in_list(
        &mut p,
        ids.iter().map(|id| Value::Text(id.clone())).collect(),
    );
    let lease_sql = format!(
        "UPDATE push_deliveries SET lease_token = $2, lease_until = $3, attempts = attempts + 1 \
         WHERE delivery_id IN ({list}) AND lease_until <= $1 AND expires_at > $1 AND due_at <= $1 AND {} AND {} \
         RETURNING delivery_id, host_fingerprint, registration_id, payload_json, expires_at, attempts{}",
        NO_LIVE_LEASE.replace("{t}", "push_deliveries"),
        IS_HEAD.replace("{t}", "push_deliveries"),
        async_commit(tx),
    );
    let leased = tx.query(&lease_sql, &p).await?;
    Ok((leased, lease_token))
}

/// The leased deliveries with their devices (read with the commit), in the candidates' order.
async fn claimed_with_devices(
    tx: &mut Tx,
    leased: &[super::Row],
    ids: &[String],
    lease_token: &str,
) -> Result<Vec<Claimed>, DbError> {
    let mut regs: Vec<Value> = Vec::with_capacity(padded(leased.len()));
    let list = push_in_list(
        &mut regs,
        leased.iter().map(|r| Value::Text(r.str(2))).collect(),
    );
    let devices_sql = format!(
        "SELECT registration_id, platform, token, apns_environment, dead_at FROM push_devices WHERE registration_id IN ({list})"
    );
    let devices = tx.finish_with(&devices_sql, &regs).await?;
    let target = |reg: &str| {
        devices.iter().find(|d| d.str(0) == reg).map(|d| Target {
            platform: d.str(1),
            token: d.str(2),
            apns_environment: d.opt_str(3),
            dead: !d.is_null(4),
        })
    };
    let order = |id: &str| ids.iter().position(|x| x == id).unwrap_or(usize::MAX);
    let mut claimed: Vec<Claimed> = leased
        .iter()
        .map(|r| {
            let reg = r.str(2);
            Claimed {
                delivery_id: r.str(0),
                lease_token: lease_token.to_owned(),
                host_fingerprint: r.str(1),
                target: target(&reg),
                registration_id: reg,
                payload_json: r.str(3),
                expires_at: r.i64(4),
                attempts: r.i64(5),
            }
        })
        .collect();
    claimed.sort_by_key(|c| order(&c.delivery_id));
    Ok(claimed)
}

/// Extends a live lease; false when the lease was lost.
pub async fn renew(db: &Db, c: &Claimed, limits: &Limits, now: i64) -> Result<bool, DbError> {
    let n = db
        .execute(
            "UPDATE push_deliveries SET lease_until = $1 WHERE delivery_id = $2 AND lease_token = $3",
            params![now + limits.lease_ms, c.delivery_id.as_str(), c.lease_token.as_str()],
        )
        .await?;
    Ok(n == 1)
}

/// One finish of a batch (ARCHITECTURE.md "finish").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// No retry: delete the row.
    Delete,
    /// Retry at this time: `due_at = at, lease_until = 0, lease_token = NULL`.
    Retry(i64),
}

/// Applies finishes in one transaction of at most two statements (one `DELETE`, one `UPDATE`),
/// each matching `(delivery_id, lease_token)`: a finisher that lost its lease changes nothing.
/// Returns, per entry, whether it changed its row.
pub async fn finish_batch(db: &Db, items: &[(&Claimed, Finish)]) -> Result<Vec<bool>, DbError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let deletes: Vec<&Claimed> = items
        .iter()
        .filter(|(_, f)| *f == Finish::Delete)
        .map(|(c, _)| *c)
        .collect();
    let retries: Vec<(&Claimed, i64)> = items
        .iter()
        .filter_map(|(c, f)| match f {
            Finish::Retry(at) => Some((*c, *at)),
            Finish::Delete => None,
        })
        .collect();
    let done: Vec<String> = transaction!(db, "push_finish", |tx| {
        let mut done = Vec::new();
        let mut statements: Vec<(String, Vec<Value>)> = Vec::new();
        if !deletes.is_empty() {
            let mut p = Vec::new();
            let cond = lease_match(&deletes, &mut p);
            statements.push((
                format!(
                    "DELETE FROM push_deliveries WHERE {cond} RETURNING delivery_id{}",
                    async_commit(tx)
                ),
                p,
            ));
        }
        if !retries.is_empty() {
            let mut p: Vec<Value> = Vec::new();
            let mut case = String::from("CASE delivery_id");
            for (c, at) in &retries {
                p.push(Value::Text(c.delivery_id.clone()));
                p.push(Value::Int(*at));
                case.push_str(&format!(
                    " WHEN ${} THEN CAST(${} AS BIGINT)",
                    p.len() - 1,
                    p.len()
                ));
            }
            case.push_str(" END");
            let owned: Vec<&Claimed> = retries.iter().map(|(c, _)| *c).collect();
            let cond = lease_match(&owned, &mut p);
            statements.push((
                format!("UPDATE push_deliveries SET due_at = {case}, lease_until = 0, lease_token = NULL WHERE {cond} RETURNING delivery_id{}", async_commit(tx)),
                p,
            ));
        }
        let last = statements.len() - 1;
        for (i, (sql, p)) in statements.iter().enumerate() {
            let rows = if i == last {
                tx.finish_with(sql, p).await?
            } else {
                tx.query(sql, p).await?
            };
            done.extend(rows.iter().map(|r| r.str(0)));
        }
        Ok::<_, DbError>(done)
    })?;
    let done: std::collections::HashSet<String> = done.into_iter().collect();
    Ok(items
        .iter()
        .map(|(c, _)| done.contains(&c.delivery_id))
        .collect())
}

/// `(lease_token = $t AND delivery_id IN (…)) OR …` for `cs`, one group per lease token (a
/// claim leases its whole batch under one token, so a finish batch has a few), parameters
/// appended to `p`.
fn lease_match(cs: &[&Claimed], p: &mut Vec<Value>) -> String {
    let mut tokens: Vec<&str> = Vec::new();
    for c in cs {
        if !tokens.contains(&c.lease_token.as_str()) {
            tokens.push(&c.lease_token);
        }
    }
    let mut groups = Vec::with_capacity(tokens.len());
    for token in tokens {
        p.push(Value::Text(token.to_string()));
        let t = p.len();
        let ids = cs
            .iter()
            .filter(|c| c.lease_token == token)
            .map(|c| Value::Text(c.delivery_id.clone()))
            .collect();
        let list = push_in_list(p, ids);
        groups.push(format!("(lease_token = ${t} AND delivery_id IN ({list}))"));
    }
    groups.join(" OR ")
}

/// Deletes the delivery if this worker still holds its lease.
pub async fn finish_delete(db: &Db, c: &Claimed) -> Result<bool, DbError> {
    Ok(finish_batch(db, &[(c, Finish::Delete)]).await?[0])
}

/// Schedules a retry at `retry_at`.
pub async fn finish_retry(db: &Db, c: &Claimed, retry_at: i64) -> Result<bool, DbError> {
    Ok(finish_batch(db, &[(c, Finish::Retry(retry_at))]).await?[0])
}

/// Dead outcome: retire the registration with the values actually sent and delete the delivery,
/// in one transaction, only while the lease is held.
pub async fn finish_dead(
    db: &Db,
    c: &Claimed,
    t: &Target,
    env_sent: &str,
    now: i64,
) -> Result<(), DbError> {
    transaction!(db, "push_retire", |tx| {
        let n = tx
            .execute(
                "DELETE FROM push_deliveries WHERE delivery_id = $1 AND lease_token = $2",
                params![c.delivery_id.as_str(), c.lease_token.as_str()],
            )
            .await?;
        if n == 1 {
            tx.execute(
                "UPDATE push_devices SET dead_at = $1, updated_at = $1 WHERE registration_id = $2 AND token = $3 AND platform = $4 AND COALESCE(apns_environment, '') = $5",
                params![now, c.registration_id.as_str(), t.token.as_str(), t.platform.as_str(), env_sent],
            )
            .await?;
        }
        Ok::<_, DbError>(())
    })
}

/// Rows in `push_deliveries` with `expires_at > now`.
pub async fn queue_depth(db: &Db, now: i64) -> Result<i64, DbError> {
    let rows = db
        .query(
            "SELECT COUNT(*) FROM push_deliveries WHERE expires_at > $1",
            params![now],
        )
        .await?;
    Ok(rows.first().map(|r| r.i64(0)).unwrap_or(0))
}

// ---------------------------------------------------------------- prune

/// Deletes up to `batch` rows of `table` whose key matches `cond` (bound to `$1`); returns the count.
async fn prune_batch(
    db: &Db,
    table: &str,
    key: &str,
    cond: &str,
    bound: i64,
    batch: i64,
) -> Result<u64, DbError> {
    let sql = format!(
        "DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {cond} LIMIT {batch})"
    );
    db.execute(&sql, params![bound]).await
}

/// One prune target: (table, key expression, condition with `$1`).
pub struct PruneTarget {
    pub name: &'static str,
    pub table: &'static str,
    pub key: &'static str,
    pub cond: &'static str,
}

pub const PRUNE_CHALLENGES: &[PruneTarget] = &[PruneTarget {
    name: "challenges",
    table: "push_challenges",
    key: "challenge_id",
    cond: "expires_at < $1",
}];

pub const PRUNE_SESSIONS: &[PruneTarget] = &[PruneTarget {
    name: "sessions",
    table: "push_sessions",
    key: "token_hash",
    cond: "expires_at < $1",
}];

/// Delivery pruning; the `$1` of the first entry is `now`, of the rest `now − retention`.
pub const PRUNE_DELIVERIES: &[PruneTarget] = &[
    PruneTarget {
        name: "deliveries",
        table: "push_deliveries",
        key: "delivery_id",
        cond: "expires_at <= $1 AND lease_until <= $1",
    },
    PruneTarget {
        name: "events",
        table: "push_events",
        key: "event_id",
        cond: "created_at < $1",
    },
];

/// Recipients and fences have composite keys: deleted by their retention index directly, one
/// batch per table, addressed by the backend's physical row id.
pub async fn prune_composite(db: &Db, before: i64, batch: i64) -> Result<u64, DbError> {
    let rid = match db.kind() {
        super::DbKind::Postgres => "ctid",
        super::DbKind::Sqlite => "rowid",
    };
    let mut total = 0;
    for table in ["push_event_recipients", "push_dismissed_events"] {
        total += db
            .execute(
                &format!("DELETE FROM {table} WHERE {rid} IN (SELECT {rid} FROM {table} WHERE created_at < $1 LIMIT {batch})"),
                params![before],
            )
            .await?;
    }
    Ok(total)
}

pub async fn prune_target(
    db: &Db,
    t: &PruneTarget,
    bound: i64,
    batch: i64,
) -> Result<u64, DbError> {
    prune_batch(db, t.table, t.key, t.cond, bound, batch).await
}

/// Test and crash-recovery helper: pending delivery rows.
pub async fn pending_count(db: &Db) -> Result<i64, DbError> {
    let rows = db
        .query("SELECT COUNT(*) FROM push_deliveries", &[])
        .await?;
    Ok(rows.first().map(|r| r.i64(0)).unwrap_or(0))
}
