//! Hostile review of the inline one-key `DotMap` form (`Repr::One`) against the chunked form
//! holding the same entries: a map of 0, 1 or 2 keys is reached by several paths (a `set` on an
//! empty map, which holds one key inline; two sets then a `take`, the chunked form of one key;
//! a decode, full chunks; a join into an empty map; `remove_dots`/`unseen_by` leftovers), and
//! every operation applied to each of them must give the same observable result (equality,
//! hash, bincode bytes, JSON text, `Debug`, `len`/`is_empty`/`get`/`iter`, layout validity) as
//! the same operation on a `BTreeMap` model where the model is simple (set, take, remove_dots),
//! and the same value whichever forms the operands of a join are held in.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use tidemark_crdts::dotstore::{DotMap, DotSet};
use tidemark_crdts::{Causal, CausalContext, Dot, DotStore, ReplicaId};

type Map = DotMap<u8, DotSet>;
type Model = BTreeMap<u8, Vec<Dot>>;

const R: [ReplicaId; 2] = [
    ReplicaId(0x8f3e_0000_0000_4000_8000_0000_0000_00aa),
    ReplicaId(0x1c07_0000_0000_4000_8000_0000_0000_00bb),
];

fn hash_of<T: Hash>(x: &T) -> u64 {
    let mut h = DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}
fn bytes<T: serde::Serialize>(x: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(x, bincode::config::standard()).expect("encodes and decodes")
}

fn dotset(d: &[Dot]) -> DotSet {
    DotSet::from_dots(d.to_vec())
}

/// Every way to reach the model's value: (name, map).
fn forms(model: &Model) -> Vec<(&'static str, Map)> {
    let mut out = Vec::new();
    // set in ascending order (one key: inline).
    let mut a = Map::default();
    for (k, d) in model {
        a.set(*k, dotset(d));
    }
    out.push(("set", a.clone()));
    // set in descending order
    let mut b = Map::default();
    for (k, d) in model.iter().rev() {
        b.set(*k, dotset(d));
    }
    out.push(("set-rev", b));
    // a spare key first, then taken: chunked form of the same entries
    let mut c = Map::default();
    c.set(200, dotset(&[Dot::new(R[1], 999)]));
    for (k, d) in model {
        c.set(*k, dotset(d));
    }
    assert!(c.take(&200).is_some());
    out.push(("spare-taken", c));
    // a spare key first, then set to bottom
    let mut c2 = Map::default();
    for (k, d) in model {
        c2.set(*k, dotset(d));
    }
    c2.set(201, dotset(&[Dot::new(R[1], 998)]));
    c2.set(201, DotSet::default());
    out.push(("spare-bottomed", c2));
    // decoded (full chunks)
    let dec: Map = bincode::serde::decode_from_slice(&bytes(&a), bincode::config::standard())
        .expect("encodes and decodes")
        .0;
    out.push(("decoded", dec));
    let dj: Map = serde_json::from_str(&serde_json::to_string(&a).expect("encodes and decodes"))
        .expect("encodes and decodes");
    out.push(("json", dj));
    // joined into an empty map with disjoint contexts
    let mut j = Map::default();
    let mut ctx = CausalContext::new();
    for d in model.values().flatten() {
        ctx.insert(*d);
    }
    j.join(&CausalContext::new(), a.clone(), &ctx);
    out.push(("joined-into-empty", j));
    // an empty map joined into it
    let mut j2 = a.clone();
    j2.join(&ctx, Map::default(), &CausalContext::new());
    out.push(("empty-joined-in", j2));
    // remove_dots of an extra entry's dot
    let mut r = a.clone();
    let extra = Dot::new(R[1], 997);
    r.set(202, dotset(&[extra]));
    assert_eq!(r.remove_dots(&CausalContext::from_dot(extra)), 1);
    out.push(("remove-dots-leftover", r));
    // unseen_by of an empty context
    out.push(("unseen-by", a.unseen_by(&CausalContext::new())));
    // clone
    out.push(("clone", a.clone()));
    out
}

fn check(name: &str, m: &Map, model: &Model) -> Result<(), TestCaseError> {
    let want: Map = {
        // the reference encoding: a BTreeMap<u8, DotSet> in the newtype the old derive wrote
        let mut x = Map::default();
        for (k, d) in model {
            x.set(*k, dotset(d));
        }
        x
    };
    prop_assert!(m.layout_is_valid(), "{name}: layout");
    prop_assert_eq!(m.len(), model.len(), "{}: len", name);
    prop_assert_eq!(m.is_empty(), model.is_empty(), "{}: is_empty", name);
    prop_assert_eq!(m.is_bottom(), model.is_empty(), "{}: is_bottom", name);
    prop_assert_eq!(m.iter().len(), model.len(), "{}: iter len", name);
    prop_assert_eq!(m.keys().count(), model.len(), "{}: keys", name);
    prop_assert!(m.is_canonical());
    let got: Vec<(u8, DotSet)> = m.iter().map(|(k, s)| (*k, s.clone())).collect();
    let exp: Vec<(u8, DotSet)> = model.iter().map(|(k, d)| (*k, dotset(d))).collect();
    prop_assert_eq!(&got, &exp, "{}: entries", name);
    for k in 0..=255u8 {
        let w = model.get(&k).map(|d| dotset(d));
        prop_assert_eq!(m.get(&k), w.as_ref(), "{}: get {}", name, k);
    }
    prop_assert_eq!(m, &want, "{}: eq", name);
    prop_assert_eq!(hash_of(m), hash_of(&want), "{}: hash", name);
    prop_assert_eq!(bytes(m), bytes(&want), "{}: bincode", name);
    prop_assert_eq!(
        serde_json::to_string(m).expect("encodes and decodes"),
        serde_json::to_string(&want).expect("encodes and decodes"),
        "{}: json",
        name
    );
    prop_assert_eq!(format!("{m:?}"), format!("{want:?}"), "{}: debug", name);
    // Compact codec of a causal pair.
    let mut ctx = CausalContext::new();
    for d in model.values().flatten() {
        ctx.insert(*d);
    }
    let pair = Causal::new(m.clone(), ctx.clone());
    let wpair = Causal::new(want.clone(), ctx);
    prop_assert_eq!(bytes(&pair), bytes(&wpair), "{}: compact", name);
    // (the compact decoder rejects a dot held under two keys, which `Set` ops can build)
    let all: Vec<Dot> = model.values().flatten().copied().collect();
    let unique = all.iter().collect::<std::collections::BTreeSet<_>>().len() == all.len();
    if unique {
        let back: Causal<Map> =
            bincode::serde::decode_from_slice(&bytes(&pair), bincode::config::standard())
                .expect("encodes and decodes")
                .0;
        prop_assert_eq!(back, wpair);
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Set(u8, Vec<Dot>),
    Take(u8),
    RemoveDots(Vec<Dot>),
}

fn dot() -> impl Strategy<Value = Dot> {
    (0..2usize, 1..6u64).prop_map(|(r, s)| Dot::new(R[r], s))
}
fn key() -> impl Strategy<Value = u8> {
    0..4u8
}
fn model() -> impl Strategy<Value = Model> {
    prop::collection::btree_map(key(), prop::collection::vec(dot(), 1..3), 0..3).prop_map(|m| {
        // dots unique across keys (as a correct replica builds them)
        let mut seen = std::collections::BTreeSet::new();
        m.into_iter()
            .filter_map(|(k, ds)| {
                let ds: Vec<Dot> = ds.into_iter().filter(|d| seen.insert(*d)).collect();
                (!ds.is_empty()).then_some((k, ds))
            })
            .collect()
    })
}
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (key(), prop::collection::vec(dot(), 0..3)).prop_map(|(k, d)| Op::Set(k, d)),
        key().prop_map(Op::Take),
        prop::collection::vec(dot(), 0..3).prop_map(Op::RemoveDots),
    ]
}

fn norm(d: &[Dot]) -> Vec<Dot> {
    let mut v = d.to_vec();
    v.sort();
    v.dedup();
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Every path to a value of 0..=2 keys, then each op of a random sequence on every form,
    /// agrees with the model on every observable.
    #[test]
    fn every_form_agrees_with_the_model_under_every_op(
        start in model(),
        ops in prop::collection::vec(op(), 0..8),
    ) {
        let mut model: Model = start.iter().map(|(k, d)| (*k, norm(d))).collect();
        let mut maps = forms(&start);
        for (name, m) in &maps { check(name, m, &model)?; }
        for op in ops {
            match &op {
                Op::Set(k, d) => {
                    let d = norm(d);
                    let prev_model = model.get(k).cloned();
                    if d.is_empty() { model.remove(k); } else { model.insert(*k, d.clone()); }
                    for (_, m) in &mut maps { m.set(*k, dotset(&d)); }
                    let _ = prev_model;
                }
                Op::Take(k) => {
                    let want = model.remove(k).map(|d| dotset(&d));
                    for (name, m) in &mut maps {
                        prop_assert_eq!(m.take(k), want.clone(), "{}: take", name);
                    }
                }
                Op::RemoveDots(ds) => {
                    let mut ctx = CausalContext::new();
                    for d in ds { ctx.insert(*d); }
                    let mut n = 0;
                    model.retain(|_, v| {
                        let before = v.len();
                        v.retain(|d| !ctx.contains(d));
                        n += before - v.len();
                        !v.is_empty()
                    });
                    for (name, m) in &mut maps {
                        prop_assert_eq!(m.remove_dots(&ctx), n, "{}: remove_dots", name);
                    }
                }
            }
            for (name, m) in &maps { check(name, m, &model).map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?; }
        }
    }

    /// The join's result (store and context) does not depend on which forms its operands are
    /// held in, and is commutative across forms.
    #[test]
    fn joins_do_not_depend_on_the_forms(
        a in model(), b in model(),
        ca in prop::collection::vec(dot(), 0..4), cb in prop::collection::vec(dot(), 0..4),
    ) {
        let ctx_of = |m: &Model, extra: &[Dot]| {
            let mut c = CausalContext::new();
            for d in m.values().flatten().chain(extra) { c.insert(*d); }
            c
        };
        let (xa, xb) = (ctx_of(&a, &ca), ctx_of(&b, &cb));
        let fa = forms(&a);
        let fb = forms(&b);
        let mut reference: Option<Map> = None;
        for (na, ma) in &fa {
            for (nb, mb) in &fb {
                let mut l = ma.clone();
                l.join(&xa, mb.clone(), &xb);
                let mut r = mb.clone();
                r.join(&xb, ma.clone(), &xa);
                prop_assert!(l.layout_is_valid() && r.layout_is_valid());
                prop_assert_eq!(&l, &r, "{} ⊔ {} not commutative", na, nb);
                prop_assert_eq!(hash_of(&l), hash_of(&r));
                prop_assert_eq!(bytes(&l), bytes(&r));
                prop_assert_eq!(l.len(), l.iter().count());
                prop_assert_eq!(l.is_empty(), l.iter().count() == 0);
                match &reference {
                    None => reference = Some(l.clone()),
                    Some(x) => {
                        prop_assert_eq!(x, &l, "{} ⊔ {} differs", na, nb);
                        prop_assert_eq!(bytes(x), bytes(&l));
                        prop_assert_eq!(format!("{x:?}"), format!("{l:?}"));
                    }
                }
                // Causal join too
                let mut cl = Causal::new(ma.clone(), xa.clone());
                cl.join(Causal::new(mb.clone(), xb.clone()));
                prop_assert_eq!(&cl.store, &l);
                // overriding / seen_elsewhere / unseen_by across forms
                prop_assert_eq!(ma.overriding(mb), fa[0].1.overriding(&fb[0].1));
                prop_assert_eq!(ma.unseen_by(&xb), fa[0].1.unseen_by(&xb));
                let (mut o1, mut o2) = (CausalContext::new(), CausalContext::new());
                ma.seen_elsewhere(mb, &xa, &mut o1);
                fa[0].1.seen_elsewhere(&fb[0].1, &xa, &mut o2);
                prop_assert_eq!(o1, o2);
            }
        }
    }
}
