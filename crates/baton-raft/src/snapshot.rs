//! Snapshot files: `data_dir/snap/<term>-<index>.snap`, one at a time.
//!
//! Layout: `[magic 8]["header length" u32 LE][crc32 of header u32 LE][header][body]`, where the
//! header (bincode) carries the format version, openraft's snapshot meta (last log id,
//! membership, id) and the body's length and CRC, and the body is
//! `baton_core::StateMachine::snapshot()`. Written to a temporary file, fsynced, renamed and
//! the directory fsynced, so a crash leaves either the old or the new snapshot, both whole.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::files;
use crate::types::SnapshotMeta;
use crate::StartError;

const SNAP_MAGIC: &[u8; 8] = b"BTNSNAP1";
/// Version 2: the membership in the meta records `types::Member` instead of `BasicNode`.
const SNAP_VERSION: u32 = 2;
/// A header is a few hundred bytes (membership included); more is corruption.
const MAX_HEADER_BYTES: usize = 1 << 20;

#[derive(Serialize, Deserialize)]
struct Header {
    version: u32,
    meta: SnapshotMeta,
    body_len: u64,
    body_crc: u32,
}

/// A snapshot read back from disk and verified.
pub(crate) struct Loaded {
    pub(crate) meta: SnapshotMeta,
    pub(crate) body: Vec<u8>,
}

fn sort_key(meta: &SnapshotMeta) -> (u64, u64) {
    meta.last_log_id
        .map_or((0, 0), |l| (l.index, l.leader_id.term))
}

pub(crate) fn file_name(meta: &SnapshotMeta) -> String {
    let (index, term) = sort_key(meta);
    format!("{term:020}-{index:020}.snap")
}

/// `(index, term)` from a snapshot file name, for picking the newest without reading all.
fn parse_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".snap")?;
    let (term, index) = stem.split_once('-')?;
    Some((index.parse().ok()?, term.parse().ok()?))
}

/// Everything of a snapshot file before its body.
fn encode_prefix(meta: &SnapshotMeta, body_len: u64, body_crc: u32) -> Vec<u8> {
    let header = Header {
        version: SNAP_VERSION,
        meta: meta.clone(),
        body_len,
        body_crc,
    };
    let header = bincode::serialize(&header).expect("snapshot headers serialize");
    let mut out = Vec::with_capacity(16 + header.len());
    out.extend_from_slice(SNAP_MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&header).to_le_bytes());
    out.extend_from_slice(&header);
    out
}

/// A whole snapshot file's bytes (what `write` writes in two parts).
#[cfg(test)]
pub(crate) fn encode(meta: &SnapshotMeta, body: &[u8]) -> Vec<u8> {
    let mut out = encode_prefix(meta, body.len() as u64, crc32fast::hash(body));
    out.extend_from_slice(body);
    out
}

pub(crate) fn decode(mut bytes: Vec<u8>) -> Result<Loaded, String> {
    if bytes.len() < 16 || &bytes[..8] != SNAP_MAGIC {
        return Err("bad magic or file too short".into());
    }
    let header_len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    let header_crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
    if header_len > MAX_HEADER_BYTES || bytes.len() < 16 + header_len {
        return Err(format!("implausible header length {header_len}"));
    }
    let header_bytes = &bytes[16..16 + header_len];
    if crc32fast::hash(header_bytes) != header_crc {
        return Err("header checksum mismatch".into());
    }
    let header: Header =
        bincode::deserialize(header_bytes).map_err(|e| format!("undecodable header: {e}"))?;
    if header.version != SNAP_VERSION {
        return Err(format!("unsupported snapshot version {}", header.version));
    }
    let body_start = 16 + header_len;
    if (bytes.len() - body_start) as u64 != header.body_len {
        return Err(format!(
            "body is {} bytes, header says {}",
            bytes.len() - body_start,
            header.body_len
        ));
    }
    if crc32fast::hash(&bytes[body_start..]) != header.body_crc {
        return Err("body checksum mismatch".into());
    }
    bytes.drain(..body_start);
    Ok(Loaded {
        meta: header.meta,
        body: bytes,
    })
}

/// Writes a snapshot durably and deletes every other snapshot file. Returns its path and size.
pub(crate) fn write(dir: &Path, meta: &SnapshotMeta, body: &[u8]) -> io::Result<(PathBuf, u64)> {
    let path = dir.join(file_name(meta));
    // Header and body written one after the other: the body is the whole state, and a
    // concatenated copy of it was a second one in memory (1M keys: +160 MB).
    let prefix = encode_prefix(meta, body.len() as u64, crc32fast::hash(body));
    files::write_atomic_parts(&path, &[&prefix, body])?;
    let size = (prefix.len() + body.len()) as u64;
    remove_others(dir, &path)?;
    Ok((path, size))
}

/// Writes the snapshot of `state` durably, as [`write`] writes `state.snapshot()`, without
/// holding its bytes: they are made twice, once for the header's length and checksum and
/// once into the file (a restored backup of a million keys is hundreds of megabytes).
pub(crate) fn write_state(
    dir: &Path,
    meta: &SnapshotMeta,
    state: &baton_core::StateMachine,
) -> io::Result<(PathBuf, u64)> {
    let path = dir.join(file_name(meta));
    let mut summer = LenCrc::default();
    state.snapshot_to(&mut summer)?;
    let prefix = encode_prefix(meta, summer.len, summer.crc.clone().finalize());
    files::write_atomic_with(&path, &mut |w| {
        w.write_all(&prefix)?;
        state.snapshot_to(w)
    })?;
    remove_others(dir, &path)?;
    Ok((path, prefix.len() as u64 + summer.len))
}

/// A `Write` that counts and checksums what it is given.
#[derive(Default)]
struct LenCrc {
    len: u64,
    crc: crc32fast::Hasher,
}

impl io::Write for LenCrc {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.len += buf.len() as u64;
        self.crc.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Deletes every snapshot file in `dir` but `keep`.
fn remove_others(dir: &Path, keep: &Path) -> io::Result<()> {
    let mut removed = false;
    for ent in fs::read_dir(dir)? {
        let ent = ent?;
        if ent.path() != keep && ent.file_name().to_string_lossy().ends_with(".snap") {
            fs::remove_file(ent.path())?;
            removed = true;
        }
    }
    if removed {
        files::fsync_dir(dir)?;
    }
    Ok(())
}

pub(crate) fn read(path: &Path) -> io::Result<Result<Loaded, String>> {
    Ok(decode(fs::read(path)?))
}

/// The newest snapshot in `dir`, verified; leftovers of interrupted writes are removed. A
/// corrupt newest snapshot refuses the start: an older one may exist only transiently, and the
/// log before the newest was already purged, so falling back could silently lose writes.
pub(crate) fn load_newest(dir: &Path) -> Result<Option<(PathBuf, Loaded, u64)>, StartError> {
    let io_err = |source| StartError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut newest: Option<((u64, u64), PathBuf)> = None;
    for ent in fs::read_dir(dir).map_err(io_err)? {
        let ent = ent.map_err(io_err)?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            fs::remove_file(ent.path()).map_err(io_err)?;
            continue;
        }
        let Some(key) = parse_name(&name) else {
            continue;
        };
        if newest.as_ref().is_none_or(|(k, _)| key > *k) {
            newest = Some((key, ent.path()));
        }
    }
    let Some((_, path)) = newest else {
        return Ok(None);
    };
    let bytes = fs::read(&path).map_err(|source| StartError::Io {
        path: path.clone(),
        source,
    })?;
    let size = bytes.len() as u64;
    let loaded = decode(bytes).map_err(|reason| StartError::CorruptSnapshot {
        path: path.clone(),
        reason,
    })?;
    Ok(Some((path, loaded, size)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_corruption() {
        let meta = SnapshotMeta::default();
        let enc = encode(&meta, b"state");
        let dec = decode(enc.clone()).unwrap();
        assert_eq!(dec.body, b"state");
        assert_eq!(dec.meta, meta);
        for i in 0..enc.len() {
            let mut bad = enc.clone();
            bad[i] ^= 0x40;
            assert!(decode(bad).is_err(), "flip at {i} not detected");
        }
        assert!(decode(enc[..enc.len() - 1].to_vec()).is_err());
    }

    /// `write` puts header and body in the file one after the other, `write_state` encodes the
    /// state as it writes: both the same bytes as the whole encoding, so no file changed.
    #[test]
    fn written_in_parts_is_the_whole_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SnapshotMeta::default();
        let (path, size) = write(dir.path(), &meta, b"the state").unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes, encode(&meta, b"the state"));
        assert_eq!(size, bytes.len() as u64);
        // and a state written as it is encoded, the same as its encoding written
        let mut sm = baton_core::StateMachine::new();
        sm.apply(&baton_core::Entry {
            index: baton_core::CommandIndex(0),
            term: baton_core::Term(1),
            time_ms: 1,
            command: baton_core::Command::Noop,
        });
        let other = tempfile::tempdir().unwrap();
        let (path, size) = write_state(other.path(), &meta, &sm).unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes, encode(&meta, &sm.snapshot()));
        assert_eq!(size, bytes.len() as u64);
    }

    #[test]
    fn names_sort_by_index() {
        assert_eq!(
            parse_name("00000000000000000003-00000000000000000042.snap"),
            Some((42, 3))
        );
        assert_eq!(parse_name("x.snap"), None);
    }
}
