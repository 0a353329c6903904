//! Size bounds by construction (ARCHITECTURE.md, "size invariants"): what the store writes to its
//! log, and what it reads for a state transfer, is cut into pieces that each fit one replication
//! message.
//!
//! Every piece is itself a valid delta (its store's dots are in its context) and the join of
//! the pieces is the whole: entries are split by dots, and a piece's context names only the
//! dots it carries plus removals, so applying some pieces never deletes a dot another piece
//! carries.

use crate::codec::{self, CodecError};
use crate::model::{Delta, MARK_OVERHEAD_BYTES, RANGE_BYTES, marks_bytes};
use crate::store::LocalWrite;
use tidemark_crdts::{CausalContext, DedupMarks, Dot, DotStore, Entry, IntervalSet, Key, Mutation};

/// Bytes an op adds to a log record besides its key name and payload (kind, dot, timestamp,
/// its context dots, varints); deliberately generous.
pub(crate) const OP_OVERHEAD_BYTES: usize = 96;

/// An upper estimate of the bytes a local write adds to a log record (what
/// [`crate::ops`] checks against `message_bytes_target` before accepting a write, and what the
/// commit group uses to cut its records).
pub fn write_bytes_estimate(w: &LocalWrite) -> usize {
    let ops: usize = w
        .ops
        .iter()
        .map(|(k, m)| {
            let payload = match m {
                Mutation::Add(t) | Mutation::Remove(t) | Mutation::Set(t) => t.len(),
                _ => 0,
            };
            k.name.len() + payload + OP_OVERHEAD_BYTES
        })
        .sum();
    let mark = w
        .event
        .as_ref()
        .map_or(0, |e| e.stream.len() + e.source.len() + MARK_OVERHEAD_BYTES);
    ops + mark
}

/// The dots of `entry`, ascending.
fn sorted_dots(entry: &Entry) -> Vec<Dot> {
    let mut dots = Vec::new();
    entry.for_each_dot(&mut |d| dots.push(d));
    dots.sort_unstable();
    dots
}

/// `entry` restricted to the dots in `keep` (ascending, a run of `all`).
pub(crate) fn restrict(entry: &Entry, all: &CausalContext, keep: &[Dot]) -> Entry {
    let kept: CausalContext = keep.iter().copied().collect();
    entry.unseen_by(&all.diff(&kept))
}

/// Splits `entry` (of `size` encoded bytes) into parts of about `budget` bytes by runs of its
/// dots in ascending order. Each part is returned with the last dot it holds. The parts are
/// disjoint and their union is `entry`.
pub(crate) fn split_entry(entry: &Entry, size: usize, budget: usize) -> Vec<(Entry, Dot)> {
    let dots = sorted_dots(entry);
    if dots.is_empty() {
        return Vec::new();
    }
    let per = (dots.len().saturating_mul(budget.max(1)) / size.max(1)).max(1);
    let all = entry.dots();
    dots.chunks(per)
        .filter_map(|run| {
            let last = *run.last()?;
            Some((restrict(entry, &all, run), last))
        })
        .collect()
}

/// Accumulates pieces of at most about `budget` bytes.
struct Pieces<'a> {
    budget: usize,
    keep: &'a CausalContext,
    done: Vec<Delta>,
    cur: Delta,
    bytes: usize,
}

impl<'a> Pieces<'a> {
    fn new(budget: usize, keep: &'a CausalContext) -> Self {
        Self {
            budget,
            keep,
            done: Vec::new(),
            cur: Delta::default(),
            bytes: 0,
        }
    }

    fn room(&mut self, size: usize) {
        if self.bytes > 0 && self.bytes.saturating_add(size) > self.budget {
            self.flush();
        }
        self.bytes = self.bytes.saturating_add(size);
    }

    fn flush(&mut self) {
        if !self.cur.is_empty() {
            let mut piece = std::mem::take(&mut self.cur);
            piece.state.ctx.join(self.keep);
            self.done.push(piece);
        }
        self.bytes = 0;
    }

    /// For a counter entry just added to the current piece: the removals of the delta that a
    /// counter dot of the entry supersedes (the same replica's lower dots) travel in the same
    /// piece. Counter dots have no dot-index rows (`rows::indexed`), so a receiver can only
    /// remove an overwritten counter dot while joining the counter's own entry.
    fn counter_removals(&mut self, key: &Key, entry: &Entry, removed: &CausalContext) {
        if key.kind.deletable() || removed.is_empty() {
            return;
        }
        entry.for_each_dot(&mut |d| {
            if d.seq > 1 {
                let lower =
                    removed.intersection(&CausalContext::from_range(d.replica, 1, d.seq - 1));
                if !lower.is_empty() {
                    self.bytes = self.bytes.saturating_add(RANGE_BYTES);
                    self.cur.state.ctx.join(&lower);
                }
            }
        });
    }

    fn entry(&mut self, key: &Key, entry: Entry, size: usize) {
        self.room(size);
        self.cur.state.ctx.join(&entry.dots());
        let mut store = std::mem::take(&mut self.cur.state.store);
        match store.get(key).cloned() {
            Some(mut mine) => {
                // Parts of one entry: disjoint dots, so the join is their union.
                let ctx = mine.dots();
                let theirs_ctx = entry.dots();
                mine.join(&ctx, entry, &theirs_ctx);
                store.set(key.clone(), mine);
            }
            None => store.set(key.clone(), entry),
        }
        self.cur.state.store = store;
    }
}

/// Splits `delta` into pieces of at most about `target` encoded bytes each, in the order they
/// must be logged: entries first (whole, or by runs of dots when one alone is too large), then
/// the context's removals (dots it holds but its store does not), then the dedup marks (after
/// the effects they mark). `keep` — dots that are in the context, in no entry, and must travel
/// with every piece (a removal's own fresh dot, so a piece's effect is never visible without
/// the dot that caused it) — is added to every piece's context. A delta within `target` is
/// returned whole.
///
/// Guarantee: every piece is a valid delta (its entries' dots are in its context), no piece's
/// context holds a dot that another piece carries in its store unless that piece holds it too,
/// and the join of the pieces equals `delta` (with `keep` added to its context).
///
/// # Errors
/// [`CodecError`] when a part cannot be measured (over the codec's ceiling).
pub(crate) fn split_delta(
    delta: Delta,
    target: usize,
    keep: &CausalContext,
) -> Result<Vec<Delta>, CodecError> {
    if codec::encoded_len("log record", &delta)? <= target {
        return Ok(vec![delta]);
    }
    // Half the target per piece leaves room for `keep`, replica tables and varint slack.
    let budget = (target / 2).max(1);
    let Delta { state, marks } = delta;
    let stored = state.store.dots();
    let removed = state.ctx.diff(&stored);
    let mut pieces = Pieces::new(budget, keep);
    for (key, entry) in state.store.iter() {
        let size = codec::encoded_len("entry", &(key, entry))?;
        if size <= budget {
            pieces.entry(key, entry.clone(), size);
            pieces.counter_removals(key, entry, &removed);
        } else {
            for (part, _) in split_entry(entry, size, budget) {
                let part_size = codec::encoded_len("entry", &(key, &part))?;
                pieces.entry(key, part.clone(), part_size);
                pieces.counter_removals(key, &part, &removed);
            }
        }
    }
    for (replica, set) in removed.entries() {
        for &(lo, hi) in set.ranges() {
            pieces.room(RANGE_BYTES);
            pieces.cur.state.ctx.insert_range(*replica, lo, hi);
        }
    }
    for ((stream, source), seqs) in marks.iter() {
        let per = (budget / RANGE_BYTES).max(1);
        for run in seqs.ranges().chunks(per) {
            let part = IntervalSet::from_ranges(run.to_vec()).unwrap_or_default();
            pieces.room(marks_bytes(stream, source, &part));
            let mut one = DedupMarks::new();
            one.set(stream.clone(), source.clone(), part);
            pieces.cur.marks.join(&one);
        }
    }
    pieces.flush();
    Ok(pieces.done)
}

/// The union of disjoint `parts` of one entry (test helper and sanity check).
#[cfg(test)]
fn union(parts: Vec<Entry>) -> Option<Entry> {
    let mut it = parts.into_iter();
    let mut acc = it.next()?;
    for p in it {
        let (a, b) = (acc.dots(), p.dots());
        acc.join(&a, p, &b);
    }
    Some(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_crdts::causal_map::delta_mutation;
    use tidemark_crdts::{DotMap, KeyKind, ReplicaId};

    fn big_set(n: u64) -> (Key, Entry, CausalContext) {
        let key = Key::new(KeyKind::ORSet, "big");
        let mut entry: Option<Entry> = None;
        let mut ctx = CausalContext::new();
        for i in 0..n {
            // Every other dot of the replica, so the context is scattered.
            let dot = Dot::new(ReplicaId(7), 2 * i + 1);
            let (e, dctx) = delta_mutation(
                KeyKind::ORSet,
                entry.as_ref(),
                &Mutation::Add(format!("\"element-{i:08}\"")),
                dot,
                None,
            )
            .expect("add applies");
            let mut joined = entry
                .take()
                .unwrap_or_else(|| Entry::bottom(KeyKind::ORSet));
            joined.join(&ctx, e, &dctx);
            ctx.join(&dctx);
            entry = Some(joined);
        }
        (key, entry.unwrap_or_default(), ctx)
    }

    #[test]
    fn split_pieces_fit_and_join_back_to_the_whole() {
        let (key, entry, ctx) = big_set(20_000);
        let mut store = DotMap::default();
        store.set(key.clone(), entry.clone());
        // A removal context too: dots the store does not hold.
        let mut full_ctx = ctx.clone();
        full_ctx.insert_range(ReplicaId(9), 1, 5);
        for i in 0..5_000 {
            full_ctx.insert(Dot::new(ReplicaId(8), 3 * i + 1));
        }
        let mut marks = DedupMarks::new();
        for s in 0..3_000 {
            marks.insert("stream", &format!("source-{s}"), 1);
        }
        let delta = Delta {
            state: tidemark_crdts::Causal {
                store,
                ctx: full_ctx.clone(),
            },
            marks: marks.clone(),
        };
        let target = 64 * 1024;
        let pieces = split_delta(delta.clone(), target, &CausalContext::new()).expect("splits");
        assert!(pieces.len() > 4, "{} pieces", pieces.len());
        let mut joined = Delta::default();
        for p in &pieces {
            let len = codec::encoded_len("piece", p).expect("measures");
            assert!(len <= target, "piece of {len} bytes over {target}");
            let mut inside = true;
            p.state
                .store
                .iter()
                .for_each(|(_, e)| e.for_each_dot(&mut |d| inside &= p.state.ctx.contains(&d)));
            assert!(inside, "a piece's entries' dots are in its context");
            joined.join(p.clone());
        }
        assert_eq!(joined, delta);
        let parts = split_entry(&entry, 1 << 20, 64 * 1024);
        assert_eq!(
            union(parts.into_iter().map(|(e, _)| e).collect()),
            Some(entry)
        );
    }

    #[test]
    fn a_counter_entry_travels_with_the_removal_of_its_replicas_older_dot() {
        // Counter dots have no index rows, so the piece carrying a counter's new dot must
        // also remove the same replica's older dot of that counter.
        let (set_key, set_entry, mut ctx) = big_set(20_000);
        let counter = Key::new(KeyKind::GCounter, "hits");
        let r = ReplicaId(3);
        let counter_entry = Entry::GCounter(tidemark_crdts::DotFun::single(Dot::new(r, 90), 12));
        ctx.insert_range(r, 1, 90);
        let mut store = DotMap::default();
        store.set(counter.clone(), counter_entry);
        store.set(set_key, set_entry);
        let delta = Delta {
            state: tidemark_crdts::Causal { store, ctx },
            marks: DedupMarks::new(),
        };
        let pieces = split_delta(delta.clone(), 64 * 1024, &CausalContext::new()).expect("splits");
        assert!(pieces.len() > 2, "{} pieces", pieces.len());
        let with_counter: Vec<&Delta> = pieces
            .iter()
            .filter(|p| p.state.store.get(&counter).is_some())
            .collect();
        assert_eq!(with_counter.len(), 1);
        for seq in 1..90 {
            assert!(
                with_counter[0].state.ctx.contains(&Dot::new(r, seq)),
                "r:{seq}"
            );
        }
        let mut joined = Delta::default();
        for p in pieces {
            joined.join(p);
        }
        assert_eq!(joined, delta);
    }
}
