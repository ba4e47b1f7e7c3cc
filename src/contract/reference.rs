//! The generated reference pages: `docs/reference/close-codes.md`, `docs/reference/errors.md`
//! and `docs/reference/limits.md`.
//!
//! Every value on those pages comes from the constants in [`super::close`], [`super::errors`] and
//! [`super::limits`] (and the route code strings named below), so the pages cannot drift from
//! the code: `tests/docs_reference.rs` compares each page with the file in `docs/` and checks that
//! every constant of those modules is listed.

use super::{close, errors, limits};

/// A WebSocket close code with its meaning and what a client does about it.
pub struct CloseCode {
    pub code: u16,
    pub name: &'static str,
    pub meaning: &'static str,
    pub client: &'static str,
}

/// Every close code the relay sends.
pub const CLOSE_CODES: &[CloseCode] = &[
    CloseCode {
        code: close::BAD_OUTER_CREDENTIAL,
        name: "BAD_OUTER_CREDENTIAL",
        meaning: "The credential or handshake of the leg was refused: a bad or expired token, \
                  invite, resume token or data ticket, a failed host proof, or a malformed or \
                  late first frame.",
        client: "Do not retry with the same credential. A phone drops that invite or resume \
                 token; a host mints a new host token.",
    },
    CloseCode {
        code: close::HOST_OFFLINE,
        name: "HOST_OFFLINE",
        meaning: "The host has no active control session on this cell, or signed out, or did \
                  not open the data leg in time.",
        client: "Retry later with jitter.",
    },
    CloseCode {
        code: close::PEER_DROPPED,
        name: "PEER_DROPPED",
        meaning: "The other end of a splice left, the host's session was replaced by a newer \
                  generation, or a control session was superseded or went silent.",
        client: "Start a new end-to-end session.",
    },
    CloseCode {
        code: close::WRONG_CELL,
        name: "WRONG_CELL",
        meaning: "This cell is not (or no longer) the host's assigned cell, or the assignment \
                  changed while the handshake ran.",
        client: "Re-resolve: a host calls `POST /v1/assign`, a phone with a resume token \
                 `POST /v1/resolve`, a phone with an invite the director's connect socket.",
    },
    CloseCode {
        code: close::LIMIT_EXCEEDED,
        name: "LIMIT_EXCEEDED",
        meaning: "A limit was hit (connections per host, queued bytes, a wedged peer) or the \
                  relay could not serve the handshake just now (database or internal fault).",
        client: "Back off and retry on the same cell.",
    },
    CloseCode {
        code: close::DRAINING,
        name: "DRAINING",
        meaning: "The cell is draining or shutting down, or the host is being moved.",
        client: "Re-resolve through the configured director, then reconnect.",
    },
    CloseCode {
        code: close::MESSAGE_TOO_BIG,
        name: "MESSAGE_TOO_BIG",
        meaning: "A message was larger than the leg's maximum (see the limits page); sent by \
                  the WebSocket layer.",
        client: "Send smaller messages.",
    },
    CloseCode {
        code: close::PROTOCOL_ERROR,
        name: "PROTOCOL_ERROR",
        meaning: "A frame broke the WebSocket framing rules (RFC 6455) before the leg was \
                  admitted; reason `protocol error`.",
        client: "A client bug: fix the WebSocket library or its use; do not retry blindly.",
    },
    CloseCode {
        code: close::INVALID_PAYLOAD,
        name: "INVALID_PAYLOAD",
        meaning: "A text frame was not valid UTF-8 before the leg was admitted; reason \
                  `invalid frame payload data`.",
        client: "A client bug: send text frames as UTF-8.",
    },
];

/// A close reason: its exact text, the code it travels with and where it is used.
pub struct CloseReason {
    pub text: &'static str,
    pub code: u16,
    pub legs: &'static str,
    pub when: &'static str,
}

/// Every close reason text, grouped by code.
pub const CLOSE_REASONS: &[CloseReason] = &[
    CloseReason {
        text: close::reason::FIRST_FRAME_TIMEOUT,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "phone, data",
        when: "No first frame within the first-frame deadline.",
    },
    CloseReason {
        text: close::reason::FIRST_FRAME_MUST_BE_TEXT,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "phone, data",
        when: "The first frame was binary.",
    },
    CloseReason {
        text: close::reason::INVALID_RELAY_AUTH,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "phone",
        when: "The `relay-auth` frame was malformed or its invite or resume token was refused.",
    },
    CloseReason {
        text: close::reason::INVALID_HOST_DATA_AUTH,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "data",
        when: "The `host-data-auth` frame was malformed.",
    },
    CloseReason {
        text: close::reason::INVALID_HOST_DATA_TICKET,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "data",
        when: "The data ticket does not match a pending phone of this host.",
    },
    CloseReason {
        text: close::reason::HOST_HELLO_TIMEOUT,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "No `host-hello` within the first-frame deadline.",
    },
    CloseReason {
        text: close::reason::HOST_HELLO_MUST_BE_TEXT,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "The `host-hello` frame was binary.",
    },
    CloseReason {
        text: close::reason::INVALID_HOST_HELLO,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "The `host-hello` frame was malformed or its host token was refused.",
    },
    CloseReason {
        text: close::reason::INVALID_HOST_PUBLIC_KEY,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "The public key is not canonical padded base64 of 32 bytes.",
    },
    CloseReason {
        text: close::reason::HOST_KEY_BINDING_MISMATCH,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "The public key does not hash to the `relayHostId` of the token and path.",
    },
    CloseReason {
        text: close::reason::HOST_PROOF_TIMEOUT,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "No `host-challenge-ack` within the proof window.",
    },
    CloseReason {
        text: close::reason::INVALID_HOST_PROOF,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "The challenge answer did not prove the X25519 key.",
    },
    CloseReason {
        text: close::reason::INVALID_CONTROL_JSON,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "A control message was not valid JSON of a known shape.",
    },
    CloseReason {
        text: close::reason::REFRESH_IDENTITY_CHANGED,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "An `auth-refresh` token names another user or host.",
    },
    CloseReason {
        text: close::reason::RELAY_AUTHORIZATION_EXPIRED,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "control",
        when: "The host token expired (after its grace) without a refresh.",
    },
    CloseReason {
        text: close::reason::INVALID_INVITE,
        code: close::BAD_OUTER_CREDENTIAL,
        legs: "director connect",
        when: "The director's connect socket could not find the invite.",
    },
    CloseReason {
        text: close::reason::RELAY_CONNECTION_REJECTED,
        code: close::HOST_OFFLINE,
        legs: "phone",
        when: "The host has no active control session here.",
    },
    CloseReason {
        text: close::reason::SIGNED_OUT,
        code: close::HOST_OFFLINE,
        legs: "phone",
        when: "The host signed out recently.",
    },
    CloseReason {
        text: close::reason::PEER_CONNECTION_DROPPED,
        code: close::PEER_DROPPED,
        legs: "splice, phone",
        when: "The peer left or sent an oversize message, the generation was replaced, or the \
               orphan grace ran out.",
    },
    CloseReason {
        text: close::reason::CONTROL_SILENCE_TIMEOUT,
        code: close::PEER_DROPPED,
        legs: "control",
        when: "Nothing received from the host for the silence timeout.",
    },
    CloseReason {
        text: close::reason::REPLACED_BY_NEWER_GENERATION,
        code: close::PEER_DROPPED,
        legs: "control",
        when: "The host opened a new control generation.",
    },
    CloseReason {
        text: close::reason::CONTROL_REBOUND,
        code: close::PEER_DROPPED,
        legs: "control",
        when: "Another socket rebound this control session with its resume secret.",
    },
    CloseReason {
        text: close::reason::CONTROL_ACTIVATION_SUPERSEDED,
        code: close::PEER_DROPPED,
        legs: "control",
        when: "A newer control activation for the host won the queue.",
    },
    CloseReason {
        text: close::reason::WRONG_ASSIGNMENT_EPOCH,
        code: close::WRONG_CELL,
        legs: "control",
        when: "The lease's assignment epoch is not the current one for this cell.",
    },
    CloseReason {
        text: close::reason::ASSIGNMENT_CHANGED_DURING_HOST_PROOF,
        code: close::WRONG_CELL,
        legs: "control",
        when: "The host was moved while it was proving its key.",
    },
    CloseReason {
        text: close::reason::IDLE_CUTOVER_IN_PROGRESS,
        code: close::WRONG_CELL,
        legs: "control, data, phone",
        when: "The host is being moved to another region while idle.",
    },
    CloseReason {
        text: close::reason::BASIS_PERSISTENCE_FAILED,
        code: close::LIMIT_EXCEEDED,
        legs: "data",
        when: "The phone's credential basis could not be stored.",
    },
    CloseReason {
        text: close::reason::CONTROL_ACTIVATION_QUEUE_STALLED,
        code: close::LIMIT_EXCEEDED,
        legs: "control",
        when: "The activation waited longer than the activation queue wait.",
    },
    CloseReason {
        text: close::reason::RELAY_QUEUE_LIMIT_EXCEEDED,
        code: close::LIMIT_EXCEEDED,
        legs: "splice",
        when: "A direction queued more than its overflow budget.",
    },
    CloseReason {
        text: close::reason::WEDGED_RELAY_LINK,
        code: close::LIMIT_EXCEEDED,
        legs: "splice",
        when: "A reader did not drain its queue within the wedge timeout.",
    },
    CloseReason {
        text: close::reason::RELAY_TEMPORARILY_UNAVAILABLE,
        code: close::LIMIT_EXCEEDED,
        legs: "any",
        when: "A database or internal fault during a handshake or refresh.",
    },
    CloseReason {
        text: close::reason::RELAY_DRAINING,
        code: close::DRAINING,
        legs: "control, splice",
        when: "The cell is draining (new controls and splices at the forced close).",
    },
    CloseReason {
        text: close::reason::RESOLVE_CONFIGURED_DIRECTOR,
        code: close::DRAINING,
        legs: "control",
        when: "The drain grace ran out, or an idle regional move finished.",
    },
    CloseReason {
        text: close::reason::CONTROL_LEASE_EXPIRED,
        code: close::DRAINING,
        legs: "control",
        when: "The control lease could not be renewed before it expired.",
    },
    CloseReason {
        text: close::reason::CONTROL_ASSIGNMENT_MISSING,
        code: close::DRAINING,
        legs: "control",
        when: "The host's assignment row is gone.",
    },
    CloseReason {
        text: close::reason::CONTROL_MIGRATION_COMPLETED,
        code: close::DRAINING,
        legs: "control",
        when: "The host was migrated to another cell.",
    },
    CloseReason {
        text: close::reason::CONTROL_ACTIVITY_MOVED,
        code: close::DRAINING,
        legs: "control",
        when: "The control activity now belongs to another cell.",
    },
    CloseReason {
        text: close::reason::RESOLVE_DIRECTOR,
        code: close::DRAINING,
        legs: "control",
        when: "A refresh or command arrived during an idle cutover.",
    },
    CloseReason {
        text: close::reason::HOST_RETIRED_DURING_ATTACHMENT,
        code: close::DRAINING,
        legs: "phone, data",
        when: "The host was told to drain while the phone was being attached.",
    },
    CloseReason {
        text: close::reason::CONNECT_TO_ASSIGNED_CELL,
        code: close::DRAINING,
        legs: "director connect",
        when: "The invite was found: the reply names the cell to dial.",
    },
];

/// An HTTP error code: the `error` string, the statuses it is sent with, and where.
pub struct ErrorCode {
    pub code: &'static str,
    pub status: &'static str,
    pub routes: &'static str,
    pub meaning: &'static str,
}

/// Codes any relay route may answer (the constants of [`super::errors`]).
pub const SHARED_ERRORS: &[ErrorCode] = &[
    ErrorCode {
        code: errors::INVALID_REQUEST,
        status: "400",
        routes: "every route with a body",
        meaning: "The body is not the documented JSON object: an unknown or missing field, a \
                  wrong type, a `null`, a duplicate key, a value out of range, or a body that \
                  did not arrive within the body deadline.",
    },
    ErrorCode {
        code: errors::INVALID_TOKEN,
        status: "401",
        routes: "every authenticated route",
        meaning: "The bearer is missing, malformed, expired or wrong.",
    },
    ErrorCode {
        code: errors::REQUEST_TOO_LARGE,
        status: "413",
        routes: "every route with a body",
        meaning: "The body is over the route's body limit (counted on the bytes read).",
    },
    ErrorCode {
        code: errors::NOT_FOUND,
        status: "404",
        routes: "any",
        meaning: "No role serves this path.",
    },
    ErrorCode {
        code: errors::DIRECTOR_ONLY,
        status: "404",
        routes: "director routes",
        meaning: "The route belongs to the director role, which this process does not run.",
    },
    ErrorCode {
        code: errors::CELL_ONLY,
        status: "404",
        routes: "cell routes",
        meaning: "The route belongs to the cell role, which this process does not run.",
    },
    ErrorCode {
        code: errors::PUSH_ONLY,
        status: "404",
        routes: "push routes",
        meaning: "The route belongs to the push role, which this process does not run.",
    },
    ErrorCode {
        code: errors::SHUTTING_DOWN,
        status: "503, `Retry-After: 1`",
        routes: "every route but `/health`",
        meaning: "The process received SIGTERM or SIGINT and is stopping.",
    },
    ErrorCode {
        code: errors::SERVER_BUSY,
        status: "503, `Retry-After: 1`",
        routes: "any",
        meaning: "The process is serving as many HTTP connections as it takes at once \
                  (`HTTP_CONNECTIONS_MAX`, WebSocket handshakes included); this connection was \
                  answered and closed without being read further. Retry after the delay.",
    },
    ErrorCode {
        code: errors::DEPENDENCY_UNAVAILABLE,
        status: "503 (`Retry-After: 1` on push routes)",
        routes: "`GET /ready`, push routes",
        meaning: "The database is unreachable (on `/ready`: past the readiness grace), or a \
                  validation-mode push process finds the schema behind this binary.",
    },
    ErrorCode {
        code: errors::DATABASE_TEMPORARILY_UNAVAILABLE,
        status: "503, `Retry-After: 5`",
        routes: "operator and node routes",
        meaning: "A database call failed or timed out; nothing was half written. Retry.",
    },
];

/// Codes of particular routes (the strings the route modules answer).
pub const ROUTE_ERRORS: &[ErrorCode] = &[
    ErrorCode {
        code: "assignments_temporarily_unavailable",
        status: "503, `Retry-After`",
        routes: "`POST /v1/assign`, `POST /v1/resolve`, `POST /v1/admin/regional-rehome-control`",
        meaning: "The admission lane is full or its wait ran out, or the database failed. Retry \
                  after the given seconds.",
    },
    ErrorCode {
        code: "assignment_row_busy",
        status: "503, `Retry-After: 1`; 409 on evacuations",
        routes: "`POST /v1/assign`, `POST /v1/admin/evacuate`",
        meaning: "Another transaction holds the host's assignment row (typically a move in \
                  progress). Retry shortly.",
    },
    ErrorCode {
        code: "relay_capacity_exhausted",
        status: "503 (no `Retry-After`); 409 on evacuations",
        routes: "`POST /v1/assign`, `POST /v1/resolve`, evacuations",
        meaning: "No live cell open to new hosts has room. Clients retry with backoff.",
    },
    ErrorCode {
        code: "relay_connection_headroom_exhausted",
        status: "503 (no `Retry-After`)",
        routes: "`POST /v1/assign`, `POST /v1/resolve`",
        meaning: "Cells have request room but no connection headroom (capped cells). Clients \
                  retry with backoff.",
    },
    ErrorCode {
        code: "relay_home_cell_unavailable",
        status: "503 (no `Retry-After`)",
        routes: "`POST /v1/assign`, `POST /v1/resolve`",
        meaning: "The host's home cell cannot serve it and it may not be moved yet. Clients \
                  retry with backoff.",
    },
    ErrorCode {
        code: "host_identity_mismatch",
        status: "403",
        routes: "`POST /v1/assign`",
        meaning: "The body's `relayHostId` is not the host token's.",
    },
    ErrorCode {
        code: "assignment_not_found",
        status: "409",
        routes: "`POST /v1/assign` (a region report), evacuations",
        meaning: "The host has no assignment row.",
    },
    ErrorCode {
        code: "invalid_credential",
        status: "401",
        routes: "`POST /v1/resolve`",
        meaning: "The resume token is unknown, expired or revoked.",
    },
    ErrorCode {
        code: "region_catalog_temporarily_unavailable",
        status: "503, `Retry-After: 5`",
        routes: "`GET /v1/regions`",
        meaning: "The cell list could not be read.",
    },
    ErrorCode {
        code: "cell_identity_mismatch",
        status: "403",
        routes: "`POST /v1/admin/cell-heartbeat`, `POST /v1/admin/cell-rehome-status`",
        meaning: "The cluster token's subject is not the body's `cellId`.",
    },
    ErrorCode {
        code: "cell_not_found",
        status: "409 on heartbeats; 404 on operator routes",
        routes: "heartbeats, `cell-state`, `cell-fence`, `cell-status`, `evacuate-cell`",
        meaning: "No cell with that id is registered.",
    },
    ErrorCode {
        code: "cell_origin_mismatch",
        status: "409",
        routes: "`POST /v1/admin/cell-heartbeat`",
        meaning: "The beat's `cellUrl` is not the registered one.",
    },
    ErrorCode {
        code: "cell_region_mismatch",
        status: "409",
        routes: "`POST /v1/admin/cell-heartbeat`",
        meaning: "The beat's `region` is not the registered one.",
    },
    ErrorCode {
        code: "stale_cell_incarnation",
        status: "409",
        routes: "`POST /v1/admin/cell-heartbeat`, `POST /v1/admin/cell-rehome-status`",
        meaning: "A newer process of the cell has already reported; this one must stop.",
    },
    ErrorCode {
        code: "cell_connection_telemetry_mismatch",
        status: "409",
        routes: "`POST /v1/admin/cell-heartbeat`",
        meaning: "The beat's hard cap or unobserved bound differ from the registered ones, or a \
                  capped cell sent no connection telemetry.",
    },
    ErrorCode {
        code: "cell_connection_limit_not_configured",
        status: "409",
        routes: "`POST /v1/admin/cell-heartbeat`",
        meaning: "The beat carries connection telemetry for a cell registered without a cap.",
    },
    ErrorCode {
        code: "stale_connection_snapshot",
        status: "409",
        routes: "`POST /v1/admin/cell-heartbeat`",
        meaning: "The connection snapshot is older than the one already stored.",
    },
    ErrorCode {
        code: "cell_url_conflict",
        status: "409",
        routes: "`POST /v1/admin/cells`",
        meaning: "Another cell is registered with that URL.",
    },
    ErrorCode {
        code: "cell_fence_admission_enabled",
        status: "409",
        routes: "`POST /v1/admin/cell-fence`",
        meaning: "The cell must be `existing-only` before it can be fenced.",
    },
    ErrorCode {
        code: "cell_fence_runtime_mismatch",
        status: "409",
        routes: "`POST /v1/admin/cell-fence`",
        meaning: "The incarnation given is not the one the director last saw.",
    },
    ErrorCode {
        code: "cell_fence_runtime_not_stale",
        status: "409",
        routes: "`POST /v1/admin/cell-fence`",
        meaning: "That incarnation is still heartbeating.",
    },
    ErrorCode {
        code: "migration_in_progress",
        status: "409",
        routes: "`POST /v1/admin/evacuate`",
        meaning: "The host already has an open migration.",
    },
    ErrorCode {
        code: "target_matches_source",
        status: "409",
        routes: "evacuations, `POST /v1/admin/migration-complete`",
        meaning: "The target cell is the host's current cell.",
    },
    ErrorCode {
        code: "target_cell_unavailable",
        status: "409",
        routes: "evacuations, `POST /v1/admin/migration-complete`",
        meaning: "The target cell is not live or not open to new hosts.",
    },
    ErrorCode {
        code: "source_cell_unavailable",
        status: "409",
        routes: "evacuations, `POST /v1/admin/migration-complete`",
        meaning: "The source cell's state does not allow the move.",
    },
    ErrorCode {
        code: "migration_not_found",
        status: "409",
        routes: "`POST /v1/admin/migration-complete`",
        meaning: "No open migration with that id.",
    },
    ErrorCode {
        code: "migration_assignment_mismatch",
        status: "409",
        routes: "`POST /v1/admin/migration-complete`",
        meaning: "The host's assignment no longer points at the migration's target and epoch.",
    },
    ErrorCode {
        code: "migration_target_not_registered",
        status: "409",
        routes: "`POST /v1/admin/migration-complete`",
        meaning: "The host has not registered with the target cell yet.",
    },
    ErrorCode {
        code: "migration_source_still_active",
        status: "409",
        routes: "`POST /v1/admin/migration-complete`",
        meaning: "The source cell still holds a lease of the host.",
    },
    ErrorCode {
        code: "migration_target_not_active",
        status: "409",
        routes: "`POST /v1/admin/migration-complete`",
        meaning: "The host's control on the target cell is not active.",
    },
    ErrorCode {
        code: "regional_rehome_generation_mismatch",
        status: "409",
        routes: "`POST /v1/admin/regional-rehome-control`",
        meaning: "The control's generation is not the one given.",
    },
    ErrorCode {
        code: "regional_rehome_source_generation_mismatch",
        status: "409",
        routes: "`POST /v1/admin/host-idle-rehome`",
        meaning: "The host's control on the source cell is not the generation named.",
    },
    ErrorCode {
        code: "invalid_challenge",
        status: "401",
        routes: "`POST /v1/host/session`",
        meaning: "The challenge is unknown, used or expired.",
    },
    ErrorCode {
        code: "invalid_proof",
        status: "401",
        routes: "`POST /v1/host/session`",
        meaning: "The answer does not prove the host's X25519 key.",
    },
    ErrorCode {
        code: "session_expired",
        status: "401",
        routes: "`/v1/devices`, `/v1/send`",
        meaning: "The push session expired; open a new one.",
    },
    ErrorCode {
        code: "too_many_devices",
        status: "409",
        routes: "`POST /v1/devices`",
        meaning: "The host already has the maximum number of registered devices.",
    },
    ErrorCode {
        code: "rate_limited",
        status: "429, `Retry-After`",
        routes: "push routes",
        meaning: "The source or host sent too many requests.",
    },
    ErrorCode {
        code: "busy",
        status: "503, `Retry-After`",
        routes: "push routes",
        meaning: "The push gateway's admission for authenticated requests is full. Retry.",
    },
    ErrorCode {
        code: "validation_only",
        status: "503",
        routes: "push routes",
        meaning: "The push process runs in validation mode and serves no traffic.",
    },
    ErrorCode {
        code: "internal",
        status: "500",
        routes: "push routes",
        meaning: "An unexpected fault; logged on the server.",
    },
];

/// A limit: the constant's name, its value as text, and what it bounds.
pub struct Limit {
    pub name: &'static str,
    pub value: String,
    pub what: &'static str,
}

fn ms(v: u64) -> String {
    let n = group(v);
    if v >= 3_600_000 && v % 3_600_000 == 0 {
        format!("{n} ms ({} h)", v / 3_600_000)
    } else if v >= 60_000 && v % 60_000 == 0 {
        format!("{n} ms ({} min)", v / 60_000)
    } else if v >= 1_000 && v % 1_000 == 0 {
        format!("{n} ms ({} s)", v / 1_000)
    } else {
        format!("{n} ms")
    }
}

fn ms_i(v: i64) -> String {
    ms(u64::try_from(v).unwrap_or(0))
}

fn bytes(v: usize) -> String {
    let n = group(v as u64);
    if v >= 1_048_576 && v % 1_048_576 == 0 {
        format!("{n} B ({} MiB)", v / 1_048_576)
    } else if v >= 1_024 && v % 1_024 == 0 {
        format!("{n} B ({} KiB)", v / 1_024)
    } else {
        format!("{n} B")
    }
}

fn count(v: u64) -> String {
    group(v)
}

/// `1234567` → `1,234,567`.
fn group(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Every limit of [`super::limits`], in the order of the page's sections.
// function-length: allow(a data table, one line per limit; splitting it by section only scatters the page's order)
pub fn limits_table() -> Vec<(&'static str, Vec<Limit>)> {
    use limits::*;
    macro_rules! l {
        ($name:ident, $fmt:expr, $what:expr) => {
            Limit {
                name: stringify!($name),
                value: $fmt($name),
                what: $what,
            }
        };
    }
    let u = |v: usize| count(v as u64);
    let u32c = |v: u32| count(u64::from(v));
    let i = |v: i64| count(u64::try_from(v).unwrap_or(0));
    let s = |v: i64| format!("{} s", group(u64::try_from(v).unwrap_or(0)));
    let su = |v: u64| format!("{} s", group(v));
    let chars = |v: usize| format!("{} characters", group(v as u64));
    let units = |v: u64| format!("{} units", group(v));
    vec![
        (
            "HTTP",
            vec![
                l!(RELAY_BODY_MAX, bytes, "Largest request body of a relay route (director, cell, operator and node routes)."),
                l!(PUSH_BODY_MAX, bytes, "Largest request body of a push route."),
                l!(BODY_READ_MS, ms, "A request body must arrive completely within this time, or the request is answered `400 invalid_request` and the connection closed."),
                l!(HTTP_CONNECTIONS_MAX, u, "Plain HTTP connections served at once per process (WebSocket handshakes included until the upgrade). Above it a new connection is answered `503 server_busy` with `Retry-After: 1` and closed, counted in `orca_relay_http_connections_refused_total{reason=\"answered\"}` (`reason=\"closed\"` when the client left, failed the TLS handshake or sent no request head within `BUSY_ANSWER_MS` first)."),
                l!(BUSY_ANSWERS_MAX, u, "Connections over `HTTP_CONNECTIONS_MAX` being answered at once (TLS handshake included). With every serving slot and every answering permit taken the process stops accepting: new connections wait in the kernel's listen backlog until either frees, then are served or answered. No connection is accepted and closed without an answer."),
                l!(BUSY_ANSWER_MS, ms, "Time allowed for one such answer, TLS handshake included."),
                l!(KEEPALIVE_FREE_MIN, u, "Free slots of `HTTP_CONNECTIONS_MAX` below which the process keeps no connection alive: a response other than a `101` carries `Connection: close` and its connection closes after it. A connection waiting for its next request is never closed for this (its client may be sending one). Counted in `orca_relay_http_keepalive_declined_total`."),
                l!(STICKY_BATCH_MAX, u, "Queued sticky-lane requests one slot grants together in one database transaction; hosts the batch cannot grant at the same epoch (row busy, charge, move, refusal) are then served one by one in the same slot. Counted in `orca_relay_sticky_batch_hosts_total{path=\"batch\"|\"single\"}`."),
                l!(TLS_HANDSHAKES_MAX, u, "TLS handshakes run at once per listener (the accept limiter). A connection past it waits for a slot, holding no TLS state, at most `TLS_HANDSHAKE_WAIT_MS`; then it is closed, counted in `orca_relay_tls_handshake_failures_total{reason=\"busy\"}`."),
                l!(TLS_HANDSHAKE_WAIT_MS, ms, "Longest wait for a TLS handshake slot (part of the 10 s handshake deadline)."),
                l!(METRICS_CONNECTIONS_MAX, u, "Connections served at once by the separate metrics listener (`ORCA_RELAY_METRICS_LISTEN`). Above it a new connection is closed at once and counted in `orca_relay_metrics_listener_refused_total{reason=\"connections\"}`."),
                l!(HEADER_READ_TIMEOUT_S, su, "A request's headers must arrive within this time on the main and the metrics listener, or the connection is closed (counted on the metrics listener as `reason=\"header_timeout\"`)."),
                l!(HOST_TOKEN_MAX_CHARS, chars, "Longest host token accepted."),
                l!(SELF_HOSTED_TOKEN_TTL_S, s, "Lifetime of a host token minted by `POST /v1/host-token`."),
                l!(READINESS_CACHE_MS, ms, "How long `GET /ready` reuses its last database check."),
            ],
        ),
        (
            "WebSocket legs",
            vec![
                l!(FIRST_FRAME_MS, ms, "Deadline for the first frame of a phone or data leg and for `host-hello` on a control leg."),
                l!(PROOF_WINDOW_MS, ms_i, "Window for the host to answer the key challenge (`host-challenge-ack`)."),
                l!(ACTIVATION_QUEUE_WAIT_MS, ms, "Longest wait of a control activation behind others for the same host."),
                l!(CLOSE_FORCE_MS, ms, "After sending a close frame, the socket is dropped if the peer has not answered within this time."),
                l!(CONTROL_MAX_MESSAGE, bytes, "Largest message on a control leg (larger closes 1009)."),
                l!(DATA_MAX_MESSAGE, bytes, "Largest message on a host data leg."),
                l!(PHONE_MAX_MESSAGE, bytes, "Largest message on a phone leg."),
                l!(PER_HOST_CONNECTIONS, u, "Phones per host, active and pending together."),
                l!(HELLO_ACK_LIST_MAX, u, "Longest list in a `host-hello-ack` (per list)."),
                l!(ATTACH_DEADLINE_MS, ms, "Time the host has to open the data leg for an admitted phone."),
                l!(CAPABILITY_TOKENS_MAX, u, "Capability tokens accepted in a capabilities header (each 1 to 64 characters)."),
            ],
        ),
        (
            "Phone credentials",
            vec![
                l!(INVITE_TTL_MS, ms_i, "Lifetime of an invite as issued."),
                l!(INVITE_MAX_ATTEMPTS, i, "Redemption attempts of one invite; the last failure invalidates it."),
                l!(INVITE_RESERVATION_LEASE_MS, ms_i, "How long a redemption in progress holds the invite."),
                l!(INVITE_COOLDOWN_MS, ms_i, "Pause after a failed redemption before the invite can be tried again."),
                l!(INVITE_MINT_PER_MINUTE, i, "Invites a user may create per minute."),
                l!(RESUME_BASIS_DEADLINE_MS, ms_i, "Time for a new resume token's basis (or a direct authorization) to be confirmed."),
                l!(RESUME_TTL_MS, ms_i, "Lifetime of a resume token (30 days)."),
                l!(RESUME_GRACE_MS, ms_i, "How long a replaced resume token still works."),
                l!(EXPIRED_TOKEN_GRACE_MS, ms_i, "Grace after a host token's expiry before the control session is closed."),
                l!(SIGNED_OUT_MEMORY_MS, ms_i, "How long a cell remembers that a host signed out."),
                l!(SIGNED_OUT_MEMORY_MAX, u, "Signed-out hosts remembered per cell."),
            ],
        ),
        (
            "Control session",
            vec![
                l!(CONTROL_TICK_MS, ms, "Ping interval on a control leg."),
                l!(CONTROL_SILENCE_MS, ms_i, "A control leg with nothing received for this long is closed 4408."),
                l!(ORPHAN_GRACE_MS, ms, "How long a session without a control socket keeps its splices for a rebind."),
                l!(CONTROL_LEASE_MS, ms_i, "Length of a control lease (before jitter)."),
                l!(CONTROL_LEASE_JITTER_MS, ms_i, "Random spread added to or taken from a control lease."),
                l!(CONTROL_RENEWAL_INTERVAL_MS, ms_i, "How often a cell renews its control activities."),
                l!(CONTROL_RENEWAL_REQUEST_MS, ms_i, "Expiry a renewal asks for."),
                l!(DEFAULT_ACTIVITY_LEASE_MS, ms_i, "Lease of an activity that names none."),
                l!(CONTROL_ACTIVITY_EXPIRY_MAX_MS, ms_i, "Furthest a control activity's expiry may be set ahead."),
                l!(ACTIVITY_EXPIRY_MAX_MS, ms_i, "Furthest any other activity's expiry may be set ahead."),
                l!(RENEWAL_BATCH_FLUSH_MS, ms, "A renewal batch is written at least this often..."),
                l!(RENEWAL_BATCH_ROWS, u, "...or when it holds this many rows."),
            ],
        ),
        (
            "Admission and capacity",
            vec![
                l!(PREAUTH_CELL_MAX, u, "Phone and data sockets awaiting their first frame, per cell."),
                l!(PREAUTH_SOURCE_MAX, u, "The same, per client source."),
                l!(PREAUTH_ATTEMPTS_PER_WINDOW, u32c, "Pre-auth attempts per source per window."),
                l!(PREAUTH_WINDOW_MS, ms_i, "The window of the attempt count."),
                l!(PREAUTH_SOURCES, u, "Sources tracked at once."),
                l!(CONTROL_RESERVE, units, "Connections kept free for control rebinds (capped cells: the ordinary limit is the hard cap minus this)."),
                l!(DATA_RESERVE_EXTRA, units, "Further connections kept free for data legs on top of the control reserve."),
                l!(CONNECTION_HARD_CAP_MIN, i, "Smallest `connectionHardCap` of a capped cell."),
                l!(CONNECTION_HARD_CAP_MAX, i, "Largest `connectionHardCap`."),
                l!(STORE_SHED_WAIT_MS, ms, "New legs are shed while the oldest database wait is at least this long."),
            ],
        ),
        (
            "Splice",
            vec![
                l!(SPLICE_LOW_WATER, bytes, "A paused reader resumes when the queue falls below this."),
                l!(SPLICE_HIGH_WATER, bytes, "The reader of a direction pauses when its queue passes this."),
                l!(SPLICE_OVERFLOW_DIRECTION_MAX, bytes, "Most bytes queued in one direction before the splice closes 4429 (8 MiB + 256 KiB)."),
                l!(SPLICE_OVERFLOW_PROCESS_MAX, bytes, "Most bytes queued by all splices of the process together."),
                l!(WEDGE_TIMEOUT_MS, ms, "A direction that cannot write for this long closes 4429 `wedged relay link`."),
            ],
        ),
        (
            "Drain, shutdown and heartbeats",
            vec![
                l!(DRAIN_GRACE_MAX_MS, ms, "Largest `graceMs` of a drain."),
                l!(DRAIN_PACE_MAX_MS, ms, "Largest `paceWindowMs` of a drain."),
                l!(SHUTDOWN_EXIT_MS, ms, "After SIGTERM the process exits within this time."),
                l!(HEARTBEAT_INTERVAL_MS, ms, "A cell heartbeats its director this often; after a failed beat it tries again after 1 s, doubling up to this interval."),
                l!(HEARTBEAT_TIMEOUT_MS, ms, "Timeout of one heartbeat call."),
                l!(HEARTBEAT_TTL_MS, ms_i, "A cell without a heartbeat for this long is no longer live."),
                l!(DIRECTOR_SAFETY_MAX_AGE_MS, ms_i, "Oldest safety report the director plans with."),
            ],
        ),
    ]
}

fn esc(s: &str) -> String {
    s.replace('|', "\\|")
}

const GENERATED: &str =
    "<!-- Generated from the code by `src/contract/reference.rs`; do not edit. \
Refresh with `ORCA_RELAY_BLESS=1 cargo test --test docs_reference`. -->\n\n";

/// `docs/reference/close-codes.md`.
pub fn close_codes_page() -> String {
    let mut out = String::from("# WebSocket close codes\n\n");
    out.push_str(GENERATED);
    out.push_str(
        "Every WebSocket leg of the relay ends with one of these close codes and, in most cases, \
         one of the reason texts below. Codes and reason texts are exact and stable: clients \
         match on them. What each leg is and when it closes is described in \
         [the WebSocket reference](websocket.md).\n\n",
    );
    out.push_str(
        "## Codes\n\n| code | name | meaning | what the client does |\n|---|---|---|---|\n",
    );
    for c in CLOSE_CODES {
        out.push_str(&format!(
            "| {} | `{}` | {} | {} |\n",
            c.code,
            c.name,
            esc(c.meaning),
            esc(c.client)
        ));
    }
    out.push_str("\n## Reasons\n\n");
    for c in CLOSE_CODES {
        let reasons: Vec<&CloseReason> =
            CLOSE_REASONS.iter().filter(|r| r.code == c.code).collect();
        if reasons.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "### {} `{}`\n\n| reason | leg | when |\n|---|---|---|\n",
            c.code, c.name
        ));
        for r in reasons {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                r.text,
                r.legs,
                esc(r.when)
            ));
        }
        out.push('\n');
    }
    out.push_str(
        "## Closes without a reason text\n\n\
         - 4404 when an admitted phone's host does not open the data leg within the attach \
         deadline.\n\
         - 4429 when a host already has the most phones allowed, or a phone's activity or \
         credential basis could not be stored.\n\
         - 4409 for a phone whose credential names no assignment on this cell, or whose host's \
         session changed during admission.\n\
         - 4503 for a phone or data leg whose host was told to drain, or that was pending when \
         the drain closed it.\n\
         - 1009 from the WebSocket layer for a message over the leg's maximum.\n\n\
         Before a WebSocket exists (the upgrade itself), refusals are plain HTTP answers; see \
         [the WebSocket reference](websocket.md#upgrade-refusals).\n",
    );
    out
}

fn error_table(out: &mut String, rows: &[ErrorCode]) {
    out.push_str("| `error` | status | routes | meaning |\n|---|---|---|---|\n");
    for e in rows {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            e.code,
            esc(e.status),
            esc(e.routes),
            esc(e.meaning)
        ));
    }
}

/// `docs/reference/errors.md`.
pub fn errors_page() -> String {
    let mut out = String::from("# HTTP error codes\n\n");
    out.push_str(GENERATED);
    out.push_str(
        "Every refusal of an HTTP route is a JSON body `{\"error\":\"<code>\"}` with the status \
         shown. A retryable `503` carries `Retry-After` (seconds) unless the table says it does \
         not; those are placement refusals that clients retry with their own backoff. Which \
         route answers which code is listed per route in [the HTTP reference](http.md).\n\n",
    );
    out.push_str("## Codes any route may answer\n\n");
    error_table(&mut out, SHARED_ERRORS);
    out.push_str("\n## Codes of particular routes\n\n");
    error_table(&mut out, ROUTE_ERRORS);
    out.push_str(
        "\n## Push send outcomes\n\n\
         `POST /v1/push/send` answers `200` with one outcome per recipient (`queued`, `dead`, \
         `rate_limited`, …) rather than an error; see [the HTTP reference](http.md#push-gateway).\n",
    );
    out
}

/// `docs/reference/limits.md`.
pub fn limits_page() -> String {
    let mut out = String::from("# Limits\n\n");
    out.push_str(GENERATED);
    out.push_str(
        "The fixed budgets of the relay. These are compiled in; the settings that can be \
         changed (connection ceilings, pool size, drain grace on shutdown, …) are on \
         [the configuration page](../configuration.md). The name column is the constant's name \
         in the code, handy when reading logs or asking about a limit.\n",
    );
    for (section, rows) in limits_table() {
        out.push_str(&format!(
            "\n## {section}\n\n| name | value | what |\n|---|---|---|\n"
        ));
        for l in rows {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                l.name,
                l.value,
                esc(l.what)
            ));
        }
    }
    out.push_str(
        "\n## Derived limits\n\n\
         - A capped cell with hard cap H: ordinary connections up to H − 100, control rebinds \
         up to H; the unobserved bound is 0 to H − 101.\n\
         - An uncapped cell with ceiling M (`ORCA_RELAY_CELL_MAX_CONNECTIONS`): controls up to \
         M, phone legs up to M − 250, data legs up to M − 100.\n\
         - Open files: size the limit above the cell's connection ceiling plus \
         `HTTP_CONNECTIONS_MAX` plus the database pool plus a few dozen for listeners and files.\n\
         - Pre-auth costs at most `PREAUTH_CELL_MAX` sockets and 8 KiB of buffered input each.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_and_units() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(ms(2_000), "2,000 ms (2 s)");
        assert_eq!(ms(60_000), "60,000 ms (1 min)");
        assert_eq!(ms(21_600_000), "21,600,000 ms (6 h)");
        assert_eq!(ms(1_500), "1,500 ms");
        assert_eq!(bytes(4_096), "4,096 B (4 KiB)");
        assert_eq!(bytes(8_388_608), "8,388,608 B (8 MiB)");
        assert_eq!(bytes(100), "100 B");
    }

    #[test]
    fn every_close_code_has_reasons_or_a_note() {
        for r in CLOSE_REASONS {
            assert!(
                CLOSE_CODES.iter().any(|c| c.code == r.code),
                "{} has an unknown code",
                r.text
            );
        }
    }
}
