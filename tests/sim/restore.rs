//! Snapshots and restores (the recording backend's schedule draws them).
//!
//! Now and then a snapshot of a node's store (running or down) is taken and kept
//! ([`RedbStore::snapshot`]); its header must describe the store exactly. A restore wipes node
//! `i` — its process, its disk, the inputs queued for it and every message it had in flight —
//! and recreates its store with [`restore_snapshot`] from a kept snapshot or one taken at that
//! moment, of `i` itself or of another node (`tempfile` directories; the restored database's
//! bytes then back a recording backend), under a fresh replica id drawn from the seed;
//! sometimes a second node is restored from the same snapshot file right after. Checked: a
//! restore under the source's id is refused and leaves nothing behind; the restored store has an
//! id never used in the run, an epoch above the source's, exactly the snapshot's entries and
//! context, an empty log truncated at that context, the seed cursor `(source, source log end)`,
//! and passes redb's integrity check and `verify`; a new `Replica` over it (same `PeerId`)
//! restarts later and keeps writing (when the source still runs and retains its log from the
//! seed end, it serves the restored store by deltas from there), and every commit takes exactly
//! the next dots of the store's current id (never one of a retired id).
//!
//! Exactly what nothing else holds is lost: an op survives iff its dot is in the restored
//! store's or a remaining store's committed context; the others are dropped from the oracle
//! (kept in the dot map) and their dots must never appear in a message or store again. A commit
//! logged in several records can survive in part (a peer joined the part with its dots, only
//! the restored node held the part with its removals): a surviving add/set that no remaining
//! state retired no longer counts as seen by the ops that retired it. Every other kept snapshot
//! is dropped at a restore (it could hold lost ops).

use super::counts::Counts;
use super::harness::{NodeState, Sim, durable_mark, entries};
use crate::common::FaultBackend;
use rand::Rng;
use std::collections::BTreeSet;
use std::path::PathBuf;
use tidemark::proto::{PeerId, Replica, StateStore};
use tidemark::store::{DB_FILE, RedbStore, SnapshotInfo, StoreError, restore_snapshot};
use tidemark_crdts::{CausalContext, DotStore, Entry, Key, ReplicaId};

/// A snapshot file the simulation keeps for restores, with what its source held when it was
/// taken.
struct Backup {
    path: PathBuf,
    info: SnapshotInfo,
    node: usize,
    entries: Vec<(Key, Entry)>,
    /// The ops whose effects its source had been delivered.
    delivered: CausalContext,
    /// Stores restored from it so far.
    restored: u32,
}

/// Snapshot files, restores and the replica ids of a run.
pub struct Restores {
    /// Snapshot files and restored data directories live here (made at the first snapshot).
    files: Option<tempfile::TempDir>,
    files_made: u64,
    backups: Vec<Backup>,
    /// Every replica id any store ever had, and those no longer in use (restored or wiped
    /// away).
    pub used_ids: BTreeSet<ReplicaId>,
    pub retired_ids: BTreeSet<ReplicaId>,
    /// Ids of restored stores.
    pub restored_ids: BTreeSet<ReplicaId>,
    /// Restored nodes whose seed cursor names a running source: `(restored, source, log id,
    /// seed end)`, until the source's first interval from the seed end reaches it.
    seeded: Vec<(usize, usize, ReplicaId, u64)>,
}

/// A temporary directory for snapshot files and restored data directories: in memory where
/// `/dev/shm` exists (their fsyncs cost seconds on a busy disk, and durability of the files is
/// not what this simulation checks; `tests/snapshot.rs` does).
fn files_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    shm.is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten()
        .unwrap_or_else(|| tempfile::tempdir().expect("temp dir"))
}

impl Restores {
    pub fn new(ids: impl Iterator<Item = ReplicaId>) -> Self {
        Self {
            files: None,
            files_made: 0,
            backups: Vec::new(),
            used_ids: ids.collect(),
            retired_ids: BTreeSet::new(),
            restored_ids: BTreeSet::new(),
            seeded: Vec::new(),
        }
    }

    /// A fresh path under the run's temporary directory.
    fn file(&mut self, what: &str) -> PathBuf {
        self.files_made += 1;
        self.files
            .get_or_insert_with(files_dir)
            .path()
            .join(format!("{what}-{}", self.files_made))
    }

    /// Node `to` got a delta of `log` from `from` (node `from_node`): the first one from the seed
    /// end of a restored store's source counts as serving it by deltas.
    pub fn seeded_hit(
        &mut self,
        to: usize,
        from_node: usize,
        log: ReplicaId,
        from: u64,
        counts: &mut Counts,
    ) {
        let hit = (to, from_node, log, from);
        if self.seeded.contains(&hit) {
            // The source serves the restored store from the seed end: no transfer to it.
            counts.restore_seeded_by_deltas += 1;
            self.seeded.retain(|x| *x != hit);
        }
    }
}

impl Sim {
    /// Takes a snapshot of node `s`'s committed state (running or down) and keeps it; returns
    /// its index. The header must describe the store exactly.
    pub fn take_snapshot(&mut self, s: usize) -> usize {
        let seed = self.seed;
        let path = self.restores.file("snapshot");
        let wall = self.now_of(s).wall_ms;
        let node = &self.nodes[s];
        let info = node
            .store
            .snapshot(&path, wall)
            .unwrap_or_else(|e| panic!("seed {seed}: node {s}: snapshot: {e}"));
        assert!(
            info.source_replica == node.id
                && info.source_epoch == node.epoch
                && info.source_log_end == node.store.log_bounds().1
                && &info.context == node.store.ctx(),
            "seed {seed}: node {s}: the snapshot header differs from the store: {info:?}"
        );
        let entries = node.store.reader().entries().expect("read entries");
        let delivered = node.delivered.clone();
        self.counts.snapshots += 1;
        self.log(|| format!("snapshot of node {s}: {:?}", info.context));
        self.mix(format!("snapshot {s} {}", info.source_log_end).as_bytes());
        let backups = &mut self.restores.backups;
        backups.push(Backup {
            path,
            info,
            node: s,
            entries,
            delivered,
            restored: 0,
        });
        if backups.len() > 3 {
            backups.remove(0);
        }
        backups.len() - 1
    }

    /// Node `i` loses its disk (and its process) and is restored from backup `b` under a new
    /// replica id; it restarts `down_ms` later.
    ///
    /// What the cluster still holds decides what survives, exactly: an acknowledged op survives
    /// iff its dot is in the restored snapshot's context or in a remaining store's committed
    /// context (in-flight messages from `i` are dropped: a legal loss). Nothing else holds
    /// state: queued inputs die with the process, and the transfers other nodes buffer from
    /// `i` are dropped when its connection goes down, before they complete.
    fn restore(&mut self, i: usize, down_ms: u64, b: usize) {
        let seed = self.seed;
        let n = self.n();
        let old = self.nodes[i].id;
        self.counts.restores += 1;
        self.nodes[i].crash_armed = None;
        // The process dies with its disk: what was queued for it and what it sent is gone.
        self.net.retain(|_, p| p.to != i && p.from != i);
        let (src_path, info, source_node) = {
            let bk = &self.restores.backups[b];
            (bk.path.clone(), bk.info.clone(), bk.node)
        };
        let source = info.source_replica;
        let limits = self.options.limits.clone();
        if self.counts.restore_source_id_refused == 0 {
            // Restoring under the source's id is refused and leaves nothing behind.
            let dir = self.restores.file("refused");
            match restore_snapshot(&src_path, &dir, Some(source), &limits) {
                Err(StoreError::Snapshot(_)) => {}
                other => panic!(
                    "seed {seed}: a restore under the snapshot source's id was not refused: \
                     {other:?}"
                ),
            }
            assert!(
                !dir.join(DB_FILE).exists(),
                "seed {seed}: a refused restore left a database"
            );
            self.counts.restore_source_id_refused += 1;
        }
        let id = loop {
            let id = ReplicaId(self.rng.random());
            if !self.restores.used_ids.contains(&id) {
                break id;
            }
        };
        let dir = self.restores.file("restored");
        let what = format!("node {i} restored from a snapshot of {source:?} as {id:?}");
        self.log(|| what.clone());
        let got = restore_snapshot(&src_path, &dir, Some(id), &limits)
            .unwrap_or_else(|e| panic!("seed {seed}: {what}: restore: {e}"));
        assert_eq!(
            got, info,
            "seed {seed}: {what}: restore read another header"
        );
        let image = std::fs::read(dir.join(DB_FILE)).expect("read the restored database");
        std::fs::remove_dir_all(&dir).expect("remove the restored directory");
        let backend = FaultBackend::recording_from_image(image);
        let mut store = RedbStore::open_with_backend(backend.clone(), self.options.clone())
            .unwrap_or_else(|e| panic!("seed {seed}: {what}: open: {e}"));
        // A new id never used in this run (not the source's, not any node's, current or past),
        // an epoch above the source's, the snapshot's state with an empty log whose truncated
        // context is the snapshot's, and the seed cursor into the source's log.
        let me = store.replica();
        assert!(
            me == id && me != source && !self.restores.used_ids.contains(&me),
            "seed {seed}: {what}: the restored store has replica id {me:?}"
        );
        assert!(
            store.epoch() > info.source_epoch,
            "seed {seed}: {what}: epoch {} not above the source's {}",
            store.epoch(),
            info.source_epoch
        );
        let (start, end) = store.log_bounds();
        assert!(
            store.ctx() == &info.context
                && store.truncated_context() == &info.context
                && start == end
                && store.ctx().max_seq(me) == 0
                && store.seed_cursor() == Some((source, info.source_log_end))
                && (0..n).all(|j| store.peer_cursor(PeerId(j as u64)) == store.seed_cursor()),
            "seed {seed}: {what}: the restored store is not the snapshot: log ({start}, {end}), \
             seed {:?}, ctx {:?}, snapshot {:?}",
            store.seed_cursor(),
            store.ctx(),
            info.context
        );
        assert!(
            store.reader().entries().expect("read entries") == self.restores.backups[b].entries,
            "seed {seed}: {what}: the restored entries differ from the source's at the snapshot"
        );
        assert!(
            store.check_integrity().expect("integrity check runs"),
            "seed {seed}: {what}: redb integrity check failed"
        );
        store
            .verify()
            .unwrap_or_else(|e| panic!("seed {seed}: {what}: verify: {e}"));
        let r = &mut self.restores;
        r.used_ids.insert(me);
        r.retired_ids.insert(old);
        r.restored_ids.insert(me);
        if source_node == i {
            self.counts.restored_from_own += 1;
        } else {
            self.counts.restored_from_other += 1;
        }
        r.seeded.retain(|(x, s, _, _)| *x != i && *s != i);
        if let Some(s) = (0..n).find(|j| *j != i && self.nodes[*j].id == source) {
            self.counts.restored_source_live += 1;
            r.seeded.push((i, s, source, info.source_log_end));
        }
        r.backups[b].restored += 1;
        if r.backups[b].restored == 2 {
            self.counts.restored_twice += 1;
        }
        // What survives: the restored state and every other node's committed state.
        let states: Vec<(CausalContext, CausalContext)> = std::iter::once(&store)
            .chain((0..n).filter(|j| *j != i).map(|j| &self.nodes[j].store))
            .map(|st| {
                let mut live = CausalContext::new();
                for e in entries(st).values() {
                    live.join(&e.dots());
                }
                (st.ctx().clone(), live)
            })
            .collect();
        let lost = self
            .oracle
            .mark_lost_unless(|d| states.iter().any(|(ctx, _)| ctx.contains(d)));
        if !lost.is_empty() {
            self.counts.restore_lost_writes += 1;
            self.counts.restore_lost_ops += lost.len() as u64;
            self.log(|| format!("{what}: lost {lost:?}"));
        }
        for d in &lost {
            self.dots.lost.insert(*d);
        }
        self.counts.restore_lost_retirements += self.oracle.forget_lost_retirements(|d| {
            states
                .iter()
                .any(|(ctx, live)| ctx.contains(d) && !live.contains(d))
        });
        // A new replica core over the restored store; the node restarts later.
        let epoch = store.epoch();
        let peers = (0..n).filter(|j| *j != i).map(|j| PeerId(j as u64));
        let replica = Replica::new(self.cfg.clone(), epoch, self.rng.random(), peers);
        let node = &mut self.nodes[i];
        let old_replica = std::mem::replace(&mut node.replica, replica);
        node.past_stats.push(old_replica.stats().clone());
        node.id = me;
        node.delivered = self.restores.backups[b].delivered.intersection(store.ctx());
        node.acked_max_seq = 0;
        node.last_ctx = store.ctx().clone();
        node.last_hlc = store.hlc_mark();
        node.checked_at = None;
        node.last_mark = durable_mark(&store, n);
        node.last_syncs = backend.syncs();
        node.store = store;
        node.backend = backend;
        node.epoch = epoch;
        node.state = NodeState::Crashed {
            restart_at: self.now + down_ms,
        };
        node.conn = vec![false; n];
        self.check_store(i, &what);
        self.mix(format!("restore {i} {me:?} {}", lost.len()).as_bytes());
        for j in 0..n {
            if j != i {
                self.sync_links(j);
                // Nothing a remaining store holds is lost.
                self.check_store(j, &format!("node {j} after {what}"));
            }
        }
    }

    /// The `Restore` action: one snapshot, one or two nodes restored from it. Every other kept
    /// snapshot is dropped (it may hold ops this restore lost, which must never come back).
    pub fn restore_action(
        &mut self,
        node: usize,
        down_ms: u64,
        pick: Option<usize>,
        fresh_from: usize,
        also: Option<usize>,
    ) {
        let b = match pick {
            Some(k) if !self.restores.backups.is_empty() => k % self.restores.backups.len(),
            _ => self.take_snapshot(fresh_from),
        };
        self.restore(node, down_ms, b);
        if let Some(k) = also.filter(|k| *k != node) {
            self.restore(k, down_ms, b);
        }
        let backups = &mut self.restores.backups;
        let kept = backups.swap_remove(b);
        for other in backups.drain(..) {
            let _ = std::fs::remove_file(other.path);
        }
        backups.push(kept);
    }
}
