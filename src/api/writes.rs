//! Write replies (`POST /v1/ops`, `POST /v1/streams/{stream}/events`), the error body every
//! route answers with, and the probes' body.

use serde::{Deserialize, Serialize};

/// `POST /v1/ops` answered 200: `{"applied":n,"duplicates":d}`, sent only after the durable
/// commit of every op of the body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsReply {
    /// Ops applied.
    pub applied: u64,
    /// Idempotent ops (with `source` and `seq`) already applied before: no-ops.
    pub duplicates: u64,
}

/// `POST /v1/streams/{stream}/events` answered 200: `{"accepted":n,"duplicates":d,"late":l}`,
/// sent only after the durable commit of every event of the body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestReply {
    /// Events applied (late ones included: their ops and on-time windows were applied).
    pub accepted: u64,
    /// Events already applied before (the same `source` and `seq`): no-ops.
    pub duplicates: u64,
    /// Accepted events refused as late by some view of the stream (kept in its late lane).
    pub late: u64,
}

/// What a streamed ingest committed before the line an error names: the `committed` member
/// of an ingest's error body. Lines up to `committed_lines` are durable; the rest of the body
/// is not applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestCommitted {
    /// Events applied before the error.
    pub accepted: u64,
    /// The NDJSON line through which every event is committed (0: none).
    pub committed_lines: u64,
    /// Duplicates among the committed events.
    pub duplicates: u64,
    /// Late events among the committed ones.
    pub late: u64,
}

/// Every error answer of every route: `{"error":{"at","code","message"}}`, and for a streamed
/// ingest also `committed` (what was durable before the error).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// A streamed ingest's progress before the error; absent on every other route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed: Option<IngestCommitted>,
    /// The error.
    pub error: ErrorDetail,
}

/// The `error` member of an [`ErrorReply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Where the fault is (`index 3, field value`, `line 7, field seq`, `query limit`,
    /// `header Origin`, `path name`); `null` when the request as a whole is refused.
    pub at: Option<String>,
    /// Stable machine-readable code (`invalid_op`, `type_mismatch`, `invalid_query`, ...).
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

/// `GET /healthz` (`{"status":"ok"}`) and `GET /readyz` (`{"status":"ready"}`) answered 200.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReply {
    /// `ok` (alive) or `ready` (ready to serve).
    pub status: String,
}
