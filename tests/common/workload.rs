//! A random workload of ops and events with an independent model of the values it must leave
//! (one replica, so every type's value follows its sequential specification).

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use tidemark::ops::{validate_events, validate_ops};
use tidemark::proto::PeerId;
use tidemark::store::{DeltasSince, LocalWrite, OpenOptions, RedbStore, StoreError};
use tidemark::{Event, Key, KeyKind, Limits, Op, ReplicaId, Value};

pub const ME: ReplicaId = ReplicaId(0xA11CE);
pub const PEER: ReplicaId = ReplicaId(0xB0B);
pub const STREAM: &str = "ev";
pub const WALL0: u64 = 1_700_000_000_000;

/// Expected values of every key (empty values left out) and the events applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    pub values: BTreeMap<Key, Value>,
    pub seen: BTreeSet<(String, u64)>,
}

fn canonical(v: Option<&serde_json::Value>) -> String {
    v.map(serde_json::Value::to_string).unwrap_or_default()
}

impl Model {
    pub fn apply_op(&mut self, op: &Op) {
        let kind = KeyKind::parse(&op.kind).expect("valid kind");
        let key = Key::new(kind, op.key.clone());
        let cur = self
            .values
            .remove(&key)
            .unwrap_or_else(|| Value::empty(kind));
        let by = op.by.unwrap_or(1);
        let text = canonical(op.value.as_ref());
        let new = match (cur, op.op.as_str()) {
            (Value::GCounter(n), "inc") => Value::GCounter(n + by),
            (Value::PNCounter(n), "inc") => Value::PNCounter(n + i64::try_from(by).expect("small")),
            (Value::PNCounter(n), "dec") => Value::PNCounter(n - i64::try_from(by).expect("small")),
            (Value::ORSet(v), "add" | "remove") => {
                let mut set: BTreeSet<String> = v.into_iter().collect();
                if op.op == "add" {
                    set.insert(text);
                } else {
                    set.remove(&text);
                }
                Value::ORSet(set.into_iter().collect())
            }
            (Value::Lww(_), "set") => Value::Lww(Some(text)),
            (Value::MvReg(_), "set") => Value::MvReg(vec![text]),
            (_, "delete") => Value::empty(kind),
            (cur, other) => panic!("model: {other} on {cur:?}"),
        };
        if new != Value::empty(kind) {
            self.values.insert(key, new);
        }
    }

    pub fn apply_events(&mut self, events: &[Event]) {
        for ev in events {
            if self.seen.insert((ev.source.clone(), ev.seq)) {
                for op in &ev.ops {
                    self.apply_op(op);
                }
            }
        }
    }
}

pub fn random_op(rng: &mut ChaCha8Rng) -> Op {
    let n = rng.random_range(0..3);
    match rng.random_range(0..10) {
        0 | 1 => Op::inc_gcounter(&format!("g{n}"), rng.random_range(1..100)),
        2 => Op::inc_pncounter(&format!("p{n}"), rng.random_range(1..100)),
        3 => Op::dec_pncounter(&format!("p{n}"), rng.random_range(1..100)),
        4 | 5 => Op::add(&format!("s{n}"), rng.random_range(0..12u64)),
        6 => Op::remove(&format!("s{n}"), rng.random_range(0..12u64)),
        7 => {
            // Sometimes a large value, so commits span many pages and grow the file.
            let len = if rng.random_bool(0.3) {
                rng.random_range(1_000..40_000)
            } else {
                rng.random_range(1..20)
            };
            let c = char::from(b'a' + rng.random_range(0..26u8));
            Op::set_lww(&format!("r{n}"), c.to_string().repeat(len))
        }
        8 => Op::set_mvreg(&format!("m{n}"), rng.random_range(0..1000u64)),
        _ => {
            let kind = [KeyKind::ORSet, KeyKind::Lww, KeyKind::MvReg][n];
            let name = match kind {
                KeyKind::ORSet => "s",
                KeyKind::Lww => "r",
                _ => "m",
            };
            Op::delete(kind, &format!("{name}{}", rng.random_range(0..3)))
        }
    }
}

pub fn random_events(rng: &mut ChaCha8Rng) -> Vec<Event> {
    (0..rng.random_range(1..6))
        .map(|_| Event {
            source: format!("src{}", rng.random_range(0..3)),
            seq: rng.random_range(1..=40),
            ops: (0..rng.random_range(1..4))
                .map(|_| random_op(rng))
                .collect(),
            ..Default::default()
        })
        .collect()
}

/// Reads every value of a store (empty values left out).
pub fn values_of(store: &RedbStore) -> BTreeMap<Key, Value> {
    store
        .reader()
        .entries()
        .expect("entries")
        .into_iter()
        .map(|(k, e)| (k, e.value()))
        .filter(|(k, v)| *v != Value::empty(k.kind))
        .collect()
}

/// One caller's part of a commit group.
#[derive(Clone, Debug)]
pub enum Part {
    /// Plain ops (`apply_batch`).
    Ops(Vec<Op>),
    /// Events of [`STREAM`] (`ingest`).
    Events(Vec<Event>),
}

/// One step of a workload on a store.
#[derive(Clone, Debug)]
pub enum Action {
    /// One commit group of several callers' writes.
    Commit(Vec<Part>),
    /// Compaction of the whole delta log.
    Compact,
    /// A forced durable commit.
    Sync,
    /// The peer commits these ops, then its deltas are joined here.
    Remote(Vec<Op>),
}

impl Action {
    /// A random step.
    pub fn random(rng: &mut ChaCha8Rng) -> Action {
        match rng.random_range(0..20) {
            0..=13 => Action::Commit(
                (0..rng.random_range(1..4))
                    .map(|_| {
                        if rng.random_bool(0.5) {
                            Part::Events(random_events(rng))
                        } else {
                            Part::Ops(
                                (0..rng.random_range(1..8))
                                    .map(|_| random_op(rng))
                                    .collect(),
                            )
                        }
                    })
                    .collect(),
            ),
            14 | 15 => Action::Compact,
            16 => Action::Sync,
            _ => Action::Remote(
                (0..rng.random_range(1..5))
                    .map(|_| {
                        if rng.random_bool(0.5) {
                            Op::inc_gcounter("peer/g", rng.random_range(1..10))
                        } else {
                            Op::add("peer/s", rng.random_range(0..50u64))
                        }
                    })
                    .collect(),
            ),
        }
    }

    /// A short name.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Commit(_) => "commit",
            Action::Compact => "compact",
            Action::Sync => "sync",
            Action::Remote(_) => "remote",
        }
    }

    /// The commit-group writes of a `Commit`.
    pub fn writes(parts: &[Part]) -> Vec<LocalWrite> {
        let limits = Limits::default();
        let mut writes = Vec::new();
        for part in parts {
            match part {
                Part::Ops(ops) => writes.extend(validate_ops(ops, &limits).expect("valid ops")),
                Part::Events(events) => {
                    writes.extend(validate_events(STREAM, events, &limits).expect("valid events"));
                }
            }
        }
        writes
    }

    /// Runs the step on `store` (the peer commits first for `Remote`).
    ///
    /// # Errors
    /// The store's error.
    pub fn execute(
        &self,
        store: &mut RedbStore,
        peer: &mut Peer,
        wall: u64,
    ) -> Result<(), StoreError> {
        match self {
            Action::Commit(parts) => store.commit_local(&Self::writes(parts), wall).map(|_| ()),
            Action::Compact => store.compact(u64::MAX).map(|_| ()),
            Action::Sync => store.sync(),
            Action::Remote(ops) => {
                let limits = Limits::default();
                peer.store
                    .commit_local(&validate_ops(ops, &limits).expect("valid"), wall)
                    .expect("peer commit");
                for op in ops {
                    peer.model.apply_op(op);
                }
                let DeltasSince::Deltas { delta, more } = peer
                    .store
                    .deltas_since(store.ctx(), usize::MAX)
                    .expect("deltas since")
                else {
                    panic!("the peer never compacts")
                };
                assert!(!more);
                store
                    .apply_remote_delta(PeerId(2), delta, wall)
                    .map(|r| r.expect("a valid delta"))
                    .map(|_| ())
            }
        }
    }

    /// What the step does to the model (after [`Action::execute`], which moves the peer).
    pub fn apply(&self, model: &mut Model, peer: &Peer) {
        match self {
            Action::Commit(parts) => {
                for part in parts {
                    match part {
                        Part::Ops(ops) => ops.iter().for_each(|op| model.apply_op(op)),
                        Part::Events(events) => model.apply_events(events),
                    }
                }
            }
            Action::Compact | Action::Sync => {}
            Action::Remote(_) => {
                for (k, v) in &peer.model.values {
                    model.values.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// A second replica whose deltas the store under test joins.
pub struct Peer {
    /// Its store (in memory).
    pub store: RedbStore,
    /// Its values.
    pub model: Model,
}

impl Peer {
    /// A fresh peer with replica id [`PEER`].
    pub fn new() -> Self {
        Self {
            store: RedbStore::open_with_backend(
                redb::backends::InMemoryBackend::new(),
                OpenOptions {
                    new_replica_id: Some(PEER),
                    ..OpenOptions::default()
                },
            )
            .expect("open peer"),
            model: Model::default(),
        }
    }
}
