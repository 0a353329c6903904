//! Hostile review of restores that join (`snapshot/joining`, `meta/restored_joining`,
//! `meta/restored_context`, `Node::is_joining`): a copy used as a standalone node, the
//! disaster-recovery path, a copy next to its live source, restarts, offline snapshots and
//! the readiness probe. Tests that show an open defect are ignored with the defect as reason.

use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark::store::{OpenOptions, RedbStore};
use tidemark::views::{Event, ViewDef, ViewQuery};
use tidemark::{Node, NodeConfig};

use crate::http_support::{Served, get};

use crate::support::converge;

const MIN: u64 = 60_000;

/// The views of `views_membership` (stream `s`), and with `extra` a count view `ct` on a
/// stream `t` that nobody announced before.
fn defs(extra: bool) -> Vec<ViewDef> {
    let mut v = json!([
        {"name": "c", "stream": "s", "kind": "count", "window": {"tumbling": "1m"}},
        {"name": "d", "stream": "s", "kind": "distinct", "field": "user",
         "window": {"tumbling": "1m"}},
    ]);
    if extra {
        v.as_array_mut().expect("array").push(
            json!({"name": "ct", "stream": "t", "kind": "count", "window": {"tumbling": "1m"}}),
        );
    }
    serde_json::from_value(v).expect("defs")
}

fn config(dir: &std::path::Path, joining: bool, extra: bool) -> NodeConfig {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs(extra);
    cfg.joining = joining;
    cfg
}

async fn open(dir: &std::path::Path, joining: bool) -> Node {
    Node::open(config(dir, joining, false)).await.expect("open")
}

fn ev(src: &str, seq: u64, t: u64, user: &str) -> Event {
    Event::new(src, seq, json!({"user": user})).at(t)
}

/// `(view, window start) → (value, final)` on `node` for `views`.
async fn rows_of(
    node: &Node,
    views: &[&str],
) -> BTreeMap<(String, u64), (serde_json::Value, bool)> {
    let mut out = BTreeMap::new();
    for v in views {
        let page = node.view(v, &ViewQuery::default()).await.expect("view");
        for r in page.rows {
            out.insert(
                ((*v).to_owned(), r.window_start.unwrap_or(0)),
                (r.value, r.is_final),
            );
        }
    }
    out
}

async fn rows(node: &Node) -> BTreeMap<(String, u64), (serde_json::Value, bool)> {
    rows_of(node, &["c", "d"]).await
}

/// Waits until `view`'s window `start` is final on `node` (maintaining it), and returns its
/// value; fails after 10 s with what the node reports.
async fn wait_final(node: &Node, view: &str, start: u64) -> serde_json::Value {
    wait_final_among(node, &[node], view, start).await
}

/// As [`wait_final`], maintaining every node of `all` each round (seals need each member's).
async fn wait_final_among(node: &Node, all: &[&Node], view: &str, start: u64) -> serde_json::Value {
    let started = Instant::now();
    loop {
        for n in all {
            n.maintain_views().await.expect("maintain");
        }
        let rs = rows_of(node, &[view]).await;
        if let Some((v, true)) = rs.get(&(view.to_owned(), start)) {
            return v.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "window {view}@{start} never final: {rs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two nodes A and B (started alone, linked) with window [0, 1m) final: count 2.
async fn two_with_a_final_window(root: &std::path::Path) -> (Node, Node) {
    let a = open(&root.join("a"), false).await;
    let b = open(&root.join("b"), false).await;
    a.connect(&b).expect("connect");
    a.ingest("s", vec![ev("a", 1, 10_000, "a")])
        .await
        .expect("a");
    b.ingest("s", vec![ev("b", 1, 20_000, "b")])
        .await
        .expect("b");
    a.ingest("s", vec![ev("a", 2, 2 * MIN, "a")])
        .await
        .expect("a");
    b.ingest("s", vec![ev("b", 2, 2 * MIN, "b")])
        .await
        .expect("b");
    converge(&[&a, &b]).await;
    assert_eq!(wait_final(&a, "c", 0).await, json!(2));
    assert_eq!(wait_final(&b, "c", 0).await, json!(2));
    (a, b)
}

/// Disaster recovery from a snapshot of a joining node J (cluster F + J, both lost); the
/// copy is opened on `dir` with `extra` views. Returns the lost replica ids.
async fn lost_cluster_snapshot(
    root: &std::path::Path,
) -> (std::path::PathBuf, Vec<tidemark::ReplicaId>) {
    let f = open(&root.join("f"), false).await;
    let j = open(&root.join("j"), true).await;
    f.connect(&j).expect("connect");
    f.ingest("s", vec![ev("f", 1, 10_000, "f")])
        .await
        .expect("f");
    let started = Instant::now();
    for seq in 1.. {
        let out = j
            .ingest("s", vec![ev("j", seq, 10_000, "j")])
            .await
            .expect("j");
        if out.late == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "j never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    converge(&[&f, &j]).await;
    let snap = root.join("j.snap");
    j.snapshot(&snap).await.expect("snapshot");
    let lost = vec![f.replica_id(), j.replica_id()];
    for n in [f, j] {
        n.shutdown().await.expect("shutdown");
    }
    (snap, lost)
}

/// The operator's "analytics copy": a snapshot of a live member (A, in A + B with a sealed
/// window) restored to run a NEW standalone node. It joins (late `not_synced`); the
/// documented way out is to remove the other announcers (`members remove`) on the copy. After
/// that it must ingest on time and finalize windows by itself, also across a restart (what
/// happens to the windows its source's cluster sealed: see
/// `a_copy_keeps_the_final_windows_of_its_snapshot_after_the_removal`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_analytics_copy_of_a_member_works_alone_once_its_cluster_is_removed() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    let lost = [a.replica_id(), b.replica_id()];
    let dir = root.path().join("r");
    Node::restore(&snap, &dir).expect("restore");
    let r = open(&dir, false).await;
    assert!(r.is_joining(), "a copy of a member joins");
    let out = r
        .ingest("s", vec![ev("r", 1, 3 * MIN + 1, "r")])
        .await
        .expect("r ingests");
    assert_eq!(out.late, 1, "before the removal the copy waits: {out:?}");
    for id in lost {
        r.decommission(id).await.expect("decommission");
    }
    let out = r
        .ingest(
            "s",
            vec![ev("r", 2, 3 * MIN + 2, "r"), ev("r", 3, 5 * MIN, "r")],
        )
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (2, 0), "{out:?}");
    assert_eq!(wait_final(&r, "c", 3 * MIN).await, json!(1));
    // A restart keeps it working alone.
    r.shutdown().await.expect("shutdown");
    drop(r);
    let r = open(&dir, false).await;
    let out = r
        .ingest(
            "s",
            vec![ev("r", 4, 5 * MIN + 1, "r"), ev("r", 5, 7 * MIN, "r")],
        )
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (2, 0), "{out:?}");
    assert_eq!(wait_final(&r, "c", 5 * MIN).await, json!(2));
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// The cluster rebuilt from a copy of a joining node (every other member lost and removed)
/// later gets a view on a NEW stream `t` (nobody ever announced it). The copy is its whole
/// cluster: it must finalize `t`'s windows by itself, as it does for `s`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_cluster_finalizes_a_stream_added_after_the_recovery() {
    let root = tempfile::tempdir().expect("tempdir");
    let (snap, lost) = lost_cluster_snapshot(root.path()).await;
    let dir = root.path().join("r");
    Node::restore(&snap, &dir).expect("restore");
    let r = Node::open(config(&dir, false, true)).await.expect("open");
    assert!(r.is_joining(), "a copy of a member joins");
    for id in lost {
        r.decommission(id).await.expect("decommission");
    }
    assert!(
        !r.is_joining(),
        "every other member removed: the copy is the whole cluster"
    );
    // The recovered stream works (the path the branch fixed).
    let out = r
        .ingest(
            "s",
            vec![ev("r", 1, 2 * MIN, "r"), ev("r", 2, 4 * MIN, "r")],
        )
        .await
        .expect("r ingests s");
    assert_eq!((out.applied, out.late), (2, 0), "{out:?}");
    assert_eq!(wait_final(&r, "c", 2 * MIN).await, json!(1));
    // The new stream: events on time, and the window passed must become final.
    let out = r
        .ingest("t", vec![ev("r", 1, 10_000, "r"), ev("r", 2, 2 * MIN, "r")])
        .await
        .expect("r ingests t");
    let lane = r.late_events("t", None, 0).expect("late lane");
    let reasons: Vec<_> = lane
        .events
        .iter()
        .map(|e| e.record["reason"].clone())
        .collect();
    assert_eq!(
        (out.applied, out.late),
        (2, 0),
        "{out:?} late reasons {reasons:?}"
    );
    assert_eq!(wait_final(&r, "ct", 0).await, json!(1));
    r.shutdown().await.expect("shutdown");
}

/// The same rebuilt cluster after a restart, with the view on `t` added then (the operator
/// edits the config and restarts): it must finalize `t`'s windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_cluster_restarted_with_a_new_view_finalizes_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let (snap, lost) = lost_cluster_snapshot(root.path()).await;
    let dir = root.path().join("r");
    Node::restore(&snap, &dir).expect("restore");
    let r = open(&dir, false).await;
    for id in lost {
        r.decommission(id).await.expect("decommission");
    }
    let out = r
        .ingest(
            "s",
            vec![ev("r", 1, 2 * MIN, "r"), ev("r", 2, 4 * MIN, "r")],
        )
        .await
        .expect("r ingests s");
    assert_eq!((out.applied, out.late), (2, 0), "{out:?}");
    r.shutdown().await.expect("shutdown");
    drop(r);
    let r = Node::open(config(&dir, false, true)).await.expect("open");
    let out = r
        .ingest("t", vec![ev("r", 1, 10_000, "r"), ev("r", 2, 2 * MIN, "r")])
        .await
        .expect("r ingests t");
    let lane = r.late_events("t", None, 0).expect("late lane");
    let reasons: Vec<_> = lane
        .events
        .iter()
        .map(|e| e.record["reason"].clone())
        .collect();
    assert_eq!(
        (out.applied, out.late),
        (2, 0),
        "{out:?} late reasons {reasons:?}"
    );
    assert_eq!(wait_final(&r, "ct", 0).await, json!(1));
    r.shutdown().await.expect("shutdown");
}

/// A copy restored next to its live source (A + B sealed window 0, R a copy of A linked to
/// A): R syncs, holds the cluster's final value, and everything new is final with one value
/// on all three nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_next_to_its_live_source_agrees_on_every_final() {
    copy_next_to_its_live_source(false).await;
}

/// As [`a_copy_next_to_its_live_source_agrees_on_every_final`], also requiring the windows
/// after the copy joined to become final (within 10 s of maintenance on all three nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "BUG (liveness, intermittent ~1 run in 4-5 under load): after a copy of A joins A + B \
            (linked to both), windows [3m,4m) and [4m,5m) never become final on any node \
            although all three passed them (6m); finals agree where they exist (likely the \
            documented 'sets fixed at different memberships' weak spot, a copy joining is an \
            easy trigger)"]
async fn a_copy_next_to_its_live_source_lets_later_windows_become_final() {
    copy_next_to_its_live_source(true).await;
}

async fn copy_next_to_its_live_source(live: bool) {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    // The cluster moves on after the snapshot: window 1 sealed without the copy.
    a.ingest(
        "s",
        vec![ev("a", 3, MIN + 1, "a"), ev("a", 4, 3 * MIN, "a")],
    )
    .await
    .expect("a");
    b.ingest(
        "s",
        vec![ev("b", 3, MIN + 2, "b"), ev("b", 4, 3 * MIN, "b")],
    )
    .await
    .expect("b");
    converge(&[&a, &b]).await;
    assert_eq!(wait_final(&a, "c", MIN).await, json!(2));
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    // Before it syncs an event for window 1 is late, not applied.
    let out = r
        .ingest("s", vec![ev("r", 1, MIN + 3, "r")])
        .await
        .expect("r");
    assert_eq!(out.late, 1, "{out:?}");
    r.connect(&a).expect("connect");
    r.connect(&b).expect("connect");
    let started = Instant::now();
    for seq in 2.. {
        let out = r
            .ingest("s", vec![ev("r", seq, 4 * MIN, "r")])
            .await
            .expect("r");
        if out.late == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "r never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Synced with a live member of its cluster: the copy no longer joins (node-level).
    assert!(
        !r.is_joining(),
        "synced with its cluster, the copy still joins"
    );
    // Window 1 must stay at the cluster's value on R; an event for it now is late.
    let out = r
        .ingest("s", vec![ev("r", 100, MIN + 4, "r")])
        .await
        .expect("r");
    assert_eq!(out.late, 1, "{out:?}");
    for n in [&a, &b] {
        n.ingest("s", vec![ev("x", 1, 6 * MIN, "x")])
            .await
            .expect("ingest");
    }
    r.ingest("s", vec![ev("x", 1, 6 * MIN, "x")])
        .await
        .expect("ingest");
    converge(&[&a, &b, &r]).await;
    for w in [0, MIN] {
        let mut seen = Vec::new();
        for n in [&a, &b, &r] {
            seen.push(wait_final_among(n, &[&a, &b, &r], "c", w).await);
        }
        assert!(
            seen.windows(2).all(|p| p[0] == p[1]),
            "window {w}: {seen:?}"
        );
    }
    assert_eq!(wait_final(&r, "c", MIN).await, json!(2));
    if live {
        for w in [3 * MIN, 4 * MIN] {
            for n in [&a, &b, &r] {
                wait_final_among(n, &[&a, &b, &r], "c", w).await;
            }
        }
    }
    // Whatever is final anywhere has one value everywhere.
    for _ in 0..20 {
        for n in [&a, &b, &r] {
            n.maintain_views().await.expect("maintain");
        }
        let all = [rows(&a).await, rows(&b).await, rows(&r).await];
        let mut finals: BTreeMap<(String, u64), serde_json::Value> = BTreeMap::new();
        for rs in &all {
            for (k, (v, f)) in rs {
                if *f {
                    let prev = finals.entry(k.clone()).or_insert_with(|| v.clone());
                    assert_eq!(prev, v, "two final values of {k:?}: {all:?}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A founder that met a peer, restarted (alone, its peer unreachable for now) before it ever
/// ingested, is still a member of that cluster: a snapshot of it must make a joining copy
/// (the branch's own rule: "any node that has met a peer").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_founder_that_met_a_peer_snapshots_as_a_member() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = open(&root.path().join("a"), false).await;
    let b = open(&root.path().join("b"), false).await;
    a.connect(&b).expect("connect");
    // Let the peers-met bookkeeping run a few rounds.
    for _ in 0..5 {
        a.maintain_views().await.expect("maintain");
        b.maintain_views().await.expect("maintain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    converge(&[&a, &b]).await;
    a.shutdown().await.expect("shutdown");
    drop(a);
    let a = open(&root.path().join("a"), false).await;
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(
        r.is_joining(),
        "a copy of a founder that met a peer in an earlier run opens as a founder"
    );
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// The documented offline route (`tidemark snapshot --data DIR` = `RedbStore::snapshot` on a
/// member's own data directory): A and B met, nobody ingested; the copy of A's directory
/// carries no `snapshot/joining` and opens as a founder. It must still never report a final
/// value for window 0 that differs from the cluster's (it holds the peers-met announcement,
/// so the restored wait keeps it from applying events until it hears from the cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_copy_of_a_member_never_disagrees_on_a_final_window() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = open(&root.path().join("a"), false).await;
    let b = open(&root.path().join("b"), false).await;
    a.connect(&b).expect("connect");
    for _ in 0..5 {
        a.maintain_views().await.expect("maintain");
        b.maintain_views().await.expect("maintain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    converge(&[&a, &b]).await;
    a.shutdown().await.expect("shutdown");
    drop(a);
    {
        let store =
            RedbStore::open(&root.path().join("a"), OpenOptions::default()).expect("open store");
        store
            .snapshot(&root.path().join("a.snap"), 0)
            .expect("offline snapshot");
    }
    Node::restore(root.path().join("a.snap"), root.path().join("r")).expect("restore");
    let a = open(&root.path().join("a"), false).await;
    a.connect(&b).expect("connect");
    let r = open(&root.path().join("r"), false).await;
    let joining = r.is_joining();
    for (n, name) in [(&a, "a"), (&b, "b")] {
        n.ingest(
            "s",
            vec![ev(name, 1, 10_000, name), ev(name, 2, 2 * MIN, name)],
        )
        .await
        .expect("ingest");
    }
    r.ingest("s", vec![ev("r", 1, 10_000, "r"), ev("r", 2, 2 * MIN, "r")])
        .await
        .expect("ingest");
    converge(&[&a, &b]).await;
    let ab = wait_final(&a, "c", 0).await;
    r.maintain_views().await.expect("maintain");
    let before = rows(&r).await.get(&("c".to_owned(), 0)).cloned();
    r.connect(&a).expect("connect");
    r.connect(&b).expect("connect");
    converge(&[&a, &b, &r]).await;
    for n in [&a, &b, &r] {
        n.maintain_views().await.expect("maintain");
    }
    let after = rows(&r).await.get(&("c".to_owned(), 0)).cloned();
    assert!(
        !matches!(&before, Some((v, true)) if *v != ab),
        "joining={joining}: the copy reported window 0 final = {before:?}, the cluster {ab}"
    );
    assert!(
        !matches!(&after, Some((v, true)) if *v != ab),
        "joining={joining}: linked, the copy reports window 0 final = {after:?}, the cluster {ab}"
    );
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// `/readyz` of the disaster-recovery node: once the lost members are removed it is the
/// cluster, ingests on time and finalizes windows; it must report ready (a probe that never
/// passes keeps the only surviving node out of service / in a restart loop).
#[test]
fn readyz_of_a_rebuilt_cluster_is_ready() {
    let root = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (snap, lost) = rt.block_on(lost_cluster_snapshot(root.path()));
    let dir = root.path().join("r");
    Node::restore(&snap, &dir).expect("restore");
    let d = dir.clone();
    let s = Served::start_with(move |n, _| {
        n.data_dir = d;
        n.views = defs(false);
    });
    let before = get(&s.url("/readyz"));
    assert_eq!(before.status, 503, "{}", before.text);
    assert!(
        before.text.contains("restored from a snapshot") && !before.text.contains("--join"),
        "a restored copy that waits says so: {}",
        before.text
    );
    let node = s.node.clone();
    rt.block_on(async {
        for id in lost {
            node.decommission(id).await.expect("decommission");
        }
        let out = node
            .ingest(
                "s",
                vec![ev("r", 1, 2 * MIN, "r"), ev("r", 2, 4 * MIN, "r")],
            )
            .await
            .expect("ingest");
        assert_eq!((out.applied, out.late), (2, 0), "{out:?}");
        assert_eq!(wait_final(&node, "c", 2 * MIN).await, json!(1));
    });
    let started = Instant::now();
    loop {
        let r = get(&s.url("/readyz"));
        if r.status == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the rebuilt cluster (finalizing windows) is never ready: {} {} (before the \
             removal: {} {})",
            r.status,
            r.text,
            before.status,
            before.text
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(node);
    s.stop();
}

/// The documented way out for a standalone copy of a live member is to remove its cluster
/// (`members remove`) on the copy. If that copy is ever linked to the live cluster (same seed
/// list in its config, an operator mistake), its removal records must not decommission the
/// live members: they would stop applying events for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "BUG (operational hazard): the only way to run a copy of a member standalone is \
            to decommission its source's cluster on it; linked to the live cluster later, \
            those records decommission the live members A and B (is_decommissioned true on \
            both; their events late once they apply it): nothing refuses removes made by a \
            copy outside the cluster's seals (also on main; the branch widens who needs the \
            escape)"]
async fn an_analytics_copy_that_removed_its_cluster_does_not_decommission_it_when_linked() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    for id in [a.replica_id(), b.replica_id()] {
        r.decommission(id).await.expect("decommission");
    }
    r.connect(&a).expect("connect");
    converge(&[&a, &b, &r]).await;
    let out = a
        .ingest("s", vec![ev("a", 10, 5 * MIN, "a")])
        .await
        .expect("a ingests");
    assert!(
        !a.is_decommissioned().expect("read") && out.late == 0,
        "a live member was decommissioned by a standalone copy's escape: a decommissioned={}, \
         b decommissioned={}, a's ingest {out:?}",
        a.is_decommissioned().expect("read"),
        b.is_decommissioned().expect("read"),
    );
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// The copy of A (window [0,1m) final = 2 on A and B when the snapshot was taken) removes its
/// cluster and ingests (as in `an_analytics_copy_of_a_member_works_alone_once_its_cluster_is_removed`).
/// The window its source reported final must stay final with the same value on the copy.
/// Timing-dependent, so the scenario runs several times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_keeps_the_final_windows_of_its_snapshot_after_the_removal() {
    for round in 0..8 {
        let root = tempfile::tempdir().expect("tempdir");
        let (a, b) = two_with_a_final_window(root.path()).await;
        let snap = root.path().join("a.snap");
        a.snapshot(&snap).await.expect("snapshot");
        let dir = root.path().join("r");
        Node::restore(&snap, &dir).expect("restore");
        let r = open(&dir, false).await;
        r.ingest("s", vec![ev("r", 1, 3 * MIN + 1, "r")])
            .await
            .expect("r ingests");
        for id in [a.replica_id(), b.replica_id()] {
            r.decommission(id).await.expect("decommission");
        }
        r.ingest(
            "s",
            vec![ev("r", 2, 3 * MIN + 2, "r"), ev("r", 3, 5 * MIN, "r")],
        )
        .await
        .expect("r ingests");
        wait_final(&r, "c", 3 * MIN).await;
        let on_r = rows(&r).await;
        let lane = r.late_events("s", None, 0).expect("late lane");
        let w0: Vec<_> = lane
            .events
            .iter()
            .filter(|e| e.record["contribution"]["window_start"] == json!(0))
            .map(|e| e.record.clone())
            .collect();
        assert_eq!(
            on_r.get(&("c".to_owned(), 0)),
            Some(&(json!(2), true)),
            "round {round}: A and B hold window 0 final = {:?}; the copy: {on_r:?}; its late \
             lane for window 0: {w0:?}",
            rows(&a).await.get(&("c".to_owned(), 0))
        );
        for n in [a, b, r] {
            n.shutdown().await.expect("shutdown");
        }
    }
}
