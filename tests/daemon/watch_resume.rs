//! Resumable watch: a watcher that goes away and comes back with its cursor receives every
//! committed change after it exactly once, in order (embedded and over HTTP, across restarts
//! and compaction); behind what is held it is told `reset`, never given a gap.
//!
//! Each write is one increment of one counter, acknowledged before the next: each commit is
//! one change, so the changes of key `k` are exactly the values 1, 2, …, n(k).

use crate::daemon_support;
use crate::http_support;

use daemon_support::Daemon;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tidemark::{Cursor, Key, KeyFilter, KeyKind, Node, NodeConfig, Op, Value, Watch, WatchEvent};

/// xorshift: the seeded choices of a run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.next() % one_in == 0
    }
}

fn seed() -> u64 {
    std::env::var("WATCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0005_eed0_fa11)
}

/// What a watcher received, per key, checked against the writes.
#[derive(Default)]
struct Seen {
    values: BTreeMap<String, Vec<u64>>,
}

impl Seen {
    fn push(&mut self, key: &str, v: u64) {
        self.values.entry(key.to_owned()).or_default().push(v);
    }
    /// Every key's received values are exactly 1..=n.
    fn assert_exact(&self, written: &BTreeMap<String, u64>) {
        for (key, &n) in written {
            let got = self.values.get(key).cloned().unwrap_or_default();
            let want: Vec<u64> = (1..=n).collect();
            assert_eq!(got, want, "changes of {key}");
        }
    }
}

async fn drain(w: &mut Watch, seen: &mut Seen) {
    // `behind` counts changes of every key: the last ones may not match the filter, which the
    // watcher passes over while it waits for the next match.
    while w.behind().changes > 0 {
        match tokio::time::timeout(Duration::from_millis(200), w.next()).await {
            Ok(Some(WatchEvent::Changed(c))) => match c.value {
                Value::GCounter(v) => seen.push(&c.key.name, v),
                other => panic!("unexpected value {other:?}"),
            },
            Err(_) => {}
            Ok(other) => panic!("unexpected watch event {other:?} at {}", w.cursor()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_watcher_resumes_exactly_across_reconnects_compaction_and_a_clean_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng(seed());
    let mut node = Node::open(NodeConfig::new(dir.path())).await.expect("open");
    let filter = KeyFilter::prefix("k");
    let mut w = node.watch(filter.clone());
    let mut written: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen = Seen::default();
    let mut restarted = false;
    for i in 0..600 {
        let key = format!("k{}", rng.next() % 6);
        node.apply(Op::inc_gcounter(&key, 1)).await.expect("write");
        *written.entry(key).or_default() += 1;
        // A key outside the filter moves the cursor too, never a change of ours.
        if rng.chance(7) {
            node.apply(Op::inc_gcounter("other", 1))
                .await
                .expect("write");
        }
        if rng.chance(4) {
            drain(&mut w, &mut seen).await;
        }
        if rng.chance(9) {
            let at = w.cursor();
            drop(w);
            w = node.watch_from(filter.clone(), at);
        }
        if rng.chance(50) {
            node.compact(None).await.expect("compact");
        }
        if i == 300 && !restarted {
            // A clean restart with the watcher caught up: it resumes with no reset.
            drain(&mut w, &mut seen).await;
            let at = w.cursor();
            drop(w);
            node.shutdown().await.expect("shutdown");
            drop(node);
            node = Node::open(NodeConfig::new(dir.path()))
                .await
                .expect("reopen");
            w = node.watch_from(filter.clone(), at);
            restarted = true;
        }
    }
    drain(&mut w, &mut seen).await;
    seen.assert_exact(&written);
    node.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_behind_a_restart_or_the_ring_is_reset_and_a_reread_leaves_no_gap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::open(NodeConfig::new(dir.path())).await.expect("open");
    let filter = KeyFilter::prefix("k");
    let w = node.watch(filter.clone());
    node.apply(Op::inc_gcounter("k", 1)).await.expect("write");
    let stale = w.cursor(); // before the change it has not read
    drop(w);
    node.apply(Op::inc_gcounter("k", 1)).await.expect("write");
    node.shutdown().await.expect("shutdown");
    drop(node);
    let node = Node::open(NodeConfig::new(dir.path()))
        .await
        .expect("reopen");
    // Behind the previous run's end: the changes it missed are not held. Reset, then a re-read
    // and the changes after the reset cover everything.
    let mut w = node.watch_from(filter.clone(), stale);
    let first = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
    assert!(
        matches!(first, Ok(Some(WatchEvent::Reset { missed: None }))),
        "{first:?}"
    );
    let key = Key::new(KeyKind::GCounter, "k");
    assert_eq!(node.get(&key).expect("read"), Value::GCounter(2));
    node.apply(Op::inc_gcounter("k", 1)).await.expect("write");
    let next = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
    assert!(
        matches!(&next, Ok(Some(WatchEvent::Changed(c))) if c.value == Value::GCounter(3)),
        "{next:?}"
    );
    // A cursor from text that names nothing this node numbered: reset too, never resumed.
    let foreign: Cursor = "0123456789abcdef-1".parse().expect("cursor");
    let mut w = node.watch_from(filter, foreign);
    let first = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
    assert!(matches!(
        first,
        Ok(Some(WatchEvent::Reset { missed: None }))
    ));
    node.shutdown().await.expect("shutdown");
}

/// One server-sent event.
#[derive(Debug, Clone)]
struct Sse {
    event: String,
    id: Option<String>,
    data: serde_json::Value,
}

fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// Opens `GET /v1/watch?QUERY` (with `Last-Event-ID` when given) and reads past the headers
/// to the `: watching after CURSOR` comment; returns the stream and that cursor.
fn open_sse_at(url: &str, query: &str, last_id: Option<&str>) -> (BufReader<TcpStream>, String) {
    let addr = addr_of(url);
    let mut sock = TcpStream::connect(&addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let last = last_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
    write!(
        sock,
        "GET /v1/watch?{query} HTTP/1.1\r\nHost: {addr}\r\n{last}\r\n"
    )
    .expect("send");
    let mut reader = BufReader::new(sock);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).expect("read") > 0, "closed");
        if let Some(start) = line.strip_prefix(": watching after ") {
            return (reader, start.trim().to_owned());
        }
        assert!(
            !line.starts_with("HTTP/1.1 4") && !line.starts_with("HTTP/1.1 5"),
            "{line}"
        );
    }
}

fn open_sse(url: &str, query: &str, last_id: Option<&str>) -> BufReader<TcpStream> {
    open_sse_at(url, query, last_id).0
}

fn next_sse(reader: &mut BufReader<TcpStream>) -> Sse {
    // Keep-alive comments come every 15 s: a stream that sends only those is stalled.
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut ev = Sse {
        event: "message".into(),
        id: None,
        data: serde_json::Value::Null,
    };
    let mut line = String::new();
    let mut has_data = false;
    loop {
        line.clear();
        assert!(Instant::now() < deadline, "no event within 40 s");
        assert!(reader.read_line(&mut line).expect("read sse") > 0, "closed");
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            if has_data {
                return ev;
            }
            continue;
        }
        if let Some(v) = l.strip_prefix("event:") {
            ev.event = v.trim().to_owned();
        } else if let Some(v) = l.strip_prefix("id:") {
            ev.id = Some(v.trim().to_owned());
        } else if let Some(v) = l.strip_prefix("data:") {
            ev.data = serde_json::from_str(v.trim()).expect("json data");
            has_data = true;
        }
    }
}

fn inc(url: &str, key: &str) {
    let body = format!(r#"[{{"type":"gcounter","key":"{key}","op":"inc"}}]"#);
    assert_eq!(
        http_support::post(&format!("{url}/v1/ops"), body).status,
        200
    );
}

/// Reads until the watcher has every change written so far (counted by `expected`).
fn read_until(
    r: &mut BufReader<TcpStream>,
    seen: &mut Seen,
    last: &mut Option<String>,
    total: usize,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.values.values().map(Vec::len).sum::<usize>() < total {
        assert!(Instant::now() < deadline, "watch stalled");
        let ev = next_sse(r);
        assert_eq!(ev.event, "change", "{ev:?}");
        let key = ev.data["key"].as_str().expect("key").to_owned();
        seen.push(&key, ev.data["value"].as_u64().expect("count"));
        *last = ev.id;
    }
}

#[test]
fn an_http_watcher_resumes_with_last_event_id_across_reconnects_and_a_daemon_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut rng = Rng(seed() ^ 0xabcdef);
    let mut daemon = Daemon::start(&data, &[]);
    // The stream names where it starts: a client that saw no event yet resumes from there.
    let (mut r, start) = open_sse_at(&daemon.url, "prefix=k", None);
    let mut last: Option<String> = Some(start);
    let mut written: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0usize;
    let mut seen = Seen::default();
    for i in 0..240 {
        let key = format!("k{}", rng.next() % 4);
        inc(&daemon.url, &key);
        *written.entry(key).or_default() += 1;
        total += 1;
        if rng.chance(3) {
            read_until(&mut r, &mut seen, &mut last, total);
        }
        if rng.chance(8) {
            // Gone mid-stream (unread changes in flight); back with the last id it saw.
            drop(r);
            r = open_sse(&daemon.url, "prefix=k", last.as_deref());
        }
        if i == 120 {
            // Caught up, the daemon restarts cleanly (SIGTERM): the same id resumes.
            read_until(&mut r, &mut seen, &mut last, total);
            drop(r);
            assert!(daemon.terminate().success());
            daemon = Daemon::start(&data, &[]);
            r = open_sse(&daemon.url, "prefix=k", last.as_deref());
        }
    }
    read_until(&mut r, &mut seen, &mut last, total);
    seen.assert_exact(&written);
    // The URL's `after` works like the header.
    let mut again = open_sse(
        &daemon.url,
        &format!("prefix=k&after={}", last.as_deref().expect("an id")),
        None,
    );
    inc(&daemon.url, "k0");
    let ev = next_sse(&mut again);
    assert_eq!(ev.event, "change");
    assert_eq!(ev.data["value"], written["k0"] + 1);
    // The feed's metrics see the open watchers and the ring.
    let metrics = ureq::get(&format!("{}/metrics", daemon.url))
        .call()
        .expect("metrics")
        .into_body()
        .read_to_string()
        .expect("text");
    let sample = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    assert!(sample("tidemark_watch_consumers") >= 2.0);
    assert!(sample("tidemark_watch_held_changes") >= 1.0);
    assert_eq!(sample("tidemark_watch_recording"), 1.0);
    // A malformed cursor is refused, naming where it came from.
    let a = http_support::get(&format!("{}/v1/watch?after=nope", daemon.url));
    assert_eq!(a.status, 400);
    assert_eq!(a.code(), "invalid_cursor");
    assert_eq!(a.at(), "query after");
}

#[test]
fn after_kill_9_a_cursor_is_reset_and_a_snapshot_follows_with_no_gap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut daemon = Daemon::start(&data, &[]);
    let mut r = open_sse(&daemon.url, "prefix=k&snapshot=true", None);
    let end = next_sse(&mut r);
    assert_eq!(end.event, "snapshot_end", "{end:?}");
    inc(&daemon.url, "k");
    let ev = next_sse(&mut r);
    assert_eq!(ev.event, "change");
    let last = ev.id.expect("id");
    drop(r);
    // kill -9: the run's changes after any cursor may be lost; the cursor is not resumed.
    let _ = daemon.child.kill();
    let _ = daemon.child.wait();
    drop(daemon);
    let daemon = Daemon::start(&data, &[]);
    inc(&daemon.url, "k");
    let mut r = open_sse(&daemon.url, "prefix=k&snapshot=true", Some(&last));
    let reset = next_sse(&mut r);
    assert_eq!(reset.event, "reset", "{reset:?}");
    assert_eq!(reset.data["reason"], "unknown_cursor");
    assert!(reset.id.is_none(), "the id comes with the snapshot's end");
    // Writers keep going while the snapshot is read: snapshot, then changes, end at the value.
    let writer = {
        let url = daemon.url.clone();
        std::thread::spawn(move || {
            for _ in 0..50 {
                inc(&url, "k");
            }
        })
    };
    let mut value = None;
    let mut snapshot_done = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while value != Some(52) {
        assert!(Instant::now() < deadline, "last value {value:?}");
        let ev = next_sse(&mut r);
        match ev.event.as_str() {
            "snapshot" => {
                assert!(!snapshot_done);
                value = ev.data["value"].as_u64();
            }
            "snapshot_end" => {
                snapshot_done = true;
                assert!(ev.id.is_some());
            }
            "change" => {
                assert!(snapshot_done, "a change before the snapshot ended");
                let v = ev.data["value"].as_u64().expect("value");
                // Changes may repeat what the snapshot already held, never go back or skip.
                if let Some(prev) = value {
                    assert!(v >= prev && v <= prev + 1, "{prev} then {v}");
                }
                value = Some(v);
            }
            other => panic!("unexpected {other}: {ev:?}"),
        }
    }
    writer.join().expect("writer");
}
