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
