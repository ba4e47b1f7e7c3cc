//! `ORCA_RELAY_CELLS` (docs/configuration.md): the JSON array of cells a director starts
//! with, checked against the configured regions.
//!
//! Properties: never panics; every error names the variable; every accepted cell passes the
//! documented id, origin, region, capacity and cap/bound rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::config::parse_cells;
use orca_relay::contract::validate::{check_origin, is_cell_id};
use orca_relay_fuzz::regions;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let regions = regions();
    match parse_cells(text, &regions) {
        Ok(cells) => {
            for c in cells {
                assert!(is_cell_id(&c.id) && c.id != "director");
                assert!(check_origin(&c.url).is_ok());
                assert!(regions.contains(&c.region));
                assert!((1..=1_000_000).contains(&c.capacity_requests));
                assert_eq!(
                    c.connection_hard_cap.is_some(),
                    c.connection_unobserved_bound.is_some()
                );
            }
        }
        Err(e) => assert!(e.0.starts_with("ORCA_RELAY_CELLS"), "{}", e.0),
    }
});
