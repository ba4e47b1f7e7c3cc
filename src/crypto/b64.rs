//! Canonical base64 helpers.
//!
//! Every key, nonce and secret on the wire has exactly one accepted spelling (docs/reference/http.md, docs/reference/websocket.md):
//! decoders check the alphabet and length first, then re-encode and compare, so non-zero padding bits and
//! alternative spellings never reach the rest of the system.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;

/// Padded standard base64 (`Key32`, `ciphertextB64`, `proofB64`).
pub fn std_encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Unpadded base64url (`B64u32`, hashes, JWT parts).
pub fn url_encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn is_std_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'+' || c == b'/'
}

fn is_url_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}

/// Decodes canonical padded standard base64 of any length (re-encoding must reproduce `text`).
pub fn std_decode_canonical(text: &str) -> Option<Vec<u8>> {
    let bytes = STANDARD.decode(text).ok()?;
    (std_encode(&bytes) == text).then_some(bytes)
}

/// Decodes canonical unpadded base64url of any length (re-encoding must reproduce `text`).
pub fn url_decode_canonical(text: &str) -> Option<Vec<u8>> {
    let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
    (url_encode(&bytes) == text).then_some(bytes)
}

/// `Key32`: `^[A-Za-z0-9+/]{43}=$`, 32 bytes, canonical (public keys, proofs).
pub fn decode_key32(text: &str) -> Option<[u8; 32]> {
    let b = text.as_bytes();
    if b.len() != 44 || b[43] != b'=' || !b[..43].iter().all(|&c| is_std_char(c)) {
        return None;
    }
    std_decode_canonical(text)?.try_into().ok()
}

/// `Nonce24`: `^[A-Za-z0-9+/]{32}$`, 24 bytes.
pub fn decode_nonce24(text: &str) -> Option<[u8; 24]> {
    let b = text.as_bytes();
    if b.len() != 32 || !b.iter().all(|&c| is_std_char(c)) {
        return None;
    }
    std_decode_canonical(text)?.try_into().ok()
}

/// `B64u32`: `^[A-Za-z0-9_-]{43}$`, 32 bytes, canonical (tokens, tickets, secrets, hashes).
pub fn decode_b64u32(text: &str) -> Option<[u8; 32]> {
    let b = text.as_bytes();
    if b.len() != 43 || !b.iter().all(|&c| is_url_char(c)) {
        return None;
    }
    url_decode_canonical(text)?.try_into().ok()
}

/// True when `text` is a canonical `B64u32`.
pub fn is_b64u32(text: &str) -> bool {
    decode_b64u32(text).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key32_round_trip_and_rejections() {
        let key = [7u8; 32];
        let text = std_encode(&key);
        assert_eq!(text.len(), 44);
        assert_eq!(decode_key32(&text), Some(key));
        assert_eq!(decode_key32(&text[..43]), None, "missing padding");
        assert_eq!(decode_key32(&format!("{}=", &text[..42])), None, "short");
        assert_eq!(decode_key32(&url_encode(&[0xfb; 32])), None, "url alphabet");
        assert_eq!(decode_key32(&text.replace('B', "-")), None);
        // `…PxN=` differs from the canonical `…PxM=` only in the padding bits.
        assert_eq!(
            decode_key32("e06Qm75//kTEZaIgA31gjuNYl9Me+XLwf3SJLLD3PxN="),
            None
        );
        assert!(decode_key32("e06Qm75//kTEZaIgA31gjuNYl9Me+XLwf3SJLLD3PxM=").is_some());
    }

    #[test]
    fn nonce24() {
        let n = [4u8; 24];
        assert_eq!(std_encode(&n), "BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE");
        assert_eq!(decode_nonce24("BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE"), Some(n));
        assert_eq!(decode_nonce24("BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQ="), None);
        assert_eq!(decode_nonce24("BAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQ"), None);
        assert_eq!(decode_nonce24("BAQEBAQEBAQEBAQEBAQEBAQEBAQEBA-E"), None);
    }

    #[test]
    fn b64u32() {
        let t = "BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU";
        assert_eq!(decode_b64u32(t), Some([5u8; 32]));
        assert!(is_b64u32(t));
        assert!(
            !is_b64u32("BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQV"),
            "padding bits"
        );
        assert!(!is_b64u32(&format!("{t}=")));
        assert!(!is_b64u32(&t[..42]));
        assert!(!is_b64u32("BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB+U"));
        assert_eq!(url_encode(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn canonical_any_length() {
        assert_eq!(std_decode_canonical("AQID"), Some(vec![1, 2, 3]));
        assert_eq!(std_decode_canonical("AQI="), Some(vec![1, 2]));
        assert_eq!(std_decode_canonical("AQJ="), None);
        assert_eq!(std_decode_canonical("AQI"), None);
        assert_eq!(url_decode_canonical("AQI"), Some(vec![1, 2]));
        assert_eq!(url_decode_canonical("AQI="), None);
    }
}
