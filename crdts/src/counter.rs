//! State-based counters: `GCounter` (grow-only) and `PNCounter` (increments and decrements).
//!
//! Values saturate at the integer bounds and never wrap, whatever the input (pitfall
//! "counter overflow" of the node's `docs/design/principles.md`).

use crate::Lattice;
use crate::dot::ReplicaId;
/// Per-replica totals in canonical form: no zero total, ascending by replica, and the form
/// chosen by the number of entries (so the derived equality and hashing are those of the
/// entries). The one-entry form (an increment's delta, a counter only one replica writes) keeps
/// its fields in the enum itself: a counter or a delta is 32 bytes and `inc` allocates nothing.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
enum Entries {
    /// The zero counter.
    #[default]
    Zero,
    /// Exactly one replica's total (`n > 0`).
    One { replica: ReplicaId, n: u64 },
    /// Two or more totals, strictly ascending by replica, none zero.
    Many(Vec<(ReplicaId, u64)>),
}

impl Entries {
    /// The canonical form of totals strictly ascending by replica, none zero.
    fn from_sorted(v: Vec<(ReplicaId, u64)>) -> Self {
        match v.as_slice() {
            [] => Entries::Zero,
            [(replica, n)] => Entries::One {
                replica: *replica,
                n: *n,
            },
            _ => Entries::Many(v),
        }
    }

    /// One replica's total (`Zero` for 0).
    #[inline]
    fn one(replica: ReplicaId, n: u64) -> Self {
        if n > 0 {
            Entries::One { replica, n }
        } else {
            Entries::Zero
        }
    }

    fn iter(&self) -> EntriesIter<'_> {
        match self {
            Entries::Zero => EntriesIter::Slice([].iter()),
            Entries::One { replica, n } => EntriesIter::One(Some((*replica, *n))),
            Entries::Many(v) => EntriesIter::Slice(v.iter()),
        }
    }

    fn into_vec(self) -> Vec<(ReplicaId, u64)> {
        match self {
            Entries::Zero => Vec::new(),
            Entries::One { replica, n } => vec![(replica, n)],
            Entries::Many(v) => v,
        }
    }
}

/// The entries of a [`GCounter`], ascending by replica.
enum EntriesIter<'a> {
    One(Option<(ReplicaId, u64)>),
    Slice(core::slice::Iter<'a, (ReplicaId, u64)>),
}

impl Iterator for EntriesIter<'_> {
    type Item = (ReplicaId, u64);
    #[inline]
    fn next(&mut self) -> Option<(ReplicaId, u64)> {
        match self {
            EntriesIter::One(e) => e.take(),
            EntriesIter::Slice(it) => it.next().copied(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self {
            EntriesIter::One(e) => usize::from(e.is_some()),
            EntriesIter::Slice(it) => it.len(),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for EntriesIter<'_> {}

/// A grow-only counter: per replica, the total that replica added; join is the pointwise max.
///
/// Entries are kept sorted by replica, so merges are a linear sorted merge; a counter of at
/// most one replica (and every delta `inc` returns) needs no heap allocation.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct GCounter {
    entries: Entries,
}

/// Prints as the former derive over `entries: Vec<(ReplicaId, u64)>` did.
impl core::fmt::Debug for GCounter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        struct List<'a>(&'a Entries);
        impl core::fmt::Debug for List<'_> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.debug_list().entries(self.0.iter()).finish()
            }
        }
        f.debug_struct("GCounter")
            .field("entries", &List(&self.entries))
            .finish()
    }
}

/// Encoded exactly as the former derive over `entries: Vec<(ReplicaId, u64)>`.
#[cfg(feature = "serde")]
impl serde::Serialize for GCounter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Seq<'a>(&'a Entries);
        impl serde::Serialize for Seq<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter())
            }
        }
        let mut st = s.serialize_struct("GCounter", 1)?;
        st.serialize_field("entries", &Seq(&self.entries))?;
        st.end()
    }
}

/// Decoding accepts only the canonical form (replicas strictly ascending, no zero total): the
/// binary searches and the sorted-merge join rely on it.
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for GCounter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(rename = "GCounter")]
        struct Raw {
            entries: Vec<(ReplicaId, u64)>,
        }
        let entries = Raw::deserialize(d)?.entries;
        if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
            return Err(serde::de::Error::custom(
                "counter replicas are not strictly ascending",
            ));
        }
        if entries.iter().any(|(_, n)| *n == 0) {
            return Err(serde::de::Error::custom("counter holds a zero entry"));
        }
        Ok(Self {
            entries: Entries::from_sorted(entries),
        })
    }
}

impl GCounter {
    /// The zero counter.
    pub fn new() -> Self {
        Self::default()
    }

    /// The counter's value: the saturating sum of every replica's total.
    pub fn value(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |acc, (_, n)| acc.saturating_add(n))
    }

    /// What `replica` has added so far.
    pub fn get(&self, replica: ReplicaId) -> u64 {
        match &self.entries {
            Entries::Zero => 0,
            Entries::One { replica: r, n } => {
                if *r == replica {
                    *n
                } else {
                    0
                }
            }
            Entries::Many(v) => v
                .binary_search_by(|(r, _)| r.cmp(&replica))
                .map_or(0, |i| v[i].1),
        }
    }

    /// Delta-mutator: adds `by` at `replica` (saturating) and returns the delta `{replica ↦ total}`
    /// (the zero counter when the total is 0, i.e. `by == 0` on a replica with no total).
    #[inline]
    pub fn inc(&mut self, replica: ReplicaId, by: u64) -> GCounter {
        let total = match &mut self.entries {
            // Fastest path: a counter only this replica has written.
            Entries::One { replica: r, n } if *r == replica => {
                *n = n.saturating_add(by);
                *n
            }
            Entries::Zero => {
                self.entries = Entries::one(replica, by);
                by
            }
            _ => self.inc_slow(replica, by),
        };
        GCounter {
            entries: Entries::one(replica, total),
        }
    }

    /// `inc` on a counter that holds another replica's total: returns the new total.
    fn inc_slow(&mut self, replica: ReplicaId, by: u64) -> u64 {
        let v = match &mut self.entries {
            Entries::Many(v) => v,
            Entries::One { .. } | Entries::Zero => {
                if by == 0 {
                    // No zero entries: `{r ↦ 0}` and `{}` are the same counter.
                    return self.get(replica);
                }
                let mut v = core::mem::take(&mut self.entries).into_vec();
                let i = v.partition_point(|(r, _)| *r < replica);
                v.insert(i, (replica, by));
                self.entries = Entries::from_sorted(v);
                return by;
            }
        };
        // Fast path: the counter's last entry is this replica's.
        let pos = match v.last() {
            Some((r, _)) if *r == replica => Ok(v.len() - 1),
            _ => v.binary_search_by(|(r, _)| r.cmp(&replica)),
        };
        match pos {
            Ok(i) => {
                let n = &mut v[i].1;
                *n = n.saturating_add(by);
                *n
            }
            Err(i) => {
                if by > 0 {
                    v.insert(i, (replica, by));
                }
                by
            }
        }
    }

    /// The per-replica totals, ascending by replica (no zero total).
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (ReplicaId, u64)> + '_ {
        self.entries.iter()
    }

    /// Builds a counter from per-replica totals in any order (duplicates: max kept).
    pub fn from_entries(entries: impl IntoIterator<Item = (ReplicaId, u64)>) -> Self {
        let mut v: Vec<(ReplicaId, u64)> = entries.into_iter().filter(|(_, n)| *n > 0).collect();
        v.sort_unstable();
        // Sorted by (replica, total): the last of each replica's run is its max.
        let mut out: Vec<(ReplicaId, u64)> = Vec::with_capacity(v.len());
        for (r, n) in v {
            match out.last_mut() {
                Some(last) if last.0 == r => last.1 = n,
                _ => out.push((r, n)),
            }
        }
        GCounter {
            entries: Entries::from_sorted(out),
        }
    }

    /// Redundancy removal: the entries of `delta` larger than ours (`None` if none).
    pub fn inflation(&self, delta: &GCounter) -> Option<GCounter> {
        let entries: Vec<(ReplicaId, u64)> = delta
            .entries
            .iter()
            .filter(|(r, n)| *n > self.get(*r))
            .collect();
        (!entries.is_empty()).then(|| GCounter {
            entries: Entries::from_sorted(entries),
        })
    }
}

impl Lattice for GCounter {
    fn join(&mut self, other: Self) {
        match (&mut self.entries, other.entries) {
            (_, Entries::Zero) => {}
            // One-entry delta on a one-replica counter of the same replica (what `inc` returns).
            (Entries::One { replica: r, n }, Entries::One { replica, n: m }) if *r == replica => {
                *n = (*n).max(m);
            }
            (Entries::Zero, theirs) => self.entries = theirs,
            (Entries::Many(v), Entries::One { replica, n }) => {
                // One-entry delta: update in place.
                match v.binary_search_by(|(x, _)| x.cmp(&replica)) {
                    Ok(i) => v[i].1 = v[i].1.max(n),
                    Err(i) => v.insert(i, (replica, n)),
                }
            }
            (mine, theirs) => {
                let a = core::mem::take(mine).into_vec();
                let b = theirs.into_vec();
                let mut out = Vec::with_capacity(a.len() + b.len());
                let (mut i, mut j) = (0, 0);
                while i < a.len() && j < b.len() {
                    match a[i].0.cmp(&b[j].0) {
                        core::cmp::Ordering::Less => {
                            out.push(a[i]);
                            i += 1;
                        }
                        core::cmp::Ordering::Greater => {
                            out.push(b[j]);
                            j += 1;
                        }
                        core::cmp::Ordering::Equal => {
                            out.push((a[i].0, a[i].1.max(b[j].1)));
                            i += 1;
                            j += 1;
                        }
                    }
                }
                out.extend_from_slice(&a[i..]);
                out.extend_from_slice(&b[j..]);
                // Canonical form: zero entries are bottom, keep none (equality and bytes
                // depend on it; only a hand-built input could hold one).
                out.retain(|(_, n)| *n > 0);
                self.entries = Entries::from_sorted(out);
            }
        }
    }
    fn is_bottom(&self) -> bool {
        self.entries.iter().all(|(_, n)| n == 0)
    }
}

/// A counter that goes up and down: two grow-only counters, `P` for increments and `N` for
/// decrements. The value is `ΣP − ΣN`, saturating to the `i64` range.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PNCounter {
    /// Increments per replica.
    pub p: GCounter,
    /// Decrements per replica.
    pub n: GCounter,
}

impl PNCounter {
    /// The zero counter.
    pub fn new() -> Self {
        Self::default()
    }

    /// `ΣP − ΣN`, saturating to `i64::MIN..=i64::MAX`.
    pub fn value(&self) -> i64 {
        let v = i128::from(self.p.value()) - i128::from(self.n.value());
        i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
    }

    /// Delta-mutator: adds `by` at `replica`.
    #[inline]
    pub fn inc(&mut self, replica: ReplicaId, by: u64) -> PNCounter {
        PNCounter {
            p: self.p.inc(replica, by),
            n: GCounter::new(),
        }
    }

    /// Delta-mutator: subtracts `by` at `replica`.
    #[inline]
    pub fn dec(&mut self, replica: ReplicaId, by: u64) -> PNCounter {
        PNCounter {
            p: GCounter::new(),
            n: self.n.inc(replica, by),
        }
    }

    /// Redundancy removal: the part of `delta` larger than ours (`None` if nothing).
    pub fn inflation(&self, delta: &PNCounter) -> Option<PNCounter> {
        let p = self.p.inflation(&delta.p);
        let n = self.n.inflation(&delta.n);
        (p.is_some() || n.is_some()).then(|| PNCounter {
            p: p.unwrap_or_default(),
            n: n.unwrap_or_default(),
        })
    }
}

impl Lattice for PNCounter {
    fn join(&mut self, other: Self) {
        self.p.join(other.p);
        self.n.join(other.n);
    }
    fn is_bottom(&self) -> bool {
        self.p.is_bottom() && self.n.is_bottom()
    }
}
