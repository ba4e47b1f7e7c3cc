//! The answer to a connection over the HTTP connection cap ([`HTTP_CONNECTIONS_MAX`]).
//!
//! Closing such a connection without a word leaves a reconnecting client with a network error
//! and no hint when to come back, and leaves the operator with nothing to count. So a bounded
//! few at a time ([`BUSY_ANSWERS_MAX`]) are answered `503 server_busy` with `Retry-After: 1`
//! (after the TLS handshake on a TLS listener); past that bound the socket is closed at once.
//! Both are counted in `orca_relay_http_connections_refused_total{reason}`. Answering is bounded
//! in count and time so that refusing a storm never costs more than serving it would.
//!
//! [`HTTP_CONNECTIONS_MAX`]: crate::contract::limits::HTTP_CONNECTIONS_MAX
//! [`BUSY_ANSWERS_MAX`]: crate::contract::limits::BUSY_ANSWERS_MAX

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::contract::limits::{BUSY_ANSWERS_MAX, BUSY_ANSWER_MS};
use crate::metrics::Metrics;
use crate::tls::server::Tls;

/// The counter's name; `reason` is `answered` (a 503 was sent) or `closed` (closed at once).
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

/// Answers or closes connections the accept loop has no slot for.
pub struct Busy {
    answering: Arc<Semaphore>,
    refused: IntCounterVec,
    tls: Option<Arc<Tls>>,
}

impl Busy {
    pub fn new(metrics: &Metrics, tls: Option<Arc<Tls>>) -> Busy {
        let refused = metrics.register_counter_vec(
            REFUSED_TOTAL,
            "connections over the HTTP connection cap, answered 503 server_busy or closed at once",
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

    /// Takes over `stream`; never waits, so the accept loop goes on at once.
    pub fn refuse(&self, stream: TcpStream, tasks: &TaskTracker) {
        let Ok(permit) = self.answering.clone().try_acquire_owned() else {
            self.refused.with_label_values(&["closed"]).inc();
            return;
        };
        self.refused.with_label_values(&["answered"]).inc();
        let tls = self.tls.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let work = async {
                match tls {
                    None => answer(stream).await,
                    Some(tls) => {
                        if let Some(stream) = tls.accept(stream).await {
                            answer(stream).await;
                        }
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_millis(BUSY_ANSWER_MS), work).await;
        });
    }
}

/// Reads the request head, then writes the 503 and closes. Closing with the request unread would
/// reset the connection, and a reset can destroy the answer before the client has read it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    let mut buf = [0u8; 1024];
    let mut read = 0usize;
    let mut tail = [0u8; 4];
    while read < HEAD_READ_MAX {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        read += n;
        if head_complete(&mut tail, &buf[..n]) {
            break;
        }
    }
    if stream.write_all(RESPONSE).await.is_ok() {
        let _ = stream.shutdown().await;
    }
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
        task.await.unwrap();
        assert_eq!(got, RESPONSE);
    }
}
