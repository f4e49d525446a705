//! What two-phase commit ([`crate::twopc`]) and sagas ([`crate::saga`]) share: their records
//! live in Baton as JSON values, and the writes of a background worker (the Recoverer, the
//! saga orchestrator) are fenced by the Baton election it runs under.
//!
//! Why Baton and not the worker's own disk: a record in Baton's replicated log survives the
//! worker, so any other instance can read it and finish the job. That is what turns 2PC from a
//! blocking protocol (participants wait for the one coordinator that knows the decision) into
//! one that goes on while a Baton majority is up.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton_client::proto::etcdserverpb::response_op::Response;
use baton_client::{
    Client, Compare, CompareOp, FencingToken, GetOptions, KeyValue, Leadership, Op, PutOptions,
    Txn, TxnResponse,
};
use serde::de::DeserializeOwned;

/// The fence of a worker elected through a Baton [`baton_client::Election`]: a write carrying
/// it succeeds only while the worker's leader key still exists with the create revision it
/// was elected with (its fencing token). The check is part of the same Baton transaction as
/// the write, so a worker that was paused past its session and deposed meanwhile cannot
/// write when it wakes up: its key is gone, or a newer leader's key replaced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderFence {
    key: Vec<u8>,
    token: FencingToken,
}

impl LeaderFence {
    /// The fence of `leadership`.
    pub fn of(leadership: &Leadership) -> LeaderFence {
        LeaderFence {
            key: leadership.key().to_vec(),
            token: leadership.fencing_token(),
        }
    }

    /// A fence from its parts: the leader key and its fencing token (the key's create
    /// revision).
    pub fn new(key: impl Into<Vec<u8>>, token: FencingToken) -> LeaderFence {
        LeaderFence {
            key: key.into(),
            token,
        }
    }

    /// The fencing token.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The comparison that holds only while this leadership lasts.
    pub(crate) fn compare(&self) -> Compare {
        Compare::create_revision(self.key.clone(), CompareOp::Equal, self.token.get())
    }

    /// Whether the leadership still holds (a read; a write must use [`Self::compare`] in its
    /// own transaction instead).
    #[cfg_attr(not(feature = "twopc"), allow(dead_code))]
    pub(crate) async fn holds(&self, client: &Client) -> Result<bool, LogError> {
        let r = client.get(self.key.clone(), GetOptions::new()).await?;
        Ok(r.kvs.first().map(|kv| kv.create_revision) == Some(self.token.get()))
    }
}

/// Errors of the records kept in Baton.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// Baton could not be reached or refused the request.
    #[error("Baton: {0}")]
    Baton(#[from] baton_client::Error),
    /// The worker's leadership is gone: a write carrying its [`LeaderFence`] was refused. The
    /// worker must stop; a newer leader carries on.
    #[error("fenced off: the leadership with token {token} is gone")]
    Fenced {
        /// The stale token.
        token: FencingToken,
    },
    /// A record could not be decoded (written by an incompatible version, or not by us).
    #[error("record {key} is not readable: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// The request is not valid (an unknown id, a wrong state for an operator action).
    #[error("{0}")]
    Invalid(String),
    /// A record kept changing under a compare-and-set loop (many writers at once).
    #[error("record {0} kept changing; try again")]
    Contended(String),
}

impl LogError {
    /// The error of a write refused by its fence. Without a fence (a write that carries none
    /// is not refused for it; this only keeps the message total) the token shown is 0.
    pub(crate) fn fenced_off(fence: Option<&LeaderFence>) -> LogError {
        LogError::Fenced {
            token: fence.map_or(FencingToken::new(0), LeaderFence::token),
        }
    }
}

/// Milliseconds since the Unix epoch on this machine's clock. Used for deadlines and for
/// display only; no safety property depends on clocks agreeing (a decision is a
/// compare-and-set, whoever makes it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Decodes a JSON record read from `key`.
pub(crate) fn decode<T: DeserializeOwned>(key: &[u8], value: &[u8]) -> Result<T, LogError> {
    serde_json::from_slice(value).map_err(|e| LogError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: e.to_string(),
    })
}

/// Encodes a record as JSON.
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("records are plain data and always encode")
}

/// Creates `key = value` and the empty marker `open_key` in one Baton transaction, if `key`
/// does not exist yet. `None`: created; otherwise the existing value, which the caller
/// compares with its own (a repeat of its own write whose answer was lost, or a conflict).
/// Used for records that live in an "open" set while they need work (2PC intents, sagas).
pub(crate) async fn create_open(
    client: &Client,
    key: &str,
    value: &[u8],
    open_key: &str,
) -> Result<Option<KeyValue>, LogError> {
    retry(|| async {
        let r = client
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                    .and_then([
                        Op::put(key, value, PutOptions::new()),
                        Op::put(open_key, "", PutOptions::new()),
                    ])
                    .or_else([Op::get(key, GetOptions::new())]),
            )
            .await?;
        if r.succeeded {
            return Ok(None);
        }
        range(&r, 0)
            .and_then(|r| r.kvs.first().cloned())
            .map(Some)
            // Deleted between the compare and the get of one transaction cannot happen;
            // an empty answer means something else wrote the key meanwhile.
            .ok_or_else(|| LogError::Contended(key.to_string()))
    })
    .await
}

/// Checks a namespace: it appears in keys and in the global transaction ids sent to
/// databases, so it is short and plain.
pub(crate) fn check_namespace(ns: &str) -> Result<(), LogError> {
    if ns.is_empty()
        || ns.len() > 16
        || !ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(LogError::Invalid(format!(
            "invalid namespace {ns:?}: use 1-16 of [A-Za-z0-9_-]"
        )));
    }
    Ok(())
}

/// Where every namespace's records live: `baton-txn/<namespace>/…`.
const ROOT: &str = "baton-txn/";

/// Namespaces found in Baton ([`namespaces`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespaces {
    /// In name order.
    pub names: Vec<String>,
    /// Whether there are more after the last one listed.
    pub more: bool,
}

/// The namespaces that have records in Baton (sagas, 2PC transactions, their elections), in
/// name order, at most `limit`. For tools that show every namespace (Baton's dashboard):
/// each namespace costs one keys-only read of one key, which then skips past all of its
/// keys, so a namespace of a million records costs what one of a single record does.
pub async fn namespaces(client: &Client, limit: usize) -> Result<Namespaces, LogError> {
    let end = baton_client::prefix_end(ROOT.as_bytes());
    let mut from = ROOT.as_bytes().to_vec();
    let mut found = Namespaces::default();
    loop {
        let r = retry(|| async {
            Ok(client
                .get(
                    from.clone(),
                    GetOptions::new()
                        .with_range_end(end.clone())
                        .with_keys_only()
                        .with_limit(1),
                )
                .await?)
        })
        .await?;
        let Some(kv) = r.kvs.first() else {
            return Ok(found);
        };
        let rest = &kv.key[ROOT.len()..];
        let name_len = rest.iter().position(|b| *b == b'/').unwrap_or(rest.len());
        let name = String::from_utf8_lossy(&rest[..name_len]).into_owned();
        // Past every key of this namespace (`<name>/` and, for a key without a slash, the
        // key itself).
        let mut next = kv.key[..ROOT.len() + name_len].to_vec();
        next.push(b'/');
        from = baton_client::prefix_end(&next);
        if check_namespace(&name).is_err() {
            // A key no namespace could have written (another tool's): not a namespace.
            continue;
        }
        if found.names.len() == limit {
            found.more = true;
            return Ok(found);
        }
        found.names.push(name);
    }
}

/// Baton calls that fail in a way that may pass are retried this often.
const BATON_ATTEMPTS: u32 = 6;

/// The range answer of a transaction's `i`-th operation.
pub(crate) fn range(r: &TxnResponse, i: usize) -> Option<&baton_client::RangeResponse> {
    match r.responses.get(i)?.response.as_ref()? {
        Response::ResponseRange(r) => Some(r),
        _ => None,
    }
}

/// Runs a Baton call again when it failed in a way that may pass (a failover). Only for calls
/// that are safe to repeat: reads, and writes guarded by a compare that a repeat cannot pass
/// twice.
pub(crate) async fn retry<T, F, Fut>(mut call: F) -> Result<T, LogError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LogError>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Err(LogError::Baton(e)) if e.is_transient() && attempt + 1 < BATON_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_short_and_plain() {
        assert!(check_namespace("bank-1").is_ok());
        assert!(check_namespace("").is_err());
        assert!(check_namespace("a:b").is_err());
        assert!(check_namespace("seventeen-chars-x").is_err());
    }
}
