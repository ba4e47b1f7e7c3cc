//! The splice hot path (docs/reference/websocket.md): one task drives both directions of a (phone, host data)
//! pair with a single hand-written poll loop.
//!
//! Why one task and a manual poll: a task per direction plus a channel between them costs two
//! wake-ups and an allocation per frame. Here a frame read from one socket is handed straight to
//! the other socket's writer (`start_send`, no flush) while more frames are ready; the writer is
//! flushed once the source is momentarily empty. Payloads are forwarded as the `Bytes` tungstenite
//! produced (no copy, opcode preserved).
//!
//! Backpressure per direction: *backlog* = bytes fed to the target writer since its last completed
//! flush. A frame is fed at once if the overflow queue is empty and backlog ≤ high water; otherwise
//! it joins the overflow queue and the source is not read until the queue is empty again. Overflow
//! moves to the writer while backlog ≤ low water. Overflow is charged to a process-wide budget; the
//! per-direction or process limit closes the pair 4429 `relay queue limit exceeded`, and overflow
//! that stays non-empty for the wedge timeout closes it 4429 `wedged relay link`. Since the source
//! is not read while overflow is non-empty, a peer that stops reading costs at most one message
//! plus the writer backlog: the rest stays in kernel buffers and TCP flow control stops the sender.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::leg::boundary::MessageBoundary;
use crate::leg::busy_hint::BusyHint;

use crate::contract::close::{self, reason};
use crate::contract::limits;

mod busy;

/// Splice thresholds (docs/reference/websocket.md / docs/reference/limits.md); tests shrink them.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub low_water: usize,
    pub high_water: usize,
    pub direction_max: usize,
    pub wedge: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            low_water: limits::SPLICE_LOW_WATER,
            high_water: limits::SPLICE_HIGH_WATER,
            direction_max: limits::SPLICE_OVERFLOW_DIRECTION_MAX,
            wedge: Duration::from_millis(limits::WEDGE_TIMEOUT_MS),
        }
    }
}

/// The process-wide overflow budget (64 MiB): bytes held in overflow queues of all splices.
#[derive(Debug)]
pub struct Budget {
    used: AtomicUsize,
    max: usize,
}

impl Budget {
    pub fn new(max: usize) -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            max,
        }
    }
    /// Charges `n` bytes; false (nothing charged) when the process total would exceed the max.
    /// A compare-and-swap loop: a refused charger never shows a transient total to the others
    /// (add-then-undo would refuse a concurrent charger whose real total was under the max).
    fn charge(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(n).filter(|total| *total <= self.max)
            })
            .is_ok()
    }
    fn refund(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
    /// Bytes currently queued in overflow, process-wide.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(limits::SPLICE_OVERFLOW_PROCESS_MAX)
    }
}

/// Which socket of the pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Phone,
    Host,
}

impl Side {
    /// The other socket of the pair.
    pub fn other(self) -> Side {
        match self {
            Side::Phone => Side::Host,
            Side::Host => Side::Phone,
        }
    }
}

/// Why a splice ended (docs/reference/websocket.md teardown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// That side closed, errored or vanished: both get 4408 `peer connection dropped`.
    Dropped(Side),
    /// That side sent a message over the leg maximum: it gets 1009, the other 4408.
    Oversize(Side),
    /// Per-direction or process overflow limit: both 4429 `relay queue limit exceeded`.
    QueueLimit,
    /// Overflow non-empty for the wedge timeout: both 4429 `wedged relay link`.
    Wedged,
    /// Closed from outside (drain, generation replaced, orphan grace over).
    Killed(u16, &'static str),
}

impl End {
    /// (phone close, host close).
    pub fn closes(&self) -> ((u16, &'static str), (u16, &'static str)) {
        let dropped = (close::PEER_DROPPED, reason::PEER_CONNECTION_DROPPED);
        let too_big = (close::MESSAGE_TOO_BIG, "message too big");
        match self {
            End::Dropped(_) => (dropped, dropped),
            End::Oversize(Side::Phone) => (too_big, dropped),
            End::Oversize(Side::Host) => (dropped, too_big),
            End::QueueLimit => {
                let c = (close::LIMIT_EXCEEDED, reason::RELAY_QUEUE_LIMIT_EXCEEDED);
                (c, c)
            }
            End::Wedged => {
                let c = (close::LIMIT_EXCEEDED, reason::WEDGED_RELAY_LINK);
                (c, c)
            }
            End::Killed(code, r) => ((*code, r), (*code, r)),
        }
    }
    /// Abnormal ends are logged with the host digest.
    pub fn is_abnormal(&self) -> bool {
        !matches!(self, End::Dropped(_) | End::Killed(..))
    }
}

/// Counters of one splice. The splice keeps them in its own task and hands the growth since the
/// last hand-over to its meter (see [`run`]), never touching a shared counter per frame.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub frames_to_host: u64,
    pub frames_to_phone: u64,
    pub bytes_to_host: u64,
    pub bytes_to_phone: u64,
    /// Times the splice task was polled (wake-ups), for tests of the timer policy.
    pub polls: u64,
    /// Times the splice parked while idle (see [`run`]).
    pub parks: u64,
    /// Times a busy splice moved its frames to the rewriter ([`busy`]).
    pub grows: u64,
    /// Times the rewriter handed a frame it does not take back to a codec.
    pub handovers: u64,
}

/// A live splice folds its counts into the meter at least every [`FOLD_INTERVAL`] while frames
/// move, after [`FOLD_FRAMES`] frames, and once at its end: an hour-long splice shows a rate
/// on `/metrics`, and a busy one costs one meter call per 256 frames.
pub const FOLD_INTERVAL: Duration = Duration::from_secs(1);
pub const FOLD_FRAMES: u64 = 256;

/// One direction's queues.
#[derive(Default)]
struct Dir {
    overflow: VecDeque<Message>,
    overflow_bytes: usize,
    backlog: usize,
    unflushed: bool,
    /// The source answered a ping: its own writer holds a pong to flush.
    src_pong: bool,
    overflow_since: Option<Instant>,
    /// The last pump found the source empty and left nothing queued, unflushed or owed.
    quiet: bool,
}

fn payload_len(m: &Message) -> usize {
    match m {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}

/// Frames and payload bytes one direction has moved (kept while the splice is parked).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    frames: u64,
    bytes: u64,
}

/// Max frames moved per direction per poll before yielding to other tasks.
const BATCH: usize = 64;

/// Where [`Dir::forward`] put a frame.
enum Forwarded {
    /// Fed to the destination's writer.
    Sent,
    /// Queued in the overflow: the writer was above high water or not ready.
    Queued,
}

impl Dir {
    /// Moves frames `src` → `dst`, counting them in `count`. `Ready(end)` ends the splice;
    /// `Pending` means waiting on I/O. Each round drains the overflow first, then reads the source
    /// only while nothing is queued; at most `BATCH` frames per poll.
    #[allow(clippy::too_many_arguments)]
    fn pump<S>(
        &mut self,
        count: &mut Count,
        cx: &mut Context<'_>,
        src: &mut WebSocketStream<S>,
        dst: &mut WebSocketStream<S>,
        src_side: Side,
        limits: &Limits,
        budget: &Budget,
    ) -> Poll<End>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let dst_side = src_side.other();
        let mut moved = 0usize;
        let mut src_empty = false;
        loop {
            // Overflow first, while the writer is below low water.
            if let Err(end) = self.drain_overflow(cx, dst, dst_side, limits.low_water, budget) {
                return Poll::Ready(end);
            }
            if !self.overflow.is_empty() {
                if self.overflow_since.is_none() {
                    self.overflow_since = Some(Instant::now());
                }
                break;
            }
            self.overflow_since = None;
            if moved >= BATCH {
                cx.waker().wake_by_ref();
                break;
            }
            // Then the source, only while nothing is queued.
            match Pin::new(&mut *src).poll_next(cx) {
                Poll::Ready(Some(Ok(m))) => {
                    let n = match &m {
                        Message::Text(_) | Message::Binary(_) => payload_len(&m),
                        Message::Close(_) => return Poll::Ready(End::Dropped(src_side)),
                        Message::Ping(_) => {
                            self.src_pong = true;
                            continue;
                        }
                        Message::Pong(_) | Message::Frame(_) => continue,
                    };
                    moved += 1;
                    count.frames += 1;
                    count.bytes += n as u64;
                    match self.forward(m, n, cx, dst, dst_side, limits, budget) {
                        Ok(Forwarded::Sent) => continue,
                        // Try to make room right away (flush below), then loop to drain.
                        Ok(Forwarded::Queued) => {}
                        Err(end) => return Poll::Ready(end),
                    }
                }
                Poll::Ready(Some(Err(WsError::Capacity(_)))) => {
                    return Poll::Ready(End::Oversize(src_side))
                }
                Poll::Ready(Some(Err(_))) | Poll::Ready(None) => {
                    return Poll::Ready(End::Dropped(src_side))
                }
                Poll::Pending => {
                    src_empty = true;
                    break;
                }
            }
            if self.backlog > limits.high_water || !self.overflow.is_empty() {
                if let Poll::Ready(Err(end)) = self.flush_dst(cx, dst, dst_side) {
                    return Poll::Ready(end);
                }
            }
        }
        self.settle(cx, src, dst, (src_side, dst_side), src_empty)
    }

    /// Flushes `dst`; a completed flush empties the writer's backlog.
    #[inline]
    fn flush_dst<S>(
        &mut self,
        cx: &mut Context<'_>,
        dst: &mut WebSocketStream<S>,
        dst_side: Side,
    ) -> Poll<Result<(), End>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        match Pin::new(&mut *dst).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                self.backlog = 0;
                self.unflushed = false;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(_)) => Poll::Ready(Err(End::Dropped(dst_side))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Feeds queued overflow frames to `dst` while it accepts them, flushing first whenever the
    /// backlog is above `low_water`; stops (with frames left) when `dst` is not ready.
    #[inline]
    fn drain_overflow<S>(
        &mut self,
        cx: &mut Context<'_>,
        dst: &mut WebSocketStream<S>,
        dst_side: Side,
        low_water: usize,
        budget: &Budget,
    ) -> Result<(), End>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        while !self.overflow.is_empty() {
            if self.backlog > low_water {
                match self.flush_dst(cx, dst, dst_side) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(end)) => return Err(end),
                    Poll::Pending => break,
                }
            }
            match Pin::new(&mut *dst).poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => return Err(End::Dropped(dst_side)),
                Poll::Pending => break,
            }
            let m = self.overflow.pop_front().expect("non-empty");
            let n = payload_len(&m);
            self.overflow_bytes -= n;
            budget.refund(n);
            self.backlog += n;
            self.unflushed = true;
            if Pin::new(&mut *dst).start_send(m).is_err() {
                return Err(End::Dropped(dst_side));
            }
        }
        Ok(())
    }

    /// Sends one data frame of `n` payload bytes to `dst` when the backlog is at most high water
    /// and `dst` is ready; otherwise queues it in the overflow, within the direction's maximum and
    /// the process budget (over either: `QueueLimit`).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn forward<S>(
        &mut self,
        m: Message,
        n: usize,
        cx: &mut Context<'_>,
        dst: &mut WebSocketStream<S>,
        dst_side: Side,
        limits: &Limits,
        budget: &Budget,
    ) -> Result<Forwarded, End>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        if self.backlog <= limits.high_water {
            match Pin::new(&mut *dst).poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    self.backlog += n;
                    self.unflushed = true;
                    if Pin::new(&mut *dst).start_send(m).is_err() {
                        return Err(End::Dropped(dst_side));
                    }
                    return Ok(Forwarded::Sent);
                }
                Poll::Ready(Err(_)) => return Err(End::Dropped(dst_side)),
                Poll::Pending => {}
            }
        }
        if self.overflow_bytes + n > limits.direction_max || !budget.charge(n) {
            return Err(End::QueueLimit);
        }
        self.overflow_bytes += n;
        self.overflow.push_back(m);
        Ok(Forwarded::Queued)
    }

    /// The end of a pump whose source is momentarily empty (or blocked): flush what was fed,
    /// flush the source's own pong, and note whether the direction is quiet.
    #[inline]
    fn settle<S>(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut WebSocketStream<S>,
        dst: &mut WebSocketStream<S>,
        (src_side, dst_side): (Side, Side),
        src_empty: bool,
    ) -> Poll<End>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        if self.unflushed {
            match self.flush_dst(cx, dst, dst_side) {
                Poll::Ready(Ok(())) => {
                    if !self.overflow.is_empty() {
                        // Room again: go around once more.
                        cx.waker().wake_by_ref();
                    }
                }
                Poll::Ready(Err(end)) => return Poll::Ready(end),
                Poll::Pending => {}
            }
        }
        if self.src_pong {
            match Pin::new(&mut *src).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.src_pong = false,
                Poll::Ready(Err(_)) => return Poll::Ready(End::Dropped(src_side)),
                Poll::Pending => {}
            }
        }
        self.quiet = src_empty && self.overflow.is_empty() && !self.unflushed && !self.src_pong;
        Poll::Pending
    }

    fn release(&mut self, budget: &Budget) {
        budget.refund(self.overflow_bytes);
        self.overflow_bytes = 0;
        self.overflow.clear();
    }
}

/// The cell-wide idle sweep that lets quiet splices park (see [`run`]): instead of a timer per
/// splice, a splice that went quiet puts its waker on one list, at most once per round; every
/// [`SWEEP_INTERVAL`] the cell's sweeper starts a new round and wakes the list. A splice that saw
/// no frame for a whole round parks. A busy splice pays one atomic load per quiet moment; a
/// parked one is on no list and is never woken by time.
#[derive(Debug, Default)]
pub struct IdleSweep {
    round: AtomicU64,
    waiting: Mutex<Vec<Waker>>,
}

/// How often the cell's sweeper starts a round: a splice parks after 1–2 intervals of silence.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

impl IdleSweep {
    pub fn round(&self) -> u64 {
        self.round.load(Ordering::Relaxed)
    }
    /// Wakes `w` at the next round; returns the round it was registered in.
    fn register(&self, w: &Waker) -> u64 {
        let mut waiting = crate::sync::lock(&self.waiting);
        waiting.push(w.clone());
        self.round.load(Ordering::Relaxed)
    }
    /// Starts the next round: every splice registered during the last one is woken.
    pub fn tick(&self) {
        let woken = {
            let mut waiting = crate::sync::lock(&self.waiting);
            self.round.fetch_add(1, Ordering::Relaxed);
            std::mem::take(&mut *waiting)
        };
        for w in woken {
            w.wake();
        }
    }
    /// Ready once `rounds` rounds have started since round `since`; until then the task's waker is
    /// registered for the next round, at most once per round (`registered` remembers which).
    pub fn poll_rounds(
        &self,
        cx: &mut Context<'_>,
        since: u64,
        rounds: u64,
        registered: &mut Option<u64>,
    ) -> Poll<()> {
        let round = self.round();
        if round >= since + rounds {
            return Poll::Ready(());
        }
        if *registered != Some(round) {
            *registered = Some(self.register(cx.waker()));
        }
        Poll::Pending
    }
    /// Splices waiting for the next round.
    pub fn waiting(&self) -> usize {
        crate::sync::lock(&self.waiting).len()
    }
}

/// What the live phase of a splice ended with.
enum Step {
    End(End),
    /// Both sockets quiet for a sweep round: give the codec state back until a byte arrives.
    Park,
    /// A busy splice at a quiet moment: hand both raw sockets to the frame rewriter ([`busy`]).
    Busy,
}

/// Bytes moved in one codec phase before the splice, at its next quiet moment, takes the codecs
/// apart and moves its frames with the rewriter ([`busy`]). A leg's codec reads with the small
/// [`crate::leg::ws::READ_BUFFER`] (cheap while idle, and every parked splice gives its codecs
/// back); the busy phase's buffers live only while frames move.
pub const GROW_AFTER: u64 = 64 * 1024;

/// The codec read size after a busy phase handed a frame back (the codec then finishes what the
/// rewriter does not take, often a large frame, with a few large reads).
pub const LIVE_READ: usize = 16 * 1024;

/// `cfg` with the live read size.
fn live_config(cfg: &WebSocketConfig) -> WebSocketConfig {
    cfg.read_buffer_size(LIVE_READ)
}

/// What woke a parked splice.
enum Woke {
    /// The first bytes from that side (handed to its rebuilt codec).
    Bytes(Side, Vec<u8>),
    End(End),
}

/// Bytes a parked socket reads on wake-up, on the poll's stack (not kept in the splice).
const PARKED_READ: usize = crate::leg::ws::READ_BUFFER;

/// What only a live splice needs: both directions' queues, its timers and its sweep bookkeeping.
/// Boxed per live phase and freed when the splice parks (a parked splice has nothing queued, no
/// timer armed and is on no sweep list, so a fresh one is all the next live phase needs).
#[derive(Default)]
struct Live {
    up: Dir,   // phone → host
    down: Dir, // host → phone
    up_first: bool,
    timer: Option<Pin<Box<Sleep>>>,
    /// The (one, reused) timer for a trailing fold.
    fold_timer: Option<Pin<Box<Sleep>>>,
    /// (sweep round, frames moved) when the splice was last seen quiet with that frame count.
    quiet: Option<(u64, u64)>,
    /// The sweep round this splice's waker is registered for.
    registered: Option<u64>,
}

/// The splice's state that outlives the live/parked phases (about a hundred bytes, inline in its
/// task): the counts, what the meter has been given, and the kill switch's liveness.
struct Splice {
    up: Count,   // phone → host
    down: Count, // host → phone
    /// What the meter has been given (up, down), and when.
    folded: (Count, Count),
    folded_at: Instant,
    kill_live: bool,
    polls: u64,
    parks: u64,
    grows: u64,
    handovers: u64,
    /// Bytes moved when this codec phase began (see [`GROW_AFTER`]).
    phase_bytes: u64,
}

impl Splice {
    fn stats(&self) -> Stats {
        Stats {
            frames_to_host: self.up.frames,
            frames_to_phone: self.down.frames,
            bytes_to_host: self.up.bytes,
            bytes_to_phone: self.down.bytes,
            ..Stats::default()
        }
    }

    fn frames(&self) -> u64 {
        self.up.frames + self.down.frames
    }

    fn fold(&mut self, meter: &(dyn Fn(Stats) + Sync), now: Instant) {
        let (up, down) = self.folded;
        if (up, down) != (self.up, self.down) {
            meter(Stats {
                frames_to_host: self.up.frames - up.frames,
                frames_to_phone: self.down.frames - down.frames,
                bytes_to_host: self.up.bytes - up.bytes,
                bytes_to_phone: self.down.bytes - down.bytes,
                ..Stats::default()
            });
        }
        self.folded = (self.up, self.down);
        self.folded_at = now;
    }

    /// The start of every live or busy poll: count it, alternate which direction goes first (the
    /// runtime's cooperative budget is shared by both, and a fixed order lets a busy first
    /// direction starve the second), and check the kill switch (`Some` when it fired).
    fn begin_poll(
        &mut self,
        live: &mut Live,
        cx: &mut Context<'_>,
        kill: &mut oneshot::Receiver<(u16, &'static str)>,
    ) -> Option<End> {
        self.polls += 1;
        live.up_first = !live.up_first;
        self.killed(cx, kill)
    }

    /// The kill switch; `Some` when it fired.
    fn killed(
        &mut self,
        cx: &mut Context<'_>,
        kill: &mut oneshot::Receiver<(u16, &'static str)>,
    ) -> Option<End> {
        if self.kill_live {
            match Pin::new(kill).poll(cx) {
                Poll::Ready(Ok((code, r))) => return Some(End::Killed(code, r)),
                // Sender dropped without a verdict: nobody can kill us any more.
                Poll::Ready(Err(_)) => self.kill_live = false,
                Poll::Pending => {}
            }
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn poll_live<S>(
        &mut self,
        live: &mut Live,
        cx: &mut Context<'_>,
        phone: &mut WebSocketStream<S>,
        host: &mut WebSocketStream<S>,
        kill: &mut oneshot::Receiver<(u16, &'static str)>,
        limits: &Limits,
        budget: &Budget,
        sweep: &IdleSweep,
        meter: &(dyn Fn(Stats) + Sync),
    ) -> Poll<Step>
    where
        S: AsyncRead + AsyncWrite + Unpin + MessageBoundary + BusyHint,
    {
        if let Some(end) = self.begin_poll(live, cx, kill) {
            return Poll::Ready(Step::End(end));
        }
        for leg in 0..2 {
            let r = if (leg == 0) == live.up_first {
                live.up
                    .pump(&mut self.up, cx, phone, host, Side::Phone, limits, budget)
            } else {
                live.down
                    .pump(&mut self.down, cx, host, phone, Side::Host, limits, budget)
            };
            if let Poll::Ready(end) = r {
                return Poll::Ready(Step::End(end));
            }
        }
        let frames = self.frames();
        self.fold_now_and_then(live, cx, meter, frames);
        if let Some(step) = wedge_deadline(live, cx, limits) {
            return step;
        }
        // Quiet: both sources empty, everything flushed, and neither codec holds a partial
        // message (every byte read so far ended a message).
        let quiet = live.up.quiet
            && live.down.quiet
            && phone.get_ref().at_message_boundary()
            && host.get_ref().at_message_boundary();
        if !quiet {
            return Poll::Pending;
        }
        if self.up.bytes + self.down.bytes - self.phase_bytes >= GROW_AFTER {
            return Poll::Ready(Step::Busy);
        }
        if self.quiet_long_enough(live, cx, sweep, meter, frames) {
            return Poll::Ready(Step::Park);
        }
        Poll::Pending
    }

    /// At a quiet poll: true once the splice has seen no frame for two sweep rounds (its counts
    /// folded, ready to park); until then its waker waits on the next round.
    fn quiet_long_enough(
        &mut self,
        live: &mut Live,
        cx: &mut Context<'_>,
        sweep: &IdleSweep,
        meter: &(dyn Fn(Stats) + Sync),
        frames: u64,
    ) -> bool {
        let round = sweep.round();
        match live.quiet {
            Some((r, f)) if f == frames && round >= r + 2 => {
                self.fold(meter, Instant::now());
                return true;
            }
            Some((_, f)) if f == frames => {}
            _ => live.quiet = Some((round, frames)),
        }
        if live.registered != Some(round) {
            live.registered = Some(sweep.register(cx.waker()));
        }
        false
    }

    /// Folds the counts into the meter now and then (never per frame): at `FOLD_FRAMES` unfolded
    /// frames or `FOLD_INTERVAL` after the last fold; a burst then silence folds the rest when the
    /// interval is up (one lazily made timer).
    #[inline]
    fn fold_now_and_then(
        &mut self,
        live: &mut Live,
        cx: &mut Context<'_>,
        meter: &(dyn Fn(Stats) + Sync),
        frames: u64,
    ) {
        // Fold the counts into the meter now and then (never per frame).
        let unfolded = frames - (self.folded.0.frames + self.folded.1.frames);
        if unfolded > 0 {
            let now = Instant::now();
            if unfolded >= FOLD_FRAMES || now.duration_since(self.folded_at) >= FOLD_INTERVAL {
                self.fold(meter, now);
            } else {
                // A burst then silence: fold the rest when the interval is up.
                let at = self.folded_at + FOLD_INTERVAL;
                let t = live
                    .fold_timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                t.as_mut().reset(at);
                if t.as_mut().poll(cx).is_ready() {
                    cx.waker().wake_by_ref();
                }
            }
        }
    }

    /// While parked: the kill switch and one read on each raw socket.
    fn poll_parked<S>(
        &mut self,
        cx: &mut Context<'_>,
        phone: &mut S,
        host: &mut S,
        kill: &mut oneshot::Receiver<(u16, &'static str)>,
    ) -> Poll<Woke>
    where
        S: AsyncRead + Unpin,
    {
        self.polls += 1;
        if let Some(end) = self.killed(cx, kill) {
            return Poll::Ready(Woke::End(end));
        }
        for (side, io) in [(Side::Phone, &mut *phone), (Side::Host, &mut *host)] {
            let mut buf = [0u8; PARKED_READ];
            let mut rb = ReadBuf::new(&mut buf);
            match Pin::new(io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                    return Poll::Ready(Woke::Bytes(side, rb.filled().to_vec()))
                }
                Poll::Ready(_) => return Poll::Ready(Woke::End(End::Dropped(side))),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }
}

/// Takes a socket's codec apart: its boxed state is freed and the raw stream (without its
/// pre-auth budget) returned.
// Takes the box on purpose: consuming it is what frees its allocation.
#[allow(clippy::boxed_local)]
fn take_apart<S: MessageBoundary>(ws: Box<WebSocketStream<S>>) -> S {
    // Moving the stream out of the box consumes the box here, so its allocation is freed now
    // (moving out of `*ws` in place would keep it until the variable is reassigned).
    let ws: WebSocketStream<S> = *ws;
    let mut io = ws.into_inner();
    io.shed_preauth();
    io
}

/// Rebuilds a parked socket's codec (server role: the splice only runs on the relay's side),
/// starting from the bytes that woke it.
async fn unpark<S>(io: S, cfg: WebSocketConfig, part: Vec<u8>) -> Box<WebSocketStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    Box::new(WebSocketStream::from_partially_read(io, part, Role::Server, Some(cfg)).await)
}

/// What a busy phase left: the raw sockets to park, or codecs rebuilt after a hand-over (the
/// unread bytes given to them) or for the close.
enum AfterBusy<S> {
    Park(S, S),
    Codecs(Box<WebSocketStream<S>>, Box<WebSocketStream<S>>),
    End(End, Box<WebSocketStream<S>>, Box<WebSocketStream<S>>),
}

/// Runs a busy phase ([`busy`]) on the raw sockets and rebuilds the codecs it leaves to.
#[allow(clippy::too_many_arguments)]
async fn busy_phase<S>(
    sp: &mut Splice,
    mut p: S,
    mut h: S,
    cfgs: (&WebSocketConfig, &WebSocketConfig),
    kill: &mut oneshot::Receiver<(u16, &'static str)>,
    limits: &Limits,
    sweep: &IdleSweep,
    meter: &(dyn Fn(Stats) + Sync),
) -> AfterBusy<S>
where
    S: AsyncRead + AsyncWrite + Unpin + MessageBoundary + BusyHint,
{
    sp.grows += 1;
    match busy::run(sp, &mut p, &mut h, cfgs, kill, limits, sweep, meter).await {
        busy::Outcome::Park => AfterBusy::Park(p, h),
        busy::Outcome::Handover(pb, hb) => {
            sp.handovers += 1;
            sp.phase_bytes = sp.up.bytes + sp.down.bytes;
            let (pc, hc) = (live_config(cfgs.0), live_config(cfgs.1));
            AfterBusy::Codecs(unpark(p, pc, pb).await, unpark(h, hc, hb).await)
        }
        busy::Outcome::End(end) => AfterBusy::End(
            end,
            unpark(p, *cfgs.0, Vec::new()).await,
            unpark(h, *cfgs.1, Vec::new()).await,
        ),
    }
}

/// Runs the splice until it ends and hands both sockets back; closing them is the caller's (see
/// [`close_pair`]).
///
/// Idle parking: a splice quiet for a sweep round (see [`IdleSweep`]) gives its codec state back.
/// Both WebSocket codecs are taken apart into their raw streams (tungstenite's read buffer, out
/// buffer and waker proxies are freed, and so are the boxes holding them), and so is the live
/// phase's own state ([`Live`]); the splice waits for a byte on either stream or the kill switch,
/// then both codecs are rebuilt, the first bytes handed to the one that woke. Only done when
/// neither codec can hold a partial message ([`MessageBoundary`]), nothing is queued or unflushed,
/// and no pong is owed, so the rebuilt codecs are indistinguishable from the old ones on the wire.
/// While parked, the task holds the two raw streams, [`Splice`] and this function's arguments;
/// `cfgs` are the (phone, host) sockets' configurations, used to rebuild them.
#[allow(clippy::too_many_arguments)]
pub async fn run<S>(
    mut phone: Box<WebSocketStream<S>>,
    mut host: Box<WebSocketStream<S>>,
    cfgs: (&WebSocketConfig, &WebSocketConfig),
    kill: &mut oneshot::Receiver<(u16, &'static str)>,
    limits: &Limits,
    budget: &Budget,
    sweep: &IdleSweep,
    meter: &(dyn Fn(Stats) + Sync),
) -> (End, Stats, Box<WebSocketStream<S>>, Box<WebSocketStream<S>>)
where
    S: AsyncRead + AsyncWrite + Unpin + MessageBoundary + BusyHint,
{
    let mut sp = Splice {
        up: Count::default(),
        down: Count::default(),
        folded: Default::default(),
        folded_at: Instant::now(),
        kill_live: true,
        polls: 0,
        parks: 0,
        grows: 0,
        handovers: 0,
        phase_bytes: 0,
    };
    let end = loop {
        let mut live = Box::<Live>::default();
        let step = poll_fn(|cx| {
            sp.poll_live(
                &mut live, cx, &mut phone, &mut host, kill, limits, budget, sweep, meter,
            )
        })
        .await;
        live.up.release(budget);
        live.down.release(budget);
        drop(live);
        if let Step::End(end) = step {
            break end;
        }
        let (mut p, mut h) = (take_apart(phone), take_apart(host));
        if let Step::Busy = step {
            let after = Box::pin(busy_phase(&mut sp, p, h, cfgs, kill, limits, sweep, meter));
            match after.await {
                AfterBusy::Park(pp, hh) => (p, h) = (pp, hh),
                AfterBusy::Codecs(pw, hw) => {
                    (phone, host) = (pw, hw);
                    continue;
                }
                AfterBusy::End(end, pw, hw) => {
                    (phone, host) = (pw, hw);
                    break end;
                }
            }
        }
        sp.phase_bytes = sp.up.bytes + sp.down.bytes;
        sp.parks += 1;
        let woke = poll_fn(|cx| sp.poll_parked(cx, &mut p, &mut h, kill)).await;
        let (pb, hb, end) = match woke {
            Woke::Bytes(Side::Phone, b) => (b, Vec::new(), None),
            Woke::Bytes(Side::Host, b) => (Vec::new(), b, None),
            Woke::End(e) => (Vec::new(), Vec::new(), Some(e)),
        };
        // Boxed: the rebuild's futures are not part of the parked task's resident state.
        (phone, host) =
            Box::pin(async move { (unpark(p, *cfgs.0, pb).await, unpark(h, *cfgs.1, hb).await) })
                .await;
        if let Some(end) = end {
            break end;
        }
    };
    sp.fold(meter, Instant::now());
    let mut total = sp.stats();
    total.polls = sp.polls;
    total.parks = sp.parks;
    total.grows = sp.grows;
    total.handovers = sp.handovers;
    (end, total, phone, host)
}

use std::future::Future;

/// Closes both sockets with the end's codes, concurrently, each with the 1 s force-terminate.
pub async fn close_pair<S>(phone: &mut WebSocketStream<S>, host: &mut WebSocketStream<S>, end: &End)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let ((pc, pr), (hc, hr)) = end.closes();
    tokio::join!(
        crate::leg::ws::close(phone, pc, pr),
        crate::leg::ws::close(host, hc, hr)
    );
}

/// The wedge deadline, checked only while something overflows: `Some(Ready(Wedged))` once it has
/// passed, `Some(Pending)` while it runs (its timer registered), `None` with nothing in overflow.
#[inline]
fn wedge_deadline(live: &mut Live, cx: &mut Context<'_>, limits: &Limits) -> Option<Poll<Step>> {
    // The wedge deadline, only while something overflows. No periodic re-check: every path
    // that leaves overflow queued ends on a `Pending` from the target writer, which registered
    // this task's waker, so room in the writer wakes the splice by itself.
    let since = match (live.up.overflow_since, live.down.overflow_since) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if let Some(since) = since {
        let deadline = since + limits.wedge;
        if Instant::now() >= deadline {
            return Some(Poll::Ready(Step::End(End::Wedged)));
        }
        let t = live
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if t.deadline() != deadline {
            t.as_mut().reset(deadline);
        }
        if t.as_mut().poll(cx).is_ready() {
            return Some(Poll::Ready(Step::End(End::Wedged)));
        }
        return Some(Poll::Pending);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leg::preauth_io::PreAuthIo;
    use futures_util::{SinkExt, StreamExt};
    use std::sync::Arc;
    use tokio::io::DuplexStream;

    /// The relay's end of a leg (through the pre-auth wrapper, lifted, as in the cell).
    type R = WebSocketStream<PreAuthIo<DuplexStream>>;
    /// The client's end.
    type W = WebSocketStream<DuplexStream>;

    /// The relay side's socket configuration in these tests (1 MiB messages).
    static CFG: std::sync::LazyLock<WebSocketConfig> = std::sync::LazyLock::new(|| config(1 << 20));

    fn config(max: usize) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(4096)
            .write_buffer_size(32 * 1024)
            .max_message_size(Some(max))
            .max_frame_size(Some(max))
    }

    async fn pair(buf: usize, max: usize) -> (Box<R>, W) {
        let (a, b) = tokio::io::duplex(buf);
        let cfg = config(max);
        let io = PreAuthIo::new(a);
        io.lift();
        let server = WebSocketStream::from_raw_socket(io, Role::Server, Some(cfg)).await;
        let client = WebSocketStream::from_raw_socket(b, Role::Client, Some(cfg)).await;
        (Box::new(server), client)
    }

    struct Rig {
        phone: W,
        host: W,
        task: tokio::task::JoinHandle<(End, Stats)>,
        kill: Option<oneshot::Sender<(u16, &'static str)>>,
    }

    /// A splice between two client sockets; `sweep` rounds are ticked by the test.
    async fn rig_swept(
        buf: usize,
        limits: Limits,
        budget: Arc<Budget>,
        sweep: Arc<IdleSweep>,
    ) -> Rig {
        let (sp, phone) = pair(buf, 1 << 20).await;
        let (sh, host) = pair(buf, 1 << 20).await;
        let (tx, mut rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let (end, stats, mut sp, mut sh) = run(
                sp,
                sh,
                (&CFG, &CFG),
                &mut rx,
                &limits,
                &budget,
                &sweep,
                &|_| {},
            )
            .await;
            close_pair(&mut sp, &mut sh, &end).await;
            (end, stats)
        });
        Rig {
            phone,
            host,
            task,
            kill: Some(tx),
        }
    }

    /// A splice whose sweep never ticks (it never parks).
    async fn rig(buf: usize, limits: Limits, budget: Arc<Budget>) -> Rig {
        rig_swept(buf, limits, budget, Default::default()).await
    }

    /// The close code and reason `ws` receives next (panics on anything else).
    async fn close_of(ws: &mut W) -> (u16, String) {
        match ws.next().await.unwrap().unwrap() {
            Message::Close(Some(f)) => (u16::from(f.code), f.reason.to_string()),
            other => panic!("{other:?}"),
        }
    }

    /// A live splice hands its counts to the meter while it runs (a trailing fold after a burst
    /// then silence, within the fold interval), and the meter's sum equals the final totals.
    #[tokio::test]
    async fn counts_fold_into_the_meter_while_the_splice_lives() {
        use std::sync::Mutex;
        let (sp, mut phone) = pair(64 * 1024, 1 << 20).await;
        let (sh, mut host) = pair(64 * 1024, 1 << 20).await;
        let (tx, mut rx) = oneshot::channel::<(u16, &'static str)>();
        let seen = std::sync::Arc::new(Mutex::new(Stats::default()));
        let s2 = seen.clone();
        let task = tokio::spawn(async move {
            let meter = move |d: Stats| {
                let mut s = crate::sync::lock(&s2);
                s.frames_to_host += d.frames_to_host;
                s.frames_to_phone += d.frames_to_phone;
                s.bytes_to_host += d.bytes_to_host;
                s.bytes_to_phone += d.bytes_to_phone;
            };
            let b = Budget::default();
            let sweep = IdleSweep::default();
            let (end, stats, _, _) = run(
                sp,
                sh,
                (&CFG, &CFG),
                &mut rx,
                &Limits::default(),
                &b,
                &sweep,
                &meter,
            )
            .await;
            (end, stats)
        });
        for _ in 0..3 {
            phone.send(Message::text("abcd")).await.unwrap();
            host.next().await.unwrap().unwrap();
        }
        host.send(Message::binary(vec![1u8; 10])).await.unwrap();
        phone.next().await.unwrap().unwrap();
        // Silence now: the trailing fold lands within the interval (plus scheduling slack).
        let deadline = Instant::now() + FOLD_INTERVAL * 10;
        loop {
            let s = *crate::sync::lock(&seen);
            if s.frames_to_host == 3 && s.frames_to_phone == 1 {
                assert_eq!((s.bytes_to_host, s.bytes_to_phone), (12, 10));
                break;
            }
            assert!(Instant::now() < deadline, "no live fold: {s:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tx.send((4503, "relay draining")).unwrap();
        let (_, mut total) = task.await.unwrap();
        total.polls = 0;
        assert_eq!(total, *crate::sync::lock(&seen));
    }

    #[tokio::test]
    async fn forwards_in_order_preserving_opcode() {
        let mut r = rig(64 * 1024, Limits::default(), Default::default()).await;
        r.phone.send(Message::text("hi")).await.unwrap();
        assert_eq!(r.host.next().await.unwrap().unwrap(), Message::text("hi"));
        r.host
            .send(Message::binary(vec![0u8, 0xff, 0x10]))
            .await
            .unwrap();
        assert_eq!(
            r.phone.next().await.unwrap().unwrap(),
            Message::binary(vec![0u8, 0xff, 0x10])
        );
        for i in 0..100u32 {
            let m = if i % 2 == 0 {
                Message::text(format!("t{i}"))
            } else {
                Message::binary(i.to_be_bytes().to_vec())
            };
            r.phone.feed(m.clone()).await.unwrap();
            r.host.feed(m).await.unwrap();
        }
        r.phone.flush().await.unwrap();
        r.host.flush().await.unwrap();
        for i in 0..100u32 {
            let want = if i % 2 == 0 {
                Message::text(format!("t{i}"))
            } else {
                Message::binary(i.to_be_bytes().to_vec())
            };
            assert_eq!(r.host.next().await.unwrap().unwrap(), want);
            assert_eq!(r.phone.next().await.unwrap().unwrap(), want);
        }
        r.phone.close(None).await.unwrap();
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Dropped(Side::Phone));
        assert_eq!(stats.frames_to_host, 101);
        assert_eq!(stats.frames_to_phone, 101);
        assert_eq!(
            close_of(&mut r.host).await,
            (4408, "peer connection dropped".into())
        );
    }

    #[tokio::test]
    async fn kill_closes_both_with_code() {
        let mut r = rig(64 * 1024, Limits::default(), Default::default()).await;
        r.kill
            .take()
            .unwrap()
            .send((4503, "relay draining"))
            .unwrap();
        for ws in [&mut r.phone, &mut r.host] {
            assert_eq!(close_of(ws).await, (4503, "relay draining".into()));
        }
        assert_eq!(r.task.await.unwrap().0, End::Killed(4503, "relay draining"));
    }

    #[tokio::test]
    async fn oversize_side_gets_1009_other_4408() {
        let mut r = rig(64 * 1024, Limits::default(), Default::default()).await;
        // The relay may cut the sender off mid-message: the write error is expected.
        let _ = r
            .phone
            .send(Message::binary(vec![1u8; (1 << 20) + 1]))
            .await;
        assert_eq!(close_of(&mut r.host).await.0, 4408);
        assert_eq!(r.task.await.unwrap().0, End::Oversize(Side::Phone));
    }

    /// A splice whose phone never reads while its host sends 64 KiB messages as fast as the relay
    /// takes them: the set-up of both wedge tests. Returns the phone (kept so it stays open), the
    /// splice task and the sender task.
    async fn stalled_reader(
        wedge: Duration,
        budget: Arc<Budget>,
    ) -> (
        W,
        tokio::task::JoinHandle<(End, Stats)>,
        tokio::task::JoinHandle<W>,
    ) {
        let limits = Limits {
            wedge,
            ..Limits::default()
        };
        let Rig {
            phone,
            mut host,
            task,
            kill,
        } = rig(16 * 1024, limits, budget).await;
        let sender = tokio::spawn(async move {
            let _kill = kill;
            let chunk = vec![7u8; 64 * 1024];
            for _ in 0..1024 {
                if host.send(Message::binary(chunk.clone())).await.is_err() {
                    break;
                }
            }
            host
        });
        (phone, task, sender)
    }

    /// A phone that stops reading: overflow stays bounded (one message), the source is not read,
    /// and the wedge timer closes both 4429.
    #[tokio::test]
    async fn stalled_reader_is_bounded_then_wedged() {
        let budget = Arc::new(Budget::default());
        let (phone, task, sender) =
            stalled_reader(Duration::from_millis(1_500), budget.clone()).await;
        // Let it saturate: the overflow holds at most one message.
        let started = std::time::Instant::now();
        while !task.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(budget.used() <= 64 * 1024, "overflow {}", budget.used());
        }
        let (end, stats) = task.await.unwrap();
        assert_eq!(end, End::Wedged);
        assert!(started.elapsed() < Duration::from_millis(4_000));
        assert!(stats.bytes_to_phone < 2 * 1024 * 1024);
        assert_eq!(budget.used(), 0);
        drop(phone);
        sender.abort();
    }

    /// While a stalled reader keeps one direction overflowing, the splice sleeps until the wedge
    /// deadline: no periodic wake-ups (a 25 ms re-check would poll it ~400 times in 10 s).
    #[tokio::test(start_paused = true)]
    async fn overflowing_splice_sleeps_until_the_wedge_deadline() {
        let (phone, task, sender) =
            stalled_reader(Duration::from_secs(10), Default::default()).await;
        let started = Instant::now();
        let (end, stats) = task.await.unwrap();
        assert_eq!(end, End::Wedged);
        assert!(started.elapsed() >= Duration::from_secs(10));
        assert!(stats.polls < 100, "{} wake-ups", stats.polls);
        drop(phone);
        sender.abort();
    }

    /// Ticks `sweep` until the splice has been quiet for two rounds (it parks on the second).
    async fn park(sweep: &IdleSweep) {
        for _ in 0..3 {
            // Let the splice reach its quiet poll and register before each round.
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
            sweep.tick();
        }
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    /// A quiet splice parks (its waker leaves the sweep list) and wakes on a frame from either
    /// side, forwarding it and later frames in order; a fragmented message with a ping between
    /// its fragments survives parking on both sides of the ping.
    #[tokio::test]
    async fn quiet_splice_parks_and_wakes_on_either_side() {
        let sweep = Arc::new(IdleSweep::default());
        let mut r = rig_swept(
            64 * 1024,
            Limits::default(),
            Default::default(),
            sweep.clone(),
        )
        .await;
        r.phone.send(Message::text("before")).await.unwrap();
        assert_eq!(
            r.host.next().await.unwrap().unwrap(),
            Message::text("before")
        );
        park(&sweep).await;
        assert_eq!(sweep.waiting(), 0, "a parked splice is on no list");
        r.phone.send(Message::text("up")).await.unwrap();
        assert_eq!(r.host.next().await.unwrap().unwrap(), Message::text("up"));
        park(&sweep).await;
        r.host.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
        assert_eq!(
            r.phone.next().await.unwrap().unwrap(),
            Message::binary(vec![1u8, 2, 3])
        );
        park(&sweep).await;
        // A ping while parked is answered by the rebuilt codec.
        r.phone.send(Message::Ping(vec![9u8].into())).await.unwrap();
        assert_eq!(
            r.phone.next().await.unwrap().unwrap(),
            Message::Pong(vec![9u8].into())
        );
        park(&sweep).await;
        // Raw fragments: first fragment, then a sweep round, then a ping and the final fragment.
        // The half-open message keeps the splice live (never parked mid-message).
        use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
        use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};
        let frag = |fin: bool, op: OpCode, payload: &'static [u8]| {
            let header = FrameHeader {
                is_final: fin,
                opcode: op,
                ..FrameHeader::default()
            };
            Message::Frame(Frame::from_payload(header, payload.into()))
        };
        r.phone
            .send(frag(false, OpCode::Data(Data::Text), b"frag"))
            .await
            .unwrap();
        park(&sweep).await;
        r.phone.send(Message::Ping(vec![].into())).await.unwrap();
        r.phone
            .send(frag(true, OpCode::Data(Data::Continue), b"mented"))
            .await
            .unwrap();
        assert_eq!(
            r.host.next().await.unwrap().unwrap(),
            Message::text("fragmented")
        );
        r.host.close(None).await.unwrap();
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Dropped(Side::Host));
        assert!(stats.parks >= 4, "{stats:?}");
        assert_eq!((stats.frames_to_host, stats.frames_to_phone), (3, 1));
    }

    /// A parked splice still ends on the kill switch (both get the code) and on a peer's EOF (the
    /// other side gets 4408).
    #[tokio::test]
    async fn parked_splice_ends_on_kill_and_on_eof() {
        let sweep = Arc::new(IdleSweep::default());
        let mut r = rig_swept(
            64 * 1024,
            Limits::default(),
            Default::default(),
            sweep.clone(),
        )
        .await;
        park(&sweep).await;
        r.kill
            .take()
            .unwrap()
            .send((4503, "relay draining"))
            .unwrap();
        for ws in [&mut r.phone, &mut r.host] {
            assert_eq!(close_of(ws).await.0, 4503);
        }
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Killed(4503, "relay draining"));
        assert_eq!(stats.parks, 1);

        let r = rig_swept(
            64 * 1024,
            Limits::default(),
            Default::default(),
            sweep.clone(),
        )
        .await;
        park(&sweep).await;
        let Rig {
            phone,
            mut host,
            task,
            kill: _kill,
        } = r;
        drop(phone);
        assert_eq!(close_of(&mut host).await.0, 4408);
        assert_eq!(task.await.unwrap().0, End::Dropped(Side::Phone));
    }

    /// Traffic in every round keeps a splice live: it never parks while frames move.
    #[tokio::test]
    async fn busy_splice_never_parks() {
        let sweep = Arc::new(IdleSweep::default());
        let mut r = rig_swept(
            64 * 1024,
            Limits::default(),
            Default::default(),
            sweep.clone(),
        )
        .await;
        for i in 0..20u32 {
            r.phone
                .send(Message::binary(i.to_be_bytes().to_vec()))
                .await
                .unwrap();
            r.host.next().await.unwrap().unwrap();
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            sweep.tick();
        }
        r.phone.close(None).await.unwrap();
        let (_, stats) = r.task.await.unwrap();
        assert_eq!(stats.parks, 0);
    }

    /// A busy splice moves its frames to the rewriter at a quiet moment and loses nothing: frames
    /// of every size arrive whole and in order, including those the rewriter hands back to a codec
    /// (40 KiB and 200 KiB are over its buffer); a small exchange alone never leaves the codecs.
    #[tokio::test]
    async fn busy_splice_moves_to_the_rewriter_and_loses_nothing() {
        let mut r = rig(64 * 1024, Limits::default(), Default::default()).await;
        r.phone.send(Message::text("small")).await.unwrap();
        assert_eq!(
            r.host.next().await.unwrap().unwrap(),
            Message::text("small")
        );
        let sizes = [
            16 * 1024,
            64,
            40 * 1024,
            16 * 1024 + 1,
            3,
            200 * 1024,
            70,
            0,
        ];
        for round in 0..3u8 {
            for (i, n) in sizes.iter().enumerate() {
                let m = Message::binary(vec![round ^ i as u8; *n]);
                r.phone.send(m.clone()).await.unwrap();
                assert_eq!(r.host.next().await.unwrap().unwrap(), m);
                let t = Message::text("é".repeat(*n / 2));
                r.host.send(t.clone()).await.unwrap();
                assert_eq!(r.phone.next().await.unwrap().unwrap(), t);
            }
        }
        r.phone.close(None).await.unwrap();
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Dropped(Side::Phone));
        assert!(stats.grows >= 1, "{stats:?}");
        assert!(stats.handovers >= 1, "{stats:?}");
        assert_eq!(stats.frames_to_host, 1 + 3 * sizes.len() as u64);
        assert_eq!(stats.frames_to_phone, 3 * sizes.len() as u64);

        let mut r = rig(64 * 1024, Limits::default(), Default::default()).await;
        for _ in 0..10 {
            r.phone
                .send(Message::binary(vec![7u8; 1024]))
                .await
                .unwrap();
            r.host.next().await.unwrap().unwrap();
        }
        r.phone.close(None).await.unwrap();
        let (_, stats) = r.task.await.unwrap();
        assert_eq!(stats.grows, 0, "{stats:?}");
    }

    /// Moves 128 KiB each way in 1 KiB frames, one at a time, so the splice sees quiet moments
    /// after [`GROW_AFTER`] bytes and moves to the rewriter.
    async fn make_busy(r: &mut Rig) {
        for i in 0..128u32 {
            let m = Message::binary(vec![i as u8; 1024]);
            r.phone.send(m.clone()).await.unwrap();
            assert_eq!(r.host.next().await.unwrap().unwrap(), m);
            r.host.send(m.clone()).await.unwrap();
            assert_eq!(r.phone.next().await.unwrap().unwrap(), m);
        }
    }

    /// Many small frames sent at once in both directions arrive in order, and the busy phase's
    /// counts equal what was sent.
    #[tokio::test]
    async fn busy_phase_moves_bursts_of_small_frames_in_order() {
        let mut r = rig(256 * 1024, Limits::default(), Default::default()).await;
        make_busy(&mut r).await;
        let n = 5_000u32;
        let (mut phone, mut host) = (r.phone, r.host);
        // Every third frame is text.
        let msg = |i: u32| {
            if i % 3 == 0 {
                Message::text(format!("t{i}"))
            } else {
                Message::binary(i.to_be_bytes().to_vec())
            }
        };
        let up = tokio::spawn(async move {
            for i in 0..n {
                phone.feed(msg(i)).await.unwrap();
            }
            phone.flush().await.unwrap();
            phone
        });
        for i in 0..n {
            assert_eq!(host.next().await.unwrap().unwrap(), msg(i), "frame {i}");
        }
        let mut phone = up.await.unwrap();
        for i in 0..n {
            host.feed(Message::binary(vec![i as u8; 64])).await.unwrap();
        }
        host.flush().await.unwrap();
        for i in 0..n {
            assert_eq!(
                phone.next().await.unwrap().unwrap(),
                Message::binary(vec![i as u8; 64])
            );
        }
        host.close(None).await.unwrap();
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Dropped(Side::Host));
        assert!(stats.grows >= 1, "{stats:?}");
        assert_eq!(stats.frames_to_host, 128 + n as u64);
        assert_eq!(stats.frames_to_phone, 128 + n as u64);
        assert_eq!(stats.bytes_to_phone, 128 * 1024 + 64 * n as u64);
    }

    /// In the busy phase a ping is answered (by the codec it is handed to), a fragmented message
    /// arrives whole, an invalid text frame ends the splice as a protocol error, and an oversized
    /// frame gets 1009 / 4408, exactly as in the codec phase.
    #[tokio::test]
    async fn busy_phase_hands_what_it_does_not_take_to_the_codec() {
        use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
        use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};
        let frag = |fin: bool, op: OpCode, payload: &'static [u8]| {
            let header = FrameHeader {
                is_final: fin,
                opcode: op,
                ..FrameHeader::default()
            };
            Message::Frame(Frame::from_payload(header, payload.into()))
        };
        let mut r = rig(256 * 1024, Limits::default(), Default::default()).await;
        make_busy(&mut r).await;
        r.phone.send(Message::Ping(vec![5u8].into())).await.unwrap();
        assert_eq!(
            r.phone.next().await.unwrap().unwrap(),
            Message::Pong(vec![5u8].into())
        );
        make_busy(&mut r).await;
        r.phone
            .send(frag(false, OpCode::Data(Data::Binary), b"ab"))
            .await
            .unwrap();
        r.phone
            .send(frag(true, OpCode::Data(Data::Continue), b"cd"))
            .await
            .unwrap();
        assert_eq!(
            r.host.next().await.unwrap().unwrap(),
            Message::binary(b"abcd".to_vec())
        );
        make_busy(&mut r).await;
        // A frame over the leg's 1 MiB limit: 1009 to the phone, 4408 to the host.
        let _ = r
            .phone
            .send(Message::binary(vec![1u8; (1 << 20) + 1]))
            .await;
        assert_eq!(close_of(&mut r.host).await.0, 4408);
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Oversize(Side::Phone));
        assert!(stats.grows >= 3 && stats.handovers >= 3, "{stats:?}");

        // Invalid UTF-8 in a text frame: the codec's protocol error, the host gets 4408.
        let mut r = rig(256 * 1024, Limits::default(), Default::default()).await;
        make_busy(&mut r).await;
        let header = FrameHeader {
            opcode: OpCode::Data(Data::Text),
            ..FrameHeader::default()
        };
        let bad = Message::Frame(Frame::from_payload(header, vec![0xffu8, 0xfe].into()));
        let _ = r.phone.send(bad).await;
        assert_eq!(close_of(&mut r.host).await.0, 4408);
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Dropped(Side::Phone));
        assert!(stats.handovers >= 1, "{stats:?}");
    }

    /// The busy phase ends like the codec phase: on the kill switch (frames sent before it still
    /// arrive, then the close code) and on a peer's close (the other side gets 4408).
    #[tokio::test]
    async fn busy_phase_ends_on_kill_and_on_close() {
        let mut r = rig(256 * 1024, Limits::default(), Default::default()).await;
        make_busy(&mut r).await;
        for i in 0..100u32 {
            r.host
                .feed(Message::binary(i.to_be_bytes().to_vec()))
                .await
                .unwrap();
        }
        r.host.flush().await.unwrap();
        for i in 0..100u32 {
            assert_eq!(
                r.phone.next().await.unwrap().unwrap(),
                Message::binary(i.to_be_bytes().to_vec())
            );
        }
        r.kill
            .take()
            .unwrap()
            .send((4503, "relay draining"))
            .unwrap();
        assert_eq!(close_of(&mut r.phone).await.0, 4503);
        assert_eq!(close_of(&mut r.host).await.0, 4503);
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Killed(4503, "relay draining"));
        assert!(stats.grows >= 1, "{stats:?}");

        let mut r = rig(256 * 1024, Limits::default(), Default::default()).await;
        make_busy(&mut r).await;
        r.phone.close(None).await.unwrap();
        assert_eq!(close_of(&mut r.host).await.0, 4408);
        let (end, stats) = r.task.await.unwrap();
        assert_eq!(end, End::Dropped(Side::Phone));
        assert!(stats.grows >= 1, "{stats:?}");
    }

    /// A phone that stops reading during the busy phase: the host's frames stop being read once
    /// the phone's unwritten output passes the high-water mark, and the wedge timer closes both
    /// 4429.
    #[tokio::test]
    async fn busy_phase_stalled_reader_is_bounded_then_wedged() {
        let limits = Limits {
            wedge: Duration::from_millis(1_500),
            ..Limits::default()
        };
        let mut r = rig(16 * 1024, limits, Default::default()).await;
        make_busy(&mut r).await;
        let Rig {
            phone,
            mut host,
            task,
            kill,
        } = r;
        let sender = tokio::spawn(async move {
            let _kill = kill;
            let chunk = vec![7u8; 16 * 1024];
            for _ in 0..4096 {
                if host.send(Message::binary(chunk.clone())).await.is_err() {
                    break;
                }
            }
            host
        });
        let started = std::time::Instant::now();
        let (end, stats) = task.await.unwrap();
        assert_eq!(end, End::Wedged);
        assert!(started.elapsed() < Duration::from_millis(4_000));
        assert!(stats.grows >= 1, "{stats:?}");
        // Forwarded to the stalled phone: its pipe, the high-water mark and one read's worth.
        assert!(
            stats.bytes_to_phone < 128 * 1024 + 2 * 1024 * 1024,
            "{stats:?}"
        );
        drop(phone);
        sender.abort();
    }

    /// A quiet busy splice parks like a codec-phase one, and wakes to forward the next frame.
    #[tokio::test]
    async fn busy_phase_parks_when_quiet() {
        let sweep = Arc::new(IdleSweep::default());
        let mut r = rig_swept(
            256 * 1024,
            Limits::default(),
            Default::default(),
            sweep.clone(),
        )
        .await;
        make_busy(&mut r).await;
        park(&sweep).await;
        assert_eq!(sweep.waiting(), 0, "a parked splice is on no list");
        r.phone.send(Message::text("after")).await.unwrap();
        assert_eq!(
            r.host.next().await.unwrap().unwrap(),
            Message::text("after")
        );
        r.host.close(None).await.unwrap();
        let (_, stats) = r.task.await.unwrap();
        assert!(stats.grows >= 1 && stats.parks >= 1, "{stats:?}");
    }

    /// An idle splice's resident state is its task's future, and `run` is most of it: its
    /// parked phase holds the two raw streams and the small [`Splice`]; the live phase's state is
    /// boxed and the codecs are boxed by the caller. Sizes printed for the breakdown in docs/benchmarks.md.
    #[tokio::test]
    async fn run_future_stays_small() {
        let (sp, _phone) = pair(1024, 1024).await;
        let (sh, _host) = pair(1024, 1024).await;
        let (_tx, mut rx) = oneshot::channel::<(u16, &'static str)>();
        let (b, sweep, limits) = (Budget::default(), IdleSweep::default(), Limits::default());
        let fut = run(sp, sh, (&CFG, &CFG), &mut rx, &limits, &b, &sweep, &|_| {});
        let size = std::mem::size_of_val(&fut);
        let io = std::mem::size_of::<PreAuthIo<DuplexStream>>();
        eprintln!(
            "splice::run future {size} B (socket io {io} B, Splice {} B, Live {} B boxed)",
            std::mem::size_of::<Splice>(),
            std::mem::size_of::<Live>()
        );
        assert!(size <= 640, "splice::run future is {size} B");
        drop(fut);
    }

    /// A charger that is refused must not make a concurrent charger fail whose real total stays
    /// under the max (add-then-undo showed the refused amount to the others for a moment).
    #[test]
    fn refused_charge_never_refuses_a_concurrent_one() {
        let budget = std::sync::Arc::new(Budget::new(10));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let greedy = {
            let (budget, stop) = (budget.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    assert!(!budget.charge(11));
                }
            })
        };
        for _ in 0..200_000 {
            assert!(budget.charge(5), "5 of 10 refused");
            budget.refund(5);
        }
        stop.store(true, Ordering::Relaxed);
        greedy.join().unwrap();
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn process_budget_limit_closes_4429() {
        // A budget smaller than one message: the first overflow hits the process limit.
        let budget = std::sync::Arc::new(Budget::new(1000));
        let r = rig(4 * 1024, Limits::default(), budget.clone()).await;
        let Rig {
            phone: _phone,
            mut host,
            task,
            kill: _kill,
        } = r;
        tokio::spawn(async move {
            for _ in 0..200 {
                if host
                    .send(Message::binary(vec![1u8; 64 * 1024]))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        assert_eq!(task.await.unwrap().0, End::QueueLimit);
        assert_eq!(budget.used(), 0);
    }
}
