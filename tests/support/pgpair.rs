//! Two local Postgres instances with streaming replication, built in a temp dir on ephemeral
//! loopback ports: a primary and a standby made from it with `pg_basebackup -R`. Synchronous mode
//! sets `synchronous_standby_names = '*'` and `synchronous_commit = on` on the primary, so a
//! commit is acknowledged only once the standby has flushed it; asynchronous mode does not.
//!
//! The standby's own configuration clears `synchronous_standby_names`: once promoted it runs alone,
//! and a promoted standby still asking for a synchronous peer would block every commit.
//!
//! The server processes run as the `postgres` user (through `runuser`) when the test runs as root,
//! as the current user otherwise. The binaries are looked up in `ORCA_RELAY_TEST_PG_BIN`, then
//! `/usr/lib/postgresql/<version>/bin`, then `PATH`; without them [`PgPair::start`] returns `None`
//! after printing why, except under `CI=true`, where it panics. Nothing here touches a Postgres
//! the machine already runs: the pair has its own data directories, ports and socket directory.
//! Dropping the pair stops both servers (`-m immediate`) and removes the directory. Include
//! `support/cluster` as `cluster` beside this module (its port allocator).
#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

// Ports come from the cluster harness, which never hands one out twice in a process (Postgres binds
// its port seconds after it is chosen, after initdb).
use super::cluster::free_port;

/// How a commit on the primary relates to the standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    /// Acknowledged once flushed on both.
    Sync,
    /// Acknowledged once flushed on the primary; the standby follows.
    Async,
}

pub struct PgPair {
    bin: PathBuf,
    dir: PathBuf,
    as_postgres: bool,
    pub mode: Replication,
    pub primary_port: u16,
    pub standby_port: u16,
    /// The database the relay uses, created on the primary before the standby was made.
    pub database: String,
    primary_running: bool,
    standby_running: bool,
}

/// The directory holding `pg_ctl`, `initdb`, `pg_basebackup`, `postgres` and `psql`.
fn find_bin() -> Option<PathBuf> {
    let has_all = |d: &Path| {
        ["initdb", "pg_ctl", "pg_basebackup", "postgres", "psql"]
            .iter()
            .all(|b| d.join(b).is_file())
    };
    if let Ok(d) = std::env::var("ORCA_RELAY_TEST_PG_BIN") {
        let d = PathBuf::from(d);
        return has_all(&d).then_some(d);
    }
    for v in ["17", "16", "15", "14"] {
        let d = PathBuf::from(format!("/usr/lib/postgresql/{v}/bin"));
        if has_all(&d) {
            return Some(d);
        }
    }
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).find(|d| has_all(d)))
}

fn must_not_skip() -> bool {
    std::env::var("CI").map(|v| v == "true").unwrap_or(false)
}

impl PgPair {
    /// Builds and starts the pair and waits until the standby streams (and, in synchronous mode,
    /// is the synchronous standby). `None` (with the reason printed) when the binaries are missing.
    pub fn start(mode: Replication) -> Option<PgPair> {
        let Some(bin) = find_bin() else {
            let why =
                "skipping: Postgres server binaries (initdb, pg_ctl, pg_basebackup, postgres, \
                       psql) not found; set ORCA_RELAY_TEST_PG_BIN to their directory";
            assert!(!must_not_skip(), "CI=true: {why}");
            eprintln!("{why}");
            return None;
        };
        let as_postgres = std::fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false);
        let dir = std::env::temp_dir().join(format!("pgpair-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("pair dir");
        let mut pair = PgPair {
            bin,
            dir,
            as_postgres,
            mode,
            primary_port: free_port(),
            standby_port: free_port(),
            database: "orca".into(),
            primary_running: false,
            standby_running: false,
        };
        if as_postgres {
            pair.run_root(Command::new("chown").arg("postgres:").arg(&pair.dir));
        }
        pair.build_primary();
        pair.build_standby();
        pair.wait_streaming(Duration::from_secs(30));
        Some(pair)
    }

    fn primary_dir(&self) -> PathBuf {
        self.dir.join("primary")
    }

    fn standby_dir(&self) -> PathBuf {
        self.dir.join("standby")
    }

    /// A command for one of the binaries, as the `postgres` user when running as root.
    fn cmd(&self, name: &str) -> Command {
        let path = self.bin.join(name);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn run(&self, mut c: Command) -> Output {
        let out = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
        assert!(
            out.status.success(),
            "{c:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn run_root(&self, c: &mut Command) {
        let out = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
        assert!(out.status.success(), "{c:?}: {:?}", out);
    }

    fn append(&self, file: &Path, text: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        f.write_all(text.as_bytes()).unwrap();
    }

    fn build_primary(&mut self) {
        let data = self.primary_dir();
        let mut c = self.cmd("initdb");
        c.arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
        self.run(c);
        let sync = match self.mode {
            Replication::Sync => "synchronous_standby_names = '*'\nsynchronous_commit = on\n",
            Replication::Async => "synchronous_standby_names = ''\n",
        };
        self.append(
            &data.join("postgresql.conf"),
            &format!(
                "\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
                 wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\n\
                 max_connections = 60\nshared_buffers = 16MB\n{sync}",
                self.primary_port,
                self.dir.display()
            ),
        );
        self.append(
            &data.join("pg_hba.conf"),
            "\nhost replication postgres 127.0.0.1/32 trust\nhost all postgres 127.0.0.1/32 trust\n",
        );
        self.pg_ctl_start(&data, "primary.log");
        self.primary_running = true;
        // In synchronous mode this commit would wait for a standby that does not exist yet, so
        // the database is created with synchronous_commit off for this one session.
        self.psql_each(
            self.primary_port,
            "postgres",
            &[
                "SET synchronous_commit = off",
                &format!("CREATE DATABASE {}", self.database),
            ],
        );
    }

    fn build_standby(&mut self) {
        let data = self.standby_dir();
        let mut c = self.cmd("pg_basebackup");
        c.args(["-h", "127.0.0.1", "-p", &self.primary_port.to_string()])
            .args([
                "-U",
                "postgres",
                "-X",
                "stream",
                "-R",
                "--no-sync",
                "-c",
                "fast",
                "-D",
            ])
            .arg(&data);
        self.run(c);
        self.append(
            &data.join("postgresql.conf"),
            &format!(
                "\nport = {}\nsynchronous_standby_names = ''\n",
                self.standby_port
            ),
        );
        self.pg_ctl_start(&data, "standby.log");
        self.standby_running = true;
    }

    fn pg_ctl_start(&self, data: &Path, log: &str) {
        let mut c = self.cmd("pg_ctl");
        c.arg("-D")
            .arg(data)
            .arg("-l")
            .arg(self.dir.join(log))
            .args(["-w", "-t", "60", "start"]);
        self.run(c);
    }

    /// `sql` through psql on `port` (TCP, loopback): its unaligned, tuples-only output.
    pub fn psql(&self, port: u16, db: &str, sql: &str) -> String {
        self.psql_each(port, db, &[sql])
    }

    /// Each of `sqls` as its own command (its own transaction) in one psql session.
    pub fn psql_each(&self, port: u16, db: &str, sqls: &[&str]) -> String {
        let mut c = self.cmd("psql");
        c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .args(["-d", db, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"]);
        for sql in sqls {
            c.args(["-c", sql]);
        }
        let out = self.run(c);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits until the primary's `pg_stat_replication` shows the standby streaming (and, in
    /// synchronous mode, with `sync_state = 'sync'`).
    pub fn wait_streaming(&self, within: Duration) {
        let want = match self.mode {
            Replication::Sync => "streaming|sync",
            Replication::Async => "streaming|async",
        };
        let deadline = Instant::now() + within;
        loop {
            let got = self.psql(
                self.primary_port,
                "postgres",
                "SELECT state || '|' || sync_state FROM pg_stat_replication",
            );
            if got.lines().any(|l| l == want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "standby not streaming after {within:?}: {got:?}; standby log: {}",
                self.log("standby.log")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The relay's URL: both hosts, the writable one chosen at each connect.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=read-write",
            self.primary_port, self.standby_port, self.database
        )
    }

    /// A URL to one server only.
    pub fn url_of(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{}", self.database)
    }

    /// Stops the primary with `pg_ctl stop -m immediate` (no shutdown checkpoint, no waiting for
    /// clients: what a crash leaves); returns when it is gone.
    pub fn crash_primary(&mut self) -> Instant {
        let mut c = self.cmd("pg_ctl");
        c.arg("-D")
            .arg(self.primary_dir())
            .args(["-m", "immediate", "-w", "stop"]);
        self.run(c);
        self.primary_running = false;
        Instant::now()
    }

    /// Promotes the standby (`pg_ctl promote -w`: returns once it accepts writes).
    pub fn promote_standby(&self) -> Instant {
        let mut c = self.cmd("pg_ctl");
        c.arg("-D")
            .arg(self.standby_dir())
            .args(["-w", "-t", "60", "promote"]);
        self.run(c);
        Instant::now()
    }

    /// Stops the standby's WAL receiver with SIGSTOP: the primary goes on acknowledging commits
    /// the standby never receives (asynchronous mode; a synchronous primary would wait). Returns
    /// the receiver's pid for [`PgPair::kill_receiver`].
    pub fn freeze_receiver(&self) -> i32 {
        let pid: i32 = self
            .psql(
                self.standby_port,
                "postgres",
                "SELECT pid FROM pg_stat_wal_receiver",
            )
            .parse()
            .expect("a WAL receiver pid");
        self.signal(pid, "-STOP");
        pid
    }

    /// Kills the receiver stopped by [`PgPair::freeze_receiver`] (SIGKILL): what the primary
    /// sent after the freeze and still sits in the socket is gone with it, and the standby's
    /// postmaster restarts its processes from what it flushed. Returns once the standby accepts
    /// connections again.
    pub fn kill_receiver(&self, pid: i32) {
        self.signal(pid, "-KILL");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut c = self.cmd("psql");
            c.args(["-h", "127.0.0.1", "-p", &self.standby_port.to_string()])
                .args([
                    "-U", "postgres", "-d", "postgres", "-X", "-A", "-t", "-c", "SELECT 1",
                ]);
            if c.output().map(|o| o.status.success()).unwrap_or(false) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "standby not back after its receiver was killed: {}",
                self.log("standby.log")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn signal(&self, pid: i32, sig: &str) {
        let out = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .output()
            .expect("kill");
        assert!(out.status.success(), "kill {sig} {pid}: {out:?}");
    }

    /// The server log `name` (`primary.log`, `standby.log`).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for (running, data) in [
            (self.primary_running, self.primary_dir()),
            (self.standby_running, self.standby_dir()),
        ] {
            if running {
                let mut c = self.cmd("pg_ctl");
                c.arg("-D")
                    .arg(data)
                    .args(["-m", "immediate", "-w", "stop"]);
                let _ = c.output();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
