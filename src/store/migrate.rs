//! Numbered schema migrations, compiled into the binary and recorded in `schema_migrations`.
//!
//! Each migration runs in its own transaction. On Postgres an advisory lock serialises processes that
//! start together, and the applied set is re-read under it, so two directors booting at once apply
//! each migration exactly once.

use super::{Db, DbError, DbKind};
use crate::params;

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
];

const LOCK_SCOPE: &str = "orca-relay-schema-migrations";

/// Applies pending migrations, recording `now` (epoch ms, the caller's clock: the store reads
/// none) as their `applied_at`; returns the versions applied now.
pub async fn apply(db: &Db, now: i64) -> Result<Vec<i64>, DbError> {
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
    for m in migrations(db.kind()) {
        let mut tx = db.begin().await?;
        tx.set_lock_timeout(60_000).await?;
        tx.scope_lock(&scope).await?;
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
