//! The late lane: every event a node acknowledges but applies to no view for being late is
//! kept — durably, once (a retry answered as duplicate adds nothing), bounded in bytes per
//! stream with the oldest dropped first and counted — and readable through
//! `Node::late_events`, `GET /v1/streams/{stream}/late` and `tidemark late STREAM`.

use crate::http_support;

use http_support::{Served, get, post};
use serde_json::{Value as J, json};
use std::process::{Command, Stdio};
use tidemark::views::{Event, ViewDef};
use tidemark::{Node, NodeConfig};

/// 2026-11-29T10:00:00Z in epoch milliseconds: the start of a one-minute window.
const T: u64 = 1_795_946_400_000;
const MIN: u64 = 60_000;

/// A one-minute tumbling count of stream `s` with no lateness, and an unwindowed count (for
/// which no event is ever late).
fn defs() -> Vec<ViewDef> {
    [
        json!({"name": "per_minute", "stream": "s", "kind": "count",
               "window": {"tumbling": "1m", "lateness": "0s"}}),
        json!({"name": "total", "stream": "s", "kind": "count"}),
    ]
    .into_iter()
    .map(|d| serde_json::from_value(d).expect("def"))
    .collect()
}

fn config(dir: &std::path::Path) -> NodeConfig {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = defs();
    cfg
}

fn ev(src: &str, seq: u64, t: u64) -> Event {
    Event::new(src, seq, json!({"page": "/p"})).at(t)
}

#[tokio::test]
async fn late_events_are_kept_once_with_why_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::open(config(dir.path())).await.expect("open");
    let on_time = node
        .ingest("s", vec![ev("a", 1, T + 10 * MIN)])
        .await
        .expect("ingest");
    assert_eq!((on_time.applied, on_time.late), (1, 0));
    assert!(
        node.late_events("s", None, 0)
            .expect("lane")
            .events
            .is_empty()
    );

    // The watermark is T+10m: an event of the first minute is late for `per_minute` only.
    let late = node
        .ingest("s", vec![ev("a", 2, T + 5_000), ev("a", 3, T + 10 * MIN)])
        .await
        .expect("ingest");
    assert_eq!((late.applied, late.duplicates, late.late), (2, 0, 1));
    // A retry of the late event is a duplicate and adds nothing to the lane.
    let retry = node
        .ingest("s", vec![ev("a", 2, T + 5_000)])
        .await
        .expect("retry");
    assert_eq!((retry.applied, retry.duplicates), (0, 1));

    let lane = node.late_events("s", None, 0).expect("lane");
    assert_eq!(lane.events.len(), 1, "{lane:?}");
    let r = &lane.events[0].record;
    assert_eq!(r["event"]["source"], json!("a"));
    assert_eq!(r["event"]["seq"], json!(2));
    assert_eq!(r["event"]["time"], json!(T + 5_000));
    assert_eq!(r["event"]["page"], json!("/p"));
    assert_eq!(r["views"], json!(["per_minute"]));
    assert_eq!(r["reason"], json!("behind_watermark"));
    assert_eq!(r["watermark"], json!(T + 10 * MIN));
    assert_eq!(r["node"], json!(node.replica_id().to_string()));
    assert_eq!(lane.dropped, 0);
    assert!(lane.kept_bytes > 0);
    assert_eq!(lane.next, None);
    // Another stream has its own (empty) lane.
    assert!(
        node.late_events("t", None, 0)
            .expect("lane")
            .events
            .is_empty()
    );
    let id = lane.events[0].id;
    node.shutdown().await.expect("shutdown");

    // Durable: the same record after a restart, and ids go on ascending.
    let node = Node::open(config(dir.path())).await.expect("reopen");
    let again = node.late_events("s", None, 0).expect("lane");
    assert_eq!(again.events, lane.events);
    let more = node
        .ingest("s", vec![ev("b", 1, T + MIN)])
        .await
        .expect("ingest");
    assert_eq!(more.late, 1);
    let after = node.late_events("s", Some(id), 0).expect("lane");
    assert_eq!(after.events.len(), 1);
    assert!(after.events[0].id > id);
    assert_eq!(after.events[0].record["event"]["source"], json!("b"));
    node.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn the_lane_is_bounded_in_bytes_and_drops_the_oldest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.limits.late_bytes_max = 4_096;
    let node = Node::open(cfg).await.expect("open");
    node.ingest("s", vec![ev("w", 1, T + 10 * MIN)])
        .await
        .expect("ingest");
    let n = 200u64;
    for seq in 1..=n {
        let o = node
            .ingest("s", vec![ev("late", seq, T)])
            .await
            .expect("ingest");
        assert_eq!(o.late, 1);
    }
    let lane = node.late_events("s", None, 0).expect("lane");
    assert!(lane.kept_bytes <= 4_096, "{}", lane.kept_bytes);
    let kept = lane.events.len() as u64;
    assert!(kept > 0 && kept < n, "kept {kept}");
    assert_eq!(
        lane.dropped + kept,
        n,
        "every late event is kept or counted as dropped"
    );
    // The newest are the ones kept, in order.
    let seqs: Vec<u64> = lane
        .events
        .iter()
        .map(|e| e.record["event"]["seq"].as_u64().expect("seq"))
        .collect();
    let expect: Vec<u64> = (n - kept + 1..=n).collect();
    assert_eq!(seqs, expect);
    // Paging walks the same records.
    let first = node.late_events("s", None, 3).expect("page");
    assert_eq!(first.events.len(), 3);
    let next = first.next.expect("a next cursor");
    let rest = node.late_events("s", Some(next), 0).expect("page");
    assert_eq!(rest.events.len() as u64, kept - 3);
    node.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_full_batch_from_many_sources_and_a_record_over_the_cap_stay_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path());
    cfg.limits.late_bytes_max = 64 * 1024;
    let node = Node::open(cfg).await.expect("open");
    node.ingest("s", vec![ev("w", 1, T + 10 * MIN)])
        .await
        .expect("ingest");
    // One batch of 1,000 late events, each from its own source.
    let batch: Vec<Event> = (0..1_000).map(|i| ev(&format!("src-{i}"), 1, T)).collect();
    let o = node.ingest("s", batch).await.expect("ingest");
    assert_eq!((o.applied, o.late), (1_000, 1_000));
    let lane = node.late_events("s", None, 0).expect("lane");
    assert!(lane.kept_bytes <= 64 * 1024, "{}", lane.kept_bytes);
    assert_eq!(lane.dropped + lane.events.len() as u64, 1_000);
    assert_eq!(
        lane.events
            .last()
            .map(|e| e.record["event"]["source"].clone()),
        Some(json!("src-999")),
        "the newest is kept"
    );

    // A single record larger than the whole cap is counted as dropped, never kept over it.
    let big = Event::new("big", 1, json!({"page": "x".repeat(100 * 1024)})).at(T);
    let o = node.ingest("s", vec![big]).await.expect("ingest");
    assert_eq!(o.late, 1);
    let lane = node.late_events("s", None, 0).expect("lane");
    assert!(lane.kept_bytes <= 64 * 1024, "{}", lane.kept_bytes);
    assert_eq!(lane.dropped + lane.events.len() as u64, 1_001);
    assert!(
        lane.events
            .iter()
            .all(|e| e.record["event"]["source"] != json!("big"))
    );

    // The last possible cursor is an empty page, not an error or a wrap-around.
    let end = node.late_events("s", Some(u64::MAX), 0).expect("page");
    assert!(end.events.is_empty() && end.next.is_none(), "{end:?}");
    node.shutdown().await.expect("shutdown");
}

fn served() -> Served {
    Served::start_with(|node, _| node.views = defs())
}

fn ingest(s: &Served, events: &[J]) -> http_support::Answer {
    let body: String = events.iter().map(|e| format!("{e}\n")).collect();
    post(&s.url("/v1/streams/s/events"), body)
}

#[test]
fn http_and_cli_show_the_lane_and_refuse_bad_queries() {
    let s = served();
    // Lateness is decided against the watermark before the batch, so the
    // event that moves the watermark goes first, in its own request.
    let first = ingest(&s, &[json!({"source":"c","seq":1,"time":T + 10 * MIN})]);
    assert_eq!(
        first.json,
        json!({"accepted":1,"duplicates":0,"late":0}),
        "{first:?}"
    );
    let a = ingest(&s, &[json!({"source":"c","seq":2,"time":T + 1_000})]);
    assert_eq!(
        a.json,
        json!({"accepted":1,"duplicates":0,"late":1}),
        "{a:?}"
    );
    let lane = get(&s.url("/v1/streams/s/late"));
    assert_eq!(lane.status, 200, "{lane:?}");
    assert_eq!(lane.json["stream"], json!("s"));
    let events = lane.json["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{}", lane.json);
    assert_eq!(events[0]["record"]["event"]["seq"], json!(2));
    assert_eq!(events[0]["record"]["views"], json!(["per_minute"]));

    let id = events[0]["id"].as_u64().expect("id");
    let after = get(&s.url(&format!("/v1/streams/s/late?after={id}")));
    assert_eq!(after.json["events"], json!([]));

    let unknown = get(&s.url("/v1/streams/nope/late"));
    assert_eq!((unknown.status, unknown.code()), (404, "stream_not_found"));
    for (q, param) in [
        ("?after=x", "query after"),
        ("?limit=0", "query limit"),
        ("?limit=1001", "query limit"),
    ] {
        let bad = get(&s.url(&format!("/v1/streams/s/late{q}")));
        assert_eq!((bad.status, bad.at()), (400, param), "{q}: {bad:?}");
    }

    let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["--url", &format!("http://{}", s.addr), "late", "s"])
        .stdin(Stdio::null())
        .output()
        .expect("run tidemark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("c/2"), "{stdout}");
    assert!(stdout.contains("per_minute"), "{stdout}");
    assert!(stdout.contains("behind_watermark"), "{stdout}");
    assert!(stdout.contains("dropped 0"), "{stdout}");
    s.stop();
}
