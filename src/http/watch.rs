//! `GET /v1/watch`: committed changes as server-sent events, each with an `id` (its cursor) a
//! client resumes from (`Last-Event-ID` or `?after=`), optionally after a snapshot of the
//! current values (`?snapshot=true`), with no gap between the two.

use super::AppState;
use super::error::ApiError;
use super::query::{bad_query, known_query_pairs, parse_kind};
use super::replies::json_text;
use super::stream::{WATCH_EVENT_VALUE_BYTES_MAX, Watching, stopped};
use crate::api;
use crate::watch::{Cursor, KeyFilter, Watch, WatchEvent};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::collections::VecDeque;
use std::convert::Infallible;
use tidemark_crdts::{Key, KeyKind, Value};

/// Keys read per snapshot page (one page is held at a time per stream).
const SNAPSHOT_PAGE: usize = 128;

/// What `GET /v1/watch` was asked.
#[derive(Default)]
pub(super) struct WatchQuery {
    filter: KeyFilter,
    after: Option<Cursor>,
    snapshot: bool,
}

pub(super) fn parse_query(
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
    headers: &HeaderMap,
) -> Result<WatchQuery, ApiError> {
    let mut out = WatchQuery::default();
    let mut after_text = None;
    for (name, text) in known_query_pairs(q, &["type", "prefix", "after", "snapshot"])? {
        match name.as_str() {
            "type" => out.filter.kind = Some(parse_kind(&text, "query type")?),
            "prefix" => out.filter.prefix = text,
            "after" => after_text = Some((text, "query after")),
            "snapshot" => {
                out.snapshot = match text.as_str() {
                    "true" | "1" => true,
                    "false" | "0" | "" => false,
                    _ => return Err(bad_query("snapshot", "snapshot must be true or false")),
                }
            }
            _ => {}
        }
    }
    out.after = resume_cursor(after_text, headers)?;
    Ok(out)
}

/// The cursor a feed resumes after: `Last-Event-ID` (what an EventSource reconnecting sends:
/// it wins over the URL's `after`, the position the stream was first opened at), else the
/// `after` parameter given as `(text, where)`; a malformed one is 400 `invalid_cursor` naming
/// where it came from.
pub(super) fn resume_cursor<C>(
    after: Option<(String, &'static str)>,
    headers: &HeaderMap,
) -> Result<Option<C>, ApiError>
where
    C: std::str::FromStr,
    C::Err: std::fmt::Display,
{
    let mut after = after;
    if let Some(id) = headers.get("last-event-id") {
        let text = id.to_str().map_err(|_| {
            ApiError::bad_request("invalid_cursor", "Last-Event-ID is not ASCII text")
                .at("header Last-Event-ID")
        })?;
        after = Some((text.to_owned(), "header Last-Event-ID"));
    }
    after
        .map(|(text, at)| {
            text.trim()
                .parse::<C>()
                .map_err(|e| ApiError::bad_request("invalid_cursor", e.to_string()).at(at))
        })
        .transpose()
}

/// A change (or a snapshot entry) as an event's data ([`api::WatchEntry`]): a value over the
/// bound is not copied into the stream (each stalled client would hold its own copy): the
/// client reads the key.
fn entry_data(key: &Key, value: &Value) -> String {
    let bytes = value.text_bytes();
    let value = if bytes > WATCH_EVENT_VALUE_BYTES_MAX {
        api::WatchValue::Omitted {
            bytes: super::replies::count(bytes),
        }
    } else {
        api::WatchValue::Value(crate::ops::value_to_json(value))
    };
    json_text(&api::WatchEntry {
        key: key.name.clone(),
        kind: key.kind,
        value,
    })
}

/// Where a snapshot's listing stands: kinds still to list, the page read, the last name.
struct Snapshot {
    kinds: VecDeque<KeyKind>,
    after: Option<String>,
    page: VecDeque<(Key, Value)>,
}

impl Snapshot {
    fn new(filter: &KeyFilter) -> Self {
        Self {
            kinds: filter
                .kind
                .map_or_else(|| KeyKind::ALL.iter().copied().collect(), |k| [k].into()),
            after: None,
            page: VecDeque::new(),
        }
    }
}

/// The state the event stream runs in.
struct Streamer {
    state: AppState,
    watch: Watch,
    filter: KeyFilter,
    /// A snapshot being sent (changes wait until it ends: the watch was subscribed before the
    /// first key was read, so no change falls between the two).
    snapshot: Option<Snapshot>,
    /// Send a snapshot after each reset (`snapshot=true`).
    resnapshot: bool,
}

enum Step {
    Event(SseEvent),
    End,
}

impl Streamer {
    /// The next snapshot entry, or its closing `snapshot_end` event (whose id is where the
    /// changes after the snapshot start).
    fn snapshot_step(&mut self) -> Option<Step> {
        let snap = self.snapshot.as_mut()?;
        loop {
            if let Some((key, value)) = snap.page.pop_front() {
                return Some(Step::Event(
                    SseEvent::default()
                        .event("snapshot")
                        .data(entry_data(&key, &value)),
                ));
            }
            let Some(&kind) = snap.kinds.front() else {
                self.snapshot = None;
                let cursor = self.watch.cursor().to_string();
                return Some(Step::Event(
                    SseEvent::default()
                        .event("snapshot_end")
                        .id(cursor.clone())
                        .data(json_text(&api::WatchSnapshotEnd { cursor })),
                ));
            };
            match self.state.node.list(
                kind,
                &self.filter.prefix,
                snap.after.as_deref(),
                SNAPSHOT_PAGE,
            ) {
                Ok(page) => {
                    if page.len() < SNAPSHOT_PAGE {
                        snap.kinds.pop_front();
                        snap.after = None;
                    } else {
                        snap.after = page.last().map(|(k, _)| k.name.clone());
                    }
                    snap.page = page.into();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watch snapshot read failed; ending the stream");
                    return Some(Step::End);
                }
            }
        }
    }

    async fn step(&mut self) -> Step {
        if let Some(step) = self.snapshot_step() {
            return step;
        }
        let Some(ev) = self.watch.next().await else {
            return Step::End;
        };
        let cursor = self.watch.cursor().to_string();
        match ev {
            WatchEvent::Changed(change) => Step::Event(
                SseEvent::default()
                    .event("change")
                    .id(cursor)
                    .data(entry_data(&change.key, &change.value)),
            ),
            WatchEvent::Reset { missed } => {
                let data = json_text(&api::WatchReset {
                    cursor: cursor.clone(),
                    hint: if self.resnapshot {
                        "a snapshot of the current values follows"
                    } else {
                        "re-read the keys you watch; changes after this cursor follow"
                    }
                    .to_owned(),
                    missed,
                    reason: ev_reason(missed).to_owned(),
                });
                let mut event = SseEvent::default().event("reset").data(data);
                if self.resnapshot {
                    // The id comes with the snapshot's end: a reconnect before it restarts it.
                    self.snapshot = Some(Snapshot::new(&self.filter));
                } else {
                    event = event.id(cursor);
                }
                Step::Event(event)
            }
        }
    }
}

fn ev_reason(missed: Option<u64>) -> &'static str {
    WatchEvent::Reset { missed }
        .reset_reason()
        .unwrap_or("behind_retention")
}

/// `GET /v1/watch?type=&prefix=&after=&snapshot=`.
pub(super) async fn watch(
    State(state): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = parse_query(q, &headers)?;
    let Ok(permit) = state.watchers.clone().try_acquire_owned() else {
        state.metrics.rejected("watchers");
        return Err(ApiError::too_many(
            "too_many_watchers",
            format!(
                "more than http.watchers_max ({}) watch streams",
                state.config.watchers_max
            ),
            state.config.retry_after_secs,
        ));
    };
    // Subscribed before any snapshot key is read: every change after the snapshot's cursor
    // is delivered, and the snapshot holds every change up to it.
    let watch = match q.after {
        Some(c) => state.node.watch_from(q.filter.clone(), c),
        None => state.node.watch(q.filter.clone()),
    };
    let snapshot = (q.snapshot && q.after.is_none()).then(|| Snapshot::new(&q.filter));
    let gauge = Watching::new(state.metrics.watchers.clone());
    // Listed for the per-consumer metrics while the stream lives (it holds a watcher slot).
    let listed = state.metrics.consumers.register_watch(watch.probe());
    let consumer = listed.id();
    let gauge = (gauge, listed);
    let shutdown = state.shutdown.clone();
    let start = watch.cursor().to_string();
    let streamer = Streamer {
        state,
        watch,
        filter: q.filter,
        snapshot,
        resnapshot: q.snapshot,
    };
    let stream = futures_util::stream::unfold(
        (streamer, shutdown, permit, gauge),
        |(mut s, mut shutdown, permit, gauge)| async move {
            let step = tokio::select! {
                () = stopped(&mut shutdown) => Step::End,
                step = s.step() => step,
            };
            match step {
                Step::End => None,
                Step::Event(ev) => Some((Ok::<_, Infallible>(ev), (s, shutdown, permit, gauge))),
            }
        },
    );
    // The first comment flushes the headers so a client knows the watch is registered; it
    // names the position the stream starts after.
    let ready = futures_util::stream::once(async move {
        Ok::<_, Infallible>(SseEvent::default().comment(format!("watching after {start}")))
    });
    let mut response = Sse::new(futures_util::StreamExt::chain(ready, stream))
        .keep_alive(KeepAlive::default())
        .into_response();
    super::consumers::name_consumer(&mut response, consumer);
    Ok(response)
}
