//! HTTP throughput of one node on loopback (server and clients share the machine's cores):
//! batched NDJSON ingest (1,000 events per request, several clients) and single-op
//! `POST /v1/ops` requests from 1 and 16 clients, every answer after the durable commit.
//!
//! Beside it, in the same run, **Redis** (`redis-server` started here on a free port,
//! `appendonly yes` with `appendfsync always` and `everysec`, no RDB) driven by
//! `redis-benchmark` with the same counter increments (`INCRBY` over 100 keys) and set adds
//! (`SADD` of random elements to random keys): pipelined (`-P 1000`, 4 clients) against
//! Tidemark's batches of 1,000, and unpipelined single ops with 1 and 16 clients against
//! single-op requests. Prints a table with the ratios. Without `redis-server` and
//! `redis-benchmark` on PATH it prints `skipped: redis-server not found` for that part.
//!
//! `cargo bench --bench http_throughput` (`BENCH_SECS=N` per workload, default 5).

use std::time::{Duration, Instant};
use tidemark::http::{HttpConfig, HttpServer};
use tidemark::{Node, NodeConfig};

#[path = "http_throughput/redis.rs"]
mod redis;
#[path = "support/redis_server.rs"]
mod redis_server;

/// Which op a workload repeats.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Counter increment by 1 over 100 keys (`INCRBY page:N 1`).
    Incr,
    /// Set add of a random element to a random key (`SADD members:N eM`).
    Sadd,
}

/// One row of the comparison.
#[derive(Clone, Copy, Debug)]
struct Workload {
    name: &'static str,
    op: Kind,
    /// 1,000 ops per request / `-P 1000`, else one op per request.
    batched: bool,
    clients: usize,
}

/// Random key and element range of the set adds (Redis: `-r`).
const SADD_RANGE: u64 = 1_000_000;

const WORKLOADS: [Workload; 6] = [
    Workload {
        name: "counter inc, batches of 1000",
        op: Kind::Incr,
        batched: true,
        clients: 4,
    },
    Workload {
        name: "set add, batches of 1000",
        op: Kind::Sadd,
        batched: true,
        clients: 4,
    },
    Workload {
        name: "counter inc, single op",
        op: Kind::Incr,
        batched: false,
        clients: 1,
    },
    Workload {
        name: "counter inc, single op",
        op: Kind::Incr,
        batched: false,
        clients: 16,
    },
    Workload {
        name: "set add, single op",
        op: Kind::Sadd,
        batched: false,
        clients: 1,
    },
    Workload {
        name: "set add, single op",
        op: Kind::Sadd,
        batched: false,
        clients: 16,
    },
];

/// A tiny deterministic generator for keys and elements.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

fn secs() -> u64 {
    std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

/// The answer's status, its body read to the end: ureq 3 puts a connection back in its pool
/// only then, so without it every request opened (and the server accepted) a new connection.
fn answered(mut r: ureq::http::Response<ureq::Body>) -> u16 {
    let _ = r.body_mut().read_to_vec();
    r.status().as_u16()
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
                .content_type("application/x-ndjson")
                .send(body.as_bytes())
                .map_or(0, answered)
        });
        println!(
            "ingest NDJSON (1000 events/request) | {clients} | {:.0} events/s | {:.1} | {:.1}",
            items as f64 / elapsed.as_secs_f64(),
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99)
        );
    }
    let redis = redis::Servers::start();
    let mut table = Vec::new();
    for w in WORKLOADS {
        let url = format!("{base}/v1/ops");
        let per_request = if w.batched { 1000 } else { 1 };
        let (items, mut lat, elapsed) = drive(w.clients, per_request, move |a, c, i| {
            let mut rng = Lcg(((c as u64) << 40) ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 1);
            let mut body = String::with_capacity(per_request as usize * 80);
            for _ in 0..per_request {
                match w.op {
                    Kind::Incr => body.push_str(&format!(
                        "{{\"type\":\"gcounter\",\"key\":\"page-{}\",\"op\":\"inc\",\"by\":1}}\n",
                        rng.below(100)
                    )),
                    Kind::Sadd => body.push_str(&format!(
                        "{{\"type\":\"orset\",\"key\":\"members-{}\",\"op\":\"add\",\"value\":\"e{}\"}}\n",
                        rng.below(SADD_RANGE),
                        rng.below(SADD_RANGE)
                    )),
                }
            }
            a.post(&url)
                .content_type("application/x-ndjson")
                .send(body.as_bytes())
                .map_or(0, answered)
        });
        let rate = items as f64 / elapsed.as_secs_f64();
        println!(
            "{} (POST /v1/ops) | {} | {rate:.0} ops/s | {:.2} | {:.2}",
            w.name,
            w.clients,
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99)
        );
        let (always, everysec) = redis.as_ref().map_or((None, None), |r| r.measure(w));
        table.push((w, rate, always, everysec));
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
    drop(redis);
    if table.iter().any(|r| r.2.is_some()) {
        redis::table(&table);
    }
}
