//! The web console: one static page embedded in the binary (no build step, no CDN).

use axum::http::header;
use axum::response::IntoResponse;

const INDEX: &str = include_str!("../console/index.html");

/// `GET /`: the console page. It holds no data; it reads everything through the API (asking
/// for the token when the node has one).
pub(crate) async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
}
