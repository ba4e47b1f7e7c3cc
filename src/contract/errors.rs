//! HTTP error codes (`{"error":"<code>"}`) shared by several routes (docs/reference/http.md).

pub const INVALID_REQUEST: &str = "invalid_request";
pub const INVALID_TOKEN: &str = "invalid_token";
pub const REQUEST_TOO_LARGE: &str = "request_too_large";
pub const NOT_FOUND: &str = "not_found";
pub const DIRECTOR_ONLY: &str = "director_only";
pub const CELL_ONLY: &str = "cell_only";
pub const PUSH_ONLY: &str = "push_only";
pub const SHUTTING_DOWN: &str = "shutting_down";
pub const SERVER_BUSY: &str = "server_busy";
pub const DEPENDENCY_UNAVAILABLE: &str = "dependency_unavailable";
pub const DATABASE_TEMPORARILY_UNAVAILABLE: &str = "database_temporarily_unavailable";
