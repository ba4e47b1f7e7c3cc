//! The wire contract shared with outside clients: close codes and reasons, error codes, limits.
//!
//! Names here are the spec's names; anything a client can observe is defined once in this module so
//! the role code cannot drift from `docs/reference/`.

pub mod close;
pub mod errors;
pub mod heartbeat;
pub mod limits;
pub mod overview;
pub mod reference;
pub mod strict;
pub mod validate;
pub mod wire;
