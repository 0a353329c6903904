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

/// The members a node's seals count for deadline `d` (`None`: not sealed here).
pub fn sealed_members(sealed: &[Sealed], d: u64) -> Option<&[ReplicaId]> {
    sealed
        .iter()
        .find(|s| s.from <= d && d < s.to)
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
    /// contribution — one without it. (Two agreeing sets of one deadline share no replica:
    /// clusters started apart; this node keeps to its own.)
    fn agreed(&self, d: u64) -> Option<&[ReplicaId]> {
        let mut tried: Vec<&[ReplicaId]> = Vec::new();
        let mut adoptable = None;
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
                return Some(s);
            }
            if d < self.since && adoptable.is_none() {
                adoptable = Some(s);
            }
        }
        adoptable
    }
}

/// Epochs as announced: `[[to, ["replica hex", ...]], ...]`.
pub fn epochs_json(epochs: &[Epoch]) -> serde_json::Value {
    epochs
        .iter()
        .map(|e| serde_json::json!([e.to, members_json(&e.members)]))
        .collect()
}

/// Seals as announced: `[[from, to, ["replica hex", ...]], ...]`.
pub fn sealed_json(sealed: &[Sealed]) -> serde_json::Value {
    sealed
        .iter()
        .map(|s| serde_json::json!([s.from, s.to, members_json(&s.members)]))
        .collect()
}

fn members_json(members: &[ReplicaId]) -> serde_json::Value {
    members.iter().map(|r| r.to_string()).collect()
}

fn parse_members(v: &serde_json::Value) -> Option<Vec<ReplicaId>> {
    let mut out: Vec<ReplicaId> = v
        .as_array()?
        .iter()
        .map(|m| {
            m.as_str()
                .and_then(|h| u128::from_str_radix(h, 16).ok())
                .map(ReplicaId)
        })
        .collect::<Option<_>>()?;
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Announced epochs (`None` when malformed: such an announcer agrees to nothing). Epochs
/// must have strictly increasing ends.
pub fn parse_epochs(v: &serde_json::Value) -> Option<Vec<Epoch>> {
    let mut out: Vec<Epoch> = Vec::new();
    for e in v.as_array()? {
        let to = e.get(0)?.as_u64()?;
        if out.last().is_some_and(|l| l.to >= to) {
            return None;
        }
        out.push(Epoch {
            to,
            members: parse_members(e.get(1)?)?,
        });
    }
    Some(out)
}

/// Announced seals (`None` when malformed). Ranges must be non-empty and ascending without
/// overlap.
pub fn parse_sealed(v: &serde_json::Value) -> Option<Vec<Sealed>> {
    let mut out: Vec<Sealed> = Vec::new();
    for s in v.as_array()? {
        let (from, to) = (s.get(0)?.as_u64()?, s.get(1)?.as_u64()?);
        if from >= to || out.last().is_some_and(|l| l.to > from) {
            return None;
        }
        out.push(Sealed {
            from,
            to,
            members: parse_members(s.get(2)?)?,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u128) -> ReplicaId {
        ReplicaId(n)
    }

    fn ledger(epochs: &[(u128, Vec<Epoch>)], held: &[u128]) -> Ledger {
        Ledger {
            epochs: epochs.iter().cloned().map(|(k, v)| (r(k), v)).collect(),
            held: held.iter().map(|&h| r(h)).collect(),
            sealed: Vec::new(),
            me: r(1),
            since: 0,
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
        let text = epochs_json(&e3);
        assert_eq!(parse_epochs(&text), Some(e3));
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
        let text = sealed_json(&s);
        assert_eq!(parse_sealed(&text), Some(s));
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
    fn malformed_announcements_agree_to_nothing() {
        assert_eq!(parse_epochs(&serde_json::json!([[5, []], [5, []]])), None);
        assert_eq!(parse_epochs(&serde_json::json!([[5, ["zz"]]])), None);
        assert_eq!(parse_sealed(&serde_json::json!([[5, 5, []]])), None);
        assert_eq!(
            parse_sealed(&serde_json::json!([[0, 9, []], [5, 10, []]])),
            None
        );
        assert_eq!(parse_epochs(&serde_json::json!({"a": 1})), None);
    }
}
