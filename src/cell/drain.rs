//! Drain and shutdown (docs/operations.md): `POST /v1/admin/drain` (paced telling, forced close at
//! the grace) and SIGTERM (grace `ORCA_RELAY_SHUTDOWN_GRACE_MS`, default 0).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::json;
use warp::Filter;

use super::session::retire;
use super::session::{ControlOut, Session, State};
use super::Cell;
use crate::contract::close::{self, reason};
use crate::contract::limits;
use crate::http::{self as h, Response};
use crate::logging;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DrainBody {
    v: u64,
    grace_ms: u64,
    #[serde(default)]
    pace_window_ms: Option<u64>,
}

pub fn route(
    cell: Arc<Cell>,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    warp::path!("v1" / "admin" / "drain")
        .and(warp::post())
        .and(warp::header::headers_cloned())
        .and(h::body(limits::RELAY_BODY_MAX))
        .map(move |headers: HeaderMap, body: h::Body| handle(&cell, &headers, body))
}

/// The body checks of `POST /v1/admin/drain`: `(graceMs, paceWindowMs)` or `400`. Also the fuzzing
/// entry of `fuzz/fuzz_targets/admin_bodies.rs`.
pub fn decode(bytes: &[u8]) -> Result<(u64, u64), Response> {
    let b: DrainBody = h::parse(bytes)?;
    let pace = b.pace_window_ms.unwrap_or(0);
    if b.v != 1 || b.grace_ms > limits::DRAIN_GRACE_MAX_MS || pace > limits::DRAIN_PACE_MAX_MS {
        return Err(h::bad_request());
    }
    Ok((b.grace_ms, pace))
}

fn handle(cell: &Arc<Cell>, headers: &HeaderMap, body: h::Body) -> Response {
    if !h::is_admin(headers, cell.ctx.config.secrets.admin_token.as_deref()) {
        return h::invalid_token();
    }
    let bytes = match body {
        h::Body::Ok(b) => b,
        h::Body::TooLarge => return h::too_large(),
        h::Body::Broken => return h::bad_request(),
    };
    let (grace_ms, pace) = match decode(&bytes) {
        Ok(b) => b,
        Err(r) => return r,
    };
    start(cell, grace_ms, pace);
    h::json(StatusCode::OK, &json!({"ok": true, "paceWindowMs": pace}))
}

/// Starts a drain: targets = sessions not closed, in creation order; the i-th of n is told at
/// round(i·P/(n−1)) ms. A later drain cancels this one's pending sends and closes.
pub fn start(cell: &Arc<Cell>, grace_ms: u64, pace_ms: u64) -> Vec<Arc<Session>> {
    let epoch = cell.drain_epoch.fetch_add(1, Ordering::SeqCst) + 1;
    // `draining` is set under the registry lock, where an activation installs its session after
    // checking it (control.rs): a session installed before this point is a target, any later
    // activation is refused.
    let mut targets: Vec<Arc<Session>> = {
        let registry = cell.registry();
        cell.draining.store(true, Ordering::SeqCst);
        registry
            .sessions
            .values()
            .filter(|s| s.lock().state != State::Closed)
            .cloned()
            .collect()
    };
    targets.sort_by_key(|s| s.id);
    // Sessions already orphaned can no longer be rebound either (activations are refused from
    // now on): their control leases go now, the sessions wait for their grace or forced close.
    for s in &targets {
        let mut st = s.lock();
        if st.state == State::Orphaned && !st.activity_id.is_empty() {
            let activity = std::mem::take(&mut st.activity_id);
            drop(st);
            cell.release_activity(&s.key, activity);
        }
    }
    let n = targets.len();
    for (i, s) in targets.iter().enumerate() {
        let at = if n <= 1 || pace_ms == 0 {
            0
        } else {
            ((i as f64) * (pace_ms as f64) / ((n - 1) as f64)).round() as u64
        };
        if at == 0 && grace_ms == 0 {
            // Told and closed at once (SIGTERM with no grace): done before this returns, so the
            // releases are on the process tracker before shutdown waits for it.
            tell(s, 0);
            forced_close(cell, s);
            continue;
        }
        let cell = cell.clone();
        let s = s.clone();
        tokio::spawn(async move {
            if at > 0 {
                tokio::time::sleep(Duration::from_millis(at)).await;
            }
            if cell.drain_epoch.load(Ordering::SeqCst) != epoch {
                return;
            }
            tell(&s, grace_ms);
            tokio::time::sleep(Duration::from_millis(grace_ms)).await;
            if cell.drain_epoch.load(Ordering::SeqCst) != epoch {
                return;
            }
            forced_close(&cell, &s);
        });
    }
    targets
}

/// step 3.
fn tell(s: &Session, grace_ms: u64) {
    let mut st = s.lock();
    if st.state == State::Closed {
        return;
    }
    st.authority_rev += 1;
    st.state = State::DrainOnly;
    st.drain_sent = true;
    if let Some(c) = &st.control {
        c.send(ControlOut::Frame(
            json!({"type":"drain","graceMs":grace_ms,"recovery":"resolve-director"}).to_string(),
        ));
    }
}

/// step 4.
fn forced_close(cell: &Cell, s: &Session) {
    {
        let st = s.lock();
        if st.state == State::Closed {
            return;
        }
        if st.load() > 0 {
            logging::event(
                "orca_relay_host_drain_forced_close",
                json!({"host": logging::digest(&s.key.relay_host_id), "splices": st.active.len(), "pending": st.pending.len()}),
            );
        }
    }
    retire(
        cell,
        s,
        (close::DRAINING, reason::RESOLVE_CONFIGURED_DIRECTOR),
    );
}

/// SIGTERM: drain with the shutdown grace, then wait (bounded) for sockets to finish closing.
pub async fn shutdown(cell: &Arc<Cell>) {
    let grace = cell
        .ctx
        .config
        .shutdown_grace_ms
        .min(limits::SHUTDOWN_EXIT_MS - 3_000);
    start(cell, grace, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(grace + 2_000);
    while tokio::time::Instant::now() < deadline {
        let busy = cell.counts.controls.load(Ordering::Relaxed) > 0
            || cell.counts.splices.load(Ordering::Relaxed) > 0;
        if !busy {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
