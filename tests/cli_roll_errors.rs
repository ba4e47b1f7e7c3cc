//! `orca-relay admin roll` when the cell answers the drain or the status poll with an error.
//!
//! A fake director and a fake cell (plain HTTP/1.1 on loopback) answer what the roll asks. The
//! restart command creates a marker file, so each test sees whether the roll restarted the cell:
//! - the drain answered 401, 404 or 503: the roll stops before the restart, exits non-zero and
//!   names the state the cell is left in;
//! - the drain accepted, every `runtime-status` poll 503: not "zero attached", the wait times out
//!   and the roll stops before the restart;
//! - nothing listens at the cell's origin (connection refused): the process is gone, the roll
//!   restarts it and finishes once the director hears a new incarnation.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One canned answer: status code and JSON body.
type Answer = (u16, String);

/// Serves `answer(path)` to every request until the test ends; returns the origin.
async fn serve<F>(answer: F) -> String
where
    F: Fn(&str) -> Answer + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then the body by Content-Length.
                let (head_end, length) = loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (i + 4, length);
                    }
                };
                while buf.len() < head_end + length {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let line = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                let (status, body) = answer(&path);
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    origin
}

/// A fake director knowing one cell `c1` at `cell_url`; its incarnation becomes `i2` once the
/// marker file exists (the restart command ran). Records every path asked.
async fn director(cell_url: String, marker: PathBuf, asked: Arc<Mutex<Vec<String>>>) -> String {
    serve(move |path| {
        asked.lock().unwrap().push(path.to_owned());
        match path {
            "/v1/admin/cell-status" => {
                let inc = if marker.exists() { "i2" } else { "i1" };
                let cell = serde_json::json!({
                    "cellId": "c1", "admissionState": "general", "live": true,
                    "cellUrl": cell_url, "runtime": {"cellIncarnation": inc},
                });
                (200, serde_json::json!({"cells": [cell]}).to_string())
            }
            "/v1/admin/cell-state" => (200, r#"{"cell":{"rollIsolatedAt":1}}"#.into()),
            _ => (404, r#"{"error":"not_found"}"#.into()),
        }
    })
    .await
}

/// Runs `admin roll --cell c1` with a restart command that creates `marker`.
async fn roll(director: &str, marker: &Path) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_orca-relay"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ORCA_RELAY_ADMIN_TOKEN", "roll-test-admin-token")
        .args([
            "admin",
            "roll",
            "--cell",
            "c1",
            "--timeout",
            "2",
            "--poll",
            "0.1",
        ])
        .args(["--restart", &format!("touch {}", marker.display())])
        .args(["--url", director])
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("--- admin roll: {:?}\n{text}", out.status.code());
    (out.status.code().unwrap_or(-1), text)
}

/// A cell answering the drain with `drain` and `runtime-status` with `status`.
async fn cell(drain: Answer, status: Answer) -> String {
    serve(move |path| match path {
        "/v1/admin/drain" => drain.clone(),
        "/v1/admin/runtime-status" => status.clone(),
        _ => (404, r#"{"error":"not_found"}"#.into()),
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_answered_with_an_error_stops_the_roll_before_the_restart() {
    for (code, body) in [
        (401, r#"{"error":"invalid_token"}"#),
        (404, r#"{"error":"not_found"}"#),
        (503, r#"{"error":"dependency_unavailable"}"#),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("restarted");
        let c = cell(
            (code, body.into()),
            (200, r#"{"runtime":{"controls":0}}"#.into()),
        )
        .await;
        let asked = Arc::new(Mutex::new(Vec::new()));
        let d = director(c, marker.clone(), asked.clone()).await;
        let (exit, text) = roll(&d, &marker).await;
        assert_ne!(exit, 0, "drain {code}: the roll must fail");
        assert!(
            !marker.exists(),
            "drain {code}: the cell was restarted undrained"
        );
        assert!(text.contains(&code.to_string()), "drain {code}: {text}");
        assert!(
            text.contains("left migration-only (roll-isolated), not drained"),
            "drain {code}: the message names the state: {text}"
        );
        let asked = asked.lock().unwrap();
        assert_eq!(
            asked
                .iter()
                .filter(|p| *p == "/v1/admin/cell-state")
                .count(),
            1,
            "drain {code}: isolated once, never restored: {asked:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_status_poll_is_not_zero_attached() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("restarted");
    let c = cell(
        (202, r#"{"ok":true}"#.into()),
        (503, r#"{"error":"dependency_unavailable"}"#.into()),
    )
    .await;
    let d = director(c, marker.clone(), Arc::new(Mutex::new(Vec::new()))).await;
    let (exit, text) = roll(&d, &marker).await;
    assert_ne!(exit, 0);
    assert!(
        !marker.exists(),
        "restarted while the attached count was unknown"
    );
    assert!(text.contains("attached count unknown"), "{text}");
    assert!(
        text.contains("left migration-only (roll-isolated), draining"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_means_gone_and_the_roll_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("restarted");
    // A port nobody listens on: bound, then closed.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let d = director(closed, marker.clone(), Arc::new(Mutex::new(Vec::new()))).await;
    let (exit, text) = roll(&d, &marker).await;
    assert!(
        marker.exists(),
        "a refusing cell is gone and gets restarted: {text}"
    );
    assert_eq!(exit, 0, "{text}");
    assert!(text.contains("refuses connections"), "{text}");
    assert!(text.contains("incarnation seen i2 (live)"), "{text}");
}
