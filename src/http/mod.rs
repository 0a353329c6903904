//! The HTTP API of `API.md` over an embedded [`Node`]: a thin layer that turns requests into
//! the same `Node` calls an embedded user makes.
//!
//! Guarantees: a write is answered 200 only after its durable commit; a rejected `/v1/ops` batch
//! applies nothing; every JSON body is a type of [`crate::api`] (the contract the CLI reads);
//! every error body is `{"error":{"code","message","at"}}` naming the index, line or field at
//! fault; every input is bounded (body, NDJSON line, headers, concurrent requests, watchers,
//! connections) and slow clients are cut off by the header-read timeout (which also closes idle
//! keep-alive connections) and the body-read timeout.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let node = tidemark::Node::open(tidemark::NodeConfig::new("./data")).await?;
//! let server = tidemark::http::HttpServer::bind(node.clone(), tidemark::http::HttpConfig::default()).await?;
//! println!("listening on {}", server.local_addr());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! node.shutdown().await?;
//! # Ok(()) }
//! ```

mod body;
mod console;
mod consumers;
mod error;
mod events;
mod final_feed;
mod late;
mod metrics;
mod middleware;
mod query;
mod replies;
mod routes;
mod snapshot;
mod stream;
mod watch;

pub use error::ApiError;

/// The HTTP request parsers as the server runs them, for the fuzz targets (not a stable API).
#[doc(hidden)]
pub mod fuzzing {
    use crate::config::Limits;

    /// Parses a `POST /v1/ops` body (JSON array or NDJSON) into validated writes; the number of
    /// writes, or the API error's code and `at`.
    pub fn ops_body(body: &[u8]) -> Result<usize, (String, Option<String>)> {
        super::events::parse_ops(body, &Limits::default())
            .map(|(writes, _)| writes.len())
            .map_err(|e| match e {
                super::events::ParseError::Api(e) => (e.code.to_owned(), e.at),
                super::events::ParseError::Node(e, pos) => {
                    (e.code().to_owned(), Some(pos.to_string()))
                }
            })
    }

    /// Parses one NDJSON event line; the number of its ops, or the API error's `at`.
    pub fn event_line(line: &[u8]) -> Result<usize, Option<String>> {
        super::events::parse_event(1, line)
            .map(|e| e.ops.len())
            .map_err(|e| e.at)
    }

    /// Parses the query string of `GET /v1/keys`, `GET /v1/watch` and `GET /v1/views/{view}`
    /// (grouped by `page`) as the routes do; errors name the parameter.
    pub fn query(query: &str) -> [Result<(), Option<String>>; 3] {
        super::routes::fuzz_queries(query)
    }

    /// Parses `text` as a watch cursor and as a final-window cursor (what `Last-Event-ID` and
    /// `after=` carry); true when each one accepted prints back to text that parses to it.
    pub fn cursors_roundtrip(text: &str) -> bool {
        let watch = match text.parse::<crate::watch::Cursor>() {
            Ok(c) => c.to_string().parse() == Ok(c),
            Err(_) => true,
        };
        let fin = match text.parse::<crate::views::FinalCursor>() {
            Ok(c) => c.to_string().parse() == Ok(c),
            Err(_) => true,
        };
        watch && fin
    }
}
pub use events::parse_event_time_ms;

use crate::node::Node;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Settings of the HTTP server (the `[http]` table of the node's TOML config). Every bound has
/// a default; units and qualifiers come last in each name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Where to listen (default `127.0.0.1:7700`, loopback only).
    pub listen: SocketAddr,
    /// When set, every request but `GET /healthz` and the static console page needs
    /// `Authorization: Bearer <token>` (401 otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Largest request body of `POST /v1/ops` (default 8 MiB; 413 beyond).
    pub body_bytes_max: usize,
    /// Longest NDJSON line (default 1 MiB; 413 naming the line beyond).
    pub line_bytes_max: usize,
    /// Most bytes of request headers (default 16 KiB; 413 beyond, and the HTTP parser answers
    /// 431 and closes the connection beyond four times this).
    pub header_bytes_max: usize,
    /// Most requests handled at once (watch streams excepted); 429 + `Retry-After` beyond
    /// (default 256).
    pub concurrency_max: usize,
    /// Most open `GET /v1/watch` streams (default 256; 429 beyond).
    pub watchers_max: usize,
    /// Most open connections; further connections are closed at once (default 4,096).
    pub connections_max: usize,
    /// Time a client has to send a request's headers, also the longest a keep-alive connection
    /// may sit idle (default 10 s): a slowloris client is disconnected after it.
    pub header_read_timeout_ms: u64,
    /// Longest wait for the next chunk of a request body (default 30 s; 408 after it).
    pub body_read_timeout_ms: u64,
    /// Events committed together by `POST /v1/streams/{s}/events` (default 1,000; also capped
    /// by the node's `batch_ops_max`).
    pub ingest_batch_events: usize,
    /// Bytes of NDJSON committed together by an ingest (default 4 MiB): with the line limit,
    /// this bounds an upload's memory whatever its size.
    pub ingest_batch_bytes: usize,
    /// How long a streamed ingest waits out the node's backpressure after its first batch
    /// before answering 429 (default 5 s).
    pub ingest_backpressure_wait_ms: u64,
    /// The `Retry-After` seconds sent with 429 (default 1).
    pub retry_after_secs: u64,
    /// How long shutdown waits for in-flight requests (default 30 s).
    pub shutdown_grace_ms: u64,
    /// One INFO line per request (target `tidemark::http::access`: method, matched route,
    /// status, duration, bytes sent), written when its answer has been sent (default true).
    pub access_log: bool,
    /// Most bytes of request bodies all requests hold at once (default 64 MiB); a body that
    /// would take more answers 429 + `Retry-After`. An ingest holds `line_bytes_max` of it for
    /// its whole request (its line buffer). Must be at least `body_bytes_max` and
    /// `line_bytes_max`.
    pub inflight_bytes_max: usize,
    /// Extra names a request's `Host` may carry (every route but `/healthz`; 421 otherwise).
    /// Always allowed: `localhost`, loopback addresses and the bound address, with the bound
    /// port. An entry `name` allows that name with any port, `name:port` only that port, `*`
    /// any host (turns the check off: DNS rebinding then reaches the node).
    pub allowed_hosts: Vec<String>,
    /// Extra origins (`https://console.example:8443`) whose pages may call the API; a request
    /// carrying any other `Origin` than the node's own (`http://` + its allowed `Host`) is
    /// refused with 403. `*` allows every origin.
    pub allowed_origins: Vec<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            token: None,
            body_bytes_max: 8 * 1024 * 1024,
            line_bytes_max: 1024 * 1024,
            header_bytes_max: 16 * 1024,
            concurrency_max: 256,
            watchers_max: 256,
            connections_max: 4096,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            ingest_batch_events: 1000,
            ingest_batch_bytes: 4 * 1024 * 1024,
            ingest_backpressure_wait_ms: 5_000,
            retry_after_secs: 1,
            shutdown_grace_ms: 30_000,
            access_log: true,
            inflight_bytes_max: 64 * 1024 * 1024,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

impl HttpConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// A message naming the offending key (`http.<name>`).
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("body_bytes_max", self.body_bytes_max),
            ("line_bytes_max", self.line_bytes_max),
            ("header_bytes_max", self.header_bytes_max),
            ("concurrency_max", self.concurrency_max),
            ("watchers_max", self.watchers_max),
            ("connections_max", self.connections_max),
            ("ingest_batch_events", self.ingest_batch_events),
            ("ingest_batch_bytes", self.ingest_batch_bytes),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("http.{name} must be positive"));
        }
        if self.header_read_timeout_ms == 0 || self.body_read_timeout_ms == 0 {
            return Err("http timeouts must be positive".into());
        }
        if self.inflight_bytes_max < self.body_bytes_max.max(self.line_bytes_max)
            || u32::try_from(self.inflight_bytes_max).is_err()
        {
            return Err(format!(
                "http.inflight_bytes_max must be at least http.body_bytes_max ({}) and \
                 http.line_bytes_max ({}), and below 4 GiB",
                self.body_bytes_max, self.line_bytes_max
            ));
        }
        if let Some(h) = self.allowed_hosts.iter().find(|h| h.trim().is_empty()) {
            return Err(format!("http.allowed_hosts holds an empty name ({h:?})"));
        }
        if let Some(o) = self
            .allowed_origins
            .iter()
            .find(|o| *o != "*" && !(o.starts_with("http://") || o.starts_with("https://")))
        {
            return Err(format!(
                "http.allowed_origins entries are `scheme://host[:port]` or `*` (got {o:?})"
            ));
        }
        if self.token.as_deref().is_some_and(str::is_empty) {
            return Err("http.token must not be empty (remove it to disable auth)".into());
        }
        Ok(())
    }
}

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The configuration is invalid.
    #[error("invalid http configuration: {0}")]
    Config(String),
    /// The listen address could not be bound (the cause is the error's source).
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Facts about the cluster the HTTP layer reports (`GET /v1/cluster`) beyond what the node
/// knows; the peer network fills it in.
pub trait ClusterView: Send + Sync + 'static {
    /// Members with their state, listed in `GET /v1/cluster`'s `members` after the ones the
    /// node knows itself (empty for a single node).
    fn members(&self) -> Vec<crate::api::ClusterMember>;
    /// True once the node may serve reads (after the first sync in a cluster).
    fn ready(&self) -> bool {
        true
    }
}

/// The single-node view: no members besides this node, always ready.
#[derive(Debug, Default)]
pub struct SingleNode;

impl ClusterView for SingleNode {
    fn members(&self) -> Vec<crate::api::ClusterMember> {
        Vec::new()
    }
}

/// Shared state of the handlers: one `Arc`, so the clones every request makes (one per
/// middleware layer and per `State` extractor) cost one atomic increment each rather than one
/// per field (≈ 17; `perf` put the clones and drops at ≈ 5 µs of CPU per request).
#[derive(Clone)]
pub(crate) struct AppState(Arc<AppShared>);

impl std::ops::Deref for AppState {
    type Target = AppShared;

    fn deref(&self) -> &AppShared {
        &self.0
    }
}

/// What [`AppState`] shares.
pub(crate) struct AppShared {
    pub(crate) node: Node,
    pub(crate) config: Arc<HttpConfig>,
    pub(crate) requests: Arc<Semaphore>,
    pub(crate) watchers: Arc<Semaphore>,
    pub(crate) metrics: metrics::HttpMetrics,
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
    pub(crate) cluster: Arc<dyn ClusterView>,
    pub(crate) listen: SocketAddr,
    /// One snapshot at a time (`GET /v1/snapshot`).
    pub(crate) snapshots: Arc<Semaphore>,
    /// Bytes of request bodies held at once (`http.inflight_bytes_max`).
    pub(crate) body_budget: body::BodyBudget,
}

/// A bound HTTP server, not yet accepting.
pub struct HttpServer {
    listener: TcpListener,
    router: Router,
    config: Arc<HttpConfig>,
    shutdown_tx: tokio::sync::watch::Sender<bool>,
    metrics: metrics::HttpMetrics,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("listen", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl HttpServer {
    /// Binds `config.listen` for `node` (single-node cluster view).
    ///
    /// # Errors
    /// [`HttpError::Config`] for invalid settings; [`HttpError::Bind`].
    pub async fn bind(node: Node, config: HttpConfig) -> Result<Self, HttpError> {
        Self::bind_with(node, config, Arc::new(SingleNode)).await
    }

    /// Binds `config.listen` for `node`, reporting the cluster through `cluster`.
    ///
    /// # Errors
    /// As [`HttpServer::bind`].
    pub async fn bind_with(
        node: Node,
        config: HttpConfig,
        cluster: Arc<dyn ClusterView>,
    ) -> Result<Self, HttpError> {
        config.validate().map_err(HttpError::Config)?;
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| HttpError::Bind {
                    addr: config.listen,
                    source,
                })?;
        Self::on_listener(node, config, listener, cluster)
    }

    /// Serves `node` on `listener`, already bound (so a daemon can find its port taken before
    /// it creates or restores a data directory); `config.listen` is not used.
    ///
    /// # Errors
    /// [`HttpError::Config`] for invalid settings; [`HttpError::Bind`] when the listener's
    /// address cannot be read.
    pub fn on_listener(
        node: Node,
        config: HttpConfig,
        listener: TcpListener,
        cluster: Arc<dyn ClusterView>,
    ) -> Result<Self, HttpError> {
        config.validate().map_err(HttpError::Config)?;
        let listen = listener.local_addr().map_err(|source| HttpError::Bind {
            addr: config.listen,
            source,
        })?;
        if !listen.ip().is_loopback() && config.token.is_none() {
            tracing::warn!(
                %listen,
                "HTTP is bound to a non-loopback address without a token: anyone who can reach it can read and write; set http.token"
            );
        }
        // Temporary snapshot files a crashed process left (none can be in use yet).
        crate::store::remove_stream_leftovers(&node.config().data_dir);
        let (shutdown_tx, shutdown) = tokio::sync::watch::channel(false);
        let config = Arc::new(config);
        let metrics = metrics::HttpMetrics::default();
        let state = AppState(Arc::new(AppShared {
            node,
            requests: Arc::new(Semaphore::new(config.concurrency_max)),
            watchers: Arc::new(Semaphore::new(config.watchers_max)),
            config: Arc::clone(&config),
            metrics: metrics.clone(),
            shutdown,
            cluster,
            listen,
            snapshots: Arc::new(Semaphore::new(1)),
            body_budget: Arc::new(Semaphore::new(config.inflight_bytes_max)),
        }));
        Ok(Self {
            listener,
            router: routes::router(state),
            config,
            shutdown_tx,
            metrics,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| self.config.listen)
    }

    /// Serves until `shutdown` completes, then stops accepting, ends watch streams, and waits
    /// (up to `shutdown_grace_ms`) for in-flight requests to finish. The node stays open: the
    /// caller shuts it down after this returns, so everything acknowledged is durable.
    ///
    /// # Errors
    /// None at present (accept errors are logged and retried).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), HttpError> {
        let HttpServer {
            listener,
            router,
            config,
            shutdown_tx,
            metrics,
        } = self;
        let graceful = GracefulShutdown::new();
        let connections = Arc::new(Semaphore::new(config.connections_max));
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(config.header_read_timeout_ms))
            .max_buf_size((config.header_bytes_max * 4).max(8192))
            .max_header_size(config.header_bytes_max * 4)
            .keep_alive(true);
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                metrics.connections_refused.inc();
                tracing::debug!(%peer, "connection limit reached; closing");
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let service = TowerToHyperService::new(router.clone());
            let conn = http.serve_connection(TokioIo::new(stream), service);
            let conn = graceful.watch(conn);
            metrics.connections_open.inc();
            let open = metrics.connections_open.clone();
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
                open.dec();
                drop(permit);
            });
        }
        drop(listener);
        tracing::info!("HTTP: stopped accepting; finishing in-flight requests");
        let _ = shutdown_tx.send(true);
        let grace = Duration::from_millis(config.shutdown_grace_ms);
        if tokio::time::timeout(grace, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "HTTP: in-flight requests still running after the grace period; dropping them"
            );
        }
        Ok(())
    }
}
