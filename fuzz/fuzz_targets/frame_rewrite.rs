//! The busy splice's frame rewriter (`cell::frame_rewrite`) against a byte-by-byte reading of
//! RFC 6455: the first input byte picks the limits, the rest is what a client sent.
//!
//! Properties: never panics; what it consumed is whole frames, each a final, masked, unreserved
//! binary or text frame within the limits (text valid UTF-8), and its output is exactly those
//! frames unmasked with the shortest server header; it stops for a reason the next bytes give
//! (a partial frame, a frame it does not take, the output room or the frame count).
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::cell::frame_rewrite::{rewrite, FrameLimits, Stop};

/// The next client frame by the book: (fin, rsv, opcode, masked, payload unmasked, total length),
/// or None when `b` ends inside it.
#[allow(clippy::type_complexity)]
fn frame(b: &[u8]) -> Option<(bool, u8, u8, bool, Vec<u8>, usize)> {
    if b.len() < 2 {
        return None;
    }
    let (fin, rsv, opcode) = (b[0] >> 7 == 1, (b[0] >> 4) & 7, b[0] & 15);
    let masked = b[1] >> 7 == 1;
    let (mut at, len) = match b[1] & 127 {
        126 => (4, u16::from_be_bytes(b.get(2..4)?.try_into().ok()?) as u64),
        127 => (10, u64::from_be_bytes(b.get(2..10)?.try_into().ok()?)),
        n => (2, n as u64),
    };
    let mask = if masked {
        let m = b.get(at..at + 4)?;
        at += 4;
        [m[0], m[1], m[2], m[3]]
    } else {
        [0; 4]
    };
    let len = usize::try_from(len).ok()?;
    let payload = b.get(at..at.checked_add(len)?)?;
    let plain = payload
        .iter()
        .enumerate()
        .map(|(i, x)| x ^ mask[i % 4])
        .collect();
    Some((fin, rsv, opcode, masked, plain, at + len))
}

fn server(opcode: u8, p: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    if p.len() < 126 {
        f.push(p.len() as u8);
    } else if p.len() <= 0xffff {
        f.push(126);
        f.extend_from_slice(&(p.len() as u16).to_be_bytes());
    } else {
        f.push(127);
        f.extend_from_slice(&(p.len() as u64).to_be_bytes());
    }
    f.extend_from_slice(p);
    f
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let limits = FrameLimits {
        max_payload: [0, 1, 125, 126, 300, 1 << 20][pick as usize % 6],
        max_frame: [16, 140, 1024, 8192][(pick as usize / 6) % 4],
    };
    let out_room = [usize::MAX, 0, 64, 500][(pick as usize / 24) % 4];
    let max_frames = [usize::MAX, 1, 3][(pick as usize / 96) % 3];
    let mut out = Vec::new();
    let r = rewrite(input, &mut out, &limits, out_room, max_frames);

    // Replay what it consumed, frame by frame.
    let mut want = Vec::new();
    let mut at = 0;
    let mut frames = 0u64;
    let mut bytes = 0u64;
    while at < r.consumed {
        let (fin, rsv, opcode, masked, p, n) = frame(&input[at..]).expect("consumed a whole frame");
        assert!(fin && rsv == 0 && masked && (opcode == 1 || opcode == 2));
        assert!(p.len() <= limits.max_payload && n <= limits.max_frame);
        assert!(opcode == 2 || std::str::from_utf8(&p).is_ok());
        want.extend(server(opcode, &p));
        at += n;
        frames += 1;
        bytes += p.len() as u64;
    }
    assert_eq!(at, r.consumed, "stopped inside a frame");
    assert_eq!(out, want);
    assert_eq!((r.frames, r.bytes), (frames, bytes));

    // Why it stopped.
    let rest = &input[r.consumed..];
    let takes = |(fin, rsv, opcode, masked, p, n): &(bool, u8, u8, bool, Vec<u8>, usize)| {
        *fin && *rsv == 0
            && *masked
            && (*opcode == 1 || *opcode == 2)
            && p.len() <= limits.max_payload
            && *n <= limits.max_frame
            && (*opcode == 2 || std::str::from_utf8(p).is_ok())
    };
    match r.stop {
        Stop::OutFull => assert!(out.len() >= out_room),
        Stop::Batch => assert_eq!(r.frames as usize, max_frames),
        Stop::NeedInput => {
            assert!(out.len() < out_room && (r.frames as usize) < max_frames);
            if let Some(f) = frame(rest) {
                panic!("a whole frame was left: {:?}", (f.0, f.1, f.2, f.3, f.5));
            }
        }
        Stop::Handover => {
            if let Some(f) = frame(rest) {
                assert!(!takes(&f), "handed over a frame it takes");
            }
        }
    }
});
