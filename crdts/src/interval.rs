//! A set of `u64` kept as sorted, disjoint, non-adjacent inclusive ranges.
//!
//! Used for causal contexts (per replica) and for ingest dedup marks (per source). The
//! representation is canonical: two sets with the same members have the same ranges, so
//! equality, hashing and encoded bytes do not depend on insertion order.

use smallvec::SmallVec;

/// The ranges of a set: one range is kept inline (no heap allocation), which is the usual
/// shape of a context entry (a version-vector prefix `1..=n`) and of a delta's single dot.
type Ranges = SmallVec<[(u64, u64); 1]>;

/// A canonical set of `u64` values stored as ranges.
///
/// Invariant: `ranges` is sorted, each `(lo, hi)` has `lo <= hi`, and consecutive ranges are
/// separated by at least one missing value (`prev.hi + 1 < next.lo`). A set of at most one
/// range lives inline, without a heap allocation.
#[derive(Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct IntervalSet {
    ranges: Ranges,
}

/// Encoded exactly as the former derive over `ranges: Vec<(u64, u64)>`: a struct with one
/// field holding the sequence of ranges.
#[cfg(feature = "serde")]
impl serde::Serialize for IntervalSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("IntervalSet", 1)?;
        st.serialize_field("ranges", self.ranges.as_slice())?;
        st.end()
    }
}

impl core::fmt::Debug for IntervalSet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries(self.ranges.iter().map(|(a, b)| a..=b))
            .finish()
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for IntervalSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Raw {
            ranges: Vec<(u64, u64)>,
        }
        let raw = Raw::deserialize(d)?;
        Self::from_ranges(raw.ranges)
            .ok_or_else(|| serde::de::Error::custom("interval set is not canonical"))
    }
}

impl IntervalSet {
    /// The empty set.
    pub fn new() -> Self {
        Self {
            ranges: SmallVec::new(),
        }
    }

    /// Builds a set from ranges that must already be canonical; `None` if they are not
    /// (unsorted, overlapping, adjacent or inverted). Decoders use this to reject bad input.
    pub fn from_ranges(ranges: Vec<(u64, u64)>) -> Option<Self> {
        for (i, &(lo, hi)) in ranges.iter().enumerate() {
            if lo > hi {
                return None;
            }
            if i > 0 {
                let prev_hi = ranges[i - 1].1;
                if prev_hi.saturating_add(1) >= lo {
                    return None;
                }
            }
        }
        Some(Self {
            ranges: Ranges::from_vec(ranges),
        })
    }

    /// The set `{lo..=hi}` (empty when `lo > hi`).
    #[inline]
    pub fn from_range(lo: u64, hi: u64) -> Self {
        if lo > hi {
            Self::new()
        } else {
            Self {
                ranges: Ranges::from_buf([(lo, hi)]),
            }
        }
    }

    /// The canonical ranges, ascending.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// True when no value is in the set.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Number of values in the set (saturating at `u64::MAX`).
    pub fn len(&self) -> u64 {
        self.ranges.iter().fold(0u64, |acc, (lo, hi)| {
            acc.saturating_add(hi - lo).saturating_add(1)
        })
    }

    /// The largest value, if any.
    #[inline]
    pub fn max(&self) -> Option<u64> {
        self.ranges.last().map(|r| r.1)
    }

    /// Adds `max + 1` (1 when empty) by extending the last range, and returns it; `None`, and
    /// no change, when `u64::MAX` is in the set.
    #[inline]
    pub(crate) fn push_next(&mut self) -> Option<u64> {
        match self.ranges.last_mut() {
            Some(last) => {
                last.1 = last.1.checked_add(1)?;
                Some(last.1)
            }
            None => {
                self.ranges.push((1, 1));
                Some(1)
            }
        }
    }

    /// The contiguous prefix `1..=n` as `n` (0 when 1 is missing): the version-vector part.
    pub fn contiguous_prefix(&self) -> u64 {
        match self.ranges.first() {
            Some(&(lo, hi)) if lo <= 1 => hi,
            _ => 0,
        }
    }

    /// Index of the first range whose `hi >= v`.
    #[inline]
    fn search(&self, v: u64) -> usize {
        self.ranges.partition_point(|&(_, hi)| hi < v)
    }

    /// Is `v` in the set? O(log ranges).
    #[inline]
    pub fn contains(&self, v: u64) -> bool {
        let i = self.search(v);
        i < self.ranges.len() && self.ranges[i].0 <= v
    }

    /// Are all of `lo..=hi` in the set?
    pub fn contains_range(&self, lo: u64, hi: u64) -> bool {
        if lo > hi {
            return true;
        }
        let i = self.search(lo);
        i < self.ranges.len() && self.ranges[i].0 <= lo && self.ranges[i].1 >= hi
    }

    /// Adds one value; returns true if it was new.
    #[inline]
    pub fn insert(&mut self, v: u64) -> bool {
        // Fast path: appending right after the last range (the common case for own dots).
        if let Some(last) = self.ranges.last_mut() {
            if last.1 != u64::MAX && last.1 + 1 == v {
                last.1 = v;
                return true;
            }
            if last.1 < v {
                self.ranges.push((v, v));
                return true;
            }
        } else {
            self.ranges.push((v, v));
            return true;
        }
        // Fast path: just below the first range (an older dot joining a context of newer ones).
        if let Some(first) = self.ranges.first_mut() {
            if v < first.0 {
                if v + 1 == first.0 {
                    first.0 = v;
                } else {
                    self.ranges.insert(0, (v, v));
                }
                return true;
            }
        }
        if self.contains(v) {
            return false;
        }
        self.insert_range(v, v);
        true
    }

    /// Adds `lo..=hi`; returns true if any value was new.
    pub fn insert_range(&mut self, lo: u64, hi: u64) -> bool {
        if lo > hi || self.contains_range(lo, hi) {
            return false;
        }
        // First range that touches or follows [lo, hi] (adjacent counts as touching).
        let start = self
            .ranges
            .partition_point(|&(_, h)| h.saturating_add(1) < lo);
        let mut end = start;
        let mut new_lo = lo;
        let mut new_hi = hi;
        while end < self.ranges.len() && self.ranges[end].0 <= hi.saturating_add(1) {
            new_lo = new_lo.min(self.ranges[end].0);
            new_hi = new_hi.max(self.ranges[end].1);
            end += 1;
        }
        if start == end {
            self.ranges.insert(start, (new_lo, new_hi));
        } else {
            self.ranges[start] = (new_lo, new_hi);
            self.ranges.drain(start + 1..end);
        }
        true
    }

    /// `self := self ∪ other`; returns true if `self` grew.
    pub fn union_with(&mut self, other: &IntervalSet) -> bool {
        if other.ranges.is_empty() {
            return false;
        }
        if self.ranges.is_empty() {
            self.ranges = other.ranges.clone();
            return true;
        }
        // Common single-range case (two version-vector prefixes, or a prefix and the next
        // dots): merge in place when the ranges touch.
        if let ([mine], [theirs]) = (self.ranges.as_mut_slice(), other.ranges.as_slice()) {
            if mine.1.saturating_add(1) >= theirs.0 && theirs.1.saturating_add(1) >= mine.0 {
                let merged = (mine.0.min(theirs.0), mine.1.max(theirs.1));
                let grew = merged != *mine;
                *mine = merged;
                return grew;
            }
        }
        let mut out = Ranges::with_capacity(self.ranges.len() + other.ranges.len());
        let (mut i, mut j) = (0, 0);
        let a = &self.ranges;
        let b = &other.ranges;
        while i < a.len() || j < b.len() {
            let next = if j >= b.len() || (i < a.len() && a[i].0 <= b[j].0) {
                i += 1;
                a[i - 1]
            } else {
                j += 1;
                b[j - 1]
            };
            match out.last_mut() {
                Some(last) if last.1.saturating_add(1) >= next.0 => last.1 = last.1.max(next.1),
                _ => out.push(next),
            }
        }
        let grew = out != self.ranges;
        self.ranges = out;
        grew
    }

    /// `self \ other` as a new set.
    pub fn difference(&self, other: &IntervalSet) -> IntervalSet {
        let mut out = Ranges::new();
        let b = &other.ranges;
        let mut j = 0;
        for &(lo, hi) in &self.ranges {
            let mut cur = lo;
            while j < b.len() && b[j].1 < cur {
                j += 1;
            }
            let mut k = j;
            let mut done = false;
            while k < b.len() && b[k].0 <= hi {
                if b[k].0 > cur {
                    out.push((cur, b[k].0 - 1));
                }
                if b[k].1 >= hi {
                    done = true;
                    break;
                }
                cur = b[k].1 + 1;
                k += 1;
            }
            if !done && cur <= hi {
                out.push((cur, hi));
            }
        }
        IntervalSet { ranges: out }
    }

    /// `self ∩ other` as a new set.
    pub fn intersection(&self, other: &IntervalSet) -> IntervalSet {
        let mut out = Ranges::new();
        let (a, b) = (&self.ranges, &other.ranges);
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            let lo = a[i].0.max(b[j].0);
            let hi = a[i].1.min(b[j].1);
            if lo <= hi {
                out.push((lo, hi));
            }
            if a[i].1 < b[j].1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        IntervalSet { ranges: out }
    }

    /// Is every value of `self` in `other`?
    pub fn is_subset(&self, other: &IntervalSet) -> bool {
        self.ranges
            .iter()
            .all(|&(lo, hi)| other.contains_range(lo, hi))
    }

    /// Iterates every value (use with care on large ranges).
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().flat_map(|&(lo, hi)| lo..=hi)
    }
}
