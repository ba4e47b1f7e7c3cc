//! The JSON bodies of the relay routes a desktop calls (docs/reference/http.md): `POST /v1/host-token`,
//! `POST /v1/assign` (with its `regionCorrection` namespace), `POST /v1/resolve`, each through the
//! strict decoder and the route's own checks that run before any store call.
//!
//! Properties: never panics; every refusal is `400 invalid_request`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::crypto;
use orca_relay::director::{host_token, routes};
use orca_relay_fuzz::{assert_invalid_request, regions};

fuzz_target!(|data: &[u8]| {
    let regions = regions();
    for path in ["/v1/assign", "/v1/resolve"] {
        match routes::decode_body_for_fuzzing(path, data, &regions) {
            Some(Ok(())) => {}
            Some(Err(r)) => assert_invalid_request(&r),
            None => panic!("{path} is a relay route"),
        }
    }
    match host_token::decode_request(data) {
        Ok((relay_host_id, user_id)) => {
            assert!(crypto::ident::is_relay_host_id(&relay_host_id));
            assert!((1..=128).contains(&user_id.chars().count()));
        }
        Err(r) => assert_invalid_request(&r),
    }
});
