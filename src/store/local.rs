//! Local commit groups: many callers' writes in one durable transaction (DESIGN.md A5, A8, D2).

use super::error::StoreError;
use super::rows::{TxnRows, decode_entry};
use super::tables::{
    DEDUP, DOTS, LOG, LogRecord, META_CONTEXT, META_HLC, META_LOG_BOUNDS, ROWS, dedup_key,
    dot_bytes, key_bytes,
};
use super::{RedbStore, meta_put};
use crate::codec;
use crate::model::Delta;
use redb::ReadableTable;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use tidemark_crdts::store::{delta_mutation, join_delta};
use tidemark_crdts::{
    Causal, CausalContext, Dot, DotMap, DotStore, Entry, IntervalSet, Key, KeyKind, Mutation, Rows,
    Value,
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

/// What a committed group did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalCommit {
    /// Per write, in order: true when it was skipped as a duplicate.
    pub duplicate: Vec<bool>,
    /// Changed keys with their new values (for watchers), ascending by key.
    pub changes: Vec<(Key, Value)>,
    /// The log sequence number of the group's delta (`None` when nothing was applied).
    pub log_seq: Option<u64>,
}

impl RedbStore {
    /// Applies a commit group in one durable transaction and returns what it did. Returns only
    /// after the commit is durable (in `Immediate` mode); nothing is visible to readers before.
    ///
    /// Each non-duplicate operation takes a fresh dot (a contiguous range for the group); the
    /// group's delta becomes one log entry; dedup marks, context and HLC mark commit with it.
    ///
    /// # Errors
    /// [`StoreError::InvalidOp`] if an operation does not apply (nothing written, store usable);
    /// storage failures halt the store.
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
        let me = self.replica;
        let txn = self.begin()?;
        let mut ctx = self.ctx.clone();
        let mut hlc = self.hlc.clone();
        let mut group = Delta::default();
        let mut duplicate = Vec::with_capacity(writes.len());
        let mut changed: Vec<Key> = Vec::new();
        let mut marks: BTreeMap<(String, String), IntervalSet> = BTreeMap::new();
        let mut values = Vec::new();
        {
            let mut rows_t = txn.open_table(ROWS).map_err(StoreError::redb)?;
            let mut dots_t = txn.open_table(DOTS).map_err(StoreError::redb)?;
            let mut dedup_t = txn.open_table(DEDUP).map_err(StoreError::redb)?;
            let mut rows = GroupRows::new(TxnRows {
                rows: &mut rows_t,
                dots: &mut dots_t,
                record_bytes_max: max,
            });
            // Every dot of the group's per-op delta contexts; the group's context is built from
            // them once, after the loop (joining op by op is quadratic in the group size).
            let mut group_dots: Vec<Dot> = Vec::new();
            for w in writes {
                if let Some(ev) = &w.event {
                    let mk = (ev.stream.clone(), ev.source.clone());
                    if !marks.contains_key(&mk) {
                        let seen =
                            match dedup_t
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
                            };
                        marks.insert(mk.clone(), seen);
                    }
                    let seen = marks.entry(mk).or_default();
                    if seen.contains(ev.seq) {
                        duplicate.push(true);
                        continue;
                    }
                    seen.insert(ev.seq);
                    group.marks.insert(&ev.stream, &ev.source, ev.seq);
                }
                duplicate.push(false);
                for (key, m) in &w.ops {
                    let dot = ctx
                        .next_dot(me)
                        .map_err(|e| StoreError::Exhausted(e.to_string()))?;
                    let ts = (key.kind == KeyKind::Lww && matches!(m, Mutation::Set(_)))
                        .then(|| hlc.now(wall_ms))
                        .transpose()
                        .map_err(|e| StoreError::Exhausted(e.to_string()))?;
                    let (entry, dctx) = delta_mutation(key.kind, rows.entry(key)?, m, dot, ts)
                        .map_err(|e| StoreError::InvalidOp(format!("{key}: {e}")))?;
                    group_dots.extend(dctx.iter_dots());
                    let mut store = DotMap::default();
                    store.set(key.clone(), entry);
                    let delta = Causal { store, ctx: dctx };
                    let outcome = join_delta(&mut rows, &mut ctx, delta)?;
                    changed.extend(outcome.changed);
                }
            }
            changed.sort();
            changed.dedup();
            // The group's delta is the join of its per-op deltas. Each op's delta store holds
            // only the op's fresh dot, and fresh dots are exactly the dots the group's state has
            // that the context before the group lacks (every stored dot is in the context), so
            // the joined store is each changed key's final entry restricted to the dots unseen
            // by the context before the group; its context is the union of the ops' contexts.
            group_dots.sort_unstable();
            group_dots.dedup();
            let group_ctx: CausalContext = group_dots.into_iter().collect();
            let mut group_store: DotMap<Key, Entry> = DotMap::default();
            for key in &changed {
                let entry = rows.entry(key)?;
                if let Some(e) = entry {
                    group_store.set(key.clone(), e.unseen_by(&self.ctx));
                }
                let v = entry.map_or_else(|| Value::empty(key.kind), Entry::value);
                values.push((key.clone(), v));
            }
            group.state = Causal {
                store: group_store,
                ctx: group_ctx,
            };
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
        let mut log_end = self.log_end;
        let log_seq = if group.is_empty() {
            None
        } else {
            let record = LogRecord {
                origin: None,
                delta: group,
            };
            let bytes =
                codec::encode("log record", &record).map_err(|source| StoreError::Codec {
                    table: "log",
                    source,
                })?;
            let mut log_t = txn.open_table(LOG).map_err(StoreError::redb)?;
            log_t
                .insert(log_end, bytes.as_slice())
                .map_err(StoreError::redb)?;
            log_end += 1;
            Some(log_end - 1)
        };
        if log_seq.is_some() {
            meta_put(&txn, META_CONTEXT, &ctx)?;
            meta_put(&txn, META_HLC, &hlc.mark())?;
            meta_put(&txn, META_LOG_BOUNDS, &(self.log_start, log_end))?;
        }
        txn.commit().map_err(StoreError::redb)?;
        // Only now, after the durable commit, does the in-memory mirror move.
        let applied = duplicate.iter().filter(|d| !**d).count() as u64;
        self.stats.commits += 1;
        self.stats.duplicates += duplicate.len() as u64 - applied;
        self.stats.ops_applied += writes
            .iter()
            .zip(&duplicate)
            .filter(|(_, d)| !**d)
            .map(|(w, _)| w.ops.len() as u64)
            .sum::<u64>();
        self.ctx = ctx;
        self.hlc = hlc;
        self.log_end = log_end;
        Ok(LocalCommit {
            duplicate,
            changes: values,
            log_seq,
        })
    }
}

/// Bytes of decoded entries a commit group keeps cached before it starts over (the cache is
/// write-through, so dropping it loses nothing).
const GROUP_CACHE_BYTES_MAX: usize = 32 << 20;

/// Most candidate dots looked up one by one in the group's own index changes before the dot
/// index is scanned instead.
const OWNER_LOOKUPS_MAX: u64 = 4096;

/// The rows of one local commit group: [`TxnRows`] with a write-through cache of the entries
/// the group touched, so each key is read and decoded once per group (an op reads its key
/// before the mutation, the join reads it again, the watchers' values once more), and with the
/// dots the group's writes added and removed, so the join's search for the keys holding the
/// dots an op overwrote (dots of the op's own key, which the join has already rewritten)
/// needs no index scan. Every write still goes to the tables at once, so the tables and the
/// cache always agree.
struct GroupRows<'r, 't> {
    inner: TxnRows<'r, 't>,
    /// Entry of each cached key as the transaction now has it (`None`: no row).
    cache: HashMap<Rc<Key>, Option<Entry>>,
    /// Dot → key of the dot-index rows this group inserted (and has not deleted since).
    owner: HashMap<Dot, Rc<Key>>,
    /// Dots whose index rows this group deleted (and has not inserted again since).
    removed: HashSet<Dot>,
    /// Approximate bytes held by `cache` (encoded sizes; grows only).
    cached_bytes: usize,
}

impl<'r, 't> GroupRows<'r, 't> {
    fn new(inner: TxnRows<'r, 't>) -> Self {
        Self {
            inner,
            cache: HashMap::new(),
            owner: HashMap::new(),
            removed: HashSet::new(),
            cached_bytes: 0,
        }
    }

    /// Caches `entry` as the current entry of `key`, starting over when the cache is full, and
    /// records `key` as the owner of `owned` (dots of `entry`).
    fn remember(&mut self, key: &Key, entry: Option<Entry>, bytes: usize, owned: &[Dot]) {
        let bytes = bytes + key.name.len() + 64;
        if self.cached_bytes + bytes > GROUP_CACHE_BYTES_MAX {
            self.cache.clear();
            self.owner.clear();
            self.removed.clear();
            self.cached_bytes = 0;
        }
        self.cached_bytes += bytes;
        let key = match self.cache.get_key_value(key) {
            Some((k, _)) => Rc::clone(k),
            None => Rc::new(key.clone()),
        };
        for d in owned {
            self.owner.insert(*d, Rc::clone(&key));
        }
        self.cache.insert(key, entry);
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
                Some((e, len)) => self.remember(key, Some(e), len, &[]),
                None => self.remember(key, None, 0, &[]),
            }
        }
        Ok(self.cache.get(key).and_then(Option::as_ref))
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
        Ok(self.entry(key)?.cloned())
    }

    /// As [`TxnRows::put`], but the dot index is updated by the difference between `old` and
    /// `new` only (a set's unchanged elements keep their index rows).
    fn put(
        &mut self,
        key: &Key,
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) -> Result<(), StoreError> {
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
        for d in &removed {
            self.inner
                .dots
                .remove(dot_bytes(*d).as_slice())
                .map_err(StoreError::redb)?;
            self.owner.remove(d);
            self.removed.insert(*d);
        }
        for d in &added {
            self.inner
                .dots
                .insert(dot_bytes(*d).as_slice(), kb.as_slice())
                .map_err(StoreError::redb)?;
            self.removed.remove(d);
        }
        let len = match new {
            Some(e) => {
                let bytes = codec::encode("state row", e).map_err(|source| StoreError::Codec {
                    table: "rows",
                    source,
                })?;
                self.inner
                    .rows
                    .insert(kb.as_slice(), bytes.as_slice())
                    .map_err(StoreError::redb)?;
                bytes.len()
            }
            None => {
                self.inner
                    .rows
                    .remove(kb.as_slice())
                    .map_err(StoreError::redb)?;
                0
            }
        };
        let bookkeeping = 32 * (removed.len() + added.len());
        self.remember(key, new.cloned(), len + bookkeeping, &added);
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
