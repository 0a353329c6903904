//! Reference model of stream views: random view definitions and random event
//! streams — out of order within and beyond the allowed lateness, retries (duplicates, also
//! inside one batch), several sources, batches of 1–8 events — ingested across 3 nodes with
//! partitions and restarts. The model replays the rules (per-node watermark, lateness, dedup)
//! and predicts every ingest answer (`applied`, `duplicates`, `late`) exactly; every window
//! ever reported final equals the batch computation over all events not reported late, never
//! changes afterwards and is the same on every node; every open window is a value the batch
//! computation reaches with a subset of the events; after healing, every node equals the model.
//! Seeded: replay with `SEED=`; `SOAK=1` runs more rounds and steps.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tidemark::views::{Event, ViewDef, ViewQuery, keys};
use tidemark::{Node, NodeConfig};

use crate::common;

use common::soak;

fn seed() -> u64 {
    common::seed("views_model")
}

const VIEWS: [&str; 4] = ["clicks", "spend", "users", "last"];

/// A random window shared by the four views (the stream's lateness is then one number).
#[derive(Clone, Copy, Debug)]
struct Spec {
    size: u64,
    lateness: u64,
    ooo: u64,
}

fn defs(s: Spec) -> Vec<ViewDef> {
    let w = json!({"tumbling": format!("{}ms", s.size), "lateness": format!("{}ms", s.lateness),
                   "out_of_orderness": format!("{}ms", s.ooo)});
    serde_json::from_value(json!([
        {"name": "clicks", "stream": "s", "kind": "count", "group_by": ["page"], "window": w},
        {"name": "spend", "stream": "s", "kind": "sum", "group_by": ["page"], "field": "amount",
         "window": w},
        {"name": "users", "stream": "s", "kind": "distinct", "group_by": ["page"],
         "field": "user", "window": w},
        {"name": "last", "stream": "s", "kind": "latest", "group_by": ["page"], "field": "user",
         "window": w},
    ]))
    .expect("defs")
}

async fn open(dir: &std::path::Path, s: Spec) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs(s);
    Node::open(cfg).await.expect("open")
}

#[derive(Clone, Debug)]
struct Ev {
    source: String,
    seq: u64,
    time: u64,
    page: &'static str,
    amount: i64,
    user: String,
}

impl Ev {
    fn event(&self) -> Event {
        Event::new(
            &self.source,
            self.seq,
            json!({"page": self.page, "amount": self.amount, "user": self.user}),
        )
        .at(self.time)
    }
}

/// `(view, window start, page)`.
type Cell = (String, u64, String);

/// The batch computation over `events` (those applied and not reported late).
fn model(spec: Spec, events: &[Ev]) -> BTreeMap<Cell, serde_json::Value> {
    let mut count: BTreeMap<(u64, &str), u64> = BTreeMap::new();
    let mut sum: BTreeMap<(u64, &str), i64> = BTreeMap::new();
    let mut users: BTreeMap<(u64, &str), BTreeSet<&str>> = BTreeMap::new();
    let mut last: BTreeMap<(u64, &str), (tidemark::crdts::Timestamp, &str)> = BTreeMap::new();
    for e in events {
        let k = (e.time - e.time % spec.size, e.page);
        *count.entry(k).or_default() += 1;
        *sum.entry(k).or_default() += e.amount;
        users.entry(k).or_default().insert(&e.user);
        let st = keys::stamp(e.time, &e.source, e.seq);
        let l = last.entry(k).or_insert((st, &e.user));
        if st > l.0 {
            *l = (st, &e.user);
        }
    }
    let mut out = BTreeMap::new();
    let cell = |v: &str, k: &(u64, &str)| (v.to_owned(), k.0, k.1.to_owned());
    for (k, v) in count {
        out.insert(cell("clicks", &k), json!(v));
    }
    // A sum that nets to 0 may have no row at all (an amount of 0 writes nothing, and a
    // batch's +n and −n coalesce to nothing): 0 and "no row" read the same.
    for (k, v) in sum.into_iter().filter(|(_, v)| *v != 0) {
        out.insert(cell("spend", &k), json!(v));
    }
    for (k, v) in users {
        out.insert(cell("users", &k), json!(v));
    }
    for (k, v) in last {
        out.insert(cell("last", &k), json!(v.1));
    }
    out
}

/// Every row of every view: cell → (value, final) (sums of 0 left out, as in [`model`]).
async fn snapshot(node: &Node) -> BTreeMap<Cell, (serde_json::Value, bool)> {
    let mut out = BTreeMap::new();
    for v in VIEWS {
        let page = node.view(v, &ViewQuery::default()).await.expect("view");
        for r in page.rows {
            if v == "spend" && r.value == json!(0) {
                continue;
            }
            let p = r.group["page"].as_str().unwrap_or_default().to_owned();
            out.insert(
                (v.to_owned(), r.window_start.unwrap_or(0), p),
                (r.value, r.is_final),
            );
        }
    }
    out
}

/// Is `seen` a value the model reaches with a subset of the events of its cell?
fn reachable(view: &str, seen: &serde_json::Value, full: Option<&serde_json::Value>) -> bool {
    // A subset's sum / latest can be many values: checked exactly once final.
    if !matches!(view, "clicks" | "users") {
        return true;
    }
    let Some(full) = full else { return false };
    match view {
        "clicks" => seen
            .as_u64()
            .zip(full.as_u64())
            .is_some_and(|(s, f)| s <= f),
        "users" => {
            let f: BTreeSet<String> = full
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| x.to_string())
                .collect();
            seen.as_array()
                .is_some_and(|a| a.iter().all(|x| f.contains(&x.to_string())))
        }
        // A subset's sum / latest can be many values: checked exactly once final.
        _ => true,
    }
}

async fn converge(nodes: &[Node]) {
    let started = Instant::now();
    loop {
        let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
        if ctxs.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no convergence"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_equal_the_batch_computation_and_finals_never_change() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rounds = if soak() { 10 } else { 2 };
    for round in 0..rounds {
        let spec = Spec {
            size: [30_000, 60_000, 120_000][rng.random_range(0..3)],
            lateness: [0, 10_000, 30_000][rng.random_range(0..3)],
            ooo: [0, 5_000][rng.random_range(0..2)],
        };
        let ctx = format!("seed {seed} round {round} {spec:?}");
        let root = tempfile::tempdir().expect("tempdir");
        let dirs: Vec<_> = (0..3).map(|i| root.path().join(format!("n{i}"))).collect();
        let mut nodes = Vec::new();
        for d in &dirs {
            nodes.push(open(d, spec).await);
        }
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
        // Model state: per node its watermark and the events it has marked; all events
        // applied and not late.
        let mut wm: [Option<u64>; 3] = [None; 3];
        let mut marked: [BTreeSet<(String, u64)>; 3] = Default::default();
        let mut sent: [Vec<Ev>; 3] = Default::default();
        let mut counted: Vec<Ev> = Vec::new();
        let mut seqs = [0u64; 3];
        let mut clock = 0u64;
        let mut finals: BTreeMap<Cell, serde_json::Value> = BTreeMap::new();
        let steps = if soak() { 150 } else { 45 };
        for step in 0..steps {
            match rng.random_range(0..12) {
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
                    nodes[i] = open(&dirs[i], spec).await;
                    for j in 0..3 {
                        if j != i {
                            nodes[i].connect(&nodes[j]).expect("connect");
                        }
                    }
                }
                _ => {
                    // Node i ingests a batch for its own source (sources stick to a node).
                    let i = rng.random_range(0..3);
                    clock += rng.random_range(0..20_000);
                    let mut batch: Vec<Ev> = Vec::new();
                    for _ in 0..rng.random_range(1..9) {
                        if !sent[i].is_empty() && rng.random_bool(0.15) {
                            batch.push(sent[i][rng.random_range(0..sent[i].len())].clone());
                            continue;
                        }
                        if !batch.is_empty() && rng.random_bool(0.05) {
                            batch.push(batch[rng.random_range(0..batch.len())].clone());
                            continue;
                        }
                        seqs[i] += 1;
                        let e = Ev {
                            source: format!("n{i}"),
                            seq: seqs[i],
                            time: clock.saturating_sub(rng.random_range(0..100_000)),
                            page: ["/a", "/b"][rng.random_range(0..2)],
                            amount: rng.random_range(-3i64..6),
                            user: format!("u{}", rng.random_range(0..5)),
                        };
                        sent[i].push(e.clone());
                        batch.push(e);
                    }
                    // The model's answer: dedup against the node's marks, lateness against its
                    // watermark before the batch.
                    let before = wm[i];
                    let (mut applied, mut dups, mut late) = (0, 0, 0);
                    for e in &batch {
                        if !marked[i].insert((e.source.clone(), e.seq)) {
                            dups += 1;
                            continue;
                        }
                        applied += 1;
                        let start = e.time - e.time % spec.size;
                        let deadline = start + spec.size + spec.lateness;
                        if before.is_some_and(|w| deadline < w) {
                            late += 1;
                        } else {
                            counted.push(e.clone());
                        }
                    }
                    for e in &batch {
                        let t = e.time.saturating_sub(spec.ooo);
                        wm[i] = Some(wm[i].map_or(t, |w| w.max(t)));
                    }
                    let out = nodes[i]
                        .ingest("s", batch.iter().map(Ev::event).collect())
                        .await
                        .expect("ingest");
                    assert_eq!(
                        (out.applied, out.duplicates, out.late),
                        (applied, dups, late),
                        "{ctx} step {step}: ingest answer"
                    );
                }
            }
            // Every final value never changes and agrees across nodes; open values are
            // reachable with a subset of the events.
            let full = model(spec, &counted);
            for (n, node) in nodes.iter().enumerate() {
                for (cell, (v, fin)) in snapshot(node).await {
                    if fin {
                        let prev = finals.entry(cell.clone()).or_insert_with(|| v.clone());
                        assert_eq!(
                            prev, &v,
                            "{ctx} step {step} node {n}: final {cell:?} changed"
                        );
                    } else {
                        assert!(
                            reachable(&cell.0, &v, full.get(&cell)),
                            "{ctx} step {step} node {n}: {cell:?} = {v} not reachable"
                        );
                    }
                }
            }
        }
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
        converge(&nodes).await;
        let full = model(spec, &counted);
        for (cell, v) in &finals {
            assert_eq!(
                full.get(cell),
                Some(v),
                "{ctx}: final {cell:?} ≠ batch computation"
            );
        }
        for (n, node) in nodes.iter().enumerate() {
            let got: BTreeMap<Cell, serde_json::Value> = snapshot(node)
                .await
                .into_iter()
                .map(|(k, (v, _))| (k, v))
                .collect();
            assert_eq!(
                got, full,
                "{ctx}: node {n} after healing ≠ batch computation"
            );
        }
        eprintln!(
            "{ctx}: {} events counted, {} windows final",
            counted.len(),
            finals.len()
        );
        for n in &nodes {
            n.shutdown().await.expect("shutdown");
        }
    }
}
