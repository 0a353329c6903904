//! The client commands: one HTTP request each against `--url` (blocking, ureq). Every reply
//! is read as its type of the API contract ([`tidemark::api`], the types the server writes):
//! a reply that does not match is an error naming the endpoint and the field, never a blank
//! cell.

use super::output::{Output, ms_text, opt_ms_text, print_table, value_text};
use anyhow::{Context, bail};
use serde::de::DeserializeOwned;
use serde_json::{Value as J, json};
use std::io::BufRead;
use std::time::Duration;
use tidemark::api;

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
    /// The error body, when it is the API's ([`api::ErrorReply`]).
    pub reply: Option<api::ErrorReply>,
    /// The start of the body when it is not (a proxy's error page, say).
    pub text: String,
}

/// How much of a body that is not the API's error a message quotes.
const FOREIGN_BODY_CHARS: usize = 200;

impl Rejected {
    /// The answer `status` with the body `text`.
    fn new(status: u16, text: &str) -> Self {
        let reply: Option<api::ErrorReply> = serde_json::from_str(text).ok();
        let text = if reply.is_some() {
            String::new()
        } else {
            text.trim().chars().take(FOREIGN_BODY_CHARS).collect()
        };
        Self {
            status,
            reply,
            text,
        }
    }
    /// The error's `code`, when the body is the API's.
    pub fn code(&self) -> Option<&str> {
        self.reply.as_ref().map(|r| r.error.code.as_str())
    }
    /// The error's `at`, when the body is the API's and names one.
    pub fn at(&self) -> Option<&str> {
        self.reply.as_ref()?.error.at.as_deref()
    }
    /// What a streamed ingest committed before the error (its body's `committed`).
    pub fn committed(&self) -> Option<api::IngestCommitted> {
        self.reply.as_ref()?.committed
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
                self.code(),
                Some("invalid_query" | "invalid_cursor" | "invalid_key" | "invalid_path")
            )
    }
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(reply) = &self.reply else {
            return write!(f, "{} error: {}", self.status, self.text);
        };
        write!(
            f,
            "{} {}: {}",
            self.status, reply.error.code, reply.error.message
        )?;
        if let Some(at) = &reply.error.at {
            write!(f, " (at {at})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Rejected {}

/// A reply (or a stream event) that is not what the API contract says `endpoint` answers: the
/// node speaks another version of the API, or something else answered.
#[derive(Debug)]
pub struct Mismatch {
    /// The endpoint (`GET /v1/cluster`, `GET /v1/watch event change`).
    pub endpoint: String,
    /// Where in the reply (`members[0].lag_bytes`; `its top level`).
    pub path: String,
    /// What is wrong there.
    pub problem: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the reply does not match the API of tidemark {} (at {}: {}); is the node at \
             --url another version of tidemark?",
            self.endpoint,
            env!("CARGO_PKG_VERSION"),
            self.path,
            self.problem
        )
    }
}

impl std::error::Error for Mismatch {}

/// `json` read as `T`, the contract type of what `endpoint` answers (see [`Mismatch`]).
pub fn decode<T: DeserializeOwned>(endpoint: &str, json: &J) -> anyhow::Result<T> {
    serde_path_to_error::deserialize(json).map_err(|e| mismatch(endpoint, &e))
}

/// The JSON text `text` read as `T`, the contract type of what `endpoint` sends (see
/// [`Mismatch`]).
pub fn decode_text<T: DeserializeOwned>(endpoint: &str, text: &str) -> anyhow::Result<T> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| mismatch(endpoint, &e))
}

fn mismatch<E: std::fmt::Display>(
    endpoint: &str,
    e: &serde_path_to_error::Error<E>,
) -> anyhow::Error {
    let path = e.path().to_string();
    Mismatch {
        endpoint: endpoint.to_owned(),
        path: if path == "." {
            "its top level".to_owned()
        } else {
            path
        },
        problem: e.inner().to_string(),
    }
    .into()
}

/// A reply read as its contract type, with the JSON as sent (what `--json` prints as is, fields
/// this version does not know included).
pub struct Reply<T> {
    /// The reply as its type.
    pub value: T,
    /// The reply as sent.
    pub json: J,
}

/// A 2xx answer of `endpoint` read as `T` (a rejection is the command's error, as [`accept`]).
pub fn accept_as<T: DeserializeOwned>(endpoint: &str, answer: Answer) -> anyhow::Result<Reply<T>> {
    let json = accept(answer)?;
    let value = decode(endpoint, &json)?;
    Ok(Reply { value, json })
}

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
        if (200..300).contains(&status) {
            // Not JSON: a string, which the reply's type then refuses naming the endpoint.
            let body: J = serde_json::from_str(&text).unwrap_or(J::String(text));
            Ok((Ok(body), retry))
        } else {
            Ok((Err(Rejected::new(status, &text)), retry))
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
            return Ok(Err(answer
                .err()
                .unwrap_or_else(|| Rejected::new(0, "no error body"))));
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
    let reply: Reply<api::OpsReply> = accept_as("POST /v1/ops", answer)?;
    if out.json {
        crate::outln!("{}", reply.json)?;
    } else {
        crate::outln!(
            "applied {} (duplicates {})",
            reply.value.applied,
            reply.value.duplicates
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
    let reply: Reply<api::KeyValue> = accept_as(
        "GET /v1/keys/{type}/{name}",
        client.get(&key_path(key), &[])?,
    )?;
    if out.json {
        crate::outln!("{}", reply.json)?;
    } else {
        let k = &reply.value;
        print_table(
            &["TYPE", "KEY", "VALUE"],
            &[vec![
                k.kind.as_str().to_owned(),
                k.key.clone(),
                value_text(&k.value),
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
    let reply: Reply<api::KeyList> = accept_as("GET /v1/keys", client.get("/v1/keys", &q)?)?;
    if out.json {
        crate::outln!("{}", reply.json)?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = reply
        .value
        .keys
        .iter()
        .map(|k| {
            vec![
                k.kind.as_str().to_owned(),
                k.key.clone(),
                value_text(&k.value),
            ]
        })
        .collect();
    print_table(&["TYPE", "KEY", "VALUE"], &rows)?;
    if let Some(next) = &reply.value.next {
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

/// `value` (a contract type) as a JSON object with `extra` members added, for `--json` lines.
fn with_members(value: &impl serde::Serialize, extra: &[(&str, &str)]) -> anyhow::Result<J> {
    let mut json = serde_json::to_value(value)?;
    if let J::Object(members) = &mut json {
        for (name, text) in extra {
            members.insert((*name).to_owned(), J::String((*text).to_owned()));
        }
    }
    Ok(json)
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
        if line.is_empty() {
            // The end of one event: the next names its own.
            event.clear();
        } else if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("id:") {
            v.trim().clone_into(&mut id);
        } else if let Some(data) = line.strip_prefix("data:") {
            let endpoint = format!("GET /v1/watch event {event}");
            let data = data.trim();
            match event.as_str() {
                "reset" => {
                    let r: api::WatchReset = decode_text(&endpoint, data)?;
                    eprintln!(
                        "watch: reset ({}): {}; resume cursor {}",
                        r.reason, r.hint, r.cursor
                    );
                }
                "snapshot_end" => {
                    let end: api::WatchSnapshotEnd = decode_text(&endpoint, data)?;
                    eprintln!(
                        "watch: snapshot done at cursor {}; changes follow",
                        end.cursor
                    );
                }
                "change" | "snapshot" => {
                    let entry: api::WatchEntry = decode_text(&endpoint, data)?;
                    let change = event == "change";
                    if out.json {
                        let mut extra = vec![("event", event.as_str())];
                        if change {
                            extra.push(("cursor", id.as_str()));
                        }
                        crate::outln!("{}", with_members(&entry, &extra)?)?;
                    } else {
                        let value = match &entry.value {
                            api::WatchValue::Value(v) => value_text(v),
                            api::WatchValue::Omitted { bytes } => {
                                format!("({bytes} bytes: tidemark get it)")
                            }
                        };
                        let at = if change {
                            format!("  [{id}]")
                        } else {
                            String::new()
                        };
                        crate::outln!("{}/{} = {value}{at}", entry.kind.as_str(), entry.key)?;
                    }
                }
                // An event this version does not know: nothing of it to show.
                _ => {}
            }
        }
        Ok(())
    })
}

/// A group as `field=value,...` (`-` for a view without `group_by`).
fn group_text(group: &serde_json::Map<String, J>) -> String {
    if group.is_empty() {
        return "-".into();
    }
    group
        .iter()
        .map(|(k, v)| format!("{k}={}", value_text(v)))
        .collect::<Vec<_>>()
        .join(",")
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
        if line.is_empty() {
            event.clear();
        } else if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if let Some(data) = line.strip_prefix("data:") {
            let endpoint = format!("GET /v1/views/{{view}}/final event {event}");
            let data = data.trim();
            match event.as_str() {
                "reset" => {
                    let r: api::FinalReset = decode_text(&endpoint, data)?;
                    eprintln!(
                        "tail: reset: {}; going on after {}",
                        r.hint,
                        r.cursor.as_deref().unwrap_or("the start")
                    );
                }
                "final" => {
                    let w: api::FinalWindow = decode_text(&endpoint, data)?;
                    if out.json {
                        crate::outln!("{}", serde_json::to_value(&w)?)?;
                    } else {
                        crate::outln!(
                            "{}  {}  {}  {}  {}",
                            group_text(&w.group),
                            ms_text(w.window_start),
                            ms_text(w.window_end),
                            value_text(&w.value),
                            w.cursor
                        )?;
                    }
                }
                // An event this version does not know: nothing of it to show.
                _ => {}
            }
        }
        Ok(())
    })
}

/// `tidemark status`.
pub fn status(client: &Client, out: &Output) -> anyhow::Result<()> {
    let reply: Reply<api::Cluster> = accept_as("GET /v1/cluster", client.get("/v1/cluster", &[])?)?;
    let ready = client.get("/readyz", &[])?.is_ok();
    if out.json {
        crate::outln!("{}", json!({"ready": ready, "cluster": reply.json}))?;
        return Ok(());
    }
    let cluster = reply.value;
    let n = &cluster.node;
    print_table(
        &[
            "NODE", "VERSION", "HTTP", "PEERS ON", "EPOCH", "LOG", "READY",
        ],
        &[vec![
            n.name.clone().unwrap_or_else(|| n.replica.clone()),
            n.version.clone(),
            n.http.clone(),
            n.peer_listen.clone().unwrap_or_else(|| "-".to_owned()),
            n.epoch.to_string(),
            format!("{}..{}", n.log.start, n.log.end),
            ready.to_string(),
        ]],
    )?;
    if n.decommissioned {
        crate::outln!(
            "this node was removed from the cluster for good (decommissioned): it applies no \
             event to a window and is not ready; start it on a new data directory to rejoin"
        )?;
    }
    // Every member SWIM knows, down ones included, with what replication knows of it.
    crate::outln!()?;
    print_members(&cluster.members)?;
    // Replication peers no member name is known for (an in-process link, a member being
    // forgotten).
    let peers: Vec<&api::ClusterPeer> = cluster
        .peers
        .iter()
        .filter(|p| {
            !p.name
                .as_deref()
                .is_some_and(|n| cluster.members.iter().any(|m| m.name == n))
        })
        .collect();
    if !peers.is_empty() {
        crate::outln!()?;
        let rows: Vec<Vec<String>> = peers
            .iter()
            .map(|p| {
                vec![
                    p.name.clone().unwrap_or_else(|| p.peer.clone()),
                    p.connected.to_string(),
                    p.lag_entries
                        .map_or_else(|| "-".to_owned(), |l| l.to_string()),
                    lag_bytes_text(p.lag_bytes, p.lag_bytes_exact),
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
    let reply: Reply<api::ViewPage> = accept_as("GET /v1/views/{view}", client.get(&path, query)?)?;
    if out.json {
        crate::outln!("{}", reply.json)?;
        return Ok(());
    }
    let page = reply.value;
    let rows: Vec<Vec<String>> = page
        .rows
        .iter()
        .map(|r| {
            vec![
                group_text(&r.group),
                opt_ms_text(r.window_start, "null"),
                opt_ms_text(r.window_end, "null"),
                r.is_final.to_string(),
                value_text(&r.value),
            ]
        })
        .collect();
    print_table(
        &["GROUP", "WINDOW START", "WINDOW END", "FINAL", "VALUE"],
        &rows,
    )?;
    let c = &page.counters;
    crate::outln!(
        "watermark {}  cluster watermark {}  folded {} late {} rejected {}",
        opt_ms_text(page.watermark, "null"),
        opt_ms_text(page.cluster_watermark, "null"),
        c.folded,
        c.late,
        c.rejected,
    )?;
    if let Some(next) = &page.next {
        crate::outln!("more rows: --after {}", shell_quoted(next))?;
    }
    Ok(())
}

/// A member's or peer's `lag_bytes` for a table: the number, `≥N` when it is a lower bound
/// (`lag_bytes_exact` false), `-` when unknown.
fn lag_bytes_text(bytes: Option<u64>, exact: Option<bool>) -> String {
    match (bytes, exact) {
        (Some(b), Some(false)) => format!("≥{b}"),
        (Some(b), _) => b.to_string(),
        (None, _) => "-".to_owned(),
    }
}

/// Prints every member SWIM knows (down ones included) with its state, version, address, lag in
/// entries, bytes and seconds and last contact; a node without other members says so.
fn print_members(members: &[api::ClusterMember]) -> anyhow::Result<()> {
    if members.is_empty() {
        crate::outln!("single node: no other members known")?;
    } else {
        let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
        let rows: Vec<Vec<String>> = members
            .iter()
            .map(|m| {
                vec![
                    m.name.clone(),
                    m.state.clone(),
                    or_dash(m.version.clone()),
                    or_dash(m.addr.clone()),
                    m.connected.to_string(),
                    or_dash(m.lag_entries.map(|l| l.to_string())),
                    lag_bytes_text(m.lag_bytes, m.lag_bytes_exact),
                    or_dash(m.lag_seconds.map(|s| format!("{s:.1}"))),
                    or_dash(m.last_contact.map(|s| format!("{s:.1}s ago"))),
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
/// `members`).
///
/// # Errors
/// Transport failures, error answers and replies that do not match the API.
pub fn members(client: &Client, out: &Output) -> anyhow::Result<()> {
    let reply: Reply<api::Cluster> = accept_as("GET /v1/cluster", client.get("/v1/cluster", &[])?)?;
    let members = reply.value.members;
    if out.json {
        crate::outln!("{}", serde_json::to_value(&members)?)?;
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
    let endpoint = "POST /v1/cluster/members/{name}/remove";
    let reply: Reply<api::MemberRemoved> = match answer {
        // The server's hint names its query parameter; the CLI's is a flag.
        Err(r) if r.status == 409 => {
            anyhow::bail!(
                "409 member_alive: {name} is still answering: decommission a member only when \
                 it is gone for good (add --force to remove it anyway)"
            )
        }
        other => accept_as(endpoint, other)?,
    };
    if out.json {
        crate::outln!("{}", reply.json)?;
    } else {
        let done = reply.value;
        // `name` is the member's name as the record keeps it (it was given by replica id,
        // say).
        if done.already {
            crate::outln!(
                "{} (replica {}) was already removed: nothing written",
                done.name,
                done.removed
            )?;
        } else {
            crate::outln!("removed {} (replica {}) for good", done.name, done.removed)?;
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
