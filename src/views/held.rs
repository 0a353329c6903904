//! What this node knows its `distinct` cells hold under its own dot: a bounded in-memory
//! record that spares [`super::Views::admit`] the element-row read of an add it already knows
//! changes nothing (the skip of `skip_present`).
//!
//! **What an entry means.** `(cell, element)` is recorded only when the committed state held
//! `element` in `cell` under a dot of this node's replica id at some moment after the entry's
//! *mark* was taken: either an element-row read said so, or a group that added it committed
//! with every event of its batch applied. A `distinct` cell never removes locally (no view op
//! of that kind removes, and clients may not write view keys), so only these take such a dot
//! away, and each forgets what it may have taken:
//!
//! - a remote join that changed the cell (the writer tells [`Held::forget`] after its commit,
//!   whether or not it touched this node's dots);
//! - a retention purge of the cell ([`Held::forget`] once the purge committed);
//! - a re-identification (the entries are about the old id: [`Held::forget_all`]);
//! - a restart or a snapshot restore (the record lives in memory only: it starts empty).
//!
//! A record made from a read or a commit that one of these may have overtaken must not land
//! after the forgetting: every forgetting moves a generation, and [`Held::learn`] drops what it
//! is given unless no forgetting of that cell (or of everything) happened since its mark
//! ([`Held::mark`], taken before the read or the queueing of the write). An entry therefore
//! never claims what the committed state does not hold; a missing entry only costs the read.
//!
//! **Bounded.** Entries count their bytes (names plus a fixed overhead); past three quarters of
//! the budget (`limits.view_held_bytes`, 0 disables the record) whole cells are dropped, least
//! recently used first. The forgotten-cell generations take the last quarter: past it (or past
//! [`FORGOTTEN_MAX`] cells) they are replaced by one floor below which every mark is stale.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use tidemark_crdts::{Key, ReplicaId};

/// Bytes counted per cell besides its name (map slot, set header, bookkeeping).
const CELL_OVERHEAD: usize = 96;
/// Bytes counted per element besides its text (set slot, string header).
const ELEM_OVERHEAD: usize = 40;
/// Most cells whose last forgetting is remembered one by one ([`Held::learn`]).
pub(crate) const FORGOTTEN_MAX: usize = 4_096;
/// Bytes counted per forgotten cell besides its name (key, generation, map slot).
const FORGOTTEN_OVERHEAD: usize = std::mem::size_of::<Key>() + 8;

/// A generation observed before a read or a queued write ([`Held::mark`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark(u64);

/// The record (see the module documentation). Shared by the ingest path and the writer's
/// remote-change hook.
#[derive(Debug)]
pub(crate) struct Held {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The replica id the entries are about.
    me: Option<ReplicaId>,
    /// Moves on every forgetting.
    generation: u64,
    /// Marks below this are stale for every cell.
    floor: u64,
    /// Cell → the generation its last forgetting moved to (at most [`FORGOTTEN_MAX`], and at
    /// most a quarter of the budget in bytes).
    forgotten: HashMap<Key, u64, foldhash::fast::RandomState>,
    /// Bytes counted over `forgotten`.
    forgotten_bytes: usize,
    cells: HashMap<Key, Cell, foldhash::fast::RandomState>,
    /// Bytes counted over `cells`.
    bytes: usize,
    /// Use clock for least-recently-used eviction.
    clock: u64,
}

#[derive(Debug, Default)]
struct Cell {
    elems: HashSet<String, foldhash::fast::RandomState>,
    bytes: usize,
    used: u64,
}

impl Held {
    /// An empty record of at most `budget` bytes (0: records nothing, every lookup misses).
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// True when the record is in use (a positive budget).
    pub(crate) fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The generation now: take it before the read or the queueing whose outcome
    /// [`Held::learn`] is then given.
    pub(crate) fn mark(&self) -> Mark {
        Mark(self.inner.lock().map_or(u64::MAX, |i| i.generation))
    }

    /// Per `(cell, element)` of `items`, in order: whether it is recorded as held under `me`'s
    /// dot. Consecutive items of the same cell look the cell up once.
    pub(crate) fn lookup(&self, items: &[(&Key, &str)], me: ReplicaId) -> Vec<bool> {
        let mut out = vec![false; items.len()];
        if !self.enabled() {
            return out;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return out;
        };
        if inner.me != Some(me) {
            return out;
        }
        let Inner { cells, clock, .. } = &mut *inner;
        *clock += 1;
        let now = *clock;
        let mut i = 0;
        while let Some(&(key, _)) = items.get(i) {
            let mut cell = cells.get_mut(key);
            if let Some(c) = cell.as_mut() {
                c.used = now;
            }
            while let Some(&(k, elem)) = items.get(i) {
                if !std::ptr::eq(k, key) && k != key {
                    break;
                }
                out[i] = cell.as_ref().is_some_and(|c| c.elems.contains(elem));
                i += 1;
            }
        }
        out
    }

    /// Records each `(cell, element)` of `items` as held under `me`'s dot, unless some
    /// forgetting of its cell (or of everything) happened since `mark`: then that item is
    /// dropped. Evicts least recently used cells past the budget.
    pub(crate) fn learn<'a>(
        &self,
        mark: Mark,
        me: ReplicaId,
        items: impl IntoIterator<Item = (&'a Key, &'a str)>,
    ) {
        if !self.enabled() {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if mark.0 < inner.floor || mark.0 > inner.generation {
            return;
        }
        if inner.me != Some(me) {
            // Entries about another id are no use (and none may be kept under this one).
            inner.cells.clear();
            inner.bytes = 0;
            inner.me = Some(me);
        }
        inner.clock += 1;
        let now = inner.clock;
        let Inner {
            forgotten,
            cells,
            bytes,
            ..
        } = &mut *inner;
        let mut current: Option<(&Key, &mut Cell)> = None;
        for (key, elem) in items {
            if current.as_ref().is_none_or(|(k, _)| *k != key) {
                if forgotten.get(key).is_some_and(|&g| g > mark.0) {
                    current = None;
                    continue;
                }
                let cell = match cells.entry(key.clone()) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        let c = e.insert(Cell {
                            bytes: CELL_OVERHEAD + key.name.len(),
                            ..Cell::default()
                        });
                        *bytes += c.bytes;
                        c
                    }
                };
                cell.used = now;
                current = Some((key, cell));
            }
            let Some((_, cell)) = current.as_mut() else {
                continue;
            };
            if !cell.elems.contains(elem) {
                let n = ELEM_OVERHEAD + elem.len();
                cell.elems.insert(elem.to_owned());
                cell.bytes += n;
                *bytes += n;
            }
        }
        // Cells get three quarters of the budget, the forgotten list the rest.
        let cells_budget = self.budget - self.budget / 4;
        if inner.bytes > cells_budget {
            inner.evict(cells_budget - cells_budget / 4);
        }
    }

    /// Forgets what is recorded of `key` (a remote join changed it, or its rows were purged):
    /// a [`Held::learn`] with a mark taken before this drops its items of `key`.
    pub(crate) fn forget(&self, key: &Key) {
        if !self.enabled() {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        inner.generation += 1;
        let g = inner.generation;
        if let Some(c) = inner.cells.remove(key) {
            inner.bytes = inner.bytes.saturating_sub(c.bytes);
        }
        let n = key.name.len() + FORGOTTEN_OVERHEAD;
        let full =
            inner.forgotten.len() >= FORGOTTEN_MAX || inner.forgotten_bytes + n > self.budget / 4;
        if full && !inner.forgotten.contains_key(key) {
            // Too many to remember one by one: every mark taken before now is stale.
            inner.forgotten.clear();
            inner.forgotten_bytes = 0;
            inner.floor = g;
        } else if inner.forgotten.insert(key.clone(), g).is_none() {
            inner.forgotten_bytes += n;
        }
    }

    /// Forgets everything (the node re-identified): every earlier mark is stale.
    pub(crate) fn forget_all(&self) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        inner.generation += 1;
        inner.floor = inner.generation;
        inner.forgotten.clear();
        inner.forgotten_bytes = 0;
        inner.cells.clear();
        inner.bytes = 0;
        inner.me = None;
    }

    /// Bytes and cells recorded now.
    #[cfg(test)]
    pub(crate) fn size(&self) -> (usize, usize) {
        self.inner
            .lock()
            .map_or((0, 0), |i| (i.bytes, i.cells.len()))
    }
}

impl Inner {
    /// Drops least recently used cells until at most `target` bytes are counted.
    fn evict(&mut self, target: usize) {
        let mut by_use: Vec<(u64, &Key)> = self.cells.iter().map(|(k, c)| (c.used, k)).collect();
        by_use.sort_unstable_by_key(|(u, _)| *u);
        let mut drop_keys = Vec::new();
        let mut bytes = self.bytes;
        for (_, k) in by_use {
            if bytes <= target {
                break;
            }
            if let Some(c) = self.cells.get(k) {
                bytes = bytes.saturating_sub(c.bytes);
            }
            drop_keys.push(k.clone());
        }
        for k in drop_keys {
            if let Some(c) = self.cells.remove(&k) {
                self.bytes = self.bytes.saturating_sub(c.bytes);
            }
        }
    }
}

#[cfg(test)]
#[path = "held_review_tests.rs"]
mod review_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_crdts::KeyKind;

    fn key(n: &str) -> Key {
        Key::new(KeyKind::ORSet, n)
    }

    fn me() -> ReplicaId {
        ReplicaId(7)
    }

    #[test]
    fn learned_elements_are_found_and_others_are_not() {
        let h = Held::new(1 << 20);
        let (a, b) = (key("a"), key("b"));
        h.learn(h.mark(), me(), [(&a, "x"), (&a, "y"), (&b, "x")]);
        assert_eq!(
            h.lookup(&[(&a, "x"), (&a, "z"), (&b, "x"), (&b, "y")], me()),
            [true, false, true, false]
        );
        // Another replica id: nothing is known of its dots.
        assert_eq!(h.lookup(&[(&a, "x")], ReplicaId(8)), [false]);
    }

    #[test]
    fn a_forgetting_after_the_mark_voids_what_the_mark_saw() {
        let h = Held::new(1 << 20);
        let (a, b) = (key("a"), key("b"));
        let mark = h.mark();
        h.forget(&a);
        h.learn(mark, me(), [(&a, "x"), (&b, "x")]);
        // `a` was forgotten after the mark; `b` was not.
        assert_eq!(h.lookup(&[(&a, "x"), (&b, "x")], me()), [false, true]);
        // A mark taken after the forgetting is good.
        h.learn(h.mark(), me(), [(&a, "x")]);
        assert_eq!(h.lookup(&[(&a, "x")], me()), [true]);
        // Forgetting drops what was recorded.
        h.forget(&b);
        assert_eq!(h.lookup(&[(&b, "x")], me()), [false]);
    }

    #[test]
    fn forgetting_everything_voids_every_earlier_mark() {
        let h = Held::new(1 << 20);
        let a = key("a");
        h.learn(h.mark(), me(), [(&a, "x")]);
        let mark = h.mark();
        h.forget_all();
        assert_eq!(h.lookup(&[(&a, "x")], me()), [false]);
        h.learn(mark, me(), [(&a, "y")]);
        assert_eq!(h.lookup(&[(&a, "y")], me()), [false]);
    }

    #[test]
    fn too_many_forgotten_cells_raise_the_floor() {
        let h = Held::new(1 << 20);
        let a = key("a");
        let mark = h.mark();
        for i in 0..=FORGOTTEN_MAX {
            h.forget(&key(&format!("k{i}")));
        }
        // `a` itself was never forgotten, but the record no longer knows that one by one.
        h.learn(mark, me(), [(&a, "x")]);
        assert_eq!(h.lookup(&[(&a, "x")], me()), [false]);
        h.learn(h.mark(), me(), [(&a, "x")]);
        assert_eq!(h.lookup(&[(&a, "x")], me()), [true]);
    }

    #[test]
    fn the_budget_bounds_the_record_and_drops_least_recently_used_cells() {
        let h = Held::new(2_000);
        let keys: Vec<Key> = (0..50).map(|i| key(&format!("cell{i}"))).collect();
        for k in &keys {
            let elems: Vec<String> = (0..5).map(|e| format!("e{e}")).collect();
            h.learn(h.mark(), me(), elems.iter().map(|e| (k, e.as_str())));
            // The first cell stays in use.
            assert_eq!(h.lookup(&[(&keys[0], "e0")], me()), [true]);
            assert!(h.size().0 <= 2_000, "{:?}", h.size());
        }
        let (_, cells) = h.size();
        assert!(cells > 1 && cells < 50, "{cells}");
        // The most recent cell is kept, an early unused one dropped.
        assert_eq!(
            h.lookup(&[(&keys[49], "e4"), (&keys[1], "e0")], me()),
            [true, false]
        );
        // A cell larger than the whole budget is not kept.
        let big = key("big");
        let elems: Vec<String> = (0..200).map(|e| format!("element{e}")).collect();
        h.learn(h.mark(), me(), elems.iter().map(|e| (&big, e.as_str())));
        assert!(h.size().0 <= 2_000);
    }

    #[test]
    fn a_record_without_budget_records_nothing() {
        let h = Held::new(0);
        let a = key("a");
        h.learn(h.mark(), me(), [(&a, "x")]);
        assert_eq!(h.lookup(&[(&a, "x")], me()), [false]);
        assert_eq!(h.size(), (0, 0));
    }
}
