//! The in-memory overlay of the state tables (step 4 of the storage engine, design in
//! `docs/design/write-path.md`, "Step 4, as it will be built"): immutable [`Layer`]s of `rows`/`elems`/`dots` puts and deletions,
//! published as one immutable list ([`Layers`]) that readers merge over redb ([`Merged`]) and
//! a checkpointer folds into redb, oldest first.
//!
//! Every put in a layer is a blind write of the whole value (as the redo log's is), so reading
//! a list over a redb that already holds some of its layers gives the same answers as over one
//! that does not: a list and a read transaction begun after a checkpoint of that list's oldest
//! layers are a consistent pair.
//!
//! Nothing in the write path publishes layers yet; [`Published`] documents where the wiring's
//! generation check goes.
#![cfg_attr(
    not(test),
    allow(dead_code, reason = "step 4: wired into the write path in a later change")
)]

use super::error::StoreError;
use super::kv::{Bytes, KvIter, KvRead, bounds_empty};
use crate::codec::wal::RedoTable;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::{Arc, Mutex, PoisonError};

/// The state tables the overlay holds: the only ones a local commit group writes per key.
/// (A subset of [`RedoTable`], which also names tables the overlay never holds.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum StateTable {
    /// `rows`.
    Rows,
    /// `elems`.
    Elems,
    /// `dots`.
    Dots,
}

impl StateTable {
    /// Every state table, in index order.
    pub(crate) const ALL: [StateTable; 3] = [Self::Rows, Self::Elems, Self::Dots];

    /// The table's position in [`Self::ALL`] (the index of its entries in a [`Layer`]).
    pub(crate) fn index(self) -> usize {
        match self {
            Self::Rows => 0,
            Self::Elems => 1,
            Self::Dots => 2,
        }
    }

    /// The redo log's name for the table.
    pub(crate) fn redo(self) -> RedoTable {
        match self {
            Self::Rows => RedoTable::Rows,
            Self::Elems => RedoTable::Elems,
            Self::Dots => RedoTable::Dots,
        }
    }

    /// The state table a redo record names, or `None` for a table the overlay does not hold.
    pub(crate) fn from_redo(t: RedoTable) -> Option<StateTable> {
        match t {
            RedoTable::Rows => Some(Self::Rows),
            RedoTable::Elems => Some(Self::Elems),
            RedoTable::Dots => Some(Self::Dots),
            _ => None,
        }
    }
}

/// One key's write in a layer: the key and its new value, `None` for a deletion.
pub(crate) type Entry = (Arc<[u8]>, Option<Arc<[u8]>>);

/// What [`Layer::bytes`] counts per entry on top of its key and value: the entry itself
/// (two fat pointers) and the two `Arc` headers (strong and weak counts).
pub(crate) const ENTRY_OVERHEAD: usize = 64;

/// The writes of one commit group (or of several merged ones), immutable: per state table, a
/// vector sorted by key with each key once, its value or a deletion.
#[derive(Debug, Default)]
pub(crate) struct Layer {
    /// Per table (by [`StateTable::index`]), the entries in ascending key order, keys unique.
    tables: [Vec<Entry>; 3],
    /// Entries over all tables.
    entries: usize,
    /// Keys + values + [`ENTRY_OVERHEAD`] per entry, over all tables.
    bytes: usize,
}

impl Layer {
    /// The layer of `writes` given in any order, `None` values being deletions; of several
    /// writes of one `(table, key)` the last one given wins.
    pub(crate) fn build(
        writes: impl IntoIterator<Item = (StateTable, Arc<[u8]>, Option<Arc<[u8]>>)>,
    ) -> Layer {
        let mut tables: [Vec<Entry>; 3] = Default::default();
        for (t, key, value) in writes {
            if let Some(v) = tables.get_mut(t.index()) {
                v.push((key, value));
            }
        }
        for v in &mut tables {
            // Stable: writes of one key stay in the order given, so keeping each run's last
            // write keeps the last one given.
            v.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out: Vec<Entry> = Vec::with_capacity(v.len());
            for e in v.drain(..) {
                match out.last_mut() {
                    Some(last) if last.0 == e.0 => *last = e,
                    _ => out.push(e),
                }
            }
            *v = out;
        }
        Layer::from_sorted(tables)
    }

    /// The layer of per-table entries already sorted by key with unique keys (sizes counted
    /// here).
    fn from_sorted(tables: [Vec<Entry>; 3]) -> Layer {
        let entries = tables.iter().map(Vec::len).sum();
        let bytes = tables
            .iter()
            .flatten()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()) + ENTRY_OVERHEAD)
            .sum();
        Layer {
            tables,
            entries,
            bytes,
        }
    }

    /// The entries of `t`, ascending by key, each key once.
    pub(crate) fn table(&self, t: StateTable) -> &[Entry] {
        self.tables.get(t.index()).map_or(&[], Vec::as_slice)
    }

    /// The number of entries over all tables.
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    /// True when the layer writes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The layer's size for the overlay's memory bound: keys, values and [`ENTRY_OVERHEAD`]
    /// per entry (bytes shared with another layer through an `Arc` are counted in both).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// `key`'s entry in `t`, by binary search.
    fn find(&self, t: StateTable, key: &[u8]) -> Option<&Entry> {
        let entries = self.table(t);
        entries
            .binary_search_by(|e| (*e.0).cmp(key))
            .ok()
            .and_then(|i| entries.get(i))
    }
}

/// One layer merged over `layers` (ordered oldest first): per table every key any of them
/// writes, with the newest layer's write (deletions kept: they must still hide older data).
fn merge_layers(layers: &[Arc<Layer>]) -> Layer {
    let tables = StateTable::ALL.map(|t| {
        MergeIter::new(layers, t, Bound::Unbounded, Bound::Unbounded)
            .cloned()
            .collect()
    });
    Layer::from_sorted(tables)
}

/// The answer of the overlay alone for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup<'a> {
    /// The newest layer writing the key puts this value.
    Put(&'a [u8]),
    /// The newest layer writing the key deletes it (whatever redb holds is hidden).
    Deleted,
    /// No layer writes the key: redb answers.
    Absent,
}

/// The published overlay: an immutable list of layers, oldest first, and the generation of
/// redb it lies over. Cloning is cheap (an `Arc`); every change gives a new list.
#[derive(Clone, Debug, Default)]
pub(crate) struct Layers {
    /// The layers, oldest first.
    list: Arc<[Arc<Layer>]>,
    /// How many of the oldest layers a checkpoint is folding into redb: [`Layers::push`]
    /// never merges into them, so they can be dropped exactly once the checkpoint commits.
    frozen: usize,
    /// The redb `meta/overlay_gen` these layers lie over (see [`Published`]).
    generation: u64,
}

impl Layers {
    /// No layers, over redb generation `generation`.
    pub(crate) fn new(generation: u64) -> Layers {
        Layers {
            list: Arc::from(Vec::new()),
            frozen: 0,
            generation,
        }
    }

    /// The list with `layer` appended as the newest. Then, while the newest layer holds at
    /// least half as many entries as the one before it (and that one is not frozen), the two
    /// are merged into one, the newer winning a key: after every push each layer holds less
    /// than half the entries of the one before it (frozen layers aside), so the list holds
    /// O(log n) layers for n entries. An empty layer changes nothing.
    pub(crate) fn push(&self, layer: Arc<Layer>) -> Layers {
        if layer.is_empty() {
            return self.clone();
        }
        let mut list: Vec<Arc<Layer>> = self.list.to_vec();
        list.push(layer);
        while list.len() >= self.frozen + 2 {
            let [.., older, newer] = list.as_slice() else {
                break;
            };
            if newer.entries().saturating_mul(2) < older.entries() {
                break;
            }
            let merged = merge_layers(&[Arc::clone(older), Arc::clone(newer)]);
            list.truncate(list.len() - 2);
            list.push(Arc::new(merged));
        }
        Layers {
            list: Arc::from(list),
            frozen: self.frozen,
            generation: self.generation,
        }
    }

    /// The overlay's answer for `key` in `t`: the newest layer's write of it, by one binary
    /// search per layer, newest first.
    pub(crate) fn get(&self, t: StateTable, key: &[u8]) -> Lookup<'_> {
        for layer in self.list.iter().rev() {
            if let Some((_, value)) = layer.find(t, key) {
                return match value {
                    Some(v) => Lookup::Put(v),
                    None => Lookup::Deleted,
                };
            }
        }
        Lookup::Absent
    }

    /// Every key of `t` between `lo` and `hi` that any layer writes, ascending, each once with
    /// its newest layer's write (`None`: a deletion, yielded so a caller can hide redb's key).
    pub(crate) fn range<'a>(
        &'a self,
        t: StateTable,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> LayerRange<'a> {
        LayerRange(MergeIter::new(&self.list, t, lo, hi))
    }

    /// The layers, oldest first.
    pub(crate) fn layers(&self) -> &[Arc<Layer>] {
        &self.list
    }

    /// The number of layers.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// True when there is no layer.
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The sum of the layers' [`Layer::bytes`] (the overlay's memory bound counts this).
    pub(crate) fn bytes(&self) -> usize {
        self.list.iter().map(|l| l.bytes()).sum()
    }

    /// The redb generation these layers lie over.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// How many of the oldest layers a checkpoint is folding (never merged into by a push).
    pub(crate) fn frozen(&self) -> usize {
        self.frozen
    }

    /// The same list with its `k` oldest layers (at most all) frozen for a checkpoint.
    pub(crate) fn freeze_oldest(&self, k: usize) -> Layers {
        Layers {
            list: Arc::clone(&self.list),
            frozen: k.min(self.list.len()),
            generation: self.generation,
        }
    }

    /// The `k` oldest layers (at most all), oldest first, and the list of the rest (same
    /// generation; frozen count reduced by the layers taken).
    pub(crate) fn split_off(&self, k: usize) -> (Vec<Arc<Layer>>, Layers) {
        let k = k.min(self.list.len());
        let (old, rest) = self.list.split_at(k);
        (
            old.to_vec(),
            Layers {
                list: Arc::from(rest),
                frozen: self.frozen.saturating_sub(k),
                generation: self.generation,
            },
        )
    }

    /// The `k` oldest layers (at most all) folded into one, per table key-sorted with each key
    /// once and its newest write (deletions kept, to delete redb's key) — what a checkpoint
    /// writes into redb in one sorted pass — and the list of the rest (as [`Self::split_off`]).
    pub(crate) fn drain_oldest(&self, k: usize) -> (Layer, Layers) {
        let (old, rest) = self.split_off(k);
        (merge_layers(&old), rest)
    }
}

/// The iterator of [`Layers::range`]: `(key, value)` ascending, each key once with its newest
/// layer's write (`None`: a deletion).
pub(crate) struct LayerRange<'a>(MergeIter<'a>);

impl<'a> Iterator for LayerRange<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(k, v)| (&**k, v.as_deref()))
    }
}

/// A merge of several layers' entries of one table within bounds, ascending, each key once
/// with the newest layer's entry. Linear in the number of layers per step (they are few).
struct MergeIter<'a> {
    /// Per layer, oldest first, its entries not yet passed.
    heads: Vec<&'a [Entry]>,
}

impl<'a> MergeIter<'a> {
    /// The merge of `layers` (oldest first) over table `t` within `lo`..`hi`.
    fn new(layers: &'a [Arc<Layer>], t: StateTable, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Self {
        if bounds_empty(lo, hi) {
            return MergeIter { heads: Vec::new() };
        }
        let heads = layers
            .iter()
            .map(|layer| {
                let entries = layer.table(t);
                let start = match lo {
                    Bound::Included(a) => entries.partition_point(|e| *e.0 < *a),
                    Bound::Excluded(a) => entries.partition_point(|e| *e.0 <= *a),
                    Bound::Unbounded => 0,
                };
                let end = match hi {
                    Bound::Included(b) => entries.partition_point(|e| *e.0 <= *b),
                    Bound::Excluded(b) => entries.partition_point(|e| *e.0 < *b),
                    Bound::Unbounded => entries.len(),
                };
                entries.get(start..end).unwrap_or(&[])
            })
            .filter(|s| !s.is_empty())
            .collect();
        MergeIter { heads }
    }
}

impl<'a> Iterator for MergeIter<'a> {
    type Item = &'a Entry;

    fn next(&mut self) -> Option<&'a Entry> {
        let mut best: Option<&'a Entry> = None;
        for &head in &self.heads {
            if let Some(e) = head.first() {
                // `<=`: on equal keys the later (newer) layer wins.
                if best.is_none_or(|b| e.0 <= b.0) {
                    best = Some(e);
                }
            }
        }
        let best = best?;
        for head in &mut self.heads {
            if let Some((first, rest)) = head.split_first()
                && first.0 == best.0
            {
                *head = rest;
            }
        }
        self.heads.retain(|h| !h.is_empty());
        Some(best)
    }
}

/// One state table as a reader sees it: `layers` merged over `base` (redb's table of the
/// reader's transaction). The newest layer writing a key answers for it; a deletion hides
/// the base's key; keys no layer writes come from the base.
pub(crate) struct Merged<'a, B: KvRead> {
    /// The overlay.
    pub(crate) layers: &'a Layers,
    /// The table read.
    pub(crate) table: StateTable,
    /// redb's table under the overlay.
    pub(crate) base: &'a B,
}

impl<B: KvRead> KvRead for Merged<'_, B> {
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Bytes<'_>>, StoreError> {
        match self.layers.get(self.table, key) {
            Lookup::Put(v) => Ok(Some(Bytes::Slice(v))),
            Lookup::Deleted => Ok(None),
            Lookup::Absent => self.base.get_bytes(key),
        }
    }

    fn range_bytes<'s>(
        &'s self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> Result<KvIter<'s>, StoreError> {
        let base = self.base.range_bytes(lo, hi)?;
        Ok(Box::new(MergedIter {
            layers: self.layers.range(self.table, lo, hi).peekable(),
            base: base.peekable(),
            failed: false,
        }))
    }
}

/// The two-way merge behind [`Merged::range_bytes`]: the layers' merged range against the
/// base's, ascending; on equal keys the layer's entry wins; deletions are not yielded.
struct MergedIter<'a> {
    /// The layers' merged range (deletions included).
    layers: Peekable<LayerRange<'a>>,
    /// The base's range.
    base: Peekable<KvIter<'a>>,
    /// Set after the base reported an error: the iteration ends there.
    failed: bool,
}

impl<'a> Iterator for MergedIter<'a> {
    type Item = Result<(Bytes<'a>, Bytes<'a>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            // Which source the next key comes from: the layers (`take_base`: whether the
            // base's equal key is passed with it) or the base alone.
            let from_layers = match (self.layers.peek(), self.base.peek()) {
                (None, None) => return None,
                (Some(_), None) => Some(false),
                (None, Some(_)) | (_, Some(Err(_))) => None,
                (Some((lk, _)), Some(Ok((bk, _)))) => match (*lk).cmp(&**bk) {
                    std::cmp::Ordering::Less => Some(false),
                    std::cmp::Ordering::Equal => Some(true),
                    std::cmp::Ordering::Greater => None,
                },
            };
            match from_layers {
                Some(take_base) => {
                    if take_base {
                        self.base.next();
                    }
                    if let Some((k, Some(v))) = self.layers.next() {
                        return Some(Ok((Bytes::Slice(k), Bytes::Slice(v))));
                    }
                    // A deletion: hides the base's key (passed above), yields nothing.
                }
                None => {
                    let item = self.base.next()?;
                    if item.is_err() {
                        self.failed = true;
                    }
                    return Some(item);
                }
            }
        }
    }
}

/// The shared handle on the published [`Layers`]: readers take a snapshot (an `Arc`, under a
/// short lock), the writer publishes, a checkpointer freezes and retires the oldest layers,
/// and a write transaction that folds the whole overlay clears it to a new generation.
///
/// Wiring (a later change) adds the generation check of the design here: a reader pairs
/// [`Published::snapshot`] with a redb read transaction begun under the same lock, and retries
/// when that transaction's `meta/overlay_gen` is newer than the snapshot's
/// [`Layers::generation`] (old layers over a redb that may hold newer writes of their keys).
/// A checkpoint must also have committed (or been abandoned) before a transaction folds the
/// whole overlay: written after it, a checkpoint's older values would overwrite newer ones.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// The current list.
    current: Mutex<Arc<Layers>>,
}

impl Published {
    /// No layers, over redb generation `generation`.
    pub(crate) fn new(generation: u64) -> Published {
        Published {
            current: Mutex::new(Arc::new(Layers::new(generation))),
        }
    }

    /// The lock on the current list. A panic while it was held cannot leave it half-changed
    /// (it is only ever replaced whole), so a poisoned lock is used as is.
    fn lock(&self) -> std::sync::MutexGuard<'_, Arc<Layers>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current list (it never changes: later changes publish new lists).
    pub(crate) fn snapshot(&self) -> Arc<Layers> {
        Arc::clone(&self.lock())
    }

    /// Appends `layer` as the newest (merging as [`Layers::push`]) and returns the new list.
    /// The merge runs outside the lock (readers keep taking snapshots meanwhile); it is redone
    /// if the list changed in between (a checkpoint retired or the overlay was cleared).
    pub(crate) fn publish(&self, layer: Layer) -> Arc<Layers> {
        let layer = Arc::new(layer);
        loop {
            let base = self.snapshot();
            let next = Arc::new(base.push(Arc::clone(&layer)));
            let mut current = self.lock();
            if Arc::ptr_eq(&current, &base) {
                *current = Arc::clone(&next);
                return next;
            }
        }
    }

    /// Starts a checkpoint of the `k` oldest layers (at most all): freezes them so no push
    /// merges into them and returns the list, whose [`Layers::drain_oldest`]`(k)` is what to
    /// write into redb. `None` when another checkpoint is in progress or there is no layer.
    pub(crate) fn freeze_oldest(&self, k: usize) -> Option<Arc<Layers>> {
        let mut current = self.lock();
        if current.frozen() > 0 || current.is_empty() || k == 0 {
            return None;
        }
        let next = Arc::new(current.freeze_oldest(k));
        *current = Arc::clone(&next);
        Some(next)
    }

    /// Ends the checkpoint of the frozen layers of `generation` after its redb transaction
    /// committed: drops them from the list. False (nothing changed) when the list is of
    /// another generation (it was cleared meanwhile) or has no frozen layer.
    pub(crate) fn retire_frozen(&self, generation: u64) -> bool {
        let mut current = self.lock();
        if current.generation() != generation || current.frozen() == 0 {
            return false;
        }
        let (_, rest) = current.split_off(current.frozen());
        *current = Arc::new(rest);
        true
    }

    /// Empties the list and sets its generation to `generation`, after a write transaction
    /// folded every layer into redb and committed `meta/overlay_gen = generation`. False
    /// (nothing changed) unless `generation` is newer than the list's.
    pub(crate) fn clear_to(&self, generation: u64) -> bool {
        let mut current = self.lock();
        if generation <= current.generation() {
            return false;
        }
        *current = Arc::new(Layers::new(generation));
        true
    }
}
