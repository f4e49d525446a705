//! The rule for every type Baton persists or sends to another member, and the text form of
//! the golden files that pin their bytes.
//!
//! # Why there is a rule
//! Baton writes its types with bincode: into the Raft log (`baton-raft/src/wal/`, records
//! `[len][crc][bincode(Record)]`, whose entries hold [`Command`](crate::Command)s), into
//! snapshots ([`StateMachine::snapshot`](crate::StateMachine::snapshot), whose de-duplication
//! cache holds [`Response`](crate::Response)s and so [`KvError`](crate::KvError)s), and into
//! `baton.raft.v1.PeerMessage.payload` between members (`baton-raft/src/wire.rs`). bincode
//! carries no names: an enum variant is its **position** (a `u32`, or a `u8` where a type says
//! so), a struct is its fields **in declaration order**, with nothing between them. So a
//! change that compiles and passes every round-trip test can still make every existing data
//! directory decode as other commands: a variant inserted in the middle renumbers all the
//! later ones, and two fields of one type swapped read each other's values.
//!
//! # The rule
//! For every type marked "Persisted: see [`crate::format`]":
//! - **variants are append-only**: a new variant goes at the end; none is removed, reordered
//!   or renamed into another's place (an obsolete one stays, documented as such);
//! - **fields never reorder, and none is added or removed in place**: a struct that must
//!   change gets a new, versioned form (as the snapshot body did: `SNAPSHOT_FORMAT` with
//!   `SnapshotBodyV1`..`V3` still read), or a new enum variant carries the new shape;
//! - the type of a field or a variant's payload does not change either (an `i64` is not a
//!   `u64`, a `Vec` is not an `Option`), since that too changes the bytes. Wrapping a field's
//!   type in a newtype struct (`FencingToken(i64)` for an `i64`) is not a change: bincode
//!   encodes a newtype struct as what it wraps. Nor is `#[serde(with = "serde_bytes")]` on a
//!   `Vec<u8>` (done on the hot byte fields — keys, values — because serde writes a plain
//!   `Vec<u8>` one `u8` call at a time): bincode writes bytes exactly as a sequence of `u8`s,
//!   the length and then the bytes, and the golden files pin it. Nor is holding bytes in
//!   a `SmallVec<[u8; N]>` (the key map's keys): it serializes as the same sequence.
//!
//! # How it is enforced
//! Golden bytes: one encoded value of every variant of `Command`, `Response`, `KvError`,
//! their nested enums and a snapshot are checked in as files under
//! `crates/baton-core/tests/golden/` (test `crates/baton-core/tests/it/golden.rs`); the peer
//! payloads (`LeaderRequest`/`LeaderResponse`, openraft's messages as Baton encodes them) and
//! the WAL's records are pinned the same way in `crates/baton-raft/tests/golden/` (unit tests
//! `golden` in `wire.rs` and `wal/tests.rs`). Each test enumerates its samples through an
//! exhaustive `match`, so a new variant does not compile until it has a sample and a file
//! name, and it checks that the samples' tags cover every variant (see
//! [`variant_count`]), so a variant without a sample fails. A changed file fails the test;
//! a missing one is written only with `BATON_BLESS_NEW=1` (existing files are never
//! rewritten by a test: changing pinned bytes is a decision made by hand, in review).
//!
//! # Versions
//! On top of the bytes, the log's first record and every peer envelope carry a format
//! version (`baton-raft`: `WAL_FORMAT_VERSION`, `PEER_FORMAT_VERSION`), so a binary meeting
//! a format it does not know refuses with both versions named instead of misreading it.
//!
//! This module has no I/O (the core has none): the tests read and write the files, and use
//! [`golden_text`] / [`parse_golden_text`] for their content.

use serde::de::DeserializeOwned;

/// Bytes per line of a golden file.
const BYTES_PER_LINE: usize = 16;

/// The text of a golden file: `#` comment lines (`header`, one per line) and then the bytes
/// as lowercase hex, 16 per line, each line prefixed with its offset. Hex text is diffable
/// in review: a changed byte shows as a changed line, with its offset.
pub fn golden_text(header: &str, bytes: &[u8]) -> String {
    let mut out = String::new();
    for line in header.lines() {
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!("# {} bytes\n", bytes.len()));
    for (i, chunk) in bytes.chunks(BYTES_PER_LINE).enumerate() {
        out.push_str(&format!("{:06x}:", i * BYTES_PER_LINE));
        for b in chunk {
            out.push_str(&format!(" {b:02x}"));
        }
        out.push('\n');
    }
    out
}

/// Why a golden file's text is not what [`golden_text`] writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("golden file line {line}: {reason}")]
pub struct GoldenParseError {
    /// 1-based.
    pub line: usize,
    pub reason: String,
}

/// The bytes of a golden file's text: comment lines (`#`) and blank lines are skipped, the
/// offset prefix (`000010:`) is checked, the rest is hex pairs separated by spaces. Only the
/// bytes are compared by the tests, so a header may be reworded freely.
pub fn parse_golden_text(text: &str) -> Result<Vec<u8>, GoldenParseError> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let err = |reason: String| GoldenParseError {
            line: n + 1,
            reason,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (offset, hex) = line
            .split_once(':')
            .ok_or_else(|| err("no offset prefix".into()))?;
        let offset = usize::from_str_radix(offset, 16)
            .map_err(|e| err(format!("bad offset {offset:?}: {e}")))?;
        if offset != out.len() {
            return Err(err(format!(
                "offset {offset:#x} where {:#x} was expected",
                out.len()
            )));
        }
        for pair in hex.split_whitespace() {
            let b = u8::from_str_radix(pair, 16)
                .ok()
                .filter(|_| pair.len() == 2)
                .ok_or_else(|| err(format!("bad byte {pair:?}")))?;
            out.push(b);
        }
    }
    Ok(out)
}

/// The tag bincode writes first for an enum value: its variant's position.
pub fn variant_tag(encoded: &[u8]) -> u32 {
    let tag: [u8; 4] = encoded
        .get(..4)
        .and_then(|t| t.try_into().ok())
        .expect("an encoded enum starts with a 4-byte tag");
    u32::from_le_bytes(tag)
}

/// How many variants enum `T` has, as its decoder sees them: the first tag whose decoding
/// fails as an *unknown variant* (a known one decodes, or runs out of input for its fields).
/// A golden test compares its samples' tags with this, so a variant without a sample fails
/// at run time even where the compiler cannot tell (a sample list is not a `match`).
pub fn variant_count<T: DeserializeOwned>() -> u32 {
    (0..=u32::MAX)
        .find(|tag| match bincode::deserialize::<T>(&tag.to_le_bytes()) {
            Ok(_) => false,
            Err(e) => matches!(*e, bincode::ErrorKind::Custom(_)),
        })
        .expect("an enum has fewer than u32::MAX variants")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_text_roundtrips() {
        let bytes: Vec<u8> = (0..=40).collect();
        let text = golden_text("Command::Noop\nsecond line", &bytes);
        assert!(text.starts_with("# Command::Noop\n# second line\n# 41 bytes\n000000: 00 01"));
        assert_eq!(parse_golden_text(&text).unwrap(), bytes);
        assert_eq!(parse_golden_text(&golden_text("empty", &[])).unwrap(), []);
        let skipped = "000000: 01\n000002: 02\n";
        assert_eq!(parse_golden_text(skipped).unwrap_err().line, 2);
        assert!(parse_golden_text("000000: 1\n").is_err());
    }

    /// Unit, tuple and struct variants alike; a local enum, so adding a variant to a real
    /// one does not touch this test.
    #[test]
    fn variant_count_counts_the_decoder_s_variants() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        enum Three {
            Unit,
            Tuple(u64, String),
            Struct { a: Vec<u8> },
        }
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        enum One {
            Only,
        }
        assert_eq!(variant_count::<Three>(), 3);
        assert_eq!(variant_count::<One>(), 1);
    }
}
