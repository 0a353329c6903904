//! The store join against a REFERENCE join written literally from the definition
//! (`docs/design/principles.md`, "Dot stores and the causal join"):
//! per key, `(s ∩ s') ∪ (s \ c') ∪ (s' \ c)` (for a `DotFun`, `s ∩ s'` joins the two values
//! under a common dot: the larger one), nested maps recursively, empty children dropped, and
//! `c ∪ c'` for the context. No index, no candidate sets, no fast paths.
//!
//! The inputs are whatever the decoder accepts: weird deltas (dots moved or duplicated under
//! other keys, conflicting values, foreign contexts, stray dots, ...) and randomly mutated bytes
//! of them, kept only when `decode` accepts them; not just histories of correct replicas. On
//! those inputs:
//! * the reference is a lattice (commutative, associative, idempotent), and so the promise of
//!   `tidemark_crdts::Lattice` is checked on everything the decoder accepts;
//! * the fast `Store::apply` (`join_delta`, dot index) and `Causal::join` (`DotMap::join`) equal
//!   the reference;
//! * both redundancy removals (`JoinOutcome::inflation`, `Causal::inflation`) satisfy
//!   `X ⊔ Δ(δ, X) = X ⊔ δ`, and are `None` exactly when `X ⊔ δ = X`;
//! * three deltas delivered in each of the 6 orders give one state, the reference's.
//!
//! Seeded: prints `seed = N`; replay with `SEED=N`; `SOAK=1` for ×10 cases.

mod common;

use common::pools::*;
use common::weird::*;
use common::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use tidemark_crdts::dotstore::{DotFun, DotMap, DotSet};
use tidemark_crdts::{Causal, CausalContext, Dot, DotStore, Entry, Key, Store, StoreDelta};

// ---------------------------------------------------------------------------------------------
// The reference join.
// ---------------------------------------------------------------------------------------------

/// `(s ∩ s') ∪ (s \ c') ∪ (s' \ c)` on dot sets.
fn ref_dotset(s: &DotSet, c: &CausalContext, t: &DotSet, d: &CausalContext) -> DotSet {
    let s: BTreeSet<Dot> = s.iter().copied().collect();
    let t: BTreeSet<Dot> = t.iter().copied().collect();
    let mut out: BTreeSet<Dot> = s.intersection(&t).copied().collect();
    out.extend(s.iter().filter(|x| !d.contains(x)));
    out.extend(t.iter().filter(|x| !c.contains(x)));
    DotSet::from_dots(out.into_iter().collect())
}

/// The same on dot functions; a dot in both keeps the larger value.
fn ref_dotfun<V: Clone + Ord + std::fmt::Debug>(
    s: &DotFun<V>,
    c: &CausalContext,
    t: &DotFun<V>,
    d: &CausalContext,
) -> DotFun<V> {
    let s: BTreeMap<Dot, V> = s.iter().map(|(k, v)| (*k, v.clone())).collect();
    let t: BTreeMap<Dot, V> = t.iter().map(|(k, v)| (*k, v.clone())).collect();
    let mut out: BTreeMap<Dot, V> = BTreeMap::new();
    for (k, v) in &s {
        if let Some(w) = t.get(k) {
            out.insert(*k, v.clone().max(w.clone()));
        }
    }
    for (k, v) in &s {
        if !d.contains(k) {
            out.insert(*k, v.clone());
        }
    }
    for (k, v) in &t {
        if !c.contains(k) {
            out.insert(*k, v.clone());
        }
    }
    DotFun::from_entries(out.into_iter().collect())
}

/// Per key, children joined recursively; empty children dropped.
fn ref_dotmap<K: Ord + Clone + std::fmt::Debug, S: DotStore>(
    s: &DotMap<K, S>,
    c: &CausalContext,
    t: &DotMap<K, S>,
    d: &CausalContext,
    child: impl Fn(&S, &CausalContext, &S, &CausalContext) -> S,
) -> DotMap<K, S> {
    let keys: BTreeSet<K> = s.keys().chain(t.keys()).cloned().collect();
    let bottom = S::default();
    let mut out = DotMap::default();
    for k in keys {
        let j = child(
            s.get(&k).unwrap_or(&bottom),
            c,
            t.get(&k).unwrap_or(&bottom),
            d,
        );
        out.set(k, j);
    }
    out
}

fn ref_entry(key: &Key, s: &Entry, c: &CausalContext, t: &Entry, d: &CausalContext) -> Entry {
    let b = Entry::bottom(key.kind);
    // The decoder admits only entries of the key's kind; anything else counts as bottom.
    let s = if s.kind() == key.kind { s } else { &b };
    let t = if t.kind() == key.kind { t } else { &b };
    match (s, t) {
        (Entry::GCounter(x), Entry::GCounter(y)) => Entry::GCounter(ref_dotfun(x, c, y, d)),
        (Entry::PNCounter(x), Entry::PNCounter(y)) => Entry::PNCounter(ref_dotfun(x, c, y, d)),
        (Entry::ORSet(x), Entry::ORSet(y)) => Entry::ORSet(ref_dotmap(x, c, y, d, ref_dotset)),
        (Entry::Lww(x), Entry::Lww(y)) => Entry::Lww(ref_dotfun(x, c, y, d)),
        (Entry::MvReg(x), Entry::MvReg(y)) => Entry::MvReg(ref_dotfun(x, c, y, d)),
        _ => unreachable!("both sides have the key's kind"),
    }
}

/// The reference join of two store states.
fn ref_join(x: &StoreDelta, y: &StoreDelta) -> StoreDelta {
    let keys: BTreeSet<Key> = x.store.keys().chain(y.store.keys()).cloned().collect();
    let mut store = DotMap::default();
    for k in keys {
        let b = Entry::bottom(k.kind);
        let e = ref_entry(
            &k,
            x.store.get(&k).unwrap_or(&b),
            &x.ctx,
            y.store.get(&k).unwrap_or(&b),
            &y.ctx,
        );
        store.set(k, e);
    }
    let mut ctx = x.ctx.clone();
    ctx.join(&y.ctx);
    Causal { store, ctx }
}

// ---------------------------------------------------------------------------------------------
// Inputs: what the decoder accepts.
// ---------------------------------------------------------------------------------------------

/// `decode(b)`, kept only if the decoder accepts it and `b` is the value's one encoding (the
/// node's codec, `tidemark::codec`, rejects the rest: bincode alone accepts over-long varints).
/// Decoding is bounded like the node's (bincode's claimed-bytes limit) so a mutated length
/// prefix fails instead of allocating.
fn admit(bytes: &[u8]) -> Option<StoreDelta> {
    let cfg = bincode::config::standard().with_limit::<{ 1 << 20 }>();
    let (d, n): (StoreDelta, usize) = bincode::serde::decode_from_slice(bytes, cfg).ok()?;
    (n == bytes.len() && encode(&d) == bytes).then_some(d)
}

/// One byte-level mutation of an encoding.
#[derive(Clone, Debug)]
enum ByteEdit {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        any::<usize>().prop_map(ByteEdit::Remove),
    ]
}

fn apply_edits(mut b: Vec<u8>, edits: &[ByteEdit]) -> Vec<u8> {
    for e in edits {
        match *e {
            ByteEdit::Set(i, v) if !b.is_empty() => {
                let n = b.len();
                b[i % n] = v;
            }
            ByteEdit::Insert(i, v) => b.insert(i % (b.len() + 1), v),
            ByteEdit::Remove(i) if !b.is_empty() => {
                let n = b.len();
                b.remove(i % n);
            }
            _ => {}
        }
    }
    b
}

/// How to derive one input from a random history.
#[derive(Clone, Debug)]
struct InputSpec {
    base: usize,
    weird: Vec<Weird>,
    edits: Vec<ByteEdit>,
}

fn input_spec() -> impl Strategy<Value = InputSpec> {
    (
        any::<usize>(),
        proptest::collection::vec(weird(), 0..4),
        prop_oneof![
            2 => Just(Vec::new()),
            1 => proptest::collection::vec(byte_edit(), 1..3),
        ],
    )
        .prop_map(|(base, weird, edits)| InputSpec { base, weird, edits })
}

/// The decoded input a spec yields (`None` when the decoder refuses it; the bottom instead).
fn input(pool: &[StoreDelta], spec: &InputSpec, admitted: &AtomicUsize) -> StoreDelta {
    let d = make_weird(&pool[spec.base % pool.len()], pool, &spec.weird);
    // Encoding refuses an I3 violation: such a delta cannot be sent at all.
    let Ok(bytes) = bincode::serde::encode_to_vec(&d, bincode::config::standard()) else {
        return StoreDelta::default();
    };
    match admit(&apply_edits(bytes, &spec.edits)) {
        Some(d) => {
            admitted.fetch_add(1, Ordering::Relaxed);
            d
        }
        None => StoreDelta::default(),
    }
}

fn pool_of(n: usize, steps: &[Step<StoreOp>]) -> Vec<StoreDelta> {
    let b = store_history(n, steps);
    let mut pool: Vec<StoreDelta> = b.log.iter().map(|(_, d)| d.clone()).collect();
    pool.extend(b.replicas.iter().map(Store::to_delta));
    pool
}

/// The fast store join: `store_of(x)` then `apply(y)`; returns the state and the outcome.
fn fast(x: &StoreDelta, y: &StoreDelta) -> (StoreDelta, Option<StoreDelta>) {
    let mut s = store_of(x.clone());
    let out = s.apply(y.clone());
    (s.to_delta(), out.inflation)
}

/// A state normalised as the store holds it (the reference of nothing and `x`).
fn norm(x: &StoreDelta) -> StoreDelta {
    ref_join(&StoreDelta::default(), x)
}

// ---------------------------------------------------------------------------------------------
// The laws.
// ---------------------------------------------------------------------------------------------

#[test]
fn fast_joins_equal_the_reference_join_on_decoded_arbitrary_inputs() {
    let total = AtomicUsize::new(0);
    let admitted = AtomicUsize::new(0);
    check(
        "fast_joins_equal_the_reference_join_on_decoded_arbitrary_inputs",
        CASES,
        (
            history(store_op(), 24),
            input_spec(),
            input_spec(),
            input_spec(),
        ),
        |((n, steps), sa, sb, sc)| {
            let pool = pool_of(n, &steps);
            total.fetch_add(3, Ordering::Relaxed);
            let a = input(&pool, &sa, &admitted);
            let b = input(&pool, &sb, &admitted);
            let c = input(&pool, &sc, &admitted);

            // The reference is a lattice on these inputs.
            let ab = ref_join(&a, &b);
            prop_assert_eq!(&ab, &ref_join(&b, &a), "reference not commutative");
            prop_assert_eq!(
                ref_join(&ab, &c),
                ref_join(&a, &ref_join(&b, &c)),
                "reference not associative"
            );
            prop_assert_eq!(ref_join(&ab, &b), ab.clone(), "reference not idempotent");

            for (x, y) in [(&a, &b), (&b, &a), (&a, &c), (&c, &b)] {
                let want = ref_join(x, y);
                // join_delta (the node's join, with its dot index).
                let (got, infl) = fast(x, y);
                prop_assert_eq!(&got, &want, "join_delta differs from the reference");
                // Causal::join (DotMap::join).
                let mut generic = norm(x);
                generic.join(y.clone());
                prop_assert_eq!(&generic, &want, "Causal::join differs from the reference");
                // Both redundancy removals: X ⊔ Δ(δ, X) = X ⊔ δ, None exactly when nothing new.
                let xs = norm(x);
                let changed = want != xs;
                for (what, infl) in [("join_delta", infl), ("Causal", xs.inflation(y))] {
                    prop_assert_eq!(
                        infl.is_some(),
                        changed,
                        "{} inflation is {:?} but the state changed: {}",
                        what,
                        infl,
                        changed
                    );
                    if let Some(i) = infl {
                        prop_assert!(i.dots_within_context(), "{what} inflation breaks I3");
                        prop_assert_eq!(
                            ref_join(&xs, &i),
                            want.clone(),
                            "X ⊔ Δ(δ, X) != X ⊔ δ ({})",
                            what
                        );
                        // The inflation itself is sendable: it encodes and decodes to itself.
                        prop_assert_eq!(admit(&encode(&i)), Some(i.clone()));
                    }
                }
            }

            // Convergence in every delivery order.
            let want = ref_join(&ab, &c);
            let inputs = [&a, &b, &c];
            for order in [
                [0, 1, 2],
                [0, 2, 1],
                [1, 0, 2],
                [1, 2, 0],
                [2, 0, 1],
                [2, 1, 0],
            ] {
                let mut s = Store::new();
                for i in order {
                    s.apply(inputs[i].clone());
                }
                prop_assert_eq!(s.to_delta(), want.clone(), "order {:?} diverges", order);
                prop_assert!(s.dots_within_context());
            }
            Ok(())
        },
    );
    let (t, a) = (total.into_inner(), admitted.into_inner());
    eprintln!("{a} of {t} inputs admitted by the decoder");
    assert!(a * 3 >= t, "too few inputs pass the decoder: {a} of {t}");
}
