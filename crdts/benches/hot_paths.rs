//! The lattice crate's hot paths, one per workload, for instruction-count profiles:
//! `valgrind --tool=callgrind --toggle-collect='*measure_*' target/release/deps/hot_paths-* WORKLOAD`.
//!
//! Not a timing (the machine is shared and noisy): callgrind counts the instructions executed
//! inside the `measure_*` function of the workload only (setup excluded), which is stable from
//! run to run and comparable before and after a change. Run without valgrind it executes every
//! workload once and prints nothing but a checksum, so `cargo bench` stays fast.
//!
//! Workloads (the operation counts are printed so instructions per op can be derived):
//! `set_add`, `set_add_random` (100k adds of scrambled elements below 400k), `set_remove`,
//! `set_remove_random` (50k removes of scrambled elements of a 100k set), `set_merge`,
//! `counter_inc`, `pncounter_inc_dec` (alternating), `lww_write`, `lww_set` (in place, no delta), `mv_write`,
//! `store_counter_inc`, `store_set_add`, `store_lww_set`.

use crdts::{CmRDT, CvRDT};
use std::hint::black_box;
use tidemark_crdts::{
    GCounter, Key, KeyKind, LWWRegister, Lattice, MVRegister, Mutation, ORSet, PNCounter,
    ReplicaId, Store, Timestamp,
};

const A: ReplicaId = ReplicaId(0x8f3e_52c1_9a0d_4b6e_a1f2_3c4d_5e6f_7081);
const B: ReplicaId = ReplicaId(0x1c07_d9e4_6b2a_4f13_8e5d_0a9b_c8d7_e6f5);
const SET_N: u64 = 100_000;
const OPS: u64 = 1_000_000;
const STORE_OPS: u64 = 10_000;

fn built(replica: ReplicaId, elems: core::ops::Range<u64>) -> ORSet<u64> {
    let mut s = ORSet::new();
    for e in elems {
        s.add(replica, e).expect("dots left");
    }
    s
}

#[inline(never)]
fn measure_set_add(s: &mut ORSet<u64>) {
    for e in 0..SET_N {
        black_box(s.add(A, e).expect("dots left"));
    }
}

#[inline(never)]
fn measure_set_remove(s: &mut ORSet<u64>) {
    for e in (0..SET_N).step_by(2) {
        black_box(s.remove(&e));
    }
}

/// Element `i` of a fixed pseudo-random permutation-like sequence (splitmix64 of `i`).
fn scrambled(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % (4 * SET_N)
}

#[inline(never)]
fn measure_set_add_random(s: &mut ORSet<u64>) {
    for i in 0..SET_N {
        black_box(s.add(A, scrambled(i)).expect("dots left"));
    }
}

#[inline(never)]
fn measure_set_remove_random(s: &mut ORSet<u64>) {
    for i in 0..SET_N / 2 {
        black_box(s.remove(&(scrambled(i) % SET_N)));
    }
}

#[inline(never)]
fn measure_set_merge(x: &mut ORSet<u64>, y: ORSet<u64>) {
    x.join(y);
}

#[inline(never)]
fn measure_counter_inc(c: &mut GCounter) {
    for _ in 0..OPS {
        black_box(c.inc(A, 1));
    }
}

#[inline(never)]
fn measure_pncounter_inc_dec(c: &mut PNCounter) {
    for i in 0..OPS {
        if i % 2 == 0 {
            black_box(c.inc(A, 1));
        } else {
            black_box(c.dec(A, 1));
        }
    }
}

#[inline(never)]
fn measure_lww_write(r: &mut LWWRegister<u64>) {
    for i in 0..OPS {
        let ts = Timestamp {
            physical_ms: 1_700_000_000_000 + i,
            logical: 0,
            replica: A,
        };
        black_box(r.write(black_box(ts), black_box(i)));
    }
}

#[inline(never)]
fn measure_lww_set(r: &mut LWWRegister<u64>) {
    for i in 0..OPS {
        let ts = Timestamp {
            physical_ms: 1_700_000_000_000 + i,
            logical: 0,
            replica: A,
        };
        black_box(r.set(black_box(ts), black_box(i)));
    }
}

#[inline(never)]
fn measure_mv_write(r: &mut MVRegister<u64>) {
    for i in 0..OPS {
        black_box(r.write(A, black_box(i)).expect("dots left"));
    }
}

#[inline(never)]
fn measure_store_counter_inc(s: &mut Store, key: &Key) {
    for _ in 0..STORE_OPS {
        black_box(s.mutate(A, key, &Mutation::Inc(1), None).expect("applies"));
    }
}

#[inline(never)]
fn measure_store_set_add(s: &mut Store, key: &Key, elems: &[String]) {
    for e in elems {
        black_box(
            s.mutate(A, key, &Mutation::Add(e.clone()), None)
                .expect("applies"),
        );
    }
}

#[inline(never)]
fn measure_store_lww_set(s: &mut Store, key: &Key, values: &[String]) {
    for (i, v) in values.iter().enumerate() {
        let ts = Timestamp {
            physical_ms: 1_700_000_000_000 + i as u64,
            logical: 0,
            replica: A,
        };
        black_box(
            s.mutate(A, key, &Mutation::Set(v.clone()), Some(ts))
                .expect("applies"),
        );
    }
}

type Theirs = crdts::Orswot<u64, u128>;

fn theirs_built(actor: u128, elems: core::ops::Range<u64>) -> Theirs {
    let mut s = Theirs::new();
    for e in elems {
        let ctx = s.read_ctx().derive_add_ctx(actor);
        let op = s.add(e, ctx);
        s.apply(op);
    }
    s
}

#[inline(never)]
fn measure_theirs_set_add(s: &mut Theirs) {
    for e in 0..SET_N {
        let ctx = s.read_ctx().derive_add_ctx(A.0);
        let op = s.add(e, ctx);
        s.apply(op);
    }
}

#[inline(never)]
fn measure_theirs_set_remove(s: &mut Theirs) {
    for e in (0..SET_N).step_by(2) {
        let ctx = s.contains(&e).derive_rm_ctx();
        let op = s.rm(e, ctx);
        s.apply(op);
    }
}

#[inline(never)]
fn measure_theirs_set_merge(x: &mut Theirs, y: Theirs) {
    x.merge(y);
}

#[inline(never)]
fn measure_theirs_counter_inc(c: &mut crdts::GCounter<u128>) {
    for _ in 0..OPS {
        let op = c.inc(A.0);
        c.apply(op);
    }
}

#[inline(never)]
fn measure_theirs_pncounter_inc_dec(c: &mut crdts::PNCounter<u128>) {
    for i in 0..OPS {
        let op = if i % 2 == 0 { c.inc(A.0) } else { c.dec(A.0) };
        c.apply(op);
    }
}

#[inline(never)]
fn measure_theirs_set_add_random(s: &mut Theirs) {
    for i in 0..SET_N {
        let ctx = s.read_ctx().derive_add_ctx(A.0);
        let op = s.add(scrambled(i), ctx);
        s.apply(op);
    }
}

#[inline(never)]
fn measure_theirs_set_remove_random(s: &mut Theirs) {
    for i in 0..SET_N / 2 {
        let e = scrambled(i) % SET_N;
        let ctx = s.contains(&e).derive_rm_ctx();
        let op = s.rm(e, ctx);
        s.apply(op);
    }
}

#[inline(never)]
fn measure_theirs_lww_write(r: &mut crdts::LWWReg<u64, u64>) {
    for i in 0..OPS {
        r.update(black_box(i), black_box(1_700_000_000_000 + i));
    }
}

#[inline(never)]
fn measure_theirs_lww_hlc(r: &mut crdts::LWWReg<u64, Timestamp>) {
    for i in 0..OPS {
        let ts = Timestamp {
            physical_ms: 1_700_000_000_000 + i,
            logical: 0,
            replica: A,
        };
        r.update(black_box(i), black_box(ts));
    }
}

#[inline(never)]
fn measure_theirs_mv_write(r: &mut crdts::MVReg<u64, u128>) {
    for i in 0..OPS {
        let ctx = r.read_ctx().derive_add_ctx(A.0);
        let op = r.write(black_box(i), ctx);
        r.apply(op);
    }
}

/// rust-crdt (`crdts` 7.3.2) on the same workloads, as `vs_rust_crdt` drives it.
fn run_theirs(workload: &str) -> Option<(u64, usize)> {
    let out = match workload {
        "theirs_set_add" => {
            let mut s = Theirs::new();
            measure_theirs_set_add(&mut s);
            (SET_N, s.read().val.len())
        }
        "theirs_set_remove" => {
            let mut s = theirs_built(A.0, 0..SET_N);
            measure_theirs_set_remove(&mut s);
            (SET_N / 2, s.read().val.len())
        }
        "theirs_set_merge" => {
            let mut x = theirs_built(A.0, 0..SET_N);
            let y = theirs_built(B.0, SET_N / 2..SET_N + SET_N / 2);
            measure_theirs_set_merge(&mut x, y);
            (2 * SET_N, x.read().val.len())
        }
        "theirs_counter_inc" => {
            let mut c = crdts::GCounter::new();
            measure_theirs_counter_inc(&mut c);
            (OPS, usize::try_from(c.read()).unwrap_or(0))
        }
        "theirs_pncounter_inc_dec" => {
            let mut c = crdts::PNCounter::new();
            measure_theirs_pncounter_inc_dec(&mut c);
            (OPS, c.read().to_string().len())
        }
        "theirs_set_add_random" => {
            let mut s = Theirs::new();
            measure_theirs_set_add_random(&mut s);
            (SET_N, s.read().val.len())
        }
        "theirs_set_remove_random" => {
            let mut s = theirs_built(A.0, 0..SET_N);
            measure_theirs_set_remove_random(&mut s);
            (SET_N / 2, s.read().val.len())
        }
        "theirs_lww_write" => {
            let mut r = crdts::LWWReg { val: 0, marker: 0 };
            measure_theirs_lww_write(&mut r);
            (OPS, r.val as usize)
        }
        "theirs_lww_hlc" => {
            let mut r = crdts::LWWReg {
                val: 0,
                marker: Timestamp::default(),
            };
            measure_theirs_lww_hlc(&mut r);
            (OPS, r.val as usize)
        }
        "theirs_mv_write" => {
            let mut r = crdts::MVReg::new();
            measure_theirs_mv_write(&mut r);
            (OPS, r.read().val.len())
        }
        _ => return None,
    };
    Some(out)
}

fn run(workload: &str) -> Option<(u64, usize)> {
    if workload.starts_with("theirs_") {
        return run_theirs(workload);
    }
    let out = match workload {
        "set_add" => {
            let mut s = ORSet::new();
            measure_set_add(&mut s);
            (SET_N, s.len())
        }
        "set_remove" => {
            let mut s = built(A, 0..SET_N);
            measure_set_remove(&mut s);
            (SET_N / 2, s.len())
        }
        "set_merge" => {
            let mut x = built(A, 0..SET_N);
            let y = built(B, SET_N / 2..SET_N + SET_N / 2);
            measure_set_merge(&mut x, y);
            (2 * SET_N, x.len())
        }
        "counter_inc" => {
            let mut c = GCounter::new();
            measure_counter_inc(&mut c);
            (OPS, c.value() as usize)
        }
        "pncounter_inc_dec" => {
            let mut c = PNCounter::new();
            measure_pncounter_inc_dec(&mut c);
            (OPS, c.value().to_string().len())
        }
        "lww_write" => {
            let mut r = LWWRegister::new();
            measure_lww_write(&mut r);
            (OPS, r.read().copied().unwrap_or(0) as usize)
        }
        "lww_set" => {
            let mut r = LWWRegister::new();
            measure_lww_set(&mut r);
            (OPS, r.read().copied().unwrap_or(0) as usize)
        }
        "set_remove_random" => {
            let mut s = built(A, 0..SET_N);
            measure_set_remove_random(&mut s);
            (SET_N / 2, s.len())
        }
        "set_add_random" => {
            let mut s = ORSet::new();
            measure_set_add_random(&mut s);
            (SET_N, s.len())
        }
        "mv_write" => {
            let mut r = MVRegister::new();
            measure_mv_write(&mut r);
            (OPS, r.read().len())
        }
        "store_counter_inc" => {
            let mut s = Store::new();
            let key = Key::new(KeyKind::GCounter, "visits");
            measure_store_counter_inc(&mut s, &key);
            (STORE_OPS, s.entries().len())
        }
        "store_set_add" => {
            let mut s = Store::new();
            let key = Key::new(KeyKind::ORSet, "tags");
            // A set of 100 elements, re-added 100 times each (the node's write path; the
            // reference store clones the whole set per op, so the set is kept small).
            let elems: Vec<String> = (0..STORE_OPS).map(|i| (i % 100).to_string()).collect();
            measure_store_set_add(&mut s, &key, &elems);
            (STORE_OPS, s.entries().len())
        }
        "store_lww_set" => {
            let mut s = Store::new();
            let key = Key::new(KeyKind::Lww, "status");
            let values: Vec<String> = (0..STORE_OPS).map(|i| format!("\"v{i}\"")).collect();
            measure_store_lww_set(&mut s, &key, &values);
            (STORE_OPS, s.entries().len())
        }
        _ => return None,
    };
    Some(out)
}

const ALL: [&str; 13] = [
    "set_add",
    "set_add_random",
    "set_remove",
    "set_remove_random",
    "set_merge",
    "counter_inc",
    "pncounter_inc_dec",
    "lww_write",
    "lww_set",
    "mv_write",
    "store_counter_inc",
    "store_set_add",
    "store_lww_set",
];

fn main() {
    // `cargo bench` passes `--bench`; a workload name selects one workload.
    let chosen: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let names: Vec<&str> = if chosen.is_empty() {
        ALL.to_vec()
    } else {
        chosen.iter().map(String::as_str).collect()
    };
    for name in names {
        match run(name) {
            Some((ops, check)) => println!("{name}: {ops} ops (check {check})"),
            None => {
                eprintln!("unknown workload {name}; one of {ALL:?}");
                std::process::exit(2);
            }
        }
    }
}
