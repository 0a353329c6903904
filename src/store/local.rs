//! Local commit groups: many callers' writes in one durable transaction (DESIGN.md A5, A8, D2).

use super::error::StoreError;
use super::rows::{
    TxnRows, decode_entry, indexed, open_state_tables, per_element, put_set, read_elems,
};
use super::split::{split_delta, write_bytes_estimate};
use super::tables::{
    DEDUP, LOG, LogRecord, META_CONTEXT, META_HLC, META_LOG_BOUNDS, dedup_key, dot_bytes, key_bytes,
};
use super::{RedbStore, meta_put};
use crate::codec;
use crate::model::Delta;
use redb::ReadableTable;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;
use tidemark_crdts::store::{delta_mutation, join_delta};
use tidemark_crdts::{
    Causal, CausalContext, DedupMarks, Dot, DotMap, DotStore, Entry, IntervalSet, Key, KeyKind,
    Mutation, Rows, Value,
};

/// Identity of an ingested event: `(stream, source, seq)`; a retry with the same identity is
/// a no-op (DESIGN.md A8).
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalWrite {
    /// The operations, already validated by the caller.
    pub ops: Vec<(Key, Mutation)>,
    /// Present for idempotent events and ops carrying `source`/`seq`.
    pub event: Option<EventId>,
}

/// A write of a commit group refused because its event's seq would open a dedup range beyond
/// `limits.dedup_ranges_max` for its source. Nothing of that write was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupRefusal {
    /// Position of the write in the group.
    pub index: usize,
    /// The event's source.
    pub source: String,
    /// The source's disjoint ranges.
    pub ranges: usize,
}

/// What a committed group did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalCommit {
    /// Per write, in order: true when it was skipped as a duplicate.
    pub duplicate: Vec<bool>,
    /// Changed keys with their new values (for watchers), ascending by key; empty when the
    /// store was told not to compute them ([`RedbStore::set_change_values`]).
    pub changes: Vec<(Key, Value)>,
    /// The keys the group changed, ascending (always filled).
    pub changed: Vec<Key>,
    /// The log sequence number of the group's first log record (`None` when nothing was
    /// applied). A group is logged as one or more consecutive records, each within
    /// `limits.message_bytes_target`; they end at the log end when the commit returns.
    pub log_seq: Option<u64>,
    /// Writes refused for too many dedup gaps (not applied; also not duplicates).
    pub refused: Vec<DedupRefusal>,
}

/// True when inserting `seq` into `seen` adds a range (neither neighbour is present).
fn opens_range(seen: &IntervalSet, seq: u64) -> bool {
    let below = seq.checked_sub(1).is_some_and(|s| seen.contains(s));
    let above = seq.checked_add(1).is_some_and(|s| seen.contains(s));
    !below && !above
}

/// The log record being accumulated by a commit group: consecutive writes, cut so that each
/// record stays within the message target (ARCHITECTURE "size invariants").
struct RecordBuilder {
    /// Own seqs issued by this record: `(first, last]`.
    first: u64,
    last: u64,
    /// Keys the record's ops changed.
    keys: Vec<Key>,
    /// Every dot of the record's per-op delta contexts.
    dots: Vec<Dot>,
    marks: DedupMarks,
    /// Estimated encoded bytes so far.
    bytes: usize,
}

impl RecordBuilder {
    fn new(ctx: &CausalContext, me: tidemark_crdts::ReplicaId) -> Self {
        let at = ctx.max_seq(me);
        Self {
            first: at,
            last: at,
            keys: Vec::new(),
            dots: Vec::new(),
            marks: DedupMarks::new(),
            bytes: 0,
        }
    }

    /// The record's delta — the join of its ops' deltas: each changed key's current entry
    /// restricted to the record's fresh dots (every other dot of the entry was in the context
    /// before the record), the union of the ops' contexts, and the record's marks — split into
    /// pieces within `target` ([`split_delta`]), in log order.
    fn finish(
        self,
        rows: &mut GroupRows<'_, '_>,
        me: tidemark_crdts::ReplicaId,
        target: usize,
    ) -> Result<Vec<Delta>, StoreError> {
        let RecordBuilder {
            first,
            last,
            mut keys,
            mut dots,
            marks,
            ..
        } = self;
        keys.sort();
        keys.dedup();
        let fresh = CausalContext::from_range(me, first + 1, last);
        let mut store: DotMap<Key, Entry> = DotMap::default();
        for key in keys {
            if let Some(e) = rows.record_part(&key)? {
                let older = e.dots().diff(&fresh);
                let part = e.unseen_by(&older);
                if !part.is_bottom() {
                    store.set(key, part);
                }
            }
        }
        dots.sort_unstable();
        dots.dedup();
        let ctx: CausalContext = dots.into_iter().collect();
        // Fresh dots no entry holds (a removal's or delete's own dot) travel with every piece.
        let keep = fresh.diff(&store.dots());
        let delta = Delta {
            state: Causal { store, ctx },
            marks,
        };
        if delta.is_empty() {
            return Ok(Vec::new());
        }
        split_delta(delta, target, &keep).map_err(|source| StoreError::Codec {
            table: "log",
            source,
        })
    }
}

/// Encodes log records and appends them from `log_end` on; returns the new end. A record
/// over `record_bytes_max` is refused before anything is written (it could never be read
/// back), which by the size invariants cannot happen for a delta within the message target.
pub(crate) fn append_log(
    txn: &redb::WriteTransaction,
    origin: Option<crate::proto::PeerId>,
    deltas: Vec<Delta>,
    mut log_end: u64,
    record_bytes_max: usize,
) -> Result<u64, StoreError> {
    let mut log_t = txn.open_table(LOG).map_err(StoreError::redb)?;
    let last = deltas.len().saturating_sub(1);
    for (i, delta) in deltas.into_iter().enumerate() {
        let record = LogRecord {
            origin,
            delta,
            continues: i < last,
        };
        let bytes = codec::encode("log record", &record).map_err(|source| StoreError::Codec {
            table: "log",
            source,
        })?;
        if bytes.len() > record_bytes_max {
            return Err(StoreError::TooLarge {
                what: "log record",
                len: bytes.len(),
                limit: record_bytes_max,
            });
        }
        log_t
            .insert(log_end, bytes.as_slice())
            .map_err(StoreError::redb)?;
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
        for w in writes {
            for (key, m) in &w.ops {
                tidemark_crdts::store::check_mutation(key.kind, m)
                    .map_err(|e| StoreError::InvalidOp(format!("{key}: {e}")))?;
            }
        }
        self.guarded(|s| s.commit_local_inner(writes, wall_ms))
    }

    fn commit_local_inner(
        &mut self,
        writes: &[LocalWrite],
        wall_ms: u64,
    ) -> Result<LocalCommit, StoreError> {
        let max = self.options.limits.record_bytes_max;
        let target = self.options.limits.message_bytes_target;
        let ranges_max = self.options.limits.dedup_ranges_max;
        let me = self.replica;
        let txn = self.begin()?;
        let mut ctx = self.ctx.clone();
        let mut hlc = self.hlc.clone();
        let mut records: Vec<Delta> = Vec::new();
        let mut duplicate = Vec::with_capacity(writes.len());
        let mut refused = Vec::new();
        let mut changed: Vec<Key> = Vec::new();
        let mut marks: BTreeMap<(String, String), IntervalSet> = BTreeMap::new();
        let mut values = Vec::new();
        {
            let (mut rows_t, mut elems_t, mut dots_t) = open_state_tables(&txn)?;
            let mut dedup_t = txn.open_table(DEDUP).map_err(StoreError::redb)?;
            let mut rows = GroupRows::new(TxnRows {
                rows: &mut rows_t,
                elems: &mut elems_t,
                dots: &mut dots_t,
                record_bytes_max: max,
            });
            let mut rec = RecordBuilder::new(&ctx, me);
            for (index, w) in writes.iter().enumerate() {
                if let Some(ev) = &w.event {
                    let mk = (ev.stream.clone(), ev.source.clone());
                    if !marks.contains_key(&mk) {
                        // The writer's copy of the committed marks; the table is read only
                        // for a source this writer has not seen since open.
                        let seen = match self.dedup_cache.get(&mk) {
                            Some(seen) => seen.clone(),
                            None => match dedup_t
                                .get(dedup_key(&ev.stream, &ev.source).as_slice())
                                .map_err(StoreError::redb)?
                            {
                                Some(g) => codec::decode("dedup marks", g.value(), max).map_err(
                                    |source| StoreError::Codec {
                                        table: "dedup",
                                        source,
                                    },
                                )?,
                                None => IntervalSet::new(),
                            },
                        };
                        marks.insert(mk.clone(), seen);
                    }
                    let seen = marks.entry(mk).or_default();
                    if seen.contains(ev.seq) {
                        duplicate.push(true);
                        continue;
                    }
                    if opens_range(seen, ev.seq) && seen.ranges().len() >= ranges_max {
                        refused.push(DedupRefusal {
                            index,
                            source: ev.source.clone(),
                            ranges: seen.ranges().len(),
                        });
                        duplicate.push(false);
                        continue;
                    }
                }
                let estimate = write_bytes_estimate(w);
                if rec.bytes > 0 && rec.bytes.saturating_add(estimate) > target {
                    records.extend(rec.finish(&mut rows, me, target)?);
                    rec = RecordBuilder::new(&ctx, me);
                }
                rec.bytes = rec.bytes.saturating_add(estimate);
                if let Some(ev) = &w.event {
                    marks
                        .entry((ev.stream.clone(), ev.source.clone()))
                        .or_default()
                        .insert(ev.seq);
                    rec.marks.insert(&ev.stream, &ev.source, ev.seq);
                }
                duplicate.push(false);
                for (key, m) in &w.ops {
                    // A `latest` view write is stamped by its event, not the clock, and
                    // skipped when a later-stamped value is already there (issue 9).
                    let stamp = crate::views::keys::event_stamp(key, m);
                    if let Some(ts) = stamp {
                        if crate::views::keys::superseded(rows.entry(key)?, ts) {
                            continue;
                        }
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
                    let base = rows.base(key, m)?;
                    let (entry, dctx) = delta_mutation(key.kind, base.as_deref(), m, dot, ts)
                        .map_err(|e| StoreError::InvalidOp(format!("{key}: {e}")))?;
                    rec.dots.extend(dctx.iter_dots());
                    rec.last = dot.seq;
                    let mut store = DotMap::default();
                    store.set(key.clone(), entry);
                    let delta = Causal { store, ctx: dctx };
                    let outcome = join_delta(&mut rows, &mut ctx, delta)?;
                    rec.keys.extend(outcome.changed.iter().cloned());
                    changed.extend(outcome.changed);
                }
            }
            records.extend(rec.finish(&mut rows, me, target)?);
            rows.flush()?;
            changed.sort();
            changed.dedup();
            if self.change_values {
                for key in &changed {
                    let entry = rows.whole(key)?;
                    let v = entry
                        .as_deref()
                        .map_or_else(|| Value::empty(key.kind), Entry::value);
                    values.push((key.clone(), v));
                }
            }
            for ((stream, source), seqs) in &marks {
                let bytes =
                    codec::encode("dedup marks", seqs).map_err(|source| StoreError::Codec {
                        table: "dedup",
                        source,
                    })?;
                dedup_t
                    .insert(dedup_key(stream, source).as_slice(), bytes.as_slice())
                    .map_err(StoreError::redb)?;
            }
        }
        let log_seq = (!records.is_empty()).then_some(self.log_end);
        let log_end = append_log(&txn, None, records, self.log_end, max)?;
        if log_seq.is_some() {
            meta_put(&txn, META_CONTEXT, &ctx)?;
            meta_put(&txn, META_HLC, &hlc.mark())?;
            meta_put(&txn, META_LOG_BOUNDS, &(self.log_start, log_end))?;
        }
        txn.commit().map_err(StoreError::redb)?;
        // Only now, after the durable commit, does the in-memory mirror move.
        let skipped = duplicate.iter().filter(|d| **d).count() as u64;
        let mut applied_ops = 0u64;
        let mut next_refused = refused.iter().map(|r| r.index).peekable();
        for (i, (w, d)) in writes.iter().zip(&duplicate).enumerate() {
            if next_refused.peek() == Some(&i) {
                next_refused.next();
            } else if !*d {
                applied_ops += w.ops.len() as u64;
            }
        }
        self.stats.commits += 1;
        self.stats.duplicates += skipped;
        self.stats.ops_applied += applied_ops;
        self.ctx = ctx;
        self.hlc = hlc;
        self.log_end = log_end;
        // The marks just committed become the writer's copy (bounded: it starts over when
        // full, and a miss only costs a table read).
        if self.dedup_cache.len().saturating_add(marks.len()) > DEDUP_CACHE_SOURCES_MAX {
            self.dedup_cache.clear();
        }
        self.dedup_cache.extend(marks);
        Ok(LocalCommit {
            duplicate,
            changes: values,
            changed,
            log_seq,
            refused,
        })
    }
}

/// Sources whose committed dedup marks the writer keeps in memory before it starts over.
pub(crate) const DEDUP_CACHE_SOURCES_MAX: usize = 65_536;

/// Bytes of decoded entries a commit group keeps cached before it starts over (the cache is
/// write-through, so dropping it loses nothing).
const GROUP_CACHE_BYTES_MAX: usize = 32 << 20;

/// Most candidate dots looked up one by one in the group's own index changes before the dot
/// index is scanned instead.
const OWNER_LOOKUPS_MAX: u64 = 4096;

/// The rows of one local commit group: [`TxnRows`] with a write-back cache of the entries
/// the group touched, so each key is read and decoded once per group (an op reads its key
/// before the mutation, the join reads it again, the watchers' values once more) and encoded
/// and written once per group however many of the group's ops change it (a hot counter, or
/// many adds to one set, cost one row write per group instead of one per op), and with the
/// dots the group's writes added and removed, so the join's search for the keys holding the
/// dots an op overwrote (dots of the op's own key, which the join has already rewritten)
/// needs no index scan. Dot-index rows are written at once; a changed row is written when the
/// cache starts over or at [`GroupRows::flush`], which the group calls before it commits, so
/// the transaction always commits the rows the cache holds.
struct GroupRows<'r, 't> {
    inner: TxnRows<'r, 't>,
    /// Entry of each cached key as the group now has it (`None`: no row), its estimated
    /// encoded size, and whether the table's row is behind it (written at the next flush).
    cache: HashMap<Rc<Key>, Cached>,
    /// Dot → key of the dot-index rows this group inserted (and has not deleted since).
    owner: HashMap<Dot, Rc<Key>>,
    /// Dots whose index rows this group deleted (and has not inserted again since).
    removed: HashSet<Dot>,
    /// Approximate bytes held by `cache` (sum of its estimates).
    cached_bytes: usize,
    /// Per set key, the elements changed since the last [`GroupRows::record_part`] of it.
    /// Sets are not cached: their element rows are read and written through (one row each).
    touched: HashMap<Key, BTreeSet<String>>,
}

/// One cached entry of a [`GroupRows`].
struct Cached {
    entry: Option<Entry>,
    bytes: usize,
    dirty: bool,
}

impl<'r, 't> GroupRows<'r, 't> {
    fn new(inner: TxnRows<'r, 't>) -> Self {
        Self {
            inner,
            cache: HashMap::new(),
            owner: HashMap::new(),
            removed: HashSet::new(),
            cached_bytes: 0,
            touched: HashMap::new(),
        }
    }

    /// What a mutation of `key` needs of its current entry: for a set add or remove, only the
    /// element's row (O(1) whatever the set's size); a set delete reads the whole set; other
    /// kinds the cached entry.
    fn base(&mut self, key: &Key, m: &Mutation) -> Result<Option<Cow<'_, Entry>>, StoreError> {
        if per_element(key.kind) {
            let max = self.inner.record_bytes_max;
            let part = match m {
                Mutation::Add(e) | Mutation::Remove(e) => {
                    let map = read_elems(&*self.inner.elems, key, [e.as_str()], max)?;
                    (!map.is_empty()).then_some(Entry::ORSet(map))
                }
                _ => self.inner.get(key)?,
            };
            return Ok(part.map(Cow::Owned));
        }
        Ok(self.entry(key)?.map(Cow::Borrowed))
    }

    /// The whole current entry of `key` (a set is assembled from its rows: O(set)).
    fn whole(&mut self, key: &Key) -> Result<Option<Cow<'_, Entry>>, StoreError> {
        if per_element(key.kind) {
            return Ok(self.inner.get(key)?.map(Cow::Owned));
        }
        Ok(self.entry(key)?.map(Cow::Borrowed))
    }

    /// The part of `key`'s entry holding every dot the group gave it since the last call for
    /// `key` (for a set: the elements changed since then; other kinds: the whole entry).
    fn record_part(&mut self, key: &Key) -> Result<Option<Entry>, StoreError> {
        if per_element(key.kind) {
            let Some(names) = self.touched.remove(key) else {
                return Ok(None);
            };
            let max = self.inner.record_bytes_max;
            let map = read_elems(
                &*self.inner.elems,
                key,
                names.iter().map(String::as_str),
                max,
            )?;
            return Ok((!map.is_empty()).then_some(Entry::ORSet(map)));
        }
        Ok(self.entry(key)?.cloned())
    }

    /// Writes every changed row to its table (encoding each once). Nothing is dropped.
    ///
    /// # Errors
    /// [`StoreError::TooLarge`] for a row over `record_bytes_max` (it could never be read
    /// back); storage failures.
    fn flush(&mut self) -> Result<(), StoreError> {
        for (key, c) in &mut self.cache {
            if !c.dirty {
                continue;
            }
            let kb = key_bytes(key);
            match &c.entry {
                Some(e) => {
                    let bytes =
                        codec::encode("state row", e).map_err(|source| StoreError::Codec {
                            table: "rows",
                            source,
                        })?;
                    if bytes.len() > self.inner.record_bytes_max {
                        return Err(StoreError::TooLarge {
                            what: "state row",
                            len: bytes.len(),
                            limit: self.inner.record_bytes_max,
                        });
                    }
                    self.inner
                        .rows
                        .insert(kb.as_slice(), bytes.as_slice())
                        .map_err(StoreError::redb)?;
                }
                None => {
                    self.inner
                        .rows
                        .remove(kb.as_slice())
                        .map_err(StoreError::redb)?;
                }
            }
            c.dirty = false;
        }
        Ok(())
    }

    /// Caches `entry` as the current entry of `key` (`dirty`: its row is not written yet),
    /// starting over (after writing every changed row) when the cache is full, and records
    /// `key` as the owner of `owned` (dots of `entry`).
    fn remember(
        &mut self,
        key: &Key,
        entry: Option<Entry>,
        bytes: usize,
        owned: &[Dot],
        dirty: bool,
    ) -> Result<(), StoreError> {
        let bytes = bytes + key.name.len() + 64;
        let before = self.cache.get(key).map_or(0, |c| c.bytes);
        if self.cached_bytes.saturating_sub(before) + bytes > GROUP_CACHE_BYTES_MAX {
            // Pending rows reach the table first, so starting over loses nothing.
            self.flush()?;
            self.cache.clear();
            self.owner.clear();
            self.removed.clear();
            self.cached_bytes = 0;
        }
        let key = match self.cache.get_key_value(key) {
            Some((k, _)) => Rc::clone(k),
            None => Rc::new(key.clone()),
        };
        for d in owned {
            self.owner.insert(*d, Rc::clone(&key));
        }
        let old = self.cache.insert(
            key,
            Cached {
                entry,
                bytes,
                dirty,
            },
        );
        self.cached_bytes = self.cached_bytes.saturating_sub(old.map_or(0, |c| c.bytes)) + bytes;
        Ok(())
    }

    /// The current entry of `key`, read from the table (and cached) on first use.
    fn entry(&mut self, key: &Key) -> Result<Option<&Entry>, StoreError> {
        if !self.cache.contains_key(key) {
            let found = match self
                .inner
                .rows
                .get(key_bytes(key).as_slice())
                .map_err(StoreError::redb)?
            {
                Some(g) => {
                    let bytes = g.value();
                    Some((
                        decode_entry(bytes, self.inner.record_bytes_max)?,
                        bytes.len(),
                    ))
                }
                None => None,
            };
            match found {
                Some((e, len)) => self.remember(key, Some(e), len, &[], false)?,
                None => self.remember(key, None, 0, &[], false)?,
            }
        }
        Ok(self.cache.get(key).and_then(|c| c.entry.as_ref()))
    }
}

/// The dots of `e` (none for `None`), ascending.
fn sorted_dots(e: Option<&Entry>) -> Vec<Dot> {
    let mut out = Vec::new();
    if let Some(e) = e {
        e.for_each_dot(&mut |d| out.push(d));
    }
    out.sort_unstable();
    out
}

impl Rows for GroupRows<'_, '_> {
    type Error = StoreError;

    fn get(&mut self, key: &Key) -> Result<Option<Entry>, StoreError> {
        if per_element(key.kind) {
            return self.inner.get(key);
        }
        Ok(self.entry(key)?.cloned())
    }

    fn get_part(
        &mut self,
        key: &Key,
        theirs: Option<&Entry>,
        seen: &CausalContext,
    ) -> Result<Option<Entry>, StoreError> {
        if per_element(key.kind) {
            return self.inner.get_part(key, theirs, seen);
        }
        self.get(key)
    }

    /// As [`TxnRows::put`], but the dot index is updated by the difference between `old` and
    /// `new` only (a set's unchanged elements keep their index rows).
    fn put(
        &mut self,
        key: &Key,
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) -> Result<(), StoreError> {
        if per_element(key.kind) {
            // Element rows are written through; the group remembers which elements changed
            // (for its log record) and which dots moved (for `keys_holding`).
            let change = put_set(&mut self.inner, key, old, new)?;
            if let Some(Entry::ORSet(n)) = new {
                let o = match old {
                    Some(Entry::ORSet(o)) => Some(o),
                    _ => None,
                };
                let changed: Vec<String> = n
                    .iter()
                    .filter(|(e, ds)| o.and_then(|o| o.get(e)) != Some(*ds))
                    .map(|(e, _)| e.clone())
                    .collect();
                if !changed.is_empty() {
                    self.touched.entry(key.clone()).or_default().extend(changed);
                }
            }
            let rc = match self.cache.get_key_value(key) {
                Some((k, _)) => Rc::clone(k),
                None => Rc::new(key.clone()),
            };
            for d in &change.removed {
                self.owner.remove(d);
                self.removed.insert(*d);
            }
            for d in &change.added {
                self.owner.insert(*d, Rc::clone(&rc));
                self.removed.remove(d);
            }
            return Ok(());
        }
        let kb = key_bytes(key);
        let before = sorted_dots(old);
        let after = sorted_dots(new);
        let (mut i, mut j) = (0, 0);
        let mut removed = Vec::new();
        let mut added = Vec::new();
        while i < before.len() || j < after.len() {
            match (before.get(i), after.get(j)) {
                (Some(b), Some(a)) if b == a => {
                    i += 1;
                    j += 1;
                }
                (Some(b), Some(a)) if b < a => {
                    removed.push(*b);
                    i += 1;
                }
                (Some(b), None) => {
                    removed.push(*b);
                    i += 1;
                }
                (_, Some(a)) => {
                    added.push(*a);
                    j += 1;
                }
                (None, None) => break,
            }
        }
        // Counter dots have no index rows ([`indexed`]); the group still tracks them, so the
        // join's search for the keys holding an overwritten counter dot needs no index scan.
        let index = indexed(key.kind);
        for d in &removed {
            if index {
                self.inner
                    .dots
                    .remove(dot_bytes(*d).as_slice())
                    .map_err(StoreError::redb)?;
            }
            self.owner.remove(d);
            self.removed.insert(*d);
        }
        for d in &added {
            if index {
                self.inner
                    .dots
                    .insert(dot_bytes(*d).as_slice(), kb.as_slice())
                    .map_err(StoreError::redb)?;
            }
            self.removed.remove(d);
        }
        // The row itself is written once per group ([`GroupRows::flush`]); its size is
        // estimated from the cached one plus the dots added.
        let previous = self.cache.get(key).map_or(0, |c| c.bytes);
        let len = match new {
            Some(_) => previous + 40 * added.len(),
            None => 0,
        };
        let bookkeeping = 32 * (removed.len() + added.len());
        self.remember(key, new.cloned(), len + bookkeeping, &added, true)?;
        Ok(())
    }

    fn keys_holding(&mut self, dots: &CausalContext) -> Result<Vec<Key>, StoreError> {
        // `owner` and `removed` mirror the dot-index rows this group inserted and deleted, so
        // for a dot found in either they give exactly what the index holds now; only when
        // some dot is in neither is the index scanned.
        if dots.len() <= OWNER_LOOKUPS_MAX {
            let mut keys = Vec::new();
            let mut all_known = true;
            for d in dots.iter_dots() {
                match self.owner.get(&d) {
                    Some(k) => keys.push(Key::clone(k)),
                    None if self.removed.contains(&d) => {}
                    None => {
                        all_known = false;
                        break;
                    }
                }
            }
            if all_known {
                keys.sort();
                keys.dedup();
                return Ok(keys);
            }
        }
        self.inner.keys_holding(dots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OpenOptions;
    use tidemark_crdts::{ReplicaId, Store};

    /// SplitMix64 (seeded, replayable with `SEED=`).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
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
                Mutation::Set(rng.below(100).to_string()),
            ),
            _ => (
                Key::new(KeyKind::MvReg, format!("m{hot}")),
                Mutation::Set(rng.below(100).to_string()),
            ),
        }
    }

    /// Groups of mixed ops on a few hot keys (many ops of one group hit the same key, so the
    /// write-back rows and the untracked counter dots are exercised): after every group each
    /// touched key reads exactly what a sequential in-memory model holds, the watchers' values
    /// match, `verify()` holds (context, dot index without counter dots), dedup marks turn
    /// retries into duplicates, and all of it survives a reopen.
    #[test]
    fn commit_groups_match_a_sequential_model_and_survive_reopen() {
        let seed = std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x7EA5_u64);
        let dir = tempfile::tempdir().expect("tempdir");
        let me = ReplicaId(7);
        let options = OpenOptions {
            new_replica_id: Some(me),
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
                // A retry of the whole group is all duplicates and changes nothing.
                let again = store.commit_local(&writes, 2_000 + group).expect("retry");
                assert!(again.duplicate.iter().all(|d| *d), "seed {seed}");
                assert!(again.changed.is_empty(), "seed {seed}");
            }
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
