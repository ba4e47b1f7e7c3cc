//! The spec's normative crypto vectors through the public API (docs/reference/websocket.md: vectors A, B, K and the
//! token hash; docs/reference/http.md), plus a libsodium interoperability vector.

use orca_relay::crypto::b64::{decode_key32, std_decode_canonical, std_encode, url_encode};
use orca_relay::crypto::host_proof::{
    self, answer_host_challenge, issue_host_challenge_with, HostBinding, HostProofContext,
};
use orca_relay::crypto::ident::{hex, relay_host_id, sha256_hex, token_hash};
use orca_relay::crypto::jwt::{
    mint_assignment_lease, mint_cluster_token, mint_host_token, self_hosted_key,
    verify_assignment_lease, verify_bearer_header, verify_cluster_token, HostTokenVerifier,
};
use orca_relay::crypto::nacl::{self, X25519Keypair};
use orca_relay::crypto::push_proof::{
    self, answer_push_challenge, issue_push_challenge_with, PushProofContext,
};
use orca_relay::crypto::ChallengeRandomness;

const T0: i64 = 1_700_000_000_000;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn seq<const N: usize>(first: u8) -> [u8; N] {
    std::array::from_fn(|i| first + i as u8)
}

#[test]
fn token_hash_vector() {
    assert_eq!(
        token_hash("BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"),
        "iU41LR2MwQwwPfj9RaWe6XswhBvb9gtH-jF8f6TJWFk"
    );
}

#[test]
fn vector_k_self_hosted_key() {
    assert_eq!(
        hex(&self_hosted_key("0123456789abcdef0123456789abcdef")),
        "da60a75dbf2865d4fbeb20d254880e03da6e75f4a2c53b82c5892df7228c1558"
    );
}

#[test]
fn derive_relay_host_id() {
    assert_eq!(relay_host_id(&[2; 32]), "dYd7tB05O1-4RVzm");
}

#[test]
fn vector_a_transcript() {
    let context = HostProofContext {
        relay_origin: "https://relay.onorca.dev".into(),
        relay_ephemeral_public: [1; 32],
        nonce: [4; 24],
        challenge_id: "challenge-1".into(),
        issued_at: 1_700_000_000_000,
        expires_at: 1_700_000_010_000,
        user_id: "user-1".into(),
        profile_id: "profile-1".into(),
        organization_id: "org-1".into(),
        relay_host_id: "abcdefghijklmnop".into(),
        host_public: [2; 32],
        assignment_epoch: 7,
        previous_generation: Some(6),
        resume_requested: true,
    };
    let transcript = context.transcript();
    assert_eq!(transcript.len(), 537);
    assert_eq!(
        url_encode(&transcript),
        concat!(
            "AAAACHByb3RvY29sAAAAGG9yY2EtcmVsYXktaG9zdC1wcm9vZi92MQAAAAd2ZXJzaW9uAAAAAQEAAAALcmVsYXlPcmln",
            "aW4AAAAYaHR0cHM6Ly9yZWxheS5vbm9yY2EuZGV2AAAAF3JlbGF5RXBoZW1lcmFsUHVibGljS2V5AAAAIAEBAQEBAQEB",
            "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAAAADmNoYWxsZW5nZU5vbmNlAAAAGAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE",
            "BAAAAAtjaGFsbGVuZ2VJZAAAAAtjaGFsbGVuZ2UtMQAAAAhpc3N1ZWRBdAAAAAgAAAGLz-VoAAAAAAlleHBpcmVzQXQA",
            "AAAIAAABi8_ljxAAAAAGdXNlcklkAAAABnVzZXItMQAAAAlwcm9maWxlSWQAAAAJcHJvZmlsZS0xAAAADm9yZ2FuaXph",
            "dGlvbklkAAAABW9yZy0xAAAAC3JlbGF5SG9zdElkAAAAEGFiY2RlZmdoaWprbG1ub3AAAAANaG9zdFB1YmxpY0tleQAA",
            "ACACAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgAAAA9hc3NpZ25tZW50RXBvY2gAAAAIAAAAAAAAAAcAAAAS",
            "cHJldmlvdXNHZW5lcmF0aW9uAAAACAAAAAAAAAAGAAAAD3Jlc3VtZVJlcXVlc3RlZAAAAAEB",
        )
    );
    assert_eq!(host_proof::plaintext(&transcript, &[0; 32]).len(), 602);
    assert_eq!(host_proof::mac_input(&transcript).len(), 566);
}

#[test]
fn vector_b_box_and_proof() {
    let host = X25519Keypair::from_secret([0x11; 32]);
    assert_eq!(
        std_encode(&host.public),
        "e06Qm75//kTEZaIgA31gjuNYl9Me+XLwf3SJLLD3PxM="
    );
    assert_eq!(relay_host_id(&host.public), "0Zvz8IJ4LIe3g_5x");
    let ephemeral = X25519Keypair::from_secret([0x22; 32]);
    assert_eq!(
        std_encode(&ephemeral.public),
        "D6poTtKIZ7l/Smot7l34zpdOdrcBjj8iocTPJnhXDyA="
    );
    assert_eq!(std_encode(&[4; 24]), "BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE");

    let binding = HostBinding {
        relay_origin: "https://relay.example.test".into(),
        user_id: "self-hosted".into(),
        profile_id: "https://relay.example.test".into(),
        organization_id: String::new(),
        relay_host_id: "0Zvz8IJ4LIe3g_5x".into(),
        host_public: host.public,
        assignment_epoch: 1,
        previous_generation: None,
        resume_requested: false,
    };
    let context = HostProofContext {
        relay_origin: binding.relay_origin.clone(),
        relay_ephemeral_public: ephemeral.public,
        nonce: [4; 24],
        challenge_id: "challenge-2".into(),
        issued_at: 1_700_000_000_000,
        expires_at: 1_700_000_010_000,
        user_id: binding.user_id.clone(),
        profile_id: binding.profile_id.clone(),
        organization_id: String::new(),
        relay_host_id: binding.relay_host_id.clone(),
        host_public: host.public,
        assignment_epoch: 1,
        previous_generation: None,
        resume_requested: false,
    };
    let transcript = context.transcript();
    assert_eq!(transcript.len(), 548);
    assert_eq!(
        sha256_hex(&transcript),
        "63b519c1442187450280087f3e2795307a43826257e75b3ee4865c99a46c798b"
    );
    let sealed = nacl::seal(
        &host_proof::plaintext(&transcript, &[0x33; 32]),
        &[4; 24],
        &host.public,
        &ephemeral.secret,
    );
    assert_eq!(sealed.len(), 629);
    assert_eq!(
        sha256_hex(&sealed),
        "1b595c4f9260fb56a657f84a94ac363a1a666828de8edfd6d7d5c35ae3cc3a32"
    );
    let opened = nacl::open(&sealed, &[4; 24], &ephemeral.public, &host.secret).unwrap();
    assert_eq!(opened, host_proof::plaintext(&transcript, &[0x33; 32]));
    let proof_b64 = "hXGe8tQ0FL78jK6/uRoU9+IP1X6v904TIH7mmZtaUVM=";
    assert_eq!(
        std_encode(&host_proof::expected_proof(&[0x33; 32], &transcript)),
        proof_b64
    );

    // The same through the issuing and answering helpers.
    let random = ChallengeRandomness {
        ephemeral_secret: [0x22; 32],
        nonce: [4; 24],
        challenge_secret: [0x33; 32],
        challenge_id: "challenge-2".into(),
    };
    let issued = issue_host_challenge_with(&binding, T0, &random);
    assert_eq!(
        std_decode_canonical(&issued.frame.ciphertext_b64).unwrap(),
        sealed
    );
    assert_eq!(issued.frame.expires_at, T0 + 10_000);
    let proof = answer_host_challenge(&host.secret, &issued.frame, &binding, T0 + 1).unwrap();
    assert_eq!(std_encode(&proof), proof_b64);
    assert!(issued.verify_ack("challenge-2", proof_b64, T0 + 2));
}

#[test]
fn push_vector() {
    let host = X25519Keypair::from_secret(seq(0x01));
    assert_eq!(
        std_encode(&host.public),
        "B6N8vBQgk8i3VdwbEOhstCY3StFqqFPtC9/AsrhtHHw="
    );
    assert_eq!(
        decode_key32("AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="),
        Some(host.secret)
    );
    assert_eq!(relay_host_id(&host.public), "qqj_9wO1CyKX9Pbh");
    let ephemeral = X25519Keypair::from_secret(seq(0x21));
    assert_eq!(
        std_encode(&ephemeral.public),
        "WGmv9FBUlzLLqu1eXfmzCm2jHLDldCutWtShp2jxpns="
    );
    assert_eq!(
        std_encode(&seq::<32>(0x61)),
        "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4A="
    );

    let origin = "https://push.example.test";
    let challenge_id = "0b7e4c2a-5d1f-4e8b-9a3c-6f2d8e1b7a40";
    let issued_at: i64 = 1_767_225_600_000;
    let context = PushProofContext {
        gateway_origin: origin.into(),
        gateway_ephemeral_public: ephemeral.public,
        nonce: seq(0x41),
        challenge_id: challenge_id.into(),
        issued_at: 1_767_225_600_000,
        expires_at: 1_767_225_610_000,
        host_fingerprint: "qqj_9wO1CyKX9Pbh".into(),
        host_public: host.public,
    };
    let transcript = context.transcript();
    assert_eq!(transcript.len(), 408);
    assert_eq!(
        url_encode(&transcript),
        concat!(
            "AAAACHByb3RvY29sAAAAF29yY2EtcHVzaC1ob3N0LXByb29mL3YxAAAAB3ZlcnNpb24AAAABAQAAAA1nYXRld2F5T3JpZ2luAAAA",
            "GWh0dHBzOi8vcHVzaC5leGFtcGxlLnRlc3QAAAAZZ2F0ZXdheUVwaGVtZXJhbFB1YmxpY0tleQAAACBYaa_0UFSXMsuq7V5d-bMK",
            "baMcsOV0K61a1KGnaPGmewAAAA5jaGFsbGVuZ2VOb25jZQAAABhBQkNERUZHSElKS0xNTk9QUVJTVFVWV1gAAAALY2hhbGxlbmdl",
            "SWQAAAAkMGI3ZTRjMmEtNWQxZi00ZThiLTlhM2MtNmYyZDhlMWI3YTQwAAAACGlzc3VlZEF0AAAACAAAAZt22qgAAAAACWV4cGly",
            "ZXNBdAAAAAgAAAGbdtrPEAAAAA9ob3N0RmluZ2VycHJpbnQAAAAQcXFqXzl3TzFDeUtYOVBiaAAAAA1ob3N0UHVibGljS2V5AAAA",
            "IAejfLwUIJPIt1XcGxDobLQmN0rRaqhT7QvfwLK4bRx8",
        )
    );
    assert_eq!(
        sha256_hex(&transcript),
        "724f0a048023cd4d4b00328df3ee666606ba960dbf237f10f9fa9db18259620c"
    );
    let plaintext = push_proof::plaintext(&transcript, &seq(0x61));
    assert_eq!(plaintext.len(), 472);
    assert_eq!(
        sha256_hex(&plaintext),
        "6c30a1d1a606966fc3f49bba7ba95d2c8c4cc729baa8b1d3ba932ba4af069e33"
    );

    let random = ChallengeRandomness {
        ephemeral_secret: seq(0x21),
        nonce: seq(0x41),
        challenge_secret: seq(0x61),
        challenge_id: challenge_id.into(),
    };
    let (response, secret_hash) =
        issue_push_challenge_with(origin, &host.public, issued_at, &random);
    assert_eq!(response.challenge_id, challenge_id);
    assert_eq!(
        response.gateway_ephemeral_public_key_b64,
        "WGmv9FBUlzLLqu1eXfmzCm2jHLDldCutWtShp2jxpns="
    );
    assert_eq!(response.nonce_b64, "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY");
    assert_eq!(response.expires_at, 1_767_225_610_000);
    let sealed = std_decode_canonical(&response.ciphertext_b64).unwrap();
    assert_eq!(sealed.len(), 488);
    assert_eq!(
        sha256_hex(&sealed),
        "0707378218aea2f56d54b0d5483e4764b4d7bd4daa7ea5a61e43bbe6df02d6ff"
    );
    assert_eq!(
        response.ciphertext_b64,
        concat!(
            "cnPvIdDmow6NtK3Qt9DscwyFk1I4Ae8+ITA2iZEI44CLFmIuSA3j6PLtJMifRkkvIWCvdis5qoJLOlO+sP+yXMlNNQH6dZPlPp1z",
            "MDVKKjVE9cJAHly9NsDQs5OvgKiyGfZIcBsZWkCjEZE3EPkPCFAV2r9m3Vdo0N0AYGYYN+x3PUG2IkDOEbcdARI/gaKzA3SzoN6b",
            "IRsAaUSR7hhgC442SfmJMr7qOM3mGvulbbEVmxjuITBADfy0S/9bNzJOXw+bf62175jzO01hJIoB4up4ZrXeriJvPJvGpk+zTYdk",
            "poBVKCQvnKEYxFteE4kbsm2H+QmENFocfNHEaDeU7KAujrJXU9vjz/e/ByZb6SoYT8m7QLKbMeHZZgWVd25d5aMS2I5zjw6Ppr6k",
            "wEkWAgi4UnT7AkqJ8nbCBMyI/lEq7p0xz3I0VQLv7cjaRjHr/WZFKk/EB37PvPitWl2Sl1ks+/zH1P3k8vxVI0qF+s2ETKTapJtX",
            "0yCTmk7V3zotjMPZK3SkZrHPsfOfs/cqbegtLJKSv0CggORqDL9WVttmcCVAw0ztVx4KCiMxpo/xTXiHsCmhhAoi0id+dPuvjSel",
            "72IVjxuBSwd+mQ9/wmszoTxXdWeGathNCi31YvIvpTRCyNnFLDo=",
        )
    );
    assert_eq!(secret_hash, "VrqJezT_4dry8mHbyKVeVYz4MGtIlazDvrD1HBzYUL0");

    let proof = answer_push_challenge(&host.secret, origin, &response, issued_at).unwrap();
    let proof_b64 = std_encode(&proof);
    assert_eq!(proof_b64, "e3cFfP3o64AwWVR7l1LmhFOnCg6p3++1aXXtc6wdvfQ=");
    assert_eq!(push_proof::secret_hash(&proof), secret_hash);
    assert!(push_proof::proof_matches_secret_hash(
        &proof_b64,
        &secret_hash
    ));
}

/// crypto_box interoperability with libsodium. Produced with PyNaCl 1.6.2:
/// ```text
/// from nacl.public import PrivateKey, Box
/// s = PrivateKey(bytes([0xa1]*32)); r = PrivateKey(bytes([0xb2]*32))
/// c = Box(s, r.public_key).encrypt(b'orca-relay nacl interop vector', bytes(range(24))).ciphertext
/// print(c.hex())
/// ```
#[test]
fn libsodium_box_vector() {
    let boxed = "23e2085f56d4c40dba89bba9746f1901af7363a803e83facf245f20dceacea993588df643a0e49209a3ebb73052d";
    let sender = X25519Keypair::from_secret([0xa1; 32]);
    let recipient = X25519Keypair::from_secret([0xb2; 32]);
    let nonce: [u8; 24] = seq(0);
    let message = b"orca-relay nacl interop vector";
    assert_eq!(
        hex(&nacl::seal(
            message,
            &nonce,
            &recipient.public,
            &sender.secret
        )),
        boxed
    );
    assert_eq!(
        nacl::open(&unhex(boxed), &nonce, &sender.public, &recipient.secret).as_deref(),
        Some(&message[..])
    );
}

#[tokio::test]
async fn host_token_round_trip() {
    let k = self_hosted_key("0123456789abcdef0123456789abcdef");
    let (token, expires_at) = mint_host_token(
        &k,
        "self-hosted",
        "https://relay.example.test",
        "0Zvz8IJ4LIe3g_5x",
        T0,
    );
    assert_eq!(expires_at, 1_700_000_900_000);
    let header = format!("Bearer {token}");
    let bearer = verify_bearer_header(&header).unwrap();
    let verifier = HostTokenVerifier::new(k, None);
    let claims = verifier.verify(bearer, T0).await.unwrap();
    assert_eq!(claims.sub, "self-hosted");
    assert_eq!(claims.relay_host_id, "0Zvz8IJ4LIe3g_5x");
    assert!(verifier.verify(bearer, expires_at).await.is_err());
    let other =
        HostTokenVerifier::new(self_hosted_key("another key, at least 32 bytes long"), None);
    assert!(other.verify(bearer, T0).await.is_err());
}

#[test]
fn cluster_token_and_lease_round_trip() {
    let token = mint_cluster_token(b"cluster key of at least 32 bytes!!", "director", T0);
    assert_eq!(
        verify_cluster_token(b"cluster key of at least 32 bytes!!", &token, T0).unwrap(),
        "director"
    );
    assert!(verify_cluster_token(b"another cluster key of 32 bytes!!!", &token, T0).is_err());

    let key = "0123456789abcdef0123456789abcdef";
    let lease = mint_assignment_lease(
        key,
        "https://d.test",
        "u",
        "local",
        "https://c.test",
        3,
        "0Zvz8IJ4LIe3g_5x",
        T0,
    );
    let claims = verify_assignment_lease(key, &lease, T0).unwrap();
    assert_eq!(
        (claims.cell_id.as_str(), claims.assignment_epoch),
        ("local", 3)
    );
    assert_eq!(claims.exp - claims.iat, 300);
}
