//! What the operator commands print when something is wrong: `admin …` names the cause of an
//! unreachable server (`cannot reach http://127.0.0.1:1: connection refused`), a bad field by its
//! flag before anything is sent, and a refusal by its URL, status, code and what to check;
//! `orca-relay health` prints one line and exits 0 only on `/ready` 200.

mod support;
use support::common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::proc::{self as cproc, Log, Spec};

const TOKEN: &str = "test-admin-token-0123456789abcdef0123456789";

/// `orca-relay <args>` with a clean environment plus `envs`: (exit code, stdout, stderr).
fn run(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_orca-relay"));
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().expect("run orca-relay");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// A loopback port nothing listens on (bound, learned, closed).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Answers every connection with `status` and the JSON `body` until the test ends.
fn canned(status: &str, body: &str) -> String {
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf);
            let _ = s.write_all(response.as_bytes());
        }
    });
    origin
}

/// A real single-node server (every role, SQLite, generated secrets) in `dir`.
fn server(dir: &Path, envs: &[(String, String)]) -> (std::process::Child, String) {
    let mut all = vec![
        ("ORCA_RELAY_LISTEN".to_string(), "127.0.0.1:0".to_string()),
        ("ORCA_RELAY_ADMIN_TOKEN".to_string(), TOKEN.to_string()),
    ];
    all.extend(envs.iter().cloned());
    let spec = Spec {
        cwd: Some(dir),
        ..Spec::new("serve", &[], &all)
    };
    let log = Log::default();
    let s = cproc::spawn_serve(&spec, &log, Duration::from_secs(30))
        .unwrap_or_else(|()| panic!("server did not start: {:?}", cproc::lines(&log)));
    (s.child, format!("http://{}", s.addr))
}

#[test]
fn admin_unreachable_names_connection_refused() {
    let port = closed_port();
    let url = format!("http://127.0.0.1:{port}");
    let (code, _, err) = run(
        &["admin", "status", "--url", &url],
        &[("ORCA_RELAY_ADMIN_TOKEN", TOKEN)],
    );
    assert_eq!(code, 1);
    assert_eq!(err, format!("cannot reach {url}: connection refused"));
    // Never the token.
    assert!(!err.contains(TOKEN));
}

#[test]
fn admin_bad_fields_are_named_before_sending() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    let cases: [(&[&str], &str); 5] = [
        (
            &["admin", "drain", "--grace-ms", "3600001"],
            "--grace-ms must be 0..3600000, got 3600001",
        ),
        (
            &["admin", "drain", "--pace-window-ms", "300001"],
            "--pace-window-ms must be 0..300000, got 300001",
        ),
        (
            &[
                "admin",
                "cell-state",
                "--cell-id",
                "c1",
                "--state",
                "drained",
            ],
            "--state must be general, migration-only or existing-only, got \"drained\"",
        ),
        (
            &["admin", "evacuate", "--source-cell-id", "c/1"],
            "--source-cell-id must be 1..128 characters of [A-Za-z0-9_.-], got \"c/1\"",
        ),
        (
            &[
                "admin",
                "evacuate",
                "--source-cell-id",
                "c1",
                "--limit",
                "0",
            ],
            "--limit must be 1..100, got 0",
        ),
    ];
    for (args, want) in cases {
        let mut a = args.to_vec();
        a.extend(["--url", &url]);
        let (code, _, err) = run(&a, &[("ORCA_RELAY_ADMIN_TOKEN", TOKEN)]);
        assert_eq!((code, err.as_str()), (1, want), "{args:?}");
    }
}

#[test]
fn admin_refusals_and_health_against_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url) = server(dir.path(), &[]);

    let (code, out, _) = run(&["health", "--url", &url], &[]);
    assert_eq!((code, out.as_str()), (0, "ready"));
    // The default target comes from ORCA_RELAY_LISTEN (a wildcard becomes loopback).
    let port = url.rsplit(':').next().unwrap();
    let listen = format!("0.0.0.0:{port}");
    let (code, out, _) = run(&["health"], &[("ORCA_RELAY_LISTEN", &listen)]);
    assert_eq!((code, out.as_str()), (0, "ready"));

    let wrong = "wrong-admin-token-0123456789abcdef012345678";
    let (code, _, err) = run(
        &["admin", "status", "--url", &url],
        &[("ORCA_RELAY_ADMIN_TOKEN", wrong)],
    );
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "{url}/v1/admin/runtime-status: 401 Unauthorized: invalid_token; the server \
             refused the bearer: check ORCA_RELAY_ADMIN_TOKEN (or the data directory's secrets.json)"
        )
    );
    assert!(!err.contains(wrong) && !err.contains(TOKEN));

    let (code, _, err) = run(
        &[
            "admin",
            "cell-state",
            "--cell-id",
            "no-such-cell",
            "--state",
            "general",
            "--url",
            &url,
        ],
        &[("ORCA_RELAY_ADMIN_TOKEN", TOKEN)],
    );
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "{url}/v1/admin/cell-state: 404 Not Found: cell_not_found; the director knows no \
             such cell"
        )
    );
    cproc::kill(&mut child);

    // The same origin with nothing behind it.
    let (code, out, _) = run(&["health", "--url", &url], &[]);
    assert_eq!(code, 1);
    assert_eq!(out, format!("unreachable: connection refused ({url})"));
}

#[test]
fn health_not_ready_prints_status_and_cause() {
    let origin = canned(
        "503 Service Unavailable",
        r#"{"error":"dependency_unavailable"}"#,
    );
    let (code, out, _) = run(&["health", "--url", &origin], &[]);
    assert_eq!(
        (code, out.as_str()),
        (1, "not ready: 503 dependency_unavailable")
    );
    let origin = canned(
        "200 OK",
        r#"{"ok":true,"degraded":true,"dependency":["sql"]}"#,
    );
    let (code, out, _) = run(&["health", "--url", &origin], &[]);
    assert_eq!((code, out.as_str()), (0, "ready (degraded: sql)"));
}

#[test]
fn health_rejects_bad_targets() {
    let (code, _, err) = run(&["health", "--url", "127.0.0.1:8080"], &[]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("--url must be an http:// or https:// origin"),
        "{err}"
    );
    let (code, _, err) = run(&["health"], &[("ORCA_RELAY_LISTEN", "8080")]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("ORCA_RELAY_LISTEN must be a socket address"),
        "{err}"
    );
    let (code, _, err) = run(&["health", "--timeout", "0"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("--timeout"), "{err}");
    let (code, _, err) = run(
        &["health"],
        &[("ORCA_RELAY_TLS_CERT", "/nonexistent/cert.pem")],
    );
    assert_eq!(code, 2);
    assert!(err.contains("ORCA_RELAY_PUBLIC_URL"), "{err}");
}
