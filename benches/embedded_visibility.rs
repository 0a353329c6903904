//! Write → visible-everywhere latency between 3 embedded nodes of one process connected with
//! `Node::connect` (the in-process peer link): each write is a fresh gcounter key applied on
//! the nodes in turn, at a fixed rate (open loop); a watcher on every node records when the key
//! appears there; the latency of a write is the time from calling `apply` to its appearance on
//! the last of the 3 nodes.
//!
//! `cargo bench --bench embedded_visibility` (`BENCH_SECS=N`, default 10; `BENCH_RATE=N` writes
//! per second, default 10).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark::{KeyFilter, Node, NodeConfig, Op, WatchEvent};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1));
    v.get(i).copied().unwrap_or(f64::NAN)
}

type Seen = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

fn main() {
    let secs = env_u64("BENCH_SECS", 10);
    let rate = env_u64("BENCH_RATE", 10).max(1);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let dirs: Vec<_> = (0..3)
            .map(|_| tempfile::tempdir().expect("tempdir"))
            .collect();
        let mut nodes = Vec::new();
        for d in &dirs {
            nodes.push(Node::open(NodeConfig::new(d.path())).await.expect("open"));
        }
        for i in 0..nodes.len() {
            for j in i + 1..nodes.len() {
                nodes[i].connect(&nodes[j]).expect("connect");
            }
        }
        let seen: Seen = Arc::default();
        for n in &nodes {
            let mut w = n.watch(KeyFilter::prefix("vis-"));
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                while let Some(ev) = w.next().await {
                    if let WatchEvent::Changed(c) = ev {
                        let now = Instant::now();
                        if let Ok(mut s) = seen.lock() {
                            s.entry(c.key.name.to_string()).or_default().push(now);
                        }
                    }
                }
            });
        }
        // Warm up: one write from every node seen everywhere.
        for (i, n) in nodes.iter().enumerate() {
            n.apply(Op::inc_gcounter(&format!("vis-warm-{i}"), 1))
                .await
                .expect("warm-up write");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let start = Instant::now();
        let period = Duration::from_secs_f64(1.0 / rate as f64);
        let mut sent = Vec::new();
        let mut i = 0u64;
        while start.elapsed() < Duration::from_secs(secs) {
            let due = start + period.mul_f64(i as f64);
            tokio::time::sleep_until(due.into()).await;
            let key = format!("vis-{i}");
            let at = Instant::now();
            let node = &nodes[(i as usize) % nodes.len()];
            if node.apply(Op::inc_gcounter(&key, 1)).await.is_ok() {
                sent.push((key, at));
            }
            i += 1;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let s = seen.lock().expect("seen").clone();
        let mut lat = Vec::new();
        let mut missing = 0;
        for (key, at) in &sent {
            match s.get(key) {
                Some(v) if v.len() >= nodes.len() => {
                    let last = v.iter().take(nodes.len()).max().copied().unwrap_or(*at);
                    lat.push(last.duration_since(*at).as_secs_f64() * 1e3);
                }
                _ => missing += 1,
            }
        }
        println!("3 embedded nodes (Node::connect), writes round-robin over the nodes");
        println!("rate | writes | p50 ms | p99 ms | max ms | not everywhere after 3 s");
        println!(
            "{rate}/s | {} | {:.2} | {:.2} | {:.2} | {missing}",
            sent.len(),
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            pct(&mut lat, 1.0)
        );
        for n in &nodes {
            n.shutdown().await.expect("shutdown");
        }
    });
}
