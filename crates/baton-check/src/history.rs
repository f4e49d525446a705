//! The KV history model: what clients asked for, when, and what they were told.
//!
//! A history is a set of [`Operation`]s, each with the time the client invoked it and the time
//! the response arrived. Real-time order between operations is the only ordering the
//! linearizability checker trusts: if A returned before B was invoked, A must take effect
//! before B. Overlapping operations may take effect in either order.
//!
//! An operation whose outcome the client never learned (a timeout, a dropped connection, a
//! crash of the client) has result [`KvResult::Unknown`]: as in Jepsen and porcupine it may
//! take effect at any point after its invocation — even after every other operation — or
//! never. An operation that *definitely* had no effect (rejected before it was proposed) is
//! [`KvResult::Failed`] and is ignored by the checker.
//!
//! Three ways to build a history, for the three kinds of recorder Baton has:
//! - [`History::new`] from operations with explicit times (the simulator, which has a
//!   virtual clock);
//! - [`History::from_events`] from an ordered list of call/return [`Event`]s, where the
//!   position in the list is the time (Jepsen's format; handy in hand-written tests);
//! - [`Recorder`], a thread-safe log that stamps calls and returns with a logical clock in
//!   the order threads report them (real-process tests with many client tasks).

use crate::bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

/// Identifies a client (a Jepsen "process"): a sequence of operations that never overlap.
/// Only used for reports and for pairing events in [`History::from_events`].
pub type ProcessId = u64;

/// A point in time in the caller's units (virtual or real nanoseconds, or a logical
/// counter). Only the order of times matters; equal times count as concurrent.
pub type Time = u64;

/// What a client asked the KV store to do. Every operation touches exactly one key, which is
/// what lets the checker split a history into independent per-key registers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvOp {
    /// `Put(key, value)`: unconditionally set the key.
    Put {
        /// The key written.
        key: Bytes,
        /// The value written.
        value: Bytes,
    },
    /// `Range(key)` for a single key, served linearizably.
    Get {
        /// The key read.
        key: Bytes,
    },
    /// `DeleteRange(key)` for a single key.
    Delete {
        /// The key deleted.
        key: Bytes,
    },
    /// A txn `if value(key) == expected then put(key, new)`, with no else branch.
    /// `expected: None` means "the key does not exist" (etcd's `create_revision == 0`
    /// compare), the usual way to create a key exactly once.
    Cas {
        /// The key compared and written.
        key: Bytes,
        /// The value the key must hold for the put to happen; `None` = the key is absent.
        expected: Option<Bytes>,
        /// The value written when the compare succeeds.
        new: Bytes,
    },
}

impl KvOp {
    /// The single key this operation touches; the unit of partitioning.
    pub fn key(&self) -> &Bytes {
        match self {
            KvOp::Put { key, .. }
            | KvOp::Get { key }
            | KvOp::Delete { key }
            | KvOp::Cas { key, .. } => key,
        }
    }
}

impl fmt::Display for KvOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvOp::Put { key, value } => write!(f, "put {key} = {value}"),
            KvOp::Get { key } => write!(f, "get {key}"),
            KvOp::Delete { key } => write!(f, "delete {key}"),
            KvOp::Cas { key, expected, new } => match expected {
                Some(x) => write!(f, "cas {key}: if == {x} then put {new}"),
                None => write!(f, "cas {key}: if absent then put {new}"),
            },
        }
    }
}

/// What the client was told. Revisions are optional everywhere: when recorded they are
/// checked too (per key, revisions must follow the linearization order), when `None` only
/// values are checked.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvResult {
    /// The put was applied at `revision` (the response header's revision).
    Put {
        /// The new store revision created by this put, if recorded.
        revision: Option<u64>,
    },
    /// The read returned `value` (`None` = key absent).
    Get {
        /// The value read; `None` when the key did not exist.
        value: Option<Bytes>,
        /// The key's `mod_revision` as returned, if recorded. Ignored when `value` is `None`.
        revision: Option<u64>,
    },
    /// The delete completed.
    Delete {
        /// Whether a key was removed (etcd's `deleted` count > 0), if recorded.
        deleted: Option<bool>,
        /// The response header's revision, if recorded: the new revision if a key was
        /// removed, otherwise the store revision at the time of the delete.
        revision: Option<u64>,
    },
    /// The compare-and-set txn completed.
    Cas {
        /// Whether the compare held and the put was applied.
        succeeded: bool,
        /// The response header's revision, if recorded: the new revision on success,
        /// otherwise the store revision at the time of the compare.
        revision: Option<u64>,
    },
    /// The client does not know whether the operation took effect (timeout, connection
    /// lost, client crashed). It may take effect at any point after its invocation, or never.
    Unknown,
    /// The operation definitely did not take effect (for example rejected by validation
    /// before it was proposed). The checker ignores it.
    Failed,
}

impl KvResult {
    fn matches(&self, op: &KvOp) -> bool {
        matches!(
            (op, self),
            (_, KvResult::Unknown | KvResult::Failed)
                | (KvOp::Put { .. }, KvResult::Put { .. })
                | (KvOp::Get { .. }, KvResult::Get { .. })
                | (KvOp::Delete { .. }, KvResult::Delete { .. })
                | (KvOp::Cas { .. }, KvResult::Cas { .. })
        )
    }

    /// Whether the client learned the outcome; only then must the operation be placed
    /// before its return.
    pub fn is_known(&self) -> bool {
        !matches!(self, KvResult::Unknown | KvResult::Failed)
    }
}

fn fmt_rev(f: &mut fmt::Formatter<'_>, revision: &Option<u64>) -> fmt::Result {
    match revision {
        Some(r) => write!(f, " (revision {r})"),
        None => Ok(()),
    }
}

impl fmt::Display for KvResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvResult::Put { revision } => {
                f.write_str("ok")?;
                fmt_rev(f, revision)
            }
            KvResult::Get { value: None, .. } => f.write_str("absent"),
            KvResult::Get {
                value: Some(v),
                revision,
            } => {
                write!(f, "{v}")?;
                match revision {
                    Some(r) => write!(f, " (mod revision {r})"),
                    None => Ok(()),
                }
            }
            KvResult::Delete { deleted, revision } => {
                match deleted {
                    Some(true) => f.write_str("deleted 1")?,
                    Some(false) => f.write_str("deleted 0")?,
                    None => f.write_str("ok")?,
                }
                fmt_rev(f, revision)
            }
            KvResult::Cas {
                succeeded,
                revision,
            } => {
                f.write_str(if *succeeded {
                    "succeeded"
                } else {
                    "compare failed"
                })?;
                fmt_rev(f, revision)
            }
            KvResult::Unknown => f.write_str("unknown (may or may not have taken effect)"),
            KvResult::Failed => f.write_str("error (no effect)"),
        }
    }
}

/// One client operation with its real-time interval and outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// The client that issued it, for reports.
    pub process: ProcessId,
    /// When the request was sent (record it *before* sending).
    pub call: Time,
    /// When the response arrived (record it *after* receiving); `None` if it never did,
    /// which is only allowed for `Unknown`/`Failed` results. Ignored for `Unknown` results,
    /// whose effect may come arbitrarily late.
    pub ret: Option<Time>,
    /// What was asked.
    pub op: KvOp,
    /// What was answered.
    pub result: KvResult,
}

impl Operation {
    /// A completed operation; the common case in hand-written histories.
    pub fn new(process: ProcessId, call: Time, ret: Time, op: KvOp, result: KvResult) -> Self {
        Operation {
            process,
            call,
            ret: Some(ret),
            op,
            result,
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ret {
            Some(r) => write!(f, "p{} [{}, {}] ", self.process, self.call, r)?,
            None => write!(f, "p{} [{}, -] ", self.process, self.call)?,
        }
        write!(f, "{} -> {}", self.op, self.result)
    }
}

/// Why a history was rejected before checking: the recorder, not the system under test,
/// produced something impossible. Reported separately so a recording bug is never mistaken
/// for (or hidden behind) a consistency violation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistoryError {
    /// The result's kind does not match the operation's (e.g. a `Get` result for a `Put`).
    ResultMismatch {
        /// Index of the operation.
        index: usize,
    },
    /// A known result without a return time.
    MissingReturn {
        /// Index of the operation.
        index: usize,
    },
    /// The return time is before the call time.
    ReturnBeforeCall {
        /// Index of the operation.
        index: usize,
    },
    /// In an event list: a return for a process with no call outstanding.
    ReturnWithoutCall {
        /// Index of the event.
        event: usize,
        /// The process named by the return.
        process: ProcessId,
    },
    /// In an event list: a call from a process that still has one outstanding. A Jepsen
    /// process is single-threaded; after an unknown result, use a fresh process id.
    CallWhilePending {
        /// Index of the event.
        event: usize,
        /// The process named by the call.
        process: ProcessId,
    },
    /// A [`CallId`] that the recorder never handed out, or completed twice.
    BadCallId {
        /// The offending id.
        id: usize,
    },
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryError::ResultMismatch { index } => {
                write!(
                    f,
                    "operation #{index}: result kind does not match the operation"
                )
            }
            HistoryError::MissingReturn { index } => {
                write!(f, "operation #{index}: known result but no return time")
            }
            HistoryError::ReturnBeforeCall { index } => {
                write!(f, "operation #{index}: returns before it was called")
            }
            HistoryError::ReturnWithoutCall { event, process } => {
                write!(
                    f,
                    "event {event}: return from p{process}, which has no call pending"
                )
            }
            HistoryError::CallWhilePending { event, process } => {
                write!(
                    f,
                    "event {event}: call from p{process}, which already has one pending"
                )
            }
            HistoryError::BadCallId { id } => {
                write!(f, "call id {id} was never issued or was completed twice")
            }
        }
    }
}

impl std::error::Error for HistoryError {}

/// A validated KV history, ready for [`crate::check_history`].
///
/// Serializable so the simulator can save the history of a failing seed next to its replay
/// command (the caller does the I/O).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Operation>", into = "Vec<Operation>")]
pub struct History {
    ops: Vec<Operation>,
}

impl History {
    /// Validates and wraps operations. Indices into `ops` are the `#n` numbers in reports.
    pub fn new(ops: Vec<Operation>) -> Result<Self, HistoryError> {
        for (index, op) in ops.iter().enumerate() {
            if !op.result.matches(&op.op) {
                return Err(HistoryError::ResultMismatch { index });
            }
            match op.ret {
                None if op.result.is_known() => return Err(HistoryError::MissingReturn { index }),
                Some(r) if r < op.call => return Err(HistoryError::ReturnBeforeCall { index }),
                _ => {}
            }
        }
        Ok(History { ops })
    }

    /// Builds a history from an ordered event list (Jepsen's shape): the position of an
    /// event is its time, so a return listed before a call means "returned before invoked".
    /// A call with no return by the end of the list gets an unknown result.
    pub fn from_events(events: impl IntoIterator<Item = Event>) -> Result<Self, HistoryError> {
        let mut ops: Vec<Operation> = Vec::new();
        let mut pending: HashMap<ProcessId, usize> = HashMap::new();
        for (i, event) in events.into_iter().enumerate() {
            let time = i as Time;
            match event {
                Event::Call { process, op } => {
                    if pending.contains_key(&process) {
                        return Err(HistoryError::CallWhilePending { event: i, process });
                    }
                    pending.insert(process, ops.len());
                    ops.push(Operation {
                        process,
                        call: time,
                        ret: None,
                        op,
                        result: KvResult::Unknown,
                    });
                }
                Event::Return { process, result } => {
                    let Some(index) = pending.remove(&process) else {
                        return Err(HistoryError::ReturnWithoutCall { event: i, process });
                    };
                    ops[index].ret = Some(time);
                    ops[index].result = result;
                }
            }
        }
        History::new(ops)
    }

    /// The operations, in the order given (not necessarily time order).
    pub fn ops(&self) -> &[Operation] {
        &self.ops
    }

    /// Number of operations, including ignored `Failed` ones.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are no operations at all.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl TryFrom<Vec<Operation>> for History {
    type Error = HistoryError;
    fn try_from(ops: Vec<Operation>) -> Result<Self, HistoryError> {
        History::new(ops)
    }
}

impl From<History> for Vec<Operation> {
    fn from(h: History) -> Self {
        h.ops
    }
}

/// One entry of an ordered event list; see [`History::from_events`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// `process` sent `op`.
    Call {
        /// The client.
        process: ProcessId,
        /// The request.
        op: KvOp,
    },
    /// `process` received `result` for its outstanding call.
    Return {
        /// The client.
        process: ProcessId,
        /// The response (or `Unknown` for a timeout).
        result: KvResult,
    },
}

/// Handle for an invoked operation, returned by [`Recorder::invoke`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallId(usize);

/// A thread-safe history log for tests that drive a real cluster from many tasks.
///
/// Times come from a logical clock advanced under one lock, so the recorded order is exactly
/// the order in which threads reported events. As long as each task calls [`invoke`]
/// before sending a request and [`complete`] after receiving the response, "A returned
/// before B was invoked" in the log implies it did in reality — which is all the checker
/// relies on. Calls never completed are recorded as `Unknown`.
///
/// [`invoke`]: Recorder::invoke
/// [`complete`]: Recorder::complete
#[derive(Debug, Default)]
pub struct Recorder {
    inner: Mutex<RecorderInner>,
}

#[derive(Debug, Default)]
struct RecorderInner {
    clock: Time,
    ops: Vec<Operation>,
    done: Vec<bool>,
}

impl Recorder {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecorderInner> {
        // A panicking client task must not make the history unreadable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `process` is about to send `op`.
    pub fn invoke(&self, process: ProcessId, op: KvOp) -> CallId {
        let mut g = self.lock();
        let call = g.clock;
        g.clock += 1;
        let id = g.ops.len();
        g.ops.push(Operation {
            process,
            call,
            ret: None,
            op,
            result: KvResult::Unknown,
        });
        g.done.push(false);
        CallId(id)
    }

    /// Records the outcome of an invoked operation (use `Unknown` for a timeout).
    pub fn complete(&self, id: CallId, result: KvResult) -> Result<(), HistoryError> {
        let mut g = self.lock();
        if id.0 >= g.ops.len() || g.done[id.0] {
            return Err(HistoryError::BadCallId { id: id.0 });
        }
        let ret = g.clock;
        g.clock += 1;
        g.done[id.0] = true;
        g.ops[id.0].ret = Some(ret);
        g.ops[id.0].result = result;
        Ok(())
    }

    /// A validated snapshot of everything recorded so far.
    pub fn history(&self) -> Result<History, HistoryError> {
        History::new(self.lock().ops.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str, v: &str) -> KvOp {
        KvOp::Put {
            key: k.into(),
            value: v.into(),
        }
    }

    #[test]
    fn events_become_intervals_and_pending_calls_become_unknown() {
        let h = History::from_events([
            Event::Call {
                process: 1,
                op: put("k", "a"),
            },
            Event::Call {
                process: 2,
                op: put("k", "b"),
            },
            Event::Return {
                process: 1,
                result: KvResult::Put { revision: None },
            },
        ])
        .unwrap();
        assert_eq!(h.ops()[0].call, 0);
        assert_eq!(h.ops()[0].ret, Some(2));
        assert_eq!(h.ops()[1].result, KvResult::Unknown);
        assert_eq!(h.ops()[1].ret, None);
    }

    #[test]
    fn malformed_event_lists_are_rejected() {
        let ret = Event::Return {
            process: 1,
            result: KvResult::Put { revision: None },
        };
        assert_eq!(
            History::from_events([ret]),
            Err(HistoryError::ReturnWithoutCall {
                event: 0,
                process: 1
            })
        );
        let call = Event::Call {
            process: 1,
            op: put("k", "a"),
        };
        assert_eq!(
            History::from_events([call.clone(), call]),
            Err(HistoryError::CallWhilePending {
                event: 1,
                process: 1
            })
        );
        let bad = Operation::new(
            1,
            0,
            1,
            put("k", "a"),
            KvResult::Get {
                value: None,
                revision: None,
            },
        );
        assert_eq!(
            History::new(vec![bad]),
            Err(HistoryError::ResultMismatch { index: 0 })
        );
        let backwards = Operation::new(1, 5, 4, put("k", "a"), KvResult::Put { revision: None });
        assert_eq!(
            History::new(vec![backwards]),
            Err(HistoryError::ReturnBeforeCall { index: 0 })
        );
    }

    #[test]
    fn recorder_orders_by_reporting_order() {
        let r = Recorder::new();
        let a = r.invoke(1, put("k", "a"));
        let b = r.invoke(2, KvOp::Get { key: "k".into() });
        r.complete(a, KvResult::Put { revision: Some(2) }).unwrap();
        assert!(r.complete(a, KvResult::Unknown).is_err());
        let h = r.history().unwrap();
        assert_eq!(h.ops()[0].call, 0);
        assert_eq!(h.ops()[0].ret, Some(2));
        assert_eq!(h.ops()[1].result, KvResult::Unknown);
        let _ = b;
    }
}
