//! Finality through a cluster's life (`src/views/seal.rs`): a window reported final keeps its
//! value and stays final on every node when nodes join for the first time (joining or
//! started alone), come back from a snapshot, or sit idle; a node that joins adopts the
//! cluster's seals instead of counting its own contributions into them.
//!
//! Embedded nodes connected in-process: the same writer, views and seal code as the daemon.

use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark::store::{OpenOptions, RedbStore};
use tidemark::views::{Event, ViewDef, ViewQuery};
use tidemark::{Node, NodeConfig};

use crate::support::converge;

const MIN: u64 = 60_000;

fn defs() -> Vec<ViewDef> {
    serde_json::from_value(json!([
        {"name": "c", "stream": "s", "kind": "count", "window": {"tumbling": "1m"}},
        {"name": "d", "stream": "s", "kind": "distinct", "field": "user",
         "window": {"tumbling": "1m"}},
        {"name": "sess", "stream": "s", "kind": "count", "window": {"session": "30s"}},
    ]))
    .expect("defs")
}

async fn open(dir: &std::path::Path, joining: bool) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs();
    cfg.joining = joining;
    Node::open(cfg).await.expect("open")
}

fn ev(src: &str, seq: u64, t: u64, user: &str) -> Event {
    Event::new(src, seq, json!({"user": user})).at(t)
}

/// `(view, window start) → (value, final)` on `node`.
async fn rows(node: &Node) -> BTreeMap<(String, u64), (serde_json::Value, bool)> {
    let mut out = BTreeMap::new();
    for v in ["c", "d"] {
        let page = node.view(v, &ViewQuery::default()).await.expect("view");
        for r in page.rows {
            out.insert(
                (v.to_owned(), r.window_start.unwrap_or(0)),
                (r.value, r.is_final),
            );
        }
    }
    out
}

/// Waits until `window` of both views is final on every node of `nodes`; returns its values.
async fn final_on(nodes: &[&Node], window: u64) -> (serde_json::Value, serde_json::Value) {
    let started = Instant::now();
    loop {
        converge(nodes).await;
        let mut all = Vec::new();
        for n in nodes {
            all.push(rows(n).await);
        }
        let get = |r: &BTreeMap<(String, u64), (serde_json::Value, bool)>, v: &str| {
            r.get(&(v.to_owned(), window)).cloned()
        };
        let done = all
            .iter()
            .all(|r| get(r, "c").is_some_and(|(_, f)| f) && get(r, "d").is_some_and(|(_, f)| f));
        if done {
            let c = get(&all[0], "c").map(|(v, _)| v).unwrap_or_default();
            let d = get(&all[0], "d").map(|(v, _)| v).unwrap_or_default();
            for r in &all {
                assert_eq!(get(r, "c").map(|(v, _)| v), Some(c.clone()), "{all:?}");
                assert_eq!(get(r, "d").map(|(v, _)| v), Some(d.clone()), "{all:?}");
            }
            return (c, d);
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "window {window} not final everywhere: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Two seeded nodes A and B with window [0, 1m) final: count 2, distinct ["a", "b"].
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
    // Both pass the window's deadline (lateness 0).
    a.ingest("s", vec![ev("a", 2, 2 * MIN, "a")])
        .await
        .expect("a");
    b.ingest("s", vec![ev("b", 2, 2 * MIN, "b")])
        .await
        .expect("b");
    let got = final_on(&[&a, &b], 0).await;
    assert_eq!(got, (json!(2), json!(["a", "b"])));
    (a, b)
}

/// Ingests events of source `name` at time `t` (user `name`, seqs from 1) into `node` until
/// one is on time: until a joining node synced, its events are late (`not_synced`). Fails
/// after 20 s.
async fn ingest_once_synced(node: &Node, name: &str, t: u64) {
    let started = Instant::now();
    for seq in 1.. {
        let out = node
            .ingest("s", vec![ev(name, seq, t, name)])
            .await
            .expect("ingest");
        if out.late == 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{name} never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `(view, window start, contributing node) → value` of the late lane's records of
/// contributions a seal left out on `node` (`outside_seal` with a `contribution`), and how
/// many records each key has (the session view's only with `sessions`).
async fn sealed_out(
    node: &Node,
    sessions: bool,
) -> BTreeMap<(String, u64, String), (serde_json::Value, usize)> {
    node.maintain_views().await.expect("maintain");
    let lane = node.late_events("s", None, 0).expect("lane");
    let mut out = BTreeMap::new();
    for e in lane.events {
        let r = &e.record;
        let Some(c) = r.get("contribution") else {
            continue;
        };
        assert_eq!(r["reason"], json!("outside_seal"), "{r}");
        if c["view"] == json!("sess") && !sessions {
            continue;
        }
        let key = (
            c["view"].as_str().unwrap_or_default().to_owned(),
            c["window_start"].as_u64().unwrap_or(u64::MAX),
            r["node"].as_str().unwrap_or_default().to_owned(),
        );
        let slot = out.entry(key).or_insert((json!(null), 0));
        *slot = (c["value"].clone(), slot.1 + 1);
    }
    out
}

/// Maintenance rounds on `node` until its records of contributions sealed out are `want`
/// (fails after 10 s), then ten more rounds in which they stay exactly that: nothing recorded
/// twice.
async fn settles_to(
    node: &Node,
    sessions: bool,
    want: &BTreeMap<(String, u64, String), (serde_json::Value, usize)>,
) {
    let started = Instant::now();
    loop {
        let got = sealed_out(node, sessions).await;
        if got == *want {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "late lane's contributions: {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..10 {
        assert_eq!(sealed_out(node, sessions).await, *want, "recorded twice");
    }
}

/// Rounds of seals and reads on every node; the window stays final with its value on each of
/// `watched`, never turning non-final in between.
async fn stays_final(
    watched: &[&Node],
    all: &[&Node],
    window: u64,
    want: &(serde_json::Value, serde_json::Value),
) {
    for _ in 0..10 {
        for n in all {
            n.maintain_views().await.expect("maintain");
        }
        for n in watched {
            let r = rows(n).await;
            assert_eq!(
                r.get(&("c".to_owned(), window)),
                Some(&(want.0.clone(), true)),
                "{r:?}"
            );
            assert_eq!(
                r.get(&("d".to_owned(), window)),
                Some(&(want.1.clone(), true)),
                "{r:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A joining node: C (started to join a cluster) ingests an event for the final
/// window before it ever met anyone. It is refused as late (`not_synced`, kept in C's late
/// lane); after C connects every node reports the window final with the same value, and C
/// refuses later events for it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_node_never_met_before_changes_no_final_window() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let want = (json!(2), json!(["a", "b"]));
    let c = open(&root.path().join("c"), true).await;
    let out = c
        .ingest("s", vec![ev("c", 1, 30_000, "c")])
        .await
        .expect("c ingests");
    assert_eq!((out.applied, out.late), (1, 1), "{out:?}");
    let lane = c.late_events("s", None, 0).expect("late lane");
    assert_eq!(lane.events.len(), 1, "{lane:?}");
    assert_eq!(lane.events[0].record["reason"], json!("not_synced"));
    assert!(rows(&c).await.is_empty(), "C applied nothing to a window");
    c.connect(&a).expect("connect");
    c.connect(&b).expect("connect");
    assert_eq!(final_on(&[&a, &b, &c], 0).await, want);
    stays_final(&[&a, &b, &c], &[&a, &b, &c], 0, &want).await;
    // Synced, C starts from the cluster's watermark: the final window is late on C as well.
    let out = c
        .ingest("s", vec![ev("c", 2, 40_000, "c")])
        .await
        .expect("c ingests");
    assert_eq!(out.late, 1, "{out:?}");
    stays_final(&[&a, &b, &c], &[&a, &b, &c], 0, &want).await;
    for n in [a, b, c] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A node started alone (the default: it may finalize alone): C applies an
/// event for the window A and B sealed, then connects. A and B keep the window final with
/// their value (C's contribution is outside their seal); C, which counted its own event,
/// never reports that window final with another value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_alone_cannot_change_a_final_window() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let want = (json!(2), json!(["a", "b"]));
    let c = open(&root.path().join("c"), false).await;
    let out = c
        .ingest("s", vec![ev("c", 1, 30_000, "c")])
        .await
        .expect("c ingests");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    c.connect(&a).expect("connect");
    c.connect(&b).expect("connect");
    converge(&[&a, &b, &c]).await;
    stays_final(&[&a, &b], &[&a, &b, &c], 0, &want).await;
    let r = rows(&c).await;
    for v in ["c", "d"] {
        if let Some((value, true)) = r.get(&(v.to_owned(), 0)) {
            let w = if v == "c" { &want.0 } else { &want.1 };
            assert_eq!(
                value, w,
                "C reports the window final with another value: {r:?}"
            );
        }
    }
    // Now that C holds A's and B's membership for the window, which does not count C, C
    // refuses a further event for it as late (kept in its late lane) instead of applying
    // what no seal would count.
    c.maintain_views().await.expect("maintain");
    let out = c
        .ingest("s", vec![ev("c", 2, 45_000, "c")])
        .await
        .expect("c ingests");
    assert_eq!(out.late, 1, "{out:?}");
    let lane = c.late_events("s", None, 0).expect("late lane");
    assert_eq!(
        lane.events.last().map(|e| e.record["reason"].clone()),
        Some(json!("outside_seal")),
        "{lane:?}"
    );
    for n in [a, b, c] {
        n.shutdown().await.expect("shutdown");
    }
}

/// An idle node joins (it never ingests): windows that were final stay final
/// with their value on every node that reported them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_joining_takes_back_no_final_window() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let want = (json!(2), json!(["a", "b"]));
    let d = open(&root.path().join("d"), true).await;
    d.connect(&a).expect("connect");
    d.connect(&b).expect("connect");
    converge(&[&a, &b, &d]).await;
    stays_final(&[&a, &b], &[&a, &b, &d], 0, &want).await;
    // It holds later windows open (it announced no watermark): nothing new is final.
    a.ingest("s", vec![ev("a", 3, 4 * MIN, "a")])
        .await
        .expect("a");
    b.ingest("s", vec![ev("b", 3, 4 * MIN, "b")])
        .await
        .expect("b");
    converge(&[&a, &b, &d]).await;
    for n in [&a, &b] {
        n.maintain_views().await.expect("maintain");
        let r = rows(n).await;
        assert_eq!(
            r.get(&("c".to_owned(), 2 * MIN)),
            Some(&(json!(2), false)),
            "{r:?}"
        );
    }
    stays_final(&[&a, &b], &[&a, &b, &d], 0, &want).await;
    for n in [a, b, d] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A's snapshot restored as a new node R (new replica id). R starts from the
/// watermarks its state holds, refuses an event for the final window, adopts the seal its
/// source made, and after connecting B's final window is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restored_from_a_snapshot_changes_no_final_window() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let want = (json!(2), json!(["a", "b"]));
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    a.shutdown().await.expect("shutdown");
    drop(a);
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    let out = r
        .ingest("s", vec![ev("r", 1, 30_000, "r")])
        .await
        .expect("r ingests");
    assert_eq!(out.late, 1, "{out:?}");
    r.connect(&b).expect("connect");
    converge(&[&b, &r]).await;
    stays_final(&[&b, &r], &[&b, &r], 0, &want).await;
    for n in [b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A copy of a joining node restored from a snapshot taken before the node ever synced (the
/// snapshot holds no announcement of the stream) is a joining node too, even opened without
/// `joining`: it applies no event to a window before it syncs (late, `not_synced`), reports
/// nothing final alone even once it passed a window's deadline, and after it meets the cluster
/// every node reports the cluster's final value. (It used to open as a founder: it applied the
/// event and sealed the window over itself alone, final with count 1.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_joining_node_that_never_synced_waits_to_sync_like_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let want = (json!(2), json!(["a", "b"]));
    let c = open(&root.path().join("c"), true).await;
    let snap = root.path().join("c.snap");
    c.snapshot(&snap).await.expect("snapshot");
    c.shutdown().await.expect("shutdown");
    drop(c);
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(r.is_joining(), "a copy of a joining node joins");
    // An event for the window A and B sealed, and one past its deadline: neither is applied
    // to a window before R synced.
    let out = r
        .ingest("s", vec![ev("r", 1, 30_000, "r"), ev("r", 2, 2 * MIN, "r")])
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (2, 2), "{out:?}");
    let lane = r.late_events("s", None, 0).expect("late lane");
    assert_eq!(lane.events.len(), 2, "{lane:?}");
    for e in &lane.events {
        assert_eq!(e.record["reason"], json!("not_synced"), "{lane:?}");
    }
    r.maintain_views().await.expect("maintain");
    assert!(rows(&r).await.is_empty(), "R applied nothing to a window");
    // A snapshot of the copy keeps it: a copy of the copy joins too.
    let snap2 = root.path().join("r.snap");
    r.snapshot(&snap2).await.expect("snapshot");
    Node::restore(&snap2, root.path().join("r2")).expect("restore");
    let r2 = open(&root.path().join("r2"), false).await;
    assert!(r2.is_joining(), "a copy of a copy of a joining node joins");
    r2.shutdown().await.expect("shutdown");
    drop(r2);
    // So does a copy made offline from the copy's data directory (the record is in its meta).
    {
        let store = RedbStore::open(&root.path().join("r2"), OpenOptions::default())
            .expect("open the store");
        assert!(store.restored_joining());
        let snap3 = root.path().join("r2.snap");
        store.snapshot(&snap3, 0).expect("offline snapshot");
        Node::restore(&snap3, root.path().join("r3")).expect("restore");
    }
    let r3 = open(&root.path().join("r3"), false).await;
    assert!(r3.is_joining(), "an offline copy of such a copy joins");
    r3.shutdown().await.expect("shutdown");
    drop(r3);
    // Once it meets the cluster it syncs and holds the cluster's final window.
    r.connect(&a).expect("connect");
    r.connect(&b).expect("connect");
    assert_eq!(final_on(&[&a, &b, &r], 0).await, want);
    stays_final(&[&a, &b, &r], &[&a, &b, &r], 0, &want).await;
    // Synced, it starts from the cluster's watermark: the final window stays late on R.
    let out = r
        .ingest("s", vec![ev("r", 3, 40_000, "r")])
        .await
        .expect("r ingests");
    assert_eq!(out.late, 1, "{out:?}");
    stays_final(&[&a, &b, &r], &[&a, &b, &r], 0, &want).await;
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A cluster rebuilt from a snapshot of a joining node after every other member was lost: the
/// copy joins, so it waits (late, `not_synced`) while the lost members may still be out
/// there; once the operator removes them for good (the source's old id too) it is the cluster:
/// it applies events and reports windows final by itself, with no peer to link to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_joining_node_alone_is_the_cluster_once_the_lost_members_are_removed() {
    let root = tempfile::tempdir().expect("tempdir");
    let f = open(&root.path().join("f"), false).await;
    let j = open(&root.path().join("j"), true).await;
    f.connect(&j).expect("connect");
    f.ingest("s", vec![ev("f", 1, 10_000, "f")])
        .await
        .expect("f");
    ingest_once_synced(&j, "j", 10_000).await;
    converge(&[&f, &j]).await;
    let snap = root.path().join("j.snap");
    j.snapshot(&snap).await.expect("snapshot");
    let lost = [f.replica_id(), j.replica_id()];
    for n in [f, j] {
        n.shutdown().await.expect("shutdown");
    }
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(r.is_joining(), "a copy of a joining node joins");
    let out = r
        .ingest("s", vec![ev("r", 1, 2 * MIN, "r")])
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (1, 1), "{out:?}");
    // (The lane also holds J's records from before it synced: the lane replicates.)
    let lane = r.late_events("s", None, 0).expect("late lane");
    let mine: Vec<_> = lane
        .events
        .iter()
        .filter(|e| e.record["node"] == json!(r.replica_id().to_string()))
        .collect();
    assert_eq!(mine.len(), 1, "{lane:?}");
    assert_eq!(mine[0].record["reason"], json!("not_synced"));
    for id in lost {
        r.decommission(id).await.expect("decommission");
    }
    let out = r
        .ingest(
            "s",
            vec![ev("r", 2, 2 * MIN, "r"), ev("r", 3, 4 * MIN, "r")],
        )
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (2, 0), "{out:?}");
    let started = Instant::now();
    loop {
        r.maintain_views().await.expect("maintain");
        let rs = rows(&r).await;
        if rs.get(&("c".to_owned(), 2 * MIN)) == Some(&(json!(1), true)) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the rebuilt cluster never finalized the window: {rs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    r.shutdown().await.expect("shutdown");
}

/// A copy of a node started alone that had met a peer, from a snapshot taken before either
/// ingested (so it holds no announcement), belongs to that cluster: it joins, takes events as
/// late (`not_synced`) until it syncs, and seals nothing alone; connected, it holds the
/// cluster's final window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_founder_that_met_a_peer_joins_its_cluster() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = open(&root.path().join("a"), false).await;
    let b = open(&root.path().join("b"), false).await;
    a.connect(&b).expect("connect");
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(r.is_joining(), "a copy of a node that met a peer joins");
    let out = r
        .ingest("s", vec![ev("r", 1, 30_000, "r"), ev("r", 2, 2 * MIN, "r")])
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (2, 2), "{out:?}");
    r.maintain_views().await.expect("maintain");
    assert!(rows(&r).await.is_empty(), "R applied nothing to a window");
    for (n, name) in [(&a, "a"), (&b, "b")] {
        n.ingest("s", vec![ev(name, 1, 10_000, name)])
            .await
            .expect("ingest");
        n.ingest("s", vec![ev(name, 2, 2 * MIN, name)])
            .await
            .expect("ingest");
    }
    let want = final_on(&[&a, &b], 0).await;
    assert_eq!(want, (json!(2), json!(["a", "b"])));
    r.connect(&a).expect("connect");
    r.connect(&b).expect("connect");
    assert_eq!(final_on(&[&a, &b, &r], 0).await, want);
    stays_final(&[&a, &b, &r], &[&a, &b, &r], 0, &want).await;
    for n in [a, b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A copy of a node started alone that never met anyone is no joining node: restored, it
/// applies events and finalizes windows by itself as its source did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_lone_node_that_never_ingested_works_alone() {
    let root = tempfile::tempdir().expect("tempdir");
    let l = open(&root.path().join("l"), false).await;
    let snap = root.path().join("l.snap");
    l.snapshot(&snap).await.expect("snapshot");
    l.shutdown().await.expect("shutdown");
    drop(l);
    Node::restore(&snap, root.path().join("r")).expect("restore");
    let r = open(&root.path().join("r"), false).await;
    assert!(!r.is_joining(), "a copy of a lone node does not join");
    let out = r
        .ingest("s", vec![ev("r", 1, 30_000, "r"), ev("r", 2, 2 * MIN, "r")])
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (2, 0), "{out:?}");
    assert_eq!(final_on(&[&r], 0).await, (json!(1), json!(["r"])));
    r.shutdown().await.expect("shutdown");
}

/// A restored copy restarted before it heard from its cluster still waits: the announcement it
/// wrote at its first open (the snapshot's marks) is no news of the cluster. (It used to read as
/// a watermark of its own after the restart: the copy applied events on time with no peer.)
/// Once it hears a fresh announcement it syncs, and stays synced across a restart alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_copy_restarted_before_it_synced_still_waits() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let want = (json!(2), json!(["a", "b"]));
    let snap = root.path().join("a.snap");
    a.snapshot(&snap).await.expect("snapshot");
    a.shutdown().await.expect("shutdown");
    drop(a);
    let dir = root.path().join("r");
    Node::restore(&snap, &dir).expect("restore");
    let r = open(&dir, false).await;
    let out = r
        .ingest("s", vec![ev("r", 1, 3 * MIN, "r")])
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (1, 1), "{out:?}");
    r.shutdown().await.expect("shutdown");
    drop(r);
    let r = open(&dir, false).await;
    let out = r
        .ingest("s", vec![ev("r", 2, 3 * MIN, "r")])
        .await
        .expect("r ingests");
    assert_eq!(
        (out.applied, out.late),
        (1, 1),
        "a restarted copy applied an event before it heard from its cluster: {out:?}"
    );
    let lane = r.late_events("s", None, 0).expect("late lane");
    let reasons: Vec<_> = lane
        .events
        .iter()
        .filter(|e| e.record["node"] == json!(r.replica_id().to_string()))
        .map(|e| e.record["reason"].clone())
        .collect();
    assert_eq!(reasons, vec![json!("not_synced"); 2], "{lane:?}");
    // B moves on and announces it; R hears it, syncs and applies events again.
    r.connect(&b).expect("connect");
    b.ingest("s", vec![ev("b", 3, 4 * MIN, "b")])
        .await
        .expect("b");
    ingest_once_synced(&r, "r2", 5 * MIN).await;
    stays_final(&[&b, &r], &[&b, &r], 0, &want).await;
    // Synced, a restart without any link keeps it synced.
    r.shutdown().await.expect("shutdown");
    drop(r);
    let r = open(&dir, false).await;
    let out = r
        .ingest("s", vec![ev("r3", 1, 5 * MIN, "r")])
        .await
        .expect("r ingests");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    for n in [b, r] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A member gone for good holds new windows open until it is decommissioned;
/// then they become final without it on every node. If it comes back it applies no event to
/// a window (late, `decommissioned`) and final windows keep their values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decommissioned_member_holds_nothing_open_and_changes_nothing_when_back() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let g = open(&root.path().join("g"), true).await;
    g.connect(&a).expect("connect");
    g.connect(&b).expect("connect");
    converge(&[&a, &b, &g]).await;
    g.maintain_views().await.expect("maintain");
    g.ingest("s", vec![ev("g", 1, 2 * MIN + 5_000, "g")])
        .await
        .expect("g");
    converge(&[&a, &b, &g]).await;
    let g_id = g.replica_id();
    let g_dir = root.path().join("g");
    g.shutdown().await.expect("shutdown");
    drop(g);
    for (n, src) in [(&a, "a"), (&b, "b")] {
        n.ingest(
            "s",
            vec![ev(src, 5, 2 * MIN + 10_000, src), ev(src, 6, 5 * MIN, src)],
        )
        .await
        .expect("ingest");
    }
    // G announced a watermark of 2m05s: window [2m, 3m) waits for it.
    for _ in 0..5 {
        for n in [&a, &b] {
            n.maintain_views().await.expect("maintain");
            let r = rows(n).await;
            assert_eq!(
                r.get(&("c".to_owned(), 2 * MIN)).map(|(_, f)| *f),
                Some(false),
                "{r:?}"
            );
        }
    }
    a.decommission(g_id).await.expect("decommission");
    assert!(
        b.decommission(b.replica_id()).await.is_err(),
        "no node removes itself"
    );
    let got = final_on(&[&a, &b], 2 * MIN).await;
    // A's and B's events at 2m and 2m10s; G's (2m05s) is not counted: it was decommissioned
    // before the window was sealed.
    assert_eq!(got, (json!(4), json!(["a", "b"])));
    // G's event is not lost without a trace: each node that sealed the window keeps G's
    // contribution in its late lane, once.
    let want_out: BTreeMap<_, _> = [
        (("c".to_owned(), 2 * MIN, g_id.to_string()), (json!(1), 1)),
        (
            ("d".to_owned(), 2 * MIN, g_id.to_string()),
            (json!(["g"]), 1),
        ),
        (
            ("sess".to_owned(), 2 * MIN + 5_000, g_id.to_string()),
            (json!(1), 1),
        ),
    ]
    .into_iter()
    .collect();
    for n in [&a, &b] {
        settles_to(n, true, &want_out).await;
    }
    assert_eq!(a.decommissioned().expect("gone"), vec![g_id]);
    // G comes back: it applies nothing to windows any more; no final value moves.
    let g = open(&g_dir, true).await;
    g.connect(&a).expect("connect");
    g.connect(&b).expect("connect");
    converge(&[&a, &b, &g]).await;
    g.maintain_views().await.expect("maintain");
    assert_eq!(g.replica_id(), g_id, "G came back under its identity");
    assert_eq!(g.decommissioned().expect("gone"), vec![g_id]);
    let out = g
        .ingest("s", vec![ev("g", 2, 6 * MIN, "g")])
        .await
        .expect("g");
    assert_eq!(out.late, 1, "{out:?}");
    let lane = g.late_events("s", None, 0).expect("lane");
    assert_eq!(
        lane.events.last().map(|e| e.record["reason"].clone()),
        Some(json!("decommissioned"))
    );
    stays_final(
        &[&a, &b],
        &[&a, &b, &g],
        2 * MIN,
        &(json!(4), json!(["a", "b"])),
    )
    .await;
    stays_final(&[&a, &b], &[&a, &b, &g], 0, &(json!(2), json!(["a", "b"]))).await;
    for n in [a, b, g] {
        n.shutdown().await.expect("shutdown");
    }
}

/// A node that ran alone and finalized a window by itself (its seal counts only itself), then
/// restarted to join a cluster that finalized the same window over its own members: nodes
/// that join later adopt neither seal, since each leaves out an announcer that applied events
/// to the window. No node ever reports the window final with a value another node reports
/// otherwise, except the two seals made apart, which each keep their own value (the lone
/// node's is its own; ARCHITECTURE.md, "Seals").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_made_alone_is_adopted_by_no_later_joiner() {
    let root = tempfile::tempdir().expect("tempdir");
    let lone_dir = root.path().join("lone");
    let lone = open(&lone_dir, false).await;
    lone.ingest(
        "s",
        vec![
            ev("x", 1, 10_000, "x"),
            ev("x", 2, 20_000, "y"),
            ev("x", 3, 30_000, "z"),
        ],
    )
    .await
    .expect("lone");
    lone.ingest("s", vec![ev("x", 4, 2 * MIN, "x")])
        .await
        .expect("lone");
    let alone = final_on(&[&lone], 0).await;
    assert_eq!(alone, (json!(3), json!(["x", "y", "z"])));
    lone.shutdown().await.expect("shutdown");
    drop(lone);
    let (a, b) = two_with_a_final_window(root.path()).await;
    let want = (json!(2), json!(["a", "b"]));
    // Back, to join the cluster.
    let lone = open(&lone_dir, true).await;
    lone.connect(&a).expect("connect");
    lone.connect(&b).expect("connect");
    let mut joiners = Vec::new();
    for name in ["e", "f"] {
        let j = open(&root.path().join(name), true).await;
        j.connect(&a).expect("connect");
        j.connect(&lone).expect("connect");
        joiners.push(j);
    }
    let mut all: Vec<&Node> = vec![&a, &b, &lone];
    all.extend(joiners.iter());
    converge(&all).await;
    stays_final(&[&a, &b], &all, 0, &want).await;
    stays_final(&[&lone], &all, 0, &alone).await;
    // What each seal leaves out arrived after it was made, by replication: each sealing node
    // keeps it in its late lane, once per contributing node.
    let (a_id, b_id, lone_id) = (
        a.replica_id().to_string(),
        b.replica_id().to_string(),
        lone.replica_id().to_string(),
    );
    let want_a: BTreeMap<_, _> = [
        (("c".to_owned(), 0, lone_id.clone()), (json!(3), 1)),
        (
            ("d".to_owned(), 0, lone_id.clone()),
            (json!(["x", "y", "z"]), 1),
        ),
    ]
    .into_iter()
    .collect();
    for n in [&a, &b] {
        settles_to(n, false, &want_a).await;
    }
    let got = sealed_out(&lone, false).await;
    for (id, user) in [(&a_id, "a"), (&b_id, "b")] {
        assert_eq!(
            got.get(&("c".to_owned(), 0, id.clone())),
            Some(&(json!(1), 1)),
            "{got:?}"
        );
        assert_eq!(
            got.get(&("d".to_owned(), 0, id.clone())),
            Some(&(json!([user]), 1)),
            "{got:?}"
        );
    }
    for j in &joiners {
        let r = rows(j).await;
        for v in ["c", "d"] {
            if let Some((value, true)) = r.get(&(v.to_owned(), 0)) {
                panic!("a later joiner reports window 0 of {v} final with {value}: {r:?}");
            }
        }
    }
    for n in [b, lone] {
        n.shutdown().await.expect("shutdown");
    }
    for j in joiners {
        j.shutdown().await.expect("shutdown");
    }
    // After a restart the audit starts over: it records nothing twice.
    a.shutdown().await.expect("shutdown");
    drop(a);
    let a = open(&root.path().join("a"), false).await;
    settles_to(&a, false, &want_a).await;
    a.shutdown().await.expect("shutdown");
}

/// A cluster whose every node starts to join (as the deploy kits start them, each naming the
/// others): once each holds what its peers held when they met — nothing, here — it applies
/// events, and windows become final on every node with one value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_nodes_all_join_applies_events_and_finalizes() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        nodes.push(open(&root.path().join(name), true).await);
    }
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
    }
    let names = ["a", "b", "c"];
    for (n, name) in nodes.iter().zip(names) {
        ingest_once_synced(n, name, 10_000).await;
    }
    for (n, name) in nodes.iter().zip(names) {
        n.ingest("s", vec![ev(name, 1_000, 2 * MIN, name)])
            .await
            .expect("past the deadline");
    }
    let all: Vec<&Node> = nodes.iter().collect();
    assert_eq!(final_on(&all, 0).await, (json!(3), json!(["a", "b", "c"])));
    for n in nodes {
        n.shutdown().await.expect("shutdown");
    }
}

/// A joining node that synced and announced keeps applying events after a restart that
/// reaches no peer (its own watermark, announced in the earlier run, vouches for it): a sole
/// survivor restarted with its `--join` list is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synced_joining_node_restarted_alone_applies_by_its_own_watermark() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_with_a_final_window(root.path()).await;
    let c_dir = root.path().join("c");
    let c = open(&c_dir, true).await;
    c.connect(&a).expect("connect");
    c.connect(&b).expect("connect");
    ingest_once_synced(&c, "c", 3 * MIN).await;
    c.shutdown().await.expect("shutdown");
    drop(c);
    for n in [a, b] {
        n.shutdown().await.expect("shutdown");
    }
    let c = open(&c_dir, true).await;
    let out = c
        .ingest("s", vec![ev("c", 1_000, 3 * MIN + 1_000, "c")])
        .await
        .expect("c ingests alone");
    assert_eq!((out.applied, out.late), (1, 0), "{out:?}");
    // The window A and B sealed is still late on it.
    let out = c
        .ingest("s", vec![ev("c", 1_001, 30_000, "c")])
        .await
        .expect("c ingests alone");
    assert_eq!(out.late, 1, "{out:?}");
    c.shutdown().await.expect("shutdown");
}
