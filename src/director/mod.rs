//! The director role: placement, heartbeats and liveness, rolling restarts, fences, evacuations
//! (director.md), plus `POST /v1/host-token` (protocol.md §2.1).

pub mod host_token;

use std::sync::Arc;

use warp::filters::BoxedFilter;
use warp::Filter;

use crate::app::Ctx;
use crate::http::Response;

/// The director of this process.
pub struct Director {
    pub ctx: Ctx,
    /// K of protocol.md §2.1: the HS256 key of self-hosted host tokens.
    pub host_token_key: [u8; 32],
}

impl Director {
    pub async fn start(ctx: Ctx) -> Result<Arc<Director>, String> {
        let signing = ctx
            .config
            .secrets
            .assignment_signing_key
            .clone()
            .ok_or("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY is required for role director")?;
        Ok(Arc::new(Director {
            host_token_key: crate::crypto::jwt::self_hosted_key(&signing),
            ctx,
        }))
    }

    /// The director's HTTP routes.
    pub fn routes(self: &Arc<Self>) -> BoxedFilter<(Response,)> {
        host_token::route(self.clone()).boxed()
    }

    /// `/v1/connect/<relayHostId>` on a director without a cell: the invite redirect of
    /// protocol.md §5.5.
    pub async fn connect_redirect(
        self: &Arc<Self>,
        _req: http::Request<hyper::body::Incoming>,
        _peer: std::net::SocketAddr,
    ) -> Response {
        crate::http::error(
            http::StatusCode::NOT_FOUND,
            crate::contract::errors::CELL_ONLY,
        )
    }

    /// Stops background loops (sweeps, workers) at shutdown.
    pub async fn shutdown(&self) {}
}
