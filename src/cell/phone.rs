//! Phone admission (docs/reference/websocket.md), the host data leg and the splice lifecycle.
//!
//! The phone task owns the phone socket from upgrade to close. After `conn-open` it waits for the
//! data leg: the data task authenticates `host-data-auth`, takes the pending entry and hands its
//! socket over, so one task then owns both sockets and runs the splice.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;

use super::frames::{self, Split};
use super::session::{Attach, ControlOut, DataLeg, Pending, Session, State};
use super::splice;
use super::{Cell, ConnGuard};
use crate::clock::now_ms;
use crate::contract::close::{self, reason};
use crate::contract::limits;
use crate::crypto;
use crate::leg::ws::{self, First, Leg, Ws};
use crate::logging;
use crate::store::assignments::{self as store, ActivityKind, HostKey};
use crate::store::credentials::{self as creds, Resolved};

/// A phone rejection: `relay-hello {ok:false, code}` then close with the same code.
async fn reject(cell: &Cell, ws: &mut Ws, code: u16, r: &'static str) {
    let _ = ws
        .send(Message::text(
            json!({"type":"relay-hello","ok":false,"code":code}).to_string(),
        ))
        .await;
    cell.close_leg(Leg::Phone, ws, code, r).await;
}

/// Everything a phone holds that must be undone if admission fails.
struct Held {
    cell: Arc<Cell>,
    key: Option<HostKey>,
    invite: Option<(String, String)>,
    activity: Option<String>,
    conn_id: Option<String>,
    /// The ledger's reserved unit is still the phone's to release.
    unit: bool,
    /// The idle-work token of the accept: the host is not idle while a phone is admitted.
    idle: Option<super::idle_rehome::IdleToken>,
}

impl Held {
    /// Fails the reservation, releases the activity and the ledger unit.
    async fn undo(&mut self) {
        if let Some((hash, rid)) = self.invite.take() {
            if let Ok(Some(offer)) =
                creds::fail_invite(&self.cell.ctx.db, &hash, &rid, now_ms()).await
            {
                if let Some(k) = &self.key {
                    self.cell
                        .release_activity(k, format!("invite-offer:{offer}"));
                }
            }
        }
        if let (Some(a), Some(k)) = (self.activity.take(), &self.key) {
            self.cell.release_activity(k, a);
        }
        self.release_unit();
    }

    fn release_unit(&mut self) {
        if std::mem::take(&mut self.unit) {
            let id = self.conn_id.clone();
            self.cell.with_ledger(|l| l.release_reserved(id.as_deref()));
        }
    }
}

/// Polls the phone without waiting: `true` if it has closed. A data frame read here is kept in
/// `stash` (at most one; the phone is not read further until the splice starts).
fn phone_gone(ws: &mut Ws, stash: &mut Option<Message>) -> bool {
    if stash.is_some() {
        return false;
    }
    match ws.next().now_or_never() {
        None => false,
        Some(Some(Ok(m @ (Message::Text(_) | Message::Binary(_))))) => {
            *stash = Some(m);
            false
        }
        Some(Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)))) => false,
        Some(_) => true,
    }
}

fn abandoned(key: &HostKey, stage: &str, started: i64) {
    logging::event(
        "orca_relay_client_accept_abandoned",
        json!({"host": logging::digest(&key.relay_host_id), "stage": stage, "elapsedMs": now_ms() - started}),
    );
}

pub async fn run_phone(
    cell: Arc<Cell>,
    mut ws: Ws,
    guard: ConnGuard,
    relay_host_id: String,
    source: String,
) {
    let first = ws::first_frame(&mut ws, Duration::from_millis(limits::FIRST_FRAME_MS)).await;
    cell.preauth().leave(&source);
    let mut held = Held {
        cell: cell.clone(),
        key: None,
        invite: None,
        activity: None,
        conn_id: None,
        unit: cell.ledger.is_some(),
        idle: None,
    };
    let Some(text) = phone_first_text(&cell, &mut ws, first, &mut held).await else {
        return;
    };
    let auth: Option<frames::RelayAuth> = match frames::split(&text) {
        Split::Typed(t, m) if t == "relay-auth" => frames::body(m),
        _ => None,
    };
    let Some(auth) = auth else {
        held.release_unit();
        return reject(
            &cell,
            &mut ws,
            close::BAD_OUTER_CREDENTIAL,
            reason::INVALID_RELAY_AUTH,
        )
        .await;
    };
    match admit(&cell, &mut ws, &mut held, &relay_host_id, &auth.credential).await {
        Ok(Some(job)) => {
            let job = Box::new(SpliceJob {
                phone_guard: Some(guard),
                ..job
            });
            tokio::spawn(run_splice(cell.clone(), Box::new(ws), job));
            return;
        }
        Ok(None) => {}
        Err(Some((code, r))) => {
            held.undo().await;
            reject(&cell, &mut ws, code, r).await;
        }
        Err(None) => held.undo().await,
    }
    drop(guard);
}

/// The phone's first frame as text; anything else closes the phone (a framing violation with
/// its own code) and releases its ledger unit.
async fn phone_first_text(
    cell: &Cell,
    ws: &mut Ws,
    first: First,
    held: &mut Held,
) -> Option<String> {
    match first {
        First::Text(t) => Some(t),
        First::Binary => {
            held.release_unit();
            cell.close_leg(
                Leg::Phone,
                ws,
                close::BAD_OUTER_CREDENTIAL,
                reason::FIRST_FRAME_MUST_BE_TEXT,
            )
            .await;
            None
        }
        First::Timeout => {
            held.release_unit();
            cell.close_leg(
                Leg::Phone,
                ws,
                close::BAD_OUTER_CREDENTIAL,
                reason::FIRST_FRAME_TIMEOUT,
            )
            .await;
            None
        }
        First::Oversize => {
            held.release_unit();
            cell.close_leg(Leg::Phone, ws, close::MESSAGE_TOO_BIG, "message too big")
                .await;
            None
        }
        First::Violation(code) => {
            held.release_unit();
            ws::close(ws, code, ws::violation_reason(code)).await;
            None
        }
        First::Gone => {
            held.release_unit();
            None
        }
    }
}

const REJECTED: &str = reason::RELAY_CONNECTION_REJECTED;

/// A refused admission: `Some` = reject with that close, `None` = the phone is gone.
type Refusal = Option<(u16, &'static str)>;

/// What the admission settled for one phone, handed on to the attach.
struct Admitted {
    key: HostKey,
    resolved: Resolved,
    /// `"invite"` or `"resume"`.
    kind: &'static str,
    /// The reservation's lease expiry.
    lease: i64,
    reserved_at: i64,
}

/// The admission steps in their order, the wait for the data leg, then the attach. Between the
/// steps that spend something the phone is polled, so a phone that left stops the admission.
async fn admit(
    cell: &Arc<Cell>,
    ws: &mut Ws,
    held: &mut Held,
    relay_host_id: &str,
    credential: &str,
) -> Result<Option<SpliceJob>, Refusal> {
    let started = now_ms();
    let mut stash: Option<Message> = None;
    let (resolved, key) = resolve_phone(cell, held, relay_host_id, credential).await?;
    if phone_gone(ws, &mut stash) {
        abandoned(&key, "assignment", started);
        return Err(None);
    }
    // Step 2, before anything is spent: a host that was already sent a drain refuses new phones
    // without reserving the credential (it needs the session key, which step 3 yields).
    let current = cell.registry().get(&key);
    if current.is_some_and(|s| s.lock().drain_sent) {
        return Err(Some((close::DRAINING, REJECTED)));
    }
    let (kind, lease, reserved_at) = reserve_credential(cell, held, &resolved).await?;
    // The credential is reserved (authenticated): the phone leg's own message limit applies.
    ws::authenticated(ws);
    if phone_gone(ws, &mut stash) {
        abandoned(&key, "credential", started);
        return Err(None);
    }
    let (session, sock_id) = live_control(cell, &key)?;
    let conn_id = uuid::Uuid::new_v4().to_string();
    acquire_credential_activity(cell, held, &key, kind, &conn_id).await?;
    if phone_gone(ws, &mut stash) {
        abandoned(&key, "activity", started);
        return Err(None);
    }
    let adm = Admitted {
        key,
        resolved,
        kind,
        lease,
        reserved_at,
    };
    let mut rx = open_pending(cell, held, &session, sock_id, &conn_id, &adm)?;
    cell.counts.pending.fetch_add(1, Ordering::Relaxed);
    let waited = wait_attach(cell, ws, &session, &conn_id, &mut rx, &mut stash).await;
    cell.counts.pending.fetch_sub(1, Ordering::Relaxed);
    cell.registry().pending_owner.remove(&conn_id);
    let leg = match waited {
        Waited::Data(leg) => leg,
        Waited::Reject(code, r) => return Err(Some((code, r))),
        Waited::Gone => {
            abandoned(&adm.key, "attach", started);
            return Err(None);
        }
    };
    Ok(attach(cell, ws, held, &session, conn_id, &adm, *leg, stash).await)
}

/// Step 3: resolves the credential to its host, then step 1 (the idle-work token, kept in
/// `held`) and the host's assignment, which must be this cell.
async fn resolve_phone(
    cell: &Cell,
    held: &mut Held,
    relay_host_id: &str,
    credential: &str,
) -> Result<(Resolved, HostKey), Refusal> {
    let db = &cell.ctx.db;
    let unavailable = Some((close::LIMIT_EXCEEDED, reason::RELAY_TEMPORARILY_UNAVAILABLE));
    let resolved = match creds::resolve(db, relay_host_id, credential, now_ms()).await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(Some((close::WRONG_CELL, REJECTED))),
        Err(_) => return Err(unavailable),
    };
    let key = HostKey {
        user_id: resolved.user_id().to_owned(),
        relay_host_id: relay_host_id.to_owned(),
    };
    held.key = Some(key.clone());
    let Some(idle) = cell.idle_token(&key) else {
        return Err(Some((close::WRONG_CELL, REJECTED)));
    };
    held.idle = Some(idle);
    match store::resolve_assignment(db, &key).await {
        Ok(Some(a)) if a.cell_id == cell.ctx.config.cell_id => Ok((resolved, key)),
        Ok(_) => Err(Some((close::WRONG_CELL, REJECTED))),
        Err(_) => Err(unavailable),
    }
}

/// Step 4: reserves an invite (kept in `held`, failed on undo); a resume needs no reservation.
/// Returns the credential kind, the lease expiry and the reservation time.
async fn reserve_credential(
    cell: &Cell,
    held: &mut Held,
    resolved: &Resolved,
) -> Result<(&'static str, i64, i64), Refusal> {
    let reserved_at = now_ms();
    match resolved {
        Resolved::Invite { hash, .. } => {
            match creds::reserve_invite(&cell.ctx.db, hash, reserved_at).await {
                Ok(Some(r)) => {
                    held.invite = Some((hash.clone(), r.id.clone()));
                    Ok(("invite", r.lease_expires_at, reserved_at))
                }
                Ok(None) => Err(Some((close::BAD_OUTER_CREDENTIAL, REJECTED))),
                Err(_) => Err(Some((
                    close::LIMIT_EXCEEDED,
                    reason::RELAY_TEMPORARILY_UNAVAILABLE,
                ))),
            }
        }
        Resolved::Resume { .. } => Ok((
            "resume",
            reserved_at + limits::ATTACH_DEADLINE_MS as i64,
            reserved_at,
        )),
    }
}

/// Steps 5 and 6 (and step 2 again: a drain may have been sent while reserving): the host's
/// session with an open active control and room for one more connection; returns the session
/// and its control's socket id.
fn live_control(cell: &Cell, key: &HostKey) -> Result<(Arc<Session>, u64), Refusal> {
    let session = cell.registry().get(key);
    let Some(session) = session else {
        return Err(Some(offline(cell, key)));
    };
    let st = session.lock();
    if st.drain_sent {
        return Err(Some((close::DRAINING, REJECTED)));
    }
    let Some(c) = st
        .control
        .as_ref()
        .filter(|_| st.state == State::Active && st.control_open())
    else {
        drop(st);
        return Err(Some(offline(cell, key)));
    };
    if st.load() >= limits::PER_HOST_CONNECTIONS {
        return Err(Some((close::LIMIT_EXCEEDED, REJECTED)));
    }
    let sock_id = c.sock_id;
    drop(st);
    Ok((session, sock_id))
}

/// The activity a phone's credential holds until its splice ends: `invite:<connId>` for an
/// invite, `confirmation:<connId>` for a resume.
fn credential_activity(kind: &str, conn_id: &str) -> (String, ActivityKind) {
    match kind {
        "invite" => (format!("invite:{conn_id}"), ActivityKind::Invite),
        _ => (
            format!("confirmation:{conn_id}"),
            ActivityKind::Confirmation,
        ),
    }
}

/// Step 7: acquires the credential activity (kept in `held`, released on undo).
async fn acquire_credential_activity(
    cell: &Cell,
    held: &mut Held,
    key: &HostKey,
    kind: &'static str,
    conn_id: &str,
) -> Result<(), Refusal> {
    let (activity, activity_kind) = credential_activity(kind, conn_id);
    if store::acquire_activity(
        &cell.ctx.db,
        key,
        &activity,
        activity_kind,
        &cell.ctx.config.cell_id,
        None,
        now_ms(),
    )
    .await
    .is_err()
    {
        return Err(Some((close::LIMIT_EXCEEDED, REJECTED)));
    }
    held.activity = Some(activity);
    Ok(())
}

/// Steps 8 and 9: registers the pending connection (if the session is still the host's, its
/// control the same and open, and there is room) and sends `conn-open` on the control; returns
/// the channel the data leg attaches through.
fn open_pending(
    cell: &Cell,
    held: &mut Held,
    session: &Session,
    sock_id: u64,
    conn_id: &str,
    adm: &Admitted,
) -> Result<oneshot::Receiver<Attach>, Refusal> {
    let ticket = crypto::random_b64u32();
    let (tx, rx) = oneshot::channel();
    // Lock order: registry before session, never the registry while a session is locked.
    let registered = {
        let mut reg = cell.registry();
        let current = reg.get(&adm.key).is_some_and(|s| s.id == session.id);
        if current {
            reg.pending_owner
                .insert(conn_id.to_owned(), adm.key.clone());
        }
        current
    };
    let mut st = session.lock();
    let same = registered
        && !st.drain_sent
        && st.state == State::Active
        && st
            .control
            .as_ref()
            .is_some_and(|c| c.sock_id == sock_id && !c.tx.is_closed());
    let full = st.load() >= limits::PER_HOST_CONNECTIONS;
    if !same || full {
        drop(st);
        cell.registry().pending_owner.remove(conn_id);
        return Err(Some(if same {
            (close::LIMIT_EXCEEDED, REJECTED)
        } else {
            (close::WRONG_CELL, REJECTED)
        }));
    }
    let kind = adm.kind;
    st.pending.insert(
        conn_id.to_owned(),
        Pending {
            ticket: ticket.clone(),
            kind,
            device: adm.resolved.device().to_owned(),
            tx,
        },
    );
    held.conn_id = Some(conn_id.to_owned());
    cell.with_ledger(|l| l.bind(conn_id));
    if let Some(c) = &st.control {
        c.send(ControlOut::Frame(
            json!({"type":"conn-open","connId":conn_id,"connTicket":ticket,"kind":kind,
                   "relayDeviceId":adm.resolved.device(),"attachDeadlineMs":limits::ATTACH_DEADLINE_MS})
            .to_string(),
        ));
    }
    Ok(rx)
}

/// Step-5 rejection: 4404 `relay connection rejected`, or `signed-out` when remembered.
fn offline(cell: &Cell, key: &HostKey) -> (u16, &'static str) {
    let signed_out = crate::sync::lock(&cell.signed_out).is_signed_out(key, now_ms());
    (
        close::HOST_OFFLINE,
        if signed_out {
            reason::SIGNED_OUT
        } else {
            REJECTED
        },
    )
}

enum Waited {
    Data(Box<DataLeg>),
    Reject(u16, &'static str),
    Gone,
}

/// Removes the pending entry if it is still there (then nobody else will attach it).
fn take_pending(cell: &Cell, session: &Session, conn_id: &str) -> bool {
    let removed = session.lock().pending.remove(conn_id).is_some();
    if removed {
        cell.registry().pending_owner.remove(conn_id);
    }
    removed
}

async fn wait_attach(
    cell: &Arc<Cell>,
    ws: &mut Ws,
    session: &Arc<Session>,
    conn_id: &str,
    rx: &mut oneshot::Receiver<Attach>,
    stash: &mut Option<Message>,
) -> Waited {
    let deadline = tokio::time::sleep(Duration::from_millis(limits::ATTACH_DEADLINE_MS));
    tokio::pin!(deadline);
    let mut deadline_passed = false;
    let mut phone_closed = false;
    loop {
        tokio::select! {
            r = &mut *rx => return match r {
                Ok(Attach::Data(leg)) if phone_closed => {
                    let mut leg = leg;
                    cell.close_leg(Leg::Data, &mut leg.ws, close::PEER_DROPPED, reason::PEER_CONNECTION_DROPPED).await;
                    Waited::Gone
                }
                Ok(Attach::Data(leg)) => Waited::Data(leg),
                Ok(Attach::Reject(code, r)) => Waited::Reject(code, r),
                Err(_) => Waited::Reject(close::HOST_OFFLINE, REJECTED),
            },
            _ = &mut deadline, if !deadline_passed => {
                deadline_passed = true;
                if take_pending(cell, session, conn_id) {
                    return Waited::Reject(close::HOST_OFFLINE, REJECTED);
                }
            }
            m = ws.next(), if stash.is_none() && !phone_closed => match m {
                Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => *stash = Some(m),
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    phone_closed = true;
                    if take_pending(cell, session, conn_id) {
                        return Waited::Gone;
                    }
                }
                Some(Ok(_)) => {}
            },
        }
    }
}

/// The attach: the splice's basis and activity persisted, forwarding installed (the kill switch)
/// before `relay-hello`, then the splice job. A failed step undoes the admission and closes both
/// legs.
#[allow(clippy::too_many_arguments)]
async fn attach(
    cell: &Arc<Cell>,
    phone: &mut Ws,
    held: &mut Held,
    session: &Arc<Session>,
    conn_id: String,
    adm: &Admitted,
    leg: DataLeg,
    stash: Option<Message>,
) -> Option<SpliceJob> {
    let DataLeg {
        ws: mut host,
        guard,
    } = leg;
    let key = &adm.key;
    let splice_activity = splice_activity_id(&conn_id);
    let now = now_ms();
    let (generation, drain_sent) = {
        let st = session.lock();
        (st.generation, st.drain_sent)
    };
    let basis = basis_of(adm, &conn_id, generation, now);
    if persist_splice(cell, key, &splice_activity, &basis, now)
        .await
        .is_err()
    {
        session.lock().active.remove(&conn_id);
        cell.release_activity(key, splice_activity);
        let closes = (close::LIMIT_EXCEEDED, reason::BASIS_PERSISTENCE_FAILED);
        fail_attach(cell, phone, &mut host, held, &conn_id, closes).await;
        return None;
    }
    // Step 5 re-check, then step 6: install forwarding (the kill switch) before relay-hello.
    let (kill_tx, kill_rx) = oneshot::channel();
    let ok = install_forwarding(cell, session, key, &conn_id, drain_sent, kill_tx);
    let mut stash = stash;
    let phone_open = ok && !phone_gone(phone, &mut stash);
    if !ok || !phone_open {
        session.lock().active.remove(&conn_id);
        let _ = creds::deactivate_basis(&cell.ctx.db, &conn_id).await;
        cell.release_activity(key, splice_activity);
        let closes = (close::DRAINING, reason::HOST_RETIRED_DURING_ATTACHMENT);
        fail_attach(cell, phone, &mut host, held, &conn_id, closes).await;
        return None;
    }
    // Step 7.
    let hello = relay_hello(&adm.resolved, adm.lease, adm.reserved_at);
    held.invite = None; // the reservation succeeded: nothing to fail any more
    let credential_activity = held.activity.take();
    held.unit = false;
    cell.with_ledger(|l| l.consume_bound(&conn_id));
    let sent = phone.send(Message::text(hello.to_string())).await.is_ok();
    logging::event(
        "orca_relay_client_accept_completed",
        json!({"host": logging::digest(&key.relay_host_id), "kind": adm.kind}),
    );
    Some(SpliceJob {
        host: Box::new(host),
        guard,
        kill_rx,
        session: session.clone(),
        conn_id,
        credential_activity,
        stash: if sent { stash } else { None },
        phone_gone: !sent,
        phone_guard: None,
    })
}

/// The connection's basis: what a later resume confirmation or install is checked against. A
/// resume's basis lasts the resume-basis deadline, an invite's the reservation lease.
fn basis_of(adm: &Admitted, conn_id: &str, generation: i64, now: i64) -> creds::Basis {
    let resolved = &adm.resolved;
    creds::Basis {
        conn_id: conn_id.to_owned(),
        host: adm.key.clone(),
        device: resolved.device().to_owned(),
        generation,
        kind: adm.kind,
        invite_hash: match resolved {
            Resolved::Invite { hash, .. } => Some(hash.clone()),
            _ => None,
        },
        accepted_version: match resolved {
            Resolved::Resume { version, .. } => Some(*version),
            _ => None,
        },
        accepted_as: match resolved {
            Resolved::Resume { accepted_as, .. } => Some(*accepted_as),
            _ => None,
        },
        deadline: if adm.kind == "resume" {
            now + limits::RESUME_BASIS_DEADLINE_MS
        } else {
            adm.lease
        },
    }
}

/// Acquires the splice activity, then persists the basis.
async fn persist_splice(
    cell: &Cell,
    key: &HostKey,
    splice_activity: &str,
    basis: &creds::Basis,
    now: i64,
) -> Result<(), ()> {
    let db = &cell.ctx.db;
    store::acquire_activity(
        db,
        key,
        splice_activity,
        ActivityKind::Splice,
        &cell.ctx.config.cell_id,
        None,
        now,
    )
    .await
    .map_err(|_| ())?;
    creds::persist_basis(db, basis, now).await.map_err(|_| ())
}

/// Installs the connection's kill switch if the session is still the host's, was not sent a
/// drain (before or during the attach), is not closed and still holds the connection; otherwise
/// drops the connection from the session. Returns whether it was installed.
fn install_forwarding(
    cell: &Cell,
    session: &Session,
    key: &HostKey,
    conn_id: &str,
    drain_sent: bool,
    kill_tx: super::session::Kill,
) -> bool {
    let registered = cell.registry().get(key).is_some_and(|s| s.id == session.id);
    let mut st = session.lock();
    let ok = registered
        && !drain_sent
        && !st.drain_sent
        && st.state != State::Closed
        && st.active.contains_key(conn_id);
    if ok {
        st.active.insert(conn_id.to_owned(), Some(kill_tx));
    } else {
        st.active.remove(conn_id);
    }
    ok
}

/// A failed attach: the ledger's bound unit back, the admission undone, the phone rejected and
/// the data leg closed, both with `code` (the data leg with `host_reason`).
async fn fail_attach(
    cell: &Cell,
    phone: &mut Ws,
    host: &mut Ws,
    held: &mut Held,
    conn_id: &str,
    (code, host_reason): (u16, &'static str),
) {
    cell.with_ledger(|l| l.restore_bound(conn_id));
    held.undo().await;
    tokio::join!(
        reject(cell, phone, code, REJECTED),
        cell.close_leg(Leg::Data, host, code, host_reason)
    );
}

/// The accepting `relay-hello`: an invite's lease is its reservation's; a resume's is the attach
/// deadline from the reservation, with the accepted credential version and its expiries.
fn relay_hello(resolved: &Resolved, lease: i64, reserved_at: i64) -> serde_json::Value {
    match resolved {
        Resolved::Invite { .. } => {
            json!({"type":"relay-hello","ok":true,"credentialKind":"invite","leaseExpiresAt":lease})
        }
        Resolved::Resume {
            version,
            accepted_as,
            current_expires_at,
            grace_expires_at,
            ..
        } => {
            let mut v = json!({"type":"relay-hello","ok":true,"credentialKind":"resume",
                "leaseExpiresAt": reserved_at + limits::ATTACH_DEADLINE_MS as i64,
                "acceptedCredentialVersion": version, "acceptedAs": accepted_as,
                "resumeExpiresAt": current_expires_at});
            if let Some(g) = grace_expires_at {
                v["graceExpiresAt"] = json!(g);
            }
            v
        }
    }
}

/// The activity id of the splice of `conn_id`.
fn splice_activity_id(conn_id: &str) -> String {
    format!("splice:{conn_id}")
}

/// Everything a running splice owns. It runs in a task of its own so the (larger) admission
/// future of the phone task is freed: an idle splice costs its two sockets and little more. The
/// sockets are boxed so the splice task stays small while they are parked (see [`splice::run`]).
/// What an idle splice keeps is kept once: the host key is the session's (`session.key`), and the
/// splice activity id is derived from the connection id at teardown.
pub struct SpliceJob {
    host: Box<Ws>,
    guard: ConnGuard,
    kill_rx: oneshot::Receiver<(u16, &'static str)>,
    session: Arc<Session>,
    conn_id: String,
    credential_activity: Option<String>,
    stash: Option<Message>,
    phone_gone: bool,
    /// The phone leg's share of the connection accounting, handed over when the splice starts.
    phone_guard: Option<ConnGuard>,
}

///: forward until either side ends, then tear down (idempotent, both sides the same code).
/// The task lives as long as the pair, so it holds little beside [`splice::run`]'s own state:
/// the job is one box, the set-up and the teardown are boxed futures, and the counters are the
/// cell's.
pub async fn run_splice(cell: Arc<Cell>, mut phone: Box<Ws>, mut job: Box<SpliceJob>) {
    cell.counts.splices.fetch_add(1, Ordering::Relaxed);
    cell.ctx.metrics.splices_active.inc();
    let phone_gone = job.phone_gone;
    let stash = job.stash.take();
    Box::pin(async {
        // Take over both sockets' write wakers: the admission task registered its own when it
        // sent `relay-hello`, and a waker keeps that task's allocation alive for the whole splice.
        let _ = phone.flush().await;
        let _ = job.host.flush().await;
        if let (false, Some(m)) = (phone_gone, stash) {
            let _ = job.host.send(m).await;
        }
    })
    .await;
    let end = if phone_gone {
        splice::End::Dropped(splice::Side::Phone)
    } else {
        let host = job.host;
        // The live splice folds its counts in as it goes (splice::FOLD_INTERVAL), not only at
        // its end.
        let (end, _stats, p, h) = splice::run(
            phone,
            host,
            (ws::config_ref(Leg::Phone), ws::config_ref(Leg::Data)),
            &mut job.kill_rx,
            &cell.splice_limits,
            &cell.budget,
            &cell.sweep,
            &|d| cell.splice_meter.fold(d),
        )
        .await;
        (phone, job.host) = (p, h);
        end
    };
    let teardown = Box::pin(teardown(cell, phone, job, end));
    teardown.await;
}

/// A splice's end: both close handshakes (up to 1 s each) run alongside the bookkeeping, so the
/// basis is inactive and the activities released as soon as the splice ends.
async fn teardown(cell: Arc<Cell>, mut phone: Box<Ws>, job: Box<SpliceJob>, end: splice::End) {
    let SpliceJob {
        mut host,
        guard,
        session,
        conn_id,
        credential_activity,
        phone_guard,
        ..
    } = *job;
    let bookkeeping = async {
        session.lock().active.remove(&conn_id);
        let _ = creds::deactivate_basis(&cell.ctx.db, &conn_id).await;
        cell.release_activity(&session.key, splice_activity_id(&conn_id));
        if let Some(a) = credential_activity {
            cell.release_activity(&session.key, a);
        }
    };
    let ((pc, _), (hc, _)) = end.closes();
    cell.count_close(Leg::Phone, pc);
    cell.count_close(Leg::Data, hc);
    tokio::join!(splice::close_pair(&mut phone, &mut host, &end), bookkeeping);
    cell.counts.splices.fetch_sub(1, Ordering::Relaxed);
    cell.ctx.metrics.splices_active.dec();
    if end.is_abnormal() {
        let ((pc, pr), _) = end.closes();
        logging::event_warn(
            "orca_relay_splice_closed",
            json!({"host": logging::digest(&session.key.relay_host_id), "code": pc, "reason": pr}),
        );
    }
    drop((guard, phone_guard));
}

/// The host data leg up to the hand-over to its phone.
pub async fn run_data(
    cell: Arc<Cell>,
    mut ws: Ws,
    guard: ConnGuard,
    conn_id: String,
    source: String,
) {
    let first = ws::first_frame(&mut ws, Duration::from_millis(limits::FIRST_FRAME_MS)).await;
    cell.preauth().leave(&source);
    let claimed = data_leg_auth(first).and_then(|auth| claim_pending(&cell, &conn_id, &auth));
    // The idle-work token is held through the hand-over.
    let (session, pending, _idle) = match claimed {
        Ok(x) => x,
        Err(refusal) => {
            cell.with_ledger(|l| l.restore_bound(&conn_id));
            if let Some((code, r)) = refusal {
                cell.close_leg(Leg::Data, &mut ws, code, r).await;
            }
            return;
        }
    };
    cell.registry().pending_owner.remove(&conn_id);
    // The ticket authenticated the data leg: its own message limit applies from here.
    ws::authenticated(&ws);
    if let Err(Attach::Data(leg)) = pending
        .tx
        .send(Attach::Data(Box::new(DataLeg { ws, guard })))
    {
        // The phone went away at the same moment.
        session.lock().active.remove(&conn_id);
        let mut leg = leg;
        cell.close_leg(
            Leg::Data,
            &mut leg.ws,
            close::PEER_DROPPED,
            reason::PEER_CONNECTION_DROPPED,
        )
        .await;
    }
}

/// The data leg's first frame must be a text `host-data-auth`; `Err(None)` when the socket is gone.
fn data_leg_auth(first: First) -> Result<frames::HostDataAuth, Refusal> {
    let text = match first {
        First::Text(t) => t,
        First::Binary => {
            return Err(Some((
                close::BAD_OUTER_CREDENTIAL,
                reason::FIRST_FRAME_MUST_BE_TEXT,
            )))
        }
        First::Timeout => {
            return Err(Some((
                close::BAD_OUTER_CREDENTIAL,
                reason::FIRST_FRAME_TIMEOUT,
            )))
        }
        First::Oversize => return Err(Some((close::MESSAGE_TOO_BIG, "message too big"))),
        First::Violation(code) => return Err(Some((code, ws::violation_reason(code)))),
        First::Gone => return Err(None),
    };
    let auth: Option<frames::HostDataAuth> = match frames::split(&text) {
        Split::Typed(t, m) if t == "host-data-auth" => frames::body(m),
        _ => None,
    };
    auth.ok_or(Some((
        close::BAD_OUTER_CREDENTIAL,
        reason::INVALID_HOST_DATA_AUTH,
    )))
}

/// Step 1: the session that owns the pending connection, and the host's idle-work token; steps
/// 2 and 3: the ticket, generation and session state match, so the pending entry is taken and
/// the connection becomes active. Returns the session, the entry and the token.
fn claim_pending(
    cell: &Cell,
    conn_id: &str,
    auth: &frames::HostDataAuth,
) -> Result<(Arc<Session>, Pending, super::idle_rehome::IdleToken), Refusal> {
    let bad_ticket = Some((
        close::BAD_OUTER_CREDENTIAL,
        reason::INVALID_HOST_DATA_TICKET,
    ));
    let owner = {
        let reg = cell.registry();
        reg.pending_owner.get(conn_id).and_then(|k| reg.get(k))
    };
    let Some(session) = owner else {
        return Err(bad_ticket);
    };
    let Some(idle) = cell.idle_token(&session.key) else {
        return Err(Some((close::WRONG_CELL, reason::IDLE_CUTOVER_IN_PROGRESS)));
    };
    let pending = {
        let mut st = session.lock();
        let valid = st.pending.get(conn_id).is_some_and(|p| {
            crypto::ct_eq_str(&p.ticket, &auth.conn_ticket)
                && auth.generation as i64 == st.generation
                && matches!(st.state, State::Active | State::DrainOnly)
        });
        if valid {
            let p = st.pending.remove(conn_id);
            st.active.insert(conn_id.to_owned(), None);
            p
        } else {
            None
        }
    };
    match pending {
        Some(p) => Ok((session, p, idle)),
        None => Err(bad_ticket),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resume(grace: Option<i64>) -> Resolved {
        Resolved::Resume {
            user_id: "u".into(),
            device: "d".into(),
            version: 3,
            accepted_as: "grace",
            current_expires_at: 9_000,
            grace_expires_at: grace,
        }
    }

    fn admitted(resolved: Resolved, kind: &'static str) -> Admitted {
        Admitted {
            key: HostKey {
                user_id: "u".into(),
                relay_host_id: "h".into(),
            },
            resolved,
            kind,
            lease: 5_000,
            reserved_at: 1_000,
        }
    }

    #[test]
    fn the_data_leg_opens_with_a_text_host_data_auth() {
        let code = |first| data_leg_auth(first).err();
        assert_eq!(code(First::Gone), Some(None));
        assert_eq!(
            code(First::Binary),
            Some(Some((
                close::BAD_OUTER_CREDENTIAL,
                reason::FIRST_FRAME_MUST_BE_TEXT
            )))
        );
        assert_eq!(
            code(First::Text("{\"type\":\"relay-auth\"}".into())),
            Some(Some((
                close::BAD_OUTER_CREDENTIAL,
                reason::INVALID_HOST_DATA_AUTH
            )))
        );
        assert_eq!(
            code(First::Violation(1002)).flatten().map(|c| c.0),
            Some(1002)
        );
    }

    #[test]
    fn each_credential_holds_its_own_activity() {
        assert_eq!(
            credential_activity("invite", "c1"),
            ("invite:c1".to_owned(), ActivityKind::Invite)
        );
        assert_eq!(
            credential_activity("resume", "c1"),
            ("confirmation:c1".to_owned(), ActivityKind::Confirmation)
        );
    }

    #[test]
    fn relay_hello_of_an_invite_carries_the_reservation_lease() {
        let invite = Resolved::Invite {
            hash: "h".into(),
            user_id: "u".into(),
            device: "d".into(),
        };
        let v = relay_hello(&invite, 5_000, 1_000);
        assert_eq!(v["credentialKind"], "invite");
        assert_eq!(v["leaseExpiresAt"], 5_000);
    }

    #[test]
    fn relay_hello_of_a_resume_carries_the_attach_deadline_and_expiries() {
        let v = relay_hello(&resume(Some(12_000)), 5_000, 1_000);
        assert_eq!(v["credentialKind"], "resume");
        assert_eq!(
            v["leaseExpiresAt"],
            1_000 + limits::ATTACH_DEADLINE_MS as i64
        );
        assert_eq!(v["acceptedCredentialVersion"], 3);
        assert_eq!(v["acceptedAs"], "grace");
        assert_eq!(v["resumeExpiresAt"], 9_000);
        assert_eq!(v["graceExpiresAt"], 12_000);
        let v = relay_hello(&resume(None), 5_000, 1_000);
        assert!(v.get("graceExpiresAt").is_none());
    }

    #[test]
    fn basis_deadline_by_kind() {
        let b = basis_of(&admitted(resume(None), "resume"), "c1", 2, 100);
        assert_eq!(b.deadline, 100 + limits::RESUME_BASIS_DEADLINE_MS);
        assert_eq!(
            (b.accepted_version, b.accepted_as, b.invite_hash),
            (Some(3), Some("grace"), None)
        );
        let invite = Resolved::Invite {
            hash: "h".into(),
            user_id: "u".into(),
            device: "d".into(),
        };
        let b = basis_of(&admitted(invite, "invite"), "c1", 2, 100);
        assert_eq!(b.deadline, 5_000);
        assert_eq!(b.invite_hash.as_deref(), Some("h"));
        assert_eq!((b.conn_id.as_str(), b.generation), ("c1", 2));
    }
}
