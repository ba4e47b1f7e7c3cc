//! The busy splice's frame rewriter: client frames (masked) in, server frames (unmasked) out,
//! with no WebSocket codec in between. Plain functions over byte slices, tested without I/O.
//!
//! Why: at 64-byte frames a codec's per-message work (a shared buffer per payload, a message
//! value, the sink's readiness checks and waker bookkeeping) costs more than the frame itself.
//! A busy splice (see `cell::splice`) hands its two raw sockets to a loop that reads many frames
//! per `read`, rewrites them here into the other socket's output buffer, and writes that buffer
//! once. Only the common case is taken: complete, masked, unfragmented binary frames, and text
//! frames whose payload is valid UTF-8, within the leg's frame and message limits. Anything else
//! (control frames, fragments, reserved bits, an unmasked frame, an oversized or invalid one)
//! stops the rewriter *before* that frame ([`Stop::Handover`]); the splice hands the remaining
//! bytes back to a fresh codec, which treats them exactly as the codec always does (pongs, close
//! echoes, 1009, protocol errors), so the wire behaviour is the codec's in every case.

/// What the rewriter accepts from one source socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// The largest payload taken: the leg's frame and message maximum, whichever is smaller.
    pub max_payload: usize,
    /// The largest whole frame (header and payload) taken: the size of the reader's buffer,
    /// which must be able to hold any frame the rewriter waits for.
    pub max_frame: usize,
}

/// Why [`rewrite`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The input ends inside a frame (or is empty): read more.
    NeedInput,
    /// The output holds at least the room given: write it before rewriting more.
    OutFull,
    /// The frame count given was reached.
    Batch,
    /// The next frame is not one the rewriter takes: hand the input from `consumed` on to a codec.
    Handover,
}

/// The result of one [`rewrite`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rewritten {
    /// Input bytes taken (whole frames only).
    pub consumed: usize,
    pub frames: u64,
    /// Payload bytes of those frames.
    pub bytes: u64,
    pub stop: Stop,
}

/// The client frame at the start of `input`, as far as the rewriter cares.
enum Head {
    /// Not enough bytes for the header, or for the whole frame.
    Partial,
    /// Not taken (see the module doc).
    Other,
    /// A frame to forward: its opcode (1 text, 2 binary), header length, payload length, mask.
    Data {
        opcode: u8,
        header: usize,
        len: usize,
        mask: [u8; 4],
    },
}

fn head(input: &[u8], limits: &FrameLimits) -> Head {
    let (b0, b1) = match input {
        [b0, b1, ..] => (*b0, *b1),
        _ => return Head::Partial,
    };
    let fin = b0 & 0x80 != 0;
    let rsv = b0 & 0x70;
    let opcode = b0 & 0x0f;
    let masked = b1 & 0x80 != 0;
    if !fin || rsv != 0 || !masked || !(opcode == 1 || opcode == 2) {
        return Head::Other;
    }
    let (ext, len) = match b1 & 0x7f {
        126 => match input.get(2..4) {
            Some(b) => (2, u16::from_be_bytes([b[0], b[1]]) as u64),
            None => return Head::Partial,
        },
        127 => match input.get(2..10) {
            Some(b) => (8, u64::from_be_bytes(b.try_into().expect("8 bytes"))),
            None => return Head::Partial,
        },
        n => (0, n as u64),
    };
    let header: usize = 2 + ext + 4;
    let Ok(len) = usize::try_from(len) else {
        return Head::Other;
    };
    if len > limits.max_payload || header.saturating_add(len) > limits.max_frame {
        return Head::Other;
    }
    if input.len() < header + len {
        return Head::Partial;
    }
    let m = &input[header - 4..header];
    Head::Data {
        opcode,
        header,
        len,
        mask: [m[0], m[1], m[2], m[3]],
    }
}

/// Appends the server frame header (FIN, `opcode`, no mask) for a `len`-byte payload.
fn push_header(out: &mut Vec<u8>, opcode: u8, len: usize) {
    let b0 = 0x80 | opcode;
    if len < 126 {
        out.extend_from_slice(&[b0, len as u8]);
    } else if len <= 0xffff {
        let l = (len as u16).to_be_bytes();
        out.extend_from_slice(&[b0, 126, l[0], l[1]]);
    } else {
        out.push(b0);
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// XORs `data` with the repeating 4-byte `mask` (eight bytes at a time where it can).
fn unmask(data: &mut [u8], mask: [u8; 4]) {
    let m8 = u64::from_ne_bytes([
        mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3],
    ]);
    let mut chunks = data.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = u64::from_ne_bytes(c[..8].try_into().expect("8 bytes")) ^ m8;
        c.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// Rewrites the complete frames at the start of `input` into `out`, at most `max_frames` of them,
/// stopping once `out` holds `out_room` bytes or more, at a partial frame, or before a frame it does
/// not take (see [`Stop`]). A text frame whose payload is not valid UTF-8 is not taken: the codec
/// it is handed to rejects it as it always would.
pub fn rewrite(
    input: &[u8],
    out: &mut Vec<u8>,
    limits: &FrameLimits,
    out_room: usize,
    max_frames: usize,
) -> Rewritten {
    let mut r = Rewritten {
        consumed: 0,
        frames: 0,
        bytes: 0,
        stop: Stop::NeedInput,
    };
    loop {
        if out.len() >= out_room {
            r.stop = Stop::OutFull;
            return r;
        }
        if r.frames as usize >= max_frames {
            r.stop = Stop::Batch;
            return r;
        }
        let rest = &input[r.consumed..];
        let (opcode, header, len, mask) = match head(rest, limits) {
            Head::Partial => {
                r.stop = Stop::NeedInput;
                return r;
            }
            Head::Other => {
                r.stop = Stop::Handover;
                return r;
            }
            Head::Data {
                opcode,
                header,
                len,
                mask,
            } => (opcode, header, len, mask),
        };
        let frame_start = out.len();
        push_header(out, opcode, len);
        let payload_start = out.len();
        out.extend_from_slice(&rest[header..header + len]);
        unmask(&mut out[payload_start..], mask);
        if opcode == 1 && std::str::from_utf8(&out[payload_start..]).is_err() {
            out.truncate(frame_start);
            r.stop = Stop::Handover;
            return r;
        }
        r.consumed += header + len;
        r.frames += 1;
        r.bytes += len as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: FrameLimits = FrameLimits {
        max_payload: 1 << 20,
        max_frame: 64 * 1024,
    };
    const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// A client frame as a browser sends it.
    fn client(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        push_header(&mut f, opcode, payload.len());
        if !fin {
            f[0] &= 0x7f;
        }
        f[1] |= 0x80;
        f.extend_from_slice(&MASK);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
        f
    }

    /// The server frame a codec would write for the same message.
    fn server(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        push_header(&mut f, opcode, payload.len());
        f.extend_from_slice(payload);
        f
    }

    fn all(input: &[u8]) -> (Vec<u8>, Rewritten) {
        let mut out = Vec::new();
        let r = rewrite(input, &mut out, &LIMITS, usize::MAX, usize::MAX);
        (out, r)
    }

    #[test]
    fn binary_and_text_frames_of_every_length_class_come_out_unmasked() {
        for len in [0usize, 1, 7, 8, 9, 125, 126, 127, 65_535, 65_536 - 20] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let text = "é".repeat(len / 2);
            let mut input = client(true, 2, &payload);
            input.extend(client(true, 1, text.as_bytes()));
            let limits = FrameLimits {
                max_payload: 1 << 20,
                max_frame: 256 * 1024,
            };
            let mut out = Vec::new();
            let r = rewrite(&input, &mut out, &limits, usize::MAX, usize::MAX);
            let mut want = server(2, &payload);
            want.extend(server(1, text.as_bytes()));
            assert_eq!(out, want, "len {len}");
            assert_eq!(r.consumed, input.len());
            assert_eq!(r.frames, 2);
            assert_eq!(r.bytes, (payload.len() + text.len()) as u64);
            assert_eq!(r.stop, Stop::NeedInput);
        }
    }

    #[test]
    fn a_frame_split_anywhere_waits_for_the_rest() {
        let input = client(true, 2, &[9u8; 300]);
        for cut in 0..input.len() {
            let (out, r) = all(&input[..cut]);
            assert!(out.is_empty(), "cut {cut}");
            assert_eq!((r.consumed, r.frames, r.stop), (0, 0, Stop::NeedInput));
        }
    }

    #[test]
    fn frames_it_does_not_take_stop_it_before_them() {
        let ok = client(true, 2, b"data");
        let mut unmasked = server(2, b"data");
        unmasked[0] = 0x82;
        let mut rsv = client(true, 2, b"data");
        rsv[0] |= 0x40;
        let bad_text = client(true, 1, &[0xff, 0xfe]);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("ping", client(true, 9, b"p")),
            ("pong", client(true, 10, b"p")),
            ("close", client(true, 8, &[0x03, 0xe8])),
            ("first fragment", client(false, 2, b"part")),
            ("continuation", client(true, 0, b"part")),
            ("reserved opcode", client(true, 3, b"x")),
            ("reserved bit", rsv),
            ("unmasked", unmasked),
            ("invalid utf-8", bad_text),
            ("over the payload limit", client(true, 2, &[0; 1001])),
            ("over the reader's buffer", client(true, 2, &[0; 4000])),
        ];
        for (name, frame) in cases {
            let mut input = ok.clone();
            input.extend(&frame);
            input.extend(&ok);
            let limits = if name == "over the reader's buffer" {
                FrameLimits {
                    max_payload: 1 << 20,
                    max_frame: 4000,
                }
            } else {
                FrameLimits {
                    max_payload: 1000,
                    max_frame: 64 * 1024,
                }
            };
            let mut out = Vec::new();
            let r = rewrite(&input, &mut out, &limits, usize::MAX, usize::MAX);
            assert_eq!(r.stop, Stop::Handover, "{name}");
            assert_eq!(r.consumed, ok.len(), "{name}");
            assert_eq!(r.frames, 1, "{name}");
            assert_eq!(
                out,
                server(2, b"data"),
                "{name}: nothing of the frame written"
            );
        }
    }

    #[test]
    fn a_header_announcing_an_oversized_frame_is_handed_over_before_its_payload_arrives() {
        let mut head = vec![0x82, 0x80 | 127];
        head.extend_from_slice(&(u64::MAX).to_be_bytes());
        let (_, r) = all(&head);
        assert_eq!((r.consumed, r.stop), (0, Stop::Handover));
        let mut head = vec![0x82, 0x80 | 127];
        head.extend_from_slice(&(2u64 << 20).to_be_bytes());
        let (_, r) = all(&head);
        assert_eq!((r.consumed, r.stop), (0, Stop::Handover));
    }

    #[test]
    fn it_stops_at_the_output_room_and_at_the_frame_count() {
        let frame = client(true, 2, &[1u8; 64]);
        let input: Vec<u8> = frame
            .iter()
            .copied()
            .cycle()
            .take(frame.len() * 10)
            .collect();
        let mut out = Vec::new();
        let r = rewrite(&input, &mut out, &LIMITS, 100, usize::MAX);
        assert_eq!((r.frames, r.stop), (2, Stop::OutFull));
        assert_eq!(r.consumed, 2 * frame.len());
        let mut out = Vec::new();
        let r = rewrite(&input, &mut out, &LIMITS, usize::MAX, 3);
        assert_eq!((r.frames, r.stop), (3, Stop::Batch));
        let mut out = Vec::new();
        let r = rewrite(&input, &mut out, &LIMITS, usize::MAX, usize::MAX);
        assert_eq!(
            (r.frames, r.stop, r.consumed),
            (10, Stop::NeedInput, input.len())
        );
    }

    #[test]
    fn unmask_matches_the_bytewise_definition_at_every_length() {
        for len in 0..40 {
            let data: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
            let mut fast = data.clone();
            unmask(&mut fast, MASK);
            let slow: Vec<u8> = data
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ MASK[i % 4])
                .collect();
            assert_eq!(fast, slow, "len {len}");
        }
    }
}
