-- The Postgres WAL timeline the relay writes on (one row, `id` = 1). A promoted standby runs on a
-- new timeline; the first connection that sees the change advances every epoch and generation past
-- what a lost commit could have issued (docs/deploy/cluster.md, Postgres failover). `settled_at` is
-- epoch ms. `epoch_floor` is the sum of those advances: a host placed for the first time starts
-- above it, so a host whose row a failover lost never gets an epoch it already saw. On SQLite the
-- table stays empty.
CREATE TABLE relay_store_timeline (
    id BIGINT PRIMARY KEY,
    timeline BIGINT NOT NULL,
    settled_at BIGINT NOT NULL,
    epoch_floor BIGINT NOT NULL DEFAULT 0
);
-- A server without the WAL functions (some managed services) leaves the table empty.
DO $$
BEGIN
    INSERT INTO relay_store_timeline (id, timeline, settled_at)
    SELECT 1,
           CAST(CAST(('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)) AS bit(32)) AS BIGINT),
           CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT);
EXCEPTION WHEN undefined_function OR feature_not_supported OR insufficient_privilege THEN
    NULL;
END
$$;
