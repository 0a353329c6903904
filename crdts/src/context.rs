//! The causal context: the set of dots a replica has seen, in compact canonical form.

use crate::dot::{Dot, ReplicaId};
use crate::interval::IntervalSet;
use smallvec::SmallVec;
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

/// The per-replica entries of a context, strictly ascending by replica. One replica is kept
/// inline (a delta's context usually names one replica), so such a context does not allocate.
type Entries = SmallVec<[(ReplicaId, IntervalSet); 1]>;

/// The set of dots a replica has seen (created, received, or learned were removed).
///
/// Stored as one [`IntervalSet`] per replica: the first range starting at 1 is the version
/// vector entry, the remaining ranges are the "dot cloud". Guarantees: the form is canonical
/// after every mutation (no empty entries, ranges merged), so two contexts holding the same dots
/// are `==` and encode to the same bytes whatever order the dots arrived in. A context of one
/// replica whose dots form one range (one dot, or a version-vector prefix) needs no heap
/// allocation.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct CausalContext {
    /// Strictly ascending by replica, no empty set.
    dots: Entries,
}

impl core::fmt::Debug for CausalContext {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        struct AsMap<'a>(&'a Entries);
        impl core::fmt::Debug for AsMap<'_> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.debug_map()
                    .entries(self.0.iter().map(|(r, s)| (r, s)))
                    .finish()
            }
        }
        f.debug_struct("CausalContext")
            .field("dots", &AsMap(&self.dots))
            .finish()
    }
}

/// Encoded exactly as the former derive over `dots: BTreeMap<ReplicaId, IntervalSet>`: a
/// struct with one field holding a map ascending by replica.
#[cfg(feature = "serde")]
impl serde::Serialize for CausalContext {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct AsMap<'a>(&'a Entries);
        impl serde::Serialize for AsMap<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(r, set)| (r, set)))
            }
        }
        let mut st = s.serialize_struct("CausalContext", 1)?;
        st.serialize_field("dots", &AsMap(&self.dots))?;
        st.end()
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for CausalContext {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Replicas strictly ascending: a duplicate or unsorted replica (one value, several
        // encodings; with a plain map the last duplicate would silently win) is an error.
        #[derive(serde::Deserialize)]
        #[serde(rename = "CausalContext")]
        struct Raw {
            dots: crate::strict_map::StrictMap<ReplicaId, IntervalSet>,
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
        // Strictly ascending already (checked by `StrictMap`).
        Ok(Self {
            dots: Entries::from_vec(raw.dots.0),
        })
    }
}

impl CausalContext {
    /// The empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// The position of `replica`'s entry, or where it would be inserted.
    #[inline]
    fn find(&self, replica: &ReplicaId) -> Result<usize, usize> {
        let slice = self.dots.as_slice();
        // One-entry fast path (deltas, single-replica stores).
        if let [(r, _)] = slice {
            return match r.cmp(replica) {
                core::cmp::Ordering::Equal => Ok(0),
                core::cmp::Ordering::Less => Err(1),
                core::cmp::Ordering::Greater => Err(0),
            };
        }
        slice.binary_search_by(|(r, _)| r.cmp(replica))
    }

    /// The interval set of `replica`, created empty if absent (callers insert into it at once).
    fn entry(&mut self, replica: ReplicaId) -> &mut IntervalSet {
        let i = match self.find(&replica) {
            Ok(i) => i,
            Err(i) => {
                self.dots.insert(i, (replica, IntervalSet::new()));
                i
            }
        };
        // `i` is in range: found, or just inserted there.
        &mut self.dots.as_mut_slice()[i].1
    }

    /// A context holding exactly one dot (no heap allocation).
    #[inline]
    pub fn from_dot(dot: Dot) -> Self {
        if dot.seq == 0 {
            return Self::new();
        }
        Self {
            dots: Entries::from_buf([(dot.replica, IntervalSet::from_range(dot.seq, dot.seq))]),
        }
    }

    /// A context holding the dots `(replica, lo..=hi)`.
    pub fn from_range(replica: ReplicaId, lo: u64, hi: u64) -> Self {
        let mut c = Self::new();
        c.insert_range(replica, lo, hi);
        c
    }

    /// Does the context hold `dot`?
    #[inline]
    pub fn contains(&self, dot: &Dot) -> bool {
        self.get(&dot.replica).is_some_and(|s| s.contains(dot.seq))
    }

    /// Adds one dot (seq 0 is not a dot and is ignored); returns true if it was new.
    #[inline]
    pub fn insert(&mut self, dot: Dot) -> bool {
        if dot.seq == 0 {
            return false;
        }
        // Fast path: a one-replica context (a delta, a single-writer state) of that replica.
        if let [(r, s)] = self.dots.as_mut_slice() {
            if *r == dot.replica {
                return s.insert(dot.seq);
            }
        }
        self.entry(dot.replica).insert(dot.seq)
    }

    /// Adds the dots `(replica, lo..=hi)`; returns true if any was new.
    pub fn insert_range(&mut self, replica: ReplicaId, lo: u64, hi: u64) -> bool {
        let lo = lo.max(1);
        if lo > hi {
            return false;
        }
        self.entry(replica).insert_range(lo, hi)
    }

    /// `self := self ∪ other`; returns true if `self` grew.
    pub fn join(&mut self, other: &CausalContext) -> bool {
        if other.dots.len() <= 4 || self.dots.is_empty() {
            // Few replicas on the other side (a delta): one lookup each.
            let mut grew = false;
            for (r, s) in &other.dots {
                match self.find(r) {
                    Ok(i) => grew |= self.dots[i].1.union_with(s),
                    Err(i) => {
                        self.dots.insert(i, (*r, s.clone()));
                        grew = true;
                    }
                }
            }
            return grew;
        }
        // Many replicas: one sorted merge of the two entry lists.
        let mine = core::mem::take(&mut self.dots);
        let mut out = Entries::with_capacity(mine.len().max(other.dots.len()));
        let mut grew = false;
        let mut b = other.dots.iter().peekable();
        for (r, mut s) in mine {
            while let Some((r2, s2)) = b.next_if(|(r2, _)| *r2 < r) {
                out.push((*r2, s2.clone()));
                grew = true;
            }
            if let Some((_, s2)) = b.next_if(|(r2, _)| *r2 == r) {
                grew |= s.union_with(s2);
            }
            out.push((r, s));
        }
        for (r2, s2) in b {
            out.push((*r2, s2.clone()));
            grew = true;
        }
        self.dots = out;
        grew
    }

    /// The next dot `replica` should issue: one past the largest of its dots seen.
    ///
    /// Guarantee ("own dots contiguous", `docs/design/principles.md` "Causal context"): for the
    /// local replica its own dots are contiguous, so this is `vv[replica] + 1`; callers check that
    /// with [`CausalContext::own_dots_contiguous`]. The dot returned was never seen: there is no
    /// saturation and no reissue.
    ///
    /// # Errors
    /// [`DotsExhausted`] when the context already holds `(replica, u64::MAX)`: the replica can
    /// issue no more dots (it must take a new replica id).
    #[inline]
    pub fn next_dot(&self, replica: ReplicaId) -> Result<Dot, DotsExhausted> {
        let max = self.max_seq(replica);
        max.checked_add(1)
            .map(|seq| Dot::new(replica, seq))
            .ok_or(DotsExhausted { replica })
    }

    /// Issues `replica`'s next dot and adds it: [`Self::next_dot`] then [`Self::insert`] in
    /// one lookup of the replica (a mutator's first step).
    ///
    /// # Errors
    /// [`DotsExhausted`] as [`Self::next_dot`]; the context is unchanged.
    #[inline]
    pub(crate) fn issue_dot(&mut self, replica: ReplicaId) -> Result<Dot, DotsExhausted> {
        let seq = match self.find(&replica) {
            Ok(i) => self.dots.as_mut_slice()[i].1.push_next(),
            Err(i) => {
                self.dots
                    .insert(i, (replica, IntervalSet::from_range(1, 1)));
                Some(1)
            }
        };
        seq.map(|seq| Dot::new(replica, seq))
            .ok_or(DotsExhausted { replica })
    }

    /// The largest seq seen from `replica` (0 if none).
    #[inline]
    pub fn max_seq(&self, replica: ReplicaId) -> u64 {
        self.get(&replica).and_then(IntervalSet::max).unwrap_or(0)
    }

    /// True when `replica`'s dots form one prefix `1..=n` (no cloud): invariant I2 for own dots.
    pub fn own_dots_contiguous(&self, replica: ReplicaId) -> bool {
        self.get(&replica)
            .is_none_or(|s| s.ranges().len() == 1 && s.ranges()[0].0 == 1)
    }

    /// `self \ other`: the dots `self` holds that `other` lacks (what a peer at `other` needs).
    pub fn diff(&self, other: &CausalContext) -> CausalContext {
        let mut out = CausalContext::new();
        for (r, s) in &self.dots {
            let d = match other.get(r) {
                Some(o) => s.difference(o),
                None => s.clone(),
            };
            if !d.is_empty() {
                // Ascending: `self.dots` is.
                out.dots.push((*r, d));
            }
        }
        out
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &CausalContext) -> CausalContext {
        let mut out = CausalContext::new();
        for (r, s) in &self.dots {
            if let Some(o) = other.get(r) {
                let i = s.intersection(o);
                if !i.is_empty() {
                    out.dots.push((*r, i));
                }
            }
        }
        out
    }

    /// `self ⊆ other`.
    pub fn is_subset(&self, other: &CausalContext) -> bool {
        self.dots
            .iter()
            .all(|(r, s)| other.get(r).is_some_and(|o| s.is_subset(o)))
    }

    /// True when the context holds no dot.
    pub fn is_empty(&self) -> bool {
        self.dots.is_empty()
    }

    /// Number of dots held (saturating).
    pub fn len(&self) -> u64 {
        self.dots
            .iter()
            .fold(0u64, |acc, (_, s)| acc.saturating_add(s.len()))
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
                out.dots.push((*r, rest));
            }
        }
        out
    }

    /// Number of ranges beyond the version vector (0 when the context is a pure version vector).
    pub fn cloud_ranges(&self) -> usize {
        self.dots
            .iter()
            .map(|(_, s)| s.ranges().len() - usize::from(s.contiguous_prefix() > 0))
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
        self.dots.iter().map(|(r, s)| (r, s))
    }

    /// The interval set of one replica, if any dot of it is held.
    #[inline]
    pub fn get(&self, replica: &ReplicaId) -> Option<&IntervalSet> {
        let i = self.find(replica).ok()?;
        self.dots.as_slice().get(i).map(|(_, s)| s)
    }

    /// The replicas with at least one dot held.
    pub fn replicas(&self) -> impl Iterator<Item = &ReplicaId> {
        self.dots.iter().map(|(r, _)| r)
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
