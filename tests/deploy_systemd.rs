//! `deploy/systemd/orca-relay.service` passes `systemd-analyze verify` (unknown keys, bad values,
//! missing executables), with the unit's binary path pointed at the binary cargo built. The
//! example environment file names only settings the relay knows. Skipped, with the reason
//! printed, where `systemd-analyze` is not installed.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_unit_verifies() {
    let unit = std::fs::read_to_string(root().join("deploy/systemd/orca-relay.service")).unwrap();
    for needed in [
        "DynamicUser=yes",
        "StateDirectory=orca-relay",
        "LimitNOFILE=",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
        "AmbientCapabilities=CAP_NET_BIND_SERVICE",
        "ExecStartPre=/usr/local/bin/orca-relay config check",
        "ExecStart=/usr/local/bin/orca-relay serve",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "EnvironmentFile=-/etc/orca-relay/orca-relay.env",
    ] {
        assert!(unit.contains(needed), "the unit lacks {needed}");
    }
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed (Debian package `systemd`)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orca-relay.service");
    let bin = env!("CARGO_BIN_EXE_orca-relay");
    std::fs::write(&path, unit.replace("/usr/local/bin/orca-relay", bin)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Lines about other units on the machine are not ours.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("orca-relay.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {:?}\n{stderr}",
        out.status
    );
}

#[test]
fn the_example_environment_sets_known_variables_only() {
    let env = std::fs::read_to_string(root().join("deploy/systemd/orca-relay.env")).unwrap();
    let help = Command::new(env!("CARGO_BIN_EXE_orca-relay"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for line in env.lines() {
        let line = line.trim_start_matches('#');
        let Some((name, _)) = line.split_once('=') else {
            continue;
        };
        if !name.starts_with("ORCA_RELAY_") || name.contains(' ') {
            continue;
        }
        let base = name.strip_suffix("_FILE").unwrap_or(name);
        assert!(
            help.contains(&format!("env: {base}")) || base == "ORCA_RELAY_DATA_DIR",
            "{name} in orca-relay.env is not a setting of `orca-relay serve`"
        );
    }
}
