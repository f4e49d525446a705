//! Transaction ids, branch ids and the global transaction ids (GIDs) sent to databases.
//!
//! A GID is derived from data that is in the decision log *before* it is first sent to a
//! database (the namespace, the transaction id, the branch id), never from anything private
//! to one process. A prepared transaction found in a database can therefore always be traced
//! back to its log record; a GID with a per-process part that was never logged is how
//! pgdog leaked orphaned prepared transactions (pgdogdev/pgdog#1271).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The version prefix of every GID this crate makes; recovery touches nothing else.
pub const GID_PREFIX: &str = "bt1";

/// A global transaction's id: 48 bits of Unix milliseconds then 80 random bits (the layout of
/// a UUIDv7), written as 32 hex digits, so ids sort by creation time in listings.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxId([u8; 16]);

impl TxId {
    /// A fresh id.
    pub fn generate() -> TxId {
        let mut b = [0u8; 16];
        let ms = crate::coordination::now_ms();
        b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        rand::Rng::fill(&mut rand::thread_rng(), &mut b[6..]);
        TxId(b)
    }

    /// The creation time (Unix milliseconds) encoded in the id.
    pub fn created_ms(&self) -> u64 {
        let mut ms = [0u8; 8];
        ms[2..].copy_from_slice(&self.0[..6]);
        u64::from_be_bytes(ms)
    }
}

impl fmt::Display for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TxId({self})")
    }
}

/// A string that is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IdError(String);

impl FromStr for TxId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<TxId, IdError> {
        let bad = || {
            IdError(format!(
                "invalid transaction id {s:?}: expected 32 hex digits"
            ))
        };
        if s.len() != 32 {
            return Err(bad());
        }
        let mut b = [0u8; 16];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        if s.bytes().any(|c| c.is_ascii_uppercase()) {
            return Err(bad());
        }
        Ok(TxId(b))
    }
}

impl Serialize for TxId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TxId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<TxId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The stable name of a participant resource (`pg-orders`, `maria-ledger`): 1-24 of
/// `[A-Za-z0-9_-]`. It names the branch in the log and ends the branch's GID, so the same
/// resource must keep the same name across restarts for recovery to find its branches.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BranchId(String);

impl BranchId {
    /// Checks and wraps a name.
    pub fn new(name: impl Into<String>) -> Result<BranchId, IdError> {
        let name = name.into();
        if name.is_empty()
            || name.len() > 24
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(IdError(format!(
                "invalid branch name {name:?}: use 1-24 of [A-Za-z0-9_-]"
            )));
        }
        Ok(BranchId(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for BranchId {
    type Error = IdError;
    fn try_from(s: String) -> Result<BranchId, IdError> {
        BranchId::new(s)
    }
}

impl From<BranchId> for String {
    fn from(b: BranchId) -> String {
        b.0
    }
}

impl fmt::Display for BranchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for BranchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// The id of one branch of one global transaction in a database: `bt1:<namespace>:<tx>:<branch>`
/// (at most 78 bytes, below PostgreSQL's 200). For MariaDB XA it splits into the gtrid
/// `bt1:<namespace>:<tx>` (at most 53 of XA's 64 bytes) and the bqual `<branch>`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Gid {
    namespace: String,
    tx: TxId,
    branch: BranchId,
}

impl Gid {
    /// The GID of `branch` in transaction `tx` of `namespace` (checked by the log that made
    /// the namespace: 1-16 of `[A-Za-z0-9_-]`).
    pub fn new(namespace: &str, tx: TxId, branch: BranchId) -> Gid {
        Gid {
            namespace: namespace.to_string(),
            tx,
            branch,
        }
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
    /// The transaction.
    pub fn tx(&self) -> TxId {
        self.tx
    }
    /// The branch.
    pub fn branch(&self) -> &BranchId {
        &self.branch
    }

    /// The prefix shared by every GID of `namespace` (for `LIKE 'prefix%'` scans).
    pub fn namespace_prefix(namespace: &str) -> String {
        format!("{GID_PREFIX}:{namespace}:")
    }

    /// The XA gtrid: `bt1:<namespace>:<tx>`.
    pub fn xa_gtrid(&self) -> String {
        format!("{GID_PREFIX}:{}:{}", self.namespace, self.tx)
    }

    /// The XA bqual: the branch name.
    pub fn xa_bqual(&self) -> &str {
        self.branch.as_str()
    }

    /// The GID of an XA transaction found by `XA RECOVER`, if it is one of ours.
    pub fn from_xa(gtrid: &str, bqual: &str) -> Option<Gid> {
        format!("{gtrid}:{bqual}").parse().ok()
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{GID_PREFIX}:{}:{}:{}",
            self.namespace, self.tx, self.branch
        )
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl FromStr for Gid {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Gid, IdError> {
        let bad = || IdError(format!("not a baton-txn GID: {s:?}"));
        let mut parts = s.split(':');
        if parts.next() != Some(GID_PREFIX) {
            return Err(bad());
        }
        let (Some(ns), Some(tx), Some(branch), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        crate::coordination::check_namespace(ns).map_err(|_| bad())?;
        Ok(Gid {
            namespace: ns.to_string(),
            tx: tx.parse()?,
            branch: BranchId::new(branch)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_fit_the_databases_limits() {
        let tx = TxId::generate();
        assert_eq!(tx.to_string().parse::<TxId>().unwrap(), tx);
        let now = crate::coordination::now_ms();
        assert!(tx.created_ms() <= now && now - tx.created_ms() < 10_000);
        let gid = Gid::new(
            "sixteen-chars-ns",
            tx,
            BranchId::new("a-branch-of-24-chars-xxx").unwrap(),
        );
        let s = gid.to_string();
        assert!(s.len() < 200, "PostgreSQL GIDs are shorter than 200 bytes");
        assert!(gid.xa_gtrid().len() <= 64 && gid.xa_bqual().len() <= 64);
        assert_eq!(s.parse::<Gid>().unwrap(), gid);
        assert_eq!(Gid::from_xa(&gid.xa_gtrid(), gid.xa_bqual()).unwrap(), gid);
        assert!(s.starts_with(&Gid::namespace_prefix("sixteen-chars-ns")));
    }

    #[test]
    fn foreign_gids_are_not_ours() {
        for s in [
            "pgdog_123",
            "bt1:ns:zz:b",
            "bt2:ns:0123456789abcdef0123456789abcdef:b",
            "bt1:ns:0123456789abcdef0123456789abcdef:b:extra",
            "bt1:n s:0123456789abcdef0123456789abcdef:b",
            "bt1:ns:0123456789ABCDEF0123456789abcdef:b",
        ] {
            assert!(s.parse::<Gid>().is_err(), "{s}");
        }
        assert!(BranchId::new("").is_err());
        assert!(BranchId::new("x".repeat(25)).is_err());
    }

    #[test]
    fn tx_ids_sort_by_time() {
        let a = TxId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = TxId::generate();
        assert!(a < b && a.to_string() < b.to_string());
    }
}
