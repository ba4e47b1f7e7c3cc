//! `POST /v1/host-token` (docs/reference/http.md): mints a self-hosted HS256 host token for a desktop that
//! holds the self-hosted key. Every answer carries `Cache-Control: no-store`.

use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use warp::Filter;

use super::Director;
use crate::contract::limits::RELAY_BODY_MAX;
use crate::crypto;
use crate::http::{self as h, Body, Response};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Request {
    relay_host_id: String,
    host_public_key_b64: String,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    v: Option<u8>,
}

pub fn route(
    dir: Arc<Director>,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    warp::path!("v1" / "host-token")
        .and(warp::post())
        .and(warp::header::headers_cloned())
        .and(h::body(RELAY_BODY_MAX))
        .then(move |headers: HeaderMap, body: Body| {
            let dir = dir.clone();
            async move { h::no_store(handle(&dir, &headers, body)) }
        })
}

/// The self-hosted key check: SHA-256 of both sides compared in constant time, so neither the
/// length nor a prefix of the configured key leaks through timing.
fn key_matches(given: Option<&str>, configured: Option<&str>) -> bool {
    match (given, configured) {
        (Some(g), Some(c)) if g.len() <= 256 => {
            crypto::ct::ct_eq(&Sha256::digest(g.as_bytes()), &Sha256::digest(c.as_bytes()))
        }
        _ => false,
    }
}

/// The body checks of `POST /v1/host-token` (strict schema, `v`, key and id binding, `userId`
/// length), before any token is minted: `(relayHostId, userId)` or the route's `400`. Also the
/// fuzzing entry of `fuzz/fuzz_targets/relay_bodies.rs`.
pub fn decode_request(bytes: &[u8]) -> Result<(String, String), Response> {
    let req: Request = h::parse(bytes)?;
    if req.v.is_some_and(|v| v != 1) {
        return Err(h::bad_request());
    }
    let key = crypto::b64::decode_key32(&req.host_public_key_b64).ok_or_else(h::bad_request)?;
    if crypto::ident::relay_host_id(&key) != req.relay_host_id {
        return Err(h::bad_request());
    }
    let user_id = match req.user_id {
        Some(u) if (1..=128).contains(&u.chars().count()) => u,
        Some(_) => return Err(h::bad_request()),
        None => "self-hosted".to_string(),
    };
    Ok((req.relay_host_id, user_id))
}

fn handle(dir: &Director, headers: &HeaderMap, body: Body) -> Response {
    let cfg = &dir.ctx.config;
    if !key_matches(h::bearer(headers), cfg.secrets.self_hosted_key.as_deref()) {
        return h::invalid_token();
    }
    let bytes = match body {
        Body::Ok(b) => b,
        Body::TooLarge => return h::too_large(),
        Body::Broken => return h::bad_request(),
    };
    let (relay_host_id, user_id) = match decode_request(&bytes) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let (token, expires_at) = crypto::jwt::mint_host_token(
        &dir.host_token_key,
        &user_id,
        &cfg.public_url,
        &relay_host_id,
        crate::clock::now_ms(),
    );
    h::json(
        StatusCode::OK,
        &serde_json::json!({ "relayToken": token, "expiresAt": expires_at }),
    )
}
