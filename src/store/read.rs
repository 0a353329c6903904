//! Readers: MVCC read transactions over the store's tables. A reader sees the last committed
//! state, never blocks the writer, and is cheap to clone and share across threads.

use super::error::StoreError;
use super::kv::KvRead;
use super::rows::{for_each_elem, open_read_tables, per_element, read_entry, row_entry};
use super::tables::{
    DOTS, ELEMS, LOG, META, META_CONTEXT, ROWS, dot_bytes, elem_key, key_bytes, kind_prefix, parse_key,
};
use crate::codec;
use crate::limits::Limits;
use redb::{Database, ReadableDatabase, ReadableTableMetadata};
use std::ops::Bound;
use std::sync::Arc;
use tidemark_crdts::{CausalContext, DotStore, Entry, Key, KeyKind, ReplicaId, Value};

/// A shareable read handle on the store.
#[derive(Clone)]
pub struct Reader {
    db: Arc<Database>,
    limits: Limits,
    /// Set by [`Reader::snapshot`]: every read goes through this one transaction.
    snap: Option<Arc<redb::ReadTransaction>>,
}

/// Tells when every handle on a store's database is gone (the file lock released): see
/// [`Reader::release_watch`].
#[derive(Debug)]
pub struct ReleaseWatch(std::sync::Weak<Database>);

impl ReleaseWatch {
    /// True once no reader or store holds the database any more.
    pub fn released(&self) -> bool {
        self.0.strong_count() == 0
    }
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

/// Encoded bytes of a run of delta-log entries ([`Reader::log_bytes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogBytes {
    /// The encoded bytes of the entries summed (all of them when `exact`).
    pub bytes: u64,
    /// False when the run holds more entries than were summed: `bytes` is then a lower bound.
    pub exact: bool,
}

/// The most delta-log entries [`Reader::log_bytes`] sums in one call.
pub const LOG_BYTES_ENTRIES_MAX: u64 = 4096;

impl Reader {
    /// A watch on this database's handles: released once the store and every reader of it
    /// are dropped (a reader held by a task for a moment holds the file lock with it).
    pub fn release_watch(&self) -> ReleaseWatch {
        ReleaseWatch(Arc::downgrade(&self.db))
    }

    pub(crate) fn new(db: Arc<Database>, limits: Limits) -> Self {
        Self {
            db,
            limits,
            snap: None,
        }
    }

    /// A reader pinned to one read transaction: every read through it (and its clones) sees
    /// the same committed state, however many reads it takes — what a view page needs so its
    /// finality inputs and its rows come from one state and no window shows partially
    /// removed. Hold it only as long as the page takes (it keeps that state's pages alive).
    ///
    /// # Errors
    /// Storage failures.
    pub fn snapshot(&self) -> Result<Reader, StoreError> {
        Ok(Self {
            db: Arc::clone(&self.db),
            limits: self.limits.clone(),
            snap: Some(Arc::new(self.db.begin_read().map_err(StoreError::redb)?)),
        })
    }

    /// The transaction a read uses: the pinned one, or a fresh one per read.
    fn rtxn(&self) -> Result<Arc<redb::ReadTransaction>, StoreError> {
        match &self.snap {
            Some(t) => Ok(Arc::clone(t)),
            None => Ok(Arc::new(self.db.begin_read().map_err(StoreError::redb)?)),
        }
    }

    /// The encoded bytes of the committed delta-log entries with sequence numbers in
    /// `[from, to)` (a peer's replication lag in bytes: from its acknowledged cursor to our
    /// log's end). The log keeps no sizes, so this is a bounded computation: one redb range
    /// over the log table, summing the stored length of at most `entries_max` entries (each
    /// entry's bytes are read by the range); when the run holds more, the sum stops there
    /// and is marked not `exact` (a lower bound). Entries compacted away are not counted.
    ///
    /// # Errors
    /// Storage failures.
    pub fn log_bytes(&self, from: u64, to: u64, entries_max: u64) -> Result<LogBytes, StoreError> {
        let mut out = LogBytes {
            bytes: 0,
            exact: true,
        };
        if from >= to {
            return Ok(out);
        }
        let rtxn = self.db.begin_read().map_err(StoreError::redb)?;
        let log = rtxn.open_table(LOG).map_err(StoreError::redb)?;
        for (summed, item) in (0u64..).zip(log.range(from..to).map_err(StoreError::redb)?) {
            if summed == entries_max {
                out.exact = false;
                break;
            }
            let (_, record) = item.map_err(StoreError::redb)?;
            out.bytes = out.bytes.saturating_add(record.value().len() as u64);
        }
        Ok(out)
    }

    /// The committed entry of `key`.
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub fn entry(&self, key: &Key) -> Result<Option<Entry>, StoreError> {
        let rtxn = self.rtxn()?;
        let (rows, elems) = open_read_tables(&rtxn)?;
        read_entry(&rows, &elems, key, self.limits.record_bytes_max)
    }

    /// Whether the committed set `key` holds `element`: one element row is read, whatever
    /// the set's size (`false` for a key of another kind).
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub fn set_contains(&self, key: &Key, element: &str) -> Result<bool, StoreError> {
        if !per_element(key.kind) {
            return Ok(false);
        }
        let rtxn = self.rtxn()?;
        let elems = rtxn.open_table(ELEMS).map_err(StoreError::redb)?;
        let found = elems
            .get_bytes(elem_key(key, element).as_slice())?
            .is_some();
        Ok(found)
    }

    /// Whether the committed set `key` holds `element` under a dot of `replica` (one element
    /// row is read): what an own-dots writer (`LocalWrite::own_dots`) needs to know that
    /// re-adding the element would change nothing of its own contribution.
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub fn set_holds_own(
        &self,
        key: &Key,
        element: &str,
        replica: tidemark_crdts::ReplicaId,
    ) -> Result<bool, StoreError> {
        if !per_element(key.kind) {
            return Ok(false);
        }
        let rtxn = self.rtxn()?;
        let elems = rtxn.open_table(ELEMS).map_err(StoreError::redb)?;
        let Some(row) = elems.get_bytes(elem_key(key, element).as_slice())? else {
            return Ok(false);
        };
        let dots: tidemark_crdts::DotSet =
            codec::decode("set element", &row, self.limits.record_bytes_max).map_err(
                |source| StoreError::Codec {
                    table: "elems",
                    source,
                },
            )?;
        Ok(dots.iter().any(|d| d.replica == replica))
    }

    /// [`Reader::set_holds_own`] for each `(key, element)` of `items`, in order, in one read
    /// transaction (the table opened once).
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub fn sets_hold_own(
        &self,
        items: &[(&Key, &str)],
        replica: tidemark_crdts::ReplicaId,
    ) -> Result<Vec<bool>, StoreError> {
        let rtxn = self.rtxn()?;
        let elems = rtxn.open_table(ELEMS).map_err(StoreError::redb)?;
        let mut out = Vec::with_capacity(items.len());
        for (key, element) in items {
            if !per_element(key.kind) {
                out.push(false);
                continue;
            }
            let Some(row) = elems.get_bytes(elem_key(key, element).as_slice())? else {
                out.push(false);
                continue;
            };
            let dots: tidemark_crdts::DotSet =
                codec::decode("set element", &row, self.limits.record_bytes_max)
                    .map_err(|source| StoreError::Codec {
                        table: "elems",
                        source,
                    })?;
            out.push(dots.iter().any(|d| d.replica == replica));
        }
        Ok(out)
    }

    /// The committed value of `key` (`None` when the key holds nothing).
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub fn get(&self, key: &Key) -> Result<Option<Value>, StoreError> {
        Ok(self.entry(key)?.map(|e| e.value()))
    }

    /// Up to `limit` keys of `kind` whose names start with `prefix` and sort after `after`,
    /// ascending, with their values.
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub fn list(
        &self,
        kind: KeyKind,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Key, Value)>, StoreError> {
        let rtxn = self.rtxn()?;
        let (rows, elems) = open_read_tables(&rtxn)?;
        let max = self.limits.record_bytes_max;
        scan_prefix(&rows, kind, prefix, after, limit, |key, v| {
            let value = row_entry(&elems, &key, v, max)?.value();
            Ok((key, value))
        })
    }

    /// The keys [`Reader::list`] gives for the same arguments, without their values: no
    /// element row of a set is read, no row decoded (for scans that look at names only).
    ///
    /// # Errors
    /// Storage failures and unreadable row keys.
    pub fn list_keys(
        &self,
        kind: KeyKind,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let rtxn = self.rtxn()?;
        let rows = rtxn.open_table(ROWS).map_err(StoreError::redb)?;
        scan_prefix(&rows, kind, prefix, after, limit, |key, _| Ok(key))
    }

    /// The committed causal context.
    ///
    /// # Errors
    /// Storage failures and corrupt records.
    pub fn context(&self) -> Result<CausalContext, StoreError> {
        let rtxn = self.rtxn()?;
        let meta = rtxn.open_table(META).map_err(StoreError::redb)?;
        match meta.get(META_CONTEXT).map_err(StoreError::redb)? {
            Some(g) => codec::decode("meta record", g.value(), self.limits.record_bytes_max)
                .map_err(|source| StoreError::Codec {
                    table: "meta",
                    source,
                }),
            None => Ok(CausalContext::new()),
        }
    }

    /// The committed dedup marks of `(stream, source)`: the seqs already ingested.
    ///
    /// # Errors
    /// Storage failures and corrupt records.
    pub fn dedup_marks_of(
        &self,
        stream: &str,
        source: &str,
    ) -> Result<tidemark_crdts::IntervalSet, StoreError> {
        let rtxn = self.rtxn()?;
        let t = rtxn
            .open_table(super::tables::DEDUP)
            .map_err(StoreError::redb)?;
        let k = super::tables::dedup_key(stream, source);
        match t.get(k.as_slice()).map_err(StoreError::redb)? {
            Some(g) => codec::decode("dedup marks", g.value(), self.limits.record_bytes_max)
                .map_err(|source| StoreError::Codec {
                    table: "dedup",
                    source,
                }),
            None => Ok(tidemark_crdts::IntervalSet::new()),
        }
    }

    /// Up to `limit` records of `stream`'s late lane with ids above `after` (from the start
    /// with `None`), and the lane's totals.
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub fn late_events(
        &self,
        stream: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<super::LatePage, StoreError> {
        super::late::page(&self.db, stream, after, limit, self.limits.record_bytes_max)
    }

    /// How far the late lane recorded `replica`'s contribution to the key named `name`: the
    /// greatest seq of its dots recorded (`None`: nothing recorded).
    ///
    /// # Errors
    /// Storage failures.
    pub fn late_mark(&self, name: &str, replica: ReplicaId) -> Result<Option<u64>, StoreError> {
        super::late::mark(&self.db, name, replica)
    }

    /// Every committed entry, ascending by key (tests, digests; O(store)).
    ///
    /// # Errors
    /// Storage failures and corrupt rows.
    pub fn entries(&self) -> Result<Vec<(Key, Entry)>, StoreError> {
        let rtxn = self.rtxn()?;
        let (rows, elems) = open_read_tables(&rtxn)?;
        let mut out = Vec::new();
        for item in rows.range_bytes(Bound::Unbounded, Bound::Unbounded)? {
            let (k, v) = item?;
            let key =
                parse_key(&k).ok_or_else(|| StoreError::Corrupt("unreadable row key".into()))?;
            let entry = row_entry(&elems, &key, &v, self.limits.record_bytes_max)?;
            out.push((key, entry));
        }
        Ok(out)
    }

    /// Checks the committed tables against `expected_ctx` (see [`super::RedbStore::verify`]):
    /// every live dot is in the context, every dot of an indexed kind (all but counters:
    /// `rows::indexed`) is indexed to its key, and the index holds nothing else.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the first violation.
    pub fn verify(&self, expected_ctx: &CausalContext) -> Result<(), StoreError> {
        let ctx = self.context()?;
        if &ctx != expected_ctx {
            return Err(StoreError::Corrupt(
                "committed context differs from the in-memory one".into(),
            ));
        }
        let rtxn = self.rtxn()?;
        let dots = rtxn.open_table(DOTS).map_err(StoreError::redb)?;
        let mut live = 0u64;
        let (mut sets, mut set_elems) = (0u64, 0u64);
        for (key, entry) in self.entries()? {
            let mut problem = None;
            let counts = super::rows::indexed(key.kind);
            entry.for_each_dot(&mut |d| {
                live += u64::from(counts);
                if problem.is_none() && !ctx.contains(&d) {
                    problem = Some(format!("{key} holds {d:?} outside the context"));
                }
            });
            if let Some(p) = problem {
                return Err(StoreError::Corrupt(p));
            }
            if !super::rows::indexed(key.kind) {
                continue;
            }
            if per_element(key.kind) {
                if entry.is_bottom() {
                    return Err(StoreError::Corrupt(format!(
                        "{key}: set header without elements"
                    )));
                }
                let mut missing = None;
                let elems = rtxn.open_table(ELEMS).map_err(StoreError::redb)?;
                for_each_elem(&elems, &key, self.limits.record_bytes_max, |e, ds| {
                    let want = elem_key(&key, e);
                    for d in ds.iter() {
                        match dots.get(dot_bytes(*d).as_slice()) {
                            Ok(Some(g)) if g.value() == want.as_slice() => {}
                            _ if missing.is_none() => {
                                missing = Some(format!("{key}: {d:?} is not indexed to {e}"));
                            }
                            _ => {}
                        }
                    }
                    Ok(())
                })?;
                if let Some(m) = missing {
                    return Err(StoreError::Corrupt(m));
                }
                sets += 1;
                set_elems += match &entry {
                    Entry::ORSet(m) => m.len() as u64,
                    _ => 0,
                };
                continue;
            }
            let mut missing = None;
            entry.for_each_dot(&mut |d| {
                if missing.is_some() {
                    return;
                }
                match dots.get(dot_bytes(d).as_slice()) {
                    Ok(Some(g)) if g.value() == key_bytes(&key).as_slice() => {}
                    _ => missing = Some(format!("{key}: {d:?} is not indexed to it")),
                }
            });
            if let Some(m) = missing {
                return Err(StoreError::Corrupt(m));
            }
        }
        // Every element row belongs to a set with a header row (no orphan elements).
        let elems = rtxn.open_table(ELEMS).map_err(StoreError::redb)?;
        let stored = elems.len().map_err(StoreError::redb)?;
        if stored != set_elems {
            return Err(StoreError::Corrupt(format!(
                "elems holds {stored} rows, the {sets} sets hold {set_elems} elements"
            )));
        }
        let indexed = dots.len().map_err(StoreError::redb)?;
        if indexed != live {
            return Err(StoreError::Corrupt(format!(
                "dot index holds {indexed} dots, rows hold {live}"
            )));
        }
        Ok(())
    }
}

/// The rows of `kind` whose names start with `prefix`, after `after` (when it is not before the
/// prefix), at most `limit`, in key order: each key and its stored bytes given to `f`.
fn scan_prefix<T>(
    rows: &impl KvRead,
    kind: KeyKind,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
    mut f: impl FnMut(Key, &[u8]) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let excl = after.is_some_and(|a| a >= prefix);
    let start = match after {
        Some(a) if excl => key_bytes(&Key::new(kind, a)),
        _ => key_bytes(&Key::new(kind, prefix)),
    };
    let lo: Bound<&[u8]> = if excl {
        Bound::Excluded(start.as_slice())
    } else {
        Bound::Included(start.as_slice())
    };
    let kp = kind_prefix(kind);
    let mut out = Vec::new();
    for item in rows.range_bytes(lo, Bound::Unbounded)? {
        if out.len() >= limit {
            break;
        }
        let (k, v) = item?;
        let kb: &[u8] = &k;
        if kb.first() != kp.first() || !kb[1..].starts_with(prefix.as_bytes()) {
            break;
        }
        let key = parse_key(kb).ok_or_else(|| StoreError::Corrupt("unreadable row key".into()))?;
        out.push(f(key, &v)?);
    }
    Ok(out)
}

#[cfg(test)]
mod log_bytes_tests {
    use super::LogBytes;
    use crate::store::{LocalWrite, OpenOptions, RedbStore};
    use redb::ReadableDatabase;
    use tidemark_crdts::{Key, KeyKind, Mutation};

    fn write(store: &mut RedbStore, value: &str) {
        let w = LocalWrite {
            ops: vec![(
                Key::new(KeyKind::Lww, "k"),
                Mutation::Set(format!("\"{value}\"")),
            )],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        store.commit_local(&[w], 1_000).expect("commit");
    }

    /// The sizes of the log records as redb holds them, read directly.
    fn record_lens(store: &RedbStore) -> Vec<u64> {
        let rtxn = store.db.begin_read().expect("read");
        let log = rtxn.open_table(super::LOG).expect("log");
        redb::ReadableTable::iter(&log)
            .expect("iter")
            .map(|r| r.expect("row").1.value().len() as u64)
            .collect()
    }

    #[test]
    fn sums_the_encoded_entries_after_a_cursor_and_marks_a_capped_sum() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = RedbStore::open(dir.path(), OpenOptions::default()).expect("open");
        write(&mut store, "a");
        write(&mut store, &"b".repeat(1000));
        write(&mut store, &"c".repeat(50));
        let lens = record_lens(&store);
        assert_eq!(lens.len(), 3);
        assert!(lens[1] > 1000, "{lens:?}");
        let (start, end) = crate::proto::StateStore::log_bounds(&store);
        assert_eq!(end - start, 3);
        let r = store.reader();
        let all: u64 = lens.iter().sum();
        assert_eq!(
            r.log_bytes(start, end, 100).expect("sum"),
            LogBytes {
                bytes: all,
                exact: true
            }
        );
        // After a cursor past the first entry.
        assert_eq!(
            r.log_bytes(start + 1, end, 100).expect("sum"),
            LogBytes {
                bytes: lens[1] + lens[2],
                exact: true
            }
        );
        // Caught up: nothing.
        assert_eq!(
            r.log_bytes(end, end, 100).expect("sum"),
            LogBytes {
                bytes: 0,
                exact: true
            }
        );
        // Capped at two entries: a lower bound, marked so.
        assert_eq!(
            r.log_bytes(start, end, 2).expect("sum"),
            LogBytes {
                bytes: lens[0] + lens[1],
                exact: false
            }
        );
        // Exactly at the cap is exact.
        assert_eq!(
            r.log_bytes(start + 1, end, 2).expect("sum"),
            LogBytes {
                bytes: lens[1] + lens[2],
                exact: true
            }
        );
    }
}
