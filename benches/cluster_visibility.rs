//! Write → visible-everywhere latency on 5 `tidemark serve` daemons (certificates from
//! `tidemark certs`, QUIC with mTLS on loopback), through HTTP: each write is a fresh key
//! `POST`ed to the nodes in turn; a `GET /v1/watch` stream on every node records when the key
//! appears there; the latency of a write is the time from sending it to its appearance on the
//! last of the 5 nodes. Two rates: 10 writes/s and 500 writes/s (open loop, 8 writer threads).
//!
//! `cargo bench --bench cluster_visibility` (`BENCH_SECS=N` per rate, default 10).

#[allow(dead_code)]
#[path = "../tests/nemesis/cluster.rs"]
mod cluster;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn secs() -> u64 {
    std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

type Seen = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

/// Follows node `http`'s watch stream for keys under `vis`, recording first appearances.
fn watch(http: std::net::SocketAddr, seen: Seen, ready: std::sync::mpsc::Sender<()>) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let Ok(r) = agent
        .get(format!("http://{http}/v1/watch?type=gcounter&prefix=vis"))
        .call()
    else {
        return;
    };
    let _ = ready.send(());
    let reader = BufReader::new(r.into_body().into_reader());
    for line in reader.lines() {
        let Ok(line) = line else { return };
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(data.trim()) else {
            continue;
        };
        if let Some(key) = v["key"].as_str() {
            let now = Instant::now();
            if let Ok(mut s) = seen.lock() {
                s.entry(key.to_owned()).or_default().push(now);
            }
        }
    }
}

/// The answer's status, its body read to the end: ureq 3 puts a connection back in its pool
/// only then, so without it every write opened (and the node accepted) a new connection.
fn answered(mut r: ureq::http::Response<ureq::Body>) -> u16 {
    let _ = r.body_mut().read_to_vec();
    r.status().as_u16()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1));
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn main() {
    let cluster = cluster::Cluster::start(5, "bench");
    let nodes: Vec<_> = cluster.nodes.iter().map(|n| n.http).collect();
    let seen: Seen = Arc::default();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    for &n in &nodes {
        let (seen, ready) = (Arc::clone(&seen), ready_tx.clone());
        std::thread::spawn(move || watch(n, seen, ready));
    }
    for _ in &nodes {
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("watch streams open");
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let post = |agent: &ureq::Agent, node: usize, key: &str| {
        agent
            .post(format!("http://{}/v1/ops", nodes[node]))
            .content_type("application/json")
            .send(format!(r#"[{{"type":"gcounter","key":"{key}","op":"inc","by":1}}]"#).as_bytes())
            .map(answered)
    };
    // Warm up: every node sees a write from every node (all connections up).
    for i in 0..nodes.len() {
        let key = format!("vis-warm-{i}");
        let _ = post(&agent, i, &key);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let s = seen.lock().expect("seen");
        let all = (0..nodes.len()).all(|i| {
            s.get(&format!("vis-warm-{i}"))
                .is_some_and(|v| v.len() >= nodes.len())
        });
        drop(s);
        if all {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("5 daemons on loopback (QUIC + mTLS), writes round-robin over the nodes");
    println!("rate | writes | achieved/s | p50 ms | p99 ms | max ms | not everywhere after 10 s");
    for (rate, threads) in [(10u64, 1usize), (500, 8)] {
        let sent: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
        let start = Instant::now();
        let run = Duration::from_secs(secs());
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (sent, post_agent) = (Arc::clone(&sent), agent.clone());
                let per_thread = Duration::from_secs_f64(threads as f64 / rate as f64);
                let nodes_len = nodes.len();
                let nodes = nodes.clone();
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while start.elapsed() < run {
                        let due = start + per_thread.mul_f64(n as f64);
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        let key = format!("vis-{rate}-{t}-{n}");
                        let node = (t + n as usize) % nodes_len;
                        let at = Instant::now();
                        let ok = post_agent
                            .post(format!("http://{}/v1/ops", nodes[node]))
                            .content_type("application/json")
                            .send(
                                format!(
                                    r#"[{{"type":"gcounter","key":"{key}","op":"inc","by":1}}]"#
                                )
                                .as_bytes(),
                            )
                            .is_ok_and(|r| answered(r) == 200);
                        if ok {
                            sent.lock().expect("sent").push((key, at));
                        }
                        n += 1;
                    }
                })
            })
            .collect();
        for h in handles {
            let _ = h.join();
        }
        let elapsed = start.elapsed();
        std::thread::sleep(Duration::from_secs(10));
        let sent = sent.lock().expect("sent").clone();
        let s = seen.lock().expect("seen");
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
        drop(s);
        println!(
            "{rate}/s | {} | {:.0} | {:.1} | {:.1} | {:.1} | {missing}",
            sent.len(),
            sent.len() as f64 / elapsed.as_secs_f64(),
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            pct(&mut lat, 1.0)
        );
    }
    drop(cluster);
}
