//! Sequential-specification oracle over acknowledged operations.
//!
//! Happens-before is taken from what the harness delivered, never from the replicas' own
//! contexts: `o1 → o2` iff `o1`'s effect had been delivered to `o2`'s node when it issued `o2`
//! (the harness tracks, per node, the ops whose effects reached it: its own, and those a
//! message carried whose sender had them). So a context that claims a dot whose effect never
//! arrived is not believed: the op counts as unseen (and lost, if no node received it). An op
//! is *dominated* when a later op on the same key that retires it (a remove/add of the same
//! element, a delete, a register write, a later increment of the same replica) saw it.

use std::collections::{BTreeMap, BTreeSet};
use tidemark::model::Delta;
use tidemark_crdts::{
    CausalContext, Dot, Entry, Key, KeyKind, Mutation, ReplicaId, Timestamp, Value,
};

/// One acknowledged operation.
#[derive(Clone, Debug)]
pub struct OpRec {
    pub key: Key,
    pub mutation: Mutation,
    pub dot: Dot,
    /// The issuing replica's context just before the op (earlier ops of its batch included).
    pub seen: CausalContext,
    /// The LWW timestamp of a `Set` on an lww key.
    pub ts: Option<Timestamp>,
    /// Lost by a wipe before any other store saw it (the one allowed loss).
    pub lost: bool,
    /// Dots of `seen` whose retirement by this op was lost (a restore dropped the only store
    /// holding that part of the op's commit): the op counts as concurrent with them.
    pub unseen: BTreeSet<Dot>,
}

impl OpRec {
    /// The op saw `dot` (and its retirement of it, if any, took effect).
    pub fn saw(&self, dot: &Dot) -> bool {
        self.seen.contains(dot) && !self.unseen.contains(dot)
    }
}

#[derive(Default)]
pub struct Oracle {
    pub ops: Vec<OpRec>,
    by_dot: BTreeMap<Dot, usize>,
    /// `retirers[i]`: the ops that retire op `i` and saw it.
    retirers: Vec<Vec<usize>>,
    /// Ops by key.
    by_key: BTreeMap<Key, Vec<usize>>,
}

/// `retires(o, a)`: `o`, a later op on `a`'s key, removes or overwrites `a`'s effect.
fn retires(o: &OpRec, a: &OpRec) -> bool {
    o.key == a.key
        && o.dot != a.dot
        && match (a.key.kind, &a.mutation, &o.mutation) {
            (KeyKind::GCounter | KeyKind::PNCounter, _, Mutation::Inc(_) | Mutation::Dec(_)) => {
                o.dot.replica == a.dot.replica && o.dot.seq > a.dot.seq
            }
            (KeyKind::ORSet, Mutation::Add(x), Mutation::Add(y) | Mutation::Remove(y)) => x == y,
            (KeyKind::ORSet, Mutation::Add(_), Mutation::Delete) => true,
            (
                KeyKind::MvReg | KeyKind::Lww,
                Mutation::Set(_),
                Mutation::Set(_) | Mutation::Delete,
            ) => true,
            _ => false,
        }
}

impl Oracle {
    /// Records an acknowledged batch and checks dot uniqueness (G7.1): every dot is fresh
    /// cluster-wide and the batch took the contiguous range after the issuer's last own dot.
    /// `delivered` is what the harness delivered to the issuing node (its happens-before).
    pub fn record_batch(
        &mut self,
        replica: ReplicaId,
        before: &CausalContext,
        delivered: &CausalContext,
        ops: &[(Key, Mutation)],
        delta: &Delta,
    ) {
        let base = before.max_seq(replica);
        assert_eq!(
            delta.context().max_seq(replica),
            base + ops.len() as u64,
            "a batch must take the next contiguous dots"
        );
        let mut seen = delivered.clone();
        for (i, (key, mutation)) in ops.iter().enumerate() {
            let dot = Dot::new(replica, base + 1 + i as u64);
            assert!(!before.contains(&dot), "dot {dot:?} issued twice");
            assert!(
                self.by_dot.insert(dot, self.ops.len()).is_none(),
                "dot {dot:?} issued twice cluster-wide"
            );
            let ts = match (key.kind, mutation) {
                (KeyKind::Lww, Mutation::Set(_)) => match delta.state.store.get(key) {
                    Some(Entry::Lww(f)) => f.get(&dot).map(|(t, _)| *t),
                    _ => None,
                },
                _ => None,
            };
            let rec = OpRec {
                key: key.clone(),
                mutation: mutation.clone(),
                dot,
                seen: seen.clone(),
                ts,
                lost: false,
                unseen: BTreeSet::new(),
            };
            let idx = self.ops.len();
            let same_key = self.by_key.entry(key.clone()).or_default();
            for &a in same_key.iter() {
                if rec.seen.contains(&self.ops[a].dot) && retires(&rec, &self.ops[a]) {
                    self.retirers[a].push(idx);
                }
            }
            same_key.push(idx);
            self.ops.push(rec);
            self.retirers.push(Vec::new());
            seen.insert(dot);
        }
    }

    /// True when the op with this dot was lost (or never acknowledged).
    pub fn is_lost(&self, dot: &Dot) -> bool {
        self.by_dot.get(dot).is_none_or(|i| self.ops[*i].lost)
    }

    /// "No effect is visible whose dot is in no context": every op whose effect reached a node
    /// (`delivered`) and that is no longer live there (`live`) must have been retired by an op
    /// that some node still durably holds (`contexts`). Returns the first op breaking it.
    pub fn unwitnessed_retirement<'a>(
        &self,
        delivered: &CausalContext,
        live: &CausalContext,
        contexts: impl Iterator<Item = &'a CausalContext> + Clone,
    ) -> Option<&OpRec> {
        delivered.iter_dots().find_map(|d| {
            let &i = self.by_dot.get(&d)?;
            let op = &self.ops[i];
            let presence = matches!(
                op.mutation,
                Mutation::Add(_) | Mutation::Set(_) | Mutation::Inc(_) | Mutation::Dec(_)
            );
            if !presence || live.contains(&d) {
                return None;
            }
            let witnessed = self.retirers[i]
                .iter()
                .any(|&w| contexts.clone().any(|c| c.contains(&self.ops[w].dot)));
            (!witnessed).then_some(op)
        })
    }

    /// Marks as lost every op of `replica` that was delivered to no node in `others`.
    pub fn mark_lost<'a>(
        &mut self,
        replica: ReplicaId,
        others: impl Iterator<Item = &'a CausalContext> + Clone,
    ) -> u64 {
        let mut n = 0;
        for op in self
            .ops
            .iter_mut()
            .filter(|o| o.dot.replica == replica && !o.lost)
        {
            if !others.clone().any(|c| c.contains(&op.dot)) {
                op.lost = true;
                n += 1;
            }
        }
        n
    }

    /// Marks as lost every op whose dot does not `survive` (a restore: no remaining store and
    /// not the restored snapshot holds it); returns the dots newly lost.
    pub fn mark_lost_unless(&mut self, survives: impl Fn(&Dot) -> bool) -> Vec<Dot> {
        let mut lost = Vec::new();
        for op in self.ops.iter_mut().filter(|o| !o.lost) {
            if !survives(&op.dot) {
                op.lost = true;
                lost.push(op.dot);
            }
        }
        lost
    }

    /// After a restore: a surviving add/set `a` that no remaining state retired (`retired`:
    /// some store holds its dot in its context but not in its entries) is live in the join of
    /// what remains, so every surviving op that retired it lost that retirement (the part of
    /// its commit carrying the removal was held only by the restored node; the op's own dot
    /// survived in an earlier part). Those ops no longer count as having seen `a`. Returns the
    /// retirements forgotten. Counters are exempt: a counter dot's removals travel with it.
    pub fn forget_lost_retirements(&mut self, retired: impl Fn(&Dot) -> bool) -> u64 {
        let mut n = 0;
        for a in 0..self.ops.len() {
            let op = &self.ops[a];
            if op.lost
                || !matches!(op.mutation, Mutation::Add(_) | Mutation::Set(_))
                || retired(&op.dot)
            {
                continue;
            }
            let dot = op.dot;
            for w in self.retirers[a].clone() {
                let w = &mut self.ops[w];
                if !w.lost && w.saw(&dot) {
                    w.unseen.insert(dot);
                    n += 1;
                }
            }
        }
        n
    }

    /// Every key any op touched.
    pub fn keys(&self) -> BTreeSet<Key> {
        self.ops.iter().map(|o| o.key.clone()).collect()
    }

    /// The counter ops of `key` whose increments survive. A causal counter's dot carries its
    /// replica's running total, so an op survives iff it or a later op of the same replica on
    /// the key survived: a lost op's increment lives on in a surviving later total (e.g. a
    /// peer holds the later dot from a transfer's entries but never saw the earlier dot).
    fn counter_ops<'a>(&'a self, key: &'a Key) -> impl Iterator<Item = &'a OpRec> + 'a {
        let mut top: BTreeMap<ReplicaId, u64> = BTreeMap::new();
        for o in self.ops.iter().filter(|o| !o.lost && &o.key == key) {
            let t = top.entry(o.dot.replica).or_default();
            *t = (*t).max(o.dot.seq);
        }
        self.ops.iter().filter(move |o| {
            &o.key == key && top.get(&o.dot.replica).is_some_and(|t| o.dot.seq <= *t)
        })
    }

    /// The expected value of `key` over the surviving acknowledged ops.
    pub fn expected(&self, key: &Key) -> Value {
        let ops: Vec<&OpRec> = self
            .ops
            .iter()
            .filter(|o| !o.lost && &o.key == key)
            .collect();
        // `retires(o, a)`: o is a later op on the key that removes/overwrites a's effect.
        let dominated = |a: &OpRec, retires: &dyn Fn(&OpRec) -> bool| {
            ops.iter()
                .any(|o| o.dot != a.dot && retires(o) && o.saw(&a.dot))
        };
        match key.kind {
            KeyKind::GCounter => {
                Value::GCounter(self.counter_ops(key).fold(0u64, |s, o| match o.mutation {
                    Mutation::Inc(by) => s.saturating_add(by),
                    _ => s,
                }))
            }
            KeyKind::PNCounter => {
                let v = self.counter_ops(key).fold(0i128, |s, o| match o.mutation {
                    Mutation::Inc(by) => s + i128::from(by),
                    Mutation::Dec(by) => s - i128::from(by),
                    _ => s,
                });
                Value::PNCounter(i64::try_from(v).unwrap_or(if v < 0 {
                    i64::MIN
                } else {
                    i64::MAX
                }))
            }
            KeyKind::ORSet => {
                let mut present = BTreeSet::new();
                for a in &ops {
                    let Mutation::Add(x) = &a.mutation else {
                        continue;
                    };
                    let retires = |o: &OpRec| match &o.mutation {
                        Mutation::Add(y) | Mutation::Remove(y) => y == x,
                        Mutation::Delete => true,
                        _ => false,
                    };
                    if !dominated(a, &retires) {
                        present.insert(x.clone());
                    }
                }
                Value::ORSet(present.into_iter().collect())
            }
            KeyKind::MvReg | KeyKind::Lww => {
                let retires = |o: &OpRec| matches!(o.mutation, Mutation::Set(_) | Mutation::Delete);
                let survivors: Vec<&&OpRec> = ops
                    .iter()
                    .filter(|a| matches!(a.mutation, Mutation::Set(_)) && !dominated(a, &retires))
                    .collect();
                let value = |o: &OpRec| match &o.mutation {
                    Mutation::Set(v) => v.clone(),
                    _ => String::new(),
                };
                if key.kind == KeyKind::MvReg {
                    let mut vs: Vec<String> = survivors.iter().map(|o| value(o)).collect();
                    vs.sort();
                    vs.dedup();
                    Value::MvReg(vs)
                } else {
                    Value::Lww(
                        survivors
                            .iter()
                            .map(|o| (o.ts.expect("surviving lww write has a timestamp"), value(o)))
                            .max()
                            .map(|(_, v)| v),
                    )
                }
            }
        }
    }
}
