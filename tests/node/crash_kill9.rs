//! Crash safety with real processes (docs/design/principles.md, "Testing goals" and "Pitfalls": dot
//! before durable, restored copy keeps its id, replay double counts, bookkeeping equals disk,
//! acknowledged before durable, two processes on one directory).
//!
//! The test re-executes its own binary as a child (`child_ingest_until_killed`, selected with
//! `--exact` and `TIDEMARK_CHILD_DIR`) that opens a `Node` on a data directory and ingests at
//! full speed from several tasks: batches of 1–50 events, each with a unique `(source, seq)`,
//! incrementing the gcounter `events` and adding its id to an orset of its cycle and task. The
//! child prints `SEND` before each call and `ACK <own max seq> <ids>` only after `ingest`
//! returned `Ok` (flushed per line); it also re-sends acknowledged batches and checks they are
//! all duplicates, and compacts the log now and then (every 30–150 ms). The parent SIGKILLs it
//! at a random moment (0.05–0.6 s: the store, and with it every later check, grows with the run
//! time) and checks the crashed directory — on a copy, so the next child recovers the real
//! crash image — before restarting a child on the same directory:
//!
//! - redb's integrity check and the store's `verify()` pass on the crash image;
//! - the replica id is unchanged and its own max seq is ≥ every one the child reported and
//!   every one seen before (no dot reuse), and the next write's dot is exactly one above it;
//! - every acknowledged event is present exactly once: each acked id is in its orset, the
//!   orsets hold only ids that were sent, the gcounter equals the number of distinct applied
//!   events (acked ones included, ≥ the acked count), and re-sending every acked event yields
//!   only duplicates (`duplicates` metric = events re-sent), so nothing is counted twice;
//! - earlier cycles' sets never change (checked every 10th cycle and at the end, when the
//!   last crash image is recovered in place and every acked event is re-sent).
//!
//! The parent also reports the recovery time (opening the crash image) and the store size.
//! `relaxed_mode_loses_at_most_its_sync_interval` runs the same child in
//! `Durability::Relaxed` and checks that a kill loses nothing acknowledged more than
//! `relaxed_sync_interval` + 0.5 s before it.
//!
//! `CYCLES=<n>` (default 100; `SOAK=1` → 2,000), `SEED=<n>` replays the kill schedule and the
//! children's batch sizes.

use crate::common;

use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tidemark::store::{DB_FILE, OpenOptions, RedbStore, WAL_FILE};
use tidemark::{Durability, Error, Event, Key, KeyKind, Node, NodeConfig, Op, ReplicaId, Value};

const CHILD_DIR: &str = "TIDEMARK_CHILD_DIR";
const CHILD_CYCLE: &str = "TIDEMARK_CHILD_CYCLE";
const CHILD_SEED: &str = "TIDEMARK_CHILD_SEED";
const CHILD_RELAXED: &str = "TIDEMARK_CHILD_RELAXED";
const TASKS: u64 = 4;
const STREAM: &str = "crash";

/// An event id: cycle, task and seq packed in one number (the orset element).
fn event_id(cycle: u64, task: u64, seq: u64) -> u64 {
    (cycle << 32) | (task << 24) | seq
}

fn set_key(cycle: u64, task: u64) -> Key {
    Key::new(KeyKind::ORSet, format!("ids/{cycle:05}/{task}"))
}

fn event_of(id: u64) -> Event {
    let (cycle, task, seq) = (id >> 32, (id >> 24) & 0xFF, id & 0xFF_FFFF);
    Event {
        source: format!("c{cycle}t{task}"),
        seq,
        ops: vec![
            Op::inc_gcounter("events", 1),
            Op::add(&set_key(cycle, task).name, id),
        ],
        ..Default::default()
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("stdout");
    out.flush().expect("flush");
}

/// The child: ingests until killed.
#[test]
fn child_ingest_until_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // Only meaningful as the child of the test below.
    };
    let num = common::child_env_u64;
    let (cycle, seed) = (num(CHILD_CYCLE), num(CHILD_SEED));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        // Start on a fresh line: the harness has printed "test <name> ... " without one.
        say("");
        let mut config = NodeConfig::new(&dir);
        if std::env::var(CHILD_RELAXED).is_ok() {
            config.durability = Durability::Relaxed;
        }
        let node = Node::open(config).await.expect("open");
        let me = node.replica_id();
        let ctx = node.context().expect("context");
        say(&format!("READY {} {}", me.0, ctx.max_seq(me)));
        let compactor = node.clone();
        let mut crng = common::rng(seed ^ 0xC0);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(crng.random_range(30..150))).await;
                compactor.compact(None).await.expect("compact");
            }
        });
        for task in 0..TASKS {
            let node = node.clone();
            let mut rng = common::rng(seed ^ (task + 1));
            tokio::spawn(async move {
                let mut seq = 0u64;
                let mut acked: Vec<Vec<Event>> = Vec::new();
                loop {
                    if !acked.is_empty() && rng.random_bool(0.1) {
                        let again = acked[rng.random_range(0..acked.len())].clone();
                        let n = again.len();
                        let r = node.ingest(STREAM, again).await.expect("re-send");
                        assert_eq!((r.applied, r.duplicates), (0, n), "re-sent events applied");
                        continue;
                    }
                    let batch: Vec<Event> = (0..rng.random_range(1..=50))
                        .map(|_| {
                            seq += 1;
                            event_of(event_id(cycle, task, seq))
                        })
                        .collect();
                    let ids: Vec<String> = batch
                        .iter()
                        .map(|e| event_id(cycle, task, e.seq).to_string())
                        .collect();
                    let ids = ids.join(" ");
                    say(&format!("SEND {ids}"));
                    match node.ingest(STREAM, batch.clone()).await {
                        Ok(r) => {
                            assert_eq!(r.applied, batch.len(), "fresh events not applied");
                            let max = node.context().expect("context").max_seq(me);
                            say(&format!("ACK {max} {ids}"));
                            acked.push(batch);
                        }
                        Err(Error::Backpressure { .. }) => {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("ingest failed: {e}"),
                    }
                }
            });
        }
        // A child the parent forgot must not run forever.
        tokio::time::sleep(Duration::from_secs(60)).await;
        std::process::exit(3);
    });
}

/// What one child run reported.
#[derive(Default)]
struct Report {
    ready: Option<(u128, u64)>,
    sent: BTreeSet<u64>,
    acked: BTreeSet<u64>,
    max_seq: u64,
}

fn parse(lines: &[String]) -> Report {
    let mut r = Report::default();
    for line in lines {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("READY") => {
                let replica = words.next().and_then(|w| w.parse().ok()).expect("replica");
                let max = words.next().and_then(|w| w.parse().ok()).expect("max seq");
                r.ready = Some((replica, max));
            }
            Some("SEND") => r.sent.extend(words.map(|w| w.parse::<u64>().expect("id"))),
            Some("ACK") => {
                let max: u64 = words.next().and_then(|w| w.parse().ok()).expect("max seq");
                r.max_seq = r.max_seq.max(max);
                r.acked.extend(words.map(|w| w.parse::<u64>().expect("id")));
            }
            _ => {}
        }
    }
    r
}

/// What the parent knows across cycles.
#[derive(Default)]
struct Known {
    replica: Option<ReplicaId>,
    /// The highest own seq ever reported or found.
    max_seq: u64,
    /// Per cycle: the ids applied (read back after that cycle's crash), and those acked
    /// (ascending).
    applied: BTreeMap<u64, Vec<u64>>,
    acked: BTreeMap<u64, Vec<u64>>,
    recoveries: Vec<Duration>,
}

impl Known {
    fn applied_total(&self) -> u64 {
        self.applied.values().map(|s| s.len() as u64).sum()
    }
}

fn orset_ids(node: &Node, cycle: u64) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    for task in 0..TASKS {
        let Value::ORSet(elems) = node.get(&set_key(cycle, task)).expect("get") else {
            panic!("not an orset")
        };
        for e in elems {
            assert!(
                ids.insert(e.parse::<u64>().expect("numeric id")),
                "id twice"
            );
        }
    }
    ids
}

/// How much of the history a check covers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// This cycle's events; 200 random older acked events re-sent.
    Cycle,
    /// Also every earlier cycle's set; 20,000 random older acked events re-sent.
    Full,
    /// Every cycle's set, every acked event re-sent.
    Final,
}

/// Checks the crash image in `dir` (after the kill of `cycle`, or at the end with `cycle =
/// None`): consistency, dots, every acknowledged event exactly once.
fn check(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    known: &mut Known,
    cycle: Option<(u64, &Report)>,
    scope: Scope,
    ctx: &str,
) {
    let started = Instant::now();
    let mut store = RedbStore::open(dir, OpenOptions::default())
        .unwrap_or_else(|e| panic!("{ctx}: the crashed store does not open: {e}"));
    known.recoveries.push(started.elapsed());
    let replica = store.replica();
    assert_eq!(
        *known.replica.get_or_insert(replica),
        replica,
        "{ctx}: the replica id changed"
    );
    assert!(
        store.check_integrity().expect("integrity check runs"),
        "{ctx}: redb integrity check failed"
    );
    store
        .verify()
        .unwrap_or_else(|e| panic!("{ctx}: verify: {e}"));
    let max = store.ctx().max_seq(replica);
    let reported = cycle.map_or(0, |(_, r)| r.max_seq);
    assert!(
        max >= reported && max >= known.max_seq,
        "{ctx}: own max seq went back: {max} on disk, {reported} reported by the child, {} \
         seen before",
        known.max_seq
    );
    known.max_seq = max;
    drop(store);
    rt.block_on(async {
        let node = Node::open(NodeConfig::new(dir)).await.expect("open node");
        assert_eq!(node.replica_id(), replica, "{ctx}");
        if let Some((c, report)) = cycle {
            let ids = orset_ids(&node, c);
            let lost: Vec<_> = report.acked.difference(&ids).take(5).collect();
            assert!(lost.is_empty(), "{ctx}: acknowledged events lost: {lost:?}");
            let phantom: Vec<_> = ids.difference(&report.sent).take(5).collect();
            assert!(phantom.is_empty(), "{ctx}: events never sent: {phantom:?}");
            known.applied.insert(c, ids.into_iter().collect());
            known
                .acked
                .insert(c, report.acked.iter().copied().collect());
        }
        if scope != Scope::Cycle {
            for (c, ids) in &known.applied {
                let now: Vec<u64> = orset_ids(&node, *c).into_iter().collect();
                assert_eq!(&now, ids, "{ctx}: cycle {c}'s set changed");
            }
        }
        let total = known.applied_total();
        let acked_total: u64 = known.acked.values().map(|s| s.len() as u64).sum();
        assert_eq!(
            node.get(&Key::new(KeyKind::GCounter, "events"))
                .expect("get"),
            Value::GCounter(total),
            "{ctx}: the counter differs from the distinct events applied"
        );
        assert!(total >= acked_total, "{ctx}");
        // Re-send every acked event of this cycle and a sample of older ones: all duplicates.
        let mut resend: Vec<u64> =
            cycle.map_or_else(Vec::new, |(_, r)| r.acked.iter().copied().collect());
        let older: Vec<u64> = known.acked.values().flatten().copied().collect();
        let mut rng = common::rng(max);
        let sample = match scope {
            Scope::Cycle => 200,
            Scope::Full => 20_000,
            Scope::Final => 0,
        };
        for _ in 0..older.len().min(sample) {
            resend.push(older[rng.random_range(0..older.len())]);
        }
        if scope == Scope::Final {
            resend = older;
        }
        let mut dups = 0;
        for chunk in resend.chunks(3_000) {
            let r = node
                .ingest(STREAM, chunk.iter().map(|id| event_of(*id)).collect())
                .await
                .expect("re-send");
            assert_eq!(
                r.applied, 0,
                "{ctx}: an acknowledged event was applied again"
            );
            dups += r.duplicates;
        }
        assert_eq!(dups, resend.len(), "{ctx}");
        assert_eq!(node.metrics().duplicates, resend.len() as u64, "{ctx}");
        assert_eq!(
            node.get(&Key::new(KeyKind::GCounter, "events"))
                .expect("get"),
            Value::GCounter(total),
            "{ctx}: re-sent events were counted"
        );
        // The next dot is right above every dot issued before the crash.
        node.apply(Op::inc_gcounter("probe", 1))
            .await
            .expect("write after restart");
        assert_eq!(
            node.context().expect("context").max_seq(replica),
            max + 1,
            "{ctx}: the next dot is not above the recovered ones"
        );
        node.shutdown().await.expect("shutdown");
    });
}

fn copy_db(from: &Path, to: &Path) -> bool {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).expect("mkdir");
    // The database and its write-ahead log: the log holds the acknowledged commits the
    // database has not made durable yet.
    match std::fs::copy(from.join(DB_FILE), to.join(DB_FILE)) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
        Err(e) => panic!("copy: {e}"),
    }
    match std::fs::copy(from.join(WAL_FILE), to.join(WAL_FILE)) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => panic!("copy log: {e}"),
    }
}

#[test]
fn kill9_cycles_lose_no_acknowledged_event() {
    let seed = common::seed("crash_kill9");
    let mut rng = common::rng(seed);
    let cycles = common::env_usize("CYCLES", if common::soak() { 2_000 } else { 100 }) as u64;
    let exe = std::env::current_exe().expect("current exe");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("node");
    let copy = tmp.path().join("check");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let mut known = Known::default();
    let mut ran = Duration::ZERO;
    for cycle in 0..cycles {
        let ctx = format!("seed {seed}, cycle {cycle}");
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_kill9::child_ingest_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, &dir)
            .env(CHILD_CYCLE, cycle.to_string())
            .env(CHILD_SEED, rng.random::<u64>().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let (tx, rx) = mpsc::channel::<String>();
        let stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = String::new();
            // Only complete lines count: the kill may cut the last one.
            while matches!(r.read_line(&mut buf), Ok(n) if n > 0) {
                if buf.ends_with('\n') && tx.send(buf.trim_end().to_owned()).is_err() {
                    break;
                }
                buf.clear();
            }
        });
        let mut stderr = child.stderr.take().expect("stderr");
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let mut lines = Vec::new();
        // The first child is killed only once its database exists: a crash while redb creates
        // the file leaves a file redb refuses ("Not a redb database"), see crash_images.rs.
        if cycle == 0 {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !lines.iter().any(|l: &String| l.starts_with("READY")) {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(l) => lines.push(l),
                    Err(_) => panic!("{ctx}: the child never got ready"),
                }
            }
        }
        let run_for = Duration::from_millis(rng.random_range(50..=600));
        std::thread::sleep(run_for);
        ran += run_for;
        if let Some(status) = child.try_wait().expect("try_wait") {
            let err = err_reader.join().unwrap_or_default();
            panic!("{ctx}: the child exited by itself ({status}):\n{err}");
        }
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("wait");
        reader.join().expect("reader");
        lines.extend(rx.try_iter());
        let err = err_reader.join().unwrap_or_default();
        assert_eq!(
            status.signal(),
            Some(9),
            "{ctx}: the child did not die by SIGKILL ({status}):\n{err}"
        );
        let report = parse(&lines);
        if let Some((replica, max)) = report.ready {
            if let Some(r) = known.replica {
                assert_eq!(
                    r.0, replica,
                    "{ctx}: the child runs under another replica id"
                );
            }
            assert!(
                max >= known.max_seq,
                "{ctx}: the child recovered own max seq {max} < {}",
                known.max_seq
            );
        }
        if !copy_db(&dir, &copy) {
            assert!(report.acked.is_empty(), "{ctx}: acked without a database");
            continue;
        }
        let scope = if cycle % 10 == 9 {
            Scope::Full
        } else {
            Scope::Cycle
        };
        check(&rt, &copy, &mut known, Some((cycle, &report)), scope, &ctx);
    }
    // The last crash image, recovered in place; every cycle's events are checked in full.
    if dir.join(DB_FILE).exists() {
        let ctx = format!("seed {seed}, final");
        check(&rt, &dir, &mut known, None, Scope::Final, &ctx);
    }
    let acked: u64 = known.acked.values().map(|s| s.len() as u64).sum();
    let recoveries = &known.recoveries;
    let max_recovery = recoveries.iter().max().copied().unwrap_or_default();
    let mean_recovery = recoveries.iter().sum::<Duration>() / recoveries.len().max(1) as u32;
    let size = std::fs::metadata(dir.join(DB_FILE)).map_or(0, |m| m.len());
    println!(
        "crash_kill9: {cycles} kill -9 cycles in {:.1?}: {acked} events acked, {} applied \
         (~{:.0} acked/s of child run time), own max seq {}; recovery (open of the crash \
         image) mean {mean_recovery:.1?}, max {max_recovery:.1?}; store {:.1} MiB",
        started.elapsed(),
        known.applied_total(),
        acked as f64 / ran.as_secs_f64().max(1e-9),
        known.max_seq,
        size as f64 / (1024.0 * 1024.0)
    );
}

/// `Durability::Relaxed` promises a bounded loss window: a crash loses at most the commits of
/// the last `relaxed_sync_interval` (config.rs). Events acknowledged well before the kill must
/// therefore survive it (the child runs 2 s in relaxed mode and is killed).
#[test]
fn relaxed_mode_loses_at_most_its_sync_interval() {
    let seed = common::seed("crash_kill9_relaxed");
    let mut rng = common::rng(seed);
    let exe = std::env::current_exe().expect("current exe");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("node");
    let interval = NodeConfig::new(&dir).relaxed_sync_interval;
    let margin = interval + Duration::from_millis(500);
    let mut child = Command::new(&exe)
        .args([
            "--exact",
            "crash_kill9::child_ingest_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, &dir)
        .env(CHILD_CYCLE, "0")
        .env(CHILD_SEED, rng.random::<u64>().to_string())
        .env(CHILD_RELAXED, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        let mut r = BufReader::new(stdout);
        let mut buf = String::new();
        while matches!(r.read_line(&mut buf), Ok(n) if n > 0) {
            if buf.ends_with('\n') {
                lines.push((Instant::now(), buf.trim_end().to_owned()));
            }
            buf.clear();
        }
        lines
    });
    std::thread::sleep(Duration::from_millis(2_000));
    let killed_at = Instant::now();
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    let lines = reader.join().expect("reader");
    let old: Vec<String> = lines
        .iter()
        .filter(|(at, _)| *at + margin < killed_at)
        .map(|(_, l)| l.clone())
        .collect();
    let report = parse(&old);
    assert!(
        !report.acked.is_empty(),
        "nothing acknowledged early enough"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ids = rt.block_on(async {
        let node = Node::open(NodeConfig::new(&dir)).await.expect("open");
        let ids = orset_ids(&node, 0);
        node.shutdown().await.expect("shutdown");
        ids
    });
    let lost = report.acked.difference(&ids).count();
    println!(
        "relaxed: {} lines, {} acked early, {} recovered, {lost} lost",
        lines.len(),
        report.acked.len(),
        ids.len()
    );
    assert_eq!(
        lost,
        0,
        "{lost} of {} events acknowledged more than {margin:?} before the kill were lost",
        report.acked.len()
    );
}
