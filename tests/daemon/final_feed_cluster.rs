//! The final-window feed across three `tidemark serve` daemons (the real binary, QUIC with
//! mutual TLS on loopback): events of one windowed view are ingested on every node, each with
//! its own source, round by round, so windows become final one after another. A consumer
//! follows `GET /v1/views/{view}/final` as NDJSON on each node. Every node's feed carries the
//! same `(window, group, value, version)` for the same windows, each window once, in window
//! order, and equal to the count of the events ingested; one daemon is killed with SIGKILL
//! while windows become final, restarted, and its consumer resumes from the last cursor it
//! read: across the restart no window is lost or delivered twice.

use crate::daemon_support;

use daemon_support::{Daemon, issue_certs};
use serde_json::Value as J;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const VIEW: &str = "clicks";
const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
/// Rounds of events, one window each: after round r every window before r is final.
const ROUNDS: u64 = 8;
/// The round after which gamma is killed (its events for it ingested first).
const KILL_AFTER: u64 = 4;
const PAGES: u64 = 3;

/// The count of events ingested per (window start, page).
type Expected = BTreeMap<(u64, String), u64>;

/// One window as a feed delivered it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Delivered {
    start: u64,
    page: String,
    value: u64,
    version: u64,
    cursor: String,
}

fn get_json(url: &str) -> J {
    let body = ureq::get(url)
        .call()
        .expect("GET")
        .into_body()
        .read_to_string()
        .expect("body");
    serde_json::from_str(&body).expect("json")
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port()
}

/// `serve` for member `i` of the cluster in `dir` (alpha on the seed address, the others
/// joining it).
fn start(dir: &Path, i: usize, seed: &str) -> Daemon {
    let p = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let (config, tls, data) = (
        p("views.toml"),
        p(&format!("{}-tls", NAMES[i])),
        p(NAMES[i]),
    );
    let peer = if i == 0 { seed } else { "127.0.0.1:0" };
    let mut args = vec![
        "--config",
        &config,
        "--http",
        "127.0.0.1:0",
        "--peer-listen",
        peer,
        "--tls",
        &tls,
        "--data",
        &data,
    ];
    if i > 0 {
        args.extend(["--join", seed]);
    }
    Daemon::spawn(&args).0
}

/// Waits until `url` answers `/readyz` 200 and sees `alive` other members alive.
fn await_ready(url: &str, alive: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = ureq::get(&format!("{url}/readyz"))
            .call()
            .is_ok_and(|r| r.status() == 200);
        let c = get_json(&format!("{url}/v1/cluster"));
        let seen = c["members"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["state"] == "alive").count());
        if ready && seen >= alive {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never ready: {c}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Follows the final feed of `url` as NDJSON after `after` in a thread, appending each window
/// to `out` (a line cut by the connection's end is not one). The thread ends when the
/// connection does, or, with `stop_at`, once `out` holds that many windows (it drops the
/// connection with what else was sent unread, as a consumer that crashed).
fn follow(
    url: &str,
    after: Option<&str>,
    out: Arc<Mutex<Vec<Delivered>>>,
    stop_at: Option<usize>,
) -> JoinHandle<()> {
    let addr = url.trim_start_matches("http://").to_owned();
    let query = after.map_or(String::new(), |c| format!("&after={c}"));
    let mut sock = TcpStream::connect(&addr).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(90)))
        .expect("timeout");
    write!(
        sock,
        "GET /v1/views/{VIEW}/final?follow=true{query} HTTP/1.1\r\nHost: {addr}\r\n\
         Accept: application/x-ndjson\r\n\r\n"
    )
    .expect("send");
    let mut reader = BufReader::new(sock);
    let url = url.to_owned();
    std::thread::spawn(move || {
        let mut line = String::new();
        reader.read_line(&mut line).expect("status");
        assert!(line.starts_with("HTTP/1.1 200"), "{url}: {line}");
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            // Chunk sizes, chunk ends and headers are not windows; neither is a cut line.
            if !line.starts_with('{') || !line.ends_with('\n') {
                continue;
            }
            let w: J = serde_json::from_str(line.trim()).expect("ndjson line");
            assert_eq!(w["event"], "final", "{w}");
            let mut out = out.lock().expect("lock");
            out.push(Delivered {
                start: w["window_start"].as_u64().expect("start"),
                page: w["group"]["page"].as_str().expect("page").to_owned(),
                value: w["value"].as_u64().expect("count"),
                version: w["version"].as_u64().expect("version"),
                cursor: w["cursor"].as_str().expect("cursor").to_owned(),
            });
            if stop_at.is_some_and(|n| out.len() >= n) {
                return;
            }
        }
    })
}

/// Waits until `got` holds `n` windows (30 s at most).
fn await_windows(name: &str, got: &Mutex<Vec<Delivered>>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let have = got.lock().expect("lock").len();
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}'s feed has {have} of {n} windows: {:?}",
            got.lock().expect("lock")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_nodes_final_feed_carries_the_same_windows_once_across_a_kill_9_and_resume() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("views.toml"),
        format!(
            "[[views]]\nname = \"{VIEW}\"\nstream = \"clicks\"\nkind = \"count\"\n\
             group_by = [\"page\"]\nwindow = {{ tumbling = \"1m\", lateness = \"0s\" }}\n"
        ),
    )
    .expect("config");
    issue_certs(dir.path(), &NAMES);
    let seed = format!("127.0.0.1:{}", free_udp_port());
    let mut nodes: Vec<Daemon> = (0..3).map(|i| start(dir.path(), i, &seed)).collect();
    for n in &nodes {
        await_ready(&n.url, 2);
    }
    let feeds: Vec<Arc<Mutex<Vec<Delivered>>>> =
        (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    // Every round gives each of the PAGES pages a window: gamma's consumer stops (as if it
    // crashed) one window into window KILL_AFTER - 1, with the rest of its page sent unread.
    let gamma_stop = (PAGES * (KILL_AFTER - 1)) as usize + 1;
    let stop_at = |i: usize| (i == 2).then_some(gamma_stop);
    let mut readers: Vec<JoinHandle<()>> = nodes
        .iter()
        .zip(&feeds)
        .enumerate()
        .map(|(i, (n, f))| follow(&n.url, None, Arc::clone(f), stop_at(i)))
        .collect();
    // Event times from 30 minutes ago, one window a round; node i sends i + 1 events a round
    // to pages chosen by round and node (so counts differ by window and page).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let base = (now - 30 * 60_000) / 60_000 * 60_000;
    let mut expected = Expected::new();
    let mut seqs = [0u64; 3];
    // Round r's events of node i (i + 1 of them), or with `warm` one event at a time until the
    // node takes one on time: a node started with --join refuses windowed events as late
    // (not_synced) until it synced the stream. Only events taken on time are expected.
    let mut ingest = |nodes: &[Daemon], i: usize, r: u64, expected: &mut Expected, warm: bool| {
        let start = base + r * 60_000;
        let url = format!("{}/v1/streams/clicks/events", nodes[i].url);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut lines = String::new();
            let mut pages = Vec::new();
            for j in 0..if warm { 1 } else { i as u64 + 1 } {
                seqs[i] += 1;
                let page = format!("/p{}", (r + i as u64 + j) % PAGES);
                lines.push_str(&format!(
                    "{{\"source\":\"{}\",\"seq\":{},\"time\":{},\"page\":\"{page}\"}}\n",
                    NAMES[i],
                    seqs[i],
                    start + 1_000 + j * 1_000
                ));
                pages.push(page);
            }
            let body = ureq::post(&url)
                .header("Content-Type", "application/x-ndjson")
                .send(lines.as_bytes())
                .expect("ingest")
                .into_body()
                .read_to_string()
                .expect("body");
            let a: J = serde_json::from_str(&body).expect("json");
            assert_eq!(a["accepted"], pages.len(), "{}: {a}", NAMES[i]);
            if a["late"] == 0 {
                for page in pages {
                    *expected.entry((start, page)).or_insert(0u64) += 1;
                }
                return;
            }
            assert!(warm, "{} round {r}: {a}", NAMES[i]);
            assert!(Instant::now() < deadline, "{} never on time: {a}", NAMES[i]);
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Windows are final everywhere once every node's watermark passed them: count what the
    // expected map holds before round `r`.
    let finals_before = |expected: &Expected, r: u64| {
        expected
            .keys()
            .filter(|(s, _)| *s < base + r * 60_000)
            .count()
    };
    for i in 0..3 {
        ingest(&nodes, i, 0, &mut expected, true);
    }
    for r in 0..KILL_AFTER {
        for i in 0..3 {
            ingest(&nodes, i, r, &mut expected, false);
        }
    }
    let n = finals_before(&expected, KILL_AFTER - 1);
    for (name, f) in NAMES.iter().zip(&feeds) {
        await_windows(name, f, n);
    }
    // Window KILL_AFTER - 1 becomes final as the round ends (gamma ingests first). Gamma's
    // consumer goes one window into it, then gamma is killed (SIGKILL) at once.
    for i in [2, 1, 0] {
        ingest(&nodes, i, KILL_AFTER, &mut expected, false);
    }
    await_windows("gamma", &feeds[2], gamma_stop);
    assert!(
        readers.remove(2).join().is_ok(),
        "gamma's first reader failed"
    );
    let _ = nodes[2].child.kill();
    let _ = nodes[2].child.wait();
    assert_eq!(feeds[2].lock().expect("lock").len(), gamma_stop);
    let last = feeds[2]
        .lock()
        .expect("lock")
        .last()
        .map(|w| w.cursor.clone());
    let before_kill = feeds[2].lock().expect("lock").len();
    nodes[2] = start(dir.path(), 2, &seed);
    await_ready(&nodes[2].url, 2);
    readers.push(follow(
        &nodes[2].url,
        last.as_deref(),
        Arc::clone(&feeds[2]),
        None,
    ));
    // Restarted with --join, gamma takes windowed events once it synced again.
    ingest(&nodes, 2, KILL_AFTER + 1, &mut expected, true);
    for r in KILL_AFTER + 1..ROUNDS {
        for i in 0..3 {
            ingest(&nodes, i, r, &mut expected, false);
        }
    }
    let n = finals_before(&expected, ROUNDS - 1);
    for (name, f) in NAMES.iter().zip(&feeds) {
        await_windows(name, f, n);
    }
    // No window after the last final one arrives late: give the feeds a poll or two.
    std::thread::sleep(Duration::from_millis(600));
    let want: Vec<(u64, String, u64, u64)> = expected
        .iter()
        .filter(|((s, _), _)| *s < base + (ROUNDS - 1) * 60_000)
        .map(|((s, p), v)| (*s, p.clone(), *v, 1))
        .collect();
    for (name, f) in NAMES.iter().zip(&feeds) {
        let got = f.lock().expect("lock").clone();
        // Once each, in window order (gamma's across its restart), no window not final.
        let keys: Vec<(u64, String)> = got.iter().map(|w| (w.start, w.page.clone())).collect();
        for pair in keys.windows(2) {
            assert!(
                pair[0] < pair[1],
                "{name}: {:?} then {:?}",
                pair[0],
                pair[1]
            );
        }
        let cursors: BTreeSet<&str> = got.iter().map(|w| w.cursor.as_str()).collect();
        assert_eq!(cursors.len(), got.len(), "{name}: a cursor twice");
        let have: Vec<(u64, String, u64, u64)> = got
            .iter()
            .map(|w| (w.start, w.page.clone(), w.value, w.version))
            .collect();
        assert_eq!(have, want, "{name}'s feed against the events ingested");
    }
    // Cursors name windows, not a node's positions: the same on every node.
    let cursors = |i: usize| -> Vec<String> {
        feeds[i]
            .lock()
            .expect("lock")
            .iter()
            .map(|w| w.cursor.clone())
            .collect()
    };
    assert_eq!(cursors(0), cursors(1));
    assert_eq!(cursors(0), cursors(2));
    eprintln!(
        "gamma had {before_kill} windows when killed (resumed after {last:?}); {} windows in all, {:?}",
        want.len(),
        started.elapsed()
    );
    drop(nodes);
    for r in readers {
        assert!(r.join().is_ok(), "a reader failed");
    }
}
