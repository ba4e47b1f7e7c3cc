//! The busy phase of a splice: both raw sockets driven directly, frames moved by the rewriter
//! (`cell::frame_rewrite`) instead of two WebSocket codecs.
//!
//! Why: a codec costs a message value, a shared payload buffer and readiness bookkeeping per
//! frame, which at small frames is most of the splice's CPU. Here each direction reads as much as
//! the source has into one buffer, rewrites every complete frame into the target's output buffer
//! and writes that buffer with one call, as a hand-written relay would.
//!
//! A splice enters this phase at a quiet moment of a busy codec phase (both codecs at a message
//! boundary, nothing queued; see [`super::GROW_AFTER`]) and leaves it by one of three doors:
//! - **hand-over**: the rewriter met a frame it does not take (a control frame, a fragment, an
//!   oversized or malformed frame): reading stops, what was rewritten is written out, and the
//!   unread bytes go to fresh codecs, which treat them exactly as the codecs always do;
//! - **park**: quiet for two sweep rounds with nothing buffered, like the codec phase;
//! - **end**: a peer's EOF or error, the kill switch, or the wedge deadline (the end codes are the
//!   codec phase's, see [`End`]); what is already rewritten is written out first (for at most
//!   [`FINAL_WRITE`]) so the close frame follows whole frames. A peer that takes nothing for
//!   that long is not reading at all; its close then follows whatever part was written, and the
//!   close's own force-terminate ends the socket, as it would a codec that could not flush.
//!
//! Backpressure: a direction stops reading its source once the target's unwritten output passes
//! the high-water mark and resumes when it falls to the low-water mark, so a peer that stops
//! reading costs this phase at most that much plus one read, the rest staying in kernel buffers
//! under TCP flow control. A direction paused for the wedge timeout ends the splice 4429
//! `wedged relay link`, as overflow does in the codec phase.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::{wedge_deadline, Count, Dir, End, IdleSweep, Limits, Live, Side, Splice, Stats};
use crate::cell::frame_rewrite::{self, FrameLimits, Stop};
use crate::leg::boundary::MessageBoundary;
use crate::leg::busy_hint::BusyHint;

/// Each socket's read buffer in the busy phase; also the largest frame the rewriter takes (a
/// larger one is handed over to a codec).
pub const BUSY_READ: usize = 32 * 1024;
/// A read buffer's size once frames over [`MIN_READ`] have been seen (see [`Wire::fill`]).
pub const BUSY_READ_LARGE: usize = 128 * 1024;
/// Frames one direction moves per poll before yielding to other tasks.
const BUSY_BATCH: usize = 1024;
/// Free space below which a read buffer holding a partial frame is compacted before reading.
const MIN_READ: usize = 4 * 1024;
/// How long an ending busy phase spends writing out what it already rewrote.
pub const FINAL_WRITE: Duration = Duration::from_secs(1);

/// How the busy phase ended.
pub(super) enum Outcome {
    /// Quiet for two sweep rounds, nothing buffered: park the raw sockets.
    Park,
    /// A frame the rewriter does not take: the (phone, host) bytes not yet read by a codec.
    Handover(Vec<u8>, Vec<u8>),
    End(End),
}

/// One socket's buffers: what was read from it and not yet rewritten, and what is to be written to
/// it (whole server frames).
struct Wire {
    inb: Box<[u8]>,
    start: usize,
    end: usize,
    out: Vec<u8>,
    /// Bytes of `out` already written.
    sent: usize,
    /// Written since the last completed flush.
    unflushed: bool,
    /// What the rewriter takes from this socket.
    limits: FrameLimits,
}

impl Wire {
    fn new(cfg: &WebSocketConfig) -> Wire {
        let max = |o: Option<usize>| o.unwrap_or(usize::MAX);
        Wire {
            inb: vec![0u8; BUSY_READ].into_boxed_slice(),
            start: 0,
            end: 0,
            out: Vec::new(),
            sent: 0,
            unflushed: false,
            limits: FrameLimits {
                max_payload: max(cfg.max_message_size).min(max(cfg.max_frame_size)),
                max_frame: BUSY_READ,
            },
        }
    }

    fn pending(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Nothing left to write or flush.
    fn drained(&self) -> bool {
        self.pending() == 0 && !self.unflushed
    }

    /// Bytes read and not rewritten.
    fn unread(&self) -> &[u8] {
        &self.inb[self.start..self.end]
    }

    /// Reads more of the source after what is buffered (compacting a partial frame to the front
    /// when little room is left). `Ready(Ok(0))` is EOF.
    fn fill<S: AsyncRead + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut S,
    ) -> Poll<std::io::Result<usize>> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.start > 0 && self.inb.len() - self.end < MIN_READ {
            let partial = self.end - self.start;
            if partial > MIN_READ && self.inb.len() < BUSY_READ_LARGE {
                // Large frames straddle the buffer's end at nearly every read, and each time the
                // partial frame is copied to the front: a larger buffer makes that rare.
                let mut larger = vec![0u8; BUSY_READ_LARGE].into_boxed_slice();
                larger[..partial].copy_from_slice(self.unread());
                self.inb = larger;
            } else {
                self.inb.copy_within(self.start..self.end, 0);
            }
            (self.start, self.end) = (0, partial);
        }
        let mut rb = ReadBuf::new(&mut self.inb[self.end..]);
        match Pin::new(io).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let n = rb.filled().len();
                self.end += n;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Writes what is pending until the socket would block, then flushes once all is written.
    fn write_out<S: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut S,
        side: Side,
    ) -> Result<(), End> {
        while self.sent < self.out.len() {
            match Pin::new(&mut *io).poll_write(cx, &self.out[self.sent..]) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Err(End::Dropped(side)),
                Poll::Ready(Ok(n)) => {
                    self.sent += n;
                    self.unflushed = true;
                }
                Poll::Pending => return Ok(()),
            }
        }
        self.out.clear();
        self.sent = 0;
        if self.unflushed {
            match Pin::new(&mut *io).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(_)) => return Err(End::Dropped(side)),
                Poll::Pending => {}
            }
        }
        Ok(())
    }
}

/// Both sockets' buffers and whether a hand-over is under way.
struct Busy {
    phone: Wire,
    host: Wire,
    handover: bool,
}

/// Moves frames `src` → `dst` (see the module doc); `Ready(end)` ends the splice. Of the
/// direction's codec-phase state `flow` it uses only `quiet` (source empty, nothing buffered or
/// unwritten) and `overflow_since`, here the time the direction paused, which the wedge deadline
/// reads.
#[allow(clippy::too_many_arguments)]
fn pump<S>(
    flow: &mut Dir,
    count: &mut Count,
    cx: &mut Context<'_>,
    (src_io, src): (&mut S, &mut Wire),
    (dst_io, dst): (&mut S, &mut Wire),
    src_side: Side,
    handover: &mut bool,
    limits: &Limits,
) -> Poll<End>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let dst_side = src_side.other();
    let (low_water, high_water) = (limits.low_water, limits.high_water);
    let blocked_since = &mut flow.overflow_since;
    let mut moved = 0usize;
    let mut src_empty = false;
    loop {
        if dst.pending() > 0 {
            if let Err(end) = dst.write_out(cx, dst_io, dst_side) {
                return Poll::Ready(end);
            }
        }
        // Paused above the high-water mark until the output falls to the low-water mark.
        let limit = if blocked_since.is_some() {
            low_water
        } else {
            high_water
        };
        if dst.pending() > limit {
            blocked_since.get_or_insert_with(Instant::now);
            break;
        }
        *blocked_since = None;
        if *handover {
            break;
        }
        if moved >= BUSY_BATCH {
            cx.waker().wake_by_ref();
            break;
        }
        let r = frame_rewrite::rewrite(
            src.unread(),
            &mut dst.out,
            &src.limits,
            dst.sent + high_water + 1,
            BUSY_BATCH - moved,
        );
        src.start += r.consumed;
        count.frames += r.frames;
        count.bytes += r.bytes;
        moved += r.frames as usize;
        match r.stop {
            Stop::OutFull | Stop::Batch => {}
            Stop::Handover => {
                *handover = true;
                break;
            }
            Stop::NeedInput => match src.fill(cx, src_io) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    return Poll::Ready(End::Dropped(src_side))
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => {
                    src_empty = true;
                    break;
                }
            },
        }
    }
    if let Err(end) = dst.write_out(cx, dst_io, dst_side) {
        return Poll::Ready(end);
    }
    flow.quiet = src_empty && src.start == src.end && dst.drained();
    Poll::Pending
}

impl Splice {
    #[allow(clippy::too_many_arguments)]
    fn poll_busy<S>(
        &mut self,
        busy: &mut Busy,
        live: &mut Live,
        cx: &mut Context<'_>,
        phone: &mut S,
        host: &mut S,
        kill: &mut oneshot::Receiver<(u16, &'static str)>,
        limits: &Limits,
        sweep: &IdleSweep,
        meter: &(dyn Fn(Stats) + Sync),
    ) -> Poll<Outcome>
    where
        S: AsyncRead + AsyncWrite + Unpin + MessageBoundary,
    {
        if let Some(end) = self.begin_poll(live, cx, kill) {
            return Poll::Ready(Outcome::End(end));
        }
        let Busy {
            phone: pw,
            host: hw,
            handover,
        } = busy;
        for leg in 0..2 {
            let (flow, count, src, dst, side) = if (leg == 0) == live.up_first {
                let (src, dst) = ((&mut *phone, &mut *pw), (&mut *host, &mut *hw));
                (&mut live.up, &mut self.up, src, dst, Side::Phone)
            } else {
                let (src, dst) = ((&mut *host, &mut *hw), (&mut *phone, &mut *pw));
                (&mut live.down, &mut self.down, src, dst, Side::Host)
            };
            if let Poll::Ready(end) = pump(flow, count, cx, src, dst, side, handover, limits) {
                return Poll::Ready(Outcome::End(end));
            }
        }
        let frames = self.frames();
        self.fold_now_and_then(live, cx, meter, frames);
        if *handover && pw.drained() && hw.drained() {
            return Poll::Ready(Outcome::Handover(
                pw.unread().to_vec(),
                hw.unread().to_vec(),
            ));
        }
        match wedge_deadline(live, cx, limits) {
            Some(Poll::Ready(_)) => return Poll::Ready(Outcome::End(End::Wedged)),
            Some(Poll::Pending) => return Poll::Pending,
            None => {}
        }
        let quiet = !*handover
            && live.up.quiet
            && live.down.quiet
            && phone.at_message_boundary()
            && host.at_message_boundary();
        if quiet && self.quiet_long_enough(live, cx, sweep, meter, frames) {
            return Poll::Ready(Outcome::Park);
        }
        Poll::Pending
    }
}

/// Runs the busy phase on the two raw sockets until it parks, hands over or ends (see the module
/// doc). `cfgs` are the (phone, host) sockets' configurations: their frame and message limits.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run<S>(
    sp: &mut Splice,
    phone: &mut S,
    host: &mut S,
    cfgs: (&WebSocketConfig, &WebSocketConfig),
    kill: &mut oneshot::Receiver<(u16, &'static str)>,
    limits: &Limits,
    sweep: &IdleSweep,
    meter: &(dyn Fn(Stats) + Sync),
) -> Outcome
where
    S: AsyncRead + AsyncWrite + Unpin + MessageBoundary + BusyHint,
{
    phone.set_busy(true);
    host.set_busy(true);
    let mut busy = Busy {
        phone: Wire::new(cfgs.0),
        host: Wire::new(cfgs.1),
        handover: false,
    };
    let mut live = Live::default();
    let out = poll_fn(|cx| {
        sp.poll_busy(
            &mut busy, &mut live, cx, phone, host, kill, limits, sweep, meter,
        )
    })
    .await;
    if let Outcome::End(end) = &out {
        // Whole frames already rewritten go out before the codec's close frame; a side that
        // failed is not written to again.
        let skip = match end {
            End::Dropped(side) => Some(*side),
            _ => None,
        };
        let _ = tokio::time::timeout(
            FINAL_WRITE,
            poll_fn(|cx| {
                let mut done = true;
                for (side, io, w) in [
                    (Side::Phone, &mut *phone, &mut busy.phone),
                    (Side::Host, &mut *host, &mut busy.host),
                ] {
                    if skip == Some(side) || w.drained() {
                        continue;
                    }
                    if w.write_out(cx, io, side).is_err() {
                        w.out.clear();
                        (w.sent, w.unflushed) = (0, false);
                    }
                    done &= w.drained();
                }
                if done {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }),
        )
        .await;
    }
    phone.set_busy(false);
    host.set_busy(false);
    out
}
