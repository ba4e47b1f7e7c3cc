//! The relay host proof (docs/reference/websocket.md) from the host's side, which parses what the network
//! sends it: a `host-challenge` frame as JSON (selector 0), a box the host key opens around a
//! plaintext of the fuzzer's choosing (selector 1), or around the framed plaintext of a transcript
//! of the fuzzer's choosing (selector 2). Also the transcript parser on raw bytes.
//!
//! Properties: never panics; a parsed transcript re-encodes to exactly its input; a refusal is an
//! error string; a proof is only returned for the challenge the binding expects.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::crypto::{self, challenge, host_proof, nacl, HostBinding, HostChallengeFrame};
use orca_relay_fuzz::{selector, NOW_MS};

const HOST_SECRET: [u8; 32] = [7; 32];
const EPHEMERAL_SECRET: [u8; 32] = [1; 32];
const NONCE: [u8; 24] = [2; 24];

fn binding() -> HostBinding {
    let host_public = nacl::public_key(&HOST_SECRET);
    HostBinding {
        relay_origin: "https://cell-1.example.test".into(),
        user_id: "user-1".into(),
        profile_id: "https://relay.example.test".into(),
        organization_id: String::new(),
        relay_host_id: crypto::relay_host_id(&host_public),
        host_public,
        assignment_epoch: 1,
        previous_generation: None,
        resume_requested: false,
    }
}

fn sealed_frame(plaintext: &[u8]) -> HostChallengeFrame {
    let b = binding();
    HostChallengeFrame {
        challenge_id: "00000000-0000-4000-8000-000000000000".into(),
        relay_ephemeral_public_key_b64: crypto::std_encode(&nacl::public_key(&EPHEMERAL_SECRET)),
        nonce_b64: crypto::std_encode(&NONCE),
        ciphertext_b64: crypto::std_encode(&nacl::seal(
            plaintext,
            &NONCE,
            &b.host_public,
            &EPHEMERAL_SECRET,
        )),
        expires_at: NOW_MS + 5_000,
    }
}

/// Re-encodes parsed fields; must give back the parser's input byte for byte.
fn reencode(fields: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, v) in fields {
        for part in [n, v] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let (sel, rest) = selector(data);
    if let Some(fields) = challenge::parse_fields(rest) {
        assert_eq!(reencode(&fields), rest);
    }
    let frame = match sel % 3 {
        0 => match serde_json::from_slice::<HostChallengeFrame>(rest) {
            Ok(f) => f,
            Err(_) => return,
        },
        1 => sealed_frame(rest),
        _ => sealed_frame(&host_proof::plaintext(rest, &[3; 32])),
    };
    let b = binding();
    if let Ok(proof) = host_proof::answer_host_challenge(&HOST_SECRET, &frame, &b, NOW_MS) {
        // Only a transcript of exactly this binding yields a proof, and it is the HMAC over it.
        let opened = nacl::open(
            &crypto::b64::std_decode_canonical(&frame.ciphertext_b64).unwrap(),
            &crypto::decode_nonce24(&frame.nonce_b64).unwrap(),
            &crypto::decode_key32(&frame.relay_ephemeral_public_key_b64).unwrap(),
            &HOST_SECRET,
        )
        .unwrap();
        let (transcript, secret) =
            challenge::split_plaintext(host_proof::CHALLENGE_DOMAIN, &opened).unwrap();
        assert_eq!(proof, host_proof::expected_proof(&secret, transcript));
    }
});
