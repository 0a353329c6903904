//! One test per way a hostile or buggy peer could make the join stop being a lattice join,
//! each failing on the code before the strict admission rules:
//! * the decoder rejects a dot that appears twice in a store (under two keys, under two set
//!   elements), an entry of another kind than its key, a context with duplicate or unsorted
//!   replicas, dedup marks with an empty set or unsorted sources;
//! * across two messages (which no decoder can see together) the join still follows the per-key
//!   rule: a dot held under another key is removed on both sides, and a value that beats ours
//!   under the same dot is reported (and forwarded) by redundancy removal;
//! * `next_dot` and the HLC at their ceilings return typed errors: no saturation, no reissued
//!   dot, no clock going backwards.

mod common;

use common::*;
use tidemark_crdts::dotstore::{DotFun, DotMap, DotSet};
use tidemark_crdts::{
    Causal, CausalContext, DedupMarks, Dot, DotsExhausted, Entry, Hlc, HlcError, IntervalSet, Key,
    KeyKind, Lattice, MVRegister, Mutation, MutationError, ORSet, ReplicaId, Store, StoreDelta,
    Timestamp,
};

fn key(kind: KeyKind, name: &str) -> Key {
    Key::new(kind, name)
}

fn mv(entries: &[(Dot, &str)]) -> Entry {
    Entry::MvReg(DotFun::from_entries(
        entries.iter().map(|(d, v)| (*d, (*v).to_owned())).collect(),
    ))
}

fn delta(entries: Vec<(Key, Entry)>, ctx: CausalContext) -> StoreDelta {
    let mut store = DotMap::default();
    for (k, e) in entries {
        store.set(k, e);
    }
    Causal { store, ctx }
}

#[test]
fn a_dot_under_two_keys_or_two_elements_is_rejected_by_the_decoder() {
    let d = Dot::new(rid(0), 1);
    let ctx = CausalContext::from_dot(d);
    // Two register keys holding the same dot. Encoding is lenient (in-memory values are
    // trusted); the decoder is where untrusted bytes become values.
    let two_keys = delta(
        vec![
            (key(KeyKind::MvReg, "a"), mv(&[(d, "1")])),
            (key(KeyKind::MvReg, "b"), mv(&[(d, "2")])),
        ],
        ctx.clone(),
    );
    let err = decode::<StoreDelta>(&encode(&two_keys)).expect_err("dot under two keys");
    assert!(err.contains("twice"), "{err}");
    // Two elements of one set holding the same dot.
    let mut elems = DotMap::default();
    elems.set("\"x\"".to_owned(), DotSet::single(d));
    elems.set("\"y\"".to_owned(), DotSet::single(d));
    let two_elems = delta(vec![(key(KeyKind::ORSet, "s"), Entry::ORSet(elems))], ctx);
    assert!(decode::<StoreDelta>(&encode(&two_elems)).is_err());
    // The standalone set type too.
    let mut m: DotMap<u8, DotSet> = DotMap::default();
    m.set(1, DotSet::single(d));
    m.set(2, DotSet::single(d));
    let set = Causal::new(m, CausalContext::from_dot(d));
    assert!(decode::<Causal<DotMap<u8, DotSet>>>(&encode(&set)).is_err());
    // Each dot once: fine.
    let ok = delta(
        vec![
            (key(KeyKind::MvReg, "a"), mv(&[(d, "1")])),
            (key(KeyKind::MvReg, "b"), mv(&[(Dot::new(rid(0), 2), "2")])),
        ],
        CausalContext::from_range(rid(0), 1, 2),
    );
    assert_eq!(decode::<StoreDelta>(&encode(&ok)), Ok(ok));
}

#[test]
fn an_entry_of_another_kind_than_its_key_is_rejected_by_the_decoder() {
    let d = Dot::new(rid(0), 1);
    let bad = delta(
        vec![(key(KeyKind::GCounter, "c"), mv(&[(d, "1")]))],
        CausalContext::from_dot(d),
    );
    let err = decode::<StoreDelta>(&encode(&bad)).expect_err("kind mismatch");
    assert!(err.contains("kind"), "{err}");
    let good = delta(
        vec![(
            key(KeyKind::GCounter, "c"),
            Entry::GCounter(DotFun::single(d, 1)),
        )],
        CausalContext::from_dot(d),
    );
    assert_eq!(decode::<StoreDelta>(&encode(&good)), Ok(good));
}

/// Two messages no decoder sees together: `x` holds dot `d` under key `a`, `y` under key `b`.
/// The per-key rule removes `d` from both keys (each side has seen `d` and does not hold it
/// under the other key), in either order. The old join kept `d` under whichever key it met
/// first, so the order of delivery decided the state.
#[test]
fn a_dot_held_under_another_key_is_removed_whatever_the_order() {
    let d = Dot::new(rid(0), 1);
    let ctx = CausalContext::from_dot(d);
    let x = delta(
        vec![(key(KeyKind::MvReg, "a"), mv(&[(d, "1")]))],
        ctx.clone(),
    );
    let y = delta(
        vec![(key(KeyKind::MvReg, "b"), mv(&[(d, "1")]))],
        ctx.clone(),
    );
    for (first, second) in [(&x, &y), (&y, &x)] {
        let mut s = Store::new();
        s.apply(first.clone());
        let out = s.apply(second.clone());
        assert!(s.entries().is_empty(), "{:?}", s.entries());
        assert_eq!(s.context(), &ctx);
        // The removal is forwarded: the inflation carries the dot in its context.
        let infl = out.inflation.expect("the state changed");
        assert!(infl.ctx.contains(&d));
        // The generic join agrees.
        let mut g = first.clone();
        g.join(second.clone());
        assert!(g.store.is_empty());
        assert_eq!(
            first.inflation(second).map(|i| i.ctx.contains(&d)),
            Some(true)
        );
    }
    // The same with set elements inside one key.
    let set = |e: &str| {
        let mut m = DotMap::default();
        m.set(format!("\"{e}\""), DotSet::single(d));
        delta(
            vec![(key(KeyKind::ORSet, "s"), Entry::ORSet(m))],
            ctx.clone(),
        )
    };
    let (p, q) = (set("p"), set("q"));
    let mut pq = Store::new();
    pq.apply(p.clone());
    pq.apply(q.clone());
    let mut qp = Store::new();
    qp.apply(q);
    qp.apply(p);
    assert_eq!(pq, qp);
    assert!(pq.entries().is_empty());
}

/// Two values under one dot (from two messages): the join keeps the larger, and redundancy
/// removal reports it, so BP+RR forwards it. The old inflation dropped every entry whose dot
/// was seen and reported "nothing new" while the state had changed: nodes diverged for good.
#[test]
fn a_value_that_wins_under_a_seen_dot_is_reported_by_redundancy_removal() {
    let d = Dot::new(rid(0), 1);
    let ctx = CausalContext::from_dot(d);
    let small = delta(
        vec![(key(KeyKind::MvReg, "a"), mv(&[(d, "\"a\"")]))],
        ctx.clone(),
    );
    let big = delta(
        vec![(key(KeyKind::MvReg, "a"), mv(&[(d, "\"b\"")]))],
        ctx.clone(),
    );
    let mut s = Store::new();
    s.apply(small.clone());
    let out = s.apply(big.clone());
    assert_eq!(out.changed, vec![key(KeyKind::MvReg, "a")]);
    let infl = out
        .inflation
        .expect("the state changed, so the inflation is not empty");
    let mut from_infl = Store::new();
    from_infl.apply(small.clone());
    from_infl.apply(infl.clone());
    assert_eq!(from_infl, s, "X ⊔ Δ(δ, X) != X ⊔ δ");
    assert!(infl.dots_within_context());
    let generic = small
        .inflation(&big)
        .expect("Causal::inflation reports it too");
    assert_eq!(generic, infl);
    // The loser brings nothing new, and says so.
    assert_eq!(s.apply(small.clone()).inflation, None);
    assert_eq!(big.inflation(&small), None);
}

#[test]
fn next_dot_at_the_ceiling_is_an_error_never_a_reissued_dot() {
    let r = rid(0);
    let mut ctx = CausalContext::from_range(r, 1, 3);
    ctx.insert(Dot::new(r, u64::MAX));
    assert_eq!(ctx.next_dot(r), Err(DotsExhausted { replica: r }));
    assert_eq!(ctx.next_dot(rid(1)), Ok(Dot::new(rid(1), 1)));
    assert_eq!(
        CausalContext::from_range(r, 1, u64::MAX - 1).next_dot(r),
        Ok(Dot::new(r, u64::MAX))
    );
    // A store whose context reached the ceiling (e.g. joined from a peer) refuses mutations.
    let mut s = Store::new();
    s.apply(Causal::new(DotMap::default(), ctx));
    let before = s.clone();
    let k = key(KeyKind::GCounter, "c");
    assert_eq!(
        s.mutate(r, &k, &Mutation::Inc(1), None),
        Err(MutationError::DotsExhausted(DotsExhausted { replica: r }))
    );
    assert_eq!(s, before, "a refused mutation changed the store");
    // The standalone types too.
    let mut set = ORSet::from_state(Causal::new(
        DotMap::default(),
        CausalContext::from_dot(Dot::new(r, u64::MAX)),
    ));
    assert!(set.add(r, 1u8).is_err());
    assert!(set.is_empty());
    let mut reg = MVRegister::from_state(Causal::new(
        DotFun::default(),
        CausalContext::from_dot(Dot::new(r, u64::MAX)),
    ));
    assert!(reg.write(r, 1u8).is_err());
    assert!(reg.read().is_empty());
}

#[test]
fn the_hlc_at_its_ceiling_is_an_error_never_backwards() {
    let r = rid(0);
    let top = (u64::MAX, u32::MAX);
    // Restored at the ceiling: no next timestamp, and the clock stays put.
    let mut c = Hlc::restore(r, top, 1_000);
    assert_eq!(c.now(u64::MAX), Err(HlcError::Exhausted));
    assert_eq!(c.now(5), Err(HlcError::Exhausted));
    assert_eq!(c.mark(), top);
    // One below the ceiling: one more timestamp, then the error.
    let mut c = Hlc::restore(r, (u64::MAX, u32::MAX - 1), 1_000);
    let last = c.now(0).expect("one timestamp left");
    assert_eq!((last.physical_ms, last.logical), top);
    assert_eq!(c.now(0), Err(HlcError::Exhausted));
    // Observing the ceiling: the clock cannot move above it, so the observation is refused
    // and the clock unchanged (the old clock wrapped to `(u64::MAX, 0)`, i.e. backwards).
    let mut c = Hlc::new(r, 1_000);
    let before = c.clone();
    let remote = Timestamp {
        physical_ms: u64::MAX,
        logical: u32::MAX,
        replica: rid(1),
    };
    assert_eq!(c.observe(&remote, u64::MAX), Err(HlcError::Exhausted));
    assert_eq!(c, before);
    // Borrowing the next millisecond still works below the ceiling.
    let mut c = Hlc::restore(r, (7, u32::MAX), 1_000);
    let t = c.now(0).expect("a timestamp");
    assert_eq!((t.physical_ms, t.logical), (8, 0));
}

/// bincode writes a map like a sequence of pairs: these are the bytes of a context whose
/// replicas are given in `entries`' order.
fn context_bytes(entries: &[(ReplicaId, (u64, u64))]) -> Vec<u8> {
    let v: Vec<(ReplicaId, Vec<(u64, u64)>)> =
        entries.iter().map(|(r, rng)| (*r, vec![*rng])).collect();
    encode(&v)
}

#[test]
fn the_context_decoder_rejects_duplicate_and_unsorted_replicas() {
    let (a, b) = (rid(0), rid(1));
    assert!(a < b);
    let ok = context_bytes(&[(a, (1, 3)), (b, (1, 1))]);
    let want = {
        let mut c = CausalContext::from_range(a, 1, 3);
        c.insert(Dot::new(b, 1));
        c
    };
    assert_eq!(
        ok,
        encode(&want),
        "the hand-built bytes are the real format"
    );
    assert_eq!(decode::<CausalContext>(&ok), Ok(want));
    // Unsorted: the same value, a second encoding.
    let err = decode::<CausalContext>(&context_bytes(&[(b, (1, 1)), (a, (1, 3))]))
        .expect_err("unsorted replicas");
    assert!(err.contains("ascending"), "{err}");
    // Duplicate: the old decoder kept the last entry and silently dropped dots 1..=3.
    assert!(decode::<CausalContext>(&context_bytes(&[(a, (1, 3)), (a, (5, 5))])).is_err());
}

#[test]
fn dedup_marks_reject_empty_and_unsorted_sources_and_join_reports_every_change() {
    let src = |s: &str| ("stream".to_owned(), s.to_owned());
    let bytes = |entries: Vec<((String, String), IntervalSet)>| encode(&entries);
    let ok = bytes(vec![(src("a"), IntervalSet::from_range(1, 2))]);
    let mut want = DedupMarks::new();
    want.insert("stream", "a", 1);
    want.insert("stream", "a", 2);
    assert_eq!(
        ok,
        encode(&want),
        "the hand-built bytes are the real format"
    );
    assert_eq!(decode::<DedupMarks>(&ok), Ok(want.clone()));
    // An empty set: the old decoder accepted it, and `join` then inserted it (the state
    // changed, `==` says so) while reporting nothing new.
    let empty = bytes(vec![(src("a"), IntervalSet::new())]);
    assert!(decode::<DedupMarks>(&empty).is_err());
    let unsorted = bytes(vec![
        (src("b"), IntervalSet::from_range(1, 1)),
        (src("a"), IntervalSet::from_range(1, 1)),
    ]);
    assert!(decode::<DedupMarks>(&unsorted).is_err());
    // Join: the returned novelty is empty exactly when the marks did not change.
    let mut m = DedupMarks::new();
    let before = m.clone();
    assert!(m.join(&DedupMarks::new()).is_empty());
    assert_eq!(m, before);
    let new = m.join(&want);
    assert_eq!(new, want);
    assert_ne!(m, before);
    let again = m.clone();
    assert!(m.join(&want).is_empty());
    assert_eq!(m, again);
}

#[test]
fn non_canonical_maps_and_empty_children_are_rejected() {
    let d = Dot::new(rid(0), 1);
    let ctx = CausalContext::from_dot(d);
    // An empty register entry (in memory `set` drops it: build the bytes by hand).
    let entries: Vec<(Key, Entry)> = vec![(key(KeyKind::MvReg, "a"), mv(&[]))];
    let mut b = encode(&ctx);
    b.extend(encode(&entries));
    assert!(decode::<StoreDelta>(&b).is_err());
    // Keys out of order.
    let entries: Vec<(Key, Entry)> = vec![
        (key(KeyKind::MvReg, "b"), mv(&[(d, "1")])),
        (key(KeyKind::MvReg, "a"), mv(&[(Dot::new(rid(0), 2), "1")])),
    ];
    let mut b = encode(&CausalContext::from_range(rid(0), 1, 2));
    b.extend(encode(&entries));
    assert!(decode::<StoreDelta>(&b).is_err());
}

#[test]
fn lattice_trait_join_of_decoded_sets_is_commutative() {
    // The `Lattice` promise on the standalone set, for two decoded states sharing a dot under
    // different elements.
    let d = Dot::new(rid(0), 1);
    let state = |e: u8| {
        let mut m: DotMap<u8, DotSet> = DotMap::default();
        m.set(e, DotSet::single(d));
        ORSet::from_state(Causal::new(m, CausalContext::from_dot(d)))
    };
    let (x, y): (ORSet<u8>, ORSet<u8>) = (
        decode(&encode(&state(1))).expect("decodes"),
        decode(&encode(&state(2))).expect("decodes"),
    );
    let mut xy = x.clone();
    Lattice::join(&mut xy, y.clone());
    let mut yx = y;
    Lattice::join(&mut yx, x);
    assert_eq!(xy, yx);
    assert!(xy.is_empty());
}
