//! Stream views (DESIGN.md A7, issue 9): events of a named stream folded into materialized,
//! replicated views — grouped, optionally windowed by event time — with per-stream
//! watermarks, allowed lateness, and windows that are reported `final` only when their value
//! can no longer change.
//!
//! How it fits the store: every view cell is an ordinary CRDT key (see [`keys`]), so views
//! replicate, converge and persist like all other state. An event's view mutations are added
//! to the event's own commit-group write, so they commit in the same durable transaction as
//! its dedup mark: a retried event changes no view twice and a crash never leaves a view
//! half-updated. Each node announces its per-stream watermark as a replicated LWW key written
//! in the same transaction as the events that moved it.
//!
//! **Finality.** Write `deadline(w) = end(w) + lateness`. A node applies an event to `w` only
//! while its in-memory watermark `≤ deadline(w)`; the in-memory watermark is monotone and never
//! below the watermark it announced (it is restored from the announcement at open). A node `Y`
//! reports `w` final when, for every member `X` — every replica whose dots are in `Y`'s context,
//! every peer connected since open, every replica that announced (each must have announced) —
//! `wm_X > deadline(w)`, and `Y`'s context holds every dot of `X` up to the dot of `X`'s
//! announcement. Then every event `X` ever applies
//! to `w` was applied before the announcement (it is in `Y`'s state already) — after it, `X`
//! refuses such events as late. So no node can change a final window's value afterwards.
//! Announcements carry a digest of the announcer's view definitions of the stream; while any
//! member's digest differs from ours, nothing is final and the page names the conflicting
//! replicas (their states still merge: the definitions must be made equal).
//! The caveat is membership: a node whose writes `Y` has never seen and that is not connected
//! now is not counted; a lone node is final by its own watermark. A member that never ingests
//! into the stream holds its windows open (no idle timeout yet).

pub mod def;
pub mod fold;
pub mod keys;
pub mod read;

pub use def::{CompiledView, FieldEquals, Hopping, ViewDef, ViewKind, Window, WindowDef};
pub use fold::{FoldedEvent, StreamEvent, ViewOp};
pub use read::{ViewCounters, ViewPage, ViewQuery, ViewRow};

use crate::config::Limits;
use crate::error::Error;
use crate::store::LocalWrite;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tidemark_crdts::{Mutation, ReplicaId};

/// Per-view counters since the node opened.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) folded: AtomicU64,
    pub(crate) late: AtomicU64,
    pub(crate) rejected: AtomicU64,
}

/// The node's views: definitions, per-stream watermarks, counters.
#[derive(Debug)]
pub struct Views {
    views: Vec<CompiledView>,
    /// Stream → indexes of its views.
    by_stream: BTreeMap<String, Vec<usize>>,
    /// Stream → allowed out-of-orderness (largest of its views').
    ooo: BTreeMap<String, u64>,
    /// Stream → digest of its view definitions (announced with the watermark).
    pub(crate) digests: BTreeMap<String, String>,
    /// Stream → this node's local watermark. Locked from the lateness decision of an ingest
    /// until its writes are queued, so writes reach the writer in watermark order.
    pub(crate) watermarks: Mutex<BTreeMap<String, u64>>,
    pub(crate) counters: Vec<Counters>,
    /// Peers connected at some time since open: members for finality even while away.
    pub(crate) met: Mutex<std::collections::BTreeSet<crate::proto::PeerId>>,
}

/// What [`Views::admit`] decided for a batch.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    /// Per event write: the views for which it was late (some window refused).
    pub(crate) late: Vec<Vec<usize>>,
    /// Per event write: the views it was applied to.
    pub(crate) applied: Vec<Vec<usize>>,
    /// The stream's new watermark, when the batch moved it (its announcement is the last
    /// write of the batch).
    pub(crate) new_wm: Option<u64>,
}

impl Views {
    /// Validates `defs`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the view and the field.
    pub fn new(defs: &[ViewDef]) -> Result<Self, Error> {
        let views = def::compile(defs).map_err(Error::Config)?;
        let mut by_stream: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut ooo: BTreeMap<String, u64> = BTreeMap::new();
        for (i, v) in views.iter().enumerate() {
            by_stream.entry(v.def.stream.clone()).or_default().push(i);
            let o = v.window.map_or(0, |w| w.out_of_orderness_ms);
            let e = ooo.entry(v.def.stream.clone()).or_default();
            *e = (*e).max(o);
        }
        let counters = views.iter().map(|_| Counters::default()).collect();
        let digests = by_stream
            .iter()
            .map(|(stream, idx)| {
                let defs: Vec<&ViewDef> = idx.iter().map(|&i| &views[i].def).collect();
                (stream.clone(), keys::defs_digest(&defs))
            })
            .collect();
        Ok(Self {
            views,
            by_stream,
            ooo,
            digests,
            watermarks: Mutex::new(BTreeMap::new()),
            counters,
            met: Mutex::new(std::collections::BTreeSet::new()),
        })
    }

    /// The compiled views.
    pub fn list(&self) -> &[CompiledView] {
        &self.views
    }

    /// The view named `name` and its index.
    pub fn find(&self, name: &str) -> Option<(usize, &CompiledView)> {
        self.views
            .iter()
            .enumerate()
            .find(|(_, v)| v.def.name == name)
    }

    /// True when `stream` feeds some view.
    pub fn has_stream(&self, stream: &str) -> bool {
        self.by_stream.contains_key(stream)
    }

    /// Streams that feed views.
    pub fn streams(&self) -> impl Iterator<Item = &String> {
        self.by_stream.keys()
    }

    /// Restores this node's watermarks from its announcements (at open).
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn restore(
        &self,
        reader: &crate::store::Reader,
        me: ReplicaId,
    ) -> Result<(), Error> {
        let mut wms = self.watermarks.lock().map_err(|_| Error::Closed)?;
        for stream in self.by_stream.keys() {
            if let Some(wm) = read::announced(reader, &keys::wm_key(stream, me))? {
                wms.insert(stream.clone(), wm);
            }
        }
        Ok(())
    }

    /// Folds a validated batch of `stream` into candidate view mutations (nothing decided yet).
    ///
    /// # Errors
    /// The first invalid event, naming its index and field; counted as rejected for the view.
    pub(crate) fn fold(
        &self,
        stream: &str,
        events: &[StreamEvent],
        now_ms: u64,
        limits: &Limits,
    ) -> Result<Vec<FoldedEvent>, Error> {
        let Some(idx) = self.by_stream.get(stream) else {
            return Ok(Vec::new());
        };
        let views: Vec<(usize, &CompiledView)> = idx.iter().map(|&i| (i, &self.views[i])).collect();
        events
            .iter()
            .enumerate()
            .map(|(i, ev)| {
                fold::fold_event(ev, i, &views, now_ms, limits).map_err(|(v, e)| {
                    for &(vi, _) in &views {
                        if v.is_none_or(|v| v == vi) {
                            self.counters[vi].rejected.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    e
                })
            })
            .collect()
    }

    /// Decides lateness against the stream's watermark `wm` and adds the on-time view
    /// mutations to each event's write; appends the watermark announcement when the batch
    /// moves the watermark. Call with the watermark lock held, and queue the writes before
    /// releasing it.
    pub(crate) fn admit(
        &self,
        wm: Option<u64>,
        stream: &str,
        writes: &mut Vec<LocalWrite>,
        folded: Vec<FoldedEvent>,
        me: ReplicaId,
    ) -> Admitted {
        let ooo = self.ooo.get(stream).copied().unwrap_or(0);
        let mut out = Admitted::default();
        let mut max_wm = None::<u64>;
        for (w, f) in writes.iter_mut().zip(folded) {
            let mut late = Vec::new();
            let mut applied = Vec::new();
            for op in f.ops {
                let is_late = matches!((op.deadline, wm), (Some(d), Some(wm)) if d < wm);
                let list = if is_late { &mut late } else { &mut applied };
                if list.last() != Some(&op.view) {
                    list.push(op.view);
                }
                if !is_late {
                    w.ops.push((op.key, op.mutation));
                }
            }
            out.late.push(late);
            out.applied.push(applied);
            let t = f.time_ms.saturating_sub(ooo);
            max_wm = Some(max_wm.map_or(t, |m| m.max(t)));
        }
        if let Some(m) = max_wm {
            if wm.is_none_or(|wm| m > wm) {
                out.new_wm = Some(m);
                writes.push(LocalWrite {
                    ops: vec![(
                        keys::wm_key(stream, me),
                        Mutation::Set(keys::announcement_text(
                            m,
                            self.digests.get(stream).map_or("", String::as_str),
                        )),
                    )],
                    event: None,
                });
            }
        }
        out
    }

    /// Counts a committed batch: `effective[i]` is true for event writes that were applied
    /// (neither duplicates nor refused). Returns the number of late events.
    pub(crate) fn count(&self, admitted: &Admitted, effective: &[bool]) -> usize {
        let mut late_events = 0;
        for ((late, applied), ok) in admitted.late.iter().zip(&admitted.applied).zip(effective) {
            if !ok {
                continue;
            }
            if !late.is_empty() {
                late_events += 1;
            }
            for &v in late {
                self.counters[v].late.fetch_add(1, Ordering::Relaxed);
            }
            for &v in applied {
                self.counters[v].folded.fetch_add(1, Ordering::Relaxed);
            }
        }
        late_events
    }
}
