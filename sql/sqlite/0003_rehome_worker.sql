-- The director rehome worker's single-flight lease (docs/reference/http.md "single-flight"; the table is
-- an implementation choice the spec leaves open). One row `lease_id` = 'global': the director
-- process (`holder` = its incarnation) that may poll until `expires_at` (epoch ms).
CREATE TABLE relay_region_rehome_worker_lease (
    lease_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
