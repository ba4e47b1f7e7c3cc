//! `orca-relay backup --to DIR`: a consistent copy of the embedded SQLite database, taken while the
//! server runs (SQLite's online backup API, one step under one read snapshot, so writers go on),
//! and the single-node secrets file. The copy carries the restore marker
//! ([`crate::store::restore::MARKER_TABLE`]) that makes the first start on it advance epochs and
//! generations (see `store::restore`). Restore: stop the server, put both files back in the data
//! directory, start it (docs/backup.md).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use crate::store::restore::MARKER_TABLE;

/// The database file name in a backup directory (the default single-node name).
pub const DB_FILE: &str = "orca-relay.sqlite3";
/// The secrets file name, in the data directory and in a backup directory.
pub const SECRETS_FILE: &str = "secrets.json";

/// What a backup wrote.
#[derive(Debug)]
pub struct Written {
    pub database: PathBuf,
    pub secrets: Option<PathBuf>,
    pub pages: i64,
}

/// Copies the database named by `database_url` (and `data_dir/secrets.json` if present) into `to`,
/// which must not exist or be an empty directory. `taken_at` (epoch ms) goes into the marker.
pub fn backup(
    database_url: &str,
    data_dir: &Path,
    to: &Path,
    taken_at: i64,
) -> Result<Written, String> {
    let source = sqlite_path(database_url)?;
    if !source.is_file() {
        return Err(format!(
            "ORCA_RELAY_DATABASE_URL: no database file at {}",
            source.display()
        ));
    }
    prepare_dir(to)?;
    let database = to.join(DB_FILE);
    let src = Connection::open_with_flags(
        &source,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("cannot open {}: {e}", source.display()))?;
    src.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let mut dst = Connection::open(&database)
        .map_err(|e| format!("cannot create {}: {e}", database.display()))?;
    let pages = {
        let b = rusqlite::backup::Backup::new(&src, &mut dst).map_err(|e| e.to_string())?;
        // One step copies every page under one read snapshot: consistent, and WAL writers go on.
        b.step(-1)
            .map_err(|e| format!("backup of {} failed: {e}", source.display()))?;
        b.progress().pagecount as i64
    };
    drop(src);
    let ok: String = dst
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if ok != "ok" {
        return Err(format!("the copy failed its integrity check: {ok}"));
    }
    dst.execute_batch(&format!(
        "CREATE TABLE {MARKER_TABLE} (taken_at INTEGER NOT NULL); \
         INSERT INTO {MARKER_TABLE} (taken_at) VALUES ({taken_at});"
    ))
    .map_err(|e| format!("cannot mark the copy: {e}"))?;
    dst.pragma_update(None, "journal_mode", "DELETE")
        .map_err(|e| e.to_string())?;
    drop(dst);
    private(&database)?;
    let secrets_src = data_dir.join(SECRETS_FILE);
    let secrets = if secrets_src.is_file() {
        let target = to.join(SECRETS_FILE);
        std::fs::copy(&secrets_src, &target)
            .map_err(|e| format!("cannot copy {}: {e}", secrets_src.display()))?;
        private(&target)?;
        Some(target)
    } else {
        None
    };
    Ok(Written {
        database,
        secrets,
        pages,
    })
}

/// The file behind a `sqlite://PATH` URL; other URLs are refused with what to do instead.
pub fn sqlite_path(url: &str) -> Result<PathBuf, String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Err(
            "orca-relay backup copies the embedded SQLite database; for Postgres use \
                    pg_dump or point-in-time recovery (docs/backup.md)"
                .into(),
        );
    }
    match url.strip_prefix("sqlite://") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err("ORCA_RELAY_DATABASE_URL must be sqlite://PATH to take a backup".into()),
    }
}

fn prepare_dir(to: &Path) -> Result<(), String> {
    if to.exists() {
        let mut entries =
            std::fs::read_dir(to).map_err(|e| format!("--to {}: {e}", to.display()))?;
        if entries.next().is_some() {
            return Err(format!(
                "--to {}: the directory is not empty; choose a new one",
                to.display()
            ));
        }
    } else {
        std::fs::create_dir_all(to).map_err(|e| format!("--to {}: {e}", to.display()))?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("--to {}: {e}", to.display()))?;
    }
    Ok(())
}

fn private(path: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
