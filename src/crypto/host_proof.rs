//! Relay host proof (docs/reference/websocket.md): the host proves it holds the X25519 secret behind
//! `relayHostId` by opening a box sealed to its public key and MACing the transcript with the secret
//! inside. The transcript binds the proof to this relay origin, the token identity, epoch and generation,
//! so a proof cannot be replayed to another cell, user or activation.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::b64::{decode_key32, decode_nonce24, std_decode_canonical, std_encode};
use super::challenge::{self, ChallengeRandomness, Field};
use super::ct::ct_eq;
use super::nacl::{self, X25519Keypair};

/// Transcript `protocol` value and MAC-input prefix.
pub const PROTOCOL: &str = "orca-relay-host-proof/v1";
/// Plaintext domain prefix.
pub const CHALLENGE_DOMAIN: &str = "orca-relay-host-challenge/v1";
/// Longest accepted `ciphertextB64`.
pub const MAX_CIPHERTEXT_B64_CHARS: usize = 16_384;

/// The 16 transcript fields (`protocol` and `version` are constants).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostProofContext {
    pub relay_origin: String,
    pub relay_ephemeral_public: [u8; 32],
    pub nonce: [u8; 24],
    pub challenge_id: String,
    pub issued_at: u64,
    pub expires_at: u64,
    pub user_id: String,
    pub profile_id: String,
    /// Token `org`, empty when absent.
    pub organization_id: String,
    pub relay_host_id: String,
    pub host_public: [u8; 32],
    pub assignment_epoch: u64,
    /// `None` encodes as a zero-length value.
    pub previous_generation: Option<u64>,
    pub resume_requested: bool,
}

impl HostProofContext {
    fn fields(&self) -> Vec<Field> {
        vec![
            ("protocol", PROTOCOL.into()),
            ("version", vec![1]),
            ("relayOrigin", self.relay_origin.clone().into_bytes()),
            (
                "relayEphemeralPublicKey",
                self.relay_ephemeral_public.to_vec(),
            ),
            ("challengeNonce", self.nonce.to_vec()),
            ("challengeId", self.challenge_id.clone().into_bytes()),
            ("issuedAt", self.issued_at.to_be_bytes().to_vec()),
            ("expiresAt", self.expires_at.to_be_bytes().to_vec()),
            ("userId", self.user_id.clone().into_bytes()),
            ("profileId", self.profile_id.clone().into_bytes()),
            ("organizationId", self.organization_id.clone().into_bytes()),
            ("relayHostId", self.relay_host_id.clone().into_bytes()),
            ("hostPublicKey", self.host_public.to_vec()),
            (
                "assignmentEpoch",
                self.assignment_epoch.to_be_bytes().to_vec(),
            ),
            (
                "previousGeneration",
                self.previous_generation
                    .map_or_else(Vec::new, |g| g.to_be_bytes().to_vec()),
            ),
            ("resumeRequested", vec![u8::from(self.resume_requested)]),
        ]
    }

    /// The length-prefixed transcript bytes.
    pub fn transcript(&self) -> Vec<u8> {
        challenge::encode_fields(&self.fields())
    }
}

/// `orca-relay-host-challenge/v1 ‖ 0x00 ‖ u32be(len) ‖ transcript ‖ challengeSecret` (transcript + 65 bytes).
pub fn plaintext(transcript: &[u8], challenge_secret: &[u8; 32]) -> Vec<u8> {
    challenge::plaintext(CHALLENGE_DOMAIN, transcript, challenge_secret)
}

/// `orca-relay-host-proof/v1 ‖ 0x00 ‖ ack ‖ 0x00 ‖ transcript` (transcript + 29 bytes).
pub fn mac_input(transcript: &[u8]) -> Vec<u8> {
    challenge::mac_input(PROTOCOL, transcript)
}

/// HMAC-SHA256(key = challengeSecret, MAC input).
pub fn expected_proof(challenge_secret: &[u8; 32], transcript: &[u8]) -> [u8; 32] {
    challenge::hmac_sha256(challenge_secret, &mac_input(transcript))
}

/// Everything a challenge binds besides its random values and times: known to the cell from the token
/// and `host-hello`, and to the host from its own configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostBinding {
    /// `ORCA_RELAY_CELL_URL`, the origin the host dialled.
    pub relay_origin: String,
    pub user_id: String,
    pub profile_id: String,
    /// Token `org`, empty when absent.
    pub organization_id: String,
    pub relay_host_id: String,
    pub host_public: [u8; 32],
    pub assignment_epoch: u64,
    pub previous_generation: Option<u64>,
    /// Cell: this activation is a rebind. Host: the hello offered a `controlResumeSecret` (the cell may
    /// still start a new generation, so both values are then accepted).
    pub resume_requested: bool,
}

impl HostBinding {
    fn context(
        &self,
        relay_ephemeral_public: [u8; 32],
        nonce: [u8; 24],
        challenge_id: &str,
        issued_at: u64,
        expires_at: u64,
        resume_requested: bool,
    ) -> HostProofContext {
        HostProofContext {
            relay_origin: self.relay_origin.clone(),
            relay_ephemeral_public,
            nonce,
            challenge_id: challenge_id.to_owned(),
            issued_at,
            expires_at,
            user_id: self.user_id.clone(),
            profile_id: self.profile_id.clone(),
            organization_id: self.organization_id.clone(),
            relay_host_id: self.relay_host_id.clone(),
            host_public: self.host_public,
            assignment_epoch: self.assignment_epoch,
            previous_generation: self.previous_generation,
            resume_requested,
        }
    }
}

/// Fields of the `host-challenge` frame (the frame adds `"type":"host-challenge"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostChallengeFrame {
    pub challenge_id: String,
    pub relay_ephemeral_public_key_b64: String,
    pub nonce_b64: String,
    pub ciphertext_b64: String,
    pub expires_at: i64,
}

/// A challenge sent to a host and the proof the cell expects back. `Debug` hides the proof.
#[derive(Clone)]
pub struct IssuedChallenge {
    pub frame: HostChallengeFrame,
    expected_proof: [u8; 32],
}

impl IssuedChallenge {
    /// The expected proof (kept only in memory for the 10 s the challenge lives).
    pub fn expected_proof(&self) -> &[u8; 32] {
        &self.expected_proof
    }

    /// `host-challenge-ack` check: same `challengeId`, not after `expiresAt`, canonical `Key32`
    /// proof equal in constant time.
    pub fn verify_ack(&self, challenge_id: &str, proof_b64: &str, now_ms: i64) -> bool {
        challenge_id == self.frame.challenge_id
            && now_ms <= self.frame.expires_at
            && decode_key32(proof_b64).is_some_and(|proof| ct_eq(&proof, &self.expected_proof))
    }
}

impl fmt::Debug for IssuedChallenge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedChallenge")
            .field("frame", &self.frame)
            .finish_non_exhaustive()
    }
}

/// Issues a fresh `host-challenge` for `binding` at `now_ms` (`expiresAt` = now + 10 000).
pub fn issue_host_challenge(binding: &HostBinding, now_ms: i64) -> IssuedChallenge {
    issue_host_challenge_with(binding, now_ms, &ChallengeRandomness::generate())
}

/// [`issue_host_challenge`] with given random inputs (test vectors).
pub fn issue_host_challenge_with(
    binding: &HostBinding,
    now_ms: i64,
    random: &ChallengeRandomness,
) -> IssuedChallenge {
    let ephemeral = X25519Keypair::from_secret(random.ephemeral_secret);
    let (issued_at, expires_at) = challenge::challenge_times(now_ms);
    let transcript = binding
        .context(
            ephemeral.public,
            random.nonce,
            &random.challenge_id,
            issued_at,
            expires_at,
            binding.resume_requested,
        )
        .transcript();
    let sealed = nacl::seal(
        &plaintext(&transcript, &random.challenge_secret),
        &random.nonce,
        &binding.host_public,
        &ephemeral.secret,
    );
    IssuedChallenge {
        frame: HostChallengeFrame {
            challenge_id: random.challenge_id.clone(),
            relay_ephemeral_public_key_b64: std_encode(&ephemeral.public),
            nonce_b64: std_encode(&random.nonce),
            ciphertext_b64: std_encode(&sealed),
            expires_at: challenge::epoch_ms(expires_at),
        },
        expected_proof: expected_proof(&random.challenge_secret, &transcript),
    }
}

/// Host side: opens the challenge with the host secret, checks all 16 fields against `expected`
/// and the frame, and freshness (30 s host skew); returns the proof for `host-challenge-ack`.
pub fn answer_host_challenge(
    host_secret: &[u8; 32],
    frame: &HostChallengeFrame,
    expected: &HostBinding,
    now_ms: i64,
) -> Result<[u8; 32], String> {
    if nacl::public_key(host_secret) != expected.host_public {
        return Err("host secret does not match the expected host public key".into());
    }
    let id_len = frame.challenge_id.chars().count();
    if !(1..=128).contains(&id_len) {
        return Err("challengeId is not 1..128 chars".into());
    }
    let ephemeral = decode_key32(&frame.relay_ephemeral_public_key_b64)
        .ok_or("relayEphemeralPublicKeyB64 is not a canonical Key32")?;
    let nonce = decode_nonce24(&frame.nonce_b64).ok_or("nonceB64 is not a Nonce24")?;
    if frame.ciphertext_b64.len() > MAX_CIPHERTEXT_B64_CHARS {
        return Err("ciphertextB64 is too long".into());
    }
    let sealed = std_decode_canonical(&frame.ciphertext_b64)
        .ok_or("ciphertextB64 is not canonical base64")?;
    let opened = nacl::open(&sealed, &nonce, &ephemeral, host_secret)
        .ok_or("challenge box does not open with the host key")?;
    let (transcript, secret) = challenge::split_plaintext(CHALLENGE_DOMAIN, &opened)?;
    let fields = challenge::parse_fields(transcript).ok_or("transcript is malformed")?;
    let issued_at = challenge::u64_field(&fields, 6, "issuedAt")?;
    let expires_at = challenge::u64_field(&fields, 7, "expiresAt")?;
    let resumed = expected.resume_requested
        && matches!(fields.get(15), Some((n, v)) if *n == b"resumeRequested" && *v == [1]);
    let want = expected.context(
        ephemeral,
        nonce,
        &frame.challenge_id,
        issued_at,
        expires_at,
        resumed,
    );
    challenge::check_fields(&fields, &want.fields())?;
    if challenge::epoch_ms(expires_at) != frame.expires_at {
        return Err("transcript expiresAt differs from the frame".into());
    }
    challenge::check_freshness(issued_at, expires_at, now_ms)?;
    Ok(expected_proof(&secret, transcript))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::b64::url_encode;
    use crate::crypto::ident::{relay_host_id, sha256_hex};

    const T0: i64 = 1_700_000_000_000;
    const T0U: u64 = T0 as u64;

    const VECTOR_A: &str = "AAAACHByb3RvY29sAAAAGG9yY2EtcmVsYXktaG9zdC1wcm9vZi92MQAAAAd2ZXJzaW9uAAAAAQEAAAALcmVsYXlPcmlnaW4AAAAYaHR0cHM6Ly9yZWxheS5vbm9yY2EuZGV2AAAAF3JlbGF5RXBoZW1lcmFsUHVibGljS2V5AAAAIAEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAAAADmNoYWxsZW5nZU5vbmNlAAAAGAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAAAAAtjaGFsbGVuZ2VJZAAAAAtjaGFsbGVuZ2UtMQAAAAhpc3N1ZWRBdAAAAAgAAAGLz-VoAAAAAAlleHBpcmVzQXQAAAAIAAABi8_ljxAAAAAGdXNlcklkAAAABnVzZXItMQAAAAlwcm9maWxlSWQAAAAJcHJvZmlsZS0xAAAADm9yZ2FuaXphdGlvbklkAAAABW9yZy0xAAAAC3JlbGF5SG9zdElkAAAAEGFiY2RlZmdoaWprbG1ub3AAAAANaG9zdFB1YmxpY0tleQAAACACAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgAAAA9hc3NpZ25tZW50RXBvY2gAAAAIAAAAAAAAAAcAAAAScHJldmlvdXNHZW5lcmF0aW9uAAAACAAAAAAAAAAGAAAAD3Jlc3VtZVJlcXVlc3RlZAAAAAEB";

    fn context_a() -> HostProofContext {
        HostProofContext {
            relay_origin: "https://relay.onorca.dev".into(),
            relay_ephemeral_public: [1; 32],
            nonce: [4; 24],
            challenge_id: "challenge-1".into(),
            issued_at: T0U,
            expires_at: T0U + 10_000,
            user_id: "user-1".into(),
            profile_id: "profile-1".into(),
            organization_id: "org-1".into(),
            relay_host_id: "abcdefghijklmnop".into(),
            host_public: [2; 32],
            assignment_epoch: 7,
            previous_generation: Some(6),
            resume_requested: true,
        }
    }

    #[test]
    fn vector_a_transcript() {
        let transcript = context_a().transcript();
        assert_eq!(transcript.len(), 537);
        assert_eq!(url_encode(&transcript), VECTOR_A);
        assert_eq!(plaintext(&transcript, &[0; 32]).len(), 602);
        assert_eq!(mac_input(&transcript).len(), 566);
    }

    fn binding_b() -> HostBinding {
        let host = X25519Keypair::from_secret([0x11; 32]);
        HostBinding {
            relay_origin: "https://relay.example.test".into(),
            user_id: "self-hosted".into(),
            profile_id: "https://relay.example.test".into(),
            organization_id: String::new(),
            relay_host_id: relay_host_id(&host.public),
            host_public: host.public,
            assignment_epoch: 1,
            previous_generation: None,
            resume_requested: false,
        }
    }

    fn random_b() -> ChallengeRandomness {
        ChallengeRandomness {
            ephemeral_secret: [0x22; 32],
            nonce: [4; 24],
            challenge_secret: [0x33; 32],
            challenge_id: "challenge-2".into(),
        }
    }

    #[test]
    fn vector_b_box_and_proof() {
        let binding = binding_b();
        assert_eq!(
            std_encode(&binding.host_public),
            "e06Qm75//kTEZaIgA31gjuNYl9Me+XLwf3SJLLD3PxM="
        );
        assert_eq!(binding.relay_host_id, "0Zvz8IJ4LIe3g_5x");
        let ephemeral = X25519Keypair::from_secret([0x22; 32]);
        assert_eq!(
            std_encode(&ephemeral.public),
            "D6poTtKIZ7l/Smot7l34zpdOdrcBjj8iocTPJnhXDyA="
        );
        let transcript = binding
            .context(
                ephemeral.public,
                [4; 24],
                "challenge-2",
                T0U,
                T0U + 10_000,
                false,
            )
            .transcript();
        assert_eq!(transcript.len(), 548);
        assert_eq!(
            sha256_hex(&transcript),
            "63b519c1442187450280087f3e2795307a43826257e75b3ee4865c99a46c798b"
        );

        let issued = issue_host_challenge_with(&binding, T0, &random_b());
        assert_eq!(issued.frame.challenge_id, "challenge-2");
        assert_eq!(issued.frame.nonce_b64, "BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE");
        assert_eq!(
            issued.frame.relay_ephemeral_public_key_b64,
            "D6poTtKIZ7l/Smot7l34zpdOdrcBjj8iocTPJnhXDyA="
        );
        assert_eq!(issued.frame.expires_at, T0 + 10_000);
        let sealed = std_decode_canonical(&issued.frame.ciphertext_b64).unwrap();
        assert_eq!(sealed.len(), 629);
        assert_eq!(
            sha256_hex(&sealed),
            "1b595c4f9260fb56a657f84a94ac363a1a666828de8edfd6d7d5c35ae3cc3a32"
        );
        let proof_b64 = "hXGe8tQ0FL78jK6/uRoU9+IP1X6v904TIH7mmZtaUVM=";
        assert_eq!(std_encode(issued.expected_proof()), proof_b64);
        assert_eq!(
            std_encode(&expected_proof(&[0x33; 32], &transcript)),
            proof_b64
        );

        let answered =
            answer_host_challenge(&[0x11; 32], &issued.frame, &binding, T0 + 500).unwrap();
        assert_eq!(std_encode(&answered), proof_b64);
        assert!(issued.verify_ack("challenge-2", proof_b64, T0 + 10_000));
        assert!(!issued.verify_ack("challenge-2", proof_b64, T0 + 10_001));
        assert!(!issued.verify_ack("challenge-1", proof_b64, T0));
        assert!(!issued.verify_ack("challenge-2", &std_encode(&[0; 32]), T0));
        assert!(!issued.verify_ack(
            "challenge-2",
            "hXGe8tQ0FL78jK6/uRoU9+IP1X6v904TIH7mmZtaUVN=",
            T0
        ));
        assert!(!format!("{issued:?}").contains(&std_encode(issued.expected_proof())));
    }

    #[test]
    fn derive_vector() {
        assert_eq!(relay_host_id(&[2; 32]), "dYd7tB05O1-4RVzm");
    }

    #[test]
    fn host_rejects_any_mismatch() {
        let binding = binding_b();
        let issued = issue_host_challenge(&binding, T0);
        let ok = answer_host_challenge(&[0x11; 32], &issued.frame, &binding, T0).unwrap();
        assert!(issued.verify_ack(&issued.frame.challenge_id, &std_encode(&ok), T0));

        let reject = |b: &HostBinding, f: &HostChallengeFrame, now: i64| {
            answer_host_challenge(&[0x11; 32], f, b, now).unwrap_err()
        };
        let mut b = binding.clone();
        b.relay_origin = "https://evil.example".into();
        assert!(reject(&b, &issued.frame, T0).contains("relayOrigin"));
        let mut b = binding.clone();
        b.assignment_epoch = 2;
        assert!(reject(&b, &issued.frame, T0).contains("assignmentEpoch"));
        let mut b = binding.clone();
        b.previous_generation = Some(0);
        assert!(reject(&b, &issued.frame, T0).contains("previousGeneration"));
        let mut b = binding.clone();
        b.organization_id = "org".into();
        assert!(reject(&b, &issued.frame, T0).contains("organizationId"));
        let mut f = issued.frame.clone();
        f.challenge_id = "other".into();
        assert!(reject(&binding, &f, T0).contains("challengeId"));
        let mut f = issued.frame.clone();
        f.expires_at += 1;
        assert!(reject(&binding, &f, T0).contains("expiresAt"));
        assert!(reject(&binding, &issued.frame, T0 + 40_001).contains("fresh"));
        assert!(reject(&binding, &issued.frame, T0 - 30_001).contains("fresh"));
        assert!(answer_host_challenge(&[0x12; 32], &issued.frame, &binding, T0).is_err());
        let mut f = issued.frame.clone();
        f.nonce_b64 = std_encode(&[5; 24]);
        assert!(reject(&binding, &f, T0).contains("does not open"));
    }

    #[test]
    fn resume_flag_on_host_side() {
        let mut cell = binding_b();
        cell.resume_requested = true;
        let rebind = issue_host_challenge(&cell, T0);
        // Host that offered a resume secret accepts a rebind or a new generation.
        assert!(answer_host_challenge(&[0x11; 32], &rebind.frame, &cell, T0).is_ok());
        let fresh = issue_host_challenge(&binding_b(), T0);
        assert!(answer_host_challenge(&[0x11; 32], &fresh.frame, &cell, T0).is_ok());
        // Host that offered none refuses a transcript claiming a rebind.
        let err = answer_host_challenge(&[0x11; 32], &rebind.frame, &binding_b(), T0).unwrap_err();
        assert!(err.contains("resumeRequested"));
    }
}
