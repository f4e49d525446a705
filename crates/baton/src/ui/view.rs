//! The view model: a [`Snapshot`] turned into what the page shows, in the order it shows
//! it, with nothing left to decide in the HTML. Pure (the clock is an argument), so the
//! orderings the page promises are unit-tested here: waiters in queue order, stuck sagas
//! and 2PC transactions first, every list cut with a count of the rest.

use std::collections::BTreeMap;

use baton_txn::saga::{SagaRecord, SagaStatus};
use baton_txn::twopc::{TxRecord, TxState};

use super::config::{MAX_ERROR_CHARS, MAX_TXN_ROWS, MAX_WAITERS};
use super::snapshot::{
    LeaseListing, LockListing, LockReading, MemberReading, QueueEntry, Reading, Snapshot,
    TxnListing,
};
use crate::cli::output::{bytes_human, cut, hex, hex_u64, span, text, utc};
use crate::cli::saga::current as saga_step;
use crate::cli::twopc::{created_ms as tx_created_ms, progress, state_name};

/// The whole page's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// "2026-12-03 10:15:02Z": when the snapshot was read.
    pub as_of: String,
    pub user: Option<String>,
    pub summary: Summary,
    pub members: Reading<Vec<MemberRow>>,
    pub locks: Reading<LocksView>,
    pub leases: Reading<LeasesView>,
    pub txns: Reading<TxnsView>,
}

/// The line of figures at the top.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The leader's name (or id), `None` when no member knows one.
    pub leader: Option<String>,
    pub term: Option<u64>,
    pub healthy: usize,
    pub members: usize,
    pub revision: Option<i64>,
    pub locks: Option<u64>,
    pub leases: Option<usize>,
    /// Stuck sagas and 2PC transactions among those read.
    pub stuck: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRow {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub health: Health,
    pub term: Option<u64>,
    pub index: Option<u64>,
    pub applied: Option<u64>,
    pub revision: Option<i64>,
    pub db_size: Option<String>,
    pub watchers: Option<u64>,
    pub client_urls: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Learner,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Learner => "learner",
        }
    }
}

/// A member's health as its own `Status` tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// It answered but knows no leader.
    NoLeader,
    /// It reports alarms or errors (`NOSPACE`, ...).
    Alarm(String),
    /// It did not answer (the error).
    Unreachable(String),
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        *self == Health::Healthy
    }
}

/// The lock registry, split into locks and elections.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocksView {
    pub locks: Vec<LockRow>,
    pub elections: Vec<ElectionRow>,
    /// Locks and elections in the registry in all.
    pub total: u64,
    /// How many of them are not on the page.
    pub not_shown: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRow {
    pub name: String,
    pub holder: Option<HolderRow>,
    pub queue: QueueView,
    pub delay: Delay,
}

/// A queue's waiters in the order they will be served.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueView {
    pub waiters: Vec<WaiterRow>,
    /// Waiters in all.
    pub count: u64,
    /// Waiters after the last one shown.
    pub more: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderRow {
    pub key: String,
    /// The fencing token (the key's create revision).
    pub token: i64,
    pub lease: String,
    /// "12s", or "unknown".
    pub ttl: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterRow {
    /// 1 is next.
    pub position: u64,
    pub key: String,
    /// Its create revision: the token it will hold.
    pub revision: i64,
    pub lease: String,
}

/// A lock's lock-delay (Chubby's): set or not, and whether it is holding the lock back now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delay {
    None,
    /// Set, not running.
    Set {
        ms: u64,
    },
    /// Running after an expired holder: nobody is granted the lock for `left_ms` more.
    Running {
        ms: u64,
        left_ms: u64,
    },
}

/// A queue whose holder carries a value: an election, its holder the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionRow {
    pub name: String,
    pub leader: HolderRow,
    /// The leader's proclaimed value (cut).
    pub value: String,
    /// The candidates waiting behind it.
    pub queue: QueueView,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeasesView {
    pub rows: Vec<LeaseRow>,
    pub total: usize,
    pub not_shown: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub id: String,
    /// "12s", or "expired".
    pub ttl: String,
    pub granted: String,
    pub keys: Vec<String>,
    /// Keys after the last one shown.
    pub more_keys: usize,
}

/// Sagas and 2PC transactions of every namespace in one table, stuck ones first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnsView {
    pub rows: Vec<TxnRow>,
    /// `(kind, state, count)` over everything read, stuck first.
    pub counts: Vec<(Kind, &'static str, usize)>,
    /// Rows read but not shown.
    pub not_shown: usize,
    /// Unfinished ones that exist but were not read (beyond the per-namespace bound).
    pub open_not_read: u64,
    pub namespaces: Vec<String>,
    pub more_namespaces: bool,
    /// Namespaces or parts of them that could not be read.
    pub errors: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Saga,
    TwoPc,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Saga => "saga",
            Kind::TwoPc => "2PC",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnRow {
    pub kind: Kind,
    pub namespace: String,
    pub id: String,
    pub state: &'static str,
    /// Waiting for a person: a stuck saga, a heuristic or overdue 2PC transaction, or one
    /// whose branches keep failing.
    pub stuck: bool,
    /// Where it is: the step, or the decision and branches.
    pub detail: String,
    pub attempts: Option<u32>,
    pub last_error: String,
    /// How long ago it started.
    pub age: String,
}

/// Builds the view of `s` at `now_ms` (this member's clock).
pub fn build(s: &Snapshot, now_ms: u64) -> View {
    let members = s
        .members
        .as_ref()
        .map(|m| member_rows(m))
        .map_err(Clone::clone);
    let locks = s
        .locks
        .as_ref()
        .map(|l| locks_view(l, now_ms))
        .map_err(Clone::clone);
    let leases = s.leases.as_ref().map(leases_view).map_err(Clone::clone);
    let txns = s
        .txns
        .as_ref()
        .map(|t| txns_view(t, now_ms))
        .map_err(Clone::clone);
    let summary = summary(&members, &locks, &leases, &txns);
    View {
        as_of: utc(s.taken_ms),
        user: s.user.clone(),
        summary,
        members,
        locks,
        leases,
        txns,
    }
}

fn summary(
    members: &Reading<Vec<MemberRow>>,
    locks: &Reading<LocksView>,
    leases: &Reading<LeasesView>,
    txns: &Reading<TxnsView>,
) -> Summary {
    let rows = members.as_ref().map(Vec::as_slice).unwrap_or_default();
    Summary {
        leader: rows
            .iter()
            .find(|m| m.role == Role::Leader)
            .map(|m| m.name.clone()),
        term: rows.iter().filter_map(|m| m.term).max(),
        healthy: rows.iter().filter(|m| m.health.is_healthy()).count(),
        members: rows.len(),
        revision: rows.iter().filter_map(|m| m.revision).max(),
        locks: locks.as_ref().ok().map(|l| l.total),
        leases: leases.as_ref().ok().map(|l| l.total),
        stuck: txns
            .as_ref()
            .ok()
            .map(|t| t.rows.iter().filter(|r| r.stuck).count() + stuck_not_shown(t)),
    }
}

/// Stuck rows cut off the table (they sort first, so only when more than a page is stuck).
fn stuck_not_shown(t: &TxnsView) -> usize {
    let stuck_total: usize = t
        .counts
        .iter()
        .filter(|(_, state, _)| *state == "stuck")
        .map(|(_, _, n)| n)
        .sum();
    stuck_total.saturating_sub(t.rows.iter().filter(|r| r.stuck).count())
}

/// The leader is the one named by the members at the highest term (a member still at an
/// older term may name a deposed one).
fn cluster_leader(members: &[MemberReading]) -> Option<u64> {
    let statuses = members.iter().filter_map(|m| m.status.as_ref().ok());
    let term = statuses.clone().map(|s| s.raft_term).max()?;
    let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
    for s in statuses.filter(|s| s.raft_term == term && s.leader != 0) {
        *votes.entry(s.leader).or_default() += 1;
    }
    votes.into_iter().max_by_key(|(_, n)| *n).map(|(id, _)| id)
}

/// The members by name (the member list's own order is by id, which means nothing to a
/// reader).
fn member_rows(members: &[MemberReading]) -> Vec<MemberRow> {
    let leader = cluster_leader(members);
    let mut sorted: Vec<&MemberReading> = members.iter().collect();
    sorted.sort_by(|a, b| (&a.name, a.id).cmp(&(&b.name, b.id)));
    sorted
        .into_iter()
        .map(|m| {
            let status = m.status.as_ref().ok();
            let health = match &m.status {
                Err(e) => Health::Unreachable(cut(e, MAX_ERROR_CHARS)),
                Ok(s) if !s.errors.is_empty() => {
                    Health::Alarm(cut(&s.errors.join("; "), MAX_ERROR_CHARS))
                }
                Ok(s) if s.leader == 0 => Health::NoLeader,
                Ok(_) => Health::Healthy,
            };
            MemberRow {
                id: hex_u64(m.id),
                name: if m.name.is_empty() {
                    hex_u64(m.id)
                } else {
                    m.name.clone()
                },
                role: if m.is_learner {
                    Role::Learner
                } else if Some(m.id) == leader {
                    Role::Leader
                } else {
                    Role::Follower
                },
                health,
                term: status.map(|s| s.raft_term),
                index: status.map(|s| s.raft_index),
                applied: status.map(|s| s.raft_applied_index),
                revision: status.map(|s| s.revision),
                db_size: status.map(|s| bytes_human(s.db_size)),
                watchers: m.watchers,
                client_urls: m.client_urls.join(", "),
            }
        })
        .collect()
}

fn ttl_cell(ttl_s: i64) -> String {
    if ttl_s < 0 {
        "unknown".into()
    } else {
        format!("{ttl_s}s")
    }
}

fn lease_cell(lease: i64) -> String {
    if lease == 0 {
        "-".into()
    } else {
        hex(lease)
    }
}

fn holder_row(e: &QueueEntry) -> HolderRow {
    HolderRow {
        key: text(&e.key),
        token: e.token,
        lease: lease_cell(e.lease),
        ttl: ttl_cell(e.ttl_s),
    }
}

/// The waiters as read (queue order: the server lists them by create revision), numbered
/// from 1, at most [`MAX_WAITERS`].
fn queue_view(l: &LockReading) -> QueueView {
    let waiters: Vec<WaiterRow> = l
        .waiters
        .iter()
        .take(MAX_WAITERS)
        .enumerate()
        .map(|(i, w)| WaiterRow {
            position: i as u64 + 1,
            key: text(&w.key),
            revision: w.token,
            lease: lease_cell(w.lease),
        })
        .collect();
    QueueView {
        more: l.waiter_count.saturating_sub(waiters.len() as u64),
        count: l.waiter_count,
        waiters,
    }
}

fn delay(l: &LockReading, now_ms: u64) -> Delay {
    let ms = l.lock_delay_ms.max(0) as u64;
    if l.delayed_until_ms > now_ms {
        Delay::Running {
            ms,
            left_ms: l.delayed_until_ms - now_ms,
        }
    } else if ms > 0 {
        Delay::Set { ms }
    } else {
        Delay::None
    }
}

/// Splits the registry: the registry does not record whether a queue was made by
/// `Campaign` or by a lock call (they are one engine), but a campaign's key carries the
/// candidate's value and a lock's key is empty, so a queue whose holder has a value is shown
/// as an election.
fn locks_view(l: &LockListing, now_ms: u64) -> LocksView {
    let mut view = LocksView {
        total: l.total,
        not_shown: l.total.saturating_sub(l.locks.len() as u64),
        ..LocksView::default()
    };
    for lock in &l.locks {
        let name = text(&lock.name);
        match &lock.holder {
            Some(h) if !lock.holder_value.is_empty() => view.elections.push(ElectionRow {
                name,
                leader: holder_row(h),
                value: text(&lock.holder_value),
                queue: queue_view(lock),
            }),
            holder => view.locks.push(LockRow {
                name,
                holder: holder.as_ref().map(holder_row),
                queue: queue_view(lock),
                delay: delay(lock, now_ms),
            }),
        }
    }
    view
}

fn leases_view(l: &LeaseListing) -> LeasesView {
    LeasesView {
        rows: l
            .leases
            .iter()
            .map(|lease| LeaseRow {
                id: hex(lease.id),
                ttl: if lease.ttl_s < 0 {
                    "expired".into()
                } else {
                    format!("{}s", lease.ttl_s)
                },
                granted: format!("{}s", lease.granted_ttl_s),
                keys: lease.keys.iter().map(|k| text(k)).collect(),
                more_keys: lease.key_count.saturating_sub(lease.keys.len()),
            })
            .collect(),
        total: l.total,
        not_shown: l.total.saturating_sub(l.leases.len()),
    }
}

/// A row before the table is ordered: `group` 0 stuck, 1 in progress, 2 finished; `order`
/// sorts within the group (oldest first while unfinished: the longest wait is the most
/// urgent; newest first once finished).
struct Ranked {
    group: u8,
    order: i128,
    row: TxnRow,
}

/// The saga state's rank within its group, for the counts line: stuck first.
fn saga_rank(s: &SagaStatus) -> u8 {
    match s {
        SagaStatus::Stuck { .. } => 0,
        SagaStatus::Compensating => 1,
        SagaStatus::Running => 2,
        SagaStatus::Compensated => 3,
        SagaStatus::Completed => 4,
    }
}

fn saga_ranked(ns: &str, r: &SagaRecord, now_ms: u64) -> Ranked {
    let step = saga_step(r);
    let detail = match (&r.status, step) {
        (SagaStatus::Stuck { .. }, Some((i, _, _))) => {
            format!("compensation of step {i} ({}) failing", step_name(r, i))
        }
        (SagaStatus::Compensating, Some((i, _, _))) => {
            format!("compensating step {i} ({})", step_name(r, i))
        }
        (SagaStatus::Running, Some((i, _, _))) => {
            format!("step {} of {} ({})", i + 1, r.steps.len(), step_name(r, i))
        }
        _ => format!(
            "{} {}",
            r.steps.len(),
            if r.steps.len() == 1 { "step" } else { "steps" }
        ),
    };
    let group = match &r.status {
        SagaStatus::Stuck { .. } => 0,
        s if s.is_final() => 2,
        _ => 1,
    };
    let order = if group == 2 {
        -(r.finished_ms.unwrap_or(r.updated_ms) as i128)
    } else {
        r.created_ms as i128
    };
    Ranked {
        group,
        order,
        row: TxnRow {
            kind: Kind::Saga,
            namespace: ns.to_string(),
            id: r.id.clone(),
            state: r.status.name(),
            stuck: group == 0,
            detail: format!("{}: {detail}", r.definition),
            attempts: step.map(|(_, a, _)| a),
            last_error: cut(
                step.and_then(|(_, _, e)| e).unwrap_or_default(),
                MAX_ERROR_CHARS,
            ),
            age: span(now_ms.saturating_sub(r.created_ms)),
        },
    }
}

fn step_name(r: &SagaRecord, i: usize) -> &str {
    r.steps.get(i).map_or("?", |s| s.name.as_str())
}

/// A 2PC transaction needs a person when atomicity broke (heuristic), when it is still
/// undecided past its deadline (the Recoverer should have aborted it: is one running?), or
/// when a decided one has a branch whose phase 2 keeps failing.
fn twopc_stuck(r: &TxRecord, now_ms: u64) -> bool {
    match r.state() {
        TxState::Heuristic => true,
        TxState::Preparing => r.intent.as_ref().is_none_or(|i| now_ms > i.deadline_ms),
        TxState::Committing | TxState::Aborting => {
            r.branches.values().any(|b| b.last_error.is_some())
        }
        TxState::Committed | TxState::Aborted => false,
    }
}

fn twopc_ranked(ns: &str, r: &TxRecord, now_ms: u64) -> Ranked {
    let state = r.state();
    let stuck = twopc_stuck(r, now_ms);
    let finished = !matches!(
        state,
        TxState::Preparing | TxState::Committing | TxState::Aborting
    );
    let group = if stuck {
        0
    } else if finished {
        2
    } else {
        1
    };
    let created = tx_created_ms(r);
    let (done, total) = progress(r);
    let detail = match &r.decision {
        None => match &r.intent {
            Some(i) if now_ms < i.deadline_ms => {
                format!(
                    "undecided, {} to its deadline",
                    span(i.deadline_ms - now_ms)
                )
            }
            Some(i) => format!(
                "undecided, deadline passed {} ago",
                span(now_ms - i.deadline_ms)
            ),
            None => "no intent logged".into(),
        },
        Some(d) => format!("decided {}; {done}/{total} branches final", d.decision),
    };
    let failing = r
        .branches
        .iter()
        .filter_map(|(b, rec)| rec.last_error.as_ref().map(|e| format!("{b}: {e}")))
        .collect::<Vec<_>>()
        .join("; ");
    let last_error = if state == TxState::Heuristic {
        let heuristic: Vec<String> = r
            .branches
            .iter()
            .filter(|(_, rec)| rec.state.is_heuristic())
            .map(|(b, _)| b.to_string())
            .collect();
        format!(
            "branch ended against the decision: {}",
            heuristic.join(", ")
        )
    } else {
        failing
    };
    // Finished: when it was last written (its last branch, or the decision).
    let finished_ms = r
        .branches
        .values()
        .map(|b| b.updated_ms)
        .chain(r.decision.as_ref().map(|d| d.decided_ms))
        .max()
        .unwrap_or(created);
    Ranked {
        group,
        order: if group == 2 {
            -(finished_ms as i128)
        } else {
            created as i128
        },
        row: TxnRow {
            kind: Kind::TwoPc,
            namespace: ns.to_string(),
            id: r.tx.to_string(),
            state: state_name(state),
            stuck,
            detail,
            attempts: r.branches.values().map(|b| b.attempts).max(),
            last_error: cut(&last_error, MAX_ERROR_CHARS),
            age: span(now_ms.saturating_sub(created)),
        },
    }
}

fn txns_view(t: &TxnListing, now_ms: u64) -> TxnsView {
    let mut ranked: Vec<Ranked> = Vec::new();
    let mut view = TxnsView {
        namespaces: t.namespaces.iter().map(|n| n.name.clone()).collect(),
        more_namespaces: t.more_namespaces,
        ..TxnsView::default()
    };
    let mut counts: BTreeMap<(u8, Kind, &'static str), usize> = BTreeMap::new();
    for ns in &t.namespaces {
        match &ns.sagas {
            Ok(o) => {
                // The open ones as read, then the recent ones not among them.
                let mut seen = std::collections::HashSet::new();
                for r in o.open.iter().chain(&o.recent) {
                    if seen.insert(r.id.as_str()) {
                        *counts
                            .entry((saga_rank(&r.status), Kind::Saga, r.status.name()))
                            .or_default() += 1;
                        ranked.push(saga_ranked(&ns.name, r, now_ms));
                    }
                }
                view.open_not_read += o.open_total.saturating_sub(o.open.len() as u64);
            }
            Err(e) => view.errors.push(format!("sagas in {}: {e}", ns.name)),
        }
        match &ns.twopc {
            Ok(tp) => {
                let mut seen = std::collections::HashSet::new();
                for r in tp.open.iter().chain(&tp.recent) {
                    if seen.insert(r.tx) {
                        let row = twopc_ranked(&ns.name, r, now_ms);
                        let state = if row.row.stuck {
                            "stuck"
                        } else {
                            row.row.state
                        };
                        *counts.entry((row.group, Kind::TwoPc, state)).or_default() += 1;
                        ranked.push(row);
                    }
                }
                view.open_not_read += tp.open_total.saturating_sub(tp.open.len() as u64);
            }
            Err(e) => view.errors.push(format!("2PC in {}: {e}", ns.name)),
        }
    }
    ranked.sort_by(|a, b| {
        (a.group, a.order, a.row.kind, &a.row.namespace, &a.row.id).cmp(&(
            b.group,
            b.order,
            b.row.kind,
            &b.row.namespace,
            &b.row.id,
        ))
    });
    view.not_shown = ranked.len().saturating_sub(MAX_TXN_ROWS);
    view.rows = ranked
        .into_iter()
        .take(MAX_TXN_ROWS)
        .map(|r| r.row)
        .collect();
    view.counts = counts
        .into_iter()
        .map(|((_, kind, state), n)| (kind, state, n))
        .collect();
    view
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use baton_txn::saga::{SagaOverview, SagaRecord, SagaStatus};
    use baton_txn::twopc::{
        BranchId, BranchRecord, BranchState, Decision, DecisionRecord, Intent, IntentBranch, TxId,
        TxRecord,
    };

    use super::*;
    use crate::ui::snapshot::{
        LeaseReading, MemberStatus, NamespaceReading, TwoPcReading, TxnListing,
    };

    const NOW: u64 = 1_800_000_000_000;

    fn entry(key: &str, token: i64, lease: i64) -> QueueEntry {
        QueueEntry {
            key: key.as_bytes().to_vec(),
            token,
            lease,
            ttl_s: 7,
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            taken_ms: NOW,
            user: None,
            members: Ok(Vec::new()),
            locks: Ok(LockListing::default()),
            leases: Ok(LeaseListing::default()),
            txns: Ok(TxnListing::default()),
        }
    }

    #[test]
    fn waiters_keep_queue_order_and_the_rest_are_counted() {
        let waiters: Vec<QueueEntry> = (0..15)
            .map(|i| entry(&format!("jobs/{:x}", 0x100 + i), 20 + i, 0x100 + i))
            .collect();
        let lock = LockReading {
            name: b"jobs".to_vec(),
            holder: Some(entry("jobs/ff", 12, 0xff)),
            waiters,
            waiter_count: 15,
            ..LockReading::default()
        };
        let mut s = snapshot();
        s.locks = Ok(LockListing {
            total: 3,
            locks: vec![lock],
        });
        let v = build(&s, NOW);
        let locks = v.locks.unwrap();
        let row = &locks.locks[0];
        let holder = row.holder.as_ref().unwrap();
        assert_eq!((holder.key.as_str(), holder.token), ("jobs/ff", 12));
        assert_eq!(holder.ttl, "7s");
        let shown: Vec<(u64, &str, i64)> = row
            .queue
            .waiters
            .iter()
            .map(|w| (w.position, w.key.as_str(), w.revision))
            .collect();
        assert_eq!(shown.len(), MAX_WAITERS);
        assert_eq!(shown[0], (1, "jobs/100", 20));
        assert_eq!(shown[1], (2, "jobs/101", 21));
        assert!(shown.windows(2).all(|w| w[0].2 < w[1].2), "{shown:?}");
        assert_eq!((row.queue.count, row.queue.more), (15, 5));
        assert_eq!((locks.total, locks.not_shown), (3, 2));
        assert_eq!(v.summary.locks, Some(3));
    }

    #[test]
    fn a_queue_whose_holder_has_a_value_is_an_election() {
        let mut s = snapshot();
        s.locks = Ok(LockListing {
            total: 3,
            locks: vec![
                LockReading {
                    name: b"leader/web".to_vec(),
                    holder: Some(entry("leader/web/a1", 30, 0xa1)),
                    holder_value: b"web-2:8080".to_vec(),
                    waiters: vec![entry("leader/web/a2", 31, 0xa2)],
                    waiter_count: 1,
                    ..LockReading::default()
                },
                LockReading {
                    name: b"deploy".to_vec(),
                    holder: Some(entry("deploy/b1", 40, 0xb1)),
                    ..LockReading::default()
                },
                // A lock-delay running after an expired holder: nobody holds it, the next
                // in line waits as the first waiter.
                LockReading {
                    name: b"report".to_vec(),
                    holder: None,
                    waiters: vec![entry("report/c1", 50, 0xc1)],
                    waiter_count: 1,
                    lock_delay_ms: 5000,
                    delayed_until_ms: NOW + 1500,
                    ..LockReading::default()
                },
            ],
        });
        let v = build(&s, NOW).locks.unwrap();
        assert_eq!(v.elections.len(), 1);
        let e = &v.elections[0];
        assert_eq!(
            (e.name.as_str(), e.value.as_str()),
            ("leader/web", "web-2:8080")
        );
        assert_eq!(
            (e.leader.key.as_str(), e.leader.token),
            ("leader/web/a1", 30)
        );
        assert_eq!(e.queue.waiters[0].key, "leader/web/a2");
        let names: Vec<&str> = v.locks.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["deploy", "report"]);
        assert_eq!(v.locks[0].delay, Delay::None);
        assert!(v.locks[1].holder.is_none());
        assert_eq!(
            v.locks[1].delay,
            Delay::Running {
                ms: 5000,
                left_ms: 1500
            }
        );
        assert_eq!(v.locks[1].queue.waiters[0].position, 1);
    }

    #[test]
    fn a_lock_delay_that_passed_is_only_set() {
        let lock = LockReading {
            name: b"x".to_vec(),
            lock_delay_ms: 2000,
            delayed_until_ms: NOW - 1,
            ..LockReading::default()
        };
        assert_eq!(delay(&lock, NOW), Delay::Set { ms: 2000 });
    }

    fn member(id: u64, name: &str, status: Reading<MemberStatus>) -> MemberReading {
        MemberReading {
            id,
            name: name.into(),
            is_learner: false,
            client_urls: vec![format!("http://127.0.0.1:{id}")],
            status,
            watchers: None,
        }
    }

    fn status(leader: u64, term: u64) -> MemberStatus {
        MemberStatus {
            leader,
            raft_term: term,
            raft_index: 10,
            raft_applied_index: 10,
            revision: 5,
            db_size: 2048,
            errors: Vec::new(),
        }
    }

    #[test]
    fn the_leader_is_the_one_named_at_the_highest_term_and_health_says_why() {
        let mut s = snapshot();
        s.members = Ok(vec![
            member(2, "m2", Ok(status(2, 4))),
            // Behind: still names the old leader.
            member(1, "m1", Ok(status(1, 3))),
            member(3, "m3", Ok(status(2, 4))),
            member(4, "m4", Err("no connection within 1s".into())),
            member(5, "m5", Ok(status(0, 4))),
            member(
                6,
                "m6",
                Ok(MemberStatus {
                    errors: vec!["etcdserver: mvcc: database space exceeded".into()],
                    ..status(2, 4)
                }),
            ),
        ]);
        let v = build(&s, NOW);
        let rows = v.members.unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["m1", "m2", "m3", "m4", "m5", "m6"]);
        let roles: Vec<Role> = rows.iter().map(|r| r.role).collect();
        assert_eq!(roles[1], Role::Leader);
        assert!(roles.iter().filter(|r| **r == Role::Leader).count() == 1);
        assert_eq!(rows[0].health, Health::Healthy);
        assert_eq!(
            rows[3].health,
            Health::Unreachable("no connection within 1s".into())
        );
        assert_eq!(rows[3].term, None);
        assert_eq!(rows[4].health, Health::NoLeader);
        assert!(matches!(rows[5].health, Health::Alarm(ref e) if e.contains("space exceeded")));
        assert_eq!(v.summary.leader.as_deref(), Some("m2"));
        assert_eq!((v.summary.healthy, v.summary.members), (3, 6));
        assert_eq!(v.summary.term, Some(4));
        assert_eq!(rows[0].db_size.as_deref(), Some("2.0 KiB"));
    }

    fn saga(id: &str, status: SagaStatus, created_ms: u64) -> SagaRecord {
        SagaRecord {
            id: id.into(),
            definition: "order".into(),
            data: serde_json::Value::Null,
            status,
            steps: Vec::new(),
            reason: None,
            cancel_requested: false,
            audit: Vec::new(),
            created_ms,
            updated_ms: created_ms + 10,
            finished_ms: None,
            orchestrator: None,
        }
    }

    fn tx(
        hex_id: &str,
        decision: Option<Decision>,
        branches: &[(BranchState, Option<&str>)],
        deadline_ms: u64,
    ) -> TxRecord {
        let tx: TxId = hex_id.parse().unwrap();
        let ids: Vec<BranchId> = (0..branches.len())
            .map(|i| BranchId::new(format!("b{i}")).unwrap())
            .collect();
        TxRecord {
            tx,
            intent: Some(Intent {
                tx,
                branches: ids
                    .iter()
                    .map(|b| IntentBranch {
                        branch: b.clone(),
                        gid: format!("bt1:ns:{tx}:{b}"),
                    })
                    .collect(),
                created_ms: tx.created_ms(),
                deadline_ms,
                coordinator: "host/1".into(),
            }),
            decision: decision.map(|decision| DecisionRecord {
                decision,
                decided_ms: NOW - 1000,
                by: "coordinator".into(),
            }),
            branches: ids
                .into_iter()
                .zip(branches)
                .filter(|(_, (s, e))| *s != BranchState::Pending || e.is_some())
                .map(|(b, (s, e))| {
                    (
                        b,
                        BranchRecord {
                            state: *s,
                            attempts: 3,
                            last_error: e.map(String::from),
                            updated_ms: NOW - 500,
                        },
                    )
                })
                .collect::<BTreeMap<_, _>>(),
            open: true,
        }
    }

    /// An id created at `ms`.
    fn id_at(ms: u64, tail: u8) -> String {
        format!("{ms:012x}{:020x}", tail)
    }

    #[test]
    fn stuck_sagas_and_2pc_come_first_then_unfinished_oldest_first_then_finished_newest_first() {
        let stuck = SagaStatus::Stuck {
            step: 0,
            attempts: 4,
            last_error: "refund service: 503".into(),
        };
        let mut done_old = saga("done-old", SagaStatus::Completed, NOW - 90_000);
        done_old.finished_ms = Some(NOW - 80_000);
        let mut done_new = saga("done-new", SagaStatus::Compensated, NOW - 70_000);
        done_new.finished_ms = Some(NOW - 10_000);
        let sagas = SagaOverview {
            open: vec![
                saga("run-old", SagaStatus::Running, NOW - 60_000),
                saga("comp", SagaStatus::Compensating, NOW - 50_000),
                saga("stuck-new", stuck.clone(), NOW - 5_000),
                saga("run-new", SagaStatus::Running, NOW - 1_000),
            ],
            open_total: 6,
            // The recent list repeats open ones; they must not appear twice.
            recent: vec![
                saga("run-new", SagaStatus::Running, NOW - 1_000),
                done_new,
                done_old,
            ],
        };
        let twopc = TwoPcReading {
            open: vec![
                // Undecided within its deadline: in progress.
                tx(
                    &id_at(NOW - 2_000, 1),
                    None,
                    &[(BranchState::Pending, None)],
                    NOW + 28_000,
                ),
                // Undecided past its deadline: stuck.
                tx(
                    &id_at(NOW - 40_000, 2),
                    None,
                    &[(BranchState::Pending, None)],
                    NOW - 10_000,
                ),
                // Decided, a branch failing: stuck.
                tx(
                    &id_at(NOW - 3_000, 3),
                    Some(Decision::Commit),
                    &[
                        (BranchState::Committed, None),
                        (BranchState::Pending, Some("connection refused")),
                    ],
                    NOW + 27_000,
                ),
            ],
            open_total: 3,
            recent: vec![
                // Heuristic: finished but broken, stuck.
                tx(
                    &id_at(NOW - 100_000, 4),
                    Some(Decision::Commit),
                    &[
                        (BranchState::Committed, None),
                        (BranchState::HeuristicRollback, None),
                    ],
                    NOW - 70_000,
                ),
                tx(
                    &id_at(NOW - 20_000, 5),
                    Some(Decision::Abort),
                    &[(BranchState::RolledBack, None)],
                    NOW + 10_000,
                ),
            ],
        };
        let mut s = snapshot();
        s.txns = Ok(TxnListing {
            namespaces: vec![NamespaceReading {
                name: "shop".into(),
                sagas: Ok(sagas),
                twopc: Ok(twopc),
            }],
            more_namespaces: false,
        });
        let v = build(&s, NOW);
        let t = v.txns.unwrap();
        let order: Vec<(&str, &str, bool)> = t
            .rows
            .iter()
            .map(|r| (r.kind.name(), r.state, r.stuck))
            .collect();
        let ids: Vec<&str> = t.rows.iter().map(|r| r.id.as_str()).collect();
        // Stuck, oldest first: the heuristic 2PC (100 s), the overdue one (40 s), the
        // failing one (3 s) and the stuck saga (5 s) in creation order.
        assert_eq!(
            &order[..4],
            [
                ("2PC", "heuristic", true),
                ("2PC", "preparing", true),
                ("saga", "stuck", true),
                ("2PC", "committing", true),
            ]
        );
        assert_eq!(ids[2], "stuck-new");
        // In progress, oldest first.
        assert_eq!(
            &ids[4..8],
            ["run-old", "comp", &id_at(NOW - 2_000, 1), "run-new"]
        );
        // Finished, newest first.
        assert_eq!(&ids[8..], [&id_at(NOW - 20_000, 5), "done-new", "done-old"]);
        assert!(t.rows[2].last_error.contains("refund service: 503"));
        assert_eq!(t.rows[2].attempts, Some(4));
        assert!(t.rows[0].last_error.contains("b1"));
        assert!(t.rows[3].last_error.contains("connection refused"));
        assert_eq!(t.open_not_read, 2);
        assert_eq!(v.summary.stuck, Some(4));
        // The counts: stuck first.
        assert_eq!(t.counts[0].1, "stuck");
        let saga_counts: Vec<(&str, usize)> = t
            .counts
            .iter()
            .filter(|c| c.0 == Kind::Saga)
            .map(|c| (c.1, c.2))
            .collect();
        assert_eq!(
            saga_counts,
            [
                ("stuck", 1),
                ("compensating", 1),
                ("running", 2),
                ("compensated", 1),
                ("completed", 1)
            ]
        );
    }

    #[test]
    fn the_txn_table_is_cut_and_counts_what_it_left_out() {
        let open: Vec<SagaRecord> = (0..MAX_TXN_ROWS as u64 + 7)
            .map(|i| saga(&format!("s{i:03}"), SagaStatus::Running, NOW - 100_000 + i))
            .collect();
        let mut s = snapshot();
        s.txns = Ok(TxnListing {
            namespaces: vec![NamespaceReading {
                name: "a".into(),
                sagas: Ok(SagaOverview {
                    open_total: open.len() as u64,
                    open,
                    recent: Vec::new(),
                }),
                twopc: Err("etcdserver: permission denied".into()),
            }],
            more_namespaces: true,
        });
        let t = build(&s, NOW).txns.unwrap();
        assert_eq!((t.rows.len(), t.not_shown), (MAX_TXN_ROWS, 7));
        assert_eq!(t.rows[0].id, "s000");
        assert_eq!(t.errors, ["2PC in a: etcdserver: permission denied"]);
        assert!(t.more_namespaces);
    }

    #[test]
    fn leases_show_ttl_keys_and_how_many_more() {
        let mut s = snapshot();
        s.leases = Ok(LeaseListing {
            total: 120,
            leases: vec![
                LeaseReading {
                    id: 0x694d,
                    ttl_s: 42,
                    granted_ttl_s: 60,
                    keys: vec![b"svc/a".to_vec(), b"svc/\nb".to_vec()],
                    key_count: 9,
                },
                LeaseReading {
                    id: 0x7,
                    ttl_s: -1,
                    granted_ttl_s: 5,
                    keys: Vec::new(),
                    key_count: 0,
                },
            ],
        });
        let v = build(&s, NOW);
        let l = v.leases.unwrap();
        assert_eq!((l.total, l.not_shown), (120, 118));
        let r = &l.rows[0];
        assert_eq!(
            (r.id.as_str(), r.ttl.as_str(), r.granted.as_str()),
            ("694d", "42s", "60s")
        );
        assert_eq!(r.keys, ["svc/a", "svc/\\nb"]);
        assert_eq!(r.more_keys, 7);
        assert_eq!(l.rows[1].ttl, "expired");
    }

    #[test]
    fn a_section_that_failed_keeps_its_error_and_the_others_show() {
        let mut s = snapshot();
        s.locks = Err("etcdserver: permission denied".into());
        let v = build(&s, NOW);
        assert_eq!(v.locks, Err("etcdserver: permission denied".into()));
        assert_eq!(v.summary.locks, None);
        assert!(v.leases.is_ok());
    }
}
