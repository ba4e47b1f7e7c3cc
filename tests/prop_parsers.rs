//! Property tests of the network-facing parsers (issue 11), where a generated structure reads
//! better than a fuzz target: round trips (base64, leg-path percent coding, transcripts, tokens,
//! host proofs, strict decoding of generated valid bodies) and "every refusal is the documented
//! error" (the strict decoder's three outcomes, one per kind of defect).
//!
//! The coverage-guided fuzz targets for the same parsers live in `fuzz/` (docs/development.md, Fuzzing).

use orca_relay::contract::strict::{self, Error};
use orca_relay::contract::wire::CellHeartbeat;
use orca_relay::crypto::{
    self, b64, challenge, host_proof, jwt, nacl, ChallengeRandomness, HostBinding,
};
use orca_relay::leg::path::{self, Named};
use orca_relay::push::routes as push_routes;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use proptest::prelude::*;
use serde_json::{json, Value};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

fn relay_host_id() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{16}"
}

proptest! {
    #![proptest_config(config())]

    /// Both base64 forms round-trip any bytes, and a canonical decode is the only text of its
    /// bytes (so two texts never name the same key or token).
    #[test]
    fn base64_round_trips_and_is_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..96), text in "[A-Za-z0-9+/=_-]{0,48}") {
        prop_assert_eq!(b64::std_decode_canonical(&b64::std_encode(&bytes)), Some(bytes.clone()));
        prop_assert_eq!(b64::url_decode_canonical(&b64::url_encode(&bytes)), Some(bytes));
        if let Some(b) = b64::std_decode_canonical(&text) {
            prop_assert_eq!(b64::std_encode(&b), text.clone());
        }
        if let Some(b) = b64::url_decode_canonical(&text) {
            prop_assert_eq!(b64::url_encode(&b), text);
        }
    }

    #[test]
    fn fixed_length_keys_round_trip(k in any::<[u8; 32]>(), n in any::<[u8; 24]>()) {
        prop_assert_eq!(b64::decode_key32(&b64::std_encode(&k)), Some(k));
        prop_assert_eq!(b64::decode_b64u32(&b64::url_encode(&k)), Some(k));
        prop_assert!(b64::is_b64u32(&b64::url_encode(&k)));
        prop_assert_eq!(b64::decode_nonce24(&b64::std_encode(&n)), Some(n));
        // The other alphabet or length is refused.
        prop_assert_eq!(b64::decode_key32(&b64::url_encode(&k)), None);
        prop_assert_eq!(b64::decode_key32(&b64::std_encode(&k[..31])), None);
    }

    /// Percent-encoding any id and decoding it gives it back; the phone leg finds a host id in
    /// any spelling of it.
    #[test]
    fn leg_path_percent_coding_round_trips(s in "\\PC{0,40}", id in relay_host_id()) {
        let enc = utf8_percent_encode(&s, NON_ALPHANUMERIC).to_string();
        prop_assert_eq!(path::percent_decode(&enc), Some(s.clone()));
        if !s.contains('%') {
            prop_assert_eq!(path::percent_decode(&s), Some(s.clone()));
        }
        let enc_id = utf8_percent_encode(&id, NON_ALPHANUMERIC).to_string();
        prop_assert_eq!(path::named(&format!("/v1/connect/{enc_id}")), Named::Phone(Some(id)));
        let n = s.chars().count();
        let want = (1..=path::CONN_ID_MAX_CHARS).contains(&n).then(|| s.clone());
        prop_assert_eq!(path::named(&format!("/v1/host/data/{enc}")), Named::Data(want));
    }

    /// A `%` not followed by two hex digits is a bad escape wherever it stands.
    #[test]
    fn bad_escapes_are_refused(prefix in "[a-z]{0,8}", bad in "%([^0-9A-Fa-f].?|[0-9A-Fa-f][^0-9A-Fa-f]|[0-9A-Fa-f]?)", suffix in "[a-z]{0,8}") {
        let s = format!("{prefix}{bad}{suffix}");
        prop_assume!(!(bad.len() == 2 && suffix.starts_with(|c: char| c.is_ascii_hexdigit())));
        prop_assume!(!(bad.len() == 1 && suffix.len() >= 2 && suffix[..2].bytes().all(|c| c.is_ascii_hexdigit())));
        prop_assert_eq!(path::percent_decode(&s), None, "{}", s);
    }

    /// Every path decoder refuses an escape whose two characters are not both hex digits, also
    /// the ones an integer parser would take (`%+1`, `%-0`): the leg paths and the push device
    /// path share one decoder.
    #[test]
    fn escapes_need_two_hex_digits(prefix in "[a-z]{0,4}", a in any::<char>(), b in any::<char>(), suffix in "[a-z]{0,4}") {
        prop_assume!(!(a.is_ascii_hexdigit() && b.is_ascii_hexdigit()));
        let s = format!("{prefix}%{a}{b}{suffix}");
        prop_assume!(!s.contains('/'));
        prop_assert_eq!(path::percent_decode(&s), None, "{}", s);
        prop_assert_eq!(push_routes::device_path_id(&format!("/v1/devices/{s}")), None, "{}", s);
        for sign in ["+", "-"] {
            let s = format!("%{sign}{}", b.to_digit(16).unwrap_or(1));
            prop_assert_eq!(path::percent_decode(&s), None, "{}", s);
            prop_assert_eq!(push_routes::device_path_id(&format!("/v1/devices/{s}")), None, "{}", s);
        }
    }

    /// Transcripts: encoding then parsing gives the fields back; any cut inside a field is refused.
    #[test]
    fn transcripts_round_trip(values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8), cut in any::<prop::sample::Index>()) {
        const NAMES: [&str; 8] = ["protocol", "version", "relayOrigin", "nonce", "challengeId", "issuedAt", "expiresAt", "userId"];
        let fields: Vec<challenge::Field> = values.iter().enumerate().map(|(i, v)| (NAMES[i], v.clone())).collect();
        let enc = challenge::encode_fields(&fields);
        let parsed = challenge::parse_fields(&enc).expect("an encoded transcript parses");
        prop_assert_eq!(parsed.len(), fields.len());
        for ((n, v), (wn, wv)) in parsed.iter().zip(&fields) {
            prop_assert_eq!(*n, wn.as_bytes());
            prop_assert_eq!(*v, wv.as_slice());
        }
        prop_assert!(challenge::check_fields(&parsed, &fields).is_ok());
        if !enc.is_empty() {
            let k = cut.index(enc.len());
            let mut boundaries = vec![0usize];
            for (n, v) in &fields {
                let last = *boundaries.last().unwrap();
                boundaries.push(last + 8 + n.len() + v.len());
            }
            if !boundaries.contains(&k) {
                prop_assert_eq!(challenge::parse_fields(&enc[..k]), None);
            }
        }
    }

    /// A cluster token round-trips its `sub`; any changed character breaks it.
    #[test]
    fn cluster_tokens_round_trip(sub in "[a-z0-9.-]{1,64}", key in proptest::collection::vec(any::<u8>(), 1..64), at in any::<prop::sample::Index>(), now in 1_000_000_000_000i64..4_000_000_000_000) {
        let t = jwt::mint_cluster_token(&key, &sub, now);
        prop_assert_eq!(jwt::verify_cluster_token(&key, &t, now), Ok(sub));
        let i = at.index(t.len());
        let mut bytes = t.into_bytes();
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        let changed = String::from_utf8(bytes).unwrap();
        prop_assert!(jwt::verify_cluster_token(&key, &changed, now).is_err());
    }

    /// A challenge issued for any binding is answered by the host with the proof the cell
    /// expects; the proof for another binding is refused.
    #[test]
    fn host_proof_round_trips(secret in any::<[u8; 32]>(), eph in any::<[u8; 32]>(), nonce in any::<[u8; 24]>(), cs in any::<[u8; 32]>(),
                              epoch in 1u64..(1 << 53), prev in proptest::option::of(0u64..(1 << 53)), org in "[a-z]{0,12}", now in 0i64..4_000_000_000_000) {
        let public = nacl::public_key(&secret);
        prop_assume!(nacl::open(&nacl::seal(b"x", &nonce, &public, &eph), &nonce, &nacl::public_key(&eph), &secret).is_some());
        let binding = HostBinding {
            relay_origin: "https://cell-1.example.test".into(),
            user_id: "user-1".into(),
            profile_id: "https://relay.example.test".into(),
            organization_id: org,
            relay_host_id: crypto::relay_host_id(&public),
            host_public: public,
            assignment_epoch: epoch,
            previous_generation: prev,
            resume_requested: false,
        };
        let random = ChallengeRandomness { ephemeral_secret: eph, nonce, challenge_secret: cs, challenge_id: "c-1".into() };
        let issued = host_proof::issue_host_challenge_with(&binding, now, &random);
        let proof = host_proof::answer_host_challenge(&secret, &issued.frame, &binding, now).expect("the host answers");
        prop_assert_eq!(&proof, issued.expected_proof());
        prop_assert!(issued.verify_ack("c-1", &crypto::std_encode(&proof), now));
        let mut other = binding.clone();
        other.assignment_epoch = epoch + 1;
        prop_assert!(host_proof::answer_host_challenge(&secret, &issued.frame, &other, now).is_err());
    }
}

fn heartbeat() -> impl Strategy<Value = CellHeartbeat> {
    (
        (
            any::<u8>(),
            "[a-z0-9-]{1,20}",
            "https://[a-z]{1,10}\\.test",
            "[a-z0-9-]{1,12}",
            "[0-9a-f-]{36}",
            any::<i64>(),
            any::<bool>(),
            any::<i64>(),
        ),
        proptest::option::of(any::<[i64; 7]>()),
    )
        .prop_map(
            |((v, cell_id, cell_url, region, inc, started_at, ready, observed), t)| CellHeartbeat {
                v,
                cell_id,
                cell_url,
                region,
                cell_incarnation: inc,
                started_at,
                ready,
                observed_requests: observed,
                total_connections: t.map(|t| t[0]),
                in_flight_connections: t.map(|t| t[1]),
                reserved_connection_units: t.map(|t| t[2]),
                enforced_connection_units: t.map(|t| t[3]),
                connection_hard_cap: t.map(|t| t[4]),
                connection_unobserved_bound: t.map(|t| t[5]),
                connection_inclusion_watermark: t.map(|t| t[6]),
            },
        )
}

const OPTIONAL: [&str; 7] = [
    "totalConnections",
    "inFlightConnections",
    "reservedConnectionUnits",
    "enforcedConnectionUnits",
    "connectionHardCap",
    "connectionUnobservedBound",
    "connectionInclusionWatermark",
];

proptest! {
    #![proptest_config(config())]

    /// A generated body decodes strictly to itself; each lenient form is refused with its own
    /// error: `null` for an optional key, an unknown key and a wrong type are `Schema`, an array
    /// in place of the object is `NotObject`, a duplicate key is `NotJson`.
    #[test]
    fn strict_decoding_of_generated_bodies(hb in heartbeat(), pick in any::<prop::sample::Index>(), junk in "[a-z]{1,8}") {
        let v = serde_json::to_value(&hb).unwrap();
        let text = v.to_string();
        prop_assert_eq!(strict::from_slice::<CellHeartbeat>(text.as_bytes()), Ok(hb.clone()));
        let obj = v.as_object().unwrap().clone();

        let mut with_null = obj.clone();
        with_null.insert(OPTIONAL[pick.index(OPTIONAL.len())].into(), Value::Null);
        prop_assert!(matches!(strict::from_value::<CellHeartbeat>(Value::Object(with_null)), Err(Error::Schema(_))));

        let mut unknown = obj.clone();
        unknown.insert(format!("x{junk}"), json!(1));
        prop_assert!(matches!(strict::from_value::<CellHeartbeat>(Value::Object(unknown)), Err(Error::Schema(_))));

        let keys: Vec<String> = obj.keys().cloned().collect();
        let k = &keys[pick.index(keys.len())];
        let mut wrong = obj.clone();
        let swapped = match &obj[k] { Value::String(_) => json!(1), _ => json!("1") };
        wrong.insert(k.clone(), swapped);
        prop_assert!(matches!(strict::from_value::<CellHeartbeat>(Value::Object(wrong)), Err(Error::Schema(_))));

        let mut missing = obj.clone();
        missing.remove("cellId");
        prop_assert!(matches!(strict::from_value::<CellHeartbeat>(Value::Object(missing)), Err(Error::Schema(_))));

        let array = Value::Array(obj.values().cloned().collect()).to_string();
        prop_assert_eq!(strict::from_slice::<CellHeartbeat>(array.as_bytes()), Err(Error::NotObject));

        let dup = format!("{},\"{}\":{}}}", &text[..text.len() - 1], k, obj[k]);
        prop_assert_eq!(strict::from_slice::<CellHeartbeat>(dup.as_bytes()), Err(Error::NotJson));
    }

    /// Any bytes at all: the strict decoder answers with one of its three errors, and the kind of
    /// error follows from what the bytes are (not JSON → `NotJson`, not an object → `NotObject`).
    #[test]
    fn any_bytes_get_the_documented_error(bytes in proptest::collection::vec(any::<u8>(), 0..64), text in "[\\[\\]{}\":,0-9a-z nul]{0,40}") {
        for b in [bytes.as_slice(), text.as_bytes()] {
            let r = strict::from_slice::<CellHeartbeat>(b);
            match serde_json::from_slice::<Value>(b) {
                Err(_) => prop_assert_eq!(r, Err(Error::NotJson)),
                Ok(Value::Object(_)) => prop_assert!(r.is_err()),
                Ok(_) => prop_assert_eq!(r, Err(Error::NotObject)),
            }
        }
    }
}
