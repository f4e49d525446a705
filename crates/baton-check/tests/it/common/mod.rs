//! Helpers shared by the checker's integration tests: terse constructors for hand-written
//! histories, and a generator of histories that are linearizable by construction.
#![allow(dead_code)]

use baton_check::{Bytes, History, KvOp, KvResult, Operation, Time};
use rand::Rng;
use std::collections::HashMap;

pub fn put(p: u64, call: Time, ret: Time, key: &str, value: &str) -> Operation {
    put_rev(p, call, ret, key, value, None)
}

pub fn put_rev(
    p: u64,
    call: Time,
    ret: Time,
    key: &str,
    value: &str,
    rev: Option<u64>,
) -> Operation {
    Operation::new(
        p,
        call,
        ret,
        KvOp::Put {
            key: key.into(),
            value: value.into(),
        },
        KvResult::Put { revision: rev },
    )
}

pub fn get(p: u64, call: Time, ret: Time, key: &str, value: Option<&str>) -> Operation {
    get_rev(p, call, ret, key, value, None)
}

pub fn get_rev(
    p: u64,
    call: Time,
    ret: Time,
    key: &str,
    value: Option<&str>,
    rev: Option<u64>,
) -> Operation {
    Operation::new(
        p,
        call,
        ret,
        KvOp::Get { key: key.into() },
        KvResult::Get {
            value: value.map(Bytes::from),
            revision: rev,
        },
    )
}

pub fn del(p: u64, call: Time, ret: Time, key: &str, deleted: Option<bool>) -> Operation {
    Operation::new(
        p,
        call,
        ret,
        KvOp::Delete { key: key.into() },
        KvResult::Delete {
            deleted,
            revision: None,
        },
    )
}

pub fn cas(
    p: u64,
    call: Time,
    ret: Time,
    key: &str,
    expected: Option<&str>,
    new: &str,
    succeeded: bool,
) -> Operation {
    Operation::new(
        p,
        call,
        ret,
        KvOp::Cas {
            key: key.into(),
            expected: expected.map(Bytes::from),
            new: new.into(),
        },
        KvResult::Cas {
            succeeded,
            revision: None,
        },
    )
}

/// The same operation, but the client never learned its outcome.
pub fn unknown(mut op: Operation) -> Operation {
    op.result = KvResult::Unknown;
    op.ret = None;
    op
}

/// The same operation, but it definitely had no effect.
pub fn failed(mut op: Operation) -> Operation {
    op.result = KvResult::Failed;
    op
}

pub fn history(ops: Vec<Operation>) -> History {
    History::new(ops).expect("valid history")
}

/// Shape of a generated history.
#[derive(Clone, Debug)]
pub struct GenConfig {
    pub keys: usize,
    pub processes: usize,
    pub ops_per_process: usize,
    /// Probability that an operation's result is lost (recorded as `Unknown`).
    pub unknown_prob: f64,
    /// Record revisions in results (as a real etcd client would see them).
    pub revisions: bool,
}

/// Runs random operations against a correct in-memory etcd-like store (one global revision
/// counter, per-key values) at random linearization points inside random but valid
/// per-process intervals, so the recorded history is linearizable by construction.
///
/// Operations with lost results may take effect up to three durations after their return
/// time, or not at all — what a real timed-out request may do.
pub fn generate(rng: &mut impl Rng, cfg: &GenConfig) -> History {
    struct Planned {
        op: Operation,
        lin: Time,
        lost: bool,
        applies: bool,
    }
    let mut planned = Vec::new();
    let mut next_value = 0u64;
    for p in 0..cfg.processes {
        let mut t: Time = rng.gen_range(0..5_000);
        for _ in 0..cfg.ops_per_process {
            let call = t;
            let dur = rng.gen_range(1_000..20_000);
            let ret = call + dur;
            t = ret + rng.gen_range(1..5_000);
            let key = format!("k{}", rng.gen_range(0..cfg.keys));
            next_value += 1;
            let value = format!("v{next_value}");
            let op = match rng.gen_range(0..100) {
                0..=34 => KvOp::Put {
                    key: key.as_str().into(),
                    value: value.as_str().into(),
                },
                35..=69 => KvOp::Get {
                    key: key.as_str().into(),
                },
                70..=79 => KvOp::Delete {
                    key: key.as_str().into(),
                },
                _ => {
                    // Expect a recent value (often right, sometimes stale) or absence.
                    let expected = match rng.gen_range(0..4) {
                        0 => None,
                        _ => Some(Bytes::from(format!(
                            "v{}",
                            next_value.saturating_sub(rng.gen_range(1..12))
                        ))),
                    };
                    KvOp::Cas {
                        key: key.as_str().into(),
                        expected,
                        new: value.as_str().into(),
                    }
                }
            };
            let lost = rng.gen_bool(cfg.unknown_prob);
            let lin = if lost {
                call + rng.gen_range(0..=3 * dur)
            } else {
                call + rng.gen_range(0..=dur)
            };
            planned.push(Planned {
                op: Operation {
                    process: p as u64,
                    call,
                    ret: Some(ret),
                    op,
                    result: KvResult::Unknown,
                },
                lin,
                lost,
                applies: !lost || rng.gen_bool(0.5),
            });
        }
    }
    planned.sort_by_key(|p| p.lin);

    let mut revision = 1u64;
    let mut store: HashMap<Bytes, (Bytes, u64)> = HashMap::new();
    let mut results = Vec::with_capacity(planned.len());
    for p in &planned {
        if !p.applies {
            results.push(KvResult::Unknown);
            continue;
        }
        let rev = |r: u64| cfg.revisions.then_some(r);
        let result = match &p.op.op {
            KvOp::Put { key, value } => {
                revision += 1;
                store.insert(key.clone(), (value.clone(), revision));
                KvResult::Put {
                    revision: rev(revision),
                }
            }
            KvOp::Get { key } => {
                let cur = store.get(key);
                KvResult::Get {
                    value: cur.map(|(v, _)| v.clone()),
                    revision: cur.and_then(|(_, m)| rev(*m)),
                }
            }
            KvOp::Delete { key } => {
                let existed = store.remove(key).is_some();
                if existed {
                    revision += 1;
                }
                KvResult::Delete {
                    deleted: Some(existed),
                    revision: rev(revision),
                }
            }
            KvOp::Cas { key, expected, new } => {
                let holds = store.get(key).map(|(v, _)| v) == expected.as_ref();
                if holds {
                    revision += 1;
                    store.insert(key.clone(), (new.clone(), revision));
                }
                KvResult::Cas {
                    succeeded: holds,
                    revision: rev(revision),
                }
            }
        };
        results.push(result);
    }
    let ops = planned
        .into_iter()
        .zip(results)
        .map(|(p, result)| {
            let mut op = p.op;
            // A lost result is unknown whether or not the operation happened.
            op.result = if p.lost { KvResult::Unknown } else { result };
            op
        })
        .collect();
    History::new(ops).expect("generated history is well formed")
}
