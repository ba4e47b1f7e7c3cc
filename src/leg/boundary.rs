//! Where the bytes a leg socket has handed to its WebSocket codec stand relative to RFC 6455
//! frames and messages, followed without buffering them.
//!
//! Why: an idle splice gives its codec state back (tungstenite's read and write buffers and its
//! waker proxies, ~2.3 KiB per socket) and rebuilds it when a byte arrives (see
//! `cell::splice`). That is only sound when the codec holds no partial frame and no open
//! fragmented message, and tungstenite cannot be asked. The socket below it can: every byte the
//! codec ever read went through [`Boundary::feed`], and when the codec then reports "no message
//! ready", the bytes it holds are exactly those after the last frame boundary seen here.
//!
//! The tracker only reads lengths and the FIN/opcode bits; a malformed stream just never reports a
//! boundary again (the codec rejects it and the splice ends).

use std::cmp::min;

/// Frame-boundary state of one byte stream (32 bytes, no allocation).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Boundary {
    /// Header bytes of the frame being started, when a read ended inside a header.
    head: [u8; MAX_HEADER],
    head_len: u8,
    /// A data frame without FIN was seen and its final continuation not yet.
    fragmented: bool,
    /// Payload bytes of the current frame still to come.
    left: u64,
}

/// 2 bytes, 8 of extended length, 4 of mask.
const MAX_HEADER: usize = 14;

/// The header length announced by its first two bytes, if there are two.
fn header_len(h: &[u8]) -> Option<usize> {
    let b = *h.get(1)?;
    let ext = match b & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if b & 0x80 != 0 { 4 } else { 0 };
    Some(2 + ext + mask)
}

impl Boundary {
    /// Follows `bytes`, the next bytes of the stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        loop {
            if self.left > 0 {
                let n = min(self.left, bytes.len() as u64);
                self.left -= n;
                bytes = &bytes[n as usize..];
            }
            if bytes.is_empty() {
                return;
            }
            if self.head_len == 0 {
                // Fast path: the whole header is in this read.
                if let Some(n) = header_len(bytes).filter(|n| *n <= bytes.len()) {
                    self.frame(&bytes[..n]);
                    bytes = &bytes[n..];
                    continue;
                }
            }
            // A header split across reads: gather it.
            let have = self.head_len as usize;
            let need = header_len(&self.head[..have]).unwrap_or(2);
            let take = min(need - have, bytes.len());
            self.head[have..have + take].copy_from_slice(&bytes[..take]);
            self.head_len += take as u8;
            bytes = &bytes[take..];
            let have = self.head_len as usize;
            if header_len(&self.head[..have]) == Some(have) {
                let head = self.head;
                self.frame(&head[..have]);
                self.head_len = 0;
            }
        }
    }

    /// A complete header `h`.
    fn frame(&mut self, h: &[u8]) {
        let fin = h[0] & 0x80 != 0;
        let opcode = h[0] & 0x0f;
        self.left = match h[1] & 0x7f {
            126 => u16::from_be_bytes([h[2], h[3]]) as u64,
            127 => u64::from_be_bytes(h[2..10].try_into().expect("8 bytes")),
            n => n as u64,
        };
        // Control frames (opcode 8..15) may sit inside a fragmented message.
        if opcode & 0x08 == 0 {
            self.fragmented = !fin;
        }
    }

    /// Every byte fed so far belongs to complete messages: nothing is half-read.
    pub fn at_message_boundary(&self) -> bool {
        self.left == 0 && self.head_len == 0 && !self.fragmented
    }
}

/// A socket that can tell whether its reader stands at a message boundary, and can shed state it
/// only needs before authentication (the pre-auth reader, `preauth_io::PreAuthIo`, implements it).
pub trait MessageBoundary {
    fn at_message_boundary(&self) -> bool;
    /// Drops what only the pre-auth phase needed (called once the socket is spliced).
    fn shed_preauth(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client frame: FIN/opcode byte, masked, with the shortest length encoding unless `long`.
    fn frame(fin: bool, opcode: u8, len: usize, long: bool) -> Vec<u8> {
        let mut f = vec![(if fin { 0x80 } else { 0 }) | opcode];
        if long {
            f.push(0x80 | 127);
            f.extend_from_slice(&(len as u64).to_be_bytes());
        } else if len < 126 {
            f.push(0x80 | len as u8);
        } else if len <= 0xffff {
            f.push(0x80 | 126);
            f.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            f.push(0x80 | 127);
            f.extend_from_slice(&(len as u64).to_be_bytes());
        }
        f.extend_from_slice(&[1, 2, 3, 4]);
        f.extend(std::iter::repeat_n(0xa5, len));
        f
    }

    /// Feeds `stream` in every split into two reads, and byte by byte, and checks the verdict after
    /// each prefix against `expect(prefix_len)`.
    fn check_all_splits(stream: &[u8], boundaries: &[usize]) {
        let at = |n: usize| boundaries.contains(&n);
        for cut in 0..=stream.len() {
            let mut b = Boundary::default();
            b.feed(&stream[..cut]);
            assert_eq!(b.at_message_boundary(), at(cut), "after {cut} bytes");
            b.feed(&stream[cut..]);
            assert_eq!(b.at_message_boundary(), at(stream.len()), "cut {cut}");
        }
        let mut b = Boundary::default();
        for (i, byte) in stream.iter().enumerate() {
            b.feed(std::slice::from_ref(byte));
            assert_eq!(b.at_message_boundary(), at(i + 1), "byte {i}");
        }
    }

    #[test]
    fn whole_frames_of_every_length_encoding() {
        let mut s = Vec::new();
        let mut ends = vec![0];
        for (len, long) in [
            (0, false),
            (5, false),
            (125, false),
            (126, false),
            (300, true),
        ] {
            s.extend(frame(true, 2, len, long));
            ends.push(s.len());
        }
        s.extend(frame(true, 1, 70_000, false));
        ends.push(s.len());
        let mut b = Boundary::default();
        b.feed(&s);
        assert!(b.at_message_boundary());
        check_all_splits(&s[..ends[5]], &ends[..6]);
    }

    #[test]
    fn fragmented_message_with_a_ping_inside_is_one_message() {
        let mut s = frame(false, 1, 3, false);
        s.extend(frame(true, 9, 2, false)); // ping between fragments
        s.extend(frame(false, 0, 4, false));
        s.extend(frame(true, 0, 1, false));
        let end = s.len();
        s.extend(frame(true, 10, 0, false)); // pong after the message
        check_all_splits(&s, &[0, end, s.len()]);
    }

    #[test]
    fn garbage_never_panics() {
        let mut b = Boundary::default();
        b.feed(&[0xff; 64]);
        b.feed(&[0x7f; 3]);
        assert!(!b.at_message_boundary());
    }
}
