//! `GET /v1/snapshot`: a verified point-in-time snapshot of the running node, streamed to the
//! client (the backup path of a daemon, whose data directory the node holds locked).
//!
//! Guarantees: the snapshot is taken from one read transaction while writes continue, written
//! and verified by [`crate::Node::snapshot`] before the first byte is sent (an error before
//! that is an ordinary error answer); its temporary file lives in the data directory (same
//! filesystem as the data, so its size is never limited by `/tmp`) and is unlinked as soon as
//! it is open for streaming, so no copy outlives the request; one snapshot at a time (429
//! while another is under way). The client must still verify what it received: a connection
//! cut mid-stream shows only as a short body (`Content-Length` tells).

use super::AppState;
use super::error::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::AsyncReadExt;

/// Prefix of the temporary snapshot files in the data directory.
const TEMP_PREFIX: &str = ".http-snapshot-";
/// Bytes read from the file per body chunk.
const CHUNK_BYTES: usize = 256 * 1024;

/// Removes temporary snapshot files a crashed process left (only while no snapshot runs): the
/// published ones and the writer's own hidden temporaries of them (`.<name>.tmp-…`).
fn remove_leftovers(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let ours = TEMP_PREFIX.trim_start_matches('.');
    for e in entries.flatten() {
        if e.file_name()
            .to_string_lossy()
            .trim_start_matches('.')
            .starts_with(ours)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

pub(crate) async fn get_snapshot(State(state): State<AppState>) -> Response {
    let Ok(_permit) = state.snapshots.clone().try_acquire_owned() else {
        return ApiError::too_many(
            "busy",
            "a snapshot is already being taken; retry when it is done",
            state.config.retry_after_secs,
        )
        .into_response();
    };
    let dir = state.node.config().data_dir.clone();
    remove_leftovers(&dir);
    let path = dir.join(format!("{TEMP_PREFIX}{}.tmsnap", uuid::Uuid::new_v4()));
    let info = match state.node.snapshot(&path).await {
        Ok(info) => info,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            tracing::error!(error = %e, "snapshot over HTTP failed");
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "snapshot_failed",
                format!("the snapshot could not be taken: {e}"),
            )
            .into_response();
        }
    };
    let opened = tokio::fs::File::open(&path).await;
    // Unlinked now: the open file keeps its bytes until the stream ends or is dropped.
    let _ = std::fs::remove_file(&path);
    let unreadable = |e: std::io::Error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "snapshot_failed",
            format!("cannot read the snapshot just written: {e}"),
        )
        .into_response()
    };
    let file = match opened {
        Ok(f) => f,
        Err(e) => return unreadable(e),
    };
    let len = match file.metadata().await {
        Ok(m) => m.len(),
        Err(e) => return unreadable(e),
    };
    tracing::info!(
        bytes = len,
        log_end = info.source_log_end,
        "streaming a snapshot over HTTP"
    );
    // The permit travels with the stream: the next snapshot waits until this one is sent.
    let stream = futures_util::stream::unfold(Some((file, _permit)), |open| async move {
        let (mut file, permit) = open?;
        let mut buf = vec![0u8; CHUNK_BYTES];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some((file, permit))))
            }
            // The error ends the body: the client sees fewer bytes than `Content-Length`.
            Err(e) => Some((Err(e), None)),
        }
    });
    let name = format!(
        "tidemark-{}-{}.tmsnap",
        info.source_replica, info.source_log_end
    );
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
            (
                header::HeaderName::from_static("x-tidemark-snapshot-replica"),
                info.source_replica.to_string(),
            ),
            (
                header::HeaderName::from_static("x-tidemark-snapshot-log-end"),
                info.source_log_end.to_string(),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}
