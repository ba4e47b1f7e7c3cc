//! `deploy/compose/*/compose.yaml` are valid Compose files: `docker compose config -q` (or the
//! older `docker-compose config -q`) with the variables and secret files their READMEs create.
//! Skipped, with the reason printed, where neither tool runs. A structural check in Rust
//! (services, health checks, volumes) runs everywhere.

use std::path::{Path, PathBuf};
use std::process::Command;

fn dir(shape: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/compose")
        .join(shape)
}

fn read(shape: &str) -> String {
    std::fs::read_to_string(dir(shape).join("compose.yaml")).unwrap()
}

/// `docker compose` (v2 plugin) or `docker-compose` (v1), whichever answers `version`.
fn compose_tool() -> Option<Vec<&'static str>> {
    for cmd in [vec!["docker", "compose"], vec!["docker-compose"]] {
        let ok = Command::new(cmd[0])
            .args(&cmd[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(cmd);
        }
    }
    None
}

/// Copies `shape` into a temporary directory with the secret files its README makes.
fn staged(shape: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir(shape).join("compose.yaml"),
        t.path().join("compose.yaml"),
    )
    .unwrap();
    let secrets = t.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    for s in ["admin_token", "cluster_key", "signing_key", "db_password"] {
        std::fs::write(secrets.join(s), "0".repeat(64)).unwrap();
    }
    std::fs::write(
        secrets.join("database.env"),
        "ORCA_RELAY_DATABASE_URL=postgres://orca:x@postgres:5432/orca\n",
    )
    .unwrap();
    t
}

fn config(tool: &[&str], at: &Path, domain: Option<&str>) -> std::process::Output {
    let mut c = Command::new(tool[0]);
    c.args(&tool[1..])
        .args(["config", "-q"])
        .current_dir(at)
        .env_remove("RELAY_DOMAIN")
        .env_remove("ACME_EMAIL");
    if let Some(d) = domain {
        c.env("RELAY_DOMAIN", d);
    }
    c.output().unwrap()
}

#[test]
fn compose_files_validate() {
    let Some(tool) = compose_tool() else {
        eprintln!("skipped: neither `docker compose` nor `docker-compose` is installed");
        return;
    };
    for shape in ["single-node", "cluster"] {
        let t = staged(shape);
        let out = config(&tool, t.path(), Some("relay.example.org"));
        assert!(
            out.status.success(),
            "{shape}: {tool:?} config -q: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The domain is required: without it the file refuses to render, naming it.
        let out = config(&tool, t.path(), None);
        assert!(
            !out.status.success(),
            "{shape}: renders without RELAY_DOMAIN"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("RELAY_DOMAIN"),
            "{shape}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn single_node_shape() {
    let y = read("single-node");
    for needed in [
        "ORCA_RELAY_TLS_ACME_DOMAINS",
        "\"443:443\"",
        "relay-data:/data",
        "test: [\"CMD\", \"orca-relay\", \"health\"",
        "target: runtime",
    ] {
        assert!(
            y.contains(needed),
            "single-node compose.yaml lacks {needed}"
        );
    }
}

#[test]
fn cluster_shape() {
    let y = read("cluster");
    for service in [
        "postgres:",
        "director-1:",
        "director-2:",
        "cell-1:",
        "cell-2:",
        "push:",
    ] {
        assert!(
            y.lines().any(|l| l == format!("  {service}")),
            "cluster compose.yaml lacks service {service}"
        );
    }
    for needed in [
        "ORCA_RELAY_CELL_ID: cell-1",
        "ORCA_RELAY_CELL_ID: cell-2",
        "ORCA_RELAY_ADMIN_TOKEN_FILE: /run/secrets/admin_token",
        "ORCA_RELAY_CLUSTER_KEY_FILE: /run/secrets/cluster_key",
        "pg_isready",
        "condition: service_healthy",
    ] {
        assert!(y.contains(needed), "cluster compose.yaml lacks {needed}");
    }
    let readme = std::fs::read_to_string(dir("cluster").join("README.md")).unwrap();
    assert!(
        readme.contains("orca-relay admin roll"),
        "README lacks the roll"
    );
}
