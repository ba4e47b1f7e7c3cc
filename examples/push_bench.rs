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
//! Each host may queue at most 300 events per 15 minutes and make 600 calls a minute (docs/reference/http.md,
//! one send fans out to up to 20 of its registrations and counts once. So the registrations
//! are spread over hosts of `fanout` devices each (own client address each), and every send goes
//! to all of one host's devices, hosts taken round-robin. `senders` tasks send for `duration`
//! seconds; then the bench waits until the fake has seen every queued delivery.
//!
//! Figures: `acceptedPerSecond` = queued recipients / send window; `deliveredPerSecond` =
//! deliveries / (first send → last provider request); `backlogAtSendEnd` = queued but not yet
//! delivered when the senders stopped, and `drainPerSecond` = that backlog / (send end → last
//! provider request): the worker's rate with work waiting. Deliveries to one registration are
//! strictly sequential (one in flight per registration). `notQueued` counts the other answers by
//! what they were: a result's `status` (`rate_limited`, `error`...), or `http <status>` for a
//! refused request (all its recipients; e.g. 503 when the pool or admission sheds load).
//!
//! Then the `backlog` phase: the server stops, `backlog` alerts per registration are queued
//! through the same accept transaction the send route runs (directly on the database), and a fresh
//! server drains them: `backlog.deliveredPerSecond` = rows / (server start → last provider
//! request), the worker's throughput when work is waiting.
//!
//! Where the time goes: the fake APNs runs on its own thread (`bench-apns`) and the senders on
//! theirs (`bench-send`), so `cpu` splits CPU time (µs per queued recipient in the send window,
//! per delivered row in the backlog drain) between the relay (every other thread of this
//! process), the senders, the fake, this server's Postgres backends (found through this
//! process's sockets) and Postgres' WAL writer, checkpointer and background writer; `machine` is
//! the busy cores of the whole machine over the window (other load included). `wire` is what the
//! relay sent to the database (statements, round trips, prepares) per queued recipient (send
//! window, accepts and deliveries both), per accept (the backlog queueing, accepts alone) and per
//! delivered row (the backlog drain, deliveries alone). `load` is `/proc/loadavg` at the start.

#[path = "common/cpu.rs"]
mod cpu;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cpu::{per, CpuMeter};
use orca_relay::store::testing::TestDb;
use serde_json::json;
use support::push::{common, fakes, ios_token, server_args, Host, Opts, Server};

/// The binary's allocator, so the relay's CPU figures are the ones production pays.
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    support::push::init_logs();
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let apns = FakeThread::start();
    let mut s = start(&t.url, &apns.fake, a.pool).await;
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
    let db = s.running().ctx.db.clone();
    let cpu = CpuMeter::new(&[("senders", "bench-send"), ("fakeApns", "bench-apns")]);
    let wire0 = db.wire_stats();
    let cpu0 = cpu.sample(&t.db).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    // The sender thread stays until its CPU was sampled (an ended thread leaves /proc).
    let (sampled, sampled_rx) = std::sync::mpsc::channel::<()>();
    let (base, duration, n_senders) = (s.base.clone(), a.duration, a.senders);
    let hosts_for_senders = hosts_ready.clone();
    std::thread::Builder::new()
        .name("bench-send".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let r = rt.block_on(send_for(base, hosts_for_senders, n_senders, duration));
            let _ = tx.send(r);
            let _ = sampled_rx.recv();
        })
        .unwrap();
    let (queued, refused, started, send_end) = rx.await.unwrap();
    let cpu_send = cpu.sample(&t.db).await;
    let _ = sampled.send(());
    let wire_send = db.wire_stats();
    let send_s = (send_end - started).as_secs_f64();
    let seen_at_end = apns.fake.seen_count();
    let deadline = Instant::now() + Duration::from_secs(300);
    while apns.fake.seen_count() < queued && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = apns.fake.seen();
    let delivered = seen.len();
    let last = seen.iter().map(|x| x.at).max().unwrap_or(started);
    let deliver_s = (last - started).as_secs_f64();
    let backlog = queued.saturating_sub(seen_at_end);
    let drain_s = last.saturating_duration_since(send_end).as_secs_f64();
    let auth_ok = seen.iter().all(|x| x.auth_ok);
    let max_open = seen
        .iter()
        .map(|x| apns.fake.max_open(&x.token))
        .max()
        .unwrap_or(0);
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    let live_cpu = cpu_send.minus(&cpu0).per(queued);
    let live_wire = per(wire_send - wire0, queued);
    if let Ok(s) = Arc::try_unwrap(s) {
        s.stop().await;
    }
    // Backlog: `backlog` notifications per registration queued through the accept transaction
    // while no server runs, then a fresh server drains them.
    let mut k = 1_000_000usize;
    let before = apns.fake.seen_count();
    let queue_wire0 = t.db.wire_stats();
    for (_, _, ids, fp) in hosts_ready.iter() {
        for _ in 0..a.backlog {
            k += 1;
            queue(&t.db, fp, ids, k).await;
        }
    }
    let backlog_rows = registrations * a.backlog;
    let accept_wire = per(t.db.wire_stats() - queue_wire0, backlog_rows);
    let drain_started = Instant::now();
    let cpu1 = cpu.sample(&t.db).await;
    let s2 = start(&t.url, &apns.fake, a.pool).await;
    let db2 = s2.running().ctx.db.clone();
    let deadline = Instant::now() + Duration::from_secs(300);
    while apns.fake.seen_count() < before + backlog_rows && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cpu2 = cpu.sample(&t.db).await;
    let drain_wire = db2.wire_stats();
    let seen2 = apns.fake.seen();
    let drained = seen2.len() - before;
    let last2 = seen2.iter().map(|x| x.at).max().unwrap_or(drain_started);
    let backlog_s = (last2 - drain_started).as_secs_f64();
    let max_open2 = seen2[before..]
        .iter()
        .map(|x| apns.fake.max_open(&x.token))
        .max()
        .unwrap_or(0);
    s2.stop().await;
    let v = json!({
        "backend": backend,
        "load": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
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
        "cpuMicrosPerQueued": live_cpu,
        "wirePerQueued": live_wire,
        "wirePerAccept": accept_wire,
        "backlog": {
            "queued": backlog_rows,
            "delivered": drained,
            "maxOpenStreamsPerToken": max_open2,
            "seconds": r(backlog_s),
            "deliveredPerSecond": (drained as f64 / backlog_s).round(),
            "cpuMicrosPerDelivered": cpu2.minus(&cpu1).per(drained),
            "wirePerDelivered": per(drain_wire, drained),
        },
    });
    apns.stop();
    v
}

/// A host of the bench: client address, session token, registration ids, fingerprint.
type BenchHost = (String, String, Vec<String>, String);

/// `senders` tasks sending for `duration` (on the `bench-send` thread's own runtime and HTTP
/// client): queued results, the others by what they were (`http <status>` for a refused request,
/// whose recipients all count, or the result's `status`), and the window.
async fn send_for(
    base: String,
    h: Arc<Vec<BenchHost>>,
    senders: usize,
    duration: Duration,
) -> (usize, BTreeMap<String, usize>, Instant, Instant) {
    let client = Arc::new(SendClient {
        base,
        client: reqwest::Client::new(),
    });
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..senders {
        let (c, h, next, stop) = (client.clone(), h.clone(), next.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let (mut queued, mut other) = (0usize, BTreeMap::<String, usize>::new());
            while !stop.load(Ordering::Relaxed) {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let (xff, tok, ids, _) = &h[k % h.len()];
                let body = json!({"v":1,"registrationIds":ids,"notification":bench_alert(k)});
                let v = match c.send(xff, tok, body.to_string()).await {
                    Ok(v) => v,
                    Err(status) => {
                        *other.entry(format!("http {status}")).or_default() += ids.len();
                        continue;
                    }
                };
                for r in v["results"].as_array().into_iter().flatten() {
                    match r["status"].as_str() {
                        Some("queued") => queued += 1,
                        s => *other.entry(s.unwrap_or("?").to_string()).or_default() += 1,
                    }
                }
            }
            (queued, other)
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let (mut queued, mut refused) = (0, BTreeMap::<String, usize>::new());
    for t in tasks {
        let (q, o) = t.await.unwrap();
        queued += q;
        for (k, n) in o {
            *refused.entry(k).or_default() += n;
        }
    }
    (queued, refused, started, Instant::now())
}

struct SendClient {
    base: String,
    client: reqwest::Client,
}

impl SendClient {
    /// `POST /v1/send` as the host behind `xff`: the answer of a 200, else the status (an
    /// unreadable 200 body as 0).
    async fn send(&self, xff: &str, tok: &str, body: String) -> Result<serde_json::Value, u16> {
        let resp = self
            .client
            .post(format!("{}/v1/send", self.base))
            .header("x-forwarded-for", xff)
            .header("authorization", format!("Bearer {tok}"))
            .body(body)
            .send()
            .await
            .expect("request");
        if resp.status() != 200 {
            return Err(resp.status().as_u16());
        }
        serde_json::from_str(&resp.text().await.unwrap_or_default()).map_err(|_| 0)
    }
}

/// The fake APNs on its own thread and runtime (`bench-apns`), so its CPU is counted apart.
struct FakeThread {
    fake: fakes::Fake,
    stop: tokio_util::sync::CancellationToken,
}

impl FakeThread {
    fn start() -> FakeThread {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = tokio_util::sync::CancellationToken::new();
        let done = stop.clone();
        std::thread::Builder::new()
            .name("bench-apns".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    tx.send(fakes::apns().await).unwrap();
                    done.cancelled().await;
                });
            })
            .unwrap();
        FakeThread {
            fake: rx.recv().unwrap(),
            stop,
        }
    }

    fn stop(&self) {
        self.fake.stop();
        self.stop.cancel();
    }
}

/// A distinct alert per send (not `support::push::alert`, which records its texts for the log scan).
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
