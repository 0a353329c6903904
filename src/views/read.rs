//! Reading views: rows with their window and whether the window is final.

use super::Views;
use super::def::ViewKind;
use super::keys;
use super::seal;
use crate::error::Error;
use crate::proto::PeerId;
use crate::store::Reader;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use tidemark_crdts::{CausalContext, DotStore, Entry, Key, KeyKind, ReplicaId, Value};

/// Which rows of a view to read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewQuery {
    /// Only groups whose field equals the value (each listed field).
    #[serde(default)]
    pub group: serde_json::Map<String, serde_json::Value>,
    /// Only windows starting at or after this time (ms).
    #[serde(default)]
    pub from: Option<u64>,
    /// Only windows starting before this time (ms).
    #[serde(default)]
    pub to: Option<u64>,
    /// Paging: continue after this cursor (a page's `next`).
    #[serde(default)]
    pub after: Option<String>,
    /// Most rows returned (0: the default of 1,000).
    #[serde(default)]
    pub limit: usize,
}

/// One row of a view: a group's value in one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewRow {
    /// The group: `group_by` field → value.
    pub group: serde_json::Map<String, serde_json::Value>,
    /// Window start (ms; `None` for an unwindowed view).
    pub window_start: Option<u64>,
    /// Window end, exclusive (ms).
    pub window_end: Option<u64>,
    /// True when the window is sealed on this node (`seal.rs`): its value counts exactly the
    /// seal's members' contributions and never reads non-final again here; every node that
    /// seals it reports the same value (limits in ARCHITECTURE.md, "Seals").
    #[serde(rename = "final")]
    pub is_final: bool,
    /// The value: count/sum a number, distinct/members a sorted array, latest the value.
    pub value: serde_json::Value,
}

/// Per-view counters since the node opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewCounters {
    /// Events folded into the view (at least one window applied).
    pub folded: u64,
    /// Events refused as late for at least one window of the view.
    pub late: u64,
    /// Events rejected (invalid for this view; their batch applied nothing).
    pub rejected: u64,
    /// Entries of removed windows that arrived from peers and were dropped on receipt.
    #[serde(default)]
    pub expired_dropped: u64,
    /// Cells of another definition of this view name that arrived from peers: kept under
    /// their own keys, never merged with this node's cells nor read.
    #[serde(default)]
    pub foreign_cells: u64,
}

/// A page of view rows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewPage {
    /// Rows ordered by window start, then group.
    pub rows: Vec<ViewRow>,
    /// Cursor of the next page (`None`: no more rows).
    pub next: Option<String>,
    /// The view's counters on this node.
    pub counters: ViewCounters,
    /// This node's announced watermark of the view's stream.
    pub watermark: Option<u64>,
    /// The watermark every known member has passed, with its state joined here (`None`: some
    /// known member has not announced one or its state is not joined yet). Windows whose end
    /// plus lateness is below it become final once sealed (one round of announcements later,
    /// when every member agrees on the member set); some may stay non-final for good.
    pub cluster_watermark: Option<u64>,
    /// Replicas that announced different view definitions for the stream: while any is
    /// listed, no window is final (every node must run the same definitions), and their cells
    /// of this view are kept apart (keyed by their definition's digest), never merged.
    pub definition_conflicts: Vec<String>,
    /// The stream's retention horizon as this node knows it: windows whose end plus the
    /// view's retention is below it are removed (and not listed).
    #[serde(default)]
    pub horizon: Option<u64>,
}

/// The value of the cell `key` counting only the contributions of `members` (sorted), the
/// seal of its window; `None` when they contributed nothing.
///
/// # Errors
/// Storage failures.
pub(super) fn sealed_value(
    reader: &Reader,
    key: &Key,
    members: &[ReplicaId],
) -> Result<Option<Value>, Error> {
    let entry = reader
        .entry(key)?
        .unwrap_or_else(|| Entry::bottom(key.kind));
    let kept = entry.retain_replicas(|r| members.binary_search(&r).is_ok());
    Ok((!kept.is_bottom()).then(|| kept.value()))
}

/// Every replica decommissioned (removed for good) in this node's state.
///
/// # Errors
/// Storage failures.
pub(crate) fn gone(reader: &Reader) -> Result<std::collections::BTreeSet<ReplicaId>, Error> {
    let mut out = std::collections::BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let page = reader.list(KeyKind::Lww, keys::GONE_PREFIX, after.as_deref(), 256)?;
        let done = page.len() < 256;
        out.extend(page.iter().filter_map(|(k, _)| keys::gone_replica(&k.name)));
        after = page.last().map(|(k, _)| k.name.clone());
        if done {
            return Ok(out);
        }
    }
}

/// Whether a restored copy's joining state is over, by its committed state: it holds an
/// announcement (of any stream), newer than the snapshot (`snapshot`, its context), by a live
/// replica that was a known member of its cluster when the snapshot was taken — the copy synced
/// with its cluster — or every other member it knows of (every other announcer of any stream,
/// and every peer their announcements say they met) was removed for good, one at least — the
/// copy is the whole cluster.
///
/// The known members at snapshot time (as peers) are the snapshot's source (`source`), every
/// replica the snapshot's context holds a write of (an announcer's announcement included, even
/// once a newer one replaced it) and every peer named met by an announcement the snapshot held. A node that never was a
/// member (a brand-new node, a `--join` node joining through the copy, another copy of the
/// same snapshot) is not one, so its announcements end nothing: it holds nothing of the
/// cluster the copy lacks. Without a snapshot context (a store restored by an earlier
/// version) only the removals count, as before. A snapshot that names no member but its
/// source ends the wait as a `--join` node's, once the copy holds what its linked peers held
/// (`peers_covered`).
///
/// # Errors
/// Storage failures.
pub(crate) fn restored_settled(
    reader: &Reader,
    me: ReplicaId,
    snapshot: Option<&CausalContext>,
    source: Option<ReplicaId>,
    peers_covered: bool,
    peer_of: fn(ReplicaId) -> crate::proto::PeerId,
) -> Result<bool, Error> {
    let removed = gone(reader)?;
    let removed_peers: std::collections::BTreeSet<crate::proto::PeerId> =
        removed.iter().map(|g| peer_of(*g)).collect();
    let my_peer = peer_of(me);
    let mut known: std::collections::BTreeSet<crate::proto::PeerId> = snapshot
        .map(|snap| snap.replicas().map(|r| peer_of(*r)).collect())
        .unwrap_or_default();
    known.extend(source.map(peer_of));
    let mut all_removed = removed.iter().any(|g| *g != me);
    // Announcements newer than the snapshot by live others (their announcer's peer).
    let mut newer: Vec<crate::proto::PeerId> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = reader.list(KeyKind::Lww, keys::WM_PREFIX, after.as_deref(), 256)?;
        let done = page.len() < 256;
        for (key, _) in &page {
            let Some(replica) = key
                .name
                .rsplit_once('/')
                .and_then(|(_, hex)| u128::from_str_radix(hex, 16).ok())
                .map(ReplicaId)
            else {
                continue;
            };
            let Some((a, dot)) = announcement(reader, key)? else {
                continue;
            };
            let in_snapshot = snapshot.is_some_and(|snap| snap.contains(&dot));
            if in_snapshot {
                known.extend(a.met.iter().map(|&p| crate::proto::PeerId(p)));
            }
            if replica != me && !removed.contains(&replica) {
                all_removed = false;
                if !in_snapshot {
                    newer.push(peer_of(replica));
                }
            }
            if a.met.iter().any(|&p| {
                let p = crate::proto::PeerId(p);
                p != my_peer && !removed_peers.contains(&p)
            }) {
                all_removed = false;
            }
        }
        after = page.last().map(|(k, _)| k.name.clone());
        if done {
            break;
        }
    }
    if snapshot.is_some() && newer.iter().any(|p| known.contains(p) && *p != my_peer) {
        return Ok(true);
    }
    // A snapshot that names no member but its source (a `--join` node that never synced, or
    // one taken before anything of the peers its source met reached it): the copy joins as
    // a `--join` node does, through whichever peers it is linked to, once it holds what they
    // held.
    let source_peer = source.map(peer_of);
    if peers_covered
        && !known
            .iter()
            .any(|p| *p != my_peer && Some(*p) != source_peer)
    {
        return Ok(true);
    }
    Ok(all_removed)
}

/// What a restored store's state says of its cluster's announcements of a stream since open
/// ([`fresh_announcement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fresh {
    /// Every live other announcer's announcement is one the state opened with: wait.
    Stale,
    /// An announcement of another live replica arrived since open.
    Heard,
    /// Other replicas announced the stream and every one of them was removed for good
    /// (decommissioned): there is no cluster to hear from (a snapshot restored after the rest
    /// of its cluster was lost), so this node's marks are the cluster's.
    OthersGone,
    /// No other replica announced the stream.
    NoOthers,
}

/// Whether the state holds an announcement of `stream` by another replica than `me` that
/// `seen` (the context at open) did not hold: one that arrived from a live peer since
/// ([`Fresh::Heard`]); or whether every other announcer was removed for good
/// ([`Fresh::OthersGone`]) or there is none ([`Fresh::NoOthers`]). Anything else is
/// [`Fresh::Stale`].
///
/// # Errors
/// Storage failures.
pub(crate) fn fresh_announcement(
    reader: &Reader,
    stream: &str,
    me: ReplicaId,
    seen: &CausalContext,
) -> Result<Fresh, Error> {
    let prefix = keys::wm_prefix(stream);
    let removed = gone(reader)?;
    let mut live_other = false;
    let mut removed_other = false;
    let mut after: Option<String> = None;
    loop {
        let page = reader.list(KeyKind::Lww, &prefix, after.as_deref(), 256)?;
        let done = page.len() < 256;
        for (key, _) in &page {
            let Some(replica) = keys::wm_replica(stream, &key.name) else {
                continue;
            };
            if replica == me {
                continue;
            }
            if removed.contains(&replica) {
                removed_other = true;
                continue;
            }
            live_other = true;
            if let Some((_, dot)) = announcement(reader, key)?
                && !seen.contains(&dot)
            {
                return Ok(Fresh::Heard);
            }
        }
        after = page.last().map(|(k, _)| k.name.clone());
        if done {
            return Ok(if live_other {
                Fresh::Stale
            } else if removed_other {
                Fresh::OthersGone
            } else {
                Fresh::NoOthers
            });
        }
    }
}

/// The announcement in `key` and its dot.
fn announcement(
    reader: &Reader,
    key: &Key,
) -> Result<Option<(keys::Announcement, tidemark_crdts::Dot)>, Error> {
    let Some(Entry::Lww(f)) = reader.entry(key)? else {
        return Ok(None);
    };
    let best = f.iter().max_by_key(|(_, (ts, _))| *ts);
    Ok(best.and_then(|(dot, (_, v))| keys::parse_announcement(v).ok().map(|a| (a, *dot))))
}

/// The announcement in `key`.
pub(crate) fn announcement_of(
    reader: &Reader,
    key: &Key,
) -> Result<Option<keys::Announcement>, Error> {
    Ok(announcement(reader, key)?.map(|(a, _)| a))
}

/// The largest watermark and the largest horizon among every announcement of `stream` this
/// node holds (whoever made them, but `except`), and whether there is any.
///
/// # Errors
/// Storage failures.
pub(crate) fn largest_announced(
    reader: &Reader,
    stream: &str,
    except: Option<ReplicaId>,
) -> Result<(Option<u64>, Option<u64>, bool), Error> {
    let prefix = keys::wm_prefix(stream);
    let (mut wm, mut horizon, mut any) = (None::<u64>, None::<u64>, false);
    let mut after: Option<String> = None;
    loop {
        let page = reader.list(KeyKind::Lww, &prefix, after.as_deref(), 256)?;
        let done = page.len() < 256;
        for (key, _) in &page {
            if except.is_some() && keys::wm_replica(stream, &key.name) == except {
                continue;
            }
            if let Some(a) = announcement_of(reader, key)? {
                any = true;
                wm = wm.max(Some(a.wm));
                horizon = horizon.max(a.horizon);
            }
        }
        after = page.last().map(|(k, _)| k.name.clone());
        if done {
            return Ok((wm, horizon, any));
        }
    }
}

/// What the announcements of a stream say, as this node can vouch for it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cluster {
    /// The cluster watermark (see [`cluster_watermark`]).
    pub(crate) wm: Option<u64>,
    /// Replicas that announced other definitions.
    pub(crate) conflicts: Vec<String>,
    /// The largest horizon announced by any replica.
    pub(crate) horizon: Option<u64>,
    /// Every replica that announced (the members the watermark is vouched over).
    pub(crate) members: Vec<ReplicaId>,
}

/// The cluster watermark of `stream` as this node can vouch for it: the minimum over every
/// announcement it holds (its own included), provided every member announced — every replica
/// in its context (whose writes it has seen) and every peer met since open — with the same
/// definitions digest as ours, and its context holds every dot of each announcer up to the
/// announcement's dot. Also returns the replicas whose definitions differ and the largest
/// announced horizon. Every announced watermark and horizon is taken at most at `bound` (this
/// node's clock plus the stream's `max_future`): a peer announcing one further ahead (its
/// clock or its `max_future` differs) moves nothing here beyond what this node would accept.
/// A `joining` node vouches for nothing while it is the only announcer (it never synced the
/// stream with the cluster it joins) — unless every other announcer was removed for good: then
/// the operator declared the rest of the cluster lost, and it is the cluster (a cluster rebuilt
/// from a snapshot of a joining node).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cluster_watermark(
    reader: &Reader,
    stream: &str,
    digest: &str,
    me: ReplicaId,
    known: &[PeerId],
    peer_of: fn(ReplicaId) -> PeerId,
    bound: u64,
    joining: bool,
) -> Result<Cluster, Error> {
    let ctx: CausalContext = reader.context()?;
    // Members removed for good count for nothing: no watermark of theirs is waited for.
    let gone = gone(reader)?;
    let prefix = keys::wm_prefix(stream);
    let mut min = None::<u64>;
    let mut horizon = None::<u64>;
    let mut unsure = false;
    let mut announcers = Vec::new();
    let mut conflicts = Vec::new();
    // Some announcer was removed for good (decommissioned).
    let mut gone_announced = false;
    let mut after: Option<String> = None;
    loop {
        let page = reader.list(KeyKind::Lww, &prefix, after.as_deref(), 256)?;
        let done = page.len() < 256;
        for (key, _) in &page {
            let (Some(replica), Some((a, dot))) = (
                keys::wm_replica(stream, &key.name),
                announcement(reader, key)?,
            ) else {
                unsure = true;
                continue;
            };
            if gone.contains(&replica) {
                gone_announced = true;
                continue;
            }
            if a.defs != digest {
                conflicts.push(replica.to_string());
            }
            horizon = horizon.max(a.horizon.map(|h| h.min(bound)));
            unsure |= !CausalContext::from_range(dot.replica, 1, dot.seq).is_subset(&ctx);
            announcers.push(replica);
            let wm = a.wm.min(bound);
            min = Some(min.map_or(wm, |m| m.min(wm)));
        }
        after = page.last().map(|(k, _)| k.name.clone());
        if done {
            break;
        }
    }
    // Members: every replica whose writes this node has seen, every peer met since open.
    let peers: Vec<PeerId> = announcers.iter().map(|r| peer_of(*r)).collect();
    if unsure
        || !conflicts.is_empty()
        || !announcers.contains(&me)
        || (joining && !gone_announced && announcers.iter().all(|r| *r == me))
        || known
            .iter()
            .any(|p| !peers.contains(p) && !gone.iter().any(|g| peer_of(*g) == *p))
        || ctx
            .replicas()
            .any(|r| !announcers.contains(r) && !gone.contains(r))
    {
        min = None;
    }
    Ok(Cluster {
        wm: min,
        conflicts,
        horizon,
        members: announcers,
    })
}

/// What this node's state says about `stream`'s seals (`seal::Ledger`): every announcer's
/// epochs, which announcers it holds every write of up to their announcement, and this
/// node's own committed seals.
///
/// # Errors
/// Storage failures.
pub(crate) fn ledger(reader: &Reader, stream: &str, me: ReplicaId) -> Result<seal::Ledger, Error> {
    let ctx: CausalContext = reader.context()?;
    let prefix = keys::wm_prefix(stream);
    let mut out = seal::Ledger {
        me,
        ..seal::Ledger::default()
    };
    let gone = gone(reader)?;
    let mut after: Option<String> = None;
    loop {
        let page = reader.list(KeyKind::Lww, &prefix, after.as_deref(), 256)?;
        let done = page.len() < 256;
        for (key, _) in &page {
            let (Some(replica), Some((a, dot))) = (
                keys::wm_replica(stream, &key.name),
                announcement(reader, key)?,
            ) else {
                continue;
            };
            let since = if a.applied { a.since } else { a.wm };
            if replica == me {
                out.sealed = a.sealed;
                out.since = since;
            } else {
                if gone.contains(&replica) {
                    out.gone_since.insert(replica, since);
                } else {
                    out.since_of.insert(replica, since);
                }
                // What it reported final stays reported, removed for good or not.
                if !a.sealed.is_empty() {
                    out.sealed_of.insert(replica, a.sealed);
                }
            }
            let Some(epochs) = a.epochs else { continue };
            if CausalContext::from_range(dot.replica, 1, dot.seq).is_subset(&ctx) {
                out.held.insert(replica);
            }
            out.epochs.insert(replica, epochs);
        }
        after = page.last().map(|(k, _)| k.name.clone());
        if done {
            return Ok(out);
        }
    }
}

/// The store key kind of a view kind's cells.
pub(crate) fn key_kind(kind: ViewKind) -> KeyKind {
    match kind {
        ViewKind::Count => KeyKind::GCounter,
        ViewKind::Sum => KeyKind::PNCounter,
        ViewKind::Distinct | ViewKind::Members => KeyKind::ORSet,
        ViewKind::Latest => KeyKind::Lww,
    }
}

pub(super) fn to_json(kind: ViewKind, v: &Value) -> serde_json::Value {
    let j = crate::ops::value_to_json(v);
    if kind == ViewKind::Latest {
        return keys::latest_value(&j);
    }
    j
}

/// The part of an announced `horizon` a node with watermark `own` adopts: at most `own`.
pub(crate) fn adopted(horizon: Option<u64>, own: Option<u64>) -> Option<u64> {
    horizon.zip(own).map(|(h, w)| h.min(w))
}

/// Where a stream's views stand on this node: what finality and retention are judged by.
pub(super) struct Standing {
    pub(super) watermark: Option<u64>,
    pub(super) cluster: Option<u64>,
    pub(super) conflicts: Vec<String>,
    pub(super) horizon: Option<u64>,
    /// This node's committed seals (`seal.rs`): what is final here, and whose contributions
    /// a final window counts.
    pub(super) sealed: Vec<seal::Sealed>,
}

/// One configured view and where it stands on this node (`GET /v1/views`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewSummary {
    /// The view's definition, as configured.
    pub definition: super::ViewDef,
    /// The view's counters on this node.
    pub counters: ViewCounters,
    /// This node's announced watermark of the view's stream (ms).
    pub watermark: Option<u64>,
    /// The cluster watermark as this node can vouch for it (see [`ViewPage::cluster_watermark`]).
    pub cluster_watermark: Option<u64>,
    /// Replicas that announced other definitions for the stream (no window is final meanwhile).
    pub definition_conflicts: Vec<String>,
    /// The stream's retention horizon as this node knows it.
    pub horizon: Option<u64>,
}

impl Views {
    /// The counters of view `vi`.
    pub(super) fn counters_of(&self, vi: usize) -> ViewCounters {
        let c = &self.counters[vi];
        ViewCounters {
            folded: c.folded.load(Ordering::Relaxed),
            late: c.late.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            expired_dropped: c.expired_dropped.load(Ordering::Relaxed),
            foreign_cells: c.foreign_cells.load(Ordering::Relaxed),
        }
    }

    /// Where `stream` stands: our watermark, the cluster watermark, conflicting definitions and
    /// the horizon reads hide windows behind (monotone: the largest ever seen by reads, the one
    /// this node acts on, any announced one it adopts, and the cluster watermark now).
    pub(super) fn standing(
        &self,
        reader: &Reader,
        stream: &str,
        me: ReplicaId,
        known: &[PeerId],
        peer_of: fn(ReplicaId) -> PeerId,
    ) -> Result<Standing, Error> {
        let digest = self.digests.get(stream).map_or("", String::as_str);
        let Cluster {
            wm: cluster,
            conflicts,
            horizon: announced_h,
            ..
        } = cluster_watermark(
            reader,
            stream,
            digest,
            me,
            known,
            peer_of,
            self.time_bound(stream, crate::clock::wall_ms()),
            self.is_joining(),
        )?;
        let own = announcement_of(reader, &keys::wm_key(stream, me))?;
        let watermark = own.as_ref().map(|a| a.wm);
        let sealed = own.map(|a| a.sealed).unwrap_or_default();
        let horizon = {
            let mut rh = self.read_horizons.lock().map_err(|_| Error::Closed)?;
            let h = [
                rh.get(stream).copied(),
                self.horizon(stream),
                adopted(announced_h, watermark),
                cluster,
            ]
            .into_iter()
            .flatten()
            .max();
            if let Some(h) = h {
                rh.insert(stream.to_owned(), h);
            }
            h
        };
        Ok(Standing {
            watermark,
            cluster,
            conflicts,
            horizon,
            sealed,
        })
    }

    /// Every configured view with where it stands on this node, in configuration order (one
    /// standing per stream, shared by its views).
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn summaries(
        &self,
        reader: &Reader,
        me: ReplicaId,
        known: &[PeerId],
        peer_of: fn(ReplicaId) -> PeerId,
    ) -> Result<Vec<ViewSummary>, Error> {
        let mut by_stream: std::collections::HashMap<&str, Standing> = Default::default();
        let mut out = Vec::with_capacity(self.list().len());
        for (vi, view) in self.list().iter().enumerate() {
            let stream = view.def.stream.as_str();
            if !by_stream.contains_key(stream) {
                let st = self.standing(reader, stream, me, known, peer_of)?;
                by_stream.insert(stream, st);
            }
            let Some(st) = by_stream.get(stream) else {
                continue;
            };
            out.push(ViewSummary {
                definition: view.def.clone(),
                counters: self.counters_of(vi),
                watermark: st.watermark,
                cluster_watermark: st.cluster,
                definition_conflicts: st.conflicts.clone(),
                horizon: st.horizon,
            });
        }
        Ok(out)
    }

    /// Reads a page of view `name`.
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown view; storage failures.
    pub(crate) fn read(
        &self,
        reader: &Reader,
        name: &str,
        query: &ViewQuery,
        me: ReplicaId,
        known: &[PeerId],
        peer_of: fn(ReplicaId) -> PeerId,
    ) -> Result<ViewPage, Error> {
        let (vi, view) = self
            .find(name)
            .ok_or_else(|| Error::Config(format!("no view named {name:?} is configured")))?;
        let d = &view.def;
        if view.window.is_some_and(|w| w.session_gap_ms.is_some()) {
            let st = self.standing(reader, d.stream.as_str(), me, known, peer_of)?;
            return self.read_sessions(reader, vi, query, st);
        }
        // Finality inputs first: rows read afterwards can only be newer, never older.
        let Standing {
            watermark,
            cluster,
            conflicts,
            horizon,
            sealed,
        } = self.standing(reader, d.stream.as_str(), me, known, peer_of)?;
        let kind = key_kind(d.kind);
        let limit = if query.limit == 0 { 1000 } else { query.limit };
        let prefix = keys::view_prefix(&d.name, &view.digest);
        let mut after = query.after.clone();
        let mut rows = Vec::new();
        let mut next = None;
        let mut last_key: Option<String> = None;
        'pages: loop {
            let page = reader.list(kind, &prefix, after.as_deref(), 256)?;
            let done = page.len() < 256;
            for (key, value) in &page {
                after = Some(key.name.clone());
                let Some((start, group)) = keys::parse_view_key(&d.name, &view.digest, &key.name)
                else {
                    continue;
                };
                if let Some(s) = start {
                    if query.from.is_some_and(|f| s < f) || query.to.is_some_and(|t| s >= t) {
                        continue;
                    }
                }
                let group: serde_json::Map<String, serde_json::Value> =
                    d.group_by.iter().cloned().zip(group).collect();
                if query.group.iter().any(|(f, v)| group.get(f) != Some(v)) {
                    continue;
                }
                let window = view.window;
                let end = start.zip(window).map(|(s, w)| s.saturating_add(w.size_ms));
                let deadline = start.zip(window).map(|(s, w)| w.deadline(s));
                if let (Some(s), Some(h)) = (start, horizon) {
                    if self.expired(vi, s, h) {
                        continue; // past retention: removed on every node alike
                    }
                }
                // A sealed window counts exactly its seal's members' contributions (each
                // replica's stays separable by dot in a view cell): the same value on every
                // node that sealed it, whoever else wrote to it.
                let members = deadline.and_then(|dl| seal::sealed_members(&sealed, dl));
                let value = match members {
                    Some(members) => match sealed_value(reader, key, members)? {
                        Some(v) => v,
                        // Nothing of the seal's members: no row, as on a node that never
                        // received the others' contributions.
                        None => continue,
                    },
                    None => value.clone(),
                };
                if rows.len() == limit {
                    next = last_key;
                    break 'pages;
                }
                last_key = Some(key.name.clone());
                rows.push(ViewRow {
                    group,
                    window_start: start,
                    window_end: end,
                    is_final: members.is_some(),
                    value: to_json(d.kind, &value),
                });
            }
            if done {
                break;
            }
        }
        Ok(ViewPage {
            rows,
            next,
            counters: self.counters_of(vi),
            horizon,
            watermark,
            cluster_watermark: cluster,
            definition_conflicts: conflicts,
        })
    }
}
