//! The write-ahead log: one file beside the database (`tidemark.wal`) through which local
//! commit groups become durable (ARCHITECTURE.md, "The write path").
//!
//! A local group's redb transaction commits with `Durability::None` (kept in memory by redb)
//! after its redo record — every key it sets or removes, in order — has been appended here and,
//! in `Durability::Immediate`, `fdatasync`ed: the acknowledgement waits for one log append and
//! one sync. Every other commit (remote joins, purges, compaction, checkpoints) is a durable
//! redb commit that writes `meta/wal_covered` = the next log seq, so it makes every record
//! before it redundant; the log then starts over at offset 0 (no segment files to delete: a
//! durable commit covers the whole log). Opening replays the records from `wal_covered` on,
//! in order, then commits durably.
//!
//! The file is scanned from offset 0; the first frame that is short, damaged, of another store
//! or not the seq expected next ends the log (a torn tail, or a frame of an earlier pass over
//! the file that a shorter later pass did not overwrite). Frame format: `codec::wal`.

use super::StoreError;
use super::tables::{DEDUP, DOTS, ELEMS, LATE, LATE_MARKS, LATE_TOTALS, LOG, META, ROWS};
use crate::codec::wal::{self as format, FRAME_HEADER, RedoTable};
use redb::{StorageBackend, WriteTransaction};

/// The log file inside the data directory.
pub const WAL_FILE: &str = "tidemark.wal";

/// Bytes the file grows by at least when a frame does not fit (written as zeros, so later
/// appends overwrite allocated blocks and a sync flushes data only).
const GROW_BYTES: u64 = 4 << 20;

/// Zeros written per call when the file grows.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("write-ahead log I/O: {e}"))
}

/// What opening the log found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalScan {
    /// Records replayed (seq from `wal_covered` on).
    pub replayed: u64,
    /// Their payload bytes.
    pub replayed_bytes: u64,
    /// Why the scan stopped, when it stopped at a frame (not at the end of the file).
    pub stopped_at: Option<(u64, format::FrameEnd)>,
}

/// The open log (single writer: owned by the store).
pub(crate) struct Wal {
    file: Box<dyn StorageBackend>,
    store_id: u64,
    next_seq: u64,
    /// Where the next frame goes (bytes appended since the last durable commit).
    pos: u64,
    /// The file's length as last set or read.
    len: u64,
    /// Frames appended since the last sync or durable commit.
    unsynced: bool,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("next_seq", &self.next_seq)
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

impl Wal {
    /// Opens the log in `file` for the store `store_id` whose durable state covers the records
    /// before `covered`, and calls `replay` with each record from `covered` on, in order.
    ///
    /// # Errors
    /// I/O errors; whatever `replay` returns (the open must then fail: the state is not whole).
    pub(crate) fn open(
        file: Box<dyn StorageBackend>,
        store_id: u64,
        covered: u64,
        mut replay: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(Self, WalScan), StoreError> {
        let len = file.len().map_err(io)?;
        let mut scan = WalScan::default();
        let (mut pos, mut seq) = (0u64, covered);
        let mut header = [0u8; FRAME_HEADER];
        while pos.saturating_add(FRAME_HEADER as u64) <= len {
            file.read(pos, &mut header).map_err(io)?;
            let available = len - pos - FRAME_HEADER as u64;
            let h = match format::read_header(&header, store_id, seq, available) {
                Ok(h) => h,
                Err(end) => {
                    scan.stopped_at = Some((pos, end));
                    break;
                }
            };
            let mut payload = vec![0u8; h.len];
            file.read(pos + FRAME_HEADER as u64, &mut payload)
                .map_err(io)?;
            if let Err(end) = format::check_payload(&h, &payload) {
                scan.stopped_at = Some((pos, end));
                break;
            }
            replay(seq, &payload)?;
            scan.replayed += 1;
            scan.replayed_bytes += payload.len() as u64;
            pos += (FRAME_HEADER + payload.len()) as u64;
            seq += 1;
        }
        let mut wal = Self {
            file,
            store_id,
            next_seq: seq,
            pos,
            len,
            unsynced: false,
        };
        // A new (or short) file is zero-filled to its first size now, so the first groups'
        // syncs do not pay for allocating its blocks.
        if wal.len < GROW_BYTES {
            wal.grow(GROW_BYTES)?;
            wal.file.sync_data().map_err(io)?;
        }
        Ok((wal, scan))
    }

    /// The seq the next record gets: a durable commit covers every record before it.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Bytes appended since the last durable commit.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pos
    }

    /// Appends one record (not synced: see [`Wal::sync`]); returns its seq.
    ///
    /// # Errors
    /// The payload is over the frame limit ([`StoreError::TooLarge`]); I/O errors.
    pub(crate) fn append(&mut self, payload: &[u8]) -> Result<u64, StoreError> {
        let frame = format::frame(self.store_id, self.next_seq, payload).map_err(|e| {
            StoreError::TooLarge {
                what: "log record",
                len: payload.len(),
                limit: match e {
                    crate::codec::CodecError::TooLarge { limit, .. } => limit,
                    _ => format::PAYLOAD_MAX,
                },
            }
        })?;
        let end = self.pos + frame.len() as u64;
        if end > self.len {
            self.grow(end)?;
        }
        self.file.write(self.pos, &frame).map_err(io)?;
        self.pos = end;
        self.unsynced = true;
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Extends the file with zeros to at least `end` (and by at least [`GROW_BYTES`]).
    fn grow(&mut self, end: u64) -> Result<(), StoreError> {
        let target = end.max(self.len.saturating_add(GROW_BYTES));
        let mut at = self.len;
        while at < target {
            let n = usize::try_from(target - at).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
            self.file.write(at, &ZEROS[..n]).map_err(io)?;
            at += n as u64;
        }
        self.len = target;
        Ok(())
    }

    /// Makes every record appended so far durable (`fdatasync`).
    ///
    /// # Errors
    /// I/O errors (the caller halts the store: a failed sync leaves the log's state unknown).
    pub(crate) fn sync(&mut self) -> Result<(), StoreError> {
        if self.unsynced {
            self.file.sync_data().map_err(io)?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Starts the log over: called after a durable commit that wrote `wal_covered` =
    /// [`Wal::next_seq`], which holds every record appended so far.
    pub(crate) fn restart(&mut self) {
        self.pos = 0;
        self.unsynced = false;
    }
}

/// Applies one record's redo operations in `txn` (recovery).
///
/// # Errors
/// [`StoreError::Corrupt`] for a record that does not decode or names a key its table
/// cannot hold; storage failures.
pub(crate) fn apply_redo(
    txn: &WriteTransaction,
    seq: u64,
    payload: &[u8],
) -> Result<(), StoreError> {
    let bad = |what: &str| StoreError::Corrupt(format!("write-ahead log record {seq}: {what}"));
    let ops = format::redo_ops(payload).map_err(|e| bad(&e.to_string()))?;
    let open = |def| txn.open_table(def).map_err(StoreError::redb);
    let mut meta = txn.open_table(META).map_err(StoreError::redb)?;
    let mut log = txn.open_table(LOG).map_err(StoreError::redb)?;
    let mut tables = [
        open(ROWS)?,
        open(ELEMS)?,
        open(DOTS)?,
        open(DEDUP)?,
        open(LATE)?,
        open(LATE_TOTALS)?,
        open(LATE_MARKS)?,
    ];
    for op in ops {
        let index = match op.table {
            RedoTable::Meta => {
                let name = std::str::from_utf8(op.key).map_err(|_| bad("meta key not UTF-8"))?;
                match op.value {
                    Some(v) => meta.insert(name, v).map(drop),
                    None => meta.remove(name).map(drop),
                }
                .map_err(StoreError::redb)?;
                continue;
            }
            RedoTable::Log => {
                let k: [u8; 8] = op.key.try_into().map_err(|_| bad("log key not 8 bytes"))?;
                let k = u64::from_be_bytes(k);
                match op.value {
                    Some(v) => log.insert(k, v).map(drop),
                    None => log.remove(k).map(drop),
                }
                .map_err(StoreError::redb)?;
                continue;
            }
            RedoTable::Rows => 0,
            RedoTable::Elems => 1,
            RedoTable::Dots => 2,
            RedoTable::Dedup => 3,
            RedoTable::Late => 4,
            RedoTable::LateTotals => 5,
            RedoTable::LateMarks => 6,
        };
        let t = &mut tables[index];
        match op.value {
            Some(v) => t.insert(op.key, v).map(drop),
            None => t.remove(op.key).map(drop),
        }
        .map_err(StoreError::redb)?;
    }
    Ok(())
}

/// The redo record of one local commit group as it is built: every key the group's
/// transaction sets or removes, in order (off when the store has no log: then nothing is kept).
#[derive(Default)]
pub(crate) struct Redo(Option<Vec<u8>>);

impl Redo {
    /// A redo that records.
    pub(crate) fn on() -> Self {
        Self(Some(Vec::new()))
    }

    /// Records a put.
    pub(crate) fn put(&mut self, table: RedoTable, key: &[u8], value: &[u8]) {
        if let Some(b) = &mut self.0 {
            format::push_put(b, table, key, value);
        }
    }

    /// Records a removal.
    pub(crate) fn del(&mut self, table: RedoTable, key: &[u8]) {
        if let Some(b) = &mut self.0 {
            format::push_del(b, table, key);
        }
    }

    /// The payload (`None`: not recording).
    pub(crate) fn into_payload(self) -> Option<Vec<u8>> {
        self.0
    }
}
