//! The push host proof (docs/reference/http.md) from the host's side, which parses the gateway's
//! `POST /v1/host/challenge` answer: the answer as JSON (selector 0), a box the host key opens
//! around a plaintext of the fuzzer's choosing (selector 1) or around the framed plaintext of a
//! transcript of its choosing (selector 2). Also the gateway's proof-against-stored-hash check.
//!
//! Properties: never panics; a refusal is an error string; a returned proof is the HMAC over the
//! opened transcript.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::crypto::{self, challenge, nacl, push_proof, PushChallengeResponse};
use orca_relay_fuzz::{selector, NOW_MS};

const HOST_SECRET: [u8; 32] = [7; 32];
const EPHEMERAL_SECRET: [u8; 32] = [1; 32];
const NONCE: [u8; 24] = [2; 24];
const ORIGIN: &str = "https://push.example.test";

fn sealed(plaintext: &[u8]) -> PushChallengeResponse {
    let host_public = nacl::public_key(&HOST_SECRET);
    PushChallengeResponse {
        challenge_id: "00000000-0000-4000-8000-000000000000".into(),
        gateway_ephemeral_public_key_b64: crypto::std_encode(&nacl::public_key(&EPHEMERAL_SECRET)),
        nonce_b64: crypto::std_encode(&NONCE),
        ciphertext_b64: crypto::std_encode(&nacl::seal(
            plaintext,
            &NONCE,
            &host_public,
            &EPHEMERAL_SECRET,
        )),
        expires_at: NOW_MS + 5_000,
    }
}

fuzz_target!(|data: &[u8]| {
    let (sel, rest) = selector(data);
    if let Ok(text) = std::str::from_utf8(rest) {
        let _ = push_proof::proof_matches_secret_hash(text, &push_proof::secret_hash(&[9; 32]));
    }
    let response = match sel % 3 {
        0 => match serde_json::from_slice::<PushChallengeResponse>(rest) {
            Ok(r) => r,
            Err(_) => return,
        },
        1 => sealed(rest),
        _ => sealed(&push_proof::plaintext(rest, &[3; 32])),
    };
    if let Ok(proof) = push_proof::answer_push_challenge(&HOST_SECRET, ORIGIN, &response, NOW_MS) {
        let opened = nacl::open(
            &crypto::b64::std_decode_canonical(&response.ciphertext_b64).unwrap(),
            &crypto::decode_nonce24(&response.nonce_b64).unwrap(),
            &crypto::decode_key32(&response.gateway_ephemeral_public_key_b64).unwrap(),
            &HOST_SECRET,
        )
        .unwrap();
        let (transcript, secret) =
            challenge::split_plaintext(push_proof::CHALLENGE_DOMAIN, &opened).unwrap();
        assert_eq!(proof, push_proof::expected_proof(&secret, transcript));
    }
});
