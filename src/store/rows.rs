//! [`Rows`] and [`KeyRange`] over the tables of one redb write transaction and the write-ahead
//! overlay, so the lattice crate's join runs against the current rows and dot → key index:
//! reads consult the overlay first ([`super::overlay`]), writes are staged in it and reach the
//! tables at the next fold.

use super::error::StoreError;
use super::overlay::{Merged, Overlay, table_items};
use super::tables::{DOTS_TABLE, ROWS_TABLE, dot_bytes, dot_key, key_bytes, parse_key};
use crate::apply::KeyRange;
use crate::codec;
use redb::{ReadableTable, Table};
use std::ops::Bound;
use tidemark_crdts::{CausalContext, DotStore, Entry, Key, KeyKind, Rows};

/// The `rows` and `dots` tables of one write transaction (read only: the folded state) under
/// the writer's overlay (staged and committed-unfolded writes).
pub(crate) struct TxnRows<'a, 't> {
    pub(crate) rows: &'a mut Table<'t, &'static [u8], &'static [u8]>,
    pub(crate) dots: &'a mut Table<'t, &'static [u8], &'static [u8]>,
    pub(crate) ov: &'a mut Overlay,
    pub(crate) record_bytes_max: usize,
}

impl TxnRows<'_, '_> {
    /// The current entry under row key `kb` with its encoded length (overlay first).
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub(crate) fn entry_at(&self, kb: &[u8]) -> Result<Option<(Entry, usize)>, StoreError> {
        if let Some(p) = self.ov.get(ROWS_TABLE, kb) {
            return match p {
                Some(bytes) => Ok(Some((
                    decode_entry(&bytes, self.record_bytes_max)?,
                    bytes.len(),
                ))),
                None => Ok(None),
            };
        }
        match self.rows.get(kb).map_err(StoreError::redb)? {
            Some(g) => {
                let bytes = g.value();
                Ok(Some((
                    decode_entry(bytes, self.record_bytes_max)?,
                    bytes.len(),
                )))
            }
            None => Ok(None),
        }
    }

    /// Stages the row under `kb` (`None`: removed).
    pub(crate) fn put_row(&mut self, kb: &[u8], bytes: Option<&[u8]>) {
        self.ov.stage(ROWS_TABLE, kb, bytes);
    }

    /// Stages the dot-index entry of `dot` (`None`: removed).
    pub(crate) fn put_dot(&mut self, dot: tidemark_crdts::Dot, kb: Option<&[u8]>) {
        self.ov.stage(DOTS_TABLE, dot_bytes(dot).as_slice(), kb);
    }
}

pub(crate) fn decode_entry(bytes: &[u8], max: usize) -> Result<Entry, StoreError> {
    codec::decode("state row", bytes, max).map_err(|source| StoreError::Codec {
        table: "rows",
        source,
    })
}

/// Whether the dots of `kind`'s entries have dot → key index rows. Counter dots have none:
/// a counter is never deleted, and a counter dot is only ever removed by a later dot of the
/// same replica on the same key, which every delta carries together with that removal (the
/// log's pieces keep them together: [`super::split::split_delta`]), so the join reaches the
/// key through the delta's own entry and never needs the index to find it. That saves a
/// B-tree delete and insert per counter increment.
pub(crate) fn indexed(kind: KeyKind) -> bool {
    kind.deletable()
}

impl Rows for TxnRows<'_, '_> {
    type Error = StoreError;

    fn get(&mut self, key: &Key) -> Result<Option<Entry>, StoreError> {
        Ok(self.entry_at(key_bytes(key).as_slice())?.map(|(e, _)| e))
    }

    fn put(
        &mut self,
        key: &Key,
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) -> Result<(), StoreError> {
        let kb = key_bytes(key);
        // Only the dots that changed touch the index, so updating a large entry (a big set)
        // costs index writes in proportion to the change, not to the entry (DESIGN.md D3).
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
                self.put_dot(*d, None);
            }
        }
        for d in &after {
            if before.binary_search(d).is_err() {
                self.put_dot(*d, Some(kb.as_slice()));
            }
        }
        match new {
            Some(e) => {
                let bytes = codec::encode("state row", e).map_err(|source| StoreError::Codec {
                    table: "rows",
                    source,
                })?;
                if bytes.len() > self.record_bytes_max {
                    return Err(StoreError::TooLarge {
                        what: "state row",
                        len: bytes.len(),
                        limit: self.record_bytes_max,
                    });
                }
                self.put_row(kb.as_slice(), Some(bytes.as_slice()));
            }
            None => self.put_row(kb.as_slice(), None),
        }
        Ok(())
    }

    fn keys_holding(&mut self, dots: &CausalContext) -> Result<Vec<Key>, StoreError> {
        let mut keys = Vec::new();
        for (replica, set) in dots.entries() {
            for &(lo, hi) in set.ranges() {
                let lo_b = dot_key(*replica, lo);
                let hi_b = dot_key(*replica, hi);
                let (lo, hi) = (
                    Bound::Included(lo_b.as_slice()),
                    Bound::Included(hi_b.as_slice()),
                );
                let tab = self
                    .dots
                    .range::<&[u8]>((lo, hi))
                    .map_err(StoreError::redb)?;
                for item in Merged::new(self.ov.range(DOTS_TABLE, lo, hi), table_items(tab)) {
                    let (_, v) = item?;
                    let key = parse_key(&v).ok_or_else(|| {
                        StoreError::Corrupt("dot index names an unreadable key".into())
                    })?;
                    keys.push(key);
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
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
        let tab = self
            .rows
            .range::<&[u8]>((lo_b, hi_b))
            .map_err(StoreError::redb)?;
        for item in Merged::new(self.ov.range(ROWS_TABLE, lo_b, hi_b), table_items(tab)) {
            let (k, _) = item?;
            keys.push(
                parse_key(&k).ok_or_else(|| StoreError::Corrupt("unreadable row key".into()))?,
            );
        }
        Ok(keys)
    }
}
