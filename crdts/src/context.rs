//! The causal context: the set of dots a replica has seen, in compact canonical form.

use crate::interval::IntervalSet;
use crate::replica::{Dot, ReplicaId};
use std::collections::BTreeMap;

/// A replica's sequence space is used up: its dot `u64::MAX` was already seen, so
/// [`CausalContext::next_dot`] has no fresh dot to give.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DotsExhausted {
    /// The replica whose dots are exhausted.
    pub replica: ReplicaId,
}

impl core::fmt::Display for DotsExhausted {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "replica {} has no dot left (seq {} already seen)",
            self.replica,
            u64::MAX
        )
    }
}

impl std::error::Error for DotsExhausted {}

/// A version vector: for each replica, the contiguous prefix `1..=n` of its dots that were seen.
pub type VersionVector = BTreeMap<ReplicaId, u64>;

/// The set of dots a replica has seen (created, received, or learned were removed).
///
/// Stored as one [`IntervalSet`] per replica: the first range starting at 1 is the version
/// vector entry, the remaining ranges are the "dot cloud". Guarantees: the form is canonical
/// after every mutation (no empty entries, ranges merged), so two contexts holding the same dots
/// are `==` and encode to the same bytes whatever order the dots arrived in.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CausalContext {
    dots: BTreeMap<ReplicaId, IntervalSet>,
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for CausalContext {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Replicas strictly ascending: a duplicate or unsorted replica (one value, several
        // encodings; with a plain map the last duplicate would silently win) is an error.
        #[derive(serde::Deserialize)]
        #[serde(rename = "CausalContext")]
        struct Raw {
            dots: crate::codec::StrictMap<ReplicaId, IntervalSet>,
        }
        let raw = Raw::deserialize(d)?;
        if raw.dots.0.iter().any(|(_, s)| s.is_empty()) {
            return Err(serde::de::Error::custom(
                "causal context holds an empty entry",
            ));
        }
        if raw.dots.0.iter().any(|(_, s)| s.contains(0)) {
            return Err(serde::de::Error::custom(
                "causal context holds sequence number 0",
            ));
        }
        // Sorted input: `collect` builds the tree in bulk.
        Ok(Self {
            dots: raw.dots.0.into_iter().collect(),
        })
    }
}

impl CausalContext {
    /// The empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// A context holding exactly one dot.
    pub fn from_dot(dot: Dot) -> Self {
        let mut c = Self::new();
        c.insert(dot);
        c
    }

    /// A context holding the dots `(replica, lo..=hi)`.
    pub fn from_range(replica: ReplicaId, lo: u64, hi: u64) -> Self {
        let mut c = Self::new();
        c.insert_range(replica, lo, hi);
        c
    }

    /// Does the context hold `dot`?
    pub fn contains(&self, dot: &Dot) -> bool {
        self.dots
            .get(&dot.replica)
            .is_some_and(|s| s.contains(dot.seq))
    }

    /// Adds one dot (seq 0 is not a dot and is ignored); returns true if it was new.
    pub fn insert(&mut self, dot: Dot) -> bool {
        if dot.seq == 0 {
            return false;
        }
        self.dots.entry(dot.replica).or_default().insert(dot.seq)
    }

    /// Adds the dots `(replica, lo..=hi)`; returns true if any was new.
    pub fn insert_range(&mut self, replica: ReplicaId, lo: u64, hi: u64) -> bool {
        let lo = lo.max(1);
        if lo > hi {
            return false;
        }
        self.dots.entry(replica).or_default().insert_range(lo, hi)
    }

    /// `self := self ∪ other`; returns true if `self` grew.
    pub fn join(&mut self, other: &CausalContext) -> bool {
        let mut grew = false;
        for (r, s) in &other.dots {
            match self.dots.get_mut(r) {
                Some(mine) => grew |= mine.union_with(s),
                None => {
                    self.dots.insert(*r, s.clone());
                    grew = true;
                }
            }
        }
        grew
    }

    /// The next dot `replica` should issue: one past the largest of its dots seen.
    ///
    /// Guarantee (DESIGN.md B1, I2): for the local replica its own dots are contiguous, so this is
    /// `vv[replica] + 1`; callers check that with [`CausalContext::own_dots_contiguous`]. The
    /// dot returned was never seen: there is no saturation and no reissue.
    ///
    /// # Errors
    /// [`DotsExhausted`] when the context already holds `(replica, u64::MAX)`: the replica can
    /// issue no more dots (it must take a new replica id).
    pub fn next_dot(&self, replica: ReplicaId) -> Result<Dot, DotsExhausted> {
        let max = self
            .dots
            .get(&replica)
            .and_then(IntervalSet::max)
            .unwrap_or(0);
        max.checked_add(1)
            .map(|seq| Dot::new(replica, seq))
            .ok_or(DotsExhausted { replica })
    }

    /// The largest seq seen from `replica` (0 if none).
    pub fn max_seq(&self, replica: ReplicaId) -> u64 {
        self.dots
            .get(&replica)
            .and_then(IntervalSet::max)
            .unwrap_or(0)
    }

    /// True when `replica`'s dots form one prefix `1..=n` (no cloud): invariant I2 for own dots.
    pub fn own_dots_contiguous(&self, replica: ReplicaId) -> bool {
        self.dots
            .get(&replica)
            .is_none_or(|s| s.ranges().len() == 1 && s.ranges()[0].0 == 1)
    }

    /// `self \ other`: the dots `self` holds that `other` lacks (what a peer at `other` needs).
    pub fn diff(&self, other: &CausalContext) -> CausalContext {
        let mut out = CausalContext::new();
        for (r, s) in &self.dots {
            let d = match other.dots.get(r) {
                Some(o) => s.difference(o),
                None => s.clone(),
            };
            if !d.is_empty() {
                out.dots.insert(*r, d);
            }
        }
        out
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &CausalContext) -> CausalContext {
        let mut out = CausalContext::new();
        for (r, s) in &self.dots {
            if let Some(o) = other.dots.get(r) {
                let i = s.intersection(o);
                if !i.is_empty() {
                    out.dots.insert(*r, i);
                }
            }
        }
        out
    }

    /// `self ⊆ other`.
    pub fn is_subset(&self, other: &CausalContext) -> bool {
        self.dots
            .iter()
            .all(|(r, s)| other.dots.get(r).is_some_and(|o| s.is_subset(o)))
    }

    /// True when the context holds no dot.
    pub fn is_empty(&self) -> bool {
        self.dots.is_empty()
    }

    /// Number of dots held (saturating).
    pub fn len(&self) -> u64 {
        self.dots
            .values()
            .fold(0u64, |acc, s| acc.saturating_add(s.len()))
    }

    /// The version vector part: per replica, the contiguous prefix `1..=n` (replicas with n = 0 omitted).
    pub fn version_vector(&self) -> VersionVector {
        self.dots
            .iter()
            .filter_map(|(r, s)| {
                let n = s.contiguous_prefix();
                (n > 0).then_some((*r, n))
            })
            .collect()
    }

    /// The dot cloud: dots above each replica's contiguous prefix, as a context.
    pub fn cloud(&self) -> CausalContext {
        let mut out = CausalContext::new();
        for (r, s) in &self.dots {
            let n = s.contiguous_prefix();
            let rest = s.difference(&IntervalSet::from_range(1, n));
            if !rest.is_empty() {
                out.dots.insert(*r, rest);
            }
        }
        out
    }

    /// Number of ranges beyond the version vector (0 when the context is a pure version vector).
    pub fn cloud_ranges(&self) -> usize {
        self.dots
            .values()
            .map(|s| s.ranges().len() - usize::from(s.contiguous_prefix() > 0))
            .sum()
    }

    /// A context holding exactly the prefixes of `vv`.
    pub fn from_version_vector(vv: &VersionVector) -> Self {
        let mut c = Self::new();
        for (r, n) in vv {
            c.insert_range(*r, 1, *n);
        }
        c
    }

    /// The per-replica interval sets.
    pub fn entries(&self) -> impl Iterator<Item = (&ReplicaId, &IntervalSet)> {
        self.dots.iter()
    }

    /// The interval set of one replica, if any dot of it is held.
    pub fn get(&self, replica: &ReplicaId) -> Option<&IntervalSet> {
        self.dots.get(replica)
    }

    /// The replicas with at least one dot held.
    pub fn replicas(&self) -> impl Iterator<Item = &ReplicaId> {
        self.dots.keys()
    }

    /// Iterates every dot (expensive on large contexts: prefer [`CausalContext::entries`]).
    pub fn iter_dots(&self) -> impl Iterator<Item = Dot> + '_ {
        self.dots
            .iter()
            .flat_map(|(r, s)| s.iter().map(move |seq| Dot::new(*r, seq)))
    }
}

impl FromIterator<Dot> for CausalContext {
    fn from_iter<I: IntoIterator<Item = Dot>>(iter: I) -> Self {
        let mut c = CausalContext::new();
        for d in iter {
            c.insert(d);
        }
        c
    }
}
