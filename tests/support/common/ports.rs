//! Ephemeral loopback ports for processes the test starts itself.
//!
//! Binding port 0 and dropping the listener can hand the same port to two callers in a row (the
//! kernel is free to reuse it at once), and two cells given one port collide. Every port this
//! process has handed out is remembered and never handed out twice.

use std::collections::HashSet;
use std::sync::Mutex;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago and that no earlier call in this process returned.
pub fn free_port() -> u16 {
    let mut seen = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let seen = seen.get_or_insert_with(HashSet::new);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind an ephemeral loopback port")
            .port();
        if seen.insert(port) {
            return port;
        }
    }
}
