//! Embedded nodes syncing in one process through the real protocol core, codec and redb store:
//! offline writes, connect/disconnect cycles, restarts, exact converged values.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::{Duration, Instant};
use tidemark::{Key, KeyKind, Node, NodeConfig, Op, Value};

use crate::common;

fn seed() -> u64 {
    common::seed("embedded_sync")
}

async fn converge(nodes: &[Node]) {
    let started = Instant::now();
    loop {
        let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
        if ctxs.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no convergence within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn all_keys(node: &Node) -> Vec<(Key, Value)> {
    KeyKind::ALL
        .iter()
        .flat_map(|k| node.list(*k, "", None, 10_000).expect("list"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_writes_across_partitions_and_restarts_converge_to_exact_values() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let root = tempfile::tempdir().expect("tempdir");
    let dirs: Vec<_> = (0..3).map(|i| root.path().join(format!("n{i}"))).collect();
    let mut nodes = Vec::new();
    for d in &dirs {
        nodes.push(Node::open(NodeConfig::new(d)).await.expect("open"));
    }
    let mut expected_counter = 0u64;
    let mut added: std::collections::BTreeSet<String> = Default::default();
    for round in 0..6 {
        // Random topology this round: each pair connected with probability 1/2.
        for i in 0..3 {
            for j in i + 1..3 {
                if rng.random_bool(0.5) {
                    nodes[i].connect(&nodes[j]).expect("connect");
                } else {
                    nodes[i].disconnect(&nodes[j]).expect("disconnect");
                }
            }
        }
        for _ in 0..20 {
            let n = rng.random_range(0..3);
            let by = rng.random_range(1..5u64);
            expected_counter += by;
            let elem = format!("r{round}-{}", rng.random_range(0..1000));
            added.insert(serde_json::Value::from(elem.clone()).to_string());
            nodes[n]
                .apply_batch(vec![Op::inc_gcounter("hits", by), Op::add("seen", elem)])
                .await
                .expect("write");
        }
        // Restart one node (clean shutdown) in some rounds: it must resume, not lose anything.
        if rng.random_bool(0.3) {
            let n = rng.random_range(0..3);
            nodes[n].shutdown().await.expect("shutdown");
            nodes[n] = Node::open(NodeConfig::new(&dirs[n])).await.expect("reopen");
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..150))).await;
    }
    for i in 0..3 {
        for j in i + 1..3 {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
    }
    converge(&nodes).await;
    let reference = all_keys(&nodes[0]);
    for n in &nodes[1..] {
        assert_eq!(all_keys(n), reference);
    }
    assert_eq!(
        nodes[0]
            .get(&Key::new(KeyKind::GCounter, "hits"))
            .expect("get"),
        Value::GCounter(expected_counter)
    );
    assert_eq!(
        nodes[0]
            .get(&Key::new(KeyKind::ORSet, "seen"))
            .expect("get"),
        Value::ORSet(added.into_iter().collect())
    );
    for n in &nodes {
        n.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_resumes_with_deltas_not_a_state_transfer() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = Node::open(NodeConfig::new(root.path().join("a")))
        .await
        .expect("open");
    let b_dir = root.path().join("b");
    let b = Node::open(NodeConfig::new(&b_dir)).await.expect("open");
    a.apply(Op::add("s", "first")).await.expect("write");
    a.connect(&b).expect("connect");
    converge(&[a.clone(), b.clone()]).await;
    let transfers_before = a
        .replication_status()
        .await
        .expect("status")
        .stats
        .transfers_started;
    b.shutdown().await.expect("shutdown");
    a.apply(Op::add("s", "while-b-was-down"))
        .await
        .expect("write");
    let b = Node::open(NodeConfig::new(&b_dir)).await.expect("reopen");
    a.connect(&b).expect("connect");
    converge(&[a.clone(), b.clone()]).await;
    let status = a.replication_status().await.expect("status");
    assert_eq!(
        status.stats.transfers_started, transfers_before,
        "the durable cursor must let b resume from the log: {status:?}"
    );
    assert_eq!(
        b.get(&Key::new(KeyKind::ORSet, "s")).expect("get"),
        Value::ORSet(vec!["\"first\"".into(), "\"while-b-was-down\"".into()])
    );
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}
