//! The client source of docs/reference/websocket.md / docs/reference/http.md: the `hops`-th `X-Forwarded-For` entry from the
//! right (first byte: hops 0..7; the rest: header values, one per line), then the push gateway's
//! rate-limit key of that source.
//!
//! Properties: never panics; the source is the peer address or one trimmed, non-empty,
//! comma-free entry of the headers; the key is an IP, an IPv6 /64 or `unknown`.
#![no_main]

use std::net::SocketAddr;

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use orca_relay::http::client_source;
use orca_relay::push::ratelimit::ip_key;
use orca_relay_fuzz::selector;

fuzz_target!(|data: &[u8]| {
    let (sel, rest) = selector(data);
    let hops = usize::from(sel % 8);
    let mut headers = HeaderMap::new();
    for line in rest.split(|&b| b == b'\n') {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append("x-forwarded-for", v);
        }
    }
    let peer: SocketAddr = "192.0.2.7:4433".parse().unwrap();
    let source = client_source(peer, &headers, hops);
    if source != "192.0.2.7" {
        assert!(hops > 0);
        assert!(!source.is_empty() && !source.contains(',') && source.trim() == source);
        assert!(headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|e| e.trim() == source)));
    }
    let key = ip_key(&source);
    assert!(
        key == "unknown" || key.parse::<std::net::Ipv4Addr>().is_ok() || key.ends_with("::/64"),
        "{key}"
    );
});
