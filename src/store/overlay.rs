//! The write-ahead overlay (issue 10, "WAL + checkpoint"): table writes that are durable in the
//! delta log but not yet folded into their redb tables.
//!
//! A commit group makes only its log record(s), context, dedup marks and HLC mark durable; the
//! rows and dot-index entries it changed go here, keyed by `(table, key bytes)` → new value
//! bytes (`None`: the row was removed). The overlay is generic over tables: any `&[u8] → &[u8]`
//! table routes its writes through [`Overlay::stage`] and its reads through a [`Layers`] view
//! merged over redb's ([`Merged`]), so point reads, key ranges, `list` and chunk reads see the
//! overlay first and redb's rows only where the overlay holds nothing for a key.
//!
//! Every `N` groups or `M` bytes ([`crate::config::Limits::fold_groups_max`],
//! [`crate::config::Limits::fold_bytes_max`]) the store folds the whole overlay into the tables
//! in key order inside a regular durable commit and records the folded log position in `meta`
//! in the same transaction; on open it replays the log above that position (see
//! `RedbStore::replay`). So the overlay never holds more than about `M` bytes plus one group.
//!
//! Readers never see a half-folded state: a reader takes its redb read transaction and its
//! overlay snapshot under one lock ([`Shared`]), and a fold commits and empties the overlay
//! under the same lock; an ordinary commit changes no table this overlay covers, so it only
//! publishes its new layer (after the commit, before the callers are acknowledged).

use super::error::StoreError;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A pending value: `Some(bytes)` written, `None` removed.
pub(crate) type Pending = Option<Arc<[u8]>>;

/// Bytes charged per pending key besides its key and value (map node, `Arc` header, the key's
/// second copy in its published layer).
const ENTRY_OVERHEAD: usize = 96;

/// Pending writes of one or more commits, per table, in key order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Writes {
    tables: BTreeMap<&'static str, BTreeMap<Vec<u8>, Pending>>,
    bytes: usize,
    keys: usize,
}

/// True when `(lo, hi)` is a range `BTreeMap::range` accepts (it panics otherwise).
fn valid_range(lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> bool {
    match (lo, hi) {
        (Bound::Included(a), Bound::Included(b)) => a <= b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b)) => a < b,
        _ => true,
    }
}

impl Writes {
    /// Records `value` as the newest write of `key` in `table`.
    pub(crate) fn put(&mut self, table: &'static str, key: &[u8], value: Pending) {
        let len = value.as_ref().map_or(0, |v| v.len());
        let t = self.tables.entry(table).or_default();
        match t.get_mut(key) {
            Some(slot) => {
                let old = slot.as_ref().map_or(0, |v| v.len());
                *slot = value;
                self.bytes = self.bytes.saturating_sub(old).saturating_add(len);
            }
            None => {
                t.insert(key.to_vec(), value);
                self.bytes = self
                    .bytes
                    .saturating_add(key.len() * 2 + len + ENTRY_OVERHEAD);
                self.keys += 1;
            }
        }
    }

    /// The newest pending write of `key` (`None`: no pending write).
    pub(crate) fn get(&self, table: &str, key: &[u8]) -> Option<&Pending> {
        self.tables.get(table)?.get(key)
    }

    /// Pending writes of `table` in `(lo, hi)`, ascending.
    fn range<'a>(
        &'a self,
        table: &str,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> Option<std::collections::btree_map::Range<'a, Vec<u8>, Pending>> {
        if !valid_range(lo, hi) {
            return None;
        }
        Some(self.tables.get(table)?.range::<[u8], _>((lo, hi)))
    }

    /// Approximate bytes held (keys, values and bookkeeping).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// True when nothing is pending.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys == 0
    }

    /// Adds every write of `newer` on top of these (values shared, not copied).
    fn absorb(&mut self, newer: &Writes) {
        for (table, t) in &newer.tables {
            for (k, v) in t {
                self.put(table, k, v.clone());
            }
        }
    }

    /// Writes everything pending into its tables (in key order per table).
    ///
    /// # Errors
    /// Storage failures.
    fn write_into(&self, txn: &redb::WriteTransaction) -> Result<(), StoreError> {
        for (table, t) in &self.tables {
            let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new(table);
            let mut out = txn.open_table(def).map_err(StoreError::redb)?;
            for (k, v) in t {
                match v {
                    Some(v) => {
                        out.insert(k.as_slice(), &**v).map_err(StoreError::redb)?;
                    }
                    None => {
                        out.remove(k.as_slice()).map_err(StoreError::redb)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A read-only stack of pending writes, oldest first: what a reader (or the writer) consults
/// before the tables.
pub(crate) trait Layers {
    /// The layers, oldest first.
    fn layers(&self) -> Vec<&Writes>;

    /// The newest pending write of `key` in `table` (`None`: the tables decide).
    fn get(&self, table: &str, key: &[u8]) -> Option<Pending> {
        self.layers()
            .into_iter()
            .rev()
            .find_map(|l| l.get(table, key).cloned())
    }

    /// Pending writes of `table` in `(lo, hi)`, ascending, newest value per key.
    fn range<'a>(&'a self, table: &str, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> LayeredRange<'a> {
        LayeredRange {
            iters: self
                .layers()
                .into_iter()
                .filter_map(|l| l.range(table, lo, hi).map(Iterator::peekable))
                .collect(),
        }
    }
}

/// What readers see: the published layers, oldest first (one per commit since the last fold).
#[derive(Debug, Default)]
pub(crate) struct View {
    layers: Vec<Arc<Writes>>,
}

impl Layers for View {
    fn layers(&self) -> Vec<&Writes> {
        self.layers.iter().map(|l| &**l).collect()
    }
}

/// The overlay snapshot readers share with the writer. A reader takes its read transaction
/// and the view under this lock; a fold commits and empties the view under it.
pub(crate) type Shared = Arc<Mutex<Arc<View>>>;

/// Locks `shared` (a poisoned lock still holds a consistent `Arc`: it is only ever replaced).
pub(crate) fn lock(shared: &Shared) -> MutexGuard<'_, Arc<View>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A merged ascending iterator over several layers' ranges: per key, the newest layer wins.
pub(crate) struct LayeredRange<'a> {
    iters: Vec<std::iter::Peekable<std::collections::btree_map::Range<'a, Vec<u8>, Pending>>>,
}

impl<'a> Iterator for LayeredRange<'a> {
    type Item = (&'a [u8], &'a Pending);

    fn next(&mut self) -> Option<Self::Item> {
        let mut min: Option<&'a [u8]> = None;
        for it in &mut self.iters {
            if let Some((k, _)) = it.peek() {
                let k: &'a [u8] = (*k).as_slice();
                if min.is_none_or(|m| k < m) {
                    min = Some(k);
                }
            }
        }
        let min = min?;
        let mut newest = None;
        for it in &mut self.iters {
            if it.peek().is_some_and(|(k, _)| (*k).as_slice() == min) {
                newest = it.next().map(|(_, v)| v);
            }
        }
        newest.map(|v| (min, v))
    }
}

/// Pending writes merged over a table's ascending `(key, value)` items: the overlay's value
/// wins for a key it holds (a removal hides the table's row), in ascending key order.
pub(crate) struct Merged<'a, T: Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>>> {
    ov: std::iter::Peekable<LayeredRange<'a>>,
    tab: std::iter::Peekable<T>,
}

impl<'a, T: Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>>> Merged<'a, T> {
    /// Merges `ov` (pending writes) over `tab` (the table's rows in the same range).
    pub(crate) fn new(ov: LayeredRange<'a>, tab: T) -> Self {
        Self {
            ov: ov.peekable(),
            tab: tab.peekable(),
        }
    }
}

impl<T: Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>>> Iterator for Merged<'_, T> {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.ov.peek(), self.tab.peek()) {
                (None, None) => return None,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) | (_, Some(Err(_))) => std::cmp::Ordering::Greater,
                (Some((ok, _)), Some(Ok((tk, _)))) => (*ok).cmp(tk.as_slice()),
            };
            if order == std::cmp::Ordering::Equal {
                // The overlay's write replaces the table's row.
                self.tab.next();
            }
            if order != std::cmp::Ordering::Greater {
                let (k, v) = self.ov.next()?;
                match v {
                    Some(v) => return Some(Ok((k.to_vec(), v.to_vec()))),
                    None => continue,
                }
            }
            return self.tab.next();
        }
    }
}

/// Items of a redb `&[u8] → &[u8]` table range, owned, for [`Merged`].
pub(crate) fn table_items<'t>(
    range: redb::Range<'t, &'static [u8], &'static [u8]>,
) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + 't {
    range.map(|item| {
        item.map(|(k, v)| (k.value().to_vec(), v.value().to_vec()))
            .map_err(StoreError::redb)
    })
}

/// The writer's overlay: committed-but-unfolded writes (`merged`, and the same writes as
/// published per-commit layers) plus the current group's staged writes (`pending`).
#[derive(Debug)]
pub(crate) struct Overlay {
    /// Every write committed since the last fold, newest value per key.
    merged: Writes,
    /// The current write transaction's writes (dropped if it does not commit).
    pending: Writes,
    /// Published layers (one per commit since the last fold), shared with readers.
    layers: Vec<Arc<Writes>>,
    /// Commits since the last fold that staged anything.
    groups: usize,
    shared: Shared,
}

impl Default for Overlay {
    fn default() -> Self {
        Self {
            merged: Writes::default(),
            pending: Writes::default(),
            layers: Vec::new(),
            groups: 0,
            shared: Arc::new(Mutex::new(Arc::new(View::default()))),
        }
    }
}

impl Overlay {
    /// The handle readers share.
    pub(crate) fn shared(&self) -> Shared {
        Arc::clone(&self.shared)
    }

    /// Stages a write of the current transaction.
    pub(crate) fn stage(&mut self, table: &'static str, key: &[u8], value: Option<&[u8]>) {
        self.pending.put(table, key, value.map(Arc::from));
    }

    /// The writer's current value of `key` in `table`: staged, then committed-unfolded
    /// (`None`: the table decides).
    pub(crate) fn get(&self, table: &str, key: &[u8]) -> Option<Pending> {
        self.pending
            .get(table, key)
            .or_else(|| self.merged.get(table, key))
            .cloned()
    }

    /// The writer's pending writes of `table` in `(lo, hi)` (staged over committed).
    pub(crate) fn range<'a>(
        &'a self,
        table: &str,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> LayeredRange<'a> {
        WriterLayersRange {
            merged: &self.merged,
            pending: &self.pending,
        }
        .range_owned(table, lo, hi)
    }

    /// Committed-unfolded writes only (what the tables plus this equal after the last commit):
    /// for reads outside a write transaction.
    pub(crate) fn committed_range<'a>(
        &'a self,
        table: &str,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> LayeredRange<'a> {
        LayeredRange {
            iters: self
                .merged
                .range(table, lo, hi)
                .map(Iterator::peekable)
                .into_iter()
                .collect(),
        }
    }

    /// Committed-unfolded value of `key` (reads outside a write transaction).
    pub(crate) fn committed_get(&self, table: &str, key: &[u8]) -> Option<Pending> {
        self.merged.get(table, key).cloned()
    }

    /// Drops the staged writes of a transaction that did not commit.
    pub(crate) fn discard_pending(&mut self) {
        self.pending = Writes::default();
    }

    /// True when nothing is committed-unfolded or staged.
    pub(crate) fn is_empty(&self) -> bool {
        self.merged.is_empty() && self.pending.is_empty()
    }

    /// True when the next commit should fold: `groups_max` groups or `bytes_max` bytes would be
    /// held after it.
    pub(crate) fn wants_fold(&self, groups_max: usize, bytes_max: usize) -> bool {
        self.groups + 1 >= groups_max || self.merged.bytes() + self.pending.bytes() >= bytes_max
    }

    /// Approximate bytes staged by the current transaction.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.pending.bytes()
    }

    /// Approximate bytes held (committed-unfolded plus staged).
    pub(crate) fn bytes(&self) -> usize {
        self.merged.bytes() + self.pending.bytes()
    }

    /// Commits since the last fold.
    #[cfg(test)]
    pub(crate) fn groups(&self) -> usize {
        self.groups
    }

    /// Writes every committed-unfolded and staged write into the tables of `txn`, key-sorted
    /// per table. After `txn` commits call [`Overlay::folded`] (under [`lock`]).
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn write_into(&mut self, txn: &redb::WriteTransaction) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut self.pending);
        self.merged.absorb(&pending);
        self.merged.write_into(txn)
    }

    /// After the commit that folded everything: empties the overlay and publishes the empty
    /// view (`view` is the locked shared view).
    pub(crate) fn folded(&mut self, view: &mut Arc<View>) {
        self.merged = Writes::default();
        self.pending = Writes::default();
        self.layers.clear();
        self.groups = 0;
        *view = Arc::new(View::default());
    }

    /// After an ordinary commit: the staged writes become a published layer. Every commit
    /// counts as a group (its log records are replayed at open until the next fold).
    pub(crate) fn publish(&mut self) {
        self.groups += 1;
        if self.pending.is_empty() {
            return;
        }
        let layer = Arc::new(std::mem::take(&mut self.pending));
        self.merged.absorb(&layer);
        self.layers.push(layer);
        let view = Arc::new(View {
            layers: self.layers.clone(),
        });
        *lock(&self.shared) = view;
    }
}

/// Writer layers by reference (staged over committed) for [`Overlay::range`].
struct WriterLayersRange<'a> {
    merged: &'a Writes,
    pending: &'a Writes,
}

impl<'a> WriterLayersRange<'a> {
    fn range_owned(self, table: &str, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> LayeredRange<'a> {
        LayeredRange {
            iters: [self.merged, self.pending]
                .into_iter()
                .filter_map(|l| l.range(table, lo, hi).map(Iterator::peekable))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(v: &[(&[u8], &[u8])]) -> Vec<Result<(Vec<u8>, Vec<u8>), StoreError>> {
        v.iter()
            .map(|(k, v)| Ok((k.to_vec(), v.to_vec())))
            .collect()
    }

    /// Ranges merged over a table: newest layer wins, removals hide table rows, order kept.
    #[test]
    fn merged_ranges_prefer_the_newest_write_and_hide_removals() {
        let mut ov = Overlay::default();
        ov.stage("t", b"b", Some(b"B1"));
        ov.stage("t", b"d", None);
        ov.publish();
        ov.stage("t", b"b", Some(b"B2"));
        ov.stage("t", b"e", Some(b"E"));
        ov.stage("u", b"a", Some(b"other table"));
        let table = items(&[(b"a", b"A"), (b"b", b"b0"), (b"c", b"C"), (b"d", b"D")]);
        let got: Vec<_> = Merged::new(
            ov.range("t", Bound::Unbounded, Bound::Unbounded),
            table.into_iter(),
        )
        .map(|r| r.expect("ok"))
        .collect();
        let want: Vec<(Vec<u8>, Vec<u8>)> = [
            (&b"a"[..], &b"A"[..]),
            (b"b", b"B2"),
            (b"c", b"C"),
            (b"e", b"E"),
        ]
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
        assert_eq!(got, want);
        // Readers see only what was published.
        let view = Arc::clone(&lock(&ov.shared()));
        assert_eq!(view.get("t", b"b"), Some(Some(Arc::from(&b"B1"[..]))));
        assert_eq!(view.get("t", b"e"), None);
        ov.publish();
        let view = Arc::clone(&lock(&ov.shared()));
        assert_eq!(view.get("t", b"b"), Some(Some(Arc::from(&b"B2"[..]))));
        let r: Vec<_> = view
            .range("t", Bound::Excluded(&b"a"[..]), Bound::Included(&b"d"[..]))
            .map(|(k, v)| (k.to_vec(), v.clone()))
            .collect();
        assert_eq!(r.len(), 2, "b and d");
        assert!(
            view.range("t", Bound::Excluded(&b"b"[..]), Bound::Excluded(&b"b"[..]))
                .next()
                .is_none()
        );
        assert_eq!(ov.groups(), 2);
        assert!(ov.wants_fold(2, usize::MAX));
    }
}
