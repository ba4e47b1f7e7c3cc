//! Cluster tokens (node-to-node bearer, docs/reference/http.md) and assignment leases (ARCHITECTURE.md)
//! as the receiving node verifies them: raw compact JWS (selector bit 0 clear) or header and
//! claims of the fuzzer's choosing signed with the right key (bit 0 set; split at the first
//! newline), each through `verify_cluster_token` and `verify_assignment_lease`.
//!
//! Properties: never panics; refusals are `TokenError`s; an accepted cluster token's `sub` is
//! 1..128 chars and it expires within 60 s; an accepted lease has the lease audience and purpose.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::crypto::jwt;
use orca_relay_fuzz::{selector, sign_hs256, two_parts, NOW_MS, SIGNING_KEY};

fuzz_target!(|data: &[u8]| {
    let cluster_key = SIGNING_KEY.as_bytes();
    let (sel, rest) = selector(data);
    let token = if sel & 1 == 0 {
        let Ok(t) = std::str::from_utf8(rest) else {
            return;
        };
        t.to_string()
    } else {
        let (header, claims) = two_parts(rest);
        sign_hs256(cluster_key, header, claims)
    };
    if let Ok(sub) = jwt::verify_cluster_token(cluster_key, &token, NOW_MS) {
        assert!((1..=128).contains(&sub.chars().count()));
    }
    if let Ok(l) = jwt::verify_assignment_lease(SIGNING_KEY, &token, NOW_MS) {
        assert_eq!(l.aud, jwt::LEASE_AUDIENCE);
        assert_eq!(l.purpose, jwt::LEASE_PURPOSE);
        assert!(l.exp.checked_mul(1000).is_none_or(|e| e > NOW_MS));
    }
});
