//! The lock-safety checker on known-good and known-bad holder records.

use baton_check::{check_locks, LockRecord, LockViolation};

fn rec(lock: &str, holder: u64, token: u64, enter: u64, exit: u64, accepted: bool) -> LockRecord {
    LockRecord {
        lock: lock.into(),
        holder,
        token,
        enter,
        exit,
        accepted,
    }
}

#[test]
fn sequential_holders_with_increasing_tokens_are_safe() {
    let r = check_locks(&[
        rec("L", 1, 10, 0, 5, true),
        rec("L", 2, 11, 5, 9, true), // starts the instant the previous holder left
        rec("L", 3, 15, 12, 20, true),
        rec("M", 1, 3, 0, 30, true), // another lock, overlapping in time: independent
    ]);
    assert!(r.is_ok(), "{r}");
    assert_eq!((r.locks, r.accepted_holdings, r.rejected), (2, 4, 0));
}

#[test]
fn a_stale_holder_rejected_by_the_fence_is_safe() {
    // Holder 1 paused past its lease; holder 2 acquired; holder 1 woke and wrote with its old
    // token, and the fence said no. That is the fence doing its job.
    let r = check_locks(&[
        rec("L", 1, 10, 0, 50, false),
        rec("L", 1, 10, 0, 4, true),
        rec("L", 2, 11, 20, 30, true),
    ]);
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.rejected, 1);
}

#[test]
fn repeated_writes_of_one_holding_are_merged() {
    let r = check_locks(&[
        rec("L", 1, 10, 0, 2, true),
        rec("L", 1, 10, 3, 5, true),
        rec("L", 2, 11, 6, 9, true),
    ]);
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.accepted_holdings, 2);
    // But a holder coming back with its old token after someone else held the lock is two
    // holders at once as far as the fence could tell.
    let r = check_locks(&[
        rec("L", 1, 10, 0, 2, true),
        rec("L", 2, 11, 3, 5, true),
        rec("L", 1, 10, 6, 9, true),
    ]);
    assert!(
        matches!(r.violations[..], [LockViolation::Overlap { .. }]),
        "{r}"
    );
}

#[test]
fn overlapping_accepted_holders_are_caught() {
    let r = check_locks(&[rec("L", 1, 10, 0, 10, true), rec("L", 2, 11, 5, 15, true)]);
    let [LockViolation::Overlap { first, second }] = &r.violations[..] else {
        panic!("{r}")
    };
    assert_eq!((first.holder, second.holder), (1, 2));
    assert_eq!(
        r.violations[0].to_string(),
        "lock \"L\": two holders accepted by the fence at once: holder 1 token 10 [0, 10] and holder 2 token 11 [5, 15]"
    );
    // A long holding overlapping a later one, with a short one between.
    let r = check_locks(&[
        rec("L", 1, 10, 0, 100, true),
        rec("L", 2, 11, 10, 20, true),
        rec("L", 3, 12, 30, 40, true),
    ]);
    assert_eq!(r.violations.len(), 2, "{r}");
}

#[test]
fn tokens_that_do_not_increase_are_caught() {
    let r = check_locks(&[rec("L", 1, 10, 0, 5, true), rec("L", 2, 9, 6, 9, true)]);
    assert!(
        matches!(&r.violations[..], [LockViolation::TokenNotIncreasing { earlier, later }]
            if earlier.token == 10 && later.token == 9),
        "{r}"
    );
    // Equal tokens from two different holders.
    let r = check_locks(&[rec("L", 1, 10, 0, 5, true), rec("L", 2, 10, 6, 9, true)]);
    assert_eq!(r.violations.len(), 1, "{r}");
    // Compared with the highest token so far, not just the previous holding.
    let r = check_locks(&[
        rec("L", 1, 20, 0, 5, true),
        rec("L", 2, 11, 6, 9, true),
        rec("L", 3, 15, 10, 12, true),
    ]);
    assert_eq!(r.violations.len(), 2, "{r}");
}

#[test]
fn broken_records_are_reported() {
    let r = check_locks(&[rec("L", 1, 10, 9, 5, true)]);
    assert!(
        matches!(r.violations[..], [LockViolation::InvalidInterval(_)]),
        "{r}"
    );
}
