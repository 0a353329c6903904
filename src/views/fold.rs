//! Folding events into view mutations: each event of a stream becomes, for every view of the
//! stream, mutations of view keys (one per window it falls into), each with the deadline after
//! which it is late.

use super::def::{CompiledView, ViewKind};
use super::keys;
use crate::error::Error;
use crate::limits::Limits;
use crate::ops::Event;
use tidemark_crdts::{Key, KeyKind, Mutation};

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
    /// The view key (view, definition digest, window start, group).
    pub key: Key,
    /// The window's start (`None`: unwindowed).
    pub start: Option<u64>,
    /// The mutation.
    pub mutation: Mutation,
    /// Late once the watermark is strictly greater than this (`None`: unwindowed, never late).
    pub deadline: Option<u64>,
}

/// What one event contributes to the views of its stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldedEvent {
    /// Its event time (ms).
    pub time_ms: u64,
    /// The candidate view mutations.
    pub ops: Vec<ViewOp>,
}

fn scalar(v: &serde_json::Value) -> bool {
    v.is_string() || v.is_number() || v.is_boolean()
}

/// Folds event `index` into candidate view mutations for `views` (those of its stream).
///
/// # Errors
/// [`Error::InvalidEvent`] naming the event and the field: a missing group or value field, a
/// non-integer `sum` field, a non-scalar `distinct`/`members` element, a value or group over
/// its size limit, a malformed, ambiguous or too-far-future `time` (see [`event_time`]).
pub fn fold_event(
    ev: &Event,
    index: usize,
    views: &[(usize, &CompiledView)],
    now_ms: u64,
    max_future_ms: u64,
    limits: &Limits,
) -> Result<FoldedEvent, Error> {
    let time_ms = event_time(ev, index, now_ms, max_future_ms)?;
    let mut ops = Vec::new();
    // The group text of each distinct `group_by` list, computed once per event.
    let mut groups: Vec<(&[String], String)> = Vec::new();
    for &(vi, view) in views {
        let d = &view.def;
        let fail = |field: &str, msg: String| bad(index, field, msg);
        let known = groups
            .iter()
            .find(|(by, _)| *by == d.group_by.as_slice())
            .map(|(_, g)| g.clone());
        let group = match known {
            Some(g) => g,
            None => {
                let mut group = Vec::with_capacity(d.group_by.len());
                for g in &d.group_by {
                    let v = ev.fields.get(g).ok_or_else(|| {
                        fail(g, format!("missing group field {g:?} of view {:?}", d.name))
                    })?;
                    group.push(v.clone());
                }
                let text = serde_json::Value::Array(group).to_string();
                groups.push((d.group_by.as_slice(), text.clone()));
                text
            }
        };
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
            let text = v.to_string();
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
            ViewKind::Distinct => (KeyKind::ORSet, Some(Mutation::Add(element(value(field)?)?))),
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
                (KeyKind::Lww, Some(Mutation::Set(text)))
            }
        };
        let Some(mutation) = mutation else { continue };
        let windows: Vec<(Option<u64>, Option<u64>)> = match &view.window {
            None => vec![(None, None)],
            Some(w) => w
                .starts(time_ms)
                .into_iter()
                .map(|s| (Some(s), Some(w.deadline(s))))
                .collect(),
        };
        let session = view.window.is_some_and(|w| w.session_gap_ms.is_some());
        for (start, deadline) in windows {
            let name = match start {
                // A session view: one cell per group and event time, group first.
                Some(t) if session => keys::session_key(&d.name, &view.digest, &group, t),
                _ => keys::view_key(&d.name, &view.digest, start, &group),
            };
            if name.len() > limits.key_bytes_max {
                let f = d.group_by.first().map_or("group_by", String::as_str);
                return Err(fail(
                    f,
                    format!(
                        "the group values of view {:?} are too long for a key ({} bytes, limit {})",
                        d.name,
                        name.len(),
                        limits.key_bytes_max
                    ),
                ));
            }
            ops.push(ViewOp {
                view: vi,
                key: Key::new(kind, name),
                start,
                mutation: mutation.clone(),
                deadline,
            });
        }
    }
    Ok(FoldedEvent { time_ms, ops })
}

#[cfg(test)]
mod tests {
    use super::parse_rfc3339_ms;

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
