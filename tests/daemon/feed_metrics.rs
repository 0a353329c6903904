//! Per-consumer feed metrics (`tidemark_watch_consumer_*{consumer,kind}`): a consumer that
//! reads nothing while writes go on falls behind (entries growing, bytes held for it growing
//! but never past the configured bound); once it reads everything it is at 0; once its client
//! disconnects its series are gone. Checked for a watch stream (kind `watch`) and a
//! final-window feed (kind `final`), each named by the `X-Tidemark-Consumer` header of its
//! response; and the series are at most `http.watchers_max` (a consumer holds a watcher slot).

use crate::http_support;

use http_support::Served;
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const ENTRIES: &str = "tidemark_watch_consumer_behind_entries";
const SECONDS: &str = "tidemark_watch_consumer_behind_seconds";
const BYTES: &str = "tidemark_watch_consumer_buffered_bytes";

/// An open feed response: the body's reader (past the headers) and the consumer id.
struct Feed {
    reader: BufReader<TcpStream>,
    consumer: String,
}

/// `GET path` over a fresh connection with `accept`; reads the status and headers.
fn open(s: &Served, path: &str, accept: &str) -> Feed {
    let mut sock = TcpStream::connect(s.addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        sock,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: {accept}\r\n\r\n",
        s.addr
    )
    .expect("send");
    let mut reader = BufReader::new(sock);
    let mut line = String::new();
    reader.read_line(&mut line).expect("status");
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    let mut consumer = None;
    loop {
        line.clear();
        reader.read_line(&mut line).expect("header");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((name, value)) = l.split_once(':')
            && name.eq_ignore_ascii_case("x-tidemark-consumer")
        {
            consumer = Some(value.trim().to_owned());
        }
    }
    Feed {
        reader,
        consumer: consumer.expect("an X-Tidemark-Consumer header"),
    }
}

impl Feed {
    /// The next JSON payload of the body: an SSE `data:` line or an NDJSON line (chunk-size
    /// lines, comments, `event:` and `id:` lines are passed over). `(event, json)`.
    fn next_json(&mut self) -> (String, serde_json::Value) {
        let mut event = String::new();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.reader.read_line(&mut line).expect("read") > 0,
                "closed"
            );
            let l = line.trim_end_matches(['\r', '\n']);
            if let Some(e) = l.strip_prefix("event:") {
                event = e.trim().to_owned();
            } else if let Some(d) = l.strip_prefix("data:") {
                return (event, serde_json::from_str(d.trim()).expect("sse data"));
            } else if l.starts_with('{') {
                let v: serde_json::Value = serde_json::from_str(l).expect("ndjson line");
                let e = v["event"].as_str().unwrap_or_default().to_owned();
                return (e, v);
            }
        }
    }
}

fn metrics(s: &Served) -> String {
    let m = http_support::get(&s.url("/metrics"));
    assert_eq!(m.status, 200);
    m.text
}

/// The value of `family`'s sample for `consumer`, checking its `kind` label.
fn sample(text: &str, family: &str, consumer: &str, kind: &str) -> Option<f64> {
    let label = format!("consumer=\"{consumer}\"");
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{family}{{")) && l.contains(&label))?;
    assert!(line.contains(&format!("kind=\"{kind}\"")), "{line}");
    line.rsplit_once(' ').and_then(|(_, v)| v.parse().ok())
}

/// `(entries, seconds, bytes)` of `consumer`, all three present.
fn lag(s: &Served, consumer: &str, kind: &str) -> (f64, f64, f64) {
    let text = metrics(s);
    let get = |family| {
        sample(&text, family, consumer, kind)
            .unwrap_or_else(|| panic!("no {family} sample for consumer {consumer}: {text}"))
    };
    (get(ENTRIES), get(SECONDS), get(BYTES))
}

/// [`lag`] once the stream stopped moving: the same entries behind on two scrapes `gap`
/// apart (right after a write the server may still be sending to the socket; a final feed
/// looks for new windows every 250 ms).
fn settled_lag(s: &Served, consumer: &str, kind: &str, gap: Duration) -> (f64, f64, f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut before = lag(s, consumer, kind);
    loop {
        std::thread::sleep(gap);
        let now = lag(s, consumer, kind);
        if now.0 == before.0 {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{kind} consumer never settled: {now:?}"
        );
        before = now;
    }
}

/// Polls until `consumer` reports nothing behind and nothing held (20 s at most).
fn await_caught_up(s: &Served, consumer: &str, kind: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let l = lag(s, consumer, kind);
        if l == (0.0, 0.0, 0.0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{kind} consumer still behind: {l:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Calls `poke` (something the consumer's stream must write) until none of the three families
/// has a sample for `consumer` (the server notices a closed connection when it next writes).
fn await_gone(s: &Served, consumer: &str, mut poke: impl FnMut()) {
    let label = format!("consumer=\"{consumer}\"");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics(s);
        let left: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(&label))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "series of a disconnected consumer stay: {left:?}"
        );
        poke();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `promtool check metrics` finds nothing in `text` (skipped where promtool is not installed,
/// unless `TIDEMARK_REQUIRE_PROMTOOL=1`).
fn promtool_clean(text: &str) {
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var("TIDEMARK_REQUIRE_PROMTOOL").as_deref() != Ok("1"),
                "promtool is required but cannot run: {e}"
            );
            eprintln!("promtool not installed: check skipped");
            return;
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).expect("promtool stdin");
    }
    let out = child.wait_with_output().expect("promtool");
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "promtool check metrics: {findings}"
    );
}

fn post_ops(s: &Served, ops: &serde_json::Value) {
    let a = http_support::post(&s.url("/v1/ops"), ops.to_string());
    assert_eq!(a.status, 200, "{a:?}");
}

#[test]
fn a_stalled_watch_consumer_falls_behind_within_the_ring_bound_catches_up_and_its_series_go() {
    const RING: usize = 1 << 20;
    const BATCH: usize = 8;
    let s = Served::start_with(|n, _| n.limits.watch_buffer_bytes_max = RING);
    let mut w = open(&s, "/v1/watch?prefix=big", "text/event-stream");
    let id = w.consumer.clone();
    assert_eq!(
        lag(&s, &id, "watch"),
        (0.0, 0.0, 0.0),
        "nothing written yet"
    );
    // Big values, nothing read: once the socket buffers are full the stream stops moving and
    // every further change is one more entry behind.
    let value = "x".repeat(60_000);
    let mut behind: Vec<(f64, f64, f64)> = Vec::new();
    let mut written = 0;
    while behind.len() < 6 {
        assert!(written < 2_000, "the consumer never fell behind");
        let ops: Vec<_> = (0..BATCH)
            .map(|i| json!({"type":"lww","key":format!("big{i}"),"op":"set","value":value}))
            .collect();
        post_ops(&s, &json!(ops));
        written += BATCH;
        let l = settled_lag(&s, &id, "watch", Duration::from_millis(100));
        assert!(l.2 <= RING as f64, "{l:?}: more held than the ring's bound");
        if l.0 > 0.0 {
            behind.push(l);
        }
    }
    eprintln!("watch consumer, stalled (entries, seconds, bytes): {behind:?}");
    for pair in behind.windows(2) {
        // Stalled: each batch is BATCH more changes behind, none read in between.
        assert!(pair[1].0 > pair[0].0, "entries did not grow: {behind:?}");
        assert!(pair[1].1 > 0.0, "behind with no age: {behind:?}");
    }
    promtool_clean(&metrics(&s));
    let (first, last) = (behind[0], behind[behind.len() - 1]);
    assert!(last.0 - first.0 >= (BATCH * 4) as f64, "{behind:?}");
    assert!(
        last.2 > first.2,
        "the bytes held for it did not grow: {behind:?}"
    );
    assert!(
        last.2 > (RING / 2) as f64,
        "it fell past the ring, whose bytes are near its bound: {behind:?}"
    );
    // It reads what was sent before it stalled, then, past the ring, it is told so (and goes
    // on from the newest change: the ones still held are re-read by the client, not sent).
    loop {
        let (event, data) = w.next_json();
        match event.as_str() {
            "reset" => {
                assert_eq!(data["reason"], "behind_retention", "{data}");
                assert!(data["missed"].as_u64().is_some_and(|m| m > 0), "{data}");
                break;
            }
            "change" => {}
            other => panic!("unexpected event {other}: {data}"),
        }
    }
    post_ops(
        &s,
        &json!([{"type":"lww","key":"big-end","op":"set","value":"end"}]),
    );
    let (event, data) = w.next_json();
    assert_eq!(
        (event.as_str(), &data["key"]),
        ("change", &json!("big-end"))
    );
    await_caught_up(&s, &id, "watch");
    // Gone: its series go once the server writes to the closed connection.
    drop(w);
    let mut n = 0;
    await_gone(&s, &id, || {
        n += 1;
        post_ops(
            &s,
            &json!([{"type":"lww","key":"big-poke","op":"set","value":n}]),
        );
    });
}

#[test]
fn a_stalled_final_feed_consumer_falls_behind_by_windows_catches_up_and_its_series_go() {
    const GROUPS: u64 = 32;
    const PAGE: usize = 64;
    const VALUE: usize = 20_000;
    let s = Served::start_with(|n, _| {
        n.views = serde_json::from_value(json!([{
            "name": "last", "stream": "s", "kind": "latest", "field": "v",
            "group_by": ["g"], "window": {"tumbling": "1m", "lateness": "0s"},
        }]))
        .expect("views");
    });
    let mut f = open(
        &s,
        "/v1/views/last/final?follow=true",
        "application/x-ndjson",
    );
    let id = f.consumer.clone();
    assert_eq!(lag(&s, &id, "final"), (0.0, 0.0, 0.0), "no window yet");
    // Window k gets GROUPS big values; it is final once window k + 1's events pass it.
    let value = "y".repeat(VALUE);
    let mut seq = 0u64;
    let mut ingest = |k: u64| {
        let lines: String = (0..GROUPS)
            .map(|g| {
                seq += 1;
                format!(
                    "{}\n",
                    json!({"source":"a","seq":seq,"time":k * 60_000 + 1_000,"g":format!("g{g}"),"v":value})
                )
            })
            .collect();
        let r = ureq::post(&s.url("/v1/streams/s/events"))
            .header("Content-Type", "application/x-ndjson")
            .send(lines.as_bytes())
            .expect("ingest");
        assert_eq!(r.status(), 200);
    };
    let window_bytes = (VALUE + 200) as f64;
    let mut behind: Vec<(f64, f64, f64)> = Vec::new();
    let mut k = 0;
    while behind.len() < 4 {
        assert!(k < 200, "the consumer never fell behind");
        ingest(k);
        k += 1;
        // The node seals what it can when read: the scrape's count reads the feed.
        let l = settled_lag(&s, &id, "final", Duration::from_millis(400));
        assert!(
            l.2 <= PAGE as f64 * window_bytes,
            "{l:?}: more held than one page"
        );
        if l.0 > 0.0 {
            behind.push(l);
        }
    }
    eprintln!("final consumer, stalled (entries, seconds, bytes): {behind:?}");
    for pair in behind.windows(2) {
        assert!(pair[1].0 > pair[0].0, "entries did not grow: {behind:?}");
        assert!(pair[1].1 > 0.0, "behind with no age: {behind:?}");
    }
    // Windows 0 .. k - 2 are final: it reads every one of them, once.
    let finals = (k - 1) * GROUPS;
    let mut seen = std::collections::BTreeSet::new();
    while (seen.len() as u64) < finals {
        let (event, w) = f.next_json();
        assert_eq!(event, "final", "{w}");
        assert_eq!(w["value"].as_str().map(str::len), Some(VALUE));
        let key = (
            w["window_start"].as_u64().expect("start"),
            w["group"]["g"].as_str().expect("group").to_owned(),
        );
        assert!(seen.insert(key.clone()), "{key:?} twice");
    }
    await_caught_up(&s, &id, "final");
    drop(f);
    // A new final window makes the feed write to the closed connection.
    await_gone(&s, &id, || {
        ingest(k);
        k += 1;
    });
}

#[test]
fn consumer_series_are_bounded_by_the_watcher_slots_and_named_by_kind() {
    let s = Served::start_with(|n, h| {
        h.watchers_max = 2;
        n.views = serde_json::from_value(json!([{
            "name": "c", "stream": "s", "kind": "count",
            "window": {"tumbling": "1m"},
        }]))
        .expect("views");
    });
    let w = open(&s, "/v1/watch", "text/event-stream");
    let f = open(&s, "/v1/views/c/final", "application/x-ndjson");
    assert_ne!(w.consumer, f.consumer);
    // A third consumer gets no slot, hence no series.
    let third = http_support::get(&s.url("/v1/watch"));
    assert_eq!((third.status, third.code()), (429, "too_many_watchers"));
    let text = metrics(&s);
    for family in [ENTRIES, SECONDS, BYTES] {
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .collect();
        assert_eq!(series.len(), 2, "{family}: {series:?}");
        assert!(
            text.contains(&format!("# HELP {family} ")) && text.contains("http.watchers_max (2)"),
            "{family}'s help names the bound"
        );
    }
    assert_eq!(sample(&text, ENTRIES, &w.consumer, "watch"), Some(0.0));
    assert_eq!(sample(&text, ENTRIES, &f.consumer, "final"), Some(0.0));
}
