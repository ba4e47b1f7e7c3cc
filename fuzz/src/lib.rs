//! Helpers shared by the fuzz targets in `fuzz_targets/`: fixed keys and times, a synchronous
//! driver for the relay's async verifiers, and the check that a refused body got the documented
//! answer. See docs/development.md, Fuzzing for how to build and run the targets.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use orca_relay::http::Response;

/// "Now" of every target (2023-11-14T22:13:20.123Z), so token and challenge times can be hit.
pub const NOW_MS: i64 = 1_700_000_000_123;

/// The key of every HS256 token a target signs (host tokens, cluster tokens, leases).
pub const SIGNING_KEY: &str = "0123456789abcdef0123456789abcdef";

/// The regions configured for body checks that look at a region.
pub fn regions() -> Vec<String> {
    ["us-central1", "asia-east2", "eu-west1"]
        .map(String::from)
        .to_vec()
}

/// Runs a future that must finish without waiting (the HS256 verifier never does I/O). A future that
/// would wait is a bug in the target, not in the relay: it panics.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the fuzzed path waited on I/O"),
    }
}

/// A refused request body must be the spec's `400 {"error":"invalid_request"}`.
pub fn assert_invalid_request(r: &Response) {
    assert_eq!(r.status().as_u16(), 400, "a refused body must answer 400");
    assert_eq!(
        r.headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
}

/// Splits a fuzz input into a selector byte and the rest (empty input: selector 0).
pub fn selector(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((s, rest)) => (*s, rest),
        None => (0, data),
    }
}

/// Splits at the first `\n` (the whole input and nothing when there is none).
pub fn two_parts(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// A compact HS256 JWS over the given header and claims bytes (any bytes: the relay must refuse
/// what is not JSON), signed with `key`, so the fuzzer reaches the claim checks behind the
/// signature.
pub fn sign_hs256(key: &[u8], header: &[u8], claims: &[u8]) -> String {
    use orca_relay::crypto::b64::url_encode;
    let input = format!("{}.{}", url_encode(header), url_encode(claims));
    let mac = orca_relay::crypto::hmac_sha256(key, input.as_bytes());
    format!("{input}.{}", url_encode(&mac))
}
