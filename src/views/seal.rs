//! Seals: which replicas' contributions a final window counts, agreed without coordination.
//!
//! Write `d` for a window's deadline (end + lateness). Every node keeps, per stream, two
//! monotone records in its watermark announcement:
//!
//! - **epochs** ([`Epoch`]): each time it vouches for a cluster watermark `cw` (every member it
//!   knows announced a watermark above `cw` and it holds their writes up to those
//!   announcements), the deadlines below `cw` not yet covered get the member set it vouched
//!   over. Once announced, the members an announcer gives for a deadline never change
//!   ([`membership`]): membership grows by new epochs, never by rewriting old ones.
//! - **seals** ([`Sealed`]): ranges of deadlines it reported final, with the members counted.
//!
//! A node seals deadline `d` with members `S` when every `X ∈ S` announced exactly `S` for `d`
//! and it holds each such `X`'s writes up to that announcement ([`Ledger::agree`]). Two seals of
//! the same `d` whose member sets share one replica `X` are equal, since `X` announced one set
//! for `d`. Every `X ∈ S` vouched past `d`, so its own watermark passed `d` before that
//! announcement and it refuses events for the window since: all of `X`'s contributions are in
//! the sealing node's state. View cells keep every replica's contribution separable by dot
//! ([`crate::store::LocalWrite::own_dots`]), so a sealed window's value is exactly its members'
//! contributions ([`tidemark_crdts::Entry::retain_replicas`]) — the same on every node that
//! seals it, whatever else (a node that joined later, a restored copy) wrote to the window.
//! A node reports a window final only once its seal is committed in its own announcement, so
//! `final` never turns back, across restarts too.
//!
//! Seal sets of the same deadline that share no replica are possible only between nodes that
//! never met when they sealed: two clusters started apart and merged later. A node started to
//! join an existing cluster (`joining`) therefore vouches for nothing until it holds another
//! node's announcement of the stream.

use std::collections::{BTreeMap, BTreeSet};
use tidemark_crdts::ReplicaId;

/// One epoch of an announcer: deadlines from the previous epoch's `to` (0 for the first) up
/// to `to` (exclusive) have the member set `members` (sorted, no duplicates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    /// End of the epoch's deadlines (exclusive), in ms.
    pub to: u64,
    /// The replicas the announcer vouched over for these deadlines.
    pub members: Vec<ReplicaId>,
}

/// A range of deadlines a node sealed: windows whose deadline is in `[from, to)` are final,
/// counting exactly the contributions of `members`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// First deadline of the range (ms).
    pub from: u64,
    /// End of the range, exclusive (ms).
    pub to: u64,
    /// The replicas whose contributions the sealed windows count (sorted).
    pub members: Vec<ReplicaId>,
}

/// The members `epochs` give deadline `d` (`None`: the announcer has not vouched past `d`).
pub fn membership(epochs: &[Epoch], d: u64) -> Option<&[ReplicaId]> {
    epochs
        .iter()
        .find(|e| d < e.to)
        .map(|e| e.members.as_slice())
}

/// `epochs` after vouching for `cw` over `members`: the deadlines in `[last to, cw)` get
/// `members` (the last epoch grows when its members are the same). `None` when `cw` adds
/// nothing.
pub fn extend(epochs: &[Epoch], cw: u64, mut members: Vec<ReplicaId>) -> Option<Vec<Epoch>> {
    let covered = epochs.last().map_or(0, |e| e.to);
    if cw <= covered {
        return None;
    }
    members.sort_unstable();
    members.dedup();
    let mut out = epochs.to_vec();
    match out.last_mut() {
        Some(last) if last.members == members => last.to = cw,
        _ => out.push(Epoch { to: cw, members }),
    }
    Some(out)
}

/// The members a node's seals count for deadline `d` (`None`: not sealed here). `sealed` is
/// ascending and disjoint, as a node builds its seals and as [`decode_sealed`] accepts them;
/// found by binary search, so checking every piece of a step against an announcer's n seals
/// costs O(log n) each, not O(n).
pub fn sealed_members(sealed: &[Sealed], d: u64) -> Option<&[ReplicaId]> {
    let at = sealed.partition_point(|s| s.to <= d);
    sealed
        .get(at)
        .filter(|s| s.from <= d)
        .map(|s| s.members.as_slice())
}

/// The deadline below which some other announcer fixed a membership of several replicas
/// without `me`: windows whose deadline is below it are sealed by that cluster without
/// `me`'s contributions, so `me` refuses events for them as late instead of applying what
/// that seal does not count. A lone node's own epochs (it vouched over itself alone: a node
/// started apart) bind nobody else and are left out, so one stranger far ahead cannot make a
/// cluster refuse events for its open windows.
pub fn excluded_to(epochs: &BTreeMap<ReplicaId, Vec<Epoch>>, me: ReplicaId) -> u64 {
    epochs
        .iter()
        .filter(|(r, _)| **r != me)
        .flat_map(|(_, es)| es.iter())
        .filter(|e| e.members.len() > 1 && e.members.binary_search(&me).is_err())
        .map(|e| e.to)
        .max()
        .unwrap_or(0)
}

/// Whether every seal of deadline `d` that counts an announcer also counts `me`, as far as
/// that announcer's announcement (`epochs`, and `met`: the peers it ever met) shows:
///
/// - its epochs fix a member set for `d`: `me` is in it (a seal of `d` counting the announcer
///   has exactly that set);
/// - they do not reach `d` yet: it already counts `me` as a member — `me` is in its last
///   epoch, or it met `me` (`my_peer`) — so every epoch it fixes from now on names `me`: a
///   node vouches only over every announcer and every peer it met (`cluster_watermark`),
///   neither of which it forgets (announcements stay in the state, peers met are announced),
///   until `me` is removed for good.
///
/// `None` epochs (a malformed or missing announcement) count nobody. A `members` remove by
/// `me` takes other replicas' dots of the element (observed-remove), which no seal can tell
/// apart from their own contributions: `me` applies it only when this holds for every
/// replica whose dot it would take (`Views::admit`), else refuses it as late
/// (`outside_seal`), so a node outside a seal never changes that seal's value.
pub fn counts_me(
    epochs: Option<&[Epoch]>,
    met: &[u64],
    me: ReplicaId,
    my_peer: u64,
    d: u64,
) -> bool {
    let Some(epochs) = epochs else {
        return false;
    };
    match membership(epochs, d) {
        Some(set) => set.binary_search(&me).is_ok(),
        None => {
            met.contains(&my_peer)
                || epochs
                    .last()
                    .is_some_and(|e| e.members.binary_search(&me).is_ok())
        }
    }
}

/// What one node's state says about a stream's seals.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Every announcer's epochs (this node's as it is about to announce them).
    pub epochs: BTreeMap<ReplicaId, Vec<Epoch>>,
    /// Announcers whose writes up to their announcement this node holds.
    pub held: BTreeSet<ReplicaId>,
    /// This node's seals so far.
    pub sealed: Vec<Sealed>,
    /// This node.
    pub me: ReplicaId,
    /// The watermark this node started from (`since`): it applied no event to a window whose
    /// deadline is below it, so for those deadlines it may adopt a seal that does not count
    /// it (a joining or restored node adopting its cluster's seals). 0 for a node that
    /// applied events from its start.
    pub since: u64,
    /// Every other announcer that is not decommissioned, with the watermark it started from
    /// (its announced `since`, or its watermark while it applied nothing): it may hold
    /// contributions to windows whose deadline is at or above it. A seal this node adopts
    /// (one without it) must count every announcer that may hold contributions there.
    pub since_of: BTreeMap<ReplicaId, u64>,
    /// Decommissioned announcers with the watermark they started from (as in `since_of`). No
    /// seal made from now on needs to count them, but one made before their removal by a
    /// member of this node's own set may count their contributions: this node keeps to its
    /// own set wherever one of them may have contributed ([`Ledger::agreed`]).
    pub gone_since: BTreeMap<ReplicaId, u64>,
    /// The seals every other announcer reported (its announced `sealed`), decommissioned ones
    /// too: what they reported final stays reported. This node seals no deadline with a set
    /// other than one any of them sealed it with ([`Ledger::agreed`]).
    pub sealed_of: BTreeMap<ReplicaId, Vec<Sealed>>,
    /// The end of this node's epochs as already staged for announcement before this step
    /// (0 for none): others may have read them, and a member of the set they fix may have
    /// sealed that set on them, so below it this node adopts no set without it.
    pub fixed_to: u64,
}

impl Ledger {
    /// This node's seals with every range it can seal now added (merged where adjacent with
    /// the same members); `None` when nothing new can be sealed.
    ///
    /// The deadlines are cut at every epoch boundary, seal edge and `since`, so on each piece every
    /// announcer gives one member set and the piece is wholly sealed or not. A piece is
    /// sealed with `S` when some announcer gives `S` and every member of `S` is held and gives
    /// exactly `S`.
    pub fn agree(&self) -> Option<Vec<Sealed>> {
        let mut cuts: BTreeSet<u64> = BTreeSet::new();
        cuts.insert(0);
        // Adoption is allowed below `since` only: a piece never straddles it.
        cuts.insert(self.since);
        for e in self.epochs.values().flatten() {
            cuts.insert(e.to);
        }
        for s in &self.sealed {
            cuts.insert(s.from);
            cuts.insert(s.to);
        }
        // Where another announcer started applying, whether a set leaves out a possible
        // contributor changes: a piece never straddles it either.
        cuts.extend(self.since_of.values().copied());
        cuts.extend(self.gone_since.values().copied());
        // Nor an edge of another announcer's seals, nor the end of this node's epochs as
        // announced before this step (adoption is allowed only above it).
        for s in self.sealed_of.values().flatten() {
            cuts.insert(s.from);
            cuts.insert(s.to);
        }
        cuts.insert(self.fixed_to);
        let cuts: Vec<u64> = cuts.into_iter().collect();
        let mut fresh = Vec::new();
        for w in cuts.windows(2) {
            let (from, to) = (w[0], w[1]);
            if sealed_members(&self.sealed, from).is_some() {
                continue;
            }
            if let Some(members) = self.agreed(from) {
                fresh.push(Sealed {
                    from,
                    to,
                    members: members.to_vec(),
                });
            }
        }
        if fresh.is_empty() {
            return None;
        }
        let mut all = self.sealed.clone();
        all.extend(fresh);
        all.sort_by_key(|s| s.from);
        let mut merged: Vec<Sealed> = Vec::with_capacity(all.len());
        for s in all {
            match merged.last_mut() {
                Some(last) if last.to == s.from && last.members == s.members => last.to = s.to,
                _ => merged.push(s),
            }
        }
        Some(merged)
    }

    /// The member set every member of which is held and announced exactly it for `d`: one
    /// counting this node, or — below the watermark this node started from, where it has no
    /// contribution — one without it that counts every announcer that may have contributed
    /// to `d` ([`Ledger::since_of`]), preferred there to one counting this node. (Two
    /// agreeing sets of one deadline share no replica: clusters started apart; at or above
    /// `since` this node keeps to its own.)
    fn agreed(&self, d: u64) -> Option<&[ReplicaId]> {
        let chosen = self.agreed_set(d)?;
        // Another announcer reported `d` final with a different set (a disjoint one: two
        // agreeing sets sharing a replica are equal): sealing `chosen` would report the same
        // windows final with a different value. Stay not final instead — e.g. a copy of an
        // older snapshot that applied events to windows its lost cluster sealed after the
        // snapshot, meeting a copy that adopted that cluster's seal
        // (`tests/views/seal_review.rs`).
        //
        // Except a member of `chosen` that another member already sealed it with: the
        // contradiction is there already (clusters started apart, each sealing before it saw
        // the other), and a member keeping the window not final would only part from its own
        // cluster too. A node adopting a set without it picks no side.
        let theirs = || {
            self.sealed_of
                .iter()
                .filter(|(x, _)| **x != self.me)
                .filter_map(|(_, seals)| sealed_members(seals, d))
        };
        let contradicts = theirs().any(|t| t != chosen);
        // Only a member's seal of `chosen` is its own cluster's: any other announcer's word
        // (a bogus or buggy one's) would turn a refusal into a contradiction.
        let joins_its_own = chosen.binary_search(&self.me).is_ok()
            && self.sealed_of.iter().any(|(x, seals)| {
                *x != self.me
                    && chosen.binary_search(x).is_ok()
                    && sealed_members(seals, d) == Some(chosen)
            });
        (!contradicts || joins_its_own).then_some(chosen)
    }

    /// The set [`Ledger::agreed`] would seal `d` with, before the check against the seals
    /// other announcers reported.
    fn agreed_set(&self, d: u64) -> Option<&[ReplicaId]> {
        let mut tried: Vec<&[ReplicaId]> = Vec::new();
        let mut adoptable = None;
        let mut mine = None;
        for epochs in self.epochs.values() {
            let Some(s) = membership(epochs, d) else {
                continue;
            };
            if s.is_empty() || tried.contains(&s) {
                continue;
            }
            tried.push(s);
            let agrees = s.iter().all(|m| {
                self.held.contains(m)
                    && self
                        .epochs
                        .get(m)
                        .and_then(|e| membership(e, d))
                        .is_some_and(|theirs| theirs == s)
            });
            if !agrees {
                continue;
            }
            if s.binary_search(&self.me).is_ok() {
                if d >= self.since {
                    return Some(s);
                }
                mine = mine.or(Some(s));
                continue;
            }
            // Adopt only a set that counts every announcer that may have contributed to `d`:
            // a seal some node made alone, before it met the cluster, is not this cluster's,
            // and adopting it would report a final value without acknowledged events.
            let counts_all = self
                .since_of
                .iter()
                .all(|(x, since)| *x == self.me || d < *since || s.binary_search(x).is_ok());
            // Not where this node's epochs already announced a set counting it that may
            // still be sealed: a member of it may have sealed it on them already, and this
            // node would contradict it.
            if d < self.since && adoptable.is_none() && counts_all && !self.announced_live(d) {
                adoptable = Some(s);
            }
        }
        // Below `since` this node contributed nothing: a set that counts it (its own epochs
        // over deadlines it never applied to, e.g. a restored copy that removed its lost
        // cluster and vouched over itself alone) gives the window without the contributions
        // an agreeing seal of its cluster counts, and that seal was reported final there. But
        // where another member of its own set may have contributed (removed since or not),
        // that member seals its own set: this node keeps to it too.
        match (adoptable, mine) {
            (Some(_), Some(m)) if self.others_may_have_contributed(m, d) => Some(m),
            (a, m) => a.or(m),
        }
    }

    /// Whether this node's epochs fixed `d`, before this step, to a set some node may seal:
    /// no member of it fixed `d` to another set (epochs never change, so a set one member
    /// gave otherwise is never sealed by anyone).
    fn announced_live(&self, d: u64) -> bool {
        if d >= self.fixed_to {
            return false;
        }
        let Some(mine) = self.epochs.get(&self.me).and_then(|e| membership(e, d)) else {
            return false;
        };
        !mine.iter().any(|m| {
            self.epochs
                .get(m)
                .and_then(|e| membership(e, d))
                .is_some_and(|theirs| theirs != mine)
        })
    }

    /// Whether a member of `set` other than this node may hold contributions to deadline
    /// `d`: it started applying at or below `d`, or its start is unknown here.
    fn others_may_have_contributed(&self, set: &[ReplicaId], d: u64) -> bool {
        set.iter().filter(|x| **x != self.me).any(|x| {
            self.since_of
                .get(x)
                .or_else(|| self.gone_since.get(x))
                .is_none_or(|since| *since <= d)
        })
    }
}

/// Most member entries one decoded list of epochs or seals may expand to (the sum of its
/// sets' sizes). The compact form ([`encode_epochs`]) writes each set as a difference against
/// the previous one, so a few bytes can stand for a large set: this bounds what one
/// announcement costs in memory (16 bytes an entry, 16 MiB at most) whatever its bytes say.
/// An announcer that joined and left the cluster as a member about 1,400 times in one
/// announcement would reach it; past it, its list decodes to an error (it agrees to nothing).
pub const EXPANDED_MEMBERS_MAX: usize = 1 << 20;

/// Why an announced list of epochs or seals, or a replica table, was refused. Such an
/// announcer's epochs agree to nothing (its seals are taken as none).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    /// Not the JSON shape of the form (`what` says which part).
    #[error("malformed {what}")]
    Shape {
        /// The part that is malformed.
        what: &'static str,
    },
    /// A replica id that is not 32 lowercase hex digits, or a table not strictly ascending.
    #[error("bad replica table entry {entry}")]
    Table {
        /// The position of the entry in the table.
        entry: usize,
    },
    /// A member index outside the replica table.
    #[error("member index {index} outside a table of {len}")]
    Index {
        /// The index given.
        index: u64,
        /// The table's length.
        len: usize,
    },
    /// A set difference that does not apply to the previous set: an index added that is
    /// already a member, removed that is not, or not strictly ascending.
    #[error("set difference does not apply at item {item}")]
    Diff {
        /// The position of the epoch or seal in its list.
        item: usize,
    },
    /// Epoch ends not strictly increasing, or seal ranges empty or overlapping.
    #[error("ranges out of order at item {item}")]
    Order {
        /// The position of the epoch or seal in its list.
        item: usize,
    },
    /// The sets would expand to more than [`EXPANDED_MEMBERS_MAX`] member entries.
    #[error("sets expand to more than {max} members")]
    TooManyMembers {
        /// [`EXPANDED_MEMBERS_MAX`].
        max: usize,
    },
}

fn shape(what: &'static str) -> FormError {
    FormError::Shape { what }
}

/// The replica table of the compact form: every replica named by `epochs` or `sealed`,
/// ascending, once.
pub fn table_of(epochs: &[Epoch], sealed: &[Sealed]) -> Vec<ReplicaId> {
    let all: BTreeSet<ReplicaId> = epochs
        .iter()
        .flat_map(|e| e.members.iter())
        .chain(sealed.iter().flat_map(|s| s.members.iter()))
        .copied()
        .collect();
    all.into_iter().collect()
}

/// The replica table as announced: `["replica id, 32 hex digits", ...]`, ascending.
pub fn encode_table(table: &[ReplicaId]) -> serde_json::Value {
    members_json(table)
}

/// A replica table as announced (strict: 32 lowercase hex digits each, strictly ascending).
///
/// # Errors
/// [`FormError`] naming what is wrong.
pub fn decode_table(v: &serde_json::Value) -> Result<Vec<ReplicaId>, FormError> {
    let items = v.as_array().ok_or(shape("replica table"))?;
    let mut out: Vec<ReplicaId> = Vec::with_capacity(items.len());
    for (entry, item) in items.iter().enumerate() {
        let id = item
            .as_str()
            .filter(|h| h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .and_then(|h| u128::from_str_radix(h, 16).ok())
            .map(ReplicaId)
            .ok_or(FormError::Table { entry })?;
        if out.last().is_some_and(|l| *l >= id) {
            return Err(FormError::Table { entry });
        }
        out.push(id);
    }
    Ok(out)
}

/// A member set sorted, without duplicates (the form every set is compared and diffed in).
fn normal(set: &[ReplicaId]) -> Vec<ReplicaId> {
    let mut out = set.to_vec();
    out.sort_unstable();
    out.dedup();
    out
}

/// `set` as the difference against `prev` (both sorted, no duplicates), in indexes of `table`
/// (which holds every member of both): `[added, removed]`, each ascending; `removed` left out
/// when empty.
fn diff_json(prev: &[ReplicaId], set: &[ReplicaId], table: &[ReplicaId]) -> Vec<serde_json::Value> {
    let index = |r: &ReplicaId| table.binary_search(r).unwrap_or(usize::MAX);
    let added: Vec<serde_json::Value> = set
        .iter()
        .filter(|m| prev.binary_search(m).is_err())
        .map(|m| index(m).into())
        .collect();
    let removed: Vec<serde_json::Value> = prev
        .iter()
        .filter(|m| set.binary_search(m).is_err())
        .map(|m| index(m).into())
        .collect();
    let mut out = vec![serde_json::Value::Array(added)];
    if !removed.is_empty() {
        out.push(serde_json::Value::Array(removed));
    }
    out
}

/// Applies a difference (`added`, optional `removed`, indexes of `table`) to `prev`.
fn apply_diff(
    prev: &[ReplicaId],
    added: &serde_json::Value,
    removed: Option<&serde_json::Value>,
    table: &[ReplicaId],
    item: usize,
) -> Result<Vec<ReplicaId>, FormError> {
    let ids = |v: &serde_json::Value| -> Result<Vec<ReplicaId>, FormError> {
        let mut out: Vec<ReplicaId> = Vec::new();
        for i in v.as_array().ok_or(shape("set difference"))? {
            let index = i.as_u64().ok_or(shape("member index"))?;
            let id = usize::try_from(index)
                .ok()
                .and_then(|x| table.get(x))
                .copied()
                .ok_or(FormError::Index {
                    index,
                    len: table.len(),
                })?;
            if out.last().is_some_and(|l| *l >= id) {
                return Err(FormError::Diff { item });
            }
            out.push(id);
        }
        Ok(out)
    };
    let added = ids(added)?;
    let removed = match removed {
        Some(r) => ids(r)?,
        None => Vec::new(),
    };
    if added.iter().any(|a| prev.binary_search(a).is_ok())
        || removed.iter().any(|r| prev.binary_search(r).is_err())
    {
        return Err(FormError::Diff { item });
    }
    let mut out: Vec<ReplicaId> = prev
        .iter()
        .filter(|m| removed.binary_search(m).is_err())
        .copied()
        .chain(added)
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Epochs in the compact form: `[[to, [added], [removed]], ...]`, each epoch's members as the
/// difference against the previous epoch's (the first against the empty set), in indexes of
/// `table` ([`table_of`]); `[removed]` left out when empty. A join adds one index, so the
/// form grows by a few bytes per membership change, not by the member set.
pub fn encode_epochs(epochs: &[Epoch], table: &[ReplicaId]) -> serde_json::Value {
    let mut prev: Vec<ReplicaId> = Vec::new();
    epochs
        .iter()
        .map(|e| {
            let set = normal(&e.members);
            let mut item = vec![serde_json::Value::from(e.to)];
            item.extend(diff_json(&prev, &set, table));
            prev = set;
            serde_json::Value::Array(item)
        })
        .collect()
}

/// Seals in the compact form: `[[from, to, [added], [removed]], ...]`, each seal's members as
/// the difference against the previous seal's, as [`encode_epochs`].
pub fn encode_sealed(sealed: &[Sealed], table: &[ReplicaId]) -> serde_json::Value {
    let mut prev: Vec<ReplicaId> = Vec::new();
    sealed
        .iter()
        .map(|s| {
            let set = normal(&s.members);
            let mut item = vec![
                serde_json::Value::from(s.from),
                serde_json::Value::from(s.to),
            ];
            item.extend(diff_json(&prev, &set, table));
            prev = set;
            serde_json::Value::Array(item)
        })
        .collect()
}

/// Counts `n` more expanded members against [`EXPANDED_MEMBERS_MAX`].
fn expand(total: &mut usize, n: usize) -> Result<(), FormError> {
    *total = total.saturating_add(n);
    if *total > EXPANDED_MEMBERS_MAX {
        return Err(FormError::TooManyMembers {
            max: EXPANDED_MEMBERS_MAX,
        });
    }
    Ok(())
}

/// Epochs in the compact form ([`encode_epochs`]) over `table`. Ends must strictly increase.
///
/// # Errors
/// [`FormError`] naming what is wrong; never panics on any input.
pub fn decode_epochs(v: &serde_json::Value, table: &[ReplicaId]) -> Result<Vec<Epoch>, FormError> {
    let items = v.as_array().ok_or(shape("epochs"))?;
    let mut out: Vec<Epoch> = Vec::with_capacity(items.len().min(4096));
    let mut total = 0usize;
    for (item, e) in items.iter().enumerate() {
        let parts = e.as_array().ok_or(shape("epoch"))?;
        let (to, added, removed) = match parts.as_slice() {
            [to, a] => (to, a, None),
            [to, a, r] => (to, a, Some(r)),
            _ => return Err(shape("epoch")),
        };
        let to = to.as_u64().ok_or(shape("epoch end"))?;
        if out.last().is_some_and(|l| l.to >= to) {
            return Err(FormError::Order { item });
        }
        let prev = out.last().map_or(&[][..], |l| l.members.as_slice());
        let members = apply_diff(prev, added, removed, table, item)?;
        expand(&mut total, members.len())?;
        out.push(Epoch { to, members });
    }
    Ok(out)
}

/// Seals in the compact form ([`encode_sealed`]) over `table`. Ranges must be non-empty and
/// ascending without overlap.
///
/// # Errors
/// [`FormError`] naming what is wrong; never panics on any input.
pub fn decode_sealed(v: &serde_json::Value, table: &[ReplicaId]) -> Result<Vec<Sealed>, FormError> {
    let items = v.as_array().ok_or(shape("seals"))?;
    let mut out: Vec<Sealed> = Vec::with_capacity(items.len().min(4096));
    let mut total = 0usize;
    for (item, s) in items.iter().enumerate() {
        let parts = s.as_array().ok_or(shape("seal"))?;
        let (from, to, added, removed) = match parts.as_slice() {
            [f, t, a] => (f, t, a, None),
            [f, t, a, r] => (f, t, a, Some(r)),
            _ => return Err(shape("seal")),
        };
        let (from, to) = (
            from.as_u64().ok_or(shape("seal start"))?,
            to.as_u64().ok_or(shape("seal end"))?,
        );
        if from >= to || out.last().is_some_and(|l| l.to > from) {
            return Err(FormError::Order { item });
        }
        let prev = out.last().map_or(&[][..], |l| l.members.as_slice());
        let members = apply_diff(prev, added, removed, table, item)?;
        expand(&mut total, members.len())?;
        out.push(Sealed { from, to, members });
    }
    Ok(out)
}

fn members_json(members: &[ReplicaId]) -> serde_json::Value {
    members.iter().map(|r| r.to_string()).collect()
}

/// Members in the first form (`["replica hex", ...]`, any order, duplicates merged).
fn parse_members_v1(v: &serde_json::Value) -> Result<Vec<ReplicaId>, FormError> {
    let mut out: Vec<ReplicaId> = v
        .as_array()
        .ok_or(shape("members"))?
        .iter()
        .enumerate()
        .map(|(entry, m)| {
            m.as_str()
                .and_then(|h| u128::from_str_radix(h, 16).ok())
                .map(ReplicaId)
                .ok_or(FormError::Table { entry })
        })
        .collect::<Result<_, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Epochs in the first form, written by earlier versions (`"e"` of an announcement): every
/// epoch with its whole member set, `[[to, ["replica hex", ...]], ...]`. Ends must strictly
/// increase. Still read from data directories and peers that wrote it; never written.
///
/// # Errors
/// [`FormError`] naming what is wrong; never panics on any input.
pub fn parse_epochs_v1(v: &serde_json::Value) -> Result<Vec<Epoch>, FormError> {
    let mut out: Vec<Epoch> = Vec::new();
    for (item, e) in v.as_array().ok_or(shape("epochs"))?.iter().enumerate() {
        let to = e
            .get(0)
            .and_then(serde_json::Value::as_u64)
            .ok_or(shape("epoch end"))?;
        if out.last().is_some_and(|l| l.to >= to) {
            return Err(FormError::Order { item });
        }
        out.push(Epoch {
            to,
            members: parse_members_v1(e.get(1).ok_or(shape("epoch"))?)?,
        });
    }
    Ok(out)
}

/// Seals in the first form (`"f"` of an announcement by earlier versions):
/// `[[from, to, ["replica hex", ...]], ...]`. Ranges must be non-empty and ascending without
/// overlap. Still read; never written.
///
/// # Errors
/// [`FormError`] naming what is wrong; never panics on any input.
pub fn parse_sealed_v1(v: &serde_json::Value) -> Result<Vec<Sealed>, FormError> {
    let mut out: Vec<Sealed> = Vec::new();
    for (item, s) in v.as_array().ok_or(shape("seals"))?.iter().enumerate() {
        let (from, to) = (
            s.get(0)
                .and_then(serde_json::Value::as_u64)
                .ok_or(shape("seal start"))?,
            s.get(1)
                .and_then(serde_json::Value::as_u64)
                .ok_or(shape("seal end"))?,
        );
        if from >= to || out.last().is_some_and(|l| l.to > from) {
            return Err(FormError::Order { item });
        }
        out.push(Sealed {
            from,
            to,
            members: parse_members_v1(s.get(2).ok_or(shape("seal"))?)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u128) -> ReplicaId {
        ReplicaId(n)
    }

    /// The binary search finds what a scan of the seals finds, for every deadline around
    /// ascending, disjoint ranges with and without gaps (adjacent ranges, one-deadline ranges,
    /// none).
    #[test]
    fn sealed_members_matches_a_scan() {
        let scan = |sealed: &[Sealed], d: u64| {
            sealed
                .iter()
                .find(|s| s.from <= d && d < s.to)
                .map(|s| s.members.clone())
        };
        let mut rng = crate::store::test_rng::Rng(0x5eed);
        let mut next = |m: u64| rng.below(m);
        for _ in 0..200 {
            let mut sealed = Vec::new();
            let mut at = next(3);
            for i in 0..next(12) {
                let from = at + next(3); // a gap of 0–2
                let to = from + 1 + next(4);
                sealed.push(Sealed {
                    from,
                    to,
                    members: vec![r(u128::from(i))],
                });
                at = to;
            }
            for d in 0..at + 3 {
                assert_eq!(
                    sealed_members(&sealed, d).map(<[ReplicaId]>::to_vec),
                    scan(&sealed, d),
                    "deadline {d} in {sealed:?}"
                );
            }
        }
    }

    fn ledger(epochs: &[(u128, Vec<Epoch>)], held: &[u128]) -> Ledger {
        Ledger {
            epochs: epochs.iter().cloned().map(|(k, v)| (r(k), v)).collect(),
            held: held.iter().map(|&h| r(h)).collect(),
            sealed: Vec::new(),
            me: r(1),
            since: 0,
            since_of: BTreeMap::new(),
            gone_since: BTreeMap::new(),
            sealed_of: BTreeMap::new(),
            fixed_to: 0,
        }
    }

    fn ep(to: u64, members: &[u128]) -> Epoch {
        Epoch {
            to,
            members: members.iter().map(|&m| r(m)).collect(),
        }
    }

    #[test]
    fn membership_is_fixed_once_announced() {
        let e = extend(&[], 100, vec![r(2), r(1)]).expect("new");
        assert_eq!(membership(&e, 99), Some(&[r(1), r(2)][..]));
        assert_eq!(membership(&e, 100), None);
        // A third member joins: deadlines below 100 keep their set.
        let e2 = extend(&e, 150, vec![r(1), r(2), r(3)]).expect("grows");
        assert_eq!(membership(&e2, 50), Some(&[r(1), r(2)][..]));
        assert_eq!(membership(&e2, 120), Some(&[r(1), r(2), r(3)][..]));
        assert_eq!(extend(&e2, 150, vec![r(1)]), None, "nothing new below 150");
        // The same members again: the last epoch grows, no new epoch.
        let e3 = extend(&e2, 200, vec![r(3), r(2), r(1)]).expect("grows");
        assert_eq!(e3.len(), 2);
        let table = table_of(&e3, &[]);
        let text = encode_epochs(&e3, &table);
        assert_eq!(decode_epochs(&text, &table), Ok(e3));
    }

    #[test]
    fn a_window_seals_only_when_every_member_gives_the_same_set() {
        // 1 and 2 both vouched past 100 over {1, 2}: sealed.
        let l = ledger(
            &[(1, vec![ep(100, &[1, 2])]), (2, vec![ep(120, &[1, 2])])],
            &[1, 2],
        );
        let s = l.agree().expect("sealed");
        assert_eq!(
            s,
            vec![Sealed {
                from: 0,
                to: 100,
                members: vec![r(1), r(2)]
            }]
        );
        // 2 not held yet: nothing.
        let l = ledger(
            &[(1, vec![ep(100, &[1, 2])]), (2, vec![ep(120, &[1, 2])])],
            &[1],
        );
        assert_eq!(l.agree(), None);
        // 1 fixed {1, 2} for d < 100 before it met 3; 2 fixed {1, 2, 3}: no set agrees.
        let l = ledger(
            &[
                (1, vec![ep(100, &[1, 2])]),
                (2, vec![ep(100, &[1, 2, 3])]),
                (3, vec![ep(100, &[1, 2, 3])]),
            ],
            &[1, 2, 3],
        );
        assert_eq!(l.agree(), None);
    }

    #[test]
    fn a_joined_node_adopts_older_seals_and_a_lone_seal_is_adopted_by_nobody() {
        // 1 and 2 sealed d < 100 over {1, 2}; 3 joined at watermark 100 and vouches from
        // there on with all three. Node 3 adopts the old range over {1, 2} (it applied
        // nothing below 100) and seals the new one over all three once each gives it.
        let epochs = [
            (1, vec![ep(100, &[1, 2]), ep(150, &[1, 2, 3])]),
            (2, vec![ep(100, &[1, 2]), ep(160, &[1, 2, 3])]),
            (3, vec![ep(170, &[1, 2, 3])]),
        ];
        let mut l = ledger(&epochs, &[1, 2, 3]);
        l.me = r(3);
        l.since = 100;
        let s = l.agree().expect("sealed");
        assert_eq!(sealed_members(&s, 10), Some(&[r(1), r(2)][..]));
        assert_eq!(sealed_members(&s, 120), Some(&[r(1), r(2), r(3)][..]));
        assert_eq!(sealed_members(&s, 150), None, "1 vouched only up to 150");
        l.sealed = s.clone();
        assert_eq!(l.agree(), None, "nothing new");
        let table = table_of(&[], &s);
        let text = encode_sealed(&s, &table);
        assert_eq!(decode_sealed(&text, &table), Ok(s));
        // Started at 50 instead, node 3 adopts nothing at or above 50.
        l.sealed.clear();
        l.since = 50;
        let s = l.agree().expect("sealed");
        assert_eq!(sealed_members(&s, 49), Some(&[r(1), r(2)][..]));
        assert_eq!(sealed_members(&s, 50), None);
        // A node alone sealed d < 100 over {4}: node 1, which applies events from its start,
        // keeps its own cluster's windows open rather than count them by a stranger's seal.
        let l = ledger(
            &[
                (1, vec![ep(60, &[1, 2])]),
                (2, vec![ep(60, &[1, 2])]),
                (4, vec![ep(100, &[4])]),
            ],
            &[1, 2, 4],
        );
        let s = l.agree().expect("sealed");
        assert_eq!(sealed_members(&s, 10), Some(&[r(1), r(2)][..]));
        assert_eq!(sealed_members(&s, 70), None, "{{4}} is not adopted");
    }

    #[test]
    fn below_its_start_a_copy_adopts_its_clusters_seal_over_its_own_lone_epochs() {
        // 1 and 2 sealed d < 60 over {1, 2}, then were removed for good. Copy 7 (a restored
        // copy of 1, started at watermark 100, applying nothing below it) vouched over itself
        // alone from 0 to 200. Below 100 it adopts {1, 2}: sealing {7} there would report the
        // windows 1 and 2 reported final without their contributions.
        let mut l = ledger(
            &[
                (1, vec![ep(60, &[1, 2])]),
                (2, vec![ep(60, &[1, 2])]),
                (7, vec![ep(200, &[7])]),
            ],
            &[1, 2, 7],
        );
        l.me = r(7);
        l.since = 100;
        let s = l.agree().expect("sealed");
        assert_eq!(sealed_members(&s, 10), Some(&[r(1), r(2)][..]));
        assert_eq!(
            sealed_members(&s, 70),
            Some(&[r(7)][..]),
            "nothing to adopt there"
        );
        assert_eq!(sealed_members(&s, 150), Some(&[r(7)][..]));
        // Applying from its start (since 0), it keeps to its own set everywhere.
        l.since = 0;
        let s = l.agree().expect("sealed");
        assert_eq!(sealed_members(&s, 10), Some(&[r(7)][..]));
    }

    #[test]
    fn a_seal_leaving_out_an_announcer_that_applied_there_is_not_adopted() {
        // 1 and 2 sealed d < 100 over {1, 2}; 4 sealed d < 100 alone (it ran apart, applying
        // from its start, and joined later). Node 5 joined at 100: it adopts neither below
        // 60, since each set leaves out an announcer that may have contributed there.
        let epochs = [
            (1, vec![ep(60, &[1, 2])]),
            (2, vec![ep(60, &[1, 2])]),
            (4, vec![ep(100, &[4])]),
            (5, vec![ep(170, &[1, 2, 4, 5])]),
        ];
        let mut l = ledger(&epochs, &[1, 2, 4, 5]);
        l.me = r(5);
        l.since = 100;
        l.since_of = [(r(1), 0), (r(2), 0), (r(4), 0)].into_iter().collect();
        assert_eq!(l.agree(), None, "neither seal counts every contributor");
        // 4 applied only from 80 on (it joined, then applied): below 60 {1, 2} counts every
        // announcer that may have contributed, and is adopted; {4} over [60, 100) is not.
        l.since_of.insert(r(4), 80);
        let s = l.agree().expect("sealed");
        assert_eq!(sealed_members(&s, 10), Some(&[r(1), r(2)][..]));
        assert_eq!(sealed_members(&s, 70), None);
        assert_eq!(sealed_members(&s, 90), None, "{{4}} leaves out 1 and 2");
        // A later joiner (6, from 120) contributes nothing below 60: no obstacle.
        l.since_of.insert(r(6), 120);
        assert_eq!(l.agree(), Some(s));
    }

    #[test]
    fn an_announcer_counts_me_only_where_its_sets_name_me_or_it_met_me() {
        let e = vec![ep(100, &[1, 2]), ep(200, &[1, 2, 3])];
        // Fixed sets: exactly what they say.
        assert!(!counts_me(Some(&e), &[], r(3), 33, 50));
        assert!(counts_me(Some(&e), &[], r(3), 33, 150));
        // Beyond the epochs: named in the last one, or met.
        assert!(counts_me(Some(&e), &[], r(3), 33, 250));
        assert!(!counts_me(Some(&e), &[], r(4), 44, 250));
        assert!(counts_me(Some(&e), &[44], r(4), 44, 250));
        assert!(
            !counts_me(Some(&e), &[44], r(4), 44, 150),
            "met after the set was fixed"
        );
        assert!(counts_me(Some(&[]), &[44], r(4), 44, 5));
        assert!(!counts_me(Some(&[]), &[], r(4), 44, 5));
        assert!(!counts_me(None, &[44], r(4), 44, 5));
    }

    #[test]
    fn malformed_announcements_agree_to_nothing() {
        use serde_json::json;
        // The first form.
        assert!(parse_epochs_v1(&json!([[5, []], [5, []]])).is_err());
        assert!(parse_epochs_v1(&json!([[5, ["zz"]]])).is_err());
        assert!(parse_sealed_v1(&json!([[5, 5, []]])).is_err());
        assert!(parse_sealed_v1(&json!([[0, 9, []], [5, 10, []]])).is_err());
        assert!(parse_epochs_v1(&json!({"a": 1})).is_err());
        // The compact form.
        let t = vec![r(1), r(2), r(3)];
        let ok = json!([[5, [0, 1]], [9, [2], [0]]]);
        assert_eq!(
            decode_epochs(&ok, &t),
            Ok(vec![ep(5, &[1, 2]), ep(9, &[2, 3])])
        );
        for bad in [
            json!([[5, [3]]]),               // index outside the table
            json!([[5, [1, 0]]]),            // not ascending
            json!([[5, [0, 0]]]),            // twice
            json!([[5, [0]], [9, [0]]]),     // added, already a member
            json!([[5, [0]], [9, [], [1]]]), // removed, not a member
            json!([[5, [0]], [5, [1]]]),     // ends not increasing
            json!([[5, [-1]]]),
            json!([[5, [0.5]]]),
            json!([[5, [18_446_744_073_709_551_615_u64]]]),
            json!([[5]]),
            json!([[5, [0], [], []]]),
            json!([["5", [0]]]),
            json!({"5": [0]}),
        ] {
            assert!(decode_epochs(&bad, &t).is_err(), "{bad}");
        }
        assert!(decode_sealed(&json!([[5, 5, [0]]]), &t).is_err());
        assert!(decode_sealed(&json!([[0, 9, [0]], [5, 10, []]]), &t).is_err());
        assert!(decode_sealed(&json!([[0, 9, [7]]]), &t).is_err());
        // Tables: 32 lowercase hex digits, strictly ascending.
        let id = |n: u128| serde_json::Value::from(ReplicaId(n).to_string());
        assert_eq!(decode_table(&json!([id(1), id(2)])), Ok(vec![r(1), r(2)]));
        assert!(decode_table(&json!([id(2), id(1)])).is_err());
        assert!(decode_table(&json!([id(1), id(1)])).is_err());
        assert!(decode_table(&json!(["1"])).is_err());
        assert!(decode_table(&json!([id(10).as_str().map(str::to_uppercase)])).is_err());
        assert!(decode_table(&json!([format!("+{}", &ReplicaId(1).to_string()[1..])])).is_err());
    }

    #[test]
    fn a_few_bytes_cannot_expand_to_unbounded_sets() {
        // 2,000 members added once, then 2,000 epochs that each toggle one member: a few
        // bytes per epoch, but 2,000 × ~2,000 expanded members. Refused, not allocated.
        let table: Vec<ReplicaId> = (0..2_000u128).map(r).collect();
        let mut items = vec![serde_json::json!([1, (0..2_000).collect::<Vec<u64>>()])];
        for i in 0..2_000u64 {
            items.push(serde_json::json!([i * 2 + 2, [], [0]]));
            items.push(serde_json::json!([i * 2 + 3, [0]]));
        }
        let v = serde_json::Value::Array(items);
        assert_eq!(
            decode_epochs(&v, &table),
            Err(FormError::TooManyMembers {
                max: EXPANDED_MEMBERS_MAX
            })
        );
    }

    #[test]
    fn the_compact_form_round_trips_joins_and_removals() {
        let mut epochs = Vec::new();
        let mut members = vec![r(7)];
        for n in 0..20u128 {
            members.push(r(1000 - n));
            if n % 5 == 4 {
                members.remove(1); // a member decommissioned
            }
            epochs = extend(&epochs, (n as u64 + 1) * 10, members.clone()).expect("grows");
        }
        let sealed: Vec<Sealed> = epochs
            .iter()
            .scan(0, |from, e| {
                let s = Sealed {
                    from: *from,
                    to: e.to,
                    members: e.members.clone(),
                };
                *from = e.to;
                Some(s)
            })
            .collect();
        let table = table_of(&epochs, &sealed);
        assert_eq!(
            decode_epochs(&encode_epochs(&epochs, &table), &table),
            Ok(epochs)
        );
        assert_eq!(
            decode_sealed(&encode_sealed(&sealed, &table), &table),
            Ok(sealed)
        );
    }
}
