//! The one test toolkit. Every integration test that starts something includes it the same way,
//! as one module tree, and names what it needs from it:
//!
//! ```ignore
//! mod support;
//! use support::node::*; // or support::{cluster, push, tls, director, ...}
//! ```
//!
//! How to start each thing:
//!
//! - **A single in-process node** (role `all`, one per backend): `for t in node::dbs().await {
//!   let s = node::start_on(&t.url, &[extra flags]).await; ... }`. Any other in-process server:
//!   [`common::serve::start`] with `orca-relay serve` flags (`--listen 127.0.0.1:0`).
//! - **A director alone** (cells played by heartbeats): [`director::start`].
//! - **A push role** with fake providers: [`push::Server::start`] (`push::run_all` for both
//!   backends).
//! - **One real `orca-relay serve` process**: [`common::proc::spawn_serve`] with a
//!   [`common::proc::Spec`] (its stderr is captured, its address read from the `listening on`
//!   line); [`tls::Relay::spawn`] wraps it for the TLS tests, [`cluster::Proc`] for restartable
//!   cluster members.
//! - **A cluster of processes** on the test Postgres: [`cluster::start_fleet`] /
//!   [`cluster::start_cluster`]; the multi-region fleet [`region::start_fleet`]; shapes with
//!   fault tools in [`faults`], [`pgproxy`], [`pgpair`], [`netns`], [`row_lock`], [`write_block`].
//! - **A host and a phone**: [`clients::Host`] against a node (assign, then control), built on
//!   the crate's own `orca_relay::cell::testkit` (`HostIdentity`, `connect_control`,
//!   `Pair::open`, `Pair::echo`), which is the one host/phone implementation: use it, do not
//!   write another.
//! - **Waiting**: [`common::wait`] (poll with a deadline, never a fixed sleep), the test clock
//!   ([`node::jump`], [`common::time::ManualTime`]) for anything that is a duration in the rules;
//!   ports from [`common::ports::free_port`]; log capture in [`common::logs`].
//!
//! Layers: `common` at the bottom (ports, proc, serve, wait, time, logs); the harnesses above
//! use `super::common` and each other by `super::`, never by `#[path]`.

// One module tree is compiled into every test binary and each uses a part of it.
#![allow(dead_code, unused_imports)]

pub mod clients;
pub mod cluster;
pub mod common;
pub mod director;
pub mod faults;
pub mod history;
pub mod idle;
pub mod logfmt;
pub mod netns;
pub mod node;
pub mod pgpair;
pub mod pgproxy;
pub mod push;
pub mod raw_ws;
pub mod region;
pub mod rehome_worker;
pub mod roll_sampler;
pub mod row_lock;
pub mod soak;
pub mod tls;
pub mod write_block;
