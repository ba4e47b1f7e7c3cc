//! An accepted TLS connection that holds no buffer while it is quiet, and after a TLS 1.3
//! handshake no rustls state either.
//!
//! rustls' buffered connection (and tokio-rustls over it) keeps a 4 KiB receive buffer per
//! connection for as long as the connection lives. [`TlsIo`] drives rustls' unbuffered connection
//! instead: the ciphertext read, the plaintext not yet handed to the reader and the ciphertext not
//! yet written are this type's own vectors. A busy connection keeps them (a buffer per socket read
//! or write would be an allocation, and for the write side a zero-fill, per record); they are
//! freed together once a read finds the socket drained with nothing left in them. Decrypted
//! records go straight into the reader's buffer when it has room. The handshake (versions, suites,
//! certificate, ALPN, tickets) is rustls' own, configured by the same `ServerConfig` as before.
//!
//! Once a TLS 1.3 handshake is done the rustls connection is dropped (its record layer, key
//! schedule and handshake leftovers were most of an idle connection's cost) and the records are
//! sealed and opened by [`Keys13`] (`super::record`), in place in the same vectors; ring's keys
//! are dropped with the buffers, so a quiet TLS 1.3 connection holds the socket, two traffic
//! secrets with their keys and IVs, and on the heap only the ALPN name. This needs the config prepared by
//! [`record::enable`](super::record::enable); without it, and for TLS 1.2, rustls keeps the
//! connection throughout.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, UnbufferedStatus, WriteTraffic,
};
use rustls::{AlertDescription, ProtocolVersion, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::record::{Caught, Keys13, Opened};

/// Spare room made for a socket read (the least a read in busy mode offers): two full TLS records
/// (16 KiB of payload plus overhead each), so a stream of full records is not read a part-record
/// at a time.
const READ_CHUNK: usize = 32 * 1024;
/// Spare room made for a socket read in [busy mode](TlsIo::set_busy): eight full records, so a
/// splice moving large frames reads about as much per system call as it does on plain TCP.
const BUSY_READ_CHUNK: usize = 8 * (16 * 1024 + 256);
/// Ciphertext held waiting for the rest of a message; rustls refuses larger handshake messages
/// (64 KiB) and records (18 KiB) itself, this only bounds the buffer whatever the peer sends.
const INCOMING_MAX: usize = 80 * 1024;
/// Plaintext encrypted per `poll_write` (four full records), so the ciphertext queue is bounded.
const WRITE_CHUNK: usize = 64 * 1024;
/// Ciphertext added per record (header, content type, tag, TLS 1.2 explicit nonce), with room.
const RECORD_OVERHEAD: usize = 64;
/// Ciphertext owed to the peer (KeyUpdate answers) past which reads wait for the socket to take
/// it, so a peer that sends and never reads cannot grow `out` without bound.
const OUT_BACKLOG: usize = 64 * 1024;

/// Who seals and opens the records. The TLS 1.3 keys are inline on purpose: they are what every
/// quiet connection keeps, and a box would add an allocation (and its header) to each.
#[allow(clippy::large_enum_variant)]
enum Engine {
    /// The handshake, and a TLS 1.2 connection (or one without secret extraction) throughout.
    Rustls(Box<UnbufferedServerConnection>),
    /// A TLS 1.3 connection after its handshake (module docs).
    Tls13(Keys13),
    /// A fatal error was met (its alert sent): every later read or write fails.
    Broken,
}

/// A server-side TLS stream over an accepted TCP connection (see the module docs).
pub struct TlsIo {
    tcp: TcpStream,
    engine: Engine,
    /// The ALPN protocol agreed (kept when rustls' connection is dropped).
    alpn: Option<Box<[u8]>>,
    /// Ciphertext read from the socket, not yet processed: `incoming[in_at..]`. Processed
    /// records are skipped by moving `in_at`; the partial record after them is moved to the
    /// front only when a read needs the room (not after every record).
    incoming: Vec<u8>,
    in_at: usize,
    /// Plaintext processed but not yet read, from `plain_at`.
    plain: Vec<u8>,
    plain_at: usize,
    /// Ciphertext to write is `out[out_at..out_end]`. The whole vector stays initialised (rustls
    /// encrypts into a `&mut [u8]`), so reusing it costs no zero-fill; only growth is zeroed.
    out: Vec<u8>,
    out_at: usize,
    out_end: usize,
    /// The peer's close_notify was processed: end of stream once `plain` is read.
    peer_closed: bool,
    /// The socket reached EOF without a close_notify (a truncation: read as an error).
    truncated: bool,
    close_sent: bool,
    /// [Busy mode](TlsIo::set_busy): buffers kept when the socket drains, larger reads.
    busy: bool,
}

/// What one [`TlsIo::drive`] asks of rustls once the records received are processed.
#[derive(Clone, Copy)]
enum Act<'a> {
    Nothing,
    Write(&'a [u8]),
    Close,
}

/// Where [`TlsIo::drive`] stopped.
#[derive(Debug, PartialEq, Eq)]
enum Driven {
    /// The handshake needs more bytes from the peer.
    NeedInput,
    /// Application data may be written; the count of `Act::Write` bytes taken.
    Open(usize),
    /// Both close_notify alerts have been exchanged.
    Closed,
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn broken() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "tls: the connection failed earlier",
    )
}

/// Appends what `f` writes to `out` at `*end`, growing the initialised area to the size `f` asks
/// for when the room after `*end` is short of `guess` (or of what `f` then requires). Bytes past
/// `*end` are stale and overwritten, never zeroed again.
fn append<E>(
    out: &mut Vec<u8>,
    end: &mut usize,
    guess: usize,
    mut f: impl FnMut(&mut [u8]) -> Result<usize, E>,
    required: impl Fn(&E) -> Option<usize>,
) -> Result<(), E> {
    let start = *end;
    let mut size = guess;
    loop {
        if out.len() < start + size {
            out.resize(start + size, 0);
        }
        match f(&mut out[start..]) {
            Ok(n) => {
                *end = start + n;
                return Ok(());
            }
            Err(e) => match required(&e) {
                Some(need) if need > out.len() - start => size = need,
                _ => return Err(e),
            },
        }
    }
}

/// Hands `payload` to `sink` while it has room and no earlier plaintext waits in `plain` (saving
/// a copy through `plain`); the rest waits in `plain`.
fn deliver(payload: &[u8], plain: &mut Vec<u8>, sink: Option<&mut ReadBuf<'_>>) {
    let mut rest = payload;
    if let Some(buf) = sink.filter(|_| plain.is_empty()) {
        let n = buf.remaining().min(rest.len());
        buf.put_slice(&rest[..n]);
        rest = &rest[n..];
    }
    plain.extend_from_slice(rest);
}

/// Performs `act` once application data may flow, encrypting into `out` (the buffer and the end of
/// what it holds).
fn write_traffic(
    w: &mut WriteTraffic<'_, ServerConnectionData>,
    act: Act<'_>,
    (out, end): (&mut Vec<u8>, &mut usize),
    close_sent: &mut bool,
) -> Result<Driven, rustls::Error> {
    Ok(match act {
        Act::Nothing => Driven::Open(0),
        Act::Write(data) => {
            let guess = data.len() + RECORD_OVERHEAD * (1 + data.len() / 16_384);
            append(out, end, guess, |b| w.encrypt(data, b), encrypt_required)
                .map_err(encrypt_err)?;
            Driven::Open(data.len())
        }
        Act::Close => {
            if !*close_sent {
                let close = |b: &mut [u8]| w.queue_close_notify(b);
                append(out, end, 64, close, encrypt_required).map_err(encrypt_err)?;
                *close_sent = true;
            }
            Driven::Open(0)
        }
    })
}

fn encode_required(e: &EncodeError) -> Option<usize> {
    match e {
        EncodeError::InsufficientSize(s) => Some(s.required_size),
        _ => None,
    }
}

fn encrypt_required(e: &EncryptError) -> Option<usize> {
    match e {
        EncryptError::InsufficientSize(s) => Some(s.required_size),
        _ => None,
    }
}

fn encrypt_err(e: EncryptError) -> rustls::Error {
    rustls::Error::General(format!("tls encrypt: {e}"))
}

impl TlsIo {
    /// Runs the server handshake on `tcp`. rustls' errors come back as `InvalidData` I/O errors
    /// carrying the `rustls::Error` (an alert the handshake owes the peer is sent first); EOF
    /// before the handshake completes is `UnexpectedEof`.
    pub async fn accept(tcp: TcpStream, config: Arc<ServerConfig>) -> io::Result<TlsIo> {
        let conn = UnbufferedServerConnection::new(config.clone()).map_err(tls_err)?;
        let mut io = TlsIo {
            tcp,
            engine: Engine::Rustls(Box::new(conn)),
            alpn: None,
            incoming: Vec::new(),
            in_at: 0,
            plain: Vec::new(),
            plain_at: 0,
            out: Vec::new(),
            out_at: 0,
            out_end: 0,
            peer_closed: false,
            truncated: false,
            close_sent: false,
            busy: false,
        };
        let mut caught = Caught::default();
        std::future::poll_fn(|cx| io.poll_handshake(cx, &mut caught)).await?;
        io.after_handshake(&config, &caught)?;
        Ok(io)
    }

    /// Busy mode, for a connection that is moving data in bulk (a splice's busy phase): the
    /// buffers and ring's keys are kept when the socket drains, instead of being freed and built
    /// again at every pause of the stream, and a socket read takes up to [`BUSY_READ_CHUNK`].
    /// Leaving it frees what is drained, as a quiet connection would have.
    pub fn set_busy(&mut self, busy: bool) {
        self.busy = busy;
        if !busy {
            self.release_drained();
        }
    }

    /// The ALPN protocol agreed in the handshake.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.alpn.as_deref()
    }

    /// Keeps the ALPN protocol, and hands a TLS 1.3 connection to [`Keys13`] when the config
    /// allows (see [`record::enable`](super::record::enable)).
    fn after_handshake(&mut self, config: &ServerConfig, caught: &Caught) -> io::Result<()> {
        let Engine::Rustls(conn) = &self.engine else {
            return Err(broken());
        };
        self.alpn = conn.alpn_protocol().map(Box::from);
        if !config.enable_secret_extraction
            || conn.protocol_version() != Some(ProtocolVersion::TLSv1_3)
        {
            return Ok(());
        }
        let Engine::Rustls(conn) = std::mem::replace(&mut self.engine, Engine::Broken) else {
            unreachable!("checked above");
        };
        let (secrets, kernel) = conn.dangerous_into_kernel_connection().map_err(tls_err)?;
        self.engine = Engine::Tls13(Keys13::new(secrets, kernel, caught).map_err(tls_err)?);
        Ok(())
    }

    fn poll_handshake(
        &mut self,
        cx: &mut Context<'_>,
        caught: &mut Caught,
    ) -> Poll<io::Result<()>> {
        loop {
            let driven = self.drive(Act::Nothing, None);
            // rustls computed the traffic secrets (if it did) in that call, on this thread.
            caught.take_logged();
            if let Err(e) = driven {
                // The alert rustls queued with the error is encoded by one more round.
                let _ = self.drive(Act::Nothing, None);
                let _ = self.poll_write_out(cx);
                return Poll::Ready(Err(tls_err(e)));
            }
            let flushed = self.poll_write_out(cx)?;
            match driven {
                Ok(Driven::Open(_)) if !self.handshaking() => {
                    ready!(flushed);
                    return Poll::Ready(Ok(()));
                }
                Ok(Driven::Closed) => return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
                _ => {}
            }
            ready!(flushed);
            if ready!(self.poll_fill(cx, 0))? == 0 {
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }

    fn handshaking(&self) -> bool {
        matches!(&self.engine, Engine::Rustls(c) if c.is_handshaking())
    }

    /// Processes every complete record received, queues what rustls has to send into `out`, and
    /// performs `act` once application data may flow (rustls' engine only). Plaintext goes to
    /// `sink` while it has room (see [`deliver`]), the rest to `plain`.
    fn drive(
        &mut self,
        act: Act<'_>,
        mut sink: Option<&mut ReadBuf<'_>>,
    ) -> Result<Driven, rustls::Error> {
        let Engine::Rustls(conn) = &mut self.engine else {
            return Err(rustls::Error::General("tls: not rustls' connection".into()));
        };
        loop {
            let UnbufferedStatus { discard, state } =
                conn.process_tls_records(&mut self.incoming[self.in_at..]);
            let stop = match state? {
                ConnectionState::ReadTraffic(mut r) => {
                    while let Some(rec) = r.next_record() {
                        deliver(rec?.payload, &mut self.plain, sink.as_deref_mut());
                    }
                    None
                }
                ConnectionState::ReadEarlyData(mut r) => {
                    while let Some(rec) = r.next_record() {
                        deliver(rec?.payload, &mut self.plain, sink.as_deref_mut());
                    }
                    None
                }
                ConnectionState::EncodeTlsData(mut e) => {
                    append(
                        &mut self.out,
                        &mut self.out_end,
                        512,
                        |b| e.encode(b),
                        encode_required,
                    )
                    .map_err(|e| rustls::Error::General(format!("tls encode: {e}")))?;
                    None
                }
                // What was encoded is in `out`, written before the next read and on flush.
                ConnectionState::TransmitTlsData(t) => {
                    t.done();
                    None
                }
                ConnectionState::PeerClosed => {
                    self.peer_closed = true;
                    None
                }
                ConnectionState::Closed => Some(Driven::Closed),
                ConnectionState::BlockedHandshake => Some(Driven::NeedInput),
                ConnectionState::WriteTraffic(mut w) => Some(write_traffic(
                    &mut w,
                    act,
                    (&mut self.out, &mut self.out_end),
                    &mut self.close_sent,
                )?),
                _ => return Err(rustls::Error::General("tls: unexpected state".into())),
            };
            self.in_at += discard;
            if self.in_at == self.incoming.len() {
                self.incoming.clear();
                self.in_at = 0;
            }
            if let Some(d) = stop {
                return Ok(d);
            }
        }
    }

    /// Reads from the socket into `incoming`; `Ready(Ok(0))` is EOF. `room` is the reader's free
    /// space: in busy mode a read takes about that much ciphertext (within [`READ_CHUNK`] and
    /// [`BUSY_READ_CHUNK`]), so what it decrypts goes straight to the reader instead of through
    /// `plain`, which would copy it twice.
    fn poll_fill(&mut self, cx: &mut Context<'_>, room: usize) -> Poll<io::Result<usize>> {
        if self.incoming.len() - self.in_at >= INCOMING_MAX {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "tls: incomplete message over the buffer bound",
            )));
        }
        // Room is made only once the socket is readable, and given back once it is drained: a
        // connection waiting for its peer holds no buffer (unless busy).
        let read = if self.tcp.poll_read_ready(cx)?.is_pending() {
            Poll::Pending
        } else {
            let chunk = if self.busy {
                // Plaintext plus its records' overhead (22 bytes per 16 KiB record at most).
                (room + (room >> 9) + RECORD_OVERHEAD).clamp(READ_CHUNK, BUSY_READ_CHUNK)
            } else {
                READ_CHUNK
            };
            if self.incoming.capacity() - self.incoming.len() < chunk / 4 {
                // Move the partial record to the front first; grow only if that is not room
                // enough (growing would copy it anyway).
                self.incoming.drain(..self.in_at);
                self.in_at = 0;
                if self.incoming.capacity() - self.incoming.len() < chunk / 4 {
                    self.incoming.reserve(chunk);
                }
            }
            // The socket's own `poll_read`: a read that returns less than it was offered marks
            // the socket drained, so the next read waits for readiness instead of costing a
            // system call that would only say "would block".
            tokio_util::io::poll_read_buf(
                Pin::new(&mut self.tcp),
                cx,
                &mut bytes::BufMut::limit(&mut self.incoming, chunk),
            )
        };
        if read.is_pending() && !self.busy {
            self.release_drained();
        }
        read
    }

    /// Frees each buffer that holds nothing (the socket has nothing more to read for now), and
    /// ring's keys once all three are free (built again when data flows: an AES key schedule per
    /// direction is hundreds of bytes).
    fn release_drained(&mut self) {
        let mut free = 0;
        if self.incoming.is_empty() {
            self.incoming = Vec::new();
            free += 1;
        }
        if self.plain_at >= self.plain.len() {
            self.plain = Vec::new();
            self.plain_at = 0;
            free += 1;
        }
        if self.out_at >= self.out_end {
            self.out = Vec::new();
            self.out_at = 0;
            self.out_end = 0;
            free += 1;
        }
        if let (Engine::Tls13(keys), 3) = (&mut self.engine, free) {
            keys.release();
        }
    }

    /// Processes the records received: rustls' engine, or [`TlsIo::open_records`].
    fn receive(&mut self, sink: Option<&mut ReadBuf<'_>>) -> io::Result<()> {
        match &self.engine {
            Engine::Rustls(_) => {
                if self.drive(Act::Nothing, sink).map_err(tls_err)? == Driven::Closed {
                    self.peer_closed = true;
                }
                Ok(())
            }
            Engine::Tls13(_) => self.open_records(sink),
            Engine::Broken => Err(broken()),
        }
    }

    /// Opens every complete record received, in place in `incoming`; queues the KeyUpdate the
    /// peer asked for. A refusal queues its alert, breaks the connection and is the error.
    fn open_records(&mut self, mut sink: Option<&mut ReadBuf<'_>>) -> io::Result<()> {
        let Engine::Tls13(keys) = &mut self.engine else {
            return Err(broken());
        };
        let result = loop {
            let at = self.in_at;
            match keys.open(&mut self.incoming[at..]) {
                Ok(None) => break Ok(()),
                Ok(Some((used, opened))) => {
                    self.in_at += used;
                    match opened {
                        Opened::Data(start, end) => deliver(
                            &self.incoming[at + start..at + end],
                            &mut self.plain,
                            sink.as_deref_mut(),
                        ),
                        Opened::KeyUpdate => {}
                        Opened::CloseNotify => {
                            // Whatever follows a close_notify is ignored.
                            self.peer_closed = true;
                            self.in_at = self.incoming.len();
                            break Ok(());
                        }
                    }
                }
                Err(f) => break Err(f),
            }
        };
        if self.in_at == self.incoming.len() {
            self.incoming.clear();
            self.in_at = 0;
        }
        match result {
            // Nothing goes after our close_notify, not even a KeyUpdate.
            Ok(()) if self.close_sent => Ok(()),
            Ok(()) => keys
                .send_update_if_due(&mut self.out, &mut self.out_end)
                .map_err(tls_err),
            Err(f) => {
                if let (Some(alert), false) = (f.alert, self.close_sent) {
                    let _ = keys.seal_alert(alert, &mut self.out, &mut self.out_end);
                }
                self.close_sent = true;
                self.engine = Engine::Broken;
                Err(tls_err(f.error))
            }
        }
    }

    /// Writes the queued ciphertext to the socket; `Ready(Ok)` once it is all written (the
    /// buffer is kept for the next write, see [`TlsIo::release_drained`]).
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_at < self.out_end {
            let pending = &self.out[self.out_at..self.out_end];
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_at += n;
        }
        self.out_at = 0;
        self.out_end = 0;
        Poll::Ready(Ok(()))
    }

    /// Hands buffered plaintext to `buf`; true if any was there.
    fn take_plain(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        if self.plain_at >= self.plain.len() {
            return false;
        }
        let n = buf.remaining().min(self.plain.len() - self.plain_at);
        buf.put_slice(&self.plain[self.plain_at..self.plain_at + n]);
        self.plain_at += n;
        if self.plain_at == self.plain.len() {
            self.plain.clear();
            self.plain_at = 0;
        }
        true
    }
}

impl AsyncRead for TlsIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if buf.remaining() == 0 || this.take_plain(buf) || this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            if this.truncated {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection without a TLS close_notify",
                )));
            }
            let before = buf.filled().len();
            if let Err(e) = this.receive(Some(buf)) {
                // The alert owed, if the socket takes it.
                let _ = this.poll_write_out(cx);
                return Poll::Ready(Err(e));
            }
            let delivered = buf.filled().len() > before;
            // What is owed the peer (a key update, an alert) goes out with the reads; if the
            // socket is full, its write readiness wakes this task.
            match this.poll_write_out(cx) {
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending if !delivered && this.out_end - this.out_at > OUT_BACKLOG => {
                    return Poll::Pending
                }
                _ => {}
            }
            if delivered {
                return Poll::Ready(Ok(()));
            }
            if this.plain_at < this.plain.len() || this.peer_closed {
                continue;
            }
            if ready!(this.poll_fill(cx, buf.remaining()))? == 0 {
                this.truncated = true;
            }
        }
    }
}

impl AsyncWrite for TlsIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let take = &data[..data.len().min(WRITE_CHUNK)];
        let driven = match &mut this.engine {
            Engine::Rustls(_) => this.drive(Act::Write(take), None).map_err(tls_err)?,
            Engine::Tls13(_) if this.close_sent => Driven::Closed,
            Engine::Tls13(keys) => {
                keys.seal_data(take, &mut this.out, &mut this.out_end)
                    .map_err(tls_err)?;
                Driven::Open(take.len())
            }
            Engine::Broken => return Poll::Ready(Err(broken())),
        };
        match driven {
            Driven::Open(n) => {
                // Sent now if the socket takes it; otherwise before the next write or on flush.
                if let Poll::Ready(Err(e)) = this.poll_write_out(cx) {
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(n))
            }
            Driven::Closed | Driven::NeedInput => {
                Poll::Ready(Err(io::ErrorKind::NotConnected.into()))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent {
            // Best effort, as a close on a broken connection: the socket is shut down either way.
            let sent = match &mut this.engine {
                Engine::Rustls(_) => this.drive(Act::Close, None).map(|_| ()),
                Engine::Tls13(keys) => keys.seal_alert(
                    AlertDescription::CloseNotify,
                    &mut this.out,
                    &mut this.out_end,
                ),
                Engine::Broken => Ok(()),
            };
            // rustls' engine marks the close sent itself.
            if sent.is_err() || !matches!(this.engine, Engine::Rustls(_)) {
                this.close_sent = true;
            }
        }
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server config with a certificate for `localhost` from a fresh CA, and a client config
    /// trusting that CA offering `versions` and `alpn`.
    fn configs(
        versions: &[&'static rustls::SupportedProtocolVersion],
        alpn: &[u8],
    ) -> (Arc<ServerConfig>, Arc<rustls::ClientConfig>) {
        configs_with(versions, alpn, None, true)
    }

    /// [`configs`] with the client offering only `suite` (if given), and the server catching the
    /// traffic secrets (`capture`) or only extracting keys (so a `KernelConnection` is kept).
    fn configs_with(
        versions: &[&'static rustls::SupportedProtocolVersion],
        alpn: &[u8],
        suite: Option<rustls::SupportedCipherSuite>,
        capture: bool,
    ) -> (Arc<ServerConfig>, Arc<rustls::ClientConfig>) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        if capture {
            crate::tls::record::enable(&mut server);
        } else {
            server.enable_secret_extraction = true;
        }
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca_cert.der().to_vec()))
            .unwrap();
        let mut client_provider = (*provider).clone();
        if let Some(suite) = suite {
            client_provider.cipher_suites = vec![suite];
        }
        let mut client = rustls::ClientConfig::builder_with_provider(Arc::new(client_provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![alpn.to_vec()];
        (Arc::new(server), Arc::new(client))
    }

    async fn connect(
        client: Arc<rustls::ClientConfig>,
        addr: std::net::SocketAddr,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(client)
            .connect(name, tcp)
            .await
    }

    async fn ping(c: &mut tokio_rustls::client::TlsStream<TcpStream>) {
        c.write_all(b"ping!").await.unwrap();
        c.flush().await.unwrap();
        let mut back = [0u8; 5];
        c.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping!");
    }

    /// Buffer bytes held, plus one if ring's keys are built.
    fn held(io: &TlsIo) -> usize {
        let keys = matches!(&io.engine, Engine::Tls13(k) if k.holds_aead());
        io.incoming.capacity() + io.plain.capacity() + io.out.capacity() + usize::from(keys)
    }

    /// Which engine runs the connection: "rustls", "tls13" (own secrets) or "kernel".
    fn engine(io: &TlsIo) -> &'static str {
        match &io.engine {
            Engine::Rustls(_) => "rustls",
            Engine::Tls13(k) if k.uses_kernel() => "kernel",
            Engine::Tls13(_) => "tls13",
            Engine::Broken => "broken",
        }
    }

    /// Echoes until `total` bytes have come back.
    async fn echo(io: &mut TlsIo, buf: &mut [u8], total: usize) {
        let mut seen = 0;
        while seen < total {
            let n = io.read(buf).await.unwrap();
            assert!(n > 0, "early end");
            io.write_all(&buf[..n]).await.unwrap();
            io.flush().await.unwrap();
            seen += n;
        }
    }

    /// Polls one read while the peer waits (nothing to read): what the connection holds then.
    async fn held_when_drained(io: &mut TlsIo) -> usize {
        std::future::poll_fn(|cx| {
            let mut byte = [0u8; 1];
            let mut rb = ReadBuf::new(&mut byte);
            let read = Pin::new(&mut *io).poll_read(cx, &mut rb);
            assert!(read.is_pending(), "the peer sent nothing");
            Poll::Ready(held(io))
        })
        .await
    }

    /// A ping, a megabyte each way in small then uneven writes, 200 kB the server sends in one
    /// write, and a ping through the real socket, on TLS 1.3 with each suite (our record layer)
    /// and on TLS 1.2 (rustls): while busy the connection keeps its buffers, once a read finds the
    /// socket drained (the client waiting) it holds neither buffers nor ring's keys, and
    /// close_notify ends each side's reads cleanly.
    #[tokio::test]
    async fn echoes_both_ways_holds_nothing_idle_and_closes_cleanly() {
        use rustls::crypto::ring::cipher_suite as cs;
        const MB: usize = 1_000_000;
        const BIG: usize = 200_000;
        let cases = [
            (
                &rustls::version::TLS13,
                Some(cs::TLS13_AES_128_GCM_SHA256),
                "tls13",
            ),
            (
                &rustls::version::TLS13,
                Some(cs::TLS13_AES_256_GCM_SHA384),
                "tls13",
            ),
            (
                &rustls::version::TLS13,
                Some(cs::TLS13_CHACHA20_POLY1305_SHA256),
                "tls13",
            ),
            (&rustls::version::TLS12, None, "rustls"),
        ];
        for (version, suite, want_engine) in cases {
            let (server, client) = configs_with(&[version], b"http/1.1", suite, true);
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (idle_tx, mut idle_rx) = tokio::sync::mpsc::channel::<usize>(2);
            let echo = tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let mut io = TlsIo::accept(tcp, server).await.unwrap();
                assert_eq!(io.alpn_protocol(), Some(&b"http/1.1"[..]));
                assert_eq!(engine(&io), want_engine);
                let mut buf = vec![0u8; 7_000];
                echo(&mut io, &mut buf, 5).await;
                let busy = held(&io);
                idle_tx
                    .send(held_when_drained(&mut io).await)
                    .await
                    .unwrap();
                echo(&mut io, &mut buf, MB).await;
                let big: Vec<u8> = (0..BIG as u32).map(|i| (i % 253) as u8).collect();
                io.write_all(&big).await.unwrap();
                io.flush().await.unwrap();
                echo(&mut io, &mut buf, 5).await;
                idle_tx
                    .send(held_when_drained(&mut io).await)
                    .await
                    .unwrap();
                assert_eq!(
                    io.read(&mut buf).await.unwrap(),
                    0,
                    "close_notify ends reads"
                );
                io.shutdown().await.unwrap();
                busy
            });
            let mut c = connect(client, addr).await.unwrap();
            ping(&mut c).await;
            assert_eq!(idle_rx.recv().await, Some(0), "nothing held once drained");
            let data: Vec<u8> = (0..MB as u32).map(|i| (i * 7 + i / 251) as u8).collect();
            let (mut r, mut w) = tokio::io::split(c);
            let sender = {
                let data = data.clone();
                tokio::spawn(async move {
                    // Small writes (a record each) first, then large ones.
                    let (small, large) = data.split_at(30_000);
                    let mut rest = small;
                    let mut size = 1;
                    while !rest.is_empty() {
                        let n = size.min(rest.len());
                        w.write_all(&rest[..n]).await.unwrap();
                        w.flush().await.unwrap();
                        rest = &rest[n..];
                        size = size % 97 + 1;
                    }
                    for chunk in large.chunks(40_001) {
                        w.write_all(chunk).await.unwrap();
                    }
                    w.flush().await.unwrap();
                    w
                })
            };
            let mut back = vec![0u8; data.len()];
            r.read_exact(&mut back).await.unwrap();
            assert!(back == data, "echo differs ({version:?} {suite:?})");
            let mut big = vec![0u8; BIG];
            r.read_exact(&mut big).await.unwrap();
            assert!(
                big.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8),
                "one large write differs ({suite:?})"
            );
            let w = sender.await.unwrap();
            c = r.unsplit(w);
            ping(&mut c).await;
            assert_eq!(idle_rx.recv().await, Some(0), "nor after the megabyte");
            c.shutdown().await.unwrap();
            let mut rest = Vec::new();
            assert_eq!(c.read_to_end(&mut rest).await.unwrap(), 0, "clean end");
            let busy = echo.await.unwrap();
            assert!(busy > 0, "a busy connection keeps its send buffer");
        }
    }

    /// Sends `n` bytes from the client while the server echoes, and reads them back.
    async fn round(c: &mut tokio_rustls::client::TlsStream<TcpStream>, n: usize, seed: u8) {
        let data: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        c.write_all(&data).await.unwrap();
        c.flush().await.unwrap();
        let mut back = vec![0u8; n];
        c.read_exact(&mut back).await.unwrap();
        assert!(back == data, "echo differs after a key update");
    }

    /// An echo server for `rounds` bytes in all; `setup` runs on the connection after accept.
    fn echo_server(
        listener: TcpListener,
        server: Arc<ServerConfig>,
        total: usize,
        setup: impl FnOnce(&mut TlsIo) + Send + 'static,
    ) -> tokio::task::JoinHandle<&'static str> {
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut io = TlsIo::accept(tcp, server).await.unwrap();
            setup(&mut io);
            let kind = engine(&io);
            let mut buf = vec![0u8; 9_000];
            echo(&mut io, &mut buf, total).await;
            assert_eq!(io.read(&mut buf).await.unwrap(), 0, "close_notify");
            io.shutdown().await.unwrap();
            kind
        })
    }

    /// The client updates its keys (asking for ours to be updated too) between writes and with
    /// its own data still in flight; data keeps flowing both ways. Both with the secrets caught
    /// and with rustls' `KernelConnection` computing them.
    #[tokio::test]
    async fn client_key_updates_keep_data_flowing() {
        for (capture, want) in [(true, "tls13"), (false, "kernel")] {
            let (server, client) =
                configs_with(&[&rustls::version::TLS13], b"http/1.1", None, capture);
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let total = 5 + 100_000 + 5 + 3 * 20_000;
            let srv = echo_server(listener, server, total, |_| {});
            let mut c = connect(client, addr).await.unwrap();
            ping(&mut c).await;
            // Half written, keys updated, the other half written: then all of it read back.
            let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            c.write_all(&data[..50_000]).await.unwrap();
            c.flush().await.unwrap();
            c.get_mut().1.refresh_traffic_keys().unwrap();
            c.write_all(&data[50_000..]).await.unwrap();
            c.flush().await.unwrap();
            let mut back = vec![0u8; data.len()];
            c.read_exact(&mut back).await.unwrap();
            assert!(back == data, "echo differs across the key update");
            ping(&mut c).await;
            for seed in 0..3 {
                c.get_mut().1.refresh_traffic_keys().unwrap();
                round(&mut c, 20_000, seed).await;
            }
            c.shutdown().await.unwrap();
            let mut rest = Vec::new();
            assert_eq!(c.read_to_end(&mut rest).await.unwrap(), 0, "clean end");
            assert_eq!(srv.await.unwrap(), want);
        }
    }

    /// Past its send limit the server updates its own keys (a KeyUpdate before the next record),
    /// again and again; the rustls client follows.
    #[tokio::test]
    async fn server_updates_its_keys_at_the_send_limit() {
        let (server, client) = configs(&[&rustls::version::TLS13], b"http/1.1");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let srv = echo_server(listener, server, 10 * 30_000, |io| {
            let Engine::Tls13(keys) = &mut io.engine else {
                panic!("not on our record layer")
            };
            keys.set_send_limit(3);
        });
        let mut c = connect(client, addr).await.unwrap();
        for seed in 0..10 {
            round(&mut c, 30_000, seed).await;
        }
        c.shutdown().await.unwrap();
        let mut rest = Vec::new();
        assert_eq!(c.read_to_end(&mut rest).await.unwrap(), 0, "clean end");
        assert_eq!(srv.await.unwrap(), "tls13");
    }

    /// After the handshake the client's socket carries `wire` (built from the client's
    /// connection by `make`); the server's read fails with `server_err` and the client receives
    /// `alert`.
    async fn refused_record(
        make: impl FnOnce(&mut rustls::ClientConnection) -> Vec<u8>,
        server_err: rustls::Error,
        alert: AlertDescription,
    ) {
        let (server, client) = configs(&[&rustls::version::TLS13], b"http/1.1");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let srv = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut io = TlsIo::accept(tcp, server).await.unwrap();
            let mut buf = [0u8; 64];
            let e = io.read(&mut buf).await.expect_err("refused");
            let again = io.read(&mut buf).await.expect_err("stays refused");
            assert_eq!(again.kind(), io::ErrorKind::InvalidData);
            let w = io.write(b"x").await;
            assert!(w.is_err(), "no writes after a refusal");
            // Kept open until the client has read the alert: closing with unread bytes would
            // reset the connection and could drop it.
            (e, io)
        });
        let c = connect(client, addr).await.unwrap();
        let (mut tcp, mut conn) = c.into_inner();
        let wire = make(&mut conn);
        tcp.write_all(&wire).await.unwrap();
        // The server's records (tickets, then the alert) until rustls reports the alert.
        let mut got = None;
        let mut buf = vec![0u8; 8_192];
        while got.is_none() {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed without an alert");
            let mut rd = &buf[..n];
            while !rd.is_empty() {
                conn.read_tls(&mut rd).unwrap();
                if let Err(e) = conn.process_new_packets() {
                    got = Some(e);
                    break;
                }
            }
        }
        assert_eq!(got, Some(rustls::Error::AlertReceived(alert)));
        let (e, _io) = srv.await.unwrap();
        let inner = e.get_ref().and_then(|x| x.downcast_ref::<rustls::Error>());
        assert_eq!(inner, Some(&server_err), "{e}");
    }

    #[tokio::test]
    async fn corrupt_ciphertext_is_refused_with_bad_record_mac() {
        let corrupt = |conn: &mut rustls::ClientConnection| {
            use std::io::Write;
            conn.writer().write_all(b"hello").unwrap();
            let mut wire = Vec::new();
            conn.write_tls(&mut wire).unwrap();
            let last = wire.len() - 1;
            wire[last] ^= 0x40;
            wire
        };
        refused_record(
            corrupt,
            rustls::Error::DecryptError,
            AlertDescription::BadRecordMac,
        )
        .await;
    }

    #[tokio::test]
    async fn oversized_record_is_refused_with_record_overflow() {
        let oversized = |_: &mut rustls::ClientConnection| {
            let len = 16_384 + 256 + 1;
            let mut wire = vec![23, 3, 3, (len >> 8) as u8, len as u8];
            wire.resize(5 + len, 0);
            wire
        };
        refused_record(
            oversized,
            rustls::Error::InvalidMessage(rustls::InvalidMessage::MessageTooLarge),
            AlertDescription::RecordOverflow,
        )
        .await;
    }

    #[tokio::test]
    async fn change_cipher_spec_after_the_handshake_is_unexpected() {
        refused_record(
            |_| vec![20, 3, 3, 0, 1, 1],
            rustls::Error::InappropriateMessage {
                expect_types: vec![rustls::ContentType::ApplicationData],
                got_type: rustls::ContentType::ChangeCipherSpec,
            },
            AlertDescription::UnexpectedMessage,
        )
        .await;
    }

    /// What an idle TLS 1.3 connection is made of stays small (the socket, the keys, the empty
    /// buffers).
    #[test]
    fn the_connection_itself_is_small() {
        let size = std::mem::size_of::<TlsIo>();
        let rustls = std::mem::size_of::<UnbufferedServerConnection>();
        eprintln!("TlsIo {size} bytes; rustls' UnbufferedServerConnection {rustls} bytes inline");
        assert!(size <= 512, "{size} bytes");
    }

    /// In busy mode a drained connection keeps its buffers and ring's keys, a read takes more than
    /// two records at once, and leaving busy mode frees what is drained; on TLS 1.3 (our record
    /// layer) and TLS 1.2 (rustls).
    #[tokio::test]
    async fn busy_mode_keeps_buffers_through_pauses_and_reads_in_large_chunks() {
        const BULK: usize = 300_000;
        for (version, want_engine) in [
            (&rustls::version::TLS13, "tls13"),
            (&rustls::version::TLS12, "rustls"),
        ] {
            let (server, client) = configs(&[version], b"http/1.1");
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let accept = tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                TlsIo::accept(tcp, server).await.unwrap()
            });
            let c = connect(client, addr).await.unwrap();
            let mut io = accept.await.unwrap();
            assert_eq!(engine(&io), want_engine);
            io.set_busy(true);
            let mut buf = vec![0u8; BULK];
            let data: Vec<u8> = (0..BULK as u32).map(|i| (i % 251) as u8).collect();
            // Written in one go while the server reads, so the socket holds several records.
            let sender = {
                let data = data.clone();
                tokio::spawn(async move {
                    let mut c = c;
                    c.write_all(&data).await.unwrap();
                    c.flush().await.unwrap();
                    c
                })
            };
            let mut got = 0;
            let mut largest_room = 0;
            while got < BULK {
                let n = io.read(&mut buf[got..]).await.unwrap();
                assert!(n > 0, "early end");
                largest_room = largest_room.max(io.incoming.capacity());
                got += n;
            }
            assert!(buf == data, "bulk differs ({want_engine})");
            let mut c = sender.await.unwrap();
            if want_engine == "tls13" {
                assert!(
                    largest_room >= BUSY_READ_CHUNK,
                    "busy reads offer {largest_room} bytes"
                );
            }
            // Something sent, so the send buffer and key are in use too.
            tokio::join!(ping(&mut c), echo(&mut io, &mut buf, 5));
            let held_busy = held_when_drained(&mut io).await;
            assert!(
                held_busy > 0,
                "a busy connection keeps its buffers ({want_engine})"
            );
            if want_engine == "tls13" {
                assert!(
                    io.out.capacity() > 0
                        && matches!(&io.engine, Engine::Tls13(k) if k.holds_aead())
                );
            }
            io.set_busy(false);
            assert_eq!(held(&io), 0, "leaving busy mode frees what is drained");
            assert_eq!(held_when_drained(&mut io).await, 0);
            tokio::join!(ping(&mut c), echo(&mut io, &mut buf, 5));
        }
    }

    /// A refused handshake sends rustls' alert before closing, and the error carries the reason.
    #[tokio::test]
    async fn refused_handshake_sends_the_alert() {
        let (server, client) = configs(&[&rustls::version::TLS13], b"h2");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let srv = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let Err(e) = TlsIo::accept(tcp, server).await else {
                panic!("accepted a handshake without a common ALPN protocol")
            };
            e
        });
        let err = connect(client, addr).await.expect_err("refused");
        assert!(err.to_string().contains("NoApplicationProtocol"), "{err}");
        let e = srv.await.unwrap();
        let inner = e.get_ref().and_then(|x| x.downcast_ref::<rustls::Error>());
        assert_eq!(inner, Some(&rustls::Error::NoApplicationProtocol));
    }

    /// EOF without close_notify reads as an error (a truncation), not as the end of the stream.
    #[tokio::test]
    async fn eof_without_close_notify_is_an_error() {
        let (server, client) = configs(&[&rustls::version::TLS13], b"http/1.1");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let srv = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut io = TlsIo::accept(tcp, server).await.unwrap();
            let mut buf = [0u8; 16];
            let n = io.read(&mut buf).await.unwrap();
            (buf[..n].to_vec(), io.read(&mut buf).await)
        });
        let mut c = connect(client, addr).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        c.flush().await.unwrap();
        let (tcp, _) = c.into_inner();
        drop(tcp);
        let (first, second) = srv.await.unwrap();
        assert_eq!(first, b"hello");
        assert_eq!(
            second.unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof,
            "truncation"
        );
    }
}
