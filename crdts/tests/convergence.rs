//! Convergence of the store map against a sequential-specification oracle.
//!
//! 3–5 replicas of `Store` run random ops on a handful of keys of all five kinds (Inc, Dec, Add,
//! Remove, Set, Delete), LWW timestamps from per-replica `Hlc`s fed a fake, skewed wall clock
//! (receivers observe the timestamps they get). Every delta is sent to every other replica and
//! delivered in random order, with duplicates and drops; now and then one replica joins
//! another's whole state. Per op the set of ops its replica had seen when issuing it is kept
//! (happens-before). At the end the remaining messages are delivered (some dropped again), then
//! every replica joins every other's full state (`to_delta`).
//!
//! Asserts: all replicas are equal (entries, dot index and context); equal to the join of all
//! deltas; equal to the oracle (`common::oracle_*`: exact entries and dots, context = exactly the
//! ops' dots, and per key the value from the sequential spec: counters sum, orset add-wins, mvreg
//! the maximal writes, lww the max timestamp among surviving writes); every replica's state
//! before the final exchange is exactly the join of the deltas it has seen.
//!
//! A second test disables drops and the final full-state exchange: deltas alone, delivered in
//! any order with duplicates, must converge to the same oracle.

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::BTreeSet;
use tidemark_crdts::{Entry, Hlc, KeyKind, Mutation, Store, StoreDelta, Timestamp};

const BASE_MS: u64 = 1_700_000_000_000;

struct Sim {
    n: usize,
    stores: Vec<Store>,
    hlcs: Vec<Hlc>,
    seen: Vec<BTreeSet<usize>>,
    skew: Vec<u64>,
    ops: Vec<OpRecord>,
    deltas: Vec<StoreDelta>,
    /// Messages in flight: `(to, op id)`.
    pending: Vec<(usize, usize)>,
    rng: SplitMix64,
    lossy: bool,
    now: u64,
}

impl Sim {
    fn new(n: usize, seed: u64, lossy: bool) -> Self {
        let mut rng = SplitMix64::new(seed);
        let skew = (0..n).map(|_| rng.next_u64() % 40).collect();
        Sim {
            n,
            stores: vec![Store::new(); n],
            hlcs: (0..n).map(|i| Hlc::new(rid(i), 3_600_000)).collect(),
            seen: vec![BTreeSet::new(); n],
            skew,
            ops: Vec::new(),
            deltas: Vec::new(),
            pending: Vec::new(),
            rng,
            lossy,
            now: 0,
        }
    }

    fn wall(&self, r: usize) -> u64 {
        BASE_MS + self.now / 3 + self.skew[r]
    }

    /// The receiver's HLC observes every LWW timestamp it receives.
    fn observe(&mut self, to: usize, d: &StoreDelta) {
        let wall = self.wall(to);
        for (_, e) in d.store.iter() {
            if let Entry::Lww(f) = e {
                for (_, (ts, _)) in f.iter() {
                    self.hlcs[to]
                        .observe(ts, wall)
                        .expect("skews are far below the drift bound");
                }
            }
        }
    }

    fn deliver(&mut self, to: usize, id: usize) {
        let d = self.deltas[id].clone();
        self.observe(to, &d);
        self.stores[to].apply(d);
        self.seen[to].insert(id);
    }

    /// Delivers one random in-flight message (maybe duplicating or dropping it).
    fn step_network(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let i = self.rng.below(self.pending.len());
        let (to, id) = self.pending[i];
        let dup = self.rng.chance(1, 8);
        let drop = self.lossy && self.rng.chance(1, 8);
        if !dup {
            self.pending.swap_remove(i);
        }
        if !drop {
            self.deliver(to, id);
        }
    }

    fn anti_entropy(&mut self, from: usize, to: usize) {
        let d = self.stores[from].to_delta();
        self.observe(to, &d);
        self.stores[to].apply(d);
        let s = self.seen[from].clone();
        self.seen[to].extend(s);
    }

    fn issue(&mut self, r: usize, op: StoreOp) {
        self.now += 1;
        let (key, m) = store_mutation(op, false);
        let ts = (key.kind == KeyKind::Lww && matches!(m, Mutation::Set(_))).then(|| {
            let wall = self.wall(r);
            self.hlcs[r].now(wall).expect("clock left")
        });
        let dot = self.stores[r]
            .context()
            .next_dot(rid(r))
            .expect("dots left");
        let delta = self.stores[r]
            .mutate(rid(r), &key, &m, ts)
            .expect("valid mutation");
        let id = self.ops.len();
        self.ops.push(OpRecord {
            replica: rid(r),
            key,
            mutation: m,
            ts,
            dot,
            seen: self.seen[r].clone(),
        });
        self.seen[r].insert(id);
        self.deltas.push(delta);
        for to in (0..self.n).filter(|t| *t != r) {
            self.pending.push((to, id));
        }
    }

    /// The join of the deltas of `ids`, in id order, into a fresh store.
    fn join_of(&self, ids: &BTreeSet<usize>) -> Store {
        let mut s = Store::new();
        for id in ids {
            s.apply(self.deltas[*id].clone());
        }
        s
    }
}

type Case = (usize, Vec<(u8, StoreOp, u8)>, u64);

fn case() -> impl Strategy<Value = Case> {
    (
        3usize..=5,
        proptest::collection::vec((any::<u8>(), store_op(), any::<u8>()), 1..40),
        any::<u64>(),
    )
}

fn run(case: Case, lossy: bool) -> Result<(), TestCaseError> {
    let (n, script, seed) = case;
    let mut sim = Sim::new(n, seed, lossy);
    for (r, op, k) in script {
        for _ in 0..k % 4 {
            sim.step_network();
        }
        if lossy && sim.rng.chance(1, 16) {
            let a = sim.rng.below(n);
            let b = (a + 1 + sim.rng.below(n - 1)) % n;
            sim.anti_entropy(a, b);
        }
        sim.issue(usize::from(r) % n, op);
    }
    while !sim.pending.is_empty() {
        sim.step_network();
    }
    // Before any full-state exchange: each replica is exactly the join of what it has seen.
    for r in 0..n {
        let s = &sim.stores[r];
        prop_assert_eq!(
            s,
            &sim.join_of(&sim.seen[r]),
            "replica {} != ⊔ of its seen deltas",
            r
        );
        prop_assert!(s.context().own_dots_contiguous(rid(r)));
        check_store_invariants(s).map_err(TestCaseError::fail)?;
    }
    if lossy {
        // Final full-state exchange, in a random order per receiver.
        let snapshot = sim.stores.clone();
        for b in 0..n {
            let mut from: Vec<usize> = (0..n).filter(|a| *a != b).collect();
            sim.rng.shuffle(&mut from);
            for a in from {
                sim.stores[b].apply(snapshot[a].to_delta());
            }
        }
    }
    for r in 1..n {
        prop_assert_eq!(
            &sim.stores[r],
            &sim.stores[0],
            "replica {} diverged from replica 0",
            r
        );
    }
    let all: BTreeSet<usize> = (0..sim.ops.len()).collect();
    prop_assert_eq!(
        &sim.stores[0],
        &sim.join_of(&all),
        "converged state != ⊔ of all deltas"
    );
    check_against_oracle(&sim.stores[0], &sim.ops, &store_keys()).map_err(TestCaseError::fail)?;
    prop_assert_eq!(
        sim.stores[0].context().cloud_ranges(),
        0,
        "converged context has a cloud"
    );
    // HLC: every replica's timestamps were strictly increasing.
    let mut last: Vec<Option<Timestamp>> = vec![None; n];
    for o in &sim.ops {
        if let Some(ts) = o.ts {
            let i = (0..n)
                .position(|i| rid(i) == o.replica)
                .expect("known replica");
            prop_assert!(last[i].is_none_or(|l| l < ts), "HLC went backwards");
            last[i] = Some(ts);
        }
    }
    Ok(())
}

#[test]
fn store_replicas_converge_to_oracle_lossy_with_full_state_exchange() {
    check(
        "store_replicas_converge_to_oracle_lossy_with_full_state_exchange",
        CASES,
        case(),
        |c| run(c, true),
    );
}

#[test]
fn store_replicas_converge_to_oracle_by_deltas_alone() {
    check(
        "store_replicas_converge_to_oracle_by_deltas_alone",
        CASES,
        case(),
        |c| run(c, false),
    );
}
