//! Cost of stream views on durable ingest: the same events through `Node::ingest`
//! into a stream with 0 (raw), 1, 3 and 10 windowed views, in durable batches of 1,000 from
//! one writer, each run on a fresh node in a temp directory, all in one process so the
//! ratios compare runs under the same machine load. Then the same on 3 in-process nodes
//! connected in a full mesh (raw and 3 views), each ingesting its own sources at once: events/s
//! over the cluster until every node holds every event, so replication, the joins of the
//! others' deltas and the views' maintenance (seal rounds every 50 ms) are in the figure. Then,
//! on 3 such nodes, the delay from a window's end + lateness (wall clock; events carry the
//! wall-clock time) to the moment it is `final` on all three nodes.
//!
//! `cargo bench --bench views_ingest`; environment: `BENCH_EVENTS` (events per run, default
//! 50,000), `BENCH_ROUNDS` (rounds of the four runs back to back, default 3),
//! `BENCH_CLUSTER_EVENTS` (events per node of a cluster run, default 20,000; raw and 3 views
//! back to back, `BENCH_ROUNDS` times), `BENCH_FINAL_SECS` (seconds of the finality-delay run,
//! default 8), `BENCH_PARTS` (a comma list of `single`, `cluster`, `final`; default all three),
//! `BENCH_VIEWS` (the view counts of the single-node runs besides raw, default `1,3,10`).
//! Output: a Markdown table with the median events/s, the median over rounds of the ratio of
//! raw ingest's rate to each configuration's within the round (the cost factor) and each round's
//! ratio, and the bytes on disk per view cell (a group's value in one window) above the raw
//! run; the cluster runs' medians and ratio; the finality delays.

use serde_json::json;
use std::time::Instant;
use tidemark::views::{Event, ViewDef};
use tidemark::{Node, NodeConfig};

const BATCH: usize = 1_000;

fn defs(n: usize) -> Vec<ViewDef> {
    let w1 = json!({"tumbling": "1m", "lateness": "10s"});
    let all = json!([
        {"name": "clicks", "stream": "s", "kind": "count", "group_by": ["page"], "window": w1},
        {"name": "spend", "stream": "s", "kind": "sum", "group_by": ["page"], "field": "amount",
         "window": w1},
        {"name": "users", "stream": "s", "kind": "distinct", "group_by": ["page"],
         "field": "user", "window": w1},
        {"name": "last", "stream": "s", "kind": "latest", "group_by": ["page"], "field": "user",
         "window": w1},
        {"name": "clicks5", "stream": "s", "kind": "count", "group_by": ["page"],
         "window": {"tumbling": "5m"}},
        {"name": "total", "stream": "s", "kind": "count", "window": w1},
        {"name": "spend_total", "stream": "s", "kind": "sum", "field": "amount", "window": w1},
        {"name": "per_user", "stream": "s", "kind": "count", "group_by": ["user"], "window": w1},
        {"name": "pages_of_user", "stream": "s", "kind": "distinct", "group_by": ["user"],
         "field": "page", "window": w1},
        {"name": "clicks_h", "stream": "s", "kind": "count", "group_by": ["page"],
         "window": {"tumbling": "10m"}},
    ]);
    let mut v: Vec<ViewDef> = serde_json::from_value(all).unwrap_or_default();
    v.truncate(n);
    v
}

fn events(n: usize) -> Vec<Event> {
    events_of("", n)
}

/// `n` events of ten sources named `{prefix}src{k}`, 6,000 per one-minute window of event time.
fn events_of(prefix: &str, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let i = i as u64;
            Event::new(
                &format!("{prefix}src{}", i % 10),
                i / 10 + 1,
                json!({
                    "page": format!("/p{}", (i * 7) % 20),
                    "user": format!("u{}", (i * 13) % 1_000),
                    "amount": (i % 9) as i64 - 2,
                }),
            )
            .at(i * 10) // 6,000 events per one-minute window
        })
        .collect()
}

fn dir_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// One run: events/s, bytes on disk, view cells.
async fn run(views: usize, evs: &[Event]) -> Result<(f64, u64, usize), tidemark::Error> {
    let dir = tempfile::tempdir().map_err(|e| tidemark::Error::Config(e.to_string()))?;
    let mut cfg = NodeConfig::new(dir.path());
    cfg.views = defs(views);
    let node = Node::open(cfg).await?;
    let started = Instant::now();
    for chunk in evs.chunks(BATCH) {
        node.ingest("s", chunk.to_vec()).await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let mut cells = 0;
    for v in node.views() {
        let mut q = tidemark::views::ViewQuery {
            limit: 10_000,
            ..Default::default()
        };
        loop {
            let page = node.view(&v.def.name, &q).await?;
            cells += page.rows.len();
            match page.next {
                Some(n) => q.after = Some(n),
                None => break,
            }
        }
    }
    node.shutdown().await?;
    Ok((evs.len() as f64 / secs, dir_bytes(dir.path()), cells))
}

/// One cluster run: 3 in-process nodes in a full mesh with `views` windowed views, each
/// ingesting its own events (`per_node[i]`, durable batches of [`BATCH`]) at the same time;
/// events/s over all nodes from the start until every node holds every event.
async fn cluster_run(views: usize, per_node: &[Vec<Event>]) -> Result<f64, tidemark::Error> {
    let dir = tempfile::tempdir().map_err(|e| tidemark::Error::Config(e.to_string()))?;
    let mut nodes = Vec::new();
    for i in 0..per_node.len() {
        let mut cfg = NodeConfig::new(dir.path().join(format!("n{i}")));
        cfg.views = defs(views);
        nodes.push(Node::open(cfg).await?);
    }
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            nodes[i].connect(&nodes[j])?;
        }
    }
    let started = Instant::now();
    let writers: Vec<_> = nodes
        .iter()
        .zip(per_node)
        .map(|(n, evs)| {
            let (n, evs) = (n.clone(), evs.clone());
            tokio::spawn(async move {
                for chunk in evs.chunks(BATCH) {
                    n.ingest("s", chunk.to_vec()).await?;
                }
                Ok::<(), tidemark::Error>(())
            })
        })
        .collect();
    for w in writers {
        w.await
            .map_err(|e| tidemark::Error::Config(e.to_string()))??;
    }
    loop {
        let ctxs = nodes
            .iter()
            .map(Node::context)
            .collect::<Result<Vec<_>, _>>()?;
        if ctxs.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        if started.elapsed().as_secs() > 600 {
            return Err(tidemark::Error::Config("no convergence in 600 s".into()));
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    for n in &nodes {
        n.shutdown().await?;
    }
    let total: usize = per_node.iter().map(Vec::len).sum();
    Ok(total as f64 / secs)
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Delay (ms) from end + lateness to final on all of 3 nodes, per window.
async fn finality_delays(secs: u64) -> Result<Vec<u64>, tidemark::Error> {
    const SIZE: u64 = 1_000;
    const LATENESS: u64 = 200;
    let dir = tempfile::tempdir().map_err(|e| tidemark::Error::Config(e.to_string()))?;
    let defs: Vec<ViewDef> = serde_json::from_value(json!([{
        "name": "c", "stream": "s", "kind": "count", "group_by": ["page"],
        "window": {"tumbling": "1s", "lateness": "200ms"},
    }]))
    .unwrap_or_default();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let mut cfg = NodeConfig::new(dir.path().join(format!("n{i}")));
        cfg.views = defs.clone();
        nodes.push(Node::open(cfg).await?);
    }
    for (i, j) in [(0, 1), (0, 2), (1, 2)] {
        nodes[i].connect(&nodes[j])?;
    }
    let stop = wall_ms() + secs * 1_000;
    let producers: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let n = n.clone();
            tokio::spawn(async move {
                let mut seq = 0;
                while wall_ms() < stop + 2 * SIZE {
                    seq += 1;
                    let e = Event::new(&format!("n{i}"), seq, json!({"page": "/"})).at(wall_ms());
                    if n.ingest("s", vec![e]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    let mut final_on: std::collections::BTreeMap<u64, [Option<u64>; 3]> = Default::default();
    while wall_ms() < stop + 2 * SIZE {
        for (i, n) in nodes.iter().enumerate() {
            let page = n.view("c", &tidemark::views::ViewQuery::default()).await?;
            let now = wall_ms();
            for r in page.rows.iter().filter(|r| r.is_final) {
                let slot = final_on.entry(r.window_start.unwrap_or(0)).or_default();
                slot[i].get_or_insert(now);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for p in producers {
        let _ = p.await;
    }
    for n in &nodes {
        n.shutdown().await?;
    }
    let first = final_on.keys().next().copied().unwrap_or(0);
    Ok(final_on
        .into_iter()
        .filter(|(start, _)| *start > first) // the first window started before the producers
        .filter_map(|(start, on)| {
            let all = on.iter().copied().collect::<Option<Vec<u64>>>()?;
            let at = all.into_iter().max()?;
            Some(at.saturating_sub(start + SIZE + LATENESS))
        })
        .collect())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), tidemark::Error> {
    let num = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|v| *v > 0)
            .unwrap_or(default)
    };
    let n = num("BENCH_EVENTS", 50_000);
    let rounds = num("BENCH_ROUNDS", 3);
    let parts = std::env::var("BENCH_PARTS").unwrap_or_else(|_| "single,cluster,final".into());
    let part = |p: &str| parts.split(',').any(|x| x.trim() == p);
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    if part("single") {
        single(n, rounds, &median).await?;
    }
    if part("cluster") {
        let per = num("BENCH_CLUSTER_EVENTS", 20_000);
        let per_node: Vec<Vec<Event>> = (0..3).map(|i| events_of(&format!("n{i}"), per)).collect();
        let mut raw = Vec::new();
        let mut three = Vec::new();
        for round in 0..rounds {
            raw.push(cluster_run(0, &per_node).await?);
            three.push(cluster_run(3, &per_node).await?);
            eprintln!(
                "cluster round {round}: raw {:.0} events/s, 3 views {:.0} events/s",
                raw[round], three[round]
            );
        }
        let ratios: Vec<f64> = raw.iter().zip(&three).map(|(r, t)| r / t).collect();
        println!(
            "\n3 in-process nodes (full mesh), each ingesting {per} events of its own sources in \
             durable batches of {BATCH} at once, until every node holds all {}: raw median {:.0} \
             events/s ({}), 3 views median {:.0} events/s ({}); cost (raw / 3 views) median {:.2}× \
             ({})",
            3 * per,
            median(raw.clone()),
            raw.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" / "),
            median(three.clone()),
            three
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" / "),
            median(ratios.clone()),
            ratios
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" / "),
        );
    }
    if part("final") {
        let mut d = finality_delays(num("BENCH_FINAL_SECS", 8) as u64).await?;
        d.sort_unstable();
        if !d.is_empty() {
            println!(
                "\n3 in-process nodes, 1 s tumbling windows, 200 ms lateness, each node ingesting \
                 one event per 20 ms: delay from window end + lateness to final on all 3 nodes \
                 over {} windows: median {} ms, max {} ms",
                d.len(),
                d[d.len() / 2],
                d[d.len() - 1]
            );
        }
    }
    Ok(())
}

/// The single-node runs: the four configurations back to back, `rounds` times.
async fn single(
    n: usize,
    rounds: usize,
    median: &dyn Fn(Vec<f64>) -> f64,
) -> Result<(), tidemark::Error> {
    let evs = events(n);
    // `BENCH_VIEWS`: the configurations to run (a comma list of view counts; raw, 0, always
    // runs first, as the anchor of the ratios).
    let mut configs = vec![0usize];
    configs.extend(
        std::env::var("BENCH_VIEWS")
            .unwrap_or_else(|_| "1,3,10".into())
            .split(',')
            .filter_map(|x| x.trim().parse::<usize>().ok())
            .filter(|&v| v > 0),
    );
    // Per round: (rate, bytes, cells) of each configuration, run back to back.
    let mut rounds_out: Vec<[(f64, u64, usize); 4]> = Vec::new();
    for round in 0..rounds {
        let mut r = [(0f64, 0u64, 0usize); 4];
        for (i, &v) in configs.iter().enumerate() {
            r[i] = run(v, &evs).await?;
            eprintln!("round {round}: {v} views: {:.0} events/s", r[i].0);
        }
        rounds_out.push(r);
    }
    println!(
        "{n} events in durable batches of {BATCH}, one writer; medians over {rounds} rounds \
         (each round runs the four configurations back to back; cost = raw rate / rate within \
         a round)\n"
    );
    println!(
        "| views | events/s | cost (raw rate / rate) | cost per round | view cells | bytes on disk | bytes per cell above raw |"
    );
    println!("|---|---|---|---|---|---|---|");
    let raw_bytes = rounds_out[0][0].1;
    for (i, &v) in configs.iter().enumerate() {
        let rate = median(rounds_out.iter().map(|r| r[i].0).collect());
        let ratios: Vec<f64> = rounds_out.iter().map(|r| r[0].0 / r[i].0).collect();
        let per_round = ratios
            .iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" / ");
        let (_, bytes, cells) = rounds_out[0][i];
        let per_cell = if cells > 0 {
            format!(
                "{:.0}",
                bytes.saturating_sub(raw_bytes) as f64 / cells as f64
            )
        } else {
            "–".to_owned()
        };
        println!(
            "| {} | {:.0} | {:.2}× | {per_round} | {cells} | {bytes} | {per_cell} |",
            if v == 0 {
                "raw".to_owned()
            } else {
                v.to_string()
            },
            rate,
            median(ratios.clone()),
        );
    }
    Ok(())
}
