//! The client commands: one HTTP request each against `--url` (blocking, ureq).

use super::output::{Output, print_table, time_text, value_text};
use anyhow::{Context, bail};
use serde_json::{Value as J, json};
use std::io::BufRead;
use std::time::Duration;

/// `TYPE/NAME` as given on the command line.
#[derive(Clone, Debug)]
pub struct KeyArg {
    /// The key type.
    pub kind: String,
    /// The key name.
    pub name: String,
}

const KINDS: [&str; 5] = ["gcounter", "pncounter", "orset", "lww", "mvreg"];

/// Parses `TYPE/NAME` (a usage error, exit 2, when malformed).
pub fn parse_key(s: &str) -> Result<KeyArg, String> {
    let (kind, name) = s
        .split_once('/')
        .ok_or_else(|| format!("expected TYPE/NAME (e.g. orset/online), got {s:?}"))?;
    if !KINDS.contains(&kind) {
        return Err(format!(
            "unknown type {kind:?}: one of {}",
            KINDS.join(", ")
        ));
    }
    if name.is_empty() {
        return Err("the key name is empty".into());
    }
    Ok(KeyArg {
        kind: kind.to_owned(),
        name: name.to_owned(),
    })
}

/// The node's default HTTP port: what `--url` means when it names none (`--url localhost`).
pub const DEFAULT_HTTP_PORT: u16 = 7700;

/// Parses `--url`: `http://HOST[:PORT][/base]`, or `HOST[:PORT]` (`localhost:7700`,
/// `10.0.0.5`) taken as `http://HOST:PORT`; without a port, the node's default
/// [`DEFAULT_HTTP_PORT`] (not HTTP's 80). A usage error (exit 2) otherwise.
pub fn parse_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    let url = if text.contains("://") {
        text.to_owned()
    } else {
        format!("http://{text}")
    };
    let hint = "expected http://HOST:PORT or HOST:PORT, e.g. localhost:7700";
    let uri: ureq::http::Uri = url
        .parse()
        .map_err(|e| format!("{text:?} is not a URL ({e}); {hint}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "{text:?}: the node's API is plain HTTP, not {other}://; {hint}"
            ));
        }
        None => return Err(format!("{text:?} has no host; {hint}")),
    }
    let Some(host) = uri.host().filter(|h| !h.is_empty()) else {
        return Err(format!("{text:?} has no host; {hint}"));
    };
    // A port given must be one (`:99999`, `:abc` or a bare `:` is no port, never the default).
    let authority = uri.authority().map_or("", |a| a.as_str());
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, r)| r);
    let after_host = match host_port.split_once(']') {
        Some((_, rest)) => rest,
        None => host_port,
    };
    if let Some((_, port)) = after_host.rsplit_once(':') {
        return match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok(url),
            _ => Err(format!(
                "{text:?}: {port:?} is not a port (1-65535); {hint}"
            )),
        };
    }
    if uri.port().is_some() {
        return Ok(url);
    }
    // No port: the node's, so `--url localhost` is the node on this machine.
    let path = uri.path_and_query().map_or("", |p| p.as_str());
    let path = if path == "/" && !url.ends_with('/') {
        ""
    } else {
        path
    };
    Ok(format!("http://{host}:{DEFAULT_HTTP_PORT}{path}"))
}

/// A request the server answered with an error (exit status 1; 2 for a refused argument,
/// [`Rejected::is_usage`]).
#[derive(Debug)]
pub struct Rejected {
    /// HTTP status.
    pub status: u16,
    /// The error body (`{"error":{...}}`, perhaps with more fields).
    pub body: J,
}

impl Rejected {
    fn field(&self, name: &str) -> Option<&str> {
        self.body.get("error")?.get(name)?.as_str()
    }
    /// The `at` of the error body.
    pub fn at(&self) -> Option<&str> {
        self.field("at")
    }
    /// The `Retry-After`-style hint: 429 answers.
    pub fn is_busy(&self) -> bool {
        self.status == 429
    }
    /// The server refused an argument of the command line (a query parameter or a cursor the
    /// CLI passed as given): a usage error, exit status 2.
    pub fn is_usage(&self) -> bool {
        self.status == 400
            && matches!(
                self.field("code"),
                Some("invalid_query" | "invalid_cursor" | "invalid_key" | "invalid_path")
            )
    }
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let code = self.field("code").unwrap_or("error");
        let message = self.field("message").unwrap_or("");
        write!(f, "{} {code}: {message}", self.status)?;
        if let Some(at) = self.at() {
            write!(f, " (at {at})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Rejected {}

/// An HTTP client of one node.
pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

/// What a request returned: a JSON body, or a rejection.
pub type Answer = Result<J, Rejected>;

impl Client {
    /// A client of the node at `url`.
    pub fn new(url: &str, token: Option<String>) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .build()
            .into();
        Self {
            agent,
            base: url.trim_end_matches('/').to_owned(),
            token,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", format!("Bearer {t}")),
            None => req,
        }
    }

    fn finish(
        &self,
        resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<(Answer, Option<u64>)> {
        let mut resp = resp.with_context(|| format!("cannot reach the node at {}", self.base))?;
        let status = resp.status().as_u16();
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_string()
            .context("reading the answer")?;
        let body: J = serde_json::from_str(&text).unwrap_or(J::String(text));
        if (200..300).contains(&status) {
            Ok((Ok(body), retry))
        } else {
            Ok((Err(Rejected { status, body }), retry))
        }
    }

    /// `GET path` with query pairs.
    pub fn get(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Answer> {
        let mut req = self.auth(self.agent.get(self.url(path)));
        for (k, v) in query {
            req = req.query(*k, v);
        }
        Ok(self.finish(req.call())?.0)
    }

    /// `POST path` with a JSON or NDJSON body; also returns `Retry-After`.
    pub fn post(
        &self,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> anyhow::Result<(Answer, Option<u64>)> {
        let req = self
            .auth(self.agent.post(self.url(path)))
            .content_type(content_type);
        self.finish(req.send(body))
    }

    /// `GET path` with its body copied into `sink`; `progress(bytes so far, Content-Length)`
    /// after every chunk. Returns the bytes copied and the answer's headers, or the rejection.
    pub fn download(
        &self,
        path: &str,
        sink: &mut impl std::io::Write,
        mut progress: impl FnMut(u64, Option<u64>),
    ) -> anyhow::Result<Result<(u64, ureq::http::HeaderMap), Rejected>> {
        let resp = self
            .auth(self.agent.get(self.url(path)))
            .call()
            .with_context(|| format!("cannot reach the node at {}", self.base))?;
        if !resp.status().is_success() {
            let (answer, _) = self.finish(Ok(resp))?;
            return Ok(Err(answer.err().unwrap_or(Rejected {
                status: 0,
                body: J::Null,
            })));
        }
        let headers = resp.headers().clone();
        let total = headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let mut reader = resp.into_body().into_reader();
        let mut buf = vec![0u8; 256 * 1024];
        let mut copied = 0u64;
        loop {
            let n = std::io::Read::read(&mut reader, &mut buf)
                .with_context(|| format!("reading {path} from {}", self.base))?;
            if n == 0 {
                break;
            }
            sink.write_all(buf.get(..n).unwrap_or_default())
                .context("writing what was received")?;
            copied += n as u64;
            progress(copied, total);
        }
        if let Some(t) = total
            && t != copied
        {
            bail!("the node sent {copied} of {t} bytes of {path}: the connection was cut");
        }
        Ok(Ok((copied, headers)))
    }

    /// `GET path` as a stream of lines (server-sent events).
    pub fn stream_lines(
        &self,
        path: &str,
        query: &[(&str, String)],
        mut on_line: impl FnMut(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut req = self.auth(self.agent.get(self.url(path)));
        for (k, v) in query {
            req = req.query(*k, v);
        }
        let resp = req
            .call()
            .with_context(|| format!("cannot reach the node at {}", self.base))?;
        if !resp.status().is_success() {
            let (answer, _) = self.finish(Ok(resp))?;
            return Err(answer
                .err()
                .map_or_else(|| anyhow::anyhow!("unexpected answer"), anyhow::Error::new));
        }
        let reader = std::io::BufReader::new(resp.into_body().into_reader());
        for line in reader.lines() {
            on_line(&line.context("reading the watch stream")?)?;
        }
        Ok(())
    }
}

/// Turns a rejection into the command's error (exit status 1, message on stderr).
pub fn accept(answer: Answer) -> anyhow::Result<J> {
    answer.map_err(anyhow::Error::new)
}

/// Percent-encodes every byte of `text` but `A-Z a-z 0-9 - . _ ~` (one URL path segment).
pub(crate) fn encode_segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn key_path(key: &KeyArg) -> String {
    format!("/v1/keys/{}/{}", key.kind, encode_segment(&key.name))
}

/// A set element from the command line: a JSON number or string as written, else the text.
pub fn element(text: &str) -> J {
    match serde_json::from_str::<J>(text) {
        Ok(v @ (J::Number(_) | J::String(_) | J::Bool(_))) => v,
        _ => J::String(text.to_owned()),
    }
}

/// Sends ops and prints what was applied.
pub fn write_ops(client: &Client, out: &Output, ops: &[J]) -> anyhow::Result<()> {
    let body = serde_json::to_vec(ops)?;
    let (answer, _) = client.post("/v1/ops", "application/json", &body)?;
    let body = accept(answer)?;
    if out.json {
        crate::outln!("{body}")?;
    } else {
        crate::outln!(
            "applied {} (duplicates {})",
            body["applied"],
            body["duplicates"]
        )?;
    }
    Ok(())
}

/// `tidemark inc`/`dec`.
pub fn counter_op(key: &KeyArg, op: &str, by: i64) -> anyhow::Result<J> {
    if !matches!(key.kind.as_str(), "gcounter" | "pncounter") {
        return Err(crate::Usage(format!(
            "{op} applies to gcounter or pncounter keys, not {} (e.g. {op} gcounter/{})",
            key.kind, key.name
        ))
        .into());
    }
    let (op, by) = if by < 0 {
        (if op == "inc" { "dec" } else { "inc" }, by.unsigned_abs())
    } else {
        (op, by.unsigned_abs())
    };
    Ok(json!({"type": key.kind, "key": key.name, "op": op, "by": by}))
}

/// `tidemark get`.
pub fn get(client: &Client, out: &Output, key: &KeyArg) -> anyhow::Result<()> {
    let body = accept(client.get(&key_path(key), &[])?)?;
    if out.json {
        crate::outln!("{body}")?;
    } else {
        print_table(
            &["TYPE", "KEY", "VALUE"],
            &[vec![
                key.kind.clone(),
                key.name.clone(),
                value_text(&body["value"]),
            ]],
        )?;
    }
    Ok(())
}

/// `text` as one word for a POSIX shell: as is when it holds only characters no shell treats
/// specially, else in single quotes (a `'` inside written `'\''`).
fn shell_quoted(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// `tidemark list`.
pub fn list(
    client: &Client,
    out: &Output,
    kind: Option<&str>,
    prefix: &str,
    limit: usize,
    after: Option<&str>,
    internal: bool,
) -> anyhow::Result<()> {
    let mut q = vec![("prefix", prefix.to_owned()), ("limit", limit.to_string())];
    if internal {
        q.push(("internal", "true".to_owned()));
    }
    if let Some(k) = kind {
        q.push(("type", k.to_owned()));
    }
    if let Some(a) = after {
        q.push(("after", a.to_owned()));
    }
    let body = accept(client.get("/v1/keys", &q)?)?;
    if out.json {
        crate::outln!("{body}")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = body["keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .map(|k| {
                    vec![
                        k["type"].as_str().unwrap_or_default().to_owned(),
                        k["key"].as_str().unwrap_or_default().to_owned(),
                        value_text(&k["value"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    print_table(&["TYPE", "KEY", "VALUE"], &rows)?;
    if let Some(next) = body["next"].as_str() {
        crate::outln!("(more: --after {})", shell_quoted(next))?;
    }
    Ok(())
}

/// What `tidemark watch` was asked.
pub struct WatchArgs<'a> {
    /// Only this type.
    pub kind: Option<&'a str>,
    /// Only names starting with this.
    pub prefix: &'a str,
    /// Resume after this cursor.
    pub from: Option<&'a str>,
    /// Current values first.
    pub snapshot: bool,
}

/// `tidemark watch`: prints every change until the stream ends, each with its cursor (the
/// last column in a table line, `cursor` in JSON), so a script can resume with `--from`.
pub fn watch(client: &Client, out: &Output, args: &WatchArgs<'_>) -> anyhow::Result<()> {
    let mut q = vec![("prefix", args.prefix.to_owned())];
    if let Some(k) = args.kind {
        q.push(("type", k.to_owned()));
    }
    if let Some(c) = args.from {
        q.push(("after", c.to_owned()));
    }
    if args.snapshot {
        q.push(("snapshot", "true".to_owned()));
    }
    let mut event = String::new();
    let mut id = String::new();
    client.stream_lines("/v1/watch", &q, |line| {
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("id:") {
            v.trim().clone_into(&mut id);
        } else if let Some(data) = line.strip_prefix("data:") {
            let mut data: J = serde_json::from_str(data.trim()).unwrap_or(J::Null);
            match event.as_str() {
                "reset" => eprintln!(
                    "watch: reset ({}): {}; resume cursor {}",
                    data["reason"].as_str().unwrap_or("?"),
                    data["hint"].as_str().unwrap_or_default(),
                    data["cursor"].as_str().unwrap_or_default(),
                ),
                "snapshot_end" => eprintln!(
                    "watch: snapshot done at cursor {}; changes follow",
                    data["cursor"].as_str().unwrap_or_default()
                ),
                _ if out.json => {
                    if event == "change" {
                        data["cursor"] = J::String(id.clone());
                    }
                    data["event"] = J::String(event.clone());
                    crate::outln!("{data}")?;
                }
                _ => {
                    let value = if data["value_omitted"].as_bool() == Some(true) {
                        format!("({} bytes: tidemark get it)", data["value_bytes"])
                    } else {
                        value_text(&data["value"])
                    };
                    let at = if event == "change" {
                        format!("  [{id}]")
                    } else {
                        String::new()
                    };
                    crate::outln!(
                        "{}/{} = {value}{at}",
                        data["type"].as_str().unwrap_or_default(),
                        data["key"].as_str().unwrap_or_default(),
                    )?;
                }
            }
        }
        Ok(())
    })
}

/// `tidemark tail VIEW --final`: prints each final window once as it becomes final (`GROUP
/// START END VALUE CURSOR`, or the JSON object with `--json`), so a script can resume with
/// `--from` the last cursor.
pub fn tail_final(
    client: &Client,
    out: &Output,
    view: &str,
    from: Option<&str>,
    follow: bool,
) -> anyhow::Result<()> {
    let mut q = vec![("follow", follow.to_string())];
    if let Some(c) = from {
        q.push(("after", c.to_owned()));
    }
    let path = format!("/v1/views/{}/final", encode_segment(view));
    let mut event = String::new();
    client.stream_lines(&path, &q, |line| {
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if let Some(data) = line.strip_prefix("data:") {
            let data: J = serde_json::from_str(data.trim()).unwrap_or(J::Null);
            match event.as_str() {
                "reset" => eprintln!(
                    "tail: reset: {}; going on after {}",
                    data["hint"].as_str().unwrap_or_default(),
                    data["cursor"]
                ),
                _ if out.json => crate::outln!("{data}")?,
                _ => {
                    let group = data["group"]
                        .as_object()
                        .map(|g| {
                            g.iter()
                                .map(|(k, v)| format!("{k}={}", value_text(v)))
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .filter(|g| !g.is_empty())
                        .unwrap_or_else(|| "-".into());
                    crate::outln!(
                        "{group}  {}  {}  {}  {}",
                        time_text(&data["window_start"]),
                        time_text(&data["window_end"]),
                        value_text(&data["value"]),
                        data["cursor"].as_str().unwrap_or_default()
                    )?;
                }
            }
        }
        Ok(())
    })
}

/// `tidemark status`.
pub fn status(client: &Client, out: &Output) -> anyhow::Result<()> {
    let cluster = accept(client.get("/v1/cluster", &[])?)?;
    let ready = client.get("/readyz", &[])?.is_ok();
    if out.json {
        crate::outln!("{}", json!({"ready": ready, "cluster": cluster}))?;
        return Ok(());
    }
    let n = &cluster["node"];
    print_table(
        &[
            "NODE", "VERSION", "HTTP", "PEERS ON", "EPOCH", "LOG", "READY",
        ],
        &[vec![
            n["name"]
                .as_str()
                .or_else(|| n["replica"].as_str())
                .unwrap_or_default()
                .to_owned(),
            n["version"].as_str().unwrap_or("-").to_owned(),
            n["http"].as_str().unwrap_or_default().to_owned(),
            n["peer_listen"].as_str().unwrap_or("-").to_owned(),
            n["epoch"].to_string(),
            format!("{}..{}", n["log"]["start"], n["log"]["end"]),
            ready.to_string(),
        ]],
    )?;
    if n["decommissioned"] == true {
        crate::outln!(
            "this node was removed from the cluster for good (decommissioned): it applies no \
             event to a window and is not ready; start it on a new data directory to rejoin"
        )?;
    }
    // Every member SWIM knows, down ones included, with what replication knows of it.
    let members = cluster["members"].as_array().cloned().unwrap_or_default();
    crate::outln!()?;
    print_members(&members)?;
    // Replication peers no member name is known for (an in-process link, a member being
    // forgotten).
    let named = |p: &serde_json::Value| {
        members
            .iter()
            .any(|m| m["name"].is_string() && m["name"] == p["name"])
    };
    let peers: Vec<serde_json::Value> = cluster["peers"]
        .as_array()
        .map(|p| p.iter().filter(|p| !named(p)).cloned().collect())
        .unwrap_or_default();
    if !peers.is_empty() {
        crate::outln!()?;
        let rows: Vec<Vec<String>> = peers
            .iter()
            .map(|p| {
                vec![
                    p["name"]
                        .as_str()
                        .or_else(|| p["peer"].as_str())
                        .unwrap_or_default()
                        .to_owned(),
                    p["connected"].to_string(),
                    p["lag_entries"]
                        .as_u64()
                        .map_or_else(|| "-".to_owned(), |l| l.to_string()),
                    lag_bytes_text(p),
                ]
            })
            .collect();
        print_table(
            &["PEER", "CONNECTED", "LAG (ENTRIES)", "LAG (BYTES)"],
            &rows,
        )?;
    }
    Ok(())
}

/// `tidemark view`: the rows of one page (table: one line per group and window, times in
/// RFC 3339 UTC; `--json`: the server's answer as is), then the watermarks and counters.
pub fn view(
    client: &Client,
    out: &Output,
    name: &str,
    query: &[(&str, String)],
) -> anyhow::Result<()> {
    let path = format!("/v1/views/{}", encode_segment(name));
    let body = accept(client.get(&path, query)?)?;
    if out.json {
        crate::outln!("{body}")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = body["rows"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    let group = r["group"]
                        .as_object()
                        .map(|g| {
                            g.iter()
                                .map(|(k, v)| format!("{k}={}", value_text(v)))
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default();
                    vec![
                        if group.is_empty() { "-".into() } else { group },
                        time_text(&r["window_start"]),
                        time_text(&r["window_end"]),
                        value_text(&r["final"]),
                        value_text(&r["value"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    print_table(
        &["GROUP", "WINDOW START", "WINDOW END", "FINAL", "VALUE"],
        &rows,
    )?;
    let c = &body["counters"];
    crate::outln!(
        "watermark {}  cluster watermark {}  folded {} late {} rejected {}",
        time_text(&body["watermark"]),
        time_text(&body["cluster_watermark"]),
        c["folded"],
        c["late"],
        c["rejected"],
    )?;
    if let Some(next) = body["next"].as_str() {
        crate::outln!("more rows: --after {}", shell_quoted(next))?;
    }
    Ok(())
}

/// A member's or peer's `lag_bytes` for a table: the number, `≥N` when it is a lower bound
/// (`lag_bytes_exact` false), `-` when unknown.
fn lag_bytes_text(m: &serde_json::Value) -> String {
    match (m["lag_bytes"].as_u64(), m["lag_bytes_exact"].as_bool()) {
        (Some(b), Some(false)) => format!("≥{b}"),
        (Some(b), _) => b.to_string(),
        (None, _) => "-".to_owned(),
    }
}

/// Prints every member SWIM knows (down ones included) with its state, version, address, lag in
/// entries, bytes and seconds and last contact; a node without other members says so.
fn print_members(members: &[serde_json::Value]) -> anyhow::Result<()> {
    if members.is_empty() {
        crate::outln!("single node: no other members known")?;
    } else {
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::Null => "-".to_owned(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let rows: Vec<Vec<String>> = members
            .iter()
            .map(|m| {
                vec![
                    text(&m["name"]),
                    text(&m["state"]),
                    text(&m["version"]),
                    text(&m["addr"]),
                    m["connected"].as_bool().unwrap_or(false).to_string(),
                    text(&m["lag_entries"]),
                    lag_bytes_text(m),
                    m["lag_seconds"]
                        .as_f64()
                        .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}")),
                    m["last_contact"]
                        .as_f64()
                        .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}s ago")),
                ]
            })
            .collect();
        print_table(
            &[
                "MEMBER",
                "STATE",
                "VERSION",
                "PEER ADDR",
                "CONNECTED",
                "LAG (ENTRIES)",
                "LAG (BYTES)",
                "LAG (S)",
                "LAST CONTACT",
            ],
            &rows,
        )?;
    }
    Ok(())
}

/// `tidemark members`: the members table of `status` alone (`--json`: `/v1/cluster`'s
/// `members` as is).
///
/// # Errors
/// Transport failures and error answers.
pub fn members(client: &Client, out: &Output) -> anyhow::Result<()> {
    let cluster = accept(client.get("/v1/cluster", &[])?)?;
    let members = cluster["members"].as_array().cloned().unwrap_or_default();
    if out.json {
        crate::outln!("{}", serde_json::Value::Array(members))?;
        return Ok(());
    }
    print_members(&members)?;
    Ok(())
}

/// `tidemark members remove NAME`: decommissions the member for good.
pub fn remove_member(client: &Client, out: &Output, name: &str, force: bool) -> anyhow::Result<()> {
    let mut path = format!("/v1/cluster/members/{}/remove", encode_segment(name));
    if force {
        path.push_str("?force=true");
    }
    let (answer, _) = client.post(&path, "application/json", b"{}")?;
    let done = match answer {
        // The server's hint names its query parameter; the CLI's is a flag.
        Err(r) if r.status == 409 => {
            anyhow::bail!(
                "409 member_alive: {name} is still answering: decommission a member only when \
                 it is gone for good (add --force to remove it anyway)"
            )
        }
        other => accept(other)?,
    };
    if out.json {
        crate::outln!("{done}")?;
    } else {
        let replica = done["removed"].as_str().unwrap_or("?");
        // The member's name as the record keeps it (it was given by replica id, say).
        let name = done["name"].as_str().unwrap_or(name);
        if done["already"] == true {
            crate::outln!("{name} (replica {replica}) was already removed: nothing written")?;
        } else {
            crate::outln!("removed {name} (replica {replica}) for good")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod shell_quoting_tests {
    use super::shell_quoted;

    #[test]
    fn cursors_are_printed_as_one_shell_word() {
        assert_eq!(shell_quoted("gcounter/visits"), "gcounter/visits");
        assert_eq!(shell_quoted(r#"["/docs"]"#), r#"'["/docs"]'"#);
        assert_eq!(shell_quoted("it's $HOME"), r"'it'\''s $HOME'");
        assert_eq!(shell_quoted(""), "''");
        // What a POSIX shell makes of the quoted word is the cursor again.
        for cursor in [r#"~view/v/[1,"a b"]"#, "x'y\"z`$(id)`", "é ü"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_quoted(cursor)))
                .output()
                .expect("sh");
            assert_eq!(String::from_utf8_lossy(&out.stdout), cursor);
        }
    }
}

#[cfg(test)]
mod url_tests {
    use super::parse_url;

    #[test]
    fn a_port_given_must_be_a_port() {
        assert_eq!(
            parse_url("localhost").as_deref(),
            Ok("http://localhost:7700")
        );
        assert_eq!(
            parse_url("localhost:7701").as_deref(),
            Ok("http://localhost:7701")
        );
        assert_eq!(
            parse_url("http://[::1]:8080").as_deref(),
            Ok("http://[::1]:8080")
        );
        assert_eq!(parse_url("[::1]").as_deref(), Ok("http://[::1]:7700"));
        for bad in [
            "127.0.0.1:99999",
            "localhost:65536",
            "http://127.0.0.1:99999",
            "127.0.0.1:abc",
            "127.0.0.1:",
            "127.0.0.1:0",
        ] {
            let e = parse_url(bad).expect_err(bad);
            assert!(e.contains("not a port"), "{bad}: {e}");
        }
    }
}
