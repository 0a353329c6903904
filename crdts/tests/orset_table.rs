//! `ORSet` keeps its elements in a hash table (dense vectors under an open-addressing index),
//! not in the ordered `DotMap` of its state form. These tests check that this changes nothing
//! observable: driven by random adds (several replicas), removes, clears, deltas of a peer applied
//! in any order and duplicated, joins of whole states and decodes, an `ORSet` always equals
//! (state, elements, membership, length, hash, encoding, redundancy removal) a reference set kept
//! as the causal pair `Causal<DotMap<E, DotSet>>` with the mutators written from the definition
//! and the join of `Causal`; and its table keeps its layout invariants (`layout_is_valid`)
//! through growth, removals (backward shifts, the last entry moved into the hole) and shrinking.
//!
//! Seeded: prints `seed = N`; replay with `SEED=N`; `SOAK=1` for ×10 cases.

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use tidemark_crdts::dotstore::{DotMap, DotSet};
use tidemark_crdts::{Causal, CausalContext, DotStore, Lattice, ORSet, ORSetDelta};

type Ref = Causal<DotMap<u16, DotSet>>;

/// The reference add: `({e ↦ {d}}, {d} ∪ m(e))`.
fn ref_add(s: &mut Ref, r: usize, e: u16) -> ORSetDelta<u16> {
    let dot = s.ctx.next_dot(rid(r)).expect("dots left");
    let mut ctx = CausalContext::from_dot(dot);
    if let Some(old) = s.store.take(&e) {
        old.for_each_dot(&mut |d| {
            ctx.insert(d);
        });
    }
    s.store.set(e, DotSet::single(dot));
    s.ctx.insert(dot);
    let mut store = DotMap::default();
    store.set(e, DotSet::single(dot));
    Causal::new(store, ctx)
}

/// The reference remove: `({}, m(e))`.
fn ref_remove(s: &mut Ref, e: u16) -> ORSetDelta<u16> {
    let ctx = s.store.take(&e).map(|d| d.dots()).unwrap_or_default();
    Causal::new(DotMap::default(), ctx)
}

/// The reference clear: `({}, dots(m))`.
fn ref_clear(s: &mut Ref) -> ORSetDelta<u16> {
    let ctx = s.store.dots();
    s.store = DotMap::default();
    Causal::new(DotMap::default(), ctx)
}

#[derive(Clone, Debug)]
enum Op {
    /// Replica `0..3` of the local set adds an element.
    Add(usize, u16),
    Remove(u16),
    /// A run of adds `e..e+n` by replica 0 (growth through several index sizes).
    AddRun(u16, u16),
    Clear,
    /// The peer (replica 3) adds.
    PeerAdd(u16),
    PeerRemove(u16),
    /// Apply the peer's delta number `i` (modulo how many there are; repeats are duplicates).
    ApplyPeerDelta(usize),
    /// Join the peer's whole state.
    JoinPeer,
    /// Apply a delta of ours to the peer.
    PeerApplyOurs(usize),
    /// Replace the local set by its decoded encoding.
    Roundtrip,
}

fn hash_of<T: Hash>(x: &T) -> u64 {
    let mut h = DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

/// The former derive's shape, `struct ORSet { state }`, to compare encodings.
#[derive(serde::Serialize)]
struct Former<'a> {
    state: &'a Ref,
}

fn same(s: &ORSet<u16>, r: &Ref, range: u16) -> Result<(), TestCaseError> {
    prop_assert!(s.layout_is_valid(), "table layout broken");
    let state = s.state();
    prop_assert_eq!(&state, r);
    prop_assert_eq!(s.len(), r.store.len());
    prop_assert_eq!(s.is_empty(), r.store.is_empty());
    prop_assert!(s.elements().eq(r.store.keys()));
    for e in 0..range {
        prop_assert_eq!(s.contains(&e), r.store.get(&e).is_some());
        let dots: Vec<_> = r
            .store
            .get(&e)
            .map(|d| d.iter().copied().collect())
            .unwrap_or_default();
        prop_assert_eq!(s.dots_of(&e), dots);
    }
    prop_assert_eq!(s.context(), &r.ctx);
    prop_assert_eq!(encode(s), encode(&Former { state: r }));
    let rebuilt = ORSet::from_state(r.clone());
    prop_assert_eq!(hash_of(s), hash_of(&rebuilt));
    prop_assert_eq!(s, &rebuilt);
    Ok(())
}

fn run(ops: Vec<Op>, range: u16) -> Result<(), TestCaseError> {
    let mut s: ORSet<u16> = ORSet::new();
    let mut r = Ref::default();
    let mut peer: ORSet<u16> = ORSet::new();
    let mut peer_ref = Ref::default();
    let mut peer_deltas: Vec<ORSetDelta<u16>> = Vec::new();
    let mut our_deltas: Vec<ORSetDelta<u16>> = Vec::new();
    for op in ops {
        match op {
            Op::Add(rep, e) => {
                let d = s.add(rid(rep), e).expect("dots left");
                prop_assert_eq!(&d, &ref_add(&mut r, rep, e));
                our_deltas.push(d);
            }
            Op::Remove(e) => {
                let d = s.remove(&e);
                prop_assert_eq!(&d, &ref_remove(&mut r, e));
                our_deltas.push(d);
            }
            Op::AddRun(e, n) => {
                for x in e..e.saturating_add(n).min(range) {
                    let d = s.add(rid(0), x).expect("dots left");
                    prop_assert_eq!(&d, &ref_add(&mut r, 0, x));
                }
            }
            Op::Clear => {
                let d = s.clear();
                prop_assert_eq!(&d, &ref_clear(&mut r));
                our_deltas.push(d);
            }
            Op::PeerAdd(e) => {
                let d = peer.add(rid(3), e).expect("dots left");
                ref_add(&mut peer_ref, 3, e);
                peer_deltas.push(d);
            }
            Op::PeerRemove(e) => {
                let d = peer.remove(&e);
                ref_remove(&mut peer_ref, e);
                peer_deltas.push(d);
            }
            Op::ApplyPeerDelta(i) => {
                if !peer_deltas.is_empty() {
                    let d = peer_deltas[i % peer_deltas.len()].clone();
                    // Redundancy removal agrees with the reference, and satisfies
                    // `X ⊔ Δ(δ, X) = X ⊔ δ`.
                    let inf = s.inflation(&d);
                    prop_assert_eq!(&inf, &r.inflation(&d));
                    let mut via = s.clone();
                    if let Some(x) = inf {
                        via.apply(x);
                    }
                    s.apply(d.clone());
                    r.join(d);
                    prop_assert_eq!(&via, &s);
                }
            }
            Op::JoinPeer => {
                s.join(peer.clone());
                r.join(peer_ref.clone());
            }
            Op::PeerApplyOurs(i) => {
                if !our_deltas.is_empty() {
                    let d = our_deltas[i % our_deltas.len()].clone();
                    peer.apply(d.clone());
                    peer_ref.join(d);
                }
            }
            Op::Roundtrip => {
                let bytes = encode(&s);
                s = bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
                    .expect("decodes")
                    .0;
            }
        }
        same(&s, &r, range)?;
        prop_assert!(peer.layout_is_valid());
        prop_assert_eq!(&peer.state(), &peer_ref);
    }
    // Joins of whole states: commutative, idempotent, equal to the reference join.
    let mut a = s.clone();
    a.join(peer.clone());
    let mut b = peer.clone();
    b.join(s.clone());
    prop_assert_eq!(&a, &b);
    let mut again = a.clone();
    again.join(a.clone());
    prop_assert_eq!(&again, &a);
    let mut ra = r.clone();
    ra.join(peer_ref.clone());
    same(&a, &ra, range)?;
    Ok(())
}

fn ops(range: u16) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0usize..3, 0..range).prop_map(|(r, e)| Op::Add(r, e)),
            5 => (0..range).prop_map(Op::Remove),
            1 => (0..range, 1u16..200).prop_map(|(e, n)| Op::AddRun(e, n)),
            1 => Just(Op::Clear),
            3 => (0..range).prop_map(Op::PeerAdd),
            2 => (0..range).prop_map(Op::PeerRemove),
            3 => any::<usize>().prop_map(Op::ApplyPeerDelta),
            1 => Just(Op::JoinPeer),
            2 => any::<usize>().prop_map(Op::PeerApplyOurs),
            1 => Just(Op::Roundtrip),
        ],
        1..80,
    )
}

/// Few elements: re-adds, concurrent adds and removes of the same element, clears.
#[test]
fn orset_equals_the_causal_pair_few_elements() {
    check("orset_table_few", cases(200), ops(24), |ops| run(ops, 24));
}

/// Many elements: growth, shrinking, long runs of adds.
#[test]
fn orset_equals_the_causal_pair_many_elements() {
    check("orset_table_many", cases(60), ops(1_500), |ops| {
        run(ops, 1_500)
    });
}
