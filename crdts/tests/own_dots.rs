//! `mutate_own_in_place` (what stream views write with): replicas whose adds and register
//! sets cover only their own dots converge like any delta CRDT, and keeping the dots of any
//! subset of replicas (`Entry::retain_replicas`) gives exactly the state those replicas'
//! writes alone build — whatever order, duplication or interleaving the deltas arrived in.
//! That is what lets a sealed view window count exactly its seal's members.
//!
//! Seeded: `SEED=<n>` replays a run; `SOAK=1` runs ×10 cases.

mod common;

use common::{rid, seeded_rng};
use tidemark_crdts::causal_map::mutate_own_in_place;
use tidemark_crdts::dotstore::{DotFun, DotMap, DotSet};
use tidemark_crdts::{Causal, CausalContext, Entry, Key, KeyKind, Mutation, Store, Timestamp};

const REPLICAS: usize = 3;

/// One replica's own write as a delta: the written dot plus the dots it overwrote.
fn own_write(
    store: &mut Store,
    r: usize,
    key: &Key,
    m: &Mutation,
    ts: Option<Timestamp>,
) -> tidemark_crdts::StoreDelta {
    let dot = store.context().next_dot(rid(r)).expect("dots left");
    let mut entry = store.entries().get(key).cloned();
    let mut removed = Vec::new();
    mutate_own_in_place(key.kind, &mut entry, m, dot, ts, &mut removed).expect("valid op");
    assert!(
        removed.iter().all(|d| d.replica == rid(r)),
        "an own write removed another replica's dot: {removed:?}"
    );
    let written = match (m, ts) {
        (Mutation::Add(e), _) => {
            let mut map = DotMap::default();
            map.set(e.clone(), DotSet::single(dot));
            Entry::ORSet(map)
        }
        (Mutation::Set(v), Some(t)) => Entry::Lww(DotFun::single(dot, (t, v.clone()))),
        _ => unreachable!("only adds and stamped sets are generated"),
    };
    let mut ctx = CausalContext::new();
    ctx.insert(dot);
    for d in removed {
        ctx.insert(d);
    }
    let mut map = DotMap::default();
    map.set(key.clone(), written);
    let delta = Causal::new(map, ctx);
    store.apply(delta.clone());
    // The in-place result equals the delta joined into the writer's own state.
    assert_eq!(store.entries().get(key), entry.as_ref());
    delta
}

#[test]
fn own_writes_converge_and_every_subset_of_writers_is_separable() {
    let mut rng = seeded_rng("own_writes_converge_and_every_subset_of_writers_is_separable");
    for round in 0..common::cases(300) {
        let kind = if rng.chance(1, 2) {
            KeyKind::ORSet
        } else {
            KeyKind::Lww
        };
        let key = Key::new(kind, "cell");
        let mut stores: Vec<Store> = (0..REPLICAS).map(|_| Store::new()).collect();
        // Every delta with its writer, in write order.
        let mut log: Vec<(usize, tidemark_crdts::StoreDelta)> = Vec::new();
        let mut pending: Vec<Vec<usize>> = vec![Vec::new(); REPLICAS];
        let mut clock = 1u64;
        for _ in 0..(3 + rng.below(25)) {
            // Deliver a few pending deltas (any order, sometimes twice).
            for (to, queue) in pending.iter_mut().enumerate() {
                while !queue.is_empty() && rng.chance(1, 3) {
                    let i = rng.below(queue.len());
                    let li = if rng.chance(1, 4) {
                        queue[i]
                    } else {
                        queue.swap_remove(i)
                    };
                    stores[to].apply(log[li].1.clone());
                }
            }
            let r = rng.below(REPLICAS);
            clock += 1 + rng.below(3) as u64;
            let (m, ts) = if kind == KeyKind::ORSet {
                (Mutation::Add(format!("\"e{}\"", rng.below(4))), None)
            } else {
                let t = Timestamp {
                    physical_ms: rng.below(40) as u64,
                    logical: 0,
                    replica: rid(r),
                };
                (Mutation::Set(clock.to_string()), Some(t))
            };
            let delta = own_write(&mut stores[r], r, &key, &m, ts);
            log.push((r, delta));
            let li = log.len() - 1;
            for (to, queue) in pending.iter_mut().enumerate() {
                if to != r {
                    queue.push(li);
                }
            }
        }
        for (to, queue) in pending.iter_mut().enumerate() {
            while let Some(li) = queue.pop() {
                stores[to].apply(log[li].1.clone());
            }
        }
        for s in &stores[1..] {
            assert_eq!(s.entries(), stores[0].entries(), "round {round}: diverged");
        }
        let whole = stores[0]
            .entries()
            .get(&key)
            .cloned()
            .unwrap_or(Entry::bottom(kind));
        for mask in 0u32..(1 << REPLICAS) {
            let keep = |r: tidemark_crdts::ReplicaId| {
                (0..REPLICAS).any(|i| mask & (1 << i) != 0 && rid(i) == r)
            };
            // The state the kept writers' deltas alone build, joined in write order.
            let mut alone = Store::new();
            for (w, d) in &log {
                if mask & (1 << w) != 0 {
                    alone.apply(d.clone());
                }
            }
            let want = alone
                .entries()
                .get(&key)
                .cloned()
                .unwrap_or(Entry::bottom(kind));
            assert_eq!(
                whole.retain_replicas(keep).value(),
                want.value(),
                "round {round}, writers {mask:b}"
            );
        }
    }
}
