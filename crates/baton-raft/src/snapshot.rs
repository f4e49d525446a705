//! Snapshot files, one at a time: `data_dir/member/snap/db` (written now) or, as older
//! Batons wrote them (still read), `data_dir/snap/<term>-<index>.snap`.
//!
//! `member/snap/db` is etcd 3.4's backend layout plus a `baton` bucket
//! (`baton_snapshot::OwnSnapshot`): the key space is etcd's `key` bucket and is loaded from
//! it, the rest of the state and the Raft meta ([`DbMeta`]) are in the `baton` bucket. A
//! `member/snap/db` without that bucket is etcd's (`etcdctl snapshot restore`, imported once
//! by `baton serve`) and is not a snapshot of this member. At start the newer of the two
//! kinds (by last log id) is the state; writing a `db` removes every `.snap`.
//!
//! The `.snap` layout: `[magic 8]["header length" u32 LE][crc32 of header u32 LE][header][body]`, where the
//! header (bincode) carries the format version, openraft's snapshot meta (last log id,
//! membership, id) and the body's length and CRC, and the body is
//! `baton_core::StateMachine::snapshot()`. Written to a temporary file, fsynced, renamed and
//! the directory fsynced, so a crash leaves either the old or the new snapshot, both whole.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use baton_bbolt::Db;
use baton_core::StateMachine;
use baton_snapshot::{KvChecksum, OwnSnapshot, SnapshotSource};
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
/// Tests only: snapshots are written as `member/snap/db` now; this writes the `.snap` files
/// older data directories hold, which are still read.
#[cfg(test)]
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

/// Where this member's snapshot in etcd's layout lives, as etcd's backend does.
pub(crate) fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("member").join("snap").join("db")
}

/// Version 1: the first.
const DB_META_VERSION: u32 = 1;

/// The Raft meta of a `member/snap/db` (the `baton` bucket's `raft` record; what the header
/// of a `.snap` holds).
///
/// Persisted: see `baton_core::format` (fields never reorder); pinned in `golden.rs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DbMeta {
    pub(crate) version: u32,
    pub(crate) meta: SnapshotMeta,
}

pub(crate) fn encode_db_meta(meta: &SnapshotMeta) -> Vec<u8> {
    let m = DbMeta {
        version: DB_META_VERSION,
        meta: meta.clone(),
    };
    bincode::serialize(&m).expect("snapshot metas serialize")
}

pub(crate) fn decode_db_meta(bytes: &[u8]) -> Result<SnapshotMeta, String> {
    let m: DbMeta =
        bincode::deserialize(bytes).map_err(|e| format!("undecodable Raft meta: {e}"))?;
    if m.version != DB_META_VERSION {
        return Err(format!("unsupported Raft meta version {}", m.version));
    }
    Ok(m.meta)
}

/// The members of `meta`'s membership, for the `members` bucket (read by etcd's tools
/// only).
fn members(meta: &SnapshotMeta) -> Vec<baton_snapshot::Member> {
    let m = meta.last_membership.membership();
    let voters: std::collections::BTreeSet<u64> = m.voter_ids().collect();
    m.nodes()
        .map(|(id, node)| baton_snapshot::Member {
            id: *id,
            name: node.name.clone(),
            peer_urls: node.peer_urls.clone(),
            client_urls: node.client_urls.clone(),
            is_learner: !voters.contains(id),
        })
        .collect()
}

/// Writes `state` (at `meta`) durably as `db` (`member/snap/db`: temporary file, fsync,
/// rename, directory fsync) and then deletes every `.snap` in `snap_dir`. Returns the size.
pub(crate) fn write_db(
    db: &Path,
    snap_dir: &Path,
    meta: &SnapshotMeta,
    state: &StateMachine,
) -> io::Result<u64> {
    let dir = db.parent().expect("member/snap/db has a parent");
    if !dir.exists() {
        fs::create_dir_all(dir)?;
        // The new directories themselves must survive a crash, up to the data directory.
        let member = dir.parent().expect("member/snap has a parent");
        files::fsync_dir(member)?;
        files::fsync_dir(member.parent().unwrap_or(Path::new(".")))?;
    }
    let source = SnapshotSource {
        state: state.clone(),
        consistent_index: meta.last_log_id.map_or(0, |l| l.index),
        members: members(meta),
    };
    let own = OwnSnapshot::new(source, &encode_db_meta(meta));
    let mut size = 0;
    files::write_atomic_with(db, &mut |w| {
        size = own.write(&mut *w)?.0;
        Ok(())
    })?;
    remove_snap_files(snap_dir)?;
    Ok(size)
}

/// Deletes every `.snap` file in `dir` (a `member/snap/db` now supersedes them).
fn remove_snap_files(dir: &Path) -> io::Result<()> {
    let mut removed = false;
    for ent in fs::read_dir(dir)? {
        let ent = ent?;
        if ent.file_name().to_string_lossy().ends_with(".snap") {
            fs::remove_file(ent.path())?;
            removed = true;
        }
    }
    if removed {
        files::fsync_dir(dir)?;
    }
    Ok(())
}

/// A `member/snap/db` read back: `None` if there is none or it is etcd's (no `baton`
/// bucket).
pub(crate) struct LoadedDb {
    pub(crate) meta: SnapshotMeta,
    pub(crate) state: StateMachine,
    pub(crate) size: u64,
    pub(crate) kv_checksum: KvChecksum,
}

/// Why a `member/snap/db` could not be read.
pub(crate) enum DbError {
    Io(io::Error),
    /// Damaged or not decodable.
    Corrupt(String),
    /// The `key` bucket fails its checksum and does not even import.
    KvChanged(String),
}

pub(crate) fn read_db(path: &Path) -> Result<Option<LoadedDb>, DbError> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DbError::Io(e)),
    };
    let db = Db::open(file).map_err(|e| DbError::Corrupt(e.to_string()))?;
    if !baton_snapshot::is_own(&db).map_err(|e| DbError::Corrupt(e.to_string()))? {
        return Ok(None);
    }
    let loaded = baton_snapshot::read_own(&db, &mut |_| {}).map_err(|e| match e {
        baton_snapshot::ReadError::KvChecksum(why) => DbError::KvChanged(why),
        other => DbError::Corrupt(other.to_string()),
    })?;
    let meta = decode_db_meta(&loaded.raft).map_err(DbError::Corrupt)?;
    Ok(Some(LoadedDb {
        meta,
        state: loaded.state,
        size: db.size(),
        kv_checksum: loaded.kv_checksum,
    }))
}

/// The snapshot at `path` as openraft sends it to a follower: its meta and Baton's own
/// encoding of the state (`StateMachine::snapshot`). A `db` whose `key` bucket fails its
/// checksum is not sent (a changed key space must not spread to other members) unless
/// `accept_changed`: it is the one this member started from for the initial corruption
/// check (openraft reads its current snapshot when it starts, before that check runs; on a
/// difference the member exits before it has served anything).
pub(crate) fn read_for_sending(
    path: &Path,
    accept_changed: bool,
) -> io::Result<Result<Loaded, String>> {
    if path.extension().is_some_and(|e| e == "snap") {
        return read(path);
    }
    match read_db(path) {
        Ok(Some(db)) => match db.kv_checksum {
            KvChecksum::Matches => Ok(Ok(Loaded {
                meta: db.meta,
                body: db.state.snapshot(),
            })),
            KvChecksum::Mismatch { .. } if accept_changed => Ok(Ok(Loaded {
                meta: db.meta,
                body: db.state.snapshot(),
            })),
            KvChecksum::Mismatch { .. } => Ok(Err(format!(
                "{}: the `key` bucket does not match its checksum; not sent",
                path.display()
            ))),
        },
        Ok(None) => Ok(Err(format!("{}: not Baton's snapshot", path.display()))),
        Err(DbError::Io(e)) => Err(e),
        Err(DbError::Corrupt(why) | DbError::KvChanged(why)) => Ok(Err(why)),
    }
}

/// The newest snapshot of a data directory, restored.
pub(crate) struct Newest {
    pub(crate) path: PathBuf,
    pub(crate) meta: SnapshotMeta,
    pub(crate) state: StateMachine,
    pub(crate) size: u64,
    /// `member/snap/db`'s `key` bucket failed its checksum (the caller decides).
    pub(crate) kv_changed: Option<String>,
}

/// The newest of `snap_dir`'s `.snap` files and `db` (Baton's own only), by last log id,
/// verified and restored; leftovers of interrupted writes are removed.
pub(crate) fn load_newest_state(snap_dir: &Path, db: &Path) -> Result<Option<Newest>, StartError> {
    let tmp = files::tmp_path(db);
    if tmp.exists() {
        fs::remove_file(&tmp).map_err(|source| StartError::Io {
            path: tmp.clone(),
            source,
        })?;
    }
    let corrupt = |path: &Path, reason: String| StartError::CorruptSnapshot {
        path: path.to_path_buf(),
        reason,
    };
    let from_db = match read_db(db) {
        Ok(d) => d,
        Err(DbError::Io(source)) => {
            return Err(StartError::Io {
                path: db.to_path_buf(),
                source,
            })
        }
        Err(DbError::Corrupt(reason)) => return Err(corrupt(db, reason)),
        Err(DbError::KvChanged(detail)) => {
            return Err(StartError::SnapshotKvChanged {
                path: db.to_path_buf(),
                detail,
            })
        }
    };
    let newest_snap = newest_snap_name(snap_dir)?;
    if let Some(d) = from_db {
        let db_key = sort_key(&d.meta);
        if newest_snap.is_none_or(|k| k <= db_key) {
            let kv_changed = match d.kv_checksum {
                KvChecksum::Matches => None,
                KvChecksum::Mismatch { stored, computed } => {
                    Some(format!("stored SHA-256 {stored}, computed {computed}"))
                }
            };
            return Ok(Some(Newest {
                path: db.to_path_buf(),
                meta: d.meta,
                state: d.state,
                size: d.size,
                kv_changed,
            }));
        }
    }
    let Some((path, loaded, size)) = load_newest(snap_dir)? else {
        return Ok(None);
    };
    let state = StateMachine::restore(&loaded.body).map_err(|e| corrupt(&path, e.to_string()))?;
    Ok(Some(Newest {
        path,
        meta: loaded.meta,
        state,
        size,
        kv_changed: None,
    }))
}

/// The `(index, term)` of the newest `.snap` in `dir`, by name.
fn newest_snap_name(dir: &Path) -> Result<Option<(u64, u64)>, StartError> {
    let io_err = |source| StartError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut newest: Option<(u64, u64)> = None;
    for ent in fs::read_dir(dir).map_err(io_err)? {
        let ent = ent.map_err(io_err)?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if let Some(key) = parse_name(&name) {
            newest = newest.max(Some(key));
        }
    }
    Ok(newest)
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

    /// A state of `n` puts applied in term 2, and a meta naming it at Raft index `index`.
    fn state_at(n: u64, index: u64) -> (SnapshotMeta, StateMachine) {
        let mut sm = StateMachine::new();
        for i in 0..n {
            sm.apply(&baton_core::Entry {
                index: baton_core::CommandIndex(i),
                term: baton_core::Term(2),
                time_ms: 1 + i,
                command: baton_core::Command::Put(baton_core::PutRequest {
                    key: format!("k{i}").into_bytes(),
                    value: format!("value-{i:04}").into_bytes(),
                    ..Default::default()
                }),
            });
        }
        let meta = SnapshotMeta {
            last_log_id: Some(crate::golden::log_id(2, index)),
            last_membership: openraft::StoredMembership::new(
                Some(crate::golden::log_id(1, 1)),
                crate::golden::membership(),
            ),
            snapshot_id: format!("2-{index}-0"),
        };
        (meta, sm)
    }

    /// A data directory of an older Baton (only `snap/*.snap`) opens from it; the first
    /// `member/snap/db` written replaces it (the `.snap` is removed) and is what the next
    /// start loads, the same state; a `.snap` newer than the `db` wins.
    #[test]
    fn old_snap_files_open_and_the_newest_kind_wins() {
        let dir = tempfile::tempdir().unwrap();
        let snap_dir = dir.path().join("snap");
        fs::create_dir(&snap_dir).unwrap();
        let db = db_path(dir.path());
        let (meta, sm) = state_at(3, 5);
        write(&snap_dir, &meta, &sm.snapshot()).unwrap();
        let n = load_newest_state(&snap_dir, &db).unwrap().unwrap();
        assert!(n.path.extension().is_some_and(|e| e == "snap"));
        assert_eq!(n.state.snapshot(), sm.snapshot());
        assert_eq!(n.meta, meta);

        let (meta, sm) = state_at(5, 9);
        let size = write_db(&db, &snap_dir, &meta, &sm).unwrap();
        assert_eq!(size, fs::metadata(&db).unwrap().len());
        assert_eq!(
            fs::read_dir(&snap_dir).unwrap().count(),
            0,
            "the .snap is gone"
        );
        let n = load_newest_state(&snap_dir, &db).unwrap().unwrap();
        assert_eq!(n.path, db);
        assert_eq!(n.meta, meta);
        assert_eq!(n.state.snapshot(), sm.snapshot());
        assert_eq!(n.kv_changed, None);
        // what a follower is sent: Baton's own encoding of the same state
        let sent = read_for_sending(&db, false).unwrap().unwrap();
        assert_eq!(sent.body, sm.snapshot());
        assert_eq!(sent.meta, meta);

        // A .snap newer than the db (not written by this Baton, but possible in a copied
        // directory) is the newer state.
        let (newer_meta, newer) = state_at(6, 12);
        write(&snap_dir, &newer_meta, &newer.snapshot()).unwrap();
        let n = load_newest_state(&snap_dir, &db).unwrap().unwrap();
        assert_eq!(n.meta, newer_meta);
        // A leftover temporary file of an interrupted write is removed.
        fs::write(files::tmp_path(&db), b"half").unwrap();
        load_newest_state(&snap_dir, &db).unwrap().unwrap();
        assert!(!files::tmp_path(&db).exists());
    }

    /// etcd's `member/snap/db` (no `baton` bucket: `etcdctl snapshot restore`) is not this
    /// member's snapshot.
    #[test]
    fn an_etcd_db_is_not_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let snap_dir = dir.path().join("snap");
        fs::create_dir(&snap_dir).unwrap();
        let db = db_path(dir.path());
        fs::create_dir_all(db.parent().unwrap()).unwrap();
        let (_, sm) = state_at(2, 3);
        let source = SnapshotSource {
            state: sm,
            consistent_index: 3,
            members: Vec::new(),
        };
        let file = source.write(Vec::new(), source.plan().unwrap()).unwrap();
        fs::write(&db, file).unwrap();
        assert!(load_newest_state(&snap_dir, &db).unwrap().is_none());
    }

    /// A value changed in place in the `key` bucket (a valid bbolt file still: bbolt has no
    /// page checksums) is reported as a changed key space, with the changed state; it is not
    /// sent to followers unless accepted.
    #[test]
    fn a_value_changed_in_the_db_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let snap_dir = dir.path().join("snap");
        fs::create_dir(&snap_dir).unwrap();
        let db = db_path(dir.path());
        let (meta, sm) = state_at(4, 7);
        write_db(&db, &snap_dir, &meta, &sm).unwrap();
        let mut bytes = fs::read(&db).unwrap();
        let at = bytes
            .windows(10)
            .position(|w| w == b"value-0002")
            .expect("the value is in the file");
        bytes[at..at + 10].copy_from_slice(b"VALUE-0002");
        fs::write(&db, &bytes).unwrap();
        let n = load_newest_state(&snap_dir, &db).unwrap().unwrap();
        assert!(n.kv_changed.is_some());
        assert_ne!(n.state.hash_kv(0), sm.hash_kv(0));
        assert!(read_for_sending(&db, false).unwrap().is_err());
        assert!(read_for_sending(&db, true).unwrap().is_ok());
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
