//! A caller's lone small write commits on its own thread when the writer is idle
//! (`driver::Writer::commit_inline`), and never ahead of a write queued before it: the queue's
//! order is the commit order, whichever thread commits.

use super::Node;
use crate::config::NodeConfig;
use crate::ops::Op;
use tidemark_crdts::{Key, KeyKind, Value};

async fn open(dir: &std::path::Path) -> Node {
    Node::open(NodeConfig::new(dir)).await.expect("open")
}

fn lww(node: &Node, key: &str) -> Value {
    node.get(&Key::new(KeyKind::Lww, key)).expect("get")
}

/// A write queued for the writer thread (as the node's own writes are: seals, notes,
/// announcements) and then a caller's lone write of the same register: the caller's must
/// commit after the queued one, so its value is the one left (LWW: the later commit's
/// timestamp wins). Were the lone write to commit inline ahead of the queue, the queued value
/// would be left. 300 rounds, each a new race between the writer thread taking the queued
/// write and the caller trying to commit inline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_never_commits_ahead_of_a_queued_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let limits = node.config().limits.clone();
    for i in 0..300u32 {
        let key = format!("k{}", i % 7);
        let queued = crate::ops::validate_ops(&[Op::set_lww(&key, format!("queued {i}"))], &limits)
            .expect("valid");
        let rx = node.enqueue(queued).expect("enqueue");
        node.apply(Op::set_lww(&key, format!("lone {i}")))
            .await
            .expect("apply");
        rx.await.expect("reply").expect("commit");
        assert_eq!(
            lww(&node, &key),
            Value::Lww(Some(serde_json::json!(format!("lone {i}")).to_string())),
            "round {i}: the lone write committed ahead of the queued one"
        );
    }
    node.shutdown().await.expect("shutdown");
}

/// On a multi-thread runtime, lone writes to an idle node commit on the caller's thread
/// (counted by `commits_inline`); batches over the inline limit and writes made from a
/// current-thread runtime (where a blocking commit would stall every task) never do. Every
/// write is acknowledged and durable either way: the values survive a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_small_writes_commit_inline_and_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let before = node.metrics();
    for _ in 0..50 {
        node.apply(Op::inc_gcounter("lone", 1))
            .await
            .expect("apply");
    }
    let lone = node.metrics();
    assert_eq!(
        lone.commits - before.commits,
        50,
        "one group per lone write"
    );
    // The writer thread also takes the lock for its ticks: a write that meets it busy is
    // queued instead, so not every one of the 50 need be inline — but some must be.
    assert!(
        lone.commits_inline > before.commits_inline,
        "no lone write committed inline: {lone:?}"
    );
    let big: Vec<Op> = (0..super::INLINE_OPS_MAX + 1)
        .map(|i| Op::inc_gcounter(&format!("b{i}"), 1))
        .collect();
    node.apply_batch(big).await.expect("batch");
    let after_big = node.metrics();
    assert_eq!(
        after_big.commits_inline, lone.commits_inline,
        "a big batch went inline"
    );
    node.shutdown().await.expect("shutdown");
    let node = open(dir.path()).await;
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "lone")).expect("get"),
        Value::GCounter(50)
    );
    node.shutdown().await.expect("shutdown");
}

/// From a current-thread runtime the node never commits on the caller's thread.
#[test]
fn a_current_thread_runtime_never_commits_inline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let node = open(dir.path()).await;
        for _ in 0..20 {
            node.apply(Op::inc_gcounter("c", 1)).await.expect("apply");
        }
        let m = node.metrics();
        assert_eq!(m.commits_inline, 0, "{m:?}");
        assert_eq!(
            node.get(&Key::new(KeyKind::GCounter, "c")).expect("get"),
            Value::GCounter(20)
        );
        node.shutdown().await.expect("shutdown");
    });
}

/// The first writes after open may commit inline before the writer thread has run at all:
/// they must publish each change once, as the writer thread's commits do (the store is told
/// at construction, not by the writer thread, that watchers read values after the commit).
/// 20 fresh nodes, each watched and written at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_writes_after_open_reach_a_watcher_once_each() {
    for round in 0..20 {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = open(dir.path()).await;
        let mut w = node.watch(crate::watch::KeyFilter::prefix("k"));
        for _ in 0..3 {
            node.apply(Op::inc_gcounter("k", 1)).await.expect("apply");
        }
        let mut seen = Vec::new();
        while w.behind().changes > 0 {
            match tokio::time::timeout(std::time::Duration::from_secs(5), w.next()).await {
                Ok(Some(crate::watch::WatchEvent::Changed(c))) => seen.push(c.value),
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(
            seen,
            (1..=3).map(Value::GCounter).collect::<Vec<_>>(),
            "round {round}"
        );
        node.shutdown().await.expect("shutdown");
    }
}

/// While the writer thread waits for the lock (it woke for a peer message, a status request,
/// a timer), callers queue their writes instead of committing inline, so that the writer
/// waits for one commit at most and is never starved by a caller writing in a loop. With the
/// flag set, no write commits inline (all are committed by the writer thread); cleared, they
/// do again. `inline_commits: false` turns the path off altogether.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_yield_to_a_writer_thread_that_wants_the_lock_and_the_path_can_be_turned_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    node.shared.writer.set_wants_lock(true);
    let before = node.metrics();
    for _ in 0..20 {
        node.apply(Op::inc_gcounter("c", 1)).await.expect("apply");
    }
    let held = node.metrics();
    assert_eq!(held.commits - before.commits, 20);
    assert_eq!(held.commits_inline, before.commits_inline, "{held:?}");
    node.shared.writer.set_wants_lock(false);
    for _ in 0..20 {
        node.apply(Op::inc_gcounter("c", 1)).await.expect("apply");
    }
    assert!(node.metrics().commits_inline > held.commits_inline);
    node.shutdown().await.expect("shutdown");

    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = NodeConfig::new(dir.path());
    cfg.inline_commits = false;
    let node = Node::open(cfg).await.expect("open");
    for _ in 0..20 {
        node.apply(Op::inc_gcounter("c", 1)).await.expect("apply");
    }
    let m = node.metrics();
    assert_eq!((m.commits_inline, m.commits >= 20), (0, true), "{m:?}");
    node.shutdown().await.expect("shutdown");
}

/// Concurrent writers share the writer thread's groups instead of committing one by one
/// inline: once writes are seen to be concurrent, a lone write is queued (not inline); the
/// writer thread, committing it alone with nothing queued behind it, lets the next lone write
/// commit inline again. Under 32 tasks writing at once, most writes share groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_groups_and_a_lone_writer_returns_inline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    node.shared.writer.set_contended();
    let before = node.metrics();
    node.apply(Op::inc_gcounter("c", 1)).await.expect("apply");
    let queued = node.metrics();
    assert_eq!(queued.commits - before.commits, 1);
    assert_eq!(queued.commits_inline, before.commits_inline, "{queued:?}");
    assert!(
        !node.shared.writer.is_contended(),
        "a lone queued write clears the flag"
    );
    for _ in 0..20 {
        node.apply(Op::inc_gcounter("c", 1)).await.expect("apply");
    }
    assert!(node.metrics().commits_inline > queued.commits_inline);

    let start = node.metrics();
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let node = node.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    node.apply(Op::inc_gcounter(&format!("t{t}-{}", i % 4), 1))
                        .await
                        .expect("apply");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let end = node.metrics();
    let commits = end.commits - start.commits;
    assert!(
        commits < 640,
        "640 concurrent writes made {commits} commits: no group was shared"
    );
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "c")).expect("get"),
        Value::GCounter(21)
    );
    for t in 0..32 {
        for k in 0..4 {
            assert_eq!(
                node.get(&Key::new(KeyKind::GCounter, format!("t{t}-{k}")))
                    .expect("get"),
                Value::GCounter(5)
            );
        }
    }
    node.shutdown().await.expect("shutdown");
}
