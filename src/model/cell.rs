//! Cells as the placement rules read them: row, runtime, fence, outstanding reservations
//! (ARCHITECTURE.md / docs/operations.md), and the heartbeat that updates the runtime.

/// Admission state of a cell (ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    General,
    MigrationOnly,
    ExistingOnly,
}

impl Admission {
    pub fn parse(s: &str) -> Option<Admission> {
        match s {
            "general" => Some(Admission::General),
            "migration-only" => Some(Admission::MigrationOnly),
            "existing-only" => Some(Admission::ExistingOnly),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Admission::General => "general",
            Admission::MigrationOnly => "migration-only",
            Admission::ExistingOnly => "existing-only",
        }
    }
    /// `general` and `migration-only` are *enabled* (evacuation targets).
    pub fn enabled(self) -> bool {
        self != Admission::ExistingOnly
    }
}

/// Connection telemetry of the latest heartbeat, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Telemetry {
    pub total_connections: i64,
    pub in_flight_connections: i64,
    pub reserved_connection_units: i64,
    pub enforced_connection_units: i64,
    pub inclusion_watermark: i64,
    pub observed_at: i64,
}

/// `relay_cell_runtime`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    pub cell_incarnation: String,
    pub started_at: i64,
    pub ready: bool,
    pub observed_requests: i64,
    pub last_heartbeat_at: i64,
    pub telemetry: Option<Telemetry>,
    pub regional_rehome_protocol: i64,
    pub safety_json: Option<String>,
    pub safety_received_at: Option<i64>,
}

/// `relay_cell_fences`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub cell_incarnation: String,
    pub attested_at: i64,
    pub expires_at: i64,
}

/// A cell with everything the placement rules read: its row, runtime, fence and outstanding
/// reservations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellView {
    pub cell_id: String,
    pub cell_url: String,
    pub region: String,
    pub capacity_requests: i64,
    pub reserved_requests: i64,
    pub admission: Admission,
    pub roll_isolated_at: Option<i64>,
    pub connection_hard_cap: Option<i64>,
    pub connection_unobserved_bound: Option<i64>,
    pub runtime: Option<Runtime>,
    pub fence: Option<Fence>,
    /// Reservations in state `reserved` or `claimed`.
    pub outstanding: i64,
}

/// The connection group of a heartbeat (all seven fields or none, docs/reference/http.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeatTelemetry {
    pub total_connections: i64,
    pub in_flight_connections: i64,
    pub reserved_connection_units: i64,
    pub enforced_connection_units: i64,
    pub connection_hard_cap: i64,
    pub connection_unobserved_bound: i64,
    pub connection_inclusion_watermark: i64,
}

/// A heartbeat that passed the schema checks, incarnation lowercased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    pub cell_id: String,
    pub cell_url: String,
    pub region: String,
    pub cell_incarnation: String,
    pub started_at: i64,
    pub ready: bool,
    pub observed_requests: i64,
    pub telemetry: Option<BeatTelemetry>,
}
