//! Side-by-side benchmarks of `tidemark-crdts` against rust-crdt (`crdts` 7.3.2), same workloads
//! in the same run. Run with `cargo bench -p tidemark-crdts`.
//!
//! Workloads: set add (building 100k, and 10k more into a set of 100k) / remove / merge, gcounter
//! increment, pncounter increment and decrement, counter merge, LWW write (`tidemark`:
//! `write`, which returns the delta; `tidemark-set`: `set`, in place like rust-crdt's `update`;
//! rust-crdt's `update` with a `u64` marker and with our HLC `Timestamp` as its marker, and
//! `rust-crdt-hlc-op`: its op-based form building the op it would ship, like our `write`), MV write
//! (rust-crdt: `MVReg` with `read_ctx().derive_add_ctx` + `write` + `apply`), set encode/decode.
//! Both libraries use the same 128-bit replica ids (rust-crdt's actor type is `u128`), set
//! elements are `u64`. Encoded sizes are not timings, so `encoded_sizes` prints them to stderr
//! (bincode 2, serde, standard config) instead of measuring anything.

use crdts::{CmRDT, CvRDT};
use criterion::{BatchSize, Criterion, Throughput, black_box, criterion_group, criterion_main};
use std::time::Duration;
use tidemark_crdts::{
    GCounter, LWWRegister, Lattice, MVRegister, ORSet, PNCounter, ReplicaId, Timestamp,
};

/// Elements per replica in the set workloads.
const N: u64 = 100_000;
/// Counter increments and register writes.
const OPS: u64 = 1_000_000;
/// Replica entries per counter in the counter merge.
const COUNTER_REPLICAS: u64 = 1_000;

/// Two UUID-v4-like replica ids (random bits, as a node mints them).
const A: u128 = 0x8f3e_52c1_9a0d_4b6e_a1f2_3c4d_5e6f_7081;
const B: u128 = 0x1c07_d9e4_6b2a_4f13_8e5d_0a9b_c8d7_e6f5;

type Theirs = crdts::Orswot<u64, u128>;

/// Deterministic pseudo-random 128-bit ids for the counter replicas (splitmix64 twice).
fn replica_ids(range: core::ops::Range<u64>) -> Vec<u128> {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    range
        .map(|i| (u128::from(mix(2 * i)) << 64) | u128::from(mix(2 * i + 1)))
        .collect()
}

fn ours_add(replica: u128, elems: core::ops::Range<u64>) -> ORSet<u64> {
    let mut s = ORSet::new();
    for e in elems {
        black_box(s.add(ReplicaId(replica), e).expect("dots left"));
    }
    s
}

fn theirs_add(actor: u128, elems: core::ops::Range<u64>) -> Theirs {
    let mut s = Theirs::new();
    for e in elems {
        let ctx = s.read_ctx().derive_add_ctx(actor);
        let op = s.add(e, ctx);
        s.apply(op);
    }
    s
}

fn ours_merged() -> ORSet<u64> {
    let mut a = ours_add(A, 0..N);
    a.join(ours_add(B, N / 2..N + N / 2));
    a
}

fn theirs_merged() -> Theirs {
    let mut a = theirs_add(A, 0..N);
    a.merge(theirs_add(B, N / 2..N + N / 2));
    a
}

fn ours_counter(ids: &[u128]) -> GCounter {
    let mut c = GCounter::new();
    for (i, r) in ids.iter().enumerate() {
        c.inc(ReplicaId(*r), i as u64 + 1);
    }
    c
}

fn theirs_counter(ids: &[u128]) -> crdts::GCounter<u128> {
    let mut c = crdts::GCounter::new();
    for (i, r) in ids.iter().enumerate() {
        let op = c.inc_many(*r, i as u64 + 1);
        c.apply(op);
    }
    c
}

fn set_add(c: &mut Criterion) {
    let mut g = c.benchmark_group("set_add_100k");
    g.throughput(Throughput::Elements(N));
    g.bench_function("tidemark", |b| {
        b.iter_batched(|| (), |()| ours_add(A, 0..N), BatchSize::PerIteration);
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(|| (), |()| theirs_add(A, 0..N), BatchSize::PerIteration);
    });
    g.finish();
}

fn set_remove(c: &mut Criterion) {
    let ours = ours_add(A, 0..N);
    let theirs = theirs_add(A, 0..N);
    let mut g = c.benchmark_group("set_remove_50k_of_100k");
    g.throughput(Throughput::Elements(N / 2));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            || ours.clone(),
            |mut s| {
                for e in (0..N).step_by(2) {
                    black_box(s.remove(&e));
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            || theirs.clone(),
            |mut s| {
                for e in (0..N).step_by(2) {
                    let ctx = s.contains(&e).derive_rm_ctx();
                    let op = s.rm(e, ctx);
                    s.apply(op);
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

/// `0..N` in a seeded scrambled order (elements arrive in no key order, as real ones do).
fn scrambled() -> Vec<u64> {
    let mut v: Vec<u64> = (0..N).collect();
    let mut z = 0x5EED_u64;
    for i in (1..v.len()).rev() {
        z = z
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = usize::try_from((z >> 33) % (i as u64 + 1)).unwrap_or(0);
        v.swap(i, j);
    }
    v
}

/// Set adds and removes with the elements in scrambled order (the ascending rows above favour
/// a map that appends at its end).
fn set_scrambled(c: &mut Criterion) {
    let order = scrambled();
    let mut g = c.benchmark_group("set_add_100k_scrambled");
    g.throughput(Throughput::Elements(N));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            ORSet::<u64>::new,
            |mut s| {
                for e in &order {
                    black_box(s.add(ReplicaId(A), *e).expect("dots left"));
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            Theirs::new,
            |mut s| {
                for e in &order {
                    let ctx = s.read_ctx().derive_add_ctx(A);
                    let op = s.add(*e, ctx);
                    s.apply(op);
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
    let ours = ours_add(A, 0..N);
    let theirs = theirs_add(A, 0..N);
    let half: Vec<u64> = order.iter().copied().filter(|e| e % 2 == 0).collect();
    let mut g = c.benchmark_group("set_remove_50k_of_100k_scrambled");
    g.throughput(Throughput::Elements(N / 2));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            || ours.clone(),
            |mut s| {
                for e in &half {
                    black_box(s.remove(e));
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            || theirs.clone(),
            |mut s| {
                for e in &half {
                    let ctx = s.contains(e).derive_rm_ctx();
                    let op = s.rm(*e, ctx);
                    s.apply(op);
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

/// Remote removes: another replica removes `REMOTE_RMS` elements of a shared 100k set, one at a
/// time, and this replica joins each remove delta (a context only, so every join must find
/// the elements holding the removed dots: a pass over the set) as it arrives.
const REMOTE_RMS: usize = 20;

fn set_remote_remove(c: &mut Criterion) {
    let order = scrambled();
    let victims = &order[..REMOTE_RMS];
    let ours = ours_add(A, 0..N);
    let mut remover = ours.clone();
    let deltas: Vec<_> = victims.iter().map(|e| remover.remove(e)).collect();
    let theirs = theirs_add(A, 0..N);
    let mut their_remover = theirs.clone();
    let ops: Vec<_> = victims
        .iter()
        .map(|e| {
            let ctx = their_remover.contains(e).derive_rm_ctx();
            let op = their_remover.rm(*e, ctx);
            their_remover.apply(op.clone());
            op
        })
        .collect();
    let mut g = c.benchmark_group("set_remote_remove_20_of_100k");
    g.throughput(Throughput::Elements(REMOTE_RMS as u64));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            || (ours.clone(), deltas.clone()),
            |(mut s, ds)| {
                for d in ds {
                    s.apply(d);
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            || (theirs.clone(), ops.clone()),
            |(mut s, os)| {
                for op in os {
                    s.apply(op);
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
    // Same result on both sides.
    let mut x = ours;
    for d in deltas {
        x.apply(d);
    }
    let mut y = theirs;
    for op in ops {
        y.apply(op);
    }
    assert_eq!(x, remover);
    assert_eq!(x.len(), N as usize - REMOTE_RMS);
    assert_eq!(y.read().val.len(), N as usize - REMOTE_RMS);
}

fn set_merge(c: &mut Criterion) {
    let (oa, ob) = (ours_add(A, 0..N), ours_add(B, N / 2..N + N / 2));
    let (ta, tb) = (theirs_add(A, 0..N), theirs_add(B, N / 2..N + N / 2));
    let mut g = c.benchmark_group("set_merge_2x100k");
    g.throughput(Throughput::Elements(2 * N));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            || (oa.clone(), ob.clone()),
            |(mut x, y)| {
                x.join(y);
                x
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            || (ta.clone(), tb.clone()),
            |(mut x, y)| {
                x.merge(y);
                x
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
    // Same result on both sides.
    let mut x = oa;
    x.join(ob);
    let mut y = ta;
    y.merge(tb);
    assert_eq!(x.len(), (N + N / 2) as usize);
    assert_eq!(y.read().val.len(), (N + N / 2) as usize);
}

fn counter_inc(c: &mut Criterion) {
    let mut g = c.benchmark_group("counter_inc_1m");
    g.throughput(Throughput::Elements(OPS));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            GCounter::new,
            |mut ctr| {
                for _ in 0..OPS {
                    black_box(ctr.inc(ReplicaId(A), 1));
                }
                ctr
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            crdts::GCounter::<u128>::new,
            |mut ctr| {
                for _ in 0..OPS {
                    let op = ctr.inc(A);
                    ctr.apply(op);
                }
                ctr
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

fn pncounter_inc_dec(c: &mut Criterion) {
    // Alternating increments and decrements, each building the delta (or op) it returns.
    let mut g = c.benchmark_group("pncounter_inc_dec_1m");
    g.throughput(Throughput::Elements(OPS));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            PNCounter::new,
            |mut ctr| {
                for i in 0..OPS {
                    if i % 2 == 0 {
                        black_box(ctr.inc(ReplicaId(A), 1));
                    } else {
                        black_box(ctr.dec(ReplicaId(A), 1));
                    }
                }
                ctr
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            crdts::PNCounter::<u128>::new,
            |mut ctr| {
                for i in 0..OPS {
                    let op = if i % 2 == 0 { ctr.inc(A) } else { ctr.dec(A) };
                    ctr.apply(op);
                }
                ctr
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

/// Adds of new elements to a set that already holds 100k: the cost of a mutation on a large
/// set, not of building one.
fn set_add_at_100k(c: &mut Criterion) {
    const ADDS: u64 = 10_000;
    let (ours, theirs) = (ours_add(A, 0..N), theirs_add(A, 0..N));
    let mut g = c.benchmark_group("set_add_10k_into_100k");
    g.throughput(Throughput::Elements(ADDS));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            || ours.clone(),
            |mut s| {
                for e in N..N + ADDS {
                    black_box(s.add(ReplicaId(A), e).expect("dots left"));
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            || theirs.clone(),
            |mut s| {
                for e in N..N + ADDS {
                    let ctx = s.read_ctx().derive_add_ctx(A);
                    let op = s.add(e, ctx);
                    s.apply(op);
                }
                s
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

fn counter_merge(c: &mut Criterion) {
    // Two counters of 1,000 replica entries each; half of the replicas appear in both.
    let left = replica_ids(0..COUNTER_REPLICAS);
    let right = replica_ids(COUNTER_REPLICAS / 2..COUNTER_REPLICAS + COUNTER_REPLICAS / 2);
    let (oa, ob) = (ours_counter(&left), ours_counter(&right));
    let (ta, tb) = (theirs_counter(&left), theirs_counter(&right));
    let mut g = c.benchmark_group("counter_merge_2x1000_replicas");
    g.throughput(Throughput::Elements(2 * COUNTER_REPLICAS));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            || (oa.clone(), ob.clone()),
            |(mut x, y)| {
                x.join(y);
                x
            },
            BatchSize::SmallInput,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            || (ta.clone(), tb.clone()),
            |(mut x, y)| {
                x.merge(y);
                x
            },
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

fn lww_write(c: &mut Criterion) {
    let mut g = c.benchmark_group("lww_write_1m");
    g.throughput(Throughput::Elements(OPS));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            LWWRegister::<u64>::new,
            |mut reg| {
                for i in 0..OPS {
                    let ts = Timestamp {
                        physical_ms: 1_700_000_000_000 + i,
                        logical: 0,
                        replica: ReplicaId(A),
                    };
                    black_box(reg.write(black_box(ts), black_box(i)));
                }
                reg
            },
            BatchSize::PerIteration,
        );
    });
    // Equal semantics to rust-crdt's `update` (in place, nothing returned): `set`. Its `bool`
    // (did the write win) is not passed through `black_box`: rust-crdt's `update` computes no
    // such output, so both sides `black_box` exactly their inputs (the value and the marker /
    // timestamp); the register itself is returned from the routine on both sides, so neither
    // write can be optimized away.
    g.bench_function("tidemark-set", |b| {
        b.iter_batched(
            LWWRegister::<u64>::new,
            |mut reg| {
                for i in 0..OPS {
                    let ts = Timestamp {
                        physical_ms: 1_700_000_000_000 + i,
                        logical: 0,
                        replica: ReplicaId(A),
                    };
                    reg.set(black_box(ts), black_box(i));
                }
                reg
            },
            BatchSize::PerIteration,
        );
    });
    // Equal ordering too: rust-crdt's register with our HLC timestamp as its marker (the
    // same `(physical_ms, logical, replica)` order, built through `black_box` alike).
    g.bench_function("rust-crdt-hlc-marker", |b| {
        b.iter_batched(
            || crdts::LWWReg::<u64, Timestamp> {
                val: 0,
                marker: Timestamp::default(),
            },
            |mut reg| {
                for i in 0..OPS {
                    let ts = Timestamp {
                        physical_ms: 1_700_000_000_000 + i,
                        logical: 0,
                        replica: ReplicaId(A),
                    };
                    reg.update(black_box(i), black_box(ts));
                }
                reg
            },
            BatchSize::PerIteration,
        );
    });
    // Equal work to our `write` (which builds the delta it ships and returns it through
    // `black_box`): rust-crdt's op-based form with the same HLC marker, where the op is a whole
    // `LWWReg` (`CmRDT::Op = Self`): built, applied (a clone of it) and returned through
    // `black_box` alike.
    g.bench_function("rust-crdt-hlc-op", |b| {
        b.iter_batched(
            || crdts::LWWReg::<u64, Timestamp> {
                val: 0,
                marker: Timestamp::default(),
            },
            |mut reg| {
                for i in 0..OPS {
                    let ts = Timestamp {
                        physical_ms: 1_700_000_000_000 + i,
                        logical: 0,
                        replica: ReplicaId(A),
                    };
                    let op = crdts::LWWReg {
                        val: black_box(i),
                        marker: black_box(ts),
                    };
                    reg.apply(op.clone());
                    black_box(op);
                }
                reg
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            || crdts::LWWReg::<u64, u64> { val: 0, marker: 0 },
            |mut reg| {
                for i in 0..OPS {
                    // black_box: keeps the compiler from collapsing the loop.
                    reg.update(black_box(i), black_box(1_700_000_000_000 + i));
                }
                reg
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

fn mv_write(c: &mut Criterion) {
    let mut g = c.benchmark_group("mv_write_1m");
    g.throughput(Throughput::Elements(OPS));
    g.bench_function("tidemark", |b| {
        b.iter_batched(
            MVRegister::<u64>::new,
            |mut reg| {
                for i in 0..OPS {
                    black_box(reg.write(ReplicaId(A), black_box(i)).expect("dots left"));
                }
                reg
            },
            BatchSize::PerIteration,
        );
    });
    g.bench_function("rust-crdt", |b| {
        b.iter_batched(
            crdts::MVReg::<u64, u128>::new,
            |mut reg| {
                for i in 0..OPS {
                    let ctx = reg.read_ctx().derive_add_ctx(A);
                    let op = reg.write(black_box(i), ctx);
                    reg.apply(op);
                }
                reg
            },
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

fn bincode_cfg() -> bincode::config::Configuration {
    bincode::config::standard()
}

fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(v, bincode_cfg()).expect("encodes")
}

fn set_codec(c: &mut Criterion) {
    let ours = ours_merged();
    let theirs = theirs_merged();
    let (ob, tb) = (encode(&ours), encode(&theirs));
    let mut g = c.benchmark_group("set_encode_150k");
    g.throughput(Throughput::Elements(N + N / 2));
    g.bench_function("tidemark", |b| b.iter(|| encode(black_box(&ours))));
    g.bench_function("rust-crdt", |b| b.iter(|| encode(black_box(&theirs))));
    g.finish();
    let mut g = c.benchmark_group("set_decode_150k");
    g.throughput(Throughput::Elements(N + N / 2));
    g.bench_function("tidemark", |b| {
        b.iter(|| {
            bincode::serde::decode_from_slice::<ORSet<u64>, _>(black_box(&ob), bincode_cfg())
                .expect("decodes")
        })
    });
    g.bench_function("rust-crdt", |b| {
        b.iter(|| {
            bincode::serde::decode_from_slice::<Theirs, _>(black_box(&tb), bincode_cfg())
                .expect("decodes")
        })
    });
    g.finish();
}

/// The pre-compaction encoding (every dot carrying its replica id), rebuilt by hand for
/// comparison: what `#[derive]` on `Causal`/`Dot` wrote (`store` then `ctx`).
#[derive(serde::Serialize)]
struct PlainCausal<'a> {
    store: std::collections::BTreeMap<u64, Vec<(u128, u64)>>,
    ctx: &'a tidemark_crdts::CausalContext,
}

fn plain(s: &ORSet<u64>) -> PlainCausal<'_> {
    let store = s
        .elements()
        .map(|e| {
            let dots = s.dots_of(e).iter().map(|d| (d.replica.0, d.seq)).collect();
            (*e, dots)
        })
        .collect();
    PlainCausal {
        store,
        ctx: s.context(),
    }
}

/// Not a timing: prints the encoded sizes (bincode 2 standard config, serde) to stderr.
fn encoded_sizes(_c: &mut Criterion) {
    let ours = ours_merged();
    let theirs = theirs_merged();
    // Decoding gives back the same value (guards the figures below).
    let back: ORSet<u64> = bincode::serde::decode_from_slice(&encode(&ours), bincode_cfg())
        .expect("decodes")
        .0;
    assert_eq!(back, ours);
    let ours_state = encode(&ours).len();
    let theirs_state = encode(&theirs).len();
    let plain_state = encode(&plain(&ours)).len();

    // rust-crdt's cheapest encoding: small integer actors (1 and 2) instead of 128-bit ids.
    let theirs_small = {
        let build = |actor: u64, elems: core::ops::Range<u64>| {
            let mut s = crdts::Orswot::<u64, u64>::new();
            for e in elems {
                let ctx = s.read_ctx().derive_add_ctx(actor);
                let op = s.add(e, ctx);
                s.apply(op);
            }
            s
        };
        let mut a = build(1, 0..N);
        a.merge(build(2, N / 2..N + N / 2));
        encode(&a).len()
    };

    let mut big = ours_add(A, 0..N);
    let fresh = encode(&big.add(ReplicaId(A), N).expect("dots left")).len();
    let readd = encode(&big.add(ReplicaId(A), 7).expect("dots left")).len();
    let removal = encode(&big.remove(&8)).len();
    let big_theirs = theirs_add(A, 0..N);
    let ctx = big_theirs.read_ctx().derive_add_ctx(A);
    let op_theirs = encode(&big_theirs.add(N, ctx)).len();
    let rm_ctx = big_theirs.contains(&8).derive_rm_ctx();
    let rm_theirs = encode(&big_theirs.rm(8, rm_ctx)).len();

    eprintln!();
    eprintln!("== encoded sizes (bincode 2.0.1 serde, standard config) ==");
    eprintln!(
        "merged 150k-element set state : tidemark {ours_state} B, rust-crdt {theirs_state} B \
         (ratio {:.2}); tidemark before compaction (plain derives) {plain_state} B",
        ours_state as f64 / theirs_state as f64
    );
    eprintln!(
        "  same set, rust-crdt with small integer actors (u64 1, 2): {theirs_small} B \
         (ratio {:.2})",
        ours_state as f64 / theirs_small as f64
    );
    eprintln!(
        "one add to a 100k-element set : tidemark delta {fresh} B (new element), {readd} B \
         (re-add of a present element); rust-crdt Op {op_theirs} B"
    );
    eprintln!(
        "one remove from that set      : tidemark delta {removal} B; rust-crdt Op {rm_theirs} B"
    );
    eprintln!();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = encoded_sizes, set_add, set_add_at_100k, set_remove, set_scrambled, set_remote_remove, set_merge, counter_inc,
        pncounter_inc_dec, counter_merge,
        lww_write, mv_write, set_codec
}
criterion_main!(benches);
