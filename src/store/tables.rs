//! redb table layout (the only place that knows it) and the byte encodings of table keys.
//!
//! | table | key | value |
//! |---|---|---|
//! | `meta` | name | store format, replica id, epoch, HLC mark, log bounds, truncated-log context, watch feed end |
//! | `rows` | kind byte + key name | encoded [`tidemark_crdts::Entry`]; for an orset an empty header |
//! | `elems` | kind byte + name length (4 B BE) + name + element | encoded `DotSet` of one set element |
//! | `dots` | replica (16 B BE) + seq (8 B BE) | row key, or for an orset dot its `elems` key |
//! | `log` | log seq | encoded [`LogRecord`] (origin + delta) |
//! | `cursors` | peer id | `(peer log id, first seq not joined)` |
//! | `dedup` | encoded `(stream, source)` | encoded `IntervalSet` of seen seqs |
//! | `late` | stream length (4 B BE) + stream + record id (8 B BE) | a late-lane record (JSON text) |
//! | `late_totals` | stream | encoded late-lane totals (bytes kept, records dropped, next id) |
//! | `transfer_stage` | chunk index | an encoded `StateChunk` of the transfer being received (only while one is) |
//! | `late_marks` | name length (4 B BE) + key name + replica (16 B BE) | greatest seq of the replica's dots the lane recorded for that key (8 B BE) |
//!
//! Every value is written through [`crate::codec`] (version byte, size limits on read).

use crate::model::Delta;
use crate::proto::PeerId;
use redb::TableDefinition;
use tidemark_crdts::{Dot, Key, KeyKind, ReplicaId};

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(crate) const ROWS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("rows");
pub(crate) const DOTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dots");
/// One row per element of every orset (store format 3): a set is a header row in `rows` (so
/// listings, key ranges and state chunks keep one row per key) plus its elements here, so an
/// add or remove reads and writes O(1) rows whatever the set's size.
pub(crate) const ELEMS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("elems");
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
pub(crate) const CURSORS: TableDefinition<u64, &[u8]> = TableDefinition::new("cursors");
pub(crate) const DEDUP: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dedup");
/// The late lane: [`late_key`] → a record's text.
pub(crate) const LATE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("late");
/// Per stream, the late lane's encoded totals.
pub(crate) const LATE_TOTALS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("late_totals");
/// Per key and replica, how far the late lane recorded that replica's contribution to the key
/// ([`late_mark_key`] → greatest seq, 8 B BE). Local to the node, removed with the key's row.
pub(crate) const LATE_MARKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("late_marks");

/// The chunks of the state transfer being received, staged until its last chunk arrives
/// (chunk index → encoded [`crate::model::StateChunk`]). Exists only while a transfer is being
/// received: created by its first chunk, deleted with the commit that applies it, on reject,
/// and at every open (a transfer a crash interrupted starts over), so no older build, store
/// format or snapshot ever holds it.
pub(crate) const TRANSFER_STAGE: TableDefinition<u64, &[u8]> =
    TableDefinition::new("transfer_stage");

pub(crate) const META_REPLICA: &str = "replica_id";
pub(crate) const META_EPOCH: &str = "epoch";
pub(crate) const META_HLC: &str = "hlc";
pub(crate) const META_CONTEXT: &str = "context";
pub(crate) const META_LOG_BOUNDS: &str = "log_bounds";
pub(crate) const META_TRUNCATED: &str = "truncated_context";
pub(crate) const META_FORMAT: &str = "store_format";
/// The store's id in its write-ahead log's frames (a random non-zero u64).
pub(crate) const META_WAL_ID: &str = "wal_id";
/// The first write-ahead log seq the durable state does not hold (every record before it is
/// in the database; replay starts here).
pub(crate) const META_WAL_COVERED: &str = "wal_covered";
/// The watch feed's end position left by a clean shutdown (run id, change number).
pub(crate) const META_WATCH_END: &str = "watch_end";

/// The layout of the tables this build writes and reads, stored under `meta/store_format`.
/// 2: counter dots have no dot-index rows (`rows::indexed`). 3: an orset is a header row plus
/// one `elems` row per element, its dots indexed to their element rows. 5: a log record says
/// whether the next record belongs to the same append (`LogRecord::continues`). 6: the
/// database alone may lack acknowledged writes — they can be in the write-ahead log
/// (`tidemark.wal`) — so a build that does not read the log must refuse the directory (the
/// tables are those of format 5, which this build opens and marks 6). A store without the
/// marker was written by format 1 (no deployed data: older formats are refused, not migrated).
pub(crate) const STORE_FORMAT: u32 = 6;

/// The formats this build opens: format 5 needs no change but the marker.
pub(crate) const READABLE_FORMATS: [u32; 2] = [5, STORE_FORMAT];

/// One delta-log entry: where the delta came from (`None`: a local commit) and the delta.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogRecord {
    /// The peer the delta arrived from, or `None` for a local commit group.
    pub origin: Option<PeerId>,
    /// The delta (only its inflating part, for remote deltas).
    pub delta: Delta,
    /// True when the next log record was appended together with this one (a commit group
    /// logged in several records, or one delta split into pieces): such a run is one unit for
    /// `deltas_since` and compaction. A piece alone may not be decidable by context — a
    /// trailing removal piece's context can be a subset of a peer that still holds the removed
    /// dots — while the run's joined context always holds the dots that caused it.
    pub continues: bool,
}

fn kind_byte(kind: KeyKind) -> u8 {
    match kind {
        KeyKind::GCounter => 0,
        KeyKind::PNCounter => 1,
        KeyKind::ORSet => 2,
        KeyKind::Lww => 3,
        KeyKind::MvReg => 4,
    }
}

/// Row key bytes: the kind byte then the name, so rows sort by `(kind, name)` like [`Key`].
pub(crate) fn key_bytes(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.name.len());
    out.push(kind_byte(key.kind));
    out.extend_from_slice(key.name.as_bytes());
    out
}

/// The common prefix of the `elems` keys of the set `key`: kind byte, name length (4 bytes
/// big-endian), name. Length-prefixed, so no set's prefix is a prefix of another set's, and
/// one set's elements are contiguous and ordered like the elements themselves.
pub(crate) fn set_prefix(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + key.name.len());
    out.push(kind_byte(key.kind));
    out.extend_from_slice(
        &u32::try_from(key.name.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(key.name.as_bytes());
    out
}

/// The `elems` key of `element` of the set `key` (see [`set_prefix`]).
pub(crate) fn elem_key(key: &Key, element: &str) -> Vec<u8> {
    let mut out = set_prefix(key);
    out.extend_from_slice(element.as_bytes());
    out
}

/// Parses an `elems` key into its set key and element; `None` for bytes no build wrote.
pub(crate) fn parse_elem_key(bytes: &[u8]) -> Option<(Key, String)> {
    let (&k, rest) = bytes.split_first()?;
    let kind = *KeyKind::ALL.get(usize::from(k))?;
    let len = usize::try_from(u32::from_be_bytes(rest.get(..4)?.try_into().ok()?)).ok()?;
    let name = std::str::from_utf8(rest.get(4..4 + len)?).ok()?;
    let elem = std::str::from_utf8(rest.get(4 + len..)?).ok()?;
    Some((Key::new(kind, name), elem.to_owned()))
}

/// Parses a dot-index value: a row key, or (orset dots) an `elems` key naming the element.
pub(crate) fn parse_index_value(bytes: &[u8]) -> Option<(Key, Option<String>)> {
    if bytes.first() == Some(&kind_byte(KeyKind::ORSet)) {
        parse_elem_key(bytes).map(|(k, e)| (k, Some(e)))
    } else {
        parse_key(bytes).map(|k| (k, None))
    }
}

/// The smallest row key of a kind (range scans per type).
pub(crate) fn kind_prefix(kind: KeyKind) -> [u8; 1] {
    [kind_byte(kind)]
}

/// Parses row key bytes; `None` for bytes no build of ours wrote.
pub(crate) fn parse_key(bytes: &[u8]) -> Option<Key> {
    let (&k, name) = bytes.split_first()?;
    let kind = *KeyKind::ALL.get(usize::from(k))?;
    let name = std::str::from_utf8(name).ok()?;
    Some(Key::new(kind, name))
}

/// Dot index key: 24 bytes, big-endian, so a replica's dots are contiguous and seq-ordered.
pub(crate) fn dot_bytes(dot: Dot) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[..16].copy_from_slice(&dot.replica.to_bytes());
    out[16..].copy_from_slice(&dot.seq.to_be_bytes());
    out
}

/// Dot index key of `(replica, seq)`.
pub(crate) fn dot_key(replica: ReplicaId, seq: u64) -> [u8; 24] {
    dot_bytes(Dot::new(replica, seq))
}

/// The length-prefixed stream (4 B BE length + name) that `dedup` and `late` keys start with,
/// so ("a","bc") and ("ab","c") differ; `extra` bytes of capacity are reserved for the rest.
fn stream_prefix(stream: &str, extra: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + stream.len() + extra);
    out.extend_from_slice(
        &u32::try_from(stream.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(stream.as_bytes());
    out
}

/// Dedup table key for `(stream, source)`.
pub(crate) fn dedup_key(stream: &str, source: &str) -> Vec<u8> {
    let mut out = stream_prefix(stream, source.len());
    out.extend_from_slice(source.as_bytes());
    out
}

/// Late-lane table key of record `id` of `stream`.
pub(crate) fn late_key(stream: &str, id: u64) -> Vec<u8> {
    let mut out = stream_prefix(stream, 8);
    out.extend_from_slice(&id.to_be_bytes());
    out
}

/// `late_marks` key of `replica`'s contribution to the key named `name` (the kind is left
/// out: a view cell's name says its kind).
pub(crate) fn late_mark_key(name: &str, replica: ReplicaId) -> Vec<u8> {
    let mut out = stream_prefix(name, 16);
    out.extend_from_slice(&replica.0.to_be_bytes());
    out
}

/// The record id of a late-lane key of `stream` (`None` for another stream's key).
pub(crate) fn parse_late_id(stream: &str, key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(stream_prefix(stream, 0).as_slice())?;
    Some(u64::from_be_bytes(rest.try_into().ok()?))
}

/// Parses a dedup table key.
pub(crate) fn parse_dedup_key(bytes: &[u8]) -> Option<(String, String)> {
    let len = usize::try_from(u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?)).ok()?;
    let stream = std::str::from_utf8(bytes.get(4..4 + len)?).ok()?;
    let source = std::str::from_utf8(bytes.get(4 + len..)?).ok()?;
    Some((stream.to_owned(), source.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_encodings_roundtrip_and_sort_like_keys() {
        let a = Key::new(KeyKind::GCounter, "zeta");
        let b = Key::new(KeyKind::ORSet, "alpha");
        assert_eq!(parse_key(&key_bytes(&a)), Some(a.clone()));
        assert!(key_bytes(&a) < key_bytes(&b));
        assert_eq!(parse_key(&[9, b'x']), None);
        let d = dedup_key("clicks", "app-7");
        assert_eq!(parse_dedup_key(&d), Some(("clicks".into(), "app-7".into())));
        assert!(dot_key(ReplicaId(1), 2) < dot_key(ReplicaId(1), 10));
        let s = Key::new(KeyKind::ORSet, "a");
        let e = elem_key(&s, "\"x\"");
        assert_eq!(parse_elem_key(&e), Some((s.clone(), "\"x\"".into())));
        assert_eq!(
            parse_index_value(&e),
            Some((s.clone(), Some("\"x\"".into())))
        );
        assert_eq!(parse_index_value(&key_bytes(&a)), Some((a, None)));
        // Set "a" with any element never shares a prefix with set "ab".
        let ab = Key::new(KeyKind::ORSet, "ab");
        assert!(!elem_key(&ab, "").starts_with(&set_prefix(&s)));
        assert!(!elem_key(&s, "b").starts_with(&set_prefix(&ab)));
    }
}
