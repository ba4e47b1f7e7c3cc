//! The real binary: `orca-relay serve` with nothing configured creates its data directory and
//! secrets, serves, restarts with the same secrets, exits on SIGTERM, and never logs a secret.

mod support;
use support::common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::proc::{self as cproc, Log, Spec};
use orca_relay::store::testing::{temp_dir, TestDb};

struct Server {
    child: Child,
    addr: String,
    log: Log,
    reader: Option<std::thread::JoinHandle<()>>,
}

fn spawn(cwd: &Path, envs: &[(&str, &str)]) -> Server {
    let mut all = vec![("ORCA_RELAY_LISTEN".to_string(), "127.0.0.1:0".to_string())];
    all.extend(envs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let spec = Spec {
        cwd: Some(cwd),
        ..Spec::new("serve", &[], &all)
    };
    let log = Log::default();
    let s = cproc::spawn_serve(&spec, &log, Duration::from_secs(20))
        .unwrap_or_else(|()| panic!("server did not start: {:?}", cproc::lines(&log)));
    Server {
        child: s.child,
        addr: s.addr,
        log,
        reader: Some(s.reader),
    }
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// SIGTERM and wait; returns the exit code, how long it took and every line it logged.
    fn terminate(mut self) -> (i32, Duration, Vec<String>) {
        let start = Instant::now();
        let status = cproc::terminate(&mut self.child, Duration::from_secs(12), "serve");
        let took = start.elapsed();
        // The reader ends at the end of the child's stderr: after it, every line is in the log.
        if let Some(r) = self.reader.take() {
            r.join().expect("stderr reader");
        }
        (status.code().unwrap_or(-1), took, cproc::lines(&self.log))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        cproc::kill(&mut self.child);
    }
}

fn read_secrets(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("data/secrets.json")).unwrap()).unwrap()
}

async fn mint(s: &Server, self_hosted_key: &str) -> reqwest::Response {
    let kp = orca_relay::crypto::nacl::X25519Keypair::from_secret([7; 32]);
    reqwest::Client::new()
        .post(s.url("/v1/host-token"))
        .bearer_auth(self_hosted_key)
        .json(&serde_json::json!({
            "relayHostId": orca_relay::crypto::ident::relay_host_id(&kp.public),
            "hostPublicKeyB64": orca_relay::crypto::b64::std_encode(&kp.public),
        }))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn single_node_defaults_restart_and_sigterm() {
    let cwd = temp_dir("orca-relay-serve");
    let s = spawn(&cwd, &[]);
    assert!(cwd.join("data/orca-relay.sqlite3").exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(cwd.join("data/secrets.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let secrets = read_secrets(&cwd);
    let health: serde_json::Value = reqwest::get(s.url("/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        health["roles"],
        serde_json::json!(["director", "cell", "push"])
    );
    let ready = reqwest::get(s.url("/ready")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let resp = mint(&s, secrets["selfHostedKey"].as_str().unwrap()).await;
    assert_eq!(resp.status(), 200);
    let (code, took, log) = s.terminate();
    assert_eq!(code, 0, "{log:?}");
    assert!(took < Duration::from_secs(10));
    assert!(log.iter().any(|l| l.contains("orca_relay_process_started")));
    assert!(log
        .iter()
        .any(|l| l.contains("orca_relay_process_stopping")));

    // Restart: the same secrets file is reused, unchanged.
    let before = std::fs::read(cwd.join("data/secrets.json")).unwrap();
    let s = spawn(&cwd, &[]);
    assert_eq!(
        std::fs::read(cwd.join("data/secrets.json")).unwrap(),
        before
    );
    let resp = mint(&s, secrets["selfHostedKey"].as_str().unwrap()).await;
    assert_eq!(resp.status(), 200);
    let (code, _, log2) = s.terminate();
    assert_eq!(code, 0);

    // No secret value ever reaches the log.
    for line in log.iter().chain(log2.iter()) {
        for (name, value) in secrets.as_object().unwrap() {
            if let Some(v) = value.as_str() {
                assert!(!line.contains(v), "{name} leaked into the log: {line}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&cwd);
}

#[tokio::test]
async fn bad_configuration_exits_with_one_line() {
    let cwd = temp_dir("orca-relay-serve");
    let out = Command::new(env!("CARGO_BIN_EXE_orca-relay"))
        .current_dir(&cwd)
        .env_clear()
        .env("ORCA_RELAY_ROLE", "director")
        .env("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", "short")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "ORCA_RELAY_ASSIGNMENT_SIGNING_KEY must be at least 32 bytes"
    );
    let _ = std::fs::remove_dir_all(&cwd);
}

#[tokio::test]
async fn postgres_url_migrates_and_serves() {
    let Some(t) = TestDb::postgres().await else {
        return;
    };
    // A second start against the already-migrated schema works too (migrations are idempotent).
    let cwd = temp_dir("orca-relay-serve");
    let key = "0123456789abcdef0123456789abcdef";
    let admin = "admin-token-admin-token-admin-token-0001";
    let shk = "self-hosted-key-self-hosted-key-0001";
    let envs = [
        ("ORCA_RELAY_DATABASE_URL", t.url.as_str()),
        ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", key),
        ("ORCA_RELAY_CLUSTER_KEY", key),
        ("ORCA_RELAY_ADMIN_TOKEN", admin),
        ("ORCA_RELAY_SELF_HOSTED_KEY", shk),
    ];
    let s = spawn(&cwd, &envs);
    assert!(
        !cwd.join("data/secrets.json").exists(),
        "nothing generated outside single node"
    );
    assert_eq!(reqwest::get(s.url("/ready")).await.unwrap().status(), 200);
    assert_eq!(mint(&s, shk).await.status(), 200);
    let (code, _, log) = s.terminate();
    assert_eq!(code, 0);
    assert!(log.iter().any(|l| l.contains("\"database\":\"postgres\"")));
    for line in &log {
        assert!(!line.contains(key) && !line.contains(admin) && !line.contains(shk));
    }
    let _ = std::fs::remove_dir_all(&cwd);
}

#[tokio::test]
async fn admin_and_host_token_commands_talk_to_a_running_server() {
    let cwd = temp_dir("orca-relay-serve");
    let s = spawn(&cwd, &[]);
    let url = format!("http://{}", s.addr);
    let data = cwd.join("data");
    let run = |args: &[&str], envs: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orca-relay"));
        cmd.arg(args[0])
            .env_clear()
            .arg("--url")
            .arg(&url)
            .arg("--data-dir")
            .arg(&data)
            .args(&args[1..]);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let kp = orca_relay::crypto::nacl::X25519Keypair::from_secret([9; 32]);
    let key = orca_relay::crypto::b64::std_encode(&kp.public);
    let out = run(&["host-token", "--key", &key], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["relayToken"].as_str().unwrap().split('.').count() == 3);

    let out = run(&["admin", "status"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["roles"], serde_json::json!(["director", "cell", "push"]));

    let wrong = "wrong-admin-token-wrong-admin-token-0001";
    let out = run(&["admin", "status"], &[("ORCA_RELAY_ADMIN_TOKEN", wrong)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid_token"));
    let out = run(&["host-token", "--key", "not-a-key"], &[]);
    assert!(!out.status.success());
    // The global flags work after the subcommand and before it too (issue 10).
    let data_s = data.display().to_string();
    for args in [
        vec!["admin", "overview", "--url", &url, "--data-dir", &data_s],
        vec!["--url", &url, "--data-dir", &data_s, "admin", "overview"],
        vec!["admin", "--url", &url, "overview", "--data-dir", &data_s],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_orca-relay"))
            .env_clear()
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["cells"][0]["cellId"], "local", "{args:?}");
    }
    // The environment variable names the server when no flag does; a flag beats it.
    let out = Command::new(env!("CARGO_BIN_EXE_orca-relay"))
        .env_clear()
        .env("ORCA_RELAY_URL", "http://127.0.0.1:9")
        .args(["admin", "status", "--url", &url, "--data-dir", &data_s])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_orca-relay"))
        .env_clear()
        .env("ORCA_RELAY_URL", &url)
        .env("ORCA_RELAY_DATA_DIR", &data_s)
        .args(["admin", "status"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, _, _) = s.terminate();
    assert_eq!(code, 0);
    let _ = std::fs::remove_dir_all(&cwd);
}

/// `--help` of every command lists its environment variables and defaults (README.md).
#[test]
fn every_help_lists_environment_and_defaults() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_orca-relay"))
            .env_clear()
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    for args in [&["serve"][..], &["migrate"], &[]] {
        let h = help(args);
        for var in [
            "ORCA_RELAY_LISTEN",
            "ORCA_RELAY_DATA_DIR",
            "ORCA_RELAY_ROLE",
        ] {
            assert!(h.contains(var), "{args:?} help lacks {var}");
        }
        assert!(h.contains("[default: 127.0.0.1:8080]"), "{args:?}");
    }
    let admin: &[&[&str]] = &[
        &["admin"],
        &["admin", "status"],
        &["admin", "drain"],
        &["admin", "cell-state"],
        &["admin", "fence"],
        &["admin", "evacuate"],
        &["admin", "overview"],
        &["admin", "roll"],
    ];
    for args in admin {
        let h = help(args);
        for needle in [
            "ORCA_RELAY_ADMIN_TOKEN",
            "ORCA_RELAY_URL",
            "ORCA_RELAY_DATA_DIR",
            "[default: http://127.0.0.1:8080]",
        ] {
            assert!(h.contains(needle), "{args:?} help lacks {needle}:\n{h}");
        }
    }
    let h = help(&["admin", "roll"]);
    for flag in [
        "--cell",
        "--all",
        "--restart",
        "--timeout",
        "[default: 300]",
    ] {
        assert!(h.contains(flag), "roll help lacks {flag}");
    }
    let h = help(&["host-token"]);
    for needle in [
        "ORCA_RELAY_SELF_HOSTED_KEY",
        "ORCA_RELAY_URL",
        "[default: ./data]",
    ] {
        assert!(h.contains(needle), "host-token help lacks {needle}");
    }
}
