//! `GET /v1/views/{view}/final`: each window of a view once, when it is final on this node,
//! as server-sent events (`event: final`, `id:` its cursor) or NDJSON (`Accept:
//! application/x-ndjson`), resumable with `Last-Event-ID` or `?after=CURSOR`. Pulled a page at
//! a time as the client reads: a slow consumer holds at most one page (64 windows).

use super::AppState;
use super::consumers::FinalProgress;
use super::error::{ApiError, Pos};
use super::query::{bad_query, known_query_pairs};
use super::replies::json_text;
use super::stream::{Watching, stopped};
use crate::api;
use crate::views::FinalCursor;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Windows read per page.
const PAGE: usize = 64;
/// How often a caught-up feed looks for newly final windows.
const POLL: Duration = Duration::from_millis(250);

/// One item of the feed.
enum Item {
    Final(api::FinalWindow),
    /// Windows after the cursor were removed by retention before being delivered.
    Reset(Option<String>),
}

struct Feed {
    state: AppState,
    view: String,
    after: Option<FinalCursor>,
    /// Items read and not sent yet, each with its bytes (as JSON).
    queue: VecDeque<(Item, usize)>,
    queued_bytes: usize,
    follow: bool,
    /// What the per-consumer metrics read of this feed.
    progress: Arc<FinalProgress>,
}

impl Feed {
    /// The next item; `None` when the feed ends (not following and caught up, or a failure).
    async fn next(&mut self) -> Option<Item> {
        loop {
            if let Some((item, bytes)) = self.queue.pop_front() {
                if let Item::Final(w) = &item {
                    self.after = w.cursor.parse().ok();
                }
                self.queued_bytes = self.queued_bytes.saturating_sub(bytes);
                self.progress.set(None, self.queued(), self.queued_bytes);
                return Some(item);
            }
            let page = match self
                .state
                .node
                .final_windows(&self.view, self.after.as_ref(), PAGE)
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, view = %self.view, "final feed read failed; ending it");
                    return None;
                }
            };
            if page.reset {
                // The reset names the position the page was read from, not its end: a client
                // that resumes from the reset's id gets this page's windows again, none lost.
                let from = self.after.as_ref().map(ToString::to_string);
                self.queue.push_back((Item::Reset(from), 0));
            }
            let got = !page.windows.is_empty();
            for w in page.windows.into_iter().map(super::replies::final_window) {
                let bytes = super::consumers::json_bytes(&w);
                self.queued_bytes += bytes;
                self.queue.push_back((Item::Final(w), bytes));
            }
            let read_to: Option<FinalCursor> = page.next.as_deref().and_then(|n| n.parse().ok());
            self.progress
                .set(read_to.as_ref(), self.queued(), self.queued_bytes);
            if !got {
                // Cells skipped (empty for the seal's members) still move the cursor.
                if let Some(next) = read_to {
                    self.after = Some(next);
                }
                if !self.queue.is_empty() {
                    continue;
                }
                self.progress.caught_up();
                if !self.follow {
                    return None;
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// Windows read and not sent yet.
    fn queued(&self) -> usize {
        self.queue
            .iter()
            .filter(|(i, _)| matches!(i, Item::Final(_)))
            .count()
    }
}

fn reset(cursor: Option<String>) -> api::FinalReset {
    api::FinalReset {
        cursor,
        hint: "windows after your cursor may have been removed by retention before you read \
               them; the windows still kept follow"
            .to_owned(),
        reason: "behind_retention".to_owned(),
    }
}

/// `GET /v1/views/{view}/final?after=&follow=`.
pub(super) async fn final_feed(
    State(state): State<AppState>,
    headers: HeaderMap,
    view: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(view) = view.map_err(|_| super::error::undecodable_path("invalid_view", "view"))?;
    let Some(def) = state.node.views().iter().find(|v| v.def.name == view) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "view_not_found",
            format!("no view named {view:?} is configured"),
        )
        .at("path view"));
    };
    if def.window.is_none() {
        return Err(ApiError::bad_request(
            "unwindowed_view",
            format!("view {view:?} has no window: none of its values ever becomes final"),
        )
        .at("path view"));
    }
    let mut after_text = None;
    let mut follow = true;
    for (name, text) in known_query_pairs(q, &["after", "follow"])? {
        match name.as_str() {
            "after" => after_text = Some((text, "query after")),
            "follow" => {
                follow = match text.as_str() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    _ => return Err(bad_query("follow", "follow must be true or false")),
                }
            }
            _ => {}
        }
    }
    let at = if after_text.is_some() {
        "query after"
    } else {
        "header Last-Event-ID"
    };
    let after: Option<FinalCursor> = super::watch::resume_cursor(after_text, &headers)?;
    let session = def.window.is_some_and(|w| w.session_gap_ms.is_some());
    if after.as_ref().is_some_and(|c| c.is_session() != session) {
        return Err(ApiError::bad_request(
            "invalid_cursor",
            format!(
                "a cursor of another kind of window: view {view:?} has {} windows",
                if session {
                    "session"
                } else {
                    "tumbling or hopping"
                }
            ),
        )
        .at(at));
    }
    // Refuse a failing read now, as a status, rather than as an ended stream.
    state
        .node
        .final_windows(&view, after.as_ref(), 1)
        .await
        .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?;
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
    let ndjson = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/x-ndjson"));
    let gauge = Watching::new(state.metrics.watchers.clone());
    // Listed for the per-consumer metrics while the stream lives (it holds a watcher slot).
    let progress = FinalProgress::new(&view, after.clone());
    let listed = state
        .metrics
        .consumers
        .register_final(Arc::clone(&progress));
    let consumer = listed.id();
    let gauge = (gauge, listed);
    let shutdown = state.shutdown.clone();
    let feed = Feed {
        state,
        view,
        after,
        queue: VecDeque::new(),
        queued_bytes: 0,
        follow,
        progress,
    };
    let items = futures_util::stream::unfold(
        (feed, shutdown, permit, gauge),
        |(mut feed, mut shutdown, permit, gauge)| async move {
            let item = tokio::select! {
                () = stopped(&mut shutdown) => None,
                item = feed.next() => item,
            };
            item.map(|i| (i, (feed, shutdown, permit, gauge)))
        },
    );
    if ndjson {
        let lines = futures_util::StreamExt::map(items, |item| {
            let line = match item {
                Item::Final(w) => api::FinalFeedLine::Final(w),
                Item::Reset(c) => api::FinalFeedLine::Reset(reset(c)),
            };
            // Through a `serde_json::Value`, whose members are sorted: the NDJSON feed has
            // always sent its keys in that order.
            let mut line = json_text(&serde_json::to_value(&line).unwrap_or_else(|e| {
                tracing::error!(error = %e, "encoding a final feed line failed");
                serde_json::Value::Null
            }));
            line.push('\n');
            Ok::<_, Infallible>(line)
        });
        let mut response = (
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            Body::from_stream(lines),
        )
            .into_response();
        super::consumers::name_consumer(&mut response, consumer);
        return Ok(response);
    }
    let events = futures_util::StreamExt::map(items, |item| {
        Ok::<_, Infallible>(match item {
            Item::Final(w) => SseEvent::default()
                .event("final")
                .id(w.cursor.clone())
                .data(json_text(&w)),
            Item::Reset(c) => {
                let mut ev = SseEvent::default()
                    .event("reset")
                    .data(json_text(&reset(c.clone())));
                if let Some(c) = c {
                    ev = ev.id(c);
                }
                ev
            }
        })
    });
    let ready = futures_util::stream::once(async {
        Ok::<_, Infallible>(SseEvent::default().comment("following final windows"))
    });
    let mut response = Sse::new(futures_util::StreamExt::chain(ready, events))
        .keep_alive(KeepAlive::default())
        .into_response();
    super::consumers::name_consumer(&mut response, consumer);
    Ok(response)
}
