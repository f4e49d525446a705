//! The watch-stream checker on faithful and faulty streams.

use baton_check::{check_watch, EventKind, KeyRange, WatchEvent, WatchSpec, WatchViolation};

fn put(revision: u64, key: &str, value: &str) -> WatchEvent {
    WatchEvent {
        revision,
        key: key.into(),
        kind: EventKind::Put(value.into()),
    }
}

fn del(revision: u64, key: &str) -> WatchEvent {
    WatchEvent {
        revision,
        key: key.into(),
        kind: EventKind::Delete,
    }
}

/// Revisions 2..=9 over keys a/1, a/2 and b, with a txn at revision 6 touching two keys.
fn history() -> Vec<WatchEvent> {
    vec![
        put(2, "a/1", "x"),
        put(3, "b", "y"),
        put(4, "a/2", "z"),
        del(5, "a/1"),
        put(6, "a/1", "t1"),
        put(6, "a/2", "t2"),
        put(7, "b", "w"),
        put(8, "a/2", "u"),
        del(9, "a/2"),
    ]
}

fn prefix_a(start: u64) -> WatchSpec {
    WatchSpec {
        range: KeyRange::Prefix("a/".into()),
        start_revision: start,
        through_revision: None,
    }
}

/// The events of `history()` under `a/` from revision `start`.
fn expected_a(start: u64) -> Vec<WatchEvent> {
    history()
        .into_iter()
        .filter(|e| e.key.starts_with(b"a/") && e.revision >= start)
        .collect()
}

#[test]
fn a_faithful_stream_passes() {
    let got = expected_a(1);
    let s = check_watch(&prefix_a(1), &got, &history()).unwrap();
    assert_eq!((s.received, s.expected, s.last_revision), (7, 7, Some(9)));
    // From a later start revision.
    check_watch(&prefix_a(5), &expected_a(5), &history()).unwrap();
    // A single key, and an open-ended range.
    let single = WatchSpec {
        range: KeyRange::Key("b".into()),
        start_revision: 0,
        through_revision: Some(9),
    };
    check_watch(&single, &[put(3, "b", "y"), put(7, "b", "w")], &history()).unwrap();
    let from_b = WatchSpec {
        range: KeyRange::Range {
            start: "b".into(),
            end: None,
        },
        start_revision: 0,
        through_revision: None,
    };
    check_watch(&from_b, &[put(3, "b", "y")], &history()).unwrap();
}

#[test]
fn a_stream_cut_short_passes_unless_completeness_is_required() {
    let got = &expected_a(1)[..3];
    check_watch(&prefix_a(1), got, &history()).unwrap();
    let mut spec = prefix_a(1);
    spec.through_revision = Some(6);
    let e = check_watch(&spec, got, &history()).unwrap_err();
    assert_eq!(
        *e,
        WatchViolation::Incomplete {
            through: 6,
            missing: vec![put(6, "a/1", "t1"), put(6, "a/2", "t2")],
            missing_count: 2,
        }
    );
    assert_eq!(
        e.to_string(),
        "watch stream stopped short of revision 6: never got rev 6 put \"a/1\" = \"t1\", rev 6 put \"a/2\" = \"t2\""
    );
}

#[test]
fn a_gap_is_caught() {
    let mut got = expected_a(1);
    got.remove(2); // rev 5 delete a/1
    let e = check_watch(&prefix_a(1), &got, &history()).unwrap_err();
    assert_eq!(
        *e,
        WatchViolation::Gap {
            index: 2,
            received: put(6, "a/1", "t1"),
            missing: vec![del(5, "a/1")],
            missing_count: 1,
        }
    );
    // Missing the start of the stream is a gap too.
    let e = check_watch(&prefix_a(1), &expected_a(5), &history()).unwrap_err();
    assert!(
        matches!(
            *e,
            WatchViolation::Gap {
                missing_count: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_duplicate_is_caught() {
    // A reconnect that resumed from the last delivered revision instead of the next one.
    let mut got = expected_a(1)[..4].to_vec(); // through rev 6 a/1
    got.push(put(6, "a/1", "t1"));
    let e = check_watch(&prefix_a(1), &got, &history()).unwrap_err();
    assert!(
        matches!(
            *e,
            WatchViolation::Duplicate {
                index: 4,
                first_index: 3,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn reordering_is_caught() {
    let mut got = expected_a(1);
    got.swap(1, 2); // rev 5 before rev 4
    let e = check_watch(&prefix_a(1), &got, &history()).unwrap_err();
    assert_eq!(
        *e,
        WatchViolation::OutOfOrder {
            index: 2,
            event: put(4, "a/2", "z"),
            after_index: 1,
            after: del(5, "a/1"),
        }
    );
    // Within one txn, the txn's order is the order.
    let mut got = expected_a(1);
    got.swap(3, 4);
    let e = check_watch(&prefix_a(1), &got, &history()).unwrap_err();
    assert!(
        matches!(*e, WatchViolation::OutOfOrder { index: 4, .. }),
        "{e}"
    );
}

#[test]
fn wrong_or_foreign_events_are_caught() {
    // Right revision and key, wrong value.
    let mut got = expected_a(1);
    got[0] = put(2, "a/1", "WRONG");
    let e = check_watch(&prefix_a(1), &got, &history()).unwrap_err();
    assert_eq!(
        *e,
        WatchViolation::Mismatch {
            index: 0,
            received: put(2, "a/1", "WRONG"),
            expected: put(2, "a/1", "x"),
        }
    );
    // A key outside the watched prefix.
    let got = vec![put(2, "a/1", "x"), put(3, "b", "y")];
    let e = check_watch(&prefix_a(1), &got, &history()).unwrap_err();
    assert!(
        matches!(&*e, WatchViolation::Unexpected { index: 1, why, .. } if why.contains("outside")),
        "{e}"
    );
    // An event from before the start revision.
    let e = check_watch(&prefix_a(5), &expected_a(1), &history()).unwrap_err();
    assert!(
        matches!(&*e, WatchViolation::Unexpected { index: 0, why, .. } if why.contains("before the start")),
        "{e}"
    );
    // A change that never happened.
    let e = check_watch(&prefix_a(1), &[put(42, "a/1", "x")], &history()).unwrap_err();
    assert!(
        matches!(*e, WatchViolation::Unexpected { index: 0, .. }),
        "{e}"
    );
}

#[test]
fn a_malformed_authoritative_history_is_a_harness_error() {
    let mut h = history();
    h.swap(0, 1);
    let e = check_watch(&prefix_a(1), &[], &h).unwrap_err();
    assert!(
        matches!(*e, WatchViolation::BadHistory { index: 1, .. }),
        "{e}"
    );
    let h = vec![put(2, "a/1", "x"), put(2, "a/1", "y")];
    let e = check_watch(&prefix_a(1), &[], &h).unwrap_err();
    assert!(
        matches!(*e, WatchViolation::BadHistory { index: 1, .. }),
        "{e}"
    );
}
