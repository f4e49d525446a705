//! # baton-snapshot
//!
//! Backups in etcd 3.4's format, both ways: what `etcdctl snapshot save` receives from a
//! server is a bbolt database laid out as etcd's backend followed by the SHA-256 of those
//! bytes; Baton sends the same ([`export`]), reads the same whether etcd or Baton made it
//! ([`import`]), and reports on a file as `etcdctl snapshot status` does ([`status`]).
//!
//! The layout (`layout.rs`; facts from etcd 3.4's `mvcc`, `lease`, `auth`,
//! `etcdserver/api/membership`), buckets in the root in name order:
//!
//! | bucket | key | value |
//! |---|---|---|
//! | `alarm` | `etcdserverpb.AlarmMember` | empty |
//! | `auth` | `authEnabled`, `authRevision` | `[1]`/`[0]`; u64 big-endian |
//! | `authRoles` | role name | `authpb.Role` |
//! | `authUsers` | user name | `authpb.User` (bcrypt hash as the password) |
//! | `cluster` | `clusterVersion` | `3.4.0` |
//! | `key` | main revision (8 bytes BE) `_` sub revision (8 bytes BE), `t` after a tombstone | `mvccpb.KeyValue` (a tombstone's holds only the key) |
//! | `lease` | lease id (8 bytes BE) | `leasepb.Lease {ID, TTL, RemainingTTL}` |
//! | `members` | member id in lowercase hex | JSON `{"id","peerURLs","name","clientURLs"}` (`isLearner` when set) |
//! | `members_removed` | — | — |
//! | `meta` | `consistent_index`; `scheduledCompactRev`, `finishedCompactRev` once compacted | u64 BE; a revision key (`main_0`) |
//!
//! Invariants: the `key` bucket holds every retained version, history back to the compact
//! revision, in `(main, sub)` order; the newest main revision in it (or the compact
//! revision, if later) is the store's revision, as etcd's restore computes it; a snapshot
//! file is the bbolt bytes then 32 bytes of SHA-256 over them (`hasChecksum`: size mod 512
//! is 32). Baton's own tables that etcd has no bucket for (the lock registry, fences,
//! fencing keys, exactly-once sessions) are not in a snapshot: a restored cluster starts
//! them empty, as a restored etcd would.
//!
//! Baton's own snapshots (`member/snap/db` of a member's data directory, [`OwnSnapshot`],
//! [`read_own`]) are the same layout without the trailer plus a `baton` bucket carrying
//! those tables, the Raft position and a SHA-256 of the `key` bucket (see `own.rs`).

mod export;
mod import;
mod layout;
mod own;
mod status;
mod trailer;

pub use export::{Member, SnapshotSource};
pub use import::{read_state, ImportInfo, ReadError};
pub use layout::CLUSTER_VERSION;
pub use own::{is_own, read_own, KvChecksum, OwnLoaded, OwnSnapshot, OWN_FORMAT};
pub use status::{status, Status, StatusError};
pub use trailer::{verify_trailer, HashingWriter, TrailerError, SHA256_LEN};
