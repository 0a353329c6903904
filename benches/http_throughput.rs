//! HTTP throughput of one node on loopback (server and clients share the machine's cores):
//! batched NDJSON ingest (1,000 events per request, several clients) and single-op
//! `POST /v1/ops` requests from 1 and 16 clients, every answer after the durable commit.
//!
//! `cargo bench --bench http_throughput` (`BENCH_SECS=N` per workload, default 5).

use std::time::{Duration, Instant};
use tidemark::http::{HttpConfig, HttpServer};
use tidemark::{Node, NodeConfig};

fn secs() -> u64 {
    std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// Runs `clients` threads calling `request(client, i)` until the deadline; returns per-request
/// latencies and the number of items each request carried.
fn drive(
    clients: usize,
    items_per_request: u64,
    request: impl Fn(&ureq::Agent, usize, u64) -> u16 + Send + Sync + Clone + 'static,
) -> (u64, Vec<Duration>, Duration) {
    let deadline = Instant::now() + Duration::from_secs(secs());
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let request = request.clone();
            std::thread::spawn(move || {
                let a = agent();
                let mut lat = Vec::new();
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let status = request(&a, c, i);
                    assert_eq!(status, 200, "request failed");
                    lat.push(t.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap_or_default());
    }
    let elapsed = started.elapsed();
    (all.len() as u64 * items_per_request, all, elapsed)
}

fn pct(lat: &mut [Duration], p: f64) -> f64 {
    lat.sort();
    let i = ((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1));
    lat.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (node, addr, stop) = rt.block_on(async {
        let node = Node::open(NodeConfig::new(dir.path())).await.expect("open");
        let http = HttpConfig {
            listen: "127.0.0.1:0".parse().expect("addr"),
            ..HttpConfig::default()
        };
        let server = HttpServer::bind(node.clone(), http).await.expect("bind");
        let addr = server.local_addr();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.run(async {
            let _ = rx.await;
        }));
        (node, addr, stop)
    });
    let base = format!("http://{addr}");
    // The disk's fsync latency right now bounds a single client's durable requests.
    let mut fsyncs = Vec::new();
    let probe = dir.path().join("fsync-probe");
    if let Ok(mut f) = std::fs::File::create(&probe) {
        use std::io::Write;
        for _ in 0..200 {
            let t = Instant::now();
            let _ = f.write_all(&[0u8; 512]);
            let _ = f.sync_data();
            fsyncs.push(t.elapsed());
        }
    }
    println!(
        "raw fsync (write 512 B + sync_data): p50 {:.2} ms, p99 {:.2} ms",
        pct(&mut fsyncs, 0.5),
        pct(&mut fsyncs, 0.99)
    );
    println!("workload | clients | items/s | p50 ms | p99 ms");

    for clients in [1usize, 4] {
        let url = format!("{base}/v1/streams/bench/events");
        let (items, mut lat, elapsed) = drive(clients, 1000, move |a, c, i| {
            let mut body = String::with_capacity(100_000);
            for k in 0..1000u64 {
                let seq = i * 1000 + k + 1;
                body.push_str(&format!(
                    "{{\"source\":\"c{c}-{clients}\",\"seq\":{seq},\"ops\":[{{\"type\":\"gcounter\",\"key\":\"page-{}\",\"op\":\"inc\"}}]}}\n",
                    seq % 100
                ));
            }
            a.post(&url)
                .send(body.as_bytes())
                .map_or(0, |r| r.status().as_u16())
        });
        println!(
            "ingest NDJSON (1000 events/request) | {clients} | {:.0} events/s | {:.1} | {:.1}",
            items as f64 / elapsed.as_secs_f64(),
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99)
        );
    }
    for clients in [1usize, 16] {
        let url = format!("{base}/v1/ops");
        let (items, mut lat, elapsed) = drive(clients, 1, move |a, c, i| {
            let body = format!(
                "[{{\"type\":\"orset\",\"key\":\"members-{c}\",\"op\":\"add\",\"value\":\"u{i}\"}}]"
            );
            a.post(&url)
                .content_type("application/json")
                .send(body.as_bytes())
                .map_or(0, |r| r.status().as_u16())
        });
        println!(
            "single-op POST /v1/ops | {clients} | {:.0} requests/s | {:.2} | {:.2}",
            items as f64 / elapsed.as_secs_f64(),
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99)
        );
    }
    let m = node.metrics();
    println!(
        "commits {} (mean group {:.1} writes)",
        m.commits,
        m.commit_groups_ops as f64 / m.commits.max(1) as f64
    );
    let _ = stop.send(());
    rt.block_on(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = node.shutdown().await;
    });
}
