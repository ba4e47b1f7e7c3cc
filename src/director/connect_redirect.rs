//! `/v1/connect/<relayHostId>` on a process that runs the director but not the cell: the invite
//! redirect of docs/reference/websocket.md.
//!
//! A phone holding an invite dials the director it was configured with; the director answers with
//! the host's cell (`relay-moved`) and closes 4503 so the phone redials there. Only upgrade gates
//! 1, 2 and 4 and the first-frame rules apply; the invite is resolved, never reserved, so a phone
//! bouncing through here costs the invite no attempt.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use hyper::body::Incoming;
use serde_json::json;

use super::assign::{self as placement, AssignOptions};
use super::Director;
use crate::contract::close::{self, reason};
use crate::contract::limits;
use crate::http::Response;
use crate::leg::admission::PreAuthGate;
use crate::leg::frame;
use crate::leg::ws::{self, First, Leg};
use crate::leg::{pre_auth, pre_gates, Target, Upgrade};
use crate::store::assignments::HostKey;
use crate::store::credentials::{self, Resolved};

/// Pre-auth admission of the director's phone sockets (gate 4), per process.
pub type RedirectAdmission = PreAuthGate;

/// What the phone is told after its `relay-auth`.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Moved {
        cell_url: String,
        epoch: i64,
    },
    /// `relay-hello {ok:false, code:4401}` then 4401 with this reason.
    Reject(&'static str),
    /// Close 4429 `relay temporarily unavailable` (placement or store failure).
    Unavailable,
}

pub async fn handle(
    d: &Arc<Director>,
    mut req: http::Request<Incoming>,
    peer: SocketAddr,
) -> Response {
    let Upgrade { key, target } = match pre_gates(&req, d.ctx.shutting_down()) {
        Ok(u) => u,
        Err(refusal) => return refusal.response,
    };
    // The server routes only `/v1/connect/…` here; the host legs are the cell's.
    let Target::Phone(relay_host_id) = target else {
        return ws::refuse(StatusCode::NOT_FOUND);
    };
    // Gate 4: pre-auth admission by source (no connection ledger on a director).
    let Some(source) = pre_auth(
        &d.redirect_admission,
        &req,
        peer,
        d.ctx.config.trusted_proxy_hops,
        true,
    ) else {
        return ws::refuse(StatusCode::TOO_MANY_REQUESTS);
    };
    let (resp, sock) = ws::accept(&mut req, &key, Leg::Phone);
    let d = d.clone();
    tokio::spawn(async move {
        let Some(mut socket) = sock.await else {
            d.redirect_admission.leave(&source);
            return;
        };
        let first =
            ws::first_frame(&mut socket, Duration::from_millis(limits::FIRST_FRAME_MS)).await;
        d.redirect_admission.leave(&source);
        let Some(text) = redirect_first_text(&mut socket, first).await else {
            return;
        };
        let answer = match frame::relay_auth(&text) {
            None => Answer::Reject(reason::INVALID_RELAY_AUTH),
            Some(auth) => decide(&d, &relay_host_id, &auth.credential).await,
        };
        send_answer(&mut socket, answer).await;
    });
    resp
}

/// The phone's first frame as text; anything else closes it.
async fn redirect_first_text(socket: &mut ws::Ws, first: First) -> Option<String> {
    match first {
        First::Text(t) => Some(t),
        First::Binary => {
            ws::close(
                socket,
                close::BAD_OUTER_CREDENTIAL,
                reason::FIRST_FRAME_MUST_BE_TEXT,
            )
            .await;
            None
        }
        First::Timeout => {
            ws::close(
                socket,
                close::BAD_OUTER_CREDENTIAL,
                reason::FIRST_FRAME_TIMEOUT,
            )
            .await;
            None
        }
        First::Oversize => {
            ws::close(socket, close::MESSAGE_TOO_BIG, "").await;
            None
        }
        First::Violation(code) => {
            ws::close(socket, code, ws::violation_reason(code)).await;
            None
        }
        First::Gone => None,
    }
}

/// Sends the phone its answer: `relay-moved` to its assigned cell, a refused `relay-hello`, or
/// the temporary-unavailable close.
async fn send_answer(socket: &mut ws::Ws, answer: Answer) {
    match answer {
        Answer::Moved { cell_url, epoch } => {
            let moved = json!({"type": "relay-moved", "v": 1, "cellUrl": cell_url, "assignmentEpoch": epoch});
            if ws::send_json(socket, &moved).await {
                ws::close(socket, close::DRAINING, reason::CONNECT_TO_ASSIGNED_CELL).await;
            }
        }
        Answer::Reject(why) => {
            let hello =
                json!({"type": "relay-hello", "ok": false, "code": close::BAD_OUTER_CREDENTIAL});
            if ws::send_json(socket, &hello).await {
                ws::close(socket, close::BAD_OUTER_CREDENTIAL, why).await;
            }
        }
        Answer::Unavailable => {
            ws::close(
                socket,
                close::LIMIT_EXCEEDED,
                reason::RELAY_TEMPORARILY_UNAVAILABLE,
            )
            .await
        }
    }
}

/// An invite that resolves gets its host's assignment (placing the host if it has none); a resume
/// token or anything unknown is an invalid invite here (resume holders use `POST /v1/resolve`).
async fn decide(d: &Director, relay_host_id: &str, credential: &str) -> Answer {
    let db = &d.ctx.db;
    let now = crate::clock::now_ms();
    let user_id = match credentials::resolve(db, relay_host_id, credential, now).await {
        Ok(Some(r @ Resolved::Invite { .. })) => r.user_id().to_owned(),
        Ok(_) => return Answer::Reject(reason::INVALID_INVITE),
        Err(_) => return Answer::Unavailable,
    };
    let host = HostKey {
        user_id,
        relay_host_id: relay_host_id.to_owned(),
    };
    match crate::store::assignments::resolve_assignment(db, &host).await {
        Ok(Some(a)) => Answer::Moved {
            cell_url: a.cell_url,
            epoch: a.assignment_epoch,
        },
        Ok(None) => match placement::assign(
            db,
            &host,
            None,
            &d.ctx.config.regions,
            AssignOptions::default(),
        )
        .await
        {
            Ok(g) => Answer::Moved {
                cell_url: g.cell_url,
                epoch: g.assignment_epoch,
            },
            Err(_) => Answer::Unavailable,
        },
        Err(_) => Answer::Unavailable,
    }
}
