//! Upgrade gates of the cell's three legs (docs/reference/websocket.md): the shared pre-gates (gates 1 and 2,
//! [`crate::leg::pre_gates`]), then the cell's gates 3-5 per leg; the first failing gate answers a
//! raw refusal; a passing request gets 101 and its leg task.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::StatusCode;
use hyper::body::Incoming;

use super::{control, phone, Cell};
use crate::contract::limits;
use crate::http::Response;
use crate::leg::ws::{self, Leg};
use crate::leg::{pre_gates, Target, Upgrade};
use crate::metrics::labels;
use crate::store::assignments::HostKey;

/// A gate's raw refusal, counted in `orca_relay_admission_rejections_total{reason}` (`reason` names
/// the gate: shutting_down, query_string, unknown_path, invalid_id (pre-gates), capacity, preauth,
/// host_token, store_pressure).
fn refuse(cell: &Cell, reason: &'static str, status: StatusCode) -> Response {
    count_refusal(cell, reason);
    ws::refuse(status)
}

fn count_refusal(cell: &Cell, reason: &'static str) {
    debug_assert!(labels::known(labels::ADMISSION_REASONS, reason), "{reason}");
    cell.ctx
        .metrics
        .admission_rejections
        .with_label_values(&[reason])
        .inc();
}

pub async fn upgrade(
    cell: &Arc<Cell>,
    mut req: http::Request<Incoming>,
    peer: SocketAddr,
) -> Response {
    let Upgrade { key, target } = match pre_gates(&req, cell.ctx.shutting_down()) {
        Ok(u) => u,
        Err(refusal) => {
            if let Some(reason) = refusal.reason {
                count_refusal(cell, reason);
            }
            return refusal.response;
        }
    };
    match target {
        Target::Phone(id) => phone_gates(cell, &mut req, &key, peer, id),
        Target::Data(conn_id) => data_gates(cell, &mut req, &key, peer, conn_id),
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
    let capacity_ok = match &cell.ledger {
        Some(l) => {
            let l = crate::sync::lock(l);
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
    crate::leg::pre_auth(
        &cell.preauth,
        req,
        peer,
        cell.ctx.config.trusted_proxy_hops,
        capacity_ok,
    )
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
    // Gate 3: the host token.
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
        Some(l) => match crate::sync::lock(l).reserve_control(rebind_over_live) {
            Some(w) => Some(w),
            None => return refuse(cell, "capacity", StatusCode::SERVICE_UNAVAILABLE),
        },
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
                control::run(cell, Box::new(ws), guard, claims, caps, watermark).await;
            }
            None => {
                cell.with_ledger(|l| l.abort());
            }
        }
    });
    resp
}
