//! The packed dot sets of `ORSet` (one dot as a per-set replica number + seq, several boxed)
//! against a plain model: each set is `BTreeMap<elem, BTreeSet<Dot>>` plus an explicit set of
//! seen dots, joined by the definition. Several sets (each numbering replicas in its own order of
//! first use) add, remove, clear, exchange deltas (applied to sets other than the one that built
//! them, out of order, duplicated) and join whole states; many replicas (hundreds) so the replica
//! tables get large and are numbered differently everywhere. After every step each set equals its
//! model (state, membership, every element's dots), keeps its layout, and sets whose models are
//! equal are equal, hash equally, print and encode identically.

use proptest::prelude::*;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use tidemark_crdts::{Dot, Lattice, ORSet, ORSetDelta, ReplicaId};

#[derive(Clone, Default, PartialEq, Debug)]
struct Model {
    m: BTreeMap<u16, BTreeSet<Dot>>,
    ctx: BTreeSet<Dot>,
}

impl Model {
    fn join(&mut self, o: &Model) {
        let keys: BTreeSet<u16> = self.m.keys().chain(o.m.keys()).copied().collect();
        let mut m = BTreeMap::new();
        let empty = BTreeSet::new();
        for k in keys {
            let a = self.m.get(&k).unwrap_or(&empty);
            let b = o.m.get(&k).unwrap_or(&empty);
            let d: BTreeSet<Dot> = a
                .iter()
                .filter(|d| b.contains(d) || !o.ctx.contains(d))
                .chain(b.iter().filter(|d| !self.ctx.contains(d)))
                .copied()
                .collect();
            if !d.is_empty() {
                m.insert(k, d);
            }
        }
        self.m = m;
        self.ctx.extend(o.ctx.iter().copied());
    }
}

fn of_delta(d: &ORSetDelta<u16>) -> Model {
    Model {
        m: d.store
            .iter()
            .map(|(e, ds)| (*e, ds.iter().copied().collect()))
            .collect(),
        ctx: d.ctx.iter_dots().collect(),
    }
}

fn of_set(s: &ORSet<u16>) -> Model {
    of_delta(&s.state())
}

fn rid(i: u16) -> ReplicaId {
    // Spread over the whole id: numbering order differs from id order.
    ReplicaId(u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
}

#[derive(Clone, Debug)]
enum Op {
    /// Set `s` adds `e` as replica `r`.
    Add(usize, u16, u16),
    Remove(usize, u16),
    Clear(usize),
    /// Delta number `i` (mod the deltas so far) is applied to set `s`.
    Deliver(usize, usize),
    /// Set `a` joins set `b`'s state.
    Join(usize, usize),
    /// Set `a` applies set `b`'s state as a delta.
    ApplyState(usize, usize),
    /// Set `s` is replaced by its decode (serde) or `from_state`.
    Rebuild(usize),
}

const SETS: usize = 4;

fn ops(replicas: u16, elems: u16) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0..SETS, 0..replicas, 0..elems).prop_map(|(s, r, e)| Op::Add(s, r, e)),
            3 => (0..SETS, 0..elems).prop_map(|(s, e)| Op::Remove(s, e)),
            1 => (0..SETS).prop_map(Op::Clear),
            6 => (0..SETS, any::<usize>()).prop_map(|(s, i)| Op::Deliver(s, i)),
            2 => (0..SETS, 0..SETS).prop_map(|(a, b)| Op::Join(a, b)),
            1 => (0..SETS, 0..SETS).prop_map(|(a, b)| Op::ApplyState(a, b)),
            1 => (0..SETS).prop_map(Op::Rebuild),
        ],
        1..120,
    )
}

fn h(s: &ORSet<u16>) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

fn run(ops: &[Op], replicas: u16) -> Result<(), TestCaseError> {
    let mut sets: Vec<ORSet<u16>> = (0..SETS).map(|_| ORSet::new()).collect();
    let mut models: Vec<Model> = vec![Model::default(); SETS];
    let mut deltas: Vec<ORSetDelta<u16>> = Vec::new();
    // Give each set a different replica numbering: set i sees replicas from a different start.
    for (i, s) in sets.iter_mut().enumerate() {
        let mut d = ORSetDelta::<u16>::default();
        for k in 0..replicas {
            let r = rid((k + i as u16 * 37) % replicas);
            d.ctx.insert(Dot::new(r, 1));
        }
        // Context only: numbers nothing (the replica table numbers only stored single dots).
        s.apply(d.clone());
        models[i].join(&of_delta(&d));
    }
    for op in ops {
        match *op {
            Op::Add(s, r, e) => {
                let d = sets[s].add(rid(r), e).expect("dots left");
                // Model: the mutator's definition.
                let dot = d
                    .store
                    .iter()
                    .next()
                    .expect("one entry")
                    .1
                    .iter()
                    .next()
                    .copied();
                let dot = dot.expect("one dot");
                prop_assert!(!models[s].ctx.contains(&dot));
                let old = models[s]
                    .m
                    .insert(e, BTreeSet::from([dot]))
                    .unwrap_or_default();
                models[s].ctx.insert(dot);
                let mut want = Model::default();
                want.m.insert(e, BTreeSet::from([dot]));
                want.ctx = old;
                want.ctx.insert(dot);
                prop_assert_eq!(of_delta(&d), want);
                deltas.push(d);
            }
            Op::Remove(s, e) => {
                let d = sets[s].remove(&e);
                let old = models[s].m.remove(&e).unwrap_or_default();
                prop_assert_eq!(
                    of_delta(&d),
                    Model {
                        m: BTreeMap::new(),
                        ctx: old
                    }
                );
                deltas.push(d);
            }
            Op::Clear(s) => {
                let d = sets[s].clear();
                let old: BTreeSet<Dot> = models[s].m.values().flatten().copied().collect();
                models[s].m.clear();
                prop_assert_eq!(
                    of_delta(&d),
                    Model {
                        m: BTreeMap::new(),
                        ctx: old
                    }
                );
                deltas.push(d);
            }
            Op::Deliver(s, i) => {
                if !deltas.is_empty() {
                    let d = deltas[i % deltas.len()].clone();
                    // The inflation applied instead gives the same set.
                    let mut via = sets[s].clone();
                    if let Some(x) = sets[s].inflation(&d) {
                        via.apply(x);
                    }
                    models[s].join(&of_delta(&d));
                    sets[s].apply(d);
                    prop_assert_eq!(&via, &sets[s]);
                }
            }
            Op::Join(a, b) => {
                let o = sets[b].clone();
                sets[a].join(o);
                let mb = models[b].clone();
                models[a].join(&mb);
            }
            Op::ApplyState(a, b) => {
                let st = sets[b].state();
                sets[a].apply(st);
                let mb = models[b].clone();
                models[a].join(&mb);
            }
            Op::Rebuild(s) => {
                let cfg = bincode::config::standard();
                let bytes = bincode::serde::encode_to_vec(&sets[s], cfg).expect("encodes");
                let (dec, _): (ORSet<u16>, usize) =
                    bincode::serde::decode_from_slice(&bytes, cfg).expect("decodes");
                prop_assert_eq!(&dec, &sets[s]);
                prop_assert_eq!(h(&dec), h(&sets[s]));
                let fs = ORSet::from_state(sets[s].state());
                prop_assert_eq!(&fs, &sets[s]);
                sets[s] = if bytes.len() % 2 == 0 { dec } else { fs };
            }
        }
        for (s, m) in sets.iter().zip(&models) {
            prop_assert!(s.layout_is_valid(), "layout after {:?}", op);
            prop_assert_eq!(&of_set(s), m, "after {:?}", op);
            prop_assert_eq!(s.len(), m.m.len());
            for e in 0..64u16 {
                let want: Vec<Dot> =
                    m.m.get(&e)
                        .map(|d| d.iter().copied().collect())
                        .unwrap_or_default();
                prop_assert_eq!(s.dots_of(&e), want);
                prop_assert_eq!(s.contains(&e), m.m.contains_key(&e));
            }
            let els: Vec<u16> = s.elements().copied().collect();
            let want: Vec<u16> = m.m.keys().copied().collect();
            prop_assert_eq!(els, want);
        }
        for a in 0..SETS {
            for b in 0..SETS {
                if models[a] == models[b] {
                    prop_assert_eq!(&sets[a], &sets[b]);
                    prop_assert_eq!(h(&sets[a]), h(&sets[b]));
                    prop_assert_eq!(format!("{:?}", sets[a]), format!("{:?}", sets[b]));
                    let cfg = bincode::config::standard();
                    prop_assert_eq!(
                        bincode::serde::encode_to_vec(&sets[a], cfg).expect("encodes"),
                        bincode::serde::encode_to_vec(&sets[b], cfg).expect("encodes")
                    );
                } else {
                    prop_assert_ne!(&sets[a], &sets[b]);
                }
            }
        }
    }
    // Everyone joins everyone: all equal.
    let mut all = ORSet::new();
    let mut mall = Model::default();
    for (s, m) in sets.iter().zip(&models) {
        all.join(s.clone());
        mall.join(m);
    }
    prop_assert_eq!(of_set(&all), mall);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Few replicas, few elements: many concurrent multi-dot elements.
    #[test]
    fn packed_sets_match_the_model_few_replicas(ops in ops(3, 6)) {
        run(&ops, 3)?;
    }

    /// 300+ replicas: large replica tables, each set numbering them differently.
    #[test]
    fn packed_sets_match_the_model_many_replicas(ops in ops(320, 40)) {
        run(&ops, 320)?;
    }
}

/// A set that sees 70,000 distinct replicas (each adding one element) numbers them all; every
/// element keeps its dot, and a set that saw them in the reverse order equals it.
#[test]
fn seventy_thousand_replicas() {
    let n = 70_000u32;
    let mut a: ORSet<u32> = ORSet::new();
    let mut deltas = Vec::new();
    for i in 0..n {
        deltas.push(a.add(ReplicaId(u128::from(i) + 1), i).expect("dots left"));
    }
    let mut b: ORSet<u32> = ORSet::new();
    for d in deltas.iter().rev() {
        b.apply(d.clone());
    }
    assert!(a.layout_is_valid() && b.layout_is_valid());
    assert_eq!(a, b);
    for i in (0..n).step_by(997) {
        assert_eq!(
            a.dots_of(&i),
            vec![Dot::new(ReplicaId(u128::from(i) + 1), 1)]
        );
    }
    let mut c = a.clone();
    c.join(b.clone());
    assert_eq!(c, a);
    // Every element removed: the replica table keeps its numbers (bounded by the context,
    // which keeps the replicas too).
    for i in 0..n {
        a.remove(&i);
    }
    assert!(a.is_empty() && a.layout_is_valid());
    assert_eq!(a.context().replicas().count(), n as usize);
}

/// Every truncation and every single-byte change of an encoding decodes to an error or to a
/// set whose layout is valid, never a panic.
#[test]
fn mutated_encodings_do_not_panic() {
    let cfg = bincode::config::standard().with_limit::<{ 1 << 20 }>();
    let bytes = bincode::serde::encode_to_vec(fixed_state(), cfg).expect("encodes");
    let mut ok = 0;
    for len in 0..bytes.len() {
        let r = bincode::serde::decode_from_slice::<ORSet<u64>, _>(&bytes[..len], cfg);
        assert!(r.is_err(), "truncation to {len} decoded");
    }
    for i in 0..bytes.len() {
        for v in 0..=255u8 {
            let mut b = bytes.clone();
            b[i] = v;
            if let Ok((s, _)) = bincode::serde::decode_from_slice::<ORSet<u64>, _>(&b, cfg) {
                assert!(s.layout_is_valid());
                let again = bincode::serde::encode_to_vec(&s, cfg).expect("encodes");
                let (t, _): (ORSet<u64>, usize) =
                    bincode::serde::decode_from_slice(&again, cfg).expect("decodes");
                assert_eq!(t, s);
                ok += 1;
            }
        }
    }
    assert!(ok > 0);
}

/// A state with single-dot elements of several replicas (first seen in an order unlike their
/// id order), multi-dot elements, an element that went from two dots back to one, and removed
/// elements' dots only in the context.
fn fixed_state() -> ORSet<u64> {
    let r = |i: u128| ReplicaId(i.wrapping_mul(0x0123_4567_89ab_cdef_0011_2233_4455_6677));
    let mut a: ORSet<u64> = ORSet::new();
    let mut b: ORSet<u64> = ORSet::new();
    for e in 0..20u64 {
        a.add(r(u128::from(e % 5) + 1), e * 1_000_003)
            .expect("dots left");
    }
    for e in 10..25u64 {
        b.add(r(u128::from(e % 3) + 7), e * 1_000_003)
            .expect("dots left");
    }
    let rm = a.remove(&3_000_009);
    a.join(b.clone());
    b.apply(rm);
    // 12_000_036 has two dots in `a`; remove one of them through a peer's context.
    let mut c = b.clone();
    c.add(r(9), 12_000_036).expect("dots left");
    a.join(c);
    a.clear();
    for e in [5u64, 77, 1 << 40] {
        a.add(r(2), e).expect("dots left");
    }
    a.join(b);
    // Concurrent adds by a replica `a` never saw: two elements with two dots each.
    let mut d: ORSet<u64> = ORSet::new();
    d.add(r(11), 15_000_045).expect("dots left");
    d.add(r(11), 77).expect("dots left");
    a.join(d);
    a
}

/// Encodings are byte-identical to `main`'s for the same logical state (the hex below is what
/// `main`'s `ORSet` encodes for `fixed_state()`).
#[test]
fn encoding_matches_main() {
    let s = fixed_state();
    let cfg = bincode::config::standard();
    let hex: String = bincode::serde::encode_to_vec(&s, cfg)
        .expect("encodes")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let json = serde_json::to_string(&s).expect("encodes");
    println!("HEX {hex}");
    println!("JSON {json}");
    println!("DEBUG {s:?}");
    assert_eq!(hex, MAIN_HEX);
    assert_eq!(json, MAIN_JSON);
    assert_eq!(format!("{s:?}"), MAIN_DEBUG);
    let (back, _): (ORSet<u64>, usize) = bincode::serde::decode_from_slice(
        &bincode::serde::encode_to_vec(&s, cfg).expect("encodes"),
        cfg,
    )
    .expect("decodes");
    assert_eq!(back, s);
    assert!(back.layout_is_valid());
}

const MAIN_HEX: &str = "09fe7766554433221100efcdab8967452301010104feeeccaa8866442200de9b5713cf8a4602010107fe653300cd99663300cd69039d36d06903010104fedc995511cd884400bc37af269e158d04010104fe5300ab5500ab5500ab055bb0055bb005010104fe41cd55de66ef770089a1b2c3d4e5f607010105feb833ab229a118900786f5e4d3c2b1a09010105fe2f9a0067cd339a00673d0ad7a3703d0a010106fe1d67abef3378bc0045d961ea72fb830c010102040501010a4d0201020804fcede1e400010801fd0000000000010000010102";

const MAIN_JSON: &str = r#"{"state":[{"dots":{"1512366075204170928972419503379277431":{"ranges":[[1,4]]},"3024732150408341857944839006758554862":{"ranges":[[1,7]]},"4537098225612512786917258510137832293":{"ranges":[[1,4]]},"6049464300816683715889678013517109724":{"ranges":[[1,4]]},"7561830376020854644862097516896387155":{"ranges":[[1,4]]},"10586562526429196502806936523654942017":{"ranges":[[1,5]]},"12098928601633367431779356027034219448":{"ranges":[[1,5]]},"13611294676837538360751775530413496879":{"ranges":[[1,6]]},"16636026827245880218696614537172051741":{"ranges":[[1,2]]}}},{"5":[[1,5]],"77":[[1,1],[8,2]],"15000045":[[8,-1]],"1099511627776":[[1,1]]}]}"#;

const MAIN_DEBUG: &str = r#"ORSet { state: Causal { store: DotMap({5: DotSet([Dot { replica: R02468acf, seq: 5 }]), 77: DotSet([Dot { replica: R02468acf, seq: 6 }, Dot { replica: R0c83fb72, seq: 2 }]), 15000045: DotSet([Dot { replica: R0c83fb72, seq: 1 }]), 1099511627776: DotSet([Dot { replica: R02468acf, seq: 7 }])}), ctx: CausalContext { dots: {R01234567: [1..=4], R02468acf: [1..=7], R0369d036: [1..=4], R048d159e: [1..=4], R05b05b05: [1..=4], R07f6e5d4: [1..=5], R091a2b3c: [1..=5], R0a3d70a3: [1..=6], R0c83fb72: [1..=2]} } } }"#;
