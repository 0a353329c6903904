//! Regression: a delta holding ONE dot under two keys (input the decoder refuses, so only
//! in-process) used to be joined differently the second time — which copy survived depended on
//! the state it met — so joining it twice was not idempotent (found by `weird_deltas` with
//! SEED=16946160317225851130). The join now drops such a dot from every entry and keeps it in
//! the context as a removal.

use tidemark_crdts::dotstore::DotMap;
use tidemark_crdts::{Causal, Dot, DotStore, Key, KeyKind, Mutation, ReplicaId, Store, StoreDelta};

fn rid(i: u128) -> ReplicaId {
    ReplicaId(i)
}

/// Two single-op deltas of replica 2 that both used dot (2, 1), glued into one delta.
fn glued() -> StoreDelta {
    let r = rid(2);
    let set = Key::new(KeyKind::ORSet, "a");
    let counter = Key::new(KeyKind::GCounter, "a");
    let d1 = Store::new()
        .mutate(r, &set, &Mutation::Add("\"e0\"".into()), None)
        .expect("add");
    let d2 = Store::new()
        .mutate(r, &counter, &Mutation::Inc(1), None)
        .expect("inc");
    let mut store: DotMap<Key, _> = DotMap::default();
    for (k, e) in d1.store.iter().chain(d2.store.iter()) {
        store.set(k.clone(), e.clone());
    }
    let mut ctx = d1.ctx.clone();
    ctx.join(&d2.ctx);
    Causal::new(store, ctx)
}

#[test]
fn a_dot_held_twice_in_one_delta_joins_idempotently() {
    let delta = glued();
    let mut seen = 0;
    delta.store.for_each_dot(&mut |d| {
        assert_eq!(d, Dot::new(rid(2), 1));
        seen += 1;
    });
    assert_eq!(seen, 2, "the glued delta holds the dot twice");

    // Into an empty store and into a store already holding the dot under one of the keys.
    let mut holder = Store::new();
    holder
        .mutate(
            rid(2),
            &Key::new(KeyKind::GCounter, "a"),
            &Mutation::Inc(1),
            None,
        )
        .expect("inc");
    for mut target in [Store::new(), holder] {
        target.apply(delta.clone());
        assert!(target.dots_within_context());
        let once = target.clone();
        let out = target.apply(delta.clone());
        assert_eq!(
            target, once,
            "joining the same delta twice changed the store"
        );
        assert!(
            out.changed.is_empty(),
            "second join changed {:?}",
            out.changed
        );
        // The repeated dot is seen (in the context) and held by no key.
        assert!(target.context().contains(&Dot::new(rid(2), 1)));
        let mut held = 0;
        for e in target.entries().values() {
            e.for_each_dot(&mut |d| held += u32::from(d == Dot::new(rid(2), 1)));
        }
        assert_eq!(held, 0, "the repeated dot survived under a key");
    }
}
