//! WebSocket close codes (docs/reference/close-codes.md).

/// Bad phone/data/host credential or malformed handshake.
pub const BAD_OUTER_CREDENTIAL: u16 = 4401;
/// The host is not online on this cell.
pub const HOST_OFFLINE: u16 = 4404;
/// The peer left, or the session was replaced.
pub const PEER_DROPPED: u16 = 4408;
/// This cell is not (or no longer) the host's assigned cell.
pub const WRONG_CELL: u16 = 4409;
/// A limit was exceeded or the relay is temporarily unable to serve.
pub const LIMIT_EXCEEDED: u16 = 4429;
/// The cell is draining; re-resolve through the director.
pub const DRAINING: u16 = 4503;
/// Message over the leg maximum (set by the WebSocket layer).
pub const MESSAGE_TOO_BIG: u16 = 1009;
/// A framing violation of RFC 6455 before the leg is admitted (bad opcode, unmasked frame, …).
pub const PROTOCOL_ERROR: u16 = 1002;
/// A text frame that is not valid UTF-8, before the leg is admitted.
pub const INVALID_PAYLOAD: u16 = 1007;

/// Close reasons, exact text.
pub mod reason {
    pub const FIRST_FRAME_TIMEOUT: &str = "first frame timeout";
    pub const FIRST_FRAME_MUST_BE_TEXT: &str = "first frame must be text";
    pub const INVALID_RELAY_AUTH: &str = "invalid relay auth";
    pub const INVALID_HOST_DATA_AUTH: &str = "invalid host data auth";
    pub const INVALID_HOST_DATA_TICKET: &str = "invalid host data ticket";
    pub const HOST_HELLO_TIMEOUT: &str = "host hello timeout";
    pub const HOST_HELLO_MUST_BE_TEXT: &str = "host hello must be text";
    pub const INVALID_HOST_HELLO: &str = "invalid host hello";
    pub const INVALID_HOST_PUBLIC_KEY: &str = "invalid host public key";
    pub const HOST_KEY_BINDING_MISMATCH: &str = "host key binding mismatch";
    pub const HOST_PROOF_TIMEOUT: &str = "host proof timeout";
    pub const INVALID_HOST_PROOF: &str = "invalid host proof";
    pub const INVALID_CONTROL_JSON: &str = "invalid control JSON";
    pub const REFRESH_IDENTITY_CHANGED: &str = "refresh identity changed";
    pub const RELAY_AUTHORIZATION_EXPIRED: &str = "relay authorization expired";
    pub const INVALID_INVITE: &str = "invalid invite";
    pub const RELAY_CONNECTION_REJECTED: &str = "relay connection rejected";
    pub const SIGNED_OUT: &str = "signed-out";
    pub const PEER_CONNECTION_DROPPED: &str = "peer connection dropped";
    pub const CONTROL_SILENCE_TIMEOUT: &str = "control silence timeout";
    pub const REPLACED_BY_NEWER_GENERATION: &str = "replaced by a newer generation";
    pub const CONTROL_REBOUND: &str = "control rebound";
    pub const CONTROL_ACTIVATION_SUPERSEDED: &str = "control activation superseded";
    pub const WRONG_ASSIGNMENT_EPOCH: &str = "wrong assignment epoch";
    pub const ASSIGNMENT_CHANGED_DURING_HOST_PROOF: &str = "assignment changed during host proof";
    pub const IDLE_CUTOVER_IN_PROGRESS: &str = "idle cutover in progress";
    pub const BASIS_PERSISTENCE_FAILED: &str = "basis persistence failed";
    pub const CONTROL_ACTIVATION_QUEUE_STALLED: &str = "control activation queue stalled";
    pub const RELAY_QUEUE_LIMIT_EXCEEDED: &str = "relay queue limit exceeded";
    pub const WEDGED_RELAY_LINK: &str = "wedged relay link";
    pub const RELAY_TEMPORARILY_UNAVAILABLE: &str = "relay temporarily unavailable";
    pub const RELAY_DRAINING: &str = "relay draining";
    pub const RESOLVE_CONFIGURED_DIRECTOR: &str = "resolve configured director";
    pub const CONTROL_LEASE_EXPIRED: &str = "control lease expired";
    pub const CONTROL_ASSIGNMENT_MISSING: &str = "control assignment missing";
    pub const CONTROL_MIGRATION_COMPLETED: &str = "control migration completed";
    pub const CONTROL_ACTIVITY_MOVED: &str = "control activity moved";
    pub const RESOLVE_DIRECTOR: &str = "resolve-director";
    pub const HOST_RETIRED_DURING_ATTACHMENT: &str = "host retired during attachment";
    pub const CONNECT_TO_ASSIGNED_CELL: &str = "connect to assigned cell";
}
