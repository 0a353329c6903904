//! Parsing request bodies into ops and events, naming the index, line and field at fault.

use super::error::{ApiError, Pos};
use crate::ops::Op;
use crate::views::StreamEvent;

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

/// Ops of a `/v1/ops` body, a JSON array or NDJSON, with the position of each.
pub(crate) fn parse_ops(body: &[u8]) -> Result<(Vec<Op>, Vec<Pos>), ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    match first {
        None => Err(ApiError::bad_request(
            "empty_body",
            "send a JSON array of ops or NDJSON (one op per line)",
        )),
        Some(b'[') => {
            let values: Vec<serde_json::Value> =
                serde_json::from_slice(body).map_err(|e| syntax_error(&e, None))?;
            let mut ops = Vec::with_capacity(values.len());
            let mut positions = Vec::with_capacity(values.len());
            for (i, v) in values.into_iter().enumerate() {
                ops.push(op_from_value(v, Pos::Index(i))?);
                positions.push(Pos::Index(i));
            }
            Ok((ops, positions))
        }
        Some(_) => {
            let mut ops = Vec::new();
            let mut positions = Vec::new();
            for (i, line) in body.split(|b| *b == b'\n').enumerate() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let v: serde_json::Value =
                    serde_json::from_slice(line).map_err(|e| syntax_error(&e, Some(i + 1)))?;
                ops.push(op_from_value(v, Pos::Line(i + 1))?);
                positions.push(Pos::Line(i + 1));
            }
            Ok((ops, positions))
        }
    }
}

fn bad_event(line: usize, field: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_event", message).at(format!("line {line}, field {field}"))
}

/// One NDJSON event line: `{"source","seq","time"?, "ops"?: [...], ...fields}`. `ops`, when
/// present, are applied with the event (idempotently); `time` (RFC 3339 or epoch millis) is
/// its event time; every other member is a field the stream's views read.
pub(crate) fn parse_event(line_no: usize, line: &[u8]) -> Result<StreamEvent, ApiError> {
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
    Ok(StreamEvent {
        source,
        seq,
        time,
        ops,
        fields: map,
    })
}

fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Days from 1970-01-01 to the civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u64, d: u64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses an RFC 3339 timestamp (`2026-11-29T10:00:00.123Z`, `...+02:00`) into epoch
/// milliseconds; `None` when it is not one (or is before 1970).
pub fn parse_event_time_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (digits(&b[0..4])?, digits(&b[5..7])?, digits(&b[8..10])?);
    let (hour, min, sec) = (
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut rest = &b[19..];
    let mut millis = 0u64;
    if rest.first() == Some(&b'.') {
        let n = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        let frac = &rest[1..1 + n];
        for (i, d) in frac.iter().take(3).enumerate() {
            millis += u64::from(d - b'0') * 10u64.pow(2 - i as u32);
        }
        rest = &rest[1 + n..];
    }
    let offset_min: i64 = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let h = digits(&[*h1, *h2])? as i64;
            let m = digits(&[*m1, *m2])? as i64;
            if h > 23 || m > 59 {
                return None;
            }
            if *sign == b'+' {
                h * 60 + m
            } else {
                -(h * 60 + m)
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year as i64, month, day);
    let secs = days * 86_400 + (hour * 3600 + min * 60 + sec) as i64 - offset_min * 60;
    let ms = secs.checked_mul(1000)?.checked_add(millis as i64)?;
    u64::try_from(ms).ok()
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
