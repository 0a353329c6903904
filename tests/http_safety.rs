//! The daemon safe by default against browsers and careless clients: a page of another site
//! cannot write (content type, `Origin`), a DNS-rebinding page cannot read (`Host`), and every
//! error is the JSON error shape.

mod http_support;

use http_support::{Served, get, post, raw, value};
use serde_json::{Value as J, json};

const PWN: &str = r#"[{"type":"lww","key":"pwn","op":"set","value":1}]"#;

fn host(s: &Served) -> String {
    format!("127.0.0.1:{}", s.addr.port())
}

#[test]
fn a_cross_site_simple_post_is_refused_and_not_applied() {
    let s = Served::start();
    let h = host(&s);
    // What a page of any site can send without a CORS preflight.
    for ct in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let (status, body) = raw(
            s.addr,
            &format!(
                "POST /v1/ops HTTP/1.1\r\nHost: {h}\r\nOrigin: http://evil.example\r\nContent-Type: {ct}"
            ),
            PWN.as_bytes(),
        );
        assert_eq!(status, 403, "{ct}: {body}");
        assert_eq!(body["error"]["code"], "origin_not_allowed", "{body}");
        // Without an Origin (an older browser, a sandboxed frame's form), the type alone is
        // refused.
        let (status, body) = raw(
            s.addr,
            &format!("POST /v1/ops HTTP/1.1\r\nHost: {h}\r\nContent-Type: {ct}"),
            PWN.as_bytes(),
        );
        assert_eq!(status, 415, "{ct}: {body}");
        assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
        assert_eq!(body["error"]["at"], "header Content-Type", "{body}");
    }
    // No content type at all (a `Blob` body) is refused too, and so is an NDJSON ingest.
    let (status, body) = raw(
        s.addr,
        &format!("POST /v1/ops HTTP/1.1\r\nHost: {h}"),
        PWN.as_bytes(),
    );
    assert_eq!(status, 415, "{body}");
    let (status, body) = raw(
        s.addr,
        &format!("POST /v1/streams/s/events HTTP/1.1\r\nHost: {h}\r\nContent-Type: text/plain"),
        br#"{"source":"a","seq":1,"ops":[{"type":"lww","key":"pwn","op":"set","value":2}]}"#,
    );
    assert_eq!(status, 415, "{body}");
    // A JSON write from the page's own site is refused by its Origin.
    let (status, body) = raw(
        s.addr,
        &format!(
            "POST /v1/ops HTTP/1.1\r\nHost: {h}\r\nOrigin: http://evil.example\r\nContent-Type: application/json"
        ),
        PWN.as_bytes(),
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(value(&s, "lww", "pwn"), J::Null, "nothing was applied");
    // The node's own console origin and plain API clients still write.
    let (status, body) = raw(
        s.addr,
        &format!(
            "POST /v1/ops HTTP/1.1\r\nHost: {h}\r\nOrigin: http://{h}\r\nContent-Type: application/json"
        ),
        PWN.as_bytes(),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = raw(
        s.addr,
        &format!("POST /v1/ops HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/x-ndjson"),
        br#"{"type":"lww","key":"ok","op":"set","value":3}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(value(&s, "lww", "ok"), json!(3));
}

#[test]
fn allowed_origins_admit_another_console() {
    let s = Served::start_with(|_, h| h.allowed_origins = vec!["https://console.example".into()]);
    let h = host(&s);
    let (status, body) = raw(
        s.addr,
        &format!(
            "POST /v1/ops HTTP/1.1\r\nHost: {h}\r\nOrigin: https://console.example\r\nContent-Type: application/json"
        ),
        PWN.as_bytes(),
    );
    assert_eq!(status, 200, "{body}");
    let (status, _) = raw(
        s.addr,
        &format!("GET /v1/keys HTTP/1.1\r\nHost: {h}\r\nOrigin: https://other.example"),
        b"",
    );
    assert_eq!(status, 403);
}

#[test]
fn a_foreign_host_is_refused_on_reads_watch_and_snapshot() {
    let s = Served::start();
    assert_eq!(post(&s.url("/v1/ops"), PWN).status, 200);
    let port = s.addr.port();
    for path in [
        "/v1/keys",
        "/v1/keys/lww/pwn",
        "/v1/watch",
        "/v1/snapshot",
        "/v1/cluster",
        "/metrics",
        "/",
    ] {
        for foreign in [
            format!("evil.example:{port}"),
            "evil.example".to_owned(),
            format!("127.0.0.1:{}", port.wrapping_add(1)),
        ] {
            let (status, body) = raw(
                s.addr,
                &format!("GET {path} HTTP/1.1\r\nHost: {foreign}"),
                b"",
            );
            assert_eq!(status, 421, "{path} with Host {foreign}: {body}");
            assert_eq!(body["error"]["code"], "host_not_allowed", "{body}");
        }
    }
    // Liveness answers whatever the Host; the node's own names are served.
    let (status, _) = raw(
        s.addr,
        &format!("GET /healthz HTTP/1.1\r\nHost: evil.example:{port}"),
        b"",
    );
    assert_eq!(status, 200);
    for own in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
    ] {
        let (status, body) = raw(
            s.addr,
            &format!("GET /v1/keys/lww/pwn HTTP/1.1\r\nHost: {own}"),
            b"",
        );
        assert_eq!(status, 200, "Host {own}: {body}");
    }
    assert_eq!(get(&s.url("/v1/keys")).status, 200);
}

#[test]
fn allowed_hosts_add_names() {
    let s = Served::start_with(|_, h| h.allowed_hosts = vec!["tidemark.internal".into()]);
    let (status, body) = raw(
        s.addr,
        "GET /v1/keys HTTP/1.1\r\nHost: tidemark.internal",
        b"",
    );
    assert_eq!(status, 200, "{body}");
    let (status, _) = raw(s.addr, "GET /v1/keys HTTP/1.1\r\nHost: other.internal", b"");
    assert_eq!(status, 421);
}

#[test]
fn an_increment_that_would_overflow_is_refused_and_nothing_applies() {
    let s = Served::start();
    let url = s.url("/v1/ops");
    let max = u64::MAX;
    let a = post(
        &url,
        format!(r#"[{{"type":"gcounter","key":"g","op":"inc","by":{max}}}]"#),
    );
    assert_eq!(a.status, 200, "{a:?}");
    // An increment past u64::MAX, after an op that alone would apply.
    let a = post(
        &url,
        format!(
            r#"[{{"type":"lww","key":"side","op":"set","value":1}},{{"type":"gcounter","key":"g","op":"inc"}}]"#
        ),
    );
    assert_eq!((a.status, a.code(), a.at()), (409, "overflow", "index 1, field by"), "{a:?}");
    assert_eq!(value(&s, "gcounter", "g"), json!(max));
    assert_eq!(value(&s, "lww", "side"), J::Null, "part of the batch applied");
    // Within one batch: each op fits, together they do not.
    let half = max / 2 + 1;
    let a = post(
        &url,
        format!(
            r#"[{{"type":"gcounter","key":"h","op":"inc","by":{half}}},{{"type":"gcounter","key":"h","op":"inc","by":{half}}}]"#
        ),
    );
    assert_eq!((a.status, a.code(), a.at()), (409, "overflow", "index 1, field by"), "{a:?}");
    assert_eq!(value(&s, "gcounter", "h"), json!(0));
    // A pncounter is bounded by the i64 range both ways; NDJSON names the line.
    let a = post(
        &url,
        format!("{{\"type\":\"pncounter\",\"key\":\"p\",\"op\":\"dec\",\"by\":{max}}}\n"),
    );
    assert_eq!((a.status, a.code(), a.at()), (409, "overflow", "line 1, field by"), "{a:?}");
    let a = post(
        &url,
        format!(r#"[{{"type":"pncounter","key":"p","op":"inc","by":{}}}]"#, i64::MAX),
    );
    assert_eq!(a.status, 200, "{a:?}");
    let a = post(&url, r#"[{"type":"pncounter","key":"p","op":"inc"}]"#);
    assert_eq!((a.status, a.code()), (409, "overflow"), "{a:?}");
    assert_eq!(value(&s, "pncounter", "p"), json!(i64::MAX));
    // Through an event's ops as well.
    let a = post(
        &s.url("/v1/streams/s/events"),
        r#"{"source":"a","seq":1,"ops":[{"type":"gcounter","key":"g","op":"inc"}]}"#,
    );
    assert_eq!((a.status, a.code()), (409, "overflow"), "{a:?}");
    assert_eq!(value(&s, "gcounter", "g"), json!(max));
}

#[test]
fn duplicate_members_are_refused_naming_the_member() {
    let s = Served::start();
    let url = s.url("/v1/ops");
    let dup = r#"{"type":"lww","key":"d","op":"set","value":1,"type":"gcounter"}"#;
    let a = post(&url, format!("[{dup}]"));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_op", "index 0, field type"),
        "{a:?}"
    );
    let a = post(&url, format!("{{\"type\":\"lww\",\"key\":\"d\",\"op\":\"set\",\"value\":1}}\n{dup}\n"));
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_op", "line 2, field type"),
        "{a:?}"
    );
    assert_eq!(value(&s, "lww", "d"), J::Null);
    assert_eq!(value(&s, "gcounter", "d"), json!(0));
    let a = post(
        &s.url("/v1/streams/s/events"),
        r#"{"source":"a","seq":1,"seq":2,"ops":[{"type":"gcounter","key":"e","op":"inc"}]}"#,
    );
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_event", "line 1, field seq"),
        "{a:?}"
    );
    let a = post(
        &s.url("/v1/streams/s/events"),
        r#"{"source":"a","seq":1,"ops":[{"type":"gcounter","key":"e","op":"inc","by":1,"by":5}]}"#,
    );
    assert_eq!((a.status, a.code()), (400, "invalid_event"), "{a:?}");
    assert_eq!(value(&s, "gcounter", "e"), json!(0));
}

#[test]
fn every_error_is_the_json_error_shape() {
    let s = Served::start();
    let h = host(&s);
    for (req, status, at) in [
        ("GET /v1/keys/lww/%FF", 400, "path"),
        ("GET /v1/keys?limit=-1", 400, "query limit"),
        ("GET /v1/keys?limit=x", 400, "query limit"),
        ("GET /v1/keys?type=a&type=b", 400, "query type"),
        ("GET /v1/keys?type=lww&type=lww", 400, "query type"),
        ("GET /v1/watch?type=a&type=b", 400, "query type"),
        ("GET /v1/watch?prefix=a&prefix=b", 400, "query prefix"),
        ("DELETE /v1/ops", 405, ""),
        ("GET /v1/ops", 405, ""),
        ("GET /v1/views/%FF", 400, "path view"),
    ] {
        let (got, body) = raw(s.addr, &format!("{req} HTTP/1.1\r\nHost: {h}"), b"");
        assert_eq!(got, status, "{req}: {body}");
        assert!(body["error"]["code"].is_string(), "{req}: not the JSON shape: {body}");
        assert!(body["error"]["message"].is_string(), "{req}: {body}");
        if !at.is_empty() {
            assert_eq!(body["error"]["at"], at, "{req}: {body}");
        }
    }
    let (got, body) = raw(
        s.addr,
        &format!("POST /v1/streams/%FF/events HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/x-ndjson"),
        b"{\"source\":\"a\",\"seq\":1}",
    );
    assert_eq!(got, 400, "{body}");
    assert!(body["error"]["code"].is_string(), "{body}");
}

/// The permission bits of `path`.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o7777
}

#[test]
fn an_existing_directory_keeps_its_mode_and_data_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    let shared = root.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let data = shared.clone();
    let s = Served::start_with(move |n, _| n.data_dir = data);
    assert_eq!(mode(&shared), 0o1777, "the node changed the mode of a directory it did not create");
    assert_eq!(mode(&shared.join(tidemark::store::DB_FILE)), 0o600, "data file mode");
    let out = root.path().join("copy.tmsnap");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(s.node.snapshot(&out)).expect("snapshot");
    assert_eq!(mode(&out), 0o600, "snapshot file mode");
    s.stop();
    // A directory the node creates is its owner's only.
    let fresh = root.path().join("new/data");
    let data = fresh.clone();
    let s = Served::start_with(move |n, _| n.data_dir = data);
    assert_eq!(mode(&fresh), 0o700);
    s.stop();
}
