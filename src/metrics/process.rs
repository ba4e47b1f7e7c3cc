//! Process metrics (the conventional `process_*` series), read from `/proc/self` at scrape time.
//! Linux only; no `unsafe` (the crate forbids it): tick rate is the ABI's USER_HZ.
//!
//! The prometheus crate's own process collector needs its `process` feature and the procfs crate;
//! four tiny files read per scrape do the same. Reading happens inside `Registry::gather`, which
//! the `/metrics` handlers run on the blocking pool (`Metrics::render_blocking`), never on a
//! tokio worker. Off Linux (no `/proc/self`) the series are simply absent.

use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, IntGauge, Opts};

/// Samples `/proc/self` when the registry is gathered.
pub struct ProcessCollector {
    cpu: Counter,
    /// CPU seconds already added to `cpu` (a counter only goes up by deltas).
    cpu_seen: Mutex<f64>,
    rss: IntGauge,
    vsize: IntGauge,
    fds: IntGauge,
    max_fds: IntGauge,
    start: Gauge,
    threads: IntGauge,
    /// Tasks alive on the tokio runtime that scrapes (`RuntimeMetrics::num_alive_tasks`): the
    /// churn soak watches it return to its baseline, as it watches RSS and fds.
    tasks: IntGauge,
    descs: Vec<Desc>,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessCollector {
    pub fn new() -> ProcessCollector {
        let cpu = Counter::with_opts(Opts::new(
            "process_cpu_seconds_total",
            "user and system CPU time spent, in seconds",
        ))
        .expect("opts");
        let gauge = |n: &str, h: &str| IntGauge::new(n, h).expect("opts");
        let rss = gauge(
            "process_resident_memory_bytes",
            "resident memory size in bytes",
        );
        let vsize = gauge(
            "process_virtual_memory_bytes",
            "virtual memory size in bytes",
        );
        let fds = gauge("process_open_fds", "open file descriptors");
        let max_fds = gauge("process_max_fds", "file descriptor limit (soft)");
        let threads = gauge("process_threads", "OS threads");
        let tasks = gauge(
            "orca_relay_runtime_alive_tasks",
            "tasks alive on the tokio runtime",
        );
        let start = Gauge::new(
            "process_start_time_seconds",
            "process start time since the Unix epoch, in seconds",
        )
        .expect("opts");
        let mut descs = Vec::new();
        for c in [
            cpu.desc(),
            rss.desc(),
            vsize.desc(),
            fds.desc(),
            max_fds.desc(),
            threads.desc(),
            tasks.desc(),
            start.desc(),
        ] {
            descs.extend(c.into_iter().cloned());
        }
        ProcessCollector {
            cpu,
            cpu_seen: Mutex::new(0.0),
            rss,
            vsize,
            fds,
            max_fds,
            start,
            threads,
            tasks,
            descs,
        }
    }
}

/// The fields of `/proc/self/stat` this collector uses.
#[derive(Debug, PartialEq)]
pub struct Stat {
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub threads: i64,
    pub start_ticks: u64,
    pub vsize: u64,
    pub rss_pages: i64,
}

/// Parses `/proc/self/stat` (fields after the parenthesised command name, which may itself hold
/// spaces or parentheses).
pub fn parse_stat(s: &str) -> Option<Stat> {
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state); field n is f[n - 3].
    let at = |n: usize| f.get(n - 3).copied();
    Some(Stat {
        utime_ticks: at(14)?.parse().ok()?,
        stime_ticks: at(15)?.parse().ok()?,
        threads: at(20)?.parse().ok()?,
        start_ticks: at(22)?.parse().ok()?,
        vsize: at(23)?.parse().ok()?,
        rss_pages: at(24)?.parse().ok()?,
    })
}

/// Clock ticks per second of `/proc` times: USER_HZ, fixed at 100 by the Linux ABI whatever the
/// kernel's internal HZ (no `sysconf` call, so no `unsafe`).
const USER_HZ: f64 = 100.0;

/// `VmRSS` of `/proc/self/status`, in kB (page-size independent, unlike the stat field).
pub fn parse_vm_rss_kb(s: &str) -> Option<i64> {
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `btime` of `/proc/stat`: boot time, seconds since the epoch.
pub fn parse_btime(s: &str) -> Option<u64> {
    s.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft "Max open files" limit of `/proc/self/limits`.
pub fn parse_max_fds(s: &str) -> Option<i64> {
    s.lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
        else {
            return Vec::new();
        };
        let tick = USER_HZ;
        let cpu = (stat.utime_ticks + stat.stime_ticks) as f64 / tick;
        {
            let mut seen = crate::sync::lock(&self.cpu_seen);
            if cpu > *seen {
                self.cpu.inc_by(cpu - *seen);
                *seen = cpu;
            }
        }
        if let Some(kb) = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| parse_vm_rss_kb(&s))
        {
            self.rss.set(kb * 1024);
        }
        self.vsize.set(stat.vsize as i64);
        self.threads.set(stat.threads);
        if let Some(bt) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| parse_btime(&s))
        {
            self.start.set(bt as f64 + stat.start_ticks as f64 / tick);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle itself is one of the entries; it is not the process's own.
            self.fds.set(dir.count() as i64 - 1);
        }
        if let Some(m) = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| parse_max_fds(&s))
        {
            self.max_fds.set(m);
        }
        // Gathering runs on the runtime's blocking pool, which carries the runtime handle; a
        // gather from outside any runtime (a unit test) leaves the series out.
        let tasks = tokio::runtime::Handle::try_current()
            .ok()
            .map(|h| h.metrics().num_alive_tasks() as i64);
        if let Some(n) = tasks {
            self.tasks.set(n);
        }
        let mut out = Vec::new();
        out.extend(self.cpu.collect());
        out.extend(self.rss.collect());
        out.extend(self.vsize.collect());
        out.extend(self.fds.collect());
        out.extend(self.max_fds.collect());
        out.extend(self.threads.collect());
        if tasks.is_some() {
            out.extend(self.tasks.collect());
        }
        out.extend(self.start.collect());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat = "4242 (orca relay (x)) S 1 4242 4242 0 -1 4194560 500 0 0 0 150 50 0 0 20 0 7 0 \
                    123456 987654321 2500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                utime_ticks: 150,
                stime_ticks: 50,
                threads: 7,
                start_ticks: 123456,
                vsize: 987654321,
                rss_pages: 2500,
            })
        );
        assert_eq!(
            parse_btime("cpu 1 2\nbtime 1700000000\nprocesses 9\n"),
            Some(1700000000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn collects_this_process() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let c = ProcessCollector::new();
        let fams = c.collect();
        let get = |n: &str| {
            fams.iter()
                .find(|f| f.name() == n)
                .map(|f| f.get_metric()[0].get_gauge().get_value())
        };
        assert!(get("process_resident_memory_bytes").unwrap() > 0.0);
        assert!(get("process_open_fds").unwrap() >= 3.0);
        assert!(get("process_start_time_seconds").unwrap() > 1.6e9);
    }
}
