//! The one child-process wrapper: the real `orca-relay serve` binary as a child with a clean
//! environment (only `PATH`, `RUST_LOG` and what the test names), its stderr captured line by
//! line into a shared [`Log`], the address of its first listener read from the
//! `listening on http(s)://…` line, signals, and a bounded wait for its exit.
//!
//! Polling a child (`try_wait`, log lines) happens in real time: it runs on its own clock.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::wait::eventually_blocking;

/// Captured stderr lines of a child (kept across restarts of the same role process).
pub type Log = Arc<Mutex<Vec<String>>>;

/// What to run: `orca-relay serve` with these arguments, environment and working directory.
#[derive(Clone, Copy)]
pub struct Spec<'a> {
    /// Names the process in echoed lines.
    pub name: &'a str,
    pub args: &'a [String],
    pub envs: &'a [(String, String)],
    pub cwd: Option<&'a Path>,
    pub rust_log: &'a str,
    /// Echo every line to stderr when this environment variable is set.
    pub verbose_env: &'a str,
    /// A command the binary runs under (`ip netns exec <ns>`), empty for none. The wrapper must
    /// exec the binary, so the child's pid stays the relay's.
    pub wrap: &'a [String],
    /// The binary to run; `None` for the one cargo built for this test. An example (which cargo
    /// gives no binary path) names one.
    pub bin: Option<&'a Path>,
}

impl<'a> Spec<'a> {
    pub fn new(name: &'a str, args: &'a [String], envs: &'a [(String, String)]) -> Spec<'a> {
        Spec {
            name,
            args,
            envs,
            cwd: None,
            rust_log: "info",
            verbose_env: "TEST_PROC_VERBOSE",
            wrap: &[],
            bin: None,
        }
    }

    /// The command, stderr piped and stdout discarded.
    pub fn command(&self) -> Command {
        // `option_env!`: examples share the harnesses, and cargo names the binary only to tests.
        let bin = match self.bin {
            Some(b) => b,
            None => match option_env!("CARGO_BIN_EXE_orca-relay") {
                Some(b) => Path::new(b),
                None => panic!("the orca-relay binary is known to integration tests only"),
            },
        };
        let mut cmd = match self.wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("serve")
            .args(self.args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", self.rust_log)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(d) = self.cwd {
            cmd.current_dir(d);
        }
        for (k, v) in self.envs {
            cmd.env(k, v);
        }
        cmd
    }
}

/// A started child, its listener address and the thread that reads its stderr (it ends when
/// the child's stderr closes, i.e. after the child exits: join it to have every line).
pub struct Spawned {
    pub child: Child,
    pub addr: String,
    pub reader: JoinHandle<()>,
}

/// Starts `spec` with its stderr going into `log` and waits up to `within` for its listener.
/// `Err` (the child killed) when no listener came up in time.
pub fn spawn_serve(spec: &Spec, log: &Log, within: Duration) -> Result<Spawned, ()> {
    let mut child = spec.command().spawn().expect("spawn orca-relay");
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = log.clone();
    let name = spec.name.to_string();
    let echo = std::env::var_os(spec.verbose_env).is_some();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            for scheme in ["https://", "http://"] {
                let marker = format!("listening on {scheme}");
                if let Some(i) = line.find(&marker) {
                    let _ = tx.send(line[i + marker.len()..].trim().to_string());
                }
            }
            if echo {
                eprintln!("[{name}] {line}");
            }
            lock(&sink).push(line);
        }
    });
    match rx.recv_timeout(within) {
        Ok(addr) => Ok(Spawned {
            child,
            addr,
            reader,
        }),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(())
        }
    }
}

/// Runs `spec` to its end (a configuration refusal): (exit code, stderr).
pub fn run_to_exit(spec: &Spec) -> (i32, String) {
    let out = spec.command().output().expect("run orca-relay");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn lock(log: &Log) -> std::sync::MutexGuard<'_, Vec<String>> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn lines(log: &Log) -> Vec<String> {
    lock(log).clone()
}

/// How many captured lines contain `needle`.
pub fn count(log: &Log, needle: &str) -> usize {
    lock(log).iter().filter(|l| l.contains(needle)).count()
}

/// Waits (real time) until more than `seen` captured lines contain `needle`.
pub fn wait_more(log: &Log, needle: &str, seen: usize, within: Duration) -> bool {
    eventually_blocking(within, || count(log, needle) > seen)
}

/// Sends `sig` to the child. Tests may use `unsafe` (the library forbids it): `kill(2)` is the
/// only way to send SIGTERM/SIGHUP without another dependency.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on the pid of a child we own and have not reaped.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// Waits (real time) up to `within` for the child to exit.
pub fn wait_exit(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let mut status = None;
    eventually_blocking(within, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    status
}

/// SIGTERM, then the exit status; fails the test if the child is still running after `within`.
pub fn terminate(child: &mut Child, within: Duration, name: &str) -> ExitStatus {
    signal(child, libc::SIGTERM);
    wait_exit(child, within).unwrap_or_else(|| panic!("{name}: no exit {within:?} after SIGTERM"))
}

/// Kills and reaps the child (for `Drop`).
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}
