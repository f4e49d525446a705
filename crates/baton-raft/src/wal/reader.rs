//! Reading entries back: from the cache, or from their records on disk, each record read
//! once per call and verified like recovery verifies it (length, CRC, decoding, the entry
//! expected in that slot). Reads go to the generation's file through a handle `MemLog`
//! keeps open, so a generation deleted by a rewrite stays readable for whoever holds it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::index::{Loc, Source};
use super::record::{parse_record, Record};
use crate::types::RaftEntry;

/// Reads the planned entries: cached ones as they are, the others from their records, each
/// record read once per call and checked (length, CRC, decodable, the expected entry).
pub(super) fn fetch(plan: Vec<Source>) -> Result<Vec<RaftEntry>, String> {
    let mut out = Vec::with_capacity(plan.len());
    // The last record read: (file, offset) and its entries.
    let mut current: Option<((*const File, u64), Vec<RaftEntry>)> = None;
    for source in plan {
        let (file, loc, log_id) = match source {
            Source::Cached(e) => {
                out.push(e);
                continue;
            }
            Source::Disk { file, loc, log_id } => (file, loc, log_id),
        };
        let key = (Arc::as_ptr(&file), loc.offset);
        if current.as_ref().map(|c| c.0) != Some(key) {
            let entries = read_entries_record(&file, loc)?;
            current = Some((key, entries));
        }
        let entries = &current.as_ref().expect("just set").1;
        let entry = entries.get(loc.slot as usize).ok_or_else(|| {
            format!(
                "log record at offset {} holds {} entries, entry {log_id} expected in slot {}",
                loc.offset,
                entries.len(),
                loc.slot
            )
        })?;
        if entry.log_id != log_id {
            return Err(format!(
                "log record at offset {} holds entry {} where {log_id} was expected",
                loc.offset, entry.log_id
            ));
        }
        out.push(entry.clone());
    }
    Ok(out)
}

/// Reads the `Entries` record at `loc` and verifies it like recovery does (length, CRC,
/// decoding).
fn read_entries_record(file: &File, loc: Loc) -> Result<Vec<RaftEntry>, String> {
    let mut buf = vec![0u8; loc.len as usize];
    file.read_exact_at(&mut buf, loc.offset)
        .map_err(|e| format!("reading the log record at offset {}: {e}", loc.offset))?;
    match parse_record(&buf, 0) {
        Ok((Record::Entries(v), end)) if end == buf.len() => Ok(v),
        Ok(_) => Err(format!(
            "the log record at offset {} is not the entries record expected",
            loc.offset
        )),
        Err(reason) => Err(format!(
            "corrupt log record at offset {}: {reason}",
            loc.offset
        )),
    }
}
