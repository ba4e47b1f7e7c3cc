//! Push scenarios that need the real binary (docs/reference/http.md): U-47 configuration errors, U-40 crash
//! recovery (SIGKILL with leased deliveries), U-50 SIGTERM with a held delivery, and the log scan of
//! the processes' output (U-48).

mod support;

use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::common::proc as cproc;
use support::push::fakes::{self, Answer, Fake};
use support::push::*;
use tokio_util::sync::CancellationToken;

/// The environment every process of these tests starts with (on top of `PATH` and `RUST_LOG`).
fn base_env(db_url: &str) -> Vec<(String, String)> {
    [
        ("ORCA_RELAY_ROLE", "push"),
        ("ORCA_RELAY_LISTEN", "127.0.0.1:0"),
        ("ORCA_RELAY_DATABASE_URL", db_url),
        ("ORCA_RELAY_ADMIN_TOKEN", ADMIN),
        ("ORCA_RELAY_TRUSTED_PROXY_HOPS", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// U-47: each bad variable stops start-up with one stderr line naming it.
#[test]
fn u47_config_errors() {
    let dir = orca_relay::store::testing::temp_dir("orca-push-u47");
    let db = format!("sqlite://{}/push.sqlite3", dir.display());
    let missing = dir.join("missing.json").display().to_string();
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("ORCA_PUSH_APNS_KEY", keys::APNS_KEY_PEM)],
            "ORCA_PUSH_APNS_KEY",
        ),
        (
            vec![("ORCA_PUSH_FCM_PROJECT_ID", "orca-test")],
            "ORCA_PUSH_FCM_PROJECT_ID",
        ),
        (
            vec![
                ("ORCA_PUSH_FCM_PROJECT_ID", "orca-test"),
                ("ORCA_PUSH_FCM_CREDENTIALS", &missing),
            ],
            "ORCA_PUSH_FCM_CREDENTIALS",
        ),
        (
            vec![("ORCA_PUSH_PUBLIC_URL", "http://push.example.com")],
            "ORCA_PUSH_PUBLIC_URL",
        ),
        (
            vec![("ORCA_PUSH_PUBLIC_URL", "https://x.test/")],
            "ORCA_PUSH_PUBLIC_URL",
        ),
        (
            vec![("ORCA_RELAY_TRUSTED_PROXY_HOPS", "9")],
            "ORCA_RELAY_TRUSTED_PROXY_HOPS",
        ),
        (
            vec![("ORCA_PUSH_APNS_BASE_URL", "http://10.0.0.5")],
            "ORCA_PUSH_APNS_BASE_URL",
        ),
    ];
    for (vars, name) in cases {
        let mut envs = base_env(&db);
        envs.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let (code, err) = cproc::run_to_exit(&cproc::Spec::new("push", &[], &envs));
        assert_ne!(code, 0, "{name} accepted");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{name}: {err}");
        assert!(lines[0].contains(name), "{name}: {err}");
        assert!(!err.contains("BEGIN PRIVATE KEY"), "the key leaked");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A push process (the real binary) and its address.
struct Proc {
    child: Child,
    base: String,
}

fn spawn(db_url: &str, apns: &Fake, lines: cproc::Log) -> Proc {
    let mut envs = base_env(db_url);
    envs.extend(
        [
            ("ORCA_PUSH_APNS_KEY", keys::APNS_KEY_PEM.to_string()),
            ("ORCA_PUSH_APNS_KEY_ID", "KEYID12345".into()),
            ("ORCA_PUSH_APPLE_TEAM_ID", "TEAM123456".into()),
            ("ORCA_PUSH_APNS_BASE_URL", apns.base_url()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    let spawned = cproc::spawn_serve(
        &cproc::Spec::new("push", &[], &envs),
        &lines,
        Duration::from_secs(20),
    )
    .expect("server did not start");
    Proc {
        child: spawned.child,
        base: format!("http://{}", spawned.addr),
    }
}

impl Proc {
    fn server(&self) -> Server {
        Server {
            running: None,
            base: self.base.clone(),
            client: reqwest::Client::new(),
            xff: "192.0.2.50".into(),
            data: std::env::temp_dir(),
        }
    }

    fn kill9(&mut self) {
        cproc::kill(&mut self.child);
    }
}

fn scan(lines: &cproc::Log, secrets: &[String]) {
    let lines = cproc::lines(lines);
    assert!(!lines.is_empty());
    for s in secrets {
        for l in lines.iter() {
            assert!(!l.contains(s.as_str()), "process log leaks a secret: {l}");
        }
    }
}

/// U-40 and the crash test: SIGKILL while deliveries are leased; after a restart every accepted
/// notification is delivered at least once and no registration ever has two deliveries in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn u40_crash_recovery() {
    run_all(|t| async move {
        let apns = fakes::apns().await;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut p = spawn(&t.url, &apns, lines.clone());
        let s = p.server();
        let h = Host::new();
        let tok = h.session(&s).await;
        let hold = CancellationToken::new();
        let mut devices = Vec::new();
        for d in 0..3 {
            let token = ios_token();
            // The first request of each device is held until after the crash.
            apns.script(&token, vec![Answer::status(200, "").hold(hold.clone())]);
            let id = s.register(&tok, &format!("d{d}"), "ios", &token).await;
            devices.push((id, token));
        }
        let mut secrets = vec![tok.clone(), h.fp.clone()];
        for k in 0..3u64 {
            for (id, _) in &devices {
                let n = alert(&format!("crash-{k}"), k);
                secrets.push(n["title"].as_str().unwrap().to_string());
                secrets.push(n["body"].as_str().unwrap().to_string());
                assert_eq!(s.send(&tok, &[id], n).await, ["queued"]);
            }
        }
        for (_, token) in &devices {
            assert_eq!(
                apns.wait_for(token, 1, Duration::from_secs(5)).await.len(),
                1
            );
            secrets.push(token.clone());
        }
        let first: Vec<_> = devices
            .iter()
            .map(|(_, tk)| apns.seen_for(tk)[0].clone())
            .collect();
        p.kill9();
        // The fake finishes the orphaned streams (their answers go nowhere).
        hold.cancel();
        let started = Instant::now();
        let mut p2 = spawn(&t.url, &apns, lines.clone());
        for (i, (_, token)) in devices.iter().enumerate() {
            let seen = apns.wait_for(token, 4, Duration::from_secs(40)).await;
            assert_eq!(
                seen.len(),
                4,
                "every accepted notification delivered at least once"
            );
            // a1 again, same collapse id and body.
            assert_eq!(
                seen[1].headers["apns-collapse-id"],
                first[i].headers["apns-collapse-id"]
            );
            assert_eq!(seen[1].body, first[i].body);
            let seqs: Vec<i64> = seen[1..]
                .iter()
                .map(|x| x.body["orca"]["notificationSeq"].as_i64().unwrap())
                .collect();
            assert_eq!(seqs, vec![0, 1, 2]);
            assert_eq!(apns.max_open(token), 1, "never two deliveries in flight");
        }
        assert!(started.elapsed() < Duration::from_secs(40));
        // Both live workers went idle after the last delivery: nothing more is due.
        p2.server().worker_settled().await;
        for (_, token) in &devices {
            assert_eq!(apns.seen_for(token).len(), 4, "no further request");
        }
        p2.kill9();
        apns.stop();
        scan(&lines, &secrets);
    })
    .await;
}

/// U-50: SIGTERM while the fake holds a delivery: requests are refused, the process exits within
/// 10 s, and after a restart the held delivery is re-sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn u50_sigterm() {
    run_all(|t| async move {
        let apns = fakes::apns().await;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut p = spawn(&t.url, &apns, lines.clone());
        let s = p.server();
        let h = Host::new();
        let tok = h.session(&s).await;
        let token = ios_token();
        let hold = CancellationToken::new();
        apns.script(&token, vec![Answer::status(200, "").hold(hold.clone())]);
        let id = s.register(&tok, "d", "ios", &token).await;
        assert_eq!(s.send(&tok, &[&id], alert("held", 1)).await, ["queued"]);
        assert_eq!(
            apns.wait_for(&token, 1, Duration::from_secs(5)).await.len(),
            1
        );
        let signalled = Instant::now();
        cproc::signal(&p.child, libc::SIGTERM);
        // Until the process has seen the signal a request is still served; from then on it is
        // refused: `503 shutting_down`, or a refused connection once the listener closed.
        let fresh = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let refused = eventually(Duration::from_secs(10), || async {
            match fresh
                .get(format!("{}/v1/devices", s.base))
                .header("authorization", format!("Bearer {tok}"))
                .send()
                .await
            {
                Ok(resp) if resp.status().as_u16() == 200 => false,
                Ok(resp) => {
                    assert_eq!(resp.status().as_u16(), 503);
                    assert_eq!(
                        resp.json::<serde_json::Value>().await.unwrap(),
                        json!({"error":"shutting_down"})
                    );
                    true
                }
                Err(_) => true,
            }
        })
        .await;
        assert!(refused, "requests refused after SIGTERM");
        let exited = tokio::task::block_in_place(|| {
            cproc::wait_exit(
                &mut p.child,
                Duration::from_secs(10).saturating_sub(signalled.elapsed()),
            )
        });
        assert!(exited.is_some(), "no exit within 10 s");
        assert!(signalled.elapsed() < Duration::from_secs(10));
        hold.cancel();
        let mut p2 = spawn(&t.url, &apns, lines.clone());
        // The lease (30 s, renewed every 10 s while the old process held the call) must lapse first.
        let seen = apns.wait_for(&token, 2, Duration::from_secs(50)).await;
        if seen.len() != 2 {
            let rows =
                t.db.query(
                    "SELECT lease_until, due_at, expires_at, attempts FROM push_deliveries",
                    &[],
                )
                .await
                .unwrap();
            eprintln!("now {} rows {:?}", orca_relay::clock::now_ms(), rows);
            for l in lines.lock().unwrap().iter() {
                eprintln!("{l}");
            }
        }
        assert_eq!(
            seen.len(),
            2,
            "the held delivery is re-sent after the restart"
        );
        assert_eq!(seen[1].body, seen[0].body);
        p2.kill9();
        apns.stop();
        assert!(lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("orca_push_counters")));
        scan(
            &lines,
            &[
                tok,
                token,
                h.fp.clone(),
                "Title held 1".into(),
                "Body text held 1".into(),
            ],
        );
    })
    .await;
}
