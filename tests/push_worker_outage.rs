//! During a database failure the delivery worker logs `orca_push_worker_failed` once per failed
//! run (ARCHITECTURE.md), not once per drain (12 per run): the push_deliveries table is renamed away so
//! every claim fails, on SQLite and, when configured, on Postgres.

mod support;

use std::time::Duration;

use support::push::*;

fn worker_failed_lines() -> usize {
    logs()
        .iter()
        .filter(|l| l.contains("orca_push_worker_failed"))
        .count()
}

#[tokio::test]
async fn worker_failure_logged_once_per_failed_run() {
    for t in orca_relay::store::testing::backends().await {
        let s = Server::start(&t.url, Opts::default()).await;
        let push = s.running().push.clone().expect("push role");
        tokio::time::timeout(Duration::from_secs(10), push.worker_settled())
            .await
            .expect("idle before the failure");
        let lines_before = worker_failed_lines();
        let (_, failed_before) = push.worker_run_counts();
        t.db.execute(
            "ALTER TABLE push_deliveries RENAME TO push_deliveries_away",
            &[],
        )
        .await
        .unwrap();
        // Two failed runs (the 1 s tick starts one each second).
        assert!(
            eventually(Duration::from_secs(10), || async {
                push.worker_run_counts().1 >= failed_before + 2
            })
            .await,
            "runs fail while the table is gone"
        );
        let (_, failed_low) = push.worker_run_counts();
        let lines = worker_failed_lines() - lines_before;
        let (_, failed_high) = push.worker_run_counts();
        let (low, high) = (failed_low - failed_before, failed_high - failed_before);
        assert!(
            lines as u64 >= low && lines as u64 <= high,
            "{lines} lines for {low}..={high} failed runs"
        );
        assert!(logs()
            .iter()
            .any(|l| l.contains("orca_push_worker_failed") && l.contains("\"target\":\"claim\"")));
        t.db.execute(
            "ALTER TABLE push_deliveries_away RENAME TO push_deliveries",
            &[],
        )
        .await
        .unwrap();
        // Healed: the worker goes idle again without a failure.
        tokio::time::timeout(Duration::from_secs(10), push.worker_settled())
            .await
            .expect("idle after the failure");
        s.stop().await;
    }
}
