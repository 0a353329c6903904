//! What a seed does: the schedule of actions (writes, network faults, partitions, crashes,
//! pauses, wipes, clock skews, snapshots, restores) and the ops clients write, per backend.
//!
//! * Memory: 100–300 ops in batches of 1–24 on keys of every kind (1 in 100 ops an invalid
//!   counter delete, 3 % of register writes a large value), 30 % of the writes idempotent
//!   events from up to 200 sources; drops up to 30 %, duplicates up to 10 %, delays up to 5 s;
//!   five partition shapes (halves, isolate-one, ring, one-way, bridge); up to 4 crashes, 2
//!   pauses of up to 60 s, a wipe in 30 % of the seeds, clock skews of up to an hour.
//! * Recording: 200–700 commit groups of 1–3 callers' writes of 1–3 ops (rarely an invalid
//!   counter delete); drops up to 20 %, duplicates up to 10 %, delays up to 2 s; three
//!   partition shapes (halves, one link, one-way); 4–12 crashes in any [`CrashMode`], one in
//!   ten long enough to be evicted; from their own generator, 0–3 snapshots and 0–2 restores
//!   (some restoring two nodes from one snapshot).

use super::crash::CrashMode;
use super::harness::{Faults, Sim};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tidemark::store::{EventId, LocalWrite};
use tidemark_crdts::{Key, KeyKind, Mutation};

/// The largest register value the memory workload writes. Kept at a size every path handles
/// today; raise it to the limits (`Limits::value_bytes_max`) once oversized log records,
/// intervals and chunks are split by construction (ARCHITECTURE.md, "size invariants"): every
/// message is asserted to fit in `frame_bytes_max` and every log record to be readable.
pub const MAX_VALUE_BYTES: usize = 2 * 1024;
/// The largest batch (one commit group) the memory workload writes.
const MAX_BATCH_OPS: usize = 24;
/// The most event sources one seed uses.
pub const MAX_SOURCES: u64 = 200;

#[derive(Clone, Debug)]
pub enum Action {
    Write(usize),
    Faults(Faults),
    Partition(Vec<Vec<bool>>),
    Crash {
        node: usize,
        down_ms: u64,
        mode: CrashMode,
    },
    Pause(usize, u64),
    /// The node loses its data: a new store under a new replica id.
    Wipe(usize, u64),
    Skew(usize, i64),
    /// Take a snapshot of this node's store and keep it for restores.
    Snapshot(usize),
    /// `node` loses its disk and is restored from a kept snapshot (`pick` chooses one) or, with
    /// none kept or `pick` unset, from one taken of `fresh_from` at that moment; `also`: another
    /// node restored from the same snapshot right after.
    Restore {
        node: usize,
        down_ms: u64,
        pick: Option<usize>,
        fresh_from: usize,
        also: Option<usize>,
    },
}

pub fn key_of(idx: usize) -> Key {
    Key::new(KeyKind::ALL[idx % 5], format!("k{idx}"))
}

fn write_of(ops: Vec<(Key, Mutation)>, event: Option<EventId>) -> LocalWrite {
    LocalWrite {
        ops,
        event,
        stamps: Vec::new(),
        late: None,
        own_dots: false,
    }
}

/// A random order of `0..n`.
fn shuffled(rng: &mut impl Rng, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    order
}

fn cut(b: &mut [Vec<bool>], x: usize, y: usize) {
    b[x][y] = true;
    b[y][x] = true;
}

// ---- memory backend ----------------------------------------------------------------------

/// A partition shape (Jepsen's) of `n` (5) nodes, as `blocked[from][to]`.
pub fn memory_partition(rng: &mut impl Rng, n: usize) -> Vec<Vec<bool>> {
    let mut b = vec![vec![false; n]; n];
    let order = shuffled(rng, n);
    match rng.random_range(0..5) {
        0 => {
            // majority / minority halves
            let k = rng.random_range(1..=2);
            for &x in &order[..k] {
                for &y in &order[k..] {
                    cut(&mut b, x, y);
                }
            }
        }
        1 => {
            // isolate one
            let x = order[0];
            for y in 0..n {
                if y != x {
                    cut(&mut b, x, y);
                }
            }
        }
        2 => {
            // majorities ring: each node sees only its two ring neighbours
            for i in 0..n {
                for j in 0..n {
                    let d = (i + n - j) % n;
                    if i != j && d != 1 && d != n - 1 {
                        b[order[i]][order[j]] = true;
                    }
                }
            }
        }
        3 => {
            // one-way: one node cannot send to anyone (it still receives)
            let x = order[0];
            for (y, cell) in b[x].iter_mut().enumerate() {
                if y != x {
                    *cell = true;
                }
            }
        }
        _ => {
            // bridge: two halves joined only through one node (`order[0]`)
            for &x in &order[1..3] {
                for &y in &order[3..] {
                    cut(&mut b, x, y);
                }
            }
        }
    }
    b
}

/// The memory backend's schedule over `n` nodes and its number of keys.
pub fn memory_schedule(
    rng: &mut impl Rng,
    n: usize,
    window_ms: u64,
) -> (Vec<(u64, Action)>, usize) {
    let mut actions = Vec::new();
    let n_writes = rng.random_range(80..=230); // batches of 1-3: 100-300 ops
    for _ in 0..n_writes {
        let t = rng.random_range(0..window_ms);
        actions.push((t, Action::Write(rng.random_range(0..n))));
    }
    let mut t = 0;
    while t < window_ms {
        let faults = if rng.random_bool(0.6) {
            Faults {
                drop_pct: rng.random_range(0..=30),
                dup_pct: rng.random_range(0..=10),
                delay_max_ms: rng.random_range(0..=5_000),
            }
        } else {
            Faults::default()
        };
        actions.push((t, Action::Faults(faults)));
        let blocked = if rng.random_bool(0.45) {
            memory_partition(rng, n)
        } else {
            vec![vec![false; n]; n]
        };
        actions.push((t, Action::Partition(blocked)));
        t += rng.random_range(1_000..=8_000);
    }
    for _ in 0..rng.random_range(0..=4) {
        let at = rng.random_range(0..window_ms);
        let (node, down_ms) = (rng.random_range(0..n), rng.random_range(50..=5_000));
        let mode = CrashMode::Idle;
        actions.push((
            at,
            Action::Crash {
                node,
                down_ms,
                mode,
            },
        ));
    }
    for _ in 0..rng.random_range(0..=2) {
        let at = rng.random_range(0..window_ms);
        actions.push((
            at,
            Action::Pause(rng.random_range(0..n), rng.random_range(500..=60_000)),
        ));
    }
    if rng.random_bool(0.3) {
        let at = rng.random_range(0..window_ms);
        actions.push((
            at,
            Action::Wipe(rng.random_range(0..n), rng.random_range(50..=3_000)),
        ));
    }
    for i in 0..n {
        if rng.random_bool(0.5) {
            actions.push((0, Action::Skew(i, rng.random_range(-3_600_000..=3_600_000))));
        }
    }
    for _ in 0..rng.random_range(0..=2) {
        let at = rng.random_range(0..window_ms);
        actions.push((
            at,
            Action::Skew(
                rng.random_range(0..n),
                rng.random_range(-3_600_000..=3_600_000),
            ),
        ));
    }
    actions.sort_by_key(|(t, _)| *t);
    let n_keys = rng.random_range(1..=200);
    (actions, n_keys)
}

/// One op of the memory workload on one of `n_keys` keys; `serial` numbers register values.
pub fn memory_op(rng: &mut impl Rng, n_keys: usize, serial: &mut u64) -> (Key, Mutation) {
    let key = key_of(rng.random_range(0..n_keys));
    *serial += 1;
    if rng.random_range(0..100) == 0 {
        // Invalid on purpose for counters (refused, never acknowledged); fine elsewhere.
        return (key, Mutation::Delete);
    }
    let m = match key.kind {
        KeyKind::GCounter => Mutation::Inc(rng.random_range(1..=5)),
        KeyKind::PNCounter => {
            if rng.random_bool(0.5) {
                Mutation::Inc(rng.random_range(1..=5))
            } else {
                Mutation::Dec(rng.random_range(1..=5))
            }
        }
        KeyKind::ORSet => {
            let e = format!("\"e{}\"", rng.random_range(0..4));
            match rng.random_range(0..100) {
                0..55 => Mutation::Add(e),
                55..90 => Mutation::Remove(e),
                _ => Mutation::Delete,
            }
        }
        KeyKind::Lww | KeyKind::MvReg => match rng.random_range(0..100) {
            0..3 => {
                // A large value (a JSON string), up to MAX_VALUE_BYTES.
                let len = rng.random_range(256..=MAX_VALUE_BYTES - 16);
                Mutation::Set(format!("\"v{serial}-{}\"", "x".repeat(len)))
            }
            3..85 => Mutation::Set(format!("\"v{serial}\"")),
            _ => Mutation::Delete,
        },
    };
    (key, m)
}

/// A counter delete: refused by the store.
pub fn is_invalid(key: &Key, m: &Mutation) -> bool {
    matches!(key.kind, KeyKind::GCounter | KeyKind::PNCounter) && *m == Mutation::Delete
}

// ---- recording backend -------------------------------------------------------------------

/// A partition shape of `n` (2–4) nodes as `blocked[from][to]`.
pub fn recording_partition(rng: &mut impl Rng, n: usize) -> Vec<Vec<bool>> {
    let mut b = vec![vec![false; n]; n];
    let order = shuffled(rng, n);
    match rng.random_range(0..3) {
        0 => {
            // Halves (one node against the rest, or two against two).
            let k = rng.random_range(1..=n / 2);
            for &x in &order[..k] {
                for &y in &order[k..] {
                    cut(&mut b, x, y);
                }
            }
        }
        1 => {
            // One link cut both ways.
            cut(&mut b, order[0], order[1]);
        }
        _ => {
            // One-way: one node cannot send to anyone (it still receives).
            let x = order[0];
            for (y, cell) in b[x].iter_mut().enumerate() {
                *cell = y != x;
            }
        }
    }
    b
}

/// The recording backend's schedule over `n` nodes (snapshots and restores aside).
pub fn recording_schedule(rng: &mut impl Rng, n: usize, window_ms: u64) -> Vec<(u64, Action)> {
    let mut actions = Vec::new();
    for _ in 0..rng.random_range(200..=700) {
        let t = rng.random_range(0..window_ms);
        actions.push((t, Action::Write(rng.random_range(0..n))));
    }
    let mut t = 0;
    while t < window_ms {
        let faults = if rng.random_bool(0.6) {
            Faults {
                drop_pct: rng.random_range(0..=20),
                dup_pct: rng.random_range(0..=10),
                delay_max_ms: rng.random_range(0..=2_000),
            }
        } else {
            Faults::default()
        };
        actions.push((t, Action::Faults(faults)));
        let blocked = if rng.random_bool(0.4) {
            recording_partition(rng, n)
        } else {
            vec![vec![false; n]; n]
        };
        actions.push((t, Action::Partition(blocked)));
        t += rng.random_range(1_000..=6_000);
    }
    for _ in 0..rng.random_range(4..=12) {
        let at = rng.random_range(0..window_ms);
        let down_ms = if rng.random_range(0..10) == 0 {
            // Long enough to be evicted by its peers (they compact past it).
            rng.random_range(11_000..=20_000)
        } else {
            rng.random_range(50..=5_000)
        };
        let mode = match rng.random_range(0..20) {
            0..3 => CrashMode::Idle,
            3..9 => CrashMode::DuringWrite,
            9..15 => CrashMode::DuringDelivery,
            _ => CrashMode::DuringTick,
        };
        actions.push((
            at,
            Action::Crash {
                node: rng.random_range(0..n),
                down_ms,
                mode,
            },
        ));
    }
    // Stable: actions at one time keep their order.
    actions.sort_by_key(|(t, _)| *t);
    actions
}

/// Snapshots and restores (0–2 restores a seed, some restoring two nodes from one snapshot),
/// from their own generator: the rest of the schedule is the same as without them.
pub fn restore_schedule(seed: u64, n: usize, window_ms: u64) -> Vec<(u64, Action)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7e57_0de5_0f5a_f00d);
    let mut actions = Vec::new();
    for _ in 0..rng.random_range(0..=3) {
        let t = rng.random_range(0..window_ms - 10_000);
        actions.push((t, Action::Snapshot(rng.random_range(0..n))));
    }
    let restores = match rng.random_range(0..10) {
        0..3 => 0,
        3..8 => 1,
        _ => 2,
    };
    for _ in 0..restores {
        let t = rng.random_range(5_000..window_ms - 10_000);
        let node = rng.random_range(0..n);
        actions.push((
            t,
            Action::Restore {
                node,
                down_ms: rng.random_range(50..=3_000),
                pick: rng.random_bool(0.5).then(|| rng.random_range(0..3)),
                fresh_from: rng.random_range(0..n),
                also: rng
                    .random_bool(0.35)
                    .then(|| (node + rng.random_range(1..n)) % n),
            },
        ));
    }
    actions
}

impl Sim {
    /// One memory-workload group: a batch of 1–24 ops, 30 % of them an idempotent event.
    pub fn memory_group(&mut self) -> (Vec<LocalWrite>, bool) {
        let len = match self.rng.random_range(0..100) {
            0..75 => 1,
            75..96 => self.rng.random_range(2..=3),
            _ => {
                self.counts.large_batches += 1;
                self.rng.random_range(4..=MAX_BATCH_OPS)
            }
        };
        let ops: Vec<(Key, Mutation)> = (0..len)
            .map(|_| memory_op(&mut self.rng, self.n_keys, &mut self.serial))
            .collect();
        self.counts.large_values += ops
            .iter()
            .filter(|(_, m)| matches!(m, Mutation::Set(v) if v.len() > 256))
            .count() as u64;
        // Some writes are idempotent events from one of many sources.
        let event = (self.rng.random_range(0..100) < 30).then(|| {
            let k = self.rng.random_range(0..self.n_sources);
            let seq = self.next_seq.entry(k).or_insert(0);
            *seq += self.rng.random_range(1..=3);
            EventId {
                stream: "sim".into(),
                source: format!("source-{k}"),
                seq: *seq,
            }
        });
        let invalid = ops.iter().any(|(k, m)| is_invalid(k, m));
        (vec![write_of(ops, event)], invalid)
    }

    /// One op of the recording workload.
    fn recording_op(&mut self) -> (Key, Mutation) {
        let key = key_of(self.rng.random_range(0..self.n_keys));
        self.serial += 1;
        let serial = self.serial;
        let rng = &mut self.rng;
        let m = match key.kind {
            KeyKind::GCounter => Mutation::Inc(rng.random_range(1..=5)),
            KeyKind::PNCounter => {
                if rng.random_bool(0.5) {
                    Mutation::Inc(rng.random_range(1..=5))
                } else {
                    Mutation::Dec(rng.random_range(1..=5))
                }
            }
            KeyKind::ORSet => {
                let e = format!("\"e{}\"", rng.random_range(0..4));
                match rng.random_range(0..100) {
                    0..55 => Mutation::Add(e),
                    55..90 => Mutation::Remove(e),
                    _ => Mutation::Delete,
                }
            }
            KeyKind::Lww | KeyKind::MvReg => {
                if rng.random_range(0..100) < 85 {
                    Mutation::Set(format!("\"v{serial}\""))
                } else {
                    Mutation::Delete
                }
            }
        };
        (key, m)
    }

    /// One recording-workload group: 1–3 callers' writes of 1–3 ops; rarely an invalid counter
    /// delete.
    pub fn recording_group(&mut self) -> (Vec<LocalWrite>, bool) {
        let callers = if self.rng.random_range(0..100) < 70 {
            1
        } else {
            self.rng.random_range(2..=3)
        };
        let mut invalid = false;
        let writes = (0..callers)
            .map(|_| {
                let len = if self.rng.random_range(0..100) < 75 {
                    1
                } else {
                    self.rng.random_range(2..=3)
                };
                let mut ops: Vec<(Key, Mutation)> = (0..len).map(|_| self.recording_op()).collect();
                if self.rng.random_range(0..100) == 0 {
                    // A counter delete is refused (nothing written); the group is not acknowledged.
                    ops.push((key_of(0), Mutation::Delete));
                    invalid = true;
                }
                write_of(ops, None)
            })
            .collect();
        (writes, invalid)
    }
}
