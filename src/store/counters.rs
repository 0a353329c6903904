//! Counter range checks of a commit group: the lattice saturates a counter at its range and
//! would drop the excess silently, so a caller's batch whose increments would take a counter out
//! of range is refused whole. Checked by the writer against the group's rows as they stand when
//! the batch's turn comes (committed state plus the earlier batches of the group), so two
//! batches queued at once cannot both pass and overflow together.

use super::error::StoreError;
use std::collections::HashMap;
use tidemark_crdts::{Entry, Key, KeyKind, Mutation, ReplicaId, Value};

/// A batch refused because an op would take a counter out of its value range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overflow {
    /// Position, in its batch, of the write holding the op.
    pub index: usize,
    /// The counter.
    pub key: String,
    /// Its value before the batch.
    pub value: i128,
    /// `+` or `-`.
    pub sign: char,
    /// The total amount the batch adds or subtracts through this op.
    pub by: u128,
}

/// A counter's value and this replica's own increment and decrement totals (a pncounter
/// stores them as saturating u64s, so they must not overflow either).
pub(crate) fn counter_state(entry: Option<&Entry>, me: ReplicaId) -> (i128, i128, i128) {
    let value = entry.map_or(0, |e| match e.value() {
        Value::GCounter(n) => i128::from(n),
        Value::PNCounter(n) => i128::from(n),
        _ => 0,
    });
    let (own_inc, own_dec) = match entry {
        Some(Entry::PNCounter(f)) => f
            .iter()
            .filter(|(d, _)| d.replica == me)
            .max_by_key(|(d, _)| d.seq)
            .map_or((0, 0), |(_, (p, n))| (i128::from(*p), i128::from(*n))),
        _ => (0, 0),
    };
    (value, own_inc, own_dec)
}

/// The first op of `batch` (the ops of each of its writes, in order) whose increment (with the
/// batch's earlier ops on the same counter) would take its counter out of range; `state` gives
/// a counter's [`counter_state`] before the batch.
pub(crate) fn first_overflow<'a>(
    batch: impl IntoIterator<Item = &'a [(Key, Mutation)]>,
    mut state: impl FnMut(&Key) -> Result<(i128, i128, i128), StoreError>,
) -> Result<Option<Overflow>, StoreError> {
    struct Running {
        base: i128,
        total: i128,
        own_inc: i128,
        own_dec: i128,
    }
    // foldhash, seeded per process (as the group's other maps): std's SipHash cost a batch of
    // counter increments about 5 % of the writer's time.
    let batch = batch.into_iter();
    // Sized for the batch's writes up front (one op each, commonly): growing the table was
    // ≈ 3 % of the writer's time in batched counter increments.
    let mut totals: HashMap<&Key, Running, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(batch.size_hint().0, Default::default());
    let sides = i128::from(u64::MAX);
    for (index, ops) in batch.enumerate() {
        for (key, m) in ops {
            let (inc, dec) = match (key.kind, m) {
                (KeyKind::GCounter | KeyKind::PNCounter, Mutation::Inc(n)) => (i128::from(*n), 0),
                (KeyKind::PNCounter, Mutation::Dec(n)) => (0, i128::from(*n)),
                _ => continue,
            };
            let run = match totals.entry(key) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let (base, own_inc, own_dec) = state(key)?;
                    v.insert(Running {
                        base,
                        total: base,
                        own_inc,
                        own_dec,
                    })
                }
            };
            run.total += inc - dec;
            run.own_inc += inc;
            run.own_dec += dec;
            let (lo, hi) = if key.kind == KeyKind::GCounter {
                (0, i128::from(u64::MAX))
            } else {
                (i128::from(i64::MIN), i128::from(i64::MAX))
            };
            if !(lo..=hi).contains(&run.total) {
                return Ok(Some(Overflow {
                    index,
                    key: key.to_string(),
                    value: run.base,
                    sign: if run.total > run.base { '+' } else { '-' },
                    by: (run.total - run.base).unsigned_abs(),
                }));
            }
            if run.own_inc > sides || run.own_dec > sides {
                // In range, but this replica's own increments (or decrements) would pass
                // u64::MAX, where they saturate and the value goes wrong.
                return Ok(Some(Overflow {
                    index,
                    key: key.to_string(),
                    value: run.base,
                    sign: if dec > 0 { '-' } else { '+' },
                    by: (inc + dec).unsigned_abs(),
                }));
            }
        }
    }
    Ok(None)
}
