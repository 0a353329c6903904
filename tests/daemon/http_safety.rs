//! The daemon safe by default against browsers and careless clients: a page of another site
//! cannot write (content type, `Origin`), a DNS-rebinding page cannot read (`Host`), and every
//! error is the JSON error shape.

use crate::http_support;

use http_support::{Served, get, post, raw, value};
use serde_json::json;

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
    http_support::missing(&s, "lww", "pwn");
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
    // Liveness and readiness answer whatever the Host (probes behind port mappings and proxies
    // send their own; the answer is only a status word); the node's own names are served.
    for probe in ["/healthz", "/readyz"] {
        let (status, _) = raw(
            s.addr,
            &format!("GET {probe} HTTP/1.1\r\nHost: evil.example:{port}"),
            b"",
        );
        assert_eq!(status, 200, "{probe}");
    }
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
        r#"[{"type":"lww","key":"side","op":"set","value":1},{"type":"gcounter","key":"g","op":"inc"}]"#,
    );
    assert_eq!(
        (a.status, a.code(), a.at()),
        (409, "overflow", "index 1, field by"),
        "{a:?}"
    );
    assert_eq!(value(&s, "gcounter", "g"), json!(max));
    // Nothing of the batch applied: the other op's key was never written.
    http_support::missing(&s, "lww", "side");
    // Within one batch: each op fits, together they do not.
    let half = max / 2 + 1;
    let a = post(
        &url,
        format!(
            r#"[{{"type":"gcounter","key":"h","op":"inc","by":{half}}},{{"type":"gcounter","key":"h","op":"inc","by":{half}}}]"#
        ),
    );
    assert_eq!(
        (a.status, a.code(), a.at()),
        (409, "overflow", "index 1, field by"),
        "{a:?}"
    );
    http_support::missing(&s, "gcounter", "h");
    // A pncounter is bounded by the i64 range both ways; NDJSON names the line.
    let a = post(
        &url,
        format!("{{\"type\":\"pncounter\",\"key\":\"p\",\"op\":\"dec\",\"by\":{max}}}\n"),
    );
    assert_eq!(
        (a.status, a.code(), a.at()),
        (409, "overflow", "line 1, field by"),
        "{a:?}"
    );
    let a = post(
        &url,
        format!(
            r#"[{{"type":"pncounter","key":"p","op":"inc","by":{}}}]"#,
            i64::MAX
        ),
    );
    assert_eq!(a.status, 200, "{a:?}");
    let a = post(&url, r#"[{"type":"pncounter","key":"p","op":"inc"}]"#);
    assert_eq!((a.status, a.code()), (409, "overflow"), "{a:?}");
    assert_eq!(value(&s, "pncounter", "p"), json!(i64::MAX));
    // The value stays in range, but this node's own increments would pass u64::MAX (where
    // they saturate and the value goes wrong): refused, and the value is exact.
    let big = 9_000_000_000_000_000_000u64;
    for (op, expect) in [
        ("inc", 200),
        ("dec", 200),
        ("inc", 200),
        ("dec", 200),
        ("inc", 409),
    ] {
        let a = post(
            &url,
            format!(r#"[{{"type":"pncounter","key":"q","op":"{op}","by":{big}}}]"#),
        );
        assert_eq!(a.status, expect, "{op} {big}: {a:?}");
    }
    assert_eq!(value(&s, "pncounter", "q"), json!(0));
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
    let a = post(
        &url,
        format!("{{\"type\":\"lww\",\"key\":\"d\",\"op\":\"set\",\"value\":1}}\n{dup}\n"),
    );
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_op", "line 2, field type"),
        "{a:?}"
    );
    // Inside a value, at any depth.
    for value in [r#"{"a":1,"a":2}"#, r#"[{"x":{"b":1,"b":1}}]"#] {
        let a = post(
            &url,
            format!(r#"[{{"type":"lww","key":"d","op":"set","value":{value}}}]"#),
        );
        assert_eq!(
            (a.status, a.code(), a.at()),
            (400, "invalid_op", "index 0, field value"),
            "{value}: {a:?}"
        );
    }
    http_support::missing(&s, "lww", "d");
    http_support::missing(&s, "gcounter", "d");
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
    http_support::missing(&s, "gcounter", "e");
}

#[test]
fn every_error_is_the_json_error_shape() {
    let s = Served::start();
    let h = host(&s);
    let a = post(&s.url("/v1/streams/%FF/events"), "{}\n");
    assert_eq!(
        (a.status, a.code(), a.at()),
        (400, "invalid_stream", "path stream"),
        "{a:?}"
    );
    for (req, status, at) in [
        ("GET /v1/keys/lww/%FF", 400, "path name"),
        ("GET /v1/keys?prefix=%FF", 400, "query"),
        ("GET /v1/watch?prefix=a%C3", 400, "query"),
        ("GET /v1/views/v?group.page=%FF", 400, "query"),
        ("GET /v1/keys/%FF/x", 400, "path type"),
        ("GET /v1/views/v/final", 404, ""),
        ("GET /v1/views/%FF/final", 400, "path view"),
        ("GET /v1/streams/%FF/late", 400, "path stream"),
        ("GET /v1/keys?limit=-1", 400, "query limit"),
        ("GET /v1/keys?limit=x", 400, "query limit"),
        ("GET /v1/keys?type=a&type=b", 400, "query type"),
        ("GET /v1/keys?type=lww&type=lww", 400, "query type"),
        ("GET /v1/watch?type=a&type=b", 400, "query type"),
        ("GET /v1/watch?prefix=a&prefix=b", 400, "query prefix"),
        ("DELETE /v1/ops", 405, ""),
        ("GET /v1/ops", 405, ""),
        ("GET /v1/views/%FF", 400, "path view"),
        ("GET /v1/keys/gcounter/%FF", 400, "path name"),
        ("POST /v1/cluster/members/%FF/remove", 400, "path name"),
    ] {
        let (got, body) = raw(s.addr, &format!("{req} HTTP/1.1\r\nHost: {h}"), b"");
        assert_eq!(got, status, "{req}: {body}");
        assert!(
            body["error"]["code"].is_string(),
            "{req}: not the JSON shape: {body}"
        );
        assert!(body["error"]["message"].is_string(), "{req}: {body}");
        if !at.is_empty() {
            assert_eq!(body["error"]["at"], at, "{req}: {body}");
        }
        // A path that does not decode has a code of its own, never the generic one, and
        // the message is the API's, not the router's.
        assert_ne!(body["error"]["code"], "bad_request", "{req}: {body}");
        assert!(
            !body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("Invalid URL"),
            "{req}: {body}"
        );
    }
    let (got, body) = raw(
        s.addr,
        &format!("POST /v1/cluster/members/%FF/remove HTTP/1.1\r\nHost: {h}"),
        b"",
    );
    assert_eq!(
        (got, &body["error"]["code"]),
        (400, &json!("invalid_path")),
        "{body}"
    );
    let (got, body) = raw(
        s.addr,
        &format!(
            "POST /v1/streams/%FF/events HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/x-ndjson"
        ),
        b"{\"source\":\"a\",\"seq\":1}",
    );
    assert_eq!(got, 400, "{body}");
    assert!(body["error"]["code"].is_string(), "{body}");
}

/// The permission bits of `path`.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
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
    assert_eq!(
        mode(&shared),
        0o1777,
        "the node changed the mode of a directory it did not create"
    );
    assert_eq!(
        mode(&shared.join(tidemark::store::DB_FILE)),
        0o600,
        "data file mode"
    );
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

use crate::daemon_support;

/// A `/proc/<pid>/status` field in bytes (`VmRSS`, `VmHWM`).
fn proc_bytes(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

const MIB: u64 = 1024 * 1024;

#[test]
fn an_8_mib_body_costs_the_daemon_a_small_multiple_of_its_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (mut child, url, _) = daemon_support::spawn_serve(&[
        "--http".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--peer-listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--data".as_ref(),
        data.as_os_str(),
    ]);
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("addr");
    let pid = child.id();
    let head = format!("POST /v1/ops HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json");
    let (status, _) = raw(addr, &head, PWN.as_bytes());
    assert_eq!(status, 200);
    let base = proc_bytes(pid, "VmRSS:");
    // The issue's body: 8 MiB of `{"a":1}` objects (refused at the first one).
    let n = (8 * MIB as usize - 2) / 8;
    let mut objects = String::with_capacity(8 * MIB as usize);
    objects.push('[');
    for i in 0..n {
        if i > 0 {
            objects.push(',');
        }
        objects.push_str(r#"{"a":1}"#);
    }
    objects.push(']');
    let (status, body) = raw(addr, &head, objects.as_bytes());
    assert_eq!(status, 400, "{body}");
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..3)
            .map(|_| sc.spawn(|| raw(addr, &head, objects.as_bytes()).0))
            .collect();
        for h in hs {
            assert_eq!(h.join().expect("client"), 400);
        }
    });
    let grown = proc_bytes(pid, "VmHWM:").saturating_sub(base);
    println!(
        "daemon peak RSS grew by {} MiB for one then three parallel 8 MiB bodies of objects",
        grown / MIB
    );
    // The bodies themselves are 32 MiB; a tree of them was ~712 MiB each.
    assert!(grown < 96 * MIB, "peak RSS grew by {} MiB", grown / MIB);
    // A valid 8 MiB batch whose values are such arrays (each value under the 64 KiB limit):
    // memory is a small multiple of the body, not the ~89x of a tree of the whole batch.
    let value = format!("[{}]", vec![r#"{"a":1}"#; 8000].join(","));
    let op = format!(r#"{{"type":"lww","key":"k{{}}","op":"set","value":{value}}}"#);
    let ops: Vec<String> = (0..(8 * MIB as usize / op.len()) - 1)
        .map(|i| op.replace("k{}", &format!("k{i}")))
        .collect();
    let batch = format!("[{}]", ops.join(","));
    assert!(batch.len() < 8 * MIB as usize);
    let before = proc_bytes(pid, "VmHWM:");
    let (status, body) = raw(addr, &head, batch.as_bytes());
    assert_eq!(status, 200, "{body}");
    let grown = proc_bytes(pid, "VmHWM:").saturating_sub(before.max(base));
    println!(
        "daemon peak RSS grew by {} MiB applying a valid {} MiB batch of {} ops",
        grown / MIB,
        batch.len() as u64 / MIB,
        ops.len()
    );
    assert!(grown < 160 * MIB, "peak RSS grew by {} MiB", grown / MIB);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn bodies_in_flight_share_one_byte_budget() {
    use std::io::Write;
    let s = Served::start_with(|_, h| {
        h.body_bytes_max = 1024 * 1024;
        h.inflight_bytes_max = 1024 * 1024;
    });
    let h = host(&s);
    // A body that has sent all but its last bytes holds the whole budget.
    let mut slow = std::net::TcpStream::connect(s.addr).expect("connect");
    let len = 1024 * 1024;
    write!(
        slow,
        "POST /v1/ops HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    )
    .expect("head");
    slow.write_all(&vec![b' '; len - 16]).expect("body");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, body) = raw(
        s.addr,
        &format!("POST /v1/ops HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/json"),
        &[b' '; 100_000],
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("inflight_bytes")),
        "{body}"
    );
    drop(slow);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(post(&s.url("/v1/ops"), PWN).status, 200);
}

#[test]
fn trickling_bodies_do_not_starve_a_normal_client() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let s = Served::start_with(|_, h| h.concurrency_max = 8);
    let h = host(&s);
    // Sixteen writes that send a byte now and then: eight ops bodies, eight ingests.
    let mut slow: Vec<std::net::TcpStream> = (0..16)
        .map(|i| {
            let mut c = std::net::TcpStream::connect(s.addr).expect("connect");
            let path = if i % 2 == 0 { "/v1/ops" } else { "/v1/streams/t/events" };
            write!(
                c,
                "POST {path} HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            )
            .expect("head");
            c
        })
        .collect();
    for round in 0..8 {
        for c in &mut slow {
            let _ = c.write_all(if round == 0 { b"[" } else { b" " });
        }
        let t = Instant::now();
        let a = get(&s.url("/v1/keys"));
        assert_eq!(a.status, 200, "{a:?}");
        let a = post(&s.url("/v1/ops"), PWN);
        assert_eq!(a.status, 200, "{a:?}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "a normal client waited {:?} behind trickling bodies",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_trickled_body_is_cut_off_by_the_overall_deadline() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let s = Served::start_with(|_, h| h.body_read_timeout_ms = 1_000);
    let mut c = std::net::TcpStream::connect(s.addr).expect("connect");
    write!(
        c,
        "POST /v1/ops HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n[",
        host(&s)
    )
    .expect("head");
    c.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let started = Instant::now();
    let mut answer = Vec::new();
    // A byte every 200 ms: each chunk is within the per-chunk timeout, the whole is not.
    while started.elapsed() < Duration::from_secs(10) {
        let _ = c.write_all(b" ");
        let mut buf = [0u8; 512];
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 408"),
        "{text:?} after {:?}",
        started.elapsed()
    );
}

#[test]
fn under_a_1024_file_limit_1100_idle_connections_leave_the_node_serving() {
    use std::io::{Read, Write};
    // This process needs room for its own 1,100 connections.
    let own = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: own.maximum,
            maximum: own.maximum,
        },
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bin = env!("CARGO_BIN_EXE_tidemark");
    let mut child = std::process::Command::new("prlimit")
        .args(["--nofile=1024:1024", bin, "serve", "--http", "127.0.0.1:0"])
        .args(["--peer-listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn prlimit");
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
    }
    let addr: std::net::SocketAddr = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(|u| u.trim_start_matches("http://").trim_end_matches('/'))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    // A client connected before the flood keeps its connection.
    let mut client = std::net::TcpStream::connect(addr).expect("connect");
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .expect("timeout");
    let idle: Vec<std::net::TcpStream> = (0..1100)
        .filter_map(|_| std::net::TcpStream::connect(addr).ok())
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // The node still has descriptors for its own work: a snapshot creates files.
    write!(
        client,
        "GET /v1/snapshot HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut head = [0u8; 12];
    let got = client.read_exact(&mut head).map(|()| head.to_vec());
    drop(idle);
    let _ = child.kill();
    let _ = child.wait();
    let head = got.map(|h| String::from_utf8_lossy(&h).into_owned());
    assert_eq!(
        head.as_deref().ok(),
        Some("HTTP/1.1 200"),
        "the node ran out of descriptors: {head:?}"
    );
}

#[test]
fn ingests_hold_only_the_line_bytes_they_sent_and_each_line_has_a_deadline() {
    use std::io::{Read, Write};
    let s = Served::start_with(|_, h| {
        h.line_bytes_max = 1024 * 1024;
        h.body_bytes_max = 1024 * 1024;
        h.inflight_bytes_max = 3 * 1024 * 1024;
        // Long enough that the three big lines below all hold their share at once on a loaded
        // machine (each is cut off one body timeout after its first byte); at 1.5 s a clean CI
        // run once saw the first cut off before the third was read, so no request was refused.
        h.body_read_timeout_ms = 4000;
    });
    let h = host(&s);
    let head = format!(
        "POST /v1/streams/t/events HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/x-ndjson\r\nContent-Length: 2000000\r\n\r\n"
    );
    let start = |partial: usize| {
        let mut c = std::net::TcpStream::connect(s.addr).expect("connect");
        c.write_all(head.as_bytes()).expect("head");
        c.write_all(&vec![b' '; partial]).expect("part of a line");
        c
    };
    let ingest = r#"{"source":"a","seq":1,"ops":[{"type":"gcounter","key":"g","op":"inc"}]}"#;
    let one = |seq: u64| {
        raw(
            s.addr,
            &format!(
                "POST /v1/streams/t/events HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/x-ndjson"
            ),
            ingest
                .replace("\"seq\":1", &format!("\"seq\":{seq}"))
                .as_bytes(),
        )
    };
    // 40 ingests that trickle the start of a first line hold a step of the budget each, not a
    // whole line's worth: a normal ingest is served (it used to be refused past 3).
    let trickling: Vec<_> = (0..40).map(|_| start(10)).collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, body) = one(1);
    assert_eq!(status, 200, "{body}");
    drop(trickling);
    // Three that sent ~1 MB of a line each hold the budget: the next is refused, not buffered.
    let mut big: Vec<_> = (0..3).map(|_| start(1_000_000)).collect();
    // Once the server has read their bytes (how soon depends on the machine's load; the same
    // event again is only a duplicate until then).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, body) = loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (status, body) = one(2);
        if status != 200 || std::time::Instant::now() > deadline {
            break (status, body);
        }
    };
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("inflight_bytes")),
        "{body}"
    );
    // A line still not whole after the body timeout is cut off (408 naming the line), though
    // bytes kept coming: a trickle cannot hold its share forever.
    let c = big.last_mut().expect("one");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut answer = Vec::new();
    c.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .expect("timeout");
    while !String::from_utf8_lossy(&answer).contains("body_timeout") {
        assert!(
            std::time::Instant::now() < deadline,
            "never cut off: {}",
            String::from_utf8_lossy(&answer)
        );
        let _ = c.write_all(b" ");
        let mut buf = [0u8; 1024];
        if let Ok(n) = c.read(&mut buf) {
            answer.extend_from_slice(&buf[..n]);
        }
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("line 1"), "{text}");
    drop(big);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, body) = one(3);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_request_a_page_of_another_site_caused_is_refused_without_an_origin() {
    let s = Served::start();
    let url = s.url("/v1/keys");
    for (site, want) in [
        ("cross-site", 403),
        ("same-site", 403),
        ("same-origin", 200),
        ("none", 200),
    ] {
        let (a, _) = http_support::request("GET", &url, &[("Sec-Fetch-Site", site)]);
        assert_eq!(a.status, want, "{site}: {a:?}");
        if want == 403 {
            assert_eq!(
                (a.code(), a.at()),
                ("origin_not_allowed", "header Sec-Fetch-Site")
            );
        }
    }
    // An `<img>` of the snapshot from another site: refused too.
    let (a, _) = http_support::request(
        "GET",
        &s.url("/v1/snapshot"),
        &[
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Dest", "image"),
        ],
    );
    assert_eq!(a.status, 403, "{a:?}");
}

#[test]
fn a_key_listing_of_large_sets_is_paged_by_bytes() {
    let s = Served::start();
    // Three sets of ~600 KB each: one page of all three would be ~1.8 MB.
    for set in ["s1", "s2", "s3"] {
        let ops: Vec<String> = (0..600)
            .map(|i| format!(r#"{{"type":"orset","key":"{set}","op":"add","value":"{i:0>990}"}}"#))
            .collect();
        assert_eq!(
            post(&s.url("/v1/ops"), format!("[{}]", ops.join(","))).status,
            200
        );
    }
    let mut seen = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let a = get(&s.url(&format!("/v1/keys?type=orset&after={after}")));
        assert_eq!(a.status, 200);
        assert!(
            a.text.len() < 2 * 1024 * 1024,
            "a page of {} bytes",
            a.text.len()
        );
        pages += 1;
        for k in a.json["keys"].as_array().expect("keys") {
            seen.push(k["key"].as_str().expect("name").to_owned());
        }
        match a.json["next"].as_str() {
            Some(next) => after = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(seen, ["s1", "s2", "s3"]);
    assert!(pages >= 2, "one page held all three");
}

/// A client that writes its whole ingest body before it reads the answer (as most HTTP/1
/// clients do, the CLI's among them) receives the refusal of a bad first line, not a reset
/// connection, though the node refused it long before the body ended: the node reads and drops
/// the rest (bounded) before it answers.
#[test]
fn a_refusal_early_in_a_long_body_reaches_a_client_that_sends_it_all_first() {
    use std::io::{Read, Write};
    let s = Served::start();
    let h = host(&s);
    let good = "{\"source\":\"a\",\"seq\":1}\n";
    let mut body = String::from("{\"source\":\"a\",\"seq\":1,\"time\":\"noon\"}\n");
    while body.len() < 1_000_000 {
        body.push_str(good);
    }
    for round in 0..5 {
        let mut c = std::net::TcpStream::connect(s.addr).expect("connect");
        let head = format!(
            "POST /v1/streams/t/events HTTP/1.1\r\nHost: {h}\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        c.write_all(head.as_bytes()).expect("head");
        let (first, rest) = body.as_bytes().split_at(64 * 1024);
        c.write_all(first).expect("first part");
        // The node has refused line 1 by now; the client, unaware, sends the rest.
        std::thread::sleep(std::time::Duration::from_millis(200));
        for part in rest.chunks(64 * 1024) {
            c.write_all(part)
                .unwrap_or_else(|e| panic!("round {round}: the node reset the upload: {e}"));
        }
        let mut answer = Vec::new();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&answer).contains('}') {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) => panic!("round {round}: no answer: {e}"),
            }
        }
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 400"), "round {round}: {text}");
        assert!(text.contains("line 1, field time"), "round {round}: {text}");
    }
}
