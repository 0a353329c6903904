//! Deterministic cluster simulation over the durable store (docs/design/principles.md, "Testing
//! goals"): 3–4 [`Replica`]s, each over a [`RedbStore`] on a recording redb backend
//! (`tests/common`), exchange messages through a simulated network in virtual time; one seed drives
//! everything.
//!
//! * Clients write on every node through `commit_local` (gcounter inc, pncounter inc/dec, orset
//!   add/remove, lww and mvreg set, deletes; now and then an invalid counter delete, which must be
//!   refused without halting). A write is acknowledged only after `commit_local` returned `Ok`
//!   (and the backend shows it synced); then `handle_local_commit`.
//! * The network drops (0–20 %), duplicates (0–10 %), delays and reorders (up to 2 s) messages,
//!   and partitions that heal. The store's `message_bytes_target` is the replica's (256 B –
//!   4 KiB, as a node configures them), so commit groups and remote inflations are often logged
//!   in several records, and an interval may end inside such a run. Compaction keeps the last 0
//!   or 64 log entries (by seed), as the driver keeps `log_retain_entries`.
//! * Crash-restarts lose the node's volatile state (its `Replica`, the inputs queued for it) and
//!   reopen its store from a crash image of its backend: "durable only", "durable + a random
//!   subset of the unsynced writes", and the other cuts of [`ImageKind`] (torn last write, header
//!   without the file extension, everything written). A node crashes while idle, or inside a
//!   client commit, a remote delta/chunk join, or a timer tick with its log compaction; the image
//!   is cut anywhere inside that input (often right before its sync), and sometimes the node
//!   crashes again while it recovers. After each reopen: it opens, `check_integrity`, `verify`,
//!   same replica id, a higher epoch than the crashed process had, the committed state (entries,
//!   context, log bounds, compacted context, cursors, HLC mark) is exactly the one before the
//!   input or the one after it (nothing acknowledged is lost, the commit in flight is all or
//!   nothing), and the store's own max seq is at least the highest it acknowledged. A new
//!   `Replica` (the reopened store's epoch, the same peers) takes over at the restart.
//! * Every input that committed something synced before it returned, and `verify` holds after
//!   every input.
//! * No dot reuse: a cluster-wide map dot → op (key, mutation, running counter total) of every
//!   dot issued by an acknowledged commit (or an unacknowledged one the crash image kept) must
//!   never see a dot twice, and every dot in a message sent, in a reopened store and in the
//!   final stores must be in it with the same content (a dot from a lost commit that leaked out
//!   or was reissued with other content shows up as a mismatch).
//! * Restores: now and then a snapshot of a node's store (running or down) is taken
//!   and kept ([`RedbStore::snapshot`]). A restore wipes node `i` — its process, its disk, the
//!   inputs queued for it and every message it had in flight — and recreates its store with
//!   [`restore_snapshot`] from a kept snapshot or one taken at that moment, of `i` itself or of
//!   another node (`tempfile` directories; the restored database's bytes then back a recording
//!   backend), under a fresh replica id drawn from the seed; sometimes a second node is
//!   restored from the same snapshot file right after. Checked: a restore under the source's
//!   id is refused; the restored store has an id never used in the run, an epoch above the
//!   source's, exactly the snapshot's entries and context, an empty log truncated at that
//!   context, the seed cursor `(source, source log end)`; a new `Replica` over it (same
//!   `PeerId`) restarts later and keeps writing (when the source still runs and retains its
//!   log from the seed end, it serves the restored store by deltas from there), and every
//!   commit takes exactly the next dots of the store's current id (never one of a retired id).
//!   Exactly what nothing else holds is lost: an op survives iff its dot is in the restored store's or a remaining store's
//!   committed context; the others are dropped from the oracle (kept in the dot map) and
//!   their dots must never appear in a message or store again. A commit logged in several
//!   records can survive in part (a peer joined the part with its dots, only the restored
//!   node held the part with its removals): a surviving add/set that no remaining state
//!   retired no longer counts as seen by the ops that retired it. Every other kept snapshot is
//!   dropped at a restore (it could hold lost ops). No node is ever detected as a data dir
//!   copied back under its old id (`take_restored_copy`, checked after every input): a
//!   restored store has a new id, so no peer holds more of it than it does.
//! * After the schedule: heal, stop writes, and require every store to hold identical entries
//!   and contexts within [`CONVERGE_MS`] of virtual time, equal to the sequential-specification
//!   oracle (`tests/sim/oracle.rs`) over the acknowledged ops plus the in-flight commits the
//!   crash images kept (the reopened context tells exactly whether the one unacknowledged
//!   commit before a crash survived): exact counter sums; every orset add no remove/delete
//!   observed present, every observed one gone; registers. Every store holds the dot of every
//!   acknowledged op no restore lost. Each final state is durable: its "durable only" image
//!   reopens to it.
//! * Coverage: each interesting case (a crash that recovered unsynced writes, a commit in flight
//!   kept and one lost, a state transfer, a duplicate interval, compaction, ...) must occur at
//!   least once over the seeds.
//!
//! Env: `SEEDS=n` (default 60), `SOAK=1` (×20), `SEED=n` (replay one seed, verbose).
//!
//! `two_nodes_restored_from_each_others_snapshots_converge` runs the same simulation with two
//! nodes that keep 64 log entries (the case that found the back-propagation bug, see there).

mod common;
#[allow(dead_code)]
#[path = "sim/oracle.rs"]
mod oracle;

use common::{FaultBackend, ImageKind, Rec, crash_image, durable_prefix};
use oracle::Oracle;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;
use tidemark::codec;
use tidemark::config::Limits;
use tidemark::proto::{
    Message, Now, PeerId, Replica, ReplicaConfig, ReplicaEvent, ReplicaStats, StateStore,
};
use tidemark::store::{
    DB_FILE, LocalWrite, OpenOptions, RedbStore, SnapshotInfo, StoreError, restore_snapshot,
};
use tidemark_crdts::{CausalContext, Dot, DotStore, Entry, Key, KeyKind, Mutation, ReplicaId};

const BASE_WALL_MS: u64 = 1_700_000_000_000;
const FAULT_WINDOW_MS: u64 = 90_000;
/// Virtual time allowed from the heal until every store is identical.
const CONVERGE_MS: u64 = 60_000;
/// Backend log records kept before a checkpoint folds them into one image.
const CHECKPOINT_RECORDS: usize = 512;

fn sim_config(seed: u64) -> ReplicaConfig {
    ReplicaConfig {
        gossip_interval_ms: 500,
        retransmit_timeout_ms: 1_000,
        retransmit_timeout_max_ms: 4_000,
        peer_evict_after_ms: 10_000,
        hello_attempts: 2,
        // Small messages make multi-chunk transfers and size-bounded intervals common.
        message_bytes_target: [256, 1024, 4096][(seed % 3) as usize],
        have_after_changed_keys: [1, 1024][((seed / 3) % 2) as usize],
        ..ReplicaConfig::default()
    }
}

/// Network fault knobs (applied when a message is sent).
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    drop_pct: u32,
    dup_pct: u32,
    /// Extra random delay up to this, for 30 % of the messages (reordering).
    delay_max_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    Up,
    Down { restart_at: u64 },
}

/// Where in its work a node crashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CrashMode {
    /// Between inputs: everything it did is durable.
    Idle,
    /// Inside a client commit (never acknowledged).
    DuringWrite,
    /// Inside the join of the next delta or chunk queued for it (never acknowledged).
    DuringDelivery,
    /// Inside a timer tick and the log compaction it allows.
    DuringTick,
}

#[derive(Clone, Debug)]
enum Action {
    Write(usize),
    Faults(Faults),
    Partition(Vec<Vec<bool>>),
    Crash {
        node: usize,
        down_ms: u64,
        mode: CrashMode,
    },
    /// Take a snapshot of this node's store and keep it for restores.
    Snapshot(usize),
    /// `node` loses its disk and is restored from a kept snapshot (`pick` chooses one) or, with
    /// none kept or `pick` unset, from one taken of `fresh_from` at that moment; `also`: another
    /// node restored from the same snapshot right after.
    Restore {
        node: usize,
        down_ms: u64,
        pick: Option<usize>,
        fresh_from: usize,
        also: Option<usize>,
    },
}

/// A snapshot file the simulation keeps for restores, with what its source held when it was
/// taken.
struct Backup {
    path: PathBuf,
    info: SnapshotInfo,
    node: usize,
    entries: Vec<(Key, Entry)>,
    /// Stores restored from it so far.
    restored: u32,
}

struct Node {
    id: ReplicaId,
    backend: FaultBackend,
    store: RedbStore,
    replica: Replica,
    state: NodeState,
    /// This node's view of each peer's connection (what peer_up/peer_down said).
    conn: Vec<bool>,
    /// Highest own seq of a commit acknowledged (or kept by a crash image).
    acked_max_seq: u64,
    /// The context never shrinks.
    last_ctx: CausalContext,
    epoch: u64,
    past_stats: Vec<ReplicaStats>,
    /// Crash inside the next delta or chunk join, then stay down this long.
    crash_armed: Option<u64>,
    /// Wall-clock skew (the HLC and LWW timestamps see it).
    skew_ms: i64,
    /// The durable mark and the backend's sync count after the last input.
    last_mark: DurableMark,
    last_syncs: u64,
}

struct Packet {
    from: usize,
    to: usize,
    msg: Message,
}

/// What an issued dot stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Issued {
    key: Key,
    mutation: Mutation,
    /// For counter ops: the issuer's running `(increments, decrements)` on the key up to and
    /// including this op (what a causal counter's dot holds).
    total: (u64, u64),
}

/// How often the interesting cases happened.
#[derive(Clone, Debug, Default)]
struct Counts {
    ops_acked: u64,
    ops_refused_invalid: u64,
    writes_while_down: u64,
    crashes: u64,
    crash_idle: u64,
    crash_during_write: u64,
    crash_during_delivery: u64,
    crash_during_tick: u64,
    /// Crashes inside a tick that compacted the log.
    crash_during_compaction: u64,
    /// A second crash while the reopened store recovered.
    crash_during_recovery: u64,
    images: BTreeMap<&'static str, u64>,
    /// The reopened store holds the in-flight input's commit although no sync of it was in the
    /// image (unsynced writes recovered).
    recovered_unsynced: u64,
    /// The in-flight client commit (never acknowledged) was kept by the image / was lost.
    maybe_kept: u64,
    maybe_lost: u64,
    /// The in-flight remote join was kept / lost.
    join_kept: u64,
    join_lost: u64,
    /// The in-flight compaction was kept / lost.
    compaction_kept: u64,
    compaction_lost: u64,
    partitions: u64,
    delivered: u64,
    dropped: u64,
    duplicated: u64,
    compactions: u64,
    checkpoints: u64,
    transfers: u64,
    transfers_behind_log: u64,
    transfers_received: u64,
    later_chunks: u64,
    duplicates: u64,
    gaps: u64,
    stale_acks: u64,
    retransmits: u64,
    evictions: u64,
    filtered: u64,
    stale_chunks: u64,
    rejected: u64,
    hlc_rejected: u64,
    snapshots: u64,
    restores: u64,
    /// Restored from a snapshot of its own store / of another node's.
    restored_from_own: u64,
    restored_from_other: u64,
    /// The snapshot's source was still running under the snapshot's replica id (the restored
    /// store's seed cursor names a live log).
    restored_source_live: u64,
    /// A second store restored from one snapshot file.
    restored_twice: u64,
    /// Restores that lost acknowledged ops (held by no remaining store and not in the
    /// snapshot), and those ops.
    restore_lost_writes: u64,
    restore_lost_ops: u64,
    /// Retirements a restore lost although the retiring op survived (its commit's removal part
    /// was held only by the restored node).
    restore_lost_retirements: u64,
    /// Commit groups logged in several records.
    split_commits: u64,
    /// Ops acknowledged by restored replicas (under their new ids).
    restored_ops_acked: u64,
    /// A restore under the snapshot source's replica id refused.
    restore_source_id_refused: u64,
    /// A restored store got its source's log from the seed cursor on, as deltas.
    restore_seeded_by_deltas: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        macro_rules! add { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        add!(
            ops_acked,
            ops_refused_invalid,
            writes_while_down,
            crashes,
            crash_idle,
            crash_during_write,
            crash_during_delivery,
            crash_during_tick,
            crash_during_compaction,
            crash_during_recovery,
            recovered_unsynced,
            maybe_kept,
            maybe_lost,
            join_kept,
            join_lost,
            compaction_kept,
            compaction_lost,
            partitions,
            delivered,
            dropped,
            duplicated,
            compactions,
            checkpoints,
            transfers,
            transfers_behind_log,
            transfers_received,
            later_chunks,
            duplicates,
            gaps,
            stale_acks,
            retransmits,
            evictions,
            filtered,
            stale_chunks,
            rejected,
            hlc_rejected,
            snapshots,
            restores,
            restored_from_own,
            restored_from_other,
            restored_source_live,
            restored_twice,
            restore_lost_writes,
            restore_lost_ops,
            restore_lost_retirements,
            restored_ops_acked,
            split_commits,
            restore_source_id_refused,
            restore_seeded_by_deltas
        );
        for (k, v) in &o.images {
            *self.images.entry(k).or_default() += v;
        }
    }
}

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn image_name(kind: ImageKind) -> &'static str {
    match kind {
        ImageKind::DurableOnly => "durable only",
        ImageKind::DurableSubset => "durable + subset of unsynced",
        ImageKind::TornLast(512) => "torn last write (512 B)",
        ImageKind::TornLast(_) => "torn last write (4 KiB)",
        ImageKind::HeaderNotExtension => "header, not extension",
        ImageKind::Everything => "everything written",
    }
}

fn pick_image(rng: &mut ChaCha8Rng) -> ImageKind {
    match rng.random_range(0..20) {
        0..7 => ImageKind::DurableOnly,
        7..14 => ImageKind::DurableSubset,
        14 | 15 => ImageKind::TornLast(512),
        16 => ImageKind::TornLast(4096),
        17 => ImageKind::HeaderNotExtension,
        _ => ImageKind::Everything,
    }
}

fn key_of(idx: usize) -> Key {
    Key::new(KeyKind::ALL[idx % 5], format!("k{idx}"))
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

/// What changes with every commit: log bounds, context and cursors.
type DurableMark = ((u64, u64), CausalContext, Vec<Option<(ReplicaId, u64)>>);

fn durable_mark(store: &RedbStore, n: usize) -> DurableMark {
    (
        store.log_bounds(),
        store.ctx().clone(),
        (0..n)
            .map(|j| store.peer_cursor(PeerId(j as u64)))
            .collect(),
    )
}

/// What a store has committed: entries, context, log bounds, compacted context, cursors and
/// the HLC mark.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Snapshot {
    entries: Vec<(Key, Entry)>,
    ctx: CausalContext,
    log: (u64, u64),
    truncated: CausalContext,
    cursors: Vec<Option<(ReplicaId, u64)>>,
    hlc: (u64, u32),
}

fn snapshot(store: &RedbStore, n: usize) -> Snapshot {
    Snapshot {
        entries: store.reader().entries().expect("read entries"),
        ctx: store.ctx().clone(),
        log: store.log_bounds(),
        truncated: store.truncated_context().clone(),
        cursors: (0..n)
            .map(|j| store.peer_cursor(PeerId(j as u64)))
            .collect(),
        hlc: store.hlc_mark(),
    }
}

struct Sim {
    seed: u64,
    verbose: bool,
    rng: ChaCha8Rng,
    now: u64,
    nodes: Vec<Node>,
    net: BTreeMap<(u64, u64), Packet>,
    net_seq: u64,
    faults: Faults,
    /// `blocked[from][to]`: messages in that direction are dropped.
    blocked: Vec<Vec<bool>>,
    cfg: ReplicaConfig,
    options: OpenOptions,
    oracle: Oracle,
    /// Every issued dot (acknowledged, or kept by a crash image) and what it stands for.
    issued: BTreeMap<Dot, Issued>,
    issued_ctx: CausalContext,
    /// Running counter totals per (issuer, key).
    totals: BTreeMap<(ReplicaId, Key), (u64, u64)>,
    n_keys: usize,
    serial: u64,
    counts: Counts,
    trace: u64,
    /// Snapshot files and restored data directories live here.
    files: tempfile::TempDir,
    files_made: u64,
    backups: Vec<Backup>,
    /// Every replica id any store ever had, and those no longer in use (restored away).
    used_ids: BTreeSet<ReplicaId>,
    retired_ids: BTreeSet<ReplicaId>,
    /// Ids of restored stores.
    restored_ids: BTreeSet<ReplicaId>,
    /// Dots of acknowledged ops a restore lost: never seen again anywhere.
    lost_ctx: CausalContext,
    /// Log entries a compaction keeps (a node's `log_retain_entries`).
    log_retain: u64,
    /// Restored nodes whose seed cursor names a running source: `(restored, source, log id,
    /// seed end)`, until the source's first interval from the seed end reaches it.
    seeded: Vec<(usize, usize, ReplicaId, u64)>,
}

/// What a seed's cluster looks like besides what the seed draws.
#[derive(Clone, Copy, Debug, Default)]
struct Shape {
    /// Number of nodes (default: 3 or 4, drawn).
    nodes: Option<usize>,
    /// Log entries a compaction keeps (default: 0 or 64, by seed).
    log_retain: Option<u64>,
}

impl Sim {
    fn new(seed: u64, verbose: bool, shape: Shape) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = match shape.nodes {
            Some(k) => rng.random_range(k..=k),
            None => rng.random_range(3..=4),
        };
        let cfg = sim_config(seed);
        // Small caches make redb write pages out before a commit's sync, too.
        let cache_bytes = [64 * 1024, 512 * 1024, 4 << 20][rng.random_range(0..3)];
        // The store cuts its log records at the replica's message target, as a node configures
        // it (`node.rs`: the replica's target is at most the store's): commit groups and remote
        // inflations are then often logged in several records, which an interval may cut.
        let target = cfg.message_bytes_target;
        let limits = Limits {
            cache_bytes,
            message_bytes_target: target,
            key_bytes_max: 16,
            value_bytes_max: target / 4 - 16,
            element_bytes_max: target / 4 - 16,
            ..Limits::default()
        };
        limits.validate().expect("valid limits");
        let options = OpenOptions {
            limits,
            ..OpenOptions::default()
        };
        let mut nodes = Vec::new();
        for i in 0..n {
            let id = ReplicaId(rng.random());
            let backend = FaultBackend::recording();
            let store = RedbStore::open_with_backend(
                backend.clone(),
                OpenOptions {
                    new_replica_id: Some(id),
                    ..options.clone()
                },
            )
            .expect("create store");
            assert_eq!(store.replica(), id);
            let epoch = store.epoch();
            let peers = (0..n).filter(|j| *j != i).map(|j| PeerId(j as u64));
            let last_mark = durable_mark(&store, n);
            let last_syncs = backend.syncs();
            nodes.push(Node {
                id,
                backend,
                store,
                replica: Replica::new(cfg.clone(), epoch, rng.random(), peers),
                state: NodeState::Up,
                conn: vec![false; n],
                acked_max_seq: 0,
                last_ctx: CausalContext::new(),
                epoch,
                past_stats: Vec::new(),
                crash_armed: None,
                skew_ms: if rng.random_bool(0.5) {
                    rng.random_range(-3_000..=3_000)
                } else {
                    0
                },
                last_mark,
                last_syncs,
            });
        }
        let n_keys = rng.random_range(3..=40);
        let used_ids: BTreeSet<ReplicaId> = nodes.iter().map(|n| n.id).collect();
        assert_eq!(
            used_ids.len(),
            n,
            "seed {seed}: two nodes drew one replica id"
        );
        let mut sim = Self {
            seed,
            verbose,
            rng,
            now: 0,
            nodes,
            net: BTreeMap::new(),
            net_seq: 0,
            faults: Faults::default(),
            blocked: vec![vec![false; n]; n],
            cfg,
            options,
            oracle: Oracle::default(),
            issued: BTreeMap::new(),
            issued_ctx: CausalContext::new(),
            totals: BTreeMap::new(),
            n_keys,
            serial: 0,
            counts: Counts::default(),
            trace: 0xcbf2_9ce4_8422_2325,
            files: files_dir(),
            files_made: 0,
            backups: Vec::new(),
            used_ids,
            retired_ids: BTreeSet::new(),
            restored_ids: BTreeSet::new(),
            lost_ctx: CausalContext::new(),
            log_retain: shape
                .log_retain
                .unwrap_or([0, 64][((seed / 6) % 2) as usize]),
            seeded: Vec::new(),
        };
        for i in 0..n {
            sim.sync_links(i);
        }
        sim
    }

    fn n(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`'s time: the virtual clock, and its (maybe skewed) wall clock.
    fn now_of(&self, i: usize) -> Now {
        Now {
            mono_ms: self.now,
            wall_ms: (BASE_WALL_MS + self.now).saturating_add_signed(self.nodes[i].skew_ms),
        }
    }

    fn mix(&mut self, bytes: &[u8]) {
        self.trace = fnv(self.trace, bytes);
    }

    fn up(&self, i: usize) -> bool {
        self.nodes[i].state == NodeState::Up
    }

    fn log(&self, what: impl FnOnce() -> String) {
        if self.verbose {
            println!("t={} {}", self.now, what());
        }
    }

    // ---- links and network -----------------------------------------------------------------

    /// Brings node `i`'s connection view in line with reachability (only while it runs).
    fn sync_links(&mut self, i: usize) {
        if !self.up(i) {
            return;
        }
        for j in 0..self.n() {
            if j == i {
                continue;
            }
            let want = self.up(j) && !(self.blocked[i][j] && self.blocked[j][i]);
            if want != self.nodes[i].conn[j] {
                self.nodes[i].conn[j] = want;
                let now = self.now_of(i);
                let peer = PeerId(j as u64);
                let node = &mut self.nodes[i];
                if want {
                    node.replica
                        .peer_up(now, peer, &mut node.store)
                        .expect("peer_up: the store does not fail");
                } else {
                    node.replica.peer_down(now, peer);
                }
                self.after_input(i);
            }
        }
    }

    /// Forces a fresh connection from every running node to `i` (it restarted).
    fn reconnect_to(&mut self, i: usize) {
        for j in 0..self.n() {
            if j != i && self.up(j) && self.nodes[j].conn[i] {
                self.nodes[j].conn[i] = false;
                let now = self.now_of(j);
                self.nodes[j].replica.peer_down(now, PeerId(i as u64));
            }
        }
        for j in 0..self.n() {
            if j != i {
                self.sync_links(j);
            }
        }
    }

    fn set_blocked(&mut self, blocked: Vec<Vec<bool>>) {
        self.blocked = blocked;
        for i in 0..self.n() {
            self.sync_links(i);
        }
    }

    fn send(&mut self, from: usize, to: usize, msg: Message) {
        self.check_message(from, &msg);
        if self.blocked[from][to] || self.rng.random_range(0..100) < self.faults.drop_pct {
            self.counts.dropped += 1;
            return;
        }
        let copies = if self.rng.random_range(0..100) < self.faults.dup_pct {
            self.counts.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = self.rng.random_range(1..=10u64);
            if self.faults.delay_max_ms > 0 && self.rng.random_range(0..100) < 30 {
                delay += self.rng.random_range(0..=self.faults.delay_max_ms);
            }
            self.net_seq += 1;
            self.net.insert(
                (self.now + delay, self.net_seq),
                Packet {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
    }

    /// Drains node `i`'s outputs, acts on compaction, checks its invariants.
    fn after_input(&mut self, i: usize) {
        while let Some(t) = self.nodes[i].replica.poll_transmit() {
            self.send(i, t.to.0 as usize, t.msg);
        }
        // No correct peer ever shows a node more of its own id than it holds
        // (docs/design/principles.md, "Never reuse a dot" (c)): crashes, crash images and restores
        // from snapshots (new ids) must never look like a data dir copied back.
        let restored = self.nodes[i].replica.take_restored_copy();
        assert!(
            restored.is_none(),
            "seed {}: node {i} falsely detected as a restored copy: {restored:?}",
            self.seed
        );
        while let Some(e) = self.nodes[i].replica.poll_event() {
            self.mix(format!("{i}:{e:?}").as_bytes());
            if let ReplicaEvent::Compact { below } = e {
                // As the driver does: keep the last `log_retain` entries for peers briefly away
                // (and for stores restored from a snapshot of this one: their seed cursor).
                let (start, end) = self.nodes[i].store.log_bounds();
                let below = below.min(end.saturating_sub(self.log_retain));
                if below > start {
                    self.counts.compactions += 1;
                    self.nodes[i]
                        .store
                        .truncate_log(below)
                        .expect("compaction: the store does not fail");
                }
            }
        }
        self.check_node(i);
    }

    /// Invariants of node `i` after an input it completed.
    fn check_node(&mut self, i: usize) {
        let seed = self.seed;
        let n = self.n();
        let node = &mut self.nodes[i];
        // Immediate durability (invariants 6, 7): whatever an input committed was synced before
        // the input returned (before any ack or client acknowledgement left). (redb may still
        // write afterwards: its post-commit epilogue is a non-durable commit whose pages reach
        // the file later; crash images cover that.)
        let mark = durable_mark(&node.store, n);
        let syncs = node.backend.syncs();
        assert!(
            mark == node.last_mark || syncs > node.last_syncs,
            "seed {seed}: node {i}: an input committed without a sync"
        );
        node.last_mark = mark;
        node.last_syncs = syncs;
        assert!(
            node.last_ctx.is_subset(node.store.ctx()),
            "seed {seed}: node {i}: the context shrank"
        );
        assert!(
            node.store.ctx().own_dots_contiguous(node.id),
            "seed {seed}: node {i}: own dots are not contiguous"
        );
        if node.last_ctx != *node.store.ctx() {
            node.last_ctx = node.store.ctx().clone();
        }
        node.store
            .verify()
            .unwrap_or_else(|e| panic!("seed {seed}: node {i}: verify: {e}"));
        if node.backend.log_len() > CHECKPOINT_RECORDS && node.backend.checkpoint() {
            self.counts.checkpoints += 1;
        }
    }

    // ---- dots ----------------------------------------------------------------------------

    /// Records `dot` as issued for `(key, mutation)`; a dot is issued once, cluster-wide.
    fn issue(&mut self, dot: Dot, key: &Key, mutation: &Mutation) {
        let total = match (key.kind, mutation) {
            (KeyKind::GCounter | KeyKind::PNCounter, Mutation::Inc(by) | Mutation::Dec(by)) => {
                let t = self.totals.entry((dot.replica, key.clone())).or_default();
                match mutation {
                    Mutation::Inc(_) => t.0 = t.0.saturating_add(*by),
                    _ => t.1 = t.1.saturating_add(*by),
                }
                *t
            }
            _ => (0, 0),
        };
        let rec = Issued {
            key: key.clone(),
            mutation: mutation.clone(),
            total,
        };
        if let Some(old) = self.issued.get(&dot) {
            panic!(
                "seed {}: dot {dot:?} issued twice ({} content): first {old:?}, again {rec:?}",
                self.seed,
                if *old == rec { "same" } else { "different" }
            );
        }
        self.issued.insert(dot, rec);
        self.issued_ctx.insert(dot);
    }

    /// Every dot of `ctx` was issued by an acknowledged (or kept) commit.
    fn check_ctx(&self, ctx: &CausalContext, what: &str) {
        if !ctx.is_subset(&self.issued_ctx) {
            let stray: Vec<Dot> = ctx.diff(&self.issued_ctx).iter_dots().take(5).collect();
            panic!(
                "seed {}: {what}: holds dots no acknowledged or kept commit issued: {stray:?}",
                self.seed
            );
        }
        if !self.lost_ctx.is_empty() {
            let back = ctx.intersection(&self.lost_ctx);
            if !back.is_empty() {
                let back: Vec<Dot> = back.iter_dots().take(5).collect();
                panic!(
                    "seed {}: {what}: holds dots of ops a restore lost: {back:?}",
                    self.seed
                );
            }
        }
    }

    /// Every dot an entry holds stands for the op that issued it (same key, same element or
    /// value, the issuer's running counter total at that op).
    fn check_entry(&self, key: &Key, entry: &Entry, what: &str) {
        let seed = self.seed;
        let op = |d: &Dot| -> &Issued {
            let rec = self.issued.get(d).unwrap_or_else(|| {
                panic!(
                    "seed {seed}: {what}: {key} holds {d:?}, which no acknowledged commit issued"
                )
            });
            assert_eq!(
                &rec.key, key,
                "seed {seed}: {what}: {d:?} was issued for another key ({rec:?})"
            );
            rec
        };
        let mismatch = |d: &Dot, rec: &Issued, held: String| -> ! {
            panic!(
                "seed {seed}: {what}: {key} holds {d:?} as {held}, but it was issued for {rec:?}"
            )
        };
        match entry {
            Entry::GCounter(f) => {
                for (d, total) in f.iter() {
                    let rec = op(d);
                    if !matches!(rec.mutation, Mutation::Inc(_)) || rec.total != (*total, 0) {
                        mismatch(d, rec, format!("total {total}"));
                    }
                }
            }
            Entry::PNCounter(f) => {
                for (d, total) in f.iter() {
                    let rec = op(d);
                    if !matches!(rec.mutation, Mutation::Inc(_) | Mutation::Dec(_))
                        || rec.total != *total
                    {
                        mismatch(d, rec, format!("totals {total:?}"));
                    }
                }
            }
            Entry::ORSet(m) => {
                for (elem, dots) in m.iter() {
                    for d in dots.iter() {
                        let rec = op(d);
                        if rec.mutation != Mutation::Add(elem.clone()) {
                            mismatch(d, rec, format!("add {elem}"));
                        }
                    }
                }
            }
            Entry::Lww(f) => {
                for (d, (_, v)) in f.iter() {
                    let rec = op(d);
                    if rec.mutation != Mutation::Set(v.clone()) {
                        mismatch(d, rec, format!("set {v}"));
                    }
                }
            }
            Entry::MvReg(f) => {
                for (d, v) in f.iter() {
                    let rec = op(d);
                    if rec.mutation != Mutation::Set(v.clone()) {
                        mismatch(d, rec, format!("set {v}"));
                    }
                }
            }
        }
    }

    /// A message carries only dots of acknowledged (or kept) commits, with their content.
    fn check_message(&self, from: usize, msg: &Message) {
        let what = || format!("message {} from node {from}", msg.kind());
        match msg {
            Message::Delta { delta, .. } => {
                let w = what();
                self.check_ctx(delta.context(), &w);
                for (k, e) in delta.state.store.iter() {
                    self.check_entry(k, e, &w);
                }
            }
            Message::Chunk { chunk, .. } => {
                let w = what();
                self.check_ctx(&chunk.ctx, &w);
                for (k, e) in &chunk.entries {
                    self.check_entry(k, e, &w);
                }
            }
            Message::Have { ctx, .. } => self.check_ctx(ctx, &what()),
            _ => {}
        }
    }

    fn check_store(&self, i: usize, what: &str) {
        let store = &self.nodes[i].store;
        self.check_ctx(store.ctx(), what);
        for (k, e) in store.reader().entries().expect("read entries") {
            self.check_entry(&k, &e, what);
        }
    }

    // ---- client writes -------------------------------------------------------------------

    fn gen_op(&mut self) -> (Key, Mutation) {
        let key = key_of(self.rng.random_range(0..self.n_keys));
        self.serial += 1;
        let serial = self.serial;
        let rng = &mut self.rng;
        let m = match key.kind {
            KeyKind::GCounter => Mutation::Inc(rng.random_range(1..=5)),
            KeyKind::PNCounter => {
                if rng.random_bool(0.5) {
                    Mutation::Inc(rng.random_range(1..=5))
                } else {
                    Mutation::Dec(rng.random_range(1..=5))
                }
            }
            KeyKind::ORSet => {
                let e = format!("\"e{}\"", rng.random_range(0..4));
                match rng.random_range(0..100) {
                    0..55 => Mutation::Add(e),
                    55..90 => Mutation::Remove(e),
                    _ => Mutation::Delete,
                }
            }
            KeyKind::Lww | KeyKind::MvReg => {
                if rng.random_range(0..100) < 85 {
                    Mutation::Set(format!("\"v{serial}\""))
                } else {
                    Mutation::Delete
                }
            }
        };
        (key, m)
    }

    /// One commit group: 1–3 callers' writes of 1–3 ops; rarely an invalid counter delete.
    fn gen_writes(&mut self) -> (Vec<LocalWrite>, bool) {
        let callers = if self.rng.random_range(0..100) < 70 {
            1
        } else {
            self.rng.random_range(2..=3)
        };
        let mut invalid = false;
        let writes = (0..callers)
            .map(|_| {
                let len = if self.rng.random_range(0..100) < 75 {
                    1
                } else {
                    self.rng.random_range(2..=3)
                };
                let mut ops: Vec<(Key, Mutation)> = (0..len).map(|_| self.gen_op()).collect();
                if self.rng.random_range(0..100) == 0 {
                    // A counter delete is refused (nothing written); the group is not acknowledged.
                    let k = key_of(0);
                    ops.push((k, Mutation::Delete));
                    invalid = true;
                }
                LocalWrite {
                    ops,
                    event: None,
                    stamps: Vec::new(),
                    late: None,
                    own_dots: false,
                }
            })
            .collect();
        (writes, invalid)
    }

    /// Records an acknowledged (or kept) commit group: oracle, issued dots, acked max seq.
    fn record_commit(
        &mut self,
        i: usize,
        before: &CausalContext,
        writes: &[LocalWrite],
        log_seq: Option<u64>,
    ) {
        let seed = self.seed;
        let ops: Vec<(Key, Mutation)> = writes.iter().flat_map(|w| w.ops.clone()).collect();
        let node = &mut self.nodes[i];
        let me = node.id;
        let base = before.max_seq(me);
        assert_eq!(
            node.store.ctx().max_seq(me),
            base + ops.len() as u64,
            "seed {seed}: node {i}: a commit group must take the next contiguous dots"
        );
        // Exactly those dots, under the store's current id: never one of an earlier id (a
        // restored snapshot's source, this node before a restore).
        let gained = node.store.ctx().diff(before);
        assert!(
            gained == CausalContext::from_range(me, base + 1, base + ops.len() as u64)
                && !self.retired_ids.contains(&me)
                && node.store.replica() == me,
            "seed {seed}: node {i} ({me:?}): a commit took dots {:?} (retired ids {:?})",
            gained.iter_dots().take(8).collect::<Vec<_>>(),
            self.retired_ids
        );
        let log_seq = log_seq.expect("a non-empty group is logged");
        if node.store.log_bounds().1 > log_seq + 1 {
            self.counts.split_commits += 1;
        }
        let delta = node
            .store
            .log_interval(log_seq, None, usize::MAX)
            .expect("read the group's log entry")
            .delta
            .expect("the group's log entry");
        node.acked_max_seq = node.acked_max_seq.max(base + ops.len() as u64);
        self.oracle.record_batch(me, before, before, &ops, &delta);
        for (k, (key, m)) in ops.iter().enumerate() {
            self.issue(Dot::new(me, base + 1 + k as u64), key, m);
        }
        self.counts.ops_acked += ops.len() as u64;
        if self.restored_ids.contains(&me) {
            self.counts.restored_ops_acked += ops.len() as u64;
        }
        self.mix(&codec::encode("delta", &delta).expect("encodable"));
    }

    /// A client write on node `i`, acknowledged only after `commit_local` returned `Ok`.
    fn client_write(&mut self, i: usize) {
        let (writes, invalid) = self.gen_writes();
        if !self.up(i) {
            self.counts.writes_while_down += 1;
            return;
        }
        let seed = self.seed;
        let now = self.now_of(i);
        let before = self.nodes[i].store.ctx().clone();
        let log_before = self.nodes[i].backend.log_len();
        let syncs_before = self.nodes[i].backend.syncs();
        match self.nodes[i].store.commit_local(&writes, now.wall_ms) {
            Ok(commit) => {
                assert!(
                    !invalid,
                    "seed {seed}: node {i}: an invalid group committed"
                );
                // Acknowledged only once durable (Immediate durability).
                assert!(
                    self.nodes[i].backend.syncs() > syncs_before,
                    "seed {seed}: node {i}: commit_local returned without a sync"
                );
                self.log(|| format!("node {i} commit {writes:?}"));
                self.record_commit(i, &before, &writes, commit.log_seq);
                self.nodes[i].replica.handle_local_commit(now);
                self.after_input(i);
            }
            Err(StoreError::InvalidOp(_)) if invalid => {
                let node = &self.nodes[i];
                assert!(
                    node.store.halted().is_none(),
                    "seed {seed}: invalid op halted"
                );
                assert_eq!(node.store.ctx(), &before);
                assert_eq!(node.backend.log_len(), log_before);
                self.counts.ops_refused_invalid += 1;
            }
            Err(e) => panic!("seed {seed}: node {i}: commit_local failed: {e}"),
        }
    }

    // ---- crashes -------------------------------------------------------------------------

    /// Reopens node `i`'s store from a crash image on a fresh recording backend and checks it:
    /// it opens, keeps its replica id, moves to a higher epoch than the crashed process had,
    /// passes redb's integrity check and `verify`, and its own max seq is at least the highest
    /// it acknowledged (so no dot is issued twice).
    fn reopen(&self, i: usize, image: Vec<u8>, what: &str) -> (FaultBackend, RedbStore) {
        let seed = self.seed;
        let backend = FaultBackend::recording_from_image(image);
        let mut store = RedbStore::open_with_backend(backend.clone(), self.options.clone())
            .unwrap_or_else(|e| panic!("seed {seed}: {what}: reopen refused: {e}"));
        let node = &self.nodes[i];
        assert_eq!(
            store.replica(),
            node.id,
            "seed {seed}: {what}: the replica id changed"
        );
        assert!(
            store.epoch() > node.epoch,
            "seed {seed}: {what}: the epoch did not grow"
        );
        assert!(
            store
                .check_integrity()
                .unwrap_or_else(|e| panic!("seed {seed}: {what}: integrity check: {e}")),
            "seed {seed}: {what}: redb integrity check failed"
        );
        store
            .verify()
            .unwrap_or_else(|e| panic!("seed {seed}: {what}: verify after reopen: {e}"));
        assert!(
            store.ctx().max_seq(node.id) >= node.acked_max_seq,
            "seed {seed}: {what}: own max seq {} below the acknowledged {} (dot reuse ahead)",
            store.ctx().max_seq(node.id),
            node.acked_max_seq
        );
        (backend, store)
    }

    /// Crashes node `i` (idle, or inside a client commit or a remote join), reopens its store
    /// from a crash image of its backend and checks it; it restarts `down_ms` later.
    fn crash(&mut self, i: usize, down_ms: u64, mode: CrashMode, packet: Option<Packet>) {
        if !self.up(i) {
            return;
        }
        if mode == CrashMode::DuringDelivery && packet.is_none() {
            // Armed: the node crashes inside its next delta or chunk join.
            self.nodes[i].crash_armed = Some(down_ms);
            return;
        }
        self.nodes[i].crash_armed = None;
        let seed = self.seed;
        self.counts.crashes += 1;
        let n = self.n();
        let pre = snapshot(&self.nodes[i].store, n);
        let start = self.nodes[i].backend.log_len();
        // The input the node dies in; its outputs never leave the process.
        let mut in_write: Option<(Vec<LocalWrite>, Option<u64>)> = None;
        if let Some(p) = packet {
            let now = self.now_of(i);
            let node = &mut self.nodes[i];
            node.replica
                .handle_message(now, PeerId(p.from as u64), p.msg, &mut node.store)
                .expect("handle_message: the store does not fail");
        }
        if mode == CrashMode::DuringTick {
            let now = self.now_of(i);
            let node = &mut self.nodes[i];
            node.replica
                .handle_timeout(now, &mut node.store)
                .expect("handle_timeout: the store does not fail");
            let mut below = node.replica.compaction_due();
            while let Some(e) = node.replica.poll_event() {
                if let ReplicaEvent::Compact { below: b } = e {
                    below = Some(b);
                }
            }
            if let Some(b) = below {
                self.counts.crash_during_compaction += 1;
                node.store
                    .truncate_log(b)
                    .expect("compaction: the store does not fail");
            }
        }
        if mode == CrashMode::DuringWrite {
            let (writes, invalid) = self.gen_writes();
            if !invalid {
                let wall = self.now_of(i).wall_ms;
                let c = self.nodes[i]
                    .store
                    .commit_local(&writes, wall)
                    .unwrap_or_else(|e| panic!("seed {seed}: node {i}: commit_local: {e}"));
                in_write = Some((writes, c.log_seq));
            }
        }
        match mode {
            CrashMode::Idle => self.counts.crash_idle += 1,
            CrashMode::DuringWrite => self.counts.crash_during_write += 1,
            CrashMode::DuringDelivery => self.counts.crash_during_delivery += 1,
            CrashMode::DuringTick => self.counts.crash_during_tick += 1,
        }
        let end = self.nodes[i].backend.log_len();
        let post = (end > start).then(|| snapshot(&self.nodes[i].store, n));
        let log = self.nodes[i].backend.log();
        // Cut inside the input, often right before one of its syncs (the widest window of
        // unsynced writes).
        let syncs: Vec<usize> = (start..end).filter(|k| log[*k] == Rec::Sync).collect();
        let upto = match self.rng.random_range(0..10) {
            0..5 if !syncs.is_empty() => syncs[self.rng.random_range(0..syncs.len())],
            5 => end,
            _ => self.rng.random_range(start..=end),
        };
        let kind = pick_image(&mut self.rng);
        *self.counts.images.entry(image_name(kind)).or_default() += 1;
        let image = crash_image(&log, upto, kind, &mut self.rng);
        // No sync of this input is inside the cut: whatever of it the image holds was unsynced.
        let cut_before_sync = durable_prefix(&log, upto) <= start;
        drop(log);
        let what = format!(
            "node {i} crash {mode:?}, image {kind:?} cut at record {upto} of [{start}, {end}]"
        );
        self.log(|| what.clone());
        // Inputs not yet processed are lost with the process.
        self.net.retain(|_, p| p.to != i);
        let (mut backend, mut store) = self.reopen(i, image, &what);
        let got = snapshot(&store, n);
        let changed = post.as_ref().is_some_and(|p| *p != pre);
        let kept = if got == pre {
            false
        } else if post.as_ref().is_some_and(|p| *p == got) {
            true
        } else {
            let lost: Vec<Dot> = pre.ctx.diff(&got.ctx).iter_dots().take(5).collect();
            panic!(
                "seed {seed}: {what}: the reopened store is neither the state before the input \
                 nor the one after it; acknowledged dots missing: {lost:?}\nreopened {got:?}\n\
                 before {pre:?}\nafter {post:?}"
            )
        };
        if changed {
            if kept && cut_before_sync {
                self.counts.recovered_unsynced += 1;
            }
            match (mode, kept) {
                (CrashMode::DuringWrite, true) => self.counts.maybe_kept += 1,
                (CrashMode::DuringWrite, false) => self.counts.maybe_lost += 1,
                (CrashMode::DuringDelivery, true) => self.counts.join_kept += 1,
                (CrashMode::DuringDelivery, false) => self.counts.join_lost += 1,
                (_, true) => self.counts.compaction_kept += 1,
                (_, false) => self.counts.compaction_lost += 1,
            }
        }
        // Sometimes the node crashes again while it recovers (redb's repair, the open's epoch
        // commit): that image must open to the same state.
        if self.rng.random_range(0..100) < 15 {
            self.counts.crash_during_recovery += 1;
            let log = backend.log();
            // After the records that rebuild the image the recovery started from.
            let upto = self.rng.random_range(3..=log.len());
            let kind = pick_image(&mut self.rng);
            let image = crash_image(&log, upto, kind, &mut self.rng);
            drop(log);
            drop(store);
            let again = format!("{what}, then crash during recovery: {kind:?} at {upto}");
            self.log(|| again.clone());
            (backend, store) = self.reopen(i, image, &again);
            let state = snapshot(&store, n);
            assert!(
                state == got,
                "seed {seed}: {again}: the state differs from the first recovery's\n{state:?}\n{got:?}"
            );
        }
        // The old process is gone; the reopened store replaces it, with a new replica of the
        // store's new epoch over the same peers.
        let epoch = store.epoch();
        let peers = (0..n).filter(|j| *j != i).map(|j| PeerId(j as u64));
        let replica = Replica::new(self.cfg.clone(), epoch, self.rng.random(), peers);
        let node = &mut self.nodes[i];
        let old = std::mem::replace(&mut node.replica, replica);
        node.past_stats.push(old.stats().clone());
        node.last_mark = durable_mark(&store, n);
        node.last_syncs = backend.syncs();
        node.store = store;
        node.backend = backend;
        node.epoch = epoch;
        node.state = NodeState::Down {
            restart_at: self.now + down_ms,
        };
        node.conn = vec![false; n];
        // An unacknowledged commit the image kept is now part of the store (it will be sent):
        // from here on it counts like an acknowledged one.
        if let (Some((writes, log_seq)), true) = (in_write, kept) {
            self.record_commit(i, &pre.ctx, &writes, log_seq);
        }
        self.check_store(i, &format!("node {i} after {what}"));
        self.mix(format!("crash {i} {kept} {upto}").as_bytes());
        for j in 0..n {
            if j != i {
                self.sync_links(j);
            }
        }
    }

    fn restart(&mut self, i: usize) {
        self.log(|| format!("node {i} restarts (epoch {})", self.nodes[i].epoch));
        let n = self.n();
        let node = &mut self.nodes[i];
        node.state = NodeState::Up;
        node.conn = vec![false; n];
        self.sync_links(i);
        self.reconnect_to(i);
    }

    // ---- snapshots and restores ------------------------------------------------------------

    /// A fresh path under the simulation's temporary directory.
    fn file(&mut self, what: &str) -> PathBuf {
        self.files_made += 1;
        self.files
            .path()
            .join(format!("{what}-{}", self.files_made))
    }

    /// Takes a snapshot of node `s`'s committed state (running or down) and keeps it; returns
    /// its index. The header must describe the store exactly.
    fn take_snapshot(&mut self, s: usize) -> usize {
        let seed = self.seed;
        let path = self.file("snapshot");
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
        self.counts.snapshots += 1;
        self.log(|| format!("snapshot of node {s}: {:?}", info.context));
        self.mix(format!("snapshot {s} {}", info.source_log_end).as_bytes());
        self.backups.push(Backup {
            path,
            info,
            node: s,
            entries,
            restored: 0,
        });
        if self.backups.len() > 3 {
            self.backups.remove(0);
        }
        self.backups.len() - 1
    }

    /// Node `i` loses its disk (and its process) and is restored from backup `b` under a new
    /// replica id; it restarts `down_ms` later.
    ///
    /// What the cluster still holds decides what survives, exactly: an acknowledged op survives
    /// iff its dot is in the restored snapshot's context or in a remaining store's committed
    /// context (in-flight messages from `i` are dropped: a legal loss). Nothing else holds
    /// state: queued inputs die with the process, and the transfers other nodes buffer from
    /// `i` are dropped when its connection goes down, before they complete. The other ops are
    /// removed from the oracle (they stay in the dot map: one reissued with other content is
    /// still caught) and their dots must never be seen again.
    fn restore(&mut self, i: usize, down_ms: u64, b: usize) {
        let seed = self.seed;
        let n = self.n();
        let old = self.nodes[i].id;
        self.counts.restores += 1;
        self.nodes[i].crash_armed = None;
        // The process dies with its disk: what was queued for it and what it sent is gone.
        self.net.retain(|_, p| p.to != i && p.from != i);
        let (src_path, info, source_node) = {
            let bk = &self.backups[b];
            (bk.path.clone(), bk.info.clone(), bk.node)
        };
        let source = info.source_replica;
        let limits = self.options.limits.clone();
        if self.counts.restore_source_id_refused == 0 {
            // Restoring under the source's id is refused and leaves nothing behind.
            let dir = self.file("refused");
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
            if !self.used_ids.contains(&id) {
                break id;
            }
        };
        let dir = self.file("restored");
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
            me == id && me != source && !self.used_ids.contains(&me),
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
            store.reader().entries().expect("read entries") == self.backups[b].entries,
            "seed {seed}: {what}: the restored entries differ from the source's at the snapshot"
        );
        assert!(
            store.check_integrity().expect("integrity check runs"),
            "seed {seed}: {what}: redb integrity check failed"
        );
        store
            .verify()
            .unwrap_or_else(|e| panic!("seed {seed}: {what}: verify: {e}"));
        self.used_ids.insert(me);
        self.retired_ids.insert(old);
        self.restored_ids.insert(me);
        if source_node == i {
            self.counts.restored_from_own += 1;
        } else {
            self.counts.restored_from_other += 1;
        }
        self.seeded.retain(|(r, s, _, _)| *r != i && *s != i);
        if let Some(s) = (0..n).find(|j| *j != i && self.nodes[*j].id == source) {
            self.counts.restored_source_live += 1;
            self.seeded.push((i, s, source, info.source_log_end));
        }
        self.backups[b].restored += 1;
        if self.backups[b].restored == 2 {
            self.counts.restored_twice += 1;
        }
        // What survives: the restored state and every other node's committed state.
        let states: Vec<(CausalContext, CausalContext)> = std::iter::once(&store)
            .chain((0..n).filter(|j| *j != i).map(|j| &self.nodes[j].store))
            .map(|st| {
                let mut live = CausalContext::new();
                for (_, e) in st.reader().entries().expect("read entries") {
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
            self.lost_ctx.insert(*d);
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
        node.acked_max_seq = 0;
        node.last_ctx = store.ctx().clone();
        node.last_mark = durable_mark(&store, n);
        node.last_syncs = backend.syncs();
        node.store = store;
        node.backend = backend;
        node.epoch = epoch;
        node.state = NodeState::Down {
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
    fn restore_action(
        &mut self,
        node: usize,
        down_ms: u64,
        pick: Option<usize>,
        fresh_from: usize,
        also: Option<usize>,
    ) {
        let b = match pick {
            Some(k) if !self.backups.is_empty() => k % self.backups.len(),
            _ => self.take_snapshot(fresh_from),
        };
        self.restore(node, down_ms, b);
        if let Some(k) = also.filter(|k| *k != node) {
            self.restore(k, down_ms, b);
        }
        let kept = self.backups.swap_remove(b);
        for other in self.backups.drain(..) {
            let _ = std::fs::remove_file(other.path);
        }
        self.backups.push(kept);
    }

    /// Restarts crashed nodes, lifts partitions and network faults, disarms crashes.
    fn heal(&mut self) {
        for node in &mut self.nodes {
            node.crash_armed = None;
        }
        self.faults = Faults::default();
        let n = self.n();
        self.set_blocked(vec![vec![false; n]; n]);
        for i in 0..n {
            if !self.up(i) {
                self.restart(i);
            }
        }
    }

    // ---- event loop ----------------------------------------------------------------------

    /// The time of the next internal event (packet, timer, restart).
    fn next_internal(&self) -> Option<u64> {
        let mut t = self.net.keys().next().map(|k| k.0);
        for node in &self.nodes {
            let c = match node.state {
                NodeState::Up => node.replica.poll_timeout(),
                NodeState::Down { restart_at } => Some(restart_at),
            };
            t = match (t, c) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        t
    }

    /// Processes one internal event due at or before `until`; false when none is.
    fn step(&mut self, until: u64) -> bool {
        let Some(t) = self.next_internal() else {
            return false;
        };
        if t > until {
            return false;
        }
        self.now = self.now.max(t);
        for i in 0..self.n() {
            if let NodeState::Down { restart_at } = self.nodes[i].state {
                if restart_at <= self.now {
                    self.restart(i);
                    return true;
                }
            }
        }
        if let Some((&key, _)) = self.net.iter().next().filter(|(k, _)| k.0 <= self.now) {
            let p = self.net.remove(&key).expect("present");
            self.deliver(p);
            return true;
        }
        for i in 0..self.n() {
            if self.up(i)
                && self.nodes[i]
                    .replica
                    .poll_timeout()
                    .is_some_and(|d| d <= self.now)
            {
                let now = self.now_of(i);
                let node = &mut self.nodes[i];
                node.replica
                    .handle_timeout(now, &mut node.store)
                    .expect("handle_timeout: the store does not fail");
                self.after_input(i);
                return true;
            }
        }
        unreachable!("an event was due at {t} but none was processed")
    }

    fn deliver(&mut self, p: Packet) {
        if !self.up(p.to) || self.blocked[p.from][p.to] {
            self.counts.dropped += 1;
            return;
        }
        if let (Some(down_ms), Message::Delta { .. } | Message::Chunk { .. }) =
            (self.nodes[p.to].crash_armed, &p.msg)
        {
            self.counts.delivered += 1;
            let to = p.to;
            self.crash(to, down_ms, CrashMode::DuringDelivery, Some(p));
            return;
        }
        self.counts.delivered += 1;
        if let Message::Delta { log, from, .. } = &p.msg {
            let hit = (p.to, p.from, *log, *from);
            if self.seeded.contains(&hit) {
                // The source serves the restored store from the seed end: no transfer to it.
                self.counts.restore_seeded_by_deltas += 1;
                self.seeded.retain(|x| *x != hit);
            }
        }
        let bytes = codec::encode("message", &p.msg).expect("encodable");
        self.mix(&(p.from as u64 * 31 + p.to as u64).to_le_bytes());
        self.mix(&self.now.to_le_bytes());
        self.mix(&bytes);
        let now = self.now_of(p.to);
        let node = &mut self.nodes[p.to];
        node.replica
            .handle_message(now, PeerId(p.from as u64), p.msg, &mut node.store)
            .expect("handle_message: the store does not fail");
        self.after_input(p.to);
    }

    /// Runs internal events up to `until` (inclusive) and sets the clock there.
    fn run_until(&mut self, until: u64) {
        while self.step(until) {}
        self.now = self.now.max(until);
    }

    /// Every node runs and every store holds the same entries and context.
    fn converged(&self) -> bool {
        let first = self.nodes[0].store.ctx();
        if !self
            .nodes
            .iter()
            .all(|n| n.state == NodeState::Up && n.store.ctx() == first)
        {
            return false;
        }
        let entries = self.nodes[0].store.reader().entries().expect("entries");
        self.nodes[1..]
            .iter()
            .all(|n| n.store.reader().entries().expect("entries") == entries)
    }

    fn collect_stats(&mut self) {
        let mut all: Vec<ReplicaStats> = Vec::new();
        for n in &self.nodes {
            all.extend(n.past_stats.iter().cloned());
            all.push(n.replica.stats().clone());
        }
        for s in all {
            let c = &mut self.counts;
            c.transfers += s.transfers_started;
            c.transfers_behind_log += s.transfers_behind_log;
            c.transfers_received += s.transfers_received;
            c.later_chunks += s.chunks_applied.saturating_sub(s.transfers_received);
            c.duplicates += s.duplicate_intervals;
            c.gaps += s.gap_intervals;
            c.stale_acks += s.acks_stale_epoch;
            c.retransmits += s.retransmits;
            c.evictions += s.evictions;
            c.filtered += s.intervals_filtered;
            c.stale_chunks += s.stale_chunks;
            c.rejected += s.rejected;
            c.hlc_rejected += s.hlc_rejected;
        }
    }
}

// ---- schedule ----------------------------------------------------------------------------

/// A partition shape as `blocked[from][to]`.
fn partition(rng: &mut ChaCha8Rng, n: usize) -> Vec<Vec<bool>> {
    let mut b = vec![vec![false; n]; n];
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    match rng.random_range(0..3) {
        0 => {
            // Halves (one node against the rest, or two against two).
            let k = rng.random_range(1..=n / 2);
            for &x in &order[..k] {
                for &y in &order[k..] {
                    b[x][y] = true;
                    b[y][x] = true;
                }
            }
        }
        1 => {
            // One link cut both ways.
            let (x, y) = (order[0], order[1]);
            b[x][y] = true;
            b[y][x] = true;
        }
        _ => {
            // One-way: one node cannot send to anyone (it still receives).
            let x = order[0];
            for (y, cell) in b[x].iter_mut().enumerate() {
                *cell = y != x;
            }
        }
    }
    b
}

fn schedule(rng: &mut ChaCha8Rng, n: usize) -> Vec<(u64, Action)> {
    let mut actions = Vec::new();
    for _ in 0..rng.random_range(200..=700) {
        let t = rng.random_range(0..FAULT_WINDOW_MS);
        actions.push((t, Action::Write(rng.random_range(0..n))));
    }
    let mut t = 0;
    while t < FAULT_WINDOW_MS {
        let faults = if rng.random_bool(0.6) {
            Faults {
                drop_pct: rng.random_range(0..=20),
                dup_pct: rng.random_range(0..=10),
                delay_max_ms: rng.random_range(0..=2_000),
            }
        } else {
            Faults::default()
        };
        actions.push((t, Action::Faults(faults)));
        let blocked = if rng.random_bool(0.4) {
            partition(rng, n)
        } else {
            vec![vec![false; n]; n]
        };
        actions.push((t, Action::Partition(blocked)));
        t += rng.random_range(1_000..=6_000);
    }
    for _ in 0..rng.random_range(4..=12) {
        let at = rng.random_range(0..FAULT_WINDOW_MS);
        let down_ms = if rng.random_range(0..10) == 0 {
            // Long enough to be evicted by its peers (they compact past it).
            rng.random_range(11_000..=20_000)
        } else {
            rng.random_range(50..=5_000)
        };
        let mode = match rng.random_range(0..20) {
            0..3 => CrashMode::Idle,
            3..9 => CrashMode::DuringWrite,
            9..15 => CrashMode::DuringDelivery,
            _ => CrashMode::DuringTick,
        };
        actions.push((
            at,
            Action::Crash {
                node: rng.random_range(0..n),
                down_ms,
                mode,
            },
        ));
    }
    // Stable: actions at one time keep their order.
    actions.sort_by_key(|(t, _)| *t);
    actions
}

/// Snapshots and restores (0–2 restores a seed, some restoring two nodes from one snapshot).
fn restore_schedule(seed: u64, n: usize) -> Vec<(u64, Action)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7e57_0de5_0f5a_f00d);
    let mut actions = Vec::new();
    for _ in 0..rng.random_range(0..=3) {
        let t = rng.random_range(0..FAULT_WINDOW_MS - 10_000);
        actions.push((t, Action::Snapshot(rng.random_range(0..n))));
    }
    let restores = match rng.random_range(0..10) {
        0..3 => 0,
        3..8 => 1,
        _ => 2,
    };
    for _ in 0..restores {
        let t = rng.random_range(5_000..FAULT_WINDOW_MS - 10_000);
        let node = rng.random_range(0..n);
        actions.push((
            t,
            Action::Restore {
                node,
                down_ms: rng.random_range(50..=3_000),
                pick: rng.random_bool(0.5).then(|| rng.random_range(0..3)),
                fresh_from: rng.random_range(0..n),
                also: rng
                    .random_bool(0.35)
                    .then(|| (node + rng.random_range(1..n)) % n),
            },
        ));
    }
    actions
}

// ---- one seed ----------------------------------------------------------------------------

struct SeedResult {
    counts: Counts,
    trace: u64,
    converge_ms: u64,
}

fn run_seed(seed: u64, verbose: bool, shape: Shape) -> SeedResult {
    let mut sim = Sim::new(seed, verbose, shape);
    let n = sim.n();
    let mut actions = schedule(&mut sim.rng, n);
    // Snapshots and restores come from their own generator: the rest of the schedule is the
    // same as without them.
    actions.extend(restore_schedule(seed, n));
    actions.sort_by_key(|(t, _)| *t);
    if verbose {
        println!(
            "seed {seed}: {n} nodes, {} keys, config {:?}",
            sim.n_keys, sim.cfg
        );
    }
    for (at, action) in actions {
        sim.run_until(at);
        match action {
            Action::Write(i) => sim.client_write(i),
            Action::Faults(f) => {
                sim.log(|| format!("{f:?}"));
                sim.faults = f;
            }
            Action::Partition(b) => {
                if b.iter().flatten().any(|x| *x) {
                    sim.counts.partitions += 1;
                }
                sim.log(|| format!("partition {b:?}"));
                sim.set_blocked(b);
            }
            Action::Crash {
                node,
                down_ms,
                mode,
            } => sim.crash(node, down_ms, mode, None),
            Action::Snapshot(s) => {
                sim.take_snapshot(s);
            }
            Action::Restore {
                node,
                down_ms,
                pick,
                fresh_from,
                also,
            } => sim.restore_action(node, down_ms, pick, fresh_from, also),
        }
    }
    sim.run_until(FAULT_WINDOW_MS);
    // Heal, stop writes, converge.
    sim.heal();
    let heal = sim.now;
    let deadline = heal + CONVERGE_MS;
    let converged = loop {
        if sim.converged() {
            break Some(sim.now);
        }
        if sim.now >= deadline {
            break None;
        }
        let next = (sim.now + 100).min(deadline);
        sim.run_until(next);
    };
    sim.collect_stats();
    if verbose {
        println!("counts: {:?}", sim.counts);
        for (i, node) in sim.nodes.iter().enumerate() {
            println!(
                "node {i}: {:?} epoch {} log {:?} ctx {:?} stats {:?}",
                node.state,
                node.epoch,
                node.store.log_bounds(),
                node.store.ctx(),
                node.replica.stats()
            );
        }
    }
    let Some(at) = converged else {
        for (i, node) in sim.nodes.iter().enumerate() {
            eprintln!(
                "node {i}: {:?} log {:?} ctx {:?} acked {:?}",
                node.state,
                node.store.log_bounds(),
                node.store.ctx(),
                (0..n)
                    .map(|j| node.replica.peer_acked(PeerId(j as u64)))
                    .collect::<Vec<_>>()
            );
        }
        panic!("seed {seed}: not converged within {CONVERGE_MS} ms of the heal");
    };
    // Every store: consistent, no acknowledged dot lost, only issued dots with their content.
    for i in 0..n {
        let node = &mut sim.nodes[i];
        node.store
            .verify()
            .unwrap_or_else(|e| panic!("seed {seed}: node {i}: final verify: {e}"));
        assert!(
            node.store.check_integrity().expect("integrity check runs"),
            "seed {seed}: node {i}: final integrity check failed"
        );
        for (j, other) in sim.nodes.iter().enumerate() {
            assert!(
                sim.nodes[i].store.ctx().max_seq(other.id) >= other.acked_max_seq,
                "seed {seed}: node {i} lacks acknowledged dots of node {j}"
            );
        }
        // Every acknowledged (or kept) op no restore lost is held, under any id.
        let missing = sim
            .issued_ctx
            .diff(&sim.lost_ctx)
            .diff(sim.nodes[i].store.ctx());
        assert!(
            missing.is_empty(),
            "seed {seed}: node {i} lacks surviving acknowledged dots {:?}",
            missing.iter_dots().take(8).collect::<Vec<_>>()
        );
        sim.check_store(i, &format!("node {i} after convergence"));
        // The converged state is durable.
        let log = sim.nodes[i].backend.log();
        let image = crash_image(&log, log.len(), ImageKind::DurableOnly, &mut sim.rng);
        let what = format!("node {i}: durable image after convergence");
        let (_, store) = sim.reopen(i, image, &what);
        assert!(
            snapshot(&store, n) == snapshot(&sim.nodes[i].store, n),
            "seed {seed}: {what}: differs from the live store"
        );
    }
    // Equal to the oracle over the acknowledged (and kept) ops.
    let entries: BTreeMap<Key, Entry> = sim.nodes[0]
        .store
        .reader()
        .entries()
        .expect("entries")
        .into_iter()
        .collect();
    let mut keys = sim.oracle.keys();
    keys.extend(entries.keys().cloned());
    for key in keys {
        let expected = sim.oracle.expected(&key);
        let actual = entries
            .get(&key)
            .map_or_else(|| tidemark_crdts::Value::empty(key.kind), Entry::value);
        if actual != expected {
            eprintln!(
                "seed {seed}: key {key}: stored entry {:?}",
                entries.get(&key)
            );
            for op in sim.oracle.ops.iter().filter(|o| o.key == key) {
                eprintln!("  op {:?} {:?} ts={:?}", op.dot, op.mutation, op.ts);
            }
        }
        let what = match key.kind {
            KeyKind::GCounter | KeyKind::PNCounter => {
                "the counter differs from the sum of the acknowledged ops"
            }
            KeyKind::ORSet => {
                "the set differs from the acknowledged adds no acknowledged remove/delete observed"
            }
            KeyKind::Lww | KeyKind::MvReg => "the register differs from the oracle",
        };
        assert_eq!(actual, expected, "seed {seed}: key {key}: {what}");
    }
    SeedResult {
        counts: sim.counts.clone(),
        trace: sim.trace,
        converge_ms: at - heal,
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn coverage(c: &Counts) -> Vec<(&'static str, u64, bool)> {
    // (case, count, asserted to occur)
    vec![
        ("crash-restart", c.crashes, true),
        ("  idle", c.crash_idle, true),
        ("  inside a client commit", c.crash_during_write, true),
        ("  inside a remote join", c.crash_during_delivery, true),
        ("  inside a timer tick", c.crash_during_tick, true),
        (
            "    of which: with a log compaction",
            c.crash_during_compaction,
            true,
        ),
        ("crash again during recovery", c.crash_during_recovery, true),
        (
            "crash image recovered unsynced writes",
            c.recovered_unsynced,
            true,
        ),
        ("unacknowledged client commit kept", c.maybe_kept, true),
        ("unacknowledged client commit lost", c.maybe_lost, true),
        ("unacknowledged remote join kept", c.join_kept, true),
        ("unacknowledged remote join lost", c.join_lost, true),
        ("compaction in flight kept", c.compaction_kept, true),
        ("compaction in flight lost", c.compaction_lost, true),
        ("state transfer", c.transfers, true),
        (
            "  cursor behind the compacted log",
            c.transfers_behind_log,
            false,
        ),
        ("transfer chunk after the first", c.later_chunks, true),
        ("duplicate interval (from < cursor)", c.duplicates, true),
        ("delta before its predecessor (gap)", c.gaps, false),
        ("stale-epoch ack dropped", c.stale_acks, false),
        (
            "duplicate chunk of a completed transfer",
            c.stale_chunks,
            false,
        ),
        ("log compacted", c.compactions, true),
        (
            "commit group logged in several records",
            c.split_commits,
            true,
        ),
        ("peer evicted for silence", c.evictions, false),
        (
            "interval filtered by the receiver's context",
            c.filtered,
            false,
        ),
        ("message duplicated", c.duplicated, true),
        ("partition", c.partitions, true),
        ("invalid write refused", c.ops_refused_invalid, false),
        (
            "remote LWW timestamp beyond the clock drift",
            c.hlc_rejected,
            false,
        ),
        ("backend log checkpoint", c.checkpoints, false),
        ("snapshot taken", c.snapshots, true),
        ("restore from a snapshot (new replica id)", c.restores, true),
        ("  of the node's own snapshot", c.restored_from_own, true),
        ("  of another node's snapshot", c.restored_from_other, true),
        (
            "  whose source still runs under its id",
            c.restored_source_live,
            true,
        ),
        ("  a second store from one snapshot", c.restored_twice, true),
        (
            "  lost acknowledged ops (no copy left)",
            c.restore_lost_writes,
            true,
        ),
        (
            "  lost a retirement of a surviving op",
            c.restore_lost_retirements,
            false,
        ),
        (
            "  refused under the source's id",
            c.restore_source_id_refused,
            true,
        ),
        (
            "  caught up from its source's log (seed cursor)",
            c.restore_seeded_by_deltas,
            true,
        ),
        (
            "op acknowledged by a restored replica",
            c.restored_ops_acked,
            true,
        ),
    ]
}

#[test]
fn redb_cluster_simulation_converges_to_the_oracle() {
    if let Some(seed) = env_u64("SEED") {
        println!("sim_redb: SEED={seed}");
        let r = run_seed(seed, true, Shape::default());
        println!(
            "seed {seed}: trace {:016x}, converged {} ms after the heal, {:?}",
            r.trace, r.converge_ms, r.counts
        );
        return;
    }
    let seeds = env_u64("SEEDS").unwrap_or(60) * if common::soak() { 20 } else { 1 };
    println!("sim_redb: seeds 1..={seeds} (replay one with SEED=<n>)");
    let started = Instant::now();
    let results = common::run_seeds(seeds, 4, |seed| run_seed(seed, false, Shape::default()));
    // Determinism: the first seeds replay with identical trace hashes.
    for (seed, r) in results.iter().take(2) {
        let again = run_seed(*seed, false, Shape::default());
        assert_eq!(
            r.trace, again.trace,
            "seed {seed}: trace hash differs between two runs"
        );
    }
    let mut total = Counts::default();
    let mut seeds_with: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut slowest = 0;
    for (_, r) in &results {
        total.add(&r.counts);
        slowest = slowest.max(r.converge_ms);
        for (name, v, _) in coverage(&r.counts) {
            *seeds_with.entry(name).or_default() += u64::from(v > 0);
        }
    }
    println!(
        "sim_redb: {seeds} seeds in {:.1?}; slowest convergence {slowest} ms after the heal",
        started.elapsed()
    );
    println!("{:<48} {:>8} {:>6}", "case", "count", "seeds");
    for (name, v, _) in coverage(&total) {
        println!("{name:<48} {v:>8} {:>6}", seeds_with[name]);
    }
    println!("crash images: {:?}", total.images);
    println!(
        "ops acknowledged {}, writes while down {}, delivered {}, dropped {}, retransmits {}",
        total.ops_acked, total.writes_while_down, total.delivered, total.dropped, total.retransmits
    );
    // Seeds are 1..=n, so every case the default 60 seeds hit also occurs in larger runs.
    if seeds >= 60 {
        for (name, v, asserted) in coverage(&total) {
            if asserted {
                assert!(v > 0, "case `{name}` never occurred in {seeds} seeds");
            }
        }
    }
}

/// Two nodes that keep 64 log entries, restores included: a store restored from a snapshot of
/// the other (running) node must converge with it.
///
/// Found by this simulation (seeds 5, 67 and 174 of 1..=200 failed; all converged with
/// `back_propagation_avoidance` off): the source served the restored store from its seed
/// cursor by deltas, and back-propagation avoidance left out of them every log record tagged
/// with the same peer id — records that came from the restored node's previous replica. Its
/// writes the source joined after the snapshot never reached the restored store, which the
/// source then counted as caught up; with no third node to bring them, the two stores never
/// converged. Fixed in the replication core: BP holds back only entries logged after the peer's
/// current replica id first said Hello (`Peer::bp_from`). Replay: `SEED=5 cargo test --test
/// sim_redb two_nodes`.
#[test]
fn two_nodes_restored_from_each_others_snapshots_converge() {
    let shape = Shape {
        nodes: Some(2),
        log_retain: Some(64),
    };
    if let Some(seed) = env_u64("SEED") {
        let r = run_seed(seed, true, shape);
        println!("seed {seed}: {:?}", r.counts);
        return;
    }
    let seeds = env_u64("SEEDS").unwrap_or(60);
    let results = common::run_seeds(seeds, 4, |seed| run_seed(seed, false, shape));
    // Not vacuous: restores happen, and restored stores catch up from their source by deltas.
    let mut total = Counts::default();
    for (_, r) in &results {
        total.add(&r.counts);
    }
    assert!(total.restores > 0, "no restore in {seeds} seeds");
    assert!(
        total.restore_seeded_by_deltas > 0,
        "no restored store caught up by deltas in {seeds} seeds"
    );
}
