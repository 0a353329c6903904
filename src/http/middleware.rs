//! Request guards, outermost first: metrics, header size, bearer token, concurrency limit.

use super::AppState;
use super::error::ApiError;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// Counts every request by route and status, and times it; with `http.access_log`, logs it
/// once its answer's body has been sent (or dropped: a client that went away).
pub(crate) async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().clone();
    let started = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    state
        .metrics
        .requests
        .get_or_create(&vec![
            ("route", route.clone()),
            ("status", status.to_string()),
        ])
        .inc();
    state
        .metrics
        .duration
        .get_or_create(&vec![("route", route.clone())])
        .observe(started.elapsed().as_secs_f64());
    if !state.config.access_log {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let logged = AccessLogged {
        inner: body,
        bytes: 0,
        entry: Some(AccessEntry {
            method,
            route,
            status,
            started,
        }),
    };
    Response::from_parts(parts, Body::new(logged))
}

/// What the access log says of one request, written once.
struct AccessEntry {
    method: axum::http::Method,
    route: String,
    status: u16,
    started: Instant,
}

/// An answer's body that counts the bytes sent and writes the access-log line when it ends
/// (complete, failed, or dropped because the client went away).
struct AccessLogged {
    inner: Body,
    bytes: u64,
    entry: Option<AccessEntry>,
}

impl AccessLogged {
    fn log(&mut self) {
        if let Some(e) = self.entry.take() {
            tracing::info!(
                target: "tidemark::http::access",
                method = %e.method,
                route = %e.route,
                status = e.status,
                duration_ms = e.started.elapsed().as_micros() as f64 / 1e3,
                bytes = self.bytes,
                "request"
            );
        }
    }
}

impl HttpBody for AccessLogged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None | Some(Err(_))) => self.log(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for AccessLogged {
    fn drop(&mut self) {
        self.log();
    }
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

/// Paths served without the token: the probes (a load balancer or kubelet cannot hold the
/// token; they answer a status word and nothing about the data) and the static console page
/// (which holds no data and asks for the token itself).
fn public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/" | "/index.html")
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
