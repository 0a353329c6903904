//! Chunked state transfer bookkeeping (DESIGN.md C4, state-driven): the sender's cursor through
//! its key space and the receiver's expected chunk. Volatile on both sides: a restart on either
//! side makes the receiver answer `ChunkNack` (or the sender time out) and the transfer restarts.

use crate::model::StateChunk;
use crate::proto::{ChunkRead, MarksRead, Message};
use tidemark_crdts::{CausalContext, Dot, Key, ReplicaId};

/// Where an outgoing transfer stands: rows first (in key order, large rows in dot slices),
/// then the dedup marks in pages; the final chunk is the one that completes both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Position {
    /// The next rows chunk covers keys after this one.
    pub after: Option<Key>,
    /// A large row in progress: its key and the last dot sent.
    pub resume: Option<(Key, Dot)>,
    /// Every row was sent.
    pub rows_done: bool,
    /// The next marks page starts after this source.
    pub marks_after: Option<(String, String)>,
}

/// The chunk last sent, kept verbatim for retransmission.
#[derive(Clone, Debug)]
pub(crate) struct SentChunk {
    pub index: u32,
    /// The position once this chunk is acknowledged.
    pub next: Position,
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
    /// Where the next chunk starts.
    pub pos: Position,
    /// The next chunk's index.
    pub index: u32,
    /// The chunk in flight, if any.
    pub sent: Option<SentChunk>,
}

/// The bound of the empty key range `(k, k]` of chunks that carry only dedup marks: such a
/// chunk holds no entries and removes nothing.
fn marks_only_key() -> Key {
    Key::new(tidemark_crdts::KeyKind::GCounter, "")
}

impl OutTransfer {
    pub fn new(id: u64, ctx: CausalContext, end: u64) -> Self {
        Self {
            id,
            ctx,
            end,
            pos: Position::default(),
            index: 0,
            sent: None,
        }
    }

    /// True when a read of rows ends the rows phase.
    pub fn rows_finished(read: &ChunkRead) -> bool {
        read.part.is_none() && (read.done || read.last_key.is_none())
    }

    /// Builds the next chunk message from a read of the store's rows (`None` once the rows
    /// are done) and of its marks (`None` while rows remain).
    pub fn chunk(
        &self,
        epoch: u64,
        log: ReplicaId,
        rows: Option<ChunkRead>,
        marks: Option<MarksRead>,
    ) -> SentChunk {
        let mut next = self.pos.clone();
        let (after, upto, entries, dots) = match rows {
            Some(read) => {
                let finished = Self::rows_finished(&read);
                let after = self.pos.after.clone();
                match read.part {
                    Some(part) => {
                        match part.slice.upto {
                            Some(d) => next.resume = Some((part.key.clone(), d)),
                            None => {
                                next.resume = None;
                                next.after = Some(part.key.clone());
                            }
                        }
                        (after, Some(part.key), read.entries, Some(part.slice))
                    }
                    None if finished => {
                        next.rows_done = true;
                        (after, None, read.entries, None)
                    }
                    None => {
                        next.after.clone_from(&read.last_key);
                        (after, read.last_key, read.entries, None)
                    }
                }
            }
            None => (
                Some(marks_only_key()),
                Some(marks_only_key()),
                Vec::new(),
                None,
            ),
        };
        let (marks, marks_done) = match marks {
            Some(m) => {
                next.marks_after = m.last.or(next.marks_after);
                (m.marks, m.done)
            }
            None => (tidemark_crdts::DedupMarks::new(), false),
        };
        let last = next.rows_done && marks_done;
        let chunk = StateChunk {
            after,
            upto,
            entries,
            ctx: self.ctx.clone(),
            marks,
            last,
            dots,
        };
        SentChunk {
            index: self.index,
            next,
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
