//! What goes into the log (`Command`) and what applying it returns (`Applied`).
//!
//! These mirror the etcd request shapes field for field so the server's conversion is
//! mechanical, but they belong to the core: `baton-core` depends on nothing internal.

use serde::{Deserialize, Serialize};

use crate::auth::{AuthCommand, AuthError, AuthInfo, AuthResponse};
use crate::fencing_keys::{FencingKeyId, FencingKeyMode, FencingPublicKey, FencingSecret};
use crate::mvcc::VERSION_OVERHEAD_BYTES;
use crate::types::{
    CommandIndex, Event, FencingToken, KeyRange, KeyValue, LeaseId, Revision, Term,
};

/// etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// etcd's largest lease TTL, in seconds.
pub const MAX_LEASE_TTL_S: i64 = 9_000_000_000;
/// Idle time after which a de-duplication session is forgotten when the client asks for none.
pub const DEFAULT_CLIENT_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// Bounds of a de-duplication session's idle timeout (a request asking for more or less is
/// clamped): short enough to be useful, long enough to outlive a leader change.
pub const MIN_CLIENT_TIMEOUT_MS: u64 = 1_000;
pub const MAX_CLIENT_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// One entry of the replicated log as the state machine sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub index: CommandIndex,
    pub term: Term,
    /// Stamped by the leader from its monotonic clock; never goes backwards across entries.
    /// The only source of time the core ever sees.
    pub time_ms: u64,
    pub command: Command,
}

/// A state-changing request, as replicated.
///
/// **Append-only.** bincode encodes a variant by its position, and every data directory's
/// log (and the answers cached in snapshots) holds encoded commands: a variant inserted
/// anywhere but at the end, or reordered, makes every existing log decode as other commands.
/// Persisted: see [`crate::format`]; pinned by `tests/golden/command/`.
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
    /// `ExpireLeases` fenced by the term of the leader whose lease clock decided it: applied
    /// only if the entry carrying it is of that same term, so an expiry decided under one
    /// leadership can never take effect under another (whose clock may have extended the
    /// lease); otherwise it is a no-op.
    ExpireLeasesInTerm {
        term: Term,
        ids: Vec<LeaseId>,
    },
    /// Remaining TTLs measured by the leader, so a new leader does not renew blindly.
    LeaseCheckpoint {
        checkpoints: Vec<(LeaseId, i64)>,
    },
    /// Joins the FIFO queue of lock (or election) `name`: creates the waiter key
    /// `<name>/<lease in lowercase hex>` with `value` and `lease` unless it exists (etcd's
    /// `If create_revision(key) == 0 Then Put`), so enqueueing twice with one lease is a
    /// no-op returning the same key. Registers the lock in the lock registry and, when
    /// `delay_ms` is `Some`, sets its lock-delay. `lease` must not be `NONE`.
    LockEnqueue {
        name: Vec<u8>,
        lease: LeaseId,
        value: Vec<u8>,
        delay_ms: Option<u64>,
    },
    /// Operator action: deletes the holder (the queue's head) of lock `name` and records
    /// `reason` in the lock's force-release history. A `token` other than
    /// `FencingToken::NONE` releases only the holder with that token.
    LockForceRelease {
        name: Vec<u8>,
        token: FencingToken,
        reason: String,
    },
    /// The fence gate: accepts `token` iff it is at least the highest token recorded for
    /// `resource`, and then records it. Changes no key (and so no revision).
    FenceCheck {
        resource: Vec<u8>,
        token: FencingToken,
    },
    /// Opens a de-duplication session; its id is this entry's log index (unique, and the same
    /// on every replica). Sessions idle longer than `timeout_ms` (entry time) are forgotten.
    RegisterClient {
        timeout_ms: u64,
    },
    /// Closes a de-duplication session (its cached answers are dropped).
    UnregisterClient {
        client_id: u64,
    },
    /// A client write applied at most once per `(client_id, sequence)`: a retry of an applied
    /// sequence gets the first answer back and changes nothing. `acknowledged_below` tells
    /// the cache which answers the client has received (they can be dropped, and retries of
    /// them are refused). Only `Put`, `DeleteRange`, `Txn` and `FenceCheck` may be wrapped:
    /// lease and lock commands are idempotent by their own ids.
    Deduplicated {
        client_id: u64,
        sequence: u64,
        acknowledged_below: u64,
        command: Box<Command>,
    },
    /// etcd's `AlarmRequest` ACTIVATE/DEACTIVATE: raises or clears `alarm` for member
    /// `member_id` (the replicated alarm list that `Maintenance.Alarm` GET shows). While a
    /// `NoSpace` alarm is raised, every command that adds data is refused
    /// ([`Command::adds_data`], `KvError::NoSpace`), on every replica alike. Raising one is
    /// the leader's duty (its disk watch); clearing one is also a client's (`etcdctl alarm
    /// disarm`).
    Alarm {
        action: AlarmAction,
        member_id: u64,
        alarm: AlarmType,
    },
    /// A change of the auth store (users, roles, permissions, the flag) or a simple token's
    /// issue (`Authenticate`), as etcd puts them in its log.
    Auth(AuthCommand),
    /// `command` on behalf of `auth`: while auth is enabled, `apply` checks the permission
    /// of `auth.user` for everything the command touches (every key of every op of both
    /// branches and every compare of a txn, the keys of a revoked lease) and refuses it
    /// whole with `KvError::Auth` (`AuthOldRevision` when the auth store changed after the
    /// server checked `auth.revision`, etcd's retry signal). The server wraps every client
    /// write it proposes while auth is on; an unwrapped command is one its server accepted
    /// with auth off, or a duty of the leader. At most one wrapper, outside a
    /// `Deduplicated`.
    Authorized {
        auth: AuthInfo,
        command: Box<Command>,
    },
    /// Installs a fencing-token signing key (`crate::fencing_keys`): the leader's bootstrap
    /// key (only while there is none) or an operator's rotation. `public` is derived from
    /// `secret` by whoever proposes (the core holds bytes and checks nothing of them); only
    /// the leader proposes it, with a seed it drew itself (`baton_raft::origin`), so no
    /// client or peer chooses the cluster's key.
    FencingKey {
        mode: FencingKeyMode,
        public: FencingPublicKey,
        secret: FencingSecret,
    },
}

/// What an [`Command::Alarm`] does.
///
/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AlarmAction {
    Activate,
    Deactivate,
}

/// etcd's `AlarmType` without `NONE` (which means "any" in requests, never a raised alarm).
///
/// Persisted (log and snapshots): see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AlarmType {
    /// A member's disk is (nearly) full, or its store outgrew `--quota-backend-bytes`:
    /// writes that add data are refused until it clears.
    NoSpace,
    /// The cluster's data diverged (etcd's `CORRUPT`, raised by request): every command
    /// that changes the key space or the leases by request is refused until it clears
    /// ([`Command::refused_while_corrupt`]). Appended last (persisted).
    Corrupt,
}

impl AlarmType {
    /// etcd's name, as `etcdctl alarm list` prints it.
    pub fn name(self) -> &'static str {
        match self {
            AlarmType::NoSpace => "NOSPACE",
            AlarmType::Corrupt => "CORRUPT",
        }
    }
}

impl Command {
    /// Whether applying this command can make the replicated state (and so the next
    /// snapshot) bigger: what a `NoSpace` alarm refuses. etcd's capped applier refuses
    /// `Put`, a `Txn` with a put, and `LeaseGrant`; Baton also refuses what creates keys or
    /// sessions by other means (lock enqueue, de-duplication sessions) and looks into nested
    /// txns. Deletes, compaction, revokes, expiry, fence checks (one number per resource)
    /// and alarms stay allowed: they are how an operator makes room.
    pub fn adds_data(&self) -> bool {
        match self.innermost() {
                Command::Put(_)
                | Command::LeaseGrant { .. }
                | Command::LockEnqueue { .. }
                | Command::RegisterClient { .. }
                // A key kept for good (public keys are never collected below the bound).
                | Command::FencingKey { .. } => true,
                Command::Txn(t) => txn_puts(t),
                Command::Auth(a) => a.adds_data(),
                Command::Noop
                | Command::DeleteRange(_)
                | Command::Compact { .. }
                | Command::LeaseRevoke { .. }
                | Command::ExpireLeases { .. }
                | Command::ExpireLeasesInTerm { .. }
                | Command::LeaseCheckpoint { .. }
                | Command::LockForceRelease { .. }
                | Command::FenceCheck { .. }
                | Command::UnregisterClient { .. }
                | Command::Alarm { .. } => false,
            Command::Deduplicated { .. } | Command::Authorized { .. } => {
                unreachable!("innermost() unwraps every wrapper")
            }
        }
    }

    /// The bytes applying this command may add to the state's size estimate
    /// (`StateMachine::approximate_size_bytes`), judged from the request alone: the quota
    /// refuses a write when the store's size plus this reaches `--quota-backend-bytes`, as
    /// etcd's `backendQuota.Available` refuses `size + cost >= quota`. A put costs a version
    /// (key, value and the per-version overhead); a txn its costlier branch (nested txns
    /// likewise), as etcd's `costTxn`; a lease or lock entry, or anything else that adds
    /// data, the per-version overhead plus its key. 0 for what adds no data.
    pub fn quota_cost_bytes(&self) -> u64 {
        if !self.adds_data() {
            return 0;
        }
        match self.innermost() {
            Command::Put(p) => put_cost(p),
            Command::Txn(t) => txn_cost(t),
            Command::LockEnqueue { name, value, .. } => {
                // The waiter's key (the name plus a lease suffix) and its value.
                name.len() as u64 + 17 + value.len() as u64 + VERSION_OVERHEAD_BYTES
            }
            _ => VERSION_OVERHEAD_BYTES,
        }
    }

    /// The command inside any `Deduplicated`/`Authorized` wrappers. A loop, not recursion:
    /// a sender chooses the nesting depth (see `baton_raft::origin`), and this runs before
    /// anything validates it.
    fn innermost(&self) -> &Command {
        let mut command = self;
        while let Command::Deduplicated { command: inner, .. }
        | Command::Authorized { command: inner, .. } = command
        {
            command = inner;
        }
        command
    }
}

impl Command {
    /// Whether a raised `CORRUPT` alarm refuses this command: what etcd 3.4's corrupt
    /// applier (`etcdserver/corrupt.go`, `applierV3Corrupt`) refuses — `Put`,
    /// `DeleteRange`, a `Txn` that reaches its log (a writing one: etcd serves read-only
    /// txns without the log, and so does this, since Baton logs every txn), `Compact`,
    /// `LeaseGrant` and `LeaseRevoke` — and Baton's own commands that change keys by
    /// request (lock enqueue and force-release). Reads are served (etcd's `Range` and
    /// read-only `Txn` use its base applier), alarms can be cleared, and the leader's
    /// duties (lease expiry, checkpoints) go on.
    pub fn refused_while_corrupt(&self) -> bool {
        match self.innermost() {
            Command::Put(_)
            | Command::DeleteRange(_)
            | Command::Compact { .. }
            | Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
            | Command::LockEnqueue { .. }
            | Command::LockForceRelease { .. } => true,
            Command::Txn(t) => txn_writes(t),
            Command::Noop
            | Command::ExpireLeases { .. }
            | Command::ExpireLeasesInTerm { .. }
            | Command::LeaseCheckpoint { .. }
            | Command::FenceCheck { .. }
            | Command::RegisterClient { .. }
            | Command::UnregisterClient { .. }
            | Command::Alarm { .. }
            | Command::Auth(_)
            | Command::FencingKey { .. } => false,
            Command::Deduplicated { .. } | Command::Authorized { .. } => {
                unreachable!("innermost() unwraps every wrapper")
            }
        }
    }
}

/// Whether either branch of `t` (or of a txn nested in it) holds a put or a delete.
fn txn_writes(t: &TxnRequest) -> bool {
    t.success.iter().chain(&t.failure).any(|op| match op {
        RequestOp::Put(_) | RequestOp::DeleteRange(_) => true,
        RequestOp::Txn(inner) => txn_writes(inner),
        RequestOp::Range(_) => false,
    })
}

/// Whether either branch of `t` (or of a txn nested in it) holds a put.
fn put_cost(p: &PutRequest) -> u64 {
    p.key.len() as u64 + p.value.len() as u64 + VERSION_OVERHEAD_BYTES
}

/// A txn's quota cost: its costlier branch (one of them runs), nested txns likewise. An
/// explicit stack, not recursion: the nesting depth is the sender's choice and this runs
/// before validation.
fn txn_cost(root: &TxnRequest) -> u64 {
    enum Step<'a> {
        Enter(&'a TxnRequest),
        Exit(&'a TxnRequest),
    }
    fn nested(ops: &[RequestOp]) -> impl DoubleEndedIterator<Item = &TxnRequest> {
        ops.iter().filter_map(|op| match op {
            RequestOp::Txn(t) => Some(t),
            _ => None,
        })
    }
    fn puts(ops: &[RequestOp]) -> u64 {
        ops.iter()
            .map(|op| match op {
                RequestOp::Put(p) => put_cost(p),
                _ => 0,
            })
            .fold(0, u64::saturating_add)
    }
    // The costs of evaluated txns, in evaluation order: a txn's nested ones (success's,
    // then failure's) are evaluated, and their costs pushed, before its own `Exit`.
    let mut costs: Vec<u64> = Vec::new();
    let mut steps = vec![Step::Enter(root)];
    while let Some(step) = steps.pop() {
        match step {
            Step::Enter(t) => {
                steps.push(Step::Exit(t));
                let children = nested(&t.success).chain(nested(&t.failure));
                steps.extend(children.rev().map(Step::Enter));
            }
            Step::Exit(t) => {
                let in_success = nested(&t.success).count();
                let in_failure = nested(&t.failure).count();
                let first = costs.len() - in_success - in_failure;
                let sum = |c: &[u64]| c.iter().copied().fold(0, u64::saturating_add);
                let success =
                    puts(&t.success).saturating_add(sum(&costs[first..first + in_success]));
                let failure = puts(&t.failure).saturating_add(sum(&costs[first + in_success..]));
                costs.truncate(first);
                costs.push(success.max(failure));
            }
        }
    }
    debug_assert_eq!(costs.len(), 1, "one cost left: the root's");
    costs.pop().unwrap_or(0)
}

fn txn_puts(t: &TxnRequest) -> bool {
    t.success.iter().chain(&t.failure).any(|op| match op {
        RequestOp::Put(_) => true,
        RequestOp::Txn(inner) => txn_puts(inner),
        RequestOp::Range(_) | RequestOp::DeleteRange(_) => false,
    })
}

/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

/// Persisted: see [`crate::format`] (variants append-only).
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
///
/// Persisted: see [`crate::format`] (fields never reorder).
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

/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RangeResponse {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    /// Keys in the range before `limit` and the min/max filters.
    pub count: i64,
}

/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PutRequest {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub lease: LeaseId,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PutResponse {
    pub prev_kv: Option<KeyValue>,
}

/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeleteRangeRequest {
    pub range: KeyRange,
    pub prev_kv: bool,
}

/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DeleteRangeResponse {
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// What a compare looks at, with the operand.
///
/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(#[serde(with = "serde_bytes")] Vec<u8>),
    Lease(i64),
}

/// etcd's `Compare`; with a non-empty `range.range_end` every key in the range must match.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub range: KeyRange,
    pub result: CompareResult,
    pub target: CompareTarget,
}

/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TxnResponse {
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

/// Domain errors. Each maps to exactly one etcd status code and message in the server's
/// error table (`baton-server/src/errors.rs`), which says it in etcd's words, byte for byte
/// (clients match etcd's texts); the `Display` here only names what happened, for logs and
/// the core's own test scripts.
///
/// Persisted: see [`crate::format`] (variants append-only; answers cached in snapshots hold
/// them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum KvError {
    #[error("empty key")]
    EmptyKey,
    #[error("key not found")]
    KeyNotFound,
    #[error("lease not found")]
    LeaseNotFound,
    #[error("lease already exists")]
    LeaseExists,
    #[error("lease TTL above the maximum")]
    LeaseTtlTooLarge,
    #[error("more operations in a txn than allowed")]
    TooManyOps,
    #[error("a key modified twice in one txn")]
    DuplicateKey,
    #[error("revision compacted")]
    Compacted,
    #[error("revision in the future")]
    FutureRevision,
    #[error("request above the size limit")]
    RequestTooLarge,
    // ---- Baton's own (locks and fencing); not etcd's ----
    /// etcd's server silently grants a 60 s lease for `lease = 0` and orphans it, so the lock
    /// vanishes a minute later with no signal (dotnet-etcd#321). Baton refuses instead.
    #[error("lock without a lease")]
    LeaseRequired,
    #[error("empty lock name")]
    EmptyLockName,
    #[error("empty fence resource")]
    EmptyFenceResource,
    #[error("fencing token not positive")]
    InvalidFencingToken,
    #[error("force-release without a reason")]
    ReasonRequired,
    #[error("force-release reason above {} bytes", crate::locks::MAX_REASON_BYTES)]
    ReasonTooLong,
    /// The lock is not held by the key/token the caller named.
    #[error("not the holder")]
    NotHolder,
    #[error("lock delay above {} ms", crate::locks::MAX_LOCK_DELAY_MS)]
    LockDelayTooLong,
    #[error("lock registry full ({} locks)", crate::locks::MAX_LOCKS)]
    LockRegistryFull,
    #[error("fence table full ({} resources)", crate::locks::MAX_FENCE_RESOURCES)]
    FenceTableFull,
    /// The de-duplication session does not exist (never registered, idle past its timeout,
    /// or evicted). Whether an earlier attempt of the request was applied is unknown.
    #[error("unknown client session")]
    UnknownClient,
    /// The request's sequence was acknowledged by the client, or its cached answer evicted:
    /// it cannot be told apart from a duplicate, so it is not applied.
    #[error("sequence already acknowledged")]
    StaleSequence,
    #[error("sequence not positive")]
    InvalidSequence,
    /// Only plain key-value writes and fence checks carry a sequence.
    #[error("command cannot be de-duplicated")]
    NotDeduplicable,
    /// A `NoSpace` alarm is raised: the request would add data (etcd's `ErrNoSpace`, sent
    /// as `ErrGRPCNoSpace`). Appended last: cached answers in snapshots encode it.
    #[error("no space (NOSPACE alarm raised)")]
    NoSpace,
    /// The auth store refused (a permission, a user, a role, the revision).
    #[error("auth: {0}")]
    Auth(AuthError),
    /// `Command::Authorized` nested in another, or inside a `Deduplicated`.
    #[error("misplaced Authorized wrapper")]
    MisplacedAuthorized,
    /// A `CORRUPT` alarm is raised and the command would change the key space or the
    /// leases (etcd's `ErrCorrupt`, sent as `ErrGRPCCorrupt`). Appended last (persisted).
    #[error("corrupt cluster (CORRUPT alarm raised)")]
    Corrupt,
}

impl From<AuthError> for KvError {
    fn from(e: AuthError) -> Self {
        KvError::Auth(e)
    }
}

/// The result of applying one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The store revision after this entry (unchanged if the entry changed nothing).
    pub revision: Revision,
    pub response: Response,
    /// Changes made by this entry, in order, all at `revision` (empty if nothing changed).
    pub events: Vec<Event>,
    /// What this entry did to the key space, counted as etcd counts it (see [`MvccOps`]).
    pub ops: MvccOps,
}

/// The key-space operations of one entry, counted by etcd 3.4's rules for its
/// `etcd_mvcc_{range,put,delete,txn}_total` and `etcd_debugging_mvcc_total_put_size_in_bytes`
/// metrics. Only `apply` knows them (a put inside a txn, the keys a lease revoke deletes, how
/// many compares ran before one failed), so the core hands them out as data and the replica
/// adds them up; the core itself never touches a metric.
///
/// etcd counts per *mvcc transaction* (one read or write view of its store): every range
/// read, put and delete-range call made through it, and the view as a "txn" when it made more
/// than one call. A put or delete that needs the previous value (`prev_kv`, `ignore_value`,
/// `ignore_lease`) reads it first (one more range); a txn's compares are range reads, made
/// in a read view of their own before a writing txn's write view; a lease revoke deletes
/// each of its keys in one write view. A delete-range counts one delete however many keys
/// it removes, and also when it removes none. A command refused before etcd's applier reads
/// the store (lease not found for a top-level put, permission, no space) counts nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MvccOps {
    pub ranges: u64,
    pub puts: u64,
    pub deletes: u64,
    /// Views that made more than one call.
    pub txns: u64,
    /// Key plus value bytes of every put (the value actually written).
    pub put_bytes: u64,
}

impl MvccOps {
    /// Calls made in this view so far.
    pub fn calls(&self) -> u64 {
        self.ranges + self.puts + self.deletes
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &MvccOps) {
        self.ranges += other.ranges;
        self.puts += other.puts;
        self.deletes += other.deletes;
        self.txns += other.txns;
        self.put_bytes += other.put_bytes;
    }
}

/// Per-command results. Domain errors are values, never panics: a failed command changes
/// nothing. Serializable because a follower receives the leader's result of a forwarded
/// command over the wire.
///
/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Noop,
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact,
    LeaseGrant {
        id: LeaseId,
        ttl_s: i64,
    },
    LeaseRevoke,
    /// `expired_holders`: keys deleted by this expiry that were the head of a registered
    /// lock's queue (before the entry), in deletion order. Lock-delay starts for those.
    ExpireLeases {
        expired: Vec<LeaseId>,
        expired_holders: Vec<Vec<u8>>,
    },
    LeaseCheckpoint,
    /// `kv` is the waiter key as it is after the command; `created` is false when it already
    /// existed (the same lease enqueued before).
    LockEnqueue {
        kv: KeyValue,
        created: bool,
    },
    /// The deleted holder; `None` when nobody held the lock.
    LockForceRelease {
        released: Option<KeyValue>,
    },
    /// `highest` is the highest token recorded for the resource after the check.
    FenceCheck {
        accepted: bool,
        highest: FencingToken,
    },
    ClientRegistered {
        client_id: u64,
        timeout_ms: u64,
    },
    /// `existed`: the session was still open.
    ClientUnregistered {
        existed: bool,
    },
    /// The answer to a `Deduplicated` command: the wrapped command's response and the store
    /// revision right after it was applied. `replayed`: this request had been applied before,
    /// and both come from that first application (this entry changed nothing).
    Deduplicated {
        replayed: bool,
        revision: Revision,
        response: Box<Response>,
    },
    Error(KvError),
    /// The answer to [`Command::Alarm`]: `changed` is the alarm raised or cleared, `None`
    /// when it already was (raised twice, or cleared while not raised).
    Alarm {
        changed: Option<(u64, AlarmType)>,
    },
    Auth(AuthResponse),
    /// The answer to [`Command::FencingKey`]: the id the key got, `None` when a bootstrap
    /// found a key already.
    FencingKey {
        installed: Option<FencingKeyId>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the positions bincode encodes: every data directory's log holds these tags, so a
    /// variant inserted anywhere but at the end must fail here, not in production.
    #[test]
    fn persisted_variant_positions_are_frozen() {
        let tag = |c: &Command| {
            u32::from_le_bytes(bincode::serialize(c).unwrap()[..4].try_into().unwrap())
        };
        assert_eq!(tag(&Command::Noop), 0);
        assert_eq!(tag(&Command::UnregisterClient { client_id: 1 }), 14);
        let alarm = Command::Alarm {
            action: AlarmAction::Deactivate,
            member_id: 5,
            alarm: AlarmType::NoSpace,
        };
        assert_eq!(
            bincode::serialize(&alarm).unwrap(),
            [16, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let tag = |e: &KvError| bincode::serialize(e).unwrap()[0];
        assert_eq!(tag(&KvError::NotDeduplicable), 23);
        assert_eq!(tag(&KvError::NoSpace), 24);
        let r = bincode::serialize(&Response::Alarm { changed: None }).unwrap();
        assert_eq!(r[0], 16);
        assert_eq!(
            bincode::serialize(&AlarmType::Corrupt).unwrap(),
            [1, 0, 0, 0]
        );
        assert_eq!(tag(&KvError::Corrupt), 27);
    }

    fn put(key: &str, value_len: usize) -> PutRequest {
        PutRequest {
            key: key.as_bytes().to_vec(),
            value: vec![b'v'; value_len],
            ..PutRequest::default()
        }
    }

    #[test]
    fn quota_cost_counts_a_put_and_the_costlier_branch_of_a_txn() {
        let one = 3 + 100 + VERSION_OVERHEAD_BYTES;
        assert_eq!(Command::Put(put("abc", 100)).quota_cost_bytes(), one);
        // Wrappers do not change the cost.
        let wrapped = Command::Deduplicated {
            client_id: 1,
            sequence: 1,
            acknowledged_below: 0,
            command: Box::new(Command::Put(put("abc", 100))),
        };
        assert_eq!(wrapped.quota_cost_bytes(), one);
        // success: one put and a nested txn whose failure branch puts twice; failure: one
        // put. The nested txn costs its costlier branch (two puts), so success costs three.
        let nested = TxnRequest {
            compare: vec![],
            success: vec![RequestOp::Put(put("abc", 100))],
            failure: vec![
                RequestOp::Put(put("abc", 100)),
                RequestOp::Put(put("abc", 100)),
            ],
        };
        let txn = TxnRequest {
            compare: vec![],
            success: vec![RequestOp::Put(put("abc", 100)), RequestOp::Txn(nested)],
            failure: vec![RequestOp::Put(put("abc", 100))],
        };
        assert_eq!(Command::Txn(txn).quota_cost_bytes(), 3 * one);
        // What adds no data costs nothing; a lease grant its overhead.
        assert_eq!(
            Command::Compact {
                revision: Revision(5)
            }
            .quota_cost_bytes(),
            0
        );
        let grant = Command::LeaseGrant {
            id: LeaseId(7),
            ttl_s: 10,
        };
        assert_eq!(grant.quota_cost_bytes(), VERSION_OVERHEAD_BYTES);
    }

    #[test]
    fn quota_cost_of_a_deep_txn_needs_no_deep_stack() {
        let mut txn = TxnRequest {
            compare: vec![],
            success: vec![RequestOp::Put(put("k", 1))],
            failure: vec![],
        };
        for _ in 0..100_000 {
            txn = TxnRequest {
                compare: vec![],
                success: vec![],
                failure: vec![RequestOp::Txn(txn)],
            };
        }
        let cost = txn_cost(&txn);
        assert_eq!(cost, 1 + 1 + VERSION_OVERHEAD_BYTES);
        // Dropping 100,000 nested boxes recursively would need the deep stack this test
        // is about; take them apart one level at a time.
        let mut next = Some(txn);
        while let Some(mut t) = next.take() {
            next = match t.failure.pop() {
                Some(RequestOp::Txn(inner)) => Some(inner),
                _ => None,
            };
        }
    }
}
