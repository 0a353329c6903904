//! Convergence over real QUIC on 127.0.0.1 with mutual TLS: 3–5 embedded nodes in one process,
//! random concurrent writes, partitions and heals (through the fault-injecting socket), restarts
//! on the same directory and a wipe. Pass: every node identical (context and values) and equal
//! to the oracle over acknowledged writes.

mod net_support;

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

async fn scenario(seed: u64) -> Duration {
    let mut rng = rng(seed);
    let n = 3 + (seed % 3) as usize;
    let mut cluster = Cluster::start(n, seed).await;
    let mut oracle = Oracle::default();
    let wipe_round = rng.random_range(1..4);
    for round in 0..5 {
        // A random split of the cluster (or none) for this round.
        if rng.random_bool(0.6) {
            let cut = rng.random_range(1..n);
            let all: Vec<usize> = (0..n).collect();
            cluster.partition(&all[..cut], &all[cut..]);
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
        } else if rng.random_bool(0.4) {
            let i = rng.random_range(0..n);
            eprintln!("round {round}: restart n{i}");
            cluster.restart(i, false).await;
        }
    }
    cluster.heal();
    let took = cluster.converge(Duration::from_secs(20)).await;
    let expected = oracle.expected();
    for m in &cluster.members {
        assert_eq!(all_keys(&m.node), expected, "{:?}", m.node.net_status());
    }
    cluster.shutdown().await;
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_converge_over_quic_through_partitions_restarts_and_a_wipe() {
    let seed = seed("net_sync");
    let runs = if soak() { 10 } else { 2 };
    let mut times = Vec::new();
    for k in 0..runs {
        let s = seed.wrapping_add(k);
        eprintln!("run {k}: SEED={s}");
        times.push(scenario(s).await);
    }
    times.sort();
    eprintln!("convergence after the final heal: {times:?}");
}
