//! What the dashboard is told by `baton serve`, and the bounds that keep one page, one
//! refresh and one member's memory small whatever the store holds.

use std::sync::Arc;
use std::time::Duration;

/// How the dashboard reaches the cluster and whom it must ask to log in.
#[derive(Clone)]
pub struct DashboardConfig {
    /// This member's client URLs (as advertised): the dashboard is a client of the cluster
    /// like `baton status`, and reads through its own member first.
    pub endpoints: Vec<String>,
    /// The member's own TLS settings for dialling client URLs (its CA, its certificate as
    /// the client certificate), when the client port has TLS.
    pub tls: Option<baton_client::TlsConfig>,
    /// Whether auth is on, in this member's applied state: the same view the member's own
    /// permission checks use, and available without a quorum (an outage is when the
    /// dashboard matters most). While it says yes, nothing is read for a visitor who has
    /// not logged in.
    pub auth_enabled: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Mark the session cookie `Secure`: the member serves its client port over TLS, so a
    /// token set there must never travel over plain HTTP (a cookie ignores ports).
    pub secure_cookie: bool,
}

impl std::fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DashboardConfig")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("secure_cookie", &self.secure_cookie)
            .finish()
    }
}

/// How often an open page is refreshed. Every refresh of every open page reads the cluster
/// (one status per member, the lock listing and one inspect per shown lock, ...), so this
/// and [`MAX_LIVE_PAGES`] bound the load the dashboard adds.
pub const REFRESH: Duration = Duration::from_secs(1);
/// Pages updated live at once per member (server-sent event streams); past it, a new page
/// gets 503 and its script retries later.
pub const MAX_LIVE_PAGES: usize = 16;
/// Whole pages rendered at once per member (each reads the cluster once, as one refresh
/// of a live page does); past it, 503.
pub const MAX_RENDERS_AT_ONCE: usize = 8;
/// Logins checked at once per member: each is a bcrypt comparison on the server (tens of
/// milliseconds of CPU), so a flood of them through the dashboard waits its turn.
pub const MAX_LOGINS_AT_ONCE: usize = 2;
/// The longest one refresh may take before the page shows what it has as an error.
pub const GATHER_TIMEOUT: Duration = Duration::from_secs(4);
/// Connecting to one member, and one call to it.
pub const MEMBER_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Members whose status is asked (a cluster has 3, 5 or 7; etcd warns above 7).
pub const MAX_MEMBERS: usize = 32;
/// Locks (and elections) listed, with their queues; the rest are counted.
pub const MAX_LOCKS: usize = 50;
/// Waiters shown per lock, in queue order; the rest are counted.
pub const MAX_WAITERS: usize = 10;
/// Leases shown with their TTL and keys; the rest are counted.
pub const MAX_LEASES: usize = 50;
/// Keys shown per lease; the rest are counted.
pub const MAX_LEASE_KEYS: usize = 5;
/// Bytes of an election's proclaimed value kept for display.
pub const MAX_VALUE_BYTES: usize = 64;
/// baton-txn namespaces looked at.
pub const MAX_NAMESPACES: usize = 16;
/// Unfinished sagas, and unfinished 2PC transactions, read per namespace (all of them are
/// counted); stuck ones among them are shown first.
pub const MAX_OPEN_TXNS: usize = 200;
/// Most recently written sagas, and newest 2PC transactions, read per namespace.
pub const MAX_RECENT_TXNS: usize = 20;
/// Saga and 2PC rows shown on the page (stuck first); the rest are counted.
pub const MAX_TXN_ROWS: usize = 50;
/// Characters of an error message shown in a row.
pub const MAX_ERROR_CHARS: usize = 160;
