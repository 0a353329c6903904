//! [`Replica`]: the deterministic, sans-IO delta anti-entropy state machine
//! (docs/design/principles.md, "Replication protocol").
//!
//! It owns only volatile protocol state (per-peer acknowledged cursors `A[j]`, the one message in
//! flight per peer, transfer progress, timers). Everything durable — the state, the delta log,
//! the receiver-owned cursors into each sender's log, the clock — lives behind [`StateStore`],
//! passed into every call that needs it. It never reads a clock, never draws OS randomness and
//! never iterates a `HashMap`: the same inputs give the same outputs, byte for byte.

use crate::model::Rejected;
use crate::proto::peers::{Inflight, Peer, PeerCursor};
use crate::proto::transfer::{InTransfer, OutTransfer};
use crate::proto::{ChunkRead, MarksRead, Message, PeerId, StateStore};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use tidemark_crdts::ReplicaId;

/// The time of an input: monotonic (virtual) time for timers, and the node's wall clock, which
/// may be skewed, for the hybrid logical clock. Both in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Now {
    /// Monotonic milliseconds (never goes back; any origin).
    pub mono_ms: u64,
    /// Wall-clock milliseconds since the Unix epoch (as the node's clock reads it).
    pub wall_ms: u64,
}

/// A message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The destination peer.
    pub to: PeerId,
    /// The message.
    pub msg: Message,
}

/// Protocol timing and policy. Every duration in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// Period of the gossip tick (each tick offers every idle peer what it lacks). Default 500.
    pub gossip_interval_ms: u64,
    /// First retransmit timeout of an unacknowledged message; doubles per consecutive timeout.
    /// Also the quiet period between Hellos to one peer. Default 2,000.
    pub retransmit_timeout_ms: u64,
    /// Ceiling of the retransmit backoff. Default 8,000.
    pub retransmit_timeout_max_ms: u64,
    /// A peer silent this long is evicted from the ack map, so it no longer pins the log; it
    /// re-syncs when heard again. Default 300,000.
    pub peer_evict_after_ms: u64,
    /// Hellos sent to a peer whose cursor is unknown before falling back to a transfer. Default 2.
    pub hello_attempts: u32,
    /// Target encoded size of one delta-interval or transfer chunk. Default 1 MiB.
    pub message_bytes_target: usize,
    /// Back-propagation avoidance (BP, docs/design/principles.md "BP and RR"): never send a peer
    /// the log entries it originated. Default on; off only for measurements.
    pub back_propagation_avoidance: bool,
    /// Leave out of a peer's intervals the dots its last announced context (`Have`) proves it
    /// has seen. Default on; off only for measurements.
    pub filter_by_peer_context: bool,
    /// Announce our context (`Have`) to every other up peer after a join that changed at least
    /// this many keys (a catch-up), so they do not send the same data again. Default 1,024.
    pub have_after_changed_keys: usize,
    /// When a peer reconnects with a backlog, its senders serve it one after another, ordered by
    /// replica id, this far apart; each later sender filters by what the earlier ones delivered
    /// (announced with `Have`). Default 1,000 (two gossip intervals); 0 serves at once.
    pub catch_up_stagger_ms: u64,
    /// Gossip overlay (docs/design/principles.md, "Dissemination and backpressure"): each tick and
    /// each push sends intervals only to this many randomly chosen up peers (reshuffled every
    /// `overlay_reshuffle_ms`); every other peer gets its interval at the slower
    /// `anti_entropy_interval_ms`, so partitions of the overlay heal. With an overlay, what a delta
    /// brought is also forwarded to the overlay at once. 0 (the default) sends to every peer at
    /// every tick.
    pub gossip_fanout: usize,
    /// How often the overlay is redrawn. Default 5,000.
    pub overlay_reshuffle_ms: u64,
    /// How often peers outside the overlay are served. Default 2,000.
    pub anti_entropy_interval_ms: u64,
    /// A peer the membership layer declared down ([`Replica::member_down`], SWIM) is evicted
    /// from the ack map this long afterwards unless it comes back first, so a dead peer pins
    /// the log (and compaction) for at most this grace period. Default 30,000.
    pub member_down_grace_ms: u64,
    /// A peer that needs a state transfer (new or wiped: no cursor into our log) is bootstrapped
    /// by ONE sender: its senders rank themselves by replica id (as for the catch-up stagger);
    /// rank 0 starts the transfer at once, rank k waits k times this long, and gives up the
    /// transfer if meanwhile the peer's announced context (`Have`, sent by the peer after it
    /// completes a transfer) covers everything we hold — it then gets only deltas from us.
    /// Default 3,000; 0 lets every sender transfer at once (the old behaviour).
    pub bootstrap_stagger_ms: u64,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        Self {
            gossip_interval_ms: 500,
            retransmit_timeout_ms: 2_000,
            retransmit_timeout_max_ms: 8_000,
            peer_evict_after_ms: 300_000,
            hello_attempts: 2,
            message_bytes_target: 1024 * 1024,
            back_propagation_avoidance: true,
            filter_by_peer_context: true,
            have_after_changed_keys: 1024,
            catch_up_stagger_ms: 1_000,
            gossip_fanout: 0,
            overlay_reshuffle_ms: 5_000,
            anti_entropy_interval_ms: 2_000,
            member_down_grace_ms: 30_000,
            bootstrap_stagger_ms: 3_000,
        }
    }
}

/// Counters of what the replica did since it was created (volatile, like the replica).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Non-empty delta-intervals sent.
    pub deltas_sent: u64,
    /// Empty delta-intervals sent (every entry came from the receiver: BP; pitfalls
    /// "BP drain" and "empty delta advances", docs/design/principles.md).
    pub empty_intervals_sent: u64,
    /// Delta-intervals joined.
    pub deltas_applied: u64,
    /// Intervals received that start below our cursor (a duplicate or widened resend).
    pub duplicate_intervals: u64,
    /// Intervals received that start above our cursor (a delta before its causal predecessor):
    /// refused, answered with our real cursor.
    pub gap_intervals: u64,
    /// Acks (and chunk acks/nacks) dropped because they carry another epoch or log id.
    pub acks_stale_epoch: u64,
    /// Retransmit timeouts.
    pub retransmits: u64,
    /// Hellos sent.
    pub hellos_sent: u64,
    /// Outgoing state transfers started.
    pub transfers_started: u64,
    /// Of the transfers started, those because the peer's cursor was below the retained log
    /// start (the log was compacted past it, docs/design/principles.md "Leaving the delta path").
    pub transfers_behind_log: u64,
    /// Transfers not started because the peer's announced context already covered our state
    /// (another sender bootstrapped it).
    pub transfers_avoided: u64,
    /// Outgoing state transfers completed (final chunk acknowledged).
    pub transfers_completed: u64,
    /// Outgoing state transfers given up: no chunk acknowledged for `peer_evict_after_ms`
    /// while the peer was still heard (started over later from a new snapshot).
    pub transfers_abandoned: u64,
    /// Incoming state transfers completed (final chunk applied).
    pub transfers_received: u64,
    /// Transfer chunks sent (retransmissions included).
    pub chunks_sent: u64,
    /// Transfer chunks applied.
    pub chunks_applied: u64,
    /// `ChunkNack`s sent.
    pub chunk_nacks_sent: u64,
    /// `ChunkNack`s received.
    pub chunk_nacks_received: u64,
    /// Duplicate chunks of an already completed transfer (acknowledged again, not applied).
    pub stale_chunks: u64,
    /// Invalid deltas or chunks refused (nothing applied, nothing acknowledged).
    pub rejected: u64,
    /// Peers evicted from the ack map for silence.
    pub evictions: u64,
    /// Remote LWW timestamps too far ahead for our clock (joined, clock not advanced).
    pub hlc_rejected: u64,
    /// `Have` announcements sent.
    pub haves_sent: u64,
    /// Intervals from which the receiver's announced context removed something.
    pub intervals_filtered: u64,
}

/// Evidence that this node's store is a copy restored under its old replica id
/// (docs/design/principles.md, "Never reuse a dot" (c)): a peer holds more of this replica id than
/// the store does — dots above our counter, or a cursor beyond our log end. The host must switch
/// the store to a fresh replica id and epoch before it assigns another dot
/// ([`Replica::take_restored_copy`]).
///
/// A hostile peer can fake this evidence; the worst it can force is what the host does about
/// it: one replica-id change (peers then get a state transfer, and contexts carry one more id).
/// It can never make us reuse a dot or drop data: the old id's dots stay in the context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredCopy {
    /// The peer whose message showed it.
    pub from: PeerId,
    /// What showed it: `"context"` (a `Have`), `"cursor"` (a `Hello`) or `"delta"`/`"chunk"`.
    pub evidence: &'static str,
    /// The seq the peer holds of us (a dot seq, or a log seq for `"cursor"`).
    pub claimed: u64,
    /// What we hold: our max own dot seq, or our log end for `"cursor"`.
    pub local: u64,
}

/// Why a peer's message was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The store's validation refused the content.
    Invalid(Rejected),
    /// The message itself is inconsistent.
    Malformed(&'static str),
}

/// Something the host may want to know or act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaEvent {
    /// A remote delta or chunk changed these keys (for watchers and views).
    Applied {
        /// The sender.
        from: PeerId,
        /// Keys whose values changed.
        changed: crate::model::ChangedKeys,
    },
    /// A peer's message was refused; nothing of it was applied or acknowledged (pitfall
    /// "poison message", docs/design/principles.md).
    Rejected {
        /// The sender.
        from: PeerId,
        /// The message kind.
        kind: &'static str,
        /// Why.
        reason: RejectReason,
    },
    /// A state transfer to a peer started (it is new, evicted, wiped or behind the log start).
    TransferStarted {
        /// The receiver.
        to: PeerId,
        /// The transfer id.
        transfer: u64,
    },
    /// A state transfer to a peer completed.
    TransferCompleted {
        /// The receiver.
        to: PeerId,
        /// The transfer id.
        transfer: u64,
    },
    /// A state transfer from a peer was fully applied.
    TransferReceived {
        /// The sender.
        from: PeerId,
    },
    /// A silent peer was evicted from the ack map.
    PeerEvicted {
        /// The peer.
        peer: PeerId,
    },
    /// Every tracked peer has joined the log below `below`: the host may call
    /// [`StateStore::truncate_log`]`(below)`.
    Compact {
        /// The stable frontier.
        below: u64,
    },
}

/// The replication state machine of one node (quinn-proto/foca style: no I/O, no clock).
///
/// # Call order
/// The host owns the `Replica` and its [`StateStore`], and runs one loop:
/// 1. Create it with [`Replica::new`] at every boot, with an epoch greater than any earlier
///    boot's over the same store (acks echo the epoch and our log id, so an ack from before a
///    restart is recognised and dropped; a wiped store has a new log id anyway).
/// 2. Feed every input with the current [`Now`]: [`Replica::peer_up`] when a connection to a
///    peer is established (sends a Hello), [`Replica::peer_down`] when it is lost,
///    [`Replica::handle_message`] for each decoded message, [`Replica::handle_local_commit`]
///    after local writes were durably committed (the log grew), and [`Replica::handle_timeout`]
///    once the deadline from [`Replica::poll_timeout`] has passed.
/// 3. After each input, drain [`Replica::poll_transmit`] (send each message to its peer, in
///    order) and [`Replica::poll_event`] (act on [`ReplicaEvent::Compact`]; the rest is information),
///    then sleep until the next input or the new [`Replica::poll_timeout`].
///
/// Storage errors returned by any `handle_*`/`peer_up` call are fatal to the node (fail-stop):
/// the store may be unusable; restart instead of continuing.
///
/// # Protocol (docs/design/principles.md, "Replication protocol")
/// * Sender: for each up peer with nothing in flight, every gossip tick: if its cursor `A[j]`
///   is unknown, ask with a Hello (a few times), then fall back to a state transfer; if it has
///   no cursor or `A[j]` is outside the retained log, run a chunked state transfer; otherwise
///   send the interval `[A[j], end)` (BP-filtered, size-bounded; empty if every entry came from
///   `j`). At most one unacknowledged message per peer: a slow peer gets wider intervals.
/// * Receiver: accept an interval only if it starts at or below our durable cursor into that
///   log; join it through the store (which logs only the inflating part and records the cursor
///   in the same transaction), then ack. An interval starting above our cursor is refused and
///   answered with a Hello stating our real cursor.
/// * Compaction: the stable frontier is the minimum cursor of the tracked peers; silent peers
///   are evicted so they do not pin the log.
/// * Redundancy: peers announce their durable context ([`Message::Have`]) after a Hello and after
///   a large join; intervals to a peer leave out, dot by dot, what its announcement proves it
///   has seen (the joined result is unchanged). After a reconnect the peer's senders serve its
///   backlog staggered by rank, so each later one filters what the earlier ones delivered.
///
/// Messages must come only from configured, authenticated peers: a message from an unknown
/// `PeerId` adds it, and it then holds back compaction until it reports or is evicted.
#[derive(Debug)]
pub struct Replica {
    config: ReplicaConfig,
    epoch: u64,
    rng: ChaCha8Rng,
    peers: BTreeMap<PeerId, Peer>,
    incoming: BTreeMap<PeerId, InTransfer>,
    /// An incoming transfer was given up without the store at hand: its staged chunks are
    /// dropped at the next `handle_timeout` (unless another transfer is under way by then).
    unstage: bool,
    /// Per sender, the last transfer `(log, epoch, transfer)` we completed: a duplicate of its
    /// chunks is acknowledged again, never re-applied (that would move our cursor back).
    completed_transfer: BTreeMap<PeerId, (ReplicaId, u64, u64)>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<ReplicaEvent>,
    stats: ReplicaStats,
    boot_ms: Option<u64>,
    next_tick: Option<u64>,
    next_transfer: u64,
    bounds: (u64, u64),
    compact_emitted: u64,
    /// The current gossip overlay (with `gossip_fanout > 0`) and when to redraw it.
    overlay: Vec<PeerId>,
    next_reshuffle: u64,
    next_anti_entropy: u64,
    /// The first evidence that our store is a copy restored under its old id, until taken.
    restored: Option<RestoredCopy>,
}

impl Replica {
    /// A replica for this boot: `epoch` must exceed every earlier boot's epoch over this store;
    /// `seed` drives the only randomness (tick jitter); `peers` are the configured peers, all of
    /// which must report (or be evicted) before the log may be compacted.
    pub fn new(
        config: ReplicaConfig,
        epoch: u64,
        seed: u64,
        peers: impl IntoIterator<Item = PeerId>,
    ) -> Self {
        Self {
            config,
            epoch,
            rng: ChaCha8Rng::seed_from_u64(seed),
            peers: peers.into_iter().map(|p| (p, Peer::new())).collect(),
            incoming: BTreeMap::new(),
            unstage: false,
            completed_transfer: BTreeMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: ReplicaStats::default(),
            boot_ms: None,
            next_tick: None,
            next_transfer: 1,
            bounds: (0, 0),
            compact_emitted: 0,
            overlay: Vec::new(),
            next_reshuffle: 0,
            next_anti_entropy: 0,
            restored: None,
        }
    }

    /// Takes the evidence, if any message so far showed it, that our store is a copy restored
    /// under its old replica id ([`RestoredCopy`]). Check after every handled message: the
    /// host must re-identify the store before it commits another local write (and then start
    /// a new `Replica` with the new epoch).
    pub fn take_restored_copy(&mut self) -> Option<RestoredCopy> {
        self.restored.take()
    }

    fn note_restored(&mut self, from: PeerId, evidence: &'static str, claimed: u64, local: u64) {
        if self.restored.is_none() {
            self.restored = Some(RestoredCopy {
                from,
                evidence,
                claimed,
                local,
            });
        }
    }

    /// This boot's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The configuration.
    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    /// Number of peers with an unacknowledged message in flight.
    pub fn in_flight(&self) -> usize {
        self.peers.values().filter(|p| p.inflight.is_some()).count()
    }

    /// Our knowledge of `peer`'s cursor into our log (`None` when unknown or absent).
    pub fn peer_acked(&self, peer: PeerId) -> Option<u64> {
        match self.peers.get(&peer)?.cursor {
            PeerCursor::At(a) => Some(a),
            PeerCursor::Unknown | PeerCursor::NoCursor => None,
        }
    }

    /// The stable frontier: every tracked peer has durably joined our log below it (peers that
    /// need a state transfer do not pin it; a running transfer pins its starting log end).
    /// `None` until every configured peer has reported since boot or been evicted. Computed
    /// against the log bounds seen at the last call that had the store.
    pub fn stable_frontier(&self) -> Option<u64> {
        let (start, end) = self.bounds;
        let mut min = end;
        for p in self.peers.values() {
            match p.frontier_bound(start, end) {
                Err(()) => return None,
                Ok(Some(b)) => min = min.min(b),
                Ok(None) => {}
            }
        }
        Some(min)
    }

    /// The stable frontier when it is above the log start seen last: the host may truncate the
    /// log below it (also announced once per advance as [`ReplicaEvent::Compact`]).
    pub fn compaction_due(&self) -> Option<u64> {
        self.stable_frontier().filter(|f| *f > self.bounds.0)
    }

    /// A connection to `peer` is up: sends it a Hello with our cursor into its log.
    ///
    /// # Errors
    /// Storage failures (fatal).
    pub fn peer_up<S: StateStore>(
        &mut self,
        now: Now,
        peer: PeerId,
        store: &mut S,
    ) -> Result<(), S::Error> {
        self.start(now.mono_ms);
        let p = self.peer_mut(peer);
        p.up = true;
        p.down_since = None;
        p.reset_link();
        self.send_hello(now.mono_ms, peer, store);
        Ok(())
    }

    /// True when `peers` is not empty and, for each, this store holds everything that peer
    /// held when it first announced its context to us (under its current replica id): a
    /// joining node then knows what its peers knew when it met them.
    pub fn covers_peers<S: StateStore>(&self, peers: &[PeerId], store: &S) -> bool {
        !peers.is_empty()
            && peers.iter().all(|id| {
                self.peers.get(id).is_some_and(|p| {
                    let current = p.incarnation.map(|(r, _)| r);
                    p.first_known
                        .as_ref()
                        .filter(|(r, _)| Some(*r) == current)
                        .is_some_and(|(_, k)| k.diff(store.context()).is_empty())
                })
            })
    }

    /// The connection to `peer` is lost: whatever was in flight to it is forgotten.
    pub fn peer_down(&mut self, now: Now, peer: PeerId) {
        self.start(now.mono_ms);
        // Its transfer to us (if any) restarts from scratch when it is back; do not let it
        // hold back other senders' transfers meanwhile. Its staged chunks are dropped at the
        // next call that has the store (`handle_timeout`), or when a transfer starts.
        if self.incoming.remove(&peer).is_some() {
            self.unstage = true;
        }
        let p = self.peer_mut(peer);
        p.up = false;
        p.reset_link();
    }

    /// The membership layer (SWIM) declared `peer` down: it is taken down like
    /// [`Replica::peer_down`], and evicted from the ack map (so it stops pinning the log)
    /// `member_down_grace_ms` later unless [`Replica::peer_up`] brings it back first.
    pub fn member_down(&mut self, now: Now, peer: PeerId) {
        self.peer_down(now, peer);
        let p = self.peer_mut(peer);
        if p.down_since.is_none() {
            p.down_since = Some(now.mono_ms);
        }
    }

    /// The host durably committed local writes (the log grew). They go out at the next tick,
    /// coalesced with whatever else accumulates until then.
    pub fn handle_local_commit(&mut self, now: Now) {
        self.start(now.mono_ms);
    }

    /// The host durably committed local writes and wants them pushed at once (low latency)
    /// instead of at the next tick: every up peer with nothing in flight is sent its interval
    /// now; a peer with an interval in flight is sent the rest as soon as it acknowledges.
    /// Still at most one unacknowledged message per peer.
    ///
    /// # Errors
    /// Storage failures (fatal).
    pub fn push_local_commit<S: StateStore>(
        &mut self,
        now: Now,
        store: &mut S,
    ) -> Result<(), S::Error> {
        self.start(now.mono_ms);
        self.push_to_overlay(now.mono_ms, None, store)
    }

    /// The gossip overlay in force (every up peer when `gossip_fanout` is 0).
    pub fn overlay(&self) -> Vec<PeerId> {
        if self.config.gossip_fanout == 0 {
            return self
                .peers
                .iter()
                .filter(|(_, p)| p.up)
                .map(|(id, _)| *id)
                .collect();
        }
        self.overlay.clone()
    }

    /// Sends the new part of the log to the overlay peers (except `skip`) that are idle; marks
    /// busy ones to be served when they acknowledge.
    fn push_to_overlay<S: StateStore>(
        &mut self,
        now: u64,
        skip: Option<PeerId>,
        store: &mut S,
    ) -> Result<(), S::Error> {
        self.refresh_overlay(now, false);
        let ids: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(id, p)| {
                p.up && p.tracked
                    && Some(**id) != skip
                    && (self.config.gossip_fanout == 0 || self.overlay.contains(id))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let p = self.peer_mut(id);
            if p.inflight.is_some() {
                p.more = true;
            } else if matches!(p.cursor, PeerCursor::At(_)) && p.transfer.is_none() {
                self.pump(now, id, store)?;
            }
        }
        Ok(())
    }

    /// Redraws the overlay when due (or `force`d), or when one of its peers went down.
    fn refresh_overlay(&mut self, now: u64, force: bool) {
        let fanout = self.config.gossip_fanout;
        if fanout == 0 {
            return;
        }
        let stale = self
            .overlay
            .iter()
            .any(|id| !self.peers.get(id).is_some_and(|p| p.up));
        let up: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.up)
            .map(|(id, _)| *id)
            .collect();
        let short = self.overlay.len() < fanout.min(up.len());
        if !(force || stale || short || now >= self.next_reshuffle) {
            return;
        }
        // A seeded partial shuffle: deterministic for a seed, like everything here.
        let mut pool = up;
        let mut chosen = Vec::with_capacity(fanout);
        while chosen.len() < fanout && !pool.is_empty() {
            let k = self.rng.random_range(0..pool.len());
            chosen.push(pool.swap_remove(k));
        }
        chosen.sort();
        self.overlay = chosen;
        self.next_reshuffle = now.saturating_add(self.config.overlay_reshuffle_ms.max(1));
    }

    /// Handles one message from `from`.
    ///
    /// Never panics on peer input: invalid content is refused, counted and reported as
    /// [`ReplicaEvent::Rejected`].
    ///
    /// # Errors
    /// Storage failures (fatal).
    pub fn handle_message<S: StateStore>(
        &mut self,
        now: Now,
        from: PeerId,
        msg: Message,
        store: &mut S,
    ) -> Result<(), S::Error> {
        self.start(now.mono_ms);
        self.peer_mut(from).heard(now.mono_ms);
        match msg {
            Message::Hello {
                replica,
                epoch,
                resume,
            } => self.on_hello(now, from, (replica, epoch), resume, store),
            Message::Delta {
                epoch,
                log,
                from: start,
                end,
                delta,
            } => self.on_delta(now, from, epoch, log, (start, end), delta, store),
            Message::Ack { epoch, log, upto } => self.on_ack(now, from, epoch, log, upto, store),
            Message::Chunk {
                epoch,
                log,
                transfer,
                index,
                end,
                chunk,
            } => self.on_chunk(now, from, (epoch, log, transfer, index, end), chunk, store),
            Message::ChunkAck {
                epoch,
                transfer,
                index,
            } => self.on_chunk_ack(now, from, epoch, transfer, index, store),
            Message::ChunkNack { epoch, transfer } => {
                self.on_chunk_nack(now, from, epoch, transfer, store)
            }
            Message::Have { replica, ctx } => {
                let me = store.replica_id();
                let (claimed, local) = (ctx.max_seq(me), store.context().max_seq(me));
                if replica != me && claimed > local {
                    self.note_restored(from, "context", claimed, local);
                }
                self.on_have(now.mono_ms, from, replica, ctx, store);
                Ok(())
            }
            Message::Covered { epoch, log, end } => {
                self.on_covered(now, from, epoch, log, end, store)
            }
        }
    }

    /// Runs due timers: retransmissions, then the gossip tick (evictions, intervals, transfers,
    /// compaction). Call when `now.mono_ms >= poll_timeout()`; early calls are harmless.
    ///
    /// # Errors
    /// Storage failures (fatal).
    pub fn handle_timeout<S: StateStore>(
        &mut self,
        now: Now,
        store: &mut S,
    ) -> Result<(), S::Error> {
        self.start(now.mono_ms);
        let t = now.mono_ms;
        let expired: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.inflight.is_some_and(|(_, d)| d <= t))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.retransmit(t, id, store)?;
        }
        if self.unstage && self.incoming.is_empty() {
            store.clear_staged()?;
        }
        self.unstage = false;
        // Snapshots of transfers that ended any other way (a link reset, a new core).
        let peers = &self.peers;
        store.release_transfer_snapshots(&|peer| {
            peers.get(&peer).is_some_and(|p| p.transfer.is_some())
        });
        if self.next_tick.is_some_and(|n| n <= t) {
            let jitter = self
                .rng
                .random_range(0..=self.config.gossip_interval_ms / 8);
            self.next_tick = Some(
                t.saturating_add(self.config.gossip_interval_ms.max(1))
                    .saturating_add(jitter),
            );
            self.gossip_round(t, store)?;
        }
        Ok(())
    }

    /// The next message to send, in order.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// When [`Replica::handle_timeout`] should next be called (monotonic ms); `None` before the
    /// first input.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.peers
            .values()
            .filter_map(|p| p.inflight.map(|(_, d)| d))
            .chain(self.next_tick)
            .min()
    }

    /// The next event, in order.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ReplicaEvent> {
        self.events.pop_front()
    }

    // ---- internals -------------------------------------------------------------------------

    fn start(&mut self, now: u64) {
        if self.boot_ms.is_none() {
            self.boot_ms = Some(now);
            let first = self.rng.random_range(0..=self.config.gossip_interval_ms);
            self.next_tick = Some(now.saturating_add(first));
        }
    }

    fn peer_mut(&mut self, peer: PeerId) -> &mut Peer {
        self.peers.entry(peer).or_insert_with(Peer::new)
    }

    fn rto(&self, timeouts_in_row: u32) -> u64 {
        let base = self.config.retransmit_timeout_ms.max(1);
        base.saturating_mul(1u64 << timeouts_in_row.min(16))
            .min(self.config.retransmit_timeout_max_ms.max(base))
    }

    fn send(&mut self, to: PeerId, msg: Message) {
        self.transmits.push_back(Transmit { to, msg });
    }

    fn send_hello<S: StateStore>(&mut self, now: u64, to: PeerId, store: &S) {
        let msg = Message::Hello {
            replica: store.replica_id(),
            epoch: self.epoch,
            resume: store.peer_cursor(to),
        };
        self.peer_mut(to).hello_sent_at = Some(now);
        self.stats.hellos_sent += 1;
        self.send(to, msg);
        self.send_have(to, store);
    }

    fn send_have<S: StateStore>(&mut self, to: PeerId, store: &S) {
        self.stats.haves_sent += 1;
        self.send(
            to,
            Message::Have {
                replica: store.replica_id(),
                ctx: store.context().clone(),
            },
        );
    }

    /// After a large join, tells every other up peer what we now hold.
    fn announce_after_join<S: StateStore>(&mut self, origin: PeerId, changed: usize, store: &S) {
        if changed < self.config.have_after_changed_keys.max(1) {
            return;
        }
        let to: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(id, p)| **id != origin && p.up)
            .map(|(id, _)| *id)
            .collect();
        for id in to {
            self.send_have(id, store);
        }
    }

    fn gossip_round<S: StateStore>(&mut self, now: u64, store: &mut S) -> Result<(), S::Error> {
        let boot = self.boot_ms.unwrap_or(now);
        let evict_after = self.config.peer_evict_after_ms;
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        self.refresh_overlay(now, false);
        let anti_entropy = self.config.gossip_fanout == 0 || now >= self.next_anti_entropy;
        if anti_entropy {
            self.next_anti_entropy =
                now.saturating_add(self.config.anti_entropy_interval_ms.max(1));
        }
        for id in ids {
            let grace = self.config.member_down_grace_ms;
            let p = self.peer_mut(id);
            let silent = now.saturating_sub(p.last_heard.unwrap_or(boot));
            let declared_down = p
                .down_since
                .is_some_and(|t| !p.up && now >= t.saturating_add(grace));
            if declared_down {
                p.down_since = None;
            }
            if p.tracked && (silent > evict_after || declared_down) {
                p.tracked = false;
                p.cursor = PeerCursor::Unknown;
                p.hellos_unanswered = 0;
                p.reset_link();
                self.stats.evictions += 1;
                self.events
                    .push_back(ReplicaEvent::PeerEvicted { peer: id });
            }
            // Outside the overlay, a peer in the plain delta phase waits for anti-entropy;
            // Hellos and transfers are never delayed.
            let p = self.peer_mut(id);
            let delta_phase = p.transfer.is_none()
                && p.tracked
                && matches!(p.cursor, PeerCursor::At(_))
                && p.serve_after.is_none();
            if delta_phase && !anti_entropy && !self.overlay.contains(&id) {
                continue;
            }
            self.pump(now, id, store)?;
        }
        self.bounds = store.log_bounds();
        if let Some(f) = self.compaction_due() {
            if f > self.compact_emitted {
                self.compact_emitted = f;
                self.events.push_back(ReplicaEvent::Compact { below: f });
            }
        }
        Ok(())
    }

    /// Sends `peer` what it lacks, if it is up and nothing is in flight to it.
    fn pump<S: StateStore>(&mut self, now: u64, id: PeerId, store: &mut S) -> Result<(), S::Error> {
        let (start, end) = store.log_bounds();
        self.bounds = (start, end);
        let rto = self.config.retransmit_timeout_ms;
        let attempts = self.config.hello_attempts;
        let Some(p) = self.peers.get_mut(&id) else {
            return Ok(());
        };
        if !p.up || p.inflight.is_some() {
            return Ok(());
        }
        if p.transfer.is_some() {
            return self.send_chunk(now, id, store);
        }
        if p.serve_after.is_some_and(|t| now < t) {
            return Ok(());
        }
        p.serve_after = None;
        if !p.tracked || p.cursor == PeerCursor::Unknown {
            // Ask for the cursor before paying for a transfer; an evicted peer gets only Hellos
            // until it speaks again.
            if p.hello_sent_at.is_some_and(|t| now < t.saturating_add(rto)) {
                return Ok(());
            }
            if p.hellos_unanswered < attempts {
                p.hellos_unanswered += 1;
                self.send_hello(now, id, store);
                return Ok(());
            }
            if !p.tracked {
                return Ok(());
            }
            return self.start_transfer(now, id, store);
        }
        match p.cursor {
            PeerCursor::At(a) if a == end => {
                p.more = false;
                Ok(())
            }
            PeerCursor::At(a) if a >= start && a < end => {
                self.send_interval(now, id, a, end, store)
            }
            PeerCursor::At(a) if a < start => {
                self.stats.transfers_behind_log += 1;
                self.start_transfer(now, id, store)
            }
            PeerCursor::At(_) | PeerCursor::NoCursor | PeerCursor::Unknown => {
                if self.skip_covered_bootstrap(now, id, store) {
                    return Ok(());
                }
                self.start_transfer(now, id, store)
            }
        }
    }

    fn send_interval<S: StateStore>(
        &mut self,
        now: u64,
        id: PeerId,
        from: u64,
        log_end: u64,
        store: &mut S,
    ) -> Result<(), S::Error> {
        // Not below `bp_from`: entries tagged with `id` there may be a previous replica's.
        let bp_from = self.peers.get(&id).map_or(u64::MAX, |p| p.bp_from);
        let exclude = (self.config.back_propagation_avoidance && from >= bp_from).then_some(id);
        let interval = store.log_interval(from, exclude, self.config.message_bytes_target)?;
        if interval.end <= from {
            // No progress is possible (a store bug); do not spin.
            return Ok(());
        }
        let known = self
            .peers
            .get(&id)
            .filter(|_| self.config.filter_by_peer_context)
            .and_then(Peer::known_context);
        let delta = match (interval.delta, known) {
            (Some(d), Some(seen)) => {
                let (d, filtered) = without_seen(d, seen);
                self.stats.intervals_filtered += u64::from(filtered);
                Some(d)
            }
            (d, _) => d,
        };
        match delta {
            Some(_) => self.stats.deltas_sent += 1,
            None => self.stats.empty_intervals_sent += 1,
        }
        let msg = Message::Delta {
            epoch: self.epoch,
            log: store.replica_id(),
            from,
            end: interval.end,
            delta: delta.unwrap_or_default(),
        };
        let rto = self.rto(self.peers.get(&id).map_or(0, |p| p.timeouts_in_row));
        let p = self.peer_mut(id);
        p.inflight = Some((
            Inflight::Delta {
                from,
                end: interval.end,
            },
            now.saturating_add(rto),
        ));
        p.more = interval.end < log_end;
        self.send(id, msg);
        Ok(())
    }

    fn start_transfer<S: StateStore>(
        &mut self,
        now: u64,
        id: PeerId,
        store: &mut S,
    ) -> Result<(), S::Error> {
        let transfer = self.next_transfer;
        self.next_transfer += 1;
        // The context and a snapshot of the state it describes are taken together (nothing
        // commits in between): every chunk is read from that snapshot when it is sent, so the
        // transfer is one consistent state (docs/design/principles.md, "State transfer")
        // whatever this node joins while it is under way, and only the chunk in flight is held.
        // Each chunk is within the message target (large rows in dot slices, marks in pages).
        // Every chunk carries the transfer's context: the rows and marks get what is left of the
        // target (at least a quarter of it, so a transfer always progresses).
        let ctx = store.transfer_context()?;
        store.pin_transfer_snapshot(id)?;
        let (_, end) = store.log_bounds();
        let ctx_bytes = crate::codec::encoded_len("transfer context", &ctx).unwrap_or(0);
        let target = self
            .config
            .message_bytes_target
            .saturating_sub(ctx_bytes)
            .max(self.config.message_bytes_target / 4);
        self.peer_mut(id).transfer = Some(OutTransfer::new(transfer, ctx, end, target, now));
        self.stats.transfers_started += 1;
        self.events
            .push_back(ReplicaEvent::TransferStarted { to: id, transfer });
        self.send_chunk(now, id, store)
    }

    /// Reads the transfer's next chunk from its snapshot and sends it (nothing once the last
    /// chunk was sent).
    fn send_chunk<S: StateStore>(
        &mut self,
        now: u64,
        id: PeerId,
        store: &mut S,
    ) -> Result<(), S::Error> {
        let rto = self.rto(self.peers.get(&id).map_or(0, |p| p.timeouts_in_row));
        let epoch = self.epoch;
        let log = store.replica_id();
        let Some(p) = self.peers.get_mut(&id) else {
            return Ok(());
        };
        let Some(t) = p.transfer.as_mut() else {
            return Ok(());
        };
        if t.built_last {
            return Ok(());
        }
        if !store.has_transfer_snapshot(id) {
            // The store dropped the snapshot: the transfer starts over from a new one.
            p.transfer = None;
            return self.pump(now, id, store);
        }
        let (rows, marks) = read_piece(store, id, &t.pos, t.target)?;
        let sent = t.chunk(epoch, log, rows, marks);
        t.pos = sent.next.clone();
        t.index = t.index.saturating_add(1);
        t.built_last = sent.last;
        let msg = sent.msg.clone();
        p.inflight = Some((
            Inflight::Chunk {
                transfer: t.id,
                index: sent.index,
            },
            now.saturating_add(rto),
        ));
        t.sent = Some(sent);
        self.stats.chunks_sent += 1;
        self.send(id, msg);
        Ok(())
    }

    fn retransmit<S: StateStore>(
        &mut self,
        now: u64,
        id: PeerId,
        store: &mut S,
    ) -> Result<(), S::Error> {
        self.stats.retransmits += 1;
        let stall = self.config.peer_evict_after_ms;
        let p = self.peer_mut(id);
        p.timeouts_in_row = p.timeouts_in_row.saturating_add(1);
        let Some((what, _)) = p.inflight.take() else {
            return Ok(());
        };
        match what {
            // Rebuild from A[j]: the interval widens with whatever was logged since.
            Inflight::Delta { .. } => self.pump(now, id, store),
            Inflight::Chunk { .. } => {
                if p
                    .transfer
                    .as_ref()
                    .is_some_and(|t| now >= t.progress_at.saturating_add(stall))
                {
                    // No chunk acknowledged for that long while the peer is still heard: give
                    // the transfer (and its snapshot) up, and start over after as long again.
                    p.transfer = None;
                    p.serve_after = Some(now.saturating_add(stall));
                    self.stats.transfers_abandoned += 1;
                    store.release_transfer_snapshots(&|peer| peer != id);
                    return Ok(());
                }
                let timeouts = p.timeouts_in_row;
                let Some(msg) = p
                    .transfer
                    .as_ref()
                    .and_then(|t| t.sent.as_ref())
                    .map(|s| s.msg.clone())
                else {
                    return self.pump(now, id, store);
                };
                let deadline = now.saturating_add(self.rto(timeouts));
                let p = self.peer_mut(id);
                p.inflight = Some((what, deadline));
                self.stats.chunks_sent += 1;
                self.send(id, msg);
                Ok(())
            }
        }
    }

    fn on_hello<S: StateStore>(
        &mut self,
        now: Now,
        from: PeerId,
        incarnation: (ReplicaId, u64),
        resume: Option<(ReplicaId, u64)>,
        store: &mut S,
    ) -> Result<(), S::Error> {
        let me = store.replica_id();
        let (log_start, log_end) = store.log_bounds();
        if let Some((_, seq)) = resume.filter(|(log, seq)| *log == me && *seq > log_end) {
            // The peer joined our log beyond its end: our log was rolled back.
            self.note_restored(from, "cursor", seq, log_end);
        }
        let quiet = self.config.retransmit_timeout_ms;
        let t = now.mono_ms;
        let p = self.peer_mut(from);
        if p.incarnation.is_none_or(|(r, _)| r != incarnation.0) {
            // A replica id we have not served under this peer id yet: what the log tags with
            // the peer id may have come from a previous replica (a restore from a snapshot, a
            // wipe), which does not hold it, so back-propagation avoidance applies only to
            // what we log from now on. (Unknown after our own restart too: then the peer gets
            // back, once, what it sent us between its cursor and our log end.)
            p.bp_from = log_end;
        }
        if p.incarnation != Some(incarnation) {
            // A new incarnation lost whatever we had in flight to it.
            p.incarnation = Some(incarnation);
            p.reset_link();
        } else if matches!(p.inflight, Some((Inflight::Delta { .. }, _))) {
            // The Hello answers our interval (it started above the peer's cursor).
            p.inflight = None;
        }
        p.cursor = match resume {
            Some((log, seq)) if log == me => PeerCursor::At(seq),
            _ => PeerCursor::NoCursor,
        };
        if matches!(p.cursor, PeerCursor::At(a) if a >= log_start) {
            p.end_bootstrap_deferral();
        }
        p.hellos_unanswered = 0;
        p.bootstrap_rank = 0;
        let backlog = matches!(p.cursor, PeerCursor::At(a) if a < store.log_bounds().1);
        let bootstrap = p.cursor == PeerCursor::NoCursor;
        let reply = p.hello_sent_at.is_none_or(|s| t >= s.saturating_add(quiet));
        if bootstrap && self.config.bootstrap_stagger_ms > 0 {
            // ONE sender bootstraps a new or wiped peer: rank 0 (by replica id among its up
            // senders we know of) now, the others later and only if still needed.
            let rank = self
                .peers
                .iter()
                .filter(|(id, q)| {
                    **id != from && q.up && q.incarnation.is_some_and(|(r, _)| r < me)
                })
                .count() as u64;
            let stagger = self.config.bootstrap_stagger_ms;
            let p = self.peer_mut(from);
            p.bootstrap_rank = rank;
            p.serve_after = Some(t.saturating_add(rank.saturating_mul(stagger)));
        } else if backlog && self.config.catch_up_stagger_ms > 0 {
            // Our rank among the peer's other senders we know of (by replica id, which every
            // node orders the same way): rank k serves it k staggers after the reconnect.
            let rank = self
                .peers
                .iter()
                .filter(|(id, q)| {
                    **id != from && q.up && q.incarnation.is_some_and(|(r, _)| r < me)
                })
                .count() as u64;
            self.peer_mut(from).serve_after =
                Some(t.saturating_add(rank.saturating_mul(self.config.catch_up_stagger_ms)));
        }
        if reply {
            self.send_hello(t, from, store);
        }
        // The peer is served at our next (randomly phased) tick, not at once: after a heal every
        // peer would otherwise push the same backlog at the same moment, while this way the
        // first delivery's `Have` reaches the others before their turn.
        Ok(())
    }

    fn on_have<S: StateStore>(
        &mut self,
        now: u64,
        from: PeerId,
        replica: ReplicaId,
        ctx: tidemark_crdts::CausalContext,
        store: &S,
    ) {
        let p = self.peer_mut(from);
        match &mut p.known {
            Some((r, known)) if *r == replica => {
                known.join(&ctx);
            }
            _ => {
                p.first_known = Some((replica, ctx.clone()));
                p.known = Some((replica, ctx));
            }
        }
        self.skip_covered_bootstrap(now, from, store);
    }

    /// A peer waiting for a deferred bootstrap (rank > 0) whose announced context covers our
    /// whole state was bootstrapped by another sender: it gets deltas from our log end on, no
    /// transfer. (Joining our state into its own would change nothing: every dot we hold or
    /// removed, it has seen.) Returns whether it was skipped.
    fn skip_covered_bootstrap<S: StateStore>(&mut self, _now: u64, id: PeerId, store: &S) -> bool {
        let (_, end) = store.log_bounds();
        let Some(p) = self.peers.get_mut(&id) else {
            return false;
        };
        let waiting = p.cursor == PeerCursor::NoCursor
            && p.bootstrap_rank > 0
            && p.transfer.is_none()
            && p.inflight.is_none();
        if !waiting {
            return false;
        }
        let covered = p
            .known_context()
            .is_some_and(|k| store.context().diff(k).is_empty());
        if covered {
            p.cursor_into_log(end);
            self.stats.transfers_avoided += 1;
            let log = store.replica_id();
            let epoch = self.epoch;
            self.send(id, Message::Covered { epoch, log, end });
        }
        covered
    }

    /// A sender says our context covers its state up to `end`: record the cursor (an empty
    /// join, which records it durably) and acknowledge.
    fn on_covered<S: StateStore>(
        &mut self,
        now: Now,
        from: PeerId,
        epoch: u64,
        log: ReplicaId,
        end: u64,
        store: &mut S,
    ) -> Result<(), S::Error> {
        let current = self
            .peers
            .get(&from)
            .and_then(|p| p.incarnation)
            .is_none_or(|(r, _)| r == log);
        if !current {
            return Ok(());
        }
        let have = store
            .peer_cursor(from)
            .filter(|(l, _)| *l == log)
            .map(|(_, c)| c);
        if have.is_none_or(|c| c < end) {
            let empty = crate::model::Delta::default();
            if let Err(reason) = store.apply_remote(from, empty, Some((log, end)), now.wall_ms)? {
                self.reject(from, "covered", RejectReason::Invalid(reason));
                return Ok(());
            }
        }
        let upto = have.map_or(end, |c| c.max(end));
        self.send(from, Message::Ack { epoch, log, upto });
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn on_delta<S: StateStore>(
        &mut self,
        now: Now,
        from: PeerId,
        epoch: u64,
        log: ReplicaId,
        (start, end): (u64, u64),
        delta: crate::model::Delta,
        store: &mut S,
    ) -> Result<(), S::Error> {
        if end < start {
            self.reject(
                from,
                "delta",
                RejectReason::Malformed("interval ends before it starts"),
            );
            return Ok(());
        }
        let cursor = store
            .peer_cursor(from)
            .filter(|(l, _)| *l == log)
            .map(|(_, c)| c);
        let Some(cursor) = cursor.filter(|c| start <= *c) else {
            // A delta before its causal predecessor (or into a log we never joined): joining it
            // could expose effects without their causes. Tell the sender where we really are.
            self.stats.gap_intervals += 1;
            self.send_hello(now.mono_ms, from, store);
            return Ok(());
        };
        if start < cursor {
            self.stats.duplicate_intervals += 1;
        }
        if end <= cursor {
            self.send(
                from,
                Message::Ack {
                    epoch,
                    log,
                    upto: cursor,
                },
            );
            return Ok(());
        }
        // Tag what we log by its origin replica, not only by the sending peer: a late interval
        // from a previous incarnation of `from` (wiped: another log id than its current one)
        // is tagged with that old incarnation, so back-propagation avoidance does not keep it
        // from the new incarnation, which lost it. No cursor is recorded for the old log.
        let stale = self
            .peers
            .get(&from)
            .and_then(|p| p.incarnation)
            .is_some_and(|(current, _)| current != log);
        let (tag, cursor) = if stale {
            (origin_tag(log), None)
        } else {
            (from, Some((log, end)))
        };
        match store.apply_remote(tag, delta, cursor, now.wall_ms)? {
            Ok(outcome) => {
                self.stats.deltas_applied += 1;
                self.stats.hlc_rejected =
                    self.stats.hlc_rejected.saturating_add(outcome.hlc_rejected);
                self.announce_after_join(from, outcome.changed.len(), store);
                if !outcome.changed.is_empty() {
                    self.events.push_back(ReplicaEvent::Applied {
                        from,
                        changed: outcome.changed,
                    });
                }
                let upto = store
                    .peer_cursor(from)
                    .filter(|(l, _)| *l == log)
                    .map_or(end, |(_, c)| c.max(end));
                self.send(from, Message::Ack { epoch, log, upto });
                if self.config.gossip_fanout > 0 {
                    // Relay what we just learned along the overlay now, not at the next tick.
                    self.push_to_overlay(now.mono_ms, Some(from), store)?;
                }
            }
            Err(reason) => self.reject(from, "delta", RejectReason::Invalid(reason)),
        }
        Ok(())
    }

    fn on_ack<S: StateStore>(
        &mut self,
        now: Now,
        from: PeerId,
        epoch: u64,
        log: ReplicaId,
        upto: u64,
        store: &mut S,
    ) -> Result<(), S::Error> {
        if epoch != self.epoch || log != store.replica_id() {
            self.stats.acks_stale_epoch += 1;
            return Ok(());
        }
        let log_start = store.log_bounds().0;
        let p = self.peer_mut(from);
        match p.cursor {
            PeerCursor::At(a) if upto <= a => {}
            PeerCursor::At(_) => p.cursor = PeerCursor::At(upto),
            // It needs no transfer from us after all when the cursor is in our log.
            PeerCursor::Unknown | PeerCursor::NoCursor if upto >= log_start => {
                p.cursor_into_log(upto);
            }
            PeerCursor::Unknown | PeerCursor::NoCursor => p.cursor = PeerCursor::At(upto),
        }
        p.hellos_unanswered = 0;
        if let Some((Inflight::Delta { end, .. }, _)) = p.inflight {
            if upto >= end {
                p.inflight = None;
                p.timeouts_in_row = 0;
                if p.more {
                    return self.pump(now.mono_ms, from, store);
                }
            }
        }
        Ok(())
    }

    fn on_chunk<S: StateStore>(
        &mut self,
        now: Now,
        from: PeerId,
        (epoch, log, transfer, index, end): (u64, ReplicaId, u64, u32, u64),
        chunk: crate::model::StateChunk,
        store: &mut S,
    ) -> Result<(), S::Error> {
        if self.completed_transfer.get(&from) == Some(&(log, epoch, transfer)) {
            self.stats.stale_chunks += 1;
            self.ack_chunk(from, epoch, transfer, index);
            return Ok(());
        }
        let same = self
            .incoming
            .get(&from)
            .filter(|s| s.is(epoch, log, transfer))
            .map(|s| s.next);
        if let Some(next) = same {
            if index < next {
                // A duplicate of a chunk already applied: acknowledge it again.
                self.ack_chunk(from, epoch, transfer, index);
                return Ok(());
            }
        }
        let expected = match same {
            Some(next) => index == next,
            None => index == 0,
        };
        // One bootstrap at a time: while another sender's transfer is under way, a new one is
        // refused at its first chunk (the sender retries later, by when ours may cover it).
        let busy = same.is_none() && self.incoming.keys().any(|p| *p != from);
        if !expected || busy {
            self.stats.chunk_nacks_sent += 1;
            self.send(from, Message::ChunkNack { epoch, transfer });
            return Ok(());
        }
        let last = chunk.last;
        let id = (log, epoch, transfer);
        let failed = match self.incoming.remove(&from) {
            Some(s) if same.is_some() => s.failed,
            _ => None,
        };
        if !last {
            // Staged in the store until the last chunk: the chunks are joined together, in one
            // durable join, so no part of the transfer is applied or forwarded without the rest
            // of its state (and this node holds no chunk in memory meanwhile). A chunk that
            // cannot be staged fails the transfer, which is rejected at its last chunk.
            let failed = match failed {
                Some(reason) => Some(reason),
                None => store.stage_chunk(from, id, index, chunk)?.err(),
            };
            self.stats.chunks_applied += 1;
            self.incoming.insert(
                from,
                InTransfer {
                    epoch,
                    log,
                    transfer,
                    next: index.saturating_add(1),
                    failed,
                },
            );
            self.ack_chunk(from, epoch, transfer, index);
            return Ok(());
        }
        let cursor = last.then_some((log, end));
        let applied = match failed {
            None => store.apply_staged(from, id, index, chunk, cursor, now.wall_ms)?,
            Some(reason) => {
                store.clear_staged()?;
                Err(reason)
            }
        };
        match applied {
            Ok(outcome) => {
                self.stats.chunks_applied += 1;
                self.stats.hlc_rejected =
                    self.stats.hlc_rejected.saturating_add(outcome.hlc_rejected);
                self.announce_after_join(from, outcome.changed.len(), store);
                if !outcome.changed.is_empty() {
                    self.events.push_back(ReplicaEvent::Applied {
                        from,
                        changed: outcome.changed,
                    });
                }
                self.completed_transfer.insert(from, (log, epoch, transfer));
                // Tell our other senders what we now hold, so a deferred bootstrap from them
                // is given up (one transfer, then deltas).
                let others: Vec<PeerId> = self
                    .peers
                    .iter()
                    .filter(|(id, p)| **id != from && p.up)
                    .map(|(id, _)| *id)
                    .collect();
                for id in others {
                    self.send_have(id, store);
                }
                self.stats.transfers_received += 1;
                self.events
                    .push_back(ReplicaEvent::TransferReceived { from });
                self.ack_chunk(from, epoch, transfer, index);
            }
            Err(reason) => {
                self.incoming.remove(&from);
                self.reject(from, "chunk", RejectReason::Invalid(reason));
            }
        }
        Ok(())
    }

    fn on_chunk_ack<S: StateStore>(
        &mut self,
        now: Now,
        from: PeerId,
        epoch: u64,
        transfer: u64,
        index: u32,
        store: &mut S,
    ) -> Result<(), S::Error> {
        if epoch != self.epoch {
            self.stats.acks_stale_epoch += 1;
            return Ok(());
        }
        let p = self.peer_mut(from);
        let Some(t) = p.transfer.as_mut() else {
            return Ok(());
        };
        let Some(sent) = t
            .sent
            .as_ref()
            .filter(|s| t.id == transfer && s.index == index)
        else {
            return Ok(());
        };
        p.inflight = None;
        p.timeouts_in_row = 0;
        p.hellos_unanswered = 0;
        if sent.last {
            let end = t.end;
            p.transfer = None;
            store.release_transfer_snapshots(&|peer| peer != from);
            // A completed transfer is authoritative (the receiver recorded exactly `end`), which
            // also repairs a cursor that was ever reported beyond our log.
            // A late cursorless Hello during the transfer may have set a bootstrap deferral:
            // it must not hold back the rest of the log.
            p.cursor_into_log(end);
            p.more = true;
            self.stats.transfers_completed += 1;
            self.events
                .push_back(ReplicaEvent::TransferCompleted { to: from, transfer });
        } else {
            t.sent = None;
            t.progress_at = now.mono_ms;
        }
        self.pump(now.mono_ms, from, store)
    }

    fn on_chunk_nack<S: StateStore>(
        &mut self,
        now: Now,
        from: PeerId,
        epoch: u64,
        transfer: u64,
        store: &mut S,
    ) -> Result<(), S::Error> {
        if epoch != self.epoch {
            self.stats.acks_stale_epoch += 1;
            return Ok(());
        }
        self.stats.chunk_nacks_received += 1;
        let stagger = self.config.bootstrap_stagger_ms.max(1);
        let p = self.peer_mut(from);
        if p.transfer.as_ref().is_some_and(|t| t.id == transfer) {
            // Refused at its first chunk: the peer is being bootstrapped by another sender.
            // Retry after the stagger (by then its `Have` may cover us: no transfer at all).
            let first = p
                .transfer
                .as_ref()
                .and_then(|t| t.sent.as_ref())
                .is_some_and(|s| s.index == 0);
            p.transfer = None;
            p.inflight = None;
            store.release_transfer_snapshots(&|peer| peer != from);
            if first {
                p.serve_after = Some(now.mono_ms.saturating_add(stagger));
                p.bootstrap_rank = p.bootstrap_rank.max(1);
                return Ok(());
            }
            return self.pump(now.mono_ms, from, store);
        }
        Ok(())
    }

    fn ack_chunk(&mut self, to: PeerId, epoch: u64, transfer: u64, index: u32) {
        self.send(
            to,
            Message::ChunkAck {
                epoch,
                transfer,
                index,
            },
        );
    }

    fn reject(&mut self, from: PeerId, kind: &'static str, reason: RejectReason) {
        if let RejectReason::Invalid(Rejected::ForgedOwnDot { claimed, local }) = &reason {
            // Refused (never joined under our id), and evidence we may be a restored copy.
            self.note_restored(from, kind, *claimed, *local);
        }
        self.stats.rejected += 1;
        self.events
            .push_back(ReplicaEvent::Rejected { from, kind, reason });
    }
}

/// The log tag of entries that came from a previous incarnation (replica id `log`) of a peer:
/// never equal to a peer's id in practice, so BP never excludes them.
pub(crate) fn origin_tag(log: ReplicaId) -> PeerId {
    let x = log.0;
    PeerId(((x >> 64) as u64 ^ x as u64).rotate_left(17) ^ 0x7469_6465_6d61_726b)
}

/// Leaves out of `delta` what a peer whose context includes `seen` has already seen: entries'
/// dots in `seen`, and those same dots from the context (the digest filter of
/// docs/design/principles.md "State transfer", without the live-dot part). For every state whose
/// context includes `seen`, joining the result gives the same state, the same context and the same
/// inflation as joining `delta`: a dot both sides know is kept iff the receiver holds it, with or
/// without it in the delta. Dots the delta's context holds but its store does not (removals) are
/// always kept. Returns whether anything was left out.
pub(crate) fn without_seen(
    delta: crate::model::Delta,
    seen: &tidemark_crdts::CausalContext,
) -> (crate::model::Delta, bool) {
    use tidemark_crdts::{Causal, DotMap, DotStore};
    let crate::model::Delta { state, marks } = delta;
    let known = state.store.dots().intersection(seen);
    if known.is_empty() {
        return (crate::model::Delta { state, marks }, false);
    }
    let mut store = DotMap::default();
    for (key, entry) in state.store.iter() {
        store.set(key.clone(), entry.unseen_by(&known));
    }
    let ctx = state.ctx.diff(&known);
    (
        crate::model::Delta {
            state: Causal { store, ctx },
            marks,
        },
        true,
    )
}

#[cfg(test)]
mod overlay_tests {
    use super::*;
    use crate::limits::Limits;
    use crate::proto::tests::TestStore as MemStateStore;
    use tidemark_crdts::{Key, KeyKind, Mutation};

    fn at(t: u64) -> Now {
        Now {
            mono_ms: t,
            wall_ms: 1_700_000_000_000 + t,
        }
    }

    fn deltas_to(replica: &mut Replica) -> Vec<PeerId> {
        std::iter::from_fn(|| replica.poll_transmit())
            .filter(|t| matches!(t.msg, Message::Delta { .. }))
            .map(|t| t.to)
            .collect()
    }

    /// With a fanout of 1 among 3 peers, a local commit goes at once to exactly the overlay
    /// peer; the others get it only at the next anti-entropy round.
    #[test]
    fn a_commit_is_pushed_to_the_overlay_at_once_and_to_the_rest_by_anti_entropy() {
        let cfg = ReplicaConfig {
            gossip_interval_ms: 100,
            gossip_fanout: 1,
            anti_entropy_interval_ms: 2_000,
            overlay_reshuffle_ms: 60_000,
            catch_up_stagger_ms: 0,
            ..ReplicaConfig::default()
        };
        let peers = [PeerId(1), PeerId(2), PeerId(3)];
        let mut store = MemStateStore::new(ReplicaId(1000), Limits::default());
        let me = store.replica_id();
        let mut r = Replica::new(cfg, 1, 7, peers);
        for p in peers {
            r.peer_up(at(0), p, &mut *store).expect("mem");
            let hello = Message::Hello {
                replica: ReplicaId(u128::from(p.0) + 2000),
                epoch: 1,
                resume: Some((me, 0)),
            };
            r.handle_message(at(1), p, hello, &mut *store).expect("mem");
        }
        r.handle_timeout(at(200), &mut *store).expect("mem");
        assert!(deltas_to(&mut r).is_empty(), "nothing to send yet");
        store
            .apply_local(
                &[(Key::new(KeyKind::MvReg, "k"), Mutation::Set("\"v\"".into()))],
                1_700_000_000_300,
            )
            .expect("mem");
        r.push_local_commit(at(300), &mut *store).expect("mem");
        let overlay = r.overlay();
        assert_eq!(overlay.len(), 1);
        assert_eq!(
            deltas_to(&mut r),
            overlay,
            "pushed at once, to the overlay only"
        );
        for t in (400..1_900).step_by(100) {
            r.handle_timeout(at(t), &mut *store).expect("mem");
            assert!(
                deltas_to(&mut r).is_empty(),
                "no delta outside anti-entropy at {t}"
            );
        }
        let mut rest = Vec::new();
        for t in (1_900..2_600).step_by(100) {
            r.handle_timeout(at(t), &mut *store).expect("mem");
            rest.extend(deltas_to(&mut r));
        }
        // (The overlay peer, which never acknowledged, may get a retransmission meanwhile.)
        rest.retain(|p| !overlay.contains(p));
        rest.sort();
        let expected: Vec<PeerId> = peers.into_iter().filter(|p| !overlay.contains(p)).collect();
        assert_eq!(rest, expected, "anti-entropy serves the others");
    }
}

#[cfg(test)]
mod origin_tag_tests {
    use super::*;
    use crate::limits::Limits;
    use crate::proto::tests::TestStore as MemStateStore;
    use tidemark_crdts::{Key, KeyKind, Mutation};

    const WALL: u64 = 1_700_000_000_000;

    fn at(t: u64) -> Now {
        Now {
            mono_ms: t,
            wall_ms: WALL + t,
        }
    }

    fn keys(d: &Option<crate::model::Delta>) -> Vec<String> {
        d.as_ref()
            .map(|d| d.state.store.iter().map(|(k, _)| k.name.clone()).collect())
            .unwrap_or_default()
    }

    /// A late interval from a wiped peer's previous incarnation is logged under that old
    /// incarnation, so the intervals sent to the peer's new incarnation include it (BP only
    /// leaves out what the current incarnation itself sent).
    #[test]
    fn a_late_delta_from_a_wiped_incarnation_is_not_held_back_from_the_new_one() {
        let p = PeerId(5);
        let (old_log, new_log) = (ReplicaId(2000), ReplicaId(3000));
        let mut old = MemStateStore::new(old_log, Limits::default());
        let set = |name: &str| {
            (
                Key::new(KeyKind::MvReg, name),
                Mutation::Set("\"v\"".into()),
            )
        };
        old.apply_local(&[set("k1")], WALL).expect("mem");
        let first = old.log_interval(0, None, 1 << 20).expect("mem");
        old.apply_local(&[set("k2")], WALL + 1).expect("mem");
        let late = old.log_interval(first.end, None, 1 << 20).expect("mem");

        let mut store = MemStateStore::new(ReplicaId(1000), Limits::default());
        let mut r = Replica::new(ReplicaConfig::default(), 1, 3, [p]);
        r.peer_up(at(0), p, &mut *store).expect("mem");
        let hello = |replica| Message::Hello {
            replica,
            epoch: 1,
            resume: None,
        };
        r.handle_message(at(1), p, hello(old_log), &mut *store)
            .expect("mem");
        // As after a completed transfer from the old incarnation: a cursor into its log.
        let applied = store
            .apply_remote(
                p,
                first.delta.clone().expect("delta"),
                Some((old_log, first.end)),
                WALL,
            )
            .expect("mem");
        assert!(applied.is_ok());
        // The peer is wiped and comes back with a new replica id; then the late interval lands.
        r.handle_message(at(2), p, hello(new_log), &mut *store)
            .expect("mem");
        let msg = Message::Delta {
            epoch: 1,
            log: old_log,
            from: first.end,
            end: late.end,
            delta: late.delta.clone().expect("delta"),
        };
        r.handle_message(at(3), p, msg, &mut *store).expect("mem");
        assert_eq!(r.stats().deltas_applied, 1);
        // What the store's BP filter leaves in for the peer id: the late entry (tagged with
        // the old incarnation), not the first one (tagged with the peer id). The replica
        // applies that filter only from `bp_from` on (next test).
        let to_new = store.log_interval(0, Some(p), 1 << 20).expect("mem");
        assert_eq!(keys(&to_new.delta), vec!["k2".to_owned()]);
    }

    /// The intervals a replica sends `p` from its next Hello on.
    fn deltas_to(r: &mut Replica, p: PeerId) -> Vec<(u64, u64, Vec<String>)> {
        let mut out = Vec::new();
        while let Some(t) = r.poll_transmit() {
            if t.to == p
                && let Message::Delta {
                    from, end, delta, ..
                } = t.msg
            {
                out.push((from, end, keys(&Some(delta))));
            }
        }
        out
    }

    /// A peer restored from a snapshot keeps its peer id under a new replica id and resumes
    /// from a seed cursor: what the log tags with its peer id came from its previous replica,
    /// which it no longer holds, so back-propagation avoidance must not leave it out (the
    /// redb simulation's two-node restore found a cluster that never converged); entries its
    /// new replica sends afterwards are still held back.
    #[test]
    fn entries_a_previous_replica_of_a_peer_sent_reach_its_restored_replica() {
        let p = PeerId(5);
        let (old_log, new_log) = (ReplicaId(2000), ReplicaId(3000));
        let set = |name: &str| {
            (
                Key::new(KeyKind::MvReg, name),
                Mutation::Set("\"v\"".into()),
            )
        };
        let mut old = MemStateStore::new(old_log, Limits::default());
        old.apply_local(&[set("from-old")], WALL).expect("mem");
        let from_old = old.log_interval(0, None, 1 << 20).expect("mem");

        let mut store = MemStateStore::new(ReplicaId(1000), Limits::default());
        let me = store.replica_id();
        let mut r = Replica::new(ReplicaConfig::default(), 1, 3, [p]);
        r.peer_up(at(0), p, &mut *store).expect("mem");
        let hello = |replica, resume| Message::Hello {
            replica,
            epoch: 1,
            resume,
        };
        r.handle_message(at(1), p, hello(old_log, Some((me, 0))), &mut *store)
            .expect("mem");
        // As after a transfer from the old replica: joined and logged, tagged with `p`.
        let applied = store
            .apply_remote(
                p,
                from_old.delta.clone().expect("delta"),
                Some((old_log, from_old.end)),
                WALL,
            )
            .expect("mem");
        assert!(applied.is_ok());
        assert_eq!(store.log_bounds(), (0, 1));
        deltas_to(&mut r, p);
        // Restored under a new replica id, from a snapshot taken before that entry.
        r.handle_message(at(3), p, hello(new_log, Some((me, 0))), &mut *store)
            .expect("mem");
        r.handle_timeout(at(3_000), &mut *store).expect("mem");
        let sent = deltas_to(&mut r, p);
        assert!(
            sent.iter()
                .any(|(from, _, k)| *from == 0 && k.contains(&"from-old".to_owned())),
            "the previous replica's entry is sent to the restored one: {sent:?}"
        );
        // What the new replica sends now is still held back from it.
        let mut new = MemStateStore::new(new_log, Limits::default());
        new.apply_local(&[set("from-new")], WALL + 5).expect("mem");
        let from_new = new.log_interval(0, None, 1 << 20).expect("mem");
        let applied = store
            .apply_remote(
                p,
                from_new.delta.clone().expect("delta"),
                Some((new_log, from_new.end)),
                WALL + 5,
            )
            .expect("mem");
        assert!(applied.is_ok());
        assert_eq!(store.log_bounds(), (0, 2));
        r.handle_message(
            at(3_002),
            p,
            Message::Ack {
                epoch: 1,
                log: me,
                upto: 1,
            },
            &mut *store,
        )
        .expect("mem");
        r.handle_timeout(at(6_000), &mut *store).expect("mem");
        let sent = deltas_to(&mut r, p);
        assert!(
            sent.iter()
                .all(|(_, _, k)| !k.contains(&"from-new".to_owned())),
            "BP holds back what the current replica sent: {sent:?}"
        );
    }
}

/// Reads the next chunk's contents at `pos`: rows first (large rows in dot slices), then dedup
/// marks in pages with whatever room the chunk has left, so every chunk stays within the
/// target (ARCHITECTURE.md, "size invariants").
fn read_piece<S: StateStore>(
    store: &mut S,
    peer: PeerId,
    pos: &crate::proto::transfer::Position,
    target: usize,
) -> Result<(Option<ChunkRead>, Option<MarksRead>), S::Error> {
    let at = Some(peer);
    let (rows, used) = if pos.rows_done {
        (None, 0)
    } else {
        let read = store.read_chunk_from(at, pos.after.as_ref(), pos.resume.as_ref(), target)?;
        let used = crate::codec::encoded_len("chunk entries", &read.entries).unwrap_or(target);
        (Some(read), used)
    };
    let rows_done = rows.as_ref().is_none_or(OutTransfer::rows_finished);
    let marks = if rows_done {
        Some(store.read_marks(at, pos.marks_after.as_ref(), target.saturating_sub(used))?)
    } else {
        None
    };
    Ok((rows, marks))
}
