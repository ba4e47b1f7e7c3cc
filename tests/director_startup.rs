//! Start-up registration (docs/configuration.md) and the cell heartbeat client (docs/reference/http.md), both
//! in-process and over HTTP with a cluster token.

mod support;

use std::sync::Arc;
use std::time::Duration;

use orca_relay::cell::heartbeat::start as start_heartbeats;
use orca_relay::cell::heartbeat_client::HttpHeartbeat;
use orca_relay::contract::heartbeat::HeartbeatSink;
use orca_relay::contract::wire::CellHeartbeat;
use orca_relay::store::testing::backends;
use serde_json::json;
use support::director::*;

#[tokio::test]
async fn local_cell_and_configured_cells_registered_without_changing_state() {
    for t in backends().await {
        let cells = r#"[{"id":"X","url":"https://x.cells.test","region":"asia-east2","capacityRequests":10,"connectionHardCap":600,"connectionUnobservedBound":0,"initialState":"migration-only"}]"#;
        let args = [
            "--role",
            "director,cell",
            "--cell-id",
            "local",
            "--cell-capacity",
            "50",
            "--cells",
            cells,
        ];
        let d = start(&t, &args).await;
        let local = d.cell_status("local").await;
        assert_eq!(local["admissionState"], json!("general"));
        assert_eq!(local["capacityRequests"], json!(50));
        assert_eq!(local["cellUrl"], json!(d.base));
        let x = d.cell_status("X").await;
        assert_eq!(x["admissionState"], json!("migration-only"));
        assert_eq!(x["connectionHardCap"], json!(600));
        d.admin(
            "cell-state",
            json!({"v":1,"cellId":"local","state":"existing-only"}),
        )
        .await;
        d.admin("cell-state", json!({"v":1,"cellId":"X","state":"general"}))
            .await;
        d.shutdown().await;
        // A restart upserts again but never changes an admission state.
        let d = start(&t, &args).await;
        assert_eq!(
            d.cell_status("local").await["admissionState"],
            json!("existing-only")
        );
        assert_eq!(d.cell_status("X").await["admissionState"], json!("general"));
        d.shutdown().await;
    }
}

fn body(d: &Dir, id: &str, inc: &str) -> CellHeartbeat {
    serde_json::from_value(d.hb_body(id, US, true, inc, 100, 3, None)).unwrap()
}

#[tokio::test]
async fn in_process_beat_uses_the_same_validation_and_transaction() {
    for t in backends().await {
        let d = start(&t, &["--role", "director,cell", "--cell-id", "local"]).await;
        let dir = d.director().clone();
        let ctx = d.run.ctx.clone();
        // No ORCA_RELAY_DIRECTOR_URL: the composition root wires the director in-process.
        assert!(HttpHeartbeat::from_config(&ctx.config).is_none());
        let target: &dyn HeartbeatSink = &*dir;
        let mut hb: CellHeartbeat = serde_json::from_value(json!({"v":1,"cellId":"local","cellUrl":d.base,"region":US,
            "cellIncarnation":ctx.incarnation,"startedAt":ctx.started_at,"ready":true,"observedRequests":0})).unwrap();
        target.beat(&hb).await.unwrap();
        let s = d.cell_status("local").await;
        assert_eq!(s["live"], json!(true));
        // Same refusals as over HTTP.
        hb.started_at += 1;
        assert_eq!(
            dir.heartbeat(&hb).await,
            Err(orca_relay::director::HeartbeatRefusal::Refused(
                "stale_cell_incarnation"
            ))
        );
        let err = target.beat(&hb).await.unwrap_err();
        assert!(err.starts_with("director_heartbeat_409"), "{err}");
        hb.started_at -= 1;
        hb.total_connections = Some(1);
        assert!(matches!(
            dir.heartbeat(&hb).await,
            Err(orca_relay::director::HeartbeatRefusal::Invalid(_))
        ));
        // A host can be placed on it right away.
        let h = d.host("U").await;
        assert_eq!(d.assign(&h, json!({})).await.body["cellUrl"], json!(d.base));
        d.shutdown().await;
    }
}

#[tokio::test]
async fn http_client_beats_with_a_cluster_token_and_loops_until_shutdown() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, false).await;
        // The cell side: its own context with ORCA_RELAY_DIRECTOR_URL set.
        let dir = orca_relay::store::testing::temp_dir("orca-cell-ctx");
        let config = support::director::common::serve::config(&[
            "x",
            "--role",
            "cell",
            "--cell-id",
            "A",
            "--cell-url",
            &cell_url("A"),
            "--director-url",
            &d.base,
            "--database-url",
            &t.url,
            "--data-dir",
            dir.to_str().unwrap(),
            "--assignment-signing-key",
            SIGNING,
            "--cluster-key",
            CLUSTER,
            "--admin-token",
            ADMIN,
        ]);
        let db = orca_relay::store::Db::connect(&t.url, 2).await.unwrap();
        let ctx =
            orca_relay::app::Ctx::new(config, db, Arc::new(orca_relay::metrics::Metrics::new()));
        let target = Arc::new(HttpHeartbeat::from_config(&ctx.config).unwrap());
        let inc = uuid();
        target.beat(&body(&d, "A", &inc)).await.unwrap();
        assert_eq!(
            d.cell_status("A").await["runtime"]["cellIncarnation"],
            json!(inc)
        );
        let err = target.beat(&body(&d, "B", &inc)).await.unwrap_err();
        assert_eq!(err, "director_heartbeat_409");
        // The loop: first beat at once, stops on shutdown.
        let inc2 = uuid();
        let b = body(&d, "A", &inc2);
        let mut b = b;
        b.started_at = 200;
        // The cell's real loop, with a fixed body.
        let task = start_heartbeats(&ctx, target, move || std::future::ready(b.clone())).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while d.cell_status("A").await["runtime"]["cellIncarnation"] != json!(inc2) {
            assert!(std::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ctx.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .unwrap()
            .unwrap();
        d.shutdown().await;
    }
}
