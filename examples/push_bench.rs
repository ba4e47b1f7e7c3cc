//! Push gateway throughput: accepted sends/s and delivered/s against a local fake APNs (HTTP/2,
//! verifying every provider JWT), on SQLite or Postgres. Prints one JSON object.
//!
//! ```text
//! cargo run --release --example push_bench -- [sqlite|postgres] [sends] [concurrency]
//! ```
//! Postgres uses `ORCA_RELAY_TEST_POSTGRES_URL` (a fresh schema, dropped afterwards).
//!
//! Each host may queue at most 300 alerts per 15 minutes and make 600 calls a minute (push.md §9,
//! §13), so the load is spread round-robin over enough hosts (≤ 250 sends each), each with its own
//! client address and 8 iOS devices. Deliveries to one registration are strictly sequential (one in
//! flight), so delivered/s scales with the number of registrations.

#[path = "../tests/support/push/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use orca_relay::store::testing::TestDb;
use serde_json::json;
use support::{alert, fakes, ios_token, Host, Opts, Server};

const PER_HOST: usize = 250;
const DEVICES_PER_HOST: usize = 8;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let backend = args.get(1).cloned().unwrap_or_else(|| "sqlite".into());
    let sends: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let concurrency: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(16);
    let t = match backend.as_str() {
        "postgres" => TestDb::postgres()
            .await
            .expect("set ORCA_RELAY_TEST_POSTGRES_URL"),
        _ => TestDb::sqlite().await,
    };
    let apns = fakes::apns().await;
    let mut s = Server::start(
        &t.url,
        Opts {
            apns: Some(apns.base_url()),
            ..Default::default()
        },
    )
    .await;
    // Hosts, each with its own client address and one device.
    let hosts = sends.div_ceil(PER_HOST);
    let mut senders = Vec::new();
    for i in 0..hosts {
        s.xff = format!("10.{}.{}.1", i / 250, i % 250);
        let h = Host::new();
        let tok = h.session(&s).await;
        let mut ids = Vec::new();
        for d in 0..DEVICES_PER_HOST {
            ids.push(
                s.register(&tok, &format!("bench-{d}"), "ios", &ios_token())
                    .await,
            );
        }
        senders.push((s.xff.clone(), tok, ids));
    }
    let s = Arc::new(s);
    let senders = Arc::new(senders);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (s, senders, next) = (s.clone(), senders.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut queued = 0usize;
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if k >= sends {
                    return queued;
                }
                let (xff, tok, ids) = &senders[k % hosts];
                let id = &ids[(k / hosts) % DEVICES_PER_HOST];
                let body = json!({"v":1,"registrationIds":[id],"notification":alert(&format!("b{k}"), k as u64)});
                let (st, _, v) = s
                    .call_as(xff, reqwest::Method::POST, "/v1/send", Some(tok), Some(body.to_string()))
                    .await;
                if st == 200 && v["results"][0]["status"] == "queued" {
                    queued += 1;
                }
            }
        }));
    }
    let mut queued = 0;
    for t in tasks {
        queued += t.await.unwrap();
    }
    let send_s = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(120);
    while apns.seen_count() < queued && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deliver_s = started.elapsed().as_secs_f64();
    let delivered = apns.seen_count();
    let auth_ok = apns.seen().iter().all(|x| x.auth_ok);
    println!(
        "{}",
        json!({
            "backend": backend,
            "hosts": hosts,
            "registrations": hosts * DEVICES_PER_HOST,
            "concurrency": concurrency,
            "sends": sends,
            "queued": queued,
            "delivered": delivered,
            "providerAuthOk": auth_ok,
            "sendSeconds": (send_s * 1000.0).round() / 1000.0,
            "acceptedPerSecond": (queued as f64 / send_s).round(),
            "deliverSeconds": (deliver_s * 1000.0).round() / 1000.0,
            "deliveredPerSecond": (delivered as f64 / deliver_s).round(),
        })
    );
    if let Ok(s) = Arc::try_unwrap(s) {
        s.stop().await;
    }
    apns.stop();
}
