//! Statements and round trips sent to the database, counted where they leave the process.
//!
//! A round trip is one flight the caller waits for: a statement alone, or a statement pipelined
//! with `BEGIN` or `COMMIT` on the same connection (Postgres), which the server answers in one go.
//! `BEGIN`, `COMMIT` and `ROLLBACK` count as statements. Preparing a statement (once per pooled
//! connection, then cached) is a round trip of its own, counted apart as a prepare. Tests read the counters to prove how many
//! statements a hot path costs (issue 12: the sticky grant in at most 4 statements and 2 round
//! trips); nothing else depends on them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Process-wide counters of one [`super::Db`].
#[derive(Debug, Default)]
pub struct WireStats {
    statements: AtomicU64,
    round_trips: AtomicU64,
    prepares: AtomicU64,
}

/// A reading of [`WireStats`]; subtract two readings to cost an operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireSnapshot {
    pub statements: u64,
    pub round_trips: u64,
    pub prepares: u64,
}

impl std::ops::Sub for WireSnapshot {
    type Output = WireSnapshot;
    fn sub(self, o: WireSnapshot) -> WireSnapshot {
        WireSnapshot {
            statements: self.statements - o.statements,
            round_trips: self.round_trips - o.round_trips,
            prepares: self.prepares - o.prepares,
        }
    }
}

impl WireStats {
    /// One flight carrying `statements` statements.
    pub fn flight(&self, statements: u64) {
        self.statements.fetch_add(statements, Ordering::Relaxed);
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// A statement prepared on a connection for the first time.
    pub fn prepare(&self) {
        self.prepares.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> WireSnapshot {
        WireSnapshot {
            statements: self.statements.load(Ordering::Relaxed),
            round_trips: self.round_trips.load(Ordering::Relaxed),
            prepares: self.prepares.load(Ordering::Relaxed),
        }
    }
}
