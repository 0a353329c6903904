//! What every long-lived streaming response (watch, final feed) shares: its bound on one
//! event's value, its end at server shutdown, and its place in `tidemark_http_watchers`.

/// Largest value (about, as JSON text) a watch event carries; a larger one is announced with
/// `value_omitted` and read with `GET /v1/keys/{type}/{name}`.
pub(super) const WATCH_EVENT_VALUE_BYTES_MAX: usize = 1 << 20;

/// Ends a watch stream when the server shuts down.
pub(super) async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// One open watch stream in `tidemark_http_watchers`: counted while the stream lives, whether
/// it ends (shutdown, node closed) or is dropped because the client disconnected.
pub(super) struct Watching(prometheus_client::metrics::gauge::Gauge);

impl Watching {
    pub(super) fn new(gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.dec();
    }
}
