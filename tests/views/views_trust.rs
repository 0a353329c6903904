//! Views you can trust: event times within reason (`max_future`, ambiguous magnitudes refused,
//! watermarks and horizons never beyond the clock plus `max_future`, also when a peer announces
//! one), a write answered as duplicate changes no view, a restored node keeps its source's
//! promises, and a node that never synced a stream does not make the cluster remove windows.

use crate::http_support;

use serde_json::json;
use std::time::{Duration, Instant};
use tidemark::views::{Event, ViewDef, ViewPage, ViewQuery};
use tidemark::{Error, Node, NodeConfig};

const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .expect("clock after 1970")
}

/// A windowed count of stream `s`, with extra top-level definition members.
fn count_def(extra: serde_json::Value, window: serde_json::Value) -> Vec<ViewDef> {
    let mut d = json!({"name": "c", "stream": "s", "kind": "count", "window": window});
    if let (Some(d), Some(extra)) = (d.as_object_mut(), extra.as_object()) {
        d.extend(extra.clone());
    }
    vec![serde_json::from_value(d).expect("def")]
}

async fn open_with(dir: &std::path::Path, defs: Vec<ViewDef>) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs;
    Node::open(cfg).await.expect("open")
}

async fn read(node: &Node, view: &str) -> ViewPage {
    node.view(view, &ViewQuery::default()).await.expect("view")
}

fn ev(src: &str, seq: u64, t: u64) -> Event {
    Event::new(src, seq, json!({})).at(t)
}

async fn converge(nodes: &[&Node]) {
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
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An event more than `max_future` (default 1 h) ahead of the node's clock is refused, naming
/// the event and the field, and nothing of its batch is applied; within the bound it is
/// accepted; a configured `max_future` replaces the default.
#[tokio::test]
async fn an_event_too_far_in_the_future_is_refused_with_nothing_of_its_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open_with(dir.path(), count_def(json!({}), json!({"tumbling": "1m"}))).await;
    let now = now_ms();
    let err = node
        .ingest("s", vec![ev("p", 1, now - MIN), ev("p", 2, now + 2 * HOUR)])
        .await
        .expect_err("a time 2 h ahead is refused");
    match &err {
        Error::InvalidEvent { index, field, .. } => {
            assert_eq!((*index, field.as_str()), (1, "time"), "{err}");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("max_future"), "{err}");
    let page = read(&node, "c").await;
    assert!(
        page.rows.is_empty(),
        "nothing of the batch applied: {page:?}"
    );
    assert_eq!(page.watermark, None, "the watermark did not move");
    // The first event alone (and one 30 min ahead) is accepted; its retry is a duplicate.
    let out = node
        .ingest("s", vec![ev("p", 1, now - MIN), ev("p", 3, now + 30 * MIN)])
        .await
        .expect("within max_future");
    assert_eq!((out.applied, out.duplicates), (2, 0));
    node.shutdown().await.expect("shutdown");

    let dir = tempfile::tempdir().expect("tempdir");
    let strict = open_with(
        dir.path(),
        count_def(json!({"max_future": "5m"}), json!({"tumbling": "1m"})),
    )
    .await;
    let err = strict
        .ingest("s", vec![ev("p", 1, now + 30 * MIN)])
        .await
        .expect_err("30 min ahead is beyond max_future = 5m");
    assert!(
        matches!(&err, Error::InvalidEvent { index: 0, field, .. } if field == "time"),
        "{err:?}"
    );
    strict
        .ingest("s", vec![ev("p", 1, now + MIN)])
        .await
        .expect("1 min ahead is within 5m");
    strict.shutdown().await.expect("shutdown");
}

/// A producer that sends epoch microseconds or nanoseconds (or seconds as a float) gets an
/// error saying what the number looks like, not a silently accepted far-future time.
#[tokio::test]
async fn ambiguous_time_magnitudes_are_refused_saying_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Even with a generous max_future the magnitudes are refused.
    let node = open_with(
        dir.path(),
        count_def(json!({"max_future": "36500d"}), json!({"tumbling": "1m"})),
    )
    .await;
    let now = now_ms();
    for (t, says) in [
        (json!(now * 1_000), "microseconds"),
        (json!(now * 1_000_000), "nanoseconds"),
        (json!(now as f64 / 1000.0), "whole number"),
        (json!(-5), "whole number"),
    ] {
        let mut e = Event::new("p", 1, json!({}));
        e.time = Some(t.clone());
        let err = node
            .ingest("s", vec![e])
            .await
            .expect_err("ambiguous time refused");
        assert!(
            matches!(&err, Error::InvalidEvent { field, .. } if field == "time"),
            "{t}: {err:?}"
        );
        assert!(err.to_string().contains(says), "{t}: {err}");
    }
    assert!(read(&node, "c").await.rows.is_empty());
    node.shutdown().await.expect("shutdown");
}

/// Over HTTP (NDJSON): 400 naming the line and the field, nothing of the batch applied.
#[test]
fn http_ingest_refuses_a_far_future_time_naming_the_line() {
    let served = http_support::Served::start_with(|node, _| {
        node.views = count_def(json!({}), json!({"tumbling": "1m"}));
    });
    let now = now_ms();
    let body = format!(
        "{}\n{}\n",
        json!({"source": "p", "seq": 1, "time": now - MIN}),
        json!({"source": "p", "seq": 2, "time": now * 1000}),
    );
    let a = http_support::post(&served.url("/v1/streams/s/events"), body);
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.json["error"]["at"], "line 2, field time", "{a:?}");
    assert!(
        a.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("microseconds")),
        "{a:?}"
    );
    let body = format!(
        "{}\n",
        json!({"source": "p", "seq": 3, "time": now + 3 * HOUR})
    );
    let a = http_support::post(&served.url("/v1/streams/s/events"), body);
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.json["error"]["at"], "line 1, field time", "{a:?}");
    let page = http_support::get(&served.url("/v1/views/c"));
    assert_eq!(page.status, 200);
    assert_eq!(page.json["rows"], json!([]), "nothing applied: {page:?}");
    served.stop();
}

/// A peer that announces a watermark and horizon far beyond this node's clock (it runs a huge
/// `max_future`) moves neither this node's horizon nor its cluster watermark beyond the clock
/// plus this node's `max_future`, and this node still applies on-time events.
#[tokio::test]
async fn a_peers_far_future_watermark_is_clamped_on_receipt() {
    let now = now_ms();
    let window = json!({"tumbling": "1m", "retention": "2h"});
    let (da, db) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let a = open_with(
        da.path(),
        count_def(json!({"max_future": "1000d"}), window.clone()),
    )
    .await;
    let b = open_with(db.path(), count_def(json!({}), window)).await;
    // B holds a window 30 min old: kept while the horizon is below its end + 2 h.
    b.ingest("s", vec![ev("b", 1, now - 30 * MIN)])
        .await
        .expect("b ingests");
    // A (its own max_future allows it) moves its watermark 500 days ahead and announces it.
    a.ingest("s", vec![ev("a", 1, now + 500 * 24 * HOUR)])
        .await
        .expect("a ingests");
    a.maintain_views().await.expect("a maintains");
    a.connect(&b).expect("connect");
    converge(&[&a, &b]).await;
    for _ in 0..3 {
        b.maintain_views().await.expect("b maintains");
    }
    let page = read(&b, "c").await;
    let bound = now_ms() + HOUR + MIN;
    assert!(
        page.horizon.is_none_or(|h| h <= bound),
        "horizon {:?} beyond the clock + max_future",
        page.horizon
    );
    assert!(
        page.cluster_watermark.is_none_or(|w| w <= bound),
        "cluster watermark {:?} beyond the clock + max_future",
        page.cluster_watermark
    );
    // B still applies an on-time event for its window (its horizon did not jump). That B's
    // earlier row survives is not asserted: A dropped B's entries below A's own far horizon on
    // receipt and holds their dots, which can reach B as a removal (see the ignored test).
    let out = b
        .ingest("s", vec![ev("b", 2, now - 30 * MIN)])
        .await
        .expect("b ingests");
    assert_eq!((out.applied, out.late), (1, 0), "on time on B: {out:?}");
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// A node restored from a snapshot (a new replica id) starts from the watermarks and horizons
/// in the state it restored: it refuses as late an event for a window its source reported
/// final, announces at least the source's watermark at once, and the window keeps its value.
#[tokio::test]
async fn a_restored_node_keeps_the_promises_of_its_source() {
    let defs = || {
        serde_json::from_value::<Vec<ViewDef>>(json!([
            {"name": "c", "stream": "s", "kind": "count", "window": {"tumbling": "1m"}},
            {"name": "r", "stream": "s", "kind": "count",
             "window": {"tumbling": "1m", "retention": "1m"}},
        ]))
        .expect("defs")
    };
    let (da, dr) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("r"),
    );
    let a = open_with(da.path(), defs()).await;
    a.ingest("s", vec![ev("p", 1, 10_000), ev("p", 2, 5 * MIN + 1)])
        .await
        .expect("a ingests");
    a.maintain_views().await.expect("a maintains");
    let page = read(&a, "c").await;
    assert!(
        page.rows
            .iter()
            .any(|r| r.window_start == Some(0) && r.is_final),
        "window 0 is final on A: {page:?}"
    );
    let snap = da.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    a.shutdown().await.expect("shutdown");
    let restored_dir = dr.path().join("r");
    Node::restore(&snap, &restored_dir).expect("restore");
    let r = open_with(&restored_dir, defs()).await;
    let out = r
        .ingest("s", vec![ev("q", 1, 20_000)])
        .await
        .expect("r ingests");
    assert_eq!(
        out.late, 1,
        "the event for A's final window is late on R: {out:?}"
    );
    let page = read(&r, "c").await;
    let w0: Vec<_> = page
        .rows
        .iter()
        .filter(|row| row.window_start == Some(0))
        .map(|row| (row.value.clone(), row.is_final))
        .collect();
    assert_eq!(
        w0,
        vec![(json!(1), true)],
        "window 0 unchanged and final: {page:?}"
    );
    assert!(
        page.watermark.is_some_and(|w| w > 5 * MIN),
        "R announced at least A's watermark: {:?}",
        page.watermark
    );
    r.shutdown().await.expect("shutdown");
}

/// A at 2.5 min and B at 1.5 min (connected), and C, fresh, that met nobody and ingests one
/// event at 60 min; after maintenance C announces a horizon of 60 min (its own watermark).
async fn three_with_a_fresh_far_ahead() -> (tempfile::TempDir, Node, Node, Node) {
    let defs = || count_def(json!({}), json!({"tumbling": "1m", "retention": "1m"}));
    let root = tempfile::tempdir().expect("tempdir");
    let a = open_with(&root.path().join("a"), defs()).await;
    let b = open_with(&root.path().join("b"), defs()).await;
    let c = open_with(&root.path().join("c"), defs()).await;
    a.connect(&b).expect("connect");
    a.ingest("s", vec![ev("a", 1, 5 * MIN / 2)])
        .await
        .expect("a ingests");
    b.ingest("s", vec![ev("b", 1, 3 * MIN / 2)])
        .await
        .expect("b ingests");
    converge(&[&a, &b]).await;
    for n in [&a, &b] {
        n.maintain_views().await.expect("maintain");
    }
    c.ingest("s", vec![ev("c", 1, 60 * MIN)])
        .await
        .expect("c ingests");
    c.maintain_views().await.expect("c maintains");
    assert_eq!(
        read(&c, "c").await.horizon,
        Some(60 * MIN),
        "C vouches for itself"
    );
    c.connect(&a).expect("connect");
    c.connect(&b).expect("connect");
    converge(&[&a, &b, &c]).await;
    for _ in 0..3 {
        for n in [&a, &b, &c] {
            n.maintain_views().await.expect("maintain");
        }
    }
    (root, a, b, c)
}

/// The fresh node's horizon is adopted by no node beyond its own watermark: B (at 1.5 min)
/// does not act on C's 60 min, so B still applies an on-time event for its open window
/// [1m, 2m) instead of refusing it as late.
#[tokio::test]
async fn a_fresh_nodes_horizon_is_adopted_only_up_to_each_nodes_own_watermark() {
    let (_root, a, b, c) = three_with_a_fresh_far_ahead().await;
    for n in [&a, &b] {
        let page = read(n, "c").await;
        assert!(
            page.horizon
                .zip(page.watermark)
                .is_some_and(|(h, w)| h <= w),
            "horizon {:?} beyond the node's own watermark {:?}",
            page.horizon,
            page.watermark
        );
    }
    let out = b
        .ingest("s", vec![ev("b", 2, 3 * MIN / 2 + 1)])
        .await
        .expect("b ingests on time");
    assert_eq!((out.applied, out.late), (1, 0), "on time on B: {out:?}");
    let page = read(&b, "c").await;
    assert!(
        page.rows.iter().any(|r| r.window_start == Some(MIN)),
        "the on-time event is in B's window [1m, 2m): {page:?}"
    );
    for n in [&a, &b, &c] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A node started to join the cluster (`joining`, what `serve --join` sets) vouches for no
/// horizon alone: its event at 60 min before it ever synced is refused as late
/// (`not_synced`), and once connected its horizon comes from the cluster's watermark, so B's
/// open window [1m, 2m) is never removed. (A node started alone instead is the first node of
/// a cluster of its own: it may remove its own windows, and merging two clusters started
/// apart is not supported, ARCHITECTURE.md "Seals".)
#[tokio::test]
async fn a_joining_nodes_horizon_removes_no_open_window() {
    let defs = || count_def(json!({}), json!({"tumbling": "1m", "retention": "1m"}));
    let root = tempfile::tempdir().expect("tempdir");
    let a = open_with(&root.path().join("a"), defs()).await;
    let b = open_with(&root.path().join("b"), defs()).await;
    let mut cfg = NodeConfig::new(root.path().join("c"));
    cfg.views = defs();
    cfg.joining = true;
    let c = Node::open(cfg).await.expect("open c");
    a.connect(&b).expect("connect");
    a.ingest("s", vec![ev("a", 1, 5 * MIN / 2)])
        .await
        .expect("a ingests");
    b.ingest("s", vec![ev("b", 1, 3 * MIN / 2)])
        .await
        .expect("b ingests");
    converge(&[&a, &b]).await;
    let out = c
        .ingest("s", vec![ev("c", 1, 60 * MIN)])
        .await
        .expect("c ingests");
    assert_eq!(out.late, 1, "not synced yet: {out:?}");
    c.maintain_views().await.expect("c maintains");
    assert_eq!(
        read(&c, "c").await.horizon,
        None,
        "C vouches for nothing alone"
    );
    c.connect(&a).expect("connect");
    c.connect(&b).expect("connect");
    converge(&[&a, &b, &c]).await;
    let out = c
        .ingest("s", vec![ev("c", 2, 60 * MIN)])
        .await
        .expect("c ingests");
    assert_eq!(out.late, 0, "synced: {out:?}");
    for _ in 0..20 {
        for n in [&a, &b, &c] {
            n.maintain_views().await.expect("maintain");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let page = read(&b, "c").await;
        assert!(
            page.rows.iter().any(|r| r.window_start == Some(MIN)),
            "B's open window [1m, 2m) is kept: {page:?}"
        );
    }
    for n in [&a, &b, &c] {
        n.shutdown().await.expect("shutdown");
    }
}

/// Retries of the same batches sent to two connected nodes at once (the producer failing over
/// while both replicate): whatever each node answers, the converged view counts exactly the
/// events acknowledged as applied (a write answered duplicate changed nothing, coalesced or
/// not). Randomness only in the interleaving; the property holds for every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_on_two_nodes_count_exactly_the_applied_events() {
    let defs = || {
        serde_json::from_value::<Vec<ViewDef>>(json!([
            {"name": "all", "stream": "s", "kind": "count"},
        ]))
        .expect("defs")
    };
    let root = tempfile::tempdir().expect("tempdir");
    let a = open_with(&root.path().join("a"), defs()).await;
    let b = open_with(&root.path().join("b"), defs()).await;
    a.connect(&b).expect("connect");
    let mut applied = 0usize;
    for k in 0..60u64 {
        let batch: Vec<Event> = (0..10)
            .map(|i| ev(&format!("p{}", k % 3), k * 10 + i, 1_000))
            .collect();
        let (x, y) = tokio::join!(a.ingest("s", batch.clone()), b.ingest("s", batch.clone()));
        for out in [x.expect("a"), y.expect("b")] {
            assert_eq!(out.applied + out.duplicates, 10, "{out:?}");
            applied += out.applied;
        }
        // A third retry after the two: all duplicates, changes nothing.
        let z = a.ingest("s", batch).await.expect("retry");
        applied += z.applied;
    }
    converge(&[&a, &b]).await;
    for n in [&a, &b] {
        let page = read(n, "all").await;
        let counted: u64 = page.rows.iter().filter_map(|r| r.value.as_u64()).sum();
        assert_eq!(counted, applied as u64, "view vs acknowledged applied");
    }
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// A duplicate moves no watermark: a retry of an applied event with a later time (answered
/// `duplicates: 1`), and a repeat of an event inside one batch with a later time, leave the
/// stream's watermark where the applied events put it, so an on-time event for an open window
/// is still applied afterwards.
#[tokio::test]
async fn a_duplicate_moves_no_watermark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open_with(
        dir.path(),
        count_def(json!({}), json!({"tumbling": "1m", "lateness": "0s"})),
    )
    .await;
    let base = now_ms() / HOUR * HOUR - 2 * HOUR;
    let out = node.ingest("s", vec![ev("a", 1, base + 10 * MIN)]).await;
    assert_eq!(out.expect("first").applied, 1);
    let wm = read(&node, "c").await.watermark;
    assert_eq!(wm, Some(base + 10 * MIN));
    // The retry carries a later time: a duplicate, so nothing moves.
    let out = node
        .ingest("s", vec![ev("a", 1, base + 50 * MIN)])
        .await
        .expect("retry");
    assert_eq!((out.applied, out.duplicates, out.late), (0, 1, 0));
    assert_eq!(
        read(&node, "c").await.watermark,
        wm,
        "a retry moved the watermark"
    );
    // One batch: a new event, then a repeat of it with a later time.
    let out = node
        .ingest(
            "s",
            vec![ev("a", 2, base + 11 * MIN), ev("a", 2, base + 55 * MIN)],
        )
        .await
        .expect("batch");
    assert_eq!((out.applied, out.duplicates), (1, 1));
    assert_eq!(
        read(&node, "c").await.watermark,
        Some(base + 11 * MIN),
        "a repeat inside a batch moved the watermark"
    );
    // The window [11m, 12m) is still open: an on-time event is applied, not late.
    let out = node
        .ingest("s", vec![ev("b", 1, base + 11 * MIN + 30_000)])
        .await
        .expect("on time");
    assert_eq!((out.applied, out.late), (1, 0));
    let page = read(&node, "c").await;
    let at_11: u64 = page
        .rows
        .iter()
        .filter(|r| r.window_start == Some(base + 11 * MIN))
        .filter_map(|r| r.value.as_u64())
        .sum();
    assert_eq!(at_11, 2);
    node.shutdown().await.expect("shutdown");
}

/// Two copies of one `(source, seq)` with different times sent at once to one node: whichever
/// the node applies, the copy answered duplicate moves no watermark — the watermark never
/// passes the largest time of an event answered applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_copies_on_one_node_move_the_watermark_only_by_the_applied_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open_with(
        dir.path(),
        count_def(json!({}), json!({"tumbling": "1m", "lateness": "0s"})),
    )
    .await;
    let base = now_ms() / HOUR * HOUR - 3 * HOUR;
    let mut applied_max = 0u64;
    for k in 0..100u64 {
        let early = base + k * 1_000;
        let later = early + 30 * MIN;
        let (x, y) = tokio::join!(
            node.ingest("s", vec![ev("p", k, early)]),
            node.ingest("s", vec![ev("p", k, later)])
        );
        let (x, y) = (x.expect("early"), y.expect("later"));
        assert_eq!(x.applied + y.applied, 1, "{x:?} {y:?}");
        applied_max = applied_max.max(if x.applied == 1 { early } else { later });
        let wm = read(&node, "c").await.watermark.unwrap_or(0);
        assert!(
            wm <= applied_max,
            "round {k}: watermark {wm} past the largest applied time {applied_max}"
        );
    }
    node.shutdown().await.expect("shutdown");
}

/// An event refused for too many dedup gaps moves no watermark.
#[tokio::test]
async fn an_event_refused_for_dedup_gaps_moves_no_watermark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = NodeConfig::new(dir.path());
    cfg.views = count_def(json!({}), json!({"tumbling": "1m", "lateness": "0s"}));
    cfg.limits.dedup_ranges_max = 4;
    let node = Node::open(cfg).await.expect("open");
    let base = now_ms() / HOUR * HOUR - 2 * HOUR;
    for seq in [1, 3, 5, 7] {
        node.ingest("s", vec![ev("g", seq, base + MIN)])
            .await
            .expect("within the ranges");
    }
    let wm = read(&node, "c").await.watermark;
    assert_eq!(wm, Some(base + MIN));
    let e = node
        .ingest("s", vec![ev("g", 9, base + 50 * MIN)])
        .await
        .expect_err("a fifth range");
    assert!(matches!(e, Error::DedupGaps { .. }), "{e:?}");
    assert_eq!(
        read(&node, "c").await.watermark,
        wm,
        "a refused event moved it"
    );
    let out = node
        .ingest("s", vec![ev("h", 1, base + 10 * MIN)])
        .await
        .expect("on time");
    assert_eq!((out.applied, out.late), (1, 0));
    node.shutdown().await.expect("shutdown");
}
