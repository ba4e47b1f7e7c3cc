//! Store faults as the cell sees them (issue 11), through a TCP proxy in front of the test
//! Postgres: a cut (connections closed, new ones refused) and a black hole (sockets open, no
//! byte moves). Postgres only: a SQLite file cannot be partitioned.

mod support;
use support::pgproxy;

use std::time::Instant;

use orca_relay::store::testing::TestDb;
use pgproxy::PgProxy;
use serde_json::json;
use support::node::*;

async fn pg() -> Option<TestDb> {
    let t = TestDb::postgres().await;
    if t.is_none() {
        eprintln!(
            "skipping: {} unset",
            orca_relay::store::testing::POSTGRES_ENV
        );
    }
    t
}

/// docs/reference/websocket.md: a transient store fault answers `control_operation_failed`, for
/// `invite-create` and for an install whose activity cannot be acquired.
#[tokio::test]
async fn commands_during_a_db_cut_answer_control_operation_failed() {
    let Some(t) = pg().await else { return };
    let proxy = PgProxy::start().await;
    let s = start_on(&proxy.url(&t.url), &[]).await;
    let host = Host::assigned(&s, "cut-commands").await;
    let mut c = host.connect(&s).await;
    proxy.cut();
    let started = Instant::now();
    c.send(json!({"type":"invite-create","reqId":"r1","relayDeviceId":"d1"}))
        .await;
    assert_eq!(
        c.recv(SEC * 20).await.expect("control open"),
        json!({"type":"control-error","reqId":"r1","code":"control_operation_failed"})
    );
    c.send(
        json!({"type":"device-credential-install","v":1,"reqId":"r2","relayDeviceId":"d1",
        "newResumeTokenHash":"A".repeat(43),
        "authorization":{"mode":"authenticated-direct","directAuthId":"a1"}}),
    )
    .await;
    assert_eq!(
        c.recv(SEC * 20).await.expect("control open"),
        json!({"type":"control-error","reqId":"r2","code":"control_operation_failed"})
    );
    eprintln!("both answered {:?} after the cut", started.elapsed());
    proxy.resume();
    s.running.shutdown().await;
}
