//! State-based counters: `GCounter` (grow-only) and `PNCounter` (increments and decrements).
//!
//! Values saturate at the integer bounds and never wrap, whatever the input (pitfall
//! "counter overflow" of the node's `docs/design/principles.md`).

use crate::Lattice;
use crate::dot::ReplicaId;
use smallvec::SmallVec;

/// Per-replica totals, ascending by replica; one entry (an increment's delta, a counter only
/// one replica writes) is kept inline, so `inc` allocates nothing.
type Entries = SmallVec<[(ReplicaId, u64); 1]>;

/// A grow-only counter: per replica, the total that replica added; join is the pointwise max.
///
/// Entries are kept sorted by replica in a vector, so merges are a linear sorted merge.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
pub struct GCounter {
    entries: Entries,
}

/// Encoded exactly as the former derive over `entries: Vec<(ReplicaId, u64)>`.
#[cfg(feature = "serde")]
impl serde::Serialize for GCounter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("GCounter", 1)?;
        st.serialize_field("entries", self.entries.as_slice())?;
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
            entries: Entries::from_vec(entries),
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
            .fold(0u64, |acc, (_, n)| acc.saturating_add(*n))
    }

    /// What `replica` has added so far.
    pub fn get(&self, replica: ReplicaId) -> u64 {
        self.entries
            .binary_search_by(|(r, _)| r.cmp(&replica))
            .map_or(0, |i| self.entries[i].1)
    }

    /// Delta-mutator: adds `by` at `replica` (saturating) and returns the delta `{replica ↦ total}`.
    #[inline]
    pub fn inc(&mut self, replica: ReplicaId, by: u64) -> GCounter {
        // Fastest path: a counter only this replica has written (one inline entry, never 0).
        if let [(r, n)] = self.entries.as_mut_slice() {
            if *r == replica && *n > 0 {
                *n = n.saturating_add(by);
                return GCounter {
                    entries: Entries::from_buf([(replica, *n)]),
                };
            }
        }
        // One look at the slice (the inline/heap check once). Fast path: the counter's only
        // (or last) entry is this replica's.
        let slice = self.entries.as_mut_slice();
        let pos = match slice.last() {
            Some((r, _)) if *r == replica => Ok(slice.len() - 1),
            _ => slice.binary_search_by(|(r, _)| r.cmp(&replica)),
        };
        let total = match pos {
            Ok(i) => {
                let n = &mut slice[i].1;
                *n = n.saturating_add(by);
                *n
            }
            Err(i) => {
                // No zero entries: `{r ↦ 0}` and `{}` are the same counter (canonical form).
                if by > 0 {
                    self.entries.insert(i, (replica, by));
                }
                by
            }
        };
        GCounter {
            entries: if total > 0 {
                Entries::from_buf([(replica, total)])
            } else {
                Entries::new()
            },
        }
    }

    /// The per-replica totals, ascending by replica.
    pub fn entries(&self) -> &[(ReplicaId, u64)] {
        &self.entries
    }

    /// Builds a counter from per-replica totals in any order (duplicates: max kept).
    pub fn from_entries(entries: impl IntoIterator<Item = (ReplicaId, u64)>) -> Self {
        let mut c = GCounter::new();
        for (r, n) in entries {
            let mut one = Entries::new();
            one.push((r, n));
            c.join(GCounter { entries: one });
        }
        c
    }

    /// Redundancy removal: the entries of `delta` larger than ours (`None` if none).
    pub fn inflation(&self, delta: &GCounter) -> Option<GCounter> {
        let entries: Entries = delta
            .entries
            .iter()
            .filter(|(r, n)| *n > self.get(*r))
            .copied()
            .collect();
        (!entries.is_empty()).then_some(GCounter { entries })
    }
}

impl Lattice for GCounter {
    fn join(&mut self, other: Self) {
        if other.entries.is_empty() {
            return;
        }
        if let [(r, n)] = other.entries.as_slice() {
            // One-entry delta (what `inc` returns): update in place, no new vector.
            match self.entries.binary_search_by(|(x, _)| x.cmp(r)) {
                Ok(i) => self.entries[i].1 = self.entries[i].1.max(*n),
                // Canonical form: a zero entry is bottom and is not stored.
                Err(i) if *n > 0 => self.entries.insert(i, (*r, *n)),
                Err(_) => {}
            }
            return;
        }
        let mine = core::mem::take(&mut self.entries);
        let mut out = Entries::with_capacity(mine.len().max(other.entries.len()));
        let (mut i, mut j) = (0, 0);
        let b = other.entries;
        while i < mine.len() && j < b.len() {
            match mine[i].0.cmp(&b[j].0) {
                core::cmp::Ordering::Less => {
                    out.push(mine[i]);
                    i += 1;
                }
                core::cmp::Ordering::Greater => {
                    out.push(b[j]);
                    j += 1;
                }
                core::cmp::Ordering::Equal => {
                    out.push((mine[i].0, mine[i].1.max(b[j].1)));
                    i += 1;
                    j += 1;
                }
            }
        }
        out.extend_from_slice(&mine[i..]);
        out.extend_from_slice(&b[j..]);
        // Canonical form: zero entries are bottom, keep none (equality and bytes depend on it).
        out.retain(|(_, n)| *n > 0);
        self.entries = out;
    }
    fn is_bottom(&self) -> bool {
        self.entries.iter().all(|(_, n)| *n == 0)
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
    pub fn inc(&mut self, replica: ReplicaId, by: u64) -> PNCounter {
        PNCounter {
            p: self.p.inc(replica, by),
            n: GCounter::new(),
        }
    }

    /// Delta-mutator: subtracts `by` at `replica`.
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
