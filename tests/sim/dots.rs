//! No dot reuse: a cluster-wide map dot → op (key, mutation, running counter total) of every
//! dot an acknowledged commit (or an unacknowledged one a crash image kept) issued. A dot is
//! issued once; every dot in a message sent, in a reopened or restored store and in a final
//! store must be in the map with the same content (a dot from a lost commit that leaked out or
//! was reissued with other content shows up as a mismatch), and no dot of an op a restore lost
//! is ever seen again.

use super::harness::{Sim, entries};
use std::collections::BTreeMap;
use tidemark::proto::Message;
use tidemark_crdts::{CausalContext, Dot, Entry, Key, KeyKind, Mutation, ReplicaId};

/// What an issued dot stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub key: Key,
    pub mutation: Mutation,
    /// For counter ops: the issuer's running `(increments, decrements)` on the key up to and
    /// including this op (what a causal counter's dot holds).
    pub total: (u64, u64),
}

#[derive(Default)]
pub struct Dots {
    pub issued: BTreeMap<Dot, Issued>,
    pub issued_ctx: CausalContext,
    /// Running counter totals per (issuer, key).
    totals: BTreeMap<(ReplicaId, Key), (u64, u64)>,
    /// Dots of acknowledged ops a restore lost: never seen again anywhere.
    pub lost: CausalContext,
    /// Dots of acknowledged ops a wipe lost (no other node had them): they may be held nowhere.
    pub wiped: CausalContext,
}

impl Dots {
    /// Every issued dot no restore or wipe lost.
    pub fn surviving(&self) -> CausalContext {
        self.issued_ctx.diff(&self.lost).diff(&self.wiped)
    }
}

impl Sim {
    /// Records `dot` as issued for `(key, mutation)`; a dot is issued once, cluster-wide.
    pub fn issue(&mut self, dot: Dot, key: &Key, mutation: &Mutation) {
        let total = match (key.kind, mutation) {
            (KeyKind::GCounter | KeyKind::PNCounter, Mutation::Inc(by) | Mutation::Dec(by)) => {
                let t = self
                    .dots
                    .totals
                    .entry((dot.replica, key.clone()))
                    .or_default();
                match mutation {
                    Mutation::Inc(_) => t.0 = t.0.saturating_add(*by),
                    _ => t.1 = t.1.saturating_add(*by),
                }
                *t
            }
            _ => (0, 0),
        };
        let rec = Issued {
            key: key.clone(),
            mutation: mutation.clone(),
            total,
        };
        if let Some(old) = self.dots.issued.get(&dot) {
            panic!(
                "seed {}: dot {dot:?} issued twice ({} content): first {old:?}, again {rec:?}",
                self.seed,
                if *old == rec { "same" } else { "different" }
            );
        }
        self.dots.issued.insert(dot, rec);
        self.dots.issued_ctx.insert(dot);
    }

    /// Every dot of `ctx` was issued by an acknowledged (or kept) commit, and none was lost by
    /// a restore.
    pub fn check_ctx(&self, ctx: &CausalContext, what: &dyn Fn() -> String) {
        if !ctx.is_subset(&self.dots.issued_ctx) {
            let stray: Vec<Dot> = ctx
                .diff(&self.dots.issued_ctx)
                .iter_dots()
                .take(5)
                .collect();
            panic!(
                "seed {}: {}: holds dots no acknowledged or kept commit issued: {stray:?}",
                self.seed,
                what()
            );
        }
        if !self.dots.lost.is_empty() {
            let back = ctx.intersection(&self.dots.lost);
            if !back.is_empty() {
                let back: Vec<Dot> = back.iter_dots().take(5).collect();
                panic!(
                    "seed {}: {}: holds dots of ops a restore lost: {back:?}",
                    self.seed,
                    what()
                );
            }
        }
    }

    /// Every dot an entry holds stands for the op that issued it (same key, same element or
    /// value, the issuer's running counter total at that op).
    pub fn check_entry(&self, key: &Key, entry: &Entry, what: &dyn Fn() -> String) {
        let seed = self.seed;
        let op = |d: &Dot| -> &Issued {
            let rec = self.dots.issued.get(d).unwrap_or_else(|| {
                panic!(
                    "seed {seed}: {}: {key} holds {d:?}, which no acknowledged commit issued",
                    what()
                )
            });
            assert_eq!(
                &rec.key,
                key,
                "seed {seed}: {}: {d:?} was issued for another key ({rec:?})",
                what()
            );
            rec
        };
        let mismatch = |d: &Dot, rec: &Issued, held: String| -> ! {
            panic!(
                "seed {seed}: {}: {key} holds {d:?} as {held}, but it was issued for {rec:?}",
                what()
            )
        };
        match entry {
            Entry::GCounter(f) => {
                for (d, total) in f.iter() {
                    let rec = op(d);
                    if !matches!(rec.mutation, Mutation::Inc(_)) || rec.total != (*total, 0) {
                        mismatch(d, rec, format!("total {total}"));
                    }
                }
            }
            Entry::PNCounter(f) => {
                for (d, total) in f.iter() {
                    let rec = op(d);
                    if !matches!(rec.mutation, Mutation::Inc(_) | Mutation::Dec(_))
                        || rec.total != *total
                    {
                        mismatch(d, rec, format!("totals {total:?}"));
                    }
                }
            }
            Entry::ORSet(m) => {
                for (elem, dots) in m.iter() {
                    for d in dots.iter() {
                        let rec = op(d);
                        if rec.mutation != Mutation::Add(elem.clone()) {
                            mismatch(d, rec, format!("add {elem}"));
                        }
                    }
                }
            }
            Entry::Lww(f) => {
                for (d, (_, v)) in f.iter() {
                    let rec = op(d);
                    if rec.mutation != Mutation::Set(v.clone()) {
                        mismatch(d, rec, format!("set {v}"));
                    }
                }
            }
            Entry::MvReg(f) => {
                for (d, v) in f.iter() {
                    let rec = op(d);
                    if rec.mutation != Mutation::Set(v.clone()) {
                        mismatch(d, rec, format!("set {v}"));
                    }
                }
            }
        }
    }

    /// A message carries only dots of acknowledged (or kept) commits, with their content.
    pub fn check_message(&self, from: usize, msg: &Message) {
        let what = || format!("message {} from node {from}", msg.kind());
        match msg {
            Message::Delta { delta, .. } => {
                self.check_ctx(delta.context(), &what);
                for (k, e) in delta.state.store.iter() {
                    self.check_entry(k, e, &what);
                }
            }
            Message::Chunk { chunk, .. } => {
                self.check_ctx(&chunk.ctx, &what);
                for (k, e) in &chunk.entries {
                    self.check_entry(k, e, &what);
                }
            }
            Message::Have { ctx, .. } => self.check_ctx(ctx, &what),
            _ => {}
        }
    }

    /// Node `i`'s store holds only issued dots, with their content.
    pub fn check_store(&self, i: usize, what: &str) {
        let store = &self.nodes[i].store;
        let what = || what.to_owned();
        self.check_ctx(store.ctx(), &what);
        for (k, e) in entries(store) {
            self.check_entry(&k, &e, &what);
        }
    }
}
