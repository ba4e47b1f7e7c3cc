//! CPU accounting for the benchmarks that cost an operation on the database: this process's
//! threads (split by thread name), the Postgres backends serving this process, and Postgres' WAL
//! writer, checkpointer and background writer, read from `/proc` at two samples.
//!
//! Threads named in [`CpuMeter::new`]'s `parts` (a bench's own load generators or fakes) are
//! counted apart; every other thread of the process is the relay's (or the store client's).

use std::collections::HashMap;

use orca_relay::store::wire::WireSnapshot;
use serde_json::json;

/// Wire counters divided by `n` (two decimals).
pub fn per(w: WireSnapshot, n: usize) -> serde_json::Value {
    let d = |x: u64| ((x as f64 / n.max(1) as f64) * 100.0).round() / 100.0;
    json!({"statements": d(w.statements), "roundTrips": d(w.round_trips), "prepares": d(w.prepares)})
}

/// CPU time (ticks) of the parts of one run, at one sample.
#[derive(Clone, Default)]
pub struct Cpu {
    process: u64,
    /// Per named part (see [`CpuMeter::new`]).
    parts: HashMap<&'static str, u64>,
    /// Per backend pid: a backend born after the earlier sample counts from zero.
    backends: HashMap<u32, u64>,
    pg_aux: u64,
    machine_busy: u64,
    machine_total: u64,
}

impl Cpu {
    pub fn minus(&self, o: &Cpu) -> Delta {
        Delta {
            process: self.process - o.process,
            parts: self
                .parts
                .iter()
                .map(|(k, t)| (*k, t.saturating_sub(o.parts.get(k).copied().unwrap_or(0))))
                .collect(),
            backends: self
                .backends
                .iter()
                .map(|(p, t)| t.saturating_sub(o.backends.get(p).copied().unwrap_or(0)))
                .sum(),
            pg_aux: self.pg_aux.saturating_sub(o.pg_aux),
            machine_busy: self.machine_busy - o.machine_busy,
            machine_total: self.machine_total - o.machine_total,
        }
    }
}

/// CPU ticks spent between two samples.
pub struct Delta {
    process: u64,
    parts: HashMap<&'static str, u64>,
    backends: u64,
    pg_aux: u64,
    machine_busy: u64,
    machine_total: u64,
}

impl Delta {
    /// µs per item of each part (`relay`: the threads no part names; every named part under its
    /// key); `machineBusyCores` = busy share × cores over the window (other load included).
    pub fn per(&self, n: usize) -> serde_json::Value {
        let tick_us = 1e6 / ticks_per_second();
        let us = |t: u64| (t as f64 * tick_us / n.max(1) as f64).round();
        let named: u64 = self.parts.values().sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let mut out = serde_json::Map::new();
        out.insert(
            "relay".into(),
            json!(us(self.process.saturating_sub(named))),
        );
        let mut parts: Vec<_> = self.parts.iter().collect();
        parts.sort();
        for (k, t) in parts {
            out.insert((*k).into(), json!(us(*t)));
        }
        out.insert("postgresBackends".into(), json!(us(self.backends)));
        out.insert("postgresWalAndWriters".into(), json!(us(self.pg_aux)));
        let busy = self.machine_busy as f64 / self.machine_total.max(1) as f64;
        out.insert(
            "machineBusyCores".into(),
            json!((busy * cores * 100.0).round() / 100.0),
        );
        serde_json::Value::Object(out)
    }
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// `utime + stime` from a `/proc/…/stat` file.
pub fn stat_ticks(path: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Samples the CPU of this process's threads, of the Postgres backends serving this process
/// and of Postgres' background writers.
pub struct CpuMeter {
    /// Postgres' WAL writer, checkpointer and background writer.
    aux: Vec<u32>,
    /// (key in the output, thread name) of the threads counted apart from the relay.
    parts: Vec<(&'static str, &'static str)>,
}

impl CpuMeter {
    pub fn new(parts: &[(&'static str, &'static str)]) -> CpuMeter {
        let mut aux = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            if cmd.starts_with("postgres: ")
                && ["walwriter", "checkpointer", "background writer"]
                    .iter()
                    .any(|w| cmd.contains(w))
            {
                aux.push(pid);
            }
        }
        CpuMeter {
            aux,
            parts: parts.to_vec(),
        }
    }

    pub async fn sample(&self, db: &orca_relay::store::Db) -> Cpu {
        let mut c = Cpu {
            process: stat_ticks("/proc/self/stat").unwrap_or(0),
            ..Default::default()
        };
        for e in std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = e.path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let ticks = stat_ticks(&dir.join("stat").to_string_lossy()).unwrap_or(0);
            if let Some((key, _)) = self.parts.iter().find(|(_, name)| *name == comm.trim()) {
                *c.parts.entry(key).or_default() += ticks;
            }
        }
        c.pg_aux = self
            .aux
            .iter()
            .filter_map(|p| stat_ticks(&format!("/proc/{p}/stat")))
            .sum();
        for pid in backend_pids(db).await {
            if let Some(t) = stat_ticks(&format!("/proc/{pid}/stat")) {
                c.backends.insert(pid, t);
            }
        }
        if let Ok(stat) = std::fs::read_to_string("/proc/stat") {
            let f: Vec<u64> = stat
                .lines()
                .next()
                .unwrap_or("")
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal
            c.machine_total = f.iter().take(8).sum();
            c.machine_busy = c.machine_total - f.get(3).unwrap_or(&0) - f.get(4).unwrap_or(&0);
        }
        c
    }
}

/// Pids of the Postgres backends whose client sockets belong to this process (SQLite: none).
pub async fn backend_pids(db: &orca_relay::store::Db) -> Vec<u32> {
    if db.kind() != orca_relay::store::DbKind::Postgres {
        return Vec::new();
    }
    let mut inodes = std::collections::HashSet::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(l) = std::fs::read_link(e.path()) {
            let l = l.to_string_lossy().to_string();
            if let Some(i) = l.strip_prefix("socket:[").and_then(|x| x.strip_suffix(']')) {
                inodes.insert(i.to_string());
            }
        }
    }
    let mut ports = std::collections::HashSet::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && inodes.contains(f[9]) {
                if let Some(p) = f[1].rsplit(':').next() {
                    if let Ok(p) = i64::from_str_radix(p, 16) {
                        ports.insert(p);
                    }
                }
            }
        }
    }
    let rows = db
        .query(
            "SELECT pid, client_port FROM pg_stat_activity WHERE client_port IS NOT NULL",
            &[],
        )
        .await
        .unwrap_or_default();
    rows.iter()
        .filter(|r| ports.contains(&r.i64(1)))
        .map(|r| r.i64(0) as u32)
        .collect()
}
