//! Pieces shared by the relay host proof (docs/reference/websocket.md) and the push host proof (docs/reference/http.md):
//! length-prefixed transcripts, the challenge plaintext and MAC input framing, and the fresh random
//! inputs of a challenge.

use hmac::{Hmac, Mac};
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::Sha256;

use super::nacl::X25519Keypair;

/// Seconds of clock skew the *host* tolerates around a challenge (relay and gateway allow none).
pub const HOST_SKEW_MS: u64 = 30_000;
/// Lifetime of a challenge: `expiresAt` = `issuedAt` + 10 000.
pub const CHALLENGE_TTL_MS: u64 = 10_000;

/// `(issuedAt, expiresAt)` of a challenge issued at `now_ms` (a pre-1970 clock counts as 0).
pub fn challenge_times(now_ms: i64) -> (u64, u64) {
    let issued_at = u64::try_from(now_ms).unwrap_or(0);
    (issued_at, issued_at + CHALLENGE_TTL_MS)
}

/// A transcript time as the crate's `i64` epoch milliseconds.
pub fn epoch_ms(time: u64) -> i64 {
    i64::try_from(time).unwrap_or(i64::MAX)
}

/// The random inputs of one challenge. Fixed values are only for test vectors.
#[derive(Clone)]
pub struct ChallengeRandomness {
    pub ephemeral_secret: [u8; 32],
    pub nonce: [u8; 24],
    pub challenge_secret: [u8; 32],
    pub challenge_id: String,
}

impl ChallengeRandomness {
    /// Fresh ephemeral key, nonce and secret from the OS CSPRNG and a UUID v4 `challengeId`.
    pub fn generate() -> Self {
        let mut nonce = [0u8; 24];
        let mut challenge_secret = [0u8; 32];
        OsRng.fill_bytes(&mut nonce);
        OsRng.fill_bytes(&mut challenge_secret);
        Self {
            ephemeral_secret: X25519Keypair::generate().secret,
            nonce,
            challenge_secret,
            challenge_id: uuid::Uuid::new_v4().to_string(),
        }
    }
}

/// One transcript field as `(name, value)`.
pub type Field = (&'static str, Vec<u8>);

/// `u32be(len(name)) ‖ name ‖ u32be(len(value)) ‖ value` for every field, in order.
pub fn encode_fields(fields: &[Field]) -> Vec<u8> {
    let len = fields.iter().map(|(n, v)| 8 + n.len() + v.len()).sum();
    let mut out = Vec::with_capacity(len);
    for (name, value) in fields {
        put_prefixed(&mut out, name.as_bytes());
        put_prefixed(&mut out, value);
    }
    out
}

fn put_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("transcript field longer than 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

fn take_prefixed<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let (len, tail) = rest.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
    if tail.len() < len {
        return None;
    }
    let (value, tail) = tail.split_at(len);
    *rest = tail;
    Some(value)
}

/// Splits a transcript into `(name, value)` pairs; `None` on truncation or trailing bytes.
pub fn parse_fields(mut transcript: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut fields = Vec::new();
    while !transcript.is_empty() {
        let name = take_prefixed(&mut transcript)?;
        let value = take_prefixed(&mut transcript)?;
        fields.push((name, value));
    }
    Some(fields)
}

/// Host side: requires exactly the expected fields by name, order and value.
pub fn check_fields(actual: &[(&[u8], &[u8])], expected: &[Field]) -> Result<(), String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "transcript has {} fields, expected {}",
            actual.len(),
            expected.len()
        ));
    }
    for ((name, value), (want_name, want_value)) in actual.iter().zip(expected) {
        if *name != want_name.as_bytes() {
            return Err(format!(
                "transcript field `{want_name}` missing or out of order"
            ));
        }
        if *value != want_value.as_slice() {
            return Err(format!("transcript field `{want_name}` mismatch"));
        }
    }
    Ok(())
}

/// Reads the u64be value of field `index`, which must be named `name`.
pub fn u64_field(fields: &[(&[u8], &[u8])], index: usize, name: &str) -> Result<u64, String> {
    match fields.get(index) {
        Some((n, v)) if *n == name.as_bytes() => <[u8; 8]>::try_from(*v)
            .map(u64::from_be_bytes)
            .map_err(|_| format!("transcript field `{name}` is not 8 bytes")),
        _ => Err(format!("transcript field `{name}` missing or out of order")),
    }
}

/// `domain ‖ 0x00 ‖ u32be(len(transcript)) ‖ transcript ‖ secret`.
pub fn plaintext(domain: &str, transcript: &[u8], secret: &[u8; 32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(domain.len() + 5 + transcript.len() + 32);
    out.extend_from_slice(domain.as_bytes());
    out.push(0);
    put_prefixed(&mut out, transcript);
    out.extend_from_slice(secret);
    out
}

/// Inverse of [`plaintext`]: exact prefix, exactly `len` transcript bytes, exactly 32 secret bytes.
pub fn split_plaintext<'a>(
    domain: &str,
    plaintext: &'a [u8],
) -> Result<(&'a [u8], [u8; 32]), String> {
    let mut rest = plaintext
        .strip_prefix(domain.as_bytes())
        .and_then(|r| r.strip_prefix(&[0]))
        .ok_or("challenge plaintext has the wrong domain prefix")?;
    let transcript = take_prefixed(&mut rest).ok_or("challenge plaintext is truncated")?;
    let secret = <[u8; 32]>::try_from(rest)
        .map_err(|_| "challenge secret is not exactly 32 bytes".to_string())?;
    Ok((transcript, secret))
}

/// `protocol ‖ 0x00 ‖ "ack" ‖ 0x00 ‖ transcript`.
pub fn mac_input(protocol: &str, transcript: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(protocol.len() + 5 + transcript.len());
    out.extend_from_slice(protocol.as_bytes());
    out.extend_from_slice(b"\0ack\0");
    out.extend_from_slice(transcript);
    out
}

/// HMAC-SHA256(key, message).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// Host-side freshness: `issuedAt ≤ expiresAt ≤ issuedAt + 10 000` and
/// `issuedAt − 30 000 ≤ now ≤ expiresAt + 30 000`.
pub fn check_freshness(issued_at: u64, expires_at: u64, now_ms: i64) -> Result<(), String> {
    if expires_at < issued_at || expires_at - issued_at > CHALLENGE_TTL_MS {
        return Err("challenge validity window is invalid".into());
    }
    let (now, skew) = (i128::from(now_ms), i128::from(HOST_SKEW_MS));
    if now < i128::from(issued_at) - skew || now > i128::from(expires_at) + skew {
        return Err("challenge is not fresh".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let fields: Vec<Field> = vec![("a", vec![1, 2]), ("bc", vec![])];
        let bytes = encode_fields(&fields);
        assert_eq!(
            bytes,
            [0, 0, 0, 1, b'a', 0, 0, 0, 2, 1, 2, 0, 0, 0, 2, b'b', b'c', 0, 0, 0, 0]
        );
        let parsed = parse_fields(&bytes).unwrap();
        assert!(check_fields(&parsed, &fields).is_ok());
        assert!(parse_fields(&bytes[..bytes.len() - 1]).is_none());
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(parse_fields(&trailing).is_none());
        let other: Vec<Field> = vec![("a", vec![1, 3]), ("bc", vec![])];
        assert!(check_fields(&parsed, &other)
            .unwrap_err()
            .contains("`a` mismatch"));
        let renamed: Vec<Field> = vec![("a", vec![1, 2]), ("bd", vec![])];
        assert!(check_fields(&parsed, &renamed).is_err());
        assert!(check_fields(&parsed, &fields[..1]).is_err());
    }

    #[test]
    fn plaintext_round_trip_is_strict() {
        let pt = plaintext("dom", b"tr", &[9; 32]);
        assert_eq!(pt.len(), 3 + 1 + 4 + 2 + 32);
        assert_eq!(split_plaintext("dom", &pt).unwrap(), (&b"tr"[..], [9; 32]));
        assert!(split_plaintext("dam", &pt).is_err());
        assert!(split_plaintext("dom", &pt[..pt.len() - 1]).is_err());
        let mut long = pt.clone();
        long.push(1);
        assert!(split_plaintext("dom", &long).is_err());
    }

    #[test]
    fn freshness_bounds() {
        let (t, n) = (1_000_000u64, 1_000_000i64);
        assert!(check_freshness(t, t + 10_000, n).is_ok());
        assert!(check_freshness(t, t + 10_000, n - 30_000).is_ok());
        assert!(check_freshness(t, t + 10_000, n - 30_001).is_err());
        assert!(check_freshness(t, t + 10_000, n + 40_000).is_ok());
        assert!(check_freshness(t, t + 10_000, n + 40_001).is_err());
        assert!(check_freshness(t, t + 10_001, n).is_err());
        assert!(check_freshness(t, t - 1, n).is_err());
        assert!(check_freshness(10, 20, -5).is_ok());
    }

    #[test]
    fn hmac_rfc4231_case_2() {
        assert_eq!(
            crate::crypto::ident::hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
