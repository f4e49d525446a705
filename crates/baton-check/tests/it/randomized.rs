//! Randomized tests of the linearizability checker:
//! - histories from a correct store (linearizable by construction) must pass;
//! - the same histories with a corrupted read must fail;
//! - on small random (often invalid) histories the checker must agree with a brute-force
//!   enumeration of every order, written independently of the checker's model;
//! - a 10-key, 10 000-operation history with 8 concurrent clients checks quickly.

use crate::common::{generate, GenConfig};
use baton_check::{check_history, Bytes, CheckOptions, History, KvOp, KvResult, Operation};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

fn cfg(keys: usize, processes: usize, ops: usize, unknown: f64, revisions: bool) -> GenConfig {
    GenConfig {
        keys,
        processes,
        ops_per_process: ops,
        unknown_prob: unknown,
        revisions,
    }
}

#[test]
fn generated_histories_are_linearizable() {
    for seed in 0..150u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let c = cfg(
            rng.gen_range(1..4),
            rng.gen_range(2..7),
            rng.gen_range(10..40),
            [0.0, 0.05, 0.2][seed as usize % 3],
            seed % 2 == 0,
        );
        let h = generate(&mut rng, &c);
        let r = check_history(&h, &CheckOptions::default());
        assert!(r.is_linearizable(), "seed {seed} {c:?}:\n{r}");
    }
}

/// Indices of reads whose result is known and whose key has some written value.
fn known_reads(h: &History) -> Vec<usize> {
    h.ops()
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o.result, KvResult::Get { .. }))
        .map(|(i, _)| i)
        .collect()
}

fn with_read(h: &History, i: usize, value: Option<Bytes>) -> History {
    let mut ops = h.ops().to_vec();
    ops[i].result = KvResult::Get {
        value,
        revision: None,
    };
    History::new(ops).unwrap()
}

#[test]
fn reads_of_never_written_values_always_fail() {
    let mut checked = 0;
    for seed in 0..100u64 {
        let mut rng = StdRng::seed_from_u64(1000 + seed);
        let h = generate(&mut rng, &cfg(3, 5, 30, 0.05, seed % 2 == 0));
        let reads = known_reads(&h);
        if reads.is_empty() {
            continue;
        }
        let i = reads[rng.gen_range(0..reads.len())];
        let bad = with_read(&h, i, Some("never-written".into()));
        let r = check_history(&bad, &CheckOptions::default());
        assert!(r.is_violation(), "seed {seed}, read #{i}:\n{r}");
        checked += 1;
    }
    assert!(checked > 90);
}

#[test]
fn reads_of_other_written_values_mostly_fail() {
    // Replace a read's value with a different value written to the same key (or absence).
    // Sometimes that is still linearizable (a concurrent write), but mostly it is not.
    let (mut tried, mut caught) = (0, 0);
    for seed in 0..200u64 {
        let mut rng = StdRng::seed_from_u64(2000 + seed);
        let h = generate(&mut rng, &cfg(2, 4, 30, 0.0, false));
        let reads = known_reads(&h);
        if reads.is_empty() {
            continue;
        }
        let i = reads[rng.gen_range(0..reads.len())];
        let key = h.ops()[i].op.key().clone();
        let KvResult::Get { value: actual, .. } = &h.ops()[i].result else {
            unreachable!()
        };
        let mut choices: Vec<Option<Bytes>> = vec![None];
        for o in h.ops() {
            match &o.op {
                KvOp::Put { key: k, value } if *k == key => choices.push(Some(value.clone())),
                KvOp::Cas { key: k, new, .. } if *k == key => choices.push(Some(new.clone())),
                _ => {}
            }
        }
        choices.retain(|c| c != actual);
        if choices.is_empty() {
            continue;
        }
        let v = choices[rng.gen_range(0..choices.len())].clone();
        let r = check_history(&with_read(&h, i, v), &CheckOptions::default());
        assert!(
            !matches!(r.verdict, baton_check::Verdict::Unknown(_)),
            "{r}"
        );
        tried += 1;
        if r.is_violation() {
            caught += 1;
        }
    }
    eprintln!("corrupted reads caught: {caught} of {tried}");
    assert!(tried >= 150);
    assert!(
        caught * 100 >= tried * 85,
        "caught only {caught} of {tried}"
    );
}

// ---------------------------------------------------------------------------------------
// Brute force: every subset of unknown operations, every order consistent with real time,
// every assignment of unrecorded revisions. Deliberately naive and independent of the
// checker's model.

#[derive(Clone, Debug)]
struct St {
    value: Option<Bytes>,
    mod_rev: u64,
    floor: u64,
}

/// All states reachable by applying `o` to `s` (several when a revision is not recorded).
fn apply(s: &St, o: &Operation, max_rev: u64, revisions: bool) -> Vec<St> {
    let writes = |s: &St, value: Option<Bytes>, rev: Option<u64>| -> Vec<St> {
        let revs: Vec<u64> = match rev {
            Some(r) => vec![r],
            None if revisions => (s.floor + 1..=max_rev).collect(),
            None => vec![s.floor + 1],
        };
        revs.into_iter()
            .filter(|r| *r > s.floor)
            .map(|r| St {
                value: value.clone(),
                mod_rev: if value.is_some() { r } else { 0 },
                floor: r,
            })
            .collect()
    };
    let observe = |s: &St, h: Option<u64>| -> Vec<St> {
        match h {
            None => vec![s.clone()],
            Some(h) if h >= s.floor => vec![St {
                floor: h,
                ..s.clone()
            }],
            Some(_) => vec![],
        }
    };
    match (&o.op, &o.result) {
        (KvOp::Put { value, .. }, KvResult::Put { revision }) => {
            writes(s, Some(value.clone()), *revision)
        }
        (KvOp::Put { value, .. }, KvResult::Unknown) => writes(s, Some(value.clone()), None),
        (KvOp::Get { .. }, KvResult::Get { value, revision }) => {
            let ok =
                *value == s.value && (value.is_none() || revision.is_none_or(|m| m == s.mod_rev));
            if ok {
                vec![s.clone()]
            } else {
                vec![]
            }
        }
        (KvOp::Delete { .. }, KvResult::Delete { deleted, revision }) => {
            match (s.value.is_some(), deleted) {
                (true, Some(false)) | (false, Some(true)) => vec![],
                (true, _) => writes(s, None, *revision),
                (false, _) => observe(s, *revision),
            }
        }
        (KvOp::Delete { .. }, KvResult::Unknown) if s.value.is_some() => writes(s, None, None),
        (KvOp::Delete { .. }, KvResult::Unknown) => vec![s.clone()],
        (KvOp::Cas { expected, new, .. }, result) => {
            let holds = s.value == *expected;
            match result {
                KvResult::Cas {
                    succeeded,
                    revision,
                } => match (succeeded, holds) {
                    (true, true) => writes(s, Some(new.clone()), *revision),
                    (false, false) => observe(s, *revision),
                    _ => vec![],
                },
                _ if holds => writes(s, Some(new.clone()), None),
                _ => vec![s.clone()],
            }
        }
        _ => panic!("unexpected op/result {o}"),
    }
}

/// One key's exhaustive search: place operations one at a time in every order that
/// respects real time, branching over every possible state after each.
struct Brute<'a> {
    ops: &'a [&'a Operation],
    included: Vec<usize>,
    max_rev: u64,
    revisions: bool,
}

impl Brute<'_> {
    /// Whether `a` really finished before `b` started (so must come first).
    fn precedes(&self, a: usize, b: usize) -> bool {
        let (a, b) = (self.ops[a], self.ops[b]);
        a.result.is_known() && a.ret.expect("known ops return") < b.call
    }

    fn dfs(&self, placed: &mut Vec<bool>, left: usize, s: &St) -> bool {
        if left == 0 {
            return true;
        }
        for &x in &self.included {
            if placed[x] {
                continue;
            }
            // Every included operation that really precedes x must already be placed.
            if self
                .included
                .iter()
                .any(|&y| !placed[y] && y != x && self.precedes(y, x))
            {
                continue;
            }
            placed[x] = true;
            for next in apply(s, self.ops[x], self.max_rev, self.revisions) {
                if self.dfs(placed, left - 1, &next) {
                    return true;
                }
            }
            placed[x] = false;
        }
        false
    }
}

fn brute_key(ops: &[&Operation], max_rev: u64, revisions: bool) -> bool {
    let unknown: Vec<usize> = (0..ops.len())
        .filter(|&i| ops[i].result == KvResult::Unknown)
        .collect();
    for mask in 0u32..(1 << unknown.len()) {
        let included: Vec<usize> = (0..ops.len())
            .filter(|&i| match unknown.iter().position(|&u| u == i) {
                Some(bit) => mask & (1 << bit) != 0,
                None => true,
            })
            .collect();
        let left = included.len();
        let brute = Brute {
            ops,
            included,
            max_rev,
            revisions,
        };
        let start = St {
            value: None,
            mod_rev: 0,
            floor: 0,
        };
        if brute.dfs(&mut vec![false; ops.len()], left, &start) {
            return true;
        }
    }
    false
}

fn brute_force(h: &History) -> bool {
    let mut by_key: BTreeMap<&Bytes, Vec<&Operation>> = BTreeMap::new();
    let mut max_known = 0;
    let mut revisions = false;
    for o in h.ops() {
        let rev = match &o.result {
            KvResult::Put { revision }
            | KvResult::Get { revision, .. }
            | KvResult::Delete { revision, .. }
            | KvResult::Cas { revision, .. } => *revision,
            _ => None,
        };
        if let Some(r) = rev {
            revisions = true;
            max_known = max_known.max(r);
        }
        match (&o.op, &o.result) {
            (_, KvResult::Failed) | (KvOp::Get { .. }, KvResult::Unknown) => {}
            _ => by_key.entry(o.op.key()).or_default().push(o),
        }
    }
    let max_rev = max_known + h.len() as u64 + 1;
    by_key
        .values()
        .all(|ops| brute_key(ops, max_rev, revisions))
}

/// Changes one thing at random: a value, a revision, a flag, a time, or an outcome.
fn mutate(rng: &mut StdRng, h: &History) -> History {
    let mut ops = h.ops().to_vec();
    let i = rng.gen_range(0..ops.len());
    let values = ["v1", "v2", "v3", "v4", "zz"];
    let some_value = |rng: &mut StdRng| -> Option<Bytes> {
        match rng.gen_range(0..6) {
            0 => None,
            n => Some(values[n - 1].into()),
        }
    };
    let o = &mut ops[i];
    // Revisions are nudged by one more often than not: off-by-one is where bugs live.
    let nudge = |rng: &mut StdRng, r: &mut Option<u64>| {
        *r = match (rng.gen_range(0..4), *r) {
            (0, _) => None,
            (1, Some(x)) => Some(x + 1),
            (2, Some(x)) => Some(x.saturating_sub(1)),
            _ => Some(rng.gen_range(1..10)),
        }
    };
    match rng.gen_range(0..7) {
        0 => o.result = KvResult::Unknown,
        1 => o.result = KvResult::Failed,
        2 => {
            let shift = rng.gen_range(0..30_000);
            o.call = o.call.saturating_sub(shift);
            if let Some(r) = o.ret.as_mut() {
                *r = (*r + shift / 2).max(o.call);
            }
        }
        3 => match &mut o.result {
            KvResult::Put { revision }
            | KvResult::Get { revision, .. }
            | KvResult::Delete { revision, .. }
            | KvResult::Cas { revision, .. } => nudge(rng, revision),
            _ => {}
        },
        _ => match &mut o.result {
            KvResult::Get { value, .. } => *value = some_value(rng),
            KvResult::Put { revision } => nudge(rng, revision),
            KvResult::Delete { deleted, .. } => *deleted = deleted.map(|d| !d),
            KvResult::Cas { succeeded, .. } => *succeeded = !*succeeded,
            _ => {}
        },
    }
    History::new(ops).unwrap()
}

#[test]
fn checker_agrees_with_brute_force_on_small_histories() {
    let (mut yes, mut no) = (0, 0);
    for seed in 0..4000u64 {
        let mut rng = StdRng::seed_from_u64(5000 + seed);
        let c = cfg(
            rng.gen_range(1..3),
            rng.gen_range(2..4),
            rng.gen_range(1..4),
            0.25,
            rng.gen_bool(0.6),
        );
        let mut h = generate(&mut rng, &c);
        if h.len() > 8 {
            continue;
        }
        let mutations = [0, 1, 1, 2, 3][rng.gen_range(0..5)];
        for _ in 0..mutations {
            h = mutate(&mut rng, &h);
        }
        let expected = brute_force(&h);
        let r = check_history(&h, &CheckOptions::default());
        assert!(
            r.is_linearizable() == expected && r.is_violation() != expected,
            "seed {seed}: brute force says {expected}, checker says:\n{r}\nhistory:\n{}",
            h.ops()
                .iter()
                .enumerate()
                .map(|(i, o)| format!("  #{i} {o}\n"))
                .collect::<String>()
        );
        if expected {
            yes += 1;
        } else {
            no += 1;
        }
    }
    eprintln!("brute force agreement: {yes} linearizable, {no} not");
    assert!(yes > 1500 && no > 500, "{yes} linearizable, {no} not");
}

fn timed_check(h: &History) -> (baton_check::Report, Duration) {
    let start = Instant::now();
    let r = check_history(h, &CheckOptions::default());
    (r, start.elapsed())
}

#[test]
fn ten_keys_ten_thousand_ops_eight_clients_check_quickly() {
    for (seed, revisions) in [(7u64, true), (8, false)] {
        let mut rng = StdRng::seed_from_u64(seed);
        let h = generate(&mut rng, &cfg(10, 8, 1250, 0.05, revisions));
        assert_eq!(h.len(), 10_000);
        let (r, took) = timed_check(&h);
        eprintln!(
            "10 keys x ~1000 ops, 8 clients, revisions {revisions}: {took:?}, {} steps",
            r.stats.steps
        );
        assert!(r.is_linearizable(), "{r}");
        assert_eq!(r.stats.keys, 10);
        assert!(took < Duration::from_secs(5), "took {took:?}");

        // The same history with one corrupted read is rejected about as fast.
        let reads = known_reads(&h);
        let i = reads[reads.len() / 2];
        let (r, took) = timed_check(&with_read(&h, i, Some("never-written".into())));
        eprintln!("  with a corrupted read: {took:?}, {} steps", r.stats.steps);
        assert!(r.is_violation(), "{r}");
        assert!(took < Duration::from_secs(5), "took {took:?}");
    }
}

#[test]
fn one_hot_key_with_eight_clients_checks_quickly() {
    let mut rng = StdRng::seed_from_u64(11);
    let h = generate(&mut rng, &cfg(1, 8, 125, 0.05, true));
    let (r, took) = timed_check(&h);
    eprintln!(
        "1 key x 1000 ops, 8 clients: {took:?}, {} steps",
        r.stats.steps
    );
    assert!(r.is_linearizable(), "{r}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let keys: BTreeSet<_> = h.ops().iter().map(|o| o.op.key().clone()).collect();
    assert_eq!(keys.len(), 1);
}
