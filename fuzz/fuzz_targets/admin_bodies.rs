//! The JSON bodies of the admin routes (ARCHITECTURE.md, docs/reference/http.md) and the node routes
//! cells call on the director (docs/reference/http.md): every admin route's schema, the cell's
//! `POST /v1/admin/drain`, `POST /v1/admin/runtime-status`, `regional-rehome-control`,
//! `cell-heartbeat` and `cell-rehome-status` with their validators.
//!
//! Properties: never panics; every refusal is `400 invalid_request`; a heartbeat the validator
//! accepts is one the strict decoder accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::contract::wire::{CellHeartbeat, CellRehomeStatus};
use orca_relay::director::{admin, heartbeat};
use orca_relay::http as h;
use orca_relay_fuzz::{assert_invalid_request, regions};

const ADMIN: [&str; 8] = [
    "/v1/admin/cells",
    "/v1/admin/cell-state",
    "/v1/admin/cell-fence",
    "/v1/admin/cell-status",
    "/v1/admin/host-whereabouts",
    "/v1/admin/evacuate",
    "/v1/admin/evacuate-cell",
    "/v1/admin/migration-complete",
];

fn refused<T>(r: Result<T, h::Response>) -> Option<T> {
    match r {
        Ok(t) => Some(t),
        Err(r) => {
            assert_invalid_request(&r);
            None
        }
    }
}

fuzz_target!(|data: &[u8]| {
    for path in ADMIN {
        let r = admin::decode_body_for_fuzzing(path, data).expect("an admin route");
        refused(r);
    }
    if let Some((grace, pace)) = refused(orca_relay::cell::drain::decode(data)) {
        assert!(grace <= orca_relay::contract::limits::DRAIN_GRACE_MAX_MS);
        assert!(pace <= orca_relay::contract::limits::DRAIN_PACE_MAX_MS);
    }
    refused(orca_relay::server::decode_version_only(data));
    // `regional-rehome-control` parses plain JSON and validates by hand (director/region.rs).
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = orca_relay::rehome::rules::parse_control_request(&v);
    }
    // Node routes: strict schema, then the validator.
    let regions = regions();
    if let Some(hb) = refused(h::parse::<CellHeartbeat>(data)) {
        let _ = heartbeat::validate(&hb, &regions);
    }
    if let Some(st) = refused(h::parse::<CellRehomeStatus>(data)) {
        let _ = heartbeat::validate_rehome_status(&st);
    }
});
