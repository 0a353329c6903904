//! Stream views (docs/design/principles.md, "Stream views"): events of a named stream folded into
//! materialized, replicated views — grouped, optionally windowed by event time — with per-stream
//! watermarks, allowed lateness, and windows that are reported `final` only when their value
//! can no longer change.
//!
//! How it fits the store: every view cell is an ordinary CRDT key (see [`keys`]), so views
//! replicate, converge and persist like all other state. An event's view mutations are added
//! to the event's own commit-group write, so they commit in the same durable transaction as
//! its dedup mark: a retried event changes no view twice and a crash never leaves a view
//! half-updated. Each node announces its per-stream watermark as a replicated LWW key written
//! in the same transaction as the events that moved it.
//!
//! **Finality.** Write `deadline(w) = end(w) + lateness`. A node applies an event to `w` only
//! while its in-memory watermark `≤ deadline(w)`; the in-memory watermark is monotone and never
//! below the watermark it announced (it is restored from the announcement at open). A node `Y`
//! reports `w` final when, for every member `X` — every replica whose dots are in `Y`'s context,
//! every peer connected since open, every replica that announced (each must have announced) —
//! `wm_X > deadline(w)`, and `Y`'s context holds every dot of `X` up to the dot of `X`'s
//! announcement. Then every event `X` ever applies
//! to `w` was applied before the announcement (it is in `Y`'s state already) — after it, `X`
//! refuses such events as late. So no node can change a final window's value afterwards.
//! Announcements carry a digest of the announcer's view definitions of the stream; while any
//! member's digest differs from ours, nothing is final and the page names the conflicting
//! replicas (their states still merge: the definitions must be made equal).
//! That makes a window's contributions complete; *which* members count is then agreed by seals
//! ([`seal`]): each node announces the member set it vouched over per deadline (fixed once
//! announced), a window is final once every member of one set announced exactly that set for
//! its deadline and the seal is committed, and its value counts exactly those members'
//! contributions — so a node that joins later, a restored copy or an idle member changes no
//! final window and takes none back. A node started alone finalizes by its own watermark (so
//! two nodes started alone and connected later can disagree: start new nodes joining); a
//! joining node ([`Views::joining`]) seals nothing alone. Limits: ARCHITECTURE.md, "Seals". A member that ingests
//! nothing holds the stream's windows open unless the stream has an `idle_timeout`: then,
//! after that long without events, the node advances its watermark to `now − idle_timeout`
//! and announces it — the same promise as any announcement (events for windows whose deadline
//! is below it are refused as late), so the argument above is unchanged.
//!
//! **Event times** are refused more than the stream's `max_future` (default 1 h) ahead of the
//! node's clock, so the local watermark never passes the clock plus `max_future`; announced
//! watermarks and horizons of others are taken at most at that bound. A node with no
//! announcement of its own (restored under a new replica id, re-identified) starts from the
//! largest watermark and horizon its state holds ([`Views::restore`]).
//!
//! **Retention** ([`maintain`]): a window of a view with `retention` is removed once
//! `end + retention < H`, where `H` is the stream's *horizon*: the largest cluster watermark
//! any node vouched for (see above), announced in the watermark keys and adopted by every node
//! up to its own watermark (a horizon vouched over a membership without this node must not
//! remove a window it holds open) — monotone and replicated.
//! A node raises the horizon it acts on only after an announcement carrying it is committed in
//! its own state (so its log holds the announcement before anything it drops for it), then
//! refuses local events for removed windows (late), drops remote entries for them on receipt
//! and purges their rows; the context keeps their dots, which to the join is a removal, so
//! nothing resurrects. `retention ≥ lateness` is enforced: only final windows are removed.
//!
//! **Session windows** ([`session`]): a session view is stored as tumbling windows of 1 ms —
//! one cell per group and event time, keyed group first — so every rule above applies per
//! cell; sessions are computed from the cells when read, and a session is final once the cells
//! within its gap on both sides are sealed.

mod audit;
pub mod coalesce;
pub mod def;
pub mod final_feed;
pub mod fold;
mod held;
pub mod keys;
pub mod late;
pub mod maintain;
mod queued;
pub mod read;
pub mod seal;
#[cfg(test)]
mod seal_review_tests;
pub mod session;

/// The one event type of every ingest path (also at the crate root).
pub use crate::ops::Event;
pub use def::{CompiledView, FieldEquals, Hopping, ViewDef, ViewKind, Window, WindowDef};
pub use final_feed::{FinalCursor, FinalCursorError, FinalPage, FinalWindow};
pub use fold::{FoldedBatch, FoldedEvent, ViewOp};
pub use late::{LateEvent, LateEvents};
pub use read::{ViewCounters, ViewPage, ViewQuery, ViewRow, ViewSummary};

use crate::error::Error;
use crate::limits::Limits;
use crate::store::LocalWrite;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tidemark_crdts::{Key, Mutation, ReplicaId};

/// Per-view counters since the node opened.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) folded: AtomicU64,
    pub(crate) late: AtomicU64,
    pub(crate) rejected: AtomicU64,
    /// Remote entries of removed (expired) windows dropped on receipt.
    pub(crate) expired_dropped: AtomicU64,
    /// Remote cells of another definition of this view name (kept apart, never read).
    pub(crate) foreign_cells: AtomicU64,
}

/// What this node has decided and announced for one stream. Guarded by
/// [`Views::watermarks`].
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StreamMarks {
    /// This node's local watermark (monotone).
    pub(crate) wm: Option<u64>,
    /// The last horizon this node queued in an announcement (monotone).
    pub(crate) horizon: Option<u64>,
    /// When the stream last ingested an event here (or the node opened).
    pub(crate) active: Option<Instant>,
    /// When the watermark was last advanced for idleness.
    pub(crate) idle_advanced: Option<Instant>,
}

/// The node's views: definitions, per-stream watermarks, horizons, counters.
#[derive(Debug)]
pub struct Views {
    views: Vec<CompiledView>,
    /// Stream → indexes of its views.
    by_stream: BTreeMap<String, Vec<usize>>,
    /// Stream → allowed out-of-orderness (largest of its views').
    ooo: BTreeMap<String, u64>,
    /// Stream → idle timeout (smallest of its views'), for streams that have one.
    idle: BTreeMap<String, u64>,
    /// Stream → how far ahead of the clock event times may be (smallest of its views').
    max_future: BTreeMap<String, u64>,
    /// Stream → digest of its view definitions (announced with the watermark).
    pub(crate) digests: BTreeMap<String, String>,
    /// Stream → this node's marks. Locked from the lateness decision of an ingest until its
    /// writes are queued, so writes reach the writer in watermark order.
    pub(crate) watermarks: Mutex<BTreeMap<String, StreamMarks>>,
    /// Stream → the horizon this node acts on (refuses, drops on receipt, purges): raised
    /// under the watermark lock, only once an announcement carrying it is committed here.
    pub(crate) horizons: Mutex<BTreeMap<String, u64>>,
    /// Stream → the largest horizon reads have hidden windows by (monotone, so a window
    /// hidden once is never shown again).
    pub(crate) read_horizons: Mutex<BTreeMap<String, u64>>,
    pub(crate) counters: Vec<Counters>,
    /// Peers connected at some time since open: members for finality even while away.
    pub(crate) met: Mutex<BTreeSet<crate::proto::PeerId>>,
    /// `(view, digest)` pairs of other definitions already logged.
    warned: Mutex<BTreeSet<(String, String)>>,
    /// `(stream, source)` → events of ingest batches begun and not yet committed.
    inflight: Mutex<BTreeMap<(String, String), usize>>,
    /// `(stream, source)` → the seqs of each queued batch (admitted, not yet committed), one
    /// sorted run per batch ([`queued`]): an event whose `(source, seq)` an earlier queued
    /// batch carries may turn out a duplicate when it commits.
    queued: Mutex<queued::Queued>,
    /// Serializes maintenance rounds (a horizon is acted on only after its own announcement
    /// committed, which a concurrent round could otherwise skip).
    pub(crate) maintenance: tokio::sync::Mutex<()>,
    /// Stream → this node's membership epochs and seals as last queued in an announcement
    /// (`seal.rs`). Locked after [`Views::watermarks`], never before.
    pub(crate) seals: Mutex<BTreeMap<String, StreamSeals>>,
    /// The node joins an existing cluster ([`crate::NodeConfig::joining`]): it vouches for no
    /// stream alone, and applies no event to a window before it synced the stream.
    joining: bool,
    /// The node's store was restored from a snapshot of a cluster member
    /// (`RedbStore::restored_joining`) and it still joins its cluster: node-level, it ends
    /// ([`Views::settle_restored`], [`Views::first_sync`]) once the copy synced with a live
    /// peer of its cluster, or once every other member it knows of was removed for good.
    restored_joining: std::sync::atomic::AtomicBool,
    /// The context of the snapshot a restored copy opened with (`RedbStore::restored_context`).
    restored_snapshot: Option<tidemark_crdts::CausalContext>,
    /// The replica the snapshot a restored copy opened with was taken of (its seed cursor):
    /// a known member of the copy's cluster even when the snapshot holds no write of it.
    restored_source: Option<ReplicaId>,
    /// Streams this (joining) node has synced: its state holds another node's announcement.
    synced: Mutex<BTreeSet<String>>,
    /// This node was decommissioned (a `~gone/` record names it): it applies no event to a
    /// window any more (late, `decommissioned`), since no seal counts it.
    pub(crate) removed: std::sync::atomic::AtomicBool,
    /// Streams a joining node restored (from a snapshot, under a new id) must sync afresh:
    /// stream → the context at open. Its state holds its source's announcements, which say
    /// nothing of what the cluster sealed since; it applies nothing to windows until an
    /// announcement of another node arrives that this context did not hold.
    fresh_from: Mutex<BTreeMap<String, tidemark_crdts::CausalContext>>,
    /// View index → where the purge scan of a session view resumes (a cell name; `None`: from
    /// the start) and the horizon its last complete pass ran under ([`session`]).
    pub(crate) session_purge: Mutex<BTreeMap<usize, session::PurgeScan>>,
    /// What the audit of sealed windows (contributions a seal leaves out, into the late lane)
    /// remembers between rounds ([`audit`]).
    audit: Mutex<audit::AuditState>,
    /// Serializes audit rounds (outside the maintenance lock).
    pub(crate) auditing: tokio::sync::Mutex<()>,
    /// View index → the end of the deadlines its stream's committed seals covered at the last
    /// audit round: remote changes to cells at or above it are left to the scan.
    audit_tops: Vec<std::sync::atomic::AtomicU64>,
    /// The elements this node's `distinct` cells are known to hold under its own dot
    /// ([`held`]): adds of them are skipped without reading their rows.
    held: held::Held,
}

/// This node's epochs and seals of one stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamSeals {
    pub(crate) epochs: Vec<seal::Epoch>,
    pub(crate) sealed: Vec<seal::Sealed>,
    /// This node's watermark when it first applied an event to a window of the stream
    /// (see [`seal::Ledger::since`]).
    pub(crate) since: u64,
    /// Whether it has applied any (until then it applied nothing below its watermark).
    pub(crate) applied: bool,
    /// Deadlines below this have a membership, announced by some other node, that does not
    /// count this one ([`seal::excluded_to`]): events for them are late here (`outside_seal`).
    /// Recomputed each seal step, never lowered.
    pub(crate) excluded_to: u64,
}

/// A batch in flight: its `(stream, source)` pairs with its events per pair, and once
/// admitted, its queued `(stream, source)` / seq pairs ([`Views::end_batch`] forgets both).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    begun: Vec<((String, String), usize)>,
    /// Per `(stream, source)` pair: the id of its run of seqs registered as queued.
    queued: Vec<((String, String), u64)>,
}

/// A batch for [`Views::admit`]: the stream, the folded view ops of each event and the
/// events themselves (for the late-lane record), in the order of the writes.
pub(crate) struct AdmitBatch<'a> {
    /// The stream the batch was ingested into.
    pub(crate) stream: &'a str,
    /// The view cells and the view ops of each event ([`Views::fold`]).
    pub(crate) folded: FoldedBatch,
    /// The events, one per write.
    pub(crate) events: &'a [Event],
    /// Per event: a duplicate already ([`BatchStart::known_dup`]).
    pub(crate) known_dup: &'a [bool],
    /// Per event: refused for dedup gaps by the committed marks ([`BatchStart::gap_refused`]).
    pub(crate) gap_refused: &'a [bool],
    /// The batch's registration: its events are registered as queued here.
    pub(crate) inflight: &'a mut InFlight,
    /// A joining node that has not synced the stream yet ([`Views::first_sync`]): every
    /// windowed op is late (`not_synced`) and the watermark does not move.
    pub(crate) unsynced: bool,
    /// The committed state (a `members` remove is checked against the replicas whose dots
    /// it would take, [`seal::counts_me`]).
    pub(crate) reader: &'a crate::store::Reader,
    /// A replica's peer id (how announcements name the peers they met).
    pub(crate) peer_of: fn(ReplicaId) -> crate::proto::PeerId,
}

/// For a batch's `members` removes: every other replica in this node's context, with what its
/// announcement of the stream says (`None`: it has none, or a malformed one).
type Owners = Vec<(ReplicaId, Option<(Vec<seal::Epoch>, Vec<u64>)>)>;

/// The moment a stream's sync is decided at ([`Views::first_sync`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncNow {
    /// The node's clock (ms).
    pub(crate) now_ms: u64,
    /// The node holds what each peer it is linked to held when they met, and is linked to
    /// one at least (asked of the writer only while [`Views::awaits_sync`]).
    pub(crate) peers_covered: bool,
}

/// What [`Views::begin_batch`] found for a batch.
#[derive(Debug)]
pub(crate) struct BatchStart {
    /// The batch's view mutations may be coalesced into one per cell.
    pub(crate) coalesce: bool,
    /// The batch's registration, for [`Views::end_batch`].
    pub(crate) inflight: InFlight,
    /// Per event: a duplicate already (its mark is committed, or an earlier event of the
    /// batch has its `(source, seq)`). Such an event changes nothing: no view mutation, no
    /// late note, no watermark move.
    pub(crate) known_dup: Vec<bool>,
    /// Per event: refused for dedup gaps by the committed marks (the store's rule replayed):
    /// its time moves no watermark.
    pub(crate) gap_refused: Vec<bool>,
}

/// What [`Views::admit`] decided for a batch.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    /// Per event write: the views for which it was late (some window refused).
    pub(crate) late: Vec<Vec<usize>>,
    /// The views each event write was applied to, event after event (one list for the
    /// batch): event `i`'s are `applied[applied_ends[i - 1]..applied_ends[i]]`.
    pub(crate) applied: Vec<usize>,
    /// Per event write: the end of its views in `applied`.
    pub(crate) applied_ends: Vec<usize>,
    /// The stream's new watermark, when the batch moved it (its announcement is the last
    /// write of the batch).
    pub(crate) new_wm: Option<u64>,
    /// When the batch's view mutations were coalesced into one write: what the writer uses
    /// instead if some event of the batch turns out a duplicate or is refused at commit.
    pub(crate) fallback: Option<crate::store::BatchFallback>,
    /// The adds of elements to `distinct` cells the batch's coalesced write makes: held under
    /// this node's dot once the batch commits with every event applied
    /// ([`Views::committed`]).
    pub(crate) held: Option<HeldAdds>,
}

/// Adds to `distinct` cells a queued batch makes, with the mark taken before it was queued.
#[derive(Debug)]
pub(crate) struct HeldAdds {
    mark: held::Mark,
    adds: Vec<(Key, String)>,
}

impl Views {
    /// Validates `defs`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the view and the field.
    pub fn new(defs: &[ViewDef]) -> Result<Self, Error> {
        let views = def::compile(defs).map_err(Error::Config)?;
        let mut by_stream: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut ooo: BTreeMap<String, u64> = BTreeMap::new();
        let mut idle: BTreeMap<String, u64> = BTreeMap::new();
        let mut max_future: BTreeMap<String, u64> = BTreeMap::new();
        for (i, v) in views.iter().enumerate() {
            let e = max_future
                .entry(v.def.stream.clone())
                .or_insert(v.max_future_ms);
            *e = (*e).min(v.max_future_ms);
            by_stream.entry(v.def.stream.clone()).or_default().push(i);
            let o = v.window.map_or(0, |w| w.out_of_orderness_ms);
            let e = ooo.entry(v.def.stream.clone()).or_default();
            *e = (*e).max(o);
            if let Some(t) = v.window.and_then(|w| w.idle_timeout_ms) {
                let e = idle.entry(v.def.stream.clone()).or_insert(t);
                *e = (*e).min(t);
            }
        }
        let counters = views.iter().map(|_| Counters::default()).collect();
        let audit_tops = views
            .iter()
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        let digests = by_stream
            .iter()
            .map(|(stream, idx)| {
                let defs: Vec<&ViewDef> = idx.iter().map(|&i| &views[i].def).collect();
                (stream.clone(), keys::defs_digest(&defs))
            })
            .collect();
        Ok(Self {
            views,
            by_stream,
            ooo,
            idle,
            max_future,
            digests,
            watermarks: Mutex::new(BTreeMap::new()),
            horizons: Mutex::new(BTreeMap::new()),
            read_horizons: Mutex::new(BTreeMap::new()),
            counters,
            met: Mutex::new(BTreeSet::new()),
            warned: Mutex::new(BTreeSet::new()),
            inflight: Mutex::new(BTreeMap::new()),
            queued: Mutex::new(queued::Queued::default()),
            maintenance: tokio::sync::Mutex::new(()),
            seals: Mutex::new(BTreeMap::new()),
            joining: false,
            restored_joining: std::sync::atomic::AtomicBool::new(false),
            restored_snapshot: None,
            restored_source: None,
            synced: Mutex::new(BTreeSet::new()),
            removed: std::sync::atomic::AtomicBool::new(false),
            fresh_from: Mutex::new(BTreeMap::new()),
            session_purge: Mutex::new(BTreeMap::new()),
            audit: Mutex::new(audit::AuditState::default()),
            auditing: tokio::sync::Mutex::new(()),
            audit_tops,
            held: held::Held::new(Limits::default().view_held_bytes),
        })
    }

    /// The same views with at most `bytes` for the record of elements held by `distinct`
    /// cells (`limits.view_held_bytes`; 0: none, every add of an element reads its row).
    #[must_use]
    pub fn held_bytes(mut self, bytes: usize) -> Self {
        self.held = held::Held::new(bytes);
        self
    }

    /// The same views on a node that joins an existing cluster: until its state holds another
    /// node's announcement of a stream it vouches for no cluster watermark of it (so it seals
    /// and removes nothing alone) and refuses the stream's windowed events as late
    /// (`not_synced`, kept in the late lane); then it starts from the largest watermark it
    /// holds, as a restored node does.
    #[must_use]
    pub fn joining(mut self, joining: bool) -> Self {
        self.joining = joining;
        self
    }

    /// A node on a store restored from a snapshot of a cluster member: it joins that cluster
    /// (as [`Views::joining`]) until it syncs with a live peer of it or every other member it
    /// knows of is removed for good ([`Views::settle_restored`]).
    #[must_use]
    /// `snapshot`: the snapshot's context (what the copy opened with); `source`: the replica
    /// the snapshot was taken of.
    pub fn restored_joining(
        mut self,
        restored_joining: bool,
        snapshot: Option<tidemark_crdts::CausalContext>,
        source: Option<ReplicaId>,
    ) -> Self {
        self.restored_joining
            .store(restored_joining, std::sync::atomic::Ordering::SeqCst);
        self.restored_snapshot = snapshot;
        self.restored_source = source;
        self
    }

    /// True for a node that joins an existing cluster (see [`Views::joining`]), or a restored
    /// copy that still joins its cluster ([`Views::restored_joining`]).
    pub fn is_joining(&self) -> bool {
        self.joining || self.waits_as_copy()
    }

    /// True for a restored copy that still joins its cluster (it has neither synced with a
    /// live peer of it nor removed every other member it knows of).
    pub fn waits_as_copy(&self) -> bool {
        self.restored_joining
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Ends a restored copy's joining state when its committed state says it is over
    /// ([`read::restored_settled`]): an announcement newer than the snapshot by a live replica
    /// that was a known member of its cluster when the snapshot was taken (it synced with its
    /// cluster; a node that never was a member, such as a fresh node or another copy of the
    /// snapshot, ends nothing), or every other member it knows of removed for good (it is the
    /// whole cluster). Both are durable in the commit that brought them (a replicated
    /// announcement, a `~gone/` record), so a restart re-derives the same answer. A copy whose
    /// snapshot names no member but its source ends it as a `--join` node does, once it holds
    /// what its linked peers held (`peers_covered`; in memory, so again after a restart).
    /// Returns whether the copy still joins.
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn settle_restored(
        &self,
        reader: &crate::store::Reader,
        me: ReplicaId,
        peers_covered: bool,
        peer_of: fn(ReplicaId) -> crate::proto::PeerId,
    ) -> Result<bool, Error> {
        if !self.waits_as_copy() {
            return Ok(false);
        }
        if read::restored_settled(
            reader,
            me,
            self.restored_snapshot.as_ref(),
            self.restored_source,
            peers_covered,
            peer_of,
        )? {
            self.end_restored_joining();
            return Ok(false);
        }
        Ok(true)
    }

    /// Ends the restored copy's joining state (see [`Views::settle_restored`]).
    fn end_restored_joining(&self) {
        if self
            .restored_joining
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            tracing::info!(
                "restored copy: no longer joining its cluster (synced with a live member, or \
                 every other member it knew of was removed); it runs as a member"
            );
        }
    }

    /// True when a copy of this node must join its cluster rather than start alone: the node
    /// joins one ([`Views::joining`]), or it has met a peer (since open, or in an earlier run
    /// as its announcements record). Such a cluster may seal windows without the copy, so the
    /// copy must not vouch for them alone. False only for a node that never met anyone.
    pub(crate) fn copies_join(&self) -> bool {
        self.is_joining() || self.met.lock().map_or(true, |m| !m.is_empty())
    }

    /// Streams with a windowed view (the ones seals and finality are about).
    pub(crate) fn windowed_streams(&self) -> Vec<String> {
        self.by_stream
            .iter()
            .filter(|(_, idx)| idx.iter().any(|&i| self.views[i].window.is_some()))
            .map(|(s, _)| s.clone())
            .collect()
    }

    /// The compiled views.
    pub fn list(&self) -> &[CompiledView] {
        &self.views
    }

    /// The view named `name` and its index.
    pub fn find(&self, name: &str) -> Option<(usize, &CompiledView)> {
        self.views
            .iter()
            .enumerate()
            .find(|(_, v)| v.def.name == name)
    }

    /// True when `stream` feeds some view.
    pub fn has_stream(&self, stream: &str) -> bool {
        self.by_stream.contains_key(stream)
    }

    /// Streams that feed views.
    pub fn streams(&self) -> impl Iterator<Item = &String> {
        self.by_stream.keys()
    }

    /// True when some view needs the periodic maintenance of [`maintain`] (a windowed view:
    /// seals, retention, idle timeouts).
    pub fn needs_maintenance(&self) -> bool {
        !self.idle.is_empty() || self.views.iter().any(|v| v.window.is_some())
    }

    /// True when the window of view `vi` starting at `start` is removed under `horizon`
    /// (`end + retention < horizon`). The same rule on every node. Always false for a cell of
    /// a session view: sessions are removed whole, once final ([`session`]), never by cell.
    pub fn expired(&self, vi: usize, start: u64, horizon: u64) -> bool {
        let Some(w) = self.views.get(vi).and_then(|v| v.window) else {
            return false;
        };
        if w.session_gap_ms.is_some() {
            return false;
        }
        w.retention_ms
            .is_some_and(|r| start.saturating_add(w.size_ms).saturating_add(r) < horizon)
    }

    /// How far ahead of the clock event times of `stream` may be (ms).
    pub(crate) fn max_future(&self, stream: &str) -> u64 {
        self.max_future
            .get(stream)
            .copied()
            .unwrap_or(def::MAX_FUTURE_DEFAULT_MS)
    }

    /// The latest time a watermark or horizon of `stream` is taken at, at clock `now_ms`:
    /// the clock plus the stream's `max_future`.
    pub(crate) fn time_bound(&self, stream: &str, now_ms: u64) -> u64 {
        now_ms.saturating_add(self.max_future(stream))
    }

    /// The horizon this node acts on for `stream`.
    pub(crate) fn horizon(&self, stream: &str) -> Option<u64> {
        self.horizons.lock().ok()?.get(stream).copied()
    }

    /// Restores this node's watermarks and horizons from its announcements (at open). A node
    /// without an announcement of its own for a stream whose state holds announcements of
    /// others — restored from a snapshot under a new replica id, re-identified, or synced
    /// before it ever ingested — starts from the largest watermark and horizon among them
    /// (at most the clock plus the stream's `max_future`), so it keeps every promise of the
    /// node its state came from: events for windows that node reported final are late here
    /// too, and windows it removed stay removed. Returns the announcements to write at once
    /// for such streams (so peers count this node as past those windows as well).
    ///
    /// A node joining a cluster, or one whose store was restored from a snapshot (`restored`,
    /// whether it joins or starts alone), counts as synced with such a stream only once it
    /// holds an announcement newer than those its state opened with: a snapshot's marks are
    /// as old as the snapshot, and its source's cluster may have sealed windows since; a copy
    /// restarted before it heard such an announcement (`restored_from`: the snapshot's
    /// context) waits again, although its state now holds an announcement of its own. A
    /// snapshot with no announcement of a stream gives nothing to wait for here: a copy of a
    /// cluster member (a joining node that had not synced, a node that met peers but announced
    /// nothing) is kept from sealing alone by joining itself (the node opens it joining,
    /// `RedbStore::restored_joining`), not by this wait.
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn restore(
        &self,
        reader: &crate::store::Reader,
        me: ReplicaId,
        now_ms: u64,
        restored: bool,
        restored_from: Option<&tidemark_crdts::CausalContext>,
    ) -> Result<Vec<LocalWrite>, Error> {
        let mut wms = self.watermarks.lock().map_err(|_| Error::Closed)?;
        let mut hs = self.horizons.lock().map_err(|_| Error::Closed)?;
        let now = Instant::now();
        let mut announce = Vec::new();
        let ctx = reader.context()?;
        for stream in self.by_stream.keys() {
            // Deadlines another node's membership fixed without this one stay late across a
            // restart (not only from the first seal step on).
            let excluded = seal::excluded_to(&read::ledger(reader, stream, me)?.epochs, me);
            if let Ok(mut seals) = self.seals.lock() {
                let e = &mut seals.entry(stream.clone()).or_default().excluded_to;
                *e = (*e).max(excluded);
            }
            let own = read::announcement_of(reader, &keys::wm_key(stream, me))?;
            let m = wms.entry(stream.clone()).or_default();
            m.active = Some(now);
            if let Some(a) = &own
                && let Ok(mut met) = self.met.lock()
            {
                met.extend(a.met.iter().map(|&p| crate::proto::PeerId(p)));
            }
            // An announcement written only to keep the peers met (`Views::seal_stage` before
            // any watermark: 0, nothing applied, no epoch, seal or horizon) is no watermark.
            let own = own.filter(|a| {
                a.wm > 0
                    || a.applied
                    || a.horizon.is_some()
                    || !a.sealed.is_empty()
                    || a.epochs.as_ref().is_none_or(|e| !e.is_empty())
            });
            let (wm, horizon) = match own {
                Some(a) => {
                    // A restored copy wrote an announcement at its first open (the snapshot's
                    // marks, below): restarted before it heard from its cluster, it still
                    // waits for an announcement the snapshot did not hold.
                    // Still joining (`Views::settle_restored` ran before), it waits whatever
                    // it heard: a fresh announcement by a node that never was a member of its
                    // cluster ended nothing.
                    if let Some(snap) = restored_from
                        && (self.waits_as_copy()
                            || read::fresh_announcement(reader, stream, me, snap)?
                                == read::Fresh::Stale)
                        && let Ok(mut f) = self.fresh_from.lock()
                    {
                        f.insert(stream.clone(), snap.clone());
                    }
                    if let Ok(mut seals) = self.seals.lock() {
                        seals.insert(
                            stream.clone(),
                            StreamSeals {
                                epochs: a.epochs.clone().unwrap_or_default(),
                                sealed: a.sealed.clone(),
                                since: a.since,
                                applied: a.applied,
                                excluded_to: excluded,
                            },
                        );
                    }
                    (Some(a.wm), a.horizon)
                }
                None => {
                    let (wm, h, others) = read::largest_announced(reader, stream, Some(me))?;
                    if others && (self.is_joining() || restored) {
                        // Restored (or re-identified) into a cluster: sync afresh first, from
                        // an announcement the snapshot did not hold (the state at this open
                        // when the store does not say what the snapshot held).
                        if let Ok(mut f) = self.fresh_from.lock() {
                            f.insert(stream.clone(), restored_from.unwrap_or(&ctx).clone());
                        }
                    }
                    let bound = self.time_bound(stream, now_ms);
                    let wm = wm.map(|w| w.min(bound));
                    let h = read::adopted(h, wm);
                    if wm.is_some() || h.is_some() {
                        announce.push(self.announcement(stream, wm.unwrap_or(0), h, me));
                    }
                    (wm, h)
                }
            };
            m.wm = wm;
            m.horizon = horizon;
            if let Some(h) = horizon {
                hs.insert(stream.clone(), h);
            }
        }
        Ok(announce)
    }

    /// Starts this node's view identity afresh after its store re-identified at run time (a
    /// copy restored under its old id met a peer holding more of that id): the new id has no
    /// epochs or seals of its own, and every windowed stream waits for an announcement that
    /// `ctx` (the state at the switch) does not hold — the copy's marks are the backup's, older
    /// than what its old id announced since — then starts from the largest marks it holds
    /// ([`Views::first_sync`]), so it refuses what its old id refused.
    pub(crate) fn reidentified(&self, ctx: &tidemark_crdts::CausalContext) {
        // What the record says is about the old id's dots.
        self.held.forget_all();
        if let Ok(mut seals) = self.seals.lock() {
            seals.clear();
        }
        if let Ok(mut synced) = self.synced.lock() {
            synced.clear();
        }
        if let Ok(mut fresh) = self.fresh_from.lock() {
            for stream in self.by_stream.keys() {
                fresh.insert(stream.clone(), ctx.clone());
            }
        }
    }

    /// Whether `stream` is synced here, and the announcement to queue when this node just
    /// started from its cluster's marks. A joining node ([`Views::joining`]) is synced once it
    /// holds what every peer it is linked to held when they met (`at.peers_covered`) and, if
    /// its state holds announcements of the stream by other nodes, from them (none: it syncs
    /// with no watermark, as its peers have none); a node with no watermark of its
    /// own yet (it never ingested into the stream) whose state holds such announcements
    /// starts from them too. Starting means: the largest watermark and horizon held (capped
    /// like [`Views::restore`]) become this node's, announced at once — so it refuses events
    /// for windows its cluster passed, adopts the seals below that watermark, and no longer
    /// holds windows open as a silent member. Other nodes are always synced. Call with the
    /// watermark lock held.
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn first_sync(
        &self,
        wms: &mut BTreeMap<String, StreamMarks>,
        stream: &str,
        reader: &crate::store::Reader,
        me: ReplicaId,
        at: SyncNow,
    ) -> Result<(bool, Option<LocalWrite>), Error> {
        let now_ms = at.now_ms;
        let mut synced = self.synced.lock().map_err(|_| Error::Closed)?;
        let has_wm = wms.get(stream).is_some_and(|m| m.wm.is_some());
        let mut fresh = self.fresh_from.lock().map_err(|_| Error::Closed)?;
        // A restored store waits for a fresh announcement even when it does not join (its
        // watermark came from the snapshot, not from the cluster as it is now). A store with
        // a watermark of its own (announced in an earlier run, which a joining node does only
        // once synced) is synced, joining or not: a restarted member that reaches no peer
        // keeps applying by its own watermark.
        // A restored copy that still joins its cluster is never synced by its own watermark
        // (the snapshot's marks), and keeps waiting for a fresh announcement until its joining
        // ends: one by a node that never was a member of its cluster proves nothing.
        let copy_waits = self.waits_as_copy();
        if synced.contains(stream) || (!copy_waits && has_wm && !fresh.contains_key(stream)) {
            return Ok((true, None));
        }
        let mut cluster_gone = false;
        if let Some(seen) = fresh.get(stream) {
            match read::fresh_announcement(reader, stream, me, seen)? {
                read::Fresh::Stale => return Ok((false, None)),
                read::Fresh::OthersGone => cluster_gone = true,
                read::Fresh::Heard | read::Fresh::NoOthers => {}
            }
            if !copy_waits || cluster_gone {
                fresh.remove(stream);
            }
        }
        drop(fresh);
        // A joining node first holds what each peer it is linked to held when they met:
        // every announcement and seal they knew of (a peer's state arriving before another's
        // could otherwise make it adopt one side's seals, or start from a stale watermark).
        // Not a restored copy whose every other announcer was removed for good: there is no
        // cluster left to link to (a cluster rebuilt from a snapshot of a joining node).
        let joining = self.is_joining();
        if joining && !at.peers_covered && !cluster_gone {
            return Ok((false, None));
        }
        // A restored copy still waits, linked peers covered or not: holding what its linked
        // peers held proves nothing when they hold nothing of its cluster the copy lacks (a
        // brand-new node, a `--join` node joining through it, another copy of the same
        // snapshot). Its joining ends node-level only by its committed state
        // ([`Views::settle_restored`], asked before this with the peers covered): an
        // announcement newer than the snapshot by a known member of its cluster, or every
        // other member it knows of removed for good.
        if self.waits_as_copy() && !cluster_gone {
            return Ok((false, None));
        }
        let (wm, h, others) = read::largest_announced(reader, stream, Some(me))?;
        if !others {
            if joining {
                // None of them has announced the stream: none applied an event to its
                // windows, so none sealed one. It starts with no watermark, like its peers
                // (a cluster whose nodes all start with `--join` is live).
                synced.insert(stream.to_owned());
            }
            return Ok((true, None));
        }
        {
            let excluded = seal::excluded_to(&read::ledger(reader, stream, me)?.epochs, me);
            let mut seals = self.seals.lock().map_err(|_| Error::Closed)?;
            let e = &mut seals.entry(stream.to_owned()).or_default().excluded_to;
            *e = (*e).max(excluded);
        }
        synced.insert(stream.to_owned());
        let bound = self.time_bound(stream, now_ms);
        let m = wms.entry(stream.to_owned()).or_default();
        let wm = wm.map(|w| w.min(bound)).max(m.wm);
        let h = read::adopted(h, wm).max(m.horizon);
        if wm == m.wm && h == m.horizon {
            return Ok((true, None));
        }
        m.wm = wm;
        m.horizon = h;
        Ok((
            true,
            Some(self.announcement(stream, wm.unwrap_or(0), h, me)),
        ))
    }

    /// Whether the entry under `key`, arriving from a peer, is joined: `false` for a cell of
    /// a window this node removed (retention), which is dropped on receipt so it never
    /// resurrects. Cells of another definition of a view name are kept (under their own keys,
    /// never read or merged with ours) and logged once per definition.
    pub fn keep_remote(&self, key: &Key) -> bool {
        let Some((name, digest, start)) = keys::cell_of(&key.name) else {
            return true;
        };
        let Some((vi, view)) = self.find(name) else {
            return true;
        };
        if digest != view.digest {
            self.counters[vi]
                .foreign_cells
                .fetch_add(1, Ordering::Relaxed);
            if let Ok(mut w) = self.warned.lock() {
                if w.insert((name.to_owned(), digest.to_owned())) {
                    tracing::warn!(
                        view = name,
                        theirs = digest,
                        ours = %view.digest,
                        "a peer runs another definition of this view: its state is kept apart \
                         and never merged with ours"
                    );
                }
            }
            return true;
        }
        let (Some(start), Some(h)) = (start, self.horizon(&view.def.stream)) else {
            return true;
        };
        if self.expired(vi, start, h) {
            self.counters[vi]
                .expired_dropped
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Folds a validated batch of `stream` into candidate view mutations (nothing decided yet).
    ///
    /// # Errors
    /// The first invalid event, naming its index and field.
    pub(crate) fn fold(
        &self,
        stream: &str,
        events: &[Event],
        now_ms: u64,
        limits: &Limits,
    ) -> Result<FoldedBatch, Error> {
        let Some(idx) = self.by_stream.get(stream) else {
            return Ok(FoldedBatch::default());
        };
        let views: Vec<(usize, &CompiledView)> = idx.iter().map(|&i| (i, &self.views[i])).collect();
        let max_future = self.max_future(stream);
        let mut folder = fold::Folder::new(&views, now_ms, max_future, limits);
        folder.reserve(events.len());
        for (i, ev) in events.iter().enumerate() {
            folder.fold(ev, i)?;
        }
        Ok(folder.finish())
    }

    /// Counts a refused batch of `events` events of `stream` as rejected for every view of
    /// the stream (nothing of it reached any view).
    pub(crate) fn count_rejected(&self, stream: &str, events: usize) {
        for &vi in self.by_stream.get(stream).map_or(&[][..], Vec::as_slice) {
            if let Some(c) = self.counters.get(vi) {
                c.rejected.fetch_add(events as u64, Ordering::Relaxed);
            }
        }
    }

    /// Registers a batch's events as in flight (until [`Views::end_batch`] with the returned
    /// keys), says which events are duplicates already (marked in the committed state, or
    /// repeating an earlier event of the batch) and whether its view mutations may be
    /// coalesced into one per cell: only when no event of the batch can turn out a duplicate
    /// or be refused when it commits — none is repeated in the batch or already marked, no
    /// other batch of its sources is in flight, and none would open a dedup range beyond
    /// `ranges_max` (the store's rule, replayed on the committed marks). Otherwise every event
    /// keeps its own view mutations.
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn begin_batch(
        &self,
        stream: &str,
        events: &[Event],
        reader: &crate::store::Reader,
        ranges_max: usize,
    ) -> Result<BatchStart, Error> {
        // One read transaction for every source's marks.
        let reader = &reader.snapshot()?;
        let mut inflight = self.inflight.lock().map_err(|_| Error::Closed)?;
        let mut per_source: BTreeMap<&str, Vec<(usize, u64)>> = BTreeMap::new();
        for (i, e) in events.iter().enumerate() {
            per_source.entry(&e.source).or_default().push((i, e.seq));
        }
        let mut coalesce = true;
        let mut known_dup = vec![false; events.len()];
        let mut gap_refused = vec![false; events.len()];
        for (source, seqs) in &per_source {
            if inflight.contains_key(&(stream.to_owned(), (*source).to_owned())) {
                coalesce = false;
            }
            let mut seen = reader.dedup_marks_of(stream, source)?;
            for &(i, seq) in seqs {
                let below = seq.checked_sub(1).is_some_and(|s| seen.contains(s));
                let above = seq.checked_add(1).is_some_and(|s| seen.contains(s));
                if seen.contains(seq) {
                    coalesce = false;
                    if let Some(d) = known_dup.get_mut(i) {
                        *d = true;
                    }
                    continue;
                }
                if !below && !above && seen.ranges().len() >= ranges_max {
                    coalesce = false;
                    if let Some(g) = gap_refused.get_mut(i) {
                        *g = true;
                    }
                    continue;
                }
                seen.insert(seq);
            }
        }
        let mut keys = Vec::with_capacity(per_source.len());
        for (source, seqs) in per_source {
            let k = (stream.to_owned(), source.to_owned());
            *inflight.entry(k.clone()).or_default() += seqs.len();
            keys.push((k, seqs.len()));
        }
        Ok(BatchStart {
            coalesce,
            inflight: InFlight {
                begun: keys,
                queued: Vec::new(),
            },
            known_dup,
            gap_refused,
        })
    }

    /// The batch registered as `keys` by [`Views::begin_batch`] is committed (or failed).
    pub(crate) fn end_batch(&self, batch: &InFlight) {
        if let Ok(mut inflight) = self.inflight.lock() {
            for (k, n) in &batch.begun {
                if let Some(c) = inflight.get_mut(k) {
                    *c = c.saturating_sub(*n);
                    if *c == 0 {
                        inflight.remove(k);
                    }
                }
            }
        }
        if let Ok(mut queued) = self.queued.lock() {
            for (k, id) in &batch.queued {
                queued.release(k, *id);
            }
        }
    }

    /// Registers the events of a batch being queued (call under the watermark lock, in queue
    /// order) and says, per event, whether an earlier queued batch carries its
    /// `(source, seq)`: then it may turn out a duplicate at commit.
    fn register_queued(&self, stream: &str, events: &[Event], batch: &mut InFlight) -> Vec<bool> {
        let Ok(mut queued) = self.queued.lock() else {
            return vec![true; events.len()];
        };
        // Per source (one key built per source, not per event), each source's events in
        // batch order: a pair repeated in the batch is seen by its later events.
        let mut by_source: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, e) in events.iter().enumerate() {
            by_source.entry(&e.source).or_default().push(i);
        }
        let mut out = vec![false; events.len()];
        let mut seqs = Vec::new();
        for (source, idx) in by_source {
            let k = (stream.to_owned(), source.to_owned());
            seqs.clear();
            seqs.extend(idx.iter().filter_map(|&i| events.get(i).map(|e| e.seq)));
            let (seen, id) = queued.register(k.clone(), &seqs);
            for (i, s) in idx.into_iter().zip(seen) {
                if let Some(o) = out.get_mut(i) {
                    *o = s;
                }
            }
            batch.queued.push((k, id));
        }
        out
    }

    /// True for a joining node that has not synced `stream` yet ([`Views::first_sync`]
    /// needs [`SyncNow::peers_covered`] then).
    pub(crate) fn awaits_sync(&self, stream: &str) -> bool {
        self.is_joining() && self.synced.lock().map_or(true, |s| !s.contains(stream))
    }

    /// The announcement write of `stream`: watermark `wm`, horizon `horizon`.
    pub(crate) fn announcement(
        &self,
        stream: &str,
        wm: u64,
        horizon: Option<u64>,
        me: ReplicaId,
    ) -> LocalWrite {
        // Every announcement carries this node's epochs and seals: they only grow, and the
        // register keeps the last announcement only.
        let seals = self
            .seals
            .lock()
            .ok()
            .and_then(|s| s.get(stream).cloned())
            .unwrap_or_default();
        // And the peers it ever met: after a restart they still count as members.
        let met: Vec<u64> = self
            .met
            .lock()
            .map(|m| m.iter().map(|p| p.0).collect())
            .unwrap_or_default();
        LocalWrite {
            ops: vec![(
                keys::wm_key(stream, me),
                Mutation::Set(keys::announcement_text(
                    self.digests.get(stream).map_or("", String::as_str),
                    &keys::Marks {
                        met: &met,
                        wm,
                        horizon,
                        epochs: &seals.epochs,
                        sealed: &seals.sealed,
                        since: seals.since,
                        applied: seals.applied,
                    },
                )),
            )],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        }
    }

    /// Decides lateness against the stream's marks (watermark and horizon) and adds the
    /// on-time view mutations to each event's write; appends the watermark announcement when
    /// the batch moves the watermark. With `coalesce` (only for batches
    /// [`Views::begin_batch`] cleared), the on-time mutations go into one extra write, one per
    /// cell. A `members` remove that would take a dot of a replica whose announcement does not
    /// count this node for the window ([`seal::counts_me`]) is late (`outside_seal`). Call with
    /// the watermark lock held, and queue the writes before releasing it.
    ///
    /// # Errors
    /// Storage failures (nothing decided then).
    pub(crate) fn admit(
        &self,
        marks: StreamMarks,
        batch: AdmitBatch<'_>,
        writes: &mut Vec<LocalWrite>,
        me: ReplicaId,
        coalesce: bool,
    ) -> Result<Admitted, Error> {
        let AdmitBatch {
            stream,
            folded,
            events,
            known_dup,
            gap_refused,
            inflight,
            unsynced,
            reader,
            peer_of,
        } = batch;
        // An event whose application is not certain when queued (an earlier queued batch
        // carries its pair, or the dedup rule refuses it) moves no watermark: a duplicate or
        // refused event must change nothing.
        let uncertain = self.register_queued(stream, events, inflight);
        let mut owners: Option<Owners> = None;
        let wm = marks.wm;
        let horizon = self.horizon(stream);
        let ooo = self.ooo.get(stream).copied().unwrap_or(0);
        let mut out = Admitted::default();
        let mut max_wm = None::<u64>;
        // The on-time ops of the coalesced write, event after event, with each event's end.
        let mut per_event: Vec<coalesce::CellOp> = Vec::new();
        let mut ends = Vec::with_capacity(events.len());
        if coalesce {
            per_event.reserve(folded.ops.len());
        }
        out.late.reserve(events.len());
        out.applied.reserve(
            events
                .len()
                .saturating_mul(self.by_stream.get(stream).map_or(0, Vec::len)),
        );
        out.applied_ends.reserve(events.len());
        let mut applied_window = false;
        let decommissioned = self.removed.load(Ordering::Relaxed);
        let excluded = self
            .seals
            .lock()
            .ok()
            .and_then(|s| s.get(stream).map(|x| x.excluded_to))
            .unwrap_or(0);
        let FoldedBatch {
            cells,
            events: folded,
            ops: folded_ops,
        } = folded;
        let mut folded_ops = folded_ops.into_iter();
        // Cells of `distinct` views (their adds of elements already held are skipped).
        let mut distinct_cell = vec![false; if coalesce { cells.len() } else { 0 }];
        for (i, ((w, f), event)) in writes.iter_mut().zip(folded).zip(events).enumerate() {
            if known_dup.get(i).copied().unwrap_or(false) {
                // A duplicate changes nothing: the writer skips its write, and its time
                // moves no watermark.
                folded_ops.by_ref().take(f.ops).for_each(drop);
                ends.push(per_event.len());
                out.late.push(Vec::new());
                out.applied_ends.push(out.applied.len());
                continue;
            }
            // View cells: each replica's contribution stays separable by dot (seals count
            // exactly their members' contributions, `seal.rs`).
            w.own_dots = true;
            let mut late = Vec::new();
            let mut removed_any = false;
            let mut outside_any = false;
            // This event's views applied are `out.applied[applied_from..]`.
            let applied_from = out.applied.len();
            for op in folded_ops.by_ref().take(f.ops) {
                let removed = matches!((op.start, horizon), (Some(s), Some(h)) if self.expired(op.view, s, h));
                let mut outside = op.deadline.is_some_and(|d| d < excluded);
                let mut is_late = ((unsynced || decommissioned) && op.deadline.is_some())
                    || removed
                    || outside
                    || matches!((op.deadline, wm), (Some(d), Some(wm)) if d < wm);
                if let (false, Some(d), Mutation::Remove(elem)) =
                    (is_late, op.deadline, &op.mutation)
                {
                    let owners = match &mut owners {
                        Some(o) => o,
                        None => owners.insert(Self::owners(reader, stream, me)?),
                    };
                    let key = cells.get(op.cell as usize).ok_or(Error::Closed)?;
                    if !Self::remove_counted(reader, owners, key, elem, d, me, peer_of)? {
                        outside = true;
                        is_late = true;
                    }
                }
                removed_any |= removed;
                outside_any |= outside;
                if is_late {
                    if late.last() != Some(&op.view) {
                        late.push(op.view);
                    }
                } else if out.applied.len() == applied_from || out.applied.last() != Some(&op.view)
                {
                    out.applied.push(op.view);
                }
                if !is_late {
                    applied_window |= op.deadline.is_some();
                    if coalesce {
                        if self
                            .views
                            .get(op.view)
                            .is_some_and(|v| v.def.kind == ViewKind::Distinct)
                        {
                            if let Some(d) = distinct_cell.get_mut(op.cell as usize) {
                                *d = true;
                            }
                        }
                        per_event.push((op.cell, op.mutation, op.stamp));
                    } else if let Some(key) = cells.get(op.cell as usize) {
                        w.ops.push((key.clone(), op.mutation));
                    }
                }
            }
            ends.push(per_event.len());
            if !late.is_empty() {
                let reason = if decommissioned {
                    "decommissioned"
                } else if unsynced {
                    "not_synced"
                } else if removed_any {
                    "window_removed"
                } else if outside_any {
                    "outside_seal"
                } else {
                    "behind_watermark"
                };
                w.late = Some(self.late_note(stream, event, &late, reason, wm, me));
            }
            out.late.push(late);
            out.applied_ends.push(out.applied.len());
            let certain = !uncertain.get(i).copied().unwrap_or(true)
                && !gap_refused.get(i).copied().unwrap_or(true);
            if !unsynced && certain {
                let t = f.time_ms.saturating_sub(ooo);
                max_wm = Some(max_wm.map_or(t, |m| m.max(t)));
            }
        }
        if coalesce && !per_event.is_empty() {
            let merged: Vec<(Key, Mutation, Option<tidemark_crdts::Timestamp>)> =
                match coalesce::coalesce_cells_ref(&cells, &per_event) {
                    Some(ops) => {
                        let (ops, adds) =
                            self.skip_present(ops, &cells, &distinct_cell, reader, me);
                        out.held = adds;
                        ops.into_iter()
                            .filter_map(|(c, m, s)| {
                                cells
                                    .get(c as usize)
                                    .map(|k| (k.clone(), m.to_mutation(), s))
                            })
                            .collect()
                    }
                    // Mixed mutation shapes in a cell (no view makes them): the rule over
                    // keys, every add kept.
                    None => {
                        let ops = per_event.iter().filter_map(|(c, m, _)| {
                            cells.get(*c as usize).map(|k| (k.clone(), m.clone()))
                        });
                        coalesce::coalesce(ops.collect())
                            .into_iter()
                            .map(|(k, m)| {
                                let stamp = keys::event_stamp(&k, &m);
                                (k, m, stamp)
                            })
                            .collect()
                    }
                };
            let mut ops = Vec::with_capacity(merged.len());
            let mut stamps = Vec::new();
            for (k, m, stamp) in merged {
                if stamp.is_some() && stamps.is_empty() {
                    stamps.resize(ops.len(), None);
                }
                if !stamps.is_empty() {
                    stamps.push(stamp);
                }
                ops.push((k, m));
            }
            if !ops.is_empty() {
                out.fallback = Some(crate::store::BatchFallback {
                    merged: writes.len(),
                    cells,
                    ops: per_event,
                    ends,
                });
                writes.push(LocalWrite {
                    ops,
                    event: None,
                    stamps,
                    late: None,
                    own_dots: true,
                });
            }
        }
        let mut first_applied = false;
        if applied_window {
            // The first event applied to a window: below the watermark it was judged by,
            // this node applied (and will apply) nothing. Announced in this batch, so no
            // restart can forget it.
            if let Ok(mut seals) = self.seals.lock() {
                let s = seals.entry(stream.to_owned()).or_default();
                if !s.applied {
                    s.applied = true;
                    s.since = wm.unwrap_or(0);
                    first_applied = true;
                }
            }
        }
        match max_wm {
            Some(m) if wm.is_none_or(|wm| m > wm) => {
                out.new_wm = Some(m);
                writes.push(self.announcement(stream, m, marks.horizon, me));
            }
            _ if first_applied => {
                writes.push(self.announcement(stream, wm.unwrap_or(0), marks.horizon, me));
            }
            _ => {}
        }
        Ok(out)
    }

    /// Every other replica in this node's context and what its announcement of `stream` says
    /// (for [`Views::remove_counted`]).
    ///
    /// # Errors
    /// Storage failures.
    fn owners(reader: &crate::store::Reader, stream: &str, me: ReplicaId) -> Result<Owners, Error> {
        let ctx = reader.context()?;
        let mut out = Vec::new();
        for &r in ctx.replicas() {
            if r == me {
                continue;
            }
            let a = read::announcement_of(reader, &keys::wm_key(stream, r))?;
            out.push((r, a.and_then(|a| a.epochs.map(|e| (e, a.met)))));
        }
        Ok(out)
    }

    /// Whether this node's `members` remove of `elem` from the cell `key`, of deadline `d`, may
    /// be applied: every replica of `owners` that holds a dot of the element in the committed
    /// cell counts this node in every seal of `d` that counts it ([`seal::counts_me`]). This
    /// node's own dots are its own to remove. Reads one element row per replica that does not
    /// count it (none in a cluster where every member met it).
    ///
    /// # Errors
    /// Storage failures.
    fn remove_counted(
        reader: &crate::store::Reader,
        owners: &Owners,
        key: &Key,
        elem: &str,
        d: u64,
        me: ReplicaId,
        peer_of: fn(ReplicaId) -> crate::proto::PeerId,
    ) -> Result<bool, Error> {
        let my_peer = peer_of(me).0;
        for (r, said) in owners {
            let counted = said
                .as_ref()
                .is_some_and(|(e, met)| seal::counts_me(Some(e), met, me, my_peer, d));
            if !counted && reader.set_holds_own(key, elem, *r)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The late-lane record of `event`, late for the views `late` (indexes): the event as
    /// ingested, the views, why (`window_removed` by retention, `not_synced` on a joining
    /// node that has not synced the stream yet, `outside_seal` for a window another node's
    /// membership does not count this one in — or a `members` remove that would take the
    /// element from a replica whose announcement does not count this one for the window —,
    /// `decommissioned` on a node removed for good, else `behind_watermark`), this node's
    /// watermark then, the node and when (wall-clock ms).
    fn late_note(
        &self,
        stream: &str,
        event: &Event,
        late: &[usize],
        reason: &str,
        wm: Option<u64>,
        me: ReplicaId,
    ) -> crate::store::LateNote {
        let views: Vec<&str> = late
            .iter()
            .filter_map(|&v| self.views.get(v).map(|c| c.def.name.as_str()))
            .collect();
        let record = serde_json::json!({
            "event": event,
            "views": views,
            "reason": reason,
            "watermark": wm,
            "node": me.to_string(),
            "received_ms": crate::clock::wall_ms(),
        });
        crate::store::LateNote {
            stream: stream.to_owned(),
            record: record.to_string(),
            mark: None,
        }
    }

    /// Drops the adds of `distinct` views (cells `distinct_cell` marks) whose element the
    /// committed cell already holds under this node's own dot: a `distinct` set never removes,
    /// so re-adding changes no value (it would only take a dot and rewrite the row). What the
    /// record of held elements ([`held`]) knows is skipped without a read; for the rest one
    /// element row per add is read (sets are stored per element), never the whole cell, all in
    /// one read transaction, and what the read finds held is recorded. When the rows cannot be
    /// read, every add not known held is kept. Returns the ops kept and the adds among them
    /// (for [`Views::committed`]).
    fn skip_present<'a>(
        &self,
        ops: Vec<coalesce::MergedOp<'a>>,
        cells: &[Key],
        distinct_cell: &[bool],
        reader: &crate::store::Reader,
        me: ReplicaId,
    ) -> (Vec<coalesce::MergedOp<'a>>, Option<HeldAdds>) {
        let check = |(c, m, _): &coalesce::MergedOp<'a>| {
            matches!(m, coalesce::MergedRef::Add(_))
                && distinct_cell.get(*c as usize).copied().unwrap_or(false)
        };
        let items: Vec<(&Key, &str)> = ops
            .iter()
            .filter(|op| check(op))
            .filter_map(|(c, m, _)| match (cells.get(*c as usize), m) {
                (Some(k), coalesce::MergedRef::Add(e)) => Some((k, *e)),
                _ => None,
            })
            .collect();
        if items.is_empty() {
            return (ops, None);
        }
        // Before the lookup and the read: a forgetting after it voids what they find.
        let mark = self.held.mark();
        let mut held = self.held.lookup(&items, me);
        let misses: Vec<(&Key, &str)> = items
            .iter()
            .zip(&held)
            .filter(|(_, h)| !**h)
            .map(|(i, _)| *i)
            .collect();
        if !misses.is_empty() {
            // Only this node's own add counts: contributions stay separable by replica.
            if let Ok(read) = reader.sets_hold_own(&misses, me) {
                self.held.learn(
                    mark,
                    me,
                    misses
                        .iter()
                        .zip(&read)
                        .filter(|(_, h)| **h)
                        .map(|(i, _)| *i),
                );
                let mut read = read.into_iter();
                for h in held.iter_mut().filter(|h| !**h) {
                    *h = read.next().unwrap_or(false);
                }
            }
        }
        let adds: Vec<(Key, String)> = if self.held.enabled() {
            items
                .iter()
                .zip(&held)
                .filter(|(_, h)| !**h)
                .map(|((k, e), _)| ((*k).clone(), (*e).to_owned()))
                .collect()
        } else {
            Vec::new()
        };
        drop(misses);
        drop(items);
        let mut held = held.into_iter();
        let ops = ops
            .into_iter()
            .filter(|op| !check(op) || !held.next().unwrap_or(false))
            .collect();
        let adds = (!adds.is_empty()).then_some(HeldAdds { mark, adds });
        (ops, adds)
    }

    /// A batch [`Views::admit`] decided committed: when every event of it was applied
    /// (`all_applied`), the adds of its coalesced write (`adds`) are held under `me`'s dot
    /// now and are recorded (unless something forgot their cells since they were queued).
    /// A batch of which some event was a duplicate or refused records nothing.
    pub(crate) fn committed(&self, adds: Option<HeldAdds>, all_applied: bool, me: ReplicaId) {
        if let (Some(h), true) = (adds, all_applied) {
            self.held
                .learn(h.mark, me, h.adds.iter().map(|(k, e)| (k, e.as_str())));
        }
    }

    /// A remote join changed `key` (told by the writer after its commit): what the record of
    /// held elements says of it is forgotten, then the audit hears of it
    /// ([`Views::remote_changed`]).
    pub(crate) fn remote_change(&self, key: &Key) {
        if key.kind == tidemark_crdts::KeyKind::ORSet && key.name.starts_with(keys::VIEW_PREFIX) {
            self.held.forget(key);
        }
        if self.needs_maintenance() {
            self.remote_changed(key);
        }
    }

    /// Bytes and cells in the record of held elements.
    #[cfg(test)]
    pub(crate) fn held_size(&self) -> (usize, usize) {
        self.held.size()
    }

    /// The rows of `keys` were purged (or their purge failed midway): the record of held
    /// elements forgets them.
    pub(crate) fn purged(&self, keys: &[Key]) {
        for k in keys {
            self.held.forget(k);
        }
    }

    /// Counts a committed batch: `effective[i]` is true for event writes that were applied
    /// (neither duplicates nor refused). Returns the number of late events.
    pub(crate) fn count(&self, admitted: &Admitted, effective: &[bool]) -> usize {
        let mut late_events = 0;
        let mut from = 0;
        for ((late, &end), ok) in admitted
            .late
            .iter()
            .zip(&admitted.applied_ends)
            .zip(effective)
        {
            let applied = admitted.applied.get(from..end).unwrap_or_default();
            from = end;
            if !ok {
                continue;
            }
            if !late.is_empty() {
                late_events += 1;
            }
            for &v in late {
                self.counters[v].late.fetch_add(1, Ordering::Relaxed);
            }
            for &v in applied {
                self.counters[v].folded.fetch_add(1, Ordering::Relaxed);
            }
        }
        late_events
    }
}
