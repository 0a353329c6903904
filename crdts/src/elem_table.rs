//! The element table of an [`crate::ORSet`]: a hash map kept as two dense vectors (keys and
//! children, in no particular order) under a flat open-addressing index.
//!
//! Why not an ordered map: an add of an element in random order into an ordered map must read
//! the keys around its place (cache lines it does not have once the set outgrows the cache) and
//! move the keys after it; here an add of a new element reads one index slot (8 bytes, eight to a
//! cache line) and appends to the two vectors (lines the previous add already touched), and an
//! add of a present element or a remove reads its key and child besides.
//!
//! Layout and invariants (checked by [`ElemTable::is_valid`]):
//! * `keys[p]` and `vals[p]` are entry `p`; `keys.len() == vals.len()`, keys pairwise distinct.
//! * `index` is empty (no entry) or has a power-of-two length `cap ≥ 8`, at most 7/8 of its
//!   slots used, so a probe always ends on an empty slot. A used slot holds
//!   `frag << 32 | (p + 1)`: `frag` the high 32 bits of the key's hash, `p` the entry. A slot
//!   of 0 is empty.
//! * Linear probing from the home slot `frag >> (32 - log2 cap)`; every entry has exactly one
//!   slot, reachable from its home without crossing an empty slot. Deletion shifts the later
//!   slots of the cluster back (no tombstones), so a lookup never walks over dead slots.
//!
//! Hashing is deterministic (foldhash's fast hasher with a fixed seed): the crate uses no
//! randomness. Iteration order is that of the vectors, which depends on the operations' order;
//! [`crate::ORSet`] sorts wherever order is observable (elements, encoding, hashing, debug).

use core::hash::{BuildHasher, Hash};

/// The hasher: fixed seed, so a table is a pure function of the operations applied to it.
const HASHER: foldhash::fast::FixedState = foldhash::fast::FixedState::with_seed(0x7d3c_a915);

/// Smallest index length (a table of one entry has 8 slots: 64 bytes).
const MIN_SLOTS: usize = 8;

/// The high 32 bits of `key`'s hash.
#[inline]
fn frag_of<K: Hash>(key: &K) -> u32 {
    (HASHER.hash_one(key) >> 32) as u32
}

/// A hash map of distinct keys to children, dense vectors under an open-addressing index (see
/// the module doc).
pub(crate) struct ElemTable<K, V> {
    keys: Vec<K>,
    vals: Vec<V>,
    index: Vec<u64>,
}

/// A clone keeps the vectors' capacity, as it keeps the index's size: a copy of a table grows
/// as the table would (a `Vec` clone would have no room left, so the first insert into a copy
/// would move every entry).
impl<K: Clone, V: Clone> Clone for ElemTable<K, V> {
    fn clone(&self) -> Self {
        let mut keys = Vec::with_capacity(self.keys.capacity());
        keys.extend_from_slice(&self.keys);
        let mut vals = Vec::with_capacity(self.vals.capacity());
        vals.extend_from_slice(&self.vals);
        Self {
            keys,
            vals,
            index: self.index.clone(),
        }
    }
}

impl<K, V> Default for ElemTable<K, V> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            vals: Vec::new(),
            index: Vec::new(),
        }
    }
}

/// Where a probe for a key ended.
enum Probe {
    /// The key's entry, and the slot naming it.
    Found { pos: usize, slot: usize },
    /// The empty slot where the key would go.
    Vacant { slot: usize },
}

impl<K: Hash + Eq, V> ElemTable<K, V> {
    /// Number of entries.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when there is no entry.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// `log2` of the index length (the index is not empty).
    #[inline]
    fn bits(&self) -> u32 {
        self.index.len().trailing_zeros()
    }

    /// The home slot of a fragment in the current index (not empty).
    #[inline]
    fn home(&self, frag: u32) -> usize {
        // `bits ≤ 32` (at most 2^32 slots), so the shift is in range.
        (u64::from(frag) >> (32 - self.bits())) as usize
    }

    /// Probes for `key` (whose fragment is `frag`); the index must not be empty.
    #[inline]
    fn probe(&self, key: &K, frag: u32) -> Probe {
        let mask = self.index.len() - 1;
        let mut slot = self.home(frag);
        loop {
            let s = self.index[slot];
            if s == 0 {
                return Probe::Vacant { slot };
            }
            if (s >> 32) as u32 == frag {
                let pos = (s as u32 as usize) - 1;
                if self.keys[pos] == *key {
                    return Probe::Found { pos, slot };
                }
            }
            slot = (slot + 1) & mask;
        }
    }

    /// The entry position of `key`.
    #[inline]
    fn position(&self, key: &K) -> Option<usize> {
        if self.keys.is_empty() {
            return None;
        }
        match self.probe(key, frag_of(key)) {
            Probe::Found { pos, .. } => Some(pos),
            Probe::Vacant { .. } => None,
        }
    }

    /// The child under `key`.
    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.position(key).map(|p| &self.vals[p])
    }

    /// The child under `key`, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.position(key).map(|p| &mut self.vals[p])
    }

    /// Index length for `n` entries: the smallest power of two `≥ MIN_SLOTS` holding them at
    /// a load of at most 7/8.
    fn slots_for(n: usize) -> usize {
        let mut cap = MIN_SLOTS;
        while n > cap - cap / 8 {
            cap *= 2;
        }
        cap
    }

    /// Makes room in the index for `additional` more entries without a rebuild, and in the
    /// vectors for them.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let want = self.keys.len().saturating_add(additional);
        self.keys.reserve(additional);
        self.vals.reserve(additional);
        if want > 0 && want > self.index.len() - self.index.len() / 8 {
            self.rebuild(Self::slots_for(want));
        }
    }

    /// Rebuilds the index at `slots` slots (a power of two `≥ MIN_SLOTS` holding every entry at
    /// a load of at most 7/8) from the fragments in the old one (no key is hashed again).
    fn rebuild(&mut self, slots: usize) {
        let old = core::mem::replace(&mut self.index, vec![0; slots]);
        let mask = slots - 1;
        let shift = 32 - slots.trailing_zeros();
        // Old slots in index order: entries of one home stay in probe order.
        for s in old.into_iter().filter(|s| *s != 0) {
            let mut slot = ((s >> 32) >> shift) as usize;
            while self.index[slot] != 0 {
                slot = (slot + 1) & mask;
            }
            self.index[slot] = s;
        }
    }

    /// The slot value naming entry `pos` under fragment `frag`.
    #[inline]
    fn slot_value(frag: u32, pos: usize) -> u64 {
        // Entries are fewer than 2^32 - 1: the index (at most 2^32 slots, 7/8 used) bounds
        // them, and so does memory long before.
        (u64::from(frag) << 32) | (pos as u64 + 1)
    }

    /// Sets the child under `key`, returning the previous one.
    #[inline]
    pub(crate) fn insert(&mut self, key: K, val: V) -> Option<V> {
        let n = self.keys.len();
        if n + 1 > self.index.len() - self.index.len() / 8 {
            self.rebuild(Self::slots_for(n + 1).max(self.index.len() * 2));
        }
        let frag = frag_of(&key);
        match self.probe(&key, frag) {
            Probe::Found { pos, .. } => Some(core::mem::replace(&mut self.vals[pos], val)),
            Probe::Vacant { slot } => {
                self.index[slot] = Self::slot_value(frag, n);
                self.keys.push(key);
                self.vals.push(val);
                None
            }
        }
    }

    /// Empties `slot` and shifts the rest of its cluster back (backward-shift deletion).
    fn delete_slot(&mut self, mut hole: usize) {
        let mask = self.index.len() - 1;
        let mut next = hole;
        loop {
            next = (next + 1) & mask;
            let s = self.index[next];
            if s == 0 {
                break;
            }
            let home = self.home((s >> 32) as u32);
            // `s` may fill the hole when the hole lies on its probe path: its distance from
            // home is at least the distance from the hole.
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.index[hole] = s;
                hole = next;
            }
        }
        self.index[hole] = 0;
    }

    /// Removes and returns the child under `key`. The last entry moves into its place.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        if self.keys.is_empty() {
            return None;
        }
        let Probe::Found { pos, slot } = self.probe(key, frag_of(key)) else {
            return None;
        };
        self.delete_slot(slot);
        let last = self.keys.len() - 1;
        if pos != last {
            // Repoint the last entry's slot to `pos`, where `swap_remove` moves it.
            let frag = frag_of(&self.keys[last]);
            let old = Self::slot_value(frag, last);
            let mask = self.index.len() - 1;
            let mut s = self.home(frag);
            while self.index[s] != old && self.index[s] != 0 {
                s = (s + 1) & mask;
            }
            if self.index[s] == old {
                self.index[s] = Self::slot_value(frag, pos);
            }
        }
        self.keys.swap_remove(pos);
        let child = self.vals.swap_remove(pos);
        self.shrink();
        Some(child)
    }

    /// Gives memory back once at most a quarter of it is used.
    fn shrink(&mut self) {
        let n = self.keys.len();
        if n == 0 {
            *self = Self::default();
            return;
        }
        if self.index.len() > MIN_SLOTS && n * 4 <= self.index.len() - self.index.len() / 8 {
            self.rebuild(Self::slots_for(n * 2));
        }
        if self.keys.capacity() > 8 && n * 4 <= self.keys.capacity() {
            self.keys.shrink_to(n * 2);
            self.vals.shrink_to(n * 2);
        }
    }

    /// Entries in table order (not sorted).
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = (&K, &V)> {
        self.keys.iter().zip(&self.vals)
    }

    /// Keys in table order (not sorted).
    pub(crate) fn keys(&self) -> impl ExactSizeIterator<Item = &K> {
        self.keys.iter()
    }

    /// Entries by value, in table order.
    pub(crate) fn into_entries(self) -> impl ExactSizeIterator<Item = (K, V)> {
        self.keys.into_iter().zip(self.vals)
    }

    /// Entries ascending by key.
    pub(crate) fn sorted(&self) -> Vec<(&K, &V)>
    where
        K: Ord,
    {
        let mut v: Vec<(&K, &V)> = self.iter().collect();
        v.sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// Keeps the entries for which `keep` returns true (it may change the child), then rebuilds
    /// the index if any went.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let n = self.keys.len();
        let mut kept = 0;
        for i in 0..n {
            if keep(&self.keys[i], &mut self.vals[i]) {
                if kept != i {
                    self.keys.swap(kept, i);
                    self.vals.swap(kept, i);
                }
                kept += 1;
            }
        }
        if kept == n {
            return;
        }
        self.keys.truncate(kept);
        self.vals.truncate(kept);
        if kept == 0 {
            *self = Self::default();
            return;
        }
        self.index = vec![0; Self::slots_for(kept)];
        let mask = self.index.len() - 1;
        for (pos, key) in self.keys.iter().enumerate() {
            let frag = frag_of(key);
            let mut slot = self.home(frag);
            while self.index[slot] != 0 {
                slot = (slot + 1) & mask;
            }
            self.index[slot] = Self::slot_value(frag, pos);
        }
        self.shrink();
    }

    /// True when the layout invariants of the module doc hold (property tests check this).
    pub(crate) fn is_valid(&self) -> bool {
        let n = self.keys.len();
        if self.vals.len() != n {
            return false;
        }
        if n == 0 {
            return true;
        }
        let cap = self.index.len();
        if !cap.is_power_of_two() || cap < MIN_SLOTS || n > cap - cap / 8 {
            return false;
        }
        let mask = cap - 1;
        let mut named = vec![false; n];
        let mut used = 0;
        for (slot, s) in self.index.iter().enumerate() {
            if *s == 0 {
                continue;
            }
            used += 1;
            let pos = (*s as u32 as usize).wrapping_sub(1);
            let frag = (*s >> 32) as u32;
            if pos >= n || named[pos] || frag_of(&self.keys[pos]) != frag {
                return false;
            }
            named[pos] = true;
            // No empty slot between the home and the slot.
            let mut i = self.home(frag);
            while i != slot {
                if self.index[i] == 0 {
                    return false;
                }
                i = (i + 1) & mask;
            }
        }
        used == n
    }
}

#[cfg(test)]
mod tests {
    use super::ElemTable;
    use core::hash::{Hash, Hasher};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A key whose hash takes only 3 values: long clusters, wrap-around at the index end and
    /// backward shifts across homes.
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
    struct Weak(u16);

    impl Hash for Weak {
        fn hash<H: Hasher>(&self, h: &mut H) {
            h.write_u16(self.0 % 3);
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Get(u16),
        Retain(u16),
        Reserve(u8),
    }

    fn ops(range: u16) -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                6 => (0..range, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
                4 => (0..range).prop_map(Op::Remove),
                2 => (0..range).prop_map(Op::Get),
                1 => (2..9u16).prop_map(Op::Retain),
                1 => any::<u8>().prop_map(Op::Reserve),
            ],
            0..400,
        )
    }

    /// Runs `ops` on a table and a `BTreeMap` model with keys `key(k)`; after every op the
    /// layout is valid and the table holds exactly the model's entries.
    fn run<K: Hash + Eq + Ord + Clone + core::fmt::Debug>(
        ops: &[Op],
        key: impl Fn(u16) -> K,
    ) -> Result<(), TestCaseError> {
        let mut t: ElemTable<K, u32> = ElemTable::default();
        let mut m: BTreeMap<K, u32> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => {
                    prop_assert_eq!(t.insert(key(*k), *v), m.insert(key(*k), *v));
                }
                Op::Remove(k) => prop_assert_eq!(t.remove(&key(*k)), m.remove(&key(*k))),
                Op::Get(k) => {
                    prop_assert_eq!(t.get(&key(*k)), m.get(&key(*k)));
                    if let Some(v) = t.get_mut(&key(*k)) {
                        *v = v.wrapping_add(1);
                    }
                    if let Some(v) = m.get_mut(&key(*k)) {
                        *v = v.wrapping_add(1);
                    }
                }
                Op::Retain(d) => {
                    t.retain(|_, v| {
                        *v = v.wrapping_mul(3);
                        *v % u32::from(*d) != 0
                    });
                    m.retain(|_, v| {
                        *v = v.wrapping_mul(3);
                        *v % u32::from(*d) != 0
                    });
                }
                Op::Reserve(n) => t.reserve(usize::from(*n)),
            }
            prop_assert!(t.is_valid(), "layout broken after {op:?}");
            prop_assert_eq!(t.len(), m.len());
            prop_assert_eq!(t.is_empty(), m.is_empty());
            let sorted: Vec<(K, u32)> = t
                .sorted()
                .into_iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            let model: Vec<(K, u32)> = m.iter().map(|(k, v)| (k.clone(), *v)).collect();
            prop_assert_eq!(sorted, model);
        }
        let entries: BTreeMap<K, u32> = t.clone().into_entries().collect();
        prop_assert_eq!(entries, m);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Few distinct keys: replacements, removes of present keys, shrinking to empty.
        #[test]
        fn table_matches_a_btreemap_small_keyspace(ops in ops(24)) {
            run(&ops, u64::from)?;
        }

        /// Many distinct keys: growth through several index sizes and shrinking.
        #[test]
        fn table_matches_a_btreemap_large_keyspace(ops in ops(2_000)) {
            run(&ops, u64::from)?;
        }

        /// Colliding hashes: every probe walks a long cluster; deletions shift across homes.
        #[test]
        fn table_matches_a_btreemap_colliding_hashes(ops in ops(300)) {
            run(&ops, Weak)?;
        }

        /// String keys (hashed through `write` of their bytes).
        #[test]
        fn table_matches_a_btreemap_string_keys(ops in ops(200)) {
            run(&ops, |k| format!("e{k}"))?;
        }
    }

    /// Growth to 100k entries and back down by removes keeps the layout and shrinks the index.
    #[test]
    fn grows_and_shrinks() {
        let mut t: ElemTable<u64, u64> = ElemTable::default();
        let mut z = 7u64;
        let mut keys = Vec::new();
        for _ in 0..100_000 {
            z = z
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            keys.push(z >> 20);
            t.insert(z >> 20, z);
        }
        assert!(t.is_valid());
        let n = t.len();
        assert!(t.index.len() <= 2 * ElemTable::<u64, u64>::slots_for(n));
        for k in &keys[..keys.len() - 10] {
            t.remove(k);
        }
        assert!(t.is_valid());
        assert!(t.len() <= 10 && t.index.len() <= 64, "{}", t.index.len());
        for k in &keys {
            t.remove(k);
        }
        assert!(t.is_empty() && t.index.is_empty() && t.keys.capacity() == 0);
    }
}
