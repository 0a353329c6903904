//! Session windows (`window = { session = "30m", lateness = "5m" }`): per group, events whose
//! times are closer than the gap form one session; its bounds are `[first event time, last
//! event time + gap)`.
//!
//! **Stored as cells, computed as sessions.** A session view stores one cell per group and
//! event time in ms — a tumbling window of 1 ms with the view's lateness, keyed group first
//! ([`keys::session_key`]). So the cell of time `t` has deadline `t + 1 + lateness`, and every
//! rule of the other windows applies per cell unchanged: lateness against the watermark,
//! seals (`seal.rs`), a sealed cell counting exactly its seal's members' contributions.
//! Sessions are not stored: they are a deterministic function of the cells, computed when read
//! — a group's *occupied* cells (a sealed cell by its sealed value; a `sum` cell whose
//! contributions net to 0 is not occupied) in time order, split wherever two consecutive
//! occupied times are `gap` or more apart. A late event (within lateness) that falls between
//! two sessions is a new cell closer than the gap to both: the next read joins them.
//!
//! **CRDT argument.** The stored state is a join of CRDT cells, and the session function reads
//! nothing else. Two nodes that each saw one half of a bridged session hold, after they
//! exchange state, the union of both halves' cells (a cell is a CRDT: each contribution stays
//! in it, separable by dot), so both compute the merged session from the same cells: no
//! contribution is lost, whatever the order of delivery, and no merge step exists that could
//! run twice or in a different order. A session's value is the join of its cells' values —
//! `count` and `sum` add, `distinct` unites, `latest` takes the record with the greatest
//! event stamp (time, then event id) — each of which is associative, commutative, and (the
//! cells being disjoint by time) counts every event exactly once.
//!
//! **Finality.** A session is final when every cell whose event time is within the gap of it
//! — times `(chain start − gap, last + gap)` — is sealed: no event can then join it on either
//! side (one would be applied to a sealed cell, which no node does), its cells' values are
//! fixed, and so is its value. Equivalently, the seals cover every deadline up to `last + gap +
//! lateness`. A final session never changes, on any node that reports it final.
//!
//! **Bounds.** A session holds at most [`SESSION_CELLS_MAX`] cells (distinct event times):
//! at that count it ends, and the next cell starts a new session of the same *chain* even
//! within the gap (deterministic over the cells; such a capped session is final once its own
//! cells and the cells before it in the chain are sealed). A read scans about
//! [`SESSION_SCAN_MAX`] cells a page, then ends the page after the last whole session with
//! `next` set (a page may then hold fewer rows than its limit, even none).
//!
//! **Retention.** A session is removed whole — all its cells in one purge — only once it is
//! final and the horizon passed `end + retention`; never one of its cells alone.

use super::Views;
use super::def::{CompiledView, Window};
use super::final_feed::{FinalCursor, FinalPage, FinalWindow};
use super::keys;
use super::read::{ViewPage, ViewQuery, ViewRow, key_kind, sealed_value, to_json};
use super::seal::{self, Sealed};
use crate::error::Error;
use crate::proto::PeerId;
use crate::store::Reader;
use tidemark_crdts::{Key, KeyKind, ReplicaId, Value};

/// Most cells (distinct event times) one session holds; the next starts another session.
pub const SESSION_CELLS_MAX: usize = 10_000;

/// About the most cells one read or feed page scans (it ends after the session being read).
pub const SESSION_SCAN_MAX: usize = 65_536;

/// Most cells one maintenance round scans for removed sessions (it resumes next round).
pub const PURGE_SCAN_MAX: usize = 16_384;

/// Where the purge scan of a session view stands ([`Views::expired_sessions`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PurgeScan {
    /// The cell name the next call resumes after (`None`: from the start).
    after: Option<String>,
    /// The horizon the last complete pass ran under.
    passed_at: Option<u64>,
}

/// The bounds of one session of a group, over its occupied cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The first event time of the session's chain (the sessions cut by
    /// [`SESSION_CELLS_MAX`] from one run of cells closer than the gap); `first` for a
    /// session that was not cut.
    pub chain_first: u64,
    /// Its first event time.
    pub first: u64,
    /// Its last event time.
    pub last: u64,
    /// Its cells (distinct event times).
    pub cells: usize,
    /// It holds [`SESSION_CELLS_MAX`] cells (so it ends at `last`, whatever follows).
    pub full: bool,
}

impl Bounds {
    /// The session's end, exclusive: its last event time plus the gap.
    pub fn end(&self, gap: u64) -> u64 {
        self.last.saturating_add(gap)
    }

    /// The event times whose cells decide the session: every time within the gap of its
    /// chain on either side (`[chain_first − gap + 1, last + gap − 1]`; a capped session's
    /// ends at `last`).
    fn watched(&self, gap: u64) -> (u64, u64) {
        let lo = self.chain_first.saturating_sub(gap.saturating_sub(1));
        let hi = if self.full {
            self.last
        } else {
            self.last.saturating_add(gap.saturating_sub(1))
        };
        (lo, hi)
    }

    /// The deadline once sealed through which the session is final: `last + gap + lateness`
    /// (a capped session's: `last + 1 + lateness`).
    pub fn final_deadline(&self, w: &Window) -> u64 {
        w.deadline(self.watched(w.session_gap_ms.unwrap_or(1)).1)
    }

    /// True when every cell that decides the session is sealed in `sealed`: no event can join
    /// it any more and its value is fixed.
    pub fn is_final(&self, w: &Window, sealed: &[Sealed]) -> bool {
        let (lo, hi) = self.watched(w.session_gap_ms.unwrap_or(1));
        covered(sealed, w.deadline(lo), w.deadline(hi))
    }
}

/// A session being built from a group's occupied times in ascending order.
#[derive(Clone, Copy, Debug)]
struct Open {
    chain_first: u64,
    first: u64,
    last: u64,
    cells: usize,
}

impl Open {
    fn at(t: u64, chain_first: u64) -> Self {
        Self {
            chain_first,
            first: t,
            last: t,
            cells: 1,
        }
    }

    fn bounds(&self, cap: usize) -> Bounds {
        Bounds {
            chain_first: self.chain_first,
            first: self.first,
            last: self.last,
            cells: self.cells,
            full: self.cells >= cap,
        }
    }

    /// Adds time `t` (greater than `last`): `None` when it joins the session, else the
    /// finished session (and this one restarts at `t`).
    fn push(&mut self, t: u64, gap: u64, cap: usize) -> Option<Bounds> {
        if t.saturating_sub(self.last) >= gap {
            let done = self.bounds(cap);
            *self = Self::at(t, t);
            return Some(done);
        }
        if self.cells >= cap {
            let done = self.bounds(cap);
            *self = Self::at(t, self.chain_first);
            return Some(done);
        }
        self.last = t;
        self.cells += 1;
        None
    }
}

/// The sessions of one group's occupied event times (any order, duplicates allowed): times
/// closer than `gap` (`t2 − t1 < gap`) are one session, at most `cap` times each.
pub fn sessionize(times: impl IntoIterator<Item = u64>, gap: u64, cap: usize) -> Vec<Bounds> {
    let times: std::collections::BTreeSet<u64> = times.into_iter().collect();
    let cap = cap.max(1);
    let mut out = Vec::new();
    let mut open: Option<Open> = None;
    for t in times {
        match &mut open {
            None => open = Some(Open::at(t, t)),
            Some(o) => out.extend(o.push(t, gap, cap)),
        }
    }
    out.extend(open.map(|o| o.bounds(cap)));
    out
}

/// True when every deadline in `[a, b]` lies in a range of `sealed` (ascending, disjoint).
pub fn covered(sealed: &[Sealed], a: u64, b: u64) -> bool {
    let mut cur = a;
    for s in sealed {
        if s.to <= cur {
            continue;
        }
        if s.from > cur {
            return false;
        }
        cur = s.to;
        if cur > b {
            return true;
        }
    }
    false
}

/// The largest `h ≥ lo` such that every deadline in `(lo, h]` is sealed in `sealed`.
pub fn frontier(sealed: &[Sealed], lo: u64) -> u64 {
    let mut cur = lo.saturating_add(1);
    for s in sealed {
        if s.to <= cur {
            continue;
        }
        if s.from > cur {
            break;
        }
        cur = s.to;
    }
    cur.saturating_sub(1).max(lo)
}

/// Whether a cell value holds a contribution that places an event in the session.
fn occupied(v: &Value) -> bool {
    match v {
        Value::GCounter(n) => *n > 0,
        Value::PNCounter(n) => *n != 0,
        Value::ORSet(items) | Value::MvReg(items) => !items.is_empty(),
        Value::Lww(v) => v.is_some(),
    }
}

/// The event stamp of a `latest` record (`keys::latest_record`).
fn record_stamp(text: &str) -> Option<tidemark_crdts::Timestamp> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    Some(keys::stamp(
        v.get("t")?.as_u64()?,
        v.get("s")?.as_str()?,
        v.get("q")?.as_u64()?,
    ))
}

/// Joins a cell's value into a session's: counts and sums add (saturating), sets unite,
/// `latest` keeps the record with the greatest event stamp.
pub fn join(acc: &mut Value, v: Value) {
    match (acc, v) {
        (Value::GCounter(a), Value::GCounter(b)) => *a = a.saturating_add(b),
        (Value::PNCounter(a), Value::PNCounter(b)) => *a = a.saturating_add(b),
        (Value::ORSet(a), Value::ORSet(b)) | (Value::MvReg(a), Value::MvReg(b)) => {
            let mut all: std::collections::BTreeSet<String> =
                std::mem::take(a).into_iter().collect();
            all.extend(b);
            *a = all.into_iter().collect();
        }
        (Value::Lww(a), Value::Lww(Some(b))) => {
            let newer = match a.as_deref() {
                None => true,
                Some(cur) => record_stamp(&b) > record_stamp(cur),
            };
            if newer {
                *a = Some(b);
            }
        }
        _ => {}
    }
}

/// One session as read from the cells.
#[derive(Clone, Debug)]
pub(super) struct Session {
    /// The group values.
    pub(super) group: Vec<serde_json::Value>,
    /// Its bounds.
    pub(super) bounds: Bounds,
    /// The join of its cells' values (sealed cells: their seal's members' contributions).
    pub(super) value: Value,
    /// The name of its last cell: a cursor to continue after it.
    pub(super) last_key: String,
    /// Its cells' keys (only when collected, for a purge).
    pub(super) keys: Vec<Key>,
}

/// A session being read.
struct Building {
    group_json: String,
    group: Vec<serde_json::Value>,
    open: Open,
    value: Value,
    last_key: String,
    keys: Vec<Key>,
}

/// Reads the sessions of a session view in key order (group, then time) from a cursor.
pub(super) struct Scan<'a> {
    reader: &'a Reader,
    view: &'a CompiledView,
    window: Window,
    kind: KeyKind,
    prefix: String,
    after: Option<String>,
    page: std::vec::IntoIter<(Key, Value)>,
    exhausted: bool,
    sealed: &'a [Sealed],
    cap: usize,
    building: Option<Building>,
    /// Cells read so far.
    pub(super) scanned: usize,
    collect_keys: bool,
    /// Cells after which the scan pauses where no session is being read.
    budget: usize,
    /// The scan paused (at `after`) rather than ended.
    paused: bool,
}

impl<'a> Scan<'a> {
    /// A scan of the cells under `prefix` (the view's, or one group's) after the cell name
    /// `after`, reading sealed cells by `sealed`.
    pub(super) fn new(
        reader: &'a Reader,
        view: &'a CompiledView,
        window: Window,
        prefix: String,
        after: Option<String>,
        sealed: &'a [Sealed],
    ) -> Self {
        Self {
            reader,
            view,
            window,
            kind: key_kind(view.def.kind),
            prefix,
            after,
            page: Vec::new().into_iter(),
            exhausted: false,
            sealed,
            cap: SESSION_CELLS_MAX,
            building: None,
            scanned: 0,
            collect_keys: false,
            budget: usize::MAX,
            paused: false,
        }
    }

    /// Pause (return no further session) once `budget` cells are read and no session is being
    /// read: [`Scan::paused_at`] says where to resume.
    pub(super) fn with_budget(mut self, budget: usize) -> Self {
        self.budget = budget;
        self
    }

    /// The cell name to resume after when the scan paused (`None`: it ended, or goes on).
    pub(super) fn paused_at(&self) -> Option<&str> {
        self.paused.then_some(self.after.as_deref()).flatten()
    }

    /// Also collect each session's cell keys.
    pub(super) fn collecting_keys(mut self) -> Self {
        self.collect_keys = true;
        self
    }

    fn next_cell(&mut self) -> Result<Option<(Key, Value)>, Error> {
        loop {
            if let Some(c) = self.page.next() {
                self.after = Some(c.0.name.clone());
                return Ok(Some(c));
            }
            if self.exhausted {
                return Ok(None);
            }
            let page = self
                .reader
                .list(self.kind, &self.prefix, self.after.as_deref(), 256)?;
            self.exhausted = page.len() < 256;
            self.page = page.into_iter();
        }
    }

    /// The value a cell counts: sealed, its seal's members' contributions; `None` when not
    /// occupied.
    fn effective(&self, key: &Key, t: u64, raw: Value) -> Result<Option<Value>, Error> {
        let v = match seal::sealed_members(self.sealed, self.window.deadline(t)) {
            Some(members) => sealed_value(self.reader, key, members)?,
            None => Some(raw),
        };
        Ok(v.filter(occupied))
    }

    fn finish(&self, b: Building, bounds: Bounds) -> Session {
        Session {
            group: b.group,
            bounds,
            value: b.value,
            last_key: b.last_key,
            keys: b.keys,
        }
    }

    /// The next session, `None` after the last.
    ///
    /// # Errors
    /// Storage failures.
    pub(super) fn next_session(&mut self) -> Result<Option<Session>, Error> {
        let gap = self.window.session_gap_ms.unwrap_or(1);
        loop {
            if self.building.is_none() && self.scanned >= self.budget && self.after.is_some() {
                // Only cells that hold no event since the last session: resuming after the
                // last one read starts the next session where it starts.
                self.paused = true;
                return Ok(None);
            }
            let Some((key, raw)) = self.next_cell()? else {
                let Some(b) = self.building.take() else {
                    return Ok(None);
                };
                let bounds = b.open.bounds(self.cap);
                return Ok(Some(self.finish(b, bounds)));
            };
            self.scanned += 1;
            let Some((g, group, t)) =
                keys::parse_session_key(&self.view.def.name, &self.view.digest, &key.name)
            else {
                continue;
            };
            let Some(v) = self.effective(&key, t, raw)? else {
                // No event here, but it may show the session being read has ended: another
                // group, or the gap past its last event (cells come in time order).
                let ended = self
                    .building
                    .as_ref()
                    .is_some_and(|b| b.group_json != g || t.saturating_sub(b.open.last) >= gap);
                if ended && let Some(b) = self.building.take() {
                    let bounds = b.open.bounds(self.cap);
                    return Ok(Some(self.finish(b, bounds)));
                }
                // Within the session's gap: removed with it (a purge leaves no row behind).
                if self.collect_keys
                    && let Some(b) = &mut self.building
                {
                    b.keys.push(key);
                }
                continue;
            };
            let (g, name) = (g.to_owned(), key.name.clone());
            let fresh = |open: Open, v: Value, key: Key, collect: bool| Building {
                group_json: g.clone(),
                group: group.clone(),
                open,
                value: v,
                last_key: name.clone(),
                keys: if collect { vec![key] } else { Vec::new() },
            };
            let collect = self.collect_keys;
            match self.building.take() {
                None => self.building = Some(fresh(Open::at(t, t), v, key, collect)),
                Some(b) if b.group_json != g => {
                    self.building = Some(fresh(Open::at(t, t), v, key, collect));
                    let bounds = b.open.bounds(self.cap);
                    return Ok(Some(self.finish(b, bounds)));
                }
                Some(mut b) => {
                    let before = b.open;
                    match b.open.push(t, gap, self.cap) {
                        None => {
                            join(&mut b.value, v);
                            b.last_key = name.clone();
                            if collect {
                                b.keys.push(key);
                            }
                            self.building = Some(b);
                        }
                        Some(bounds) => {
                            let restarted = b.open;
                            b.open = before;
                            self.building = Some(fresh(restarted, v, key, collect));
                            return Ok(Some(self.finish(b, bounds)));
                        }
                    }
                }
            }
        }
    }
}

impl Views {
    /// A page of session view `vi` ([`Views::read`] for a view with a session window): one row
    /// per session, `window_start` its first event time, `window_end` its last plus the gap,
    /// `final` by [`Bounds::is_final`]; `next` is the name of the last row's last cell.
    ///
    /// # Errors
    /// Storage failures.
    pub(super) fn read_sessions(
        &self,
        reader: &Reader,
        vi: usize,
        query: &ViewQuery,
        standing: super::read::Standing,
    ) -> Result<ViewPage, Error> {
        let view = &self.list()[vi];
        let d = &view.def;
        let window = view
            .window
            .ok_or_else(|| Error::Config("no window".into()))?;
        let gap = window.session_gap_ms.unwrap_or(1);
        let limit = if query.limit == 0 { 1000 } else { query.limit };
        // Every group field given: read that group's cells only.
        let whole: Option<Vec<serde_json::Value>> = d
            .group_by
            .iter()
            .map(|f| query.group.get(f).cloned())
            .collect();
        let prefix = match whole {
            Some(g) => keys::session_group_prefix(
                &d.name,
                &view.digest,
                &serde_json::Value::Array(g).to_string(),
            ),
            None => keys::view_prefix(&d.name, &view.digest),
        };
        let mut scan = Scan::new(
            reader,
            view,
            window,
            prefix,
            query.after.clone(),
            &standing.sealed,
        )
        .with_budget(SESSION_SCAN_MAX);
        let mut rows = Vec::new();
        let mut last_row: Option<String> = None;
        let mut boundary: Option<String> = None;
        let next = loop {
            if scan.scanned >= SESSION_SCAN_MAX && boundary.is_some() {
                break boundary;
            }
            let Some(s) = scan.next_session()? else {
                break scan.paused_at().map(str::to_owned);
            };
            boundary = Some(s.last_key.clone());
            let b = s.bounds;
            if query.from.is_some_and(|f| b.first < f) || query.to.is_some_and(|t| b.first >= t) {
                continue;
            }
            let group: serde_json::Map<String, serde_json::Value> =
                d.group_by.iter().cloned().zip(s.group).collect();
            if query.group.iter().any(|(f, v)| group.get(f) != Some(v)) {
                continue;
            }
            let is_final = b.is_final(&window, &standing.sealed);
            if is_final && self.session_expired(&window, &b, standing.horizon) {
                continue; // past retention: removed on every node alike
            }
            if rows.len() == limit {
                break last_row;
            }
            last_row = Some(s.last_key);
            rows.push(ViewRow {
                group,
                window_start: Some(b.first),
                window_end: Some(b.end(gap)),
                is_final,
                value: to_json(d.kind, &s.value),
            });
        };
        Ok(ViewPage {
            rows,
            next,
            counters: self.counters_of(vi),
            horizon: standing.horizon,
            watermark: standing.watermark,
            cluster_watermark: standing.cluster,
            definition_conflicts: standing.conflicts,
        })
    }

    /// True when a final session is past retention under `horizon` (`end + retention <
    /// horizon`): removed (and hidden) on every node alike.
    pub(super) fn session_expired(&self, w: &Window, b: &Bounds, horizon: Option<u64>) -> bool {
        let gap = w.session_gap_ms.unwrap_or(1);
        match (w.retention_ms, horizon) {
            (Some(r), Some(h)) => b.end(gap).saturating_add(r) < h,
            _ => false,
        }
    }

    /// The final-window feed of session view `vi` ([`Views::final_page`]).
    ///
    /// The feed goes in *rounds*: round `(lo, hi]` delivers, in key order (group, then time),
    /// every session whose final deadline ([`Bounds::final_deadline`]) is in `(lo, hi]`, where
    /// `hi` is how far this node's seals reach without a hole (from deadline 1) when the round
    /// starts; a node whose seals do not reach a cursor's `hi` waits. Every
    /// session of a round is final and fixed when the round is read (its deadlines are all
    /// sealed), and each session has one final deadline, so it falls in exactly one round:
    /// rounds `(0, h1], (h1, h2], …` deliver every session once, none skipped. The cursor
    /// names the round and the last session delivered in it (`FinalCursor`), so it is
    /// resumable on any node whose seals reach `hi`. A round rereads the view's cells.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn final_sessions(
        &self,
        reader: &Reader,
        vi: usize,
        after: Option<&FinalCursor>,
        limit: usize,
        me: ReplicaId,
        known: &[PeerId],
        peer_of: fn(ReplicaId) -> PeerId,
    ) -> Result<FinalPage, Error> {
        let view = &self.list()[vi];
        let d = &view.def;
        let window = view
            .window
            .ok_or_else(|| Error::Config("no window".into()))?;
        let gap = window.session_gap_ms.unwrap_or(1);
        let (mut lo, mut hi, mut key) = match after {
            None => (0, 0, None),
            Some(c) => c.session().ok_or_else(|| {
                Error::Config(format!(
                    "view {:?} has session windows: this cursor is of another view",
                    d.name
                ))
            })?,
        };
        let st = self.standing(reader, d.stream.as_str(), me, known, peer_of)?;
        let prefix = keys::view_prefix(&d.name, &view.digest);
        let mut page = FinalPage {
            next: after.map(ToString::to_string),
            ..FinalPage::default()
        };
        // Behind retention: sessions not delivered yet (final deadline above `lo`) may be
        // gone. Conservative, as for other windows.
        if let (Some(_), Some(r), Some(h)) = (after, window.retention_ms, st.horizon) {
            page.reset = lo
                .saturating_add(1)
                .saturating_sub(window.lateness_ms)
                .saturating_add(r)
                < h;
        }
        let limit = limit.clamp(1, 1000);
        let mut scanned = 0;
        // How far this node's seals reach without a hole: every session whose final deadline
        // is at most this is final and complete here, so the sessions of an earlier round were
        // all delivered before. A cursor of a round beyond it (from a node that sealed more)
        // waits until this node's seals get there.
        let reach = frontier(&st.sealed, 0);
        loop {
            if hi > reach {
                return Ok(page);
            }
            if lo == hi {
                if reach == lo {
                    return Ok(page);
                }
                hi = reach;
                key = None;
            }
            let mut scan = Scan::new(
                reader,
                view,
                window,
                prefix.clone(),
                key.as_ref().map(|k| format!("{prefix}{k}")),
                &st.sealed,
            )
            .with_budget(SESSION_SCAN_MAX.saturating_sub(scanned));
            loop {
                if scanned + scan.scanned >= SESSION_SCAN_MAX {
                    return Ok(page);
                }
                let Some(s) = scan.next_session()? else {
                    if let Some(at) = scan.paused_at() {
                        let suffix = at.get(prefix.len()..).unwrap_or_default();
                        page.next =
                            Some(FinalCursor::session_cursor(lo, hi, Some(suffix)).to_string());
                        return Ok(page);
                    }
                    // The round is done: the next starts where it ended.
                    scanned += scan.scanned;
                    lo = hi;
                    key = None;
                    page.next = Some(FinalCursor::session_cursor(lo, hi, None).to_string());
                    break;
                };
                let b = s.bounds;
                let fd = b.final_deadline(&window);
                let suffix = s.last_key.get(prefix.len()..).unwrap_or_default();
                let cursor = FinalCursor::session_cursor(lo, hi, Some(suffix)).to_string();
                if fd <= lo || fd > hi {
                    page.next = Some(cursor);
                    continue; // another round's
                }
                if !b.is_final(&window, &st.sealed) {
                    // A hole in the seals before `lo` (a node that never sealed it): wait.
                    page.waiting_on = Some(b.first);
                    return Ok(page);
                }
                page.next = Some(cursor.clone());
                if self.session_expired(&window, &b, st.horizon) {
                    page.reset |= after.is_some();
                    continue;
                }
                page.windows.push(FinalWindow {
                    view: d.name.clone(),
                    group: d.group_by.iter().cloned().zip(s.group).collect(),
                    window_start: b.first,
                    window_end: b.end(gap),
                    value: to_json(d.kind, &s.value),
                    version: 1,
                    cursor,
                });
                if page.windows.len() == limit {
                    return Ok(page);
                }
            }
        }
    }

    /// Up to about `max` keys of cells of session view `vi` whose sessions are removed: final
    /// under `sealed` and past retention under `horizon`, each session whole (a session is
    /// never split between purges). Scans at most [`PURGE_SCAN_MAX`] cells a call, resuming
    /// where the last call stopped; a pass that reached the end is not repeated until the
    /// horizon moves.
    ///
    /// # Errors
    /// Storage failures.
    pub(super) fn expired_sessions(
        &self,
        reader: &Reader,
        vi: usize,
        sealed: &[Sealed],
        horizon: u64,
        max: usize,
    ) -> Result<Vec<Key>, Error> {
        let view = &self.list()[vi];
        let Some(window) = view.window else {
            return Ok(Vec::new());
        };
        if window.retention_ms.is_none() {
            return Ok(Vec::new());
        }
        let mut state = self.session_purge.lock().map_err(|_| Error::Closed)?;
        let PurgeScan { after, passed_at } = state.get(&vi).cloned().unwrap_or_default();
        if after.is_none() && passed_at == Some(horizon) {
            return Ok(Vec::new());
        }
        let prefix = keys::view_prefix(&view.def.name, &view.digest);
        let mut scan = Scan::new(reader, view, window, prefix, after.clone(), sealed)
            .collecting_keys()
            .with_budget(PURGE_SCAN_MAX);
        let mut out: Vec<Key> = Vec::new();
        let mut resume = after;
        loop {
            if scan.scanned >= PURGE_SCAN_MAX || out.len() >= max {
                state.insert(
                    vi,
                    PurgeScan {
                        after: resume,
                        passed_at,
                    },
                );
                return Ok(out);
            }
            let Some(s) = scan.next_session()? else {
                if let Some(at) = scan.paused_at() {
                    let after = Some(at.to_owned());
                    state.insert(vi, PurgeScan { after, passed_at });
                    return Ok(out);
                }
                state.insert(
                    vi,
                    PurgeScan {
                        after: None,
                        passed_at: Some(horizon),
                    },
                );
                return Ok(out);
            };
            if s.bounds.is_final(&window, sealed)
                && self.session_expired(&window, &s.bounds, Some(horizon))
            {
                if !out.is_empty() && out.len() + s.keys.len() > max {
                    // Whole sessions only: this one goes in the next purge.
                    state.insert(
                        vi,
                        PurgeScan {
                            after: resume,
                            passed_at,
                        },
                    );
                    return Ok(out);
                }
                out.extend(s.keys);
            }
            resume = Some(s.last_key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(b: &[Bounds]) -> Vec<(u64, u64)> {
        b.iter().map(|b| (b.first, b.last)).collect()
    }

    #[test]
    fn a_bridging_event_merges_two_sessions() {
        let gap = 10;
        assert_eq!(
            spans(&sessionize([0, 5, 20, 23], gap, 100)),
            vec![(0, 5), (20, 23)]
        );
        // A late event at 13 is closer than the gap to 5 (8) and to 20 (7): one session.
        assert_eq!(
            spans(&sessionize([0, 5, 13, 20, 23], gap, 100)),
            vec![(0, 23)]
        );
        // At 15 it is the gap away from 5: it only extends the second.
        assert_eq!(
            spans(&sessionize([0, 5, 15, 20, 23], gap, 100)),
            vec![(0, 5), (15, 23)]
        );
    }

    #[test]
    fn times_exactly_the_gap_apart_are_two_sessions() {
        assert_eq!(spans(&sessionize([0, 10], 10, 100)), vec![(0, 0), (10, 10)]);
        assert_eq!(spans(&sessionize([0, 9], 10, 100)), vec![(0, 9)]);
        let b = sessionize([100, 109], 10, 100)[0];
        assert_eq!(
            (b.first, b.end(10)),
            (100, 119),
            "bounds [first, last + gap)"
        );
    }

    #[test]
    fn arrival_order_does_not_matter() {
        let times = [3u64, 40, 17, 9, 55, 12, 70, 9, 26];
        let want = sessionize(times, 10, 100);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..50 {
            let mut t = times.to_vec();
            for i in (1..t.len()).rev() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                t.swap(i, (rng % (i as u64 + 1)) as usize);
            }
            assert_eq!(sessionize(t, 10, 100), want);
        }
        assert_eq!(spans(&want), vec![(3, 26), (40, 40), (55, 55), (70, 70)]);
    }

    #[test]
    fn a_session_ends_at_the_cap_and_its_chain_goes_on() {
        let b = sessionize([1, 2, 3, 4, 5, 30], 10, 3);
        assert_eq!(spans(&b), vec![(1, 3), (4, 5), (30, 30)]);
        assert!(b[0].full && !b[1].full);
        assert_eq!((b[1].chain_first, b[2].chain_first), (1, 30));
    }

    fn sealed(ranges: &[(u64, u64)]) -> Vec<Sealed> {
        ranges
            .iter()
            .map(|&(from, to)| Sealed {
                from,
                to,
                members: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_session_is_final_once_the_seals_reach_its_last_plus_gap_plus_lateness() {
        let w = Window {
            size_ms: 1,
            every_ms: 1,
            lateness_ms: 5,
            retention_ms: None,
            out_of_orderness_ms: 0,
            idle_timeout_ms: None,
            session_gap_ms: Some(10),
        };
        let b = sessionize([100, 104], 10, 100)[0];
        // Cells up to 104 + 9 decide it: deadline 113 + 1 + 5 = 119.
        assert_eq!(b.final_deadline(&w), 119);
        assert!(!b.is_final(&w, &sealed(&[(0, 119)])));
        assert!(b.is_final(&w, &sealed(&[(0, 50), (50, 120)])));
        assert!(
            !b.is_final(&w, &sealed(&[(0, 90), (100, 200)])),
            "a hole before it"
        );
        assert_eq!(frontier(&sealed(&[(0, 50), (50, 120), (130, 200)]), 0), 119);
        assert_eq!(frontier(&sealed(&[(0, 50)]), 49), 49);
        assert_eq!(frontier(&[], 7), 7);
        assert!(covered(&sealed(&[(0, 10)]), 3, 9));
        assert!(!covered(&sealed(&[(0, 10)]), 3, 10));
    }

    #[test]
    fn session_values_join_as_their_cells() {
        let mut c = Value::GCounter(2);
        join(&mut c, Value::GCounter(3));
        assert_eq!(c, Value::GCounter(5));
        let mut s = Value::ORSet(vec!["\"a\"".into(), "\"c\"".into()]);
        join(&mut s, Value::ORSet(vec!["\"b\"".into(), "\"c\"".into()]));
        assert_eq!(
            s,
            Value::ORSet(vec!["\"a\"".into(), "\"b\"".into(), "\"c\"".into()])
        );
        let rec = |t: u64, v: &str| Some(keys::latest_record(t, "src", 1, &v.into()));
        let mut l = Value::Lww(rec(20, "late"));
        join(&mut l, Value::Lww(rec(10, "early")));
        assert_eq!(l, Value::Lww(rec(20, "late")));
        join(&mut l, Value::Lww(rec(30, "later")));
        assert_eq!(l, Value::Lww(rec(30, "later")));
        assert!(!occupied(&Value::PNCounter(0)));
    }
}
