//! [`Rows`] and [`KeyRange`] over the tables of one redb write transaction, so the lattice
//! crate's join runs directly against durable rows and the dot → key index.
//!
//! An orset is stored as rows per element (store format 3): a header row in `rows` (empty
//! value; present exactly while the set has an element) and one `elems` row per element
//! holding its `DotSet`; its dots are indexed to their element rows. [`TxnRows::get_part`]
//! reads only the elements a join can change and [`TxnRows::put`] writes only the elements
//! that differ, so an add or remove costs O(1) rows however large the set. Every access to
//! the `rows`/`elems`/`dots` tables of the write path goes through the helpers here.

use super::error::StoreError;
use super::tables::{
    DOTS, ELEMS, ROWS, dot_bytes, dot_key, elem_key, key_bytes, parse_index_value, parse_key,
    set_prefix,
};
use crate::admission::{KeyRange, SetRows};
use crate::codec;
use crate::codec::wal::RedoTable;
use super::kv::KvRead;
use redb::Table;
use std::ops::Bound;
use tidemark_crdts::{CausalContext, Dot, DotMap, DotSet, DotStore, Entry, Key, KeyKind, Rows};

/// `value` encoded as `what` for `table`, refused when it exceeds `max` bytes (a record that
/// long could never be read back: every decoder of the store is bounded by `max`).
///
/// # Errors
/// [`StoreError::Codec`] when it does not encode, [`StoreError::TooLarge`] over `max`.
pub(crate) fn encode_bounded<T: serde::Serialize + ?Sized>(
    what: &'static str,
    table: &'static str,
    value: &T,
    max: usize,
) -> Result<Vec<u8>, StoreError> {
    let bytes = codec::encode(what, value).map_err(|source| StoreError::Codec { table, source })?;
    if bytes.len() > max {
        return Err(StoreError::TooLarge {
            what,
            len: bytes.len(),
            limit: max,
        });
    }
    Ok(bytes)
}

/// A `&[u8] → &[u8]` table of a write transaction.
pub(crate) type WriteTable<'t> = Table<'t, &'static [u8], &'static [u8]>;

/// The `rows`, `elems` and `dots` tables of a write transaction, in that order.
pub(crate) fn open_state_tables(
    txn: &redb::WriteTransaction,
) -> Result<(WriteTable<'_>, WriteTable<'_>, WriteTable<'_>), StoreError> {
    Ok((
        txn.open_table(ROWS).map_err(StoreError::redb)?,
        txn.open_table(ELEMS).map_err(StoreError::redb)?,
        txn.open_table(DOTS).map_err(StoreError::redb)?,
    ))
}

/// A `&[u8] → &[u8]` table of a read transaction.
pub(crate) type ReadTable = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The `rows` and `elems` tables of a read transaction (what whole entries are read from).
pub(crate) fn open_read_tables(
    rtxn: &redb::ReadTransaction,
) -> Result<(ReadTable, ReadTable), StoreError> {
    Ok((
        rtxn.open_table(ROWS).map_err(StoreError::redb)?,
        rtxn.open_table(ELEMS).map_err(StoreError::redb)?,
    ))
}

/// Opens the `rows`, `elems` and `dots` tables of `txn` and runs `f` over them (the one
/// place the write path opens them).
pub(crate) fn with_txn_rows<T>(
    txn: &redb::WriteTransaction,
    record_bytes_max: usize,
    f: impl FnOnce(&mut TxnRows<'_, '_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let (mut rows_t, mut elems_t, mut dots_t) = open_state_tables(txn)?;
    f(&mut TxnRows {
        rows: &mut rows_t,
        elems: &mut elems_t,
        dots: &mut dots_t,
        record_bytes_max,
        redo: super::wal::Redo::default(),
    })
}

/// The `rows`, `elems` and `dots` tables of one write transaction.
pub(crate) struct TxnRows<'a, 't> {
    pub(crate) rows: &'a mut Table<'t, &'static [u8], &'static [u8]>,
    pub(crate) elems: &'a mut Table<'t, &'static [u8], &'static [u8]>,
    pub(crate) dots: &'a mut Table<'t, &'static [u8], &'static [u8]>,
    pub(crate) record_bytes_max: usize,
    /// What the writes did, for the write-ahead log (off outside local commit groups).
    pub(crate) redo: super::wal::Redo,
}

impl<'t> TxnRows<'_, 't> {
    fn table(&mut self, t: RedoTable) -> &mut Table<'t, &'static [u8], &'static [u8]> {
        match t {
            RedoTable::Elems => self.elems,
            RedoTable::Dots => self.dots,
            _ => self.rows,
        }
    }

    /// Sets `key` to `value` in `t` (`rows`, `elems` or `dots`), recorded in the redo.
    pub(crate) fn insert(&mut self, t: RedoTable, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.table(t).insert(key, value).map_err(StoreError::redb)?;
        self.redo.put(t, key, value);
        Ok(())
    }

    /// Removes `key` from `t` (`rows`, `elems` or `dots`), recorded in the redo.
    pub(crate) fn remove(&mut self, t: RedoTable, key: &[u8]) -> Result<(), StoreError> {
        self.table(t).remove(key).map_err(StoreError::redb)?;
        self.redo.del(t, key);
        Ok(())
    }
}

pub(crate) fn decode_entry(bytes: &[u8], max: usize) -> Result<Entry, StoreError> {
    codec::decode("state row", bytes, max).map_err(|source| StoreError::Codec {
        table: "rows",
        source,
    })
}

pub(crate) fn decode_elem(bytes: &[u8], max: usize) -> Result<DotSet, StoreError> {
    codec::decode("set element", bytes, max).map_err(|source| StoreError::Codec {
        table: "elems",
        source,
    })
}

/// Whether `kind`'s entries are stored as rows per element (a header row plus `elems`).
pub(crate) fn per_element(kind: KeyKind) -> bool {
    kind == KeyKind::ORSet
}

/// The entry of `key` whose `rows` row holds `value`: decoded, or for a set assembled from
/// its element rows (a read: O(set)).
pub(crate) fn row_entry(
    elems: &impl KvRead,
    key: &Key,
    value: &[u8],
    max: usize,
) -> Result<Entry, StoreError> {
    if per_element(key.kind) {
        read_set(elems, key, max)
    } else {
        decode_entry(value, max)
    }
}

/// The committed entry of `key`, whole (sets assembled from their element rows).
pub(crate) fn read_entry(
    rows: &impl KvRead,
    elems: &impl KvRead,
    key: &Key,
    max: usize,
) -> Result<Option<Entry>, StoreError> {
    match rows.get_bytes(key_bytes(key).as_slice())? {
        Some(g) => Ok(Some(row_entry(elems, key, &g, max)?)),
        None => Ok(None),
    }
}

/// Every element row of the set `key`, ascending, as `(element, dots)`.
pub(crate) fn for_each_elem(
    elems: &impl KvRead,
    key: &Key,
    max: usize,
    mut f: impl FnMut(&str, DotSet) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let prefix = set_prefix(key);
    for item in elems.range_bytes(Bound::Included(prefix.as_slice()), Bound::Unbounded)? {
        let (k, v) = item?;
        let Some(elem) = k.strip_prefix(prefix.as_slice()) else {
            break;
        };
        let elem = std::str::from_utf8(elem)
            .map_err(|_| StoreError::Corrupt(format!("{key}: unreadable element key")))?;
        f(elem, decode_elem(&v, max)?)?;
    }
    Ok(())
}

/// The whole set `key` assembled from its element rows (empty when it has none).
pub(crate) fn read_set(
    elems: &impl KvRead,
    key: &Key,
    max: usize,
) -> Result<Entry, StoreError> {
    let mut map: DotMap<String, DotSet> = DotMap::default();
    for_each_elem(elems, key, max, |e, dots| {
        map.set(e.to_owned(), dots);
        Ok(())
    })?;
    Ok(Entry::ORSet(map))
}

/// The elements of `key`'s set among `names`, read one row each (absent ones left out).
pub(crate) fn read_elems<'e>(
    elems: &impl KvRead,
    key: &Key,
    names: impl IntoIterator<Item = &'e str>,
    max: usize,
) -> Result<DotMap<String, DotSet>, StoreError> {
    let mut map: DotMap<String, DotSet> = DotMap::default();
    for e in names {
        if map.get(&e.to_owned()).is_some() {
            continue;
        }
        if let Some(g) = elems.get_bytes(elem_key(key, e).as_slice())? {
            map.set(e.to_owned(), decode_elem(&g, max)?);
        }
    }
    Ok(map)
}

/// At most this many dots of `seen` are resolved to elements through the dot index; above it
/// [`set_part`] reads the whole set (a state-transfer-sized context: a read, still exact).
const PART_SEEN_MAX: u64 = 4096;

/// The dot-index entries of `dots`, as `(dot, index value)`.
fn index_entries(
    dots_t: &impl KvRead,
    dots: &CausalContext,
    mut f: impl FnMut(Dot, &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    for (replica, set) in dots.entries() {
        for &(lo, hi) in set.ranges() {
            let lo_b = dot_key(*replica, lo);
            let hi_b = dot_key(*replica, hi);
            for item in dots_t.range_bytes(
                Bound::Included(lo_b.as_slice()),
                Bound::Included(hi_b.as_slice()),
            )? {
                let (k, v) = item?;
                let seq = k
                    .get(16..24)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| StoreError::Corrupt("unreadable dot index key".into()))?;
                f(Dot::new(*replica, seq), &v)?;
            }
        }
    }
    Ok(())
}

/// The part of the set `key` a join can change (see [`Rows::get_part`]): the elements
/// `theirs` names plus those holding a dot of `seen` (found through the dot index). `None`
/// when none of them exists.
pub(crate) fn set_part(
    elems: &impl KvRead,
    dots_t: &impl KvRead,
    key: &Key,
    theirs: Option<&Entry>,
    seen: &CausalContext,
    max: usize,
) -> Result<Option<Entry>, StoreError> {
    if seen.len() > PART_SEEN_MAX {
        let whole = read_set(elems, key, max)?;
        return Ok((!whole.is_bottom()).then_some(whole));
    }
    let mut names: Vec<String> = match theirs {
        Some(Entry::ORSet(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    };
    if !seen.is_empty() {
        let prefix = set_prefix(key);
        index_entries(dots_t, seen, |_, v| {
            if let Some(e) = v.strip_prefix(prefix.as_slice()) {
                let e = std::str::from_utf8(e)
                    .map_err(|_| StoreError::Corrupt("unreadable dot index value".into()))?;
                names.push(e.to_owned());
            }
            Ok(())
        })?;
    }
    names.sort_unstable();
    names.dedup();
    let map = read_elems(elems, key, names.iter().map(String::as_str), max)?;
    Ok((!map.is_empty()).then_some(Entry::ORSet(map)))
}

/// What [`put_set`] changed in the dot index: dots whose index rows it deleted and inserted.
#[derive(Default)]
pub(crate) struct IndexChange {
    pub(crate) removed: Vec<Dot>,
    pub(crate) added: Vec<Dot>,
}

/// Writes the part `new` of the set `key` over the part `old` (as [`Rows::put`]): element
/// rows that differ, index rows of the dots that moved, and the header row (created with
/// the first element, removed with the last).
pub(crate) fn put_set(
    t: &mut TxnRows<'_, '_>,
    key: &Key,
    old: Option<&Entry>,
    new: Option<&Entry>,
) -> Result<IndexChange, StoreError> {
    let empty = DotMap::default();
    fn as_map<'m>(
        key: &Key,
        e: Option<&'m Entry>,
        empty: &'m DotMap<String, DotSet>,
    ) -> Result<&'m DotMap<String, DotSet>, StoreError> {
        match e {
            None => Ok(empty),
            Some(Entry::ORSet(m)) => Ok(m),
            Some(_) => Err(StoreError::Corrupt(format!("{key}: not an orset entry"))),
        }
    }
    let (o, n) = (as_map(key, old, &empty)?, as_map(key, new, &empty)?);
    let mut change = IndexChange::default();
    // Index rows first: deletions before insertions, so a dot that moved element ends indexed.
    let mut added: Vec<(Dot, &str)> = Vec::new();
    for (e, ds) in o.iter() {
        let now = n.get(e);
        for d in ds.iter() {
            if !now.is_some_and(|s| s.contains(d)) {
                t.remove(RedoTable::Dots, dot_bytes(*d).as_slice())?;
                change.removed.push(*d);
            }
        }
    }
    for (e, ds) in n.iter() {
        let before = o.get(e);
        for d in ds.iter() {
            if !before.is_some_and(|s| s.contains(d)) {
                added.push((*d, e.as_str()));
            }
        }
    }
    for (d, e) in &added {
        t.insert(
            RedoTable::Dots,
            dot_bytes(*d).as_slice(),
            elem_key(key, e).as_slice(),
        )?;
        change.added.push(*d);
    }
    for (e, _) in o.iter() {
        if n.get(e).is_none() {
            t.remove(RedoTable::Elems, elem_key(key, e).as_slice())?;
        }
    }
    for (e, ds) in n.iter() {
        if o.get(e) != Some(ds) {
            let bytes = encode_bounded("set element", "elems", ds, t.record_bytes_max)?;
            t.insert(RedoTable::Elems, elem_key(key, e).as_slice(), bytes.as_slice())?;
        }
    }
    let kb = key_bytes(key);
    if !n.is_empty() {
        // Elements of `old` exist, so the header does; otherwise make sure of it.
        if o.is_empty()
            && t.rows.get_bytes(kb.as_slice())?.is_none()
        {
            t.insert(RedoTable::Rows, kb.as_slice(), [].as_slice())?;
        }
    } else if !o.is_empty() && !set_has_elements(&*t.elems, key)? {
        t.remove(RedoTable::Rows, kb.as_slice())?;
    }
    Ok(change)
}

/// True when the set `key` has at least one element row (one range seek).
pub(crate) fn set_has_elements(elems: &impl KvRead, key: &Key) -> Result<bool, StoreError> {
    let prefix = set_prefix(key);
    Ok(elems
        .range_bytes(Bound::Included(prefix.as_slice()), Bound::Unbounded)?
        .next()
        .transpose()?
        .is_some_and(|(k, _)| k.starts_with(&prefix)))
}

/// Whether the dots of `kind`'s entries have dot → key index rows. Counter dots have none:
/// a counter is never deleted, and a counter dot is only ever removed by a later dot of the
/// same replica on the same key, which every delta carries together with that removal (the
/// log's pieces keep them together, counters after every other entry of a run:
/// [`super::split::split_delta`]), so the join reaches the
/// key through the delta's own entry and never needs the index to find it. That saves a
/// B-tree delete and insert per counter increment.
pub(crate) fn indexed(kind: KeyKind) -> bool {
    kind.deletable()
}

/// The keys whose entries hold at least one of `dots`, through the dot index.
pub(crate) fn keys_holding(
    dots_t: &impl KvRead,
    dots: &CausalContext,
) -> Result<Vec<Key>, StoreError> {
    let mut keys = Vec::new();
    index_entries(dots_t, dots, |_, v| {
        let (key, _) = parse_index_value(v)
            .ok_or_else(|| StoreError::Corrupt("dot index names an unreadable key".into()))?;
        keys.push(key);
        Ok(())
    })?;
    keys.sort();
    keys.dedup();
    Ok(keys)
}

impl Rows for TxnRows<'_, '_> {
    type Error = StoreError;

    fn get(&mut self, key: &Key) -> Result<Option<Entry>, StoreError> {
        read_entry(&*self.rows, &*self.elems, key, self.record_bytes_max)
    }

    fn get_part(
        &mut self,
        key: &Key,
        theirs: Option<&Entry>,
        seen: &CausalContext,
    ) -> Result<Option<Entry>, StoreError> {
        if per_element(key.kind) {
            set_part(
                &*self.elems,
                &*self.dots,
                key,
                theirs,
                seen,
                self.record_bytes_max,
            )
        } else {
            self.get(key)
        }
    }

    fn put(
        &mut self,
        key: &Key,
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) -> Result<(), StoreError> {
        if per_element(key.kind) {
            put_set(self, key, old, new)?;
            return Ok(());
        }
        let kb = key_bytes(key);
        // Only the dots that changed touch the index, so updating a large entry costs index
        // writes in proportion to the change, not to the entry (docs/design/principles.md,
        // "Writes proportional to the change").
        let sorted = |e: Option<&Entry>| {
            let mut dots = Vec::new();
            if let Some(e) = e {
                e.for_each_dot(&mut |d| dots.push(d));
            }
            dots.sort_unstable();
            dots
        };
        let (before, after) = if indexed(key.kind) {
            (sorted(old), sorted(new))
        } else {
            (Vec::new(), Vec::new())
        };
        for d in &before {
            if after.binary_search(d).is_err() {
                self.remove(RedoTable::Dots, dot_bytes(*d).as_slice())?;
            }
        }
        for d in &after {
            if before.binary_search(d).is_err() {
                self.insert(RedoTable::Dots, dot_bytes(*d).as_slice(), kb.as_slice())?;
            }
        }
        match new {
            Some(e) => {
                let bytes = codec::encode("state row", e).map_err(|source| StoreError::Codec {
                    table: "rows",
                    source,
                })?;
                self.insert(RedoTable::Rows, kb.as_slice(), bytes.as_slice())?;
            }
            None => {
                self.remove(RedoTable::Rows, kb.as_slice())?;
            }
        }
        Ok(())
    }

    fn keys_holding(&mut self, dots: &CausalContext) -> Result<Vec<Key>, StoreError> {
        keys_holding(&*self.dots, dots)
    }
}

impl KeyRange for TxnRows<'_, '_> {
    fn keys_in_range(
        &mut self,
        after: Option<&Key>,
        upto: Option<&Key>,
    ) -> Result<Vec<Key>, StoreError> {
        if let (Some(a), Some(u)) = (after, upto) {
            if a >= u {
                return Ok(Vec::new());
            }
        }
        let lo = after.map(key_bytes);
        let hi = upto.map(key_bytes);
        let lo_b: Bound<&[u8]> = lo.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let hi_b: Bound<&[u8]> = hi.as_deref().map_or(Bound::Unbounded, Bound::Included);
        let mut keys = Vec::new();
        for item in self.rows.range_bytes(lo_b, hi_b)? {
            let (k, _) = item?;
            keys.push(
                parse_key(&k)
                    .ok_or_else(|| StoreError::Corrupt("unreadable row key".into()))?,
            );
        }
        Ok(keys)
    }

}

impl SetRows for TxnRows<'_, '_> {
    fn set_held(&mut self, key: &Key) -> Result<bool, StoreError> {
        set_has_elements(&*self.elems, key)
    }

    fn set_elems(
        &mut self,
        key: &Key,
        names: &[String],
    ) -> Result<DotMap<String, DotSet>, StoreError> {
        read_elems(
            &*self.elems,
            key,
            names.iter().map(String::as_str),
            self.record_bytes_max,
        )
    }

    fn set_elems_after(
        &mut self,
        key: &Key,
        after: Option<&str>,
        max: usize,
    ) -> Result<DotMap<String, DotSet>, StoreError> {
        let prefix = set_prefix(key);
        let from = after.map(|e| elem_key(key, e));
        let lo: Bound<&[u8]> = match &from {
            Some(f) => Bound::Excluded(f.as_slice()),
            None => Bound::Included(prefix.as_slice()),
        };
        let mut map: DotMap<String, DotSet> = DotMap::default();
        for item in self.elems.range_bytes(lo, Bound::Unbounded)? {
            if map.len() >= max.max(1) {
                break;
            }
            let (k, v) = item?;
            let Some(elem) = k.strip_prefix(prefix.as_slice()) else {
                break;
            };
            let elem = std::str::from_utf8(elem)
                .map_err(|_| StoreError::Corrupt(format!("{key}: unreadable element key")))?;
            map.set(elem.to_owned(), decode_elem(&v, self.record_bytes_max)?);
        }
        Ok(map)
    }

    fn dot_elems(&mut self, key: &Key, dots: &[Dot]) -> Result<Vec<String>, StoreError> {
        let prefix = set_prefix(key);
        let mut names = Vec::new();
        for d in dots {
            if let Some(g) = self.dots.get_bytes(dot_bytes(*d).as_slice())? {
                if let Some(elem) = g.strip_prefix(prefix.as_slice()) {
                    let elem = std::str::from_utf8(elem)
                        .map_err(|_| StoreError::Corrupt("unreadable dot index value".into()))?;
                    names.push(elem.to_owned());
                }
            }
        }
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }
}
