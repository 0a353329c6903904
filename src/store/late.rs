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
use super::tables::{LATE, LATE_MARKS, LATE_TOTALS, late_key, late_mark_key, parse_late_id};
use crate::codec;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use tidemark_crdts::ReplicaId;

/// A late event to keep: its stream and the record (text the views layer defines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateNote {
    /// The stream the event was ingested into.
    pub stream: String,
    /// The record kept (JSON text: the event, why it was late, the node, when).
    pub record: String,
    /// For a record of a replica's contribution to a key (rather than of an event), how far
    /// it goes: written with the record, so the contribution is recorded once, across
    /// restarts too ([`mark`]).
    pub mark: Option<LateMark>,
}

/// How far the late lane recorded one replica's contribution to one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateMark {
    /// The key's name.
    pub key: String,
    /// The contributing replica.
    pub replica: ReplicaId,
    /// The greatest seq of its dots the record covers.
    pub seq: u64,
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
    if notes.iter().any(|n| n.mark.is_some()) {
        let mut marks = txn.open_table(LATE_MARKS).map_err(StoreError::redb)?;
        for m in notes.iter().filter_map(|n| n.mark.as_ref()) {
            marks
                .insert(
                    late_mark_key(&m.key, m.replica).as_slice(),
                    m.seq.to_be_bytes().as_slice(),
                )
                .map_err(StoreError::redb)?;
        }
    }
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

/// The greatest seq of `replica`'s dots in key `name` the lane recorded (`None`: none).
///
/// # Errors
/// Storage failures.
pub(crate) fn mark(
    db: &redb::Database,
    name: &str,
    replica: ReplicaId,
) -> Result<Option<u64>, StoreError> {
    let rtxn = db.begin_read().map_err(StoreError::redb)?;
    let marks = match rtxn.open_table(LATE_MARKS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(StoreError::redb(e)),
    };
    Ok(marks
        .get(late_mark_key(name, replica).as_slice())
        .map_err(StoreError::redb)?
        .and_then(|g| g.value().try_into().ok().map(u64::from_be_bytes)))
}

/// Removes the marks of the keys named `names` (their rows are being removed), in `txn`.
///
/// # Errors
/// Storage failures.
pub(crate) fn forget_marks<'a>(
    txn: &WriteTransaction,
    names: impl Iterator<Item = &'a str>,
) -> Result<(), StoreError> {
    let mut marks = txn.open_table(LATE_MARKS).map_err(StoreError::redb)?;
    for name in names {
        let (lo, hi) = (
            late_mark_key(name, ReplicaId(0)),
            late_mark_key(name, ReplicaId(u128::MAX)),
        );
        marks
            .retain_in(lo.as_slice()..=hi.as_slice(), |_, _| false)
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
