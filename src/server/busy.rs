//! Admission over the HTTP connection cap ([`HTTP_CONNECTIONS_MAX`]) and the answer given there.
//!
//! Closing a connection without a word leaves a reconnecting client with a network error and no
//! hint when to come back, and leaves the operator with nothing to count. So the accept loop only
//! accepts a connection once it holds either a serving slot or one of a bounded few answering
//! permits ([`BUSY_ANSWERS_MAX`]); with neither free it stops accepting, and new connections
//! wait in the kernel's listen backlog (bounded by the kernel) until one frees. A connection
//! taken with an answering permit is answered `503 server_busy` with `Retry-After: 1` (after the
//! TLS handshake on a TLS listener). Each is counted in
//! `orca_relay_http_connections_refused_total{reason}`: `answered` once the 503 is written,
//! `closed` when the client left, failed the handshake or sent no request head within
//! [`BUSY_ANSWER_MS`] first. Answering is bounded in count and time so that refusing a storm
//! never costs more than serving it would.
//!
//! [`HTTP_CONNECTIONS_MAX`]: crate::contract::limits::HTTP_CONNECTIONS_MAX
//! [`BUSY_ANSWERS_MAX`]: crate::contract::limits::BUSY_ANSWERS_MAX
//! [`BUSY_ANSWER_MS`]: crate::contract::limits::BUSY_ANSWER_MS

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use crate::contract::limits::{BUSY_ANSWERS_MAX, BUSY_ANSWER_MS};
use crate::metrics::Metrics;
use crate::tls::server::Tls;

/// The counter's name; `reason` is `answered` (the 503 was written) or `closed` (the connection
/// ended before it could be).
pub const REFUSED_TOTAL: &str = "orca_relay_http_connections_refused_total";

/// The whole answer, written as one buffer (the body is `{"error":"server_busy"}`).
const RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 23\r\n\
\r\n\
{\"error\":\"server_busy\"}";

/// Request head bytes read before answering, at most (the rest is left unread).
const HEAD_READ_MAX: usize = 8 * 1024;

/// What the accept loop holds before it accepts the next connection.
pub enum Ticket {
    /// A serving slot: the connection is served.
    Serve(OwnedSemaphorePermit),
    /// An answering permit: the connection is answered 503 (unless a slot frees first).
    Answer(OwnedSemaphorePermit),
}

/// Waits for a serving slot or, with none free, an answering permit, whichever frees first
/// (a slot when both are free). Cancel-safe. `None` only if a semaphore was closed.
pub async fn admit(slots: &Arc<Semaphore>, answers: &Arc<Semaphore>) -> Option<Ticket> {
    if let Ok(s) = slots.clone().try_acquire_owned() {
        return Some(Ticket::Serve(s));
    }
    if let Ok(p) = answers.clone().try_acquire_owned() {
        return Some(Ticket::Answer(p));
    }
    tokio::select! {
        biased;
        s = slots.clone().acquire_owned() => s.ok().map(Ticket::Serve),
        p = answers.clone().acquire_owned() => p.ok().map(Ticket::Answer),
    }
}

/// After the accept: an answering ticket becomes a serving one if a slot freed meanwhile.
pub fn upgrade(ticket: Ticket, slots: &Arc<Semaphore>) -> Ticket {
    match ticket {
        Ticket::Answer(p) => match slots.clone().try_acquire_owned() {
            Ok(s) => {
                drop(p);
                Ticket::Serve(s)
            }
            Err(_) => Ticket::Answer(p),
        },
        t => t,
    }
}

/// Answers connections the accept loop has no serving slot for.
pub struct Busy {
    answering: Arc<Semaphore>,
    refused: IntCounterVec,
    tls: Option<Arc<Tls>>,
}

impl Busy {
    pub fn new(metrics: &Metrics, tls: Option<Arc<Tls>>) -> Busy {
        let refused = metrics.register_counter_vec(
            REFUSED_TOTAL,
            "connections over the HTTP connection cap: answered 503 server_busy, or closed \
             (client gone, failed handshake or no request head in time) before the answer",
            &["reason"],
        );
        for reason in ["answered", "closed"] {
            let _ = refused.with_label_values(&[reason]);
        }
        Busy {
            answering: Arc::new(Semaphore::new(BUSY_ANSWERS_MAX)),
            refused,
            tls,
        }
    }

    /// The answering permits, for [`admit`].
    pub fn permits(&self) -> &Arc<Semaphore> {
        &self.answering
    }

    /// Answers `stream` in its own task, holding `permit` until done; never waits.
    pub fn refuse(&self, stream: TcpStream, permit: OwnedSemaphorePermit, tasks: &TaskTracker) {
        let tls = self.tls.clone();
        let refused = self.refused.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let work = async {
                match tls {
                    None => answer(stream).await,
                    Some(tls) => match tls.accept(stream).await {
                        Some(stream) => answer(stream).await,
                        None => false,
                    },
                }
            };
            let written = tokio::time::timeout(Duration::from_millis(BUSY_ANSWER_MS), work)
                .await
                .unwrap_or(false);
            let reason = if written { "answered" } else { "closed" };
            refused.with_label_values(&[reason]).inc();
        });
    }
}

/// Reads the request head, then writes the 503 and closes; true once the answer was written.
/// Closing with the request unread would reset the connection, and a reset can destroy the
/// answer before the client has read it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> bool {
    let mut buf = [0u8; 1024];
    let mut read = 0usize;
    let mut tail = [0u8; 4];
    while read < HEAD_READ_MAX {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        read += n;
        if head_complete(&mut tail, &buf[..n]) {
            break;
        }
    }
    if stream.write_all(RESPONSE).await.is_err() {
        return false;
    }
    let _ = stream.shutdown().await;
    true
}

/// Feeds `chunk` through the last four bytes seen; true once they are the blank line that ends
/// a request head.
fn head_complete(tail: &mut [u8; 4], chunk: &[u8]) -> bool {
    for &b in chunk {
        tail.copy_within(1.., 0);
        tail[3] = b;
        if tail == b"\r\n\r\n" {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_a_complete_503_with_retry_after() {
        let text = std::str::from_utf8(RESPONSE).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains("\r\nretry-after: 1"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"], crate::contract::errors::SERVER_BUSY);
    }

    #[test]
    fn the_blank_line_is_found_across_chunk_boundaries() {
        let mut tail = [0u8; 4];
        assert!(!head_complete(&mut tail, b"GET / HTTP/1.1\r\nhost: x\r"));
        assert!(!head_complete(&mut tail, b"\n\r"));
        assert!(head_complete(&mut tail, b"\n"));
        let mut tail = [0u8; 4];
        assert!(!head_complete(&mut tail, b"GET / HTTP/1.1\r\n"));
    }

    #[tokio::test]
    async fn a_request_is_read_then_answered() {
        let (mut client, server) = tokio::io::duplex(4096);
        let task = tokio::spawn(answer(server));
        client
            .write_all(b"POST /v1/assign HTTP/1.1\r\nhost: relay\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(task.await.unwrap());
        assert_eq!(got, RESPONSE);
    }

    #[tokio::test]
    async fn a_client_gone_before_its_head_is_not_answered() {
        let (client, server) = tokio::io::duplex(4096);
        drop(client);
        assert!(!answer(server).await);
    }

    #[tokio::test]
    async fn admission_prefers_a_slot_then_a_permit_then_waits_for_either() {
        let slots = Arc::new(Semaphore::new(1));
        let answers = Arc::new(Semaphore::new(1));
        let s = admit(&slots, &answers).await.unwrap();
        assert!(matches!(s, Ticket::Serve(_)));
        let a = admit(&slots, &answers).await.unwrap();
        assert!(matches!(a, Ticket::Answer(_)));
        // Neither free: the next admission waits, and takes whichever frees first.
        let (s2, a2) = (slots.clone(), answers.clone());
        let waiting = tokio::spawn(async move { admit(&s2, &a2).await.unwrap() });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(a);
        assert!(matches!(waiting.await.unwrap(), Ticket::Answer(_)));
        // An answering ticket turns into a serving one when a slot freed meanwhile.
        let held = admit(&slots, &answers).await.unwrap();
        assert!(matches!(held, Ticket::Answer(_)));
        drop(s);
        assert!(matches!(upgrade(held, &slots), Ticket::Serve(_)));
        assert_eq!(answers.available_permits(), 1);
    }
}
