//! A byte budget on what an unauthenticated leg socket may make the relay buffer.
//!
//! tungstenite enforces one message limit per socket for its whole life, and a leg's limit is
//! its maximum after authentication (8 MiB on the phone and data legs, 1 MiB on control). Before
//! authentication the first frames are a few hundred bytes (`relay-auth`, `host-data-auth`,
//! `host-hello`, `host-challenge-ack`), so letting an unauthenticated peer start an 8 MiB frame
//! lets 45 pre-auth sockets pin hundreds of MB. tokio-tungstenite 0.29 cannot change the
//! configuration of a live stream, so the budget sits one layer below: this IO wrapper lets at
//! most [`PREAUTH_READ_BUDGET`] bytes through until the leg [`PreAuthIo::lift`]s it after
//! authentication. When the budget is spent it stops reading (the peer's bytes stay in the
//! kernel, bounded by the socket buffer) and signals [`PreAuthIo::exceeded`]; the leg then closes
//! 1009 (`message too big`). Writes are never limited, so the close frame still goes out.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::boundary::{Boundary, MessageBoundary};
use super::busy_hint::BusyHint;

/// Bytes (frame headers included) an unauthenticated leg may send before it is refused 1009.
/// The largest legitimate pre-auth exchange, `host-hello` plus `host-challenge-ack` with a
/// 128-character `appVersion`, is under 1.5 KiB.
pub const PREAUTH_READ_BUDGET: usize = 8 * 1024;

struct Budget {
    left: AtomicUsize,
    lifted: AtomicBool,
    exceeded: AtomicBool,
    notify: Notify,
    waker: Mutex<Option<Waker>>,
}

/// The socket under a leg's WebSocket, with the pre-auth read budget and the frame-boundary
/// tracker of everything read ([`Boundary`]).
pub struct PreAuthIo<S> {
    inner: S,
    /// `None` once shed after authentication ([`MessageBoundary::shed_preauth`]): an idle spliced
    /// socket then holds no budget state at all.
    budget: Option<Arc<Budget>>,
    boundary: Boundary,
}

impl<S> PreAuthIo<S> {
    pub fn new(inner: S) -> Self {
        PreAuthIo {
            inner,
            budget: Some(Arc::new(Budget {
                left: AtomicUsize::new(PREAUTH_READ_BUDGET),
                lifted: AtomicBool::new(false),
                exceeded: AtomicBool::new(false),
                notify: Notify::new(),
                waker: Mutex::new(None),
            })),
            boundary: Boundary::default(),
        }
    }

    /// Accounts for `bytes` read before this wrapper existed (hyper's leftover past the upgrade
    /// request), exactly as if they had been read through it: the frame-boundary tracker follows
    /// them and they are charged to the budget, which they may spend (then the leg closes 1009).
    pub fn prefill(&mut self, bytes: &[u8]) {
        self.boundary.feed(bytes);
        let Some(b) = &self.budget else { return };
        let left = b.left.load(Ordering::SeqCst);
        b.left
            .store(left.saturating_sub(bytes.len()), Ordering::SeqCst);
        if bytes.len() > left && !b.exceeded.swap(true, Ordering::SeqCst) {
            b.notify.notify_waiters();
        }
    }

    /// After authentication: reads are no longer budgeted (the leg's message limit applies).
    pub fn lift(&self) {
        let Some(b) = &self.budget else { return };
        b.lifted.store(true, Ordering::SeqCst);
        if let Some(w) = crate::sync::lock(&b.waker).take() {
            w.wake();
        }
    }

    /// Resolves once the pre-auth budget has been spent (never after [`lift`](Self::lift)).
    pub fn exceeded(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let b = self.budget.clone();
        async move {
            let Some(b) = b else {
                return std::future::pending().await;
            };
            loop {
                let notified = b.notify.notified();
                if b.exceeded.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        }
    }

    pub fn is_exceeded(&self) -> bool {
        self.budget
            .as_ref()
            .is_some_and(|b| b.exceeded.load(Ordering::SeqCst))
    }
}

impl<S: BusyHint> BusyHint for PreAuthIo<S> {
    fn set_busy(&mut self, busy: bool) {
        self.inner.set_busy(busy);
    }
}

impl<S> MessageBoundary for PreAuthIo<S> {
    fn at_message_boundary(&self) -> bool {
        self.boundary.at_message_boundary()
    }
    /// Only once lifted: an unauthenticated socket keeps its budget.
    fn shed_preauth(&mut self) {
        if self
            .budget
            .as_ref()
            .is_some_and(|b| b.lifted.load(Ordering::SeqCst))
        {
            self.budget = None;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PreAuthIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(b) = this
            .budget
            .as_ref()
            .filter(|b| !b.lifted.load(Ordering::SeqCst))
        else {
            return tracked(&mut this.inner, &mut this.boundary, cx, buf);
        };
        let left = b.left.load(Ordering::SeqCst);
        if left == 0 {
            *crate::sync::lock(&b.waker) = Some(cx.waker().clone());
            // Re-check: a lift between the load and storing the waker must not be missed.
            if b.lifted.load(Ordering::SeqCst) {
                return tracked(&mut this.inner, &mut this.boundary, cx, buf);
            }
            if !b.exceeded.swap(true, Ordering::SeqCst) {
                b.notify.notify_waiters();
            }
            return Poll::Pending;
        }
        let want = buf.remaining().min(left);
        // Read through a window of at most `want` bytes of `buf`'s unfilled part (zeroed first:
        // only before authentication, on a few KiB, so the cost does not matter).
        let mut limited = ReadBuf::new(buf.initialize_unfilled_to(want));
        let r = Pin::new(&mut this.inner).poll_read(cx, &mut limited);
        let n = limited.filled().len();
        if let Poll::Ready(Ok(())) = r {
            this.boundary.feed(limited.filled());
            buf.advance(n);
            b.left.fetch_sub(n, Ordering::SeqCst);
        }
        r
    }
}

/// Reads from `inner` into `buf`, following the new bytes' frame boundaries.
fn tracked<S: AsyncRead + Unpin>(
    inner: &mut S,
    boundary: &mut Boundary,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    let before = buf.filled().len();
    let r = Pin::new(inner).poll_read(cx, buf);
    if let Poll::Ready(Ok(())) = r {
        boundary.feed(&buf.filled()[before..]);
    }
    r
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PreAuthIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn budget_stops_reads_until_lifted() {
        let (mut a, b) = tokio::io::duplex(64 * 1024);
        let mut io = PreAuthIo::new(b);
        a.write_all(&vec![7u8; PREAUTH_READ_BUDGET + 100])
            .await
            .unwrap();
        let mut got = vec![0u8; PREAUTH_READ_BUDGET + 100];
        let mut n = 0;
        while n < PREAUTH_READ_BUDGET {
            n += io.read(&mut got[n..]).await.unwrap();
        }
        assert_eq!(n, PREAUTH_READ_BUDGET);
        let more =
            tokio::time::timeout(std::time::Duration::from_millis(50), io.read(&mut got[n..]));
        assert!(more.await.is_err(), "no byte past the budget");
        assert!(io.is_exceeded());
        tokio::time::timeout(std::time::Duration::from_millis(50), io.exceeded())
            .await
            .expect("exceeded resolves");
        io.lift();
        let m = io.read(&mut got[n..]).await.unwrap();
        assert_eq!(m, 100);
    }
}
