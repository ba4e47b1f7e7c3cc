//! Assignment and activity-lease operations called by cells (director.md §5.5, protocol.md §0).
//!
//! These are the durable half of the "at most one cell serves a host" invariant: the cell checks its
//! authority here before activating a control and on every renewal.
//!
//! OWNERSHIP: implemented by the director work (placement shares these tables and counters); the
//! signatures are the contract the cell codes against.

use super::{Db, DbError};

/// A host: (`userId` = host-token `sub`, `relayHostId`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostKey {
    pub user_id: String,
    pub relay_host_id: String,
}

/// What `resolveAssignment` returns: the host's home and epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignmentView {
    pub cell_id: String,
    pub cell_url: String,
    pub assignment_epoch: i64,
    pub lease_expires_at: i64,
}

/// Activity kinds (director.md §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivityKind {
    Control,
    Splice,
    Invite,
    Install,
    Confirmation,
}

impl ActivityKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActivityKind::Control => "control",
            ActivityKind::Splice => "splice",
            ActivityKind::Invite => "invite",
            ActivityKind::Install => "install",
            ActivityKind::Confirmation => "confirmation",
        }
    }
}

/// Refusals of the activity operations; `code()` is the spec's error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivityError {
    WrongAssignment,
    AssignmentNotFound,
    ActivityCellNotAuthoritative,
    RelayCapacityExhausted,
    InvalidActivityId,
    InvalidActivityKind,
    InvalidActivityExpiry,
    Db(DbError),
}

impl ActivityError {
    pub fn code(&self) -> &'static str {
        match self {
            ActivityError::WrongAssignment => "wrong_assignment",
            ActivityError::AssignmentNotFound => "assignment_not_found",
            ActivityError::ActivityCellNotAuthoritative => "activity_cell_not_authoritative",
            ActivityError::RelayCapacityExhausted => "relay_capacity_exhausted",
            ActivityError::InvalidActivityId => "invalid_activity_id",
            ActivityError::InvalidActivityKind => "invalid_activity_kind",
            ActivityError::InvalidActivityExpiry => "invalid_activity_expiry",
            ActivityError::Db(_) => "database_error",
        }
    }
}

impl From<DbError> for ActivityError {
    fn from(e: DbError) -> Self {
        ActivityError::Db(e)
    }
}

impl super::RetryClass for ActivityError {
    fn retry_code(&self) -> Option<&'static str> {
        match self {
            ActivityError::Db(e) => e.retry_code(),
            _ => None,
        }
    }
}

/// `activateControl` input (protocol.md §0, director.md §5.5).
#[derive(Debug, Clone)]
pub struct ActivateControl {
    pub cell_id: String,
    pub assignment_epoch: i64,
    pub generation: i64,
    pub connection_inclusion_watermark: Option<i64>,
    pub idle_regional_rehome: bool,
    pub cell_incarnation: String,
}

/// One row of a `renewControlActivities` batch.
#[derive(Debug, Clone)]
pub struct RenewalRow {
    pub host: HostKey,
    pub activity_id: String,
    pub expires_at: i64,
}

/// Per-row outcome of a renewal batch (director.md §5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalOutcome {
    Renewed,
    InvalidActivityId,
    InvalidActivityExpiry,
    AssignmentLockUnavailable,
    AssignmentNotFound,
    ActivityCellNotAuthoritative,
    ControlActivityNotFound,
    ControlActivityMoved,
    DatabaseError,
}

/// True iff the host's row names `cell_id` at exactly `epoch` (plain read).
pub async fn verify_cell_assignment(
    db: &Db,
    host: &HostKey,
    cell_id: &str,
    epoch: i64,
) -> Result<bool, DbError> {
    let _ = (db, host, cell_id, epoch);
    todo!("director work")
}

/// The host's home, epoch and lease (plain read, no side effects).
pub async fn resolve_assignment(
    db: &Db,
    host: &HostKey,
) -> Result<Option<AssignmentView>, DbError> {
    let _ = (db, host);
    todo!("director work")
}

/// Converts `control-pending:<epoch>` (or charges 1) into `control:<cellId>:<generation>`; returns
/// the activity id.
pub async fn activate_control(
    db: &Db,
    host: &HostKey,
    req: &ActivateControl,
    now: i64,
) -> Result<String, ActivityError> {
    let _ = (db, host, req, now);
    todo!("director work")
}

/// Marks the open migration targeting `cell_id` at `epoch` as registered.
pub async fn mark_migration_target_registered(
    db: &Db,
    host: &HostKey,
    cell_id: &str,
    epoch: i64,
    now: i64,
) -> Result<(), DbError> {
    let _ = (db, host, cell_id, epoch, now);
    todo!("director work")
}

/// Acquires or extends `activity_id` on `cell_id` (default expiry now + 90 000).
pub async fn acquire_activity(
    db: &Db,
    host: &HostKey,
    activity_id: &str,
    kind: ActivityKind,
    cell_id: &str,
    expires_at: Option<i64>,
    now: i64,
) -> Result<(), ActivityError> {
    let _ = (db, host, activity_id, kind, cell_id, expires_at, now);
    todo!("director work")
}

/// Deletes the lease if present and frees its units (idempotent).
pub async fn release_activity(
    db: &Db,
    host: &HostKey,
    activity_id: &str,
    now: i64,
) -> Result<(), DbError> {
    let _ = (db, host, activity_id, now);
    todo!("director work")
}

/// Renews a batch of control activities of one cell, one outcome per row, in order.
pub async fn renew_control_activities(
    db: &Db,
    cell_id: &str,
    cell_incarnation: &str,
    rows: &[RenewalRow],
    now: i64,
) -> Vec<RenewalOutcome> {
    let _ = (db, cell_id, cell_incarnation, rows, now);
    todo!("director work")
}
