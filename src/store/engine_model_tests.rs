//! The storage engine against an in-memory reference, through its whole life: random local
//! groups, remote joins, checkpoints, compactions, clean reopens, and crashes after which the
//! store goes on from the crash copy (a `kill -9`: the log as the page cache holds it; a power
//! loss: the log cut where it was last synced). After every step each key reads exactly what
//! the reference `tidemark_crdts::Store` holds, the causal contexts are equal, dedup answers
//! match a model of the marks, and `verify()` holds. A crash keeps every acknowledged write in
//! immediate durability; in relaxed durability a power loss rewinds to the last synced step,
//! never to a state in between, and writing goes on from there with no dot issued twice with
//! two contents (the reference would then disagree on the context or a value).

use super::test_rng::Rng;
use super::{DB_FILE, DeltasSince, EventId, LocalWrite, OpenOptions, RedbStore, WAL_FILE};
use crate::proto::StateStore;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tidemark_crdts::{Key, KeyKind, Mutation, ReplicaId, Store, Timestamp, Value};

const ME: ReplicaId = ReplicaId(21);
const PEER: ReplicaId = ReplicaId(22);

/// What the store must hold: the reference state, the dedup marks, the keys ever written.
#[derive(Clone, Default)]
struct Model {
    state: Store,
    seen: BTreeMap<u64, BTreeSet<u64>>,
}

/// A random op on a few hot keys; `local` ops may touch registers written with timestamps.
fn op(rng: &mut Rng, local: bool) -> (Key, Mutation) {
    let hot = rng.below(3);
    let set = || Key::new(KeyKind::ORSet, format!("s{hot}"));
    match rng.below(if local { 11 } else { 8 }) {
        0 | 1 => (
            Key::new(KeyKind::GCounter, format!("g{hot}")),
            Mutation::Inc(1 + rng.below(5)),
        ),
        2 => (
            Key::new(KeyKind::PNCounter, format!("p{hot}")),
            if rng.below(2) == 0 {
                Mutation::Inc(1 + rng.below(5))
            } else {
                Mutation::Dec(1 + rng.below(5))
            },
        ),
        3 | 4 => (set(), Mutation::Add(format!("\"e{}\"", rng.below(12)))),
        5 => (set(), Mutation::Remove(format!("\"e{}\"", rng.below(12)))),
        6 => (
            Key::new(KeyKind::MvReg, format!("m{hot}")),
            Mutation::Set(rng.below(100).to_string()),
        ),
        7 => (set(), Mutation::Delete),
        8 => (Key::new(KeyKind::Lww, format!("l{hot}")), Mutation::Delete),
        _ => (
            Key::new(KeyKind::Lww, format!("l{hot}")),
            Mutation::Set(rng.below(100).to_string()),
        ),
    }
}

fn options(durability: crate::Durability, replica: ReplicaId) -> OpenOptions {
    OpenOptions {
        new_replica_id: Some(replica),
        durability,
        ..OpenOptions::default()
    }
}

/// Copies the store's two files to `to`, the log cut at `log_len` when given.
fn crash_copy(from: &Path, to: &Path, log_len: Option<u64>) {
    std::fs::create_dir_all(to).expect("mkdir");
    std::fs::copy(from.join(DB_FILE), to.join(DB_FILE)).expect("copy db");
    std::fs::copy(from.join(WAL_FILE), to.join(WAL_FILE)).expect("copy log");
    if let Some(len) = log_len {
        std::fs::OpenOptions::new()
            .write(true)
            .open(to.join(WAL_FILE))
            .expect("open log copy")
            .set_len(len)
            .expect("cut");
    }
}

/// Every written key reads what the model holds; contexts agree; the invariants hold.
fn check(store: &RedbStore, model: &Model, keys: &BTreeSet<Key>, what: &str) {
    let reader = store.reader();
    for key in keys {
        let got = reader
            .get(key)
            .expect("read")
            .unwrap_or_else(|| Value::empty(key.kind));
        assert_eq!(got, model.state.get(key), "{what}: {key}");
    }
    assert_eq!(store.ctx(), model.state.context(), "{what}: context");
    store.verify().expect("store invariants");
}

fn run(durability: crate::Durability, seed: u64) {
    let mut rng = Rng(seed);
    let root = tempfile::tempdir().expect("tempdir");
    let mut dir: PathBuf = root.path().join("live0");
    let mut store = RedbStore::open(&dir, options(durability, ME)).expect("open");
    let mut peer = RedbStore::open_with_backend(
        redb::backends::InMemoryBackend::new(),
        options(crate::Durability::Immediate, PEER),
    )
    .expect("peer");
    let mut model = Model::default();
    // The model at the last step after which nothing was unsynced, and the log's length then.
    let mut synced = (model.clone(), crate::codec::wal::FILE_HEADER as u64);
    let mut keys = BTreeSet::new();
    let mut next_seq: BTreeMap<u64, u64> = BTreeMap::new();
    let mut lww_ms = 1u64;
    let (mut crashes, mut power_losses, mut rewound) = (0, 0, 0);
    for step in 0..160u64 {
        let wall = 1_000_000 + step;
        let what = format!("seed {seed:#x}, {durability:?}, step {step}");
        match rng.below(16) {
            0 => store.checkpoint().expect("checkpoint"),
            1 => {
                let (_, end) = store.log_bounds();
                store.compact(end.saturating_sub(2)).expect("compact");
            }
            2 => store.sync().expect("sync"),
            3 => {
                drop(store);
                store = RedbStore::open(&dir, options(durability, ME)).expect("clean reopen");
            }
            4 | 5 => {
                // A crash, then the store goes on from what the crash left.
                let power_loss = rng.below(2) == 0;
                let next = root.path().join(format!("live{}", step + 1));
                crash_copy(&dir, &next, power_loss.then_some(synced.1));
                // The crashed process's store is gone with its directory (dropping it
                // would checkpoint the old directory, which nothing reads again).
                drop(store);
                let _ = std::fs::remove_dir_all(&dir);
                dir = next;
                store = RedbStore::open(&dir, options(durability, ME)).expect("crash copy opens");
                if power_loss {
                    power_losses += 1;
                    if model.state.context() != synced.0.state.context() {
                        rewound += 1;
                    }
                    model = synced.0.clone();
                } else {
                    crashes += 1;
                }
            }
            6 | 7 => {
                let n = 1 + rng.below(4);
                let mut writes = Vec::new();
                for _ in 0..n {
                    let (key, m) = op(&mut rng, false);
                    keys.insert(key.clone());
                    writes.push(LocalWrite {
                        ops: vec![(key, m)],
                        ..LocalWrite::default()
                    });
                }
                peer.commit_local(&writes, wall).expect("peer commit");
                let delta = match peer.deltas_since(store.ctx(), 1 << 20).expect("deltas") {
                    DeltasSince::Deltas { delta, .. } => delta,
                    DeltasSince::NeedsStateTransfer => panic!("the peer's log is whole"),
                };
                model.state.apply(delta.state.clone());
                store
                    .apply_remote_delta(crate::proto::PeerId(22), delta, wall)
                    .expect("storage")
                    .expect("a valid delta");
            }
            _ => {
                let n = 1 + rng.below(25);
                let mut writes = Vec::new();
                for _ in 0..n {
                    let source = rng.below(3);
                    let next = next_seq.entry(source).or_insert(0);
                    // One in five retries the source's last event.
                    if *next == 0 || rng.below(5) != 0 {
                        *next += 1;
                    }
                    let ops = (0..1 + rng.below(3)).map(|_| op(&mut rng, true)).collect();
                    writes.push(LocalWrite {
                        ops,
                        event: Some(EventId {
                            stream: "s".into(),
                            source: format!("src{source}"),
                            seq: *next,
                        }),
                        ..LocalWrite::default()
                    });
                }
                let out = store.commit_local(&writes, wall).expect("commit");
                assert!(out.refused.is_empty(), "{what}: refused {:?}", out.refused);
                for (w, dup) in writes.iter().zip(&out.duplicate) {
                    let Some(ev) = &w.event else { continue };
                    let source = ev.source[3..].parse::<u64>().expect("source");
                    let fresh = model.seen.entry(source).or_default().insert(ev.seq);
                    assert_eq!(*dup, !fresh, "{what}: dedup of {ev:?}");
                    if *dup {
                        continue;
                    }
                    for (key, m) in &w.ops {
                        let ts = (key.kind == KeyKind::Lww).then(|| {
                            lww_ms += 1;
                            Timestamp {
                                physical_ms: lww_ms,
                                logical: 0,
                                replica: ME,
                            }
                        });
                        model.state.mutate(ME, key, m, ts).expect("model applies");
                        keys.insert(key.clone());
                    }
                }
            }
        }
        check(&store, &model, &keys, &what);
        if !store.unsynced() {
            let len = crate::codec::wal::FILE_HEADER as u64 + store.wal_pending_bytes();
            synced = (model.clone(), len);
        }
    }
    assert!(crashes > 0 && power_losses > 0, "both kinds of crash ran");
    if durability == crate::Durability::Relaxed {
        assert!(rewound > 0, "some power loss lost unsynced writes");
    }
    drop(store);
    let store = RedbStore::open(&dir, options(durability, ME)).expect("final reopen");
    check(&store, &model, &keys, "after the last clean reopen");
}

#[test]
fn the_engine_matches_the_reference_through_crashes_checkpoints_and_reopens() {
    let seeds: Vec<u64> = match std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => vec![0xE61, 0xE62, 0xE63],
    };
    for seed in seeds {
        run(crate::Durability::Immediate, seed);
        run(crate::Durability::Relaxed, seed);
    }
}
