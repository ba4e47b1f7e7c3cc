//! Unknown `ORCA_RELAY_*` / `ORCA_PUSH_*` environment variables: a misspelled variable would
//! otherwise be ignored silently, so start-up warns once per unknown name, with a suggestion.

use std::ffi::OsString;

use super::settings::{did_you_mean, OTHER_VARIABLES, SETTINGS};

/// Every variable name the relay reads (settings, secrets' `*_FILE`, other commands and tools).
pub fn known_variables() -> Vec<String> {
    let mut known: Vec<String> = SETTINGS.iter().map(|s| s.env.to_string()).collect();
    known.extend(SETTINGS.iter().filter_map(|s| s.env_file()));
    known.extend(OTHER_VARIABLES.iter().map(|v| v.to_string()));
    known
}

/// One warning line per unknown `ORCA_RELAY_*` / `ORCA_PUSH_*` name among `vars`, sorted.
pub fn unknown_variable_warnings(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<String> {
    let known = known_variables();
    let mut names: Vec<String> = vars
        .into_iter()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .filter(|k| k.starts_with("ORCA_RELAY_") || k.starts_with("ORCA_PUSH_"))
        .filter(|k| !known.iter().any(|n| n == k))
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(
            |name| match did_you_mean(&name, known.iter().map(String::as_str)) {
                Some(m) => {
                    format!("unknown environment variable {name} ignored (did you mean {m}?)")
                }
                None => format!("unknown environment variable {name} ignored"),
            },
        )
        .collect()
}

/// [`unknown_variable_warnings`] of the process environment.
pub fn process_warnings() -> Vec<String> {
    unknown_variable_warnings(std::env::vars_os())
}

#[cfg(test)]
mod tests {
    use super::unknown_variable_warnings;

    fn warn(names: &[&str]) -> Vec<String> {
        unknown_variable_warnings(names.iter().map(|n| (n.into(), "x".into())))
    }

    #[test]
    fn misspelled_variables_warn_with_a_suggestion() {
        assert_eq!(
            warn(&["ORCA_RELAY_LISTN", "PATH", "ORCA_PUSH_APNS_TOPC"]),
            [
                "unknown environment variable ORCA_PUSH_APNS_TOPC ignored (did you mean ORCA_PUSH_APNS_TOPIC?)",
                "unknown environment variable ORCA_RELAY_LISTN ignored (did you mean ORCA_RELAY_LISTEN?)",
            ]
        );
        assert_eq!(
            warn(&["ORCA_RELAY_ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ"]).len(),
            1
        );
    }

    #[test]
    fn known_variables_do_not_warn() {
        assert!(warn(&[
            "ORCA_RELAY_LISTEN",
            "ORCA_RELAY_ADMIN_TOKEN_FILE",
            "ORCA_PUSH_APNS_KEY_FILE",
            "ORCA_RELAY_CONFIG",
            "ORCA_RELAY_URL",
            "ORCA_RELAY_TEST_POSTGRES_URL",
            "ORCA_RELAY_BLESS",
            "ORCA_RELAY_ROLL_CELL",
            "ORCA_RELAY_BIN",
            "ORCA_RELAY_REGION_TEST_HOSTS",
            "ORCA_OTHER_THING",
        ])
        .is_empty());
    }
}
