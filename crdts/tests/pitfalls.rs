//! Named pitfalls (`docs/design/principles.md`, "Pitfalls"), one deterministic test each. The
//! comment on each test names the pitfall it pins.

mod common;

use common::*;
use tidemark_crdts::dotstore::{Causal, DotMap, DotSet};
use tidemark_crdts::{
    CausalContext, Dot, DotStore, Entry, GCounter, Hlc, HlcError, Key, KeyKind, LWWRegister,
    Lattice, MVRegister, Mutation, MutationError, ORSet, PNCounter, Store, StoreDelta, Timestamp,
    Value,
};

fn ctx(dots: &[(usize, u64)]) -> CausalContext {
    dots.iter().map(|&(r, s)| Dot::new(rid(r), s)).collect()
}

fn orset_key() -> Key {
    Key::new(KeyKind::ORSet, "set")
}

fn x() -> String {
    "\"x\"".to_owned()
}

fn mutate(s: &mut Store, r: usize, key: &Key, m: Mutation) -> StoreDelta {
    s.mutate(rid(r), key, &m, None).expect("valid mutation")
}

fn set_of(s: &Store, key: &Key) -> Vec<String> {
    match s.get(key) {
        Value::ORSet(v) => v,
        v => panic!("not an orset value: {v:?}"),
    }
}

// -------------------------------------------------------------------------------------------

/// Pitfall "causal-context compaction over a gap" (Corrosion PR #200, ranges mistakenly
/// collapsed): with r:1..=5 seen, deliver r:6 and r:8 before r:7. The version vector must stop at
/// 6 (not jump to 8), r:8 must sit in the cloud, and r:7 must still apply afterwards.
#[test]
fn pitfall_c4_compaction_over_a_gap_context() {
    let r = rid(0);
    let mut c = CausalContext::from_range(r, 1, 5);
    assert_eq!(c.version_vector().get(&r), Some(&5));
    c.insert(Dot::new(r, 6));
    c.insert(Dot::new(r, 8));
    assert_eq!(
        c.version_vector().get(&r),
        Some(&6),
        "vv jumped over the gap at 7"
    );
    assert!(!c.contains(&Dot::new(r, 7)));
    assert_eq!(c.cloud(), CausalContext::from_dot(Dot::new(r, 8)));
    assert_eq!(c.cloud_ranges(), 1);
    assert!(c.insert(Dot::new(r, 7)), "r:7 must still be new");
    assert_eq!(c.version_vector().get(&r), Some(&8));
    assert!(c.cloud().is_empty());
    assert_eq!(c, CausalContext::from_range(r, 1, 8));
}

/// The compaction-over-a-gap pitfall again, through real deltas: an add-wins set and the store map.
/// Ops 1..=8 of replica A; B gets 1..=5, then 6 and 8, then 7. B's context keeps the gap, and the
/// element of op 7 still shows up when its delta finally arrives.
#[test]
fn pitfall_c4_compaction_over_a_gap_deltas() {
    let a = rid(0);
    // ORSet type.
    let mut src = ORSet::<u8>::new();
    let deltas: Vec<_> = (1..=8u8)
        .map(|e| src.add(a, e).expect("dots left"))
        .collect();
    let mut b = ORSet::<u8>::new();
    for d in &deltas[..6] {
        b.apply(d.clone());
    }
    b.apply(deltas[7].clone());
    assert_eq!(b.state().ctx.version_vector().get(&a), Some(&6));
    assert!(b.state().ctx.cloud().contains(&Dot::new(a, 8)));
    assert!(b.contains(&8) && !b.contains(&7));
    b.apply(deltas[6].clone());
    assert!(b.contains(&7), "r:7 did not apply after r:8");
    assert_eq!(b.state().ctx.version_vector().get(&a), Some(&8));
    assert_eq!(b, src);

    // Store map: one mvreg key per op.
    let mut src = Store::new();
    let keys: Vec<Key> = (1..=8)
        .map(|i| Key::new(KeyKind::MvReg, format!("k{i}")))
        .collect();
    let deltas: Vec<_> = keys
        .iter()
        .map(|k| mutate(&mut src, 0, k, Mutation::Set("1".into())))
        .collect();
    let mut b = Store::new();
    for d in &deltas[..6] {
        b.apply(d.clone());
    }
    b.apply(deltas[7].clone());
    assert_eq!(b.context().version_vector().get(&a), Some(&6));
    assert_eq!(b.get(&keys[6]), Value::MvReg(vec![]));
    b.apply(deltas[6].clone());
    assert_eq!(b.get(&keys[6]), Value::MvReg(vec!["1".into()]));
    assert_eq!(b, src);
}

/// Pitfall "OR-set merge: on both sides ⇒ present is wrong" (riak_dt #82): add x@A,
/// add x@B, A→C, rem x@A, B→A, rem x@B, merge(B, merge(A, C)): x must be absent (in every
/// merge order), for the ORSet type and for the store map.
#[test]
fn pitfall_c6_riak_dt_present_but_removed() {
    // ORSet type.
    let (ra, rb) = (rid(0), rid(1));
    let mut a = ORSet::<u8>::new();
    let mut b = ORSet::<u8>::new();
    let mut c = ORSet::<u8>::new();
    a.add(ra, 1).expect("dots left");
    b.add(rb, 1).expect("dots left");
    c.join(a.clone());
    a.remove(&1);
    a.join(b.clone());
    assert!(a.contains(&1), "A holds x through B's add");
    b.remove(&1);
    let mut ac = a.clone();
    ac.join(c.clone());
    let mut bac = b.clone();
    bac.join(ac);
    assert!(!bac.contains(&1), "present-but-removed: x resurrected");
    let states = [a, b, c];
    for order in [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ] {
        let mut m = ORSet::new();
        for i in order {
            m.join(states[i].clone());
        }
        assert!(!m.contains(&1), "order {order:?}");
        assert_eq!(m, bac);
    }

    // Store map.
    let k = orset_key();
    let (mut a, mut b, mut c) = (Store::new(), Store::new(), Store::new());
    mutate(&mut a, 0, &k, Mutation::Add(x()));
    mutate(&mut b, 1, &k, Mutation::Add(x()));
    c.apply(a.to_delta());
    mutate(&mut a, 0, &k, Mutation::Remove(x()));
    a.apply(b.to_delta());
    mutate(&mut b, 1, &k, Mutation::Remove(x()));
    let bac = sjoin(&b, &sjoin(&a, &c));
    assert_eq!(set_of(&bac, &k), Vec::<String>::new());
    assert!(
        bac.entries().is_empty(),
        "no entry (and no tombstone) may remain"
    );
    let states = [a, b, c];
    for order in [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ] {
        let mut m = Store::new();
        for i in order {
            m.apply(states[i].to_delta());
        }
        assert_eq!(m, bac, "order {order:?}");
    }
}

/// Pitfall "concurrent add/remove must be add-wins": A and B both hold x; during a
/// partition A removes x (having observed the old dot) while B re-adds it. After the heal x is
/// present on both, carried by B's new dot only. Same for the store map, and for mvreg
/// (a write concurrent with a delete survives: observed-reset).
#[test]
fn pitfall_c7_add_wins_across_a_partition() {
    let (ra, rb) = (rid(0), rid(1));
    let mut a = ORSet::<u8>::new();
    a.add(ra, 1).expect("dots left");
    let mut b = a.clone();
    let rm = a.remove(&1);
    let add = b.add(rb, 1).expect("dots left");
    a.apply(add);
    b.apply(rm);
    assert!(a.contains(&1) && b.contains(&1), "add must win");
    assert_eq!(a, b);
    assert_eq!(a.dots_of(&1), vec![Dot::new(rb, 1)]);

    let k = orset_key();
    let m = Key::new(KeyKind::MvReg, "m");
    let mut a = Store::new();
    mutate(&mut a, 0, &k, Mutation::Add(x()));
    mutate(&mut a, 0, &m, Mutation::Set("1".into()));
    let mut b = a.clone();
    let d1 = mutate(&mut a, 0, &k, Mutation::Remove(x()));
    let d2 = mutate(&mut a, 0, &m, Mutation::Delete);
    let d3 = mutate(&mut b, 1, &k, Mutation::Add(x()));
    let d4 = mutate(&mut b, 1, &m, Mutation::Set("2".into()));
    a.apply(d3);
    a.apply(d4);
    b.apply(d1);
    b.apply(d2);
    assert_eq!(a, b);
    assert_eq!(set_of(&a, &k), vec![x()]);
    assert_eq!(a.get(&m), Value::MvReg(vec!["2".into()]));
}

/// Pitfall "remove of an unseen element / deferred removes dropped" (riak_dt #99): the
/// remove delta arrives before the add it removes. The element must end up absent, and nothing
/// is kept beyond the context (no deferred-remove state).
#[test]
fn pitfall_c8_remove_before_add() {
    let ra = rid(0);
    let mut a = ORSet::<u8>::new();
    let add = a.add(ra, 1).expect("dots left");
    let mut b = ORSet::<u8>::new();
    b.apply(add.clone());
    let rm = b.remove(&1);
    let mut c = ORSet::<u8>::new();
    c.apply(rm.clone());
    assert!(c.state().store.is_empty());
    assert_eq!(c.state().ctx, ctx(&[(0, 1)]));
    c.apply(add.clone());
    assert!(!c.contains(&1), "the early remove was lost");
    assert!(c.state().store.is_empty(), "state kept beyond the context");
    assert_eq!(c.state().ctx, ctx(&[(0, 1)]));
    assert_eq!(c, b);

    // Store map: the remove delta is context-only (no entry at all).
    let k = orset_key();
    let mut a = Store::new();
    let add = mutate(&mut a, 0, &k, Mutation::Add(x()));
    let mut b = Store::new();
    b.apply(add.clone());
    let rm = mutate(&mut b, 1, &k, Mutation::Remove(x()));
    assert!(rm.store.is_bottom(), "a remove delta carries no entry");
    let mut c = Store::new();
    c.apply(rm);
    let out = c.apply(add);
    assert!(
        out.inflation.is_none(),
        "the add is already covered by the remove's context"
    );
    assert!(
        out.changed.is_empty(),
        "the late add must not create the entry"
    );
    assert!(c.entries().is_empty(), "state kept beyond the context");
    assert_eq!(c.context(), &ctx(&[(0, 1), (1, 1)]));
    assert_eq!(c, b);
}

/// Pitfall "LWW non-commutative tie-break" (`>=` on equal timestamps): equal
/// `(l, c)` from two replicas: merge(a, b) == merge(b, a), the replica id breaks the tie, then
/// (for fully equal timestamps, i.e. bad input) the value.
#[test]
fn pitfall_c9_lww_equal_timestamps() {
    let ts = |r: usize| Timestamp {
        physical_ms: 1_000,
        logical: 7,
        replica: rid(r),
    };
    let mut a = LWWRegister::new();
    a.write(ts(1), "zzz");
    let mut b = LWWRegister::new();
    b.write(ts(2), "aaa");
    let mut ab = a.clone();
    ab.join(b.clone());
    let mut ba = b.clone();
    ba.join(a.clone());
    assert_eq!(ab, ba);
    assert_eq!(
        ab.read(),
        Some(&"aaa"),
        "the larger replica id wins, whatever the value"
    );
    // Fully equal timestamps carrying different values: still commutative.
    let mut c = LWWRegister::new();
    c.write(ts(2), "bbb");
    let mut bc = b.clone();
    bc.join(c.clone());
    let mut cb = c.clone();
    cb.join(b.clone());
    assert_eq!(bc, cb);
    assert_eq!(bc.read(), Some(&"bbb"));

    // Store map: two replicas write the same `(l, c)`.
    let k = Key::new(KeyKind::Lww, "l");
    let (mut sa, mut sb) = (Store::new(), Store::new());
    let da = sa
        .mutate(rid(1), &k, &Mutation::Set("\"zzz\"".into()), Some(ts(1)))
        .expect("set");
    let db = sb
        .mutate(rid(2), &k, &Mutation::Set("\"aaa\"".into()), Some(ts(2)))
        .expect("set");
    sa.apply(db);
    sb.apply(da);
    assert_eq!(sa, sb);
    assert_eq!(sa.get(&k), Value::Lww(Some("\"aaa\"".into())));
}

/// Pitfall "HLC poisoning by a far-future timestamp": a peer timestamp ten years
/// ahead is rejected and the local clock is unchanged; the drift bound itself is inclusive.
#[test]
fn pitfall_c12_hlc_far_future_rejected() {
    let wall = 1_700_000_000_000u64;
    let drift = 100;
    let mut clock = Hlc::new(rid(0), drift);
    clock.now(wall).expect("clock left");
    clock.now(wall).expect("clock left");
    let before = clock.clone();
    let ten_years = 10 * 365 * 24 * 3_600 * 1_000;
    let remote = Timestamp {
        physical_ms: wall + ten_years,
        logical: 0,
        replica: rid(1),
    };
    assert_eq!(
        clock.observe(&remote, wall),
        Err(HlcError::TooFarAhead {
            remote_ms: wall + ten_years,
            wall_ms: wall,
            max_drift_ms: drift
        })
    );
    assert_eq!(clock, before, "the clock moved");
    assert_eq!(clock.mark(), before.mark());
    let mut twin = before.clone();
    assert_eq!(clock.now(wall), twin.now(wall));
    assert!(clock.now(wall).expect("clock left").physical_ms < wall + 1_000);
    // At the bound: accepted; one past it: rejected.
    let mut c = Hlc::new(rid(0), drift);
    let at = Timestamp {
        physical_ms: wall + drift,
        logical: 3,
        replica: rid(1),
    };
    assert_eq!(c.observe(&at, wall), Ok(()));
    assert!(c.now(wall).expect("clock left") > at);
    let past = Timestamp {
        physical_ms: wall + 2 * drift + 1,
        logical: 0,
        replica: rid(1),
    };
    let before = c.clone();
    assert!(c.observe(&past, wall).is_err());
    assert_eq!(c, before);
}

/// Pitfall "HLC logical-counter overflow": more than 2^16 events in one millisecond stay
/// strictly increasing; restored at logical `u32::MAX`, the next stamp is still greater (it
/// borrows the next millisecond); same after observing a remote at `u32::MAX`.
#[test]
fn pitfall_c13_hlc_logical_overflow() {
    let wall = 5_000u64;
    let mut clock = Hlc::new(rid(0), 1_000);
    let mut last = clock.now(wall).expect("clock left");
    for _ in 0..(1u32 << 16) + 10 {
        let t = clock.now(wall).expect("clock left");
        assert!(t > last, "{t:?} <= {last:?}");
        last = t;
    }
    assert_eq!(last.physical_ms, wall, "no need to borrow below u32::MAX");
    assert!(last.logical > u32::from(u16::MAX));

    let mut clock = Hlc::restore(rid(0), (wall, u32::MAX), 1_000);
    let restored = clock.stamp();
    let next = clock.now(wall).expect("clock left");
    assert!(next > restored, "{next:?} <= {restored:?}");
    assert_eq!((next.physical_ms, next.logical), (wall + 1, 0));
    assert!(clock.now(wall).expect("clock left") > next);

    let mut clock = Hlc::new(rid(0), 1_000);
    clock.now(wall).expect("clock left");
    let remote = Timestamp {
        physical_ms: wall,
        logical: u32::MAX,
        replica: rid(1),
    };
    clock.observe(&remote, wall).expect("within drift");
    let t = clock.now(wall).expect("clock left");
    assert!(t > remote && (t.physical_ms, t.logical) > (remote.physical_ms, remote.logical));
}

/// Pitfall "counter arithmetic overflow / hostile increments": `u64::MAX` increments and
/// hostile `u64::MAX` entries saturate: no panic, no wrap. GCounter, PNCounter and the store's
/// causal counters.
#[test]
fn pitfall_c15_counter_overflow_saturates() {
    let (r1, r2) = (rid(0), rid(1));
    let mut g = GCounter::new();
    g.inc(r1, u64::MAX);
    g.inc(r1, u64::MAX);
    assert_eq!(g.get(r1), u64::MAX);
    g.inc(r2, u64::MAX);
    assert_eq!(g.value(), u64::MAX, "sum wrapped");
    g.join(GCounter::from_entries([(rid(2), u64::MAX), (rid(2), 1)]));
    assert_eq!(g.value(), u64::MAX);
    assert_eq!(g.get(rid(2)), u64::MAX);

    let mut p = PNCounter::new();
    p.inc(r1, u64::MAX);
    p.inc(r2, u64::MAX);
    assert_eq!(p.value(), i64::MAX);
    p.dec(r1, u64::MAX);
    p.dec(r1, u64::MAX);
    assert_eq!(p.value(), 0, "P and N both saturate at u64::MAX");
    let mut q = PNCounter::new();
    q.dec(r1, u64::MAX);
    assert_eq!(q.value(), i64::MIN);
    q.join(p.clone());
    assert_eq!(q.value(), 0);

    let g_key = Key::new(KeyKind::GCounter, "g");
    let p_key = Key::new(KeyKind::PNCounter, "p");
    let mut a = Store::new();
    let mut b = Store::new();
    for _ in 0..2 {
        mutate(&mut a, 0, &g_key, Mutation::Inc(u64::MAX));
        mutate(&mut b, 1, &g_key, Mutation::Inc(u64::MAX));
        mutate(&mut a, 0, &p_key, Mutation::Inc(u64::MAX));
        mutate(&mut b, 1, &p_key, Mutation::Dec(u64::MAX));
    }
    assert_eq!(a.get(&g_key), Value::GCounter(u64::MAX));
    assert_eq!(a.get(&p_key), Value::PNCounter(i64::MAX));
    assert_eq!(b.get(&p_key), Value::PNCounter(i64::MIN));
    let ab = sjoin(&a, &b);
    assert_eq!(ab.get(&g_key), Value::GCounter(u64::MAX));
    assert_eq!(ab.get(&p_key), Value::PNCounter(0));
    // A hostile delta: fresh dots carrying u64::MAX totals.
    let mut hostile = DotMap::default();
    hostile.set(
        g_key.clone(),
        Entry::GCounter(tidemark_crdts::DotFun::from_entries(vec![
            (Dot::new(rid(7), 1), u64::MAX),
            (Dot::new(rid(8), 1), u64::MAX),
        ])),
    );
    let mut c = ab.clone();
    c.apply(Causal::new(hostile, ctx(&[(7, 1), (8, 1)])));
    assert_eq!(c.get(&g_key), Value::GCounter(u64::MAX));
    // And the store refuses a zero amount and deleting a counter, changing nothing.
    let before = c.clone();
    assert_eq!(
        c.mutate(r1, &g_key, &Mutation::Inc(0), None),
        Err(MutationError::ZeroAmount)
    );
    assert_eq!(
        c.mutate(r1, &p_key, &Mutation::Delete, None),
        Err(MutationError::CounterNotDeletable(KeyKind::PNCounter))
    );
    assert_eq!(c, before);
}

/// Pitfall "DotMap keeps empty children → keys reappear as empty": removing the last element
/// drops the child, locally and at a replica joining the remove delta; also for a nested map
/// and for whole store keys.
#[test]
fn empty_children_are_dropped() {
    let mut s = ORSet::<u8>::new();
    s.add(rid(0), 1).expect("dots left");
    let mut peer = s.clone();
    let rm = s.remove(&1);
    assert!(s.is_empty() && s.state().store.is_empty() && s.elements().next().is_none());
    peer.apply(rm);
    assert!(peer.state().store.is_empty(), "peer kept an empty child");
    assert_eq!(peer, s);

    // Nested: DotMap<u8, DotMap<u8, DotSet>>: the inner map's last dot goes, the outer key too.
    type Nested = Causal<DotMap<u8, DotMap<u8, DotSet>>>;
    let d = Dot::new(rid(0), 1);
    let mut inner = DotMap::default();
    inner.set(7u8, DotSet::single(d));
    let mut outer = DotMap::default();
    outer.set(3u8, inner);
    let mut state: Nested = Causal::new(outer, CausalContext::from_dot(d));
    state.join(Causal::new(DotMap::default(), CausalContext::from_dot(d)));
    assert!(state.store.is_empty(), "nested empty child kept: {state:?}");
    assert!(state.store.is_canonical());

    // Store keys: the last orset element, and whole-key deletes.
    let k = orset_key();
    let m = Key::new(KeyKind::MvReg, "m");
    let mut a = Store::new();
    mutate(&mut a, 0, &k, Mutation::Add(x()));
    mutate(&mut a, 0, &m, Mutation::Set("1".into()));
    let mut b = a.clone();
    let d1 = mutate(&mut a, 0, &k, Mutation::Remove(x()));
    let d2 = mutate(&mut a, 0, &m, Mutation::Delete);
    assert!(a.entries().is_empty(), "{:?}", a.entries());
    b.apply(d1);
    b.apply(d2);
    assert!(b.entries().is_empty(), "{:?}", b.entries());
    assert_eq!(a, b);
}

/// Pitfall "delta whose context claims dots it does not carry" (Akka #22890): a delta
/// interval with a gap (δ3 ⊔ δ5, skipping δ4), joined into a fresh replica F, and F then joined
/// into a replica B holding live elements: B keeps every element not removed by those deltas.
/// Finishing with the rest gives exactly the full-state join.
#[test]
fn pitfall_c5_delta_interval_with_a_gap_does_not_delete_live_elements() {
    let (ra, rb) = (rid(0), rid(1));
    // ORSet type.
    let mut a = ORSet::<u8>::new();
    let mut b = ORSet::<u8>::new();
    let by = b.add(rb, 100).expect("dots left"); // B's own live element
    a.apply(by);
    let d1 = a.add(ra, 1).expect("dots left");
    let d2 = a.add(ra, 2).expect("dots left");
    let d3 = a.add(ra, 3).expect("dots left");
    let d4 = a.add(ra, 4).expect("dots left");
    let d5 = a.remove(&2);
    b.apply(d1.clone());
    b.apply(d2.clone());
    let mut interval = d3.clone();
    interval.join(d5.clone());
    assert!(
        interval.ctx.contains(&Dot::new(ra, 2)),
        "claims a2 without carrying it"
    );
    let mut fresh = ORSet::<u8>::new();
    fresh.apply(interval);
    let mut merged = b.clone();
    merged.join(fresh);
    for e in [100u8, 1, 3] {
        assert!(
            merged.contains(&e),
            "live element {e} deleted by a gapped delta"
        );
    }
    assert!(!merged.contains(&2) && !merged.contains(&4));
    merged.apply(d4);
    let mut full = b.clone();
    full.join(a.clone());
    assert_eq!(merged, full);
    assert_eq!(
        merged.elements().copied().collect::<Vec<_>>(),
        vec![1, 3, 4, 100]
    );

    // Store map.
    let k = orset_key();
    let e = |i: u8| format!("\"e{i}\"");
    let mut a = Store::new();
    let mut b = Store::new();
    let by = mutate(&mut b, 1, &k, Mutation::Add(e(100)));
    a.apply(by);
    let ds: Vec<_> = (1..=4)
        .map(|i| mutate(&mut a, 0, &k, Mutation::Add(e(i))))
        .collect();
    let d5 = mutate(&mut a, 0, &k, Mutation::Remove(e(2)));
    b.apply(ds[0].clone());
    b.apply(ds[1].clone());
    let mut fresh = Store::new();
    fresh.apply(ds[2].clone());
    fresh.apply(d5);
    let mut merged = sjoin(&b, &fresh);
    assert_eq!(set_of(&merged, &k), vec![e(1), e(100), e(3)]);
    merged.apply(ds[3].clone());
    assert_eq!(merged, sjoin(&b, &a));
}

/// The store's removal deltas carry no entry; the join finds the removed dots' keys through the
/// dot index. Remove on A, deliver to B which holds the element: absent on B, other keys intact.
#[test]
fn store_removal_found_through_the_dot_index() {
    let k = orset_key();
    let k2 = Key::new(KeyKind::ORSet, "other");
    let m = Key::new(KeyKind::MvReg, "m");
    let l = Key::new(KeyKind::Lww, "l");
    let ts = Timestamp {
        physical_ms: 1,
        logical: 0,
        replica: rid(0),
    };
    let mut a = Store::new();
    mutate(&mut a, 0, &k, Mutation::Add(x()));
    mutate(&mut a, 0, &k, Mutation::Add("\"y\"".into()));
    mutate(&mut a, 0, &k2, Mutation::Add(x()));
    mutate(&mut a, 0, &m, Mutation::Set("1".into()));
    a.mutate(rid(0), &l, &Mutation::Set("2".into()), Some(ts))
        .expect("set");
    let mut b = Store::new();
    b.apply(a.to_delta());

    let rm = mutate(&mut a, 0, &k, Mutation::Remove(x()));
    assert!(
        rm.store.is_bottom(),
        "removal delta carries an entry: {rm:?}"
    );
    let out = b.apply(rm);
    assert_eq!(out.changed, vec![k.clone()]);
    assert_eq!(set_of(&b, &k), vec!["\"y\"".to_owned()]);
    assert_eq!(
        set_of(&b, &k2),
        vec![x()],
        "an unrelated key lost its element"
    );

    for key in [&m, &l, &k] {
        let del = mutate(&mut a, 0, key, Mutation::Delete);
        assert!(del.store.is_bottom());
        let out = b.apply(del);
        assert_eq!(out.changed, vec![key.clone()]);
        assert!(!b.entries().contains_key(key), "{key} still present on B");
        assert_eq!(b.get(key), Value::empty(key.kind));
    }
    assert_eq!(a, b);
    check_store_invariants(&b).expect("invariants");
}

/// Pitfall "next_dot reads only vv while own dots sit in the cloud → duplicate dots": the next
/// dot is one past the largest seen, never a reused one inside a gap; the gap is reported.
#[test]
fn next_dot_never_reuses_a_dot_inside_a_gap() {
    let r = rid(0);
    let c = ctx(&[(0, 1), (0, 2), (0, 5)]);
    assert_eq!(c.next_dot(r).expect("dots left"), Dot::new(r, 6));
    assert!(!c.own_dots_contiguous(r));
    assert!(CausalContext::from_range(r, 1, 5).own_dots_contiguous(r));
    assert!(CausalContext::new().own_dots_contiguous(r));
}

/// Pitfall "non-causal values under removable map keys resurrect": a deleted key stays
/// deleted when a third replica's old state (still holding the value) is gossiped afterwards.
#[test]
fn deleted_key_is_not_resurrected_by_old_state() {
    let m = Key::new(KeyKind::MvReg, "m");
    let mut a = Store::new();
    mutate(&mut a, 0, &m, Mutation::Set("1".into()));
    let old_c = a.clone();
    mutate(&mut a, 0, &m, Mutation::Delete);
    a.apply(old_c.to_delta());
    assert_eq!(a.get(&m), Value::MvReg(vec![]));
    assert!(a.entries().is_empty());
    let mut c = old_c;
    c.apply(a.to_delta());
    assert_eq!(c, a);
}

/// A refused mutation changes nothing (no dot taken).
#[test]
fn refused_mutations_change_nothing() {
    let mut s = Store::new();
    mutate(&mut s, 0, &orset_key(), Mutation::Add(x()));
    let before = s.clone();
    let lww = Key::new(KeyKind::Lww, "l");
    assert_eq!(
        s.mutate(rid(0), &lww, &Mutation::Set("1".into()), None),
        Err(MutationError::MissingTimestamp)
    );
    assert!(matches!(
        s.mutate(rid(0), &orset_key(), &Mutation::Inc(1), None),
        Err(MutationError::WrongOp { .. })
    ));
    assert!(matches!(
        s.mutate(
            rid(0),
            &Key::new(KeyKind::GCounter, "g"),
            &Mutation::Dec(1),
            None
        ),
        Err(MutationError::WrongOp { .. })
    ));
    assert_eq!(s, before);
    // A MVRegister write overwrites what the writer saw, and only that.
    let mut r1 = MVRegister::<u8>::new();
    let mut r2 = MVRegister::<u8>::new();
    let w1 = r1.write(rid(0), 1).expect("dots left");
    let w2 = r2.write(rid(1), 2).expect("dots left");
    r1.apply(w2);
    r2.apply(w1);
    assert_eq!(r1.read(), vec![&1, &2]);
    let w3 = r1.write(rid(0), 3).expect("dots left");
    r2.apply(w3);
    assert_eq!(r2.read(), vec![&3]);
}
