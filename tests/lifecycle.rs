//! Process lifecycle and bounded control work: one task tracker that names every background task
//! and is empty after shutdown; control commands bounded per socket with every reply delivered.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use support::node::*;

/// Role `all` runs its loops on the process tracker under their names; shutdown ends them all
/// (child tokens of the one shutdown token) before the database closes.
#[tokio::test]
async fn background_tasks_are_tracked_and_end_at_shutdown() {
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let ctx = s.running.ctx.clone();
        let names: BTreeSet<&str> = ctx.running_tasks().iter().map(|(n, _)| *n).collect();
        for want in [
            "accept",
            "cell-heartbeat",
            "cell-renewer",
            "director-sweeps",
            "push-worker",
            "push-counters",
        ] {
            assert!(names.contains(want), "{want} not in {names:?}");
        }
        assert_eq!(s.running.shutdown().await, 0);
        assert!(
            ctx.running_tasks().is_empty(),
            "still running after shutdown: {:?}",
            ctx.running_tasks()
        );
    }
}

/// A burst of commands far above the per-socket bound, sent without reading: every command gets
/// exactly one reply (the bound parks the socket instead of dropping anything).
#[tokio::test]
async fn command_burst_gets_every_reply() {
    const N: usize = 300;
    for db in dbs().await {
        let s = start_on(&db.url, &[]).await;
        let host = Host::assigned(&s, "burst").await;
        let mut c = host.connect(&s).await;
        for i in 0..N {
            c.send(json!({"type":"device-credential-install-status","v":1,
                "reqId": format!("q{i}"),"relayDeviceId":"d1"}))
                .await;
        }
        let mut seen = BTreeSet::new();
        while seen.len() < N {
            let v = c.recv(Duration::from_secs(20)).await.expect("a reply");
            assert_eq!(v["type"], json!("device-credential-install-status-result"));
            assert_eq!(v["state"], json!("not-found"));
            let id = v["reqId"].as_str().unwrap().to_owned();
            assert!(seen.insert(id.clone()), "two replies for {id}");
        }
        assert_eq!(s.running.shutdown().await, 0);
    }
}
