//! Op alphabets and history builders per type (shared by the law and redundancy tests).

use super::*;
use tidemark_crdts::{
    GCounter, LWWRegister, Lattice, MVRegister, MVRegisterDelta, ORSet, ORSetDelta, PNCounter,
};

// ORSet<u8> ------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
pub enum SetOp {
    Add(u8),
    Remove(u8),
    Clear,
}

pub fn set_op() -> impl Strategy<Value = SetOp> + Clone {
    prop_oneof![
        4 => (0u8..4).prop_map(SetOp::Add),
        3 => (0u8..4).prop_map(SetOp::Remove),
        1 => Just(SetOp::Clear),
    ]
}

pub fn apply_set_op(s: &mut ORSet<u8>, r: usize, op: SetOp) -> ORSetDelta<u8> {
    match op {
        SetOp::Add(e) => s.add(rid(r), e).expect("dots left"),
        SetOp::Remove(e) => s.remove(&e),
        SetOp::Clear => s.clear(),
    }
}

pub fn orset_history(n: usize, steps: &[Step<SetOp>]) -> Built<ORSet<u8>, ORSetDelta<u8>> {
    build(
        n,
        steps,
        |_| ORSet::new(),
        |s, r, o, _| apply_set_op(s, r, *o),
        |s, d| s.apply(d),
        |s, o| s.join(o.clone()),
    )
}

// MVRegister<u8> -------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
pub enum RegOp {
    Write(u8),
    Clear,
}

pub fn reg_op() -> impl Strategy<Value = RegOp> + Clone {
    prop_oneof![4 => (0u8..4).prop_map(RegOp::Write), 1 => Just(RegOp::Clear)]
}

pub fn apply_reg_op(s: &mut MVRegister<u8>, r: usize, op: RegOp) -> MVRegisterDelta<u8> {
    match op {
        RegOp::Write(v) => s.write(rid(r), v).expect("dots left"),
        RegOp::Clear => s.clear(),
    }
}

pub fn mvreg_history(
    n: usize,
    steps: &[Step<RegOp>],
) -> Built<MVRegister<u8>, MVRegisterDelta<u8>> {
    build(
        n,
        steps,
        |_| MVRegister::new(),
        |s, r, o, _| apply_reg_op(s, r, *o),
        |s, d| s.apply(d),
        |s, o| s.join(o.clone()),
    )
}

// Counters -------------------------------------------------------------------------------------

/// Increment amounts: mostly small (zero included), sometimes at or near `u64::MAX`.
pub fn amount() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![8 => 0u64..10, 1 => Just(u64::MAX), 1 => (u64::MAX - 8)..=u64::MAX]
}

pub fn gcounter_history(n: usize, steps: &[Step<u64>]) -> Built<GCounter, GCounter> {
    build(
        n,
        steps,
        |_| GCounter::new(),
        |s, r, by, _| s.inc(rid(r), *by),
        |s, d| s.join(d),
        |s, o| s.join(o.clone()),
    )
}

#[derive(Clone, Copy, Debug)]
pub enum PnOp {
    Inc(u64),
    Dec(u64),
}

pub fn pn_op() -> impl Strategy<Value = PnOp> + Clone {
    prop_oneof![amount().prop_map(PnOp::Inc), amount().prop_map(PnOp::Dec)]
}

pub fn apply_pn(s: &mut PNCounter, r: usize, op: PnOp) -> PNCounter {
    match op {
        PnOp::Inc(by) => s.inc(rid(r), by),
        PnOp::Dec(by) => s.dec(rid(r), by),
    }
}

pub fn pn_history(n: usize, steps: &[Step<PnOp>]) -> Built<PNCounter, PNCounter> {
    build(
        n,
        steps,
        |_| PNCounter::new(),
        |s, r, o, _| apply_pn(s, r, *o),
        |s, d| s.join(d),
        |s, o| s.join(o.clone()),
    )
}

// LWWRegister<u8> ------------------------------------------------------------------------------

/// Timestamps from a tiny space, so equal `(l, c)` on different replicas, and even fully equal
/// timestamps carrying different values (bad input), are frequent.
pub fn small_ts() -> impl Strategy<Value = Timestamp> + Clone {
    (0u64..3, 0u32..2, 0usize..2).prop_map(|(physical_ms, logical, r)| Timestamp {
        physical_ms,
        logical,
        replica: rid(r),
    })
}

pub fn lww_op() -> impl Strategy<Value = (Timestamp, u8)> + Clone {
    (small_ts(), 0u8..4)
}

pub fn lww_history(
    n: usize,
    steps: &[Step<(Timestamp, u8)>],
) -> Built<LWWRegister<u8>, LWWRegister<u8>> {
    build(
        n,
        steps,
        |_| LWWRegister::new(),
        |s, _, (ts, v), _| s.write(*ts, *v),
        |s, d| s.join(d),
        |s, o| s.join(o.clone()),
    )
}

// Store ----------------------------------------------------------------------------------------

/// LWW timestamps for store law histories: a tiny space, so equal `(l, c)` across replicas are
/// common.
pub fn law_ts(o: StoreOp, r: usize) -> Timestamp {
    Timestamp {
        physical_ms: u64::from(o.val % 3),
        logical: u32::from(o.code % 2),
        replica: rid(r),
    }
}

/// Plays a store history (huge counter amounts allowed).
pub fn store_history(n: usize, steps: &[Step<StoreOp>]) -> Built<Store, StoreDelta> {
    build(
        n,
        steps,
        |_| Store::new(),
        |s, r, o, _| {
            let (key, m) = store_mutation(*o, true);
            s.mutate(rid(r), &key, &m, Some(law_ts(*o, r)))
                .expect("valid mutation")
        },
        |s, d| {
            s.apply(d);
        },
        |s, o| {
            s.apply(o.to_delta());
        },
    )
}
