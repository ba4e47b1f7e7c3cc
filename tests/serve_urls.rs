//! Start-up names the URLs the process advertises, and warns once when a listener other machines
//! can reach advertises plain `http` (the Orca apps refuse it), naming what to set.

mod support;
use support::common;

use std::time::Duration;

use common::proc::{self as cproc, Log, Spec};

/// Starts `serve` listening on `listen` and returns every line it logged until SIGTERM.
fn lines(listen: &str, extra: &[(&str, &str)]) -> (String, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut envs = vec![("ORCA_RELAY_LISTEN".to_string(), listen.to_string())];
    envs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let spec = Spec {
        cwd: Some(dir.path()),
        ..Spec::new("serve", &[], &envs)
    };
    let log = Log::default();
    let mut s = cproc::spawn_serve(&spec, &log, Duration::from_secs(30))
        .unwrap_or_else(|()| panic!("server did not start: {:?}", cproc::lines(&log)));
    let status = cproc::terminate(&mut s.child, Duration::from_secs(15), "serve");
    assert_eq!(status.code(), Some(0));
    s.reader.join().unwrap();
    (s.addr, cproc::lines(&log))
}

fn matching<'a>(lines: &'a [String], needle: &str) -> Vec<&'a String> {
    lines.iter().filter(|l| l.contains(needle)).collect()
}

#[test]
fn loopback_logs_the_urls_without_a_warning() {
    let (addr, lines) = lines("127.0.0.1:0", &[]);
    let info = matching(&lines, "advertising public URL");
    assert_eq!(info.len(), 1, "{lines:#?}");
    assert!(
        info[0].contains(" INFO ")
            && info[0].ends_with(&format!(
                "advertising public URL http://{addr}, cell URL http://{addr}"
            )),
        "{}",
        info[0]
    );
    assert!(
        matching(&lines, "advertising plain http").is_empty(),
        "{lines:#?}"
    );
}

#[test]
fn a_wildcard_listener_advertising_http_warns_once() {
    let (_, lines) = lines("0.0.0.0:0", &[]);
    let warn = matching(&lines, "advertising plain http");
    assert_eq!(warn.len(), 1, "{lines:#?}");
    let w = warn[0];
    assert!(w.contains(" WARN "), "{w}");
    for needed in [
        "ORCA_RELAY_PUBLIC_URL (http://127.0.0.1:",
        "ORCA_RELAY_CELL_URL (http://127.0.0.1:",
        "the Orca apps refuse",
        "ORCA_RELAY_TLS_CERT",
    ] {
        assert!(w.contains(needed), "{needed}: {w}");
    }
}

#[test]
fn https_urls_behind_a_proxy_are_quiet() {
    let (_, lines) = lines(
        "0.0.0.0:0",
        &[
            ("ORCA_RELAY_PUBLIC_URL", "https://relay.example.org"),
            ("ORCA_RELAY_CELL_URL", "https://cell-1.relay.example.org"),
        ],
    );
    let info = matching(&lines, "advertising public URL");
    assert_eq!(info.len(), 1, "{lines:#?}");
    assert!(info[0].ends_with(
        "advertising public URL https://relay.example.org, cell URL https://cell-1.relay.example.org"
    ));
    assert!(
        matching(&lines, "advertising plain http").is_empty(),
        "{lines:#?}"
    );
}
