//! The record of elements `distinct` cells hold under this node's dot (`views::held`) never
//! lies: after every batch, each element an applied event of this node added is held under
//! this node's own dot in the committed cell (what skipping an add relies on), and the view
//! values equal those of a node without the record — across remote removals, batches of which
//! an event turns out a duplicate at commit, restarts, snapshot restores and a record at its
//! bound.

use super::Node;
use crate::config::NodeConfig;
use crate::proto::PeerId;
use crate::store::{DeltasSince, LocalWrite};
use crate::views::{Event, ViewDef, ViewQuery, keys};
use serde_json::json;
use std::collections::BTreeMap;
use tidemark_crdts::{Key, KeyKind, Mutation};

fn defs() -> Vec<ViewDef> {
    serde_json::from_value(json!([
        {"name": "c", "stream": "s", "kind": "count", "group_by": ["page"],
         "window": {"tumbling": "1m", "lateness": "1h"}},
        {"name": "users", "stream": "s", "kind": "distinct", "group_by": ["page"],
         "field": "user", "window": {"tumbling": "1m", "lateness": "1h"}},
        {"name": "ever", "stream": "s", "kind": "distinct", "group_by": ["page"],
         "field": "user"},
    ]))
    .expect("defs")
}

async fn open(dir: &std::path::Path, held_bytes: usize) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs();
    cfg.limits.view_held_bytes = held_bytes;
    Node::open(cfg).await.expect("open")
}

fn ev(source: &str, seq: u64, page: &str, user: &str, time: u64) -> Event {
    Event::new(source, seq, json!({"page": page, "user": user})).at(time)
}

/// The cell of `view` for `page` in the window starting at `start` (`None`: no window).
fn view_cell(node: &Node, view: &str, page: &str, start: Option<u64>) -> Key {
    let (_, v) = node.shared.views.find(view).expect("view");
    let group = serde_json::to_string(&json!([page])).expect("group");
    Key::new(
        KeyKind::ORSet,
        keys::view_key(view, &v.digest, start, &group),
    )
}

/// The `users` cell of `page` in the window starting at `start`.
fn cell(node: &Node, page: &str, start: u64) -> Key {
    view_cell(node, "users", page, Some(start))
}

/// Whether the committed cell `key` holds `user` under `node`'s dot.
fn holds_own_in(node: &Node, key: &Key, user: &str) -> bool {
    let elem = json!(user).to_string();
    node.reader()
        .expect("reader")
        .set_holds_own(key, &elem, node.me())
        .expect("read")
}

/// Whether the committed `users` cell of `page` at `start` holds `user` under `node`'s dot.
fn holds_own(node: &Node, page: &str, start: u64, user: &str) -> bool {
    holds_own_in(node, &cell(node, page, start), user)
}

/// Whether the unwindowed `ever` cell of `page` holds `user` under `node`'s dot.
fn ever_own(node: &Node, page: &str, user: &str) -> bool {
    holds_own_in(node, &view_cell(node, "ever", page, None), user)
}

/// Every row of `users`: (window start, group) → value.
async fn users(node: &Node) -> BTreeMap<(u64, String), serde_json::Value> {
    let q = ViewQuery {
        limit: 10_000,
        ..Default::default()
    };
    node.view("users", &q)
        .await
        .expect("view")
        .rows
        .into_iter()
        .map(|r| {
            (
                (r.window_start.unwrap_or(0), json!(r.group).to_string()),
                r.value,
            )
        })
        .collect()
}

/// Joins everything `from` holds that `to` does not.
async fn ship(from: &Node, to: &Node) {
    let DeltasSince::Deltas { delta, .. } = from
        .deltas_since(to.context().expect("ctx"), 1 << 20)
        .await
        .expect("deltas")
    else {
        panic!("the log is whole");
    };
    to.apply_remote(PeerId(9), delta)
        .await
        .expect("apply")
        .expect("valid delta");
}

/// A's own dot of `x` is taken away by a peer's remove joined here; a later event adding `x`
/// must add it again (a record that still claimed it would skip the add).
async fn remote_removal(held_bytes: usize) -> BTreeMap<(u64, String), serde_json::Value> {
    let (da, db) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (a, b) = (open(da.path(), held_bytes).await, open(db.path(), 0).await);
    a.ingest(
        "s",
        vec![ev("p", 1, "/", "x", 1_000), ev("p", 2, "/", "y", 1_001)],
    )
    .await
    .expect("ingest");
    // Known held now (from the commit): skipped without a read, still held.
    a.ingest(
        "s",
        vec![ev("p", 3, "/", "x", 1_002), ev("p", 4, "/", "y", 1_003)],
    )
    .await
    .expect("ingest");
    assert!(holds_own(&a, "/", 0, "x"));
    ship(&a, &b).await;
    // B removes `x`, observing A's dot (no view does this; a peer's join may).
    let rx = b
        .enqueue(vec![LocalWrite {
            ops: vec![(cell(&b, "/", 0), Mutation::Remove(json!("x").to_string()))],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        }])
        .expect("enqueue");
    rx.await.expect("reply").expect("commit");
    ship(&b, &a).await;
    assert!(
        !holds_own(&a, "/", 0, "x"),
        "the remote remove took A's dot"
    );
    a.ingest(
        "s",
        vec![ev("p", 5, "/", "x", 1_004), ev("p", 6, "/", "y", 1_005)],
    )
    .await
    .expect("ingest");
    assert!(holds_own(&a, "/", 0, "x"), "the add of x was skipped");
    assert!(holds_own(&a, "/", 0, "y"));
    let out = users(&a).await;
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
    out
}

#[tokio::test]
async fn a_remote_remove_of_an_own_element_is_added_again() {
    let with = remote_removal(1 << 20).await;
    let without = remote_removal(0).await;
    assert_eq!(with, without);
    assert_eq!(with.values().next(), Some(&json!(["x", "y"])), "{with:?}");
}

/// B's batch of `x` (seq 1, a duplicate once A's delta with its mark is joined mid-batch) and
/// `y`: only `y` is applied, so only `y` may be recorded as held under B's dot.
async fn partly_duplicate(held_bytes: usize) -> BTreeMap<(u64, String), serde_json::Value> {
    let (da, db) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (a, b) = (open(da.path(), 0).await, open(db.path(), held_bytes).await);
    a.ingest("s", vec![ev("p", 1, "/", "x", 1_000)])
        .await
        .expect("a ingests");
    let DeltasSince::Deltas { delta, .. } = a
        .deltas_since(b.context().expect("ctx"), 1 << 20)
        .await
        .expect("deltas")
    else {
        panic!("A's log is whole");
    };
    let join = async {
        b.apply_remote(PeerId(1), delta)
            .await
            .expect("apply")
            .expect("valid delta");
    };
    let out = b
        .ingest_then(
            "s",
            vec![ev("p", 1, "/", "x", 1_000), ev("p", 2, "/", "y", 1_001)],
            join,
        )
        .await
        .expect("b ingests");
    assert_eq!((out.applied, out.duplicates), (1, 1), "{out:?}");
    assert!(!holds_own(&b, "/", 0, "x"), "x is A's only");
    assert!(holds_own(&b, "/", 0, "y"));
    // Now B applies an event adding `x`: its own dot of `x` must be written.
    b.ingest(
        "s",
        vec![ev("p", 3, "/", "x", 1_002), ev("p", 4, "/", "y", 1_003)],
    )
    .await
    .expect("b ingests");
    assert!(holds_own(&b, "/", 0, "x"), "the add of x was skipped");
    assert!(holds_own(&b, "/", 0, "y"));
    let out = users(&b).await;
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
    out
}

#[tokio::test]
async fn a_batch_with_a_duplicate_at_commit_records_only_what_it_applied() {
    let with = partly_duplicate(1 << 20).await;
    let without = partly_duplicate(0).await;
    assert_eq!(with, without);
    assert_eq!(with.values().next(), Some(&json!(["x", "y"])));
}

#[tokio::test]
async fn restarted_and_restored_nodes_add_under_their_own_dot() {
    let (da, dc) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("c"),
    );
    let snap = tempfile::tempdir().expect("snap");
    let a = open(da.path(), 1 << 20).await;
    a.ingest(
        "s",
        vec![ev("p", 1, "/", "x", 1_000), ev("p", 2, "/", "y", 1_001)],
    )
    .await
    .expect("ingest");
    let file = snap.path().join("a.snap");
    a.snapshot(&file).await.expect("snapshot");
    a.shutdown().await.expect("shutdown");
    drop(a);
    // Restarted: the record starts empty; the rows say x is held under A's dot.
    let a = open(da.path(), 1 << 20).await;
    a.ingest(
        "s",
        vec![ev("p", 3, "/", "x", 1_002), ev("p", 4, "/", "z", 1_003)],
    )
    .await
    .expect("ingest");
    assert!(holds_own(&a, "/", 0, "x") && holds_own(&a, "/", 0, "z"));
    assert!(ever_own(&a, "/", "x") && ever_own(&a, "/", "z"));
    // Restored under a new id: x and y are held, under the old id's dots only. (Its windowed
    // events wait for a fresh announcement of a peer: the unwindowed view takes them.)
    Node::restore(&file, dc.path()).expect("restore");
    let c = open(dc.path(), 1 << 20).await;
    assert_ne!(c.me(), a.me());
    assert!(!ever_own(&c, "/", "x"));
    let out = c
        .ingest(
            "s",
            vec![ev("q", 1, "/", "x", 1_010), ev("q", 2, "/", "y", 1_011)],
        )
        .await
        .expect("ingest");
    assert_eq!(out.applied, 2);
    assert!(ever_own(&c, "/", "x") && ever_own(&c, "/", "y"));
    c.ingest("s", vec![ev("q", 3, "/", "x", 1_012)])
        .await
        .expect("ingest");
    assert!(ever_own(&c, "/", "x"));
    a.shutdown().await.expect("shutdown");
    c.shutdown().await.expect("shutdown");
}

/// Many cells and elements over several windows, revisited out of order, on nodes whose record
/// is at its bound (a few hundred bytes), unbounded for the test, and off: the same values,
/// every element of every applied event held under each node's own dot, and the bounded record
/// within its budget.
#[tokio::test]
async fn a_record_at_its_bound_gives_the_same_values() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let budgets = [400, 1 << 24, 0];
    let mut nodes = Vec::new();
    for (d, b) in dirs.iter().zip(budgets) {
        nodes.push(open(d.path(), b).await);
    }
    let mut seq = 0;
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..12u64 {
        let mut batch = Vec::new();
        for i in 0..40u64 {
            seq += 1;
            let k = round * 7 + i;
            let page = format!("/p{}", k % 5);
            let user = format!("u{}", (k * 13) % 17);
            // Windows 0..3 minutes, revisited out of order.
            let time = ((round * 5 + i) % 3) * 60_000 + i;
            seen.insert((page.clone(), time - time % 60_000, user.clone()));
            batch.push(ev("p", seq, &page, &user, time));
        }
        for n in &nodes {
            let out = n.ingest("s", batch.clone()).await.expect("ingest");
            assert_eq!(out.applied, batch.len());
        }
    }
    let first = users(&nodes[0]).await;
    for n in &nodes[1..] {
        assert_eq!(users(n).await, first);
    }
    for n in &nodes {
        for (page, start, user) in &seen {
            assert!(holds_own(n, page, *start, user), "{page} {start} {user}");
        }
    }
    let (bytes, _) = nodes[0].shared.views.held_size();
    assert!(bytes <= 400, "{bytes} bytes recorded");
    let (bytes, cells) = nodes[1].shared.views.held_size();
    assert!(bytes > 0 && cells == 20, "{bytes} bytes in {cells} cells");
    assert_eq!(nodes[2].shared.views.held_size(), (0, 0));
    for n in &nodes {
        n.shutdown().await.expect("shutdown");
    }
}
