//! Abuse on loopback, bounded in count and time: slowloris connections do not stop a normal
//! client and are cut off by the header-read timeout; a 1 GB body or line is refused with 413
//! without the process's memory growing with it; a watcher that stops reading holds bounded memory.

mod http_support;

use http_support::{Served, get, rss_bytes};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const DRIBBLERS: usize = 500;

/// The tests measure this process's resident memory: they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn slowloris_connections_do_not_stop_a_normal_client() {
    let _serial = serial();
    let s = Served::start_with(|_, h| h.header_read_timeout_ms = 2_000);
    let mut conns: Vec<TcpStream> = (0..DRIBBLERS)
        .map(|_| {
            let c = TcpStream::connect(s.addr).expect("connect");
            c.set_nonblocking(true).expect("nonblocking");
            c
        })
        .collect();
    let request = b"GET /v1/keys HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let started = Instant::now();
    // One header byte per connection per 250 ms while a normal client is served; each
    // normal request must complete within a second.
    for round in 0..6 {
        for c in &mut conns {
            let _ = c.write(&request[round.min(request.len() - 1)..][..1]);
        }
        let t = Instant::now();
        let a = get(&s.url("/healthz"));
        assert_eq!(a.status, 200);
        let b = get(&s.url("/v1/keys"));
        assert_eq!(b.status, 200);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "a normal client waited {:?} behind {DRIBBLERS} slow connections",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Past the header-read timeout every dribbling connection is closed by the server.
    let deadline = started + Duration::from_secs(20);
    let mut open: Vec<TcpStream> = conns;
    while !open.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} slow connections still open after the header-read timeout",
            open.len()
        );
        open.retain_mut(|c| {
            let _ = c.write(b"a");
            let mut buf = [0u8; 256];
            match c.read(&mut buf) {
                Ok(0) => false,                                               // closed
                Ok(_) => true, // an error answer (408) may come first; EOF follows
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true, // still open
                Err(_) => false, // reset
            }
        });
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(&s.url("/healthz")).status, 200);
}

/// Streams `total` bytes of `fill` after `head` until the server answers or closes; returns the
/// answer's status line and how many body bytes were sent.
fn stream_body(s: &Served, head: &str, chunked: bool, fill: u8, total: u64) -> (String, u64) {
    let mut c = TcpStream::connect(s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    c.write_all(head.as_bytes()).expect("head");
    let chunk = vec![fill; 64 * 1024];
    let mut sent = 0u64;
    c.set_nonblocking(true).expect("nonblocking");
    let mut answer = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The frame being written and how much of it is out.
    let (mut frame, mut off) = (Vec::new(), 0);
    while sent < total && Instant::now() < deadline {
        let mut buf = [0u8; 4096];
        match c.read(&mut buf) {
            Ok(n) if n > 0 => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        if off == frame.len() {
            frame = if chunked {
                let mut f = format!("{:x}\r\n", chunk.len()).into_bytes();
                f.extend_from_slice(&chunk);
                f.extend_from_slice(b"\r\n");
                f
            } else {
                chunk.clone()
            };
            off = 0;
        }
        match c.write(&frame[off..]) {
            Ok(n) => {
                off += n;
                sent += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => break,
        }
    }
    c.set_nonblocking(false).expect("blocking");
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(n) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&answer);
    (text.lines().next().unwrap_or("").to_owned(), sent)
}

const GIB: u64 = 1024 * 1024 * 1024;

#[test]
fn a_1_gb_body_gets_413_in_bounded_memory() {
    let _serial = serial();
    let s = Served::start();
    let before = rss_bytes();
    // Declared length over the limit: refused before reading.
    let (status, _) = stream_body(
        &s,
        &format!(
            "POST /v1/ops HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {GIB}\r\n\r\n",
            s.addr
        ),
        false,
        b' ',
        GIB,
    );
    assert!(status.contains("413"), "{status}");
    // Chunked, no declared length: refused once the limit (8 MiB) is read.
    let (status, sent) = stream_body(
        &s,
        &format!(
            "POST /v1/ops HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            s.addr
        ),
        true,
        b' ',
        GIB,
    );
    assert!(status.contains("413"), "{status}");
    assert!(sent < GIB, "the server read the whole gigabyte");
    // One endless NDJSON line to the streamed ingest: 413 naming the line.
    let (status, _) = stream_body(
        &s,
        &format!(
            "POST /v1/streams/s/events HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n",
            s.addr
        ),
        true,
        b'x',
        GIB,
    );
    assert!(status.contains("413"), "{status}");
    let grown = rss_bytes().saturating_sub(before);
    println!(
        "resident memory grew by {} MiB refusing 1 GB bodies",
        grown >> 20
    );
    assert!(
        grown < 64 * 1024 * 1024,
        "resident memory grew by {grown} bytes while refusing 1 GB bodies"
    );
    assert_eq!(get(&s.url("/healthz")).status, 200);
}

#[test]
fn a_large_streamed_ingest_runs_in_bounded_memory() {
    let _serial = serial();
    let s = Served::start_with(|n, h| {
        h.ingest_batch_bytes = 1024 * 1024;
        n.limits.cache_bytes = 8 * 1024 * 1024;
    });
    let before = rss_bytes();
    // ~320 MB of events in one request, sent as fast as the node commits them.
    let mut c = TcpStream::connect(s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    write!(
        c,
        "POST /v1/streams/big/events HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.addr
    )
    .expect("head");
    let pad = "p".repeat(8 * 1024);
    let events = 40_000u64;
    let mut seq = 0;
    while seq < events {
        let mut chunk = String::new();
        for _ in 0..100 {
            seq += 1;
            chunk.push_str(&format!(
                "{{\"source\":\"s\",\"seq\":{seq},\"pad\":\"{pad}\"}}\n"
            ));
        }
        write!(c, "{:x}\r\n{chunk}\r\n", chunk.len()).expect("chunk");
    }
    write!(c, "0\r\n\r\n").expect("end");
    let mut answer = String::new();
    let mut buf = [0u8; 4096];
    while !answer.contains("late") {
        let n = c.read(&mut buf).expect("answer");
        assert!(n > 0, "closed: {answer}");
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains(&format!("\"accepted\":{events}")),
        "{answer}"
    );
    let grown = rss_bytes().saturating_sub(before);
    println!(
        "resident memory grew by {} MiB for a 320 MB upload",
        grown >> 20
    );
    assert!(
        grown < 64 * 1024 * 1024,
        "resident memory grew by {grown} bytes for a 320 MB upload"
    );
}

#[test]
fn a_watcher_that_never_reads_holds_bounded_memory_on_a_large_set() {
    let _serial = serial();
    let s = Served::start_with(|n, _| n.limits.cache_bytes = 8 * 1024 * 1024);
    // A set of ~1 MiB: 1,000 elements of ~1,000 bytes.
    let element = |i: usize| format!("{i:0>990}");
    let ops: Vec<String> = (0..1000)
        .map(|i| {
            format!(
                r#"{{"type":"orset","key":"big","op":"add","value":"{}"}}"#,
                element(i)
            )
        })
        .collect();
    let w = http_support::post(&s.url("/v1/ops"), format!("[{}]", ops.join(",")));
    assert_eq!(w.status, 200, "{w:?}");
    // A watcher of the set that reads its headers and then nothing more.
    let mut watcher = TcpStream::connect(s.addr).expect("connect");
    write!(
        watcher,
        "GET /v1/watch?prefix=big HTTP/1.1\r\nHost: {}\r\n\r\n",
        s.addr
    )
    .expect("watch");
    watcher
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut head = [0u8; 256];
    let n = watcher.read(&mut head).expect("watch answer");
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    let before = rss_bytes();
    // 200 changes of the whole ~1 MiB value: ~200 MiB if each were kept for the watcher
    // (measured: 215 MiB without the byte bound).
    for i in 1000..1200 {
        let body = format!(
            r#"[{{"type":"orset","key":"big","op":"add","value":"{}"}}]"#,
            element(i)
        );
        assert_eq!(http_support::post(&s.url("/v1/ops"), body).status, 200);
    }
    let grown = rss_bytes().saturating_sub(before);
    println!(
        "resident memory grew by {} MiB with a stalled watcher over 200 changes of a 1 MiB set",
        grown >> 20
    );
    assert!(
        grown < 64 * 1024 * 1024,
        "resident memory grew by {grown} bytes with a stalled watcher"
    );
    // The watcher, reading again, is told it fell behind (reset).
    watcher
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !String::from_utf8_lossy(&seen).contains("event: reset") {
        assert!(Instant::now() < deadline, "never told it was reset");
        let n = watcher.read(&mut buf).expect("read watch");
        assert!(n > 0, "watch closed");
        seen.extend_from_slice(&buf[..n]);
        if seen.len() > 64 << 20 {
            seen.drain(..seen.len() - (1 << 20));
        }
    }
    // The set is now over 1 MiB of JSON: a change to it comes without its value, which the
    // watcher reads instead (no stream holds a copy of it).
    let body = format!(
        r#"[{{"type":"orset","key":"big","op":"add","value":"{}"}}]"#,
        element(5000)
    );
    assert_eq!(http_support::post(&s.url("/v1/ops"), body).status, 200);
    seen.clear();
    while !String::from_utf8_lossy(&seen).contains("\"value_omitted\":true") {
        assert!(Instant::now() < deadline, "no change without its value");
        let n = watcher.read(&mut buf).expect("read watch");
        assert!(n > 0, "watch closed");
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("\"value_bytes\":"), "{text}");
    assert_eq!(get(&s.url("/healthz")).status, 200);
}
