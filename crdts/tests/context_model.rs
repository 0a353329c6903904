//! `CausalContext` and `IntervalSet` against naive models (pitfall "non-canonical context" of
//! `docs/design/principles.md`).
//!
//! * `CausalContext` vs `BTreeSet<Dot>` over random insert / insert_range / join / diff /
//!   intersection sequences: after every step `contains` agrees on every dot of a bounded
//!   universe, the representation is canonical (per replica: ranges sorted, disjoint,
//!   non-adjacent, no seq 0, no empty entry), `version_vector()` and `cloud()` agree with the
//!   model (the cloud holds only non-contiguous dots), and every accessor (`len`, `max_seq`,
//!   `next_dot`, `own_dots_contiguous`, `cloud_ranges`, `iter_dots`, `is_subset`, return values
//!   of the mutators) agrees too. Finally the same dots inserted in two shuffled orders give `==`
//!   contexts with identical bincode bytes and hashes.
//! * `IntervalSet` vs `BTreeSet<u64>` (insert, insert_range, union, difference, intersection,
//!   is_subset, len, ...) on two windows of the `u64` range (near 0 and near `u64::MAX`, where
//!   saturating arithmetic matters); decoding accepts exactly the canonical range lists.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseResult;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use tidemark_crdts::{CausalContext, Dot, IntervalSet, ReplicaId};

// ---------------------------------------------------------------------------- CausalContext --

const REPLICAS: usize = 3;
const MAX_SEQ: u64 = 24;

#[derive(Clone, Debug)]
enum COp {
    Insert(usize, u64),
    InsertRange(usize, u64, u64),
    Join(Vec<(usize, u64, u64)>),
    Diff(Vec<(usize, u64, u64)>),
    Intersect(Vec<(usize, u64, u64)>),
}

fn range() -> impl Strategy<Value = (usize, u64, u64)> + Clone {
    (0..REPLICAS, 0..MAX_SEQ, 0u64..6).prop_map(|(r, lo, len)| (r, lo, (lo + len).min(MAX_SEQ)))
}

fn ranges() -> impl Strategy<Value = Vec<(usize, u64, u64)>> + Clone {
    proptest::collection::vec(range(), 0..5)
}

fn c_op() -> impl Strategy<Value = COp> + Clone {
    prop_oneof![
        6 => (0..REPLICAS, 0..=MAX_SEQ).prop_map(|(r, s)| COp::Insert(r, s)),
        3 => range().prop_map(|(r, lo, hi)| COp::InsertRange(r, lo, hi)),
        2 => ranges().prop_map(COp::Join),
        1 => ranges().prop_map(COp::Diff),
        1 => ranges().prop_map(COp::Intersect),
    ]
}

type Model = BTreeSet<Dot>;

fn ctx_of(rs: &[(usize, u64, u64)]) -> (CausalContext, Model) {
    let mut c = CausalContext::new();
    let mut m = Model::new();
    for &(r, lo, hi) in rs {
        c.insert_range(rid(r), lo, hi);
        for s in lo.max(1)..=hi {
            m.insert(Dot::new(rid(r), s));
        }
    }
    (c, m)
}

/// Model version vector: per replica the largest n with 1..=n all present (0 omitted).
fn model_vv(m: &Model) -> BTreeMap<ReplicaId, u64> {
    let mut vv = BTreeMap::new();
    for r in 0..=REPLICAS {
        let mut n = 0;
        while m.contains(&Dot::new(rid(r), n + 1)) {
            n += 1;
        }
        if n > 0 {
            vv.insert(rid(r), n);
        }
    }
    vv
}

fn check_canonical(c: &CausalContext) -> TestCaseResult {
    for (r, set) in c.entries() {
        prop_assert!(!set.is_empty(), "empty entry kept for {r:?}");
        let rs = set.ranges();
        prop_assert!(rs[0].0 >= 1, "seq 0 held for {r:?}");
        for w in rs.windows(2) {
            prop_assert!(
                w[0].1 + 1 < w[1].0,
                "ranges overlap or touch for {r:?}: {rs:?}"
            );
        }
        for &(lo, hi) in rs {
            prop_assert!(lo <= hi);
        }
        prop_assert_eq!(IntervalSet::from_ranges(rs.to_vec()), Some(set.clone()));
    }
    Ok(())
}

fn check_against_model(c: &CausalContext, m: &Model, other: &Model) -> TestCaseResult {
    check_canonical(c)?;
    // `contains` on the whole universe (one replica more than used, seqs past the max).
    for r in 0..=REPLICAS {
        for s in 0..=MAX_SEQ + 2 {
            let d = Dot::new(rid(r), s);
            prop_assert_eq!(c.contains(&d), m.contains(&d), "contains({:?})", d);
        }
    }
    prop_assert_eq!(c.len(), m.len() as u64);
    prop_assert_eq!(c.is_empty(), m.is_empty());
    prop_assert_eq!(c.iter_dots().collect::<Model>(), m.clone());
    let vv = model_vv(m);
    prop_assert_eq!(&c.version_vector(), &vv, "version vector");
    // The cloud: exactly the dots above each replica's prefix, none of them contiguous with it.
    let cloud: Model = m
        .iter()
        .filter(|d| d.seq > vv.get(&d.replica).copied().unwrap_or(0))
        .copied()
        .collect();
    let got_cloud = c.cloud();
    check_canonical(&got_cloud)?;
    prop_assert_eq!(
        got_cloud.iter_dots().collect::<Model>(),
        cloud.clone(),
        "cloud"
    );
    for d in got_cloud.iter_dots() {
        let n = vv.get(&d.replica).copied().unwrap_or(0);
        prop_assert!(d.seq > n + 1, "cloud holds {d:?}, contiguous with vv {n}");
    }
    let runs: usize = got_cloud.entries().map(|(_, s)| s.ranges().len()).sum();
    prop_assert_eq!(c.cloud_ranges(), runs);
    // vv ⊔ cloud == ctx, and the vv part is disjoint from the cloud.
    let mut rebuilt = CausalContext::from_version_vector(&vv);
    prop_assert!(rebuilt.intersection(&got_cloud).is_empty());
    rebuilt.join(&got_cloud);
    prop_assert_eq!(&rebuilt, c);
    for r in 0..=REPLICAS {
        let mine: Vec<u64> = m
            .iter()
            .filter(|d| d.replica == rid(r))
            .map(|d| d.seq)
            .collect();
        let max = mine.last().copied().unwrap_or(0);
        prop_assert_eq!(c.max_seq(rid(r)), max);
        prop_assert_eq!(
            c.next_dot(rid(r)).expect("dots left"),
            Dot::new(rid(r), max + 1)
        );
        let contiguous = mine.iter().enumerate().all(|(i, s)| *s == i as u64 + 1);
        prop_assert_eq!(c.own_dots_contiguous(rid(r)), contiguous);
        prop_assert_eq!(c.get(&rid(r)).is_some(), !mine.is_empty());
    }
    let (oc, _) = (ctx_from_model(other), ());
    prop_assert_eq!(c.is_subset(&oc), m.is_subset(other), "is_subset");
    prop_assert_eq!(oc.is_subset(c), other.is_subset(m), "is_subset (other way)");
    Ok(())
}

fn ctx_from_model(m: &Model) -> CausalContext {
    m.iter().copied().collect()
}

fn hash_of<T: Hash>(x: &T) -> u64 {
    let mut h = DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

#[test]
fn causal_context_matches_btreeset_model() {
    check(
        "causal_context_matches_btreeset_model",
        CASES,
        (
            proptest::collection::vec(c_op(), 0..40),
            ranges(),
            any::<u64>(),
        ),
        |(ops, probe, shuffle_seed)| {
            let (_, other) = ctx_of(&probe);
            let mut c = CausalContext::new();
            let mut m = Model::new();
            for op in &ops {
                match op {
                    COp::Insert(r, s) => {
                        let d = Dot::new(rid(*r), *s);
                        let new = *s > 0 && m.insert(d);
                        prop_assert_eq!(c.insert(d), new, "insert({:?}) return value", d);
                    }
                    COp::InsertRange(r, lo, hi) => {
                        let before = m.len();
                        for s in (*lo).max(1)..=*hi {
                            m.insert(Dot::new(rid(*r), s));
                        }
                        prop_assert_eq!(c.insert_range(rid(*r), *lo, *hi), m.len() > before);
                    }
                    COp::Join(rs) => {
                        let (o, om) = ctx_of(rs);
                        let before = m.len();
                        m.extend(om);
                        prop_assert_eq!(c.join(&o), m.len() > before, "join return value");
                    }
                    COp::Diff(rs) => {
                        let (o, om) = ctx_of(rs);
                        m = m.difference(&om).copied().collect();
                        c = c.diff(&o);
                    }
                    COp::Intersect(rs) => {
                        let (o, om) = ctx_of(rs);
                        m = m.intersection(&om).copied().collect();
                        c = c.intersection(&o);
                    }
                }
                check_against_model(&c, &m, &other)?;
            }
            // Canonical bytes: the same dots inserted in two shuffled orders.
            let mut rng = SplitMix64::new(shuffle_seed);
            let mut dots: Vec<Dot> = m.iter().copied().collect();
            rng.shuffle(&mut dots);
            let a: CausalContext = dots.iter().copied().collect();
            rng.shuffle(&mut dots);
            let mut b = CausalContext::new();
            for d in &dots {
                b.insert(*d);
            }
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(&a, &c);
            prop_assert_eq!(encode(&a), encode(&b), "bytes depend on insertion order");
            prop_assert_eq!(
                encode(&a),
                encode(&c),
                "bytes depend on how the context was built"
            );
            prop_assert_eq!(hash_of(&a), hash_of(&b));
            prop_assert_eq!(&roundtrip(&c), &c);
            Ok(())
        },
    );
}

// ------------------------------------------------------------------------------ IntervalSet --

const WINDOW: u64 = 40;

/// A value in one of the two windows `0..=WINDOW` and `u64::MAX-WINDOW..=u64::MAX`.
fn val() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![0..=WINDOW, (u64::MAX - WINDOW)..=u64::MAX]
}

/// A range inside one window.
fn irange() -> impl Strategy<Value = (u64, u64)> + Clone {
    (val(), 0u64..8).prop_map(|(lo, len)| {
        let top = if lo <= WINDOW { WINDOW } else { u64::MAX };
        (lo, lo.saturating_add(len).min(top))
    })
}

fn universe() -> impl Iterator<Item = u64> {
    (0..=WINDOW + 2).chain((u64::MAX - WINDOW - 2)..=u64::MAX)
}

#[derive(Clone, Debug)]
enum IOp {
    Insert(u64),
    InsertRange(u64, u64),
    Union(Vec<(u64, u64)>),
    Difference(Vec<(u64, u64)>),
    Intersection(Vec<(u64, u64)>),
}

fn i_op() -> impl Strategy<Value = IOp> + Clone {
    let rs = proptest::collection::vec(irange(), 0..5);
    prop_oneof![
        5 => val().prop_map(IOp::Insert),
        3 => irange().prop_map(|(a, b)| IOp::InsertRange(a, b)),
        2 => rs.clone().prop_map(IOp::Union),
        1 => rs.clone().prop_map(IOp::Difference),
        1 => rs.prop_map(IOp::Intersection),
    ]
}

fn iset_of(rs: &[(u64, u64)]) -> (IntervalSet, BTreeSet<u64>) {
    let mut s = IntervalSet::new();
    let mut m = BTreeSet::new();
    for &(lo, hi) in rs {
        s.insert_range(lo, hi);
        m.extend(lo..=hi);
    }
    (s, m)
}

fn check_iset(
    s: &IntervalSet,
    m: &BTreeSet<u64>,
    other: &(IntervalSet, BTreeSet<u64>),
    probe: (u64, u64),
) -> TestCaseResult {
    let rs = s.ranges();
    for w in rs.windows(2) {
        prop_assert!(
            w[0].1 < w[1].0 && w[0].1 + 1 < w[1].0,
            "not canonical: {rs:?}"
        );
    }
    for &(lo, hi) in rs {
        prop_assert!(lo <= hi);
    }
    prop_assert_eq!(IntervalSet::from_ranges(rs.to_vec()), Some(s.clone()));
    for v in universe() {
        prop_assert_eq!(s.contains(v), m.contains(&v), "contains({})", v);
    }
    prop_assert_eq!(s.len(), m.len() as u64);
    prop_assert_eq!(s.is_empty(), m.is_empty());
    prop_assert_eq!(s.max(), m.last().copied());
    prop_assert_eq!(s.iter().collect::<BTreeSet<u64>>(), m.clone());
    let runs = m
        .iter()
        .zip(m.iter().skip(1))
        .filter(|(a, b)| **a + 1 != **b)
        .count()
        + usize::from(!m.is_empty());
    prop_assert_eq!(rs.len(), runs, "ranges are not maximal");
    let mut n = 0;
    while m.contains(&(n + 1)) {
        n += 1;
    }
    prop_assert_eq!(s.contiguous_prefix(), n);
    let (lo, hi) = probe;
    prop_assert_eq!(
        s.contains_range(lo, hi),
        (lo..=hi).all(|v| m.contains(&v)),
        "contains_range({}, {})",
        lo,
        hi
    );
    prop_assert_eq!(s.is_subset(&other.0), m.is_subset(&other.1));
    prop_assert_eq!(other.0.is_subset(s), other.1.is_subset(m));
    Ok(())
}

#[test]
fn interval_set_matches_btreeset_model() {
    check(
        "interval_set_matches_btreeset_model",
        CASES,
        (
            proptest::collection::vec(i_op(), 0..40),
            proptest::collection::vec(irange(), 0..5),
            irange(),
            any::<u64>(),
        ),
        |(ops, other, probe, shuffle_seed)| {
            let other = iset_of(&other);
            let mut s = IntervalSet::new();
            let mut m = BTreeSet::new();
            for op in &ops {
                match op {
                    IOp::Insert(v) => {
                        let new = m.insert(*v);
                        prop_assert_eq!(s.insert(*v), new, "insert({}) return value", v);
                    }
                    IOp::InsertRange(lo, hi) => {
                        let before = m.len();
                        m.extend(*lo..=*hi);
                        prop_assert_eq!(s.insert_range(*lo, *hi), m.len() > before);
                    }
                    IOp::Union(rs) => {
                        let (o, om) = iset_of(rs);
                        let before = m.len();
                        m.extend(om);
                        prop_assert_eq!(
                            s.union_with(&o),
                            m.len() > before,
                            "union_with return value"
                        );
                    }
                    IOp::Difference(rs) => {
                        let (o, om) = iset_of(rs);
                        m = m.difference(&om).copied().collect();
                        s = s.difference(&o);
                    }
                    IOp::Intersection(rs) => {
                        let (o, om) = iset_of(rs);
                        m = m.intersection(&om).copied().collect();
                        s = s.intersection(&o);
                    }
                }
                check_iset(&s, &m, &other, probe)?;
            }
            // Order independence of the canonical form and bytes.
            let mut vals: Vec<u64> = m.iter().copied().collect();
            SplitMix64::new(shuffle_seed).shuffle(&mut vals);
            let mut t = IntervalSet::new();
            for v in &vals {
                t.insert(*v);
            }
            prop_assert_eq!(&t, &s);
            prop_assert_eq!(encode(&t), encode(&s));
            prop_assert_eq!(&roundtrip(&s), &s);
            Ok(())
        },
    );
}

/// Decoding accepts exactly the canonical range lists (sorted, disjoint, non-adjacent, `lo <= hi`).
#[test]
fn interval_set_decode_rejects_non_canonical() {
    check(
        "interval_set_decode_rejects_non_canonical",
        CASES,
        proptest::collection::vec((0u64..30, 0u64..30), 0..5),
        |raw| {
            let bytes = encode(&raw);
            let decoded = decode::<IntervalSet>(&bytes);
            match IntervalSet::from_ranges(raw.clone()) {
                Some(s) => prop_assert_eq!(decoded, Ok(s)),
                None => prop_assert!(decoded.is_err(), "non-canonical {raw:?} decoded"),
            }
            Ok(())
        },
    );
}
