//! The seed corpora of the fuzz targets (`fuzz/corpus/<target>/seed-*`), built from the crate's own
//! minting and challenge functions with the fixed keys, times and randomness the targets use, and
//! from the spec's example bodies and frames.
//!
//! `cargo test --test prop_fuzz_seeds` checks that every seed is still accepted by the parser it
//! seeds (a seed the schema has drifted away from no longer leads the fuzzer past the first
//! check) and that its file is in the corpus. `ORCA_FUZZ_WRITE_SEEDS=1 cargo test --test
//! prop_fuzz_seeds` (re)writes the files.

use std::path::PathBuf;

use orca_relay::cell::frames::{self, Split};
use orca_relay::crypto::{
    self, challenge, host_proof, jwt, nacl, push_proof, ChallengeRandomness, HostBinding,
};
use serde_json::json;

/// The fuzz targets' fixed inputs (fuzz/src/lib.rs and the proof targets).
const NOW_MS: i64 = 1_700_000_000_123;
const SIGNING_KEY: &str = "0123456789abcdef0123456789abcdef";
const HOST_SECRET: [u8; 32] = [7; 32];
const PUSH_ORIGIN: &str = "https://push.example.test";
const CHALLENGE_ID: &str = "00000000-0000-4000-8000-000000000000";
const B64U32: &str = "BQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU";

fn random() -> ChallengeRandomness {
    ChallengeRandomness {
        ephemeral_secret: [1; 32],
        nonce: [2; 24],
        challenge_secret: [3; 32],
        challenge_id: CHALLENGE_ID.into(),
    }
}

fn host_public() -> [u8; 32] {
    nacl::public_key(&HOST_SECRET)
}

fn binding() -> HostBinding {
    HostBinding {
        relay_origin: "https://cell-1.example.test".into(),
        user_id: "user-1".into(),
        profile_id: "https://relay.example.test".into(),
        organization_id: String::new(),
        relay_host_id: crypto::relay_host_id(&host_public()),
        host_public: host_public(),
        assignment_epoch: 1,
        previous_generation: None,
        resume_requested: false,
    }
}

/// `(target, seed name, bytes)`.
type Seed = (&'static str, String, Vec<u8>);

fn with_selector(sel: u8, rest: &[u8]) -> Vec<u8> {
    let mut v = vec![sel];
    v.extend_from_slice(rest);
    v
}

fn seeds() -> Vec<Seed> {
    let mut out: Vec<Seed> = Vec::new();
    let mut add =
        |t: &'static str, name: &str, bytes: Vec<u8>| out.push((t, name.to_string(), bytes));
    let key_b64 = crypto::std_encode(&host_public());
    let hid = crypto::relay_host_id(&host_public());

    // First frames of the three legs.
    let hello = json!({"type":"host-hello","v":1,"relayHostId":hid,"assignmentEpoch":1,
        "hostPublicKeyB64":key_b64,"appVersion":"1.4.2"});
    add(
        "leg_first_frames",
        "host-hello",
        hello.to_string().into_bytes(),
    );
    let mut resume = hello.clone();
    resume["previousGeneration"] = json!(3);
    resume["controlResumeSecret"] = json!(B64U32);
    add(
        "leg_first_frames",
        "host-hello-resume",
        resume.to_string().into_bytes(),
    );
    let issued = crypto::host_proof::issue_host_challenge_with(&binding(), NOW_MS, &random());
    let ack = json!({"type":"host-challenge-ack","challengeId":CHALLENGE_ID,
        "proofB64":crypto::std_encode(issued.expected_proof())});
    add(
        "leg_first_frames",
        "host-challenge-ack",
        ack.to_string().into_bytes(),
    );
    let auth = json!({"type":"relay-auth","v":1,"mode":"connect","credential":B64U32});
    add(
        "leg_first_frames",
        "relay-auth",
        auth.to_string().into_bytes(),
    );
    let data = json!({"type":"host-data-auth","v":1,"connTicket":B64U32,"generation":2});
    add(
        "leg_first_frames",
        "host-data-auth",
        data.to_string().into_bytes(),
    );

    // Control messages (docs/reference/websocket.md).
    let control = [
        ("pong", json!({"type":"pong","t":NOW_MS})),
        (
            "auth-refresh",
            json!({"type":"auth-refresh","relayJwt":"a.b.c"}),
        ),
        (
            "invite-create",
            json!({"type":"invite-create","reqId":"r1","relayDeviceId":"d1"}),
        ),
        (
            "install-basis",
            json!({"type":"device-credential-install","v":1,"reqId":"r2","relayDeviceId":"d1",
            "newResumeTokenHash":B64U32,"authorization":{"mode":"relay-basis","basisConnId":"c1"}}),
        ),
        (
            "install-direct",
            json!({"type":"device-credential-install","v":1,"reqId":"r3","relayDeviceId":"d1",
            "newResumeTokenHash":B64U32,"expectedCurrentHash":B64U32,
            "authorization":{"mode":"authenticated-direct","directAuthId":"a1"}}),
        ),
        (
            "install-status",
            json!({"type":"device-credential-install-status","v":1,"reqId":"r4","relayDeviceId":"d1"}),
        ),
        (
            "resume-confirm",
            json!({"type":"device-resume-confirm","v":1,"reqId":"r5","basisConnId":"c1"}),
        ),
        (
            "revoke",
            json!({"type":"device-revoke","reqId":"r6","relayDeviceId":"d1"}),
        ),
    ];
    for (name, v) in control {
        add("control_frames", name, v.to_string().into_bytes());
    }
    add(
        "control_frames",
        "capabilities",
        b"pending-conn-details, idle-regional-rehome-v1".to_vec(),
    );

    // Relay route bodies.
    add(
        "relay_bodies",
        "assign",
        json!({"v":1,"relayHostId":hid}).to_string().into_bytes(),
    );
    add(
        "relay_bodies",
        "assign-options",
        json!({"v":1,"relayHostId":hid,"reconnect":true,
        "preferredRegion":"eu-west1","regionCorrection":{"v":1,"action":"issue-window"}})
        .to_string()
        .into_bytes(),
    );
    add("relay_bodies", "assign-report", json!({"v":1,"relayHostId":hid,"regionCorrection":{"v":1,
        "action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,"outcome":"conclusive",
        "measurements":{"us-central1":125,"asia-east2":100}}}).to_string().into_bytes());
    add("relay_bodies", "assign-inconclusive", json!({"v":1,"relayHostId":hid,"regionCorrection":{"v":1,
        "action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,"outcome":"inconclusive",
        "reason":"timeout"}}).to_string().into_bytes());
    add(
        "relay_bodies",
        "resolve",
        json!({"v":1,"relayHostId":hid,"resumeToken":B64U32})
            .to_string()
            .into_bytes(),
    );
    add(
        "relay_bodies",
        "host-token",
        json!({"v":1,"relayHostId":hid,"hostPublicKeyB64":key_b64,
        "userId":"user-1"})
        .to_string()
        .into_bytes(),
    );

    // Admin and node route bodies.
    let incarnation = "6f1c2c8e-3b7a-4d2e-9f00-0123456789ab";
    let admin = [
        (
            "cells",
            json!({"v":1,"cellId":"cell-1","cellUrl":"https://cell-1.example.test","region":"eu-west1",
            "capacityRequests":100,"connectionHardCap":1000,"connectionUnobservedBound":100,"initialState":"general"}),
        ),
        (
            "cell-state",
            json!({"v":1,"cellId":"cell-1","state":"existing-only","rollIsolated":true,"rollIsolatedAt":NOW_MS}),
        ),
        (
            "cell-fence",
            json!({"v":1,"cellId":"cell-1","cellIncarnation":incarnation}),
        ),
        ("cell-status", json!({"v":1,"cellId":"cell-1"})),
        (
            "host-whereabouts",
            json!({"v":1,"relayHostId":hid,"userId":"user-1"}),
        ),
        (
            "evacuate",
            json!({"v":1,"userId":"user-1","relayHostId":hid,"targetCellId":"cell-2"}),
        ),
        (
            "evacuate-cell",
            json!({"v":1,"sourceCellId":"cell-1","targetCellId":"cell-2","limit":10}),
        ),
        (
            "migration-complete",
            json!({"v":1,"userId":"user-1","relayHostId":hid,"assignmentEpoch":2}),
        ),
        ("drain", json!({"v":1,"graceMs":1000,"paceWindowMs":500})),
        ("runtime-status", json!({"v":1})),
        (
            "rehome-control",
            json!({"v":1,"action":"apply","expectedGeneration":0,"enabled":true,"ratePerMinute":10,
            "cohortPercent":100,"hostCooldownMs":60000,"preferenceMaxAgeMs":60000,
            "confirmation":"ENABLE_REGIONAL_REHOMING"}),
        ),
        (
            "cell-heartbeat",
            json!({"v":1,"cellId":"cell-1","cellUrl":"https://cell-1.example.test","region":"eu-west1",
            "cellIncarnation":incarnation,"startedAt":NOW_MS,"ready":true,"observedRequests":3,
            "totalConnections":10,"inFlightConnections":1,"reservedConnectionUnits":2,"enforcedConnectionUnits":13,
            "connectionHardCap":1000,"connectionUnobservedBound":100,"connectionInclusionWatermark":5}),
        ),
        (
            "cell-rehome-status",
            json!({"v":1,"cellId":"cell-1","cellIncarnation":incarnation,"regionalRehomeProtocol":1,
            "safety":{"observedAt":NOW_MS,"sqlFailures":0,"reconnects":0,"controlActivityRecoveryFailures":0,
            "databasePoolWaiting":0,"databasePoolWaitersMax":0,"databasePoolWaitMsMax":0}}),
        ),
    ];
    for (name, v) in admin {
        add("admin_bodies", name, v.to_string().into_bytes());
    }

    // Push gateway bodies.
    let push = [
        ("challenge", json!({"v":1,"hostPublicKeyB64":key_b64})),
        (
            "session",
            json!({"v":1,"challengeId":CHALLENGE_ID,"proofB64":key_b64}),
        ),
        (
            "device-ios",
            json!({"v":1,"deviceId":"phone-1","platform":"ios","token":"ab12cd","apnsEnvironment":"sandbox"}),
        ),
        (
            "device-android",
            json!({"v":1,"deviceId":"phone-2","platform":"android",
            "token":"fcm-token_0123456789:abcdefghijklmnop"}),
        ),
        (
            "send",
            json!({"v":1,"registrationIds":["r1","r2"],"notification":{"notificationId":"pane-7:done",
            "notificationSeq":7,"notificationEpoch":"epoch-a","source":"agent-task-complete","agentState":"finished","title":"Done",
            "body":"Task finished","worktreeId":"w1","paneKey":"p1","sound":true,"kind":"alert","expiresAt":NOW_MS}}),
        ),
        (
            "send-minimal",
            json!({"v":1,"registrationIds":["r1"],"notification":{"notificationSeq":1,
            "notificationEpoch":"e","source":"plugin","agentState":null,"title":"t","body":""}}),
        ),
    ];
    for (name, v) in push {
        add("push_bodies", name, v.to_string().into_bytes());
    }

    // Host tokens: a minted one, and header + claims for the signing selector.
    let host_key = jwt::self_hosted_key(SIGNING_KEY);
    let (token, _) = jwt::mint_host_token(
        &host_key,
        "user-1",
        "https://relay.example.test",
        &hid,
        NOW_MS,
    );
    add("host_token", "minted", with_selector(0, token.as_bytes()));
    add(
        "host_token",
        "bearer",
        with_selector(0, format!("Bearer {token}").as_bytes()),
    );
    let claims = json!({"sub":"user-1","prof":"https://relay.example.test","iss":"https://relay.example.test",
        "org":"org-1","relayHostId":hid,"purpose":jwt::HOST_PURPOSE,"aud":[jwt::HOST_AUDIENCE],
        "iat":NOW_MS / 1000,"exp":NOW_MS / 1000 + 900});
    add(
        "host_token",
        "signed-claims",
        with_selector(
            1,
            format!("{}\n{claims}", r#"{"alg":"HS256","typ":"JWT"}"#).as_bytes(),
        ),
    );

    // Cluster tokens and leases.
    let cluster = jwt::mint_cluster_token(SIGNING_KEY.as_bytes(), "cell-1", NOW_MS);
    add(
        "cluster_token",
        "cluster",
        with_selector(0, cluster.as_bytes()),
    );
    let lease = jwt::mint_assignment_lease(
        SIGNING_KEY,
        "https://relay.example.test",
        "user-1",
        "cell-1",
        "https://cell-1.example.test",
        3,
        &hid,
        NOW_MS,
    );
    add("cluster_token", "lease", with_selector(0, lease.as_bytes()));
    let cluster_claims = json!({"sub":"cell-1","aud":jwt::CLUSTER_AUDIENCE,"iat":NOW_MS / 1000,"exp":NOW_MS / 1000 + 30});
    add(
        "cluster_token",
        "signed-cluster",
        with_selector(
            1,
            format!("{}\n{cluster_claims}", r#"{"alg":"HS256","typ":"JWT"}"#).as_bytes(),
        ),
    );
    let lease_header = json!({"alg":"HS256","typ":"JWT","kid":jwt::lease_kid(SIGNING_KEY)});
    let lease_claims =
        jwt::verify_assignment_lease(SIGNING_KEY, &lease, NOW_MS).expect("a fresh lease");
    add(
        "cluster_token",
        "signed-lease",
        with_selector(
            1,
            format!(
                "{lease_header}\n{}",
                serde_json::to_string(&lease_claims).unwrap()
            )
            .as_bytes(),
        ),
    );

    // Host proof: the frame as JSON, the opened plaintext, the transcript.
    let frame = &issued.frame;
    add(
        "host_proof",
        "frame",
        with_selector(0, serde_json::to_string(frame).unwrap().as_bytes()),
    );
    let opened = open(
        &frame.ciphertext_b64,
        &frame.nonce_b64,
        &frame.relay_ephemeral_public_key_b64,
    );
    add("host_proof", "plaintext", with_selector(1, &opened));
    let (transcript, _) =
        challenge::split_plaintext(host_proof::CHALLENGE_DOMAIN, &opened).unwrap();
    add("host_proof", "transcript", with_selector(2, transcript));

    // Push proof: the same three forms.
    let (resp, _) =
        push_proof::issue_push_challenge_with(PUSH_ORIGIN, &host_public(), NOW_MS, &random());
    add(
        "push_proof",
        "response",
        with_selector(0, serde_json::to_string(&resp).unwrap().as_bytes()),
    );
    let opened = open(
        &resp.ciphertext_b64,
        &resp.nonce_b64,
        &resp.gateway_ephemeral_public_key_b64,
    );
    add("push_proof", "plaintext", with_selector(1, &opened));
    let (transcript, _) =
        challenge::split_plaintext(push_proof::CHALLENGE_DOMAIN, &opened).unwrap();
    add("push_proof", "transcript", with_selector(2, transcript));

    // Leg paths, X-Forwarded-For, ORCA_RELAY_CELLS.
    for (name, p) in [
        ("control", "/v1/host/control"),
        ("escaped-id", "abcdefghijklmno%70"),
        ("utf8", "conn-%C3%A9"),
        ("host-id", hid.as_str()),
    ] {
        add("leg_path", name, p.as_bytes().to_vec());
    }
    add(
        "forwarded_for",
        "two-hops",
        with_selector(2, b"203.0.113.9, 198.51.100.2\n10.0.0.1"),
    );
    add(
        "forwarded_for",
        "ipv6",
        with_selector(1, b"[2001:db8::1]\n::ffff:192.0.2.1"),
    );
    add("cells_config", "two-cells", json!([
        {"id":"cell-1","url":"https://cell-1.example.test","region":"eu-west1","capacityRequests":100},
        {"id":"cell-2","url":"http://127.0.0.1:8081","region":"us-central1","capacityRequests":50,
         "connectionHardCap":1000,"connectionUnobservedBound":100,"initialState":"migration-only"}
    ]).to_string().into_bytes());
    // A JWKS as the issuer serves it: one usable P-256 signing key beside one the relay skips.
    add("jwks", "issuer", json!({"keys":[
        {"kty":"EC","crv":"P-256","kid":"k1","alg":"ES256","use":"sig",
         "x":"6kHldADTVZzDM-1LOrbH-ktVMakMYRsGRQjBaEKQrA4","y":"0Sbl4WTOKhgKW0in5IEXhWijLxMxdBsyYa6rMFwPXTA"},
        {"kty":"RSA","kid":"r1","n":"AQAB","e":"AQAB"}
    ]}).to_string().into_bytes());
    out
}

fn open(ciphertext_b64: &str, nonce_b64: &str, ephemeral_b64: &str) -> Vec<u8> {
    nacl::open(
        &crypto::b64::std_decode_canonical(ciphertext_b64).unwrap(),
        &crypto::decode_nonce24(nonce_b64).unwrap(),
        &crypto::decode_key32(ephemeral_b64).unwrap(),
        &HOST_SECRET,
    )
    .expect("the challenge box opens with the host key")
}

fn text(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap()
}

/// Every seed is accepted by the parser it seeds, so the fuzzer starts from valid inputs.
fn assert_accepted(target: &str, name: &str, b: &[u8]) {
    let regions: Vec<String> = ["us-central1", "asia-east2", "eu-west1"]
        .map(String::from)
        .to_vec();
    let ok = match target {
        "leg_first_frames" | "control_frames" if name == "capabilities" => {
            frames::capabilities(text(b).lines()).len() == 2
        }
        "leg_first_frames" | "control_frames" => match frames::split(text(b)) {
            Split::Typed(t, m) => match t.as_str() {
                "host-hello" => frames::body::<frames::HostHello>(m).is_some(),
                "host-challenge-ack" => frames::body::<frames::ChallengeAck>(m).is_some_and(|a| {
                    crypto::host_proof::issue_host_challenge_with(&binding(), NOW_MS, &random())
                        .verify_ack(&a.challenge_id, &a.proof_b64, NOW_MS)
                }),
                "relay-auth" => orca_relay::leg::frame::relay_auth(text(b)).is_some(),
                "host-data-auth" => frames::body::<frames::HostDataAuth>(m).is_some(),
                "pong" => frames::body::<frames::Pong>(m).is_some(),
                "auth-refresh" => frames::body::<frames::AuthRefresh>(m).is_some(),
                "invite-create" => frames::body::<frames::InviteCreate>(m).is_some(),
                "device-credential-install" => frames::body::<frames::Install>(m).is_some(),
                "device-credential-install-status" => {
                    frames::body::<frames::InstallStatus>(m).is_some()
                }
                "device-resume-confirm" => frames::body::<frames::ResumeConfirm>(m).is_some(),
                "device-revoke" => frames::body::<frames::Revoke>(m).is_some(),
                _ => false,
            },
            _ => false,
        },
        "relay_bodies" => {
            use orca_relay::director::{host_token, routes};
            host_token::decode_request(b).is_ok()
                || routes::decode_body_for_fuzzing("/v1/assign", b, &regions)
                    .is_some_and(|r| r.is_ok())
                || routes::decode_body_for_fuzzing("/v1/resolve", b, &regions)
                    .is_some_and(|r| r.is_ok())
        }
        "admin_bodies" => {
            use orca_relay::contract::wire::{CellHeartbeat, CellRehomeStatus};
            use orca_relay::director::{admin, heartbeat};
            let path = format!("/v1/admin/{name}");
            match name {
                "drain" => orca_relay::cell::drain::decode(b).is_ok(),
                "runtime-status" => orca_relay::server::decode_version_only(b).is_ok(),
                "rehome-control" => orca_relay::rehome::rules::parse_control_request(
                    &serde_json::from_slice(b).unwrap(),
                )
                .is_some(),
                "cell-heartbeat" => orca_relay::http::parse::<CellHeartbeat>(b)
                    .is_ok_and(|hb| heartbeat::validate(&hb, &regions).is_ok()),
                "cell-rehome-status" => orca_relay::http::parse::<CellRehomeStatus>(b)
                    .is_ok_and(|s| heartbeat::validate_rehome_status(&s)),
                _ => admin::decode_body_for_fuzzing(&path, b).is_some_and(|r| r.is_ok()),
            }
        }
        "push_bodies" => {
            use orca_relay::http::parse;
            use orca_relay::push::model::*;
            match name {
                "challenge" => parse::<ChallengeRequest>(b).is_ok(),
                "session" => parse::<SessionRequest>(b).is_ok_and(|s| s.valid()),
                "device-ios" | "device-android" => {
                    parse::<DeviceRequest>(b).is_ok_and(|d| d.validate().is_some())
                }
                _ => parse::<SendRequest>(b).is_ok_and(|s| s.notification.validate().is_some()),
            }
        }
        "host_token" => {
            let key = jwt::self_hosted_key(SIGNING_KEY);
            let token = match b[0] {
                0 => text(&b[1..]).trim_start_matches("Bearer ").to_string(),
                _ => signed(&key, &b[1..]),
            };
            let v = jwt::HostTokenVerifier::new(key, None);
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(v.verify(&token, NOW_MS))
                .is_ok()
        }
        "cluster_token" => {
            let token = match b[0] {
                0 => text(&b[1..]).to_string(),
                _ => signed(SIGNING_KEY.as_bytes(), &b[1..]),
            };
            jwt::verify_cluster_token(SIGNING_KEY.as_bytes(), &token, NOW_MS).is_ok()
                || jwt::verify_assignment_lease(SIGNING_KEY, &token, NOW_MS).is_ok()
        }
        "host_proof" => match b[0] {
            0 => {
                let frame = serde_json::from_slice(&b[1..]).unwrap();
                host_proof::answer_host_challenge(&HOST_SECRET, &frame, &binding(), NOW_MS).is_ok()
            }
            _ => challenge::parse_fields(&b[1..]).is_some() || b[0] == 1,
        },
        "push_proof" => match b[0] {
            0 => {
                let resp = serde_json::from_slice(&b[1..]).unwrap();
                push_proof::answer_push_challenge(&HOST_SECRET, PUSH_ORIGIN, &resp, NOW_MS).is_ok()
            }
            _ => challenge::parse_fields(&b[1..]).is_some() || b[0] == 1,
        },
        "leg_path" => orca_relay::leg::path::percent_decode(text(b)).is_some(),
        "forwarded_for" => true,
        "cells_config" => {
            orca_relay::config::parse_cells(text(b), &regions).is_ok_and(|c| c.len() == 2)
        }
        "jwks" => crypto::jwt::parse_jwks_for_fuzzing(b) == Ok(1),
        other => panic!("no check for target {other}"),
    };
    assert!(ok, "seed {target}/{name} is not accepted by its parser");
}

/// The fuzz targets' signing selector: header and claims split at the first newline.
fn signed(key: &[u8], rest: &[u8]) -> String {
    let i = rest.iter().position(|&c| c == b'\n').unwrap();
    let input = format!(
        "{}.{}",
        crypto::url_encode(&rest[..i]),
        crypto::url_encode(&rest[i + 1..])
    );
    let mac = crypto::hmac_sha256(key, input.as_bytes());
    format!("{input}.{}", crypto::url_encode(&mac))
}

#[test]
fn every_seed_is_valid_and_in_the_corpus() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let write = std::env::var_os("ORCA_FUZZ_WRITE_SEEDS").is_some();
    let seeds = seeds();
    assert!(seeds.len() >= 55, "{} seeds", seeds.len());
    for (target, name, bytes) in &seeds {
        assert_accepted(target, name, bytes);
        let path = root.join(target).join(format!("seed-{name}"));
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, bytes).unwrap();
        } else {
            assert!(
                path.exists(),
                "{} is missing: run ORCA_FUZZ_WRITE_SEEDS=1 cargo test --test prop_fuzz_seeds",
                path.display()
            );
        }
    }
}
