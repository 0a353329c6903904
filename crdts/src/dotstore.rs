//! Dot stores (`DotSet`, `DotFun`, `DotMap`) and their causal join (DESIGN.md B2).
//!
//! A causal CRDT is a pair `(store, context)`. The join rule for every store is the same: a
//! dot present on one side survives iff the other side has not seen it (it is not in the other
//! context) or the other side also has it. Removal is therefore "put the dot in the context
//! with no entry": no tombstones.

use crate::context::CausalContext;
use crate::replica::Dot;
use core::fmt::Debug;
use std::collections::BTreeMap;

/// A store of dots (possibly carrying values) that joins causally against contexts.
///
/// Guarantees every implementation gives: `join` is the store part of the causal join of
/// DESIGN.md B2 (commutative, associative, idempotent when paired with the context join), and
/// its cost is proportional to the other (delta) store plus the children it touches.
pub trait DotStore: Clone + Default + PartialEq + Debug {
    /// True for the bottom (empty) store.
    fn is_bottom(&self) -> bool;
    /// Calls `f` on every dot in the store.
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot));
    /// `self := fst((self, ctx) ⊔ (other, other_ctx))`.
    fn join(&mut self, ctx: &CausalContext, other: Self, other_ctx: &CausalContext);
    /// Drops every live dot that `removed` holds (the join with `(⊥, removed)`); returns how many.
    fn remove_dots(&mut self, removed: &CausalContext) -> usize;
    /// The entries of `self` whose dots `ctx` has not seen: what a replica at `ctx` lacks.
    fn unseen_by(&self, ctx: &CausalContext) -> Self;

    /// Every dot of the store as a context.
    fn dots(&self) -> CausalContext {
        let mut c = CausalContext::new();
        self.for_each_dot(&mut |d| {
            c.insert(d);
        });
        c
    }
}

/// A set of dots (the payload of an add-wins set element).
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
// serde: hand-written in `serde_impls` below (canonical-form checks) / `crate::codec`.
pub struct DotSet(Vec<Dot>);

impl DotSet {
    /// A set holding one dot.
    pub fn single(dot: Dot) -> Self {
        Self(vec![dot])
    }
    /// The dots, ascending.
    pub fn iter(&self) -> impl Iterator<Item = &Dot> {
        self.0.iter()
    }
    /// Number of dots.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Does the set hold `dot`?
    pub fn contains(&self, dot: &Dot) -> bool {
        self.0.binary_search(dot).is_ok()
    }
    /// Builds a set from dots in any order (duplicates removed).
    pub fn from_dots(mut dots: Vec<Dot>) -> Self {
        dots.sort_unstable();
        dots.dedup();
        Self(dots)
    }
    /// True when sorted and duplicate-free (decoders check this).
    pub fn is_canonical(&self) -> bool {
        self.0.windows(2).all(|w| w[0] < w[1])
    }
}

/// Shared sorted-merge for the causal join of keyed dot collections.
fn causal_merge<T, D: Fn(&T) -> Dot, M: Fn(T, T) -> T>(
    mine: Vec<T>,
    ctx: &CausalContext,
    theirs: Vec<T>,
    other_ctx: &CausalContext,
    dot_of: D,
    merge_same: M,
) -> Vec<T> {
    let mut out = Vec::with_capacity(mine.len().max(theirs.len()));
    let mut a = mine.into_iter().peekable();
    let mut b = theirs.into_iter().peekable();
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => core::cmp::Ordering::Less,
            (None, Some(_)) => core::cmp::Ordering::Greater,
            (Some(x), Some(y)) => dot_of(x).cmp(&dot_of(y)),
        };
        match order {
            core::cmp::Ordering::Less => {
                if let Some(x) = a.next() {
                    if !other_ctx.contains(&dot_of(&x)) {
                        out.push(x);
                    }
                }
            }
            core::cmp::Ordering::Greater => {
                if let Some(y) = b.next() {
                    if !ctx.contains(&dot_of(&y)) {
                        out.push(y);
                    }
                }
            }
            core::cmp::Ordering::Equal => {
                if let (Some(x), Some(y)) = (a.next(), b.next()) {
                    out.push(merge_same(x, y));
                }
            }
        }
    }
    out
}

impl DotStore for DotSet {
    fn is_bottom(&self) -> bool {
        self.0.is_empty()
    }
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot)) {
        self.0.iter().for_each(|d| f(*d));
    }
    fn join(&mut self, ctx: &CausalContext, other: Self, other_ctx: &CausalContext) {
        let mine = core::mem::take(&mut self.0);
        self.0 = causal_merge(mine, ctx, other.0, other_ctx, |d| *d, |x, _| x);
    }
    fn remove_dots(&mut self, removed: &CausalContext) -> usize {
        let before = self.0.len();
        self.0.retain(|d| !removed.contains(d));
        before - self.0.len()
    }
    fn unseen_by(&self, ctx: &CausalContext) -> Self {
        Self(
            self.0
                .iter()
                .filter(|d| !ctx.contains(d))
                .copied()
                .collect(),
        )
    }
}

/// A map from dots to values (the payload of registers and causal counters).
///
/// Values under the same dot are identical for correct replicas; on conflicting input the
/// join keeps the larger value so it stays commutative.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
// serde: hand-written in `serde_impls` below (canonical-form checks) / `crate::codec`.
pub struct DotFun<V>(Vec<(Dot, V)>);

impl<V> Default for DotFun<V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<V: Clone + Ord + Debug> DotFun<V> {
    /// A store holding one dot and its value.
    pub fn single(dot: Dot, value: V) -> Self {
        Self(vec![(dot, value)])
    }
    /// The `(dot, value)` entries, ascending by dot.
    pub fn iter(&self) -> impl Iterator<Item = (&Dot, &V)> {
        self.0.iter().map(|(d, v)| (d, v))
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The value under `dot`.
    pub fn get(&self, dot: &Dot) -> Option<&V> {
        self.0
            .binary_search_by(|(d, _)| d.cmp(dot))
            .ok()
            .map(|i| &self.0[i].1)
    }
    /// Builds a store from entries in any order (for duplicate dots the larger value is kept).
    pub fn from_entries(mut entries: Vec<(Dot, V)>) -> Self {
        entries.sort();
        let mut out: Vec<(Dot, V)> = Vec::with_capacity(entries.len());
        for (d, v) in entries {
            match out.last_mut() {
                Some(last) if last.0 == d => last.1 = v,
                _ => out.push((d, v)),
            }
        }
        Self(out)
    }
    /// True when sorted by dot with no duplicate dots (decoders check this).
    pub fn is_canonical(&self) -> bool {
        self.0.windows(2).all(|w| w[0].0 < w[1].0)
    }
}

impl<V: Clone + Ord + Debug> DotStore for DotFun<V> {
    fn is_bottom(&self) -> bool {
        self.0.is_empty()
    }
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot)) {
        self.0.iter().for_each(|(d, _)| f(*d));
    }
    fn join(&mut self, ctx: &CausalContext, other: Self, other_ctx: &CausalContext) {
        let mine = core::mem::take(&mut self.0);
        self.0 = causal_merge(
            mine,
            ctx,
            other.0,
            other_ctx,
            |(d, _)| *d,
            |x, y| if y.1 > x.1 { y } else { x },
        );
    }
    fn remove_dots(&mut self, removed: &CausalContext) -> usize {
        let before = self.0.len();
        self.0.retain(|(d, _)| !removed.contains(d));
        before - self.0.len()
    }
    fn unseen_by(&self, ctx: &CausalContext) -> Self {
        Self(
            self.0
                .iter()
                .filter(|(d, _)| !ctx.contains(d))
                .cloned()
                .collect(),
        )
    }
}

/// A map from keys to nested dot stores sharing one context. Empty children are dropped.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
// serde: hand-written in `serde_impls` below (canonical-form checks) / `crate::codec`.
pub struct DotMap<K: Ord, S>(BTreeMap<K, S>);

impl<K: Ord, S> Default for DotMap<K, S> {
    fn default() -> Self {
        Self(BTreeMap::new())
    }
}

impl<K: Ord + Clone + Debug, S: DotStore> DotMap<K, S> {
    /// The child under `key`.
    pub fn get(&self, key: &K) -> Option<&S> {
        self.0.get(key)
    }
    /// Entries ascending by key.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &S)> {
        self.0.iter()
    }
    /// Keys ascending.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.keys()
    }
    /// Number of (non-bottom) children.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when there is no child.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Sets a child directly (a bottom child removes the key). For mutators and decoders.
    pub fn set(&mut self, key: K, child: S) {
        if child.is_bottom() {
            self.0.remove(&key);
        } else {
            self.0.insert(key, child);
        }
    }
    /// Sets a non-bottom child in one tree walk, returning the previous one (mutators' fast path).
    pub(crate) fn replace(&mut self, key: K, child: S) -> Option<S> {
        debug_assert!(!child.is_bottom());
        self.0.insert(key, child)
    }
    /// Removes and returns a child.
    pub fn take(&mut self, key: &K) -> Option<S> {
        self.0.remove(key)
    }
    /// True when no child is bottom (decoders check this).
    pub fn is_canonical(&self) -> bool {
        self.0.values().all(|c| !c.is_bottom())
    }
}

impl<K: Ord + Clone + Debug, S: DotStore> DotStore for DotMap<K, S> {
    fn is_bottom(&self) -> bool {
        self.0.is_empty()
    }
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot)) {
        self.0.values().for_each(|c| c.for_each_dot(f));
    }
    fn join(&mut self, ctx: &CausalContext, other: Self, other_ctx: &CausalContext) {
        // Dots the other side has seen, we have seen too, and the other side does not hold:
        // any of them that is live here must be removed. Most deltas name the keys whose
        // dots they remove; only when some of these dots are not found under the keys the
        // other side names do we scan our remaining keys (e.g. a context-only remove delta).
        let seen_by_both = other_ctx.intersection(ctx);
        let candidates = if seen_by_both.is_empty() {
            seen_by_both
        } else {
            seen_by_both.diff(&other.dots())
        };
        let mut found = 0u64;
        for (k, theirs) in other.0 {
            match self.0.entry(k) {
                std::collections::btree_map::Entry::Occupied(mut slot) => {
                    let child = slot.get_mut();
                    if !candidates.is_empty() {
                        child.for_each_dot(&mut |d| found += u64::from(candidates.contains(&d)));
                    }
                    child.join(ctx, theirs, other_ctx);
                    if child.is_bottom() {
                        slot.remove();
                    }
                }
                std::collections::btree_map::Entry::Vacant(slot) => {
                    let mut child = S::default();
                    child.join(ctx, theirs, other_ctx);
                    if !child.is_bottom() {
                        slot.insert(child);
                    }
                }
            }
        }
        if found < candidates.len() {
            // Children the other side named already lost every candidate dot in their join
            // (a candidate is in the other context and not in the other store), so removing
            // the candidates from every child touches only the ones it did not name.
            self.0.retain(|_, child| {
                child.remove_dots(&candidates);
                !child.is_bottom()
            });
        }
    }
    fn remove_dots(&mut self, removed: &CausalContext) -> usize {
        let mut n = 0;
        self.0.retain(|_, child| {
            n += child.remove_dots(removed);
            !child.is_bottom()
        });
        n
    }
    fn unseen_by(&self, ctx: &CausalContext) -> Self {
        Self(
            self.0
                .iter()
                .filter_map(|(k, c)| {
                    let u = c.unseen_by(ctx);
                    (!u.is_bottom()).then(|| (k.clone(), u))
                })
                .collect(),
        )
    }
}

/// A causal CRDT: a dot store paired with the context of everything its holder has seen.
///
/// Guarantees: `join` is the causal join of DESIGN.md B2 (a join-semilattice: commutative,
/// associative, idempotent); for states and deltas built by this crate `dots(store) ⊆ ctx` (I3).
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
// serde: hand-written in `crate::codec` (compact replica-table encoding).
pub struct Causal<S> {
    /// The dot store.
    pub store: S,
    /// The causal context.
    pub ctx: CausalContext,
}

impl<S: DotStore> Causal<S> {
    /// Builds a causal pair.
    pub fn new(store: S, ctx: CausalContext) -> Self {
        Self { store, ctx }
    }

    /// `self := self ⊔ other`.
    pub fn join(&mut self, other: Causal<S>) {
        self.store.join(&self.ctx, other.store, &other.ctx);
        self.ctx.join(&other.ctx);
    }

    /// True for `(⊥, ∅)`.
    pub fn is_bottom(&self) -> bool {
        self.store.is_bottom() && self.ctx.is_empty()
    }

    /// Invariant I3: every dot of the store is in the context.
    pub fn dots_within_context(&self) -> bool {
        let mut ok = true;
        self.store
            .for_each_dot(&mut |d| ok &= self.ctx.contains(&d));
        ok
    }

    /// Redundancy removal (DESIGN.md C3): the part of `delta` that inflates `self`, so that
    /// `self ⊔ inflation == self ⊔ delta`. `None` when `delta` brings nothing new.
    ///
    /// Entries whose dots `self` has seen are dropped; the context keeps the dots `self` has not
    /// seen plus the seen dots that remove something live here.
    pub fn inflation(&self, delta: &Causal<S>) -> Option<Causal<S>> {
        let store = delta.store.unseen_by(&self.ctx);
        let mut ctx = delta.ctx.diff(&self.ctx);
        let candidates = delta.ctx.intersection(&self.ctx).diff(&delta.store.dots());
        if !candidates.is_empty() {
            let mut live = self.store.clone();
            // What candidates would remove from our store is exactly the live ∩ candidates.
            let before = live.dots();
            live.remove_dots(&candidates);
            ctx.join(&before.diff(&live.dots()));
        }
        if store.is_bottom() && ctx.is_empty() {
            None
        } else {
            Some(Causal { store, ctx })
        }
    }
}

/// Serde for the dot stores (DESIGN.md A11): the same shapes the plain derives wrote (newtypes
/// over a sequence or map), but decoding accepts only canonical input, so a decoded store
/// satisfies the invariants `is_canonical` states. How each [`Dot`] inside is written (in full,
/// or as an index into the enclosing [`Causal`]'s replica table) is decided by `crate::codec`.
#[cfg(feature = "serde")]
mod serde_impls {
    use super::{BTreeMap, Dot, DotFun, DotMap, DotSet, DotStore};
    use core::fmt;
    use core::marker::PhantomData;
    use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
    use serde::ser::{Serialize, Serializer};

    impl Serialize for DotSet {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_newtype_struct("DotSet", &self.0)
        }
    }

    impl<'de> Deserialize<'de> for DotSet {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            #[derive(serde::Deserialize)]
            #[serde(rename = "DotSet")]
            struct Raw(Vec<Dot>);
            let set = DotSet(Raw::deserialize(d)?.0);
            if set.is_canonical() {
                Ok(set)
            } else {
                Err(de::Error::custom("dot set is not strictly ascending"))
            }
        }
    }

    impl<V: Serialize> Serialize for DotFun<V> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_newtype_struct("DotFun", &self.0)
        }
    }

    impl<'de, V: Deserialize<'de>> Deserialize<'de> for DotFun<V> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            #[derive(serde::Deserialize)]
            #[serde(rename = "DotFun")]
            struct Raw<V>(Vec<(Dot, V)>);
            let entries = Raw::<V>::deserialize(d)?.0;
            // Same test as `DotFun::is_canonical`, which needs more bounds on `V` than serde.
            if entries.windows(2).all(|w| w[0].0 < w[1].0) {
                Ok(DotFun(entries))
            } else {
                Err(de::Error::custom(
                    "dot fun is not strictly ascending by dot",
                ))
            }
        }
    }

    impl<K: Ord + Serialize, S: Serialize> Serialize for DotMap<K, S> {
        fn serialize<Ser: Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
            s.serialize_newtype_struct("DotMap", &self.0)
        }
    }

    impl<'de, K: Ord + Deserialize<'de>, S: DotStore + Deserialize<'de>> Deserialize<'de>
        for DotMap<K, S>
    {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            /// Reads the map strictly: keys strictly ascending (no duplicate silently dropped)
            /// and no bottom child, i.e. exactly the canonical encoding of a `DotMap`.
            struct MapVisitor<K, S>(PhantomData<(K, S)>);

            impl<'de, K: Ord + Deserialize<'de>, S: DotStore + Deserialize<'de>> Visitor<'de>
                for MapVisitor<K, S>
            {
                type Value = BTreeMap<K, S>;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a map with strictly ascending keys and non-empty children")
                }

                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                    // Not pre-sized from the claimed length: it is untrusted input.
                    let mut entries: Vec<(K, S)> = Vec::new();
                    while let Some((k, child)) = map.next_entry::<K, S>()? {
                        if entries.last().is_some_and(|(prev, _)| *prev >= k) {
                            return Err(de::Error::custom(
                                "dot map keys are not strictly ascending",
                            ));
                        }
                        if child.is_bottom() {
                            return Err(de::Error::custom("dot map holds an empty child"));
                        }
                        entries.push((k, child));
                    }
                    // Sorted input: `collect` builds the tree in bulk.
                    Ok(entries.into_iter().collect())
                }
            }

            struct NewtypeVisitor<K, S>(PhantomData<(K, S)>);

            impl<'de, K: Ord + Deserialize<'de>, S: DotStore + Deserialize<'de>> Visitor<'de>
                for NewtypeVisitor<K, S>
            {
                type Value = DotMap<K, S>;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a dot map")
                }

                fn visit_newtype_struct<D: Deserializer<'de>>(
                    self,
                    d: D,
                ) -> Result<Self::Value, D::Error> {
                    d.deserialize_map(MapVisitor(PhantomData)).map(DotMap)
                }
            }

            d.deserialize_newtype_struct("DotMap", NewtypeVisitor(PhantomData))
        }
    }
}
