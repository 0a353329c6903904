//! The durable store: a node's replicated state in one redb database (docs/design/principles.md:
//! "Acknowledged means durable", "Storage is the source of truth", "Durability").
//!
//! State lives in per-key rows with a dot → key index, so memory stays bounded by the page
//! cache whatever the store's size, and a delta's join touches O(|δ|) rows. Every commit group,
//! local or remote, is one redb write transaction holding its rows, dot index updates, delta-log
//! entry, causal context, dedup marks, HLC mark and cursors; in-memory mirrors (context, HLC, log
//! bounds) are updated only after that transaction committed.
//!
//! This module is the only one that knows redb tables; readers use [`Reader`] (MVCC read
//! transactions that never block the writer).

mod big_row;
mod counters;
#[cfg(test)]
mod engine_model_tests;
mod error;
mod fallback;
mod holder;
mod kv;
#[cfg(test)]
mod kv_review_tests;
mod late;
mod local;
mod overlay;
#[cfg(test)]
mod overlay_tests;
mod purge;
mod read;
mod replicate;
mod rows;
#[cfg(test)]
mod set_rows_review_tests;
#[cfg(test)]
mod set_rows_tests;
pub mod snapshot;
mod split;
mod stream_snapshot;
mod transfer_stage;
pub(crate) mod tables;
mod wal;
#[cfg(test)]
mod wal_tests;
#[cfg(test)]
mod wal_review_tests;
#[cfg(test)]
pub(crate) mod test_rng;

pub use counters::Overflow;
pub(crate) use counters::{counter_state, first_overflow};
pub use error::StoreError;
pub use fallback::BatchFallback;
pub use late::{LateMark, LateNote, LatePage, Totals as LateTotals};
pub use local::{EventId, LocalCommit, LocalWrite, Refusal, RefusalCause};
pub use purge::RemoteFilter;
pub use read::{LOG_BYTES_ENTRIES_MAX, LogBytes, Reader, ReleaseWatch};
pub use replicate::DeltasSince;
pub use snapshot::{
    RESTORE_MARKER, SNAPSHOT_FORMAT, SnapshotInfo, SnapshotRead, publish_file, restore_snapshot,
    snapshot_data_dir, verify_snapshot,
};
pub use split::write_bytes_estimate;
pub use stream_snapshot::{
    check_snapshot_room, data_file_identity, remove_stream_leftovers, stream_snapshot_path,
};
pub use tables::LogRecord;
pub use wal::{WAL_FILE, WalScan};

use crate::codec;
use crate::limits::{Durability, Limits};
use crate::proto::PeerId;
use redb::{Database, ReadableDatabase, ReadableTable, StorageBackend, WriteTransaction};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tables::{
    CURSORS, DEDUP, DOTS, ELEMS, LOG, META, META_CONTEXT, META_EPOCH, META_FORMAT, META_HLC,
    META_LOG_BOUNDS, META_REPLICA, META_TRUNCATED, META_WAL_COVERED, META_WAL_ID, META_WATCH_END,
    ROWS, STORE_FORMAT,
};
use tidemark_crdts::{CausalContext, Hlc, ReplicaId};

/// The database file inside the data directory.
pub const DB_FILE: &str = "tidemark.redb";

/// Bytes of write-ahead log after which the next local commit group first checkpoints: a
/// durable redb commit of everything so far, after which the log starts over. Bounds the
/// replay at open and the memory redb holds for commits not yet durable in it.
pub const CHECKPOINT_BYTES: u64 = 16 << 20;

/// The identity of the file at `path` as `device:inode` (Unix), so two processes can tell they
/// mean the same database file whatever paths (links, mounts, relative names) they use; `None`
/// where the platform has no such identity or the file cannot be read.
pub fn file_identity(path: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path)
            .ok()
            .map(|m| format!("{}:{}", m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Counters for metrics (monotonic since open).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Write transactions committed (local groups, remote joins, chunks, compactions).
    pub commits: u64,
    /// Local operations applied.
    pub ops_applied: u64,
    /// Local events skipped as duplicates (dedup marks).
    pub duplicates: u64,
    /// Remote deltas and chunks that inflated the state.
    pub remote_inflations: u64,
    /// Remote deltas and chunks that brought nothing new (redundancy removal dropped them).
    pub remote_redundant: u64,
    /// Remote deltas and chunks rejected by validation.
    pub rejected: u64,
    /// Remote LWW timestamps too far ahead for the local clock.
    pub hlc_rejected: u64,
    /// Bytes of log entries dropped by compaction.
    pub compaction_reclaimed_bytes: u64,
    /// Checkpoints of the write-ahead log (durable commits of their own: by size, when idle,
    /// by age, at close).
    pub checkpoints: u64,
    /// Whole reads of a row too large for one transfer message (once per row per transfer
    /// unless the row is read from the current state and a write came in between).
    pub big_row_reads: u64,
    /// Chunks of incoming state transfers staged (kept on disk, unapplied, until the last).
    pub transfer_chunks_staged: u64,
    /// Encoded bytes of the incoming transfer's chunks staged now (on disk, not in memory).
    pub transfer_staged_bytes: u64,
    /// The most encoded bytes of transfer chunks an incoming transfer's join held in memory
    /// at once (one chunk, or the parts of one large row other than a set being put back
    /// together: a set's parts are joined one by one), over every transfer applied: what
    /// bounds the receiver's memory, whatever the state's size.
    pub transfer_held_bytes_peak: u64,
    /// The most elements of a large set an incoming transfer's join held in memory at once
    /// (a part's, and the local elements it read), over every transfer applied: a set sent
    /// in parts is joined part by part, so this stays about a part's worth, whatever the
    /// set's size.
    pub transfer_held_elems_peak: u64,
}

/// Options for opening a store.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Limits (sizes, cache).
    pub limits: Limits,
    /// Durability of commits.
    pub durability: Durability,
    /// Replica id to mint when the store is new (tests and simulations pass a deterministic
    /// one); `None` mints a random v4 UUID.
    pub new_replica_id: Option<ReplicaId>,
}

/// A node's durable state. Single writer: only the owner of `&mut RedbStore` writes.
pub struct RedbStore {
    db: Arc<Database>,
    path: Option<PathBuf>,
    replica: ReplicaId,
    epoch: u64,
    ctx: CausalContext,
    hlc: Hlc,
    log_start: u64,
    log_end: u64,
    truncated: CausalContext,
    cursors: BTreeMap<PeerId, (ReplicaId, u64)>,
    options: OpenOptions,
    halted: Option<String>,
    stats: StoreStats,
    /// True when a relaxed (not durable) write transaction was begun since the last durable
    /// commit: a crash now could lose commits ([`RedbStore::unsynced`]).
    unsynced: AtomicBool,
    /// Stream-view retention: drops entries of expired windows from remote input (`purge.rs`).
    remote_filter: Option<purge::RemoteFilter>,
    /// Restored from a snapshot: `(source log id, source log end)` (see [`snapshot`]).
    seed: Option<(ReplicaId, u64)>,
    /// Restored from a snapshot of a cluster member ([`RedbStore::restored_joining`]).
    restored_joining: bool,
    /// The snapshot's context, for a restored store ([`RedbStore::restored_context`]).
    restored_context: Option<CausalContext>,
    /// The committed dedup marks of the sources local commits touched, so a commit group does
    /// not re-read and decode each source's row (bounded by
    /// `local::DEDUP_CACHE_SOURCES_MAX`; a remote join that changes a source's row drops its
    /// copy). Always equal to the table's row for every source it holds.
    dedup_cache: std::collections::HashMap<(String, String), tidemark_crdts::IntervalSet>,
    /// Whether local commits compute the changed keys' values ([`RedbStore::set_change_values`]).
    change_values: bool,
    /// Decoded rows as the last local commit left them, kept for the next one (the writer is
    /// the only mutator). Valid only while every write transaction since was a successful local
    /// commit: [`RedbStore::begin`] drops it, and a local commit takes it out first and puts it
    /// back only once it has committed.
    row_cache: Option<local::RowCache>,
    /// The large rows state transfers are sending in parts, each read once for all its parts,
    /// by the snapshot it was read from (`None`: the current state, which follows the same
    /// validity rule as `row_cache`: dropped by [`RedbStore::begin`]; a row read from a pinned
    /// snapshot cannot change and stays until its last part or its snapshot's release).
    big_rows: std::collections::BTreeMap<Option<crate::proto::PeerId>, big_row::BigRow>,
    /// The read snapshots pinned for state transfers, one per peer at most
    /// ([`crate::proto::StateStore::pin_transfer_snapshot`]); dropped by `reidentify` (the
    /// replication core starts over under the new id).
    transfer_snapshots: std::collections::BTreeMap<crate::proto::PeerId, redb::ReadTransaction>,
    /// The incoming state transfer whose chunks are staged in `transfer_stage`, if any.
    staged: Option<transfer_stage::Staged>,
    /// The write-ahead log local commit groups are made durable through (stores opened on a
    /// data directory); `None` on a custom backend, where every commit is a redb commit of the
    /// store's durability.
    wal: Option<wal::Wal>,
    /// What the open found in the log.
    wal_scan: WalScan,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .field("replica", &self.replica)
            .field("epoch", &self.epoch)
            .field("log", &(self.log_start, self.log_end))
            .finish_non_exhaustive()
    }
}

fn meta_get<T: serde::de::DeserializeOwned + serde::Serialize>(
    txn: &WriteTransaction,
    name: &str,
    max: usize,
) -> Result<Option<T>, StoreError> {
    let table = txn.open_table(META).map_err(StoreError::redb)?;
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

/// Writes an encoded `meta` record into an open `meta` table and records it in the redo log
/// (callers writing several records open the table once).
pub(crate) fn meta_put_encoded(
    table: &mut redb::Table<'_, &'static str, &'static [u8]>,
    name: &str,
    value: &impl serde::Serialize,
    redo: &mut wal::Redo,
) -> Result<(), StoreError> {
    let bytes = codec::encode("meta record", value).map_err(|source| StoreError::Codec {
        table: "meta",
        source,
    })?;
    table
        .insert(name, bytes.as_slice())
        .map_err(StoreError::redb)?;
    redo.put(crate::codec::wal::RedoTable::Meta, name.as_bytes(), &bytes);
    Ok(())
}

/// Writes one `meta` record in `txn` (outside any local group's redo: for durable commits).
pub(crate) fn meta_put<T: serde::Serialize>(
    txn: &WriteTransaction,
    name: &str,
    value: &T,
) -> Result<(), StoreError> {
    let mut table = txn.open_table(META).map_err(StoreError::redb)?;
    meta_put_encoded(&mut table, name, value, &mut wal::Redo::default())
}

/// True when the database file exists but its header magic was never written (all zeros).
fn never_initialized(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 9];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic.iter().all(|b| *b == 0))
}

/// Creates `dir` and its missing parents with mode 0700. A directory that already exists is
/// never changed (it may be shared, like `/tmp` or a home directory); a warning says so when
/// other users may write into it.
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir)?.permissions().mode();
            if mode & 0o022 != 0 {
                tracing::warn!(
                    dir = %dir.display(),
                    mode = format!("{:o}", mode & 0o7777),
                    "the data directory is writable by other users: they can replace or remove                      the store's files; use a directory of its own"
                );
            }
        }
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Creates `path` if missing with mode 0600 (before redb opens it, so it is never readable by
/// others, not even for a moment).
pub(crate) fn create_private(path: &Path) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).write(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path).map(drop)
}

/// Makes a file the store wrote readable by its owner only (0600).
pub(crate) fn private_file(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn random_replica_id() -> ReplicaId {
    ReplicaId::from_bytes(*uuid::Uuid::new_v4().as_bytes())
}

impl RedbStore {
    /// Opens (or creates) the store in `dir`, creating the directory with mode 0700.
    ///
    /// # Errors
    /// [`StoreError::AlreadyOpen`] when another process holds the directory; storage and
    /// corruption errors (the node must not start then).
    pub fn open(dir: &Path, options: OpenOptions) -> Result<Self, StoreError> {
        let io = |error| StoreError::Io {
            path: dir.display().to_string(),
            error,
        };
        // A directory a restore left half-written is no store: opening it would start an
        // empty node beside the remains.
        if let Some(e) = snapshot::unfinished_restore(dir) {
            return Err(e);
        }
        private_dir(dir).map_err(io)?;
        let path = dir.join(DB_FILE);
        create_private(&path).map_err(io)?;
        let db = redb::Builder::new()
            .set_cache_size(options.limits.cache_bytes)
            .create(&path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen {
                    path: path.display().to_string(),
                    holder: holder::lock_holder(&path),
                },
                other if never_initialized(&path) => StoreError::Corrupt(format!(
                    "{} was never fully created (a crash during the very first start, before \
                     anything was acknowledged); remove it to start fresh ({other})",
                    path.display()
                )),
                other => StoreError::redb(other),
            })?;
        private_file(&path).map_err(io)?;
        let wal_path = dir.join(WAL_FILE);
        let created = !wal_path.exists();
        // The store has written through a log, and the log file is gone: after a crash it held
        // acknowledged writes the database does not have. Refuse (and create nothing) rather
        // than start without them.
        if created && Self::used_a_log(&db)? {
            return Err(StoreError::Corrupt(format!(
                "{} is missing, but this store writes through it: acknowledged writes may be \
                 lost. Restore the file if you can; if the node was stopped cleanly (a clean \
                 stop leaves nothing in it), create an empty file of that name to start",
                wal_path.display()
            )));
        }
        let wal_io = |error| StoreError::Io {
            path: wal_path.display().to_string(),
            error,
        };
        create_private(&wal_path).map_err(wal_io)?;
        let wal_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&wal_path)
            .map_err(wal_io)?;
        let wal_backend = redb::backends::FileBackend::new(wal_file).map_err(|e| {
            StoreError::Corrupt(format!("{}: {e}", wal_path.display()))
        })?;
        let name = wal_path.display().to_string();
        let store = Self::init(db, Some(path), options, Some((Box::new(wal_backend), name)))?;
        if created {
            // The new file's directory entry must survive a power loss too.
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io)?;
        }
        Ok(store)
    }

    /// Whether the store's meta names a write-ahead log (it has written through one).
    fn used_a_log(db: &Database) -> Result<bool, StoreError> {
        let rtxn = db.begin_read().map_err(StoreError::redb)?;
        match rtxn.open_table(META) {
            Ok(t) => Ok(t.get(META_WAL_ID).map_err(StoreError::redb)?.is_some()),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
            Err(e) => Err(StoreError::redb(e)),
        }
    }

    /// Opens (or creates) the store on custom redb backends for the database and for its
    /// write-ahead log (crash and fault tests: the log's writes and syncs go through `wal`).
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    pub fn open_with_backends(
        backend: impl StorageBackend,
        wal: impl StorageBackend,
        options: OpenOptions,
    ) -> Result<Self, StoreError> {
        let db = redb::Builder::new()
            .set_cache_size(options.limits.cache_bytes)
            .create_with_backend(backend)
            .map_err(StoreError::redb)?;
        Self::init(db, None, options, Some((Box::new(wal), WAL_FILE.to_owned())))
    }

    /// Opens (or creates) the store on a custom redb backend (in-memory, fault-injecting).
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    pub fn open_with_backend(
        backend: impl StorageBackend,
        options: OpenOptions,
    ) -> Result<Self, StoreError> {
        let db = redb::Builder::new()
            .set_cache_size(options.limits.cache_bytes)
            .create_with_backend(backend)
            .map_err(StoreError::redb)?;
        Self::init(db, None, options, None)
    }

    /// Replays the write-ahead log in `file` from the durable state's `wal_covered` on, in one
    /// durable commit that records the new covered seq.
    fn recover(
        db: &Database,
        file: Box<dyn StorageBackend>,
        name: &str,
        max: usize,
    ) -> Result<(wal::Wal, WalScan), StoreError> {
        let mut txn = db.begin_write().map_err(StoreError::redb)?;
        txn.set_durability(redb::Durability::Immediate)
            .map_err(StoreError::redb)?;
        let known: Option<u64> = meta_get(&txn, META_WAL_ID, max)?;
        let id = known.unwrap_or_else(|| rand::random::<u64>() | 1);
        let covered: u64 = meta_get(&txn, META_WAL_COVERED, max)?.unwrap_or(0);
        let (mut log, scan) =
            wal::Wal::open(file, name, id, known.is_some(), covered, |seq, payload| {
                wal::apply_redo(&txn, seq, payload)
            })?;
        meta_put(&txn, META_WAL_ID, &id)?;
        meta_put(&txn, META_WAL_COVERED, &log.next_seq())?;
        txn.commit().map_err(StoreError::redb)?;
        log.restart();
        if scan.replayed > 0 {
            tracing::info!(
                records = scan.replayed,
                bytes = scan.replayed_bytes,
                "replayed the write-ahead log"
            );
        }
        if let Some((at, end @ (crate::codec::wal::FrameEnd::Checksum | crate::codec::wal::FrameEnd::Length(_)))) =
            &scan.stopped_at
        {
            tracing::warn!(offset = at, why = ?end, "the write-ahead log ends in a torn record; the log is cut there (the write in flight at a crash, never acknowledged in immediate durability; in relaxed durability, writes of the last sync interval)");
        }
        Ok((log, scan))
    }

    /// Refuses a store of a format this build does not read (before anything is written).
    fn check_format(db: &Database, max: usize) -> Result<(), StoreError> {
        let rtxn = db.begin_read().map_err(StoreError::redb)?;
        let meta = match rtxn.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(StoreError::redb(e)),
        };
        let get = |name: &str| meta.get(name).map_err(StoreError::redb);
        if get(META_REPLICA)?.is_none() {
            return Ok(()); // a new store
        }
        let format: Option<u32> = get(META_FORMAT)?
            .map(|g| codec::decode("meta record", g.value(), max))
            .transpose()
            .map_err(|source| StoreError::Codec {
                table: "meta",
                source,
            })?;
        match format {
            Some(f) if tables::READABLE_FORMATS.contains(&f) => Ok(()),
            found => Err(StoreError::Corrupt(format!(
                "store format {} (this build reads formats {:?}; no migration: start from an \
                 empty data directory)",
                found.unwrap_or(1),
                tables::READABLE_FORMATS
            ))),
        }
    }

    fn init(
        db: Database,
        path: Option<PathBuf>,
        options: OpenOptions,
        wal_file: Option<(Box<dyn StorageBackend>, String)>,
    ) -> Result<Self, StoreError> {
        let max = options.limits.record_bytes_max;
        Self::check_format(&db, max)?;
        let (wal, wal_scan) = match wal_file {
            Some((file, name)) => {
                let (log, scan) = Self::recover(&db, file, &name, max)?;
                (Some(log), scan)
            }
            None => (None, WalScan::default()),
        };
        let txn = db.begin_write().map_err(StoreError::redb)?;
        for t in [ROWS, ELEMS, DOTS, DEDUP] {
            txn.open_table(t).map_err(StoreError::redb)?;
        }
        txn.open_table(LOG).map_err(StoreError::redb)?;
        txn.open_table(CURSORS).map_err(StoreError::redb)?;
        txn.open_table(tables::LATE).map_err(StoreError::redb)?;
        txn.open_table(tables::LATE_TOTALS)
            .map_err(StoreError::redb)?;
        // A transfer a crash (or a stop) interrupted starts over: its staged chunks go.
        txn.delete_table(tables::TRANSFER_STAGE)
            .map_err(StoreError::redb)?;
        let existing: Option<ReplicaId> = meta_get(&txn, META_REPLICA, max)?;
        let ctx: CausalContext = meta_get(&txn, META_CONTEXT, max)?.unwrap_or_default();
        let mut replica = match existing {
            Some(r) => r,
            None => options.new_replica_id.unwrap_or_else(random_replica_id),
        };
        // "Own dots contiguous" (docs/design/principles.md, "Causal context"): our own dots must be
        // contiguous, or next_dot could reissue one. If they are not, continue under a fresh
        // replica id instead of risking it.
        if !ctx.own_dots_contiguous(replica) {
            tracing::warn!(%replica, "own dots are not contiguous in the stored context; minting a new replica id");
            replica = random_replica_id();
        }
        let epoch = meta_get::<u64>(&txn, META_EPOCH, max)?
            .unwrap_or(0)
            .saturating_add(1);
        let mark: (u64, u32) = meta_get(&txn, META_HLC, max)?.unwrap_or((0, 0));
        let (log_start, log_end): (u64, u64) =
            meta_get(&txn, META_LOG_BOUNDS, max)?.unwrap_or((0, 0));
        if log_start > log_end {
            return Err(StoreError::Corrupt(format!(
                "log bounds {log_start} > {log_end}"
            )));
        }
        let truncated: CausalContext = meta_get(&txn, META_TRUNCATED, max)?.unwrap_or_default();
        let seed: Option<(ReplicaId, u64)> = meta_get(&txn, snapshot::META_SEED_CURSOR, max)?;
        let restored_joining: bool =
            meta_get(&txn, snapshot::META_RESTORED_JOINING, max)?.unwrap_or(false);
        let restored_context: Option<CausalContext> =
            meta_get(&txn, snapshot::META_RESTORED_CONTEXT, max)?;
        let mut cursors = BTreeMap::new();
        {
            let table = txn.open_table(CURSORS).map_err(StoreError::redb)?;
            for item in table.iter().map_err(StoreError::redb)? {
                let (k, v) = item.map_err(StoreError::redb)?;
                let cursor: (ReplicaId, u64) =
                    codec::decode("cursor", v.value(), max).map_err(|source| {
                        StoreError::Codec {
                            table: "cursors",
                            source,
                        }
                    })?;
                cursors.insert(PeerId(k.value()), cursor);
            }
        }
        meta_put(&txn, META_FORMAT, &STORE_FORMAT)?;
        meta_put(&txn, META_REPLICA, &replica)?;
        meta_put(&txn, META_EPOCH, &epoch)?;
        meta_put(&txn, META_CONTEXT, &ctx)?;
        meta_put(&txn, META_LOG_BOUNDS, &(log_start, log_end))?;
        txn.commit().map_err(StoreError::redb)?;
        let hlc = Hlc::restore(replica, mark, options.limits.max_clock_drift_ms);
        Ok(Self {
            db: Arc::new(db),
            path,
            replica,
            epoch,
            ctx,
            hlc,
            log_start,
            log_end,
            truncated,
            cursors,
            options,
            halted: None,
            stats: StoreStats::default(),
            unsynced: AtomicBool::new(false),
            remote_filter: None,
            seed,
            restored_joining,
            restored_context,
            dedup_cache: std::collections::HashMap::new(),
            change_values: true,
            row_cache: None,
            big_rows: std::collections::BTreeMap::new(),
            transfer_snapshots: std::collections::BTreeMap::new(),
            staged: None,
            wal,
            wal_scan,
        })
    }

    /// What opening found in the write-ahead log (records replayed; where it ended).
    pub fn wal_scan(&self) -> &WalScan {
        &self.wal_scan
    }

    /// This replica's id.
    pub fn replica(&self) -> ReplicaId {
        self.replica
    }

    /// This incarnation's epoch (1 on first open, +1 at every open).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The causal context of everything committed.
    pub fn ctx(&self) -> &CausalContext {
        &self.ctx
    }

    /// The HLC high-water mark committed with the last write.
    pub fn hlc_mark(&self) -> (u64, u32) {
        self.hlc.mark()
    }

    /// Counters since open.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.options.limits
    }

    /// The context of every log entry compaction dropped: a peer whose context does not
    /// include it must get a state transfer instead of deltas.
    pub fn truncated_context(&self) -> &CausalContext {
        &self.truncated
    }

    /// A reader sharing this database (MVCC snapshots; never blocks the writer).
    pub fn reader(&self) -> Reader {
        Reader::new(Arc::clone(&self.db), self.options.limits.clone())
    }

    /// Peers whose logs this store has joined (from the durable cursors): the peers a restarted
    /// node should expect back.
    pub fn known_peers(&self) -> Vec<PeerId> {
        self.cursors.keys().copied().collect()
    }

    /// Why the store halted, if a write failed.
    pub fn halted(&self) -> Option<&str> {
        self.halted.as_deref()
    }

    fn check_halted(&self) -> Result<(), StoreError> {
        match &self.halted {
            Some(why) => Err(StoreError::Halted(why.clone())),
            None => Ok(()),
        }
    }

    /// Runs a write path; any storage failure halts the store (no retry-and-continue).
    fn guarded<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.check_halted()?;
        let r = f(self);
        if let Err(e) = &r {
            if !matches!(e, StoreError::InvalidOp(_) | StoreError::TooLarge { .. }) {
                tracing::error!(error = %e, "storage write failed; halting writes");
                self.halted = Some(e.to_string());
            }
        }
        r
    }

    /// A write transaction of the store's durability. Drops the local commits' row cache: the
    /// caller may change rows behind it (a local commit takes the cache out before).
    fn begin(&mut self) -> Result<WriteTransaction, StoreError> {
        self.row_cache = None;
        self.big_rows.remove(&None);
        let mut txn = self.db.begin_write().map_err(StoreError::redb)?;
        let durability = match self.options.durability {
            // With a log, every commit but a local group's is durable (`commit_group`).
            _ if self.wal.is_some() => redb::Durability::Immediate,
            Durability::Immediate => redb::Durability::Immediate,
            Durability::Relaxed => {
                self.unsynced.store(true, Ordering::Release);
                redb::Durability::None
            }
        };
        txn.set_durability(durability).map_err(StoreError::redb)?;
        Ok(txn)
    }

    /// Commits a transaction begun by [`RedbStore::begin`] (durable when the store has a log:
    /// it then records that every log record so far is in the database, and the log starts
    /// over).
    fn commit(&mut self, txn: WriteTransaction) -> Result<(), StoreError> {
        match &mut self.wal {
            Some(log) => {
                meta_put(&txn, META_WAL_COVERED, &log.next_seq())?;
                txn.commit().map_err(StoreError::redb)?;
                log.restart();
                self.unsynced.store(false, Ordering::Release);
            }
            None => txn.commit().map_err(StoreError::redb)?,
        }
        Ok(())
    }

    /// Commits a local group's transaction: with a log, its redo record is appended (and
    /// synced, in `Immediate` durability) first, then the transaction commits with
    /// `Durability::None` — so no reader sees a write before it is durable. A redo over the
    /// frame limit commits durably instead.
    fn commit_group(
        &mut self,
        mut txn: WriteTransaction,
        redo: wal::Redo,
    ) -> Result<(), StoreError> {
        let immediate = self.options.durability == Durability::Immediate;
        match (&mut self.wal, redo.into_payload()) {
            (Some(log), Some(payload)) if payload.len() <= crate::codec::wal::PAYLOAD_MAX => {
                if !payload.is_empty() {
                    log.append(&payload, !immediate)?;
                    if immediate {
                        log.sync()?;
                    } else {
                        self.unsynced.store(true, Ordering::Release);
                    }
                }
                txn.set_durability(redb::Durability::None)
                    .map_err(StoreError::redb)?;
                txn.commit().map_err(StoreError::redb)
            }
            _ => self.commit(txn),
        }
    }

    /// A durable commit of everything so far when the log holds records (the log then starts
    /// over); nothing otherwise. Keeps the local commits' row cache.
    fn checkpoint_now(&mut self) -> Result<(), StoreError> {
        if self.wal_pending_bytes() == 0 {
            return Ok(()); // no log, or nothing in it
        }
        // Not `begin`: a checkpoint changes no row, so the local commits' row cache stays.
        let mut txn = self.db.begin_write().map_err(StoreError::redb)?;
        txn.set_durability(redb::Durability::Immediate)
            .map_err(StoreError::redb)?;
        self.commit(txn)?;
        self.stats.checkpoints += 1;
        Ok(())
    }

    /// Checkpoints: makes the database hold every commit durably so the write-ahead log can
    /// start over (nothing to do without a log or with an empty one). Run at a quiet moment
    /// to keep the next open's replay short; local commits do it on their own past
    /// [`CHECKPOINT_BYTES`] of log.
    ///
    /// # Errors
    /// Storage failures (the store halts).
    pub fn checkpoint(&mut self) -> Result<(), StoreError> {
        self.guarded(Self::checkpoint_now)
    }

    /// Free space of the data directory's filesystem in bytes (`None` on a custom backend, or
    /// where it cannot be read).
    pub(crate) fn free_bytes(&self) -> Option<u64> {
        #[cfg(unix)]
        {
            let dir = self.path.as_ref()?.parent()?;
            let st = rustix::fs::statvfs(dir).ok()?;
            Some(st.f_bavail.saturating_mul(st.f_frsize))
        }
        #[cfg(not(unix))]
        None
    }

    /// Bytes of write-ahead log since the last checkpoint (0 without a log).
    pub fn wal_pending_bytes(&self) -> u64 {
        self.wal.as_ref().map_or(0, wal::Wal::pending_bytes)
    }

    /// Forces a durable commit of everything committed so far (meaningful in relaxed mode).
    /// With a log this is one `fdatasync` of the log.
    ///
    /// # Errors
    /// Storage failures (the store halts).
    pub fn sync(&mut self) -> Result<(), StoreError> {
        if self.wal.is_some() {
            self.check_halted()?;
            let r = self.wal.as_mut().map_or(Ok(()), wal::Wal::sync);
            if let Err(e) = &r {
                tracing::error!(error = %e, "write-ahead log sync failed; halting writes");
                self.halted = Some(e.to_string());
            } else {
                self.unsynced.store(false, Ordering::Release);
            }
            return r;
        }
        self.guarded(|s| {
            let mut txn = s.db.begin_write().map_err(StoreError::redb)?;
            txn.set_durability(redb::Durability::Immediate)
                .map_err(StoreError::redb)?;
            meta_put(&txn, META_HLC, &s.hlc.mark())?;
            txn.commit().map_err(StoreError::redb)?;
            s.unsynced.store(false, Ordering::Release);
            Ok(())
        })
    }

    /// Takes the watch feed's end position the previous run left (`watch.rs`: a run id and a
    /// change number, kept only by a clean shutdown) and removes it durably, so a crash of this
    /// run never leaves it behind for the next.
    ///
    /// # Errors
    /// Storage failures; an undecodable record.
    pub fn take_watch_end(&mut self) -> Result<Option<(u64, u64)>, StoreError> {
        let max = self.options.limits.record_bytes_max;
        self.guarded(|s| {
            let mut txn = s.db.begin_write().map_err(StoreError::redb)?;
            txn.set_durability(redb::Durability::Immediate)
                .map_err(StoreError::redb)?;
            let end: Option<(u64, u64)> = meta_get(&txn, META_WATCH_END, max)?;
            if end.is_some() {
                let mut table = txn.open_table(META).map_err(StoreError::redb)?;
                table.remove(META_WATCH_END).map_err(StoreError::redb)?;
            }
            s.commit(txn)?;
            Ok(end)
        })
    }

    /// Keeps the watch feed's end position for the next run (durably; see
    /// [`RedbStore::take_watch_end`]).
    ///
    /// # Errors
    /// Storage failures.
    pub fn save_watch_end(&mut self, end: (u64, u64)) -> Result<(), StoreError> {
        self.guarded(|s| {
            let mut txn = s.db.begin_write().map_err(StoreError::redb)?;
            txn.set_durability(redb::Durability::Immediate)
                .map_err(StoreError::redb)?;
            meta_put(&txn, META_WATCH_END, &end)?;
            s.commit(txn)
        })
    }

    /// True when commits since the last durable one exist (only in `Durability::Relaxed`):
    /// everything committed is durable once [`RedbStore::sync`] returns `Ok`. Conservative: an
    /// aborted relaxed transaction also counts.
    pub fn unsynced(&self) -> bool {
        self.unsynced.load(Ordering::Acquire)
    }

    /// Runs redb's integrity check (used by crash tests; needs exclusive access: it releases
    /// the state-transfer snapshots, and a transfer under way starts over).
    ///
    /// # Errors
    /// Storage failures.
    pub fn check_integrity(&mut self) -> Result<bool, StoreError> {
        self.transfer_snapshots.clear();
        self.big_rows.clear();
        match Arc::get_mut(&mut self.db) {
            Some(db) => db.check_integrity().map_err(StoreError::redb),
            None => Err(StoreError::Corrupt(
                "integrity check needs exclusive access (drop readers first)".into(),
            )),
        }
    }

    /// Checks the store's invariants against its tables: every live dot is in the context and
    /// (except counter dots, which have no index rows) indexed to its key, every index entry points at a row holding that dot, and the context
    /// committed equals the one in memory (docs/design/principles.md:
    /// always-invariant 5, pitfall "bookkeeping equals disk"). Cost O(store).
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the first violation; storage failures.
    pub fn verify(&self) -> Result<(), StoreError> {
        self.reader().verify(&self.ctx)
    }
}

impl Drop for RedbStore {
    /// A clean close checkpoints, so the next open has no log to replay (best effort: a
    /// failure here leaves the log, which the next open replays).
    fn drop(&mut self) {
        if self.halted.is_none() {
            if let Err(e) = self.checkpoint_now() {
                tracing::warn!(error = %e, "checkpoint at close failed; the next open replays the log");
            }
        }
    }
}
