-- Core relay schema (ARCHITECTURE.md): cells, runtime, fences, assignments, activity leases,
-- connection reservations, migrations, region correction, and phone credentials (docs/reference/websocket.md).
-- Times are epoch milliseconds. Cell rows are never deleted.

CREATE TABLE relay_cells (
    cell_id TEXT PRIMARY KEY,
    cell_url TEXT NOT NULL UNIQUE,
    region TEXT NOT NULL,
    capacity_requests BIGINT NOT NULL CHECK (capacity_requests BETWEEN 1 AND 1000000),
    reserved_requests BIGINT NOT NULL DEFAULT 0 CHECK (reserved_requests >= 0),
    admission_state TEXT NOT NULL CHECK (admission_state IN ('general', 'migration-only', 'existing-only')),
    roll_isolated_at BIGINT NULL,
    connection_hard_cap BIGINT NULL CHECK (connection_hard_cap IS NULL OR connection_hard_cap BETWEEN 200 AND 1000000),
    connection_unobserved_bound BIGINT NULL CHECK (connection_unobserved_bound IS NULL OR connection_unobserved_bound >= 0),
    admission_changed_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    CHECK ((connection_hard_cap IS NULL AND connection_unobserved_bound IS NULL)
        OR (connection_hard_cap IS NOT NULL AND connection_unobserved_bound IS NOT NULL)),
    CHECK (roll_isolated_at IS NULL OR admission_state = 'migration-only')
);

CREATE TABLE relay_cell_runtime (
    cell_id TEXT PRIMARY KEY,
    cell_incarnation TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    ready BOOLEAN NOT NULL,
    observed_requests BIGINT NOT NULL,
    last_heartbeat_at BIGINT NOT NULL,
    total_connections BIGINT NULL,
    in_flight_connections BIGINT NULL,
    reserved_connection_units BIGINT NULL,
    enforced_connection_units BIGINT NULL,
    connection_inclusion_watermark BIGINT NULL,
    connection_observed_at BIGINT NULL,
    regional_rehome_protocol BIGINT NOT NULL DEFAULT 0 CHECK (regional_rehome_protocol BETWEEN 0 AND 3),
    safety_json TEXT NULL,
    safety_received_at BIGINT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX relay_cell_runtime_ready ON relay_cell_runtime (ready, last_heartbeat_at);

CREATE TABLE relay_cell_fences (
    cell_id TEXT PRIMARY KEY,
    cell_incarnation TEXT NOT NULL,
    attested_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX relay_cell_fences_expires_at ON relay_cell_fences (expires_at);

CREATE TABLE relay_assignments (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    cell_id TEXT NOT NULL,
    assignment_epoch BIGINT NOT NULL CHECK (assignment_epoch >= 1),
    lease_expires_at BIGINT NOT NULL,
    last_activity_at BIGINT NOT NULL,
    reserved_controls BIGINT NOT NULL DEFAULT 0,
    reserved_splices BIGINT NOT NULL DEFAULT 0,
    reserved_invites BIGINT NOT NULL DEFAULT 0,
    pending_installs BIGINT NOT NULL DEFAULT 0,
    pending_confirmations BIGINT NOT NULL DEFAULT 0,
    migration_leases BIGINT NOT NULL DEFAULT 0,
    preferred_region TEXT NULL,
    preferred_region_observed_at BIGINT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
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
    request_units BIGINT NOT NULL CHECK (request_units >= 0),
    expires_at BIGINT NOT NULL,
    control_generation BIGINT NULL,
    cell_incarnation TEXT NULL,
    idle_regional_rehome BOOLEAN NOT NULL DEFAULT FALSE,
    renewed_at BIGINT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, activity_id)
);
CREATE INDEX relay_leases_cell ON relay_assignment_activity_leases (cell_id);
CREATE INDEX relay_leases_expires ON relay_assignment_activity_leases (expires_at);

CREATE TABLE relay_connection_reservations (
    reservation_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    assignment_epoch BIGINT NOT NULL,
    cell_id TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'claimed', 'released')),
    cell_incarnation TEXT NULL,
    inclusion_watermark BIGINT NULL,
    created_at BIGINT NOT NULL,
    timeout_at BIGINT NOT NULL,
    claimed_at BIGINT NULL,
    released_at BIGINT NULL
);
CREATE INDEX relay_reservations_cell_state ON relay_connection_reservations (cell_id, state);
CREATE INDEX relay_reservations_host ON relay_connection_reservations (user_id, relay_host_id, assignment_epoch, cell_id);
-- Invariant 6: at most one `reserved` reservation per (host, epoch, cell).
CREATE UNIQUE INDEX relay_reservations_one_reserved ON relay_connection_reservations (user_id, relay_host_id, assignment_epoch, cell_id)
    WHERE state = 'reserved';

CREATE TABLE relay_assignment_migrations (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    assignment_epoch BIGINT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('evacuation', 'idle-rehome')),
    source_cell_id TEXT NOT NULL,
    source_cell_incarnation TEXT NULL,
    target_cell_id TEXT NOT NULL,
    previous_epoch BIGINT NOT NULL,
    source_request_units BIGINT NOT NULL,
    target_reserved_units BIGINT NOT NULL,
    arrival_deadline BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    target_registered_at BIGINT NULL,
    completed_at BIGINT NULL,
    aborted_at BIGINT NULL,
    abort_reason TEXT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, assignment_epoch)
);
CREATE INDEX relay_migrations_open ON relay_assignment_migrations (completed_at, aborted_at, arrival_deadline);
CREATE INDEX relay_migrations_source ON relay_assignment_migrations (source_cell_id);
CREATE INDEX relay_migrations_target ON relay_assignment_migrations (target_cell_id);

CREATE TABLE relay_region_decisions (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    generation BIGINT NOT NULL CHECK (generation >= 1),
    assignment_epoch BIGINT NOT NULL,
    incumbent_region TEXT NOT NULL,
    policy_version BIGINT NOT NULL,
    cohort_bucket BIGINT NOT NULL CHECK (cohort_bucket BETWEEN 0 AND 99),
    outcome TEXT NOT NULL CHECK (outcome IN ('pending', 'conclusive', 'inconclusive')),
    preferred_region TEXT NULL,
    measurements_json TEXT NULL,
    inconclusive_reason TEXT NULL,
    issued_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    observed_at BIGINT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (user_id, relay_host_id)
);
CREATE INDEX relay_region_decisions_outcome ON relay_region_decisions (outcome, observed_at);

CREATE TABLE relay_region_rehome_control (
    control_id TEXT PRIMARY KEY,
    generation BIGINT NOT NULL DEFAULT 0,
    enabled BOOLEAN NOT NULL DEFAULT FALSE,
    not_before BIGINT NOT NULL DEFAULT 0,
    rate_per_minute BIGINT NOT NULL DEFAULT 10,
    cohort_percent BIGINT NOT NULL DEFAULT 0,
    host_cooldown_ms BIGINT NOT NULL DEFAULT 604800000,
    preference_max_age_ms BIGINT NOT NULL DEFAULT 86400000,
    next_dispatch_at BIGINT NOT NULL DEFAULT 0,
    paused_until BIGINT NOT NULL DEFAULT 0,
    consecutive_failures BIGINT NOT NULL DEFAULT 0,
    disabled_reason TEXT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE relay_region_rehome_attempts (
    attempt_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    previous_epoch BIGINT NOT NULL,
    assignment_epoch BIGINT NOT NULL,
    source_cell_id TEXT NOT NULL,
    source_cell_incarnation TEXT NOT NULL,
    source_generation BIGINT NOT NULL,
    target_cell_id TEXT NOT NULL,
    preferred_region TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    completed_at BIGINT NULL,
    aborted_at BIGINT NULL,
    abort_reason TEXT NULL,
    updated_at BIGINT NOT NULL,
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
    attempt_count BIGINT NOT NULL DEFAULT 0,
    max_attempts BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    reservation_id TEXT NULL,
    reservation_expires_at BIGINT NULL,
    cooldown_until BIGINT NULL,
    -- The `invite-offer:<reqId>` activity to release when the invite reaches a terminal state.
    offer_req_id TEXT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX relay_invites_device ON relay_invites (user_id, relay_host_id, relay_device_id);

CREATE TABLE relay_devices (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    current_hash TEXT NOT NULL,
    current_version BIGINT NOT NULL,
    current_expires_at BIGINT NOT NULL,
    grace_hash TEXT NULL,
    grace_version BIGINT NULL,
    grace_expires_at BIGINT NULL,
    revoked_at BIGINT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, relay_device_id)
);
CREATE INDEX relay_devices_current ON relay_devices (relay_host_id, current_hash);
CREATE INDEX relay_devices_grace ON relay_devices (relay_host_id, grace_hash);

CREATE TABLE relay_connection_bases (
    basis_conn_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    owning_control_generation BIGINT NOT NULL,
    credential_kind TEXT NOT NULL CHECK (credential_kind IN ('invite', 'resume')),
    invite_token_hash TEXT NULL,
    accepted_credential_version BIGINT NULL,
    accepted_as TEXT NULL,
    deadline BIGINT NOT NULL,
    active BOOLEAN NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE relay_direct_authorizations (
    direct_auth_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    owning_control_generation BIGINT NOT NULL,
    deadline BIGINT NOT NULL,
    consumed_at BIGINT NULL
);

CREATE TABLE relay_install_results (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    req_id TEXT NOT NULL,
    result_json TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, relay_device_id, req_id)
);

CREATE TABLE relay_confirm_results (
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    req_id TEXT NOT NULL,
    basis_conn_id TEXT NOT NULL,
    result_json TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (user_id, relay_host_id, req_id)
);

CREATE TABLE relay_rate_windows (
    scope TEXT NOT NULL,
    kind TEXT NOT NULL,
    window_start BIGINT NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (scope, kind, window_start)
);

CREATE TABLE relay_audit_events (
    event_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    user_id TEXT NOT NULL,
    relay_host_id TEXT NOT NULL,
    relay_device_id TEXT NOT NULL,
    detail TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
