//! Chunked state transfer bookkeeping (docs/design/principles.md,
//! "State transfer"): the sender's snapshot and
//! where it is, and the receiver's expected chunk (the chunks received are staged in the
//! store, not here). Volatile on both
//! sides: a restart on either side makes the receiver answer `ChunkNack` (or the sender time
//! out) and the transfer restarts.
//!
//! A transfer is ONE consistent state `(entries, context)` split into messages: the sender
//! pins a read snapshot of its store when the transfer starts, with the context, and reads
//! each chunk from that snapshot when it is about to be sent (so no chunk reflects an op its
//! context lacks, and the sender holds one chunk, not the whole state). The receiver stages
//! each chunk in its store (on disk, unapplied) and joins them only when the last one arrived,
//! streaming them in one durable join (so no entry is ever applied, or logged for forwarding,
//! without the dots it retired and without the dots that justify the removals next to it, and
//! the receiver holds about one chunk — a large set's parts are joined one by one — not the
//! whole state).

use crate::model::StateChunk;
use crate::proto::{ChunkRead, MarksRead, Message};
use tidemark_crdts::{CausalContext, Dot, DotStore, Key, ReplicaId};

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

/// An outgoing transfer: the context and log end taken when it started (with the store's
/// snapshot pinned for it), and where it is.
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
    /// The bytes of rows and marks a chunk holds at most (the message target less the context
    /// every chunk carries).
    pub target: usize,
    /// The last chunk was built: nothing more is read.
    pub built_last: bool,
    /// When the transfer last made progress (started, or a chunk was acknowledged), in the
    /// core's monotonic ms: a transfer still without progress `peer_evict_after_ms` later is
    /// given up, so its snapshot is not pinned for ever by a peer that never acknowledges.
    pub progress_at: u64,
}

/// The bound of the empty key range `(k, k]` of chunks that carry only dedup marks: such a
/// chunk holds no entries and removes nothing.
fn marks_only_key() -> Key {
    Key::new(tidemark_crdts::KeyKind::GCounter, "")
}

impl OutTransfer {
    pub fn new(id: u64, ctx: CausalContext, end: u64, target: usize, now: u64) -> Self {
        Self {
            id,
            ctx,
            end,
            pos: Position::default(),
            index: 0,
            sent: None,
            target,
            built_last: false,
            progress_at: now,
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

/// An incoming transfer: which chunk we expect next from one sender. The chunks received so
/// far are not held here: the store stages them ([`crate::proto::StateStore::stage_chunk`])
/// and joins them all, in one durable join, when the last one arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InTransfer {
    pub epoch: u64,
    pub log: ReplicaId,
    pub transfer: u64,
    pub next: u32,
    /// A chunk of this transfer was refused: the rest is acknowledged (not staged) and the
    /// transfer is rejected, with nothing applied, at its last chunk.
    pub failed: Option<crate::model::Rejected>,
}

/// What one chunk of a transfer is, as far as the rows' parts go ([`PartsCheck::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkShape {
    /// Whole rows (or none): no dot slice.
    Whole,
    /// One part of a large row: `continuing` when it continues the row of the previous part
    /// (its entry joins into that row), `closes` when it is the row's last part.
    Part { continuing: bool, closes: bool },
}

/// The checks [`merge_chunks`] makes on the parts of large rows, one chunk at a time: the
/// parts of one row follow each other, each starting where the previous one ended (no overlap,
/// no gap), the last one open, and every entry of a part is the row's, inside its slice. Holds
/// only the row in progress and its last dot, so a receiver can check chunk by chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PartsCheck {
    /// A large row in progress: its key and the last dot of the parts seen so far.
    open_row: Option<(Key, Dot)>,
}

impl PartsCheck {
    /// Checks the next chunk of the transfer.
    ///
    /// # Errors
    /// [`crate::model::Rejected::BadChunk`] for parts that overlap, leave a gap, end at or
    /// before where they start, end before the row's last part, or entries outside their row
    /// or slice.
    pub fn next(&mut self, c: &StateChunk) -> Result<ChunkShape, crate::model::Rejected> {
        let bad = crate::model::Rejected::BadChunk;
        let Some(slice) = c.dots else {
            if self.open_row.is_some() {
                return Err(bad("a large row's parts end before its last part"));
            }
            return Ok(ChunkShape::Whole);
        };
        // A part of a large row: the chunk's range ends at the row's key.
        let Some(key) = c.upto.clone() else {
            return Err(bad("a dot slice without its row's key"));
        };
        // A slice holds the dots above `after` up to `upto`: an inverted (or empty) one would
        // let the next part start below where this one ended, so two parts overlap (the sender
        // always ends a slice at a dot it carries, above the slice's start).
        if slice.is_empty() {
            return Err(bad("a large row's part ends at or before where it starts"));
        }
        let continuing = match &self.open_row {
            Some((k, upto)) if *k == key && slice.after == Some(*upto) => true,
            None if slice.after.is_none() => false,
            _ => return Err(bad("a large row's parts overlap or leave a gap")),
        };
        for (k, entry) in &c.entries {
            let mut inside = *k == key;
            entry.for_each_dot(&mut |d| inside &= slice.contains(&d));
            if !inside {
                return Err(bad("entry outside the chunk's row or dot slice"));
            }
        }
        self.open_row = slice.upto.map(|d| (key, d));
        Ok(ChunkShape::Part {
            continuing,
            closes: slice.upto.is_none(),
        })
    }

    /// Checks that no row is left open once the last chunk was checked.
    ///
    /// # Errors
    /// [`crate::model::Rejected::BadChunk`] when a large row's last part never came.
    pub fn finish(&self) -> Result<(), crate::model::Rejected> {
        match self.open_row {
            Some(_) => Err(crate::model::Rejected::BadChunk(
                "a large row's parts end before its last part",
            )),
            None => Ok(()),
        }
    }
}

/// Joins the chunks of one transfer, in order, into the one state they split: the sender's
/// whole key range, every entry (the dot slices of one large row joined back into one entry:
/// they are disjoint parts of one snapshot entry), every page of dedup marks, and the context
/// (every chunk carries the same one; the last chunk's is taken). The receiver does not use it
/// (it streams the staged chunks instead: `store::transfer_stage`); it is the reference the
/// streamed join is tested against.
///
/// # Errors
/// Parts of a row that overlap or are out of order, or entries outside their chunk's slice:
/// nothing is returned, and the transfer is rejected.
#[cfg(test)]
pub(crate) fn merge_chunks(
    held: Vec<StateChunk>,
    last: StateChunk,
) -> Result<StateChunk, crate::model::Rejected> {
    use tidemark_crdts::DotStore;
    let mut entries: Vec<(Key, tidemark_crdts::Entry)> = Vec::new();
    let mut marks = tidemark_crdts::DedupMarks::new();
    let mut check = PartsCheck::default();
    let ctx = last.ctx.clone();
    for c in held.into_iter().chain(std::iter::once(last)) {
        marks.join(&c.marks);
        let shape = check.next(&c)?;
        for (k, entry) in c.entries {
            match entries.last_mut() {
                Some((prev, e))
                    if matches!(shape, ChunkShape::Part { continuing: true, .. })
                        && *prev == k =>
                {
                    // Disjoint dots: joining under each side's own dots is their union.
                    let mine = e.dots();
                    let theirs = entry.dots();
                    e.join(&mine, entry, &theirs);
                }
                _ => entries.push((k, entry)),
            }
        }
    }
    check.finish()?;
    Ok(StateChunk {
        after: None,
        upto: None,
        entries,
        ctx,
        marks,
        last: true,
        dots: None,
    })
}

impl InTransfer {
    /// Same transfer (sender incarnation, log and id)?
    pub fn is(&self, epoch: u64, log: ReplicaId, transfer: u64) -> bool {
        self.epoch == epoch && self.log == log && self.transfer == transfer
    }
}

#[cfg(test)]
mod tests {
    use super::merge_chunks;
    use crate::model::{DotSlice, StateChunk};
    use tidemark_crdts::{
        CausalContext, DedupMarks, Dot, DotFun, DotStore, Entry, Key, KeyKind, ReplicaId,
    };

    fn mv(dots: &[Dot]) -> Entry {
        let mut e = Entry::bottom(KeyKind::MvReg);
        for d in dots {
            let one = Entry::MvReg(DotFun::single(*d, format!("\"{}\"", d.seq)));
            let (mine, theirs) = (e.dots(), one.dots());
            e.join(&mine, one, &theirs);
        }
        e
    }

    fn part(key: &Key, dots: &[Dot], slice: DotSlice, ctx: &CausalContext) -> StateChunk {
        StateChunk {
            after: None,
            upto: Some(key.clone()),
            entries: vec![(key.clone(), mv(dots))],
            ctx: ctx.clone(),
            marks: DedupMarks::new(),
            last: false,
            dots: Some(slice),
        }
    }

    /// The dot slices of one row join back into the row; parts that overlap, leave a gap or
    /// stop before the open last part are refused.
    #[test]
    fn merge_joins_row_parts_and_refuses_overlaps_and_gaps() {
        let r = ReplicaId::from_bytes([7; 16]);
        let d: Vec<Dot> = (1..=4).map(|s| Dot::new(r, s)).collect();
        let key = Key::new(KeyKind::MvReg, "big");
        let ctx = mv(&d).dots();
        let slice = |after: Option<Dot>, upto: Option<Dot>| DotSlice { after, upto };
        let first = part(&key, &d[..2], slice(None, Some(d[1])), &ctx);
        let mut rest = part(&key, &d[2..], slice(Some(d[1]), None), &ctx);
        rest.last = true;
        let merged = merge_chunks(vec![first.clone()], rest.clone()).expect("contiguous parts");
        assert_eq!(merged.entries, vec![(key.clone(), mv(&d))]);
        assert_eq!((merged.after, merged.upto, merged.dots), (None, None, None));
        // A gap (the second part starts after d[2], not d[1]).
        let mut gap = part(&key, &d[3..], slice(Some(d[2]), None), &ctx);
        gap.last = true;
        assert!(merge_chunks(vec![first.clone()], gap).is_err());
        // An overlap (the second part restarts at the beginning).
        let mut overlap = part(&key, &d[1..], slice(None, None), &ctx);
        overlap.last = true;
        assert!(merge_chunks(vec![first.clone()], overlap).is_err());
        // The row's last part never came.
        let marks_only = StateChunk {
            entries: Vec::new(),
            dots: None,
            last: true,
            ..rest
        };
        assert!(merge_chunks(vec![first], marks_only).is_err());
    }
}
