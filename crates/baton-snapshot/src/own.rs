//! Baton's own snapshot as a file in etcd's layout (a member's `member/snap/db`): the
//! buckets of an `etcdctl snapshot save` file (no SHA-256 trailer: etcd's own backend file
//! has none) plus a `baton` bucket with what etcd's buckets cannot carry:
//!
//! | key | value |
//! |---|---|
//! | `format` | [`OWN_FORMAT`], u32 big-endian |
//! | `kv_sha256` | SHA-256 over the `key` bucket's entries as written ([`KvHasher`]) |
//! | `raft` | CRC-32C (u32 big-endian) then the caller's bytes (baton-raft: the Raft snapshot meta) |
//! | `tables` | `StateMachine::tables_snapshot()` (its own format byte and CRC): everything of the state but the key space |
//!
//! What Baton reads back: the `key` bucket (the key space, through `Importer`) and the
//! `baton` bucket. The other buckets (`lease`, `auth*`, `alarm`, `members`, `meta`,
//! `cluster`) are written only for etcd's tools (`bbolt`, `etcdctl snapshot status`, an
//! `etcdctl snapshot restore` of a copy): the tables carry the same data with Baton's
//! precision (lease checkpoints in milliseconds, simple-token state).
//!
//! Why the key space is etcd's bucket and not inside `tables`: so that the file *is* the
//! member's state in etcd's layout, and an edit of it (etcd's `TestEtcdCorruptHash` rewrites
//! values with bbolt) is what the member starts from. bbolt has no checksums on its pages, so
//! the `kv_sha256` is the only one over the key space: a mismatch is reported to the caller
//! ([`KvChecksum::Mismatch`]), who decides (baton-raft refuses to serve it unless the
//! initial corruption check will compare it with the peers).

use std::io::{Seek, Write};

use baton_bbolt::{Db, ReadAt, Writer, DEFAULT_PAGE_SIZE};
use baton_core::{Importer, StateMachine, Tables};
use sha2::{Digest, Sha256};

use crate::export::SnapshotSource;
use crate::import::{read_key_bucket, ReadError};
use crate::layout;

/// The version of the `baton` bucket's layout (the table above).
pub const OWN_FORMAT: u32 = 1;

const FORMAT_KEY: &[u8] = b"format";
const KV_SHA256_KEY: &[u8] = b"kv_sha256";
const RAFT_KEY: &[u8] = b"raft";
const TABLES_KEY: &[u8] = b"tables";

/// SHA-256 over `key` bucket entries, each as `len(key) u32 BE, key, len(value) u32 BE,
/// value`, in bucket order (the lengths keep one entry's bytes from passing for another's).
#[derive(Default)]
struct KvHasher(Sha256);

impl KvHasher {
    fn entry(&mut self, key: &[u8], value: &[u8]) {
        self.0.update((key.len() as u32).to_be_bytes());
        self.0.update(key);
        self.0.update((value.len() as u32).to_be_bytes());
        self.0.update(value);
    }

    fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// A Baton snapshot to be written as `member/snap/db`, in one pass over the frozen state
/// ([`SnapshotSource`]) into a file.
pub struct OwnSnapshot {
    source: SnapshotSource,
    /// The `baton` bucket, in key order (the writer takes a bucket's entries sorted).
    bucket: Vec<(&'static [u8], Vec<u8>)>,
    /// Whether `kv_sha256` is computed as the `key` bucket is written (always, but in a
    /// test that writes a bucket as given, as an edit of the file would leave it).
    compute_kv_sha256: bool,
}

/// Where `kv_sha256` is in the bucket (entries in key order).
const KV_SHA256_AT: usize = 1;

impl OwnSnapshot {
    /// `raft` is the caller's record of where the state is in its log (opaque here; stored
    /// with a CRC-32C).
    pub fn new(source: SnapshotSource, raft: &[u8]) -> OwnSnapshot {
        let mut raft_value = crc32c::crc32c(raft).to_be_bytes().to_vec();
        raft_value.extend_from_slice(raft);
        let bucket = vec![
            (FORMAT_KEY, OWN_FORMAT.to_be_bytes().to_vec()),
            (KV_SHA256_KEY, vec![0; 32]),
            (RAFT_KEY, raft_value),
            (TABLES_KEY, source.state.tables_snapshot()),
        ];
        debug_assert_eq!(bucket[KV_SHA256_AT].0, KV_SHA256_KEY);
        OwnSnapshot {
            source,
            bucket,
            compute_kv_sha256: true,
        }
    }

    /// The bbolt bytes into `out` (an empty file), in one pass: the `key` bucket's checksum
    /// goes into the `baton` bucket, which precedes it in the file, so its value is reserved
    /// there and filled in once the `key` bucket is written (the key space is encoded once).
    /// Returns the file's size and `out`.
    pub fn write<W: Write + Seek>(&self, out: W) -> Result<(u64, W), baton_bbolt::Error> {
        let mut w = Writer::seekable(out, DEFAULT_PAGE_SIZE)?;
        let mut kv_sha256 = None;
        let mut hasher = KvHasher::default();
        self.source.buckets(
            &mut w,
            &mut |w| {
                w.begin_bucket(layout::BATON)?;
                for (i, (k, v)) in self.bucket.iter().enumerate() {
                    if i == KV_SHA256_AT && self.compute_kv_sha256 {
                        kv_sha256 = Some(w.put_placeholder(k, v.len())?);
                    } else {
                        w.put(k, v)?;
                    }
                }
                w.end_bucket()
            },
            &mut |k, v| hasher.entry(k, v),
        )?;
        if let Some(placeholder) = kv_sha256 {
            w.fill(placeholder, &hasher.finish())?;
        }
        let (layout, out) = w.finish_seekable()?;
        Ok((layout.file_bytes(), out))
    }
}

/// Whether the `key` bucket still is what Baton wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvChecksum {
    Matches,
    /// The `key` bucket was changed after Baton wrote the file (hex digests).
    Mismatch {
        stored: String,
        computed: String,
    },
}

/// Baton's own snapshot, read back.
pub struct OwnLoaded {
    pub state: StateMachine,
    /// What the writer gave as `raft`, its CRC verified.
    pub raft: Vec<u8>,
    pub kv_checksum: KvChecksum,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `db` is Baton's own snapshot (has the `baton` bucket), not etcd's backend or an
/// `etcdctl snapshot restore` of one.
pub fn is_own<R: ReadAt>(db: &Db<R>) -> Result<bool, baton_bbolt::Error> {
    Ok(db.bucket(layout::BATON)?.is_some())
}

/// Reads Baton's own snapshot: the `baton` bucket, then the `key` bucket into the key space
/// (checksummed as it is read), the two joined by `Importer::finish_with_tables` with every
/// invariant checked. A key space that does not import *and* fails its checksum is
/// [`ReadError::KvChecksum`] (the edit is the likelier story); one that imports but fails it
/// is returned with [`KvChecksum::Mismatch`] for the caller to decide.
pub fn read_own<R: ReadAt>(
    db: &Db<R>,
    progress: &mut dyn FnMut(u64),
) -> Result<OwnLoaded, ReadError> {
    let own = db
        .bucket(layout::BATON)?
        .ok_or_else(|| ReadError::Own("no `baton` bucket: not a snapshot Baton wrote".into()))?;
    let mut values: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    db.for_each(&own, "baton", &mut |k, v, _| {
        values.push((k.to_vec(), v.to_vec()));
        Ok(())
    })?;
    let get = |key: &[u8]| {
        values
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
            .ok_or_else(|| {
                ReadError::Own(format!(
                    "the `baton` bucket has no {:?}",
                    String::from_utf8_lossy(key)
                ))
            })
    };
    let format = get(FORMAT_KEY)?;
    if format != OWN_FORMAT.to_be_bytes() {
        return Err(ReadError::Own(format!(
            "`baton` bucket format {format:?}; this Baton reads format {OWN_FORMAT} (a newer \
             Baton wrote it?)"
        )));
    }
    let stored: [u8; 32] = get(KV_SHA256_KEY)?
        .try_into()
        .map_err(|_| ReadError::Own("`kv_sha256` is not 32 bytes".into()))?;
    let raft = get(RAFT_KEY)?;
    if raft.len() < 4 || crc32c::crc32c(&raft[4..]).to_be_bytes() != raft[..4] {
        return Err(ReadError::Own("`raft` fails its checksum".into()));
    }
    let raft = raft[4..].to_vec();
    let tables = Tables::decode(get(TABLES_KEY)?).map_err(|e| ReadError::Own(e.to_string()))?;

    let key_bucket = db
        .bucket(layout::KEY)?
        .ok_or_else(|| ReadError::Own("no `key` bucket".into()))?;
    let mut im = Importer::compacted_at(tables.compact_revision());
    let mut hasher = KvHasher::default();
    let imported = read_key_bucket(
        db,
        &key_bucket,
        &mut im,
        &mut |k, v| hasher.entry(k, v),
        progress,
    )
    .and_then(|_| Ok(im.finish_with_tables(tables)?));
    // Hash whatever the import did not read (it stops at the first bad entry).
    let computed = match &imported {
        Ok(_) => hasher.finish(),
        Err(_) => {
            let mut full = KvHasher::default();
            db.for_each(&key_bucket, "key", &mut |k, v, _| {
                full.entry(k, v);
                Ok(())
            })?;
            full.finish()
        }
    };
    let kv_checksum = if computed == stored {
        KvChecksum::Matches
    } else {
        KvChecksum::Mismatch {
            stored: hex(&stored),
            computed: hex(&computed),
        }
    };
    let state = match (imported, &kv_checksum) {
        (Ok((state, _)), _) => state,
        (Err(e), KvChecksum::Mismatch { .. }) => {
            return Err(ReadError::KvChecksum(e.to_string()));
        }
        (Err(e), KvChecksum::Matches) => return Err(e),
    };
    Ok(OwnLoaded {
        state,
        raft,
        kv_checksum,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::{CommandIndex, Entry, LeaseId, PutRequest, Term};

    fn state(values: &[(&str, &str)]) -> StateMachine {
        let mut sm = StateMachine::new();
        let mut index = 0;
        let mut apply = |sm: &mut StateMachine, command| {
            sm.apply(&Entry {
                index: CommandIndex(index),
                term: Term(3),
                time_ms: 10 + index,
                command,
            });
            index += 1;
        };
        apply(
            &mut sm,
            baton_core::Command::LeaseGrant {
                id: LeaseId(0x42),
                ttl_s: 60,
            },
        );
        for (i, (k, v)) in values.iter().enumerate() {
            let put = PutRequest {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
                lease: LeaseId(if i == 0 { 0x42 } else { 0 }),
                ..PutRequest::default()
            };
            apply(&mut sm, baton_core::Command::Put(put));
        }
        sm
    }

    fn source(sm: &StateMachine) -> SnapshotSource {
        SnapshotSource {
            state: sm.clone(),
            consistent_index: 7,
            members: Vec::new(),
        }
    }

    fn bytes(own: &OwnSnapshot) -> Vec<u8> {
        let (size, out) = own.write(std::io::Cursor::new(Vec::new())).unwrap();
        let out = out.into_inner();
        assert_eq!(out.len() as u64, size);
        out
    }

    /// The `baton` bucket of the file `own` writes.
    fn written_bucket(own: &OwnSnapshot) -> Vec<(&'static [u8], Vec<u8>)> {
        let db = Db::open(bytes(own)).unwrap();
        let bucket = db.bucket(layout::BATON).unwrap().unwrap();
        let mut values = Vec::new();
        db.for_each(&bucket, "baton", &mut |k, v, _| {
            values.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        let keys = [FORMAT_KEY, KV_SHA256_KEY, RAFT_KEY, TABLES_KEY];
        assert_eq!(values.len(), keys.len());
        keys.into_iter()
            .zip(values)
            .map(|(key, (k, v))| {
                assert_eq!(key, k.as_slice());
                (key, v)
            })
            .collect()
    }

    /// `source` written under `bucket` as it is (a test's edit of the file).
    fn with_bucket(source: SnapshotSource, bucket: Vec<(&'static [u8], Vec<u8>)>) -> OwnSnapshot {
        OwnSnapshot {
            source,
            bucket,
            compute_kv_sha256: false,
        }
    }

    #[test]
    fn written_and_read_back_is_the_same_state() {
        let sm = state(&[("a", "1"), ("b", "2"), ("a", "3")]);
        let file = bytes(&OwnSnapshot::new(source(&sm), b"raft meta"));
        let db = Db::open(file).unwrap();
        assert!(db.check().unwrap().is_empty(), "bbolt's own check passes");
        assert!(is_own(&db).unwrap());
        let loaded = read_own(&db, &mut |_| {}).unwrap();
        assert_eq!(loaded.kv_checksum, KvChecksum::Matches);
        assert_eq!(loaded.raft, b"raft meta");
        assert_eq!(loaded.state.snapshot(), sm.snapshot());
        // etcd's own reader takes the file too (the buckets etcd's tools read)
        let (etcd_view, info) =
            crate::read_state(&db, (CommandIndex(0), Term(1)), &mut |_| {}).unwrap();
        assert_eq!(etcd_view.hash_kv(0), sm.hash_kv(0));
        assert_eq!(info.consistent_index, 7);
        assert!(info.unknown_buckets.is_empty());
    }

    #[test]
    fn an_export_without_the_baton_bucket_is_not_own() {
        let sm = state(&[("a", "1")]);
        let src = source(&sm);
        let file = src.write(Vec::new(), src.plan().unwrap()).unwrap();
        let db = Db::open(file).unwrap();
        assert!(!is_own(&db).unwrap());
        assert!(matches!(read_own(&db, &mut |_| {}), Err(ReadError::Own(_))));
    }

    /// A `key` bucket rewritten outside Baton (here: the file re-exported from another key
    /// space under the original `baton` bucket, as a bbolt edit leaves it) is reported, with
    /// the state it holds; one that no longer imports is an error naming the checksum.
    #[test]
    fn a_changed_key_bucket_fails_its_checksum() {
        let sm = state(&[("a", "1"), ("b", "2")]);
        let original = written_bucket(&OwnSnapshot::new(source(&sm), b"m"));
        let edited_state = state(&[("a", "1"), ("b", "X")]);
        let edited = with_bucket(source(&edited_state), original.clone());
        let db = Db::open(bytes(&edited)).unwrap();
        let loaded = read_own(&db, &mut |_| {}).unwrap();
        assert!(matches!(loaded.kv_checksum, KvChecksum::Mismatch { .. }));
        assert_eq!(loaded.state.hash_kv(0), edited_state.hash_kv(0));
        // a key space at a revision the tables do not reach does not import
        let beyond = state(&[("a", "1"), ("b", "2"), ("c", "3")]);
        let edited = with_bucket(source(&beyond), original);
        let db = Db::open(bytes(&edited)).unwrap();
        assert!(matches!(
            read_own(&db, &mut |_| {}),
            Err(ReadError::KvChecksum(_))
        ));
    }

    #[test]
    fn a_damaged_baton_bucket_is_refused() {
        let sm = state(&[("a", "1")]);
        let mut bucket = written_bucket(&OwnSnapshot::new(source(&sm), b"m"));
        bucket[2].1[4] ^= 1; // the raft record, after its CRC
        let db = Db::open(bytes(&with_bucket(source(&sm), bucket))).unwrap();
        assert!(matches!(read_own(&db, &mut |_| {}), Err(ReadError::Own(_))));
        let mut bucket = written_bucket(&OwnSnapshot::new(source(&sm), b"m"));
        bucket[0].1 = 2u32.to_be_bytes().to_vec();
        let db = Db::open(bytes(&with_bucket(source(&sm), bucket))).unwrap();
        assert!(matches!(read_own(&db, &mut |_| {}), Err(ReadError::Own(_))));
    }

    /// The `baton` bucket of a small state, entry by entry (`len(key) u32 BE, key,
    /// len(value) u32 BE, value`), byte for byte: its key names, the format, the key space's
    /// checksum (so the `key` bucket's encoding too) and the framing of `raft` are persisted.
    /// `BATON_BLESS_NEW=1` writes a missing file, never an existing one.
    #[test]
    fn the_baton_bucket_is_pinned() {
        let sm = state(&[("a", "1"), ("b", "2"), ("a", "3")]);
        let own = OwnSnapshot::new(source(&sm), b"raft meta");
        let mut bytes = Vec::new();
        for (k, v) in &written_bucket(&own) {
            bytes.extend_from_slice(&(k.len() as u32).to_be_bytes());
            bytes.extend_from_slice(k);
            bytes.extend_from_slice(&(v.len() as u32).to_be_bytes());
            bytes.extend_from_slice(v);
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/own_bucket/small_state.hex");
        let header = "own_bucket/small_state: the `baton` bucket of own.rs's test state \
                      [(a,1),(b,2),(a,3)], a lease; raft = \"raft meta\"\n[len u32 BE][key]\
                      [len u32 BE][value] per entry\nPinned by crates/baton-snapshot/src/own.rs: \
                      never edit by hand (see baton_core::format).";
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let golden = baton_core::format::parse_golden_text(&text).expect("parses");
                assert!(
                    golden == bytes,
                    "{}: the `baton` bucket changed; a new format needs OWN_FORMAT bumped and \
                     the old one still read\n+++ now\n{}",
                    path.display(),
                    baton_core::format::golden_text(header, &bytes)
                );
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && std::env::var_os("BATON_BLESS_NEW").is_some_and(|v| v == "1") =>
            {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, baton_core::format::golden_text(header, &bytes)).unwrap();
            }
            Err(e) => panic!("{}: {e} (write it with BATON_BLESS_NEW=1)", path.display()),
        }
    }
}
