//! Phone admission (protocol.md §5), the host data leg (§6) and the splice lifecycle (§8).
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
    /// The idle-work token of the accept (§13): the host is not idle while a phone is admitted.
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
    let text = match first {
        First::Text(t) => t,
        First::Binary => {
            held.release_unit();
            return cell
                .close_leg(
                    Leg::Phone,
                    &mut ws,
                    close::BAD_OUTER_CREDENTIAL,
                    reason::FIRST_FRAME_MUST_BE_TEXT,
                )
                .await;
        }
        First::Timeout => {
            held.release_unit();
            return cell
                .close_leg(
                    Leg::Phone,
                    &mut ws,
                    close::BAD_OUTER_CREDENTIAL,
                    reason::FIRST_FRAME_TIMEOUT,
                )
                .await;
        }
        First::Oversize => {
            held.release_unit();
            return cell
                .close_leg(
                    Leg::Phone,
                    &mut ws,
                    close::MESSAGE_TOO_BIG,
                    "message too big",
                )
                .await;
        }
        First::Violation(code) => {
            held.release_unit();
            return ws::close(&mut ws, code, ws::violation_reason(code)).await;
        }
        First::Gone => return held.release_unit(),
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
            tokio::spawn(run_splice(cell.clone(), Box::new(ws), guard, job));
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

const REJECTED: &str = reason::RELAY_CONNECTION_REJECTED;

/// §5.2 steps, the wait for the data leg, and the splice. `Err(Some)` = reject with that close;
/// `Err(None)` = the phone is gone.
async fn admit(
    cell: &Arc<Cell>,
    ws: &mut Ws,
    held: &mut Held,
    relay_host_id: &str,
    credential: &str,
) -> Result<Option<SpliceJob>, Option<(u16, &'static str)>> {
    let started = now_ms();
    let db = &cell.ctx.db;
    let unavailable = Some((close::LIMIT_EXCEEDED, reason::RELAY_TEMPORARILY_UNAVAILABLE));
    let mut stash: Option<Message> = None;
    // Step 3: resolve the credential and the assignment.
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
    // Step 1: the idle-work token.
    let Some(idle) = cell.idle_token(&key) else {
        return Err(Some((close::WRONG_CELL, REJECTED)));
    };
    held.idle = Some(idle);
    match store::resolve_assignment(db, &key).await {
        Ok(Some(a)) if a.cell_id == cell.ctx.config.cell_id => {}
        Ok(_) => return Err(Some((close::WRONG_CELL, REJECTED))),
        Err(_) => return Err(unavailable),
    }
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
    // Step 4: reserve.
    let reserved_at = now_ms();
    let (kind, lease) = match &resolved {
        Resolved::Invite { hash, .. } => match creds::reserve_invite(db, hash, reserved_at).await {
            Ok(Some(r)) => {
                held.invite = Some((hash.clone(), r.id.clone()));
                ("invite", r.lease_expires_at)
            }
            Ok(None) => return Err(Some((close::BAD_OUTER_CREDENTIAL, REJECTED))),
            Err(_) => return Err(unavailable),
        },
        Resolved::Resume { .. } => ("resume", reserved_at + limits::ATTACH_DEADLINE_MS as i64),
    };
    // The credential is reserved (authenticated): the phone leg's own message limit applies.
    ws::authenticated(ws);
    if phone_gone(ws, &mut stash) {
        abandoned(&key, "credential", started);
        return Err(None);
    }
    // Steps 5, 6 (and step 2 again: a drain may have been sent while reserving).
    let session = cell.registry().get(&key);
    let (session, sock_id) = {
        let Some(session) = session else {
            return Err(Some(offline(cell, &key)));
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
            return Err(Some(offline(cell, &key)));
        };
        if st.load() >= limits::PER_HOST_CONNECTIONS {
            return Err(Some((close::LIMIT_EXCEEDED, REJECTED)));
        }
        let sock_id = c.sock_id;
        drop(st);
        (session, sock_id)
    };
    // Step 7: the credential activity.
    let conn_id = uuid::Uuid::new_v4().to_string();
    let activity = match kind {
        "invite" => format!("invite:{conn_id}"),
        _ => format!("confirmation:{conn_id}"),
    };
    let activity_kind = if kind == "invite" {
        ActivityKind::Invite
    } else {
        ActivityKind::Confirmation
    };
    if store::acquire_activity(
        db,
        &key,
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
    held.activity = Some(activity.clone());
    if phone_gone(ws, &mut stash) {
        abandoned(&key, "activity", started);
        return Err(None);
    }
    // Steps 8, 9.
    let ticket = crypto::random_b64u32();
    let (tx, mut rx) = oneshot::channel();
    // Lock order: registry before session, never the registry while a session is locked.
    let registered = {
        let mut reg = cell.registry();
        let current = reg.get(&key).is_some_and(|s| s.id == session.id);
        if current {
            reg.pending_owner.insert(conn_id.clone(), key.clone());
        }
        current
    };
    {
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
            cell.registry().pending_owner.remove(&conn_id);
            return Err(Some(if same {
                (close::LIMIT_EXCEEDED, REJECTED)
            } else {
                (close::WRONG_CELL, REJECTED)
            }));
        }
        st.pending.insert(
            conn_id.clone(),
            Pending {
                ticket: ticket.clone(),
                kind,
                device: resolved.device().to_owned(),
                tx,
            },
        );
        held.conn_id = Some(conn_id.clone());
        cell.with_ledger(|l| l.bind(&conn_id));
        if let Some(c) = &st.control {
            c.send(ControlOut::Frame(
                json!({"type":"conn-open","connId":conn_id,"connTicket":ticket,"kind":kind,
                       "relayDeviceId":resolved.device(),"attachDeadlineMs":limits::ATTACH_DEADLINE_MS})
                .to_string(),
            ));
        }
    }
    cell.counts.pending.fetch_add(1, Ordering::Relaxed);
    let waited = wait_attach(cell, ws, &session, &conn_id, &mut rx, &mut stash).await;
    cell.counts.pending.fetch_sub(1, Ordering::Relaxed);
    cell.registry().pending_owner.remove(&conn_id);
    let leg = match waited {
        Waited::Data(leg) => leg,
        Waited::Reject(code, r) => return Err(Some((code, r))),
        Waited::Gone => {
            abandoned(&key, "attach", started);
            return Err(None);
        }
    };
    Ok(attach(
        cell,
        ws,
        held,
        &session,
        &key,
        conn_id,
        &resolved,
        kind,
        lease,
        reserved_at,
        *leg,
        stash,
    )
    .await)
}

/// Step-5 rejection: 4404 `relay connection rejected`, or `signed-out` when remembered (§5.3).
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

/// §6 steps 4–7, then the splice and its teardown.
#[allow(clippy::too_many_arguments)]
async fn attach(
    cell: &Arc<Cell>,
    phone: &mut Ws,
    held: &mut Held,
    session: &Arc<Session>,
    key: &HostKey,
    conn_id: String,
    resolved: &Resolved,
    kind: &'static str,
    lease: i64,
    reserved_at: i64,
    leg: DataLeg,
    stash: Option<Message>,
) -> Option<SpliceJob> {
    let DataLeg {
        ws: mut host,
        guard,
    } = leg;
    let db = &cell.ctx.db;
    let splice_activity = splice_activity_id(&conn_id);
    let now = now_ms();
    let (generation, drain_sent) = {
        let st = session.lock();
        (st.generation, st.drain_sent)
    };
    let basis = creds::Basis {
        conn_id: conn_id.clone(),
        host: key.clone(),
        device: resolved.device().to_owned(),
        generation,
        kind,
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
        deadline: if kind == "resume" {
            now + limits::RESUME_BASIS_DEADLINE_MS
        } else {
            lease
        },
    };
    let persisted = async {
        store::acquire_activity(
            db,
            key,
            &splice_activity,
            ActivityKind::Splice,
            &cell.ctx.config.cell_id,
            None,
            now,
        )
        .await
        .map_err(|_| ())?;
        creds::persist_basis(db, &basis, now).await.map_err(|_| ())
    }
    .await;
    let remove_active = |session: &Session| {
        session.lock().active.remove(&conn_id);
    };
    if persisted.is_err() {
        remove_active(session);
        cell.release_activity(key, splice_activity);
        cell.with_ledger(|l| l.restore_bound(&conn_id));
        held.undo().await;
        tokio::join!(
            reject(cell, phone, close::LIMIT_EXCEEDED, REJECTED),
            cell.close_leg(
                Leg::Data,
                &mut host,
                close::LIMIT_EXCEEDED,
                reason::BASIS_PERSISTENCE_FAILED
            )
        );
        return None;
    }
    // Step 5 re-check, then step 6: install forwarding (the kill switch) before relay-hello.
    let (kill_tx, kill_rx) = oneshot::channel();
    let registered = cell.registry().get(key).is_some_and(|s| s.id == session.id);
    let ok = {
        let mut st = session.lock();
        let ok = registered
            && !drain_sent
            && !st.drain_sent
            && st.state != State::Closed
            && st.active.contains_key(&conn_id);
        if ok {
            st.active.insert(conn_id.clone(), Some(kill_tx));
        } else {
            st.active.remove(&conn_id);
        }
        ok
    };
    let mut stash = stash;
    let phone_open = ok && !phone_gone(phone, &mut stash);
    if !ok || !phone_open {
        remove_active(session);
        let _ = creds::deactivate_basis(db, &conn_id).await;
        cell.release_activity(key, splice_activity);
        cell.with_ledger(|l| l.restore_bound(&conn_id));
        held.undo().await;
        tokio::join!(
            reject(cell, phone, close::DRAINING, REJECTED),
            cell.close_leg(
                Leg::Data,
                &mut host,
                close::DRAINING,
                reason::HOST_RETIRED_DURING_ATTACHMENT
            )
        );
        return None;
    }
    // Step 7.
    let hello = match resolved {
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
    };
    held.invite = None; // the reservation succeeded: nothing to fail any more
    let credential_activity = held.activity.take();
    held.unit = false;
    cell.with_ledger(|l| l.consume_bound(&conn_id));
    let sent = phone.send(Message::text(hello.to_string())).await.is_ok();
    logging::event(
        "orca_relay_client_accept_completed",
        json!({"host": logging::digest(&key.relay_host_id), "kind": kind}),
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
    })
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
}

/// §8: forward until either side ends, then tear down (idempotent, both sides the same code).
pub async fn run_splice(
    cell: Arc<Cell>,
    mut phone: Box<Ws>,
    phone_guard: ConnGuard,
    job: SpliceJob,
) {
    let SpliceJob {
        mut host,
        guard,
        mut kill_rx,
        session,
        conn_id,
        credential_activity,
        stash,
        phone_gone,
    } = job;
    cell.counts.splices.fetch_add(1, Ordering::Relaxed);
    cell.ctx.metrics.splices_active.inc();
    // Take over both sockets' write wakers: the admission task registered its own when it sent
    // `relay-hello`, and a waker keeps that task's (larger) allocation alive for the whole splice.
    let _ = phone.flush().await;
    let _ = host.flush().await;
    // The live splice folds its counts in as it goes (splice::FOLD_INTERVAL), not only at its end.
    let meter = {
        let m = &cell.ctx.metrics;
        let frames = |d| m.splice_frames.with_label_values(&[d]);
        let bytes = |d| m.splice_bytes.with_label_values(&[d]);
        let (fh, fp) = (frames("to_host"), frames("to_phone"));
        let (bh, bp) = (bytes("to_host"), bytes("to_phone"));
        move |d: splice::Stats| {
            fh.inc_by(d.frames_to_host);
            fp.inc_by(d.frames_to_phone);
            bh.inc_by(d.bytes_to_host);
            bp.inc_by(d.bytes_to_phone);
        }
    };
    let end = if phone_gone {
        splice::End::Dropped(splice::Side::Phone)
    } else {
        if let Some(m) = stash {
            let _ = Box::pin(host.send(m)).await;
        }
        let (end, _stats, p, h) = splice::run(
            phone,
            host,
            (ws::config_ref(Leg::Phone), ws::config_ref(Leg::Data)),
            &mut kill_rx,
            &cell.splice_limits,
            &cell.budget,
            &cell.sweep,
            &meter,
        )
        .await;
        (phone, host) = (p, h);
        end
    };
    // Boxed: the teardown's store futures are not part of the idle splice's resident state.
    Box::pin(async move {
        // The close handshakes (up to 1 s each) run alongside the bookkeeping, so the basis is
        // inactive and the activities released as soon as the splice ends.
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
    })
    .await;
}

/// The host data leg (§6) up to the hand-over to its phone.
pub async fn run_data(
    cell: Arc<Cell>,
    mut ws: Ws,
    guard: ConnGuard,
    conn_id: String,
    source: String,
) {
    let first = ws::first_frame(&mut ws, Duration::from_millis(limits::FIRST_FRAME_MS)).await;
    cell.preauth().leave(&source);
    let restore = |cell: &Cell| cell.with_ledger(|l| l.restore_bound(&conn_id));
    let fail = |code, r| (code, r);
    let outcome = match first {
        First::Text(t) => Ok(t),
        First::Binary => Err(fail(
            close::BAD_OUTER_CREDENTIAL,
            reason::FIRST_FRAME_MUST_BE_TEXT,
        )),
        First::Timeout => Err(fail(
            close::BAD_OUTER_CREDENTIAL,
            reason::FIRST_FRAME_TIMEOUT,
        )),
        First::Oversize => Err(fail(close::MESSAGE_TOO_BIG, "message too big")),
        First::Violation(code) => Err(fail(code, ws::violation_reason(code))),
        First::Gone => {
            restore(&cell);
            return;
        }
    };
    let text = match outcome {
        Ok(t) => t,
        Err((code, r)) => {
            restore(&cell);
            return cell.close_leg(Leg::Data, &mut ws, code, r).await;
        }
    };
    let auth: Option<frames::HostDataAuth> = match frames::split(&text) {
        Split::Typed(t, m) if t == "host-data-auth" => frames::body(m),
        _ => None,
    };
    let Some(auth) = auth else {
        restore(&cell);
        return cell
            .close_leg(
                Leg::Data,
                &mut ws,
                close::BAD_OUTER_CREDENTIAL,
                reason::INVALID_HOST_DATA_AUTH,
            )
            .await;
    };
    let bad_ticket = (
        close::BAD_OUTER_CREDENTIAL,
        reason::INVALID_HOST_DATA_TICKET,
    );
    // Step 1.
    let owner = {
        let reg = cell.registry();
        reg.pending_owner.get(&conn_id).and_then(|k| reg.get(k))
    };
    let Some(session) = owner else {
        restore(&cell);
        return cell
            .close_leg(Leg::Data, &mut ws, bad_ticket.0, bad_ticket.1)
            .await;
    };
    let Some(_idle) = cell.idle_token(&session.key) else {
        restore(&cell);
        return cell
            .close_leg(
                Leg::Data,
                &mut ws,
                close::WRONG_CELL,
                reason::IDLE_CUTOVER_IN_PROGRESS,
            )
            .await;
    };
    // Steps 2, 3.
    let pending = {
        let mut st = session.lock();
        let valid = st.pending.get(&conn_id).is_some_and(|p| {
            crypto::ct_eq_str(&p.ticket, &auth.conn_ticket)
                && auth.generation as i64 == st.generation
                && matches!(st.state, State::Active | State::DrainOnly)
        });
        if valid {
            let p = st.pending.remove(&conn_id);
            st.active.insert(conn_id.clone(), None);
            p
        } else {
            None
        }
    };
    let Some(pending) = pending else {
        restore(&cell);
        return cell
            .close_leg(Leg::Data, &mut ws, bad_ticket.0, bad_ticket.1)
            .await;
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
