//! Stream views across nodes: arrival order does not matter, connected nodes
//! converge on views, a window is final only once every known member's watermark passed it
//! with its state joined, and a final value never changes on any node.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark::views::{Event, ViewDef, ViewPage, ViewQuery};
use tidemark::{Node, NodeConfig};

use crate::common;

use common::soak;

fn seed() -> u64 {
    common::seed("views_cluster")
}

fn defs(lateness: &str) -> Vec<ViewDef> {
    let w = json!({"tumbling": "1m", "lateness": lateness});
    serde_json::from_value(json!([
        {"name": "clicks", "stream": "s", "kind": "count", "group_by": ["page"], "window": w},
        {"name": "spend", "stream": "s", "kind": "sum", "group_by": ["page"], "field": "amount",
         "window": w},
        {"name": "users", "stream": "s", "kind": "distinct", "group_by": ["page"],
         "field": "user", "window": w},
        {"name": "last", "stream": "s", "kind": "latest", "group_by": ["page"], "field": "user"},
        {"name": "last_w", "stream": "s", "kind": "latest", "field": "amount", "window": w},
    ]))
    .expect("defs")
}

const VIEWS: [&str; 5] = ["clicks", "spend", "users", "last", "last_w"];

async fn open(dir: &std::path::Path, lateness: &str) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs(lateness);
    Node::open(cfg).await.expect("open")
}

async fn read(node: &Node, view: &str) -> ViewPage {
    node.view(view, &ViewQuery::default()).await.expect("view")
}

/// Every view's rows as `(view, start, group) → (value, final)`.
type Snapshot = BTreeMap<(String, Option<u64>, String), (serde_json::Value, bool)>;

async fn snapshot(node: &Node) -> Snapshot {
    let mut out = BTreeMap::new();
    for v in VIEWS {
        for r in read(node, v).await.rows {
            out.insert(
                (
                    v.to_owned(),
                    r.window_start,
                    serde_json::Value::Object(r.group).to_string(),
                ),
                (r.value, r.is_final),
            );
        }
    }
    out
}

fn values(s: &Snapshot) -> BTreeMap<(String, Option<u64>, String), serde_json::Value> {
    s.iter().map(|(k, (v, _))| (k.clone(), v.clone())).collect()
}

/// Converges `nodes` and waits until every node reports the same rows twice in a row (seals
/// take a round of announcements after the states converged); returns the first's rows.
async fn settle(nodes: &[&Node]) -> Snapshot {
    let started = Instant::now();
    let mut last: Option<Snapshot> = None;
    loop {
        converge(nodes).await;
        let mut snaps = Vec::new();
        for n in nodes {
            snaps.push(snapshot(n).await);
        }
        let same = snaps.windows(2).all(|w| w[0] == w[1]);
        if same && last.as_ref() == Some(&snaps[0]) {
            return snaps.swap_remove(0);
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "views did not settle: {snaps:?}"
        );
        last = same.then(|| snaps.swap_remove(0));
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
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

fn random_events(rng: &mut ChaCha8Rng, n: u64) -> Vec<Event> {
    let pages = ["/", "/a", "/b"];
    (0..n)
        .map(|i| {
            let fields = json!({
                "page": pages[rng.random_range(0..pages.len())],
                "amount": rng.random_range(-5i64..10),
                "user": format!("u{}", rng.random_range(0..6)),
            });
            // Several sources; some events share a time (ties broken by event id).
            Event::new(&format!("src{}", i % 3), i, fields).at(rng.random_range(0..5u64) * 30_000)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_events_in_any_order_give_identical_views() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let root = tempfile::tempdir().expect("tempdir");
    let rounds = if soak() { 20 } else { 3 };
    for round in 0..rounds {
        let events = random_events(&mut rng, 60);
        let mut results = Vec::new();
        for copy in 0..2 {
            let node = open(&root.path().join(format!("r{round}n{copy}")), "1000d").await;
            let mut order = events.clone();
            order.shuffle(&mut rng);
            for chunk in order.chunks(rng.random_range(1..8)) {
                node.ingest("s", chunk.to_vec()).await.expect("ingest");
            }
            results.push(values(&snapshot(&node).await));
            node.shutdown().await.expect("shutdown");
        }
        assert_eq!(results[0], results[1], "seed {seed} round {round}");
        // And the counts are exact.
        let total: u64 = results[0]
            .iter()
            .filter(|(k, _)| k.0 == "clicks")
            .map(|(_, v)| v.as_u64().expect("count"))
            .sum();
        assert_eq!(total, 60);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_is_final_only_when_every_member_passed_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = open(&root.path().join("a"), "30s").await;
    let b = open(&root.path().join("b"), "30s").await;
    let ev = |src: &str, seq, t, page: &str| {
        Event::new(src, seq, json!({"page": page, "amount": 1, "user": src})).at(t)
    };
    a.ingest(
        "s",
        vec![ev("a", 1, 10_000, "/p"), ev("a", 2, 200_000, "/q")],
    )
    .await
    .expect("ingest");
    // B is behind (watermark 20 s): it ingested before it met A (a node that never ingested
    // starts from its cluster's watermark once synced, views_membership.rs).
    let out = b
        .ingest("s", vec![ev("b", 1, 20_000, "/p")])
        .await
        .expect("ingest");
    assert_eq!(out.late, 0);
    a.connect(&b).expect("connect");
    converge(&[&a, &b]).await;
    for n in [&a, &b] {
        let c = read(n, "clicks").await;
        assert_eq!(c.cluster_watermark, Some(20_000));
        assert_eq!(c.rows[0].value, json!(2));
        assert!(!c.rows[0].is_final);
    }
    // A refuses window 0 (its own watermark passed it); B still accepts it.
    let out = a
        .ingest("s", vec![ev("a", 3, 30_000, "/p")])
        .await
        .expect("ingest");
    assert_eq!(out.late, 1);
    let out = b
        .ingest("s", vec![ev("b", 2, 40_000, "/p")])
        .await
        .expect("ingest");
    assert_eq!(out.late, 0);
    // B moves past the window: now it is final on both, with the same value, for good.
    b.ingest("s", vec![ev("b", 3, 300_000, "/q")])
        .await
        .expect("ingest");
    let sa = settle(&[&a, &b]).await;
    let key = (
        "clicks".to_owned(),
        Some(0),
        json!({"page": "/p"}).to_string(),
    );
    assert_eq!(sa[&key], (json!(3), true));
    for (n, src) in [(&a, "a"), (&b, "b")] {
        let out = n
            .ingest("s", vec![ev(src, 9, 59_000, "/p")])
            .await
            .expect("ingest");
        assert_eq!(out.late, 1);
    }
    converge(&[&a, &b]).await;
    assert_eq!(snapshot(&a).await[&key], (json!(3), true));
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// Three nodes, random partitions, restarts, retries, events beyond the lateness: every value
/// ever reported final never changes and is the same on every node; after healing all views
/// are identical, and the counts equal the events acknowledged minus those reported late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_windows_never_change_across_partitions_and_restarts() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let root = tempfile::tempdir().expect("tempdir");
    let dirs: Vec<_> = (0..3).map(|i| root.path().join(format!("n{i}"))).collect();
    let mut nodes = Vec::new();
    for d in &dirs {
        nodes.push(open(d, "20s").await);
    }
    for i in 0..3 {
        for j in i + 1..3 {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
    }
    let steps = if soak() { 200 } else { 40 };
    let mut finals: Snapshot = BTreeMap::new();
    let mut final_at: Vec<std::collections::BTreeSet<_>> = vec![Default::default(); 3];
    let mut seq = [0u64; 3];
    let mut clock = 0u64;
    let (mut acked, mut late) = (0u64, 0u64);
    let mut sent: Vec<Vec<Event>> = vec![Vec::new(); 3];
    for step in 0..steps {
        match rng.random_range(0..10) {
            0 => {
                let (i, j) = (rng.random_range(0..3), rng.random_range(0..3));
                if i != j {
                    if rng.random_bool(0.5) {
                        nodes[i].disconnect(&nodes[j]).expect("disconnect");
                    } else {
                        nodes[i].connect(&nodes[j]).expect("connect");
                    }
                }
            }
            1 => {
                let i = rng.random_range(0..3);
                nodes[i].shutdown().await.expect("shutdown");
                nodes[i] = open(&dirs[i], "20s").await;
                for j in 0..3 {
                    if j != i {
                        nodes[i].connect(&nodes[j]).expect("connect");
                    }
                }
            }
            _ => {
                // Node i ingests for its own source (sources stick to a node:
                // docs/design/principles.md, "Idempotent ingest"): new events around its clock,
                // some far behind, and retries of old ones.
                let i = rng.random_range(0..3);
                clock += rng.random_range(0..15_000);
                let mut batch = Vec::new();
                for _ in 0..rng.random_range(1..6) {
                    if !sent[i].is_empty() && rng.random_bool(0.2) {
                        let old = sent[i][rng.random_range(0..sent[i].len())].clone();
                        batch.push(old);
                        continue;
                    }
                    seq[i] += 1;
                    let t = clock.saturating_sub(rng.random_range(0..90_000));
                    let page = ["/a", "/b"][rng.random_range(0..2)];
                    let fields = json!({
                        "page": page,
                        "amount": rng.random_range(1i64..5),
                        "user": format!("u{}", rng.random_range(0..4)),
                    });
                    let e = Event::new(&format!("n{i}"), seq[i], fields).at(t);
                    sent[i].push(e.clone());
                    batch.push(e);
                }
                let out = nodes[i].ingest("s", batch).await.expect("ingest");
                acked += out.applied as u64;
                late += out.late as u64;
            }
        }
        // Record finals on every node; a final value must never change and must agree.
        for (n, node) in nodes.iter().enumerate() {
            for (k, (v, fin)) in snapshot(node).await {
                // A node not yet caught up may show less, but never a different final value.
                if let Some(prev) = finals.get(&k).filter(|_| fin) {
                    assert_eq!(
                        &prev.0, &v,
                        "seed {seed} step {step} node {n}: final {k:?} changed"
                    );
                }
                if fin {
                    finals.entry(k.clone()).or_insert((v, fin));
                    final_at[n].insert(k);
                } else {
                    assert!(
                        !final_at[n].contains(&k),
                        "seed {seed} node {n}: {k:?} final, then open"
                    );
                }
            }
        }
    }
    for i in 0..3 {
        for j in i + 1..3 {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    converge(&refs).await;
    let s0 = snapshot(&nodes[0]).await;
    for n in &nodes[1..] {
        assert_eq!(values(&s0), values(&snapshot(n).await), "seed {seed}");
    }
    for (k, v) in &finals {
        assert_eq!(
            s0.get(k).map(|x| &x.0),
            Some(&v.0),
            "seed {seed}: final {k:?}"
        );
    }
    // Each event falls into one `clicks` window: applied events minus late ones.
    let total: u64 = s0
        .iter()
        .filter(|(k, _)| k.0 == "clicks")
        .map(|(_, v)| v.0.as_u64().expect("count"))
        .sum();
    assert_eq!(total, acked - late, "seed {seed}");
    eprintln!(
        "{} finals observed, {acked} events, {late} late",
        finals.len()
    );
    for n in &nodes {
        n.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_different_definitions_report_the_conflict_and_nothing_final() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = open(&root.path().join("a"), "30s").await;
    let b = open(&root.path().join("b"), "45s").await;
    a.connect(&b).expect("connect");
    for (n, src) in [(&a, "a"), (&b, "b")] {
        let evs = [10_000, 500_000]
            .map(|t| Event::new(src, t, json!({"page": "/p", "amount": 1, "user": src})).at(t));
        n.ingest("s", evs.to_vec()).await.expect("ingest");
    }
    converge(&[&a, &b]).await;
    for (n, other) in [(&a, &b), (&b, &a)] {
        let page = read(n, "clicks").await;
        assert_eq!(
            page.definition_conflicts,
            vec![other.replica_id().to_string()]
        );
        assert_eq!(page.cluster_watermark, None);
        assert!(page.rows.iter().all(|r| !r.is_final));
        // Their states are never merged: each node's cells hold only the events folded under
        // its own definition (one per window), and the other's arrive as foreign cells.
        let values: Vec<_> = page.rows.iter().map(|r| r.value.clone()).collect();
        assert_eq!(values, vec![json!(1), json!(1)]);
        assert!(page.counters.foreign_cells > 0);
    }
    // A view both run with the same definition ("last") still merges: both read the same
    // latest user, whichever node folded it.
    let (la, lb) = (read(&a, "last").await.rows, read(&b, "last").await.rows);
    assert_eq!(la.len(), 1);
    assert_eq!(la, lb);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}
