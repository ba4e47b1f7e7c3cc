//! The cell role: the three WebSocket legs, host sessions, phone admission and splicing
//! (protocol.md).

pub mod admission;
pub mod ledger;
pub mod splice;
pub mod ws;

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use warp::filters::BoxedFilter;
use warp::Filter;

use crate::app::Ctx;
use crate::director::Director;
use crate::http::Response;

/// The cell of this process.
pub struct Cell {
    pub ctx: Ctx,
    pub director: Option<Arc<Director>>,
}

impl Cell {
    pub async fn start(ctx: Ctx, director: Option<Arc<Director>>) -> Result<Arc<Cell>, String> {
        Ok(Arc::new(Cell { ctx, director }))
    }

    /// HTTP routes of the cell role (drain, idle rehome).
    pub fn routes(self: &Arc<Self>) -> BoxedFilter<(Response,)> {
        warp::any()
            .and_then(|| async { Err::<Response, _>(warp::reject::not_found()) })
            .boxed()
    }

    /// Handles a request on a WebSocket leg path (`/v1/host/control`, `/v1/host/data/…`,
    /// `/v1/connect/…`): the upgrade gates, then the leg.
    pub async fn upgrade(
        self: &Arc<Self>,
        _req: http::Request<Incoming>,
        _peer: SocketAddr,
    ) -> Response {
        crate::http::empty(http::StatusCode::NOT_FOUND)
    }

    /// The `runtime` object of `/v1/admin/runtime-status`.
    pub fn runtime_counts(&self) -> serde_json::Value {
        serde_json::json!({"controls":0,"splices":0,"pendingSplices":0,"preAuth":0,"queuedBytes":0})
    }

    /// True once a drain was requested.
    pub fn is_draining(&self) -> bool {
        false
    }

    /// SIGTERM: drain with the shutdown grace and close every socket (protocol.md §11).
    pub async fn shutdown(&self) {}
}
