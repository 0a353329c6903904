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
use common::weird::*;
use common::*;
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tidemark_crdts::{DotStore, Store, StoreDelta};

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
