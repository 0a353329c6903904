//! Multi-value register over a `DotFun<V>` (`docs/design/principles.md`, "Types and
//! delta-mutators").

use crate::Lattice;
use crate::context::{CausalContext, DotsExhausted};
use crate::dot::ReplicaId;
use crate::dotstore::{Causal, DotFun, DotStore};
use core::fmt::Debug;

/// The delta (and state) type of an [`MVRegister`].
pub type MVRegisterDelta<V> = Causal<DotFun<V>>;

/// A register that keeps every concurrent write: a read returns the maximal writes
/// (more than one value exactly when writes were concurrent).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MVRegister<V> {
    state: Causal<DotFun<V>>,
}

impl<V> Default for MVRegister<V> {
    fn default() -> Self {
        Self {
            state: Causal {
                store: DotFun::default(),
                ctx: CausalContext::new(),
            },
        }
    }
}

impl<V: Clone + Ord + Debug> MVRegister<V> {
    /// The empty register.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps a causal state.
    pub fn from_state(state: MVRegisterDelta<V>) -> Self {
        Self { state }
    }

    /// The causal state.
    pub fn state(&self) -> &MVRegisterDelta<V> {
        &self.state
    }

    /// Delta-mutator `write^δ_i(v) = ({d ↦ v}, {d} ∪ dom m)`: overwrites every value this
    /// replica has seen.
    ///
    /// # Errors
    /// [`DotsExhausted`] when `replica` has no dot left; the register is unchanged.
    pub fn write(
        &mut self,
        replica: ReplicaId,
        value: V,
    ) -> Result<MVRegisterDelta<V>, DotsExhausted> {
        let dot = self.state.ctx.next_dot(replica)?;
        // The new dot plus every dot of our store (usually one earlier dot of this replica).
        let mut ctx = CausalContext::from_dot(dot);
        self.state.store.for_each_dot(&mut |d| {
            ctx.insert(d);
        });
        // Same result as joining the delta, without the general join: the delta's context
        // holds every dot of our store (all overwritten) and its one dot is new here.
        self.state.store = DotFun::single(dot, value.clone());
        self.state.ctx.insert(dot);
        Ok(Causal {
            store: DotFun::single(dot, value),
            ctx,
        })
    }

    /// Delta-mutator `clear^δ = ({}, dom m)`.
    pub fn clear(&mut self) -> MVRegisterDelta<V> {
        let delta = Causal {
            store: DotFun::default(),
            ctx: self.state.store.dots(),
        };
        self.state.join(delta.clone());
        delta
    }

    /// The current values, sorted ascending (empty when never written or cleared).
    pub fn read(&self) -> Vec<&V> {
        let mut v: Vec<&V> = self.state.store.iter().map(|(_, v)| v).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Joins a delta (or another replica's state).
    pub fn apply(&mut self, delta: MVRegisterDelta<V>) {
        self.state.join(delta);
    }

    /// Redundancy removal: the part of `delta` that changes this register.
    pub fn inflation(&self, delta: &MVRegisterDelta<V>) -> Option<MVRegisterDelta<V>> {
        self.state.inflation(delta)
    }
}

impl<V: Clone + Ord + Debug> Lattice for MVRegister<V> {
    fn join(&mut self, other: Self) {
        self.state.join(other.state);
    }
    fn is_bottom(&self) -> bool {
        self.state.is_bottom()
    }
}
