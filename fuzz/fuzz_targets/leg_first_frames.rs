//! The first frames of the three legs (docs/reference/websocket.md): `host-hello` and
//! `host-challenge-ack` on the host control leg, `relay-auth` on the phone leg (also read by the
//! director's invite redirect), `host-data-auth` on the host data leg. Text frames only: a frame
//! that is not UTF-8 is refused by the WebSocket layer before any of these run.
//!
//! Properties: never panics; a frame is accepted only when it is a strict object of exactly that
//! type whose fields pass the documented checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::cell::frames::{self, ChallengeAck, HostDataAuth, HostHello, RelayAuth, Split};
use orca_relay::crypto::{self, ChallengeRandomness, HostBinding};

fn issued() -> crypto::host_proof::IssuedChallenge {
    let host_public = crypto::nacl::public_key(&[7; 32]);
    let binding = HostBinding {
        relay_origin: "https://cell-1.example.test".into(),
        user_id: "user-1".into(),
        profile_id: "https://relay.example.test".into(),
        organization_id: String::new(),
        relay_host_id: crypto::relay_host_id(&host_public),
        host_public,
        assignment_epoch: 1,
        previous_generation: None,
        resume_requested: false,
    };
    let random = ChallengeRandomness {
        ephemeral_secret: [1; 32],
        nonce: [2; 24],
        challenge_secret: [3; 32],
        challenge_id: "00000000-0000-4000-8000-000000000000".into(),
    };
    crypto::host_proof::issue_host_challenge_with(&binding, orca_relay_fuzz::NOW_MS, &random)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (ty, m) = match frames::split(text) {
        Split::Typed(t, m) => (t, m),
        Split::NotJson | Split::NoType => {
            assert!(orca_relay::leg::frame::relay_auth(text).is_none());
            return;
        }
    };
    // Control leg, first frame.
    if let Some(h) = frames::body::<HostHello>(m.clone()) {
        assert_eq!(h.v, 1);
        assert!(h.assignment_epoch <= frames::MAX_SAFE);
        assert!(h.previous_generation.is_none_or(|g| g <= frames::MAX_SAFE));
        assert!(frames::chars_in(&h.app_version, 1, 128));
        // The cell decodes the key next; the shape check does not promise a canonical key.
        let _ = crypto::decode_key32(&h.host_public_key_b64);
    }
    // Control leg, second frame.
    if let Some(a) = frames::body::<ChallengeAck>(m.clone()) {
        let c = issued();
        let ok = c.verify_ack(&a.challenge_id, &a.proof_b64, orca_relay_fuzz::NOW_MS);
        assert_eq!(
            ok,
            a.challenge_id == c.frame.challenge_id
                && crypto::decode_key32(&a.proof_b64).as_ref() == Some(c.expected_proof())
        );
    }
    // Data leg.
    if let Some(d) = frames::body::<HostDataAuth>(m.clone()) {
        assert_eq!(d.v, 1);
        assert!(crypto::decode_b64u32(&d.conn_ticket).is_some());
        assert!(d.generation <= frames::MAX_SAFE);
    }
    // Phone leg (and the director's invite redirect), through its own entry point.
    let phone = orca_relay::leg::frame::relay_auth(text);
    assert_eq!(
        phone.is_some(),
        ty == "relay-auth" && frames::body::<RelayAuth>(m).is_some()
    );
    if let Some(a) = phone {
        assert_eq!((a.v, a.mode.as_str()), (1, "connect"));
        assert!(crypto::decode_b64u32(&a.credential).is_some());
    }
});
