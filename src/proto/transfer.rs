//! Chunked state transfer bookkeeping (DESIGN.md C4, state-driven): the sender's cursor through
//! its key space and the receiver's expected chunk. Volatile on both sides: a restart on either
//! side makes the receiver answer `ChunkNack` (or the sender time out) and the transfer restarts.

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
}

impl OutTransfer {
    pub fn new(id: u64, ctx: CausalContext, end: u64) -> Self {
        Self {
            id,
            ctx,
            end,
            after: None,
            index: 0,
            sent: None,
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

/// An incoming transfer: which chunk we expect next from one sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InTransfer {
    pub epoch: u64,
    pub log: ReplicaId,
    pub transfer: u64,
    pub next: u32,
}

impl InTransfer {
    /// Same transfer (sender incarnation, log and id)?
    pub fn is(&self, epoch: u64, log: ReplicaId, transfer: u64) -> bool {
        self.epoch == epoch && self.log == log && self.transfer == transfer
    }
}
