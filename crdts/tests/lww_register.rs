//! `LWWRegister` after its layout change (timestamp beside an optional value, the empty register
//! `(Timestamp::default(), None)`, in-place writes): the properties users rely on, against a
//! model, with equal timestamps and the default timestamp frequent.
//!
//! * Every state built by writes holds the maximum `(timestamp, value)` written (the model).
//! * The join is commutative, associative and idempotent, also when equal timestamps carry
//!   different values and with the empty register.
//! * `write` returns exactly the one-entry register `(ts, value)` and leaves `x ⊔ delta`;
//!   `set` leaves the same state and returns whether `(ts, value)` won; `inflation` agrees.
//! * The encoding (bincode and JSON), `Debug` and `Hash` are those of the former derived shape
//!   `struct LWWRegister<V> { entry: Option<(Timestamp, V)> }`, and the former bytes decode to
//!   the same register.
//!
//! Seeded: a failure prints `SEED=N` to replay; `SOAK=1` runs ten times the cases.

mod common;

use common::{CASES, check, encode, rid};
use proptest::prelude::*;
use std::hash::{DefaultHasher, Hash, Hasher};
use tidemark_crdts::{LWWRegister, Lattice, ReplicaId, Timestamp};

/// The former shape, whose derives defined the encoding, `Debug` and `Hash`.
mod former {
    use tidemark_crdts::Timestamp;

    #[derive(serde::Serialize, serde::Deserialize, Debug, Hash, PartialEq)]
    pub struct LWWRegister<V> {
        pub entry: Option<(Timestamp, V)>,
    }
}

type Entry = Option<(Timestamp, u8)>;

/// Timestamps from a tiny space that includes `Timestamp::default()` (replica 0), so equal
/// timestamps on one replica carrying different values, and writes at the empty register's
/// own timestamp, are frequent.
fn ts() -> impl Strategy<Value = Timestamp> + Clone {
    (0u64..3, 0u32..2, 0usize..3).prop_map(|(physical_ms, logical, r)| Timestamp {
        physical_ms,
        logical,
        replica: if r == 0 { ReplicaId(0) } else { rid(r) },
    })
}

fn op() -> impl Strategy<Value = (Timestamp, u8)> + Clone {
    (ts(), 0u8..4)
}

fn ops() -> impl Strategy<Value = Vec<(Timestamp, u8)>> + Clone {
    prop::collection::vec(op(), 0..5)
}

/// A register built by `write`s from empty, and the model: the largest entry written.
fn built(ops: &[(Timestamp, u8)]) -> (LWWRegister<u8>, Entry) {
    let mut r = LWWRegister::new();
    let mut model: Entry = None;
    for &(t, v) in ops {
        r.write(t, v);
        model = model.max(Some((t, v)));
    }
    (r, model)
}

fn joined(a: &LWWRegister<u8>, b: &LWWRegister<u8>) -> LWWRegister<u8> {
    let mut a = a.clone();
    a.join(b.clone());
    a
}

fn entry(r: &LWWRegister<u8>) -> Entry {
    r.timestamp().zip(r.read().copied())
}

fn hash_of<T: Hash>(x: &T) -> u64 {
    let mut h = DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

/// Encoding, `Debug` and `Hash` of `r` equal those of the former shape holding `model`.
fn same_as_former(r: &LWWRegister<u8>, model: Entry) -> Result<(), TestCaseError> {
    let f = former::LWWRegister { entry: model };
    prop_assert_eq!(encode(r), encode(&f), "bincode bytes");
    let json = serde_json::to_string(r).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let former_json = serde_json::to_string(&f).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&json, &former_json, "JSON text");
    let (back, _): (LWWRegister<u8>, usize) =
        bincode::serde::decode_from_slice(&encode(&f), bincode::config::standard())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back, r, "former bincode bytes decode to the register");
    let back: LWWRegister<u8> =
        serde_json::from_str(&former_json).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&back, r, "former JSON decodes to the register");
    prop_assert_eq!(format!("{r:?}"), format!("{f:?}"), "Debug");
    prop_assert_eq!(hash_of(r), hash_of(&f), "Hash");
    Ok(())
}

#[test]
fn lww_state_is_the_max_entry_and_encodes_as_before() {
    check(
        "lww_state_is_the_max_entry_and_encodes_as_before",
        CASES,
        ops(),
        |ops| {
            let (r, model) = built(&ops);
            prop_assert_eq!(entry(&r), model);
            prop_assert_eq!(r.is_bottom(), model.is_none());
            same_as_former(&r, model)
        },
    );
}

#[test]
fn lww_join_laws() {
    check(
        "lww_join_laws",
        CASES,
        (ops(), ops(), ops()),
        |(a, b, c)| {
            let ((x, mx), (y, my), (z, mz)) = (built(&a), built(&b), built(&c));
            let bottom = LWWRegister::new();
            prop_assert_eq!(joined(&x, &y), joined(&y, &x), "commutative");
            prop_assert_eq!(
                joined(&joined(&x, &y), &z),
                joined(&x, &joined(&y, &z)),
                "associative"
            );
            prop_assert_eq!(&joined(&x, &x), &x, "idempotent");
            prop_assert_eq!(&joined(&x, &bottom), &x, "empty is the unit");
            prop_assert_eq!(&joined(&bottom, &x), &x, "empty is the unit");
            prop_assert_eq!(entry(&joined(&x, &y)), mx.max(my), "join keeps the max");
            prop_assert_eq!(
                entry(&joined(&joined(&x, &y), &z)),
                mx.max(my).max(mz),
                "join keeps the max"
            );
            Ok(())
        },
    );
}

#[test]
fn lww_write_is_join_with_its_delta_and_set_agrees() {
    check(
        "lww_write_is_join_with_its_delta_and_set_agrees",
        CASES,
        (ops(), op()),
        |(a, (t, v))| {
            let (x, mx) = built(&a);
            let mut written = x.clone();
            let delta = written.write(t, v);
            prop_assert_eq!(entry(&delta), Some((t, v)), "the delta is (ts, value)");
            prop_assert_eq!(
                &written,
                &joined(&x, &delta),
                "write == join with the delta"
            );
            prop_assert_eq!(entry(&written), mx.max(Some((t, v))));
            let mut set = x.clone();
            let won = set.set(t, v);
            prop_assert_eq!(&set, &written, "set leaves what write leaves");
            prop_assert_eq!(won, Some((t, v)) > mx, "set reports whether it won");
            prop_assert_eq!(x.inflation(&delta).is_some(), won, "inflation agrees");
            let mut via_inflation = x.clone();
            if let Some(d) = x.inflation(&delta) {
                via_inflation.join(d);
            }
            prop_assert_eq!(&via_inflation, &written, "x ⊔ Δ(δ, x) == x ⊔ δ");
            same_as_former(&written, entry(&written))?;
            same_as_former(&delta, Some((t, v)))
        },
    );
}

/// Two writes at one timestamp carrying different values (bad input): both join orders and
/// both write orders keep the larger value; a write at `Timestamp::default()` fills the empty
/// register (it is not mistaken for the empty state).
#[test]
fn lww_equal_timestamps_and_the_default_timestamp() {
    let t = Timestamp {
        physical_ms: 5,
        logical: 1,
        replica: rid(1),
    };
    let one = |v: u8| {
        let mut r = LWWRegister::new();
        r.write(t, v);
        r
    };
    let (a, b) = (one(3), one(7));
    assert_eq!(joined(&a, &b), joined(&b, &a));
    assert_eq!(joined(&a, &b).read(), Some(&7));
    let mut ab = a.clone();
    assert!(ab.set(t, 7));
    let mut ba = b.clone();
    assert!(!ba.set(t, 3));
    assert_eq!(ab, ba);
    assert_eq!(ab.read(), Some(&7));

    let zero = Timestamp::default();
    let mut r = LWWRegister::new();
    assert!(r.set(zero, 0u8), "any write wins over the empty register");
    assert!(!r.is_bottom());
    assert_eq!((r.timestamp(), r.read()), (Some(zero), Some(&0)));
    assert_ne!(r, LWWRegister::new());
    assert!(!r.set(zero, 0), "the same write again does not win");
    let mut d = LWWRegister::new();
    let delta = d.write(zero, 0u8);
    assert_eq!(delta, r);
    assert_eq!(
        encode(&r),
        encode(&former::LWWRegister {
            entry: Some((zero, 0u8))
        })
    );
    assert_eq!(
        encode(&LWWRegister::<u8>::new()),
        encode(&former::LWWRegister::<u8> { entry: None })
    );
}

/// Registers of a value with a heap allocation (`String`): the write path moves the value in
/// and the delta is its one clone; results equal the `u8` model's.
#[test]
fn lww_string_values() {
    check(
        "lww_string_values",
        CASES / 4,
        (ops(), op()),
        |(a, (t, v))| {
            let mut r: LWWRegister<String> = LWWRegister::new();
            let (x, mx) = built(&a);
            for &(t, v) in &a {
                r.write(t, v.to_string());
            }
            prop_assert_eq!(r.timestamp(), x.timestamp());
            prop_assert_eq!(r.read().cloned(), mx.map(|(_, v)| v.to_string()));
            let mut s = r.clone();
            let delta = r.write(t, v.to_string());
            prop_assert_eq!(delta.read(), Some(&v.to_string()));
            prop_assert_eq!(delta.timestamp(), Some(t));
            let won = s.set(t, v.to_string());
            prop_assert_eq!(&s, &r);
            prop_assert_eq!(won, Some((t, v)) > mx);
            Ok(())
        },
    );
}
