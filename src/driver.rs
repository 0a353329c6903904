//! The writer: the only mutator of the store (single writer, ARCHITECTURE invariant 5).
//!
//! Its thread takes every write waiting in its queue, commits them as one durable transaction
//! (group commit), and only then acknowledges each caller and publishes the changes to
//! watchers. The driver sits behind one lock ([`Writer`]): a caller's lone small write that
//! finds the writer idle is committed on the caller's thread, the same way.

use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::Rejected;
use crate::model::{Delta, StateChunk};
use crate::net::link::{NetEvent, PeerLink};
use crate::proto::replica::{Now, Replica, ReplicaEvent};
use crate::proto::{ApplyOutcome, ChunkRead, LogInterval, PeerId, StateStore};
use crate::store::RefusalCause;
use crate::store::{DeltasSince, LocalCommit, LocalWrite, RedbStore, StoreError};
use crate::watch::Change;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use tidemark_crdts::{CausalContext, DedupMarks, IntervalSet, Key, ReplicaId, Value};
use tokio::sync::oneshot;

/// What compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Log entries dropped.
    pub log_entries_dropped: u64,
    /// Bytes of log entries dropped.
    pub bytes_reclaimed: u64,
    /// Ranges left in the dot cloud (0 when the context is a pure version vector).
    pub cloud_ranges: usize,
}

/// Inputs of the writer thread.
pub(crate) enum Input {
    Write {
        writes: Vec<LocalWrite>,
        /// For a view batch with coalesced view mutations: how to un-coalesce it.
        fallback: Option<crate::store::BatchFallback>,
        reply: oneshot::Sender<Result<LocalCommit, Error>>,
    },
    ApplyRemote {
        origin: PeerId,
        delta: Delta,
        reply: oneshot::Sender<Result<Result<ApplyOutcome, Rejected>, Error>>,
    },
    /// Whether some peer is linked and this store holds what every linked peer held when it
    /// first announced its context (`Replica::covers_peers`).
    PeersCovered {
        reply: oneshot::Sender<bool>,
    },
    DeltasSince {
        remote: CausalContext,
        bytes_max: usize,
        reply: oneshot::Sender<Result<DeltasSince, Error>>,
    },
    Compact {
        below: Option<u64>,
        reply: oneshot::Sender<Result<CompactReport, Error>>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
    /// Nothing to do: wakes the writer thread so that it plans its next wake-up again (after
    /// an inline commit set an earlier timer).
    Wake,
    /// What the network layer reports: links up and down, SWIM liveness, peer messages
    /// (QUIC and in-process peers alike: the writer's one peer path).
    Net(NetEvent),
    /// A read transaction at a durable point, for a snapshot (relaxed commits are made
    /// durable first, so a snapshot never holds what a crash could lose).
    SnapshotRead {
        reply: oneshot::Sender<Result<crate::store::SnapshotRead, Error>>,
    },
    /// Replication counters.
    Status {
        reply: oneshot::Sender<ReplicationStatus>,
    },
    /// Stream-view retention: remove the rows of expired windows (context kept).
    PurgeRows {
        keys: Vec<Key>,
        reply: oneshot::Sender<Result<usize, Error>>,
    },
}

/// What replication has done and where it stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicationStatus {
    /// Peers connected now.
    pub peers_connected: Vec<PeerId>,
    /// Per peer linked since open (connected now or not), the last cursor into our log it
    /// acknowledged since open, kept while it is away (`None`: it acknowledged nothing yet, so
    /// its lag is unknown).
    pub peer_acked: Vec<(PeerId, Option<u64>)>,
    /// Per peer linked since open (connected now or not: the same peers as `peer_acked`),
    /// milliseconds since it last had acknowledged our whole log (since it was first linked,
    /// if it never had; 0 while caught up, to within one writer tick). A peer that is away
    /// and behind keeps counting from the last moment it had our whole log.
    pub peer_lag_ms: Vec<(PeerId, u64)>,
    /// Our log as `[start, end)`.
    pub log_bounds: (u64, u64),
    /// The protocol's counters.
    pub stats: crate::proto::replica::ReplicaStats,
    /// Frames that could not be decoded (size limit, version, malformed).
    pub frames_rejected: u64,
}

/// One caller's writes and where to acknowledge them.
pub(crate) type PendingWrite = (
    Vec<LocalWrite>,
    Option<crate::store::BatchFallback>,
    oneshot::Sender<Result<LocalCommit, Error>>,
);

pub(crate) struct Driver {
    pub(crate) store: RedbStore,
    pub(crate) queued_ops: Arc<AtomicUsize>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) changes: Arc<crate::watch::Feed>,
    pub(crate) group_ops_max: usize,
    pub(crate) tick: Duration,
    /// What is durable: the only state peers are served (relaxed durability).
    pub(crate) durable: DurablePoint,
    /// When the write-ahead log next gets a checkpoint of its own ([`Checkpoints`]).
    pub(crate) checkpoints: Checkpoints,
    /// The sans-IO replication core this writer drives.
    pub(crate) replica: Replica,
    /// Start of monotonic time for the protocol.
    pub(crate) started: Instant,
    /// Retain at least this many log entries before compacting to the stable frontier.
    pub(crate) log_retain_entries: u64,
    /// Frames from peers that could not be decoded (in-process links count here too).
    pub(crate) frames_rejected: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) frame_bytes_max: usize,
    /// Reachable peers (QUIC connections and in-process nodes): where their frames go.
    pub(crate) links: BTreeMap<PeerId, PeerLink>,
    /// Peers that are alive (SWIM's verdict for network peers; in-process peers while
    /// connected): only these are up in the replica (with a link).
    pub(crate) net_alive: std::collections::BTreeSet<PeerId>,
    /// Frees committed groups' writes off the writer thread.
    pub(crate) freer: Freer,
    /// Per peer linked since open (connected now or not), when it last had acknowledged our
    /// whole log (or when it was first seen linked, if it never had): its replication lag in
    /// time.
    pub(crate) caught_up: BTreeMap<PeerId, Instant>,
    /// Every peer linked since open: its acknowledged cursor is reported while it is away.
    pub(crate) ever_linked: std::collections::BTreeSet<PeerId>,
    /// Per peer linked since open, the last cursor into our log it acknowledged: what is
    /// reported while the replica knows none (it went down, or reconnected and has not
    /// acknowledged yet), so its lag counts from what it is known to have.
    pub(crate) last_acked: BTreeMap<PeerId, u64>,
    /// Told the new replica id and the context when the store re-identified at run time,
    /// before the next message or local write is handled (the node's view identity follows).
    pub(crate) on_reidentified: Option<Reidentified>,
    /// Told each key a remote delta or state chunk changed, after its commit (views audit
    /// sealed windows with it).
    pub(crate) on_remote_change: Option<RemoteChange>,
    /// When the writer next ticks ([`Driver::on_tick`]: periodic syncs, checkpoints, metrics).
    pub(crate) next_tick: Instant,
    /// When the writer thread, asleep on its queue, wakes up by itself.
    pub(crate) planned_wake: Instant,
}

/// What the writer calls when the store re-identified at run time: the new id and the
/// context it holds at that moment.
pub(crate) type Reidentified = Arc<dyn Fn(ReplicaId, CausalContext) + Send + Sync>;

/// Called on the writer thread with each key a remote join changed, once it is committed.
pub(crate) type RemoteChange = Arc<dyn Fn(&Key) + Send + Sync>;

/// Frees the writes of committed groups (one or more heap blocks per event, allocated by the
/// callers) on a helper thread, so the one writer thread spends its time committing (the frees
/// were ≈ 15 % of its profile). Bounded: while the helper is behind, the writer frees inline.
/// A small group is freed inline: handing it over costs a futex wake of the helper, whose run
/// then competes on a 2-core machine with the tokio worker sending the group's answers, for
/// less than the frees themselves (a few allocations per write).
pub(crate) struct Freer(Option<std::sync::mpsc::SyncSender<Garbage>>);

/// A committed group's writes and the un-coalescing data of its view batches (unused once
/// committed: one heap block per view op of each event, [`Freer`]).
type Garbage = (Vec<LocalWrite>, Vec<crate::store::BatchFallback>);

/// Groups of fewer writes than this are freed on the writer thread ([`Freer`]).
const FREE_INLINE_BELOW: usize = 32;

impl Freer {
    /// Starts the helper thread (without one, everything is freed inline).
    pub(crate) fn spawn() -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Garbage>(4);
        let started = std::thread::Builder::new()
            .name("tidemark-free".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .is_ok();
        Self(started.then_some(tx))
    }

    /// Frees `writes` and `fallbacks` on the helper thread, or here when it is busy or gone.
    fn free(&self, writes: Vec<LocalWrite>, fallbacks: Vec<crate::store::BatchFallback>) {
        if writes.len() < FREE_INLINE_BELOW {
            drop((writes, fallbacks));
            return;
        }
        if let Some(tx) = &self.0 {
            // A full or closed channel hands the writes back inside the error: freed here.
            let _ = tx.try_send((writes, fallbacks));
        }
    }
}

pub(crate) use crate::clock::wall_ms;

/// The writer's state, shared by the writer thread and by callers that commit a small write
/// of their own inline ([`Writer::commit_inline`]). Whoever holds the lock drives the store:
/// there is still exactly one mutator at a time (ARCHITECTURE invariant 5).
pub(crate) struct Writer {
    driver: std::sync::Mutex<Option<Driver>>,
    /// Writes sent to the writer thread's queue and not yet taken by it under the lock: a
    /// caller commits inline only while this is 0, so writes queued earlier commit earlier.
    queued_writes: AtomicUsize,
    /// The writer thread woke up (an input of any kind, or a timer) and waits for the lock:
    /// callers then queue instead of committing inline, so it waits for one commit at most.
    wants_lock: AtomicUsize,
    /// Writes are arriving concurrently: a caller found the lock held, or writes queued while
    /// an inline commit ran. Callers then queue, so concurrent writes share the writer
    /// thread's groups instead of committing one by one inline (with a fast `fdatasync`
    /// the inline path otherwise won most races and groups shrank: 64 single-event writers
    /// on tmpfs committed 7–10 events per group instead of 20–40, and took 25–35 % fewer
    /// events per second). Cleared by the writer thread when it commits a lone write with
    /// nothing queued behind it, or wakes with nothing to do.
    contended: AtomicBool,
}

/// What [`Writer::commit_inline`] did.
pub(crate) enum Inline {
    /// Committed (the reply was sent); `wake`: the writer thread sleeps past a deadline the
    /// commit set, and must be woken ([`Input::Wake`]) to keep it.
    Committed { wake: bool },
    /// Not committed: the writer is busy or wants the lock, writes are queued, or it is
    /// closed. The write is handed back, to be queued.
    Declined(PendingWrite),
}

impl Writer {
    pub(crate) fn new(mut driver: Driver) -> Self {
        // Watchers get values read after each commit, and only when someone watches. Set
        // here, before any commit: the first one may be a caller's, before the writer thread
        // runs.
        driver.store.set_change_values(false);
        driver.next_tick = Instant::now() + driver.tick;
        Self {
            driver: std::sync::Mutex::new(Some(driver)),
            queued_writes: AtomicUsize::new(0),
            wants_lock: AtomicUsize::new(0),
            contended: AtomicBool::new(false),
        }
    }

    /// Pretends the writer thread waits for the lock (tests: inline commits must then decline).
    #[cfg(test)]
    pub(crate) fn set_wants_lock(&self, on: bool) {
        if on {
            self.wants_lock.fetch_add(1, Ordering::AcqRel);
        } else {
            self.wants_lock.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Marks the writes as concurrent ([`Writer::contended`]; tests).
    #[cfg(test)]
    pub(crate) fn set_contended(&self) {
        self.contended.store(true, Ordering::Release);
    }

    /// Whether callers currently queue because writes are concurrent (tests).
    #[cfg(test)]
    pub(crate) fn is_contended(&self) -> bool {
        self.contended.load(Ordering::Acquire)
    }

    /// Notes a write about to be sent to the writer thread's queue (before the send).
    pub(crate) fn note_queued(&self) {
        self.queued_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// Takes back [`Writer::note_queued`] of a write whose send failed.
    pub(crate) fn unnote_queued(&self) {
        self.queued_writes.fetch_sub(1, Ordering::AcqRel);
    }

    /// Commits `write` on the calling thread when the writer is idle (nobody holds the
    /// driver, the writer thread is not waiting for it, and no write waits in the queue),
    /// exactly as the writer thread would commit it as a group of its own: the reply is sent
    /// before this returns. This saves the hand-off to the writer thread and back (two thread
    /// wake-ups) on a lone small write. It blocks the calling thread for the commit (its
    /// `fdatasync` included).
    pub(crate) fn commit_inline(&self, write: PendingWrite) -> Inline {
        if self.queued_writes.load(Ordering::Acquire) != 0
            || self.wants_lock.load(Ordering::Acquire) != 0
            || self.contended.load(Ordering::Acquire)
        {
            return Inline::Declined(write);
        }
        // A poisoned lock is left to the writer thread, which closes the store.
        let Ok(mut guard) = self.driver.try_lock() else {
            // Another commit is in progress: writes are concurrent.
            self.contended.store(true, Ordering::Release);
            return Inline::Declined(write);
        };
        // Checked again under the lock: the writer thread takes queued writes only while it
        // holds it, so 0 here means every write queued before this call has committed.
        if self.queued_writes.load(Ordering::Acquire) != 0
            || self.wants_lock.load(Ordering::Acquire) != 0
        {
            return Inline::Declined(write);
        }
        let Some(d) = guard.as_mut() else {
            return Inline::Declined(write);
        };
        Metrics::add(&d.metrics.commits_inline, 1);
        d.commit_and_push(vec![write]);
        if d.replica_deadline().is_some_and(|t| t <= Instant::now()) {
            d.drive_timeout();
        }
        d.drive_outputs();
        let wake = d.next_deadline() < d.planned_wake;
        if self.queued_writes.load(Ordering::Acquire) != 0 {
            // Writes queued behind this commit: they, and the next, go to the writer thread.
            self.contended.store(true, Ordering::Release);
        }
        Inline::Committed { wake }
    }

    /// The driver, for the writer thread. A lock poisoned by a caller that panicked inside an
    /// inline commit closes the store here (the driver is dropped), as a panic of the writer
    /// thread itself always did: every later write fails with [`Error::Closed`].
    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Option<Driver>>> {
        self.wants_lock.fetch_add(1, Ordering::AcqRel);
        let locked = self.driver.lock();
        self.wants_lock.fetch_sub(1, Ordering::AcqRel);
        match locked {
            Ok(guard) => Some(guard),
            Err(poisoned) => {
                let driver = poisoned.into_inner().take();
                tracing::error!("a commit panicked; the store is closed");
                drop(driver);
                None
            }
        }
    }

    /// The writer thread: runs until shutdown or until every sender is gone, then closes
    /// the store (drops the driver).
    pub(crate) fn run(&self, inputs: Receiver<Input>) {
        let Some(mut guard) = self.lock() else { return };
        loop {
            let Some(d) = guard.as_mut() else { return };
            let now = Instant::now();
            if now >= d.next_tick {
                d.on_tick();
                d.next_tick = now + d.tick;
            }
            d.planned_wake = d.next_deadline();
            let wait = d.planned_wake.saturating_duration_since(now);
            drop(guard);
            let received = inputs.recv_timeout(wait);
            guard = match self.lock() {
                Some(g) => g,
                None => return,
            };
            let Some(d) = guard.as_mut() else { return };
            let first = match received {
                Ok(input) => input,
                Err(RecvTimeoutError::Timeout) => {
                    // Idle for a while: a lone write may commit inline again.
                    self.contended.store(false, Ordering::Release);
                    d.drive_timeout();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    d.on_tick();
                    d.keep_watch_end();
                    let driver = guard.take();
                    drop(guard);
                    drop(driver);
                    return;
                }
            };
            if d.take_inputs(first, &inputs, &self.queued_writes, &self.contended) {
                let driver = guard.take();
                drop(guard);
                drop(driver);
                return;
            }
        }
    }
}

impl Driver {
    /// The earliest of the next tick and the replication core's next timer.
    fn next_deadline(&self) -> Instant {
        self.replica_deadline()
            .map_or(self.next_tick, |d| d.min(self.next_tick))
    }

    /// Handles `first` and whatever else is queued (up to `group_ops_max` ops of writes,
    /// committed as one group); true on shutdown.
    fn take_inputs(
        &mut self,
        first: Input,
        inputs: &Receiver<Input>,
        queued_writes: &AtomicUsize,
        contended: &AtomicBool,
    ) -> bool {
        let mut writes: Vec<PendingWrite> = Vec::new();
        let mut others = Vec::new();
        let mut ops = 0usize;
        let mut next = Some(first);
        while let Some(input) = next.take() {
            match input {
                Input::Write {
                    writes: w,
                    fallback,
                    reply,
                } => {
                    queued_writes.fetch_sub(1, Ordering::AcqRel);
                    ops += w.iter().map(|x| x.ops.len().max(1)).sum::<usize>();
                    writes.push((w, fallback, reply));
                }
                other => others.push(other),
            }
            if ops < self.group_ops_max {
                next = inputs.try_recv().ok();
            }
        }
        if !writes.is_empty() {
            // A lone write with nothing queued behind it: the writes are no longer
            // concurrent, so callers may commit inline again ([`Writer::contended`]). Cleared
            // before the commit (whose reply may wake the next lone write): a write arriving
            // during the commit finds the lock held and sets it again (one that set it just
            // before this clear may be followed by one more inline commit: harmless).
            if writes.len() == 1 && queued_writes.load(Ordering::Acquire) == 0 {
                contended.store(false, Ordering::Release);
            }
            self.commit_and_push(writes);
        }
        for input in others {
            if let Input::Shutdown { reply } = input {
                // Relaxed mode: make everything acknowledged so far durable before closing.
                self.on_tick();
                self.keep_watch_end();
                let _ = reply.send(());
                return true;
            }
            self.handle(input);
        }
        if self.replica_deadline().is_some_and(|d| d <= Instant::now()) {
            self.drive_timeout();
        }
        self.drive_outputs();
        false
    }

    /// Commits `writes` as one group and hands the commit to the replication core.
    fn commit_and_push(&mut self, writes: Vec<PendingWrite>) {
        self.commit_group(writes);
        let now = self.now();
        let mut served = Served::new(&mut self.store, &mut self.durable);
        if let Err(e) = self.replica.push_local_commit(now, &mut served) {
            tracing::error!(error = %e, "replication storage failure");
        }
    }

    fn now(&self) -> Now {
        Now {
            mono_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            wall_ms: wall_ms(),
        }
    }

    fn replica_deadline(&self) -> Option<Instant> {
        self.replica
            .poll_timeout()
            .map(|ms| self.started + Duration::from_millis(ms))
    }

    fn drive_timeout(&mut self) {
        // Relaxed durability: local commits past the durable point are invisible to the core
        // (invariant 7), so without this they would reach peers only at the next periodic
        // sync. While a peer is connected they are made durable at the core's next timer (its
        // gossip tick): one forced durable commit per tick at most, then served as usual.
        if self.durable.relaxed
            && !self.links.is_empty()
            && self.store.log_bounds().1 > self.durable.log_end
            && let Err(e) = self.durable.sync(&mut self.store)
        {
            tracing::error!(error = %e, "durable commit before serving failed; writes halted");
        }
        let now = self.now();
        let mut served = Served::new(&mut self.store, &mut self.durable);
        if let Err(e) = self.replica.handle_timeout(now, &mut served) {
            tracing::error!(error = %e, "replication storage failure");
        }
        self.drive_outputs();
    }

    /// Sends what the core wants sent and acts on its events (quinn's poll order).
    fn drive_outputs(&mut self) {
        while let Some(t) = self.replica.poll_transmit() {
            let Some(link) = self.links.get(&t.to) else {
                continue; // unreachable peer: like a lost packet; the protocol retransmits
            };
            match crate::codec::encode("protocol frame", &t.msg) {
                Ok(bytes) if bytes.len() <= self.frame_bytes_max => {
                    if !link.send(bytes) {
                        // The peer is gone (connection closed, or its writer stopped).
                        if self.links.remove(&t.to).is_some_and(|l| l.is_local()) {
                            self.net_alive.remove(&t.to);
                        }
                        let now = self.now();
                        self.replica.peer_down(now, t.to);
                    }
                }
                Ok(bytes) => {
                    // By the size invariants this cannot happen; if it does, it is an error
                    // counted in metrics, not only a trace line (and a failed test build).
                    debug_assert!(
                        false,
                        "a {} frame of {} bytes is over frame_bytes_max {}",
                        t.msg.kind(),
                        bytes.len(),
                        self.frame_bytes_max
                    );
                    Metrics::add(&self.metrics.frames_oversize, 1);
                    tracing::error!(
                        len = bytes.len(),
                        kind = t.msg.kind(),
                        "frame over the limit not sent"
                    );
                }
                Err(e) => {
                    Metrics::add(&self.metrics.frames_oversize, 1);
                    tracing::error!(error = %e, "cannot encode frame");
                }
            }
        }
        while let Some(event) = self.replica.poll_event() {
            match event {
                ReplicaEvent::Applied { changed, .. } => {
                    self.remote_changed(changed.iter());
                    self.publish(changed.iter());
                }
                ReplicaEvent::Compact { below } => {
                    let (start, end) = self.store.log_bounds();
                    if end - start > self.log_retain_entries {
                        let below = below.min(end.saturating_sub(self.log_retain_entries));
                        match self.store.compact(below) {
                            Ok(bytes) => {
                                Metrics::add(&self.metrics.compaction_reclaimed_bytes, bytes)
                            }
                            Err(e) => tracing::error!(error = %e, "compaction failed"),
                        }
                    }
                }
                ReplicaEvent::Rejected { from, kind, reason } => {
                    Metrics::add(&self.metrics.remote_rejected, 1);
                    // A network peer that sends what we refuse is disconnected (it reconnects
                    // and is served again; nothing it sent was applied).
                    if self.links.get(&from).is_some_and(|l| !l.is_local())
                        && let Some(link) = self.links.remove(&from)
                    {
                        link.close_hostile(kind);
                        let now = self.now();
                        self.replica.peer_down(now, from);
                    }
                    tracing::warn!(?from, kind, ?reason, "rejected a peer message");
                }
                other => tracing::debug!(?other, "replication event"),
            }
        }
    }

    fn on_tick(&mut self) {
        Metrics::set(&self.metrics.log_entries, self.store.log_len());
        Metrics::set(&self.metrics.wal_bytes, self.store.wal_pending_bytes());
        self.note_caught_up();
        self.metrics.sample_writes(wall_ms());
        if let Err(e) = self.durable.sync(&mut self.store) {
            tracing::error!(error = %e, "periodic durable commit failed; writes halted");
        }
        if self
            .checkpoints
            .due(self.store.wal_pending_bytes(), Instant::now())
        {
            match self.store.checkpoint() {
                Ok(()) => Metrics::set(&self.metrics.wal_bytes, 0),
                Err(e) => tracing::error!(error = %e, "checkpoint failed; writes halted"),
            }
        }
        Metrics::set(&self.metrics.checkpoints, self.store.stats().checkpoints);
    }

    /// Notes, for every peer linked since open (connected now or not), whether it has
    /// acknowledged our whole log now (it is caught up: its lag in time restarts from here).
    /// A peer that went away keeps the instant it last had our whole log, so its lag keeps
    /// growing while we write and it cannot hear of it.
    fn note_caught_up(&mut self) {
        let now = Instant::now();
        let end = self.store.log_bounds().1;
        self.ever_linked.extend(self.links.keys().copied());
        for p in &self.ever_linked {
            let at = self.caught_up.entry(*p).or_insert(now);
            let acked = self.replica.peer_acked(*p);
            if let Some(a) = acked {
                self.last_acked.insert(*p, a);
            }
            if acked.is_some_and(|a| a >= end) {
                *at = now;
            }
        }
    }

    /// `peer`'s acknowledged cursor: the replica's, else the last one it had.
    fn acked_of(&self, peer: PeerId) -> Option<u64> {
        self.replica
            .peer_acked(peer)
            .or_else(|| self.last_acked.get(&peer).copied())
    }

    /// Un-coalesces every view batch of `group` of which some event would not be applied
    /// (a duplicate, or refused for dedup gaps) when the group commits: replays the store's
    /// dedup rule over the group, in order, on the committed marks. Coalescing was decided
    /// before the batch was queued; a peer's delta joined since may carry marks of its events.
    fn settle_view_batches(&self, group: &mut [PendingWrite]) {
        if group.iter().all(|(_, f, _)| f.is_none()) {
            return;
        }
        let reader = self.store.reader();
        let ranges_max = self.store.limits().dedup_ranges_max;
        let mut marks: std::collections::HashMap<(String, String), Option<IntervalSet>> =
            std::collections::HashMap::new();
        for (writes, fallback, _) in group.iter_mut() {
            let mut all_applied = true;
            for w in writes.iter() {
                let Some(ev) = &w.event else { continue };
                let seen = marks
                    .entry((ev.stream.clone(), ev.source.clone()))
                    .or_insert_with(|| reader.dedup_marks_of(&ev.stream, &ev.source).ok());
                // Marks that cannot be read: assume the worst (per-event mutations are
                // always right, only slower).
                let Some(seen) = seen.as_mut() else {
                    all_applied = false;
                    continue;
                };
                let below = ev.seq.checked_sub(1).is_some_and(|s| seen.contains(s));
                let above = ev.seq.checked_add(1).is_some_and(|s| seen.contains(s));
                if seen.contains(ev.seq) || (!below && !above && seen.ranges().len() >= ranges_max)
                {
                    all_applied = false;
                    continue;
                }
                seen.insert(ev.seq);
            }
            if !all_applied {
                if let Some(f) = fallback.take() {
                    f.apply(writes);
                }
            }
        }
    }

    fn commit_group(&mut self, mut group: Vec<PendingWrite>) {
        let sizes: Vec<usize> = group.iter().map(|(w, _, _)| w.len()).collect();
        let group_ops: usize = group
            .iter()
            .map(|(w, _, _)| w.iter().map(|x| x.ops.len().max(1)).sum::<usize>())
            .sum();
        // After `group_ops` (what was queued is what is released).
        self.settle_view_batches(&mut group);
        let mut all = Vec::with_capacity(sizes.iter().sum());
        let mut replies = Vec::with_capacity(group.len());
        // Fallbacks not applied are freed with the writes, off this thread.
        let mut fallbacks = Vec::new();
        for (w, f, r) in group {
            all.extend(w);
            fallbacks.extend(f);
            replies.push(r);
        }
        let started = Instant::now();
        let result = self.store.commit_local_batches(&all, &sizes, wall_ms());
        let elapsed = started.elapsed();
        let latency_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.queued_ops.fetch_sub(group_ops, Ordering::AcqRel);
        match result {
            Ok(mut commit) => {
                let m = &self.metrics;
                m.observe_commit(crate::metrics::CommitSample {
                    ops: group_ops as u64,
                    elapsed,
                    durable: !self.durable.relaxed,
                });
                Metrics::add(&m.commits, 1);
                Metrics::add(&m.commit_groups_ops, all.len() as u64);
                Metrics::max(&m.commit_group_max, all.len() as u64);
                Metrics::add(&m.commit_latency_us_sum, latency_us);
                Metrics::max(&m.commit_latency_us_max, latency_us);
                let dups = commit.duplicate.iter().filter(|d| **d).count() as u64;
                Metrics::add(&m.duplicates, dups);
                // `ops_applied` (client ops and events acknowledged) is counted by the node,
                // which knows which writes are its callers' (not view cells, watermarks or
                // records it writes itself).
                Metrics::set(&m.log_entries, self.store.log_len());
                // Published before any caller hears back: a write acknowledged is in the feed
                // (a watcher caught up after the ack has it, and its cursor is past it).
                let changes = std::mem::take(&mut commit.changes);
                if !changes.is_empty() && !self.changes.recording() {
                    self.changes.skip();
                } else {
                    for (key, value) in changes {
                        self.changes.publish(Change { key, value });
                    }
                }
                self.publish(commit.changed.iter().map(|k| &**k));
                let mut offset = 0;
                let ranges_max = self.store.limits().dedup_ranges_max;
                for (size, reply) in sizes.into_iter().zip(replies) {
                    let range = offset..offset + size;
                    // A write refused for too many dedup gaps fails its caller's call (the
                    // caller's other writes are idempotent: a retry applies none twice); an
                    // overflow refused the caller's whole batch.
                    if let Some(r) = commit.refused.iter().find(|r| range.contains(&r.index)) {
                        let err = match &r.cause {
                            RefusalCause::DedupGaps { source, ranges } => Error::DedupGaps {
                                index: r.index - offset,
                                event_source: source.clone(),
                                ranges: *ranges,
                                limit: ranges_max,
                            },
                            RefusalCause::Overflow(o) => {
                                // The caller's whole batch is refused: each of its writes.
                                Metrics::add(&m.rejected_ops, size.max(1) as u64);
                                Error::from_overflow(o.clone())
                            }
                        };
                        let _ = reply.send(Err(err));
                        offset += size;
                        continue;
                    }
                    let part = LocalCommit {
                        duplicate: commit.duplicate[range].to_vec(),
                        changes: Vec::new(),
                        changed: Vec::new(),
                        log_seq: commit.log_seq,
                        refused: Vec::new(),
                    };
                    offset += size;
                    let _ = reply.send(Ok(part));
                }
            }
            Err(e) => {
                // Not acknowledged: every caller of the group gets the failure.
                let msg = e.to_string();
                tracing::error!(error = %msg, "commit group failed");
                use crate::store::StoreError as SE;
                for reply in replies {
                    let err = match &e {
                        SE::InvalidOp(m) => SE::InvalidOp(m.clone()),
                        SE::Halted(m) => SE::Halted(m.clone()),
                        SE::TooLarge { what, len, limit } => SE::TooLarge {
                            what,
                            len: *len,
                            limit: *limit,
                        },
                        _ => SE::CommitFailed(msg.clone()),
                    };
                    let _ = reply.send(Err(Error::Store(err)));
                }
            }
        }
        self.freer.free(all, fallbacks);
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Write { .. } | Input::Shutdown { .. } | Input::Wake => {}
            Input::Net(event) => self.on_net(event),
            Input::SnapshotRead { reply } => {
                let r = self
                    .durable
                    .sync(&mut self.store)
                    .and_then(|()| self.store.begin_snapshot_read());
                let _ = reply.send(r.map_err(Error::from));
            }
            Input::Status { reply } => {
                Metrics::add(&self.metrics.status_requests, 1);
                self.note_caught_up();
                let peers: Vec<PeerId> = self.links.keys().copied().collect();
                let now = Instant::now();
                let _ = reply.send(ReplicationStatus {
                    peer_lag_ms: self
                        .caught_up
                        .iter()
                        .map(|(p, at)| {
                            let ms = now.saturating_duration_since(*at).as_millis();
                            (*p, u64::try_from(ms).unwrap_or(u64::MAX))
                        })
                        .collect(),
                    peer_acked: self
                        .ever_linked
                        .iter()
                        .map(|p| (*p, self.acked_of(*p)))
                        .collect(),
                    peers_connected: peers,
                    log_bounds: self.store.log_bounds(),
                    stats: self.replica.stats().clone(),
                    frames_rejected: self.frames_rejected.load(Ordering::Relaxed),
                });
            }
            Input::ApplyRemote {
                origin,
                delta,
                reply,
            } => {
                let mut r = self.store.apply_remote_delta(origin, delta, wall_ms());
                // The caller may acknowledge it to a peer: durable before the reply.
                if r.is_ok() {
                    if let Err(e) = self.durable.sync(&mut self.store) {
                        r = Err(e);
                    }
                }
                if let Ok(Ok(outcome)) = &r {
                    self.remote_changed(outcome.changed.iter());
                    self.publish(outcome.changed.iter());
                    Metrics::add(&self.metrics.hlc_rejected, outcome.hlc_rejected);
                } else if let Ok(Err(_)) = &r {
                    Metrics::add(&self.metrics.remote_rejected, 1);
                }
                let _ = reply.send(r.map_err(Error::from));
            }
            Input::PeersCovered { reply } => {
                let linked: Vec<PeerId> = self.links.keys().copied().collect();
                let _ = reply.send(self.replica.covers_peers(&linked, &self.store));
            }
            Input::DeltasSince {
                remote,
                bytes_max,
                reply,
            } => {
                // Served to a peer: only durable commits (relaxed mode syncs first).
                let r = self
                    .durable
                    .sync(&mut self.store)
                    .and_then(|()| self.store.deltas_since(&remote, bytes_max));
                let _ = reply.send(r.map_err(Error::from));
            }
            Input::PurgeRows { keys, reply } => {
                let r = self.store.purge_rows(&keys);
                if r.is_ok() {
                    // Watchers see each removed row go (its value now the empty one), so a
                    // consumer that mirrors keys drops it too.
                    self.publish(&keys);
                }
                let _ = reply.send(r.map_err(Error::from));
            }
            Input::Compact { below, reply } => {
                // The retained log never starts above the durable log end the core is shown.
                if let Err(e) = self.durable.sync(&mut self.store) {
                    let _ = reply.send(Err(Error::from(e)));
                    return;
                }
                let (start, end) = self.store.log_bounds();
                let below = below.unwrap_or(end);
                let r = self.store.compact(below).map(|bytes| {
                    Metrics::add(&self.metrics.compaction_reclaimed_bytes, bytes);
                    Metrics::set(&self.metrics.log_entries, self.store.log_len());
                    CompactReport {
                        log_entries_dropped: below.min(end).saturating_sub(start),
                        bytes_reclaimed: bytes,
                        cloud_ranges: self.store.ctx().cloud_ranges(),
                    }
                });
                let _ = reply.send(r.map_err(Error::from));
            }
        }
    }

    /// The one peer path: a link up or down, liveness, or a message, whatever the transport.
    fn on_net(&mut self, event: NetEvent) {
        match event {
            NetEvent::Up { peer, link } => {
                // In-process peers are alive while connected; network peers once SWIM says so.
                if link.is_local() {
                    self.net_alive.insert(peer);
                }
                self.links.insert(peer, link);
                if self.net_alive.contains(&peer) {
                    let now = self.now();
                    let mut served = Served::new(&mut self.store, &mut self.durable);
                    if let Err(e) = self.replica.peer_up(now, peer, &mut served) {
                        tracing::error!(error = %e, "replication storage failure");
                    }
                }
            }
            NetEvent::Down { peer, link } => {
                if self.links.get(&peer).is_some_and(|l| l.id == link) {
                    if self.links.remove(&peer).is_some_and(|l| l.is_local()) {
                        self.net_alive.remove(&peer);
                    }
                    let now = self.now();
                    self.replica.peer_down(now, peer);
                }
            }
            NetEvent::Alive { peer, alive } => {
                let now = self.now();
                if alive {
                    if self.net_alive.insert(peer) && self.links.contains_key(&peer) {
                        let mut served = Served::new(&mut self.store, &mut self.durable);
                        if let Err(e) = self.replica.peer_up(now, peer, &mut served) {
                            tracing::error!(error = %e, "replication storage failure");
                        }
                    }
                } else if self.net_alive.remove(&peer) {
                    self.replica.member_down(now, peer);
                }
            }
            NetEvent::Message {
                from,
                msg,
                permit,
                local,
            } => {
                if local || self.links.contains_key(&from) {
                    let now = self.now();
                    let mut served = Served::new(&mut self.store, &mut self.durable);
                    if let Err(e) = self.replica.handle_message(now, from, *msg, &mut served) {
                        tracing::error!(error = %e, "replication storage failure");
                    }
                    self.reidentify_if_restored();
                    // Act on a refusal before the next message of this peer is handled.
                    self.drive_outputs();
                }
                drop(permit);
            }
        }
    }

    /// Acts on the core's evidence that our store is a copy restored under its old replica id
    /// (docs/design/principles.md, "Never reuse a dot" (c)): switches the store to a fresh id and
    /// epoch durably — before the next local write takes a dot, since this runs right after the
    /// message that showed it — and restarts the replication core under the new epoch, greeting
    /// every connected peer again.
    fn reidentify_if_restored(&mut self) {
        let Some(evidence) = self.replica.take_restored_copy() else {
            return;
        };
        // The old core's pending outputs first (a refusal disconnects a hostile peer).
        self.drive_outputs();
        let old = self.store.replica_id();
        let mut peers: Vec<PeerId> = self.store.known_peers();
        match self.store.reidentify() {
            Ok(new) => {
                Metrics::add(&self.metrics.reidentified, 1);
                if let Some(tell) = &self.on_reidentified {
                    match self.store.reader().context() {
                        Ok(ctx) => tell(new, ctx),
                        Err(e) => tracing::error!(error = %e, "reading the context failed"),
                    }
                }
                tracing::error!(
                    %old,
                    %new,
                    from = ?evidence.from,
                    evidence = evidence.evidence,
                    claimed = evidence.claimed,
                    local = evidence.local,
                    "this data directory is a copy restored under its old replica id (a peer \
                     holds more of it than we do): continuing under a new replica id so that no \
                     dot is ever reissued; windowed events wait for a fresh announcement from a \
                     peer; if the node that ran under the old id is gone for good, remove it \
                     (`tidemark members remove OLD`) so windows become final without it"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "re-identification failed; writes halted");
                return;
            }
        }
        let config = self.replica.config().clone();
        peers.extend(self.links.keys().copied());
        peers.sort();
        peers.dedup();
        let seed = u64::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([5; 8]),
        );
        self.replica = Replica::new(config, self.store.epoch(), seed, peers);
        // Up again: the peers with a link that are alive (as `NetEvent::Up`/`Alive` do).
        let up: Vec<PeerId> = self
            .links
            .keys()
            .filter(|p| self.net_alive.contains(p))
            .copied()
            .collect();
        let now = self.now();
        for peer in up {
            let mut served = Served::new(&mut self.store, &mut self.durable);
            if let Err(e) = self.replica.peer_up(now, peer, &mut served) {
                tracing::error!(error = %e, "replication storage failure");
            }
        }
    }

    /// A clean close while watchers are (or were recently) following: keep the newest change's
    /// cursor so they resume after the restart without a reset. Its commit is durable, and so
    /// makes every commit before it durable (every published change).
    fn keep_watch_end(&mut self) {
        if let Some(end) = self.changes.end_cursor() {
            if let Err(e) = self.store.save_watch_end(end.parts()) {
                tracing::warn!(error = %e, "cannot keep the watch cursor for the next run");
            }
        }
    }

    fn remote_changed<K: std::borrow::Borrow<Key>>(&self, keys: impl IntoIterator<Item = K>) {
        if let Some(hook) = &self.on_remote_change {
            for key in keys {
                hook(key.borrow());
            }
        }
    }

    fn publish<K: std::borrow::Borrow<Key>>(&self, keys: impl IntoIterator<Item = K>) {
        let mut keys = keys.into_iter().peekable();
        if keys.peek().is_none() {
            return;
        }
        if !self.changes.recording() {
            // No value read: the change takes a number, so no cursor resumes past it.
            self.changes.skip();
            return;
        }
        let reader = self.store.reader();
        for key in keys {
            let key = key.borrow();
            let value = match reader.get(key) {
                Ok(v) => v.unwrap_or_else(|| Value::empty(key.kind)),
                Err(e) => {
                    tracing::warn!(error = %e, %key, "cannot read changed key for watchers");
                    // Not held: it takes a number, so no cursor resumes past it silently.
                    self.changes.skip();
                    continue;
                }
            };
            self.changes.publish(Change {
                key: key.clone(),
                value,
            });
        }
    }
}

/// When the writer checkpoints the write-ahead log besides the size trigger of local commits
/// (`store::CHECKPOINT_BYTES`): once the log has been still for [`Checkpoints::IDLE`] (a quiet
/// moment, so no acknowledgement waits behind it), and at the latest [`Checkpoints::MAX_AGE`]
/// after it started growing — which bounds the replay of a restart after a crash in time too.
#[derive(Debug, Default)]
pub(crate) struct Checkpoints {
    /// The log's size at the last look, and since when it has been that size.
    still: Option<(u64, Instant)>,
    /// Since when the log has held records.
    growing: Option<Instant>,
}

impl Checkpoints {
    /// How long the log must be still before an idle checkpoint.
    pub(crate) const IDLE: Duration = Duration::from_secs(1);
    /// The longest the log holds records before a checkpoint, busy or not.
    pub(crate) const MAX_AGE: Duration = Duration::from_secs(60);

    /// Whether to checkpoint now, the log holding `pending` bytes.
    pub(crate) fn due(&mut self, pending: u64, now: Instant) -> bool {
        if pending == 0 {
            *self = Self::default();
            return false;
        }
        let growing = *self.growing.get_or_insert(now);
        let since = match self.still {
            Some((size, since)) if size == pending => since,
            _ => {
                self.still = Some((pending, now));
                now
            }
        };
        let due =
            now.duration_since(since) >= Self::IDLE || now.duration_since(growing) >= Self::MAX_AGE;
        if due {
            *self = Self::default();
        }
        due
    }
}

/// The last durable commit: in `Durability::Relaxed` the replication core is shown the store
/// as of this point only (ARCHITECTURE invariant 7). In `Immediate` mode every commit is durable
/// and the point is not tracked.
pub(crate) struct DurablePoint {
    relaxed: bool,
    /// The log end at the last durable commit.
    log_end: u64,
    /// The causal context at the last durable commit.
    ctx: CausalContext,
}

impl DurablePoint {
    /// The point of a store just opened (opening commits durably).
    pub(crate) fn new(store: &RedbStore, relaxed: bool) -> Self {
        Self {
            relaxed,
            log_end: store.log_bounds().1,
            ctx: if relaxed {
                store.ctx().clone()
            } else {
                CausalContext::new()
            },
        }
    }

    /// Makes every commit so far durable (a forced durable commit, only when relaxed commits
    /// are pending) and moves the point to the store's current state.
    ///
    /// # Errors
    /// The durable commit failed (the store halts).
    pub(crate) fn sync(&mut self, store: &mut RedbStore) -> Result<(), StoreError> {
        if !self.relaxed {
            return Ok(());
        }
        if store.unsynced() {
            store.sync()?;
        }
        let end = store.log_bounds().1;
        if end != self.log_end || store.ctx() != &self.ctx {
            self.log_end = end;
            self.ctx = store.ctx().clone();
        }
        Ok(())
    }
}

/// The store as the replication core sees it. In relaxed durability a local commit is
/// acknowledged before it is durable, so a crash can lose it; the node must then never have let
/// it out, or after the restart it would reissue dots its peers hold with other content. Hence
/// everything a peer can observe comes from durable state only:
///
/// - log bounds end at the durable log end, the announced context (`Have`, transfer contexts)
///   is the durable one, and reading past the durable point (an interval reaching beyond it, a
///   state chunk, dedup marks) first makes everything durable;
/// - a remote join is made durable before the core acknowledges it or records a cursor a
///   `Hello` reports.
///
/// In `Immediate` mode every call passes straight through.
struct Served<'a> {
    store: &'a mut RedbStore,
    durable: &'a mut DurablePoint,
}

impl<'a> Served<'a> {
    fn new(store: &'a mut RedbStore, durable: &'a mut DurablePoint) -> Self {
        Self { store, durable }
    }

    /// Makes everything durable before the caller reads beyond the durable point.
    fn sync(&mut self) -> Result<(), StoreError> {
        self.durable.sync(self.store)
    }
}

impl StateStore for Served<'_> {
    type Error = StoreError;

    fn replica_id(&self) -> ReplicaId {
        self.store.replica_id()
    }

    fn context(&self) -> &CausalContext {
        if self.durable.relaxed {
            &self.durable.ctx
        } else {
            self.store.context()
        }
    }

    fn dedup_marks(&mut self) -> Result<DedupMarks, StoreError> {
        self.sync()?;
        self.store.dedup_marks()
    }

    fn transfer_context(&mut self) -> Result<CausalContext, StoreError> {
        self.sync()?;
        Ok(self.context().clone())
    }

    fn log_bounds(&self) -> (u64, u64) {
        let (start, end) = self.store.log_bounds();
        if self.durable.relaxed {
            (start, self.durable.log_end.min(end).max(start))
        } else {
            (start, end)
        }
    }

    fn log_interval(
        &mut self,
        from: u64,
        exclude: Option<PeerId>,
        bytes_max: usize,
    ) -> Result<LogInterval, StoreError> {
        // The interval may reach the store's log end: make every entry durable first.
        if self.durable.relaxed && self.store.log_bounds().1 > self.durable.log_end {
            self.sync()?;
        }
        self.store.log_interval(from, exclude, bytes_max)
    }

    fn apply_remote(
        &mut self,
        origin: PeerId,
        delta: Delta,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, StoreError> {
        let r = self.store.apply_remote(origin, delta, cursor, now_ms)?;
        self.sync()?;
        Ok(r)
    }

    fn peer_cursor(&self, peer: PeerId) -> Option<(ReplicaId, u64)> {
        // Cursors are written only by remote joins, which are durable before they return.
        self.store.peer_cursor(peer)
    }

    fn read_chunk(
        &mut self,
        after: Option<&Key>,
        bytes_max: usize,
    ) -> Result<ChunkRead, StoreError> {
        self.sync()?;
        self.store.read_chunk(after, bytes_max)
    }

    fn pin_transfer_snapshot(&mut self, peer: PeerId) -> Result<(), StoreError> {
        // The snapshot holds durable state only (and is what `transfer_context` described).
        self.sync()?;
        self.store.pin_transfer_snapshot(peer)
    }

    fn has_transfer_snapshot(&self, peer: PeerId) -> bool {
        self.store.has_transfer_snapshot(peer)
    }

    fn release_transfer_snapshots(&mut self, keep: &dyn Fn(PeerId) -> bool) {
        self.store.release_transfer_snapshots(keep);
    }

    fn read_chunk_from(
        &mut self,
        at: Option<PeerId>,
        after: Option<&Key>,
        resume: Option<&(Key, tidemark_crdts::Dot)>,
        bytes_max: usize,
    ) -> Result<ChunkRead, StoreError> {
        // A pinned snapshot was durable when it was pinned.
        if at.is_none() {
            self.sync()?;
        }
        self.store.read_chunk_from(at, after, resume, bytes_max)
    }

    fn read_marks(
        &mut self,
        at: Option<PeerId>,
        after: Option<&(String, String)>,
        bytes_max: usize,
    ) -> Result<crate::proto::MarksRead, StoreError> {
        if at.is_none() {
            self.sync()?;
        }
        self.store.read_marks(at, after, bytes_max)
    }

    fn apply_chunk(
        &mut self,
        origin: PeerId,
        chunk: StateChunk,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, StoreError> {
        let r = self.store.apply_chunk(origin, chunk, cursor, now_ms)?;
        self.sync()?;
        Ok(r)
    }

    fn stage_chunk(
        &mut self,
        origin: PeerId,
        transfer: crate::proto::TransferId,
        index: u32,
        chunk: StateChunk,
    ) -> Result<Result<(), Rejected>, StoreError> {
        // Staged chunks are never visible to peers or readers: nothing to make durable.
        self.store.stage_chunk(origin, transfer, index, chunk)
    }

    fn apply_staged(
        &mut self,
        origin: PeerId,
        transfer: crate::proto::TransferId,
        index: u32,
        last: StateChunk,
        cursor: Option<(ReplicaId, u64)>,
        now_ms: u64,
    ) -> Result<Result<ApplyOutcome, Rejected>, StoreError> {
        let r = self
            .store
            .apply_staged(origin, transfer, index, last, cursor, now_ms)?;
        self.sync()?;
        Ok(r)
    }

    fn clear_staged(&mut self) -> Result<(), StoreError> {
        self.store.clear_staged()
    }

    fn truncate_log(&mut self, below: u64) -> Result<u64, StoreError> {
        self.store.truncate_log(below.min(self.log_bounds().1))
    }
}

#[cfg(test)]
mod checkpoint_tests {
    use super::Checkpoints;
    use std::time::{Duration, Instant};

    #[test]
    fn an_idle_or_old_log_is_checkpointed_and_an_empty_one_never() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut c = Checkpoints::default();
        assert!(!c.due(0, ms(5_000)), "nothing to checkpoint");
        assert!(!c.due(100, ms(0)));
        assert!(!c.due(100, ms(900)), "still, but not for a second yet");
        assert!(c.due(100, ms(1_000)), "still for a second");
        // A busy log: growing at every look, checkpointed at its maximum age only.
        let mut c = Checkpoints::default();
        let mut due_at = None;
        for i in 0..=700u64 {
            if c.due(i + 1, ms(i * 100)) {
                due_at = Some(i * 100);
                break;
            }
        }
        assert_eq!(due_at, Some(60_000));
    }
}
