//! `join_delta` on the store never panics and keeps invariant I3 (`dots_within_context`) for
//! arbitrary, possibly weird deltas derived from random valid states: contexts that claim extra
//! dots (gaps, other replicas, seqs near `u64::MAX`) or lose some, entries dropped, moved or
//! duplicated under other keys (also of another kind), stores and contexts of different replicas
//! glued together, conflicting values under one dot, stray dots.
//!
//! * Every delta, admitted by the decoder or not (even one breaking I3 in-process): no panic,
//!   the store keeps I3 (so `next_dot` can never reissue a dot the store holds), the inflation
//!   satisfies I3, joining the same delta twice is idempotent, and the store stays usable
//!   (further local mutations and joins do not panic either).
//! * Deltas the decoder admits (they survive `decode(encode(δ))`, which checks canonical form
//!   and I3): the target store also stays canonical (no bottom entry, sorted children), the
//!   second join reports no change, and joining its own state is a no-op.

mod common;

use common::pools::*;
use common::*;
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tidemark_crdts::dotstore::{DotFun, DotMap, DotSet};
use tidemark_crdts::{CausalContext, Dot, DotStore, Entry, Key, Store, StoreDelta, Timestamp};

#[derive(Clone, Debug)]
enum Weird {
    /// Context minus `(replica, lo..=lo+len)` (may break I3 of the delta).
    DropCtx(usize, u64, u64),
    /// Context plus `(replica, lo..=lo+len)`; `huge` puts it near `u64::MAX`.
    AddCtx(usize, u64, u64, bool),
    /// Drop one entry (the context keeps claiming its dots).
    DropEntry(u8),
    /// Move an entry under another key (possibly of another kind).
    MoveEntry(u8, u8),
    /// Copy an entry under another key too (the same dots under two keys).
    DupEntry(u8, u8),
    /// Replace the context by another pool element's.
    ForeignCtx(usize),
    /// Add another pool element's entries (overwriting shared keys), keep our context.
    ForeignStore(usize),
    /// Rewrite every value under the same dots.
    Conflict(u8, u8),
    /// Add a stray dot to an entry (and to the context unless `hidden`).
    Stray(u8, usize, u64, bool),
}

fn weird() -> impl Strategy<Value = Weird> {
    prop_oneof![
        (0usize..5, 0u64..12, 0u64..4).prop_map(|(r, lo, n)| Weird::DropCtx(r, lo, n)),
        (0usize..5, 0u64..12, 0u64..4, any::<bool>())
            .prop_map(|(r, lo, n, h)| Weird::AddCtx(r, lo, n, h)),
        any::<u8>().prop_map(Weird::DropEntry),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Weird::MoveEntry(a, b)),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Weird::DupEntry(a, b)),
        any::<usize>().prop_map(Weird::ForeignCtx),
        any::<usize>().prop_map(Weird::ForeignStore),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Weird::Conflict(a, b)),
        (
            any::<u8>(),
            0usize..5,
            prop_oneof![1u64..16, (u64::MAX - 2)..=u64::MAX],
            any::<bool>()
        )
            .prop_map(|(k, r, s, h)| Weird::Stray(k, r, s, h)),
    ]
}

fn key_at(d: &StoreDelta, i: u8) -> Option<Key> {
    let n = d.store.len();
    (n > 0)
        .then(|| d.store.keys().nth(usize::from(i) % n).cloned())
        .flatten()
}

fn any_key(i: u8) -> Key {
    let keys = store_keys();
    keys[usize::from(i) % keys.len()].clone()
}

fn conflict(e: &Entry, v: u8) -> Entry {
    let big = u64::from(v) << 56 | u64::from(v);
    match e {
        Entry::GCounter(f) => Entry::GCounter(DotFun::from_entries(
            f.iter().map(|(d, _)| (*d, big)).collect(),
        )),
        Entry::PNCounter(f) => Entry::PNCounter(DotFun::from_entries(
            f.iter().map(|(d, (p, _))| (*d, (*p, big))).collect(),
        )),
        Entry::ORSet(m) => {
            // The same dots under other elements.
            let mut out = DotMap::default();
            for (x, s) in m.iter() {
                out.set(format!("{x}{v}"), s.clone());
            }
            Entry::ORSet(out)
        }
        Entry::Lww(f) => Entry::Lww(DotFun::from_entries(
            f.iter()
                .map(|(d, (ts, _))| {
                    let ts = Timestamp {
                        logical: u32::from(v),
                        ..*ts
                    };
                    (*d, (ts, format!("{v}")))
                })
                .collect(),
        )),
        Entry::MvReg(f) => Entry::MvReg(DotFun::from_entries(
            f.iter().map(|(d, _)| (*d, format!("{v}"))).collect(),
        )),
    }
}

fn stray(e: &Entry, dot: Dot) -> Entry {
    match e {
        Entry::GCounter(f) => {
            let mut v: Vec<_> = f.iter().map(|(d, n)| (*d, *n)).collect();
            v.push((dot, 1));
            Entry::GCounter(DotFun::from_entries(v))
        }
        Entry::PNCounter(f) => {
            let mut v: Vec<_> = f.iter().map(|(d, n)| (*d, *n)).collect();
            v.push((dot, (0, 1)));
            Entry::PNCounter(DotFun::from_entries(v))
        }
        Entry::ORSet(m) => {
            let mut out = m.clone();
            let x = "\"stray\"".to_owned();
            let mut dots: Vec<Dot> = m
                .get(&x)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            dots.push(dot);
            out.set(x, DotSet::from_dots(dots));
            Entry::ORSet(out)
        }
        Entry::Lww(f) => {
            let mut v: Vec<_> = f.iter().map(|(d, x)| (*d, x.clone())).collect();
            v.push((dot, (Timestamp::default(), "0".into())));
            Entry::Lww(DotFun::from_entries(v))
        }
        Entry::MvReg(f) => {
            let mut v: Vec<_> = f.iter().map(|(d, x)| (*d, x.clone())).collect();
            v.push((dot, "0".into()));
            Entry::MvReg(DotFun::from_entries(v))
        }
    }
}

fn make_weird(base: &StoreDelta, pool: &[StoreDelta], ws: &[Weird]) -> StoreDelta {
    let mut d = base.clone();
    for w in ws {
        match w {
            Weird::DropCtx(r, lo, n) => {
                d.ctx = d.ctx.diff(&CausalContext::from_range(rid(*r), *lo, lo + n));
            }
            Weird::AddCtx(r, lo, n, huge) => {
                let lo = if *huge { u64::MAX - lo - n } else { *lo };
                d.ctx.insert_range(rid(*r), lo, lo.saturating_add(*n));
            }
            Weird::DropEntry(i) => {
                if let Some(k) = key_at(&d, *i) {
                    d.store.take(&k);
                }
            }
            Weird::MoveEntry(i, j) | Weird::DupEntry(i, j) => {
                if let Some(k) = key_at(&d, *i) {
                    let e = if matches!(w, Weird::MoveEntry(..)) {
                        d.store.take(&k).expect("present")
                    } else {
                        d.store.get(&k).expect("present").clone()
                    };
                    d.store.set(any_key(*j), e);
                }
            }
            Weird::ForeignCtx(i) => d.ctx = pool[i % pool.len()].ctx.clone(),
            Weird::ForeignStore(i) => {
                for (k, e) in pool[i % pool.len()].store.iter() {
                    d.store.set(k.clone(), e.clone());
                }
            }
            Weird::Conflict(i, v) => {
                if let Some(k) = key_at(&d, *i) {
                    let e = conflict(d.store.get(&k).expect("present"), *v);
                    d.store.set(k, e);
                }
            }
            Weird::Stray(i, r, seq, hidden) => {
                let dot = Dot::new(rid(*r), *seq);
                let k = key_at(&d, *i).unwrap_or_else(|| any_key(*i));
                let e = d
                    .store
                    .get(&k)
                    .cloned()
                    .unwrap_or_else(|| Entry::bottom(k.kind));
                d.store.set(k, stray(&e, dot));
                if !hidden {
                    d.ctx.insert(dot);
                }
            }
        }
    }
    d
}

/// Does the decoder admit `d`? (Encoding refuses I3 violations; decoding checks canonical form.)
fn admitted(d: &StoreDelta) -> Option<StoreDelta> {
    let bytes = bincode::serde::encode_to_vec(d, bincode::config::standard()).ok()?;
    decode::<StoreDelta>(&bytes).ok()
}

#[test]
fn join_delta_survives_weird_deltas_and_keeps_i3() {
    let total = AtomicUsize::new(0);
    let admitted_n = AtomicUsize::new(0);
    check(
        "join_delta_survives_weird_deltas_and_keeps_i3",
        CASES,
        (
            history(store_op(), 32),
            any::<usize>(),
            any::<usize>(),
            proptest::collection::vec(weird(), 1..6),
            store_op(),
        ),
        |((n, steps), ti, bi, ws, op)| {
            let b = store_history(n, &steps);
            let mut pool: Vec<StoreDelta> = b.log.iter().map(|(_, d)| d.clone()).collect();
            pool.extend(b.replicas.iter().map(Store::to_delta));
            let base = &pool[bi % pool.len()];
            let delta = make_weird(base, &pool, &ws);
            let ti = ti % b.replicas.len();
            let mut target = b.replicas[ti].clone();

            // No panic whatever the delta, I3 kept even when the delta itself breaks it, and
            // the store stays usable.
            let mut raw = target.clone();
            let out = raw.apply(delta.clone());
            prop_assert!(raw.dots_within_context(), "I3 broken by {delta:?}");
            if let Some(i) = &out.inflation {
                prop_assert!(i.dots_within_context(), "inflation breaks I3: {i:?}");
            }
            let once = raw.clone();
            raw.apply(delta.clone());
            prop_assert!(raw.dots_within_context());
            prop_assert_eq!(
                &raw,
                &once,
                "joining the same weird delta twice is not idempotent"
            );
            let (key, m) = store_mutation(op, true);
            let _ = raw.mutate(rid(9), &key, &m, Some(law_ts(op, 9)));
            let other = b.replicas[(ti + 1) % b.replicas.len()].to_delta();
            raw.apply(other);

            total.fetch_add(1, Ordering::Relaxed);
            if let Some(delta) = admitted(&delta) {
                admitted_n.fetch_add(1, Ordering::Relaxed);
                prop_assert!(
                    delta.dots_within_context(),
                    "decoder admitted an I3 violation"
                );
                let out = target.apply(delta.clone());
                prop_assert!(target.dots_within_context(), "I3 broken by {delta:?}");
                for (k, e) in target.entries() {
                    prop_assert!(!e.is_bottom(), "bottom entry kept under {k}");
                    prop_assert!(e.is_canonical(), "non-canonical entry under {k}");
                }
                if let Some(i) = &out.inflation {
                    prop_assert!(i.dots_within_context(), "inflation breaks I3");
                }
                let again = target.clone();
                let out2 = target.apply(delta);
                prop_assert!(
                    out2.changed.is_empty(),
                    "second join changed {:?}",
                    out2.changed
                );
                prop_assert_eq!(&target, &again);
                let own = target.to_delta();
                target.apply(own);
                prop_assert_eq!(&target, &again, "joining its own state changed the store");
                let _ = target.mutate(rid(9), &key, &m, Some(law_ts(op, 9)));
                prop_assert!(target.dots_within_context());
            }
            Ok(())
        },
    );
    let (t, a) = (total.into_inner(), admitted_n.into_inner());
    eprintln!("{a} of {t} weird deltas admitted by the decoder");
    assert!(
        a * 4 >= t,
        "too few weird deltas pass the decoder: {a} of {t}"
    );
}
