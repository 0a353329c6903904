//! Snapshots and restore (docs/design/snapshots.md; docs/design/principles.md,
//! "Never reuse a dot" (c)).
//!
//! A **snapshot** is a redb file holding a consistent point-in-time copy of a node's compacted
//! state: every table of the store except the delta log (`log`) and the receiver-owned cursors
//! (`cursors`), all read from ONE redb read transaction (so writes continue while it is taken),
//! plus a `snapshot` table whose `header` record says what the file is ([`SnapshotInfo`]: format,
//! source replica and epoch, the source's log end, the context, the row count of every table).
//!
//! Tables are copied generically: every table the read transaction lists is copied unless it is
//! one of the excluded ones, so a table added to the layout later is copied too. A table whose
//! key/value types are not among the byte-string shapes the store uses makes the snapshot fail
//! loudly instead of being skipped.
//!
//! Writing is crash-safe: the copy goes to a temporary file in the target directory, is committed
//! durably (fsync), reopened and [verified](verify_snapshot) (redb integrity check, header, row
//! counts, the store's own invariant check), and only then published under its final name (a
//! hard link, so an existing file is never replaced; a rename where links are unsupported), and
//! the directory is fsynced. A crash at any point leaves either no file under the final name or
//! a complete, verified snapshot.
//!
//! **Restore** ([`restore_snapshot`]) creates a data directory from a snapshot under a NEW
//! replica id: the snapshot's context includes the dots of the replica it was taken from, which
//! the new replica simply holds as remote dots; its own counter starts fresh under its new id, so
//! a restored backup can never reissue a dot of the original (the kv679 bug class). The restored
//! store has an empty log whose "truncated" context is the snapshot's context (a peer lacking
//! part of it is served by state transfer), and a *seed cursor* `(source log id, source log
//! end)`: the snapshot holds exactly the source's log below that end, so when the restored node
//! meets its source it asks for deltas from there instead of a full transfer. A snapshot of a
//! cluster member (a joining node, or one that met a peer) carries a `snapshot/joining` record,
//! which the restore turns into `meta/restored_joining` ([`RedbStore::restored_joining`]): the
//! copy joins its source's cluster. The restore also keeps the snapshot's context
//! (`meta/restored_context`, [`RedbStore::restored_context`]).
//!
//! Re-identification of a live store ([`RedbStore::reidentify`]) is the same idea at run time:
//! a store that learns it is a copy restored under its old id (a peer holds dots of this id above
//! our counter) switches to a fresh id and epoch durably before it assigns another dot.

use super::error::StoreError;
use super::read::Reader;
use super::tables::{
    CURSORS, LOG, META, META_CONTEXT, META_EPOCH, META_HLC, META_LOG_BOUNDS, META_REPLICA,
    META_TRUNCATED,
};
use super::{DB_FILE, RedbStore, meta_put, random_replica_id};
use crate::codec;
use crate::limits::Limits;
use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition, TableHandle, WriteTransaction,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tidemark_crdts::{CausalContext, Hlc, ReplicaId};

/// The table holding the snapshot header (only in snapshot files, never in a data directory).
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");
const HEADER: &str = "header";
/// Snapshot record (in the `snapshot` table, beside the header): `true` when a copy of the
/// source must join its cluster — the source ran as a joining node
/// ([`crate::NodeConfig::joining`]) or had met a peer when the snapshot was taken. Absent
/// (older snapshots, offline snapshots of a store that was not such a copy): `false`.
const JOINING: &str = "joining";
/// Meta record of a restored store: `true` when the snapshot it was restored from says its
/// copies join (see [`JOINING`]; or of a store restored that way: the record is copied with the
/// meta table), so the node opens as a joining node whatever its configuration says.
pub(crate) const META_RESTORED_JOINING: &str = "restored_joining";
/// Meta record of a restored store: the snapshot's causal context (the state it opened with
/// first), so a restart can tell whether the copy has heard from its cluster since
/// ([`RedbStore::restored_context`]). Absent in stores restored by earlier versions.
pub(crate) const META_RESTORED_CONTEXT: &str = "restored_context";
/// Meta record of a restored store: `(source log id, source log end)`.
pub(crate) const META_SEED_CURSOR: &str = "seed_cursor";
/// The snapshot format this build writes and reads.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// The file a restore writes into the data directory first and removes once the restored
/// database is complete and durable under its final name: found later, it says a restore was
/// cut short (the process killed, the machine down) and by whom.
pub const RESTORE_MARKER: &str = "tidemark.restore-unfinished";

/// What a snapshot file holds (its `snapshot/header` record).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotInfo {
    /// Format version ([`SNAPSHOT_FORMAT`]).
    pub format: u32,
    /// The replica the snapshot was taken from.
    pub source_replica: ReplicaId,
    /// The source's epoch when the snapshot was taken.
    pub source_epoch: u64,
    /// The source's delta-log end at the snapshot's read transaction: the state holds exactly
    /// the source's log entries below it.
    pub source_log_end: u64,
    /// The causal context of the copied state.
    pub context: CausalContext,
    /// The source's HLC high-water mark.
    pub hlc: (u64, u32),
    /// Wall-clock milliseconds when the snapshot was taken (informational).
    pub created_wall_ms: u64,
    /// Every copied table with its number of rows, by name.
    pub tables: Vec<(String, u64)>,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |error| StoreError::Io {
        path: path.display().to_string(),
        error,
    }
}

fn meta_read<T: serde::de::DeserializeOwned + serde::Serialize>(
    rtxn: &ReadTransaction,
    name: &str,
    max: usize,
) -> Result<Option<T>, StoreError> {
    let table = match rtxn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(StoreError::redb(e)),
    };
    let Some(g) = table.get(name).map_err(StoreError::redb)? else {
        return Ok(None);
    };
    codec::decode("meta record", g.value(), max)
        .map(Some)
        .map_err(|source| StoreError::Codec {
            table: "meta",
            source,
        })
}

/// Copies table `name` if its types are `(K, V)`; `Ok(None)` when they are not.
fn copy_typed<K: redb::Key + 'static, V: redb::Value + 'static>(
    src: &ReadTransaction,
    dst: &WriteTransaction,
    name: &str,
) -> Result<Option<u64>, StoreError> {
    let def: TableDefinition<K, V> = TableDefinition::new(name);
    let table = match src.open_table(def) {
        Ok(t) => t,
        Err(
            redb::TableError::TableTypeMismatch { .. }
            | redb::TableError::TypeDefinitionChanged { .. },
        ) => return Ok(None),
        Err(e) => return Err(StoreError::redb(e)),
    };
    let mut out = dst.open_table(def).map_err(StoreError::redb)?;
    let mut n = 0u64;
    for item in table.iter().map_err(StoreError::redb)? {
        let (k, v) = item.map_err(StoreError::redb)?;
        out.insert(k.value(), v.value()).map_err(StoreError::redb)?;
        n += 1;
    }
    Ok(Some(n))
}

/// Copies every table of `src` except `skip` into `dst`; returns `(name, rows)` per table.
fn copy_tables(
    src: &ReadTransaction,
    dst: &WriteTransaction,
    skip: &[&str],
) -> Result<Vec<(String, u64)>, StoreError> {
    if src
        .list_multimap_tables()
        .map_err(StoreError::redb)?
        .next()
        .is_some()
    {
        return Err(StoreError::Snapshot(
            "the store has a multimap table, which this snapshot format cannot copy".into(),
        ));
    }
    let mut copied = Vec::new();
    for handle in src.list_tables().map_err(StoreError::redb)? {
        let name = handle.name().to_owned();
        if skip.contains(&name.as_str()) {
            continue;
        }
        let rows = match copy_typed::<&[u8], &[u8]>(src, dst, &name)? {
            Some(n) => n,
            None => match copy_typed::<&str, &[u8]>(src, dst, &name)? {
                Some(n) => n,
                None => copy_typed::<u64, &[u8]>(src, dst, &name)?.ok_or_else(|| {
                    StoreError::Snapshot(format!(
                        "table {name} has key/value types the snapshot cannot copy"
                    ))
                })?,
            },
        };
        copied.push((name, rows));
    }
    copied.sort();
    Ok(copied)
}

/// Number of rows of table `name`, whatever its (supported) types.
fn table_len(rtxn: &ReadTransaction, name: &str) -> Result<u64, StoreError> {
    fn len<K: redb::Key + 'static, V: redb::Value + 'static>(
        rtxn: &ReadTransaction,
        name: &str,
    ) -> Result<Option<u64>, StoreError> {
        match rtxn.open_table(TableDefinition::<K, V>::new(name)) {
            Ok(t) => Ok(Some(t.len().map_err(StoreError::redb)?)),
            Err(
                redb::TableError::TableTypeMismatch { .. }
                | redb::TableError::TypeDefinitionChanged { .. },
            ) => Ok(None),
            Err(e) => Err(StoreError::redb(e)),
        }
    }
    if let Some(n) = len::<&[u8], &[u8]>(rtxn, name)? {
        return Ok(n);
    }
    if let Some(n) = len::<&str, &[u8]>(rtxn, name)? {
        return Ok(n);
    }
    len::<u64, &[u8]>(rtxn, name)?
        .ok_or_else(|| StoreError::Snapshot(format!("table {name} has unsupported types")))
}

fn fsync_dir(dir: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// [`StoreError::RestoreUnfinished`] when `dir` holds what a restore left when it stopped
/// before finishing: its marker, or its database written under the temporary name only.
pub(crate) fn unfinished_restore(dir: &Path) -> Option<StoreError> {
    let marker = dir.join(RESTORE_MARKER);
    let note = match std::fs::read_to_string(&marker) {
        Ok(text) => {
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
                    .unwrap_or("?")
                    .to_owned()
            };
            format!(
                "of {}, started at {} by pid {}",
                field("snapshot"),
                field("started"),
                field("pid")
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let partial = dir.join(format!("{DB_FILE}.restoring"));
            if !partial.exists() || dir.join(DB_FILE).exists() {
                return None;
            }
            format!("a partial {DB_FILE}.restoring")
        }
        Err(e) => format!("its marker {} cannot be read: {e}", marker.display()),
    };
    Some(StoreError::RestoreUnfinished {
        dir: dir.display().to_string(),
        note,
    })
}

/// Now as RFC 3339 UTC, to the second.
fn now_rfc3339() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Writes the restore marker into `dir`, durably (the file and its directory entry).
fn write_restore_marker(dir: &Path, snapshot: &Path) -> Result<PathBuf, StoreError> {
    use std::io::Write;
    let marker = dir.join(RESTORE_MARKER);
    let pid = std::process::id();
    let text = format!(
        "snapshot: {}\nstarted: {}\npid: {pid}\n\
         A restore from that snapshot into this directory has not finished. If process {pid} is \
         gone, it failed: remove this directory and restore again.\n",
        snapshot.display(),
        now_rfc3339()
    );
    let mut file = std::fs::File::create(&marker).map_err(io_err(&marker))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_err(&marker))?;
    fsync_dir(dir)?;
    Ok(marker)
}

/// The directory a file path lives in (`.` for a bare file name).
fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Removes a temporary file when dropped unless disarmed (best effort: errors are ignored,
/// a left-over temporary never carries the final name).
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One point in time of the store, held open for a snapshot: the writer takes it at a
/// durable point and hands it out, and [`SnapshotRead::write_to`] writes it while writes go on.
pub struct SnapshotRead(ReadTransaction);

impl SnapshotRead {
    /// Writes this point in time to the snapshot file `out` (see [`write_snapshot`]);
    /// `joining`: a copy of the node must join its cluster (recorded for the restored copy).
    ///
    /// # Errors
    /// As [`write_snapshot`].
    pub(crate) fn write_to(
        &self,
        out: &Path,
        limits: &Limits,
        wall_ms: u64,
        joining: bool,
    ) -> Result<SnapshotInfo, StoreError> {
        write_snapshot(&self.0, out, limits, wall_ms, joining)
    }
}

impl std::fmt::Debug for SnapshotRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotRead")
    }
}

/// Writes the state seen by `rtxn` (a read transaction of a store) as a snapshot at `out`:
/// temporary file in the same directory, durable commit, verification, rename, directory
/// fsync. Returns what the snapshot holds. `joining` (a copy of the source must join its
/// cluster) is recorded beside the header, so a store restored from the file opens joining
/// ([`restore_snapshot`]).
///
/// # Errors
/// [`StoreError::Snapshot`] when `out` exists or the store holds a table it cannot copy;
/// storage and filesystem failures; a verification failure of the copy (nothing is left under
/// `out` then).
pub(crate) fn write_snapshot(
    rtxn: &ReadTransaction,
    out: &Path,
    limits: &Limits,
    wall_ms: u64,
    joining: bool,
) -> Result<SnapshotInfo, StoreError> {
    if out.exists() {
        return Err(StoreError::Snapshot(format!(
            "{} already exists; refusing to overwrite it",
            out.display()
        )));
    }
    let max = limits.record_bytes_max;
    let dir = parent_of(out);
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| StoreError::Snapshot(format!("{} is not a file path", out.display())))?;
    let tmp = dir.join(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let guard = TempFile(Some(tmp.clone()));
    let source_replica: ReplicaId = meta_read(rtxn, META_REPLICA, max)?
        .ok_or_else(|| StoreError::Corrupt("the store has no replica id".into()))?;
    let info = {
        super::create_private(&tmp).map_err(io_err(&tmp))?;
        let db = redb::Builder::new()
            .set_cache_size(limits.cache_bytes)
            .create(&tmp)
            .map_err(StoreError::redb)?;
        let wtxn = db.begin_write().map_err(StoreError::redb)?;
        let tables = copy_tables(
            rtxn,
            &wtxn,
            &[
                LOG.name(),
                CURSORS.name(),
                super::tables::TRANSFER_STAGE.name(),
            ],
        )?;
        let info = SnapshotInfo {
            format: SNAPSHOT_FORMAT,
            source_replica,
            source_epoch: meta_read(rtxn, META_EPOCH, max)?.unwrap_or(0),
            source_log_end: meta_read::<(u64, u64)>(rtxn, META_LOG_BOUNDS, max)?.map_or(0, |b| b.1),
            context: meta_read(rtxn, META_CONTEXT, max)?.unwrap_or_default(),
            hlc: meta_read(rtxn, META_HLC, max)?.unwrap_or((0, 0)),
            created_wall_ms: wall_ms,
            tables,
        };
        let bytes =
            codec::encode("snapshot header", &info).map_err(|source| StoreError::Codec {
                table: "snapshot",
                source,
            })?;
        {
            let mut t = wtxn.open_table(SNAPSHOT).map_err(StoreError::redb)?;
            t.insert(HEADER, bytes.as_slice())
                .map_err(StoreError::redb)?;
            if joining {
                let flag = codec::encode("snapshot record", &true).map_err(|source| {
                    StoreError::Codec {
                        table: "snapshot",
                        source,
                    }
                })?;
                t.insert(JOINING, flag.as_slice())
                    .map_err(StoreError::redb)?;
            }
        }
        wtxn.commit().map_err(StoreError::redb)?;
        info
    };
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_err(&tmp))?;
    let verified = verify_snapshot(&tmp, limits)?;
    if verified != info {
        return Err(StoreError::Snapshot(
            "the written snapshot reads back differently".into(),
        ));
    }
    publish_file(&tmp, out)?;
    drop(guard); // the temporary name is gone already; nothing left to remove
    Ok(info)
}

/// Gives the complete, synced file `tmp` its final name `out` without ever replacing a file:
/// a hard link (which fails if `out` exists), falling back to a rename on filesystems without
/// hard links; then removes the temporary name and syncs the directory. `tmp` and `out` must
/// be in the same directory.
///
/// # Errors
/// [`StoreError::Snapshot`] when `out` exists; filesystem failures.
pub fn publish_file(tmp: &Path, out: &Path) -> Result<(), StoreError> {
    match std::fs::hard_link(tmp, out) {
        Ok(()) => {
            let _ = std::fs::remove_file(tmp);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(StoreError::Snapshot(format!(
                "{} already exists; refusing to overwrite it",
                out.display()
            )));
        }
        Err(_) => {
            std::fs::rename(tmp, out).map_err(io_err(out))?;
        }
    }
    fsync_dir(&parent_of(out))
}

/// Checks an open snapshot database: redb integrity, header, row counts, no stray tables, and
/// the store's invariants (every live dot in the context and indexed to its key).
fn verify_db(
    mut db: Database,
    limits: &Limits,
) -> Result<(Arc<Database>, SnapshotInfo), StoreError> {
    if !db.check_integrity().map_err(StoreError::redb)? {
        return Err(StoreError::Snapshot(
            "the snapshot failed redb's integrity check".into(),
        ));
    }
    let db = Arc::new(db);
    let rtxn = db.begin_read().map_err(StoreError::redb)?;
    let info: SnapshotInfo = {
        let t = match rtxn.open_table(SNAPSHOT) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => {
                return Err(StoreError::Snapshot(
                    "not a tidemark snapshot (no snapshot header)".into(),
                ));
            }
            Err(e) => return Err(StoreError::redb(e)),
        };
        let g = t
            .get(HEADER)
            .map_err(StoreError::redb)?
            .ok_or_else(|| StoreError::Snapshot("the snapshot header is missing".into()))?;
        codec::decode("snapshot header", g.value(), limits.record_bytes_max).map_err(|source| {
            StoreError::Codec {
                table: "snapshot",
                source,
            }
        })?
    };
    if info.format != SNAPSHOT_FORMAT {
        return Err(StoreError::Snapshot(format!(
            "snapshot format {} is not supported (this build reads {SNAPSHOT_FORMAT})",
            info.format
        )));
    }
    let mut present: Vec<String> = rtxn
        .list_tables()
        .map_err(StoreError::redb)?
        .map(|h| h.name().to_owned())
        .filter(|n| n != SNAPSHOT.name())
        .collect();
    present.sort();
    let listed: Vec<String> = info.tables.iter().map(|(n, _)| n.clone()).collect();
    if present != listed {
        return Err(StoreError::Snapshot(format!(
            "the snapshot holds tables {present:?}, its header lists {listed:?}"
        )));
    }
    for (name, rows) in &info.tables {
        let n = table_len(&rtxn, name)?;
        if n != *rows {
            return Err(StoreError::Snapshot(format!(
                "table {name} holds {n} rows, the header says {rows}"
            )));
        }
    }
    let replica: Option<ReplicaId> = meta_read(&rtxn, META_REPLICA, limits.record_bytes_max)?;
    if replica != Some(info.source_replica) {
        return Err(StoreError::Snapshot(
            "the snapshot's replica id differs from its header".into(),
        ));
    }
    drop(rtxn);
    Reader::new(Arc::clone(&db), limits.clone()).verify(&info.context)?;
    Ok((db, info))
}

/// Writes a snapshot of the data directory `dir`, which no running node holds, to `out` (the
/// offline `tidemark snapshot --data`): opens the store, writes a consistent point in time as
/// [`RedbStore::snapshot`] does, and closes it. `StoreError::AlreadyOpen` if a node holds `dir`.
pub fn snapshot_data_dir(
    dir: &Path,
    out: &Path,
    limits: &Limits,
    wall_ms: u64,
) -> Result<SnapshotInfo, StoreError> {
    let store = RedbStore::open(
        dir,
        super::OpenOptions {
            limits: limits.clone(),
            ..super::OpenOptions::default()
        },
    )?;
    store.snapshot(out, wall_ms)
}

/// Verifies the snapshot file at `path` and returns its header: redb's integrity check, a
/// header of a supported format, exactly the tables and row counts the header lists, and the
/// store invariants of [`RedbStore::verify`] against the header's context.
///
/// # Errors
/// [`StoreError::Snapshot`] (not a snapshot, or a mismatch) or [`StoreError::Corrupt`] naming
/// the first violation; storage and filesystem failures.
pub fn verify_snapshot(path: &Path, limits: &Limits) -> Result<SnapshotInfo, StoreError> {
    if !path.exists() {
        return Err(StoreError::Snapshot(format!(
            "{}: no such file",
            path.display()
        )));
    }
    if !path.is_file() {
        return Err(StoreError::Snapshot(format!(
            "{} is not a snapshot file",
            path.display()
        )));
    }
    let db = Database::open(path).map_err(StoreError::redb)?;
    verify_db(db, limits).map(|(_, info)| info)
}

/// Whether the snapshot read by `rtxn` says its copies join (its [`JOINING`] record).
fn snapshot_joining(rtxn: &ReadTransaction, max: usize) -> Result<bool, StoreError> {
    let t = rtxn.open_table(SNAPSHOT).map_err(StoreError::redb)?;
    let Some(g) = t.get(JOINING).map_err(StoreError::redb)? else {
        return Ok(false);
    };
    codec::decode("snapshot record", g.value(), max).map_err(|source| StoreError::Codec {
        table: "snapshot",
        source,
    })
}

/// Creates the data directory `dir` from the snapshot at `snapshot` under the replica id
/// `new_replica` (`None`: a random one), and returns the snapshot's header.
///
/// Guarantees: the snapshot is verified first; `dir` must be absent or empty (it is never
/// overwritten); until the restore is complete `dir` holds [`RESTORE_MARKER`], so a restore cut
/// short is named as such by the next restore or open ([`StoreError::RestoreUnfinished`]); the restored store never reuses the source's replica id (the source's dots are
/// remote dots to it), has an epoch above the source's, an empty log, and a seed cursor
/// `(source, source_log_end)`; a snapshot of a cluster member (see [`write_snapshot`]) gives a
/// store that opens as a joining node ([`RedbStore::restored_joining`]); the database appears
/// under its final name only once complete and durable.
///
/// # Errors
/// [`StoreError::Snapshot`] for a non-empty `dir`, a `new_replica` equal to the source's, or an
/// invalid snapshot; [`StoreError::RestoreUnfinished`] for a `dir` an earlier restore left; storage and filesystem failures.
pub fn restore_snapshot(
    snapshot: &Path,
    dir: &Path,
    new_replica: Option<ReplicaId>,
    limits: &Limits,
) -> Result<SnapshotInfo, StoreError> {
    if !snapshot.exists() {
        return Err(StoreError::Snapshot(format!(
            "{}: no such file",
            snapshot.display()
        )));
    }
    if !snapshot.is_file() {
        return Err(StoreError::Snapshot(format!(
            "{} is not a snapshot file",
            snapshot.display()
        )));
    }
    let (src, info) = verify_db(Database::open(snapshot).map_err(StoreError::redb)?, limits)?;
    let replica = new_replica.unwrap_or_else(random_replica_id);
    if replica == info.source_replica {
        return Err(StoreError::Snapshot(
            "a restored store must not take the replica id of the snapshot's source".into(),
        ));
    }
    if let Some(e) = unfinished_restore(dir) {
        return Err(e);
    }
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(io_err(dir))?;
        if entries.next().is_some() {
            let held = if dir.join(DB_FILE).is_file() {
                "it holds a node's data (serve it without restoring)"
            } else {
                "it holds files that are not tidemark's"
            };
            return Err(StoreError::Snapshot(format!(
                "{} is not empty: {held}; restore only into a new or empty directory",
                dir.display()
            )));
        }
    }
    super::private_dir(dir).map_err(io_err(dir))?;
    // Until the database is complete under its final name the marker says a restore is under
    // way; a failure returned here removes both (the directory is left empty), a crash leaves
    // both for the next start to name.
    let mut marker_guard = TempFile(Some(write_restore_marker(dir, snapshot)?));
    let tmp = dir.join(format!("{DB_FILE}.restoring"));
    let mut guard = TempFile(Some(tmp.clone()));
    {
        super::create_private(&tmp).map_err(io_err(&tmp))?;
        let db = redb::Builder::new()
            .set_cache_size(limits.cache_bytes)
            .create(&tmp)
            .map_err(StoreError::redb)?;
        let wtxn = db.begin_write().map_err(StoreError::redb)?;
        let rtxn = src.begin_read().map_err(StoreError::redb)?;
        copy_tables(&rtxn, &wtxn, &[SNAPSHOT.name()])?;
        wtxn.open_table(LOG).map_err(StoreError::redb)?;
        wtxn.open_table(CURSORS).map_err(StoreError::redb)?;
        meta_put(&wtxn, META_REPLICA, &replica)?;
        // Open adds one: the restored store's first epoch is above the source's.
        meta_put(&wtxn, META_EPOCH, &info.source_epoch)?;
        meta_put(&wtxn, META_LOG_BOUNDS, &(0u64, 0u64))?;
        {
            // The restored store writes a log of its own: a new log id at its first open.
            let mut meta = wtxn
                .open_table(super::tables::META)
                .map_err(StoreError::redb)?;
            for name in [super::tables::META_WAL_ID, super::tables::META_WAL_COVERED] {
                meta.remove(name).map_err(StoreError::redb)?;
            }
        }
        // Nothing of the state is in the (empty) log: a peer lacking any of it gets a transfer.
        meta_put(&wtxn, META_TRUNCATED, &info.context)?;
        meta_put(
            &wtxn,
            META_SEED_CURSOR,
            &(info.source_replica, info.source_log_end),
        )?;
        meta_put(&wtxn, META_RESTORED_CONTEXT, &info.context)?;
        // A copy of a cluster member joins (a copy of such a copy holds the record already:
        // the meta table is copied).
        if snapshot_joining(&rtxn, limits.record_bytes_max)? {
            meta_put(&wtxn, META_RESTORED_JOINING, &true)?;
        }
        wtxn.commit().map_err(StoreError::redb)?;
    }
    drop(src);
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_err(&tmp))?;
    let final_path = dir.join(DB_FILE);
    std::fs::rename(&tmp, &final_path).map_err(io_err(&final_path))?;
    guard.0 = None;
    fsync_dir(dir)?;
    if let Some(marker) = marker_guard.0.take() {
        std::fs::remove_file(&marker).map_err(io_err(&marker))?;
    }
    fsync_dir(dir)?;
    tracing::info!(
        source = %info.source_replica,
        %replica,
        dir = %dir.display(),
        "restored a snapshot under a new replica id"
    );
    Ok(info)
}

impl RedbStore {
    /// A read transaction of the committed state (the point a snapshot is taken at).
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn begin_snapshot_read(&self) -> Result<SnapshotRead, StoreError> {
        self.db
            .begin_read()
            .map(SnapshotRead)
            .map_err(StoreError::redb)
    }

    /// Writes a snapshot of the committed state to `out` (see [`write_snapshot`]); the store
    /// keeps working. In relaxed durability call [`RedbStore::sync`] first, or the snapshot may
    /// hold commits a crash would lose (the node's [`crate::Node::snapshot`] does).
    ///
    /// # Errors
    /// As [`write_snapshot`].
    pub fn snapshot(&self, out: &Path, wall_ms: u64) -> Result<SnapshotInfo, StoreError> {
        let rtxn = self.begin_snapshot_read()?;
        rtxn.write_to(out, &self.options.limits, wall_ms, self.restored_joining)
    }

    /// True for a store restored from a snapshot of a cluster member (a joining node or one
    /// that had met a peer; or of such a copy): the node on it opens as a joining node whatever
    /// its configuration says, since the source's cluster may have sealed windows without it.
    /// `false` for every other store and for stores restored from snapshots written before
    /// this record existed.
    pub fn restored_joining(&self) -> bool {
        self.restored_joining
    }

    /// The causal context of the snapshot this store was restored from (its state at its
    /// first open), for stores restored by this version; `None` for every other store.
    pub fn restored_context(&self) -> Option<&CausalContext> {
        self.restored_context.as_ref()
    }

    /// The seed cursor of a store restored from a snapshot: `(source log id, source log end)`.
    pub fn seed_cursor(&self) -> Option<(ReplicaId, u64)> {
        self.seed
    }

    /// Switches this store to a fresh replica id and the next epoch, durably, before it returns:
    /// called when the store turns out to be a copy restored under its old id (a peer holds
    /// dots of this id above our counter), so no dot of the old id is ever issued again. The old
    /// id's dots stay in the context as remote dots; the log keeps its entries under the new log
    /// id (peers holding cursors into the old log get a state transfer). Our own cursors into
    /// peers' logs (and a seed cursor) are dropped in the same transaction, so every peer serves
    /// us a state transfer: its log tags what the old incarnation sent it as coming from us,
    /// and back-propagation avoidance would never send it back to us — yet this copy lacks
    /// exactly that. Returns the new id.
    ///
    /// # Errors
    /// Storage failures (the store halts: it must not continue under the old id).
    pub fn reidentify(&mut self) -> Result<ReplicaId, StoreError> {
        self.guarded(|s| {
            let replica = random_replica_id();
            let epoch = s.epoch.saturating_add(1);
            s.row_cache = None;
            s.big_rows.clear();
            s.transfer_snapshots.clear();
            // The replication core starts over: so does an incoming transfer.
            s.staged = None;
            s.stats.transfer_staged_bytes = 0;
            let mut txn = s.db.begin_write().map_err(StoreError::redb)?;
            txn.set_durability(redb::Durability::Immediate)
                .map_err(StoreError::redb)?;
            meta_put(&txn, META_REPLICA, &replica)?;
            meta_put(&txn, META_EPOCH, &epoch)?;
            meta_put(&txn, META_HLC, &s.hlc.mark())?;
            {
                let mut meta = txn.open_table(META).map_err(StoreError::redb)?;
                meta.remove(META_SEED_CURSOR).map_err(StoreError::redb)?;
            }
            txn.delete_table(CURSORS).map_err(StoreError::redb)?;
            txn.delete_table(super::tables::TRANSFER_STAGE)
                .map_err(StoreError::redb)?;
            txn.open_table(CURSORS).map_err(StoreError::redb)?;
            s.commit(txn)?;
            s.cursors.clear();
            s.seed = None;
            s.unsynced
                .store(false, std::sync::atomic::Ordering::Release);
            let old = s.replica;
            s.replica = replica;
            s.epoch = epoch;
            s.hlc = Hlc::restore(replica, s.hlc.mark(), s.options.limits.max_clock_drift_ms);
            tracing::warn!(%old, new = %replica, epoch, "re-identified under a new replica id");
            Ok(replica)
        })
    }
}
