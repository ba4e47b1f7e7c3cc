//! Identifiers derived by hashing: `relayHostId`, the host log digest, credential hashes.
//!
//! These are the only forms in which keys, hosts and phone credentials are stored or logged
//! (docs/reference/http.md, docs/reference/websocket.md).

use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::b64::url_encode;

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(bytes)
}

/// Lowercase hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&sha256(data))
}

/// `relayHostId` = first 16 chars of unpadded base64url(SHA-256(public key)); also the push fingerprint.
pub fn relay_host_id(public_key: &[u8; 32]) -> String {
    let mut id = url_encode(&sha256(public_key));
    id.truncate(16);
    id
}

/// `^[A-Za-z0-9_-]{16}$`.
pub fn is_relay_host_id(text: &str) -> bool {
    text.len() == 16
        && text
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

/// First 12 lowercase hex chars of SHA-256(`relayHostId`): the only form in which a host appears in logs.
pub fn host_digest(relay_host_id: &str) -> String {
    let mut digest = sha256_hex(relay_host_id.as_bytes());
    digest.truncate(12);
    digest
}

/// Stored form of an invite or resume token: unpadded base64url(SHA-256(UTF-8 token text)).
pub fn token_hash(token: &str) -> String {
    url_encode(&sha256(token.as_bytes()))
}

/// 32 bytes from the OS CSPRNG as `B64u32` (tokens, tickets, resume secrets).
pub fn random_b64u32() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    url_encode(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::b64::{decode_key32, is_b64u32};

    #[test]
    fn token_hash_vector() {
        assert_eq!(
            token_hash("BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"),
            "iU41LR2MwQwwPfj9RaWe6XswhBvb9gtH-jF8f6TJWFk"
        );
    }

    #[test]
    fn relay_host_ids() {
        assert_eq!(relay_host_id(&[2; 32]), "dYd7tB05O1-4RVzm");
        let key = decode_key32("e06Qm75//kTEZaIgA31gjuNYl9Me+XLwf3SJLLD3PxM=").unwrap();
        assert_eq!(relay_host_id(&key), "0Zvz8IJ4LIe3g_5x");
        assert!(is_relay_host_id("dYd7tB05O1-4RVzm"));
        assert!(!is_relay_host_id("dYd7tB05O1-4RVz"));
        assert!(!is_relay_host_id("dYd7tB05O1-4RVz+"));
        assert!(!is_relay_host_id("dYd7tB05O1-4RVzmm"));
    }

    #[test]
    fn digests() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(host_digest("abc"), "ba7816bf8f01");
        assert_eq!(hex(&[0x00, 0xff, 0x10]), "00ff10");
    }

    #[test]
    fn random_tokens_are_canonical_and_distinct() {
        let a = random_b64u32();
        assert!(is_b64u32(&a));
        assert_ne!(a, random_b64u32());
    }
}
