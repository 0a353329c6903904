//! `join_delta` over a backend that hands out only the part of a set the join can change
//! ([`Rows::get_part`], as the node's per-element set rows do) equals the join over whole
//! entries ([`MemStore`]): same entries, same context, same inflation and changed keys.
//!
//! Seeded: `SEED=<n>` replays a run (default fixed). Deltas come from three replicas adding,
//! re-adding, removing and deleting on a few sets, and are delivered out of order, repeated,
//! joined together, and with their stores dropped (context-only removals).

use std::collections::BTreeMap;
use tidemark_crdts::causal_map::join_delta;
use tidemark_crdts::{
    CausalContext, Dot, DotMap, DotSet, Entry, Key, KeyKind, Mutation, ReplicaId, Rows, Store,
    StoreDelta,
};

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Sets stored per element, with a dot → (key, element) index; `get_part` returns exactly
/// the elements `theirs` names plus those holding a dot of `seen`.
#[derive(Default)]
struct PartRows {
    sets: BTreeMap<Key, BTreeMap<String, DotSet>>,
    index: BTreeMap<Dot, (Key, String)>,
    /// Element rows read through `get_part`, to show the parts stay small.
    read: usize,
}

impl PartRows {
    fn entries(&self) -> Vec<(Key, Entry)> {
        self.sets
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(k, m)| {
                let mut map = DotMap::default();
                for (e, s) in m {
                    map.set(e.clone(), s.clone());
                }
                (k.clone(), Entry::ORSet(map))
            })
            .collect()
    }
    fn part(&mut self, key: &Key, names: &[String]) -> Option<Entry> {
        let set = self.sets.get(key)?;
        let mut map = DotMap::default();
        for n in names {
            if let Some(s) = set.get(n) {
                self.read += 1;
                map.set(n.clone(), s.clone());
            }
        }
        (!map.is_empty()).then_some(Entry::ORSet(map))
    }
}

fn as_map(e: Option<&Entry>) -> BTreeMap<String, DotSet> {
    match e {
        Some(Entry::ORSet(m)) => m.iter().map(|(k, s)| (k.clone(), s.clone())).collect(),
        _ => BTreeMap::new(),
    }
}

impl Rows for PartRows {
    type Error = core::convert::Infallible;
    fn get(&mut self, key: &Key) -> Result<Option<Entry>, Self::Error> {
        let names: Vec<String> = self
            .sets
            .get(key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        Ok(self.part(key, &names))
    }
    fn get_part(
        &mut self,
        key: &Key,
        theirs: Option<&Entry>,
        seen: &CausalContext,
    ) -> Result<Option<Entry>, Self::Error> {
        let mut names: Vec<String> = as_map(theirs).into_keys().collect();
        for d in seen.iter_dots() {
            if let Some((k, e)) = self.index.get(&d) {
                if k == key {
                    names.push(e.clone());
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(self.part(key, &names))
    }
    fn put(
        &mut self,
        key: &Key,
        old: Option<&Entry>,
        new: Option<&Entry>,
    ) -> Result<(), Self::Error> {
        let (o, n) = (as_map(old), as_map(new));
        let set = self.sets.entry(key.clone()).or_default();
        for (e, s) in &o {
            for d in s.iter() {
                self.index.remove(d);
            }
            set.remove(e);
        }
        for (e, s) in &n {
            for d in s.iter() {
                self.index.insert(*d, (key.clone(), e.clone()));
            }
            set.insert(e.clone(), s.clone());
        }
        Ok(())
    }
    fn keys_holding(&mut self, dots: &CausalContext) -> Result<Vec<Key>, Self::Error> {
        let mut keys: Vec<Key> = dots
            .iter_dots()
            .filter_map(|d| self.index.get(&d).map(|(k, _)| k.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

fn ok<T>(r: Result<T, core::convert::Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => match e {},
    }
}

#[test]
fn joins_over_set_parts_equal_joins_over_whole_sets() {
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9A27);
    let mut rng = Rng(seed);
    let keys = [
        Key::new(KeyKind::ORSet, "a"),
        Key::new(KeyKind::ORSet, "b"),
        Key::new(KeyKind::ORSet, "c"),
    ];
    let mut sources = [Store::new(), Store::new(), Store::new()];
    let mut deltas: Vec<StoreDelta> = Vec::new();
    let mut whole = Store::new();
    let mut parts = PartRows::default();
    let mut ctx = CausalContext::new();
    for step in 0..3_000u64 {
        let r = rng.below(3) as usize;
        let key = &keys[rng.below(3) as usize];
        let e = format!("\"e{}\"", rng.below(40));
        let m = match rng.below(10) {
            0..=5 => Mutation::Add(e),
            6..=8 => Mutation::Remove(e),
            _ => Mutation::Delete,
        };
        let d = sources[r]
            .mutate(ReplicaId(r as u128 + 1), key, &m, None)
            .expect("mutate");
        deltas.push(d);
        // Sources exchange now and then, so deltas carry removals of others' dots.
        if rng.below(8) == 0 {
            let (x, y) = (rng.below(3) as usize, rng.below(3) as usize);
            let state = sources[x].to_delta();
            sources[y].apply(state);
        }
        // Deliver: one delta, a join of several, or one with its store dropped.
        let mut delta = deltas[rng.below(deltas.len() as u64) as usize].clone();
        match rng.below(4) {
            0 => {
                for _ in 0..rng.below(4) {
                    delta.join(deltas[rng.below(deltas.len() as u64) as usize].clone());
                }
            }
            1 => delta.store = DotMap::default(),
            _ => {}
        }
        let want = whole.apply(delta.clone());
        let got = ok(join_delta(&mut parts, &mut ctx, delta));
        assert_eq!(got, want, "seed {seed}, step {step}: join outcome");
        assert_eq!(&ctx, whole.context(), "seed {seed}, step {step}: context");
        let expect: Vec<(Key, Entry)> = whole
            .entries()
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        assert_eq!(parts.entries(), expect, "seed {seed}, step {step}: entries");
    }
    assert!(parts.read > 0, "seed {seed}: parts were read");
}
