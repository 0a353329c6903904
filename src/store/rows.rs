//! [`Rows`] and [`KeyRange`] over the tables of one redb write transaction under the
//! write-ahead overlay ([`OvTable`]: reads see the overlay first, writes are staged in it and
//! reach the tables at the next fold), so the lattice crate's join runs against the current
//! rows and dot → key index.

use super::error::StoreError;
use super::overlay::{BytesTable, OvTable};
use super::tables::{dot_bytes, dot_key, key_bytes, parse_key};
use crate::apply::KeyRange;
use crate::codec;
use std::ops::Bound;
use tidemark_crdts::{CausalContext, DotStore, Entry, Key, KeyKind, Rows};

/// The `rows` and `dots` tables of one write transaction, under the overlay.
pub(crate) struct TxnRows<'a, 't> {
    pub(crate) rows: &'a mut OvTable<'t>,
    pub(crate) dots: &'a mut OvTable<'t>,
    pub(crate) record_bytes_max: usize,
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
        match self
            .rows
            .get(key_bytes(key).as_slice())
            .map_err(StoreError::redb)?
        {
            Some(g) => Ok(Some(decode_entry(g.value(), self.record_bytes_max)?)),
            None => Ok(None),
        }
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
                self.dots
                    .remove(dot_bytes(*d).as_slice())
                    .map_err(StoreError::redb)?;
            }
        }
        for d in &after {
            if before.binary_search(d).is_err() {
                self.dots
                    .insert(dot_bytes(*d).as_slice(), kb.as_slice())
                    .map_err(StoreError::redb)?;
            }
        }
        match new {
            Some(e) => {
                let bytes = codec::encode("state row", e).map_err(|source| StoreError::Codec {
                    table: "rows",
                    source,
                })?;
                self.rows
                    .insert(kb.as_slice(), bytes.as_slice())
                    .map_err(StoreError::redb)?;
            }
            None => {
                self.rows.remove(kb.as_slice()).map_err(StoreError::redb)?;
            }
        }
        Ok(())
    }

    fn keys_holding(&mut self, dots: &CausalContext) -> Result<Vec<Key>, StoreError> {
        let mut keys = Vec::new();
        for (replica, set) in dots.entries() {
            for &(lo, hi) in set.ranges() {
                let lo_b = dot_key(*replica, lo);
                let hi_b = dot_key(*replica, hi);
                for item in self
                    .dots
                    .range(lo_b.as_slice()..=hi_b.as_slice())
                    .map_err(StoreError::redb)?
                {
                    let (_, v) = item.map_err(StoreError::redb)?;
                    let key = parse_key(v.value()).ok_or_else(|| {
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
        for item in self
            .rows
            .range::<&[u8]>((lo_b, hi_b))
            .map_err(StoreError::redb)?
        {
            let (k, _) = item.map_err(StoreError::redb)?;
            keys.push(
                parse_key(k.value())
                    .ok_or_else(|| StoreError::Corrupt("unreadable row key".into()))?,
            );
        }
        Ok(keys)
    }
}
