//! Where a cell's heartbeats (docs/reference/http.md) go: the one interface between the cell and the
//! director roles. The director implements it in-process; the cell's HTTP client
//! (`cell::heartbeat_client`) implements it with a cluster token. `server.rs` picks one.

use std::future::Future;
use std::pin::Pin;

use super::wire::{CellHeartbeat, CellRehomeStatus};

/// The future of one beat: `Err(reason)` is what the cell's failure log line names
/// (`director_heartbeat_<status>`, `director_heartbeat_timeout`, …).
pub type BeatFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Accepts one heartbeat body.
pub trait HeartbeatSink: Send + Sync {
    fn beat<'a>(&'a self, body: &'a CellHeartbeat) -> BeatFuture<'a>;

    /// The `cell-rehome-status` sent after each successful beat (docs/reference/http.md); a sink
    /// without it accepts and drops the status.
    fn rehome_status<'a>(&'a self, _body: &'a CellRehomeStatus) -> BeatFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}
