//! Deterministic simulation of a 5-node Tidemark cluster (docs/design/principles.md, "Testing
//! goals").
//!
//! Five [`tidemark::proto::Replica`]s over the production redb store (`tests/sim/store.rs`, on an
//! in-memory backend) exchange messages through a simulated network in virtual time; one seed
//! drives everything. A nemesis partitions,
//! drops, duplicates, delays/reorders, pauses, crashes, wipes and skews clocks; clients write on
//! every node. After the schedule: heal, stop writes, and require convergence within 30 simulated
//! seconds to the sequential-specification oracle over the acknowledged (minus allowed-lost) ops.
//!
//! Writes include idempotent events from many sources, large values and large batches; every
//! message is asserted to fit in `frame_bytes_max`, every log record to read back, and after
//! convergence every surviving event is retried at a random node and must be a no-op.
//!
//! Env: `SEEDS=n` (default 1000), `SOAK=1` (100,000 seeds), `SEED=n` (replay one seed, verbose).

mod common;
#[path = "sim/harness.rs"]
mod harness;
#[path = "sim/oracle.rs"]
mod oracle;
#[path = "sim/store.rs"]
mod store;

use harness::{Counts, Faults, Sim};
use rand::Rng;
use std::time::Instant;
use tidemark::codec;
use tidemark::config::Limits;
use tidemark::model::Delta;
use tidemark::proto::{ReplicaConfig, StateStore};
use tidemark::store::EventId;
use tidemark_crdts::{Key, KeyKind, Mutation};

const NODES: usize = 5;
/// The largest register value the generator writes. Kept at a size every path handles today;
/// raise it to the limits (`Limits::value_bytes_max`) once oversized log records, intervals and
/// chunks are split by construction (ARCHITECTURE.md, "size invariants"): every message is asserted
/// to fit in `frame_bytes_max` and every log record to be readable.
const MAX_VALUE_BYTES: usize = 2 * 1024;
/// The largest batch (one commit group) the generator writes.
const MAX_BATCH_OPS: usize = 24;
/// The most event sources one seed uses.
const MAX_SOURCES: u64 = 200;
const FAULT_WINDOW_MS: u64 = 60_000;
const CONVERGE_MS: u64 = 30_000;

fn sim_config() -> ReplicaConfig {
    ReplicaConfig {
        gossip_interval_ms: 500,
        retransmit_timeout_ms: 1_000,
        retransmit_timeout_max_ms: 4_000,
        peer_evict_after_ms: 10_000,
        hello_attempts: 2,
        message_bytes_target: 4 * 1024,
        ..ReplicaConfig::default()
    }
}

#[derive(Clone, Debug)]
enum Action {
    Write(usize),
    Faults(Faults),
    Partition(Vec<Vec<bool>>),
    Crash(usize, u64),
    Pause(usize, u64),
    Wipe(usize, u64),
    Skew(usize, i64),
}

/// A partition shape (Jepsen's), as `blocked[from][to]`.
fn partition(rng: &mut impl Rng) -> (Vec<Vec<bool>>, &'static str) {
    let n = NODES;
    let mut b = vec![vec![false; n]; n];
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let cut = |b: &mut Vec<Vec<bool>>, x: usize, y: usize| {
        b[x][y] = true;
        b[y][x] = true;
    };
    let name = match rng.random_range(0..5) {
        0 => {
            // majority / minority halves
            let k = rng.random_range(1..=2);
            for &x in &order[..k] {
                for &y in &order[k..] {
                    cut(&mut b, x, y);
                }
            }
            "halves"
        }
        1 => {
            let x = order[0];
            for y in 0..n {
                if y != x {
                    cut(&mut b, x, y);
                }
            }
            "isolate-one"
        }
        2 => {
            // majorities ring: each node sees only its two ring neighbours
            for i in 0..n {
                for j in 0..n {
                    let d = (i + n - j) % n;
                    if i != j && d != 1 && d != n - 1 {
                        b[order[i]][order[j]] = true;
                    }
                }
            }
            "ring"
        }
        3 => {
            // one-way: one node cannot send to anyone (it still receives)
            let x = order[0];
            for (y, cell) in b[x].iter_mut().enumerate() {
                if y != x {
                    *cell = true;
                }
            }
            "one-way"
        }
        _ => {
            // bridge: two halves joined only through one node
            let bridge = order[0];
            for &x in &order[1..3] {
                for &y in &order[3..] {
                    cut(&mut b, x, y);
                }
            }
            let _ = bridge;
            "bridge"
        }
    };
    (b, name)
}

fn schedule(rng: &mut impl Rng) -> (Vec<(u64, Action)>, usize) {
    let mut actions = Vec::new();
    let n_ops = rng.random_range(80..=230); // batches of 1-3: 100-300 ops
    let mut planned = 0;
    while planned < n_ops {
        let t = rng.random_range(0..FAULT_WINDOW_MS);
        actions.push((t, Action::Write(rng.random_range(0..NODES))));
        planned += 1;
    }
    let mut t = 0;
    while t < FAULT_WINDOW_MS {
        let faults = if rng.random_bool(0.6) {
            Faults {
                drop_pct: rng.random_range(0..=30),
                dup_pct: rng.random_range(0..=10),
                delay_max_ms: rng.random_range(0..=5_000),
            }
        } else {
            Faults::default()
        };
        actions.push((t, Action::Faults(faults)));
        let blocked = if rng.random_bool(0.45) {
            partition(rng).0
        } else {
            vec![vec![false; NODES]; NODES]
        };
        actions.push((t, Action::Partition(blocked)));
        t += rng.random_range(1_000..=8_000);
    }
    for _ in 0..rng.random_range(0..=4) {
        let at = rng.random_range(0..FAULT_WINDOW_MS);
        actions.push((
            at,
            Action::Crash(rng.random_range(0..NODES), rng.random_range(50..=5_000)),
        ));
    }
    for _ in 0..rng.random_range(0..=2) {
        let at = rng.random_range(0..FAULT_WINDOW_MS);
        actions.push((
            at,
            Action::Pause(rng.random_range(0..NODES), rng.random_range(500..=60_000)),
        ));
    }
    if rng.random_bool(0.3) {
        let at = rng.random_range(0..FAULT_WINDOW_MS);
        actions.push((
            at,
            Action::Wipe(rng.random_range(0..NODES), rng.random_range(50..=3_000)),
        ));
    }
    for i in 0..NODES {
        if rng.random_bool(0.5) {
            actions.push((0, Action::Skew(i, rng.random_range(-3_600_000..=3_600_000))));
        }
    }
    for _ in 0..rng.random_range(0..=2) {
        let at = rng.random_range(0..FAULT_WINDOW_MS);
        actions.push((
            at,
            Action::Skew(
                rng.random_range(0..NODES),
                rng.random_range(-3_600_000..=3_600_000),
            ),
        ));
    }
    actions.sort_by_key(|(t, _)| *t);
    let n_keys = rng.random_range(1..=200);
    (actions, n_keys)
}

fn key_of(idx: usize) -> Key {
    Key::new(KeyKind::ALL[idx % 5], format!("k{idx}"))
}

fn gen_op(rng: &mut impl Rng, n_keys: usize, serial: &mut u64) -> (Key, Mutation) {
    let key = key_of(rng.random_range(0..n_keys));
    *serial += 1;
    if rng.random_range(0..100) == 0 {
        // Invalid on purpose for counters (refused, never acknowledged); fine elsewhere.
        return (key, Mutation::Delete);
    }
    let m = match key.kind {
        KeyKind::GCounter => Mutation::Inc(rng.random_range(1..=5)),
        KeyKind::PNCounter => {
            if rng.random_bool(0.5) {
                Mutation::Inc(rng.random_range(1..=5))
            } else {
                Mutation::Dec(rng.random_range(1..=5))
            }
        }
        KeyKind::ORSet => {
            let e = format!("\"e{}\"", rng.random_range(0..4));
            match rng.random_range(0..100) {
                0..55 => Mutation::Add(e),
                55..90 => Mutation::Remove(e),
                _ => Mutation::Delete,
            }
        }
        KeyKind::Lww | KeyKind::MvReg => match rng.random_range(0..100) {
            0..3 => {
                // A large value (a JSON string), up to MAX_VALUE_BYTES.
                let len = rng.random_range(256..=MAX_VALUE_BYTES - 16);
                Mutation::Set(format!("\"v{serial}-{}\"", "x".repeat(len)))
            }
            3..85 => Mutation::Set(format!("\"v{serial}\"")),
            _ => Mutation::Delete,
        },
    };
    (key, m)
}

struct SeedResult {
    counts: Counts,
    trace: u64,
}

fn run_seed(seed: u64, verbose: bool) -> SeedResult {
    // Small messages make multi-chunk transfers and size-bounded intervals common.
    let mut cfg = sim_config();
    cfg.message_bytes_target = [256, 512, 1024, 4096, 8192][(seed % 5) as usize];
    // Frequent `Have`s make the context filter act on most intervals (its soundness is tested
    // under every fault); the stagger is sometimes off.
    cfg.have_after_changed_keys = [1, 1024, 2][(seed % 3) as usize];
    cfg.catch_up_stagger_ms = [1_000, 0][((seed / 3) % 2) as usize];
    let mut sim = Sim::new(seed, NODES, cfg, Limits::default());
    let (actions, n_keys) = schedule(&mut sim.rng);
    let n_sources = sim.rng.random_range(1..=MAX_SOURCES);
    let mut next_seq: std::collections::BTreeMap<u64, u64> = Default::default();
    let mut serial = 0u64;
    for (at, action) in actions {
        sim.run_until(at);
        if verbose {
            println!("t={at} {action:?}");
        }
        match action {
            Action::Write(i) => {
                let len = match sim.rng.random_range(0..100) {
                    0..75 => 1,
                    75..96 => sim.rng.random_range(2..=3),
                    _ => {
                        sim.counts.large_batches += 1;
                        sim.rng.random_range(4..=MAX_BATCH_OPS)
                    }
                };
                let ops: Vec<(Key, Mutation)> = (0..len)
                    .map(|_| gen_op(&mut sim.rng, n_keys, &mut serial))
                    .collect();
                sim.counts.large_values += ops
                    .iter()
                    .filter(|(_, m)| matches!(m, Mutation::Set(v) if v.len() > 256))
                    .count() as u64;
                // Some writes are idempotent events from one of many sources.
                let event = (sim.rng.random_range(0..100) < 30).then(|| {
                    let k = sim.rng.random_range(0..n_sources);
                    let seq = next_seq.entry(k).or_insert(0);
                    *seq += sim.rng.random_range(1..=3);
                    EventId {
                        stream: "sim".into(),
                        source: format!("source-{k}"),
                        seq: *seq,
                    }
                });
                let is_event = event.is_some();
                if sim.client_write_event(i, ops, event) == Some(true) && is_event {
                    sim.counts.events += 1;
                }
            }
            Action::Faults(f) => sim.faults = f,
            Action::Partition(b) => {
                if b.iter().flatten().any(|x| *x) {
                    sim.counts.partitions += 1;
                }
                sim.set_blocked(b);
            }
            Action::Crash(i, down) => sim.crash(i, down),
            Action::Pause(i, ms) => sim.pause(i, ms),
            Action::Wipe(i, down) => sim.wipe(i, down),
            Action::Skew(i, s) => sim.nodes[i].skew_ms = s,
        }
    }
    sim.run_until(FAULT_WINDOW_MS);
    sim.heal();
    let heal = sim.now;
    let converged = sim.run_until_converged(heal + CONVERGE_MS, 100);
    sim.collect_stats();
    if verbose {
        println!("counts: {:?}", sim.counts);
        for (i, n) in sim.nodes.iter().enumerate() {
            println!(
                "node {i}: {:?} ctx={:?} stats={:?}",
                n.state,
                n.store.context(),
                n.replica.stats()
            );
        }
    }
    let Some(at) = converged else {
        for (i, n) in sim.nodes.iter().enumerate() {
            eprintln!(
                "node {i}: {:?} log={:?} ctx={:?} acked={:?}",
                n.state,
                n.store.log_bounds(),
                n.store.context(),
                (0..NODES)
                    .map(|j| n.replica.peer_acked(tidemark::proto::PeerId(j as u64)))
                    .collect::<Vec<_>>()
            );
        }
        panic!("seed {seed}: not converged within {CONVERGE_MS} ms of the heal");
    };
    assert!(at - heal <= CONVERGE_MS);
    // Identical canonical bytes everywhere.
    let bytes0 = sim.nodes[0].store.canonical_bytes().expect("encodes");
    for (i, n) in sim.nodes.iter_mut().enumerate() {
        assert_eq!(
            n.store.canonical_bytes().expect("encodes"),
            bytes0,
            "seed {seed}: node {i} differs"
        );
    }
    // Equal to the oracle over acknowledged, not-lost ops.
    let store = &sim.nodes[0].store;
    let mut keys = sim.oracle.keys();
    keys.extend(store.entries().keys().cloned());
    for key in keys {
        let expected = sim.oracle.expected(&key);
        let actual = store.value(&key);
        if actual != expected {
            eprintln!(
                "seed {seed}: key {key}: stored entry {:?}",
                store.entries().get(&key)
            );
            for op in sim.oracle.ops.iter().filter(|o| o.key == key) {
                eprintln!(
                    "  op {:?} {:?} lost={} ts={:?}",
                    op.dot, op.mutation, op.lost, op.ts
                );
            }
        }
        assert_eq!(
            actual, expected,
            "seed {seed}: key {key} differs from the oracle"
        );
    }
    // Dedup marks replicated with the state: a retried event is a no-op at every node.
    sim.retry_events();
    // Every retained log record is readable.
    for (i, n) in sim.nodes.iter_mut().enumerate() {
        let start = n.store.log_bounds().0;
        if let Err(e) = n.store.log_interval(start, None, usize::MAX) {
            panic!("seed {seed}: node {i}: the log does not read back: {e}");
        }
    }
    // Logs drain (pitfalls "one dead peer pins the log", "BP drain"): once every peer acknowledged
    // everything, each node's stable frontier reaches its log end and the whole log is truncated.
    let drain_deadline = sim.now + 10_000;
    while sim.now < drain_deadline && sim.nodes.iter().any(|n| n.store.log_len() > 0) {
        let next = sim.now + 100;
        sim.run_until(next);
    }
    for (i, n) in sim.nodes.iter().enumerate() {
        assert_eq!(
            n.store.log_len(),
            0,
            "seed {seed}: node {i}'s log did not drain (bounds {:?}, frontier {:?})",
            n.store.log_bounds(),
            n.replica.stable_frontier()
        );
    }
    SeedResult {
        counts: sim.counts.clone(),
        trace: sim.trace,
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn simulation_converges_to_the_oracle() {
    if let Some(seed) = env_u64("SEED") {
        let r = run_seed(seed, true);
        println!("seed {seed}: trace {:016x} {:?}", r.trace, r.counts);
        return;
    }
    let seeds = if std::env::var("SOAK").is_ok_and(|v| v == "1") {
        100_000
    } else {
        env_u64("SEEDS").unwrap_or(1_000)
    };
    let started = Instant::now();
    let results = common::run_seeds(seeds, 8, |seed| run_seed(seed, false));

    // Determinism: the first 20 seeds replay with identical trace hashes.
    for (seed, r) in results.iter().take(20) {
        let again = run_seed(*seed, false);
        let first = r.trace;
        assert_eq!(
            first, again.trace,
            "seed {seed}: trace hash differs between two runs"
        );
    }

    // Coverage table.
    let mut total = Counts::default();
    let mut seeds_with: std::collections::BTreeMap<&'static str, u64> = Default::default();
    for (_, r) in &results {
        let c = &r.counts;
        total.add(c);
        for (name, v) in coverage(c) {
            *seeds_with.entry(name).or_default() += u64::from(v > 0);
        }
    }
    println!("simulation: {seeds} seeds in {:.1?}", started.elapsed());
    println!("{:<44} {:>10} {:>8}", "case", "count", "seeds");
    for (name, v) in coverage(&total) {
        println!("{name:<44} {v:>10} {:>8}", seeds_with[name]);
    }
    println!("{total:?}");
    // Coverage: every case must occur over the CI seeds (rare extras are only printed; their code
    // paths have unit tests).
    if seeds >= 100 {
        for (name, v) in coverage(&total) {
            if !PRINTED_ONLY.contains(&name) {
                assert!(v > 0, "case `{name}` never occurred in {seeds} seeds");
            }
        }
    }
}

/// Seeds beyond the CI range (`SEED_START` slices) that once failed, each replayed on every
/// run with the defect it found.
const FOUND_BEYOND_CI: [(u64, &str); 2] = [
    (
        300808,
        "a late Hello without a cursor left a bootstrap deferral on a peer that then reported \
         its cursor: the peer was not served and pinned the log past the drain deadline",
    ),
    (
        601534,
        "a late Hello without a cursor during a state transfer left a bootstrap deferral that \
         outlived the transfer's completion: the rest of the log waited ~8 s and pinned it",
    ),
];

#[test]
fn simulation_replays_the_seeds_found_beyond_ci() {
    for (seed, found) in FOUND_BEYOND_CI {
        println!("seed {seed}: {found}");
        run_seed(seed, false);
    }
}

/// Coverage rows printed but not asserted (too rare for small seed counts).
const PRINTED_ONLY: [&str; 1] = ["transfer restarted (ChunkNack)"];

fn coverage(c: &Counts) -> Vec<(&'static str, u64)> {
    vec![
        (
            "crash with unacked in-flight / queued input",
            c.crash_with_unacked,
        ),
        ("state-transfer fallback (any cause)", c.transfers),
        (
            "  of which: cursor behind the compacted log",
            c.transfers_behind_log,
        ),
        ("delta before its causal predecessor (gap)", c.gaps),
        ("duplicate interval (from < cursor)", c.duplicates),
        ("stale-epoch ack dropped", c.stale_acks),
        ("HLC timestamp above max drift", c.hlc_rejected),
        ("data wiped (new replica id)", c.wipes),
        ("acknowledged op lost by a wipe", c.ops_lost),
        ("peer evicted for silence", c.evictions),
        ("log compacted", c.compactions),
        ("empty (BP-only) interval sent", c.empty_intervals),
        ("transfer chunk after the first", c.later_chunks),
        ("transfer restarted (ChunkNack)", c.chunk_nacks),
        ("duplicate chunk of a completed transfer", c.stale_chunks),
        ("interval filtered by the receiver's context", c.filtered),
        ("idempotent event acknowledged", c.events),
        (
            "event retried after convergence (a no-op)",
            c.duplicate_events,
        ),
        ("large value written", c.large_values),
        ("large batch written", c.large_batches),
    ]
}

// ---- Bandwidth and catch-up, faults off (printed; the catch-up goal is asserted) -------

/// Links of a random ring over the nodes (a connected overlay of degree 2, diameter 2 for five
/// nodes): `true` where the link is absent.
fn random_ring(sim: &mut Sim) -> Vec<Vec<bool>> {
    let mut order: Vec<usize> = (0..NODES).collect();
    for i in (1..NODES).rev() {
        let j = sim.rng.random_range(0..=i);
        order.swap(i, j);
    }
    let mut blocked = vec![vec![true; NODES]; NODES];
    for w in 0..NODES {
        let (a, b) = (order[w], order[(w + 1) % NODES]);
        blocked[a][b] = false;
        blocked[b][a] = false;
    }
    for (i, row) in blocked.iter_mut().enumerate() {
        row[i] = false;
    }
    blocked
}

/// RR is always on: the production store has no switch for it (the RR-off rows of earlier
/// measurements came from the in-memory store, which the simulation no longer uses).
fn bandwidth_run(bp: bool, filter: bool, ring: bool) -> (u64, u64, u64) {
    let cfg = ReplicaConfig {
        back_propagation_avoidance: bp,
        filter_by_peer_context: filter,
        ..ReplicaConfig::default()
    };
    let mut sim = Sim::new(7, NODES, cfg, Limits::default());
    sim.check = false;
    if ring {
        let blocked = random_ring(&mut sim);
        sim.set_blocked(blocked);
    }
    sim.run_until(2_000);
    sim.measure = true;
    let mut serial = 0;
    let ops = 2_000;
    for k in 0..ops {
        sim.run_until(2_000 + k * 30);
        let node = sim.rng.random_range(0..NODES);
        let op = gen_op(&mut sim.rng, 200, &mut serial);
        sim.client_write(node, vec![op]);
    }
    let end = sim.now + 30_000;
    assert!(
        sim.run_until_converged(end, 100).is_some(),
        "bandwidth run did not converge"
    );
    let end = sim.now + 30_000;
    if ring {
        // Non-neighbours never acknowledge each other on a ring, so "quiescent" (every peer
        // acknowledged) cannot hold: count 30 more seconds of traffic instead.
        sim.run_until(end);
    } else {
        assert!(
            sim.run_until_quiescent(end, 100).is_some(),
            "bandwidth run did not quiesce"
        );
    }
    println!("  by kind (count, bytes): {:?}", sim.bytes_by_kind);
    (sim.bytes_sent, sim.delta_bytes, sim.counts.ops_acked)
}

#[test]
fn bandwidth_per_replicated_op() {
    let peers = (NODES - 1) as f64;
    let rr = true;
    for (bp, filter, ring) in [
        (true, true, false),
        (true, false, false),
        (false, false, false),
        (true, true, true),
        (false, false, true),
    ] {
        let (sent, deltas, ops) = bandwidth_run(bp, filter, ring);
        let overlay = if ring { "random ring" } else { "full mesh" };
        println!(
            "G10 bandwidth {overlay} BP={bp} RR={rr} context-filter={filter}: {ops} ops, deltas {deltas} B, sent {sent} B, \
             sent/op {:.1} B, sent/delta-bytes {:.2}x, per receiving peer {:.2}x",
            sent as f64 / ops as f64,
            sent as f64 / deltas as f64,
            sent as f64 / deltas as f64 / peers
        );
        if ring && bp && rr {
            // The goal on a random overlay with BP+RR: at most 1.5x the ops' encoded
            // deltas per replica that must receive them (deterministic: virtual time, fixed seed).
            let per_peer = sent as f64 / deltas as f64 / peers;
            assert!(
                per_peer <= 1.5,
                "random-overlay bandwidth {per_peer:.2}x per receiving peer"
            );
        }
    }
}

/// A 60 s partition of one node of five, during which 10,000 keys of 20,000 change (every
/// other key, the adversarial case for removal metadata): on the majority side
/// (`isolated_writes = false`, the isolated node catches up) or on the isolated node itself.
/// Returns (rounds, changed bytes, bytes received per node, all bytes, transfers).
fn catch_up(isolated_writes: bool) -> (u64, u64, Vec<u64>, u64, u64) {
    let cfg = ReplicaConfig::default();
    let interval = cfg.gossip_interval_ms;
    let mut sim = Sim::new(11, NODES, cfg, Limits::default());
    sim.check = false;
    let isolated = NODES - 1;
    let base_keys = 20_000usize;
    let changed = 10_000usize;
    // Preload: every node writes a share of the base keys; converge.
    sim.run_until(1_000);
    for chunk in 0..20 {
        let ops: Vec<(Key, Mutation)> = (0..base_keys / 20)
            .map(|k| {
                let idx = chunk * (base_keys / 20) + k;
                (
                    Key::new(KeyKind::MvReg, format!("key{idx:06}")),
                    Mutation::Set(format!("\"base{idx}\"")),
                )
            })
            .collect();
        sim.client_write(chunk % NODES, ops);
    }
    let t = sim.now + 60_000;
    assert!(
        sim.run_until_converged(t, 500).is_some(),
        "preload did not converge"
    );
    let t = sim.now + 60_000;
    assert!(
        sim.run_until_quiescent(t, 500).is_some(),
        "preload did not quiesce"
    );
    // Partition the isolated node for 60 s while 10,000 keys change.
    let blocked: Vec<Vec<bool>> = (0..NODES)
        .map(|i| {
            (0..NODES)
                .map(|j| i != j && (i == isolated || j == isolated))
                .collect()
        })
        .collect();
    sim.set_blocked(blocked);
    let start = sim.now;
    let mut changes = Delta::default();
    for b in 0..100 {
        sim.run_until(start + b * 500);
        let ops: Vec<(Key, Mutation)> = (0..changed / 100)
            .map(|k| {
                let idx = (b as usize * (changed / 100) + k) * 2;
                (
                    Key::new(KeyKind::MvReg, format!("key{idx:06}")),
                    Mutation::Set(format!("\"changed{idx}\"")),
                )
            })
            .collect();
        let node = if isolated_writes {
            isolated
        } else {
            b as usize % isolated
        };
        let before = sim.nodes[node].store.log_bounds().1;
        sim.client_write(node, ops);
        let iv = sim.nodes[node]
            .store
            .log_interval(before, None, usize::MAX)
            .expect("log")
            .delta
            .expect("written");
        changes.join(iv);
    }
    sim.run_until(start + 60_000);
    let changed_bytes = codec::encoded_len("delta", &changes).expect("encodes") as u64;
    // Heal and measure every byte until the cluster is quiet again.
    sim.measure = true;
    sim.bytes_sent = 0;
    sim.bytes_to = vec![0; NODES];
    sim.bytes_by_kind.clear();
    let heal = sim.now;
    let transfers_before: u64 = sim
        .nodes
        .iter()
        .map(|n| n.replica.stats().transfers_started)
        .sum();
    sim.heal();
    let at = sim
        .run_until_converged(heal + 120_000, 10)
        .expect("catch-up did not converge");
    let rounds = (at - heal).div_ceil(interval);
    let quiet = sim
        .run_until_quiescent(at + 60_000, 10)
        .expect("catch-up did not quiesce");
    println!(
        "  converged {} ms, quiescent {} ms after the heal; by kind (count, bytes): {:?}",
        at - heal,
        quiet - heal,
        sim.bytes_by_kind
    );
    let transfers = sim
        .nodes
        .iter()
        .map(|n| n.replica.stats().transfers_started)
        .sum::<u64>()
        - transfers_before;
    (
        rounds,
        changed_bytes,
        sim.bytes_to.clone(),
        sim.bytes_sent,
        transfers,
    )
}

#[test]
fn partition_catch_up() {
    let isolated = NODES - 1;
    // The isolated node catches up with 10,000 keys the majority changed.
    let (rounds, changed, to, all, transfers) = catch_up(false);
    let ratio_to = to[isolated] as f64 / changed as f64;
    let ratio_all = all as f64 / changed as f64;
    println!(
        "G10 catch-up (majority changed 10,000 of 20,000 keys, {changed} B encoded): {rounds} gossip rounds; \
         bytes to the isolated node {} ({ratio_to:.2}x), all bytes {all} ({ratio_all:.2}x), transfers {transfers}",
        to[isolated]
    );
    assert!(rounds <= 10, "catch-up took {rounds} gossip rounds");
    assert_eq!(transfers, 0, "catch-up must not ship full state");
    assert!(
        ratio_to <= 2.0,
        "the isolated node received {ratio_to:.2}x the changed data"
    );
    assert!(
        ratio_all <= 2.0,
        "catch-up sent {ratio_all:.2}x the changed data"
    );

    // The isolated node changed 10,000 keys: every other node needs them once.
    let (rounds, changed, to, all, transfers) = catch_up(true);
    let worst = to[..isolated].iter().copied().max().unwrap_or(0) as f64 / changed as f64;
    let ratio_all = all as f64 / changed as f64;
    println!(
        "G10 catch-up (isolated node changed 10,000 of 20,000 keys, {changed} B encoded): {rounds} gossip rounds; \
         most bytes received by one node {worst:.2}x, all bytes {all} ({ratio_all:.2}x = {:.2}x per receiving node), \
         transfers {transfers}",
        ratio_all / isolated as f64
    );
    assert!(rounds <= 10, "catch-up took {rounds} gossip rounds");
    assert_eq!(transfers, 0, "catch-up must not ship full state");
    assert!(worst <= 2.0, "a node received {worst:.2}x the changed data");
}
