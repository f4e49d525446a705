//! What goes into the log (`Command`) and what applying it returns (`Applied`).
//!
//! These mirror the etcd request shapes field for field so the server's conversion is
//! mechanical, but they belong to the core: `baton-core` depends on nothing internal.

use serde::{Deserialize, Serialize};

use crate::types::{Event, KeyRange, KeyValue, LeaseId, LogIndex, Revision, Term};

/// etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// etcd's largest lease TTL, in seconds.
pub const MAX_LEASE_TTL_S: i64 = 9_000_000_000;

/// One entry of the replicated log as the state machine sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub index: LogIndex,
    pub term: Term,
    /// Stamped by the leader from its monotonic clock; never goes backwards across entries.
    /// The only source of time the core ever sees.
    pub time_ms: u64,
    pub command: Command,
}

/// A state-changing request, as replicated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Does nothing (leader's first entry of a term, barriers).
    Noop,
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact {
        revision: Revision,
    },
    /// `id` is chosen by the proposer (randomness stays outside the core); never `NONE`.
    LeaseGrant {
        id: LeaseId,
        ttl_s: i64,
    },
    LeaseRevoke {
        id: LeaseId,
    },
    /// Proposed by the leader when its in-memory lease clock says these leases' deadlines
    /// passed. Leases that no longer exist are ignored; all keys of all listed leases are
    /// deleted in one revision.
    ExpireLeases {
        ids: Vec<LeaseId>,
    },
    /// Remaining TTLs measured by the leader, so a new leader does not renew blindly.
    LeaseCheckpoint {
        checkpoints: Vec<(LeaseId, i64)>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

/// etcd's `RangeRequest`. `revision <= 0` means the current revision.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RangeRequest {
    pub range: KeyRange,
    pub limit: i64,
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RangeResponse {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    /// Keys in the range before `limit` and the min/max filters.
    pub count: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PutRequest {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub lease: LeaseId,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PutResponse {
    pub prev_kv: Option<KeyValue>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeleteRangeRequest {
    pub range: KeyRange,
    pub prev_kv: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeleteRangeResponse {
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// What a compare looks at, with the operand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Vec<u8>),
    Lease(i64),
}

/// etcd's `Compare`; with a non-empty `range.range_end` every key in the range must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub range: KeyRange,
    pub result: CompareResult,
    pub target: CompareTarget,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TxnResponse {
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

/// Domain errors. Each maps to exactly one etcd status code and message in the server's
/// error table; the `Display` text here is etcd's message so logs read the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum KvError {
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
}

/// The result of applying one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The store revision after this entry (unchanged if the entry changed nothing).
    pub revision: Revision,
    pub response: Response,
    /// Changes made by this entry, in order, all at `revision` (empty if nothing changed).
    pub events: Vec<Event>,
}

/// Per-command results. Domain errors are values, never panics: a failed command changes
/// nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Noop,
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact,
    LeaseGrant { id: LeaseId, ttl_s: i64 },
    LeaseRevoke,
    ExpireLeases { expired: Vec<LeaseId> },
    LeaseCheckpoint,
    Error(KvError),
}
