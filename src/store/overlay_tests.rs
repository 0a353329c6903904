//! The overlay of the state tables ([`super::overlay`]) read through [`super::kv::KvRead`]
//! against a `BTreeMap` model, over real (in-memory) redb tables.
//!
//! The model test runs random commit groups (puts and deletions over a small key space whose
//! keys are prefixes of each other, empty values included) published as layers (merging as
//! they go), checkpoints (freeze the oldest layers, keep publishing, fold them into redb,
//! retire them) and whole-overlay folds (clear to a new generation), and after every step
//! compares every key's lookup and random ranges through [`Merged`] with the model.

use super::kv::{Bytes, KvRead, bounds_empty, in_bounds};
use super::overlay::{ENTRY_OVERHEAD, Layer, Layers, Lookup, Merged, Published, StateTable};
use super::tables::{DOTS, ELEMS, ROWS};
use proptest::prelude::*;
use redb::{Database, ReadableDatabase, TableDefinition};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// The model: every `(table, key)` with its value, as base + all groups applied in order.
type Model = BTreeMap<(StateTable, Vec<u8>), Vec<u8>>;

/// One write of a group: table, key, value (`None`: a deletion).
pub(super) type Op = (StateTable, Vec<u8>, Option<Vec<u8>>);

/// A pair of range bounds, owned.
type Bounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

fn def(t: StateTable) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
    match t {
        StateTable::Rows => ROWS,
        StateTable::Elems => ELEMS,
        StateTable::Dots => DOTS,
    }
}

/// Every key of the space: bytes 0..3, lengths 0..=3 (so many keys are prefixes of others).
fn key_space() -> Vec<Vec<u8>> {
    let mut keys = vec![Vec::new()];
    let mut last = vec![Vec::new()];
    for _ in 0..3 {
        let next: Vec<Vec<u8>> = last
            .iter()
            .flat_map(|k: &Vec<u8>| {
                (0u8..3).map(move |b| {
                    let mut k = k.clone();
                    k.push(b);
                    k
                })
            })
            .collect();
        keys.extend(next.iter().cloned());
        last = next;
    }
    keys
}

fn arc(b: &[u8]) -> Arc<[u8]> {
    Arc::from(b)
}

pub(super) fn layer_of(ops: &[Op]) -> Layer {
    Layer::build(
        ops.iter()
            .map(|(t, k, v)| (*t, arc(k), v.as_deref().map(arc))),
    )
}

fn apply_model(model: &mut Model, ops: &[Op]) {
    for (t, k, v) in ops {
        match v {
            Some(v) => model.insert((*t, k.clone()), v.clone()),
            None => model.remove(&(*t, k.clone())),
        };
    }
}

pub(super) fn in_memory_db() -> Database {
    redb::Builder::new()
        .create_with_backend(redb::backends::InMemoryBackend::new())
        .expect("in-memory redb")
}

/// Writes `ops` (in order) into redb's tables in one committed transaction, creating them.
pub(super) fn write_base(db: &Database, ops: &[Op]) {
    let txn = db.begin_write().expect("begin write");
    {
        let mut tables = StateTable::ALL.map(|t| txn.open_table(def(t)).expect("open"));
        for (t, k, v) in ops {
            let table = &mut tables[t.index()];
            match v {
                Some(v) => {
                    table.insert(k.as_slice(), v.as_slice()).expect("insert");
                }
                None => {
                    table.remove(k.as_slice()).expect("remove");
                }
            }
        }
    }
    txn.commit().expect("commit");
}

/// The folded layer as redb writes (what a checkpoint writes, key-sorted per table).
fn layer_ops(layer: &Layer) -> Vec<Op> {
    StateTable::ALL
        .iter()
        .flat_map(|&t| {
            layer
                .table(t)
                .iter()
                .map(move |(k, v)| (t, k.to_vec(), v.as_deref().map(<[u8]>::to_vec)))
        })
        .collect()
}

fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The model's answer for a range (written without the code under test's helpers).
fn model_range(model: &Model, t: StateTable, (lo, hi): &Bounds) -> Vec<(Vec<u8>, Vec<u8>)> {
    model
        .iter()
        .filter(|((mt, k), _)| {
            *mt == t
                && match lo {
                    Bound::Included(a) => k >= a,
                    Bound::Excluded(a) => k > a,
                    Bound::Unbounded => true,
                }
                && match hi {
                    Bound::Included(b) => k <= b,
                    Bound::Excluded(b) => k < b,
                    Bound::Unbounded => true,
                }
        })
        .map(|((_, k), v)| (k.clone(), v.clone()))
        .collect()
}

fn read_range(kv: &impl KvRead, (lo, hi): &Bounds) -> Vec<(Vec<u8>, Vec<u8>)> {
    kv.range_bytes(bound_ref(lo), bound_ref(hi))
        .expect("range")
        .map(|r| {
            let (k, v) = r.expect("range item");
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// `layers` over `bases` (one per state table) answer every key of the space and every range
/// of `ranges` (and the whole table) as `model` does.
fn check<B: KvRead>(
    layers: &Layers,
    bases: &[B; 3],
    model: &Model,
    keys: &[Vec<u8>],
    ranges: &[Bounds],
    what: &str,
) {
    for t in StateTable::ALL {
        let merged = Merged {
            layers,
            table: t,
            base: &bases[t.index()],
        };
        for k in keys {
            let got = merged.get_bytes(k).expect("get").map(|v| v.to_vec());
            assert_eq!(got.as_ref(), model.get(&(t, k.clone())), "{what}: get {t:?} {k:?}");
        }
        let all = (Bound::Unbounded, Bound::Unbounded);
        for r in ranges.iter().chain([&all]) {
            assert_eq!(
                read_range(&merged, r),
                model_range(model, t, r),
                "{what}: range {t:?} {r:?}"
            );
        }
    }
}

/// After every push each unfrozen layer holds less than half the entries of the one before
/// it, and the list stays logarithmic in the groups published.
fn check_shape(layers: &Layers, groups: usize, what: &str) {
    let list = layers.layers();
    for pair in list.get(layers.frozen()..).unwrap_or(&[]).windows(2) {
        assert!(
            pair[1].entries() * 2 < pair[0].entries(),
            "{what}: adjacent layers of {} and {} entries not merged",
            pair[0].entries(),
            pair[1].entries()
        );
    }
    let bound = 2.0 * (groups.max(1) as f64).log2() + 2.0;
    let unfrozen = list.len() - layers.frozen();
    assert!(
        unfrozen as f64 <= bound && layers.frozen() as f64 <= bound,
        "{what}: {} layers ({} frozen) after {groups} groups",
        list.len(),
        layers.frozen()
    );
    assert_eq!(
        layers.bytes(),
        list.iter().map(|l| l.bytes()).sum::<usize>(),
        "{what}: bytes"
    );
}

/// One step of the model test.
#[derive(Clone, Debug)]
enum Step {
    /// A commit group's writes, published as one layer.
    Group(Vec<Op>),
    /// A checkpoint begins: the `k` oldest layers are frozen (ignored while one is running).
    Freeze(usize),
    /// The running checkpoint folds its frozen layers into redb, commits and retires them.
    Retire,
    /// A write transaction folds the whole overlay into redb and clears it to a new
    /// generation (ignored while a checkpoint is running: the wiring must finish or abandon
    /// it first, see `Published`).
    Clear,
}

fn table_strategy() -> impl Strategy<Value = StateTable> {
    prop_oneof![
        Just(StateTable::Rows),
        Just(StateTable::Elems),
        Just(StateTable::Dots)
    ]
}

fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..3, 0..4)
}

fn op_strategy() -> impl Strategy<Value = Op> {
    (
        table_strategy(),
        key_strategy(),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..3)),
    )
}

fn bound_strategy() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        Just(Bound::Unbounded),
        key_strategy().prop_map(Bound::Included),
        key_strategy().prop_map(Bound::Excluded),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => proptest::collection::vec(op_strategy(), 0..8).prop_map(Step::Group),
        1 => (1usize..4).prop_map(Step::Freeze),
        1 => Just(Step::Retire),
        1 => Just(Step::Clear),
    ]
}

/// Reads `layers` through the committed tables of `db` and checks them against `model`.
fn check_committed(
    db: &Database,
    layers: &Layers,
    model: &Model,
    keys: &[Vec<u8>],
    ranges: &[Bounds],
    what: &str,
) {
    let rtxn = db.begin_read().expect("begin read");
    let bases = StateTable::ALL.map(|t| rtxn.open_table(def(t)).expect("open"));
    check(layers, &bases, model, keys, ranges, what);
}

/// Folds `layer` into redb through one write transaction; before it commits, `layers` read
/// over that transaction's own tables must already answer as `model`.
fn fold_into(
    db: &Database,
    layer: &Layer,
    layers: &Layers,
    model: &Model,
    keys: &[Vec<u8>],
    ranges: &[Bounds],
    what: &str,
) {
    let txn = db.begin_write().expect("begin write");
    {
        let mut tables = StateTable::ALL.map(|t| txn.open_table(def(t)).expect("open"));
        for (t, k, v) in layer_ops(layer) {
            let table = &mut tables[t.index()];
            match v {
                Some(v) => {
                    table.insert(k.as_slice(), v.as_slice()).expect("insert");
                }
                None => {
                    table.remove(k.as_slice()).expect("remove");
                }
            }
        }
        check(layers, &tables, model, keys, ranges, what);
    }
    txn.commit().expect("commit");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Groups published as layers over a redb base, with checkpoints and whole folds between
    /// them, read through `Merged` exactly as the model of all writes applied in order: every
    /// key's lookup and random ranges (bounds included, excluded, unbounded, inverted), also
    /// while a checkpoint is written (over its write transaction) and between its commit and
    /// its retirement (old list over the new redb). The list stays geometric and logarithmic.
    #[test]
    fn overlay_reads_as_model(
        base in proptest::collection::vec(op_strategy(), 0..30),
        steps in proptest::collection::vec(step_strategy(), 1..40),
        ranges in proptest::collection::vec((bound_strategy(), bound_strategy()), 1..6),
    ) {
        let keys = key_space();
        let db = in_memory_db();
        write_base(&db, &base);
        let mut model = Model::new();
        apply_model(&mut model, &base);
        let published = Published::new(0);
        let mut checkpoint: Option<Arc<Layers>> = None;
        let mut groups = 0usize;
        for (i, step) in steps.iter().enumerate() {
            let what = format!("step {i} {step:?}");
            match step {
                Step::Group(ops) => {
                    let layer = layer_of(ops);
                    let empty = layer.is_empty();
                    let before = published.snapshot();
                    let after = published.publish(layer);
                    if empty {
                        prop_assert_eq!(after.len(), before.len());
                    } else {
                        groups += 1;
                    }
                    // Frozen layers are never merged into.
                    prop_assert_eq!(after.frozen(), before.frozen());
                    for (a, b) in after.layers().iter().zip(before.layers()).take(before.frozen()) {
                        prop_assert!(Arc::ptr_eq(a, b));
                    }
                    apply_model(&mut model, ops);
                }
                Step::Freeze(k) => {
                    if checkpoint.is_none() {
                        checkpoint = published.freeze_oldest(*k);
                        if let Some(frozen) = &checkpoint {
                            prop_assert_eq!(frozen.frozen(), (*k).min(frozen.len()));
                        }
                    }
                }
                Step::Retire => {
                    if let Some(frozen) = checkpoint.take() {
                        let (folded, rest) = frozen.drain_oldest(frozen.frozen());
                        prop_assert_eq!(rest.frozen(), 0);
                        let current = published.snapshot();
                        fold_into(&db, &folded, &current, &model, &keys, &ranges, &what);
                        check_committed(&db, &current, &model, &keys, &ranges, &what);
                        prop_assert!(published.retire_frozen(frozen.generation()));
                        let retired = published.snapshot();
                        prop_assert_eq!(retired.len(), current.len() - frozen.frozen());
                        prop_assert_eq!(retired.frozen(), 0);
                    }
                }
                Step::Clear => {
                    if checkpoint.is_none() {
                        let current = published.snapshot();
                        let (folded, rest) = current.drain_oldest(current.len());
                        prop_assert!(rest.is_empty());
                        fold_into(&db, &folded, &current, &model, &keys, &ranges, &what);
                        let generation = current.generation() + 1;
                        prop_assert!(published.clear_to(generation));
                        prop_assert!(!published.clear_to(generation));
                        prop_assert_eq!(published.snapshot().generation(), generation);
                    }
                }
            }
            let layers = published.snapshot();
            check_shape(&layers, groups, &what);
            check_committed(&db, &layers, &model, &keys, &ranges, &what);
        }
    }

    /// `Layers::get` and `Layers::range` alone (no base) give each key's last write across the
    /// pushed groups, deletions as such, whatever merges happened.
    #[test]
    fn layers_alone_give_last_writes(
        groups in proptest::collection::vec(proptest::collection::vec(op_strategy(), 0..8), 1..30),
        lo in bound_strategy(),
        hi in bound_strategy(),
    ) {
        let mut layers = Layers::new(7);
        let mut last: BTreeMap<(StateTable, Vec<u8>), Option<Vec<u8>>> = BTreeMap::new();
        for ops in &groups {
            layers = layers.push(Arc::new(layer_of(ops)));
            for (t, k, v) in ops {
                last.insert((*t, k.clone()), v.clone());
            }
        }
        prop_assert_eq!(layers.generation(), 7);
        for t in StateTable::ALL {
            for k in key_space() {
                let want = match last.get(&(t, k.clone())) {
                    Some(Some(v)) => Lookup::Put(v),
                    Some(None) => Lookup::Deleted,
                    None => Lookup::Absent,
                };
                prop_assert_eq!(layers.get(t, &k), want);
            }
            let got: Vec<(Vec<u8>, Option<Vec<u8>>)> = layers
                .range(t, bound_ref(&lo), bound_ref(&hi))
                .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                .collect();
            let want: Vec<(Vec<u8>, Option<Vec<u8>>)> = if bounds_empty(bound_ref(&lo), bound_ref(&hi)) {
                Vec::new()
            } else {
                last.range((
                    lo.clone().map(|k| (t, k)),
                    hi.clone().map(|k| (t, k)),
                ))
                .filter(|((mt, _), _)| *mt == t)
                .map(|((_, k), v)| (k.clone(), v.clone()))
                .collect()
            };
            prop_assert_eq!(got, want);
        }
    }
}

#[test]
fn last_write_wins_inside_one_layer() {
    let layer = layer_of(&[
        (StateTable::Rows, b"a".to_vec(), Some(b"1".to_vec())),
        (StateTable::Rows, b"b".to_vec(), Some(b"2".to_vec())),
        (StateTable::Rows, b"a".to_vec(), None),
        (StateTable::Elems, b"a".to_vec(), Some(b"e".to_vec())),
        (StateTable::Rows, b"a".to_vec(), Some(b"3".to_vec())),
        (StateTable::Dots, b"d".to_vec(), Some(b"x".to_vec())),
        (StateTable::Dots, b"d".to_vec(), None),
        (StateTable::Rows, Vec::new(), Some(Vec::new())),
    ]);
    let rows: Vec<(&[u8], Option<&[u8]>)> = layer
        .table(StateTable::Rows)
        .iter()
        .map(|(k, v)| (&**k, v.as_deref()))
        .collect();
    assert_eq!(
        rows,
        vec![
            (&b""[..], Some(&b""[..])),
            (&b"a"[..], Some(&b"3"[..])),
            (&b"b"[..], Some(&b"2"[..]))
        ]
    );
    assert_eq!(layer.table(StateTable::Elems).len(), 1);
    assert_eq!(layer.table(StateTable::Dots).len(), 1);
    assert_eq!(layer.entries(), 5);
    // Keys + values + overhead: rows "" "" / a 3 / b 2, elems a e, dots d (deleted).
    assert_eq!(layer.bytes(), (2 + 2 + 2 + 1) + 5 * ENTRY_OVERHEAD);
    let layers = Layers::new(0).push(Arc::new(layer));
    assert_eq!(layers.get(StateTable::Rows, b"a"), Lookup::Put(b"3"));
    assert_eq!(layers.get(StateTable::Dots, b"d"), Lookup::Deleted);
    assert_eq!(layers.get(StateTable::Dots, b"a"), Lookup::Absent);
    assert_eq!(layers.get(StateTable::Rows, b""), Lookup::Put(b""));
}

#[test]
fn deletion_hides_a_base_key() {
    let db = in_memory_db();
    write_base(
        &db,
        &[
            (StateTable::Rows, b"a".to_vec(), Some(b"A".to_vec())),
            (StateTable::Rows, b"b".to_vec(), Some(b"B".to_vec())),
            (StateTable::Rows, b"c".to_vec(), Some(b"C".to_vec())),
        ],
    );
    let layers = Layers::new(0).push(Arc::new(layer_of(&[
        (StateTable::Rows, b"b".to_vec(), None),
        (StateTable::Rows, b"d".to_vec(), Some(b"D".to_vec())),
        (StateTable::Rows, b"e".to_vec(), None),
    ])));
    let rtxn = db.begin_read().expect("read");
    let base = rtxn.open_table(ROWS).expect("open");
    let merged = Merged {
        layers: &layers,
        table: StateTable::Rows,
        base: &base,
    };
    assert_eq!(merged.get_bytes(b"b").expect("get").map(|v| v.to_vec()), None);
    assert_eq!(
        merged.get_bytes(b"a").expect("get").map(|v| v.to_vec()),
        Some(b"A".to_vec())
    );
    assert_eq!(merged.get_bytes(b"e").expect("get").map(|v| v.to_vec()), None);
    let all = read_range(&merged, &(Bound::Unbounded, Bound::Unbounded));
    assert_eq!(
        all,
        vec![
            (b"a".to_vec(), b"A".to_vec()),
            (b"c".to_vec(), b"C".to_vec()),
            (b"d".to_vec(), b"D".to_vec())
        ]
    );
    // Another table of the same layers is untouched.
    assert_eq!(layers.get(StateTable::Elems, b"b"), Lookup::Absent);
}

#[test]
fn range_bounds_at_exact_keys() {
    let db = in_memory_db();
    write_base(
        &db,
        &[
            (StateTable::Dots, b"a".to_vec(), Some(b"1".to_vec())),
            (StateTable::Dots, b"c".to_vec(), Some(b"3".to_vec())),
            (StateTable::Dots, b"e".to_vec(), Some(b"5".to_vec())),
        ],
    );
    let layers = Layers::new(0).push(Arc::new(layer_of(&[
        (StateTable::Dots, b"b".to_vec(), Some(b"2".to_vec())),
        (StateTable::Dots, b"c".to_vec(), Some(b"33".to_vec())),
        (StateTable::Dots, b"d".to_vec(), Some(b"4".to_vec())),
    ])));
    let rtxn = db.begin_read().expect("read");
    let base = rtxn.open_table(DOTS).expect("open");
    let merged = Merged {
        layers: &layers,
        table: StateTable::Dots,
        base: &base,
    };
    let keys = |lo: Bound<&[u8]>, hi: Bound<&[u8]>| -> Vec<Vec<u8>> {
        merged
            .range_bytes(lo, hi)
            .expect("range")
            .map(|r| r.expect("item").0.to_vec())
            .collect()
    };
    let k = |s: &str| s.as_bytes().to_vec();
    use Bound::{Excluded, Included, Unbounded};
    // Bounds on a layer key (b), a key in both (c), a base key (e).
    assert_eq!(keys(Included(b"b"), Included(b"c")), vec![k("b"), k("c")]);
    assert_eq!(keys(Excluded(b"b"), Excluded(b"e")), vec![k("c"), k("d")]);
    assert_eq!(keys(Excluded(b"a"), Included(b"e")), vec![k("b"), k("c"), k("d"), k("e")]);
    assert_eq!(keys(Included(b"c"), Excluded(b"c")), Vec::<Vec<u8>>::new());
    assert_eq!(keys(Excluded(b"c"), Excluded(b"c")), Vec::<Vec<u8>>::new());
    assert_eq!(keys(Included(b"c"), Included(b"c")), vec![k("c")]);
    assert_eq!(keys(Included(b"d"), Included(b"b")), Vec::<Vec<u8>>::new());
    assert_eq!(keys(Excluded(b"d"), Unbounded), vec![k("e")]);
    assert_eq!(keys(Unbounded, Excluded(b"b")), vec![k("a")]);
    // The layer's value wins the shared key.
    let c: Vec<(Vec<u8>, Vec<u8>)> = read_range(
        &merged,
        &(Bound::Included(k("c")), Bound::Included(k("c"))),
    );
    assert_eq!(c, vec![(k("c"), k("33"))]);
    // redb alone, through the same trait, with inverted bounds: empty, no panic.
    assert!(
        base.range_bytes(Included(b"e"), Included(b"a"))
            .expect("range")
            .next()
            .is_none()
    );
}

#[test]
fn push_merges_and_the_newer_layer_wins() {
    let mut layers = Layers::new(0);
    for i in 0u8..16 {
        layers = layers.push(Arc::new(layer_of(&[
            (StateTable::Rows, vec![i], Some(vec![i])),
            (StateTable::Rows, b"same".to_vec(), Some(vec![i])),
        ])));
        check_shape(&layers, usize::from(i) + 1, "push");
        assert_eq!(layers.get(StateTable::Rows, b"same"), Lookup::Put(&[i]));
    }
    assert!(layers.len() < 6, "{} layers", layers.len());
    assert_eq!(layers.range(StateTable::Rows, Bound::Unbounded, Bound::Unbounded).count(), 17);
    // An empty layer changes nothing.
    let same = layers.push(Arc::new(Layer::default()));
    assert_eq!(same.len(), layers.len());
    // Draining everything gives one sorted layer with the newest writes.
    let (folded, rest) = layers.drain_oldest(usize::MAX);
    assert!(rest.is_empty());
    assert_eq!(folded.entries(), 17);
    let rows = folded.table(StateTable::Rows);
    assert!(rows.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(
        rows.iter().find(|(k, _)| &**k == b"same").and_then(|(_, v)| v.as_deref()),
        Some(&[15u8][..])
    );
}

#[test]
fn published_checkpoint_and_clear() {
    let published = Published::new(3);
    let one = |i: u8| layer_of(&[(StateTable::Elems, vec![i], Some(vec![i]))]);
    assert!(published.freeze_oldest(1).is_none(), "nothing to freeze");
    published.publish(one(0));
    published.publish(one(1));
    let frozen = published.freeze_oldest(5).expect("freeze");
    assert_eq!(frozen.frozen(), frozen.len());
    assert!(published.freeze_oldest(1).is_none(), "one checkpoint at a time");
    // Layers published during the checkpoint do not merge into the frozen ones.
    for i in 2..6 {
        let now = published.publish(one(i));
        assert!(now.layers().iter().zip(frozen.layers()).all(|(a, b)| Arc::ptr_eq(a, b)));
    }
    assert!(!published.retire_frozen(2), "another generation");
    assert!(published.retire_frozen(3));
    let left = published.snapshot();
    assert_eq!(left.frozen(), 0);
    assert_eq!(left.get(StateTable::Elems, &[0]), Lookup::Absent);
    assert_eq!(left.get(StateTable::Elems, &[5]), Lookup::Put(&[5]));
    assert!(!published.retire_frozen(3), "nothing frozen");
    // A clear during a checkpoint makes its retirement a no-op.
    published.freeze_oldest(1).expect("freeze");
    assert!(!published.clear_to(3));
    assert!(published.clear_to(4));
    assert!(!published.retire_frozen(3));
    assert!(published.snapshot().is_empty());
    assert_eq!(published.snapshot().generation(), 4);
}

#[test]
fn state_tables_map_to_redo_tables() {
    for t in StateTable::ALL {
        assert_eq!(StateTable::from_redo(t.redo()), Some(t));
        assert_eq!(StateTable::ALL[t.index()], t);
    }
    assert_eq!(StateTable::from_redo(crate::codec::wal::RedoTable::Meta), None);
}

#[test]
fn bytes_deref_and_bounds() {
    let shared = Bytes::Shared(arc(b"xy"));
    let slice = Bytes::Slice(b"xy");
    assert_eq!(&*shared, &*slice);
    assert_eq!(format!("{shared:?}"), format!("{:?}", &b"xy"[..]));
    use Bound::{Excluded, Included, Unbounded};
    assert!(in_bounds(b"b", Included(b"b"), Excluded(b"c")));
    assert!(!in_bounds(b"b", Excluded(b"b"), Unbounded));
    assert!(in_bounds(b"", Unbounded, Included(b"")));
    assert!(!in_bounds(b"a", Unbounded, Excluded(b"a")));
    assert!(bounds_empty(Excluded(b"a"), Included(b"a")));
    assert!(!bounds_empty(Included(b"a"), Included(b"a")));
    assert!(bounds_empty(Included(b"ab"), Included(b"a")));
}
