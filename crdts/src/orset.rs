//! Add-wins observed-remove set over a `DotMap<E, DotSet>` (`docs/design/principles.md`,
//! "Types and delta-mutators").
//!
//! No tombstones: a removed element's dots live on only in the causal context.

use crate::Lattice;
use crate::context::{CausalContext, DotsExhausted};
use crate::dot::{Dot, ReplicaId};
use crate::dotstore::{Causal, DotMap, DotSet, DotStore};
use core::fmt::Debug;

/// The delta (and state) type of an [`ORSet`].
pub type ORSetDelta<E> = Causal<DotMap<E, DotSet>>;

/// An add-wins set: an add concurrent with a remove of the same element survives.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
// Decoding builds the chunked `DotMap`, whose separators are clones of element keys.
#[cfg_attr(
    feature = "serde",
    serde(bound(deserialize = "E: Ord + Clone + serde::Deserialize<'de>"))
)]
pub struct ORSet<E: Ord> {
    state: Causal<DotMap<E, DotSet>>,
}

impl<E: Ord> Default for ORSet<E> {
    fn default() -> Self {
        Self {
            state: Causal {
                store: DotMap::default(),
                ctx: CausalContext::new(),
            },
        }
    }
}

impl<E: Ord + Clone + Debug> ORSet<E> {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps a causal state (e.g. one decoded or built by joins).
    pub fn from_state(state: ORSetDelta<E>) -> Self {
        Self { state }
    }

    /// The causal state (store and context).
    pub fn state(&self) -> &ORSetDelta<E> {
        &self.state
    }

    /// Delta-mutator `add^δ_i(e) = ({e ↦ {d}}, {d} ∪ m(e))`: adds `e` with a fresh dot of
    /// `replica`, retiring the element's older dots; returns the delta.
    ///
    /// # Errors
    /// [`DotsExhausted`] when `replica` has no dot left; the set is unchanged.
    pub fn add(&mut self, replica: ReplicaId, e: E) -> Result<ORSetDelta<E>, DotsExhausted> {
        let dot = self.state.ctx.next_dot(replica)?;
        let mut delta_ctx = CausalContext::from_dot(dot);
        if let Some(old) = self.state.store.replace(e.clone(), DotSet::single(dot)) {
            old.for_each_dot(&mut |d| {
                delta_ctx.insert(d);
            });
        }
        self.state.ctx.insert(dot);
        Ok(Causal {
            store: DotMap::single(e, DotSet::single(dot)),
            ctx: delta_ctx,
        })
    }

    /// Delta-mutator `rmv^δ(e) = ({}, m(e))`: removes the dots of `e` this replica has observed.
    pub fn remove(&mut self, e: &E) -> ORSetDelta<E> {
        let mut delta_ctx = CausalContext::new();
        if let Some(old) = self.state.store.take(e) {
            old.for_each_dot(&mut |d| {
                delta_ctx.insert(d);
            });
        }
        Causal {
            store: DotMap::default(),
            ctx: delta_ctx,
        }
    }

    /// Delta-mutator `clear^δ = ({}, dots(m))`.
    pub fn clear(&mut self) -> ORSetDelta<E> {
        let removed = self.state.store.dots();
        self.state.store = DotMap::default();
        Causal {
            store: DotMap::default(),
            ctx: removed,
        }
    }

    /// Is `e` in the set?
    pub fn contains(&self, e: &E) -> bool {
        self.state.store.get(e).is_some()
    }

    /// The elements, ascending.
    pub fn elements(&self) -> impl Iterator<Item = &E> {
        self.state.store.keys()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.state.store.len()
    }

    /// True when the set has no element.
    pub fn is_empty(&self) -> bool {
        self.state.store.is_empty()
    }

    /// The dots under `e` (for tests and debugging).
    pub fn dots_of(&self, e: &E) -> Vec<Dot> {
        self.state
            .store
            .get(e)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Joins a delta (or another replica's state).
    pub fn apply(&mut self, delta: ORSetDelta<E>) {
        self.state.join(delta);
    }

    /// Redundancy removal: the part of `delta` that changes this set.
    pub fn inflation(&self, delta: &ORSetDelta<E>) -> Option<ORSetDelta<E>> {
        self.state.inflation(delta)
    }
}

impl<E: Ord + Clone + Debug> Lattice for ORSet<E> {
    fn join(&mut self, other: Self) {
        self.state.join(other.state);
    }
    fn is_bottom(&self) -> bool {
        self.state.is_bottom()
    }
}
