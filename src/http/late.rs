//! `GET /v1/streams/{stream}/late?after=ID&limit=N`: a page of the stream's late lane (events
//! acknowledged but applied to no view for being late; see `Node::late_events`).

use super::AppState;
use super::error::{ApiError, Pos};
use super::query::{bad_query, known_query_pairs};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub(super) async fn get_late(
    State(state): State<AppState>,
    stream: Result<Path<String>, axum::extract::rejection::PathRejection>,
    params: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(stream) =
        stream.map_err(|_| super::error::undecodable_path("invalid_stream", "stream"))?;
    let (mut after, mut limit) = (None, 0usize);
    for (name, text) in known_query_pairs(params, &["after", "limit"])? {
        match name.as_str() {
            "after" => {
                after = Some(text.parse::<u64>().map_err(|_| {
                    bad_query("after", format!("after must be a record id, got {text:?}"))
                })?);
            }
            "limit" => {
                limit = text
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=crate::views::late::PAGE_MAX).contains(n))
                    .ok_or_else(|| {
                        bad_query(
                            "limit",
                            format!(
                                "limit must be 1..={}, got {text:?}",
                                crate::views::late::PAGE_MAX
                            ),
                        )
                    })?;
            }
            _ => {}
        }
    }
    if !state.node.views().iter().any(|v| v.def.stream == stream) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "stream_not_found",
            format!("no view reads stream {stream:?}, so it has no late lane"),
        )
        .at("path stream"));
    }
    let page = state
        .node
        .late_events(&stream, after, limit)
        .map_err(|e| ApiError::from_node(e, Pos::Index, state.config.retry_after_secs))?;
    Ok(axum::Json(super::replies::late_page(page)?).into_response())
}
