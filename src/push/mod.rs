//! The push gateway role (push.md).

use std::sync::Arc;

use warp::filters::BoxedFilter;
use warp::Filter;

use crate::app::Ctx;
use crate::http::Response;

/// The push gateway of this process.
pub struct Push {
    pub ctx: Ctx,
}

impl Push {
    pub async fn start(ctx: Ctx) -> Result<Arc<Push>, String> {
        Ok(Arc::new(Push { ctx }))
    }

    /// The push routes.
    pub fn routes(self: &Arc<Self>) -> BoxedFilter<(Response,)> {
        warp::any()
            .and_then(|| async { Err::<Response, _>(warp::reject::not_found()) })
            .boxed()
    }

    /// Extra `/health` fields of the push role.
    pub fn health_fields(&self) -> serde_json::Value {
        serde_json::json!({ "pushProtocol": 1, "deliveryProtocol": 2 })
    }

    /// SIGTERM: stop claiming, let in-flight deliveries finish (≤ 9 s).
    pub async fn shutdown(&self) {}
}
