//! API errors: `{"error":{"code","message","at"}}` ([`crate::api::ErrorReply`]) with the
//! right status.

use crate::error::Error;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An error answer of the HTTP API.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code (`invalid_op`, `type_mismatch`, `too_large`, ...).
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Where the fault is (`index 3, field value`, `line 7`, `query type`), when known.
    pub at: Option<String>,
    /// `Retry-After` seconds (429).
    pub retry_after: Option<u64>,
    /// What a streamed ingest committed before the error (the body's `committed`; boxed: an
    /// error travels in every `Result` of the request path, and is rarely one of these).
    pub committed: Option<Box<crate::api::IngestCommitted>>,
}

/// Where in a request an op sits: its index in a JSON array, or its NDJSON line.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pos {
    Index(usize),
    Line(usize),
}

impl std::fmt::Display for Pos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pos::Index(i) => write!(f, "index {i}"),
            Pos::Line(l) => write!(f, "line {l}"),
        }
    }
}

impl ApiError {
    /// A new error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            at: None,
            retry_after: None,
            committed: None,
        }
    }

    /// Names where the fault is.
    pub fn at(mut self, at: impl Into<String>) -> Self {
        self.at = Some(at.into());
        self
    }

    pub(crate) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(crate) fn too_many(code: &'static str, message: impl Into<String>, secs: u64) -> Self {
        let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, code, message);
        e.retry_after = Some(secs);
        e
    }

    pub(crate) fn with_committed(mut self, committed: crate::api::IngestCommitted) -> Self {
        self.committed = Some(Box::new(committed));
        self
    }

    /// Maps a node error; `pos` turns a batch index into the request's own position (the JSON
    /// array index or the NDJSON line).
    pub(crate) fn from_node(e: Error, pos: impl Fn(usize) -> Pos, retry_after: u64) -> Self {
        let code = e.code();
        let mut message = e.to_string();
        let index = match &e {
            Error::InvalidOp { index, .. }
            | Error::WrongOp { index, .. }
            | Error::CounterNotDeletable { index, .. }
            | Error::Overflow { index, .. }
            | Error::TooLarge { index, .. }
            | Error::TooManySources { index, .. }
            | Error::DedupGaps { index, .. } => Some(*index),
            _ => None,
        };
        // The node's `op N` is the op's index in its batch: the request's own JSON array index,
        // but not an NDJSON line (0-based, blank lines skipped, a long ingest split in batches),
        // which the message then names as `at` does.
        if let Some(index) = index
            && let line @ Pos::Line(_) = pos(index)
        {
            message = message.replacen(&format!("op {index}"), &line.to_string(), 1);
        }
        match e {
            Error::InvalidOp { index, field, .. } => {
                Self::bad_request(code, message).at(format!("{}, field {field}", pos(index)))
            }
            // The batch index in the node's message means nothing to the client: `at` names
            // the line instead.
            Error::InvalidEvent {
                index,
                field,
                message: what,
            } => Self::bad_request(code, format!("field `{field}`: {what}"))
                .at(format!("{}, field {field}", pos(index))),
            Error::WrongOp { index, .. } => Self::new(StatusCode::CONFLICT, code, message)
                .at(format!("{}, field op", pos(index))),
            Error::Overflow { index, .. } => Self::new(StatusCode::CONFLICT, code, message)
                .at(format!("{}, field by", pos(index))),
            Error::CounterNotDeletable { index, .. } => {
                Self::new(StatusCode::CONFLICT, code, message)
                    .at(format!("{}, field op", pos(index)))
            }
            Error::TooLarge { index, field, .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, code, message)
                    .at(format!("{}, field {field}", pos(index)))
            }
            Error::BatchTooLarge { .. } => Self::new(StatusCode::PAYLOAD_TOO_LARGE, code, message),
            Error::TooManySources { index, .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, code, message)
                    .at(format!("{}, field source", pos(index)))
            }
            // The request is well-formed but the source's dedup state refuses it: a conflict
            // the client resolves (send its missing sequence numbers first), not a server fault.
            Error::DedupGaps { index, .. } => Self::new(StatusCode::CONFLICT, code, message)
                .at(format!("{}, field seq", pos(index))),
            Error::Backpressure { .. } => Self::too_many(code, message, retry_after),
            Error::Closed => Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message),
            _ => {
                tracing::error!(error = %message, "storage error");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, code, message)
            }
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.status, self.code, self.message)?;
        if let Some(at) = &self.at {
            write!(f, " at {at}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = crate::api::ErrorReply {
            committed: self.committed.map(|c| *c),
            error: crate::api::ErrorDetail {
                at: self.at,
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_backpressure_is_429_with_retry_after() {
        let e = ApiError::from_node(Error::Backpressure { queued: 7 }, Pos::Index, 2);
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.code, "backpressure");
        let resp = e.into_response();
        assert_eq!(
            resp.headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some("2")
        );
    }

    #[test]
    fn event_and_source_limits_are_client_errors_naming_the_line() {
        let e = ApiError::from_node(
            Error::InvalidEvent {
                index: 2,
                field: "amount".into(),
                message: "missing".into(),
            },
            |i| Pos::Line(i + 1),
            1,
        );
        assert_eq!(
            (e.status, e.code, e.at.as_deref()),
            (
                StatusCode::BAD_REQUEST,
                "invalid_event",
                Some("line 3, field amount")
            )
        );
        let e = ApiError::from_node(
            Error::DedupGaps {
                index: 0,
                event_source: "a".into(),
                ranges: 9,
                limit: 8,
            },
            Pos::Line,
            1,
        );
        assert_eq!(
            (e.status, e.at.as_deref()),
            (StatusCode::CONFLICT, Some("line 0, field seq"))
        );
        let e = ApiError::from_node(
            Error::TooManySources {
                index: 4,
                len: 9,
                limit: 8,
            },
            Pos::Index,
            1,
        );
        assert_eq!(
            (e.status, e.at.as_deref()),
            (StatusCode::PAYLOAD_TOO_LARGE, Some("index 4, field source"))
        );
    }

    #[test]
    fn positions_name_lines_for_ndjson() {
        let e = ApiError::from_node(
            Error::InvalidOp {
                index: 1,
                field: "value",
                message: "x".into(),
            },
            |i| Pos::Line(i * 2 + 1),
            1,
        );
        assert_eq!(
            (e.status, e.at.as_deref()),
            (StatusCode::BAD_REQUEST, Some("line 3, field value"))
        );
        // The message names the op where `at` does: the line, not the node's batch index.
        assert_eq!(e.message, "line 3: field `value`: x");
        let wrong = |pos: fn(usize) -> Pos| {
            ApiError::from_node(
                Error::WrongOp {
                    index: 1,
                    message: "no".into(),
                },
                pos,
                1,
            )
        };
        let e = wrong(|i| Pos::Line(i + 3));
        assert_eq!(
            (e.message.as_str(), e.at.as_deref()),
            ("line 4: no", Some("line 4, field op"))
        );
        let e = wrong(Pos::Index);
        assert_eq!(
            (e.message.as_str(), e.at.as_deref()),
            ("op 1: no", Some("index 1, field op"))
        );
    }
}

/// The answer for a path parameter that does not decode (invalid percent-encoding, or bytes
/// that are not UTF-8): `code`, at `path {param}`, in the API's words (never the router's).
pub(crate) fn undecodable_path(code: &'static str, param: &str) -> ApiError {
    ApiError::bad_request(
        code,
        format!("the path's {param} is not UTF-8 text once percent-decoded"),
    )
    .at(format!("path {param}"))
}

/// True when a raw (still percent-encoded) path segment decodes to UTF-8 text, as the router
/// decodes it: `%XX` is one byte, any other `%` stands for itself.
pub(crate) fn decodes(segment: &str) -> bool {
    let b = segment.as_bytes();
    let hex = |i: usize| b.get(i).and_then(|&c| char::from(c).to_digit(16));
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                out.extend(u8::try_from(h * 16 + l).ok());
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    std::str::from_utf8(&out).is_ok()
}

#[cfg(test)]
mod path_tests {
    use super::decodes;

    #[test]
    fn a_segment_decodes_only_to_utf8() {
        assert!(decodes("plain"));
        assert!(decodes("caf%C3%A9"));
        assert!(decodes("100%"));
        assert!(decodes("%zz"));
        assert!(!decodes("%FF"));
        assert!(!decodes("a%C3"));
    }
}
