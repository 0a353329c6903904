//! Contract tests of every route of API.md: success shapes, each error code with the index,
//! line or field named, nothing applied from a rejected batch, 401/413/429, and server-sent
//! events delivering every change in order per key.

use crate::http_support;

use http_support::{Served, get, get_auth, post, post_auth, request, value};
use serde_json::{Value as J, json};
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

#[test]
fn ops_json_array_and_ndjson_apply_durably_and_read_back() {
    let s = Served::start();
    let a = post(
        &s.url("/v1/ops"),
        json!([
            {"type":"gcounter","key":"visits","op":"inc","by":3},
            {"type":"pncounter","key":"stock","op":"dec","by":2},
            {"type":"orset","key":"online","op":"add","value":"alice"},
            {"type":"orset","key":"online","op":"add","value":7},
            {"type":"lww","key":"config","op":"set","value":{"mode":"fast"}},
            {"type":"mvreg","key":"doc","op":"set","value":"draft 2"}
        ])
        .to_string(),
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json, json!({"applied": 6, "duplicates": 0}));
    let ndjson = "{\"type\":\"gcounter\",\"key\":\"visits\",\"op\":\"inc\"}\n\n\
                  {\"type\":\"orset\",\"key\":\"online\",\"op\":\"remove\",\"value\":7}\n";
    let a = post(&s.url("/v1/ops"), ndjson);
    assert_eq!(a.json, json!({"applied": 2, "duplicates": 0}), "{a:?}");
    assert_eq!(value(&s, "gcounter", "visits"), json!(4));
    assert_eq!(value(&s, "pncounter", "stock"), json!(-2));
    assert_eq!(value(&s, "orset", "online"), json!(["alice"]));
    assert_eq!(value(&s, "lww", "config"), json!({"mode":"fast"}));
    assert_eq!(value(&s, "mvreg", "doc"), json!(["draft 2"]));
    let one = get(&s.url("/v1/keys/gcounter/visits"));
    assert_eq!(
        one.json,
        json!({"type":"gcounter","key":"visits","value":4})
    );
    // Idempotent ops: a retry with the same (source, seq) is a no-op.
    let op = json!([{"type":"gcounter","key":"once","op":"inc","by":5,"source":"app","seq":1}]);
    assert_eq!(post(&s.url("/v1/ops"), op.to_string()).json["applied"], 1);
    let again = post(&s.url("/v1/ops"), op.to_string());
    assert_eq!(again.json, json!({"applied": 0, "duplicates": 1}));
    assert_eq!(value(&s, "gcounter", "once"), json!(5));
    // Delete of a set.
    let del = post(
        &s.url("/v1/ops"),
        r#"[{"type":"orset","key":"online","op":"delete"}]"#,
    );
    assert_eq!(del.status, 200);
    // A deleted key holds nothing: 404, like one never written.
    http_support::missing(&s, "orset", "online");
    // Names with '/' and non-ASCII bytes round-trip through the path.
    let name = "a/b c/é";
    let w = post(
        &s.url("/v1/ops"),
        json!([{"type":"lww","key":name,"op":"set","value":1}]).to_string(),
    );
    assert_eq!(w.status, 200);
    let read = get(&s.url("/v1/keys/lww/a/b%20c/%C3%A9"));
    assert_eq!(read.json["key"], name, "{read:?}");
    assert_eq!(read.json["value"], 1);
    // The HTTP layer is thin: the embedded API sees the same state.
    assert_eq!(
        s.node
            .get(&tidemark::Key::new(tidemark::KeyKind::GCounter, "visits"))
            .ok(),
        Some(tidemark::Value::GCounter(4))
    );
}

/// Sends `body` to /v1/ops and checks status, code and `at`; then that nothing was applied.
fn rejected(s: &Served, body: &str, status: u16, code: &str, at: &str) {
    let a = post(&s.url("/v1/ops"), body);
    assert_eq!((a.status, a.code(), a.at()), (status, code, at), "{a:?}");
    assert!(
        a.json["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    // The key was never written: the node holds nothing for it.
    http_support::missing(s, "gcounter", "untouched");
}

#[test]
fn rejected_batches_name_the_fault_and_apply_nothing() {
    let s = Served::start_with(|n, _| n.limits.value_bytes_max = 64);
    let inc = r#"{"type":"gcounter","key":"untouched","op":"inc","by":1}"#;
    rejected(
        &s,
        &format!(r#"[{inc},{inc},{{"type":"gcounter","key":"x","op":"inc","by":0}}]"#),
        400,
        "invalid_op",
        "index 2, field by",
    );
    rejected(
        &s,
        &format!(r#"[{inc},{{"type":"gcounter","key":"x","op":"add","value":"a"}}]"#),
        409,
        "type_mismatch",
        "index 1, field op",
    );
    rejected(
        &s,
        &format!(r#"[{inc},{{"type":"pncounter","key":"x","op":"delete"}}]"#),
        409,
        "counter_not_deletable",
        "index 1, field op",
    );
    rejected(
        &s,
        &format!(r#"[{inc},{{"type":"sparkles","key":"x","op":"inc"}}]"#),
        400,
        "invalid_op",
        "index 1, field type",
    );
    rejected(
        &s,
        &format!(r#"[{inc},{{"type":"gcounter","key":"x","op":"inc","colour":"red"}}]"#),
        400,
        "invalid_op",
        "index 1, field colour",
    );
    rejected(
        &s,
        &format!(r#"[{inc},{{"type":"gcounter","key":"x","op":"inc","by":"two"}}]"#),
        400,
        "invalid_op",
        "index 1, field by",
    );
    rejected(
        &s,
        &format!(
            r#"[{inc},{{"type":"lww","key":"x","op":"set","value":"{}"}}]"#,
            "v".repeat(100)
        ),
        413,
        "too_large",
        "index 1, field value",
    );
    rejected(
        &s,
        &format!("[{inc},"),
        400,
        "invalid_json",
        "line 1, column 57",
    );
    rejected(
        &s,
        &format!("{inc}\n{inc}\n{{\"type\": oops}}\n"),
        400,
        "invalid_json",
        "line 3, column 10",
    );
    rejected(
        &s,
        &format!("{inc}\n\n{{\"type\":\"orset\",\"key\":\"x\",\"op\":\"add\"}}\n"),
        400,
        "invalid_op",
        "line 3, field value",
    );
    rejected(&s, "  ", 400, "empty_body", "");
}

#[test]
fn body_and_header_limits_answer_413() {
    let s = Served::start_with(|_, h| {
        h.body_bytes_max = 1024;
        h.header_bytes_max = 2048;
    });
    let big = format!(
        "[{}]",
        vec![r#"{"type":"gcounter","key":"untouched","op":"inc"}"#; 40].join(",")
    );
    let a = post(&s.url("/v1/ops"), &big);
    assert_eq!((a.status, a.code()), (413, "body_too_large"), "{a:?}");
    http_support::missing(&s, "gcounter", "untouched");
    let a = http_support::get_auth(&s.url("/v1/keys"), Some(&"t".repeat(4000)));
    assert_eq!((a.status, a.code()), (413, "headers_too_large"), "{a:?}");
}

#[test]
fn keys_are_listed_in_pages_with_a_cursor() {
    let s = Served::start();
    let mut ops = Vec::new();
    for name in ["a1", "a2", "a3", "b1"] {
        ops.push(json!({"type":"gcounter","key":name,"op":"inc"}));
    }
    ops.push(json!({"type":"orset","key":"a4","op":"add","value":"x"}));
    assert_eq!(
        post(&s.url("/v1/ops"), J::from(ops).to_string()).status,
        200
    );
    // Every type, pages of two, following `next` to the end.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let url = match &after {
            Some(a) => s.url(&format!("/v1/keys?prefix=a&limit=2&after={a}")),
            None => s.url("/v1/keys?prefix=a&limit=2"),
        };
        let page = get(&url);
        assert_eq!(page.status, 200, "{page:?}");
        for k in page.json["keys"].as_array().cloned().unwrap_or_default() {
            seen.push(format!(
                "{}/{}={}",
                k["type"].as_str().unwrap_or(""),
                k["key"].as_str().unwrap_or(""),
                k["value"]
            ));
        }
        match page.json["next"].as_str() {
            Some(n) => after = Some(n.to_owned()),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            "gcounter/a1=1",
            "gcounter/a2=1",
            "gcounter/a3=1",
            "orset/a4=[\"x\"]"
        ]
    );
    let only = get(&s.url("/v1/keys?type=orset"));
    assert_eq!(
        only.json,
        json!({"keys":[{"type":"orset","key":"a4","value":["x"]}],"next":null})
    );
    let a = get(&s.url("/v1/keys?limit=0"));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_query", "query limit")
    );
    let a = get(&s.url("/v1/keys?type=sparkles"));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (404, "unknown_type", "query type")
    );
    let a = get(&s.url("/v1/keys/sparkles/x"));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (404, "unknown_type", "path type")
    );
}

#[test]
fn streamed_events_are_idempotent_and_errors_name_the_line() {
    let s = Served::start_with(|_, h| {
        h.ingest_batch_events = 2;
        h.line_bytes_max = 256;
    });
    let url = s.url("/v1/streams/clicks/events");
    let ev = |seq: u64| {
        format!(
            r#"{{"source":"web-1","seq":{seq},"time":"2026-11-29T10:00:00.123Z","page":"/","ops":[{{"type":"gcounter","key":"clicks","op":"inc"}}]}}"#
        )
    };
    let body: String = (1..=5).map(|i| ev(i) + "\n").collect();
    let a = post(&url, &body);
    assert_eq!(
        a.json,
        json!({"accepted": 5, "duplicates": 0, "late": 0}),
        "{a:?}"
    );
    assert_eq!(value(&s, "gcounter", "clicks"), json!(5));
    // A retry of the same events (plus one new) applies only the new one.
    let body: String = (1..=6).map(|i| ev(i) + "\n").collect();
    let a = post(&url, &body);
    assert_eq!(
        a.json,
        json!({"accepted": 1, "duplicates": 5, "late": 0}),
        "{a:?}"
    );
    assert_eq!(value(&s, "gcounter", "clicks"), json!(6));
    // A bad line: batches before it are committed (and reported), nothing at or after it.
    let body = format!(
        "{}\n{}\n{}\n{{\"source\":\"web-1\"}}\n{}\n",
        ev(7),
        ev(8),
        ev(9),
        ev(10)
    );
    let a = post(&url, &body);
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_event", "line 4, field seq"),
        "{a:?}"
    );
    assert_eq!(a.json["committed"]["accepted"], 2);
    assert_eq!(a.json["committed"]["committed_lines"], 2);
    assert_eq!(value(&s, "gcounter", "clicks"), json!(8));
    // Malformed JSON names the line; an over-long line answers 413 naming it.
    let a = post(&url, format!("{}\n{{nope\n", ev(20)));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_json", "line 2, column 2"),
        "{a:?}"
    );
    let long = format!(r#"{{"source":"x","seq":1,"pad":"{}"}}"#, "p".repeat(300));
    let a = post(&url, format!("{}\n{long}\n", ev(21)));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (413, "line_too_large", "line 2"),
        "{a:?}"
    );
    let a = post(
        &url,
        format!("{}\n", r#"{"source":"x","seq":1,"time":"yesterday"}"#),
    );
    assert_eq!((a.status, a.at()), (400, "line 1, field time"), "{a:?}");
    let a = post(
        &url,
        r#"{"source":"x","seq":1,"ops":[{"type":"gcounter","key":"k","op":"add","value":1}]}"#,
    );
    assert_eq!(
        (a.status, a.code(), a.at()),
        (409, "type_mismatch", "line 1, field op"),
        "{a:?}"
    );
}

/// Reads server-sent events from a watch until `count` data lines arrived.
fn read_events(reader: &mut impl BufRead, count: usize, deadline: Instant) -> Vec<(String, J)> {
    let mut out = Vec::new();
    let mut event = String::new();
    let mut line = String::new();
    while out.len() < count {
        assert!(Instant::now() < deadline, "watch delivered only {out:?}");
        line.clear();
        if reader.read_line(&mut line).expect("read watch") == 0 {
            break;
        }
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if let Some(data) = line.strip_prefix("data:") {
            out.push((
                event.clone(),
                serde_json::from_str(data.trim()).expect("json"),
            ));
        }
    }
    out
}

/// Opens a watch over a raw socket and waits until the server registered it.
fn open_watch(s: &Served, query: &str) -> BufReader<std::net::TcpStream> {
    let mut sock = std::net::TcpStream::connect(s.addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        sock,
        "GET /v1/watch?{query} HTTP/1.1\r\nHost: {}\r\n\r\n",
        s.addr
    )
    .expect("send");
    let mut reader = BufReader::new(sock);
    let mut line = String::new();
    // Headers, then the ": watching" comment that follows the subscription.
    loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).expect("read") > 0,
            "watch closed"
        );
        if line.starts_with(": watching") {
            return reader;
        }
    }
}

#[test]
fn watch_delivers_every_change_in_order_per_key() {
    let s = Served::start();
    let mut watch = open_watch(&s, "prefix=w-");
    let n = 30;
    for i in 0..n {
        // Alternate keys, one write per request; also a key outside the prefix.
        let key = if i % 2 == 0 { "w-a" } else { "w-b" };
        let body = json!([
            {"type":"gcounter","key":key,"op":"inc"},
            {"type":"gcounter","key":"other","op":"inc"}
        ]);
        assert_eq!(post(&s.url("/v1/ops"), body.to_string()).status, 200);
    }
    let events = read_events(&mut watch, n, Instant::now() + Duration::from_secs(20));
    let mut per_key: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for (name, data) in &events {
        assert_eq!(name, "change");
        per_key
            .entry(data["key"].as_str().unwrap_or("").to_owned())
            .or_default()
            .push(data["value"].as_u64().unwrap_or(0));
    }
    let expect: Vec<u64> = (1..=n as u64 / 2).collect();
    assert_eq!(per_key.get("w-a"), Some(&expect));
    assert_eq!(per_key.get("w-b"), Some(&expect));
    assert_eq!(per_key.len(), 2, "a key outside the prefix was delivered");
    // The type filter.
    let mut typed = open_watch(&s, "type=orset");
    let body = json!([
        {"type":"gcounter","key":"x","op":"inc"},
        {"type":"orset","key":"x","op":"add","value":"v"}
    ]);
    assert_eq!(post(&s.url("/v1/ops"), body.to_string()).status, 200);
    let events = read_events(&mut typed, 1, Instant::now() + Duration::from_secs(20));
    assert_eq!(events[0].1, json!({"type":"orset","key":"x","value":["v"]}));
}

#[test]
fn a_watcher_behind_the_held_changes_is_reset() {
    let s = Served::start_with(|n, _| n.limits.watch_buffer_max = 1);
    let mut watch = open_watch(&s, "");
    // 5,000 changes (one per key) are published at once by one commit; a ring of one cannot
    // hold them.
    let ops: Vec<J> = (0..5000)
        .map(|i| json!({"type":"gcounter","key":format!("k{i:04}"),"op":"inc"}))
        .collect();
    assert_eq!(
        post(&s.url("/v1/ops"), J::from(ops).to_string()).status,
        200
    );
    // The watcher may keep up for a while (how long depends on scheduling), but it cannot be
    // given 5,000 changes from a ring of one: before it has seen them all it is reset.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let reset = loop {
        let event = read_events(&mut watch, 1, deadline).remove(0);
        if event.0 == "reset" {
            break event;
        }
        assert_eq!(event.0, "change", "{event:?}");
        seen.push(event);
        assert!(
            seen.len() < 5000,
            "all 5,000 changes arrived without a reset"
        );
    };
    assert!(reset.1["missed"].as_u64().is_some_and(|m| m > 0));
    assert_eq!(reset.1["reason"], "behind_retention");
    assert!(reset.1["cursor"].as_str().is_some_and(|c| c.contains('-')));
}

#[test]
fn token_guards_every_route_but_healthz() {
    let s = Served::start_with(|_, h| h.token = Some("s3cret".into()));
    for path in [
        "/v1/keys",
        "/v1/keys/gcounter/x",
        "/v1/cluster",
        "/metrics",
        "/v1/watch",
        "/v1/views/v",
    ] {
        let a = get(&s.url(path));
        assert_eq!((a.status, a.code()), (401, "unauthorized"), "{path}: {a:?}");
        let a = get_auth(&s.url(path), Some("wrong"));
        assert_eq!(a.status, 401, "{path}");
    }
    let a = post(
        &s.url("/v1/ops"),
        r#"[{"type":"gcounter","key":"x","op":"inc"}]"#,
    );
    assert_eq!(a.status, 401);
    let a = post_auth(&s.url("/v1/streams/s/events"), "{}", None);
    assert_eq!(a.status, 401);
    assert_eq!(get(&s.url("/healthz")).status, 200);
    // Probes cannot hold the token: /readyz answers without it, and says nothing but its state.
    let ready = get(&s.url("/readyz"));
    assert_eq!(
        (ready.status, &ready.json),
        (200, &json!({"status":"ready"}))
    );
    let a = post_auth(
        &s.url("/v1/ops"),
        r#"[{"type":"gcounter","key":"x","op":"inc"}]"#,
        Some("s3cret"),
    );
    assert_eq!(a.status, 200);
    let a = get_auth(&s.url("/v1/keys/gcounter/x"), Some("s3cret"));
    assert_eq!(a.json["value"], 1);
    // The scheme is case-insensitive (RFC 7235); the token is not.
    for value in ["bearer s3cret", "BEARER s3cret", "bEaReR  s3cret"] {
        let (a, _) = request(
            "GET",
            &s.url("/v1/keys/gcounter/x"),
            &[("Authorization", value)],
        );
        assert_eq!((a.status, &a.json["value"]), (200, &json!(1)), "{value}");
    }
    for value in [
        "Basic s3cret",
        "Bearers3cret",
        "Bearer",
        "Bearer ",
        "s3cret",
        "bearer S3CRET",
        "Bearer s3cret2",
    ] {
        let (a, _) = request(
            "GET",
            &s.url("/v1/keys/gcounter/x"),
            &[("Authorization", value)],
        );
        assert_eq!((a.status, a.code()), (401, "unauthorized"), "{value}");
    }
    // The console page is static and asks for the token itself.
    let page = get(&s.url("/"));
    assert_eq!(page.status, 200);
    assert!(page.content_type.starts_with("text/html"));
}

#[test]
fn over_the_concurrency_limit_answers_429_with_retry_after() {
    let s = Served::start_with(|_, h| {
        h.concurrency_max = 1;
        h.retry_after_secs = 3;
    });
    // Hold the only slot: an ingest whose body never ends (it takes the slot with its first
    // line; one that sends nothing holds none).
    let mut slow = std::net::TcpStream::connect(s.addr).expect("connect");
    let line = "{\"source\":\"h\",\"seq\":1}\n";
    write!(
        slow,
        "POST /v1/streams/s/events HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{line}\r\n",
        s.addr,
        line.len()
    )
    .expect("send");
    http_support::await_in_flight(&s, 1);
    let busy = get(&s.url("/v1/keys"));
    assert_eq!(busy.status, 429, "{busy:?}");
    assert_eq!(busy.code(), "overloaded");
    assert_eq!(busy.retry_after.as_deref(), Some("3"));
    // Probes are not counted against the limit.
    assert_eq!(get(&s.url("/healthz")).status, 200);
    // Finish the held request (an empty chunked body): the slot frees.
    write!(slow, "0\r\n\r\n").expect("finish");
    http_support::await_in_flight(&s, 0);
    assert_eq!(get(&s.url("/v1/keys")).status, 200);
}

#[test]
fn probes_cluster_metrics_views_and_console() {
    let s = Served::start();
    assert_eq!(get(&s.url("/healthz")).json, json!({"status":"ok"}));
    assert_eq!(get(&s.url("/readyz")).json, json!({"status":"ready"}));
    let body = r#"[{"type":"gcounter","key":"m","op":"inc"},{"type":"gcounter","key":"m","op":"inc"},{"type":"gcounter","key":"m","op":"inc"}]"#;
    assert_eq!(post(&s.url("/v1/ops"), body).status, 200);
    let c = get(&s.url("/v1/cluster"));
    assert_eq!(c.status, 200);
    assert_eq!(c.json["node"]["replica"], s.node.replica_id().to_string());
    assert_eq!(c.json["node"]["http"], s.addr.to_string());
    assert_eq!(c.json["node"]["log"]["end"], 1);
    assert_eq!(c.json["members"], json!([]));
    let m = get(&s.url("/metrics"));
    assert_eq!(m.status, 200);
    assert!(
        m.text
            .contains("tidemark_writes_total{result=\"applied\"} 3"),
        "{}",
        m.text
    );
    assert!(m.text.contains("tidemark_commits_total 1"), "{}", m.text);
    assert!(
        m.text
            .contains("tidemark_http_requests_total{route=\"/v1/ops\",status=\"200\"} 1"),
        "{}",
        m.text
    );
    assert!(m.text.contains("tidemark_store_bytes "));
    let v = get(&s.url("/v1/views/clicks_per_page"));
    assert_eq!((v.status, v.code()), (404, "view_not_found"));
    let nf = get(&s.url("/v2/nothing"));
    assert_eq!((nf.status, nf.code()), (404, "not_found"));
    let page = get(&s.url("/"));
    assert!(page.text.contains("Tidemark"));
}

#[test]
fn shutdown_finishes_in_flight_requests_durably_and_refuses_new_ones() {
    let mut s = Served::start_with(|_, h| h.concurrency_max = 1);
    let mut sock = std::net::TcpStream::connect(s.addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let ev = |seq: u64| {
        format!(
            "{{\"source\":\"s\",\"seq\":{seq},\"ops\":[{{\"type\":\"gcounter\",\"key\":\"inflight\",\"op\":\"inc\"}}]}}\n"
        )
    };
    let first = ev(1);
    write!(
        sock,
        "POST /v1/streams/s/events HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n",
        s.addr,
        first.len()
    )
    .expect("send");
    // Wait until the request is in its handler (it holds the only request slot), then stop.
    http_support::await_in_flight(&s, 1);
    assert_eq!(get(&s.url("/v1/keys")).status, 429, "the slot is held");
    s.begin_stop();
    // New connections are refused once the listener is closed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(s.addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting after shutdown began"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The in-flight request finishes and is answered after its durable commit.
    let second = ev(2);
    write!(sock, "{:x}\r\n{second}\r\n0\r\n\r\n", second.len()).expect("send rest");
    let mut answer = String::new();
    let mut buf = [0u8; 1024];
    while !answer.contains("late") {
        let n = std::io::Read::read(&mut sock, &mut buf).expect("read");
        assert!(n > 0, "closed before answering: {answer}");
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"accepted\":2"), "{answer}");
    drop(sock);
    s.wait_stopped();
    // Reopened, the node has both events.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = s.data_dir();
    rt.block_on(async {
        let node = tidemark::Node::open(tidemark::NodeConfig::new(dir))
            .await
            .expect("reopen");
        let v = node
            .get(&tidemark::Key::new(tidemark::KeyKind::GCounter, "inflight"))
            .expect("get");
        assert_eq!(v, tidemark::Value::GCounter(2));
        node.shutdown().await.expect("shutdown");
    });
}

#[test]
fn a_missing_key_is_404_key_not_found() {
    let s = Served::start();
    let a = get(&s.url("/v1/keys/orset/online"));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (404, "key_not_found", "path name"),
        "{a:?}"
    );
    assert!(a.content_type.starts_with("application/json"), "{a:?}");
    let w = post(
        &s.url("/v1/ops"),
        r#"[{"type":"orset","key":"online","op":"add","value":"alice"},{"type":"gcounter","key":"zero","op":"inc","by":1}]"#,
    );
    assert_eq!(w.status, 200);
    assert_eq!(value(&s, "orset", "online"), json!(["alice"]));
    // Another type under the same name is another key.
    http_support::missing(&s, "lww", "online");
    // A counter once written holds state, whatever its value.
    let d = post(
        &s.url("/v1/ops"),
        r#"[{"type":"pncounter","key":"net","op":"inc"},{"type":"pncounter","key":"net","op":"dec"}]"#,
    );
    assert_eq!(d.status, 200);
    assert_eq!(value(&s, "pncounter", "net"), json!(0));
    // A set whose last element was removed holds nothing, like a deleted key.
    let r = post(
        &s.url("/v1/ops"),
        r#"[{"type":"orset","key":"online","op":"remove","value":"alice"}]"#,
    );
    assert_eq!(r.status, 200);
    http_support::missing(&s, "orset", "online");
}

#[test]
fn wrong_methods_answer_405_in_the_error_shape() {
    let s = Served::start();
    for (method, path, allowed) in [
        ("POST", "/v1/keys", "GET"),
        ("GET", "/v1/ops", "POST"),
        ("DELETE", "/v1/keys/gcounter/x", "GET"),
        ("PUT", "/metrics", "GET"),
    ] {
        // With a JSON content type: a body of another type is refused (415) before routing.
        let json = [("Content-Type", "application/json")];
        let (a, headers) = http_support::request(method, &s.url(path), &json);
        assert_eq!(
            (a.status, a.code()),
            (405, "method_not_allowed"),
            "{method} {path}: {a:?}"
        );
        assert!(a.content_type.starts_with("application/json"), "{a:?}");
        let allow = headers
            .get("allow")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(allow.contains(allowed), "{method} {path}: Allow {allow:?}");
    }
}

/// `# TYPE` and `# HELP` name the same families, and every sample belongs to a typed family.
fn check_exposition(text: &str) {
    let mut typed = std::collections::BTreeMap::new();
    let mut helped = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            typed.insert(name.to_owned(), kind.to_owned());
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP line");
            assert!(!help.trim().is_empty(), "empty help: {line}");
            helped.insert(name.to_owned());
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
                })
                .unwrap_or(name);
            assert!(
                typed.contains_key(family),
                "sample of an untyped family: {line}"
            );
            if typed[family] == "counter" {
                assert!(name.ends_with("_total"), "{line}");
            }
        }
    }
    let untyped: Vec<_> = typed.keys().filter(|n| !helped.contains(*n)).collect();
    assert!(untyped.is_empty(), "no help text: {untyped:?}");
}

/// `promtool check metrics` on `text`, when promtool is installed (required when
/// `TIDEMARK_REQUIRE_PROMTOOL=1`): its lint findings, if any.
fn promtool(text: &str) -> Option<String> {
    let mut child = match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var("TIDEMARK_REQUIRE_PROMTOOL").as_deref() != Ok("1"),
                "promtool is required (TIDEMARK_REQUIRE_PROMTOOL=1) but cannot run: {e}"
            );
            eprintln!("promtool not installed (Debian package `prometheus`): check skipped");
            return None;
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
    assert!(out.status.success(), "promtool check metrics: {findings}");
    Some(findings)
}

#[test]
fn metrics_are_prometheus_text_by_default_and_openmetrics_when_asked() {
    let s = Served::start();
    let w = post(
        &s.url("/v1/ops"),
        r#"[{"type":"gcounter","key":"m","op":"inc"}]"#,
    );
    assert_eq!(w.status, 200);
    let _ = get(&s.url("/v1/keys/gcounter/m"));
    let text = get(&s.url("/metrics"));
    assert_eq!(
        text.content_type, "text/plain; version=0.0.4; charset=utf-8",
        "{text:?}"
    );
    assert!(!text.text.contains("# EOF") && !text.text.contains("# UNIT"));
    check_exposition(&text.text);
    let version = env!("CARGO_PKG_VERSION");
    let build = format!("tidemark_build_info{{version=\"{version}\"}} 1\n");
    assert!(text.text.contains(&build), "{}", text.text);
    assert!(text.text.contains("# TYPE tidemark_writes_total counter\n"));
    assert!(
        text.text
            .contains("tidemark_writes_total{result=\"applied\"} 1\n")
    );
    #[cfg(target_os = "linux")]
    for family in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        let sample = text
            .text
            .lines()
            .find(|l| l.starts_with(&format!("{family} ")))
            .unwrap_or_else(|| panic!("no {family}: {}", text.text));
        let v: f64 = sample
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a number");
        assert!(v > 0.0 || family == "process_cpu_seconds_total", "{sample}");
    }
    if let Some(findings) = promtool(&text.text) {
        assert_eq!(findings.trim(), "", "promtool lint findings");
    }
    for accept in [
        "text/plain",
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "*/*",
    ] {
        let (a, _) = http_support::request("GET", &s.url("/metrics"), &[("accept", accept)]);
        assert!(
            a.content_type.starts_with("text/plain; version=0.0.4"),
            "{accept}: {a:?}"
        );
    }
    let (om, _) = http_support::request(
        "GET",
        &s.url("/metrics"),
        &[(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )],
    );
    assert_eq!(
        om.content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.text.ends_with("# EOF\n"), "{}", om.text);
    assert!(om.text.contains("# TYPE tidemark_writes counter\n"));
    assert!(om.text.contains(&build));
}

#[test]
fn the_watchers_gauge_falls_when_a_watch_client_disconnects() {
    let s = Served::start();
    let watchers = || {
        get(&s.url("/metrics"))
            .text
            .lines()
            .find_map(|l| {
                l.strip_prefix("tidemark_http_watchers ")?
                    .parse::<i64>()
                    .ok()
            })
            .expect("tidemark_http_watchers")
    };
    assert_eq!(watchers(), 0);
    let first = open_watch(&s, "prefix=w");
    let second = open_watch(&s, "prefix=w");
    assert_eq!(watchers(), 2);
    // The server notices a closed connection when it next writes to it: make changes until
    // the gauge reads `want`.
    let mut n = 0;
    let mut falls_to = |want: i64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while watchers() != want {
            assert!(
                Instant::now() < deadline,
                "the gauge stayed at {}",
                watchers()
            );
            n += 1;
            let op = json!([{"type":"gcounter","key":format!("w{n}"),"op":"inc"}]);
            assert_eq!(post(&s.url("/v1/ops"), op.to_string()).status, 200);
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    drop(first);
    falls_to(1);
    drop(second);
    falls_to(0);
}

/// The value of the one sample of `family` whose labels contain `label` in `text`.
fn sample(text: &str, family: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(label))
        .find_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()))
}

#[test]
fn a_disconnected_peer_keeps_its_lag_samples_and_they_grow() {
    let a = Served::start();
    let b = Served::start();
    a.node.connect(&b.node).expect("connect");
    assert_eq!(
        post(
            &a.url("/v1/ops"),
            r#"[{"type":"gcounter","key":"lag","op":"inc"}]"#
        )
        .status,
        200
    );
    let peer = format!("peer=\"{:016x}\"", b.node.peer_id().0);
    // Caught up: 0 entries behind.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = get(&a.url("/metrics")).text;
        if sample(&m, "tidemark_replication_lag_entries", &peer) == Some(0.0)
            && sample(&m, "tidemark_replication_lag_seconds", &peer) == Some(0.0)
            && sample(&m, "tidemark_replication_lag_bytes", &peer) == Some(0.0)
        {
            break;
        }
        assert!(Instant::now() < deadline, "never caught up: {m}");
        std::thread::sleep(Duration::from_millis(50));
    }
    a.node.disconnect(&b.node).expect("disconnect");
    std::thread::sleep(Duration::from_millis(300));
    let body = r#"[{"type":"gcounter","key":"lag","op":"inc"},{"type":"gcounter","key":"lag","op":"inc"}]"#;
    assert_eq!(post(&a.url("/v1/ops"), body).status, 200);
    std::thread::sleep(Duration::from_millis(1200));
    let m = get(&a.url("/metrics")).text;
    assert_eq!(
        sample(&m, "tidemark_replication_lag_entries", &peer),
        Some(1.0),
        "{m}"
    );
    // Away and behind: counted from the last moment it had our whole log (before the write).
    let secs = sample(&m, "tidemark_replication_lag_seconds", &peer)
        .unwrap_or_else(|| panic!("no lag seconds for the disconnected peer: {m}"));
    assert!((1.0..30.0).contains(&secs), "{secs}: {m}");
    // The one entry behind is the commit group of two increments: some tens of bytes.
    let bytes = sample(&m, "tidemark_replication_lag_bytes", &peer)
        .unwrap_or_else(|| panic!("no lag bytes for the disconnected peer: {m}"));
    assert!((20.0..1000.0).contains(&bytes), "{bytes}: {m}");
    // /v1/cluster's peers agree on the entries and bytes.
    let c = get(&a.url("/v1/cluster")).json;
    assert_eq!(c["peers"][0]["connected"], false, "{c}");
    assert_eq!(c["peers"][0]["lag_entries"], 1, "{c}");
    assert_eq!(c["peers"][0]["lag_bytes"].as_f64(), Some(bytes), "{c}");
    assert_eq!(c["peers"][0]["lag_bytes_exact"], true, "{c}");
    // One more entry, with a 40-byte value: the bytes grow by at least that.
    assert_eq!(
        post(
            &a.url("/v1/ops"),
            r#"[{"type":"lww","key":"big","op":"set","value":"0123456789012345678901234567890123456789"}]"#
        )
        .status,
        200
    );
    let c = get(&a.url("/v1/cluster")).json;
    assert_eq!(c["peers"][0]["lag_entries"], 2, "{c}");
    assert!(
        c["peers"][0]["lag_bytes"].as_f64().unwrap_or_default() >= bytes + 40.0,
        "{c}"
    );
    std::thread::sleep(Duration::from_millis(600));
    let later = sample(
        &get(&a.url("/metrics")).text,
        "tidemark_replication_lag_seconds",
        &peer,
    )
    .unwrap_or_default();
    assert!(later >= secs + 0.5, "{later} after {secs}");
}

#[test]
fn a_metrics_scrape_asks_the_writer_for_its_status_once() {
    let s = Served::start_with(|node, _| {
        node.views = serde_json::from_value(json!([
            {"name": "hits", "stream": "s", "kind": "count", "window": {"tumbling": "1m"}}
        ]))
        .expect("view");
    });
    // Warm up (the first scrape may race the node's own start-up requests).
    assert_eq!(get(&s.url("/metrics")).status, 200);
    // The background view maintenance (every 50 ms) asks for the status too, so a request's
    // count is the fewest seen over several tries: other requests only ever add to it.
    let fewest = |path: &str| {
        (0..8)
            .map(|_| {
                let before = s.node.metrics().status_requests;
                let r = get(&s.url(path));
                assert_eq!(r.status, 200, "{path}");
                if path == "/metrics" {
                    // The per-view families are there: the views were read with the scrape's
                    // status.
                    assert!(
                        r.text.contains(
                            "tidemark_view_events_total{view=\"hits\",stream=\"s\",result=\"folded\"} 0"
                        ),
                        "{}",
                        r.text
                    );
                }
                s.node.metrics().status_requests - before
            })
            .min()
            .unwrap_or_default()
    };
    assert_eq!(fewest("/metrics"), 1, "a scrape asks the writer once");
    // /v1/views makes one too.
    assert_eq!(
        fewest("/v1/views"),
        1,
        "a view listing asks the writer once"
    );
}

#[test]
fn routes_without_parameters_refuse_any_like_the_others_refuse_unknown_ones() {
    let s = Served::start_with(|node, _| {
        node.views = serde_json::from_value(json!([
            {"name": "hits", "stream": "s", "kind": "count", "window": {"tumbling": "1m"}}
        ]))
        .expect("view");
    });
    for (path, known) in [
        ("/v1/keys?prefix=a", "type, prefix, limit, after, internal"),
        ("/v1/streams/s/late?limit=5", "after, limit"),
    ] {
        assert_eq!(get(&s.url(path)).status, 200, "{path}");
        let a = get(&s.url(&format!("{path}&colour=red")));
        assert_eq!(
            (a.status, a.code(), a.at()),
            (400, "invalid_query", "query colour"),
            "{path}: {a:?}"
        );
        assert_eq!(
            a.json["error"]["message"],
            format!("unknown parameter \"colour\" ({known})"),
            "{a:?}"
        );
    }
    // The watch is refused before it streams.
    let a = get(&s.url("/v1/watch?prefix=a&colour=red"));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_query", "query colour"),
        "{a:?}"
    );
    for path in ["/v1/views", "/v1/stats/writes"] {
        assert_eq!(get(&s.url(path)).status, 200, "{path}");
        for (query, param) in [("?colour=red", "colour"), ("?limit=5&x=1", "limit")] {
            let a = get(&s.url(&format!("{path}{query}")));
            assert_eq!(
                (a.status, a.code(), a.at()),
                (400, "invalid_query", format!("query {param}").as_str()),
                "{path}{query}: {a:?}"
            );
            assert_eq!(
                a.json["error"]["message"],
                format!("unknown parameter {param:?} ({path} takes no parameters)"),
                "{a:?}"
            );
        }
    }
}

/// `POST /v1/cluster/members/{name}/remove` on a lone node: an unknown name, and a replica
/// id no node it knows has, are 404 `member_not_found` (nothing recorded); this node itself,
/// by replica id, is 400 `invalid_member`; a bad `force` or an unknown parameter is 400; a
/// client op cannot forge a removal record (`~gone/` is reserved). (Removing a real member by
/// name: tests/daemon/cli_commands.rs; by replica id: tests/views/views_membership.rs.)
#[test]
fn members_are_decommissioned_only_when_known_and_not_this_node() {
    let s = Served::start();
    let a = post(&s.url("/v1/cluster/members/nobody/remove"), "{}");
    assert_eq!(
        (a.status, a.code(), a.at()),
        (404, "member_not_found", "path name"),
        "{a:?}"
    );
    let stranger = "000000000000000000000000000000ab";
    let a = post(
        &s.url(&format!("/v1/cluster/members/{stranger}/remove")),
        "{}",
    );
    assert_eq!((a.status, a.code()), (404, "member_not_found"), "{a:?}");
    let me = get(&s.url("/v1/cluster")).json["node"]["replica"]
        .as_str()
        .expect("replica")
        .to_owned();
    let a = post(&s.url(&format!("/v1/cluster/members/{me}/remove")), "{}");
    assert_eq!((a.status, a.code()), (400, "invalid_member"), "{a:?}");
    let a = post(&s.url("/v1/cluster/members/nobody/remove?force=yes"), "{}");
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_query", "query force"),
        "{a:?}"
    );
    let a = post(&s.url("/v1/cluster/members/nobody/remove?now=1"), "{}");
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_query", "query now"),
        "{a:?}"
    );
    let forged = post(
        &s.url("/v1/ops"),
        r#"[{"type":"lww","key":"~gone/000000000000000000000000000000cd","op":"set","value":"{}"}]"#,
    );
    assert_eq!(forged.status, 400, "{forged:?}");
    // The refusal names the whole reserved namespace and every internal prefix in use, from
    // the one list.
    let message = forged.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("`~`"), "{message}");
    for prefix in tidemark::model::RESERVED_PREFIXES {
        assert!(
            message.contains(&format!("`{prefix}`")),
            "{prefix}: {message}"
        );
    }
    // Any name under `~` is the node's: not only the prefixes in use today.
    let other = post(
        &s.url("/v1/ops"),
        r#"[{"type":"gcounter","key":"~later/x","op":"inc"}]"#,
    );
    assert_eq!(
        (other.status, other.at()),
        (400, "index 0, field key"),
        "{other:?}"
    );
    let c = get(&s.url("/v1/cluster")).json;
    assert_eq!(c["decommissioned"], json!([]), "{c}");
    assert_eq!(c["node"]["decommissioned"], false, "{c}");
}

/// A peer evicted from replication (away past `peer_evict_after_ms`) keeps its last
/// acknowledged cursor in `/v1/cluster`, and its lag counts from it: never `acked: null`
/// beside a computed `lag_entries`.
#[test]
fn an_evicted_peer_keeps_its_last_ack_and_its_lag_agrees() {
    let a = Served::start_with(|node, _| node.replication.peer_evict_after_ms = 300);
    let b = Served::start();
    a.node.connect(&b.node).expect("connect");
    let inc = r#"[{"type":"gcounter","key":"lag","op":"inc"}]"#;
    assert_eq!(post(&a.url("/v1/ops"), inc).status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&a.url("/v1/cluster")).json["peers"][0]["lag_entries"] != 0 {
        assert!(Instant::now() < deadline, "never caught up");
        std::thread::sleep(Duration::from_millis(50));
    }
    a.node.disconnect(&b.node).expect("disconnect");
    // Well past the eviction.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(post(&a.url("/v1/ops"), inc).status, 200);
    assert_eq!(post(&a.url("/v1/ops"), inc).status, 200);
    let c = get(&a.url("/v1/cluster")).json;
    let peer = &c["peers"][0];
    let acked = peer["acked"]
        .as_u64()
        .unwrap_or_else(|| panic!("acked unknown beside lag {}: {c}", peer["lag_entries"]));
    let end = c["node"]["log"]["end"].as_u64().expect("log end");
    assert_eq!(peer["lag_entries"].as_u64(), Some(end - acked), "{c}");
    assert_eq!(end - acked, 2, "{c}");
}
