//! The upgrade gates every leg endpoint shares (docs/reference/websocket.md), in the table's order: the cell's
//! three legs and the director's invite redirect ("gates 1, 2, 4") run the same code.

use std::net::SocketAddr;

use http::{HeaderValue, StatusCode};
use hyper::body::Incoming;

use super::admission::PreAuthGate;
use super::path::{self, Named};
use super::ws;
use crate::http::Response;

/// The leg a request passed the pre-gates for, with its decoded id.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Control,
    /// `connId` of `/v1/host/data/<connId>`.
    Data(String),
    /// `relayHostId` of `/v1/connect/<relayHostId>`.
    Phone(String),
}

/// A request the pre-gates turned away: `reason` names the gate for
/// `orca_relay_admission_rejections_total` (`None`: not an upgrade at all, a plain 404).
pub struct Refusal {
    pub reason: Option<&'static str>,
    pub response: Response,
}

/// A WebSocket upgrade that passed gates 1 and 2.
pub struct Upgrade {
    /// `Sec-WebSocket-Key`, for the 101 answer.
    pub key: HeaderValue,
    pub target: Target,
}

/// The gates before any role-specific one: a plain HTTP request to a leg path is an unknown route
/// (404 JSON); a process shutting down refuses 503; gate 1 refuses any query string (even `?`,
/// 400); gate 2 decodes the path (404 for an unknown path, 429 for an invalid id).
pub fn pre_gates(req: &http::Request<Incoming>, shutting_down: bool) -> Result<Upgrade, Refusal> {
    let Some(key) = ws::ws_key(req) else {
        return Err(Refusal {
            reason: None,
            response: crate::http::error(StatusCode::NOT_FOUND, crate::contract::errors::NOT_FOUND),
        });
    };
    let refuse = |reason, status| {
        Err(Refusal {
            reason: Some(reason),
            response: ws::refuse(status),
        })
    };
    // RFC 6455: a key that is not base64 of 16 bytes (an empty one included) is a bad
    // handshake, 400, never a 101.
    if !ws::valid_key(&key) {
        return refuse("bad_handshake", StatusCode::BAD_REQUEST);
    }
    if shutting_down {
        return refuse("shutting_down", StatusCode::SERVICE_UNAVAILABLE);
    }
    if req.uri().query().is_some() {
        return refuse("query_string", StatusCode::BAD_REQUEST);
    }
    let target = match path::named(req.uri().path()) {
        Named::Other => return refuse("unknown_path", StatusCode::NOT_FOUND),
        Named::Phone(None) | Named::Data(None) => {
            return refuse("invalid_id", StatusCode::TOO_MANY_REQUESTS)
        }
        Named::Control => Target::Control,
        Named::Data(Some(id)) => Target::Data(id),
        Named::Phone(Some(id)) => Target::Phone(id),
    };
    Ok(Upgrade { key, target })
}

/// Gate 4 of phone and data legs: admits the request's source into `gate` if the pre-auth
/// rules and `capacity_ok` (the open-connection rule, decided by the caller) hold. An admitted
/// source counts as awaiting a first frame until [`PreAuthGate::leave`].
pub fn pre_auth(
    gate: &PreAuthGate,
    req: &http::Request<Incoming>,
    peer: SocketAddr,
    trusted_proxy_hops: usize,
    capacity_ok: bool,
) -> Option<String> {
    let source = crate::http::client_source(peer, req.headers(), trusted_proxy_hops);
    gate.admit(&source, crate::clock::now_ms(), capacity_ok)
        .then_some(source)
}
