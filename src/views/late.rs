//! Reading a stream's late lane (`store::LateNote`s written by [`super::Views::admit`]):
//! events acknowledged but applied to no view for being late, with why, where and when.

use crate::error::Error;
use crate::store::Reader;

/// Most records one page returns.
pub const PAGE_MAX: usize = 1_000;

/// One late event, as kept.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LateEvent {
    /// Its id in the stream's lane on this node (ascending, never reused).
    pub id: u64,
    /// The record: `event` (as ingested), `views` (those it was late for), `reason`
    /// (`behind_watermark` or `window_removed`), `watermark` (this node's, then), `node` (the
    /// replica id that took it) and `received_ms` (wall clock).
    pub record: serde_json::Value,
}

/// A page of a stream's late lane.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LateEvents {
    /// The stream.
    pub stream: String,
    /// Records ascending by id.
    pub events: Vec<LateEvent>,
    /// The id to pass as `after` for the next page, when there may be more.
    pub next: Option<u64>,
    /// Bytes of records the lane keeps now.
    pub kept_bytes: u64,
    /// Records dropped, oldest first, to stay within `limits.late_bytes_max`.
    pub dropped: u64,
}

/// Up to `limit` (at most [`PAGE_MAX`]; 0 means [`PAGE_MAX`]) late events of `stream` with
/// ids above `after`.
///
/// # Errors
/// Storage failures.
pub(crate) fn page(
    reader: &Reader,
    stream: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<LateEvents, Error> {
    let limit = if limit == 0 {
        PAGE_MAX
    } else {
        limit.min(PAGE_MAX)
    };
    let p = reader.late_events(stream, after, limit)?;
    let next = (p.records.len() == limit)
        .then(|| p.records.last().map(|(id, _)| *id))
        .flatten();
    let events = p
        .records
        .into_iter()
        .map(|(id, text)| LateEvent {
            id,
            record: serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        })
        .collect();
    Ok(LateEvents {
        stream: stream.to_owned(),
        events,
        next,
        kept_bytes: p.totals.bytes,
        dropped: p.totals.dropped,
    })
}
