//! Relay nodes in their own network namespaces, for partition tests (include `support/tls` as
//! `tls` beside this module: its CA signs the nodes' certificates, as plain http is for loopback
//! only).
//!
//! A [`Net`] is one Linux bridge in the root namespace holding the gateway address of a private
//! /24 (`10.A.B.1`), and one namespace per node joined to it by a veth pair (`10.A.B.k`, default
//! route via the gateway). The test process (the clients) stays in the root namespace and reaches
//! every node over the bridge; [`Postgres`] is a private PostgreSQL 15 listening on the gateway
//! address. Names carry the pid and a per-process counter, and the subnet is chosen free, so tests
//! run in parallel. Everything is removed on `Drop` (also after a panic): processes left in a
//! namespace are killed first.
//!
//! The nemesis ([`Net::cut`], [`Net::lossy`], [`Net::heal`]) writes nftables rules inside a node's
//! namespace: packets to (output) or from (input) an address, optionally one TCP port, are
//! dropped, so a cut is silent (no reset) as on a real partition. Delay comes from
//! [`DelayProxy`], a TCP forwarder in the root namespace that holds each chunk for a settable
//! time (kernels without `sch_netem` have no `tc ... netem`).
//!
//! [`Net::new`] returns `None` with a printed reason when the process is not root or `ip`/`nft`
//! is missing; under `CI=true` it panics instead.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::tls::common;
use super::tls::common::proc::Log;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Runs a command to its end; `Err` with its stderr when it fails.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

fn has(tool: &str) -> bool {
    Command::new(tool)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Why namespaces cannot be used here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    for tool in ["ip", "nft"] {
        if !has(tool) {
            return Some(format!("`{tool}` is missing (iproute2 / nftables)"));
        }
    }
    if !std::path::Path::new(PG_BIN).join("postgres").exists() {
        return Some(format!("no PostgreSQL 15 binaries in {PG_BIN}"));
    }
    None
}

/// One direction of a cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Packets the node sends to the peer.
    Out,
    /// Packets the node receives from the peer.
    In,
    Both,
}

/// A node: its namespace and address on the test's subnet.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub ns: String,
    pub addr: String,
}

impl Node {
    /// The prefix that runs a program inside the namespace.
    pub fn wrap(&self) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.ns.clone()]
    }

    fn nft(&self, args: &[&str]) -> Result<String, String> {
        let mut a = vec!["netns", "exec", &self.ns, "nft"];
        a.extend_from_slice(args);
        run("ip", &a)
    }
}

/// The bridge, the namespaces and the nemesis state of one test.
pub struct Net {
    /// `10.A.B`: the /24 of this test.
    pub prefix: String,
    bridge: String,
    tag: String,
    nodes: Mutex<Vec<Node>>,
    /// Fault descriptions, in the order injected.
    pub faults: Mutex<Vec<String>>,
}

impl Net {
    /// A fresh bridge and subnet, or `None` (reason printed) when namespaces are unavailable.
    pub fn new(test: &str) -> Option<Net> {
        if let Some(why) = unavailable() {
            if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
                panic!("{test}: network namespaces required under CI=true: {why}");
            }
            eprintln!("skipping {test}: {why}");
            return None;
        }
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{pid:x}{n:x}");
        let bridge = format!("ob{tag}");
        assert!(bridge.len() <= 13, "interface name too long: {bridge}");
        let taken = must("ip", &["-o", "-4", "addr", "show"]);
        let routes = must("ip", &["-4", "route", "show"]);
        let seed = pid
            .wrapping_mul(2_654_435_761)
            .wrapping_add(n.wrapping_mul(40_503));
        let prefix = (0..4096u32)
            .map(|i| {
                let v = seed.wrapping_add(i.wrapping_mul(97));
                format!("10.{}.{}", 128 + (v >> 8) % 112, v % 256)
            })
            .find(|p| !taken.contains(&format!("{p}.")) && !routes.contains(&format!("{p}.")))
            .expect("a free /24");
        let net = Net {
            prefix,
            bridge,
            tag,
            nodes: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
        };
        must("ip", &["link", "add", &net.bridge, "type", "bridge"]);
        must(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", net.gateway()),
                "dev",
                &net.bridge,
            ],
        );
        must("ip", &["link", "set", &net.bridge, "up"]);
        Some(net)
    }

    /// The root namespace's address on the bridge (where [`Postgres`] listens).
    pub fn gateway(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// A namespace joined to the bridge at the next address.
    pub fn add_node(&self, name: &str) -> Node {
        let mut nodes = self.nodes.lock().unwrap();
        let k = nodes.len() + 2;
        let node = Node {
            name: name.into(),
            ns: format!("orca-{}-{name}", self.tag),
            addr: format!("{}.{k}", self.prefix),
        };
        let (outer, inner) = (format!("ov{}v{k}", self.tag), format!("oi{}v{k}", self.tag));
        must("ip", &["netns", "add", &node.ns]);
        nodes.push(node.clone());
        must(
            "ip",
            &[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ],
        );
        must("ip", &["link", "set", &inner, "netns", &node.ns]);
        must("ip", &["link", "set", &outer, "master", &self.bridge]);
        must("ip", &["link", "set", &outer, "up"]);
        let ns = node.ns.as_str();
        must("ip", &["-n", ns, "link", "set", &inner, "name", "eth0"]);
        must(
            "ip",
            &[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", node.addr),
                "dev",
                "eth0",
            ],
        );
        must("ip", &["-n", ns, "link", "set", "eth0", "up"]);
        must("ip", &["-n", ns, "link", "set", "lo", "up"]);
        must(
            "ip",
            &["-n", ns, "route", "add", "default", "via", &self.gateway()],
        );
        // The nemesis table: accept-by-default chains the faults add rules to.
        node.nft(&["add", "table", "inet", "nemesis"]).unwrap();
        for (chain, hook) in [("out", "output"), ("in", "input")] {
            node.nft(&[
                "add",
                "chain",
                "inet",
                "nemesis",
                chain,
                &format!("{{ type filter hook {hook} priority 0; policy accept; }}"),
            ])
            .unwrap();
        }
        node
    }

    fn record(&self, what: String) {
        eprintln!("nemesis: {what}");
        self.faults.lock().unwrap().push(what);
    }

    fn rule(&self, node: &Node, chain: &str, rule: &str) {
        let mut args = vec!["add", "rule", "inet", "nemesis", chain];
        args.extend(rule.split(' '));
        node.nft(&args)
            .unwrap_or_else(|e| panic!("nemesis rule on {}: {e}", node.name));
    }

    /// Drops `node`'s packets to (`Out`) and/or from (`In`) `peer`, only TCP port `port` of the
    /// peer when given.
    pub fn cut(&self, node: &Node, peer: &str, port: Option<u16>, dir: Dir) {
        if matches!(dir, Dir::Out | Dir::Both) {
            let p = port.map(|p| format!(" tcp dport {p}")).unwrap_or_default();
            self.rule(node, "out", &format!("ip daddr {peer}{p} drop"));
        }
        if matches!(dir, Dir::In | Dir::Both) {
            let p = port.map(|p| format!(" tcp sport {p}")).unwrap_or_default();
            self.rule(node, "in", &format!("ip saddr {peer}{p} drop"));
        }
        let p = port.map(|p| format!(":{p}")).unwrap_or_default();
        self.record(format!("cut {} -> {peer}{p} ({dir:?})", node.name));
    }

    /// Drops `percent` % of `node`'s packets to and from `peer` (TCP port `port` of the peer).
    pub fn lossy(&self, node: &Node, peer: &str, port: u16, percent: u32) {
        self.rule(
            node,
            "out",
            &format!("ip daddr {peer} tcp dport {port} numgen random mod 100 < {percent} drop"),
        );
        self.rule(
            node,
            "in",
            &format!("ip saddr {peer} tcp sport {port} numgen random mod 100 < {percent} drop"),
        );
        self.record(format!("{percent}% loss {} <-> {peer}:{port}", node.name));
    }

    /// Removes every fault rule of `node`.
    pub fn heal(&self, node: &Node) {
        for chain in ["out", "in"] {
            node.nft(&["flush", "chain", "inet", "nemesis", chain])
                .unwrap_or_else(|e| panic!("heal {}: {e}", node.name));
        }
        self.record(format!("heal {}", node.name));
    }

    /// Faults injected so far (heals not counted).
    pub fn fault_count(&self) -> usize {
        self.faults
            .lock()
            .unwrap()
            .iter()
            .filter(|f| !f.starts_with("heal"))
            .count()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for node in self.nodes.lock().unwrap().iter() {
            // Anything still running in the namespace (a panicking test's processes).
            if let Ok(pids) = run("ip", &["netns", "pids", &node.ns]) {
                for pid in pids
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                {
                    // SAFETY: kill(2) on a pid read from the namespace we created.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
            let _ = run("ip", &["netns", "del", &node.ns]);
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}

/// Where the PostgreSQL 15 binaries are.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A private PostgreSQL 15 cluster in a temporary directory, owned by the `postgres` user,
/// listening on the net's gateway address with trust for the test's subnet.
pub struct Postgres {
    dir: PathBuf,
    pub addr: String,
    pub port: u16,
}

impl Postgres {
    pub fn start(net: &Net) -> Postgres {
        let dir = std::env::temp_dir().join(format!("orca-pg-{}", net.tag));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        must("chown", &["postgres:postgres", dir.to_str().unwrap()]);
        let data = dir.join("data");
        let as_pg = |args: &[&str]| {
            let mut a = vec!["-u", "postgres", "--"];
            a.extend_from_slice(args);
            must("runuser", &a)
        };
        as_pg(&[
            &format!("{PG_BIN}/initdb"),
            "-D",
            data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]);
        let hba = data.join("pg_hba.conf");
        let mut text = std::fs::read_to_string(&hba).unwrap();
        text.push_str(&format!("host all all {}.0/24 trust\n", net.prefix));
        std::fs::write(&hba, text).unwrap();
        let port = std::net::TcpListener::bind((net.gateway().as_str(), 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let opts = format!(
            "-c listen_addresses={} -p {port} -k {} -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=100 -c shared_buffers=16MB",
            net.gateway(),
            dir.display()
        );
        let pg = Postgres {
            dir: dir.clone(),
            addr: net.gateway(),
            port,
        };
        as_pg(&[
            &format!("{PG_BIN}/pg_ctl"),
            "-D",
            data.to_str().unwrap(),
            "-l",
            dir.join("log").to_str().unwrap(),
            "-o",
            &opts,
            "-w",
            "-t",
            "60",
            "start",
        ]);
        pg
    }

    /// The URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@{}:{}/postgres?connect_timeout=5",
            self.addr, self.port
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = run(
            "runuser",
            &[
                "-u",
                "postgres",
                "--",
                &format!("{PG_BIN}/pg_ctl"),
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A relay process running in a node's namespace.
pub struct NsProc {
    pub name: String,
    pub child: Option<std::process::Child>,
    pub log: Log,
}

impl NsProc {
    /// Starts `orca-relay serve <args>` in `node`'s namespace and waits for its listener.
    pub fn start(node: &Node, args: &[String], envs: &[(String, String)]) -> NsProc {
        let wrap = node.wrap();
        let spec = common::proc::Spec {
            verbose_env: "PARTITION_TEST_VERBOSE",
            wrap: &wrap,
            ..common::proc::Spec::new(&node.name, args, envs)
        };
        let log = Log::default();
        let spawned = common::proc::spawn_serve(&spec, &log, Duration::from_secs(60))
            .unwrap_or_else(|()| {
                panic!(
                    "{} did not start: {:?}",
                    node.name,
                    common::proc::lines(&log)
                )
            });
        NsProc {
            name: node.name.clone(),
            child: Some(spawned.child),
            log,
        }
    }

    /// Whether the process is still running (no restart happened).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    pub fn lines(&self) -> Vec<String> {
        common::proc::lines(&self.log)
    }
}

impl Drop for NsProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            common::proc::kill(&mut c);
        }
    }
}

/// A TCP forwarder on `listen` (root namespace) to `target` that holds every chunk for the
/// current delay before passing it on, in order, per direction.
pub struct DelayProxy {
    pub port: u16,
    delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    pub async fn start(listen: &str, target: String) -> DelayProxy {
        let l = tokio::net::TcpListener::bind((listen, 0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let d = delay_ms.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = l.accept().await {
                let (target, d) = (target.clone(), d.clone());
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::spawn(pump(ri, wo, d.clone()));
                    tokio::spawn(pump(ro, wi, d));
                });
            }
        });
        DelayProxy {
            port,
            delay_ms,
            task,
        }
    }

    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_ms: Arc<AtomicU64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let due = tokio::time::Instant::now()
                    + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
                if tx.send((due, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
