//! Activity ids and kinds (ARCHITECTURE.md): the typed form of the `<kind>:<rest>` strings the
//! lease table stores, so code builds and reads ids through one parser instead of `format!` and
//! `split(':')`.

use std::fmt;

use crate::contract::validate::{is_cell_id, is_opaque_id, is_safe_integer};

/// Activity kinds a cell acquires (ARCHITECTURE.md).
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
        self.lease_kind().as_str()
    }

    /// The stored kind of a lease of this activity.
    pub fn lease_kind(self) -> LeaseKind {
        match self {
            ActivityKind::Control => LeaseKind::Control,
            ActivityKind::Splice => LeaseKind::Splice,
            ActivityKind::Invite => LeaseKind::Invite,
            ActivityKind::Install => LeaseKind::Install,
            ActivityKind::Confirmation => LeaseKind::Confirmation,
        }
    }

    /// Request units of a kind (ARCHITECTURE.md).
    pub fn units(self) -> i64 {
        match self {
            ActivityKind::Splice => 2,
            _ => 1,
        }
    }
}

/// The `activity_kind` column: the cell's kinds plus the director's migration lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    Control,
    Splice,
    Invite,
    Install,
    Confirmation,
    Migration,
}

impl LeaseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Control => "control",
            LeaseKind::Splice => "splice",
            LeaseKind::Invite => "invite",
            LeaseKind::Install => "install",
            LeaseKind::Confirmation => "confirmation",
            LeaseKind::Migration => "migration",
        }
    }

    /// Reads a stored kind. Anything unknown counts as a migration lease, the one kind cells never
    /// write, so a corrupt row blocks roll isolation rather than passing for a simple host.
    pub fn from_stored(s: &str) -> LeaseKind {
        match s {
            "control" => LeaseKind::Control,
            "splice" => LeaseKind::Splice,
            "invite" => LeaseKind::Invite,
            "install" => LeaseKind::Install,
            "confirmation" => LeaseKind::Confirmation,
            _ => LeaseKind::Migration,
        }
    }
}

/// A parsed activity id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ActivityId {
    /// `control-pending:<epoch>`: the control a grant or move reserves for the next `host-hello`.
    ControlPending {
        epoch: i64,
    },
    /// `control:<cellId>:<generation>`: an active control.
    Control {
        cell_id: String,
        generation: i64,
    },
    /// `migration:<epoch>`: the source units an evacuation keeps charged on the target.
    Migration {
        epoch: i64,
    },
    Splice(String),
    Invite(String),
    InviteOffer(String),
    Install(String),
    Confirmation(String),
}

impl ActivityId {
    /// Parses a stored or submitted id; `None` when it is not one of the forms.
    pub fn parse(s: &str) -> Option<ActivityId> {
        let (prefix, rest) = s.split_once(':')?;
        let opaque = || is_opaque_id(rest).then(|| rest.to_string());
        Some(match prefix {
            "control-pending" => ActivityId::ControlPending {
                epoch: parse_decimal(rest)?,
            },
            "migration" => ActivityId::Migration {
                epoch: parse_decimal(rest)?,
            },
            "control" => {
                let (cell, generation) = parse_control_id(s)?;
                ActivityId::Control {
                    cell_id: cell.to_string(),
                    generation,
                }
            }
            "splice" => ActivityId::Splice(opaque()?),
            "invite" => ActivityId::Invite(opaque()?),
            "invite-offer" => ActivityId::InviteOffer(opaque()?),
            "install" => ActivityId::Install(opaque()?),
            "confirmation" => ActivityId::Confirmation(opaque()?),
            _ => return None,
        })
    }

    /// The stored kind of this id's lease.
    pub fn kind(&self) -> LeaseKind {
        match self {
            ActivityId::ControlPending { .. } | ActivityId::Control { .. } => LeaseKind::Control,
            ActivityId::Migration { .. } => LeaseKind::Migration,
            ActivityId::Splice(_) => LeaseKind::Splice,
            ActivityId::Invite(_) | ActivityId::InviteOffer(_) => LeaseKind::Invite,
            ActivityId::Install(_) => LeaseKind::Install,
            ActivityId::Confirmation(_) => LeaseKind::Confirmation,
        }
    }

    /// True for the ids only the director writes (a cell may not acquire them).
    pub fn director_only(s: &str) -> bool {
        s.starts_with("control-pending:") || s.starts_with("migration:")
    }
}

impl fmt::Display for ActivityId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActivityId::ControlPending { epoch } => write!(f, "control-pending:{epoch}"),
            ActivityId::Control {
                cell_id,
                generation,
            } => write!(f, "control:{cell_id}:{generation}"),
            ActivityId::Migration { epoch } => write!(f, "migration:{epoch}"),
            ActivityId::Splice(x) => write!(f, "splice:{x}"),
            ActivityId::Invite(x) => write!(f, "invite:{x}"),
            ActivityId::InviteOffer(x) => write!(f, "invite-offer:{x}"),
            ActivityId::Install(x) => write!(f, "install:{x}"),
            ActivityId::Confirmation(x) => write!(f, "confirmation:{x}"),
        }
    }
}

/// Parses `control:<cellId>:<generation>` into `(cellId, generation)` without allocating (the
/// renewal batch checks every row with it).
pub fn parse_control_id(id: &str) -> Option<(&str, i64)> {
    let rest = id.strip_prefix("control:")?;
    let (cell, generation) = rest.rsplit_once(':')?;
    if !is_cell_id(cell) {
        return None;
    }
    let g = parse_decimal(generation)?;
    Some((cell, g))
}

/// A decimal integer 0..2^53−1 without sign or leading zeros.
pub fn parse_decimal(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 16 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    let v: i64 = s.parse().ok()?;
    is_safe_integer(v).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_the_parser() {
        for s in [
            "control-pending:3",
            "control:cell-a:7",
            "migration:12",
            "splice:x1",
            "invite:abc",
            "invite-offer:req",
            "install:i",
            "confirmation:c",
        ] {
            let id = ActivityId::parse(s).unwrap_or_else(|| panic!("{s}"));
            assert_eq!(id.to_string(), s);
        }
        assert_eq!(
            ActivityId::parse("control:cell-a:7").unwrap().kind(),
            LeaseKind::Control
        );
        assert_eq!(
            ActivityId::parse("invite-offer:r").unwrap().kind(),
            LeaseKind::Invite
        );
    }

    #[test]
    fn malformed_ids_are_refused() {
        for s in [
            "",
            "control",
            "control:cell",
            "control:cell:01",
            "control-pending:-1",
            "migration:x",
            "splice:",
            "other:x",
        ] {
            assert_eq!(ActivityId::parse(s), None, "{s}");
        }
        assert_eq!(parse_decimal("9007199254740992"), None);
        assert_eq!(
            parse_decimal("9007199254740991"),
            Some(9_007_199_254_740_991)
        );
    }

    #[test]
    fn unknown_stored_kinds_count_as_migration() {
        assert_eq!(LeaseKind::from_stored("splice"), LeaseKind::Splice);
        assert_eq!(LeaseKind::from_stored("?"), LeaseKind::Migration);
    }
}
