//! The deterministic encoding of view state into store keys, shared by every node:
//!
//! - view cells: `~view/{view}/{definition digest, 16 hex}/{window start, 20 digits | "-"}/
//!   {group values as a JSON array}` (so a view's cells sort by window start, then group, and
//!   cells of a differing definition of the same view name are other keys, never merged);
//! - session view cells: `~view/{view}/{definition digest}/@{group values as a JSON array}/
//!   {event time, 20 digits}` ([`session_key`]): the group before the time, so one group's
//!   cells are one contiguous key range ([`session_group_prefix`]) read without scanning the
//!   rest of the view, in event-time order (what sessionizing needs, `super::session`). A
//!   group's JSON text is one complete array, so no group's prefix is a prefix of another's;
//!   the `@` keeps these names apart from window starts (digits) and `-`;
//! - watermark announcements: `lww/~wm/{stream}/{replica id, 32 hex digits}`, written only by
//!   that replica, holding `{"defs": digest of its view definitions of the stream, "ep": its
//!   membership epochs, "sl": its seals (both in the compact form of `super::seal`, as
//!   differences between consecutive member sets in indexes of "r"), "r": the replicas they
//!   name (ascending), "h": its retention horizon of the stream in ms, "s": its watermark when
//!   it first applied an event to a window, "u": 1 while it applied none, "k": the peers it
//!   ever met (all optional), "wm": its local watermark in ms}`. Earlier versions wrote the
//!   epochs and seals with whole member sets as "e" and "f" ([`parse_announcement`] still
//!   reads them).
//!
//! - decommission records: `lww/~gone/{replica id}` ([`gone_key`]), written by any node when an
//!   operator removes a member for good.
//!
//! Client ops may not name keys under these prefixes ([`is_reserved`]).

use tidemark_crdts::{Key, KeyKind, Mutation, ReplicaId, Timestamp};

pub use crate::model::{GONE_PREFIX, VIEW_PREFIX, WM_PREFIX, is_reserved};

/// The key name of a view cell of the definition with `digest`.
pub fn view_key(view: &str, digest: &str, window_start: Option<u64>, group_json: &str) -> String {
    match window_start {
        Some(s) => format!("{VIEW_PREFIX}{view}/{digest}/{s:020}/{group_json}"),
        None => format!("{VIEW_PREFIX}{view}/{digest}/-/{group_json}"),
    }
}

/// The key name of the session view cell of `group_json` at event time `time_ms`.
pub fn session_key(view: &str, digest: &str, group_json: &str, time_ms: u64) -> String {
    format!("{VIEW_PREFIX}{view}/{digest}/@{group_json}/{time_ms:020}")
}

/// Prefix of every session view cell of one group (its cells sort by event time).
pub fn session_group_prefix(view: &str, digest: &str, group_json: &str) -> String {
    format!("{VIEW_PREFIX}{view}/{digest}/@{group_json}/")
}

/// Splits a session cell name of `view` (definition `digest`) into `(group JSON text, group
/// values, event time)`.
pub fn parse_session_key<'a>(
    view: &str,
    digest: &str,
    name: &'a str,
) -> Option<(&'a str, Vec<serde_json::Value>, u64)> {
    let rest = name
        .strip_prefix(VIEW_PREFIX)?
        .strip_prefix(view)?
        .strip_prefix('/')?
        .strip_prefix(digest)?
        .strip_prefix("/@")?;
    let (group, time) = rest.rsplit_once('/')?;
    if time.len() != 20 || !time.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let serde_json::Value::Array(g) = serde_json::from_str(group).ok()? else {
        return None;
    };
    Some((group, g, time.parse().ok()?))
}

/// Prefix of every cell of `view` under the definition with `digest`.
pub fn view_prefix(view: &str, digest: &str) -> String {
    format!("{VIEW_PREFIX}{view}/{digest}/")
}

/// Prefix of the cells of `view`'s windows starting at `start`.
pub fn window_prefix(view: &str, digest: &str, start: u64) -> String {
    format!("{VIEW_PREFIX}{view}/{digest}/{start:020}/")
}

/// `(view, definition digest, window start)` of any view cell name (`None` start: an
/// unwindowed cell; a session cell gives its event time); `None` for other names.
pub fn cell_of(name: &str) -> Option<(&str, &str, Option<u64>)> {
    let rest = name.strip_prefix(VIEW_PREFIX)?;
    let mut parts = rest.splitn(4, '/');
    let (view, digest, start) = (parts.next()?, parts.next()?, parts.next()?);
    parts.next()?;
    if start.starts_with('@') {
        let time = rest.rsplit_once('/')?.1;
        return Some((view, digest, Some(time.parse().ok()?)));
    }
    let start = if start == "-" {
        None
    } else {
        Some(start.parse().ok()?)
    };
    Some((view, digest, start))
}

/// Splits a cell name of `view` (definition `digest`) into `(window start, group values)`.
pub fn parse_view_key(
    view: &str,
    digest: &str,
    name: &str,
) -> Option<(Option<u64>, Vec<serde_json::Value>)> {
    let rest = name.strip_prefix(&view_prefix(view, digest))?;
    let (start, group) = rest.split_once('/')?;
    let start = if start == "-" {
        None
    } else {
        Some(start.parse().ok()?)
    };
    let serde_json::Value::Array(g) = serde_json::from_str(group).ok()? else {
        return None;
    };
    Some((start, g))
}

/// The watermark announcement key of `replica` for `stream`.
pub fn wm_key(stream: &str, replica: ReplicaId) -> Key {
    Key::new(KeyKind::Lww, format!("{WM_PREFIX}{stream}/{replica}"))
}

/// Prefix of every watermark announcement of `stream`.
pub fn wm_prefix(stream: &str) -> String {
    format!("{WM_PREFIX}{stream}/")
}

/// The decommission record key of `replica` (`~gone/{replica}`, an lww register holding
/// `{"at": wall-clock ms, "by": the replica that recorded it}`): the member is gone for good.
pub fn gone_key(replica: ReplicaId) -> Key {
    Key::new(KeyKind::Lww, format!("{GONE_PREFIX}{replica}"))
}

/// The replica of a decommission record key.
pub fn gone_replica(name: &str) -> Option<ReplicaId> {
    let hex = name.strip_prefix(GONE_PREFIX)?;
    u128::from_str_radix(hex, 16).ok().map(ReplicaId)
}

/// The replica of a watermark announcement key of `stream`.
pub fn wm_replica(stream: &str, name: &str) -> Option<ReplicaId> {
    let hex = name.strip_prefix(&wm_prefix(stream))?;
    u128::from_str_radix(hex, 16).ok().map(ReplicaId)
}

/// The stored record of a `latest` cell: canonical JSON (keys sorted) of event time, source,
/// seq and value, from which [`event_stamp`] recovers the ordering stamp.
pub fn latest_record(time_ms: u64, source: &str, seq: u64, value: &serde_json::Value) -> String {
    let mut m = serde_json::Map::new();
    m.insert("q".into(), seq.into());
    m.insert("s".into(), source.into());
    m.insert("t".into(), time_ms.into());
    m.insert("v".into(), value.clone());
    serde_json::Value::Object(m).to_string()
}

/// A decoded watermark announcement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announcement {
    /// The announcer's local watermark of the stream: it refuses events for windows whose
    /// deadline is below it.
    pub wm: u64,
    /// Digest of the announcer's view definitions of the stream.
    pub defs: String,
    /// The announcer's retention horizon of the stream (windows whose end plus retention is
    /// below it are removed on every node that learns it).
    pub horizon: Option<u64>,
    /// The announcer's membership epochs (`super::seal`); `None` when malformed (then it
    /// agrees to no seal).
    pub epochs: Option<Vec<super::seal::Epoch>>,
    /// The deadline ranges the announcer sealed (reported final), with the members counted.
    pub sealed: Vec<super::seal::Sealed>,
    /// The watermark the announcer had when it first applied an event to a window (it
    /// applied nothing to windows whose deadline is below it; 0 when it applied events from
    /// its start).
    pub since: u64,
    /// False while the announcer has applied no event to any window of the stream (then
    /// `since` is meaningless: it applied nothing below its watermark).
    pub applied: bool,
    /// The peers the announcer ever met (their link ids): members for its finality even
    /// across its restarts.
    pub met: Vec<u64>,
}

/// What a node announces for a stream besides its definitions digest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks<'a> {
    /// Its local watermark.
    pub wm: u64,
    /// Its retention horizon.
    pub horizon: Option<u64>,
    /// Its membership epochs.
    pub epochs: &'a [super::seal::Epoch],
    /// Its seals.
    pub sealed: &'a [super::seal::Sealed],
    /// The watermark it had when it first applied an event to a window.
    pub since: u64,
    /// Whether it has applied any event to a window.
    pub applied: bool,
    /// The peers it ever met (link ids).
    pub met: &'a [u64],
}

/// The text of a watermark announcement: `{"defs", "ep": epochs, "h": horizon, "k": peers met,
/// "r": replica table, "s": since, "sl": seals, "u": 1 while it applied nothing, "wm"}` (`ep`,
/// `h`, `k`, `r`, `s`, `sl`, `u` left out when empty, 0 or false). Epochs and seals are in the
/// compact form (`super::seal::encode_epochs`): its size grows linearly with the membership
/// changes, not with their square.
pub fn announcement_text(defs_digest: &str, marks: &Marks<'_>) -> String {
    let mut m = serde_json::Map::new();
    m.insert("defs".into(), defs_digest.into());
    let table = super::seal::table_of(marks.epochs, marks.sealed);
    if !table.is_empty() {
        m.insert("r".into(), super::seal::encode_table(&table));
    }
    if !marks.epochs.is_empty() {
        m.insert(
            "ep".into(),
            super::seal::encode_epochs(marks.epochs, &table),
        );
    }
    if !marks.sealed.is_empty() {
        m.insert(
            "sl".into(),
            super::seal::encode_sealed(marks.sealed, &table),
        );
    }
    if let Some(h) = marks.horizon {
        m.insert("h".into(), h.into());
    }
    if marks.since > 0 {
        m.insert("s".into(), marks.since.into());
    }
    if !marks.applied {
        m.insert("u".into(), 1.into());
    }
    if !marks.met.is_empty() {
        m.insert(
            "k".into(),
            marks
                .met
                .iter()
                .map(|p| serde_json::Value::from(format!("{p:016x}")))
                .collect(),
        );
    }
    m.insert("wm".into(), marks.wm.into());
    serde_json::Value::Object(m).to_string()
}

/// Longest announcement text decoded (bytes): far above any announcement a node writes (a
/// register value is at most `Limits::value_bytes_max`, 64 KiB by default, for peers to take
/// it), so only a corrupt or hostile one is refused.
pub const ANNOUNCEMENT_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Why an announcement text was refused as a whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnnouncementError {
    /// Longer than [`ANNOUNCEMENT_BYTES_MAX`].
    #[error("announcement of {len} bytes, over {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// [`ANNOUNCEMENT_BYTES_MAX`].
        max: usize,
    },
    /// Not a JSON object with `wm` (an integer) and `defs` (a string).
    #[error("malformed announcement: {0}")]
    Malformed(&'static str),
}

/// The announcement in `text`. Reads both forms: the compact one ([`announcement_text`]) and
/// the first one, with whole member sets under `"e"` and `"f"`, written by earlier versions
/// (in data directories and by peers not yet upgraded). Malformed epochs decode to `None` (the
/// announcer agrees to no seal) and malformed seals to none, as does a text mixing both forms;
/// the rest of the announcement still counts.
///
/// # Errors
/// [`AnnouncementError`] when the text is too long or not an announcement at all; never
/// panics on any input.
pub fn parse_announcement(text: &str) -> Result<Announcement, AnnouncementError> {
    if text.len() > ANNOUNCEMENT_BYTES_MAX {
        return Err(AnnouncementError::TooLarge {
            len: text.len(),
            max: ANNOUNCEMENT_BYTES_MAX,
        });
    }
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|_| AnnouncementError::Malformed("not JSON"))?;
    let wm = v
        .get("wm")
        .and_then(serde_json::Value::as_u64)
        .ok_or(AnnouncementError::Malformed("wm"))?;
    let defs = v
        .get("defs")
        .and_then(serde_json::Value::as_str)
        .ok_or(AnnouncementError::Malformed("defs"))?
        .to_owned();
    let compact = ["r", "ep", "sl"].iter().any(|k| v.get(k).is_some());
    let first = ["e", "f"].iter().any(|k| v.get(k).is_some());
    let (epochs, sealed) = if compact && first {
        (None, Vec::new())
    } else if compact {
        let table = v.get("r").map_or(Ok(Vec::new()), super::seal::decode_table);
        let epochs = table.as_ref().ok().and_then(|t| {
            v.get("ep")
                .map_or(Ok(Vec::new()), |e| super::seal::decode_epochs(e, t))
                .ok()
        });
        let sealed = table
            .as_ref()
            .ok()
            .and_then(|t| {
                v.get("sl")
                    .map(|s| super::seal::decode_sealed(s, t))
                    .and_then(Result::ok)
            })
            .unwrap_or_default();
        (epochs, sealed)
    } else {
        (
            v.get("e")
                .map_or(Ok(Vec::new()), super::seal::parse_epochs_v1)
                .ok(),
            v.get("f")
                .and_then(|f| super::seal::parse_sealed_v1(f).ok())
                .unwrap_or_default(),
        )
    };
    Ok(Announcement {
        wm,
        defs,
        horizon: v.get("h").and_then(serde_json::Value::as_u64),
        epochs,
        sealed,
        since: v.get("s").and_then(serde_json::Value::as_u64).unwrap_or(0),
        // An announcement without `u` (one of an older version too) applied events:
        // conservative, it adopts no seal it is not counted in.
        applied: v.get("u").is_none(),
        met: v
            .get("k")
            .and_then(serde_json::Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|p| p.as_str().and_then(|h| u64::from_str_radix(h, 16).ok()))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// The digest of a stream's view definitions (sorted by name), the same on every node that
/// runs the same definitions.
pub fn defs_digest(defs: &[&super::ViewDef]) -> String {
    // `max_future` is an ingest policy, not part of what a view computes.
    let mut defs: Vec<super::ViewDef> = defs
        .iter()
        .map(|d| super::ViewDef {
            max_future: None,
            ..(*d).clone()
        })
        .collect();
    defs.sort_by(|a, b| a.name.cmp(&b.name));
    let text = serde_json::to_string(&defs).unwrap_or_default();
    format!("{:016x}", fnv64(text.as_bytes()))
}

/// FNV-1a, 64 bits: a hash every node computes the same way.
fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The ordering stamp of an event for `latest`: event time, then event id (a hash of the
/// source, then seq) — the same on every node, so `latest` does not depend on arrival order.
pub fn stamp(time_ms: u64, source: &str, seq: u64) -> Timestamp {
    Timestamp {
        physical_ms: time_ms,
        logical: 0,
        replica: ReplicaId((u128::from(fnv64(source.as_bytes())) << 64) | u128::from(seq)),
    }
}

/// For a `latest` view write (`Set` on an lww key under [`VIEW_PREFIX`]), its event stamp; the
/// store uses it as the LWW timestamp instead of its clock. `None` for every other write.
pub fn event_stamp(key: &Key, m: &Mutation) -> Option<Timestamp> {
    if key.kind != KeyKind::Lww || !key.name.starts_with(VIEW_PREFIX) {
        return None;
    }
    let Mutation::Set(text) = m else { return None };
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    Some(stamp(
        v.get("t")?.as_u64()?,
        v.get("s")?.as_str()?,
        v.get("q")?.as_u64()?,
    ))
}

/// Attaches to every `latest` view write of `writes` its event stamp
/// ([`crate::store::LocalWrite::stamps`]): the store writes it at that timestamp and skips it
/// when a later-stamped value is already there, reading no view value itself.
pub(crate) fn stamp_latest_writes(writes: &mut [crate::store::LocalWrite]) {
    for w in writes {
        // One parse per op (only lww sets under the view prefix parse), and no allocation
        // for a write without a `latest` op.
        let mut stamps = Vec::new();
        for (i, (k, m)) in w.ops.iter().enumerate() {
            if let Some(ts) = event_stamp(k, m) {
                if stamps.is_empty() {
                    stamps.resize(w.ops.len(), None);
                }
                stamps[i] = Some(ts);
            }
        }
        if !stamps.is_empty() {
            w.stamps = stamps;
        }
    }
}

/// The value of a `latest` record.
pub fn latest_value(record: &serde_json::Value) -> serde_json::Value {
    record.get("v").cloned().unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LocalWrite;

    fn rid(n: u128) -> ReplicaId {
        ReplicaId(n)
    }

    #[test]
    fn an_announcement_of_the_first_form_is_still_read() {
        // Written by the previous version (whole member sets under "e" and "f"), as found in
        // existing data directories and sent by peers not yet upgraded.
        let old = r#"{"defs":"0123456789abcdef","e":[[60000,["00000000000000000000000000000001","00000000000000000000000000000002"]],[120000,["00000000000000000000000000000001","00000000000000000000000000000002","00000000000000000000000000000003"]]],"f":[[0,60000,["00000000000000000000000000000001","00000000000000000000000000000002"]]],"h":30000,"k":["00000000000000ab"],"s":5000,"wm":125000}"#;
        let a = parse_announcement(old).expect("old form");
        let e = |to: u64, m: &[u128]| super::super::seal::Epoch {
            to,
            members: m.iter().map(|&n| rid(n)).collect(),
        };
        assert_eq!(
            a,
            Announcement {
                wm: 125_000,
                defs: "0123456789abcdef".into(),
                horizon: Some(30_000),
                epochs: Some(vec![e(60_000, &[1, 2]), e(120_000, &[1, 2, 3])]),
                sealed: vec![super::super::seal::Sealed {
                    from: 0,
                    to: 60_000,
                    members: vec![rid(1), rid(2)],
                }],
                since: 5_000,
                applied: true,
                met: vec![0xab],
            }
        );
        // Rewritten in the compact form, it reads back the same.
        let epochs = a.epochs.clone().expect("epochs");
        let text = announcement_text(
            &a.defs,
            &Marks {
                wm: a.wm,
                horizon: a.horizon,
                epochs: &epochs,
                sealed: &a.sealed,
                since: a.since,
                applied: a.applied,
                met: &a.met,
            },
        );
        assert!(!text.contains("\"e\"") && text.contains("\"ep\""), "{text}");
        assert_eq!(parse_announcement(&text), Ok(a));
        // An old announcement of a node that applied nothing yet, without epochs.
        let fresh = parse_announcement(r#"{"defs":"d","u":1,"wm":7}"#).expect("old form");
        assert_eq!(
            (fresh.wm, fresh.applied, fresh.epochs),
            (7, false, Some(vec![]))
        );
    }

    #[test]
    fn malformed_announcements_are_errors_or_agree_to_nothing() {
        assert!(parse_announcement("").is_err());
        assert!(parse_announcement("[1]").is_err());
        assert!(parse_announcement(r#"{"defs":"d"}"#).is_err());
        assert!(parse_announcement(r#"{"defs":1,"wm":1}"#).is_err());
        let long = format!(
            r#"{{"defs":"{}","wm":1}}"#,
            "a".repeat(ANNOUNCEMENT_BYTES_MAX)
        );
        assert!(matches!(
            parse_announcement(&long),
            Err(AnnouncementError::TooLarge { .. })
        ));
        // Bad epochs: the announcer agrees to nothing, its watermark still counts.
        let one = rid(1).to_string();
        for text in [
            format!(r#"{{"defs":"d","ep":[[5,[1]]],"r":["{one}"],"wm":9}}"#),
            format!(r#"{{"defs":"d","ep":[[5,[0]]],"r":["{one}","{one}"],"wm":9}}"#),
            r#"{"defs":"d","ep":[[5,[0]]],"wm":9}"#.to_owned(),
            format!(r#"{{"defs":"d","e":[[5,["{one}"]]],"ep":[[5,[0]]],"r":["{one}"],"wm":9}}"#),
        ] {
            let a = parse_announcement(&text).expect("still an announcement");
            assert_eq!((a.wm, a.epochs), (9, None), "{text}");
        }
        let a = parse_announcement(&format!(
            r#"{{"defs":"d","ep":[[5,[0]]],"r":["{one}"],"sl":[[0,5,[3]]],"wm":9}}"#
        ))
        .expect("announcement");
        assert_eq!(a.epochs.map(|e| e.len()), Some(1));
        assert!(a.sealed.is_empty(), "bad seals are taken as none");
    }

    #[test]
    fn announcements_grow_linearly_with_joins() {
        // One member joins at a time; every epoch is sealed; every peer met.
        let size = |joins: u128| {
            let mut epochs = Vec::new();
            let mut sealed: Vec<super::super::seal::Sealed> = Vec::new();
            let mut members = vec![rid(1)];
            for n in 1..=joins {
                members.push(rid(u128::MAX - n * 7919));
                members.sort_unstable();
                let from = epochs
                    .last()
                    .map_or(0, |e: &super::super::seal::Epoch| e.to);
                epochs = super::super::seal::extend(&epochs, n as u64 * 60_000, members.clone())
                    .expect("grows");
                sealed.push(super::super::seal::Sealed {
                    from,
                    to: n as u64 * 60_000,
                    members: members.clone(),
                });
            }
            let met: Vec<u64> = (0..joins as u64)
                .map(|p| p.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let text = announcement_text(
                "0123456789abcdef",
                &Marks {
                    wm: joins as u64 * 60_000,
                    horizon: Some(1),
                    epochs: &epochs,
                    sealed: &sealed,
                    since: 0,
                    applied: true,
                    met: &met,
                },
            );
            let back = parse_announcement(&text).expect("parses");
            assert_eq!(back.epochs.as_ref(), Some(&epochs));
            assert_eq!(back.sealed, sealed);
            text.len()
        };
        let (s32, s64) = (size(32), size(64));
        assert!(s64 < 16 * 1024, "{s64} bytes after 64 joins");
        assert!((s64 as f64) < 2.5 * s32 as f64, "{s32} → {s64}");
    }

    #[test]
    fn session_cells_sort_by_group_then_time_and_parse_back() {
        let g = r#"["a/b",1]"#;
        let k = session_key("v", "d", g, 42);
        assert_eq!(k, format!("{VIEW_PREFIX}v/d/@[\"a/b\",1]/{:020}", 42));
        assert!(k.starts_with(&session_group_prefix("v", "d", g)));
        assert!(session_key("v", "d", g, 7) < k);
        assert_eq!(
            parse_session_key("v", "d", &k),
            Some((g, vec!["a/b".into(), 1.into()], 42))
        );
        assert_eq!(cell_of(&k), Some(("v", "d", Some(42))));
        assert_eq!(parse_view_key("v", "d", &k), None, "not a window cell");
        assert_eq!(
            parse_session_key("v", "d", &view_key("v", "d", Some(1), "[]")),
            None
        );
    }

    #[test]
    fn latest_writes_get_one_stamp_per_op_and_other_writes_none() {
        let latest = Key::new(KeyKind::Lww, "~view/l/d/1/[]");
        let text = latest_record(20, "src", 7, &"v".into());
        let plain = LocalWrite {
            ops: vec![(Key::new(KeyKind::Lww, "user"), Mutation::Set(text.clone()))],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        let mixed = LocalWrite {
            ops: vec![
                (
                    Key::new(KeyKind::GCounter, "~view/c/d/1/[]"),
                    Mutation::Inc(1),
                ),
                (latest.clone(), Mutation::Set(text.clone())),
                (Key::new(KeyKind::Lww, "user"), Mutation::Set(text.clone())),
            ],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        let mut writes = vec![plain, mixed];
        stamp_latest_writes(&mut writes);
        // A client's lww write holding the same text is not a view write: never stamped.
        assert!(writes[0].stamps.is_empty());
        let want = event_stamp(&latest, &Mutation::Set(text));
        assert!(want.is_some());
        assert_eq!(writes[1].stamps, vec![None, want, None]);
    }
}
