//! The chunked form of `DotMap` (sorted chunks of at most `CHUNK` entries, children in arrival
//! order behind one-byte slots, under a two-level vector index of groups of chunks, with an
//! append fast path) always agrees with a plain ordered map:
//! * after any sequence of sets, removals and ascending runs (the append path), chunk splits
//!   and emptied chunks included, the entries, `len`, `get` and iteration order equal a
//!   `BTreeMap` model and the layout invariants hold (`DotMap::layout_is_valid`);
//! * so do maps of thousands of keys inserted and removed in random order (group splits,
//!   emptied groups, stale separators, `remove_dots`), decoded and cloned;
//! * a decoded map (full chunks) equals, hashes and encodes like the same map built op by op
//!   (any layout), so equality and encodings never depend on the layout;
//! * the causal join of maps of hundreds of keys, whatever their layouts, equals the reference
//!   join written from the definition, per key `(s ∩ s') ∪ (s \ c') ∪ (s' \ c)`, and is
//!   commutative and idempotent; redundancy removal still satisfies `X ⊔ Δ(δ, X) = X ⊔ δ`;
//! * an `ORSet` driven by random adds, removes and clears holds exactly the model's elements.
//!
//! Seeded: prints `seed = N`; replay with `SEED=N`; `SOAK=1` for ×10 cases.

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use tidemark_crdts::dotstore::{DotMap, DotSet};
use tidemark_crdts::{Causal, CausalContext, Dot, DotStore, Lattice, ORSet};

type Map = DotMap<u16, DotSet>;

/// One operation on a map.
#[derive(Clone, Debug)]
enum Op {
    /// `set(key, {dot})` (insert or replace).
    Set(u16, u64),
    /// `take(key)`.
    Take(u16),
    /// `set` of `n` keys ascending from `start` (the append path when above every key).
    Run(u16, u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..600, 1u64..999).prop_map(|(k, s)| Op::Set(k, s)),
        3 => (0u16..600).prop_map(Op::Take),
        1 => (0u16..600, 1u16..120).prop_map(|(k, n)| Op::Run(k, n)),
    ]
}

/// The dot `s` of key `k` (no two keys share a dot: the decoder refuses that).
fn dotset(k: u16, s: u64) -> DotSet {
    DotSet::single(Dot::new(rid(0), u64::from(k) * 1000 + s))
}

fn hash_of<T: Hash>(x: &T) -> u64 {
    let mut h = DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

fn agrees(m: &Map, model: &BTreeMap<u16, DotSet>) -> Result<(), TestCaseError> {
    prop_assert!(m.layout_is_valid(), "layout invalid: {m:?}");
    prop_assert_eq!(m.len(), model.len());
    prop_assert_eq!(m.is_empty(), model.is_empty());
    prop_assert!(m.iter().eq(model.iter()), "entries differ from the model");
    Ok(())
}

#[test]
fn ops_agree_with_an_ordered_map() {
    check(
        "chunked_map_ops",
        cases(500),
        proptest::collection::vec(op(), 1..80),
        |ops| {
            let mut m = Map::default();
            let mut model: BTreeMap<u16, DotSet> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Set(k, s) => {
                        m.set(k, dotset(k, s));
                        model.insert(k, dotset(k, s));
                    }
                    Op::Take(k) => {
                        prop_assert_eq!(m.take(&k), model.remove(&k));
                    }
                    Op::Run(start, n) => {
                        for k in start..start.saturating_add(n) {
                            m.set(k, dotset(k, 999));
                            model.insert(k, dotset(k, 999));
                        }
                    }
                }
                agrees(&m, &model)?;
                for probe in [0u16, 1, 299, 300, 599, 650] {
                    prop_assert_eq!(m.get(&probe), model.get(&probe));
                }
            }
            // Decoded (full chunks) and built op by op: one value, one encoding, one hash.
            // (Dots are encoded against the replica table of an enclosing `Causal`.)
            let ctx = m.dots();
            let built = Causal::new(m.clone(), ctx);
            let decoded: Causal<Map> = roundtrip(&built);
            agrees(&decoded.store, &model)?;
            prop_assert_eq!(&decoded, &built);
            prop_assert_eq!(hash_of(&decoded.store), hash_of(&m));
            prop_assert_eq!(encode(&decoded), encode(&built));
            let cloned = m.clone();
            agrees(&cloned, &model)?;
            Ok(())
        },
    );
}

/// One phase of operations on a large map.
#[derive(Clone, Debug)]
enum BigOp {
    /// `set` of each key in this order (random order: chunk and group splits in the middle).
    Insert(Vec<u16>),
    /// `take` of each key in this order.
    Remove(Vec<u16>),
    /// `take` of every key in `lo..hi` (empties whole chunks and groups).
    RemoveRange(u16, u16),
    /// `remove_dots` of the dots of every key `≡ 0 (mod m)` (the retain path).
    RemoveDotsMod(u16),
}

fn big_op() -> impl Strategy<Value = BigOp> {
    prop_oneof![
        4 => proptest::collection::vec(0u16..8000, 0..3000).prop_map(BigOp::Insert),
        2 => proptest::collection::vec(0u16..8000, 0..3000).prop_map(BigOp::Remove),
        1 => (0u16..8000, 0u16..4000).prop_map(|(lo, n)| BigOp::RemoveRange(lo, lo.saturating_add(n))),
        1 => (1u16..5).prop_map(BigOp::RemoveDotsMod),
    ]
}

/// Maps of thousands of keys inserted and removed in random order (so that chunks and groups of
/// chunks split, empty out and go, and separators go stale) agree with a `BTreeMap` model and
/// keep their layout invariants after every phase; decoded and cloned copies agree too.
#[test]
fn big_random_maps_agree_with_an_ordered_map() {
    check(
        "chunked_map_big",
        cases(40),
        proptest::collection::vec(big_op(), 1..8),
        |ops| {
            let mut m = Map::default();
            let mut model: BTreeMap<u16, DotSet> = BTreeMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                let s = 1 + n as u64;
                match op {
                    BigOp::Insert(keys) => {
                        for k in keys {
                            let old = m.get(&k).cloned();
                            m.set(k, dotset(k, s));
                            prop_assert_eq!(old, model.insert(k, dotset(k, s)));
                        }
                    }
                    BigOp::Remove(keys) => {
                        for k in keys {
                            prop_assert_eq!(m.take(&k), model.remove(&k));
                        }
                    }
                    BigOp::RemoveRange(lo, hi) => {
                        for k in lo..hi {
                            prop_assert_eq!(m.take(&k), model.remove(&k));
                        }
                    }
                    BigOp::RemoveDotsMod(md) => {
                        let mut ctx = CausalContext::new();
                        for (k, d) in &model {
                            if k % md == 0 {
                                d.for_each_dot(&mut |dot| {
                                    ctx.insert(dot);
                                });
                            }
                        }
                        let before = model.len();
                        model.retain(|k, _| k % md != 0);
                        prop_assert_eq!(m.remove_dots(&ctx), before - model.len());
                    }
                }
                agrees(&m, &model)?;
                for probe in [0u16, 1, 2999, 4000, 7999, 8000] {
                    prop_assert_eq!(m.get(&probe), model.get(&probe));
                }
            }
            let ctx = m.dots();
            let built = Causal::new(m.clone(), ctx);
            let decoded: Causal<Map> = roundtrip(&built);
            agrees(&decoded.store, &model)?;
            prop_assert_eq!(&decoded, &built);
            prop_assert_eq!(encode(&decoded), encode(&built));
            agrees(&m.clone(), &model)?;
            Ok(())
        },
    );
}

/// A side of a join: key → one dot (unique per key, from one of 3 replicas), and a context
/// holding the store's dots plus removals (dots of the same universe held by no key).
/// `(key, replica, variant)` of one dot.
type DotSpec = (u16, u8, u8);

fn side() -> impl Strategy<Value = (Vec<DotSpec>, Vec<DotSpec>)> {
    let entry = (0u16..400, 0u8..3, 0u8..2);
    (
        proptest::collection::vec(entry.clone(), 0..300),
        proptest::collection::vec(entry, 0..150),
    )
}

/// The dot of key `k` from replica `r`, variant `j` (distinct keys never share a dot).
fn dot_of(k: u16, r: u8, j: u8) -> Dot {
    Dot::new(rid(usize::from(r)), u64::from(k) * 2 + u64::from(j) + 1)
}

/// Builds a side in a random layout (keys inserted in the generated order).
fn build(store: &[DotSpec], extra: &[DotSpec]) -> Causal<Map> {
    let mut m = Map::default();
    let mut ctx = CausalContext::new();
    for &(k, r, j) in store {
        let d = dot_of(k, r, j);
        m.set(k, DotSet::single(d));
    }
    m.for_each_dot(&mut |d| {
        ctx.insert(d);
    });
    for &(k, r, j) in extra {
        ctx.insert(dot_of(k, r, j));
    }
    Causal::new(m, ctx)
}

/// The reference join from the definition: per key `(s ∩ s') ∪ (s \ c') ∪ (s' \ c)`.
fn reference(x: &Causal<Map>, y: &Causal<Map>) -> Causal<Map> {
    let (c, d) = (&x.ctx, &y.ctx);
    let keys: BTreeSet<u16> = x.store.keys().chain(y.store.keys()).copied().collect();
    let mut out = BTreeMap::new();
    for k in keys {
        let s: BTreeSet<Dot> = x
            .store
            .get(&k)
            .into_iter()
            .flat_map(|s| s.iter())
            .copied()
            .collect();
        let t: BTreeSet<Dot> = y
            .store
            .get(&k)
            .into_iter()
            .flat_map(|s| s.iter())
            .copied()
            .collect();
        let mut r: BTreeSet<Dot> = s.intersection(&t).copied().collect();
        r.extend(s.iter().filter(|x| !d.contains(x)));
        r.extend(t.iter().filter(|x| !c.contains(x)));
        if !r.is_empty() {
            out.insert(k, DotSet::from_dots(r.into_iter().collect()));
        }
    }
    let mut store = Map::default();
    for (k, s) in out {
        store.set(k, s);
    }
    let mut ctx = c.clone();
    ctx.join(d);
    Causal::new(store, ctx)
}

#[test]
fn joins_of_large_maps_equal_the_reference() {
    check(
        "chunked_map_joins",
        cases(300),
        (side(), side()),
        |((xs, xe), (ys, ye))| {
            let x = build(&xs, &xe);
            let y = build(&ys, &ye);
            let want = reference(&x, &y);
            // Built layout, decoded layout (full chunks), both directions.
            for (a, b) in [
                (x.clone(), y.clone()),
                (roundtrip(&x), roundtrip(&y)),
                (y.clone(), x.clone()),
                (roundtrip(&y), x.clone()),
            ] {
                let mut j = a.clone();
                j.join(b.clone());
                prop_assert!(j.store.layout_is_valid());
                prop_assert_eq!(&j, &want);
                // Idempotent.
                let mut again = j.clone();
                again.join(b.clone());
                prop_assert_eq!(&again, &want);
                // Redundancy removal: X ⊔ Δ(δ, X) = X ⊔ δ.
                let mut via = a.clone();
                if let Some(delta) = a.inflation(&b) {
                    via.join(delta);
                }
                prop_assert_eq!(&via, &want);
            }
            Ok(())
        },
    );
}

/// One operation on a set.
#[derive(Clone, Debug)]
enum SetOp {
    Add(u32),
    Remove(u32),
    AddRun(u32, u32),
    Clear,
}

#[test]
fn orset_holds_exactly_the_models_elements() {
    let set_op = prop_oneof![
        6 => (0u32..500).prop_map(SetOp::Add),
        4 => (0u32..500).prop_map(SetOp::Remove),
        2 => (0u32..500, 1u32..100).prop_map(|(s, n)| SetOp::AddRun(s, n)),
        1 => Just(SetOp::Clear),
    ];
    check(
        "chunked_map_orset",
        cases(300),
        proptest::collection::vec(set_op, 1..60),
        |ops| {
            let mut s: ORSet<u32> = ORSet::new();
            let mut peer: ORSet<u32> = ORSet::new();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    SetOp::Add(e) => {
                        peer.apply(
                            s.add(rid(1), e)
                                .map_err(|e| TestCaseError::fail(e.to_string()))?,
                        );
                        model.insert(e);
                    }
                    SetOp::Remove(e) => {
                        peer.apply(s.remove(&e));
                        model.remove(&e);
                    }
                    SetOp::AddRun(start, n) => {
                        for e in start..start + n {
                            peer.apply(
                                s.add(rid(1), e)
                                    .map_err(|e| TestCaseError::fail(e.to_string()))?,
                            );
                            model.insert(e);
                        }
                    }
                    SetOp::Clear => {
                        peer.apply(s.clear());
                        model.clear();
                    }
                }
                prop_assert!(s.state().store.layout_is_valid());
                prop_assert!(s.elements().eq(model.iter()));
            }
            // The peer that joined every delta holds the same state.
            prop_assert!(peer.state().store.layout_is_valid());
            prop_assert_eq!(peer.state(), s.state());
            let mut merged = peer.clone();
            merged.join(s.clone());
            prop_assert_eq!(merged.state(), s.state());
            Ok(())
        },
    );
}
