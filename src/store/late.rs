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
use super::wal::Redo;
use crate::codec;
use crate::codec::wal::RedoTable;
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

/// The key space of `stream`'s contribution records: apart from its event records, with a
/// byte bound of its own, so a flood of contributions (a removed member that wrote to many
/// cells) never pushes an event record out. Stream names hold no control character.
fn contributions_lane(stream: &str) -> String {
    format!("{stream}\u{0}contributions")
}

fn read_totals(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    lane: &str,
    record_max: usize,
) -> Result<Totals, StoreError> {
    match table.get(lane.as_bytes()).map_err(StoreError::redb)? {
        Some(g) => decode_totals(g.value(), record_max),
        None => Ok(Totals::default()),
    }
}

/// Appends `notes` in `txn`. Each stream keeps two lanes, each within `bytes_max` (the oldest
/// records dropped first and counted): its event records, and its contribution records
/// (notes with a mark). Ids come from one counter per stream, so a page merges both lanes in
/// id order.
///
/// # Errors
/// Storage failures and corrupt totals.
pub(crate) fn append(
    txn: &WriteTransaction,
    notes: &[&LateNote],
    bytes_max: usize,
    record_max: usize,
    redo: &mut Redo,
) -> Result<(), StoreError> {
    if notes.is_empty() {
        return Ok(());
    }
    let mut lane_t = txn.open_table(LATE).map_err(StoreError::redb)?;
    let mut totals_t = txn.open_table(LATE_TOTALS).map_err(StoreError::redb)?;
    if notes.iter().any(|n| n.mark.is_some()) {
        let mut marks = txn.open_table(LATE_MARKS).map_err(StoreError::redb)?;
        for m in notes.iter().filter_map(|n| n.mark.as_ref()) {
            let (k, v) = (late_mark_key(&m.key, m.replica), m.seq.to_be_bytes());
            marks
                .insert(k.as_slice(), v.as_slice())
                .map_err(StoreError::redb)?;
            redo.put(RedoTable::LateMarks, &k, &v);
        }
    }
    let bytes_max = u64::try_from(bytes_max).unwrap_or(u64::MAX);
    let mut streams: Vec<&str> = notes.iter().map(|n| n.stream.as_str()).collect();
    streams.sort_unstable();
    streams.dedup();
    for stream in streams {
        let c_lane = contributions_lane(stream);
        let mut totals = read_totals(&totals_t, stream, record_max)?;
        let mut c_totals = read_totals(&totals_t, &c_lane, record_max)?;
        for note in notes.iter().filter(|n| n.stream == stream) {
            let id = totals.next;
            totals.next = totals.next.saturating_add(1);
            let (lane, t) = if note.mark.is_some() {
                (c_lane.as_str(), &mut c_totals)
            } else {
                (stream, &mut totals)
            };
            let k = late_key(lane, id);
            lane_t
                .insert(k.as_slice(), note.record.as_bytes())
                .map_err(StoreError::redb)?;
            redo.put(RedoTable::Late, &k, note.record.as_bytes());
            t.bytes = t.bytes.saturating_add(note.record.len() as u64);
        }
        for (lane, t) in [(stream, &mut totals), (c_lane.as_str(), &mut c_totals)] {
            let (start, end) = (late_key(lane, 0), late_key(lane, u64::MAX));
            while t.bytes > bytes_max {
                let Some((k, len)) = lane_t
                    .range(start.as_slice()..=end.as_slice())
                    .map_err(StoreError::redb)?
                    .next()
                    .transpose()
                    .map_err(StoreError::redb)?
                    .map(|(k, v)| (k.value().to_vec(), v.value().len() as u64))
                else {
                    break;
                };
                lane_t.remove(k.as_slice()).map_err(StoreError::redb)?;
                redo.del(RedoTable::Late, &k);
                t.bytes = t.bytes.saturating_sub(len);
                t.dropped = t.dropped.saturating_add(1);
            }
            if lane != stream && *t == Totals::default() {
                continue; // no contribution lane: nothing to keep
            }
            let enc =
                codec::encode("late lane totals", &*t).map_err(|source| StoreError::Codec {
                    table: "late_totals",
                    source,
                })?;
            totals_t
                .insert(lane.as_bytes(), enc.as_slice())
                .map_err(StoreError::redb)?;
            redo.put(RedoTable::LateTotals, lane.as_bytes(), &enc);
        }
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

/// Up to `limit` records of `stream`'s lane with ids above `after` (all with `None`): its
/// event and contribution records merged in id order; the totals are both lanes' together.
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
    let lane_t = match rtxn.open_table(LATE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(LatePage::default()),
        Err(e) => return Err(StoreError::redb(e)),
    };
    let totals_t = rtxn.open_table(LATE_TOTALS).map_err(StoreError::redb)?;
    let c_lane = contributions_lane(stream);
    let (e, c) = (
        read_totals(&totals_t, stream, record_max)?,
        read_totals(&totals_t, &c_lane, record_max)?,
    );
    let totals = Totals {
        bytes: e.bytes.saturating_add(c.bytes),
        dropped: e.dropped.saturating_add(c.dropped),
        next: e.next,
    };
    let start = match after {
        None => 0,
        Some(u64::MAX) => {
            return Ok(LatePage {
                records: Vec::new(),
                totals,
            });
        }
        Some(a) => a + 1,
    };
    let mut records = Vec::new();
    for lane in [stream, c_lane.as_str()] {
        let (lo, hi) = (late_key(lane, start), late_key(lane, u64::MAX));
        for item in lane_t
            .range(lo.as_slice()..=hi.as_slice())
            .map_err(StoreError::redb)?
            .take(limit)
        {
            let (k, v) = item.map_err(StoreError::redb)?;
            let Some(id) = parse_late_id(lane, k.value()) else {
                continue;
            };
            records.push((id, String::from_utf8_lossy(v.value()).into_owned()));
        }
    }
    records.sort_unstable_by_key(|(id, _)| *id);
    records.truncate(limit);
    Ok(LatePage { records, totals })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(stream: &str, text: &str, mark: Option<u64>) -> LateNote {
        LateNote {
            stream: stream.to_owned(),
            record: text.to_owned(),
            mark: mark.map(|seq| LateMark {
                key: format!("cell-{seq}"),
                replica: ReplicaId(7),
                seq,
            }),
        }
    }

    #[test]
    fn a_flood_of_contributions_never_pushes_an_event_record_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = redb::Database::create(dir.path().join("db")).expect("db");
        let bytes_max = 100;
        let write = |notes: Vec<LateNote>| {
            let txn = db.begin_write().expect("txn");
            let refs: Vec<&LateNote> = notes.iter().collect();
            append(&txn, &refs, bytes_max, 1 << 20, &mut Redo::default()).expect("append");
            txn.commit().expect("commit");
        };
        write(vec![note("s", "event-0", None)]);
        // 50 contributions of 10 bytes each: the contribution lane keeps the last 10.
        for i in 0..50 {
            write(vec![note("s", &format!("contrib-{i:02}"), Some(i + 1))]);
        }
        write(vec![note("s", "event-1", None), note("t", "other", None)]);
        let p = page(&db, "s", None, 1_000, 1 << 20).expect("page");
        let texts: Vec<&str> = p.records.iter().map(|(_, t)| t.as_str()).collect();
        let mut want = vec!["event-0".to_owned()];
        want.extend((40..50).map(|i| format!("contrib-{i:02}")));
        want.push("event-1".to_owned());
        assert_eq!(texts, want);
        // Ids ascend across both lanes; the totals count both.
        let ids: Vec<u64> = p.records.iter().map(|(id, _)| *id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        assert_eq!((ids[0], ids[ids.len() - 1]), (0, 51));
        assert_eq!(p.totals.dropped, 40);
        assert_eq!(p.totals.bytes, 7 + 10 * 10 + 7);
        assert_eq!(p.totals.next, 52);
        // Paging merges by id: after the first event, two records.
        let p2 = page(&db, "s", Some(0), 2, 1 << 20).expect("page");
        let got: Vec<&str> = p2.records.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(got, ["contrib-40", "contrib-41"]);
        // Each mark is kept.
        assert_eq!(mark(&db, "cell-50", ReplicaId(7)).expect("mark"), Some(50));
        assert_eq!(mark(&db, "cell-50", ReplicaId(8)).expect("mark"), None);
        // Another stream's lane is its own.
        let t = page(&db, "t", None, 10, 1 << 20).expect("page");
        assert_eq!(t.records, vec![(0, "other".to_owned())]);
    }
}
