//! Upgrades: a database left by the previous release (schema version 2: migrations 0001 and 0002,
//! which are frozen once shipped, and the two rows that release recorded) with data in it migrates to the current schema on both backends, and the
//! current code reads and writes that data; every migration runs in its own transaction; a database
//! migrated by a newer release is refused, by the library and by the binary (migrate, serve, a
//! cell-only process), with one line naming both versions.

use std::path::PathBuf;
use std::process::Command;

use orca_relay::model::HostKey;
use orca_relay::params;
use orca_relay::store::assignments::{self, ActivateControl};
use orca_relay::store::migrate::{self, MigrateError, Migration};
use orca_relay::store::testing::{backends, postgres_url, temp_dir, with_search_path};
use orca_relay::store::{cells, Db, DbKind};

/// The previous release's schema on each backend: its two migrations as shipped (migration files
/// never change once released; `migration_lists_*` below keeps the list append-only) and the
/// `schema_migrations` rows it recorded.
const FIXTURE_SQLITE: &str = concat!(
    include_str!("fixtures/schema_v2_head.sql"),
    include_str!("../sql/sqlite/0001_core.sql"),
    include_str!("../sql/sqlite/0002_push.sql"),
    include_str!("fixtures/schema_v2_tail.sql"),
);
const FIXTURE_POSTGRES: &str = concat!(
    include_str!("fixtures/schema_v2_head.sql"),
    include_str!("../sql/postgres/0001_core.sql"),
    include_str!("../sql/postgres/0002_push.sql"),
    include_str!("fixtures/schema_v2_tail.sql"),
);

/// An empty, never-migrated database; dropped (file or schema) at the end.
struct Raw {
    db: Db,
    url: String,
    dir: Option<PathBuf>,
    pg: Option<(String, String)>,
}

impl Raw {
    async fn sqlite() -> Raw {
        let dir = temp_dir("orca-relay-upgrade");
        let url = format!("sqlite://{}/relay.sqlite3", dir.display());
        let db = Db::connect(&url, 4).await.expect("open sqlite");
        Raw {
            db,
            url,
            dir: Some(dir),
            pg: None,
        }
    }

    async fn postgres() -> Option<Raw> {
        let base = postgres_url()?;
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        run_pg(&base, &format!("CREATE SCHEMA {schema}")).await;
        let url = with_search_path(&base, &schema);
        let db = Db::connect(&url, 4).await.expect("open postgres");
        Some(Raw {
            db,
            url,
            dir: None,
            pg: Some((base, schema)),
        })
    }

    async fn all() -> Vec<Raw> {
        let mut out = vec![Raw::sqlite().await];
        if let Some(pg) = Raw::postgres().await {
            out.push(pg);
        }
        out
    }

    fn kind(&self) -> DbKind {
        self.db.kind()
    }

    async fn batch(&self, sql: &str) {
        let mut tx = self.db.begin().await.unwrap();
        tx.execute_batch(sql).await.unwrap();
        tx.commit().await.unwrap();
    }

    async fn cleanup(mut self) {
        self.db.close();
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some((base, schema)) = self.pg.take() {
            run_pg(&base, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
        }
    }
}

async fn run_pg(base: &str, sql: &str) {
    let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .expect("connect to the test Postgres");
    let task = tokio::spawn(conn);
    client.batch_execute(sql).await.expect(sql);
    drop(client);
    let _ = task.await;
}

fn host() -> HostKey {
    HostKey {
        user_id: "user-upgrade".into(),
        relay_host_id: "abcdefghijklmnop".into(),
    }
}

async fn versions(db: &Db) -> Vec<i64> {
    db.query(
        "SELECT version FROM schema_migrations ORDER BY version",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.i64(0))
    .collect()
}

/// Rows the previous release wrote: a cell, a host granted to it at epoch 3 with a pending control,
/// a paired phone, a push registration with a pending delivery, the rehome control row.
const OLD_DATA: &str = "
INSERT INTO relay_cells (cell_id, cell_url, region, capacity_requests, reserved_requests, admission_state,
    admission_changed_at, created_at, updated_at)
    VALUES ('cell-1', 'https://cell-1.example.test', 'eu', 1000, 1, 'general', 1000, 1000, 1000);
INSERT INTO relay_cell_runtime (cell_id, cell_incarnation, started_at, ready, observed_requests,
    last_heartbeat_at, updated_at)
    VALUES ('cell-1', '00000000000000000000000000000001', 1000, TRUE, 1, 1000, 1000);
INSERT INTO relay_assignments (user_id, relay_host_id, cell_id, assignment_epoch, lease_expires_at,
    last_activity_at, reserved_controls, created_at, updated_at)
    VALUES ('user-upgrade', 'abcdefghijklmnop', 'cell-1', 3, 4102444800000, 1000, 1, 1000, 1000);
INSERT INTO relay_assignment_activity_leases (user_id, relay_host_id, activity_id, activity_kind, cell_id,
    request_units, expires_at, created_at, updated_at)
    VALUES ('user-upgrade', 'abcdefghijklmnop', 'control-pending:3', 'control', 'cell-1', 1,
    4102444800000, 1000, 1000);
INSERT INTO relay_devices (user_id, relay_host_id, relay_device_id, current_hash, current_version,
    current_expires_at, created_at, updated_at)
    VALUES ('user-upgrade', 'abcdefghijklmnop', 'device-1', 'hash-1', 1, 4102444800000, 1000, 1000);
INSERT INTO push_devices (registration_id, host_fingerprint, device_id, platform, token, created_at,
    updated_at)
    VALUES ('reg-1', 'fp-1', 'device-1', 'ios', 'apns-token-fixture', 1000, 1000);
INSERT INTO push_deliveries (delivery_id, host_fingerprint, registration_id, kind, notification_epoch,
    notification_seq, payload_json, due_at, expires_at, created_at)
    VALUES ('del-1', 'fp-1', 'reg-1', 'alert', 'ep-1', 1, '{}', 1000, 4102444800000, 1000);
INSERT INTO relay_region_rehome_control (control_id, generation, updated_at) VALUES ('global', 2, 1000);
";

#[tokio::test]
async fn previous_release_schema_with_data_migrates_to_current() {
    for raw in Raw::all().await {
        let kind = raw.kind();
        let fixture = match kind {
            DbKind::Sqlite => FIXTURE_SQLITE,
            DbKind::Postgres => FIXTURE_POSTGRES,
        };
        raw.batch(fixture).await;
        raw.batch(OLD_DATA).await;
        assert_eq!(versions(&raw.db).await, vec![1, 2], "{kind:?}");
        assert_eq!(migrate::check(&raw.db).await, Ok(2), "{kind:?}");

        let applied = migrate::apply(&raw.db, 5_000).await.unwrap();
        let known = migrate::known_version(kind);
        assert_eq!(applied, (3..=known).collect::<Vec<_>>(), "{kind:?}");
        assert_eq!(
            versions(&raw.db).await,
            (1..=known).collect::<Vec<_>>(),
            "{kind:?}"
        );
        assert!(migrate::is_current(&raw.db).await.unwrap(), "{kind:?}");
        assert!(
            migrate::apply(&raw.db, 6_000).await.unwrap().is_empty(),
            "{kind:?}"
        );

        // The current code reads the old rows...
        let h = host();
        let row = assignments::read_row(&raw.db, &h).await.unwrap().unwrap();
        assert_eq!((row.cell_id.as_str(), row.assignment_epoch), ("cell-1", 3));
        assert!(
            assignments::verify_cell_assignment(&raw.db, &h, "cell-1", 3)
                .await
                .unwrap()
        );
        assert!(cells::view(&raw.db, "cell-1").await.unwrap().is_some());
        // ...and writes through them: the pending control becomes an active one.
        let id = assignments::activate_control(
            &raw.db,
            &h,
            &ActivateControl {
                cell_id: "cell-1".into(),
                assignment_epoch: 3,
                generation: 1,
                connection_inclusion_watermark: None,
                idle_regional_rehome: false,
                cell_incarnation: "00000000000000000000000000000001".into(),
            },
            7_000,
        )
        .await
        .unwrap();
        assert_eq!(id, "control:cell-1:1");
        let n = raw
            .db
            .query(
                "SELECT COUNT(*) FROM relay_assignment_activity_leases WHERE activity_id = $1",
                params!["control-pending:3"],
            )
            .await
            .unwrap();
        assert_eq!(n[0].i64(0), 0, "{kind:?}: the pending lease was converted");
        // Old push rows survive; the table a later migration added is there and usable.
        let n = raw
            .db
            .query("SELECT COUNT(*) FROM push_deliveries", &[])
            .await
            .unwrap();
        assert_eq!(n[0].i64(0), 1, "{kind:?}");
        raw.batch(
            "INSERT INTO relay_region_rehome_worker_lease (lease_id, holder, expires_at, updated_at) \
             VALUES ('global', 'probe', 1, 1)",
        )
        .await;
        raw.cleanup().await;
    }
}

#[tokio::test]
async fn a_schema_newer_than_this_release_is_refused_naming_both_versions() {
    for t in backends().await {
        let known = migrate::known_version(t.kind());
        let newer = known + 3;
        let mut tx = t.db.begin().await.unwrap();
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, 'from-the-future', 1)",
            params![newer],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();

        let want = MigrateError::TooNew {
            found: newer,
            known,
        };
        assert_eq!(migrate::apply(&t.db, 1).await, Err(want.clone()));
        assert_eq!(migrate::check(&t.db).await, Err(want.clone()));
        let line = want.to_string();
        assert!(!line.contains('\n'));
        assert!(line.contains(&format!("version {newer}")), "{line}");
        assert!(line.contains(&format!("up to {known}")), "{line}");
        assert!(line.contains("docs/upgrade.md"), "{line}");
    }
}

#[tokio::test]
async fn a_database_that_was_never_migrated_reads_as_version_zero() {
    for raw in Raw::all().await {
        assert_eq!(migrate::recorded_version(&raw.db).await, Ok(0));
        assert_eq!(migrate::check(&raw.db).await, Ok(0));
        raw.cleanup().await;
    }
}

#[tokio::test]
async fn each_migration_runs_in_its_own_transaction() {
    for t in backends().await {
        let known = migrate::known_version(t.kind());
        let mut list: Vec<Migration> = migrate::migrations(t.kind())
            .iter()
            .map(|m| Migration {
                version: m.version,
                name: m.name,
                sql: m.sql,
            })
            .collect();
        // A step whose first statement succeeds and whose second fails.
        list.push(Migration {
            version: known + 1,
            name: "broken",
            sql: "CREATE TABLE upgrade_probe (k TEXT PRIMARY KEY); INSERT INTO no_such_table (k) VALUES ('x');",
        });
        let err = migrate::apply_list(&t.db, &list, 1).await.unwrap_err();
        assert!(matches!(err, MigrateError::Db(_)), "{err:?}");
        assert!(err.to_string().starts_with("migration failed: "), "{err}");
        // Nothing of the failed step stayed: not its table, not its version; the earlier ones did.
        assert_eq!(versions(&t.db).await, (1..=known).collect::<Vec<_>>());
        assert!(t
            .db
            .query("SELECT COUNT(*) FROM upgrade_probe", &[])
            .await
            .is_err());
    }
}

#[test]
fn migration_lists_are_forward_only_and_match_across_backends() {
    let sqlite = migrate::migrations(DbKind::Sqlite);
    let postgres = migrate::migrations(DbKind::Postgres);
    assert_eq!(sqlite.len(), postgres.len());
    for (i, (s, p)) in sqlite.iter().zip(postgres).enumerate() {
        assert_eq!(s.version, i as i64 + 1, "versions are 1, 2, 3, … in order");
        assert_eq!((s.version, s.name), (p.version, p.name));
        for sql in [s.sql, p.sql] {
            let upper = sql.to_ascii_uppercase();
            assert!(
                !upper.contains("DROP TABLE") && !upper.contains("DROP COLUMN"),
                "migration {} drops data: an older release running during a roll would break",
                s.name
            );
        }
    }
    assert_eq!(
        migrate::known_version(DbKind::Sqlite),
        migrate::known_version(DbKind::Postgres)
    );
}

/// Runs the binary with a clean environment in `cwd` until it exits (killed after 30 s: a
/// process that starts instead of refusing fails the test rather than hanging it): (exit code,
/// stderr).
fn run_binary(cwd: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_orca-relay"))
        .current_dir(cwd)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ORCA_RELAY_LISTEN", "127.0.0.1:0")
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run orca-relay");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    (status.and_then(|s| s.code()).unwrap_or(-1), stderr)
}

#[tokio::test]
async fn the_binary_refuses_a_newer_schema_in_migrate_serve_and_cell_only() {
    let raw = Raw::sqlite().await;
    raw.batch(FIXTURE_SQLITE).await;
    let known = migrate::known_version(DbKind::Sqlite);
    let newer = known + 1;
    raw.batch(&format!(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES ({newer}, 'next', 1)"
    ))
    .await;
    let cwd = temp_dir("orca-relay-upgrade-cwd");
    let key = "0123456789abcdef0123456789abcdef";
    let db = raw.url.clone();
    let want = format!(
        "ORCA_RELAY_DATABASE_URL: {}",
        MigrateError::TooNew {
            found: newer,
            known
        }
    );
    type Case<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>);
    let cases: [Case; 3] = [
        ("migrate", vec!["migrate"], vec![]),
        ("serve (single node)", vec!["serve"], vec![]),
        (
            "cell-only",
            vec!["serve"],
            vec![
                ("ORCA_RELAY_ROLE", "cell"),
                ("ORCA_RELAY_CELL_ID", "cell-1"),
                ("ORCA_RELAY_DIRECTOR_URL", "http://127.0.0.1:9"),
                ("ORCA_RELAY_CLUSTER_KEY", key),
                ("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY", key),
                (
                    "ORCA_RELAY_ADMIN_TOKEN",
                    "admin-token-admin-token-admin-token-0001",
                ),
            ],
        ),
    ];
    for (name, args, extra) in cases {
        let mut envs = vec![("ORCA_RELAY_DATABASE_URL", db.as_str())];
        envs.extend(extra);
        let (code, stderr) = run_binary(&cwd, &args, &envs);
        assert_eq!(code, 1, "{name}: {stderr}");
        let last = stderr.trim_end().lines().last().unwrap_or_default();
        assert_eq!(last, want, "{name}: {stderr}");
    }
    // Nothing was applied or changed by the refused runs.
    assert_eq!(versions(&raw.db).await, vec![1, 2, newer]);
    let _ = std::fs::remove_dir_all(&cwd);
    raw.cleanup().await;
}
