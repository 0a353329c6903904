//! The receiving side of a state transfer (docs/design/replication.md, "State transfer"):
//! every chunk but the last is staged in the `transfer_stage` table, encoded and unapplied
//! (no reader, no log record, no context sees it), and the last chunk streams them back in
//! order into ONE write transaction that joins the whole transfer and commits durably — so the
//! receiver holds about one chunk in memory, not the whole state (a large set sent in parts is
//! joined part by part: `set_parts`; a large row of another kind is put back together, as it
//! is one row on disk anyway), and the transfer is still applied all at once or not at all.
//!
//! The streamed join gives exactly the state of one [`admission::join_chunk`] of the merged
//! transfer (`proto::transfer::merge_chunks`): the key space is joined range by range
//! ([`admission::RangeJoin`]), each range ending at the last key of a chunk (or of a large
//! row, once its last part was joined) and the final one open, every range under the transfer's
//! context, with the same validation the merged chunk would get (per batch; a first pass over
//! the staged chunks checks the contexts, the parts and that no dot is carried twice in the
//! whole transfer, and collects the dots carried). The inflation is logged batch by batch as
//! one run of records (`LogRecord::continues`), each entry with the dots it retired (the
//! join's removals on its key; a removal of no known key with the entry holding its replica's
//! next dot: `split::split_delta`), then the context's rest, then the dedup marks page by
//! page. Staging is dropped at open, when a new transfer starts, on reject, and by
//! `reidentify`.

use super::error::StoreError;
use super::local::append_log_run;
use super::rows::{per_element, with_txn_rows};
use super::split::{Retired, Unknown, split_delta};
use super::tables::TRANSFER_STAGE;
use super::RedbStore;
use crate::admission::{self, Joined, RangeJoin};
use crate::codec;
use crate::model::{Delta, Rejected, StateChunk};
use crate::proto::transfer::{ChunkShape, PartsCheck};
use crate::proto::{ApplyOutcome, PeerId, TransferId};
use redb::{ReadableTable, WriteTransaction};
use tidemark_crdts::{
    CausalContext, DedupMarks, DotStore, Entry, Key, ReplicaId, Rows, Timestamp,
};
use set_parts::SetPart;

mod set_parts;

/// The transfer whose chunks are staged.
#[derive(Debug)]
pub(crate) struct Staged {
    origin: PeerId,
    id: TransferId,
    /// Chunks staged (their indexes are `0..next`).
    next: u32,
    /// The first chunk's context: every chunk of the transfer carries it.
    ctx: CausalContext,
    /// The checks of large rows' parts, chunk by chunk.
    parts: PartsCheck,
}

fn stage_err(source: codec::CodecError) -> StoreError {
    StoreError::Codec {
        table: "transfer_stage",
        source,
    }
}

/// The remote join's log records of one transaction: written as one run (every record but
/// the run's last is marked `continues`), the latest batch kept back until the next one comes
/// (or the end), so the run's last record is known when it is written.
#[derive(Debug)]
pub(super) struct LogRun {
    /// The log end after the records written so far.
    pub log_end: u64,
    /// The latest batch's pieces, not yet written.
    pub pending: Vec<Delta>,
    /// Some batch inflated the state (the context and log bounds must be written).
    pub inflated: bool,
}

impl LogRun {
    pub fn new(log_end: u64) -> Self {
        Self {
            log_end,
            pending: Vec::new(),
            inflated: false,
        }
    }

    /// Logs the pieces kept back (the run goes on) and keeps `pieces` back instead.
    fn push(
        &mut self,
        txn: &WriteTransaction,
        origin: PeerId,
        pieces: Vec<Delta>,
        record_bytes_max: usize,
    ) -> Result<(), StoreError> {
        let prev = std::mem::replace(&mut self.pending, pieces);
        if !prev.is_empty() {
            self.log_end = append_log_run(
                txn,
                Some(origin),
                prev,
                self.log_end,
                record_bytes_max,
                &mut super::wal::Redo::default(),
                true,
            )?;
        }
        self.inflated = true;
        Ok(())
    }
}

/// Where the streamed join of a transfer stands.
struct Stream {
    join: Option<RangeJoin>,
    /// The rows are joined (the context too): only dedup marks may follow.
    outcome: Option<Joined>,
    /// The local context before the transfer (every range joins against it).
    local: CausalContext,
    /// The new local context (set when the rows are closed).
    ctx: CausalContext,
    /// The transfer's context.
    tctx: CausalContext,
    /// The upper bound of the ranges joined so far.
    lo: Option<Key>,
    /// Dots of the transfer's context that the local context lacks and no entry of the
    /// transfer carries: the removals the transfer brings whose key this node never knew
    /// (placed by [`super::split::Unknown`]'s rule).
    removals: CausalContext,
    /// The removals of `removals` placed on the key of the large set whose parts are being
    /// joined (`split::successors`): kept out of its parts' records and logged with the set's
    /// retirement in its last part, so no record retires a dot of the set whose new entry comes
    /// in a later part (docs/design/write-path.md, "Log records").
    set_unknown: CausalContext,
    /// The dots of the transfer's deletable-kind entries (interval-compressed).
    carried_indexed: CausalContext,
    /// The local counter dots the transfer's counters superseded: logged with the counters,
    /// which are logged after every other entry (see `RedbStore::log_counters`).
    counter_retired: CausalContext,
    max_ts: Option<Timestamp>,
    run: LogRun,
}

impl RedbStore {
    /// Drops the staged chunks (and the staging table: it exists only while a transfer is
    /// being received, so a snapshot or an older build never sees it).
    pub(super) fn drop_staging(&mut self) -> Result<(), StoreError> {
        if self.staged.take().is_none() {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(StoreError::redb)?;
        // Staging is never needed after a crash (open drops it): no sync.
        txn.set_durability(redb::Durability::None)
            .map_err(StoreError::redb)?;
        txn.delete_table(TRANSFER_STAGE)
            .map_err(StoreError::redb)?;
        txn.commit().map_err(StoreError::redb)?;
        self.stats.transfer_staged_bytes = 0;
        Ok(())
    }

    /// [`crate::proto::StateStore::stage_chunk`].
    pub(super) fn stage(
        &mut self,
        origin: PeerId,
        id: TransferId,
        index: u32,
        chunk: &StateChunk,
    ) -> Result<Result<(), Rejected>, StoreError> {
        if index == 0 {
            self.drop_staging()?;
            self.staged = Some(Staged {
                origin,
                id,
                next: 0,
                ctx: chunk.ctx.clone(),
                parts: PartsCheck::default(),
            });
        }
        let checked = match self.staged.as_mut() {
            Some(s) if s.origin == origin && s.id == id && s.next == index => {
                if s.ctx == chunk.ctx {
                    s.parts.next(chunk).map(drop)
                } else {
                    Err(Rejected::BadChunk(
                        "chunks of one transfer carry different contexts",
                    ))
                }
            }
            _ => Err(Rejected::BadChunk(
                "a chunk that does not follow the chunks staged",
            )),
        };
        if let Err(reason) = checked {
            self.drop_staging()?;
            return Ok(Err(reason));
        }
        let bytes = codec::encode("transfer chunk", chunk).map_err(stage_err)?;
        let staged_after = self
            .stats
            .transfer_staged_bytes
            .saturating_add(bytes.len() as u64);
        if let Some(free) = self.free_bytes() {
            if let Err(reason) = stage_room(free, staged_after) {
                tracing::warn!(%reason, "state transfer refused");
                self.drop_staging()?;
                return Ok(Err(reason));
            }
        }
        let mut txn = self.db.begin_write().map_err(StoreError::redb)?;
        txn.set_durability(redb::Durability::None)
            .map_err(StoreError::redb)?;
        {
            let mut t = txn.open_table(TRANSFER_STAGE).map_err(StoreError::redb)?;
            t.insert(u64::from(index), bytes.as_slice())
                .map_err(StoreError::redb)?;
        }
        txn.commit().map_err(StoreError::redb)?;
        if let Some(s) = self.staged.as_mut() {
            s.next = index.saturating_add(1);
        }
        self.stats.transfer_chunks_staged += 1;
        self.stats.transfer_staged_bytes += bytes.len() as u64;
        Ok(Ok(()))
    }

    /// [`crate::proto::StateStore::apply_staged`].
    pub(super) fn apply_staged_chunks(
        &mut self,
        origin: PeerId,
        id: TransferId,
        index: u32,
        last: StateChunk,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, StoreError> {
        let staged = match index {
            0 => 0,
            _ => match &self.staged {
                Some(s) if s.origin == origin && s.id == id && s.next == index => index,
                _ => {
                    self.drop_staging()?;
                    self.stats.rejected += 1;
                    return Ok(Err(Rejected::BadChunk(
                        "the chunks staged do not run up to the last chunk",
                    )));
                }
            },
        };
        if staged == 0 {
            self.drop_staging()?;
        }
        let txn = self.begin()?;
        let mut stream = Stream {
            join: Some(RangeJoin::default()),
            outcome: None,
            local: self.ctx.clone(),
            ctx: self.ctx.clone(),
            tctx: last.ctx.clone(),
            lo: None,
            removals: CausalContext::new(),
            set_unknown: CausalContext::new(),
            carried_indexed: CausalContext::new(),
            counter_retired: CausalContext::new(),
            max_ts: None,
            run: LogRun::new(self.log_end),
        };
        match self.stream_staged(&txn, origin, staged, last, &mut stream) {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => {
                txn.abort().map_err(StoreError::redb)?;
                self.drop_staging()?;
                self.stats.rejected += 1;
                return Ok(Err(reason));
            }
            Err(e) => return Err(e),
        }
        let Stream {
            outcome,
            ctx,
            max_ts,
            run,
            ..
        } = stream;
        let changed = outcome.map(|o| o.changed).unwrap_or_default();
        // The staging goes with the commit that applies it.
        txn.delete_table(TRANSFER_STAGE)
            .map_err(StoreError::redb)?;
        let mut hlc = self.hlc.clone();
        let hlc_rejected = match max_ts {
            Some(ts) => u64::from(hlc.observe(&ts, now_ms).is_err()),
            None => 0,
        };
        let outcome = Joined {
            inflation: None,
            changed,
            retired: Vec::new(),
        };
        let applied = self.finish_remote(
            txn,
            origin,
            outcome,
            &DedupMarks::new(),
            ctx,
            cursor,
            (hlc, hlc_rejected),
            run,
        )?;
        self.staged = None;
        self.stats.transfer_staged_bytes = 0;
        Ok(Ok(applied))
    }

    /// Joins the staged chunks `0..staged` and then `last` into `txn`, in order.
    fn stream_staged(
        &mut self,
        txn: &WriteTransaction,
        origin: PeerId,
        staged: u32,
        last: StateChunk,
        st: &mut Stream,
    ) -> Result<Result<(), Rejected>, StoreError> {
        let (carried, indexed) = match self.scan_staged(txn, staged, &last, &st.tctx)? {
            Ok(carried) => carried,
            Err(reason) => return Ok(Err(reason)),
        };
        st.removals = st.tctx.diff(&st.local).diff(&carried);
        st.carried_indexed = indexed;
        drop(carried);
        let frame_max = self.options.limits.frame_bytes_max;
        let mut check = PartsCheck::default();
        // The entries of the large row whose parts are being put back together.
        let mut row: Vec<(Key, Entry)> = Vec::new();
        let mut row_bytes = 0usize;
        let mut last = Some(last);
        for i in 0..=staged {
            let (chunk, bytes) = if i < staged {
                let t = txn.open_table(TRANSFER_STAGE).map_err(StoreError::redb)?;
                let g = t
                    .get(u64::from(i))
                    .map_err(StoreError::redb)?
                    .ok_or_else(|| StoreError::Corrupt("a staged transfer chunk is missing".into()))?;
                let chunk: StateChunk =
                    codec::decode("transfer chunk", g.value(), frame_max).map_err(stage_err)?;
                (chunk, g.value().len())
            } else {
                let Some(chunk) = last.take() else {
                    break;
                };
                let bytes = codec::encoded_len("transfer chunk", &chunk).map_err(stage_err)?;
                (chunk, bytes)
            };
            if chunk.ctx != st.tctx {
                return Ok(Err(Rejected::BadChunk(
                    "chunks of one transfer carry different contexts",
                )));
            }
            let shape = match check.next(&chunk) {
                Ok(shape) => shape,
                Err(reason) => return Ok(Err(reason)),
            };
            let StateChunk {
                entries,
                marks,
                upto,
                dots,
                ..
            } = chunk;
            let batch = match (shape, upto, dots) {
                (ChunkShape::Whole, ..) => {
                    self.note_held(bytes);
                    entries
                }
                // A large set: joined part by part, never put back together.
                (ChunkShape::Part { closes, .. }, Some(key), Some(slice))
                    if per_element(key.kind) =>
                {
                    self.note_held(bytes);
                    let part = SetPart {
                        key,
                        entries,
                        slice,
                        closes,
                    };
                    if let Err(reason) = self.join_set_part(txn, origin, part, st)? {
                        return Ok(Err(reason));
                    }
                    Vec::new()
                }
                (ChunkShape::Part { continuing, closes }, ..) => {
                    row_bytes = row_bytes.saturating_add(bytes);
                    self.note_held(row_bytes);
                    // As `merge_chunks`: disjoint dots, joined under each side's own dots.
                    for (k, entry) in entries {
                        match row.last_mut() {
                            Some((prev, e)) if continuing && *prev == k => {
                                let mine = e.dots();
                                let theirs = entry.dots();
                                e.join(&mine, entry, &theirs);
                            }
                            _ => row.push((k, entry)),
                        }
                    }
                    if closes {
                        row_bytes = 0;
                        std::mem::take(&mut row)
                    } else {
                        Vec::new()
                    }
                }
            };
            if !batch.is_empty() {
                if let Err(reason) = self.join_batch(txn, origin, batch, st)? {
                    return Ok(Err(reason));
                }
            }
            if !marks.is_empty() {
                if let Err(reason) = self.close_rows(txn, origin, st)? {
                    return Ok(Err(reason));
                }
                if let Err(reason) = admission::validate_marks(&marks, &self.options.limits) {
                    return Ok(Err(reason));
                }
                let fresh = self.write_marks(txn, &marks)?;
                if !fresh.is_empty() {
                    let delta = Delta {
                        state: tidemark_crdts::Causal::default(),
                        marks: fresh,
                    };
                    let target = self.options.limits.message_bytes_target;
                    let pieces =
                        split_delta(delta, target, &CausalContext::new(), &Retired::default())
                            .map_err(stage_err)?;
                    let max = self.options.limits.record_bytes_max;
                    st.run.push(txn, origin, pieces, max)?;
                }
            }
        }
        if let Err(reason) = check.finish() {
            return Ok(Err(reason));
        }
        self.close_rows(txn, origin, st)
    }

    /// Records the bytes of transfer chunks held in memory at once by a streamed join.
    fn note_held(&mut self, bytes: usize) {
        self.stats.transfer_held_bytes_peak = self.stats.transfer_held_bytes_peak.max(bytes as u64);
    }

    /// Checks `entries` (keys after `after`) under the transfer's context exactly as the merged
    /// transfer's chunk would be checked (`admission::validate_chunk`), and gives them back.
    fn check_as_merged(
        &self,
        st: &Stream,
        after: Option<Key>,
        entries: Vec<(Key, Entry)>,
        last: bool,
    ) -> Result<Vec<(Key, Entry)>, Rejected> {
        let probe = StateChunk {
            after,
            upto: None,
            entries,
            ctx: st.tctx.clone(),
            marks: DedupMarks::new(),
            last,
            dots: None,
        };
        admission::validate_chunk(&probe, &self.options.limits, self.replica, &st.local)?;
        Ok(probe.entries)
    }

    /// Joins one batch of whole entries (a chunk's, or a large row put back together): the
    /// keys after the previous batch's last key up to this batch's last.
    fn join_batch(
        &mut self,
        txn: &WriteTransaction,
        origin: PeerId,
        batch: Vec<(Key, Entry)>,
        st: &mut Stream,
    ) -> Result<Result<(), Rejected>, StoreError> {
        let bad = |why| Ok(Err(Rejected::BadChunk(why)));
        if st.join.is_none() {
            return bad("rows after the transfer's dedup marks");
        }
        // The checks the merged transfer would get (keys ascending across batches too).
        let mut entries = match self.check_as_merged(st, st.lo.clone(), batch, false) {
            Ok(entries) => entries,
            Err(reason) => return Ok(Err(reason)),
        };
        let Some(join) = st.join.as_mut() else {
            return bad("rows after the transfer's dedup marks");
        };
        let hi = entries.last().map(|(k, _)| k.clone());
        if let Some(keep) = &self.remote_filter {
            entries.retain(|(k, _)| keep(k));
        }
        st.max_ts = st
            .max_ts
            .max(admission::max_timestamp(entries.iter().map(|(_, e)| e)));
        let max = self.options.limits.record_bytes_max;
        let (local, tctx, lo) = (&st.local, &st.tctx, st.lo.as_ref());
        with_txn_rows(txn, max, |rows| {
            join.join_range(rows, local, (lo, hi.as_ref()), entries, tctx)
        })?;
        st.lo = hi;
        if let Some((inflation, by_key)) = join.take_batch() {
            self.log_batch(txn, origin, inflation, by_key, st)?;
        }
        Ok(Ok(()))
    }

    /// Logs one batch's inflation without its counters (logged after every other entry of
    /// the transfer, `RedbStore::log_counters`): its deletable entries, each with the dots
    /// it retired and the transfer's removals of no known key placed with it
    /// (`split::split_delta`), and its other removals.
    fn log_batch(
        &mut self,
        txn: &WriteTransaction,
        origin: PeerId,
        inflation: tidemark_crdts::causal_map::StoreDelta,
        mut by_key: Vec<(Key, CausalContext)>,
        st: &mut Stream,
    ) -> Result<(), StoreError> {
        let tidemark_crdts::Causal { store, mut ctx } = inflation;
        let mut kept = tidemark_crdts::DotMap::default();
        let mut deferred = CausalContext::new();
        for (key, entry) in store.iter() {
            if key.kind.deletable() {
                kept.set(key.clone(), entry.clone());
            } else {
                deferred.join(&entry.dots());
            }
        }
        by_key.retain(|(key, dots)| {
            if key.kind.deletable() {
                return true;
            }
            st.counter_retired.join(dots);
            deferred.join(dots);
            false
        });
        if !deferred.is_empty() {
            ctx = ctx.diff(&deferred);
        }
        if kept.is_bottom() && ctx.is_empty() {
            return Ok(());
        }
        let retired = Retired {
            by_key,
            unknown: Some(Unknown {
                removed: &st.removals,
                carried: &st.carried_indexed,
                except: (!st.set_unknown.is_empty()).then_some(&st.set_unknown),
            }),
        };
        let inflation = tidemark_crdts::Causal { store: kept, ctx };
        self.log_inflation(txn, origin, inflation, &retired, &mut st.run)
    }

    /// Logs the transfer's counters, after every other entry (so a counter's piece, which
    /// carries every lower removed dot of its replica — possibly another key's: which key a
    /// removal of a dot this node never held belonged to is known nowhere — never retires a
    /// dot before its key's new entry): each changed counter key's row restricted to the dots
    /// the local context lacked, read back from the transaction, in pieces within the target.
    fn log_counters(
        &mut self,
        txn: &WriteTransaction,
        origin: PeerId,
        keys: &crate::model::ChangedKeys,
        st: &mut Stream,
    ) -> Result<(), StoreError> {
        let target = self.options.limits.message_bytes_target;
        let max = self.options.limits.record_bytes_max;
        let mut removals = st.removals.clone();
        removals.join(&st.counter_retired);
        let none = CausalContext::new();
        let retired = Retired {
            by_key: Vec::new(),
            unknown: Some(Unknown {
                removed: &removals,
                carried: &none,
                except: None,
            }),
        };
        let (local, run) = (&st.local, &mut st.run);
        // The context the counters' pieces carried.
        let mut logged = CausalContext::new();
        let mut flush = |store: &mut tidemark_crdts::DotMap<Key, Entry>,
                         ctx: &mut CausalContext,
                         run: &mut LogRun|
         -> Result<(), StoreError> {
            if store.is_bottom() {
                return Ok(());
            }
            let delta = Delta {
                state: tidemark_crdts::Causal {
                    store: std::mem::take(store),
                    ctx: std::mem::take(ctx),
                },
                marks: DedupMarks::new(),
            };
            let pieces = split_delta(delta, target, &none, &retired).map_err(stage_err)?;
            for p in &pieces {
                logged.join(&p.state.ctx);
            }
            run.push(txn, origin, pieces, max)
        };
        with_txn_rows(txn, max, |rows| {
            let mut store = tidemark_crdts::DotMap::default();
            let mut ctx = CausalContext::new();
            let mut bytes = 0usize;
            for key in keys.iter().filter(|k| !k.kind.deletable()) {
                let Some(row) = rows.get(&key)? else {
                    continue;
                };
                let unseen = row.unseen_by(local);
                if unseen.is_bottom() {
                    continue;
                }
                let size = codec::encoded_len("entry", &(&key, &unseen)).map_err(stage_err)?;
                if bytes > 0 && bytes.saturating_add(size) > target / 2 {
                    flush(&mut store, &mut ctx, run)?;
                    bytes = 0;
                }
                bytes = bytes.saturating_add(size);
                ctx.join(&unseen.dots());
                store.set(key, unseen);
            }
            flush(&mut store, &mut ctx, run)
        })?;
        // A superseded local counter dot no counter piece carried (input no correct replica
        // builds: a counter dot retired by no later dot of its replica) is still logged.
        let left = st.counter_retired.diff(&logged);
        if !left.is_empty() {
            let delta = Delta {
                state: tidemark_crdts::Causal {
                    store: tidemark_crdts::DotMap::default(),
                    ctx: left,
                },
                marks: DedupMarks::new(),
            };
            let pieces = split_delta(delta, target, &none, &Retired::default()).map_err(stage_err)?;
            st.run.push(txn, origin, pieces, max)?;
        }
        Ok(())
    }

    /// The first pass over the transfer (staged chunks `0..staged`, then `last`): every chunk
    /// carries the transfer's context, the large rows' parts are sound, and no dot is carried
    /// twice (as `validate_chunk` checks within one chunk). Returns every dot carried, and
    /// those of deletable-kind entries.
    fn scan_staged(
        &self,
        txn: &WriteTransaction,
        staged: u32,
        last: &StateChunk,
        tctx: &CausalContext,
    ) -> Result<Result<(CausalContext, CausalContext), Rejected>, StoreError> {
        let frame_max = self.options.limits.frame_bytes_max;
        let mut check = PartsCheck::default();
        let mut carried = CausalContext::new();
        let mut indexed = CausalContext::new();
        let mut scan = |chunk: &StateChunk| -> Result<(), Rejected> {
            if chunk.ctx != *tctx {
                return Err(Rejected::BadChunk(
                    "chunks of one transfer carry different contexts",
                ));
            }
            check.next(chunk)?;
            let mut dup = None;
            for (k, e) in &chunk.entries {
                let deletable = k.kind.deletable();
                e.for_each_dot(&mut |d| {
                    if d.seq != 0 && !carried.insert(d) && dup.is_none() {
                        dup = Some((d, k.to_string()));
                    }
                    if deletable {
                        indexed.insert(d);
                    }
                });
            }
            match dup {
                Some((dot, key)) => Err(Rejected::DuplicateDot { dot, key }),
                None => Ok(()),
            }
        };
        let t = txn.open_table(TRANSFER_STAGE).map_err(StoreError::redb)?;
        for i in 0..staged {
            let g = t
                .get(u64::from(i))
                .map_err(StoreError::redb)?
                .ok_or_else(|| StoreError::Corrupt("a staged transfer chunk is missing".into()))?;
            let chunk: StateChunk =
                codec::decode("transfer chunk", g.value(), frame_max).map_err(stage_err)?;
            if let Err(reason) = scan(&chunk) {
                return Ok(Err(reason));
            }
        }
        if let Err(reason) = scan(last) {
            return Ok(Err(reason));
        }
        Ok(check.finish().map(|()| (carried, indexed)))
    }

    /// Ends the rows: joins the keys after the last batch (local keys the transfer does not
    /// hold), then the transfer's context. Once only; later calls do nothing.
    fn close_rows(
        &mut self,
        txn: &WriteTransaction,
        origin: PeerId,
        st: &mut Stream,
    ) -> Result<Result<(), Rejected>, StoreError> {
        let Some(mut join) = st.join.take() else {
            return Ok(Ok(()));
        };
        // The context alone is checked as the merged transfer's would be.
        if let Err(reason) = self.check_as_merged(st, None, Vec::new(), true) {
            return Ok(Err(reason));
        }
        let max = self.options.limits.record_bytes_max;
        let (local, tctx, lo) = (&st.local, &st.tctx, st.lo.as_ref());
        with_txn_rows(txn, max, |rows| {
            join.join_range(rows, local, (lo, None), Vec::new(), tctx)
        })?;
        if let Some((inflation, by_key)) = join.take_batch() {
            self.log_batch(txn, origin, inflation, by_key, st)?;
        }
        self.log_counters(txn, origin, join.changed(), st)?;
        let mut outcome = join.finish(&mut st.ctx, Some(&st.tctx));
        if let Some(inflation) = outcome.inflation.take() {
            // The transfer's context: the removals not logged with an entry (and, again, those
            // that were: the run's last record carries the rest of the context).
            let retired = Retired {
                by_key: std::mem::take(&mut outcome.retired),
                unknown: None,
            };
            self.log_inflation(txn, origin, inflation, &retired, &mut st.run)?;
        }
        st.outcome = Some(outcome);
        Ok(Ok(()))
    }

    /// Logs one batch's inflation in pieces within the message target (as `finish_remote`).
    fn log_inflation(
        &mut self,
        txn: &WriteTransaction,
        origin: PeerId,
        inflation: tidemark_crdts::causal_map::StoreDelta,
        retired: &Retired<'_>,
        run: &mut LogRun,
    ) -> Result<(), StoreError> {
        let delta = Delta {
            state: inflation,
            marks: DedupMarks::new(),
        };
        let target = self.options.limits.message_bytes_target;
        let pieces =
            split_delta(delta, target, &CausalContext::new(), retired).map_err(stage_err)?;
        run.push(txn, origin, pieces, self.options.limits.record_bytes_max)
    }
}

/// Room a state transfer's receiver keeps free besides what the transfer needs: a full disk
/// would halt every write of the node.
pub(crate) const STAGE_SPARE_BYTES: u64 = super::stream_snapshot::ROOM_SPARE_BYTES;

/// Whether `staged` bytes of a transfer (the chunk about to be staged included) leave room in
/// `free` bytes: the chunks themselves are on disk once staged, and the final join writes the
/// rows and their log records (about twice what is staged) before the staging is dropped.
///
/// # Errors
/// [`Rejected::NoRoom`] with the figures.
pub(crate) fn stage_room(free: u64, staged: u64) -> Result<(), Rejected> {
    let need = staged.saturating_mul(2).saturating_add(STAGE_SPARE_BYTES);
    if free < need {
        return Err(Rejected::NoRoom {
            free_mib: free >> 20,
            need_mib: need >> 20,
        });
    }
    Ok(())
}

#[cfg(test)]
mod room_tests {
    use super::{STAGE_SPARE_BYTES, stage_room};
    use crate::model::Rejected;

    /// A transfer is staged only while the disk keeps twice what is staged plus the spare:
    /// a peer sending chunks without end is refused before the disk fills, with the figures.
    #[test]
    fn staging_stops_before_the_disk_fills() {
        let gib = 1u64 << 30;
        assert_eq!(stage_room(10 * gib, gib), Ok(()));
        assert_eq!(stage_room(2 * gib + STAGE_SPARE_BYTES, gib), Ok(()));
        assert_eq!(
            stage_room(2 * gib + STAGE_SPARE_BYTES - 1, gib),
            Err(Rejected::NoRoom {
                free_mib: 2303,
                need_mib: 2304
            })
        );
        assert!(stage_room(u64::MAX - 1, u64::MAX / 2).is_err(), "no overflow");
        assert!(stage_room(0, 0).is_err(), "the spare is kept even for nothing staged");
        let msg = stage_room(100 << 20, 0).expect_err("no room").to_string();
        assert!(msg.contains("100 MiB free") && msg.contains("256 MiB needed"), "{msg}");
    }
}
