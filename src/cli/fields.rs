//! The fields of `admin …` commands, checked as the relay checks them before anything is sent,
//! so a bad value is refused with the flag's name instead of a bare `400 invalid_request`.

use super::AdminCommand;

/// The fields of an admin command, checked as the relay checks them, so a refusal names the
/// flag instead of coming back as a bare `invalid_request`.
pub fn check_admin(cmd: &AdminCommand) -> Result<(), String> {
    use crate::contract::limits::{DRAIN_GRACE_MAX_MS, DRAIN_PACE_MAX_MS};
    let cell = |flag: &str, v: &str| {
        if crate::contract::validate::is_cell_id(v) {
            Ok(())
        } else {
            Err(format!(
                "{flag} must be 1..128 characters of [A-Za-z0-9_.-], got {v:?}"
            ))
        }
    };
    match cmd {
        AdminCommand::Status | AdminCommand::Overview | AdminCommand::Roll(_) => Ok(()),
        AdminCommand::Drain {
            grace_ms,
            pace_window_ms,
        } => {
            if *grace_ms > DRAIN_GRACE_MAX_MS {
                return Err(format!(
                    "--grace-ms must be 0..{DRAIN_GRACE_MAX_MS}, got {grace_ms}"
                ));
            }
            match pace_window_ms {
                Some(p) if *p > DRAIN_PACE_MAX_MS => Err(format!(
                    "--pace-window-ms must be 0..{DRAIN_PACE_MAX_MS}, got {p}"
                )),
                _ => Ok(()),
            }
        }
        AdminCommand::CellState {
            cell_id,
            state,
            roll_isolated,
        } => {
            cell("--cell-id", cell_id)?;
            let Some(admission) = crate::model::Admission::parse(state) else {
                return Err(format!(
                    "--state must be general, migration-only or existing-only, got {state:?}"
                ));
            };
            if *roll_isolated == Some(true) && admission != crate::model::Admission::MigrationOnly {
                return Err("--roll-isolated true needs --state migration-only".into());
            }
            Ok(())
        }
        AdminCommand::Fence {
            cell_id,
            cell_incarnation,
        } => {
            cell("--cell-id", cell_id)?;
            if !crate::contract::validate::is_opaque_id(cell_incarnation) {
                return Err(format!(
                    "--cell-incarnation must be 1..128 characters, got {cell_incarnation:?}"
                ));
            }
            Ok(())
        }
        AdminCommand::Evacuate {
            source_cell_id,
            target_cell_id,
            limit,
        } => {
            cell("--source-cell-id", source_cell_id)?;
            if let Some(t) = target_cell_id {
                cell("--target-cell-id", t)?;
            }
            if !(1..=100).contains(limit) {
                return Err(format!("--limit must be 1..100, got {limit}"));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(cmd: AdminCommand) -> String {
        check_admin(&cmd).unwrap_err()
    }

    fn state(cell_id: &str, state: &str, roll_isolated: Option<bool>) -> AdminCommand {
        AdminCommand::CellState {
            cell_id: cell_id.into(),
            state: state.into(),
            roll_isolated,
        }
    }

    fn evacuate(source: &str, target: Option<&str>, limit: u32) -> AdminCommand {
        AdminCommand::Evacuate {
            source_cell_id: source.into(),
            target_cell_id: target.map(str::to_string),
            limit,
        }
    }

    #[test]
    fn valid_commands_pass() {
        for cmd in [
            AdminCommand::Status,
            AdminCommand::Overview,
            AdminCommand::Drain {
                grace_ms: 3_600_000,
                pace_window_ms: Some(300_000),
            },
            state("cell-a", "migration-only", Some(true)),
            state("cell-a", "general", Some(false)),
            AdminCommand::Fence {
                cell_id: "cell-a".into(),
                cell_incarnation: "0b6c7a52-8d8f-4d5e-9d3a-7d1f2a4e5b6c".into(),
            },
            evacuate("cell-a", Some("cell-b"), 100),
            evacuate("cell-a", None, 1),
        ] {
            assert_eq!(check_admin(&cmd), Ok(()), "{cmd:?}");
        }
    }

    #[test]
    fn drain_grace_out_of_range() {
        let e = refused(AdminCommand::Drain {
            grace_ms: 3_600_001,
            pace_window_ms: None,
        });
        assert_eq!(e, "--grace-ms must be 0..3600000, got 3600001");
    }

    #[test]
    fn drain_pace_out_of_range() {
        let e = refused(AdminCommand::Drain {
            grace_ms: 0,
            pace_window_ms: Some(300_001),
        });
        assert_eq!(e, "--pace-window-ms must be 0..300000, got 300001");
    }

    #[test]
    fn cell_state_bad_cell_id() {
        let e = refused(state("cell/a", "general", None));
        assert!(e.starts_with("--cell-id must be 1..128 characters"), "{e}");
        let e = refused(state("", "general", None));
        assert!(e.starts_with("--cell-id must be"), "{e}");
    }

    #[test]
    fn cell_state_unknown_state() {
        let e = refused(state("cell-a", "drained", None));
        assert_eq!(
            e,
            "--state must be general, migration-only or existing-only, got \"drained\""
        );
    }

    #[test]
    fn roll_isolation_needs_migration_only() {
        let e = refused(state("cell-a", "general", Some(true)));
        assert_eq!(e, "--roll-isolated true needs --state migration-only");
    }

    #[test]
    fn fence_bad_cell_id_and_incarnation() {
        let e = refused(AdminCommand::Fence {
            cell_id: "a b".into(),
            cell_incarnation: "x".into(),
        });
        assert!(e.starts_with("--cell-id must be"), "{e}");
        let e = refused(AdminCommand::Fence {
            cell_id: "cell-a".into(),
            cell_incarnation: String::new(),
        });
        assert!(e.starts_with("--cell-incarnation must be 1..128"), "{e}");
    }

    #[test]
    fn evacuate_bad_fields() {
        let e = refused(evacuate("a:b", None, 1));
        assert!(e.starts_with("--source-cell-id must be"), "{e}");
        let e = refused(evacuate("a", Some("b/c"), 1));
        assert!(e.starts_with("--target-cell-id must be"), "{e}");
        assert_eq!(
            refused(evacuate("a", None, 0)),
            "--limit must be 1..100, got 0"
        );
        assert_eq!(
            refused(evacuate("a", None, 101)),
            "--limit must be 1..100, got 101"
        );
    }
}
