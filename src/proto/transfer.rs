//! Chunked state transfer bookkeeping (DESIGN.md C4, state-driven): the sender's snapshot and
//! where it is, and the receiver's expected chunk and the chunks it holds. Volatile on both
//! sides: a restart on either side makes the receiver answer `ChunkNack` (or the sender time
//! out) and the transfer restarts.
//!
//! A transfer is ONE consistent state `(entries, context)` split into messages (issue 11,
//! defect 8): the sender reads every chunk when the transfer starts (so no chunk reflects an
//! op its context lacks), and the receiver joins the chunks only when the last one arrived, in
//! one durable join (so no entry is ever held, or logged for forwarding, without the dots it
//! retired and without the dots that justify the removals next to it).

use std::collections::VecDeque;

use crate::model::StateChunk;
use crate::proto::Message;
use tidemark_crdts::{CausalContext, Key, ReplicaId};

/// The chunk last sent, kept verbatim for retransmission.
#[derive(Clone, Debug)]
pub(crate) struct SentChunk {
    pub index: u32,
    pub upto: Option<Key>,
    pub last: bool,
    pub msg: Message,
}

/// An outgoing transfer: the context and log end taken when it started, and where it is.
#[derive(Clone, Debug)]
pub(crate) struct OutTransfer {
    pub id: u64,
    /// The sender's context at the start (every chunk carries it; the last one joins it).
    pub ctx: CausalContext,
    /// The sender's log end at the start: the receiver's cursor once the transfer completes.
    pub end: u64,
    /// The next chunk covers keys after this one.
    pub after: Option<Key>,
    /// The next chunk's index.
    pub index: u32,
    /// The chunk in flight, if any.
    pub sent: Option<SentChunk>,
    /// The chunks not yet sent, all read together with `ctx` when the transfer started.
    pub reads: VecDeque<crate::proto::ChunkRead>,
    /// The dedup marks read with them (sent in the final chunk).
    pub marks: Option<tidemark_crdts::DedupMarks>,
}

impl OutTransfer {
    pub fn new(
        id: u64,
        ctx: CausalContext,
        end: u64,
        reads: VecDeque<crate::proto::ChunkRead>,
        marks: tidemark_crdts::DedupMarks,
    ) -> Self {
        Self {
            id,
            ctx,
            end,
            after: None,
            index: 0,
            sent: None,
            reads,
            marks: Some(marks),
        }
    }

    /// Builds the next chunk message from a read of the store.
    pub fn chunk(
        &self,
        epoch: u64,
        log: ReplicaId,
        read: crate::proto::ChunkRead,
        marks: Option<tidemark_crdts::DedupMarks>,
    ) -> SentChunk {
        let last = read.done || read.last_key.is_none();
        let upto = if last { None } else { read.last_key };
        let chunk = StateChunk {
            after: self.after.clone(),
            upto: upto.clone(),
            entries: read.entries,
            ctx: self.ctx.clone(),
            marks: marks.unwrap_or_default(),
            last,
        };
        SentChunk {
            index: self.index,
            upto,
            last,
            msg: Message::Chunk {
                epoch,
                log,
                transfer: self.id,
                index: self.index,
                end: self.end,
                chunk,
            },
        }
    }
}

/// An incoming transfer: which chunk we expect next from one sender, and the chunks received
/// so far (joined together when the last one arrives).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InTransfer {
    pub epoch: u64,
    pub log: ReplicaId,
    pub transfer: u64,
    pub next: u32,
    pub held: Vec<StateChunk>,
}

/// Joins the chunks of one transfer, in order, into the one chunk they split: every entry, the
/// first chunk's lower bound, the last chunk's upper bound, context and marks.
pub(crate) fn merge_chunks(held: Vec<StateChunk>, last: StateChunk) -> StateChunk {
    let mut out = StateChunk {
        after: held
            .first()
            .map_or_else(|| last.after.clone(), |c| c.after.clone()),
        upto: last.upto,
        entries: Vec::new(),
        ctx: last.ctx,
        marks: last.marks,
        last: last.last,
    };
    for c in held {
        out.entries.extend(c.entries);
    }
    out.entries.extend(last.entries);
    out
}

impl InTransfer {
    /// Same transfer (sender incarnation, log and id)?
    pub fn is(&self, epoch: u64, log: ReplicaId, transfer: u64) -> bool {
        self.epoch == epoch && self.log == log && self.transfer == transfer
    }
}
