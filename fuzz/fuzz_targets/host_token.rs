//! Host tokens (docs/reference/http.md) as the cell and the director verify them: the raw compact JWS
//! (selector byte even) and, so the claim checks behind the signature are reached, header and
//! claims texts of the fuzzer's choosing signed with the self-hosted key (selector odd; the two
//! texts are separated by the first newline). Also the `Authorization` header rule.
//!
//! Properties: never panics; every refusal is a `TokenError` (all answer 401 `invalid_token`);
//! an accepted token carries in-range claims and the host purpose.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::crypto::ident::is_relay_host_id;
use orca_relay::crypto::jwt::{self, HostTokenVerifier};
use orca_relay_fuzz::{block_on, selector, sign_hs256, two_parts, NOW_MS, SIGNING_KEY};

fuzz_target!(|data: &[u8]| {
    let key = jwt::self_hosted_key(SIGNING_KEY);
    let verifier = HostTokenVerifier::new(key, None);
    let (sel, rest) = selector(data);
    let token = if sel % 2 == 0 {
        let Ok(t) = std::str::from_utf8(rest) else {
            return;
        };
        if let Some(b) = jwt::verify_bearer_header(t) {
            assert!(!b.is_empty() && b.chars().count() <= jwt::MAX_TOKEN_CHARS);
        }
        t.to_string()
    } else {
        let (header, claims) = two_parts(rest);
        sign_hs256(&key, header, claims)
    };
    if let Ok(c) = block_on(verifier.verify(&token, NOW_MS)) {
        assert!(is_relay_host_id(&c.relay_host_id));
        assert!((1..=128).contains(&c.sub.chars().count()));
        assert!((1..=2048).contains(&c.prof.chars().count()));
        assert!(c
            .org
            .as_ref()
            .is_none_or(|o| (1..=128).contains(&o.chars().count())));
        assert!(c.exp * 1000 > NOW_MS);
    }
});
