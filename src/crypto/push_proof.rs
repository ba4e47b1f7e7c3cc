//! Push gateway host proof (docs/reference/http.md): like the relay proof but with a 10-field transcript bound to the
//! gateway origin. The gateway keeps only `secret_hash` = base64url(SHA-256(expected proof)), so a database
//! reader can neither open a challenge nor forge a proof.

use serde::{Deserialize, Serialize};

use super::b64::{decode_key32, decode_nonce24, std_decode_canonical, std_encode, url_encode};
use super::challenge::{self, ChallengeRandomness, Field};
use super::ct::ct_eq_str;
use super::ident::{relay_host_id, sha256};
use super::nacl::{self, X25519Keypair};

/// Transcript `protocol` value and MAC-input prefix.
pub const PROTOCOL: &str = "orca-push-host-proof/v1";
/// Plaintext domain prefix.
pub const CHALLENGE_DOMAIN: &str = "orca-push-host-challenge/v1";
/// Longest accepted `ciphertextB64`.
pub const MAX_CIPHERTEXT_B64_CHARS: usize = 16_384;

/// The ten transcript fields of docs/reference/http.md (`protocol` and `version` are constants).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushProofContext {
    pub gateway_origin: String,
    pub gateway_ephemeral_public: [u8; 32],
    pub nonce: [u8; 24],
    pub challenge_id: String,
    pub issued_at: u64,
    pub expires_at: u64,
    /// `relayHostId` of `host_public`.
    pub host_fingerprint: String,
    pub host_public: [u8; 32],
}

impl PushProofContext {
    fn fields(&self) -> Vec<Field> {
        vec![
            ("protocol", PROTOCOL.into()),
            ("version", vec![1]),
            ("gatewayOrigin", self.gateway_origin.clone().into_bytes()),
            (
                "gatewayEphemeralPublicKey",
                self.gateway_ephemeral_public.to_vec(),
            ),
            ("challengeNonce", self.nonce.to_vec()),
            ("challengeId", self.challenge_id.clone().into_bytes()),
            ("issuedAt", self.issued_at.to_be_bytes().to_vec()),
            ("expiresAt", self.expires_at.to_be_bytes().to_vec()),
            (
                "hostFingerprint",
                self.host_fingerprint.clone().into_bytes(),
            ),
            ("hostPublicKey", self.host_public.to_vec()),
        ]
    }

    /// The length-prefixed transcript bytes.
    pub fn transcript(&self) -> Vec<u8> {
        challenge::encode_fields(&self.fields())
    }
}

/// `orca-push-host-challenge/v1 ‖ 0x00 ‖ u32be(len) ‖ transcript ‖ challengeSecret`.
pub fn plaintext(transcript: &[u8], challenge_secret: &[u8; 32]) -> Vec<u8> {
    challenge::plaintext(CHALLENGE_DOMAIN, transcript, challenge_secret)
}

/// `orca-push-host-proof/v1 ‖ 0x00 ‖ ack ‖ 0x00 ‖ transcript`.
pub fn mac_input(transcript: &[u8]) -> Vec<u8> {
    challenge::mac_input(PROTOCOL, transcript)
}

/// HMAC-SHA256(key = challengeSecret, MAC input).
pub fn expected_proof(challenge_secret: &[u8; 32], transcript: &[u8]) -> [u8; 32] {
    challenge::hmac_sha256(challenge_secret, &mac_input(transcript))
}

/// The stored `secret_hash`: unpadded base64url(SHA-256(proof)), 43 chars.
pub fn secret_hash(proof: &[u8; 32]) -> String {
    url_encode(&sha256(proof))
}

/// Session step 4 (docs/reference/http.md): `proofB64` is canonical base64 of 32 bytes and hashes to `stored_hash`
/// (constant-time comparison).
pub fn proof_matches_secret_hash(proof_b64: &str, stored_hash: &str) -> bool {
    decode_key32(proof_b64).is_some_and(|proof| ct_eq_str(&secret_hash(&proof), stored_hash))
}

/// `POST /v1/host/challenge` response body (docs/reference/http.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushChallengeResponse {
    pub challenge_id: String,
    pub gateway_ephemeral_public_key_b64: String,
    pub nonce_b64: String,
    pub ciphertext_b64: String,
    pub expires_at: i64,
}

/// Gateway side: a fresh challenge for `host_public` and the `secret_hash` to store with it. The host
/// fingerprint to store is `relay_host_id(host_public)`.
pub fn issue_push_challenge(
    gateway_origin: &str,
    host_public: &[u8; 32],
    now_ms: i64,
) -> (PushChallengeResponse, String) {
    issue_push_challenge_with(
        gateway_origin,
        host_public,
        now_ms,
        &ChallengeRandomness::generate(),
    )
}

/// [`issue_push_challenge`] with given random inputs (the normative vector).
pub fn issue_push_challenge_with(
    gateway_origin: &str,
    host_public: &[u8; 32],
    now_ms: i64,
    random: &ChallengeRandomness,
) -> (PushChallengeResponse, String) {
    let ephemeral = X25519Keypair::from_secret(random.ephemeral_secret);
    let (issued_at, expires_at) = challenge::challenge_times(now_ms);
    let context = PushProofContext {
        gateway_origin: gateway_origin.to_owned(),
        gateway_ephemeral_public: ephemeral.public,
        nonce: random.nonce,
        challenge_id: random.challenge_id.clone(),
        issued_at,
        expires_at,
        host_fingerprint: relay_host_id(host_public),
        host_public: *host_public,
    };
    let transcript = context.transcript();
    let sealed = nacl::seal(
        &plaintext(&transcript, &random.challenge_secret),
        &random.nonce,
        host_public,
        &ephemeral.secret,
    );
    let response = PushChallengeResponse {
        challenge_id: context.challenge_id,
        gateway_ephemeral_public_key_b64: std_encode(&ephemeral.public),
        nonce_b64: std_encode(&random.nonce),
        ciphertext_b64: std_encode(&sealed),
        expires_at: challenge::epoch_ms(expires_at),
    };
    let hash = secret_hash(&expected_proof(&random.challenge_secret, &transcript));
    (response, hash)
}

/// Host side (docs/reference/http.md): opens the box, requires the exact framing and all ten fields to match its own
/// origin, key and the response, plus freshness with 30 s skew; returns the proof for `proofB64`.
pub fn answer_push_challenge(
    host_secret: &[u8; 32],
    gateway_origin: &str,
    response: &PushChallengeResponse,
    now_ms: i64,
) -> Result<[u8; 32], String> {
    let ephemeral = decode_key32(&response.gateway_ephemeral_public_key_b64)
        .ok_or("gatewayEphemeralPublicKeyB64 is not a canonical Key32")?;
    let nonce = decode_nonce24(&response.nonce_b64).ok_or("nonceB64 is not a Nonce24")?;
    if response.ciphertext_b64.len() > MAX_CIPHERTEXT_B64_CHARS {
        return Err("ciphertextB64 is too long".into());
    }
    let sealed = std_decode_canonical(&response.ciphertext_b64)
        .ok_or("ciphertextB64 is not canonical base64")?;
    let opened = nacl::open(&sealed, &nonce, &ephemeral, host_secret)
        .ok_or("challenge box does not open with the host key")?;
    let (transcript, secret) = challenge::split_plaintext(CHALLENGE_DOMAIN, &opened)?;
    let fields = challenge::parse_fields(transcript).ok_or("transcript is malformed")?;
    let issued_at = challenge::u64_field(&fields, 6, "issuedAt")?;
    let expires_at = challenge::u64_field(&fields, 7, "expiresAt")?;
    let host_public = nacl::public_key(host_secret);
    let want = PushProofContext {
        gateway_origin: gateway_origin.to_owned(),
        gateway_ephemeral_public: ephemeral,
        nonce,
        challenge_id: response.challenge_id.clone(),
        issued_at,
        expires_at,
        host_fingerprint: relay_host_id(&host_public),
        host_public,
    };
    challenge::check_fields(&fields, &want.fields())?;
    if challenge::epoch_ms(expires_at) != response.expires_at {
        return Err("transcript expiresAt differs from the response".into());
    }
    challenge::check_freshness(issued_at, expires_at, now_ms)?;
    Ok(expected_proof(&secret, transcript))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::ident::sha256_hex;

    const ORIGIN: &str = "https://push.example.test";
    const ISSUED_AT: i64 = 1_767_225_600_000;

    fn seq<const N: usize>(first: u8) -> [u8; N] {
        std::array::from_fn(|i| first + i as u8)
    }

    fn random() -> ChallengeRandomness {
        ChallengeRandomness {
            ephemeral_secret: seq(0x21),
            nonce: seq(0x41),
            challenge_secret: seq(0x61),
            challenge_id: "0b7e4c2a-5d1f-4e8b-9a3c-6f2d8e1b7a40".into(),
        }
    }

    const TRANSCRIPT: &str = concat!(
        "AAAACHByb3RvY29sAAAAF29yY2EtcHVzaC1ob3N0LXByb29mL3YxAAAAB3ZlcnNpb24AAAABAQAAAA1nYXRld2F5T3JpZ2luAAAA",
        "GWh0dHBzOi8vcHVzaC5leGFtcGxlLnRlc3QAAAAZZ2F0ZXdheUVwaGVtZXJhbFB1YmxpY0tleQAAACBYaa_0UFSXMsuq7V5d-bMK",
        "baMcsOV0K61a1KGnaPGmewAAAA5jaGFsbGVuZ2VOb25jZQAAABhBQkNERUZHSElKS0xNTk9QUVJTVFVWV1gAAAALY2hhbGxlbmdl",
        "SWQAAAAkMGI3ZTRjMmEtNWQxZi00ZThiLTlhM2MtNmYyZDhlMWI3YTQwAAAACGlzc3VlZEF0AAAACAAAAZt22qgAAAAACWV4cGly",
        "ZXNBdAAAAAgAAAGbdtrPEAAAAA9ob3N0RmluZ2VycHJpbnQAAAAQcXFqXzl3TzFDeUtYOVBiaAAAAA1ob3N0UHVibGljS2V5AAAA",
        "IAejfLwUIJPIt1XcGxDobLQmN0rRaqhT7QvfwLK4bRx8",
    );

    const CIPHERTEXT: &str = concat!(
        "cnPvIdDmow6NtK3Qt9DscwyFk1I4Ae8+ITA2iZEI44CLFmIuSA3j6PLtJMifRkkvIWCvdis5qoJLOlO+sP+yXMlNNQH6dZPlPp1z",
        "MDVKKjVE9cJAHly9NsDQs5OvgKiyGfZIcBsZWkCjEZE3EPkPCFAV2r9m3Vdo0N0AYGYYN+x3PUG2IkDOEbcdARI/gaKzA3SzoN6b",
        "IRsAaUSR7hhgC442SfmJMr7qOM3mGvulbbEVmxjuITBADfy0S/9bNzJOXw+bf62175jzO01hJIoB4up4ZrXeriJvPJvGpk+zTYdk",
        "poBVKCQvnKEYxFteE4kbsm2H+QmENFocfNHEaDeU7KAujrJXU9vjz/e/ByZb6SoYT8m7QLKbMeHZZgWVd25d5aMS2I5zjw6Ppr6k",
        "wEkWAgi4UnT7AkqJ8nbCBMyI/lEq7p0xz3I0VQLv7cjaRjHr/WZFKk/EB37PvPitWl2Sl1ks+/zH1P3k8vxVI0qF+s2ETKTapJtX",
        "0yCTmk7V3zotjMPZK3SkZrHPsfOfs/cqbegtLJKSv0CggORqDL9WVttmcCVAw0ztVx4KCiMxpo/xTXiHsCmhhAoi0id+dPuvjSel",
        "72IVjxuBSwd+mQ9/wmszoTxXdWeGathNCi31YvIvpTRCyNnFLDo=",
    );

    #[test]
    fn normative_vector() {
        let host = X25519Keypair::from_secret(seq(0x01));
        assert_eq!(
            std_encode(&host.secret),
            "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="
        );
        assert_eq!(
            std_encode(&host.public),
            "B6N8vBQgk8i3VdwbEOhstCY3StFqqFPtC9/AsrhtHHw="
        );
        assert_eq!(relay_host_id(&host.public), "qqj_9wO1CyKX9Pbh");
        let ephemeral = X25519Keypair::from_secret(seq(0x21));
        assert_eq!(
            std_encode(&ephemeral.public),
            "WGmv9FBUlzLLqu1eXfmzCm2jHLDldCutWtShp2jxpns="
        );

        let context = PushProofContext {
            gateway_origin: ORIGIN.into(),
            gateway_ephemeral_public: ephemeral.public,
            nonce: seq(0x41),
            challenge_id: random().challenge_id,
            issued_at: ISSUED_AT as u64,
            expires_at: ISSUED_AT as u64 + 10_000,
            host_fingerprint: "qqj_9wO1CyKX9Pbh".into(),
            host_public: host.public,
        };
        let transcript = context.transcript();
        assert_eq!(transcript.len(), 408);
        assert_eq!(url_encode(&transcript), TRANSCRIPT);
        assert_eq!(
            sha256_hex(&transcript),
            "724f0a048023cd4d4b00328df3ee666606ba960dbf237f10f9fa9db18259620c"
        );
        let pt = plaintext(&transcript, &seq(0x61));
        assert_eq!(pt.len(), 472);
        assert_eq!(
            sha256_hex(&pt),
            "6c30a1d1a606966fc3f49bba7ba95d2c8c4cc729baa8b1d3ba932ba4af069e33"
        );

        let (response, hash) =
            issue_push_challenge_with(ORIGIN, &host.public, ISSUED_AT, &random());
        assert_eq!(response.ciphertext_b64, CIPHERTEXT);
        let sealed = std_decode_canonical(CIPHERTEXT).unwrap();
        assert_eq!(sealed.len(), 488);
        assert_eq!(
            sha256_hex(&sealed),
            "0707378218aea2f56d54b0d5483e4764b4d7bd4daa7ea5a61e43bbe6df02d6ff"
        );
        assert_eq!(response.nonce_b64, "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY");
        assert_eq!(response.expires_at, 1_767_225_610_000);
        assert_eq!(hash, "VrqJezT_4dry8mHbyKVeVYz4MGtIlazDvrD1HBzYUL0");

        let proof = answer_push_challenge(&host.secret, ORIGIN, &response, ISSUED_AT).unwrap();
        let proof_b64 = std_encode(&proof);
        assert_eq!(proof_b64, "e3cFfP3o64AwWVR7l1LmhFOnCg6p3++1aXXtc6wdvfQ=");
        assert_eq!(secret_hash(&proof), hash);
        assert!(proof_matches_secret_hash(&proof_b64, &hash));
        assert!(!proof_matches_secret_hash(
            "e3cFfP3o64AwWVR7l1LmhFOnCg6p3++1aXXtc6wdvfR=",
            &hash
        ));
        assert!(!proof_matches_secret_hash(&std_encode(&[0; 32]), &hash));
    }

    #[test]
    fn host_side_checks() {
        let host = X25519Keypair::generate();
        let (response, hash) = issue_push_challenge(ORIGIN, &host.public, ISSUED_AT);
        assert_eq!(response.challenge_id.len(), 36);
        let proof =
            answer_push_challenge(&host.secret, ORIGIN, &response, ISSUED_AT + 40_000).unwrap();
        assert_eq!(secret_hash(&proof), hash);

        let err = |origin: &str, r: &PushChallengeResponse, now: i64| {
            answer_push_challenge(&host.secret, origin, r, now).unwrap_err()
        };
        assert!(err("https://other.example", &response, ISSUED_AT).contains("gatewayOrigin"));
        assert!(err(ORIGIN, &response, ISSUED_AT + 40_001).contains("fresh"));
        assert!(err(ORIGIN, &response, ISSUED_AT - 30_001).contains("fresh"));
        let mut r = response.clone();
        r.challenge_id = uuid::Uuid::new_v4().to_string();
        assert!(err(ORIGIN, &r, ISSUED_AT).contains("challengeId"));
        let mut r = response.clone();
        r.expires_at -= 1;
        assert!(err(ORIGIN, &r, ISSUED_AT).contains("expiresAt"));
        let mut r = response.clone();
        r.ciphertext_b64 = r.ciphertext_b64.trim_end_matches('=').into();
        assert!(err(ORIGIN, &r, ISSUED_AT).contains("canonical"));
        let other = X25519Keypair::generate();
        assert!(answer_push_challenge(&other.secret, ORIGIN, &response, ISSUED_AT).is_err());
        let json = serde_json::to_value(&response).unwrap();
        assert!(json.get("gatewayEphemeralPublicKeyB64").is_some());
        assert!(json.get("ciphertextB64").is_some());
    }
}
