//! Add-wins observed-remove set (`docs/design/principles.md`, "Types and delta-mutators").
//!
//! No tombstones: a removed element's dots live on only in the causal context.
//!
//! The state is the causal pair `(DotMap<E, DotSet>, context)` of the design, held in memory as a
//! hash table of elements (`crate::elem_table`: dense vectors under a flat open-addressing index)
//! instead of an ordered map, so that an add or remove of an element in any order costs about
//! one cache line of index plus the entry; wherever order is observable (elements, the state
//! form, encoding, hashing, `Debug`) the elements are sorted, so everything outside sees exactly
//! the ordered `DotMap` form. Deltas are that form.
//!
//! An element's dot set is kept in the table as a 16-byte `Dots`: its one dot (the usual case)
//! as `(replica number, seq)`, the replica numbered in the set's own table of replicas
//! (`Replicas`), or a boxed [`DotSet`] otherwise; an add writes 24 bytes of entry for a `u64`
//! element instead of 56 (a 100k set's heap 5.0 MB instead of 9.2; the vectors grow and copy less
//! than half as much). An element with two or more dots costs a box more than before.

use crate::Lattice;
use crate::context::{CausalContext, DotsExhausted};
use crate::dot::{Dot, ReplicaId};
use crate::dotstore::{Causal, DotMap, DotSet, DotStore};
use crate::elem_table::ElemTable;
use core::fmt::Debug;
use core::hash::Hash;
use std::borrow::Cow;
use std::collections::HashMap;

/// The replicas named by a set's single-dot elements, numbered in order of first use.
///
/// Emptied whenever the set holds no element (by [`ORSet::clear`], a remove, or a join or
/// delta that removes the last one); otherwise it keeps every replica it numbered, so it is
/// bounded by the replicas the set's dots have named since it was last empty — within the
/// context's replicas for states whose dots are in their context (the only ones joins and
/// mutators build; a hand-built state may name others).
#[derive(Clone, Default)]
struct Replicas {
    /// Replica of each number.
    ids: Vec<ReplicaId>,
    /// Number of each replica (hashed under a seed random per process, as the element table).
    numbers: HashMap<ReplicaId, u32, foldhash::fast::RandomState>,
    /// The replica of the last lookup and its number (a replica adding many elements in a row
    /// skips the hash map).
    last: Option<(ReplicaId, u32)>,
}

impl Replicas {
    /// The number of `replica`, given one on first use; `None` once `2^32` replicas have one.
    #[inline]
    fn number(&mut self, replica: ReplicaId) -> Option<u32> {
        if let Some((r, n)) = self.last {
            if r == replica {
                return Some(n);
            }
        }
        let n = match self.numbers.get(&replica) {
            Some(n) => *n,
            None => {
                let n = u32::try_from(self.ids.len()).ok()?;
                self.ids.push(replica);
                self.numbers.insert(replica, n);
                n
            }
        };
        self.last = Some((replica, n));
        Some(n)
    }

    /// The replica numbered `n` (a number this table gave).
    #[inline]
    fn id(&self, n: u32) -> ReplicaId {
        self.ids[n as usize]
    }

    /// True when numbers and replicas correspond one to one (and the last lookup is one of
    /// them).
    fn is_valid(&self) -> bool {
        self.last
            .is_none_or(|(r, n)| self.numbers.get(&r) == Some(&n))
            && self.numbers.len() == self.ids.len()
            && self
                .ids
                .iter()
                .enumerate()
                .all(|(i, r)| self.numbers.get(r).is_some_and(|n| *n as usize == i))
    }
}

/// An element's (non-empty) dot set as the table holds it: 16 bytes instead of a [`DotSet`]'s
/// 48.
#[derive(Clone, Debug)]
enum Dots {
    /// One dot: its replica's number in the set's [`Replicas`], and its seq.
    One {
        /// The replica's number.
        replica: u32,
        /// The dot's sequence number.
        seq: u64,
    },
    /// Any other non-empty dot set (two or more dots: concurrent adds), or one dot whose
    /// replica got no number.
    Many(Box<DotSet>),
}

const _: () = assert!(core::mem::size_of::<Dots>() == 16);

impl Dots {
    /// The dot set `{dot}`.
    #[inline]
    fn one(reps: &mut Replicas, dot: Dot) -> Self {
        match reps.number(dot.replica) {
            Some(replica) => Self::One {
                replica,
                seq: dot.seq,
            },
            None => Self::Many(Box::new(DotSet::single(dot))),
        }
    }

    /// The table form of a non-empty dot set.
    #[inline]
    fn pack(reps: &mut Replicas, dots: DotSet) -> Self {
        if dots.len() == 1 {
            if let Some(d) = dots.iter().next() {
                return Self::one(reps, *d);
            }
        }
        Self::Many(Box::new(dots))
    }

    /// The dot set, built (one dot: no allocation) or cloned.
    #[inline]
    fn to_dotset(&self, reps: &Replicas) -> DotSet {
        match self {
            Self::One { replica, seq } => DotSet::single(Dot::new(reps.id(*replica), *seq)),
            Self::Many(d) => (**d).clone(),
        }
    }

    /// The dot set, built or unboxed.
    #[inline]
    fn into_dotset(self, reps: &Replicas) -> DotSet {
        match self {
            Self::One { replica, seq } => DotSet::single(Dot::new(reps.id(replica), seq)),
            Self::Many(d) => *d,
        }
    }

    /// Calls `f` with every dot, ascending.
    #[inline]
    fn for_each_dot(&self, reps: &Replicas, mut f: impl FnMut(Dot)) {
        match self {
            Self::One { replica, seq } => f(Dot::new(reps.id(*replica), *seq)),
            Self::Many(d) => d.iter().for_each(|d| f(*d)),
        }
    }

    /// Is `self` (under `reps`) the same dot set as `other` (under `other_reps`)?
    fn same(&self, reps: &Replicas, other: &Self, other_reps: &Replicas) -> bool {
        match (self, other) {
            (
                Self::One { replica, seq },
                Self::One {
                    replica: r2,
                    seq: s2,
                },
            ) => seq == s2 && reps.id(*replica) == other_reps.id(*r2),
            _ => self.to_dotset(reps) == other.to_dotset(other_reps),
        }
    }

    /// True when a single dot's replica number is one `reps` gave (no more is checked: the
    /// dot sets themselves are what the set was given, as with the plain `DotSet` form).
    fn is_valid(&self, reps: &Replicas) -> bool {
        match self {
            Self::One { replica, .. } => (*replica as usize) < reps.ids.len(),
            Self::Many(_) => true,
        }
    }
}

/// A callback given each entry of a store (element and dot set) in turn.
type EntryVisitor<'a, E> = &'a mut dyn FnMut(&E, &DotSet);

/// The delta (and state) type of an [`ORSet`].
pub type ORSetDelta<E> = Causal<DotMap<E, DotSet>>;

/// An add-wins set: an add concurrent with a remove of the same element survives.
///
/// Elements need `Hash` besides `Ord`: the set finds them by hash and sorts them only where
/// order is observable. Equality, hashing, `Debug` and the encoding are those of the state
/// ([`ORSet::state`]): they do not depend on the order operations were applied in.
#[derive(Clone)]
pub struct ORSet<E: Ord> {
    /// The store: every element with its (non-empty) dot set.
    elems: ElemTable<E, Dots>,
    /// The replicas the single dots of `elems` name by number.
    reps: Replicas,
    /// The causal context.
    ctx: CausalContext,
}

impl<E: Ord> Default for ORSet<E> {
    fn default() -> Self {
        Self {
            elems: ElemTable::default(),
            reps: Replicas::default(),
            ctx: CausalContext::new(),
        }
    }
}

impl<E: Ord + Clone + Hash + Debug> ORSet<E> {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps a causal state (e.g. one decoded or built by joins).
    pub fn from_state(state: ORSetDelta<E>) -> Self {
        let mut elems = ElemTable::default();
        let mut reps = Replicas::default();
        elems.reserve(state.store.len());
        for (e, dots) in state.store.into_entries() {
            elems.insert(e, Dots::pack(&mut reps, dots));
        }
        Self {
            elems,
            reps,
            ctx: state.ctx,
        }
    }

    /// The causal state (store and context), built from the table: elements ascending, every
    /// element and the context cloned (`O(n log n)`; for tests, debugging and conversions).
    pub fn state(&self) -> ORSetDelta<E> {
        Causal {
            store: DotMap::from_sorted(
                self.elems
                    .sorted()
                    .into_iter()
                    .map(|(e, d)| (e.clone(), d.to_dotset(&self.reps))),
            ),
            ctx: self.ctx.clone(),
        }
    }

    /// The causal context: every dot this set has seen.
    pub fn context(&self) -> &CausalContext {
        &self.ctx
    }

    /// Delta-mutator `add^δ_i(e) = ({e ↦ {d}}, {d} ∪ m(e))`: adds `e` with a fresh dot of
    /// `replica`, retiring the element's older dots; returns the delta.
    ///
    /// Building the delta allocates nothing beyond what `e` owns when the element was absent:
    /// its store is a one-key [`DotMap`] held inline, its context one dot held inline. (A re-add
    /// whose retired dots do not extend that one range may allocate the context's ranges.)
    ///
    /// # Errors
    /// [`DotsExhausted`] when `replica` has no dot left; the set is unchanged.
    pub fn add(&mut self, replica: ReplicaId, e: E) -> Result<ORSetDelta<E>, DotsExhausted> {
        let dot = self.ctx.issue_dot(replica)?;
        let mut delta_ctx = CausalContext::from_dot(dot);
        let packed = Dots::one(&mut self.reps, dot);
        if let Some(old) = self.elems.insert(e.clone(), packed) {
            old.for_each_dot(&self.reps, |d| {
                delta_ctx.insert(d);
            });
        }
        Ok(Causal {
            store: DotMap::single(e, DotSet::single(dot)),
            ctx: delta_ctx,
        })
    }

    /// Delta-mutator `rmv^δ(e) = ({}, m(e))`: removes the dots of `e` this replica has observed.
    pub fn remove(&mut self, e: &E) -> ORSetDelta<E> {
        let mut delta_ctx = CausalContext::new();
        if let Some(old) = self.elems.remove(e) {
            old.for_each_dot(&self.reps, |d| {
                delta_ctx.insert(d);
            });
        }
        self.forget_replicas_when_empty();
        Causal {
            store: DotMap::default(),
            ctx: delta_ctx,
        }
    }

    /// Empties the replica table once no element names a replica in it (a set that saw many
    /// replicas and lost every element gives that memory back).
    fn forget_replicas_when_empty(&mut self) {
        if self.elems.is_empty() && !self.reps.ids.is_empty() {
            self.reps = Replicas::default();
        }
    }

    /// How many replicas the set's replica table numbers (tests).
    #[cfg(test)]
    pub(crate) fn replica_table_len(&self) -> usize {
        self.reps.ids.len()
    }

    /// Delta-mutator `clear^δ = ({}, dots(m))`.
    pub fn clear(&mut self) -> ORSetDelta<E> {
        let mut removed = CausalContext::new();
        for (_, dots) in self.elems.iter() {
            dots.for_each_dot(&self.reps, |d| {
                removed.insert(d);
            });
        }
        self.elems = ElemTable::default();
        self.reps = Replicas::default();
        Causal {
            store: DotMap::default(),
            ctx: removed,
        }
    }

    /// Is `e` in the set?
    pub fn contains(&self, e: &E) -> bool {
        self.elems.get(e).is_some()
    }

    /// The elements, ascending (sorted on each call: `O(n log n)`).
    pub fn elements(&self) -> impl Iterator<Item = &E> {
        let mut v: Vec<&E> = self.elems.keys().collect();
        v.sort_unstable();
        v.into_iter()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.elems.len()
    }

    /// True when the set has no element.
    pub fn is_empty(&self) -> bool {
        self.elems.is_empty()
    }

    /// The dots under `e` (for tests and debugging).
    pub fn dots_of(&self, e: &E) -> Vec<Dot> {
        let mut v = Vec::new();
        if let Some(dots) = self.elems.get(e) {
            dots.for_each_dot(&self.reps, |d| v.push(d));
        }
        v
    }

    /// True when the element table keeps its layout invariants (index slots one to one with
    /// the entries, every entry reachable from its home slot, load at most 7/8); property tests
    /// check this after every operation.
    pub fn layout_is_valid(&self) -> bool {
        self.elems.is_valid()
            && self.reps.is_valid()
            && self.elems.iter().all(|(_, d)| d.is_valid(&self.reps))
    }

    /// The empty set, its table hashing under the test seed `seed`.
    #[cfg(test)]
    pub(crate) fn with_test_seed(seed: u64) -> Self {
        Self {
            elems: ElemTable::with_test_seed(seed),
            reps: Replicas::default(),
            ctx: CausalContext::new(),
        }
    }

    /// The table's longest probe (tests).
    #[cfg(test)]
    pub(crate) fn max_probe_len(&self) -> usize {
        self.elems.max_probe_len()
    }

    /// The table's index length (tests).
    #[cfg(test)]
    pub(crate) fn index_slots(&self) -> usize {
        self.elems.slots()
    }

    /// Joins a delta (or another replica's state).
    pub fn apply(&mut self, delta: ORSetDelta<E>) {
        let (candidates, missing) = self.candidates(
            &|f: &mut dyn FnMut(&E, &DotSet)| {
                for (e, d) in delta.store.iter() {
                    f(e, d);
                }
            },
            &delta.ctx,
        );
        let n = delta.store.len();
        self.join_entries(
            delta.store.into_entries(),
            n,
            missing,
            &delta.ctx,
            &candidates,
        );
        self.forget_replicas_when_empty();
    }

    /// Redundancy removal: the part of `delta` that changes this set (as
    /// [`Causal::inflation`] of the state form gives it).
    pub fn inflation(&self, delta: &ORSetDelta<E>) -> Option<ORSetDelta<E>> {
        // `Causal::inflation` reads our store only through `get` of the delta's elements and one
        // pass over all our dots: the same steps, with our entries of the delta's elements as
        // the `mine` store.
        let mut store = delta.store.unseen_by(&self.ctx);
        let mut ctx = delta.ctx.diff(&self.ctx);
        let seen_by_both = delta.ctx.intersection(&self.ctx);
        if !seen_by_both.is_empty() {
            let mine =
                DotMap::from_sorted(delta.store.iter().filter_map(|(e, _)| {
                    Some((e.clone(), self.elems.get(e)?.to_dotset(&self.reps)))
                }));
            let overriding = delta.store.overriding(&mine);
            if !overriding.is_bottom() {
                ctx.join(&overriding.dots());
                let none = CausalContext::new();
                store.join(&none, overriding, &none);
            }
            let mut candidates = seen_by_both.diff(&delta.store.dots());
            delta
                .store
                .seen_elsewhere(&mine, &self.ctx, &mut candidates);
            if !candidates.is_empty() {
                for (_, dots) in self.elems.iter() {
                    dots.for_each_dot(&self.reps, |d| {
                        if candidates.contains(&d) {
                            ctx.insert(d);
                        }
                    });
                }
            }
        }
        if store.is_bottom() && ctx.is_empty() {
            None
        } else {
            Some(Causal { store, ctx })
        }
    }

    /// The dots the join with `(other, other_ctx)` may have to remove from elements `other`
    /// does not hold them under (as `DotMap`'s join computes them): dots both sides have seen
    /// that `other` does not hold under the same element. With them, the number of `other`'s
    /// elements this set does not hold, when the pass looked them up (contexts not disjoint).
    ///
    /// `other` visits the other side's entries (each call, all of them, in the same order).
    fn candidates(
        &self,
        other: &dyn Fn(EntryVisitor<'_, E>),
        other_ctx: &CausalContext,
    ) -> (CausalContext, Option<usize>) {
        let seen_by_both = other_ctx.intersection(&self.ctx);
        if seen_by_both.is_empty() {
            // Disjoint contexts: the other side's dots (all within its context) are all unseen
            // here, so none can be held under another element.
            return (seen_by_both, None);
        }
        let mut other_dots = CausalContext::new();
        other(&mut |_, dots| {
            dots.for_each_dot(&mut |d| {
                other_dots.insert(d);
            });
        });
        let mut c = seen_by_both.diff(&other_dots);
        let bottom = DotSet::default();
        let mut missing = 0;
        other(&mut |e, theirs| {
            // A boxed dot set is borrowed; only a packed single dot is built.
            let mine = self.elems.get(e).map(|d| match d {
                Dots::Many(many) => Cow::Borrowed(&**many),
                one => Cow::Owned(one.to_dotset(&self.reps)),
            });
            missing += usize::from(mine.is_none());
            theirs.seen_elsewhere(mine.as_deref().unwrap_or(&bottom), &self.ctx, &mut c);
        });
        (c, Some(missing))
    }

    /// `self := self ⊔ (entries, other_ctx)` (`n` entries, `missing` of them not in this set
    /// when known), `candidates` from [`Self::candidates`] (the store join of `DotMap`, then the
    /// context join).
    ///
    /// Room is reserved only for entries that may be new: `missing` when the candidates pass
    /// looked them up, all `n` when this set is empty; otherwise the table grows as inserts need
    /// (reserving all `n` would double the memory of a join with an overlapping set, for good:
    /// a clone keeps the capacity).
    fn join_entries(
        &mut self,
        entries: impl Iterator<Item = (E, DotSet)>,
        n: usize,
        missing: Option<usize>,
        other_ctx: &CausalContext,
        candidates: &CausalContext,
    ) {
        let new = missing.unwrap_or(if self.elems.is_empty() { n } else { 0 });
        self.elems.reserve(new);
        let mut found = 0u64;
        for (e, theirs) in entries {
            if let Some(child) = self.elems.get_mut(&e) {
                if !candidates.is_empty() {
                    child.for_each_dot(&self.reps, |d| {
                        found += u64::from(candidates.contains(&d));
                    });
                }
                // The same one dot on both sides (an element both hold unchanged, the bulk of
                // a merge): the join keeps it.
                if let Dots::One { replica, seq } = *child {
                    let mut it = theirs.iter();
                    if let (Some(d), None) = (it.next(), it.next()) {
                        if d.seq == seq && d.replica == self.reps.id(replica) {
                            continue;
                        }
                    }
                }
                let mut mine = child.to_dotset(&self.reps);
                mine.join(&self.ctx, theirs, other_ctx);
                if mine.is_bottom() {
                    self.elems.remove(&e);
                } else {
                    *child = Dots::pack(&mut self.reps, mine);
                }
            } else {
                let mut child = DotSet::default();
                child.join(&self.ctx, theirs, other_ctx);
                if !child.is_bottom() {
                    self.elems.insert(e, Dots::pack(&mut self.reps, child));
                }
            }
        }
        if found < candidates.len() {
            // Elements the other side named already lost every candidate dot in their join,
            // so removing the candidates everywhere touches only the ones it did not name.
            let reps = &mut self.reps;
            self.elems.retain(|_, child| match child {
                Dots::One { replica, seq } => {
                    !candidates.contains(&Dot::new(reps.id(*replica), *seq))
                }
                Dots::Many(dots) => {
                    dots.remove_dots(candidates);
                    match dots.len() {
                        0 => false,
                        1 => {
                            *child = Dots::pack(reps, core::mem::take(&mut **dots));
                            true
                        }
                        _ => true,
                    }
                }
            });
        }
        self.ctx.join(other_ctx);
    }
}

impl<E: Ord + Clone + Hash + Debug> PartialEq for ORSet<E> {
    fn eq(&self, other: &Self) -> bool {
        self.elems.len() == other.elems.len()
            && self.ctx == other.ctx
            && self.elems.iter().all(|(e, dots)| {
                other
                    .elems
                    .get(e)
                    .is_some_and(|o| dots.same(&self.reps, o, &other.reps))
            })
    }
}

impl<E: Ord + Clone + Hash + Debug> Eq for ORSet<E> {}

impl<E: Ord + Clone + Hash + Debug> Hash for ORSet<E> {
    /// Hashes the state form (elements ascending), so equal sets hash equally.
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.state().hash(state);
    }
}

impl<E: Ord + Clone + Hash + Debug> Debug for ORSet<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ORSet")
            .field("state", &self.state())
            .finish()
    }
}

impl<E: Ord + Clone + Hash + Debug> Lattice for ORSet<E> {
    fn join(&mut self, other: Self) {
        let (candidates, missing) = self.candidates(
            &|f: &mut dyn FnMut(&E, &DotSet)| {
                for (e, d) in other.elems.iter() {
                    match d {
                        Dots::Many(d) => f(e, d),
                        one => f(e, &one.to_dotset(&other.reps)),
                    }
                }
            },
            &other.ctx,
        );
        let n = other.elems.len();
        let reps = &other.reps;
        self.join_entries(
            other
                .elems
                .into_entries()
                .map(|(e, d)| (e, d.into_dotset(reps))),
            n,
            missing,
            &other.ctx,
            &candidates,
        );
        self.forget_replicas_when_empty();
    }
    fn is_bottom(&self) -> bool {
        self.elems.is_empty() && self.ctx.is_empty()
    }
}

/// Serde: exactly what the former derive over `struct ORSet { state: ORSetDelta<E> }` wrote
/// (the state form, elements ascending), so encodings are unchanged.
#[cfg(feature = "serde")]
mod serde_impls {
    use super::{Causal, DotSet, Dots, ElemTable, ORSet, Replicas};
    use core::fmt::Debug;
    use core::hash::Hash;
    use serde::de::{Deserialize, Deserializer};
    use serde::ser::{Serialize, SerializeStruct, Serializer};

    /// A table entry's dots, written as the [`DotSet`] they stand for.
    struct DotsView<'a>(&'a Dots, &'a Replicas);

    impl Serialize for DotsView<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self.0 {
                Dots::Many(d) => d.serialize(s),
                one => one.to_dotset(self.1).serialize(s),
            }
        }
    }

    /// Entries ascending, written as `DotMap` writes its entries.
    struct SortedStore<'a, E>(Vec<(&'a E, &'a Dots)>, &'a Replicas);

    impl<E: Serialize> Serialize for SortedStore<'_, E> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            struct AsMap<'b, E>(&'b [(&'b E, &'b Dots)], &'b Replicas);
            impl<E: Serialize> Serialize for AsMap<'_, E> {
                fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    s.collect_map(self.0.iter().map(|(e, d)| (*e, DotsView(d, self.1))))
                }
            }
            s.serialize_newtype_struct("DotMap", &AsMap(&self.0, self.1))
        }
    }

    /// The state form `Causal { store, ctx }` of a set, written without building it.
    struct StateView<'a, E: Ord>(&'a ORSet<E>);

    impl<E: Ord + Clone + Hash + Debug + Serialize> Serialize for StateView<'_, E> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            crate::compact::serialize_causal(
                &self.0.ctx,
                &SortedStore(self.0.elems.sorted(), &self.0.reps),
                s,
            )
        }
    }

    impl<E: Ord + Clone + Hash + Debug + Serialize> Serialize for ORSet<E> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut st = s.serialize_struct("ORSet", 1)?;
            st.serialize_field("state", &StateView(self))?;
            st.end()
        }
    }

    /// A store decoded as `DotMap<E, DotSet>` decodes (the same checks: elements strictly
    /// ascending, no empty dot set, each dot set canonical), into a plain vector: the table is
    /// built from it directly, without building the ordered map first.
    struct DecodedStore<E>(Vec<(E, DotSet)>);

    impl<'de, E: Ord + Deserialize<'de>> Deserialize<'de> for DecodedStore<E> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            #[derive(serde::Deserialize)]
            #[serde(rename = "DotMap")]
            #[serde(bound = "E: Ord + Deserialize<'de>")]
            struct Raw<E>(crate::strict_map::StrictMap<E, DotSet>);
            let entries = Raw::<E>::deserialize(d)?.0.0;
            if entries.iter().any(|(_, dots)| dots.is_empty()) {
                return Err(serde::de::Error::custom("dot map holds an empty child"));
            }
            Ok(DecodedStore(entries))
        }
    }

    impl<'de, E> Deserialize<'de> for ORSet<E>
    where
        E: Ord + Clone + Hash + Debug + Deserialize<'de>,
    {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            // What the former derive over `struct ORSet { state: ORSetDelta<E> }` read (the
            // `Causal` decoder checks every dot against the context, and that none repeats).
            #[derive(serde::Deserialize)]
            #[serde(rename = "ORSet")]
            #[serde(bound(deserialize = "E: Ord + Deserialize<'de>"))]
            struct Raw<E> {
                state: Causal<DecodedStore<E>>,
            }
            let state = Raw::<E>::deserialize(d)?.state;
            let entries = state.store.0;
            let mut elems = ElemTable::default();
            let mut reps = Replicas::default();
            elems.reserve(entries.len());
            for (e, dots) in entries {
                elems.insert(e, Dots::pack(&mut reps, dots));
            }
            Ok(ORSet {
                elems,
                reps,
                ctx: state.ctx,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ORSet;
    use crate::Lattice;
    use crate::context::{CausalContext, DotsExhausted};
    use crate::dot::{Dot, ReplicaId};
    use crate::dotstore::{Causal, DotMap};

    /// The last dot of a replica can be issued; after it, `add` fails and changes nothing, and
    /// another replica can still add.
    #[test]
    fn add_issues_the_last_dot_then_fails_without_change() {
        let r = ReplicaId(7);
        let mut s: ORSet<u64> = ORSet::from_state(Causal::new(
            DotMap::default(),
            CausalContext::from_dot(Dot::new(r, u64::MAX - 1)),
        ));
        let d = s.add(r, 1).expect("the last dot is left");
        assert_eq!(s.dots_of(&1), vec![Dot::new(r, u64::MAX)]);
        assert!(d.ctx.contains(&Dot::new(r, u64::MAX)));
        let before = s.clone();
        assert_eq!(s.add(r, 2), Err(DotsExhausted { replica: r }));
        assert_eq!(s, before);
        assert!(s.context().contains(&Dot::new(r, u64::MAX)) && !s.contains(&2));
        s.add(ReplicaId(8), 2).expect("another replica has dots");
        assert_eq!(s.dots_of(&2), vec![Dot::new(ReplicaId(8), 1)]);
    }

    fn built(n: u64) -> ORSet<u64> {
        let mut s = ORSet::new();
        for e in 0..n {
            s.add(ReplicaId(1), e.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .expect("dots left");
        }
        s
    }

    /// Joining a set with its own clone (or applying its own state) changes nothing, memory
    /// included: no entry is new, so the index keeps its size (reserving for all the other
    /// side's entries doubled it, and a clone keeps the capacity).
    #[test]
    fn join_with_an_overlapping_set_does_not_grow_the_index() {
        let mut s = built(20_000);
        let slots = s.index_slots();
        let before = s.clone();
        s.join(before.clone());
        assert_eq!(s, before);
        assert_eq!(s.index_slots(), slots, "join with a clone grew the index");
        s.apply(before.state());
        assert_eq!(s, before);
        assert_eq!(
            s.index_slots(),
            slots,
            "applying its own state grew the index"
        );
        // Half new: room for the new half only.
        let mut t = built(20_000);
        let mut other = built(20_000);
        for e in 100_000..110_000u64 {
            other.add(ReplicaId(2), e).expect("dots left");
        }
        t.join(other.clone());
        assert_eq!(t.len(), 30_000);
        assert_eq!(
            t.index_slots(),
            65_536,
            "the smallest index holding 30k entries"
        );
        assert!(t.layout_is_valid());
        // Into an empty set: exactly the room needed.
        let mut e: ORSet<u64> = ORSet::new();
        e.join(other.clone());
        assert_eq!(e, other);
        assert!(e.index_slots() == 65_536 && e.layout_is_valid());
    }

    /// A remote remove delta (context only) takes the removed elements out in place; the set
    /// equals the causal pair's join.
    #[test]
    fn remote_remove_deltas_remove_exactly() {
        let base = built(5_000);
        let mut mine = base.clone();
        let mut theirs = base.clone();
        let mut reference = base.state();
        for (i, e) in base
            .elements()
            .copied()
            .collect::<Vec<_>>()
            .iter()
            .enumerate()
        {
            if i % 97 != 5 {
                continue;
            }
            let d = theirs.remove(e);
            reference.join(d.clone());
            mine.apply(d);
            assert!(mine.layout_is_valid());
        }
        assert_eq!(mine.state(), reference);
        assert_eq!(mine, theirs);
    }

    /// Sets whose tables hash under different seeds, filled in different orders, are equal,
    /// hash equally, print and encode identically: the seed shapes only the index.
    #[test]
    fn equality_hash_and_encoding_do_not_depend_on_the_seed() {
        use core::hash::{Hash, Hasher};
        use std::hash::DefaultHasher;
        let src = built(3_000);
        let state = src.state();
        let mut a: ORSet<u64> = ORSet::with_test_seed(1);
        a.apply(state.clone());
        // Reverse order: each element with only its own dots as context, then the whole state.
        let mut b: ORSet<u64> = ORSet::with_test_seed(0xfeed_f00d);
        for (e, dots) in state.store.iter().collect::<Vec<_>>().into_iter().rev() {
            let mut ctx = CausalContext::new();
            for d in dots.iter() {
                ctx.insert(*d);
            }
            b.apply(Causal {
                store: DotMap::single(*e, dots.clone()),
                ctx,
            });
        }
        b.apply(state.clone());
        for s in [&a, &b] {
            assert_eq!(*s, src);
            assert_eq!(src, *s);
            assert!(s.layout_is_valid());
        }
        let h = |s: &ORSet<u64>| {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        };
        assert_eq!(h(&a), h(&b));
        assert_eq!(h(&a), h(&src));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert!(a.elements().eq(b.elements()));
        #[cfg(feature = "serde")]
        {
            let cfg = bincode::config::standard();
            let ea = bincode::serde::encode_to_vec(&a, cfg).expect("encodes");
            let eb = bincode::serde::encode_to_vec(&b, cfg).expect("encodes");
            assert_eq!(ea, eb);
            assert_eq!(
                ea,
                bincode::serde::encode_to_vec(&src, cfg).expect("encodes")
            );
        }
    }

    /// Two sets holding the same dots under replicas numbered in opposite orders (each set
    /// numbers replicas by first use) are equal, hash, print and encode identically, and
    /// agree on every element's dots.
    #[test]
    fn replica_numbering_is_not_observable() {
        use core::hash::{Hash, Hasher};
        use std::hash::DefaultHasher;
        let (r1, r2) = (ReplicaId(11), ReplicaId(22));
        let mut a: ORSet<u64> = ORSet::new();
        let mut b: ORSet<u64> = ORSet::new();
        let mut da = Vec::new();
        for e in 0..50u64 {
            da.push(
                a.add(if e % 2 == 0 { r1 } else { r2 }, e)
                    .expect("dots left"),
            );
        }
        // `b` sees replica 2 first: its numbers are the other way round.
        for d in da.iter().skip(1).step_by(2).chain(da.iter().step_by(2)) {
            b.apply(d.clone());
        }
        assert_eq!(a, b);
        assert_eq!(a.state(), b.state());
        assert!(a.layout_is_valid() && b.layout_is_valid());
        for e in 0..50u64 {
            assert_eq!(a.dots_of(&e), b.dots_of(&e));
        }
        let h = |s: &ORSet<u64>| {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        };
        assert_eq!(h(&a), h(&b));
        // One element with a dot of another replica than `a`'s: not equal.
        let mut c = b.clone();
        c.remove(&0);
        c.add(r2, 0).expect("dots left");
        assert_ne!(a, c);
        #[cfg(feature = "serde")]
        {
            let cfg = bincode::config::standard();
            assert_eq!(
                bincode::serde::encode_to_vec(&a, cfg).expect("encodes"),
                bincode::serde::encode_to_vec(&b, cfg).expect("encodes")
            );
        }
    }

    /// A set that loses every element gives its replica table back.
    #[test]
    fn a_set_that_loses_every_element_forgets_its_replicas() {
        // 1,000 replicas each add one element (deltas into `x`), then every element goes:
        // by local removes, by a remote clear (a delta), and by a join with a set that
        // removed them. Each time the replica table is given back, and the set keeps working.
        let many = || {
            let mut x: ORSet<u64> = ORSet::new();
            for r in 0..1_000u64 {
                let mut w: ORSet<u64> = ORSet::new();
                x.apply(w.add(ReplicaId(u128::from(r) + 1), r).expect("dots left"));
            }
            assert_eq!(x.replica_table_len(), 1_000);
            x
        };
        let mut local = many();
        for e in 0..1_000u64 {
            local.remove(&e);
        }
        assert_eq!(local.replica_table_len(), 0);
        let mut remote = many();
        let mut twin = remote.clone();
        remote.apply(twin.clear());
        assert_eq!(remote.replica_table_len(), 0);
        let mut joined = many();
        joined.join(twin.clone());
        assert_eq!(joined.replica_table_len(), 0);
        for s in [&mut local, &mut remote, &mut joined] {
            assert!(s.is_empty() && s.layout_is_valid());
            s.add(ReplicaId(7), 42).expect("dots left");
            assert_eq!(s.elements().copied().collect::<Vec<_>>(), vec![42]);
            assert_eq!(s.replica_table_len(), 1);
            assert!(s.layout_is_valid());
        }
    }

    /// Concurrent adds of one element keep both dots (the boxed form); a remote remove of one
    /// of them leaves the other, and the set equals one that only ever held that dot.
    #[test]
    fn concurrent_dots_then_a_remote_remove_of_one() {
        let (r1, r2) = (ReplicaId(1), ReplicaId(2));
        let mut x: ORSet<u64> = ORSet::new();
        let mut y: ORSet<u64> = ORSet::new();
        let dx = x.add(r1, 7).expect("dots left");
        let dy = y.add(r2, 7).expect("dots left");
        x.apply(dy.clone());
        y.apply(dx.clone());
        assert_eq!(x, y);
        assert_eq!(x.dots_of(&7), vec![Dot::new(r1, 1), Dot::new(r2, 1)]);
        // Replica 2 removes what it saw of 7 (both dots); replica 1 re-adds concurrently.
        let rm = y.remove(&7);
        let readd = x.add(r1, 7).expect("dots left");
        x.apply(rm.clone());
        assert_eq!(x.dots_of(&7), vec![Dot::new(r1, 2)]);
        assert!(x.layout_is_valid());
        let mut z: ORSet<u64> = ORSet::new();
        z.apply(dx);
        z.apply(dy);
        z.apply(rm);
        z.apply(readd);
        assert_eq!(x, z);
        // A remote remove of one of two dots, through the join's pass over the set.
        let mut p: ORSet<u64> = ORSet::new();
        let mut q: ORSet<u64> = ORSet::new();
        let d1 = p.add(r1, 9).expect("dots left");
        let d2 = q.add(r2, 9).expect("dots left");
        p.apply(d2.clone());
        let only_r1 = Causal {
            store: DotMap::default(),
            ctx: CausalContext::from_dot(Dot::new(r2, 1)),
        };
        p.apply(only_r1);
        assert_eq!(p.dots_of(&9), vec![Dot::new(r1, 1)]);
        assert!(p.layout_is_valid());
        let mut only = ORSet::new();
        only.apply(d1);
        only.apply(Causal {
            store: DotMap::default(),
            ctx: CausalContext::from_dot(Dot::new(r2, 1)),
        });
        assert_eq!(p, only);
        assert_eq!(p.state(), only.state());
    }

    /// Decoding elements chosen to collide under the former public seed (the HashDoS input,
    /// as untrusted bytes) builds a table whose probes stay short.
    #[cfg(feature = "serde")]
    #[test]
    fn decoding_chosen_collisions_stays_short() {
        let mut s = ORSet::new();
        for e in crate::elem_table::tests::old_seed_collisions(2_000, 8) {
            s.add(ReplicaId(3), e).expect("dots left");
        }
        let cfg = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&s, cfg).expect("encodes");
        let (back, _): (ORSet<u64>, usize) =
            bincode::serde::decode_from_slice(&bytes, cfg).expect("decodes");
        assert_eq!(back, s);
        assert!(
            back.max_probe_len() <= 64,
            "longest probe {}",
            back.max_probe_len()
        );
        assert!(
            s.max_probe_len() <= 64,
            "longest probe {}",
            s.max_probe_len()
        );
    }
}
