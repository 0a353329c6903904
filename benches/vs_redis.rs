//! The Redis anchor: Tidemark's durable ingest against `redis-server` with
//! `appendonly yes` + `appendfsync always` (it fsyncs once per event-loop pass, so, like
//! Tidemark, it group-commits before it replies), on the same machine, in the same run.
//!
//! `cargo bench --bench vs_redis` starts `redis-server` itself on a free local port in a temp
//! directory (and stops it at the end), runs `redis-benchmark -P 1000 -r 10000` for INCR, SADD
//! and SET with 1 and 8 clients and with 64 unpipelined clients, then Tidemark's durable
//! `Node::ingest` on the same key spread (calls of 1,000 events from 1 and 8 writers; 64
//! concurrent single-event writers and 1 single-event writer), and prints the ratios as a
//! Markdown table. When `redis-server` or `redis-benchmark` is not on `PATH` it prints
//! `skipped: redis-server not found` and exits 0.
//!
//! Key spread (as `redis-benchmark -r 10000` draws it): INCR `counter:<r>` ↔ gcounter inc on
//! `c<r>`; SET `key:<r>` ↔ lww set on `r<r>`; SADD adds `element:<r>` to the ONE key `myset` ↔
//! orset add of `e<r>` to the one key `myset`; `r` uniform in `0..10,000` (seeded). A second
//! set line spreads the adds over 10,000 set keys with distinct elements (the shape of
//! `benches/ingest.rs`).
//!
//! Every Tidemark call returns only after its group commit is durable (`Durability::Immediate`,
//! the default). Environment: `BENCH_SECS` (seconds per Tidemark run, default 2),
//! `BENCH_REDIS_N` (requests per pipelined redis-benchmark run, default 1,000,000; the
//! unpipelined runs use a fifth), `BENCH_ONLY` (comma-separated subset of
//! `incr,sadd,sadd-spread,set,single,relaxed`).
//!
//! The `relaxed` rows compare `Durability::Relaxed` (acknowledged before the fsync, made
//! durable within `relaxed_sync_interval`) with a second `redis-server` running
//! `appendfsync everysec`, on the same pipelined workloads.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tidemark::{Durability, Event, Node, NodeConfig, Op};

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::RedisServer;

const STREAM: &str = "bench";
const BATCH: usize = 1_000;
const SPREAD: u64 = 10_000;
const WRITER_THREAD: &str = "tidemark-writer";

/// SplitMix64: a seeded, reproducible draw of the key numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Incr,
    Sadd,
    SaddSpread,
    Set,
}

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Workload::Incr => "counters (gcounter inc) vs INCR",
            Workload::Sadd => "set adds, one key `myset` (orset add) vs SADD",
            Workload::SaddSpread => "set adds over 10,000 keys vs SADD",
            Workload::Set => "LWW writes (lww set) vs SET",
        }
    }

    fn redis_test(self) -> &'static str {
        match self {
            Workload::Incr => "incr",
            Workload::Sadd | Workload::SaddSpread => "sadd",
            Workload::Set => "set",
        }
    }

    fn only_name(self) -> &'static str {
        match self {
            Workload::Incr => "incr",
            Workload::Sadd => "sadd",
            Workload::SaddSpread => "sadd-spread",
            Workload::Set => "set",
        }
    }

    /// Op number `u` of a writer drawing from `rng`.
    fn op(self, rng: &mut Rng, u: u64) -> Op {
        let r = rng.next() % SPREAD;
        match self {
            Workload::Incr => Op::inc_gcounter(&format!("c{r}"), 1),
            Workload::Sadd => Op::add("myset", format!("e{r}")),
            Workload::SaddSpread => Op::add(&format!("s{r}"), format!("e{u}")),
            Workload::Set => Op::set_lww(&format!("r{r}"), u),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CPU accounting (Linux; `None` elsewhere).

/// On-CPU time of this process's thread named `name`, from its `schedstat`.
fn thread_cpu(name: &str) -> Option<Duration> {
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = entry.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let stat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
            let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
            return Some(Duration::from_nanos(ns));
        }
    }
    None
}

/// User + system CPU time of process `pid` (all its threads), from `/proc/<pid>/stat`.
fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_millis((utime + stime) * 10))
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

fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn us(d: Option<Duration>, n: f64) -> String {
    d.map_or_else(
        || "-".into(),
        |d| format!("{:.2}", d.as_secs_f64() * 1e6 / n.max(1.0)),
    )
}

// ---------------------------------------------------------------------------------------------
// Redis.

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

struct Redis {
    server: RedisServer,
    benchmark: PathBuf,
}

impl Redis {
    /// Starts a server with `appendfsync <fsync>` (`always` or `everysec`).
    fn start(server: &Path, benchmark: PathBuf, fsync: &str) -> Result<Self, String> {
        Ok(Redis {
            server: RedisServer::start(server, fsync, None)?,
            benchmark,
        })
    }

    /// Runs one redis-benchmark test; returns `(requests/s, server CPU during the run)`.
    fn bench(
        &self,
        test: &str,
        clients: usize,
        pipeline: usize,
        n: u64,
    ) -> Result<(f64, Option<Duration>), String> {
        let cpu0 = process_cpu(self.server.pid());
        let out = Command::new(&self.benchmark)
            .args(["-h", "127.0.0.1", "-p", &self.server.port().to_string()])
            .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
            .args(["-r", &SPREAD.to_string(), "-n", &n.to_string()])
            .args(["-t", test, "--csv"])
            .output()
            .map_err(|e| format!("redis-benchmark: {e}"))?;
        let cpu = process_cpu(self.server.pid())
            .zip(cpu0)
            .map(|(b, a)| b.saturating_sub(a));
        let text = String::from_utf8_lossy(&out.stdout);
        // CSV: a header line, then `"INCR","641025.62",...`.
        let rps = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split(',').map(|c| c.trim_matches('"'));
                let name = f.next()?;
                let rps: f64 = f.next()?.parse().ok()?;
                name.eq_ignore_ascii_case(test).then_some(rps)
            })
            .next()
            .ok_or_else(|| format!("no {test} figure in redis-benchmark output: {text}"))?;
        Ok((rps, cpu))
    }
}

// ---------------------------------------------------------------------------------------------
// Tidemark.

struct Run {
    events_per_s: f64,
    writer_us_per_event: String,
    errors: u64,
}

/// `writers` closed-loop tasks, each sending `ingest` calls of `per_call` events (source
/// `w<writer>`, contiguous seqs) until the deadline; every call is acknowledged with
/// `durability` (durable with `Immediate`).
async fn tidemark(
    kind: Workload,
    writers: usize,
    per_call: usize,
    secs: f64,
    durability: Durability,
) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = NodeConfig::new(dir.path());
    cfg.durability = durability;
    let node = Node::open(cfg).await.expect("open node");
    // Let the writer thread name itself before sampling its CPU time.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cpu0 = thread_cpu(WRITER_THREAD);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::with_capacity(writers);
    for w in 0..writers {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x5EED_0000 + w as u64);
            let (mut seq, mut errors) = (0u64, 0u64);
            let source = format!("w{w}");
            while Instant::now() < deadline {
                let evs: Vec<Event> = (0..per_call as u64)
                    .map(|i| {
                        let s = seq + i;
                        Event {
                            source: source.clone(),
                            seq: s,
                            ops: vec![kind.op(&mut rng, s * writers as u64 + w as u64)],
                            ..Default::default()
                        }
                    })
                    .collect();
                match node.ingest(STREAM, evs).await {
                    Ok(_) => seq += per_call as u64,
                    Err(e) => {
                        errors += 1;
                        if errors == 1 {
                            eprintln!("writer {w}: {e}");
                        }
                        tokio::task::yield_now().await;
                    }
                }
            }
            (seq, errors)
        }));
    }
    let (mut events, mut errors) = (0u64, 0u64);
    for t in tasks {
        let (n, e) = t.await.expect("writer task");
        events += n;
        errors += e;
    }
    let elapsed = start.elapsed();
    let cpu = thread_cpu(WRITER_THREAD)
        .zip(cpu0)
        .map(|(b, a)| b.saturating_sub(a));
    let m = node.metrics();
    node.shutdown().await.expect("shutdown");
    Run {
        events_per_s: events as f64 / elapsed.as_secs_f64(),
        // Group commit at work: the mean number of events a durable commit carried.
        writer_us_per_event: format!(
            "{} ({} ev/commit, {:.0} % of commits inline)",
            us(cpu, events as f64),
            thousands(m.commit_groups_ops as f64 / m.commits.max(1) as f64),
            100.0 * m.commits_inline as f64 / m.commits.max(1) as f64
        ),
        errors,
    }
}

/// One redis-benchmark figure: how it ran, requests/s, server CPU, requests.
struct RedisFig<'a> {
    how: &'a str,
    rps: f64,
    cpu: Option<Duration>,
    n: u64,
}

fn row(what: &str, redis: &RedisFig<'_>, tm: &str, run: &Run, goal: f64) {
    let ratio = run.events_per_s / redis.rps.max(1.0);
    println!(
        "| {what} | {} | {} | {} | {tm} | {} | {} | **{ratio:.2}×** | ≥ {goal}× | {} |",
        redis.how,
        thousands(redis.rps),
        us(redis.cpu, redis.n as f64),
        thousands(run.events_per_s),
        run.writer_us_per_event,
        if ratio >= goal { "met" } else { "missed" },
    );
    if run.errors > 0 {
        println!(
            "\n**{} Tidemark calls failed in the run above.**\n",
            run.errors
        );
    }
    let _ = std::io::stdout().flush();
}

fn main() {
    let (Some(server), Some(benchmark)) = (on_path("redis-server"), on_path("redis-benchmark"))
    else {
        println!("skipped: redis-server not found");
        return;
    };
    let secs = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .unwrap_or(2.0);
    let redis_n = std::env::var("BENCH_REDIS_N")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| *v > 0)
        .unwrap_or(1_000_000);
    let only: Option<Vec<String>> = std::env::var("BENCH_ONLY")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect());
    let wants = |p: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == p));
    let version = Command::new(&server)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let redis = match Redis::start(&server, benchmark.clone(), "always") {
        Ok(r) => r,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!(
        "# Tidemark durable ingest vs Redis\n\n{version}; `appendonly yes`, `appendfsync always`; \
         redis-benchmark `-r {SPREAD}`, {} requests per pipelined run. Tidemark: `Node::ingest`, \
         durable, BENCH_SECS={secs} per run, {} CPUs. At start: {}.\n",
        thousands(redis_n as f64),
        std::thread::available_parallelism().map_or(0, usize::from),
        machine_load()
    );
    println!(
        "| workload | Redis | Redis ops/s | Redis server CPU µs/op | Tidemark | Tidemark events/s | writer CPU µs/event (events per commit) | ratio | goal | verdict |"
    );
    println!("|---|---|---:|---:|---|---:|---:|---:|---:|---|");
    let wall = Instant::now();
    for kind in [
        Workload::Incr,
        Workload::Sadd,
        Workload::SaddSpread,
        Workload::Set,
    ] {
        if !wants(kind.only_name()) {
            continue;
        }
        for clients in [1usize, 8] {
            pipelined_row(
                &rt,
                &redis,
                kind,
                clients,
                secs,
                redis_n,
                Durability::Immediate,
            );
        }
    }
    if wants("single") {
        let n = (redis_n / 5).max(1);
        match redis.bench("incr", 64, 1, n) {
            Ok((rps, cpu)) => {
                let one = rt.block_on(tidemark(Workload::Incr, 1, 1, secs, Durability::Immediate));
                let many =
                    rt.block_on(tidemark(Workload::Incr, 64, 1, secs, Durability::Immediate));
                let fig = RedisFig {
                    how: "64 clients, unpipelined",
                    rps,
                    cpu,
                    n,
                };
                row(
                    "single-event counters vs INCR",
                    &fig,
                    "64 writers, 1 event per call",
                    &many,
                    1.0,
                );
                row(
                    "single-event counters vs INCR",
                    &fig,
                    "1 writer, 1 event per call",
                    &one,
                    0.0,
                );
                let scale = many.events_per_s / one.events_per_s.max(1.0);
                println!(
                    "\n64 single-event writers / 1 single-event writer: **{scale:.1}×** (goal ≥ 20×: {}).",
                    if scale >= 20.0 { "met" } else { "missed" }
                );
            }
            Err(e) => println!("\nsingle-event runs: redis-benchmark error: {e}"),
        }
    }
    if wants("relaxed") {
        relaxed_rows(&rt, &server, &benchmark, secs, redis_n);
    }
    println!(
        "\nTotal wall time {:.1} s. At the end: {}.",
        wall.elapsed().as_secs_f64(),
        machine_load()
    );
}

/// The pipelined workloads again: `Durability::Relaxed` against a second Redis with
/// `appendfsync everysec` (goal ≥ 1.0×).
fn relaxed_rows(
    rt: &tokio::runtime::Runtime,
    server: &Path,
    benchmark: &Path,
    secs: f64,
    redis_n: u64,
) {
    let redis = match Redis::start(server, benchmark.to_path_buf(), "everysec") {
        Ok(r) => r,
        Err(e) => {
            println!("\nrelaxed rows skipped: {e}");
            return;
        }
    };
    println!(
        "\nRelaxed durability (`Durability::Relaxed`, the default 100 ms sync interval) vs \
         Redis `appendfsync everysec`:\n"
    );
    println!(
        "| workload | Redis | Redis ops/s | Redis server CPU µs/op | Tidemark | Tidemark events/s | writer CPU µs/event (events per commit) | ratio | goal | verdict |"
    );
    println!("|---|---|---:|---:|---|---:|---:|---:|---:|---|");
    for kind in [
        Workload::Incr,
        Workload::Sadd,
        Workload::SaddSpread,
        Workload::Set,
    ] {
        for clients in [1usize, 8] {
            pipelined_row(
                rt,
                &redis,
                kind,
                clients,
                secs,
                redis_n,
                Durability::Relaxed,
            );
        }
    }
}

/// One pipelined row: `redis` with `clients` clients at `-P BATCH` against Tidemark with as
/// many writers in calls of `BATCH` at `durability` (goal ≥ 1.0×).
fn pipelined_row(
    rt: &tokio::runtime::Runtime,
    redis: &Redis,
    kind: Workload,
    clients: usize,
    secs: f64,
    redis_n: u64,
    durability: Durability,
) {
    let (rps, cpu) = match redis.bench(kind.redis_test(), clients, BATCH, redis_n) {
        Ok(r) => r,
        Err(e) => {
            println!("| {} | error: {e} |", kind.label());
            return;
        }
    };
    let run = rt.block_on(tidemark(kind, clients, BATCH, secs, durability));
    let relaxed = durability == Durability::Relaxed;
    let how = format!(
        "{clients} client(s), -P {BATCH}{}",
        if relaxed { ", everysec" } else { "" }
    );
    let fig = RedisFig {
        how: &how,
        rps,
        cpu,
        n: redis_n,
    };
    row(
        kind.label(),
        &fig,
        &format!(
            "{clients} writer(s), calls of {BATCH}{}",
            if relaxed { ", relaxed" } else { "" }
        ),
        &run,
        1.0,
    );
}
