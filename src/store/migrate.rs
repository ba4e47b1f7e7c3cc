//! Numbered schema migrations, compiled into the binary and recorded in `schema_migrations`.
//!
//! Each migration runs in its own transaction. On Postgres an advisory lock serialises processes that
//! start together, and the applied set is re-read under it, so two directors booting at once apply
//! each migration exactly once.
//!
//! Migrations are forward-only: there are no down steps. A database that already records a version
//! this binary does not know was migrated by a newer release; [`apply`] and [`check`] refuse it
//! ([`MigrateError::TooNew`]) instead of running old code against a schema it was not written for.

use std::fmt;

use super::{Db, DbError, DbKind};
use crate::params;

/// Why the schema cannot be used by this binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateError {
    /// The database records a schema version newer than the newest this binary knows.
    TooNew { found: i64, known: i64 },
    /// The database failed while reading or migrating the schema.
    Db(DbError),
}

impl From<DbError> for MigrateError {
    fn from(e: DbError) -> Self {
        MigrateError::Db(e)
    }
}

impl fmt::Display for MigrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigrateError::TooNew { found, known } => write!(
                f,
                "the database schema is at version {found} but this release knows versions up to \
                 {known}: run a release that knows schema version {found} or newer (migrations \
                 are forward-only; going back needs the backup taken before the upgrade, see \
                 docs/upgrade.md)"
            ),
            MigrateError::Db(e) => write!(f, "migration failed: {e}"),
        }
    }
}

impl std::error::Error for MigrateError {}

/// The newest schema version this binary knows.
pub fn known_version(kind: DbKind) -> i64 {
    migrations(kind).last().map(|m| m.version).unwrap_or(0)
}

/// One schema step.
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Migrations per backend, in order. Both lists define the same tables, columns and keys.
pub fn migrations(kind: DbKind) -> &'static [Migration] {
    match kind {
        DbKind::Sqlite => SQLITE,
        DbKind::Postgres => POSTGRES,
    }
}

const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        name: "core",
        sql: include_str!("../../sql/sqlite/0001_core.sql"),
    },
    Migration {
        version: 2,
        name: "push",
        sql: include_str!("../../sql/sqlite/0002_push.sql"),
    },
    Migration {
        version: 3,
        name: "rehome-worker",
        sql: include_str!("../../sql/sqlite/0003_rehome_worker.sql"),
    },
    Migration {
        version: 4,
        name: "push-fillfactor",
        sql: include_str!("../../sql/sqlite/0004_push_fillfactor.sql"),
    },
    Migration {
        version: 5,
        name: "store-timeline",
        sql: include_str!("../../sql/sqlite/0005_store_timeline.sql"),
    },
];

const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        name: "core",
        sql: include_str!("../../sql/postgres/0001_core.sql"),
    },
    Migration {
        version: 2,
        name: "push",
        sql: include_str!("../../sql/postgres/0002_push.sql"),
    },
    Migration {
        version: 3,
        name: "rehome-worker",
        sql: include_str!("../../sql/postgres/0003_rehome_worker.sql"),
    },
    Migration {
        version: 4,
        name: "push-fillfactor",
        sql: include_str!("../../sql/postgres/0004_push_fillfactor.sql"),
    },
    Migration {
        version: 5,
        name: "store-timeline",
        sql: include_str!("../../sql/postgres/0005_store_timeline.sql"),
    },
];

const LOCK_SCOPE: &str = "orca-relay-schema-migrations";

/// Applies pending migrations, recording `now` (epoch ms, the caller's clock: the store reads
/// none) as their `applied_at`; returns the versions applied now. Refuses, before applying
/// anything, a database whose recorded schema is newer than this binary knows.
pub async fn apply(db: &Db, now: i64) -> Result<Vec<i64>, MigrateError> {
    apply_list(db, migrations(db.kind()), now).await
}

/// [`apply`] over an explicit list (tests use it to run a broken step).
pub async fn apply_list(db: &Db, list: &[Migration], now: i64) -> Result<Vec<i64>, MigrateError> {
    let known = list.last().map(|m| m.version).unwrap_or(0);
    let mut tx = db.begin().await?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .await?;
    tx.commit().await?;
    let mut applied_now = Vec::new();
    // One lock per schema: processes migrating the same schema wait for each other (for as long as
    // a migration may take), while parallel test schemas never contend.
    let schema = match db.kind() {
        DbKind::Postgres => db
            .query("SELECT CAST(current_schema() AS TEXT)", &[])
            .await?
            .first()
            .map(|r| r.str(0))
            .unwrap_or_default(),
        DbKind::Sqlite => String::new(),
    };
    let scope = format!("{LOCK_SCOPE}:{schema}");
    for m in list {
        let mut tx = db.begin().await?;
        tx.set_lock_timeout(60_000).await?;
        tx.scope_lock(&scope).await?;
        // Re-read under the lock: a newer release migrating at the same moment is seen here.
        let found = max_version(&mut tx).await?;
        if found > known {
            tx.rollback().await;
            return Err(MigrateError::TooNew { found, known });
        }
        let done = tx
            .query_opt(
                "SELECT version FROM schema_migrations WHERE version = $1",
                params![m.version],
            )
            .await?
            .is_some();
        if done {
            tx.rollback().await;
            continue;
        }
        tx.execute_batch(m.sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            params![m.version, m.name, now],
        )
        .await?;
        tx.commit().await?;
        applied_now.push(m.version);
    }
    Ok(applied_now)
}

async fn max_version(tx: &mut super::Tx) -> Result<i64, DbError> {
    Ok(tx
        .query_opt(
            "SELECT CAST(COALESCE(MAX(version), 0) AS BIGINT) FROM schema_migrations",
            params![],
        )
        .await?
        .map(|r| r.i64(0))
        .unwrap_or(0))
}

/// The newest schema version the database records (0 when it has never been migrated).
/// Read-only: processes that do not migrate (a cell-only process, a validation-mode push gateway)
/// use it too.
pub async fn recorded_version(db: &Db) -> Result<i64, DbError> {
    let exists_sql = match db.kind() {
        DbKind::Sqlite => {
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
        }
        DbKind::Postgres => {
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name = 'schema_migrations'"
        }
    };
    let exists = db
        .query(exists_sql, &[])
        .await?
        .first()
        .map(|r| r.i64(0) > 0)
        .unwrap_or(false);
    if !exists {
        return Ok(0);
    }
    Ok(db
        .query(
            "SELECT CAST(COALESCE(MAX(version), 0) AS BIGINT) FROM schema_migrations",
            &[],
        )
        .await?
        .first()
        .map(|r| r.i64(0))
        .unwrap_or(0))
}

/// Refuses a database migrated by a newer release; returns the recorded version otherwise (which
/// may be older than [`known_version`]: a process that does not migrate waits for one that does).
pub async fn check(db: &Db) -> Result<i64, MigrateError> {
    let found = recorded_version(db).await?;
    let known = known_version(db.kind());
    if found > known {
        return Err(MigrateError::TooNew { found, known });
    }
    Ok(found)
}

/// True when every known migration is recorded (validation-mode readiness).
pub async fn is_current(db: &Db) -> Result<bool, DbError> {
    let rows = db
        .query("SELECT version FROM schema_migrations", &[])
        .await?;
    let have: Vec<i64> = rows.iter().map(|r| r.i64(0)).collect();
    Ok(migrations(db.kind())
        .iter()
        .all(|m| have.contains(&m.version)))
}
