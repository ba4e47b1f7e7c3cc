-- Core relay schema (ARCHITECTURE.md): cells, runtime, fences, assignments, activity leases,
-- connection reservations, migrations, region correction, and phone credentials (docs/reference/websocket.md).
-- Times are epoch milliseconds. Cell rows are never deleted.

CREATE TABLE relay_cells (
    cell_id TEXT PRIMARY KEY,
    cell_url TEXT NOT NULL UNIQUE,
    region TEXT NOT NULL,
    capacity_requests INTEGER NOT NULL CHECK (capacity_requests BETWEEN 1 AND 1000000),
    reserved_requests INTEGER NOT NULL DEFAULT 0 CHECK (reserved_requests >= 0),
    admission_state TEXT NOT NULL CHECK (admission_state IN ('general', 'migration-only', 'existing-only')),
    roll_isolated_at INTEGER NULL,
    connection_hard_cap INTEGER NULL CHECK (connection_hard_cap IS NULL OR connection_hard_cap BETWEEN 200 AND 1000000),
    connection_unobserved_bound INTEGER NULL CHECK (connection_unobserved_bound IS NULL OR connection_unobserved_bound >= 0),
    admission_changed_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    CHECK ((connection_hard_cap IS NULL AND connection_unobserved_bound IS NULL)
        OR (connection_hard_cap IS NOT NULL AND connection_unobserved_bound IS NOT NULL)),
    CHECK (roll_isolated_at IS NULL OR admission_state = 'migration-only')
);

CREATE TABLE relay_cell_runtime (
    cell_id TEXT PRIMARY KEY,
    cell_incarnation TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    ready INTEGER NOT NULL CHECK (ready IN (0, 1)),
    observed_requests INTEGER NOT NULL,
    last_heartbeat_at INTEGER NOT NULL,
    total_connections INTEGER NULL,
    in_flight_connections INTEGER NULL,
    reserved_connection_units INTEGER NULL,
    enforced_connection_units INTEGER NULL,
    connection_inclusion_watermark INTEGER NULL,
    connection_observed_at INTEGER NULL,
    regional_rehome_protocol INTEGER NOT NULL DEFAULT 0 CHECK (regional_rehome_protocol BETWEEN 0 AND 3),
    safety_json TEXT NULL,
    safety_received_at INTEGER NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX relay_cell_runtime_ready ON relay_cell_runtime (ready, last_heartbeat_at);

CREATE TABLE relay_cell_fences (
    cell_id TEXT PRIMARY KEY,
    cell_incarnation TEXT NOT NULL,
    attested_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX relay_cell_fences_expires_at ON relay_cell_fences (expires_at);

CREATE TABLE relay_assignments (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    cell_id TEXT NOT NULL,
    assignment_epoch INTEGER NOT NULL CHECK (assignment_epoch >= 1),
    lease_expires_at INTEGER NOT NULL,
    last_activity_at INTEGER NOT NULL,
    reserved_controls INTEGER NOT NULL DEFAULT 0,
    reserved_splices INTEGER NOT NULL DEFAULT 0,
    reserved_invites INTEGER NOT NULL DEFAULT 0,
    pending_installs INTEGER NOT NULL DEFAULT 0,
    pending_confirmations INTEGER NOT NULL DEFAULT 0,
    migration_leases INTEGER NOT NULL DEFAULT 0,
    preferred_region TEXT NULL,
    preferred_region_observed_at INTEGER NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, relay_host_id)
);
CREATE INDEX relay_assignments_cell ON relay_assignments (cell_id);
CREATE INDEX relay_assignments_lease ON relay_assignments (lease_expires_at);

CREATE TABLE relay_assignment_activity_leases (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    activity_id TEXT NOT NULL,
    activity_kind TEXT NOT NULL CHECK (activity_kind IN ('control', 'splice', 'invite', 'install', 'confirmation', 'migration')),
    cell_id TEXT NOT NULL,
    request_units INTEGER NOT NULL CHECK (request_units >= 0),
    expires_at INTEGER NOT NULL,
    control_generation INTEGER NULL,
    cell_incarnation TEXT NULL,
    idle_regional_rehome INTEGER NOT NULL DEFAULT 0 CHECK (idle_regional_rehome IN (0, 1)),
    renewed_at INTEGER NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, activity_id)
);
CREATE INDEX relay_leases_cell ON relay_assignment_activity_leases (cell_id);
CREATE INDEX relay_leases_expires ON relay_assignment_activity_leases (expires_at);

CREATE TABLE relay_connection_reservations (
    reservation_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    assignment_epoch INTEGER NOT NULL,
    cell_id TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'claimed', 'released')),
    cell_incarnation TEXT NULL,
    inclusion_watermark INTEGER NULL,
    created_at INTEGER NOT NULL,
    timeout_at INTEGER NOT NULL,
    claimed_at INTEGER NULL,
    released_at INTEGER NULL
);
CREATE INDEX relay_reservations_cell_state ON relay_connection_reservations (cell_id, state);
CREATE INDEX relay_reservations_host ON relay_connection_reservations (user_id, relay_host_id, assignment_epoch, cell_id);
-- Invariant 6: at most one `reserved` reservation per (host, epoch, cell).
CREATE UNIQUE INDEX relay_reservations_one_reserved ON relay_connection_reservations (user_id, relay_host_id, assignment_epoch, cell_id)
    WHERE state = 'reserved';

CREATE TABLE relay_assignment_migrations (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    assignment_epoch INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('evacuation', 'idle-rehome')),
    source_cell_id TEXT NOT NULL,
    source_cell_incarnation TEXT NULL,
    target_cell_id TEXT NOT NULL,
    previous_epoch INTEGER NOT NULL,
    source_request_units INTEGER NOT NULL,
    target_reserved_units INTEGER NOT NULL,
    arrival_deadline INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    target_registered_at INTEGER NULL,
    completed_at INTEGER NULL,
    aborted_at INTEGER NULL,
    abort_reason TEXT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, assignment_epoch)
);
CREATE INDEX relay_migrations_open ON relay_assignment_migrations (completed_at, aborted_at, arrival_deadline);
CREATE INDEX relay_migrations_source ON relay_assignment_migrations (source_cell_id);
CREATE INDEX relay_migrations_target ON relay_assignment_migrations (target_cell_id);

CREATE TABLE relay_region_decisions (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    generation INTEGER NOT NULL CHECK (generation >= 1),
    assignment_epoch INTEGER NOT NULL,
    incumbent_region TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    cohort_bucket INTEGER NOT NULL CHECK (cohort_bucket BETWEEN 0 AND 99),
    outcome TEXT NOT NULL CHECK (outcome IN ('pending', 'conclusive', 'inconclusive')),
    preferred_region TEXT NULL,
    measurements_json TEXT NULL,
    inconclusive_reason TEXT NULL,
    issued_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    observed_at INTEGER NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, relay_host_id)
);
CREATE INDEX relay_region_decisions_outcome ON relay_region_decisions (outcome, observed_at);

CREATE TABLE relay_region_rehome_control (
    control_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL DEFAULT 0,
    enabled INTEGER NOT NULL DEFAULT 0 CHECK (enabled IN (0, 1)),
    not_before INTEGER NOT NULL DEFAULT 0,
    rate_per_minute INTEGER NOT NULL DEFAULT 10,
    cohort_percent INTEGER NOT NULL DEFAULT 0,
    host_cooldown_ms INTEGER NOT NULL DEFAULT 604800000,
    preference_max_age_ms INTEGER NOT NULL DEFAULT 86400000,
    next_dispatch_at INTEGER NOT NULL DEFAULT 0,
    paused_until INTEGER NOT NULL DEFAULT 0,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    disabled_reason TEXT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE relay_region_rehome_attempts (
    attempt_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    previous_epoch INTEGER NOT NULL,
    assignment_epoch INTEGER NOT NULL,
    source_cell_id TEXT NOT NULL,
    source_cell_incarnation TEXT NOT NULL,
    source_generation INTEGER NOT NULL,
    target_cell_id TEXT NOT NULL,
    preferred_region TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    completed_at INTEGER NULL,
    aborted_at INTEGER NULL,
    abort_reason TEXT NULL,
    updated_at INTEGER NOT NULL,
    UNIQUE (user_id, relay_host_id, assignment_epoch)
);
CREATE INDEX relay_rehome_attempts_host ON relay_region_rehome_attempts (user_id, relay_host_id, created_at);
CREATE INDEX relay_rehome_attempts_created ON relay_region_rehome_attempts (created_at);

-- Phone credentials (docs/reference/websocket.md). Only SHA-256 hashes of tokens are stored.
CREATE TABLE relay_invites (
    token_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('available', 'reserved', 'cooldown', 'consumed', 'invalidated', 'expired')),
    attempt_count INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    reservation_id TEXT NULL,
    reservation_expires_at INTEGER NULL,
    cooldown_until INTEGER NULL,
    -- The `invite-offer:<reqId>` activity to release when the invite reaches a terminal state.
    offer_req_id TEXT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX relay_invites_device ON relay_invites (user_id, relay_host_id, relay_device_id);

CREATE TABLE relay_devices (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    current_hash TEXT NOT NULL,
    current_version INTEGER NOT NULL,
    current_expires_at INTEGER NOT NULL,
    grace_hash TEXT NULL,
    grace_version INTEGER NULL,
    grace_expires_at INTEGER NULL,
    revoked_at INTEGER NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, relay_device_id)
);
CREATE INDEX relay_devices_current ON relay_devices (relay_host_id, current_hash);
CREATE INDEX relay_devices_grace ON relay_devices (relay_host_id, grace_hash);

CREATE TABLE relay_connection_bases (
    basis_conn_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    owning_control_generation INTEGER NOT NULL,
    credential_kind TEXT NOT NULL CHECK (credential_kind IN ('invite', 'resume')),
    invite_token_hash TEXT NULL,
    accepted_credential_version INTEGER NULL,
    accepted_as TEXT NULL,
    deadline INTEGER NOT NULL,
    active INTEGER NOT NULL CHECK (active IN (0, 1)),
    created_at INTEGER NOT NULL
);

CREATE TABLE relay_direct_authorizations (
    direct_auth_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    owning_control_generation INTEGER NOT NULL,
    deadline INTEGER NOT NULL,
    consumed_at INTEGER NULL
);

CREATE TABLE relay_install_results (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    req_id TEXT NOT NULL,
    result_json TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, relay_device_id, req_id)
);

CREATE TABLE relay_confirm_results (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    req_id TEXT NOT NULL,
    basis_conn_id TEXT NOT NULL,
    result_json TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, req_id)
);

CREATE TABLE relay_rate_windows (
    scope TEXT NOT NULL,
    kind TEXT NOT NULL,
    window_start INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (scope, kind, window_start)
);

CREATE TABLE relay_audit_events (
    event_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    detail TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
