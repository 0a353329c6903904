//! A read abstraction over `&[u8] → &[u8]` tables (step 4 of the storage engine:
//! `docs/design/write-path.md`, "Step 4, as it will be built"): [`KvRead`] answers point lookups and ascending ranges with
//! [`Bytes`], which is either a redb page guard or a slice of an in-memory layer, so a reader
//! can ask redb alone or the overlay merged over redb ([`super::overlay::Merged`]) through
//! one interface, without copying a key or a value.
//!
//! The state tables' read helpers (`store/rows.rs`) read through it; until the write path
//! publishes overlay layers, what they read is a redb table.
#![cfg_attr(
    not(test),
    allow(dead_code, reason = "step 4: the overlay's variants are read once layers are published")
)]

use super::error::StoreError;
use redb::{AccessGuard, ReadableTable};
use std::fmt;
use std::ops::{Bound, Deref};
use std::sync::Arc;

/// Bytes of a key or a value, borrowed for `'a` from wherever they are stored. Dereferencing
/// never copies: a redb guard gives its page's bytes, the other variants the slice they hold.
pub(crate) enum Bytes<'a> {
    /// A key or value inside a redb page (kept alive by the guard).
    Guard(AccessGuard<'a, &'static [u8]>),
    /// A slice borrowed from memory that outlives `'a` (an overlay layer).
    Slice(&'a [u8]),
    /// Shared bytes held by reference count (a value that must outlive its source's borrow).
    Shared(Arc<[u8]>),
}

impl Deref for Bytes<'_> {
    type Target = [u8];

    /// The bytes, without copying them.
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Guard(guard) => guard.value(),
            Bytes::Slice(slice) => slice,
            Bytes::Shared(shared) => shared,
        }
    }
}

impl AsRef<[u8]> for Bytes<'_> {
    /// The bytes, without copying them (as [`Deref`]).
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for Bytes<'_> {
    /// The bytes as a byte slice (whichever variant holds them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// An ascending iterator over `(key, value)` pairs of a range; an `Err` reports a storage
/// failure (the iterator may end after it).
pub(crate) type KvIter<'a> =
    Box<dyn Iterator<Item = Result<(Bytes<'a>, Bytes<'a>), StoreError>> + 'a>;

/// Read access to one `&[u8] → &[u8]` table (or to a view merged over one).
///
/// Ranges are ascending only: no reader of `rows`, `elems` or `dots` iterates backwards, and a
/// backwards merge over the overlay is left until one does.
pub(crate) trait KvRead {
    /// The value stored under `key`, if any.
    ///
    /// # Errors
    /// [`StoreError::Redb`] when the underlying table cannot be read.
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Bytes<'_>>, StoreError>;

    /// Every `(key, value)` with `lo ≤ key ≤ hi` (each bound as given: included, excluded or
    /// unbounded), in ascending key order, each key once. Bounds that contain no key (`lo`
    /// above `hi`, or equal with one excluded) give an empty iterator, never a panic.
    ///
    /// # Errors
    /// [`StoreError::Redb`] when the range cannot be opened; later failures come as items.
    fn range_bytes<'a>(
        &'a self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> Result<KvIter<'a>, StoreError>;
}

/// True when no key lies between `lo` and `hi` because of the bounds themselves (`lo` above
/// `hi`, or `lo == hi` with either excluded). Such bounds make `BTreeMap::range` panic and
/// slice ranges invalid, so every range here checks them first.
pub(crate) fn bounds_empty(lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> bool {
    match (lo, hi) {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
        (Bound::Unbounded, _) | (_, Bound::Unbounded) => false,
    }
}

/// True when `key` lies within `lo` and `hi`.
pub(crate) fn in_bounds(key: &[u8], lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> bool {
    let above = match lo {
        Bound::Included(a) => key >= a,
        Bound::Excluded(a) => key > a,
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(b) => key <= b,
        Bound::Excluded(b) => key < b,
        Bound::Unbounded => true,
    };
    above && below
}

/// Every redb byte table reads through [`KvRead`]: read-only tables of a read transaction and
/// the tables of a write transaction (which see that transaction's own writes). Keys and
/// values stay in redb's pages ([`Bytes::Guard`]).
impl<T: ReadableTable<&'static [u8], &'static [u8]>> KvRead for T {
    fn get_bytes(&self, key: &[u8]) -> Result<Option<Bytes<'_>>, StoreError> {
        Ok(self.get(key).map_err(StoreError::redb)?.map(Bytes::Guard))
    }

    fn range_bytes<'a>(
        &'a self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
    ) -> Result<KvIter<'a>, StoreError> {
        if bounds_empty(lo, hi) {
            return Ok(Box::new(std::iter::empty()));
        }
        let range = self
            .range::<&[u8]>((lo, hi))
            .map_err(StoreError::redb)?;
        Ok(Box::new(range.map(|item| {
            item.map(|(k, v)| (Bytes::Guard(k), Bytes::Guard(v)))
                .map_err(StoreError::redb)
        })))
    }
}
