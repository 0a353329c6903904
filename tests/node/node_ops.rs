//! Typed-value semantics of every op through the `Node` API, bad input, idempotency,
//! compaction and restart.

use tidemark::{Error, Event, Key, KeyFilter, KeyKind, Node, NodeConfig, Op, Value, WatchEvent};

fn s(v: &str) -> String {
    serde_json::Value::from(v).to_string()
}

async fn open(dir: &std::path::Path) -> Node {
    Node::open(NodeConfig::new(dir)).await.expect("open")
}

#[tokio::test]
async fn every_op_has_its_typed_semantics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    node.apply_batch(vec![
        Op::inc_gcounter("visits", 3),
        Op::inc_gcounter("visits", 4),
        Op::inc_pncounter("stock", 10),
        Op::dec_pncounter("stock", 12),
        Op::add("online", "alice"),
        Op::add("online", "bob"),
        Op::add("online", 7),
        Op::remove("online", "alice"),
        Op::set_lww("config", serde_json::json!({"mode": "fast", "a": 1})),
        Op::set_lww("config", serde_json::json!({"mode": "slow"})),
        Op::set_mvreg("doc", "draft 1"),
        Op::set_mvreg("doc", "draft 2"),
    ])
    .await
    .expect("batch");
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "visits"))
            .expect("get"),
        Value::GCounter(7)
    );
    assert_eq!(
        node.get(&Key::new(KeyKind::PNCounter, "stock"))
            .expect("get"),
        Value::PNCounter(-2)
    );
    assert_eq!(
        node.get(&Key::new(KeyKind::ORSet, "online")).expect("get"),
        Value::ORSet(vec![s("bob"), "7".into()])
    );
    assert_eq!(
        node.get(&Key::new(KeyKind::Lww, "config")).expect("get"),
        Value::Lww(Some(r#"{"mode":"slow"}"#.into()))
    );
    assert_eq!(
        node.get(&Key::new(KeyKind::MvReg, "doc")).expect("get"),
        Value::MvReg(vec![s("draft 2")])
    );
    // Deletes: causal types go away; counters refuse.
    node.apply_batch(vec![
        Op::delete(KeyKind::ORSet, "online"),
        Op::delete(KeyKind::Lww, "config"),
    ])
    .await
    .expect("deletes");
    assert_eq!(
        node.get(&Key::new(KeyKind::ORSet, "online")).expect("get"),
        Value::ORSet(vec![])
    );
    assert_eq!(
        node.get(&Key::new(KeyKind::Lww, "config")).expect("get"),
        Value::Lww(None)
    );
    let err = node
        .apply(Op::delete(KeyKind::GCounter, "visits"))
        .await
        .expect_err("counter delete");
    assert!(
        matches!(err, Error::CounterNotDeletable { index: 0, .. }),
        "{err}"
    );
    assert_eq!(err.code(), "counter_not_deletable");
    // Listing by type and prefix.
    node.apply_batch(vec![
        Op::inc_gcounter("visits/a", 1),
        Op::inc_gcounter("visits/b", 2),
        Op::inc_gcounter("other", 1),
    ])
    .await
    .expect("more");
    let listed = node
        .list(KeyKind::GCounter, "visits", None, 10)
        .expect("list");
    let names: Vec<_> = listed.iter().map(|(k, _)| k.name.as_str()).collect();
    assert_eq!(names, ["visits", "visits/a", "visits/b"]);
    let page = node
        .list(KeyKind::GCounter, "visits", Some("visits/a"), 10)
        .expect("list");
    assert_eq!(page.len(), 1);
    node.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn bad_input_is_rejected_whole_with_index_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let cases: Vec<(Op, &str)> = vec![
        (
            Op {
                op: "add".into(),
                ..Op::inc_gcounter("c", 1)
            },
            "type_mismatch",
        ),
        (Op::inc_gcounter("c", 0), "invalid_op"),
        (Op::inc_gcounter("", 1), "invalid_op"),
        (Op::inc_gcounter(&"k".repeat(257), 1), "invalid_op"),
        (
            Op {
                value: None,
                ..Op::add("s", "x")
            },
            "invalid_op",
        ),
        (
            Op::add("s", serde_json::json!({"no": "objects"})),
            "invalid_op",
        ),
        (Op::set_lww("r", "x".repeat(70_000)), "too_large"),
        (
            Op {
                kind: "hashmap".into(),
                ..Op::inc_gcounter("c", 1)
            },
            "invalid_op",
        ),
        (
            Op {
                source: Some("s".into()),
                ..Op::inc_gcounter("c", 1)
            },
            "invalid_op",
        ),
    ];
    for (bad, code) in cases {
        let batch = vec![Op::inc_gcounter("good", 1), bad.clone()];
        let err = node.apply_batch(batch).await.expect_err("must reject");
        assert_eq!(err.code(), code, "{bad:?}: {err}");
        assert!(
            err.to_string().starts_with("op 1"),
            "names the index: {err}"
        );
    }
    // Nothing of any rejected batch was applied.
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "good")).expect("get"),
        Value::GCounter(0)
    );
    // Every op of a refused batch counts as rejected: 9 batches of 2.
    assert_eq!(node.metrics().rejected_ops, 18);
    node.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn idempotent_ingest_counts_each_event_once_and_survives_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let ev = |source: &str, seq| Event {
        source: source.into(),
        seq,
        ops: vec![
            Op::inc_gcounter("clicks", 1),
            Op::add("seen", format!("{source}:{seq}")),
        ],
        ..Default::default()
    };
    let r = node
        .ingest("clicks", vec![ev("a", 1), ev("a", 2), ev("b", 1)])
        .await
        .expect("ingest");
    assert_eq!((r.applied, r.duplicates), (3, 0));
    let r = node
        .ingest("clicks", vec![ev("a", 2), ev("a", 3), ev("a", 3)])
        .await
        .expect("ingest");
    assert_eq!((r.applied, r.duplicates), (1, 2));
    let r = node
        .apply(Op::inc_gcounter("ops", 1).with_id("cli", 9))
        .await
        .expect("op");
    assert_eq!(r.applied, 1);
    let r = node
        .apply(Op::inc_gcounter("ops", 1).with_id("cli", 9))
        .await
        .expect("op");
    assert_eq!(r.duplicates, 1);
    node.shutdown().await.expect("shutdown");
    let node = open(dir.path()).await;
    let r = node
        .ingest("clicks", vec![ev("a", 1), ev("b", 1), ev("b", 2)])
        .await
        .expect("ingest");
    assert_eq!((r.applied, r.duplicates), (1, 2));
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "clicks"))
            .expect("get"),
        Value::GCounter(5)
    );
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "ops")).expect("get"),
        Value::GCounter(1)
    );
    node.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn compaction_keeps_values_and_shrinks_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    for i in 0..50u64 {
        node.apply_batch(vec![Op::add("set", i), Op::inc_pncounter("n", i + 1)])
            .await
            .expect("write");
    }
    for i in 0..25u64 {
        node.apply(Op::remove("set", i)).await.expect("remove");
    }
    let before: Vec<_> = node.list(KeyKind::ORSet, "", None, 100).expect("list");
    let ctx_before = node.context().expect("ctx");
    let report = node.compact(None).await.expect("compact");
    assert_eq!(report.log_entries_dropped, 75);
    assert!(report.bytes_reclaimed > 0);
    assert_eq!(report.cloud_ranges, 0);
    assert_eq!(node.metrics().log_entries, 0);
    assert_eq!(
        node.list(KeyKind::ORSet, "", None, 100).expect("list"),
        before
    );
    node.shutdown().await.expect("shutdown");
    let node = open(dir.path()).await;
    assert_eq!(
        node.list(KeyKind::ORSet, "", None, 100).expect("list"),
        before
    );
    assert_eq!(node.context().expect("ctx"), ctx_before);
    assert_eq!(
        node.get(&Key::new(KeyKind::PNCounter, "n")).expect("get"),
        Value::PNCounter(1275)
    );
    node.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let err = Node::open(NodeConfig::new(dir.path()))
        .await
        .expect_err("second open");
    assert_eq!(err.code(), "already_open", "{err}");
    node.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn watchers_see_committed_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let mut w = node.watch(KeyFilter::prefix("on"));
    node.apply_batch(vec![Op::add("online", "x"), Op::add("offline", "y")])
        .await
        .expect("write");
    match w.next().await {
        Some(WatchEvent::Changed(c)) => {
            assert_eq!(c.key, Key::new(KeyKind::ORSet, "online"));
            assert_eq!(c.value, Value::ORSet(vec![s("x")]));
        }
        other => panic!("unexpected {other:?}"),
    }
    node.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn remote_deltas_join_idempotently_and_deltas_since_serves_them() {
    let a_dir = tempfile::tempdir().expect("tempdir");
    let b_dir = tempfile::tempdir().expect("tempdir");
    let a = open(a_dir.path()).await;
    let b = open(b_dir.path()).await;
    a.apply_batch(vec![Op::add("s", "x"), Op::inc_gcounter("c", 2)])
        .await
        .expect("a");
    b.apply_batch(vec![Op::add("s", "y"), Op::inc_gcounter("c", 5)])
        .await
        .expect("b");
    for _ in 0..2 {
        let tidemark::store::DeltasSince::Deltas { delta, more } = a
            .deltas_since(b.context().expect("ctx"), 1 << 20)
            .await
            .expect("since")
        else {
            panic!("no transfer expected")
        };
        assert!(!more);
        let r = b
            .apply_remote(tidemark::proto::PeerId(1), delta)
            .await
            .expect("apply");
        assert!(r.is_ok());
    }
    let tidemark::store::DeltasSince::Deltas { delta, .. } = b
        .deltas_since(a.context().expect("ctx"), 1 << 20)
        .await
        .expect("since")
    else {
        panic!("no transfer expected")
    };
    a.apply_remote(tidemark::proto::PeerId(2), delta)
        .await
        .expect("apply")
        .expect("valid");
    for n in [&a, &b] {
        assert_eq!(
            n.get(&Key::new(KeyKind::GCounter, "c")).expect("get"),
            Value::GCounter(7)
        );
        assert_eq!(
            n.get(&Key::new(KeyKind::ORSet, "s")).expect("get"),
            Value::ORSet(vec![s("x"), s("y")])
        );
    }
    assert_eq!(a.context().expect("ctx"), b.context().expect("ctx"));
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// Batches queued at once near a counter's limit: each alone fits, together they would not.
/// The writer checks each against the state the earlier ones left, so exactly those that fit
/// are applied and the value is exact (the lattice would saturate and drop the excess).
#[tokio::test]
async fn concurrent_increments_near_the_limit_are_refused_exactly_past_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    node.apply(Op::inc_gcounter("g", u64::MAX - 10))
        .await
        .expect("near the limit");
    node.apply_batch(vec![
        Op::inc_pncounter("p", i64::MAX as u64 - 10),
        Op::inc_gcounter("other", 1),
    ])
    .await
    .expect("near the limit");
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let node = node.clone();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    node.apply(Op::inc_gcounter("g", 1)).await
                } else {
                    // Two ops: the refusal must take the whole batch (the other counter too).
                    node.apply_batch(vec![
                        Op::inc_gcounter("other", 1),
                        Op::inc_pncounter("p", 1),
                    ])
                    .await
                }
            })
        })
        .collect();
    let (mut ok, mut refused) = ([0u64; 2], [0u64; 2]);
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.expect("task") {
            Ok(_) => ok[i % 2] += 1,
            Err(e @ Error::Overflow { .. }) => {
                assert_eq!(e.code(), "overflow");
                refused[i % 2] += 1;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!((ok, refused), ([10, 10], [10, 10]));
    let get = |kind, name| node.get(&Key::new(kind, name)).expect("get");
    assert_eq!(get(KeyKind::GCounter, "g"), Value::GCounter(u64::MAX));
    assert_eq!(get(KeyKind::PNCounter, "p"), Value::PNCounter(i64::MAX));
    // Only the applied batches' other op counted: nothing of a refused batch applied.
    assert_eq!(get(KeyKind::GCounter, "other"), Value::GCounter(1 + 10));
    node.shutdown().await.expect("shutdown");
}

/// A lone write is committed alone and at once (issue 21, the single-op path): an idle writer
/// never holds a write back waiting for company, so each of 50 sequential applies is a commit
/// group of its own; writes queued while a commit is in progress still share groups. Counted
/// with the node's commit metrics, never timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_commits_alone_and_queued_writes_share_groups() {
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
    assert_eq!(lone.commit_groups_ops - before.commit_groups_ops, 50);
    // 64 writers at once: the writer commits what is queued whenever it looks, so the writes
    // that arrive while a group is being made durable wait for the next group, together.
    let writers: Vec<_> = (0..64)
        .map(|i| {
            let node = node.clone();
            tokio::spawn(async move { node.apply(Op::inc_gcounter(&format!("c{i}"), 1)).await })
        })
        .collect();
    for w in writers {
        w.await.expect("task").expect("apply");
    }
    let queued = node.metrics();
    assert_eq!(queued.commit_groups_ops - lone.commit_groups_ops, 64);
    assert!(
        queued.commits - lone.commits < 64,
        "64 concurrent writes made {} groups",
        queued.commits - lone.commits
    );
    node.shutdown().await.expect("shutdown");
}
