//! Phone credentials (docs/reference/websocket.md): invites, devices with resume tokens, connection bases,
//! direct authorizations, install/confirm results, rate windows and audit events.
//!
//! Tokens never touch the database: only `token_hash` (unpadded base64url SHA-256 of the token
//! text). Audit rows never contain a token or hash. Activities (`invite-offer:<reqId>` etc.) are the
//! cell's business; operations that end an invite return the `reqId`s whose offer activity the cell
//! must release.

use serde_json::{json, Value as Json};

use super::{Db, DbError, Tx};
use crate::contract::limits;
use crate::crypto::{ct_eq_str, random_b64u32, token_hash};
use crate::params;
use crate::store::assignments::HostKey;
use crate::transaction;

/// A refused credential operation: the `control-error` code, or a store failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredError {
    Code(&'static str),
    Db(DbError),
}

impl CredError {
    pub fn code(&self) -> &'static str {
        match self {
            CredError::Code(c) => c,
            CredError::Db(_) => "control_operation_failed",
        }
    }
}

impl From<DbError> for CredError {
    fn from(e: DbError) -> Self {
        CredError::Db(e)
    }
}

impl super::RetryClass for CredError {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            CredError::Db(e) => e.retry_code(),
            CredError::Code(_) => None,
        }
    }
    fn db_error(&self) -> Option<&crate::store::DbError> {
        match self {
            CredError::Db(e) => Some(e),
            _ => None,
        }
    }
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn audit(
    tx: &mut Tx,
    kind: &str,
    host: &HostKey,
    device: &str,
    detail: Json,
    now: i64,
) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO relay_audit_events (event_id, kind, user_id, relay_host_id, relay_device_id, detail, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        params![uuid(), kind, host.user_id.as_str(), host.relay_host_id.as_str(), device, detail.to_string(), now],
    )
    .await?;
    Ok(())
}

/// Invalidates the device's non-terminal invites; returns their offer `reqId`s.
async fn invalidate_device_invites(
    tx: &mut Tx,
    host: &HostKey,
    device: &str,
    now: i64,
) -> Result<Vec<String>, DbError> {
    let rows = tx
        .query(
            "UPDATE relay_invites SET state = 'invalidated', updated_at = $4 \
             WHERE user_id = $1 AND relay_host_id = $2 AND relay_device_id = $3 \
             AND state IN ('available', 'reserved', 'cooldown') RETURNING offer_req_id",
            params![
                host.user_id.as_str(),
                host.relay_host_id.as_str(),
                device,
                now
            ],
        )
        .await?;
    Ok(rows.iter().filter_map(|r| r.opt_str(0)).collect())
}

/// A freshly minted invite.
#[derive(Debug, Clone)]
pub struct NewInvite {
    pub token: String,
    pub expires_at: i64,
    /// Offer `reqId`s of the invites this one invalidated.
    pub invalidated_offers: Vec<String>,
}

/// `invite-create`: mint rate (30 per fixed minute per user), invalidate the device's live
/// invites, insert an `available` invite expiring now + 570 000.
pub async fn create_invite(
    db: &Db,
    host: &HostKey,
    device: &str,
    req_id: &str,
    now: i64,
) -> Result<NewInvite, CredError> {
    let window = now.div_euclid(60_000) * 60_000;
    let scope = format!("account:{}", host.user_id);
    let token = random_b64u32();
    let hash = token_hash(&token);
    let expires_at = now + limits::INVITE_TTL_MS;
    let invalidated_offers = transaction!(db, "invite-create", |tx| {
        let row = tx
            .query_opt(
                "INSERT INTO relay_rate_windows (scope, kind, window_start, count) VALUES ($1, 'invite-mint', $2, 1) \
                 ON CONFLICT (scope, kind, window_start) DO UPDATE SET count = relay_rate_windows.count + 1 \
                 RETURNING count",
                params![scope.as_str(), window],
            )
            .await?;
        if row.map(|r| r.i64(0)).unwrap_or(0) > limits::INVITE_MINT_PER_MINUTE {
            return Err(CredError::Code("rate_limit_exceeded"));
        }
        let offers = invalidate_device_invites(tx, host, device, now).await?;
        tx.execute(
            "INSERT INTO relay_invites (token_hash, user_id, relay_host_id, relay_device_id, state, attempt_count, \
             max_attempts, expires_at, offer_req_id, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 'available', 0, $5, $6, $7, $8, $8)",
            params![hash.as_str(), host.user_id.as_str(), host.relay_host_id.as_str(), device,
                limits::INVITE_MAX_ATTEMPTS, expires_at, req_id, now],
        )
        .await?;
        audit(
            tx,
            "invite-created",
            host,
            device,
            json!({"expiresAt": expires_at}),
            now,
        )
        .await?;
        Ok::<_, CredError>(offers)
    })?;
    Ok(NewInvite {
        token,
        expires_at,
        invalidated_offers,
    })
}

/// What a phone credential resolves to (resolve).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    Invite {
        hash: String,
        user_id: String,
        device: String,
    },
    Resume {
        user_id: String,
        device: String,
        version: i64,
        /// `current` or `grace`.
        accepted_as: &'static str,
        current_expires_at: i64,
        grace_expires_at: Option<i64>,
    },
}

impl Resolved {
    pub fn user_id(&self) -> &str {
        match self {
            Resolved::Invite { user_id, .. } | Resolved::Resume { user_id, .. } => user_id,
        }
    }
    pub fn device(&self) -> &str {
        match self {
            Resolved::Invite { device, .. } | Resolved::Resume { device, .. } => device,
        }
    }
}

/// Resolves `token` for `relay_host_id`: as a resume token first, else as an invite. Unknown,
/// consumed, expired, revoked or exhausted credentials resolve to `None`.
pub async fn resolve(
    db: &Db,
    relay_host_id: &str,
    token: &str,
    now: i64,
) -> Result<Option<Resolved>, DbError> {
    if let Some(r) = resolve_resume(db, relay_host_id, token, now).await? {
        return Ok(Some(r));
    }
    let hash = token_hash(token);
    let row = db
        .query(
            "SELECT user_id, relay_device_id, token_hash FROM relay_invites WHERE token_hash = $1 AND relay_host_id = $2 \
             AND state IN ('available', 'reserved', 'cooldown') AND attempt_count < max_attempts AND expires_at > $3",
            params![hash.as_str(), relay_host_id, now],
        )
        .await?;
    Ok(row
        .first()
        .filter(|r| ct_eq_str(&r.str(2), &hash))
        .map(|r| Resolved::Invite {
            hash: r.str(2),
            user_id: r.str(0),
            device: r.str(1),
        }))
}

/// Resolves `token` as a resume token of `relay_host_id` only (current or, within its grace, the
/// previous one); the lowest `userId` wins if two users' devices ever shared a token.
pub async fn resolve_resume(
    db: &Db,
    relay_host_id: &str,
    token: &str,
    now: i64,
) -> Result<Option<Resolved>, DbError> {
    let hash = token_hash(token);
    let rows = db
        .query(
            "SELECT user_id, relay_device_id, current_hash, current_version, current_expires_at, grace_hash, \
             grace_version, grace_expires_at FROM relay_devices \
             WHERE relay_host_id = $1 AND (current_hash = $2 OR grace_hash = $2) AND revoked_at IS NULL \
             ORDER BY user_id, relay_device_id",
            params![relay_host_id, hash.as_str()],
        )
        .await?;
    for r in &rows {
        let grace_expires = r.opt_i64(7);
        if ct_eq_str(&r.str(2), &hash) && r.i64(4) > now {
            return Ok(Some(Resolved::Resume {
                user_id: r.str(0),
                device: r.str(1),
                version: r.i64(3),
                accepted_as: "current",
                current_expires_at: r.i64(4),
                grace_expires_at: grace_expires,
            }));
        }
        if r.opt_str(5).is_some_and(|g| ct_eq_str(&g, &hash))
            && grace_expires.is_some_and(|g| g > now)
        {
            return Ok(Some(Resolved::Resume {
                user_id: r.str(0),
                device: r.str(1),
                version: r.opt_i64(6).unwrap_or(0),
                accepted_as: "grace",
                current_expires_at: r.i64(4),
                grace_expires_at: grace_expires,
            }));
        }
    }
    Ok(None)
}

/// A held invite reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub id: String,
    pub lease_expires_at: i64,
}

/// Reserve: `available`, or `cooldown` past its time, with attempts < max → `reserved`,
/// attempts + 1, lease = min(expiresAt, now + 15 000). A lapsed reservation turns `cooldown`.
pub async fn reserve_invite(db: &Db, hash: &str, now: i64) -> Result<Option<Reservation>, DbError> {
    transaction!(db, "invite-reserve", |tx| {
        let Some(r) = tx
            .query_opt(
                "SELECT state, attempt_count, max_attempts, expires_at, reservation_expires_at, cooldown_until \
                 FROM relay_invites WHERE token_hash = $1 FOR UPDATE",
                params![hash],
            )
            .await?
        else {
            return Ok(None);
        };
        let (state, attempts, max, expires) = (r.str(0), r.i64(1), r.i64(2), r.i64(3));
        if expires <= now {
            tx.execute(
                "UPDATE relay_invites SET state = 'expired', updated_at = $2 WHERE token_hash = $1 \
                 AND state IN ('available', 'reserved', 'cooldown')",
                params![hash, now],
            )
            .await?;
            return Ok(None);
        }
        if state == "reserved" {
            if r.opt_i64(4).is_some_and(|l| l <= now) {
                tx.execute(
                    "UPDATE relay_invites SET state = 'cooldown', reservation_id = NULL, cooldown_until = $2, \
                     updated_at = $3 WHERE token_hash = $1",
                    params![hash, now + limits::INVITE_COOLDOWN_MS, now],
                )
                .await?;
            }
            return Ok(None);
        }
        let ready =
            state == "available" || (state == "cooldown" && r.opt_i64(5).is_none_or(|c| c <= now));
        if !ready || attempts >= max {
            return Ok(None);
        }
        let id = uuid();
        let lease = expires.min(now + limits::INVITE_RESERVATION_LEASE_MS);
        tx.execute(
            "UPDATE relay_invites SET state = 'reserved', attempt_count = attempt_count + 1, reservation_id = $2, \
             reservation_expires_at = $3, cooldown_until = NULL, updated_at = $4 WHERE token_hash = $1",
            params![hash, id.as_str(), lease, now],
        )
        .await?;
        Ok::<_, DbError>(Some(Reservation {
            id,
            lease_expires_at: lease,
        }))
    })
}

/// Fail: a failure after reservation while still reserved under `reservation_id`:
/// attempts ≥ 5 → `invalidated` (returns its offer `reqId`), else `cooldown` for 2 000 ms.
pub async fn fail_invite(
    db: &Db,
    hash: &str,
    reservation_id: &str,
    now: i64,
) -> Result<Option<String>, DbError> {
    transaction!(db, "invite-fail", |tx| {
        let Some(r) = tx
            .query_opt(
                "SELECT attempt_count, max_attempts, offer_req_id FROM relay_invites \
                 WHERE token_hash = $1 AND state = 'reserved' AND reservation_id = $2 FOR UPDATE",
                params![hash, reservation_id],
            )
            .await?
        else {
            return Ok(None);
        };
        if r.i64(0) >= r.i64(1) {
            tx.execute(
                "UPDATE relay_invites SET state = 'invalidated', reservation_id = NULL, updated_at = $2 WHERE token_hash = $1",
                params![hash, now],
            )
            .await?;
            return Ok(r.opt_str(2));
        }
        tx.execute(
            "UPDATE relay_invites SET state = 'cooldown', reservation_id = NULL, cooldown_until = $2, updated_at = $3 \
             WHERE token_hash = $1",
            params![hash, now + limits::INVITE_COOLDOWN_MS, now],
        )
        .await?;
        Ok::<_, DbError>(None)
    })
}

/// A connection basis (step 4): what a later install or confirmation may rely on.
#[derive(Debug, Clone)]
pub struct Basis {
    pub conn_id: String,
    pub host: HostKey,
    pub device: String,
    pub generation: i64,
    /// `invite` or `resume`.
    pub kind: &'static str,
    pub invite_hash: Option<String>,
    pub accepted_version: Option<i64>,
    pub accepted_as: Option<&'static str>,
    pub deadline: i64,
}

pub async fn persist_basis(db: &Db, b: &Basis, now: i64) -> Result<(), DbError> {
    db.execute(
        "INSERT INTO relay_connection_bases (basis_conn_id, user_id, relay_host_id, relay_device_id, \
         owning_control_generation, credential_kind, invite_token_hash, accepted_credential_version, accepted_as, \
         deadline, active, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        params![b.conn_id.as_str(), b.host.user_id.as_str(), b.host.relay_host_id.as_str(), b.device.as_str(),
            b.generation, b.kind, b.invite_hash.clone(), b.accepted_version, b.accepted_as, b.deadline, true, now],
    )
    .await?;
    Ok(())
}

/// The splice ended (or attachment failed): the basis no longer authorises anything.
pub async fn deactivate_basis(db: &Db, conn_id: &str) -> Result<(), DbError> {
    db.execute(
        "UPDATE relay_connection_bases SET active = $2 WHERE basis_conn_id = $1",
        params![conn_id, false],
    )
    .await?;
    Ok(())
}

/// `device-credential-install` authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallAuth {
    RelayBasis { basis_conn_id: String },
    AuthenticatedDirect { direct_auth_id: String },
}

#[derive(Debug, Clone)]
pub struct InstallRequest {
    pub req_id: String,
    pub device: String,
    pub new_hash: String,
    pub expected_current_hash: Option<String>,
    pub auth: InstallAuth,
}

/// The outcome of an install: the result object (without `type`) and the offer `reqId`s of
/// invites it ended.
#[derive(Debug, Clone)]
pub struct Installed {
    pub result: Json,
    pub ended_offers: Vec<String>,
}

/// `device-credential-install` (steps 1–6). `session_active`: the session is `active` (an
/// `authenticated-direct` install needs it).
pub async fn install(
    db: &Db,
    host: &HostKey,
    req: &InstallRequest,
    generation: i64,
    session_active: bool,
    now: i64,
) -> Result<Installed, CredError> {
    transaction!(db, "credential-install", |tx| {
        install_tx(tx, host, req, generation, session_active, now).await
    })
}

/// One install: a repeated request answers its recorded result; otherwise the authorization is
/// checked (and a direct one recorded), the device's credential rotated, the offers it ends
/// closed, direct authorizations consumed, and the result recorded and audited.
async fn install_tx(
    tx: &mut Tx,
    host: &HostKey,
    req: &InstallRequest,
    generation: i64,
    session_active: bool,
    now: i64,
) -> Result<Installed, CredError> {
    let (u, h, d) = (
        host.user_id.as_str(),
        host.relay_host_id.as_str(),
        req.device.as_str(),
    );
    if let Some(result) = recorded_install(tx, host, req).await? {
        return Ok(Installed {
            result,
            ended_offers: Vec::new(),
        });
    }
    let (mode, invite_hash) = match &req.auth {
        InstallAuth::RelayBasis { basis_conn_id } => {
            let hash = relay_basis_invite(tx, host, d, basis_conn_id, generation, now).await?;
            ("relay-basis", Some(hash))
        }
        InstallAuth::AuthenticatedDirect { direct_auth_id } => {
            if !session_active {
                return Err(CredError::Code("authorization_expired"));
            }
            record_direct_authorization(tx, host, d, direct_auth_id, generation, now).await?;
            ("authenticated-direct", None)
        }
    };
    let rotated = rotate_device_credential(tx, host, req, now).await?;
    let ended_offers = match invite_hash {
        Some(hash) => consume_invite(tx, &hash, now).await?,
        None => invalidate_device_invites(tx, host, d, now).await?,
    };
    tx.execute(
        "UPDATE relay_direct_authorizations SET consumed_at = $4 WHERE user_id = $1 AND relay_host_id = $2 \
         AND relay_device_id = $3 AND consumed_at IS NULL",
        params![u, h, d, now],
    )
    .await?;
    let result = install_result(&req.req_id, mode, rotated);
    tx.execute(
        "INSERT INTO relay_install_results (user_id, relay_host_id, relay_device_id, req_id, result_json, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        params![u, h, d, req.req_id.as_str(), result.to_string(), now],
    )
    .await?;
    audit(
        tx,
        "credential-installed",
        host,
        d,
        json!({"mode": mode, "currentVersion": rotated.version}),
        now,
    )
    .await?;
    Ok(Installed {
        result,
        ended_offers,
    })
}

/// The recorded result of this install request, when it already ran (installs are idempotent by
/// request id).
async fn recorded_install(
    tx: &mut Tx,
    host: &HostKey,
    req: &InstallRequest,
) -> Result<Option<Json>, CredError> {
    let Some(r) = tx
        .query_opt(
            "SELECT result_json FROM relay_install_results WHERE user_id = $1 AND relay_host_id = $2 \
             AND relay_device_id = $3 AND req_id = $4",
            params![
                host.user_id.as_str(),
                host.relay_host_id.as_str(),
                req.device.as_str(),
                req.req_id.as_str()
            ],
        )
        .await?
    else {
        return Ok(None);
    };
    let result = serde_json::from_str(&r.str(0)).map_err(|e| DbError::Fatal(e.to_string()))?;
    Ok(Some(result))
}

/// A relay-basis authorization: the active invite basis of this device and control generation,
/// not past its deadline; returns its invite's token hash.
async fn relay_basis_invite(
    tx: &mut Tx,
    host: &HostKey,
    device: &str,
    basis_conn_id: &str,
    generation: i64,
    now: i64,
) -> Result<String, CredError> {
    let (u, h) = (host.user_id.as_str(), host.relay_host_id.as_str());
    let basis = tx
        .query_opt(
            "SELECT invite_token_hash FROM relay_connection_bases WHERE basis_conn_id = $1 AND user_id = $2 \
             AND relay_host_id = $3 AND relay_device_id = $4 AND credential_kind = 'invite' \
             AND owning_control_generation = $5 AND active = $6 AND deadline >= $7",
            params![basis_conn_id, u, h, device, generation, true, now],
        )
        .await?;
    basis
        .and_then(|b| b.opt_str(0))
        .ok_or(CredError::Code("invalid_relay_basis"))
}

/// An authenticated-direct authorization is used once: a seen id is refused, a new one recorded.
async fn record_direct_authorization(
    tx: &mut Tx,
    host: &HostKey,
    device: &str,
    direct_auth_id: &str,
    generation: i64,
    now: i64,
) -> Result<(), CredError> {
    let (u, h) = (host.user_id.as_str(), host.relay_host_id.as_str());
    let seen = tx
        .query_opt(
            "SELECT 1 FROM relay_direct_authorizations WHERE direct_auth_id = $1",
            params![direct_auth_id],
        )
        .await?;
    if seen.is_some() {
        return Err(CredError::Code("invalid_direct_authorization"));
    }
    tx.execute(
        "INSERT INTO relay_direct_authorizations (direct_auth_id, user_id, relay_host_id, relay_device_id, \
         owning_control_generation, deadline, consumed_at) VALUES ($1, $2, $3, $4, $5, $6, NULL)",
        params![direct_auth_id, u, h, device, generation, now + limits::RESUME_BASIS_DEADLINE_MS],
    )
    .await?;
    Ok(())
}

/// A device credential after its rotation.
#[derive(Debug, Clone, Copy)]
struct Rotated {
    version: i64,
    current_expires: i64,
    grace_expires: Option<i64>,
}

/// Rotates the device's resume credential (row locked): the current hash becomes the grace one
/// and the new hash current at the next version; a first install starts at version 1 without
/// grace. An expected current hash must match, compared in constant time.
async fn rotate_device_credential(
    tx: &mut Tx,
    host: &HostKey,
    req: &InstallRequest,
    now: i64,
) -> Result<Rotated, CredError> {
    let (u, h, d) = (
        host.user_id.as_str(),
        host.relay_host_id.as_str(),
        req.device.as_str(),
    );
    let device = tx
        .query_opt(
            "SELECT current_hash, current_version, current_expires_at FROM relay_devices \
             WHERE user_id = $1 AND relay_host_id = $2 AND relay_device_id = $3 FOR UPDATE",
            params![u, h, d],
        )
        .await?;
    if let Some(expected) = &req.expected_current_hash {
        let matches = device
            .as_ref()
            .is_some_and(|r| ct_eq_str(&r.str(0), expected));
        if !matches {
            return Err(CredError::Code("current_hash_mismatch"));
        }
    }
    let current_expires = now + limits::RESUME_TTL_MS;
    let (version, grace_expires) = match &device {
        Some(r) => {
            let version = r.i64(1) + 1;
            let grace_expires = now + limits::RESUME_GRACE_MS;
            tx.execute(
                "UPDATE relay_devices SET grace_hash = current_hash, grace_version = current_version, \
                 grace_expires_at = $4, current_hash = $5, current_version = $6, current_expires_at = $7, \
                 revoked_at = NULL, updated_at = $8 WHERE user_id = $1 AND relay_host_id = $2 AND relay_device_id = $3",
                params![u, h, d, grace_expires, req.new_hash.as_str(), version, current_expires, now],
            )
            .await?;
            (version, Some(grace_expires))
        }
        None => {
            tx.execute(
                "INSERT INTO relay_devices (user_id, relay_host_id, relay_device_id, current_hash, current_version, \
                 current_expires_at, created_at, updated_at) VALUES ($1, $2, $3, $4, 1, $5, $6, $6)",
                params![u, h, d, req.new_hash.as_str(), current_expires, now],
            )
            .await?;
            (1, None)
        }
    };
    Ok(Rotated {
        version,
        current_expires,
        grace_expires,
    })
}

/// Marks the basis invite consumed; returns the offer request ids it ends.
async fn consume_invite(tx: &mut Tx, hash: &str, now: i64) -> Result<Vec<String>, CredError> {
    let rows = tx
        .query(
            "UPDATE relay_invites SET state = 'consumed', reservation_id = NULL, updated_at = $2 \
             WHERE token_hash = $1 RETURNING offer_req_id",
            params![hash, now],
        )
        .await?;
    Ok(rows.iter().filter_map(|r| r.opt_str(0)).collect())
}

/// The install's result body (recorded, and answered to a repeated request).
fn install_result(req_id: &str, mode: &str, rotated: Rotated) -> Json {
    let mut result = json!({
        "v": 1,
        "reqId": req_id,
        "authorizationMode": mode,
        "currentVersion": rotated.version,
        "resumeExpiresAt": rotated.current_expires,
    });
    if let Some(g) = rotated.grace_expires {
        result["graceExpiresAt"] = json!(g);
    }
    result
}

/// `device-credential-install-status`: the stored result, if any.
pub async fn install_status(
    db: &Db,
    host: &HostKey,
    device: &str,
    req_id: &str,
) -> Result<Option<Json>, DbError> {
    let rows = db
        .query(
            "SELECT result_json FROM relay_install_results WHERE user_id = $1 AND relay_host_id = $2 \
             AND relay_device_id = $3 AND req_id = $4",
            params![host.user_id.as_str(), host.relay_host_id.as_str(), device, req_id],
        )
        .await?;
    match rows.first() {
        Some(r) => serde_json::from_str(&r.str(0))
            .map(Some)
            .map_err(|e| DbError::Fatal(e.to_string())),
        None => Ok(None),
    }
}

/// `device-resume-confirm`. Returns the result object (without `type`).
pub async fn confirm(
    db: &Db,
    host: &HostKey,
    req_id: &str,
    basis_conn_id: &str,
    generation: i64,
    now: i64,
) -> Result<Json, CredError> {
    transaction!(db, "resume-confirm", |tx| {
        confirm_tx(tx, host, (req_id, basis_conn_id), generation, now).await
    })
}

/// One confirmation: a repeated request answers its recorded result (for the same basis only);
/// otherwise the active resume basis of this control generation, the device's credential
/// verdict, a renewal of the current credential, and the result recorded and audited.
async fn confirm_tx(
    tx: &mut Tx,
    host: &HostKey,
    (req_id, basis_conn_id): (&str, &str),
    generation: i64,
    now: i64,
) -> Result<Json, CredError> {
    let (u, h) = (host.user_id.as_str(), host.relay_host_id.as_str());
    if let Some(result) = recorded_confirm(tx, host, req_id, basis_conn_id).await? {
        return Ok(result);
    }
    let Some(b) = tx
        .query_opt(
            "SELECT relay_device_id, accepted_credential_version, accepted_as FROM relay_connection_bases \
             WHERE basis_conn_id = $1 AND user_id = $2 AND relay_host_id = $3 AND credential_kind = 'resume' \
             AND owning_control_generation = $4 AND active = $5 AND deadline >= $6",
            params![basis_conn_id, u, h, generation, true, now],
        )
        .await?
    else {
        return Err(CredError::Code("confirmation_not_active"));
    };
    let (device, accepted_version, accepted_as) = (
        b.str(0),
        b.opt_i64(1).unwrap_or(0),
        b.opt_str(2).unwrap_or_default(),
    );
    let Some(d) = tx
        .query_opt(
            "SELECT current_version, current_expires_at, grace_version, grace_expires_at, revoked_at \
             FROM relay_devices WHERE user_id = $1 AND relay_host_id = $2 AND relay_device_id = $3 FOR UPDATE",
            params![u, h, device.as_str()],
        )
        .await?
    else {
        return Err(CredError::Code("credential_not_found"));
    };
    let held = HeldCredential {
        current: (d.i64(0), d.i64(1)),
        grace: (d.opt_i64(2), d.opt_i64(3)),
        revoked: !d.is_null(4),
    };
    let renewed = resume_verdict(&held, accepted_version, now).map_err(CredError::Code)?;
    let (cur_v, mut cur_exp) = held.current;
    if renewed {
        cur_exp = now + limits::RESUME_TTL_MS;
        tx.execute(
            "UPDATE relay_devices SET current_expires_at = $4, updated_at = $5 WHERE user_id = $1 \
             AND relay_host_id = $2 AND relay_device_id = $3",
            params![u, h, device.as_str(), cur_exp, now],
        )
        .await?;
    }
    let result = confirm_result(req_id, &accepted_as, renewed, (cur_v, cur_exp), held.grace);
    tx.execute(
        "INSERT INTO relay_confirm_results (user_id, relay_host_id, req_id, basis_conn_id, result_json, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        params![u, h, req_id, basis_conn_id, result.to_string(), now],
    )
    .await?;
    audit(
        tx,
        "resume-confirmed",
        host,
        &device,
        json!({"renewed": renewed, "currentVersion": cur_v}),
        now,
    )
    .await?;
    Ok(result)
}

/// The recorded result of this confirmation request, when it already ran; the same request id
/// for another basis is refused.
async fn recorded_confirm(
    tx: &mut Tx,
    host: &HostKey,
    req_id: &str,
    basis_conn_id: &str,
) -> Result<Option<Json>, CredError> {
    let (u, h) = (host.user_id.as_str(), host.relay_host_id.as_str());
    let Some(r) = tx
        .query_opt(
            "SELECT basis_conn_id, result_json FROM relay_confirm_results WHERE user_id = $1 AND relay_host_id = $2 \
             AND req_id = $3",
            params![u, h, req_id],
        )
        .await?
    else {
        return Ok(None);
    };
    if r.str(0) != basis_conn_id {
        return Err(CredError::Code("confirmation_tuple_mismatch"));
    }
    serde_json::from_str(&r.str(1))
        .map(Some)
        .map_err(|e| CredError::Db(DbError::Fatal(e.to_string())))
}

/// The confirmation's result body (recorded, and answered to a repeated request); the grace
/// expiry only while a grace credential exists.
fn confirm_result(
    req_id: &str,
    accepted_as: &str,
    renewed: bool,
    (cur_v, cur_exp): (i64, i64),
    (grace_v, grace_exp): (Option<i64>, Option<i64>),
) -> Json {
    let mut result = json!({
        "v": 1,
        "reqId": req_id,
        "currentVersion": cur_v,
        "acceptedAs": accepted_as,
        "renewed": renewed,
        "resumeExpiresAt": cur_exp,
    });
    if let Some(g) = grace_exp.filter(|_| grace_v.is_some()) {
        result["graceExpiresAt"] = json!(g);
    }
    result
}

/// A device's stored resume credentials: current and grace `(version, expires at)`, revoked.
struct HeldCredential {
    current: (i64, i64),
    grace: (Option<i64>, Option<i64>),
    revoked: bool,
}

/// Whether the accepted credential version still confirms: the current one renews (`Ok(true)`),
/// the grace one confirms without renewing (`Ok(false)`); a revoked device, an expired version
/// or a retired one is refused with its code.
fn resume_verdict(
    held: &HeldCredential,
    accepted_version: i64,
    now: i64,
) -> Result<bool, &'static str> {
    let (cur_v, cur_exp) = held.current;
    let (grace_v, grace_exp) = held.grace;
    if held.revoked {
        Err("reject-revoked")
    } else if accepted_version == cur_v {
        if cur_exp <= now {
            return Err("reject-expired");
        }
        Ok(true)
    } else if Some(accepted_version) == grace_v {
        if grace_exp.is_none_or(|g| g <= now) {
            return Err("reject-expired");
        }
        Ok(false)
    } else {
        Err("reject-retired")
    }
}

/// `device-revoke`: sets `revoked_at`, invalidates every invite of the device (returns their offer
/// `reqId`s), audits. An unknown device is fine.
pub async fn revoke(
    db: &Db,
    host: &HostKey,
    device: &str,
    now: i64,
) -> Result<Vec<String>, DbError> {
    transaction!(db, "device-revoke", |tx| {
        tx.execute(
            "UPDATE relay_devices SET revoked_at = $4, updated_at = $4 WHERE user_id = $1 AND relay_host_id = $2 \
             AND relay_device_id = $3",
            params![host.user_id.as_str(), host.relay_host_id.as_str(), device, now],
        )
        .await?;
        let offers = invalidate_device_invites(tx, host, device, now).await?;
        audit(tx, "device-revoked", host, device, json!({}), now).await?;
        Ok::<_, DbError>(offers)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::backends;

    fn host() -> HostKey {
        HostKey {
            user_id: "u1".into(),
            relay_host_id: "abcdefghijklmnop".into(),
        }
    }

    #[test]
    fn resume_verdicts() {
        let held = HeldCredential {
            current: (3, 100),
            grace: (Some(2), Some(50)),
            revoked: false,
        };
        assert_eq!(resume_verdict(&held, 3, 10), Ok(true), "current renews");
        assert_eq!(resume_verdict(&held, 2, 10), Ok(false), "grace confirms");
        assert_eq!(resume_verdict(&held, 2, 50), Err("reject-expired"));
        assert_eq!(resume_verdict(&held, 3, 100), Err("reject-expired"));
        assert_eq!(resume_verdict(&held, 1, 10), Err("reject-retired"));
        let revoked = HeldCredential {
            revoked: true,
            ..held
        };
        assert_eq!(resume_verdict(&revoked, 3, 10), Err("reject-revoked"));
        let no_grace = HeldCredential {
            current: (3, 100),
            grace: (Some(2), None),
            revoked: false,
        };
        assert_eq!(resume_verdict(&no_grace, 2, 10), Err("reject-expired"));
    }

    #[test]
    fn install_result_carries_grace_only_after_a_rotation() {
        let first = Rotated {
            version: 1,
            current_expires: 10,
            grace_expires: None,
        };
        let v = install_result("r1", "relay-basis", first);
        assert_eq!(
            v,
            json!({"v": 1, "reqId": "r1", "authorizationMode": "relay-basis",
                   "currentVersion": 1, "resumeExpiresAt": 10})
        );
        let next = Rotated {
            version: 2,
            current_expires: 20,
            grace_expires: Some(15),
        };
        assert_eq!(
            install_result("r2", "authenticated-direct", next)["graceExpiresAt"],
            15
        );
    }

    #[tokio::test]
    async fn invite_lifecycle_on_both_backends() {
        for t in backends().await {
            let db = &t.db;
            let now = 1_700_000_000_000;
            let h = host();
            let a = create_invite(db, &h, "d1", "r1", now).await.unwrap();
            assert_eq!(a.expires_at, now + limits::INVITE_TTL_MS);
            let hash = match resolve(db, &h.relay_host_id, &a.token, now).await.unwrap() {
                Some(Resolved::Invite {
                    hash,
                    user_id,
                    device,
                }) => {
                    assert_eq!((user_id.as_str(), device.as_str()), ("u1", "d1"));
                    hash
                }
                other => panic!("{other:?}"),
            };
            assert_eq!(
                resolve(db, "zzzzzzzzzzzzzzzz", &a.token, now)
                    .await
                    .unwrap(),
                None
            );
            // Reserve, a second reserve fails while held, fail → cooldown 2 s.
            let r = reserve_invite(db, &hash, now).await.unwrap().unwrap();
            assert_eq!(r.lease_expires_at, now + 15_000);
            assert!(reserve_invite(db, &hash, now).await.unwrap().is_none());
            assert_eq!(fail_invite(db, &hash, &r.id, now).await.unwrap(), None);
            assert!(reserve_invite(db, &hash, now + 1_999)
                .await
                .unwrap()
                .is_none());
            let mut t0 = now + 2_000;
            for attempt in 2..=5 {
                let r = reserve_invite(db, &hash, t0).await.unwrap().unwrap();
                let ended = fail_invite(db, &hash, &r.id, t0).await.unwrap();
                if attempt == 5 {
                    assert_eq!(ended.as_deref(), Some("r1"), "5th failure invalidates");
                }
                t0 += 2_000;
            }
            assert_eq!(
                resolve(db, &h.relay_host_id, &a.token, t0).await.unwrap(),
                None
            );
            // A newer invite invalidates the older one.
            let b = create_invite(db, &h, "d2", "r2", now).await.unwrap();
            let c = create_invite(db, &h, "d2", "r3", now).await.unwrap();
            assert_eq!(c.invalidated_offers, vec!["r2".to_string()]);
            assert_eq!(
                resolve(db, &h.relay_host_id, &b.token, now).await.unwrap(),
                None
            );
            assert!(resolve(db, &h.relay_host_id, &c.token, now)
                .await
                .unwrap()
                .is_some());
            // Expiry.
            assert_eq!(
                resolve(db, &h.relay_host_id, &c.token, now + limits::INVITE_TTL_MS)
                    .await
                    .unwrap(),
                None
            );
        }
    }

    #[tokio::test]
    async fn mint_rate_30_per_minute() {
        for t in backends().await {
            let h = host();
            let now = 1_700_000_040_000;
            for i in 0..30 {
                create_invite(&t.db, &h, "d", &format!("r{i}"), now + i)
                    .await
                    .unwrap();
            }
            let e = create_invite(&t.db, &h, "d", "r31", now + 59_999)
                .await
                .unwrap_err();
            assert_eq!(e.code(), "rate_limit_exceeded");
            create_invite(&t.db, &h, "d", "r32", now + 60_000)
                .await
                .unwrap();
        }
    }

    async fn basis(
        db: &Db,
        conn: &str,
        kind: &'static str,
        hash: Option<String>,
        v: Option<i64>,
        as_: Option<&'static str>,
        now: i64,
    ) {
        persist_basis(
            db,
            &Basis {
                conn_id: conn.into(),
                host: host(),
                device: "d1".into(),
                generation: 1,
                kind,
                invite_hash: hash,
                accepted_version: v,
                accepted_as: as_,
                deadline: now + 30_000,
            },
            now,
        )
        .await
        .unwrap();
    }

    /// P-17..P-21 at the store level.
    #[tokio::test]
    async fn install_confirm_revoke_on_both_backends() {
        for t in backends().await {
            let db = &t.db;
            let h = host();
            let now = 1_700_000_000_000;
            let inv = create_invite(db, &h, "d1", "offer", now).await.unwrap();
            let ihash = token_hash(&inv.token);
            basis(db, "b1", "invite", Some(ihash.clone()), None, None, now).await;
            let r1 = random_b64u32();
            let req = InstallRequest {
                req_id: "i1".into(),
                device: "d1".into(),
                new_hash: token_hash(&r1),
                expected_current_hash: None,
                auth: InstallAuth::RelayBasis {
                    basis_conn_id: "b1".into(),
                },
            };
            let a = install(db, &h, &req, 1, true, now).await.unwrap();
            assert_eq!(a.result["currentVersion"], 1);
            assert_eq!(a.result["authorizationMode"], "relay-basis");
            assert_eq!(a.result["resumeExpiresAt"], now + 2_592_000_000);
            assert!(a.result.get("graceExpiresAt").is_none());
            assert_eq!(a.ended_offers, vec!["offer".to_string()]);
            let again = install(db, &h, &req, 1, true, now + 5).await.unwrap();
            assert_eq!(again.result, a.result);
            assert_eq!(
                install_status(db, &h, "d1", "i1").await.unwrap(),
                Some(a.result.clone())
            );
            assert_eq!(install_status(db, &h, "d1", "i9").await.unwrap(), None);
            assert_eq!(
                resolve(db, &h.relay_host_id, &inv.token, now)
                    .await
                    .unwrap(),
                None,
                "consumed"
            );
            // Resume with R1.
            match resolve(db, &h.relay_host_id, &r1, now).await.unwrap() {
                Some(Resolved::Resume {
                    version: 1,
                    accepted_as: "current",
                    ..
                }) => {}
                other => panic!("{other:?}"),
            }
            basis(db, "b2", "resume", None, Some(1), Some("current"), now).await;
            let c = confirm(db, &h, "c1", "b2", 1, now + 10).await.unwrap();
            assert_eq!(c["renewed"], true);
            assert_eq!(c["acceptedAs"], "current");
            assert_eq!(confirm(db, &h, "c1", "b2", 1, now + 20).await.unwrap(), c);
            assert_eq!(
                confirm(db, &h, "c1", "bX", 1, now)
                    .await
                    .unwrap_err()
                    .code(),
                "confirmation_tuple_mismatch"
            );
            deactivate_basis(db, "b2").await.unwrap();
            assert_eq!(
                confirm(db, &h, "c2", "b2", 1, now)
                    .await
                    .unwrap_err()
                    .code(),
                "confirmation_not_active"
            );
            // Direct install rotates R1 to grace.
            let r2 = random_b64u32();
            let mut d = InstallRequest {
                req_id: "i2".into(),
                device: "d1".into(),
                new_hash: token_hash(&r2),
                expected_current_hash: Some(token_hash(&random_b64u32())),
                auth: InstallAuth::AuthenticatedDirect {
                    direct_auth_id: "x1".into(),
                },
            };
            assert_eq!(
                install(db, &h, &d, 1, true, now).await.unwrap_err().code(),
                "current_hash_mismatch"
            );
            d.expected_current_hash = Some(token_hash(&r1));
            assert_eq!(
                install(db, &h, &d, 1, false, now).await.unwrap_err().code(),
                "authorization_expired"
            );
            let b = install(db, &h, &d, 1, true, now).await.unwrap();
            assert_eq!(b.result["currentVersion"], 2);
            assert_eq!(b.result["graceExpiresAt"], now + 86_400_000);
            d.req_id = "i3".into();
            assert_eq!(
                install(db, &h, &d, 1, true, now).await.unwrap_err().code(),
                "invalid_direct_authorization"
            );
            match resolve(db, &h.relay_host_id, &r1, now).await.unwrap() {
                Some(Resolved::Resume {
                    version: 1,
                    accepted_as: "grace",
                    ..
                }) => {}
                other => panic!("{other:?}"),
            }
            basis(db, "b3", "resume", None, Some(1), Some("grace"), now).await;
            let g = confirm(db, &h, "c3", "b3", 1, now).await.unwrap();
            assert_eq!(g["renewed"], false);
            assert_eq!(g["acceptedAs"], "grace");
            // Revoke.
            revoke(db, &h, "d1", now).await.unwrap();
            revoke(db, &h, "unknown", now).await.unwrap();
            assert_eq!(resolve(db, &h.relay_host_id, &r2, now).await.unwrap(), None);
            // Unknown basis.
            let bad = InstallRequest {
                req_id: "i4".into(),
                device: "d1".into(),
                new_hash: token_hash(&r2),
                expected_current_hash: None,
                auth: InstallAuth::RelayBasis {
                    basis_conn_id: "nope".into(),
                },
            };
            assert_eq!(
                install(db, &h, &bad, 1, true, now)
                    .await
                    .unwrap_err()
                    .code(),
                "invalid_relay_basis"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// `credential-cleanup` primitives (docs/reference/websocket.md); the director's sweep composes them.

/// An invite whose lifetime ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiringInvite {
    pub token_hash: String,
    pub host: crate::model::HostKey,
    /// The request id of its `invite-offer:*` activity, if one was taken.
    pub offer_req_id: Option<String>,
}

/// Up to `limit` unexpired-state invites whose `expires_at` passed.
pub async fn expiring_invites(
    db: &Db,
    now: i64,
    limit: i64,
) -> Result<Vec<ExpiringInvite>, DbError> {
    Ok(db
        .query(
            "SELECT token_hash, user_id, relay_host_id, offer_req_id FROM relay_invites \
             WHERE state IN ('available', 'reserved', 'cooldown') AND expires_at <= $1 LIMIT $2",
            params![now, limit],
        )
        .await?
        .iter()
        .map(|r| ExpiringInvite {
            token_hash: r.str(0),
            host: crate::model::HostKey {
                user_id: r.str(1),
                relay_host_id: r.str(2),
            },
            offer_req_id: r.opt_str(3),
        })
        .collect())
}

/// Marks one invite `expired`; false when another sweep or a consume got there first.
pub async fn expire_invite(db: &Db, token_hash: &str, now: i64) -> Result<bool, DbError> {
    let n = db
        .execute(
            "UPDATE relay_invites SET state = 'expired', updated_at = $2 WHERE token_hash = $1 \
             AND state IN ('available', 'reserved', 'cooldown')",
            params![token_hash, now],
        )
        .await?;
    Ok(n > 0)
}

/// `reserved` invites whose reservation lapsed → `cooldown` until `cooldown_until`.
pub async fn cool_down_lapsed_reservations(
    db: &Db,
    now: i64,
    cooldown_until: i64,
) -> Result<u64, DbError> {
    db.execute(
        "UPDATE relay_invites SET state = 'cooldown', cooldown_until = $2, updated_at = $1 \
         WHERE state = 'reserved' AND reservation_expires_at IS NOT NULL AND reservation_expires_at <= $1",
        params![now, cooldown_until],
    )
    .await
}

/// Active connection bases past their deadline → inactive.
pub async fn deactivate_lapsed_bases(db: &Db, now: i64) -> Result<u64, DbError> {
    db.execute(
        "UPDATE relay_connection_bases SET active = $2 WHERE active = $3 AND deadline < $1",
        params![now, false, true],
    )
    .await
}

/// Unconsumed direct authorizations past their deadline → consumed.
pub async fn consume_lapsed_authorizations(db: &Db, now: i64) -> Result<u64, DbError> {
    db.execute(
        "UPDATE relay_direct_authorizations SET consumed_at = $1 WHERE consumed_at IS NULL AND deadline < $1",
        params![now],
    )
    .await
}

/// Deletes rate windows that started before `before`.
pub async fn delete_rate_windows_before(db: &Db, before: i64) -> Result<u64, DbError> {
    db.execute(
        "DELETE FROM relay_rate_windows WHERE window_start < $1",
        params![before],
    )
    .await
}
