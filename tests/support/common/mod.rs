//! The one test toolkit every integration test shares (issue 9): one in-process server starter
//! ([`serve`]), one child-process wrapper for the real binary ([`proc`]), one way to wait for a
//! condition ([`wait`]), one log capture ([`logs`]) and manual time ([`time`]).
//!
//! The role harnesses (`support/cell`, `support/cluster`, `support/push`, `support/tls`,
//! `director_common`) keep their own names (constants, hosts, clusters, fakes) and build on these
//! pieces instead of each carrying its own copy. A test binary includes a harness with
//! `#[path = "support/<role>/mod.rs"] mod support;`; the harness includes this module as
//! `common`.
#![allow(dead_code)]

pub mod logs;
pub mod proc;
pub mod serve;
pub mod time;
pub mod wait;
