//! Exhaustive small-scope checking.
//!
//! Every history of up to 4 ops on 3 replicas is enumerated: each op is issued at some replica
//! (replicas numbered in order of first use, to skip relabelings) after that replica received
//! any subset of the deltas it has not seen yet. For every history, the resulting deltas are
//! delivered to a fresh replica in EVERY order, with and without a duplicate of any one delta
//! anywhere in the sequence, and the deltas each replica lacks are delivered to it in every
//! order. All final states must equal each other and the state the oracle computes from the
//! op history with happens-before (add-wins; observed removes; mvreg maximal writes; lww max
//! surviving timestamp).
//!
//! The enumeration of delivery orders is a depth-first walk of the prefix tree that skips a
//! subtree when the same (state, remaining deliveries) pair was already walked: joins are
//! deterministic, so such subtrees reach exactly the same final states. Every order is thus
//! covered, at the cost of the distinct intermediate states only.
//!
//! Scopes (3 replicas each):
//! * `ORSet<u8>`: up to 4 ops from {add 0, remove 0}, and up to 3 ops from {add 0, remove 0,
//!   clear, add 1}; with `SOAK=1` also up to 4 ops from the latter.
//! * Store map (`Store::mutate` / `Store::apply`, where removes travel as context-only deltas
//!   found through the dot index): up to 4 ops from {orset add x, orset remove x}, and up to 3
//!   ops from {orset add x / remove x / delete, mvreg set / delete, lww set / delete (equal
//!   `(l, c)` across replicas), pncounter dec}.

mod common;

use common::*;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use tidemark_crdts::dotstore::{Causal, DotMap, DotSet};
use tidemark_crdts::{
    CausalContext, Dot, Key, KeyKind, Mutation, ORSet, ORSetDelta, Store, StoreDelta, Timestamp,
};

const REPLICAS: usize = 3;

/// A system under exhaustive test.
trait Sys {
    type State: Clone + PartialEq + Debug;
    type Delta: Clone + Debug;
    /// What the oracle needs to know about one op.
    type Info: Clone + Debug;
    fn fresh() -> Self::State;
    /// Issues op `code` at replica `r`; `nth` counts `r`'s earlier ops, `id` is the op's index.
    fn issue(
        &self,
        s: &mut Self::State,
        r: usize,
        code: usize,
        nth: usize,
        id: usize,
    ) -> (Self::Delta, Self::Info);
    fn join(s: &mut Self::State, d: &Self::Delta);
    /// Hashes a state (for the memo of walked delivery orders).
    fn hash_state(s: &Self::State, h: &mut DefaultHasher);
    /// Checks the converged state against the oracle.
    fn oracle(
        &self,
        converged: &Self::State,
        ops: &[(Self::Info, BTreeSet<usize>)],
    ) -> Result<(), String>;
}

struct History<Y: Sys> {
    replicas: Vec<Y::State>,
    known: Vec<BTreeSet<usize>>,
    deltas: Vec<Y::Delta>,
    /// Per op: its info and the ids its replica had seen when issuing it.
    ops: Vec<(Y::Info, BTreeSet<usize>)>,
    owner: Vec<usize>,
}

impl<Y: Sys> Clone for History<Y> {
    fn clone(&self) -> Self {
        History {
            replicas: self.replicas.clone(),
            known: self.known.clone(),
            deltas: self.deltas.clone(),
            ops: self.ops.clone(),
            owner: self.owner.clone(),
        }
    }
}

#[derive(Default, Debug)]
struct Stats {
    histories: u64,
    walked: u64,
}

fn enumerate<Y: Sys>(sys: &Y, alphabet: usize, max_ops: usize, stats: &mut Stats) {
    let h = History::<Y> {
        replicas: vec![Y::fresh(); REPLICAS],
        known: vec![BTreeSet::new(); REPLICAS],
        deltas: Vec::new(),
        ops: Vec::new(),
        owner: Vec::new(),
    };
    rec(sys, &h, alphabet, max_ops, 0, stats);
}

fn rec<Y: Sys>(
    sys: &Y,
    h: &History<Y>,
    alphabet: usize,
    max_ops: usize,
    used: usize,
    stats: &mut Stats,
) {
    if !h.ops.is_empty() {
        check_history(sys, h, stats);
    }
    if h.ops.len() == max_ops {
        return;
    }
    for r in 0..(used + 1).min(REPLICAS) {
        let unseen: Vec<usize> = (0..h.deltas.len())
            .filter(|i| !h.known[r].contains(i))
            .collect();
        for mask in 0u32..(1 << unseen.len()) {
            for code in 0..alphabet {
                let mut h2 = h.clone();
                for (bit, &i) in unseen.iter().enumerate() {
                    if mask >> bit & 1 == 1 {
                        Y::join(&mut h2.replicas[r], &h2.deltas[i]);
                        h2.known[r].insert(i);
                    }
                }
                let id = h2.deltas.len();
                let nth = h2.owner.iter().filter(|o| **o == r).count();
                let seen = h2.known[r].clone();
                let (d, info) = sys.issue(&mut h2.replicas[r], r, code, nth, id);
                h2.deltas.push(d);
                h2.ops.push((info, seen));
                h2.owner.push(r);
                h2.known[r].insert(id);
                rec(sys, &h2, alphabet, max_ops, used.max(r + 1), stats);
            }
        }
    }
}

/// The delivery orders already walked from one start state: `(copies left, duplicate still
/// allowed, state)`, bucketed by hash. Exact (states are compared with `==`), and owned states
/// are moved in after their subtree is walked, so the memo costs no clone.
type Memo<S> = HashMap<u64, Vec<(Vec<u8>, bool, S)>>;

fn memo_hash<Y: Sys>(counts: &[u8], dup: bool, state: &Y::State) -> u64 {
    let mut h = DefaultHasher::new();
    counts.hash(&mut h);
    dup.hash(&mut h);
    Y::hash_state(state, &mut h);
    h.finish()
}

/// Walks every delivery sequence from `state`: each delta `i` with `counts[i] == 1` once, plus,
/// while `dup` holds, one extra copy of any delta at any point (so sequences without and with
/// one duplicate). Asserts each final state equals `want`.
#[allow(clippy::too_many_arguments)]
fn walk<Y: Sys>(
    state: Y::State,
    deltas: &[Y::Delta],
    counts: &mut Vec<u8>,
    dup: bool,
    want: &Y::State,
    memo: &mut Memo<Y::State>,
    path: &mut Vec<usize>,
    stats: &mut Stats,
) {
    let h = memo_hash::<Y>(counts, dup, &state);
    if memo.get(&h).is_some_and(|b| {
        b.iter()
            .any(|(c, d, s)| c == counts && *d == dup && *s == state)
    }) {
        return;
    }
    stats.walked += 1;
    if counts.iter().all(|c| *c == 0) {
        assert_eq!(
            &state, want,
            "delivery order {path:?} diverges (deltas {deltas:#?})"
        );
    }
    for i in 0..counts.len() {
        if counts[i] == 1 {
            counts[i] = 0;
            let mut next = state.clone();
            Y::join(&mut next, &deltas[i]);
            path.push(i);
            walk::<Y>(next, deltas, counts, dup, want, memo, path, stats);
            path.pop();
            counts[i] = 1;
        }
        if dup {
            let mut next = state.clone();
            Y::join(&mut next, &deltas[i]);
            path.push(i);
            walk::<Y>(next, deltas, counts, false, want, memo, path, stats);
            path.pop();
        }
    }
    memo.entry(h)
        .or_default()
        .push((counts.clone(), dup, state));
}

fn check_history<Y: Sys>(sys: &Y, h: &History<Y>, stats: &mut Stats) {
    stats.histories += 1;
    let m = h.deltas.len();
    let mut want = Y::fresh();
    for d in &h.deltas {
        Y::join(&mut want, d);
    }
    if let Err(e) = sys.oracle(&want, &h.ops) {
        panic!(
            "oracle mismatch: {e}\nops (info, seen): {:#?}\ndeltas: {:#?}",
            h.ops, h.deltas
        );
    }
    // A fresh replica: every order, without and with a duplicate of any one delta.
    let mut memo = Memo::default();
    let mut counts = vec![1u8; m];
    walk::<Y>(
        Y::fresh(),
        &h.deltas,
        &mut counts,
        true,
        &want,
        &mut memo,
        &mut Vec::new(),
        stats,
    );
    // Every replica: the deltas it lacks, in every order.
    for r in 0..REPLICAS {
        let mut counts: Vec<u8> = (0..m).map(|i| u8::from(!h.known[r].contains(&i))).collect();
        let mut memo = Memo::default();
        let start = h.replicas[r].clone();
        walk::<Y>(
            start,
            &h.deltas,
            &mut counts,
            false,
            &want,
            &mut memo,
            &mut Vec::new(),
            stats,
        );
    }
}

// ------------------------------------------------------------------------------------ ORSet --

/// ORSet<u8> with ops: add 0, remove 0, clear, add 1 (the first `alphabet` of them).
struct OrSys;

#[derive(Clone, Debug)]
enum SetInfo {
    Add(u8, Dot),
    Remove(u8),
    Clear,
}

impl Sys for OrSys {
    type State = ORSet<u8>;
    type Delta = ORSetDelta<u8>;
    type Info = SetInfo;
    fn fresh() -> ORSet<u8> {
        ORSet::new()
    }
    fn issue(
        &self,
        s: &mut ORSet<u8>,
        r: usize,
        code: usize,
        _: usize,
        _: usize,
    ) -> (ORSetDelta<u8>, SetInfo) {
        match code {
            0 | 3 => {
                let e = if code == 0 { 0 } else { 1 };
                let d = s.add(rid(r), e).expect("dots left");
                let dot = s.dots_of(&e)[0];
                (d, SetInfo::Add(e, dot))
            }
            1 => (s.remove(&0), SetInfo::Remove(0)),
            _ => (s.clear(), SetInfo::Clear),
        }
    }
    fn join(s: &mut ORSet<u8>, d: &ORSetDelta<u8>) {
        s.apply(d.clone());
    }
    fn hash_state(s: &ORSet<u8>, h: &mut DefaultHasher) {
        s.hash(h);
    }
    fn oracle(&self, got: &ORSet<u8>, ops: &[(SetInfo, BTreeSet<usize>)]) -> Result<(), String> {
        // An add survives iff no add/remove of the same element, nor a clear, observed it.
        let mut store: DotMap<u8, DotSet> = DotMap::default();
        let mut ctx = CausalContext::new();
        let mut by_elem: std::collections::BTreeMap<u8, Vec<Dot>> = Default::default();
        for (ai, (info, _)) in ops.iter().enumerate() {
            let SetInfo::Add(x, dot) = info else { continue };
            ctx.insert(*dot);
            let cancelled = ops.iter().any(|(r, seen)| {
                seen.contains(&ai)
                    && match r {
                        SetInfo::Add(y, _) | SetInfo::Remove(y) => x == y,
                        SetInfo::Clear => true,
                    }
            });
            if !cancelled {
                by_elem.entry(*x).or_default().push(*dot);
            }
        }
        for (x, dots) in by_elem {
            store.set(x, DotSet::from_dots(dots));
        }
        let want = ORSet::from_state(Causal::new(store, ctx));
        if got == &want {
            Ok(())
        } else {
            Err(format!("got {got:?}, oracle {want:?}"))
        }
    }
}

#[test]
fn orset_every_delivery_order_of_every_small_history() {
    let mut stats = Stats::default();
    // Up to 4 ops from {add 0, remove 0} (with one element, clear is remove 0), then up to 3
    // ops from {add 0, remove 0, clear, add 1} (clear across elements).
    enumerate(&OrSys, 2, 4, &mut stats);
    enumerate(&OrSys, 4, 3, &mut stats);
    if soak() {
        // SOAK=1: every 4-op history over the full alphabet.
        enumerate(&OrSys, 4, 4, &mut stats);
    }
    eprintln!("orset: {stats:?}");
    assert!(stats.histories > 5_000);
}

// ------------------------------------------------------------------------------------ Store --

/// The store map with a fixed op alphabet.
struct StoreSys {
    ops: Vec<(Key, Mutation)>,
}

impl Sys for StoreSys {
    type State = Store;
    type Delta = StoreDelta;
    type Info = OpRecord;
    fn fresh() -> Store {
        Store::new()
    }
    fn issue(
        &self,
        s: &mut Store,
        r: usize,
        code: usize,
        nth: usize,
        id: usize,
    ) -> (StoreDelta, OpRecord) {
        let (key, m) = self.ops[code].clone();
        // Distinct values per op; LWW stamps `(0, nth)`, so equal `(l, c)` across replicas.
        let m = match m {
            Mutation::Set(_) => Mutation::Set(format!("{id}")),
            m => m,
        };
        let ts = (key.kind == KeyKind::Lww).then_some(Timestamp {
            physical_ms: 0,
            logical: nth as u32,
            replica: rid(r),
        });
        let dot = s.context().next_dot(rid(r)).expect("dots left");
        let d = s.mutate(rid(r), &key, &m, ts).expect("valid mutation");
        let info = OpRecord {
            replica: rid(r),
            key,
            mutation: m,
            ts,
            dot,
            seen: BTreeSet::new(),
        };
        (d, info)
    }
    fn join(s: &mut Store, d: &StoreDelta) {
        s.apply(d.clone());
    }
    fn hash_state(s: &Store, h: &mut DefaultHasher) {
        s.entries().hash(h);
        s.context().hash(h);
    }
    fn oracle(&self, got: &Store, ops: &[(OpRecord, BTreeSet<usize>)]) -> Result<(), String> {
        let ops: Vec<OpRecord> = ops
            .iter()
            .map(|(o, seen)| OpRecord {
                seen: seen.clone(),
                ..o.clone()
            })
            .collect();
        let keys: Vec<Key> = self.ops.iter().map(|(k, _)| k.clone()).collect();
        check_store_invariants(got)?;
        check_against_oracle(got, &ops, &keys)
    }
}

#[test]
fn store_orset_every_delivery_order_of_every_4_op_history() {
    let k = Key::new(KeyKind::ORSet, "s");
    let sys = StoreSys {
        ops: vec![
            (k.clone(), Mutation::Add("\"x\"".into())),
            (k, Mutation::Remove("\"x\"".into())),
        ],
    };
    let mut stats = Stats::default();
    enumerate(&sys, 2, 4, &mut stats);
    eprintln!("store orset: {stats:?}");
    assert!(stats.histories > 3_000);
}

#[test]
fn store_all_kinds_every_delivery_order_of_every_3_op_history() {
    let s = Key::new(KeyKind::ORSet, "s");
    let m = Key::new(KeyKind::MvReg, "m");
    let l = Key::new(KeyKind::Lww, "l");
    let sys = StoreSys {
        ops: vec![
            (s.clone(), Mutation::Add("\"x\"".into())),
            (s.clone(), Mutation::Remove("\"x\"".into())),
            (s, Mutation::Delete),
            (m.clone(), Mutation::Set(String::new())),
            (m, Mutation::Delete),
            (l.clone(), Mutation::Set(String::new())),
            (l, Mutation::Delete),
            (Key::new(KeyKind::PNCounter, "c"), Mutation::Dec(2)),
        ],
    };
    let mut stats = Stats::default();
    enumerate(&sys, sys.ops.len(), 3, &mut stats);
    eprintln!("store all kinds: {stats:?}");
    assert!(stats.histories > 10_000);
}
