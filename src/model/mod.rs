//! The domain types every layer shares: hosts, activities, assignments, leases, migrations and
//! cells as plain data.
//!
//! `model` depends on `contract` only. The store reads rows into these types and writes them back;
//! the director's pure rules (`director::liveness`, `director::placement`) add their rule methods
//! to them (`impl CellView`, `impl HostView` live beside the rules, so a rule and its tests stay in
//! one file); the cell and the routes pass them around. No I/O, no clock, no JSON here.

pub mod activity;
pub mod assignment;
pub mod cell;
pub mod push;

pub use activity::{parse_control_id, parse_decimal, ActivityId, ActivityKind, LeaseKind};
pub use assignment::{
    AssignmentRow, AssignmentView, HostKey, HostView, Lease, LeaseCounts, Migration, OpenMigration,
};
pub use cell::{Admission, Beat, BeatTelemetry, CellView, Fence, Runtime, Telemetry};
