//! Thin HTTP glue shared by every role: JSON replies and errors, bounded bodies, strict parsing,
//! bearer extraction and the client-source rule.
//!
//! Handlers never reject through warp's rejection machinery: every route answers a concrete
//! [`Response`], so the status, `error` string and headers are exactly the spec's.

use std::net::SocketAddr;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use warp::Filter;

pub use warp::reply::Response;

use crate::contract::errors;

/// The TCP peer of the connection, inserted by the server for every request.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Extracts the peer address (falls back to 0.0.0.0:0 when absent, e.g. in `warp::test`).
pub fn peer() -> impl Filter<Extract = (SocketAddr,), Error = std::convert::Infallible> + Clone {
    warp::ext::optional::<PeerAddr>()
        .map(|p: Option<PeerAddr>| p.map(|p| p.0).unwrap_or(([0, 0, 0, 0], 0).into()))
}

/// `200` with a JSON body.
pub fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let mut r = Response::new(serde_json::to_vec(body).unwrap_or_default().into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `{"error":"<code>"}` with `status`.
pub fn error(status: StatusCode, code: &str) -> Response {
    json(status, &serde_json::json!({ "error": code }))
}

/// `{"error":"<code>"}` with `status` and `Retry-After: <secs>`.
pub fn error_retry(status: StatusCode, code: &str, retry_after_s: u64) -> Response {
    let mut r = error(status, code);
    r.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after_s));
    r
}

/// An empty response with `status`.
pub fn empty(status: StatusCode) -> Response {
    let mut r = Response::default();
    *r.status_mut() = status;
    r
}

pub fn bad_request() -> Response {
    error(StatusCode::BAD_REQUEST, errors::INVALID_REQUEST)
}

pub fn invalid_token() -> Response {
    error(StatusCode::UNAUTHORIZED, errors::INVALID_TOKEN)
}

pub fn too_large() -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, errors::REQUEST_TOO_LARGE)
}

/// `503 {"error":"shutting_down"}` with `Retry-After: 1`.
pub fn shutting_down() -> Response {
    error_retry(StatusCode::SERVICE_UNAVAILABLE, errors::SHUTTING_DOWN, 1)
}

/// Adds `Cache-Control: no-store`.
pub fn no_store(mut r: Response) -> Response {
    r.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    r
}

/// A request body read up to a limit.
pub enum Body {
    Ok(Bytes),
    /// More than the limit was declared or read.
    TooLarge,
    /// The client broke off while sending.
    Broken,
}

/// Reads the body, counting bytes actually read (chunked included) and refusing a larger declared
/// `Content-Length` unread; a body not complete within `BODY_READ_MS` counts as broken off (the
/// unread rest makes hyper close the connection after the answer). Never rejects.
pub fn body(limit: usize) -> impl Filter<Extract = (Body,), Error = warp::Rejection> + Clone {
    warp::header::optional::<u64>("content-length")
        .and(warp::body::stream())
        .then(move |len: Option<u64>, stream| async move {
            if len.is_some_and(|n| n > limit as u64) {
                return Body::TooLarge;
            }
            let deadline = std::time::Duration::from_millis(crate::contract::limits::BODY_READ_MS);
            tokio::time::timeout(deadline, read_limited(stream, limit))
                .await
                .unwrap_or(Body::Broken)
        })
}

async fn read_limited<S, B>(stream: S, limit: usize) -> Body
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    futures_util::pin_mut!(stream);
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let mut chunk = match chunk {
            Ok(c) => c,
            Err(_) => return Body::Broken,
        };
        if buf.len() + chunk.remaining() > limit {
            return Body::TooLarge;
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            buf.extend_from_slice(part);
            let n = part.len();
            chunk.advance(n);
        }
    }
    Body::Ok(buf.freeze())
}

/// Parses a body with the strict decoder ([`crate::contract::strict`]: an object with exactly
/// the documented keys, no `null`, no duplicates) or answers `400 invalid_request`.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Response> {
    crate::contract::strict::from_slice(bytes).map_err(|_| bad_request())
}

/// The bearer of a relay route: `Authorization` matching `^Bearer ([^\s]+)$`, else `None`.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let v = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let s = v.to_str().ok()?;
    let token = s.strip_prefix("Bearer ")?;
    if token.is_empty() || token.chars().any(char::is_whitespace) {
        return None;
    }
    Some(token)
}

/// The client source of docs/reference/websocket.md / docs/reference/http.md: with `hops` = 0 the peer IP; otherwise the
/// `hops`-th `X-Forwarded-For` entry from the right (as text), or the peer IP when too few.
pub fn client_source(peer: SocketAddr, headers: &HeaderMap, hops: usize) -> String {
    if hops > 0 {
        let entries: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if entries.len() >= hops {
            return entries[entries.len() - hops].to_string();
        }
    }
    peer.ip().to_string()
}

/// Constant-time check of `Authorization: Bearer <admin token>`.
pub fn is_admin(headers: &HeaderMap, admin_token: Option<&str>) -> bool {
    match (bearer(headers), admin_token) {
        (Some(given), Some(expected)) => {
            crate::crypto::ct::ct_eq(given.as_bytes(), expected.as_bytes())
        }
        _ => false,
    }
}

/// Constant-time check of a bearer that may read (`/metrics` and the dashboard's views): the
/// admin token or the read-only metrics token. Both comparisons always run. Never use this for an
/// action: actions take [`is_admin`] only.
pub fn is_reader(headers: &HeaderMap, secrets: &crate::config::Secrets) -> bool {
    is_admin(headers, secrets.admin_token.as_deref())
        | is_admin(headers, secrets.metrics_token.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn bearer_rule() {
        assert_eq!(
            bearer(&headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(bearer(&headers(&[("authorization", "bearer abc")])), None);
        assert_eq!(bearer(&headers(&[("authorization", "Bearer  abc")])), None);
        assert_eq!(bearer(&headers(&[("authorization", "Bearer a b")])), None);
        assert_eq!(bearer(&headers(&[])), None);
    }

    #[test]
    fn reader_rule() {
        let secrets = crate::config::Secrets {
            admin_token: Some("a".repeat(32)),
            metrics_token: Some("m".repeat(32)),
            ..Default::default()
        };
        let with = |t: &str| headers(&[("authorization", &format!("Bearer {t}"))]);
        assert!(is_reader(&with(&"a".repeat(32)), &secrets));
        assert!(is_reader(&with(&"m".repeat(32)), &secrets));
        assert!(!is_admin(
            &with(&"m".repeat(32)),
            secrets.admin_token.as_deref()
        ));
        assert!(!is_reader(&with(&"m".repeat(31)), &secrets));
        assert!(!is_reader(&headers(&[]), &secrets));
        let none = crate::config::Secrets::default();
        assert!(!is_reader(&with(&"m".repeat(32)), &none));
    }

    #[test]
    fn source_rule() {
        let peer: SocketAddr = "10.1.2.3:5".parse().unwrap();
        let h = headers(&[("x-forwarded-for", "a, b"), ("x-forwarded-for", "c")]);
        assert_eq!(client_source(peer, &h, 0), "10.1.2.3");
        assert_eq!(client_source(peer, &h, 1), "c");
        assert_eq!(client_source(peer, &h, 2), "b");
        assert_eq!(client_source(peer, &h, 4), "10.1.2.3");
    }

    #[tokio::test]
    async fn body_limit_counts_bytes_read() {
        let f = body(4);
        let r = warp::test::request()
            .body("12345")
            .filter(&f)
            .await
            .ok()
            .unwrap();
        assert!(matches!(r, Body::TooLarge));
        let r = warp::test::request()
            .body("1234")
            .filter(&f)
            .await
            .ok()
            .unwrap();
        assert!(matches!(r, Body::Ok(b) if &b[..] == b"1234"));
    }
}
