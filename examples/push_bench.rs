//! Push gateway throughput: accepted recipients/s and delivered/s against a local fake APNs
//! (HTTP/2, verifying the provider JWT), on SQLite and Postgres in one run. Prints one JSON object
//! per backend.
//!
//! ```text
//! cargo run --release --example push_bench -- [--backend sqlite|postgres|both] \
//!     [--registrations 1000] [--senders 16] [--duration 8] [--fanout 20] [--pool 10] [--backlog 10]
//! ```
//! Postgres uses `ORCA_RELAY_TEST_POSTGRES_URL` (a fresh schema, dropped afterwards); `both` (the
//! default) skips Postgres when it is unset.
//!
//! Each host may queue at most 300 events per 15 minutes and make 600 calls a minute (push.md §9,
//! §13); one send fans out to up to 20 of its registrations and counts once. So the registrations
//! are spread over hosts of `fanout` devices each (own client address each), and every send goes
//! to all of one host's devices, hosts taken round-robin. `senders` tasks send for `duration`
//! seconds; then the bench waits until the fake has seen every queued delivery.
//!
//! Figures: `acceptedPerSecond` = queued recipients / send window; `deliveredPerSecond` =
//! deliveries / (first send → last provider request); `backlogAtSendEnd` = queued but not yet
//! delivered when the senders stopped, and `drainPerSecond` = that backlog / (send end → last
//! provider request): the worker's rate with work waiting. Deliveries to one registration are
//! strictly sequential (one in flight per registration).
//!
//! Then the `backlog` phase: the server stops, `backlog` alerts per registration are queued
//! through the same accept transaction the send route runs (directly on the database), and a fresh
//! server drains them: `backlog.deliveredPerSecond` = rows / (server start → last provider
//! request), the worker's throughput when work is waiting.

#[path = "../tests/support/push/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orca_relay::store::testing::TestDb;
use serde_json::json;
use support::{common, fakes, ios_token, server_args, Host, Opts, Server};

struct Args {
    backend: String,
    registrations: usize,
    senders: usize,
    duration: Duration,
    fanout: usize,
    pool: usize,
    backlog: usize,
}

fn parse() -> Args {
    let mut a = Args {
        backend: "both".into(),
        registrations: 1000,
        senders: 16,
        duration: Duration::from_secs(8),
        fanout: 20,
        pool: 10,
        backlog: 10,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        let n = || v.parse::<usize>().expect("a number");
        match argv[i].as_str() {
            "--backend" => a.backend = v.clone(),
            "--registrations" => a.registrations = n(),
            "--senders" => a.senders = n(),
            "--duration" => a.duration = Duration::from_secs_f64(v.parse().expect("seconds")),
            "--fanout" => a.fanout = n().clamp(1, 20),
            "--pool" => a.pool = n(),
            "--backlog" => a.backlog = n(),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = parse();
    let mut backends = Vec::new();
    if a.backend == "sqlite" || a.backend == "both" {
        backends.push(("sqlite", TestDb::sqlite().await));
    }
    if a.backend == "postgres" || a.backend == "both" {
        match TestDb::postgres().await {
            Some(t) => backends.push(("postgres", t)),
            None if a.backend == "both" => {
                eprintln!("ORCA_RELAY_TEST_POSTGRES_URL unset: Postgres skipped")
            }
            None => panic!("set ORCA_RELAY_TEST_POSTGRES_URL"),
        }
    }
    for (name, t) in backends {
        let v = bench(name, &t, &a).await;
        println!("{v}");
    }
}

async fn start(db_url: &str, apns: &fakes::Fake, pool: usize) -> Server {
    support::init_logs();
    let data = orca_relay::store::testing::temp_dir("orca-push-bench");
    let mut args = server_args(
        db_url,
        &data,
        &Opts {
            apns: Some(apns.base_url()),
            ..Default::default()
        },
    );
    let at = args
        .iter()
        .position(|x| x == "--database-pool-max")
        .unwrap();
    args[at + 1] = pool.to_string();
    let running = common::serve::start(&args).await;
    Server {
        base: format!("http://{}", running.addr),
        running: Some(running),
        client: reqwest::Client::new(),
        xff: "10.255.0.1".into(),
        data,
    }
}

async fn bench(backend: &str, t: &TestDb, a: &Args) -> serde_json::Value {
    let apns = fakes::apns().await;
    let mut s = start(&t.url, &apns, a.pool).await;
    // Hosts of `fanout` devices each, registered by 16 tasks at once.
    let hosts = a.registrations.div_ceil(a.fanout);
    let mut setup = Vec::new();
    for i in 0..hosts {
        s.xff = format!("10.{}.{}.1", i / 250, i % 250);
        let h = Host::new();
        let tok = h.session(&s).await;
        let devices = a.fanout.min(a.registrations - i * a.fanout);
        setup.push((s.xff.clone(), tok, devices, h.fp.clone()));
    }
    let s = Arc::new(s);
    let mut senders = Vec::new();
    for chunk in setup.chunks(hosts.div_ceil(16)) {
        let (s, chunk) = (s.clone(), chunk.to_vec());
        senders.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for (xff, tok, devices, fp) in chunk {
                let mut ids = Vec::new();
                for d in 0..devices {
                    let body = json!({"v":1,"deviceId":format!("bench-{d}"),"platform":"ios",
                        "token":ios_token(),"apnsEnvironment":"sandbox"});
                    let (st, _, v) = s
                        .call_as(
                            &xff,
                            reqwest::Method::POST,
                            "/v1/devices",
                            Some(&tok),
                            Some(body.to_string()),
                        )
                        .await;
                    assert_eq!(st, 200, "{v}");
                    ids.push(v["registrationId"].as_str().unwrap().to_string());
                }
                out.push((xff, tok, ids, fp));
            }
            out
        }));
    }
    let mut hosts_ready = Vec::new();
    for t in senders {
        hosts_ready.extend(t.await.unwrap());
    }
    let registrations: usize = hosts_ready.iter().map(|h| h.2.len()).sum();
    let hosts_ready = Arc::new(hosts_ready);
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.senders {
        let (s, h, next, stop) = (s.clone(), hosts_ready.clone(), next.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let (mut queued, mut other) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let (xff, tok, ids, _) = &h[k % h.len()];
                let body = json!({"v":1,"registrationIds":ids,"notification":bench_alert(k)});
                let (st, _, v) = s
                    .call_as(
                        xff,
                        reqwest::Method::POST,
                        "/v1/send",
                        Some(tok),
                        Some(body.to_string()),
                    )
                    .await;
                if st != 200 {
                    other += ids.len();
                    continue;
                }
                for r in v["results"].as_array().into_iter().flatten() {
                    if r["status"] == "queued" {
                        queued += 1;
                    } else {
                        other += 1;
                    }
                }
            }
            (queued, other)
        }));
    }
    tokio::time::sleep(a.duration).await;
    stop.store(true, Ordering::Relaxed);
    let (mut queued, mut refused) = (0, 0);
    for t in tasks {
        let (q, o) = t.await.unwrap();
        queued += q;
        refused += o;
    }
    let send_end = Instant::now();
    let send_s = (send_end - started).as_secs_f64();
    let seen_at_end = apns.seen_count();
    let deadline = Instant::now() + Duration::from_secs(300);
    while apns.seen_count() < queued && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = apns.seen();
    let delivered = seen.len();
    let last = seen.iter().map(|x| x.at).max().unwrap_or(started);
    let deliver_s = (last - started).as_secs_f64();
    let backlog = queued.saturating_sub(seen_at_end);
    let drain_s = last.saturating_duration_since(send_end).as_secs_f64();
    let auth_ok = seen.iter().all(|x| x.auth_ok);
    let max_open = seen
        .iter()
        .map(|x| apns.max_open(&x.token))
        .max()
        .unwrap_or(0);
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    if let Ok(s) = Arc::try_unwrap(s) {
        s.stop().await;
    }
    // Backlog: `backlog` notifications per registration queued through the accept transaction
    // while no server runs, then a fresh server drains them.
    let mut k = 1_000_000usize;
    let before = apns.seen_count();
    for (_, _, ids, fp) in hosts_ready.iter() {
        for _ in 0..a.backlog {
            k += 1;
            queue(&t.db, fp, ids, k).await;
        }
    }
    let backlog_rows = registrations * a.backlog;
    let drain_started = Instant::now();
    let s2 = start(&t.url, &apns, a.pool).await;
    let deadline = Instant::now() + Duration::from_secs(300);
    while apns.seen_count() < before + backlog_rows && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen2 = apns.seen();
    let drained = seen2.len() - before;
    let last2 = seen2.iter().map(|x| x.at).max().unwrap_or(drain_started);
    let backlog_s = (last2 - drain_started).as_secs_f64();
    let max_open2 = seen2[before..]
        .iter()
        .map(|x| apns.max_open(&x.token))
        .max()
        .unwrap_or(0);
    s2.stop().await;
    let v = json!({
        "backend": backend,
        "hosts": hosts,
        "registrations": registrations,
        "senders": a.senders,
        "fanout": a.fanout,
        "poolMax": a.pool,
        "queued": queued,
        "notQueued": refused,
        "delivered": delivered,
        "providerAuthOk": auth_ok,
        "maxOpenStreamsPerToken": max_open,
        "sendSeconds": r(send_s),
        "acceptedPerSecond": (queued as f64 / send_s).round(),
        "deliverSeconds": r(deliver_s),
        "deliveredPerSecond": (delivered as f64 / deliver_s).round(),
        "backlogAtSendEnd": backlog,
        "drainSeconds": r(drain_s),
        "drainPerSecond": if backlog > 0 && drain_s > 0.0 { (backlog as f64 / drain_s).round() } else { 0.0 },
        "backlog": {
            "queued": backlog_rows,
            "delivered": drained,
            "maxOpenStreamsPerToken": max_open2,
            "seconds": r(backlog_s),
            "deliveredPerSecond": (drained as f64 / backlog_s).round(),
        },
    });
    apns.stop();
    v
}

/// A distinct alert per send (not `support::alert`, which records its texts for the log scan).
fn bench_alert(k: usize) -> serde_json::Value {
    json!({"notificationId":format!("b{k}"),"notificationSeq":k,"notificationEpoch":"epoch-1",
        "source":"agent-task-complete","agentState":"finished","title":format!("Title {k}"),
        "body":format!("Body text {k}")})
}

/// One alert to every id of a host through the accept transaction the send route runs.
async fn queue(db: &orca_relay::store::Db, fp: &str, ids: &[String], k: usize) {
    use orca_relay::push::model::Notification;
    use orca_relay::store::push::{accept, Accept, NewEvent};
    let n = Notification {
        notification_id: Some(format!("q{k}")),
        notification_seq: k as u64,
        notification_epoch: "epoch-1".into(),
        source: "agent-task-complete".into(),
        agent_state: Some("finished".into()),
        title: format!("Title {k}"),
        body: format!("Body text {k}"),
        worktree_id: None,
        pane_key: None,
        sound: None,
        kind: None,
        expires_at: None,
    };
    let (event_id, content, payload) =
        (n.event_id(fp), n.content_fingerprint(), n.canonical_json());
    let event = NewEvent {
        kind: n.effective_kind(),
        event_id: &event_id,
        content: &content,
        payload: &payload,
        notification_id: n.notification_id.as_deref(),
        notification_seq: k as i64,
        notification_epoch: &n.notification_epoch,
        expires_at: None,
    };
    for id in ids {
        let r = accept(
            db,
            fp,
            &event,
            id,
            &orca_relay::push::LIMITS,
            orca_relay::clock::now_ms(),
        )
        .await
        .unwrap();
        assert_eq!(r, Accept::Enqueued);
    }
}
