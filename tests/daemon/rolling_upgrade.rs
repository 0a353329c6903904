//! A rolling upgrade across the storage-engine change of issue 21 (the write-ahead log, store
//! format 6), with real daemons over QUIC + mTLS on loopback. Opt-in: it runs only when
//! `TIDEMARK_OLD_BIN` names a `tidemark` binary built from commit 0c81513 (store format 5, the
//! build before the log); `scripts/rolling-upgrade.sh` builds one and runs this test. Without
//! the variable it prints that it skipped and passes.
//!
//! Three daemons start on the old binary. One writer per node writes to that node over HTTP for
//! the whole test: idempotent ops (`source`/`seq`) on a gcounter, a pncounter, an orset (adds and
//! removes), an LWW register and an MV register of its own, a shared LWW register all writers
//! set, and events of a stream read by two views (count and sum per page). Then the nodes are
//! replaced one at a time by the binary under test on the same data directory and the same
//! flags: gamma after a clean stop (SIGTERM), beta with SIGKILL while its writer's requests are
//! in flight, alpha (the seed, started without `--join`) after a clean stop; between the last
//! two, gamma (upgraded) is killed with SIGKILL under writes too, so its restart replays the
//! write-ahead log of a directory that was format 5 before. While a node is down its writer
//! retries the same request on it until it answers (so a write the killed node committed but
//! never acknowledged comes back a duplicate and counts once); the two other writers go on (a
//! mixed-version cluster). After each step a write on an upgraded node must reach the old ones
//! and the other way round.
//!
//! At the end every node must hold exactly what the acknowledged writes make (counter values,
//! set members, register values, view rows), every node's whole key listing must be the same,
//! every node keeps its replica id and its delta log (no node was wiped), and every data
//! directory is store format 6 with a `tidemark.wal` (format 5 with no log before its upgrade).

use crate::daemon_support;

use daemon_support::{Daemon, issue_certs, spawn_serve_bin_logged, spawn_serve_logged};
use serde_json::{Value as J, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
const PAGES: u64 = 3;
/// The environment variable naming the old binary.
const OLD_BIN: &str = "TIDEMARK_OLD_BIN";

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free port")
        .port()
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// GET `url` as JSON (panics on a transport error or a body that is not JSON).
fn get_json(url: &str) -> (u16, J) {
    let mut r = agent().get(url).call().expect("GET");
    let status = r.status().as_u16();
    let body = r.body_mut().read_to_string().expect("body");
    (status, serde_json::from_str(&body).unwrap_or(J::Null))
}

/// The cluster: where it lives and how each member is started.
struct Cluster {
    dir: PathBuf,
    old_bin: PathBuf,
    peers: [String; 3],
}

impl Cluster {
    /// Starts member `i` with the old binary (`old`) or the one under test, with the same flags
    /// either way: alpha (the seed) without `--join`, beta and gamma joining alpha.
    fn start(&self, i: usize, old: bool) -> Daemon {
        let p = |n: &str| self.dir.join(n).to_string_lossy().into_owned();
        let mut args = vec![
            "--config".to_owned(),
            p("views.toml"),
            "--http".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--peer-listen".to_owned(),
            self.peers[i].clone(),
            "--tls".to_owned(),
            p(&format!("{}-tls", NAMES[i])),
            "--data".to_owned(),
            p(NAMES[i]),
        ];
        if i > 0 {
            args.extend(["--join".to_owned(), self.peers[0].clone()]);
        }
        let log = self.dir.join(format!("{}.log", NAMES[i]));
        let (child, url, _) = if old {
            spawn_serve_bin_logged(&self.old_bin, &args, &log)
        } else {
            spawn_serve_logged(&args, &log)
        };
        Daemon { child, url }
    }

    fn data(&self, i: usize) -> PathBuf {
        self.dir.join(NAMES[i])
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", NAMES[i]))).unwrap_or_default()
    }
}

/// Waits until `url` answers `/readyz` 200 and lists `alive` other members alive.
fn await_ready(url: &str, alive: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = agent()
            .get(&format!("{url}/readyz"))
            .call()
            .is_ok_and(|r| r.status() == 200);
        let (_, c) = get_json(&format!("{url}/v1/cluster"));
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

fn eventually(what: &str, secs: u64, mut check: impl FnMut() -> Result<(), String>) {
    let started = Instant::now();
    loop {
        match check() {
            Ok(()) => return,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(secs),
                "timed out after {secs} s: {what}: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `node` of `GET /v1/cluster`: replica id, epoch, version, log bounds.
fn node_status(url: &str) -> J {
    let (status, c) = get_json(&format!("{url}/v1/cluster"));
    assert_eq!(status, 200, "{c}");
    c["node"].clone()
}

/// What one writer's acknowledged writes make.
#[derive(Debug, Default)]
struct Ledger {
    /// Requests acknowledged (200), and how many of those answered that every op or event was
    /// a duplicate (a retry of a request the node had committed without answering).
    acked: u64,
    duplicate_answers: u64,
    /// Requests that failed (connection refused or cut, 429, 503) and were retried.
    retries: u64,
    hits: u64,
    stock: i64,
    seen: BTreeSet<String>,
    last: Option<u64>,
    doc: Option<String>,
    /// Events per page, and the sum of their `amount` per page.
    clicks: BTreeMap<String, u64>,
    amounts: BTreeMap<String, i64>,
}

/// The node a writer writes to (the URL changes when the node is restarted).
type Target = Arc<Mutex<String>>;

/// POSTs `body` to `path` of the writer's node until a 200: a failure is retried with the same
/// body (the same `source`/`seq` pairs) on the same node, restarted or not. Returns the answer
/// and the failures before it.
fn post_until_acked(target: &Target, path: &str, content_type: &str, body: &str) -> (J, u64) {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut failures = 0;
    loop {
        let url = format!("{}{path}", target.lock().expect("target").clone());
        // An error is a refused or cut connection: the node is down or being restarted.
        if let Ok(mut r) = agent()
            .post(&url)
            .header("Content-Type", content_type)
            .send(body.as_bytes())
        {
            let status = r.status().as_u16();
            let text = r.body_mut().read_to_string().unwrap_or_default();
            // A 200 whose body was cut is retried too (the retry answers duplicates).
            if status == 200
                && let Ok(answer) = serde_json::from_str::<J>(&text)
            {
                return (answer, failures);
            }
            assert!(
                status == 200 || status == 429 || status == 503,
                "{url} refused a write with {status}: {text}\n{body}"
            );
        }
        failures += 1;
        assert!(
            Instant::now() < deadline,
            "{url}: no acknowledgement in 180 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writer `i`: writes to its node until `stop`, then returns what its acknowledged writes make.
fn writer(i: usize, target: Target, stop: Arc<AtomicBool>) -> JoinHandle<Ledger> {
    std::thread::spawn(move || {
        let name = NAMES[i];
        let source = format!("{name}-ops");
        let mut ledger = Ledger::default();
        let mut seq = 0u64;
        let mut round = 0u64;
        while !stop.load(Ordering::SeqCst) {
            round += 1;
            // One batch of ops, each idempotent under (source, seq), all or none.
            let by = round % 5 + 1;
            let delta: i64 = if round % 3 == 0 { -2 } else { 3 };
            let element = format!("{name}-{round}");
            let mut ops = vec![
                json!({"type":"gcounter","key":"hits","op":"inc","by":by}),
                if delta < 0 {
                    json!({"type":"pncounter","key":"stock","op":"dec","by":-delta})
                } else {
                    json!({"type":"pncounter","key":"stock","op":"inc","by":delta})
                },
                json!({"type":"orset","key":"seen","op":"add","value":element}),
                json!({"type":"lww","key":format!("last/{name}"),"op":"set","value":round}),
                json!({"type":"mvreg","key":format!("doc/{name}"),"op":"set","value":format!("{name} draft {round}")}),
                json!({"type":"lww","key":"config","op":"set","value":{"by":name,"round":round}}),
            ];
            // Every fourth round removes the element this writer added two rounds before (on
            // the same node, after its add was acknowledged: observed, so removed).
            let removed = (round % 4 == 0 && round > 2).then(|| format!("{name}-{}", round - 2));
            if let Some(r) = &removed {
                ops.push(json!({"type":"orset","key":"seen","op":"remove","value":r}));
            }
            for op in &mut ops {
                seq += 1;
                op["source"] = json!(source);
                op["seq"] = json!(seq);
            }
            let n = ops.len() as u64;
            let body = serde_json::to_string(&ops).expect("ops");
            let (a, failures) = post_until_acked(&target, "/v1/ops", "application/json", &body);
            assert_eq!(
                a["applied"].as_u64().unwrap_or(0) + a["duplicates"].as_u64().unwrap_or(0),
                n,
                "{name}: {a}"
            );
            // All or none: a retried batch is either wholly applied or wholly a duplicate.
            assert!(a["applied"] == n || a["duplicates"] == n, "{name}: {a}");
            ledger.acked += 1;
            ledger.retries += failures;
            if a["duplicates"] == n {
                ledger.duplicate_answers += 1;
            }
            ledger.hits += by;
            ledger.stock += delta;
            ledger.seen.insert(element);
            if let Some(r) = &removed {
                ledger.seen.remove(r);
            }
            ledger.last = Some(round);
            ledger.doc = Some(format!("{name} draft {round}"));

            // Two events of the stream, each with its own (source, seq).
            let mut lines = String::new();
            let mut pages = Vec::new();
            for j in 0..2u64 {
                let ev_seq = round * 2 + j;
                let page = format!("/p{}", (round + j + i as u64) % PAGES);
                let amount = (ev_seq % 7) as i64 - 2;
                lines.push_str(&format!(
                    "{{\"source\":\"{name}-events\",\"seq\":{ev_seq},\"page\":\"{page}\",\"amount\":{amount}}}\n"
                ));
                pages.push((page, amount));
            }
            let (a, failures) = post_until_acked(
                &target,
                "/v1/streams/clicks/events",
                "application/x-ndjson",
                &lines,
            );
            assert_eq!(a["late"], 0, "{name}: {a}");
            assert_eq!(
                a["accepted"].as_u64().unwrap_or(0) + a["duplicates"].as_u64().unwrap_or(0),
                2,
                "{name}: {a}"
            );
            assert!(a["accepted"] == 2 || a["duplicates"] == 2, "{name}: {a}");
            ledger.acked += 1;
            ledger.retries += failures;
            if a["duplicates"] == 2 {
                ledger.duplicate_answers += 1;
            }
            for (page, amount) in pages {
                *ledger.clicks.entry(page.clone()).or_insert(0) += 1;
                *ledger.amounts.entry(page).or_insert(0) += amount;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        ledger
    })
}

/// `GET /v1/keys/{kind}/{name}`'s value, `None` when 404 or not JSON.
fn value(url: &str, kind: &str, name: &str) -> Option<J> {
    let (status, j) = get_json(&format!("{url}/v1/keys/{kind}/{name}"));
    (status == 200).then(|| j["value"].clone())
}

/// Every key of the node with its value (all pages; internal keys not included).
fn listing(url: &str) -> Vec<J> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let q = after
            .as_ref()
            .map_or(String::new(), |a| format!("&after={}", percent(a)));
        let (status, page) = get_json(&format!("{url}/v1/keys?limit=1000{q}"));
        assert_eq!(status, 200, "{page}");
        out.extend(page["keys"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(n) => after = Some(n.to_owned()),
            None => return out,
        }
    }
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A view's rows as `group page → value`.
fn view_rows(url: &str, view: &str) -> BTreeMap<String, J> {
    let (status, page) = get_json(&format!("{url}/v1/views/{view}"));
    assert_eq!(status, 200, "{page}");
    page["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["group"]["page"].as_str().unwrap_or("?").to_owned(),
                r["value"].clone(),
            )
        })
        .collect()
}

/// `meta/store_format` of a closed data directory, as the store encodes it (a version byte,
/// then the number as a bincode varint): `None` when the store has no marker.
fn store_format(data: &Path) -> Option<u32> {
    const META: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("meta");
    use redb::ReadableDatabase;
    let db = redb::ReadOnlyDatabase::open(data.join("tidemark.redb")).expect("open the database");
    let txn = db.begin_read().expect("read");
    let table = txn.open_table(META).expect("meta");
    let v = table.get("store_format").expect("get")?;
    let bytes = v.value().to_vec();
    assert_eq!(bytes.len(), 2, "store_format {bytes:?}");
    assert_eq!(bytes[0], 1, "codec version of store_format {bytes:?}");
    Some(u32::from(bytes[1]))
}

/// A write on `from` that `to` must see (mixed versions replicating each way).
fn probe(nodes: &[Daemon], from: usize, to: &[usize], tag: &str) {
    let url = format!("{}/v1/ops", nodes[from].url);
    let body = json!([{"type":"lww","key":format!("probe/{tag}"),"op":"set","value":NAMES[from]}]);
    let mut r = agent()
        .post(&url)
        .header("Content-Type", "application/json")
        .send(body.to_string().as_bytes())
        .expect("probe");
    assert_eq!(
        r.status().as_u16(),
        200,
        "{:?}",
        r.body_mut().read_to_string()
    );
    for &t in to {
        eventually(
            &format!("{} sees {}'s probe {tag}", NAMES[t], NAMES[from]),
            60,
            || match value(&nodes[t].url, "lww", &format!("probe/{tag}")) {
                Some(v) if v == NAMES[from] => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
    }
}

/// A cleanly stopped node's data directory before its upgrade: format 5 and no log.
fn assert_format5(cluster: &Cluster, i: usize) {
    let data = cluster.data(i);
    assert_eq!(
        store_format(&data),
        Some(5),
        "{} before its upgrade",
        NAMES[i]
    );
    assert!(
        !data.join("tidemark.wal").exists(),
        "{}: the old binary wrote a log",
        NAMES[i]
    );
}

#[test]
fn a_rolling_upgrade_from_format_5_keeps_every_write_and_every_node() {
    let Some(old_bin) = std::env::var_os(OLD_BIN).map(PathBuf::from) else {
        println!(
            "rolling_upgrade: SKIPPED (set {OLD_BIN} to a tidemark binary built from 0c81513; \
             scripts/rolling-upgrade.sh builds one and runs this test)"
        );
        return;
    };
    assert!(
        old_bin.is_file(),
        "{OLD_BIN}={} is no file",
        old_bin.display()
    );
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("views.toml"),
        "[[views]]\nname = \"clicks_per_page\"\nstream = \"clicks\"\nkind = \"count\"\n\
         group_by = [\"page\"]\n\n[[views]]\nname = \"amount_per_page\"\nstream = \"clicks\"\n\
         kind = \"sum\"\nfield = \"amount\"\ngroup_by = [\"page\"]\n",
    )
    .expect("config");
    // The certificates the old nodes start with, issued by the binary under test: the new
    // nodes must accept them too.
    issue_certs(dir.path(), &NAMES);
    let cluster = Cluster {
        dir: dir.path().to_path_buf(),
        old_bin,
        peers: [0, 1, 2].map(|_| format!("127.0.0.1:{}", free_udp_port())),
    };
    let versions = |bin: &std::ffi::OsStr| {
        let o = std::process::Command::new(bin)
            .arg("--version")
            .output()
            .expect("--version");
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    eprintln!(
        "old: {} ({}), new: {}",
        versions(cluster.old_bin.as_os_str()),
        cluster.old_bin.display(),
        versions(daemon_support::BIN.as_ref())
    );

    // All three on the old binary.
    let mut nodes: Vec<Daemon> = (0..3).map(|i| cluster.start(i, true)).collect();
    for n in &nodes {
        await_ready(&n.url, 2);
    }
    let before: Vec<J> = nodes.iter().map(|n| node_status(&n.url)).collect();
    let replicas: Vec<String> = before
        .iter()
        .map(|s| s["replica"].as_str().expect("replica id").to_owned())
        .collect();
    eprintln!("replicas {replicas:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let targets: Vec<Target> = nodes
        .iter()
        .map(|n| Arc::new(Mutex::new(n.url.clone())))
        .collect();
    let writers: Vec<JoinHandle<Ledger>> = (0..3)
        .map(|i| writer(i, Arc::clone(&targets[i]), Arc::clone(&stop)))
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    probe(&nodes, 0, &[1, 2], "all-old");

    // Log ends before each upgrade: a node that kept its data restarts with its log at least
    // this far.
    let mut log_ends = [0u64; 3];
    let mut restart = |nodes: &mut Vec<Daemon>, i: usize, how: &str| {
        let was = node_status(&nodes[i].url);
        log_ends[i] = was["log"]["end"].as_u64().expect("log end");
        let epoch = was["epoch"].as_u64().expect("epoch");
        let mut old = nodes.remove(i);
        if how == "sigterm" {
            assert_eq!(
                old.terminate().code(),
                Some(0),
                "{} stops cleanly",
                NAMES[i]
            );
            assert_format5(&cluster, i);
        } else {
            let _ = old.child.kill();
            let _ = old.child.wait();
            drop(old);
        }
        // Down for a while: the other writers go on against the old nodes.
        std::thread::sleep(Duration::from_secs(2));
        nodes.insert(i, cluster.start(i, false));
        *targets[i].lock().expect("target") = nodes[i].url.clone();
        await_ready(&nodes[i].url, 2);
        let s = node_status(&nodes[i].url);
        assert_eq!(
            s["replica"].as_str(),
            Some(replicas[i].as_str()),
            "{} kept its replica id across the upgrade: {s}",
            NAMES[i]
        );
        // The store's epoch counts its opens: the same store, opened once more.
        assert_eq!(
            s["epoch"].as_u64(),
            Some(epoch + 1),
            "{} was at epoch {epoch}: {s}",
            NAMES[i]
        );
        assert!(
            s["log"]["end"].as_u64().is_some_and(|e| e >= log_ends[i]),
            "{}'s log was at {} before the upgrade: {s}",
            NAMES[i],
            log_ends[i]
        );
        eprintln!(
            "{} restarted on the new binary ({how}) at {:?}: {s}",
            NAMES[i],
            started.elapsed()
        );
    };

    // gamma: a clean stop, then the new binary. Mixed: alpha and beta old, gamma new.
    restart(&mut nodes, 2, "sigterm");
    std::thread::sleep(Duration::from_secs(3));
    probe(&nodes, 2, &[0, 1], "gamma-new");
    probe(&nodes, 1, &[2], "beta-old");

    // beta: SIGKILL while its writer's requests are in flight.
    std::thread::sleep(Duration::from_millis(777));
    restart(&mut nodes, 1, "sigkill");
    std::thread::sleep(Duration::from_secs(3));
    probe(&nodes, 1, &[0, 2], "beta-new");
    probe(&nodes, 0, &[1, 2], "alpha-old");

    // gamma again, now on the new binary: SIGKILL under writes, so its restart replays the
    // write-ahead log of a directory that was format 5 a minute ago (alpha still old).
    restart(&mut nodes, 2, "sigkill");
    std::thread::sleep(Duration::from_secs(2));
    probe(&nodes, 2, &[0, 1], "gamma-replayed");
    eprintln!(
        "gamma's restart after SIGKILL: {:?}",
        cluster
            .log(2)
            .lines()
            .filter(|l| l.contains("write-ahead log"))
            .collect::<Vec<_>>()
    );

    // alpha, the seed (started without --join: it rejoins the members it knew): a clean stop.
    restart(&mut nodes, 0, "sigterm");
    std::thread::sleep(Duration::from_secs(3));
    probe(&nodes, 0, &[1, 2], "all-new");

    stop.store(true, Ordering::SeqCst);
    let ledgers: Vec<Ledger> = writers
        .into_iter()
        .map(|w| w.join().expect("writer"))
        .collect();
    for (name, l) in NAMES.iter().zip(&ledgers) {
        eprintln!(
            "{name}'s writer: {} requests acknowledged, {} retried failures, {} answered as \
             duplicates of a commit not acknowledged",
            l.acked, l.retries, l.duplicate_answers
        );
    }

    // What the acknowledged writes make.
    let hits: u64 = ledgers.iter().map(|l| l.hits).sum();
    let stock: i64 = ledgers.iter().map(|l| l.stock).sum();
    let seen: BTreeSet<&String> = ledgers.iter().flat_map(|l| &l.seen).collect();
    let seen = J::Array(seen.into_iter().map(|s| json!(s)).collect());
    let mut clicks: BTreeMap<String, J> = BTreeMap::new();
    let mut amounts: BTreeMap<String, J> = BTreeMap::new();
    for p in 0..PAGES {
        let page = format!("/p{p}");
        let c: u64 = ledgers
            .iter()
            .map(|l| l.clicks.get(&page).copied().unwrap_or(0))
            .sum();
        let a: i64 = ledgers
            .iter()
            .map(|l| l.amounts.get(&page).copied().unwrap_or(0))
            .sum();
        clicks.insert(page.clone(), json!(c));
        amounts.insert(page, json!(a));
    }
    let check = |n: &Daemon, i: usize| -> Result<(), String> {
        let mut wrong = Vec::new();
        let mut want = |what: String, got: Option<J>, expected: J| {
            if got.as_ref() != Some(&expected) {
                wrong.push(format!("{what}: {got:?}, expected {expected}"));
            }
        };
        want(
            "gcounter/hits".into(),
            value(&n.url, "gcounter", "hits"),
            json!(hits),
        );
        want(
            "pncounter/stock".into(),
            value(&n.url, "pncounter", "stock"),
            json!(stock),
        );
        want(
            "orset/seen".into(),
            value(&n.url, "orset", "seen"),
            seen.clone(),
        );
        for (w, l) in NAMES.iter().zip(&ledgers) {
            want(
                format!("lww/last/{w}"),
                value(&n.url, "lww", &format!("last/{w}")),
                json!(l.last),
            );
            want(
                format!("mvreg/doc/{w}"),
                value(&n.url, "mvreg", &format!("doc/{w}")),
                json!([l.doc]),
            );
        }
        let rows = view_rows(&n.url, "clicks_per_page");
        if rows != clicks {
            wrong.push(format!("clicks_per_page {rows:?}, expected {clicks:?}"));
        }
        let rows = view_rows(&n.url, "amount_per_page");
        if rows != amounts {
            wrong.push(format!("amount_per_page {rows:?}, expected {amounts:?}"));
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: {}", NAMES[i], wrong.join("; ")))
        }
    };
    eventually("every node holds every acknowledged write", 60, || {
        nodes.iter().enumerate().try_for_each(|(i, n)| check(n, i))
    });
    // Converged identically: the same keys with the same values everywhere (the shared LWW
    // register and the probes included).
    eventually("the three key listings are the same", 30, || {
        let l: Vec<Vec<J>> = nodes.iter().map(|n| listing(&n.url)).collect();
        if l[0] == l[1] && l[0] == l[2] {
            Ok(())
        } else {
            Err(format!(
                "{:?}",
                l.iter()
                    .map(|l| J::Array(l.clone()).to_string())
                    .collect::<Vec<_>>()
            ))
        }
    });
    let keys = listing(&nodes[0].url);
    eprintln!(
        "converged at {:?}: hits {hits}, stock {stock}, seen has {} elements, clicks {clicks:?}, \
         amounts {amounts:?}, {} keys; config {:?}",
        started.elapsed(),
        seen.as_array().map_or(0, Vec::len),
        keys.len(),
        value(&nodes[0].url, "lww", "config")
    );
    for (i, n) in nodes.iter().enumerate() {
        let s = node_status(&n.url);
        assert_eq!(s["replica"].as_str(), Some(replicas[i].as_str()), "{s}");
    }

    // Every node stops cleanly; every data directory is format 6 with its log.
    for (i, n) in nodes.into_iter().enumerate() {
        assert_eq!(
            n.terminate().code(),
            Some(0),
            "{}: {}",
            NAMES[i],
            cluster.log(i)
        );
        let data = cluster.data(i);
        assert_eq!(
            store_format(&data),
            Some(6),
            "{} after its upgrade",
            NAMES[i]
        );
        assert!(
            data.join("tidemark.wal").is_file(),
            "{} has no log",
            NAMES[i]
        );
    }
    // What the daemons logged at WARN or ERROR across the versions (a peer's restart is
    // logged; a message one version cannot read would be too).
    for (i, name) in NAMES.iter().enumerate() {
        let log = cluster.log(i);
        let notable: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        eprintln!("{name}: {} WARN/ERROR lines", notable.len());
        for l in notable {
            eprintln!("  {l}");
        }
    }
    eprintln!("rolling upgrade done in {:?}", started.elapsed());
}
