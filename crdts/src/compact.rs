//! Compact serde encoding of causal CRDTs: one replica table per [`Causal`], dots as indices.
//!
//! With plain derives every [`Dot`] repeats its 16-byte [`ReplicaId`] (17 bytes under bincode's
//! varint config), although a causal pair rarely involves more than a handful of replicas. This
//! module changes only the *encoding*; the in-memory types and their API stay as they are.
//!
//! ## Format
//! * `Causal<S>` is the 2-tuple `(ctx, store)`: the context first, in its own form (a map from
//!   replica to [`crate::IntervalSet`], ascending by replica), then the store.
//! * While the store of a `Causal` is encoded or decoded, the context's replicas, in ascending
//!   order, form the **replica table**, and every `Dot` inside the store is the pair
//!   `(index, seq delta)`: `index` is the position of the dot's replica in that table (one byte
//!   under bincode varints for tables of fewer than 251 replicas), `seq delta` the signed
//!   difference from the previous dot of that replica in the same table (one byte for the
//!   usual runs of nearby seqs). The context already lists its replicas, so the table costs
//!   nothing extra.
//! * Everywhere else (a standalone `Dot`, `DotSet`, `DotFun`, `causal_map::Entry`, ...) a dot is
//!   written in full as the struct `{ replica, seq }`, exactly as the plain derive would.
//!
//! The table travels from `Causal`'s impls to `Dot`'s through a thread-local stack (serde gives
//! no other way to pass state down to a nested `Serialize`/`Deserialize`): `Causal` pushes its
//! table before the store and pops it after (with a drop guard, so errors and panics pop too),
//! and `Dot` consults the top of the stack. A `Causal` nested inside another store pushes its
//! own table, so nesting works; encoding and decoding visit values in the same order, so they
//! always agree on which table is in force and on the base of every seq delta.
//!
//! Limitation (of the seq delta, which makes a dot's bytes depend on the dots before it): inside
//! a causal store, a serde construct that serializes one value twice in a call, or retries
//! decoding of buffered input (`#[serde(untagged)]` enums), would desynchronize the bases. The
//! crate's stores and `causal_map::Entry` use none (enums are externally tagged); a whole `Causal`
//! inside such a construct is fine, since each attempt starts a fresh table.
//!
//! ## Guarantees
//! * Inside a `Causal`, every dot must be in the context (invariant I3: true for every value
//!   this crate builds). Encoding a value that breaks it fails with an error instead of
//!   producing bytes that could not be decoded; decoding checks it dot by dot, so an index out
//!   of range or a dot the context has not seen is an error, never a panic.
//! * Decoders accept only canonical input, so a decoded value satisfies the invariants the
//!   mutators rely on: `IntervalSet` and `CausalContext` validate themselves, `DotSet` and
//!   `DotFun` must be strictly ascending by dot, and `DotMap` keys strictly ascending with no
//!   bottom child (see the impls in `dotstore.rs`).

use crate::context::CausalContext;
use crate::dot::{Dot, ReplicaId};
use crate::dotstore::Causal;
use crate::interval::IntervalSet;
use core::cell::RefCell;
use core::fmt;
use core::marker::PhantomData;
use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};
use serde::ser::{self, Serialize, SerializeTuple, Serializer};

/// One row of a replica table: a replica of the context, its seqs (so a dot is checked against
/// the context, invariant I3, by the same lookup that finds its index), and the seq of the last
/// dot of that replica written or read under this table (the base of the next seq delta).
struct Row {
    replica: ReplicaId,
    seqs: IntervalSet,
    last: u64,
    /// Decoding only: the seqs of this replica's dots read so far, to reject a dot that appears
    /// twice anywhere in the store (under two keys, or twice in one collection).
    used: Vec<u64>,
}

/// A replica table: one row per replica of the context, ascending by replica.
type Table = Vec<Row>;

thread_local! {
    /// The tables of the `Causal` values being encoded or decoded on this thread, innermost last.
    static TABLES: RefCell<Vec<Table>> = const { RefCell::new(Vec::new()) };
}

/// Keeps a replica table in force while alive; dropping it (also on error or panic) pops it.
struct TableScope;

impl TableScope {
    fn enter(ctx: &CausalContext) -> Self {
        let table: Table = ctx
            .entries()
            .map(|(r, s)| Row {
                replica: *r,
                seqs: s.clone(),
                last: 0,
                used: Vec::new(),
            })
            .collect();
        TABLES.with(|t| t.borrow_mut().push(table));
        TableScope
    }
}

impl Drop for TableScope {
    fn drop(&mut self) {
        // `try_with`: never panic in drop, even during thread teardown.
        let _ = TABLES.try_with(|t| t.borrow_mut().pop());
    }
}

/// The indexed form of a dot: `(index, seq delta)`.
///
/// The seq is written as its difference from the previous dot *of the same replica* in the
/// same table (0 before the first one), as a signed integer: bincode zigzag-varint-encodes it,
/// so the common runs of consecutive or nearby seqs (a replica's adds, in key order) cost one
/// byte instead of up to five. Encoder and decoder visit the dots in the same order, so they
/// track the same bases; the difference is taken with wrapping arithmetic, so every
/// `(previous, seq)` pair has exactly one encoding and decoding never overflows.
type IndexedDot = (u64, i64);

/// How the innermost table sees a dot.
enum Lookup {
    /// No `Causal` is being encoded or decoded: the dot is written in full.
    NoTable,
    /// The dot is in the context: its indexed form (the table's base was advanced to it).
    Indexed(IndexedDot),
    /// The dot is not in the context (its replica is unknown, or the seq is unseen).
    Outside,
}

fn lookup(dot: &Dot) -> Lookup {
    TABLES.with(|t| {
        let mut t = t.borrow_mut();
        let Some(table) = t.last_mut() else {
            return Lookup::NoTable;
        };
        let Ok(i) = table.binary_search_by(|row| row.replica.cmp(&dot.replica)) else {
            return Lookup::Outside;
        };
        let (Some(row), Ok(index)) = (table.get_mut(i), u64::try_from(i)) else {
            return Lookup::Outside;
        };
        if !row.seqs.contains(dot.seq) {
            return Lookup::Outside;
        }
        // Two's-complement reinterpretation, undone exactly by `resolve`.
        let delta = dot.seq.wrapping_sub(row.last) as i64;
        row.last = dot.seq;
        Lookup::Indexed((index, delta))
    })
}

/// Resolves an indexed dot against the innermost table; `Err` when no table is in force, the
/// index is out of range or the dot is not in the context.
fn resolve((index, delta): IndexedDot) -> Result<Dot, &'static str> {
    TABLES.with(|t| {
        let mut t = t.borrow_mut();
        let table = t.last_mut().ok_or("indexed dot outside a causal context")?;
        let row = usize::try_from(index)
            .ok()
            .and_then(|i| table.get_mut(i))
            .ok_or("dot replica index out of range")?;
        let seq = row.last.wrapping_add(delta as u64);
        if !row.seqs.contains(seq) {
            return Err("dot outside its causal context");
        }
        row.last = seq;
        row.used.push(seq);
        Ok(Dot::new(row.replica, seq))
    })
}

/// `Err` when some dot was read twice under the innermost table: a correct replica's store
/// holds every dot once (under one key, once per collection), and the join is a lattice join
/// only on such stores.
fn check_dots_distinct() -> Result<(), &'static str> {
    TABLES.with(|t| {
        let mut t = t.borrow_mut();
        let Some(table) = t.last_mut() else {
            return Ok(());
        };
        for row in table.iter_mut() {
            let used = core::mem::take(&mut row.used);
            let mut sorted = used;
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[0] == w[1]) {
                return Err("a dot appears twice in the store");
            }
        }
        Ok(())
    })
}

fn table_in_force() -> bool {
    TABLES.with(|t| !t.borrow().is_empty())
}

/// The full form of a dot, identical to what `#[derive]` produced for [`Dot`].
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename = "Dot")]
struct FullDot {
    replica: ReplicaId,
    seq: u64,
}

impl Serialize for Dot {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match lookup(self) {
            Lookup::NoTable => FullDot {
                replica: self.replica,
                seq: self.seq,
            }
            .serialize(s),
            Lookup::Indexed(indexed) => indexed.serialize(s),
            Lookup::Outside => Err(ser::Error::custom(
                "dot outside the causal context it is encoded in (invariant I3)",
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Dot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if table_in_force() {
            resolve(IndexedDot::deserialize(d)?).map_err(de::Error::custom)
        } else {
            let f = FullDot::deserialize(d)?;
            Ok(Dot::new(f.replica, f.seq))
        }
    }
}

impl<S: Serialize> Serialize for Causal<S> {
    fn serialize<Ser: Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
        serialize_causal(&self.ctx, &self.store, s)
    }
}

/// Writes the pair `(ctx, store)` exactly as a [`Causal`] holding them is written, `store`
/// under `ctx`'s replica table (for types that keep a causal pair in another form, e.g.
/// [`crate::ORSet`], whose store is written from a sorted view of its table).
pub(crate) fn serialize_causal<T: Serialize + ?Sized, Ser: Serializer>(
    ctx: &CausalContext,
    store: &T,
    s: Ser,
) -> Result<Ser::Ok, Ser::Error> {
    let mut t = s.serialize_tuple(2)?;
    // The context holds replica ids, not dots: it is written in full, table or not.
    t.serialize_element(ctx)?;
    let scope = TableScope::enter(ctx);
    t.serialize_element(store)?;
    drop(scope);
    t.end()
}

impl<'de, S: Deserialize<'de>> Deserialize<'de> for Causal<S> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct CausalVisitor<S>(PhantomData<S>);

        impl<'de, S: Deserialize<'de>> Visitor<'de> for CausalVisitor<S> {
            type Value = Causal<S>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a causal pair (context, store)")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Causal<S>, A::Error> {
                let ctx: CausalContext = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                // Every dot decoded in the store resolves against (and is checked against) ctx.
                let scope = TableScope::enter(&ctx);
                let store: S = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                check_dots_distinct().map_err(de::Error::custom)?;
                drop(scope);
                Ok(Causal { store, ctx })
            }
        }

        d.deserialize_tuple(2, CausalVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::causal_map::{Entry, Key, KeyKind, Mutation, Store, StoreDelta};
    use crate::dotstore::{DotFun, DotMap, DotSet};
    use crate::{GCounter, Hlc, Lattice, MVRegister, ORSet, ORSetDelta, PNCounter};

    fn cfg() -> bincode::config::Configuration {
        bincode::config::standard()
    }

    fn enc<T: Serialize>(v: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(v, cfg()).expect("encodes")
    }

    fn dec<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, bincode::error::DecodeError> {
        bincode::serde::decode_from_slice::<T, _>(b, cfg()).map(|(v, _)| v)
    }

    /// Bincode roundtrip (the project's format).
    fn roundtrip<T: Serialize + serde::de::DeserializeOwned + PartialEq + fmt::Debug>(v: &T) {
        let bytes = enc(v);
        let back: T = dec(&bytes).expect("decodes");
        assert_eq!(&back, v);
        assert!(TABLES.with(|t| t.borrow().is_empty()), "table stack leaked");
    }

    /// Bincode and JSON roundtrips: the table mechanism does not depend on the format. (Not for
    /// store-level types: JSON maps cannot have struct keys such as `Key`.)
    fn roundtrip_both<T: Serialize + serde::de::DeserializeOwned + PartialEq + fmt::Debug>(v: &T) {
        roundtrip(v);
        let json = serde_json::to_string(v).expect("json encodes");
        let back: T = serde_json::from_str(&json).expect("json decodes");
        assert_eq!(&back, v);
        assert!(TABLES.with(|t| t.borrow().is_empty()), "table stack leaked");
    }

    const A: ReplicaId = ReplicaId(0x8f3e_0000_0000_4000_8000_0000_0000_00aa);
    const B: ReplicaId = ReplicaId(0x1c07_0000_0000_4000_8000_0000_0000_00bb);

    #[test]
    fn orset_roundtrips_and_is_compact() {
        let mut a = ORSet::new();
        let mut b = ORSet::new();
        for i in 0..1000u64 {
            a.add(A, i).expect("dots left");
            b.add(B, i + 500).expect("dots left");
        }
        for i in 0..100u64 {
            a.remove(&(i * 3));
        }
        a.join(b);
        roundtrip_both(&a);
        // Per element: key (3 bytes) + dot count (1) + per dot (index 1 + seq 1-3 bytes).
        assert!(enc(&a).len() < 1400 * 10, "{} bytes", enc(&a).len());
    }

    #[test]
    fn one_add_delta_is_small_whatever_the_set_size() {
        let mut s = ORSet::new();
        for i in 0..10_000u64 {
            s.add(A, i).expect("dots left");
        }
        let fresh = s.add(A, u64::MAX).expect("dots left");
        let readd = s.add(A, 5).expect("dots left");
        assert!(enc(&fresh).len() < 64, "{} bytes", enc(&fresh).len());
        assert!(enc(&readd).len() < 64, "{} bytes", enc(&readd).len());
        roundtrip_both(&fresh);
        roundtrip_both(&readd);
        // Worst case: the largest key and seq still fit.
        let worst: ORSetDelta<u64> = Causal::new(
            {
                let mut m = DotMap::default();
                m.set(u64::MAX, DotSet::single(Dot::new(B, u64::MAX)));
                m
            },
            CausalContext::from_dot(Dot::new(B, u64::MAX)),
        );
        assert!(enc(&worst).len() < 64, "{} bytes", enc(&worst).len());
        roundtrip_both(&worst);
    }

    #[test]
    fn seq_deltas_roundtrip_in_any_order_and_at_the_extremes() {
        let mut ctx = CausalContext::from_range(A, 1, 3);
        ctx.insert_range(A, u64::MAX - 2, u64::MAX);
        ctx.insert_range(B, 1_000_000, 1_000_010);
        let mut m: DotMap<u64, DotSet> = DotMap::default();
        // Keys in an order unrelated to the seqs: deltas go up, down and wrap.
        m.set(
            1,
            DotSet::from_dots(vec![Dot::new(A, u64::MAX), Dot::new(B, 1_000_005)]),
        );
        m.set(
            2,
            DotSet::from_dots(vec![Dot::new(A, 1), Dot::new(A, u64::MAX - 2)]),
        );
        m.set(
            3,
            DotSet::from_dots(vec![Dot::new(B, 1_000_000), Dot::new(A, 3)]),
        );
        m.set(4, DotSet::single(Dot::new(B, 1_000_010)));
        let c: ORSetDelta<u64> = Causal::new(m, ctx);
        roundtrip_both(&c);
        // An add-only replica's set: every seq delta is +1, one byte per dot.
        let mut s = ORSet::new();
        for i in 0..300u64 {
            s.add(A, 1000 + i).expect("dots left");
        }
        // ctx: entries 1 + replica 17 + ranges 1 + range (1, 300) 1 + 3; then map length 3;
        // then per element: key 3, dot count 1, index 1, seq delta 1.
        assert_eq!(enc(&s).len(), 23 + 3 + 300 * 6);
    }

    #[test]
    fn gcounter_decoding_is_canonical() {
        let mut c = GCounter::new();
        c.inc(A, 3);
        c.inc(B, 4);
        roundtrip_both(&c);
        roundtrip_both(&PNCounter::new());
        // B < A as integers, so [B, A] is the canonical order.
        assert!(dec::<GCounter>(&enc(&vec![(B, 1u64), (A, 2u64)])).is_ok());
        assert!(dec::<GCounter>(&enc(&vec![(A, 1u64), (B, 2u64)])).is_err());
        assert!(dec::<GCounter>(&enc(&vec![(B, 1u64), (B, 2u64)])).is_err());
        assert!(dec::<GCounter>(&enc(&vec![(B, 0u64)])).is_err());
    }

    #[test]
    fn mvregister_and_standalone_stores_roundtrip() {
        let mut r = MVRegister::new();
        r.write(A, "x".to_owned()).expect("dots left");
        let mut r2 = r.clone();
        r.write(A, "y".to_owned()).expect("dots left");
        r2.write(B, "z".to_owned()).expect("dots left");
        r.join(r2);
        assert_eq!(r.read().len(), 2);
        roundtrip_both(&r);
        // Standalone stores and dots (no table in force) use the full form.
        roundtrip_both(&Dot::new(A, 7));
        roundtrip_both(&DotSet::from_dots(vec![Dot::new(A, 1), Dot::new(B, 2)]));
        roundtrip_both(&DotFun::from_entries(vec![
            (Dot::new(B, 3), 9u64),
            (Dot::new(A, 1), 4),
        ]));
        let full = enc(&Dot::new(A, 7));
        assert_eq!(full.len(), 17 + 1);
    }

    #[test]
    fn store_delta_and_entries_roundtrip() {
        let mut st = Store::new();
        let mut hlc = Hlc::new(A, 1000);
        let keys = [
            (Key::new(KeyKind::GCounter, "g"), Mutation::Inc(3)),
            (Key::new(KeyKind::PNCounter, "p"), Mutation::Dec(2)),
            (
                Key::new(KeyKind::ORSet, "s"),
                Mutation::Add("\"e\"".to_owned()),
            ),
            (Key::new(KeyKind::Lww, "l"), Mutation::Set("1".to_owned())),
            (Key::new(KeyKind::MvReg, "m"), Mutation::Set("2".to_owned())),
        ];
        for (k, m) in &keys {
            let d = st
                .mutate(A, k, m, Some(hlc.now(5).expect("clock left")))
                .expect("mutation applies");
            roundtrip(&d);
        }
        let d = st
            .mutate(A, &keys[2].0, &Mutation::Delete, None)
            .expect("delete applies");
        roundtrip(&d);
        let whole: StoreDelta = st.to_delta();
        roundtrip(&whole);
        let back: StoreDelta = dec(&enc(&whole)).expect("decodes");
        let mut other = Store::new();
        other.apply(back);
        assert_eq!(other.entries(), st.entries());
        for e in st.entries().values() {
            roundtrip(e);
        }
    }

    /// A store-like value holding a `Causal` between two dots of the outer context.
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Nested {
        before: Dot,
        inner: Causal<DotSet>,
        after: Dot,
    }

    #[test]
    fn nested_causal_uses_its_own_table() {
        let inner = Causal::new(
            DotSet::single(Dot::new(B, 2)),
            CausalContext::from_range(B, 1, 2),
        );
        // Outer table [A], inner table [B]: both dots of the outer value have index 0, as does
        // the inner one; the outer table must be back in force after the inner value.
        let outer = Causal {
            store: vec![Nested {
                before: Dot::new(A, 1),
                inner,
                after: Dot::new(A, 2),
            }],
            ctx: CausalContext::from_range(A, 1, 2),
        };
        roundtrip_both(&outer);
    }

    #[test]
    fn rejects_dots_outside_the_context() {
        let bad: Causal<DotSet> = Causal::new(
            DotSet::single(Dot::new(A, 5)),
            CausalContext::from_range(A, 1, 4),
        );
        assert!(bincode::serde::encode_to_vec(&bad, cfg()).is_err());
        // Hand-built bytes: ctx {A: 1..=4}, store [(0, 5)].
        let ctx_bytes = enc(&CausalContext::from_range(A, 1, 4));
        let mut b = ctx_bytes.clone();
        b.extend(enc(&vec![(0u64, 5i64)]));
        assert!(dec::<Causal<DotSet>>(&b).is_err());
        // Index out of range.
        let mut b = ctx_bytes.clone();
        b.extend(enc(&vec![(1u64, 2i64)]));
        assert!(dec::<Causal<DotSet>>(&b).is_err());
        // Empty context: no index is valid.
        let mut b = enc(&CausalContext::new());
        b.extend(enc(&vec![(0u64, 1i64)]));
        assert!(dec::<Causal<DotSet>>(&b).is_err());
        // The good one decodes.
        let mut b = ctx_bytes;
        b.extend(enc(&vec![(0u64, 4i64)]));
        assert!(dec::<Causal<DotSet>>(&b).is_ok());
        assert!(TABLES.with(|t| t.borrow().is_empty()), "table stack leaked");
    }

    #[test]
    fn rejects_non_canonical_stores() {
        let ctx = CausalContext::from_range(A, 1, 9);
        let ctx_bytes = enc(&ctx);
        let with = |store: Vec<u8>| {
            let mut b = ctx_bytes.clone();
            b.extend(store);
            b
        };
        // Indexed dots are (index, seq delta from the replica's previous dot).
        // DotSet unsorted (3, 2) / duplicated (3, 3) / fine (3, 4).
        assert!(dec::<Causal<DotSet>>(&with(enc(&vec![(0u64, 3i64), (0, -1)]))).is_err());
        assert!(dec::<Causal<DotSet>>(&with(enc(&vec![(0u64, 3i64), (0, 0)]))).is_err());
        assert!(dec::<Causal<DotSet>>(&with(enc(&vec![(0u64, 3i64), (0, 1)]))).is_ok());
        // DotFun duplicated dot.
        assert!(
            dec::<Causal<DotFun<u8>>>(&with(enc(&vec![((0u64, 3i64), 1u8), ((0, 0), 2)]))).is_err()
        );
        // A delta leading outside the context (9 + 1), or wrapping around to seq 0.
        assert!(dec::<Causal<DotSet>>(&with(enc(&vec![(0u64, 9i64), (0, 1)]))).is_err());
        assert!(dec::<Causal<DotSet>>(&with(enc(&vec![(0u64, 9i64), (0, -9)]))).is_err());
        // DotMap with an empty child, with unsorted keys, with a duplicate key.
        let empty: Vec<(u64, i64)> = Vec::new();
        fn map<K: Serialize>(entries: Vec<(K, Vec<(u64, i64)>)>) -> Vec<u8> {
            let mut b = enc(&(entries.len() as u64));
            for (k, v) in entries {
                b.extend(enc(&k));
                b.extend(enc(&v));
            }
            b
        }
        type M = Causal<DotMap<u8, DotSet>>;
        assert!(dec::<M>(&with(map(vec![(1u8, vec![(0, 1)]), (2, empty)]))).is_err());
        assert!(dec::<M>(&with(map(vec![(2u8, vec![(0, 1)]), (1, vec![(0, 1)])]))).is_err());
        assert!(dec::<M>(&with(map(vec![(1u8, vec![(0, 1)]), (1, vec![(0, 1)])]))).is_err());
        assert!(dec::<M>(&with(map(vec![(1u8, vec![(0, 1)]), (2, vec![(0, 1)])]))).is_ok());
        // Standalone stores are checked too.
        let full = |seq: u64| FullDot { replica: A, seq };
        assert!(dec::<DotSet>(&enc(&vec![full(2), full(1)])).is_err());
        // Store-level entries: a non-canonical ORSet entry inside a delta.
        let orset_entry = |children: Vec<(String, Vec<(u64, i64)>)>| {
            let mut b = ctx_bytes.clone();
            b.extend(enc(&1u64)); // one key
            b.extend(enc(&Key::new(KeyKind::ORSet, "s")));
            b.extend(enc(&2u32)); // variant index of Entry::ORSet
            b.extend(map(children));
            b
        };
        let ok = orset_entry(vec![("\"e\"".to_owned(), vec![(0, 1)])]);
        let back: StoreDelta = dec(&ok).expect("canonical store delta decodes");
        assert!(matches!(
            back.store.get(&Key::new(KeyKind::ORSet, "s")),
            Some(Entry::ORSet(_))
        ));
        assert!(dec::<StoreDelta>(&orset_entry(vec![("\"e\"".to_owned(), vec![])])).is_err());
        // Truncated input is an error, not a panic.
        let good = enc(&{
            let mut s = ORSet::new();
            s.add(A, 1u64).expect("dots left");
            s.add(B, 2u64).expect("dots left");
            s
        });
        for n in 0..good.len() {
            assert!(dec::<ORSet<u64>>(&good[..n]).is_err());
        }
        assert!(TABLES.with(|t| t.borrow().is_empty()), "table stack leaked");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A tiny deterministic fuzz: every decode of garbage returns, Ok or Err.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..2000usize {
            let bytes: Vec<u8> = (0..len % 64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x & 0xff) as u8
                })
                .collect();
            let _ = dec::<ORSet<u64>>(&bytes);
            let _ = dec::<StoreDelta>(&bytes);
            let _ = dec::<MVRegister<String>>(&bytes);
        }
        assert!(TABLES.with(|t| t.borrow().is_empty()), "table stack leaked");
    }

    /// An `ORSet<u8>` (whose decoder builds its hash table straight from the decoded entries)
    /// rejects what `Causal<DotMap<u8, DotSet>>` rejects: a duplicate element, unsorted
    /// elements, an empty child, a dot outside the context; it reads the same bytes otherwise.
    #[test]
    fn orset_decoder_rejects_non_canonical_elements() {
        let ctx_bytes = enc(&CausalContext::from_range(A, 1, 9));
        // `ORSet { state }` is written as its state: context, then the element map.
        let set = |entries: Vec<(u8, Vec<(u64, i64)>)>| {
            let mut b = ctx_bytes.clone();
            b.extend(enc(&(entries.len() as u64)));
            for (k, v) in entries {
                b.extend(enc(&k));
                b.extend(enc(&v));
            }
            b
        };
        type M = Causal<DotMap<u8, DotSet>>;
        let empty: Vec<(u64, i64)> = Vec::new();
        let cases = [
            (
                "empty child",
                set(vec![(1, vec![(0, 1)]), (2, empty.clone())]),
            ),
            ("empty child alone", set(vec![(1, empty)])),
            ("unsorted", set(vec![(2, vec![(0, 1)]), (1, vec![(0, 2)])])),
            ("duplicate", set(vec![(1, vec![(0, 1)]), (1, vec![(0, 2)])])),
            (
                "duplicate, apart",
                set(vec![
                    (1, vec![(0, 1)]),
                    (2, vec![(0, 2)]),
                    (1, vec![(0, 3)]),
                ]),
            ),
            // Seq deltas run across the whole store: (0, 1) then (0, 0) is A:1 twice.
            (
                "dot repeated",
                set(vec![(1, vec![(0, 1)]), (2, vec![(0, 0)])]),
            ),
            ("dot outside", set(vec![(1, vec![(0, 10)])])),
        ];
        for (what, bytes) in &cases {
            assert!(
                dec::<ORSet<u8>>(bytes).is_err(),
                "ORSet<u8> accepted: {what}"
            );
            assert!(dec::<M>(bytes).is_err(), "the causal pair accepted: {what}");
        }
        let good = set(vec![
            (1, vec![(0, 1)]),
            (2, vec![(0, 2)]),
            (7, vec![(0, 3)]),
        ]);
        let s: ORSet<u8> = dec(&good).expect("canonical set decodes");
        assert_eq!(s.state(), dec::<M>(&good).expect("decodes"));
        assert!(s.layout_is_valid() && s.len() == 3);
        assert_eq!(enc(&s), good);
        assert!(TABLES.with(|t| t.borrow().is_empty()), "table stack leaked");
    }

    /// Garbage, and mutations of a good `ORSet<u8>` encoding, never panic the decoder; what
    /// decodes is a valid set that re-encodes to the same bytes.
    #[test]
    fn orset_decoder_never_panics_on_garbage() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut good = ORSet::new();
        for e in [1u8, 5, 9, 200, 3] {
            good.add(A, e).expect("dots left");
            good.add(B, e.wrapping_mul(7)).expect("dots left");
        }
        good.remove(&9);
        let good = enc(&good);
        for round in 0..4_000usize {
            let bytes: Vec<u8> = if round % 2 == 0 {
                (0..next() % 96).map(|_| next() as u8).collect()
            } else {
                let mut b = good.clone();
                for _ in 0..1 + next() % 3 {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
                b
            };
            if let Ok((s, used)) = bincode::serde::decode_from_slice::<ORSet<u8>, _>(&bytes, cfg())
            {
                assert!(s.layout_is_valid());
                assert_eq!(enc(&s), bytes[..used]);
            }
        }
        assert!(TABLES.with(|t| t.borrow().is_empty()), "table stack leaked");
    }
}
