//! Snapshots and restore (docs/design/snapshots.md): point-in-time copies taken while writes
//! continue, crash-safe snapshot files, restores under new replica ids that never reissue a
//! dot, catching up from the snapshot's source by deltas only, and a data directory copied back
//! under its old replica id being detected and re-identified.
//!
//! `SEED=<n>` replays the random choices (kill times, write mixes).

use crate::common;

use rand::Rng;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidemark::store::{StoreError, verify_snapshot};
use tidemark::{Error, Key, KeyKind, Node, NodeConfig, Op, ReplicaId, Value};

fn limits() -> tidemark::config::Limits {
    tidemark::config::Limits::default()
}

/// Op number `i` (from 1) of the deterministic workload: one op, hence one dot, per index.
fn op(i: u64) -> Op {
    match i % 6 {
        0 => Op::inc_gcounter(&format!("c{}", i % 5), i),
        1 => Op::set_lww(&format!("r{}", i % 7), i),
        2 => Op::add("s", i),
        3 if i > 30 => Op::remove("s", i - 28),
        3 => Op::inc_pncounter("p", 3),
        4 => Op::dec_pncounter("p", 1),
        _ => Op::set_mvreg(&format!("m{}", i % 3), i),
    }
}

fn all_keys(node: &Node) -> Vec<(Key, Value)> {
    KeyKind::ALL
        .iter()
        .flat_map(|k| node.list(*k, "", None, 100_000).expect("list"))
        .collect()
}

async fn open(dir: &Path) -> Node {
    Node::open(NodeConfig::new(dir)).await.expect("open")
}

async fn converge(nodes: &[&Node], what: &str) {
    let started = Instant::now();
    loop {
        let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
        if ctxs.windows(2).all(|w| w[0] == w[1]) {
            let values: Vec<_> = nodes.iter().map(|n| all_keys(n)).collect();
            if values.windows(2).all(|w| w[0] == w[1]) {
                return;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: no convergence within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn gcounter(node: &Node, name: &str) -> u64 {
    match node.get(&Key::new(KeyKind::GCounter, name)).expect("get") {
        Value::GCounter(n) => n,
        other => panic!("{name}: {other:?}"),
    }
}

fn set_len(node: &Node, name: &str) -> usize {
    match node.get(&Key::new(KeyKind::ORSet, name)).expect("get") {
        Value::ORSet(v) => v.len(),
        other => panic!("{name}: {other:?}"),
    }
}

/// The replicas (other than `except`) holding dots in `node`'s context.
fn ids(node: &Node) -> BTreeSet<ReplicaId> {
    node.context().expect("ctx").replicas().copied().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_under_concurrent_writes_equals_the_state_at_its_read_transaction() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let node = open(&tmp.path().join("a")).await;
    let me = node.replica_id();
    // Writes continue, in batches of 1..=40 ops, while the snapshots are taken: until told to
    // stop after the last snapshot (a fixed count could all land before it on a fast disk),
    // with at most 30,000 ops.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let node = node.clone();
        let stop = std::sync::Arc::clone(&stop);
        tokio::spawn(async move {
            let mut i = 0u64;
            let mut rng = common::rng(7);
            while i < 30_000 && (i < 2_000 || !stop.load(std::sync::atomic::Ordering::Acquire)) {
                let n = rng.random_range(1..=40u64);
                let batch: Vec<Op> = (i + 1..=i + n).map(op).collect();
                node.apply_batch(batch).await.expect("write");
                i += n;
            }
            i
        })
    };
    // Let some writes land, then take three snapshots while the writer runs.
    let mut snaps = Vec::new();
    for s in 0..3 {
        while node.context().expect("ctx").max_seq(me) < 500 * (s + 1) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let path = tmp.path().join(format!("snap-{s}.redb"));
        let info = node.snapshot(&path).await.expect("snapshot");
        assert_eq!(verify_snapshot(&path, &limits()).expect("verify"), info);
        assert_eq!(info.source_replica, me);
        snaps.push((path, info));
    }
    // A few more batches after the last snapshot, then stop.
    let last = node.context().expect("ctx").max_seq(me);
    while node.context().expect("ctx").max_seq(me) < last + 50 && !writer.is_finished() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let total = writer.await.expect("writer");
    let at: Vec<u64> = snaps.iter().map(|(_, i)| i.context.max_seq(me)).collect();
    assert!(
        at.last().is_some_and(|k| *k < total),
        "the writer must still have been writing after the last snapshot ({at:?} of {total})"
    );
    // A snapshot refuses to overwrite an existing file.
    assert!(matches!(
        node.snapshot(&snaps[0].0).await,
        Err(Error::Store(StoreError::Snapshot(_)))
    ));
    node.shutdown().await.expect("shutdown");
    // Each snapshot holds exactly the first k ops, k = its own max seq: every op took one dot
    // and a batch commits atomically. The oracle is a fresh node that applied ops 1..=k.
    for (n, ((path, info), k)) in snaps.iter().zip(&at).enumerate() {
        assert_eq!(info.context.max_seq(me), *k);
        let oracle = open(&tmp.path().join(format!("oracle-{n}"))).await;
        for chunk in (1..=*k).collect::<Vec<_>>().chunks(500) {
            oracle
                .apply_batch(chunk.iter().map(|i| op(*i)).collect())
                .await
                .expect("oracle write");
        }
        let dir = tmp.path().join(format!("restored-{n}"));
        let restored_info = Node::restore(path, &dir).expect("restore");
        assert_eq!(&restored_info, info);
        let restored = open(&dir).await;
        assert_ne!(
            restored.replica_id(),
            me,
            "a restore takes a new replica id"
        );
        assert_eq!(restored.context().expect("ctx"), info.context);
        assert_eq!(
            all_keys(&restored),
            all_keys(&oracle),
            "snapshot {n} (k = {k}) differs from the state after exactly {k} ops"
        );
        restored.shutdown().await.expect("shutdown");
        oracle.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_a_non_empty_directory_and_files_that_are_not_snapshots() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = tmp.path().join("a");
    let node = open(&a).await;
    node.apply(Op::inc_gcounter("x", 1)).await.expect("write");
    let snap = tmp.path().join("snap.redb");
    node.snapshot(&snap).await.expect("snapshot");
    node.shutdown().await.expect("shutdown");
    // Into the live data directory itself, or any non-empty one: refused, nothing touched.
    let before = std::fs::read(a.join(tidemark::store::DB_FILE)).expect("read db");
    let err = Node::restore(&snap, &a).expect_err("non-empty dir");
    assert!(err.to_string().contains("not empty"), "{err}");
    assert_eq!(
        std::fs::read(a.join(tidemark::store::DB_FILE)).expect("read db"),
        before
    );
    // A data directory's database is not a snapshot.
    let err = Node::restore(a.join(tidemark::store::DB_FILE), tmp.path().join("b"))
        .expect_err("not a snapshot");
    assert!(err.to_string().contains("not a tidemark snapshot"), "{err}");
    assert!(!tmp.path().join("b").join(tidemark::store::DB_FILE).exists());
    // An empty directory is fine.
    std::fs::create_dir(tmp.path().join("c")).expect("mkdir");
    Node::restore(&snap, tmp.path().join("c")).expect("restore into an empty dir");
    let c = open(&tmp.path().join("c")).await;
    assert_eq!(gcounter(&c, "x"), 1);
    c.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_twice_gives_distinct_replicas_that_write_and_converge_without_reusing_a_dot() {
    let seed = common::seed("restore_twice");
    let mut rng = common::rng(seed);
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = open(&tmp.path().join("a")).await;
    let x = a.replica_id();
    let mut expected = 0u64;
    let mut elems = 0usize;
    for i in 0..200u64 {
        let by = rng.random_range(1..10u64);
        expected += by;
        elems += 1;
        a.apply_batch(vec![
            Op::inc_gcounter("hits", by),
            Op::add("seen", format!("a-{i}")),
        ])
        .await
        .expect("write");
    }
    let snap = tmp.path().join("snap.redb");
    let info = a.snapshot(&snap).await.expect("snapshot");
    let (bd, cd) = (tmp.path().join("b"), tmp.path().join("c"));
    Node::restore(&snap, &bd).expect("restore b");
    Node::restore(&snap, &cd).expect("restore c");
    let (b, c) = (open(&bd).await, open(&cd).await);
    let (y, z) = (b.replica_id(), c.replica_id());
    assert!(
        x != y && y != z && x != z,
        "two restores give two new replica ids"
    );
    assert!(b.epoch() > info.source_epoch && c.epoch() > info.source_epoch);
    // The original keeps writing (dots the restored copies' contexts do not hold), the restored
    // copies write under their new ids; all disconnected.
    for (n, node) in [&a, &b, &c, &a, &b, &c].into_iter().enumerate() {
        for i in 0..50u64 {
            let by = rng.random_range(1..10u64);
            expected += by;
            elems += 1;
            node.apply_batch(vec![
                Op::inc_gcounter("hits", by),
                Op::add("seen", format!("{n}-{i}")),
            ])
            .await
            .expect("write");
        }
    }
    // A restored copy never issued a dot of the original: its own counter started fresh.
    assert_eq!(b.context().expect("ctx").max_seq(y), 200);
    assert_eq!(
        b.context().expect("ctx").max_seq(x),
        info.context.max_seq(x)
    );
    a.connect(&b).expect("connect");
    b.connect(&c).expect("connect");
    a.connect(&c).expect("connect");
    converge(&[&a, &b, &c], "a, b, c").await;
    for node in [&a, &b, &c] {
        assert_eq!(gcounter(node, "hits"), expected, "exact counter");
        assert_eq!(set_len(node, "seen"), elems, "every element");
        assert_eq!(node.metrics().remote_rejected, 0, "nothing refused");
        assert_eq!(node.metrics().reidentified, 0);
    }
    assert_eq!(ids(&a), BTreeSet::from([x, y, z]));
    assert_eq!(a.context().expect("ctx").max_seq(x), 2 * 200 + 2 * 100);
    for node in [a, b, c] {
        node.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_seeded_from_a_snapshot_catches_up_from_its_source_by_deltas_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = open(&tmp.path().join("a")).await;
    for i in 0..300u64 {
        a.apply_batch(vec![
            Op::inc_gcounter("hits", 1),
            Op::add("seen", format!("a-{i}")),
        ])
        .await
        .expect("write");
    }
    let snap = tmp.path().join("snap.redb");
    a.snapshot(&snap).await.expect("snapshot");
    // The source moves on after the snapshot (its log keeps those entries).
    for i in 300..400u64 {
        a.apply_batch(vec![
            Op::inc_gcounter("hits", 1),
            Op::add("seen", format!("a-{i}")),
        ])
        .await
        .expect("write");
    }
    let bd = tmp.path().join("b");
    Node::restore(&snap, &bd).expect("restore");
    let b = open(&bd).await;
    b.apply(Op::add("seen", "b-0")).await.expect("write");
    a.connect(&b).expect("connect");
    converge(&[&a, &b], "a, b").await;
    assert_eq!(gcounter(&b, "hits"), 400);
    assert_eq!(set_len(&b, "seen"), 401);
    let status = b.replication_status().await.expect("status");
    assert_eq!(
        status.stats.transfers_received, 0,
        "the restored node must catch up by deltas, not a state transfer"
    );
    assert!(status.stats.deltas_applied > 0);
    assert_eq!(a.metrics().remote_rejected + b.metrics().remote_rejected, 0);
    for node in [a, b] {
        node.shutdown().await.expect("shutdown");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_copied_back_under_its_old_id_is_detected_and_never_reissues_a_dot() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (ad, bd, backup) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("backup"),
    );
    let b = open(&bd).await;
    let a = open(&ad).await;
    let x = a.replica_id();
    let write = |node: Node, tag: &'static str, from: u64, to: u64| async move {
        for i in from..to {
            node.apply_batch(vec![
                Op::inc_gcounter("hits", 1),
                Op::add("seen", format!("{tag}-{i}")),
            ])
            .await
            .expect("write");
        }
    };
    write(a.clone(), "a", 0, 50).await;
    a.connect(&b).expect("connect");
    converge(&[&a, &b], "a, b").await;
    a.shutdown().await.expect("shutdown");
    copy_dir(&ad, &backup); // a file-level backup of a stopped node
    let a = open(&ad).await;
    a.connect(&b).expect("connect");
    write(a.clone(), "a", 50, 120).await;
    write(b.clone(), "b", 0, 20).await;
    converge(&[&a, &b], "a, b").await;
    assert_eq!(b.context().expect("ctx").max_seq(x), 240);
    a.shutdown().await.expect("shutdown");
    // The backup is copied back in place: same replica id, counter back at 100.
    std::fs::remove_dir_all(&ad).expect("rm");
    copy_dir(&backup, &ad);
    let a = open(&ad).await;
    assert_eq!(a.replica_id(), x);
    assert_eq!(a.context().expect("ctx").max_seq(x), 100);
    a.connect(&b).expect("connect");
    let started = Instant::now();
    while a.metrics().reidentified == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the copy was not detected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // New writes take dots of the new id, never x's dots 101..=240 that b holds.
    write(a.clone(), "again", 0, 30).await;
    converge(&[&a, &b], "a, b").await;
    let ctx = a.context().expect("ctx");
    assert_eq!(
        ctx.max_seq(x),
        240,
        "no dot of the old id beyond what b held"
    );
    let new_ids: Vec<ReplicaId> = ctx
        .replicas()
        .copied()
        .filter(|r| *r != x && *r != b.replica_id())
        .collect();
    assert_eq!(new_ids.len(), 1, "one new replica id");
    assert_eq!(
        ctx.max_seq(new_ids[0]),
        60,
        "the new writes are under the new id"
    );
    for node in [&a, &b] {
        assert_eq!(gcounter(node, "hits"), 120 + 20 + 30);
        assert_eq!(set_len(node, "seen"), 170);
        assert_eq!(node.metrics().remote_rejected, 0, "no message refused");
    }
    // The new id is durable: a restart keeps it and does not re-detect.
    a.shutdown().await.expect("shutdown");
    let a = open(&ad).await;
    assert_eq!(a.replica_id(), new_ids[0]);
    a.connect(&b).expect("connect");
    write(a.clone(), "after", 0, 5).await;
    converge(&[&a, &b], "a, b").await;
    assert_eq!(a.metrics().reidentified, 0);
    assert_eq!(gcounter(&b, "hits"), 175);
    for node in [a, b] {
        node.shutdown().await.expect("shutdown");
    }
}

const CHILD_DIR: &str = "TIDEMARK_SNAPSHOT_CHILD_DIR";

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The child of the kill -9 test: writes continuously and takes snapshot after snapshot into
/// `<dir>/snaps`, printing `DONE <file>` only after `snapshot` returned `Ok`.
#[test]
fn child_snapshot_until_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // Only meaningful as the child of the test below.
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        say("");
        let dir = PathBuf::from(dir);
        let node = open(&dir.join("node")).await;
        if node.context().expect("ctx").is_empty() {
            for i in 0..40u64 {
                let batch: Vec<Op> = (0..500)
                    .map(|j| Op::set_lww(&format!("k{i}-{j}"), "x".repeat(64)))
                    .collect();
                node.apply_batch(batch).await.expect("seed write");
            }
        }
        say("READY");
        let writer = node.clone();
        tokio::spawn(async move {
            let mut i = 0u64;
            loop {
                i += 1;
                let _ = writer.apply(Op::inc_gcounter("w", i)).await;
            }
        });
        let snaps = dir.join("snaps");
        std::fs::create_dir_all(&snaps).expect("mkdir");
        for n in 0.. {
            let path = snaps.join(format!("snap-{}-{n}", std::process::id()));
            node.snapshot(&path).await.expect("snapshot");
            say(&format!("DONE {}", path.display()));
        }
    });
}

#[test]
fn kill9_during_snapshots_leaves_no_file_that_claims_success() {
    let seed = common::seed("snapshot_kill9");
    let mut rng = common::rng(seed);
    let exe = std::env::current_exe().expect("current exe");
    let tmp = tempfile::tempdir().expect("tempdir");
    let cycles = common::env_usize("CYCLES", if common::soak() { 50 } else { 6 });
    let mut done_total = 0usize;
    let mut temps_total = 0usize;
    for cycle in 0..cycles {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "snapshot::child_snapshot_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = String::new();
            while matches!(r.read_line(&mut buf), Ok(n) if n > 0) {
                if buf.ends_with('\n') && tx.send(buf.trim_end().to_owned()).is_err() {
                    break;
                }
                buf.clear();
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut lines: Vec<String> = Vec::new();
        while !lines.iter().any(|l| l == "READY") {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) => lines.push(l),
                Err(_) => panic!("seed {seed}, cycle {cycle}: the child never got ready"),
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(20..600)));
        child.kill().expect("kill -9");
        let _ = child.wait();
        let _ = reader.join();
        lines.extend(rx.try_iter());
        let done: BTreeSet<PathBuf> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("DONE "))
            .map(PathBuf::from)
            .collect();
        done_total += done.len();
        // Every file under a final name is a complete, verified snapshot, and every snapshot
        // reported done is there; temporaries are hidden and never verify as final.
        for e in std::fs::read_dir(tmp.path().join("snaps")).expect("read_dir") {
            let path = e.expect("entry").path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.as_deref().is_some_and(|n| n.starts_with('.')) {
                temps_total += 1;
                std::fs::remove_file(&path).expect("rm temp");
                continue;
            }
            verify_snapshot(&path, &limits()).unwrap_or_else(|e| {
                panic!(
                    "seed {seed}, cycle {cycle}: {} claims success but fails: {e}",
                    path.display()
                )
            });
        }
        for path in &done {
            assert!(
                path.is_file(),
                "{} reported done but missing",
                path.display()
            );
        }
    }
    eprintln!(
        "snapshot kill -9: {cycles} kills, {done_total} snapshots completed, {temps_total} \
         interrupted temporaries left (none under a final name)"
    );
}

/// Figures, not assertions (run with `SOAK=1`; `KEYS=n`, default 200,000): snapshot time and
/// size, and single-writer throughput while a snapshot runs as a ratio of the throughput just
/// before it, measured in the same run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_cost_report() {
    if !common::soak() {
        return;
    }
    let keys = common::env_usize("KEYS", 200_000) as u64;
    let tmp = tempfile::tempdir().expect("tempdir");
    let node = open(&tmp.path().join("a")).await;
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1_000) {
        let batch = chunk
            .iter()
            .map(|i| Op::set_lww(&format!("key-{i:08}"), "v".repeat(100)))
            .collect();
        node.apply_batch(batch).await.expect("load");
    }
    let writes_during = |node: Node, stop: std::sync::Arc<std::sync::atomic::AtomicBool>| {
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let batch = (0..100)
                    .map(|j| Op::inc_gcounter(&format!("w{j}"), 1))
                    .collect();
                node.apply_batch(batch).await.expect("write");
                n += 100;
            }
            n
        })
    };
    // Baseline: the same writer for the same duration the snapshot takes, just before it.
    let probe = tmp.path().join("probe.redb");
    let t = Instant::now();
    node.snapshot(&probe).await.expect("probe snapshot");
    let quiet_ms = t.elapsed().as_secs_f64() * 1e3;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let w = writes_during(node.clone(), stop.clone());
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(quiet_ms / 1e3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let base = w.await.expect("writer") as f64 / t.elapsed().as_secs_f64();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let w = writes_during(node.clone(), stop.clone());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let path = tmp.path().join("snap.redb");
    let t = Instant::now();
    node.snapshot(&path).await.expect("snapshot");
    let busy_ms = t.elapsed().as_secs_f64() * 1e3;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let during = w.await.expect("writer") as f64 / (t.elapsed().as_secs_f64() + 0.05);
    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    let t = Instant::now();
    Node::restore(&path, tmp.path().join("r")).expect("restore");
    let restore_ms = t.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "snapshot of {keys} keys: {quiet_ms:.0} ms idle, {busy_ms:.0} ms under writes, {:.1} MiB; \
         restore {restore_ms:.0} ms; writer during snapshot {during:.0} ops/s vs {base:.0} \
         before = {:.2}x",
        bytes as f64 / 1048576.0,
        during / base
    );
    node.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_a_relaxed_node_holds_every_acknowledged_write() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut config = NodeConfig::new(tmp.path().join("a"));
    config.durability = tidemark::Durability::Relaxed;
    config.relaxed_sync_interval = Duration::from_secs(3600); // no timer sync during the test
    let node = Node::open(config).await.expect("open");
    for i in 1..=120u64 {
        node.apply(op(i)).await.expect("write");
    }
    // The writer makes everything durable before it opens the snapshot's read transaction
    // (so the snapshot holds nothing a crash could still lose; by construction, not observed
    // here): the snapshot holds every write acknowledged before it.
    let snap = tmp.path().join("snap.redb");
    let info = node.snapshot(&snap).await.expect("snapshot");
    assert_eq!(info.context, node.context().expect("ctx"));
    assert_eq!(info.context.max_seq(node.replica_id()), 120);
    Node::restore(&snap, tmp.path().join("r")).expect("restore");
    let restored = open(&tmp.path().join("r")).await;
    assert_eq!(all_keys(&restored), all_keys(&node));
    for n in [node, restored] {
        n.shutdown().await.expect("shutdown");
    }
}

/// The sans-IO core's evidence (docs/design/snapshots.md), message by message: only a peer holding
/// MORE of our id than we do — dots above our counter, a cursor beyond our log end — is evidence.
#[test]
fn the_core_reports_a_peer_holding_more_of_our_id_than_we_do() {
    use tidemark::crdts::CausalContext;
    use tidemark::proto::{Message, Now, PeerId, Replica, ReplicaConfig, StateStore};
    use tidemark::store::{OpenOptions, RedbStore};
    let mut store = RedbStore::open_with_backend(
        redb::backends::InMemoryBackend::new(),
        OpenOptions::default(),
    )
    .expect("open");
    let writes = tidemark::ops::validate_ops(&[op(1), op(2)], &limits()).expect("ops");
    store.commit_local(&writes, 1).expect("commit");
    let me = store.replica();
    let end = store.log_bounds().1;
    let other = ReplicaId(0xabc);
    let mut core = Replica::new(ReplicaConfig::default(), store.epoch(), 1, [PeerId(9)]);
    let now = Now {
        mono_ms: 1,
        wall_ms: 1,
    };
    let feed = |core: &mut Replica, store: &mut RedbStore, msg| {
        core.handle_message(now, PeerId(9), msg, store)
            .expect("handle");
        core.take_restored_copy()
    };
    let have = |lo_me: u64| {
        let mut ctx = CausalContext::new();
        ctx.insert_range(me, 1, lo_me);
        ctx.insert_range(other, 1, 50);
        Message::Have {
            replica: other,
            ctx,
        }
    };
    let hello = |resume| Message::Hello {
        replica: other,
        epoch: 1,
        resume,
    };
    assert_eq!(feed(&mut core, &mut store, have(2)), None, "what we hold");
    assert_eq!(feed(&mut core, &mut store, hello(Some((me, end)))), None);
    assert_eq!(feed(&mut core, &mut store, hello(Some((other, 99)))), None);
    assert_eq!(feed(&mut core, &mut store, hello(None)), None);
    let ev = feed(&mut core, &mut store, have(7)).expect("dots above our counter");
    assert_eq!(
        (ev.from, ev.evidence, ev.claimed, ev.local),
        (PeerId(9), "context", 7, 2)
    );
    assert_eq!(core.take_restored_copy(), None, "taken once");
    let ev = feed(&mut core, &mut store, hello(Some((me, end + 5)))).expect("cursor");
    assert_eq!(
        (ev.evidence, ev.claimed, ev.local),
        ("cursor", end + 5, end)
    );
}
