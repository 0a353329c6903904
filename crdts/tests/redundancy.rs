//! Redundancy removal (`docs/design/principles.md`, "BP and RR"): for random states X and deltas δ,
//! `X ⊔ inflation(X, δ) == X ⊔ δ`; the inflation is `None` exactly when δ ⊑ X (so in particular
//! for δ against `X ⊔ δ`); and the inflation is a part of δ (its context and dots are δ's).
//!
//! Per type: ORSet and MVRegister (`Causal::inflation`), GCounter, PNCounter, LWWRegister, and the
//! store (`JoinOutcome.inflation` from `join_delta`, applied to a clone of the pre-join store,
//! plus `JoinOutcome.changed` against the keys that really changed).

mod common;

use common::pools::*;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseResult;
use std::collections::BTreeSet;
use std::fmt::Debug;
use tidemark_crdts::dotstore::Causal;
use tidemark_crdts::{DotStore, Lattice, MVRegister, ORSet, Store};

/// The law for one `(X, δ)`.
fn redundancy_law<T: Clone + PartialEq + Debug, D: Clone + Debug>(
    x: &T,
    d: &D,
    join: impl Fn(&T, &D) -> T,
    inflation: impl Fn(&T, &D) -> Option<D>,
) -> TestCaseResult {
    let full = join(x, d);
    match inflation(x, d) {
        None => prop_assert_eq!(&full, x, "inflation is None but δ ⋢ X"),
        Some(i) => {
            prop_assert_eq!(
                &join(x, &i),
                &full,
                "X ⊔ inflation(X, δ) != X ⊔ δ (inflation {:?})",
                i
            );
            prop_assert_ne!(&full, x, "inflation is Some but δ ⊑ X: {:?}", i);
        }
    }
    prop_assert!(
        inflation(&full, d).is_none(),
        "δ ⊑ X ⊔ δ but inflation(X ⊔ δ, δ) is Some"
    );
    Ok(())
}

/// The inflation of a causal delta is part of it: its context within δ's, its dots within δ's.
fn part_of<S: DotStore>(i: &Causal<S>, d: &Causal<S>) -> TestCaseResult {
    prop_assert!(i.ctx.is_subset(&d.ctx), "inflation context not within δ's");
    prop_assert!(
        i.store.dots().is_subset(&d.store.dots()),
        "inflation dots not within δ's"
    );
    prop_assert!(i.dots_within_context(), "inflation violates I3");
    Ok(())
}

fn pick<T>(v: &[T], i: usize) -> &T {
    &v[i % v.len()]
}

#[test]
fn orset_redundancy() {
    check(
        "orset_redundancy",
        CASES,
        (history(set_op(), 40), any::<usize>(), any::<usize>()),
        |((n, steps), xi, di)| {
            let b = orset_history(n, &steps);
            let mut deltas: Vec<_> = b.log.iter().map(|(_, d)| d.clone()).collect();
            deltas.extend(b.replicas.iter().map(|s| s.state().clone()));
            let mut states = b.replicas.clone();
            states.extend(b.log.into_iter().map(|(_, d)| ORSet::from_state(d)));
            let (x, d) = (pick(&states, xi), pick(&deltas, di));
            redundancy_law(
                x,
                d,
                |x, d| {
                    let mut x = x.clone();
                    x.apply(d.clone());
                    x
                },
                |x, d| x.inflation(d),
            )?;
            if let Some(i) = x.inflation(d) {
                part_of(&i, d)?;
            }
            Ok(())
        },
    );
}

#[test]
fn mvreg_redundancy() {
    check(
        "mvreg_redundancy",
        CASES,
        (history(reg_op(), 32), any::<usize>(), any::<usize>()),
        |((n, steps), xi, di)| {
            let b = mvreg_history(n, &steps);
            let mut deltas: Vec<_> = b.log.iter().map(|(_, d)| d.clone()).collect();
            deltas.extend(b.replicas.iter().map(|s| s.state().clone()));
            let mut states = b.replicas.clone();
            states.extend(b.log.into_iter().map(|(_, d)| MVRegister::from_state(d)));
            let (x, d) = (pick(&states, xi), pick(&deltas, di));
            redundancy_law(
                x,
                d,
                |x, d| {
                    let mut x = x.clone();
                    x.apply(d.clone());
                    x
                },
                |x, d| x.inflation(d),
            )?;
            if let Some(i) = x.inflation(d) {
                part_of(&i, d)?;
            }
            Ok(())
        },
    );
}

fn lattice_join<T: Lattice + Clone>(x: &T, d: &T) -> T {
    let mut x = x.clone();
    x.join(d.clone());
    x
}

#[test]
fn gcounter_redundancy() {
    check(
        "gcounter_redundancy",
        CASES,
        (history(amount(), 24), any::<usize>(), any::<usize>()),
        |((n, steps), xi, di)| {
            let b = gcounter_history(n, &steps);
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| d));
            redundancy_law(pick(&pool, xi), pick(&pool, di), lattice_join, |x, d| {
                x.inflation(d)
            })
        },
    );
}

#[test]
fn pncounter_redundancy() {
    check(
        "pncounter_redundancy",
        CASES,
        (history(pn_op(), 24), any::<usize>(), any::<usize>()),
        |((n, steps), xi, di)| {
            let b = pn_history(n, &steps);
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| d));
            redundancy_law(pick(&pool, xi), pick(&pool, di), lattice_join, |x, d| {
                x.inflation(d)
            })
        },
    );
}

#[test]
fn lww_redundancy() {
    check(
        "lww_redundancy",
        CASES,
        (history(lww_op(), 16), any::<usize>(), any::<usize>()),
        |((n, steps), xi, di)| {
            let b = lww_history(n, &steps);
            let mut pool = b.replicas;
            pool.extend(b.log.into_iter().map(|(_, d)| d));
            redundancy_law(pick(&pool, xi), pick(&pool, di), lattice_join, |x, d| {
                x.inflation(d)
            })
        },
    );
}

#[test]
fn store_join_delta_inflation() {
    check(
        "store_join_delta_inflation",
        CASES,
        (history(store_op(), 32), any::<usize>(), any::<usize>()),
        |((n, steps), xi, di)| {
            let b = store_history(n, &steps);
            let mut deltas: Vec<_> = b.log.iter().map(|(_, d)| d.clone()).collect();
            deltas.extend(b.replicas.iter().map(Store::to_delta));
            let mut states = b.replicas.clone();
            states.extend(b.log.into_iter().map(|(_, d)| store_of(d)));
            let pre = pick(&states, xi).clone();
            let d = pick(&deltas, di).clone();

            let mut post = pre.clone();
            let out = post.apply(d.clone());
            check_store_invariants(&post).map_err(TestCaseError::fail)?;
            match &out.inflation {
                None => prop_assert_eq!(&post, &pre, "inflation is None but the store changed"),
                Some(i) => {
                    let mut via = pre.clone();
                    via.apply(i.clone());
                    prop_assert_eq!(
                        &via,
                        &post,
                        "pre ⊔ inflation != pre ⊔ δ (inflation {:?})",
                        i
                    );
                    prop_assert_ne!(&post, &pre, "inflation is Some but δ ⊑ X: {:?}", i);
                    part_of(i, &d)?;
                }
            }
            // `changed` names exactly the keys whose entries changed, once each.
            let really: BTreeSet<_> = pre
                .entries()
                .keys()
                .chain(post.entries().keys())
                .filter(|k| pre.entries().get(*k) != post.entries().get(*k))
                .cloned()
                .collect();
            let reported: BTreeSet<_> = out.changed.iter().cloned().collect();
            prop_assert_eq!(reported.len(), out.changed.len(), "a key reported twice");
            prop_assert_eq!(reported, really, "JoinOutcome.changed");
            // δ ⊑ X ⊔ δ: joining it again is a no-op with no inflation.
            let mut again = post.clone();
            let out2 = again.apply(d);
            prop_assert!(
                out2.inflation.is_none(),
                "re-applied δ inflates: {:?}",
                out2.inflation
            );
            prop_assert!(out2.changed.is_empty());
            prop_assert_eq!(&again, &post);
            Ok(())
        },
    );
}
