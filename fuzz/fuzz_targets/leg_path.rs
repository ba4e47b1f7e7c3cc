//! Leg paths (docs/reference/websocket.md gate 2): which leg a request path names and the percent-decoded id.
//!
//! Properties: never panics; decoding is exact (a `%` needs two hex digits, the result must be
//! UTF-8, an input without `%` decodes to itself, and encoding a decoded id decodes back to it);
//! a data id is 1..128 chars, a phone id a relay host id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::crypto::ident::is_relay_host_id;
use orca_relay::leg::path::{self, Named, CONN_ID_MAX_CHARS};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = std::str::from_utf8(data) else {
        return;
    };
    let decoded = path::percent_decode(p);
    if !p.contains('%') {
        assert_eq!(decoded.as_deref(), Some(p));
    }
    if let Some(d) = &decoded {
        let again = utf8_percent_encode(d, NON_ALPHANUMERIC).to_string();
        assert_eq!(path::percent_decode(&again).as_deref(), Some(d.as_str()));
    }
    for prefix in ["", "/v1/host/data/", "/v1/connect/"] {
        match path::named(&format!("{prefix}{p}")) {
            Named::Data(Some(id)) => {
                assert!((1..=CONN_ID_MAX_CHARS).contains(&id.chars().count()));
            }
            Named::Phone(Some(id)) => assert!(is_relay_host_id(&id)),
            Named::Control | Named::Data(None) | Named::Phone(None) | Named::Other => {}
        }
    }
});
