//! The control socket's own guarantees, each in isolation on a real socket:
//! - a `host-hello-ack` that cannot be sent (the host's socket died during activation) leaves an
//!   orphaned session with its 30 s grace, never an `Active` session with a dead control and no
//!   timer (issue 9);
//! - at most `COMMANDS_IN_FLIGHT` (16) commands run at once per control socket; more wait, unread,
//!   and every one still gets its reply.

mod support;

use std::time::Duration;

use futures_util::SinkExt;
use orca_relay::cell::control::COMMANDS_IN_FLIGHT;
use orca_relay::cell::session::State;
use orca_relay::cell::testkit::{self, recv_json};
use orca_relay::contract::limits::ORPHAN_GRACE_MS;
use serde_json::json;
use support::node::*;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::MaybeTlsStream;

/// The socket dies between the proof and the ack: the session is installed, the ack send
/// fails, the session is orphaned and removed after the grace.
#[tokio::test(start_paused = true)]
async fn failed_hello_ack_orphans_the_session() {
    let time = ManualTime::start();
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "dead-ack").await;
    let cell = s.running.cell.clone().expect("cell role");
    // Hold the host's activation turn so that the cell stops between the proof and the ack.
    let turn = cell.registry().activation_lock(&host.key());
    let held = turn.lock_owned().await;
    let proofs = || {
        s.running
            .ctx
            .metrics
            .host_proofs
            .with_label_values(&["ok"])
            .get()
    };
    let proofs_before = proofs();
    let mut ws = testkit::dial(
        &format!("{}/v1/host/control", testkit::ws_origin(&s.cell_url)),
        &[("authorization", format!("Bearer {}", host.token))],
    )
    .await
    .unwrap();
    let hello = host.hello();
    ws.send(Message::text(
        json!({"type":"host-hello","v":1,"relayHostId":host.id.relay_host_id,
            "assignmentEpoch":hello.epoch,"hostPublicKeyB64":host.id.public_b64(),"appVersion":"orca-test/1"})
        .to_string(),
    ))
    .await
    .unwrap();
    let challenge = real_deadline(SEC * 20, "challenge", recv_json(&mut ws, SEC * 60))
        .await
        .unwrap();
    let (proof, _) =
        testkit::answer(&s.cell_url, &host.id, &s.public_url, &hello, &challenge).unwrap();
    ws.send(Message::text(
        json!({"type":"host-challenge-ack","challengeId":challenge["challengeId"],
            "proofB64":orca_relay::crypto::std_encode(&proof)})
        .to_string(),
    ))
    .await
    .unwrap();
    assert!(
        real_eventually(SEC * 10, || proofs() == proofs_before + 1).await,
        "the cell checked the proof"
    );
    assert!(s.session_state(&host.key()).is_none(), "waits for its turn");
    // Reset the connection (linger 0: RST, no FIN), then let the activation run.
    match ws.get_ref() {
        // Deprecated because a non-zero linger blocks the dropping thread; zero never does.
        #[allow(deprecated)]
        MaybeTlsStream::Plain(tcp) => tcp.set_linger(Some(Duration::ZERO)).unwrap(),
        _ => unreachable!("plain ws"),
    }
    drop(ws);
    drop(held);
    assert!(
        real_eventually(SEC * 10, || s.session_state(&host.key())
            == Some(State::Orphaned))
        .await,
        "the session is orphaned, not left active: {:?}",
        s.session_state(&host.key())
    );
    // The orphan grace runs: the session stays orphaned until it ends, then it is gone.
    time.advance(Duration::from_millis(ORPHAN_GRACE_MS - 1))
        .await;
    assert_eq!(s.session_state(&host.key()), Some(State::Orphaned));
    time.advance(Duration::from_millis(1)).await;
    assert!(
        real_eventually(SEC * 10, || s.session_state(&host.key()).is_none()).await,
        "removed after the grace"
    );
    // And the host connects afresh.
    let mut c = host.connect(&s).await;
    assert_eq!(s.session_state(&host.key()), Some(State::Active));
    barrier(&mut c).await;
    time.resume();
    s.running.shutdown().await;
}

/// Commands of one control socket running now (the process tracker names each task).
fn commands_running(s: &Server) -> usize {
    s.running
        .ctx
        .running_tasks()
        .iter()
        .find(|(name, _)| *name == "control-command")
        .map_or(0, |(_, n)| *n)
}

/// 16 commands run at once; the 17th and later wait (the socket is not read meanwhile) and all
/// get their replies once the store answers again. The store is held by a test transaction on
/// the server's own SQLite writer slot, so every command blocks on its first write.
#[tokio::test]
async fn sixteen_commands_in_flight_at_most() {
    const SENT: usize = COMMANDS_IN_FLIGHT + 4;
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "bound").await;
    let mut c = host.connect(&s).await;
    let writer = s.running.ctx.db.begin().await.expect("writer slot");
    for i in 0..SENT {
        c.send(
            json!({"type":"invite-create","reqId":format!("q{i}"),"relayDeviceId":format!("d{i}")}),
        )
        .await;
    }
    assert!(
        eventually(SEC * 10, || commands_running(&s) == COMMANDS_IN_FLIGHT).await,
        "{} commands running",
        commands_running(&s)
    );
    // The other four are sent and readable, but the cell does not start them.
    assert!(
        !eventually(Duration::from_millis(300), || commands_running(&s)
            > COMMANDS_IN_FLIGHT)
        .await,
        "more than {COMMANDS_IN_FLIGHT} commands running: {}",
        commands_running(&s)
    );
    writer.rollback().await;
    let mut replied = std::collections::BTreeSet::new();
    while replied.len() < SENT {
        let v = c.recv(SEC * 10).await.expect("a reply");
        assert!(
            v["type"] == "invite-created" || v["type"] == "control-error",
            "{v}"
        );
        assert!(commands_running(&s) <= COMMANDS_IN_FLIGHT);
        assert!(
            replied.insert(v["reqId"].as_str().unwrap().to_owned()),
            "{v}"
        );
    }
    assert_eq!(
        replied,
        (0..SENT).map(|i| format!("q{i}")).collect(),
        "every command one reply"
    );
    barrier(&mut c).await;
    s.running.shutdown().await;
}

/// A command queued behind the 16 in flight finds an idle cutover registered meanwhile (the
/// host's admission gate closed): it does not run; the control is closed 4503 `resolve-director`,
/// as for a command that arrives during the cutover. The 16 that started before still reply.
#[tokio::test]
async fn a_queued_command_does_not_run_during_an_idle_cutover() {
    let db = orca_relay::store::testing::TestDb::sqlite().await;
    let s = start_on(&db.url, &[]).await;
    let host = Host::assigned(&s, "queued-cutover").await;
    let mut c = host.connect(&s).await;
    let cell = s.running.cell.clone().expect("cell role");
    let writer = s.running.ctx.db.begin().await.expect("writer slot");
    for i in 0..=COMMANDS_IN_FLIGHT {
        c.send(
            json!({"type":"invite-create","reqId":format!("q{i}"),"relayDeviceId":format!("d{i}")}),
        )
        .await;
    }
    assert!(
        eventually(SEC * 10, || commands_running(&s) == COMMANDS_IN_FLIGHT).await,
        "{} commands running",
        commands_running(&s)
    );
    // The cutover registers (gate closed) while the 17th waits for a slot.
    let hold = cell
        .hold_idle_gate(&host.key(), &uuid::Uuid::new_v4().to_string())
        .expect("gate free");
    writer.rollback().await;
    let mut replied = std::collections::BTreeSet::new();
    let close = loop {
        match c.recv(SEC * 10).await {
            Ok(v) => {
                assert!(
                    v["type"] == "invite-created" || v["type"] == "control-error",
                    "{v}"
                );
                replied.insert(v["reqId"].as_str().unwrap_or("").to_owned());
            }
            Err(close) => break close,
        }
    };
    assert_eq!((close.0, close.1.as_str()), (4503, "resolve-director"));
    assert!(
        !replied.contains(&format!("q{COMMANDS_IN_FLIGHT}")),
        "the queued command ran during the cutover: {replied:?}"
    );
    drop(hold);
    s.running.shutdown().await;
}
