-- The Postgres WAL timeline the relay writes on (one row, `id` = 1); see the Postgres migration of
-- the same number. SQLite has no timeline: the table stays empty, defined for schema parity.
CREATE TABLE relay_store_timeline (
    id INTEGER PRIMARY KEY,
    timeline INTEGER NOT NULL,
    settled_at INTEGER NOT NULL,
    epoch_floor INTEGER NOT NULL DEFAULT 0
);
