//! The final-window feed: every window of a view once, when it is final on this node, in
//! window order (start, then group), from a cursor a consumer keeps.
//!
//! A final window never changes (ARCHITECTURE.md, "Seals"), so the feed is read from the
//! view's cells, not kept: the cursor is the last cell delivered, and the feed delivers the
//! cells after it while they are final, stopping at the first that is not (a later window is
//! never delivered before an earlier one). A window's cells are all final at once (one
//! deadline, one seal), and a sealed window gains no cell later (only its members' cells count
//! and the seal waits for all of them), so no cell is ever passed over. Cells behind the
//! cursor that retention removed are reported once (`reset`): the consumer may have missed
//! windows, never silently.

use super::Views;
use super::keys;
use super::read::{key_kind, sealed_value, to_json};
use super::seal;
use crate::error::Error;
use crate::proto::PeerId;
use crate::store::Reader;
use serde::{Deserialize, Serialize};
use tidemark_crdts::{Key, ReplicaId};

/// Where a consumer of the final-window feed stands: the last cell delivered (opaque,
/// shell-safe hex text; stable across restarts and the same on every node).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FinalCursor {
    /// `{start, 20 digits}/{group JSON}`: the cell name after the view prefix; for a session
    /// view `s{lo, 20 digits}/{hi, 20 digits}/` then nothing (the round's start) or the last
    /// delivered session's last cell name after the view prefix (`@{group JSON}/{time}`):
    /// the feed round `(lo, hi]` and the place in it (`super::session`).
    cell: String,
}

/// A final-window cursor's text is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a final-window cursor is the hex text of a delivered window's `cursor`; got {0:?}")]
pub struct FinalCursorError(pub String);

impl std::fmt::Display for FinalCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.cell.bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for FinalCursor {
    type Err = FinalCursorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || FinalCursorError(s.chars().take(64).collect());
        if s.len() % 2 != 0 || s.len() > 4096 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let bytes: Vec<u8> = (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let cell = String::from_utf8(bytes).map_err(|_| bad())?;
        if cell.starts_with('s') {
            let c = Self { cell };
            return c.session().map(|_| c).ok_or_else(bad);
        }
        let (start, group) = cell.split_once('/').ok_or_else(bad)?;
        if start.len() != 20 || !start.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        if !matches!(
            serde_json::from_str::<serde_json::Value>(group),
            Ok(serde_json::Value::Array(_))
        ) {
            return Err(bad());
        }
        Ok(Self { cell })
    }
}

impl FinalCursor {
    /// The window start the cursor is at.
    fn start(&self) -> Option<u64> {
        if self.cell.starts_with('s') {
            return None;
        }
        self.cell.split_once('/')?.0.parse().ok()
    }

    /// True for a cursor of a session view's feed (`super::session`), false for one of a
    /// tumbling or hopping view's.
    pub fn is_session(&self) -> bool {
        self.cell.starts_with('s')
    }

    /// The cursor of a session view's feed in round `(lo, hi]` after the session whose last
    /// cell is `cell` (its name after the view prefix; `None`: the round's start).
    pub(super) fn session_cursor(lo: u64, hi: u64, cell: Option<&str>) -> Self {
        Self {
            cell: format!("s{lo:020}/{hi:020}/{}", cell.unwrap_or_default()),
        }
    }

    /// A session view's cursor: `(lo, hi, the last cell delivered in the round)`; `None` for
    /// a cursor of another window.
    pub(super) fn session(&self) -> Option<(u64, u64, Option<String>)> {
        let rest = self.cell.strip_prefix('s')?;
        let digits = |t: &str| {
            (t.len() == 20 && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse::<u64>().ok())
                .flatten()
        };
        let (lo, rest) = rest.split_once('/')?;
        let (hi, cell) = rest.split_once('/')?;
        let (lo, hi) = (digits(lo)?, digits(hi)?);
        if lo > hi {
            return None;
        }
        if cell.is_empty() {
            return Some((lo, hi, None));
        }
        let (group, time) = cell.strip_prefix('@')?.rsplit_once('/')?;
        digits(time)?;
        if !matches!(
            serde_json::from_str::<serde_json::Value>(group),
            Ok(serde_json::Value::Array(_))
        ) {
            return None;
        }
        Some((lo, hi, Some(cell.to_owned())))
    }
}

/// One final window of one group, as the feed delivers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinalWindow {
    /// The view.
    pub view: String,
    /// The group: `group_by` field → value.
    pub group: serde_json::Map<String, serde_json::Value>,
    /// Window start (ms).
    pub window_start: u64,
    /// Window end, exclusive (ms).
    pub window_end: u64,
    /// The value (as in a view read), the same on every node that reports it final.
    pub value: serde_json::Value,
    /// The version of the value for an `upsert(key, version, value)` sink: always 1, as a final
    /// value never changes (a replay carries the same version and is ignored).
    pub version: u64,
    /// This window's cursor: resume after it with `after`.
    pub cursor: String,
}

/// A page of the final-window feed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FinalPage {
    /// Final windows after the cursor, in window order.
    pub windows: Vec<FinalWindow>,
    /// Where to continue: the last window's cursor (the cursor asked with when none).
    pub next: Option<String>,
    /// True when windows after the cursor may have been removed by retention before this page
    /// (the cursor's own window, or a window after it, is past retention): the consumer may
    /// have missed some; the feed goes on with the first window kept. Conservative: a caught-up
    /// consumer idle for longer than the retention is told so too.
    pub reset: bool,
    /// The start of the first window after the page that is not final yet (the feed waits for
    /// it), when there is one.
    pub waiting_on: Option<u64>,
}

impl Views {
    /// Up to `limit` final windows of `name` after `after` (from the oldest kept with `None`).
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown or unwindowed view; storage failures.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn final_page(
        &self,
        reader: &Reader,
        name: &str,
        after: Option<&FinalCursor>,
        limit: usize,
        me: ReplicaId,
        known: &[PeerId],
        peer_of: fn(ReplicaId) -> PeerId,
    ) -> Result<FinalPage, Error> {
        let (vi, view) = self
            .find(name)
            .ok_or_else(|| Error::Config(format!("no view named {name:?} is configured")))?;
        let d = &view.def;
        let Some(window) = view.window else {
            return Err(Error::Config(format!(
                "view {name:?} has no window: none of its values ever becomes final"
            )));
        };
        if window.session_gap_ms.is_some() {
            return self.final_sessions(reader, vi, after, limit, me, known, peer_of);
        }
        if after.is_some_and(|c| c.start().is_none()) {
            return Err(Error::Config(format!(
                "view {name:?} has no session window: this cursor is of another view"
            )));
        }
        let st = self.standing(reader, d.stream.as_str(), me, known, peer_of)?;
        let kind = key_kind(d.kind);
        let prefix = keys::view_prefix(&d.name, &view.digest);
        let mut page = FinalPage {
            next: after.map(ToString::to_string),
            ..FinalPage::default()
        };
        // Behind retention: windows after the cursor may be gone.
        if let (Some(s), Some(h)) = (after.and_then(FinalCursor::start), st.horizon) {
            page.reset = self.expired(vi, s, h);
        }
        let mut from = after.map(|c| format!("{prefix}{}", c.cell));
        let limit = limit.clamp(1, 1000);
        loop {
            let cells = reader.list(kind, &prefix, from.as_deref(), 256)?;
            let done = cells.len() < 256;
            for (key, _) in &cells {
                from = Some(key.name.clone());
                let Some((Some(start), group)) =
                    keys::parse_view_key(&d.name, &view.digest, &key.name)
                else {
                    continue;
                };
                if st.horizon.is_some_and(|h| self.expired(vi, start, h)) {
                    // Removed by retention (here or soon everywhere): a consumer that had
                    // not reached it missed it.
                    page.reset |= after.is_some();
                    continue;
                }
                let Some(members) = seal::sealed_members(&st.sealed, window.deadline(start)) else {
                    page.waiting_on = Some(start);
                    return Ok(page);
                };
                let cell = key.name[prefix.len()..].to_owned();
                let cursor = FinalCursor { cell }.to_string();
                let Some(value) = sealed_value(reader, &Key::new(kind, key.name.clone()), members)?
                else {
                    page.next = Some(cursor);
                    continue;
                };
                page.windows.push(FinalWindow {
                    view: d.name.clone(),
                    group: d.group_by.iter().cloned().zip(group).collect(),
                    window_start: start,
                    window_end: start.saturating_add(window.size_ms),
                    value: to_json(d.kind, &value),
                    version: 1,
                    cursor: cursor.clone(),
                });
                page.next = Some(cursor);
                if page.windows.len() == limit {
                    return Ok(page);
                }
            }
            if done {
                return Ok(page);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_roundtrip_as_shell_safe_hex_and_refuse_other_text() {
        let c = FinalCursor {
            cell: format!("{:020}/[\"/docs\"]", 60_000),
        };
        let text = c.to_string();
        assert!(text.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(text.parse::<FinalCursor>(), Ok(c.clone()));
        assert_eq!(c.start(), Some(60_000));
        for bad in ["", "0", "zz", "2f2f", &"30".repeat(20)] {
            assert!(bad.parse::<FinalCursor>().is_err(), "{bad:?} accepted");
        }
        let hex = |t: &str| t.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        for (lo, hi, cell) in [
            (0, 0, None),
            (5, 900, Some(format!("@[\"a/b\"]/{:020}", 7))),
        ] {
            let c = FinalCursor::session_cursor(lo, hi, cell.as_deref());
            let text = c.to_string();
            assert_eq!(text.parse::<FinalCursor>(), Ok(c.clone()));
            assert_eq!(c.session(), Some((lo, hi, cell)));
            assert_eq!(c.start(), None);
        }
        for bad in [
            format!("s{:020}/{:020}/", 9, 3),
            format!("s{:020}/{:020}/x", 0, 3),
            format!("s{:020}/{:020}/@[\"a\"]/7", 0, 3),
            format!("s{:020}/{:020}/@nope/{:020}", 0, 3, 7),
            format!("s{:020}", 0),
        ] {
            assert!(
                hex(&bad).parse::<FinalCursor>().is_err(),
                "{bad:?} accepted"
            );
        }
    }
}
