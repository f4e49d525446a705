//! `Applied::ops`: the key-space operations of each entry, counted by etcd 3.4's rules for
//! `etcd_mvcc_{range,put,delete,txn}_total` (mvcc `metricsTxnWrite`: every range, put and
//! delete-range call through one read or write view, and the view as a txn when it made more
//! than one call). Each expectation names the etcd code path it follows.

use baton_core::{
    Command, Compare, CompareResult, CompareTarget, DeleteRangeRequest, Entry, KeyRange, LeaseId,
    MvccOps, PutRequest, RangeRequest, RequestOp, Response, StateMachine, Term, TxnRequest,
};

struct Store {
    sm: StateMachine,
    index: u64,
}

impl Store {
    fn new() -> Store {
        Store {
            sm: StateMachine::new(),
            index: 0,
        }
    }

    fn apply(&mut self, command: Command) -> (Response, MvccOps) {
        self.index += 1;
        let applied = self.sm.apply(&Entry {
            index: baton_core::CommandIndex(self.index),
            term: Term(1),
            time_ms: self.index,
            command,
        });
        (applied.response, applied.ops)
    }
}

fn key(k: &str) -> KeyRange {
    KeyRange {
        key: k.into(),
        range_end: Vec::new(),
    }
}

fn put(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..PutRequest::default()
    }
}

fn ops(ranges: u64, puts: u64, deletes: u64, txns: u64, put_bytes: u64) -> MvccOps {
    MvccOps {
        ranges,
        puts,
        deletes,
        txns,
        put_bytes,
    }
}

fn exists(k: &str) -> Compare {
    Compare {
        range: key(k),
        result: CompareResult::Greater,
        target: CompareTarget::Create(0),
    }
}

/// The sequence etcd's e2e `metricsTest` checks: put k, then put/delete of another key:
/// `etcd_mvcc_put_total 2`, one delete, and every delete of a key counts one.
#[test]
fn puts_and_deletes_count_one_call_each() {
    let mut s = Store::new();
    assert_eq!(s.apply(Command::Put(put("k", "v"))).1, ops(0, 1, 0, 0, 2));
    assert_eq!(s.apply(Command::Put(put("1", "v"))).1, ops(0, 1, 0, 0, 2));
    let del = |k: &str| {
        Command::DeleteRange(DeleteRangeRequest {
            range: key(k),
            prev_kv: false,
        })
    };
    assert_eq!(s.apply(del("1")).1, ops(0, 0, 1, 0, 0));
    // A delete-range that removes nothing is still a call (etcd's applier calls
    // `DeleteRange` unconditionally).
    assert_eq!(s.apply(del("nothing")).1, ops(0, 0, 1, 0, 0));
    assert_eq!(s.sm.key_count(), 1);
}

/// `prev_kv`, `ignore_value` and `ignore_lease` make etcd read the previous value first:
/// one more range in the same view, which then counts as a txn.
#[test]
fn reading_the_previous_value_is_a_range_in_the_same_view() {
    let mut s = Store::new();
    s.apply(Command::Put(put("a", "12345")));
    let with_prev = PutRequest {
        prev_kv: true,
        ..put("a", "xy")
    };
    assert_eq!(s.apply(Command::Put(with_prev)).1, ops(1, 1, 0, 1, 3));
    // The value written with ignore_value is the old one: that is what put_bytes counts.
    let keep_value = PutRequest {
        ignore_value: true,
        ..put("a", "")
    };
    assert_eq!(s.apply(Command::Put(keep_value)).1, ops(1, 1, 0, 1, 3));
    let del_prev = Command::DeleteRange(DeleteRangeRequest {
        range: key("a"),
        prev_kv: true,
    });
    assert_eq!(s.apply(del_prev).1, ops(1, 0, 1, 1, 0));
}

/// A refused put counts what etcd did before refusing: the read of a missing key for
/// `ignore_value`, nothing for a missing lease (looked up before the store is touched).
#[test]
fn refused_puts_count_only_the_reads_made_before_the_refusal() {
    let mut s = Store::new();
    let missing = PutRequest {
        ignore_value: true,
        ..put("missing", "")
    };
    let (resp, o) = s.apply(Command::Put(missing));
    assert!(matches!(resp, Response::Error(_)), "{resp:?}");
    assert_eq!(o, ops(1, 0, 0, 0, 0));
    let no_lease = PutRequest {
        lease: LeaseId(42),
        ..put("k", "v")
    };
    let (resp, o) = s.apply(Command::Put(no_lease));
    assert!(matches!(resp, Response::Error(_)), "{resp:?}");
    assert_eq!(o, MvccOps::default());
}

/// A writing txn: compares (until the first that fails) in a read view, the chosen
/// branch's ops in a write view; each view with one call is no txn.
#[test]
fn a_writing_txn_counts_its_compares_and_its_ops_in_two_views() {
    let mut s = Store::new();
    s.apply(Command::Put(put("a", "1")));
    let txn = TxnRequest {
        // The first compare fails, so the second is never evaluated.
        compare: vec![exists("missing"), exists("a")],
        success: vec![RequestOp::Put(put("s", "1"))],
        failure: vec![RequestOp::Put(put("f", "1"))],
    };
    assert_eq!(s.apply(Command::Txn(txn)).1, ops(1, 1, 0, 0, 2));
    let txn = TxnRequest {
        compare: vec![exists("a"), exists("f")],
        success: vec![
            RequestOp::Put(put("x", "1")),
            RequestOp::DeleteRange(DeleteRangeRequest {
                range: key("f"),
                prev_kv: false,
            }),
            RequestOp::Range(RangeRequest {
                range: key("x"),
                ..RangeRequest::default()
            }),
        ],
        failure: vec![],
    };
    // Read view: 2 compares (a txn); write view: put, delete, range (a txn).
    assert_eq!(s.apply(Command::Txn(txn)).1, ops(3, 1, 1, 2, 2));
}

/// A read-only txn stays in one read view: compares and ranges together.
#[test]
fn a_read_only_txn_is_one_view() {
    let mut s = Store::new();
    s.apply(Command::Put(put("a", "1")));
    let range = |k: &str| {
        RequestOp::Range(RangeRequest {
            range: key(k),
            ..RangeRequest::default()
        })
    };
    let txn = TxnRequest {
        compare: vec![exists("a")],
        success: vec![range("a"), range("b")],
        failure: vec![],
    };
    assert_eq!(s.apply(Command::Txn(txn)).1, ops(3, 0, 0, 1, 0));
    let single = TxnRequest {
        compare: vec![],
        success: vec![range("a")],
        failure: vec![],
    };
    assert_eq!(s.apply(Command::Txn(single)).1, ops(1, 0, 0, 0, 0));
}

/// A put with `ignore_lease` inside a writing txn is read in etcd's check pass (read view)
/// and again when it is applied (write view).
#[test]
fn ignore_flags_in_a_txn_read_in_both_views() {
    let mut s = Store::new();
    s.apply(Command::Put(put("a", "1")));
    let txn = TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Put(PutRequest {
            ignore_lease: true,
            ..put("a", "2")
        })],
        failure: vec![],
    };
    assert_eq!(s.apply(Command::Txn(txn)).1, ops(2, 1, 0, 1, 2));
}

/// A lease revoke deletes each of its keys in one write view (etcd's lessor `Revoke`);
/// an expiry of several leases is one view per lease.
#[test]
fn revoking_a_lease_deletes_each_of_its_keys() {
    let mut s = Store::new();
    for id in [1, 2, 3] {
        s.apply(Command::LeaseGrant {
            id: LeaseId(id),
            ttl_s: 60,
        });
    }
    for (k, lease) in [("a", 1), ("b", 1), ("c", 2)] {
        s.apply(Command::Put(PutRequest {
            lease: LeaseId(lease),
            ..put(k, "v")
        }));
    }
    let revoke = |id| Command::LeaseRevoke { id: LeaseId(id) };
    assert_eq!(s.apply(revoke(1)).1, ops(0, 0, 2, 1, 0));
    // A lease without keys deletes nothing.
    assert_eq!(s.apply(revoke(3)).1, MvccOps::default());
    s.apply(Command::LeaseGrant {
        id: LeaseId(4),
        ttl_s: 60,
    });
    s.apply(Command::Put(PutRequest {
        lease: LeaseId(4),
        ..put("d", "v")
    }));
    let expire = Command::ExpireLeases {
        ids: vec![LeaseId(2), LeaseId(4)],
    };
    assert_eq!(s.apply(expire).1, ops(0, 0, 2, 0, 0));
}
