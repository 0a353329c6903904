//! Clicks per page per minute on three embedded nodes.
//!
//! Three in-process nodes (`Node::connect`) run the same view — a count of clicks per page in
//! one-minute tumbling windows, 30 s lateness, 10 s out-of-orderness and a 2 s idle timeout.
//! A seeded generator produces a click stream out of order (jitter up to 20 s), with retries
//! (the same event delivered again: a duplicate) and a few clicks minutes too late (refused as
//! late and counted). Each producer sticks to one node. Midway the third node is partitioned
//! from the others, keeps ingesting, and is healed. The example then waits until every window
//! is final on every node, prints the table with each window's finality, and checks it
//! against a batch recount of the same events (each distinct click once, those reported late
//! left out): it exits non-zero if any node disagrees.
//!
//! Run: `cargo run --example clickstream` (`SEED=n` replays another stream).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tidemark::views::{Event, ViewDef, ViewQuery};
use tidemark::{Node, NodeConfig};

const MIN: u64 = 60_000;
/// 2026-11-29T10:00:00Z.
const T0: u64 = 1_795_946_400_000;
const PAGES: [&str; 4] = ["/", "/cart", "/docs", "/pricing"];
const CLICKS_PER_NODE: u64 = 250;

/// One generated click and the node it is sent to.
struct Sent {
    node: usize,
    event: Event,
    page: &'static str,
    time: u64,
}

fn view_defs() -> Result<Vec<ViewDef>, serde_json::Error> {
    serde_json::from_value(json!([{
        "name": "clicks_per_page",
        "stream": "clicks",
        "kind": "count",
        "group_by": ["page"],
        "window": {"tumbling": "1m", "lateness": "30s", "out_of_orderness": "10s",
                   "idle_timeout": "2s"},
    }]))
}

/// `(window start, page) → (count, final)` as `node` reads it.
async fn table(node: &Node) -> Result<BTreeMap<(u64, String), (u64, bool)>, tidemark::Error> {
    let mut out = BTreeMap::new();
    let mut q = ViewQuery::default();
    loop {
        let page = node.view("clicks_per_page", &q).await?;
        for r in page.rows {
            let p = r.group.get("page").and_then(|p| p.as_str()).unwrap_or("?");
            let count = r.value.as_u64().unwrap_or(0);
            out.insert(
                (r.window_start.unwrap_or(0), p.to_owned()),
                (count, r.is_final),
            );
        }
        match page.next {
            Some(n) => q.after = Some(n),
            None => return Ok(out),
        }
    }
}

async fn converged(nodes: &[Node]) -> Result<bool, tidemark::Error> {
    let first = nodes[0].context()?;
    for n in &nodes[1..] {
        if n.context()? != first {
            return Ok(false);
        }
    }
    Ok(true)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026);
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let mut nodes = Vec::new();
    for i in 0..3 {
        let mut cfg = NodeConfig::new(dir.path().join(format!("node{i}")));
        cfg.views = view_defs()?;
        nodes.push(Node::open(cfg).await?);
    }
    for (i, j) in [(0, 1), (0, 2), (1, 2)] {
        nodes[i].connect(&nodes[j])?;
    }

    // The stream: producer `web-i` sends to node i; event time advances ~0.4 s per click.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut plan: Vec<Sent> = Vec::new();
    let mut seqs = [0u64; 3];
    for k in 0..3 * CLICKS_PER_NODE {
        let node = (k % 3) as usize;
        let now = T0 + MIN + k * 400;
        let time = if now > T0 + 4 * MIN && rng.random_bool(0.03) {
            now - 3 * MIN - rng.random_range(0..MIN) // minutes too late
        } else {
            (now + rng.random_range(0..5_000)).saturating_sub(rng.random_range(0..20_000))
        };
        let page = PAGES[rng.random_range(0..PAGES.len())];
        seqs[node] += 1;
        let event = Event::new(
            &format!("web-{node}"),
            seqs[node],
            json!({"page": page, "user": format!("u{}", rng.random_range(0..50))}),
        )
        .at(time);
        plan.push(Sent {
            node,
            event,
            page,
            time,
        });
    }

    // Ingest: each click in its own call (so a `late` report names exactly that click), 10%
    // retried; node 2 partitioned for the middle third.
    let mut late: BTreeSet<(usize, u64)> = BTreeSet::new();
    let (mut duplicates, mut retries) = (0usize, 0usize);
    let third = plan.len() / 3;
    for (k, s) in plan.iter().enumerate() {
        if k == third {
            nodes[2].disconnect(&nodes[0])?;
            nodes[2].disconnect(&nodes[1])?;
            println!("partition: node2 cut off after {k} clicks");
        }
        if k == 2 * third {
            let t = table(&nodes[0]).await?;
            let finals = t.values().filter(|(_, f)| *f).count();
            println!(
                "healing after {k} clicks (node0: {} cells, {finals} final; later windows wait for node2)",
                t.len()
            );
            nodes[2].connect(&nodes[0])?;
            nodes[2].connect(&nodes[1])?;
        }
        let out = nodes[s.node]
            .ingest("clicks", vec![s.event.clone()])
            .await?;
        if out.late > 0 {
            late.insert((s.node, s.event.seq));
        }
        if rng.random_bool(0.1) {
            retries += 1;
            let again = nodes[s.node]
                .ingest("clicks", vec![s.event.clone()])
                .await?;
            duplicates += again.duplicates;
        }
    }
    println!(
        "ingested {} clicks on 3 nodes: {retries} retries ({duplicates} reported duplicate), {} reported late",
        plan.len(),
        late.len()
    );

    // Wait for convergence and for every window to be final everywhere (the idle timeout
    // advances the watermarks once the producers stop).
    let deadline = Instant::now() + Duration::from_secs(40);
    let tables = loop {
        let mut tables = Vec::new();
        for n in &nodes {
            tables.push(table(n).await?);
        }
        let all_final = tables
            .iter()
            .all(|t| !t.is_empty() && t.values().all(|(_, f)| *f));
        if all_final && converged(&nodes).await? {
            break tables;
        }
        if Instant::now() > deadline {
            println!("windows did not all become final in time");
            break tables;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The batch recount: every distinct click once, minus those reported late.
    let mut recount: BTreeMap<(u64, String), u64> = BTreeMap::new();
    for s in &plan {
        if !late.contains(&(s.node, s.event.seq)) {
            *recount
                .entry((s.time - s.time % MIN, s.page.to_owned()))
                .or_default() += 1;
        }
    }

    println!("\nclicks per page per minute (node0):");
    println!(
        "{:<8} {:<10} {:>6} {:>8} {:>6}",
        "minute", "page", "count", "recount", "final"
    );
    let mut ok = true;
    let keys: BTreeSet<&(u64, String)> = recount.keys().chain(tables[0].keys()).collect();
    for key in keys {
        let (count, fin) = tables[0].get(key).copied().unwrap_or((0, false));
        let expect = recount.get(key).copied().unwrap_or(0);
        let mark = if count == expect {
            ""
        } else {
            "  <-- MISMATCH"
        };
        ok &= count == expect && fin;
        println!(
            "{:<8} {:<10} {:>6} {:>8} {:>6}{mark}",
            format!("+{}m", key.0.saturating_sub(T0) / MIN),
            key.1,
            count,
            expect,
            fin
        );
    }
    for (i, t) in tables.iter().enumerate().skip(1) {
        if *t != tables[0] {
            println!("node{i} disagrees with node0");
            ok = false;
        }
    }
    for n in &nodes {
        n.shutdown().await?;
    }
    println!(
        "\n{} ({} windows, {:.1} s)",
        if ok {
            "OK: every window is final and equals the batch recount on all three nodes"
        } else {
            "FAILED: the views differ from the batch recount"
        },
        recount.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(ok)
}
