//! The configuration file, its precedence under variables and flags, `*_FILE` secrets, the
//! unknown-variable warning, `config check`/`config print` and `migrate` on the binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ADMIN: &str = "admin-token-admin-token-admin-token-0001";
const KEY: &str = "0123456789abcdef0123456789abcdef";

fn temp() -> PathBuf {
    orca_relay::store::testing::temp_dir("orca-relay-config-file")
}

/// Runs the binary with a clean `ORCA_*` environment plus `envs`.
fn run(cwd: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orca-relay"));
    cmd.current_dir(cwd).args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ORCA_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(envs.iter().copied());
    cmd.output().expect("run orca-relay")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p.display().to_string()
}

fn print_line(out: &Output, key: &str) -> String {
    text(&out.stdout)
        .lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no {key} in {}", text(&out.stdout)))
        .to_string()
}

#[test]
fn unknown_file_key_stops_with_a_suggestion() {
    let d = temp();
    let f = write(&d, "c.toml", "listn = \"127.0.0.1:0\"\n");
    let out = run(&d, &["config", "check", "--config", &f], &[]);
    assert_eq!(out.status.code(), Some(2));
    let o = text(&out.stderr);
    assert!(
        o.contains("unknown key `listn` (did you mean `listen`?)"),
        "{o}"
    );
    // serve refuses the same way, before creating anything
    let out = run(&d, &["serve", "--config", &f], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown key `listn`"));
    assert!(!d.join("data").exists());
}

#[test]
fn wrong_type_in_file_names_the_key() {
    let d = temp();
    let f = write(&d, "c.toml", "database_pool_max = \"10\"\n");
    let out = run(&d, &["config", "check"], &[("ORCA_RELAY_CONFIG", &f)]);
    assert_eq!(out.status.code(), Some(2));
    let o = text(&out.stderr);
    assert!(o.contains("`database_pool_max` must be an integer"), "{o}");
    assert_eq!(o.lines().count(), 1, "{o}");
}

#[test]
fn misspelled_variable_warns_with_a_suggestion() {
    let d = temp();
    let out = run(
        &d,
        &["config", "check"],
        &[("ORCA_RELAY_LISTN", "x"), ("ORCA_RELAY_URL", "http://x")],
    );
    let e = text(&out.stderr);
    assert!(
        e.contains("unknown environment variable ORCA_RELAY_LISTN ignored (did you mean ORCA_RELAY_LISTEN?)"),
        "{e}"
    );
    assert!(!e.contains("ORCA_RELAY_URL"), "{e}");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

#[test]
fn secret_file_missing_names_variable_and_path() {
    let d = temp();
    let missing = d.join("nope").display().to_string();
    let out = run(
        &d,
        &["config", "check"],
        &[("ORCA_RELAY_ADMIN_TOKEN_FILE", &missing)],
    );
    assert_eq!(out.status.code(), Some(2));
    let o = text(&out.stdout);
    assert!(
        o.contains("ORCA_RELAY_ADMIN_TOKEN_FILE: cannot read"),
        "{o}"
    );
    assert!(o.contains(&missing), "{o}");
}

#[test]
fn secret_and_its_file_together_are_refused() {
    let d = temp();
    let p = write(&d, "admin", &format!("{ADMIN}\n"));
    let out = run(
        &d,
        &["config", "check"],
        &[
            ("ORCA_RELAY_ADMIN_TOKEN_FILE", &p),
            ("ORCA_RELAY_ADMIN_TOKEN", ADMIN),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout)
        .contains("set ORCA_RELAY_ADMIN_TOKEN or ORCA_RELAY_ADMIN_TOKEN_FILE, not both"));
}

#[test]
fn secret_file_value_is_used_and_validated() {
    let d = temp();
    let short = write(&d, "short", "tooshort\n");
    let out = run(
        &d,
        &["config", "check", "--role", "push"],
        &[("ORCA_RELAY_ADMIN_TOKEN_FILE", &short)],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("ORCA_RELAY_ADMIN_TOKEN must be 32..256"));
    let good = write(&d, "good", &format!("{ADMIN}\n"));
    let f = write(&d, "c.toml", &format!("admin_token_file = {good:?}\n"));
    let out = run(
        &d,
        &["config", "print", "--role", "push", "--config", &f],
        &[],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        print_line(&out, "admin_token"),
        "admin_token = <set>  # file (admin_token_file)"
    );
    assert!(!text(&out.stdout).contains(ADMIN));
}

#[test]
fn precedence_is_default_file_env_flag() {
    let d = temp();
    let f = write(
        &d,
        "c.toml",
        "cell_capacity = 11\ntrusted_proxy_hops = 2\nregion_rehome_poll_ms = 700\nsweep_interval_ms = 2000\n",
    );
    let out = run(
        &d,
        &[
            "config",
            "print",
            "--config",
            &f,
            "--region-rehome-poll-ms",
            "900",
        ],
        &[
            ("ORCA_RELAY_TRUSTED_PROXY_HOPS", "3"),
            ("ORCA_RELAY_REGION_REHOME_POLL_MS", "800"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(
        print_line(&out, "cell_capacity"),
        "cell_capacity = \"11\"  # file"
    );
    assert_eq!(
        print_line(&out, "trusted_proxy_hops"),
        "trusted_proxy_hops = \"3\"  # env (ORCA_RELAY_TRUSTED_PROXY_HOPS)"
    );
    assert_eq!(
        print_line(&out, "region_rehome_poll_ms"),
        "region_rehome_poll_ms = \"900\"  # flag (--region-rehome-poll-ms)"
    );
    assert_eq!(
        print_line(&out, "sweep_interval_ms"),
        "sweep_interval_ms = \"2000\"  # file"
    );
    assert_eq!(
        print_line(&out, "listen"),
        "listen = \"127.0.0.1:8080\"  # default"
    );
}

#[test]
fn print_hides_secrets() {
    let d = temp();
    let out = run(
        &d,
        &["config", "print", "--cluster-key", KEY],
        &[("ORCA_RELAY_ADMIN_TOKEN", ADMIN)],
    );
    assert_eq!(out.status.code(), Some(0));
    let o = text(&out.stdout);
    assert!(!o.contains(ADMIN) && !o.contains(KEY), "{o}");
    assert_eq!(
        print_line(&out, "admin_token"),
        "admin_token = <set>  # env (ORCA_RELAY_ADMIN_TOKEN)"
    );
    assert_eq!(
        print_line(&out, "cluster_key"),
        "cluster_key = <set>  # flag (--cluster-key)"
    );
    assert_eq!(
        print_line(&out, "metrics_token"),
        "metrics_token = <unset>  # default"
    );
}

#[test]
fn check_exit_codes_and_no_side_effects() {
    let d = temp();
    let out = run(&d, &["config", "check"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).starts_with("configuration OK"));
    assert!(
        !d.join("data").exists(),
        "config check created the data dir"
    );
    let out = run(&d, &["config", "check", "--listen", "nowhere"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("ORCA_RELAY_LISTEN must be a socket address"));
    // a bad value from the file names the key and the file too
    let f = write(&d, "c.toml", "listen = \"nowhere\"\n");
    let out = run(&d, &["config", "check", "--config", &f], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stdout).contains("(key `listen` in "),
        "{}",
        text(&out.stdout)
    );
    // the metrics token follows the admin token's rule
    let out = run(
        &d,
        &["config", "check"],
        &[("ORCA_RELAY_METRICS_TOKEN", "short")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("ORCA_RELAY_METRICS_TOKEN must be 32..256"));
}

#[test]
fn migrate_needs_only_the_database() {
    let d = temp();
    let db = format!("sqlite://{}", d.join("m.sqlite3").display());
    // role director without any secret: serve would refuse, migrate must not
    let out = run(
        &d,
        &["migrate"],
        &[
            ("ORCA_RELAY_DATABASE_URL", &db),
            ("ORCA_RELAY_ROLE", "director"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("migrations applied"));
    assert!(d.join("m.sqlite3").exists());
}
