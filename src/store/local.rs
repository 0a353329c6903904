//! Local commit groups: many callers' writes in one durable transaction (DESIGN.md A5, A8, D2).

use super::error::StoreError;
use super::rows::TxnRows;
use super::tables::{
    DEDUP, DOTS, LOG, LogRecord, META_CONTEXT, META_HLC, META_LOG_BOUNDS, ROWS, dedup_key,
};
use super::{RedbStore, meta_put};
use crate::codec;
use crate::model::Delta;
use redb::ReadableTable;
use std::collections::BTreeMap;
use tidemark_crdts::store::{delta_mutation, join_delta};
use tidemark_crdts::{Causal, DotMap, DotStore, IntervalSet, Key, KeyKind, Mutation, Rows, Value};

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
            let mut rows = TxnRows {
                rows: &mut rows_t,
                dots: &mut dots_t,
                record_bytes_max: max,
            };
            let mut group_store: DotMap<Key, tidemark_crdts::Entry> = DotMap::default();
            let mut group_ctx = tidemark_crdts::CausalContext::new();
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
                    let dot = ctx.next_dot(me);
                    let ts = (key.kind == KeyKind::Lww && matches!(m, Mutation::Set(_)))
                        .then(|| hlc.now(wall_ms));
                    let current = rows.get(key)?;
                    let (entry, dctx) = delta_mutation(key.kind, current.as_ref(), m, dot, ts)
                        .map_err(|e| StoreError::InvalidOp(format!("{key}: {e}")))?;
                    let mut store = DotMap::default();
                    store.set(key.clone(), entry);
                    let delta = Causal { store, ctx: dctx };
                    let outcome = join_delta(&mut rows, &mut ctx, delta.clone())?;
                    changed.extend(outcome.changed);
                    // Coalesce into the group's delta (cheap: the group is small and keyed).
                    group_store.join(&group_ctx, delta.store, &delta.ctx);
                    group_ctx.join(&delta.ctx);
                }
            }
            group.state = Causal {
                store: group_store,
                ctx: group_ctx,
            };
            changed.sort();
            changed.dedup();
            for key in &changed {
                let v = rows
                    .get(key)?
                    .map_or_else(|| Value::empty(key.kind), |e| e.value());
                values.push((key.clone(), v));
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
