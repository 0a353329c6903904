//! The weird-delta generator: deltas derived from valid states by breaking what correct replicas
//! guarantee (contexts with extra or missing dots, entries dropped, moved or duplicated under
//! other keys, foreign contexts and stores, conflicting values under one dot, stray dots).

use super::*;
use tidemark_crdts::dotstore::{DotFun, DotMap, DotSet};
use tidemark_crdts::{CausalContext, Dot, Entry, Key, StoreDelta, Timestamp};

#[derive(Clone, Debug)]
pub enum Weird {
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

pub fn weird() -> impl Strategy<Value = Weird> {
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

pub fn key_at(d: &StoreDelta, i: u8) -> Option<Key> {
    let n = d.store.len();
    (n > 0)
        .then(|| d.store.keys().nth(usize::from(i) % n).cloned())
        .flatten()
}

pub fn any_key(i: u8) -> Key {
    let keys = store_keys();
    keys[usize::from(i) % keys.len()].clone()
}

pub fn conflict(e: &Entry, v: u8) -> Entry {
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

pub fn stray(e: &Entry, dot: Dot) -> Entry {
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

pub fn make_weird(base: &StoreDelta, pool: &[StoreDelta], ws: &[Weird]) -> StoreDelta {
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
