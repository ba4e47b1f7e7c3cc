//! The Dockerfile's `runtime` stage, built and run: `/ready` answers 200 from the process running
//! as uid 10001, the HEALTHCHECK (`orca-relay health`) reaches `healthy`, and `docker stop`
//! (SIGTERM) drains and exits 0.
//!
//! No image registry is reachable here, so the base image is a Debian bookworm `minbase` made by
//! `debootstrap` from Debian's packages, imported into Docker, and the runtime stage's text is
//! taken from the real Dockerfile with its one `COPY --from=build` pointed at the binary cargo
//! built for this test (the rust build stage is not run). The debootstrap tarball is cached under
//! cargo's target directory, so only the first run pays for it (about 2 minutes); a rerun costs
//! the image build (`apt-get install ca-certificates` in the stage, ~20 s) and ~10 s of running.
//!
//! A Docker daemon already answering is used; otherwise, as root with Debian's `docker.io`, one
//! is started for the test with its data under the target directory and stopped at the end.
//! Skipped, with the reason printed, where no daemon can be had or `debootstrap` is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BASE: &str = "orca-relay-test-base:bookworm";
const IMAGE: &str = "orca-relay-test-runtime:latest";
const MIRROR: &str = "http://deb.debian.org/debian";

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deploy-docker")
}

fn ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Docker {
    host: Option<String>,
    daemon: Option<Child>,
}

impl Docker {
    fn cmd(&self) -> Command {
        let mut c = Command::new("docker");
        if let Some(h) = &self.host {
            c.env("DOCKER_HOST", h);
        }
        c
    }
    fn run(&self, args: &[&str]) -> (bool, String) {
        let out = self.cmd().args(args).output().expect("docker");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text.trim().to_string())
    }
    fn answers(&self) -> bool {
        ok(self.cmd().arg("info"))
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        if let Some(d) = &mut self.daemon {
            // SIGTERM to the daemon this test started, then reap it.
            let _ = Command::new("kill").arg(d.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if d.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

/// A daemon that answers, or why there is none.
fn docker() -> Result<Docker, String> {
    if Command::new("docker").arg("--version").output().is_err() {
        return Err("the docker client is not installed (Debian package docker.io)".into());
    }
    let existing = Docker {
        host: None,
        daemon: None,
    };
    if existing.answers() {
        return Ok(existing);
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&root.stdout).trim() != "0" {
        return Err("no Docker daemon answers and starting one needs root".into());
    }
    if Command::new("dockerd").arg("--version").output().is_err() {
        return Err("no Docker daemon answers and dockerd is not installed (docker.io)".into());
    }
    let dir = tmp().join("daemon");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("docker.sock");
    let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
    let child = Command::new("dockerd")
        .arg("--data-root")
        .arg(dir.join("root"))
        .arg("--exec-root")
        .arg(dir.join("exec"))
        .arg("--pidfile")
        .arg(dir.join("dockerd.pid"))
        .arg("-H")
        .arg(format!("unix://{}", sock.display()))
        // Containers use the host's network (loopback only); no bridge, no iptables rules.
        .args(["--bridge=none", "--iptables=false", "--ip6tables=false"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("dockerd: {e}"))?;
    let mut d = Docker {
        host: Some(format!("unix://{}", sock.display())),
        daemon: Some(child),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if d.answers() {
            return Ok(d);
        }
        if let Some(s) = d.daemon.as_mut().unwrap().try_wait().ok().flatten() {
            let log = std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            return Err(format!("dockerd exited ({s}): {tail:?}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err("dockerd did not answer within 30 s".into())
}

/// The debootstrap rootfs imported as [`BASE`] (the tarball cached across runs).
fn base_image(d: &Docker) -> Result<(), String> {
    if d.run(&["image", "inspect", BASE]).0 {
        return Ok(());
    }
    let tarball = tmp().join("bookworm-minbase.tar");
    if !tarball.exists() {
        if Command::new("debootstrap")
            .arg("--version")
            .output()
            .is_err()
        {
            return Err("debootstrap is not installed".into());
        }
        let rootfs = tmp().join("rootfs");
        let _ = std::fs::remove_dir_all(&rootfs);
        let out = Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&rootfs)
            .arg(MIRROR)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "debootstrap failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
        }
        let partial = tarball.with_extension("partial");
        let st = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&partial)
            .arg(".")
            .status()
            .map_err(|e| e.to_string())?;
        assert!(st.success(), "tar of the rootfs");
        std::fs::rename(&partial, &tarball).unwrap();
        let _ = std::fs::remove_dir_all(&rootfs);
    }
    let (good, out) = d.run(&["import", &tarball.display().to_string(), BASE]);
    good.then_some(()).ok_or(format!("docker import: {out}"))
}

/// The Dockerfile's runtime stage, with the binary from the build context instead of the
/// build stage.
fn runtime_dockerfile() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let start = text
        .find("FROM ${RUNTIME_IMAGE} AS runtime")
        .expect("a named runtime stage");
    let stage = &text[start..];
    let copy = "COPY --from=build /src/target/release/orca-relay /usr/local/bin/orca-relay";
    assert!(stage.contains(copy), "the runtime stage copies the binary");
    assert!(
        stage.contains("HEALTHCHECK"),
        "the runtime stage has a HEALTHCHECK"
    );
    format!(
        "ARG RUNTIME_IMAGE={BASE}\n{}",
        stage.replace(copy, "COPY orca-relay /usr/local/bin/orca-relay")
    )
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn runtime_image_serves_as_uid_10001_is_healthy_and_stops_cleanly() {
    let started = Instant::now();
    let d = match docker() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    if let Err(why) = base_image(&d) {
        eprintln!("skipped: no base image: {why}");
        return;
    }
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("Dockerfile"), runtime_dockerfile()).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_orca-relay"),
        ctx.path().join("orca-relay"),
    )
    .unwrap();
    let (built, out) = d.run(&[
        "build",
        "--network",
        "host",
        "-t",
        IMAGE,
        &ctx.path().display().to_string(),
    ]);
    assert!(built, "docker build: {out}");

    let port = free_port();
    let name = format!("orca-relay-test-{port}");
    let listen = format!("ORCA_RELAY_LISTEN=127.0.0.1:{port}");
    let (ran, out) = d.run(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        "host",
        "-e",
        &listen,
        // The Dockerfile's HEALTHCHECK command, polled faster than its 15 s for the test.
        "--health-interval",
        "1s",
        "--health-start-period",
        "20s",
        IMAGE,
    ]);
    assert!(ran, "docker run: {out}");
    let cleanup = Cleanup(&d, &name);

    let ready = format!("http://127.0.0.1:{port}/ready");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut status = None;
    while Instant::now() < deadline {
        if let Ok(r) = http_get::status(&ready) {
            status = Some(r);
            if r == 200 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(status, Some(200), "{}", d.run(&["logs", &name]).1);

    // The serving process is uid 10001.
    let (_, uid) = d.run(&["exec", &name, "sh", "-c", "stat -c %u /proc/1"]);
    assert_eq!(uid, "10001");

    let mut health = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        health = d
            .run(&["inspect", "-f", "{{.State.Health.Status}}", &name])
            .1;
        if health == "healthy" {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(health, "healthy", "{}", d.run(&["logs", &name]).1);

    let (stopped, out) = d.run(&["stop", "-t", "30", &name]);
    assert!(stopped, "docker stop: {out}");
    let (_, code) = d.run(&["inspect", "-f", "{{.State.ExitCode}}", &name]);
    assert_eq!(code, "0", "{}", d.run(&["logs", &name]).1);
    drop(cleanup);
    eprintln!("runtime image checked in {:?}", started.elapsed());
}

struct Cleanup<'a>(&'a Docker, &'a str);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&["rm", "-f", self.1]);
    }
}

/// `GET url` status on a tiny blocking HTTP/1.1 client (no extra dependency).
mod http_get {
    use std::io::{Read, Write};

    pub fn status(url: &str) -> Result<u16, std::io::Error> {
        let rest = url.strip_prefix("http://").expect("http url");
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let mut s = std::net::TcpStream::connect(authority)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
        )?;
        let mut head = String::new();
        s.read_to_string(&mut head)?;
        head.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other("no status line"))
    }
}
