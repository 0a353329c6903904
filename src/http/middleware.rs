//! Request guards, outermost first: metrics, header size, bearer token, concurrency limit.

use super::AppState;
use super::error::ApiError;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Instant;

/// Counts every request by route and status, and times it.
pub(crate) async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |p| p.as_str().to_owned());
    let started = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    state
        .metrics
        .requests
        .get_or_create(&vec![("route", route.clone()), ("status", status)])
        .inc();
    state
        .metrics
        .duration
        .get_or_create(&vec![("route", route)])
        .observe(started.elapsed().as_secs_f64());
    resp
}

/// Refuses requests whose headers exceed `http.header_bytes_max` (413).
pub(crate) async fn header_limit(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + req.uri().to_string().len();
    if bytes > state.config.header_bytes_max {
        state.metrics.rejected("headers");
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "headers_too_large",
            format!(
                "request line and headers are {bytes} bytes, over http.header_bytes_max ({})",
                state.config.header_bytes_max
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// Byte-wise comparison whose time does not depend on where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Paths served without the token: liveness and the static console page (which holds no
/// data and asks for the token itself).
fn public(path: &str) -> bool {
    matches!(path, "/healthz" | "/" | "/index.html")
}

/// Requires `Authorization: Bearer <http.token>` when a token is configured (401).
pub(crate) async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &state.config.token {
        if !public(req.uri().path()) {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
                state.metrics.rejected("auth");
                let mut resp = ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "this node needs `Authorization: Bearer <token>`",
                )
                .into_response();
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                return resp;
            }
        }
    }
    next.run(req).await
}

/// At most `http.concurrency_max` requests at once (watch streams have their own bound; probes
/// and metrics stay answerable under overload); beyond it, 429 with `Retry-After` instead of
/// queueing.
pub(crate) async fn concurrency(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if matches!(path, "/healthz" | "/readyz" | "/metrics" | "/v1/watch") {
        return next.run(req).await;
    }
    let Ok(_permit) = state.requests.clone().try_acquire_owned() else {
        state.metrics.rejected("concurrency");
        return ApiError::too_many(
            "overloaded",
            format!(
                "more than http.concurrency_max ({}) requests in flight; retry later",
                state.config.concurrency_max
            ),
            state.config.retry_after_secs,
        )
        .into_response();
    };
    next.run(req).await
}
