//! Hosts, their assignment row, activity leases and open migration (ARCHITECTURE.md).

use super::activity::LeaseKind;

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

/// The six per-kind lease counters of an assignment row (invariant 2: they equal the counts of
/// the host's lease rows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseCounts {
    pub controls: i64,
    pub splices: i64,
    pub invites: i64,
    pub installs: i64,
    pub confirmations: i64,
    pub migrations: i64,
}

impl LeaseCounts {
    /// The counter of `kind`.
    pub fn of_mut(&mut self, kind: LeaseKind) -> &mut i64 {
        match kind {
            LeaseKind::Control => &mut self.controls,
            LeaseKind::Splice => &mut self.splices,
            LeaseKind::Invite => &mut self.invites,
            LeaseKind::Install => &mut self.installs,
            LeaseKind::Confirmation => &mut self.confirmations,
            LeaseKind::Migration => &mut self.migrations,
        }
    }

    /// Counts leases by kind.
    pub fn of_leases<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> LeaseCounts {
        let mut c = LeaseCounts::default();
        for l in leases {
            *c.of_mut(l.kind) += 1;
        }
        c
    }

    pub fn is_zero(&self) -> bool {
        *self == LeaseCounts::default()
    }
}

/// The stored `relay_assignments` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssignmentRow {
    pub cell_id: String,
    pub assignment_epoch: i64,
    pub lease_expires_at: i64,
    pub last_activity_at: i64,
    pub counters: LeaseCounts,
    pub preferred_region: Option<String>,
}

/// One activity lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The stored id; [`super::ActivityId::parse`] gives its typed form.
    pub activity_id: String,
    pub kind: LeaseKind,
    pub cell_id: String,
    pub request_units: i64,
    pub expires_at: i64,
    pub control_generation: Option<i64>,
    pub cell_incarnation: Option<String>,
    pub idle_regional_rehome: bool,
    pub renewed_at: Option<i64>,
}

/// The host's open migration (not completed, not aborted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenMigration {
    pub assignment_epoch: i64,
    pub kind: String,
    pub source_cell_id: String,
    pub target_cell_id: String,
    pub previous_epoch: i64,
    pub target_registered_at: Option<i64>,
    pub created_at: i64,
}

/// A placed host as a locking transaction sees it: its row, leases and open migration.
#[derive(Debug, Clone)]
pub struct HostView {
    pub row: AssignmentRow,
    pub leases: Vec<Lease>,
    pub open_migration: Option<OpenMigration>,
}

/// A `relay_assignment_migrations` row (the Migration object of docs/reference/http.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    pub host: HostKey,
    pub kind: String,
    pub source_cell_id: String,
    pub target_cell_id: String,
    pub previous_epoch: i64,
    pub assignment_epoch: i64,
    pub source_request_units: i64,
    pub target_reserved_units: i64,
    pub arrival_deadline: i64,
    pub expires_at: i64,
    pub target_registered_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub aborted_at: Option<i64>,
    pub abort_reason: Option<String>,
    pub created_at: i64,
}

impl Migration {
    /// The open-migration view of this row.
    pub fn open(&self) -> OpenMigration {
        OpenMigration {
            assignment_epoch: self.assignment_epoch,
            kind: self.kind.clone(),
            source_cell_id: self.source_cell_id.clone(),
            target_cell_id: self.target_cell_id.clone(),
            previous_epoch: self.previous_epoch,
            target_registered_at: self.target_registered_at,
            created_at: self.created_at,
        }
    }
}
