//! What one refresh reads from the cluster, before any ordering or formatting: the input of
//! the view model (`view.rs`), which tests build by hand. Every list here is already cut to
//! the bounds in `config.rs`, with the full count beside it.

use baton_txn::saga::SagaOverview;
use baton_txn::twopc::TxRecord;

/// A section that could not be read says why (unreachable, permission denied, ...) in
/// place of its rows; the other sections are still shown.
pub type Reading<T> = Result<T, String>;

/// Everything one refresh read.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// When it was read, Unix ms on this member's clock.
    pub taken_ms: u64,
    /// The user it was read as (`None`: auth is off).
    pub user: Option<String>,
    pub members: Reading<Vec<MemberReading>>,
    pub locks: Reading<LockListing>,
    pub leases: Reading<LeaseListing>,
    pub txns: Reading<TxnListing>,
}

/// One member of the member list, and what its own `Status` said.
#[derive(Clone, Debug)]
pub struct MemberReading {
    pub id: u64,
    pub name: String,
    pub is_learner: bool,
    pub client_urls: Vec<String>,
    /// Its answer to `Maintenance.Status`, asked over its own client URL.
    pub status: Reading<MemberStatus>,
    /// Watchers registered on it (its `/metrics`), when that could be read.
    pub watchers: Option<u64>,
}

/// The parts of a member's `Status` the page shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberStatus {
    /// The leader it knows of (0: none).
    pub leader: u64,
    pub raft_term: u64,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    pub revision: i64,
    pub db_size: i64,
    /// Raised alarms and other errors it reports (`NOSPACE`, ...).
    pub errors: Vec<String>,
}

/// The lock registry: the first locks by name, each inspected.
#[derive(Clone, Debug, Default)]
pub struct LockListing {
    /// Locks in the registry in all.
    pub total: u64,
    pub locks: Vec<LockReading>,
}

/// One lock's queue, as `baton.v1.Lock/Inspect` answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockReading {
    pub name: Vec<u8>,
    /// `None` while nobody holds it (no waiters, or a lock-delay runs).
    pub holder: Option<QueueEntry>,
    /// The holder key's value, cut to `MAX_VALUE_BYTES`: a campaign's proclaimed value
    /// (a lock's key is empty), which is what tells an election from a lock.
    pub holder_value: Vec<u8>,
    /// The first waiters, in queue order (the order they will be granted the lock).
    pub waiters: Vec<QueueEntry>,
    /// Waiters in all (without the holder).
    pub waiter_count: u64,
    pub lock_delay_ms: i64,
    /// Leader time until which the lock is not granted again (0: no delay running).
    pub delayed_until_ms: u64,
}

/// A holder or waiter key of a lock queue.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueEntry {
    pub key: Vec<u8>,
    /// The key's create revision: the fencing token, once it holds the lock.
    pub token: i64,
    pub lease: i64,
    /// Seconds left on its lease (-1: unknown).
    pub ttl_s: i64,
}

/// The leases: how many there are, and the first ones with their TTLs and keys.
#[derive(Clone, Debug, Default)]
pub struct LeaseListing {
    pub total: usize,
    pub leases: Vec<LeaseReading>,
}

/// One lease's `TimeToLive` with its keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseReading {
    pub id: i64,
    /// Seconds left (-1: it expired between the listing and this read).
    pub ttl_s: i64,
    pub granted_ttl_s: i64,
    /// The first attached keys.
    pub keys: Vec<Vec<u8>>,
    /// Attached keys in all.
    pub key_count: usize,
}

/// baton-txn's records, per namespace.
#[derive(Clone, Debug, Default)]
pub struct TxnListing {
    pub namespaces: Vec<NamespaceReading>,
    /// More namespaces exist than were read.
    pub more_namespaces: bool,
}

/// One namespace's sagas and 2PC transactions (each part may fail on its own, e.g. for a
/// user allowed to read only some keys).
#[derive(Clone, Debug)]
pub struct NamespaceReading {
    pub name: String,
    pub sagas: Reading<SagaOverview>,
    pub twopc: Reading<TwoPcReading>,
}

/// A namespace's 2PC decision log, bounded.
#[derive(Clone, Debug, Default)]
pub struct TwoPcReading {
    /// The first unfinished transactions.
    pub open: Vec<TxRecord>,
    /// Unfinished transactions in all.
    pub open_total: u64,
    /// The newest transactions, in any state.
    pub recent: Vec<TxRecord>,
}
