//! Resident memory of a large store (docs/design/principles.md, "Storage is the source of truth":
//! "a store larger than memory works"; limits `cache_bytes`). A store of N gcounter keys is written
//! in large `apply_batch` calls (relaxed durability, the log compacted), then a fresh process —
//! this binary re-executed, so the writer's heap does not count — reopens it, serves reads of
//! random keys (checking each value), and reports its resident memory (`VmRSS` and peak `VmHWM` of
//! /proc/self/status).
//!
//! - `small_store_reads_in_bounded_memory` (CI): 200,000 keys, RSS printed, bound 200 MiB.
//! - `five_million_keys_read_under_200_mib` (`SOAK=1` only; otherwise it prints that it was
//!   skipped): 5,000,000 keys, RSS must stay under 200 MiB.
//!
//! `KEYS=<n>` overrides the key count of the CI variant; `SEED=<n>` replays the reads.

mod common;

use rand::Rng;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;
use tidemark::{Durability, Key, KeyKind, Limits, Node, NodeConfig, Op, Value};

const CHILD_DIR: &str = "TIDEMARK_MEM_CHILD_DIR";
const CHILD_KEYS: &str = "TIDEMARK_MEM_CHILD_KEYS";
const CHILD_READS: &str = "TIDEMARK_MEM_CHILD_READS";
const CHILD_SEED: &str = "TIDEMARK_MEM_CHILD_SEED";
const BATCH: u64 = 10_000;

fn name(i: u64) -> String {
    format!("k{i:09}")
}

fn value(i: u64) -> u64 {
    1 + i % 7
}

fn config(dir: &Path, durability: Durability) -> NodeConfig {
    NodeConfig {
        durability,
        limits: Limits {
            batch_ops_max: BATCH as usize,
            ..Limits::default()
        },
        ..NodeConfig::new(dir)
    }
}

/// The child: reopens the store, reads random keys, prints its memory.
#[test]
fn child_reader() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // Only meaningful as the child of the tests below.
    };
    let num = common::child_env_u64;
    let (keys, reads, seed) = (num(CHILD_KEYS), num(CHILD_READS), num(CHILD_SEED));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let started = Instant::now();
        let node = Node::open(config(Path::new(&dir), Durability::Immediate))
            .await
            .expect("open");
        let opened = started.elapsed();
        let (after_open, _) = common::rss_kib();
        let mut rng = common::rng(seed);
        let started = Instant::now();
        // Two readers in parallel, as a server would.
        let mut tasks = Vec::new();
        for t in 0..2u64 {
            let node = node.clone();
            let mut rng = common::rng(rng.random::<u64>() ^ t);
            tasks.push(tokio::task::spawn_blocking(move || {
                for _ in 0..reads / 2 {
                    let i = rng.random_range(0..keys);
                    let got = node
                        .get(&Key::new(KeyKind::GCounter, name(i)))
                        .expect("get");
                    assert_eq!(got, Value::GCounter(value(i)), "key {i}");
                }
            }));
        }
        for t in tasks {
            t.await.expect("reader");
        }
        let read_time = started.elapsed();
        let page = node
            .list(KeyKind::GCounter, "k", Some(&name(keys / 2)), 1_000)
            .expect("list");
        assert_eq!(page.len() as u64, 1_000.min(keys - keys / 2 - 1));
        let (rss, hwm) = common::rss_kib();
        node.shutdown().await.expect("shutdown");
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "\nMEM {rss} {hwm} {after_open} {} {}",
            opened.as_millis(),
            read_time.as_millis()
        )
        .expect("stdout");
        out.flush().expect("flush");
    });
}

/// Writes `keys` keys, then measures a reader process; returns its RSS in KiB.
fn run(test: &str, keys: u64, reads: u64, bound_mib: u64) {
    let seed = common::seed(test);
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let started = Instant::now();
    rt.block_on(async {
        let node = Node::open(config(dir.path(), Durability::Relaxed))
            .await
            .expect("open");
        let mut at = 0;
        while at < keys {
            let end = (at + BATCH).min(keys);
            let ops = (at..end)
                .map(|i| Op::inc_gcounter(&name(i), value(i)))
                .collect();
            node.apply_batch(ops).await.expect("write");
            at = end;
            if at % (50 * BATCH) == 0 {
                node.compact(None).await.expect("compact");
            }
        }
        node.compact(None).await.expect("compact");
        node.shutdown().await.expect("shutdown");
    });
    let written = started.elapsed();
    let (writer_rss, writer_hwm) = common::rss_kib();
    let size = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum::<u64>();
    let out = Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "child_reader", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir.path())
        .env(CHILD_KEYS, keys.to_string())
        .env(CHILD_READS, reads.to_string())
        .env(CHILD_SEED, seed.to_string())
        .output()
        .expect("run the reader");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "reader failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nums: Vec<u64> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("MEM "))
        .expect("the reader reports memory")
        .split_whitespace()
        .map(|w| w.parse().expect("number"))
        .collect();
    let [rss, hwm, after_open, open_ms, read_ms] = nums[..] else {
        panic!("bad report {nums:?}")
    };
    println!(
        "{test}: {keys} keys written in {written:.1?} (store {:.0} MiB; writer RSS {} MiB, peak \
         {} MiB); reader: open {open_ms} ms, RSS after open {} MiB, {reads} random reads in \
         {read_ms} ms, RSS {} MiB, peak {} MiB (bound {bound_mib} MiB)",
        size as f64 / 1048576.0,
        writer_rss / 1024,
        writer_hwm / 1024,
        after_open / 1024,
        rss / 1024,
        hwm / 1024,
    );
    assert!(
        hwm < bound_mib * 1024,
        "{test}: the reader's peak RSS {} MiB is over {bound_mib} MiB",
        hwm / 1024
    );
}

#[test]
fn small_store_reads_in_bounded_memory() {
    let keys = common::env_usize("KEYS", 200_000) as u64;
    run("memory_small", keys, 200_000, 200);
}

#[test]
fn five_million_keys_read_under_200_mib() {
    if !common::soak() {
        println!("five_million_keys_read_under_200_mib: skipped (set SOAK=1 to run)");
        return;
    }
    run("memory_soak", 5_000_000, 1_000_000, 200);
}
