//! The simulated cluster: nodes (a [`Replica`] over a [`RedbStore`] on a `tests/common`
//! [`FaultBackend`]), the network in virtual time, links, the event loop and convergence.
//! Everything random comes from one `ChaCha8Rng`; all maps are `BTreeMap`s.

use super::Backend;
use super::counts::Counts;
use super::dots::Dots;
use super::oracle::Oracle;
use super::restore::Restores;
use crate::common::FaultBackend;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use tidemark::codec;
use tidemark::config::Limits;
use tidemark::model::Delta;
use tidemark::proto::{
    Message, Now, PeerId, Replica, ReplicaConfig, ReplicaEvent, ReplicaStats, StateStore,
};
use tidemark::store::{EventId, OpenOptions, RedbStore};
use tidemark_crdts::{CausalContext, DotMap, Entry, Key, Mutation, ReplicaId, StoreDelta, Value};

pub const BASE_WALL_MS: u64 = 1_700_000_000_000;

/// Network fault knobs (applied when a message is sent).
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub drop_pct: u32,
    pub dup_pct: u32,
    /// Extra random delay up to this, for 30 % of the messages (reordering).
    pub delay_max_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    Up,
    Crashed { restart_at: u64 },
    Paused { until: u64 },
}

/// What `durable_mark` reads: log bounds, context and cursors (what changes with every commit).
pub type DurableMark = ((u64, u64), CausalContext, Vec<Option<(ReplicaId, u64)>>);

pub fn durable_mark(store: &RedbStore, n: usize) -> DurableMark {
    (
        store.log_bounds(),
        store.ctx().clone(),
        (0..n)
            .map(|j| store.peer_cursor(PeerId(j as u64)))
            .collect(),
    )
}

pub struct Node {
    #[allow(dead_code)] // read by `quiescent`
    pub peer: PeerId,
    /// The store's replica id.
    pub id: ReplicaId,
    pub backend: FaultBackend,
    pub store: RedbStore,
    pub replica: Replica,
    /// The store's epoch (the replica runs under it, as `src/driver.rs` does).
    pub epoch: u64,
    pub state: NodeState,
    /// Wall-clock skew (the HLC and LWW timestamps see it).
    pub skew_ms: i64,
    /// This node's view of each peer's connection (what peer_up/peer_down said).
    pub conn: Vec<bool>,
    /// The context when the invariants last ran (it never shrinks).
    pub last_ctx: CausalContext,
    /// The log end when the state-wide invariants last ran.
    pub checked_at: Option<u64>,
    pub last_hlc: (u64, u32),
    /// The durable mark and the backend's sync count after the last input.
    pub last_mark: DurableMark,
    pub last_syncs: u64,
    /// Highest own seq of a commit acknowledged (or kept by a crash image).
    pub acked_max_seq: u64,
    /// Stats of the replicas of earlier boots.
    pub past_stats: Vec<ReplicaStats>,
    /// Crash inside the next delta or chunk join, then stay down this long.
    pub crash_armed: Option<u64>,
    /// The acknowledged ops whose effects the harness delivered to this node (its own, and
    /// those a delta or chunk carried whose sender had them): the oracle's happens-before,
    /// independent of what the node's context claims.
    pub delivered: CausalContext,
}

pub struct Packet {
    pub from: usize,
    pub to: usize,
    pub msg: Message,
    /// The ops whose effects the sender held when it sent (deltas and chunks).
    pub delivered: Option<CausalContext>,
}

/// An acknowledged event: its id, its ops, the first dot they took.
pub type AckedEvent = (EventId, Vec<(Key, Mutation)>, tidemark_crdts::Dot);

/// How a cluster is built besides what the seed draws.
pub struct Setup {
    pub backend: Backend,
    pub seed: u64,
    pub verbose: bool,
    pub nodes: usize,
    pub cfg: ReplicaConfig,
    pub limits: Limits,
    /// Log entries a compaction keeps (a node's `log_retain_entries`).
    pub log_retain: u64,
}

pub struct Sim {
    pub backend: Backend,
    pub seed: u64,
    pub verbose: bool,
    pub rng: ChaCha8Rng,
    pub now: u64,
    pub nodes: Vec<Node>,
    pub net: BTreeMap<(u64, u64), Packet>,
    pub net_seq: u64,
    pub faults: Faults,
    /// `blocked[from][to]`: messages in that direction are dropped.
    pub blocked: Vec<Vec<bool>>,
    pub trace: u64,
    pub oracle: Oracle,
    pub counts: Counts,
    pub cfg: ReplicaConfig,
    pub options: OpenOptions,
    pub log_retain: u64,
    /// Check invariants after each input.
    pub check: bool,
    /// Run `verify` after every input that committed something (else only at reopens and at
    /// the end): on the recording backend always, on the memory backend in one seed of fifty
    /// (`verify` after every input costs more than every other check together there).
    pub verify_inputs: bool,
    /// Every issued dot and what it stands for.
    pub dots: Dots,
    /// Snapshot files, restores and replica ids.
    pub restores: Restores,
    /// Acknowledged events.
    pub events: Vec<AckedEvent>,
    /// Workload state: keys, event sources and their next seqs, value serial.
    pub n_keys: usize,
    pub n_sources: u64,
    pub next_seq: BTreeMap<u64, u64>,
    pub serial: u64,
    /// Bytes of every message sent (encoded), when measuring.
    pub measure: bool,
    pub bytes_sent: u64,
    pub bytes_to: Vec<u64>,
    pub delta_bytes: u64,
    /// Bytes sent per message kind, when measuring.
    pub bytes_by_kind: BTreeMap<&'static str, (u64, u64)>,
}

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

impl Sim {
    /// A cluster of `setup.nodes` new stores, not started yet ([`Sim::start`]); per node the
    /// seed draws its replica id, its replica's seed and (recording backend) its clock skew.
    pub fn new(setup: Setup, mut rng: ChaCha8Rng) -> Self {
        let Setup {
            backend,
            seed,
            verbose,
            nodes: n,
            cfg,
            limits,
            log_retain,
        } = setup;
        let options = OpenOptions {
            limits,
            ..OpenOptions::default()
        };
        let mut nodes = Vec::new();
        for i in 0..n {
            let id = ReplicaId(rng.random());
            let (backend_file, store) = new_store(backend, id, &options);
            let epoch = store.epoch();
            let peers = (0..n).filter(|j| *j != i).map(|j| PeerId(j as u64));
            let replica = Replica::new(cfg.clone(), epoch, rng.random(), peers);
            let skew_ms = match backend {
                Backend::Recording if rng.random_bool(0.5) => rng.random_range(-3_000..=3_000),
                _ => 0,
            };
            nodes.push(Node {
                peer: PeerId(i as u64),
                id,
                last_mark: durable_mark(&store, n),
                last_syncs: backend_file.syncs(),
                backend: backend_file,
                store,
                replica,
                epoch,
                state: NodeState::Up,
                skew_ms,
                conn: vec![false; n],
                last_ctx: CausalContext::new(),
                checked_at: None,
                last_hlc: (0, 0),
                acked_max_seq: 0,
                past_stats: Vec::new(),
                crash_armed: None,
                delivered: CausalContext::new(),
            });
        }
        let restores = Restores::new(nodes.iter().map(|n| n.id));
        assert_eq!(
            restores.used_ids.len(),
            n,
            "seed {seed}: two nodes drew one replica id"
        );
        Self {
            backend,
            seed,
            verbose,
            rng,
            now: 0,
            nodes,
            net: BTreeMap::new(),
            net_seq: 0,
            faults: Faults::default(),
            blocked: vec![vec![false; n]; n],
            trace: 0xcbf2_9ce4_8422_2325,
            oracle: Oracle::default(),
            counts: Counts::default(),
            cfg,
            options,
            log_retain,
            check: true,
            verify_inputs: backend == Backend::Recording || seed % 50 == 0,
            dots: Dots::default(),
            restores,
            events: Vec::new(),
            n_keys: 1,
            n_sources: 1,
            next_seq: BTreeMap::new(),
            serial: 0,
            measure: false,
            bytes_sent: 0,
            bytes_to: vec![0; n],
            delta_bytes: 0,
            bytes_by_kind: BTreeMap::new(),
        }
    }

    /// Starts the cluster: every node connects to the peers it can reach.
    pub fn start(&mut self) {
        for i in 0..self.n() {
            self.sync_links(i);
        }
    }

    pub fn n(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`'s time: the virtual clock, and its (maybe skewed) wall clock.
    pub fn now_of(&self, i: usize) -> Now {
        Now {
            mono_ms: self.now,
            wall_ms: (BASE_WALL_MS + self.now).saturating_add_signed(self.nodes[i].skew_ms),
        }
    }

    pub fn mix(&mut self, bytes: &[u8]) {
        self.trace = fnv(self.trace, bytes);
    }

    pub fn log(&self, what: impl FnOnce() -> String) {
        if self.verbose {
            println!("t={} {}", self.now, what());
        }
    }

    /// Running: processes inputs.
    pub fn running(&self, i: usize) -> bool {
        self.nodes[i].state == NodeState::Up
    }

    /// Not crashed (a paused process keeps its connections).
    pub fn alive(&self, i: usize) -> bool {
        !matches!(self.nodes[i].state, NodeState::Crashed { .. })
    }

    // ---- links and network -----------------------------------------------------------------

    /// Brings node `i`'s connection view in line with reachability (only while it runs).
    pub fn sync_links(&mut self, i: usize) {
        if !self.running(i) {
            return;
        }
        for j in 0..self.n() {
            if j == i {
                continue;
            }
            let want = self.alive(j) && !(self.blocked[i][j] && self.blocked[j][i]);
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
    pub fn reconnect_to(&mut self, i: usize) {
        for j in 0..self.n() {
            if j != i && self.running(j) && self.nodes[j].conn[i] {
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

    pub fn set_blocked(&mut self, blocked: Vec<Vec<bool>>) {
        self.blocked = blocked;
        for i in 0..self.n() {
            self.sync_links(i);
        }
    }

    pub fn send(&mut self, from: usize, to: usize, msg: Message) {
        // Every message fits in a frame; a larger one could never be sent (ARCHITECTURE.md, "size
        // invariants").
        let len = codec::encoded_len("message", &msg).expect("encodable");
        let frame_max = self.options.limits.frame_bytes_max;
        assert!(
            len <= frame_max,
            "seed {}: node {from}: a {} message of {len} bytes exceeds frame_bytes_max {frame_max}",
            self.seed,
            msg.kind(),
        );
        if self.check {
            self.check_message(from, &msg);
        }
        if self.measure {
            let len = len as u64;
            self.bytes_sent += len;
            self.bytes_to[to] += len;
            let e = self.bytes_by_kind.entry(msg.kind()).or_default();
            e.0 += 1;
            e.1 += len;
        }
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
            let delivered = matches!(msg, Message::Delta { .. } | Message::Chunk { .. })
                .then(|| self.nodes[from].delivered.clone());
            self.net.insert(
                (self.now + delay, self.net_seq),
                Packet {
                    from,
                    to,
                    msg: msg.clone(),
                    delivered,
                },
            );
        }
    }

    /// Drains node `i`'s outputs, acts on compaction, checks its invariants.
    pub fn after_input(&mut self, i: usize) {
        while let Some(t) = self.nodes[i].replica.poll_transmit() {
            self.send(i, t.to.0 as usize, t.msg);
        }
        // No correct peer ever shows a node more of its own id than it holds
        // (docs/design/principles.md, "Never reuse a dot" (c)): crashes, crash images, wipes and
        // restores from snapshots (new ids) must never look like a data dir copied back.
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
        if self.check {
            self.check_node(i);
        }
        self.checkpoint(i);
    }

    /// Restarts crashed nodes, resumes paused ones, lifts partitions and network faults,
    /// disarms crashes.
    pub fn heal(&mut self) {
        for node in &mut self.nodes {
            node.crash_armed = None;
        }
        self.faults = Faults::default();
        let n = self.n();
        self.set_blocked(vec![vec![false; n]; n]);
        for i in 0..n {
            match self.nodes[i].state {
                NodeState::Crashed { .. } => self.restart(i),
                NodeState::Paused { .. } => self.resume(i),
                NodeState::Up => {}
            }
        }
    }

    // ---- event loop ----------------------------------------------------------------------

    /// The time of the next internal event (packet, timer, restart, resume).
    fn next_internal(&self) -> Option<u64> {
        let mut t = self.net.keys().next().map(|k| k.0);
        for node in &self.nodes {
            let c = match node.state {
                NodeState::Up => node.replica.poll_timeout(),
                NodeState::Crashed { restart_at } => Some(restart_at),
                NodeState::Paused { until } => Some(until),
            };
            t = match (t, c) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        t
    }

    /// Processes one internal event due at or before `until`; false when none is.
    pub fn step(&mut self, until: u64) -> bool {
        let Some(t) = self.next_internal() else {
            return false;
        };
        if t > until {
            return false;
        }
        self.now = self.now.max(t);
        // Node state changes first, in node order.
        for i in 0..self.n() {
            match self.nodes[i].state {
                NodeState::Crashed { restart_at } if restart_at <= self.now => {
                    self.restart(i);
                    return true;
                }
                NodeState::Paused { until } if until <= self.now => {
                    self.resume(i);
                    return true;
                }
                _ => {}
            }
        }
        if let Some((&key, _)) = self.net.iter().next().filter(|(k, _)| k.0 <= self.now) {
            let p = self.net.remove(&key).expect("present");
            self.deliver(p);
            return true;
        }
        for i in 0..self.n() {
            if self.running(i)
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
        match self.nodes[p.to].state {
            NodeState::Crashed { .. } => {
                self.counts.dropped += 1;
                return;
            }
            NodeState::Paused { until } => {
                // Held by the paused process; processed after it resumes.
                self.net_seq += 1;
                self.net.insert((until, self.net_seq), p);
                return;
            }
            NodeState::Up if self.blocked[p.from][p.to] => {
                self.counts.dropped += 1;
                return;
            }
            NodeState::Up => {}
        }
        self.counts.delivered += 1;
        if let (Some(down_ms), Message::Delta { .. } | Message::Chunk { .. }) =
            (self.nodes[p.to].crash_armed, &p.msg)
        {
            let to = p.to;
            self.crash(
                to,
                down_ms,
                super::crash::CrashMode::DuringDelivery,
                Some(p),
            );
            return;
        }
        if let Message::Delta { log, from, .. } = &p.msg {
            self.restores
                .seeded_hit(p.to, p.from, *log, *from, &mut self.counts);
        }
        let bytes = codec::encode("message", &p.msg).expect("encodable");
        self.mix(&(p.from as u64 * 31 + p.to as u64).to_le_bytes());
        self.mix(&self.now.to_le_bytes());
        self.mix(&bytes);
        let now = self.now_of(p.to);
        let from = PeerId(p.from as u64);
        let carried = p.delivered.map(|sender| carried(&p.msg, &sender));
        let node = &mut self.nodes[p.to];
        node.replica
            .handle_message(now, from, p.msg, &mut node.store)
            .expect("handle_message: the store does not fail");
        if let Some(carried) = carried {
            // Only what the receiver took in (a dropped gap or stale delta brings nothing).
            let got = carried.intersection(node.store.ctx());
            node.delivered.join(&got);
        }
        self.after_input(p.to);
    }

    /// Runs internal events up to `until` (inclusive) and sets the clock there.
    pub fn run_until(&mut self, until: u64) {
        while self.step(until) {}
        self.now = self.now.max(until);
    }

    /// True when every node runs and all hold the same state (entries, context, dedup marks).
    pub fn converged(&mut self) -> bool {
        if self.nodes.iter().any(|n| n.state != NodeState::Up)
            || self
                .nodes
                .iter()
                .any(|n| n.store.ctx() != self.nodes[0].store.ctx())
        {
            return false;
        }
        let first = state(&mut self.nodes[0].store);
        self.nodes
            .iter_mut()
            .skip(1)
            .all(|n| state(&mut n.store) == first)
    }

    /// True when nothing is in flight and every peer has acknowledged every node's whole log.
    #[allow(dead_code)] // the measuring runs are in `tests/sim.rs`
    pub fn quiescent(&self) -> bool {
        self.net.is_empty()
            && self.nodes.iter().all(|n| {
                let end = n.store.log_bounds().1;
                n.replica.in_flight() == 0
                    && (0..self.n())
                        .filter(|j| *j as u64 != n.peer.0)
                        .all(|j| n.replica.peer_acked(PeerId(j as u64)) == Some(end))
            })
    }

    /// Runs until quiescent (checked every `step_ms`) or `deadline`; returns the time.
    #[allow(dead_code)] // the measuring runs are in `tests/sim.rs`
    pub fn run_until_quiescent(&mut self, deadline: u64, step_ms: u64) -> Option<u64> {
        loop {
            if self.quiescent() {
                return Some(self.now);
            }
            if self.now >= deadline {
                return None;
            }
            let next = (self.now + step_ms).min(deadline);
            self.run_until(next);
        }
    }

    /// Runs until converged (checked every `step_ms`) or `deadline`; returns the time converged.
    pub fn run_until_converged(&mut self, deadline: u64, step_ms: u64) -> Option<u64> {
        loop {
            if self.converged() {
                return Some(self.now);
            }
            if self.now >= deadline {
                return None;
            }
            let next = (self.now + step_ms).min(deadline);
            self.run_until(next);
        }
    }

    /// Folds the replicas' counters (of every boot) into `counts`.
    pub fn collect_stats(&mut self) {
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
            c.chunk_nacks += s.chunk_nacks_received;
            c.duplicates += s.duplicate_intervals;
            c.gaps += s.gap_intervals;
            c.stale_acks += s.acks_stale_epoch;
            c.retransmits += s.retransmits;
            c.evictions += s.evictions;
            c.filtered += s.intervals_filtered;
            c.stale_chunks += s.stale_chunks;
            c.rejected += s.rejected;
            c.hlc_rejected += s.hlc_rejected;
            c.empty_intervals += s.empty_intervals_sent;
        }
    }
}

/// A new, empty store for `id` on a new backend of the kind `backend` names.
pub fn new_store(
    backend: Backend,
    id: ReplicaId,
    options: &OpenOptions,
) -> (FaultBackend, RedbStore) {
    let file = match backend {
        Backend::Memory => FaultBackend::default(),
        Backend::Recording => FaultBackend::recording(),
    };
    let store = RedbStore::open_with_backend(
        file.clone(),
        OpenOptions {
            new_replica_id: Some(id),
            ..options.clone()
        },
    )
    .expect("create a store");
    assert_eq!(store.replica(), id);
    (file, store)
}

/// The acknowledged ops whose effects `msg` carries, given what its sender held: a delta
/// carries every op its context names, and so does the last chunk of a transfer (for the whole
/// transfer); earlier chunks carry nothing yet.
pub fn carried(msg: &Message, sender: &CausalContext) -> CausalContext {
    let mut out = CausalContext::new();
    let ctx = match msg {
        Message::Delta { delta, .. } => delta.context(),
        // The chunks of a transfer are joined together when the last one arrives.
        Message::Chunk { chunk, .. } if chunk.last => &chunk.ctx,
        _ => return out,
    };
    for d in ctx.iter_dots() {
        if sender.contains(&d) {
            out.insert(d);
        }
    }
    out
}

/// Every entry of `store`, ascending by key.
pub fn entries(store: &RedbStore) -> BTreeMap<Key, Entry> {
    store
        .reader()
        .entries()
        .expect("read the rows")
        .into_iter()
        .collect()
}

/// The value of `key` in `store` (the empty value of its kind when absent).
pub fn value(store: &RedbStore, key: &Key) -> Value {
    store
        .reader()
        .get(key)
        .expect("read a row")
        .unwrap_or_else(|| Value::empty(key.kind))
}

/// The replicated state of `store` (entries, context, dedup marks) as one delta.
pub fn state(store: &mut RedbStore) -> Delta {
    let mut map = DotMap::default();
    for (k, e) in entries(store) {
        map.set(k, e);
    }
    Delta {
        state: StoreDelta {
            store: map,
            ctx: store.ctx().clone(),
        },
        marks: store.dedup_marks().expect("read the dedup marks"),
    }
}
