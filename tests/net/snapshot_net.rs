//! A data directory copied back under its old replica id, over the real network (QUIC, mutual
//! TLS, SWIM): the copy is detected from what its peer announces, re-identified before it
//! writes, and converges with exact values; nothing is refused, no dot of the old id reissued.

use crate::net_support;

use net_support::{Cluster, localhost, test_options};
use std::path::Path;
use std::time::{Duration, Instant};
use tidemark::{Key, KeyKind, Node, NodeConfig, Op, Value};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

/// Reopens member `i` (already shut down) on its directory and rejoins it.
async fn reopen(c: &mut Cluster, i: usize) {
    let m = &c.members[i];
    let node = Node::open(NodeConfig::new(&m.dir)).await.expect("reopen");
    let addr = node
        .listen_with(localhost(), m.tls.clone(), test_options(&m.faults))
        .await
        .expect("listen");
    c.members[i].node = node;
    c.members[i].addr = addr;
    c.join_all(i);
    for (j, other) in c.members.iter().enumerate() {
        if j != i {
            other.node.join_peer(addr).expect("join");
        }
    }
}

async fn write(node: &Node, tag: &str, n: u64) {
    for i in 0..n {
        node.apply_batch(vec![
            Op::inc_gcounter("hits", 1),
            Op::add("seen", format!("{tag}-{i}")),
        ])
        .await
        .expect("write");
    }
}

fn hits(node: &Node) -> Value {
    node.get(&Key::new(KeyKind::GCounter, "hits")).expect("get")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_copied_back_is_re_identified_over_the_network() {
    let seed = net_support::seed("snapshot_net copy-back");
    let mut c = Cluster::start(2, seed).await;
    let limit = Duration::from_secs(60);
    write(&c.members[0].node.clone(), "a", 20).await;
    c.converge(limit).await;
    let x = c.members[0].node.replica_id();
    c.members[0].node.shutdown().await.expect("shutdown");
    let backup = c.members[0].dir.with_extension("backup");
    copy_dir(&c.members[0].dir, &backup);
    reopen(&mut c, 0).await;
    write(&c.members[0].node.clone(), "a2", 30).await;
    c.converge(limit).await;
    c.members[0].node.shutdown().await.expect("shutdown");
    std::fs::remove_dir_all(&c.members[0].dir).expect("rm");
    copy_dir(&backup, &c.members[0].dir);
    reopen(&mut c, 0).await;
    let a = c.members[0].node.clone();
    assert_eq!(a.replica_id(), x);
    assert_eq!(a.context().expect("ctx").max_seq(x), 40);
    let started = Instant::now();
    while a.metrics().reidentified == 0 {
        assert!(started.elapsed() < limit, "the copy was not detected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    write(&a, "again", 10).await;
    c.converge(limit).await;
    let ctx = c.members[1].node.context().expect("ctx");
    assert_eq!(
        ctx.max_seq(x),
        100,
        "no dot of the old id beyond what the peer held"
    );
    for m in &c.members {
        assert_eq!(hits(&m.node), Value::GCounter(60));
        assert_eq!(m.node.metrics().remote_rejected, 0, "nothing refused");
    }
    c.shutdown().await;
}
