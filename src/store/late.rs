//! The late lane: events a node acknowledged but applied to no view for being late, kept per
//! stream so nothing a client sent disappears without a trace.
//!
//! A late record is written in the same transaction as its event's write (and only when that
//! write is applied: never for a duplicate or a refused write), so a crash keeps both or
//! neither. Each stream's lane is bounded in bytes (`limits.late_bytes_max`): appending past
//! it drops the oldest records first and counts them. Records are opaque text to the store
//! (the views layer writes and reads them); ids are per stream, ascending, never reused.
//!
//! Tables and key encodings: [`super::tables`] (`late`, `late_totals`).

use super::error::StoreError;
use super::tables::{LATE, LATE_TOTALS, late_key, parse_late_id};
use crate::codec;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

/// A late event to keep: its stream and the record (text the views layer defines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateNote {
    /// The stream the event was ingested into.
    pub stream: String,
    /// The record kept (JSON text: the event, why it was late, the node, when).
    pub record: String,
}

/// One stream's lane, as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Totals {
    /// Bytes of the records kept.
    pub bytes: u64,
    /// Records dropped (oldest first) to stay within the byte bound.
    pub dropped: u64,
    /// The id the next record gets.
    pub next: u64,
}

/// A page of a stream's late lane.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatePage {
    /// `(id, record)` ascending by id.
    pub records: Vec<(u64, String)>,
    /// The lane's totals.
    pub totals: Totals,
}

fn decode_totals(bytes: &[u8], max: usize) -> Result<Totals, StoreError> {
    codec::decode("late lane totals", bytes, max).map_err(|source| StoreError::Codec {
        table: "late_totals",
        source,
    })
}

/// Appends `notes` in `txn`, dropping the oldest records of a stream past `bytes_max`.
///
/// # Errors
/// Storage failures and corrupt totals.
pub(crate) fn append(
    txn: &WriteTransaction,
    notes: &[&LateNote],
    bytes_max: usize,
    record_max: usize,
) -> Result<(), StoreError> {
    if notes.is_empty() {
        return Ok(());
    }
    let mut lane = txn.open_table(LATE).map_err(StoreError::redb)?;
    let mut totals_t = txn.open_table(LATE_TOTALS).map_err(StoreError::redb)?;
    let bytes_max = u64::try_from(bytes_max).unwrap_or(u64::MAX);
    let mut streams: Vec<&str> = notes.iter().map(|n| n.stream.as_str()).collect();
    streams.sort_unstable();
    streams.dedup();
    for stream in streams {
        let mut totals = match totals_t.get(stream.as_bytes()).map_err(StoreError::redb)? {
            Some(g) => decode_totals(g.value(), record_max)?,
            None => Totals::default(),
        };
        for note in notes.iter().filter(|n| n.stream == stream) {
            let id = totals.next;
            totals.next = totals.next.saturating_add(1);
            lane.insert(late_key(stream, id).as_slice(), note.record.as_bytes())
                .map_err(StoreError::redb)?;
            totals.bytes = totals.bytes.saturating_add(note.record.len() as u64);
        }
        let (start, end) = (late_key(stream, 0), late_key(stream, u64::MAX));
        while totals.bytes > bytes_max {
            let Some((k, len)) = lane
                .range(start.as_slice()..=end.as_slice())
                .map_err(StoreError::redb)?
                .next()
                .transpose()
                .map_err(StoreError::redb)?
                .map(|(k, v)| (k.value().to_vec(), v.value().len() as u64))
            else {
                break;
            };
            lane.remove(k.as_slice()).map_err(StoreError::redb)?;
            totals.bytes = totals.bytes.saturating_sub(len);
            totals.dropped = totals.dropped.saturating_add(1);
        }
        let enc =
            codec::encode("late lane totals", &totals).map_err(|source| StoreError::Codec {
                table: "late_totals",
                source,
            })?;
        totals_t
            .insert(stream.as_bytes(), enc.as_slice())
            .map_err(StoreError::redb)?;
    }
    Ok(())
}

/// Up to `limit` records of `stream`'s lane with ids above `after` (all with `None`).
///
/// # Errors
/// Storage failures and corrupt rows.
pub(crate) fn page(
    db: &redb::Database,
    stream: &str,
    after: Option<u64>,
    limit: usize,
    record_max: usize,
) -> Result<LatePage, StoreError> {
    let rtxn = db.begin_read().map_err(StoreError::redb)?;
    let lane = match rtxn.open_table(LATE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(LatePage::default()),
        Err(e) => return Err(StoreError::redb(e)),
    };
    let totals = match rtxn
        .open_table(LATE_TOTALS)
        .map_err(StoreError::redb)?
        .get(stream.as_bytes())
        .map_err(StoreError::redb)?
    {
        Some(g) => decode_totals(g.value(), record_max)?,
        None => Totals::default(),
    };
    let mut records = Vec::new();
    let start = match after {
        None => 0,
        Some(u64::MAX) => return Ok(LatePage { records, totals }),
        Some(a) => a + 1,
    };
    let (start, end) = (late_key(stream, start), late_key(stream, u64::MAX));
    for item in lane
        .range(start.as_slice()..=end.as_slice())
        .map_err(StoreError::redb)?
    {
        if records.len() >= limit {
            break;
        }
        let (k, v) = item.map_err(StoreError::redb)?;
        let Some(id) = parse_late_id(stream, k.value()) else {
            continue;
        };
        let text = String::from_utf8_lossy(v.value()).into_owned();
        records.push((id, text));
    }
    Ok(LatePage { records, totals })
}
