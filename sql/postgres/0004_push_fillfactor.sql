-- Push delivery rows are leased (lease_token, lease_until, attempts) and then deleted. None of
-- those columns is indexed, so a lease can be a heap-only (HOT) update that writes no index entry,
-- but only when the row's page has room for the new version. Rows are inserted back to back and
-- would fill their pages, making every lease a full update (a new entry in each of the four
-- indexes, and dead entries the claim scan walks past). A fill factor of 50 leaves that room.
-- Storage only: the logical schema (ARCHITECTURE.md) is unchanged.
ALTER TABLE push_deliveries SET (fillfactor = 50);
