//! The admin overview (docs/reference/http.md) is assembled by the director; its `push` section belongs
//! to the push role. This trait is the seam between them: push implements it, `server.rs` hands the
//! push role to the director when both run in one process, and the director never names `push`.

use std::future::Future;
use std::pin::Pin;

/// The future of one `push` section: `Err(reason)` when its database reads failed (the overview
/// then answers 503 like any other failed read).
pub type PushSectionFuture<'a> =
    Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send + 'a>>;

/// Supplies the overview's `push` object (`queueDepth`, `deadRegistrations`).
pub trait PushOverview: Send + Sync {
    fn push_section(&self) -> PushSectionFuture<'_>;
}
