//! The JSON bodies of the push gateway (docs/reference/http.md): `POST /v1/host/challenge`,
//! `POST /v1/host/session`, `POST /v1/devices`, `POST /v1/send`, through the strict decoder and the
//! route's own checks, in the handlers' order.
//!
//! Properties: never panics; every refusal is `400 invalid_request`; an accepted notification
//! survives the store round trip (`canonical_json` → `from_payload`) unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::crypto;
use orca_relay::http as h;
use orca_relay::push::model::{
    self, ChallengeRequest, DeviceRequest, Notification, SendRequest, SessionRequest,
};
use orca_relay_fuzz::assert_invalid_request;

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
    if let Some(c) = refused(h::parse::<ChallengeRequest>(data)) {
        if c.v == 1 {
            let _ = crypto::decode_key32(&c.host_public_key_b64);
        }
    }
    if let Some(s) = refused(h::parse::<SessionRequest>(data)) {
        if s.valid() {
            // The session route compares the proof with the stored hash of the challenge.
            let _ = crypto::push_proof::proof_matches_secret_hash(
                &s.proof_b64,
                "0".repeat(64).as_str(),
            );
        }
    }
    if let Some(d) = refused(h::parse::<DeviceRequest>(data)) {
        if let Some(dev) = d.validate() {
            assert!(dev.platform == "ios" || dev.platform == "android");
            assert_eq!(dev.platform == "ios", dev.apns_environment.is_some());
        }
    }
    if let Some(s) = refused(h::parse::<SendRequest>(data)) {
        if s.v != 1 {
            return;
        }
        let Some(ids) = model::unique_ids(&s.registration_ids) else {
            return;
        };
        assert!(ids.len() <= s.registration_ids.len());
        if let Some(n) = s.notification.validate() {
            let json = n.canonical_json();
            assert_eq!(Notification::from_payload(&json).as_ref(), Some(&n));
            let _ = (n.event_id("qqj_9wO1CyKX9Pbh"), n.content_fingerprint());
            let _ = (
                n.collapse_id("qqj_9wO1CyKX9Pbh"),
                n.orca_object("qqj_9wO1CyKX9Pbh"),
            );
        }
    }
});
