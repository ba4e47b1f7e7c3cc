//! JSON Web Tokens: host tokens (docs/reference/http.md), cluster tokens (docs/reference/http.md) and assignment leases
//! (docs/reference/http.md).
//!
//! Signatures (HS256 and ES256) are computed and checked by `jsonwebtoken`. Kept by hand, because
//! the library's decoder is laxer than the protocol: the compact form (exactly three parts, each
//! canonical unpadded base64url), JSON parts without duplicate keys, the header's field types and
//! `crit`, the algorithm allow-list per key source, `aud` string-or-array, `exp`/`nbf` without
//! leeway and the claim lengths. Minting writes the header text verbatim, because the library's
//! `Header` serialises `typ` before `alg` and the spec fixes the bytes.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::b64::{url_decode_canonical, url_encode};
use super::challenge::hmac_sha256;
use super::ident::{is_relay_host_id, sha256_hex};

/// `aud` of host tokens.
pub const HOST_AUDIENCE: &str = "orca-relay";
/// `purpose` of host tokens.
pub const HOST_PURPOSE: &str = "host-control";
/// `aud` of node-to-node tokens.
pub const CLUSTER_AUDIENCE: &str = "orca-relay-cluster";
/// `aud` of assignment leases.
pub const LEASE_AUDIENCE: &str = "orca-relay-cell";
/// `purpose` of assignment leases.
pub const LEASE_PURPOSE: &str = "cell-assignment";
/// HMAC message deriving the self-hosted host-token key from the assignment signing key.
pub const SELF_HOSTED_KEY_LABEL: &str = "orca-self-hosted-relay-host-control-v1";
/// Self-hosted host token lifetime (s).
pub const HOST_TOKEN_TTL_S: i64 = 900;
/// Cluster token lifetime as minted (s).
pub const CLUSTER_TOKEN_TTL_S: i64 = 30;
/// Furthest a cluster token's `exp` may be ahead of the verifier's clock (ms).
pub const CLUSTER_TOKEN_MAX_AHEAD_MS: i64 = 60_000;
/// Assignment lease lifetime (s).
pub const LEASE_TTL_S: i64 = 300;
/// Longest accepted bearer token (chars).
pub const MAX_TOKEN_CHARS: usize = 8192;
/// JWKS fetch timeout.
pub const JWKS_TIMEOUT: Duration = Duration::from_secs(2);
/// Minimum spacing of JWKS fetches triggered by unknown `kid`s.
pub const JWKS_REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// Largest accepted JWKS document.
const MAX_JWKS_BYTES: usize = 1 << 20;

const HS256_HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

/// Why a token was refused. Every variant maps to 401 `invalid_token`; the variant is for logs and tests
/// and never carries token material.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenError {
    /// Not three canonical base64url parts of JSON objects, or too long.
    Malformed,
    /// `alg` not accepted for this token kind (including `none`).
    Algorithm,
    /// Signature does not verify.
    Signature,
    /// No JWKS entry (or lease `kid`) matches.
    UnknownKey,
    /// The JWKS could not be fetched and no keys are cached.
    KeysUnavailable,
    /// `exp` missing, not a number or not in the future (cluster: too far ahead).
    Expired,
    /// `nbf` in the future.
    NotYetValid,
    Audience,
    Issuer,
    Purpose,
    /// The named claim is missing, of the wrong type or out of range.
    Claim(&'static str),
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed => f.write_str("malformed token"),
            Self::Algorithm => f.write_str("algorithm not accepted"),
            Self::Signature => f.write_str("bad signature"),
            Self::UnknownKey => f.write_str("unknown signing key"),
            Self::KeysUnavailable => f.write_str("signing keys unavailable"),
            Self::Expired => f.write_str("token expired"),
            Self::NotYetValid => f.write_str("token not yet valid"),
            Self::Audience => f.write_str("wrong audience"),
            Self::Issuer => f.write_str("wrong issuer"),
            Self::Purpose => f.write_str("wrong purpose"),
            Self::Claim(name) => write!(f, "invalid claim `{name}`"),
        }
    }
}

impl std::error::Error for TokenError {}

/// `^Bearer ([^\s]+)$` with the 8 192-char limit on the token; `None` counts as a missing bearer.
pub fn verify_bearer_header(value: &str) -> Option<&str> {
    let token = value.strip_prefix("Bearer ")?;
    let ok = !token.is_empty()
        && !token.chars().any(char::is_whitespace)
        && token.chars().count() <= MAX_TOKEN_CHARS;
    ok.then_some(token)
}

/// K = HMAC-SHA256(key = UTF-8 `ORCA_RELAY_ASSIGNMENT_SIGNING_KEY`, `orca-self-hosted-relay-host-control-v1`).
pub fn self_hosted_key(assignment_signing_key: &str) -> [u8; 32] {
    hmac_sha256(
        assignment_signing_key.as_bytes(),
        SELF_HOSTED_KEY_LABEL.as_bytes(),
    )
}

// ---------------------------------------------------------------------------------------------------
// Compact JWS plumbing

struct Jwt<'a> {
    header: Map<String, Value>,
    claims: Map<String, Value>,
    signing_input: &'a str,
    signature_b64: &'a str,
}

impl Jwt<'_> {
    fn alg(&self) -> Option<&str> {
        self.header.get("alg").and_then(Value::as_str)
    }

    fn kid(&self) -> Result<Option<&str>, TokenError> {
        match self.header.get("kid") {
            None => Ok(None),
            Some(Value::String(kid)) => Ok(Some(kid)),
            Some(_) => Err(TokenError::Malformed),
        }
    }

    fn verify_hs256(&self, key: &[u8]) -> Result<(), TokenError> {
        if self.alg() != Some("HS256") {
            return Err(TokenError::Algorithm);
        }
        let valid = jsonwebtoken::crypto::verify(
            self.signature_b64,
            self.signing_input.as_bytes(),
            &DecodingKey::from_secret(key),
            Algorithm::HS256,
        )
        .unwrap_or(false);
        valid.then_some(()).ok_or(TokenError::Signature)
    }
}

fn json_part(part: &str) -> Result<Map<String, Value>, TokenError> {
    let bytes = url_decode_canonical(part).ok_or(TokenError::Malformed)?;
    // The strict parser: a duplicate key (which JSON parsers resolve differently) is malformed.
    match crate::contract::strict::parse_value(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(TokenError::Malformed),
    }
}

fn parse(token: &str) -> Result<Jwt<'_>, TokenError> {
    if token.len() > MAX_TOKEN_CHARS {
        return Err(TokenError::Malformed);
    }
    let (signing_input, signature_b64) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
    let (header_b64, claims_b64) = signing_input.split_once('.').ok_or(TokenError::Malformed)?;
    let header = json_part(header_b64)?;
    // We implement no JWS extensions, so any critical one must be refused (RFC 7515).
    if header.contains_key("crit") {
        return Err(TokenError::Malformed);
    }
    // `alg`, `typ` and `kid` are strings when present (RFC 7515); a missing `alg` is an
    // algorithm refusal, checked by the verifier.
    if ["alg", "typ", "kid"]
        .iter()
        .any(|k| header.get(*k).is_some_and(|v| !v.is_string()))
    {
        return Err(TokenError::Malformed);
    }
    let claims = json_part(claims_b64)?;
    // Canonical base64url here too, so one signature has one spelling.
    url_decode_canonical(signature_b64).ok_or(TokenError::Malformed)?;
    Ok(Jwt {
        header,
        claims,
        signing_input,
        signature_b64,
    })
}

fn sign_hs256(key: &[u8], header_json: &str, claims: &impl Serialize) -> String {
    let claims = serde_json::to_vec(claims).expect("claims serialize to JSON");
    let mut token = format!(
        "{}.{}",
        url_encode(header_json.as_bytes()),
        url_encode(&claims)
    );
    let signature = jsonwebtoken::crypto::sign(
        token.as_bytes(),
        &EncodingKey::from_secret(key),
        Algorithm::HS256,
    )
    .expect("HMAC accepts any key length");
    token.push('.');
    token.push_str(&signature);
    token
}

/// A NumericDate claim in epoch milliseconds, rounded up (so `now < exp·1000` and `nbf·1000 ≤ now` stay
/// exact for integer `now`). `None` when absent; `Err` when not a number.
fn time_claim_ms(
    claims: &Map<String, Value>,
    name: &'static str,
) -> Result<Option<i128>, TokenError> {
    let Some(value) = claims.get(name) else {
        return Ok(None);
    };
    if let Some(seconds) = value.as_i64() {
        return Ok(Some(i128::from(seconds) * 1000));
    }
    match value.as_f64() {
        Some(seconds) if seconds.is_finite() => Ok(Some((seconds * 1000.0).ceil() as i128)),
        _ => Err(TokenError::Claim(name)),
    }
}

fn check_expiry(claims: &Map<String, Value>, now_ms: i64) -> Result<i128, TokenError> {
    let exp_ms = time_claim_ms(claims, "exp")
        .map_err(|_| TokenError::Expired)?
        .ok_or(TokenError::Expired)?;
    if i128::from(now_ms) >= exp_ms {
        return Err(TokenError::Expired);
    }
    if time_claim_ms(claims, "nbf")?.is_some_and(|nbf_ms| nbf_ms > i128::from(now_ms)) {
        return Err(TokenError::NotYetValid);
    }
    Ok(exp_ms)
}

fn string_claim<'a>(
    claims: &'a Map<String, Value>,
    name: &'static str,
    max_chars: usize,
) -> Result<&'a str, TokenError> {
    match claims.get(name) {
        Some(Value::String(s)) if (1..=max_chars).contains(&s.chars().count()) => Ok(s),
        _ => Err(TokenError::Claim(name)),
    }
}

fn seconds_claim(claims: &Map<String, Value>, name: &'static str) -> Option<i64> {
    let value = claims.get(name)?;
    value
        .as_i64()
        .or_else(|| value.as_f64().map(|s| s.floor() as i64))
}

// ---------------------------------------------------------------------------------------------------
// Host tokens

/// Verified host-token claims. `org` is `None` when absent; `exp`/`iat` are epoch seconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostClaims {
    pub sub: String,
    pub prof: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<String>,
    #[serde(rename = "relayHostId")]
    pub relay_host_id: String,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    pub iss: String,
}

#[derive(Serialize)]
struct MintedHostClaims<'a> {
    sub: &'a str,
    prof: &'a str,
    iss: &'a str,
    #[serde(rename = "relayHostId")]
    relay_host_id: &'a str,
    purpose: &'a str,
    aud: &'a str,
    iat: i64,
    exp: i64,
}

/// Self-hosted host token (docs/reference/http.md): HS256 with K, `exp` = ⌊now/1000⌋ + 900, no `org`.
/// Returns the JWT and `expiresAt` = `exp`·1000.
pub fn mint_host_token(
    k: &[u8; 32],
    user_id: &str,
    public_url: &str,
    relay_host_id: &str,
    now_ms: i64,
) -> (String, i64) {
    let iat = now_ms.div_euclid(1000);
    let exp = iat + HOST_TOKEN_TTL_S;
    let claims = MintedHostClaims {
        sub: user_id,
        prof: public_url,
        iss: public_url,
        relay_host_id,
        purpose: HOST_PURPOSE,
        aud: HOST_AUDIENCE,
        iat,
        exp,
    };
    (sign_hs256(k, HS256_HEADER, &claims), exp * 1000)
}

/// External ES256 issuer (`ORCA_RELAY_AUTH_ISSUER`, `ORCA_RELAY_JWKS_URL`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwksSource {
    pub issuer: String,
    pub url: String,
}

/// Verifies host tokens by docs/reference/http.md. Share it behind an `Arc`; `Debug` hides the key.
pub struct HostTokenVerifier {
    key: [u8; 32],
    jwks: Option<JwksCache>,
}

impl fmt::Debug for HostTokenVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostTokenVerifier")
            .field("jwks", &self.jwks.as_ref().map(|j| &j.source))
            .finish_non_exhaustive()
    }
}

impl HostTokenVerifier {
    /// `key` = [`self_hosted_key`] of the assignment signing key; `jwks` enables ES256.
    pub fn new(key: [u8; 32], jwks: Option<JwksSource>) -> Self {
        Self {
            key,
            jwks: jwks.map(|source| JwksCache::new(source, JWKS_REFETCH_INTERVAL)),
        }
    }

    /// Checks algorithm and signature, then `aud`, `exp`/`nbf` (no leeway), `iss`, claim lengths and
    /// `purpose`. May fetch the JWKS (ES256 with an unknown `kid`).
    pub async fn verify(&self, token: &str, now_ms: i64) -> Result<HostClaims, TokenError> {
        let jwt = parse(token)?;
        let issuer = match (jwt.alg(), &self.jwks) {
            (Some("HS256"), _) => {
                jwt.verify_hs256(&self.key)?;
                None
            }
            (Some("ES256"), Some(jwks)) => {
                let key = jwks.key_for(jwt.kid()?).await?;
                let valid = jsonwebtoken::crypto::verify(
                    jwt.signature_b64,
                    jwt.signing_input.as_bytes(),
                    &key,
                    Algorithm::ES256,
                )
                .unwrap_or(false);
                if !valid {
                    return Err(TokenError::Signature);
                }
                Some(jwks.source.issuer.as_str())
            }
            _ => return Err(TokenError::Algorithm),
        };
        host_claims(&jwt.claims, issuer, now_ms)
    }
}

fn host_claims(
    claims: &Map<String, Value>,
    issuer: Option<&str>,
    now_ms: i64,
) -> Result<HostClaims, TokenError> {
    let audience_ok = match claims.get("aud") {
        Some(Value::String(aud)) => aud == HOST_AUDIENCE,
        Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(HOST_AUDIENCE)),
        _ => false,
    };
    if !audience_ok {
        return Err(TokenError::Audience);
    }
    check_expiry(claims, now_ms)?;
    let iss = match (claims.get("iss"), issuer) {
        (Some(Value::String(iss)), None) => iss,
        (Some(Value::String(iss)), Some(want)) if iss == want => iss,
        _ => return Err(TokenError::Issuer),
    };
    let sub = string_claim(claims, "sub", 128)?;
    let prof = string_claim(claims, "prof", 2048)?;
    let org = match claims.get("org") {
        None => None,
        Some(_) => Some(string_claim(claims, "org", 128)?.to_owned()),
    };
    let relay_host_id = string_claim(claims, "relayHostId", 16)?;
    if !is_relay_host_id(relay_host_id) {
        return Err(TokenError::Claim("relayHostId"));
    }
    if claims.get("purpose").and_then(Value::as_str) != Some(HOST_PURPOSE) {
        return Err(TokenError::Purpose);
    }
    Ok(HostClaims {
        sub: sub.to_owned(),
        prof: prof.to_owned(),
        org,
        relay_host_id: relay_host_id.to_owned(),
        exp: seconds_claim(claims, "exp").ok_or(TokenError::Expired)?,
        iat: seconds_claim(claims, "iat"),
        iss: iss.clone(),
    })
}

// ---------------------------------------------------------------------------------------------------
// JWKS cache

#[derive(Clone)]
struct JwksKey {
    kid: Option<String>,
    key: DecodingKey,
}

struct JwksCache {
    source: JwksSource,
    client: reqwest::Client,
    refetch_interval: Duration,
    /// `None` until the first successful fetch.
    keys: RwLock<Option<Arc<Vec<JwksKey>>>>,
    /// Serialises fetches; holds the time of the last attempt.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
}

impl JwksCache {
    fn new(source: JwksSource, refetch_interval: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(JWKS_TIMEOUT)
            .build()
            .expect("HTTP client for the JWKS");
        Self {
            source,
            client,
            refetch_interval,
            keys: RwLock::new(None),
            last_fetch: tokio::sync::Mutex::new(None),
        }
    }

    fn cached(&self) -> Option<Arc<Vec<JwksKey>>> {
        self.keys
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn lookup(&self, kid: Option<&str>) -> Option<DecodingKey> {
        let keys = self.cached()?;
        let found = match kid {
            Some(kid) => keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None if keys.len() == 1 => keys.first(),
            None => None,
        };
        found.map(|k| k.key.clone())
    }

    /// The P-256 key for `kid` (or the only key), fetching the set at most once per refetch interval.
    async fn key_for(&self, kid: Option<&str>) -> Result<DecodingKey, TokenError> {
        if let Some(key) = self.lookup(kid) {
            return Ok(key);
        }
        let mut last_fetch = self.last_fetch.lock().await;
        // Another task may have refreshed the set while we waited.
        if let Some(key) = self.lookup(kid) {
            return Ok(key);
        }
        if last_fetch.is_none_or(|at| at.elapsed() >= self.refetch_interval) {
            *last_fetch = Some(Instant::now());
            match self.fetch().await {
                Ok(keys) => {
                    *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(keys));
                }
                Err(reason) => log::warn!("[orca-relay] JWKS fetch failed: {reason}"),
            }
        }
        match self.cached() {
            None => Err(TokenError::KeysUnavailable),
            Some(_) => self.lookup(kid).ok_or(TokenError::UnknownKey),
        }
    }

    async fn fetch(&self) -> Result<Vec<JwksKey>, String> {
        let response = self
            .client
            .get(&self.source.url)
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        if !response.status().is_success() {
            return Err(format!("HTTP status {}", response.status().as_u16()));
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| e.without_url().to_string())?;
        if body.len() > MAX_JWKS_BYTES {
            return Err("JWKS document too large".into());
        }
        parse_jwks(&body)
    }
}

/// The fuzzing entry point for the JWKS parser (docs/development.md, Fuzzing): how many usable keys a fetched
/// document yields, or why it was refused.
#[doc(hidden)]
pub fn parse_jwks_for_fuzzing(body: &[u8]) -> Result<usize, String> {
    parse_jwks(body).map(|keys| keys.len())
}

/// Usable entries of a JWKS: `kty` EC, `crv` P-256, `alg` absent or ES256, `use` absent or `sig`.
fn parse_jwks(body: &[u8]) -> Result<Vec<JwksKey>, String> {
    let doc: Value = serde_json::from_slice(body).map_err(|_| "JWKS is not JSON".to_string())?;
    let entries = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("JWKS has no `keys` array")?;
    let str_of =
        |entry: &Value, name: &str| entry.get(name).and_then(Value::as_str).map(str::to_owned);
    let coordinate = |entry: &Value, name: &str| {
        str_of(entry, name).filter(|c| url_decode_canonical(c).is_some_and(|b| b.len() == 32))
    };
    Ok(entries
        .iter()
        .filter(|e| str_of(e, "kty").as_deref() == Some("EC"))
        .filter(|e| str_of(e, "crv").as_deref() == Some("P-256"))
        .filter(|e| e.get("alg").is_none_or(|a| a.as_str() == Some("ES256")))
        .filter(|e| e.get("use").is_none_or(|u| u.as_str() == Some("sig")))
        .filter_map(|e| {
            let key =
                DecodingKey::from_ec_components(&coordinate(e, "x")?, &coordinate(e, "y")?).ok()?;
            Some(JwksKey {
                kid: str_of(e, "kid"),
                key,
            })
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------------
// Cluster tokens

#[derive(Serialize)]
struct ClusterClaims<'a> {
    sub: &'a str,
    aud: &'a str,
    iat: i64,
    exp: i64,
}

/// Node-to-node token: HS256 with `ORCA_RELAY_CLUSTER_KEY`, `aud` `orca-relay-cluster`, `exp` = now + 30 s.
pub fn mint_cluster_token(cluster_key: &[u8], sub: &str, now_ms: i64) -> String {
    let iat = now_ms.div_euclid(1000);
    let claims = ClusterClaims {
        sub,
        aud: CLUSTER_AUDIENCE,
        iat,
        exp: iat + CLUSTER_TOKEN_TTL_S,
    };
    sign_hs256(cluster_key, HS256_HEADER, &claims)
}

/// HS256 only, `aud` exactly `orca-relay-cluster`, `exp`·1000 in (now, now + 60 000]; returns `sub`
/// (1..128 chars) for the caller's identity check.
pub fn verify_cluster_token(
    cluster_key: &[u8],
    token: &str,
    now_ms: i64,
) -> Result<String, TokenError> {
    let jwt = parse(token)?;
    jwt.verify_hs256(cluster_key)?;
    if jwt.claims.get("aud").and_then(Value::as_str) != Some(CLUSTER_AUDIENCE) {
        return Err(TokenError::Audience);
    }
    let exp_ms = check_expiry(&jwt.claims, now_ms)?;
    if exp_ms > i128::from(now_ms) + i128::from(CLUSTER_TOKEN_MAX_AHEAD_MS) {
        return Err(TokenError::Expired);
    }
    Ok(string_claim(&jwt.claims, "sub", 128)?.to_owned())
}

// ---------------------------------------------------------------------------------------------------
// Assignment leases

/// Claims of the `lease` JWS returned by `/v1/assign`, in the order they are minted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignmentLeaseClaims {
    pub iss: String,
    pub aud: String,
    pub sub: String,
    pub purpose: String,
    #[serde(rename = "cellId")]
    pub cell_id: String,
    #[serde(rename = "cellUrl")]
    pub cell_url: String,
    #[serde(rename = "assignmentEpoch")]
    pub assignment_epoch: i64,
    #[serde(rename = "relayHostId")]
    pub relay_host_id: String,
    pub iat: i64,
    pub exp: i64,
}

/// Lease `kid`: `k1-` + first 8 hex chars of SHA-256(signing key).
pub fn lease_kid(signing_key: &str) -> String {
    format!("k1-{}", &sha256_hex(signing_key.as_bytes())[..8])
}

/// Signs an assignment lease with the UTF-8 bytes of `ORCA_RELAY_ASSIGNMENT_SIGNING_KEY`;
/// `exp` = `iat` + 300.
#[allow(clippy::too_many_arguments)]
pub fn mint_assignment_lease(
    signing_key: &str,
    iss: &str,
    user_id: &str,
    cell_id: &str,
    cell_url: &str,
    epoch: i64,
    relay_host_id: &str,
    now_ms: i64,
) -> String {
    let iat = now_ms.div_euclid(1000);
    let claims = AssignmentLeaseClaims {
        iss: iss.to_owned(),
        aud: LEASE_AUDIENCE.to_owned(),
        sub: user_id.to_owned(),
        purpose: LEASE_PURPOSE.to_owned(),
        cell_id: cell_id.to_owned(),
        cell_url: cell_url.to_owned(),
        assignment_epoch: epoch,
        relay_host_id: relay_host_id.to_owned(),
        iat,
        exp: iat + LEASE_TTL_S,
    };
    let header = format!(
        r#"{{"alg":"HS256","typ":"JWT","kid":"{}"}}"#,
        lease_kid(signing_key)
    );
    sign_hs256(signing_key.as_bytes(), &header, &claims)
}

/// Checks a lease minted by [`mint_assignment_lease`]: HS256, matching `kid`, signature, `aud`,
/// `purpose`, `now < exp`·1000.
pub fn verify_assignment_lease(
    signing_key: &str,
    token: &str,
    now_ms: i64,
) -> Result<AssignmentLeaseClaims, TokenError> {
    let jwt = parse(token)?;
    if jwt.kid()? != Some(lease_kid(signing_key).as_str()) {
        return Err(TokenError::UnknownKey);
    }
    jwt.verify_hs256(signing_key.as_bytes())?;
    check_expiry(&jwt.claims, now_ms)?;
    let claims: AssignmentLeaseClaims = serde_json::from_value(Value::Object(jwt.claims))
        .map_err(|_| TokenError::Claim("lease"))?;
    if claims.aud != LEASE_AUDIENCE {
        return Err(TokenError::Audience);
    }
    if claims.purpose != LEASE_PURPOSE {
        return Err(TokenError::Purpose);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::ident::hex;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const NOW: i64 = 1_700_000_000_123;
    const NOW_S: i64 = 1_700_000_000;
    const HOST_ID: &str = "dYd7tB05O1-4RVzm";

    fn key() -> [u8; 32] {
        self_hosted_key("0123456789abcdef0123456789abcdef")
    }

    fn hs_token(key: &[u8], header: Value, claims: Value) -> String {
        sign_hs256(key, &header.to_string(), &claims)
    }

    fn claims() -> Value {
        json!({
            "sub": "user-1", "prof": "https://relay.example.test", "iss": "https://relay.example.test",
            "relayHostId": HOST_ID, "purpose": HOST_PURPOSE, "aud": HOST_AUDIENCE,
            "iat": NOW_S, "exp": NOW_S + 900,
        })
    }

    fn with(mut claims: Value, name: &str, value: Value) -> Value {
        claims[name] = value;
        claims
    }

    fn without(mut claims: Value, name: &str) -> Value {
        claims.as_object_mut().unwrap().remove(name);
        claims
    }

    fn hs(claims: Value) -> String {
        hs_token(&key(), json!({"alg": "HS256", "typ": "JWT"}), claims)
    }

    async fn verify(token: &str) -> Result<HostClaims, TokenError> {
        HostTokenVerifier::new(key(), None).verify(token, NOW).await
    }

    fn part_json(token: &str, index: usize) -> Value {
        let part = token.split('.').nth(index).unwrap();
        serde_json::from_slice(&url_decode_canonical(part).unwrap()).unwrap()
    }

    #[test]
    fn self_hosted_key_vector() {
        assert_eq!(
            hex(&key()),
            "da60a75dbf2865d4fbeb20d254880e03da6e75f4a2c53b82c5892df7228c1558"
        );
    }

    #[tokio::test]
    async fn minted_host_token_shape_and_round_trip() {
        let (token, expires_at) =
            mint_host_token(&key(), "self-hosted", "https://r.test", HOST_ID, NOW);
        assert_eq!(expires_at, (NOW_S + 900) * 1000);
        let header = token.split('.').next().unwrap();
        assert_eq!(
            url_decode_canonical(header).unwrap(),
            br#"{"alg":"HS256","typ":"JWT"}"#
        );
        let body = part_json(&token, 1);
        assert_eq!(
            body,
            json!({"sub": "self-hosted", "prof": "https://r.test", "iss": "https://r.test",
                   "relayHostId": HOST_ID, "purpose": "host-control", "aud": "orca-relay",
                   "iat": NOW_S, "exp": NOW_S + 900})
        );
        let claims = verify(&token).await.unwrap();
        assert_eq!(
            claims,
            HostClaims {
                sub: "self-hosted".into(),
                prof: "https://r.test".into(),
                org: None,
                relay_host_id: HOST_ID.into(),
                exp: NOW_S + 900,
                iat: Some(NOW_S),
                iss: "https://r.test".into(),
            }
        );
        let serialized = serde_json::to_value(&claims).unwrap();
        assert_eq!(serialized["relayHostId"], HOST_ID);
        assert!(serialized.get("org").is_none());
    }

    #[tokio::test]
    async fn host_token_rules() {
        assert!(verify(&hs(claims())).await.is_ok());
        let v = HostTokenVerifier::new(key(), None);
        let exp_ms = (NOW_S + 900) * 1000;
        assert!(v.verify(&hs(claims()), exp_ms - 1).await.is_ok());
        assert_eq!(
            v.verify(&hs(claims()), exp_ms).await,
            Err(TokenError::Expired)
        );

        let cases: Vec<(String, TokenError)> = vec![
            (
                hs_token(&[0; 32], json!({"alg": "HS256"}), claims()),
                TokenError::Signature,
            ),
            (
                hs_token(&key(), json!({"alg": "HS384"}), claims()),
                TokenError::Algorithm,
            ),
            (
                hs_token(&key(), json!({"alg": "RS256"}), claims()),
                TokenError::Algorithm,
            ),
            (
                hs_token(&key(), json!({"alg": "ES256"}), claims()),
                TokenError::Algorithm,
            ),
            (
                hs_token(&key(), json!({"typ": "JWT"}), claims()),
                TokenError::Algorithm,
            ),
            (
                hs_token(&key(), json!({"alg": "HS256", "crit": ["b64"]}), claims()),
                TokenError::Malformed,
            ),
            (hs(with(claims(), "exp", json!(NOW_S))), TokenError::Expired),
            (hs(without(claims(), "exp")), TokenError::Expired),
            (
                hs(with(claims(), "exp", json!("never"))),
                TokenError::Expired,
            ),
            (
                hs(with(claims(), "nbf", json!(NOW_S + 1))),
                TokenError::NotYetValid,
            ),
            (
                hs(with(claims(), "aud", json!("orca-relay-cell"))),
                TokenError::Audience,
            ),
            (
                hs(with(claims(), "aud", json!(["a", "b"]))),
                TokenError::Audience,
            ),
            (hs(without(claims(), "aud")), TokenError::Audience),
            (
                hs(with(claims(), "purpose", json!("cell-assignment"))),
                TokenError::Purpose,
            ),
            (hs(without(claims(), "purpose")), TokenError::Purpose),
            (
                hs(with(claims(), "sub", json!("x".repeat(129)))),
                TokenError::Claim("sub"),
            ),
            (
                hs(with(claims(), "sub", json!(""))),
                TokenError::Claim("sub"),
            ),
            (
                hs(with(claims(), "sub", json!(5))),
                TokenError::Claim("sub"),
            ),
            (
                hs(with(claims(), "prof", json!("p".repeat(2049)))),
                TokenError::Claim("prof"),
            ),
            (hs(without(claims(), "prof")), TokenError::Claim("prof")),
            (
                hs(with(claims(), "org", json!(""))),
                TokenError::Claim("org"),
            ),
            (
                hs(with(claims(), "org", json!(null))),
                TokenError::Claim("org"),
            ),
            (
                hs(with(claims(), "org", json!("o".repeat(129)))),
                TokenError::Claim("org"),
            ),
            (
                hs(with(claims(), "relayHostId", json!("dYd7tB05O1-4RVz+"))),
                TokenError::Claim("relayHostId"),
            ),
            (
                hs(with(claims(), "relayHostId", json!("short"))),
                TokenError::Claim("relayHostId"),
            ),
            (hs(without(claims(), "iss")), TokenError::Issuer),
            (hs(with(claims(), "iss", json!(1))), TokenError::Issuer),
        ];
        for (token, want) in cases {
            assert_eq!(verify(&token).await, Err(want), "{}", part_json(&token, 1));
        }

        // Boundaries and tolerated variants.
        let ok = [
            with(claims(), "sub", json!("é".repeat(128))),
            with(claims(), "prof", json!("p".repeat(2048))),
            with(claims(), "org", json!("o".repeat(128))),
            with(claims(), "aud", json!(["other", "orca-relay"])),
            with(claims(), "nbf", json!(NOW_S)),
            with(claims(), "iss", json!("")),
            with(claims(), "extra", json!({"ignored": true})),
            without(claims(), "iat"),
        ];
        for c in ok {
            assert!(verify(&hs(c.clone())).await.is_ok(), "{c}");
        }
        let org = verify(&hs(with(claims(), "org", json!("org-1"))))
            .await
            .unwrap();
        assert_eq!(org.org.as_deref(), Some("org-1"));
        // nbf exactly now (in ms) is accepted, one ms earlier it is in the future.
        let v = HostTokenVerifier::new(key(), None);
        let token = hs(with(claims(), "nbf", json!(NOW_S + 1)));
        assert!(v.verify(&token, (NOW_S + 1) * 1000).await.is_ok());
        assert_eq!(
            v.verify(&token, (NOW_S + 1) * 1000 - 1).await,
            Err(TokenError::NotYetValid)
        );
    }

    #[tokio::test]
    async fn malformed_and_unsigned_tokens() {
        let none = format!(
            "{}.{}.",
            url_encode(br#"{"alg":"none","typ":"JWT"}"#),
            url_encode(claims().to_string().as_bytes())
        );
        assert_eq!(verify(&none).await, Err(TokenError::Algorithm));
        let good = hs(claims());
        let unsigned = &good[..good.rfind('.').unwrap() + 1];
        assert_eq!(verify(unsigned).await, Err(TokenError::Signature));
        for bad in [
            "",
            "a.b",
            "a.b.c.d",
            "..",
            &format!("{good}="),
            &good.replace('.', ".."),
        ] {
            assert_eq!(verify(bad).await, Err(TokenError::Malformed), "{bad}");
        }
        let long = hs(with(claims(), "pad", json!("x".repeat(MAX_TOKEN_CHARS))));
        assert_eq!(verify(&long).await, Err(TokenError::Malformed));
        let array_header = format!(
            "{}.{}",
            url_encode(b"[]"),
            &good[good.find('.').unwrap() + 1..]
        );
        assert_eq!(verify(&array_header).await, Err(TokenError::Malformed));
        // Strict header and claims: duplicate keys and a non-string `alg`/`typ`/`kid` are
        // malformed (checked before the signature).
        let claims_b64 = url_encode(claims().to_string().as_bytes());
        for header in [
            r#"{"alg":"HS256","alg":"none"}"#,
            r#"{"alg":256,"typ":"JWT"}"#,
            r#"{"alg":"HS256","typ":1}"#,
            r#"{"alg":"HS256","kid":null}"#,
        ] {
            let t = format!("{}.{claims_b64}.", url_encode(header.as_bytes()));
            assert_eq!(verify(&t).await, Err(TokenError::Malformed), "{header}");
        }
        let header_b64 = url_encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let dup_claims = format!(
            "{}.{}.",
            header_b64,
            url_encode(br#"{"sub":"user-1","sub":"user-2"}"#)
        );
        assert_eq!(verify(&dup_claims).await, Err(TokenError::Malformed));
        let ok_unsigned = format!("{header_b64}.{claims_b64}.");
        assert_eq!(verify(&ok_unsigned).await, Err(TokenError::Signature));
    }

    #[test]
    fn bearer_header() {
        assert_eq!(verify_bearer_header("Bearer abc.def"), Some("abc.def"));
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            "bearer abc",
            "Bearer  abc",
            "Bearer abc ",
            "Bearer a\tb",
            "Basic abc",
            " Bearer abc",
            "Bearer a\u{a0}b",
        ] {
            assert_eq!(verify_bearer_header(bad), None, "{bad:?}");
        }
        let max = format!("Bearer {}", "a".repeat(MAX_TOKEN_CHARS));
        assert!(verify_bearer_header(&max).is_some());
        let over = format!("Bearer {}", "a".repeat(MAX_TOKEN_CHARS + 1));
        assert_eq!(verify_bearer_header(&over), None);
    }

    #[test]
    fn cluster_tokens() {
        let k = b"cluster-key-cluster-key-cluster-key!";
        let token = mint_cluster_token(k, "cell-a", NOW);
        assert_eq!(
            part_json(&token, 1),
            json!({"sub": "cell-a", "aud": "orca-relay-cluster", "iat": NOW_S, "exp": NOW_S + 30})
        );
        assert_eq!(
            verify_cluster_token(k, &token, NOW).as_deref(),
            Ok("cell-a")
        );
        assert_eq!(
            verify_cluster_token(b"other", &token, NOW),
            Err(TokenError::Signature)
        );
        assert_eq!(
            verify_cluster_token(k, &token, (NOW_S + 30) * 1000),
            Err(TokenError::Expired)
        );
        // A token minted 31 s in our future is more than 60 s ahead.
        let ahead = mint_cluster_token(k, "cell-a", NOW + 31_000);
        assert!(verify_cluster_token(k, &ahead, NOW + 1_000).is_ok());
        assert_eq!(
            verify_cluster_token(k, &ahead, NOW - 1_000),
            Err(TokenError::Expired)
        );
        let c = json!({"sub": "director", "aud": ["orca-relay-cluster"], "exp": NOW_S + 10});
        let t = hs_token(k, json!({"alg": "HS256"}), c);
        assert_eq!(verify_cluster_token(k, &t, NOW), Err(TokenError::Audience));
        let c = json!({"sub": "director", "aud": "orca-relay", "exp": NOW_S + 10});
        let t = hs_token(k, json!({"alg": "HS256"}), c);
        assert_eq!(verify_cluster_token(k, &t, NOW), Err(TokenError::Audience));
        let c = json!({"aud": "orca-relay-cluster", "exp": NOW_S + 10});
        let t = hs_token(k, json!({"alg": "HS256"}), c);
        assert_eq!(
            verify_cluster_token(k, &t, NOW),
            Err(TokenError::Claim("sub"))
        );
        let none = format!(
            "{}.{}.",
            url_encode(br#"{"alg":"none"}"#),
            url_encode(br#"{"sub":"x","aud":"orca-relay-cluster","exp":1700000010}"#)
        );
        assert_eq!(
            verify_cluster_token(k, &none, NOW),
            Err(TokenError::Algorithm)
        );
    }

    #[test]
    fn assignment_leases() {
        let key = "0123456789abcdef0123456789abcdef";
        let kid = lease_kid(key);
        assert_eq!(kid, format!("k1-{}", &sha256_hex(key.as_bytes())[..8]));
        let token = mint_assignment_lease(
            key,
            "https://d.test",
            "user-1",
            "cell-a",
            "https://a.test",
            7,
            HOST_ID,
            NOW,
        );
        let header = url_decode_canonical(token.split('.').next().unwrap()).unwrap();
        assert_eq!(
            String::from_utf8(header).unwrap(),
            format!(r#"{{"alg":"HS256","typ":"JWT","kid":"{kid}"}}"#)
        );
        let claims = verify_assignment_lease(key, &token, NOW).unwrap();
        assert_eq!(
            serde_json::to_value(&claims).unwrap(),
            json!({"iss": "https://d.test", "aud": "orca-relay-cell", "sub": "user-1",
                   "purpose": "cell-assignment", "cellId": "cell-a", "cellUrl": "https://a.test",
                   "assignmentEpoch": 7, "relayHostId": HOST_ID, "iat": NOW_S, "exp": NOW_S + 300})
        );
        assert_eq!(part_json(&token, 1), serde_json::to_value(&claims).unwrap());
        assert_eq!(
            verify_assignment_lease(key, &token, (NOW_S + 300) * 1000),
            Err(TokenError::Expired)
        );
        assert_eq!(
            verify_assignment_lease("another-signing-key-another-key!!", &token, NOW),
            Err(TokenError::UnknownKey)
        );
        let forged = hs_token(
            b"wrong",
            json!({"alg": "HS256", "kid": kid}),
            part_json(&token, 1),
        );
        assert_eq!(
            verify_assignment_lease(key, &forged, NOW),
            Err(TokenError::Signature)
        );
        let other = with(part_json(&token, 1), "purpose", json!("host-control"));
        let t = hs_token(key.as_bytes(), json!({"alg": "HS256", "kid": kid}), other);
        assert_eq!(
            verify_assignment_lease(key, &t, NOW),
            Err(TokenError::Purpose)
        );
    }

    // ---- ES256 via JWKS ------------------------------------------------------------------------

    // Throw-away P-256 test keys (generated once with `openssl genpkey -algorithm EC
    // -pkeyopt ec_paramgen_curve:P-256`); x/y are the JWK coordinates of their public halves.
    const KEY_A_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQglf3QcBlb8V4UHIgx
5j4T44bhgBFlq35l3Dmat9xFdWChRANCAATqQeV0ANNVnMMz7Us6tsf6S1UxqQxh
GwZFCMFoQpCsDtEm5eFkzioYCltIp+SBF4Vooy8TMXQbMmGuqzBcD10w
-----END PRIVATE KEY-----
";
    const KEY_A_XY: (&str, &str) = (
        "6kHldADTVZzDM-1LOrbH-ktVMakMYRsGRQjBaEKQrA4",
        "0Sbl4WTOKhgKW0in5IEXhWijLxMxdBsyYa6rMFwPXTA",
    );
    const KEY_B_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgoYzBI9atVv/eJa3h
SeEjZQddTQPl2+2NTEuOseIfmuChRANCAASuhBPpaTdnM94JA2WG5jrIaKruZaMB
MWjutk7UZUB6x9m346m3sOsj/CO5s77hkoscYGP+QIl+5lAP86ln5l8Z
-----END PRIVATE KEY-----
";
    const KEY_B_XY: (&str, &str) = (
        "roQT6Wk3ZzPeCQNlhuY6yGiq7mWjATFo7rZO1GVAesc",
        "2bfjqbew6yP8I7mzvuGSixxgY_5AiX7mUA_zqWfmXxk",
    );
    const ISSUER: &str = "https://auth.example.test";

    fn es_token(pem: &str, kid: Option<&str>, claims: &Value) -> String {
        let mut header = json!({"alg": "ES256", "typ": "JWT"});
        if let Some(kid) = kid {
            header["kid"] = json!(kid);
        }
        let input = format!(
            "{}.{}",
            url_encode(header.to_string().as_bytes()),
            url_encode(claims.to_string().as_bytes())
        );
        let key = jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes()).unwrap();
        let signature =
            jsonwebtoken::crypto::sign(input.as_bytes(), &key, Algorithm::ES256).unwrap();
        format!("{input}.{signature}")
    }

    fn jwk(kid: Option<&str>, (x, y): (&str, &str)) -> Value {
        let mut k =
            json!({"kty": "EC", "crv": "P-256", "x": x, "y": y, "alg": "ES256", "use": "sig"});
        if let Some(kid) = kid {
            k["kid"] = json!(kid);
        }
        k
    }

    /// Minimal HTTP/1.1 server answering every request with the current JWKS body.
    struct JwksServer {
        url: String,
        body: Arc<Mutex<String>>,
        hits: Arc<AtomicUsize>,
    }

    impl JwksServer {
        async fn start(keys: Vec<Value>) -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
            let body = Arc::new(Mutex::new(json!({ "keys": keys }).to_string()));
            let hits = Arc::new(AtomicUsize::new(0));
            let (b, h) = (body.clone(), hits.clone());
            tokio::spawn(async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    let (b, h) = (b.clone(), h.clone());
                    tokio::spawn(async move {
                        let mut request = Vec::new();
                        let mut buf = [0u8; 1024];
                        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                            match socket.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => request.extend_from_slice(&buf[..n]),
                            }
                        }
                        h.fetch_add(1, Ordering::SeqCst);
                        let body = crate::sync::lock(&b).clone();
                        let response = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(response.as_bytes()).await;
                        let _ = socket.shutdown().await;
                    });
                }
            });
            Self { url, body, hits }
        }

        fn set_keys(&self, keys: Vec<Value>) {
            *crate::sync::lock(&self.body) = json!({ "keys": keys }).to_string();
        }

        fn hits(&self) -> usize {
            self.hits.load(Ordering::SeqCst)
        }

        fn verifier(&self, refetch: Duration) -> HostTokenVerifier {
            let source = JwksSource {
                issuer: ISSUER.into(),
                url: self.url.clone(),
            };
            HostTokenVerifier {
                key: key(),
                jwks: Some(JwksCache::new(source, refetch)),
            }
        }
    }

    fn es_claims() -> Value {
        with(with(claims(), "iss", json!(ISSUER)), "org", json!("org-1"))
    }

    #[tokio::test]
    async fn es256_with_jwks_cache() {
        let server = JwksServer::start(vec![jwk(Some("a"), KEY_A_XY)]).await;
        let v = server.verifier(Duration::from_millis(1_000));

        let token_a = es_token(KEY_A_PEM, Some("a"), &es_claims());
        let claims = v.verify(&token_a, NOW).await.unwrap();
        assert_eq!(
            (claims.iss.as_str(), claims.org.as_deref()),
            (ISSUER, Some("org-1"))
        );
        assert_eq!(server.hits(), 1);
        assert!(v.verify(&token_a, NOW).await.is_ok());
        assert_eq!(server.hits(), 1, "cached");
        // HS256 still works next to ES256.
        assert!(v
            .verify(&hs(claims_with_iss("anything")), NOW)
            .await
            .is_ok());

        // Only entry used when there is no kid.
        let no_kid = es_token(KEY_A_PEM, None, &es_claims());
        assert!(v.verify(&no_kid, NOW).await.is_ok());

        // Rotation: an unknown kid refetches at most once per interval.
        server.set_keys(vec![jwk(Some("a"), KEY_A_XY), jwk(Some("b"), KEY_B_XY)]);
        let token_b = es_token(KEY_B_PEM, Some("b"), &es_claims());
        assert_eq!(v.verify(&token_b, NOW).await, Err(TokenError::UnknownKey));
        assert_eq!(server.hits(), 1, "within the refetch interval");
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert!(v.verify(&token_b, NOW).await.is_ok());
        assert_eq!(server.hits(), 2);
        let token_c = es_token(KEY_B_PEM, Some("c"), &es_claims());
        assert_eq!(v.verify(&token_c, NOW).await, Err(TokenError::UnknownKey));
        assert_eq!(server.hits(), 2);
        // Two keys now: a token without kid is ambiguous.
        assert_eq!(v.verify(&no_kid, NOW).await, Err(TokenError::UnknownKey));

        // Signature by the wrong key, wrong issuer, and the usual claim rules.
        let forged = es_token(KEY_B_PEM, Some("a"), &es_claims());
        assert_eq!(v.verify(&forged, NOW).await, Err(TokenError::Signature));
        let other_iss = es_token(KEY_A_PEM, Some("a"), &claims_with_iss("https://evil.test"));
        assert_eq!(v.verify(&other_iss, NOW).await, Err(TokenError::Issuer));
        let expired = es_token(
            KEY_A_PEM,
            Some("a"),
            &with(es_claims(), "exp", json!(NOW_S)),
        );
        assert_eq!(v.verify(&expired, NOW).await, Err(TokenError::Expired));
        let purpose = es_token(
            KEY_A_PEM,
            Some("a"),
            &with(es_claims(), "purpose", json!("x")),
        );
        assert_eq!(v.verify(&purpose, NOW).await, Err(TokenError::Purpose));

        // Without a JWKS source ES256 is not an accepted algorithm.
        let hs_only = HostTokenVerifier::new(key(), None);
        assert_eq!(
            hs_only.verify(&token_a, NOW).await,
            Err(TokenError::Algorithm)
        );
        assert!(!format!("{v:?}").contains(&hex(&key())));
    }

    fn claims_with_iss(iss: &str) -> Value {
        with(claims(), "iss", json!(iss))
    }

    #[tokio::test]
    async fn jwks_unavailable_and_filtering() {
        // Nothing listens on this port once the listener is dropped.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let source = JwksSource {
            issuer: ISSUER.into(),
            url: format!("http://127.0.0.1:{port}/jwks"),
        };
        let v = HostTokenVerifier::new(key(), Some(source));
        let token = es_token(KEY_A_PEM, Some("a"), &es_claims());
        assert_eq!(
            v.verify(&token, NOW).await,
            Err(TokenError::KeysUnavailable)
        );

        let keys = parse_jwks(
            json!({"keys": [
                {"kty": "RSA", "n": "AQAB", "e": "AQAB", "kid": "r"},
                {"kty": "EC", "crv": "P-384", "x": KEY_A_XY.0, "y": KEY_A_XY.1, "kid": "p384"},
                {"kty": "EC", "crv": "P-256", "x": KEY_A_XY.0, "y": KEY_A_XY.1, "kid": "enc", "use": "enc"},
                {"kty": "EC", "crv": "P-256", "x": KEY_A_XY.0, "y": KEY_A_XY.1, "kid": "rs", "alg": "RS256"},
                {"kty": "EC", "crv": "P-256", "x": "AAAA", "y": KEY_A_XY.1, "kid": "short"},
                {"kty": "EC", "crv": "P-256", "x": KEY_A_XY.0, "y": KEY_A_XY.1, "kid": "ok"},
                {"kty": "EC", "crv": "P-256", "x": KEY_B_XY.0, "y": KEY_B_XY.1}
            ]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref()).collect();
        assert_eq!(kids, [Some("ok"), None]);
        assert!(parse_jwks(b"{}").is_err());
        assert!(parse_jwks(b"not json").is_err());
    }
}
