//! NaCl `crypto_box` (Curve25519-XSalsa20-Poly1305), byte-compatible with libsodium `crypto_box_easy`:
//! the 16-byte Poly1305 tag comes first, then the encrypted plaintext. Host challenges (docs/reference/websocket.md
//!, docs/reference/http.md) are sealed this way so any libsodium/TweetNaCl client can open them.

use std::fmt;

use crypto_box::aead::Aead;
use crypto_box::SalsaBox;
use rand::rngs::OsRng;
use x25519_dalek::{PublicKey, StaticSecret};

/// Poly1305 tag length prepended to every box.
pub const BOX_OVERHEAD: usize = 16;

/// An X25519 key pair held as raw bytes. `Debug` shows only the public half.
#[derive(Clone)]
pub struct X25519Keypair {
    pub secret: [u8; 32],
    pub public: [u8; 32],
}

impl X25519Keypair {
    /// Fresh key pair from the OS CSPRNG.
    pub fn generate() -> Self {
        Self::from_secret(StaticSecret::random_from_rng(OsRng).to_bytes())
    }

    /// Key pair for a known secret (clamping happens inside the scalar multiplication, as in libsodium).
    pub fn from_secret(secret: [u8; 32]) -> Self {
        Self {
            secret,
            public: public_key(&secret),
        }
    }
}

impl fmt::Debug for X25519Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("X25519Keypair")
            .field("public", &super::b64::std_encode(&self.public))
            .finish_non_exhaustive()
    }
}

/// X25519 public key of `secret`.
pub fn public_key(secret: &[u8; 32]) -> [u8; 32] {
    PublicKey::from(&StaticSecret::from(*secret)).to_bytes()
}

fn salsa_box(their_public: &[u8; 32], our_secret: &[u8; 32]) -> SalsaBox {
    SalsaBox::new(
        &crypto_box::PublicKey::from(*their_public),
        &crypto_box::SecretKey::from(*our_secret),
    )
}

/// True when the X25519 shared secret is not all-zero (libsodium refuses low-order peer keys).
fn contributory(their_public: &[u8; 32], our_secret: &[u8; 32]) -> bool {
    StaticSecret::from(*our_secret)
        .diffie_hellman(&PublicKey::from(*their_public))
        .was_contributory()
}

/// `crypto_box_easy`: returns `tag(16) ‖ ciphertext`, `plaintext.len() + 16` bytes.
pub fn seal(
    plaintext: &[u8],
    nonce: &[u8; 24],
    recipient_pk: &[u8; 32],
    sender_sk: &[u8; 32],
) -> Vec<u8> {
    salsa_box(recipient_pk, sender_sk)
        .encrypt(nonce.into(), plaintext)
        .expect("crypto_box encryption without associated data cannot fail")
}

/// `crypto_box_open_easy`: `None` when the tag does not verify, the box is shorter than the tag, or the
/// sender key is of low order.
pub fn open(
    ciphertext: &[u8],
    nonce: &[u8; 24],
    sender_pk: &[u8; 32],
    recipient_sk: &[u8; 32],
) -> Option<Vec<u8>> {
    if ciphertext.len() < BOX_OVERHEAD || !contributory(sender_pk, recipient_sk) {
        return None;
    }
    salsa_box(sender_pk, recipient_sk)
        .decrypt(nonce.into(), ciphertext)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::ident::hex;

    fn unhex(s: &str) -> Vec<u8> {
        data_encoding::HEXLOWER.decode(s.as_bytes()).unwrap()
    }

    // Produced with PyNaCl 1.6.2 (libsodium):
    //   from nacl.public import PrivateKey, Box
    //   s = PrivateKey(bytes([0xa1]*32)); r = PrivateKey(bytes([0xb2]*32))
    //   c = Box(s, r.public_key).encrypt(b'orca-relay nacl interop vector', bytes(range(24))).ciphertext
    //   print(bytes(s.public_key).hex(), bytes(r.public_key).hex(), c.hex())
    const SENDER_PK: &str = "c306fb0ef2bf8b7f93bad98155fa37daec74db0c4cbeda6c6f1dba9d36558252";
    const RECIPIENT_PK: &str = "db48257e1237976a74ad8cfedca00213408fe89ac6251f1b930245f242b5c31a";
    const BOX: &str = "23e2085f56d4c40dba89bba9746f1901af7363a803e83facf245f20dceacea993588df643a0e49209a3ebb73052d";
    const MESSAGE: &[u8] = b"orca-relay nacl interop vector";

    fn nonce() -> [u8; 24] {
        std::array::from_fn(|i| i as u8)
    }

    #[test]
    fn matches_libsodium_crypto_box_easy() {
        let sender = X25519Keypair::from_secret([0xa1; 32]);
        let recipient = X25519Keypair::from_secret([0xb2; 32]);
        assert_eq!(hex(&sender.public), SENDER_PK);
        assert_eq!(hex(&recipient.public), RECIPIENT_PK);
        let sealed = seal(MESSAGE, &nonce(), &recipient.public, &sender.secret);
        assert_eq!(sealed.len(), MESSAGE.len() + BOX_OVERHEAD);
        assert_eq!(hex(&sealed), BOX);
        let opened = open(&unhex(BOX), &nonce(), &sender.public, &recipient.secret);
        assert_eq!(opened.as_deref(), Some(MESSAGE));
    }

    #[test]
    fn open_rejects_tampering_and_wrong_keys() {
        let sender = X25519Keypair::from_secret([0xa1; 32]);
        let recipient = X25519Keypair::from_secret([0xb2; 32]);
        let mut boxed = unhex(BOX);
        boxed[20] ^= 1;
        assert_eq!(
            open(&boxed, &nonce(), &sender.public, &recipient.secret),
            None
        );
        let boxed = unhex(BOX);
        assert_eq!(
            open(&boxed, &[0; 24], &sender.public, &recipient.secret),
            None
        );
        assert_eq!(
            open(&boxed, &nonce(), &recipient.public, &recipient.secret),
            None
        );
        assert_eq!(
            open(&boxed[..15], &nonce(), &sender.public, &recipient.secret),
            None
        );
        // Low-order peer key (all zero) gives an all-zero shared secret: refused like libsodium.
        let weak = seal(b"x", &nonce(), &[0; 32], &sender.secret);
        assert_eq!(open(&weak, &nonce(), &[0; 32], &recipient.secret), None);
    }

    #[test]
    fn generated_pairs_round_trip() {
        let a = X25519Keypair::generate();
        let b = X25519Keypair::generate();
        assert_ne!(a.secret, b.secret);
        assert_eq!(X25519Keypair::from_secret(a.secret).public, a.public);
        let sealed = seal(b"hi", &[9; 24], &b.public, &a.secret);
        assert_eq!(
            open(&sealed, &[9; 24], &a.public, &b.secret).unwrap(),
            b"hi"
        );
        assert!(!format!("{a:?}").contains(&hex(&a.secret)));
    }
}
