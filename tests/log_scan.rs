//! The log scan (issue 11, acceptance): a full scenario against a real `orca-relay` process
//! (`--role all`, SQLite, APNs pointed at the test's fake, `RUST_LOG=debug` so more is logged than
//! in production) — host placement and control, invite, phone pairing and splice, a resume
//! credential installed and used, the control resumed with its secret, a push session, device and
//! notification delivered, operator routes, and refusals carrying wrong secrets — then every line
//! the process wrote is scanned for every secret, token, invite/resume token, push token,
//! notification text and full relayHostId the run used. None may appear.

// `cluster` and `push` each bring the shared `support/common` pieces; two copies in one test
// binary are harmless.
#![allow(clippy::duplicate_mod)]

mod support;
use support::cluster;
use support::faults;
use support::push;

use std::time::Duration;

use cluster::*;
use faults::*;
use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use orca_relay::crypto::{random_b64u32, token_hash};
use orca_relay::store::testing::temp_dir;
use push::fakes;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_token_or_host_id_in_the_logs_of_a_full_run() {
    let apns = fakes::apns().await;
    let dir = temp_dir("log-scan");
    let db_url = format!("sqlite://{}/relay.sqlite3", dir.display());
    let apns_base = apns.base_url();
    let (mut node, url) = single_node(
        "node",
        &db_url,
        &dir.display().to_string(),
        &[
            ("RUST_LOG", "debug"),
            ("ORCA_RELAY_TRUSTED_PROXY_HOPS", "1"),
            ("ORCA_PUSH_APNS_KEY", push::keys::APNS_KEY_PEM),
            ("ORCA_PUSH_APNS_KEY_ID", "KEYID12345"),
            ("ORCA_PUSH_APPLE_TEAM_ID", "TEAM123456"),
            ("ORCA_PUSH_APNS_BASE_URL", &apns_base),
        ],
    );
    node.start();
    let mut needles: Vec<(String, String)> = vec![
        ("signing key".into(), SIGNING.into()),
        ("cluster key".into(), CLUSTER.into()),
        ("admin token".into(), ADMIN.into()),
        ("apns key".into(), "BEGIN PRIVATE KEY".into()),
    ];
    let mut note = |label: &str, v: &str| needles.push((label.to_string(), v.to_string()));

    // Host: token, assign, control.
    let host = HostIdentity::generate("scan-user");
    note("relayHostId", &host.relay_host_id);
    let token = host.token(SIGNING, &url);
    note("host token", &token);
    note("host token signature", token.rsplit('.').next().unwrap());
    let (cell, epoch) = testkit::assign(&url, &token, &host.relay_host_id)
        .await
        .unwrap();
    let hello = Hello {
        epoch,
        ..Hello::default()
    };
    let mut control = testkit::connect_control(&cell, &host, &token, &url, &hello)
        .await
        .unwrap();
    note("control resume secret", &control.secret);

    // Invite and a phone paired through it; frames spliced both ways.
    let invite = control.create_invite("r1", "d1").await.unwrap();
    note("invite token", &invite);
    note("invite token hash", &token_hash(&invite));
    let xff = vec![("x-forwarded-for", "10.1.2.3".to_string())];
    let mut pair = testkit::pair_phone(&cell, &mut control, &host.relay_host_id, &invite, &xff)
        .await
        .unwrap();
    echo(&mut pair, "scan", Duration::from_secs(5))
        .await
        .unwrap();

    // A resume credential installed on the basis of that pair, then used by a new phone.
    let resume = random_b64u32();
    note("resume token", &resume);
    note("resume token hash", &token_hash(&resume));
    control
        .send(
            json!({"type":"device-credential-install","v":1,"reqId":"i1","relayDeviceId":"d1",
            "newResumeTokenHash": token_hash(&resume),
            "authorization":{"mode":"relay-basis","basisConnId": pair.conn_id}}),
        )
        .await;
    let installed = control.recv(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        installed["type"], "device-credential-installed",
        "{installed}"
    );
    let mut phone = testkit::connect_phone(&cell, &host.relay_host_id, &resume, &xff)
        .await
        .unwrap();
    let open = control.recv(Duration::from_secs(5)).await.unwrap();
    assert_eq!(open["kind"], "resume", "{open}");
    note("conn ticket", open["connTicket"].as_str().unwrap());
    let _data = testkit::connect_data(&cell, &open, control.generation, &xff)
        .await
        .unwrap();
    let hello2 = testkit::recv_json(&mut phone, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(hello2["credentialKind"], "resume", "{hello2}");
    control
        .send(
            json!({"type":"device-resume-confirm","v":1,"reqId":"c1","basisConnId":open["connId"]}),
        )
        .await;
    let confirmed = control.recv(Duration::from_secs(5)).await.unwrap();
    assert_eq!(confirmed["type"], "device-resume-confirmed", "{confirmed}");

    // A phone with a wrong credential is refused (and the wrong value never logged).
    let wrong = random_b64u32();
    note("wrong credential", &wrong);
    let mut bad = testkit::connect_phone(
        &cell,
        &host.relay_host_id,
        &wrong,
        &[("x-forwarded-for", "10.1.2.4".to_string())],
    )
    .await
    .unwrap();
    let _ = testkit::recv_close(&mut bad, Duration::from_secs(5)).await;

    // The control resumed with its secret (the host reconnects).
    let resume_hello = Hello {
        epoch,
        previous_generation: Some(control.generation),
        resume_secret: Some(control.secret.clone()),
        ..Hello::default()
    };
    drop(control);
    let resumed = loop {
        match testkit::connect_control(&cell, &host, &token, &url, &resume_hello).await {
            Ok(c) => break c,
            Err(e) => {
                // The old control may still be closing on the cell's side.
                eprintln!("control resume refused {e:?}, retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    note("control resume secret (new)", &resumed.secret);

    // Push: session, device, notification delivered by the fake APNs.
    let ps = push::Server {
        running: None,
        base: url.clone(),
        client: reqwest::Client::new(),
        xff: "10.3.3.3".into(),
        data: dir.clone(),
    };
    let ph = push::Host::new();
    let session = ph.session(&ps).await;
    note("push session token", &session);
    note("push host fingerprint", &ph.fp);
    let device_token = push::ios_token();
    note("push token", &device_token);
    let reg = ps.register(&session, "dev-1", "ios", &device_token).await;
    let n = push::alert("n-1", 1);
    note("notification title", n["title"].as_str().unwrap());
    note("notification body", n["body"].as_str().unwrap());
    assert_eq!(
        ps.send(&session, &[&reg], n).await,
        vec!["queued".to_string()]
    );
    apns.wait_for(&device_token, 1, Duration::from_secs(20))
        .await;
    // Wrong push session and wrong host token are refused, unlogged.
    let wrong_session = format!("{session}x");
    note("wrong push session", &wrong_session);
    let (st, _) = ps
        .post(
            "/v1/send",
            Some(&wrong_session),
            json!({"v":1,"registrationIds":[reg],"notification":push::alert("n-2", 2)}),
        )
        .await;
    assert_eq!(st, 401);
    let forged = format!("{}.{}", token.rsplit_once('.').unwrap().0, "A".repeat(43));
    note("forged host token", &forged);
    assert!(testkit::assign(&url, &forged, &host.relay_host_id)
        .await
        .is_err());

    // Operator routes, with the right and with a wrong admin token.
    cell_status(&url).await;
    let _ = scrape(&url).await;
    let wrong_admin = "wrong-admin-token-wrong-admin-token-0001".to_string();
    note("wrong admin token", &wrong_admin);
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/admin/cell-status"))
        .bearer_auth(&wrong_admin)
        .json(&json!({"v": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    drop(resumed);
    drop(pair);
    drop(phone);
    // Returns once the process exited and its stderr reader has every line.
    node.terminate();
    let log = node.log.lock().unwrap().clone();
    let hits = scan(&log, &needles);
    println!(
        "log_scan: {} lines scanned for {} values (secrets, tokens, invite/resume tokens, push token, notification text, relayHostId): {} hits",
        log.len(),
        needles.len(),
        hits.len()
    );
    // The scan means something only if the run's events were logged (dependency lines are capped
    // at info by the log formatter, so the count of lines is small; the events are what matter).
    for event in [
        "orca_relay_process_started",
        "orca_relay_host_control_activated",
        "orca_relay_client_accept_completed",
        "orca_push_counters",
    ] {
        assert!(
            log.iter().any(|l| l.contains(event)),
            "{event} was not logged: {log:?}"
        );
    }
    assert!(hits.is_empty(), "secrets in the logs: {hits:#?}");
}
