//! `etcdctl snapshot status`: the file's integrity (bbolt's check), then a CRC-32C over every
//! bucket name and every key and value in order, the revision of the last entry of `key`,
//! the number of entries and the database's size — the same numbers for the same file.

use std::fs::File;

use baton_bbolt::Db;
use serde::Serialize;

use crate::layout::{self, parse_rev_key};

/// etcdctl's `snapshot.Status` (its JSON field names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Status {
    pub hash: u32,
    pub revision: i64,
    #[serde(rename = "totalKey")]
    pub total_key: u64,
    #[serde(rename = "totalSize")]
    pub total_size: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Bbolt(#[from] baton_bbolt::Error),
    /// etcdctl's words.
    #[error("snapshot file integrity check failed. {} errors found.\n{}", .0.len(), .0.join("\n"))]
    Integrity(Vec<String>),
}

/// The status of the snapshot file at `path` (its trailer, if any, is not part of it).
pub fn status(path: &std::path::Path) -> Result<Status, StatusError> {
    let db = Db::open(File::open(path)?)?;
    let problems = db.check()?;
    if !problems.is_empty() {
        return Err(StatusError::Integrity(problems));
    }
    let mut crc = 0u32;
    let mut revision = 0;
    let mut total_key = 0;
    for (name, bucket) in db.buckets()? {
        crc = crc32c::crc32c_append(crc, &name);
        let is_key = name == layout::KEY;
        let shown = String::from_utf8_lossy(&name).into_owned();
        db.for_each(&bucket, &shown, &mut |k, v, _| {
            crc = crc32c::crc32c_append(crc, k);
            crc = crc32c::crc32c_append(crc, v);
            if is_key {
                if let Some((main, _, _)) = parse_rev_key(k) {
                    revision = main;
                }
            }
            total_key += 1;
            Ok(())
        })?;
    }
    Ok(Status {
        hash: crc,
        revision,
        total_key,
        total_size: db.size(),
    })
}
