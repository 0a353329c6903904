//! Dot stores (`DotSet`, `DotFun`, `DotMap`) and their causal join (`docs/design/principles.md`,
//! "Dot stores and the causal join").
//!
//! A causal CRDT is a pair `(store, context)`. The join rule for every store is the same: a
//! dot present on one side survives iff the other side has not seen it (it is not in the other
//! context) or the other side also has it. Removal is therefore "put the dot in the context
//! with no entry": no tombstones.

use crate::context::CausalContext;
use crate::dot::Dot;
use core::fmt::Debug;
use smallvec::SmallVec;

/// A store of dots (possibly carrying values) that joins causally against contexts.
///
/// Guarantees every implementation gives: `join` is the store part of the causal join of
/// `docs/design/principles.md` "Dot stores and the causal join" (commutative, associative,
/// idempotent when paired with the context join), and its cost is proportional to the other (delta)
/// store plus the children it touches.
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
    /// The entries of `self` under dots that `mine` holds at the same place with a value the
    /// join replaces (a larger one). Empty for every pair of stores correct replicas build
    /// (one dot, one value); on conflicting input redundancy removal must still forward them.
    fn overriding(&self, mine: &Self) -> Self;
    /// Adds to `out` every dot of `self` that `ctx` has seen but `mine` does not hold at the
    /// same place (same key, same element). If `mine` holds such a dot elsewhere, the causal
    /// join removes it there: the other side has seen it and does not hold it under that key.
    fn seen_elsewhere(&self, mine: &Self, ctx: &CausalContext, out: &mut CausalContext);

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
///
/// One dot (the usual case: an element added once, or re-added, which retires its older
/// dots) is kept inline, without a heap allocation.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
// serde: hand-written in `serde_impls` below (canonical-form checks) / `crate::compact`.
pub struct DotSet(SmallVec<[Dot; 1]>);

impl DotSet {
    /// A set holding one dot (no heap allocation).
    #[inline]
    pub fn single(dot: Dot) -> Self {
        Self(smallvec::smallvec![dot])
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
        Self(dots.into_iter().collect())
    }
    /// True when sorted and duplicate-free (decoders check this).
    pub fn is_canonical(&self) -> bool {
        self.0.windows(2).all(|w| w[0] < w[1])
    }
}

/// Shared sorted-merge for the causal join of keyed dot collections.
fn causal_merge<T, D: Fn(&T) -> Dot, M: Fn(T, T) -> T>(
    mine: SmallVec<[T; 1]>,
    ctx: &CausalContext,
    theirs: SmallVec<[T; 1]>,
    other_ctx: &CausalContext,
    dot_of: D,
    merge_same: M,
) -> SmallVec<[T; 1]> {
    // One entry on each side under the same dot (a key both replicas hold unchanged, the
    // bulk of a merge): keep it, no merge loop.
    if mine.len() == 1 && theirs.len() == 1 && dot_of(&mine[0]) == dot_of(&theirs[0]) {
        let mut out = SmallVec::new();
        if let (Some(x), Some(y)) = (mine.into_iter().next(), theirs.into_iter().next()) {
            out.push(merge_same(x, y));
        }
        return out;
    }
    let mut out = SmallVec::with_capacity(mine.len().max(theirs.len()));
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
    fn overriding(&self, _mine: &Self) -> Self {
        Self::default()
    }
    fn seen_elsewhere(&self, mine: &Self, ctx: &CausalContext, out: &mut CausalContext) {
        for d in &self.0 {
            if ctx.contains(d) && !mine.contains(d) {
                out.insert(*d);
            }
        }
    }
}

/// A map from dots to values (the payload of registers and causal counters).
///
/// Values under the same dot are identical for correct replicas; on conflicting input the
/// join keeps the larger value so it stays commutative.
///
/// One entry (a counter's live dot, a register's value) is kept inline, without a heap
/// allocation.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
// serde: hand-written in `serde_impls` below (canonical-form checks) / `crate::compact`.
pub struct DotFun<V>(SmallVec<[(Dot, V); 1]>);

impl<V> Default for DotFun<V> {
    fn default() -> Self {
        Self(SmallVec::new())
    }
}

impl<V: Clone + Ord + Debug> DotFun<V> {
    /// A store holding one dot and its value (no heap allocation).
    pub fn single(dot: Dot, value: V) -> Self {
        Self(smallvec::smallvec![(dot, value)])
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
        let mut out: SmallVec<[(Dot, V); 1]> = SmallVec::with_capacity(entries.len());
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

    /// Removes every entry, appending its dot to `removed` (in-place mutators).
    pub(crate) fn drain_dots(&mut self, removed: &mut Vec<Dot>) {
        removed.extend(self.0.iter().map(|(d, _)| *d));
        self.0.clear();
    }
    /// Removes the entry under `dot` (in-place mutators).
    pub(crate) fn remove_dot(&mut self, dot: &Dot) -> Option<V> {
        let i = self.0.binary_search_by(|(d, _)| d.cmp(dot)).ok()?;
        Some(self.0.remove(i).1)
    }
    /// Inserts `(dot, value)` keeping the entries ascending (for a dot already present the
    /// larger value is kept, as the join does).
    pub(crate) fn insert(&mut self, dot: Dot, value: V) {
        match self.0.binary_search_by(|(d, _)| d.cmp(&dot)) {
            Ok(i) => {
                if value > self.0[i].1 {
                    self.0[i].1 = value;
                }
            }
            Err(i) => self.0.insert(i, (dot, value)),
        }
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
    fn overriding(&self, mine: &Self) -> Self {
        Self(
            self.0
                .iter()
                .filter(|(d, v)| mine.get(d).is_some_and(|m| v > m))
                .cloned()
                .collect(),
        )
    }
    fn seen_elsewhere(&self, mine: &Self, ctx: &CausalContext, out: &mut CausalContext) {
        for (d, _) in &self.0 {
            if ctx.contains(d) && mine.get(d).is_none() {
                out.insert(*d);
            }
        }
    }
}

/// Which children a [`DotMap`] key admits. The decoder rejects a child its key does not admit,
/// so a decoded map never holds, e.g., a set entry under a counter key (`causal_map::Key` admits only
/// entries of its own kind; every other key type admits every child).
pub trait AdmitsChild<S> {
    /// True when `child` may be stored under `self`.
    fn admits(&self, child: &S) -> bool;
}

impl<K> AdmitsChild<DotSet> for K {
    fn admits(&self, _: &DotSet) -> bool {
        true
    }
}

impl<K, V> AdmitsChild<DotFun<V>> for K {
    fn admits(&self, _: &DotFun<V>) -> bool {
        true
    }
}

impl<K, K2: Ord, S> AdmitsChild<DotMap<K2, S>> for K {
    fn admits(&self, _: &DotMap<K2, S>) -> bool {
        true
    }
}

/// Entries per chunk of a [`DotMap`] at most (see its doc).
pub(crate) const CHUNK: usize = 32;
/// Chunks per group of a [`DotMap`] at most (see its doc).
pub(crate) const GROUP: usize = 32;

/// One sorted run of a [`DotMap`]'s entries. The keys are ascending in their own vector, so a
/// key search reads only keys (a few adjacent cache lines), never the children; the children
/// are in a second vector in the order they arrived, `slot[i]` naming the one of `keys[i]`, so
/// an insert or remove in the middle moves keys and one-byte slots, not children.
#[derive(Clone)]
struct Chunk<K, S> {
    keys: Vec<K>,
    /// `slot[..keys.len()]` is a permutation of `0..keys.len()`; the rest is unused.
    slot: [u8; CHUNK],
    vals: Vec<S>,
}

impl<K: Ord, S> Chunk<K, S> {
    fn with_capacity(cap: usize) -> Self {
        Self {
            keys: Vec::with_capacity(cap),
            slot: [0; CHUNK],
            vals: Vec::with_capacity(cap),
        }
    }
    #[inline]
    fn len(&self) -> usize {
        self.keys.len()
    }
    /// The child of `keys[i]`.
    #[inline]
    fn val(&self, i: usize) -> Option<&S> {
        self.vals.get(usize::from(*self.slot.get(i)?))
    }
    /// The child of `keys[i]`, mutably.
    #[inline]
    fn val_mut(&mut self, i: usize) -> Option<&mut S> {
        self.vals.get_mut(usize::from(*self.slot.get(i)?))
    }
    /// Appends an entry above every key (`len < CHUNK`).
    #[inline]
    fn push(&mut self, key: K, child: S) {
        self.insert(self.keys.len(), key, child);
    }
    /// Inserts an entry at key position `i` (`i ≤ len < CHUNK`).
    #[inline]
    fn insert(&mut self, i: usize, key: K, child: S) {
        let len = self.keys.len();
        debug_assert!(i <= len && len < CHUNK);
        self.slot.copy_within(i..len, i + 1);
        // `len < CHUNK ≤ 256`.
        self.slot[i] = len as u8;
        self.keys.insert(i, key);
        self.vals.push(child);
    }
    /// Removes entry `i` (`i < len`); gives memory back when a quarter full.
    fn remove(&mut self, i: usize) -> S {
        let len = self.keys.len();
        let s = self.slot[i];
        self.keys.remove(i);
        self.slot.copy_within(i + 1..len, i);
        let last = len - 1;
        if usize::from(s) != last {
            // The last child moves to the freed place: repoint its key.
            if let Some(p) = self.slot[..last]
                .iter_mut()
                .find(|p| usize::from(**p) == last)
            {
                *p = s;
            }
        }
        let child = self.vals.swap_remove(usize::from(s));
        if last * 4 <= self.keys.capacity() && self.keys.capacity() > 4 {
            self.keys.shrink_to(last * 2);
            self.vals.shrink_to(last * 2);
        }
        child
    }
    /// Puts the children in key order (`slot` becomes the identity).
    fn sort_vals(&mut self) {
        let len = self.keys.len();
        for i in 0..len {
            // Follow the cycle through `i`: position `cur` receives the child at `slot[cur]`.
            let mut cur = i;
            loop {
                let src = usize::from(self.slot[cur]);
                self.slot[cur] = cur as u8;
                if src == i {
                    break;
                }
                self.vals.swap(cur, src);
                cur = src;
            }
        }
    }
    /// Moves the entries from `CHUNK / 2` on into a new chunk of capacity [`CHUNK`].
    fn split_upper(&mut self) -> Self {
        self.sort_vals();
        let mut upper = Self::with_capacity(CHUNK);
        upper.keys.extend(self.keys.drain(CHUNK / 2..));
        upper.vals.extend(self.vals.drain(CHUNK / 2..));
        upper.set_identity();
        upper
    }
    /// `slot[i] = i` for every entry (the children are in key order).
    fn set_identity(&mut self) {
        for (i, s) in self.slot.iter_mut().enumerate().take(self.keys.len()) {
            *s = i as u8;
        }
    }
    /// The entries in key order.
    fn iter(&self) -> impl Iterator<Item = (&K, &S)> {
        self.keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| Some((k, self.val(i)?)))
    }
    /// The entries by value, in key order.
    fn into_sorted(mut self) -> impl Iterator<Item = (K, S)> {
        self.sort_vals();
        self.keys.into_iter().zip(self.vals)
    }
    /// Keeps the entries for which `keep` returns true (it may change the child); returns how
    /// many went.
    fn retain(&mut self, keep: impl FnMut(&mut K, &mut S) -> bool) -> usize {
        self.sort_vals();
        let removed = retain_pairs(&mut self.keys, &mut self.vals, keep);
        self.set_identity();
        removed
    }
    /// True when the keys are at most [`CHUNK`], as many as the children, and `slot` maps them
    /// one to one onto the children.
    fn slots_valid(&self) -> bool {
        let len = self.keys.len();
        if len > CHUNK || self.vals.len() != len {
            return false;
        }
        let mut seen = [false; CHUNK];
        for s in &self.slot[..len] {
            match seen.get_mut(usize::from(*s)) {
                Some(x) if !*x && usize::from(*s) < len => *x = true,
                _ => return false,
            }
        }
        true
    }
}

/// Keeps the pairs `(a[i], b[i])` for which `keep` returns true, in order (`a` and `b` have the
/// same length); returns how many went.
fn retain_pairs<A, B>(
    a: &mut Vec<A>,
    b: &mut Vec<B>,
    mut keep: impl FnMut(&mut A, &mut B) -> bool,
) -> usize {
    let n = a.len().min(b.len());
    let mut kept = 0;
    for i in 0..n {
        if keep(&mut a[i], &mut b[i]) {
            if kept != i {
                a.swap(kept, i);
                b.swap(kept, i);
            }
            kept += 1;
        }
    }
    a.truncate(kept);
    b.truncate(kept);
    n - kept
}

/// Up to [`GROUP`] consecutive chunks of a [`DotMap`] under their separators (`seps[c] ≤` every
/// key of `chunks[c]`, `<` every key of the chunks after it).
#[derive(Clone)]
struct Group<K, S> {
    seps: Vec<K>,
    chunks: Vec<Chunk<K, S>>,
}

/// A map from keys to nested dot stores sharing one context. Empty children are dropped.
///
/// A map of one key (a delta: one element added, one key written) holds that entry inline, in
/// the map itself (no heap allocation: building, moving and dropping a one-key delta allocates
/// nothing beyond what its key and child own); the one entry shares the map's memory with the
/// chunked form below, so the map is as wide as the wider of the two (plus a tag where no niche
/// holds it): on 64-bit targets `DotMap<u64, DotSet>` (a set delta) is 64 bytes, as wide as the
/// chunked form, `DotMap<String, DotSet>` 80 and the node store's `DotMap<Key, Entry>` 160.
/// Equality, hashing, ordering of iteration and encoding depend only on the entries, never on
/// which form holds them.
///
/// Larger maps keep their entries in sorted chunks of at most 32 entries (`CHUNK`), each a vector
/// of ascending keys beside a vector of children in arrival order with a one-byte slot per key
/// naming its child (a key search reads keys only; an insert or remove in the middle moves keys and
/// slots, never a child), under a fixed two-level index: groups of at most 32 chunks (`GROUP`) with
/// a vector of chunk separators each, and a vector of group separators. A separator is a lower
/// bound: every key of a chunk (group) is `≥` its separator and `<` the next chunk's (group's)
/// separator, and no chunk or group is empty. A key above every key (the append-heavy case: element
/// ids, timestamps, counters) goes to the end of the last chunk without any key search; any other
/// key costs three binary searches in contiguous vectors (group separators, one group's chunk
/// separators, one chunk's keys), and an insert moves at most one chunk's keys and slots, one
/// group's chunks, or (one split in about `CHUNK × GROUP / 4` random inserts) the groups. Iteration
/// walks the chunks in order, so it is ascending by key.
// serde: hand-written in `serde_impls` below (canonical-form checks) / `crate::compact`.
pub struct DotMap<K: Ord, S> {
    /// Which form holds the entries.
    repr: Repr<K, S>,
}

/// The two forms of a [`DotMap`].
#[derive(Clone)]
enum Repr<K, S> {
    /// The only entry of a one-key map built by `set`/`replace` on an empty map, or by
    /// `single` (a mutator's delta).
    One(K, S),
    /// Every entry otherwise (any number, also 0 or 1), in groups of chunks.
    Chunked(Chunked<K, S>),
}

/// The chunked form of a [`DotMap`] (see its doc).
#[derive(Clone)]
struct Chunked<K, S> {
    /// The groups' separators, ascending (one per group).
    seps: Vec<K>,
    /// The entries, in groups of chunks.
    groups: Vec<Group<K, S>>,
    /// Number of entries.
    len: usize,
}

impl<K, S> Default for Chunked<K, S> {
    fn default() -> Self {
        Self {
            seps: Vec::new(),
            groups: Vec::new(),
            len: 0,
        }
    }
}

impl<K, S> Default for Repr<K, S> {
    fn default() -> Self {
        Repr::Chunked(Chunked::default())
    }
}

impl<K: Ord, S> Default for DotMap<K, S> {
    fn default() -> Self {
        Self {
            repr: Repr::default(),
        }
    }
}

impl<K: Ord + Clone, S: Clone> Clone for DotMap<K, S> {
    fn clone(&self) -> Self {
        Self {
            repr: self.repr.clone(),
        }
    }
}

impl<K: Ord, S> DotMap<K, S> {
    /// Entries ascending by key, whichever form holds them.
    /// The iterator knows its exact length (serializers that write the length first rely on
    /// `size_hint`).
    fn entries(&self) -> impl ExactSizeIterator<Item = (&K, &S)> {
        let (one, groups): (_, &[Group<K, S>]) = match &self.repr {
            Repr::One(k, s) => (Some((k, s)), &[]),
            Repr::Chunked(c) => (None, &c.groups),
        };
        Counted {
            inner: one.into_iter().chain(
                groups
                    .iter()
                    .flat_map(|g| g.chunks.iter())
                    .flat_map(Chunk::iter),
            ),
            left: self.count(),
        }
    }

    /// Number of entries.
    fn count(&self) -> usize {
        match &self.repr {
            Repr::One(..) => 1,
            Repr::Chunked(c) => c.len,
        }
    }

    /// The entries in the chunked form, moved out of the map (which is left empty); a one-key
    /// map's entry is inserted into an empty chunked form (general paths only).
    fn take_chunked(&mut self) -> Chunked<K, S>
    where
        K: Clone,
    {
        match core::mem::take(&mut self.repr) {
            Repr::Chunked(c) => c,
            Repr::One(k, s) => {
                let mut c = Chunked::default();
                c.insert(k, s);
                c
            }
        }
    }

    /// The chunked form of entries ascending by key (full chunks).
    pub(crate) fn from_sorted(entries: impl IntoIterator<Item = (K, S)>) -> Self
    where
        K: Clone,
    {
        Self {
            repr: Repr::Chunked(Chunked::from_sorted(entries)),
        }
    }
}

impl<K: Ord, S> Chunked<K, S> {
    /// `(group, chunk)` of the chunk whose key range holds `key`; `None` when `key` is below
    /// every separator of the group whose range holds it (no entry has that key).
    #[inline]
    fn locate(&self, key: &K) -> Option<(usize, usize)> {
        let g = self.seps.partition_point(|s| s <= key).checked_sub(1)?;
        let c = self
            .groups
            .get(g)?
            .seps
            .partition_point(|s| s <= key)
            .checked_sub(1)?;
        Some((g, c))
    }

    /// The child under `key`.
    fn get(&self, key: &K) -> Option<&S> {
        let (g, c) = self.locate(key)?;
        let chunk = self.groups.get(g)?.chunks.get(c)?;
        let i = chunk.keys.binary_search(key).ok()?;
        chunk.val(i)
    }

    /// The child under `key`, mutably.
    fn get_mut(&mut self, key: &K) -> Option<&mut S> {
        let (g, c) = self.locate(key)?;
        let chunk = self.groups.get_mut(g)?.chunks.get_mut(c)?;
        let i = chunk.keys.binary_search(key).ok()?;
        chunk.val_mut(i)
    }

    /// Removes and returns the child under `key`. An emptied chunk (group) is
    /// dropped; a chunk left at a quarter of its capacity gives memory back.
    fn remove(&mut self, key: &K) -> Option<S> {
        let (g, c) = self.locate(key)?;
        let group = self.groups.get_mut(g)?;
        let chunk = group.chunks.get_mut(c)?;
        let i = chunk.keys.binary_search(key).ok()?;
        let child = chunk.remove(i);
        self.len -= 1;
        if chunk.keys.is_empty() {
            group.seps.remove(c);
            group.chunks.remove(c);
            if group.chunks.is_empty() {
                self.seps.remove(g);
                self.groups.remove(g);
            }
        }
        Some(child)
    }

    /// Appends a chunk whose keys are above every key (to the last group, or a new one).
    fn push_chunk(&mut self, sep: K, chunk: Chunk<K, S>)
    where
        K: Clone,
    {
        if let Some(group) = self.groups.last_mut()
            && group.chunks.len() < GROUP
        {
            group.seps.push(sep);
            group.chunks.push(chunk);
            return;
        }
        if self.groups.is_empty() {
            // A small map: one group of one chunk, every vector at its length (they grow on
            // demand, up to `GROUP`), so that a map of a few keys stays a few hundred bytes.
            self.seps = vec![sep.clone()];
            self.groups = vec![Group {
                seps: vec![sep],
                chunks: vec![chunk],
            }];
            return;
        }
        // The last group is full, so the map is large: the next group starts at full size.
        self.seps.push(sep.clone());
        let mut seps = Vec::with_capacity(GROUP);
        let mut chunks = Vec::with_capacity(GROUP);
        seps.push(sep);
        chunks.push(chunk);
        self.groups.push(Group { seps, chunks });
    }

    /// Inserts an entry, returning the previous child under `key`.
    fn insert(&mut self, key: K, child: S) -> Option<S>
    where
        K: Clone,
    {
        // Past the last key (or no entry): append to the last chunk, or start a chunk.
        let last = self.groups.last_mut().and_then(|g| g.chunks.last_mut());
        let above = match &last {
            None => true,
            Some(chunk) => chunk.keys.last().is_none_or(|k| *k < key),
        };
        if above {
            self.len += 1;
            match last {
                Some(chunk) if chunk.len() < CHUNK => chunk.push(key, child),
                _ => {
                    // A map just leaving its one-entry form starts small; past a full chunk, appends go on.
                    let cap = if self.groups.is_empty() { 4 } else { CHUNK };
                    let mut chunk = Chunk::with_capacity(cap);
                    let sep = key.clone();
                    chunk.push(key, child);
                    self.push_chunk(sep, chunk);
                }
            }
            return None;
        }
        // Some key is above `key`, so there is a group. Below a separator: that group's first
        // chunk takes `key`, which becomes the separator (lower bounds stay lower bounds).
        let g = match self.seps.partition_point(|s| *s <= key).checked_sub(1) {
            Some(g) => g,
            None => {
                if let Some(s) = self.seps.first_mut() {
                    *s = key.clone();
                }
                0
            }
        };
        let group = self.groups.get_mut(g)?;
        let c = match group.seps.partition_point(|s| *s <= key).checked_sub(1) {
            Some(c) => c,
            None => {
                if let Some(s) = group.seps.first_mut() {
                    *s = key.clone();
                }
                0
            }
        };
        let chunk = group.chunks.get_mut(c)?;
        match chunk.keys.binary_search(&key) {
            Ok(i) => chunk.val_mut(i).map(|v| core::mem::replace(v, child)),
            Err(i) => {
                self.len += 1;
                if chunk.len() < CHUNK {
                    chunk.insert(i, key, child);
                    return None;
                }
                // Full: split in halves, the upper half under its first key.
                let mut upper = chunk.split_upper();
                if i <= CHUNK / 2 {
                    chunk.insert(i, key, child);
                } else {
                    upper.insert(i - CHUNK / 2, key, child);
                }
                let sep = upper.keys[0].clone();
                let at = c + 1;
                if group.chunks.len() < GROUP {
                    group.seps.insert(at, sep);
                    group.chunks.insert(at, upper);
                    return None;
                }
                // Full group: its upper half becomes a group after it (before the insert, so no
                // group vector ever grows past `GROUP`), and the new chunk goes into its half.
                let mut seps = Vec::with_capacity(GROUP);
                let mut chunks = Vec::with_capacity(GROUP);
                seps.extend(group.seps.drain(GROUP / 2..));
                chunks.extend(group.chunks.drain(GROUP / 2..));
                if at <= GROUP / 2 {
                    group.seps.insert(at, sep);
                    group.chunks.insert(at, upper);
                } else {
                    seps.insert(at - GROUP / 2, sep);
                    chunks.insert(at - GROUP / 2, upper);
                }
                let gsep = seps[0].clone();
                self.seps.insert(g + 1, gsep);
                self.groups.insert(g + 1, Group { seps, chunks });
                None
            }
        }
    }

    /// The entries ascending by key, in full chunks.
    fn from_sorted(entries: impl IntoIterator<Item = (K, S)>) -> Self
    where
        K: Clone,
    {
        let mut map = Self::default();
        let mut entries = entries.into_iter();
        while let Some((k, s)) = entries.next() {
            map.len += 1;
            match map.groups.last_mut().and_then(|g| g.chunks.last_mut()) {
                Some(c) if c.len() < CHUNK => c.push(k, s),
                _ => {
                    // Exact when the length is known (decoding), else grown on demand.
                    let cap = CHUNK.min(entries.size_hint().0 + 1);
                    let mut c = Chunk::with_capacity(cap);
                    let sep = k.clone();
                    c.push(k, s);
                    map.push_chunk(sep, c);
                }
            }
        }
        map
    }
}

/// An iterator of known length (`left` items remain).
struct Counted<I> {
    inner: I,
    left: usize,
}

impl<I: Iterator> Iterator for Counted<I> {
    type Item = I::Item;
    fn next(&mut self) -> Option<I::Item> {
        let item = self.inner.next()?;
        self.left = self.left.saturating_sub(1);
        Some(item)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<I: Iterator> ExactSizeIterator for Counted<I> {}

impl<K: Ord, S: PartialEq> PartialEq for DotMap<K, S> {
    fn eq(&self, other: &Self) -> bool {
        self.count() == other.count() && self.entries().eq(other.entries())
    }
}

impl<K: Ord, S: Eq> Eq for DotMap<K, S> {}

impl<K: Ord + core::hash::Hash, S: core::hash::Hash> core::hash::Hash for DotMap<K, S> {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        state.write_usize(self.count());
        for (k, s) in self.entries() {
            k.hash(state);
            s.hash(state);
        }
    }
}

impl<K: Ord + Debug, S: Debug> Debug for DotMap<K, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("DotMap").field(&DebugEntries(self)).finish()
    }
}

/// `{k: v, ...}` for `DotMap`'s `Debug`, as the tree printed it.
struct DebugEntries<'a, K: Ord, S>(&'a DotMap<K, S>);

impl<K: Ord + Debug, S: Debug> Debug for DebugEntries<'_, K, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_map().entries(self.0.entries()).finish()
    }
}

impl<K: Ord + Clone + Debug, S: DotStore> DotMap<K, S> {
    /// The child under `key`.
    pub fn get(&self, key: &K) -> Option<&S> {
        match &self.repr {
            Repr::One(k, s) => (k == key).then_some(s),
            Repr::Chunked(c) => c.get(key),
        }
    }
    /// Entries ascending by key (of exact length).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&K, &S)> {
        self.entries()
    }
    /// Keys ascending.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries().map(|(k, _)| k)
    }
    /// Number of (non-bottom) children.
    pub fn len(&self) -> usize {
        self.count()
    }
    /// True when there is no child.
    pub fn is_empty(&self) -> bool {
        matches!(&self.repr, Repr::Chunked(c) if c.len == 0)
    }
    /// Sets a child directly (a bottom child removes the key). For mutators and decoders.
    pub fn set(&mut self, key: K, child: S) {
        if child.is_bottom() {
            self.take(&key);
        } else {
            self.replace(key, child);
        }
    }
    /// Sets a non-bottom child in one search, returning the previous one (mutators' fast path).
    /// On an empty map the entry is kept inline (no tree node, no allocation); a key above every
    /// key of a larger map is appended without a search.
    pub(crate) fn replace(&mut self, key: K, child: S) -> Option<S> {
        debug_assert!(!child.is_bottom());
        match &mut self.repr {
            Repr::One(k, s) if *k == key => Some(core::mem::replace(s, child)),
            Repr::One(..) => {
                let mut c = self.take_chunked();
                let prev = c.insert(key, child);
                self.repr = Repr::Chunked(c);
                prev
            }
            Repr::Chunked(c) if c.len == 0 => {
                self.repr = Repr::One(key, child);
                None
            }
            Repr::Chunked(c) => c.insert(key, child),
        }
    }
    /// A map of one non-bottom child, held inline (a mutator's delta; no heap allocation).
    pub(crate) fn single(key: K, child: S) -> Self {
        debug_assert!(!child.is_bottom());
        Self {
            repr: Repr::One(key, child),
        }
    }
    /// Removes and returns a child.
    pub fn take(&mut self, key: &K) -> Option<S> {
        match &mut self.repr {
            Repr::One(k, _) if k == key => match core::mem::take(&mut self.repr) {
                Repr::One(_, s) => Some(s),
                Repr::Chunked(_) => None,
            },
            Repr::One(..) => None,
            Repr::Chunked(c) => c.remove(key),
        }
    }
    /// True when no child is bottom (decoders check this).
    pub fn is_canonical(&self) -> bool {
        self.entries().all(|(_, c)| !c.is_bottom())
    }
    /// True when the chunked form keeps its own invariants: one separator per group and per
    /// chunk, no empty group or chunk, at most 32 (`GROUP`) chunks per group and 32 (`CHUNK`)
    /// entries per chunk, keys and children of a chunk equally many, keys strictly ascending
    /// across the whole map, every key `≥` its chunk's separator, which is `≥` its group's, and
    /// every separator `>` every key before it; and the entry count right (property tests check
    /// this after every operation). A one-key map held inline is always valid.
    pub fn layout_is_valid(&self) -> bool {
        match &self.repr {
            Repr::One(..) => true,
            Repr::Chunked(c) => c.layout_is_valid(),
        }
    }
    /// The entries by value, ascending by key.
    pub(crate) fn into_entries(self) -> impl Iterator<Item = (K, S)> {
        let (one, groups) = match self.repr {
            Repr::One(k, s) => (Some((k, s)), Vec::new()),
            Repr::Chunked(c) => (None, c.groups),
        };
        one.into_iter().chain(
            groups
                .into_iter()
                .flat_map(|g| g.chunks)
                .flat_map(Chunk::into_sorted),
        )
    }
    /// Keeps the children for which `keep` returns true (it may change them).
    fn retain(&mut self, mut keep: impl FnMut(&K, &mut S) -> bool) {
        match &mut self.repr {
            Repr::One(k, s) => {
                if !keep(k, s) {
                    self.repr = Repr::default();
                }
            }
            Repr::Chunked(c) => c.retain(keep),
        }
    }
}

impl<K: Ord, S> Chunked<K, S> {
    /// True when the layout invariants [`DotMap::layout_is_valid`] states hold.
    fn layout_is_valid(&self) -> bool {
        if self.seps.len() != self.groups.len() {
            return false;
        }
        let mut count = 0;
        let mut prev: Option<&K> = None;
        for (gsep, group) in self.seps.iter().zip(&self.groups) {
            if group.chunks.is_empty()
                || group.chunks.len() > GROUP
                || group.seps.len() != group.chunks.len()
                || prev.is_some_and(|p| p >= gsep)
            {
                return false;
            }
            for (sep, chunk) in group.seps.iter().zip(&group.chunks) {
                if chunk.keys.is_empty()
                    || !chunk.slots_valid()
                    || sep < gsep
                    || prev.is_some_and(|p| p >= sep)
                {
                    return false;
                }
                for k in &chunk.keys {
                    if k < sep || prev.is_some_and(|p| p >= k) {
                        return false;
                    }
                    prev = Some(k);
                }
                count += chunk.len();
            }
        }
        count == self.len
    }
    /// Keeps the entries for which `keep` returns true (it may change the child).
    fn retain(&mut self, mut keep: impl FnMut(&K, &mut S) -> bool) {
        // Separators stay valid lower bounds when entries, chunks or groups go.
        let mut removed = 0;
        for group in &mut self.groups {
            for chunk in &mut group.chunks {
                removed += chunk.retain(|k, s| keep(k, s));
            }
            retain_pairs(&mut group.seps, &mut group.chunks, |_, c| {
                !c.keys.is_empty()
            });
        }
        retain_pairs(&mut self.seps, &mut self.groups, |_, g| {
            !g.chunks.is_empty()
        });
        self.len -= removed;
    }
}

impl<K: Ord + Clone + Debug, S: DotStore> DotStore for DotMap<K, S> {
    fn is_bottom(&self) -> bool {
        self.is_empty()
    }
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot)) {
        self.entries().for_each(|(_, c)| c.for_each_dot(f));
    }
    fn join(&mut self, ctx: &CausalContext, other: Self, other_ctx: &CausalContext) {
        // Dots the other side has seen, we have seen too, and the other side does not hold:
        // any of them that is live here must be removed. Most deltas name the keys whose
        // dots they remove; only when some of these dots are not found under the keys the
        // other side names do we scan our remaining keys (e.g. a context-only remove delta).
        //
        // A dot the other side holds under one key and we hold under another (input no correct
        // replica produces, but a decoder cannot see across two messages) is removed on both
        // sides, as the per-key rule `(s∩s')∪(s\c')∪(s'\c)` says: so the dots of the other
        // store that we have seen but do not hold under the same key are candidates too.
        let seen_by_both = other_ctx.intersection(ctx);
        let candidates = if seen_by_both.is_empty() {
            // Our context and the other's are disjoint: the other side's dots (all within its
            // context) are all unseen here, so none can be held under another key.
            seen_by_both
        } else {
            let mut c = seen_by_both.diff(&other.dots());
            let bottom = S::default();
            for (k, theirs) in other.entries() {
                theirs.seen_elsewhere(self.get(k).unwrap_or(&bottom), ctx, &mut c);
            }
            c
        };
        let mut found = 0u64;
        let mut mine = self.take_chunked();
        for (k, theirs) in other.into_entries() {
            if let Some(child) = mine.get_mut(&k) {
                if !candidates.is_empty() {
                    child.for_each_dot(&mut |d| found += u64::from(candidates.contains(&d)));
                }
                child.join(ctx, theirs, other_ctx);
                if child.is_bottom() {
                    mine.remove(&k);
                }
            } else {
                let mut child = S::default();
                child.join(ctx, theirs, other_ctx);
                if !child.is_bottom() {
                    mine.insert(k, child);
                }
            }
        }
        self.repr = Repr::Chunked(mine);
        if found < candidates.len() {
            // Children the other side named already lost every candidate dot in their join
            // (a candidate is in the other context and not in the other store), so removing
            // the candidates from every child touches only the ones it did not name.
            self.retain(|_, child| {
                child.remove_dots(&candidates);
                !child.is_bottom()
            });
        }
    }
    fn remove_dots(&mut self, removed: &CausalContext) -> usize {
        let mut n = 0;
        self.retain(|_, child| {
            n += child.remove_dots(removed);
            !child.is_bottom()
        });
        n
    }
    fn unseen_by(&self, ctx: &CausalContext) -> Self {
        Self::from_sorted(self.entries().filter_map(|(k, c)| {
            let u = c.unseen_by(ctx);
            (!u.is_bottom()).then(|| (k.clone(), u))
        }))
    }
    fn overriding(&self, mine: &Self) -> Self {
        let mut out = DotMap::default();
        for (k, theirs) in self.entries() {
            if let Some(m) = mine.get(k) {
                out.set(k.clone(), theirs.overriding(m));
            }
        }
        out
    }
    fn seen_elsewhere(&self, mine: &Self, ctx: &CausalContext, out: &mut CausalContext) {
        let bottom = S::default();
        for (k, theirs) in self.entries() {
            theirs.seen_elsewhere(mine.get(k).unwrap_or(&bottom), ctx, out);
        }
    }
}

/// A causal CRDT: a dot store paired with the context of everything its holder has seen.
///
/// Guarantees: `join` is the causal join (`docs/design/principles.md`, "Dot stores and the causal
/// join"; a join-semilattice: commutative, associative, idempotent); for states and deltas built by
/// this crate `dots(store) ⊆ ctx` (I3).
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
// serde: hand-written in `crate::compact` (compact replica-table encoding).
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

    /// Redundancy removal (`docs/design/principles.md`, "BP and RR"): the part of `delta` that
    /// inflates `self`, so that `self ⊔ inflation == self ⊔ delta`. `None` exactly when `delta`
    /// brings nothing new (`self ⊔ delta == self`), on every input that keeps invariant I3 (all
    /// decoded values do).
    ///
    /// The store keeps the entries whose dots `self` has not seen, plus (conflicting input only)
    /// entries whose value beats ours under the same dot; the context keeps the dots `self` has
    /// not seen, the dots of that store, and the seen dots that remove something live here.
    pub fn inflation(&self, delta: &Causal<S>) -> Option<Causal<S>> {
        let mut store = delta.store.unseen_by(&self.ctx);
        let mut ctx = delta.ctx.diff(&self.ctx);
        let seen_by_both = delta.ctx.intersection(&self.ctx);
        if !seen_by_both.is_empty() {
            let overriding = delta.store.overriding(&self.store);
            if !overriding.is_bottom() {
                ctx.join(&overriding.dots());
                let none = CausalContext::new();
                store.join(&none, overriding, &none);
            }
            // What the join removes from our store: live dots the delta's context holds that
            // its store does not hold under the same key.
            let mut candidates = seen_by_both.diff(&delta.store.dots());
            delta
                .store
                .seen_elsewhere(&self.store, &self.ctx, &mut candidates);
            if !candidates.is_empty() {
                self.store.for_each_dot(&mut |d| {
                    if candidates.contains(&d) {
                        ctx.insert(d);
                    }
                });
            }
        }
        if store.is_bottom() && ctx.is_empty() {
            None
        } else {
            Some(Causal { store, ctx })
        }
    }
}

/// Serde for the dot stores (`docs/design/principles.md`, "One codec"): the same shapes the plain
/// derives wrote (newtypes over a sequence or map), but decoding accepts only canonical input, so a
/// decoded store satisfies the invariants `is_canonical` states. How each [`Dot`] inside is written
/// (in full, or as an index into the enclosing [`Causal`]'s replica table) is decided by
/// `crate::compact`.
#[cfg(feature = "serde")]
mod serde_impls {
    use super::{AdmitsChild, Dot, DotFun, DotMap, DotSet, DotStore, SmallVec};
    use serde::de::{self, Deserialize, Deserializer};
    use serde::ser::{Serialize, Serializer};

    impl Serialize for DotSet {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_newtype_struct("DotSet", self.0.as_slice())
        }
    }

    impl<'de> Deserialize<'de> for DotSet {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            #[derive(serde::Deserialize)]
            #[serde(rename = "DotSet")]
            struct Raw(Vec<Dot>);
            let set = DotSet(SmallVec::from_vec(Raw::deserialize(d)?.0));
            if set.is_canonical() {
                Ok(set)
            } else {
                Err(de::Error::custom("dot set is not strictly ascending"))
            }
        }
    }

    impl<V: Serialize> Serialize for DotFun<V> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_newtype_struct("DotFun", self.0.as_slice())
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
                Ok(DotFun(SmallVec::from_vec(entries)))
            } else {
                Err(de::Error::custom(
                    "dot fun is not strictly ascending by dot",
                ))
            }
        }
    }

    /// The entries as a serde map (what the `BTreeMap` inside wrote).
    struct AsMap<'a, K: Ord, S>(&'a DotMap<K, S>);

    impl<K: Ord + Serialize, S: Serialize> Serialize for AsMap<'_, K, S> {
        fn serialize<Ser: Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
            s.collect_map(self.0.entries())
        }
    }

    impl<K: Ord + Serialize, S: Serialize> Serialize for DotMap<K, S> {
        fn serialize<Ser: Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
            s.serialize_newtype_struct("DotMap", &AsMap(self))
        }
    }

    impl<'de, K, S> Deserialize<'de> for DotMap<K, S>
    where
        K: Ord + Clone + Deserialize<'de> + AdmitsChild<S>,
        S: DotStore + Deserialize<'de>,
    {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            /// Reads the map strictly: keys strictly ascending (no duplicate silently dropped),
            /// no bottom child and every child of a kind its key admits, i.e. exactly the
            /// canonical encoding of a `DotMap` a correct replica builds.
            #[derive(serde::Deserialize)]
            #[serde(rename = "DotMap")]
            #[serde(bound = "K: Ord + Deserialize<'de>, S: Deserialize<'de>")]
            struct Raw<K, S>(crate::strict_map::StrictMap<K, S>);
            let entries = Raw::<K, S>::deserialize(d)?.0.0;
            for (k, child) in &entries {
                if child.is_bottom() {
                    return Err(de::Error::custom("dot map holds an empty child"));
                }
                if !k.admits(child) {
                    return Err(de::Error::custom(
                        "dot map holds a child of another kind than its key",
                    ));
                }
            }
            Ok(DotMap::from_sorted(entries))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CHUNK, Chunked, DotMap, DotSet, GROUP, Repr};
    use crate::dot::{Dot, ReplicaId};

    fn dots(k: u64) -> DotSet {
        DotSet::single(Dot::new(ReplicaId(1), k + 1))
    }

    /// The chunked form of a map (`None` for a one-key map held inline).
    fn chunked<K: Ord, S>(m: &DotMap<K, S>) -> Option<&Chunked<K, S>> {
        match &m.repr {
            Repr::Chunked(c) => Some(c),
            Repr::One(..) => None,
        }
    }

    /// A map of a few keys holds one group of one chunk with every vector a few entries wide,
    /// and no vector of a large map built in scrambled order outgrows its bound (`GROUP`
    /// chunks per group, `CHUNK` entries per chunk): the memory of small sets, and of groups
    /// that split, stays what the layout doc says.
    #[test]
    fn small_maps_stay_small_and_no_vector_outgrows_its_bound() {
        let mut m: DotMap<u64, DotSet> = DotMap::default();
        m.set(5, dots(5));
        assert!(chunked(&m).is_none(), "a one-key map is held inline");
        m.set(3, dots(3));
        let c = chunked(&m).expect("two keys are chunked");
        assert_eq!(c.groups.len(), 1);
        assert!(c.seps.capacity() <= 4 && c.groups.capacity() <= 4);
        assert!(
            c.groups
                .iter()
                .all(|g| g.seps.capacity() <= 4 && g.chunks.capacity() <= 4)
        );
        let mut z = 1u64;
        for _ in 0..20_000 {
            z = z
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let k = z >> 44;
            m.set(k, dots(k));
        }
        assert!(m.layout_is_valid());
        let c = chunked(&m).expect("chunked");
        assert!(c.groups.len() > 1);
        for g in &c.groups {
            assert!(g.seps.capacity() <= GROUP && g.chunks.capacity() <= GROUP);
            for c in &g.chunks {
                assert!(c.keys.capacity() <= CHUNK && c.vals.capacity() <= CHUNK);
            }
        }
    }
}
