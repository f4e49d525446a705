//! The workloads, how they are selected on the command line, and the key-value load generator.
//!
//! The key-value workloads follow etcd's own `tools/benchmark` (`put` and `range`) so numbers
//! can be compared with published etcd figures in spirit: random 8-byte keys from a fixed key
//! space, fixed-size values, many clients multiplexed over a few connections, closed loop (each
//! client sends its next request when the previous one returns). The lock workloads live in
//! [`crate::locks`].

use std::time::Duration;

use anyhow::{Context, Result};
use clap::builder::PossibleValue;
use etcd_client::{Client, ConnectOptions};
use serde::Serialize;

use crate::kv::{self, KvLoad, KvOp};

use crate::locks::{self, LockApi, LockShape};
use crate::server::Kind;

/// One benchmark workload. The lock workloads' contender counts are fixed rather than flags:
/// they are the shapes issue 3 asks for (10 and 50 contenders on one lock, 50 lone contenders
/// on 50 locks), and fixed shapes keep results from different runs comparable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Sequential puts from a single client: the latency of one durable write.
    Put1,
    /// Puts from many concurrent clients: how well writes are batched into fsyncs.
    PutN,
    /// Linearizable single-key Range (the default): has to confirm leadership (ReadIndex).
    RangeLinearizable,
    /// Serializable single-key Range: served from local state, the cheapest request there is.
    RangeSerializable,
    /// etcd's v3lock Lock/Unlock, 10 contenders on one lock: the cost of a handoff.
    #[value(name = "lock-handoff-10")]
    #[serde(rename = "lock-handoff-10")]
    LockHandoff10,
    /// Baton's baton.v1 Acquire/Release, 10 contenders on one lock (Baton only).
    #[value(name = "baton-lock-handoff-10")]
    #[serde(rename = "baton-lock-handoff-10")]
    BatonLockHandoff10,
    /// etcd's v3lock Lock/Unlock, 50 contenders on one lock: a handoff with a long queue.
    #[value(name = "lock-handoff-50")]
    #[serde(rename = "lock-handoff-50")]
    LockHandoff50,
    /// Baton's baton.v1 Acquire/Release, 50 contenders on one lock (Baton only).
    #[value(name = "baton-lock-handoff-50")]
    #[serde(rename = "baton-lock-handoff-50")]
    BatonLockHandoff50,
    /// etcd's v3lock Lock/Unlock, 50 distinct locks with one contender each: the cost of an
    /// uncontended acquire and release.
    LockUncontended,
    /// Baton's baton.v1 Acquire/Release, 50 distinct locks with one contender each (Baton only).
    BatonLockUncontended,
}

/// The two families of workloads, selectable as a whole with `--workloads kv,locks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Group {
    /// put1, put-n, range-linearizable, range-serializable.
    Kv,
    /// Every lock workload, v3lock and baton.v1.
    Locks,
}

impl Workload {
    /// Every workload, in the order they run and appear in the tables. Each baton.v1 workload
    /// follows the v3lock one of the same shape, since that is the row its ratio is taken
    /// against.
    pub const ALL: [Workload; 10] = [
        Workload::Put1,
        Workload::PutN,
        Workload::RangeLinearizable,
        Workload::RangeSerializable,
        Workload::LockHandoff10,
        Workload::BatonLockHandoff10,
        Workload::LockHandoff50,
        Workload::BatonLockHandoff50,
        Workload::LockUncontended,
        Workload::BatonLockUncontended,
    ];

    pub fn group(self) -> Group {
        match self.lock_shape() {
            Some(_) => Group::Locks,
            None => Group::Kv,
        }
    }

    /// The lock API, contenders and locks of a lock workload; `None` for key-value workloads.
    pub fn lock_shape(self) -> Option<LockShape> {
        let (api, contenders, locks) = match self {
            Workload::Put1
            | Workload::PutN
            | Workload::RangeLinearizable
            | Workload::RangeSerializable => return None,
            Workload::LockHandoff10 => (LockApi::V3Lock, 10, 1),
            Workload::BatonLockHandoff10 => (LockApi::BatonV1, 10, 1),
            Workload::LockHandoff50 => (LockApi::V3Lock, 50, 1),
            Workload::BatonLockHandoff50 => (LockApi::BatonV1, 50, 1),
            Workload::LockUncontended => (LockApi::V3Lock, 50, 50),
            Workload::BatonLockUncontended => (LockApi::BatonV1, 50, 50),
        };
        Some(LockShape {
            api,
            contenders,
            locks,
        })
    }

    /// Whether `kind` can run this workload at all: etcd has no baton.v1 service.
    pub fn runs_on(self, kind: Kind) -> bool {
        !matches!(self.lock_shape(), Some(s) if s.api == LockApi::BatonV1 && kind == Kind::Etcd)
    }

    /// The workload whose etcd throughput this one's Baton throughput is divided by, when it
    /// is not the workload itself: baton.v1 has no etcd counterpart, so its rows are compared
    /// with etcd's v3lock rows of the same shape (what an etcd user would use instead).
    pub fn ratio_base(self) -> Option<Workload> {
        match self {
            Workload::BatonLockHandoff10 => Some(Workload::LockHandoff10),
            Workload::BatonLockHandoff50 => Some(Workload::LockHandoff50),
            Workload::BatonLockUncontended => Some(Workload::LockUncontended),
            _ => None,
        }
    }

    /// Clients and connections this workload uses under `cfg`.
    pub fn shape(self, cfg: &LoadConfig) -> (usize, usize) {
        match self {
            Workload::Put1 => (1, 1),
            _ => (cfg.clients, cfg.conns),
        }
    }

    /// What one operation is, for the progress lines: a request, or a lock + unlock cycle.
    pub fn unit(self) -> &'static str {
        match self.group() {
            Group::Kv => "ops/s",
            Group::Locks => "cycles/s",
        }
    }

    /// The label used in the table, e.g. `put, 100 clients / 10 conns`.
    pub fn label(self, cfg: &LoadConfig) -> String {
        if let Some(shape) = self.lock_shape() {
            return shape.label();
        }
        let (clients, conns) = self.shape(cfg);
        let op = match self {
            Workload::Put1 | Workload::PutN => "put",
            Workload::RangeLinearizable => "range linearizable",
            _ => "range serializable",
        };
        if clients == 1 {
            format!("{op}, 1 client")
        } else {
            format!("{op}, {clients} clients / {conns} conns")
        }
    }
}

/// One value of `--workloads`: a whole group or a single workload. A hand-written
/// [`clap::ValueEnum`] so that clap lists and validates both kinds of name.
#[derive(Clone, Copy, Debug)]
pub enum Selection {
    Group(Group),
    One(Workload),
}

const SELECTIONS: [Selection; 12] = [
    Selection::Group(Group::Kv),
    Selection::Group(Group::Locks),
    Selection::One(Workload::Put1),
    Selection::One(Workload::PutN),
    Selection::One(Workload::RangeLinearizable),
    Selection::One(Workload::RangeSerializable),
    Selection::One(Workload::LockHandoff10),
    Selection::One(Workload::BatonLockHandoff10),
    Selection::One(Workload::LockHandoff50),
    Selection::One(Workload::BatonLockHandoff50),
    Selection::One(Workload::LockUncontended),
    Selection::One(Workload::BatonLockUncontended),
];

impl clap::ValueEnum for Selection {
    fn value_variants<'a>() -> &'a [Self] {
        &SELECTIONS
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            Selection::Group(g) => g.to_possible_value(),
            Selection::One(w) => w.to_possible_value(),
        }
    }
}

/// The workloads `selections` name, each once, in [`Workload::ALL`] order (so baton.v1 rows
/// stay next to the v3lock rows they are compared with). Empty means all.
pub fn resolve(selections: &[Selection]) -> Vec<Workload> {
    if selections.is_empty() {
        return Workload::ALL.to_vec();
    }
    Workload::ALL
        .into_iter()
        .filter(|w| {
            selections.iter().any(|s| match *s {
                Selection::Group(g) => w.group() == g,
                Selection::One(one) => one == *w,
            })
        })
        .collect()
}

/// The knobs shared by all workloads.
#[derive(Clone, Debug, Serialize)]
pub struct LoadConfig {
    pub clients: usize,
    pub conns: usize,
    pub key_space: u64,
    pub value_size: usize,
    pub warmup: Duration,
    /// Measured time per key-value run.
    pub duration: Duration,
    /// Measured time per lock run. Shorter than `duration` by default: there are more lock
    /// runs (three shapes, two APIs), each reaches its steady state within the warm-up, and
    /// longer runs would add minutes without adding information.
    pub lock_duration: Duration,
    /// TTL of each lock contender's lease (its session).
    pub lock_ttl: Duration,
}

pub use crate::engine::{RunResult, Tally, REQUEST_TIMEOUT};

/// Runs `workload` against `endpoint`: a warm-up, then the workload's measured duration.
///
/// A request counts (in throughput and latency) when it *completes* inside the window
/// `[start + warmup, start + warmup + duration]`; requests that straddle the start of the
/// window are counted, ones still in flight at its end are not, so ops / duration is exactly
/// the completion rate during the window.
pub async fn run(endpoint: &str, workload: Workload, cfg: &LoadConfig) -> Result<RunResult> {
    if let Some(shape) = workload.lock_shape() {
        return locks::run(endpoint, shape, cfg).await;
    }
    let (clients, conns) = workload.shape(cfg);
    let op = match workload {
        Workload::Put1 | Workload::PutN => KvOp::Put,
        Workload::RangeLinearizable => KvOp::Range {
            serializable: false,
        },
        Workload::RangeSerializable => KvOp::Range { serializable: true },
        lock => unreachable!("{lock:?} runs in locks::run"),
    };
    let load = KvLoad {
        op,
        clients,
        conns,
        key_space: cfg.key_space,
        value_size: cfg.value_size,
        total: None,
        client: kv::ClientImpl::H2,
    };
    kv::run(
        &[endpoint.to_string()],
        &load,
        cfg.warmup,
        cfg.duration,
        false,
    )
    .await
}

/// A new connection (`Client`) whose requests time out after `timeout`.
pub async fn connect_with_timeout(endpoint: &str, timeout: Duration) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(timeout);
    Client::connect([endpoint], Some(options))
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_is_selectable_by_name() {
        for w in Workload::ALL {
            assert!(
                SELECTIONS
                    .iter()
                    .any(|s| matches!(s, Selection::One(one) if *one == w)),
                "{w:?} missing from SELECTIONS"
            );
        }
    }

    #[test]
    fn selections_resolve_to_groups_and_names_in_canonical_order() {
        use clap::ValueEnum as _;
        let parse = |names: &[&str]| {
            let selections: Vec<Selection> = names
                .iter()
                .map(|n| Selection::from_str(n, false).unwrap())
                .collect();
            resolve(&selections)
        };
        assert_eq!(parse(&[]), Workload::ALL.to_vec());
        assert_eq!(parse(&["kv", "locks"]), Workload::ALL.to_vec());
        assert_eq!(
            parse(&["locks"]),
            Workload::ALL
                .into_iter()
                .filter(|w| w.lock_shape().is_some())
                .collect::<Vec<_>>()
        );
        assert_eq!(
            parse(&["lock-uncontended", "put1", "put1"]),
            vec![Workload::Put1, Workload::LockUncontended]
        );
        assert!(Selection::from_str("lock-handoff-10", false).is_ok());
        assert!(Selection::from_str("nope", false).is_err());
    }

    #[test]
    fn baton_v1_rows_compare_with_v3lock_rows_of_the_same_shape() {
        for w in Workload::ALL {
            let Some(shape) = w.lock_shape() else {
                continue;
            };
            assert_eq!(w.runs_on(Kind::Etcd), shape.api == LockApi::V3Lock);
            if let Some(base) = w.ratio_base() {
                let base_shape = base.lock_shape().unwrap();
                assert_eq!(base_shape.api, LockApi::V3Lock);
                assert_eq!(
                    (base_shape.contenders, base_shape.locks),
                    (shape.contenders, shape.locks)
                );
            } else {
                assert_eq!(shape.api, LockApi::V3Lock);
            }
        }
    }
}
