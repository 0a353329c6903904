//! A deterministic cluster of [`Replica`]s over the production redb store ([`SimStore`]) and a
//! simulated network in virtual time. Everything random comes from one `ChaCha8Rng`; all maps
//! are `BTreeMap`s.

use super::oracle::Oracle;
use super::store::SimStore;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use tidemark::codec;
use tidemark::config::Limits;
use tidemark::proto::{
    Message, Now, PeerId, Replica, ReplicaConfig, ReplicaEvent, ReplicaStats, StateStore,
};
use tidemark::store::EventId;
use tidemark_crdts::{CausalContext, DotStore, Entry, Key, Mutation, ReplicaId};

pub const BASE_WALL_MS: u64 = 1_700_000_000_000;

/// Network fault knobs (applied when a message is sent).
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub drop_pct: u32,
    pub dup_pct: u32,
    /// Messages get an extra random delay up to this (reordering).
    pub delay_max_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    Up,
    Crashed { restart_at: u64 },
    Paused { until: u64 },
}

pub struct Node {
    pub peer: PeerId,
    pub store: SimStore,
    pub replica: Replica,
    pub epoch: u64,
    pub state: NodeState,
    pub skew_ms: i64,
    /// This node's view of each peer's connection (what peer_up/peer_down said).
    pub conn: Vec<bool>,
    /// Invariant baselines.
    pub last_ctx: CausalContext,
    /// The log end when the state-wide invariants last ran.
    pub checked_at: Option<u64>,
    pub last_hlc: (u64, u32),
    /// Stats of the replicas of earlier boots.
    pub past_stats: Vec<ReplicaStats>,
    /// The acknowledged ops whose effects the harness delivered to this node (its own, and
    /// those a delta or chunk carried whose sender had them): the oracle's happens-before,
    /// independent of what the node's context claims.
    pub delivered: CausalContext,
}

struct Packet {
    from: usize,
    to: usize,
    msg: Message,
    /// The ops whose effects the sender held when it sent (deltas and chunks only).
    delivered: Option<CausalContext>,
}

/// How often the interesting cases happened.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub ops_acked: u64,
    pub ops_refused: u64,
    pub ops_lost: u64,
    pub crashes: u64,
    pub crash_with_unacked: u64,
    pub wipes: u64,
    pub pauses: u64,
    pub partitions: u64,
    pub transfers: u64,
    pub gaps: u64,
    pub duplicates: u64,
    pub stale_acks: u64,
    pub hlc_rejected: u64,
    pub evictions: u64,
    pub compactions: u64,
    pub rejected: u64,
    pub empty_intervals: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub later_chunks: u64,
    pub chunk_nacks: u64,
    pub filtered: u64,
    pub stale_chunks: u64,
    pub transfers_behind_log: u64,
    pub duplicate_events: u64,
    pub events: u64,
    pub large_values: u64,
    pub large_batches: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        macro_rules! add { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        add!(
            ops_acked,
            ops_refused,
            ops_lost,
            crashes,
            crash_with_unacked,
            wipes,
            pauses,
            partitions,
            transfers,
            gaps,
            duplicates,
            stale_acks,
            hlc_rejected,
            evictions,
            compactions,
            rejected,
            empty_intervals,
            delivered,
            dropped,
            later_chunks,
            chunk_nacks,
            filtered,
            stale_chunks,
            transfers_behind_log,
            duplicate_events,
            events,
            large_values,
            large_batches
        );
    }
}

/// An acknowledged event: its id, its ops, the first dot they took.
pub type AckedEvent = (EventId, Vec<(Key, Mutation)>, tidemark_crdts::Dot);

pub struct Sim {
    pub rng: ChaCha8Rng,
    pub now: u64,
    pub nodes: Vec<Node>,
    net: BTreeMap<(u64, u64), Packet>,
    net_seq: u64,
    pub faults: Faults,
    /// `blocked[from][to]`: messages on that direction are dropped.
    pub blocked: Vec<Vec<bool>>,
    pub trace: u64,
    pub oracle: Oracle,
    pub counts: Counts,
    pub cfg: ReplicaConfig,
    pub limits: Limits,
    /// Bytes of every message sent (encoded), when measuring.
    pub measure: bool,
    pub bytes_sent: u64,
    pub bytes_to: Vec<u64>,
    pub delta_bytes: u64,
    /// Bytes sent per message kind, when measuring.
    pub bytes_by_kind: BTreeMap<&'static str, (u64, u64)>,
    /// Check invariants after each event.
    pub check: bool,
    /// Acknowledged events.
    pub events: Vec<AckedEvent>,
}

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

impl Sim {
    pub fn new(seed: u64, n: usize, cfg: ReplicaConfig, limits: Limits) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut nodes = Vec::new();
        for i in 0..n {
            let replica_id = ReplicaId(rng.random());
            let peers: Vec<PeerId> = (0..n)
                .filter(|j| *j != i)
                .map(|j| PeerId(j as u64))
                .collect();
            nodes.push(Node {
                peer: PeerId(i as u64),
                store: SimStore::new(replica_id, limits.clone()),
                replica: Replica::new(cfg.clone(), 1, rng.random(), peers),
                epoch: 1,
                state: NodeState::Up,
                skew_ms: 0,
                conn: vec![false; n],
                last_ctx: CausalContext::new(),
                checked_at: None,
                last_hlc: (0, 0),
                past_stats: Vec::new(),
                delivered: CausalContext::new(),
            });
        }
        let mut sim = Self {
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
            limits,
            measure: false,
            bytes_sent: 0,
            bytes_to: vec![0; n],
            delta_bytes: 0,
            bytes_by_kind: BTreeMap::new(),
            check: true,
            events: Vec::new(),
        };
        for i in 0..n {
            sim.sync_links(i);
        }
        sim
    }

    pub fn n(&self) -> usize {
        self.nodes.len()
    }

    pub fn now_of(&self, i: usize) -> Now {
        let wall = (BASE_WALL_MS + self.now).saturating_add_signed(self.nodes[i].skew_ms);
        Now {
            mono_ms: self.now,
            wall_ms: wall,
        }
    }

    fn mix(&mut self, bytes: &[u8]) {
        self.trace = fnv(self.trace, bytes);
    }

    fn running(&self, i: usize) -> bool {
        self.nodes[i].state == NodeState::Up
    }

    fn alive(&self, i: usize) -> bool {
        !matches!(self.nodes[i].state, NodeState::Crashed { .. })
    }

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
                        .peer_up(now, peer, &mut *node.store)
                        .expect("the store does not fail");
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

    pub fn send(&mut self, from: usize, to: usize, msg: Message) {
        // Every message fits in a frame; a larger one could never be sent (ARCHITECTURE.md, "size
        // invariants").
        let len = codec::encoded_len("message", &msg).expect("encodable");
        assert!(
            len <= self.limits.frame_bytes_max,
            "node {from}: a {} message of {len} bytes exceeds frame_bytes_max {}",
            msg.kind(),
            self.limits.frame_bytes_max
        );
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

    /// Drains node `i`'s outputs and checks its invariants.
    pub fn after_input(&mut self, i: usize) {
        while let Some(t) = self.nodes[i].replica.poll_transmit() {
            self.send(i, t.to.0 as usize, t.msg);
        }
        // No correct peer ever shows a node more of its own id than it holds
        // (docs/design/principles.md, "Never reuse a dot" (c)): crashes, crash images and wipes
        // must never look like a data dir copied back.
        let restored = self.nodes[i].replica.take_restored_copy();
        assert!(
            restored.is_none(),
            "node {i} falsely detected as a restored copy: {restored:?}"
        );
        while let Some(e) = self.nodes[i].replica.poll_event() {
            self.mix(format!("{i}:{e:?}").as_bytes());
            if let ReplicaEvent::Compact { below } = e {
                self.counts.compactions += 1;
                self.nodes[i]
                    .store
                    .truncate_log(below)
                    .expect("the store does not fail");
            }
        }
        if self.check {
            self.check_invariants(i);
        }
    }

    /// G7 always-invariants for node `i` (the only node the last event touched).
    pub fn check_invariants(&mut self, i: usize) {
        self.check_invariants_of(i, false);
    }

    /// As [`Sim::check_invariants`]; the state-wide checks run only when node `i`'s state
    /// changed since they last ran (every state change is logged) or when `force`d.
    fn check_invariants_of(&mut self, i: usize, force: bool) {
        let node = &mut self.nodes[i];
        let me = node.store.replica_id();
        let end = node.store.log_bounds().1;
        if !force && node.checked_at == Some(end) {
            return;
        }
        node.checked_at = Some(end);
        let entries = node.store.entries();
        let ctx = node.store.context();
        assert!(
            entries.values().all(|e| {
                let mut ok = true;
                e.for_each_dot(&mut |d| ok &= ctx.contains(&d));
                ok
            }),
            "node {i}: a stored dot is outside the context"
        );
        assert!(
            node.store.context().own_dots_contiguous(me),
            "node {i}: own dots are not contiguous"
        );
        assert!(
            node.last_ctx.is_subset(node.store.context()),
            "node {i}: the context shrank"
        );
        // A causal counter holds at most one live dot per replica (its running total).
        for (key, entry) in &entries {
            let mut replicas = Vec::new();
            match entry {
                Entry::GCounter(f) => replicas.extend(f.iter().map(|(d, _)| d.replica)),
                Entry::PNCounter(f) => replicas.extend(f.iter().map(|(d, _)| d.replica)),
                _ => {}
            }
            let n = replicas.len();
            replicas.dedup();
            assert_eq!(
                replicas.len(),
                n,
                "node {i}: {key} holds two live dots of one replica: {entry:?}"
            );
        }
        let mut live = CausalContext::new();
        for e in entries.values() {
            e.for_each_dot(&mut |d| {
                live.insert(d);
            });
        }
        let contexts: Vec<&CausalContext> = self.nodes.iter().map(|n| n.store.context()).collect();
        if let Some(op) = self.oracle.unwitnessed_retirement(
            &self.nodes[i].delivered,
            &live,
            contexts.into_iter(),
        ) {
            panic!(
                "node {i}: {:?} {:?} on {} was retired, but no node holds a dot that retired it \
                 (an effect whose dot is in no context)",
                op.dot, op.mutation, op.key
            );
        }
        let node = &mut self.nodes[i];
        let hlc = node.store.hlc_mark();
        assert!(hlc >= node.last_hlc, "node {i}: the HLC went back");
        node.last_hlc = hlc;
        if node.last_ctx != *node.store.context() {
            node.last_ctx = node.store.context().clone();
        }
    }

    /// A client write on node `i`: acknowledged only once `apply_local` returned.
    pub fn client_write(&mut self, i: usize, ops: Vec<(Key, Mutation)>) -> bool {
        self.client_write_event(i, ops, None) == Some(true)
    }

    /// A client write on node `i`, an idempotent event when `event` is given. `None` when the
    /// node is down or the write was refused; `Some(false)` when it was a duplicate event (a
    /// no-op); `Some(true)` when it was applied and acknowledged.
    pub fn client_write_event(
        &mut self,
        i: usize,
        ops: Vec<(Key, Mutation)>,
        event: Option<EventId>,
    ) -> Option<bool> {
        if !self.running(i) {
            return None;
        }
        let now = self.now_of(i);
        let node = &mut self.nodes[i];
        let before = node.store.context().clone();
        match node.store.apply_local(&ops, event.clone(), now.wall_ms) {
            Ok(Some(delta)) => {
                let me = node.store.replica_id();
                node.replica.handle_local_commit(now);
                self.oracle
                    .record_batch(me, &before, &self.nodes[i].delivered, &ops, &delta);
                for d in delta.context().iter_dots().filter(|d| d.replica == me) {
                    self.nodes[i].delivered.insert(d);
                }
                if self.measure {
                    self.delta_bytes +=
                        codec::encoded_len("delta", &delta).expect("encodable") as u64;
                }
                if let Some(ev) = event {
                    self.events
                        .push((ev, ops.clone(), before.next_dot(me).expect("a fresh dot")));
                }
                self.counts.ops_acked += ops.len() as u64;
                self.mix(&codec::encode("delta", &delta).expect("encodable"));
                self.after_input(i);
                Some(true)
            }
            Ok(None) => {
                assert!(event.is_some(), "a write without an event id was skipped");
                assert_eq!(
                    self.nodes[i].store.context(),
                    &before,
                    "node {i}: a duplicate event changed the context"
                );
                self.counts.duplicate_events += 1;
                Some(false)
            }
            Err(_) => {
                self.counts.ops_refused += ops.len() as u64;
                None
            }
        }
    }

    /// After convergence, retries every acknowledged event whose ops survived at a random node:
    /// each must be a duplicate (dedup marks replicated with the state) and change nothing.
    pub fn retry_events(&mut self) {
        let events = std::mem::take(&mut self.events);
        for (ev, ops, first) in &events {
            if self.oracle.is_lost(first) {
                continue;
            }
            let i = self.rng.random_range(0..self.n());
            let got = self.client_write_event(i, ops.clone(), Some(ev.clone()));
            assert_eq!(
                got,
                Some(false),
                "node {i}: retrying event {ev:?} after convergence was not a no-op"
            );
        }
        self.events = events;
    }

    pub fn crash(&mut self, i: usize, down_ms: u64) {
        if !self.alive(i) {
            return;
        }
        self.counts.crashes += 1;
        let queued = self.net.values().any(|p| p.to == i);
        if self.nodes[i].replica.in_flight() > 0 || queued {
            self.counts.crash_with_unacked += 1;
        }
        // Inputs not yet processed are lost with the process.
        self.net.retain(|_, p| p.to != i);
        // G7.5: what a restart reopens from the durable image equals what was served.
        let n = self.n();
        let recovered = self.nodes[i].store.reopen(n);
        self.nodes[i].store = recovered;
        self.nodes[i].state = NodeState::Crashed {
            restart_at: self.now + down_ms,
        };
        self.nodes[i].conn = vec![false; self.n()];
        for j in 0..self.n() {
            if j != i {
                self.sync_links(j);
            }
        }
    }

    /// Wipes node `i`'s data: new store, new replica id, same peer id. Ops no other store has
    /// seen are the allowed loss; whatever `i` had in flight dies with it.
    pub fn wipe(&mut self, i: usize, down_ms: u64) {
        let old = self.nodes[i].store.replica_id();
        self.crash(i, down_ms);
        self.counts.wipes += 1;
        let others: Vec<CausalContext> = (0..self.n())
            .filter(|j| *j != i)
            .map(|j| self.nodes[j].delivered.clone())
            .collect();
        self.counts.ops_lost += self.oracle.mark_lost(old, others.iter());
        self.net.retain(|_, p| p.from != i);
        let id = ReplicaId(self.rng.random());
        let node = &mut self.nodes[i];
        node.store = SimStore::new(id, self.limits.clone());
        node.last_ctx = CausalContext::new();
        node.checked_at = None;
        node.last_hlc = (0, 0);
        node.delivered = CausalContext::new();
        // The wiped node's retirements are visible elsewhere only through their witnesses.
        for j in 0..self.n() {
            self.check_invariants_of(j, true);
        }
    }

    fn restart(&mut self, i: usize) {
        let n = self.n();
        let peers: Vec<PeerId> = (0..self.n())
            .filter(|j| *j != i)
            .map(|j| PeerId(j as u64))
            .collect();
        let seed = self.rng.random();
        let node = &mut self.nodes[i];
        node.epoch += 1;
        let old = std::mem::replace(
            &mut node.replica,
            Replica::new(self.cfg.clone(), node.epoch, seed, peers),
        );
        node.past_stats.push(old.stats().clone());
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

    fn resume(&mut self, i: usize) {
        self.nodes[i].state = NodeState::Up;
        self.sync_links(i);
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

    /// Restarts crashed nodes, resumes paused ones, lifts partitions and network faults.
    pub fn heal(&mut self) {
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
                    .handle_timeout(now, &mut *node.store)
                    .expect("the store does not fail");
                self.after_input(i);
                return true;
            }
        }
        unreachable!("an event was due at {t} but none was processed")
    }

    fn deliver(&mut self, p: Packet) {
        match self.nodes[p.to].state {
            NodeState::Crashed { .. } => self.counts.dropped += 1,
            NodeState::Paused { until } => {
                // Held by the paused process; processed after it resumes.
                self.net_seq += 1;
                self.net.insert((until, self.net_seq), p);
            }
            NodeState::Up if self.blocked[p.from][p.to] => self.counts.dropped += 1,
            NodeState::Up => {
                self.counts.delivered += 1;
                let bytes = codec::encode("message", &p.msg).expect("encodable");
                self.mix(&(p.from as u64 * 31 + p.to as u64).to_le_bytes());
                self.mix(&self.now.to_le_bytes());
                self.mix(&bytes);
                let now = self.now_of(p.to);
                let from = PeerId(p.from as u64);
                let carried = p.delivered.map(|sender| self.carried(&p.msg, &sender));
                let node = &mut self.nodes[p.to];
                node.replica
                    .handle_message(now, from, p.msg, &mut *node.store)
                    .expect("the store does not fail");
                if let Some(carried) = carried {
                    // Only what the receiver took in (a dropped gap or stale delta brings nothing).
                    let got = carried.intersection(node.store.context());
                    node.delivered.join(&got);
                }
                self.after_input(p.to);
            }
        }
    }

    /// The acknowledged ops whose effects `msg` carries, given what its sender held: a delta
    /// carries every op its context names, and so does the last chunk of a transfer (for the
    /// whole transfer); earlier chunks carry nothing yet.
    fn carried(&self, msg: &Message, sender: &CausalContext) -> CausalContext {
        let mut out = CausalContext::new();
        match msg {
            Message::Delta { delta, .. } => {
                for d in delta.context().iter_dots() {
                    if sender.contains(&d) {
                        out.insert(d);
                    }
                }
            }
            // The chunks of a transfer are joined together when the last one arrives.
            Message::Chunk { chunk, .. } if chunk.last => {
                for d in chunk.ctx.iter_dots() {
                    if sender.contains(&d) {
                        out.insert(d);
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// Runs internal events up to `until` (inclusive) and sets the clock there.
    pub fn run_until(&mut self, until: u64) {
        while self.step(until) {}
        self.now = self.now.max(until);
    }

    /// True when every node runs and all hold the same state.
    pub fn converged(&mut self) -> bool {
        if self.nodes.iter().any(|n| n.state != NodeState::Up)
            || self
                .nodes
                .iter()
                .any(|n| n.store.context() != self.nodes[0].store.context())
        {
            return false;
        }
        let first = self.nodes[0].store.state();
        self.nodes
            .iter_mut()
            .skip(1)
            .all(|n| n.store.state() == first)
    }

    /// True when nothing is in flight and every peer has acknowledged every node's whole log.
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

    /// Folds the replicas' counters into `counts`.
    pub fn collect_stats(&mut self) {
        let mut all: Vec<ReplicaStats> = Vec::new();
        for n in &self.nodes {
            all.extend(n.past_stats.iter().cloned());
            all.push(n.replica.stats().clone());
        }
        for s in all {
            self.counts.transfers += s.transfers_started;
            self.counts.gaps += s.gap_intervals;
            self.counts.duplicates += s.duplicate_intervals;
            self.counts.stale_acks += s.acks_stale_epoch;
            self.counts.hlc_rejected += s.hlc_rejected;
            self.counts.evictions += s.evictions;
            self.counts.rejected += s.rejected;
            self.counts.empty_intervals += s.empty_intervals_sent;
            self.counts.later_chunks += s.chunks_applied.saturating_sub(s.transfers_received);
            self.counts.chunk_nacks += s.chunk_nacks_received;
            self.counts.filtered += s.intervals_filtered;
            self.counts.stale_chunks += s.stale_chunks;
            self.counts.transfers_behind_log += s.transfers_behind_log;
        }
    }
}
