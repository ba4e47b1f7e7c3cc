//! The WebSocket toolkit both roles use on their leg paths (docs/reference/websocket.md): the upgrade gates every
//! leg endpoint shares, socket configuration and the 101 upgrade, pre-auth admission, path decoding
//! and the generic first-frame parsing.
//!
//! The cell's three legs and the director's invite redirect (docs/reference/websocket.md) are both built from
//! these parts, so a rule of or lives in exactly one place. Nothing here knows a role:
//! callers pass the process state a gate needs (shutting down, the pre-auth table, the capacity
//! verdict).

pub mod admission;
pub mod boundary;
pub mod busy_hint;
pub mod frame;
pub mod gates;
pub mod path;
pub mod preauth_io;
pub mod ws;

pub use gates::{pre_auth, pre_gates, Refusal, Target, Upgrade};
pub use ws::Leg;
