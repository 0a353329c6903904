//! Lattice laws per type.
//!
//! States come from random op histories on 2–4 replicas with random partial deliveries and state
//! joins, so contexts carry clouds and gaps; the pool of lattice elements for each case is every
//! replica's final state, every delta issued on the way (as a state) and bottom.
//!
//! For each type, every case checks: join commutative, associative, idempotent; monotone
//! (`x ⊔ (x ⊔ y) == x ⊔ y`, same for `y`); the delta law `m(X) == X ⊔ m^δ(X)` (mutator applied to
//! a clone vs. the returned delta joined into the original); and `decode(encode(X)) == X`.
//! Each law therefore runs on `CASES` (2,000; 20,000 with `SOAK=1`) cases per type.

mod common;

use common::pools::*;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseResult;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use tidemark_crdts::{
    CausalContext, DedupMarks, Dot, GCounter, KeyKind, LWWRegister, Lattice, MVRegister, Mutation,
    ORSet, PNCounter, Store, Value,
};

/// Commutativity, associativity, idempotence and monotonicity of `j` on `x, y, z`.
fn join_laws<T: Clone + PartialEq + Debug>(
    x: &T,
    y: &T,
    z: &T,
    j: impl Fn(&T, &T) -> T,
) -> TestCaseResult {
    let xy = j(x, y);
    prop_assert_eq!(&xy, &j(y, x), "commutativity: x ⊔ y != y ⊔ x");
    prop_assert_eq!(
        j(&xy, z),
        j(x, &j(y, z)),
        "associativity: (x ⊔ y) ⊔ z != x ⊔ (y ⊔ z)"
    );
    prop_assert_eq!(&j(x, x), x, "idempotence: x ⊔ x != x");
    prop_assert_eq!(&j(x, &xy), &xy, "monotone: x ⋢ x ⊔ y");
    prop_assert_eq!(&j(y, &xy), &xy, "monotone: y ⋢ x ⊔ y");
    Ok(())
}

/// Picks three pool elements.
fn pick3<T>(pool: &[T], p: [usize; 3]) -> (&T, &T, &T) {
    let n = pool.len();
    (&pool[p[0] % n], &pool[p[1] % n], &pool[p[2] % n])
}

fn roundtrip_law<T>(x: &T) -> TestCaseResult
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + Debug,
{
    prop_assert_eq!(&roundtrip(x), x, "decode(encode(x)) != x");
    Ok(())
}

// ------------------------------------------------------------------------------------ ORSet --

fn orset_join(a: &ORSet<u8>, b: &ORSet<u8>) -> ORSet<u8> {
    let mut a = a.clone();
    a.join(b.clone());
    a
}

#[test]
fn orset_laws() {
    let clouds = AtomicUsize::new(0);
    check(
        "orset_laws",
        CASES,
        (
            history(set_op(), 40),
            any::<[usize; 3]>(),
            any::<usize>(),
            set_op(),
        ),
        |((n, steps), picks, who, op)| {
            let b = orset_history(n, &steps);
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| ORSet::from_state(d)));
            pool.push(ORSet::new());
            if pool[..n].iter().any(|s| s.state().ctx.cloud_ranges() > 0) {
                clouds.fetch_add(1, Ordering::Relaxed);
            }
            let (x, y, z) = pick3(&pool, picks);
            join_laws(x, y, z, orset_join)?;
            for s in [x, y, z] {
                prop_assert!(s.state().dots_within_context(), "I3 violated: {s:?}");
                prop_assert!(s.state().store.is_canonical(), "empty child kept: {s:?}");
                roundtrip_law(s)?;
            }
            // Delta law on a replica's own state, mutating as that replica.
            let r = who % n;
            let x = &pool[r];
            let mut mutated = x.clone();
            let delta = apply_set_op(&mut mutated, r, op);
            prop_assert!(delta.dots_within_context(), "delta violates I3: {delta:?}");
            let mut joined = x.clone();
            joined.apply(delta.clone());
            prop_assert_eq!(&joined, &mutated, "delta law: X ⊔ m^δ(X) != m(X)");
            prop_assert!(x.state().ctx.own_dots_contiguous(rid(r)));
            match op {
                SetOp::Add(e) => prop_assert!(mutated.contains(&e)),
                SetOp::Remove(e) => prop_assert!(!mutated.contains(&e)),
                SetOp::Clear => prop_assert!(mutated.is_empty()),
            }
            roundtrip_law(&delta)?;
            Ok(())
        },
    );
    assert_cloud_coverage(&clouds);
}

/// Guards the generator: a good share of cases must reach contexts with clouds (gaps).
fn assert_cloud_coverage(clouds: &AtomicUsize) {
    let n = clouds.load(Ordering::Relaxed);
    eprintln!(
        "{n} of {} cases reached a replica context with a cloud",
        cases(CASES)
    );
    assert!(
        n as u32 >= cases(CASES) / 20,
        "only {n} cases reached a context with a cloud"
    );
}

// ------------------------------------------------------------------------------- MVRegister --

fn mvreg_join(a: &MVRegister<u8>, b: &MVRegister<u8>) -> MVRegister<u8> {
    let mut a = a.clone();
    a.join(b.clone());
    a
}

#[test]
fn mvreg_laws() {
    check(
        "mvreg_laws",
        CASES,
        (
            history(reg_op(), 32),
            any::<[usize; 3]>(),
            any::<usize>(),
            reg_op(),
        ),
        |((n, steps), picks, who, op)| {
            let b = mvreg_history(n, &steps);
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| MVRegister::from_state(d)));
            pool.push(MVRegister::new());
            let (x, y, z) = pick3(&pool, picks);
            join_laws(x, y, z, mvreg_join)?;
            for s in [x, y, z] {
                prop_assert!(s.state().dots_within_context());
                roundtrip_law(s)?;
            }
            let r = who % n;
            let x = &pool[r];
            let mut mutated = x.clone();
            let delta = apply_reg_op(&mut mutated, r, op);
            let mut joined = x.clone();
            joined.apply(delta.clone());
            prop_assert_eq!(&joined, &mutated, "delta law: X ⊔ m^δ(X) != m(X)");
            match op {
                RegOp::Write(v) => prop_assert_eq!(mutated.read(), vec![&v]),
                RegOp::Clear => prop_assert!(mutated.read().is_empty()),
            }
            roundtrip_law(&delta)?;
            Ok(())
        },
    );
}

// -------------------------------------------------------------------------------- Counters --

fn gjoin(a: &GCounter, b: &GCounter) -> GCounter {
    let mut a = a.clone();
    a.join(b.clone());
    a
}

#[test]
fn gcounter_laws() {
    check(
        "gcounter_laws",
        CASES,
        (
            history(amount(), 24),
            any::<[usize; 3]>(),
            any::<usize>(),
            amount(),
        ),
        |((n, steps), picks, who, by)| {
            let b = gcounter_history(n, &steps);
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| d));
            pool.push(GCounter::new());
            let (x, y, z) = pick3(&pool, picks);
            join_laws(x, y, z, gjoin)?;
            for s in [x, y, z] {
                roundtrip_law(s)?;
            }
            let r = who % n;
            let x = &pool[r];
            let mut mutated = x.clone();
            let delta = mutated.inc(rid(r), by);
            prop_assert_eq!(&gjoin(x, &delta), &mutated, "delta law");
            prop_assert_eq!(mutated.value(), x.value().saturating_add(by));
            prop_assert_eq!(mutated.get(rid(r)), x.get(rid(r)).saturating_add(by));
            Ok(())
        },
    );
}

fn pnjoin(a: &PNCounter, b: &PNCounter) -> PNCounter {
    let mut a = a.clone();
    a.join(b.clone());
    a
}

#[test]
fn pncounter_laws() {
    check(
        "pncounter_laws",
        CASES,
        (
            history(pn_op(), 24),
            any::<[usize; 3]>(),
            any::<usize>(),
            pn_op(),
        ),
        |((n, steps), picks, who, op)| {
            let b = pn_history(n, &steps);
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| d));
            pool.push(PNCounter::new());
            let (x, y, z) = pick3(&pool, picks);
            join_laws(x, y, z, pnjoin)?;
            for s in [x, y, z] {
                roundtrip_law(s)?;
            }
            let r = who % n;
            let x = &pool[r];
            let mut mutated = x.clone();
            let delta = apply_pn(&mut mutated, r, op);
            prop_assert_eq!(&pnjoin(x, &delta), &mutated, "delta law");
            let expect = i128::from(mutated.p.value()) - i128::from(mutated.n.value());
            prop_assert_eq!(
                i128::from(mutated.value()),
                expect.clamp(i128::from(i64::MIN), i128::from(i64::MAX))
            );
            Ok(())
        },
    );
}

// ------------------------------------------------------------------------------ LWWRegister --

fn lwwjoin(a: &LWWRegister<u8>, b: &LWWRegister<u8>) -> LWWRegister<u8> {
    let mut a = a.clone();
    a.join(b.clone());
    a
}

#[test]
fn lww_laws_with_forced_equal_timestamps() {
    check(
        "lww_laws_with_forced_equal_timestamps",
        CASES,
        (
            history(lww_op(), 16),
            any::<[usize; 3]>(),
            any::<usize>(),
            lww_op(),
        ),
        |((n, steps), picks, who, (ts, v))| {
            let b = lww_history(n, &steps);
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| d));
            pool.push(LWWRegister::new());
            let (x, y, z) = pick3(&pool, picks);
            join_laws(x, y, z, lwwjoin)?;
            for s in [x, y, z] {
                roundtrip_law(s)?;
            }
            let x = &pool[who % pool.len()];
            let mut mutated = x.clone();
            let delta = mutated.write(ts, v);
            prop_assert_eq!(&lwwjoin(x, &delta), &mutated, "delta law");
            // The register holds the max (timestamp, value) ever written into it.
            let want = match (x.timestamp(), x.read()) {
                (Some(t), Some(old)) => (t, *old).max((ts, v)),
                _ => (ts, v),
            };
            prop_assert_eq!(
                (mutated.timestamp(), mutated.read()),
                (Some(want.0), Some(&want.1))
            );
            Ok(())
        },
    );
}

// --------------------------------------------------------------------------- CausalContext --

#[derive(Clone, Copy, Debug)]
enum CtxOp {
    Insert(usize, u64),
    Range(usize, u64, u64),
}

fn ctx_op() -> impl Strategy<Value = CtxOp> + Clone {
    prop_oneof![
        3 => (0usize..3, 0u64..14).prop_map(|(r, s)| CtxOp::Insert(r, s)),
        1 => (0usize..3, 0u64..14, 0u64..4).prop_map(|(r, lo, len)| CtxOp::Range(r, lo, lo + len)),
    ]
}

fn apply_ctx_op(c: &mut CausalContext, op: CtxOp) -> (bool, CausalContext) {
    match op {
        CtxOp::Insert(r, s) => (
            c.insert(Dot::new(rid(r), s)),
            CausalContext::from_dot(Dot::new(rid(r), s)),
        ),
        CtxOp::Range(r, lo, hi) => (
            c.insert_range(rid(r), lo, hi),
            CausalContext::from_range(rid(r), lo, hi),
        ),
    }
}

fn cjoin(a: &CausalContext, b: &CausalContext) -> CausalContext {
    let mut a = a.clone();
    a.join(b);
    a
}

#[test]
fn causal_context_laws() {
    check(
        "causal_context_laws",
        CASES,
        (
            history(ctx_op(), 32),
            any::<[usize; 3]>(),
            any::<usize>(),
            ctx_op(),
        ),
        |((n, steps), picks, who, op)| {
            let b = build(
                n,
                &steps,
                |_| CausalContext::new(),
                |c, _, o, _| apply_ctx_op(c, *o).1,
                |c, d| {
                    c.join(&d);
                },
                |c, o| {
                    c.join(o);
                },
            );
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| d));
            pool.push(CausalContext::new());
            let (x, y, z) = pick3(&pool, picks);
            join_laws(x, y, z, cjoin)?;
            // join reports growth exactly when the result differs.
            let mut g = x.clone();
            let grew = g.join(y);
            prop_assert_eq!(grew, &g != x, "join's return value");
            prop_assert_eq!(x.is_subset(&g) && y.is_subset(&g), true);
            for s in [x, y, z] {
                roundtrip_law(s)?;
            }
            let x = &pool[who % pool.len()];
            let mut mutated = x.clone();
            let (grew, delta) = apply_ctx_op(&mut mutated, op);
            prop_assert_eq!(&cjoin(x, &delta), &mutated, "delta law");
            prop_assert_eq!(grew, &mutated != x, "insert's return value");
            Ok(())
        },
    );
}

// ------------------------------------------------------------------------------- DedupMarks --

#[test]
fn dedup_marks_laws() {
    fn djoin(a: &DedupMarks, b: &DedupMarks) -> DedupMarks {
        let mut a = a.clone();
        a.join(b);
        a
    }
    let op = (0u8..2, 0u8..2, 0u64..12);
    check(
        "dedup_marks_laws",
        CASES,
        (
            history(op.clone(), 20),
            any::<[usize; 3]>(),
            any::<usize>(),
            op,
        ),
        |((n, steps), picks, who, (st, src, seq))| {
            let name = |i: u8| format!("s{i}");
            let b = build(
                n,
                &steps,
                |_| DedupMarks::new(),
                |m, _, (st, src, seq), _| {
                    m.insert(&name(*st), &name(*src), *seq);
                    let mut d = DedupMarks::new();
                    d.insert(&name(*st), &name(*src), *seq);
                    d
                },
                |m, d| {
                    m.join(&d);
                },
                |m, o| {
                    m.join(o);
                },
            );
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| d));
            pool.push(DedupMarks::new());
            let (x, y, z) = pick3(&pool, picks);
            join_laws(x, y, z, djoin)?;
            // The returned "new" part is a redundancy removal: x ⊔ new == x ⊔ y, and empty iff y ⊑ x.
            let mut g = x.clone();
            let fresh = g.join(y);
            prop_assert_eq!(&djoin(x, &fresh), &g);
            prop_assert_eq!(fresh.is_empty(), &g == x);
            for s in [x, y, z] {
                roundtrip_law(s)?;
            }
            let x = &pool[who % pool.len()];
            let mut mutated = x.clone();
            let was_new = mutated.insert(&name(st), &name(src), seq);
            prop_assert_eq!(was_new, !x.contains(&name(st), &name(src), seq));
            prop_assert!(mutated.contains(&name(st), &name(src), seq));
            Ok(())
        },
    );
}

// ------------------------------------------------------------------------------------ Store --

#[test]
fn store_laws() {
    let clouds = AtomicUsize::new(0);
    check(
        "store_laws",
        CASES,
        (
            history(store_op(), 32),
            any::<[usize; 3]>(),
            any::<usize>(),
            store_op(),
        ),
        |((n, steps), picks, who, op)| {
            let b = store_history(n, &steps);
            let deltas: Vec<_> = b.log.into_iter().map(|(_, d)| d).collect();
            let mut pool = b.replicas;
            pool.extend(deltas.iter().cloned().map(store_of));
            pool.push(Store::new());
            if pool[..n].iter().any(|s| s.context().cloud_ranges() > 0) {
                clouds.fetch_add(1, Ordering::Relaxed);
            }
            let (x, y, z) = pick3(&pool, picks);
            join_laws(x, y, z, sjoin)?;
            for s in [x, y, z, &sjoin(x, y)] {
                check_store_invariants(s).map_err(TestCaseError::fail)?;
                // decode(encode(X)) == X through the whole-state delta.
                let d = s.to_delta();
                let back = roundtrip(&d);
                prop_assert_eq!(&back, &d, "decode(encode(to_delta)) != to_delta");
                prop_assert_eq!(
                    &store_of(back),
                    s,
                    "store rebuilt from decoded state differs"
                );
            }
            for d in &deltas {
                prop_assert!(d.dots_within_context(), "delta violates I3: {d:?}");
                prop_assert_eq!(&roundtrip(d), d);
            }
            // Delta law on a replica's own state.
            let r = who % n;
            let x = &pool[r];
            prop_assert!(x.context().own_dots_contiguous(rid(r)));
            let (key, m) = store_mutation(op, true);
            let mut mutated = x.clone();
            let delta = mutated
                .mutate(rid(r), &key, &m, Some(law_ts(op, r)))
                .expect("valid mutation");
            let mut joined = x.clone();
            joined.apply(delta.clone());
            prop_assert_eq!(&joined, &mutated, "delta law: X ⊔ m^δ(X) != m(X)");
            // The mutation took exactly one fresh dot: the next one of this replica.
            prop_assert_eq!(mutated.context().len(), x.context().len() + 1);
            prop_assert!(
                mutated
                    .context()
                    .contains(&x.context().next_dot(rid(r)).expect("dots left"))
            );
            // And did what it says.
            let before = x.get(&key);
            let after = mutated.get(&key);
            match (&m, &before, &after) {
                (Mutation::Inc(by), Value::GCounter(b), Value::GCounter(a)) => {
                    prop_assert_eq!(*a, b.saturating_add(*by).max(*b))
                }
                (Mutation::Inc(_), Value::PNCounter(b), Value::PNCounter(a)) => {
                    prop_assert!(a >= b)
                }
                (Mutation::Dec(_), Value::PNCounter(b), Value::PNCounter(a)) => {
                    prop_assert!(a <= b)
                }
                (Mutation::Add(e), _, Value::ORSet(a)) => prop_assert!(a.contains(e)),
                (Mutation::Remove(e), Value::ORSet(b), Value::ORSet(a)) => {
                    let mut want = b.clone();
                    want.retain(|x| x != e);
                    prop_assert_eq!(a, &want)
                }
                (Mutation::Set(v), _, Value::MvReg(a)) => prop_assert_eq!(a, &vec![v.clone()]),
                (Mutation::Set(v), _, Value::Lww(a)) if key.kind == KeyKind::Lww => {
                    // Max timestamp wins: the write shows unless a larger timestamp survives
                    // (impossible: the write overwrote every value this replica held).
                    prop_assert_eq!(a, &Some(v.clone()))
                }
                (Mutation::Delete, _, a) => prop_assert_eq!(a, &Value::empty(key.kind)),
                (m, b, a) => prop_assert!(false, "unexpected {m:?}: {b:?} -> {a:?}"),
            }
            prop_assert!(
                !mutated
                    .entries()
                    .get(&key)
                    .is_some_and(tidemark_crdts::DotStore::is_bottom)
            );
            Ok(())
        },
    );
    assert_cloud_coverage(&clouds);
}
