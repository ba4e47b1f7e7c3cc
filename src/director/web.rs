//! The HTTP pieces every director route file shares (`routes`, `admin`, `region`): the bounded
//! `POST` filter, the body answers and the database-unavailable answer.

// Handlers return the finished reply as their error value, like `http::parse`.
#![allow(clippy::result_large_err)]

use std::future::Future;
use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use warp::filters::BoxedFilter;
use warp::Filter;

use super::Director;
use crate::contract::errors;
use crate::contract::limits::RELAY_BODY_MAX;
use crate::http::{self as h, Body, Response};

/// `POST <path>` with headers and a body bounded at 4 096 bytes.
pub(crate) fn post<F, Fut>(d: Arc<Director>, path: &'static str, f: F) -> BoxedFilter<(Response,)>
where
    F: Fn(Arc<Director>, HeaderMap, Body) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    warp::path::full()
        .and_then(move |p: warp::path::FullPath| async move {
            if p.as_str() == path {
                Ok(())
            } else {
                Err(warp::reject::not_found())
            }
        })
        .untuple_one()
        .and(warp::post())
        .and(warp::header::headers_cloned())
        .and(h::body(RELAY_BODY_MAX))
        .then(move |hd: HeaderMap, b: Body| {
            let d = d.clone();
            let f = f.clone();
            async move { f(d, hd, b).await }
        })
        .boxed()
}

/// Body → bytes, or the 413/400 answer.
pub(crate) fn bytes(b: Body) -> Result<bytes::Bytes, Response> {
    match b {
        Body::Ok(b) => Ok(b),
        Body::TooLarge => Err(h::too_large()),
        Body::Broken => Err(h::bad_request()),
    }
}

pub(crate) fn db_unavailable() -> Response {
    h::error_retry(
        StatusCode::SERVICE_UNAVAILABLE,
        errors::DATABASE_TEMPORARILY_UNAVAILABLE,
        5,
    )
}
