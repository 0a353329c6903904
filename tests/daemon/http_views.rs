//! Stream views through the daemon's surfaces: views declared as `[[views]]` TOML, events
//! ingested as NDJSON over HTTP, view rows read back over HTTP with exact values, windows,
//! finality and counters; retries change nothing, late events are reported and not applied,
//! a bad line is refused (line and field named) with nothing applied. Then the `tidemark`
//! binary: `serve --config` with views, `--print-config`, `tidemark view`.

use crate::daemon_support;
use crate::http_support;

use daemon_support::spawn_serve;
use http_support::{Served, get, post};
use serde_json::{Value as J, json};
use std::process::{Child, Command, Output, Stdio};
use tidemark::views::ViewDef;

/// 2026-11-29T10:00:00Z in epoch milliseconds: the start of a one-minute window.
const T: u64 = 1_795_946_400_000;

/// Two views of the `clicks` stream, in the config-file shape of API.md.
const VIEWS_TOML: &str = r#"
[[views]]
name = "clicks_per_page"
stream = "clicks"
kind = "count"
group_by = ["page"]

[[views]]
name = "amount_per_minute"
stream = "clicks"
kind = "sum"
field = "amount"
window = { tumbling = "1m", lateness = "10s" }
"#;

fn view_defs() -> Vec<ViewDef> {
    #[derive(serde::Deserialize)]
    struct File {
        views: Vec<ViewDef>,
    }
    toml::from_str::<File>(VIEWS_TOML)
        .expect("views TOML")
        .views
}

fn served() -> Served {
    Served::start_with(|node, _| node.views = view_defs())
}

fn ndjson(events: &[J]) -> String {
    events.iter().map(|e| format!("{e}\n")).collect()
}

fn ingest(s: &Served, events: &[J]) -> http_support::Answer {
    post(&s.url("/v1/streams/clicks/events"), ndjson(events))
}

/// `GET /v1/views/{view}?query`, asserting 200.
fn view(s: &Served, name: &str, query: &str) -> J {
    let a = get(&s.url(&format!("/v1/views/{name}{query}")));
    assert_eq!(a.status, 200, "{a:?}");
    a.json
}

/// The rows of a page as `(group, window_start, final, value)`.
fn rows(page: &J) -> Vec<(J, J, bool, J)> {
    page["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["group"].clone(),
                r["window_start"].clone(),
                r["final"].as_bool().expect("final"),
                r["value"].clone(),
            )
        })
        .collect()
}

fn sums(page: &J) -> Vec<(u64, J)> {
    rows(page)
        .into_iter()
        .map(|(_, start, _, v)| (start.as_u64().expect("window_start"), v))
        .collect()
}

fn counts(page: &J) -> Vec<(J, J)> {
    rows(page).into_iter().map(|(g, _, _, v)| (g, v)).collect()
}

#[test]
fn ingest_folds_into_views_exactly_once_and_late_events_are_reported() {
    let s = served();
    let batch = [
        json!({"source":"a","seq":1,"time":T + 1_000,"page":"/home","amount":5}),
        json!({"source":"a","seq":2,"time":"2026-11-29T10:00:30Z","page":"/home","amount":7}),
        json!({"source":"b","seq":1,"time":T + 61_000,"page":"/about","amount":2}),
    ];
    let a = ingest(&s, &batch);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json, json!({"accepted":3,"duplicates":0,"late":0}));

    let count = view(&s, "clicks_per_page", "");
    assert_eq!(
        counts(&count),
        vec![
            (json!({"page":"/about"}), json!(1)),
            (json!({"page":"/home"}), json!(2)),
        ]
    );
    assert_eq!(count["view"], "clicks_per_page");
    let sum = view(&s, "amount_per_minute", "");
    assert_eq!(sums(&sum), vec![(T, json!(12)), (T + 60_000, json!(2))]);
    let first = &sum["rows"][0];
    assert_eq!(first["window_end"], json!(T + 60_000));
    assert_eq!(sum["watermark"], json!(T + 61_000));

    // A retry of the same (source, seq) pairs changes nothing.
    let again = ingest(&s, &batch);
    assert_eq!(again.json, json!({"accepted":0,"duplicates":3,"late":0}));
    assert_eq!(counts(&view(&s, "clicks_per_page", "")), counts(&count));
    assert_eq!(
        sums(&view(&s, "amount_per_minute", "")),
        vec![(T, json!(12)), (T + 60_000, json!(2))]
    );

    // The watermark moves to T+200s; then an event for the first window (deadline T+70s) is
    // late: reported, not applied to that window. The unwindowed count view still takes it.
    let a = ingest(
        &s,
        &[json!({"source":"c","seq":1,"time":T + 200_000,"page":"/x","amount":1})],
    );
    assert_eq!(a.json, json!({"accepted":1,"duplicates":0,"late":0}));
    let a = ingest(
        &s,
        &[json!({"source":"c","seq":2,"time":T + 5_000,"page":"/home","amount":100})],
    );
    assert_eq!(
        a.json,
        json!({"accepted":1,"duplicates":0,"late":1}),
        "{a:?}"
    );
    let sum = view(&s, "amount_per_minute", "");
    assert_eq!(
        rows(&sum),
        vec![
            (json!({}), json!(T), true, json!(12)),
            (json!({}), json!(T + 60_000), true, json!(2)),
            (json!({}), json!(T + 180_000), false, json!(1)),
        ],
        "{sum}"
    );
    assert_eq!(sum["watermark"], json!(T + 200_000));
    assert_eq!(sum["cluster_watermark"], json!(T + 200_000));
    assert_eq!(
        sum["counters"],
        json!({"folded":4,"late":1,"rejected":0,"expired_dropped":0,"foreign_cells":0}),
        "{sum}"
    );
    assert_eq!(
        counts(&view(&s, "clicks_per_page", "")),
        vec![
            (json!({"page":"/about"}), json!(1)),
            (json!({"page":"/home"}), json!(3)),
            (json!({"page":"/x"}), json!(1)),
        ]
    );

    // Query parameters: a group, a time range (ms or RFC 3339), paging.
    let home = view(&s, "clicks_per_page", "?group.page=/home");
    assert_eq!(counts(&home), vec![(json!({"page":"/home"}), json!(3))]);
    let ranged = view(
        &s,
        "amount_per_minute",
        &format!("?from={}&to=2026-11-29T10:02:00Z", T + 60_000),
    );
    assert_eq!(sums(&ranged), vec![(T + 60_000, json!(2))]);
    let page1 = view(&s, "amount_per_minute", "?limit=2");
    assert_eq!(sums(&page1).len(), 2);
    let next = page1["next"].as_str().expect("next cursor");
    let page2 = view(
        &s,
        "amount_per_minute",
        &format!("?limit=2&after={}", encode(next)),
    );
    assert_eq!(sums(&page2), vec![(T + 180_000, json!(1))]);
    assert_eq!(page2["next"], J::Null);
}

/// Percent-encodes a query value.
#[test]
fn key_listings_hide_the_views_internal_keys_unless_asked() {
    let s = served();
    let events: Vec<J> = (1..=30)
        .map(|i| json!({"source":"a","seq":i,"time":T + i * 1_000,"page":format!("/p{i}"),"amount":1}))
        .collect();
    assert_eq!(ingest(&s, &events).status, 200);
    // Client keys on both sides of `~` in byte order (`é` sorts after it).
    let ops = r#"[{"type":"gcounter","key":"a","op":"inc"},{"type":"gcounter","key":"zz","op":"inc"},{"type":"gcounter","key":"é","op":"inc"}]"#;
    assert_eq!(post(&s.url("/v1/ops"), ops).status, 200);
    let names = |query: &str| -> (Vec<String>, J) {
        let a = get(&s.url(&format!("/v1/keys?type=gcounter{query}")));
        assert_eq!(a.status, 200, "{a:?}");
        let names = a.json["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|k| k["key"].as_str().expect("name").to_owned())
            .collect();
        (names, a.json["next"].clone())
    };
    assert_eq!(
        names(""),
        (vec!["a".into(), "zz".into(), "é".into()], J::Null)
    );
    // Paged two at a time, the internal keys in between never show nor end a page early.
    let (page, next) = names("&limit=2");
    assert_eq!(page, vec!["a".to_owned(), "zz".to_owned()]);
    let (rest, end) = names(&format!(
        "&limit=2&after={}",
        encode(next.as_str().expect("next"))
    ));
    assert_eq!((rest, end), (vec!["é".to_owned()], J::Null));
    // Asked for, they are there (the count view's cells are gcounters).
    let (all, _) = names("&internal=true&limit=1000");
    assert!(all.len() > 3, "{all:?}");
    assert!(all.iter().any(|n| n.starts_with("~view/")), "{all:?}");
    // A view cursor mangled the way a shell mangles it unquoted is refused, not followed.
    let page = view(&s, "clicks_per_page", "?limit=2");
    let next = page["next"].as_str().expect("a next cursor").to_owned();
    let mangled = next.replace('"', "");
    assert_ne!(mangled, next);
    let a = get(&s.url(&format!(
        "/v1/views/clicks_per_page?after={}",
        encode(&mangled)
    )));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_query", "query after"),
        "{a:?}"
    );
    // Valid JSON but not a cursor as pages give them: another spelling of the same value, the
    // wrong number of group values. Each would page from elsewhere.
    let (prefix, group) = next
        .split_once("/-/")
        .expect("a cell of an unwindowed view");
    let prefix = format!("{prefix}/-");
    for other in [
        format!("{prefix}/{}", group.replace('/', "\\u002f")),
        format!("{prefix}/{}", group.replacen('[', "[ ", 1)),
        format!("{prefix}/{}", group.replacen(']', ",2]", 1)),
        format!("{prefix}/[]"),
    ] {
        assert_ne!(other, next);
        let a = get(&s.url(&format!(
            "/v1/views/clicks_per_page?after={}",
            encode(&other)
        )));
        assert_eq!(
            (a.status, a.code()),
            (400, "invalid_query"),
            "{other}: {a:?}"
        );
    }
    let followed = view(&s, "clicks_per_page", &format!("?after={}", encode(&next)));
    assert_eq!(counts(&followed).len(), 28);
    let bad = get(&s.url("/v1/keys?internal=maybe"));
    assert_eq!(
        (bad.status, bad.code(), bad.at()),
        (400, "invalid_query", "query internal"),
        "{bad:?}"
    );
}

fn encode(text: &str) -> String {
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

#[test]
fn bad_lines_and_queries_are_named_and_apply_nothing() {
    let s = served();
    // Line 2 lacks the sum view's value field: the whole batch is refused.
    let a = ingest(
        &s,
        &[
            json!({"source":"a","seq":1,"time":T,"page":"/home","amount":5}),
            json!({"source":"a","seq":2,"time":T,"page":"/home"}),
            json!({"source":"a","seq":3,"time":T,"page":"/home","amount":1}),
        ],
    );
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(
        (a.code(), a.at()),
        ("invalid_event", "line 2, field amount"),
        "{a:?}"
    );
    assert_eq!(a.json["committed"]["accepted"], 0);
    // A malformed time is refused while parsing, naming the line and field.
    let a = ingest(
        &s,
        &[
            json!({"source":"a","seq":1,"time":T,"page":"/home","amount":5}),
            json!({"source":"a","seq":2,"time":"yesterday","page":"/home","amount":5}),
        ],
    );
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_event", "line 2, field time"),
        "{a:?}"
    );
    for name in ["clicks_per_page", "amount_per_minute"] {
        let page = view(&s, name, "");
        assert_eq!(rows(&page), vec![], "{name}: {page}");
        assert_eq!(page["counters"]["folded"], 0, "{page}");
    }
    // Nothing was marked applied either: the same events are accepted afterwards.
    let a = ingest(
        &s,
        &[json!({"source":"a","seq":1,"time":T,"page":"/home","amount":5})],
    );
    assert_eq!(a.json, json!({"accepted":1,"duplicates":0,"late":0}));

    let missing = get(&s.url("/v1/views/nope"));
    assert_eq!((missing.status, missing.code()), (404, "view_not_found"));
    for (query, param) in [
        ("?limit=abc", "query limit"),
        ("?from=yesterday", "query from"),
        ("?group.user=x", "query group.user"),
        ("?colour=red", "query colour"),
        // A group field given twice is refused, not read as no group at all.
        ("?group.page=/home&group.page=/other", "query group.page"),
        ("?group.page=/home&group.page=/home", "query group.page"),
    ] {
        let a = get(&s.url(&format!("/v1/views/clicks_per_page{query}")));
        assert_eq!(
            (a.status, a.code(), a.at()),
            (400, "invalid_query", param),
            "{query}: {a:?}"
        );
    }
}

const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run tidemark")
}

fn text(o: &Output) -> (Option<i32>, String, String) {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A `tidemark serve` child; killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn cli_serves_views_from_the_config_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tidemark.toml");
    std::fs::write(&config, VIEWS_TOML).expect("write config");
    let config = config.to_str().expect("utf-8 path");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8 path");
    let base = [
        "serve",
        "--config",
        config,
        "--data",
        data,
        "--http",
        "127.0.0.1:0",
        "--peer-listen",
        "127.0.0.1:0",
    ];

    let (code, printed, err) = text(&run(&[&base[..], &["--print-config"]].concat()));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        printed.contains("[[views]]") && printed.contains("name = \"amount_per_minute\""),
        "{printed}"
    );

    // A bad view is refused at start, naming the view and the field.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        VIEWS_TOML.replace("kind = \"sum\"", "kind = \"average\""),
    )
    .expect("write");
    let bad = bad.to_str().expect("utf-8 path");
    let (code, _, err) = text(&run(&["serve", "--config", bad, "--print-config"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("views[1].kind") && err.contains("amount_per_minute"),
        "{err}"
    );
    let bad2 = dir.path().join("bad2.toml");
    std::fs::write(&bad2, VIEWS_TOML.replace("\"1m\"", "\"1 minute\"")).expect("write");
    let bad2 = bad2.to_str().expect("utf-8 path");
    let (code, _, err) = text(&run(&["serve", "--config", bad2, "--print-config"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("amount_per_minute") && err.contains("window.tumbling"),
        "{err}"
    );

    let (child, url, _) = spawn_serve(&base[1..]);
    let daemon = Daemon(child);
    let a = post(
        &format!("{url}/v1/streams/clicks/events"),
        ndjson(&[
            json!({"source":"a","seq":1,"time":"2026-11-29T10:00:01Z","page":"/home","amount":5}),
            json!({"source":"a","seq":2,"time":"2026-11-29T10:01:30Z","page":"/home","amount":3}),
        ]),
    );
    assert_eq!(
        a.json,
        json!({"accepted":2,"duplicates":0,"late":0}),
        "{a:?}"
    );

    let (code, out, err) = text(&run(&[
        "--url",
        &url,
        "--json",
        "view",
        "amount_per_minute",
    ]));
    assert_eq!(code, Some(0), "{err}");
    let page: J = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(sums(&page), vec![(T, json!(5)), (T + 60_000, json!(3))]);

    let (code, out, err) = text(&run(&["--url", &url, "view", "amount_per_minute"]));
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("GROUP"), "{out}");
    assert!(
        lines[1].contains("2026-11-29T10:00:00Z")
            && lines[1].contains("2026-11-29T10:01:00Z")
            && lines[1].trim_end().ends_with('5'),
        "{out}"
    );
    assert!(out.contains("watermark 2026-11-29T10:01:30Z"), "{out}");

    let (code, out, err) = text(&run(&[
        "--url",
        &url,
        "view",
        "clicks_per_page",
        "--group",
        "page=/home",
    ]));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("page=/home") && l.trim_end().ends_with('2')),
        "{out}"
    );

    let (code, _, err) = text(&run(&["--url", &url, "view", "nope"]));
    assert_eq!(code, Some(1));
    assert!(err.contains("view_not_found"), "{err}");
    drop(daemon);
}

/// `tidemark_writes_total{result="applied"}` counts what clients wrote (one per event), not
/// the view cells and watermarks the events became.
#[test]
fn writes_count_events_not_view_mutations() {
    let s = served();
    let events: Vec<J> = (1..=3)
        .map(|i| json!({"source":"w","seq":i,"time":T + i * 1_000,"page":format!("/p{i}"),"amount":1}))
        .collect();
    assert_eq!(ingest(&s, &events).status, 200);
    // A retry is a duplicate, not a write.
    assert_eq!(ingest(&s, &events[..1]).status, 200);
    let m = get(&s.url("/metrics")).text;
    assert!(
        m.contains("tidemark_writes_total{result=\"applied\"} 3\n"),
        "{m}"
    );
    assert!(
        m.contains("tidemark_writes_total{result=\"duplicate\"} 1\n"),
        "{m}"
    );
}

/// `tidemark_writes_total{result="rejected"}` counts every write of a refused request: a batch
/// refused for one bad event counts each of its events, a line that is no event counts itself
/// and the uncommitted lines before it, a refused ops batch counts its ops up to the bad one.
/// A stream name in the node's own namespace (`~...`) is refused.
#[test]
fn refused_writes_count_every_write_of_the_refused_request() {
    let s = served();
    let rejected = || {
        let m = get(&s.url("/metrics")).text;
        m.lines()
            .find_map(|l| l.strip_prefix("tidemark_writes_total{result=\"rejected\"} "))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap_or(0))
    };
    assert_eq!(rejected(), 0);
    // Three events, the second without its group field: the batch is refused whole.
    let a = ingest(
        &s,
        &[
            json!({"source":"r","seq":1,"time":T,"page":"/a","amount":1}),
            json!({"source":"r","seq":2,"time":T,"amount":1}),
            json!({"source":"r","seq":3,"time":T,"page":"/c","amount":1}),
        ],
    );
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(rejected(), 3);
    // Two good lines, then one that is not JSON: three refused, nothing committed.
    let body = format!(
        "{}\n{}\nnot json\n",
        json!({"source":"r","seq":4,"time":T,"page":"/a","amount":1}),
        json!({"source":"r","seq":5,"time":T,"page":"/a","amount":1}),
    );
    let a = post(&s.url("/v1/streams/clicks/events"), body);
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(rejected(), 6);
    // Four ops, the third a decrement of a grow-only counter: ops 0..=2 refused.
    let a = post(
        &s.url("/v1/ops"),
        json!([
            {"type":"gcounter","key":"a","op":"inc","by":1},
            {"type":"gcounter","key":"b","op":"inc","by":1},
            {"type":"gcounter","key":"c","op":"dec","by":1},
            {"type":"gcounter","key":"d","op":"inc","by":1},
        ])
        .to_string(),
    );
    assert_eq!((a.status, a.at()), (409, "index 2, field op"), "{a:?}");
    assert_eq!(rejected(), 9);
    // Refused while the body is parsed: a negative amount at index 3 refuses ops 0..=3.
    let a = post(
        &s.url("/v1/ops"),
        json!([
            {"type":"gcounter","key":"a","op":"inc","by":1},
            {"type":"gcounter","key":"b","op":"inc","by":1},
            {"type":"gcounter","key":"c","op":"inc","by":1},
            {"type":"gcounter","key":"d","op":"inc","by":-1},
        ])
        .to_string(),
    );
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(rejected(), 13);
    // Two lines of NDJSON ops, the second not JSON: both refused.
    let a = post(
        &s.url("/v1/ops"),
        format!(
            "{}\nnot json\n",
            json!({"type":"gcounter","key":"a","op":"inc","by":1})
        ),
    );
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(rejected(), 15);
    // NDJSON ops whose third line does not apply to its type: lines 1..=3 refused.
    let good = json!({"type":"gcounter","key":"a","op":"inc","by":1});
    let bad = json!({"type":"gcounter","key":"a","op":"add","value":1});
    let a = post(
        &s.url("/v1/ops"),
        format!("{good}\n{good}\n{bad}\n{good}\n"),
    );
    assert_eq!((a.status, a.at()), (409, "line 3, field op"), "{a:?}");
    assert_eq!(rejected(), 18);
    assert_eq!(get(&s.url("/v1/keys/gcounter/a")).status, 404);
    // The node's own namespace is no stream.
    for stream in ["~wm", "~view", "~x"] {
        let a = post(
            &s.url(&format!("/v1/streams/{stream}/events")),
            format!("{}\n", json!({"source":"r","seq":9,"ops":[]})),
        );
        assert_eq!(
            (a.status, a.code(), a.at()),
            (400, "invalid_stream", "path stream"),
            "{stream}: {a:?}"
        );
    }
}

/// Definitions that group by `.`, `..` or a field twice are refused at open, naming the field.
#[test]
fn group_by_refuses_dot_fields_and_repeats() {
    for (group_by, named) in [
        (vec!["."], "\".\""),
        (vec![".."], "\"..\""),
        (vec!["page", "user", "page"], "\"page\" is listed twice"),
        (vec!["page", "Page"], "\"Page\" is listed twice"),
    ] {
        let def: ViewDef = serde_json::from_value(json!({
            "name": "v", "stream": "s", "kind": "count", "group_by": group_by,
        }))
        .expect("def");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = tidemark::NodeConfig::new(dir.path());
        config.views = vec![def];
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let e = rt
            .block_on(tidemark::Node::open(config))
            .err()
            .unwrap_or_else(|| panic!("{group_by:?} accepted"))
            .to_string();
        assert!(e.contains("view \"v\", field `group_by`"), "{e}");
        assert!(e.contains(named), "{group_by:?}: {e}");
    }
}
