//! Newtypes and plain data shared by the whole state machine.
//!
//! Revisions, lease ids, command positions and fencing tokens are distinct types so that a
//! lease id can never be passed where a revision is expected; the wire layer converts to and
//! from etcd's `int64`s.

use serde::{Deserialize, Serialize};

/// The store's global revision. Every mutating request that changes something gets exactly one.
/// Revision 1 is the empty store (etcd starts there too), so the first write gets revision 2.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Revision(pub i64);

/// A lease id. `LeaseId(0)` means "no lease" on the etcd wire and is never granted.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct LeaseId(pub i64);

impl LeaseId {
    /// The "no lease" value of the etcd API.
    pub const NONE: LeaseId = LeaseId(0);
    /// True for `LeaseId::NONE`.
    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

/// A lock holder's fencing token: the create revision of its waiter key, so tokens of
/// successive holders strictly increase. A resource outside Baton that keeps the highest token
/// it has seen refuses a holder whose token is lower (see `Command::FenceCheck`).
///
/// Persisted: see [`crate::format`] (fields never reorder). Encoded exactly as the `i64` it
/// wraps, so introducing the type changed no persisted or peer byte.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct FencingToken(pub i64);

impl FencingToken {
    /// "No particular holder": never a real token (revision 1 is the empty store, so every key
    /// has a create revision of at least 2). `LockForceRelease` with it releases whoever holds.
    pub const NONE: FencingToken = FencingToken(0);

    /// The token of the holder whose key was created at `revision`.
    pub fn of_create_revision(revision: Revision) -> FencingToken {
        FencingToken(revision.0)
    }

    /// The create revision of the holder key this token names (the inverse of
    /// [`FencingToken::of_create_revision`]), for the compares that check it.
    pub fn create_revision(self) -> Revision {
        Revision(self.0)
    }

    /// True for `FencingToken::NONE`.
    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Position of a command among all commands ever applied (1, 2, …): what the state machine's
/// `Entry::index` counts. Not a Raft log index: one Raft entry carries a batch of commands
/// (see baton-raft's `types::Request`), and blank or membership entries carry none.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct CommandIndex(pub u64);

/// A Raft term.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Term(pub u64);

/// One version of a key, as etcd's `mvccpb.KeyValue`.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyValue {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    /// 1 on creation, +1 per modification; 0 only in a delete event's `kv`.
    pub version: i64,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub lease: LeaseId,
}

/// Kind of a change, as etcd's `mvccpb.Event.EventType`.
///
/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change to one key at one revision. A delete's `kv` carries the key and
/// `mod_revision` = the delete revision (other fields zero), as etcd does.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    /// The previous version of the key, when there was one (filled by the core in every
    /// applied entry's events, which the watch layer strips for watchers that did not ask
    /// for `prev_kv`; history builds it only for an [`EventShape`] that asks for it).
    pub prev_kv: Option<KeyValue>,
}

/// Which events a read of history builds, and with what: a watcher's filters, applied
/// before an event is built, because building one reads its value (and its previous
/// value) back from the value file when they are spilled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventShape {
    pub puts: bool,
    pub deletes: bool,
    /// With the previous version when it is retained; without, `prev_kv` is `None`.
    pub prev_kv: bool,
}

impl EventShape {
    /// Every event, with its previous version.
    pub const ALL: EventShape = EventShape {
        puts: true,
        deletes: true,
        prev_kv: true,
    };

    pub fn wants(&self, kind: EventKind) -> bool {
        match kind {
            EventKind::Put => self.puts,
            EventKind::Delete => self.deletes,
        }
    }
}

/// A half-open key interval `[key, range_end)` with etcd's conventions:
/// empty `range_end` = the single key; `range_end == [0]` = every key `>= key`;
/// `key == [0] && range_end == [0]` = every key.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyRange {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
}

impl KeyRange {
    /// Whether `k` lies in this range under etcd's conventions.
    pub fn contains(&self, k: &[u8]) -> bool {
        if self.range_end.is_empty() {
            return k == self.key.as_slice();
        }
        if self.range_end.as_slice() == [0] {
            return k >= self.key.as_slice();
        }
        k >= self.key.as_slice() && k < self.range_end.as_slice()
    }
}
