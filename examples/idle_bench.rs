//! Idle memory: starts `orca-relay serve` (a release binary; `--bin`), sets up N idle pairs with the
//! real protocol and prints the server's RSS per idle WebSocket as JSON. `--base-bin` runs a second
//! binary (an older build) the same way right after, for a side-by-side figure in one run. `--tls`
//! measures every binary a second time over its own TLS listener (a test CA's ECDSA P-256
//! certificate; every leg `wss://`), so one run prints plain and TLS side by side.
//!
//! ```text
//! cargo build --release --bin orca-relay --example idle_bench
//! target/release/examples/idle_bench --bin target/release/orca-relay --pairs 9000 --tls \
//!     [--base-bin /path/to/old/orca-relay] [--env MALLOC_ARENA_MAX=2] [--hold SECS]
//! ```
//! `--hold` keeps each run's idle pairs open that many seconds after its figure is printed (for a
//! heap profiler attached to the server: its live allocations are then the idle state).
//! The open-file soft limit is raised to the hard limit (each pair is two sockets on both sides).

#[path = "../tests/support/mod.rs"]
mod support;

use support::idle;

use serde_json::json;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut bins = vec![("relay", "target/release/orca-relay".to_string())];
    let mut pairs = 9_000usize;
    let mut per_host = 8usize;
    let mut envs = Vec::new();
    let mut hold = 0u64;
    let mut transports = vec![false];
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "--tls" {
            transports = vec![false, true];
            i += 1;
            continue;
        }
        let v = argv.get(i + 1).cloned().expect("flag value");
        match argv[i].as_str() {
            "--bin" => bins[0].1 = v,
            "--base-bin" => bins.push(("base", v)),
            "--pairs" => pairs = v.parse().expect("--pairs"),
            "--hold" => hold = v.parse().expect("--hold"),
            "--phones-per-host" => per_host = v.parse().expect("--phones-per-host"),
            "--env" => {
                let (k, val) = v.split_once('=').expect("--env K=V");
                envs.push((k.to_string(), val.to_string()));
            }
            other => panic!("unknown flag {other}"),
        }
        i += 2;
    }
    let nofile = idle::raise_nofile();
    let mut out = serde_json::Map::new();
    out.insert("openFileLimit".into(), json!(nofile));
    let runs = bins
        .iter()
        .flat_map(|(name, bin)| transports.iter().map(move |&tls| (*name, bin.clone(), tls)));
    for (name, bin, tls) in runs {
        let name = if tls {
            format!("{name}Tls")
        } else {
            name.to_string()
        };
        let server = idle::spawn(&bin, &envs, tls);
        let (m, conns) = idle::measure(&server, pairs, per_host).await;
        let r = json!({
            "bin": bin,
            "transport": if tls { "tls" } else { "plain" },
            "env": envs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "pairs": m.pairs,
            "webSockets": m.sockets,
            "setupSeconds": (m.setup_secs * 10.0).round() / 10.0,
            "serverRssKiBColdStart": m.cold_before_kib,
            "serverRssKiBBefore": m.before_kib,
            "serverRssKiBAfter": m.after_kib,
            "kibPerWebSocket": (m.kib_per_socket() * 100.0).round() / 100.0,
            "kibPerWebSocketFromColdStart": (m.kib_per_socket_cold() * 100.0).round() / 100.0,
        });
        eprintln!("{name}: {r}");
        out.insert(name.clone(), r);
        if hold > 0 {
            eprintln!(
                "{name}: holding {hold} s (server pid {})",
                server.child.id()
            );
            tokio::time::sleep(std::time::Duration::from_secs(hold)).await;
        }
        drop(conns);
        drop(server);
    }
    println!("{}", serde_json::Value::Object(out));
}
