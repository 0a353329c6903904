//! Receive cost of a delta versus the size of the state (the goal: the CPU
//! cost of receiving a delta is proportional to the delta, not to the state, at 10k and 1M keys).
//!
//! For each state size, a replica holding N keys receives the same kind of small remote delta
//! (10 keys: counter increments, set adds and one set remove found through the dot index) and
//! the mean time per received delta is printed, for the in-memory store (`crdts::Store`) and for
//! the durable redb store (`RedbStore::apply_remote`, relaxed durability so the disk's fsync
//! does not dominate). Run: `cargo bench --bench receive_cost` (`RECEIVE_KEYS_MAX` caps N).
use std::time::Instant;
use tidemark::config::{Durability, Limits};
use tidemark::crdts::{Key, KeyKind, Mutation, ReplicaId, Store};
use tidemark::model::Delta;
use tidemark::proto::{PeerId, StateStore};
use tidemark::store::{LocalWrite, OpenOptions, RedbStore};

const DELTA_KEYS: usize = 10;
const ROUNDS: usize = 200;

fn state_ops(n: usize) -> Vec<(Key, Mutation)> {
    (0..n)
        .map(|i| match i % 2 {
            0 => (
                Key::new(KeyKind::GCounter, format!("c{i:08}")),
                Mutation::Inc(1),
            ),
            _ => (
                Key::new(KeyKind::ORSet, format!("s{i:08}")),
                Mutation::Add(format!("\"e{i}\"")),
            ),
        })
        .collect()
}

/// A remote replica's deltas: each touches DELTA_KEYS keys spread over the key space.
fn remote_deltas(n: usize, writer: ReplicaId, base: &Store) -> Vec<Delta> {
    let mut remote = base.clone();
    (0..ROUNDS)
        .map(|r| {
            let mut delta = Delta::default();
            for k in 0..DELTA_KEYS {
                let i = (r * 7919 + k * 104_729) % n;
                let (key, m) = if k == 0 && i % 2 == 1 {
                    // A remove: the receiver finds the element's key through its dot index.
                    (
                        Key::new(KeyKind::ORSet, format!("s{i:08}")),
                        Mutation::Remove(format!("\"e{i}\"")),
                    )
                } else if i % 2 == 0 {
                    (
                        Key::new(KeyKind::GCounter, format!("c{i:08}")),
                        Mutation::Inc(1),
                    )
                } else {
                    (
                        Key::new(KeyKind::ORSet, format!("s{i:08}")),
                        Mutation::Add(format!("\"r{r}\"")),
                    )
                };
                if let Ok(d) = remote.mutate(writer, &key, &m, None) {
                    delta.state.join(d);
                }
            }
            delta
        })
        .collect()
}

fn main() {
    let max: usize = std::env::var("RECEIVE_KEYS_MAX")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let origin = ReplicaId(1);
    let writer = ReplicaId(2);
    println!(
        "| keys in state | in-memory µs/delta | in-memory full scan µs | redb µs/delta | redb full scan µs |"
    );
    println!("|---|---|---|---|---|");
    for n in [10_000usize, 100_000, 1_000_000]
        .into_iter()
        .filter(|n| *n <= max)
    {
        // Build the base state once, at the origin replica.
        let mut base = Store::new();
        for (key, m) in state_ops(n) {
            base.mutate(origin, &key, &m, None).expect("valid op");
        }
        let deltas = remote_deltas(n, writer, &base);

        let mut mem = base.clone();
        let started = Instant::now();
        for d in deltas.iter().cloned() {
            mem.apply(d.state);
        }
        let mem_us = started.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;
        // The O(state) reference: one pass over every entry.
        let started = Instant::now();
        let live: usize = mem
            .entries()
            .values()
            .map(|e| usize::from(!e.value().eq(&tidemark::Value::GCounter(0))))
            .sum();
        let mem_scan_us = started.elapsed().as_secs_f64() * 1e6;
        assert!(live > 0);

        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = RedbStore::open(
            dir.path(),
            OpenOptions {
                limits: Limits::default(),
                durability: Durability::Relaxed,
                new_replica_id: Some(origin),
            },
        )
        .expect("open");
        for chunk in state_ops(n).chunks(20_000) {
            let writes: Vec<LocalWrite> = chunk
                .iter()
                .map(|(k, m)| LocalWrite {
                    ops: vec![(k.clone(), m.clone())],
                    event: None,
                    stamps: Vec::new(),
                    late: None,
                    own_dots: false,
                })
                .collect();
            store.commit_local(&writes, 0).expect("commit");
        }
        let started = Instant::now();
        for d in deltas.iter().cloned() {
            store
                .apply_remote(PeerId(9), d, None, 0)
                .expect("storage")
                .expect("valid delta");
        }
        let redb_us = started.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;
        let started = Instant::now();
        let rows = store.reader().entries().expect("scan").len();
        let redb_scan_us = started.elapsed().as_secs_f64() * 1e6;
        assert!(rows > n / 2, "the scan read the state");
        println!("| {n} | {mem_us:.1} | {mem_scan_us:.0} | {redb_us:.1} | {redb_scan_us:.0} |");
    }
}
