//! One log capture for in-process servers: a `log` logger that keeps every record at info level
//! and above (all tests of the binary share it, as they share the process-wide logger), so a test
//! can look for an event line or scan every line for a secret. `TEST_LOGS=1` (or the older
//! `PUSH_TEST_LOGS=1`) also echoes the lines to stderr.

use std::sync::{Mutex, Once};

/// One captured record.
#[derive(Clone, Debug)]
pub struct Line {
    pub level: log::Level,
    pub target: String,
    pub text: String,
}

static LINES: Mutex<Vec<Line>> = Mutex::new(Vec::new());

struct Capture {
    echo: bool,
}

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = Line {
            level: r.level(),
            target: r.target().to_string(),
            text: r.args().to_string(),
        };
        if self.echo {
            eprintln!("{} {}", line.target, line.text);
        }
        lock().push(line);
    }

    fn flush(&self) {}
}

fn lock() -> std::sync::MutexGuard<'static, Vec<Line>> {
    // A test that panicked while holding the lock must not hide the other tests' lines.
    LINES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Installs the capturing logger once per test binary (info level, like the default `RUST_LOG`).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let echo =
            std::env::var_os("TEST_LOGS").is_some() || std::env::var_os("PUSH_TEST_LOGS").is_some();
        let _ = log::set_boxed_logger(Box::new(Capture { echo }));
        log::set_max_level(log::LevelFilter::Info);
    });
}

/// Every record captured so far (all tests of the binary).
pub fn lines() -> Vec<Line> {
    lock().clone()
}

/// The text of the records whose target starts with `prefix` (`"orca_relay"`: the crate's own).
pub fn texts(prefix: &str) -> Vec<String> {
    lock()
        .iter()
        .filter(|l| l.target.starts_with(prefix))
        .map(|l| l.text.clone())
        .collect()
}
