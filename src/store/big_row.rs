//! A row too large for one state-transfer chunk, sent in parts by runs of its dots
//! (ARCHITECTURE.md, "size invariants"). The row is read, its dots sorted and, for a set, each
//! dot's element noted ONCE per transfer ([`BigRow`], kept by the store between the reads of one
//! transfer); each part is then built from its run of dots alone. Reading and restricting the
//! whole row for every part made a transfer of a large set cost O(set² / chunk).

use super::error::StoreError;
use crate::codec;
use crate::proto::{ChunkRead, RowPart};
use std::collections::BTreeMap;
use tidemark_crdts::{CausalContext, Dot, DotMap, DotSet, DotStore, Entry, Key};

/// A large row prepared for sending in parts.
pub(crate) struct BigRow {
    key: Key,
    entry: Entry,
    /// Every dot of the row, ascending, with the index of its element in `elems` (a set) or 0.
    dots: Vec<(Dot, u32)>,
    /// A set's element names (indexed by `dots`); empty for other kinds.
    elems: Vec<String>,
    /// The row's dots as a context (the generic restriction needs it).
    all: CausalContext,
    /// Encoded size of the whole row.
    size: usize,
}

impl BigRow {
    /// Prepares `entry`, the row of `key`, for sending in parts.
    ///
    /// # Errors
    /// The row cannot be measured (a codec failure).
    pub(crate) fn new(key: Key, entry: Entry) -> Result<Self, StoreError> {
        let size = codec::encoded_len("state row", &entry).map_err(|source| StoreError::Codec {
            table: "rows",
            source,
        })?;
        let mut dots = Vec::new();
        let mut elems = Vec::new();
        if let Entry::ORSet(map) = &entry {
            for (name, set) in map.iter() {
                let i = u32::try_from(elems.len())
                    .map_err(|_| StoreError::Corrupt(format!("{key}: too many elements")))?;
                elems.push(name.clone());
                dots.extend(set.iter().map(|d| (*d, i)));
            }
        } else {
            entry.for_each_dot(&mut |d| dots.push((d, 0)));
        }
        dots.sort_unstable_by_key(|(d, _)| *d);
        let all = entry.dots();
        Ok(Self {
            key,
            entry,
            dots,
            elems,
            all,
            size,
        })
    }

    /// The row's key.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// The part of the row holding exactly the dots of `run` (what
    /// `split::restrict(entry, all, run)` gives, built from the run alone for a set).
    fn part(&self, run: &[(Dot, u32)]) -> Entry {
        if let Entry::ORSet(_) = &self.entry {
            let mut by_elem: BTreeMap<u32, Vec<Dot>> = BTreeMap::new();
            for (d, i) in run {
                by_elem.entry(*i).or_default().push(*d);
            }
            // Element indices follow the set's (sorted) element order.
            let mut map: DotMap<String, DotSet> = DotMap::default();
            for (i, dots) in by_elem {
                if let Some(name) = self.elems.get(i as usize) {
                    map.set(name.clone(), DotSet::from_dots(dots));
                }
            }
            return Entry::ORSet(map);
        }
        let keep: Vec<Dot> = run.iter().map(|(d, _)| *d).collect();
        super::split::restrict(&self.entry, &self.all, &keep)
    }

    /// The next part after dot `from` (`None`: from the start): the row's dots in the following
    /// run of dot space, within about `bytes_max / 2` encoded bytes. The last part's slice is
    /// open above, so the parts cover all dot space for the key whatever the row became between
    /// reads; after it the transfer continues with the keys after the row. Returns the read and
    /// whether this was the row's last part.
    ///
    /// # Errors
    /// A part cannot be measured (a codec failure).
    pub(crate) fn next_part(
        &self,
        from: Option<Dot>,
        bytes_max: usize,
    ) -> Result<(ChunkRead, bool), StoreError> {
        let start = self
            .dots
            .partition_point(|(d, _)| from.is_some_and(|f| *d <= f));
        let rest = &self.dots[start..];
        let total = self.dots.len().max(1);
        // A first guess from the mean bytes per dot, halved until the part fits.
        let budget = (bytes_max / 2).max(1);
        let mut take =
            (total.saturating_mul(budget) / self.size.max(1)).clamp(1, rest.len().max(1));
        let part = loop {
            let part = self.part(&rest[..take.min(rest.len())]);
            let len =
                codec::encoded_len("state row", &part).map_err(|source| StoreError::Codec {
                    table: "rows",
                    source,
                })?;
            if len <= budget || take <= 1 {
                break part;
            }
            take /= 2;
        };
        let finished = take >= rest.len();
        let upto = if finished {
            None
        } else {
            rest.get(take.saturating_sub(1)).map(|(d, _)| *d)
        };
        let entries = if part.is_bottom() {
            Vec::new()
        } else {
            vec![(self.key.clone(), part)]
        };
        let read = ChunkRead {
            entries,
            last_key: Some(self.key.clone()),
            // Never done after a part: one more read covers the keys after the row.
            done: false,
            part: Some(RowPart {
                key: self.key.clone(),
                slice: crate::model::DotSlice { after: from, upto },
            }),
        };
        Ok((read, finished))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_rng::Rng;
    use tidemark_crdts::{KeyKind, ReplicaId};

    /// A set of `n` elements, each with 1–3 dots of 3 replicas (dots unique).
    fn set(rng: &mut Rng, n: usize) -> Entry {
        let mut next = [0u64; 3];
        let mut map: DotMap<String, DotSet> = DotMap::default();
        let mut names: Vec<String> = (0..n).map(|i| format!("\"e{i:05}\"")).collect();
        names.sort();
        for name in names {
            let k = 1 + rng.below(3) as usize;
            let dots = (0..k)
                .map(|_| {
                    let r = rng.below(3) as usize;
                    next[r] += 1 + rng.below(4);
                    Dot::new(ReplicaId(r as u128 + 1), next[r])
                })
                .collect();
            map.set(name, DotSet::from_dots(dots));
        }
        Entry::ORSet(map)
    }

    /// Parts built from their run of dots equal the generic restriction, and the parts of a
    /// whole row, read one after the other, hold every dot exactly once and join back into the
    /// row.
    #[test]
    fn parts_of_a_large_set_are_its_restrictions_and_cover_it_exactly() {
        let seed = std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0xB16_B0A7_u64);
        println!("big_row: seed = {seed} (replay with SEED={seed})");
        let mut rng = Rng(seed);
        for _ in 0..20 {
            let n = 1 + rng.below(400) as usize;
            let entry = set(&mut rng, n);
            let big = BigRow::new(Key::new(KeyKind::ORSet, "s"), entry.clone()).expect("prepare");
            for _ in 0..10 {
                let a = rng.below(big.dots.len() as u64) as usize;
                let b = a + rng.below((big.dots.len() - a) as u64 + 1) as usize;
                let run = &big.dots[a..b];
                let keep: Vec<Dot> = run.iter().map(|(d, _)| *d).collect();
                assert_eq!(
                    big.part(run),
                    super::super::split::restrict(&entry, &big.all, &keep),
                    "seed {seed}"
                );
            }
            let budget = 64 + rng.below(4096) as usize;
            let (mut from, mut seen, mut parts) = (None, Vec::new(), 0);
            loop {
                let (read, finished) = big.next_part(from, budget).expect("part");
                parts += 1;
                let slice = read.part.expect("a part").slice;
                assert_eq!(slice.after, from);
                for (_, e) in &read.entries {
                    e.for_each_dot(&mut |d| {
                        assert!(slice.contains(&d), "a dot outside its part's slice");
                        seen.push(d);
                    });
                }
                if finished {
                    assert_eq!(slice.upto, None, "the last part is open above");
                    break;
                }
                from = slice.upto;
                assert!(parts <= big.dots.len(), "progress, seed {seed}");
            }
            seen.sort_unstable();
            let all: Vec<Dot> = big.dots.iter().map(|(d, _)| *d).collect();
            assert_eq!(seen, all, "every dot exactly once, seed {seed}");
        }
    }
}
