//! Convergence over real QUIC on 127.0.0.1 with mutual TLS: 3–5 embedded nodes in one process,
//! random concurrent writes, partitions and heals (through the fault-injecting socket), restarts
//! on the same directory and a wipe. Pass: every node identical (context and values) and equal
//! to the oracle over acknowledged writes.

use crate::net_support;

use net_support::{Cluster, all_keys, rng, seed, soak};
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tidemark::{Key, KeyKind, Op, Value};

/// What acknowledged writes must leave: counters add up, set adds are kept (no removals).
#[derive(Default)]
struct Oracle {
    hits: u64,
    per_node: BTreeMap<String, u64>,
    seen: BTreeSet<String>,
}

impl Oracle {
    fn expected(&self) -> Vec<(Key, Value)> {
        let mut out = vec![(
            Key::new(KeyKind::GCounter, "hits"),
            Value::GCounter(self.hits),
        )];
        for (k, v) in &self.per_node {
            out.push((Key::new(KeyKind::PNCounter, k), Value::PNCounter(*v as i64)));
        }
        out.push((
            Key::new(KeyKind::ORSet, "seen"),
            Value::ORSet(self.seen.iter().cloned().collect()),
        ));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// One seeded run: `rounds` of concurrent writes on every node under random datagram loss,
/// duplication and delay, each round under a random partition (full split, one-way, ring or
/// none); with `restarts`, also restarts and one wipe. Returns the convergence time after the
/// final heal.
async fn scenario(seed: u64, rounds: usize, restarts: bool) -> Duration {
    let mut rng = rng(seed);
    let n = 3 + (seed % 3) as usize;
    let mut cluster = Cluster::start(n, seed).await;
    let (drop, dup, delay) = (
        rng.random_range(0..60),
        rng.random_range(0..30),
        rng.random_range(0..20),
    );
    for m in &cluster.members {
        m.faults.set_random(drop, dup, delay);
    }
    let mut oracle = Oracle::default();
    let wipe_round = if restarts {
        rng.random_range(1..rounds - 1)
    } else {
        usize::MAX
    };
    for round in 0..rounds {
        cluster.heal();
        let all: Vec<usize> = (0..n).collect();
        match rng.random_range(0..4) {
            0 => {}
            1 => {
                let cut = rng.random_range(1..n);
                cluster.partition(&all[..cut], &all[cut..]);
            }
            2 => {
                // One-way: a node's datagrams to another are lost, not the way back.
                let (a, b) = (rng.random_range(0..n), rng.random_range(0..n));
                if a != b {
                    let to = cluster.members[b].addr;
                    cluster.members[a].faults.block(to);
                }
            }
            _ => {
                // Ring: each node reaches only its two neighbours.
                for i in 0..n {
                    for j in 0..n {
                        let near = (i + 1) % n == j || (j + 1) % n == i;
                        if i != j && !near {
                            let to = cluster.members[j].addr;
                            cluster.members[i].faults.block(to);
                        }
                    }
                }
            }
        }
        // Concurrent writes on every node.
        let mut tasks = Vec::new();
        for (i, m) in cluster.members.iter().enumerate() {
            let writes: Vec<(u64, String, u64)> = (0..rng.random_range(3..8))
                .map(|_| {
                    (
                        rng.random_range(1..5),
                        format!("r{round}-n{i}-{}", rng.random_range(0..1_000_000)),
                        rng.random_range(1..3),
                    )
                })
                .collect();
            let node = m.node.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for (by, elem, pn) in writes {
                    let ops = vec![
                        Op::inc_gcounter("hits", by),
                        Op::add("seen", elem.clone()),
                        Op::inc_pncounter(&format!("pn-n{i}"), pn),
                    ];
                    node.apply_batch(ops).await.expect("acknowledged write");
                    acked.push((by, elem, pn));
                }
                (i, acked)
            }));
        }
        for t in tasks {
            let (i, acked) = t.await.expect("writer task");
            for (by, elem, pn) in acked {
                oracle.hits += by;
                oracle
                    .seen
                    .insert(serde_json::Value::from(elem).to_string());
                *oracle.per_node.entry(format!("pn-n{i}")).or_default() += pn;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
        if round == wipe_round {
            // A wipe loses only what no other node has: converge first so the oracle holds.
            cluster.heal();
            cluster.converge(Duration::from_secs(20)).await;
            let i = rng.random_range(0..n);
            eprintln!("round {round}: wipe n{i}");
            cluster.restart(i, true).await;
        } else if restarts && rng.random_bool(0.4) {
            let i = rng.random_range(0..n);
            eprintln!("round {round}: restart n{i}");
            cluster.restart(i, false).await;
        }
    }
    cluster.heal();
    let took = cluster.converge(Duration::from_secs(10)).await;
    let expected = oracle.expected();
    for m in &cluster.members {
        assert_eq!(all_keys(&m.node), expected, "{:?}", m.node.net_status());
    }
    cluster.shutdown().await;
    took
}

fn report(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let p99 = times[(times.len() * 99 / 100).min(times.len() - 1)];
    eprintln!(
        "{what}: convergence after the final heal over {} runs: p50 {:?}, p99 {:?}, max {:?}",
        times.len(),
        times[times.len() / 2],
        p99,
        times[times.len() - 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_converge_over_quic_through_partitions_restarts_and_a_wipe() {
    let seed = seed("net_sync restarts");
    let runs = if soak() { 20 } else { 3 };
    let mut times = Vec::new();
    for k in 0..runs {
        let s = seed.wrapping_add(k);
        eprintln!("run {k}: SEED={s}");
        times.push(scenario(s, 5, true).await);
    }
    report("restarts and a wipe", times);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_converge_over_quic_under_seeded_loss_duplication_delay_and_partitions() {
    let seed = seed("net_sync faults");
    let runs = if soak() { 200 } else { 20 };
    let mut times = Vec::new();
    for k in 0..runs {
        let s = seed.wrapping_add(1_000 + k);
        eprintln!("run {k}: SEED={s}");
        times.push(scenario(s, 3, false).await);
    }
    report("seeded faults", times);
}
