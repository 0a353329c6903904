//! Periodic view maintenance (the node runs it every [`TICK`] while some view is windowed):
//! seals, idle watermarks, the retention horizon, and purging removed windows.
//!
//! First the **seal step** ([`seal_inputs`], [`Views::seal_stage`], `seal.rs`): the vouched
//! cluster watermark extends this node's membership epochs and agreed deadline ranges are
//! sealed, in one announcement committed before anything is reported final. Then, per
//! stream:
//! 1. **plan** ([`plan`]): the horizon target `max(cluster watermark this node vouches for,
//!    largest horizon announced by anyone)` (streams with retention), and, when the stream
//!    has been idle here for `idle_timeout` (since its last event or the node's open, and
//!    since the last idle advance), the watermark `now − idle_timeout`;
//! 2. **announce** ([`Views::stage`]): under the watermark lock, if either moves this node's
//!    marks, queue one announcement carrying both — the writer commits it after every write
//!    queued before (whose lateness was decided under the older watermark), so the promise
//!    "events for windows whose deadline is below `wm` are refused" holds from the commit on;
//! 3. once that announcement is committed, **raise** the horizon this node acts on
//!    ([`Views::raise_horizon`]): from then on local events for removed windows are late and
//!    remote entries for them are dropped on receipt;
//! 4. **purge** ([`expired_keys`]): the rows of removed windows are deleted (context kept).

use super::keys;
use super::read::cluster_watermark;
use super::{StreamMarks, Views};
use crate::error::Error;
use crate::proto::PeerId;
use crate::store::{LocalWrite, Reader};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark_crdts::{Key, ReplicaId};

/// How often maintenance runs.
pub const TICK: Duration = Duration::from_millis(50);

/// Most rows purged per stream and round.
pub const PURGE_BATCH: usize = 4_096;

/// What one round wants for a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The stream.
    pub stream: String,
    /// The horizon to announce and act on, if it has retention.
    pub horizon: Option<u64>,
    /// The watermark an idle stream advances to.
    pub idle_wm: Option<u64>,
}

/// The round's plan for every stream.
///
/// # Errors
/// Storage failures.
pub(crate) fn plan(
    views: &Views,
    reader: &Reader,
    me: ReplicaId,
    known: &[PeerId],
    peer_of: fn(ReplicaId) -> PeerId,
    now_ms: u64,
) -> Result<Vec<Plan>, Error> {
    let marks: BTreeMap<String, StreamMarks> =
        views.watermarks.lock().map_err(|_| Error::Closed)?.clone();
    let now = Instant::now();
    let mut out = Vec::new();
    for (stream, idx) in &views.by_stream {
        let retains = idx.iter().any(|&i| {
            views.views[i]
                .window
                .is_some_and(|w| w.retention_ms.is_some())
        });
        let horizon = if retains {
            let c = views.vouched(reader, stream, me, known, peer_of, now_ms)?;
            // Another node's horizon is adopted only as far as this node's own watermark: it
            // may have been vouched over a membership without this node (a fresh node alone
            // vouches for itself), and no node removes a window it still holds open.
            let own = marks.get(stream).and_then(|m| m.wm);
            c.wm.max(super::read::adopted(c.horizon, own))
        } else {
            None
        };
        let m = marks.get(stream).copied().unwrap_or_default();
        let idle_wm = views.idle.get(stream).and_then(|&idle| {
            let idle_d = Duration::from_millis(idle);
            let quiet = m
                .active
                .is_none_or(|t| now.saturating_duration_since(t) >= idle_d);
            let due = m
                .idle_advanced
                .is_none_or(|t| now.saturating_duration_since(t) >= idle_d);
            let target = now_ms.saturating_sub(idle);
            (quiet && due && m.wm.is_none_or(|w| target > w)).then_some(target)
        });
        if horizon.is_some() || idle_wm.is_some() {
            out.push(Plan {
                stream: stream.clone(),
                horizon,
                idle_wm,
            });
        }
    }
    Ok(out)
}

/// What one seal step needs of a stream, read before the watermark lock is taken.
#[derive(Clone, Debug)]
pub(crate) struct SealInput {
    /// The stream.
    pub(crate) stream: String,
    /// The cluster watermark this node vouches for and the members it is vouched over.
    pub(crate) cluster: super::read::Cluster,
    /// The stream's seal ledger as committed (`seal.rs`).
    pub(crate) ledger: super::seal::Ledger,
    /// Whether this node met a peer its committed announcement does not name yet.
    pub(crate) met_unannounced: bool,
}

/// The seal inputs of every windowed stream.
///
/// # Errors
/// Storage failures.
pub(crate) fn seal_inputs(
    views: &Views,
    reader: &Reader,
    me: ReplicaId,
    known: &[PeerId],
    peer_of: fn(ReplicaId) -> PeerId,
    now_ms: u64,
) -> Result<Vec<SealInput>, Error> {
    let mut out = Vec::new();
    for (stream, idx) in &views.by_stream {
        if !idx.iter().any(|&i| views.views[i].window.is_some()) {
            continue;
        }
        let cluster = views.vouched(reader, stream, me, known, peer_of, now_ms)?;
        let ledger = super::read::ledger(reader, stream, me)?;
        let announced: Vec<u64> = super::read::announcement_of(reader, &keys::wm_key(stream, me))?
            .map(|a| a.met)
            .unwrap_or_default();
        let met_unannounced = views
            .met
            .lock()
            .map_err(|_| Error::Closed)?
            .iter()
            .any(|p| !announced.contains(&p.0));
        out.push(SealInput {
            stream: stream.clone(),
            cluster,
            ledger,
            met_unannounced,
        });
    }
    Ok(out)
}

impl Views {
    /// The cluster watermark of `stream` this node vouches for at clock `now_ms`
    /// ([`cluster_watermark`] with this node's definitions digest, time bound and role).
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn vouched(
        &self,
        reader: &Reader,
        stream: &str,
        me: ReplicaId,
        known: &[PeerId],
        peer_of: fn(ReplicaId) -> PeerId,
        now_ms: u64,
    ) -> Result<super::read::Cluster, Error> {
        cluster_watermark(
            reader,
            stream,
            self.digests.get(stream).map_or("", String::as_str),
            me,
            known,
            peer_of,
            self.time_bound(stream, now_ms),
            self.is_joining(),
        )
    }

    /// The seal step of one stream (`seal.rs`), under the watermark lock `wms`: the vouched
    /// cluster watermark extends this node's epochs, and every deadline range whose members
    /// all announced the same set for it (and whose writes this node holds up to those
    /// announcements) is sealed. Returns the announcement carrying them when either grew
    /// (with `only_new_seals`, a read's step: only when something new is sealed); queue it
    /// before releasing the lock, and report nothing final before it committed.
    ///
    /// # Errors
    /// [`Error::Closed`] on a poisoned lock.
    pub(crate) fn seal_stage(
        &self,
        wms: &BTreeMap<String, StreamMarks>,
        input: SealInput,
        me: ReplicaId,
        only_new_seals: bool,
    ) -> Result<Option<LocalWrite>, Error> {
        let SealInput {
            stream,
            cluster,
            mut ledger,
            met_unannounced,
        } = input;
        let Some(m) = wms.get(&stream).copied() else {
            return Ok(None);
        };
        let Some(wm) = m.wm else {
            // No watermark yet (no event applied, none adopted): nothing to vouch for or
            // seal. But the peers it met are kept only in its announcement: one met and not
            // yet announced is written now, with watermark 0 (it applied nothing; read back
            // as no watermark at open, `Views::restore`), or a restart before its first event
            // would forget them and let it vouch alone over windows they hold open. A node
            // still waiting to sync (joining, or a restored copy waiting for a fresh
            // announcement) announces nothing before it starts.
            let waits = self.awaits_sync(&stream)
                || self
                    .fresh_from
                    .lock()
                    .map_err(|_| Error::Closed)?
                    .contains_key(&stream);
            if met_unannounced && !waits {
                return Ok(Some(self.announcement(&stream, 0, m.horizon, me)));
            }
            return Ok(None); // an announcer with no watermark would hold every window open
        };
        let mut seals = self.seals.lock().map_err(|_| Error::Closed)?;
        let cur = seals.entry(stream.clone()).or_default();
        cur.excluded_to = cur
            .excluded_to
            .max(super::seal::excluded_to(&ledger.epochs, me));
        // Epochs staged before this step may have been read by others already.
        ledger.fixed_to = cur.epochs.last().map_or(0, |e| e.to);
        let epochs = cluster
            .wm
            .and_then(|cw| super::seal::extend(&cur.epochs, cw, cluster.members.clone()));
        ledger
            .epochs
            .insert(me, epochs.clone().unwrap_or_else(|| cur.epochs.clone()));
        ledger.held.insert(me);
        ledger.sealed = cur.sealed.clone();
        // Having applied nothing to a window, it has nothing below its watermark.
        ledger.since = if cur.applied { cur.since } else { wm };
        let sealed = ledger.agree();
        // A read writes only when it makes something final; epochs alone wait for the tick.
        // A peer met and not yet announced is written at once (a restart must not forget it).
        if (epochs.is_none() || only_new_seals) && sealed.is_none() && !met_unannounced {
            return Ok(None);
        }
        if let Some(e) = epochs {
            cur.epochs = e;
        }
        if let Some(s) = sealed {
            cur.sealed = s;
        }
        drop(seals);
        Ok(Some(self.announcement(&stream, wm, m.horizon, me)))
    }

    /// Step 2: under the watermark lock `wms`, the announcement `plan` needs (if it moves
    /// anything), with the marks updated as queued. Queue the write before releasing the lock.
    pub(crate) fn stage(
        &self,
        wms: &mut BTreeMap<String, StreamMarks>,
        plan: &Plan,
        me: ReplicaId,
    ) -> Option<LocalWrite> {
        let m = wms.entry(plan.stream.clone()).or_default();
        let new_wm = plan.idle_wm.filter(|w| m.wm.is_none_or(|x| *w > x));
        let new_h = plan.horizon.filter(|h| m.horizon.is_none_or(|x| *h > x));
        if new_wm.is_none() && new_h.is_none() {
            return None;
        }
        if new_wm.is_some() {
            m.idle_advanced = Some(Instant::now());
            m.wm = new_wm;
        }
        if new_h.is_some() {
            m.horizon = new_h;
        }
        Some(self.announcement(&plan.stream, m.wm.unwrap_or(0), m.horizon, me))
    }

    /// Step 3: the horizon this node acts on becomes the one it announced, once that
    /// announcement is committed (the caller awaited it).
    ///
    /// # Errors
    /// [`Error::Closed`] on a poisoned lock.
    pub(crate) fn raise_horizon(&self, stream: &str) -> Result<Option<u64>, Error> {
        let wms = self.watermarks.lock().map_err(|_| Error::Closed)?;
        let Some(h) = wms.get(stream).and_then(|m| m.horizon) else {
            return Ok(None);
        };
        let mut hs = self.horizons.lock().map_err(|_| Error::Closed)?;
        let e = hs.entry(stream.to_owned()).or_insert(h);
        *e = (*e).max(h);
        Ok(Some(*e))
    }

    /// Marks `stream` active now (an ingest): it is not idle.
    pub(crate) fn touch(&self, stream: &str) {
        if let Ok(mut wms) = self.watermarks.lock() {
            wms.entry(stream.to_owned()).or_default().active = Some(Instant::now());
        }
    }
}

/// Step 4: up to `max` keys of rows of `stream`'s views whose windows are removed under the
/// horizon this node acts on (its views' own cells only; cells sort by window start, so the
/// scan stops at the first window that is kept). A session view's cells are removed a whole
/// session at a time, once it is final under `me`'s committed seals and past retention
/// (`super::session`).
///
/// # Errors
/// Storage failures.
pub(crate) fn expired_keys(
    views: &Views,
    reader: &Reader,
    stream: &str,
    max: usize,
    me: ReplicaId,
) -> Result<Vec<Key>, Error> {
    let Some(h) = views.horizon(stream) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut sealed: Option<Vec<super::seal::Sealed>> = None;
    for &vi in views.by_stream.get(stream).map_or(&[][..], Vec::as_slice) {
        let view = &views.views[vi];
        if view.window.is_none_or(|w| w.retention_ms.is_none()) {
            continue;
        }
        if view.window.is_some_and(|w| w.session_gap_ms.is_some()) {
            if out.len() >= max {
                return Ok(out);
            }
            let sealed = match &sealed {
                Some(s) => s,
                None => sealed.insert(
                    super::read::announcement_of(reader, &keys::wm_key(stream, me))?
                        .map(|a| a.sealed)
                        .unwrap_or_default(),
                ),
            };
            out.extend(views.expired_sessions(reader, vi, sealed, h, max - out.len())?);
            continue;
        }
        let kind = super::read::key_kind(view.def.kind);
        let prefix = keys::view_prefix(&view.def.name, &view.digest);
        let mut after: Option<String> = None;
        'scan: loop {
            let page = reader.list_keys(kind, &prefix, after.as_deref(), 256)?;
            let done = page.len() < 256;
            for key in &page {
                after = Some(key.name.clone());
                let start = keys::cell_of(&key.name).and_then(|(_, _, s)| s);
                match start {
                    Some(s) if views.expired(vi, s, h) => out.push(key.clone()),
                    _ => break 'scan,
                }
                if out.len() >= max {
                    return Ok(out);
                }
            }
            if done {
                break;
            }
        }
    }
    Ok(out)
}
