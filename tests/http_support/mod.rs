//! Helpers of the HTTP tests: a node + HTTP server running in-process on a loopback port, and
//! a small blocking client (ureq) that returns status, headers and JSON.
#![allow(dead_code)]

use serde_json::Value as J;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tidemark::http::{HttpConfig, HttpServer};
use tidemark::{Node, NodeConfig};

/// A served node; shut down (HTTP drained, node closed) on drop.
pub struct Served {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The node (for direct checks).
    pub node: Node,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Served {
    /// Starts a node with default settings, HTTP on a free loopback port.
    pub fn start() -> Self {
        Self::start_with(|_, _| {})
    }

    /// Starts a node after `tune` adjusted its node and HTTP settings.
    pub fn start_with(tune: impl FnOnce(&mut NodeConfig, &mut HttpConfig)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut node_config = NodeConfig::new(dir.path());
        let mut http = HttpConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..HttpConfig::default()
        };
        tune(&mut node_config, &mut http);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let node = Node::open(node_config).await.expect("open node");
                let server = HttpServer::bind(node.clone(), http).await.expect("bind");
                ready_tx
                    .send((server.local_addr(), node.clone()))
                    .expect("ready");
                server
                    .run(async {
                        let _ = stop_rx.await;
                    })
                    .await
                    .expect("serve");
                node.shutdown().await.expect("shutdown");
            });
        });
        let (addr, node) = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("server start");
        Self {
            addr,
            node,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// `http://addr`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the server and the node, waiting for both.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Signals the server to stop (stop accepting, finish in-flight requests) without waiting.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits until the server thread has drained and closed the node.
    pub fn wait_stopped(&mut self) {
        self.shutdown();
    }

    /// The node's data directory.
    pub fn data_dir(&self) -> std::path::PathBuf {
        self._dir.path().to_path_buf()
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread");
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// An answer: status, `Retry-After` and the JSON body (`Null` when not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub content_type: String,
    pub json: J,
    pub text: String,
}

impl Answer {
    /// `error.code` of an error body.
    pub fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("")
    }
    /// `error.at` of an error body.
    pub fn at(&self) -> &str {
        self.json["error"]["at"].as_str().unwrap_or("")
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

fn answer(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut resp = resp.expect("request");
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let retry_after = header("retry-after");
    let content_type = header("content-type").unwrap_or_default();
    let text = resp
        .body_mut()
        .with_config()
        .limit(256 * 1024 * 1024)
        .read_to_string()
        .expect("body");
    let json = serde_json::from_str(&text).unwrap_or(J::Null);
    Answer {
        status,
        retry_after,
        content_type,
        json,
        text,
    }
}

/// `GET url` with an optional bearer token.
pub fn get_auth(url: &str, token: Option<&str>) -> Answer {
    let mut req = agent().get(url);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    answer(req.call())
}

/// Waits (up to 20 s) until `n` requests hold one of the server's request slots, read from
/// `/metrics` (which takes none: polling with a request that takes a slot could make the
/// awaited request's own slot attempt fail).
pub fn await_in_flight(s: &Served, n: u64) {
    let want = format!("tidemark_http_requests_in_flight {n}\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = get(&s.url("/metrics"));
        if m.text.contains(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never {n} requests in flight: {}",
            m.text
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `GET url`.
pub fn get(url: &str) -> Answer {
    get_auth(url, None)
}

/// `POST url` with `body`.
pub fn post(url: &str, body: impl AsRef<[u8]>) -> Answer {
    post_auth(url, body, None)
}

/// `POST url` with `body` and an optional bearer token.
pub fn post_auth(url: &str, body: impl AsRef<[u8]>, token: Option<&str>) -> Answer {
    let mut req = agent().post(url).content_type("application/json");
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    answer(req.send(body.as_ref()))
}

/// The JSON value of `type/name`.
pub fn value(s: &Served, kind: &str, name: &str) -> J {
    let a = get(&s.url(&format!("/v1/keys/{kind}/{name}")));
    assert_eq!(a.status, 200, "{a:?}");
    a.json["value"].clone()
}

/// Resident memory of this process in bytes (Linux).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Asserts the node holds nothing for `type/name`: 404 `key_not_found`.
pub fn missing(s: &Served, kind: &str, name: &str) {
    let a = get(&s.url(&format!("/v1/keys/{kind}/{name}")));
    assert_eq!((a.status, a.code()), (404, "key_not_found"), "{a:?}");
}

/// `METHOD url` with extra request headers; the answer and its response headers.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> (Answer, ureq::http::HeaderMap) {
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(()).expect("request");
    let resp = agent().run(req).expect("request");
    let headers = resp.headers().clone();
    (answer(Ok(resp)), headers)
}

/// Sends `request` (a whole HTTP/1.1 request; `Connection: close` is added to its headers) over
/// a fresh connection and returns the status and the body as JSON (`Null` when not JSON).
pub fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, J) {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let head = head.trim_end_matches("\r\n");
    let req = format!(
        "{head}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(req.as_bytes()).expect("send head");
    sock.write_all(body).expect("send body");
    let mut out = Vec::new();
    let _ = sock.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(J::Null))
}
