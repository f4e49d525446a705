//! The linearizability checker on hand-written known-good and known-bad histories.

use crate::common::*;
use baton_check::{
    check_history, check_operations, CheckOptions, Event, History, KvOp, KvResult, Model, Op,
    Operation, Report, SearchResult, Verdict, Violation,
};

fn check(ops: Vec<Operation>) -> Report {
    check_history(&history(ops), &CheckOptions::default())
}

#[track_caller]
fn assert_ok(ops: Vec<Operation>) {
    let r = check(ops);
    assert!(r.is_linearizable(), "expected linearizable, got:\n{r}");
}

/// Asserts a violation and returns the one for the first failing key.
#[track_caller]
fn assert_violation(ops: Vec<Operation>) -> Violation {
    let r = check(ops);
    match r.verdict {
        Verdict::NotLinearizable(mut vs) => vs.remove(0),
        _ => panic!("expected a violation, got:\n{r}"),
    }
}

#[test]
fn empty_history_is_linearizable() {
    assert_ok(vec![]);
}

#[test]
fn sequential_history() {
    assert_ok(vec![
        get(1, 0, 1, "k", None),
        put(1, 2, 3, "k", "a"),
        get(2, 4, 5, "k", Some("a")),
        put(1, 6, 7, "k", "b"),
        get(2, 8, 9, "k", Some("b")),
        cas(1, 10, 11, "k", Some("a"), "x", false),
        cas(1, 12, 13, "k", Some("b"), "c", true),
        get(2, 14, 15, "k", Some("c")),
        del(1, 16, 17, "k", Some(true)),
        del(1, 18, 19, "k", Some(false)),
        get(2, 20, 21, "k", None),
        cas(2, 22, 23, "k", None, "d", true),
        get(1, 24, 25, "k", Some("d")),
    ]);
}

#[test]
fn sequential_history_with_a_wrong_read() {
    let v = assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        put(1, 2, 3, "k", "b"),
        get(2, 4, 5, "k", Some("a")),
    ]);
    assert_eq!(v.key, "k".into());
    assert_eq!(v.prefix.len(), 2);
    assert_eq!(v.forced_by.index, 2);
    assert_eq!(v.blocked.len(), 1);
    assert!(!v.blocked[0].fits);
    assert_eq!(v.blocked[0].reason, "read \"a\" but the key holds \"b\"");
}

#[test]
fn concurrent_writes_admit_either_order() {
    // Two overlapping puts: a later read may see either, but then must keep seeing it.
    for winner in ["a", "b"] {
        assert_ok(vec![
            put(1, 0, 10, "k", "a"),
            put(2, 1, 9, "k", "b"),
            get(3, 11, 12, "k", Some(winner)),
            get(3, 13, 14, "k", Some(winner)),
        ]);
    }
    // Reads overlapping the writes may see before, between and after them.
    assert_ok(vec![
        put(1, 0, 10, "k", "a"),
        put(2, 1, 9, "k", "b"),
        get(3, 0, 2, "k", None),
        get(4, 2, 5, "k", Some("b")),
        get(3, 3, 8, "k", Some("a")),
        get(5, 11, 12, "k", Some("a")),
    ]);
    // ... but not flip back and forth once both writes are done.
    assert_violation(vec![
        put(1, 0, 10, "k", "a"),
        put(2, 1, 9, "k", "b"),
        get(3, 11, 12, "k", Some("a")),
        get(3, 13, 14, "k", Some("b")),
    ]);
}

#[test]
fn operations_that_only_touch_in_time_count_as_concurrent() {
    // The put returns at the same instant the read is invoked: either order is allowed.
    assert_ok(vec![put(1, 0, 5, "k", "a"), get(2, 5, 6, "k", None)]);
    assert_violation(vec![put(1, 0, 5, "k", "a"), get(2, 6, 7, "k", None)]);
}

#[test]
fn stale_read_is_caught() {
    let v = assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        put(1, 2, 3, "k", "b"),
        get(2, 4, 5, "k", Some("a")),
    ]);
    let text = v.to_string();
    assert!(text.contains("not linearizable on key \"k\""), "{text}");
    assert!(text.contains("#2 p2 [4, 5] get \"k\" -> \"a\""), "{text}");

    // A follower serving a read from before a completed write, with a concurrent writer.
    assert_violation(vec![
        put(1, 0, 10, "k", "a"),
        put(2, 20, 30, "k", "b"),
        get(3, 31, 40, "k", Some("b")),
        get(4, 41, 42, "k", Some("a")),
    ]);
}

#[test]
fn stale_read_of_absent_key_is_caught() {
    assert_violation(vec![put(1, 0, 1, "k", "a"), get(2, 2, 3, "k", None)]);
}

#[test]
fn lost_write_is_caught() {
    // An acknowledged put that later reads never see while they keep seeing the older value.
    let v = assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        put(2, 2, 3, "k", "b"),
        get(3, 4, 5, "k", Some("a")),
        get(3, 6, 7, "k", Some("a")),
    ]);
    assert_eq!(v.forced_by.index, 2, "{v}");
    // The same history is fine if the second put's result was lost: it may never have
    // happened.
    assert_ok(vec![
        put(1, 0, 1, "k", "a"),
        unknown(put(2, 2, 3, "k", "b")),
        get(3, 4, 5, "k", Some("a")),
        get(3, 6, 7, "k", Some("a")),
    ]);
}

#[test]
fn swapped_writes_are_caught() {
    // a is written strictly before b, yet a reader sees b and then a.
    let v = assert_violation(vec![
        put(1, 0, 2, "k", "a"),
        put(2, 3, 5, "k", "b"),
        get(3, 1, 4, "k", Some("b")),
        get(3, 6, 7, "k", Some("a")),
    ]);
    assert_eq!(v.forced_by.index, 3, "{v}");
    // Two readers observing two non-overlapping puts in opposite orders.
    assert_violation(vec![
        put(1, 0, 2, "k", "a"),
        put(1, 3, 5, "k", "b"),
        get(2, 6, 7, "k", Some("b")),
        get(3, 8, 9, "k", Some("a")),
    ]);
    // The same puts' revisions reversed: the later put got a lower revision.
    let v = assert_violation(vec![
        put_rev(1, 0, 1, "k", "a", Some(5)),
        put_rev(2, 2, 3, "k", "b", Some(4)),
    ]);
    assert!(
        v.blocked[0].reason.contains("revision 4"),
        "{}",
        v.blocked[0].reason
    );
}

#[test]
fn cas_anomalies_are_caught() {
    // Two concurrent creates from "absent" cannot both succeed.
    assert_violation(vec![
        cas(1, 0, 10, "lock", None, "p1", true),
        cas(2, 0, 10, "lock", None, "p2", true),
    ]);
    // Two CASes from the same expected value cannot both succeed.
    assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        cas(2, 2, 10, "k", Some("a"), "b", true),
        cas(3, 2, 10, "k", Some("a"), "c", true),
    ]);
    // A CAS cannot fail when the expected value was there all along.
    let v = assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        cas(2, 2, 3, "k", Some("a"), "b", false),
    ]);
    assert_eq!(
        v.blocked[0].reason,
        "compare failed, but the key holds the expected \"a\""
    );
    // Nor succeed when it was not.
    assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        cas(2, 2, 3, "k", Some("z"), "b", true),
    ]);
    // The legal outcome: one wins, the other loses, and reads agree with the winner.
    assert_ok(vec![
        cas(1, 0, 10, "lock", None, "p1", false),
        cas(2, 0, 10, "lock", None, "p2", true),
        get(3, 11, 12, "lock", Some("p2")),
    ]);
}

#[test]
fn delete_anomalies_are_caught() {
    assert_violation(vec![del(1, 0, 1, "k", Some(true))]);
    assert_violation(vec![put(1, 0, 1, "k", "a"), del(1, 2, 3, "k", Some(false))]);
    assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        del(1, 2, 3, "k", Some(true)),
        get(2, 4, 5, "k", Some("a")),
    ]);
    assert_ok(vec![
        put(1, 0, 1, "k", "a"),
        del(1, 2, 8, "k", None),
        get(2, 3, 4, "k", Some("a")),
        get(2, 5, 6, "k", None),
    ]);
}

#[test]
fn unknown_writes_may_take_effect_or_not() {
    let base = || vec![put(1, 0, 1, "k", "a"), unknown(put(2, 2, 3, "k", "b"))];
    // Took effect.
    let mut h = base();
    h.push(get(3, 10, 11, "k", Some("b")));
    assert_ok(h);
    // Never took effect.
    let mut h = base();
    h.push(get(3, 10, 11, "k", Some("a")));
    assert_ok(h);
    // Took effect long after the client gave up.
    let mut h = base();
    h.push(get(3, 10, 11, "k", Some("a")));
    h.push(get(3, 100, 101, "k", Some("b")));
    assert_ok(h);
    // But once seen it cannot be unseen (a is not written again).
    let mut h = base();
    h.push(get(3, 10, 11, "k", Some("b")));
    h.push(get(3, 12, 13, "k", Some("a")));
    assert_violation(h);
    // And it cannot take effect before it was invoked.
    assert_violation(vec![
        get(3, 0, 1, "k", Some("b")),
        unknown(put(2, 2, 3, "k", "b")),
    ]);
}

#[test]
fn unknown_cas_and_delete_may_take_effect_or_not() {
    for seen in [None, Some("x")] {
        assert_ok(vec![
            unknown(cas(1, 0, 1, "k", None, "x", true)),
            get(2, 5, 6, "k", seen),
        ]);
    }
    // An unknown CAS whose compare cannot hold can never take effect.
    assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        unknown(cas(2, 2, 3, "k", Some("zzz"), "x", true)),
        get(3, 5, 6, "k", Some("x")),
    ]);
    for seen in [None, Some("a")] {
        assert_ok(vec![
            put(1, 0, 1, "k", "a"),
            unknown(del(2, 2, 3, "k", None)),
            get(3, 5, 6, "k", seen),
        ]);
    }
}

#[test]
fn many_unknown_writes_are_handled() {
    // Twenty unknown puts, then reads that see some of them in call order.
    let mut h: Vec<Operation> = (0..20)
        .map(|i| unknown(put(i, i, i + 1, "k", &format!("v{i}"))))
        .collect();
    h.push(get(100, 50, 51, "k", Some("v3")));
    h.push(get(100, 52, 53, "k", Some("v17")));
    h.push(get(100, 54, 55, "k", Some("v5")));
    assert_ok(h);
}

#[test]
fn failed_operations_had_no_effect() {
    assert_violation(vec![
        failed(put(1, 0, 1, "k", "a")),
        get(2, 2, 3, "k", Some("a")),
    ]);
    assert_ok(vec![
        failed(put(1, 0, 1, "k", "a")),
        get(2, 2, 3, "k", None),
    ]);
}

#[test]
fn unknown_reads_are_ignored() {
    assert_ok(vec![
        put(1, 0, 1, "k", "a"),
        unknown(get(2, 2, 3, "k", None)),
    ]);
}

#[test]
fn revisions_are_checked_per_key() {
    assert_ok(vec![
        put_rev(1, 0, 1, "k", "a", Some(2)),
        get_rev(2, 2, 3, "k", Some("a"), Some(2)),
        put_rev(1, 4, 5, "k", "b", Some(7)),
        get_rev(2, 6, 7, "k", Some("b"), Some(7)),
    ]);
    // A read reporting the wrong mod revision.
    let v = assert_violation(vec![
        put_rev(1, 0, 1, "k", "a", Some(2)),
        get_rev(2, 2, 3, "k", Some("a"), Some(3)),
    ]);
    assert_eq!(
        v.blocked[0].reason,
        "read mod revision 3 but the last write was at revision 2"
    );
    // Same value, two writes: the revision tells a stale read apart from a fresh one.
    assert_violation(vec![
        put_rev(1, 0, 1, "k", "a", Some(2)),
        put_rev(1, 2, 3, "k", "a", Some(3)),
        get_rev(2, 4, 5, "k", Some("a"), Some(2)),
    ]);
    // An unrecorded revision is pinned down by a later read, within bounds.
    assert_ok(vec![
        put_rev(1, 0, 1, "k", "a", Some(5)),
        put_rev(1, 2, 3, "k", "b", None),
        get_rev(2, 4, 5, "k", Some("b"), Some(9)),
        put_rev(1, 6, 7, "k", "c", Some(10)),
    ]);
    assert_violation(vec![
        put_rev(1, 0, 1, "k", "a", Some(5)),
        put_rev(1, 2, 3, "k", "b", None),
        get_rev(2, 4, 5, "k", Some("b"), Some(5)),
    ]);
    assert_violation(vec![
        put_rev(1, 0, 1, "k", "a", Some(5)),
        put_rev(1, 2, 3, "k", "b", None),
        get_rev(2, 4, 5, "k", Some("b"), Some(9)),
        put_rev(1, 6, 7, "k", "c", Some(8)),
    ]);
    // Keys are independent: other keys' writes take the revisions in between.
    assert_ok(vec![
        put_rev(1, 0, 1, "a", "1", Some(2)),
        put_rev(1, 2, 3, "b", "1", Some(3)),
        put_rev(1, 4, 5, "a", "2", Some(4)),
        get_rev(2, 6, 7, "b", Some("1"), Some(3)),
    ]);
}

#[test]
fn header_revisions_of_non_writes_cannot_go_back() {
    let failed_cas = |call, ret, rev| {
        Operation::new(
            2,
            call,
            ret,
            KvOp::Cas {
                key: "k".into(),
                expected: Some("zzz".into()),
                new: "x".into(),
            },
            KvResult::Cas {
                succeeded: false,
                revision: Some(rev),
            },
        )
    };
    assert_ok(vec![
        put_rev(1, 0, 1, "k", "a", Some(5)),
        failed_cas(2, 3, 9),
    ]);
    assert_violation(vec![
        put_rev(1, 0, 1, "k", "a", Some(5)),
        failed_cas(2, 3, 4),
    ]);
    // An unrecorded write is bounded above by the first header revision after it.
    assert_violation(vec![
        put_rev(1, 0, 1, "k", "a", Some(5)),
        put_rev(1, 2, 3, "k", "b", None),
        failed_cas(4, 5, 6),
        get_rev(3, 6, 7, "k", Some("b"), Some(7)),
    ]);
}

#[test]
fn keys_are_checked_independently_and_reported_in_order() {
    let r = check(vec![
        put(1, 0, 1, "b", "1"),
        get(2, 2, 3, "b", None),
        put(1, 0, 1, "a", "1"),
        get(2, 2, 3, "a", Some("1")),
        put(1, 0, 1, "c", "1"),
        get(2, 2, 3, "c", Some("2")),
    ]);
    assert_eq!(r.stats.keys, 3);
    let Verdict::NotLinearizable(vs) = &r.verdict else {
        panic!("{r}")
    };
    let keys: Vec<_> = vs.iter().map(|v| v.key.to_string()).collect();
    assert_eq!(keys, ["\"b\"", "\"c\""]);
}

#[test]
fn event_lists_are_checked_like_intervals() {
    let p = |k: &str, v: &str| KvOp::Put {
        key: k.into(),
        value: v.into(),
    };
    let g = |k: &str| KvOp::Get { key: k.into() };
    let ok = KvResult::Put { revision: None };
    let read = |v: &str| KvResult::Get {
        value: Some(v.into()),
        revision: None,
    };
    let concurrent = History::from_events([
        Event::Call {
            process: 1,
            op: p("k", "a"),
        },
        Event::Call {
            process: 2,
            op: g("k"),
        },
        Event::Return {
            process: 2,
            result: read("a"),
        },
        Event::Return {
            process: 1,
            result: ok.clone(),
        },
    ])
    .unwrap();
    assert!(check_history(&concurrent, &CheckOptions::default()).is_linearizable());
    let stale = History::from_events([
        Event::Call {
            process: 1,
            op: p("k", "a"),
        },
        Event::Return {
            process: 1,
            result: ok.clone(),
        },
        Event::Call {
            process: 1,
            op: p("k", "b"),
        },
        Event::Return {
            process: 1,
            result: ok,
        },
        Event::Call {
            process: 2,
            op: g("k"),
        },
        Event::Return {
            process: 2,
            result: read("a"),
        },
        // Never returns: unknown.
        Event::Call {
            process: 3,
            op: p("k", "c"),
        },
    ])
    .unwrap();
    assert!(check_history(&stale, &CheckOptions::default()).is_violation());
}

#[test]
fn report_explains_the_failure_readably() {
    let v = assert_violation(vec![
        put(1, 0, 1, "k", "a"),
        put(2, 5, 20, "k", "b"),
        get(3, 2, 3, "k", Some("a")),
        get(3, 4, 10, "k", Some("c")),
    ]);
    let text = v.to_string();
    // The concurrent put of "b" fits after the first read, so the prefix includes it.
    let expected = "\
not linearizable on key \"k\" (4 operations on this key)
  longest linearizable prefix: 3 operations, in linearization order
    #0 p1 [0, 1] put \"k\" = \"a\" -> ok
    #2 p3 [2, 3] get \"k\" -> \"a\"
    #1 p2 [5, 20] put \"k\" = \"b\" -> ok
  state after the prefix: \"b\"
  #3 returned at 10, so one of these had to take effect first, and none can:
    #3 p3 [4, 10] get \"k\" -> \"c\": read \"c\" but the key holds \"b\"
";
    assert_eq!(text, expected);
}

#[test]
fn long_prefixes_are_abbreviated() {
    let mut h: Vec<Operation> = (0..30)
        .map(|i| put(1, 2 * i, 2 * i + 1, "k", &format!("v{i}")))
        .collect();
    h.push(get(2, 100, 101, "k", Some("v3")));
    let text = assert_violation(h).to_string();
    assert!(
        text.contains("... 18 earlier operations not shown"),
        "{text}"
    );
    assert!(text.contains("#29 p1 [58, 59]"), "{text}");
}

#[test]
fn step_budget_yields_unknown() {
    // Many concurrent writes followed by an impossible read: exhaustive search is large.
    let mut h: Vec<Operation> = (0..14)
        .map(|i| put(i, 0, 100, "k", &format!("v{i}")))
        .collect();
    h.push(get(99, 101, 102, "k", Some("nope")));
    let options = CheckOptions {
        max_steps_per_key: 50,
        timeout: None,
    };
    let r = check_history(&history(h.clone()), &options);
    let Verdict::Unknown(us) = &r.verdict else {
        panic!("{r}")
    };
    assert_eq!(us[0].reason, "step budget of 50 exhausted");
    // With the default budget the cache keeps it small (2^14 subsets at most).
    assert!(check_history(&history(h), &CheckOptions::default()).is_violation());
}

/// A model other than the KV register: a counter whose `inc` returns the new value.
struct Counter;

impl Model for Counter {
    type State = u64;
    type Input = ();
    type Output = u64;
    fn init(&self) -> u64 {
        0
    }
    fn step(&self, state: &u64, _: &(), out: Option<&u64>) -> Option<u64> {
        match out {
            Some(v) if *v != state + 1 => None,
            _ => Some(state + 1),
        }
    }
}

#[test]
fn generic_search_works_for_other_models() {
    let inc = |call, ret, out| Op {
        call,
        ret: Some(ret),
        input: (),
        output: Some(out),
    };
    let s = check_operations(
        &Counter,
        &[inc(0, 10, 2), inc(1, 9, 1), inc(11, 12, 3)],
        &CheckOptions::default(),
    );
    assert_eq!(
        s.result,
        SearchResult::Linearizable {
            order: vec![1, 0, 2]
        }
    );
    let s = check_operations(
        &Counter,
        &[inc(0, 1, 2), inc(2, 3, 1)],
        &CheckOptions::default(),
    );
    let SearchResult::NotLinearizable {
        prefix, forced_by, ..
    } = s.result
    else {
        panic!("{s:?}")
    };
    assert!(prefix.is_empty());
    assert_eq!(forced_by, 0);
}
