//! orca-relay: a relay cell, a director and a push gateway in one crate.
//!
//! Layering (see `ARCHITECTURE.md`): `contract` and `crypto` are pure leaves; `store` owns every SQL
//! statement behind one transaction interface with a SQLite and a Postgres backend; `director`, `cell`
//! and `push` hold the roles' decision logic and glue; `server` mounts the roles on one listener.

// Handlers return `Result<_, Response>` to short-circuit with the exact spec answer; a boxed
// response would only add an allocation on error paths.
#![allow(clippy::result_large_err)]
// No unsafe anywhere in the relay: the only `libc` calls (signals to child processes) are in tests.
#![forbid(unsafe_code)]

pub mod advertise;
pub mod app;
pub mod cell;
pub mod cli;
pub mod clock;
pub mod config;
pub mod contract;
pub mod crypto;
pub mod dashboard;
pub mod director;
pub mod flags;
pub mod http;
pub mod leg;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod push;
pub mod readiness;
pub mod rehome;
pub mod server;
pub mod store;
pub mod sync;
pub mod tls;
