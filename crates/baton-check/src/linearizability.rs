//! Linearizability checking: Wing & Gong's search with Lowe's and porcupine's optimizations.
//!
//! A history is linearizable if every operation can be given a single instant between its
//! invocation and its response such that, taken in that order, the operations are a legal
//! sequential execution. The search (Wing & Gong 1993) keeps the operations' call and return
//! events in time order in a linked list and repeatedly tries to *linearize* a pending call
//! (one that appears before the first remaining return): if the model accepts it, the call
//! and its return are lifted out of the list and the search goes on; when it reaches a return
//! whose operation has not been linearized, some earlier choice was wrong and it backtracks.
//!
//! What keeps this tractable (Lowe 2017, "Testing for linearizability"; porcupine):
//! - **P-compositionality.** Linearizability is local: a history is linearizable iff each
//!   object's sub-history is. Every KV operation touches one key, so [`check_history`]
//!   checks each key separately; a search exponential in the concurrency of one key is
//!   tiny compared with one over the whole history.
//! - **State cache.** Two search paths that have linearized the same *set* of operations
//!   and reached the same model state have identical futures, so a (bitset, state) pair seen
//!   before is pruned. Generalized here to *dominance*: a path is also pruned if an explored
//!   one had the same known operations, a subset of its unknown-result operations and a
//!   state that [covers](Model::covers) its state — everything the new path could still do,
//!   the explored one could too.
//! - **Budget.** The problem is NP-complete; a step and optional time budget make the
//!   checker return `Unknown` instead of hanging a test run.
//!
//! Further sound reductions, each needed by real histories (measured on generated ones:
//! without them a single key with 8 clients and a few percent of timeouts routinely ran out
//! of a 3-million-step budget; with them it takes tens of thousands of steps):
//! - **Committed reads.** If an operation with a known result leaves the state unchanged
//!   (a read) and fits now, placing it now is never wrong, so its alternatives are not
//!   explored when the search backtracks over it.
//! - **Known before unknown, in model order.** Candidates with known results are tried
//!   first, sorted by [`Model::priority`] (the KV register sorts by revision, which nearly
//!   fixes the order of writes); unknown-result operations are tried only after them —
//!   "it has not happened yet" is the lazy, usually right guess.
//! - **Symmetry.** Unknown-result operations the model declares interchangeable
//!   ([`Model::unknown_class`], e.g. timed-out puts of values nobody read) are used in call
//!   order only, and one that would change nothing is never placed.
//!
//! Operations with unknown results take effect at any time after their call or never
//! (porcupine's treatment): they stay candidates until the end, and the search succeeds as
//! soon as every operation with a *known* result is linearized — any unknown ones left over
//! are the ones that never took effect.
//!
//! What stays hard: many clients hammering one key with many timeouts. Spread a workload
//! over more keys (checking is per key) and keep per-key concurrency modest; a budget
//! overrun is reported as [`Verdict::Unknown`], never as a pass.

use crate::bytes::Bytes;
use crate::history::{History, KvOp, KvResult, Operation, Time};
use crate::model::FxHasher;
/// The interface of the search, in its own module so the KV register can implement it
/// without depending on the search that runs it.
pub use crate::model::{Model, Op};
use crate::register;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::{Duration, Instant};

/// Limits on the search, so that a pathological history yields `Unknown` rather than a hung
/// test. Deterministic runs (the simulator) should rely on the step budget alone, because
/// a time budget makes the verdict depend on machine speed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckOptions {
    /// Maximum number of model steps for one key (one partition). The search on a
    /// correct history usually needs a small multiple of the number of operations.
    pub max_steps_per_key: u64,
    /// Wall-clock limit for the whole check, if any.
    pub timeout: Option<Duration>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            max_steps_per_key: 10_000_000,
            timeout: None,
        }
    }
}

/// An operation the search could have placed next but that leads nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// Index of the operation in the slice given to [`check_operations`].
    pub index: usize,
    /// Whether the model accepts it right after the prefix (then the dead end is further on).
    pub fits: bool,
    /// In words: why the model rejects it, or that it fits but every continuation fails.
    pub reason: String,
}

/// The outcome of the generic search on one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SearchResult {
    /// A linearization exists. `order` is one, as indices into the operations; unknown-result
    /// operations missing from it are taken never to have happened.
    Linearizable {
        /// A witness order.
        order: Vec<usize>,
    },
    /// No linearization exists. The search was exhaustive, so `prefix` is as long as any
    /// legal prefix can be.
    NotLinearizable {
        /// The longest linearizable prefix found, in linearization order.
        prefix: Vec<usize>,
        /// The model state after `prefix`, in words.
        state: String,
        /// The operation with the earliest return among those not in `prefix`: something
        /// must take effect before it returns, and nothing can.
        forced_by: usize,
        /// The operations that could come next (invoked before `forced_by` returned), each
        /// with why it cannot.
        blocked: Vec<Blocked>,
    },
    /// The budget ran out before the search finished.
    Unknown {
        /// The longest linearizable prefix found so far.
        prefix: Vec<usize>,
        /// Which budget ran out.
        reason: String,
    },
}

/// [`SearchResult`] plus the work it took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Search {
    /// The verdict.
    pub result: SearchResult,
    /// Model steps taken (calls of [`Model::step`] during the search); compare with
    /// [`CheckOptions::max_steps_per_key`].
    pub steps: u64,
}

/// Checks one object's operations against `model`: the generic entry point, for objects
/// other than the KV register. For KV histories use [`check_history`], which partitions by
/// key first.
pub fn check_operations<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    options: &CheckOptions,
) -> Search {
    let deadline = options.timeout.map(|t| Instant::now() + t);
    search(model, ops, options.max_steps_per_key, deadline)
}

const NIL: usize = usize::MAX;
/// Head sentinel of the list of known operations' call and return events.
const KNOWN_HEAD: usize = 0;
/// Head sentinel of the list of unknown-result operations (one node each, by call time).
const UNKNOWN_HEAD: usize = 1;

/// The event lists as doubly linked lists over arrays (dancing links: removing a node and
/// putting it back are O(1) and exact).
///
/// Known operations have a call and a return node in the known list, in time order.
/// Unknown-result operations have no meaningful return, so they live in a separate list of
/// call nodes: they are candidates from their call onwards, forever. Keeping them apart lets
/// the search try every known candidate before any unknown one ("it has not happened yet"
/// is the lazy guess) and apply the symmetry rule to them; see the module docs.
struct Events {
    op: Vec<usize>,
    time: Vec<Time>,
    is_call: Vec<bool>,
    /// For a known call node, its return node; `NIL` otherwise.
    matching: Vec<usize>,
    prev: Vec<usize>,
    next: Vec<usize>,
}

impl Events {
    fn new<I, O>(ops: &[Op<I, O>]) -> Self {
        // Known events sorted by time; at equal times calls come first, so operations that
        // merely touch count as concurrent (the permissive reading of a coarse clock).
        let mut known: Vec<(Time, bool, usize)> = Vec::new();
        let mut unknown: Vec<(Time, usize)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if op.output.is_some() {
                known.push((op.call, false, i));
                known.push((ret_time(op), true, i));
            } else {
                unknown.push((op.call, i));
            }
        }
        known.sort_unstable();
        unknown.sort_unstable();
        let len = 2 + known.len() + unknown.len();
        let mut ev = Events {
            op: vec![NIL; len],
            time: vec![0; len],
            is_call: vec![false; len],
            matching: vec![NIL; len],
            prev: vec![NIL; len],
            next: vec![NIL; len],
        };
        let mut call_node = vec![NIL; ops.len()];
        let mut node = 2;
        fn link(ev: &mut Events, head: usize, nodes: std::ops::Range<usize>) {
            let mut last = head;
            for n in nodes {
                ev.prev[n] = last;
                ev.next[last] = n;
                last = n;
            }
        }
        for &(time, is_ret, i) in &known {
            ev.op[node] = i;
            ev.time[node] = time;
            ev.is_call[node] = !is_ret;
            if is_ret {
                ev.matching[call_node[i]] = node;
            } else {
                call_node[i] = node;
            }
            node += 1;
        }
        link(&mut ev, KNOWN_HEAD, 2..node);
        let first_unknown = node;
        for &(time, i) in &unknown {
            ev.op[node] = i;
            ev.time[node] = time;
            ev.is_call[node] = true;
            node += 1;
        }
        link(&mut ev, UNKNOWN_HEAD, first_unknown..node);
        ev
    }

    fn unlink(&mut self, n: usize) {
        let (p, x) = (self.prev[n], self.next[n]);
        self.next[p] = x;
        if x != NIL {
            self.prev[x] = p;
        }
    }

    fn relink(&mut self, n: usize) {
        let (p, x) = (self.prev[n], self.next[n]);
        self.next[p] = n;
        if x != NIL {
            self.prev[x] = n;
        }
    }

    /// Removes a call node (and its return, if known); `unlift` restores them exactly.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        if self.matching[call] != NIL {
            self.unlink(self.matching[call]);
        }
    }

    fn unlift(&mut self, call: usize) {
        if self.matching[call] != NIL {
            self.relink(self.matching[call]);
        }
        self.relink(call);
    }
}

fn ret_time<I, O>(op: &Op<I, O>) -> Time {
    match (&op.output, op.ret) {
        (Some(_), Some(r)) => r.max(op.call),
        _ => Time::MAX,
    }
}

/// Where the scan for the next operation stands at one search node.
///
/// Known candidates (calls before the first pending return) are collected into `arena`
/// and sorted by the model's [`Model::priority`]; after them, the unknown list is scanned
/// for operations invoked no later than `deadline` (that first pending return).
#[derive(Clone, Copy)]
struct Cursor {
    /// This node's known candidates are `arena[seg..seg + len]`.
    seg: usize,
    len: usize,
    /// Next known candidate to try, as an index into the segment.
    ci: usize,
    /// Whether the known candidates are done and the unknown list is being scanned.
    in_unknown: bool,
    /// In the unknown phase, the unknown-list node to try next (`NIL` when done).
    unknown: usize,
    /// Time of the first pending return; unknown operations invoked later cannot go next.
    deadline: Time,
}

/// A linearized operation on the search stack.
struct Frame<S> {
    /// Its call node.
    node: usize,
    /// The state before it.
    state: S,
    /// The parent node's scan, pointing at this operation, to resume after backtracking.
    cursor: Cursor,
    /// Whether no alternative at the parent needs trying (a read that changed nothing:
    /// if any order works from the parent, one starting with this read does).
    committed: bool,
}

/// Collects the current node's known candidates into `arena` in try order.
fn fresh_cursor(ev: &Events, priority: &[u64], arena: &mut Vec<usize>) -> Cursor {
    let seg = arena.len();
    let mut node = ev.next[KNOWN_HEAD];
    let mut deadline = Time::MAX;
    while node != NIL {
        if !ev.is_call[node] {
            deadline = ev.time[node];
            break;
        }
        arena.push(node);
        node = ev.next[node];
    }
    // Stable: equal priorities keep list (time) order.
    arena[seg..].sort_by_key(|&n| priority[ev.op[n]]);
    Cursor {
        seg,
        len: arena.len() - seg,
        ci: 0,
        in_unknown: false,
        unknown: NIL,
        deadline,
    }
}

fn search<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    max_steps: u64,
    deadline_at: Option<Instant>,
) -> Search {
    let n = ops.len();
    let mut remaining = ops.iter().filter(|o| o.output.is_some()).count();
    if remaining == 0 {
        return Search {
            result: SearchResult::Linearizable { order: Vec::new() },
            steps: 0,
        };
    }
    let mut ev = Events::new(ops);
    let priority: Vec<u64> = ops
        .iter()
        .map(|o| match &o.output {
            Some(out) => model.priority(&o.input, out),
            None => 0,
        })
        .collect();

    // Known and unknown operations get separate bit positions: the cache compares the
    // known sets for equality and the unknown sets for inclusion.
    let mut bit_of = vec![0usize; n];
    let (mut nk, mut nu) = (0usize, 0usize);
    for (i, op) in ops.iter().enumerate() {
        if op.output.is_some() {
            bit_of[i] = nk;
            nk += 1;
        } else {
            bit_of[i] = nu;
            nu += 1;
        }
    }
    let mut known_bits = vec![0u64; nk.div_ceil(64)];
    let mut unknown_bits = vec![0u64; nu.div_ceil(64)];
    // Symmetry: unknown operations of one class are used in call order, so an operation is
    // a candidate only if it is the next unused one of its class (`rank == used[class]`).
    let (class_of, rank) = unknown_classes(model, ops, &ev);
    let mut used = vec![0usize; class_of.iter().flatten().max().map_or(0, |c| c + 1)];
    let mut cache: Cache<M::State> = Cache::default();
    let mut stack: Vec<Frame<M::State>> = Vec::new();
    let mut state = model.init();
    // Longest prefix seen, maintained incrementally: `best[..common]` equals the stack's ops.
    let mut best: Vec<usize> = Vec::new();
    let mut common = 0usize;
    let mut steps: u64 = 0;
    let mut arena: Vec<usize> = Vec::new();
    let mut cur = fresh_cursor(&ev, &priority, &mut arena);

    loop {
        // The next candidate, if any is left at this node.
        let node = if !cur.in_unknown && cur.ci < cur.len {
            Some(arena[cur.seg + cur.ci])
        } else {
            if !cur.in_unknown {
                cur.in_unknown = true;
                cur.unknown = ev.next[UNKNOWN_HEAD];
            }
            let u = cur.unknown;
            (u != NIL && ev.time[u] <= cur.deadline).then_some(u)
        };
        let Some(node) = node else {
            // Nothing more to try here: undo the last choice and try the next one after
            // it (or, for a committed read, give up on its parent too).
            loop {
                let Some(frame) = stack.pop() else {
                    let state_after = replay(model, ops, &best);
                    let (forced_by, blocked) = blocked_after(model, ops, &best, &state_after);
                    return Search {
                        result: SearchResult::NotLinearizable {
                            prefix: best,
                            state: model.describe(&state_after),
                            forced_by,
                            blocked,
                        },
                        steps,
                    };
                };
                common = common.min(stack.len());
                let i = ev.op[frame.node];
                if ops[i].output.is_some() {
                    flip(&mut known_bits, bit_of[i]);
                    remaining += 1;
                } else {
                    flip(&mut unknown_bits, bit_of[i]);
                }
                if let Some(c) = class_of[i] {
                    used[c] -= 1;
                }
                state = frame.state;
                ev.unlift(frame.node);
                arena.truncate(frame.cursor.seg + frame.cursor.len);
                cur = frame.cursor;
                if !frame.committed {
                    break;
                }
            }
            advance(&mut cur, &ev);
            continue;
        };

        let i = ev.op[node];
        if class_of[i].is_some_and(|c| used[c] != rank[i]) {
            advance(&mut cur, &ev);
            continue;
        }
        steps += 1;
        if steps > max_steps {
            return Search {
                result: SearchResult::Unknown {
                    prefix: best,
                    reason: format!("step budget of {max_steps} exhausted"),
                },
                steps,
            };
        }
        if steps.is_multiple_of(1024) && deadline_at.is_some_and(|d| Instant::now() >= d) {
            return Search {
                result: SearchResult::Unknown {
                    prefix: best,
                    reason: "time budget exhausted".to_string(),
                },
                steps,
            };
        }
        let Some(next_state) = model.step(&state, &ops[i].input, ops[i].output.as_ref()) else {
            advance(&mut cur, &ev);
            continue;
        };
        let known = ops[i].output.is_some();
        let unchanged = next_state == state;
        if !known && unchanged {
            // An unknown operation with no effect here is the same as not placing it.
            advance(&mut cur, &ev);
            continue;
        }
        let bits = if known {
            &mut known_bits
        } else {
            &mut unknown_bits
        };
        flip(bits, bit_of[i]);
        if !cache.visit(model, &known_bits, &next_state, &unknown_bits) {
            let bits = if known {
                &mut known_bits
            } else {
                &mut unknown_bits
            };
            flip(bits, bit_of[i]);
            advance(&mut cur, &ev);
            continue;
        }
        stack.push(Frame {
            node,
            state: std::mem::replace(&mut state, next_state),
            cursor: cur,
            committed: known && unchanged,
        });
        ev.lift(node);
        if known {
            remaining -= 1;
        }
        if let Some(c) = class_of[i] {
            used[c] += 1;
        }
        if stack.len() > best.len() {
            best.truncate(common);
            best.extend(stack[common..].iter().map(|f| ev.op[f.node]));
            common = stack.len();
        }
        if remaining == 0 {
            let order = stack.iter().map(|f| ev.op[f.node]).collect();
            return Search {
                result: SearchResult::Linearizable { order },
                steps,
            };
        }
        cur = fresh_cursor(&ev, &priority, &mut arena);
    }
}

/// Moves the scan past the candidate it points at (which must still be in its list).
fn advance(cur: &mut Cursor, ev: &Events) {
    if !cur.in_unknown {
        cur.ci += 1;
    } else {
        cur.unknown = ev.next[cur.unknown];
    }
}

/// Dense class ids for unknown operations (`None` for known ones and unclassed unknown
/// ones) and each classed operation's rank among its class in call order — the order of the
/// unknown list, so ties are broken the same way the scan meets them.
fn unknown_classes<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    ev: &Events,
) -> (Vec<Option<usize>>, Vec<usize>) {
    let mut dense: HashMap<u128, usize> = HashMap::new();
    let mut counts: Vec<usize> = Vec::new();
    let mut class_of = vec![None; ops.len()];
    let mut rank = vec![0; ops.len()];
    let mut node = ev.next[UNKNOWN_HEAD];
    while node != NIL {
        let i = ev.op[node];
        if let Some(key) = model.unknown_class(&ops[i].input) {
            let next = dense.len();
            let c = *dense.entry(key).or_insert(next);
            if c == counts.len() {
                counts.push(0);
            }
            class_of[i] = Some(c);
            rank[i] = counts[c];
            counts[c] += 1;
        }
        node = ev.next[node];
    }
    (class_of, rank)
}

fn flip(bits: &mut [u64], i: usize) {
    bits[i / 64] ^= 1u64 << (i % 64);
}

/// Whether every bit of `a` is set in `b`.
fn subset(a: &[u64], b: &[u64]) -> bool {
    a.iter().zip(b).all(|(x, y)| x & !y == 0)
}

/// Visited search nodes, for pruning. A node is (known operations linearized, unknown
/// operations linearized, state). Node B is pruned if an explored node A has the same known
/// set, a subset of B's unknown operations and a state covering B's: every completion of B
/// is then a completion of A (the extra unknown operations A has left only add options),
/// so exploring B cannot find anything A's exploration does not.
struct Cache<S> {
    buckets: HashMap<u64, Vec<CacheEntry<S>>, BuildHasherDefault<FxHasher>>,
}

struct CacheEntry<S> {
    known: Box<[u64]>,
    /// (state, unknown set) pairs, none dominating another.
    nodes: Vec<(S, Box<[u64]>)>,
}

impl<S> Default for Cache<S> {
    fn default() -> Self {
        Cache {
            buckets: HashMap::default(),
        }
    }
}

impl<S: Clone> Cache<S> {
    /// Records the node and returns true, unless an explored node dominates it.
    fn visit<M: Model<State = S>>(
        &mut self,
        model: &M,
        known: &[u64],
        state: &S,
        unknown: &[u64],
    ) -> bool {
        let mut h = FxHasher::default();
        known.hash(&mut h);
        h.write_u64(model.cover_hash(state));
        let bucket = self.buckets.entry(h.finish()).or_default();
        let entry = match bucket.iter_mut().position(|e| &*e.known == known) {
            Some(i) => &mut bucket[i],
            None => {
                bucket.push(CacheEntry {
                    known: known.into(),
                    nodes: Vec::new(),
                });
                bucket.last_mut().expect("just pushed")
            }
        };
        if entry
            .nodes
            .iter()
            .any(|(s, u)| subset(u, unknown) && model.covers(s, state))
        {
            return false;
        }
        entry
            .nodes
            .retain(|(s, u)| !(subset(unknown, u) && model.covers(state, s)));
        entry.nodes.push((state.clone(), unknown.into()));
        true
    }
}

fn replay<M: Model>(model: &M, ops: &[Op<M::Input, M::Output>], prefix: &[usize]) -> M::State {
    let mut state = model.init();
    for &i in prefix {
        match model.step(&state, &ops[i].input, ops[i].output.as_ref()) {
            Some(s) => state = s,
            // Only reachable with a non-deterministic model; report what we have.
            None => break,
        }
    }
    state
}

/// After the longest prefix: which operation forces a decision, and why each candidate for
/// the next slot fails.
fn blocked_after<M: Model>(
    model: &M,
    ops: &[Op<M::Input, M::Output>],
    prefix: &[usize],
    state: &M::State,
) -> (usize, Vec<Blocked>) {
    let mut placed = vec![false; ops.len()];
    for &i in prefix {
        placed[i] = true;
    }
    let forced_by = (0..ops.len())
        .filter(|&i| !placed[i] && ops[i].output.is_some())
        .min_by_key(|&i| (ret_time(&ops[i]), i))
        .expect("a failed search leaves a known operation unplaced");
    let deadline = ret_time(&ops[forced_by]);
    let mut candidates: Vec<usize> = (0..ops.len())
        .filter(|&i| !placed[i] && ops[i].call <= deadline)
        .collect();
    candidates.sort_by_key(|&i| (ops[i].call, i));
    let blocked = candidates
        .into_iter()
        .map(|i| {
            let (input, output) = (&ops[i].input, ops[i].output.as_ref());
            match model.step(state, input, output) {
                Some(_) if output.is_none() => Blocked {
                    index: i,
                    fits: true,
                    reason: "outcome unknown; taking effect here leads to no valid order either"
                        .to_string(),
                },
                Some(_) => Blocked {
                    index: i,
                    fits: true,
                    reason: "fits here, but no order of the remaining operations works after it"
                        .to_string(),
                },
                None => Blocked {
                    index: i,
                    fits: false,
                    reason: model.explain(state, input, output),
                },
            }
        })
        .collect();
    (forced_by, blocked)
}

/// An operation of the checked history together with its index in [`History::ops`], the
/// `#n` that reports use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryOp {
    /// Position in the history.
    pub index: usize,
    /// The operation.
    pub op: Operation,
}

impl fmt::Display for HistoryOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.index, self.op)
    }
}

/// A candidate for the next slot after the longest prefix, and why it does not work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedOp {
    /// The operation.
    pub op: HistoryOp,
    /// Whether it is legal right after the prefix (the dead end is then further on).
    pub fits: bool,
    /// Why not, in words.
    pub reason: String,
}

/// Why one key's sub-history is not linearizable, in the shape a human debugs with: how far
/// a legal order gets, the state there, and why nothing can come next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The key.
    pub key: Bytes,
    /// Number of operations checked on this key.
    pub ops_on_key: usize,
    /// The longest linearizable prefix, in linearization order.
    pub prefix: Vec<HistoryOp>,
    /// The key's state after the prefix, in words.
    pub state_after_prefix: String,
    /// The unplaced operation that returned first: one of `blocked` had to take effect
    /// before this return.
    pub forced_by: HistoryOp,
    /// The operations that could have come next, and why each cannot.
    pub blocked: Vec<BlockedOp>,
}

/// How many prefix operations a report prints; the ones right before the failure matter.
const PREFIX_SHOWN: usize = 12;

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "not linearizable on key {} ({} operations on this key)",
            self.key, self.ops_on_key
        )?;
        writeln!(
            f,
            "  longest linearizable prefix: {} operations, in linearization order",
            self.prefix.len()
        )?;
        let skip = self.prefix.len().saturating_sub(PREFIX_SHOWN);
        if skip > 0 {
            writeln!(f, "    ... {skip} earlier operations not shown")?;
        }
        for op in &self.prefix[skip..] {
            writeln!(f, "    {op}")?;
        }
        writeln!(f, "  state after the prefix: {}", self.state_after_prefix)?;
        let by = match self.forced_by.op.ret {
            Some(t) => format!("returned at {t}"),
            None => "returned".to_string(),
        };
        writeln!(
            f,
            "  #{} {by}, so one of these had to take effect first, and none can:",
            self.forced_by.index
        )?;
        for b in &self.blocked {
            writeln!(f, "    {}: {}", b.op, b.reason)?;
        }
        Ok(())
    }
}

/// A key whose check ran out of budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undecided {
    /// The key.
    pub key: Bytes,
    /// Number of operations on this key.
    pub ops_on_key: usize,
    /// Length of the longest linearizable prefix found before giving up.
    pub prefix_len: usize,
    /// Which budget ran out.
    pub reason: String,
}

/// The verdict on a whole KV history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every key's sub-history is linearizable.
    Linearizable,
    /// At least one key's is not; one [`Violation`] per failing key, in key order. Wins over
    /// `Unknown` keys: one proven violation is enough.
    NotLinearizable(Vec<Violation>),
    /// No violation found, but these keys ran out of budget.
    Unknown(Vec<Undecided>),
}

/// Work done by a check, for reports and for tuning the budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Keys (partitions) checked.
    pub keys: usize,
    /// Operations checked (excluding `Failed` ones and reads with unknown results, which
    /// cannot have had an effect).
    pub ops: usize,
    /// Model steps over all keys.
    pub steps: u64,
    /// The most steps any one key needed.
    pub max_steps_one_key: u64,
}

/// The result of [`check_history`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The verdict, with explanations.
    pub verdict: Verdict,
    /// Work done.
    pub stats: Stats,
}

impl Report {
    /// Whether the history was proven linearizable (not merely "no violation found").
    pub fn is_linearizable(&self) -> bool {
        matches!(self.verdict, Verdict::Linearizable)
    }

    /// Whether a violation was proven.
    pub fn is_violation(&self) -> bool {
        matches!(self.verdict, Verdict::NotLinearizable(_))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        match &self.verdict {
            Verdict::Linearizable => writeln!(
                f,
                "linearizable: {} operations on {} keys ({} steps)",
                s.ops, s.keys, s.steps
            ),
            Verdict::NotLinearizable(vs) => {
                writeln!(f, "NOT linearizable on {} of {} keys:", vs.len(), s.keys)?;
                for v in vs {
                    write!(f, "{v}")?;
                }
                Ok(())
            }
            Verdict::Unknown(us) => {
                writeln!(f, "unknown: {} of {} keys undecided", us.len(), s.keys)?;
                for u in us {
                    writeln!(
                        f,
                        "  key {}: {} ({} operations, longest prefix {})",
                        u.key, u.reason, u.ops_on_key, u.prefix_len
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Checks a KV history for linearizability, key by key.
///
/// Each key is an independent register (P-compositionality). `Failed` operations are
/// dropped (they had no effect), and so are reads with unknown results (a read has no effect
/// to account for). Everything with an unknown result may take effect at any point after its
/// call, or never.
pub fn check_history(history: &History, options: &CheckOptions) -> Report {
    let deadline = options.timeout.map(|t| Instant::now() + t);
    let mut by_key: BTreeMap<&Bytes, Vec<usize>> = BTreeMap::new();
    for (i, op) in history.ops().iter().enumerate() {
        match (&op.op, &op.result) {
            (_, KvResult::Failed) | (KvOp::Get { .. }, KvResult::Unknown) => {}
            _ => by_key.entry(op.op.key()).or_default().push(i),
        }
    }
    let mut stats = Stats {
        keys: by_key.len(),
        ..Stats::default()
    };
    let mut violations = Vec::new();
    let mut undecided = Vec::new();
    let numbered = |local: usize, idxs: &[usize]| HistoryOp {
        index: idxs[local],
        op: history.ops()[idxs[local]].clone(),
    };
    for (key, idxs) in by_key {
        stats.ops += idxs.len();
        if deadline.is_some_and(|d| Instant::now() >= d) {
            undecided.push(Undecided {
                key: key.clone(),
                ops_on_key: idxs.len(),
                prefix_len: 0,
                reason: "time budget exhausted before this key was checked".to_string(),
            });
            continue;
        }
        let (model, ops) = register::build(history.ops(), &idxs);
        let search = search(&model, &ops, options.max_steps_per_key, deadline);
        stats.steps += search.steps;
        stats.max_steps_one_key = stats.max_steps_one_key.max(search.steps);
        match search.result {
            SearchResult::Linearizable { .. } => {}
            SearchResult::NotLinearizable {
                prefix,
                state,
                forced_by,
                blocked,
            } => violations.push(Violation {
                key: key.clone(),
                ops_on_key: idxs.len(),
                prefix: prefix.iter().map(|&i| numbered(i, &idxs)).collect(),
                state_after_prefix: state,
                forced_by: numbered(forced_by, &idxs),
                blocked: blocked
                    .into_iter()
                    .map(|b| BlockedOp {
                        op: numbered(b.index, &idxs),
                        fits: b.fits,
                        reason: b.reason,
                    })
                    .collect(),
            }),
            SearchResult::Unknown { prefix, reason } => undecided.push(Undecided {
                key: key.clone(),
                ops_on_key: idxs.len(),
                prefix_len: prefix.len(),
                reason,
            }),
        }
    }
    let verdict = if !violations.is_empty() {
        Verdict::NotLinearizable(violations)
    } else if !undecided.is_empty() {
        Verdict::Unknown(undecided)
    } else {
        Verdict::Linearizable
    };
    Report { verdict, stats }
}
