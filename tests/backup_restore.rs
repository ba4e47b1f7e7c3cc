//! Backup and restore of the embedded default: `orca-relay backup --to DIR` copies the SQLite
//! database while the server runs (and the secrets file); a node restored from it starts, keeps
//! its secrets, and its first start advances every epoch and generation past what could have been
//! issued since the copy, so a client holding a newer epoch than the restored rows cannot be granted
//! that epoch again for a different grant.

mod support;
use support::common;

use std::path::Path;
use std::time::Duration;

use common::proc::{self as cproc, Log, Spec};
use orca_relay::cli::backup::{self, DB_FILE, SECRETS_FILE};
use orca_relay::model::HostKey;
use orca_relay::params;
use orca_relay::store::restore::{self, Settled, ABORT_REASON, JUMP_MARGIN, MARKER_TABLE};
use orca_relay::store::testing::{temp_dir, TestDb};
use orca_relay::store::{assignments, Db};

fn host() -> HostKey {
    HostKey {
        user_id: "user-backup".into(),
        relay_host_id: "abcdefghijklmnop".into(),
    }
}

const DATA: &str = "
INSERT INTO relay_cells (cell_id, cell_url, region, capacity_requests, reserved_requests, admission_state,
    admission_changed_at, created_at, updated_at)
    VALUES ('cell-1', 'https://cell-1.example.test', 'eu', 1000, 1, 'general', 1000, 1000, 1000);
INSERT INTO relay_assignments (user_id, relay_host_id, cell_id, assignment_epoch, lease_expires_at,
    last_activity_at, reserved_controls, created_at, updated_at)
    VALUES ('user-backup', 'abcdefghijklmnop', 'cell-1', 3, 4102444800000, 1000, 1, 1000, 1000);
INSERT INTO relay_assignment_activity_leases (user_id, relay_host_id, activity_id, activity_kind, cell_id,
    request_units, expires_at, control_generation, created_at, updated_at)
    VALUES ('user-backup', 'abcdefghijklmnop', 'control:cell-1:4', 'control', 'cell-1', 1,
    4102444800000, 4, 1000, 1000);
INSERT INTO relay_assignment_migrations (user_id, relay_host_id, assignment_epoch, kind, source_cell_id,
    target_cell_id, previous_epoch, source_request_units, target_reserved_units, arrival_deadline,
    expires_at, created_at, updated_at)
    VALUES ('user-backup', 'abcdefghijklmnop', 3, 'evacuation', 'cell-0', 'cell-1', 2, 1, 1,
    4102444800000, 4102444800000, 1000, 1000);
INSERT INTO relay_invites (token_hash, user_id, relay_host_id, relay_device_id, state, max_attempts,
    expires_at, created_at, updated_at)
    VALUES ('invite-hash-1', 'user-backup', 'abcdefghijklmnop', 'device-1', 'available', 3,
    4102444800000, 1000, 1000);
INSERT INTO relay_region_decisions (user_id, relay_host_id, generation, assignment_epoch, incumbent_region,
    policy_version, cohort_bucket, outcome, issued_at, expires_at, updated_at)
    VALUES ('user-backup', 'abcdefghijklmnop', 2, 3, 'eu', 1, 5, 'pending', 1000, 4102444800000, 1000);
INSERT INTO relay_region_rehome_control (control_id, generation, updated_at) VALUES ('global', 7, 1000);
";

async fn batch(db: &Db, sql: &str) {
    let mut tx = db.begin().await.unwrap();
    tx.execute_batch(sql).await.unwrap();
    tx.commit().await.unwrap();
}

async fn one(db: &Db, sql: &str) -> i64 {
    db.query(sql, &[]).await.unwrap()[0].i64(0)
}

fn path_of(url: &str) -> &Path {
    Path::new(url.strip_prefix("sqlite://").unwrap())
}

#[tokio::test]
async fn a_copy_taken_under_writes_restores_with_epochs_and_generations_advanced() {
    let t = TestDb::sqlite().await;
    batch(&t.db, DATA).await;
    let data_dir = path_of(&t.url).parent().unwrap().to_path_buf();
    std::fs::write(data_dir.join(SECRETS_FILE), "{\"fixture\":true}").unwrap();

    // A writer keeps committing while the copy is taken: the copy is one consistent snapshot.
    let writer = t.db.clone();
    let writes = tokio::spawn(async move {
        for i in 0..200i64 {
            let mut tx = writer.begin().await.unwrap();
            tx.execute(
                "INSERT INTO relay_rate_windows (scope, kind, window_start, count) VALUES ('w', 'k', $1, 1)",
                params![i],
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }
    });
    let to = temp_dir("orca-relay-backup").join("copy");
    let taken_at = 1_800_000_000_000;
    let url = t.url.clone();
    let dir = data_dir.clone();
    let to2 = to.clone();
    let written = tokio::task::spawn_blocking(move || backup::backup(&url, &dir, &to2, taken_at))
        .await
        .unwrap()
        .unwrap();
    writes.await.unwrap();
    assert!(written.pages > 0);
    assert_eq!(
        std::fs::read_to_string(written.secrets.as_ref().unwrap()).unwrap(),
        "{\"fixture\":true}"
    );
    #[cfg(unix)]
    for f in [DB_FILE, SECRETS_FILE] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(to.join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    // The live database has no marker; the copy has one.
    assert_eq!(restore::settle(&t.db, taken_at).await.unwrap(), None);

    let copy = Db::connect(&format!("sqlite://{}", written.database.display()), 2)
        .await
        .unwrap();
    let n = one(&copy, "SELECT COUNT(*) FROM relay_rate_windows").await;
    assert!((0..=200).contains(&n), "a prefix of the writes: {n}");

    // Restored ten minutes later.
    let now = taken_at + 600_000;
    let jump = restore::jump(taken_at, now);
    assert_eq!(jump, 600_000 + JUMP_MARGIN);
    let settled = restore::settle(&copy, now).await.unwrap();
    assert_eq!(
        settled,
        Some(Settled {
            taken_at,
            jump,
            hosts: 1
        })
    );
    // Once only: the marker is gone.
    assert_eq!(restore::settle(&copy, now + 1).await.unwrap(), None);
    assert_eq!(
        one(
            &copy,
            &format!("SELECT COUNT(*) FROM sqlite_master WHERE name = '{MARKER_TABLE}'")
        )
        .await,
        0
    );

    let h = host();
    let row = assignments::read_row(&copy, &h).await.unwrap().unwrap();
    assert_eq!(row.assignment_epoch, 3 + jump);
    // Any epoch the lost history could have issued (one move per millisecond at most) is below it,
    // so a host presenting one is refused and granted a strictly greater epoch.
    for seen in [3, 4, 3 + 600_000] {
        assert!(
            !assignments::verify_cell_assignment(&copy, &h, "cell-1", seen)
                .await
                .unwrap()
        );
        assert!(row.assignment_epoch > seen);
    }
    assert!(
        assignments::verify_cell_assignment(&copy, &h, "cell-1", row.assignment_epoch)
            .await
            .unwrap()
    );
    // Settled: no lease, no charge, the open migration aborted, the unused invite invalidated,
    // generations advanced.
    assert_eq!(
        one(
            &copy,
            "SELECT COUNT(*) FROM relay_assignment_activity_leases"
        )
        .await,
        0
    );
    assert_eq!(
        one(&copy, "SELECT reserved_requests FROM relay_cells").await,
        0
    );
    let m = copy
        .query(
            "SELECT abort_reason FROM relay_assignment_migrations WHERE aborted_at IS NOT NULL",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].str(0), ABORT_REASON);
    let inv = copy
        .query("SELECT state FROM relay_invites", &[])
        .await
        .unwrap();
    assert_eq!(inv[0].str(0), "invalidated");
    assert_eq!(
        one(&copy, "SELECT generation FROM relay_region_decisions").await,
        2 + jump
    );
    assert_eq!(
        one(&copy, "SELECT assignment_epoch FROM relay_region_decisions").await,
        3 + jump
    );
    assert_eq!(
        one(&copy, "SELECT generation FROM relay_region_rehome_control").await,
        7 + jump
    );
    copy.close();
    let _ = std::fs::remove_dir_all(to.parent().unwrap());
}

#[test]
fn backup_refuses_what_it_cannot_copy() {
    let dir = temp_dir("orca-relay-backup-refuse");
    let to = dir.join("to");
    let e = backup::backup("postgres://u@127.0.0.1/db", &dir, &to, 1).unwrap_err();
    assert!(e.contains("pg_dump") && e.contains("docs/backup.md"), "{e}");
    let e = backup::backup("sqlite::memory:", &dir, &to, 1).unwrap_err();
    assert_eq!(
        e,
        "ORCA_RELAY_DATABASE_URL must be sqlite://PATH to take a backup"
    );
    let missing = format!("sqlite://{}/none.sqlite3", dir.display());
    let e = backup::backup(&missing, &dir, &to, 1).unwrap_err();
    assert!(
        e.starts_with("ORCA_RELAY_DATABASE_URL: no database file at "),
        "{e}"
    );
    // An existing, non-empty target is never overwritten.
    let db = dir.join("db.sqlite3");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE t (k INTEGER)")
        .unwrap();
    std::fs::create_dir_all(&to).unwrap();
    std::fs::write(to.join("keep"), "x").unwrap();
    let e = backup::backup(&format!("sqlite://{}", db.display()), &dir, &to, 1).unwrap_err();
    assert!(
        e.ends_with("the directory is not empty; choose a new one"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(to.join("keep")).unwrap(), "x");
    assert!(!to.join(DB_FILE).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

fn spawn(
    cwd: &Path,
) -> (
    std::process::Child,
    String,
    Log,
    std::thread::JoinHandle<()>,
) {
    let envs = vec![("ORCA_RELAY_LISTEN".to_string(), "127.0.0.1:0".to_string())];
    let spec = Spec {
        cwd: Some(cwd),
        ..Spec::new("serve", &[], &envs)
    };
    let log = Log::default();
    let s = cproc::spawn_serve(&spec, &log, Duration::from_secs(20))
        .unwrap_or_else(|()| panic!("server did not start: {:?}", cproc::lines(&log)));
    (s.child, s.addr, log, s.reader)
}

/// Mints a host token with the node's self-hosted key and asks for a grant: the granted epoch.
async fn grant(addr: &str, self_hosted_key: &str) -> i64 {
    let kp = orca_relay::crypto::nacl::X25519Keypair::from_secret([7; 32]);
    let id = orca_relay::crypto::ident::relay_host_id(&kp.public);
    let client = reqwest::Client::new();
    let minted: serde_json::Value = client
        .post(format!("http://{addr}/v1/host-token"))
        .bearer_auth(self_hosted_key)
        .json(&serde_json::json!({
            "relayHostId": id,
            "hostPublicKeyB64": orca_relay::crypto::b64::std_encode(&kp.public),
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = minted["relayToken"]
        .as_str()
        .expect("relayToken")
        .to_string();
    // 503 until the node's cell has reported ready to its director (polled, bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = client
            .post(format!("http://{addr}/v1/assign"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"v": 1, "relayHostId": id}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        if status == 200 {
            return body["assignmentEpoch"].as_i64().expect("assignmentEpoch");
        }
        assert!(
            status == 503 && std::time::Instant::now() < deadline,
            "assign: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_binary_backs_up_a_running_node_and_the_restored_node_starts() {
    let cwd = temp_dir("orca-relay-backup-node");
    let (mut child, addr, log, reader) = spawn(&cwd);
    assert_eq!(
        reqwest::get(format!("http://{addr}/ready"))
            .await
            .unwrap()
            .status(),
        200
    );
    let secrets: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cwd.join("data").join(SECRETS_FILE)).unwrap())
            .unwrap();
    let shk = secrets["selfHostedKey"].as_str().unwrap().to_string();
    let first = grant(&addr, &shk).await;
    let to = cwd.join("backup-1");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orca-relay"))
        .current_dir(&cwd)
        .args(["backup", "--to", "backup-1"])
        .env_clear()
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("[orca-relay] backup written: "),
        "{stdout}"
    );
    assert!(to.join(DB_FILE).is_file() && to.join(SECRETS_FILE).is_file());
    // After the copy the host moves on: it now holds an epoch the copy does not have.
    let live = rusqlite::Connection::open(cwd.join("data").join(DB_FILE)).unwrap();
    live.busy_timeout(Duration::from_secs(5)).unwrap();
    live.execute(
        "UPDATE relay_assignments SET assignment_epoch = assignment_epoch + 5",
        [],
    )
    .unwrap();
    drop(live);
    let seen = grant(&addr, &shk).await;
    assert_eq!(seen, first + 5);
    let status = cproc::terminate(&mut child, Duration::from_secs(12), "serve");
    assert_eq!(status.code(), Some(0));
    reader.join().unwrap();
    let secrets_before = std::fs::read(cwd.join("data").join(SECRETS_FILE)).unwrap();
    drop(log);

    // Restore: the node's files replaced by the copy (what docs/backup.md says to do).
    let data = cwd.join("data");
    for f in [
        DB_FILE.to_string(),
        format!("{DB_FILE}-wal"),
        format!("{DB_FILE}-shm"),
        SECRETS_FILE.to_string(),
    ] {
        let _ = std::fs::remove_file(data.join(f));
    }
    std::fs::copy(to.join(DB_FILE), data.join(DB_FILE)).unwrap();
    std::fs::copy(to.join(SECRETS_FILE), data.join(SECRETS_FILE)).unwrap();

    let (mut child, addr, log, reader) = spawn(&cwd);
    assert_eq!(
        reqwest::get(format!("http://{addr}/ready"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        std::fs::read(data.join(SECRETS_FILE)).unwrap(),
        secrets_before
    );
    // The host reconnects to the restored node: granted, at an epoch above any it has seen.
    let after = grant(&addr, &shk).await;
    assert!(after > seen + JUMP_MARGIN, "{after} after {seen}");
    let status = cproc::terminate(&mut child, Duration::from_secs(12), "serve");
    assert_eq!(status.code(), Some(0));
    reader.join().unwrap();
    let lines = cproc::lines(&log);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("orca_relay_restore_settled"))
            .count(),
        1,
        "{lines:?}"
    );
    let _ = std::fs::remove_dir_all(&cwd);
}
