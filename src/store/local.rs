//! Local commit groups: many callers' writes in one durable transaction (docs/design/principles.md:
//! "Acknowledged means durable", "Idempotent ingest", "Log before apply").

use super::error::StoreError;
use super::kv::KvRead;
use super::rows::{
    TxnRows, decode_elem, decode_entry, encode_bounded, indexed, open_state_tables, per_element,
    put_set, read_set, set_has_elements,
};
use super::split::{Retired, split_delta, write_bytes_estimate};
use super::tables::{
    DEDUP, LOG, LogRecord, META, META_CONTEXT, META_HLC, META_LOG_BOUNDS, dedup_key, dot_bytes, elem_key,
    key_bytes,
};
use super::wal::Redo;
use super::{RedbStore, meta_put_encoded};
use crate::codec;
use crate::codec::wal::RedoTable;
use crate::model::Delta;
use redb::ReadableTable;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tidemark_crdts::causal_map::{mutate_in_place, mutate_own_in_place};
use tidemark_crdts::{
    Causal, CausalContext, DedupMarks, Dot, DotFun, DotMap, DotSet, DotStore, Entry, IntervalSet,
    Key, KeyKind, Mutation, ReplicaId, Rows, Timestamp, Value,
};

/// Identity of an ingested event: `(stream, source, seq)`; a retry with the same identity is
/// a no-op (docs/design/principles.md, "Idempotent ingest").
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId {
    /// The stream.
    pub stream: String,
    /// The source within the stream.
    pub source: String,
    /// The per-source sequence number.
    pub seq: u64,
}

/// One caller-visible unit of a commit group: some operations, applied all together or (as a
/// duplicate event) not at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalWrite {
    /// The operations, already validated by the caller.
    pub ops: Vec<(Key, Mutation)>,
    /// Present for idempotent events and ops carrying `source`/`seq`.
    pub event: Option<EventId>,
    /// Event stamps, one per op where present (empty: no op is stamped). A stamped op is an
    /// LWW `Set` written at its stamp instead of the node clock's timestamp, and skipped when
    /// the key already holds a value stamped at or after it: the register then keeps the
    /// value of the latest event whatever order events arrive in (what `latest` views use).
    pub stamps: Vec<Option<Timestamp>>,
    /// Present for an event late for some view: kept in the stream's late lane, in the same
    /// transaction, when the write is applied (not for a duplicate or a refused write).
    pub late: Option<super::late::LateNote>,
    /// The write's set `Add`s and register `Set`s cover only this replica's own dots: other
    /// replicas' dots of the element or register stay (`mutate_own_in_place`), so every
    /// replica's contribution to such a key stays separable by dot (what view cells need to
    /// count exactly a seal's members). A stamped `Set` is then skipped only when this
    /// replica's own value is stamped at or after it.
    pub own_dots: bool,
}

/// Writes of a commit group that were refused: nothing of them was applied (they are not
/// duplicates either).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Position in the group of the write at fault.
    pub index: usize,
    /// The writes not applied because of it, by position in the group: the write itself for
    /// dedup gaps, its caller's whole batch for an overflow.
    pub writes: std::ops::Range<usize>,
    /// Why.
    pub cause: RefusalCause,
}

/// Why writes of a commit group were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalCause {
    /// The write's event seq would open a dedup range beyond `limits.dedup_ranges_max` for its
    /// source.
    DedupGaps {
        /// The event's source.
        source: String,
        /// The source's disjoint ranges.
        ranges: usize,
    },
    /// An op of the batch would take a counter out of its value range.
    Overflow(super::counters::Overflow),
}

/// What a committed group did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalCommit {
    /// Per write, in order: true when it was skipped as a duplicate.
    pub duplicate: Vec<bool>,
    /// Changed keys with their new values (for watchers), ascending by key; empty when the
    /// store was told not to compute them ([`RedbStore::set_change_values`]).
    pub changes: Vec<(Key, Value)>,
    /// The keys the group changed, ascending (always filled; shared with the writer's row
    /// cache, so listing them allocates nothing per key).
    pub changed: Vec<Arc<Key>>,
    /// The log sequence number of the group's first log record (`None` when nothing was
    /// applied). A group is logged as one or more consecutive records, each within
    /// `limits.message_bytes_target`; they end at the log end when the commit returns.
    pub log_seq: Option<u64>,
    /// Writes refused (for too many dedup gaps, or a counter overflow in their batch), in
    /// group order: not applied, also not duplicates.
    pub refused: Vec<Refusal>,
}

/// True when inserting `seq` into `seen` adds a range (neither neighbour is present).
fn opens_range(seen: &IntervalSet, seq: u64) -> bool {
    let below = seq.checked_sub(1).is_some_and(|s| seen.contains(s));
    let above = seq.checked_add(1).is_some_and(|s| seen.contains(s));
    !below && !above
}

/// The log record being accumulated by a commit group: consecutive writes, cut so that each
/// record stays within the message target (ARCHITECTURE.md, "size invariants").
struct RecordBuilder<'w> {
    /// Own seqs issued by this record: `(first, last]`.
    first: u64,
    last: u64,
    /// Keys the record's ops changed.
    keys: Vec<Arc<Key>>,
    /// Every dot of the record's per-op delta contexts besides the record's own fresh dots
    /// (`(first, last]`, each op's `dot`): the dots the ops overwrote or removed.
    dots: Vec<Dot>,
    /// Where each op's overwritten dots are in `dots` (`start..end`), with its key: a split record carries
    /// a key's overwritten dots with the key's entry ([`split_delta`]).
    retired_at: Vec<(usize, usize, Arc<Key>)>,
    /// The record's dedup marks, by `(stream, source)` of the group's writes.
    marks: GroupMap<(&'w str, &'w str), IntervalSet>,
    /// Estimated encoded bytes so far.
    bytes: usize,
}

impl<'w> RecordBuilder<'w> {
    fn new(ctx: &CausalContext, me: tidemark_crdts::ReplicaId) -> Self {
        let at = ctx.max_seq(me);
        Self {
            first: at,
            last: at,
            keys: Vec::new(),
            dots: Vec::new(),
            retired_at: Vec::new(),
            marks: GroupMap::default(),
            bytes: 0,
        }
    }

    /// The record's delta — the join of its ops' deltas: each changed key's current entry
    /// restricted to the record's fresh dots (every other dot of the entry was in the context
    /// before the record), the union of the ops' contexts, and the record's marks — split into
    /// pieces within `target` ([`split_delta`]), in log order; with the keys the record
    /// changed, ascending.
    fn finish(
        self,
        rows: &mut GroupRows<'_, '_>,
        me: tidemark_crdts::ReplicaId,
        target: usize,
    ) -> Result<(Vec<Delta>, Vec<Arc<Key>>), StoreError> {
        let RecordBuilder {
            first,
            last,
            mut keys,
            dots,
            retired_at,
            marks: record_marks,
            ..
        } = self;
        keys.sort_unstable();
        keys.dedup();
        let fresh = CausalContext::from_range(me, first + 1, last);
        let is_fresh = |d: &Dot| d.replica == me && d.seq > first && d.seq <= last;
        let mut store: DotMap<Key, Entry> = DotMap::default();
        // Seqs of the fresh dots the parts hold (a part holds fresh dots only).
        let mut held: Vec<u64> = Vec::new();
        for key in &keys {
            if let Some(part) = rows.record_part(key, &is_fresh)?
                && !part.is_bottom()
            {
                part.for_each_dot(&mut |d| held.push(d.seq));
                store.set(Key::clone(key), part);
            }
        }
        // `dots` stays in op order (`retired_at` points into it) until the record is known
        // to be split: only then are the per-key removals built (a key and a context per op).
        let mut sorted = dots.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let mut ctx: CausalContext = sorted.into_iter().collect();
        ctx.join(&fresh);
        // Fresh dots no entry holds (a removal's or delete's own dot) travel with every piece.
        held.sort_unstable();
        let mut keep = CausalContext::new();
        let mut next = first + 1;
        for seq in held {
            if seq > next {
                keep.insert_range(me, next, seq - 1);
            }
            next = next.max(seq + 1);
        }
        if next <= last {
            keep.insert_range(me, next, last);
        }
        let mut marks = DedupMarks::new();
        for ((stream, source), seqs) in record_marks {
            marks.set(stream.to_owned(), source.to_owned(), seqs);
        }
        let delta = Delta {
            state: Causal { store, ctx },
            marks,
        };
        if delta.is_empty() {
            return Ok((Vec::new(), keys));
        }
        let codec_err = |source| StoreError::Codec {
            table: "log",
            source,
        };
        if codec::encoded_len("log record", &delta).map_err(codec_err)? <= target {
            return Ok((vec![delta], keys));
        }
        let mut by_key: Vec<(Key, CausalContext)> = Vec::with_capacity(retired_at.len());
        for (start, end, key) in &retired_at {
            if let Some(ops) = dots.get(*start..*end) {
                by_key.push((Key::clone(key), ops.iter().copied().collect()));
            }
        }
        let retired = Retired {
            by_key,
            unknown: None,
        };
        let pieces = split_delta(delta, target, &keep, &retired).map_err(|source| StoreError::Codec {
            table: "log",
            source,
        })?;
        Ok((pieces, keys))
    }
}

/// The part of an entry holding only the dots `is_fresh` admits (what
/// `e.unseen_by(e.dots() \ fresh)` gives; registers and counters without building contexts).
fn fresh_part(e: &Entry, is_fresh: &impl Fn(&Dot) -> bool) -> Entry {
    fn keep<V: Clone + Ord + std::fmt::Debug>(
        f: &DotFun<V>,
        is_fresh: &impl Fn(&Dot) -> bool,
    ) -> DotFun<V> {
        DotFun::from_entries(
            f.iter()
                .filter(|(d, _)| is_fresh(d))
                .map(|(d, v)| (*d, v.clone()))
                .collect(),
        )
    }
    match e {
        Entry::GCounter(f) => Entry::GCounter(keep(f, is_fresh)),
        Entry::PNCounter(f) => Entry::PNCounter(keep(f, is_fresh)),
        Entry::Lww(f) => Entry::Lww(keep(f, is_fresh)),
        Entry::MvReg(f) => Entry::MvReg(keep(f, is_fresh)),
        Entry::ORSet(_) => {
            let mut older = CausalContext::new();
            e.for_each_dot(&mut |d| {
                if !is_fresh(&d) {
                    older.insert(d);
                }
            });
            e.unseen_by(&older)
        }
    }
}

/// Encodes log records and appends them from `log_end` on; returns the new end. A record
/// over `record_bytes_max` is refused before anything is written (it could never be read
/// back), which by the size invariants cannot happen for a delta within the message target.
pub(crate) fn append_log(
    txn: &redb::WriteTransaction,
    origin: Option<crate::proto::PeerId>,
    deltas: Vec<Delta>,
    log_end: u64,
    record_bytes_max: usize,
    redo: &mut Redo,
) -> Result<u64, StoreError> {
    append_log_run(txn, origin, deltas, log_end, record_bytes_max, redo, false)
}

/// [`append_log`]; with `more`, the run goes on after these records (the last one too is
/// marked `continues`: the caller appends the rest of the run in the same transaction).
pub(crate) fn append_log_run(
    txn: &redb::WriteTransaction,
    origin: Option<crate::proto::PeerId>,
    deltas: Vec<Delta>,
    mut log_end: u64,
    record_bytes_max: usize,
    redo: &mut Redo,
    more: bool,
) -> Result<u64, StoreError> {
    let mut log_t = txn.open_table(LOG).map_err(StoreError::redb)?;
    let last = deltas.len().saturating_sub(1);
    for (i, delta) in deltas.into_iter().enumerate() {
        let record = LogRecord {
            origin,
            delta,
            continues: more || i < last,
        };
        let bytes = encode_bounded("log record", "log", &record, record_bytes_max)?;
        log_t
            .insert(log_end, bytes.as_slice())
            .map_err(StoreError::redb)?;
        redo.put(RedoTable::Log, &log_end.to_be_bytes(), &bytes);
        log_end += 1;
    }
    Ok(log_end)
}

impl RedbStore {
    /// Whether [`RedbStore::commit_local`] computes each changed key's new value into
    /// [`LocalCommit::changes`] (on by default). The writer turns it off and reads the values
    /// after the commit only when someone watches, so an unwatched commit never materialises
    /// (and clones) whole values.
    pub fn set_change_values(&mut self, on: bool) {
        self.change_values = on;
    }

    /// Applies a commit group in one durable transaction and returns what it did. Returns only
    /// after the commit is durable (in `Immediate` mode); nothing is visible to readers before.
    ///
    /// Each non-duplicate operation takes a fresh dot (a contiguous range for the group). The
    /// group's delta is logged as consecutive records cut at write boundaries so each stays
    /// within `limits.message_bytes_target` (one write alone is split further only by its
    /// removals); dedup marks, context and HLC mark commit with it. A write whose event would
    /// open a dedup range beyond `limits.dedup_ranges_max` is refused (see
    /// [`LocalCommit::refused`]); the rest of the group commits.
    ///
    /// # Errors
    /// [`StoreError::InvalidOp`] if an operation does not apply, [`StoreError::TooLarge`] if
    /// a row would exceed `limits.record_bytes_max` (nothing written, store usable); storage
    /// failures halt the store.
    pub fn commit_local(
        &mut self,
        writes: &[LocalWrite],
        wall_ms: u64,
    ) -> Result<LocalCommit, StoreError> {
        self.commit_local_batches(writes, &[writes.len()], wall_ms)
    }

    /// [`RedbStore::commit_local`] for a group made of callers' batches (`batches`: their
    /// sizes, in order, summing to `writes.len()`): a batch whose counter increments would go
    /// out of range ([`RefusalCause::Overflow`]), counted from the rows as the earlier batches
    /// of the group left them, is refused whole and the rest of the group commits.
    ///
    /// # Errors
    /// As [`RedbStore::commit_local`]; [`StoreError::InvalidOp`] when `batches` does not sum
    /// to the number of writes.
    pub fn commit_local_batches(
        &mut self,
        writes: &[LocalWrite],
        batches: &[usize],
        wall_ms: u64,
    ) -> Result<LocalCommit, StoreError> {
        if batches.iter().sum::<usize>() != writes.len() {
            return Err(StoreError::InvalidOp(format!(
                "batches of {} writes in a group of {}",
                batches.iter().sum::<usize>(),
                writes.len()
            )));
        }
        for w in writes {
            for (key, m) in &w.ops {
                tidemark_crdts::causal_map::check_mutation(key.kind, m)
                    .map_err(|e| StoreError::InvalidOp(format!("{key}: {e}")))?;
            }
        }
        #[cfg(debug_assertions)]
        let before = (self.log_start, self.log_end, self.ctx.len());
        let result = self.guarded(|s| s.commit_local_inner(writes, batches, wall_ms));
        #[cfg(debug_assertions)]
        {
            // The context only grows, and the log bounds move only with a commit: its end
            // never goes back and its start moves only by compaction.
            let after = (self.log_start, self.log_end, self.ctx.len());
            debug_assert!(after.2 >= before.2, "context shrank in a local commit");
            debug_assert_eq!(after.0, before.0, "a local commit moved the log start");
            debug_assert!(after.1 >= before.1, "a local commit moved the log end back");
            debug_assert!(
                result.is_ok() || after.1 == before.1,
                "a failed local commit moved the log end"
            );
        }
        result
    }

    fn commit_local_inner(
        &mut self,
        writes: &[LocalWrite],
        batches: &[usize],
        wall_ms: u64,
    ) -> Result<LocalCommit, StoreError> {
        let max = self.options.limits.record_bytes_max;
        let target = self.options.limits.message_bytes_target;
        let ranges_max = self.options.limits.dedup_ranges_max;
        let me = self.replica;
        // Taken out before `begin` (which drops it) and put back only after the commit.
        let row_cache = self.row_cache.take().unwrap_or_default();
        // A log past its checkpoint size is checkpointed first (so a failure there fails this
        // group, before anything of it is written).
        if self
            .wal
            .as_ref()
            .is_some_and(|w| w.pending_bytes() >= super::CHECKPOINT_BYTES)
        {
            self.checkpoint_now()?;
        }
        let txn = self.begin()?;
        let recording = self.wal.is_some();
        let mut ctx = self.ctx.clone();
        let mut hlc = self.hlc.clone();
        let mut records: Vec<Delta> = Vec::new();
        let mut duplicate = Vec::with_capacity(writes.len());
        let mut refused = Vec::new();
        let changed: Vec<Arc<Key>>;
        let mut marks: GroupMap<(&str, &str), IntervalSet> = GroupMap::default();
        let mut values = Vec::new();
        let (row_cache, mut redo) =
            {
                let (mut rows_t, mut elems_t, mut dots_t) = open_state_tables(&txn)?;
                // Opened on first use: a group of writes without events never touches it.
                let mut dedup_t: Option<redb::Table<'_, &[u8], &[u8]>> = None;
                let mut rows = GroupRows::new(
                    TxnRows {
                        rows: &mut rows_t,
                        elems: &mut elems_t,
                        dots: &mut dots_t,
                        record_bytes_max: max,
                        redo: if recording { Redo::on() } else { Redo::default() },
                    },
                    row_cache,
                );
                let mut rec = RecordBuilder::new(&ctx, me);
                let mut changed_rc: Vec<Arc<Key>> = Vec::new();
                // Records finished before the last one.
                let mut runs = 0usize;
                // Batch boundaries: the next batch's start, and the end of a refused batch.
                let mut batch_ends = batches.iter().scan(0usize, |end, n| {
                    *end += n;
                    Some(*end)
                });
                let (mut batch_end, mut skip_until) = (0usize, 0usize);
                for (index, w) in writes.iter().enumerate() {
                    while index == batch_end {
                        let batch_start = batch_end;
                        batch_end = batch_ends.next().unwrap_or(writes.len());
                        let batch = &writes[batch_start..batch_end];
                        let ops = batch.iter().map(|w| w.ops.as_slice());
                        if let Some(o) = super::counters::first_overflow(ops, |k| {
                            Ok(super::counters::counter_state(rows.entry(k)?, me))
                        })? {
                            refused.push(Refusal {
                                index: batch_start + o.index,
                                writes: batch_start..batch_end,
                                cause: RefusalCause::Overflow(o),
                            });
                            skip_until = batch_end;
                        }
                    }
                    if index < skip_until {
                        duplicate.push(false);
                        continue;
                    }
                    if let Some(ev) = &w.event {
                        let mk = (ev.stream.as_str(), ev.source.as_str());
                        let seen = match marks.entry(mk) {
                            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                            std::collections::hash_map::Entry::Vacant(v) => {
                                // The writer's copy of the committed marks; the table is read
                                // only for a source this writer has not seen since open.
                                let owned = (ev.stream.clone(), ev.source.clone());
                                let seen = match self.dedup_cache.get(&owned) {
                                    Some(seen) => seen.clone(),
                                    None => match opened(&mut dedup_t, &txn, DEDUP)?
                                        .get(dedup_key(&ev.stream, &ev.source).as_slice())
                                        .map_err(StoreError::redb)?
                                    {
                                        Some(g) => codec::decode("dedup marks", g.value(), max)
                                            .map_err(|source| StoreError::Codec {
                                                table: "dedup",
                                                source,
                                            })?,
                                        None => IntervalSet::new(),
                                    },
                                };
                                v.insert(seen)
                            }
                        };
                        if seen.contains(ev.seq) {
                            duplicate.push(true);
                            continue;
                        }
                        if opens_range(seen, ev.seq) && seen.ranges().len() >= ranges_max {
                            refused.push(Refusal {
                                index,
                                writes: index..index + 1,
                                cause: RefusalCause::DedupGaps {
                                    source: ev.source.clone(),
                                    ranges: seen.ranges().len(),
                                },
                            });
                            duplicate.push(false);
                            continue;
                        }
                    }
                    let estimate = write_bytes_estimate(w);
                    if rec.bytes > 0 && rec.bytes.saturating_add(estimate) > target {
                        let (pieces, keys) = rec.finish(&mut rows, me, target)?;
                        records.extend(pieces);
                        changed_rc.extend(keys);
                        runs += 1;
                        rec = RecordBuilder::new(&ctx, me);
                    }
                    rec.bytes = rec.bytes.saturating_add(estimate);
                    if let Some(ev) = &w.event {
                        let mk = (ev.stream.as_str(), ev.source.as_str());
                        marks.entry(mk).or_default().insert(ev.seq);
                        rec.marks.entry(mk).or_default().insert(ev.seq);
                    }
                    duplicate.push(false);
                    for (i, (key, m)) in w.ops.iter().enumerate() {
                        // A stamped write is timed by its event, not the clock, and skipped when
                        // a value stamped at or after it is already there.
                        let stamp =
                            w.stamps.get(i).copied().flatten().filter(|_| {
                                key.kind == KeyKind::Lww && matches!(m, Mutation::Set(_))
                            });
                        let own = w.own_dots.then_some(me);
                        if let Some(ts) = stamp
                            && superseded(rows.entry(key)?, ts, own)
                        {
                            continue;
                        }
                        let dot = ctx
                            .next_dot(me)
                            .map_err(|e| StoreError::Exhausted(e.to_string()))?;
                        let ts = (stamp.is_none()
                            && key.kind == KeyKind::Lww
                            && matches!(m, Mutation::Set(_)))
                        .then(|| hlc.now(wall_ms))
                        .transpose()
                        .map_err(|e| StoreError::Exhausted(e.to_string()))?
                        .or(stamp);
                        // In place: the join of the op's delta (its context is `dot` plus the
                        // dots it overwrote, all of this key's entry; `rec.dots` gets the latter,
                        // `dot` is in the record's fresh range).
                        let start = rec.dots.len();
                        let k = rows.apply_local(key, m, dot, ts, own, &mut rec.dots)?;
                        ctx.insert(dot);
                        rec.last = dot.seq;
                        if let Some(k) = k {
                            if rec.dots.len() > start {
                                rec.retired_at.push((start, rec.dots.len(), Arc::clone(&k)));
                            }
                            rec.keys.push(k);
                        }
                    }
                }
                let (pieces, keys) = rec.finish(&mut rows, me, target)?;
                records.extend(pieces);
                changed_rc.extend(keys);
                if runs > 0 {
                    // Several records: their ascending key lists merged (a stable sort merges runs).
                    changed_rc.sort();
                    changed_rc.dedup();
                }
                // Every dirty row is a changed key: written in the order just computed.
                rows.flush_sorted(&changed_rc)?;
                changed = changed_rc;
                if self.change_values {
                    for key in &changed {
                        let entry = rows.whole(key)?;
                        let v = entry
                            .as_deref()
                            .map_or_else(|| Value::empty(key.kind), Entry::value);
                        values.push((Key::clone(key), v));
                    }
                }
                for ((stream, source), seqs) in &marks {
                    let bytes =
                        codec::encode("dedup marks", seqs).map_err(|source| StoreError::Codec {
                            table: "dedup",
                            source,
                        })?;
                    let key = dedup_key(stream, source);
                    opened(&mut dedup_t, &txn, DEDUP)?
                        .insert(key.as_slice(), bytes.as_slice())
                        .map_err(StoreError::redb)?;
                    rows.inner.redo.put(RedoTable::Dedup, &key, &bytes);
                }
                let redo = std::mem::take(&mut rows.inner.redo);
                (rows.into_cache(), redo)
            };
        // Late events of applied writes go to their streams' late lanes, in this transaction.
        let late: Vec<&super::late::LateNote> = writes
            .iter()
            .zip(&duplicate)
            .enumerate()
            .filter_map(|(i, (w, d))| {
                let note = w.late.as_ref()?;
                let kept_out = *d || refused.iter().any(|r: &Refusal| r.writes.contains(&i));
                (!kept_out).then_some(note)
            })
            .collect();
        super::late::append(
            &txn,
            &late,
            self.options.limits.late_bytes_max,
            max,
            &mut redo,
        )?;
        let log_seq = (!records.is_empty()).then_some(self.log_end);
        let log_end = append_log(&txn, None, records, self.log_end, max, &mut redo)?;
        if log_seq.is_some() {
            // One open of `meta` for the three (each open and close of a table costs redb a
            // table-tree lookup and a root update at the commit).
            let mut meta = txn.open_table(META).map_err(StoreError::redb)?;
            meta_put_encoded(&mut meta, META_CONTEXT, &ctx, &mut redo)?;
            meta_put_encoded(&mut meta, META_HLC, &hlc.mark(), &mut redo)?;
            meta_put_encoded(
                &mut meta,
                META_LOG_BOUNDS,
                &(self.log_start, log_end),
                &mut redo,
            )?;
        }
        self.commit_group(txn, redo)?;
        // Only now, after the durable commit, does the in-memory mirror move.
        let skipped = duplicate.iter().filter(|d| **d).count() as u64;
        let mut applied_ops = 0u64;
        for (i, (w, d)) in writes.iter().zip(&duplicate).enumerate() {
            if !*d && !refused.iter().any(|r| r.writes.contains(&i)) {
                applied_ops += w.ops.len() as u64;
            }
        }
        self.stats.commits += 1;
        self.stats.duplicates += skipped;
        self.stats.ops_applied += applied_ops;
        self.ctx = ctx;
        self.hlc = hlc;
        self.log_end = log_end;
        self.row_cache = Some(row_cache);
        // The marks just committed become the writer's copy (bounded: it starts over when
        // full, and a miss only costs a table read).
        if self.dedup_cache.len().saturating_add(marks.len()) > DEDUP_CACHE_SOURCES_MAX {
            self.dedup_cache.clear();
        }
        self.dedup_cache.extend(
            marks
                .into_iter()
                .map(|((stream, source), seqs)| ((stream.to_owned(), source.to_owned()), seqs)),
        );
        Ok(LocalCommit {
            duplicate,
            changes: values,
            changed,
            log_seq,
            refused,
        })
    }
}

/// The table in `slot`, opened in `txn` on first use.
fn opened<'s, 't>(
    slot: &'s mut Option<redb::Table<'t, &'static [u8], &'static [u8]>>,
    txn: &'t redb::WriteTransaction,
    def: redb::TableDefinition<'static, &'static [u8], &'static [u8]>,
) -> Result<&'s mut redb::Table<'t, &'static [u8], &'static [u8]>, StoreError> {
    match slot {
        Some(table) => Ok(table),
        None => Ok(slot.insert(txn.open_table(def).map_err(StoreError::redb)?)),
    }
}

/// Sources whose committed dedup marks the writer keeps in memory before it starts over.
pub(crate) const DEDUP_CACHE_SOURCES_MAX: usize = 65_536;

/// Bytes of decoded entries a commit group keeps cached before it starts over (the cache is
/// write-through, so dropping it loses nothing).
const GROUP_CACHE_BYTES_MAX: usize = 32 << 20;

/// Estimated bytes a cached entry holds besides its payloads: per dot, per entry.
const DOT_BYTES_ESTIMATE: usize = 48;
const ENTRY_BYTES_ESTIMATE: usize = 64;
/// Estimated bytes of one set key remembered between groups (key, header flag, map slot).
const SET_TOUCH_BYTES_ESTIMATE: usize = 160;

/// A hash map keyed by keys of the group (foldhash: fast, seeded per process, so crafted key
/// names cannot aim at collisions made offline).
type GroupMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The rows of one local commit group: [`TxnRows`] with a write-back cache of the entries
/// the group touched, so each key is read and decoded once per group (an op reads its key
/// before the mutation, the watchers' values once more) and encoded and written once per group
/// however many of the group's ops change it (a hot counter costs one row write per group
/// instead of one per op). Each op mutates its cached entry in place
/// ([`mutate_in_place`]: exactly the join of its delta, with no delta built) and writes its
/// dot-index rows at once; a changed row is written when the cache starts over or at
/// [`GroupRows::flush`], which the group calls before it commits, so the transaction always
/// commits the rows the cache holds. Sets are not cached: an add or remove reads and writes
/// its one element row (O(1) whatever the set's size).
struct GroupRows<'r, 't> {
    inner: TxnRows<'r, 't>,
    /// Entry of each cached non-set key as the group now has it.
    cache: GroupMap<Arc<Key>, Box<Cached>>,
    /// Approximate bytes held by `cache` (sum of its estimates).
    cached_bytes: usize,
    /// The cached keys whose rows are behind their entries (`dirty`), to write at the flush.
    dirty: Vec<Arc<Key>>,
    /// How many cached entries are dirty (0: a flush has no row to write).
    pending: usize,
    /// Dot-index changes not yet written: `Some(value)` inserts the row, `None` deletes it. A
    /// dot the group indexed and then overwrote cancels out and never reaches the table; the
    /// rest are written dot-sorted at the flush.
    index: GroupMap<Dot, Option<Vec<u8>>>,
    /// The set keys the group changed.
    sets: GroupMap<Arc<Key>, SetTouch>,
    /// The keys of `sets` this group gave touched elements (a key may repeat): the only ones
    /// [`GroupRows::into_cache`] looks at, so handing the cache on costs what the group did,
    /// not what the cache holds (it can hold ~100,000 sets after a burst of set adds).
    sets_touched: Vec<Arc<Key>>,
}

/// The decoded rows a local commit leaves for the next one ([`RedbStore`]'s `row_cache`):
/// non-set entries exactly as committed and whether each set key's header row exists,
/// bounded by [`ROW_CACHE_BYTES_MAX`] between groups.
#[derive(Default)]
pub(crate) struct RowCache {
    map: GroupMap<Arc<Key>, Box<Cached>>,
    bytes: usize,
    /// Set keys with whether their header row exists (the elements a group touched are
    /// emptied by the group's log records).
    sets: GroupMap<Arc<Key>, SetTouch>,
}

/// Estimated bytes of decoded rows kept from one local commit group to the next (the cache
/// starts over at a group's start when it holds more).
const ROW_CACHE_BYTES_MAX: usize = 16 << 20;

/// One cached entry of a [`GroupRows`].
struct Cached {
    /// The key (the map's own `Arc`, handed to the group's record and change lists).
    key: Arc<Key>,
    /// `None`: no row.
    entry: Option<Entry>,
    /// Estimated size.
    bytes: usize,
    /// Whether the table's row is behind `entry` (written at the next flush).
    dirty: bool,
}

/// What a group did to one set.
struct SetTouch {
    key: Arc<Key>,
    /// Whether the set's header row exists (`None`: not looked at yet).
    header: Option<bool>,
    /// The elements changed since the last [`GroupRows::record_part`] of the set, each with
    /// its row as the group left it: an add leaves exactly the add's dot, a remove no row.
    touched: BTreeMap<String, Option<Dot>>,
}

/// Writes `c`'s entry to `key`'s row if the row is behind it; returns whether it did.
///
/// # Errors
/// [`StoreError::TooLarge`] for a row over `record_bytes_max`; storage failures.
fn write_cached(
    inner: &mut TxnRows<'_, '_>,
    key: &Key,
    c: &mut Cached,
) -> Result<bool, StoreError> {
    if !c.dirty {
        return Ok(false);
    }
    let kb = key_bytes(key);
    match &c.entry {
        Some(e) => {
            let bytes = encode_bounded("state row", "rows", e, inner.record_bytes_max)?;
            inner.insert(RedoTable::Rows, kb.as_slice(), bytes.as_slice())?;
        }
        None => {
            inner.remove(RedoTable::Rows, kb.as_slice())?;
        }
    }
    c.dirty = false;
    Ok(true)
}

/// The estimated cached size of a non-set entry.
fn entry_bytes(key: &Key, e: Option<&Entry>) -> usize {
    let payload = match e {
        None | Some(Entry::ORSet(_)) => 0,
        Some(Entry::GCounter(f)) => f.len() * DOT_BYTES_ESTIMATE,
        Some(Entry::PNCounter(f)) => f.len() * DOT_BYTES_ESTIMATE,
        Some(Entry::Lww(f)) => f
            .iter()
            .map(|(_, (_, v))| DOT_BYTES_ESTIMATE + v.len())
            .sum(),
        Some(Entry::MvReg(f)) => f.iter().map(|(_, v)| DOT_BYTES_ESTIMATE + v.len()).sum(),
    };
    payload + key.name.len() + ENTRY_BYTES_ESTIMATE
}

impl<'r, 't> GroupRows<'r, 't> {
    /// Group rows over `inner`, starting from the rows the last local commit left (`cache`:
    /// they must be exactly what `inner`'s tables hold).
    fn new(inner: TxnRows<'r, 't>, cache: RowCache) -> Self {
        let held = cache
            .bytes
            .saturating_add(cache.sets.len().saturating_mul(SET_TOUCH_BYTES_ESTIMATE));
        let cache = if held > ROW_CACHE_BYTES_MAX {
            RowCache::default()
        } else {
            cache
        };
        Self {
            inner,
            cache: cache.map,
            cached_bytes: cache.bytes,
            dirty: Vec::new(),
            pending: 0,
            index: GroupMap::default(),
            sets: cache.sets,
            sets_touched: Vec::new(),
        }
    }

    /// The cached rows, for the next group once this one has committed (call after
    /// [`GroupRows::flush`]: every entry is then what the tables hold).
    fn into_cache(self) -> RowCache {
        let mut sets = self.sets;
        // Every touched element went into the group's records; a set left with some (only
        // when a record failed to finish, which fails the group) is forgotten. Only the sets
        // this group touched can hold any: the cache it started from held none.
        for key in &self.sets_touched {
            if sets.get(key).is_some_and(|t| !t.touched.is_empty()) {
                sets.remove(key);
            }
        }
        RowCache {
            map: self.cache,
            bytes: self.cached_bytes,
            sets,
        }
    }

    /// Applies one local mutation of `key` at `dot` (in place: the join of its delta), writes
    /// its dot-index changes, and appends to `dots` the dots the op overwrote or removed (its
    /// delta's context without `dot`). With `own` (the write's `own_dots`), adds and register
    /// sets overwrite only that replica's dots. Returns the key when its entry changed.
    ///
    /// # Errors
    /// [`StoreError::InvalidOp`] when the mutation does not apply; storage failures.
    fn apply_local(
        &mut self,
        key: &Key,
        m: &Mutation,
        dot: Dot,
        ts: Option<tidemark_crdts::Timestamp>,
        own: Option<ReplicaId>,
        dots: &mut Vec<Dot>,
    ) -> Result<Option<Arc<Key>>, StoreError> {
        if per_element(key.kind) {
            return self.apply_set(key, m, dot, own.is_some(), dots);
        }
        let start = dots.len();
        // One hash lookup when the key is cached (the common case), two after a load.
        let c = match self.cache.get_mut(key) {
            Some(c) => c,
            None => {
                self.load(key)?;
                self.cache.get_mut(key).ok_or_else(|| {
                    StoreError::Corrupt(format!("{key}: group cache lost its entry"))
                })?
            }
        };
        let was_none = c.entry.is_none();
        if own.is_some() {
            mutate_own_in_place(key.kind, &mut c.entry, m, dot, ts, dots)
        } else {
            mutate_in_place(key.kind, &mut c.entry, m, dot, ts, dots)
        }
        .map_err(|e| StoreError::InvalidOp(format!("{key}: {e}")))?;
        let changed = !(was_none && c.entry.is_none());
        let rc = Arc::clone(&c.key);
        if changed && !c.dirty {
            c.dirty = true;
            self.pending += 1;
            self.dirty.push(Arc::clone(&rc));
        }
        let bytes = entry_bytes(key, c.entry.as_ref());
        self.cached_bytes = self.cached_bytes.saturating_sub(c.bytes) + bytes;
        c.bytes = bytes;
        // Every mutation but a delete leaves `dot` in the entry (`mutate_in_place`).
        let holds = !matches!(m, Mutation::Delete);
        // Counter dots have no index rows ([`indexed`]).
        if indexed(key.kind) {
            for &d in &dots[start..] {
                self.index_remove(d);
            }
            if holds {
                self.index_insert(dot, key_bytes(key));
            }
        }
        if self.cached_bytes > GROUP_CACHE_BYTES_MAX {
            // Pending rows reach the table first, so starting over loses nothing.
            self.flush()?;
            self.cache.clear();
            self.cached_bytes = 0;
        }
        Ok(changed.then_some(rc))
    }

    /// [`GroupRows::apply_local`] for a set: an add or remove reads and writes the element's
    /// one row (and the header row when the set gains its first or loses its last element);
    /// a delete reads the whole set.
    fn apply_set(
        &mut self,
        key: &Key,
        m: &Mutation,
        dot: Dot,
        own: bool,
        dots: &mut Vec<Dot>,
    ) -> Result<Option<Arc<Key>>, StoreError> {
        let max = self.inner.record_bytes_max;
        let rc = match self.sets.get(key) {
            Some(t) => Arc::clone(&t.key),
            None => {
                let rc = Arc::new(key.clone());
                self.sets.insert(
                    Arc::clone(&rc),
                    SetTouch {
                        key: Arc::clone(&rc),
                        header: None,
                        touched: BTreeMap::new(),
                    },
                );
                rc
            }
        };
        let changed = match m {
            Mutation::Add(e) | Mutation::Remove(e) => {
                let ek = elem_key(key, e);
                // One B-tree operation reads the element's row and replaces or removes it.
                let old = if let Mutation::Add(_) = m {
                    let bytes =
                        codec::encode("set element", &DotSet::single(dot)).map_err(|source| {
                            StoreError::Codec {
                                table: "elems",
                                source,
                            }
                        })?;
                    let prev = self
                        .inner
                        .elems
                        .insert(ek.as_slice(), bytes.as_slice())
                        .map_err(StoreError::redb)?;
                    let prev = prev.map(|g| decode_elem(g.value(), max)).transpose()?;
                    self.inner.redo.put(RedoTable::Elems, &ek, &bytes);
                    // An own add leaves the other replicas' dots of the element in its row.
                    match prev {
                        Some(old) if own && old.iter().any(|d| d.replica != dot.replica) => {
                            let (mine, theirs): (Vec<Dot>, Vec<Dot>) =
                                old.iter().partition(|d| d.replica == dot.replica);
                            let mut kept = theirs;
                            kept.push(dot);
                            let row = codec::encode("set element", &DotSet::from_dots(kept))
                                .map_err(|source| StoreError::Codec {
                                    table: "elems",
                                    source,
                                })?;
                            self.inner
                                .insert(RedoTable::Elems, ek.as_slice(), row.as_slice())?;
                            Some(DotSet::from_dots(mine))
                        }
                        other => other,
                    }
                } else {
                    let prev = self
                        .inner
                        .elems
                        .remove(ek.as_slice())
                        .map_err(StoreError::redb)?;
                    let prev = prev.map(|g| decode_elem(g.value(), max)).transpose()?;
                    self.inner.redo.del(RedoTable::Elems, &ek);
                    prev
                };
                if let Some(old) = &old {
                    for d in old.iter() {
                        self.index_remove(*d);
                        dots.push(*d);
                    }
                }
                let header = self.sets.get(key).and_then(|t| t.header);
                let changed = if let Mutation::Add(_) = m {
                    self.index_insert(dot, ek);
                    // The element existed: so does the header. Otherwise look unless known.
                    if header != Some(true) && old.is_none() {
                        let kb = key_bytes(key);
                        let absent = header == Some(false)
                            || self.inner.rows.get_bytes(kb.as_slice())?.is_none();
                        if absent {
                            self.inner
                                .insert(RedoTable::Rows, kb.as_slice(), [].as_slice())?;
                        }
                    }
                    self.set_header(key, true);
                    true
                } else if old.is_some() {
                    let left = set_has_elements(&*self.inner.elems, key)?;
                    if !left {
                        self.inner
                            .remove(RedoTable::Rows, key_bytes(key).as_slice())?;
                    }
                    self.set_header(key, left);
                    true
                } else {
                    false
                };
                if changed && let Some(t) = self.sets.get_mut(key) {
                    let row = matches!(m, Mutation::Add(_)).then_some(dot);
                    if t.touched.is_empty() {
                        self.sets_touched.push(Arc::clone(&t.key));
                    }
                    t.touched.insert(e.clone(), row);
                }
                changed
            }
            Mutation::Delete => {
                // `put_set` writes the index directly: the pending changes go first.
                self.flush_index()?;
                let whole = read_set(&*self.inner.elems, key, max)?;
                let changed = !whole.is_bottom();
                if changed {
                    let change = put_set(&mut self.inner, key, Some(&whole), None)?;
                    dots.extend(change.removed);
                }
                self.set_header(key, false);
                // No element row is left: the removals travel in the record's context.
                if let Some(t) = self.sets.get_mut(key) {
                    t.touched.clear();
                }
                changed
            }
            other => {
                return Err(StoreError::InvalidOp(format!(
                    "{key}: {} does not apply to a set",
                    other.name()
                )));
            }
        };
        Ok(changed.then_some(rc))
    }

    /// Indexes `dot` to `value` (a row key or an element key), at the next flush.
    fn index_insert(&mut self, dot: Dot, value: Vec<u8>) {
        self.index.insert(dot, Some(value));
    }

    /// Deletes `dot`'s index row, at the next flush (nothing, if the group indexed it itself).
    fn index_remove(&mut self, dot: Dot) {
        match self.index.get(&dot) {
            Some(Some(_)) => {
                self.index.remove(&dot);
            }
            _ => {
                self.index.insert(dot, None);
            }
        }
    }

    /// Writes the pending dot-index changes, ascending by dot.
    fn flush_index(&mut self) -> Result<(), StoreError> {
        let mut ops: Vec<(Dot, Option<Vec<u8>>)> = self.index.drain().collect();
        ops.sort_unstable_by_key(|(d, _)| *d);
        for (d, value) in ops {
            match value {
                Some(v) => {
                    self.inner
                        .insert(RedoTable::Dots, dot_bytes(d).as_slice(), v.as_slice())?;
                }
                None => {
                    self.inner
                        .remove(RedoTable::Dots, dot_bytes(d).as_slice())?;
                }
            }
        }
        Ok(())
    }

    /// Records whether the set `key`'s header row exists.
    fn set_header(&mut self, key: &Key, present: bool) {
        if let Some(t) = self.sets.get_mut(key) {
            t.header = Some(present);
        }
    }

    /// The whole current entry of `key` (a set is assembled from its rows: O(set)).
    fn whole(&mut self, key: &Key) -> Result<Option<Cow<'_, Entry>>, StoreError> {
        if per_element(key.kind) {
            return Ok(self.inner.get(key)?.map(Cow::Owned));
        }
        Ok(self.entry(key)?.map(Cow::Borrowed))
    }

    /// The part of `key`'s entry holding the dots of the record being finished (`is_fresh`):
    /// for a set, the elements changed since the last call for `key`, from the rows the group
    /// left in memory (each holds only the dot of its add, fresh by construction); for other
    /// kinds, the cached entry filtered to its fresh dots, writing the key's row on the way
    /// when it is behind (the record's keys come in key order, so this is the flush's sorted
    /// pass too; a row a later record changes again is written again at the flush).
    ///
    /// # Errors
    /// As [`GroupRows::flush`].
    fn record_part(
        &mut self,
        key: &Key,
        is_fresh: &impl Fn(&Dot) -> bool,
    ) -> Result<Option<Entry>, StoreError> {
        if per_element(key.kind) {
            let Some(touched) = self
                .sets
                .get_mut(key)
                .map(|t| std::mem::take(&mut t.touched))
            else {
                return Ok(None);
            };
            let mut map: DotMap<String, DotSet> = DotMap::default();
            for (name, row) in touched {
                if let Some(dot) = row {
                    map.set(name, DotSet::single(dot));
                }
            }
            return Ok((!map.is_empty()).then_some(Entry::ORSet(map)));
        }
        if !self.cache.contains_key(key) {
            self.load(key)?;
        }
        let Some(c) = self.cache.get_mut(key) else {
            return Ok(None);
        };
        let part = c.entry.as_ref().map(|e| fresh_part(e, is_fresh));
        let wrote = write_cached(&mut self.inner, key, c)?;
        self.pending -= usize::from(wrote);
        Ok(part)
    }

    /// Writes every changed row to its table (encoding each once). Nothing is dropped.
    ///
    /// # Errors
    /// [`StoreError::TooLarge`] for a row over `record_bytes_max` (it could never be read
    /// back); storage failures.
    fn flush(&mut self) -> Result<(), StoreError> {
        self.flush_index()?;
        let mut dirty = std::mem::take(&mut self.dirty);
        // Key order: each B-tree leaf is visited once, in order.
        dirty.sort_unstable();
        for key in dirty {
            self.write_row(&key)?;
        }
        Ok(())
    }

    /// [`GroupRows::flush`] given the group's changed keys, ascending and distinct (every
    /// dirty row is among them): no second sort. Dirty rows missing from `keys` (none, when
    /// the caller is right) are still written.
    ///
    /// # Errors
    /// As [`GroupRows::flush`].
    fn flush_sorted(&mut self, keys: &[Arc<Key>]) -> Result<(), StoreError> {
        self.flush_index()?;
        if self.pending == 0 {
            self.dirty.clear();
            return Ok(());
        }
        let mut written = 0usize;
        for key in keys {
            written += usize::from(self.write_row(key)?);
        }
        if written < self.dirty.len() {
            return self.flush();
        }
        self.dirty.clear();
        Ok(())
    }

    /// Writes `key`'s cached entry to its row if the row is behind it; returns whether it did.
    fn write_row(&mut self, key: &Key) -> Result<bool, StoreError> {
        let Some(c) = self.cache.get_mut(key) else {
            return Ok(false);
        };
        let wrote = write_cached(&mut self.inner, key, c)?;
        self.pending -= usize::from(wrote);
        Ok(wrote)
    }

    /// The current entry of `key`, read from the table (and cached) on first use.
    fn entry(&mut self, key: &Key) -> Result<Option<&Entry>, StoreError> {
        if !self.cache.contains_key(key) {
            self.load(key)?;
        }
        Ok(self.cache.get(key).and_then(|c| c.entry.as_ref()))
    }

    /// Reads `key`'s row into the cache (starting the cache over first when it is full).
    fn load(&mut self, key: &Key) -> Result<(), StoreError> {
        {
            let entry = match self.inner.rows.get_bytes(key_bytes(key).as_slice())? {
                Some(g) => Some(decode_entry(&g, self.inner.record_bytes_max)?),
                None => None,
            };
            let bytes = entry_bytes(key, entry.as_ref());
            if self.cached_bytes + bytes > GROUP_CACHE_BYTES_MAX {
                // Pending rows reach the table first, so starting over loses nothing.
                self.flush()?;
                self.cache.clear();
                self.cached_bytes = 0;
            }
            let rc = Arc::new(key.clone());
            self.cached_bytes += bytes;
            self.cache.insert(
                Arc::clone(&rc),
                Box::new(Cached {
                    key: rc,
                    entry,
                    bytes,
                    dirty: false,
                }),
            );
        }
        Ok(())
    }
}

/// True when `current` already holds an LWW value stamped at or after `ts`: a write stamped
/// `ts` would not change what the register reads, so it is skipped.
/// With `own`, only that replica's own value counts (its writes cover only its own dots).
fn superseded(current: Option<&Entry>, ts: Timestamp, own: Option<ReplicaId>) -> bool {
    match current {
        Some(Entry::Lww(f)) => f
            .iter()
            .any(|(d, (t, _))| *t >= ts && own.is_none_or(|me| d.replica == me)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OpenOptions;
    use tidemark_crdts::{ReplicaId, Store};

    use crate::store::test_rng::Rng;

    /// The row cache a local group hands on keeps the sets of earlier groups and none of the
    /// elements a group touched (they are in its log records): only the sets the group itself
    /// touched are looked at, so a lone add after a burst over many sets does not pay for the
    /// whole cache (issue 21: `http_throughput`'s single ops after its batched set adds).
    #[test]
    fn the_row_cache_keeps_earlier_sets_and_no_touched_elements() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = RedbStore::open(
            dir.path(),
            OpenOptions {
                new_replica_id: Some(ReplicaId(1)),
                ..OpenOptions::default()
            },
        )
        .expect("open");
        let add = |set: usize, e: usize| LocalWrite {
            ops: vec![(
                Key::new(KeyKind::ORSet, format!("s{set}")),
                Mutation::Add(format!("\"e{e}\"")),
            )],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        // A burst: 500 sets in one group.
        let burst: Vec<LocalWrite> = (0..500).map(|i| add(i, 0)).collect();
        s.commit_local(&burst, 1_000).expect("burst");
        let cached = |s: &RedbStore| {
            let c = s.row_cache.as_ref().expect("a local commit leaves its cache");
            assert!(
                c.sets.values().all(|t| t.touched.is_empty()),
                "a touched element outlived its group"
            );
            c.sets.len()
        };
        assert_eq!(cached(&s), 500);
        // Lone adds: 40 to sets of the burst, then 10 to new sets.
        let targets: Vec<usize> = (0..40).map(|i| i * 12).chain(500..510).collect();
        for (i, set) in targets.iter().enumerate() {
            s.commit_local(&[add(*set, i + 1)], 1_001 + i as u64)
                .expect("lone add");
            assert_eq!(cached(&s), 500 + i.saturating_sub(39));
        }
        for (i, set) in targets.iter().enumerate() {
            let key = Key::new(KeyKind::ORSet, format!("s{set}"));
            let Some(Value::ORSet(elems)) = s.reader().get(&key).expect("read") else {
                panic!("{key} is a set with elements");
            };
            assert!(
                elems.contains(&format!("\"e{}\"", i + 1)),
                "{key}: {elems:?}"
            );
        }
    }

    /// The writer keeps decoded rows from one local commit to the next: a group that fails
    /// after mutating cached entries must leave nothing of itself there, and rows another
    /// transaction changed (a remote delta) must be read again.
    #[test]
    fn the_row_cache_forgets_failed_groups_and_rows_changed_elsewhere() {
        let dir_a = tempfile::tempdir().expect("tempdir");
        let dir_b = tempfile::tempdir().expect("tempdir");
        let mut options = OpenOptions {
            new_replica_id: Some(ReplicaId(1)),
            ..OpenOptions::default()
        };
        options.limits.record_bytes_max = 4096;
        let mut a = RedbStore::open(dir_a.path(), options.clone()).expect("open a");
        let mut b = RedbStore::open(
            dir_b.path(),
            OpenOptions {
                new_replica_id: Some(ReplicaId(2)),
                ..options.clone()
            },
        )
        .expect("open b");
        let c = Key::new(KeyKind::GCounter, "c");
        let r = Key::new(KeyKind::Lww, "r");
        let write = |ops: Vec<(Key, Mutation)>| LocalWrite {
            ops,
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        let value = |s: &RedbStore, k: &Key| s.reader().get(k).expect("read");
        a.commit_local(
            &[write(vec![
                (c.clone(), Mutation::Inc(5)),
                (r.clone(), Mutation::Set("\"one\"".into())),
            ])],
            1_000,
        )
        .expect("first group");
        // Mutates the cached counter and register, then fails at flush: a row over the limit.
        let big = format!("\"{}\"", "x".repeat(5000));
        let failed = a.commit_local(
            &[write(vec![
                (c.clone(), Mutation::Inc(100)),
                (r.clone(), Mutation::Set(big)),
            ])],
            1_001,
        );
        assert!(
            matches!(failed, Err(StoreError::TooLarge { .. })),
            "{failed:?}"
        );
        assert_eq!(value(&a, &c), Some(Value::GCounter(5)));
        a.commit_local(&[write(vec![(c.clone(), Mutation::Inc(1))])], 1_002)
            .expect("group after the failure");
        assert_eq!(
            value(&a, &c),
            Some(Value::GCounter(6)),
            "the failed +100 is gone"
        );
        assert_eq!(value(&a, &r), Some(Value::Lww(Some("\"one\"".into()))));
        // A remote write to both keys lands between two local groups.
        b.commit_local(
            &[write(vec![
                (c.clone(), Mutation::Inc(10)),
                (r.clone(), Mutation::Set("\"two\"".into())),
            ])],
            2_000_000,
        )
        .expect("b writes");
        let delta = match b.deltas_since(a.ctx(), 1 << 20).expect("deltas") {
            super::super::DeltasSince::Deltas { delta, .. } => delta,
            super::super::DeltasSince::NeedsStateTransfer => panic!("b's log is whole"),
        };
        a.apply_remote_delta(crate::proto::PeerId(2), delta, 2_000_000)
            .expect("storage")
            .expect("valid delta");
        a.commit_local(&[write(vec![(c.clone(), Mutation::Inc(1))])], 2_000_001)
            .expect("group after the remote delta");
        assert_eq!(value(&a, &c), Some(Value::GCounter(17)), "5 + 1 + 10 + 1");
        // The register's remote value (a later clock) is what the next local write overwrites:
        // its dot must be removed from the index, which only a fresh read of the row knows.
        a.commit_local(
            &[write(vec![(r.clone(), Mutation::Set("\"three\"".into()))])],
            2_000_002,
        )
        .expect("register write");
        assert_eq!(value(&a, &r), Some(Value::Lww(Some("\"three\"".into()))));
        // A set's header row, remembered as present across groups, removed by a remote delete:
        // the next local add must create it again.
        let set = Key::new(KeyKind::ORSet, "s");
        a.commit_local(
            &[write(vec![(set.clone(), Mutation::Add("\"e1\"".into()))])],
            2_000_003,
        )
        .expect("set add");
        a.commit_local(
            &[write(vec![(set.clone(), Mutation::Add("\"e2\"".into()))])],
            2_000_004,
        )
        .expect("second set add (header known)");
        let ship = |from: &RedbStore, to: &mut RedbStore| {
            let delta = match from.deltas_since(to.ctx(), 1 << 20).expect("deltas") {
                super::super::DeltasSince::Deltas { delta, .. } => delta,
                super::super::DeltasSince::NeedsStateTransfer => panic!("log is whole"),
            };
            to.apply_remote_delta(crate::proto::PeerId(9), delta, 3_000_000)
                .expect("storage")
                .expect("valid delta");
        };
        ship(&a, &mut b);
        b.commit_local(&[write(vec![(set.clone(), Mutation::Delete)])], 3_000_000)
            .expect("b deletes the set");
        ship(&b, &mut a);
        assert_eq!(value(&a, &set), None, "the remote delete emptied the set");
        a.commit_local(
            &[write(vec![(set.clone(), Mutation::Add("\"e3\"".into()))])],
            3_000_001,
        )
        .expect("add after the remote delete");
        assert_eq!(
            value(&a, &set),
            Some(Value::ORSet(vec!["\"e3\"".into()])),
            "the header row is back"
        );
        a.verify().expect("index and context agree with the rows");
    }

    fn sorted_dots(e: &Entry) -> Vec<Dot> {
        let mut out = Vec::new();
        e.for_each_dot(&mut |d| out.push(d));
        out.sort_unstable();
        out
    }

    fn random_op(rng: &mut Rng) -> (Key, Mutation) {
        let hot = rng.below(3);
        match rng.below(9) {
            0 | 1 => (
                Key::new(KeyKind::GCounter, format!("g{hot}")),
                Mutation::Inc(1 + rng.below(5)),
            ),
            2 => (
                Key::new(KeyKind::PNCounter, format!("p{hot}")),
                if rng.below(2) == 0 {
                    Mutation::Inc(1 + rng.below(5))
                } else {
                    Mutation::Dec(1 + rng.below(5))
                },
            ),
            3 | 4 => (
                Key::new(KeyKind::ORSet, format!("s{hot}")),
                Mutation::Add(format!("\"e{}\"", rng.below(8))),
            ),
            5 => (
                Key::new(KeyKind::ORSet, format!("s{hot}")),
                Mutation::Remove(format!("\"e{}\"", rng.below(8))),
            ),
            6 => (
                Key::new(KeyKind::ORSet, format!("s{hot}")),
                Mutation::Delete,
            ),
            7 => (
                Key::new(KeyKind::Lww, format!("l{hot}")),
                if rng.below(5) == 0 {
                    Mutation::Delete
                } else {
                    Mutation::Set(rng.below(100).to_string())
                },
            ),
            _ => (
                Key::new(KeyKind::MvReg, format!("m{hot}")),
                if rng.below(5) == 0 {
                    Mutation::Delete
                } else {
                    Mutation::Set(rng.below(100).to_string())
                },
            ),
        }
    }

    /// More sources than the writer's dedup cache holds (`DEDUP_CACHE_SOURCES_MAX`), in groups
    /// of 10,000 in relaxed durability: once the cache has started over, retries of the first
    /// and last sources' events are still all duplicates (read back from the table), and their
    /// next events apply exactly once.
    #[test]
    fn retries_stay_duplicates_past_the_dedup_cache_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = RedbStore::open(
            dir.path(),
            OpenOptions {
                new_replica_id: Some(ReplicaId(3)),
                durability: crate::Durability::Relaxed,
                ..OpenOptions::default()
            },
        )
        .expect("open");
        let sources = DEDUP_CACHE_SOURCES_MAX as u64 + 4_464;
        let c = Key::new(KeyKind::GCounter, "events");
        let event = |src: u64, seq: u64| LocalWrite {
            ops: vec![(c.clone(), Mutation::Inc(1))],
            event: Some(EventId {
                stream: "s".into(),
                source: format!("source-{src}"),
                seq,
            }),
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        let all: Vec<u64> = (0..sources).collect();
        for chunk in all.chunks(10_000) {
            let writes: Vec<LocalWrite> = chunk.iter().map(|&s| event(s, 1)).collect();
            let out = store.commit_local(&writes, 1_000).expect("commit");
            assert!(out.duplicate.iter().all(|d| !d));
        }
        assert_eq!(
            store.reader().get(&c).expect("read"),
            Some(Value::GCounter(sources))
        );
        let probe: Vec<u64> = (0..500).chain(sources - 500..sources).collect();
        let retry: Vec<LocalWrite> = probe.iter().map(|&s| event(s, 1)).collect();
        let out = store.commit_local(&retry, 1_001).expect("retry");
        assert!(
            out.duplicate.iter().all(|d| *d),
            "every retry is a duplicate"
        );
        let next: Vec<LocalWrite> = probe.iter().map(|&s| event(s, 2)).collect();
        let out = store.commit_local(&next, 1_002).expect("next events");
        assert!(out.duplicate.iter().all(|d| !d));
        let out = store.commit_local(&next, 1_003).expect("their retry");
        assert!(out.duplicate.iter().all(|d| *d));
        assert_eq!(
            store.reader().get(&c).expect("read"),
            Some(Value::GCounter(sources + probe.len() as u64)),
            "each event counted once"
        );
        store.verify().expect("invariants");
    }

    /// Groups of mixed ops on a few hot keys (many ops of one group hit the same key, so the
    /// write-back rows and the untracked counter dots are exercised): after every group each
    /// touched key reads exactly what a sequential in-memory model holds, the watchers' values
    /// match, `verify()` holds (context, dot index without counter dots), dedup marks turn
    /// retries into duplicates, and all of it survives a reopen. In both durabilities (relaxed
    /// commits are visible at once; the reopen follows a `sync`).
    #[test]
    fn commit_groups_match_a_sequential_model_and_survive_reopen() {
        commit_groups_match_the_model(crate::Durability::Immediate);
        commit_groups_match_the_model(crate::Durability::Relaxed);
    }

    fn commit_groups_match_the_model(durability: crate::Durability) {
        let seed = std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x7EA5_u64);
        let dir = tempfile::tempdir().expect("tempdir");
        let me = ReplicaId(7);
        let options = OpenOptions {
            new_replica_id: Some(me),
            durability,
            ..OpenOptions::default()
        };
        let mut rng = Rng(seed);
        let mut model = Store::new();
        let mut keys: Vec<Key> = Vec::new();
        {
            let mut store = RedbStore::open(dir.path(), options.clone()).expect("open");
            let mut seq = 0u64;
            for group in 0..60u64 {
                let n = 1 + rng.below(40);
                let mut writes = Vec::new();
                for _ in 0..n {
                    let ops: Vec<(Key, Mutation)> =
                        (0..1 + rng.below(3)).map(|_| random_op(&mut rng)).collect();
                    seq += 1;
                    writes.push(LocalWrite {
                        ops,
                        event: Some(EventId {
                            stream: "s".into(),
                            source: format!("src{}", seq % 3),
                            seq: seq / 3,
                        }),
                        stamps: Vec::new(),
                        late: None,
                        own_dots: false,
                    });
                }
                let out = store.commit_local(&writes, 1_000 + group).expect("commit");
                assert!(out.duplicate.iter().all(|d| !d), "seed {seed}");
                for w in &writes {
                    for (key, m) in &w.ops {
                        let ts = (key.kind == KeyKind::Lww).then(|| tidemark_crdts::Timestamp {
                            physical_ms: model.context().len(),
                            logical: 0,
                            replica: me,
                        });
                        model.mutate(me, key, m, ts).expect("model applies");
                        keys.push(key.clone());
                    }
                }
                keys.sort();
                keys.dedup();
                let reader = store.reader();
                for key in &keys {
                    let got = reader
                        .get(key)
                        .expect("read")
                        .unwrap_or_else(|| Value::empty(key.kind));
                    assert_eq!(got, model.get(key), "seed {seed}, group {group}, {key}");
                }
                for (key, value) in &out.changes {
                    assert_eq!(
                        value,
                        &model.get(key),
                        "seed {seed}, watcher value of {key}"
                    );
                }
                assert_eq!(store.ctx(), model.context(), "seed {seed}");
                store.verify().expect("store invariants");
                // The log carries exactly what the groups did: replayed from nothing, it
                // rebuilds the model's entries and context.
                let mut replayed = Store::new();
                let mut since = CausalContext::new();
                loop {
                    match store.deltas_since(&since, 1 << 20).expect("deltas") {
                        super::super::DeltasSince::Deltas { delta, more } => {
                            replayed.apply(delta.state);
                            since = replayed.context().clone();
                            if !more {
                                break;
                            }
                        }
                        super::super::DeltasSince::NeedsStateTransfer => {
                            panic!("seed {seed}: the log was not compacted")
                        }
                    }
                }
                // (LWW timestamps differ from the model's: compare values and dots.)
                let shape = |s: &Store| -> Vec<(Key, Value, Vec<Dot>)> {
                    s.entries()
                        .iter()
                        .map(|(k, e)| (k.clone(), e.value(), sorted_dots(e)))
                        .collect()
                };
                assert_eq!(
                    shape(&replayed),
                    shape(&model),
                    "seed {seed}, group {group}: the log replayed"
                );
                assert_eq!(replayed.context(), model.context(), "seed {seed}");
                // A retry of the whole group is all duplicates and changes nothing.
                let again = store.commit_local(&writes, 2_000 + group).expect("retry");
                assert!(again.duplicate.iter().all(|d| *d), "seed {seed}");
                assert!(again.changed.is_empty(), "seed {seed}");
            }
            store.sync().expect("sync before the reopen");
        }
        let store = RedbStore::open(dir.path(), options).expect("reopen");
        store.verify().expect("invariants after reopen");
        let reader = store.reader();
        for key in &keys {
            let got = reader
                .get(key)
                .expect("read")
                .unwrap_or_else(|| Value::empty(key.kind));
            assert_eq!(got, model.get(key), "seed {seed}, after reopen, {key}");
        }
    }
}

#[cfg(test)]
mod snapshot_reader_tests {
    use super::*;
    use crate::store::OpenOptions;
    use tidemark_crdts::ReplicaId;

    /// A snapshot reader sees one committed state for all its reads: a commit after it was
    /// taken is invisible through it (and its clones), visible to a plain reader.
    #[test]
    fn a_snapshot_reader_reads_one_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = OpenOptions {
            new_replica_id: Some(ReplicaId(1)),
            ..OpenOptions::default()
        };
        let mut s = RedbStore::open(dir.path(), options).expect("open");
        let c = Key::new(KeyKind::GCounter, "c");
        let inc = |n| LocalWrite {
            ops: vec![(c.clone(), Mutation::Inc(n))],
            ..LocalWrite::default()
        };
        s.commit_local(&[inc(1)], 1_000).expect("commit");
        let snap = s.reader().snapshot().expect("snapshot");
        let ctx = snap.context().expect("ctx");
        s.commit_local(&[inc(2)], 2_000).expect("commit");
        for r in [&snap, &snap.clone()] {
            assert_eq!(r.get(&c).expect("get"), Some(Value::GCounter(1)));
            assert_eq!(r.context().expect("ctx"), ctx);
            assert_eq!(
                r.list(KeyKind::GCounter, "", None, 10).expect("list").len(),
                1
            );
        }
        assert_eq!(s.reader().get(&c).expect("get"), Some(Value::GCounter(3)));
    }
}
