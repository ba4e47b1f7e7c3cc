//! A hint from a splice that a leg socket is moving data in bulk (its busy phase), or no longer
//! is.
//!
//! Why: a transport that frees its buffers whenever it drains (the TLS stream, which is what keeps
//! an idle TLS connection small) would otherwise free and rebuild them at every pause of a busy
//! splice. The pre-auth wrapper forwards the hint; the sockets below implement it.

/// See the module doc. The default does nothing: plain sockets keep no buffers of their own.
pub trait BusyHint {
    fn set_busy(&mut self, _busy: bool) {}
}

/// Test sockets keep no buffers to hint about.
#[cfg(test)]
impl BusyHint for tokio::io::DuplexStream {}
