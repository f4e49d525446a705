//! Tests of what every entry shares (log order, the empty store, a deep txn through the
//! log's encoding), and the helpers the domain modules' own tests build entries with.

use super::store::StateMachine;
use crate::command::{
    Command, Entry, KvError, PutRequest, RequestOp, Response, ResponseOp, TxnRequest,
};
use crate::types::{CommandIndex, LeaseId, Revision, Term};

pub(super) fn entry(index: u64, command: Command) -> Entry {
    Entry {
        index: CommandIndex(index),
        term: Term(1),
        time_ms: index * 10,
        command,
    }
}

pub(super) fn put(key: &str, value: &str) -> Command {
    Command::Put(PutRequest {
        key: key.into(),
        value: value.into(),
        ..PutRequest::default()
    })
}

pub(super) fn enqueue(name: &str, lease: i64) -> Command {
    Command::LockEnqueue {
        name: name.into(),
        lease: LeaseId(lease),
        value: Vec::new(),
        delay_ms: None,
    }
}

/// etcd's deepest txn with a put at the bottom (one op a level, 128 in all) is
/// validated, applied, and written to and read from the log (bincode) like any other;
/// one level more runs out of op budget.
#[test]
fn a_txn_nested_128_deep_applies_and_round_trips_through_bincode() {
    let nested = |levels: usize| {
        let Command::Put(leaf) = put("deep", "v") else {
            unreachable!()
        };
        let mut t = TxnRequest {
            success: vec![RequestOp::Put(leaf)],
            ..TxnRequest::default()
        };
        for _ in 1..levels {
            t = TxnRequest {
                success: vec![RequestOp::Txn(t)],
                ..TxnRequest::default()
            };
        }
        Command::Txn(t)
    };
    assert_eq!(
        StateMachine::validate(&nested(129)),
        Err(KvError::TooManyOps)
    );
    let cmd = nested(128);
    StateMachine::validate(&cmd).unwrap();
    let e = entry(1, cmd);
    let bytes = bincode::serialize(&e).unwrap();
    let back: Entry = bincode::deserialize(&bytes).unwrap();
    assert_eq!(back, e);
    let mut sm = StateMachine::new();
    let applied = sm.apply(&back);
    assert_eq!(applied.revision, Revision(2));
    let Response::Txn(mut r) = applied.response else {
        panic!("{:?}", applied.response)
    };
    let mut depth = 1;
    while let Some(ResponseOp::Txn(inner)) = r.responses.pop() {
        depth += 1;
        r = inner;
    }
    assert_eq!(depth, 128);
    assert_eq!(sm.key_count(), 1);
}

#[test]
fn empty_store_is_at_revision_one() {
    let sm = StateMachine::new();
    assert_eq!(sm.revision(), Revision(1));
    assert_eq!(sm.compact_revision(), Revision(1));
    assert_eq!(sm.last_applied(), (CommandIndex(0), Term(0)));
    assert_eq!(sm.key_count(), 0);
    assert_eq!(StateMachine::default().revision(), Revision(1));
}

#[test]
#[should_panic(expected = "applied after")]
fn out_of_order_apply_panics() {
    let mut sm = StateMachine::new();
    sm.apply(&entry(5, Command::Noop));
    sm.apply(&entry(5, Command::Noop));
}

#[test]
fn index_zero_is_accepted_once_at_the_start() {
    let mut sm = StateMachine::new();
    sm.apply(&entry(0, Command::Noop));
    sm.apply(&entry(1, Command::Noop));
    assert_eq!(sm.last_applied(), (CommandIndex(1), Term(1)));
    assert_eq!(sm.last_time_ms(), 10);
}

/// Without watchers that want `prev_kv`, the events of an overwrite and a delete carry the
/// previous version without its value (reading it may cost a read from the value file);
/// a request's own `prev_kv` is answered with the value either way, and with the default
/// the events carry it too.
#[test]
fn prev_values_in_events_only_when_asked_for() {
    use crate::command::DeleteRangeRequest;
    use crate::types::KeyRange;
    let mut sm = StateMachine::new();
    sm.apply(&entry(0, put("k", "one")));
    let a = sm.apply(&entry(1, put("k", "two")));
    let prev = a.events[0]
        .prev_kv
        .as_ref()
        .expect("an overwrite has a prev_kv");
    assert_eq!(prev.value, b"one", "default: with values");

    sm.set_prev_values_in_events(false);
    let a = sm.apply(&entry(2, put("k", "three")));
    let prev = a.events[0]
        .prev_kv
        .as_ref()
        .expect("an overwrite has a prev_kv");
    assert!(prev.value.is_empty());
    assert_eq!(prev.version, 2);
    assert_eq!(prev.mod_revision, Revision(3));

    let asked = Command::Put(PutRequest {
        key: "k".into(),
        value: "four".into(),
        prev_kv: true,
        ..PutRequest::default()
    });
    let a = sm.apply(&entry(3, asked));
    let Response::Put(r) = &a.response else {
        panic!("{:?}", a.response)
    };
    assert_eq!(r.prev_kv.as_ref().unwrap().value, b"three");

    let del = |prev_kv| {
        Command::DeleteRange(DeleteRangeRequest {
            range: KeyRange {
                key: b"k".to_vec(),
                range_end: Vec::new(),
            },
            prev_kv,
        })
    };
    let a = sm.apply(&entry(4, del(false)));
    assert!(a.events[0].prev_kv.as_ref().unwrap().value.is_empty());
    sm.apply(&entry(5, put("k", "five")));
    let a = sm.apply(&entry(6, del(true)));
    let Response::DeleteRange(r) = &a.response else {
        panic!("{:?}", a.response)
    };
    assert_eq!(r.prev_kvs[0].value, b"five");
}

/// `live_key` is what a range of that one key returns: the newest live version, none once
/// deleted, the new incarnation once re-created.
#[test]
fn live_key_is_the_one_key_range() {
    use crate::command::{DeleteRangeRequest, RangeRequest};
    use crate::types::KeyRange;
    let ranged = |sm: &StateMachine, key: &str| {
        sm.range(&RangeRequest {
            range: KeyRange {
                key: key.into(),
                range_end: Vec::new(),
            },
            ..RangeRequest::default()
        })
        .unwrap()
        .kvs
        .into_iter()
        .next()
    };
    let mut sm = StateMachine::new();
    assert_eq!(sm.live_key(b"k"), None);
    sm.apply(&entry(1, put("k", "one")));
    sm.apply(&entry(2, put("k", "two")));
    sm.apply(&entry(3, put("other", "x")));
    let live = sm.live_key(b"k").expect("live");
    assert_eq!((live.value.as_slice(), live.version), (&b"two"[..], 2));
    assert_eq!(Some(live), ranged(&sm, "k"));
    sm.apply(&entry(
        4,
        Command::DeleteRange(DeleteRangeRequest {
            range: KeyRange {
                key: b"k".to_vec(),
                range_end: Vec::new(),
            },
            prev_kv: false,
        }),
    ));
    assert_eq!(sm.live_key(b"k"), None);
    assert_eq!(ranged(&sm, "k"), None);
    sm.apply(&entry(5, put("k", "three")));
    let again = sm.live_key(b"k").expect("re-created");
    assert_eq!(again.create_revision, Revision(6));
    assert_eq!(Some(again), ranged(&sm, "k"));
}
