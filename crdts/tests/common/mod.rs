//! Shared helpers of the `tidemark-crdts` test suite.
//!
//! * Seeds: every randomized test calls [`check`] (proptest) or [`seeded_rng`] (plain loops).
//!   Both print `seed = N (replay with SEED=N)`; run with `SEED=N` to replay, `SOAK=1` for ×10
//!   cases.
//! * Histories: random op sequences on 2–4 replicas with random partial deliveries and state
//!   joins between them ([`Step`], [`history`], [`build`]), so contexts get clouds and gaps.
//! * The store-level op encoding ([`StoreOp`]) and the sequential-specification oracle
//!   ([`oracle_entries`], [`oracle_value`]) used by the convergence and exhaustive tests.
#![allow(dead_code)]

pub mod pools;
pub mod weird;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseResult, TestRng, TestRunner};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};
use tidemark_crdts::dotstore::{DotFun, DotMap, DotSet};
use tidemark_crdts::{
    CausalContext, Dot, Entry, Key, KeyKind, Mutation, ReplicaId, Store, StoreDelta, Timestamp,
    Value,
};

/// Default number of cases per law (×10 with `SOAK=1`).
pub const CASES: u32 = 2_000;

/// True when `SOAK=1` (or any non-empty value other than `0`).
pub fn soak() -> bool {
    std::env::var("SOAK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `base` cases, ×10 under `SOAK=1`.
pub fn cases(base: u32) -> u32 {
    if soak() {
        base.saturating_mul(10)
    } else {
        base
    }
}

/// The seed of this run: `SEED` from the environment, else drawn from the clock (mixed with
/// `name` so tests running in parallel get different seeds). Printed so a failure can be replayed.
pub fn seed(name: &str) -> u64 {
    let seed = match std::env::var("SEED") {
        Ok(s) => s
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("SEED must be a decimal u64, got {s:?}: {e}")),
        Err(_) => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let mut h = nanos ^ u64::from(std::process::id()).rotate_left(32);
            for b in name.bytes() {
                h = SplitMix64::new(h ^ u64::from(b)).next_u64();
            }
            h
        }
    };
    eprintln!("[{name}] seed = {seed} (replay with SEED={seed})");
    seed
}

/// A proptest runner seeded from [`seed`]: ChaCha from 32 bytes expanded with splitmix64.
pub fn runner(name: &str, base_cases: u32) -> (TestRunner, u64) {
    let seed = seed(name);
    let mut sm = SplitMix64::new(seed);
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&sm.next_u64().to_le_bytes());
    }
    let config = Config {
        cases: cases(base_cases),
        failure_persistence: None,
        max_shrink_iters: 4_096,
        ..Config::default()
    };
    (
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)),
        seed,
    )
}

/// Runs `test` on `base_cases` (×10 under `SOAK=1`) inputs of `strategy`; panics with the seed
/// and the minimal failing input on failure.
pub fn check<S>(name: &str, base_cases: u32, strategy: S, test: impl Fn(S::Value) -> TestCaseResult)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
{
    let (mut runner, seed) = runner(name, base_cases);
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name} failed (replay with SEED={seed}):\n{e}");
    }
}

/// splitmix64: a tiny seeded PRNG for loops that are not proptest strategies.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// A seeded splitmix64 for a non-proptest test (prints the seed like [`check`]).
pub fn seeded_rng(name: &str) -> SplitMix64 {
    SplitMix64::new(seed(name))
}

/// Replica `i` (distinct top bits so `Debug` tells them apart).
pub fn rid(i: usize) -> ReplicaId {
    ReplicaId(((i as u128) + 1) << 96 | (i as u128))
}

/// bincode (standard config, serde) encoding.
pub fn encode<T: Serialize>(x: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(x, bincode::config::standard()).expect("encode")
}

/// bincode decoding of a whole buffer.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let (v, n) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map_err(|e| e.to_string())?;
    if n != bytes.len() {
        return Err(format!("{} trailing bytes", bytes.len() - n));
    }
    Ok(v)
}

/// `decode(encode(x))`.
pub fn roundtrip<T: Serialize + DeserializeOwned>(x: &T) -> T {
    decode(&encode(x)).expect("decode of freshly encoded value")
}

// ---------------------------------------------------------------------------------------------
// Random histories on a few replicas.
// ---------------------------------------------------------------------------------------------

/// One step of a random history. Indices are taken modulo the replica count / log length.
#[derive(Clone, Debug)]
pub enum Step<O> {
    /// Replica issues an op (its delta goes to the log).
    Op(u8, O),
    /// Replica joins one logged delta (partial delivery: creates gaps and clouds).
    Deliver(u8, u16),
    /// Replica `.1` joins the whole state of replica `.0`.
    Sync(u8, u8),
}

/// `(replica count in 2..=4, steps)`.
pub fn history<O: Clone + std::fmt::Debug + 'static>(
    op: impl Strategy<Value = O> + Clone + 'static,
    max_steps: usize,
) -> impl Strategy<Value = (usize, Vec<Step<O>>)> {
    let step = prop_oneof![
        4 => (any::<u8>(), op).prop_map(|(r, o)| Step::Op(r, o)),
        4 => (any::<u8>(), any::<u16>()).prop_map(|(r, i)| Step::Deliver(r, i)),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Step::Sync(a, b)),
    ];
    (2usize..=4, proptest::collection::vec(step, 0..max_steps))
}

/// The outcome of a history: final replica states and every delta issued (with its origin).
#[derive(Clone, Debug)]
pub struct Built<T, D> {
    pub replicas: Vec<T>,
    pub log: Vec<(usize, D)>,
}

/// Plays `steps` on `n` replicas.
///
/// `op(state, replica_index, op, step_index)` applies a mutator and returns its delta;
/// `join_delta` joins a delta, `join_state` a whole other replica.
pub fn build<T: Clone, O, D: Clone>(
    n: usize,
    steps: &[Step<O>],
    new: impl Fn(usize) -> T,
    mut op: impl FnMut(&mut T, usize, &O, usize) -> D,
    join_delta: impl Fn(&mut T, D),
    join_state: impl Fn(&mut T, &T),
) -> Built<T, D> {
    let mut replicas: Vec<T> = (0..n).map(new).collect();
    let mut log: Vec<(usize, D)> = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        match s {
            Step::Op(r, o) => {
                let r = usize::from(*r) % n;
                let d = op(&mut replicas[r], r, o, i);
                log.push((r, d));
            }
            Step::Deliver(r, k) => {
                if !log.is_empty() {
                    let d = log[usize::from(*k) % log.len()].1.clone();
                    join_delta(&mut replicas[usize::from(*r) % n], d);
                }
            }
            Step::Sync(a, b) => {
                let (a, b) = (usize::from(*a) % n, usize::from(*b) % n);
                if a != b {
                    let from = replicas[a].clone();
                    join_state(&mut replicas[b], &from);
                }
            }
        }
    }
    Built { replicas, log }
}

// ---------------------------------------------------------------------------------------------
// The store: keys, op encoding, joins.
// ---------------------------------------------------------------------------------------------

/// Key names per kind.
pub const KEY_NAMES: [&str; 2] = ["a", "b"];

/// Every test key: each kind × [`KEY_NAMES`].
pub fn store_keys() -> Vec<Key> {
    KeyKind::ALL
        .iter()
        .flat_map(|k| KEY_NAMES.iter().map(move |n| Key::new(*k, *n)))
        .collect()
}

/// A store op in compact form: `key` indexes [`store_keys`], `code` picks the mutation valid for
/// the key's kind, `val` its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOp {
    pub key: u8,
    pub code: u8,
    pub val: u8,
}

pub fn store_op() -> impl Strategy<Value = StoreOp> + Clone {
    (0u8..10, any::<u8>(), any::<u8>()).prop_map(|(key, code, val)| StoreOp { key, code, val })
}

/// An orset element (canonical JSON text).
pub fn elem(v: u8) -> String {
    format!("\"e{}\"", v % 3)
}

/// The key and mutation of `op`; `big` allows huge counter amounts.
pub fn store_mutation(op: StoreOp, big: bool) -> (Key, Mutation) {
    let keys = store_keys();
    let key = keys[usize::from(op.key) % keys.len()].clone();
    let amount = if big && op.val >= 250 {
        u64::MAX - u64::from(op.val)
    } else {
        u64::from(op.val % 5) + 1
    };
    let m = match key.kind {
        KeyKind::GCounter => Mutation::Inc(amount),
        KeyKind::PNCounter => {
            if op.code % 2 == 0 {
                Mutation::Inc(amount)
            } else {
                Mutation::Dec(amount)
            }
        }
        KeyKind::ORSet => match op.code % 4 {
            0 | 1 => Mutation::Add(elem(op.val)),
            2 => Mutation::Remove(elem(op.val)),
            _ => Mutation::Delete,
        },
        KeyKind::Lww | KeyKind::MvReg => {
            if op.code % 4 < 3 {
                Mutation::Set(format!("{}", op.val % 4))
            } else {
                Mutation::Delete
            }
        }
    };
    (key, m)
}

/// `a ⊔ b` for stores.
pub fn sjoin(a: &Store, b: &Store) -> Store {
    let mut a = a.clone();
    a.apply(b.to_delta());
    a
}

/// A store holding exactly `delta`.
pub fn store_of(delta: StoreDelta) -> Store {
    let mut s = Store::new();
    s.apply(delta);
    s
}

// ---------------------------------------------------------------------------------------------
// The sequential-specification oracle.
// ---------------------------------------------------------------------------------------------

/// One issued store op with its happens-before information.
#[derive(Clone, Debug)]
pub struct OpRecord {
    pub replica: ReplicaId,
    pub key: Key,
    pub mutation: Mutation,
    pub ts: Option<Timestamp>,
    /// The fresh dot the op took.
    pub dot: Dot,
    /// Ids (indices in the history) of the ops whose effects the issuing replica held when it
    /// issued this one (its own earlier ops included).
    pub seen: BTreeSet<usize>,
}

/// Does op `r` (on the same key as `a`) cancel the add/write `a` (index `ai`)? It does iff `r`
/// overwrites or removes what `a` wrote and `a` is in `r`'s causal past.
fn cancels(a: &OpRecord, ai: usize, r: &OpRecord) -> bool {
    if r.key != a.key || !r.seen.contains(&ai) {
        return false;
    }
    match (&a.mutation, &r.mutation) {
        (Mutation::Add(x), Mutation::Add(y) | Mutation::Remove(y)) => x == y,
        (Mutation::Add(_), Mutation::Delete) => true,
        (Mutation::Set(_), Mutation::Set(_) | Mutation::Delete) => true,
        _ => false,
    }
}

/// Ops of `key` that survive: adds/writes not cancelled by any later op that observed them.
fn surviving<'a>(ops: &'a [OpRecord], key: &Key) -> Vec<(usize, &'a OpRecord)> {
    ops.iter()
        .enumerate()
        .filter(|(_, o)| &o.key == key && matches!(o.mutation, Mutation::Add(_) | Mutation::Set(_)))
        .filter(|(i, a)| !ops.iter().any(|r| cancels(a, *i, r)))
        .collect()
}

/// The expected entries of the converged store, built from the op history alone.
pub fn oracle_entries(ops: &[OpRecord]) -> BTreeMap<Key, Entry> {
    let keys: BTreeSet<Key> = ops.iter().map(|o| o.key.clone()).collect();
    let mut out = BTreeMap::new();
    for key in keys {
        let entry = match key.kind {
            KeyKind::GCounter | KeyKind::PNCounter => {
                // Per replica: its last op's dot carries its running (saturating) totals.
                let mut per: BTreeMap<ReplicaId, (Dot, u64, u64)> = BTreeMap::new();
                for o in ops.iter().filter(|o| o.key == key) {
                    let e = per.entry(o.replica).or_insert((o.dot, 0, 0));
                    e.0 = o.dot;
                    match o.mutation {
                        Mutation::Inc(by) => e.1 = e.1.saturating_add(by),
                        Mutation::Dec(by) => e.2 = e.2.saturating_add(by),
                        _ => {}
                    }
                }
                if key.kind == KeyKind::GCounter {
                    Entry::GCounter(DotFun::from_entries(
                        per.values().map(|(d, p, _)| (*d, *p)).collect(),
                    ))
                } else {
                    Entry::PNCounter(DotFun::from_entries(
                        per.values().map(|(d, p, n)| (*d, (*p, *n))).collect(),
                    ))
                }
            }
            KeyKind::ORSet => {
                let mut by_elem: BTreeMap<String, Vec<Dot>> = BTreeMap::new();
                for (_, a) in surviving(ops, &key) {
                    if let Mutation::Add(x) = &a.mutation {
                        by_elem.entry(x.clone()).or_default().push(a.dot);
                    }
                }
                let mut m = DotMap::default();
                for (x, dots) in by_elem {
                    m.set(x, DotSet::from_dots(dots));
                }
                Entry::ORSet(m)
            }
            KeyKind::MvReg => Entry::MvReg(DotFun::from_entries(
                surviving(ops, &key)
                    .into_iter()
                    .filter_map(|(_, w)| match &w.mutation {
                        Mutation::Set(v) => Some((w.dot, v.clone())),
                        _ => None,
                    })
                    .collect(),
            )),
            KeyKind::Lww => Entry::Lww(DotFun::from_entries(
                surviving(ops, &key)
                    .into_iter()
                    .filter_map(|(_, w)| match (&w.mutation, w.ts) {
                        (Mutation::Set(v), Some(ts)) => Some((w.dot, (ts, v.clone()))),
                        _ => None,
                    })
                    .collect(),
            )),
        };
        if !tidemark_crdts::DotStore::is_bottom(&entry) {
            out.insert(key, entry);
        }
    }
    out
}

/// The expected context of the converged store: exactly the dots of all ops.
pub fn oracle_context(ops: &[OpRecord]) -> CausalContext {
    ops.iter().map(|o| o.dot).collect()
}

/// The value a reader must see for `key`, from the sequential specification (independent of
/// `Entry::value`): counters sum their amounts; orset add-wins; mvreg the maximal writes; lww
/// the max `(timestamp, value)` among the surviving writes.
pub fn oracle_value(ops: &[OpRecord], key: &Key) -> Value {
    match key.kind {
        KeyKind::GCounter => {
            let mut per: BTreeMap<ReplicaId, u64> = BTreeMap::new();
            for o in ops.iter().filter(|o| &o.key == key) {
                if let Mutation::Inc(by) = o.mutation {
                    let t = per.entry(o.replica).or_default();
                    *t = t.saturating_add(by);
                }
            }
            Value::GCounter(per.values().fold(0u64, |a, b| a.saturating_add(*b)))
        }
        KeyKind::PNCounter => {
            let mut per: BTreeMap<ReplicaId, (u64, u64)> = BTreeMap::new();
            for o in ops.iter().filter(|o| &o.key == key) {
                let t = per.entry(o.replica).or_default();
                match o.mutation {
                    Mutation::Inc(by) => t.0 = t.0.saturating_add(by),
                    Mutation::Dec(by) => t.1 = t.1.saturating_add(by),
                    _ => {}
                }
            }
            let p = per.values().fold(0u64, |a, b| a.saturating_add(b.0));
            let n = per.values().fold(0u64, |a, b| a.saturating_add(b.1));
            let v = i128::from(p) - i128::from(n);
            Value::PNCounter(v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
        }
        KeyKind::ORSet => {
            let set: BTreeSet<String> = surviving(ops, key)
                .into_iter()
                .filter_map(|(_, a)| match &a.mutation {
                    Mutation::Add(x) => Some(x.clone()),
                    _ => None,
                })
                .collect();
            Value::ORSet(set.into_iter().collect())
        }
        KeyKind::MvReg => {
            let set: BTreeSet<String> = surviving(ops, key)
                .into_iter()
                .filter_map(|(_, w)| match &w.mutation {
                    Mutation::Set(v) => Some(v.clone()),
                    _ => None,
                })
                .collect();
            Value::MvReg(set.into_iter().collect())
        }
        KeyKind::Lww => Value::Lww(
            surviving(ops, key)
                .into_iter()
                .filter_map(|(_, w)| match (&w.mutation, w.ts) {
                    (Mutation::Set(v), Some(ts)) => Some((ts, v.clone())),
                    _ => None,
                })
                .max()
                .map(|(_, v)| v),
        ),
    }
}

/// Checks a converged store against the oracle: exact entries, exact context, and every key's
/// value. Returns a description of the first mismatch.
pub fn check_against_oracle(store: &Store, ops: &[OpRecord], keys: &[Key]) -> Result<(), String> {
    for key in keys {
        let want = oracle_value(ops, key);
        let got = store.get(key);
        if got != want {
            return Err(format!("value of {key}: got {got:?}, oracle {want:?}"));
        }
    }
    let want = oracle_entries(ops);
    if store.entries() != &want {
        return Err(format!(
            "entries differ:\n got {:#?}\n oracle {:#?}",
            store.entries(),
            want
        ));
    }
    let ctx = oracle_context(ops);
    if store.context() != &ctx {
        return Err(format!(
            "context differs: got {:?}, oracle {:?}",
            store.context(),
            ctx
        ));
    }
    Ok(())
}

/// Structural invariants of a store every valid history keeps: I3, canonical entries, no
/// bottom entries, entry kinds match key kinds, and the dot index agrees with the entries
/// (a store rebuilt from its own state is identical, index included).
pub fn check_store_invariants(s: &Store) -> Result<(), String> {
    if !s.dots_within_context() {
        return Err("I3 violated: a live dot is outside the context".into());
    }
    for (k, e) in s.entries() {
        if e.kind() != k.kind {
            return Err(format!("entry kind {:?} under key {k}", e.kind()));
        }
        if !e.is_canonical() {
            return Err(format!("non-canonical entry under {k}: {e:?}"));
        }
        if tidemark_crdts::DotStore::is_bottom(e) {
            return Err(format!("bottom entry kept under {k}"));
        }
    }
    let rebuilt = store_of(s.to_delta());
    if &rebuilt != s {
        return Err(format!(
            "store rebuilt from its own state differs (dot index out of sync?)\n{s:#?}\nvs\n{rebuilt:#?}"
        ));
    }
    Ok(())
}
