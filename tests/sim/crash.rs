//! Crashes, restarts, pauses and wipes.
//!
//! A crash loses the node's volatile state (its `Replica`, the inputs queued for it) and reopens
//! its store from an image of its backend. After each reopen: it opens, passes `check_integrity`
//! and `verify`, keeps its replica id, runs under a higher epoch than the crashed process had,
//! its own max seq is at least the highest it acknowledged, and its committed state
//! ([`Committed`]: entries, context, log bounds and retained log, compacted context, cursors,
//! HLC mark) is exactly one the crashed store served.
//!
//! * Memory backend: the node crashes between inputs and reopens from everything it wrote
//!   (each commit is synced): exactly the state it served.
//! * Recording backend: the node crashes idle or inside a client commit, a remote delta/chunk
//!   join, or a timer tick with its log compaction ([`CrashMode`]); the image is cut anywhere
//!   inside that input (often right before one of its syncs) in one of the [`ImageKind`]s
//!   ("durable only", "durable + a random subset of the unsynced writes", torn last write,
//!   header without the file extension, everything written), and sometimes the node crashes
//!   again while it recovers. The reopened state is the one before the input or the one after
//!   it: nothing acknowledged is lost, the commit in flight is all or nothing (one kept counts
//!   as acknowledged from then on).

use super::Backend;
use super::harness::{self, NodeState, Packet, Sim, durable_mark, new_store};
use crate::common::{FaultBackend, ImageKind, Rec, crash_image, durable_prefix};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tidemark::proto::{LogInterval, PeerId, Replica, ReplicaEvent, StateStore};
use tidemark::store::{LocalWrite, RedbStore};
use tidemark_crdts::{CausalContext, Dot, Entry, Key, ReplicaId};

/// Where in its work a node crashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Between inputs: everything it did is durable.
    Idle,
    /// Inside a client commit (never acknowledged).
    DuringWrite,
    /// Inside the join of the next delta or chunk queued for it (never acknowledged).
    DuringDelivery,
    /// Inside a timer tick and the log compaction it allows.
    DuringTick,
}

/// What a crash image kept of the input the node crashed in.
pub struct Kept {
    /// The input's changes survived.
    kept: bool,
    /// The backend record the image was cut at.
    upto: usize,
    /// The client commit in flight, when it survived.
    commit: Option<(Vec<LocalWrite>, Option<u64>)>,
}

/// What a store has committed: entries, context, log bounds, the retained log, compacted
/// context, cursors and the HLC mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    entries: Vec<(Key, Entry)>,
    ctx: CausalContext,
    log: (u64, u64),
    retained: Option<LogInterval>,
    truncated: CausalContext,
    cursors: Vec<Option<(ReplicaId, u64)>>,
    hlc: (u64, u32),
}

/// What `store` has committed (cursors of `n` peers).
pub fn committed(store: &mut RedbStore, n: usize) -> Committed {
    let log = store.log_bounds();
    Committed {
        entries: store.reader().entries().expect("read entries"),
        ctx: store.ctx().clone(),
        log,
        retained: store.log_interval(log.0, None, usize::MAX).ok(),
        truncated: store.truncated_context().clone(),
        cursors: (0..n)
            .map(|j| store.peer_cursor(PeerId(j as u64)))
            .collect(),
        hlc: store.hlc_mark(),
    }
}

pub fn image_name(kind: ImageKind) -> &'static str {
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

impl Sim {
    /// Reopens node `i`'s store from `image` on a fresh backend of the sim's kind and checks
    /// it: it opens, keeps its replica id, moves to a higher epoch than the crashed process
    /// had, passes redb's integrity check and `verify`, and its own max seq is at least the
    /// highest it acknowledged (so no dot is issued twice).
    pub fn reopen(&self, i: usize, image: Vec<u8>, what: &str) -> (FaultBackend, RedbStore) {
        let seed = self.seed;
        let backend = match self.backend {
            Backend::Memory => FaultBackend::from_image(image),
            Backend::Recording => FaultBackend::recording_from_image(image),
        };
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

    /// Crashes node `i` in `mode` (inside the join of `packet` for `DuringDelivery`; without
    /// one, the node is armed to crash inside its next delta or chunk join), reopens its store
    /// and checks it; it restarts `down_ms` later.
    pub fn crash(&mut self, i: usize, down_ms: u64, mode: CrashMode, packet: Option<Packet>) {
        if !self.alive(i) {
            return;
        }
        if mode == CrashMode::DuringDelivery && packet.is_none() {
            self.nodes[i].crash_armed = Some(down_ms);
            return;
        }
        self.nodes[i].crash_armed = None;
        self.counts.crashes += 1;
        let queued = self.net.values().any(|p| p.to == i);
        if self.nodes[i].replica.in_flight() > 0 || queued {
            self.counts.crash_with_unacked += 1;
        }
        let n = self.n();
        let pre = committed(&mut self.nodes[i].store, n);
        let (backend, store, what, kept) = match self.backend {
            Backend::Memory => {
                // Inputs not yet processed are lost with the process.
                self.net.retain(|_, p| p.to != i);
                let what = format!("node {i} crash");
                self.log(|| what.clone());
                let image = self.nodes[i].backend.live();
                let (backend, mut store) = self.reopen(i, image, &what);
                let got = committed(&mut store, n);
                assert!(
                    got == pre,
                    "seed {}: {what}: the reopened store differs from the one it served\n\
                     reopened {got:?}\nserved {pre:?}",
                    self.seed
                );
                (backend, store, what, None)
            }
            Backend::Recording => self.crash_inside(i, mode, packet, &pre),
        };
        let node = &mut self.nodes[i];
        node.last_mark = durable_mark(&store, n);
        node.last_syncs = backend.syncs();
        node.epoch = store.epoch();
        node.store = store;
        node.backend = backend;
        node.checked_at = None;
        node.state = NodeState::Crashed {
            restart_at: self.now + down_ms,
        };
        node.conn = vec![false; n];
        if let Some(kept) = kept {
            // The old process is gone; a new replica of the store's new epoch over the same
            // peers takes over (drawn here on the recording backend, at the restart on the
            // memory backend: each backend's seeds keep their schedules).
            self.replace_replica(i);
            // An unacknowledged commit the image kept is now part of the store (it will be
            // sent): from here on it counts like an acknowledged one.
            if let Some((writes, log_seq)) = kept.commit {
                self.record_commit(i, &pre.ctx, &writes, log_seq);
            }
            self.check_store(i, &format!("node {i} after {what}"));
            self.mix(format!("crash {i} {} {}", kept.kept, kept.upto).as_bytes());
        } else {
            self.check_store(i, &format!("node {i} after {what}"));
        }
        for j in 0..n {
            if j != i {
                self.sync_links(j);
            }
        }
    }

    /// A new `Replica` for node `i` under its store's epoch, the same peers.
    fn replace_replica(&mut self, i: usize) {
        let n = self.n();
        let peers = (0..n).filter(|j| *j != i).map(|j| PeerId(j as u64));
        let replica = Replica::new(
            self.cfg.clone(),
            self.nodes[i].epoch,
            self.rng.random(),
            peers,
        );
        let old = std::mem::replace(&mut self.nodes[i].replica, replica);
        self.nodes[i].past_stats.push(old.stats().clone());
    }

    /// The recording backend's crash of node `i` inside its current input (`mode`), from the
    /// state `pre` before it: cuts an image of the backend's recording, reopens it, checks it
    /// is `pre` or the state after the input. Returns the new backend and store, a description
    /// and what the image kept.
    fn crash_inside(
        &mut self,
        i: usize,
        mode: CrashMode,
        packet: Option<Packet>,
        pre: &Committed,
    ) -> (FaultBackend, RedbStore, String, Option<Kept>) {
        let seed = self.seed;
        let n = self.n();
        let start = self.nodes[i].backend.log_len();
        // The input the node dies in; its outputs never leave the process.
        let mut in_write: Option<(Vec<LocalWrite>, Option<u64>)> = None;
        let mut carried = None;
        if let Some(p) = packet {
            carried = p
                .delivered
                .as_ref()
                .map(|sender| harness::carried(&p.msg, sender));
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
            let (writes, invalid) = self.recording_group();
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
        let post = (end > start).then(|| committed(&mut self.nodes[i].store, n));
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
        let got = committed(&mut store, n);
        let changed = post.as_ref().is_some_and(|p| p != pre);
        let kept = if got == *pre {
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
            let state = committed(&mut store, n);
            assert!(
                state == got,
                "seed {seed}: {again}: the state differs from the first recovery's\n{state:?}\n{got:?}"
            );
        }
        // A join the image kept delivered what its message carried.
        if let (Some(c), true) = (carried, kept) {
            let got = c.intersection(store.ctx());
            self.nodes[i].delivered.join(&got);
        }
        let commit = in_write.filter(|_| kept);
        let kept = Kept { kept, upto, commit };
        (backend, store, what, Some(kept))
    }

    pub fn restart(&mut self, i: usize) {
        self.log(|| format!("node {i} restarts (epoch {})", self.nodes[i].epoch));
        if self.backend == Backend::Memory {
            self.replace_replica(i);
        }
        let n = self.n();
        let node = &mut self.nodes[i];
        node.state = NodeState::Up;
        node.conn = vec![false; n];
        self.sync_links(i);
        self.reconnect_to(i);
    }

    pub fn pause(&mut self, i: usize, ms: u64) {
        if self.running(i) {
            self.counts.pauses += 1;
            self.nodes[i].state = NodeState::Paused {
                until: self.now + ms,
            };
        }
    }

    pub fn resume(&mut self, i: usize) {
        self.nodes[i].state = NodeState::Up;
        self.sync_links(i);
        for j in 0..self.n() {
            if j != i {
                self.sync_links(j);
            }
        }
    }

    /// Wipes node `i`'s data: new store, new replica id, same peer id. Ops no other node was
    /// delivered are the allowed loss; whatever `i` had in flight dies with it.
    pub fn wipe(&mut self, i: usize, down_ms: u64) {
        let old = self.nodes[i].id;
        self.crash(i, down_ms, CrashMode::Idle, None);
        self.counts.wipes += 1;
        let others: Vec<CausalContext> = (0..self.n())
            .filter(|j| *j != i)
            .map(|j| self.nodes[j].delivered.clone())
            .collect();
        let before: Vec<Dot> = self
            .oracle
            .ops
            .iter()
            .filter(|o| o.dot.replica == old && !o.lost)
            .map(|o| o.dot)
            .collect();
        self.counts.ops_lost += self.oracle.mark_lost(old, others.iter());
        for d in before.into_iter().filter(|d| self.oracle.is_lost(d)) {
            self.dots.wiped.insert(d);
        }
        self.net.retain(|_, p| p.from != i);
        let id = ReplicaId(self.rng.random());
        let (backend, store) = new_store(self.backend, id, &self.options);
        self.restores.used_ids.insert(id);
        self.restores.retired_ids.insert(old);
        let n = self.n();
        let node = &mut self.nodes[i];
        node.id = id;
        node.epoch = store.epoch();
        node.last_mark = durable_mark(&store, n);
        node.last_syncs = backend.syncs();
        node.store = store;
        node.backend = backend;
        node.last_ctx = CausalContext::new();
        node.checked_at = None;
        node.last_hlc = (0, 0);
        node.acked_max_seq = 0;
        node.delivered = CausalContext::new();
        // The wiped node's retirements are visible elsewhere only through their witnesses.
        for j in 0..self.n() {
            self.check_state(j, true);
        }
    }
}
