//! Byte formats of the write-ahead log (`store/wal.rs`): the frame each log record is written
//! in, and the redo operations a local commit group's record carries.
//!
//! File header ([`FILE_HEADER`] bytes): magic `TIDEWAL1` · `store_id` u64 · 12 zero bytes ·
//! CRC32C of the 28 bytes before it. It names the store the log belongs to, so a zeroed,
//! damaged or foreign file is told apart from an empty log.
//!
//! Frame, little-endian: `len` u32 (payload bytes; the top bit set when the record was written
//! in relaxed durability, i.e. not synced before its acknowledgement) · `crc` u32 (CRC32C over
//! the `len` field, the 16 bytes after the CRC and the payload) · `store_id` u64 · `seq` u64 ·
//! payload. A frame is valid only when its
//! length is within [`PAYLOAD_MAX`] and the bytes present, its checksum matches, its store id is
//! the store's and its seq is the one expected next: the first frame that is not marks the end
//! of the log (a torn tail, or a record of an earlier pass over the file).
//!
//! Payload (redo operations, in the order the commit made them): per operation one byte
//! `table << 1 | delete`, the key's length (u32) and bytes, and for a put the value's length
//! (u32) and bytes. Replaying them in order over the state they were made on, or over any
//! state reached by replaying a prefix of the same run, gives the state the commit left: each
//! is a blind write (set a key to bytes, or remove it).

use super::CodecError;

/// Bytes of a frame's header.
pub const FRAME_HEADER: usize = 24;

/// Bytes of the file header; frames start after it.
pub const FILE_HEADER: usize = 32;

const MAGIC: &[u8; 8] = b"TIDEWAL1";

/// The top bit of a frame's `len` field: written in relaxed durability.
const RELAXED_BIT: u32 = 1 << 31;

/// The file header of `store_id`'s log.
pub fn file_header(store_id: u64) -> [u8; FILE_HEADER] {
    let mut h = [0u8; FILE_HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&store_id.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The store id a file header names; `None` when the bytes are not a file header.
pub fn read_file_header(bytes: &[u8]) -> Option<u64> {
    let h = bytes.get(..FILE_HEADER)?;
    if &h[..8] != MAGIC || h[16..28].iter().any(|b| *b != 0) {
        return None;
    }
    (crc32c::crc32c(&h[..28]) == le_u32(&h[28..32])).then(|| le_u64(&h[8..16]))
}

/// Largest payload a frame may carry (64 MiB): a commit group whose redo is larger commits
/// durably in redb instead of through the log.
pub const PAYLOAD_MAX: usize = 64 << 20;

/// The tables a redo operation writes. The byte values are the log format: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedoTable {
    /// `meta` (key: UTF-8 name).
    Meta = 0,
    /// `rows`.
    Rows = 1,
    /// `elems`.
    Elems = 2,
    /// `dots`.
    Dots = 3,
    /// `log` (key: seq, 8 bytes big-endian).
    Log = 4,
    /// `dedup`.
    Dedup = 5,
    /// `late`.
    Late = 6,
    /// `late_totals`.
    LateTotals = 7,
    /// `late_marks`.
    LateMarks = 8,
}

impl RedoTable {
    const ALL: [RedoTable; 9] = [
        Self::Meta,
        Self::Rows,
        Self::Elems,
        Self::Dots,
        Self::Log,
        Self::Dedup,
        Self::Late,
        Self::LateTotals,
        Self::LateMarks,
    ];
}

/// One redo operation: `value: None` removes the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedoOp<'a> {
    /// The table written.
    pub table: RedoTable,
    /// The key's bytes.
    pub key: &'a [u8],
    /// The value written, or `None` for a removal.
    pub value: Option<&'a [u8]>,
}

fn push_len(buf: &mut Vec<u8>, len: usize) {
    // Keys and values are bounded far below 4 GiB by the store's limits; a longer one would
    // not fit a frame either, and the frame's size check refuses the record whole.
    buf.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

/// Appends a put of `key` → `value` in `table` to a redo payload.
pub fn push_put(buf: &mut Vec<u8>, table: RedoTable, key: &[u8], value: &[u8]) {
    buf.push((table as u8) << 1);
    push_len(buf, key.len());
    buf.extend_from_slice(key);
    push_len(buf, value.len());
    buf.extend_from_slice(value);
}

/// Appends a removal of `key` from `table` to a redo payload.
pub fn push_del(buf: &mut Vec<u8>, table: RedoTable, key: &[u8]) {
    buf.push(((table as u8) << 1) | 1);
    push_len(buf, key.len());
    buf.extend_from_slice(key);
}

fn malformed(detail: impl Into<String>) -> CodecError {
    CodecError::Malformed {
        what: "log record",
        detail: detail.into(),
    }
}

fn take<'a>(rest: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], CodecError> {
    if rest.len() < n {
        return Err(malformed(format!(
            "{what}: {n} bytes claimed, {} left",
            rest.len()
        )));
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn take_len(rest: &mut &[u8], what: &str) -> Result<usize, CodecError> {
    let b = take(rest, 4, what)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    usize::try_from(u32::from_le_bytes(a)).map_err(|_| malformed(format!("{what}: length")))
}

/// Decodes a redo payload into its operations, in order. Never panics and allocates at most
/// one slot per 9 input bytes (the smallest operation).
///
/// # Errors
/// [`CodecError::Malformed`] naming the first operation that is not well formed (unknown
/// table, length past the end).
pub fn redo_ops(payload: &[u8]) -> Result<Vec<RedoOp<'_>>, CodecError> {
    let mut ops = Vec::new();
    let mut rest = payload;
    while let Some((&tag, tail)) = rest.split_first() {
        rest = tail;
        let table = *RedoTable::ALL
            .get(usize::from(tag >> 1))
            .ok_or_else(|| malformed(format!("operation {}: table {}", ops.len(), tag >> 1)))?;
        let klen = take_len(&mut rest, "key length")?;
        let key = take(&mut rest, klen, "key")?;
        let value = if tag & 1 == 1 {
            None
        } else {
            let vlen = take_len(&mut rest, "value length")?;
            Some(take(&mut rest, vlen, "value")?)
        };
        ops.push(RedoOp { table, key, value });
    }
    Ok(ops)
}

/// The frame of one log record (`relaxed`: written in relaxed durability).
///
/// # Errors
/// [`CodecError::TooLarge`] when the payload exceeds [`PAYLOAD_MAX`].
pub fn frame(
    store_id: u64,
    seq: u64,
    relaxed: bool,
    payload: &[u8],
) -> Result<Vec<u8>, CodecError> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|_| payload.len() <= PAYLOAD_MAX)
        .ok_or(CodecError::TooLarge {
            what: "log record",
            len: payload.len(),
            limit: PAYLOAD_MAX,
        })?;
    let field = if relaxed { len | RELAXED_BIT } else { len };
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.extend_from_slice(&field.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&store_id.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..4]), &out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Why a scan of the log stopped at a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameEnd {
    /// Fewer bytes than a header, or than the length the header claims.
    Short,
    /// A length over [`PAYLOAD_MAX`].
    Length(u64),
    /// Another store's frame.
    Store(u64),
    /// Not the seq expected next (a frame of an earlier pass over the file).
    Seq(u64),
    /// The checksum does not match (a torn or damaged frame).
    Checksum,
}

/// A frame header as read: what the payload must be checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload bytes.
    pub len: usize,
    /// Written in relaxed durability (not synced before its acknowledgement).
    pub relaxed: bool,
    /// The record's seq.
    pub seq: u64,
    crc: u32,
    /// The `len` field and the 16 bytes after the CRC: what the CRC covers before the payload.
    covered: [u8; 20],
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// Checks a frame header (`bytes`: at least its 24 bytes) against the store and the seq
/// expected; `available` is how many bytes of the file follow the header.
///
/// # Errors
/// Why this frame ends the log.
pub fn read_header(
    bytes: &[u8],
    store_id: u64,
    seq: u64,
    available: u64,
) -> Result<FrameHeader, FrameEnd> {
    let h = read_any_header(bytes, store_id, available)?;
    if h.seq != seq {
        return Err(FrameEnd::Seq(h.seq));
    }
    Ok(h)
}

/// [`read_header`] whatever the seq (the look-ahead past a damaged frame).
///
/// # Errors
/// Why these bytes are no frame of this store.
pub fn read_any_header(
    bytes: &[u8],
    store_id: u64,
    available: u64,
) -> Result<FrameHeader, FrameEnd> {
    let h = bytes.get(..FRAME_HEADER).ok_or(FrameEnd::Short)?;
    let field = le_u32(&h[0..4]);
    let len = field & !RELAXED_BIT;
    if usize::try_from(len).map_or(true, |l| l > PAYLOAD_MAX) {
        return Err(FrameEnd::Length(u64::from(len)));
    }
    if u64::from(len) > available {
        return Err(FrameEnd::Short);
    }
    let id = le_u64(&h[8..16]);
    if id != store_id {
        return Err(FrameEnd::Store(id));
    }
    let mut covered = [0u8; 20];
    covered[..4].copy_from_slice(&h[0..4]);
    covered[4..].copy_from_slice(&h[8..24]);
    Ok(FrameHeader {
        len: usize::try_from(len).unwrap_or(usize::MAX),
        relaxed: field & RELAXED_BIT != 0,
        seq: le_u64(&h[16..24]),
        crc: le_u32(&h[4..8]),
        covered,
    })
}

/// Checks a frame's payload against its header's checksum.
///
/// # Errors
/// [`FrameEnd::Checksum`] when it does not match (or the payload is not the header's length).
pub fn check_payload(header: &FrameHeader, payload: &[u8]) -> Result<(), FrameEnd> {
    if payload.len() != header.len {
        return Err(FrameEnd::Short);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header.covered), payload);
    if crc == header.crc {
        Ok(())
    } else {
        Err(FrameEnd::Checksum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_ops_round_trip_and_damage_is_seen() {
        let mut p = Vec::new();
        push_put(&mut p, RedoTable::Rows, b"k", b"value");
        push_del(&mut p, RedoTable::Dots, b"dot");
        push_put(&mut p, RedoTable::Meta, b"context", b"");
        let ops = redo_ops(&p).expect("decodes");
        assert_eq!(
            ops,
            vec![
                RedoOp {
                    table: RedoTable::Rows,
                    key: b"k",
                    value: Some(b"value")
                },
                RedoOp {
                    table: RedoTable::Dots,
                    key: b"dot",
                    value: None
                },
                RedoOp {
                    table: RedoTable::Meta,
                    key: b"context",
                    value: Some(b"")
                },
            ]
        );
        for cut in 0..p.len() {
            // Every strict prefix that cuts an operation is refused, never misread.
            let r = redo_ops(&p[..cut]);
            assert!(
                r.is_err() || [0, 15, 23].contains(&cut),
                "prefix {cut}: {r:?}"
            );
        }
        let f = frame(7, 42, false, &p).expect("frames");
        let h = read_header(&f, 7, 42, (f.len() - FRAME_HEADER) as u64).expect("header");
        assert_eq!(check_payload(&h, &f[FRAME_HEADER..]), Ok(()));
        assert_eq!(read_header(&f, 8, 42, 1 << 20), Err(FrameEnd::Store(7)));
        assert_eq!(read_header(&f, 7, 43, 1 << 20), Err(FrameEnd::Seq(42)));
        assert_eq!(read_header(&f, 7, 42, 3), Err(FrameEnd::Short));
        assert!(!h.relaxed);
        let r = frame(7, 42, true, &p).expect("frames");
        let rh = read_header(&r, 7, 42, 1 << 20).expect("header");
        assert!(rh.relaxed && rh.len == p.len());
        assert_eq!(check_payload(&rh, &r[FRAME_HEADER..]), Ok(()));
        // The length field is covered: a changed flag fails the checksum.
        let mut flipped = r.clone();
        flipped[3] ^= 0x80;
        let fh = read_header(&flipped, 7, 42, 1 << 20).expect("header");
        assert_eq!(
            check_payload(&fh, &flipped[FRAME_HEADER..]),
            Err(FrameEnd::Checksum)
        );
        assert_eq!(read_file_header(&file_header(9)), Some(9));
        let mut bad = file_header(9);
        bad[10] ^= 1;
        assert_eq!(read_file_header(&bad), None);
        assert_eq!(read_file_header(&[0u8; FILE_HEADER]), None);
        for i in FRAME_HEADER..f.len() {
            let mut bad = f.clone();
            bad[i] ^= 0x20;
            assert_eq!(
                check_payload(&h, &bad[FRAME_HEADER..]),
                Err(FrameEnd::Checksum),
                "flipped byte {i}"
            );
        }
    }
}
