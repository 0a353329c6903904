//! The final-window feed: across a 3-node cluster with partitions and restarts, with a
//! consumer on each node that crashes at random between writing its sink and saving its
//! cursor, every window is delivered in order, each window at most once after the cursor a
//! consumer saved, the same value on every node, and each consumer's sink ends equal to the
//! final rows of the views (and to the batch recount of the events applied).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark::views::{Event, FinalCursor, ViewDef, ViewQuery};
use tidemark::{Node, NodeConfig};

use crate::common;
use crate::http_support;

fn defs() -> Vec<ViewDef> {
    let w = json!({"tumbling": "1m", "lateness": "20s"});
    serde_json::from_value(json!([
        {"name": "clicks", "stream": "s", "kind": "count", "group_by": ["page"], "window": w},
        {"name": "open", "stream": "s", "kind": "count"},
    ]))
    .expect("defs")
}

async fn open(dir: &std::path::Path) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs();
    Node::open(cfg).await.expect("open")
}

/// A sink table `(window_start, group) → (version, value)` and the cursor saved with it.
#[derive(Default)]
struct Sink {
    table: BTreeMap<(u64, String), (u64, serde_json::Value)>,
    cursor: Option<String>,
    /// Windows received since the saved cursor (order check).
    last_key: Option<(u64, String)>,
    received: usize,
}

impl Sink {
    /// `upsert(key, version, value)`: a replay (same version) changes nothing.
    fn upsert(&mut self, key: (u64, String), version: u64, value: serde_json::Value) {
        match self.table.get(&key) {
            Some((v, old)) if *v >= version => {
                assert_eq!(old, &value, "a final window replayed with another value");
            }
            _ => {
                self.table.insert(key, (version, value));
            }
        }
    }

    /// Reads one page from `node` after the saved cursor; `crash`: the table is written but
    /// the cursor is not saved (the page will be delivered again).
    async fn pull(&mut self, node: &Node, crash: bool) {
        let after: Option<FinalCursor> = self.cursor.as_deref().map(|c| c.parse().expect("cursor"));
        let page = node
            .final_windows("clicks", after.as_ref(), 7)
            .await
            .expect("final page");
        assert!(!page.reset, "nothing is removed by retention here");
        for w in &page.windows {
            let key = (
                w.window_start,
                serde_json::Value::Object(w.group.clone()).to_string(),
            );
            if let Some(prev) = &self.last_key {
                assert!(prev < &key, "out of order: {prev:?} then {key:?}");
            }
            self.last_key = Some(key.clone());
            self.received += 1;
            self.upsert(key, w.version, w.value.clone());
        }
        if crash {
            self.last_key = None; // the consumer restarts from its saved cursor
        } else if let Some(next) = page.next {
            self.cursor = Some(next);
        }
    }
}

async fn converge(nodes: &[Node]) {
    let started = Instant::now();
    loop {
        let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
        if ctxs.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no convergence"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_consumer_sees_each_final_window_once_and_ends_equal_to_the_views() {
    let seed = common::seed("final_feed");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let root = tempfile::tempdir().expect("tempdir");
    let dirs: Vec<_> = (0..3).map(|i| root.path().join(format!("n{i}"))).collect();
    let mut nodes = Vec::new();
    for d in &dirs {
        nodes.push(open(d).await);
    }
    for i in 0..3 {
        for j in i + 1..3 {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
    }
    let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
    let mut seq = [0u64; 3];
    let mut clock = 0u64;
    let (mut applied, mut late) = (0u64, 0u64);
    let steps = if common::soak() { 300 } else { 60 };
    for _ in 0..steps {
        match rng.random_range(0..10) {
            0 => {
                let (i, j) = (rng.random_range(0..3), rng.random_range(0..3));
                if i != j {
                    if rng.random_bool(0.5) {
                        nodes[i].disconnect(&nodes[j]).expect("disconnect");
                    } else {
                        nodes[i].connect(&nodes[j]).expect("connect");
                    }
                }
            }
            1 => {
                let i = rng.random_range(0..3);
                nodes[i].shutdown().await.expect("shutdown");
                nodes[i] = open(&dirs[i]).await;
                for j in 0..3 {
                    if j != i {
                        nodes[i].connect(&nodes[j]).expect("connect");
                    }
                }
            }
            _ => {
                let i = rng.random_range(0..3);
                clock += rng.random_range(0..20_000);
                let batch: Vec<Event> = (0..rng.random_range(1..5))
                    .map(|_| {
                        seq[i] += 1;
                        let t = clock.saturating_sub(rng.random_range(0..60_000));
                        let page = ["/a", "/b", "/c"][rng.random_range(0..3)];
                        Event::new(&format!("n{i}"), seq[i], json!({"page": page})).at(t)
                    })
                    .collect();
                let out = nodes[i].ingest("s", batch).await.expect("ingest");
                applied += out.applied as u64;
                late += out.late as u64;
            }
        }
        for (n, sink) in sinks.iter_mut().enumerate() {
            let crash = rng.random_bool(0.2);
            sink.pull(&nodes[n], crash).await;
        }
    }
    // Heal, move every watermark past every window, and let all of it become final.
    for i in 0..3 {
        for j in i + 1..3 {
            nodes[i].connect(&nodes[j]).expect("connect");
        }
    }
    for (i, node) in nodes.iter().enumerate() {
        seq[i] += 1;
        let far = Event::new(&format!("n{i}"), seq[i], json!({"page": "/end"})).at(clock + 600_000);
        let out = node.ingest("s", vec![far]).await.expect("ingest");
        applied += out.applied as u64;
    }
    converge(&nodes).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for (n, sink) in sinks.iter_mut().enumerate() {
            for _ in 0..50 {
                sink.pull(&nodes[n], false).await;
            }
        }
        let mut done = true;
        for (n, sink) in sinks.iter().enumerate() {
            let page = nodes[n]
                .view("clicks", &ViewQuery::default())
                .await
                .expect("view");
            let finals: BTreeMap<(u64, String), serde_json::Value> = page
                .rows
                .iter()
                .filter(|r| r.is_final)
                .map(|r| {
                    (
                        (
                            r.window_start.expect("windowed"),
                            serde_json::Value::Object(r.group.clone()).to_string(),
                        ),
                        r.value.clone(),
                    )
                })
                .collect();
            let table: BTreeMap<_, _> = sink
                .table
                .iter()
                .map(|(k, (_, v))| (k.clone(), v.clone()))
                .collect();
            // Everything but the last window (still open at the far event) is final.
            let open = page.rows.iter().filter(|r| !r.is_final).count();
            if table != finals || open > 1 {
                done = false;
            }
        }
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: sinks never matched the views"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Batch recount: each applied, not late event is in one `clicks` window.
    let page = nodes[0]
        .view("clicks", &ViewQuery::default())
        .await
        .expect("view");
    let total: u64 = page
        .rows
        .iter()
        .map(|r| r.value.as_u64().expect("count"))
        .sum();
    assert_eq!(total, applied - late, "seed {seed}");
    // Same windows, same values on every node.
    assert_eq!(sinks[0].table, sinks[1].table, "seed {seed}");
    assert_eq!(sinks[1].table, sinks[2].table, "seed {seed}");
    // An unwindowed view has no final feed.
    let err = nodes[0].final_windows("open", None, 10).await;
    assert!(err.is_err());
    eprintln!(
        "seed {seed}: {} final windows; received {:?} (replays included)",
        sinks[0].table.len(),
        sinks.iter().map(|s| s.received).collect::<Vec<_>>()
    );
    for n in &nodes {
        n.shutdown().await.expect("shutdown");
    }
}

/// Reads NDJSON lines of `GET path` with `follow=false` (the feed ends when caught up).
fn ndjson(url: &str) -> Vec<serde_json::Value> {
    let resp = ureq::get(url)
        .header("Accept", "application/x-ndjson")
        .call()
        .expect("final feed");
    let text = resp.into_body().read_to_string().expect("body");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[test]
fn the_http_feed_resumes_by_cursor_as_ndjson_and_refuses_bad_input() {
    let s = http_support::Served::start_with(|n, _| n.views = defs());
    let events: String = (0..6u64)
        .map(|i| {
            let t = i * 30_000;
            format!(
                "{{\"source\":\"a\",\"seq\":{i},\"time\":{t},\"page\":\"/p{}\"}}\n",
                i % 2
            )
        })
        .chain(std::iter::once(
            "{\"source\":\"a\",\"seq\":99,\"time\":900000,\"page\":\"/end\"}\n".to_owned(),
        ))
        .collect();
    let r = ureq::post(&s.url("/v1/streams/s/events"))
        .header("Content-Type", "application/x-ndjson")
        .send(events.as_bytes())
        .expect("ingest");
    assert_eq!(r.status(), 200);
    let all = ndjson(&s.url("/v1/views/clicks/final?follow=false"));
    // Windows [0,1m) and [1m,2m) and [2m,3m), two pages each but /p0 and /p1 alternate.
    let windows: Vec<(u64, String, u64)> = all
        .iter()
        .map(|w| {
            assert_eq!(w["event"], "final");
            assert_eq!(w["version"], 1);
            (
                w["window_start"].as_u64().expect("start"),
                w["group"]["page"].as_str().expect("page").to_owned(),
                w["value"].as_u64().expect("count"),
            )
        })
        .collect();
    assert_eq!(
        windows,
        vec![
            (0, "/p0".into(), 1),
            (0, "/p1".into(), 1),
            (60_000, "/p0".into(), 1),
            (60_000, "/p1".into(), 1),
            (120_000, "/p0".into(), 1),
            (120_000, "/p1".into(), 1),
        ]
    );
    // Resuming after the third delivers exactly the rest.
    let cursor = all[2]["cursor"].as_str().expect("cursor");
    let rest = ndjson(&s.url(&format!(
        "/v1/views/clicks/final?follow=false&after={cursor}"
    )));
    assert_eq!(rest, all[3..].to_vec());
    // Bad input: a mangled cursor, an unwindowed view, an unknown view.
    for (path, status, code) in [
        ("/v1/views/clicks/final?after=zz", 400, "invalid_cursor"),
        ("/v1/views/open/final", 400, "unwindowed_view"),
        ("/v1/views/nope/final", 404, "view_not_found"),
        ("/v1/views/clicks/final?follow=maybe", 400, "invalid_query"),
    ] {
        let a = http_support::get(&s.url(path));
        assert_eq!((a.status, a.code()), (status, code), "{path}");
    }
}

#[test]
fn a_reset_behind_retention_names_the_position_read_from_so_resuming_loses_nothing() {
    let s = http_support::Served::start_with(|n, _| {
        n.views = serde_json::from_value(json!([
            {"name": "clicks", "stream": "s", "kind": "count", "group_by": ["page"],
             "window": {"tumbling": "1m", "lateness": "0s", "retention": "2m"}},
        ]))
        .expect("defs");
    });
    // Windows at 0..10 minutes, then a far event: the oldest are past retention.
    let events: String = (0..10u64)
        .map(|i| {
            format!(
                "{{\"source\":\"a\",\"seq\":{i},\"time\":{},\"page\":\"/p\"}}\n",
                i * 60_000
            )
        })
        .chain(std::iter::once(
            "{\"source\":\"a\",\"seq\":99,\"time\":720000,\"page\":\"/end\"}\n".to_owned(),
        ))
        .collect();
    let r = ureq::post(&s.url("/v1/streams/s/events"))
        .header("Content-Type", "application/x-ndjson")
        .send(events.as_bytes())
        .expect("ingest");
    assert_eq!(r.status(), 200);
    // A cursor at the first window (0 s), long past retention.
    let old = format!("{:020}/[\"/p\"]", 0)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let first = ndjson(&s.url(&format!("/v1/views/clicks/final?follow=false&after={old}")));
    assert_eq!(first[0]["event"], "reset", "{first:?}");
    assert_eq!(
        first[0]["cursor"], old,
        "the reset names where the feed read from"
    );
    let kept: Vec<_> = first[1..].to_vec();
    assert!(!kept.is_empty());
    // Resuming from the reset's cursor delivers the same kept windows again: none lost.
    let again = ndjson(&s.url(&format!("/v1/views/clicks/final?follow=false&after={old}")));
    assert_eq!(again[1..].to_vec(), kept);
}
