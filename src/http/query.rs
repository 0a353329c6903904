//! Query parameters and small reply pieces shared by the route handlers (`routes.rs`, the
//! watch, final-feed and late-lane handlers): decoding a query into pairs that name their
//! faults, the key-type path segment.

use super::error::ApiError;
use axum::extract::Query;
use axum::http::StatusCode;
use tidemark_crdts::KeyKind;

/// Parses a key type path segment; 404 `unknown_type` at `at` for anything else.
pub(super) fn parse_kind(s: &str, at: &str) -> Result<KeyKind, ApiError> {
    KeyKind::parse(s).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_type",
            format!("unknown key type {s:?} (gcounter, pncounter, orset, lww, mvreg)"),
        )
        .at(at.to_owned())
    })
}

/// [`query_pairs`] for a route whose parameters are exactly `known`: an unknown one is refused
/// too (400 `invalid_query` naming it, the list of known ones in the message), as
/// `GET /v1/views/{view}` refuses one, so a mistyped parameter never goes unnoticed.
pub(super) fn known_query_pairs(
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
    known: &[&str],
) -> Result<Vec<(String, String)>, ApiError> {
    let pairs = query_pairs(q, known)?;
    if let Some((name, _)) = pairs.iter().find(|(n, _)| !known.contains(&n.as_str())) {
        return Err(bad_query(
            name,
            format!("unknown parameter {name:?} ({})", known.join(", ")),
        ));
    }
    Ok(pairs)
}

/// Query parameters as pairs, decoded by hand so every fault names its parameter in the JSON
/// error shape (a parameter given twice is refused; unknown ones are left to the caller:
/// [`known_query_pairs`] refuses them).
pub(super) fn query_pairs(
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
    known: &[&str],
) -> Result<Vec<(String, String)>, ApiError> {
    let Query(pairs) = q.map_err(|e| bad_query("", e.body_text()).at("query"))?;
    let mut seen: Vec<&str> = Vec::new();
    for (name, _) in &pairs {
        if let Some(k) = known.iter().find(|k| **k == name) {
            if seen.contains(k) {
                return Err(bad_query(name, format!("`{name}` is given more than once")));
            }
            seen.push(k);
        }
    }
    Ok(pairs)
}

/// A 400 `invalid_query` whose `at` names the query parameter `param`.
pub(super) fn bad_query(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_query", message).at(format!("query {param}"))
}
