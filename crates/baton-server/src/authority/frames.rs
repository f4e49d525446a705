//! Where the units of a client's HTTP/2 byte stream begin and end, without copying them: the
//! connection preface, frames that pass as they are, and header blocks (a HEADERS or
//! PUSH_PROMISE frame and the CONTINUATION frames up to END_HEADERS), which the adaptor must
//! see whole before it lets any byte of them go.
//!
//! Sans-IO: [`Frames::step`] looks at the bytes not yet released and says what the first of
//! them is. It keeps only what a split read cannot show again: how much of the preface
//! matched and how much of a passing frame's payload is still to come.

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Every frame starts with 9 bytes: length (24 bits), type, flags, stream id.
pub const FRAME_HEADER_BYTES: usize = 9;
pub const KIND_HEADERS: u8 = 0x1;
pub const KIND_PUSH_PROMISE: u8 = 0x5;
pub const KIND_CONTINUATION: u8 = 0x9;
pub const FLAG_END_HEADERS: u8 = 0x4;
/// HEADERS: a pad-length byte opens the payload and that many bytes of padding close it.
pub const FLAG_PADDED: u8 = 0x8;
/// HEADERS: stream dependency and weight (5 bytes) follow the pad length.
pub const FLAG_PRIORITY: u8 = 0x20;

/// What the bytes at the front of the unreleased input are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The first `n` bytes pass unchanged (preface, or frames that carry no header block).
    Pass(usize),
    /// The first `n` bytes are one complete header block, frames and all.
    Block(usize),
    /// The front is an unfinished unit (a frame header, or a header block): at least `n`
    /// more bytes are needed to finish the frame being read.
    More(usize),
    /// The connection does not start with the HTTP/2 preface: nothing to follow.
    NotHttp2,
    /// A header block that h2 itself refuses as a connection error before decoding it
    /// (another frame inside the block, a frame over the size limit, a CONTINUATION flood).
    Malformed,
}

/// The frame follower of one connection.
#[derive(Debug)]
pub struct Frames {
    /// Preface bytes matched so far.
    preface: usize,
    /// Payload bytes of the passing frame still to come.
    passing: usize,
    /// The largest frame payload the server accepts (its SETTINGS_MAX_FRAME_SIZE).
    max_frame: usize,
    /// The most CONTINUATION frames without END_HEADERS that h2 accepts in one block.
    max_continuations: usize,
}

impl Frames {
    pub fn new(max_frame: usize, max_continuations: usize) -> Self {
        Frames {
            preface: 0,
            passing: 0,
            max_frame,
            max_continuations,
        }
    }

    /// Classifies the front of `bytes` (never empty). A `Pass` is taken as released: the
    /// caller must not show those bytes again.
    pub fn step(&mut self, bytes: &[u8]) -> Step {
        debug_assert!(!bytes.is_empty());
        if self.preface < PREFACE.len() {
            let want = &PREFACE[self.preface..];
            let n = want.len().min(bytes.len());
            if bytes[..n] != want[..n] {
                return Step::NotHttp2;
            }
            self.preface += n;
            return Step::Pass(n);
        }
        if self.passing > 0 {
            let n = self.passing.min(bytes.len());
            self.passing -= n;
            return Step::Pass(n);
        }
        let Some(head) = FrameHead::read(bytes) else {
            return Step::More(FRAME_HEADER_BYTES - bytes.len());
        };
        if head.kind != KIND_HEADERS && head.kind != KIND_PUSH_PROMISE {
            // Everything else, a stray CONTINUATION included (h2 refuses that itself).
            let n = (FRAME_HEADER_BYTES + head.len).min(bytes.len());
            self.passing = FRAME_HEADER_BYTES + head.len - n;
            return Step::Pass(n);
        }
        self.block(bytes, head)
    }

    /// Walks the frames of the header block that starts `bytes`.
    fn block(&self, bytes: &[u8], first: FrameHead) -> Step {
        let mut at = 0;
        let mut head = first;
        let mut continuations = 0;
        loop {
            if head.len > self.max_frame {
                return Step::Malformed;
            }
            let end = at + FRAME_HEADER_BYTES + head.len;
            if bytes.len() < end {
                return Step::More(end - bytes.len());
            }
            if head.flags & FLAG_END_HEADERS != 0 {
                return Step::Block(end);
            }
            // h2 counts the CONTINUATION frames that do not end the block.
            if head.kind == KIND_CONTINUATION {
                continuations += 1;
                if continuations > self.max_continuations {
                    return Step::Malformed;
                }
            }
            at = end;
            head = match FrameHead::read(&bytes[at..]) {
                None => return Step::More(at + FRAME_HEADER_BYTES - bytes.len()),
                Some(h) if h.kind == KIND_CONTINUATION && h.stream == first.stream => h,
                Some(_) => return Step::Malformed,
            };
        }
    }
}

/// A frame's 9-byte header.
#[derive(Debug, Clone, Copy)]
pub struct FrameHead {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl FrameHead {
    /// The header at the front of `bytes`, if all 9 bytes are there.
    pub fn read(bytes: &[u8]) -> Option<FrameHead> {
        let h: &[u8; FRAME_HEADER_BYTES] = bytes.get(..FRAME_HEADER_BYTES)?.try_into().ok()?;
        Some(FrameHead {
            len: u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize,
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn frames() -> Frames {
        let mut f = Frames::new(16_384, 80);
        assert_eq!(f.step(PREFACE), Step::Pass(24));
        f
    }

    #[test]
    fn the_preface_passes_in_pieces_and_anything_else_is_not_http2() {
        let mut f = Frames::new(16_384, 80);
        assert_eq!(f.step(&PREFACE[..5]), Step::Pass(5));
        assert_eq!(f.step(&PREFACE[5..]), Step::Pass(19));
        let mut g = Frames::new(16_384, 80);
        assert_eq!(g.step(b"POST /v3/kv/range HTTP/1.1\r\n"), Step::NotHttp2);
        let mut h = Frames::new(16_384, 80);
        assert_eq!(h.step(b"PRI * HTTP/1.1"), Step::NotHttp2);
    }

    #[test]
    fn other_frames_pass_across_reads() {
        let mut f = frames();
        let data = frame(0x0, 0, 1, &[7; 100]);
        assert_eq!(f.step(&data[..4]), Step::More(5));
        assert_eq!(f.step(&data[..50]), Step::Pass(50));
        assert_eq!(f.step(&data[50..]), Step::Pass(59));
        let settings = frame(0x4, 0, 0, &[]);
        assert_eq!(f.step(&settings), Step::Pass(9));
    }

    #[test]
    fn a_header_block_is_whole_only_at_end_headers() {
        let mut f = frames();
        let mut block = frame(KIND_HEADERS, 0, 3, &[1, 2, 3]);
        block.extend(frame(KIND_CONTINUATION, 0, 3, &[4]));
        block.extend(frame(KIND_CONTINUATION, FLAG_END_HEADERS, 3, &[5, 6]));
        let total = block.len();
        block.extend(frame(0x0, 1, 3, b"data"));
        for cut in 0..total {
            let step = f.step(&block[..cut.max(1)]);
            assert!(
                matches!(step, Step::More(n) if n > 0),
                "cut {cut}: {step:?}"
            );
        }
        assert_eq!(f.step(&block), Step::Block(total));
    }

    #[test]
    fn refusals_h2_makes_before_decoding_are_malformed() {
        let mut f = frames();
        let mut other = frame(KIND_HEADERS, 0, 3, &[1]);
        other.extend(frame(0x0, 0, 3, b"x"));
        assert_eq!(f.step(&other), Step::Malformed);
        let mut wrong_stream = frame(KIND_HEADERS, 0, 3, &[1]);
        wrong_stream.extend(frame(KIND_CONTINUATION, FLAG_END_HEADERS, 5, &[2]));
        assert_eq!(f.step(&wrong_stream), Step::Malformed);
        let big = frame(KIND_HEADERS, FLAG_END_HEADERS, 1, &vec![0; 16_385]);
        assert_eq!(f.step(&big), Step::Malformed);
        let mut flood = frame(KIND_HEADERS, 0, 1, &[]);
        for _ in 0..81 {
            flood.extend(frame(KIND_CONTINUATION, 0, 1, &[]));
        }
        assert_eq!(f.step(&flood), Step::Malformed);
    }
}
