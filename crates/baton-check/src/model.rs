//! What the linearizability search is generic over: a sequential specification ([`Model`])
//! and the operations it judges ([`Op`]). Apart from the search so that the KV register
//! (`register`) implements it without a cycle `linearizability ↔ register` (the search's
//! `check_history` runs the register); see the tidy test `no_module_cycles`.

use std::hash::{Hash, Hasher};

use crate::history::Time;

/// A sequential specification: what each operation may return in each state.
///
/// Implement this to check objects other than the KV register (the simulator's lease table,
/// for instance) with [`check_operations`](crate::check_operations). `step` must be a pure
/// function: the search calls it on many states and caches the results.
pub trait Model {
    /// A state of the object. Cloned and hashed on every successful step, so keep it small.
    type State: Clone + Eq + Hash;
    /// An operation's arguments.
    type Input;
    /// An operation's result as observed by the client.
    type Output;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// The state after applying `input` in `state` if that can produce `output`, or `None`
    /// if it cannot. `output` is `None` for an operation whose result is unknown: return the
    /// state it leads to if it takes effect here.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: Option<&Self::Output>,
    ) -> Option<Self::State>;

    /// Why `step` rejects this operation in this state, in words for a failure report.
    /// Only called when building a report.
    fn explain(
        &self,
        _state: &Self::State,
        _input: &Self::Input,
        _output: Option<&Self::Output>,
    ) -> String {
        "not possible in this state".to_string()
    }

    /// The state in words, for a failure report.
    fn describe(&self, _state: &Self::State) -> String {
        "(state not described)".to_string()
    }

    /// Whether state `a` can do everything `b` can: for every operation and output that
    /// `step` accepts from `b`, it also accepts it from `a`, and the resulting states are
    /// again related by `covers`. The search then prunes `b` when `a` was already explored
    /// with the same known operations. Must be reflexive; the default is equality, which is
    /// always sound. Models with "bounds" in their state (the KV register's revision bounds)
    /// override it, because otherwise paths that differ only in bookkeeping never meet.
    fn covers(&self, a: &Self::State, b: &Self::State) -> bool {
        a == b
    }

    /// A hash of the part of the state that [`covers`](Model::covers) requires to be equal
    /// (states that may cover one another must hash alike). Default: the whole state.
    fn cover_hash(&self, state: &Self::State) -> u64 {
        let mut h = FxHasher::default();
        state.hash(&mut h);
        h.finish()
    }

    /// Symmetry among unknown-result operations. Operations given the same `Some(class)`
    /// must be interchangeable: from any state, applying one leads to a state that covers
    /// and is covered by the state the other leads to. The search then only ever tries the
    /// earliest-invoked unplaced operation of each class (any linearization using a later
    /// one can use the earlier one instead), which turns "k identical timed-out writes" from
    /// 2^k subsets into k+1 counts. Default: no symmetry.
    fn unknown_class(&self, _input: &Self::Input) -> Option<u128> {
        None
    }

    /// Order in which to try concurrent operations with known results: lower first, ties in
    /// invocation order. Only a heuristic — every order is still explored if needed — but a
    /// good one saves most backtracking. The KV register uses revisions, which pin down the
    /// order of writes. Default: invocation order.
    fn priority(&self, _input: &Self::Input, _output: &Self::Output) -> u64 {
        0
    }
}

/// One operation for the generic search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op<I, O> {
    /// Invocation time.
    pub call: Time,
    /// Response time; `None` means "after everything else". Ignored when `output` is
    /// `None`. A return earlier than the call is treated as equal to it.
    pub ret: Option<Time>,
    /// Arguments.
    pub input: I,
    /// The result, or `None` if unknown: then the operation may take effect at any point
    /// after its call, or never.
    pub output: Option<O>,
}

/// FxHash: the cache is keyed by bitsets and small states, for which SipHash is needlessly
/// slow (and DoS resistance is irrelevant).
#[derive(Default)]
pub(crate) struct FxHasher(u64);

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.add(b as u64);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64)
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64)
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i)
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64)
    }
    fn finish(&self) -> u64 {
        self.0
    }
}
