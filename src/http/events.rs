//! Parsing request bodies into ops and events, naming the index, line and field at fault.

use super::error::{ApiError, Pos};
use crate::config::Limits;
use crate::ops::{Op, OpsValidator};
use crate::store::LocalWrite;
use crate::views::Event;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The field a serde error is about: the path it failed at, or the name in backticks of an
/// unknown/missing field message.
fn field_of(path: &str, message: &str) -> Option<String> {
    if !path.is_empty() && path != "." && path != "?" {
        return Some(path.to_owned());
    }
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_owned())
}

/// Deserializes one op from its JSON value, naming the field at fault.
pub(crate) fn op_from_value(value: serde_json::Value, pos: Pos) -> Result<Op, ApiError> {
    if !value.is_object() {
        return Err(
            ApiError::bad_request("invalid_op", "an op must be a JSON object").at(pos.to_string()),
        );
    }
    serde_path_to_error::deserialize::<_, Op>(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        let at = match field_of(&path, &message) {
            Some(field) => format!("{pos}, field {field}"),
            None => pos.to_string(),
        };
        ApiError::bad_request("invalid_op", message).at(at)
    })
}

fn syntax_error(e: &serde_json::Error, line: Option<usize>) -> ApiError {
    let at = match line {
        Some(l) => format!("line {l}, column {}", e.column()),
        None => format!("line {}, column {}", e.line(), e.column()),
    };
    ApiError::bad_request("invalid_json", format!("malformed JSON: {e}")).at(at)
}

/// An op as sent, its `value` kept as the JSON text it arrived as (borrowed from the body):
/// no tree is built for a value before its size is checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename = "op")]
struct WireOp<'a> {
    #[serde(rename = "type")]
    kind: String,
    key: String,
    op: String,
    #[serde(default)]
    by: Option<u64>,
    #[serde(borrow, default)]
    value: Option<&'a RawValue>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    seq: Option<u64>,
}

/// The op of `w`, refusing (413) a value whose text is over twice the larger value limit
/// before any tree is built for it; the tree then built lives only until validation.
fn wire_to_op(w: WireOp<'_>, pos: Pos, limits: &Limits) -> Result<Op, ApiError> {
    let value = match w.value {
        None => None,
        Some(raw) => {
            let limit = limits
                .value_bytes_max
                .max(limits.element_bytes_max)
                .saturating_mul(2);
            let len = raw.get().len();
            if len > limit {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    format!("field `value` is {len} bytes as sent, over twice the value limit"),
                )
                .at(format!("{pos}, field value")));
            }
            // Inside a value too, a member given twice would silently mean its last copy.
            let mut de = serde_json::Deserializer::from_str(raw.get());
            if let Err(e) = NoDuplicates::deserialize(&mut de) {
                if let Some(member) = e.to_string().strip_prefix(DUPLICATE) {
                    let member = member.split('`').next().unwrap_or("");
                    return Err(ApiError::bad_request(
                        "invalid_op",
                        format!("member `{member}` is given twice in the value"),
                    )
                    .at(format!("{pos}, field value")));
                }
            }
            Some(serde_json::from_str(raw.get()).map_err(|e| syntax_error(&e, None))?)
        }
    };
    Ok(Op {
        kind: w.kind,
        key: w.key,
        op: w.op,
        by: w.by,
        value,
        source: w.source,
        seq: w.seq,
    })
}

/// Maps a serde error on an op (at `pos`, `path` inside it) to the API error naming the field.
fn op_error(e: &serde_json::Error, path: &str, pos: Pos, line: Option<usize>) -> ApiError {
    if matches!(
        e.classify(),
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof
    ) {
        return syntax_error(e, line);
    }
    let message = e.to_string();
    let at = match field_of(path, &message) {
        Some(field) => format!("{pos}, field {field}"),
        None => pos.to_string(),
    };
    ApiError::bad_request("invalid_op", message).at(at)
}

/// Feeds each element of a JSON array to `each` as it is parsed, stopping at the first error
/// (the parsed ops are never all held at once).
struct EachOp<'f, F> {
    each: &'f mut F,
    failed: &'f mut Option<ApiError>,
}

impl<'de, F> serde::de::Visitor<'de> for EachOp<'_, F>
where
    F: FnMut(usize, WireOp<'de>) -> Result<(), ApiError>,
{
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array of ops")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while let Some(op) = seq.next_element::<WireOp<'de>>()? {
            if let Err(e) = (self.each)(i, op) {
                *self.failed = Some(e);
                return Err(serde::de::Error::custom("refused"));
            }
            i += 1;
        }
        Ok(())
    }
}

impl<'de, F> serde::de::DeserializeSeed<'de> for EachOp<'_, F>
where
    F: FnMut(usize, WireOp<'de>) -> Result<(), ApiError>,
{
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

/// The writes of a `/v1/ops` body, a JSON array or NDJSON, validated op by op as they are
/// parsed (so memory stays a small multiple of the body), with the position of each; nothing
/// is kept of a refused body.
pub(crate) fn parse_ops(
    body: &[u8],
    limits: &Limits,
) -> Result<(Vec<LocalWrite>, Vec<Pos>), ParseError> {
    let mut validator = OpsValidator::new(limits);
    let mut writes = Vec::new();
    let mut positions = Vec::new();
    let mut failed: Option<ParseError> = None;
    let mut take = |op: Op, pos: Pos| -> Result<(), ParseError> {
        positions.push(pos);
        let w = validator.push(&op).map_err(|e| ParseError::Node(e, pos))?;
        writes.push(w);
        Ok(())
    };
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    match first {
        None => {
            return Err(ParseError::Api(ApiError::bad_request(
                "empty_body",
                "send a JSON array of ops or NDJSON (one op per line)",
            )));
        }
        Some(b'[') => {
            let mut api_failed = None;
            let mut each = |i: usize, w: WireOp<'_>| -> Result<(), ApiError> {
                let op = wire_to_op(w, Pos::Index(i), limits)?;
                if let Err(e) = take(op, Pos::Index(i)) {
                    failed = Some(e);
                    return Err(ApiError::bad_request("refused", ""));
                }
                Ok(())
            };
            let mut de = serde_json::Deserializer::from_slice(body);
            let mut track = serde_path_to_error::Track::new();
            let seed = EachOp {
                each: &mut each,
                failed: &mut api_failed,
            };
            let result = serde::de::DeserializeSeed::deserialize(
                seed,
                serde_path_to_error::Deserializer::new(&mut de, &mut track),
            )
            .and_then(|()| de.end());
            if let Some(e) = failed {
                return Err(e);
            }
            if let Some(e) = api_failed {
                return Err(ParseError::Api(e));
            }
            if let Err(e) = result {
                let path = track.path().to_string();
                // `[3].by`: the index, then the path inside the op.
                let (index, inner) = match path.strip_prefix('[').and_then(|p| p.split_once(']')) {
                    Some((i, rest)) => (i.parse().ok(), rest.trim_start_matches('.')),
                    None => (None, ""),
                };
                return Err(ParseError::Api(match index {
                    Some(i) => op_error(&e, inner, Pos::Index(i), None),
                    None => syntax_error(&e, None),
                }));
            }
        }
        Some(_) => {
            for (i, line) in body.split(|b| *b == b'\n').enumerate() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let pos = Pos::Line(i + 1);
                let mut de = serde_json::Deserializer::from_slice(line);
                let w: WireOp<'_> = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    ParseError::Api(op_error(e.inner(), &e.path().to_string(), pos, Some(i + 1)))
                })?;
                de.end()
                    .map_err(|e| ParseError::Api(syntax_error(&e, Some(i + 1))))?;
                let op = wire_to_op(w, pos, limits).map_err(ParseError::Api)?;
                take(op, pos)?;
            }
        }
    }
    Ok((writes, positions))
}

/// Why a body was refused: malformed (an API error already naming the place) or an op that
/// does not validate (a node error naming its batch index).
#[derive(Debug)]
pub(crate) enum ParseError {
    Api(ApiError),
    /// The node error and the position of the op it is about.
    Node(crate::error::Error, Pos),
}

fn bad_event(line: usize, field: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_event", message).at(format!("line {line}, field {field}"))
}

/// One NDJSON event line: `{"source","seq","time"?, "ops"?: [...], ...fields}`. `ops`, when
/// present, are applied with the event (idempotently); `time` (RFC 3339 or epoch millis) is
/// its event time; every other member is a field the stream's views read.
pub(crate) fn parse_event(line_no: usize, line: &[u8]) -> Result<Event, ApiError> {
    // A member given twice would silently mean its last copy: refused, naming it.
    let mut de = serde_json::Deserializer::from_slice(line);
    if let Err(e) = serde::Deserialize::deserialize(&mut de).map(|NoDuplicates| ()) {
        if let Some(member) = e.to_string().strip_prefix(DUPLICATE) {
            let member = member.split('`').next().unwrap_or("");
            return Err(bad_event(
                line_no,
                member,
                format!("member `{member}` is given twice"),
            ));
        }
    }
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| syntax_error(&e, Some(line_no)))?;
    let serde_json::Value::Object(mut map) = value else {
        return Err(
            ApiError::bad_request("invalid_event", "an event must be a JSON object")
                .at(format!("line {line_no}")),
        );
    };
    let source = match map.remove("source") {
        Some(serde_json::Value::String(s)) if !s.is_empty() => s,
        Some(_) => {
            return Err(bad_event(
                line_no,
                "source",
                "`source` must be a non-empty string",
            ));
        }
        None => return Err(bad_event(line_no, "source", "missing field `source`")),
    };
    let seq = match map.remove("seq") {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad_event(line_no, "seq", "`seq` must be a non-negative integer"))?,
        None => return Err(bad_event(line_no, "seq", "missing field `seq`")),
    };
    let time = map.remove("time");
    match &time {
        None => {}
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some() => {}
        Some(serde_json::Value::String(s)) if parse_event_time_ms(s).is_some() => {}
        Some(_) => {
            return Err(bad_event(
                line_no,
                "time",
                "`time` must be RFC 3339 (2026-11-29T10:00:00.123Z) or epoch milliseconds",
            ));
        }
    }
    let ops = match map.remove("ops") {
        None => Vec::new(),
        Some(serde_json::Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                op_from_value(v, Pos::Line(line_no)).map_err(|e| {
                    let at = e.at.clone().unwrap_or_default().replacen(
                        &format!("line {line_no}"),
                        &format!("line {line_no}, ops[{i}]"),
                        1,
                    );
                    e.at(at)
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad_event(line_no, "ops", "`ops` must be an array of ops")),
    };
    Ok(Event {
        source,
        seq,
        time,
        ops,
        fields: map,
    })
}

const DUPLICATE: &str = "duplicate member `";

/// Walks a JSON document, failing on the first object that names a member twice (nothing is
/// built: each object only holds the set of its member names while it is walked).
struct NoDuplicates;

impl<'de> Deserialize<'de> for NoDuplicates {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicates)
    }
}

impl<'de> serde::de::Visitor<'de> for NoDuplicates {
    type Value = NoDuplicates;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if seen.contains(&key) {
                return Err(serde::de::Error::custom(format!("{DUPLICATE}{key}`")));
            }
            seen.insert(key);
            map.next_value::<NoDuplicates>()?;
        }
        Ok(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<NoDuplicates>()?.is_some() {}
        Ok(self)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }
}

/// Parses an RFC 3339 event time into epoch milliseconds (the views' parser, so the HTTP
/// API checks lines and queries exactly as views read them).
pub fn parse_event_time_ms(s: &str) -> Option<u64> {
    crate::views::fold::parse_rfc3339_ms(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_event_time_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_event_time_ms("2026-11-29T10:00:00.123Z"),
            Some(1_795_946_400_123)
        );
        assert_eq!(
            parse_event_time_ms("2026-11-29T12:00:00.123+02:00"),
            Some(1_795_946_400_123)
        );
        assert_eq!(parse_event_time_ms("2026-13-29T10:00:00Z"), None);
        assert_eq!(parse_event_time_ms("yesterday"), None);
        assert_eq!(parse_event_time_ms("2026-11-29T10:00:00"), None);
    }

    #[test]
    fn event_errors_name_line_and_field() {
        let e = parse_event(7, br#"{"source":"a","seq":-1}"#).err();
        assert_eq!(e.and_then(|e| e.at), Some("line 7, field seq".into()));
        let e = parse_event(
            3,
            br#"{"source":"a","seq":1,"ops":[{"type":"gcounter","key":"k","op":"inc","by":"x"}]}"#,
        )
        .err();
        assert_eq!(
            e.and_then(|e| e.at),
            Some("line 3, ops[0], field by".into())
        );
        let ev = parse_event(1, br#"{"source":"a","seq":5,"time":1,"page":"/"}"#).ok();
        assert_eq!(
            ev.map(|e| (e.source, e.seq, e.time, e.fields)),
            Some((
                "a".into(),
                5,
                Some(1.into()),
                serde_json::json!({"page": "/"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
            ))
        );
    }
}
