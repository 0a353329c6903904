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
    /// The ops the event writes add back, event after event (one list for the batch, not
    /// one per event): each as its key's index in `cells`, the mutation and its event stamp
    /// (see [`LocalWrite::stamps`]).
    pub ops: Vec<(u32, Mutation, Option<Timestamp>)>,
    /// Per event write (the first writes of the batch, in order): the end of its ops in `ops`
    /// (its ops start where the previous event's end).
    pub ends: Vec<usize>,
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
        let mut start = 0;
        let mut ops = self.ops.into_iter();
        for (w, &end) in writes.iter_mut().zip(&self.ends) {
            let n = end.saturating_sub(start);
            start = start.max(end);
            let ops: Vec<_> = ops.by_ref().take(n).collect();
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

#[cfg(test)]
mod tests {
    use super::BatchFallback;
    use crate::store::LocalWrite;
    use crate::views::keys;
    use tidemark_crdts::{Key, KeyKind, Mutation};

    /// Events with no op, one op and several, one of them stamped: each event write gets back
    /// exactly its own ops, in order, with stamps lined up; the merged write is emptied.
    #[test]
    fn each_event_gets_its_own_ops_back() {
        let cells = vec![
            Key::new(KeyKind::GCounter, "~view/c/d/1/[]"),
            Key::new(KeyKind::ORSet, "~view/u/d/1/[]"),
            Key::new(KeyKind::Lww, "~view/l/d/1/[]"),
        ];
        let st = Some(keys::stamp(7, "src", 7));
        let set = Mutation::Set("x".into());
        let mut writes = vec![LocalWrite::default(); 4];
        writes[3].ops = vec![(cells[0].clone(), Mutation::Inc(3))];
        let fallback = BatchFallback {
            merged: 3,
            cells: cells.clone(),
            ops: vec![
                (0, Mutation::Inc(1), None),
                (0, Mutation::Inc(1), None),
                (1, Mutation::Add("\"a\"".into()), None),
                (2, set.clone(), st),
                (0, Mutation::Inc(1), None),
            ],
            ends: vec![1, 1, 5],
        };
        fallback.apply(&mut writes);
        assert_eq!(writes[0].ops, vec![(cells[0].clone(), Mutation::Inc(1))]);
        assert!(writes[0].stamps.is_empty());
        assert!(writes[1].ops.is_empty());
        assert_eq!(
            writes[2].ops,
            vec![
                (cells[0].clone(), Mutation::Inc(1)),
                (cells[1].clone(), Mutation::Add("\"a\"".into())),
                (cells[2].clone(), set),
                (cells[0].clone(), Mutation::Inc(1)),
            ]
        );
        assert_eq!(writes[2].stamps, vec![None, None, st, None]);
        assert!(writes[3].ops.is_empty() && writes[3].stamps.is_empty());
    }
}
