//! The `(source, seq)` pairs of ingest batches queued and not yet committed, per
//! `(stream, source)`: an event whose pair an earlier queued batch carries (or an earlier event
//! of its own batch) may turn out a duplicate when it commits, so it moves no watermark
//! ([`super::Views::admit`]).
//!
//! Each queued batch keeps its seqs of a source as one sorted run, registered and released
//! whole: registering costs a sort of the batch's seqs (already in order in the common case)
//! and a binary search per seq in each other run of the same source still queued (none when
//! batches of a source are ingested one after the other), releasing costs one removal — no
//! map entry is made or removed per event.

use std::collections::HashMap;

/// A fast, per-process seeded hash map.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The queued runs of one `(stream, source)`: (id, the batch's seqs of the source, sorted).
type Runs = Vec<(u64, Vec<u64>)>;

/// The queued runs, per `(stream, source)`.
#[derive(Debug, Default)]
pub(crate) struct Queued {
    /// The id of the next run.
    next: u64,
    /// `(stream, source)` → the queued runs: (id, the batch's seqs of the source, sorted).
    runs: FastMap<(String, String), Runs>,
}

impl Queued {
    /// Registers one batch's seqs of the source `key` (`seqs`, in batch order) and says, per
    /// seq, whether another queued run of `key` carries it or an earlier seq of `seqs` equals
    /// it. Returns the run's id, for [`Queued::release`].
    pub(crate) fn register(&mut self, key: (String, String), seqs: &[u64]) -> (Vec<bool>, u64) {
        let mut out = vec![false; seqs.len()];
        let runs = self.runs.entry(key).or_default();
        // Repeats within the batch: of equal seqs, every one but the first (in batch order).
        let mut order: Vec<(u64, usize)> = seqs.iter().copied().zip(0..).collect();
        order.sort_unstable();
        for w in order.windows(2) {
            if w[0].0 == w[1].0
                && let Some(o) = out.get_mut(w[1].1)
            {
                *o = true;
            }
        }
        if !runs.is_empty() {
            for (s, o) in seqs.iter().zip(out.iter_mut()) {
                if !*o && runs.iter().any(|(_, run)| run.binary_search(s).is_ok()) {
                    *o = true;
                }
            }
        }
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        runs.push((id, order.into_iter().map(|(s, _)| s).collect()));
        (out, id)
    }

    /// Forgets the run `id` of `key` (its batch committed or failed).
    pub(crate) fn release(&mut self, key: &(String, String), id: u64) {
        if let Some(runs) = self.runs.get_mut(key) {
            runs.retain(|(i, _)| *i != id);
            if runs.is_empty() {
                self.runs.remove(key);
            }
        }
    }

    /// Number of `(stream, source)` pairs with a queued run.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Queued;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashMap};

    /// The rule as it was kept before runs: a count per `(key, seq)` over queued batches,
    /// registered and released one seq at a time.
    #[derive(Default)]
    struct Model(HashMap<(String, String), BTreeMap<u64, usize>>);

    impl Model {
        fn register(&mut self, key: &(String, String), seqs: &[u64]) -> Vec<bool> {
            let m = self.0.entry(key.clone()).or_default();
            seqs.iter()
                .map(|s| {
                    let c = m.entry(*s).or_default();
                    let seen = *c > 0;
                    *c += 1;
                    seen
                })
                .collect()
        }

        fn release(&mut self, key: &(String, String), seqs: &[u64]) {
            if let Some(m) = self.0.get_mut(key) {
                for s in seqs {
                    if let Some(c) = m.get_mut(s) {
                        *c = c.saturating_sub(1);
                        if *c == 0 {
                            m.remove(s);
                        }
                    }
                }
                if m.is_empty() {
                    self.0.remove(key);
                }
            }
        }
    }

    proptest! {
        /// Interleaved registrations and releases of batches of random (often repeated,
        /// overlapping) seqs over two sources give exactly the per-seq counting rule's answers.
        #[test]
        fn runs_answer_as_per_seq_counts(
            steps in proptest::collection::vec(
                (any::<bool>(), 0u8..2, proptest::collection::vec(0u64..24, 0..12), any::<u8>()),
                1..40,
            )
        ) {
            let mut q = Queued::default();
            let mut model = Model::default();
            let mut live: Vec<((String, String), Vec<u64>, u64)> = Vec::new();
            for (release, src, seqs, pick) in steps {
                if release && !live.is_empty() {
                    let (key, seqs, id) = live.remove(pick as usize % live.len());
                    q.release(&key, id);
                    model.release(&key, &seqs);
                } else {
                    let key = ("s".to_owned(), format!("src{src}"));
                    let (got, id) = q.register(key.clone(), &seqs);
                    let want = model.register(&key, &seqs);
                    prop_assert_eq!(got, want);
                    live.push((key, seqs, id));
                }
            }
            for (key, seqs, id) in live {
                q.release(&key, id);
                model.release(&key, &seqs);
            }
            prop_assert_eq!(q.len(), 0);
            prop_assert!(model.0.is_empty());
        }
    }
}
