//! The inline (allocation-free) forms of one-range interval sets, one-replica contexts,
//! one-dot sets, one-entry dot functions, one-key dot maps and one-entry counters change
//! nothing a user or a peer can observe:
//! * every value encodes to exactly the bytes (bincode) and text (JSON) that the former plain
//!   `Vec`/`BTreeMap` shapes produced, for 0, 1 and several entries (ARCHITECTURE.md 8a: one
//!   value, one encoding; stored rows and logged deltas stay readable);
//! * a one-key `DotMap` is equal, hashes equal and encodes equal whichever form holds it (built
//!   by `set` on an empty map, left over after a `take`, decoded, or produced by a join).

use serde::Serialize;
use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use tidemark_crdts::dotstore::{DotFun, DotMap, DotSet};
use tidemark_crdts::{
    Causal, CausalContext, Dot, DotStore, GCounter, IntervalSet, Lattice, ORSet, ReplicaId,
};

const A: ReplicaId = ReplicaId(0x8f3e_0000_0000_4000_8000_0000_0000_00aa);
const B: ReplicaId = ReplicaId(0x1c07_0000_0000_4000_8000_0000_0000_00bb);
const C: ReplicaId = ReplicaId(0xc0de_0000_0000_4000_8000_0000_0000_00cc);

// The former shapes, as the plain derives wrote them.
#[derive(Serialize)]
#[serde(rename = "IntervalSet")]
struct OldIntervalSet {
    ranges: Vec<(u64, u64)>,
}

#[derive(Serialize)]
#[serde(rename = "CausalContext")]
struct OldContext {
    dots: BTreeMap<ReplicaId, OldIntervalSet>,
}

#[derive(Serialize)]
#[serde(rename = "Dot")]
struct OldDot {
    replica: ReplicaId,
    seq: u64,
}

#[derive(Serialize)]
#[serde(rename = "DotSet")]
struct OldDotSet(Vec<OldDot>);

#[derive(Serialize)]
#[serde(rename = "DotFun")]
struct OldDotFun(Vec<(OldDot, u64)>);

#[derive(Serialize)]
#[serde(rename = "DotMap")]
struct OldDotMap(BTreeMap<u64, OldDotSet>);

#[derive(Serialize)]
#[serde(rename = "GCounter")]
struct OldGCounter {
    entries: Vec<(ReplicaId, u64)>,
}

fn bytes<T: Serialize>(v: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(v, bincode::config::standard()).expect("encodes")
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("json encodes")
}

fn same_encoding<N: Serialize, O: Serialize>(new: &N, old: &O) {
    assert_eq!(bytes(new), bytes(old), "bincode bytes differ");
    assert_eq!(json(new), json(old), "JSON text differs");
}

fn old_set(s: &IntervalSet) -> OldIntervalSet {
    OldIntervalSet {
        ranges: s.ranges().to_vec(),
    }
}

fn old_ctx(c: &CausalContext) -> OldContext {
    OldContext {
        dots: c.entries().map(|(r, s)| (*r, old_set(s))).collect(),
    }
}

fn old_dots(s: &DotSet) -> OldDotSet {
    OldDotSet(
        s.iter()
            .map(|d| OldDot {
                replica: d.replica,
                seq: d.seq,
            })
            .collect(),
    )
}

fn hash_of<T: Hash>(v: &T) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

#[test]
fn interval_sets_and_contexts_encode_as_before() {
    let sets = [
        IntervalSet::new(),
        IntervalSet::from_range(1, 7),
        IntervalSet::from_ranges(vec![(1, 3), (5, 9), (u64::MAX - 1, u64::MAX)]).expect("ok"),
    ];
    for s in &sets {
        same_encoding(s, &old_set(s));
    }
    let mut many = CausalContext::from_range(A, 1, 40);
    many.insert(Dot::new(A, 50));
    many.insert_range(B, 3, 9);
    many.insert(Dot::new(C, u64::MAX));
    let contexts = [
        CausalContext::new(),
        CausalContext::from_dot(Dot::new(B, 1)),
        CausalContext::from_range(A, 1, 1_000_000),
        many,
    ];
    for c in &contexts {
        same_encoding(c, &old_ctx(c));
    }
}

#[test]
fn dot_stores_and_counters_encode_as_before() {
    let d = |r, s| Dot::new(r, s);
    for set in [
        DotSet::default(),
        DotSet::single(d(A, 3)),
        DotSet::from_dots(vec![d(B, 9), d(A, 3), d(C, 1)]),
    ] {
        same_encoding(&set, &old_dots(&set));
    }
    for entries in [
        vec![],
        vec![(d(A, 2), 7u64)],
        vec![(d(A, 2), 7), (d(B, 1), 3)],
    ] {
        let f = DotFun::from_entries(entries);
        // The former shape of the same (canonical, ascending by dot) entries.
        let old = OldDotFun(
            f.iter()
                .map(|(d, v)| {
                    (
                        OldDot {
                            replica: d.replica,
                            seq: d.seq,
                        },
                        *v,
                    )
                })
                .collect(),
        );
        same_encoding(&f, &old);
    }
    for n in [0u64, 1, 5] {
        let mut m: DotMap<u64, DotSet> = DotMap::default();
        let mut old = BTreeMap::new();
        for i in 0..n {
            let s = DotSet::single(d(A, i + 1));
            old.insert(i * 10, old_dots(&s));
            m.set(i * 10, s);
        }
        same_encoding(&m, &OldDotMap(old));
    }
    let mut c = GCounter::new();
    same_encoding(&c, &OldGCounter { entries: vec![] });
    c.inc(A, 3);
    same_encoding(
        &c,
        &OldGCounter {
            entries: vec![(A, 3)],
        },
    );
    let delta = c.inc(B, 4);
    same_encoding(
        &delta,
        &OldGCounter {
            entries: vec![(B, 4)],
        },
    );
    same_encoding(
        &c,
        &OldGCounter {
            entries: vec![(B, 4), (A, 3)],
        },
    );
}

#[test]
fn a_one_key_map_is_the_same_value_in_every_form() {
    let s = DotSet::single(Dot::new(A, 1));
    // Inline: `set` on an empty map.
    let mut inline: DotMap<u64, DotSet> = DotMap::default();
    inline.set(7, s.clone());
    // Tree: two keys, then one taken away.
    let mut tree: DotMap<u64, DotSet> = DotMap::default();
    tree.set(3, DotSet::single(Dot::new(A, 2)));
    tree.set(7, s.clone());
    assert!(tree.take(&3).is_some());
    // Decoded (the decoder builds the tree form).
    let decoded: DotMap<u64, DotSet> =
        bincode::serde::decode_from_slice(&bytes(&inline), bincode::config::standard())
            .expect("decodes")
            .0;
    // Joined into an empty map.
    let mut joined: DotMap<u64, DotSet> = DotMap::default();
    joined.join(
        &CausalContext::new(),
        inline.clone(),
        &CausalContext::from_dot(Dot::new(A, 1)),
    );
    for other in [&tree, &decoded, &joined] {
        assert_eq!(&inline, other);
        assert_eq!(hash_of(&inline), hash_of(other));
        assert_eq!(bytes(&inline), bytes(other));
        assert_eq!(format!("{inline:?}"), format!("{other:?}"));
        assert_eq!(other.len(), 1);
        assert_eq!(other.get(&7), Some(&s));
        assert_eq!(other.keys().collect::<Vec<_>>(), vec![&7]);
    }
    // Different content is never equal, whatever the forms.
    let mut other_key: DotMap<u64, DotSet> = DotMap::default();
    other_key.set(8, s.clone());
    assert_ne!(inline, other_key);
    assert_ne!(tree, other_key);
    // Growing an inline map keeps every entry, in key order.
    let mut grown = inline.clone();
    grown.set(2, DotSet::single(Dot::new(B, 1)));
    grown.set(9, DotSet::single(Dot::new(B, 2)));
    assert_eq!(grown.keys().copied().collect::<Vec<_>>(), vec![2, 7, 9]);
    assert_eq!(grown.get(&7), Some(&s));
    // A causal pair over the inline map roundtrips through the compact codec.
    let pair = Causal::new(inline.clone(), CausalContext::from_dot(Dot::new(A, 1)));
    let back: Causal<DotMap<u64, DotSet>> =
        bincode::serde::decode_from_slice(&bytes(&pair), bincode::config::standard())
            .expect("decodes")
            .0;
    assert_eq!(back, pair);
    assert!(back.dots_within_context());
}

#[test]
fn counters_join_one_entry_deltas_like_the_merge() {
    // The in-place path for one-entry deltas gives what the general sorted merge gives.
    let ids = [A, B, C];
    let mut fast = GCounter::new();
    let mut slow = GCounter::new();
    for i in 0..300u64 {
        let r = ids[(i % 3) as usize];
        let mut scratch = GCounter::new();
        let delta = scratch.inc(r, i + 1);
        fast.join(delta.clone());
        // Two-entry delta: always the general merge.
        let mut pair = GCounter::from_entries([(r, i + 1), (ReplicaId(7), 1)]);
        pair.join(slow.clone());
        slow = pair;
    }
    fast.join(GCounter::from_entries([(ReplicaId(7), 1)]));
    assert_eq!(fast, slow);
    assert_eq!(fast.value(), 298 + 299 + 300 + 1);
}

/// Asserts that `a` and `b` are the same value to every observer: equal, same hash, same
/// bincode bytes and JSON text, same `Debug`, same entries in the same order.
fn same_value<K, S>(a: &DotMap<K, S>, b: &DotMap<K, S>)
where
    K: Ord + Clone + std::fmt::Debug + Hash + Serialize,
    S: DotStore + Eq + Hash + Serialize,
{
    assert_eq!(a, b);
    assert_eq!(hash_of(a), hash_of(b));
    assert_eq!(bytes(a), bytes(b));
    assert_eq!(json(a), json(b));
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    assert_eq!(a.len(), b.len());
    assert_eq!(a.iter().len(), b.iter().len());
    assert!(a.iter().eq(b.iter()));
    assert!(a.layout_is_valid() && b.layout_is_valid());
}

/// The one-key map a mutator returns (`ORSet::add`'s delta, held inline in the map without a
/// heap allocation) is the same value as the chunked form with the same entry, for keys and
/// children that own heap memory too (`String` keys, several dots, a nested map), and it
/// behaves as that form under every operation: `take`, `set` of a second key, `remove_dots`,
/// `join`, clone, and the compact codec of the causal pair.
#[test]
fn a_delta_held_inline_is_the_same_value_as_the_chunked_form() {
    // `ORSet::add`'s delta against the chunked form with the same entry.
    let mut set: ORSet<u64> = ORSet::new();
    set.add(A, 3).expect("dots left");
    let delta = set.add(A, 7).expect("dots left");
    let mut tree: DotMap<u64, DotSet> = DotMap::default();
    tree.set(3, DotSet::single(Dot::new(B, 9)));
    tree.set(7, DotSet::single(Dot::new(A, 2)));
    assert!(tree.take(&3).is_some());
    same_value(&delta.store, &tree);
    let decoded: DotMap<u64, DotSet> =
        bincode::serde::decode_from_slice(&bytes(&delta.store), bincode::config::standard())
            .expect("decodes")
            .0;
    same_value(&delta.store, &decoded);
    let back: Causal<DotMap<u64, DotSet>> =
        bincode::serde::decode_from_slice(&bytes(&delta), bincode::config::standard())
            .expect("decodes")
            .0;
    assert_eq!(back, delta);

    // Heap-owning key and child: a `String` key over two dots.
    let two = DotSet::from_dots(vec![Dot::new(B, 4), Dot::new(A, 1)]);
    let mut inline: DotMap<String, DotSet> = DotMap::default();
    inline.set("e".to_owned(), two.clone());
    let mut tree: DotMap<String, DotSet> = DotMap::default();
    tree.set("f".to_owned(), DotSet::single(Dot::new(C, 1)));
    tree.set("e".to_owned(), two.clone());
    tree.set("f".to_owned(), DotSet::default());
    same_value(&inline, &tree);
    same_value(&inline.clone(), &tree.clone());
    // Replacing the child of the one key keeps it inline and returns the old child.
    let mut replaced = inline.clone();
    replaced.set("e".to_owned(), DotSet::single(Dot::new(C, 2)));
    assert_eq!(
        replaced.get(&"e".to_owned()),
        Some(&DotSet::single(Dot::new(C, 2)))
    );
    assert_eq!(replaced.len(), 1);
    // A second key, below and above: every entry kept, in key order.
    let mut grown = inline.clone();
    grown.set("a".to_owned(), DotSet::single(Dot::new(C, 3)));
    grown.set("z".to_owned(), DotSet::single(Dot::new(C, 4)));
    assert_eq!(
        grown.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["a", "e", "z"]
    );
    assert!(grown.layout_is_valid());
    // Taking a key that is not there changes nothing; taking the key empties the map.
    let mut taken = inline.clone();
    assert_eq!(taken.take(&"x".to_owned()), None);
    same_value(&taken, &tree);
    assert_eq!(taken.take(&"e".to_owned()), Some(two.clone()));
    assert!(taken.is_empty() && taken.is_bottom());
    same_value(&taken, &DotMap::default());
    // Removing one of the two dots keeps the key; removing both drops it.
    let mut fewer = inline.clone();
    assert_eq!(
        fewer.remove_dots(&CausalContext::from_dot(Dot::new(A, 1))),
        1
    );
    assert_eq!(
        fewer.get(&"e".to_owned()),
        Some(&DotSet::single(Dot::new(B, 4)))
    );
    let mut both = CausalContext::from_dot(Dot::new(A, 1));
    both.insert(Dot::new(B, 4));
    let mut none = inline.clone();
    assert_eq!(none.remove_dots(&both), 2);
    same_value(&none, &DotMap::default());
    // Joins: an inline map on either side gives what the chunked form gives.
    let ctx = two.dots();
    let other = DotSet::single(Dot::new(C, 5));
    let mut theirs: DotMap<String, DotSet> = DotMap::default();
    theirs.set("b".to_owned(), other.clone());
    let other_ctx = other.dots();
    for mine in [&inline, &tree] {
        let mut joined = mine.clone();
        joined.join(&ctx, theirs.clone(), &other_ctx);
        let mut reverse = theirs.clone();
        reverse.join(&other_ctx, mine.clone(), &ctx);
        same_value(&joined, &reverse);
        assert_eq!(
            joined.keys().map(String::as_str).collect::<Vec<_>>(),
            vec!["b", "e"]
        );
    }
    // The compact codec of a causal pair over the inline map.
    let pair = Causal::new(inline.clone(), ctx.clone());
    let back: Causal<DotMap<String, DotSet>> =
        bincode::serde::decode_from_slice(&bytes(&pair), bincode::config::standard())
            .expect("decodes")
            .0;
    assert_eq!(back, pair);
    assert_eq!(bytes(&back), bytes(&Causal::new(tree.clone(), ctx)));

    // A nested map: a one-key map whose child is itself a one-key map, against chunked forms.
    let mut nested: DotMap<u64, DotMap<String, DotSet>> = DotMap::default();
    nested.set(1, inline.clone());
    let mut nested_tree: DotMap<u64, DotMap<String, DotSet>> = DotMap::default();
    nested_tree.set(0, grown.clone());
    nested_tree.set(1, tree.clone());
    nested_tree.set(0, DotMap::default());
    same_value(&nested, &nested_tree);
}
