//! The receiver's memory during a state transfer, on real daemons: node A (`tidemark serve`,
//! mTLS on loopback) is loaded through `POST /v1/ops` with `TRANSFER_COUNTERS` gcounters
//! (default 1,000,000) and one orset of `TRANSFER_SET` elements (default 200,000), then a fresh
//! node B joins it and bootstraps by state transfer. B's `VmRSS` is sampled from
//! `/proc/PID/status` every 20 ms until its `tidemark_state_transfers_total{direction="received"}`
//! is at least 1 and it serves A's last-written counter; `VmHWM` is read then.
//!
//! Run: `cargo build --release --bin tidemark && cargo bench --bench transfer_memory`.
//! `TIDEMARK_BIN` names the daemon binary (default `target/release/tidemark`), so an older
//! build can be measured with the same bench; `TRANSFER_RUNS` joins that many fresh B nodes to
//! the same A (default 1). Linux only (reads `/proc`); prints `skipped: ...` and exits 0 when
//! the binary is missing, and under `cargo test --benches` (no `--bench` argument). Prints one
//! line per run; no assertion.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace(['_', ','], "").parse().ok())
        .unwrap_or(default)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "-".into())
}

/// `VmRSS` and `VmHWM` of `pid` in KiB.
fn rss_hwm(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port()
}

struct Node {
    child: Child,
    url: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `BIN serve --http 127.0.0.1:0 --peer-listen PEER --tls DIR/NAME-tls --data DIR/NAME
/// [--join SEED]`, its log in `DIR/NAME.log`; waits for the URL on its first stdout line.
fn serve(bin: &Path, dir: &Path, name: &str, peer: &str, join: Option<&str>) -> Node {
    let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let mut args = vec![
        "serve".to_owned(),
        "--http".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--peer-listen".to_owned(),
        peer.to_owned(),
        "--tls".to_owned(),
        p(&format!("{name}-tls")),
        "--data".to_owned(),
        p(name),
    ];
    if let Some(seed) = join {
        args.extend(["--join".to_owned(), seed.to_owned()]);
    }
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log file");
    let mut child = Command::new(bin)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn serve");
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = BufReader::new(stdout).read_line(&mut line);
    }
    let Some(url) = line.split_whitespace().find(|w| w.starts_with("http://")) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{name}: no address in {line:?}");
    };
    Node {
        url: url.to_owned(),
        child,
    }
}

fn issue_certs(bin: &Path, dir: &Path, names: &[&str]) {
    let run = |args: &[&str]| {
        let o = Command::new(bin)
            .arg("certs")
            .args(args)
            .output()
            .expect("certs");
        assert!(
            o.status.success(),
            "certs {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let ca = dir.join("ca").to_string_lossy().into_owned();
    run(&["init", "--out", &ca]);
    for name in names {
        let out = dir
            .join(format!("{name}-tls"))
            .to_string_lossy()
            .into_owned();
        run(&["issue", "--ca", &ca, "--name", name, "--out", &out]);
    }
}

fn post_ops(url: &str, ndjson: &str) {
    let mut tries = 0;
    loop {
        match ureq::post(&format!("{url}/v1/ops"))
            .header("Content-Type", "application/x-ndjson")
            .send(ndjson.as_bytes())
        {
            Ok(_) => return,
            // 429 under backpressure: wait and send the batch again (all or none).
            Err(e) if tries < 100 => {
                tries += 1;
                if tries == 100 {
                    panic!("POST /v1/ops: {e}");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("POST /v1/ops: {e}"),
        }
    }
}

fn get_text(url: &str) -> Option<String> {
    ureq::get(url).call().ok()?.body_mut().read_to_string().ok()
}

/// `tidemark_state_transfers_total{direction="received"}` on the node at `url`.
fn transfers_received(url: &str) -> u64 {
    get_text(&format!("{url}/metrics"))
        .and_then(|m| {
            m.lines()
                .find(|l| {
                    l.starts_with("tidemark_state_transfers_total")
                        && l.contains("direction=\"received\"")
                })
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0, |v| v as u64)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: skip there (it starts
    // daemons and takes tens of seconds).
    if !std::env::args().any(|a| a == "--bench") {
        println!("skipped: run with cargo bench --bench transfer_memory");
        return;
    }
    if !cfg!(target_os = "linux") {
        println!("skipped: reads /proc (Linux only)");
        return;
    }
    let bin = PathBuf::from(
        std::env::var("TIDEMARK_BIN").unwrap_or_else(|_| "target/release/tidemark".into()),
    );
    if !bin.exists() {
        println!(
            "skipped: {} not found (cargo build --release --bin tidemark, or set TIDEMARK_BIN)",
            bin.display()
        );
        return;
    }
    let counters = env_usize("TRANSFER_COUNTERS", 1_000_000);
    let set = env_usize("TRANSFER_SET", 200_000);
    let runs = env_usize("TRANSFER_RUNS", 1).max(1);
    let batch = 10_000; // limits.batch_ops_max

    let dir = tempfile::tempdir().expect("tempdir");
    let names: Vec<String> = std::iter::once("alpha".to_owned())
        .chain((1..=runs).map(|i| format!("b{i}")))
        .collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    issue_certs(&bin, dir.path(), &name_refs);

    println!("binary: {}", bin.display());
    println!("load before: {}", loadavg());
    let a_peer = format!("127.0.0.1:{}", free_udp_port());
    let a = serve(&bin, dir.path(), "alpha", &a_peer, None);

    // Load A: counters first, the big set after; the last counter written is the marker B
    // must serve before it counts as converged.
    let started = Instant::now();
    let mut body = String::new();
    for start in (0..counters).step_by(batch) {
        body.clear();
        for i in start..(start + batch).min(counters) {
            body.push_str(&format!(
                "{{\"type\":\"gcounter\",\"key\":\"c{i:08}\",\"op\":\"inc\",\"by\":{}}}\n",
                i % 97 + 1
            ));
        }
        post_ops(&a.url, &body);
    }
    for start in (0..set).step_by(batch) {
        body.clear();
        for i in start..(start + batch).min(set) {
            body.push_str(&format!(
                "{{\"type\":\"orset\",\"key\":\"big\",\"op\":\"add\",\"value\":\"element-{i:09}\"}}\n"
            ));
        }
        post_ops(&a.url, &body);
    }
    post_ops(
        &a.url,
        "{\"type\":\"gcounter\",\"key\":\"zz-marker\",\"op\":\"inc\",\"by\":7}\n",
    );
    let load_secs = started.elapsed().as_secs_f64();
    // Let A's relaxed work (checkpoint) settle so its directory size is stable.
    std::thread::sleep(Duration::from_secs(2));
    let a_bytes = dir_bytes(&dir.path().join("alpha"));
    println!(
        "state: {counters} counters + 1 orset of {set} elements + 1 marker; loaded in {load_secs:.1} s; A's data dir {:.1} MiB ({a_bytes} bytes); A's RSS {}",
        a_bytes as f64 / (1024.0 * 1024.0),
        rss_hwm(a.child.id()).map_or("-".into(), |(r, _)| mib(r)),
    );

    for name in &names[1..] {
        let load_at_start = loadavg();
        let started = Instant::now();
        let b = serve(&bin, dir.path(), name, "127.0.0.1:0", Some(&a_peer));
        let pid = b.child.id();
        let first = rss_hwm(pid).map_or(0, |(r, _)| r);
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut samples: Vec<(f64, u64)> = Vec::new();
                let t0 = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if let Some((rss, _)) = rss_hwm(pid) {
                        samples.push((t0.elapsed().as_secs_f64(), rss));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                samples
            })
        };
        let marker = format!("{}/v1/keys/gcounter/zz-marker", b.url);
        let mut converged = None;
        while started.elapsed() < Duration::from_secs(1800) {
            if transfers_received(&b.url) >= 1 && get_text(&marker).is_some() {
                converged = Some(started.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let hwm_at_converge = rss_hwm(pid).map_or(0, |(_, h)| h);
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        let samples = sampler.join().expect("sampler");
        let (rss_after, hwm) = rss_hwm(pid).unwrap_or((0, 0));
        let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
        let peak_at = samples.iter().find(|s| s.1 == peak).map_or(0.0, |s| s.0);
        let b_bytes = dir_bytes(&dir.path().join(name));
        // The shape: RSS at a quarter, half and three quarters of the time to converge.
        let total = converged.map_or(0.0, |d| d.as_secs_f64());
        let at = |f: f64| {
            samples
                .iter()
                .find(|s| s.0 >= total * f)
                .map_or("-".into(), |s| mib(s.1))
        };
        println!(
            "run {name}: converged {}; B's RSS at start {}, at 25/50/75% of the time {} / {} / {}, peak sampled {} (at {peak_at:.1} s), VmHWM {} (at convergence {}), 1 s after {}; B's data dir {:.1} MiB; {} samples; load at start {load_at_start}, at end {}",
            converged.map_or("NO (timed out)".into(), |d| format!(
                "in {:.2} s",
                d.as_secs_f64()
            )),
            mib(first),
            at(0.25),
            at(0.5),
            at(0.75),
            mib(peak),
            mib(hwm),
            mib(hwm_at_converge),
            mib(rss_after),
            b_bytes as f64 / (1024.0 * 1024.0),
            samples.len(),
            loadavg(),
        );
        drop(b);
    }
    drop(a);
}
