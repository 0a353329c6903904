//! Contributions a seal leaves out, kept in the late lane.
//!
//! A sealed window counts exactly its seal's members' contributions (`seal.rs`). A view cell
//! can hold others too: a member decommissioned before the window was sealed, a node that
//! ran apart and merged later, a copy restored under a new identity. Their events were
//! acknowledged by the node that took them, so the cells keep them (the state converges as
//! ever) and each node that seals the window records, once per contributing replica and
//! growth, what the seal leaves out in the stream's late lane (`reason: "outside_seal"`, with
//! `contribution` instead of `event`): nothing a client sent and was acknowledged disappears
//! without a trace.
//!
//! Which cells are audited, each maintenance round ([`Views::audit_round`]):
//! - per windowed view, a scan in key order (window start ascending) over cells of sealed
//!   windows, resuming where the last round stopped, at most [`SCAN_BATCH`] cells a round;
//!   it starts from the beginning at open and whenever a newly committed seal covers a
//!   window the scan already passed;
//! - the cells a remote delta or state chunk changed since the last round
//!   ([`Views::remote_changed`], told by the writer after each commit), when their window is
//!   sealed: what arrives after the seal.
//!
//! A session view's cells sort by group, then event time, so its scan reads every cell and
//! audits the sealed ones, and starts a new pass from the beginning when it reached the end
//! and something was sealed since its pass began.
//!
//! A record carries a mark (the greatest seq of the replica's dots it covers) written in the
//! same transaction (`store::LateMark`), so a round after a restart, or a cell audited by both
//! paths, records nothing twice; a replica whose contribution grows later (a counter's dot
//! replaced by a greater one) is recorded again with its whole contribution, which supersedes
//! the earlier record. Marks go with their cell's row when retention purges it.

use super::keys;
use super::read::{announcement_of, to_json};
use super::seal::{self, Sealed};
use super::{CompiledView, Views};
use crate::error::Error;
use crate::store::{LateMark, LateNote, LocalWrite, Reader};
use std::collections::{BTreeMap, BTreeSet};
use tidemark_crdts::{DotStore, Key, ReplicaId};

/// Most cells the sealed-window scan reads per view and round.
pub const SCAN_BATCH: usize = 1_024;

/// Most records one round writes; the rest wait for the next round.
pub const NOTES_MAX: usize = 1_000;

/// Most changed cells remembered between rounds; past it the scan starts over instead.
pub const DIRTY_MAX: usize = 65_536;

/// What the audit remembers between rounds (in memory: a restart scans again, and the marks
/// keep it from recording anything twice).
#[derive(Debug, Default)]
pub(crate) struct AuditState {
    /// Cells remote joins changed since the last round.
    dirty: BTreeSet<Key>,
    /// More than [`DIRTY_MAX`] changed: every view's scan starts over.
    overflow: bool,
    /// View index → the cell name the scan resumes after (`None`: from the start).
    cursors: BTreeMap<usize, String>,
    /// Stream → the seals the scans last ran under.
    seen: BTreeMap<String, Vec<Sealed>>,
    /// Session views whose scan starts a new pass when it reaches the end: something was
    /// sealed since their pass began (their cells sort by group, not by time, so a pass
    /// cannot stop at the first cell not sealed).
    new_pass: BTreeSet<usize>,
}

impl Views {
    /// Tells the audit that a remote join changed `key` (called on the writer thread after
    /// the commit): a cell of a windowed view is audited at the next round if its window is
    /// sealed then.
    pub(crate) fn remote_changed(&self, key: &Key) {
        let Some((name, digest, Some(start))) = keys::cell_of(&key.name) else {
            return;
        };
        let Some((vi, view)) = self.find(name) else {
            return;
        };
        let Some(window) = view.window else {
            return;
        };
        // A window not sealed at the last round is still ahead of that view's scan.
        let top = self
            .audit_tops
            .get(vi)
            .map_or(0, |t| t.load(std::sync::atomic::Ordering::Acquire));
        if view.digest != digest || window.deadline(start) >= top {
            return;
        }
        if let Ok(mut a) = self.audit.lock() {
            if a.dirty.len() >= DIRTY_MAX {
                a.overflow = true;
            } else {
                a.dirty.insert(key.clone());
            }
        }
    }

    /// One audit round: the late-lane records (each a write of its own, with its mark) of the
    /// contributions sealed windows leave out that no record covers yet. Queue them all and
    /// wait for them before the next round.
    ///
    /// # Errors
    /// Storage failures; [`Error::Closed`] on a poisoned lock.
    pub(crate) fn audit_round(
        &self,
        reader: &Reader,
        me: ReplicaId,
        now_ms: u64,
    ) -> Result<Vec<LocalWrite>, Error> {
        let mut sealed: BTreeMap<String, Vec<Sealed>> = BTreeMap::new();
        for stream in self.windowed_streams() {
            let s = announcement_of(reader, &keys::wm_key(&stream, me))?
                .map(|a| a.sealed)
                .unwrap_or_default();
            sealed.insert(stream, s);
        }
        let (dirty, mut cursors, mut new_pass) = {
            let mut a = self.audit.lock().map_err(|_| Error::Closed)?;
            if std::mem::take(&mut a.overflow) {
                a.cursors.clear();
            }
            for (stream, now) in &sealed {
                let before = a.seen.get(stream).cloned().unwrap_or_default();
                if let Some(low) = newly_sealed_from(&before, now) {
                    let a = &mut *a;
                    self.rewind(&mut a.cursors, &mut a.new_pass, stream, low);
                }
                a.seen.insert(stream.clone(), now.clone());
            }
            (
                std::mem::take(&mut a.dirty),
                a.cursors.clone(),
                std::mem::take(&mut a.new_pass),
            )
        };
        let mut round = Round {
            reader,
            me,
            now_ms,
            notes: Vec::new(),
        };
        let mut audited: BTreeSet<Key> = BTreeSet::new();
        for (vi, view) in self.views.iter().enumerate() {
            let Some(window) = view.window else {
                continue;
            };
            let session = window.session_gap_ms.is_some();
            let Some(seals) = sealed.get(&view.def.stream) else {
                continue;
            };
            let Some(top) = seals.iter().map(|s| s.to).max() else {
                continue;
            };
            if let Some(t) = self.audit_tops.get(vi) {
                t.store(top, std::sync::atomic::Ordering::Release);
            }
            let kind = super::read::key_kind(view.def.kind);
            let prefix = keys::view_prefix(&view.def.name, &view.digest);
            let mut after = cursors.get(&vi).cloned();
            let mut scanned = 0;
            'scan: while scanned < SCAN_BATCH && round.notes.len() < NOTES_MAX {
                // Names only: a cell's value is read if it is audited, and the scan often
                // stops at the first cell not sealed.
                let page = reader.list_keys(kind, &prefix, after.as_deref(), 256)?;
                let done = page.len() < 256;
                for key in page {
                    let Some((start, group)) = cell_parts(view, &key.name) else {
                        after = Some(key.name);
                        continue;
                    };
                    let deadline = window.deadline(start);
                    if deadline >= top && !session {
                        break 'scan; // not sealed yet: the scan waits here
                    }
                    if self.audit_if_sealed(&mut round, vi, &key, start, group, seals)? {
                        audited.insert(key.clone());
                    }
                    after = Some(key.name);
                    scanned += 1;
                    if scanned >= SCAN_BATCH || round.notes.len() >= NOTES_MAX {
                        break 'scan;
                    }
                }
                if done {
                    if session && new_pass.remove(&vi) {
                        after = None; // the next round starts a new pass
                        cursors.remove(&vi);
                    }
                    break;
                }
            }
            if let Some(a) = after {
                cursors.insert(vi, a);
            }
        }
        let mut left = Vec::new();
        for key in dirty.difference(&audited) {
            if round.notes.len() >= NOTES_MAX {
                left.push(key.clone());
                continue;
            }
            let Some((name, _, Some(start))) = keys::cell_of(&key.name) else {
                continue;
            };
            let Some((vi, view)) = self.find(name) else {
                continue;
            };
            let (Some(seals), Some((_, group))) =
                (sealed.get(&view.def.stream), cell_parts(view, &key.name))
            else {
                continue;
            };
            // Not sealed: the scan reaches it once it is.
            self.audit_if_sealed(&mut round, vi, key, start, group, seals)?;
        }
        // Rounds run one at a time (`Views::auditing`): only an overflow can have come
        // since this round began, and it clears the cursors at the next one.
        let mut a = self.audit.lock().map_err(|_| Error::Closed)?;
        a.cursors = cursors;
        a.new_pass.extend(new_pass);
        for key in left {
            if a.dirty.len() >= DIRTY_MAX {
                a.overflow = true;
                break;
            }
            a.dirty.insert(key);
        }
        drop(a);
        Ok(round
            .notes
            .into_iter()
            .map(|late| LocalWrite {
                late: Some(late),
                ..LocalWrite::default()
            })
            .collect())
    }

    /// The records of a round were not written (the writer refused or failed them): every
    /// scan starts over, so the cells they covered are audited again.
    pub(crate) fn audit_lost(&self) {
        if let Ok(mut a) = self.audit.lock() {
            a.overflow = true;
        }
    }

    /// Restarts the scans of `stream`'s views whose cursor passed deadline `low`; a session
    /// view's scan starts a new pass once the current one ends.
    fn rewind(
        &self,
        cursors: &mut BTreeMap<usize, String>,
        new_pass: &mut BTreeSet<usize>,
        stream: &str,
        low: u64,
    ) {
        for (vi, view) in self.views.iter().enumerate() {
            let Some(window) = view.window else { continue };
            if view.def.stream != stream {
                continue;
            }
            if window.session_gap_ms.is_some() {
                new_pass.insert(vi);
                continue;
            }
            let passed = cursors
                .get(&vi)
                .and_then(|c| keys::cell_of(c))
                .and_then(|(_, _, start)| start)
                .is_some_and(|s| window.deadline(s) >= low);
            if passed {
                cursors.remove(&vi);
            }
        }
    }

    /// Audits `key`, a cell of view `vi` at `start` (its window's start, or a session cell's
    /// event time) with `group`, when `seals` seal its window and retention has not removed
    /// it; whether it did.
    fn audit_if_sealed(
        &self,
        round: &mut Round<'_>,
        vi: usize,
        key: &Key,
        start: u64,
        group: Vec<serde_json::Value>,
        seals: &[Sealed],
    ) -> Result<bool, Error> {
        let Some(view) = self.views.get(vi) else {
            return Ok(false);
        };
        let Some(window) = view.window else {
            return Ok(false);
        };
        let Some(members) = seal::sealed_members(seals, window.deadline(start)) else {
            return Ok(false);
        };
        if self
            .horizon(&view.def.stream)
            .is_some_and(|h| self.expired(vi, start, h))
        {
            return Ok(false);
        }
        let cell = Cell {
            view,
            start,
            group,
            members,
        };
        record_outside(round, key, &cell)?;
        Ok(true)
    }
}

/// What one audit round reads from and records.
struct Round<'r> {
    reader: &'r Reader,
    me: ReplicaId,
    now_ms: u64,
    notes: Vec<LateNote>,
}

/// Records of the contributions to `key` (a cell of a sealed window) from replicas outside
/// the seal that no record covers yet.
fn record_outside(round: &mut Round<'_>, key: &Key, cell: &Cell<'_>) -> Result<(), Error> {
    let (reader, me, now_ms) = (round.reader, round.me, round.now_ms);
    let Some(entry) = reader.entry(key)? else {
        return Ok(());
    };
    let mut outside: BTreeMap<ReplicaId, u64> = BTreeMap::new();
    entry.for_each_dot(&mut |d| {
        if cell.members.binary_search(&d.replica).is_err() {
            let top = outside.entry(d.replica).or_default();
            *top = (*top).max(d.seq);
        }
    });
    for (replica, seq) in outside {
        if reader
            .late_mark(&key.name, replica)?
            .is_some_and(|m| m >= seq)
        {
            continue;
        }
        let part = entry.retain_replicas(|r| r == replica);
        let d = &cell.view.def;
        // A session view's cell is one event time: no window of its own.
        let window_end = cell
            .view
            .window
            .filter(|w| w.session_gap_ms.is_none())
            .map(|w| cell.start.saturating_add(w.size_ms));
        let group: serde_json::Map<String, serde_json::Value> =
            d.group_by.iter().cloned().zip(cell.group.clone()).collect();
        let mut contribution = serde_json::json!({
            "view": d.name,
            "group": group,
            "window_start": cell.start,
            "window_end": window_end,
            "seq": seq,
        });
        let (value, cut) = bounded_value(to_json(d.kind, &part.value()));
        if let Some(c) = contribution.as_object_mut() {
            c.insert("value".into(), value);
            c.extend(cut);
        }
        let record = serde_json::json!({
            "contribution": contribution,
            "views": [d.name],
            "reason": "outside_seal",
            "sealed_members": cell.members.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "node": replica.to_string(),
            "recorded_by": me.to_string(),
            "watermark": serde_json::Value::Null,
            "received_ms": now_ms,
        });
        round.notes.push(LateNote {
            stream: d.stream.clone(),
            record: record.to_string(),
            mark: Some(LateMark {
                key: key.name.clone(),
                replica,
                seq,
            }),
        });
    }
    Ok(())
}

/// Most bytes of JSON a contribution record keeps of the value.
pub const VALUE_BYTES_MAX: usize = 16 * 1024;

/// `value` within [`VALUE_BYTES_MAX`], and what was cut: a list keeps its first elements
/// (`elements`: how many it holds), any other value too large is left out (`null`;
/// `value_bytes`: its size).
fn bounded_value(
    mut value: serde_json::Value,
) -> (serde_json::Value, Option<(String, serde_json::Value)>) {
    let size = |v: &serde_json::Value| serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
    let total = size(&value);
    if total <= VALUE_BYTES_MAX {
        return (value, None);
    }
    if let serde_json::Value::Array(items) = &mut value {
        let n = items.len();
        let mut used = 2;
        let keep = items
            .iter()
            .take_while(|it| {
                used += size(it).saturating_add(1);
                used <= VALUE_BYTES_MAX
            })
            .count();
        items.truncate(keep);
        return (value, Some(("elements".into(), serde_json::Value::from(n))));
    }
    (
        serde_json::Value::Null,
        Some(("value_bytes".into(), serde_json::Value::from(total))),
    )
}

/// `(window start, group values)` of a cell of `view` (of a session view: the cell's event
/// time).
fn cell_parts(view: &CompiledView, name: &str) -> Option<(u64, Vec<serde_json::Value>)> {
    if view.window.is_some_and(|w| w.session_gap_ms.is_some()) {
        let (_, group, t) = keys::parse_session_key(&view.def.name, &view.digest, name)?;
        return Some((t, group));
    }
    match keys::parse_view_key(&view.def.name, &view.digest, name)? {
        (Some(start), group) => Some((start, group)),
        (None, _) => None,
    }
}

/// One sealed cell being audited.
struct Cell<'a> {
    view: &'a CompiledView,
    start: u64,
    group: Vec<serde_json::Value>,
    members: &'a [ReplicaId],
}

/// The lowest deadline `now` seals that `before` did not (with these members), if any.
fn newly_sealed_from(before: &[Sealed], now: &[Sealed]) -> Option<u64> {
    now.iter()
        .filter(|s| !before.contains(s))
        .map(|s| {
            // A range that grew upward is new only above its old end.
            before
                .iter()
                .filter(|b| b.from == s.from && b.members == s.members && b.to <= s.to)
                .map(|b| b.to)
                .max()
                .unwrap_or(s.from)
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(from: u64, to: u64, members: &[u128]) -> Sealed {
        Sealed {
            from,
            to,
            members: members.iter().map(|m| ReplicaId(*m)).collect(),
        }
    }

    #[test]
    fn a_large_value_is_cut_to_its_first_elements_or_left_out() {
        let small = serde_json::json!(["a", "b"]);
        assert_eq!(bounded_value(small.clone()), (small, None));
        let many: Vec<String> = (0..10_000).map(|i| format!("element-{i:05}")).collect();
        let (v, cut) = bounded_value(serde_json::json!(many));
        let kept = v.as_array().map_or(0, Vec::len);
        assert!(kept > 100 && kept < 10_000, "{kept}");
        assert!(serde_json::to_vec(&v).map_or(0, |b| b.len()) <= VALUE_BYTES_MAX);
        assert_eq!(v[0], serde_json::json!("element-00000"));
        assert_eq!(cut, Some(("elements".into(), serde_json::json!(10_000))));
        let text = "x".repeat(VALUE_BYTES_MAX);
        let (v, cut) = bounded_value(serde_json::json!({ "text": text }));
        assert_eq!(v, serde_json::Value::Null);
        assert_eq!(
            cut,
            Some((
                "value_bytes".into(),
                serde_json::json!(VALUE_BYTES_MAX + 11)
            ))
        );
    }

    #[test]
    fn a_seal_growing_upward_is_new_only_above_its_old_end() {
        assert_eq!(newly_sealed_from(&[], &[s(0, 60, &[1, 2])]), Some(0));
        assert_eq!(
            newly_sealed_from(&[s(0, 60, &[1, 2])], &[s(0, 120, &[1, 2])]),
            Some(60)
        );
        assert_eq!(
            newly_sealed_from(&[s(0, 60, &[1, 2])], &[s(0, 60, &[1, 2])]),
            None
        );
        assert_eq!(
            newly_sealed_from(
                &[s(60, 120, &[1, 2])],
                &[s(0, 60, &[1]), s(60, 180, &[1, 2])]
            ),
            Some(0)
        );
    }
}
