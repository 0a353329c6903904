//! Request guards, outermost first: metrics, header size, browser safety (`Host`, `Origin`,
//! write content type), bearer token, concurrency limit.

use super::AppState;
use super::error::ApiError;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};
use std::net::{IpAddr, SocketAddr};
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

/// Puts every error answer in the JSON error shape, also those the router and extractors
/// produce themselves (a path that does not decode, a method a route does not take).
pub(crate) async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    if json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    // A path that does not decode (invalid percent-encoding, not UTF-8) on a route whose
    // handler does not name its parameter itself: still the API's typed error.
    let bad_path = status == StatusCode::BAD_REQUEST && text.starts_with("Invalid URL");
    let code = match status.as_u16() {
        400 if bad_path => "invalid_path",
        400 => "bad_request",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "body_timeout",
        413 => "too_large",
        415 => "unsupported_media_type",
        422 => "invalid_request",
        s if s >= 500 => "internal",
        _ => "error",
    };
    let message = if bad_path {
        // The router's own words ("Invalid URL: ...") are not the API's.
        "the path is not UTF-8 text once percent-decoded".to_owned()
    } else if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let error = ApiError::new(status, code, message);
    let mut out = if bad_path { error.at("path") } else { error }.into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// Refuses requests whose headers exceed `http.header_bytes_max` (413), and queries that do
/// not percent-decode to UTF-8 (400 `invalid_query`).
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
    // A query that does not decode to UTF-8 is refused whole, never read lossily (a prefix
    // of U+FFFD matches nothing and silently answers empty).
    if req.uri().query().is_some_and(|q| !super::error::decodes(q)) {
        return ApiError::bad_request(
            "invalid_query",
            "the query is not UTF-8 text once percent-decoded",
        )
        .at("query")
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

/// The credentials of an `Authorization` value of the `Bearer` scheme: the scheme is matched
/// case-insensitively (RFC 7235 §2.1: `bearer`, `BEARER` are the same scheme), followed by
/// one or more spaces; `None` for another scheme or no credentials.
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    let token = rest.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Requires `Authorization: Bearer <http.token>` when a token is configured (401).
pub(crate) async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(token) = &state.config.token {
        if !public(req.uri().path()) {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(bearer_credentials);
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
    // Writes take their slot themselves once their body (or an ingest's first line) arrived:
    // a client that sends nothing, or trickles, holds no slot.
    if req.method() == axum::http::Method::POST
        && (path == "/v1/ops" || path.starts_with("/v1/streams/"))
    {
        return next.run(req).await;
    }
    let _permit = match slot(&state) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    next.run(req).await
}

/// One of the `http.concurrency_max` request slots, or 429 with `Retry-After`.
pub(crate) fn slot(state: &AppState) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    state.requests.clone().try_acquire_owned().map_err(|_| {
        state.metrics.rejected("concurrency");
        ApiError::too_many(
            "overloaded",
            format!(
                "more than http.concurrency_max ({}) requests in flight; retry later",
                state.config.concurrency_max
            ),
            state.config.retry_after_secs,
        )
    })
}

/// A `host[:port]` authority split into its lowercase host (IPv6 without brackets) and port
/// (`None` when absent); `None` when it is not one.
fn split_authority(authority: &str) -> Option<(String, Option<u16>)> {
    let authority = authority.trim();
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return None,
            None => (authority, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().ok()?)
        }
        Some(_) => return None,
    };
    if host.is_empty() || host.contains(['/', '@', ' ', '\\']) {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

/// True when `host:port` (a request's `Host`) names this node: `localhost`, a loopback
/// address or the bound address with the bound port (any IP literal when bound to every
/// interface), or an `http.allowed_hosts` entry. A name the node does not know is what a
/// DNS-rebinding page sends.
fn host_allowed(host: &str, port: Option<u16>, listen: SocketAddr, extra: &[String]) -> bool {
    let port_matches = port.unwrap_or(80) == listen.port();
    let builtin = match host.parse::<IpAddr>() {
        Ok(ip) => {
            ip.is_loopback()
                || ip == listen.ip()
                || listen.ip().is_unspecified()
                || ip.to_canonical() == listen.ip().to_canonical()
        }
        Err(_) => host == "localhost",
    };
    if builtin && port_matches {
        return true;
    }
    extra.iter().any(|entry| {
        let entry = entry.trim();
        if entry == "*" {
            return true;
        }
        match split_authority(entry) {
            Some((name, None)) => name == host,
            Some((name, Some(p))) => name == host && Some(p) == port.or(Some(80)),
            None => false,
        }
    })
}

/// True when `origin` is the node's own console origin (`http://` + the request's `Host`) or
/// an `http.allowed_origins` entry.
fn origin_allowed(origin: &str, host: &(String, Option<u16>), extra: &[String]) -> bool {
    let origin = origin.trim().trim_end_matches('/');
    if extra
        .iter()
        .any(|e| e == "*" || e.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Some(authority) = origin
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &origin[7..])
    else {
        return false;
    };
    match split_authority(authority) {
        Some((h, p)) => h == host.0 && p.unwrap_or(80) == host.1.unwrap_or(80),
        None => false,
    }
}

/// Media types a write body may carry: JSON and NDJSON. Everything a browser may send
/// cross-site without a CORS preflight (`text/plain`, forms, no type at all) is refused.
fn json_media_type(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "application/json"
            | "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/x-jsonlines"
    ) || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// True when the request carries a body (a `Content-Length` above 0, or chunked).
fn has_body(req: &Request) -> bool {
    let headers = req.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.to_str().map_or(true, |v| v.trim() != "0"))
}

/// Browser safety on every route but `/healthz` and `/readyz` (they answer only a status word,
/// and probes behind port mappings or proxies send a `Host` of their own): the `Host` must name this node (421, against
/// DNS rebinding), an `Origin` must be the node's own or allowed (403, against cross-site
/// pages; so is a request a page of another site caused without an `Origin`, by its
/// `Sec-Fetch-Site`), and a write body must be JSON or NDJSON (415: the content types a page
/// can send without a CORS preflight are refused).
pub(crate) async fn browser_guard(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if matches!(req.uri().path(), "/healthz" | "/readyz") {
        return next.run(req).await;
    }
    let config = &state.config;
    let host_text = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    let host = host_text.as_deref().and_then(split_authority);
    let uri_host_ok = req.uri().authority().is_none_or(|a| {
        split_authority(a.as_str())
            .is_some_and(|(h, p)| host_allowed(&h, p, state.listen, &config.allowed_hosts))
    });
    let Some(host) = host
        .filter(|(h, p)| uri_host_ok && host_allowed(h, *p, state.listen, &config.allowed_hosts))
    else {
        state.metrics.rejected("host");
        return ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "host_not_allowed",
            format!(
                "Host {:?} does not name this node (localhost, a loopback address or {}, port {}); \
                 add the name to http.allowed_hosts to serve it",
                host_text.unwrap_or_default(),
                state.listen.ip(),
                state.listen.port()
            ),
        )
        .at("header Host")
        .into_response();
    };
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origin_allowed(origin, &host, &config.allowed_origins) {
            state.metrics.rejected("origin");
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                format!(
                    "requests from pages of origin {origin:?} are refused; add it to \
                     http.allowed_origins to allow them"
                ),
            )
            .at("header Origin")
            .into_response();
        }
    }
    // A browser names where a request comes from even when it sends no `Origin` (an `<img>`,
    // a `<script>`, a link): a request a page of another site caused is refused, unless its
    // origin was allowed above. Clients that are not browsers send no such header.
    let fetch_site = req
        .headers()
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none");
    let allowed_origin = req.headers().contains_key(header::ORIGIN);
    if !allowed_origin && matches!(fetch_site, "cross-site" | "same-site") {
        state.metrics.rejected("origin");
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            format!(
                "requests caused by pages of other sites are refused (Sec-Fetch-Site: \
                 {fetch_site}); open the node's console or API directly"
            ),
        )
        .at("header Sec-Fetch-Site")
        .into_response();
    }
    let writes = matches!(
        *req.method(),
        axum::http::Method::POST
            | axum::http::Method::PUT
            | axum::http::Method::PATCH
            | axum::http::Method::DELETE
    );
    if writes && has_body(&req) {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        if !json_media_type(ct) {
            state.metrics.rejected("content_type");
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "a request body must be `Content-Type: application/json` or \
                     `application/x-ndjson` (got {:?})",
                    ct.unwrap_or("none")
                ),
            )
            .at("header Content-Type")
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 7700))
    }

    fn allowed(host: &str, extra: &[&str]) -> bool {
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        split_authority(host).is_some_and(|(h, p)| host_allowed(&h, p, listen(), &extra))
    }

    #[test]
    fn hosts() {
        assert!(allowed("127.0.0.1:7700", &[]));
        assert!(allowed("LocalHost:7700", &[]));
        assert!(allowed("[::1]:7700", &[]));
        assert!(!allowed("127.0.0.1:7701", &[]));
        assert!(!allowed("localhost", &[]));
        assert!(!allowed("evil.example:7700", &[]));
        assert!(!allowed("localhost.:7700", &[]));
        assert!(!allowed("x", &[]));
        assert!(!allowed("evil@127.0.0.1:7700", &[]));
        assert!(allowed("tm.example", &["tm.example"]));
        assert!(allowed("tm.example:9000", &["tm.example"]));
        assert!(!allowed("tm.example:9000", &["tm.example:9001"]));
        assert!(allowed("anything:1", &["*"]));
    }

    #[test]
    fn origins() {
        let host = ("127.0.0.1".to_owned(), Some(7700));
        assert!(origin_allowed("http://127.0.0.1:7700", &host, &[]));
        assert!(!origin_allowed("http://localhost:7700", &host, &[]));
        assert!(!origin_allowed("https://127.0.0.1:7700", &host, &[]));
        assert!(!origin_allowed("null", &host, &[]));
        assert!(!origin_allowed("http://evil.example", &host, &[]));
        let extra = vec!["https://c.example".to_owned()];
        assert!(origin_allowed("https://c.example", &host, &extra));
    }

    #[test]
    fn the_bearer_scheme_is_matched_case_insensitively() {
        use super::bearer_credentials as b;
        assert_eq!(b("Bearer abc"), Some("abc"));
        assert_eq!(b("bearer abc"), Some("abc"));
        assert_eq!(b("BEARER  abc"), Some("abc"));
        assert_eq!(b("Basic abc"), None);
        assert_eq!(b("Bearerabc"), None);
        assert_eq!(b("Bearer"), None);
        assert_eq!(b("Bearer "), None);
    }

    #[test]
    fn media_types() {
        assert!(json_media_type(Some("application/json")));
        assert!(json_media_type(Some("Application/JSON; charset=utf-8")));
        assert!(json_media_type(Some("application/x-ndjson")));
        assert!(!json_media_type(Some("text/plain")));
        assert!(!json_media_type(Some("application/x-www-form-urlencoded")));
        assert!(!json_media_type(Some("multipart/form-data; boundary=x")));
        assert!(!json_media_type(None));
    }
}
