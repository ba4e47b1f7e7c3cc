//! The host control leg: handshake, activation, the control loop and its 15 s tick
//!, `auth-refresh`, orphan grace.

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::{SinkExt, Stream};
use rand::Rng;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use super::frames::{self, Split};
use super::session::{retire, ControlOut, ControlRef, Inner, Session, State};
use super::splice::IdleSweep;
use super::{Cell, ConnGuard};
use crate::clock::now_ms;
use crate::contract::close::{self, reason};
use crate::contract::limits;
use crate::crypto::{self, HostBinding, HostClaims};
use crate::leg::boundary::MessageBoundary;
use crate::leg::preauth_io::PreAuthIo;
use crate::leg::ws::{self, First, Leg, LegIo, Ws};
use crate::logging;
use crate::store::assignments::{self as store, ActivateControl, HostKey, RenewalOutcome};
use crate::store::credentials as creds;

pub const CAP_PENDING_DETAILS: &str = "pending-conn-details";
pub const CAP_IDLE_REHOME: &str = "idle-regional-rehome-v1";

/// Control-loop channel depth (frames to send, from phones and commands).
const OUT_QUEUE: usize = 64;

enum Fail {
    Close(u16, &'static str),
    /// Release this activated control, then close: the host re-resolves on the close, and must
    /// not find the control still held here next to the one it activates elsewhere.
    ReleaseThenClose(String, u16, &'static str),
    Gone,
}

/// `orca_relay_host_proofs_total{outcome}`: ok, timeout or invalid (docs/metrics.md).
fn count_proof(cell: &Cell, outcome: &'static str) {
    use crate::metrics::labels;
    debug_assert!(labels::known(labels::HOST_PROOF_OUTCOMES, outcome));
    cell.ctx
        .metrics
        .host_proofs
        .with_label_values(&[outcome])
        .inc();
}

fn close_with(code: u16, r: &'static str) -> Fail {
    Fail::Close(code, r)
}

/// Waits for this host's activation turn: the tokio mutex queues waiters FIFO; `None` once
/// `wait` passes without the turn (the caller closes 4429 `control activation queue stalled`).
async fn wait_activation_turn(
    lock: Arc<tokio::sync::Mutex<()>>,
    wait: Duration,
) -> Option<tokio::sync::OwnedMutexGuard<()>> {
    tokio::time::timeout(wait, lock.lock_owned()).await.ok()
}

/// True when the host's session changed (replaced or created) while this handshake was queued:
/// the queued control must not activate over it (4408 `control activation superseded`).
fn superseded(current_session_id: Option<u64>, seen: Option<u64>) -> bool {
    current_session_id != seen
}

/// The close for a refused `activateControl`: every refusal (a changed assignment, or a store that
/// cannot confirm it) is 4409 `assignment changed during host proof`.
fn activation_refusal(_e: store::ActivityError) -> (u16, &'static str) {
    (
        close::WRONG_CELL,
        reason::ASSIGNMENT_CHANGED_DURING_HOST_PROOF,
    )
}

/// Runs one control socket's handshake; an activated control goes on in [`serve`], its own task.
pub async fn run(
    cell: Arc<Cell>,
    mut ws: Box<Ws>,
    guard: ConnGuard,
    claims: HostClaims,
    caps: Vec<String>,
    watermark: Option<u64>,
) {
    let key = HostKey {
        user_id: claims.sub.clone(),
        relay_host_id: claims.relay_host_id.clone(),
    };
    let handshake = handshake(&cell, &mut ws, &key, &claims, &caps, watermark).await;
    let (session, sock_id, rx) = match handshake {
        Ok(x) => x,
        Err(fail) => return refuse(&cell, &key, &mut ws, fail).await,
    };
    cell.counts
        .controls
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // The loop gets a task of its own, as a splice does: this task's larger state (the
    // handshake's and the refusal's, the claims) is freed, and an idle control costs its loop.
    tokio::spawn(serve(cell, ws, guard, session, sock_id, rx));
}

/// An activated control for its life: the loop, then the close's bookkeeping.
async fn serve(
    cell: Arc<Cell>,
    ws: Box<Ws>,
    guard: ConnGuard,
    session: Arc<Session>,
    sock_id: u64,
    rx: mpsc::Receiver<Box<ControlOut>>,
) {
    let host_reason = control_loop(&cell, ws, &session, sock_id, rx).await;
    cell.counts
        .controls
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    drop(guard);
    on_control_closed(&cell, &session, sock_id, host_reason.as_deref());
}

/// A refused handshake: release what it held (if anything), then close with its code.
async fn refuse(cell: &Cell, key: &HostKey, ws: &mut Ws, fail: Fail) {
    match fail {
        Fail::Close(code, r) => cell.close_leg(Leg::Control, ws, code, r).await,
        Fail::ReleaseThenClose(activity, code, r) => {
            cell.release_activity_before_close(key, activity).await;
            cell.close_leg(Leg::Control, ws, code, r).await;
        }
        Fail::Gone => {}
    }
}

/// The host's control handshake, step by step: early refusals, host-hello, the assignment epoch,
/// the host proof, the activation (serialised per host) and the install of the session.
async fn handshake(
    cell: &Arc<Cell>,
    ws: &mut Ws,
    key: &HostKey,
    claims: &HostClaims,
    caps: &[String],
    watermark: Option<u64>,
) -> Result<(Arc<Session>, u64, mpsc::Receiver<Box<ControlOut>>), Fail> {
    refuse_before_hello(cell, key)?;
    let (hello, host_public) = read_host_hello(ws, claims).await?;
    let epoch = hello.assignment_epoch as i64;
    verify_epoch(cell, key, epoch).await?;
    // rebind or new generation.
    let seen = cell.registry().get(key);
    let offered = hello.control_resume_secret.as_deref();
    let resume = match &seen {
        Some(s) => {
            let st = s.lock();
            resume_decision(Some((st.generation, &st.secret, st.state)), offered)
        }
        None => resume_decision(None, offered),
    };
    let binding = host_binding(cell, claims, &hello, host_public, resume.rebind);
    prove_host(cell, ws, &binding).await?;
    // The host proved its key: the control leg's own message limit applies from here.
    ws::authenticated(ws);
    let plan = Plan {
        key,
        claims,
        hello: &hello,
        epoch,
        generation: resume.generation,
        rebind: resume.rebind,
        pending_details: caps.iter().any(|c| c == CAP_PENDING_DETAILS),
        idle_rehome: caps.iter().any(|c| c == CAP_IDLE_REHOME),
    };
    // Held through the install and the ack.
    let (_turn, _idle) = activation_turn(cell, key, seen.as_ref().map(|s| s.id)).await?;
    // The store's lease runs from the activation's start: the session fences itself by this bound.
    let activated_at = now_ms();
    let activity = activate_lease(cell, &plan, watermark).await?;
    let (tx, rx) = mpsc::channel(OUT_QUEUE);
    let (session, ack, replaced, sock_id) =
        install_session(cell, &plan, seen, activity, activated_at, tx)?;
    // A new generation (not a rebind): the replaced session is retired outside the registry
    // lock (retire takes it).
    if let Some(old) = replaced {
        if let Some(old) = old {
            retire(
                cell,
                &old,
                (close::PEER_DROPPED, reason::REPLACED_BY_NEWER_GENERATION),
            );
        }
        crate::sync::lock(&cell.signed_out).forget(key);
    }
    if ws.send(Message::text(ack.to_string())).await.is_err() {
        // The session is installed before the ack (the ack carries its state). A socket that dies
        // before the ack reaches it is a control that closed at once: orphan grace, so the
        // session never stays registered with a dead control and no timer.
        on_control_closed(cell, &session, sock_id, None);
        return Err(Fail::Gone);
    }
    logging::event(
        "orca_relay_host_control_activated",
        json!({"host": logging::digest(&key.relay_host_id), "generation": plan.generation, "rebind": plan.rebind}),
    );
    Ok((session, sock_id, rx))
}

/// What the handshake learned and decided before it activates the control.
struct Plan<'a> {
    key: &'a HostKey,
    claims: &'a HostClaims,
    hello: &'a frames::HostHello,
    epoch: i64,
    generation: i64,
    rebind: bool,
    pending_details: bool,
    idle_rehome: bool,
}

/// A session installed by the handshake: the session, its hello-ack, the session it replaced
/// (`Some` for a new generation, holding the old one if there was one) and the socket id.
type Installed = (Arc<Session>, Value, Option<Option<Arc<Session>>>, u64);

/// Refusals that need no frame: the host's idle cutover is under way, or the cell is draining.
fn refuse_before_hello(cell: &Cell, key: &HostKey) -> Result<(), Fail> {
    if cell.idle_gate_closed(key) {
        return Err(close_with(
            close::WRONG_CELL,
            reason::IDLE_CUTOVER_IN_PROGRESS,
        ));
    }
    if cell.is_draining() {
        return Err(close_with(close::DRAINING, reason::RELAY_DRAINING));
    }
    Ok(())
}

/// The close for a first-frame outcome every handshake read treats alike (too big, a framing
/// violation, a closed socket); `None` for a text, binary or timeout, which each read decides.
fn first_frame_failure(first: &First) -> Option<Fail> {
    match first {
        First::Oversize => Some(close_with(close::MESSAGE_TOO_BIG, "message too big")),
        First::Violation(code) => Some(close_with(*code, ws::violation_reason(*code))),
        First::Gone => Some(Fail::Gone),
        First::Text(_) | First::Binary | First::Timeout => None,
    }
}

/// Reads host-hello and checks its key binds to the token's relay host id; returns the hello and
/// the host's public key.
async fn read_host_hello(
    ws: &mut Ws,
    claims: &HostClaims,
) -> Result<(frames::HostHello, [u8; 32]), Fail> {
    let first = ws::first_frame(ws, Duration::from_millis(limits::FIRST_FRAME_MS)).await;
    if let Some(fail) = first_frame_failure(&first) {
        return Err(fail);
    }
    let text = match first {
        First::Text(t) => t,
        First::Binary => {
            return Err(close_with(
                close::BAD_OUTER_CREDENTIAL,
                reason::HOST_HELLO_MUST_BE_TEXT,
            ))
        }
        _ => {
            return Err(close_with(
                close::BAD_OUTER_CREDENTIAL,
                reason::HOST_HELLO_TIMEOUT,
            ))
        }
    };
    let hello: frames::HostHello = match frames::split(&text) {
        Split::Typed(t, m) if t == "host-hello" => frames::body(m),
        _ => None,
    }
    .ok_or(close_with(
        close::BAD_OUTER_CREDENTIAL,
        reason::INVALID_HOST_HELLO,
    ))?;
    let host_public = crypto::decode_key32(&hello.host_public_key_b64).ok_or(close_with(
        close::BAD_OUTER_CREDENTIAL,
        reason::INVALID_HOST_PUBLIC_KEY,
    ))?;
    if hello.relay_host_id != claims.relay_host_id
        || crypto::relay_host_id(&host_public) != hello.relay_host_id
    {
        return Err(close_with(
            close::BAD_OUTER_CREDENTIAL,
            reason::HOST_KEY_BINDING_MISMATCH,
        ));
    }
    Ok((hello, host_public))
}

/// The hello's assignment epoch must be the host's current assignment to this cell; a store that
/// cannot tell is a temporary refusal, not a wrong cell.
async fn verify_epoch(cell: &Cell, key: &HostKey, epoch: i64) -> Result<(), Fail> {
    match store::verify_cell_assignment(&cell.ctx.db, key, &cell.ctx.config.cell_id, epoch).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(close_with(
            close::WRONG_CELL,
            reason::WRONG_ASSIGNMENT_EPOCH,
        )),
        Err(_) => Err(close_with(
            close::LIMIT_EXCEEDED,
            reason::RELAY_TEMPORARILY_UNAVAILABLE,
        )),
    }
}

/// Whether the handshake rebinds the registered session or starts a new generation.
#[derive(Debug, PartialEq, Eq)]
struct Resume {
    rebind: bool,
    generation: i64,
}

/// A rebind needs the session's resume secret and a session that is active or orphaned; it keeps
/// the generation. Anything else is the next generation (1 with no session).
fn resume_decision(seen: Option<(i64, &str, State)>, offered: Option<&str>) -> Resume {
    match seen {
        Some((generation, secret, state)) => {
            let rebind = offered.is_some_and(|sec| crypto::ct_eq_str(sec, secret))
                && matches!(state, State::Active | State::Orphaned);
            Resume {
                rebind,
                generation: if rebind { generation } else { generation + 1 },
            }
        }
        None => Resume {
            rebind: false,
            generation: 1,
        },
    }
}

/// What the host's challenge proof binds: this cell's origin, the token's identity, the host key
/// and the hello's epoch, previous generation and resume request.
fn host_binding(
    cell: &Cell,
    claims: &HostClaims,
    hello: &frames::HostHello,
    host_public: [u8; 32],
    rebind: bool,
) -> HostBinding {
    HostBinding {
        relay_origin: cell.ctx.config.cell_url.clone(),
        user_id: claims.sub.clone(),
        profile_id: claims.prof.clone(),
        organization_id: claims.org.clone().unwrap_or_default(),
        relay_host_id: claims.relay_host_id.clone(),
        host_public,
        assignment_epoch: hello.assignment_epoch,
        previous_generation: hello.previous_generation,
        resume_requested: rebind,
    }
}

/// Sends host-challenge and checks the host's ack within the proof window.
async fn prove_host(cell: &Cell, ws: &mut Ws, binding: &HostBinding) -> Result<(), Fail> {
    let issued = crypto::issue_host_challenge(binding, now_ms());
    let mut frame = serde_json::to_value(&issued.frame).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut frame {
        m.insert("type".into(), json!("host-challenge"));
    }
    if ws.send(Message::text(frame.to_string())).await.is_err() {
        return Err(Fail::Gone);
    }
    let first = ws::first_frame(ws, Duration::from_millis(limits::PROOF_WINDOW_MS as u64)).await;
    if let Some(fail) = first_frame_failure(&first) {
        return Err(fail);
    }
    let proof_ok = match first {
        First::Text(t) => match frames::split(&t) {
            Split::Typed(ty, m) if ty == "host-challenge-ack" => {
                frames::body::<frames::ChallengeAck>(m)
                    .is_some_and(|a| issued.verify_ack(&a.challenge_id, &a.proof_b64, now_ms()))
            }
            _ => false,
        },
        First::Timeout => {
            count_proof(cell, "timeout");
            return Err(close_with(
                close::BAD_OUTER_CREDENTIAL,
                reason::HOST_PROOF_TIMEOUT,
            ));
        }
        _ => false,
    };
    count_proof(cell, if proof_ok { "ok" } else { "invalid" });
    if !proof_ok {
        return Err(close_with(
            close::BAD_OUTER_CREDENTIAL,
            reason::INVALID_HOST_PROOF,
        ));
    }
    Ok(())
}

/// Waits for the host's activation turn (FIFO) and takes its idle-work token; both are held
/// through the activation. Refused when the turn does not come, an idle cutover holds the host,
/// the host's session changed meanwhile, or the cell started draining (before any lease is written).
async fn activation_turn(
    cell: &Cell,
    key: &HostKey,
    seen_id: Option<u64>,
) -> Result<
    (
        tokio::sync::OwnedMutexGuard<()>,
        super::idle_rehome::IdleToken,
    ),
    Fail,
> {
    let lock = cell.registry().activation_lock(key);
    let Some(turn) = wait_activation_turn(
        lock,
        Duration::from_millis(limits::ACTIVATION_QUEUE_WAIT_MS),
    )
    .await
    else {
        return Err(close_with(
            close::LIMIT_EXCEEDED,
            reason::CONTROL_ACTIVATION_QUEUE_STALLED,
        ));
    };
    let Some(idle) = cell.idle_token(key) else {
        return Err(close_with(
            close::WRONG_CELL,
            reason::IDLE_CUTOVER_IN_PROGRESS,
        ));
    };
    if superseded(cell.registry().get(key).map(|s| s.id), seen_id) {
        return Err(close_with(
            close::PEER_DROPPED,
            reason::CONTROL_ACTIVATION_SUPERSEDED,
        ));
    }
    // A draining cell activates nothing (step 1): refused before a lease is written.
    if cell.is_draining() {
        return Err(close_with(close::DRAINING, reason::RELAY_DRAINING));
    }
    Ok((turn, idle))
}

/// Writes the control lease and marks a migration to this cell registered, in one transaction
/// (step 3's two store operations): a failure leaves no activity to release. Returns the lease's
/// activity id.
async fn activate_lease(
    cell: &Cell,
    plan: &Plan<'_>,
    watermark: Option<u64>,
) -> Result<String, Fail> {
    store::activate_control_registered(
        &cell.ctx.db,
        plan.key,
        &ActivateControl {
            cell_id: cell.ctx.config.cell_id.clone(),
            assignment_epoch: plan.epoch,
            generation: plan.generation,
            connection_inclusion_watermark: watermark.map(|w| w as i64),
            idle_regional_rehome: plan.idle_rehome,
            cell_incarnation: cell.ctx.incarnation.clone(),
        },
        now_ms(),
    )
    .await
    .map_err(|e| {
        let (code, r) = activation_refusal(e);
        close_with(code, r)
    })
}

/// Installs the activated control: step 4 and the install are one step under the registry lock,
/// which the drain also takes to set `draining` and list its targets: either the drain lists this
/// session (and tells it), or this activation sees the drain and is refused. Checked outside the
/// lock, a session installed just after a drain listed its targets was never told and kept the
/// host on the draining cell until SIGTERM.
fn install_session(
    cell: &Cell,
    plan: &Plan<'_>,
    seen: Option<Arc<Session>>,
    activity: String,
    activated_at: i64,
    tx: mpsc::Sender<Box<ControlOut>>,
) -> Result<Installed, Fail> {
    let mut registry = cell.registry();
    if cell.is_draining() {
        // The host re-resolves on this close at once: its lease here goes first, or it
        // would be activated on the next cell while this process still holds it.
        return Err(Fail::ReleaseThenClose(
            activity,
            close::DRAINING,
            reason::RELAY_DRAINING,
        ));
    }
    let sock_id = registry.next_id();
    let control = ControlRef {
        sock_id,
        tx,
        pending_details: plan.pending_details,
        idle_rehome: plan.idle_rehome,
    };
    let now = now_ms();
    let lease_expires_at = now
        + limits::CONTROL_LEASE_MS
        + rand::thread_rng()
            .gen_range(-limits::CONTROL_LEASE_JITTER_MS..limits::CONTROL_LEASE_JITTER_MS);
    let fresh = Fresh {
        control,
        activity,
        now,
        lease_expires_at,
        activity_expires_at: activated_at + store::LEASE_TTL_MS,
    };
    if plan.rebind {
        let s = seen.expect("rebind has a session");
        let ack = rebind_session(cell, plan, &s, fresh);
        Ok((s, ack, None, sock_id))
    } else {
        let (session, ack, old) = new_session(&mut registry, plan, fresh);
        Ok((session, ack, Some(old), sock_id))
    }
}

/// The new control's parts the install writes into its session.
struct Fresh {
    control: ControlRef,
    activity: String,
    now: i64,
    lease_expires_at: i64,
    /// When the store's control activity lease written by this activation runs out.
    activity_expires_at: i64,
}

/// Rebinds the registered session to the new control: the old control (if any) is closed
/// `control rebound`, a changed lease activity releases the old one; returns the hello-ack.
fn rebind_session(cell: &Cell, plan: &Plan<'_>, s: &Session, fresh: Fresh) -> Value {
    let mut st = s.lock();
    st.orphan_seq += 1;
    st.authority_rev += 1;
    if let Some(old) = st.control.replace(fresh.control) {
        old.send(ControlOut::Close(
            close::PEER_DROPPED,
            reason::CONTROL_REBOUND,
        ));
    }
    if st.activity_id != fresh.activity {
        let old = std::mem::replace(&mut st.activity_id, fresh.activity);
        if !old.is_empty() {
            cell.release_activity(plan.key, old);
        }
    }
    st.epoch = plan.epoch;
    st.app_version = plan.hello.app_version.clone();
    st.claims = plan.claims.clone();
    st.lease_expires_at = fresh.lease_expires_at;
    st.last_pong = fresh.now;
    st.renewal_due = fresh.now + limits::CONTROL_TICK_MS as i64;
    st.activity_expires_at = fresh.activity_expires_at;
    st.state = State::Active;
    st.drain_sent = false;
    hello_ack(&st, plan.pending_details)
}

/// Registers a new session (the next generation, fresh resume secret); returns it, its hello-ack
/// and the session it replaced, if any.
fn new_session(
    registry: &mut super::session::Registry,
    plan: &Plan<'_>,
    fresh: Fresh,
) -> (Arc<Session>, Value, Option<Arc<Session>>) {
    let session = Arc::new(Session {
        key: plan.key.clone(),
        id: registry.next_id(),
        inner: std::sync::Mutex::new(Inner {
            state: State::Active,
            generation: plan.generation,
            epoch: plan.epoch,
            secret: crypto::random_b64u32(),
            lease_expires_at: fresh.lease_expires_at,
            authority_rev: 0,
            claims: plan.claims.clone(),
            app_version: plan.hello.app_version.clone(),
            drain_sent: false,
            control: Some(fresh.control),
            activity_id: fresh.activity,
            pending: Default::default(),
            active: Default::default(),
            orphan_seq: 0,
            last_pong: fresh.now,
            renewal_due: fresh.now + limits::CONTROL_TICK_MS as i64,
            renewal_in_flight: false,
            activity_expires_at: fresh.activity_expires_at,
        }),
    });
    let old = registry.sessions.insert(plan.key.clone(), session.clone());
    let ack = hello_ack(&session.lock(), plan.pending_details);
    (session, ack, old)
}

fn hello_ack(st: &Inner, pending_details: bool) -> Value {
    let active: Vec<&String> = st.active.keys().take(limits::HELLO_ACK_LIST_MAX).collect();
    let pending: Vec<Value> = st
        .pending
        .iter()
        .take(limits::HELLO_ACK_LIST_MAX)
        .map(|(id, p)| {
            if pending_details {
                json!({"connId": id, "connTicket": p.ticket, "kind": p.kind, "relayDeviceId": p.device})
            } else {
                json!({"connId": id, "connTicket": p.ticket})
            }
        })
        .collect();
    json!({
        "type": "host-hello-ack",
        "v": 1,
        "generation": st.generation,
        "controlResumeSecret": st.secret,
        "leaseExpiresAt": st.lease_expires_at,
        "activeConnIds": active,
        "pendingConns": pending,
    })
}

fn send_frame(s: &Session, sock_id: u64, v: Value) {
    let st = s.lock();
    if let Some(c) = st.control.as_ref().filter(|c| c.sock_id == sock_id) {
        c.send(ControlOut::Frame(v.to_string()));
    }
}

fn control_error(req_id: Option<&str>, code: &str) -> Value {
    match req_id {
        Some(r) => json!({"type":"control-error","reqId":r,"code":code}),
        None => json!({"type":"control-error","code":code}),
    }
}

/// Returns the host's close reason if the host closed the socket.
/// The control socket while its loop runs. A control is idle most of the time (a ping every 15 s
/// and its pong), so like an idle splice (see `cell::splice`) it gives its codec back after a
/// quiet sweep round: tungstenite's read buffer, out buffer and waker proxies are freed and only
/// the raw stream stays, until a byte arrives or something must be sent. Only done at a message
/// boundary with everything flushed, so the rebuilt codec is indistinguishable on the wire.
struct Sock {
    /// `None` while parked (or once the raw stream failed to rebuild). Boxed: the control task's
    /// future keeps a pointer, not the codec, while parked.
    ws: Option<Box<Ws>>,
    parked: Option<PreAuthIo<LegIo>>,
}

/// What the control's socket produced.
enum In {
    Msg(Option<Result<Message, WsError>>),
    /// The first bytes a parked socket read (`None`: it closed or failed).
    Woke(Option<Vec<u8>>),
    /// Nothing to read, and no activity for two sweep rounds: time to park.
    Quiet,
}

impl Sock {
    /// The codec, rebuilt (from `early`, the bytes that woke it) if parked. Called from loop
    /// bodies only, never from a `select!` branch, so the rebuild is never cancelled half-way.
    async fn live(&mut self, early: Vec<u8>) -> Option<&mut Ws> {
        if let Some(io) = self.parked.take() {
            let cfg = ws::config(Leg::Control);
            // Boxed: the rebuild's future is not part of the control task's resident state.
            let rebuilt = Box::pin(WebSocketStream::from_partially_read(
                io,
                early,
                Role::Server,
                Some(cfg),
            ))
            .await;
            self.ws = Some(Box::new(rebuilt));
        }
        self.ws.as_deref_mut()
    }

    /// Takes the codec apart (the caller checked it is quiet and flushed).
    fn park(&mut self) {
        if let Some(ws) = self.ws.take() {
            let ws: Ws = *ws;
            let mut io = ws.into_inner();
            io.shed_preauth();
            self.parked = Some(io);
        }
    }

    /// The next message, a parked socket's first bytes, or [`In::Quiet`] once the live codec had
    /// nothing to read (checked in the same poll, so no complete message can be buffered) and
    /// two sweep rounds passed since round `since`. Cancel-safe: whatever a poll read completes
    /// the branch that owns it.
    async fn next(&mut self, sweep: &IdleSweep, since: u64, registered: &mut Option<u64>) -> In {
        std::future::poll_fn(|cx| {
            if let Some(ws) = self.ws.as_deref_mut() {
                return match Pin::new(ws).poll_next(cx) {
                    Poll::Ready(m) => Poll::Ready(In::Msg(m)),
                    Poll::Pending => sweep
                        .poll_rounds(cx, since, 2, registered)
                        .map(|()| In::Quiet),
                };
            }
            let Some(io) = self.parked.as_mut() else {
                return Poll::Ready(In::Woke(None));
            };
            let mut buf = [0u8; ws::READ_BUFFER];
            let mut rb = ReadBuf::new(&mut buf);
            match Pin::new(io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                    Poll::Ready(In::Woke(Some(rb.filled().to_vec())))
                }
                Poll::Ready(_) => Poll::Ready(In::Woke(None)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

/// What one control write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wrote {
    Done,
    /// The socket failed: the control is gone.
    Failed,
    /// The peer did not take the bytes within the wedge deadline.
    Wedged,
}

/// The deadline of every control write: the splice's wedge deadline, so a host that stops
/// reading cannot hold the control loop (its silence timer, renewals and commands) in a write.
const WRITE_DEADLINE: Duration = Duration::from_millis(limits::WEDGE_TIMEOUT_MS);

/// Runs one write (a send or a flush) under `deadline`.
async fn bounded<F, E>(deadline: Duration, write: F) -> Wrote
where
    F: std::future::Future<Output = Result<(), E>>,
{
    match tokio::time::timeout(deadline, write).await {
        Ok(Ok(())) => Wrote::Done,
        Ok(Err(_)) => Wrote::Failed,
        Err(_) => Wrote::Wedged,
    }
}

/// Sends `m` on the control (rebuilding a parked codec first), within [`WRITE_DEADLINE`].
async fn send(sock: &mut Sock, m: Message) -> Wrote {
    match sock.live(Vec::new()).await {
        Some(ws) => bounded(WRITE_DEADLINE, ws.send(m)).await,
        None => Wrote::Failed,
    }
}

/// After a control write: `true` to go on; otherwise the loop ends, a wedged control closed as
/// the splice closes a wedged link (the close itself is bounded by the close-force deadline).
async fn wrote(cell: &Cell, sock: &mut Sock, w: Wrote) -> bool {
    match w {
        Wrote::Done => true,
        Wrote::Failed => false,
        Wrote::Wedged => {
            log::info!("[orca-relay] control closed: the host stopped reading (write deadline)");
            close_control(cell, sock, close::LIMIT_EXCEEDED, reason::WEDGED_RELAY_LINK).await;
            false
        }
    }
}

/// Closes the control with `code` / `r` (rebuilding a parked codec first). Boxed: the close
/// handshake's futures are not part of the control task's resident state.
async fn close_control(cell: &Cell, sock: &mut Sock, code: u16, r: &'static str) {
    Box::pin(async move {
        if let Some(ws) = sock.live(Vec::new()).await {
            cell.close_leg(Leg::Control, ws, code, r).await;
        }
    })
    .await
}

async fn control_loop(
    cell: &Arc<Cell>,
    ws: Box<Ws>,
    session: &Arc<Session>,
    sock_id: u64,
    mut rx: mpsc::Receiver<Box<ControlOut>>,
) -> Option<String> {
    let tick = Duration::from_millis(limits::CONTROL_TICK_MS);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    let cmds = Commands::default();
    let mut replies = None;
    // A command that found every slot busy: the socket is not read until it starts.
    let mut waiting: Option<Box<Command>> = None;
    let mut sock = Sock {
        ws: Some(ws),
        parked: None,
    };
    let sweep = &cell.sweep;
    // The sweep round of the last activity, and the round the sweep has this task's waker for.
    let mut active_round = sweep.round();
    let mut registered = None;
    loop {
        if replies.is_none() {
            replies = cmds.take_replies();
        }
        tokio::select! {
            permit = cmds.slot(), if waiting.is_some() => {
                if let Some(cmd) = waiting.take() {
                    if let Err((code, r)) = start_command(cell, session, &cmds, permit, *cmd) {
                        close_control(cell, &mut sock, code, r).await;
                        return None;
                    }
                }
            }
            reply = next_reply(&mut replies) => {
                if let Some((frame, _permit)) = reply {
                    let w = send(&mut sock, Message::text(frame.to_string())).await;
                    if !wrote(cell, &mut sock, w).await {
                        return None;
                    }
                }
            }
            m = sock.next(sweep, active_round, &mut registered), if waiting.is_none() => {
                let flow = on_socket(cell, session, sock_id, &mut sock, m, &cmds, &mut waiting);
                match flow.await {
                    Flow::Next => {}
                    Flow::Unchanged => continue,
                    Flow::End(host_reason) => return host_reason,
                }
            }
            out = rx.recv() => match out.map(|b| *b) {
                Some(ControlOut::Frame(f)) => {
                    let w = send(&mut sock, Message::text(f)).await;
                    if !wrote(cell, &mut sock, w).await {
                        return None;
                    }
                }
                Some(ControlOut::Close(code, r)) => {
                    close_control(cell, &mut sock, code, r).await;
                    return None;
                }
                None => return None,
            },
            _ = ticker.tick() => {
                if let Some((code, r)) = on_tick(cell, session, sock_id) {
                    close_control(cell, &mut sock, code, r).await;
                    return None;
                }
            }
        }
        active_round = sweep.round();
    }
}

/// What the control loop does after one event.
enum Flow {
    Next,
    /// Nothing happened on the socket: the activity round is not advanced.
    Unchanged,
    /// The loop ends; the host's close reason, if it sent one.
    End(Option<String>),
}

/// One read of the control socket: park when quiet (after flushing what the codec owes), rebuild
/// a woken socket, handle a text message, answer a close.
async fn on_socket(
    cell: &Arc<Cell>,
    session: &Arc<Session>,
    sock_id: u64,
    sock: &mut Sock,
    m: In,
    cmds: &Commands,
    waiting: &mut Option<Box<Command>>,
) -> Flow {
    match m {
        In::Quiet => {
            // Flush what the codec may still owe (a pong), and park unless a partial
            // message is buffered.
            let Some(ws) = sock.ws.as_deref_mut() else {
                return Flow::Unchanged;
            };
            let w = bounded(WRITE_DEADLINE, ws.flush()).await;
            if !wrote(cell, sock, w).await {
                return Flow::End(None);
            }
            let Some(ws) = sock.ws.as_deref_mut() else {
                return Flow::Unchanged;
            };
            if ws.get_ref().at_message_boundary() {
                sock.park();
                cell.counts
                    .control_parks
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        In::Woke(Some(early)) => {
            // The rebuilt codec parses these bytes on the next turn of the loop.
            if sock.live(early).await.is_none() {
                return Flow::End(None);
            }
        }
        In::Woke(None) => return Flow::End(None),
        In::Msg(Some(Ok(Message::Text(t)))) => {
            let text = on_text(cell, session, sock_id, t.as_str(), cmds, waiting);
            if let Err((code, r)) = Box::pin(text).await {
                close_control(cell, sock, code, r).await;
                return Flow::End(None);
            }
        }
        In::Msg(Some(Ok(Message::Close(frame)))) => {
            let r = frame.map(|f| f.reason.as_str().to_owned());
            if let Some(ws) = sock.ws.as_deref_mut() {
                let _ = ws.close(None).await;
            }
            return Flow::End(r);
        }
        In::Msg(Some(Ok(_))) => {}
        In::Msg(Some(Err(WsError::Capacity(_)))) => {
            close_control(cell, sock, close::MESSAGE_TOO_BIG, "message too big").await;
            return Flow::End(None);
        }
        In::Msg(Some(Err(_)) | None) => return Flow::End(None),
    }
    Flow::Next
}

///: the current control closed with no successor → orphaned, 30 s grace.
fn on_control_closed(
    cell: &Arc<Cell>,
    session: &Arc<Session>,
    sock_id: u64,
    host_reason: Option<&str>,
) {
    let mut st = session.lock();
    if st.control.as_ref().is_none_or(|c| c.sock_id != sock_id) {
        return;
    }
    st.control = None;
    if st.state == State::Closed {
        return;
    }
    st.state = State::Orphaned;
    st.orphan_seq += 1;
    let seq = st.orphan_seq;
    // A draining cell refuses every activation (docs/operations.md step 1), so nothing can rebind
    // this session: its control lease would only keep the host charged here, next to the control
    // it re-resolves to elsewhere, until the drain's forced close. Released now; the orphaned
    // session keeps its splices and pending phones until the grace or the forced close.
    let unbindable = cell
        .is_draining()
        .then(|| std::mem::take(&mut st.activity_id));
    drop(st);
    if let Some(activity) = unbindable.filter(|a| !a.is_empty()) {
        cell.release_activity(&session.key, activity);
    }
    if host_reason == Some(reason::SIGNED_OUT) {
        crate::sync::lock(&cell.signed_out).remember(session.key.clone(), now_ms());
    }
    let cell = cell.clone();
    let session = session.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(limits::ORPHAN_GRACE_MS)).await;
        let mut st = session.lock();
        if st.state != State::Orphaned || st.orphan_seq != seq {
            return;
        }
        st.state = State::Closed;
        st.close_all(
            (close::PEER_DROPPED, reason::PEER_CONNECTION_DROPPED),
            (close::HOST_OFFLINE, reason::RELAY_CONNECTION_REJECTED),
        );
        let activity = std::mem::take(&mut st.activity_id);
        drop(st);
        if !activity.is_empty() {
            cell.release_activity(&session.key, activity);
        }
        cell.registry().remove_if(&session);
    });
}

/// The 15 s tick. Returns a close for the control socket, if any.
fn on_tick(cell: &Arc<Cell>, session: &Arc<Session>, sock_id: u64) -> Option<(u16, &'static str)> {
    let now = now_ms();
    let mut st = session.lock();
    if !matches!(st.state, State::Active | State::DrainOnly) {
        return None;
    }
    if now >= st.renewal_due && !st.renewal_in_flight {
        st.renewal_in_flight = true;
        let row = store::RenewalRow {
            host: session.key.clone(),
            activity_id: st.activity_id.clone(),
            expires_at: now + limits::CONTROL_RENEWAL_REQUEST_MS,
        };
        let rev = st.authority_rev;
        let cell = cell.clone();
        let session = session.clone();
        tokio::spawn(async move {
            let outcome = cell.renewer.renew(row.clone()).await;
            on_renewal(&cell, &session, sock_id, rev, &row, now, outcome).await;
        });
    }
    if now - st.last_pong > limits::CONTROL_SILENCE_MS {
        return Some((close::PEER_DROPPED, reason::CONTROL_SILENCE_TIMEOUT));
    }
    let exp_ms = st.claims.exp * 1000;
    if now > exp_ms + limits::EXPIRED_TOKEN_GRACE_MS {
        return Some((
            close::BAD_OUTER_CREDENTIAL,
            reason::RELAY_AUTHORIZATION_EXPIRED,
        ));
    } else if now > exp_ms && st.state == State::Active {
        st.state = State::DrainOnly;
    }
    let c = st
        .control
        .as_ref()
        .filter(|c| c.sock_id == sock_id)?
        .clone();
    if now > st.lease_expires_at {
        c.send(ControlOut::Frame(
            json!({"type":"drain","graceMs":0,"recovery":"resolve-director"}).to_string(),
        ));
        return Some((close::DRAINING, reason::CONTROL_LEASE_EXPIRED));
    }
    c.send(ControlOut::Frame(
        json!({"type":"ping","t":now}).to_string(),
    ));
    None
}

/// How long before the expiry of its control lease a cell that cannot renew it ends the session:
/// the next renewal attempt comes a tick later and may take a store call's client-side deadline
/// (6 s) to fail, so the one after a failure must not be waited for once it could come too late.
pub const LEASE_FENCE_MARGIN_MS: i64 = limits::CONTROL_TICK_MS as i64 + 10_000;

/// True when, after a failed renewal at `now`, the control activity lease written last
/// (`expires_at`) could lapse before the next attempt is known to have failed: the session must
/// end now, while the store still names this cell, so that it never serves a host the store may
/// already have given to another cell.
pub fn lease_fenced(now: i64, expires_at: i64) -> bool {
    now + LEASE_FENCE_MARGIN_MS >= expires_at
}

/// Ends a session whose control lease could not be renewed before its expiry
/// ([`lease_fenced`]): `drain` (resolve at the director) and 4503 `control lease expired` to the
/// host, every splice and pending phone closed, the lease released if the store answers.
fn fence_session(cell: &Arc<Cell>, session: &Arc<Session>, sock_id: u64, rev: u64) {
    let c = {
        let st = session.lock();
        match st
            .control
            .as_ref()
            .filter(|c| c.sock_id == sock_id && st.authority_rev == rev)
        {
            Some(c) => c.clone(),
            None => return,
        }
    };
    log::warn!(
        "[orca-relay] control lease not renewed before its expiry, session closed host={}",
        logging::digest(&session.key.relay_host_id)
    );
    c.send(ControlOut::Frame(
        json!({"type":"drain","graceMs":0,"recovery":"resolve-director"}).to_string(),
    ));
    retire(
        cell,
        session,
        (close::DRAINING, reason::CONTROL_LEASE_EXPIRED),
    );
}

/// What a renewal outcome asks of the session (docs/reference/websocket.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalAction {
    /// `renewed`: next renewal due 30 s after this one started.
    NextDue,
    /// Close the control 4503 with this reason.
    Close(&'static str),
    /// `control_activity_not_found`: re-acquire the same id (kind `control`).
    Reacquire,
    /// Retry on the next tick; `log` unless the row was only locked elsewhere.
    RetryNextTick { log: bool },
}

/// The table as a pure mapping.
pub fn renewal_action(outcome: RenewalOutcome) -> RenewalAction {
    match outcome {
        RenewalOutcome::Renewed => RenewalAction::NextDue,
        RenewalOutcome::AssignmentNotFound => {
            RenewalAction::Close(reason::CONTROL_ASSIGNMENT_MISSING)
        }
        RenewalOutcome::ActivityCellNotAuthoritative => {
            RenewalAction::Close(reason::CONTROL_MIGRATION_COMPLETED)
        }
        RenewalOutcome::ControlActivityMoved => {
            RenewalAction::Close(reason::CONTROL_ACTIVITY_MOVED)
        }
        RenewalOutcome::ControlActivityNotFound => RenewalAction::Reacquire,
        RenewalOutcome::AssignmentLockUnavailable => RenewalAction::RetryNextTick { log: false },
        RenewalOutcome::InvalidActivityId
        | RenewalOutcome::InvalidActivityExpiry
        | RenewalOutcome::DatabaseError => RenewalAction::RetryNextTick { log: true },
    }
}

/// True when a renewal outcome still concerns the session's current control: same socket, same
/// activity id, same authority revision (an outcome landing after a rebind or drain is ignored).
pub fn renewal_is_current(
    current: Option<(u64, &str, u64)>,
    sock_id: u64,
    activity_id: &str,
    rev: u64,
) -> bool {
    current == Some((sock_id, activity_id, rev))
}

/// Applies a renewal outcome unless the session, socket, activity or authority changed.
async fn on_renewal(
    cell: &Arc<Cell>,
    session: &Arc<Session>,
    sock_id: u64,
    rev: u64,
    row: &store::RenewalRow,
    started: i64,
    outcome: RenewalOutcome,
) {
    let close = {
        let mut st = session.lock();
        st.renewal_in_flight = false;
        let now_current = st
            .control
            .as_ref()
            .map(|c| (c.sock_id, st.activity_id.as_str(), st.authority_rev));
        if !renewal_is_current(now_current, sock_id, &row.activity_id, rev) {
            return;
        }
        match renewal_action(outcome) {
            RenewalAction::NextDue => {
                st.renewal_due = started + limits::CONTROL_RENEWAL_INTERVAL_MS;
                st.activity_expires_at = row.expires_at;
                None
            }
            RenewalAction::Close(r) => Some(r),
            RenewalAction::Reacquire => Some(""),
            RenewalAction::RetryNextTick { log } => {
                if lease_fenced(now_ms(), st.activity_expires_at) {
                    drop(st);
                    fence_session(cell, session, sock_id, rev);
                    return;
                }
                if log {
                    log::warn!(
                        "[orca-relay] control renewal failed host={} outcome={outcome:?}",
                        logging::digest(&session.key.relay_host_id)
                    );
                }
                None
            }
        }
    };
    let close = match close {
        Some("") => match reacquire(cell, session, sock_id, rev, row).await {
            Reacquired::Close(r) => r,
            Reacquired::Fenced => return,
        },
        other => other,
    };
    if let Some(r) = close {
        let st = session.lock();
        if let Some(c) = st
            .control
            .as_ref()
            .filter(|c| c.sock_id == sock_id && st.authority_rev == rev)
        {
            c.send(ControlOut::Close(close::DRAINING, r));
        }
    }
}

/// What a re-acquire of a lost control activity leaves to do.
enum Reacquired {
    /// Close the control with this reason, or keep it (`None`).
    Close(Option<&'static str>),
    /// The session was fenced (its lease could lapse before the next attempt): nothing left.
    Fenced,
}

/// Re-acquires the renewal's activity id (kind control) after its row was lost.
async fn reacquire(
    cell: &Arc<Cell>,
    session: &Arc<Session>,
    sock_id: u64,
    rev: u64,
    row: &store::RenewalRow,
) -> Reacquired {
    let r = store::acquire_activity(
        &cell.ctx.db,
        &session.key,
        &row.activity_id,
        store::ActivityKind::Control,
        &cell.ctx.config.cell_id,
        Some(row.expires_at),
        now_ms(),
    )
    .await;
    match r {
        Ok(()) => {
            let mut st = session.lock();
            if st.authority_rev == rev && st.activity_id == row.activity_id {
                st.activity_expires_at = row.expires_at;
            }
            Reacquired::Close(None)
        }
        Err(store::ActivityError::ActivityCellNotAuthoritative) => {
            Reacquired::Close(Some(reason::CONTROL_MIGRATION_COMPLETED))
        }
        Err(e) => {
            cell.counts
                .recovery_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            log::warn!("[orca-relay] control re-acquire failed code={}", e.code());
            if lease_fenced(now_ms(), session.lock().activity_expires_at) {
                fence_session(cell, session, sock_id, rev);
                return Reacquired::Fenced;
            }
            Reacquired::Close(None)
        }
    }
}

/// One host → cell text frame. `Err` closes the control.
async fn on_text(
    cell: &Arc<Cell>,
    session: &Arc<Session>,
    sock_id: u64,
    text: &str,
    cmds: &Commands,
    waiting: &mut Option<Box<Command>>,
) -> Result<(), (u16, &'static str)> {
    let (ty, m) = match frames::split(text) {
        Split::NotJson => return Err((close::BAD_OUTER_CREDENTIAL, reason::INVALID_CONTROL_JSON)),
        Split::NoType => return Ok(()),
        Split::Typed(t, m) => (t, m),
    };
    {
        let st = session.lock();
        if !matches!(st.state, State::Active | State::DrainOnly) {
            return Ok(());
        }
    }
    let invalid = |m: &serde_json::Map<String, Value>| {
        send_frame(
            session,
            sock_id,
            control_error(
                frames::valid_req_id(m).as_deref(),
                "invalid_control_message",
            ),
        );
        Ok(())
    };
    match ty.as_str() {
        "pong" => {
            if frames::body::<frames::Pong>(m).is_some() {
                session.lock().last_pong = now_ms();
            }
            Ok(())
        }
        "auth-refresh" => {
            let Some(_idle) = cell.idle_token(&session.key) else {
                return Err((close::DRAINING, reason::RESOLVE_DIRECTOR));
            };
            let Some(r) = frames::body::<frames::AuthRefresh>(m) else {
                return Ok(());
            };
            auth_refresh(cell, session, &r.relay_jwt).await
        }
        "invite-create"
        | "device-credential-install"
        | "device-credential-install-status"
        | "device-resume-confirm"
        | "device-revoke"
            if cell.idle_gate_closed(&session.key) =>
        {
            Err((close::DRAINING, reason::RESOLVE_DIRECTOR))
        }
        ty => match parse_command(ty, &m) {
            Some(Some(cmd)) => spawn_command(cell, session, cmds, waiting, cmd),
            Some(None) => invalid(&m),
            None => {
                send_frame(
                    session,
                    sock_id,
                    control_error(None, "unknown_control_message"),
                );
                Ok(())
            }
        },
    }
}

/// A command frame's typed body: `None` when the type is not a command, `Some(None)` when the
/// command's body is invalid.
fn parse_command(ty: &str, m: &serde_json::Map<String, Value>) -> Option<Option<Command>> {
    let body = || m.clone();
    Some(match ty {
        "invite-create" => frames::body(body()).map(Command::Invite),
        "device-credential-install" => frames::body(body()).map(Command::Install),
        "device-credential-install-status" => frames::body(body()).map(Command::Status),
        "device-resume-confirm" => frames::body(body()).map(Command::Confirm),
        "device-revoke" => frames::body(body()).map(Command::Revoke),
        _ => return None,
    })
}

///.
async fn auth_refresh(
    cell: &Arc<Cell>,
    session: &Arc<Session>,
    jwt: &str,
) -> Result<(), (u16, &'static str)> {
    let changed = (
        close::BAD_OUTER_CREDENTIAL,
        reason::REFRESH_IDENTITY_CHANGED,
    );
    let claims = cell
        .verifier
        .verify(jwt, now_ms())
        .await
        .map_err(|_| changed)?;
    let mut st = session.lock();
    let old = &st.claims;
    if claims.sub != old.sub
        || claims.prof != old.prof
        || claims.org != old.org
        || claims.relay_host_id != old.relay_host_id
    {
        return Err(changed);
    }
    st.claims = claims;
    if st.state == State::DrainOnly && !st.drain_sent {
        st.state = State::Active;
    }
    Ok(())
}

enum Command {
    Invite(frames::InviteCreate),
    Install(frames::Install),
    Status(frames::InstallStatus),
    Confirm(frames::ResumeConfirm),
    Revoke(frames::Revoke),
}

/// Commands one control socket may have running at once. "Commands may run concurrently; each
/// gets one reply": a host that sends more waits (its socket is not read) until a reply
/// frees a slot, so a burst costs bounded memory and store load, and no command is refused.
pub const COMMANDS_IN_FLIGHT: usize = 16;

/// The command side of one control socket: one permit per command, held until the control loop
/// has taken its reply, and a reply queue with room for every permit, so a reply can never find
/// the queue full (the shared outbound queue drops frames when full; replies must not).
/// Both are made with the first command: most controls never send one, and the queue's first
/// block of slots (tokio allocates 32 up front) and the semaphore are about 1 KiB per control.
#[derive(Default)]
pub(crate) struct Commands {
    live: std::sync::OnceLock<CommandSlots>,
    /// The reply queue's receiving end, made with it, until the control loop takes it.
    replies_rx: std::sync::Mutex<Option<mpsc::Receiver<Reply>>>,
}

struct CommandSlots {
    permits: Arc<tokio::sync::Semaphore>,
    replies: mpsc::Sender<Reply>,
}

/// A command's reply with the permit it frees once sent. The reply is boxed: tokio's channel
/// allocates its slots in blocks of 32 up front, so a control that ran a command holds 32 of
/// these (24 bytes each, not the 96 of an inline `Value` and permit).
pub(crate) type Reply = (Box<Value>, tokio::sync::OwnedSemaphorePermit);

impl Commands {
    fn slots(&self) -> &CommandSlots {
        self.live.get_or_init(|| {
            let (replies, rx) = mpsc::channel(COMMANDS_IN_FLIGHT);
            *crate::sync::lock(&self.replies_rx) = Some(rx);
            CommandSlots {
                permits: Arc::new(tokio::sync::Semaphore::new(COMMANDS_IN_FLIGHT)),
                replies,
            }
        })
    }

    /// The reply queue's receiving end, once, after the first command made it.
    fn take_replies(&self) -> Option<mpsc::Receiver<Reply>> {
        crate::sync::lock(&self.replies_rx).take()
    }

    /// Waits for a free slot.
    async fn slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.slots()
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Runs `work` on the process tracker and queues its reply.
    fn run<F>(&self, ctx: &crate::app::Ctx, permit: tokio::sync::OwnedSemaphorePermit, work: F)
    where
        F: std::future::Future<Output = Value> + Send + 'static,
    {
        let replies = self.slots().replies.clone();
        ctx.spawn("control-command", async move {
            let reply = work.await;
            // Never full: queued replies plus running commands ≤ permits = capacity. An error
            // means the socket is gone, and with it whoever could read the reply.
            let _ = replies.try_send((Box::new(reply), permit));
        });
    }
}

/// The next command reply; never ready before the first command made the queue.
async fn next_reply(replies: &mut Option<mpsc::Receiver<Reply>>) -> Option<Reply> {
    match replies {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Starts `cmd` if a slot is free, else parks it in `waiting` (the control loop stops reading
/// the socket until a slot frees, then starts it).
fn spawn_command(
    cell: &Arc<Cell>,
    session: &Arc<Session>,
    cmds: &Commands,
    waiting: &mut Option<Box<Command>>,
    cmd: Command,
) -> Result<(), (u16, &'static str)> {
    match cmds.slots().permits.clone().try_acquire_owned() {
        Ok(permit) => start_command(cell, session, cmds, permit, cmd),
        Err(_) => {
            *waiting = Some(Box::new(cmd));
            Ok(())
        }
    }
}

/// Starts `cmd` holding the host's idle-work token, taken before the command's first await
/// and held until it replies. A command that waited for a slot may find the admission gate closed
/// by an idle cutover registered meanwhile: it does not run, and the control is to be closed
/// 4503 `resolve-director`, as for a command arriving during the cutover (the `Err`).
fn start_command(
    cell: &Arc<Cell>,
    session: &Arc<Session>,
    cmds: &Commands,
    permit: tokio::sync::OwnedSemaphorePermit,
    cmd: Command,
) -> Result<(), (u16, &'static str)> {
    let Some(idle) = cell.idle_token(&session.key) else {
        return Err((close::DRAINING, reason::RESOLVE_DIRECTOR));
    };
    let (c, s) = (cell.clone(), session.clone());
    cmds.run(&cell.ctx, permit, async move {
        let _idle = idle;
        run_command(&c, &s, cmd).await
    });
    Ok(())
}

/// The `control-error` code of a failed activity acquisition: its own code, except that a
/// transient store fault is `control_operation_failed`, not the director-side
/// `database_error`.
fn activity_code(e: &store::ActivityError) -> &'static str {
    match e {
        store::ActivityError::Db(_) => "control_operation_failed",
        other => other.code(),
    }
}

/// Runs one control command to its reply frame; each command is its own step below.
async fn run_command(cell: &Arc<Cell>, session: &Arc<Session>, cmd: Command) -> Value {
    let (state, generation) = {
        let st = session.lock();
        (st.state, st.generation)
    };
    let now = now_ms();
    match cmd {
        Command::Invite(c) => create_invite(cell, &session.key, state, &c, now).await,
        Command::Install(c) => {
            install_credential(cell, &session.key, (state, generation), &c, now).await
        }
        Command::Status(c) => install_status(cell, &session.key, &c).await,
        Command::Confirm(c) => confirm_resume(cell, &session.key, generation, &c, now).await,
        Command::Revoke(c) => revoke_device(cell, &session.key, &c, now).await,
    }
}

/// `invite-create`: only an active session invites. The `invite-offer:<reqId>` activity is held
/// while the invite is written, then renewed to the invite's expiry; offers the new invite ends
/// are released.
async fn create_invite(
    cell: &Cell,
    key: &HostKey,
    state: State,
    c: &frames::InviteCreate,
    now: i64,
) -> Value {
    let db = &cell.ctx.db;
    let cell_id = &cell.ctx.config.cell_id;
    if state != State::Active {
        return control_error(Some(&c.req_id), "authorization_expired");
    }
    let activity = format!("invite-offer:{}", c.req_id);
    if let Err(e) = store::acquire_activity(
        db,
        key,
        &activity,
        store::ActivityKind::Invite,
        cell_id,
        None,
        now,
    )
    .await
    {
        return control_error(Some(&c.req_id), activity_code(&e));
    }
    match creds::create_invite(db, key, &c.relay_device_id, &c.req_id, now).await {
        Ok(inv) => {
            for offer in inv.invalidated_offers {
                cell.release_activity(key, format!("invite-offer:{offer}"));
            }
            let _ = store::acquire_activity(
                db,
                key,
                &activity,
                store::ActivityKind::Invite,
                cell_id,
                Some(inv.expires_at),
                now_ms(),
            )
            .await;
            json!({"type":"invite-created","reqId":c.req_id,"inviteToken":inv.token,"expiresAt":inv.expires_at,"maxAttempts":limits::INVITE_MAX_ATTEMPTS})
        }
        Err(e) => {
            cell.release_activity(key, activity);
            control_error(Some(&c.req_id), e.code())
        }
    }
}

/// The install's authorization: `relay-basis` names a basis connection, any other mode is an
/// authenticated direct authorization.
fn install_auth(a: &frames::InstallAuthorization) -> creds::InstallAuth {
    match a.mode.as_str() {
        "relay-basis" => creds::InstallAuth::RelayBasis {
            basis_conn_id: a.basis_conn_id.clone().unwrap_or_default(),
        },
        _ => creds::InstallAuth::AuthenticatedDirect {
            direct_auth_id: a.direct_auth_id.clone().unwrap_or_default(),
        },
    }
}

/// `device-credential-install`: a direct authorization needs an active session; the
/// `install:<reqId>` activity is held for the store's install (10 s deadline). A success
/// releases the offers it ended and, for a relay basis, the basis invite.
async fn install_credential(
    cell: &Cell,
    key: &HostKey,
    (state, generation): (State, i64),
    c: &frames::Install,
    now: i64,
) -> Value {
    let db = &cell.ctx.db;
    let auth = install_auth(&c.authorization);
    if matches!(auth, creds::InstallAuth::AuthenticatedDirect { .. }) && state != State::Active {
        return control_error(Some(&c.req_id), "authorization_expired");
    }
    let activity = format!("install:{}", c.req_id);
    if let Err(e) = store::acquire_activity(
        db,
        key,
        &activity,
        store::ActivityKind::Install,
        &cell.ctx.config.cell_id,
        None,
        now,
    )
    .await
    {
        return control_error(Some(&c.req_id), activity_code(&e));
    }
    let req = creds::InstallRequest {
        req_id: c.req_id.clone(),
        device: c.relay_device_id.clone(),
        new_hash: c.new_resume_token_hash.clone(),
        expected_current_hash: c.expected_current_hash.clone(),
        auth: auth.clone(),
    };
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        creds::install(db, key, &req, generation, state == State::Active, now),
    )
    .await
    .unwrap_or(Err(creds::CredError::Db(crate::store::DbError::Transient(
        "deadline".into(),
    ))));
    cell.release_activity(key, activity);
    match r {
        Ok(done) => {
            for offer in done.ended_offers {
                cell.release_activity(key, format!("invite-offer:{offer}"));
            }
            if let creds::InstallAuth::RelayBasis { basis_conn_id } = &auth {
                cell.release_activity(key, format!("invite:{basis_conn_id}"));
            }
            let mut v = done.result;
            v["type"] = json!("device-credential-installed");
            reorder_type(v)
        }
        Err(e) => control_error(Some(&c.req_id), e.code()),
    }
}

/// `device-credential-install-status`: the committed result of an earlier install, or not-found.
async fn install_status(cell: &Cell, key: &HostKey, c: &frames::InstallStatus) -> Value {
    match creds::install_status(&cell.ctx.db, key, &c.relay_device_id, &c.req_id).await {
        Ok(Some(result)) => {
            json!({"type":"device-credential-install-status-result","v":1,"reqId":c.req_id,"state":"committed","result":result})
        }
        Ok(None) => {
            json!({"type":"device-credential-install-status-result","v":1,"reqId":c.req_id,"state":"not-found"})
        }
        Err(_) => control_error(Some(&c.req_id), "control_operation_failed"),
    }
}

/// `device-resume-confirm`: confirms a resume on its basis connection and releases the
/// connection's confirmation activity.
async fn confirm_resume(
    cell: &Cell,
    key: &HostKey,
    generation: i64,
    c: &frames::ResumeConfirm,
    now: i64,
) -> Value {
    match creds::confirm(
        &cell.ctx.db,
        key,
        &c.req_id,
        &c.basis_conn_id,
        generation,
        now,
    )
    .await
    {
        Ok(result) => {
            cell.release_activity(key, format!("confirmation:{}", c.basis_conn_id));
            let mut v = result;
            v["type"] = json!("device-resume-confirmed");
            reorder_type(v)
        }
        Err(e) => control_error(Some(&c.req_id), e.code()),
    }
}

/// `device-revoke`: revokes the device and releases the invite offers that ended with it.
async fn revoke_device(cell: &Cell, key: &HostKey, c: &frames::Revoke, now: i64) -> Value {
    match creds::revoke(&cell.ctx.db, key, &c.relay_device_id, now).await {
        Ok(offers) => {
            for offer in offers {
                cell.release_activity(key, format!("invite-offer:{offer}"));
            }
            json!({"type":"device-revoked","reqId":c.req_id})
        }
        Err(_) => control_error(Some(&c.req_id), "control_operation_failed"),
    }
}

/// Puts `type` first (cosmetic: frames read better in logs and tests).
fn reorder_type(v: Value) -> Value {
    let Value::Object(m) = v else { return v };
    let mut out = serde_json::Map::new();
    if let Some(t) = m.get("type") {
        out.insert("type".into(), t.clone());
    }
    for (k, val) in m {
        if k != "type" {
            out.insert(k, val);
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod renewal_tests {
    use super::*;

    /// P-45: each outcome maps to its action.
    #[test]
    fn every_outcome_maps_to_its_action() {
        use RenewalAction::*;
        let cases = [
            (RenewalOutcome::Renewed, NextDue),
            (
                RenewalOutcome::AssignmentNotFound,
                Close("control assignment missing"),
            ),
            (
                RenewalOutcome::ActivityCellNotAuthoritative,
                Close("control migration completed"),
            ),
            (
                RenewalOutcome::ControlActivityMoved,
                Close("control activity moved"),
            ),
            (RenewalOutcome::ControlActivityNotFound, Reacquire),
            (
                RenewalOutcome::AssignmentLockUnavailable,
                RetryNextTick { log: false },
            ),
            (
                RenewalOutcome::InvalidActivityId,
                RetryNextTick { log: true },
            ),
            (
                RenewalOutcome::InvalidActivityExpiry,
                RetryNextTick { log: true },
            ),
            (RenewalOutcome::DatabaseError, RetryNextTick { log: true }),
        ];
        for (outcome, action) in cases {
            assert_eq!(renewal_action(outcome), action, "{outcome:?}");
        }
    }

    /// P-45: an outcome landing after a rebind (new socket or authority revision), a new
    /// generation (new activity id) or with no control at all is ignored.
    #[test]
    fn stale_outcomes_are_ignored() {
        let id = "control:local:1";
        assert!(renewal_is_current(Some((7, id, 3)), 7, id, 3));
        assert!(
            !renewal_is_current(Some((8, id, 3)), 7, id, 3),
            "rebind: new socket"
        );
        assert!(
            !renewal_is_current(Some((7, id, 4)), 7, id, 3),
            "authority revision bumped"
        );
        assert!(!renewal_is_current(
            Some((7, "control:local:2", 3)),
            7,
            id,
            3
        ));
        assert!(!renewal_is_current(None, 7, id, 3), "socket gone");
    }
}

#[cfg(test)]
mod activation_tests {
    use super::*;
    use tokio::time::Instant;

    /// The wait is a parameter, so the queue logic runs on a short real window here (the crate
    /// builds tokio without `test-util`); the production value is checked to be 30 s.
    const WAIT: Duration = Duration::from_millis(300);

    /// P-48: a second activation waits for the first, and waiters get their turn in arrival order.
    #[tokio::test]
    async fn second_activation_waits_fifo() {
        // Only an upper bound here (the order is what is checked): generous, so a loaded machine
        // that deschedules the test for a moment does not time a waiter out.
        const FIFO_WAIT: Duration = Duration::from_secs(10);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let first = wait_activation_turn(lock.clone(), FIFO_WAIT)
            .await
            .expect("free lock");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for n in 0..3 {
            let (lock, tx) = (lock.clone(), tx.clone());
            waiters.push(tokio::spawn(async move {
                let turn = wait_activation_turn(lock, FIFO_WAIT).await.expect("turn");
                tx.send(n).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(turn);
            }));
            // Let this waiter enqueue before the next one arrives.
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            rx.try_recv().is_err(),
            "nobody activates while the first holds the turn"
        );
        drop(first);
        for w in waiters {
            w.await.unwrap();
        }
        let order: Vec<i32> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(order, vec![0, 1, 2]);
    }

    /// P-48: a waiter behind a held turn gives up after the queue wait (30 s in production →
    /// 4429 stalled), not before.
    #[tokio::test]
    async fn queue_stall_gives_up_after_the_wait() {
        assert_eq!(limits::ACTIVATION_QUEUE_WAIT_MS, 30_000);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let _held = lock.clone().lock_owned().await;
        let start = Instant::now();
        assert!(wait_activation_turn(lock.clone(), WAIT).await.is_none());
        let waited = start.elapsed();
        assert!(
            waited >= WAIT && waited < WAIT * 3,
            "gave up after {waited:?}"
        );
        // Just inside the window, a released turn is still taken.
        let lock2 = Arc::new(tokio::sync::Mutex::new(()));
        let held2 = lock2.clone().lock_owned().await;
        let waiter = tokio::spawn(wait_activation_turn(lock2, WAIT));
        tokio::time::sleep(WAIT / 3).await;
        drop(held2);
        assert!(waiter.await.unwrap().is_some());
    }

    /// P-48: replaced while queued → superseded (4408); same or still-absent session → proceed.
    #[test]
    fn superseded_when_session_changed() {
        assert!(!superseded(None, None));
        assert!(!superseded(Some(7), Some(7)));
        assert!(superseded(Some(8), Some(7)), "replaced while queued");
        assert!(superseded(Some(8), None), "a session appeared while queued");
        assert!(superseded(None, Some(7)), "the seen session went away");
        assert_eq!(
            (close::PEER_DROPPED, reason::CONTROL_ACTIVATION_SUPERSEDED),
            (4408, "control activation superseded")
        );
        assert_eq!(
            (
                close::LIMIT_EXCEEDED,
                reason::CONTROL_ACTIVATION_QUEUE_STALLED
            ),
            (4429, "control activation queue stalled")
        );
    }

    /// P-48: `wrong_assignment` (and any other refusal) closes 4409.
    #[test]
    fn activation_refusal_closes_4409() {
        assert_eq!(
            activation_refusal(store::ActivityError::WrongAssignment),
            (4409, "assignment changed during host proof")
        );
    }
}

#[cfg(test)]
mod write_deadline_tests {
    use super::*;
    use tokio::time::Instant;

    /// Every control write has the splice's wedge deadline.
    #[test]
    fn control_writes_use_the_wedge_deadline() {
        assert_eq!(
            WRITE_DEADLINE,
            Duration::from_millis(limits::WEDGE_TIMEOUT_MS)
        );
    }

    /// A peer that stops reading: the send and the flush give up at the deadline instead of
    /// blocking the loop; a peer that reads gets the frame.
    #[tokio::test]
    async fn a_write_to_a_peer_that_stops_reading_ends_at_the_deadline() {
        let deadline = Duration::from_millis(300);
        let (relay_io, mut peer_io) = tokio::io::duplex(256);
        let mut relay = WebSocketStream::from_raw_socket(relay_io, Role::Server, None).await;
        assert_eq!(
            bounded(deadline, relay.send(Message::text("hello"))).await,
            Wrote::Done
        );
        let started = Instant::now();
        let big = Message::text("x".repeat(64 * 1024));
        assert_eq!(bounded(deadline, relay.send(big)).await, Wrote::Wedged);
        assert_eq!(bounded(deadline, relay.flush()).await, Wrote::Wedged);
        let took = started.elapsed();
        assert!(
            took >= deadline * 2 && took < deadline * 6,
            "gave up after {took:?}"
        );
        // A peer that went away: failed, not wedged.
        let mut buf = [0u8; 1024];
        let _ = tokio::io::AsyncReadExt::read(&mut peer_io, &mut buf).await;
        drop(peer_io);
        assert_eq!(
            bounded(deadline, relay.send(Message::text("late"))).await,
            Wrote::Failed
        );
    }
}

#[cfg(test)]
mod step_tests {
    use super::*;

    #[test]
    fn no_session_starts_generation_one() {
        let r = resume_decision(None, Some("anything"));
        assert_eq!(
            r,
            Resume {
                rebind: false,
                generation: 1
            }
        );
    }

    #[test]
    fn the_right_secret_rebinds_an_active_or_orphaned_session() {
        for state in [State::Active, State::Orphaned] {
            let r = resume_decision(Some((4, "s3cret", state)), Some("s3cret"));
            assert_eq!(
                r,
                Resume {
                    rebind: true,
                    generation: 4
                },
                "{state:?}"
            );
        }
    }

    #[test]
    fn anything_else_is_the_next_generation() {
        let cases = [
            (State::Active, None),
            (State::Active, Some("wrong")),
            (State::DrainOnly, Some("s3cret")),
            (State::Closed, Some("s3cret")),
        ];
        for (state, offered) in cases {
            let r = resume_decision(Some((4, "s3cret", state)), offered);
            assert_eq!(
                r,
                Resume {
                    rebind: false,
                    generation: 5
                },
                "{state:?} {offered:?}"
            );
        }
    }

    #[test]
    fn command_frames_parse_to_their_command() {
        let map = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let revoke = map(json!({"reqId": "r1", "relayDeviceId": "d1"}));
        assert!(matches!(
            parse_command("device-revoke", &revoke),
            Some(Some(Command::Revoke(_)))
        ));
        assert!(matches!(
            parse_command("device-revoke", &map(json!({"v": 1}))),
            Some(None)
        ));
        assert!(parse_command("pong", &revoke).is_none());
        assert!(parse_command("no-such-message", &revoke).is_none());
    }

    #[test]
    fn install_authorization_modes() {
        let auth = |mode: &str| frames::InstallAuthorization {
            mode: mode.into(),
            basis_conn_id: Some("c1".into()),
            direct_auth_id: Some("d1".into()),
        };
        assert_eq!(
            install_auth(&auth("relay-basis")),
            creds::InstallAuth::RelayBasis {
                basis_conn_id: "c1".into()
            }
        );
        assert_eq!(
            install_auth(&auth("authenticated-direct")),
            creds::InstallAuth::AuthenticatedDirect {
                direct_auth_id: "d1".into()
            }
        );
    }

    #[test]
    fn first_frame_failures_shared_by_the_handshake_reads() {
        let code = |f: Option<Fail>| match f {
            Some(Fail::Close(code, _)) => Some(code),
            Some(Fail::Gone) => Some(0),
            Some(Fail::ReleaseThenClose(..)) => Some(1),
            None => None,
        };
        assert_eq!(
            code(first_frame_failure(&First::Oversize)),
            Some(close::MESSAGE_TOO_BIG)
        );
        assert_eq!(
            code(first_frame_failure(&First::Violation(1007))),
            Some(1007)
        );
        assert_eq!(code(first_frame_failure(&First::Gone)), Some(0));
        assert_eq!(code(first_frame_failure(&First::Text("x".into()))), None);
        assert_eq!(code(first_frame_failure(&First::Binary)), None);
        assert_eq!(code(first_frame_failure(&First::Timeout)), None);
    }
}

#[cfg(test)]
mod lease_fence_tests {
    use super::*;

    #[test]
    fn a_session_ends_before_its_lease_could_lapse() {
        let margin = LEASE_FENCE_MARGIN_MS;
        // Renewed at 0: the lease runs to 105 s. A failed renewal 30 s later leaves it alone
        // (healthy renewals, every 30 s, never get near the fence).
        let expires = limits::CONTROL_RENEWAL_REQUEST_MS;
        assert!(!lease_fenced(limits::CONTROL_RENEWAL_INTERVAL_MS, expires));
        assert!(!lease_fenced(expires - margin - 1, expires));
        // Once the next attempt could fail only after the expiry, the session must end.
        assert!(lease_fenced(expires - margin, expires));
        assert!(lease_fenced(expires + 1, expires));
        // The margin covers a tick plus a store call's client-side deadline.
        assert!(margin >= limits::CONTROL_TICK_MS as i64 + 6_000);
        // A fresh activation (90 s lease) whose renewals all fail ends 65 s after it.
        assert!(lease_fenced(
            store::LEASE_TTL_MS - margin,
            store::LEASE_TTL_MS
        ));
    }
}
