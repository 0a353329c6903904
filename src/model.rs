//! The replicated data model shared by every layer: the delta that replicas exchange and log.

use tidemark_crdts::{CausalContext, DedupMarks, Dot, DotStore, Key, StoreDelta};

/// What replicas exchange, log and join: a store delta plus the ingest dedup marks it carries.
///
/// Guarantee: joining is idempotent, commutative and associative (both parts are lattices), so
/// deltas may be delivered in any order and any number of times.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Delta {
    /// The keyed entries and their shared causal context.
    pub state: StoreDelta,
    /// Dedup marks of the events whose effects the delta carries.
    pub marks: DedupMarks,
}

impl Delta {
    /// True when the delta carries nothing.
    pub fn is_empty(&self) -> bool {
        self.state.store.is_bottom() && self.state.ctx.is_empty() && self.marks.is_empty()
    }

    /// Joins `other` into `self` (used to coalesce log entries into one interval).
    pub fn join(&mut self, other: Delta) {
        self.state.join(other.state);
        self.marks.join(&other.marks);
    }

    /// The dots this delta's context holds.
    pub fn context(&self) -> &CausalContext {
        &self.state.ctx
    }
}

/// A chunk of a state transfer (DESIGN.md C4, state-driven sync), covering the key range
/// `(after, upto]` (`None` bounds are open).
///
/// Guarantee (pitfall #4): a chunk's removals apply only to keys inside its range, and the
/// transfer's context is joined as a whole only by the final chunk, once every earlier chunk of
/// the transfer was applied; so a lost chunk can never delete live dots it did not carry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StateChunk {
    /// The exclusive lower bound of the range (`None`: from the first key).
    pub after: Option<Key>,
    /// The inclusive upper bound of the range (`None`: to the last key).
    pub upto: Option<Key>,
    /// Every entry the sender holds in the range.
    pub entries: Vec<(Key, tidemark_crdts::Entry)>,
    /// The sender's context when the transfer started (every chunk reflects at least it).
    pub ctx: CausalContext,
    /// Dedup marks: a page of the sender's marks (pages follow the last rows, so marks never
    /// precede the effects they mark in a transfer).
    pub marks: DedupMarks,
    /// True for the final chunk of a transfer.
    pub last: bool,
    /// `Some`: the chunk joins the keys of its range only within this slice of dot space — the
    /// sender split a row too large for one message across chunks, each carrying the row's
    /// dots in one slice (issue 11, 2d). Dots of the range outside the slice are untouched,
    /// so a partial row never deletes dots it did not carry.
    pub dots: Option<DotSlice>,
}

/// A slice `(after, upto]` of dot space, ordered by `(replica, seq)` (`None` bounds are open).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DotSlice {
    /// Exclusive lower bound.
    pub after: Option<Dot>,
    /// Inclusive upper bound.
    pub upto: Option<Dot>,
}

impl DotSlice {
    /// Does the slice hold `dot`?
    pub fn contains(&self, dot: &Dot) -> bool {
        self.after.is_none_or(|a| *dot > a) && self.upto.is_none_or(|u| *dot <= u)
    }

    /// The dots of `ctx` inside the slice.
    pub fn clip(&self, ctx: &CausalContext) -> CausalContext {
        let mut out = CausalContext::new();
        for (replica, set) in ctx.entries() {
            let lo = match self.after {
                Some(a) if a.replica > *replica => continue,
                Some(a) if a.replica == *replica => a.seq.saturating_add(1),
                _ => 1,
            };
            let hi = match self.upto {
                Some(u) if u.replica < *replica => continue,
                Some(u) if u.replica == *replica => u.seq,
                _ => u64::MAX,
            };
            if lo > hi {
                continue;
            }
            for &(a, b) in set.ranges() {
                let (a, b) = (a.max(lo), b.min(hi));
                if a <= b {
                    out.insert_range(*replica, a, b);
                }
            }
        }
        out
    }

    /// True when the slice holds no dot at all.
    pub fn is_empty(&self) -> bool {
        match (self.after, self.upto) {
            (Some(a), Some(u)) => a >= u,
            _ => false,
        }
    }
}
