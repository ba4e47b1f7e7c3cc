//! Sticky-reconnect `/v1/assign` throughput and latency against an in-process director.
//!
//! `cargo run --release --example assign_bench -- <database-url> [seconds] [clients] [hosts]`
//! (`sqlite` for a temporary SQLite file). Registers three live uncapped cells, places `hosts`
//! hosts, then `clients` concurrent clients send `{"reconnect":true}` assigns round-robin over the
//! hosts for `seconds`. The per-host minimum interval is lowered to 1 ms so the number measures
//! the lane and the database, not the interval; sticky lane concurrency is 4.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use orca_relay::config::{Config, ServeArgs};
use serde_json::json;

#[derive(Parser)]
struct W {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url_arg = args.get(1).cloned().unwrap_or_else(|| "sqlite".into());
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let clients: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);
    let nhosts: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(200);
    let dir = std::env::temp_dir().join(format!("assign-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = if url_arg == "sqlite" {
        format!("sqlite://{}/bench.sqlite3", dir.display())
    } else {
        url_arg.clone()
    };
    let admin = "admin-token-0123456789abcdef-0123456789";
    let cluster = "cluster-key-0123456789abcdef-0123456789";
    let shk = "selfhostedkey_0123456789abcdef_ABCDEF";
    let w = W::try_parse_from([
        "x",
        "--role",
        "director",
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        &url,
        "--data-dir",
        dir.to_str().unwrap(),
        "--assignment-signing-key",
        "assignment-signing-key-0123456789abcdef",
        "--self-hosted-key",
        shk,
        "--admin-token",
        admin,
        "--cluster-key",
        cluster,
        "--public-sticky-concurrency",
        "4",
        "--database-pool-max",
        "16",
    ])
    .unwrap();
    let run = orca_relay::server::start(Config::from_args(&w.serve).unwrap())
        .await
        .unwrap();
    let d = run.director.clone().unwrap();
    d.sticky_lane.set_interval(Duration::from_millis(1));
    d.placement_lane.set_interval(Duration::from_millis(1));
    let base = format!("http://{}", run.addr);
    let http = reqwest::Client::new();
    for (id, region) in [
        ("a", "us-central1"),
        ("b", "us-central1"),
        ("c", "asia-east2"),
    ] {
        let url = format!("https://{id}.bench.test");
        http.post(format!("{base}/v1/admin/cells"))
            .bearer_auth(admin)
            .json(&json!({"v":1,"cellId":id,"cellUrl":url,"region":region,"capacityRequests":1000000}))
            .send()
            .await
            .unwrap();
        let tok = orca_relay::crypto::jwt::mint_cluster_token(
            cluster.as_bytes(),
            id,
            orca_relay::clock::now_ms(),
        );
        let r = http
            .post(format!("{base}/v1/admin/cell-heartbeat"))
            .bearer_auth(tok)
            .json(&json!({"v":1,"cellId":id,"cellUrl":url,"region":region,"cellIncarnation":uuid::Uuid::new_v4().to_string(),
                "startedAt":1,"ready":true,"observedRequests":0}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let mut hosts = Vec::new();
    for i in 0..nhosts {
        let key: [u8; 32] = rand::random();
        let id = orca_relay::crypto::ident::relay_host_id(&key);
        let r: serde_json::Value = http
            .post(format!("{base}/v1/host-token"))
            .bearer_auth(shk)
            .json(&json!({"relayHostId":id,"hostPublicKeyB64":orca_relay::crypto::b64::std_encode(&key),"userId":format!("u{i}")}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = r["relayToken"].as_str().unwrap().to_string();
        let r = http
            .post(format!("{base}/v1/assign"))
            .bearer_auth(&token)
            .json(&json!({"v":1,"relayHostId":id}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        hosts.push((id, token));
    }
    let hosts = Arc::new(hosts);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (hosts, stop, http, base) = (hosts.clone(), stop.clone(), http.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut i = c;
            while !stop.load(Ordering::Relaxed) {
                let (id, token) = &hosts[i % hosts.len()];
                i += clients;
                let t = Instant::now();
                let r = http
                    .post(format!("{base}/v1/assign"))
                    .bearer_auth(token)
                    .json(&json!({"v":1,"relayHostId":id,"reconnect":true}))
                    .send()
                    .await
                    .unwrap();
                let ok = r.status() == 200;
                let _ = r.bytes().await;
                if ok {
                    lat.push(t.elapsed());
                } else {
                    errors += 1;
                }
            }
            (lat, errors)
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap();
        all.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let p = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    println!(
        "backend={} clients={clients} hosts={nhosts} seconds={elapsed:.1} ok={} errors={errors} rps={:.0} p50={:?} p99={:?}",
        if url_arg == "sqlite" { "sqlite" } else { "postgres" },
        all.len(),
        all.len() as f64 / elapsed,
        p(0.50),
        p(0.99)
    );
    run.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}
