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
use tidemark_crdts::{
    CausalContext, DedupMarks, Dot, DotStore, Entry, IntervalSet, Key, Mutation,
};

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

/// What a split needs to know of a delta's removals to keep every piece causally
/// self-contained per key (docs/design/write-path.md, "Log records").
#[derive(Debug, Default)]
pub(crate) struct Retired<'a> {
    /// Per key, the dots its new entry retired on that key (the join's removals there, or the
    /// ops'): they travel with the piece holding the key's entry (its last part), never
    /// before it and never after it.
    pub by_key: Vec<(Key, CausalContext)>,
    /// Removed dots whose key nobody here knows (the node never held them), and the dots of
    /// the deletable-kind entries they are placed against ([`successors`]); `None`: both are
    /// taken from the delta itself (its removals not in `by_key` or `keep`, its entries).
    pub unknown: Option<Unknown<'a>>,
}

/// Removed dots of no known key, and the dots of deletable-kind entries carried with them
/// (for a streamed transfer: the whole transfer's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unknown<'a> {
    /// The removals.
    pub removed: &'a CausalContext,
    /// The dots of the deletable-kind entries carried.
    pub carried: &'a CausalContext,
    /// Removals the caller logs elsewhere (a streamed transfer's removals placed on a large
    /// set's key while its parts are joined: they go with the set's last part), never placed
    /// here.
    pub except: Option<&'a CausalContext>,
}

/// The removals of `unknown` placed with the entry dot `dot`: those of its replica above the
/// replica's next lower dot in `carried` and below `dot` — the removed dots whose next write
/// by the same replica, among the entries carried, is `dot`. A key's overwritten dot travels
/// with its new value whenever the key's writer wrote no other carried entry in between; the
/// node cannot know more (the dot's key is gone everywhere but on a peer that still holds it).
pub(super) fn successors(unknown: &Unknown<'_>, dot: Dot, out: &mut CausalContext) {
    if dot.seq <= 1 {
        return;
    }
    let Some(removed) = unknown.removed.get(&dot.replica) else {
        return;
    };
    let below = dot.seq - 1;
    // The highest carried dot of the replica under `dot`.
    let pred = unknown.carried.get(&dot.replica).map_or(0, |c| {
        let r = c.ranges();
        let i = r.partition_point(|&(lo, _)| lo <= below);
        i.checked_sub(1).map_or(0, |i| r[i].1.min(below))
    });
    if pred >= below {
        return;
    }
    let lo = pred + 1;
    let r = removed.ranges();
    let mut i = r.partition_point(|&(_, hi)| hi < lo);
    while let Some(&(a, b)) = r.get(i) {
        if a > below {
            break;
        }
        out.insert_range(dot.replica, a.max(lo), b.min(below));
        i += 1;
    }
}

/// The encoded bytes of `ctx` alone (an upper bound of what it adds to a piece).
fn removals_len(ctx: &CausalContext) -> Result<usize, CodecError> {
    if ctx.is_empty() {
        return Ok(0);
    }
    codec::encoded_len("context", ctx)
}

/// The encoded bytes a context adds to a piece, about (an upper estimate).
fn ctx_bytes(ctx: &CausalContext) -> usize {
    ctx.entries()
        .map(|(_, set)| set.ranges().len().saturating_mul(RANGE_BYTES))
        .sum()
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

    /// Adds `entry` (a whole entry or a part, of `size` encoded bytes with `retired`) to the
    /// current piece, with `retired`: the removals that must be applied together with it.
    fn entry(&mut self, key: &Key, entry: Entry, size: usize, retired: &CausalContext) {
        self.room(size);
        self.cur.state.ctx.join(&entry.dots());
        self.cur.state.ctx.join(retired);
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

/// The lower dots of `dot`'s replica in `removed`: what a counter dot supersedes. Counter
/// dots have no dot-index rows (`rows::indexed`), so a peer removes a counter's older dot only
/// while joining the counter's own entry: the piece logging the entry must carry them.
fn counter_lower(removed: &CausalContext, dot: Dot, out: &mut CausalContext) {
    if dot.seq > 1 {
        out.join(&removed.intersection(&CausalContext::from_range(dot.replica, 1, dot.seq - 1)));
    }
}

/// Splits `delta` into pieces of at most about `target` encoded bytes each, in the order they
/// must be logged: the entries of deletable kinds (whole, or by runs of dots when one alone is
/// too large), then the counters', each with the removals that must be applied with it, then
/// the context's other removals (dots it holds but its store does not), then the dedup marks
/// (after the effects they mark). `keep` — dots that are in the context, in no entry, and must
/// travel with every piece (a removal's own fresh dot, so a piece's effect is never visible
/// without the dot that caused it) — is added to every piece's context. A delta within
/// `target` is returned whole.
///
/// Per key, a piece is causally self-contained (docs/design/write-path.md, "Log records"): a
/// key's retired dots (`retired.by_key`) travel with the key's entry (its last part, for an
/// entry split by dots), so a peer applying a prefix of the pieces neither holds a key's new
/// value beside the value it overwrote nor loses the old value before the new one arrives. A
/// removed dot of no known key goes with the deletable entry holding the next dot of its
/// replica ([`successors`]), else with the other removals. A counter's piece carries every
/// lower removed dot of its replica (it could be the counter's own: [`counter_lower`]); the
/// counters come after every deletable entry, so such a dot of another key is never retired
/// before that key's new entry; it leaves out the dots known to be a deletable key's. A key's
/// removal with no new entry (or too large to travel with it: over half the target)
/// goes whole in one piece after the entries.
///
/// Guarantee: every piece is a valid delta (its entries' dots are in its context), no piece's
/// context holds a dot that another piece carries in its store unless that piece holds it too,
/// and the join of the pieces equals `delta` (with `keep` added to its context, and for a
/// streamed transfer (`retired.unknown` given) the removals placed with its entries, which the
/// run's last record carries too).
///
/// # Errors
/// [`CodecError`] when a part cannot be measured (over the codec's ceiling).
pub(crate) fn split_delta(
    delta: Delta,
    target: usize,
    keep: &CausalContext,
    retired: &Retired<'_>,
) -> Result<Vec<Delta>, CodecError> {
    let mut delta = delta;
    if let Some(u) = retired.unknown {
        // Removals from outside the delta (a streamed transfer's) travel with its entries,
        // whether or not the delta is split.
        let mut extra = CausalContext::new();
        for (key, entry) in delta.state.store.iter() {
            if key.kind.deletable() {
                entry.for_each_dot(&mut |d| successors(&u, d, &mut extra));
            } else {
                entry.for_each_dot(&mut |d| counter_lower(u.removed, d, &mut extra));
            }
        }
        if let Some(except) = u.except {
            extra = extra.diff(except);
        }
        delta.state.ctx.join(&extra);
    }
    if codec::encoded_len("log record", &delta)? <= target {
        return Ok(vec![delta]);
    }
    // Half the target per piece leaves room for `keep`, replica tables and varint slack.
    let budget = (target / 2).max(1);
    // An entry and its removals stay within the target together.
    let with_entry_max = budget;
    let Delta { state, marks } = delta;
    let stored = state.store.dots();
    let removed = state.ctx.diff(&stored);
    // Each key's retired dots: with its entry when it carries one (if small enough, for a
    // deletable kind), else as one removal in the rest.
    let mut known = CausalContext::new();
    let mut known_deletable = CausalContext::new();
    let mut by_key: std::collections::BTreeMap<&Key, CausalContext> =
        std::collections::BTreeMap::new();
    for (key, dots) in &retired.by_key {
        let dots = dots.diff(&stored);
        known.join(&dots);
        if key.kind.deletable() {
            known_deletable.join(&dots);
        }
        by_key.entry(key).or_default().join(&dots);
    }
    let mut alone: Vec<CausalContext> = Vec::new();
    by_key.retain(|k, d| {
        if d.is_empty() {
            return false;
        }
        if state.store.get(k).is_some() && (!k.kind.deletable() || ctx_bytes(d) <= with_entry_max) {
            return true;
        }
        alone.push(std::mem::take(d));
        false
    });
    // A counter's lower removed dots: any but those known to be a deletable key's.
    let counter_removed = removed.diff(&known_deletable);
    // Removed dots of no known key, and the entries' dots they are placed against.
    let own_unknown;
    let own_carried;
    let unknown = match retired.unknown {
        Some(u) => Some(u),
        None => {
            own_unknown = removed.diff(&known).diff(keep);
            let mut carried = CausalContext::new();
            for (key, entry) in state.store.iter() {
                if key.kind.deletable() {
                    entry.for_each_dot(&mut |d| {
                        carried.insert(d);
                    });
                }
            }
            own_carried = carried;
            (!own_unknown.is_empty()).then_some(Unknown {
                removed: &own_unknown,
                carried: &own_carried,
                except: None,
            })
        }
    };
    // What travels with `part` of `key`'s entry (`last`: the entry's last part).
    let with = |key: &Key, part: &Entry, last: bool| -> CausalContext {
        let mut out = CausalContext::new();
        if key.kind.deletable() {
            if let Some(u) = unknown {
                part.for_each_dot(&mut |d| successors(&u, d, &mut out));
                if let Some(except) = u.except {
                    out = out.diff(except);
                }
            }
            if ctx_bytes(&out) > with_entry_max {
                out = CausalContext::new();
            }
        } else {
            // Every lower removed dot of the replica, known or not (as before this rule:
            // the counters come last, so none of them is retired before its key's entry).
            part.for_each_dot(&mut |d| counter_lower(&counter_removed, d, &mut out));
        }
        if last && let Some(own) = by_key.get(key) {
            out.join(own);
        }
        out
    };
    let mut pieces = Pieces::new(budget, keep);
    // Removals placed with an entry.
    let mut attached = CausalContext::new();
    let deletable = state.store.iter().filter(|(k, _)| k.kind.deletable());
    let counters = state.store.iter().filter(|(k, _)| !k.kind.deletable());
    for (key, entry) in deletable.chain(counters) {
        let size = codec::encoded_len("entry", &(key, entry))?;
        if size <= budget {
            let w = with(key, entry, true);
            attached.join(&w);
            let size = size.saturating_add(removals_len(&w)?);
            pieces.entry(key, entry.clone(), size, &w);
        } else {
            let parts = split_entry(entry, size, budget);
            let n = parts.len();
            for (i, (part, _)) in parts.into_iter().enumerate() {
                let part_size = codec::encoded_len("entry", &(key, &part))?;
                let w = with(key, &part, i + 1 == n);
                attached.join(&w);
                let part_size = part_size.saturating_add(removals_len(&w)?);
                pieces.entry(key, part, part_size, &w);
            }
        }
    }
    // A key's removal alone travels whole in one piece (when within the budget).
    for dots in alone {
        let dots = dots.diff(&attached);
        if dots.is_empty() {
            continue;
        }
        pieces.room(ctx_bytes(&dots));
        pieces.cur.state.ctx.join(&dots);
        attached.join(&dots);
    }
    let rest = removed.diff(&attached);
    drop(removed);
    for (replica, set) in rest.entries() {
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
        let pieces = split_delta(delta.clone(), target, &CausalContext::new(), &Retired::default()).expect("splits");
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
    fn a_counter_entry_travels_with_the_removal_of_its_replicas_older_dot_after_other_kinds() {
        // Counter dots have no index rows, so the piece carrying a counter's new dot must
        // also remove the same replica's older dot of that counter; which lower dot was the
        // counter's is not known, so the counters come after every deletable entry (a lower
        // dot of another key is then never retired before that key's new entry).
        let (set_key, set_entry, mut ctx) = big_set(20_000);
        let counter = Key::new(KeyKind::GCounter, "hits");
        let r = ReplicaId(3);
        let counter_entry = Entry::GCounter(tidemark_crdts::DotFun::single(Dot::new(r, 90), 12));
        ctx.insert_range(r, 1, 90);
        let mut store = DotMap::default();
        store.set(counter.clone(), counter_entry);
        store.set(set_key.clone(), set_entry);
        let delta = Delta {
            state: tidemark_crdts::Causal { store, ctx },
            marks: DedupMarks::new(),
        };
        let pieces = split_delta(
            delta.clone(),
            64 * 1024,
            &CausalContext::new(),
            &Retired::default(),
        )
        .expect("splits");
        assert!(pieces.len() > 2, "{} pieces", pieces.len());
        let with_counter: Vec<usize> = (0..pieces.len())
            .filter(|&i| pieces[i].state.store.get(&counter).is_some())
            .collect();
        assert_eq!(with_counter.len(), 1);
        let at = with_counter[0];
        for seq in 1..90 {
            assert!(pieces[at].state.ctx.contains(&Dot::new(r, seq)), "r:{seq}");
        }
        let last_set = (0..pieces.len())
            .rev()
            .find(|&i| pieces[i].state.store.get(&set_key).is_some())
            .expect("set pieces");
        assert!(last_set <= at, "the counter is logged after the set");
        let mut joined = Delta::default();
        for p in pieces {
            joined.join(p);
        }
        assert_eq!(joined, delta);
    }

    fn mv_entry(dot: Dot, v: &str) -> Entry {
        Entry::MvReg(tidemark_crdts::DotFun::single(dot, format!("\"{v}\"")))
    }

    #[test]
    fn a_keys_retired_dots_travel_with_its_entry_and_unknown_ones_with_the_next_dot() {
        // 300 registers, each overwritten: the even ones' old dots known per key (the join's
        // removals), the odd ones' unknown (the node never held them) — each old dot right
        // below its key's new one, so the successor rule finds it.
        let r = ReplicaId(4);
        let mut store = DotMap::default();
        let mut ctx = CausalContext::new();
        let mut by_key = Vec::new();
        for i in 0..300u64 {
            let key = Key::new(KeyKind::MvReg, format!("reg{i:04}"));
            let (old, new) = (Dot::new(r, 2 * i + 1), Dot::new(r, 2 * i + 2));
            store.set(key.clone(), mv_entry(new, &"v".repeat(30)));
            ctx.insert(old);
            ctx.insert(new);
            if i % 2 == 0 {
                by_key.push((key, CausalContext::from_dot(old)));
            }
        }
        // A pure removal (no new entry) and one of another replica, no key known.
        ctx.insert(Dot::new(ReplicaId(9), 1));
        let delta = Delta {
            state: tidemark_crdts::Causal { store, ctx },
            marks: DedupMarks::new(),
        };
        let retired = Retired {
            by_key,
            unknown: None,
        };
        let pieces =
            split_delta(delta.clone(), 2_000, &CausalContext::new(), &retired).expect("splits");
        assert!(pieces.len() > 5, "{} pieces", pieces.len());
        for (n, p) in pieces.iter().enumerate() {
            for (key, entry) in p.state.store.iter() {
                entry.for_each_dot(&mut |d| {
                    let old = Dot::new(r, d.seq - 1);
                    assert!(p.state.ctx.contains(&old), "{key} in piece {n} lacks {old:?}");
                });
            }
            // No piece retires an old dot of a key it does not carry.
            for d in p.state.ctx.iter_dots().filter(|d| d.replica == r && d.seq % 2 == 1) {
                let key = Key::new(KeyKind::MvReg, format!("reg{:04}", (d.seq - 1) / 2));
                assert!(p.state.store.get(&key).is_some(), "piece {n} retires {d:?} early");
            }
        }
        assert!(
            pieces
                .last()
                .is_some_and(|p| p.state.ctx.contains(&Dot::new(ReplicaId(9), 1)))
        );
        let mut joined = Delta::default();
        for p in pieces {
            joined.join(p);
        }
        assert_eq!(joined, delta);
    }
}
