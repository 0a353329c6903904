//! Stream views on one node: exact values per kind and window, idempotent retries,
//! late events counted and not applied, finality by the watermark, the watermark surviving a
//! restart, validation errors naming the view/event and the field.

use serde_json::json;
use tidemark::views::{Event, ViewDef, ViewPage, ViewQuery, ViewRow};
use tidemark::{Error, Node, NodeConfig};

const MIN: u64 = 60_000;

fn views() -> Vec<ViewDef> {
    let defs = json!([
        {"name": "clicks", "stream": "s", "kind": "count", "group_by": ["page"],
         "window": {"tumbling": "1m", "lateness": "30s"}},
        {"name": "spend", "stream": "s", "kind": "sum", "group_by": ["page"], "field": "amount",
         "window": {"tumbling": "1m", "lateness": "30s"}},
        {"name": "users", "stream": "s", "kind": "distinct", "group_by": ["page"], "field": "user",
         "window": {"tumbling": "1m", "lateness": "30s"}},
        {"name": "last_user", "stream": "s", "kind": "latest", "group_by": ["page"], "field": "user"},
        {"name": "online", "stream": "s", "kind": "members", "field": "user",
         "add_when": {"field": "kind", "equals": "join"},
         "remove_when": {"field": "kind", "equals": "leave"}},
        {"name": "rolling", "stream": "s", "kind": "count",
         "window": {"hopping": {"size": "2m", "every": "1m"}, "lateness": "30s"}},
    ]);
    serde_json::from_value(defs).expect("defs parse")
}

fn ev(seq: u64, t: u64, fields: serde_json::Value) -> Event {
    Event::new("src", seq, fields).at(t)
}

async fn open(dir: &std::path::Path) -> Node {
    let mut cfg = NodeConfig::new(dir);
    cfg.views = views();
    Node::open(cfg).await.expect("open")
}

async fn read(node: &Node, view: &str) -> ViewPage {
    node.view(view, &ViewQuery::default()).await.expect("view")
}

/// `(window_start, group, value, final)` per row.
fn cells(page: &ViewPage) -> Vec<(Option<u64>, serde_json::Value, serde_json::Value, bool)> {
    page.rows
        .iter()
        .map(|r: &ViewRow| {
            (
                r.window_start,
                serde_json::Value::Object(r.group.clone()),
                r.value.clone(),
                r.is_final,
            )
        })
        .collect()
}

fn batch() -> Vec<Event> {
    vec![
        ev(
            1,
            10_000,
            json!({"page": "/a", "amount": 5, "user": "ann", "kind": "join"}),
        ),
        ev(
            2,
            20_000,
            json!({"page": "/a", "amount": -2, "user": "bob", "kind": "join"}),
        ),
        ev(
            3,
            5_000,
            json!({"page": "/b", "amount": 7, "user": "ann", "kind": "leave"}),
        ),
        ev(
            4,
            MIN + 1,
            json!({"page": "/a", "amount": 1, "user": "ann"}),
        ),
        ev(5, 15_000, json!({"page": "/a", "amount": 0, "user": "cy"})),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_values_per_kind_and_window_and_retries_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let out = node.ingest("s", batch()).await.expect("ingest");
    assert_eq!((out.applied, out.duplicates, out.late), (5, 0, 0));
    let expect_all = async |node: &Node| {
        let c = cells(&read(node, "clicks").await);
        assert_eq!(
            c,
            vec![
                (Some(0), json!({"page": "/a"}), json!(3), false),
                (Some(0), json!({"page": "/b"}), json!(1), false),
                (Some(MIN), json!({"page": "/a"}), json!(1), false),
            ]
        );
        let s = cells(&read(node, "spend").await);
        assert_eq!(s[0].2, json!(3)); // 5 - 2 + 0
        assert_eq!(s[1].2, json!(7));
        assert_eq!(s[2].2, json!(1));
        let u = cells(&read(node, "users").await);
        assert_eq!(u[0].2, json!(["ann", "bob", "cy"]));
        assert_eq!(u[1].2, json!(["ann"]));
        // Latest by event time: seq 4 (t = 1m+1) for /a, not seq 5 that came last.
        let l = cells(&read(node, "last_user").await);
        assert_eq!(
            l,
            vec![
                (None, json!({"page": "/a"}), json!("ann"), false),
                (None, json!({"page": "/b"}), json!("ann"), false),
            ]
        );
        // ann joined then left (in batch order), bob joined.
        let m = cells(&read(node, "online").await);
        assert_eq!(m, vec![(None, json!({}), json!(["bob"]), false)]);
        // Hopping 2m every 1m: windows [-1m..1m) clipped at 0 → start 0 holds events < 2m,
        // start 1m holds the event at 1m+1 only.
        let r = cells(&read(node, "rolling").await);
        assert_eq!(
            r.iter().map(|c| (c.0, c.2.clone())).collect::<Vec<_>>(),
            vec![(Some(0), json!(5)), (Some(MIN), json!(1))]
        );
    };
    expect_all(&node).await;
    // A retry of the whole batch (and a partial one) changes no view.
    let out = node.ingest("s", batch()).await.expect("retry");
    assert_eq!((out.applied, out.duplicates, out.late), (0, 5, 0));
    let out = node
        .ingest("s", batch()[1..3].to_vec())
        .await
        .expect("retry");
    assert_eq!(out.duplicates, 2);
    expect_all(&node).await;
    assert_eq!(read(&node, "clicks").await.counters.folded, 5);
    // Views survive a restart exactly.
    node.shutdown().await.expect("shutdown");
    drop(node);
    let node = open(dir.path()).await;
    expect_all(&node).await;
    node.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_events_are_counted_not_applied_and_windows_become_final() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let page = |p: &str| json!({"page": p, "amount": 1, "user": "u"});
    node.ingest("s", vec![ev(1, 10_000, page("/a"))])
        .await
        .expect("ingest");
    // Watermark 10 s: window [0, 1m) with lateness 30 s is open.
    let c = read(&node, "clicks").await;
    assert_eq!(c.watermark, Some(10_000));
    assert_eq!(c.cluster_watermark, Some(10_000));
    assert!(!c.rows[0].is_final);
    // Watermark to exactly the deadline 1m30s: still accepted, still not final.
    node.ingest("s", vec![ev(2, 90_000, page("/x"))])
        .await
        .expect("ingest");
    let out = node
        .ingest("s", vec![ev(3, 59_999, page("/a"))])
        .await
        .expect("ingest");
    assert_eq!(out.late, 0);
    assert!(!read(&node, "clicks").await.rows[0].is_final);
    // Watermark past the deadline: the window is final; events for it are late.
    node.ingest("s", vec![ev(4, 90_001, page("/x"))])
        .await
        .expect("ingest");
    let c = read(&node, "clicks").await;
    assert_eq!(c.rows[0].value, json!(2));
    assert!(c.rows[0].is_final, "{c:?}");
    let out = node
        .ingest(
            "s",
            vec![ev(5, 1_000, page("/a")), ev(6, 61_000, page("/a"))],
        )
        .await
        .expect("ingest");
    assert_eq!((out.applied, out.late), (2, 1));
    let c = read(&node, "clicks").await;
    assert_eq!(c.rows[0].value, json!(2), "a final window never changes");
    assert_eq!(c.counters.late, 1);
    // The unwindowed views still took the late event (they are never late).
    let m = read(&node, "last_user").await;
    assert_eq!(m.counters.late, 0);
    // The late event is marked: its retry is a duplicate, not late again.
    let out = node
        .ingest("s", vec![ev(5, 1_000, page("/a"))])
        .await
        .expect("retry");
    assert_eq!((out.duplicates, out.late), (1, 0));
    // The watermark survives a restart: the window stays final and late events stay late.
    node.shutdown().await.expect("shutdown");
    drop(node);
    let node = open(dir.path()).await;
    let out = node
        .ingest("s", vec![ev(7, 2_000, page("/a"))])
        .await
        .expect("ingest");
    assert_eq!(out.late, 1);
    let c = read(&node, "clicks").await;
    assert_eq!(c.watermark, Some(90_001));
    assert!(c.rows[0].is_final);
    assert_eq!(c.rows[0].value, json!(2));
    node.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_events_name_the_event_and_field_and_apply_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = open(dir.path()).await;
    let good = ev(1, 1, json!({"page": "/a", "amount": 1, "user": "u"}));
    let cases = [
        (json!({"amount": 1, "user": "u"}), "page"),
        (json!({"page": "/a", "user": "u"}), "amount"),
        (json!({"page": "/a", "amount": "x", "user": "u"}), "amount"),
        (json!({"page": "/a", "amount": 1, "user": {"o": 1}}), "user"),
    ];
    for (fields, field) in cases {
        let bad = Event::new("src", 2, fields).at(2);
        match node.ingest("s", vec![good.clone(), bad]).await {
            Err(Error::InvalidEvent {
                index: 1, field: f, ..
            }) => assert_eq!(f, field),
            other => panic!("expected invalid event 1 field {field}: {other:?}"),
        }
    }
    let mut bad_time = good.clone();
    bad_time.seq = 3;
    bad_time.time = Some(json!("yesterday"));
    match node.ingest("s", vec![good.clone(), bad_time]).await {
        Err(Error::InvalidEvent {
            index: 1, field, ..
        }) => assert_eq!(field, "time"),
        other => panic!("expected invalid time: {other:?}"),
    }
    // Nothing of the rejected batches was applied: the good event is new.
    assert!(read(&node, "clicks").await.rows.is_empty());
    // Five refused batches of two events: every event of them counts, in every view.
    assert_eq!(read(&node, "clicks").await.counters.rejected, 10);
    let out = node.ingest("s", vec![good]).await.expect("ingest");
    assert_eq!(out.applied, 1);
    // RFC 3339 times work; plain ops cannot touch view keys.
    let t = Event {
        time: Some(json!("1970-01-01T00:01:00.500+00:00")),
        ..Event::new("src", 9, json!({"page": "/t", "amount": 1, "user": "u"}))
    };
    node.ingest("s", vec![t]).await.expect("ingest");
    let rows = read(&node, "clicks").await.rows;
    assert!(rows.iter().any(|r| r.window_start == Some(MIN)));
    let err = node
        .apply(tidemark::Op::inc_gcounter("~view/clicks/x", 1))
        .await
        .expect_err("reserved");
    assert!(err.to_string().contains("reserved"), "{err}");
    node.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_definitions_are_validated_with_the_view_and_field_named() {
    let cases = [
        (
            json!({"name": "a/b", "stream": "s", "kind": "count"}),
            "\"a/b\", field `name`",
        ),
        (
            json!({"name": "v", "stream": "s", "kind": "sum"}),
            "\"v\", field `field`",
        ),
        (
            json!({"name": "v", "stream": "s", "kind": "count", "field": "x"}),
            "\"v\", field `field`",
        ),
        (
            json!({"name": "v", "stream": "s", "kind": "members", "field": "u",
                   "add_when": {"field": "k", "equals": "j"}}),
            "\"v\", field `remove_when`",
        ),
        (
            json!({"name": "v", "stream": "s", "kind": "count", "window": {"tumbling": "1x"}}),
            "\"v\", field `window.tumbling`",
        ),
        (
            json!({"name": "v", "stream": "s", "kind": "count",
                   "window": {"hopping": {"size": "1m", "every": "2m"}}}),
            "\"v\", field `window.hopping.every`",
        ),
        (
            json!({"name": "v", "stream": "s", "kind": "count",
                   "window": {"tumbling": "1m", "lateness": "soon"}}),
            "\"v\", field `window.lateness`",
        ),
        (
            json!({"name": "v", "stream": "s", "kind": "count", "group_by": ["seq"]}),
            "\"v\", field `group_by`",
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (def, expected) in cases {
        let mut cfg = NodeConfig::new(dir.path());
        cfg.views = vec![serde_json::from_value(def).expect("shape")];
        let err = Node::open(cfg).await.expect_err("invalid view");
        assert!(
            matches!(err, Error::Config(_)) && err.to_string().contains(expected),
            "{err} should name {expected}"
        );
    }
    // Two views with one name.
    let mut cfg = NodeConfig::new(dir.path());
    cfg.views = vec![views()[0].clone(), views()[0].clone()];
    let err = Node::open(cfg).await.expect_err("duplicate");
    assert!(err.to_string().contains("defined twice"), "{err}");
    // Unknown keys in a definition are refused by its shape.
    let unknown = serde_json::from_value::<ViewDef>(
        json!({"name": "v", "stream": "s", "kind": "count", "windw": {}}),
    );
    assert!(unknown.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_filters_and_retention() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = NodeConfig::new(dir.path());
    cfg.views = serde_json::from_value(json!([
        {"name": "c", "stream": "s", "kind": "count", "group_by": ["page"],
         "window": {"tumbling": "1m", "retention": "5m"}},
    ]))
    .expect("defs");
    let node = Node::open(cfg).await.expect("open");
    let mut events = Vec::new();
    for (i, (t, p)) in [
        (0, "/a"),
        (1, "/b"),
        (MIN, "/a"),
        (2 * MIN, "/a"),
        (2 * MIN, "/b"),
    ]
    .into_iter()
    .enumerate()
    {
        events.push(ev(i as u64, t, json!({"page": p})));
    }
    node.ingest("s", events).await.expect("ingest");
    // Paging one row at a time visits every row once, in order.
    let mut seen = Vec::new();
    let mut q = ViewQuery {
        limit: 2,
        ..Default::default()
    };
    loop {
        let page = node.view("c", &q).await.expect("view");
        seen.extend(page.rows.iter().map(|r| (r.window_start, r.group.clone())));
        match page.next {
            Some(n) => q.after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen.len(), 5);
    // Group and time filters.
    let q = ViewQuery {
        group: json!({"page": "/a"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        from: Some(MIN),
        ..Default::default()
    };
    let rows = node.view("c", &q).await.expect("view").rows;
    assert_eq!(
        rows.iter().map(|r| r.window_start).collect::<Vec<_>>(),
        vec![Some(MIN), Some(2 * MIN)]
    );
    // Windows whose end is more than 5 minutes before the watermark are gone from reads.
    node.ingest("s", vec![ev(9, 7 * MIN + 1, json!({"page": "/z"}))])
        .await
        .expect("ingest");
    let starts: Vec<_> = node
        .view("c", &ViewQuery::default())
        .await
        .expect("view")
        .rows
        .iter()
        .map(|r| r.window_start)
        .collect();
    assert_eq!(starts, vec![Some(2 * MIN), Some(2 * MIN), Some(7 * MIN)]);
    // Unknown views are an error.
    assert!(node.view("nope", &ViewQuery::default()).await.is_err());
    node.shutdown().await.expect("shutdown");
}
