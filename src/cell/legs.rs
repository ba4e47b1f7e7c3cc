//! Upgrade gates of the three legs (protocol.md §1.1): the first failing gate answers a raw
//! refusal; a passing request gets 101 and its leg task.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::StatusCode;
use hyper::body::Incoming;

use super::ws::{self, Leg};
use super::{control, phone, Cell};
use crate::contract::limits;
use crate::crypto::is_relay_host_id;
use crate::http::Response;
use crate::store::assignments::HostKey;

/// Percent-decodes a path segment; a bad escape or non-UTF-8 result is `None`.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |c: u8| (c as char).to_digit(16);
            let hi = hex(*b.get(i + 1)?)?;
            let lo = hex(*b.get(i + 2)?)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Which leg a path names, before any gate.
enum Target {
    Control,
    Data(Option<String>),
    Phone(Option<String>),
    NotFound,
}

fn target(path: &str) -> Target {
    if path == "/v1/host/control" {
        Target::Control
    } else if let Some(id) = path.strip_prefix("/v1/host/data/") {
        Target::Data(percent_decode(id).filter(|d| {
            let n = d.chars().count();
            (1..=128).contains(&n)
        }))
    } else if let Some(id) = path.strip_prefix("/v1/connect/") {
        Target::Phone(percent_decode(id).filter(|d| is_relay_host_id(d)))
    } else {
        Target::NotFound
    }
}

/// A gate's raw refusal, counted in `orca_relay_admission_rejections_total{reason}` (`reason` names
/// the gate: shutting_down, query_string, unknown_path, invalid_id, capacity, preauth, host_token,
/// store_pressure).
fn refuse(cell: &Cell, reason: &'static str, status: StatusCode) -> Response {
    cell.ctx
        .metrics
        .admission_rejections
        .with_label_values(&[reason])
        .inc();
    ws::refuse(status)
}

pub async fn upgrade(
    cell: &Arc<Cell>,
    mut req: http::Request<Incoming>,
    peer: SocketAddr,
) -> Response {
    let Some(key) = ws::ws_key(&req) else {
        // A plain HTTP request to a leg path is an unknown route.
        return crate::http::error(StatusCode::NOT_FOUND, crate::contract::errors::NOT_FOUND);
    };
    if cell.ctx.shutting_down() {
        return refuse(cell, "shutting_down", StatusCode::SERVICE_UNAVAILABLE);
    }
    if req.uri().query().is_some() {
        return refuse(cell, "query_string", StatusCode::BAD_REQUEST);
    }
    let path = req.uri().path().to_owned();
    match target(&path) {
        Target::NotFound => refuse(cell, "unknown_path", StatusCode::NOT_FOUND),
        Target::Phone(None) | Target::Data(None) => {
            refuse(cell, "invalid_id", StatusCode::TOO_MANY_REQUESTS)
        }
        Target::Phone(Some(id)) => phone_gates(cell, &mut req, &key, peer, id),
        Target::Data(Some(conn_id)) => data_gates(cell, &mut req, &key, peer, conn_id),
        Target::Control => control_gates(cell, &mut req, &key).await,
    }
}

/// Gate 4 of phone/data legs; on success the socket counts as awaiting its first frame.
fn preauth(
    cell: &Cell,
    req: &http::Request<Incoming>,
    peer: SocketAddr,
    leg: Leg,
) -> Option<String> {
    let source =
        crate::http::client_source(peer, req.headers(), cell.ctx.config.trusted_proxy_hops);
    let capacity_ok = match &cell.ledger {
        Some(l) => {
            let l = l.lock().unwrap_or_else(|e| e.into_inner());
            l.physical() < l.normal_limit()
        }
        None => {
            let m = cell.ctx.config.max_connections;
            let reserve = match leg {
                Leg::Phone => limits::CONTROL_RESERVE + limits::DATA_RESERVE_EXTRA,
                _ => limits::CONTROL_RESERVE,
            };
            cell.open.load(Ordering::Relaxed) < m.saturating_sub(reserve)
        }
    };
    let now = crate::clock::now_ms();
    cell.preauth()
        .try_admit(&source, now, capacity_ok)
        .then_some(source)
}

fn phone_gates(
    cell: &Arc<Cell>,
    req: &mut http::Request<Incoming>,
    key: &http::HeaderValue,
    peer: SocketAddr,
    relay_host_id: String,
) -> Response {
    if cell.with_ledger(|l| l.reserve_phone()) == Some(false) {
        return refuse(cell, "capacity", StatusCode::SERVICE_UNAVAILABLE);
    }
    let Some(source) = preauth(cell, req, peer, Leg::Phone) else {
        cell.with_ledger(|l| {
            l.abort();
            l.release_reserved(None);
        });
        return refuse(cell, "preauth", StatusCode::TOO_MANY_REQUESTS);
    };
    let (resp, sock) = ws::accept(req, key, Leg::Phone);
    let cell = cell.clone();
    tokio::spawn(async move {
        match sock.await {
            Some(ws) => {
                let guard = super::ConnGuard::opened(&cell, Leg::Phone);
                phone::run_phone(cell, ws, guard, relay_host_id, source).await;
            }
            None => {
                cell.preauth().leave(&source);
                cell.with_ledger(|l| {
                    l.abort();
                    l.release_reserved(None);
                });
            }
        }
    });
    resp
}

fn data_gates(
    cell: &Arc<Cell>,
    req: &mut http::Request<Incoming>,
    key: &http::HeaderValue,
    peer: SocketAddr,
    conn_id: String,
) -> Response {
    if cell.with_ledger(|l| l.reserve_data(&conn_id).is_some()) == Some(false) {
        return refuse(cell, "capacity", StatusCode::SERVICE_UNAVAILABLE);
    }
    let Some(source) = preauth(cell, req, peer, Leg::Data) else {
        cell.with_ledger(|l| {
            l.abort();
            l.restore_bound(&conn_id);
        });
        return refuse(cell, "preauth", StatusCode::TOO_MANY_REQUESTS);
    };
    let (resp, sock) = ws::accept(req, key, Leg::Data);
    let cell = cell.clone();
    tokio::spawn(async move {
        match sock.await {
            Some(ws) => {
                let guard = super::ConnGuard::opened(&cell, Leg::Data);
                phone::run_data(cell, ws, guard, conn_id, source).await;
            }
            None => {
                cell.preauth().leave(&source);
                cell.with_ledger(|l| {
                    l.abort();
                    l.restore_bound(&conn_id);
                });
            }
        }
    });
    resp
}

async fn control_gates(
    cell: &Arc<Cell>,
    req: &mut http::Request<Incoming>,
    key: &http::HeaderValue,
) -> Response {
    // Gate 3: the host token (§2.2).
    let token = match req
        .headers()
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .count()
    {
        1 => crate::http::bearer(req.headers()).map(str::to_owned),
        _ => None,
    };
    let Some(token) = token.filter(|t| t.len() <= limits::HOST_TOKEN_MAX_CHARS) else {
        return refuse(cell, "host_token", StatusCode::UNAUTHORIZED);
    };
    let claims = match cell.verifier.verify(&token, crate::clock::now_ms()).await {
        Ok(c) => c,
        Err(_) => return refuse(cell, "host_token", StatusCode::UNAUTHORIZED),
    };
    let host = HostKey {
        user_id: claims.sub.clone(),
        relay_host_id: claims.relay_host_id.clone(),
    };
    // A rebind over a live control is exempt from the store shed and may use the rebind reserve.
    let rebind_over_live = cell.registry().get(&host).is_some_and(|s| {
        let st = s.lock();
        st.state == super::session::State::Active && st.control_open()
    });
    // Gate 4: store pressure shed.
    if !rebind_over_live {
        let p = cell.ctx.db.pressure();
        if p.waiting >= cell.ctx.config.database_pool_max as u64
            && p.oldest_wait_ms >= limits::STORE_SHED_WAIT_MS
        {
            return refuse(cell, "store_pressure", StatusCode::SERVICE_UNAVAILABLE);
        }
    }
    // Gate 5: connection capacity.
    let watermark = match &cell.ledger {
        Some(l) => {
            match l
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .reserve_control(rebind_over_live)
            {
                Some(w) => Some(w),
                None => return refuse(cell, "capacity", StatusCode::SERVICE_UNAVAILABLE),
            }
        }
        None => {
            if cell.open.load(Ordering::Relaxed) >= cell.ctx.config.max_connections {
                return refuse(cell, "capacity", StatusCode::TOO_MANY_REQUESTS);
            }
            None
        }
    };
    let caps = super::frames::capabilities(
        req.headers()
            .get_all("x-orca-host-capabilities")
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    let (resp, sock) = ws::accept(req, key, Leg::Control);
    let cell = cell.clone();
    tokio::spawn(async move {
        match sock.await {
            Some(ws) => {
                let guard = super::ConnGuard::opened(&cell, Leg::Control);
                control::run(cell, ws, guard, claims, caps, watermark).await;
            }
            None => {
                cell.with_ledger(|l| l.abort());
            }
        }
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("abc%2Dd").as_deref(), Some("abc-d"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }

    #[test]
    fn targets() {
        assert!(matches!(target("/v1/host/control"), Target::Control));
        assert!(matches!(target("/v1/host/controls"), Target::NotFound));
        assert!(matches!(target("/v1/host/data/"), Target::Data(None)));
        assert!(matches!(
            target(&format!("/v1/host/data/{}", "a".repeat(129))),
            Target::Data(None)
        ));
        assert!(matches!(
            target(&format!("/v1/host/data/{}", "a".repeat(128))),
            Target::Data(Some(_))
        ));
        assert!(matches!(target("/v1/connect/short"), Target::Phone(None)));
        assert!(matches!(
            target("/v1/connect/abcdefghijklmnop"),
            Target::Phone(Some(_))
        ));
        assert!(matches!(
            target("/v1/connect/abcdefghijklmno%70"),
            Target::Phone(Some(_))
        ));
        assert!(matches!(target("/v1/connect"), Target::NotFound));
    }
}
