//! Nodes dropped without `shutdown()` release everything: dropping the
//! last handle of a `Node` stops its writer after the writes already queued, makes them
//! durable (relaxed mode included), closes the database, and returns only then, so the same
//! directory reopens at once, with every acknowledged write. Nodes connected to each other
//! (each holding the other's inbox) used to keep each other's writer and file alive forever.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tidemark::{Durability, Key, KeyFilter, KeyKind, Node, NodeConfig, Op, Value, WatchEvent};

fn config(dir: &Path, relaxed: bool) -> NodeConfig {
    let mut c = NodeConfig::new(dir);
    c.replication.gossip_interval_ms = 20;
    if relaxed {
        c.durability = Durability::Relaxed;
        // Never synced by the timer: only the drop can make the writes durable.
        c.relaxed_sync_interval = Duration::from_secs(3_600);
    }
    c
}

fn counter(node: &Node, name: &str) -> Value {
    node.get(&Key::new(KeyKind::GCounter, name)).expect("get")
}

/// Opens `n` nodes, connects them as a ring (every pair when n ≤ 3), writes on each, drops
/// them all without shutdown, reopens every directory and checks each node's own writes.
async fn ring_dropped_and_reopened(n: usize, relaxed: bool) {
    let root = tempfile::tempdir().expect("tempdir");
    let dirs: Vec<PathBuf> = (0..n).map(|i| root.path().join(format!("n{i}"))).collect();
    let mut nodes = Vec::new();
    for d in &dirs {
        nodes.push(Node::open(config(d, relaxed)).await.expect("open"));
    }
    for i in 0..n {
        let j = (i + 1) % n;
        if i != j && !(n == 2 && i == 1) {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
    }
    for (i, node) in nodes.iter().enumerate() {
        for _ in 0..=i {
            node.apply(Op::inc_gcounter(&format!("own{i}"), 1))
                .await
                .expect("write");
        }
    }
    drop(nodes);
    for (i, d) in dirs.iter().enumerate() {
        let node = Node::open(config(d, relaxed))
            .await
            .unwrap_or_else(|e| panic!("reopening node {i} after drop: {e}"));
        assert_eq!(
            counter(&node, &format!("own{i}")),
            Value::GCounter(i as u64 + 1),
            "node {i} lost acknowledged writes"
        );
        drop(node);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connected_nodes_dropped_without_shutdown_reopen_with_their_writes() {
    ring_dropped_and_reopened(2, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_of_three_dropped_without_shutdown_reopens_with_their_writes() {
    ring_dropped_and_reopened(3, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_nodes_dropped_without_shutdown_make_acknowledged_writes_durable() {
    ring_dropped_and_reopened(3, true).await;
}

/// Watchers and other clones do not keep a node alive once the last `Node` handle is dropped:
/// the watcher sees the end of the stream, and the directory reopens.
#[tokio::test(flavor = "current_thread")]
async fn a_node_with_a_live_watcher_and_a_peer_is_released_by_dropping_its_handles() {
    let root = tempfile::tempdir().expect("tempdir");
    let (da, db) = (root.path().join("a"), root.path().join("b"));
    let a = Node::open(config(&da, false)).await.expect("open");
    let b = Node::open(config(&db, false)).await.expect("open");
    a.connect(&b).expect("connect");
    let mut watch = a.watch(KeyFilter::all());
    let clone = a.clone();
    a.apply(Op::inc_gcounter("c", 5)).await.expect("write");
    match watch.next().await {
        Some(WatchEvent::Changed(change)) => assert_eq!(change.value, Value::GCounter(5)),
        other => panic!("expected the change, got {other:?}"),
    }
    drop(a);
    // A clone is still a handle: the node keeps working.
    clone.apply(Op::inc_gcounter("c", 1)).await.expect("write");
    drop(clone);
    // Drain what was published before the drop; then the stream ends.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while watch.next().await.is_some() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the watch never ended: the writer outlived its node"
    );
    let a = Node::open(config(&da, false))
        .await
        .expect("reopen while the peer and the watcher are alive");
    assert_eq!(counter(&a, "c"), Value::GCounter(6));
    // The peer still works and accepts a reconnection to the reopened node.
    a.connect(&b).expect("connect");
    b.apply(Op::inc_gcounter("from-b", 1)).await.expect("write");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while counter(&a, "from-b") != Value::GCounter(1) {
        assert!(std::time::Instant::now() < deadline, "no sync after reopen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(b);
    drop(a);
    Node::open(config(&db, false)).await.expect("reopen b");
}
