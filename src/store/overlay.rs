//! The write-ahead overlay (issue 10, "WAL + checkpoint"): table writes that are durable in the
//! delta log but not yet folded into their redb tables.
//!
//! A commit group makes only its log record(s), context, dedup marks and HLC mark durable; the
//! rows and dot-index entries it changed go here, keyed by `(table, key bytes)` → new value
//! bytes (`None`: the row was removed). The overlay is generic over tables: any `&[u8] → &[u8]`
//! table is opened as an [`OvTable`] (write path) or [`OvRead`] (readers), both shaped like
//! redb's tables ([`BytesTable`]: `get`, `range`, `len`; `insert`/`remove` stage), so point
//! reads, key ranges, `list` and chunk reads see the overlay first and redb's rows only where
//! the overlay holds nothing for a key, and a table joins the overlay by changing only which
//! handle its code opens.
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

/// Bytes of a key or value read through the overlay: the overlay's (shared or borrowed), an
/// owned copy, or redb's guard.
pub(crate) enum Bytes<'a> {
    /// A value the overlay holds.
    Shared(Arc<[u8]>),
    /// Bytes borrowed from a reader's overlay view.
    Borrowed(&'a [u8]),
    /// An owned copy.
    Owned(Vec<u8>),
    /// A row of the redb table.
    Guard(redb::AccessGuard<'a, &'static [u8]>),
}

impl Bytes<'_> {
    /// The bytes (named like redb's `AccessGuard::value`, so table code reads the same
    /// whether or not the overlay is in between).
    pub(crate) fn value(&self) -> &[u8] {
        match self {
            Bytes::Shared(a) => a,
            Bytes::Borrowed(b) => b,
            Bytes::Owned(v) => v,
            Bytes::Guard(g) => g.value(),
        }
    }
}

/// One item of a [`BytesTable::range`].
pub(crate) type BytesItem<'a> = Result<(Bytes<'a>, Bytes<'a>), redb::StorageError>;

/// A boxed ascending iterator of [`BytesItem`]s.
pub(crate) type BytesRange<'a> = Box<dyn Iterator<Item = BytesItem<'a>> + 'a>;

/// A `&[u8] → &[u8]` table as the store reads it: the overlay's pending writes over redb's
/// rows (shaped like redb's `ReadableTable`, so code over tables reads the same).
pub(crate) trait BytesTable {
    /// The current value of `key`.
    ///
    /// # Errors
    /// Storage failures.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes<'_>>, redb::StorageError>;

    /// The current rows in `range`, ascending.
    ///
    /// # Errors
    /// Storage failures.
    fn range<KR: AsRef<[u8]>>(
        &self,
        range: impl std::ops::RangeBounds<KR>,
    ) -> Result<BytesRange<'_>, redb::StorageError>;

    /// The number of current rows (O(overlay) plus redb's count walk: tests and verify).
    ///
    /// # Errors
    /// Storage failures.
    fn len(&self) -> Result<u64, redb::StorageError> {
        let mut n = 0u64;
        for item in self.range::<&[u8]>(..)? {
            item?;
            n += 1;
        }
        Ok(n)
    }
}

fn bounds<'a, KR: AsRef<[u8]> + 'a>(
    range: &'a impl std::ops::RangeBounds<KR>,
) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
    (
        range.start_bound().map(AsRef::as_ref),
        range.end_bound().map(AsRef::as_ref),
    )
}

/// Merges overlay items (`(key, Some(value))` written, `(key, None)` removed) over a table's
/// ascending items: the overlay's entry wins for a key it holds.
struct MergeBytes<'a, O: Iterator<Item = (Bytes<'a>, Option<Bytes<'a>>)>> {
    ov: std::iter::Peekable<O>,
    tab: std::iter::Peekable<redb::Range<'a, &'static [u8], &'static [u8]>>,
}

impl<'a, O: Iterator<Item = (Bytes<'a>, Option<Bytes<'a>>)>> Iterator for MergeBytes<'a, O> {
    type Item = BytesItem<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.ov.peek(), self.tab.peek()) {
                (None, None) => return None,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) | (_, Some(Err(_))) => std::cmp::Ordering::Greater,
                (Some((ok, _)), Some(Ok((tk, _)))) => ok.value().cmp(tk.value()),
            };
            if order == std::cmp::Ordering::Equal {
                self.tab.next();
            }
            if order != std::cmp::Ordering::Greater {
                let (k, v) = self.ov.next()?;
                match v {
                    Some(v) => return Some(Ok((k, v))),
                    None => continue,
                }
            }
            return self
                .tab
                .next()
                .map(|r| r.map(|(k, v)| (Bytes::Guard(k), Bytes::Guard(v))));
        }
    }
}

/// A table of a write transaction under the writer's overlay: reads see the staged and
/// committed-unfolded writes first; `insert`/`remove` stage into the overlay (the table
/// itself is written only by a fold).
pub(crate) struct OvTable<'t> {
    table: redb::Table<'t, &'static [u8], &'static [u8]>,
    name: &'static str,
    ov: &'t std::cell::RefCell<Overlay>,
}

impl<'t> OvTable<'t> {
    /// Opens table `name` of `txn` under `ov`.
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn open(
        txn: &'t redb::WriteTransaction,
        name: &'static str,
        ov: &'t std::cell::RefCell<Overlay>,
    ) -> Result<Self, StoreError> {
        let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new(name);
        Ok(Self {
            table: txn.open_table(def).map_err(StoreError::redb)?,
            name,
            ov,
        })
    }

    /// Stages `value` under `key` (shaped like redb's `insert`).
    ///
    /// # Errors
    /// None today (the signature matches redb's).
    pub(crate) fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<(), redb::StorageError> {
        self.ov.borrow_mut().stage(self.name, key, Some(value));
        Ok(())
    }

    /// Stages the removal of `key` (shaped like redb's `remove`).
    ///
    /// # Errors
    /// None today (the signature matches redb's).
    pub(crate) fn remove(&mut self, key: &[u8]) -> Result<(), redb::StorageError> {
        self.ov.borrow_mut().stage(self.name, key, None);
        Ok(())
    }
}

impl BytesTable for OvTable<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes<'_>>, redb::StorageError> {
        use redb::ReadableTable;
        if let Some(p) = self.ov.borrow().get(self.name, key) {
            return Ok(p.map(Bytes::Shared));
        }
        Ok(self.table.get(key)?.map(Bytes::Guard))
    }

    fn range<KR: AsRef<[u8]>>(
        &self,
        range: impl std::ops::RangeBounds<KR>,
    ) -> Result<BytesRange<'_>, redb::StorageError> {
        use redb::ReadableTable;
        let (lo, hi) = bounds(&range);
        // The overlay part is read one entry at a time (a short borrow per step: the writer may
        // stage while the range is alive), so a range read only as far as it is used (a prefix
        // scan that stops at the first other key) costs what it reads, not the overlay's tail.
        let ov = OvCursor {
            ov: self.ov,
            name: self.name,
            lo: lo.map(<[u8]>::to_vec),
            hi: hi.map(<[u8]>::to_vec),
        };
        let tab = if valid_range(lo, hi) {
            self.table.range::<&[u8]>((lo, hi))?
        } else {
            self.table.range::<&[u8]>(..&[][..])?
        };
        Ok(Box::new(MergeBytes {
            ov: ov.peekable(),
            tab: tab.peekable(),
        }))
    }
}

/// The writer's pending writes of one table in a range, read lazily one entry per step.
struct OvCursor<'t> {
    ov: &'t std::cell::RefCell<Overlay>,
    name: &'static str,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
}

impl<'t> Iterator for OvCursor<'t> {
    type Item = (Bytes<'t>, Option<Bytes<'t>>);

    fn next(&mut self) -> Option<Self::Item> {
        let (k, v) = {
            let ov = self.ov.borrow();
            let lo = self.lo.as_ref().map(Vec::as_slice);
            let hi = self.hi.as_ref().map(Vec::as_slice);
            let mut range = ov.range(self.name, lo, hi);
            range.next().map(|(k, v)| (k.to_vec(), v.clone()))?
        };
        self.lo = Bound::Excluded(k.clone());
        Some((Bytes::Owned(k), v.map(Bytes::Shared)))
    }
}

/// A table of a read transaction under a reader's overlay view.
pub(crate) struct OvRead<'v> {
    table: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    name: &'static str,
    view: &'v View,
}

impl<'v> OvRead<'v> {
    /// Opens table `name` of `rtxn` under `view`.
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn open(
        rtxn: &redb::ReadTransaction,
        name: &'static str,
        view: &'v View,
    ) -> Result<Self, StoreError> {
        let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new(name);
        Ok(Self {
            table: rtxn.open_table(def).map_err(StoreError::redb)?,
            name,
            view,
        })
    }
}

impl BytesTable for OvRead<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes<'_>>, redb::StorageError> {
        if let Some(p) = self.view.get(self.name, key) {
            return Ok(p.map(Bytes::Shared));
        }
        Ok(self.table.get(key)?.map(Bytes::Guard))
    }

    fn range<KR: AsRef<[u8]>>(
        &self,
        range: impl std::ops::RangeBounds<KR>,
    ) -> Result<BytesRange<'_>, redb::StorageError> {
        let (lo, hi) = bounds(&range);
        let ov = self
            .view
            .range(self.name, lo, hi)
            .map(|(k, v)| (Bytes::Borrowed(k), v.as_deref().map(Bytes::Borrowed)));
        let tab = if valid_range(lo, hi) {
            self.table.range::<&[u8]>((lo, hi))?
        } else {
            self.table.range::<&[u8]>(..&[][..])?
        };
        Ok(Box::new(MergeBytes {
            ov: ov.peekable(),
            tab: tab.peekable(),
        }))
    }
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
        let db = redb::Builder::new()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .expect("db");
        let txn = db.begin_write().expect("txn");
        {
            let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("t");
            let mut t = txn.open_table(def).expect("table");
            for (k, v) in [
                (&b"a"[..], &b"A"[..]),
                (b"b", b"b0"),
                (b"c", b"C"),
                (b"d", b"D"),
            ] {
                t.insert(k, v).expect("insert");
            }
        }
        let cell = std::cell::RefCell::new(ov);
        let got: Vec<(Vec<u8>, Vec<u8>)> = {
            let t = OvTable::open(&txn, "t", &cell).expect("open");
            assert_eq!(
                t.get(b"b").expect("get").map(|b| b.value().to_vec()),
                Some(b"B2".to_vec())
            );
            assert!(
                t.get(b"d").expect("get").is_none(),
                "removed in the overlay"
            );
            assert_eq!(t.len().expect("len"), 4);
            t.range::<&[u8]>(..)
                .expect("range")
                .map(|r| {
                    let (k, v) = r.expect("ok");
                    (k.value().to_vec(), v.value().to_vec())
                })
                .collect()
        };
        let mut ov = cell.into_inner();
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
