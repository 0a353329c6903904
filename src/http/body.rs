//! Bounded request bodies: a size-limited whole body, and NDJSON lines streamed with a per-line
//! limit, both with a per-chunk read timeout.

use super::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt;
use std::time::Duration;

fn timeout_error() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        "the request body stalled past http.body_read_timeout_ms",
    )
}

fn line_timeout_error(line: usize) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        format!("line {line} did not arrive whole within http.body_read_timeout_ms"),
    )
    .at(format!("line {line}"))
}

fn read_error(e: &axum::Error) -> ApiError {
    ApiError::bad_request("body_read", format!("reading the request body failed: {e}"))
}

/// Reads a body chunk by chunk, each within `timeout`.
pub(crate) struct Chunks {
    body: Body,
    timeout: Duration,
}

impl Chunks {
    pub(crate) fn new(body: Body, timeout: Duration) -> Self {
        Self { body, timeout }
    }

    /// The next data chunk, `None` at the end.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>, ApiError> {
        loop {
            let frame = tokio::time::timeout(self.timeout, self.body.frame())
                .await
                .map_err(|_| timeout_error())?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(read_error(&e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            return Ok(Some(data));
                        }
                    }
                }
            }
        }
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is over http.body_bytes_max ({limit} bytes)"),
    )
}

/// Bytes of request bodies held at once by all requests (`http.inflight_bytes_max`): a
/// request takes its share as its body arrives and gives it back when it is done with it.
pub(crate) type BodyBudget = std::sync::Arc<tokio::sync::Semaphore>;

fn over_budget(retry_after: u64) -> ApiError {
    ApiError::too_many(
        "inflight_bytes",
        "request bodies in flight are over http.inflight_bytes_max; retry later",
        retry_after,
    )
}

/// Takes `n` more bytes of `budget` into `held` (429 when the budget has not that many).
pub(crate) fn charge(
    budget: &BodyBudget,
    held: &mut Option<tokio::sync::OwnedSemaphorePermit>,
    n: usize,
    retry_after: u64,
) -> Result<(), ApiError> {
    if n == 0 {
        return Ok(());
    }
    let n = u32::try_from(n).map_err(|_| over_budget(retry_after))?;
    let permit = std::sync::Arc::clone(budget)
        .try_acquire_many_owned(n)
        .map_err(|_| over_budget(retry_after))?;
    match held {
        Some(h) => h.merge(permit),
        None => *held = Some(permit),
    }
    Ok(())
}

/// The whole body, refused with 413 as soon as it is known to exceed `limit` (from its
/// `Content-Length`, before reading anything, or once `limit` bytes were read), with 429 when
/// `budget` cannot hold it, and with 408 unless all of it arrives within `timeout`; the
/// returned permit holds its bytes of the budget.
pub(crate) async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
    budget: &BodyBudget,
    retry_after: u64,
) -> Result<(Bytes, Option<tokio::sync::OwnedSemaphorePermit>), ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    let mut held = None;
    // Only bytes that arrived are charged and allocated: a client that declares a large body
    // and sends nothing holds neither memory nor budget.
    let mut out = Vec::with_capacity(declared.map_or(0, |n| n as usize).min(64 * 1024));
    // The whole body must arrive within the timeout, not just each chunk: a client trickling a
    // byte now and then is cut off (408) like one that stalls.
    let whole = async {
        let mut chunks = Chunks::new(body, timeout);
        while let Some(chunk) = chunks.next().await? {
            if out.len() + chunk.len() > limit {
                return Err(too_large(limit));
            }
            charge(budget, &mut held, chunk.len(), retry_after)?;
            out.extend_from_slice(&chunk);
        }
        Ok(())
    };
    tokio::time::timeout(timeout, whole)
        .await
        .map_err(|_| timeout_error())??;
    Ok((Bytes::from(out), held))
}

/// NDJSON lines of a streamed body, numbered from 1; blank lines are skipped (but counted).
///
/// The line buffer is charged to the in-flight body budget as it grows (in steps of
/// [`LINE_CHARGE_STEP`]), so a client that trickles holds only what it sent; and each line must
/// arrive whole within the body timeout, so one that trickles a line forever is cut off (408).
pub(crate) struct Lines {
    chunks: Chunks,
    buf: Vec<u8>,
    /// Start of unconsumed bytes in `buf`.
    start: usize,
    /// Bytes of `buf[start..]` known to hold no newline.
    scanned: usize,
    line_no: usize,
    line_max: usize,
    done: bool,
    budget: BodyBudget,
    held: Option<tokio::sync::OwnedSemaphorePermit>,
    charged: usize,
    retry_after: u64,
    /// When the first byte of the line being read arrived.
    line_since: Option<tokio::time::Instant>,
    /// Reading the body failed (timeout, too long, cut off): nothing more is read from it.
    failed: bool,
}

/// At most this many bytes of a refused body are read and dropped so that its client, still
/// sending, receives the answer instead of a reset connection.
pub(crate) const DISCARD_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The line buffer's bytes are charged to the body budget in steps of this many.
pub(crate) const LINE_CHARGE_STEP: usize = 64 * 1024;

impl Lines {
    pub(crate) fn new(
        chunks: Chunks,
        line_max: usize,
        budget: &BodyBudget,
        retry_after: u64,
    ) -> Self {
        Self {
            chunks,
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            line_no: 0,
            line_max,
            done: false,
            budget: std::sync::Arc::clone(budget),
            held: None,
            charged: 0,
            retry_after,
            line_since: None,
            failed: false,
        }
    }

    /// After a refusal: reads and drops what the client still sends, up to
    /// [`DISCARD_BYTES_MAX`] bytes within one body timeout in all. A client that writes its
    /// whole request before reading the answer (as most HTTP/1 clients do) then reads the
    /// refusal; closing with its bytes unread would reset the connection and lose the answer.
    /// Does nothing when reading the body itself failed (too slow, too long, cut off).
    pub(crate) async fn discard_rest(&mut self) {
        self.buf = Vec::new();
        self.start = 0;
        self.scanned = 0;
        self.held = None;
        self.charged = 0;
        let mut dropped = 0usize;
        let deadline = tokio::time::Instant::now() + self.chunks.timeout;
        while !self.done && !self.failed && dropped <= DISCARD_BYTES_MAX {
            match tokio::time::timeout_at(deadline, self.chunks.next()).await {
                Ok(Ok(Some(chunk))) => dropped += chunk.len(),
                Ok(Ok(None)) => self.done = true,
                Ok(Err(_)) | Err(_) => self.failed = true,
            }
        }
    }

    /// Charges the buffer's bytes (rounded up to a step) to the budget.
    fn charge_buffer(&mut self) -> Result<(), ApiError> {
        let need = self.buf.len().div_ceil(LINE_CHARGE_STEP) * LINE_CHARGE_STEP;
        if need > self.charged {
            charge(
                &self.budget,
                &mut self.held,
                need - self.charged,
                self.retry_after,
            )?;
            self.charged = need;
        }
        Ok(())
    }

    fn line_too_long(&self, line: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "line_too_large",
            format!(
                "line {line} is over http.line_bytes_max ({} bytes)",
                self.line_max
            ),
        )
        .at(format!("line {line}"))
    }

    /// The next non-blank line with its number, `None` at the end of the body.
    pub(crate) async fn next(&mut self) -> Result<Option<(usize, Vec<u8>)>, ApiError> {
        let next = self.read_line().await;
        self.failed |= next.is_err();
        next
    }

    async fn read_line(&mut self) -> Result<Option<(usize, Vec<u8>)>, ApiError> {
        loop {
            let pending = &self.buf[self.start..];
            if let Some(nl) = pending[self.scanned..].iter().position(|b| *b == b'\n') {
                let end = self.start + self.scanned + nl;
                self.line_no += 1;
                let mut line = &self.buf[self.start..end];
                if line.last() == Some(&b'\r') {
                    line = &line[..line.len() - 1];
                }
                if line.len() > self.line_max {
                    return Err(self.line_too_long(self.line_no));
                }
                let line = line.to_vec();
                self.start = end + 1;
                self.scanned = 0;
                // The rest of the buffer (if any) is the next line's start, which arrived now.
                self.line_since = Some(tokio::time::Instant::now());
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some((self.line_no, line)));
            }
            self.scanned = pending.len();
            if self.scanned > self.line_max + 1 {
                return Err(self.line_too_long(self.line_no + 1));
            }
            if self.done {
                if pending.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                self.line_no += 1;
                let line = pending.to_vec();
                self.start = self.buf.len();
                self.scanned = 0;
                return Ok(Some((self.line_no, line)));
            }
            // Compact, then read more.
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            // A line that started must end within the body timeout.
            let chunk = match self.line_since.filter(|_| self.start < self.buf.len()) {
                Some(since) => {
                    let left = (since + self.chunks.timeout)
                        .saturating_duration_since(tokio::time::Instant::now());
                    tokio::time::timeout(left, self.chunks.next())
                        .await
                        .map_err(|_| line_timeout_error(self.line_no + 1))??
                }
                None => self.chunks.next().await?,
            };
            match chunk {
                Some(chunk) => {
                    if self.start >= self.buf.len() || self.line_since.is_none() {
                        self.line_since = Some(tokio::time::Instant::now());
                    }
                    self.buf.extend_from_slice(&chunk);
                    self.charge_buffer()?;
                }
                None => self.done = true,
            }
        }
    }
}
