//! `Durability::Relaxed` in a cluster: a relaxed node acknowledges local
//! writes before they are durable, but nothing it serves, announces or acknowledges to a peer
//! may be lost by a crash. Otherwise a restarted node reissues dots its peers already hold with
//! other content (replicas never converge) and refuses its peers' states as forged own dots.
//!
//! The crash is simulated deterministically: once the relaxed node is quiescent (no writer
//! activity), its database file is copied. redb keeps non-durable commits out of the on-disk
//! header, so the copy is exactly what a `kill -9` at that moment leaves behind (the kill -9
//! version of this test is `tests/node/relaxed_kill9.rs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tidemark::store::{DB_FILE, WAL_FILE};
use tidemark::{Durability, Key, KeyKind, Node, NodeConfig, Op, Value};

/// A node config for fast in-process replication; relaxed nodes never sync on their own
/// (an hour-long interval), so what is durable is decided by the node's serving rules only.
fn config(dir: &Path, relaxed: bool) -> NodeConfig {
    let mut c = NodeConfig::new(dir);
    c.replication.gossip_interval_ms = 20;
    c.replication.retransmit_timeout_ms = 200;
    c.replication.catch_up_stagger_ms = 0;
    if relaxed {
        c.durability = Durability::Relaxed;
        c.relaxed_sync_interval = Duration::from_secs(3_600);
    }
    c
}

fn set(node: &Node) -> Value {
    node.get(&Key::new(KeyKind::ORSet, "s")).expect("get")
}

fn elems(names: &[&str]) -> Value {
    let mut v: Vec<String> = names
        .iter()
        .map(|n| serde_json::Value::from(*n).to_string())
        .collect();
    v.sort();
    Value::ORSet(v)
}

/// Every key of every kind, for exact state comparison.
fn state(node: &Node) -> Vec<(Key, Value)> {
    KeyKind::ALL
        .iter()
        .flat_map(|k| node.list(*k, "", None, 100_000).expect("list"))
        .collect()
}

/// Waits (bounded) until `pred` holds.
async fn wait_until(what: &str, within: Duration, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until every node has the same context and the same values; panics with the states
/// when they stay different.
async fn converge(nodes: &[&Node], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
        let states: Vec<_> = nodes.iter().map(|n| state(n)).collect();
        if ctxs.windows(2).all(|w| w[0] == w[1]) && states.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replicas did not converge within {within:?}:\n{}",
            states
                .iter()
                .zip(&ctxs)
                .enumerate()
                .map(|(i, (s, c))| format!("node {i}: {s:?}\n  context {c:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Copies `from`'s database and write-ahead log into a fresh directory: the crash image of a
/// quiescent node.
fn crash_image(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).expect("mkdir");
    std::fs::copy(from.join(DB_FILE), to.join(DB_FILE)).expect("copy");
    std::fs::copy(from.join(WAL_FILE), to.join(WAL_FILE)).expect("copy log");
    to.to_path_buf()
}

/// Makes `node` quiescent: disconnected from `peers`, and every frame they sent it before the
/// disconnect handled (each node handles its inputs in order; a status call is a barrier).
async fn isolate(node: &Node, peers: &[&Node]) {
    for p in peers {
        node.disconnect(p).expect("disconnect");
    }
    for p in peers {
        p.replication_status().await.expect("status");
    }
    node.replication_status().await.expect("status");
}

fn rejected(nodes: &[&Node]) -> Vec<u64> {
    nodes.iter().map(|n| n.metrics().remote_rejected).collect()
}

/// A relaxed node's write reaches two peers (directly and forwarded); the node crashes before
/// any periodic sync and restarts from its crash image. Whatever its peers hold must have been
/// durable: the restarted node continues above every dot they hold, takes their states without
/// refusing them as forged, and all three converge to exactly the writes that reached anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaxed_node_restarted_from_a_crash_never_reissues_a_dot_its_peers_hold() {
    let root = tempfile::tempdir().expect("tempdir");
    let (da, db, dc) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("c"),
    );
    let a = Node::open(config(&da, true)).await.expect("open a");
    let b = Node::open(config(&db, false)).await.expect("open b");
    let c = Node::open(config(&dc, false)).await.expect("open c");
    let me = a.replica_id();
    // A line a - b - c: c learns a's write only through b (b's log entry, origin b).
    a.connect(&b).expect("connect");
    b.connect(&c).expect("connect");
    a.apply(Op::add("s", "x1")).await.expect("write x1");
    wait_until("x1 to reach c", Duration::from_secs(30), || {
        set(&c) == elems(&["x1"])
    })
    .await;
    isolate(&a, &[&b]).await;
    // Written after the node stopped serving: relaxed mode may lose it in the crash.
    a.apply(Op::add("s", "z-unserved")).await.expect("write z");
    let image = crash_image(&da, &root.path().join("a-crashed"));
    a.shutdown().await.expect("shutdown a");

    let a2 = Node::open(config(&image, true))
        .await
        .expect("reopen the crash image");
    assert_eq!(a2.replica_id(), me, "the crash image keeps the replica id");
    // Relaxed mode stays relaxed: a write nobody was served is not forced to disk, so a crash
    // may lose it (the documented window; this image of the page cache still holds its
    // write-ahead log record, a power loss would not); what a peer was served survived.
    let survived = set(&a2);
    assert!(
        survived == elems(&["x1"]) || survived == elems(&["x1", "z-unserved"]),
        "the crash image holds {survived:?}"
    );
    let held = b.context().expect("ctx").max_seq(me);
    assert!(
        a2.context().expect("ctx").max_seq(me) >= held,
        "the restarted node's own max seq {} is below the {held} its peers hold: it will \
         reissue dots they have with other content",
        a2.context().expect("ctx").max_seq(me)
    );
    // Reconnect to both before writing: c forwards a's old write (origin b) back to a.
    a2.connect(&b).expect("connect");
    a2.connect(&c).expect("connect");
    converge(&[&a2, &b, &c], Duration::from_secs(10)).await;
    a2.apply(Op::add("s", "y1")).await.expect("write y1");
    converge(&[&a2, &b, &c], Duration::from_secs(10)).await;
    let expected = if survived == elems(&["x1"]) {
        elems(&["x1", "y1"])
    } else {
        elems(&["x1", "y1", "z-unserved"])
    };
    assert_eq!(
        set(&b),
        expected,
        "the converged set must hold exactly the writes that survived"
    );
    assert_eq!(
        rejected(&[&a2, &b, &c]),
        vec![0, 0, 0],
        "a peer's state was refused (forged own dots?)"
    );
    for n in [a2, b, c] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A relaxed node acknowledges a peer's delta only once the join is durable: after a crash its
/// durable cursor into the sender's log covers everything it acknowledged, so the sender (which
/// compacts what was acknowledged) never has to find it again and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaxed_node_acknowledges_only_durable_joins() {
    let root = tempfile::tempdir().expect("tempdir");
    let (da, db) = (root.path().join("a"), root.path().join("b"));
    let a = Node::open(config(&da, false)).await.expect("open a");
    let b = Node::open(config(&db, true)).await.expect("open b");
    a.connect(&b).expect("connect");
    a.apply(Op::add("s", "from-a")).await.expect("write");
    let log_end = a.replication_status().await.expect("status").log_bounds.1;
    let peer = b.peer_id();
    wait_until("b to acknowledge a's log", Duration::from_secs(30), || {
        let rt = tokio::runtime::Handle::current();
        let status = tokio::task::block_in_place(|| rt.block_on(a.replication_status()));
        status
            .expect("status")
            .peer_acked
            .iter()
            .any(|(p, acked)| *p == peer && *acked == Some(log_end))
    })
    .await;
    isolate(&b, &[&a]).await;
    let image = crash_image(&db, &root.path().join("b-crashed"));
    b.shutdown().await.expect("shutdown b");
    let b2 = Node::open(config(&image, true))
        .await
        .expect("reopen the crash image");
    assert_eq!(
        set(&b2),
        elems(&["from-a"]),
        "b acknowledged a join that its crash lost"
    );
    b2.shutdown().await.expect("shutdown");
    a.shutdown().await.expect("shutdown");
}

/// A relaxed node's local writes reach its peers promptly (at its next gossip tick, made
/// durable first), not only at its next periodic sync: here that sync is an hour away and the
/// cluster is quiet, so no incoming join forces a durable commit either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_relaxed_node_serves_its_new_writes_without_waiting_for_its_sync_interval() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = Node::open(config(&root.path().join("a"), true))
        .await
        .expect("open a");
    let b = Node::open(config(&root.path().join("b"), false))
        .await
        .expect("open b");
    a.connect(&b).expect("connect");
    b.apply(Op::add("s", "from-b")).await.expect("write");
    converge(&[&a, &b], Duration::from_secs(10)).await;
    // Quiet: every interval delivered and acknowledged both ways.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for n in [&a, &b] {
        n.replication_status().await.expect("status");
    }
    a.apply(Op::add("s", "from-a")).await.expect("write");
    converge(&[&a, &b], Duration::from_secs(5)).await;
    assert_eq!(set(&b), elems(&["from-a", "from-b"]));
    // What b holds of a survives a crash of a: it was durable before it was served.
    isolate(&a, &[&b]).await;
    let image = crash_image(&root.path().join("a"), &root.path().join("a-crashed"));
    for n in [a, b] {
        n.shutdown().await.expect("shutdown");
    }
    let a2 = Node::open(config(&image, true)).await.expect("reopen");
    assert_eq!(set(&a2), elems(&["from-a", "from-b"]));
    a2.shutdown().await.expect("shutdown");
}
