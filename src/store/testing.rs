//! Test databases: a fresh SQLite file per test and, when `ORCA_RELAY_TEST_POSTGRES_URL` is set, a
//! fresh Postgres schema per test, dropped afterwards. Behaviour tests loop over [`backends`] so the
//! same assertions run on both.
//!
//! With `CI=true` a missing Postgres URL is a failure, not a skip: CI must exercise both backends.

use std::path::PathBuf;
use std::sync::Once;

use super::{migrate, Db, DbKind};

/// The variable naming the Postgres server tests may use.
pub const POSTGRES_ENV: &str = "ORCA_RELAY_TEST_POSTGRES_URL";

/// A migrated, empty database that cleans up after itself.
pub struct TestDb {
    pub db: Db,
    /// The URL a server process can be started with to reach the same data.
    pub url: String,
    dir: Option<PathBuf>,
    pg: Option<(String, String)>,
}

impl TestDb {
    pub fn kind(&self) -> DbKind {
        self.db.kind()
    }

    /// A fresh SQLite file in a temporary directory.
    pub async fn sqlite() -> TestDb {
        let dir = temp_dir("orca-relay-test");
        let url = format!("sqlite://{}/relay.sqlite3", dir.display());
        let db = Db::connect(&url, 4).await.expect("open sqlite");
        migrate::apply(&db, crate::clock::now_ms())
            .await
            .expect("migrate sqlite");
        TestDb {
            db,
            url,
            dir: Some(dir),
            pg: None,
        }
    }

    /// A fresh schema on the test Postgres server, or `None` (and a note on stderr) when the
    /// variable is unset.
    pub async fn postgres() -> Option<TestDb> {
        let base = match postgres_url() {
            Some(u) => u,
            None => return None,
        };
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .expect("connect to ORCA_RELAY_TEST_POSTGRES_URL");
        tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .expect("create test schema");
        let url = with_search_path(&base, &schema);
        let db = Db::connect(&url, 10).await.expect("open postgres");
        migrate::apply(&db, crate::clock::now_ms())
            .await
            .expect("migrate postgres");
        Some(TestDb {
            db,
            url,
            dir: None,
            pg: Some((base, schema)),
        })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        self.db.close();
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some((base, schema)) = self.pg.take() {
            // Drop runs outside async context guarantees: use a private runtime on a thread.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async move {
                    let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
                        .await
                        .ok()?;
                    tokio::spawn(conn);
                    client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                        .await
                        .ok()
                })
            })
            .join();
        }
    }
}

/// Every backend available to this test run: SQLite always, Postgres when configured.
pub async fn backends() -> Vec<TestDb> {
    let mut out = vec![TestDb::sqlite().await];
    if let Some(pg) = TestDb::postgres().await {
        out.push(pg);
    }
    out
}

/// The Postgres URL for tests; panics under `CI=true` when it is missing, otherwise notes the skip
/// once on stderr (written directly so the test harness does not swallow it).
pub fn postgres_url() -> Option<String> {
    match std::env::var(POSTGRES_ENV) {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ => {
            if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
                panic!(
                    "{POSTGRES_ENV} must be set when CI=true: Postgres cases may not be skipped"
                );
            }
            static NOTE: Once = Once::new();
            NOTE.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "note: Postgres cases skipped ({POSTGRES_ENV} is unset); SQLite cases ran"
                );
            });
            None
        }
    }
}

/// `url` with `search_path` pinned to `schema` through the connection options.
pub fn with_search_path(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

/// A new empty directory under the system temp dir.
pub fn temp_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}
