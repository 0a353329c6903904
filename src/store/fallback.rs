//! A batch's way back from a coalesced write to per-event writes.
//!
//! A caller may merge the ops of a batch of events into one extra write (one op per cell)
//! when it expects every event to be applied. Whether an event is a duplicate is decided only
//! by the writer at commit: a peer's delta joined meanwhile can make some of them duplicates.
//! The writer then uses the batch's [`BatchFallback`]: every event write gets its own ops back
//! and the merged write is emptied, so the state changes by exactly the events applied.

use super::LocalWrite;
use tidemark_crdts::{Key, Mutation, Timestamp};

/// The per-event ops of a batch whose write `merged` holds them coalesced.
#[derive(Debug)]
pub struct BatchFallback {
    /// Index of the merged write in the batch.
    pub merged: usize,
    /// The keys the per-event ops name by index (each key held once, copied into an op only
    /// when the fallback is applied).
    pub cells: Vec<Key>,
    /// Per event write (the first writes of the batch, in order): the ops it adds back, each
    /// as its key's index in `cells`, the mutation and its event stamp (see
    /// [`LocalWrite::stamps`]).
    pub per_event: Vec<Vec<(u32, Mutation, Option<Timestamp>)>>,
}

impl BatchFallback {
    /// Un-coalesces `writes` (the batch this fallback was made for): the merged write is
    /// emptied and each event write gets its own ops (and their stamps) appended.
    pub fn apply(self, writes: &mut [LocalWrite]) {
        if let Some(w) = writes.get_mut(self.merged) {
            w.ops.clear();
            w.stamps.clear();
        }
        let cells = self.cells;
        for (w, ops) in writes.iter_mut().zip(self.per_event) {
            let stamped = ops.iter().any(|(_, _, s)| s.is_some());
            if stamped || !w.stamps.is_empty() {
                w.stamps.resize(w.ops.len(), None);
            }
            for (c, m, s) in ops {
                let Some(k) = cells.get(c as usize) else {
                    continue;
                };
                w.ops.push((k.clone(), m));
                if stamped || !w.stamps.is_empty() {
                    w.stamps.push(s);
                }
            }
        }
    }
}
