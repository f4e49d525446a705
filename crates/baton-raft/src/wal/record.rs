//! The record format: `[len u32 LE][crc32(len ‖ payload) u32 LE][payload = bincode(Record)]`,
//! encoded and decoded without any I/O, so the parser can be fed any bytes (see the
//! property test below).
//!
//! # Format version
//! The first record of every generation written by this code is `FormatVersion(2)`
//! ([`WAL_FORMAT_VERSION`]). A generation that starts with `GenerationStart` instead was
//! written before versions existed: format 1, whose records are the same, read as they are.
//! Such a generation is extended with records as usual and carries a version only once a
//! rewrite replaces it. Recovery refuses a generation whose version is above what this binary
//! knows (`StartError::UnsupportedLogFormat`, naming both) instead of misreading it. So the
//! version record's encoding is the one thing every future format keeps: `Record` tag 5 and a
//! `u32`, as the very first record. (A binary from before versions meets tag 5 at offset 0
//! and refuses the file as a bad generation header: a downgrade is refused, never misread.)
//! The record types themselves follow `baton_core::format` and are pinned by
//! `wal::tests::golden_records`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::types::{LogId, RaftEntry};

pub(crate) const RECORD_HEADER_BYTES: usize = 8;
/// No record is bigger: a length above this is corruption, not data. An entry is at most
/// `MAX_REQUEST_BYTES` (1.5 MiB) plus overhead, and entries records are split well below this.
pub(crate) const MAX_RECORD_BYTES: usize = 64 << 20;
// The size chain's last link (its others are in wire.rs): whatever a peer message carries
// (an entry, at most one proposal batch) fits in one WAL record.
const _: () = assert!(crate::wire::MAX_PEER_MESSAGE_BYTES <= MAX_RECORD_BYTES);

/// The log format this binary writes (see the module docs): 1 = generations without a
/// version record (before versions existed), 2 = a `FormatVersion` record first. Bump it when
/// a record changes in a way an older binary would misread.
pub(crate) const WAL_FORMAT_VERSION: u32 = 2;
/// The format of a generation that starts without a version record.
pub(crate) const WAL_FORMAT_UNVERSIONED: u32 = 1;

/// What a record says. Decoding side; see [`RecordRef`] for the encoding side. Persisted:
/// variants append-only (`baton_core::format`).
#[derive(Debug, Deserialize)]
pub(crate) enum Record {
    /// First record of every generation: the log is empty after `purged`.
    GenerationStart {
        purged: Option<LogId>,
        committed: Option<LogId>,
    },
    /// Consecutive entries appended after the current last one.
    Entries(Vec<RaftEntry>),
    /// Entries with index `>=` this are removed (a follower's conflicting suffix).
    TruncateSince(u64),
    /// Entries up to and including this id are removed (covered by a snapshot).
    PurgeUpto(LogId),
    /// openraft's committed pointer (optional state; lets a restart apply before an election).
    Committed(Option<LogId>),
    /// The generation's log format ([`WAL_FORMAT_VERSION`]); only ever its very first record,
    /// before `GenerationStart`. Absent in format 1.
    FormatVersion(u32),
}

/// Encoding twin of [`Record`] that borrows the entries. Same variants in the same order, so
/// bincode produces identical bytes (a unit test checks).
#[derive(Debug, Serialize)]
pub(crate) enum RecordRef<'a> {
    GenerationStart {
        purged: Option<LogId>,
        committed: Option<LogId>,
    },
    Entries(&'a [RaftEntry]),
    TruncateSince(u64),
    PurgeUpto(LogId),
    Committed(Option<LogId>),
    FormatVersion(u32),
}

impl Record {
    /// The encoding twin of this record (tests: a decoded record is encoded again).
    #[cfg(test)]
    pub(crate) fn as_ref(&self) -> RecordRef<'_> {
        match self {
            Record::GenerationStart { purged, committed } => RecordRef::GenerationStart {
                purged: *purged,
                committed: *committed,
            },
            Record::Entries(v) => RecordRef::Entries(v),
            Record::TruncateSince(i) => RecordRef::TruncateSince(*i),
            Record::PurgeUpto(id) => RecordRef::PurgeUpto(*id),
            Record::Committed(c) => RecordRef::Committed(*c),
            Record::FormatVersion(v) => RecordRef::FormatVersion(*v),
        }
    }
}

/// Why the bytes at some offset are not a valid record. Its `Display` is the reason a
/// `StartError::CorruptLog` or a failed read-back names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RecordError {
    /// Fewer bytes than a header.
    ShortHeader { present: usize },
    /// Zero, or above [`MAX_RECORD_BYTES`].
    BadLength(u32),
    /// The header announces more payload than there is.
    Short { announced: u32, present: usize },
    /// The checksum does not match the length and payload.
    Crc,
    /// The checksum matches but the payload is no `Record`.
    Undecodable(String),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::ShortHeader { present } => {
                write!(f, "truncated record header ({present} bytes)")
            }
            RecordError::BadLength(len) => write!(f, "implausible record length {len}"),
            RecordError::Short { announced, present } => write!(
                f,
                "truncated record: {announced} bytes announced, {present} present"
            ),
            RecordError::Crc => f.write_str("record checksum mismatch"),
            RecordError::Undecodable(e) => write!(f, "undecodable record: {e}"),
        }
    }
}

fn record_crc(len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends one framed record to `out`.
pub(crate) fn encode_record(out: &mut Vec<u8>, rec: &RecordRef<'_>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER_BYTES]);
    bincode::serialize_into(&mut *out, rec).expect("log records always serialize");
    let len = (out.len() - start - RECORD_HEADER_BYTES) as u32;
    let crc = record_crc(len, &out[start + RECORD_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the record at the start of `bytes`: the record and how many bytes it took, or
/// why it is not valid. Never panics, whatever the bytes.
pub(crate) fn decode_record(bytes: &[u8]) -> Result<(Record, usize), RecordError> {
    let Some((header, rest)) = bytes.split_first_chunk::<RECORD_HEADER_BYTES>() else {
        return Err(RecordError::ShortHeader {
            present: bytes.len(),
        });
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    // Length 0 is never written (every payload has an enum tag); rejecting it matters because
    // a zero-filled tail (preallocated or lost pages) would otherwise parse as valid records.
    if len == 0 || len as usize > MAX_RECORD_BYTES {
        return Err(RecordError::BadLength(len));
    }
    let Some(payload) = rest.get(..len as usize) else {
        return Err(RecordError::Short {
            announced: len,
            present: rest.len(),
        });
    };
    if record_crc(len, payload) != crc {
        return Err(RecordError::Crc);
    }
    let rec = bincode::deserialize(payload).map_err(|e| RecordError::Undecodable(e.to_string()))?;
    Ok((rec, RECORD_HEADER_BYTES + len as usize))
}

/// Decodes the record at offset `pos` of `bytes`: the record and the offset after it.
pub(crate) fn parse_record(bytes: &[u8], pos: usize) -> Result<(Record, usize), RecordError> {
    let rest = bytes.get(pos..).unwrap_or_default();
    decode_record(rest).map(|(rec, n)| (rec, pos + n))
}

/// The first offset at or after `from` where a valid record starts, if any. Only used after a
/// bad record, to tell a torn tail (nothing valid follows) from corruption in the middle.
pub(crate) fn find_valid_record_after(bytes: &[u8], from: usize) -> Option<usize> {
    (from..bytes.len().saturating_sub(RECORD_HEADER_BYTES))
        .find(|&off| parse_record(bytes, off).is_ok())
}

/// The encoded size of an entry (the live/dead byte accounting and the snapshot trigger).
pub(crate) fn entry_size(e: &RaftEntry) -> u64 {
    bincode::serialized_size(e).expect("log entries always serialize")
}

#[cfg(test)]
mod tests {
    use baton_core::Command;
    use openraft::{EntryPayload, LeaderId};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::types::Request;

    fn entry(term: u64, index: u64, commands: Vec<Command>) -> RaftEntry {
        RaftEntry {
            log_id: LogId::new(LeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Request {
                time_ms: index,
                commands,
            }),
        }
    }

    fn framed(rec: &RecordRef<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_record(&mut out, rec);
        out
    }

    /// A random valid record of each kind, entries with random puts.
    fn random_record(rng: &mut StdRng) -> Vec<u8> {
        let id = |rng: &mut StdRng| LogId::new(LeaderId::new(rng.gen_range(0..9), 1), rng.gen());
        let n = rng.gen_range(1..5);
        let entries: Vec<RaftEntry> = (0..n)
            .map(|i| {
                let value_len = rng.gen_range(0..300);
                let put = Command::Put(baton_core::PutRequest {
                    key: format!("k{i}").into_bytes(),
                    value: (0..value_len).map(|_| rng.gen()).collect(),
                    ..Default::default()
                });
                entry(1, i, vec![put, Command::Noop])
            })
            .collect();
        let rec = match rng.gen_range(0..6) {
            0 => RecordRef::GenerationStart {
                purged: Some(id(rng)),
                committed: rng.gen::<bool>().then(|| id(rng)),
            },
            1 => RecordRef::Entries(&entries),
            2 => RecordRef::TruncateSince(rng.gen()),
            3 => RecordRef::PurgeUpto(id(rng)),
            4 => RecordRef::Committed(rng.gen::<bool>().then(|| id(rng))),
            _ => RecordRef::FormatVersion(rng.gen()),
        };
        framed(&rec)
    }

    /// Decodes `bytes`; if that succeeds the record must be exactly `original` again (the
    /// same bytes when encoded, consuming exactly its frame).
    fn same_or_refused(bytes: &[u8], original: &[u8]) -> Result<(), String> {
        match decode_record(bytes) {
            Err(_) => Ok(()),
            Ok((rec, n)) if n == original.len() && framed(&rec.as_ref()) == original => Ok(()),
            Ok((rec, n)) => Err(format!("decoded to another record ({n} bytes): {rec:?}")),
        }
    }

    /// The parser as a fuzz target, with a fixed seed so that it is an ordinary unit test:
    /// random bytes, every truncation and random bit flips of valid records, and valid frames
    /// around random payloads never panic, and a damaged record never decodes to a record
    /// other than the one written.
    #[test]
    fn the_parser_survives_random_and_damaged_bytes() {
        let mut rng = StdRng::seed_from_u64(0x5eed_ba70);
        for _ in 0..2000 {
            let len = rng.gen_range(0..64);
            let noise: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let _ = decode_record(&noise);
        }
        for round in 0..300 {
            let rec = random_record(&mut rng);
            let (back, n) = decode_record(&rec).expect("a valid record decodes");
            assert_eq!(n, rec.len());
            assert_eq!(framed(&back.as_ref()), rec, "round {round}");
            // Every strict prefix is refused as short (a torn write).
            for cut in 0..rec.len() {
                match decode_record(&rec[..cut]) {
                    Err(RecordError::ShortHeader { .. } | RecordError::Short { .. }) => {}
                    other => panic!("round {round}, cut at {cut}: {other:?}"),
                }
            }
            // Bytes after a record do not change it.
            let mut longer = rec.clone();
            longer.extend((0..rng.gen_range(1..32)).map(|_| rng.gen::<u8>()));
            let (_, n) = decode_record(&longer).expect("trailing bytes are the next record's");
            assert_eq!(n, rec.len());
            // Bit flips, one to a few, anywhere in the frame.
            for _ in 0..40 {
                let mut bad = rec.clone();
                for _ in 0..rng.gen_range(1..4) {
                    let bit = rng.gen_range(0..bad.len() * 8);
                    bad[bit / 8] ^= 1 << (bit % 8);
                }
                if bad != rec {
                    if let Err(e) = same_or_refused(&bad, &rec) {
                        panic!("round {round}: {e}");
                    }
                }
            }
            // A valid frame around a mangled payload reaches the decoder proper: refused as
            // undecodable or decoded, never a panic.
            let mut payload = rec[RECORD_HEADER_BYTES..].to_vec();
            for _ in 0..rng.gen_range(1..8) {
                let at = rng.gen_range(0..payload.len());
                payload[at] = rng.gen();
            }
            if rng.gen_range(0..4) == 0 {
                payload.truncate(rng.gen_range(1..=payload.len()));
            }
            let len = payload.len() as u32;
            let mut reframed = len.to_le_bytes().to_vec();
            reframed.extend_from_slice(&record_crc(len, &payload).to_le_bytes());
            reframed.extend_from_slice(&payload);
            match decode_record(&reframed) {
                Ok((_, n)) => assert_eq!(n, reframed.len()),
                Err(RecordError::Undecodable(_)) => {}
                Err(e) => panic!("round {round}: a valid frame refused as {e}"),
            }
        }
    }

    #[test]
    fn each_error_names_what_is_wrong() {
        let rec = framed(&RecordRef::TruncateSince(7));
        assert_eq!(
            decode_record(&rec[..3]).unwrap_err(),
            RecordError::ShortHeader { present: 3 }
        );
        assert_eq!(
            decode_record(&[0u8; 16]).unwrap_err(),
            RecordError::BadLength(0)
        );
        let mut huge = rec.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_record(&huge).unwrap_err(),
            RecordError::BadLength(u32::MAX)
        );
        assert!(matches!(
            decode_record(&rec[..rec.len() - 1]).unwrap_err(),
            RecordError::Short { .. }
        ));
        let mut flipped = rec.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode_record(&flipped).unwrap_err(), RecordError::Crc);
        // Tag 99 with a valid frame.
        let payload = 99u32.to_le_bytes();
        let mut unknown = 4u32.to_le_bytes().to_vec();
        unknown.extend_from_slice(&record_crc(4, &payload).to_le_bytes());
        unknown.extend_from_slice(&payload);
        assert!(matches!(
            decode_record(&unknown).unwrap_err(),
            RecordError::Undecodable(_)
        ));
        assert_eq!(RecordError::Crc.to_string(), "record checksum mismatch");
    }
}
