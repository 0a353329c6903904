//! The storage interface of the replication core: the only way `proto` reaches state.
//!
//! The durable node implements it over redb tables ([`crate::store::RedbStore`]); tests and
//! simulations may implement it in memory. Every mutating call is durable when it returns.

use crate::model::Rejected;
use crate::model::{Delta, StateChunk};
use crate::proto::PeerId;
use tidemark_crdts::{CausalContext, DedupMarks, Key, ReplicaId};

/// What a durable join of a remote delta or chunk did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// True when the state changed (the inflating part was logged for forwarding).
    pub inflated: bool,
    /// Keys whose values changed (for watchers and views).
    pub changed: crate::model::ChangedKeys,
    /// Remote LWW timestamps that were too far ahead for the local clock: the data was joined
    /// (convergence needs it) but the clock was not advanced (docs/design/principles.md,
    /// "Hybrid logical clocks").
    pub hlc_rejected: u64,
}

/// One incoming state transfer: `(sender's log id, sender's epoch, transfer id)`.
pub type TransferId = (ReplicaId, u64, u64);

/// A bounded slice of the delta log, coalesced into one delta (a delta-interval:
/// docs/design/principles.md, "Delta intervals and acknowledgements").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogInterval {
    /// The join of the included entries (`None` when every entry was skipped by BP).
    pub delta: Option<Delta>,
    /// The first log sequence number *not* covered: the receiver's cursor after joining.
    pub end: u64,
}

/// A chunk of full state read for a transfer, plus where the next chunk starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkRead {
    /// The entries of the range, in key order.
    pub entries: Vec<(Key, tidemark_crdts::Entry)>,
    /// The last key included (the next chunk starts after it); `None` when the range is empty.
    pub last_key: Option<Key>,
    /// True when no key follows the range (and no part of a row remains).
    pub done: bool,
    /// `Some` when the read is one part of a row too large for one message: `entries` then
    /// holds only that key's dots within `slice`, and the chunk must join within the slice.
    pub part: Option<RowPart>,
}

/// One part of a large row in a state transfer (see [`crate::model::DotSlice`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowPart {
    /// The row's key (the chunk's range ends at it).
    pub key: Key,
    /// The slice of dot space this part covers; `upto == None` for the row's last part.
    pub slice: crate::model::DotSlice,
}

/// A page of dedup marks read for a state transfer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarksRead {
    /// The marks of the page (whole sources, in `(stream, source)` order).
    pub marks: DedupMarks,
    /// The last `(stream, source)` included: the next page starts after it.
    pub last: Option<(String, String)>,
    /// True when no source follows.
    pub done: bool,
}

/// Takes whole sources after `after` from `sources` (ascending) up to about `bytes_max` (a
/// helper for in-memory [`StateStore::read_marks`]).
pub fn page_marks(
    sources: impl Iterator<Item = ((String, String), tidemark_crdts::IntervalSet)>,
    after: Option<&(String, String)>,
    bytes_max: usize,
) -> MarksRead {
    let mut page = MarksRead {
        done: true,
        ..MarksRead::default()
    };
    let mut bytes = 0usize;
    for ((stream, source), seqs) in sources {
        if after.is_some_and(|a| (&stream, &source) <= (&a.0, &a.1)) {
            continue;
        }
        let len = crate::model::marks_bytes(&stream, &source, &seqs);
        if page.last.is_some() && bytes.saturating_add(len) > bytes_max {
            page.done = false;
            break;
        }
        bytes = bytes.saturating_add(len);
        page.last = Some((stream.clone(), source.clone()));
        page.marks.set(stream, source, seqs);
    }
    page
}

/// Storage as seen by the sans-IO replication core. Implementations must be durable: when a
/// mutating call returns `Ok`, its effect survives a crash (or the node refuses to start).
pub trait StateStore {
    /// Storage failure. After any error the caller must stop using the store for writes.
    type Error: std::error::Error + Send + Sync + 'static;

    /// This replica's id (the log's identity: a wiped store gets a new one).
    fn replica_id(&self) -> ReplicaId;

    /// The causal context of everything durably stored here.
    fn context(&self) -> &CausalContext;

    /// The context a state transfer starts from: it must cover every dot the transfer's chunks
    /// will carry, so a store that serves only durable state makes everything durable first
    /// (the chunks read right after it see the same state).
    ///
    /// # Errors
    /// Storage failures.
    fn transfer_context(&mut self) -> Result<CausalContext, Self::Error> {
        Ok(self.context().clone())
    }

    /// Every ingest dedup mark stored here (sent with the final chunk of a state transfer, so a
    /// peer seeded by transfer also refuses retried events).
    ///
    /// # Errors
    /// Storage failures.
    fn dedup_marks(&mut self) -> Result<DedupMarks, Self::Error>;

    /// The retained log as `[start, end)`: `end` is the next sequence number to be written.
    fn log_bounds(&self) -> (u64, u64);

    /// Joins log entries from `from` onward into one delta, skipping entries whose origin is
    /// `exclude` (BP), and stopping once the joined entries reach `bytes_max` encoded bytes
    /// (at least one entry is taken, so progress is always made).
    ///
    /// # Errors
    /// Storage failures; asking below the retained start or beyond the end is an error of the
    /// implementation's choosing (callers check [`StateStore::log_bounds`] first).
    fn log_interval(
        &mut self,
        from: u64,
        exclude: Option<PeerId>,
        bytes_max: usize,
    ) -> Result<LogInterval, Self::Error>;

    /// Durably joins a remote delta from `origin` with redundancy removal: only the inflating
    /// part is stored and logged (tagged with `origin`). `cursor` is `(origin's log id, end)`:
    /// how far into the origin's log this delta brings us, recorded in the same transaction.
    /// For the log id already recorded the cursor never moves back (the larger seq is kept; a
    /// duplicate interval may end below it); another log id (the peer was wiped) replaces it.
    /// An empty delta still records its cursor (pitfall "empty delta advances",
    /// docs/design/principles.md).
    ///
    /// Returns `Ok(Err(reason))` for an invalid delta: nothing was applied, the store stays usable.
    ///
    /// # Errors
    /// Storage failures.
    fn apply_remote(
        &mut self,
        origin: PeerId,
        delta: Delta,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, Self::Error>;

    /// The durable cursor into `peer`'s log: `(peer's log id, first seq not yet joined)`.
    /// With no cursor recorded for `peer`, a store restored from a snapshot returns its seed
    /// cursor into its source's log: callers must compare the log id with the peer's.
    fn peer_cursor(&self, peer: PeerId) -> Option<(ReplicaId, u64)>;

    /// Reads the entries of keys after `after`, up to about `bytes_max` encoded bytes (at least
    /// one key when any remains).
    ///
    /// # Errors
    /// Storage failures.
    fn read_chunk(
        &mut self,
        after: Option<&Key>,
        bytes_max: usize,
    ) -> Result<ChunkRead, Self::Error>;

    /// Pins a read snapshot of the rows and dedup marks as they are now (the state
    /// [`StateStore::transfer_context`] just described) for a state transfer to `peer`,
    /// replacing any snapshot pinned for `peer` before. Reads `at = Some(peer)` see exactly
    /// that state, whatever is committed after it, until it is released: a transfer reads its
    /// chunks one at a time, as they are sent, instead of all at its start.
    ///
    /// # Errors
    /// Storage failures.
    fn pin_transfer_snapshot(&mut self, peer: PeerId) -> Result<(), Self::Error>;

    /// True while a transfer snapshot is pinned for `peer` (the store may drop snapshots on its
    /// own, e.g. for a check that needs exclusive access: the transfer then starts over).
    fn has_transfer_snapshot(&self, peer: PeerId) -> bool;

    /// Releases the transfer snapshot of every peer for which `keep` is false (a snapshot holds
    /// the store's pages of that moment until it is released).
    fn release_transfer_snapshots(&mut self, keep: &dyn Fn(PeerId) -> bool);

    /// Reads the next chunk of a transfer: as [`StateStore::read_chunk`] when `resume` is
    /// `None`; a row too large for `bytes_max` is returned in parts ([`ChunkRead::part`]), and
    /// `resume = (key, last dot sent)` continues such a row. Every part's slice starts where the
    /// previous one ended, and the last is open, so the parts cover all of dot space for the
    /// key even if the row changed or vanished in between. (Required, not defaulted: a wrapper
    /// that dropped `resume` would restart the row forever.) `at = Some(peer)` reads the
    /// snapshot pinned for `peer` ([`StateStore::pin_transfer_snapshot`]); `None`, the state
    /// as it is now.
    ///
    /// # Errors
    /// Storage failures; `at` names a peer with no pinned snapshot.
    fn read_chunk_from(
        &mut self,
        at: Option<PeerId>,
        after: Option<&Key>,
        resume: Option<&(Key, tidemark_crdts::Dot)>,
        bytes_max: usize,
    ) -> Result<ChunkRead, Self::Error>;

    /// A page of dedup marks after `after`, of about `bytes_max` encoded bytes (at least one
    /// source when any remains); pages follow the implementation's own order of sources and
    /// resume after the last source returned. `at` as for [`StateStore::read_chunk_from`].
    ///
    /// # Errors
    /// Storage failures; `at` names a peer with no pinned snapshot.
    fn read_marks(
        &mut self,
        at: Option<PeerId>,
        after: Option<&(String, String)>,
        bytes_max: usize,
    ) -> Result<MarksRead, Self::Error>;

    /// Durably applies one chunk of a state transfer from `origin` (range-scoped join; the
    /// final chunk also joins the transfer's context and marks and records `cursor`). A completed
    /// transfer is authoritative: its cursor *replaces* the recorded one, even a larger one for
    /// the same log (this repairs a cursor that was ever pushed beyond the sender's log). The
    /// inflating part is logged tagged with `origin`, like a delta's, so what a transfer brought
    /// is forwarded to other peers.
    ///
    /// Returns `Ok(Err(reason))` for an invalid chunk: nothing was applied.
    ///
    /// # Errors
    /// Storage failures.
    fn apply_chunk(
        &mut self,
        origin: PeerId,
        chunk: StateChunk,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, Self::Error>;

    /// Stages chunk `index` (not the last) of the incoming transfer `transfer` from `origin`:
    /// checked (the parts of large rows follow each other without overlap or gap, every chunk
    /// carries the first chunk's context) and kept aside, unapplied and invisible to readers,
    /// until [`StateStore::apply_staged`]. Index 0 starts a new staging (dropping whatever was
    /// staged before, of any transfer); any other index must follow the chunks staged for the
    /// same transfer. The staged chunks need not survive a crash (the transfer restarts), and
    /// the durable store keeps them on disk, not in memory.
    ///
    /// Returns `Ok(Err(reason))` for a chunk that cannot be staged: the staging is dropped,
    /// and the transfer must be rejected.
    ///
    /// # Errors
    /// Storage failures.
    fn stage_chunk(
        &mut self,
        origin: PeerId,
        transfer: TransferId,
        index: u32,
        chunk: StateChunk,
    ) -> Result<Result<(), Rejected>, Self::Error>;

    /// Applies the chunks staged for `transfer` and its last chunk `last` (number `index`) as
    /// ONE durable join, exactly as [`StateStore::apply_chunk`] would apply the merged
    /// transfer (the whole key range joined under the transfer's context, the parts of each
    /// large row joined back into one entry, every page of marks, the context, `cursor`), then
    /// drops the staging. Nothing of the transfer is visible, logged or applied before this
    /// call commits, and all of it is once it returns `Ok(Ok(_))`.
    ///
    /// Returns `Ok(Err(reason))` for an invalid transfer (or staged chunks that do not run up
    /// to `index`): nothing was applied, the staging is dropped.
    ///
    /// # Errors
    /// Storage failures.
    fn apply_staged(
        &mut self,
        origin: PeerId,
        transfer: TransferId,
        index: u32,
        last: StateChunk,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, Self::Error>;

    /// Drops every staged chunk (of any transfer); nothing of them is applied.
    ///
    /// # Errors
    /// Storage failures.
    fn clear_staged(&mut self) -> Result<(), Self::Error>;

    /// Drops log entries below `below` (the stable frontier); returns the bytes reclaimed.
    ///
    /// # Errors
    /// Storage failures.
    fn truncate_log(&mut self, below: u64) -> Result<u64, Self::Error>;
}
