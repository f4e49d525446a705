//! Header blocks the adaptor may pass without decoding them: one HEADERS frame whose fields
//! leave the HPACK dynamic table as it was and name `:authority` only by a table index.
//!
//! **Why.** Decoding every block again with h2's codec costs ~5.5k instructions a request
//! (ARCHITECTURE.md, "Libraries, and why these"), a few per cent of a write. Once a client's
//! encoder has filled its table, most of its blocks are indexed fields plus a `:path` literal
//! *without* indexing (h2's encoder never indexes a path), and such a block changes nothing
//! the adaptor keeps: the dynamic table stays as it was, so [`super::blocks::Blocks`]' decoder
//! need not see it to stay equal to the server's.
//!
//! **Why no `:authority` URL can pass unseen.** A field here names `:authority` only as an
//! indexed field: by static index 1 (an empty value) or by a dynamic entry. A literal whose
//! name is index 1, a literal name, or a dynamic name (an entry that may be `:authority`)
//! sends the block to the decoder. A dynamic entry can hold a URL `:authority` only if a
//! block inserted it, and every inserting block is decoded; the caller takes this shortcut
//! only while each of those decoded whole and held no URL (`Blocks::vouched`).
//!
//! **What it does not check.** Whether an index is in the table, a Huffman string is valid,
//! or the fields form a valid request: h2's server decodes these very bytes and refuses them
//! as it would have (a connection error ends the connection; a stream error leaves the table
//! as it was, as these representations always do).

use super::frames::{
    FrameHead, FLAG_END_HEADERS, FLAG_PADDED, FLAG_PRIORITY, FRAME_HEADER_BYTES, KIND_HEADERS,
};

/// Stream dependency (4 bytes) and weight (1) of a HEADERS frame with PRIORITY.
const PRIORITY_BYTES: usize = 5;
/// The static table's entries (RFC 7541 Appendix A); a larger index is a dynamic entry.
const STATIC_ENTRIES: usize = 61;
/// The static entry `:authority` (with an empty value).
const STATIC_AUTHORITY: usize = 1;
/// An HPACK integer longer than this many continuation bytes is not followed here.
const MAX_CONTINUATION_BYTES: usize = 4;

/// Whether `raw` (one complete header block, frames and all) is a lone HEADERS frame with
/// END_HEADERS whose fields are only indexed fields and literals not indexed (plain or never
/// indexed) under a static name other than `:authority`. Anything else, including anything
/// it cannot read, is `false`: the decoder then decides.
pub fn table_neutral(raw: &[u8]) -> bool {
    fragment(raw).is_some_and(fields_are_neutral)
}

/// The header block fragment of a lone HEADERS frame with END_HEADERS.
fn fragment(raw: &[u8]) -> Option<&[u8]> {
    let head = FrameHead::read(raw)?;
    if head.kind != KIND_HEADERS
        || head.flags & FLAG_END_HEADERS == 0
        || raw.len() != FRAME_HEADER_BYTES + head.len
    {
        return None;
    }
    let mut payload = &raw[FRAME_HEADER_BYTES..];
    if head.flags & FLAG_PADDED != 0 {
        let (&pad, rest) = payload.split_first()?;
        payload = rest.get(..rest.len().checked_sub(usize::from(pad))?)?;
    }
    if head.flags & FLAG_PRIORITY != 0 {
        payload = payload.get(PRIORITY_BYTES..)?;
    }
    Some(payload)
}

fn fields_are_neutral(block: &[u8]) -> bool {
    let mut at = 0;
    while let Some(&first) = block.get(at) {
        if first & 0x80 != 0 {
            // Indexed field (1xxxxxxx).
            if integer(block, &mut at, 7).is_none() {
                return false;
            }
        } else if first & 0xe0 == 0 {
            // Literal without indexing (0000xxxx) or never indexed (0001xxxx).
            match integer(block, &mut at, 4) {
                Some(name) if name != STATIC_AUTHORITY && (1..=STATIC_ENTRIES).contains(&name) => {}
                _ => return false,
            }
            // The value: a Huffman bit, then its length (7-bit prefix), then its bytes.
            let Some(len) = integer(block, &mut at, 7) else {
                return false;
            };
            match at.checked_add(len) {
                Some(end) if end <= block.len() => at = end,
                _ => return false,
            }
        } else {
            // Literal with incremental indexing (01xxxxxx) or a table size update (001xxxxx).
            return false;
        }
    }
    true
}

/// Reads the HPACK integer (RFC 7541 §5.1) with a `prefix`-bit prefix at `*at`, moving past it.
fn integer(block: &[u8], at: &mut usize, prefix: u32) -> Option<usize> {
    let max_prefix = (1usize << prefix) - 1;
    let mut value = usize::from(*block.get(*at)?) & max_prefix;
    *at += 1;
    if value < max_prefix {
        return Some(value);
    }
    for shift in (0..MAX_CONTINUATION_BYTES).map(|i| 7 * i) {
        let byte = *block.get(*at)?;
        *at += 1;
        value += usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], KIND_HEADERS, flags];
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// `:method POST`, `:scheme http`, dynamic 62 and 63, `:path /a` without indexing, and
    /// `user-agent: x` (static name 58, a two-byte index) never indexed.
    const NEUTRAL: &[u8] = &[
        0x83, 0x86, 0xbe, 0xbf, 0x04, 0x02, b'/', b'a', 0x1f, 0x2b, 0x01, b'x',
    ];

    #[test]
    fn indexed_fields_and_unindexed_literals_under_static_names_are_neutral() {
        assert!(table_neutral(&headers(FLAG_END_HEADERS, NEUTRAL)));
        assert!(table_neutral(&headers(FLAG_END_HEADERS, &[])));
        // A dynamic index past one byte (127 + 73 = 200).
        assert!(table_neutral(&headers(FLAG_END_HEADERS, &[0xff, 0x49])));
        // Padding and priority fields are read past.
        let mut padded = vec![3];
        padded.extend_from_slice(NEUTRAL);
        padded.extend_from_slice(&[0, 0, 0]);
        assert!(table_neutral(&headers(
            FLAG_END_HEADERS | FLAG_PADDED,
            &padded
        )));
        let mut prioritised = vec![0x80, 0, 0, 0, 15];
        prioritised.extend_from_slice(NEUTRAL);
        assert!(table_neutral(&headers(
            FLAG_END_HEADERS | FLAG_PRIORITY,
            &prioritised
        )));
    }

    #[test]
    fn anything_that_may_change_the_table_or_hide_an_authority_is_not() {
        let not = |payload: &[u8]| {
            assert!(
                !table_neutral(&headers(FLAG_END_HEADERS, payload)),
                "{payload:x?}"
            )
        };
        // Literal with incremental indexing; a size update.
        not(&[0x83, 0x44, 0x02, b'/', b'a']);
        not(&[0x20, 0x83]);
        // `:authority` by static name (plain, never indexed), a literal name, a dynamic name.
        not(&[0x01, 0x01, b'h']);
        not(&[0x11, 0x01, b'h']);
        not(&[0x00, 0x01, b'a', 0x01, b'h']);
        not(&[0x0f, 0x2f, 0x01, b'h']);
        // Cut short: in an integer, in a value; an integer too long to follow.
        not(&[0xff]);
        not(&[0x04, 0x05, b'/']);
        not(&[0xff, 0x80, 0x80, 0x80, 0x80, 0x01]);
        // Not one HEADERS frame with END_HEADERS.
        assert!(!table_neutral(&headers(0, NEUTRAL)));
        let mut two = headers(0, NEUTRAL);
        two.extend(headers(FLAG_END_HEADERS, &[]));
        assert!(!table_neutral(&two));
        let mut push = headers(FLAG_END_HEADERS, NEUTRAL);
        push[3] = 0x5;
        assert!(!table_neutral(&push));
        // Padding longer than the payload, priority cut short.
        assert!(!table_neutral(&headers(
            FLAG_END_HEADERS | FLAG_PADDED,
            &[5, 0x83]
        )));
        assert!(!table_neutral(&headers(
            FLAG_END_HEADERS | FLAG_PRIORITY,
            &[0x80, 0]
        )));
        assert!(!table_neutral(&[0, 0]));
    }
}
