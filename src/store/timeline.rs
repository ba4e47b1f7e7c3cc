//! Postgres failover: epochs never repeat after a standby is promoted.
//!
//! With asynchronous replication a promoted standby can lack the last commits of the old primary.
//! A grant lost that way named an epoch a client may hold; issued again from the older rows, the
//! same epoch could name another cell. Every promotion starts a new WAL timeline, so the relay
//! records, in [`TABLE`], the timeline it writes on. Every new pooled connection (before it is
//! handed out) compares the server's timeline with that row; on a change, one transaction under
//! the row's lock does what [`super::restore`] does for a restored backup, once per timeline:
//!
//! - every host's assignment epoch, every region decision's generation and epoch and the rehome
//!   control's generation advance by `J` = (server now − newest surviving `updated_at` of an
//!   assignment) + [`super::restore::JUMP_MARGIN`]. Commits replicate in order, so a lost grant
//!   was committed after every surviving one; `J` covers one move per host per millisecond since
//!   then. A client holding an epoch the rows lost is refused at `host-hello` and asks again, and
//!   the answer names a strictly greater epoch;
//! - the epoch floor rises by `J` too: a host placed for the first time afterwards starts above it
//!   (`assignments::insert_row`), since its lost row may have named any epoch up to the old floor
//!   plus the moves since;
//! - migrations and rehome attempts open under the old epochs are aborted
//!   ([`ABORT_REASON`]) and unclaimed connection reservations released: their epochs are gone.
//!
//! Live controls and leases stay: a cell's next renewal meets the new epoch and its host asks for
//! a grant again. The jump runs on every timeline change, also after a synchronous failover that
//! lost nothing: the relay cannot tell the two apart, and a jump is always safe.
//!
//! The server's clock is used (`clock_timestamp()`), so the store still reads no clock of its own.
//! A server without `pg_current_wal_lsn()` (some managed services) has no timeline to compare: the
//! check is skipped there.

use tokio_postgres::Client;

use super::restore::JUMP_MARGIN;

/// The one-row table holding the timeline last written on.
pub const TABLE: &str = "relay_store_timeline";

/// The abort reason written on migrations and rehome attempts open at a timeline change.
pub const ABORT_REASON: &str = "database_failover";

/// What one settle did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineSettled {
    pub from: i64,
    pub to: i64,
    pub jump: i64,
    pub hosts: u64,
}

/// The server's current WAL timeline (`None` on a server in recovery) and its clock in epoch ms;
/// `None` as a whole before the schema has [`TABLE`].
const PROBE: &str = "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE \
     CAST(CAST(('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)) AS bit(32)) AS BIGINT) END, \
     CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT), \
     to_regclass('relay_store_timeline') IS NOT NULL";

/// Checks the timeline of a fresh connection against [`TABLE`] and settles a change. `known` is
/// the timeline this process last confirmed (0: none yet); returns the timeline confirmed now (or
/// `known` when there is nothing to confirm) and the settle when one ran.
pub async fn check(
    client: &Client,
    known: i64,
) -> Result<(i64, Option<TimelineSettled>), tokio_postgres::Error> {
    let probe = match client.query_one(PROBE, &[]).await {
        Ok(p) => p,
        // A server without the WAL functions (some managed services): no timeline to compare.
        Err(e) if e.code().is_some_and(|c| !is_connection_class(c.code())) => {
            return Ok((known, None))
        }
        Err(e) => return Err(e),
    };
    let (Some(timeline), now, true) = (
        probe.get::<_, Option<i64>>(0),
        probe.get::<_, i64>(1),
        probe.get::<_, bool>(2),
    ) else {
        return Ok((known, None));
    };
    if timeline == known {
        return Ok((known, None));
    }
    // Others wait for the one settling (a large table takes longer than the session defaults).
    client
        .batch_execute(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = 30000; \
             SET LOCAL statement_timeout = 120000",
        )
        .await?;
    let r = settle(client, timeline, now).await;
    match r {
        Ok(s) => {
            client.batch_execute("COMMIT").await?;
            Ok((timeline, s))
        }
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// SQLSTATE classes of a connection or server that went away (the check must fail then).
fn is_connection_class(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("57") || code.starts_with("53")
}

async fn settle(
    client: &Client,
    timeline: i64,
    now: i64,
) -> Result<Option<TimelineSettled>, tokio_postgres::Error> {
    let stored = client
        .query_opt(
            "SELECT timeline FROM relay_store_timeline WHERE id = 1 FOR UPDATE",
            &[],
        )
        .await?
        .map(|r| r.get::<_, i64>(0));
    let Some(from) = stored else {
        // No row yet (the migration writes it): nothing was recorded to compare with.
        client
            .execute(
                "INSERT INTO relay_store_timeline (id, timeline, settled_at) VALUES (1, $1, $2) \
                 ON CONFLICT (id) DO NOTHING",
                &[&timeline, &now],
            )
            .await?;
        return Ok(None);
    };
    if from == timeline {
        return Ok(None);
    }
    let newest: Option<i64> = client
        .query_one(
            "SELECT CAST(MAX(updated_at) AS BIGINT) FROM relay_assignments",
            &[],
        )
        .await?
        .get(0);
    let jump = (now - newest.unwrap_or(now)).max(0) + JUMP_MARGIN;
    let hosts = advance(client, jump, now).await?;
    client
        .execute(
            "UPDATE relay_store_timeline SET timeline = $1, settled_at = $2, \
             epoch_floor = epoch_floor + $3 WHERE id = 1",
            &[&timeline, &now, &jump],
        )
        .await?;
    Ok(Some(TimelineSettled {
        from,
        to: timeline,
        jump,
        hosts,
    }))
}

/// Advances epochs and generations by `jump` and settles what the old epochs named; returns the
/// number of hosts advanced.
async fn advance(client: &Client, jump: i64, now: i64) -> Result<u64, tokio_postgres::Error> {
    let hosts = client
        .execute(
            "UPDATE relay_assignments SET assignment_epoch = assignment_epoch + $1",
            &[&jump],
        )
        .await?;
    client
        .execute(
            "UPDATE relay_region_decisions SET generation = generation + $1, \
             assignment_epoch = assignment_epoch + $1, updated_at = $2",
            &[&jump, &now],
        )
        .await?;
    client
        .execute(
            "UPDATE relay_region_rehome_control SET generation = generation + $1, updated_at = $2",
            &[&jump, &now],
        )
        .await?;
    for table in [
        "relay_assignment_migrations",
        "relay_region_rehome_attempts",
    ] {
        client
            .execute(
                &format!(
                    "UPDATE {table} SET aborted_at = $1, abort_reason = $2, updated_at = $1 \
                     WHERE completed_at IS NULL AND aborted_at IS NULL"
                ),
                &[&now, &ABORT_REASON],
            )
            .await?;
    }
    client
        .execute(
            "UPDATE relay_connection_reservations SET state = 'released', released_at = $1 \
             WHERE state = 'reserved'",
            &[&now],
        )
        .await?;
    Ok(hosts)
}
