//! The JWKS document the host-token verifier fetches from the configured issuer (docs/reference/http.md,
//! ES256 host tokens): arbitrary bytes as the response body.
//!
//! Properties: never panics; a body that is not a JSON object with a `keys` array is refused; an
//! accepted one yields at most one key per entry of that array.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::crypto::jwt;

fuzz_target!(|data: &[u8]| {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(data).ok();
    let entries = parsed
        .as_ref()
        .and_then(|v| v.get("keys"))
        .and_then(|k| k.as_array())
        .map(|a| a.len());
    match (jwt::parse_jwks_for_fuzzing(data), entries) {
        (Ok(n), Some(len)) => assert!(n <= len, "{n} keys from {len} entries"),
        (Ok(n), None) => panic!("accepted {n} keys from a document without a keys array"),
        (Err(_), _) => {}
    }
});
