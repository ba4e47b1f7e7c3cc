//! HTTP glue of the push routes (docs/reference/http.md): the common steps, the bearer chain B1–B6, the body
//! limit after the bearer, strict parsing, and one handler per route. Every path answers a concrete
//! response; nothing here rejects through warp except paths that are not push paths.

#![allow(clippy::result_large_err)] // handlers answer whole responses by design

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, Method, StatusCode};
use serde_json::json;
use warp::filters::BoxedFilter;
use warp::Filter;

use super::model::{self, ChallengeRequest, DeviceRequest, SendRequest, SessionRequest};
use super::Push;
use super::{LIMITS, SESSION_TTL_MS};
use crate::clock::now_ms;
use crate::contract::errors;
use crate::contract::limits::PUSH_BODY_MAX;
use crate::crypto::b64::decode_key32;
use crate::crypto::ident::{random_b64u32, relay_host_id, token_hash};
use crate::crypto::push_proof::issue_push_challenge;
use crate::http::{self as h, Response};
use crate::leg::path::percent_decode;
use crate::logging;
use crate::store::push::{self as store, Accept, NewEvent, Verify};
use crate::store::DbError;

/// Which push route a request is for.
enum Route {
    Challenge,
    Session,
    DevicesPost,
    DevicesGet,
    DeviceDelete(String),
    Send,
}

fn route(method: &Method, path: &str) -> Option<Result<Route, ()>> {
    let r = match path {
        "/v1/host/challenge" => (*method == Method::POST).then_some(Route::Challenge),
        "/v1/host/session" => (*method == Method::POST).then_some(Route::Session),
        "/v1/devices" => match *method {
            Method::POST => Some(Route::DevicesPost),
            Method::GET => Some(Route::DevicesGet),
            _ => None,
        },
        "/v1/send" => (*method == Method::POST).then_some(Route::Send),
        p => {
            let seg = p.strip_prefix("/v1/devices/")?;
            if seg.contains('/') || *method != Method::DELETE {
                None
            } else {
                // A bad escape names no registration: the empty id answers `404 not_found`.
                Some(Route::DeviceDelete(device_path_id(p).unwrap_or_default()))
            }
        }
    };
    Some(r.ok_or(()))
}

/// The registration id a `/v1/devices/<id>` path names, percent-decoded by the one leg-path decoder
/// (`%` needs two hex digits, the result UTF-8); `None` when it names none. Public for the
/// property tests.
#[doc(hidden)]
pub fn device_path_id(path: &str) -> Option<String> {
    let seg = path.strip_prefix("/v1/devices/")?;
    if seg.contains('/') {
        return None;
    }
    percent_decode(seg)
}

type BodyStream = Box<dyn Stream<Item = Result<Box<dyn Buf + Send>, warp::Error>> + Send + Unpin>;

fn boxed_stream<S, B>(s: S) -> BodyStream
where
    S: Stream<Item = Result<B, warp::Error>> + Send + 'static,
    B: Buf + Send + 'static,
{
    Box::new(Box::pin(
        s.map(|c| c.map(|b| Box::new(b) as Box<dyn Buf + Send>)),
    ))
}

/// The push filter: claims push paths only, then answers everything itself.
pub fn filter(push: Arc<Push>) -> BoxedFilter<(Response,)> {
    warp::method()
        .and(warp::path::full())
        .and_then(|m: Method, p: warp::path::FullPath| async move {
            match route(&m, p.as_str()) {
                Some(r) => Ok(r),
                None => Err(warp::reject::not_found()),
            }
        })
        .and(warp::header::headers_cloned())
        .and(h::peer())
        .and(warp::header::optional::<u64>("content-length"))
        .and(warp::body::stream().map(boxed_stream))
        .then(
            move |r: Result<Route, ()>,
                  headers: HeaderMap,
                  peer: SocketAddr,
                  len: Option<u64>,
                  stream: BodyStream| {
                let push = push.clone();
                async move {
                    let req = Req {
                        headers,
                        peer,
                        len,
                        stream: Some(stream),
                    };
                    match r {
                        Ok(r) => push.handle(r, req).await,
                        Err(()) => h::error(StatusCode::NOT_FOUND, errors::NOT_FOUND),
                    }
                }
            },
        )
        .boxed()
}

struct Req {
    headers: HeaderMap,
    peer: SocketAddr,
    len: Option<u64>,
    stream: Option<BodyStream>,
}

impl Req {
    /// The body limit (16384 bytes read; a larger `Content-Length` refused unread).
    async fn body(&mut self) -> Result<Bytes, Response> {
        if self.len.is_some_and(|n| n > PUSH_BODY_MAX as u64) {
            return Err(h::too_large());
        }
        let Some(mut stream) = self.stream.take() else {
            return Err(h::bad_request());
        };
        let read = async {
            let mut buf = BytesMut::new();
            while let Some(chunk) = stream.next().await {
                let mut chunk = chunk.map_err(|_| h::bad_request())?;
                if buf.len() + chunk.remaining() > PUSH_BODY_MAX {
                    return Err(h::too_large());
                }
                while chunk.has_remaining() {
                    let part = chunk.chunk();
                    let n = part.len();
                    buf.extend_from_slice(part);
                    chunk.advance(n);
                }
            }
            Ok(buf.freeze())
        };
        // The same body deadline as every other route (limits::BODY_READ_MS).
        let deadline = std::time::Duration::from_millis(crate::contract::limits::BODY_READ_MS);
        tokio::time::timeout(deadline, read)
            .await
            .unwrap_or_else(|_| Err(h::bad_request()))
    }
}

fn rate_limited(retry_after_s: u64) -> Response {
    h::error_retry(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        retry_after_s.max(1),
    )
}

fn busy() -> Response {
    h::error_retry(StatusCode::SERVICE_UNAVAILABLE, "busy", 1)
}

/// Error of a handler step: a finished response, or a database failure.
enum Fail {
    Resp(Response),
    Db(DbError),
}

impl From<DbError> for Fail {
    fn from(e: DbError) -> Self {
        Fail::Db(e)
    }
}

impl From<Response> for Fail {
    fn from(r: Response) -> Self {
        Fail::Resp(r)
    }
}

impl Push {
    fn ip(&self, req: &Req) -> String {
        let src = h::client_source(req.peer, &req.headers, self.ctx.config.trusted_proxy_hops);
        super::ratelimit::ip_key(&src)
    }

    fn count(&self, name: &str) {
        self.ctx.metrics.push_inc(name);
    }

    /// A `429` (counted as `ip_rate_limited`).
    fn refuse(&self, retry_after_s: u64) -> Response {
        self.count("ip_rate_limited");
        rate_limited(retry_after_s)
    }

    async fn handle(self: Arc<Self>, r: Route, mut req: Req) -> Response {
        // Common steps: drain, then mode (the role step is the server's).
        if self.ctx.shutting_down() || self.stopping() {
            return h::shutting_down();
        }
        if self.validation {
            return h::error(StatusCode::SERVICE_UNAVAILABLE, "validation_only");
        }
        let _inflight = self.requests.token();
        let result = match r {
            Route::Challenge => self.challenge(&mut req).await,
            Route::Session => self.session(&mut req).await,
            Route::DevicesPost => self.register(&mut req).await,
            Route::DevicesGet => self.list(&mut req).await,
            Route::DeviceDelete(id) => self.delete(&mut req, &id).await,
            Route::Send => self.send(&mut req).await,
        };
        match result {
            Ok(r) | Err(Fail::Resp(r)) => r,
            Err(Fail::Db(e)) => {
                self.count("request_error");
                if e.is_transient() {
                    h::error_retry(
                        StatusCode::SERVICE_UNAVAILABLE,
                        errors::DEPENDENCY_UNAVAILABLE,
                        1,
                    )
                } else {
                    logging::event_warn(
                        "orca_push_request_failed",
                        json!({"error": super::worker::db_class(&e)}),
                    );
                    h::error(StatusCode::INTERNAL_SERVER_ERROR, "internal")
                }
            }
        }
    }

    /// The unauth-IP bucket (challenge and session share it).
    fn unauth_ip(&self, req: &Req) -> Result<(), Fail> {
        let key = self.ip(req);
        let r = self.limits().unauth.allow(&key, now_ms());
        r.map_err(|s| Fail::Resp(self.refuse(s)))
    }

    async fn challenge(&self, req: &mut Req) -> Result<Response, Fail> {
        self.unauth_ip(req)?;
        let bytes = req.body().await?;
        let reject = || {
            self.count("challenge_rejected");
            Fail::Resp(h::bad_request())
        };
        let parsed: ChallengeRequest = h::parse(&bytes).map_err(|_| reject())?;
        if parsed.v != 1 {
            return Err(reject());
        }
        let Some(host_public) = decode_key32(&parsed.host_public_key_b64) else {
            return Err(reject());
        };
        let fp = relay_host_id(&host_public);
        let now = now_ms();
        let (resp, hash) =
            issue_push_challenge(&self.ctx.config.push.public_url, &host_public, now);
        store::insert_challenge(
            &self.ctx.db,
            &resp.challenge_id,
            &fp,
            &hash,
            resp.expires_at,
        )
        .await?;
        self.count("challenge_issued");
        Ok(h::json(StatusCode::OK, &resp))
    }

    async fn session(&self, req: &mut Req) -> Result<Response, Fail> {
        self.unauth_ip(req)?;
        let bytes = req.body().await?;
        let parsed: SessionRequest = h::parse(&bytes)?;
        if !parsed.valid() {
            return Err(Fail::Resp(h::bad_request()));
        }
        let token = random_b64u32();
        let now = now_ms();
        let proof = parsed.proof_b64.as_str();
        let proof_matches = |secret_hash: &str| {
            crate::crypto::push_proof::proof_matches_secret_hash(proof, secret_hash)
        };
        let v = store::verify_and_open_session(
            &self.ctx.db,
            &parsed.challenge_id,
            &proof_matches,
            &token_hash(&token),
            &LIMITS,
            now,
        )
        .await?;
        match v {
            Verify::Ok { fp } => {
                self.count("session_issued");
                Ok(h::json(
                    StatusCode::OK,
                    &json!({"sessionToken": token, "expiresAt": now + SESSION_TTL_MS, "hostFingerprint": fp}),
                ))
            }
            Verify::UnknownChallenge => {
                self.count("session_rejected");
                Ok(h::error(StatusCode::UNAUTHORIZED, "invalid_challenge"))
            }
            Verify::InvalidProof => {
                self.count("session_rejected");
                Ok(h::error(StatusCode::UNAUTHORIZED, "invalid_proof"))
            }
        }
    }

    /// auth-IP, then B1–B6; returns the caller's fingerprint.
    async fn authenticate(&self, req: &mut Req) -> Result<String, Fail> {
        let ip = self.ip(req);
        let headers = std::mem::take(&mut req.headers);
        let r = self.authenticate_as(&headers, ip).await;
        req.headers = headers;
        r
    }

    async fn authenticate_as(&self, headers: &HeaderMap, ip: String) -> Result<String, Fail> {
        let now = now_ms();
        {
            let mut l = self.limits();
            if let Err(s) = l.auth.allow(&ip, now) {
                drop(l);
                return Err(Fail::Resp(self.refuse(s)));
            }
            // B1
            if let Err(s) = l.invalid_bearer.peek(&ip, now) {
                drop(l);
                return Err(Fail::Resp(self.refuse(s)));
            }
        }
        // B2
        let Some(token) = push_bearer(headers) else {
            self.limits().invalid_bearer.spend(&ip, now_ms());
            return Err(Fail::Resp(h::invalid_token()));
        };
        // B3
        let Ok(_permit) = self.admission.enter().await else {
            return Err(Fail::Resp(busy()));
        };
        if self.limits().invalid_bearer.peek(&ip, now_ms()).is_err() {
            return Err(Fail::Resp(busy()));
        }
        let found = if crate::crypto::b64::is_b64u32(&token) {
            store::resolve_session(&self.ctx.db, &token_hash(&token)).await?
        } else {
            None
        };
        drop(_permit);
        // B4
        let now = now_ms();
        let fp = match found {
            None => {
                self.limits().invalid_bearer.spend(&ip, now);
                return Err(Fail::Resp(h::invalid_token()));
            }
            Some((_, exp)) if now > exp => {
                self.limits().invalid_bearer.spend(&ip, now);
                return Err(Fail::Resp(h::error(
                    StatusCode::UNAUTHORIZED,
                    "session_expired",
                )));
            }
            Some((fp, _)) => fp,
        };
        // B5
        let r = self.limits().per_host.allow(&fp, now);
        if let Err(s) = r {
            return Err(Fail::Resp(self.refuse(s)));
        }
        Ok(fp)
    }

    async fn register(&self, req: &mut Req) -> Result<Response, Fail> {
        let fp = self.authenticate(req).await?;
        let bytes = req.body().await?;
        let reject = || {
            self.count("device_rejected");
            Fail::Resp(h::bad_request())
        };
        let parsed: DeviceRequest = h::parse(&bytes).map_err(|_| reject())?;
        let Some(device) = parsed.validate() else {
            return Err(reject());
        };
        match store::upsert_device(&self.ctx.db, &fp, &device, &LIMITS, now_ms()).await? {
            Some(id) => {
                self.count("device_registered");
                Ok(h::json(StatusCode::OK, &json!({"registrationId": id})))
            }
            None => {
                self.count("device_rejected");
                Ok(h::error(StatusCode::CONFLICT, "too_many_devices"))
            }
        }
    }

    async fn list(&self, req: &mut Req) -> Result<Response, Fail> {
        let fp = self.authenticate(req).await?;
        let rows = store::list_devices(&self.ctx.db, &fp).await?;
        let devices: Vec<_> = rows
            .into_iter()
            .map(|(r, d, p, dead)| {
                json!({"registrationId": r, "deviceId": d, "platform": p, "dead": dead})
            })
            .collect();
        Ok(h::json(StatusCode::OK, &json!({ "devices": devices })))
    }

    async fn delete(&self, req: &mut Req, id: &str) -> Result<Response, Fail> {
        let fp = self.authenticate(req).await?;
        let n = id.chars().count();
        if (1..=128).contains(&n) && store::delete_device(&self.ctx.db, &fp, id, now_ms()).await? {
            self.count("device_deleted");
            return Ok(h::empty(StatusCode::NO_CONTENT));
        }
        Ok(h::error(StatusCode::NOT_FOUND, errors::NOT_FOUND))
    }

    async fn send(&self, req: &mut Req) -> Result<Response, Fail> {
        let fp = self.authenticate(req).await?;
        let bytes = req.body().await?;
        let parsed: SendRequest = h::parse(&bytes)?;
        if parsed.v != 1 {
            return Err(Fail::Resp(h::bad_request()));
        }
        let ids = model::unique_ids(&parsed.registration_ids).ok_or_else(h::bad_request)?;
        let n = parsed.notification.validate().ok_or_else(h::bad_request)?;
        let (event_id, content, payload) =
            (n.event_id(&fp), n.content_fingerprint(), n.canonical_json());
        let event = NewEvent {
            kind: n.effective_kind(),
            event_id: &event_id,
            content: &content,
            payload: &payload,
            notification_id: n.notification_id.as_deref(),
            notification_seq: n.notification_seq as i64,
            notification_epoch: &n.notification_epoch,
            expires_at: n.expires_at.map(|e| e as i64),
        };
        let mut results = Vec::with_capacity(ids.len());
        let mut enqueued = false;
        for id in ids {
            // The registration check and `accept` in one transaction per recipient.
            let status =
                match store::send_recipient(&self.ctx.db, &fp, &event, &id, &LIMITS, now_ms())
                    .await?
                {
                    Accept::Enqueued => {
                        enqueued = true;
                        "queued"
                    }
                    Accept::Queued => "queued",
                    Accept::RateLimited => "rate_limited",
                    Accept::Unknown | Accept::Error => "error",
                    Accept::Dead => "dead",
                };
            self.count(match status {
                "queued" => "send_queued",
                "dead" => "send_dead",
                "rate_limited" => "send_rate_limited",
                _ => "send_error",
            });
            if enqueued {
                // Wake as soon as the first row commits: later recipients need not wait.
                self.wake_worker();
            }
            results.push(json!({"registrationId": id, "status": status}));
        }
        Ok(h::json(StatusCode::OK, &json!({ "results": results })))
    }
}

/// B2: `Authorization` with scheme `bearer` in any case; the token is the rest, trimmed.
fn push_bearer(headers: &HeaderMap) -> Option<String> {
    let mut all = headers.get_all(http::header::AUTHORIZATION).iter();
    let v = all.next()?;
    if all.next().is_some() {
        return None;
    }
    let s = v.to_str().ok()?.trim_start();
    if s.len() < 6 || !s.is_char_boundary(6) || !s[..6].eq_ignore_ascii_case("bearer") {
        return None;
    }
    let rest = &s[6..];
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return None;
    }
    let token = rest.trim();
    (!token.is_empty()).then(|| token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme() {
        let hm = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert_eq!(push_bearer(&hm("Bearer abc")).as_deref(), Some("abc"));
        assert_eq!(push_bearer(&hm("bearer abc")).as_deref(), Some("abc"));
        assert_eq!(push_bearer(&hm("BEARER   abc  ")).as_deref(), Some("abc"));
        assert_eq!(push_bearer(&hm("Bearer   ")), None);
        assert_eq!(push_bearer(&hm("Basic x")), None);
        assert_eq!(push_bearer(&hm("Bearerabc")), None);
        assert_eq!(push_bearer(&HeaderMap::new()), None);
    }

    #[test]
    fn decode_segment() {
        assert_eq!(device_path_id("/v1/devices/a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(device_path_id("/v1/devices/a/b"), None);
        for bad in ["a%2", "%ff", "%+1", "%-1", "%1", "%zz", "%+f"] {
            assert_eq!(device_path_id(&format!("/v1/devices/{bad}")), None, "{bad}");
        }
    }
}
