//! Durable-ingest benchmarks: throughput and acknowledgement latency of `Node::ingest`
//! and `Node::apply_batch` through the group-commit writer, against the machine's own fsync.
//!
//! `cargo bench --bench ingest` runs, in one process, each run on a fresh temp directory:
//!
//! - (0) the raw fsync latency of this disk (4 KiB write + `sync_data`, 200 times), the
//!   baseline;
//! - (a) batches of 1,000 events (`ingest`) or ops (`apply_batch`) from 1 and 8 writers, for
//!   counter (`gcounter` inc), set (`orset` add of distinct elements) and register (`lww` set)
//!   ops: events/s and p50/p99 ack latency per batch;
//! - (b) single-event `ingest` calls from 1, 16 and 64 writers (tokio tasks);
//! - (c) (a) and (b) again with `Durability::Relaxed` (no fsync), the upper bound;
//! - (d) open-loop single-event load at about half of the peak of (b): p99 ack vs fsync p99;
//! - (e) bytes on disk per key (N distinct keys, then file and table sizes / N) for each type;
//! - (f) the cost of adding one element to a set of `BENCH_BIG_SET` elements against adding
//!   one to an empty set: writer CPU and bytes written (`pwrite`d, from `/proc/self/io`) per
//!   durable commit of one add. The default is 10,000, not the 1,000,000: while a set
//!   is one row, filling it costs O(N²) (every add clones, diffs and rewrites the whole set),
//!   about 3 minutes for 10,000 elements on the reference machine.
//!
//! Every run also reports the node's group-commit figures (`Node::metrics`) and, on Linux, the
//! writer thread's CPU time and the time our threads spent runnable but waiting for a CPU
//! (`/proc/self/task/*/schedstat`), which shows contention from anything else on the machine.
//!
//! Environment: `BENCH_SECS` (seconds per run, default 2), `BENCH_KEYS` (distinct keys written
//! in (e), default 100,000), `BENCH_KEYSPACE` (keys the ops of (a)-(d) cycle over, default
//! 10,000), `BENCH_ONLY` (comma-separated subset of `0,a,b,c,d,e`), `BENCH_KINDS`
//! (comma-separated subset of `counter,set,register` for (a), (c) and (e)), `BENCH_WRITERS`
//! (comma-separated subset of the writer counts of (a)-(c), for profiling).
//! Output: Markdown on stdout.

use std::io::Write as _;
use std::time::{Duration, Instant};
use tidemark::metrics::MetricsSnapshot;
use tidemark::{Durability, Event, Node, NodeConfig, Op};

const STREAM: &str = "bench";
const BATCH: usize = 1_000;
const WRITER_THREAD: &str = "tidemark-writer";

#[derive(Clone, Debug)]
struct Settings {
    secs: f64,
    keys: u64,
    keyspace: u64,
    only: Option<Vec<String>>,
    kinds: Vec<Kind>,
    writers: Option<Vec<usize>>,
    big_set: u64,
}

impl Settings {
    fn from_env() -> Self {
        let num = |name: &str, default: f64| -> f64 {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| *v > 0.0)
                .unwrap_or(default)
        };
        Self {
            secs: num("BENCH_SECS", 2.0),
            keys: num("BENCH_KEYS", 100_000.0) as u64,
            keyspace: num("BENCH_KEYSPACE", 10_000.0) as u64,
            only: std::env::var("BENCH_ONLY")
                .ok()
                .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect()),
            kinds: std::env::var("BENCH_KINDS").ok().map_or_else(
                || Kind::ALL.to_vec(),
                |v| {
                    Kind::ALL
                        .into_iter()
                        .filter(|k| v.split(',').any(|p| k.label().starts_with(p.trim())))
                        .collect()
                },
            ),
            big_set: num("BENCH_BIG_SET", 10_000.0) as u64,
            writers: std::env::var("BENCH_WRITERS")
                .ok()
                .map(|v| v.split(',').filter_map(|w| w.trim().parse().ok()).collect()),
        }
    }

    fn wants_writers(&self, n: usize) -> bool {
        self.writers.as_ref().is_none_or(|w| w.contains(&n))
    }

    fn wants(&self, part: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|p| p == part))
    }

    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.secs)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Set,
    Register,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Counter, Kind::Set, Kind::Register];

    fn label(self) -> &'static str {
        match self {
            Kind::Counter => "counter (gcounter inc)",
            Kind::Set => "set (orset add)",
            Kind::Register => "register (lww set)",
        }
    }

    /// The op of write number `u` (unique within a run): keys cycle over `keyspace`; set
    /// elements are distinct.
    fn op(self, u: u64, keyspace: u64) -> Op {
        let k = u % keyspace;
        match self {
            Kind::Counter => Op::inc_gcounter(&format!("c{k}"), 1),
            Kind::Set => Op::add(&format!("s{k}"), format!("e{u}")),
            Kind::Register => Op::set_lww(&format!("r{k}"), u),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Ingest,
    ApplyBatch,
}

impl Api {
    fn label(self) -> &'static str {
        match self {
            Api::Ingest => "ingest",
            Api::ApplyBatch => "apply_batch",
        }
    }
}

fn durability_label(d: Durability) -> &'static str {
    match d {
        Durability::Immediate => "durable",
        Durability::Relaxed => "relaxed",
    }
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn thousands(n: f64) -> String {
    let s = (n.round() as u64).to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Scheduler figures (Linux).

/// `(on CPU, runnable but waiting for a CPU)` of one thread, from its `schedstat`.
fn schedstat(task_dir: &std::path::Path) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(task_dir.join("schedstat")).ok()?;
    let mut it = stat.split_whitespace();
    let cpu: u64 = it.next()?.parse().ok()?;
    let wait: u64 = it.next()?.parse().ok()?;
    Some((Duration::from_nanos(cpu), Duration::from_nanos(wait)))
}

/// The times of this process's thread named `name` (the node's writer).
fn thread_times(name: &str) -> Option<(Duration, Duration)> {
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = entry.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            return schedstat(&dir);
        }
    }
    None
}

/// Total time this process's live threads spent runnable but waiting for a CPU.
fn process_runq_wait() -> Option<Duration> {
    let mut total = Duration::ZERO;
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        if let Some((_, wait)) = schedstat(&entry.ok()?.path()) {
            total += wait;
        }
    }
    Some(total)
}

/// The 1-minute load average and the CPU pressure (share of the last 60 s in which some
/// runnable task waited for a CPU).
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

/// Scheduler figures of one run.
#[derive(Clone, Copy, Default)]
struct Sched {
    writer_cpu: Option<Duration>,
    writer_wait: Option<Duration>,
    process_wait: Option<Duration>,
}

struct SchedStart {
    writer: Option<(Duration, Duration)>,
    process_wait: Option<Duration>,
}

impl SchedStart {
    /// Call right after opening the node: waits up to 100 ms for the freshly spawned writer
    /// thread to name itself.
    fn now() -> Self {
        let mut writer = None;
        for _ in 0..100 {
            writer = thread_times(WRITER_THREAD);
            if writer.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Self {
            writer,
            process_wait: process_runq_wait(),
        }
    }

    /// Call before shutting the node down (while its writer thread lives).
    fn end(&self) -> Sched {
        let w = thread_times(WRITER_THREAD).zip(self.writer);
        Sched {
            writer_cpu: w.map(|((c1, _), (c0, _))| c1.saturating_sub(c0)),
            writer_wait: w.map(|((_, w1), (_, w0))| w1.saturating_sub(w0)),
            process_wait: process_runq_wait()
                .zip(self.process_wait)
                .map(|(b, a)| b.saturating_sub(a)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Runs.

/// One measured run.
struct RunResult {
    label: &'static str,
    kind: Kind,
    api: Api,
    /// Concurrent writers; 0 for the open-loop run.
    writers: usize,
    per_call: usize,
    durability: Durability,
    events: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    errors: u64,
    metrics: MetricsSnapshot,
    sched: Sched,
}

impl RunResult {
    fn rate(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }
    fn p(&self, p: f64) -> Duration {
        pct(&self.latencies, p)
    }
    fn per_commit(&self, total: u64) -> f64 {
        if self.metrics.commits == 0 {
            0.0
        } else {
            total as f64 / self.metrics.commits as f64
        }
    }
    fn share(&self, d: Option<Duration>) -> String {
        d.map_or_else(
            || "-".into(),
            |d| {
                format!(
                    "{:.0}%",
                    100.0 * d.as_secs_f64() / self.elapsed.as_secs_f64()
                )
            },
        )
    }
    fn writer_us_per_event(&self) -> String {
        match self.sched.writer_cpu {
            Some(c) if self.events > 0 => {
                format!("{:.2}", c.as_secs_f64() * 1e6 / self.events as f64)
            }
            _ => "-".into(),
        }
    }
}

fn table_header() {
    println!(
        "| run | ops | api | writers | events/call | durability | events/s | p50 ack ms | p99 ack ms | commits/s | writes/commit | max group | commit ms (mean) | writer CPU µs/event | writer on CPU | writer waiting for CPU | all threads waiting for CPU |"
    );
    println!("|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

fn table_row(r: &RunResult) {
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.1} | {} | {:.2} | {} | {} | {} | {} |",
        r.label,
        r.kind.label(),
        r.api.label(),
        if r.writers == 0 {
            "open loop".to_owned()
        } else {
            r.writers.to_string()
        },
        r.per_call,
        durability_label(r.durability),
        thousands(r.rate()),
        ms(r.p(50.0)),
        ms(r.p(99.0)),
        r.metrics.commits as f64 / r.elapsed.as_secs_f64(),
        r.per_commit(r.metrics.commit_groups_ops),
        r.metrics.commit_group_max,
        r.per_commit(r.metrics.commit_latency_us_sum) / 1e3,
        r.writer_us_per_event(),
        r.share(r.sched.writer_cpu),
        r.share(r.sched.writer_wait),
        r.share(r.sched.process_wait),
    );
    if r.errors > 0 {
        println!("\n**{} calls failed in the run above.**\n", r.errors);
    }
    let _ = std::io::stdout().flush();
}

async fn open_node(dir: &std::path::Path, durability: Durability) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.durability = durability;
    Node::open(cfg).await.expect("open node")
}

/// The events of one call of writer `w` from its sequence number `seq`: source `w{w}`,
/// contiguous seqs (so each source's dedup marks stay one interval).
fn events(kind: Kind, w: usize, writers: usize, seq: u64, n: usize, keyspace: u64) -> Vec<Event> {
    let source = format!("w{w}");
    (0..n as u64)
        .map(|i| {
            let s = seq + i;
            Event {
                source: source.clone(),
                seq: s,
                ops: vec![kind.op(s * writers as u64 + w as u64, keyspace)],
                ..Default::default()
            }
        })
        .collect()
}

fn ops(kind: Kind, w: usize, writers: usize, seq: u64, n: usize, keyspace: u64) -> Vec<Op> {
    (0..n as u64)
        .map(|i| kind.op((seq + i) * writers as u64 + w as u64, keyspace))
        .collect()
}

/// What a closed-loop run measures.
#[derive(Clone, Copy)]
struct Closed {
    label: &'static str,
    kind: Kind,
    api: Api,
    writers: usize,
    per_call: usize,
    durability: Durability,
}

/// Closed-loop writers (tokio tasks): each sends calls of `per_call` events back to back
/// until the deadline. Latency is measured around the call (the batch is built before).
async fn closed_loop(c: Closed, s: &Settings) -> RunResult {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open_node(dir.path(), c.durability).await;
    let keyspace = s.keyspace;
    let sched0 = SchedStart::now();
    let start = Instant::now();
    let deadline = start + s.duration();
    let mut tasks = Vec::with_capacity(c.writers);
    for w in 0..c.writers {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let mut seq = 0u64;
            let mut lat = Vec::new();
            let mut errors = 0u64;
            while Instant::now() < deadline {
                let r = match c.api {
                    Api::Ingest => {
                        let evs = events(c.kind, w, c.writers, seq, c.per_call, keyspace);
                        let t = Instant::now();
                        let r = node.ingest(STREAM, evs).await;
                        lat.push(t.elapsed());
                        r
                    }
                    Api::ApplyBatch => {
                        let batch = ops(c.kind, w, c.writers, seq, c.per_call, keyspace);
                        let t = Instant::now();
                        let r = node.apply_batch(batch).await;
                        lat.push(t.elapsed());
                        r
                    }
                };
                match r {
                    Ok(out) => {
                        assert_eq!(out.duplicates, 0, "unique (source, seq) never duplicates");
                        seq += c.per_call as u64;
                    }
                    Err(e) => {
                        errors += 1;
                        if errors == 1 {
                            eprintln!("{}: writer {w}: {e}", c.label);
                        }
                        tokio::task::yield_now().await;
                    }
                }
            }
            (seq, lat, errors)
        }));
    }
    let mut events_total = 0;
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (n, lat, e) = t.await.expect("writer task");
        events_total += n;
        latencies.extend(lat);
        errors += e;
    }
    let elapsed = start.elapsed();
    let metrics = node.metrics();
    let sched = sched0.end();
    node.shutdown().await.expect("shutdown");
    latencies.sort();
    RunResult {
        label: c.label,
        kind: c.kind,
        api: c.api,
        writers: c.writers,
        per_call: c.per_call,
        durability: c.durability,
        events: events_total,
        elapsed,
        latencies,
        errors,
        metrics,
        sched,
    }
}

/// Open-loop single-event `ingest` calls at `rate` events/s: every millisecond the calls due
/// are started, each in its own task (as a server handling independent requests would), so a
/// slow commit does not slow the arrivals down. Counter incs over the keyspace, 64 sources.
async fn open_loop(label: &'static str, rate: f64, s: &Settings) -> RunResult {
    const SOURCES: u64 = 64;
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open_node(dir.path(), Durability::Immediate).await;
    let keyspace = s.keyspace;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Duration, bool)>();
    let sched0 = SchedStart::now();
    let start = Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while start.elapsed() < s.duration() {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        while sent < due {
            let node = node.clone();
            let tx = tx.clone();
            let k = sent;
            tokio::spawn(async move {
                let ev = Event {
                    source: format!("g{}", k % SOURCES),
                    seq: k / SOURCES,
                    ops: vec![Kind::Counter.op(k, keyspace)],
                    ..Default::default()
                };
                let t = Instant::now();
                let r = node.ingest(STREAM, vec![ev]).await;
                let _ = tx.send((t.elapsed(), r.is_ok()));
            });
            sent += 1;
        }
    }
    drop(tx);
    let mut latencies = Vec::with_capacity(usize::try_from(sent).unwrap_or(0));
    let mut errors = 0;
    while let Some((d, ok)) = rx.recv().await {
        if ok {
            latencies.push(d);
        } else {
            errors += 1;
        }
    }
    let elapsed = start.elapsed();
    let metrics = node.metrics();
    let sched = sched0.end();
    node.shutdown().await.expect("shutdown");
    latencies.sort();
    RunResult {
        label,
        kind: Kind::Counter,
        api: Api::Ingest,
        writers: 0,
        per_call: 1,
        durability: Durability::Immediate,
        events: latencies.len() as u64,
        elapsed,
        latencies,
        errors,
        metrics,
        sched,
    }
}

/// Raw fsync latencies (sorted) and the calling thread's scheduler times over the loop.
struct Fsync {
    lat: Vec<Duration>,
    sched: Option<(Duration, Duration)>,
}

/// Raw fsync latency: `bytes` written then `sync_data`, `n` times, either overwriting the
/// start of the file in place or appending.
fn fsync_latency(n: usize, bytes: usize, in_place: bool) -> Fsync {
    use std::io::{Seek, SeekFrom};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut f = std::fs::File::create(dir.path().join("fsync.bin")).expect("create");
    let buf = vec![0xA5u8; bytes];
    f.write_all(&buf).expect("write");
    f.sync_all().expect("sync");
    let mut out = Vec::with_capacity(n);
    let me = std::path::Path::new("/proc/thread-self");
    let before = schedstat(me);
    for _ in 0..n {
        if in_place {
            f.seek(SeekFrom::Start(0)).expect("seek");
        }
        let t = Instant::now();
        f.write_all(&buf).expect("write");
        f.sync_data().expect("sync_data");
        out.push(t.elapsed());
    }
    let sched = schedstat(me)
        .zip(before)
        .map(|((c1, w1), (c0, w0))| (c1.saturating_sub(c0), w1.saturating_sub(w0)));
    out.sort();
    Fsync { lat: out, sched }
}

// ---------------------------------------------------------------------------------------------
// Bytes on disk.

/// Bytes of one redb table: leaf payload (keys + values), B-tree metadata, and fragmentation.
#[derive(Clone, Copy, Default)]
struct TableBytes {
    stored: u64,
    metadata: u64,
    fragmented: u64,
}

impl TableBytes {
    fn total(self) -> u64 {
        self.stored + self.metadata + self.fragmented
    }
}

/// Database file size and per-table bytes of a closed node's database.
struct DiskImage {
    file: u64,
    tables: Vec<(&'static str, TableBytes)>,
}

impl DiskImage {
    /// Reads the tables of `src/store/tables.rs` directly, read-only, after the node closed
    /// (a table that does not open shows as zero bytes).
    fn read(path: &std::path::Path) -> Self {
        use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
        let file = std::fs::metadata(path).expect("stat").len();
        let db = redb::Database::open(path).expect("open database");
        let txn = db.begin_read().expect("read transaction");
        let bytes = |st: redb::TableStats| TableBytes {
            stored: st.stored_bytes(),
            metadata: st.metadata_bytes(),
            fragmented: st.fragmented_bytes(),
        };
        let mut tables = Vec::new();
        for name in ["rows", "dots", "log", "dedup", "meta"] {
            let stats = match name {
                "log" => {
                    let def: TableDefinition<u64, &[u8]> = TableDefinition::new(name);
                    txn.open_table(def).ok().and_then(|t| t.stats().ok())
                }
                "meta" => {
                    let def: TableDefinition<&str, &[u8]> = TableDefinition::new(name);
                    txn.open_table(def).ok().and_then(|t| t.stats().ok())
                }
                _ => {
                    let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
                    txn.open_table(def).ok().and_then(|t| t.stats().ok())
                }
            };
            tables.push((name, stats.map(bytes).unwrap_or_default()));
        }
        DiskImage { file, tables }
    }

    fn total(&self) -> u64 {
        self.tables.iter().map(|(_, t)| t.total()).sum()
    }
}

struct DiskUse {
    kind: Kind,
    keys: u64,
    secs: f64,
    before: DiskImage,
    after: DiskImage,
}

/// Writes `keys` distinct keys of `kind` (one op each, batches of 1,000, durable, one writer)
/// and reads the closed database; then compacts the delta log and reads it again.
async fn disk_use(kind: Kind, keys: u64) -> DiskUse {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(tidemark::store::DB_FILE);
    let node = open_node(dir.path(), Durability::Immediate).await;
    let start = Instant::now();
    let mut u = 0;
    while u < keys {
        let n = (keys - u).min(BATCH as u64);
        let batch: Vec<Op> = (u..u + n).map(|i| kind.op(i, keys)).collect();
        node.apply_batch(batch).await.expect("apply_batch");
        u += n;
    }
    let secs = start.elapsed().as_secs_f64();
    node.shutdown().await.expect("shutdown");
    drop(node);
    let before = DiskImage::read(&path);
    let node = open_node(dir.path(), Durability::Immediate).await;
    node.compact(None).await.expect("compact");
    node.shutdown().await.expect("shutdown");
    drop(node);
    let after = DiskImage::read(&path);
    DiskUse {
        kind,
        keys,
        secs,
        before,
        after,
    }
}

// ---------------------------------------------------------------------------------------------
// (f) One add to a big set vs one add to an empty set.

/// Bytes this process passed to `write`-family syscalls so far (`wchar` of `/proc/self/io`).
fn bytes_written() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Per-commit cost of one durable add to a set of `size` elements.
struct SetAdd {
    size: u64,
    fill_secs: f64,
    commits: u64,
    writer_cpu_us: Option<f64>,
    bytes: Option<f64>,
    ack_ms: f64,
}

/// Fills set key `big` with `size` elements (calls of 10,000 adds, progress on stderr every
/// 100,000), then times 50 calls of one add each (each its own durable group commit).
async fn set_add_cost(size: u64) -> SetAdd {
    const ADDS: u64 = 50;
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open_node(dir.path(), Durability::Immediate).await;
    // Let the writer thread name itself before its CPU time is sampled.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fill = Instant::now();
    let mut u = 0;
    while u < size {
        let n = (size - u).min(10_000);
        let batch: Vec<Op> = (u..u + n)
            .map(|i| Op::add("big", format!("e{i}")))
            .collect();
        node.apply_batch(batch).await.expect("fill");
        u += n;
        if u % 100_000 == 0 {
            eprintln!(
                "(f) filled {} of {} elements in {:.1} s",
                thousands(u as f64),
                thousands(size as f64),
                fill.elapsed().as_secs_f64()
            );
        }
    }
    let fill_secs = fill.elapsed().as_secs_f64();
    let commits0 = node.metrics().commits;
    let cpu0 = thread_times(WRITER_THREAD);
    let io0 = bytes_written();
    let t = Instant::now();
    for i in 0..ADDS {
        node.apply_batch(vec![Op::add("big", format!("new{i}"))])
            .await
            .expect("add");
    }
    let ack = t.elapsed();
    let io = bytes_written().zip(io0).map(|(b, a)| b.saturating_sub(a));
    let cpu = thread_times(WRITER_THREAD)
        .zip(cpu0)
        .map(|((b, _), (a, _))| b.saturating_sub(a));
    let commits = node.metrics().commits - commits0;
    node.shutdown().await.expect("shutdown");
    let per = commits.max(1) as f64;
    SetAdd {
        size,
        fill_secs,
        commits,
        writer_cpu_us: cpu.map(|c| c.as_secs_f64() * 1e6 / per),
        bytes: io.map(|b| b as f64 / per),
        ack_ms: ack.as_secs_f64() * 1e3 / ADDS as f64,
    }
}

fn big_set_section(rt: &tokio::runtime::Runtime, size: u64) {
    let empty = rt.block_on(set_add_cost(0));
    let big = rt.block_on(set_add_cost(size));
    println!(
        "## (f) One add to a set of {} elements vs to an empty set\n",
        thousands(size as f64)
    );
    println!(
        "| set size | fill s | commits | writer CPU µs/commit | bytes written/commit | ack ms (mean) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let opt = |v: Option<f64>, d: usize| v.map_or_else(|| "-".into(), |v| format!("{v:.d$}"));
    for r in [&empty, &big] {
        println!(
            "| {} | {:.1} | {} | {} | {} | {:.2} |",
            thousands(r.size as f64),
            r.fill_secs,
            r.commits,
            opt(r.writer_cpu_us, 1),
            opt(r.bytes, 0),
            r.ack_ms
        );
    }
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b.max(1e-9));
    println!(
        "
big / empty: writer CPU **{}×**, bytes written **{}×**, ack latency **{:.1}×** (goal: CPU and bytes ≤ 2×).\n",
        opt(ratio(big.writer_cpu_us, empty.writer_cpu_us), 1),
        opt(ratio(big.bytes, empty.bytes), 1),
        big.ack_ms / empty.ack_ms.max(1e-9)
    );
}
// ---------------------------------------------------------------------------------------------

fn goal_row(name: &str, value: String, goal: &str, met: bool) {
    println!(
        "| {name} | {value} | {goal} | {} |",
        if met { "met" } else { "**missed**" }
    );
}

fn fsync_table(rows: &[(&str, &Fsync)]) {
    println!(
        "| variant | p50 ms | p99 ms | max ms | per call: on CPU ms | per call: waiting for CPU ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, f) in rows {
        let per = |d: Duration| ms(d / u32::try_from(f.lat.len().max(1)).unwrap_or(1));
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            ms(pct(&f.lat, 50.0)),
            ms(pct(&f.lat, 99.0)),
            ms(pct(&f.lat, 100.0)),
            f.sched.map_or_else(|| "-".into(), |(c, _)| per(c)),
            f.sched.map_or_else(|| "-".into(), |(_, w)| per(w)),
        );
    }
    println!();
}

fn main() {
    let s = Settings::from_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let wall = Instant::now();
    println!(
        "# Tidemark durable ingest\n\nBENCH_SECS={} per run, keyspace {} keys, {} CPUs, tokio multi-thread runtime with default workers. At start: {}.\n",
        s.secs,
        thousands(s.keyspace as f64),
        std::thread::available_parallelism().map_or(0, usize::from),
        machine_load(),
    );

    // (0) fsync baseline.
    let mut fsync_p99 = Duration::ZERO;
    if s.wants("0") {
        let in_place = fsync_latency(200, 4096, true);
        let append = fsync_latency(200, 4096, false);
        let commit_sized = fsync_latency(200, 64 * 1024, true);
        fsync_p99 = pct(&in_place.lat, 99.0);
        println!("## (0) Raw fsync (write + sync_data, 200 times each)\n");
        fsync_table(&[
            ("4 KiB overwritten in place (the baseline)", &in_place),
            ("4 KiB appended", &append),
            (
                "64 KiB overwritten in place (about one redb commit's pages)",
                &commit_sized,
            ),
        ]);
    }

    // (a) + (c): batches of 1,000.
    let mut batch_runs: Vec<RunResult> = Vec::new();
    let batch_modes: Vec<(&'static str, Durability)> =
        [("a", Durability::Immediate), ("c", Durability::Relaxed)]
            .into_iter()
            .filter(|(l, _)| s.wants(l))
            .collect();
    if !batch_modes.is_empty() {
        println!("## (a) durable / (c) relaxed: calls of {BATCH} events or ops\n");
        table_header();
        for &(label, durability) in &batch_modes {
            for &kind in &s.kinds {
                for api in [Api::Ingest, Api::ApplyBatch] {
                    for writers in [1, 8].into_iter().filter(|w| s.wants_writers(*w)) {
                        let c = Closed {
                            label,
                            kind,
                            api,
                            writers,
                            per_call: BATCH,
                            durability,
                        };
                        let r = rt.block_on(closed_loop(c, &s));
                        table_row(&r);
                        batch_runs.push(r);
                    }
                }
            }
        }
        println!();
    }

    // (b) + (c): single-event calls.
    let mut single_runs: Vec<RunResult> = Vec::new();
    let single_modes: Vec<(&'static str, Durability)> = [
        ("b", Durability::Immediate, s.wants("b") || s.wants("d")),
        ("c", Durability::Relaxed, s.wants("c")),
    ]
    .into_iter()
    .filter_map(|(l, d, w)| w.then_some((l, d)))
    .collect();
    if !single_modes.is_empty() {
        println!("## (b) durable / (c) relaxed: single-event ingest calls (counter inc)\n");
        table_header();
        for &(label, durability) in &single_modes {
            for writers in [1, 16, 64].into_iter().filter(|w| s.wants_writers(*w)) {
                let c = Closed {
                    label,
                    kind: Kind::Counter,
                    api: Api::Ingest,
                    writers,
                    per_call: 1,
                    durability,
                };
                let r = rt.block_on(closed_loop(c, &s));
                table_row(&r);
                single_runs.push(r);
            }
        }
        println!();
    }

    // (d): half of the durable single-event peak, open loop.
    let mut half_load: Option<(f64, RunResult, Fsync)> = None;
    let peak = single_runs
        .iter()
        .filter(|r| r.durability == Durability::Immediate)
        .map(RunResult::rate)
        .fold(0.0, f64::max);
    if s.wants("d") && peak > 0.0 {
        let target = peak / 2.0;
        println!(
            "## (d) Open-loop single-event ingest at half of the durable peak of (b): {} of {} events/s\n",
            thousands(target),
            thousands(peak)
        );
        let fsync_now = fsync_latency(200, 4096, true);
        let r = rt.block_on(open_loop("d", target, &s));
        table_header();
        table_row(&r);
        println!();
        println!("| ack latency | p50 ms | p99 ms | p99.9 ms | max ms | largest commit ms |");
        println!("|---|---:|---:|---:|---:|---:|");
        println!(
            "| open loop at {} events/s | {} | {} | {} | {} | {:.2} |",
            thousands(r.rate()),
            ms(r.p(50.0)),
            ms(r.p(99.0)),
            ms(r.p(99.9)),
            ms(r.p(100.0)),
            r.metrics.commit_latency_us_max as f64 / 1e3
        );
        println!();
        println!("Raw fsync re-measured just before this run:\n");
        fsync_table(&[("4 KiB overwritten in place", &fsync_now)]);
        half_load = Some((target, r, fsync_now));
    }

    // (e): bytes on disk per key.
    let mut disk = Vec::new();
    if s.wants("e") {
        println!(
            "## (e) Bytes on disk per key: {} distinct keys per type, one op each, calls of {BATCH}, durable\n",
            thousands(s.keys as f64)
        );
        println!(
            "File: the database file's size (redb grows it in steps). Tables: leaf payload (keys + values) + B-tree metadata + fragmentation, from redb's table stats read after the node closed.\n"
        );
        println!(
            "| type | write s | file B/key | rows | dots | log | dedup | meta | all tables B/key | after compacting the log: file B/key | all tables B/key |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for &kind in &s.kinds {
            let d = rt.block_on(disk_use(kind, s.keys));
            let per = |b: u64| b as f64 / d.keys as f64;
            let cols: Vec<String> = d
                .before
                .tables
                .iter()
                .map(|(_, t)| format!("{:.1}", per(t.total())))
                .collect();
            println!(
                "| {} | {:.2} | {:.1} | {} | {:.1} | {:.1} | {:.1} |",
                d.kind.label(),
                d.secs,
                per(d.before.file),
                cols.join(" | "),
                per(d.before.total()),
                per(d.after.file),
                per(d.after.total()),
            );
            disk.push(d);
        }
        println!();
        println!("Payload only (leaf bytes per key: table keys + values, before compaction):\n");
        println!("| type | rows | dots | log | dedup | meta |");
        println!("|---|---:|---:|---:|---:|---:|");
        for d in &disk {
            let cols: Vec<String> = d
                .before
                .tables
                .iter()
                .map(|(_, t)| format!("{:.1}", t.stored as f64 / d.keys as f64))
                .collect();
            println!("| {} | {} |", d.kind.label(), cols.join(" | "));
        }
        println!();
    }

    if s.wants("f") {
        big_set_section(&rt, s.big_set);
    }

    // Goals.
    println!("## Goals\n");
    println!("| goal | measured | target | |");
    println!("|---|---:|---|---|");
    for r in batch_runs
        .iter()
        .filter(|r| r.durability == Durability::Immediate)
    {
        goal_row(
            &format!(
                "(a) durable events/s: {} {}, {} writer(s)",
                r.kind.label(),
                r.api.label(),
                r.writers
            ),
            thousands(r.rate()),
            "≥ 200,000",
            r.rate() >= 200_000.0,
        );
    }
    for d in [Durability::Immediate, Durability::Relaxed] {
        let rate = |w: usize| {
            single_runs
                .iter()
                .find(|r| r.durability == d && r.writers == w)
                .map(RunResult::rate)
        };
        if let (Some(one), Some(many)) = (rate(1), rate(64)) {
            goal_row(
                &format!(
                    "(b) single-event throughput, 64 writers / 1 writer ({})",
                    durability_label(d)
                ),
                format!(
                    "{:.1}× ({} / {})",
                    many / one,
                    thousands(many),
                    thousands(one)
                ),
                "≥ 20×",
                many / one >= 20.0,
            );
        }
    }
    if let Some((target, r, fsync_now)) = &half_load {
        for (name, f) in [
            ("the baseline (0)", fsync_p99),
            ("re-measured before (d)", pct(&fsync_now.lat, 99.0)),
        ] {
            if f > Duration::ZERO {
                let ratio = r.p(99.0).as_secs_f64() / f.as_secs_f64();
                goal_row(
                    &format!(
                        "(d) p99 ack at {} events/s / fsync p99 of {name} ({} ms)",
                        thousands(*target),
                        ms(f)
                    ),
                    format!("{ratio:.1} ({} ms)", ms(r.p(99.0))),
                    "≤ 3",
                    ratio <= 3.0,
                );
            }
        }
    }
    println!(
        "\nTotal bench wall time: {:.1} s. At the end: {}.",
        wall.elapsed().as_secs_f64(),
        machine_load()
    );
}
