//! Admission of remote input: validation of untrusted deltas, chunks and dedup marks
//! before any of it reaches state, and the range-scoped join of state-transfer chunks.
//!
//! The store-level delta join itself lives in the lattice crate
//! ([`tidemark_crdts::causal_map::join_delta`]); this module adds what a node needs around it:
//! validation of untrusted deltas and chunks, and the range-scoped join of state-transfer chunks.

pub use set_parts::{SET_PART_WINDOW, SetRows};

use crate::limits::Limits;
use crate::model::{ChangedKeys, Delta, Rejected, StateChunk};
use tidemark_crdts::causal_map::JoinOutcome;
use tidemark_crdts::{
    Causal, CausalContext, DotMap, DotStore, Entry, Key, ReplicaId, Rows, Timestamp,
};

mod set_parts;

/// Validates remote dedup marks like local ones: stream and source names 1..=`key_bytes_max`
/// bytes without control characters, and no empty seq set.
///
/// Marks are not bound to dots (an event may have no ops, and redundancy removal forwards
/// marks whose effects the receiver already has), so a mark cannot be checked against the
/// delta's context; what a peer can do with a wrong mark is make this node answer `duplicate`
/// to a retry of an event whose effects it does not hold — the same power an authenticated
/// peer has by sending any valid write. See ARCHITECTURE.md "size invariants".
///
/// # Errors
/// [`Rejected::BadMarks`].
pub fn validate_marks(marks: &tidemark_crdts::DedupMarks, limits: &Limits) -> Result<(), Rejected> {
    let bad_name =
        |n: &str| n.is_empty() || n.len() > limits.key_bytes_max || n.chars().any(char::is_control);
    for ((stream, source), seqs) in marks.iter() {
        if bad_name(stream) {
            return Err(Rejected::BadMarks("invalid stream name"));
        }
        if bad_name(source) {
            return Err(Rejected::BadMarks("invalid source name"));
        }
        if seqs.is_empty() {
            return Err(Rejected::BadMarks("a source with no seqs"));
        }
    }
    Ok(())
}

/// Checks a key name: 1..=`key_bytes_max` bytes of UTF-8 without control characters.
///
/// # Errors
/// [`Rejected::KeyName`] naming the problem.
pub fn check_key_name(name: &str, limits: &Limits) -> Result<(), Rejected> {
    let why = if name.is_empty() {
        Some("empty")
    } else if name.len() > limits.key_bytes_max {
        Some("too long")
    } else if name.chars().any(char::is_control) {
        Some("control character")
    } else {
        None
    };
    match why {
        Some(why) => Err(Rejected::KeyName {
            name: name.chars().take(64).collect(),
            why,
        }),
        None => Ok(()),
    }
}

fn check_entry(
    key: &Key,
    entry: &Entry,
    ctx: Option<&CausalContext>,
    limits: &Limits,
) -> Result<(), Rejected> {
    check_key_name(&key.name, limits)?;
    if entry.kind() != key.kind {
        return Err(Rejected::KindMismatch {
            key: key.to_string(),
            found: entry.kind().as_str(),
        });
    }
    if !entry.is_canonical() || entry.is_bottom() {
        return Err(Rejected::NotCanonical {
            key: key.to_string(),
        });
    }
    if let Some(ctx) = ctx {
        let mut inside = true;
        entry.for_each_dot(&mut |d| inside &= ctx.contains(&d));
        if !inside {
            return Err(Rejected::DotOutsideContext {
                key: key.to_string(),
            });
        }
    }
    let too_large = |len: usize, limit: usize| {
        (len > limit).then(|| Rejected::ValueTooLarge {
            key: key.to_string(),
            len,
            limit,
        })
    };
    let not_json = |ok: bool| {
        (!ok).then(|| Rejected::NotJson {
            key: key.to_string(),
        })
    };
    let err = match entry {
        Entry::ORSet(m) => m.keys().find_map(|e| {
            too_large(e.len(), limits.element_bytes_max)
                .or_else(|| not_json(is_canonical_json(e, true)))
        }),
        Entry::Lww(f) => f.iter().find_map(|(_, (_, v))| {
            too_large(v.len(), limits.value_bytes_max)
                .or_else(|| not_json(is_canonical_json(v, false)))
        }),
        Entry::MvReg(f) => f.iter().find_map(|(_, v)| {
            too_large(v.len(), limits.value_bytes_max)
                .or_else(|| not_json(is_canonical_json(v, false)))
        }),
        Entry::GCounter(_) | Entry::PNCounter(_) => None,
    };
    err.map_or(Ok(()), Err)
}

/// True when `text` is exactly the text a local write stores for some JSON value (see
/// `ops::validate_op`: serde_json's compact, key-sorted form), and, for a set element, a
/// string, number or boolean. So a peer can store nothing a local `apply` could not.
fn is_canonical_json(text: &str, scalar: bool) -> bool {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => {
            (!scalar || v.is_string() || v.is_number() || v.is_boolean())
                && serde_json::to_string(&v).is_ok_and(|canonical| canonical == text)
        }
        Err(_) => false,
    }
}

/// Rejects a dot that appears twice among `entries` (under two keys, or twice in one entry).
fn check_dots_distinct<'a>(
    entries: impl Iterator<Item = (&'a Key, &'a Entry)>,
) -> Result<(), Rejected> {
    let mut seen: Vec<(tidemark_crdts::Dot, &Key)> = Vec::new();
    for (key, entry) in entries {
        entry.for_each_dot(&mut |d| seen.push((d, key)));
    }
    seen.sort_unstable_by_key(|(d, _)| *d);
    match seen.windows(2).find(|w| w[0].0 == w[1].0) {
        Some(w) => Err(Rejected::DuplicateDot {
            dot: w[1].0,
            key: w[1].1.to_string(),
        }),
        None => Ok(()),
    }
}

fn check_own_dots(
    ctx: &CausalContext,
    me: ReplicaId,
    local: &CausalContext,
) -> Result<(), Rejected> {
    let claimed = ctx.max_seq(me);
    let local_max = local.max_seq(me);
    if claimed > local_max {
        return Err(Rejected::ForgedOwnDot {
            claimed,
            local: local_max,
        });
    }
    Ok(())
}

/// Validates a remote delta against the local replica before anything is applied.
///
/// The admission rule (ARCHITECTURE.md "Admission"): every entry matches its key's kind, is
/// canonical and non-empty, holds only dots of the delta's context, values within their limits
/// and canonical JSON (set elements: strings, numbers, booleans); no dot appears twice; no own
/// dot above the local counter.
///
/// # Errors
/// The first [`Rejected`] reason found.
pub fn validate_delta(
    delta: &Delta,
    limits: &Limits,
    me: ReplicaId,
    local: &CausalContext,
) -> Result<(), Rejected> {
    for (key, entry) in delta.state.store.iter() {
        check_entry(key, entry, Some(&delta.state.ctx), limits)?;
    }
    check_dots_distinct(delta.state.store.iter())?;
    validate_marks(&delta.marks, limits)?;
    check_own_dots(&delta.state.ctx, me, local)
}

/// Validates a state-transfer chunk before anything is applied.
///
/// # Errors
/// The first [`Rejected`] reason found.
pub fn validate_chunk(
    chunk: &StateChunk,
    limits: &Limits,
    me: ReplicaId,
    local: &CausalContext,
) -> Result<(), Rejected> {
    if let (Some(a), Some(u)) = (&chunk.after, &chunk.upto) {
        // `(k, k]` is the empty range of a chunk that carries only dedup marks.
        if a > u {
            return Err(Rejected::BadChunk("inverted key range"));
        }
    }
    if chunk.dots.is_some_and(|s| s.is_empty()) {
        return Err(Rejected::BadChunk("empty dot slice"));
    }
    validate_marks(&chunk.marks, limits)?;
    let mut prev: Option<&Key> = chunk.after.as_ref();
    for (key, entry) in &chunk.entries {
        if prev.is_some_and(|p| p >= key) {
            return Err(Rejected::BadChunk(
                "entries not strictly ascending within the range",
            ));
        }
        if chunk.upto.as_ref().is_some_and(|u| key > u) {
            return Err(Rejected::BadChunk("entry beyond the chunk's range"));
        }
        // A transfer is read together with its context: every dot is inside it.
        check_entry(key, entry, Some(&chunk.ctx), limits)?;
        if let Some(slice) = &chunk.dots {
            let mut inside = true;
            entry.for_each_dot(&mut |d| inside &= slice.contains(&d));
            if !inside {
                return Err(Rejected::BadChunk(
                    "entry dot outside the chunk's dot slice",
                ));
            }
        }
        let mut own = CausalContext::new();
        entry.for_each_dot(&mut |d| {
            own.insert(d);
        });
        check_own_dots(&own, me, local)?;
        prev = Some(key);
    }
    check_dots_distinct(chunk.entries.iter().map(|(k, e)| (k, e)))?;
    check_own_dots(&chunk.ctx, me, local)
}

/// The largest LWW timestamp a delta or chunk carries (for the receive rule of the HLC).
pub fn max_timestamp<'a>(entries: impl Iterator<Item = &'a Entry>) -> Option<Timestamp> {
    entries
        .filter_map(|e| match e {
            Entry::Lww(f) => f.iter().map(|(_, (t, _))| *t).max(),
            _ => None,
        })
        .max()
}

/// Row backends that can list their keys in a range (needed by state transfer).
pub trait KeyRange: Rows {
    /// Keys `k` with `after < k <= upto` (open bounds when `None`), ascending.
    ///
    /// # Errors
    /// Backend failures.
    fn keys_in_range(
        &mut self,
        after: Option<&Key>,
        upto: Option<&Key>,
    ) -> Result<Vec<Key>, Self::Error>;
}

/// Joins one state-transfer chunk into the rows and context (range-scoped: pitfall "chunk removals
/// outside the range", docs/design/principles.md).
///
/// For every key in the chunk's range, local or carried, the entry is causally joined with the
/// chunk's entry under the transfer's context; removals therefore touch only keys in the range.
/// A chunk with a dot slice (a part of a large row) joins under the part of the transfer's
/// context inside the slice, so it never removes a dot outside the slice (one another part
/// carries).
/// The local context gains the dots carried and, for the final chunk, the transfer's context.
///
/// # Errors
/// Backend failures (the caller discards its transaction).
pub fn join_chunk<R: KeyRange>(
    rows: &mut R,
    ctx: &mut CausalContext,
    chunk: StateChunk,
) -> Result<Joined, R::Error> {
    let removal_ctx = chunk.dots.map(|slice| slice.clip(&chunk.ctx));
    let join_ctx = removal_ctx.as_ref().unwrap_or(&chunk.ctx);
    let mut join = RangeJoin::default();
    join.join_range(
        rows,
        ctx,
        (chunk.after.as_ref(), chunk.upto.as_ref()),
        chunk.entries,
        join_ctx,
    )?;
    Ok(join.finish(ctx, chunk.last.then_some(&chunk.ctx)))
}

/// Per key, the local dots a join removed there ([`JoinOutcome::retired`]).
pub type KeyRemovals = Vec<(Key, CausalContext)>;

/// [`join_chunk`] in steps: one transfer's key space joined range by range (each key in
/// exactly one range, every range under the same context) and finished once. Joining the
/// ranges `(None, k1], (k1, k2], ..., (kn, None]` with the entries of each, then finishing
/// with the transfer's context, gives exactly the rows, context and inflation of one
/// [`join_chunk`] of the whole transfer. The local context `ctx` passed to every step must be
/// the one before the first step (it moves only in [`RangeJoin::finish`]).
#[derive(Debug, Default)]
pub struct RangeJoin {
    infl_store: DotMap<Key, Entry>,
    infl_ctx: CausalContext,
    /// Dots carried that the local context lacked, since the last [`RangeJoin::take_batch`].
    gained: CausalContext,
    /// Every gained dot taken out by [`RangeJoin::take_batch`].
    gained_before: CausalContext,
    changed: ChangedKeys,
    /// Per key carried since the last [`RangeJoin::take_batch`], the local dots its join
    /// removed (as [`JoinOutcome::retired`]).
    retired: Vec<(Key, CausalContext)>,
    /// A large set being joined part by part ([`RangeJoin::join_set_part`]).
    open_set: Option<set_parts::OpenSet>,
}

/// What a [`RangeJoin`] did: the inflation not taken by [`RangeJoin::take_batch`] and every
/// key it changed.
#[derive(Debug, Default)]
pub struct Joined {
    /// The inflating part not logged yet (`None`: nothing left).
    pub inflation: Option<Causal<DotMap<Key, Entry>>>,
    /// The keys whose entries changed.
    pub changed: ChangedKeys,
    /// Per key, the local dots its join removed and `inflation` does not account for yet
    /// (as [`JoinOutcome::retired`]).
    pub retired: KeyRemovals,
}

impl From<JoinOutcome> for Joined {
    fn from(o: JoinOutcome) -> Self {
        Self {
            inflation: o.inflation,
            changed: o.changed.into(),
            retired: o.retired,
        }
    }
}

impl RangeJoin {
    /// Joins every key `k` with `after < k <= upto`, local or carried in `entries` (keys
    /// inside the range), with its carried entry (bottom when none) under `join_ctx`.
    ///
    /// # Errors
    /// Backend failures (the caller discards its transaction).
    pub fn join_range<R: KeyRange>(
        &mut self,
        rows: &mut R,
        ctx: &CausalContext,
        (after, upto): (Option<&Key>, Option<&Key>),
        entries: Vec<(Key, Entry)>,
        join_ctx: &CausalContext,
    ) -> Result<(), R::Error> {
        let local_keys = rows.keys_in_range(after, upto)?;
        self.join_keys(rows, ctx, local_keys, entries, join_ctx)
    }

    /// Joins every local key `k` with `after < k < before` (the keys before a large row whose
    /// parts follow) with bottom under `join_ctx`: what [`RangeJoin::join_range`] up to the
    /// row does to the keys before it.
    ///
    /// # Errors
    /// Backend failures (the caller discards its transaction).
    pub fn join_range_before<R: KeyRange>(
        &mut self,
        rows: &mut R,
        ctx: &CausalContext,
        after: Option<&Key>,
        before: &Key,
        join_ctx: &CausalContext,
    ) -> Result<(), R::Error> {
        let mut local_keys = rows.keys_in_range(after, Some(before))?;
        local_keys.retain(|k| k != before);
        self.join_keys(rows, ctx, local_keys, Vec::new(), join_ctx)
    }

    /// Joins `local_keys` and the keys of `entries` (ascending after merging), each with its
    /// carried entry (bottom when none) under `join_ctx`.
    fn join_keys<R: KeyRange>(
        &mut self,
        rows: &mut R,
        ctx: &CausalContext,
        local_keys: Vec<Key>,
        entries: Vec<(Key, Entry)>,
        join_ctx: &CausalContext,
    ) -> Result<(), R::Error> {
        let mut carried: std::collections::BTreeMap<Key, Entry> = entries.into_iter().collect();
        let mut keys: Vec<Key> = local_keys;
        keys.extend(carried.keys().cloned());
        keys.sort();
        keys.dedup();
        for key in keys {
            let theirs = carried
                .remove(&key)
                .unwrap_or_else(|| Entry::bottom(key.kind));
            let old = rows.get(&key)?;
            let mut new = old.clone().unwrap_or_else(|| Entry::bottom(key.kind));
            let before = new.dots();
            let mut unseen = theirs.unseen_by(ctx);
            // Conflicting input only: a value that beats ours under the same dot changes the
            // row, so redundancy removal must forward it too (with its dots, keeping I3).
            let overriding = theirs.overriding(&new);
            if !overriding.is_bottom() {
                self.infl_ctx.join(&overriding.dots());
                let none = CausalContext::new();
                unseen.join(&none, overriding, &none);
            }
            new.join(ctx, theirs, join_ctx);
            let removed = before.diff(&new.dots());
            let new_opt = (!new.is_bottom()).then_some(&new);
            if new_opt != old.as_ref() {
                rows.put(&key, old.as_ref(), new_opt)?;
                self.changed.push(&key);
            }
            if !removed.is_empty() {
                self.infl_ctx.join(&removed);
                self.retired.push((key.clone(), removed));
            }
            if !unseen.is_bottom() {
                self.gained.join(&unseen.dots());
                self.infl_store.set(key, unseen);
            }
        }
        Ok(())
    }

    /// The keys whose entries changed so far, in the order they were joined.
    pub fn changed(&self) -> &ChangedKeys {
        &self.changed
    }

    /// Takes the inflation of the ranges joined since the last call (`None` when they changed
    /// nothing), so a long transfer can log it piece by piece instead of holding it whole. The
    /// pieces taken and the one [`RangeJoin::finish`] returns join to the inflation of one
    /// whole join.
    ///
    /// With the inflation: per key it carries, the local dots that key's join removed (its
    /// retired dots, also in the inflation's context).
    pub fn take_batch(&mut self) -> Option<(Causal<DotMap<Key, Entry>>, KeyRemovals)> {
        let gained = std::mem::take(&mut self.gained);
        self.gained_before.join(&gained);
        let mut ctx = std::mem::take(&mut self.infl_ctx);
        ctx.join(&gained);
        let store = std::mem::take(&mut self.infl_store);
        let retired = std::mem::take(&mut self.retired);
        (!store.is_bottom() || !ctx.is_empty()).then_some((Causal { store, ctx }, retired))
    }

    /// Ends the join: the local context gains every dot carried and, for the final chunk
    /// (`last = Some(transfer's context)`), the transfer's context. Returns the changed keys
    /// and the inflation not taken by [`RangeJoin::take_batch`].
    pub fn finish(mut self, ctx: &mut CausalContext, last: Option<&CausalContext>) -> Joined {
        // A set left open (its parts' checks make the caller close every set first).
        self.report_set();
        let RangeJoin {
            infl_store,
            mut infl_ctx,
            gained,
            gained_before,
            changed,
            retired,
            open_set: _,
        } = self;
        infl_ctx.join(&gained);
        ctx.join(&gained_before);
        ctx.join(&gained);
        if let Some(transfer_ctx) = last {
            infl_ctx.join(&transfer_ctx.diff(ctx));
            ctx.join(transfer_ctx);
        }
        let inflation = (!infl_store.is_bottom() || !infl_ctx.is_empty()).then_some(Causal {
            store: infl_store,
            ctx: infl_ctx,
        });
        Joined {
            inflation,
            changed,
            retired,
        }
    }
}
