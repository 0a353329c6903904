//! Last-writer-wins register ordered by hybrid logical clock timestamps.

use crate::Lattice;
use crate::hlc::Timestamp;

/// A register holding the value with the largest timestamp.
///
/// Guarantee: the join keeps the maximum `(timestamp, value)`; timestamps include the replica id,
/// so ties between replicas are impossible and, should two equal timestamps ever carry different
/// values (bad input), the larger value wins everywhere alike: the join stays commutative.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LWWRegister<V> {
    entry: Option<(Timestamp, V)>,
}

impl<V> Default for LWWRegister<V> {
    fn default() -> Self {
        Self { entry: None }
    }
}

impl<V: Clone + Ord> LWWRegister<V> {
    /// The empty register.
    pub fn new() -> Self {
        Self::default()
    }

    /// Delta-mutator: writes `value` at `ts` (from the local [`crate::Hlc::now`]); returns the delta.
    #[inline]
    pub fn write(&mut self, ts: Timestamp, value: V) -> LWWRegister<V> {
        // Same result as `self.join(delta.clone())`, without building and matching a second
        // register: the write replaces ours iff `(ts, value)` is larger.
        if self.wins(&ts, &value) {
            self.entry = Some((ts, value.clone()));
        }
        LWWRegister {
            entry: Some((ts, value)),
        }
    }

    /// Writes `value` at `ts` in place and returns whether it won (it is now the value), with
    /// no delta: the state-based update of an application that ships whole registers, or
    /// none (what rust-crdt's `LWWReg::update` does). Guarantee: the register ends exactly as
    /// after [`LWWRegister::write`] (or a join with the one-entry register `(ts, value)`).
    #[inline]
    pub fn set(&mut self, ts: Timestamp, value: V) -> bool {
        match &mut self.entry {
            None => {
                self.entry = Some((ts, value));
                true
            }
            Some((t, v)) => {
                let wins = Self::beats(&ts, &value, t, v);
                if wins {
                    // In place: the entry is already `Some`.
                    *t = ts;
                    *v = value;
                }
                wins
            }
        }
    }

    /// Does `(ts, value)` replace the current entry? The usual case decides on the physical
    /// time alone (a later millisecond); only a tie there needs the full `(timestamp, value)`
    /// order.
    #[inline]
    fn wins(&self, ts: &Timestamp, value: &V) -> bool {
        match &self.entry {
            None => true,
            Some((t, v)) => Self::beats(ts, value, t, v),
        }
    }

    /// `(ts, value) > (t, v)`, deciding on the physical time first.
    #[inline]
    fn beats(ts: &Timestamp, value: &V, t: &Timestamp, v: &V) -> bool {
        ts.physical_ms > t.physical_ms || (ts.physical_ms == t.physical_ms && (ts, value) > (t, v))
    }

    /// The current value.
    pub fn read(&self) -> Option<&V> {
        self.entry.as_ref().map(|(_, v)| v)
    }

    /// The timestamp of the current value.
    pub fn timestamp(&self) -> Option<Timestamp> {
        self.entry.as_ref().map(|(t, _)| *t)
    }

    /// Redundancy removal: `delta` if it would replace our value, else `None`.
    pub fn inflation(&self, delta: &LWWRegister<V>) -> Option<LWWRegister<V>> {
        match (&self.entry, &delta.entry) {
            (_, None) => None,
            (None, Some(_)) => Some(delta.clone()),
            (Some(mine), Some(theirs)) => (theirs > mine).then(|| delta.clone()),
        }
    }
}

impl<V: Clone + Ord> Lattice for LWWRegister<V> {
    fn join(&mut self, other: Self) {
        match (&self.entry, other.entry) {
            (_, None) => {}
            (None, Some(e)) => self.entry = Some(e),
            (Some(mine), Some(theirs)) => {
                if theirs > *mine {
                    self.entry = Some(theirs);
                }
            }
        }
    }
    fn is_bottom(&self) -> bool {
        self.entry.is_none()
    }
}
