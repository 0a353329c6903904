//! The replication side of the store: [`StateStore`] for the sans-IO core, plus
//! `deltas_since` and log compaction.

use crate::admission::Joined;
use super::big_row::BigRow;
use super::error::StoreError;
use super::local::append_log;
use super::rows::{TxnRows, with_txn_rows};
use super::split::{Retired, split_delta};
use super::transfer_stage::LogRun;
use super::tables::{
    CURSORS, DEDUP, LOG, LogRecord, META_CONTEXT, META_HLC, META_LOG_BOUNDS, META_TRUNCATED,
    dedup_key,
};
use super::{RedbStore, meta_put};
use crate::admission;
use crate::codec;
use crate::model::Rejected;
use crate::model::marks_bytes;
use crate::model::{Delta, StateChunk};
use crate::proto::{
    ApplyOutcome, ChunkRead, LogInterval, MarksRead, PeerId, StateStore, TransferId,
};
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use tidemark_crdts::causal_map::join_delta;
use tidemark_crdts::{CausalContext, DedupMarks, Dot, Entry, IntervalSet, Key, ReplicaId};

/// Result of [`RedbStore::deltas_since`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one value per call, returned and consumed at once: boxing the delta would cost an allocation per call"
)]
pub enum DeltasSince {
    /// The join of every retained log entry the peer lacks, up to the byte bound.
    Deltas {
        /// The joined delta (empty when the peer lacks nothing).
        delta: Delta,
        /// True when the byte bound stopped the scan: call again after joining this.
        more: bool,
    },
    /// Compaction dropped entries the peer lacks: it needs a state transfer.
    NeedsStateTransfer,
}

fn codec_err(table: &'static str) -> impl Fn(codec::CodecError) -> StoreError {
    move |source| StoreError::Codec { table, source }
}

impl RedbStore {
    fn read_log_record(&self, bytes: &[u8]) -> Result<LogRecord, StoreError> {
        codec::decode("log record", bytes, self.options.limits.record_bytes_max)
            .map_err(codec_err("log"))
    }

    /// Every retained log delta a peer at `remote` lacks, joined, up to about `bytes_max`
    /// encoded bytes ("heads and needs" against a version vector or full context).
    ///
    /// # Errors
    /// Storage failures.
    pub fn deltas_since(
        &self,
        remote: &CausalContext,
        bytes_max: usize,
    ) -> Result<DeltasSince, StoreError> {
        if !self.truncated.is_subset(remote) {
            return Ok(DeltasSince::NeedsStateTransfer);
        }
        let rtxn = self.db.begin_read().map_err(StoreError::redb)?;
        let log = rtxn.open_table(LOG).map_err(StoreError::redb)?;
        let mut delta = Delta::default();
        let mut bytes = 0usize;
        // Records appended together (`LogRecord::continues`) are sent whole or not at all: a
        // trailing piece of removals alone can look redundant to a peer that still holds the
        // removed dots, while the run's joined context holds the dots that caused them.
        let mut run: Vec<Delta> = Vec::new();
        let mut run_bytes = 0usize;
        let mut run_needed = false;
        let mut records = log
            .range(self.log_start..)
            .map_err(StoreError::redb)?
            .peekable();
        while let Some(item) = records.next() {
            let (_, v) = item.map_err(StoreError::redb)?;
            let record = self.read_log_record(v.value())?;
            run_needed |= !record.delta.state.ctx.is_subset(remote);
            run_bytes = run_bytes.saturating_add(v.value().len());
            run.push(record.delta);
            if record.continues && records.peek().is_some() {
                continue;
            }
            if run_needed {
                // The bound is checked before adding, so the result stays within `bytes_max`
                // unless one run alone is larger (a run is one commit group's records).
                if bytes > 0 && bytes.saturating_add(run_bytes) > bytes_max {
                    return Ok(DeltasSince::Deltas { delta, more: true });
                }
                bytes = bytes.saturating_add(run_bytes);
                for d in run.drain(..) {
                    delta.join(d);
                }
            }
            run.clear();
            run_bytes = 0;
            run_needed = false;
        }
        Ok(DeltasSince::Deltas { delta, more: false })
    }

    /// Joins a remote delta durably (see [`StateStore::apply_remote`]), without a peer cursor.
    ///
    /// # Errors
    /// Storage failures (the store halts). An invalid delta is `Ok(Err(_))`.
    pub fn apply_remote_delta(
        &mut self,
        origin: PeerId,
        delta: Delta,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, StoreError> {
        self.apply_remote(origin, delta, None, now_ms)
    }

    pub(super) fn write_marks(
        &mut self,
        txn: &WriteTransaction,
        marks: &DedupMarks,
    ) -> Result<DedupMarks, StoreError> {
        let max = self.options.limits.record_bytes_max;
        let mut fresh = DedupMarks::new();
        let mut table = txn.open_table(DEDUP).map_err(StoreError::redb)?;
        for ((stream, source), theirs) in marks.iter() {
            let k = dedup_key(stream, source);
            let mut mine: IntervalSet = match table.get(k.as_slice()).map_err(StoreError::redb)? {
                Some(g) => {
                    codec::decode("dedup marks", g.value(), max).map_err(codec_err("dedup"))?
                }
                None => IntervalSet::new(),
            };
            let new = theirs.difference(&mine);
            if new.is_empty() {
                continue;
            }
            mine.union_with(&new);
            // The row changes: drop the writer's copy (re-read on next use; dropping it even
            // if this transaction is then aborted only costs that read).
            self.dedup_cache.remove(&(stream.clone(), source.clone()));
            let bytes = codec::encode("dedup marks", &mine).map_err(codec_err("dedup"))?;
            table
                .insert(k.as_slice(), bytes.as_slice())
                .map_err(StoreError::redb)?;
            fresh.set(stream.clone(), source.clone(), new);
        }
        Ok(fresh)
    }

    /// The common tail of a remote join: marks, log entry, cursor, meta, commit, mirrors.
    /// `run` holds what the join already logged in `txn` (a streamed transfer logs batch by
    /// batch); its records and this tail's form one run.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_remote(
        &mut self,
        txn: WriteTransaction,
        origin: PeerId,
        outcome: Joined,
        marks: &DedupMarks,
        ctx: CausalContext,
        cursor: Option<(ReplicaId, u64)>,
        (hlc, hlc_rejected): (tidemark_crdts::Hlc, u64),
        run: LogRun,
    ) -> Result<ApplyOutcome, StoreError> {
        let fresh_marks = self.write_marks(&txn, marks)?;
        let LogRun {
            mut log_end,
            pending: mut pieces,
            inflated: logged,
        } = run;
        let inflated_now = outcome.inflation.is_some() || !fresh_marks.is_empty();
        if inflated_now {
            let delta = Delta {
                state: outcome.inflation.unwrap_or_default(),
                marks: fresh_marks,
            };
            // Logged in pieces within the message target, so forwarding it never needs a
            // message larger than a frame (ARCHITECTURE.md, "size invariants").
            // Each key's retired dots travel with its entry (write-path.md, "Log records").
            let retired = Retired {
                by_key: outcome.retired,
                unknown: None,
            };
            pieces.extend(
                split_delta(
                    delta,
                    self.options.limits.message_bytes_target,
                    &CausalContext::new(),
                    &retired,
                )
                .map_err(codec_err("log"))?,
            );
        }
        let inflated = inflated_now || logged;
        if inflated {
            log_end = append_log(
                &txn,
                Some(origin),
                pieces,
                log_end,
                self.options.limits.record_bytes_max,
                &mut super::wal::Redo::default(),
            )?;
            meta_put(&txn, META_CONTEXT, &ctx)?;
            meta_put(&txn, META_LOG_BOUNDS, &(self.log_start, log_end))?;
        }
        let cursor_changed = cursor.is_some_and(|c| self.cursors.get(&origin) != Some(&c));
        if let (true, Some(c)) = (cursor_changed, cursor) {
            let bytes = codec::encode("cursor", &c).map_err(codec_err("cursors"))?;
            let mut t = txn.open_table(CURSORS).map_err(StoreError::redb)?;
            t.insert(origin.0, bytes.as_slice())
                .map_err(StoreError::redb)?;
        }
        if hlc != self.hlc {
            meta_put(&txn, META_HLC, &hlc.mark())?;
        }
        if inflated || cursor_changed || hlc != self.hlc {
            self.commit(txn)?;
            self.stats.commits += 1;
        } else {
            txn.abort().map_err(StoreError::redb)?;
        }
        if inflated {
            self.stats.remote_inflations += 1;
        } else {
            self.stats.remote_redundant += 1;
        }
        self.stats.hlc_rejected += hlc_rejected;
        // The in-memory mirrors move only after the commit above, and only forward: the
        // context only grows and the log end never goes back (ARCHITECTURE.md, invariant 6).
        debug_assert!(self.ctx.is_subset(&ctx), "a remote join shrank the context");
        debug_assert!(log_end >= self.log_end, "a remote join moved the log end back");
        debug_assert!(
            inflated || log_end == self.log_end,
            "a join that changed nothing moved the log end"
        );
        self.ctx = ctx;
        self.hlc = hlc;
        self.log_end = log_end;
        if let (true, Some(c)) = (cursor_changed, cursor) {
            self.cursors.insert(origin, c);
        }
        Ok(ApplyOutcome {
            inflated,
            changed: outcome.changed,
            hlc_rejected,
        })
    }

    /// HLC receive rule for the largest remote LWW timestamp: a timestamp too far ahead is
    /// joined as data but does not move our clock (counted instead).
    fn observe_remote_time<'a>(
        &self,
        entries: impl Iterator<Item = &'a tidemark_crdts::Entry>,
        now_ms: u64,
    ) -> (tidemark_crdts::Hlc, u64) {
        let mut hlc = self.hlc.clone();
        let rejected = match admission::max_timestamp(entries) {
            Some(ts) => u64::from(hlc.observe(&ts, now_ms).is_err()),
            None => 0,
        };
        (hlc, rejected)
    }

    /// One remote join as one transaction: the rows/dots join given by `join`, then marks, log
    /// entry, cursor and HLC mark ([`RedbStore::finish_remote`]).
    fn remote_join(
        &mut self,
        origin: PeerId,
        marks: &DedupMarks,
        cursor: Option<(ReplicaId, u64)>,
        (hlc, hlc_rejected): (tidemark_crdts::Hlc, u64),
        join: impl FnOnce(&mut TxnRows<'_, '_>, &mut CausalContext) -> Result<Joined, StoreError>,
    ) -> Result<ApplyOutcome, StoreError> {
        let txn = self.begin()?;
        let mut ctx = self.ctx.clone();
        let outcome = with_txn_rows(&txn, self.options.limits.record_bytes_max, |rows| {
            join(rows, &mut ctx)
        })?;
        let run = LogRun::new(self.log_end);
        self.finish_remote(
            txn,
            origin,
            outcome,
            marks,
            ctx,
            cursor,
            (hlc, hlc_rejected),
            run,
        )
    }

    /// Drops log entries below `below` in one transaction; returns the bytes reclaimed.
    ///
    /// # Errors
    /// Storage failures (the store halts).
    pub fn compact(&mut self, below: u64) -> Result<u64, StoreError> {
        self.guarded(|s| {
            let mut below = below.min(s.log_end);
            if below <= s.log_start {
                return Ok(0);
            }
            let txn = s.begin()?;
            let mut truncated = s.truncated.clone();
            let mut reclaimed = 0u64;
            {
                let mut log = txn.open_table(LOG).map_err(StoreError::redb)?;
                let mut seqs = Vec::new();
                // Only whole runs of records appended together go (`LogRecord::continues`):
                // `deltas_since` decides per run, so a run cut in two could hide its tail.
                let mut run_ctx = CausalContext::new();
                let mut run_bytes = 0u64;
                let mut run_seqs = Vec::new();
                for item in log.range(s.log_start..below).map_err(StoreError::redb)? {
                    let (k, v) = item.map_err(StoreError::redb)?;
                    let record = s.read_log_record(v.value())?;
                    run_ctx.join(&record.delta.state.ctx);
                    run_bytes += v.value().len() as u64;
                    run_seqs.push(k.value());
                    if !record.continues {
                        truncated.join(&run_ctx);
                        reclaimed += run_bytes;
                        seqs.append(&mut run_seqs);
                        run_ctx = CausalContext::new();
                        run_bytes = 0;
                    }
                }
                if let Some(&first) = run_seqs.first() {
                    below = first;
                }
                if below <= s.log_start {
                    return Ok(0);
                }
                for seq in seqs {
                    log.remove(seq).map_err(StoreError::redb)?;
                }
            }
            meta_put(&txn, META_TRUNCATED, &truncated)?;
            meta_put(&txn, META_LOG_BOUNDS, &(below, s.log_end))?;
            s.commit(txn)?;
            // The log start moves forward only, after its commit, never past the end.
            debug_assert!(
                below > s.log_start && below <= s.log_end,
                "compaction moved the log start outside (start, end]"
            );
            s.stats.commits += 1;
            s.stats.compaction_reclaimed_bytes += reclaimed;
            s.truncated = truncated;
            s.log_start = below;
            Ok(reclaimed)
        })
    }

    /// Number of retained log entries.
    pub fn log_len(&self) -> u64 {
        self.log_end - self.log_start
    }
}

impl StateStore for RedbStore {
    type Error = StoreError;

    fn replica_id(&self) -> ReplicaId {
        self.replica
    }

    fn context(&self) -> &CausalContext {
        &self.ctx
    }

    fn log_bounds(&self) -> (u64, u64) {
        (self.log_start, self.log_end)
    }

    fn log_interval(
        &mut self,
        from: u64,
        exclude: Option<PeerId>,
        bytes_max: usize,
    ) -> Result<LogInterval, StoreError> {
        if from < self.log_start {
            return Err(StoreError::LogTruncated {
                start: self.log_start,
            });
        }
        let rtxn = self.db.begin_read().map_err(StoreError::redb)?;
        let log = rtxn.open_table(LOG).map_err(StoreError::redb)?;
        let mut delta: Option<Delta> = None;
        let mut bytes = 0usize;
        let mut end = from;
        for item in log.range(from..self.log_end).map_err(StoreError::redb)? {
            let (k, v) = item.map_err(StoreError::redb)?;
            let record = self.read_log_record(v.value())?;
            if exclude.is_some() && record.origin == exclude {
                end = k.value() + 1;
                continue;
            }
            // Checked before adding: the interval never exceeds `bytes_max`
            // unless its one record does, and records are within the message target.
            let len = v.value().len();
            if delta.is_some() && bytes.saturating_add(len) > bytes_max {
                break;
            }
            end = k.value() + 1;
            bytes += len;
            match &mut delta {
                Some(d) => d.join(record.delta),
                None => delta = Some(record.delta),
            }
        }
        Ok(LogInterval { delta, end })
    }

    fn apply_remote(
        &mut self,
        origin: PeerId,
        delta: Delta,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, StoreError> {
        if let Err(r) =
            admission::validate_delta(&delta, &self.options.limits, self.replica, &self.ctx)
        {
            self.stats.rejected += 1;
            return Ok(Err(r));
        }
        let mut delta = delta;
        self.filter_remote_delta(&mut delta);
        let Delta { state, marks } = delta;
        // For the same sender log the cursor only moves forward (a late, shorter interval must
        // not move it back); another log id (a wiped sender) replaces it.
        let cursor = cursor.map(|(log, end)| match self.cursors.get(&origin) {
            Some(&(known, at)) if known == log && at > end => (known, at),
            _ => (log, end),
        });
        self.guarded(|s| {
            let observed = s.observe_remote_time(state.store.iter().map(|(_, e)| e), now_ms);
            s.remote_join(origin, &marks, cursor, observed, |rows, ctx| {
                join_delta(rows, ctx, state).map(Joined::from)
            })
            .map(Ok)
        })
    }

    fn peer_cursor(&self, peer: PeerId) -> Option<(ReplicaId, u64)> {
        // A store restored from a snapshot holds its source's log below the seed's end: offered
        // to every peer without a cursor, it is a cursor only for the source (the only peer
        // whose log id it names), so the source resumes with deltas instead of a transfer.
        self.cursors.get(&peer).copied().or(self.seed)
    }

    fn read_chunk(
        &mut self,
        after: Option<&Key>,
        bytes_max: usize,
    ) -> Result<ChunkRead, StoreError> {
        self.read_chunk_from(None, after, None, bytes_max)
    }

    fn pin_transfer_snapshot(&mut self, peer: PeerId) -> Result<(), StoreError> {
        let rtxn = self.db.begin_read().map_err(StoreError::redb)?;
        self.transfer_snapshots.insert(peer, rtxn);
        self.big_rows.remove(&Some(peer));
        Ok(())
    }

    fn has_transfer_snapshot(&self, peer: PeerId) -> bool {
        self.transfer_snapshots.contains_key(&peer)
    }

    fn release_transfer_snapshots(&mut self, keep: &dyn Fn(PeerId) -> bool) {
        self.transfer_snapshots.retain(|&peer, _| keep(peer));
        let snapshots = &self.transfer_snapshots;
        self.big_rows
            .retain(|at, _| at.is_none_or(|p| snapshots.contains_key(&p)));
    }

    fn read_chunk_from(
        &mut self,
        at: Option<PeerId>,
        after: Option<&Key>,
        resume: Option<&(Key, Dot)>,
        bytes_max: usize,
    ) -> Result<ChunkRead, StoreError> {
        // The snapshot is taken out while it is read (the read may replace a `big_rows` entry).
        let rtxn = self.transfer_read(at)?;
        let read = self.read_chunk_in(&rtxn, at, after, resume, bytes_max);
        if let Some(peer) = at {
            self.transfer_snapshots.insert(peer, rtxn);
        }
        read
    }

    fn read_marks(
        &mut self,
        at: Option<PeerId>,
        after: Option<&(String, String)>,
        bytes_max: usize,
    ) -> Result<MarksRead, StoreError> {
        let rtxn = self.transfer_read(at)?;
        let read = self.read_marks_in(&rtxn, after, bytes_max);
        if let Some(peer) = at {
            self.transfer_snapshots.insert(peer, rtxn);
        }
        read
    }

    fn apply_chunk(
        &mut self,
        origin: PeerId,
        chunk: StateChunk,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, StoreError> {
        if let Err(r) =
            admission::validate_chunk(&chunk, &self.options.limits, self.replica, &self.ctx)
        {
            self.stats.rejected += 1;
            return Ok(Err(r));
        }
        let mut chunk = chunk;
        self.filter_remote_chunk(&mut chunk);
        self.guarded(|s| {
            let observed = s.observe_remote_time(chunk.entries.iter().map(|(_, e)| e), now_ms);
            // Marks come in pages after the rows: every chunk's are joined.
            let marks = chunk.marks.clone();
            s.remote_join(origin, &marks, cursor, observed, |rows, ctx| {
                admission::join_chunk(rows, ctx, chunk)
            })
            .map(Ok)
        })
    }

    fn stage_chunk(
        &mut self,
        origin: PeerId,
        transfer: TransferId,
        index: u32,
        chunk: StateChunk,
    ) -> Result<Result<(), Rejected>, StoreError> {
        self.guarded(|s| s.stage(origin, transfer, index, &chunk))
    }

    fn apply_staged(
        &mut self,
        origin: PeerId,
        transfer: TransferId,
        index: u32,
        last: StateChunk,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, StoreError> {
        self.guarded(|s| s.apply_staged_chunks(origin, transfer, index, last, cursor, now_ms))
    }

    fn clear_staged(&mut self) -> Result<(), StoreError> {
        self.guarded(RedbStore::drop_staging)
    }

    fn dedup_marks(&mut self) -> Result<DedupMarks, StoreError> {
        let max = self.options.limits.record_bytes_max;
        let rtxn = self.db.begin_read().map_err(StoreError::redb)?;
        let table = rtxn.open_table(DEDUP).map_err(StoreError::redb)?;
        let mut marks = DedupMarks::new();
        for item in table.iter().map_err(StoreError::redb)? {
            let (k, v) = item.map_err(StoreError::redb)?;
            let (stream, source) = super::tables::parse_dedup_key(k.value())
                .ok_or_else(|| StoreError::Corrupt("unreadable dedup key".into()))?;
            let seqs: IntervalSet =
                codec::decode("dedup marks", v.value(), max).map_err(codec_err("dedup"))?;
            marks.set(stream, source, seqs);
        }
        Ok(marks)
    }

    fn truncate_log(&mut self, below: u64) -> Result<u64, StoreError> {
        self.compact(below)
    }
}

impl RedbStore {
    /// How many state-transfer snapshots are pinned (one per peer a transfer is under way to).
    pub fn transfer_snapshots_pinned(&self) -> usize {
        self.transfer_snapshots.len()
    }

    /// The read transaction a transfer read uses: the snapshot pinned for `at` (taken out of
    /// the map: the caller puts it back), or a new one on the current state.
    fn transfer_read(&mut self, at: Option<PeerId>) -> Result<redb::ReadTransaction, StoreError> {
        match at {
            Some(peer) => self.transfer_snapshots.remove(&peer).ok_or_else(|| {
                StoreError::Corrupt(format!("no transfer snapshot is pinned for peer {}", peer.0))
            }),
            None => self.db.begin_read().map_err(StoreError::redb),
        }
    }

    /// [`StateStore::read_chunk_from`] on `rtxn` (the snapshot `at` names, or the current
    /// state).
    fn read_chunk_in(
        &mut self,
        rtxn: &redb::ReadTransaction,
        at: Option<PeerId>,
        after: Option<&Key>,
        resume: Option<&(Key, Dot)>,
        bytes_max: usize,
    ) -> Result<ChunkRead, StoreError> {
        use std::ops::Bound;
        let max = self.options.limits.record_bytes_max;
        let (rows, elems) = super::rows::open_read_tables(rtxn)?;
        if let Some((key, from)) = resume {
            // Continue a large row (or cover the rest of its dot space if it vanished): read
            // once per transfer, unless a write transaction came in between.
            if self.big_rows.get(&at).is_none_or(|b| b.key() != key) {
                let entry = super::rows::read_entry(&rows, &elems, key, max)?
                    .unwrap_or_else(|| Entry::bottom(key.kind));
                self.stats.big_row_reads += 1;
                self.big_rows.insert(at, BigRow::new(key.clone(), entry)?);
            }
            return self.next_big_part(at, Some(*from), bytes_max);
        }
        let lo = after.map(super::tables::key_bytes);
        let lo_b: Bound<&[u8]> = lo.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut entries = Vec::new();
        let mut bytes = 0usize;
        let mut done = true;
        for item in rows
            .range::<&[u8]>((lo_b, Bound::Unbounded))
            .map_err(StoreError::redb)?
        {
            let (k, v) = item.map_err(StoreError::redb)?;
            let key = super::tables::parse_key(k.value())
                .ok_or_else(|| StoreError::Corrupt("unreadable row key".into()))?;
            // A set is assembled from its element rows (a read) and sized as one row.
            let entry = super::rows::row_entry(&elems, &key, v.value(), max)?;
            let size = k.value().len()
                + if super::rows::per_element(key.kind) {
                    codec::encoded_len("state row", &entry).map_err(codec_err("rows"))?
                } else {
                    v.value().len()
                };
            if !entries.is_empty() && bytes.saturating_add(size) > bytes_max {
                done = false;
                break;
            }
            if entries.is_empty() && size > bytes_max {
                // A row too large for one message goes in parts (`store::big_row`).
                self.stats.big_row_reads += 1;
                self.big_rows.insert(at, BigRow::new(key, entry)?);
                return self.next_big_part(at, None, bytes_max);
            }
            bytes += size;
            entries.push((key, entry));
        }
        let last_key = entries.last().map(|(k, _)| k.clone());
        Ok(ChunkRead {
            entries,
            last_key,
            done,
            part: None,
        })
    }

    /// [`StateStore::read_marks`] on `rtxn`.
    fn read_marks_in(
        &self,
        rtxn: &redb::ReadTransaction,
        after: Option<&(String, String)>,
        bytes_max: usize,
    ) -> Result<MarksRead, StoreError> {
        use std::ops::Bound;
        let max = self.options.limits.record_bytes_max;
        let table = rtxn.open_table(DEDUP).map_err(StoreError::redb)?;
        let lo = after.map(|(stream, source)| dedup_key(stream, source));
        let lo_b: Bound<&[u8]> = lo.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut sources = Vec::new();
        let mut bytes = 0usize;
        let mut more = false;
        for item in table
            .range::<&[u8]>((lo_b, Bound::Unbounded))
            .map_err(StoreError::redb)?
        {
            let (k, v) = item.map_err(StoreError::redb)?;
            if !sources.is_empty() && bytes >= bytes_max {
                more = true;
                break;
            }
            let (stream, source) = super::tables::parse_dedup_key(k.value())
                .ok_or_else(|| StoreError::Corrupt("unreadable dedup key".into()))?;
            let seqs: IntervalSet =
                codec::decode("dedup marks", v.value(), max).map_err(codec_err("dedup"))?;
            bytes = bytes.saturating_add(marks_bytes(&stream, &source, &seqs));
            sources.push(((stream, source), seqs));
        }
        // Pages follow the table's key order and resume by table key (`dedup_key`).
        let mut page = MarksRead {
            done: !more,
            ..MarksRead::default()
        };
        for ((stream, source), seqs) in sources {
            page.last = Some((stream.clone(), source.clone()));
            page.marks.set(stream, source, seqs);
        }
        Ok(page)
    }

    /// The next part of the large row being sent from `at` ([`RedbStore::big_rows`]), which is
    /// dropped after its last part.
    fn next_big_part(
        &mut self,
        at: Option<PeerId>,
        from: Option<Dot>,
        bytes_max: usize,
    ) -> Result<ChunkRead, StoreError> {
        let big = self
            .big_rows
            .get(&at)
            .ok_or_else(|| StoreError::Corrupt("no large row in transfer".into()))?;
        let (read, finished) = big.next_part(from, bytes_max)?;
        if finished {
            self.big_rows.remove(&at);
        }
        Ok(read)
    }
}
