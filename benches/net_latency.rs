//! Replication latency over the network: 5 nodes in one process, each with its own
//! QUIC endpoint on 127.0.0.1 with mutual TLS (one cluster CA), fully joined. Writes go to the
//! nodes round-robin at a steady rate (open loop); for each write, the time from its durable
//! acknowledgement on the writing node until a watcher on every other node saw it.
//!
//! `cargo bench --bench net_latency` reports, per rate (10, 1,000 and 10,000 writes/s by
//! default): p50/p99/max of ack→visible-everywhere (and of call→visible-everywhere), and the
//! bytes on the wire per replicated op per receiving node (UDP payload, so QUIC and TLS overhead
//! included; and the frame bytes the protocol wrote).
//!
//! Then the bootstrap time of a new node joining a cluster holding `BENCH_BOOTSTRAP_KEYS` keys
//! (comma-separated, default 100,000; empty to skip).
//!
//! Environment: `BENCH_SECS` (seconds per rate, default 3), `BENCH_RATES` (comma-separated
//! writes/s). Output: Markdown on stdout.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidemark::net::ClusterCa;
use tidemark::{KeyFilter, Node, NodeConfig, Op, WatchEvent};

const NODES: usize = 5;

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Per key: (call time, ack time, nodes that have seen it).
type Pending = Arc<Mutex<HashMap<String, (Instant, Option<Instant>, usize, Instant)>>>;

async fn run(rate: f64, secs: f64) -> Result<(), Box<dyn std::error::Error>> {
    let root = tempfile::tempdir()?;
    let ca = ClusterCa::generate()?;
    let mut nodes = Vec::new();
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for i in 0..NODES {
        let mut cfg = NodeConfig::new(root.path().join(format!("n{i}")));
        cfg.limits.watch_buffer_max = 1 << 17;
        cfg.limits.watch_buffer_bytes_max = 1 << 30;
        let node = Node::open(cfg).await?;
        let addr = node
            .listen(
                SocketAddr::from(([127, 0, 0, 1], 0)),
                ca.issue(&format!("n{i}"))?,
            )
            .await?;
        nodes.push(node);
        addrs.push(addr);
    }
    for (i, n) in nodes.iter().enumerate() {
        for (j, a) in addrs.iter().enumerate() {
            if i < j {
                n.join_peer(*a)?;
            }
        }
    }
    // Wait for the full mesh, every member alive in SWIM (only those replicate).
    let started = Instant::now();
    let alive = |s: &tidemark::net::NetStatus| {
        s.members
            .iter()
            .filter(|m| m.state == tidemark::net::MemberState::Alive)
            .count()
    };
    while nodes
        .iter()
        .any(|n| n.net_status().map_or(0, |s| s.peers.len().min(alive(&s))) < NODES - 1)
    {
        if started.elapsed() > Duration::from_secs(20) {
            return Err("the mesh did not form".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // key -> (call, ack, seen-by count, last seen)
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let mut watchers = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let mut w = n.watch(KeyFilter::prefix("w"));
        let pending = Arc::clone(&pending);
        let origin_prefix = format!("w{i}-");
        watchers.push(tokio::spawn(async move {
            let mut lagged = 0u64;
            while let Some(ev) = w.next().await {
                match ev {
                    WatchEvent::Changed(c) => {
                        if c.key.name.starts_with(&origin_prefix) {
                            continue; // the writer's own commit
                        }
                        let now = Instant::now();
                        if let Ok(mut p) = pending.lock() {
                            if let Some(e) = p.get_mut(&c.key.name) {
                                e.2 += 1;
                                e.3 = now;
                            }
                        }
                    }
                    WatchEvent::Reset { missed } => lagged += missed.unwrap_or(1),
                }
            }
            lagged
        }));
    }
    let before: Vec<(u64, u64)> = nodes
        .iter()
        .map(|n| {
            let s = n.net_status().map(|s| s.stats).unwrap_or_default();
            (s.udp_bytes_sent, s.frame_bytes_sent)
        })
        .collect();
    let total = (rate * secs).max(1.0) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now();
    let mut writes = Vec::new();
    for k in 0..total {
        let due = t0 + interval.mul_f64(k as f64);
        tokio::time::sleep_until(due.into()).await;
        let i = (k as usize) % NODES;
        let key = format!("w{i}-{k}");
        let node = nodes[i].clone();
        let pending = Arc::clone(&pending);
        let call = Instant::now();
        if let Ok(mut p) = pending.lock() {
            p.insert(key.clone(), (call, None, 0, call));
        }
        writes.push(tokio::spawn(async move {
            let r = node.apply(Op::inc_gcounter(&key, 1)).await;
            let ack = Instant::now();
            if let Ok(mut p) = pending.lock() {
                if let Some(e) = p.get_mut(&key) {
                    e.1 = Some(ack);
                }
            }
            r.map(|_| ())
        }));
    }
    for w in writes {
        w.await??;
    }
    let issued = t0.elapsed();
    // Let the tail arrive.
    let drain = Instant::now();
    loop {
        let done = pending
            .lock()
            .map(|p| p.values().all(|e| e.2 >= NODES - 1))
            .unwrap_or(false);
        if done || drain.elapsed() > Duration::from_secs(10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let after: Vec<(u64, u64)> = nodes
        .iter()
        .map(|n| {
            let s = n.net_status().map(|s| s.stats).unwrap_or_default();
            (s.udp_bytes_sent, s.frame_bytes_sent)
        })
        .collect();
    let (mut from_ack, mut from_call, mut missing) = (Vec::new(), Vec::new(), 0usize);
    if let Ok(p) = pending.lock() {
        for (call, ack, seen, last) in p.values() {
            if *seen < NODES - 1 {
                missing += 1;
                continue;
            }
            from_call.push(last.saturating_duration_since(*call));
            if let Some(a) = ack {
                from_ack.push(last.saturating_duration_since(*a));
            }
        }
    }
    from_ack.sort();
    from_call.sort();
    let udp: u64 = after.iter().zip(&before).map(|(a, b)| a.0 - b.0).sum();
    let frames: u64 = after.iter().zip(&before).map(|(a, b)| a.1 - b.1).sum();
    let receivers = (total * (NODES as u64 - 1)) as f64;
    println!(
        "| {rate:.0} | {total} | {:.0} | {} / {} / {} | {} / {} / {} | {:.0} | {:.0} | {missing} |",
        total as f64 / issued.as_secs_f64(),
        ms(pct(&from_ack, 0.5)),
        ms(pct(&from_ack, 0.99)),
        ms(from_ack.last().copied().unwrap_or_default()),
        ms(pct(&from_call, 0.5)),
        ms(pct(&from_call, 0.99)),
        ms(from_call.last().copied().unwrap_or_default()),
        udp as f64 / receivers,
        frames as f64 / receivers,
    );
    for n in &nodes {
        n.shutdown().await?;
    }
    for w in watchers {
        w.abort();
    }
    Ok(())
}

/// Bootstrap: a 2-node cluster holding `keys` keys (written on n0 in calls of 1,000, replicated
/// to n1); a new node seeded with n0 joins; the time from `join_peer` until its context equals
/// the cluster's, and how many transfers it received (and from how many senders).
async fn bootstrap(keys: usize) -> Result<(), Box<dyn std::error::Error>> {
    let root = tempfile::tempdir()?;
    let ca = ClusterCa::generate()?;
    let mut nodes = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..3 {
        let node = Node::open(NodeConfig::new(root.path().join(format!("b{i}")))).await?;
        let addr = node
            .listen(
                SocketAddr::from(([127, 0, 0, 1], 0)),
                ca.issue(&format!("b{i}"))?,
            )
            .await?;
        nodes.push(node);
        addrs.push(addr);
    }
    let written = Instant::now();
    for start in (0..keys).step_by(1000) {
        let ops = (start..(start + 1000).min(keys))
            .map(|k| Op::inc_gcounter(&format!("key-{k:08}"), 1))
            .collect();
        nodes[0].apply_batch(ops).await?;
    }
    let write_time = written.elapsed();
    nodes[1].join_peer(addrs[0])?;
    let synced = Instant::now();
    while nodes[1].context()? != nodes[0].context()? {
        if synced.elapsed() > Duration::from_secs(1800) {
            return Err("the second node did not sync".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = synced.elapsed();
    let target = nodes[0].context()?;
    let mut started_before = Vec::new();
    for n in &nodes[..2] {
        started_before.push(n.replication_status().await?.stats.transfers_started);
    }
    let joined = Instant::now();
    nodes[2].join_peer(addrs[0])?;
    while nodes[2].context()? != target {
        if joined.elapsed() > Duration::from_secs(1800) {
            return Err("the new node did not sync".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = joined.elapsed();
    // Let deferred senders decide (they must not start a second transfer).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let got = nodes[2]
        .replication_status()
        .await?
        .stats
        .transfers_received;
    let mut senders = 0;
    for (n, before) in nodes[..2].iter().zip(&started_before) {
        if n.replication_status().await?.stats.transfers_started > *before {
            senders += 1;
        }
    }
    println!(
        "| {keys} | {:.2} s | {:.2} s | {:.2} s | {got} | {senders} |",
        write_time.as_secs_f64(),
        second.as_secs_f64(),
        took.as_secs_f64()
    );
    for n in &nodes {
        n.shutdown().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bootstrap_keys: Vec<usize> = std::env::var("BENCH_BOOTSTRAP_KEYS")
        .unwrap_or_else(|_| "100000".into())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    let secs = env_f64("BENCH_SECS", 3.0);
    let rates: Vec<f64> = std::env::var("BENCH_RATES")
        .unwrap_or_else(|_| "10,1000,10000".into())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    println!(
        "### Write → visible on all {} other nodes (5 nodes, one process, loopback QUIC, mTLS)\n",
        NODES - 1
    );
    println!(
        "| writes/s | writes | achieved/s | ack→all p50 / p99 / max (ms) | call→all p50 / p99 / max (ms) | UDP bytes per op per receiver | frame bytes per op per receiver | not seen everywhere |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for rate in rates {
        run(rate, secs).await?;
    }
    if !bootstrap_keys.is_empty() {
        println!(
            "\n### Bootstrap of a new node (3rd) seeded with one member of a 2-node cluster\n"
        );
        println!(
            "| keys | write on n0 | n1 joins (one transfer) | new node joins, until same context | transfers received by the new node | nodes that started a transfer (of all) |"
        );
        println!("|---|---|---|---|---|---|");
        for keys in bootstrap_keys {
            bootstrap(keys).await?;
        }
    }
    Ok(())
}
