//! Push registrations as the store keeps them (docs/reference/http.md).

/// A validated registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub device_id: String,
    pub platform: String,
    pub token: String,
    pub apns_environment: Option<String>,
}
