-- Push gateway schema (ARCHITECTURE.md). Times are epoch milliseconds; NULL only where marked.
-- A push_deliveries row exists only while the delivery is pending.

CREATE TABLE push_challenges (
    challenge_id TEXT PRIMARY KEY,
    host_fingerprint TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    consumed_at INTEGER NULL
);
CREATE INDEX push_challenges_expires_at ON push_challenges (expires_at);

CREATE TABLE push_sessions (
    token_hash TEXT PRIMARY KEY,
    host_fingerprint TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX push_sessions_host ON push_sessions (host_fingerprint);
CREATE INDEX push_sessions_expires_at ON push_sessions (expires_at);

CREATE TABLE push_devices (
    registration_id TEXT PRIMARY KEY,
    host_fingerprint TEXT NOT NULL,
    device_id TEXT NOT NULL,
    platform TEXT NOT NULL CHECK (platform IN ('ios', 'android')),
    token TEXT NOT NULL,
    apns_environment TEXT NULL CHECK (apns_environment IS NULL OR apns_environment IN ('sandbox', 'production')),
    dead_at INTEGER NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX push_devices_host_device ON push_devices (host_fingerprint, device_id);

CREATE TABLE push_events (
    event_id TEXT PRIMARY KEY,
    host_fingerprint TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('alert', 'dismiss')),
    fingerprint TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX push_events_quota ON push_events (host_fingerprint, kind, created_at);
CREATE INDEX push_events_retention ON push_events (created_at);

CREATE TABLE push_event_recipients (
    event_id TEXT NOT NULL,
    registration_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (event_id, registration_id)
);
CREATE INDEX push_recipients_retention ON push_event_recipients (created_at);

CREATE TABLE push_deliveries (
    delivery_id TEXT PRIMARY KEY,
    host_fingerprint TEXT NOT NULL,
    registration_id TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('alert', 'dismiss')),
    notification_epoch TEXT NOT NULL,
    notification_id TEXT NULL,
    notification_seq INTEGER NOT NULL,
    payload_json TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    lease_token TEXT NULL,
    lease_until INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);
CREATE INDEX push_deliveries_due ON push_deliveries (due_at, created_at, delivery_id);
CREATE INDEX push_deliveries_head ON push_deliveries (registration_id, due_at, created_at, delivery_id);
CREATE INDEX push_deliveries_expiry ON push_deliveries (expires_at);

CREATE TABLE push_dismissed_events (
    host_fingerprint TEXT NOT NULL,
    notification_epoch TEXT NOT NULL,
    notification_id TEXT NOT NULL,
    notification_seq INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (host_fingerprint, notification_epoch, notification_id)
);
CREATE INDEX push_dismissed_retention ON push_dismissed_events (created_at);
