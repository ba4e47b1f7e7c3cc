//! Wire bodies exchanged between nodes (cell ↔ director), shared by both ends.

use serde::{Deserialize, Serialize};

/// `POST /v1/admin/cell-heartbeat` body (docs/reference/http.md). The seven telemetry
/// fields are all present (capped cell) or all absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CellHeartbeat {
    pub v: u8,
    pub cell_id: String,
    pub cell_url: String,
    pub region: String,
    pub cell_incarnation: String,
    pub started_at: i64,
    pub ready: bool,
    pub observed_requests: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_connections: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight_connections: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_connection_units: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforced_connection_units: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_hard_cap: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_unobserved_bound: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_inclusion_watermark: Option<i64>,
}

/// The safety object of `cell-rehome-status` and idle rehome (docs/reference/http.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Safety {
    pub observed_at: i64,
    pub sql_failures: i64,
    pub reconnects: i64,
    pub control_activity_recovery_failures: i64,
    pub database_pool_waiting: i64,
    pub database_pool_waiters_max: i64,
    pub database_pool_wait_ms_max: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_pool_total: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_pool_idle: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_pool_oldest_wait_ms: Option<i64>,
}

/// `POST /v1/admin/cell-rehome-status` body (docs/reference/http.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CellRehomeStatus {
    pub v: u8,
    pub cell_id: String,
    pub cell_incarnation: String,
    pub regional_rehome_protocol: i64,
    pub safety: Safety,
}
