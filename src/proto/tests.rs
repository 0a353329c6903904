//! Unit tests of the replication core against the pitfalls of
//! `docs/design/principles.md` ("Pitfalls"):
//! two or three replicas over the production store ([`RedbStore`] on redb's in-memory backend),
//! with messages moved by hand so each test can drop, hold, forge or reorder exactly the message
//! it is about.

use crate::limits::Limits;
use crate::model::Delta;
use crate::proto::replica::without_seen;
use crate::proto::{
    Message, Now, PeerId, RejectReason, Replica, ReplicaConfig, ReplicaEvent, StateStore, Transmit,
};
use crate::store::{LocalWrite, OpenOptions, RedbStore, StoreError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tidemark_crdts::{
    Causal, CausalContext, Dot, DotFun, DotMap, Entry, Key, KeyKind, Mutation, ReplicaId,
};

pub(super) const WALL: u64 = 1_700_000_000_000;

/// A [`RedbStore`] on redb's in-memory backend, with the helpers the tests need.
pub(crate) struct TestStore(pub(super) RedbStore);

impl std::ops::Deref for TestStore {
    type Target = RedbStore;
    fn deref(&self) -> &RedbStore {
        &self.0
    }
}

impl std::ops::DerefMut for TestStore {
    fn deref_mut(&mut self) -> &mut RedbStore {
        &mut self.0
    }
}

impl TestStore {
    pub(crate) fn new(replica: ReplicaId, limits: Limits) -> Self {
        let options = OpenOptions {
            limits,
            new_replica_id: Some(replica),
            ..OpenOptions::default()
        };
        Self(
            RedbStore::open_with_backend(redb::backends::InMemoryBackend::new(), options)
                .expect("open an in-memory store"),
        )
    }

    /// Commits `ops` as one group; returns its logged delta.
    pub(crate) fn apply_local(
        &mut self,
        ops: &[(Key, Mutation)],
        wall_ms: u64,
    ) -> Result<Delta, StoreError> {
        let write = LocalWrite {
            ops: ops.to_vec(),
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        let seq = self.0.commit_local(&[write], wall_ms)?.log_seq;
        let seq = seq.expect("a non-empty group is logged");
        Ok(self
            .0
            .log_interval(seq, None, usize::MAX)?
            .delta
            .expect("the group's log entry"))
    }

    pub(super) fn entries(&self) -> Vec<(Key, Entry)> {
        self.0.reader().entries().expect("read the rows")
    }

    /// The replicated state (entries, context, marks) as one delta.
    pub(super) fn state(&mut self) -> Delta {
        let mut store = DotMap::default();
        for (k, e) in self.entries() {
            store.set(k, e);
        }
        Delta {
            state: Causal {
                store,
                ctx: self.0.ctx().clone(),
            },
            marks: self.0.dedup_marks().expect("read the marks"),
        }
    }

    /// An independent store holding the same replicated state (another replica id).
    fn fork(&mut self, replica: ReplicaId) -> Self {
        let mut other = Self::new(replica, self.0.limits().clone());
        let state = self.state();
        other
            .apply_remote(PeerId(99), state, None, WALL)
            .expect("store")
            .expect("valid state");
        other
    }
}

pub(super) fn now(t: u64) -> Now {
    Now {
        mono_ms: t,
        wall_ms: WALL + t,
    }
}

pub(super) fn config() -> ReplicaConfig {
    ReplicaConfig {
        gossip_interval_ms: 100,
        retransmit_timeout_ms: 1_000,
        retransmit_timeout_max_ms: 1_000,
        peer_evict_after_ms: 5_000,
        catch_up_stagger_ms: 0,
        ..ReplicaConfig::default()
    }
}

pub(super) struct Node {
    pub(super) id: PeerId,
    pub(super) store: TestStore,
    pub(super) replica: Replica,
    epoch: u64,
    peers: Vec<PeerId>,
    cfg: ReplicaConfig,
}

impl Node {
    pub(super) fn new(id: u64, peers: &[u64], cfg: ReplicaConfig) -> Self {
        let peers: Vec<PeerId> = peers.iter().map(|p| PeerId(*p)).collect();
        Self {
            id: PeerId(id),
            store: TestStore::new(ReplicaId(u128::from(id) + 1000), Limits::default()),
            replica: Replica::new(cfg.clone(), 1, id, peers.clone()),
            epoch: 1,
            peers,
            cfg,
        }
    }

    fn restart(&mut self) {
        self.epoch += 1;
        self.replica = Replica::new(
            self.cfg.clone(),
            self.epoch,
            self.id.0 + 77,
            self.peers.clone(),
        );
    }

    pub(super) fn write(&mut self, t: u64, key: &str, value: &str) {
        self.store
            .apply_local(
                &[(
                    Key::new(KeyKind::MvReg, key),
                    Mutation::Set(format!("\"{value}\"")),
                )],
                WALL + t,
            )
            .expect("store");
        self.replica.handle_local_commit(now(t));
    }

    pub(super) fn up(&mut self, t: u64, peer: u64) {
        self.replica
            .peer_up(now(t), PeerId(peer), &mut *self.store)
            .expect("store");
    }

    pub(super) fn recv(&mut self, t: u64, from: PeerId, msg: Message) {
        self.replica
            .handle_message(now(t), from, msg, &mut *self.store)
            .expect("store");
    }

    pub(super) fn tick(&mut self, t: u64) {
        self.replica
            .handle_timeout(now(t), &mut *self.store)
            .expect("store");
    }

    pub(super) fn out(&mut self) -> Vec<Transmit> {
        std::iter::from_fn(|| self.replica.poll_transmit()).collect()
    }

    fn events(&mut self) -> Vec<ReplicaEvent> {
        std::iter::from_fn(|| self.replica.poll_event()).collect()
    }

    /// Truncates the log as the host would on `ReplicaEvent::Compact`; returns the events.
    fn compact(&mut self) -> Vec<ReplicaEvent> {
        let events = self.events();
        for e in &events {
            if let ReplicaEvent::Compact { below } = e {
                self.store.truncate_log(*below).expect("store");
            }
        }
        events
    }
}

/// Runs nodes with every message delivered (in order, 1 ms later) until `until`.
pub(super) fn run(nodes: &mut [&mut Node], from_t: u64, until: u64) {
    let mut t = from_t;
    while t <= until {
        loop {
            let mut moved = false;
            for i in 0..nodes.len() {
                for tx in nodes[i].out() {
                    let from = nodes[i].id;
                    if let Some(j) = nodes.iter().position(|n| n.id == tx.to) {
                        nodes[j].recv(t, from, tx.msg);
                        moved = true;
                    }
                }
            }
            if !moved {
                break;
            }
        }
        for n in nodes.iter_mut() {
            if n.replica.poll_timeout().is_some_and(|d| d <= t) {
                n.tick(t);
            }
            n.compact();
        }
        t += 10;
    }
}

/// Two connected nodes 0 and 1, settled (transfers done, cursors known).
fn pair() -> (Node, Node) {
    let mut a = Node::new(0, &[1], config());
    let mut b = Node::new(1, &[0], config());
    a.up(0, 1);
    b.up(0, 0);
    run(&mut [&mut a, &mut b], 0, 2_000);
    assert_eq!(a.replica.peer_acked(b.id), Some(a.store.log_bounds().1));
    assert_eq!(b.replica.peer_acked(a.id), Some(b.store.log_bounds().1));
    (a, b)
}

fn deltas(out: &[Transmit]) -> Vec<(u64, u64)> {
    out.iter()
        .filter_map(|t| match &t.msg {
            Message::Delta { from, end, .. } => Some((*from, *end)),
            _ => None,
        })
        .collect()
}

#[test]
fn pair_replicates_both_ways() {
    let (mut a, mut b) = pair();
    a.write(2_000, "x", "1");
    b.write(2_000, "y", "2");
    run(&mut [&mut a, &mut b], 2_000, 4_000);
    assert_eq!(a.store.state(), b.store.state());
    assert_eq!(a.store.entries().len(), 2);
}

/// Pitfall "stale acknowledgement": an ack from before the sender's restart must not advance `A`.
#[test]
fn stale_epoch_ack_after_restart_does_not_advance() {
    let (mut a, mut b) = pair();
    for i in 0..3 {
        a.write(2_000, &format!("k{i}"), "v");
    }
    run(&mut [&mut a, &mut b], 2_000, 3_000);
    let truth = b.store.peer_cursor(a.id).expect("a cursor into A's log").1;
    a.restart();
    a.up(3_000, 1);
    b.up(3_000, 0);
    run(&mut [&mut a, &mut b], 3_000, 4_000);
    assert_eq!(a.replica.peer_acked(b.id), Some(truth));
    // An old-epoch ack claiming far more arrives late.
    let me = a.store.replica_id();
    a.recv(
        4_000,
        b.id,
        Message::Ack {
            epoch: 1,
            log: me,
            upto: 57,
        },
    );
    assert_eq!(a.replica.stats().acks_stale_epoch, 1);
    assert_eq!(a.replica.peer_acked(b.id), Some(truth));
    // The next interval still starts at the true watermark.
    a.write(4_000, "later", "v");
    a.tick(5_000);
    let sent = deltas(&a.out());
    assert_eq!(sent.first().map(|d| d.0), Some(truth));
}

/// Pitfall "pipelined intervals": an interval that starts above the receiver's cursor (its
/// predecessor was lost) is neither joined nor acknowledged; the receiver states its real cursor
/// instead.
#[test]
fn interval_with_a_gap_is_not_joined() {
    let (mut a, mut b) = pair();
    a.write(2_000, "first", "1");
    a.tick(2_100);
    let lost = a.out(); // interval 1 is lost
    assert_eq!(deltas(&lost).len(), 1);
    let cursor = b.store.peer_cursor(a.id).expect("a cursor into A's log").1;
    a.write(2_200, "second", "2");
    let (start, end) = a.store.log_bounds();
    let interval = a
        .store
        .log_interval(end - 1, None, usize::MAX)
        .expect("store");
    let ctx_before = b.store.context().clone();
    b.recv(
        2_300,
        a.id,
        Message::Delta {
            epoch: 1,
            log: a.store.replica_id(),
            from: end - 1,
            end,
            delta: interval.delta.expect("an entry"),
        },
    );
    assert!(start <= cursor && cursor < end - 1);
    assert_eq!(
        b.store.context(),
        &ctx_before,
        "the gapped interval must not be joined"
    );
    assert_eq!(
        b.store.peer_cursor(a.id).expect("a cursor into A's log").1,
        cursor
    );
    assert_eq!(b.replica.stats().gap_intervals, 1);
    let reply = b.out();
    assert!(
        reply.iter().all(|t| !matches!(t.msg, Message::Ack { .. })),
        "no ack for a gap"
    );
    assert!(reply.iter().any(|t| matches!(
        &t.msg,
        Message::Hello { resume: Some((_, c)), .. } if *c == cursor
    )));
    // The sender resets to the real cursor and the next interval covers both writes.
    for t in reply {
        a.recv(2_400, b.id, t.msg);
    }
    assert_eq!(a.replica.peer_acked(b.id), Some(cursor));
    run(&mut [&mut a, &mut b], 5_000, 6_000);
    assert_eq!(a.store.state(), b.store.state());
}

/// Pitfall "one dead peer pins the log": a silent peer is evicted, so it no longer pins the log.
#[test]
fn silent_peer_is_evicted_and_the_frontier_advances() {
    let mut a = Node::new(0, &[1, 2], config());
    let mut b = Node::new(1, &[0], config());
    a.up(0, 1);
    a.up(0, 2); // node 2 never answers
    b.up(0, 0);
    run(&mut [&mut a, &mut b], 0, 1_000);
    for i in 0..5 {
        a.write(1_000, &format!("k{i}"), "v");
    }
    run(&mut [&mut a, &mut b], 1_000, 2_000);
    assert_eq!(
        a.replica.stable_frontier(),
        None,
        "node 2 has not reported yet"
    );
    assert!(a.store.log_len() > 0);
    run(&mut [&mut a, &mut b], 2_000, 7_000);
    assert_eq!(a.replica.stats().evictions, 1);
    assert_eq!(a.replica.stable_frontier(), Some(a.store.log_bounds().1));
    assert_eq!(
        a.store.log_len(),
        0,
        "the log drained once the silent peer was evicted"
    );
}

/// Pitfall "BP drain": when every pending entry came from the peer itself (BP), its cursor still
/// advances, so the log drains.
#[test]
fn back_propagation_only_interval_drains() {
    let (mut a, mut b) = pair();
    for i in 0..4 {
        b.write(2_000, &format!("k{i}"), "v");
        run(&mut [&mut a, &mut b], 2_000 + i * 300, 2_300 + i * 300);
    }
    run(&mut [&mut a, &mut b], 3_500, 5_000);
    assert!(a.replica.stats().empty_intervals_sent > 0);
    assert_eq!(a.replica.peer_acked(b.id), Some(a.store.log_bounds().1));
    assert_eq!(
        a.store.log_len(),
        0,
        "entries that came from B drained from A's log"
    );
    assert_eq!(a.store.state(), b.store.state());
}

/// Pitfall "empty delta advances": an empty interval still moves the receiver's durable cursor and
/// is acked.
#[test]
fn empty_delta_still_advances() {
    let (a, mut b) = pair();
    let cursor = b.store.peer_cursor(a.id).expect("a cursor into A's log").1;
    b.recv(
        3_000,
        a.id,
        Message::Delta {
            epoch: 1,
            log: a.store.replica_id(),
            from: cursor,
            end: cursor + 3,
            delta: Delta::default(),
        },
    );
    assert_eq!(
        b.store.peer_cursor(a.id).expect("a cursor into A's log").1,
        cursor + 3
    );
    let out = b.out();
    assert!(
        out.iter()
            .any(|t| matches!(t.msg, Message::Ack { upto, .. } if upto == cursor + 3))
    );
}

/// Pitfall "poison message": a semantically invalid delta is refused, counted and reported, never
/// acked; the replica stays live and keeps joining valid intervals.
#[test]
fn invalid_delta_is_rejected_and_the_replica_stays_live() {
    let (mut a, mut b) = pair();
    let cursor = b.store.peer_cursor(a.id).expect("a cursor into A's log").1;
    let before = b.store.state();
    // A dot outside the delta's context (invariant I3 broken).
    let dot = Dot::new(a.store.replica_id(), 999);
    let mut store = DotMap::default();
    store.set(
        Key::new(KeyKind::MvReg, "bad"),
        Entry::MvReg(DotFun::single(dot, "\"x\"".into())),
    );
    let poison = Delta {
        state: Causal {
            store,
            ctx: CausalContext::new(),
        },
        ..Delta::default()
    };
    b.recv(
        3_000,
        a.id,
        Message::Delta {
            epoch: 1,
            log: a.store.replica_id(),
            from: cursor,
            end: cursor + 1,
            delta: poison,
        },
    );
    assert_eq!(b.replica.stats().rejected, 1);
    assert!(
        b.out()
            .iter()
            .all(|t| !matches!(t.msg, Message::Ack { .. }))
    );
    assert!(b.events().iter().any(|e| matches!(
        e,
        ReplicaEvent::Rejected {
            reason: RejectReason::Invalid(_),
            ..
        }
    )));
    assert_eq!(b.store.state(), before);
    assert_eq!(
        b.store.peer_cursor(a.id).expect("a cursor into A's log").1,
        cursor
    );
    // Still live: a valid write replicates.
    a.write(3_000, "good", "1");
    run(&mut [&mut a, &mut b], 3_000, 6_000);
    assert_eq!(a.store.state(), b.store.state());
}

/// A multi-chunk state transfer survives a lost chunk (retransmission) and a receiver restart
/// in the middle (`ChunkNack`, restart); the receiver's cursor is set only by the last chunk.
#[test]
fn chunked_transfer_survives_loss_and_receiver_restart() {
    let cfg = ReplicaConfig {
        message_bytes_target: 200,
        ..config()
    };
    let mut a = Node::new(0, &[1], cfg.clone());
    let mut b = Node::new(1, &[0], cfg);
    for i in 0..40 {
        a.write(0, &format!("key{i:03}"), &format!("value{i}"));
    }
    a.up(0, 1);
    b.up(0, 0);
    // Deliver until the third chunk is in flight, then lose it.
    let mut chunks = 0;
    let mut t = 0;
    while chunks < 3 {
        t += 10;
        for tx in a.out() {
            if matches!(tx.msg, Message::Chunk { .. }) {
                chunks += 1;
                if chunks == 3 {
                    continue;
                }
            }
            b.recv(t, a.id, tx.msg);
        }
        for tx in b.out() {
            a.recv(t, b.id, tx.msg);
        }
        a.tick(t);
        b.tick(t);
    }
    assert!(
        b.store.peer_cursor(a.id).is_none(),
        "no cursor before the last chunk"
    );
    // The lost chunk is retransmitted after the timeout and the transfer goes on.
    let t = t + 1_100;
    a.tick(t);
    let resent = a.out();
    assert!(
        resent
            .iter()
            .any(|tx| matches!(tx.msg, Message::Chunk { index: 2, .. }))
    );
    for tx in resent {
        b.recv(t, a.id, tx.msg);
    }
    for tx in b.out() {
        a.recv(t, b.id, tx.msg);
    }
    // B restarts mid-transfer and its Hello is lost: the next chunk finds it without the
    // transfer's state, it answers ChunkNack, and A restarts the transfer.
    b.restart();
    b.up(t, 0);
    let _lost_hello = b.out();
    for tx in a.out() {
        b.recv(t + 10, a.id, tx.msg);
    }
    assert_eq!(b.replica.stats().chunk_nacks_sent, 1);
    run(&mut [&mut a, &mut b], t + 10, t + 8_000);
    assert_eq!(a.replica.stats().chunk_nacks_received, 1);
    assert!(a.replica.stats().transfers_started >= 2);
    assert!(a.replica.stats().transfers_completed >= 1);
    assert!(a.replica.stats().retransmits >= 1);
    assert_eq!(a.store.state(), b.store.state());
    assert_eq!(
        b.store.peer_cursor(a.id).map(|c| c.1),
        Some(a.store.log_bounds().1)
    );
}

/// A transfer's chunks are read one at a time from the snapshot pinned when it started: the
/// sender keeps writing (overwrites, element adds and removes inside a row sent in parts, a
/// deleted key, new keys) while it is under way, and the receiver still ends with exactly the
/// state the transfer started from, context and entries alike; the snapshot is released once
/// the transfer completes.
#[test]
fn a_transfer_sends_the_state_of_its_start_while_the_sender_keeps_writing() {
    let cfg = ReplicaConfig {
        message_bytes_target: 600,
        ..config()
    };
    let mut a = Node::new(0, &[1], cfg.clone());
    let mut b = Node::new(1, &[0], cfg);
    let set = Key::new(KeyKind::ORSet, "big");
    let gone = Key::new(KeyKind::ORSet, "gone");
    for i in 0..40 {
        a.write(0, &format!("key{i:03}"), &format!("before{i}"));
    }
    let adds: Vec<(Key, Mutation)> = (0..200)
        .map(|i| (set.clone(), Mutation::Add(format!("\"e{i:04}\""))))
        .chain([(gone.clone(), Mutation::Add("\"x\"".into()))])
        .collect();
    a.store.apply_local(&adds, WALL).expect("store");
    a.replica.handle_local_commit(now(0));
    let start = a.store.state();
    a.up(0, 1);
    b.up(0, 0);
    let (mut t, mut chunks, mut wrote, mut done) = (0, 0, false, false);
    while !done && t < 60_000 {
        t += 10;
        for tx in a.out() {
            match &tx.msg {
                Message::Chunk { chunk, .. } => {
                    chunks += 1;
                    done = chunk.last;
                    b.recv(t, a.id, tx.msg);
                }
                // Deltas would bring the writes made after the start: held back.
                Message::Delta { .. } => {}
                _ => b.recv(t, a.id, tx.msg),
            }
        }
        for tx in b.out() {
            a.recv(t, b.id, tx.msg);
        }
        if chunks >= 1 && !wrote {
            wrote = true;
            for i in 0..40 {
                a.write(t, &format!("key{i:03}"), &format!("after{i}"));
            }
            a.write(t, "aaa-new", "new");
            let mut ops: Vec<(Key, Mutation)> = (0..200)
                .step_by(2)
                .map(|i| (set.clone(), Mutation::Remove(format!("\"e{i:04}\""))))
                .collect();
            ops.extend((0..100).map(|i| (set.clone(), Mutation::Add(format!("\"n{i:04}\"")))));
            ops.push((gone.clone(), Mutation::Delete));
            a.store.apply_local(&ops, WALL + t).expect("store");
            a.replica.handle_local_commit(now(t));
        }
        a.tick(t);
        b.tick(t);
    }
    assert!(done && wrote, "the transfer completed after the writes");
    assert!(chunks >= 5, "a transfer of several chunks: {chunks}");
    // The receiver holds exactly the state of the start (its own context included).
    assert_eq!(b.store.state(), start);
    // Acknowledging the last chunk released the snapshot.
    for tx in b.out() {
        a.recv(t, b.id, tx.msg);
    }
    assert_eq!(a.store.transfer_snapshots_pinned(), 0);
    // The rest arrives as deltas.
    run(&mut [&mut a, &mut b], t, t + 4_000);
    assert_eq!(a.store.state(), b.store.state());
    assert_ne!(a.store.state(), start);
}

/// The context filter (`Have`) never changes what a join produces: for random stores and
/// deltas, joining the filtered delta gives the same state, context and inflation.
#[test]
fn context_filter_preserves_the_join() {
    let mut rng = ChaCha8Rng::seed_from_u64(
        std::env::var("FILTER_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    );
    let mut filtered_cases = 0;
    for case in 0..300 {
        let ids = [ReplicaId(1), ReplicaId(2), ReplicaId(3)];
        let mut stores: Vec<TestStore> = ids
            .iter()
            .map(|r| TestStore::new(*r, Limits::default()))
            .collect();
        let mut log: Vec<Delta> = Vec::new();
        for step in 0..rng.random_range(5..40) {
            let i = rng.random_range(0..3);
            let key = Key::new(
                KeyKind::ALL[rng.random_range(0..5)],
                format!("k{}", rng.random_range(0..4)),
            );
            let m = match key.kind {
                KeyKind::GCounter => Mutation::Inc(1),
                KeyKind::PNCounter => Mutation::Dec(2),
                KeyKind::ORSet => match rng.random_range(0..3) {
                    0 => Mutation::Add(format!("\"e{}\"", rng.random_range(0..3))),
                    1 => Mutation::Remove(format!("\"e{}\"", rng.random_range(0..3))),
                    _ => Mutation::Delete,
                },
                KeyKind::Lww | KeyKind::MvReg => {
                    if rng.random_bool(0.8) {
                        Mutation::Set(format!("\"v{step}\""))
                    } else {
                        Mutation::Delete
                    }
                }
            };
            let d = stores[i]
                .apply_local(&[(key, m)], WALL + step)
                .expect("store");
            log.push(d);
            // Random partial gossip between the stores.
            if rng.random_bool(0.5) {
                let (x, y) = (rng.random_range(0..3), rng.random_range(0..3));
                if x != y {
                    let d = log[rng.random_range(0..log.len())].clone();
                    let _ = stores[y]
                        .apply_remote(PeerId(x as u64), d, None, WALL)
                        .expect("store");
                }
            }
        }
        let receiver = &mut stores[rng.random_range(0..3)];
        let mut delta = Delta::default();
        for d in log.iter().filter(|_| rng.random_bool(0.6)) {
            delta.join(d.clone());
        }
        // Any subset of the receiver's context is a valid announcement.
        let seen: CausalContext = receiver
            .context()
            .iter_dots()
            .filter(|_| rng.random_bool(0.7))
            .collect();
        let (filtered, changed) = without_seen(delta.clone(), &seen);
        filtered_cases += usize::from(changed);
        let mut x = receiver.fork(ReplicaId(98));
        let mut y = receiver.fork(ReplicaId(98));
        let ox = x
            .apply_remote(PeerId(9), delta, None, WALL)
            .expect("store")
            .expect("store");
        let oy = y
            .apply_remote(PeerId(9), filtered, None, WALL)
            .expect("store")
            .expect("store");
        assert_eq!(x.state(), y.state(), "case {case}: states differ");
        // Same keys (a key whose entries were all filtered out is found through the dot index,
        // so the order may differ).
        let (mut cx, mut cy) = (ox.changed.to_vec(), oy.changed.to_vec());
        cx.sort();
        cy.sort();
        assert_eq!(cx, cy, "case {case}: changed keys differ");
        let last = x.log_bounds().1.saturating_sub(1);
        let ix = x.log_interval(last, None, usize::MAX).expect("store");
        let last = y.log_bounds().1.saturating_sub(1);
        let iy = y.log_interval(last, None, usize::MAX).expect("store");
        assert_eq!(ix, iy, "case {case}: logged inflations differ");
    }
    assert!(
        filtered_cases >= 150,
        "only {filtered_cases} of 300 cases filtered anything"
    );
}

/// After a reconnect, a later-ranked sender filters what an earlier one already delivered.
#[test]
fn catch_up_is_not_sent_twice() {
    let cfg = ReplicaConfig {
        catch_up_stagger_ms: 1_000,
        have_after_changed_keys: 10,
        ..config()
    };
    let mut a = Node::new(0, &[1, 2], cfg.clone());
    let mut b = Node::new(1, &[0, 2], cfg.clone());
    let mut c = Node::new(2, &[0, 1], cfg);
    for (x, y) in [(0usize, 1usize), (0, 2), (1, 2)] {
        [&mut a, &mut b, &mut c][x].up(0, y as u64);
        [&mut a, &mut b, &mut c][y].up(0, x as u64);
    }
    run(&mut [&mut a, &mut b, &mut c], 0, 2_000);
    // C is cut off while A writes 50 keys that reach B.
    a.replica.peer_down(now(2_000), c.id);
    b.replica.peer_down(now(2_000), c.id);
    c.replica.peer_down(now(2_000), a.id);
    c.replica.peer_down(now(2_000), b.id);
    for i in 0..50 {
        a.write(2_000, &format!("key{i:02}"), "v");
    }
    run(&mut [&mut a, &mut b], 2_000, 3_000);
    for (x, y) in [(0usize, 2usize), (1, 2)] {
        [&mut a, &mut b, &mut c][x].up(3_000, y as u64);
        [&mut a, &mut b, &mut c][y].up(3_000, x as u64);
    }
    run(&mut [&mut a, &mut b, &mut c], 3_000, 8_000);
    assert_eq!(a.store.state(), c.store.state());
    let filtered = a.replica.stats().intervals_filtered + b.replica.stats().intervals_filtered;
    assert!(
        filtered >= 1,
        "the second sender must filter by C's announced context"
    );
}

/// Hostile or nonsensical messages (inverted intervals, extreme cursors and indices, foreign
/// logs, forged acks) never panic and never stop a replica from converging afterwards.
#[test]
fn hostile_messages_do_not_break_a_replica() {
    let (mut a, mut b) = pair();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let logs = [a.store.replica_id(), b.store.replica_id(), ReplicaId(42)];
    for i in 0..2_000u64 {
        let log = logs[rng.random_range(0..3)];
        let big = |rng: &mut ChaCha8Rng| match rng.random_range(0..4) {
            0 => 0,
            1 => u64::MAX,
            2 => rng.random_range(0..10),
            _ => rng.random(),
        };
        let msg = match rng.random_range(0..7) {
            0 => Message::Delta {
                epoch: big(&mut rng),
                log,
                from: big(&mut rng),
                end: big(&mut rng),
                delta: Delta::default(),
            },
            1 => Message::Ack {
                epoch: big(&mut rng),
                log,
                upto: big(&mut rng),
            },
            2 => Message::Hello {
                replica: log,
                epoch: big(&mut rng),
                resume: rng
                    .random_bool(0.5)
                    .then(|| (logs[rng.random_range(0..3)], big(&mut rng))),
            },
            3 => Message::ChunkAck {
                epoch: big(&mut rng),
                transfer: big(&mut rng),
                index: if rng.random_bool(0.5) {
                    u32::MAX
                } else {
                    rng.random_range(0..3)
                },
            },
            4 => Message::ChunkNack {
                epoch: big(&mut rng),
                transfer: big(&mut rng),
            },
            5 => Message::Chunk {
                epoch: big(&mut rng),
                log,
                transfer: big(&mut rng),
                index: if rng.random_bool(0.5) {
                    u32::MAX
                } else {
                    rng.random_range(0..3)
                },
                end: big(&mut rng),
                chunk: crate::model::StateChunk {
                    after: None,
                    upto: None,
                    entries: Vec::new(),
                    ctx: CausalContext::new(),
                    marks: Default::default(),
                    last: rng.random_bool(0.5),
                    dots: None,
                },
            },
            _ => Message::Have {
                replica: log,
                ctx: CausalContext::from_range(log, 1, rng.random_range(1..1_000)),
            },
        };
        let t = 3_000 + i;
        a.recv(t, b.id, msg.clone());
        b.recv(t, a.id, msg);
        let _ = (a.out(), b.out(), a.events(), b.events());
    }
    // Back to normal traffic: fresh connections and a write converge.
    a.up(6_000, 1);
    b.up(6_000, 0);
    a.write(6_000, "after", "1");
    b.write(6_000, "after2", "2");
    run(&mut [&mut a, &mut b], 6_000, 12_000);
    assert_eq!(a.store.state(), b.store.state());
    assert_eq!(a.store.entries().len(), 2);
    // Cursors pushed beyond the logs or into foreign logs were repaired (by transfers).
    let (a_log, b_log) = (a.store.replica_id(), b.store.replica_id());
    assert_eq!(
        b.store.peer_cursor(a.id),
        Some((a_log, a.store.log_bounds().1))
    );
    assert_eq!(
        a.store.peer_cursor(b.id),
        Some((b_log, b.store.log_bounds().1))
    );
}

/// Three settled nodes with compacted logs; a new node joins all three at once. It is
/// bootstrapped by exactly ONE state transfer, from ONE sender (the others, deferred by rank,
/// see its announced context covers their state and send `Covered`), and converges; later
/// writes reach it as deltas from everyone.
#[test]
fn a_new_node_is_bootstrapped_by_one_transfer_from_one_peer() {
    let cfg = ReplicaConfig {
        bootstrap_stagger_ms: 2_000,
        ..config()
    };
    let mut a = Node::new(0, &[1, 2], cfg.clone());
    let mut b = Node::new(1, &[0, 2], cfg.clone());
    let mut c = Node::new(2, &[0, 1], cfg.clone());
    for (x, y) in [(0usize, 1usize), (0, 2), (1, 2)] {
        [&mut a, &mut b, &mut c][x].up(0, y as u64);
        [&mut a, &mut b, &mut c][y].up(0, x as u64);
    }
    for i in 0..30 {
        [&mut a, &mut b, &mut c][i % 3].write(10, &format!("k{i}"), "v");
    }
    run(&mut [&mut a, &mut b, &mut c], 0, 4_000);
    assert!(
        a.store.log_bounds().0 > 0,
        "logs compacted: a transfer is needed"
    );
    let started =
        |n: &[&Node]| -> u64 { n.iter().map(|n| n.replica.stats().transfers_started).sum() };
    let before = started(&[&a, &b, &c]);
    let mut d = Node::new(3, &[], cfg);
    for x in 0..3usize {
        [&mut a, &mut b, &mut c][x].up(4_000, 3);
        d.up(4_000, x as u64);
    }
    run(&mut [&mut a, &mut b, &mut c, &mut d], 4_000, 12_000);
    assert_eq!(d.store.state(), a.store.state());
    assert_eq!(
        d.replica.stats().transfers_received,
        1,
        "one transfer received"
    );
    assert_eq!(started(&[&a, &b, &c]) - before, 1, "started by one sender");
    assert!(b.replica.stats().transfers_avoided + c.replica.stats().transfers_avoided >= 2);
    // Afterwards every sender serves it deltas (it has a cursor into each log).
    b.write(12_000, "late-b", "v");
    c.write(12_000, "late-c", "v");
    run(&mut [&mut a, &mut b, &mut c, &mut d], 12_000, 14_000);
    assert_eq!(d.store.state(), b.store.state());
    assert_eq!(d.replica.stats().transfers_received, 1);
}

/// A peer the membership layer declared down stops pinning the log after the grace period:
/// the survivors evict it and compact past entries it never acknowledged; it is not evicted
/// before the grace period.
#[test]
fn a_member_declared_down_is_evicted_after_the_grace_period() {
    let cfg = ReplicaConfig {
        member_down_grace_ms: 3_000,
        peer_evict_after_ms: 600_000,
        ..config()
    };
    let mut a = Node::new(0, &[1, 2], cfg.clone());
    let mut b = Node::new(1, &[0, 2], cfg.clone());
    let mut c = Node::new(2, &[0, 1], cfg);
    for (x, y) in [(0usize, 1usize), (0, 2), (1, 2)] {
        [&mut a, &mut b, &mut c][x].up(0, y as u64);
        [&mut a, &mut b, &mut c][y].up(0, x as u64);
    }
    run(&mut [&mut a, &mut b, &mut c], 0, 2_000);
    // c dies silently; SWIM declares it down at 2,000.
    a.replica.member_down(now(2_000), c.id);
    b.replica.member_down(now(2_000), c.id);
    for i in 0..10 {
        a.write(2_000, &format!("after{i}"), "v");
    }
    let end = a.store.log_bounds().1;
    run(&mut [&mut a, &mut b], 2_000, 4_500);
    assert_eq!(
        a.replica.stats().evictions,
        0,
        "not before the grace period"
    );
    assert!(a.store.log_bounds().0 < end, "c pins the log meanwhile");
    run(&mut [&mut a, &mut b], 4_500, 6_000);
    assert_eq!(a.replica.stats().evictions, 1);
    assert_eq!(
        a.store.log_bounds().0,
        end,
        "compacted past what c never acked"
    );
}

/// Three nodes settled: `a` (node 2) serves `b` (node 1) and `c` (node 0); `c`'s lower replica
/// id ranks `a` second among `b`'s bootstrappers, so a bootstrap of `b` by `a` is deferred by
/// one `bootstrap_stagger_ms` (here far longer than the test).
fn deferred_bootstrapper() -> (Node, Node, Node) {
    let cfg = ReplicaConfig {
        bootstrap_stagger_ms: 60_000,
        ..config()
    };
    let mut a = Node::new(2, &[0, 1], cfg.clone());
    let mut b = Node::new(1, &[2], cfg.clone());
    let mut c = Node::new(0, &[2], cfg);
    a.up(0, 0);
    a.up(0, 1);
    b.up(0, 2);
    c.up(0, 2);
    run(&mut [&mut a, &mut b, &mut c], 0, 2_000);
    assert_eq!(a.replica.peer_acked(b.id), Some(a.store.log_bounds().1));
    (a, b, c)
}

/// A Hello without a cursor that arrives late (sent before the peer had a cursor into our log,
/// held up by the network) defers the peer's bootstrap by our rank. The peer's next Hello
/// reports its cursor after all: it is served deltas at once and stops pinning the log, not
/// held back until the obsolete deferral runs out (the simulation found a log that did not
/// drain within 10 s of convergence this way).
#[test]
fn a_late_hello_without_cursor_does_not_hold_back_a_peer_that_reports_one() {
    let (mut a, mut b, mut c) = deferred_bootstrapper();
    for i in 0..3 {
        a.write(2_000, &format!("k{i}"), "v");
    }
    let stale = Message::Hello {
        replica: b.store.replica_id(),
        epoch: b.epoch,
        resume: None,
    };
    a.recv(2_000, b.id, stale);
    // A answers with a Hello; B's reply reports its cursor into A's log.
    run(&mut [&mut a, &mut b, &mut c], 2_000, 4_000);
    assert_eq!(
        a.replica.peer_acked(b.id),
        Some(a.store.log_bounds().1),
        "B is served the new entries"
    );
    assert_eq!(a.store.log_len(), 0, "A's log drained");
    assert_eq!(b.store.state(), a.store.state());
}

/// As above, but what shows that the peer has a cursor is its Ack of the interval that was in
/// flight when the late Hello arrived (A's Hello to it is lost): later entries still reach it
/// at once.
#[test]
fn an_ack_after_a_late_hello_without_cursor_ends_the_bootstrap_deferral() {
    let (mut a, mut b, mut c) = deferred_bootstrapper();
    a.write(2_000, "k0", "v");
    a.tick(2_600);
    let interval: Vec<Transmit> = a
        .out()
        .into_iter()
        .filter(|t| t.to == b.id && matches!(t.msg, Message::Delta { .. }))
        .collect();
    assert_eq!(interval.len(), 1, "the interval to B is in flight");
    for t in interval {
        b.recv(2_601, a.id, t.msg);
    }
    let acks = b.out();
    let stale = Message::Hello {
        replica: b.store.replica_id(),
        epoch: b.epoch,
        resume: None,
    };
    a.recv(2_602, b.id, stale);
    a.out(); // A's Hello to B is lost
    for t in acks {
        a.recv(2_603, b.id, t.msg);
    }
    assert_eq!(a.replica.peer_acked(b.id), Some(a.store.log_bounds().1));
    a.write(2_700, "k1", "v");
    run(&mut [&mut a, &mut b, &mut c], 2_700, 4_700);
    assert_eq!(
        a.replica.peer_acked(b.id),
        Some(a.store.log_bounds().1),
        "B is served the later entry"
    );
    assert_eq!(a.store.log_len(), 0, "A's log drained");
    assert_eq!(b.store.state(), a.store.state());
}
