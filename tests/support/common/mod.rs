//! The one test toolkit every integration test shares (issue 9): one in-process server starter
//! ([`serve`]), one child-process wrapper for the real binary ([`proc`]), one way to wait for a
//! condition ([`wait`]), one log capture ([`logs`]), one `/metrics` reading ([`metrics`]) and
//! manual time ([`time`]).
//!
//! The bottom layer of the support tree (`tests/support/mod.rs`): the harnesses above it
//! (`node`, `cluster`, `push`, `tls`, `director`, ...) build on these pieces instead of each
//! carrying its own copy.
#![allow(dead_code)]

pub mod logs;
pub mod metrics;
pub mod ports;
pub mod proc;
pub mod serve;
pub mod time;
pub mod wait;
