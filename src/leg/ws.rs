//! WebSocket plumbing shared by the three legs: per-leg configuration, the raw refusal responses of
//! the upgrade gates, the 101 upgrade, and closing with a 1 s force-terminate (docs/reference/websocket.md).
//!
//! warp's `Ws` builder cannot set tungstenite's read buffer (128 KiB per socket by default, zero-filled
//! before each read), so legs are upgraded with hyper and wrapped with an explicit
//! [`WebSocketConfig`]: a small read buffer keeps idle sockets cheap and reads fast.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::busy_hint::BusyHint;
use crate::tls::stream::TlsIo;

use super::preauth_io::PreAuthIo;
use crate::contract::limits;
use crate::http::Response;

/// A server-side leg socket, read through the pre-auth budget ([`PreAuthIo`]).
pub type Ws = WebSocketStream<PreAuthIo<LegIo>>;

/// The stream under a leg socket once hyper hands the upgraded connection over. hyper's
/// `Upgraded` is taken apart (its boxed IO and its read-buffer leftover) for the two transports
/// the server accepts: on plain TCP the accepted `TcpStream` itself, so an idle socket holds no
/// heap allocation of its own; over the relay's TLS listener its [`TlsIo`], boxed so the variants
/// stay small, and reached directly (no dynamic dispatch per read) so a splice can put it in
/// [busy mode](super::busy_hint). Any other IO keeps hyper's upgraded IO.
pub enum LegIo {
    Tcp(TcpStream),
    Tls(Box<TlsIo>),
    Upgraded(Box<TokioIo<Upgraded>>),
}

impl BusyHint for LegIo {
    fn set_busy(&mut self, busy: bool) {
        if let LegIo::Tls(t) = self {
            t.set_busy(busy);
        }
    }
}

impl LegIo {
    /// Unwraps `upgraded`; also returns the bytes hyper had already read past the request (a
    /// client may send its first frame without waiting for the 101), to be handed to the codec.
    pub fn unwrap(upgraded: Upgraded) -> (LegIo, Bytes) {
        let upgraded = match upgraded.downcast::<TokioIo<TcpStream>>() {
            Ok(parts) => return (LegIo::Tcp(parts.io.into_inner()), parts.read_buf),
            Err(upgraded) => upgraded,
        };
        match upgraded.downcast::<TokioIo<TlsIo>>() {
            Ok(parts) => (LegIo::Tls(Box::new(parts.io.into_inner())), parts.read_buf),
            Err(upgraded) => (
                LegIo::Upgraded(Box::new(TokioIo::new(upgraded))),
                Bytes::new(),
            ),
        }
    }
}

impl AsyncRead for LegIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LegIo::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            LegIo::Tls(t) => Pin::new(&mut **t).poll_read(cx, buf),
            LegIo::Upgraded(u) => Pin::new(&mut **u).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LegIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LegIo::Tcp(s) => Pin::new(s).poll_write(cx, data),
            LegIo::Tls(t) => Pin::new(&mut **t).poll_write(cx, data),
            LegIo::Upgraded(u) => Pin::new(&mut **u).poll_write(cx, data),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LegIo::Tcp(s) => Pin::new(s).poll_flush(cx),
            LegIo::Tls(t) => Pin::new(&mut **t).poll_flush(cx),
            LegIo::Upgraded(u) => Pin::new(&mut **u).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LegIo::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            LegIo::Tls(t) => Pin::new(&mut **t).poll_shutdown(cx),
            LegIo::Upgraded(u) => Pin::new(&mut **u).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LegIo::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            LegIo::Tls(t) => Pin::new(&mut **t).poll_write_vectored(cx, bufs),
            LegIo::Upgraded(u) => Pin::new(&mut **u).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            LegIo::Tcp(s) => s.is_write_vectored(),
            LegIo::Tls(t) => t.is_write_vectored(),
            LegIo::Upgraded(u) => u.is_write_vectored(),
        }
    }
}

/// Bytes tungstenite reads per `read` call (its buffer is allocated per socket and zero-filled
/// before every read, so this is both the idle cost and the per-read cost).
pub const READ_BUFFER: usize = 2 * 1024;
/// Frames accumulate in tungstenite's out buffer up to this size before a write to the kernel
/// (the splice flushes explicitly when its inbound side is momentarily empty).
pub const WRITE_BUFFER: usize = 32 * 1024;

/// The three legs (docs/reference/websocket.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    Control,
    Data,
    Phone,
}

impl Leg {
    /// Every leg, for the metrics created at zero from start-up.
    pub const ALL: [Leg; 3] = [Leg::Control, Leg::Data, Leg::Phone];

    pub fn name(self) -> &'static str {
        match self {
            Leg::Control => "control",
            Leg::Data => "data",
            Leg::Phone => "phone",
        }
    }
    pub fn max_message(self) -> usize {
        match self {
            Leg::Control => limits::CONTROL_MAX_MESSAGE,
            Leg::Data => limits::DATA_MAX_MESSAGE,
            Leg::Phone => limits::PHONE_MAX_MESSAGE,
        }
    }
}

/// The tungstenite configuration of a leg: max message (1009 above it), small read buffer,
/// bounded write buffer. `permessage-deflate` is never negotiated (no extension support compiled).
pub fn config(leg: Leg) -> WebSocketConfig {
    let max = leg.max_message();
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_message_size(Some(max))
        .max_frame_size(Some(max))
}

/// [`config`] of `leg`, built once: a parked splice refers to its sockets' configurations instead
/// of keeping copies.
pub fn config_ref(leg: Leg) -> &'static WebSocketConfig {
    static CONFIGS: std::sync::OnceLock<[WebSocketConfig; 3]> = std::sync::OnceLock::new();
    let all = CONFIGS.get_or_init(|| [config(Leg::Control), config(Leg::Data), config(Leg::Phone)]);
    match leg {
        Leg::Control => &all[0],
        Leg::Data => &all[1],
        Leg::Phone => &all[2],
    }
}

/// A gate refusal: `HTTP/1.1 <status>`, `Connection: close`, `Content-Length: 0`, plus
/// `Retry-After: 2` on 503 (docs/reference/websocket.md).
pub fn refuse(status: StatusCode) -> Response {
    let mut r = Response::default();
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    h.insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("2"));
    }
    r
}

/// Is this a WebSocket upgrade request (RFC 6455)? Returns the `Sec-WebSocket-Key`.
pub fn ws_key(req: &http::Request<Incoming>) -> Option<HeaderValue> {
    let h = req.headers();
    let has_token = |name: http::header::HeaderName, token: &str| {
        h.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if req.method() != http::Method::GET
        || !has_token(http::header::UPGRADE, "websocket")
        || !has_token(http::header::CONNECTION, "upgrade")
        || h.get(http::header::SEC_WEBSOCKET_VERSION)
            .map(|v| v.as_bytes())
            != Some(b"13")
    {
        return None;
    }
    h.get(http::header::SEC_WEBSOCKET_KEY).cloned()
}

/// RFC 6455 item 5: `Sec-WebSocket-Key` is base64 of 16 bytes. Anything else (an empty
/// key included) is refused 400 instead of upgraded.
pub fn valid_key(key: &HeaderValue) -> bool {
    use base64::Engine;
    key.as_bytes().len() == 24
        && base64::engine::general_purpose::STANDARD
            .decode(key.as_bytes())
            .is_ok_and(|b| b.len() == 16)
}

/// After authentication: the leg's own message limit applies from now on (see [`PreAuthIo`]).
pub fn authenticated(ws: &Ws) {
    ws.get_ref().lift();
}

/// A `101 Switching Protocols` with `Connection: upgrade` and `Upgrade: websocket` (no accept key).
fn switching_protocols() -> Response {
    let mut r = Response::default();
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("upgrade"),
    );
    h.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    r
}

/// Answers 101 and returns the future socket. No extension or subprotocol is ever accepted.
pub fn accept(
    req: &mut http::Request<Incoming>,
    key: &HeaderValue,
    leg: Leg,
) -> (Response, impl std::future::Future<Output = Option<Ws>>) {
    let on_upgrade = hyper::upgrade::on(req);
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut r = switching_protocols();
    if let Ok(v) = HeaderValue::from_str(&accept) {
        r.headers_mut()
            .insert(http::header::SEC_WEBSOCKET_ACCEPT, v);
    }
    let fut = async move {
        let upgraded = on_upgrade.await.ok()?;
        let (io, early) = LegIo::unwrap(upgraded);
        let mut io = PreAuthIo::new(io);
        let ws = if early.is_empty() {
            WebSocketStream::from_raw_socket(io, Role::Server, Some(config(leg))).await
        } else {
            // Bytes sent before the 101 count as read through the pre-auth wrapper.
            io.prefill(&early);
            WebSocketStream::from_partially_read(
                io,
                early.to_vec(),
                Role::Server,
                Some(config(leg)),
            )
            .await
        };
        Some(ws)
    };
    (r, fut)
}

/// The close frame of `code` / `reason`.
pub fn close_frame(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.into(),
    }))
}

/// Relay-initiated close: send the close frame, wait for the peer's close (or EOF), and give up
/// (dropping the TCP connection) after 1 000 ms (docs/reference/websocket.md).
pub async fn close<S>(ws: &mut WebSocketStream<S>, code: u16, reason: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ = tokio::time::timeout(Duration::from_millis(limits::CLOSE_FORCE_MS), async {
        if ws.send(close_frame(code, reason)).await.is_err() {
            return;
        }
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// Sends one JSON text frame.
pub async fn send_json<S>(ws: &mut WebSocketStream<S>, v: &serde_json::Value) -> bool
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(Message::text(v.to_string())).await.is_ok()
}

/// The first frame of a leg (2 000 ms deadline).
pub enum First {
    Text(String),
    Binary,
    Timeout,
    /// Message over the leg maximum or over the pre-auth budget: close 1009.
    Oversize,
    /// A framing violation (RFC 6455): close with this code (1002, or 1007 for invalid UTF-8).
    Violation(u16),
    /// Closed or errored before a frame.
    Gone,
}

/// The close code of a read error that is the peer's protocol violation, if it is one.
pub fn violation_code(e: &tokio_tungstenite::tungstenite::Error) -> Option<u16> {
    use tokio_tungstenite::tungstenite::Error;
    match e {
        Error::Protocol(_) => Some(crate::contract::close::PROTOCOL_ERROR),
        Error::Utf8(_) => Some(crate::contract::close::INVALID_PAYLOAD),
        _ => None,
    }
}

/// The close reason sent with a violation code (the spec is silent; RFC 6455 names).
pub fn violation_reason(code: u16) -> &'static str {
    if code == crate::contract::close::INVALID_PAYLOAD {
        "invalid frame payload data"
    } else {
        "protocol error"
    }
}

/// Reads the first data frame, answering pings on the way. Stops at the pre-auth budget.
pub async fn first_frame<S>(ws: &mut WebSocketStream<PreAuthIo<S>>, deadline: Duration) -> First
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let over = ws.get_ref().exceeded();
    let read = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => return First::Text(t.as_str().to_owned()),
                Some(Ok(Message::Binary(_))) => return First::Binary,
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(_))) => {
                    return First::Oversize
                }
                Some(Err(e)) => match violation_code(&e) {
                    Some(code) => return First::Violation(code),
                    None => return First::Gone,
                },
                _ => return First::Gone,
            }
        }
    };
    let read = async {
        tokio::select! {
            f = read => f,
            _ = over => First::Oversize,
        }
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(First::Timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// On plain TCP, hyper's upgraded IO is unwrapped into the accepted `TcpStream`, and bytes the
    /// client sent right behind its request come back as the leftover, then the socket reads on.
    #[tokio::test]
    async fn plain_tcp_upgrade_unwraps_to_the_stream_with_its_leftover() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let tx = std::sync::Mutex::new(Some(tx));
            let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
                let on = hyper::upgrade::on(&mut req);
                let tx = crate::sync::lock(&tx).take();
                async move {
                    tokio::spawn(async move {
                        let upgraded = on.await.unwrap();
                        let (io, early) = LegIo::unwrap(upgraded);
                        let _ = tx.unwrap().send((io, early));
                    });
                    Ok::<_, std::convert::Infallible>(switching_protocols())
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\nearly")
            .await
            .unwrap();
        let (io, early) = rx.await.unwrap();
        assert_eq!(&early[..], b"early");
        let LegIo::Tcp(mut stream) = io else {
            panic!("plain TCP was not unwrapped");
        };
        client.write_all(b"later").await.unwrap();
        let mut got = [0u8; 5];
        stream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"later");
    }
}
