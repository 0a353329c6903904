//! `mutate_in_place` (the node's write path for its own operations) equals the delta-mutator
//! joined into the store (`Store::mutate`): same entry for the mutated key, no other key
//! changed, and the dots it reports removed are exactly the delta's context without the fresh
//! dot. States come from three replicas mutating, exchanging deltas and whole states in a
//! random order (so counters hold several replicas' dots and registers concurrent values).
//!
//! Seeded: `SEED=<n>` replays a run; `SOAK=1` runs ×10 cases.

mod common;

use common::{StoreOp, rid, seeded_rng, store_mutation};
use std::collections::BTreeSet;
use tidemark_crdts::causal_map::mutate_in_place;
use tidemark_crdts::{Dot, Store, Timestamp};

fn ts(physical_ms: u64, replica: usize) -> Timestamp {
    Timestamp {
        physical_ms,
        logical: 0,
        replica: rid(replica),
    }
}

#[test]
fn in_place_mutation_equals_the_delta_joined() {
    let mut rng = seeded_rng("in_place_mutation_equals_the_delta_joined");
    let rounds = common::cases(400) as usize;
    let mut checked = 0usize;
    for round in 0..rounds {
        let mut stores = [Store::new(), Store::new(), Store::new()];
        let mut clock = 1_000u64;
        for _ in 0..(5 + rng.below(40)) {
            let r = rng.below(3);
            if rng.chance(1, 5) {
                let from = rng.below(3);
                let whole = stores[from].to_delta();
                stores[r].apply(whole);
                continue;
            }
            let op = StoreOp {
                key: rng.below(10) as u8,
                code: rng.next_u64() as u8,
                val: rng.next_u64() as u8,
            };
            let (key, m) = store_mutation(op, false);
            clock += rng.below(3) as u64;
            let t = Some(ts(clock, r));
            // The store under test: the in-place path against the delta path.
            let before = stores[r].clone();
            let dot = before.context().next_dot(rid(r)).expect("dots left");
            let mut entry = before.entries().get(&key).cloned();
            let mut removed = Vec::new();
            let in_place = mutate_in_place(key.kind, &mut entry, &m, dot, t, &mut removed);
            let delta = stores[r].mutate(rid(r), &key, &m, t);
            match (in_place, delta) {
                (Ok(()), Ok(delta)) => {
                    assert_eq!(
                        entry.as_ref(),
                        stores[r].entries().get(&key),
                        "round {round}: {key} after {m:?} at {dot:?}"
                    );
                    for (k, e) in before.entries() {
                        if *k != key {
                            assert_eq!(Some(e), stores[r].entries().get(k), "round {round}");
                        }
                    }
                    let mut want: BTreeSet<Dot> = delta.ctx.iter_dots().collect();
                    assert!(want.remove(&dot), "the delta's context holds its dot");
                    let got: BTreeSet<Dot> = removed.iter().copied().collect();
                    assert_eq!(got.len(), removed.len(), "no dot reported twice");
                    assert_eq!(got, want, "round {round}: removed dots of {key} {m:?}");
                    checked += 1;
                    // Ship the delta to another replica now and then.
                    if rng.chance(1, 2) {
                        let to = rng.below(3);
                        stores[to].apply(delta);
                    }
                }
                (Err(a), Err(b)) => assert_eq!(a, b, "round {round}: same refusal"),
                (a, b) => panic!("round {round}: in place {a:?}, delta {b:?}"),
            }
        }
    }
    assert!(checked > rounds * 5, "most steps mutate ({checked})");
}

/// An entry of another kind than the key's (never stored by a correct node, but rows come from
/// disk) is refused and left exactly as it was, with no dot reported removed.
#[test]
fn an_entry_of_another_kind_is_refused_unchanged() {
    use tidemark_crdts::{Entry, KeyKind, Mutation};
    let mut s = Store::new();
    let key = tidemark_crdts::Key::new(KeyKind::GCounter, "c");
    s.mutate(rid(0), &key, &Mutation::Inc(3), None)
        .expect("counter");
    let counter: Entry = s.entries().get(&key).cloned().expect("entry");
    for (kind, m) in [
        (KeyKind::ORSet, Mutation::Add("\"x\"".into())),
        (KeyKind::Lww, Mutation::Set("1".into())),
        (KeyKind::MvReg, Mutation::Delete),
        (KeyKind::PNCounter, Mutation::Dec(1)),
    ] {
        let mut entry = Some(counter.clone());
        let mut removed = Vec::new();
        let dot = s.context().next_dot(rid(0)).expect("dot");
        let r = mutate_in_place(kind, &mut entry, &m, dot, Some(ts(5, 0)), &mut removed);
        assert!(r.is_err(), "{kind:?} {m:?} on a gcounter entry");
        assert_eq!(entry.as_ref(), Some(&counter), "unchanged");
        assert!(removed.is_empty());
    }
}
