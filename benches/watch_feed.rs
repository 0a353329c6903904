//! The change feed: throughput to 1 and 100 watchers, delay from a write's call to a watcher's
//! receipt (p50/p99), and resident memory with 100 stalled watchers.
//!
//! Each write is a batch of `BENCH_BATCH` (default 100) counter increments on distinct keys
//! (one commit, that many changes). Throughput is changes delivered per second to every
//! watcher (the time until the last watcher has the last change). The baseline in the same run
//! is the same writes with no watcher: the ratio is what following the feed costs the writer.
//!
//! `cargo bench --bench watch_feed` (`BENCH_WRITES=N` batches, default 2,000).

use std::time::{Duration, Instant};
use tidemark::{KeyFilter, Node, NodeConfig, Op, WatchEvent};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1));
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn batch(i: u64, n: u64) -> Vec<Op> {
    (0..n)
        .map(|k| Op::inc_gcounter(&format!("b{i}-{k}"), 1))
        .collect()
}

/// Writes `writes` batches with `watchers` watchers reading; returns (changes/s to every
/// watcher, p50 ms, p99 ms) of the delay from a batch's call to its last change's receipt by
/// the first watcher.
async fn run(watchers: usize, writes: u64, per: u64) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::open(NodeConfig::new(dir.path())).await.expect("open");
    let total = writes * per;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    let mut tasks = Vec::new();
    for w in 0..watchers {
        let mut watch = node.watch(KeyFilter::prefix("b"));
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = 0u64;
            while seen < total {
                match watch.next().await {
                    Some(WatchEvent::Changed(c)) => {
                        seen += 1;
                        // The first watcher reports each batch's last change.
                        if w == 0 && c.key.name.ends_with(&format!("-{}", per - 1)) {
                            let i = c.key.name[1..]
                                .split('-')
                                .next()
                                .and_then(|s| s.parse().ok());
                            if let Some(i) = i {
                                let _ = tx.send((i, Instant::now()));
                            }
                        }
                    }
                    Some(WatchEvent::Reset { missed }) => seen += missed.unwrap_or(0),
                    None => break,
                }
            }
        }));
    }
    drop(tx);
    let started = Instant::now();
    let mut called = Vec::with_capacity(writes as usize);
    for i in 0..writes {
        called.push(Instant::now());
        node.apply_batch(batch(i, per)).await.expect("write");
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut delays = Vec::new();
    while let Ok((i, at)) = rx.try_recv() {
        if let Some(c) = called.get(i as usize) {
            delays.push(at.duration_since(*c).as_secs_f64() * 1e3);
        }
    }
    node.shutdown().await.expect("shutdown");
    let rate = if watchers == 0 {
        0.0
    } else {
        total as f64 / elapsed
    };
    let writer_rate = total as f64 / elapsed;
    if watchers == 0 {
        return (writer_rate, f64::NAN, f64::NAN);
    }
    (rate, pct(&mut delays, 0.5), pct(&mut delays, 0.99))
}

fn main() {
    let writes = env_u64("BENCH_WRITES", 2_000);
    let per = env_u64("BENCH_BATCH", 100).max(1);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (base, _, _) = run(0, writes, per).await;
        println!("no watcher (baseline): {base:.0} changes/s written");
        for w in [1usize, 100] {
            let (rate, p50, p99) = run(w, writes, per).await;
            println!(
                "{w} watcher(s): {rate:.0} changes/s to every watcher ({:.2}x the baseline), call-to-receipt p50 {p50:.2} ms, p99 {p99:.2} ms",
                rate / base
            );
        }
        // Resident memory over 100,000 changes of ~1 KiB values: with no watcher (baseline:
        // redb's cache and the allocator), then with 100 stalled watchers on a fresh node.
        let mut grown = Vec::new();
        for watchers in [0usize, 100] {
            let dir = tempfile::tempdir().expect("tempdir");
            let node = Node::open(NodeConfig::new(dir.path())).await.expect("open");
            let stalled: Vec<_> = (0..watchers).map(|_| node.watch(KeyFilter::all())).collect();
            let before = rss_bytes();
            let value = "x".repeat(1000);
            for i in 0..1_000u64 {
                let ops = (0..100)
                    .map(|k| Op::set_lww(&format!("v{i}-{k}"), serde_json::json!(value)))
                    .collect();
                node.apply_batch(ops).await.expect("write");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            grown.push(rss_bytes().saturating_sub(before));
            let status = node.watch_status();
            println!(
                "{watchers} stalled watchers over 100,000 changes of ~1 KiB: RSS grew {} MiB; the ring holds {} changes, {} MiB",
                grown[grown.len() - 1] >> 20,
                status.held_changes,
                status.held_bytes >> 20
            );
            drop(stalled);
            node.shutdown().await.expect("shutdown");
        }
    });
}
