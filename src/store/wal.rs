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
use crate::codec::wal::{self as format, FILE_HEADER, FRAME_HEADER, RedoTable};
use redb::{StorageBackend, WriteTransaction};

/// The log file inside the data directory.
pub const WAL_FILE: &str = "tidemark.wal";

/// Bytes the file grows by at least when a frame does not fit (written as zeros, so later
/// appends overwrite allocated blocks and a sync flushes data only).
const GROW_BYTES: u64 = 4 << 20;

/// Bytes a new log file is zero-filled to at open (its first groups' syncs then flush data
/// only).
const INITIAL_BYTES: u64 = 1 << 20;

/// Zeros written per call when the file grows.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

fn io(name: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io {
        path: name.to_owned(),
        error: std::io::Error::other(e.to_string()),
    }
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
    /// Relaxed-durability records found intact past a damaged one and dropped (a power loss
    /// inside the sync interval).
    pub dropped_relaxed: u64,
}

/// The open log (single writer: owned by the store).
pub(crate) struct Wal {
    file: Box<dyn StorageBackend>,
    /// The file's name in errors.
    name: String,
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
    /// Opens the log in `file` (named `name` in errors) for the store `store_id` whose durable
    /// state covers the records before `covered`, and calls `replay` with each record from
    /// `covered` on, in order. `known`: the store has written through a log with this id
    /// before (its meta names it), so the file must be that log; otherwise the file is started
    /// over as a new log.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a file that is not this store's log (zeroed, damaged,
    /// another store's) and for a damaged record followed by intact acknowledged ones (not a
    /// torn tail: acknowledged writes would be lost); I/O errors; whatever `replay` returns
    /// (the open must then fail: the state is not whole).
    pub(crate) fn open(
        file: Box<dyn StorageBackend>,
        name: &str,
        store_id: u64,
        known: bool,
        covered: u64,
        mut replay: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(Self, WalScan), StoreError> {
        let len = file.len().map_err(|e| io(name, e))?;
        let mut wal = Self {
            file,
            name: name.to_owned(),
            store_id,
            next_seq: covered,
            pos: FILE_HEADER as u64,
            len,
            unsynced: false,
        };
        let mut scan = WalScan::default();
        let header_ok = if len >= FILE_HEADER as u64 {
            let mut h = [0u8; FILE_HEADER];
            wal.file.read(0, &mut h).map_err(|e| io(name, e))?;
            format::read_file_header(&h) == Some(store_id)
        } else {
            false
        };
        if !header_ok {
            if known && len > 0 {
                return Err(StoreError::Corrupt(format!(
                    "{name} is not this store's write-ahead log (zeroed, damaged or another \
                     store's): acknowledged writes may be lost. Restore the file if you can; if \
                     the node was stopped cleanly (a clean stop leaves nothing in it), replace \
                     it with an empty file to start"
                )));
            }
            if known {
                tracing::warn!(file = name, "the write-ahead log is empty: starting a new one");
            }
            wal.len = 0;
            wal.file.set_len(0).map_err(|e| io(name, e))?;
            wal.file
                .write(0, &format::file_header(store_id))
                .map_err(|e| io(name, e))?;
            wal.len = FILE_HEADER as u64;
            wal.fill_to(INITIAL_BYTES)?;
            wal.file.sync_data().map_err(|e| io(name, e))?;
            return Ok((wal, scan));
        }
        let (mut pos, mut seq) = (FILE_HEADER as u64, covered);
        let mut header = [0u8; FRAME_HEADER];
        while pos.saturating_add(FRAME_HEADER as u64) <= len {
            wal.file.read(pos, &mut header).map_err(|e| io(name, e))?;
            let available = len - pos - FRAME_HEADER as u64;
            let h = match format::read_header(&header, store_id, seq, available) {
                Ok(h) => h,
                Err(end) => {
                    scan.stopped_at = Some((pos, end));
                    break;
                }
            };
            let mut payload = vec![0u8; h.len];
            wal.file
                .read(pos + FRAME_HEADER as u64, &mut payload)
                .map_err(|e| io(name, e))?;
            if let Err(end) = format::check_payload(&h, &payload) {
                scan.stopped_at = Some((pos, end));
                break;
            }
            replay(seq, &payload)?;
            scan.replayed += 1;
            scan.replayed_bytes += payload.len() as u64;
            pos += (FRAME_HEADER + payload.len()) as u64;
            seq = seq.checked_add(1).ok_or_else(|| {
                StoreError::Corrupt(format!("{name}: the log's seq is exhausted"))
            })?;
        }
        // Past where the log ends: intact frames of this store with a later seq mean the end
        // is damage, not a torn tail. If one was synced before its acknowledgement, refuse;
        // relaxed ones (a power loss may persist a later unsynced record without an earlier
        // one) are dropped, and the next seq goes above them so they are never replayed.
        if let Some((at, _)) = &scan.stopped_at {
            let (later, acknowledged) = wal.look_ahead(*at + 1, len, seq)?;
            if let Some(last) = acknowledged {
                return Err(StoreError::Corrupt(format!(
                    "{name}: the record at byte {at} is damaged but intact records follow it up \
                     to seq {last}, written in immediate durability: acknowledged writes would \
                     be lost. The log is damaged (not a torn tail at a crash); restore the data \
                     directory from a snapshot or copy"
                )));
            }
            if let Some(last) = later {
                let next = last.checked_add(1).ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "{name}: a record past the damaged one at byte {at} claims the last seq"
                    ))
                })?;
                tracing::warn!(
                    file = name,
                    offset = at,
                    dropped_up_to = last,
                    "relaxed-durability records after a damaged one are dropped (a power loss \
                     inside the sync interval)"
                );
                scan.dropped_relaxed = next - seq;
                seq = next;
            }
        }
        wal.next_seq = seq;
        wal.pos = pos;
        if wal.len < INITIAL_BYTES {
            wal.fill_to(INITIAL_BYTES)?;
            wal.file.sync_data().map_err(|e| io(name, e))?;
        }
        Ok((wal, scan))
    }

    /// Looks through `from..len` for intact frames of this store with a seq at or above
    /// `seq`: the greatest such seq, and the greatest of those written in immediate durability.
    fn look_ahead(
        &self,
        from: u64,
        len: u64,
        seq: u64,
    ) -> Result<(Option<u64>, Option<u64>), StoreError> {
        let n = usize::try_from(len.saturating_sub(from)).unwrap_or(0);
        let mut bytes = vec![0u8; n];
        self.file
            .read(from, &mut bytes)
            .map_err(|e| io(&self.name, e))?;
        let id = self.store_id.to_le_bytes();
        let (mut later, mut acknowledged) = (None::<u64>, None::<u64>);
        let mut i = 0usize;
        while i + FRAME_HEADER <= bytes.len() {
            if bytes[i + 8..i + 16] != id {
                i += 1;
                continue;
            }
            let available = (bytes.len() - i - FRAME_HEADER) as u64;
            if let Ok(h) = format::read_any_header(&bytes[i..], self.store_id, available)
                && h.seq >= seq
                && let Some(payload) = bytes.get(i + FRAME_HEADER..i + FRAME_HEADER + h.len)
                && format::check_payload(&h, payload).is_ok()
            {
                later = later.max(Some(h.seq));
                if !h.relaxed {
                    acknowledged = acknowledged.max(Some(h.seq));
                }
            }
            i += 1;
        }
        Ok((later, acknowledged))
    }

    /// The seq the next record gets: a durable commit covers every record before it.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Bytes appended since the last durable commit.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pos - FILE_HEADER as u64
    }

    /// Appends one record (not synced: see [`Wal::sync`]; `relaxed`: it will be acknowledged
    /// before a sync); returns its seq.
    ///
    /// # Errors
    /// The payload is over the frame limit ([`StoreError::TooLarge`]); I/O errors.
    pub(crate) fn append(&mut self, payload: &[u8], relaxed: bool) -> Result<u64, StoreError> {
        let frame = format::frame(self.store_id, self.next_seq, relaxed, payload).map_err(|e| {
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
        self.file
            .write(self.pos, &frame)
            .map_err(|e| io(&self.name, e))?;
        self.pos = end;
        self.unsynced = true;
        let seq = self.next_seq;
        self.next_seq = seq
            .checked_add(1)
            .ok_or_else(|| StoreError::Exhausted(format!("{}: log seqs", self.name)))?;
        Ok(seq)
    }

    /// Extends the file with zeros to at least `end` (and by at least [`GROW_BYTES`]).
    fn grow(&mut self, end: u64) -> Result<(), StoreError> {
        self.fill_to(end.max(self.len.saturating_add(GROW_BYTES)))
    }

    /// Extends the file with zeros to `target` (nothing if it is that long already).
    fn fill_to(&mut self, target: u64) -> Result<(), StoreError> {
        let mut at = self.len;
        while at < target {
            let n = usize::try_from(target - at).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
            self.file
                .write(at, &ZEROS[..n])
                .map_err(|e| io(&self.name, e))?;
            at += n as u64;
        }
        self.len = self.len.max(target);
        Ok(())
    }

    /// Makes every record appended so far durable (`fdatasync`).
    ///
    /// # Errors
    /// I/O errors (the caller halts the store: a failed sync leaves the log's state unknown).
    pub(crate) fn sync(&mut self) -> Result<(), StoreError> {
        if self.unsynced {
            self.file.sync_data().map_err(|e| io(&self.name, e))?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Starts the log over: called after a durable commit that wrote `wal_covered` =
    /// [`Wal::next_seq`], which holds every record appended so far.
    pub(crate) fn restart(&mut self) {
        self.pos = FILE_HEADER as u64;
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
