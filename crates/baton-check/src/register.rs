//! The sequential specification of one etcd key, as a [`Model`] for the generic search.
//!
//! Values are interned to small integers per key so the search state is a few words that
//! are cheap to clone and hash (the cache of visited states holds one per step).
//!
//! Revisions: etcd's revision is global, so one key's model cannot know the exact revision
//! of the next write (other keys' writes advance it too). What it can check, and does when
//! revisions were recorded, is what holds per key in any linearization:
//! - a write's revision is above every revision already observed on this key;
//! - a read's `mod_revision` is the revision of the last write;
//! - a response header's revision (no-op delete, failed compare) is at least every revision
//!   already observed on this key.
//!
//! `floor` is the least store revision consistent with the prefix linearized so far; a write
//! whose revision was not recorded raises it by one (the smallest it could have been), and
//! its unknown revision is kept as an interval that a later read may pin down.

use crate::bytes::Bytes;
use crate::history::{KvOp, KvResult, Operation};
use crate::model::{Model, Op};
use std::collections::HashMap;

/// Interned value id meaning "the key does not exist".
const ABSENT: u32 = 0;

/// What is known about the current value's `mod_revision`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Rev {
    /// The key is absent (or no revision is tracked).
    None,
    /// The last write's revision was recorded or observed.
    Known(u64),
    /// The last write's revision was not recorded: it lies in `[min, max]`.
    Unknown { min: u64, max: u64 },
}

/// State of one key in the linearization being built.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct RegState {
    value: u32,
    rev: Rev,
    floor: u64,
}

/// An operation on the key, with values interned.
#[derive(Clone, Debug)]
pub(crate) enum RIn {
    Put(u32),
    Get,
    Delete,
    Cas { expected: u32, new: u32 },
}

/// A known result, with values interned.
#[derive(Clone, Debug)]
pub(crate) enum ROut {
    Put(Option<u64>),
    Get(u32, Option<u64>),
    Delete(Option<bool>, Option<u64>),
    Cas(bool, Option<u64>),
}

/// Why a step is impossible; formatted only when a report is built, so the hot loop
/// never allocates.
#[derive(Clone, Copy, Debug)]
enum Reject {
    ReadValue { got: u32 },
    ReadRevision { got: u64 },
    WriteRevision { got: u64 },
    HeaderRevision { got: u64 },
    DeletedButAbsent,
    NotDeletedButPresent,
    CasSucceeded { expected: u32 },
    CasFailed,
    KindMismatch,
}

/// The register model for one key: owns the interning table to print values back.
pub(crate) struct RegisterModel {
    values: Vec<Bytes>,
    /// Value id -> behavioural class. A value that no read returned and no CAS compared
    /// against cannot be told apart from any other such value by any operation, so all of
    /// them share one class (`UNREAD`); every other value is its own class. States and
    /// unknown writes are compared by class, which lets the cache and the symmetry rule
    /// treat "some write nobody saw" as one thing.
    class: Vec<u32>,
    uses_revisions: bool,
}

/// The class shared by all values nobody observed.
const UNREAD: u32 = u32::MAX;

/// Builds the model and the interned operations for the history operations `idxs` (all on
/// one key, none `Failed`).
/// Assigns small ids to values; id 0 is [`ABSENT`].
struct Interner<'a> {
    values: Vec<Bytes>,
    ids: HashMap<&'a Bytes, u32>,
}

impl<'a> Interner<'a> {
    fn intern(&mut self, v: &'a Bytes) -> u32 {
        if let Some(id) = self.ids.get(v) {
            return *id;
        }
        let id = self.values.len() as u32;
        self.values.push(v.clone());
        self.ids.insert(v, id);
        id
    }

    fn intern_opt(&mut self, v: &'a Option<Bytes>) -> u32 {
        v.as_ref().map_or(ABSENT, |v| self.intern(v))
    }
}

/// Builds the model and the interned operations for the history operations `idxs` (all on
/// one key, none `Failed`).
pub(crate) fn build(all: &[Operation], idxs: &[usize]) -> (RegisterModel, Vec<Op<RIn, ROut>>) {
    let mut interner = Interner {
        values: vec![Bytes::default()],
        ids: HashMap::new(),
    };
    let mut uses_revisions = false;
    let mut ops = Vec::with_capacity(idxs.len());
    for &i in idxs {
        let o = &all[i];
        let input = match &o.op {
            KvOp::Put { value, .. } => RIn::Put(interner.intern(value)),
            KvOp::Get { .. } => RIn::Get,
            KvOp::Delete { .. } => RIn::Delete,
            KvOp::Cas { expected, new, .. } => RIn::Cas {
                expected: interner.intern_opt(expected),
                new: interner.intern(new),
            },
        };
        let output = match &o.result {
            KvResult::Put { revision } => Some(ROut::Put(*revision)),
            KvResult::Get { value, revision } => {
                Some(ROut::Get(interner.intern_opt(value), *revision))
            }
            KvResult::Delete { deleted, revision } => Some(ROut::Delete(*deleted, *revision)),
            KvResult::Cas {
                succeeded,
                revision,
            } => Some(ROut::Cas(*succeeded, *revision)),
            KvResult::Unknown | KvResult::Failed => None,
        };
        if let Some(
            ROut::Put(Some(_))
            | ROut::Get(_, Some(_))
            | ROut::Delete(_, Some(_))
            | ROut::Cas(_, Some(_)),
        ) = output
        {
            uses_revisions = true;
        }
        ops.push(Op {
            call: o.call,
            ret: o.ret,
            input,
            output,
        });
    }
    let mut class: Vec<u32> = vec![UNREAD; interner.values.len()];
    class[ABSENT as usize] = ABSENT;
    for op in &ops {
        let observed = match (&op.input, &op.output) {
            (_, Some(ROut::Get(v, _))) => Some(*v),
            (RIn::Cas { expected, .. }, _) => Some(*expected),
            _ => None,
        };
        if let Some(v) = observed {
            class[v as usize] = v;
        }
    }
    (
        RegisterModel {
            values: interner.values,
            class,
            uses_revisions,
        },
        ops,
    )
}

fn write(s: &RegState, value: u32, rev: Option<u64>) -> Result<RegState, Reject> {
    match rev {
        Some(r) if r <= s.floor => Err(Reject::WriteRevision { got: r }),
        Some(r) => Ok(RegState {
            value,
            rev: if value == ABSENT {
                Rev::None
            } else {
                Rev::Known(r)
            },
            floor: r,
        }),
        None => {
            let f = s.floor + 1;
            Ok(RegState {
                value,
                rev: if value == ABSENT {
                    Rev::None
                } else {
                    Rev::Unknown {
                        min: f,
                        max: u64::MAX,
                    }
                },
                floor: f,
            })
        }
    }
}

fn observe(s: &RegState, rev: Option<u64>) -> Result<RegState, Reject> {
    match rev {
        None => Ok(*s),
        Some(h) if h < s.floor => Err(Reject::HeaderRevision { got: h }),
        Some(h) => {
            let rev = match s.rev {
                // The first observation after an unrecorded write bounds it from above.
                Rev::Unknown { min, max } => Rev::Unknown {
                    min,
                    max: max.min(h),
                },
                r => r,
            };
            Ok(RegState {
                rev,
                floor: h,
                ..*s
            })
        }
    }
}

impl RegisterModel {
    fn apply(&self, s: &RegState, input: &RIn, output: Option<&ROut>) -> Result<RegState, Reject> {
        match (input, output) {
            (RIn::Get, None) => Ok(*s),
            (RIn::Get, Some(ROut::Get(v, rev))) => {
                if *v != s.value {
                    return Err(Reject::ReadValue { got: *v });
                }
                if *v == ABSENT {
                    return Ok(*s);
                }
                match (s.rev, rev) {
                    (_, None) | (Rev::None, _) => Ok(*s),
                    (Rev::Known(k), Some(m)) if k == *m => Ok(*s),
                    (Rev::Unknown { min, max }, Some(m)) if (min..=max).contains(m) => {
                        Ok(RegState {
                            rev: Rev::Known(*m),
                            floor: s.floor.max(*m),
                            ..*s
                        })
                    }
                    (_, Some(m)) => Err(Reject::ReadRevision { got: *m }),
                }
            }
            (RIn::Put(v), None) => write(s, *v, None),
            (RIn::Put(v), Some(ROut::Put(rev))) => write(s, *v, *rev),
            (RIn::Delete, None) if s.value == ABSENT => Ok(*s),
            (RIn::Delete, None) => write(s, ABSENT, None),
            (RIn::Delete, Some(ROut::Delete(deleted, rev))) => {
                if s.value == ABSENT {
                    if *deleted == Some(true) {
                        return Err(Reject::DeletedButAbsent);
                    }
                    observe(s, *rev)
                } else {
                    if *deleted == Some(false) {
                        return Err(Reject::NotDeletedButPresent);
                    }
                    write(s, ABSENT, *rev)
                }
            }
            // An unknown CAS evaluated here would succeed iff the compare holds; "it failed"
            // is covered by the search placing it after everything else (or never).
            (RIn::Cas { expected, new }, None) if s.value == *expected => write(s, *new, None),
            (RIn::Cas { .. }, None) => Ok(*s),
            (RIn::Cas { expected, new }, Some(ROut::Cas(succeeded, rev))) => {
                let holds = s.value == *expected;
                match (succeeded, holds) {
                    (true, true) => write(s, *new, *rev),
                    (true, false) => Err(Reject::CasSucceeded {
                        expected: *expected,
                    }),
                    (false, true) => Err(Reject::CasFailed),
                    (false, false) => observe(s, *rev),
                }
            }
            _ => Err(Reject::KindMismatch),
        }
    }

    fn value(&self, id: u32) -> String {
        if id == ABSENT {
            "nothing (absent)".to_string()
        } else {
            self.values[id as usize].to_string()
        }
    }
}

impl Model for RegisterModel {
    type State = RegState;
    type Input = RIn;
    type Output = ROut;

    fn init(&self) -> RegState {
        RegState {
            value: ABSENT,
            rev: Rev::None,
            floor: 0,
        }
    }

    fn step(&self, state: &RegState, input: &RIn, output: Option<&ROut>) -> Option<RegState> {
        let next = self.apply(state, input, output).ok()?;
        Some(if self.uses_revisions {
            next
        } else {
            // Nothing to check revisions against: forget the bookkeeping so that paths
            // reaching the same value are the same state to the cache.
            RegState {
                value: next.value,
                rev: Rev::None,
                floor: 0,
            }
        })
    }

    fn explain(&self, s: &RegState, input: &RIn, output: Option<&ROut>) -> String {
        let cur = self.value(s.value);
        match self.apply(s, input, output) {
            Ok(_) => "allowed here".to_string(),
            Err(Reject::ReadValue { got }) => {
                format!("read {} but the key holds {cur}", self.value(got))
            }
            Err(Reject::ReadRevision { got }) => match s.rev {
                Rev::Known(k) => {
                    format!("read mod revision {got} but the last write was at revision {k}")
                }
                Rev::Unknown { min, max } if max == u64::MAX => format!(
                    "read mod revision {got} but the last write (revision not recorded) is at revision {min} or later"
                ),
                Rev::Unknown { min, max } => format!(
                    "read mod revision {got} but the last write (revision not recorded) is between revisions {min} and {max}"
                ),
                Rev::None => format!("read mod revision {got} of an absent key"),
            },
            Err(Reject::WriteRevision { got }) => format!(
                "wrote at revision {got}, but revision {} was already reached on this key before it",
                s.floor
            ),
            Err(Reject::HeaderRevision { got }) => format!(
                "answered at store revision {got}, but revision {} was already reached on this key before it",
                s.floor
            ),
            Err(Reject::DeletedButAbsent) => {
                "reported deleting the key, but the key is absent here".to_string()
            }
            Err(Reject::NotDeletedButPresent) => {
                format!("reported deleting nothing, but the key holds {cur} here")
            }
            Err(Reject::CasSucceeded { expected }) => format!(
                "succeeded comparing against {}, but the key holds {cur}",
                self.value(expected)
            ),
            Err(Reject::CasFailed) => {
                format!("compare failed, but the key holds the expected {cur}")
            }
            Err(Reject::KindMismatch) => "result kind does not match the operation".to_string(),
        }
    }

    /// `a` covers `b` when their values are of the same class (see `class`) and `a`'s
    /// revision bookkeeping is looser: a lower (or equal) floor, and an interval for the last write's revision that
    /// contains `b`'s. Every check is "revision above the floor" or "revision inside the
    /// interval", so anything `b` accepts `a` accepts, into states related the same way.
    /// This is what lets paths that applied different numbers of unknown-result writes
    /// (and so reached different floors) prune each other.
    fn covers(&self, a: &RegState, b: &RegState) -> bool {
        let interval = |r: Rev| match r {
            Rev::None => None,
            Rev::Known(k) => Some((k, k)),
            Rev::Unknown { min, max } => Some((min, max)),
        };
        self.class[a.value as usize] == self.class[b.value as usize]
            && a.floor <= b.floor
            && match (interval(a.rev), interval(b.rev)) {
                (None, None) => true,
                (Some((alo, ahi)), Some((blo, bhi))) => alo <= blo && bhi <= ahi,
                _ => false,
            }
    }

    fn cover_hash(&self, s: &RegState) -> u64 {
        // Only the value's class must be equal for one state to cover another.
        self.class[s.value as usize] as u64
    }

    /// Unknown writes are interchangeable when they write values of the same class: e.g.
    /// two timed-out puts of values nobody read, or two timed-out deletes.
    fn unknown_class(&self, input: &RIn) -> Option<u128> {
        let c = |v: u32| self.class[v as usize] as u128;
        Some(match input {
            RIn::Put(v) => c(*v),
            RIn::Delete => 1 << 96,
            RIn::Cas { expected, new } => (2 << 96) | (c(*expected) << 48) | c(*new),
            // Unknown reads are dropped before the search; keep them unclassed anyway.
            RIn::Get => return None,
        })
    }

    /// Revisions order operations: a write at revision r goes before anything that observed
    /// r, which goes before the write at r + 1. Operations without a revision go first
    /// (mostly reads of absent keys, which fail fast when they do not fit).
    fn priority(&self, _input: &RIn, output: &ROut) -> u64 {
        let (rev, observe) = match output {
            ROut::Put(r) => (*r, false),
            ROut::Cas(succeeded, r) => (*r, !succeeded),
            ROut::Delete(deleted, r) => (*r, *deleted == Some(false)),
            ROut::Get(v, r) => (r.filter(|_| *v != ABSENT), true),
        };
        rev.map_or(0, |r| {
            r.saturating_mul(2).saturating_add(1 + observe as u64)
        })
    }

    fn describe(&self, s: &RegState) -> String {
        let mut out = if s.value == ABSENT {
            "absent".to_string()
        } else {
            self.values[s.value as usize].to_string()
        };
        if self.uses_revisions {
            match s.rev {
                Rev::None => {}
                Rev::Known(k) => out.push_str(&format!(" (mod revision {k})")),
                Rev::Unknown { min, max } if max == u64::MAX => {
                    out.push_str(&format!(" (mod revision not recorded, >= {min})"))
                }
                Rev::Unknown { min, max } => {
                    out.push_str(&format!(" (mod revision not recorded, in [{min}, {max}])"))
                }
            }
            out.push_str(&format!(", store revision >= {}", s.floor));
        }
        out
    }
}
