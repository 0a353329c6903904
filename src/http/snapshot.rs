//! `GET /v1/snapshot`: a verified point-in-time snapshot of the running node, streamed to the
//! client (the backup path of a daemon, whose data directory the node holds locked).
//!
//! Guarantees: the snapshot is taken from one read transaction while writes continue, written
//! and verified by [`crate::Node::snapshot`] before the first byte is sent (an error before
//! that is an ordinary error answer); its temporary file lives in the data directory (same
//! filesystem as the data, so its size is never limited by `/tmp`) and is unlinked as soon as
//! it is open for streaming, so no copy outlives the request — also when the request is
//! cancelled while the snapshot is written (the work runs as its own task, which owns the
//! permit and removes the file); one snapshot at a time (429 while another is under way, also
//! while a cancelled one finishes); a client that stops reading for `http.body_read_timeout_ms`
//! is cut off (the file and the permit are freed); HEAD is refused (405), not served by taking
//! a snapshot. Leftovers of a crashed process are removed when the server starts and before
//! each snapshot. The client must still verify what it received: a connection cut mid-stream
//! shows only as a short body (`Content-Length` tells).

use super::AppState;
use super::error::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::AsyncReadExt;

/// Bytes read from the file per body chunk.
const CHUNK_BYTES: usize = 256 * 1024;

/// What the preparing task hands the response: the open (already unlinked) snapshot file,
/// its size and header, and the permit, which travels on with the body.
type Prepared = (
    tokio::fs::File,
    u64,
    crate::store::SnapshotInfo,
    tokio::sync::OwnedSemaphorePermit,
);

fn failed(message: String) -> Response {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "snapshot_failed",
        message,
    )
    .into_response()
}

/// Writes the snapshot into the data directory, opens it and removes its name, owning the
/// permit throughout: run as its own task, so a request cancelled meanwhile (client gone,
/// shutdown) neither leaves a file behind nor lets a second snapshot start before this one
/// ends.
async fn prepare(
    node: crate::Node,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<Prepared, Response> {
    let dir = node.config().data_dir.clone();
    crate::store::remove_stream_leftovers(&dir);
    if let Err(message) = crate::store::check_snapshot_room(&dir) {
        return Err(
            ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "no_room", message).into_response(),
        );
    }
    let path = crate::store::stream_snapshot_path(&dir);
    let written = node.snapshot(&path).await;
    let opened = match &written {
        Ok(_) => Some(tokio::fs::File::open(&path).await),
        Err(_) => None,
    };
    // Whatever happened, the name goes: an open file keeps its bytes until it is closed.
    let _ = std::fs::remove_file(&path);
    let info = written.map_err(|e| failed(format!("the snapshot could not be taken: {e}")))?;
    let unreadable =
        |e: std::io::Error| failed(format!("cannot read the snapshot just written: {e}"));
    let file = match opened {
        Some(Ok(f)) => f,
        Some(Err(e)) => return Err(unreadable(e)),
        None => return Err(failed("the snapshot was not written".into())),
    };
    let len = file.metadata().await.map_err(unreadable)?.len();
    Ok((file, len, info, permit))
}

pub(crate) async fn get_snapshot(State(state): State<AppState>, method: Method) -> Response {
    if method != Method::GET {
        // axum routes HEAD to GET handlers: a probe must not cost a whole snapshot.
        let mut resp = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "GET /v1/snapshot only",
        )
        .into_response();
        resp.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
        return resp;
    }
    let Ok(permit) = state.snapshots.clone().try_acquire_owned() else {
        return ApiError::too_many(
            "busy",
            "a snapshot is already being taken; retry when it is done",
            state.config.retry_after_secs,
        )
        .into_response();
    };
    let (mut file, len, info, permit) =
        match tokio::spawn(prepare(state.node.clone(), permit)).await {
            Ok(Ok(p)) => p,
            Ok(Err(resp)) => {
                tracing::error!(status = %resp.status(), "snapshot over HTTP failed");
                return resp;
            }
            Err(e) => return failed(format!("the snapshot task failed: {e}")),
        };
    tracing::info!(
        bytes = len,
        log_end = info.source_log_end,
        "streaming a snapshot over HTTP"
    );
    // A pump task feeds the body; a client that stops reading for the body timeout ends the
    // stream (it sees fewer bytes than `Content-Length`) and frees the file and the permit.
    let stall = std::time::Duration::from_millis(state.config.body_read_timeout_ms);
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(2);
    tokio::spawn(async move {
        let _permit = permit;
        loop {
            let mut buf = vec![0u8; CHUNK_BYTES];
            let item = match file.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(Bytes::from(buf))
                }
                Err(e) => Err(e),
            };
            let last = item.is_err();
            if tx.send_timeout(item, stall).await.is_err() || last {
                return;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
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
