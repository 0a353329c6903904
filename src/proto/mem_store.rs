//! An in-memory [`StateStore`]: the reference backend for tests and deterministic simulations.
//!
//! It runs exactly the algorithms the durable store runs — [`tidemark_crdts::store::join_delta`]
//! for deltas, [`crate::apply::join_chunk`] for transfer chunks, [`crate::apply`]'s validation
//! for untrusted input — over rows kept in a `BTreeMap` (plus the dot → key index of
//! [`tidemark_crdts::MemStore`]). "Durable" here means: whatever a call did is visible to every
//! later call, and a simulated crash keeps the value (only the [`crate::proto::Replica`] is lost).
//! It knows nothing of the protocol's messages or of time beyond the `now_ms` passed in.

use crate::apply::{self, KeyRange, Rejected};
use crate::codec::{self, CodecError};
use crate::config::Limits;
use crate::model::{Delta, StateChunk};
use crate::proto::{ApplyOutcome, ChunkRead, LogInterval, PeerId, StateStore};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::ops::Bound;
use tidemark_crdts::store::{check_mutation, delta_mutation, join_delta};
use tidemark_crdts::{
    Causal, CausalContext, DedupMarks, DotMap, DotStore, Entry, Hlc, Key, KeyKind, MemStore,
    Mutation, MutationError, ReplicaId, Rows, StoreDelta, Timestamp, Value,
};

/// Storage failures of [`MemStateStore`] (it has no I/O, so only misuse and encoding limits).
#[derive(Debug, thiserror::Error)]
pub enum MemStoreError {
    /// A log interval was asked below the retained start (the caller must check the bounds).
    /// Nothing changed.
    #[error("log interval from {from} is below the retained start {start}")]
    BelowLogStart {
        /// The seq asked for.
        from: u64,
        /// The retained start.
        start: u64,
    },
    /// A log interval was asked beyond the log end. Nothing changed.
    #[error("log interval from {from} is beyond the log end {end}")]
    BeyondLogEnd {
        /// The seq asked for.
        from: u64,
        /// The log end.
        end: u64,
    },
    /// A value could not be encoded (over the codec's ceiling). The state may have been joined
    /// but the log entry was not written: the store must not be used for writes any more.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Rows in memory: [`MemStore`] (entries + dot index) plus key-range listing for transfers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemRows(MemStore);

impl MemRows {
    /// The entries, ascending by key.
    pub fn entries(&self) -> &BTreeMap<Key, Entry> {
        self.0.entries()
    }
}

impl Rows for MemRows {
    type Error = Infallible;
    fn get(&mut self, key: &Key) -> Result<Option<Entry>, Infallible> {
        self.0.get(key)
    }
    fn put(
        &mut self,
        key: &Key,
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) -> Result<(), Infallible> {
        self.0.put(key, old, new)
    }
    fn keys_holding(&mut self, dots: &CausalContext) -> Result<Vec<Key>, Infallible> {
        self.0.keys_holding(dots)
    }
}

impl KeyRange for MemRows {
    fn keys_in_range(
        &mut self,
        after: Option<&Key>,
        upto: Option<&Key>,
    ) -> Result<Vec<Key>, Infallible> {
        if let (Some(a), Some(u)) = (after, upto) {
            if a >= u {
                return Ok(Vec::new());
            }
        }
        let lo = after.map_or(Bound::Unbounded, |k| Bound::Excluded(k.clone()));
        let hi = upto.map_or(Bound::Unbounded, |k| Bound::Included(k.clone()));
        Ok(self
            .0
            .entries()
            .range((lo, hi))
            .map(|(k, _)| k.clone())
            .collect())
    }
}

fn infallible<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => match e {},
    }
}

/// One delta-log entry: where it came from (BP) and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LogEntry {
    /// `None` for local writes, the peer that sent it otherwise.
    origin: Option<PeerId>,
    /// The (redundancy-free) delta.
    delta: Delta,
    /// Its encoded size.
    bytes: usize,
}

/// An in-memory [`StateStore`] with a delta log, per-peer cursors and a hybrid logical clock.
///
/// Guarantees: every mutating call either fully happens or (on `Ok(Err(_))` / `Err(_)` before
/// any change) does not happen at all; the state always satisfies invariant I3 (every stored
/// dot is in the context); own dots are contiguous, so a dot is never issued twice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemStateStore {
    replica: ReplicaId,
    limits: Limits,
    rows: MemRows,
    ctx: CausalContext,
    marks: DedupMarks,
    log: BTreeMap<u64, LogEntry>,
    log_start: u64,
    log_end: u64,
    cursors: BTreeMap<PeerId, (ReplicaId, u64)>,
    hlc: Hlc,
    redundancy_removal: bool,
}

impl MemStateStore {
    /// The common tail of a remote join (delta or chunk): marks, HLC receive rule, the logged
    /// inflation (or `whole` when redundancy removal is off) tagged with `origin`, the cursor
    /// (`replace_cursor` for a completed transfer, else forward-only).
    #[allow(clippy::too_many_arguments)]
    fn finish_remote(
        &mut self,
        origin: PeerId,
        out: tidemark_crdts::store::JoinOutcome,
        marks: &DedupMarks,
        whole: Option<Delta>,
        cursor: Option<(ReplicaId, u64)>,
        replace_cursor: bool,
        now_ms: u64,
    ) -> Result<ApplyOutcome, MemStoreError> {
        let fresh_marks = self.marks.join(marks);
        let hlc_rejected = out
            .inflation
            .as_ref()
            .map_or(0, |i| self.observe_timestamps(&i.store, now_ms));
        let inflated = out.inflation.is_some() || !fresh_marks.is_empty();
        if inflated {
            let logged = whole.unwrap_or(Delta {
                state: out.inflation.unwrap_or_default(),
                marks: fresh_marks,
            });
            let bytes = codec::encoded_len("delta", &logged)?;
            self.push_log(Some(origin), logged, bytes);
        }
        if let Some(c) = cursor {
            self.set_cursor(origin, c, replace_cursor);
        }
        Ok(ApplyOutcome {
            inflated,
            changed: out.changed,
            hlc_rejected,
        })
    }

    /// An empty store for `replica` (redundancy removal on).
    pub fn new(replica: ReplicaId, limits: Limits) -> Self {
        let hlc = Hlc::new(replica, limits.max_clock_drift_ms);
        Self {
            replica,
            limits,
            rows: MemRows::default(),
            ctx: CausalContext::new(),
            marks: DedupMarks::new(),
            log: BTreeMap::new(),
            log_start: 0,
            log_end: 0,
            cursors: BTreeMap::new(),
            hlc,
            redundancy_removal: true,
        }
    }

    /// Turns redundancy removal (RR, DESIGN.md C3) on or off. Off: a remote delta that inflates
    /// the state is logged (and so forwarded) whole instead of only its inflating part. For
    /// measurements; production keeps it on.
    pub fn set_redundancy_removal(&mut self, on: bool) {
        self.redundancy_removal = on;
    }

    /// Applies local mutations as one batch: every op is checked first (all or none), then each
    /// takes the next own dot (a contiguous range), is joined in order (so later ops of the batch
    /// see earlier ones), and the batch is appended as ONE log entry with origin `None`.
    /// LWW writes are stamped by the clock at `wall_ms`. Returns the batch's delta.
    ///
    /// # Errors
    /// [`MutationError`] when an op does not apply to its key's type; nothing changed then.
    pub fn apply_local(
        &mut self,
        ops: &[(Key, Mutation)],
        wall_ms: u64,
    ) -> Result<Delta, MutationError> {
        for (key, mutation) in ops {
            check_mutation(key.kind, mutation)?;
        }
        assert!(
            self.ctx.own_dots_contiguous(self.replica),
            "own dots must be contiguous (invariant I2), or next_dot could reuse a dot"
        );
        let mut batch = Delta::default();
        for (key, mutation) in ops {
            let dot = self
                .ctx
                .next_dot(self.replica)
                .map_err(MutationError::DotsExhausted)?;
            let ts = (key.kind == KeyKind::Lww && matches!(mutation, Mutation::Set(_)))
                .then(|| self.hlc.now(wall_ms))
                .transpose()
                .map_err(|_| MutationError::ClockExhausted)?;
            let (entry, ctx) =
                delta_mutation(key.kind, self.rows.entries().get(key), mutation, dot, ts)?;
            let mut store = DotMap::default();
            store.set(key.clone(), entry);
            let delta = Causal { store, ctx };
            infallible(join_delta(&mut self.rows, &mut self.ctx, delta.clone()));
            batch.state.join(delta);
        }
        if !ops.is_empty() {
            let bytes = codec::encoded_len("delta", &batch).unwrap_or(usize::MAX);
            self.push_log(None, batch.clone(), bytes);
        }
        Ok(batch)
    }

    /// The value of `key` (the empty value of its kind when absent).
    pub fn value(&self, key: &Key) -> Value {
        self.rows
            .entries()
            .get(key)
            .map_or_else(|| Value::empty(key.kind), Entry::value)
    }

    /// The entries, ascending by key.
    pub fn entries(&self) -> &BTreeMap<Key, Entry> {
        self.rows.entries()
    }

    /// The dedup marks.
    pub fn marks(&self) -> &DedupMarks {
        &self.marks
    }

    /// The clock's high-water mark (what a durable store persists).
    pub fn hlc_mark(&self) -> (u64, u32) {
        self.hlc.mark()
    }

    /// The clock's current reading.
    pub fn hlc_stamp(&self) -> Timestamp {
        self.hlc.stamp()
    }

    /// Number of retained log entries.
    pub fn log_len(&self) -> usize {
        self.log.len()
    }

    /// Encoded bytes of the retained log entries.
    pub fn log_bytes(&self) -> u64 {
        self.log.values().map(|e| e.bytes as u64).sum()
    }

    /// The replicated state (entries, context, marks) as one delta.
    pub fn state(&self) -> Delta {
        let mut store = DotMap::default();
        for (k, e) in self.rows.entries() {
            store.set(k.clone(), e.clone());
        }
        Delta {
            state: StoreDelta {
                store,
                ctx: self.ctx.clone(),
            },
            marks: self.marks.clone(),
        }
    }

    /// The canonical encoding of the replicated state: two stores hold the same state iff these
    /// bytes are equal (the log, cursors and clock are not part of it).
    ///
    /// # Errors
    /// [`CodecError`] when the state is over the codec's ceiling.
    pub fn canonical_bytes(&self) -> Result<Vec<u8>, CodecError> {
        codec::encode("state", &self.state())
    }

    /// Invariant I3: every stored dot is in the context.
    pub fn dots_within_context(&self) -> bool {
        self.rows.entries().values().all(|e| {
            let mut ok = true;
            e.for_each_dot(&mut |d| ok &= self.ctx.contains(&d));
            ok
        })
    }

    /// What a restart would rebuild from the durable image (entries, context, marks, log,
    /// cursors, clock mark): rows and their dot index are rebuilt entry by entry. A correct store
    /// recovers to a value `==` to itself (the simulation checks this after every crash).
    pub fn recover(&self) -> MemStateStore {
        let mut rows = MemRows::default();
        for (k, e) in self.rows.entries() {
            infallible(rows.put(k, None, Some(e)));
        }
        Self {
            replica: self.replica,
            limits: self.limits.clone(),
            rows,
            ctx: self.ctx.clone(),
            marks: self.marks.clone(),
            log: self.log.clone(),
            log_start: self.log_start,
            log_end: self.log_end,
            cursors: self.cursors.clone(),
            hlc: Hlc::restore(
                self.replica,
                self.hlc.mark(),
                self.limits.max_clock_drift_ms,
            ),
            redundancy_removal: self.redundancy_removal,
        }
    }

    fn push_log(&mut self, origin: Option<PeerId>, delta: Delta, bytes: usize) {
        self.log.insert(
            self.log_end,
            LogEntry {
                origin,
                delta,
                bytes,
            },
        );
        self.log_end += 1;
    }

    /// Records a cursor: a delta's keeps the larger seq for the same log (a duplicate interval
    /// may end below it); a completed transfer's (`replace`) is authoritative.
    fn set_cursor(&mut self, origin: PeerId, (log, end): (ReplicaId, u64), replace: bool) {
        let seq = match self.cursors.get(&origin) {
            Some(&(l, c)) if l == log && !replace => c.max(end),
            _ => end,
        };
        self.cursors.insert(origin, (log, seq));
    }

    /// Observes the LWW timestamps of newly joined entries; returns how many were too far ahead
    /// (the data was joined, the clock not advanced for them).
    fn observe_timestamps(&mut self, store: &DotMap<Key, Entry>, now_ms: u64) -> u64 {
        let limit = now_ms.saturating_add(self.limits.max_clock_drift_ms);
        let mut rejected = 0;
        let mut best: Option<Timestamp> = None;
        for (_, entry) in store.iter() {
            if let Entry::Lww(f) = entry {
                for (_, (t, _)) in f.iter() {
                    if t.physical_ms > limit {
                        rejected += 1;
                    } else if best.is_none_or(|b| *t > b) {
                        best = Some(*t);
                    }
                }
            }
        }
        if let Some(t) = best {
            // Within the drift limit by construction; an error would leave the clock unchanged.
            if self.hlc.observe(&t, now_ms).is_err() {
                rejected += 1;
            }
        }
        rejected
    }
}

impl StateStore for MemStateStore {
    type Error = MemStoreError;

    fn replica_id(&self) -> ReplicaId {
        self.replica
    }

    fn context(&self) -> &CausalContext {
        &self.ctx
    }

    fn dedup_marks(&mut self) -> Result<DedupMarks, MemStoreError> {
        Ok(self.marks.clone())
    }

    fn log_bounds(&self) -> (u64, u64) {
        (self.log_start, self.log_end)
    }

    fn log_interval(
        &mut self,
        from: u64,
        exclude: Option<PeerId>,
        bytes_max: usize,
    ) -> Result<LogInterval, MemStoreError> {
        if from < self.log_start {
            return Err(MemStoreError::BelowLogStart {
                from,
                start: self.log_start,
            });
        }
        if from > self.log_end {
            return Err(MemStoreError::BeyondLogEnd {
                from,
                end: self.log_end,
            });
        }
        let mut joined: Option<Delta> = None;
        let mut bytes = 0usize;
        let mut end = from;
        for (&seq, entry) in self.log.range(from..) {
            if exclude.is_some() && entry.origin == exclude {
                end = seq + 1;
                continue;
            }
            if joined.is_some() && bytes.saturating_add(entry.bytes) > bytes_max {
                break;
            }
            bytes = bytes.saturating_add(entry.bytes);
            match &mut joined {
                Some(d) => d.join(entry.delta.clone()),
                None => joined = Some(entry.delta.clone()),
            }
            end = seq + 1;
        }
        Ok(LogInterval { delta: joined, end })
    }

    fn apply_remote(
        &mut self,
        origin: PeerId,
        delta: Delta,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, MemStoreError> {
        if let Err(reason) = apply::validate_delta(&delta, &self.limits, self.replica, &self.ctx) {
            return Ok(Err(reason));
        }
        let Delta { state, marks } = delta;
        // With redundancy removal off (measurements only) the whole delta is logged.
        let whole = (!self.redundancy_removal).then(|| Delta {
            state: state.clone(),
            marks: marks.clone(),
        });
        let out = infallible(join_delta(&mut self.rows, &mut self.ctx, state));
        self.finish_remote(origin, out, &marks, whole, cursor, false, now_ms)
            .map(Ok)
    }

    fn peer_cursor(&self, peer: PeerId) -> Option<(ReplicaId, u64)> {
        self.cursors.get(&peer).copied()
    }

    fn read_chunk(
        &mut self,
        after: Option<&Key>,
        bytes_max: usize,
    ) -> Result<ChunkRead, MemStoreError> {
        let lo = after.map_or(Bound::Unbounded, |k| Bound::Excluded(k.clone()));
        let mut iter = self.rows.entries().range((lo, Bound::Unbounded)).peekable();
        let mut entries = Vec::new();
        let mut bytes = 0usize;
        while let Some((k, e)) = iter.peek() {
            let size = codec::encoded_len("entry", &(k, e))?;
            if !entries.is_empty() && bytes.saturating_add(size) > bytes_max {
                break;
            }
            bytes = bytes.saturating_add(size);
            entries.push(((*k).clone(), (*e).clone()));
            iter.next();
        }
        let done = iter.peek().is_none();
        let last_key = entries.last().map(|(k, _)| k.clone());
        Ok(ChunkRead {
            entries,
            last_key,
            done,
            part: None,
        })
    }

    /// Rows are never split here (`resume` is never set by a transfer of this store's reads).
    fn read_chunk_from(
        &mut self,
        after: Option<&Key>,
        _resume: Option<&(Key, tidemark_crdts::Dot)>,
        bytes_max: usize,
    ) -> Result<ChunkRead, MemStoreError> {
        self.read_chunk(after, bytes_max)
    }

    fn read_marks(
        &mut self,
        after: Option<&(String, String)>,
        bytes_max: usize,
    ) -> Result<crate::proto::MarksRead, MemStoreError> {
        Ok(crate::proto::state_store::page_marks(
            self.marks.iter().map(|(k, v)| (k.clone(), v.clone())),
            after,
            bytes_max,
        ))
    }

    fn apply_chunk(
        &mut self,
        origin: PeerId,
        chunk: StateChunk,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, MemStoreError> {
        if let Err(reason) = apply::validate_chunk(&chunk, &self.limits, self.replica, &self.ctx) {
            return Ok(Err(reason));
        }
        let marks = chunk.marks.clone();
        let out = infallible(apply::join_chunk(&mut self.rows, &mut self.ctx, chunk));
        self.finish_remote(origin, out, &marks, None, cursor, true, now_ms)
            .map(Ok)
    }

    fn truncate_log(&mut self, below: u64) -> Result<u64, MemStoreError> {
        let below = below.min(self.log_end);
        if below <= self.log_start {
            return Ok(0);
        }
        let kept = self.log.split_off(&below);
        let dropped = std::mem::replace(&mut self.log, kept);
        self.log_start = below;
        Ok(dropped.values().map(|e| e.bytes as u64).sum())
    }
}
