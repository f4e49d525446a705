//! The Raft log on disk: a checksummed append-only file with group commit.
//!
//! # Layout
//! `data_dir/raft/wal/<generation:016x>.wal`. Each file is a sequence of records
//! `[len u32 LE][crc32(len ‖ payload) u32 LE][payload = bincode(Record)]`. A generation starts
//! with a `FormatVersion` record, then a `GenerationStart` record (purge point and committed
//! id) followed by every not-yet-purged entry, so **the newest generation alone describes the
//! whole log**; it is then extended with `Entries`, `TruncateSince`, `PurgeUpto` and
//! `Committed` records. The file is allocated ahead in 1 MiB steps, so the records are
//! followed by zeros (an all-zero header is never a valid record: its CRC does not match).
//!
//! # The parts
//! - `record.rs` — the record format and its versions: a pure encoder and parser (no I/O),
//!   with typed errors.
//! - `dir.rs` — the generation files' names.
//! - `index.rs` — what stays in memory: every entry's id, size and location, the newest
//!   entries decoded.
//! - `reader.rs` — reading entries back from their records, checked.
//! - `recovery.rs` — start-up: replaying the newest generation (torn tail or corruption),
//!   and opening the log for writing.
//! - `writer.rs` — carrying out operations in order: one write and one fdatasync per batch,
//!   preallocation, rewrites, `ENOSPC` held back, any other I/O error fatal.
//! - `handoff.rs` — where a write runs: inline on the Raft core task, or in the batch loop
//!   (an OS thread; a task under simulation, the same loop).
//! - `disk.rs` — the real disk under the writer (`crate::env::LogDisk`; the simulation
//!   injects its own model below the same writer).
//! - `store.rs` — the openraft adapter (`RaftLogStorage`, its reader) and the node's handle.

mod dir;
mod disk;
mod handoff;
mod index;
mod reader;
mod record;
mod recovery;
mod store;
mod writer;

#[cfg(test)]
mod tests;

pub(crate) use recovery::{open, recover};
pub(crate) use store::{LogStore, WalHandle};
