//! Idle regional rehome, cell side (docs/reference/http.md): `POST /v1/admin/host-idle-rehome`, the
//! per-host attempt registry with its authority tuples, the idle-work tokens every accept, attach,
//! activation, `auth-refresh` and command holds, the admission gate, commit, reconcile retries and
//! the forced close.
//!
//! The gate and the tokens live under one short std mutex: registering an attempt checks "no token
//! held" and closes the gate in the same critical section, so no new work can slip between the
//! idleness check and the gate (every piece of work takes its token before its first await).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value as Json};
use tokio::sync::watch;
use warp::Filter;

use super::session::retire;
use super::session::State;
use super::Cell;
use crate::clock::now_ms;
use crate::contract::close::{self, reason};
use crate::contract::heartbeat::{BeatFuture, HeartbeatSink};
use crate::contract::limits;
use crate::contract::validate::{is_safe_integer, is_uuid};
use crate::contract::wire::{CellHeartbeat, CellRehomeStatus, Safety};
use crate::http::{self as h, Response};
use crate::logging;
use crate::rehome::rules::{self, RehomeRequest};
use crate::rehome::service::{self, Committed, Reconciled};
use crate::store::assignments::HostKey;

/// The regional rehome protocol this cell implements (advertised in `cell-rehome-status` and
/// runtime status).
pub const PROTOCOL: i64 = 3;
/// Reconcile retries: 100 ms doubling to 5 s while the gate stays closed.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_millis(5_000);

/// [`userId`, `sourceAssignmentEpoch`, `sourceGeneration`, `sourceCellIncarnation`, `targetCellId`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    pub user_id: String,
    pub epoch: i64,
    pub generation: i64,
    pub incarnation: String,
    pub target: String,
}

/// An answer of the route: `outcome` and optional `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub outcome: &'static str,
    pub reason: Option<&'static str>,
}

impl Answer {
    fn of(outcome: &'static str) -> Answer {
        Answer {
            outcome,
            reason: None,
        }
    }
    fn deferred(reason: &'static str) -> Answer {
        Answer {
            outcome: "deferred",
            reason: Some(reason),
        }
    }
    fn json(&self) -> Json {
        match self.reason {
            Some(r) => json!({"v":1,"outcome":self.outcome,"reason":r}),
            None => json!({"v":1,"outcome":self.outcome}),
        }
    }
}

struct Running {
    attempt_id: String,
    authority: Authority,
    done: watch::Receiver<Option<Answer>>,
}

/// Running attempts (the closed gates) and held idle-work tokens, per `relayHostId`.
#[derive(Default)]
pub struct IdleRehome {
    attempts: HashMap<String, Running>,
    tokens: HashMap<String, usize>,
}

/// What registering an attempt found.
enum Register {
    Registered(watch::Sender<Option<Answer>>),
    Busy,
    Await(watch::Receiver<Option<Answer>>),
    Stale,
}

impl IdleRehome {
    fn gate_closed(&self, relay_host_id: &str) -> bool {
        self.attempts.contains_key(relay_host_id)
    }

    fn register(
        &mut self,
        relay_host_id: &str,
        attempt_id: &str,
        authority: &Authority,
        idle: impl FnOnce() -> bool,
    ) -> Register {
        if let Some(r) = self.attempts.get(relay_host_id) {
            return if r.attempt_id != attempt_id {
                Register::Busy
            } else if r.authority == *authority {
                Register::Await(r.done.clone())
            } else {
                Register::Stale
            };
        }
        if self.tokens.get(relay_host_id).is_some_and(|n| *n > 0) || !idle() {
            return Register::Busy;
        }
        let (tx, rx) = watch::channel(None);
        self.attempts.insert(
            relay_host_id.to_string(),
            Running {
                attempt_id: attempt_id.to_string(),
                authority: authority.clone(),
                done: rx,
            },
        );
        Register::Registered(tx)
    }
}

/// Held while a piece of host work (accept, attach, activation, refresh, command) runs; the host is
/// not idle while any is held.
pub struct IdleToken {
    idle: Arc<Mutex<IdleRehome>>,
    relay_host_id: String,
}

impl Drop for IdleToken {
    fn drop(&mut self) {
        let mut g = crate::sync::lock(&self.idle);
        if let Some(n) = g.tokens.get_mut(&self.relay_host_id) {
            *n -= 1;
            if *n == 0 {
                g.tokens.remove(&self.relay_host_id);
            }
        }
    }
}

/// A gate held by [`Cell::hold_idle_gate`]; dropping it reopens the gate.
#[cfg(feature = "test-clock")]
pub struct GateHold {
    cell: Arc<Cell>,
    relay_host_id: String,
    _done: watch::Sender<Option<Answer>>,
}

#[cfg(feature = "test-clock")]
impl Drop for GateHold {
    fn drop(&mut self) {
        self.cell.idle().attempts.remove(&self.relay_host_id);
    }
}

impl Cell {
    fn idle(&self) -> std::sync::MutexGuard<'_, IdleRehome> {
        crate::sync::lock(&self.idle)
    }

    /// True while an idle cutover holds the host's admission gate.
    pub fn idle_gate_closed(&self, key: &HostKey) -> bool {
        self.idle().gate_closed(&key.relay_host_id)
    }

    /// The idle-work token for `key`, or `None` while its gate is closed (the caller refuses).
    pub fn idle_token(&self, key: &HostKey) -> Option<IdleToken> {
        let mut g = self.idle();
        if g.gate_closed(&key.relay_host_id) {
            return None;
        }
        *g.tokens.entry(key.relay_host_id.clone()).or_insert(0) += 1;
        Some(IdleToken {
            idle: self.idle.clone(),
            relay_host_id: key.relay_host_id.clone(),
        })
    }

    /// Closes `key`'s admission gate exactly as a registered attempt does, without a commit,
    /// until the guard drops. Test support only (compiled with the crate's `test-clock` test
    /// feature): it lets P-42 reach the data-leg refusal, which a real attempt only meets in the
    /// race between a `conn-open` and the registration, because registering requires the host to
    /// have no pending connection. `None` when an attempt already holds the gate.
    #[cfg(feature = "test-clock")]
    pub fn hold_idle_gate(self: &Arc<Self>, key: &HostKey, attempt_id: &str) -> Option<GateHold> {
        let authority = Authority {
            user_id: key.user_id.clone(),
            epoch: 0,
            generation: 0,
            incarnation: self.ctx.incarnation.clone(),
            target: String::new(),
        };
        let mut g = self.idle();
        if g.gate_closed(&key.relay_host_id) {
            return None;
        }
        let (tx, rx) = watch::channel(None);
        g.attempts.insert(
            key.relay_host_id.clone(),
            Running {
                attempt_id: attempt_id.to_string(),
                authority,
                done: rx,
            },
        );
        Some(GateHold {
            cell: self.clone(),
            relay_host_id: key.relay_host_id.clone(),
            _done: tx,
        })
    }

    /// The cell's own safety object: real counters of this process's store over the last 30 s.
    pub fn own_safety(&self, now: i64) -> Safety {
        let reading = crate::rehome::store_reading(&self.ctx.db, self.counts.recovery_failures());
        crate::sync::lock(&self.safety).record(now, reading)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Body {
    v: i64,
    attempt_id: String,
    user_id: String,
    relay_host_id: String,
    source_cell_id: String,
    source_cell_incarnation: String,
    source_assignment_epoch: i64,
    source_generation: i64,
    target_cell_id: String,
    cohort_percent: i64,
    director_safety: Safety,
}

/// Strict schema through the one strict decoder (`contract::strict`): an object with exactly the
/// documented keys and types at every depth, no `null` anywhere (also not for the optional safety
/// fields), no duplicate keys; then the documented ranges.
fn parse_body(bytes: &[u8]) -> Option<Body> {
    let b: Body = crate::contract::strict::from_slice(bytes).ok()?;
    let len = |s: &str| (1..=128).contains(&s.chars().count());
    let ok = b.v == 1
        && is_uuid(&b.attempt_id)
        && len(&b.user_id)
        && crate::crypto::ident::is_relay_host_id(&b.relay_host_id)
        && len(&b.source_cell_id)
        && is_uuid(&b.source_cell_incarnation)
        && b.source_assignment_epoch >= 1
        && is_safe_integer(b.source_assignment_epoch)
        && b.source_generation >= 1
        && is_safe_integer(b.source_generation)
        && len(&b.target_cell_id)
        && (0..=100).contains(&b.cohort_percent)
        && rules::safety_valid(&b.director_safety);
    ok.then_some(b)
}

pub fn route(
    cell: Arc<Cell>,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    warp::path!("v1" / "admin" / "host-idle-rehome")
        .and(warp::post())
        .and(warp::header::headers_cloned())
        .and(h::body(limits::RELAY_BODY_MAX))
        .then(move |headers: HeaderMap, body: h::Body| {
            let cell = cell.clone();
            async move { handle(&cell, &headers, body).await }
        })
}

async fn handle(cell: &Arc<Cell>, headers: &HeaderMap, body: h::Body) -> Response {
    let authorized = cell
        .ctx
        .config
        .secrets
        .cluster_key
        .as_deref()
        .zip(h::bearer(headers))
        .and_then(|(k, t)| crate::crypto::jwt::verify_cluster_token(k.as_bytes(), t, now_ms()).ok())
        .is_some_and(|sub| sub == "director");
    if !authorized {
        return h::invalid_token();
    }
    let bytes = match body {
        h::Body::Ok(b) => b,
        h::Body::TooLarge => return h::too_large(),
        h::Body::Broken => return h::bad_request(),
    };
    let Some(b) = parse_body(&bytes) else {
        return h::bad_request();
    };
    if b.source_cell_id != cell.ctx.config.cell_id
        || !b
            .source_cell_incarnation
            .eq_ignore_ascii_case(&cell.ctx.incarnation)
    {
        return h::error(
            StatusCode::CONFLICT,
            "regional_rehome_source_generation_mismatch",
        );
    }
    match run(cell, b).await {
        Ok(a) => h::json(StatusCode::OK, &a.json()),
        Err(()) => h::error_retry(
            StatusCode::SERVICE_UNAVAILABLE,
            crate::contract::errors::DATABASE_TEMPORARILY_UNAVAILABLE,
            5,
        ),
    }
}

/// The attempt the body asks for: the host, the commit request (with this process's
/// incarnation as the source's) and the authority the host's session must hold.
fn attempt_of(cell: &Cell, b: &Body) -> (HostKey, RehomeRequest, Authority) {
    let key = HostKey {
        user_id: b.user_id.clone(),
        relay_host_id: b.relay_host_id.clone(),
    };
    let req = RehomeRequest {
        attempt_id: b.attempt_id.to_ascii_lowercase(),
        user_id: b.user_id.clone(),
        relay_host_id: b.relay_host_id.clone(),
        source_cell_id: b.source_cell_id.clone(),
        source_cell_incarnation: cell.ctx.incarnation.clone(),
        source_assignment_epoch: b.source_assignment_epoch,
        source_generation: b.source_generation,
        target_cell_id: b.target_cell_id.clone(),
    };
    let authority = Authority {
        user_id: b.user_id.clone(),
        epoch: b.source_assignment_epoch,
        generation: b.source_generation,
        incarnation: req.source_cell_incarnation.clone(),
        target: b.target_cell_id.clone(),
    };
    (key, req, authority)
}

/// Steps 1–9; `Err` is a transient store fault outside a running attempt.
async fn run(cell: &Arc<Cell>, b: Body) -> Result<Answer, ()> {
    let now = now_ms();
    // 1. The director's safety must be fresh.
    let age = now - b.director_safety.observed_at;
    if !(0..=rules::DIRECTOR_SAFETY_MAX_AGE_MS).contains(&age) {
        return Ok(Answer::deferred("director-safety-stale"));
    }
    let (key, req, authority) = attempt_of(cell, &b);
    // 2. An attempt already running for the host.
    let running = {
        let g = cell.idle();
        g.attempts.get(&key.relay_host_id).map(|r| {
            if r.attempt_id != req.attempt_id {
                Err("busy")
            } else if r.authority != authority {
                Err("stale")
            } else {
                Ok(r.done.clone())
            }
        })
    };
    match running {
        Some(Err(o)) => return Ok(Answer::of(o)),
        Some(Ok(done)) => return Ok(await_result(done).await),
        None => {}
    }
    // 3. The session must be the exact authority.
    let session = cell.registry().get(&key);
    let current = session.as_ref().and_then(|s| {
        let st = s.lock();
        (st.state == State::Active
            && st.generation == b.source_generation
            && st.epoch == b.source_assignment_epoch)
            .then(|| {
                (
                    st.control.as_ref().is_some_and(|c| c.idle_rehome),
                    st.authority_rev,
                )
            })
    });
    let (Some(session), Some((capable, rev)), false) = (session, current, cell.is_draining())
    else {
        return match service::reconcile(&cell.ctx.db, &req, now).await {
            Ok(Reconciled::Committed) => Ok(Answer::of("committed")),
            Ok(_) => Ok(Answer::of("stale")),
            Err(_) => Err(()),
        };
    };
    // 4. Capability of the socket.
    if !capable {
        return Ok(Answer::deferred("host-unsupported"));
    }
    // 5, 6. Idle (no token held, no active, spliced or pending connection) → the gate closes.
    let registered = cell
        .idle()
        .register(&key.relay_host_id, &req.attempt_id, &authority, || {
            session.lock().load() == 0
        });
    let tx = match registered {
        Register::Registered(tx) => tx,
        Register::Busy => return Ok(Answer::of("busy")),
        Register::Stale => return Ok(Answer::of("stale")),
        Register::Await(done) => return Ok(await_result(done).await),
    };
    // Steps 7–9 run to the end in their own task: the request may go away (the director's 10 s
    // timeout, a dropped connection) while the commit or its reconcile retries are still under
    // way, and the gate must stay closed until the store has answered, then reopen.
    let done = tx.subscribe();
    let (c, k) = (cell.clone(), key.clone());
    cell.ctx.spawn("cell-idle-rehome-attempt", async move {
        settle(&c, &k, &req, &b, &session, rev, tx).await;
    });
    Ok(await_result(done).await)
}

/// Steps 7–9 of a registered attempt; sends the answer to every waiter when the gate reopens.
async fn settle(
    cell: &Arc<Cell>,
    key: &HostKey,
    req: &RehomeRequest,
    b: &Body,
    session: &Arc<super::session::Session>,
    rev: u64,
    tx: watch::Sender<Option<Answer>>,
) {
    // 7. Commit with the merged safety, reconciling a deferral or an unknown outcome.
    let safety = rules::merge_safety(&b.director_safety, &cell.own_safety(now_ms()));
    let answer = commit_and_settle(cell, req, &safety, b.cohort_percent).await;
    // 8. Forced close unless an unchanged session was deferred.
    let still_current = cell.registry().get(key).is_some_and(|s| s.id == session.id);
    if still_current {
        let rev_now = session.lock().authority_rev;
        if answer.outcome != "deferred" || cell.is_draining() || rev_now != rev {
            retire(
                cell,
                session,
                (close::DRAINING, reason::RESOLVE_CONFIGURED_DIRECTOR),
            );
        }
    }
    logging::event(
        "orca_relay_idle_rehome_source_outcome",
        json!({"attemptId": req.attempt_id, "host": logging::digest(&key.relay_host_id),
            "outcome": answer.outcome, "reason": answer.reason, "targetCellId": req.target_cell_id}),
    );
    // 9. The gate reopens.
    cell.idle().attempts.remove(&key.relay_host_id);
    let _ = tx.send(Some(answer));
}

/// The answer of the running attempt with the same id and authority.
async fn await_result(mut done: watch::Receiver<Option<Answer>>) -> Answer {
    let a = done.wait_for(Option::is_some).await.map(|a| a.clone());
    a.ok().flatten().unwrap_or(Answer::of("stale"))
}

async fn commit_and_settle(
    cell: &Arc<Cell>,
    req: &RehomeRequest,
    safety: &Safety,
    cohort_percent: i64,
) -> Answer {
    let db = &cell.ctx.db;
    match service::commit(db, req, safety, cohort_percent, now_ms()).await {
        Ok((Committed::Committed, events)) => {
            log_events(events);
            Answer::of("committed")
        }
        Ok((Committed::Stale, _)) => Answer::of("stale"),
        Ok((Committed::Deferred(why), events)) => {
            log_events(events);
            match reconcile_until_answered(cell, req).await {
                Reconciled::NotCommitted => Answer::deferred(why),
                Reconciled::Committed => Answer::of("committed"),
                Reconciled::Stale => Answer::of("stale"),
            }
        }
        Err(e) => {
            log::warn!("[orca-relay] idle rehome commit failed, reconciling: {e}");
            match reconcile_until_answered(cell, req).await {
                Reconciled::NotCommitted => Answer::of("deferred"),
                Reconciled::Committed => Answer::of("committed"),
                Reconciled::Stale => Answer::of("stale"),
            }
        }
    }
}

/// Reconcile, retried 100 ms doubling to 5 s until the store answers; the gate stays closed.
async fn reconcile_until_answered(cell: &Arc<Cell>, req: &RehomeRequest) -> Reconciled {
    let mut wait = RETRY_FIRST;
    loop {
        match service::reconcile(&cell.ctx.db, req, now_ms()).await {
            Ok(a) => return a,
            Err(e) => {
                log::warn!(
                    "[orca-relay] idle rehome reconcile failed attemptId={} error={e}",
                    req.attempt_id
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
}

fn log_events(events: Vec<service::Event>) {
    for (name, fields) in events {
        logging::event(name, fields);
    }
}

/// Wraps the heartbeat sink: after each successful beat, the cell's `cell-rehome-status` with
/// protocol 3 and its own safety over the last 30 s (docs/reference/http.md).
pub struct StatusAfterBeat {
    pub inner: Arc<dyn HeartbeatSink>,
    pub cell: std::sync::Weak<Cell>,
}

impl HeartbeatSink for StatusAfterBeat {
    fn beat<'a>(&'a self, body: &'a CellHeartbeat) -> BeatFuture<'a> {
        Box::pin(async move {
            self.inner.beat(body).await?;
            let Some(cell) = self.cell.upgrade() else {
                return Ok(());
            };
            let status = CellRehomeStatus {
                v: 1,
                cell_id: body.cell_id.clone(),
                cell_incarnation: body.cell_incarnation.clone(),
                regional_rehome_protocol: PROTOCOL,
                safety: cell.own_safety(now_ms()),
            };
            if let Err(reason) = self.inner.rehome_status(&status).await {
                log::warn!("[orca-relay] cell heartbeat failed {reason}");
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(g: i64) -> Authority {
        Authority {
            user_id: "u".into(),
            epoch: 1,
            generation: g,
            incarnation: "i".into(),
            target: "C".into(),
        }
    }

    /// One attempt per host: another id is `busy`, the same id and authority awaits, the same id
    /// with another authority is `stale`; a held token or a non-idle session is `busy`.
    #[test]
    fn registry_rules() {
        let mut r = IdleRehome::default();
        let Register::Registered(_tx) = r.register("h", "a1", &auth(1), || true) else {
            panic!("first registers");
        };
        assert!(r.gate_closed("h"));
        assert!(matches!(
            r.register("h", "a2", &auth(1), || true),
            Register::Busy
        ));
        assert!(matches!(
            r.register("h", "a1", &auth(1), || true),
            Register::Await(_)
        ));
        assert!(matches!(
            r.register("h", "a1", &auth(2), || true),
            Register::Stale
        ));
        let mut r = IdleRehome::default();
        r.tokens.insert("h".into(), 1);
        assert!(matches!(
            r.register("h", "a1", &auth(1), || true),
            Register::Busy
        ));
        assert!(!r.gate_closed("h"));
        let mut r = IdleRehome::default();
        assert!(matches!(
            r.register("h", "a1", &auth(1), || false),
            Register::Busy
        ));
    }

    #[test]
    fn strict_body() {
        let ok = json!({"v":1,"attemptId":"0a1c5a9b-197b-4ea8-b6f1-f3bcaa3d712c","userId":"u",
            "relayHostId":"abcdefghijklmnop","sourceCellId":"A","sourceCellIncarnation":"0a1c5a9b-197b-4ea8-b6f1-f3bcaa3d712c",
            "sourceAssignmentEpoch":1,"sourceGeneration":1,"targetCellId":"C","cohortPercent":100,
            "directorSafety":{"observedAt":1,"sqlFailures":0,"reconnects":0,"controlActivityRecoveryFailures":0,
            "databasePoolWaiting":0,"databasePoolWaitersMax":0,"databasePoolWaitMsMax":0}});
        assert!(parse_body(ok.to_string().as_bytes()).is_some());
        let mut bad = vec![json!([]), json!(null)];
        for (k, v) in [
            ("attemptId", json!("nope")),
            ("userId", json!("")),
            ("relayHostId", json!("short")),
            ("sourceAssignmentEpoch", json!(0)),
            ("sourceGeneration", json!(1.5)),
            ("cohortPercent", json!(101)),
            ("targetCellId", json!(null)),
            ("extra", json!(1)),
        ] {
            let mut b = ok.clone();
            b[k] = v;
            bad.push(b);
        }
        let mut s = ok.clone();
        s["directorSafety"]["databasePoolTotal"] = json!(null);
        bad.push(s);
        let mut s = ok.clone();
        s["directorSafety"]["databasePoolWaiting"] = json!(101);
        bad.push(s);
        let mut s = ok.clone();
        s["directorSafety"]["x"] = json!(1);
        bad.push(s);
        let mut s = ok.clone();
        s["directorSafety"] = json!([]);
        bad.push(s);
        for b in bad {
            assert!(parse_body(b.to_string().as_bytes()).is_none(), "{b}");
        }
    }
}
