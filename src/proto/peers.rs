//! Per-peer volatile state of the replication core: what we know of a peer's cursor into our
//! log (the peer's mark of docs/design/principles.md "Delta intervals and
//! acknowledgements"), the one message we may have in flight to it, and liveness.
//! Nothing here is durable: a restart forgets it and peers re-report their cursors.

use crate::proto::transfer::OutTransfer;
use tidemark_crdts::{CausalContext, ReplicaId};

/// What we know of a peer's durable cursor into our log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerCursor {
    /// Not heard since boot or since eviction: ask with a Hello before falling back to a transfer.
    Unknown,
    /// The peer said it has no cursor into our current log: it needs a state transfer.
    NoCursor,
    /// The peer has durably joined our log up to (excluding) this seq.
    At(u64),
}

/// The kind of the one unacknowledged message in flight to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inflight {
    /// A delta-interval `[from, end)`.
    Delta { from: u64, end: u64 },
    /// A transfer chunk.
    Chunk { transfer: u64, index: u32 },
}

/// Everything the replica tracks for one peer.
#[derive(Debug)]
pub(crate) struct Peer {
    /// The host reported a working connection.
    pub up: bool,
    /// `A[j]`.
    pub cursor: PeerCursor,
    /// Counted in the stable frontier (false after eviction until the peer speaks again).
    pub tracked: bool,
    /// Monotonic time the peer was last heard from.
    pub last_heard: Option<u64>,
    /// The peer's incarnation `(replica id, epoch)` from its last Hello.
    pub incarnation: Option<(ReplicaId, u64)>,
    /// The unacknowledged message in flight and its retransmit deadline.
    pub inflight: Option<(Inflight, u64)>,
    /// Consecutive retransmit timeouts (exponential backoff; reset by any ack).
    pub timeouts_in_row: u32,
    /// The outgoing state transfer, if one is running.
    pub transfer: Option<OutTransfer>,
    /// When we last sent this peer a Hello.
    pub hello_sent_at: Option<u64>,
    /// Hellos sent while the cursor was unknown, unanswered so far.
    pub hellos_unanswered: u32,
    /// The last interval stopped at the size bound: send the rest as soon as it is acked.
    pub more: bool,
    /// The last context the peer announced (`Have`), tagged with its replica id then.
    pub known: Option<(ReplicaId, CausalContext)>,
    /// The first context this replica id of the peer announced (after its Hello): what it
    /// held when it first spoke to us.
    pub first_known: Option<(ReplicaId, CausalContext)>,
    /// After a reconnect, do not serve the peer before this time (catch-up stagger).
    pub serve_after: Option<u64>,
    /// When the membership layer declared the peer down (eviction after the grace period).
    pub down_since: Option<u64>,
    /// Our rank among the senders of a peer that needs a bootstrap (0: we transfer at once).
    pub bootstrap_rank: u64,
    /// Back-propagation avoidance holds back only log entries from this seq on: our log end
    /// when we first heard the peer's current replica id. Entries below it that are tagged
    /// with the peer's id may come from a previous replica under the same peer id (a node
    /// restored from a snapshot, or wiped), which does not hold them.
    pub bp_from: u64,
}

impl Peer {
    pub fn new() -> Self {
        Self {
            up: false,
            cursor: PeerCursor::Unknown,
            tracked: true,
            last_heard: None,
            incarnation: None,
            inflight: None,
            timeouts_in_row: 0,
            transfer: None,
            hello_sent_at: None,
            hellos_unanswered: 0,
            more: false,
            known: None,
            first_known: None,
            serve_after: None,
            down_since: None,
            bootstrap_rank: 0,
            bp_from: u64::MAX,
        }
    }

    /// The announced context, if it belongs to the peer's current replica id (a wiped peer has
    /// a new id and a smaller context: its old announcement must not be used).
    pub fn known_context(&self) -> Option<&CausalContext> {
        let current = self.incarnation.map(|(r, _)| r)?;
        self.known
            .as_ref()
            .filter(|(r, _)| *r == current)
            .map(|(_, c)| c)
    }

    /// The peer spoke: it is live and counts in the frontier again.
    pub fn heard(&mut self, now: u64) {
        self.last_heard = Some(now);
        if !self.tracked {
            // Back after an eviction: ask for its cursor again before paying for a transfer.
            self.tracked = true;
            self.hellos_unanswered = 0;
        }
    }

    /// The peer holds a cursor into our retained log at `at` (from a Hello, an Ack, a
    /// `Covered` or a completed transfer): records it and ends any bootstrap deferral, which
    /// only ever applies to a peer that needs a transfer.
    pub fn cursor_into_log(&mut self, at: u64) {
        self.cursor = PeerCursor::At(at);
        self.end_bootstrap_deferral();
    }

    /// The peer has shown a cursor into our retained log (a Hello or an Ack): a bootstrap
    /// deferral, which only ever applies to a peer that needs a transfer, no longer holds it
    /// back. (A Hello without a cursor can arrive late, after the peer got one: its deferral
    /// must not outlive it.)
    pub fn end_bootstrap_deferral(&mut self) {
        if self.bootstrap_rank > 0 {
            self.bootstrap_rank = 0;
            self.serve_after = None;
        }
    }

    /// Forgets the connection's volatile exchanges (in-flight message, outgoing transfer).
    pub fn reset_link(&mut self) {
        self.inflight = None;
        self.transfer = None;
        self.timeouts_in_row = 0;
        self.more = false;
    }

    /// This peer's lower bound on the stable frontier given our log `[start, end)`:
    /// `Err(())` when the frontier cannot be known yet (the peer has not reported since boot),
    /// `Ok(None)` when the peer does not pin the log (it needs a transfer anyway).
    pub fn frontier_bound(&self, start: u64, end: u64) -> Result<Option<u64>, ()> {
        if !self.tracked {
            return Ok(None);
        }
        if let Some(t) = &self.transfer {
            return Ok(Some(t.end.min(end)));
        }
        match self.cursor {
            PeerCursor::Unknown => Err(()),
            PeerCursor::NoCursor => Ok(None),
            PeerCursor::At(a) if a < start => Ok(None),
            PeerCursor::At(a) => Ok(Some(a.min(end))),
        }
    }
}
