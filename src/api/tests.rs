//! Each type of the contract against `API.md`: a sample taken from `API.md` (its literal JSON
//! where it has one, else its reply template with the placeholders filled in) deserializes into
//! the type and serializes back to the same JSON, and the field names `API.md` lists for the
//! reply are exactly those the type writes. A type and the documentation that drift apart
//! fail here.

use super::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeSet;

const API_MD: &str = include_str!("../../API.md");

/// `sample` deserialized as `T`, after checking that `T` writes it back as the same JSON.
fn roundtrip<T: Serialize + DeserializeOwned>(sample: &str) -> T {
    let want: Value = serde_json::from_str(sample).expect("the sample is JSON");
    let typed: T = serde_json::from_value(want.clone()).unwrap_or_else(|e| {
        panic!(
            "{sample} does not read as {}: {e}",
            std::any::type_name::<T>()
        )
    });
    let back = serde_json::to_value(&typed).expect("serializes");
    assert_eq!(
        back,
        want,
        "{} writes back another JSON",
        std::any::type_name::<T>()
    );
    // And the text it writes reads back as the same value.
    let text = serde_json::to_string(&typed).expect("serializes");
    let again: T = serde_json::from_str(&text).expect("reads its own text");
    assert_eq!(serde_json::to_value(&again).expect("serializes"), want);
    typed
}

/// The first `{...}` of API.md after `anchor`, braces and brackets balanced (strings skipped).
fn doc_object(anchor: &str) -> &'static str {
    let at = API_MD
        .find(anchor)
        .unwrap_or_else(|| panic!("API.md no longer holds {anchor:?}"));
    let rest = &API_MD[at..];
    let start = rest.find('{').expect("an object after the anchor");
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for (i, c) in rest[start..].char_indices() {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return &rest[start..=start + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced object after {anchor:?} in API.md")
}

/// The member names of an API.md reply template (`{"applied":n,"duplicates":d}`,
/// `{"type","key","value"}`, `{"views":[{"name",...}]}`) written in objects at `depth`
/// (1: the reply's own members; 3: those of the objects in one of its arrays).
fn doc_keys(template: &str, depth: usize) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut stack: Vec<char> = Vec::new();
    let mut prev = ' ';
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let mut name = String::new();
                for s in chars.by_ref() {
                    if s == '"' {
                        break;
                    }
                    name.push(s);
                }
                if stack.len() == depth && stack.last() == Some(&'{') && matches!(prev, '{' | ',') {
                    keys.insert(name);
                }
                prev = '"';
            }
            '{' | '[' => {
                stack.push(c);
                prev = c;
            }
            '}' | ']' => {
                stack.pop();
                prev = c;
            }
            c if c.is_whitespace() => {}
            c => prev = c,
        }
    }
    keys
}

/// The member names `value` (an object) has.
fn keys_of(value: &impl Serialize) -> BTreeSet<String> {
    match serde_json::to_value(value).expect("serializes") {
        Value::Object(m) => m.keys().cloned().collect(),
        other => panic!("not an object: {other}"),
    }
}

/// Asserts the template after `anchor` names exactly `value`'s members at `depth`.
fn documented(anchor: &str, depth: usize, value: &impl Serialize) {
    let template = doc_object(anchor);
    assert_eq!(
        doc_keys(template, depth),
        keys_of(value),
        "API.md's {template} and {} name different members",
        std::any::type_name_of_val(value)
    );
}

#[test]
fn the_template_reader_reads_member_names() {
    let t = r#"{"a":1,"b":{"x":2},"c":[{"d","e"}],"f":"g"|"h","i":["j","k"]}"#;
    assert_eq!(
        doc_keys(t, 1),
        ["a", "b", "c", "f", "i"].map(String::from).into()
    );
    assert_eq!(doc_keys(t, 3), ["d", "e"].map(String::from).into());
}

#[test]
fn write_replies() {
    let ops: OpsReply = roundtrip(r#"{"applied":3,"duplicates":0}"#);
    assert_eq!((ops.applied, ops.duplicates), (3, 0));
    documented("200 `{\"applied\"", 1, &ops);
    let ingest: IngestReply = roundtrip(r#"{"accepted":2,"duplicates":1,"late":1}"#);
    assert_eq!((ingest.accepted, ingest.duplicates, ingest.late), (2, 1, 1));
    documented("200 `{\"accepted\"", 1, &ingest);
}

#[test]
fn error_replies() {
    // The literal error body of API.md.
    let text = doc_object("Errors are `");
    let e: ErrorReply = roundtrip(text);
    assert_eq!(e.error.code, "type_mismatch");
    assert_eq!(e.committed, None);
    // `at` is null, never omitted, when the request as a whole is refused.
    let e: ErrorReply = roundtrip(r#"{"error":{"at":null,"code":"too_large","message":"m"}}"#);
    assert_eq!(e.error.at, None);
    // A streamed ingest's error says what was committed before it.
    let e: ErrorReply = roundtrip(
        r#"{"committed":{"accepted":2,"committed_lines":2,"duplicates":0,"late":0},
            "error":{"at":"line 3, field page","code":"invalid_event","message":"m"}}"#,
    );
    let committed = e.committed.expect("committed");
    assert_eq!(committed.committed_lines, 2);
    documented("`committed`: `{", 1, &committed);
}

#[test]
fn key_reads_and_lists() {
    let k: KeyValue = roundtrip(r#"{"key":"online","type":"orset","value":["alice"]}"#);
    assert_eq!(k.kind, tidemark_crdts::KeyKind::ORSet);
    documented("| 200 `{\"type\"", 1, &k);
    // A value may be JSON null (an lww register set to null).
    let k: KeyValue = roundtrip(r#"{"key":"config","type":"lww","value":null}"#);
    assert_eq!(k.value, Value::Null);
    let list: KeyList = roundtrip(
        r#"{"keys":[{"key":"visits","type":"gcounter","value":3}],"next":"gcounter/visits"}"#,
    );
    documented("200 `{\"keys\"", 1, &list);
    let last: KeyList = roundtrip(r#"{"keys":[],"next":null}"#);
    assert_eq!(last.next, None);
    // An unknown type is refused, not read as some other type.
    assert!(serde_json::from_str::<KeyValue>(r#"{"key":"k","type":"map","value":1}"#).is_err());
}

#[test]
fn watch_events() {
    let change: WatchEntry = roundtrip(r#"{"key":"visits","type":"gcounter","value":3}"#);
    assert_eq!(change.value, WatchValue::Value(Value::from(3)));
    documented("`event: change` carries", 1, &change);
    let null: WatchEntry = roundtrip(r#"{"key":"config","type":"lww","value":null}"#);
    assert_eq!(null.value, WatchValue::Value(Value::Null));
    let omitted: WatchEntry =
        roundtrip(r#"{"key":"big","type":"orset","value_bytes":2000000,"value_omitted":true}"#);
    assert_eq!(omitted.value, WatchValue::Omitted { bytes: 2_000_000 });
    documented("JSON comes as `", 1, &omitted);
    for bad in [
        r#"{"key":"k","type":"lww"}"#,
        r#"{"key":"k","type":"lww","value_omitted":true}"#,
        r#"{"key":"k","type":"lww","value":1,"value_omitted":true,"value_bytes":1}"#,
    ] {
        assert!(serde_json::from_str::<WatchEntry>(bad).is_err(), "{bad}");
    }
    let end: WatchSnapshotEnd = roundtrip(r#"{"cursor":"3f9c00000000abcd-42"}"#);
    documented("then `event: snapshot_end` with `id:` and `", 1, &end);
    let reset: WatchReset = roundtrip(
        r#"{"cursor":"3f9c00000000abcd-42","hint":"re-read the keys you watch","missed":7,
            "reason":"behind_retention"}"#,
    );
    documented("`event: reset` with\n`", 1, &reset);
    let unknown: WatchReset =
        roundtrip(r#"{"cursor":"c","hint":"h","missed":null,"reason":"unknown_cursor"}"#);
    assert_eq!(unknown.missed, None);
}

#[test]
fn final_feed_events() {
    let w: FinalWindow = roundtrip(
        r#"{"view":"clicks_per_minute","group":{"page":"/docs"},"window_start":1795946400000,
            "window_end":1795946460000,"value":1,"version":1,"cursor":"00ab"}"#,
    );
    documented("(start, then group; session views: in rounds, see", 1, &w);
    let reset: FinalReset = roundtrip(
        r#"{"cursor":"00ab","hint":"windows after your cursor may have been removed",
            "reason":"behind_retention"}"#,
    );
    documented("gets `event: reset` (`", 1, &reset);
    let fresh: FinalReset = roundtrip(r#"{"cursor":null,"hint":"h","reason":"behind_retention"}"#);
    assert_eq!(fresh.cursor, None);
    // NDJSON lines: the same data, named by `event`.
    let line: FinalFeedLine = roundtrip(
        r#"{"event":"final","view":"v","group":{},"window_start":0,"window_end":60000,
            "value":[1,"a"],"version":1,"cursor":"01"}"#,
    );
    assert!(matches!(line, FinalFeedLine::Final(ref w) if w.window_end == 60_000));
    let line: FinalFeedLine =
        roundtrip(r#"{"event":"reset","cursor":"01","hint":"h","reason":"behind_retention"}"#);
    assert!(matches!(line, FinalFeedLine::Reset(_)));
}

#[test]
fn view_pages() {
    // The literal page of API.md "GET /v1/views/{view}".
    let at = API_MD
        .find("```json\n{\"view\":\"clicks_per_page\"")
        .expect("API.md's view page sample");
    let text = doc_object(&API_MD[at..at + 20]);
    let page: ViewPage = roundtrip(text);
    assert_eq!(page.view, "clicks_per_page");
    assert!(page.rows.first().is_some_and(|r| r.is_final));
    assert_eq!(page.counters.folded, 1200);
    // An unwindowed view's rows have null bounds, not missing ones.
    let row: ViewRow =
        roundtrip(r#"{"final":false,"group":{},"value":4,"window_end":null,"window_start":null}"#);
    assert_eq!(row.window_start, None);
}

#[test]
fn views_list() {
    let list: ViewsList = roundtrip(
        r#"{"views":[{"cluster_watermark":null,
            "counters":{"expired_dropped":0,"folded":4,"foreign_cells":0,"late":1,"rejected":0},
            "definition":{"add_when":{"equals":"join","field":"kind"},"field":"user",
              "group_by":["room"],"kind":"members","max_future":"1h","name":"present",
              "remove_when":{"equals":"leave","field":"kind"},"stream":"presence",
              "window":{"hopping":{"every":"1m","size":"10m"},"idle_timeout":"1m",
                "lateness":"30s","out_of_orderness":"10s","retention":"7d"}},
            "definition_conflicts":[],"horizon":1795946400000,"name":"present",
            "watermark":1795946530000,"watermark_lag_seconds":1.5}]}"#,
    );
    documented("200 `{\"views\"", 1, &list);
    documented("200 `{\"views\"", 3, &list.views[0]);
    // Settings left unset are omitted, as configured.
    let minimal: ViewDefinition =
        roundtrip(r#"{"kind":"count","name":"c","stream":"s","window":{"tumbling":"1m"}}"#);
    assert!(minimal.group_by.is_empty() && minimal.field.is_none());
}

#[test]
fn late_lane_pages() {
    let page: LatePage = roundtrip(
        r#"{"stream":"clicks","events":[{"id":0,"record":{
              "event":{"page":"/home","seq":1,"source":"web-3","time":"2026-11-29T10:00:59Z"},
              "node":"3f9c0000000000000000000000000001","reason":"behind_watermark",
              "received_ms":1795946600000,"views":["clicks_per_minute"],
              "watermark":1795946530000}}],
            "next":null,"kept_bytes":235,"dropped":0}"#,
    );
    documented("200 `{\"stream\"", 1, &page);
    documented("200 `{\"stream\"", 3, &page.events[0]);
    let record = &page.events[0].record;
    documented("A record is\n`", 1, record);
    let event = record.event.as_ref().expect("an event record");
    assert_eq!((event.source.as_str(), event.seq), ("web-3", 1));
    assert_eq!(event.rest.get("page"), Some(&Value::from("/home")));
    // Written with its members sorted, envelope included, as the lane keeps it.
    assert_eq!(
        serde_json::to_string(event).expect("serializes"),
        r#"{"page":"/home","seq":1,"source":"web-3","time":"2026-11-29T10:00:59Z"}"#
    );
    // An event without a time, with ops, on a node without a watermark yet.
    let r: LateRecord = roundtrip(
        r#"{"event":{"ops":[{"type":"gcounter","key":"g","op":"inc"}],"seq":2,"source":"a"},
            "node":"n","reason":"not_synced","received_ms":1,"views":["v"],"watermark":null}"#,
    );
    assert_eq!(
        (r.event.and_then(|e| e.time), r.watermark, r.contribution),
        (None, None, None)
    );
    // A contribution a seal left out.
    let c: LateRecord = roundtrip(
        r#"{"contribution":{"view":"clicks_per_page","group":{"page":"/home"},
              "window_start":1795946400000,"window_end":1795946460000,"value":3,"seq":17},
            "node":"3f9c0000000000000000000000000002","reason":"outside_seal",
            "received_ms":1795946600000,"recorded_by":"3f9c0000000000000000000000000001",
            "sealed_members":["3f9c0000000000000000000000000001"],
            "views":["clicks_per_page"],"watermark":null}"#,
    );
    documented("A contribution record is\n`", 1, &c);
    documented(
        "A contribution record is\n`",
        2,
        c.contribution.as_ref().expect("some"),
    );
    assert!(c.event.is_none());
}

#[test]
fn write_history() {
    let h: WriteHistory = roundtrip(
        r#"{"samples":[{"applied":10,"at_ms":1795946400000},{"applied":12,"at_ms":1795946401000}]}"#,
    );
    documented("200 `{\"samples\"", 1, &h);
    documented("200 `{\"samples\"", 3, &h.samples[0]);
}

#[test]
fn cluster() {
    let c: Cluster = roundtrip(
        r#"{"decommissioned":["0a0b"],
            "members":[
              {"acked":12,"addr":"10.0.0.2:7701","connected":true,"epoch":3,"incarnation":0,
               "lag_bytes":0,"lag_bytes_exact":true,"lag_entries":0,"lag_seconds":0.0,
               "last_contact":0.25,"name":"beta","peer":"00000000000000bb",
               "replica":"0b0c","state":"alive","version":"0.1.0"},
              {"acked":null,"connected":true,"lag_bytes":null,"lag_bytes_exact":null,
               "lag_entries":null,"lag_seconds":null,"last_contact":null,"name":"gamma",
               "peer":"00000000000000cc","state":"connected","version":null}],
            "node":{"data_dir":"/var/lib/tidemark","data_file":"2049:1234","decommissioned":false,
              "epoch":4,"http":"127.0.0.1:7700","log":{"end":12,"start":0},"name":"alpha",
              "peer":"00000000000000aa","peer_listen":"10.0.0.1:7701","replica":"0a0a",
              "version":"0.1.0","writes_applied":12},
            "peers":[{"acked":12,"connected":true,"lag_bytes":0,"lag_bytes_exact":true,
              "lag_entries":0,"name":"beta","peer":"00000000000000bb"}],
            "swim":[{"addr":"10.0.0.2:7701","epoch":3,"incarnation":0,"last_contact_ms":250,
              "left":false,"name":"beta","replica":"0b0c","state":"alive","version":"0.1.0"}]}"#,
    );
    // A connected peer SWIM does not know yet has no address, epoch, incarnation or replica.
    assert_eq!(c.members[1].addr, None);
    // API.md's `/v1/cluster` row names every member of the reply, of `node`, of a member
    // and of a peer.
    let row = API_MD
        .lines()
        .find(|l| l.starts_with("| `GET /v1/cluster` |"))
        .expect("API.md's /v1/cluster row");
    named_in(row, &c);
    named_in(row, &c.node);
    named_in(row, &c.node.log);
    named_in(row, &c.members[0]);
    named_in(row, &c.peers[0]);
    let none: Cluster = roundtrip(
        r#"{"decommissioned":[],"members":[],"node":{"data_dir":"d","data_file":null,
            "decommissioned":true,"epoch":1,"http":"h","log":{"end":0,"start":0},"name":null,
            "peer":"p","peer_listen":null,"replica":"r","version":"v","writes_applied":0},
            "peers":[],"swim":null}"#,
    );
    assert!(none.swim.is_none() && none.node.decommissioned);
}

#[test]
fn member_removal() {
    let r: MemberRemoved = roundtrip(
        r#"{"already":false,"at_ms":1795946400000,"by":"0a0a","name":"beta","removed":"0b0c"}"#,
    );
    documented("| 200 `{\"removed\"", 1, &r);
    let unknown: MemberRemoved =
        roundtrip(r#"{"already":true,"at_ms":null,"by":null,"name":"0b0c","removed":"0b0c"}"#);
    assert!(unknown.already && unknown.by.is_none());
}

#[test]
fn probes() {
    let ok: ProbeReply = roundtrip(r#"{"status":"ok"}"#);
    assert_eq!(ok.status, "ok");
    roundtrip::<ProbeReply>(r#"{"status":"ready"}"#);
}

#[test]
fn readers_ignore_members_they_do_not_know_and_name_a_wrong_one() {
    let ops: OpsReply =
        serde_json::from_str(r#"{"applied":1,"duplicates":0,"added_later":true}"#).expect("read");
    assert_eq!(ops.applied, 1);
    let e = serde_json::from_str::<OpsReply>(r#"{"applied":"1","duplicates":0}"#)
        .expect_err("a string is no count");
    assert!(e.to_string().contains("invalid type"), "{e}");
    let e = serde_json::from_str::<OpsReply>(r#"{"applied":1}"#).expect_err("missing");
    assert!(e.to_string().contains("duplicates"), "{e}");
}

/// Asserts `row` names every member of `value` (in backticks).
fn named_in(row: &str, value: &impl Serialize) {
    for k in keys_of(value) {
        assert!(
            row.contains(&format!("`{k}`")),
            "API.md's row lacks `{k}`: {row}"
        );
    }
}
