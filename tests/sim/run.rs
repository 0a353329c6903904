//! One seed from setup to the converged checks, and a run over many seeds with determinism and
//! coverage.

use super::Backend;
use super::counts::{Counts, coverage};
use super::harness::{Setup, Sim};
use super::workload::{Action, MAX_SOURCES, memory_schedule, recording_schedule, restore_schedule};
use crate::common;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::time::Instant;
use tidemark::config::Limits;
use tidemark::proto::{PeerId, ReplicaConfig, StateStore};

/// What a seed's cluster looks like besides what the seed draws (recording backend).
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    /// Number of nodes (default: 3 or 4, drawn).
    pub nodes: Option<usize>,
    /// Log entries a compaction keeps (default: 0 or 64, by seed).
    pub log_retain: Option<u64>,
}

pub struct SeedResult {
    pub counts: Counts,
    pub trace: u64,
    pub converge_ms: u64,
}

/// The replication settings of the simulations: short timers; the rest by the seed's
/// backend-specific choices in [`build`].
pub fn sim_config() -> ReplicaConfig {
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

/// The cluster and the schedule of `seed` on `backend`.
fn build(backend: Backend, seed: u64, verbose: bool, shape: Shape) -> (Sim, Vec<(u64, Action)>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let window = backend.fault_window_ms();
    let mut cfg = sim_config();
    match backend {
        Backend::Memory => {
            // Small messages make multi-chunk transfers and size-bounded intervals common.
            cfg.message_bytes_target = [256, 512, 1024, 4096, 8192][(seed % 5) as usize];
            // Frequent `Have`s make the context filter act on most intervals (its soundness is
            // tested under every fault); the stagger is sometimes off.
            cfg.have_after_changed_keys = [1, 1024, 2][(seed % 3) as usize];
            cfg.catch_up_stagger_ms = [1_000, 0][((seed / 3) % 2) as usize];
            let setup = Setup {
                backend,
                seed,
                verbose,
                nodes: 5,
                cfg,
                limits: Limits::default(),
                log_retain: 0,
            };
            let mut sim = Sim::new(setup, rng);
            sim.start();
            let (actions, n_keys) = memory_schedule(&mut sim.rng, 5, window);
            sim.n_keys = n_keys;
            sim.n_sources = sim.rng.random_range(1..=MAX_SOURCES);
            (sim, actions)
        }
        Backend::Recording => {
            let n = match shape.nodes {
                Some(k) => rng.random_range(k..=k),
                None => rng.random_range(3..=4),
            };
            // Small messages make multi-chunk transfers and size-bounded intervals common.
            cfg.message_bytes_target = [256, 1024, 4096][(seed % 3) as usize];
            cfg.have_after_changed_keys = [1, 1024][((seed / 3) % 2) as usize];
            // Small caches make redb write pages out before a commit's sync, too.
            let cache_bytes = [64 * 1024, 512 * 1024, 4 << 20][rng.random_range(0..3)];
            // The store cuts its log records at the replica's message target, as a node
            // configures it (`src/node.rs`: the replica's target is at most the store's): commit
            // groups and remote inflations are then often logged in several records, which an
            // interval may cut.
            let target = cfg.message_bytes_target;
            let limits = Limits {
                cache_bytes,
                message_bytes_target: target,
                key_bytes_max: 16,
                value_bytes_max: target / 4 - 16,
                element_bytes_max: target / 4 - 16,
                ..Limits::default()
            };
            limits.validate().expect("valid limits");
            let setup = Setup {
                backend,
                seed,
                verbose,
                nodes: n,
                cfg,
                limits,
                log_retain: shape
                    .log_retain
                    .unwrap_or([0, 64][((seed / 6) % 2) as usize]),
            };
            let mut sim = Sim::new(setup, rng);
            sim.n_keys = sim.rng.random_range(3..=40);
            sim.start();
            let mut actions = recording_schedule(&mut sim.rng, n, window);
            actions.extend(restore_schedule(seed, n, window));
            actions.sort_by_key(|(t, _)| *t);
            (sim, actions)
        }
    }
}

/// Runs `seed` on `backend`: the schedule, the heal, convergence and every check.
pub fn run_seed(backend: Backend, seed: u64, verbose: bool, shape: Shape) -> SeedResult {
    let (mut sim, actions) = build(backend, seed, verbose, shape);
    let n = sim.n();
    if verbose {
        println!(
            "seed {seed}: {backend:?}, {n} nodes, {} keys, config {:?}",
            sim.n_keys, sim.cfg
        );
    }
    for (at, action) in actions {
        sim.run_until(at);
        sim.log(|| format!("{action:?}"));
        match action {
            Action::Write(i) => sim.write(i),
            Action::Faults(f) => sim.faults = f,
            Action::Partition(b) => {
                if b.iter().flatten().any(|x| *x) {
                    sim.counts.partitions += 1;
                }
                sim.set_blocked(b);
            }
            Action::Crash {
                node,
                down_ms,
                mode,
            } => sim.crash(node, down_ms, mode, None),
            Action::Pause(i, ms) => sim.pause(i, ms),
            Action::Wipe(i, down_ms) => sim.wipe(i, down_ms),
            Action::Skew(i, s) => sim.nodes[i].skew_ms = s,
            Action::Snapshot(s) => {
                sim.take_snapshot(s);
            }
            Action::Restore {
                node,
                down_ms,
                pick,
                fresh_from,
                also,
            } => sim.restore_action(node, down_ms, pick, fresh_from, also),
        }
    }
    sim.run_until(backend.fault_window_ms());
    // Heal, stop writes, converge.
    sim.heal();
    let heal = sim.now;
    let converge_ms = backend.converge_ms();
    let converged = sim.run_until_converged(heal + converge_ms, 100);
    sim.collect_stats();
    if verbose {
        println!("counts: {:?}", sim.counts);
        for (i, node) in sim.nodes.iter().enumerate() {
            println!(
                "node {i}: {:?} epoch {} log {:?} ctx {:?} stats {:?}",
                node.state,
                node.epoch,
                node.store.log_bounds(),
                node.store.ctx(),
                node.replica.stats()
            );
        }
    }
    let Some(at) = converged else {
        for (i, node) in sim.nodes.iter().enumerate() {
            eprintln!(
                "node {i}: {:?} log {:?} ctx {:?} acked {:?}",
                node.state,
                node.store.log_bounds(),
                node.store.ctx(),
                (0..n)
                    .map(|j| node.replica.peer_acked(PeerId(j as u64)))
                    .collect::<Vec<_>>()
            );
        }
        panic!("seed {seed}: not converged within {converge_ms} ms of the heal");
    };
    sim.check_converged();
    if sim.log_retain == 0 {
        sim.check_logs_drain();
    }
    SeedResult {
        counts: sim.counts.clone(),
        trace: sim.trace,
        converge_ms: at - heal,
    }
}

pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The simulation on `backend` over `seeds` seeds from 1 (`SEED_START` moves the start;
/// `SEED=n` replays one seed verbosely instead) on up to `threads` threads: every seed must
/// pass, the first `replay` seeds must give the same trace hash again, and over at least
/// `coverage_from` seeds every asserted coverage case must occur. Returns the summed counts.
pub fn run_suite(
    backend: Backend,
    shape: Shape,
    seeds: u64,
    coverage_from: u64,
    threads: usize,
    replay: usize,
) -> Counts {
    let name = format!("{backend:?}");
    if let Some(seed) = env_u64("SEED") {
        println!("{name}: SEED={seed}");
        let r = run_seed(backend, seed, true, shape);
        println!(
            "seed {seed}: trace {:016x}, converged {} ms after the heal, {:?}",
            r.trace, r.converge_ms, r.counts
        );
        return r.counts;
    }
    let first = env_u64("SEED_START").unwrap_or(1);
    println!(
        "{name}: seeds {first}..={} (replay one with SEED=<n>)",
        first + seeds.saturating_sub(1)
    );
    let started = Instant::now();
    let results = common::run_seeds(seeds, threads, |seed| run_seed(backend, seed, false, shape));
    // Determinism: the first seeds replay with identical trace hashes.
    for (seed, r) in results.iter().take(replay) {
        let again = run_seed(backend, *seed, false, shape);
        assert_eq!(
            r.trace, again.trace,
            "seed {seed}: trace hash differs between two runs"
        );
    }
    let mut total = Counts::default();
    let mut seeds_with: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut slowest = 0;
    for (_, r) in &results {
        total.add(&r.counts);
        slowest = slowest.max(r.converge_ms);
        for (case, v, _) in coverage(backend, &r.counts) {
            *seeds_with.entry(case).or_default() += u64::from(v > 0);
        }
    }
    println!(
        "{name}: {seeds} seeds in {:.1?}; slowest convergence {slowest} ms after the heal",
        started.elapsed()
    );
    println!("{:<48} {:>10} {:>8}", "case", "count", "seeds");
    for (case, v, _) in coverage(backend, &total) {
        println!("{case:<48} {v:>10} {:>8}", seeds_with[case]);
    }
    if !total.images.is_empty() {
        println!("crash images: {:?}", total.images);
    }
    println!("{total:?}");
    // Seeds are 1..=n, so every case the default seeds hit also occurs in larger runs.
    if seeds >= coverage_from {
        for (case, v, asserted) in coverage(backend, &total) {
            if asserted {
                assert!(v > 0, "case `{case}` never occurred in {seeds} seeds");
            }
        }
    }
    total
}
