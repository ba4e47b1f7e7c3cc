//! Host sessions (docs/reference/websocket.md "Host session") and the per-cell registry.
//!
//! A session is shared by its control task, its phones' tasks and the data legs; its state lives
//! under a short std mutex (never held across an await). Other tasks talk to the control socket
//! through a bounded channel, to pending phones through a one-shot `Attach`, and to splices through
//! a one-shot kill switch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::{Cell, ConnGuard};
use crate::contract::close::{self, reason};
use crate::crypto::HostClaims;
use crate::leg::ws::Ws;
use crate::store::assignments::HostKey;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Active,
    DrainOnly,
    Orphaned,
    Closed,
}

/// Messages to a control task.
#[derive(Debug)]
pub enum ControlOut {
    /// One JSON text frame.
    Frame(String),
    /// Close the socket with this code/reason; the task ends without orphaning the session.
    Close(u16, &'static str),
}

/// The current control socket of a session.
#[derive(Debug, Clone)]
pub struct ControlRef {
    pub sock_id: u64,
    /// Boxed items: tokio allocates a channel's slots 32 at a time up front, so every idle
    /// control holds a block of these (8 bytes each instead of 32).
    pub tx: mpsc::Sender<Box<ControlOut>>,
    pub pending_details: bool,
    pub idle_rehome: bool,
}

impl ControlRef {
    /// Best effort: a full or closed channel means the control is going away anyway.
    pub fn send(&self, m: ControlOut) {
        let _ = self.tx.try_send(Box::new(m));
    }
}

/// What a data leg hands to its pending phone.
pub struct DataLeg {
    pub ws: Ws,
    pub guard: ConnGuard,
}

pub enum Attach {
    Data(Box<DataLeg>),
    /// `relay-hello {ok:false, code}` + close with that code and reason.
    Reject(u16, &'static str),
}

/// A phone waiting for its data leg (step 9).
pub struct Pending {
    pub ticket: String,
    pub kind: &'static str,
    pub device: String,
    pub tx: oneshot::Sender<Attach>,
}

pub type Kill = oneshot::Sender<(u16, &'static str)>;

pub struct Inner {
    pub state: State,
    pub generation: i64,
    pub epoch: i64,
    pub secret: String,
    pub lease_expires_at: i64,
    pub authority_rev: u64,
    pub claims: HostClaims,
    pub app_version: String,
    pub drain_sent: bool,
    pub control: Option<ControlRef>,
    pub activity_id: String,
    pub pending: HashMap<String, Pending>,
    pub active: HashMap<String, Option<Kill>>,
    /// Bumped whenever the orphan timer must be forgotten.
    pub orphan_seq: u64,
    pub last_pong: i64,
    pub renewal_due: i64,
    pub renewal_in_flight: bool,
    /// The expiry of the control activity lease as this cell last wrote it (activation or
    /// renewal). Past it the store no longer records this cell as serving the host, so the
    /// session must be gone before it (`control::lease_fenced`).
    pub activity_expires_at: i64,
}

pub struct Session {
    pub key: HostKey,
    pub id: u64,
    pub inner: Mutex<Inner>,
}

impl Session {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }
}

impl Inner {
    /// Active + pending connections (per-host cap 8).
    pub fn load(&self) -> usize {
        self.pending.len() + self.active.len()
    }

    pub fn control_open(&self) -> bool {
        self.control.as_ref().is_some_and(|c| !c.tx.is_closed())
    }

    /// Tears down everything the session holds: kill every splice and reject every pending phone.
    pub fn close_all(&mut self, splice: (u16, &'static str), pending: (u16, &'static str)) {
        for (_, kill) in self.active.iter_mut() {
            if let Some(k) = kill.take() {
                let _ = k.send(splice);
            }
        }
        for (_, p) in self.pending.drain() {
            let _ = p.tx.send(Attach::Reject(pending.0, pending.1));
        }
    }
}

/// All sessions of the cell, by host, plus the pending `connId` index for data legs.
#[derive(Default)]
pub struct Registry {
    pub sessions: HashMap<HostKey, Arc<Session>>,
    pub pending_owner: HashMap<String, HostKey>,
    pub activation: HashMap<HostKey, Arc<tokio::sync::Mutex<()>>>,
    next_id: AtomicU64,
}

impl Registry {
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn get(&self, key: &HostKey) -> Option<Arc<Session>> {
        self.sessions.get(key).cloned()
    }

    /// Removes `session` if it is still the one registered for its key.
    pub fn remove_if(&mut self, session: &Session) -> bool {
        if self
            .sessions
            .get(&session.key)
            .is_some_and(|s| s.id == session.id)
        {
            self.sessions.remove(&session.key);
            return true;
        }
        false
    }

    /// The FIFO activation lock of a host; dropped from the map when unused.
    pub fn activation_lock(&mut self, key: &HostKey) -> Arc<tokio::sync::Mutex<()>> {
        self.activation
            .retain(|_, m| Arc::strong_count(m) > 1 || m.try_lock().is_err());
        self.activation.entry(key.clone()).or_default().clone()
    }
}

/// Signed-out memory: 24 h, ≤ 50 000 entries, oldest evicted.
#[derive(Default)]
pub struct SignedOut {
    entries: HashMap<HostKey, i64>,
}

impl SignedOut {
    pub fn remember(&mut self, key: HostKey, now: i64) {
        use crate::contract::limits::{SIGNED_OUT_MEMORY_MAX, SIGNED_OUT_MEMORY_MS};
        self.entries
            .retain(|_, at| now - *at < SIGNED_OUT_MEMORY_MS);
        if self.entries.len() >= SIGNED_OUT_MEMORY_MAX {
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, now);
    }
    pub fn forget(&mut self, key: &HostKey) {
        self.entries.remove(key);
    }
    pub fn is_signed_out(&self, key: &HostKey, now: i64) -> bool {
        self.entries
            .get(key)
            .is_some_and(|at| now - *at < crate::contract::limits::SIGNED_OUT_MEMORY_MS)
    }
}

/// Closes a replaced session (step 6) or a drained one (step 4): splices, pending phones
/// and the socket with `control_close`, activity released, session removed if still registered.
pub fn retire(cell: &Cell, s: &Session, control_close: (u16, &'static str)) {
    let (splice, pending) = if control_close.0 == close::DRAINING {
        (
            (close::DRAINING, reason::RELAY_DRAINING),
            (close::DRAINING, reason::RELAY_CONNECTION_REJECTED),
        )
    } else {
        (
            (close::PEER_DROPPED, reason::PEER_CONNECTION_DROPPED),
            (close::PEER_DROPPED, reason::RELAY_CONNECTION_REJECTED),
        )
    };
    let mut st = s.lock();
    st.state = State::Closed;
    st.orphan_seq += 1;
    st.close_all(splice, pending);
    let control = st.control.take();
    let activity = std::mem::take(&mut st.activity_id);
    drop(st);
    // The control lease is released before the host hears the close: a host that re-resolves at
    // once must never find its old control still charged to this cell next to the new one.
    let close = move || {
        if let Some(c) = control {
            c.send(ControlOut::Close(control_close.0, control_close.1));
        }
    };
    if activity.is_empty() {
        close();
    } else {
        cell.release_activity_then(&s.key, activity, close);
    }
    cell.registry().remove_if(s);
}
