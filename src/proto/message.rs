//! The replication protocol's messages (docs/design/principles.md,
//! "Replication protocol"). Encoded only through
//! [`crate::codec`], which adds the version byte and enforces the frame size limit.

use crate::model::{Delta, StateChunk};
use tidemark_crdts::{CausalContext, ReplicaId};

/// One protocol message between two replicas.
///
/// `epoch` is the sender's incarnation (bumped at every boot); acknowledgements echo the epoch
/// of what they acknowledge, and a replica drops acks that carry another epoch (pitfall
/// "stale acknowledgement", docs/design/principles.md).
/// `log` is the id of the sender's delta log (its replica id): a cursor into a log is only
/// meaningful for the same log id.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Message {
    /// Sent when a peer comes up: who I am, and how far I have durably joined your log.
    Hello {
        /// The sender's replica id (also its log id).
        replica: ReplicaId,
        /// The sender's incarnation.
        epoch: u64,
        /// `(your log id, first seq I have not joined)`, if I have joined any of your log.
        resume: Option<(ReplicaId, u64)>,
    },
    /// A delta-interval: the join of the sender's log entries `[from, end)` (minus BP skips).
    Delta {
        /// The sender's incarnation.
        epoch: u64,
        /// The sender's log id.
        log: ReplicaId,
        /// First log seq covered (the receiver's acknowledged cursor when it was built).
        from: u64,
        /// First log seq not covered.
        end: u64,
        /// The joined delta (empty when every entry in the interval came from the receiver).
        delta: Delta,
    },
    /// The receiver's durable cursor into the sender's log, after a delta or a completed transfer.
    Ack {
        /// Echo of the epoch of the message acknowledged.
        epoch: u64,
        /// The log id acknowledged.
        log: ReplicaId,
        /// First seq of that log not yet joined.
        upto: u64,
    },
    /// One chunk of a state transfer (for a peer that is new, evicted or behind compaction).
    Chunk {
        /// The sender's incarnation.
        epoch: u64,
        /// The sender's log id.
        log: ReplicaId,
        /// Transfer id (unique per sender incarnation).
        transfer: u64,
        /// Chunk index within the transfer, from 0.
        index: u32,
        /// The sender's log end when the transfer started: the receiver's cursor once it completes.
        end: u64,
        /// The chunk.
        chunk: StateChunk,
    },
    /// Chunk `index` of `transfer` was durably applied; send the next.
    ChunkAck {
        /// Echo of the transfer's epoch.
        epoch: u64,
        /// The transfer.
        transfer: u64,
        /// The chunk applied.
        index: u32,
    },
    /// The receiver cannot continue `transfer` (it lost track, e.g. after a restart): restart it.
    ChunkNack {
        /// Echo of the transfer's epoch.
        epoch: u64,
        /// The transfer.
        transfer: u64,
    },
    /// The sender's durable causal context: a digest of every dot it has seen. Sent after a
    /// Hello and after a large join; a peer may then leave out of the intervals it sends what
    /// the context proves the sender has already seen (a per-dot filter that changes neither
    /// the joined state nor the logged inflation). Valid while `replica` is the sender's id
    /// (a wiped peer has another id, so its old context is never used).
    Have {
        /// The sender's replica id.
        replica: ReplicaId,
        /// Its durable context.
        ctx: CausalContext,
    },
    /// The receiver's announced context (`Have`) covers everything the sender holds up to
    /// `end` of its log `log`: record `(log, end)` as the cursor into the sender's log (as if
    /// the interval `[.., end)` had been joined: it would change nothing) and `Ack` it. How a
    /// peer bootstrapped by ONE other sender gets deltas, not a second transfer, from the rest.
    /// A false claim only withholds the claimant's own log from the receiver.
    Covered {
        /// The sender's epoch (echoed in the ack).
        epoch: u64,
        /// The sender's log id.
        log: ReplicaId,
        /// Its log end the claim holds for.
        end: u64,
    },
}

impl Message {
    /// A short name for metrics and traces.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Delta { .. } => "delta",
            Message::Ack { .. } => "ack",
            Message::Chunk { .. } => "chunk",
            Message::ChunkAck { .. } => "chunk_ack",
            Message::ChunkNack { .. } => "chunk_nack",
            Message::Have { .. } => "have",
            Message::Covered { .. } => "covered",
        }
    }
}
