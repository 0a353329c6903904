//! Operations and events as clients send them (API.md "Operations", "Events"), and their
//! validation into lattice mutations. Every rejection names the op's index and the field.

use crate::error::Error;
use crate::limits::Limits;
use crate::store::{EventId, LocalWrite};
use serde::{Deserialize, Serialize};
use tidemark_crdts::{Key, KeyKind, Mutation};

/// One operation, in the JSON shape of API.md:
/// `{"type":"orset","key":"online","op":"add","value":"alice"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Op {
    /// Key type: `gcounter`, `pncounter`, `orset`, `lww` or `mvreg`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Key name: 1–256 bytes of UTF-8, no control characters.
    pub key: String,
    /// `inc`, `dec`, `add`, `remove`, `set` or `delete`.
    pub op: String,
    /// Amount for `inc`/`dec` (default 1, must be positive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<u64>,
    /// Element (`add`/`remove`) or value (`set`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// Source for idempotent ops (with `seq`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Per-source sequence number for idempotent ops (with `source`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

impl Op {
    fn new(kind: KeyKind, key: &str, op: &str) -> Self {
        Self {
            kind: kind.as_str().to_owned(),
            key: key.to_owned(),
            op: op.to_owned(),
            by: None,
            value: None,
            source: None,
            seq: None,
        }
    }
    /// `gcounter/key += by`.
    pub fn inc_gcounter(key: &str, by: u64) -> Self {
        Self {
            by: Some(by),
            ..Self::new(KeyKind::GCounter, key, "inc")
        }
    }
    /// `pncounter/key += by`.
    pub fn inc_pncounter(key: &str, by: u64) -> Self {
        Self {
            by: Some(by),
            ..Self::new(KeyKind::PNCounter, key, "inc")
        }
    }
    /// `pncounter/key -= by`.
    pub fn dec_pncounter(key: &str, by: u64) -> Self {
        Self {
            by: Some(by),
            ..Self::new(KeyKind::PNCounter, key, "dec")
        }
    }
    /// Adds `value` to `orset/key`.
    pub fn add(key: &str, value: impl Into<serde_json::Value>) -> Self {
        Self {
            value: Some(value.into()),
            ..Self::new(KeyKind::ORSet, key, "add")
        }
    }
    /// Removes `value` from `orset/key` (the adds this node has seen).
    pub fn remove(key: &str, value: impl Into<serde_json::Value>) -> Self {
        Self {
            value: Some(value.into()),
            ..Self::new(KeyKind::ORSet, key, "remove")
        }
    }
    /// Writes `lww/key`.
    pub fn set_lww(key: &str, value: impl Into<serde_json::Value>) -> Self {
        Self {
            value: Some(value.into()),
            ..Self::new(KeyKind::Lww, key, "set")
        }
    }
    /// Writes `mvreg/key`.
    pub fn set_mvreg(key: &str, value: impl Into<serde_json::Value>) -> Self {
        Self {
            value: Some(value.into()),
            ..Self::new(KeyKind::MvReg, key, "set")
        }
    }
    /// Deletes an orset, lww or mvreg key (counters refuse).
    pub fn delete(kind: KeyKind, key: &str) -> Self {
        Self::new(kind, key, "delete")
    }
    /// Makes the op idempotent under `(source, seq)`.
    pub fn with_id(mut self, source: &str, seq: u64) -> Self {
        self.source = Some(source.to_owned());
        self.seq = Some(seq);
        self
    }
}

/// An event of a stream, the one shape every ingest path takes (API.md "Events and streams"):
/// `{"source":"app-7","seq":1042,"time":"2026-11-29T10:00:00.123Z","page":"/home"}`.
/// `source` + `seq` identify it (a retry is a no-op); its `ops`, when present, are applied
/// together, or not at all when it is a duplicate; every other member is a field the stream's
/// views read, and `time` (RFC 3339 or epoch milliseconds) places it in their windows
/// (default: the ingesting node's clock).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The producer.
    pub source: String,
    /// The producer's sequence number: `(source, seq)` identifies the event.
    pub seq: u64,
    /// Event time: RFC 3339 text or epoch milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<serde_json::Value>,
    /// Operations applied with the event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<Op>,
    /// The fields views read.
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl Event {
    /// An event with fields and no time (it takes the ingesting node's clock).
    pub fn new(source: &str, seq: u64, fields: serde_json::Value) -> Self {
        Self {
            source: source.to_owned(),
            seq,
            fields: match fields {
                serde_json::Value::Object(m) => m,
                _ => serde_json::Map::new(),
            },
            ..Self::default()
        }
    }

    /// An event that applies `ops` (no fields, no time).
    pub fn with_ops(source: &str, seq: u64, ops: Vec<Op>) -> Self {
        Self {
            source: source.to_owned(),
            seq,
            ops,
            ..Self::default()
        }
    }

    /// Sets the event time in epoch milliseconds.
    #[must_use]
    pub fn at(mut self, time_ms: u64) -> Self {
        self.time = Some(time_ms.into());
        self
    }
}

/// The stream under which idempotent plain ops (`source`/`seq` on an op) are deduplicated.
pub const OPS_STREAM: &str = "_ops";

fn invalid(index: usize, field: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidOp {
        index,
        field,
        message: message.into(),
    }
}

/// Canonical JSON text: object keys sorted, no whitespace (serde_json's map is ordered).
fn canonical(v: &serde_json::Value) -> String {
    v.to_string()
}

/// Validates one op into its key and mutation; `index` is its position in the caller's batch.
///
/// # Errors
/// [`Error::InvalidOp`], [`Error::WrongOp`], [`Error::CounterNotDeletable`] or
/// [`Error::TooLarge`], naming `index` and the field at fault.
pub fn validate_op(op: &Op, index: usize, limits: &Limits) -> Result<(Key, Mutation), Error> {
    let kind = KeyKind::parse(&op.kind).ok_or_else(|| {
        invalid(
            index,
            "type",
            format!(
                "unknown type {:?} (gcounter, pncounter, orset, lww, mvreg)",
                op.kind
            ),
        )
    })?;
    crate::admission::check_key_name(&op.key, limits)
        .map_err(|e| invalid(index, "key", e.to_string()))?;
    if crate::model::is_reserved(&op.key) {
        return Err(invalid(
            index,
            "key",
            format!(
                "names starting with `{}` are reserved for the node's internal keys ({})",
                crate::model::RESERVED_PREFIX,
                crate::model::reserved_prefixes_text()
            ),
        ));
    }
    let key = Key::new(kind, op.key.clone());
    let value_text = |limit: usize| -> Result<String, Error> {
        let v = op
            .value
            .as_ref()
            .ok_or_else(|| invalid(index, "value", format!("`{}` needs a value", op.op)))?;
        let text = canonical(v);
        if text.len() > limit {
            return Err(Error::TooLarge {
                index,
                field: "value",
                len: text.len(),
                limit,
            });
        }
        Ok(text)
    };
    let by = || -> Result<u64, Error> {
        match op.by {
            Some(0) => Err(invalid(index, "by", "must be positive")),
            Some(n) => Ok(n),
            None => Ok(1),
        }
    };
    // The op must fit the type before its fields are examined.
    let applies = match (kind, op.op.as_str()) {
        (KeyKind::GCounter | KeyKind::PNCounter, "inc")
        | (KeyKind::PNCounter, "dec")
        | (KeyKind::ORSet, "add" | "remove")
        | (KeyKind::Lww | KeyKind::MvReg, "set")
        | (KeyKind::ORSet | KeyKind::Lww | KeyKind::MvReg, "delete") => true,
        (KeyKind::GCounter | KeyKind::PNCounter, "delete") => {
            return Err(Error::CounterNotDeletable { index, kind });
        }
        (_, "inc" | "dec" | "add" | "remove" | "set") => false,
        (_, other) => {
            return Err(invalid(
                index,
                "op",
                format!("unknown op {other:?} (inc, dec, add, remove, set, delete)"),
            ));
        }
    };
    if !applies {
        return Err(Error::WrongOp {
            index,
            message: format!("operation `{}` does not apply to type `{kind}`", op.op),
        });
    }
    let mutation = match op.op.as_str() {
        "inc" => Mutation::Inc(by()?),
        "dec" => Mutation::Dec(by()?),
        "add" | "remove" => {
            if let Some(v) = &op.value {
                if !(v.is_string() || v.is_number() || v.is_boolean()) {
                    return Err(invalid(
                        index,
                        "value",
                        "set elements must be strings, numbers or booleans",
                    ));
                }
            }
            let text = value_text(limits.element_bytes_max)?;
            if op.op == "add" {
                Mutation::Add(text)
            } else {
                Mutation::Remove(text)
            }
        }
        "set" => Mutation::Set(value_text(limits.value_bytes_max)?),
        "delete" => Mutation::Delete,
        other => {
            return Err(invalid(
                index,
                "op",
                format!("unknown op {other:?} (inc, dec, add, remove, set, delete)"),
            ));
        }
    };
    tidemark_crdts::causal_map::check_mutation(kind, &mutation).map_err(|e| match e {
        tidemark_crdts::MutationError::CounterNotDeletable(k) => {
            Error::CounterNotDeletable { index, kind: k }
        }
        tidemark_crdts::MutationError::ZeroAmount => invalid(index, "by", "must be positive"),
        other => Error::WrongOp {
            index,
            message: other.to_string(),
        },
    })?;
    if op.source.is_some() != op.seq.is_some() {
        return Err(invalid(
            index,
            if op.source.is_some() { "seq" } else { "source" },
            "`source` and `seq` go together",
        ));
    }
    Ok((key, mutation))
}

/// Checks an event or op `source`: 1..=`key_bytes_max` bytes, no control characters (NUL
/// included).
fn check_source(source: &str, index: usize, limits: &Limits) -> Result<(), Error> {
    if source.is_empty() || source.len() > limits.key_bytes_max {
        return Err(invalid(
            index,
            "source",
            format!(
                "sources are 1–{} bytes (this one is {})",
                limits.key_bytes_max,
                source.len()
            ),
        ));
    }
    if source.chars().any(char::is_control) {
        return Err(invalid(
            index,
            "source",
            "sources hold no control characters",
        ));
    }
    Ok(())
}

/// Counts the distinct sources of a batch against `limits.sources_per_batch_max`.
struct SourceCount<'a> {
    seen: std::collections::HashSet<&'a str>,
    limit: usize,
}

impl<'a> SourceCount<'a> {
    fn new(limits: &Limits) -> Self {
        Self {
            seen: std::collections::HashSet::new(),
            limit: limits.sources_per_batch_max,
        }
    }

    /// Adds `source`; `total` (called only on error) counts the batch's distinct sources.
    fn add(
        &mut self,
        source: &'a str,
        index: usize,
        total: impl FnOnce() -> usize,
    ) -> Result<(), Error> {
        if self.seen.insert(source) && self.seen.len() > self.limit {
            return Err(Error::TooManySources {
                index,
                len: total(),
                limit: self.limit,
            });
        }
        Ok(())
    }
}

/// Distinct sources named in a batch (for the error message).
fn distinct<'a>(sources: impl Iterator<Item = &'a str>) -> usize {
    sources.collect::<std::collections::HashSet<_>>().len()
}

/// Refuses a write whose delta could not fit one replication message: every write (an op, or
/// an event with its ops) must fit one log record of at most `message_bytes_target`.
fn check_write_size(w: &LocalWrite, index: usize, limits: &Limits) -> Result<(), Error> {
    let len = crate::store::write_bytes_estimate(w);
    if len > limits.message_bytes_target {
        return Err(Error::TooLarge {
            index,
            field: if w.event.is_some() { "ops" } else { "value" },
            len,
            limit: limits.message_bytes_target,
        });
    }
    Ok(())
}

/// Validates the ops of one batch one at a time, as a streamed request body is parsed, into
/// commit-group writes (one per op): the caller keeps only the compact writes, never the whole
/// batch of parsed ops.
pub(crate) struct OpsValidator<'l> {
    limits: &'l Limits,
    sources: std::collections::HashSet<String>,
    count: usize,
}

impl<'l> OpsValidator<'l> {
    pub(crate) fn new(limits: &'l Limits) -> Self {
        Self {
            limits,
            sources: std::collections::HashSet::new(),
            count: 0,
        }
    }

    /// Validates the next op of the batch.
    ///
    /// # Errors
    /// As [`validate_ops`]; [`Error::BatchTooLarge`] as soon as the batch passes
    /// `batch_ops_max` (its `len` is then the ops seen so far).
    pub(crate) fn push(&mut self, op: &Op) -> Result<LocalWrite, Error> {
        let (i, limits) = (self.count, self.limits);
        self.count += 1;
        if self.count > limits.batch_ops_max {
            return Err(Error::BatchTooLarge {
                len: self.count,
                limit: limits.batch_ops_max,
            });
        }
        let (key, mutation) = validate_op(op, i, limits)?;
        let event = match (&op.source, op.seq) {
            (Some(source), Some(seq)) => {
                check_source(source, i, limits)?;
                if !self.sources.contains(source.as_str()) {
                    self.sources.insert(source.clone());
                    if self.sources.len() > limits.sources_per_batch_max {
                        return Err(Error::TooManySources {
                            index: i,
                            len: self.sources.len(),
                            limit: limits.sources_per_batch_max,
                        });
                    }
                }
                Some(EventId {
                    stream: OPS_STREAM.to_owned(),
                    source: source.clone(),
                    seq,
                })
            }
            _ => None,
        };
        let w = LocalWrite {
            ops: vec![(key, mutation)],
            event,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        check_write_size(&w, i, limits)?;
        Ok(w)
    }
}

testing_pub! {
/// Validates a batch of ops into commit-group writes (one write per op); all or nothing.
///
/// # Errors
/// The first invalid op's error; [`Error::BatchTooLarge`] over `batch_ops_max`;
/// [`Error::TooManySources`] over `sources_per_batch_max`.
fn validate_ops(ops: &[Op], limits: &Limits) -> Result<Vec<LocalWrite>, Error> {
    if ops.len() > limits.batch_ops_max {
        return Err(Error::BatchTooLarge {
            len: ops.len(),
            limit: limits.batch_ops_max,
        });
    }
    let mut validator = OpsValidator::new(limits);
    ops.iter()
        .map(|op| {
            validator.push(op).map_err(|e| match e {
                Error::TooManySources { index, limit, .. } => Error::TooManySources {
                    index,
                    len: distinct(ops.iter().filter_map(|o| o.source.as_deref())),
                    limit,
                },
                e => e,
            })
        })
        .collect()
}
}

/// Why `stream` is no stream name (`None`: it is one): 1–`key_bytes_max` bytes without
/// control characters, not starting with `~` (the node's own namespace: `~wm/` names its
/// watermark announcements per stream).
pub fn stream_name_problem(stream: &str, limits: &Limits) -> Option<&'static str> {
    if stream.is_empty()
        || stream.len() > limits.key_bytes_max
        || stream.chars().any(char::is_control)
    {
        return Some("stream names are 1–256 bytes without control characters");
    }
    if crate::model::is_reserved(stream) {
        return Some("stream names may not start with `~` (the node's own namespace)");
    }
    None
}

testing_pub! {
/// Validates a batch of events of `stream` into commit-group writes; all or nothing.
///
/// # Errors
/// The first invalid event's error (its index and field); [`Error::TooLarge`] (field `ops`) for
/// an event whose operations together cannot fit one replication message;
/// [`Error::TooManySources`] over `sources_per_batch_max`.
fn validate_events(
    stream: &str,
    events: &[Event],
    limits: &Limits,
) -> Result<Vec<LocalWrite>, Error> {
    if let Some(why) = stream_name_problem(stream, limits) {
        return Err(invalid(0, "stream", why));
    }
    let total: usize = events.iter().map(|e| e.ops.len().max(1)).sum();
    if total > limits.batch_ops_max {
        return Err(Error::BatchTooLarge {
            len: total,
            limit: limits.batch_ops_max,
        });
    }
    let mut sources = SourceCount::new(limits);
    let total = || distinct(events.iter().map(|e| e.source.as_str()));
    events
        .iter()
        .enumerate()
        .map(|(i, ev)| {
            check_source(&ev.source, i, limits)?;
            sources.add(&ev.source, i, total)?;
            let ops = ev
                .ops
                .iter()
                .map(|op| validate_op(op, i, limits))
                .collect::<Result<Vec<_>, _>>()?;
            let w = LocalWrite {
                ops,
                event: Some(EventId {
                    stream: stream.to_owned(),
                    source: ev.source.clone(),
                    seq: ev.seq,
                }),
                stamps: Vec::new(),
                late: None,
                own_dots: false,
            };
            check_write_size(&w, i, limits)?;
            Ok(w)
        })
        .collect()
}
}

/// A value as JSON (API.md "Keys and values"): counters as numbers, an orset as a sorted array,
/// an lww register as its value or `null`, an mvreg as the sorted array of concurrent values.
pub fn value_to_json(value: &tidemark_crdts::Value) -> serde_json::Value {
    use serde_json::Value as J;
    // Stored text is canonical JSON written by this crate; fall back to a string if not.
    let parse =
        |text: &String| serde_json::from_str(text).unwrap_or_else(|_| J::String(text.clone()));
    match value {
        tidemark_crdts::Value::GCounter(n) => J::from(*n),
        tidemark_crdts::Value::PNCounter(n) => J::from(*n),
        tidemark_crdts::Value::ORSet(items) | tidemark_crdts::Value::MvReg(items) => {
            J::Array(items.iter().map(parse).collect())
        }
        tidemark_crdts::Value::Lww(v) => v.as_ref().map_or(J::Null, parse),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Canonical text must be a fixpoint: a value written as a long decimal and the canonical text
    /// it was stored as must name the same element. serde_json's default float parser is off by
    /// one ULP on long inputs (found by the `json_ops` fuzzer); `float_roundtrip` makes it exact.
    #[test]
    fn canonical_value_text_is_a_fixpoint_for_long_floats() {
        let long = "1111111111111111111111111111111111111111111111111111111111110";
        for text in [long, "2.0", "0.1", "1e308", "-4.9406564584124654e-324"] {
            let v: serde_json::Value = serde_json::from_str(text).expect("valid JSON number");
            let once = canonical(&v);
            let again: serde_json::Value = serde_json::from_str(&once).expect("canonical parses");
            assert_eq!(
                canonical(&again),
                once,
                "canonical text of {text} is not stable"
            );
            assert_eq!(again, v, "{text} does not survive a JSON roundtrip");
        }
    }
}
