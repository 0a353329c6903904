//! Single-op tail: the disk's raw `fdatasync` beside a lone node's single-op acknowledgements,
//! in one run (issue 21, "Single-op tail").
//!
//! One node (durable, `Durability::Immediate`) with its HTTP server on loopback, in this
//! process; a temp directory holds its data and the probe file. Two phases:
//!
//! 1. **Open loop, 10 per second each, interleaved** (`BENCH_SECS`, default 30): every 100 ms
//!    - at +0 ms a raw probe: 4 KiB written at offset 0 of a file in the same temp directory,
//!      then `fdatasync` (`File::sync_data`);
//!    - at +20 ms one single-op `POST /v1/ops` (a counter increment) from a lean HTTP/1.1
//!      client (one `write` per request, read to `content-length`), at +40 ms the same from
//!      `ureq` (the figure of earlier runs): each on its own kept-alive connection, timed
//!      from the request to the 200 answer (given after the durable commit);
//!    - at +60 ms one `Node::apply` of the same op (the embedded path), timed to its ack;
//!    - at +80 ms, the anchor: one `INCR` to a `redis-server` with `appendfsync always` whose
//!      data directory is in the same temp directory (same disk), over a kept-alive
//!      connection from the same kind of lean client, timed to its reply (skipped when
//!      `redis-server` is not on `PATH`).
//!
//!    The slots never overlap (each finishes long before the next starts, unless the disk
//!    stalls), so the series see the same disk over the same minutes without queueing
//!    behind each other. Prints p50 / p99 / max of each and the goals: ack p50 ≤ raw p50 +
//!    0.3 ms, ack p99 ≤ raw p99 + 2 ms.
//! 2. **Closed loop, one client** (`BENCH_CLOSED_SECS`, default 5 per series): raw probes back
//!    to back, then single-op requests back to back (lean client, then ureq), then embedded
//!    single ops, then Redis
//!    `INCR`s: rate and p50/p99 of each, the HTTP rate against Corrosion's 793 single-row
//!    upserts/s from one client and against Redis's one-client rate (goal ≥ 0.8×).
//!
//! Then the node's own figures: commits (how many inline), the mean time inside a commit
//! (fsync included) and the mean group size.
//!
//! `cargo bench --bench single_op_tail` (`BENCH_SECS`, `BENCH_CLOSED_SECS`).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tidemark::http::{HttpConfig, HttpServer};
use tidemark::{Node, NodeConfig, Op};

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::RedisServer;

/// Corrosion's single-row upserts per second from one client (BENCHMARKS.md anchor).
const CORROSION_SINGLE_CLIENT: f64 = 793.0;

fn env_secs(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn machine_load() -> String {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "-".into());
    let pressure = std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|s| {
            s.lines().next().and_then(|l| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix("avg60=").map(str::to_owned))
            })
        })
        .unwrap_or_else(|| "-".into());
    format!("1-min load average {load}, CPU pressure (some, avg60) {pressure}%")
}

/// p50, p99 and max in milliseconds (nearest rank).
#[derive(Clone, Copy, Debug)]
struct Dist {
    n: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

fn dist(samples: &mut [Duration]) -> Dist {
    samples.sort_unstable();
    let at = |p: f64| {
        let i = ((samples.len() as f64 * p).ceil() as usize)
            .saturating_sub(1)
            .min(samples.len().saturating_sub(1));
        samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Dist {
        n: samples.len(),
        p50: at(0.50),
        p99: at(0.99),
        max: samples.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
    }
}

/// The raw probe: 4 KiB at offset 0, then `fdatasync`.
struct Probe {
    file: File,
    page: [u8; 4096],
}

impl Probe {
    fn create(path: &std::path::Path) -> std::io::Result<Self> {
        let mut file = File::create(path)?;
        let page = [7u8; 4096];
        file.write_all(&page)?;
        file.sync_all()?;
        Ok(Self { file, page })
    }

    fn once(&mut self) -> Duration {
        let t = Instant::now();
        let r = self
            .file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.write_all(&self.page))
            .and_then(|()| self.file.sync_data());
        assert!(r.is_ok(), "raw probe failed: {r:?}");
        t.elapsed()
    }
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

/// One single-op request; panics unless answered 200.
fn http_op(agent: &ureq::Agent, url: &str, i: u64) -> Duration {
    let body = format!(
        "{{\"type\":\"gcounter\",\"key\":\"page-{}\",\"op\":\"inc\",\"by\":1}}\n",
        i % 100
    );
    let t = Instant::now();
    let status = agent
        .post(url)
        .content_type("application/x-ndjson")
        .send(body.as_bytes())
        .map_or(0, answered);
    let d = t.elapsed();
    assert_eq!(status, 200, "single-op request failed");
    d
}

/// One embedded single op; panics on failure.
fn node_op(rt: &tokio::runtime::Runtime, node: &Node, i: u64) -> Duration {
    let op = Op::inc_gcounter(&format!("embedded-{}", i % 100), 1);
    let t = Instant::now();
    let r = rt.block_on(node.apply(op));
    let d = t.elapsed();
    assert!(r.is_ok(), "embedded op failed: {r:?}");
    d
}

fn row(name: &str, d: Dist) {
    println!(
        "{name:<36} | {:>5} | {:>8.3} | {:>8.3} | {:>8.3}",
        d.n, d.p50, d.p99, d.max
    );
}

/// A minimal HTTP/1.1 client on one kept-alive connection: each request is one `write`, the
/// answer is read to its `content-length`. What a lean client (curl, hyper) costs; the
/// Redis series uses the same kind of client.
struct RawHttp {
    stream: TcpStream,
    host: String,
    buf: Vec<u8>,
}

impl RawHttp {
    fn connect(addr: std::net::SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).expect("connect to the node's HTTP server");
        stream.set_nodelay(true).expect("nodelay");
        Self {
            stream,
            host: addr.to_string(),
            buf: Vec::with_capacity(512),
        }
    }

    /// One single-op `POST /v1/ops` (a counter increment), timed to its complete answer.
    fn op(&mut self, i: u64) -> Duration {
        let body = format!(
            "{{\"type\":\"gcounter\",\"key\":\"raw-{}\",\"op\":\"inc\",\"by\":1}}\n",
            i % 100
        );
        let req = format!(
            "POST /v1/ops HTTP/1.1\r\nhost: {}\r\ncontent-type: application/x-ndjson\r\ncontent-length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        let t = Instant::now();
        self.stream.write_all(req.as_bytes()).expect("http write");
        self.buf.clear();
        let mut chunk = [0u8; 512];
        let complete = loop {
            let n = self.stream.read(&mut chunk).expect("http read");
            assert!(n > 0, "the node closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
            let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if self.buf.len() >= end + 4 + len {
                break head;
            }
        };
        let took = t.elapsed();
        assert!(
            complete.starts_with("http/1.1 200"),
            "single-op request failed: {complete}"
        );
        took
    }
}

/// One kept-alive Redis connection: `INCR`, timed from the request to its reply.
struct RedisClient {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RedisClient {
    /// A Redis server (`appendfsync always`, data beside the node's) and one connection to
    /// it, or why there is none (no `redis-server` on `PATH`: the series is skipped).
    fn start(parent: &Path) -> Result<(RedisServer, Self), String> {
        let server = RedisServer::start(Path::new("redis-server"), "always", Some(parent))?;
        let stream = TcpStream::connect(("127.0.0.1", server.port()))
            .map_err(|e| format!("connect to redis-server: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("nodelay: {e}"))?;
        Ok((
            server,
            Self {
                stream,
                buf: Vec::with_capacity(64),
            },
        ))
    }

    /// One `INCR` of one of 100 keys; its reply (`:<n>\r\n`) comes after Redis's fsync.
    fn incr(&mut self, i: u64) -> Duration {
        let cmd = format!("INCR page-{}\r\n", i % 100);
        let t = Instant::now();
        self.stream.write_all(cmd.as_bytes()).expect("redis write");
        self.buf.clear();
        let mut chunk = [0u8; 64];
        while !self.buf.ends_with(b"\r\n") {
            let n = self.stream.read(&mut chunk).expect("redis read");
            assert!(n > 0, "redis-server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let took = t.elapsed();
        assert_eq!(
            self.buf.first(),
            Some(&b':'),
            "redis error reply: {:?}",
            self.buf
        );
        took
    }
}

fn goal(name: &str, ack: Dist, raw: Dist) {
    let d50 = ack.p50 - raw.p50;
    let d99 = ack.p99 - raw.p99;
    let yes = |b: bool| if b { "met" } else { "NOT met" };
    println!(
        "{name}: ack p50 - raw p50 = {d50:+.3} ms (goal <= +0.3: {}), ack p99 - raw p99 = {d99:+.3} ms (goal <= +2: {})",
        yes(d50 <= 0.3),
        yes(d99 <= 2.0)
    );
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (node, addr, stop) = rt.block_on(async {
        let node = Node::open(NodeConfig::new(dir.path().join("node")))
            .await
            .expect("open");
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
    let url = format!("http://{addr}/v1/ops");
    let agent = agent();
    let mut lean = RawHttp::connect(addr);
    let mut probe = Probe::create(&dir.path().join("fdatasync-probe")).expect("probe file");
    // The anchor: Redis with `appendfsync always`, its data on the same disk, one connection.
    let (_redis_server, mut redis) = match RedisClient::start(dir.path()) {
        Ok((server, client)) => (Some(server), Some(client)),
        Err(e) => {
            println!("Redis series skipped: {e} (install the Debian package redis-server)");
            (None, None)
        }
    };
    println!("before: {}", machine_load());

    // Warm-up: the connection, the first rows, the page cache.
    for i in 0..20 {
        http_op(&agent, &url, i);
        lean.op(i);
        node_op(&rt, &node, i);
        probe.once();
        if let Some(r) = redis.as_mut() {
            r.incr(i);
        }
    }

    // 1. Open loop, 10/s each, interleaved.
    let secs = env_secs("BENCH_SECS", 30);
    let (mut raw, mut http, mut embedded) = (Vec::new(), Vec::new(), Vec::new());
    let (mut lean_acks, mut redis_acks) = (Vec::new(), Vec::new());
    let start = Instant::now();
    let period = Duration::from_millis(100);
    let rounds = secs * 10;
    for r in 0..rounds {
        let base = start + period * u32::try_from(r).unwrap_or(u32::MAX);
        let wait_until = |at: Instant| {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
        };
        wait_until(base);
        raw.push(probe.once());
        wait_until(base + Duration::from_millis(20));
        lean_acks.push(lean.op(r));
        wait_until(base + Duration::from_millis(40));
        http.push(http_op(&agent, &url, r));
        wait_until(base + Duration::from_millis(60));
        embedded.push(node_op(&rt, &node, r));
        if let Some(client) = redis.as_mut() {
            wait_until(base + Duration::from_millis(80));
            redis_acks.push(client.incr(r));
        }
    }
    let m_open = node.metrics();
    let (raw_d, http_d, node_d) = (dist(&mut raw), dist(&mut http), dist(&mut embedded));
    let lean_d = dist(&mut lean_acks);
    println!("open loop, {secs} s, 10/s per series, interleaved (ms) | n | p50 | p99 | max");
    row("raw fdatasync (4 KiB pwrite + sync)", raw_d);
    row("HTTP single-op ack, lean client", lean_d);
    row("HTTP single-op ack, ureq client", http_d);
    row("embedded single-op ack (Node::apply)", node_d);
    let redis_d = (!redis_acks.is_empty()).then(|| dist(&mut redis_acks));
    if let Some(d) = redis_d {
        row("Redis INCR ack (appendfsync always)", d);
    }
    goal("HTTP (lean client)", lean_d, raw_d);
    goal("HTTP (ureq client)", http_d, raw_d);
    goal("embedded", node_d, raw_d);
    if let Some(d) = redis_d {
        // Not a goal of ours: what a server that fsyncs each write adds on this machine.
        println!(
            "Redis (anchor): ack p50 - raw p50 = {:+.3} ms, ack p99 - raw p99 = {:+.3} ms; HTTP (lean client) ack p50 - Redis ack p50 = {:+.3} ms",
            d.p50 - raw_d.p50,
            d.p99 - raw_d.p99,
            lean_d.p50 - d.p50
        );
    }
    println!(
        "node: {} commits ({} inline), mean time inside a commit {:.3} ms (fsync included), max {:.3} ms",
        m_open.commits,
        m_open.commits_inline,
        m_open.commit_latency_us_sum as f64 / m_open.commits.max(1) as f64 / 1e3,
        m_open.commit_latency_us_max as f64 / 1e3
    );

    // 2. Closed loop, one client.
    let closed = Duration::from_secs(env_secs("BENCH_CLOSED_SECS", 5));
    let closed_loop = |f: &mut dyn FnMut(u64) -> Duration| {
        let mut lat = Vec::new();
        let t = Instant::now();
        let mut i = 0u64;
        while t.elapsed() < closed {
            lat.push(f(i));
            i += 1;
        }
        let rate = lat.len() as f64 / t.elapsed().as_secs_f64();
        (rate, dist(&mut lat))
    };
    let before = node.metrics();
    let (raw_rate, raw_c) = closed_loop(&mut |_| probe.once());
    let (lean_rate, lean_c) = closed_loop(&mut |i| lean.op(i));
    let (http_rate, http_c) = closed_loop(&mut |i| http_op(&agent, &url, i));
    let mid = node.metrics();
    let (node_rate, node_c) = closed_loop(&mut |i| node_op(&rt, &node, i));
    let after = node.metrics();
    let redis_closed = redis
        .as_mut()
        .map(|client| closed_loop(&mut |i| client.incr(i)));
    println!(
        "closed loop, one client, {} s each | per s | p50 ms | p99 ms | writer ms/commit",
        closed.as_secs()
    );
    let commit_ms = |a: &tidemark::MetricsSnapshot, b: &tidemark::MetricsSnapshot| {
        (b.commit_latency_us_sum - a.commit_latency_us_sum) as f64
            / (b.commits - a.commits).max(1) as f64
            / 1e3
    };
    println!(
        "raw fdatasync | {raw_rate:.0} | {:.3} | {:.3} | -",
        raw_c.p50, raw_c.p99
    );
    println!(
        "HTTP single op, lean client | {lean_rate:.0} | {:.3} | {:.3} | {:.3}",
        lean_c.p50,
        lean_c.p99,
        commit_ms(&before, &mid)
    );
    println!(
        "HTTP single op, ureq client | {http_rate:.0} | {:.3} | {:.3} | (same)",
        http_c.p50, http_c.p99,
    );
    println!(
        "embedded single op | {node_rate:.0} | {:.3} | {:.3} | {:.3}",
        node_c.p50,
        node_c.p99,
        commit_ms(&mid, &after)
    );
    if let Some((rate, d)) = &redis_closed {
        println!(
            "Redis INCR (appendfsync always) | {rate:.0} | {:.3} | {:.3} | -",
            d.p50, d.p99
        );
    }
    println!(
        "HTTP single op, one client: lean {:.2}x / ureq {:.2}x raw fdatasync rate, {:.2}x / {:.2}x Corrosion's {CORROSION_SINGLE_CLIENT:.0}/s",
        lean_rate / raw_rate.max(1e-9),
        http_rate / raw_rate.max(1e-9),
        lean_rate / CORROSION_SINGLE_CLIENT,
        http_rate / CORROSION_SINGLE_CLIENT
    );
    if let Some((rate, _)) = &redis_closed {
        println!(
            "one client: HTTP lean {:.2}x / ureq {:.2}x, embedded {:.2}x Redis's single-op rate (goal for HTTP: >= 0.8x)",
            lean_rate / rate.max(1e-9),
            http_rate / rate.max(1e-9),
            node_rate / rate.max(1e-9)
        );
    }
    println!("after: {}", machine_load());

    let _ = stop.send(());
    rt.block_on(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = node.shutdown().await;
    });
}
