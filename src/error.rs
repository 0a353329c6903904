//! The node's public error type. Each variant says whether anything was applied.

use crate::store::StoreError;
use tidemark_crdts::KeyKind;

/// Errors of [`crate::Node`] calls. Unless a variant says otherwise, nothing of the rejected
/// call was applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An op or event is malformed: `index` is its position in the batch, `field` the field.
    #[error("op {index}: field `{field}`: {message}")]
    InvalidOp {
        /// Position in the batch.
        index: usize,
        /// The field at fault.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// An event is malformed for a view of its stream (a missing group or value field, a
    /// wrong value type, a malformed `time`): `index` is its position in the batch (its line),
    /// `field` the event field. Nothing of the batch was applied.
    #[error("event {index}: field `{field}`: {message}")]
    InvalidEvent {
        /// Position in the batch.
        index: usize,
        /// The event field at fault.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The op does not apply to the key's type (e.g. `add` on a counter).
    #[error("op {index}: {message}")]
    WrongOp {
        /// Position in the batch.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// Counters cannot be deleted (API code `counter_not_deletable`).
    #[error("op {index}: a {kind} cannot be deleted")]
    CounterNotDeletable {
        /// Position in the batch.
        index: usize,
        /// The counter type.
        kind: KeyKind,
    },
    /// An increment or decrement would take a counter past the bounds of its value (API
    /// code `overflow`); nothing of the batch is applied.
    #[error("op {index}: {key} would overflow: {value} {sign} {by} is out of range")]
    Overflow {
        /// Position in the batch.
        index: usize,
        /// The counter.
        key: String,
        /// Its value before the batch's earlier ops on it.
        value: i128,
        /// `+` or `-`.
        sign: char,
        /// The total amount the batch adds through this op.
        by: u128,
    },
    /// A value or element is over its size limit.
    #[error("op {index}: field `{field}` is {len} bytes, over the limit of {limit}")]
    TooLarge {
        /// Position in the batch.
        index: usize,
        /// The field.
        field: &'static str,
        /// Its size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The batch has more ops than `limits.batch_ops_max`.
    #[error("batch of {len} ops is over the limit of {limit}")]
    BatchTooLarge {
        /// The batch size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The batch names more distinct `(stream, source)` pairs than
    /// `limits.sources_per_batch_max` (API code `too_large`).
    #[error("batch names {len} sources, over the limit of {limit} (first over it: op {index})")]
    TooManySources {
        /// Position of the first op or event over the limit.
        index: usize,
        /// Distinct sources in the batch.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The event's `seq` would open a new gap in its source's dedup marks beyond
    /// `limits.dedup_ranges_max` (API code `dedup_gaps`). That event was not applied (a retry
    /// after the gaps are filled is safe); the batch's other events may have been applied, and
    /// retrying the whole batch applies none of them twice.
    #[error(
        "op {index}: source {event_source:?} has {ranges} disjoint seq ranges, the limit is {limit}; \
         send its missing seqs first"
    )]
    DedupGaps {
        /// Position of the refused event (or op) in the batch.
        index: usize,
        /// The event's source.
        event_source: String,
        /// Its disjoint ranges now.
        ranges: usize,
        /// The limit.
        limit: usize,
    },
    /// The write queue is full: retry later (HTTP 429). Nothing was queued.
    #[error("write queue is full ({queued} ops waiting); retry later")]
    Backpressure {
        /// Ops waiting when the call was refused.
        queued: usize,
    },
    /// The node is shut down (or its writer stopped).
    #[error("the node is shut down")]
    Closed,
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Storage failed. A write that returns this was **not** acknowledged, and its outcome is
    /// unknown: a failed sync may still have put its log record on disk, so it can be present
    /// after the reopen (as after a timeout; retry events with their `(source, seq)`, which
    /// dedup makes exactly-once). After a write failure the node accepts no more writes until
    /// reopened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The peer network could not start or be configured (writes are unaffected).
    #[error(transparent)]
    Net(#[from] crate::net::NetError),
}

impl Error {
    /// The error of a counter write refused for overflow.
    pub(crate) fn from_overflow(o: crate::store::Overflow) -> Self {
        Error::Overflow {
            index: o.index,
            key: o.key,
            value: o.value,
            sign: o.sign,
            by: o.by,
        }
    }
}

impl Error {
    /// A stable machine-readable code (API.md error bodies).
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidOp { .. } => "invalid_op",
            Error::InvalidEvent { .. } => "invalid_event",
            Error::WrongOp { .. } => "type_mismatch",
            Error::CounterNotDeletable { .. } => "counter_not_deletable",
            Error::Overflow { .. } => "overflow",
            Error::TooLarge { .. } | Error::BatchTooLarge { .. } | Error::TooManySources { .. } => {
                "too_large"
            }
            Error::DedupGaps { .. } => "dedup_gaps",
            Error::Backpressure { .. } => "backpressure",
            Error::Closed => "closed",
            Error::Config(_) => "config",
            Error::Store(StoreError::AlreadyOpen { .. }) => "already_open",
            Error::Store(StoreError::TooLarge { .. }) => "too_large",
            Error::Store(_) => "storage",
            Error::Net(_) => "network",
        }
    }
}
