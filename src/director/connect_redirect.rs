//! `/v1/connect/<relayHostId>` on a process that runs the director but not the cell: the invite
//! redirect of protocol.md §5.5.
//!
//! A phone holding an invite dials the director it was configured with; the director answers with
//! the host's cell (`relay-moved`) and closes 4503 so the phone redials there. Only upgrade gates
//! 1, 2 and 4 and the first-frame rules apply; the invite is resolved, never reserved, so a phone
//! bouncing through here costs the invite no attempt.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use hyper::body::Incoming;
use serde_json::json;

use super::Director;
use crate::cell::admission::PreAuth;
use crate::cell::frames::{self, Split};
use crate::cell::legs::percent_decode;
use crate::cell::ws::{self, First, Leg};
use crate::contract::close::{self, reason};
use crate::contract::limits;
use crate::crypto::ident::is_relay_host_id;
use crate::http::Response;
use crate::store::assignments::HostKey;
use crate::store::credentials::{self, Resolved};
use crate::store::placement::{self, AssignOptions};

/// Pre-auth admission of the director's phone sockets (gate 4), per process.
#[derive(Default)]
pub struct RedirectAdmission(Mutex<PreAuth>);

impl RedirectAdmission {
    fn lock(&self) -> std::sync::MutexGuard<'_, PreAuth> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

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
    let Some(key) = ws::ws_key(&req) else {
        return crate::http::error(StatusCode::NOT_FOUND, crate::contract::errors::NOT_FOUND);
    };
    if !ws::valid_key(&key) {
        return ws::refuse(StatusCode::BAD_REQUEST);
    }
    if d.ctx.shutting_down() {
        return ws::refuse(StatusCode::SERVICE_UNAVAILABLE);
    }
    // Gate 1: any query string.
    if req.uri().query().is_some() {
        return ws::refuse(StatusCode::BAD_REQUEST);
    }
    // Gate 2: the percent-decoded id must be a RelayHostId.
    let relay_host_id = req
        .uri()
        .path()
        .strip_prefix("/v1/connect/")
        .and_then(percent_decode)
        .filter(|id| is_relay_host_id(id));
    let Some(relay_host_id) = relay_host_id else {
        return ws::refuse(StatusCode::TOO_MANY_REQUESTS);
    };
    // Gate 4: pre-auth admission by source.
    let source = crate::http::client_source(peer, req.headers(), d.ctx.config.trusted_proxy_hops);
    if !d
        .redirect_admission
        .lock()
        .try_admit(&source, crate::clock::now_ms(), true)
    {
        return ws::refuse(StatusCode::TOO_MANY_REQUESTS);
    }
    let (resp, sock) = ws::accept(&mut req, &key, Leg::Phone);
    let d = d.clone();
    tokio::spawn(async move {
        let Some(mut socket) = sock.await else {
            d.redirect_admission.lock().leave(&source);
            return;
        };
        let first =
            ws::first_frame(&mut socket, Duration::from_millis(limits::FIRST_FRAME_MS)).await;
        d.redirect_admission.lock().leave(&source);
        let text = match first {
            First::Text(t) => t,
            First::Binary => {
                return ws::close(
                    &mut socket,
                    close::BAD_OUTER_CREDENTIAL,
                    reason::FIRST_FRAME_MUST_BE_TEXT,
                )
                .await
            }
            First::Timeout => {
                return ws::close(
                    &mut socket,
                    close::BAD_OUTER_CREDENTIAL,
                    reason::FIRST_FRAME_TIMEOUT,
                )
                .await
            }
            First::Oversize => return ws::close(&mut socket, close::MESSAGE_TOO_BIG, "").await,
            First::Violation(code) => {
                return ws::close(&mut socket, code, ws::violation_reason(code)).await
            }
            First::Gone => return,
        };
        let answer = match parse(&text) {
            None => Answer::Reject(reason::INVALID_RELAY_AUTH),
            Some(credential) => decide(&d, &relay_host_id, &credential).await,
        };
        match answer {
            Answer::Moved { cell_url, epoch } => {
                let moved = json!({"type": "relay-moved", "v": 1, "cellUrl": cell_url, "assignmentEpoch": epoch});
                if ws::send_json(&mut socket, &moved).await {
                    ws::close(
                        &mut socket,
                        close::DRAINING,
                        reason::CONNECT_TO_ASSIGNED_CELL,
                    )
                    .await;
                }
            }
            Answer::Reject(why) => {
                let hello = json!({"type": "relay-hello", "ok": false, "code": close::BAD_OUTER_CREDENTIAL});
                if ws::send_json(&mut socket, &hello).await {
                    ws::close(&mut socket, close::BAD_OUTER_CREDENTIAL, why).await;
                }
            }
            Answer::Unavailable => {
                ws::close(
                    &mut socket,
                    close::LIMIT_EXCEEDED,
                    reason::RELAY_TEMPORARILY_UNAVAILABLE,
                )
                .await
            }
        }
    });
    resp
}

/// The credential of a strict `relay-auth` frame.
fn parse(text: &str) -> Option<String> {
    match frames::split(text) {
        Split::Typed(t, m) if t == "relay-auth" => {
            frames::body::<frames::RelayAuth>(m).map(|a| a.credential)
        }
        _ => None,
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

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn relay_auth_is_strict() {
        let cred = "BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU";
        let ok = format!(r#"{{"type":"relay-auth","v":1,"mode":"connect","credential":"{cred}"}}"#);
        assert_eq!(parse(&ok).as_deref(), Some(cred));
        assert_eq!(parse(r#"{"type":"relay-auth"}"#), None);
        assert_eq!(parse("nope"), None);
        let extra = format!(
            r#"{{"type":"relay-auth","v":1,"mode":"connect","credential":"{cred}","x":1}}"#
        );
        assert_eq!(parse(&extra), None);
    }
}
