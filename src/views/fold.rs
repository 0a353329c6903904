//! Folding events into view mutations: each event of a stream becomes, for every view of the
//! stream, mutations of view keys (one per window it falls into), each with the deadline after
//! which it is late.

use super::def::{CompiledView, ViewKind};
use super::keys;
use crate::error::Error;
use crate::limits::Limits;
use crate::ops::Event;
use tidemark_crdts::{Key, KeyKind, Mutation, Timestamp};

/// Parses RFC 3339 (`2026-11-29T10:00:00.123Z`, `+01:00` offsets, `T`/`t`/space separator)
/// into epoch milliseconds, fractions beyond milliseconds truncated; `None` for malformed
/// text, impossible dates (`2026-02-30`), a second 60 that is no leap second, or times before
/// 1970. The one parser of event times (views, the HTTP API's lines and queries).
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    use time::format_description::well_known::Rfc3339;
    // RFC 3339 allows a space between date and time ("for the sake of readability").
    let t = if s.as_bytes().get(10) == Some(&b' ') {
        let mut t = s.to_owned();
        t.replace_range(10..11, "T");
        time::OffsetDateTime::parse(&t, &Rfc3339)
    } else {
        time::OffsetDateTime::parse(s, &Rfc3339)
    }
    .ok()?;
    u64::try_from(t.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

/// An invalid event: names its index in the batch (its line) and the field.
fn bad(index: usize, field: &str, message: impl Into<String>) -> Error {
    Error::InvalidEvent {
        index,
        field: field.to_owned(),
        message: message.into(),
    }
}

/// Epoch milliseconds at or above this (the year 5138) are taken for a mistake in units.
const MICROS_FROM: u64 = 100_000_000_000_000;
/// Epoch milliseconds at or above this are taken for nanoseconds.
const NANOS_FROM: u64 = 100_000_000_000_000_000;

/// The event time of event `index`, or `now_ms` when absent; never more than `max_future_ms`
/// ahead of `now_ms`.
///
/// # Errors
/// [`Error::InvalidEvent`] (field `time`) for anything but RFC 3339 text or whole epoch
/// milliseconds, for a number that looks like epoch microseconds or nanoseconds, and for a
/// time more than `max_future_ms` ahead of `now_ms`.
pub fn event_time(ev: &Event, index: usize, now_ms: u64, max_future_ms: u64) -> Result<u64, Error> {
    let t = match &ev.time {
        None | Some(serde_json::Value::Null) => return Ok(now_ms),
        Some(serde_json::Value::Number(n)) => {
            let t = n.as_u64().ok_or_else(|| {
                bad(
                    index,
                    "time",
                    "epoch milliseconds must be a whole number ≥ 0",
                )
            })?;
            if t >= NANOS_FROM {
                return Err(bad(
                    index,
                    "time",
                    format!(
                        "{t} looks like epoch nanoseconds; `time` is epoch milliseconds \
                         (divide by 1000000) or RFC 3339 text"
                    ),
                ));
            }
            if t >= MICROS_FROM {
                return Err(bad(
                    index,
                    "time",
                    format!(
                        "{t} looks like epoch microseconds; `time` is epoch milliseconds \
                         (divide by 1000) or RFC 3339 text"
                    ),
                ));
            }
            t
        }
        Some(serde_json::Value::String(s)) => parse_rfc3339_ms(s).ok_or_else(|| {
            bad(
                index,
                "time",
                "`time` must be RFC 3339 (2026-11-29T10:00:00.123Z) or epoch milliseconds",
            )
        })?,
        Some(_) => {
            return Err(bad(
                index,
                "time",
                "`time` must be RFC 3339 text or epoch milliseconds",
            ));
        }
    };
    let limit = now_ms.saturating_add(max_future_ms);
    if t > limit {
        return Err(bad(
            index,
            "time",
            format!(
                "{t} is {} ms ahead of this node's clock ({now_ms}), more than the stream's \
                 max_future ({max_future_ms} ms)",
                t - now_ms
            ),
        ));
    }
    Ok(t)
}

/// One candidate view mutation of an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewOp {
    /// Index of the view (in the node's view list).
    pub view: usize,
    /// Index of the view cell (view, definition digest, window start, group) in
    /// [`FoldedBatch::cells`]: each cell's key is built once per batch.
    pub cell: u32,
    /// The window's start (`None`: unwindowed).
    pub start: Option<u64>,
    /// The mutation.
    pub mutation: Mutation,
    /// Late once the watermark is strictly greater than this (`None`: unwindowed, never late).
    pub deadline: Option<u64>,
    /// The event stamp of a `latest` write ([`keys::stamp`]); `None` for every other kind.
    pub stamp: Option<Timestamp>,
}

/// What one event contributes to the views of its stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldedEvent {
    /// Its event time (ms).
    pub time_ms: u64,
    /// How many candidate view mutations it has: the next ones of [`FoldedBatch::ops`].
    pub ops: usize,
}

/// What a batch contributes to the views of its stream: the cells it touches (each key built
/// once) and, per event, its candidate mutations naming those cells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldedBatch {
    /// The view cells the batch touches, in first-seen order.
    pub cells: Vec<Key>,
    /// Per event of the batch, in order.
    pub events: Vec<FoldedEvent>,
    /// The candidate view mutations of the events, event after event (one list for the
    /// batch, not one per event): event `i`'s are the `events[i].ops` after those of the
    /// events before it.
    pub ops: Vec<ViewOp>,
}

impl FoldedBatch {
    /// True when the batch's stream has no view (nothing was folded).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

fn scalar(v: &serde_json::Value) -> bool {
    v.is_string() || v.is_number() || v.is_boolean()
}

/// The string `s` when its JSON text is `"s"` as it stands: serde_json escapes only `"`, `\\`
/// and control characters below U+0020.
fn plain_string(v: &serde_json::Value) -> Option<&str> {
    match v {
        serde_json::Value::String(s) if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') => {
            Some(s)
        }
        _ => None,
    }
}

/// The JSON text of `v`, exactly what `v.to_string()` gives, without the formatter for a
/// string that needs no escape (the common element of a `distinct` or `members` view).
fn json_text(v: &serde_json::Value) -> String {
    match plain_string(v) {
        Some(s) => {
            let mut t = String::with_capacity(s.len() + 2);
            t.push('"');
            t.push_str(s);
            t.push('"');
            t
        }
        None => v.to_string(),
    }
}

/// Appends the JSON text of `v` to `buf` (what `serde_json::to_writer` writes).
fn write_json(buf: &mut Vec<u8>, v: &serde_json::Value) -> Result<(), serde_json::Error> {
    match plain_string(v) {
        Some(s) => {
            buf.push(b'"');
            buf.extend_from_slice(s.as_bytes());
            buf.push(b'"');
            Ok(())
        }
        None => serde_json::to_writer(buf, v),
    }
}

/// A fast, per-process seeded hash map (the batch's cells and groups).
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Folds the events of one batch: interns group texts and view cells across the batch, so
/// per event and view only a lookup is made (no key text is built twice).
pub struct Folder<'a> {
    views: &'a [(usize, &'a CompiledView)],
    now_ms: u64,
    max_future_ms: u64,
    limits: &'a Limits,
    /// Per view (position in `views`): the first view position with the same `group_by`.
    same_group: Vec<usize>,
    /// Group JSON text → group id.
    groups: FastMap<String, u32>,
    /// Group id → text.
    group_texts: Vec<String>,
    /// (view position, group id, window start) → cell index.
    cell_at: FastMap<(usize, u32, Option<u64>), u32>,
    out: FoldedBatch,
    /// Scratch buffer of a group's JSON text.
    buf: Vec<u8>,
    /// Scratch group ids of the current event, per view position.
    event_groups: Vec<Option<u32>>,
}

impl<'a> Folder<'a> {
    /// A folder for `views` (those of one stream), the clock `now_ms` and the stream's
    /// `max_future_ms`.
    pub fn new(
        views: &'a [(usize, &'a CompiledView)],
        now_ms: u64,
        max_future_ms: u64,
        limits: &'a Limits,
    ) -> Self {
        let same_group = views
            .iter()
            .enumerate()
            .map(|(p, (_, v))| {
                views
                    .iter()
                    .position(|(_, w)| w.def.group_by == v.def.group_by)
                    .unwrap_or(p)
            })
            .collect();
        Self {
            views,
            now_ms,
            max_future_ms,
            limits,
            same_group,
            groups: FastMap::default(),
            group_texts: Vec::new(),
            cell_at: FastMap::default(),
            out: FoldedBatch::default(),
            buf: Vec::new(),
            event_groups: vec![None; views.len()],
        }
    }

    /// Makes room for `events` more events (one allocation for each of the batch's lists).
    pub fn reserve(&mut self, events: usize) {
        self.out.events.reserve(events);
        self.out
            .ops
            .reserve(events.saturating_mul(self.views.len()));
    }

    /// The batch folded so far.
    pub fn finish(self) -> FoldedBatch {
        self.out
    }

    /// The group id of event `ev` for the view at position `p` (its `group_by` values as a
    /// JSON array, the text serde_json gives `Value::Array`), interned across the batch.
    fn group(&mut self, ev: &Event, index: usize, p: usize) -> Result<u32, Error> {
        let first = self.same_group.get(p).copied().unwrap_or(p);
        if let Some(Some(g)) = self.event_groups.get(first) {
            return Ok(*g);
        }
        let d = &self.views[p].1.def;
        self.buf.clear();
        self.buf.push(b'[');
        for (n, g) in d.group_by.iter().enumerate() {
            let v = ev.fields.get(g).ok_or_else(|| {
                bad(
                    index,
                    g,
                    format!("missing group field {g:?} of view {:?}", d.name),
                )
            })?;
            if n > 0 {
                self.buf.push(b',');
            }
            write_json(&mut self.buf, v).map_err(|e| bad(index, g, e.to_string()))?;
        }
        self.buf.push(b']');
        let text =
            std::str::from_utf8(&self.buf).map_err(|e| bad(index, "group_by", e.to_string()))?;
        let id = match self.groups.get(text) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.group_texts.len()).unwrap_or(u32::MAX);
                self.groups.insert(text.to_owned(), id);
                self.group_texts.push(text.to_owned());
                id
            }
        };
        if let Some(slot) = self.event_groups.get_mut(first) {
            *slot = Some(id);
        }
        Ok(id)
    }

    /// The cell index of the view at position `p`, group `group`, window `start`: its key is
    /// built (and its length checked) the first time the batch touches it.
    fn cell(
        &mut self,
        index: usize,
        p: usize,
        kind: KeyKind,
        group: u32,
        start: Option<u64>,
    ) -> Result<u32, Error> {
        if let Some(&c) = self.cell_at.get(&(p, group, start)) {
            return Ok(c);
        }
        let view = self.views[p].1;
        let d = &view.def;
        let text = self
            .group_texts
            .get(group as usize)
            .map_or("", String::as_str);
        let session = view.window.is_some_and(|w| w.session_gap_ms.is_some());
        let name = match start {
            // A session view: one cell per group and event time, group first.
            Some(t) if session => keys::session_key(&d.name, &view.digest, text, t),
            _ => keys::view_key(&d.name, &view.digest, start, text),
        };
        if name.len() > self.limits.key_bytes_max {
            let f = d.group_by.first().map_or("group_by", String::as_str);
            return Err(bad(
                index,
                f,
                format!(
                    "the group values of view {:?} are too long for a key ({} bytes, limit {})",
                    d.name,
                    name.len(),
                    self.limits.key_bytes_max
                ),
            ));
        }
        let c = u32::try_from(self.out.cells.len()).unwrap_or(u32::MAX);
        self.out.cells.push(Key::new(kind, name));
        self.cell_at.insert((p, group, start), c);
        Ok(c)
    }

    /// Folds event `index` of the batch into candidate view mutations.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] naming the event and the field: a missing group or value
    /// field, a non-integer `sum` field, a non-scalar `distinct`/`members` element, a value or
    /// group over its size limit, a malformed, ambiguous or too-far-future `time` (see
    /// [`event_time`]).
    pub fn fold(&mut self, ev: &Event, index: usize) -> Result<(), Error> {
        let time_ms = event_time(ev, index, self.now_ms, self.max_future_ms)?;
        // This event's ops go after the batch's so far; an invalid event leaves none.
        let first = self.out.ops.len();
        let folded = self.fold_ops(ev, index, time_ms);
        if folded.is_err() {
            self.out.ops.truncate(first);
        }
        folded?;
        let ops = self.out.ops.len() - first;
        self.out.events.push(FoldedEvent { time_ms, ops });
        Ok(())
    }

    /// The view ops of event `index` (at `time_ms`), appended to the batch's.
    fn fold_ops(&mut self, ev: &Event, index: usize, time_ms: u64) -> Result<(), Error> {
        self.event_groups.iter_mut().for_each(|g| *g = None);
        let limits = self.limits;
        for p in 0..self.views.len() {
            let (vi, view) = self.views[p];
            let d = &view.def;
            let fail = |field: &str, msg: String| bad(index, field, msg);
            let group = self.group(ev, index, p)?;
            let value = |field: &str| {
                ev.fields.get(field).ok_or_else(|| {
                    fail(
                        field,
                        format!("missing value field {field:?} of view {:?}", d.name),
                    )
                })
            };
            let field = d.field.as_deref().unwrap_or_default();
            let element = |v: &serde_json::Value| -> Result<String, Error> {
                if !scalar(v) {
                    return Err(fail(
                        field,
                        format!("view {:?} needs a string, number or boolean", d.name),
                    ));
                }
                let text = json_text(v);
                if text.len() > limits.element_bytes_max {
                    return Err(fail(
                        field,
                        format!(
                            "{} bytes, over element_bytes_max {}",
                            text.len(),
                            limits.element_bytes_max
                        ),
                    ));
                }
                Ok(text)
            };
            let mut stamp = None;
            let (kind, mutation) = match d.kind {
                ViewKind::Count => (KeyKind::GCounter, Some(Mutation::Inc(1))),
                ViewKind::Sum => {
                    let v = value(field)?;
                    let n = v.as_i64().ok_or_else(|| {
                        fail(field, format!("view {:?} sums integers; got {v}", d.name))
                    })?;
                    let m = match n {
                        0 => None,
                        n if n > 0 => Some(Mutation::Inc(n.unsigned_abs())),
                        n => Some(Mutation::Dec(n.unsigned_abs())),
                    };
                    (KeyKind::PNCounter, m)
                }
                ViewKind::Distinct => {
                    (KeyKind::ORSet, Some(Mutation::Add(element(value(field)?)?)))
                }
                ViewKind::Members => {
                    let matches = |c: &Option<super::def::FieldEquals>| {
                        c.as_ref()
                            .is_some_and(|c| ev.fields.get(&c.field) == Some(&c.equals))
                    };
                    let m = if matches(&d.add_when) {
                        Some(Mutation::Add(element(value(field)?)?))
                    } else if matches(&d.remove_when) {
                        Some(Mutation::Remove(element(value(field)?)?))
                    } else {
                        None
                    };
                    (KeyKind::ORSet, m)
                }
                ViewKind::Latest => {
                    let text = keys::latest_record(time_ms, &ev.source, ev.seq, value(field)?);
                    if text.len() > limits.value_bytes_max {
                        return Err(fail(
                            field,
                            format!(
                                "{} bytes, over value_bytes_max {}",
                                text.len(),
                                limits.value_bytes_max
                            ),
                        ));
                    }
                    stamp = Some(keys::stamp(time_ms, &ev.source, ev.seq));
                    (KeyKind::Lww, Some(Mutation::Set(text)))
                }
            };
            let Some(mutation) = mutation else { continue };
            match &view.window {
                None => {
                    let cell = self.cell(index, p, kind, group, None)?;
                    self.out.ops.push(ViewOp {
                        view: vi,
                        cell,
                        start: None,
                        mutation,
                        deadline: None,
                        stamp,
                    });
                }
                Some(w) if w.every_ms >= w.size_ms => {
                    // Tumbling (and session cells): one window at most, no list built.
                    let s = time_ms - time_ms % w.every_ms;
                    if time_ms - s < w.size_ms {
                        let cell = self.cell(index, p, kind, group, Some(s))?;
                        self.out.ops.push(ViewOp {
                            view: vi,
                            cell,
                            start: Some(s),
                            mutation,
                            deadline: Some(w.deadline(s)),
                            stamp,
                        });
                    }
                }
                Some(w) => {
                    for s in w.starts(time_ms) {
                        let cell = self.cell(index, p, kind, group, Some(s))?;
                        self.out.ops.push(ViewOp {
                            view: vi,
                            cell,
                            start: Some(s),
                            mutation: mutation.clone(),
                            deadline: Some(w.deadline(s)),
                            stamp,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{json_text, parse_rfc3339_ms, write_json};
    use proptest::prelude::*;

    proptest! {
        /// The texts written without the formatter are byte for byte serde_json's, for any
        /// string (escapes, control characters, non-ASCII) and for numbers and booleans.
        #[test]
        fn json_text_is_serde_jsons(s in ".{0,24}", n in any::<i64>(), f in any::<f64>(), b in any::<bool>()) {
            let values = [
                serde_json::Value::from(s.as_str()),
                serde_json::Value::from(format!("a\"{s}\\\u{1}\u{7f}")),
                serde_json::Value::from(n),
                serde_json::json!(f),
                serde_json::Value::from(b),
            ];
            for v in values {
                prop_assert_eq!(json_text(&v), v.to_string());
                let mut buf = b"[".to_vec();
                write_json(&mut buf, &v).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(buf, format!("[{v}").into_bytes());
            }
        }
    }

    #[test]
    fn rfc3339_parses_to_epoch_millis() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T10:00:00.123Z"),
            Some(1_795_946_400_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T11:00:00.123+01:00"),
            Some(1_795_946_400_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29T10:00:00.1Z"),
            Some(1_795_946_400_100)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29 10:00:00Z"),
            Some(1_795_946_400_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-29t10:00:00.123456789z"),
            Some(1_795_946_400_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00Z"),
            Some(1_709_164_800_000)
        );
        for bad in [
            "2026-11-29",
            "2026-13-01T00:00:00Z",
            "2026-11-29T10:00:00",
            "1969-12-31T23:59:59Z",
            "2026-11-29T10:00:00.Z",
            "2026-02-30T10:00:00Z",
            "2026-11-29T04:42:60Z",
            "2026-11-29T10:00:00+24:00",
            "2026-11-29T10:00:00Zjunk",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
