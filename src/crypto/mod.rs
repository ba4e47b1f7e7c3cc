//! Cryptography and identifiers: a pure leaf with no I/O except the JWKS fetch.
//!
//! - [`b64`]: canonical base64 spellings (`Key32`, `Nonce24`, `B64u32`).
//! - [`ident`]: `relayHostId`, host log digests, credential hashes, random tokens.
//! - [`ct`]: constant-time comparison.
//! - [`nacl`]: libsodium-compatible `crypto_box`.
//! - [`challenge`]: transcript framing shared by both host proofs.
//! - [`host_proof`]: the relay `host-challenge` (docs/reference/websocket.md).
//! - [`push_proof`]: the push gateway challenge (docs/reference/http.md).
//! - [`jwt`]: host tokens, cluster tokens and assignment leases.
//!
//! Nothing here logs keys, secrets, tokens or proofs; `Debug` on secret-holding types redacts them.

pub mod b64;
pub mod challenge;
pub mod ct;
pub mod host_proof;
pub mod ident;
pub mod jwt;
pub mod nacl;
pub mod push_proof;

pub use b64::{decode_b64u32, decode_key32, decode_nonce24, is_b64u32, std_encode, url_encode};
pub use challenge::{hmac_sha256, ChallengeRandomness};
pub use ct::{ct_eq, ct_eq_str};
pub use host_proof::{
    answer_host_challenge, issue_host_challenge, HostBinding, HostChallengeFrame, HostProofContext,
    IssuedChallenge,
};
pub use ident::{
    host_digest, is_relay_host_id, random_b64u32, relay_host_id, sha256, sha256_hex, token_hash,
};
pub use jwt::{
    mint_assignment_lease, mint_cluster_token, mint_host_token, self_hosted_key,
    verify_assignment_lease, verify_bearer_header, verify_cluster_token, HostClaims,
    HostTokenVerifier, JwksSource, TokenError,
};
pub use nacl::X25519Keypair;
pub use push_proof::{answer_push_challenge, issue_push_challenge, PushChallengeResponse};
