//! `Durability::Relaxed` in a replicating cluster under `kill -9`.
//!
//! The test re-executes its own binary as a child (`child_cluster_until_killed`) that opens
//! three nodes in one process — `n0` and `n1` relaxed, `n2` immediate — connects every pair
//! (in-process transport, real protocol core, codec and redb), and writes on every node at full
//! speed: batches of 1–20 adds of unique ids to an orset of its cycle, node and task, plus one
//! counter increment per added id. It prints `SEND <node> <ids>` before each call, `ACK <node>
//! <ids>` after it returned `Ok`, and `REJ <node> <n>` if a node ever refuses a peer's message.
//! The parent SIGKILLs the child at a random moment (0.3–1.5 s), checks copies of the three
//! crash images, and restarts the child on the same directories:
//!
//! - each image passes redb's integrity check and `verify()`, under an unchanged replica id;
//! - no peer holds a dot of a node above that node's own durable max seq (whatever was served
//!   was durable), and no dot ever appears with two different contents, in any image of any
//!   node in any cycle or in the final state (no dot is reissued);
//! - nothing in an image was never sent; every write `n2` (immediate) acknowledged is in its
//!   image, and every write a relaxed node acknowledged more than `relaxed_sync_interval` + 1 s
//!   before the kill is in its image (the documented loss window);
//! - no node ever refused a peer's message (e.g. a restarted node's state as forged own dots).
//!
//! At the end the parent opens the three directories, connects them and checks that they
//! converge to identical state holding every id any crash image ever held, each node's counter
//! equal to its ids (batches are atomic), and still no refused message.
//!
//! `CYCLES=<n>` (default 10; `SOAK=1` → 150), `SEED=<n>` replays the kill schedule and batches.

use crate::common;

use rand::Rng;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidemark::crdts::Entry;
use tidemark::store::{DB_FILE, OpenOptions, RedbStore, WAL_FILE};
use tidemark::{Durability, Key, KeyKind, Node, NodeConfig, Op, ReplicaId, Value};

const CHILD_ROOT: &str = "TIDEMARK_RK_ROOT";
const CHILD_CYCLE: &str = "TIDEMARK_RK_CYCLE";
const CHILD_SEED: &str = "TIDEMARK_RK_SEED";
const NODES: usize = 3;
const TASKS: u64 = 2;
/// Nodes `0..RELAXED` run in relaxed durability; the rest immediate.
const RELAXED: usize = 2;

fn node_dir(root: &Path, node: usize) -> PathBuf {
    root.join(format!("n{node}"))
}

fn config(root: &Path, node: usize) -> NodeConfig {
    let mut c = NodeConfig::new(node_dir(root, node));
    if node < RELAXED {
        c.durability = Durability::Relaxed;
    }
    c.replication.gossip_interval_ms = 20;
    c.replication.retransmit_timeout_ms = 200;
    c.replication.catch_up_stagger_ms = 0;
    // Compact often, so restarted nodes also meet compacted logs and state transfers.
    c.log_retain_entries = 100;
    c
}

/// An id: cycle, node, task and seq packed in one number (the orset element).
fn id_of(cycle: u64, node: usize, task: u64, seq: u64) -> u64 {
    (cycle << 40) | ((node as u64) << 32) | (task << 28) | seq
}

fn node_of(id: u64) -> usize {
    ((id >> 32) & 0xFF) as usize
}

fn set_key(cycle: u64, node: usize, task: u64) -> Key {
    Key::new(KeyKind::ORSet, format!("ids/{cycle:05}/{node}/{task}"))
}

fn set_key_of(id: u64) -> Key {
    set_key(id >> 40, node_of(id), (id >> 28) & 0xF)
}

fn counter_key(node: usize) -> Key {
    Key::new(KeyKind::GCounter, format!("n{node}"))
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("stdout");
    out.flush().expect("flush");
}

/// The child: three connected nodes writing until killed.
#[test]
fn child_cluster_until_killed() {
    let Ok(root) = std::env::var(CHILD_ROOT) else {
        return; // Only meaningful as the child of the test below.
    };
    let root = PathBuf::from(root);
    let num = common::child_env_u64;
    let (cycle, seed) = (num(CHILD_CYCLE), num(CHILD_SEED));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        say("");
        let mut nodes = Vec::new();
        for i in 0..NODES {
            nodes.push(Node::open(config(&root, i)).await.expect("open"));
        }
        say("READY");
        for i in 0..NODES {
            for j in i + 1..NODES {
                nodes[i].connect(&nodes[j]).expect("connect");
            }
        }
        for (i, node) in nodes.iter().enumerate() {
            for task in 0..TASKS {
                let node = node.clone();
                let mut rng = common::rng(seed ^ ((i as u64) << 8 | task));
                tokio::spawn(async move {
                    let mut seq = 0u64;
                    loop {
                        let ids: Vec<u64> = (0..rng.random_range(1..=20))
                            .map(|_| {
                                seq += 1;
                                id_of(cycle, i, task, seq)
                            })
                            .collect();
                        let mut ops: Vec<Op> = ids
                            .iter()
                            .map(|id| Op::add(&set_key(cycle, i, task).name, *id))
                            .collect();
                        ops.push(Op::inc_gcounter(&counter_key(i).name, ids.len() as u64));
                        let words: Vec<String> = ids.iter().map(u64::to_string).collect();
                        let words = words.join(" ");
                        say(&format!("SEND {i} {words}"));
                        match node.apply_batch(ops).await {
                            Ok(_) => say(&format!("ACK {i} {words}")),
                            Err(tidemark::Error::Backpressure { .. }) => {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Err(e) => panic!("write failed: {e}"),
                        }
                    }
                });
            }
        }
        let watched = nodes.clone();
        tokio::spawn(async move {
            loop {
                for (i, n) in watched.iter().enumerate() {
                    let rejected = n.metrics().remote_rejected;
                    if rejected > 0 {
                        say(&format!("REJ {i} {rejected}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        // A child the parent forgot must not run forever.
        tokio::time::sleep(Duration::from_secs(60)).await;
        std::process::exit(3);
    });
}

/// What one child run reported, per node.
#[derive(Default)]
struct Report {
    ready: bool,
    sent: BTreeSet<u64>,
    /// Acknowledged ids with the time the parent read the acknowledgement.
    acked: Vec<(Instant, usize, Vec<u64>)>,
    rejected: Vec<String>,
}

fn parse(lines: &[(Instant, String)]) -> Report {
    let mut r = Report::default();
    for (at, line) in lines {
        let mut words = line.split_whitespace();
        let kind = words.next();
        let mut ids = || -> (usize, Vec<u64>) {
            let node = words.next().and_then(|w| w.parse().ok()).expect("node");
            (
                node,
                words.by_ref().map(|w| w.parse().expect("id")).collect(),
            )
        };
        match kind {
            Some("READY") => r.ready = true,
            Some("SEND") => r.sent.extend(ids().1),
            Some("ACK") => {
                let (node, ids) = ids();
                r.acked.push((*at, node, ids));
            }
            Some("REJ") => r.rejected.push(line.clone()),
            _ => {}
        }
    }
    r
}

/// Every `(replica, seq)` → `(key, content)` ever seen, to catch a dot issued twice.
#[derive(Default)]
struct Dots {
    seen: HashMap<(ReplicaId, u64), (String, String)>,
}

impl Dots {
    fn record(&mut self, key: &Key, entry: &Entry, ctx: &str) {
        let mut dots: Vec<(tidemark::crdts::Dot, String)> = Vec::new();
        match entry {
            Entry::ORSet(m) => {
                for (elem, set) in m.iter() {
                    dots.extend(set.iter().map(|d| (*d, format!("{elem:?}"))));
                }
            }
            Entry::GCounter(f) => dots.extend(f.iter().map(|(d, v)| (*d, v.to_string()))),
            other => panic!("{ctx}: unexpected entry {other:?}"),
        }
        for (dot, content) in dots {
            let now = (key.to_string(), content);
            let before = self
                .seen
                .entry((dot.replica, dot.seq))
                .or_insert_with(|| now.clone());
            assert_eq!(
                *before, now,
                "{ctx}: dot {dot:?} was issued twice with different contents"
            );
        }
    }
}

/// What the parent knows across cycles.
#[derive(Default)]
struct Known {
    replicas: Vec<ReplicaId>,
    dots: Dots,
    /// Every id any crash image held (durable somewhere: must survive to the end).
    durable: BTreeSet<u64>,
    sent: BTreeSet<u64>,
    acked: usize,
}

fn orset_ids(v: Option<Value>) -> BTreeSet<u64> {
    match v {
        None => BTreeSet::new(),
        Some(Value::ORSet(elems)) => elems
            .iter()
            .map(|e| e.parse().expect("numeric id"))
            .collect(),
        Some(other) => panic!("not an orset: {other:?}"),
    }
}

/// Checks the three crash images of `cycle` (copies in `copy`).
fn check_images(copy: &Path, cycle: u64, report: &Report, killed: Instant, known: &mut Known) {
    let ctx = format!("cycle {cycle}");
    let window = NodeConfig::new(copy).relaxed_sync_interval + Duration::from_secs(1);
    let mut stores = Vec::new();
    for i in 0..NODES {
        let dir = node_dir(copy, i);
        let mut store = RedbStore::open(&dir, OpenOptions::default())
            .unwrap_or_else(|e| panic!("{ctx}: node {i}'s crash image does not open: {e}"));
        assert!(
            store.check_integrity().expect("integrity check runs"),
            "{ctx}: node {i}: redb integrity check failed"
        );
        store
            .verify()
            .unwrap_or_else(|e| panic!("{ctx}: node {i}: verify: {e}"));
        if known.replicas.len() == i {
            known.replicas.push(store.replica());
        }
        assert_eq!(
            known.replicas[i],
            store.replica(),
            "{ctx}: node {i}'s replica id changed"
        );
        stores.push(store);
    }
    for (i, own) in stores.iter().enumerate() {
        let r = known.replicas[i];
        let mine = own.ctx().max_seq(r);
        for (j, peer) in stores.iter().enumerate() {
            let held = peer.ctx().max_seq(r);
            assert!(
                held <= mine,
                "{ctx}: node {j} holds node {i}'s dots up to {held}, but node {i} durably \
                 reached only {mine}: it was served writes that were not durable"
            );
        }
    }
    for (i, store) in stores.iter().enumerate() {
        let reader = store.reader();
        let mut keys: Vec<Key> = (0..NODES).map(counter_key).collect();
        for n in 0..NODES {
            keys.extend((0..TASKS).map(|t| set_key(cycle, n, t)));
        }
        for key in &keys {
            if let Some(entry) = reader.entry(key).expect("entry") {
                known
                    .dots
                    .record(key, &entry, &format!("{ctx}, node {i}, {key}"));
            }
        }
        let mut here = BTreeSet::new();
        for n in 0..NODES {
            for t in 0..TASKS {
                here.extend(orset_ids(reader.get(&set_key(cycle, n, t)).expect("get")));
            }
        }
        let phantom: Vec<_> = here.difference(&report.sent).take(5).collect();
        assert!(
            phantom.is_empty(),
            "{ctx}: node {i}: never sent: {phantom:?}"
        );
        for (at, node, ids) in &report.acked {
            let must = *node == i && (i >= RELAXED || *at + window < killed);
            if must {
                let lost: Vec<_> = ids.iter().filter(|id| !here.contains(id)).collect();
                assert!(
                    lost.is_empty(),
                    "{ctx}: node {i} lost acknowledged writes {lost:?} (acknowledged {:?} \
                     before the kill, {})",
                    killed - *at,
                    if i < RELAXED { "relaxed" } else { "immediate" }
                );
            }
        }
        known.durable.extend(here);
    }
}

fn copy_images(root: &Path, copy: &Path) {
    let _ = std::fs::remove_dir_all(copy);
    for i in 0..NODES {
        std::fs::create_dir_all(node_dir(copy, i)).expect("mkdir");
        for file in [DB_FILE, WAL_FILE] {
            std::fs::copy(node_dir(root, i).join(file), node_dir(copy, i).join(file))
                .expect("copy");
        }
    }
}

fn all_state(node: &Node) -> Vec<(Key, Value)> {
    KeyKind::ALL
        .iter()
        .flat_map(|k| node.list(*k, "", None, usize::MAX).expect("list"))
        .collect()
}

/// Heals the cluster in this process and checks the converged state.
fn final_check(rt: &tokio::runtime::Runtime, root: &Path, known: &mut Known) {
    rt.block_on(async {
        let mut nodes = Vec::new();
        for i in 0..NODES {
            nodes.push(Node::open(config(root, i)).await.expect("open"));
        }
        for i in 0..NODES {
            assert_eq!(
                nodes[i].replica_id(),
                known.replicas[i],
                "final: replica id"
            );
            for j in i + 1..NODES {
                nodes[i].connect(&nodes[j]).expect("connect");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ctxs: Vec<_> = nodes.iter().map(|n| n.context().expect("ctx")).collect();
            let states: Vec<_> = nodes.iter().map(all_state).collect();
            if ctxs.windows(2).all(|w| w[0] == w[1]) && states.windows(2).all(|w| w[0] == w[1]) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "final: the nodes did not converge within 60 s (contexts {ctxs:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rejected: Vec<u64> = nodes.iter().map(|n| n.metrics().remote_rejected).collect();
        assert_eq!(
            rejected,
            vec![0; NODES],
            "final: a node refused a peer's message"
        );
        let state = all_state(&nodes[0]);
        let mut ids = BTreeSet::new();
        let mut per_node = BTreeMap::<usize, u64>::new();
        for (key, value) in &state {
            if key.kind == KeyKind::ORSet {
                for id in orset_ids(Some(value.clone())) {
                    assert_eq!(set_key_of(id), *key, "final: id {id} in the wrong set");
                    *per_node.entry(node_of(id)).or_default() += 1;
                    ids.insert(id);
                }
            }
        }
        let lost: Vec<_> = known.durable.difference(&ids).take(5).collect();
        assert!(
            lost.is_empty(),
            "final: writes a crash image held are gone: {lost:?}"
        );
        let phantom: Vec<_> = ids.difference(&known.sent).take(5).collect();
        assert!(phantom.is_empty(), "final: never sent: {phantom:?}");
        for i in 0..NODES {
            assert_eq!(
                nodes[0].get(&counter_key(i)).expect("get"),
                Value::GCounter(per_node.get(&i).copied().unwrap_or(0)),
                "final: node {i}'s counter differs from its ids (a batch split or counted twice)"
            );
        }
        for node in &nodes {
            let reader_state: Vec<(Key, Value)> = all_state(node);
            assert_eq!(reader_state, state);
        }
        for n in nodes {
            n.shutdown().await.expect("shutdown");
        }
        println!(
            "relaxed_kill9: final state {} ids ({} acknowledged over all cycles, {} durable in \
             some crash image), {} distinct dots checked",
            ids.len(),
            known.acked,
            known.durable.len(),
            known.dots.seen.len()
        );
    });
    // The final state's dots, all keys: no dot with two contents across everything seen.
    for i in 0..NODES {
        let store =
            RedbStore::open(&node_dir(root, i), OpenOptions::default()).expect("open final store");
        for (key, entry) in store.reader().entries().expect("entries") {
            known
                .dots
                .record(&key, &entry, &format!("final, node {i}, {key}"));
        }
    }
}

#[test]
fn relaxed_cluster_survives_kill9_cycles_without_reissuing_dots() {
    let seed = common::seed("relaxed_kill9");
    let mut rng = common::rng(seed);
    let cycles = common::env_usize("CYCLES", if common::soak() { 150 } else { 10 }) as u64;
    let exe = std::env::current_exe().expect("current exe");
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("cluster");
    let copy = tmp.path().join("check");
    let started = Instant::now();
    let mut known = Known::default();
    for cycle in 0..cycles {
        let ctx = format!("seed {seed}, cycle {cycle}");
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "relaxed_kill9::child_cluster_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ROOT, &root)
            .env(CHILD_CYCLE, cycle.to_string())
            .env(CHILD_SEED, rng.random::<u64>().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let (tx, rx) = std::sync::mpsc::channel::<(Instant, String)>();
        let stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = String::new();
            // Only complete lines count: the kill may cut the last one.
            while matches!(r.read_line(&mut buf), Ok(n) if n > 0) {
                if buf.ends_with('\n') && tx.send((Instant::now(), buf.trim_end().into())).is_err()
                {
                    break;
                }
                buf.clear();
            }
        });
        let mut stderr = child.stderr.take().expect("stderr");
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
            s
        });
        let mut lines = Vec::new();
        // Killed only once all three databases exist (a kill inside redb's file creation
        // leaves a file it refuses, see crash_images.rs).
        if cycle == 0 {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !lines.iter().any(|(_, l): &(Instant, String)| l == "READY") {
                match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(l) => lines.push(l),
                    Err(_) => panic!("{ctx}: the child never got ready"),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(300..=1_500)));
        if let Some(status) = child.try_wait().expect("try_wait") {
            let err = err_reader.join().unwrap_or_default();
            panic!("{ctx}: the child exited by itself ({status}):\n{err}");
        }
        let killed = Instant::now();
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("wait");
        reader.join().expect("reader");
        lines.extend(rx.try_iter());
        let err = err_reader.join().unwrap_or_default();
        assert_eq!(
            status.signal(),
            Some(9),
            "{ctx}: the child did not die by SIGKILL ({status}):\n{err}"
        );
        let report = parse(&lines);
        assert!(
            report.rejected.is_empty(),
            "{ctx}: a node refused a peer's message: {:?}",
            &report.rejected[..report.rejected.len().min(3)]
        );
        known.sent.extend(&report.sent);
        known.acked += report
            .acked
            .iter()
            .map(|(_, _, ids)| ids.len())
            .sum::<usize>();
        if !node_dir(&root, NODES - 1).join(DB_FILE).exists() {
            assert!(report.acked.is_empty(), "{ctx}: acked without a database");
            continue;
        }
        copy_images(&root, &copy);
        check_images(&copy, cycle, &report, killed, &mut known);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    final_check(&rt, &root, &mut known);
    println!(
        "relaxed_kill9: {cycles} kill -9 cycles of a 3-node cluster ({RELAXED} relaxed) in \
         {:.1?}",
        started.elapsed()
    );
}
