//! The routes of API.md, each a thin translation into `Node` calls.

use super::body::{Chunks, Lines, read_limited};
use super::error::{ApiError, Pos};
use super::events::{ParseError, parse_event, parse_ops};
use super::query::{bad_query, known_query_pairs, parse_kind, query_pairs};
use super::replies::{self, count};
use super::{AppState, console, metrics, middleware};
use crate::api;
use crate::views::{Event, ViewQuery};
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::time::Duration;
use tidemark_crdts::{Key, KeyKind};

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(console::index))
        .route("/index.html", get(console::index))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/v1/ops", post(post_ops))
        .route("/v1/keys", get(list_keys))
        .route("/v1/keys/{type}/{*name}", get(get_key))
        .route("/v1/streams/{stream}/events", post(post_events))
        .route("/v1/watch", get(super::watch::watch))
        .route("/v1/cluster", get(cluster))
        .route("/v1/cluster/members/{name}/remove", post(remove_member))
        .route("/v1/views", get(views_list))
        .route("/v1/stats/writes", get(write_history))
        .route("/v1/views/{view}", get(view))
        .route("/v1/views/{view}/final", get(super::final_feed::final_feed))
        .route("/v1/snapshot", get(super::snapshot::get_snapshot))
        .route("/v1/streams/{stream}/late", get(super::late::get_late))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::concurrency,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::auth,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::browser_guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::header_limit,
        ))
        .layer(axum::middleware::from_fn(middleware::json_errors))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::observe,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route (see API.md)",
    )
}

/// A known path with a method it does not serve: 405 in the API's error shape (axum's own
/// answer has an empty body). `Allow` is the route's, set by axum on this fallback's answer.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not serve {method} (see API.md)", uri.path()),
    )
}

async fn healthz() -> impl IntoResponse {
    axum::Json(api::ProbeReply {
        status: "ok".to_owned(),
    })
}

async fn readyz(State(state): State<AppState>) -> Response {
    let status = state.node.replication_status().await;
    let writer_alive = status.is_ok();
    // In a cluster (SWIM knows other members), ready once one live member acknowledged our
    // Hello or we joined something from a peer (the first successful sync).
    let live: Vec<crate::proto::PeerId> = state.node.net_status().map_or(Vec::new(), |n| {
        n.members
            .iter()
            .filter(|m| m.state != crate::net::MemberState::Down)
            .map(|m| crate::net::peer_id_of_name(&m.name))
            .collect()
    });
    // A node started to join a cluster (`--join`) that has reached no member yet is not
    // ready either: it has not synced (a wrong CA, an unreachable seed); one started alone is
    // its own cluster.
    // (A copy restored from a snapshot of a cluster member joins too, until it syncs with a
    // live member of its cluster or every other member it knows of is removed: then it is
    // treated like a node started alone.)
    let joining = state.node.is_joining();
    let synced = match &status {
        Ok(rep) if !live.is_empty() || joining => {
            rep.peer_acked
                .iter()
                .any(|(p, a)| a.is_some() && live.contains(p))
                || rep.stats.deltas_applied + rep.stats.transfers_received > 0
        }
        _ => true,
    };
    // A node the cluster removed for good serves reads but applies no event to a window: it
    // must not take traffic as a member (give it a new data directory to bring it back).
    let decommissioned = writer_alive && state.node.is_decommissioned().unwrap_or(false);
    if decommissioned {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "decommissioned",
            "this node was removed from the cluster for good (decommissioned): it applies no \
             event to a window; start it again on a new data directory to rejoin",
        )
        .into_response()
    } else if writer_alive && synced && state.cluster.ready() {
        axum::Json(api::ProbeReply {
            status: "ready".to_owned(),
        })
        .into_response()
    } else {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            if writer_alive && state.node.is_restored_joining() {
                "restored from a snapshot of a cluster member: waiting to sync with a member of \
                 its cluster, or remove the lost members (tidemark members remove ...)"
            } else if writer_alive && joining && live.is_empty() {
                "waiting for the first sync with the cluster: started to join (--join), no \
                 member reached yet (is the seed up, and are the certificates from the \
                 cluster's CA?)"
            } else if writer_alive {
                "waiting for the first sync with the cluster"
            } else {
                "the node is not accepting writes"
            },
        )
        .into_response()
    }
}

async fn metrics_text(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let format =
        metrics::Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let replication = state.node.replication_status().await.ok();
    let net = state.node.net_status();
    let members = state.node.members();
    let (gone, gone_peers) =
        metrics::gone_members(&state.node.decommissioned().unwrap_or_default(), &members);
    let scrape = metrics::Scrape {
        gone,
        gone_peers,
        peer_names: metrics::peer_names(net.as_ref()),
        lag_bytes: replication
            .as_ref()
            .map(|rep| metrics::lag_bytes(&state.node, rep))
            .unwrap_or_default(),
        members,
        net: net.map(|n| n.stats),
        node: state.node.metrics(),
        commits: state.node.commit_histograms(),
        store_bytes: metrics::dir_bytes(&state.node.config().data_dir),
        http: &state.metrics,
        requests_in_flight: state
            .config
            .concurrency_max
            .saturating_sub(state.requests.available_permits()) as u64,
        process: crate::metrics::ProcessStats::read(),
        views: replication
            .as_ref()
            .and_then(|rep| state.node.view_summaries_given(rep).ok())
            .unwrap_or_default(),
        now_ms: crate::clock::wall_ms(),
        watch: state.node.watch_status(),
        consumers: state.metrics.consumers.status(&state.node).await,
        watchers_max: state.config.watchers_max,
        replication,
    };
    match metrics::render(&scrape, format) {
        Ok(text) => ([(header::CONTENT_TYPE, format.content_type())], text).into_response(),
        Err(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics",
            "encoding metrics failed",
        )
        .into_response(),
    }
}

fn body_timeout(state: &AppState) -> Duration {
    Duration::from_millis(state.config.body_read_timeout_ms)
}

async fn post_ops(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let (bytes, held) = match read_limited(
        &headers,
        body,
        state.config.body_bytes_max,
        body_timeout(&state),
        &state.body_budget,
        state.config.retry_after_secs,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => {
            state.node.note_refused(1);
            state.metrics.rejected(if e.code == "inflight_bytes" {
                "inflight_bytes"
            } else {
                "body"
            });
            return e.into_response();
        }
    };
    let (writes, positions, read) = match parse_ops(&bytes, &state.node.config().limits) {
        Ok((writes, positions)) => {
            let n = positions.len();
            (Ok(writes), positions, n)
        }
        Err(ParseError::Api(e)) => {
            state.node.note_refused(ops_read(&e));
            return e.into_response();
        }
        // Every op read up to the one at fault is refused with it.
        Err(ParseError::Node(e, pos)) => {
            let read = match pos {
                Pos::Index(i) => i + 1,
                Pos::Line(n) => n.max(1),
            };
            (Err(e), vec![pos], read)
        }
    };
    drop(bytes);
    drop(held);
    let _slot = match middleware::slot(&state) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    match state.node.apply_writes(writes, read).await {
        Ok(outcome) => axum::Json(api::OpsReply {
            applied: count(outcome.applied),
            duplicates: count(outcome.duplicates),
        })
        .into_response(),
        Err(e) => ApiError::from_node(
            e,
            |i| {
                positions
                    .get(i)
                    .or(positions.first().filter(|_| positions.len() == 1))
                    .copied()
                    .unwrap_or(Pos::Index(i))
            },
            state.config.retry_after_secs,
        )
        .into_response(),
    }
}

/// How many ops a refused `/v1/ops` body carried up to the one at fault, from where the error
/// is (`index N` of an array: N + 1; `line N` of NDJSON: N); 1 when it names no op (the body
/// as a whole was refused).
fn ops_read(e: &ApiError) -> usize {
    let at = e.at.as_deref().unwrap_or_default();
    let number = |prefix: &str| {
        at.strip_prefix(prefix)?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse::<usize>()
            .ok()
    };
    number("index ")
        .map(|i| i + 1)
        .or_else(|| number("line "))
        .unwrap_or(1)
        .max(1)
}

fn check_name(state: &AppState, name: &str, at: &str) -> Result<(), ApiError> {
    crate::admission::check_key_name(name, &state.node.config().limits)
        .map_err(|e| ApiError::bad_request("invalid_key", e.to_string()).at(at.to_owned()))
}

async fn get_key(
    State(state): State<AppState>,
    uri: axum::http::Uri,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
) -> Result<Response, ApiError> {
    let Path((kind, name)) = path.map_err(|_| {
        // Which of the two does not decode, from the raw path (`/v1/keys/{type}/{name}`).
        let raw = uri.path().strip_prefix("/v1/keys/").unwrap_or_default();
        let kind = raw.split_once('/').map_or(raw, |(k, _)| k);
        let param = if super::error::decodes(kind) {
            "name"
        } else {
            "type"
        };
        super::error::undecodable_path("invalid_key", param)
    })?;
    let kind = parse_kind(&kind, "path type")?;
    check_name(&state, &name, "path name")?;
    let key = Key::new(kind, name);
    let value = state
        .node
        .find(&key)
        .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "key_not_found",
                format!("no {} key named {:?}", key.kind.as_str(), key.name),
            )
            .at("path name")
        })?;
    Ok(axum::Json(replies::key_value(&key, &value)).into_response())
}

#[derive(Default)]
struct ListQuery {
    kind: Option<String>,
    prefix: String,
    limit: Option<usize>,
    after: Option<String>,
    /// Also list the node's internal keys (every name under `~`: `~view/`, `~wm/`, `~gone/`).
    internal: bool,
}

fn list_query(
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<ListQuery, ApiError> {
    let mut out = ListQuery::default();
    for (name, text) in known_query_pairs(q, &["type", "prefix", "limit", "after", "internal"])? {
        match name.as_str() {
            "type" => out.kind = Some(text),
            "internal" => {
                out.internal = match text.as_str() {
                    "true" | "1" => true,
                    "false" | "0" | "" => false,
                    _ => {
                        return Err(bad_query(
                            "internal",
                            format!("internal must be true or false, got {text:?}"),
                        ));
                    }
                }
            }
            "prefix" => out.prefix = text,
            "after" => out.after = Some(text),
            "limit" => {
                out.limit = Some(text.parse::<usize>().map_err(|_| {
                    bad_query(
                        "limit",
                        format!("limit must be 1..={LIST_LIMIT_MAX}, got {text:?}"),
                    )
                })?);
            }
            _ => {}
        }
    }
    Ok(out)
}

const LIST_LIMIT_MAX: usize = 1000;

/// Is `after` a cell name of `view` exactly as a page's `next` gives it? (Its window start
/// present exactly when the view is windowed, one value per group field, and its group JSON in
/// the one encoding cells are written with: another spelling of the same values would sort
/// elsewhere and page from the wrong place.)
fn is_view_cursor(view: &crate::views::CompiledView, after: &str) -> bool {
    use crate::views::keys::{parse_session_key, parse_view_key, session_key, view_key};
    if view.window.is_some_and(|w| w.session_gap_ms.is_some()) {
        // A session view's `next`: the last cell of a session.
        let Some((_, group, t)) = parse_session_key(&view.def.name, &view.digest, after) else {
            return false;
        };
        return group.len() == view.def.group_by.len()
            && session_key(
                &view.def.name,
                &view.digest,
                &serde_json::Value::Array(group).to_string(),
                t,
            ) == after;
    }
    let Some((start, group)) = parse_view_key(&view.def.name, &view.digest, after) else {
        return false;
    };
    start.is_some() == view.window.is_some()
        && group.len() == view.def.group_by.len()
        && view_key(
            &view.def.name,
            &view.digest,
            start,
            &serde_json::Value::Array(group).to_string(),
        ) == after
}

/// About the most bytes of values one `GET /v1/keys` page carries (past it, `next` continues).
const LIST_PAGE_BYTES_MAX: usize = 1 << 20;

async fn list_keys(
    State(state): State<AppState>,
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = list_query(q)?;
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > LIST_LIMIT_MAX {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit must be 1..={LIST_LIMIT_MAX}"),
        )
        .at("query limit"));
    }
    let only = q
        .kind
        .as_deref()
        .map(|k| parse_kind(k, "query type"))
        .transpose()?;
    // `after` is the `next` cursor of a previous page: `type/name`.
    let after = match q.after.as_deref() {
        None | Some("") => None,
        Some(cursor) => {
            let (k, name) = cursor.split_once('/').ok_or_else(|| {
                ApiError::bad_request("invalid_query", "after must be a `type/name` cursor")
                    .at("query after")
            })?;
            Some((parse_kind(k, "query after")?, name.to_owned()))
        }
    };
    let kinds = [
        KeyKind::GCounter,
        KeyKind::PNCounter,
        KeyKind::ORSet,
        KeyKind::Lww,
        KeyKind::MvReg,
    ];
    let mut keys = Vec::new();
    let mut last: Option<Key> = None;
    // Bytes of the values on the page so far: a page holds at most `limit` keys and about
    // `LIST_PAGE_BYTES_MAX` bytes of values (at least one key), so a listing of large sets
    // cannot make one answer of any size.
    let (mut page_bytes, mut full_bytes) = (0usize, false);
    for kind in kinds {
        if only.is_some_and(|o| o != kind) {
            continue;
        }
        let start = match &after {
            Some((ak, _)) if kind_rank(kind) < kind_rank(*ak) => continue,
            Some((ak, name)) if *ak == kind => Some(name.as_str()),
            _ => None,
        };
        let mut start = start.map(str::to_owned);
        loop {
            let want = limit - keys.len();
            let page = state
                .node
                .list(kind, &q.prefix, start.as_deref(), want)
                .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?;
            let full = page.len() == want;
            let mut skip_to = None;
            for (key, value) in page {
                if !keys.is_empty() && page_bytes + value.text_bytes() > LIST_PAGE_BYTES_MAX {
                    // Over the page's byte bound: this key starts the next page.
                    full_bytes = true;
                    break;
                }
                if !q.internal && crate::model::is_reserved(&key.name) {
                    // Internal keys are contiguous: go on past all of them at once.
                    skip_to = Some(past_reserved(
                        &key.name,
                        state.node.config().limits.key_bytes_max,
                    ));
                    break;
                }
                page_bytes += key.name.len() + value.text_bytes();
                keys.push(replies::key_value(&key, &value));
                start = Some(key.name.clone());
                last = Some(key);
            }
            if full_bytes {
                break;
            }
            match skip_to {
                Some(past) => start = Some(past),
                None if full && keys.len() < limit => {}
                None => break,
            }
            if keys.len() >= limit {
                break;
            }
        }
        if keys.len() >= limit || full_bytes {
            break;
        }
    }
    let next = if keys.len() >= limit || full_bytes {
        last.map(|k| format!("{}/{}", k.kind.as_str(), k.name))
    } else {
        None
    };
    Ok(axum::Json(api::KeyList { keys, next }).into_response())
}

/// A name after every name of at most `key_bytes_max` bytes under the reserved prefix `name`
/// starts with (longer than any of them, of the highest UTF-8 sequence).
fn past_reserved(name: &str, key_bytes_max: usize) -> String {
    let prefix = if crate::model::is_reserved(name) {
        crate::model::RESERVED_PREFIX
    } else {
        ""
    };
    let mut past = prefix.to_owned();
    past.extend(std::iter::repeat_n(
        '\u{10FFFF}',
        1 + key_bytes_max.max(name.len()) / 4,
    ));
    past
}

fn kind_rank(k: KeyKind) -> u8 {
    match k {
        KeyKind::GCounter => 0,
        KeyKind::PNCounter => 1,
        KeyKind::ORSet => 2,
        KeyKind::Lww => 3,
        KeyKind::MvReg => 4,
    }
}

#[derive(Default)]
struct Tally {
    accepted: usize,
    duplicates: usize,
    late: usize,
    /// Lines through which every event is committed.
    committed_lines: usize,
}

impl Tally {
    /// What the ingest committed so far, as an error body's `committed`.
    fn committed(&self) -> api::IngestCommitted {
        api::IngestCommitted {
            accepted: count(self.accepted),
            committed_lines: count(self.committed_lines),
            duplicates: count(self.duplicates),
            late: count(self.late),
        }
    }
}

/// Commits one batch of a streamed ingest; after the first batch, waits out backpressure for a
/// while (the upload is already under way) before giving up with 429.
async fn commit_events(
    state: &AppState,
    stream: &str,
    batch: &mut Vec<Event>,
    lines: &mut Vec<usize>,
    tally: &mut Tally,
) -> Result<(), ApiError> {
    let events = std::mem::take(batch);
    let batch_lines = std::mem::take(lines);
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(if tally.committed_lines == 0 {
            0
        } else {
            state.config.ingest_backpressure_wait_ms
        });
    let mut wait = Duration::from_millis(5);
    loop {
        match state.node.ingest(stream, events.clone()).await {
            Ok(outcome) => {
                tally.accepted += outcome.applied;
                tally.duplicates += outcome.duplicates;
                tally.late += outcome.late;
                tally.committed_lines =
                    batch_lines.last().copied().unwrap_or(tally.committed_lines);
                state.metrics.events("accepted", outcome.applied as u64);
                state.metrics.events("duplicate", outcome.duplicates as u64);
                return Ok(());
            }
            Err(crate::Error::Backpressure { .. })
                if tokio::time::Instant::now() + wait < deadline =>
            {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(200));
            }
            Err(e) => {
                // The node counted the refused batch in tidemark_writes_total; every event
                // of it counts here too.
                let rejected = !matches!(e, crate::Error::Backpressure { .. });
                if rejected {
                    state.metrics.events("rejected", events.len() as u64);
                }
                return Err(ApiError::from_node(
                    e,
                    |i| Pos::Line(batch_lines.get(i).copied().unwrap_or(0)),
                    state.config.retry_after_secs,
                ));
            }
        }
    }
}

async fn post_events(
    State(state): State<AppState>,
    stream: Result<Path<String>, axum::extract::rejection::PathRejection>,
    body: Body,
) -> Response {
    let stream = match stream {
        Ok(Path(stream)) => stream,
        Err(_) => {
            return super::error::undecodable_path("invalid_stream", "stream").into_response();
        }
    };
    let mut tally = Tally::default();
    match ingest_stream(&state, &stream, body, &mut tally).await {
        Ok(()) => axum::Json(api::IngestReply {
            accepted: count(tally.accepted),
            duplicates: count(tally.duplicates),
            late: count(tally.late),
        })
        .into_response(),
        Err(e) => {
            if matches!(e.code, "line_too_large" | "body_timeout") {
                state.metrics.rejected(if e.code == "line_too_large" {
                    "line"
                } else {
                    "body"
                });
            }
            e.with_committed(tally.committed()).into_response()
        }
    }
}

async fn ingest_stream(
    state: &AppState,
    stream: &str,
    body: Body,
    tally: &mut Tally,
) -> Result<(), ApiError> {
    // The line buffer is charged to the body budget as it fills; each line must arrive whole
    // within the body timeout.
    let mut lines = Lines::new(
        Chunks::new(body, body_timeout(state)),
        state.config.line_bytes_max,
        &state.body_budget,
        state.config.retry_after_secs,
    );
    let result = ingest_lines(state, stream, &mut lines, tally).await;
    if result.is_err() {
        lines.discard_rest().await;
    }
    result
}

/// Parses and commits the lines of one ingest request, batch by batch.
async fn ingest_lines(
    state: &AppState,
    stream: &str,
    lines: &mut Lines,
    tally: &mut Tally,
) -> Result<(), ApiError> {
    let limits = &state.node.config().limits;
    if let Some(why) = crate::ops::stream_name_problem(stream, limits) {
        return Err(ApiError::bad_request("invalid_stream", why).at("path stream"));
    }
    let batch_events = state.config.ingest_batch_events.min(limits.batch_ops_max);
    let mut batch: Vec<Event> = Vec::new();
    let mut batch_lines: Vec<usize> = Vec::new();
    let (mut batch_bytes, mut batch_ops) = (0usize, 0usize);
    // The request slot is taken once the first line arrived and held to the end.
    let mut slot = None;
    loop {
        let next = match lines.next().await {
            Ok(next) => next,
            // A line too long, a body cut off or too slow: the events read since the last
            // commit are refused with it.
            Err(e) => {
                let n = batch.len() + 1;
                state.metrics.events("rejected", n as u64);
                state.node.note_refused(n);
                return Err(e);
            }
        };
        let Some((line_no, line)) = next else { break };
        if slot.is_none() {
            slot = Some(middleware::slot(state)?);
        }
        // A line refused here refuses the events read since the last commit with it (they are
        // not committed: `committed` in the answer says how far the stream got).
        let refuse = |e: ApiError| {
            let n = batch.len() + 1;
            state.metrics.events("rejected", n as u64);
            state.node.note_refused(n);
            e
        };
        let event = parse_event(line_no, &line).map_err(refuse)?;
        let ops = event.ops.len().max(1);
        if ops > limits.batch_ops_max {
            return Err(refuse(
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    format!("an event carries {ops} ops, over limits.batch_ops_max"),
                )
                .at(format!("line {line_no}, field ops")),
            ));
        }
        if !batch.is_empty()
            && (batch.len() >= batch_events
                || batch_bytes + line.len() > state.config.ingest_batch_bytes
                || batch_ops + ops > limits.batch_ops_max)
        {
            commit_events(state, stream, &mut batch, &mut batch_lines, tally).await?;
            (batch_bytes, batch_ops) = (0, 0);
        }
        batch_bytes += line.len();
        batch_ops += ops;
        batch.push(event);
        batch_lines.push(line_no);
    }
    if !batch.is_empty() {
        commit_events(state, stream, &mut batch, &mut batch_lines, tally).await?;
    }
    Ok(())
}

async fn cluster(State(state): State<AppState>) -> Result<Response, ApiError> {
    let node = &state.node;
    let rep = node
        .replication_status()
        .await
        .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?;
    let (log_start, log_end) = rep.log_bounds;
    let bytes = metrics::lag_bytes(node, &rep);
    let net = node.net_status();
    let connected: Vec<String> = net.as_ref().map(|n| n.peers.clone()).unwrap_or_default();
    // SWIM's view and the members known from earlier runs it has not heard from yet.
    let known = node.members();
    let swim: &[crate::net::MemberStatus] = &known;
    let name_of = |peer: &crate::proto::PeerId| {
        connected
            .iter()
            .chain(swim.iter().map(|m| &m.name))
            .find(|n| crate::net::peer_id_of_name(n) == *peer)
            .cloned()
    };
    let gone_ids = node
        .decommissioned()
        .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?;
    let (gone, gone_peers) = metrics::gone_members(&gone_ids, swim);
    // A member removed for good is no replication peer any more: no lag is reported for it.
    let peers: Vec<_> = rep
        .peer_acked
        .iter()
        .filter(|(peer, _)| !gone_peers.contains(peer))
        .map(|(peer, acked)| {
            // Unknown (null) until it acknowledged something, like `acked`.
            let behind = acked.map(|a| log_end.saturating_sub(a));
            api::ClusterPeer {
                acked: *acked,
                connected: rep.peers_connected.contains(peer),
                lag_bytes: bytes.get(peer).map(|b| b.bytes),
                lag_bytes_exact: bytes.get(peer).map(|b| b.exact),
                lag_entries: behind,
                name: name_of(peer),
                peer: format!("{:016x}", peer.0),
            }
        })
        .collect();
    let mut members = cluster_members(swim, &connected, &rep, &bytes);
    // A member removed for good says so, whatever SWIM last heard of it, and no lag is
    // reported for it (nothing waits for it any more): `acked` and `lag_*` are null together,
    // as for any member replication knows nothing of.
    for m in &mut members {
        let removed = m
            .replica
            .as_deref()
            .is_some_and(|r| gone.contains(&r.replace('-', "")));
        if removed {
            m.state = "decommissioned".to_owned();
            m.acked = None;
            m.lag_entries = None;
            m.lag_bytes = None;
            m.lag_bytes_exact = None;
            m.lag_seconds = None;
        }
    }
    let me_gone = gone_ids.contains(&node.replica_id());
    members.extend(state.cluster.members());
    let m = node.metrics();
    Ok(axum::Json(api::Cluster {
        decommissioned: gone.into_iter().collect(),
        members,
        node: api::ClusterNode {
            data_dir: std::fs::canonicalize(&node.config().data_dir)
                .unwrap_or_else(|_| node.config().data_dir.clone())
                .display()
                .to_string(),
            // Which file holds the data (`device:inode`), so `tidemark snapshot --data DIR`
            // can tell it is talking to DIR's own node whatever the path looks like.
            data_file: crate::store::data_file_identity(&node.config().data_dir),
            // The cluster recorded this node as removed for good (`~gone/{its replica}`).
            decommissioned: me_gone,
            epoch: node.epoch(),
            http: state.listen.to_string(),
            log: api::LogBounds {
                end: log_end,
                start: log_start,
            },
            name: net.as_ref().map(|n| n.name.clone()),
            peer: format!("{:016x}", node.peer_id().0),
            peer_listen: net.as_ref().map(|n| n.local_addr.to_string()),
            replica: node.replica_id().to_string(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            writes_applied: m.ops_applied,
        },
        peers,
        swim: net
            .as_ref()
            .map(|n| n.members.iter().map(replies::swim_member).collect()),
    })
    .into_response())
}

/// `POST /v1/cluster/members/{name}/remove[?force=true]`: decommissions the member `name` (a
/// member SWIM knows by that name, or the replica id of a node whose writes this node holds)
/// for good ([`crate::Node::decommission`]). 200 `{"removed": replica, "name", "already",
/// "at_ms", "by"}` (`already`: it was removed before, nothing was written, the record is the
/// existing one); 404 `member_not_found`; 400 `invalid_member` for this node itself,
/// `invalid_path` for a name that does not decode; 409 `member_alive` for a member SWIM sees
/// alive or suspect, unless `force=true` (not asked of a member already removed).
async fn remove_member(
    State(state): State<AppState>,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(name) = name.map_err(|_| super::error::undecodable_path("invalid_path", "name"))?;
    let Query(pairs) = q.map_err(|e| bad_query("", e.body_text()).at("query"))?;
    let mut force = false;
    for (k, v) in &pairs {
        match (k.as_str(), v.as_str()) {
            ("force", "true") => force = true,
            ("force", "false") => force = false,
            ("force", _) => {
                return Err(bad_query("force", "force takes true or false").at("query force"));
            }
            _ => {
                return Err(
                    bad_query(k, format!("unknown query parameter {k:?}")).at(format!("query {k}"))
                );
            }
        }
    }
    let node = &state.node;
    let me = node.net_status().map(|n| n.name);
    if me.as_deref() == Some(name.as_str()) || name == node.replica_id().to_string() {
        return Err(ApiError::bad_request(
            "invalid_member",
            "a node cannot remove itself: remove it from another member",
        )
        .at("path name"));
    }
    let Some(replica) = node.member_replica(&name) else {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "member_not_found",
            format!(
                "no member named {name:?} is known (give its name as `tidemark members` lists \
                 it, or the replica id of a node whose writes this node holds)"
            ),
        )
        .at("path name"));
    };
    let swim = node.net_status().map(|n| n.members).unwrap_or_default();
    let member = swim
        .iter()
        .find(|m| m.replica.replace('-', "") == replica.to_string());
    let alive = member.is_some_and(|m| {
        matches!(
            m.state,
            crate::net::MemberState::Alive | crate::net::MemberState::Suspect
        )
    });
    // A member already removed answers with its record, whatever SWIM hears of it.
    let removed = node
        .decommissioned()
        .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?
        .contains(&replica);
    if alive && !force && !removed {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "member_alive",
            format!(
                "{name} is still answering: decommission a member only when it is gone for good \
                 (add force=true to remove it anyway)"
            ),
        )
        .at("path name"));
    }
    let shown = member.map_or_else(|| name.clone(), |m| m.name.clone());
    match node.decommission(replica).await {
        Ok(removal) => Ok(axum::Json(api::MemberRemoved {
            already: removal.already,
            at_ms: removal.at_ms,
            by: removal.by.map(|b| b.to_string()),
            name: removal.name.unwrap_or(shown),
            removed: replica.to_string(),
        })
        .into_response()),
        Err(crate::Error::Config(msg)) => {
            Err(ApiError::bad_request("invalid_member", msg).at("path name"))
        }
        Err(e) => Err(ApiError::from_node(
            e,
            Pos::Index,
            state.config.retry_after_secs,
        )),
    }
}

/// `GET /v1/cluster`'s `members`: every member SWIM knows (alive, suspect, down or left), with
/// what replication knows of it (its acknowledged cursor and lag in our log entries), and any
/// connected peer SWIM does not know yet (state `connected`), sorted by name. `last_contact` is
/// the seconds since this node last heard from the member (`null`: never); `version` is the
/// build version the member announced in its SWIM identity (`null`: not known, as for a
/// connected peer SWIM does not know yet). `lag_bytes` is the encoded bytes of our log entries
/// it has not acknowledged (`bytes`, from [`metrics::lag_bytes`]), a lower bound when
/// `lag_bytes_exact` is false; both `null` when replication knows nothing of it.
fn cluster_members(
    swim: &[crate::net::MemberStatus],
    connected: &[String],
    rep: &crate::driver::ReplicationStatus,
    bytes: &std::collections::BTreeMap<crate::proto::PeerId, crate::store::LogBytes>,
) -> Vec<api::ClusterMember> {
    let log_end = rep.log_bounds.1;
    let acked_of = |peer: crate::proto::PeerId| {
        rep.peer_acked
            .iter()
            .find(|(p, _)| *p == peer)
            .map(|(_, a)| *a)
    };
    // Known only from an acknowledged cursor: `null` with `acked`, never one without the other.
    let lag = |acked: Option<Option<u64>>| acked.flatten().map(|a| log_end.saturating_sub(a));
    // Lag in time: since a member linked since open (connected now or not) last had our
    // whole log; what `tidemark_replication_lag_seconds` reports.
    let lag_secs = |peer: crate::proto::PeerId, acked: Option<Option<u64>>| {
        acked.and_then(|a| metrics::peer_lag_seconds(rep, peer, a))
    };
    let mut members: Vec<api::ClusterMember> = swim
        .iter()
        .map(|m| {
            let peer = crate::net::peer_id_of_name(&m.name);
            let acked = acked_of(peer);
            let state = match m.state {
                crate::net::MemberState::Alive => "alive",
                crate::net::MemberState::Suspect => "suspect",
                crate::net::MemberState::Down if m.left => "left",
                crate::net::MemberState::Down => "down",
            };
            api::ClusterMember {
                acked: acked.flatten(),
                addr: Some(m.addr.to_string()),
                connected: connected.contains(&m.name),
                epoch: Some(m.epoch),
                incarnation: Some(m.incarnation),
                lag_bytes: bytes.get(&peer).map(|b| b.bytes),
                lag_bytes_exact: bytes.get(&peer).map(|b| b.exact),
                lag_entries: lag(acked),
                lag_seconds: lag_secs(peer, acked),
                last_contact: m.last_contact_ms.map(|ms| ms as f64 / 1000.0),
                name: m.name.clone(),
                peer: format!("{:016x}", peer.0),
                replica: Some(m.replica.clone()),
                state: state.to_owned(),
                version: m.version.clone(),
            }
        })
        .collect();
    for name in connected {
        if swim.iter().any(|m| &m.name == name) {
            continue;
        }
        let peer = crate::net::peer_id_of_name(name);
        let acked = acked_of(peer);
        // SWIM does not know it yet: no address, epoch, incarnation or replica (omitted).
        members.push(api::ClusterMember {
            acked: acked.flatten(),
            addr: None,
            connected: true,
            epoch: None,
            incarnation: None,
            lag_bytes: bytes.get(&peer).map(|b| b.bytes),
            lag_bytes_exact: bytes.get(&peer).map(|b| b.exact),
            lag_entries: lag(acked),
            lag_seconds: lag_secs(peer, acked),
            last_contact: None,
            name: name.clone(),
            peer: format!("{:016x}", peer.0),
            replica: None,
            state: "connected".to_owned(),
            version: None,
        });
    }
    members.sort_by(|a, b| a.name.cmp(&b.name));
    members
}

/// A time query parameter: epoch milliseconds or RFC 3339.
fn query_time(param: &str, text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>()
        .ok()
        .or_else(|| super::events::parse_event_time_ms(text))
        .ok_or_else(|| {
            bad_query(
                param,
                format!("`{param}` must be epoch milliseconds or RFC 3339, got {text:?}"),
            )
        })
}

/// A `group.<field>` value: a JSON number, boolean or quoted string when it parses as one
/// (`group.code=3`, `group.code="3"`), else the text itself as a string (`group.page=/home`).
fn group_value(text: &str) -> serde_json::Value {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(
            v @ (serde_json::Value::Number(_)
            | serde_json::Value::Bool(_)
            | serde_json::Value::String(_)
            | serde_json::Value::Null),
        ) => v,
        _ => serde_json::Value::String(text.to_owned()),
    }
}

/// The [`ViewQuery`] of `GET /v1/views/{view}`'s parameters, naming the bad one.
fn view_query(params: Vec<(String, String)>, group_by: &[String]) -> Result<ViewQuery, ApiError> {
    let mut q = ViewQuery::default();
    for (name, text) in params {
        match name.as_str() {
            "from" => q.from = Some(query_time("from", &text)?),
            "to" => q.to = Some(query_time("to", &text)?),
            "after" => q.after = Some(text),
            "limit" => {
                q.limit = text
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=10_000).contains(n))
                    .ok_or_else(|| bad_query("limit", "`limit` must be an integer in 1..=10000"))?;
            }
            _ => {
                let Some(field) = name.strip_prefix("group.") else {
                    return Err(bad_query(
                        &name,
                        format!(
                            "unknown parameter {name:?} (group.<field>, from, to, after, limit)"
                        ),
                    ));
                };
                if !group_by.iter().any(|g| g == field) {
                    return Err(bad_query(
                        &name,
                        format!("the view does not group by {field:?} (group_by = {group_by:?})"),
                    ));
                }
                if q.group.contains_key(field) {
                    return Err(bad_query(
                        &name,
                        format!("{name:?} is given twice: a group field takes one value"),
                    ));
                }
                q.group.insert(field.to_owned(), group_value(&text));
            }
        }
    }
    Ok(q)
}

/// `GET /v1/views/{view}`: the view's rows (`group`, `window_start`, `window_end`, `final`,
/// `value`) with the page's `next` cursor, this node's and the cluster's watermark, the view's
/// counters and any definition conflicts.
/// Refuses any query parameter of a route that takes none (400 `invalid_query` naming it), as
/// routes with parameters refuse an unknown one: a mistyped query never goes unnoticed.
fn no_params(
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
    route: &str,
) -> Result<(), ApiError> {
    let Query(pairs) = q.map_err(|e| bad_query("", e.body_text()).at("query"))?;
    match pairs.first() {
        Some((name, _)) => Err(bad_query(
            name,
            format!("unknown parameter {name:?} ({route} takes no parameters)"),
        )),
        None => Ok(()),
    }
}

/// `GET /v1/stats/writes`: the applied-writes counter about once a second, last ten minutes.
async fn write_history(
    State(state): State<AppState>,
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    no_params(q, "/v1/stats/writes")?;
    Ok(axum::Json(replies::write_history(state.node.write_history())).into_response())
}

/// `GET /v1/views`: every configured view with its definition and where it stands here.
async fn views_list(
    State(state): State<AppState>,
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    no_params(q, "/v1/views")?;
    let views = state
        .node
        .view_summaries()
        .await
        .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?;
    let now = crate::clock::wall_ms();
    let views = views
        .into_iter()
        .map(|v| replies::view_summary(v, now))
        .collect();
    Ok(axum::Json(api::ViewsList { views }).into_response())
}

async fn view(
    State(state): State<AppState>,
    view: Result<Path<String>, axum::extract::rejection::PathRejection>,
    params: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(view) = view.map_err(|_| super::error::undecodable_path("invalid_view", "view"))?;
    let params = query_pairs(params, &["from", "to", "after", "limit"])?;
    let Some(def) = state.node.views().iter().find(|v| v.def.name == view) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "view_not_found",
            format!("no view named {view:?} is configured"),
        )
        .at("path view"));
    };
    let query = view_query(params, &def.def.group_by)?;
    // A cursor is a page's `next` as given: one that is not (say, mangled by a shell that ate
    // its quotes) would page from somewhere else and skip rows without a word.
    if let Some(after) = &query.after
        && !is_view_cursor(def, after)
    {
        return Err(bad_query(
            "after",
            format!("after must be the `next` cursor of a page of {view:?}, got {after:?}"),
        ));
    }
    let page = state
        .node
        .view(&view, &query)
        .await
        .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?;
    Ok(axum::Json(replies::view_page(view, page)).into_response())
}

/// The query parsers of `GET /v1/keys`, `/v1/watch` and `/v1/views/{view}` on `query`.
pub(crate) fn fuzz_queries(query: &str) -> [Result<(), Option<String>>; 3] {
    let Some(Query(pairs)) = axum::http::Uri::try_from(format!("/x?{query}"))
        .ok()
        .and_then(|u| Query::<Vec<(String, String)>>::try_from_uri(&u).ok())
    else {
        return [Ok(()), Ok(()), Ok(())];
    };
    let keys = list_query(Ok(Query(pairs.clone())))
        .map(drop)
        .map_err(|e| e.at);
    let watch = super::watch::parse_query(Ok(Query(pairs.clone())), &HeaderMap::new())
        .map(drop)
        .map_err(|e| e.at);
    let view = query_pairs(Ok(Query(pairs)), &["from", "to", "after", "limit"])
        .and_then(|p| view_query(p, &["page".to_owned()]))
        .map(drop)
        .map_err(|e| e.at);
    [keys, watch, view]
}
