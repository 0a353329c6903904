//! Idempotent ingest (docs/design/principles.md, "Idempotent ingest"; pitfall "replay double
//! counts"): every event is sent 1–3 times, in random order, by several concurrent callers whose
//! calls land in shared commit groups, and the node is restarted twice in the middle (callers whose
//! call fails with `Closed` retry it on the new node). Each event must count exactly once: the
//! counters equal the distinct events, the outcomes' `applied` sum to the distinct events and their
//! `duplicates` to the extra sends, and the `duplicates` metric agrees.
//!
//! `EVENTS=<n>` (default 3,000; `SOAK=1` ×10); `SEED=<n>` replays the sends.

use crate::common;

use rand::Rng;
use rand::seq::SliceRandom;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tidemark::{Error, Event, Key, KeyKind, Node, NodeConfig, Op, Value};
use tokio::sync::watch;

const SOURCES: u64 = 8;
const CALLERS: usize = 6;

/// Event `i`: source `i % SOURCES`, weight `1 + i % 5`.
fn event(i: u64) -> Event {
    let source = format!("src{}", i % SOURCES);
    Event {
        source: source.clone(),
        seq: i / SOURCES + 1,
        ops: vec![
            Op::inc_gcounter("count", 1),
            Op::inc_gcounter("weight", 1 + i % 5),
            Op::inc_pncounter("balance", 1),
            Op::add(&format!("ids/{source}"), i),
        ],
        ..Default::default()
    }
}

#[derive(Default)]
struct Tally {
    applied: AtomicUsize,
    duplicates: AtomicUsize,
    sends: AtomicUsize,
    retries: AtomicUsize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_counts_once_across_repeats_concurrency_and_restarts() {
    let seed = common::seed("idempotency");
    let mut rng = common::rng(seed);
    let n = common::env_usize("EVENTS", 3_000) as u64 * if common::soak() { 10 } else { 1 };
    let mut sends: Vec<u64> = (0..n)
        .flat_map(|i| std::iter::repeat_n(i, rng.random_range(1..=3)))
        .collect();
    sends.shuffle(&mut rng);
    let total_sends = sends.len();
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Node::open(NodeConfig::new(dir.path())).await.expect("open");
    let (node_tx, node_rx) = watch::channel(first.clone());
    let mut nodes = vec![first];
    let tally = Arc::new(Tally::default());
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        // Round-robin after the shuffle: copies of one event usually go to different callers.
        let mine: Vec<u64> = sends.iter().skip(c).step_by(CALLERS).copied().collect();
        let mut crng = common::rng(seed ^ (c as u64 + 1));
        let mut node_rx = node_rx.clone();
        let tally = Arc::clone(&tally);
        callers.push(tokio::spawn(async move {
            let mut at = 0;
            while at < mine.len() {
                let len = crng.random_range(1..=40).min(mine.len() - at);
                let batch: Vec<Event> = mine[at..at + len].iter().map(|i| event(*i)).collect();
                loop {
                    let node = node_rx.borrow_and_update().clone();
                    match node.ingest("clicks", batch.clone()).await {
                        Ok(r) => {
                            assert_eq!(r.applied + r.duplicates, len);
                            tally.applied.fetch_add(r.applied, Ordering::AcqRel);
                            tally.duplicates.fetch_add(r.duplicates, Ordering::AcqRel);
                            tally.sends.fetch_add(len, Ordering::AcqRel);
                            break;
                        }
                        // The node is restarting: retry the same batch on the next one.
                        Err(Error::Closed) => {
                            tally.retries.fetch_add(1, Ordering::AcqRel);
                            let _ = node_rx.changed().await;
                        }
                        Err(e) => panic!("ingest: {e}"),
                    }
                }
                at += len;
                if crng.random_bool(0.2) {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    // Two restarts while the callers run.
    for cut in [total_sends / 3, 2 * total_sends / 3] {
        while tally.sends.load(Ordering::Acquire) < cut {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let old = node_rx.borrow().clone();
        old.shutdown().await.expect("shutdown");
        let new = Node::open(NodeConfig::new(dir.path()))
            .await
            .expect("reopen");
        nodes.push(new.clone());
        node_tx.send(new).expect("callers listen");
    }
    for c in callers {
        c.await.expect("caller");
    }
    let node = node_rx.borrow().clone();
    let (applied, duplicates) = (
        tally.applied.load(Ordering::Acquire),
        tally.duplicates.load(Ordering::Acquire),
    );
    assert_eq!(tally.sends.load(Ordering::Acquire), total_sends);
    assert_eq!(applied as u64, n, "events applied != distinct events");
    assert_eq!(
        duplicates,
        total_sends - n as usize,
        "duplicates != extra sends"
    );
    let metric: u64 = nodes.iter().map(|x| x.metrics().duplicates).sum();
    assert_eq!(metric, duplicates as u64, "duplicates metric");
    let get = |kind, name: &str| node.get(&Key::new(kind, name)).expect("get");
    assert_eq!(get(KeyKind::GCounter, "count"), Value::GCounter(n));
    assert_eq!(
        get(KeyKind::GCounter, "weight"),
        Value::GCounter((0..n).map(|i| 1 + i % 5).sum())
    );
    assert_eq!(
        get(KeyKind::PNCounter, "balance"),
        Value::PNCounter(i64::try_from(n).expect("small"))
    );
    let mut ids = BTreeSet::new();
    for s in 0..SOURCES {
        let Value::ORSet(v) = get(KeyKind::ORSet, &format!("ids/src{s}")) else {
            panic!("orset")
        };
        ids.extend(v.iter().map(|e| e.parse::<u64>().expect("id")));
    }
    assert_eq!(ids, (0..n).collect::<BTreeSet<_>>());
    // After the last restart, every event again: all duplicates.
    node.shutdown().await.expect("shutdown");
    let node = Node::open(NodeConfig::new(dir.path()))
        .await
        .expect("reopen");
    let all: Vec<Event> = (0..n).map(event).collect();
    for chunk in all.chunks(2_000) {
        let r = node.ingest("clicks", chunk.to_vec()).await.expect("ingest");
        assert_eq!((r.applied, r.duplicates), (0, chunk.len()));
    }
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "count"))
            .expect("get"),
        Value::GCounter(n)
    );
    println!(
        "idempotency: {n} events, {total_sends} sends by {CALLERS} callers, 2 restarts, {} calls \
         retried after Closed; applied {applied}, duplicates {duplicates}",
        tally.retries.load(Ordering::Acquire)
    );
    node.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_with_ids_count_once_across_repeats_and_callers() {
    let seed = common::seed("idempotency_ops");
    let mut rng = common::rng(seed);
    let n = 1_000u64;
    let mut sends: Vec<u64> = (0..n)
        .flat_map(|i| std::iter::repeat_n(i, rng.random_range(1..=3)))
        .collect();
    sends.shuffle(&mut rng);
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::open(NodeConfig::new(dir.path())).await.expect("open");
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        let mine: Vec<u64> = sends.iter().skip(c).step_by(CALLERS).copied().collect();
        let node = node.clone();
        let mut crng = common::rng(seed ^ (c as u64 + 1));
        callers.push(tokio::spawn(async move {
            let (mut applied, mut dups) = (0, 0);
            for chunk in mine.chunks(crng.random_range(1..=30)) {
                let ops = chunk
                    .iter()
                    .map(|i| {
                        Op::inc_gcounter("ops", 1 + i % 3).with_id(&format!("cli{}", i % 4), *i)
                    })
                    .collect();
                let r = node.apply_batch(ops).await.expect("apply");
                applied += r.applied;
                dups += r.duplicates;
            }
            (applied, dups)
        }));
    }
    let (mut applied, mut dups) = (0, 0);
    for c in callers {
        let (a, d) = c.await.expect("caller");
        applied += a;
        dups += d;
    }
    assert_eq!(applied as u64, n);
    assert_eq!(dups, sends.len() - n as usize);
    assert_eq!(node.metrics().duplicates, dups as u64);
    assert_eq!(
        node.get(&Key::new(KeyKind::GCounter, "ops")).expect("get"),
        Value::GCounter((0..n).map(|i| 1 + i % 3).sum())
    );
    node.shutdown().await.expect("shutdown");
}
