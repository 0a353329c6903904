//! One nemesis run: cluster up, clients recording a history, a seeded nemesis (partitions,
//! kill -9 + restart, SIGSTOP/SIGCONT), heal, quiet period until every node agrees, check.

use super::client::{self, COUNTERS};
use super::cluster::Cluster;
use super::history::{self, NodeState, Op, OpKind, Outcome};
use super::nft::{self, NftTable};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Parameters of a run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Unique tag (nft table, work dir).
    pub tag: &'static str,
    /// Seed of the nemesis schedule and the clients' choices.
    pub seed: u64,
    /// How long clients and nemesis run.
    pub duration: Duration,
    /// Cluster size.
    pub nodes: usize,
    /// Client tasks.
    pub clients: usize,
}

impl RunConfig {
    /// `seed` unless `SEED` is set; 60 s unless `SOAK=1` (one hour) or `NEMESIS_SECS`.
    pub fn from_env(tag: &'static str, seed: u64) -> Self {
        let seed = std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(seed);
        let secs = if std::env::var("SOAK").is_ok_and(|v| v == "1") {
            3600
        } else {
            std::env::var("NEMESIS_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(60)
        };
        Self {
            tag,
            seed,
            duration: Duration::from_secs(secs),
            nodes: 5,
            clients: 5,
        }
    }
}

/// Counts of what the nemesis did.
#[derive(Debug, Default)]
struct Faults {
    partitions: usize,
    partitions_verified: usize,
    kills: usize,
    pauses: usize,
}

fn log(tag: &str, start: Instant, msg: &str) {
    eprintln!("[{tag} {:>7.2}s] {msg}", start.elapsed().as_secs_f64());
}

/// Waits until `key` reads `want` on `http` (≤ `within`).
fn visible(agent: &ureq::Agent, http: SocketAddr, key: &str, want: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(v)) = client::read(agent, http, "gcounter", key)
            && v.as_u64() == Some(want)
        {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Nemesis<'a> {
    tag: &'static str,
    cluster: &'a mut Cluster,
    nft: Option<&'a NftTable>,
    rng: ChaCha8Rng,
    start: Instant,
    agent: ureq::Agent,
    history: Arc<Mutex<Vec<Op>>>,
    probes: Vec<String>,
    faults: Faults,
}

impl Nemesis<'_> {
    fn sleep_ms(&mut self, lo: u64, hi: u64) {
        std::thread::sleep(Duration::from_millis(self.rng.random_range(lo..hi)));
    }

    /// Splits the cluster in two, proves the cut with a probe write (visible on its own side,
    /// invisible across), holds it a while, heals.
    fn partition(&mut self, nft: &NftTable) {
        let n = self.cluster.nodes.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut self.rng);
        let small_len = self.rng.random_range(1..=n / 2);
        let (small, big) = order.split_at(small_len);
        let (small, big) = (small.to_vec(), big.to_vec());
        let ports = |s: &[usize]| {
            s.iter()
                .map(|&i| self.cluster.peer_port(i))
                .collect::<Vec<_>>()
        };
        nft.partition(&ports(&small), &ports(&big))
            .expect("install partition");
        self.faults.partitions += 1;
        log(
            self.tag,
            self.start,
            &format!("nemesis: partition {small:?} | {big:?}"),
        );
        // Probe: write on the big side; a node of the big side sees it; no node of the small
        // side does while the partition holds.
        let key = format!("probe{}", self.probes.len());
        self.probes.push(key.clone());
        let at = big[0];
        let op = json!({"type":"gcounter","key":key,"op":"inc","by":1});
        let invoke = self.start.elapsed();
        let outcome = client::post_op(&self.agent, self.cluster.nodes[at].http, &op);
        self.history.lock().expect("history").push(Op {
            client: usize::MAX,
            node: at,
            kind: OpKind::Inc {
                key: key.clone(),
                by: 1,
            },
            invoke,
            complete: self.start.elapsed(),
            outcome,
        });
        let hold_ms = self.rng.random_range(1_000..5_000);
        let control = big[1];
        if outcome == Outcome::Ok
            && visible(
                &self.agent,
                self.cluster.nodes[control].http,
                &key,
                1,
                Duration::from_secs(10),
            )
        {
            std::thread::sleep(Duration::from_millis(1_000));
            for &i in &small {
                let seen = client::read(&self.agent, self.cluster.nodes[i].http, "gcounter", &key);
                assert!(
                    matches!(seen, Ok(None))
                        || matches!(&seen, Ok(Some(v)) if v.as_u64() == Some(0)),
                    "partition leaks: {key} written on n{at}, seen on n{control} and on n{i} across the cut ({seen:?});\nrules:\n{}",
                    nft.rules()
                );
            }
            self.faults.partitions_verified += 1;
            log(
                self.tag,
                self.start,
                &format!("nemesis: partition verified with {key}"),
            );
        } else {
            log(
                self.tag,
                self.start,
                &format!("nemesis: probe {key} unverified ({outcome:?})"),
            );
        }
        // Sometimes a crash inside the partition: the node restarts into a cut network.
        if self.rng.random_bool(0.3) {
            let i = self.rng.random_range(0..n);
            self.cluster.kill9(i);
            self.faults.kills += 1;
            log(
                self.tag,
                self.start,
                &format!("nemesis: kill -9 n{i} (partitioned)"),
            );
            std::thread::sleep(Duration::from_millis(hold_ms / 2));
            self.cluster.restart(i);
            log(
                self.tag,
                self.start,
                &format!("nemesis: restarted n{i} (partitioned)"),
            );
        }
        std::thread::sleep(Duration::from_millis(hold_ms));
        nft.heal().expect("heal");
        log(self.tag, self.start, "nemesis: healed");
    }

    fn kill(&mut self) {
        let i = self.rng.random_range(0..self.cluster.nodes.len());
        self.cluster.kill9(i);
        self.faults.kills += 1;
        log(self.tag, self.start, &format!("nemesis: kill -9 n{i}"));
        self.sleep_ms(200, 3_000);
        self.cluster.restart(i);
        log(self.tag, self.start, &format!("nemesis: restarted n{i}"));
    }

    fn pause(&mut self) {
        let i = self.rng.random_range(0..self.cluster.nodes.len());
        self.cluster.pause(i);
        self.faults.pauses += 1;
        log(self.tag, self.start, &format!("nemesis: SIGSTOP n{i}"));
        // Up to 5 s: past the peers' QUIC idle timeout (3 s), so their connections drop.
        self.sleep_ms(500, 5_000);
        self.cluster.resume(i);
        log(self.tag, self.start, &format!("nemesis: SIGCONT n{i}"));
    }
}

/// Runs one nemesis test; panics with every violation found.
pub fn run(cfg: &RunConfig) {
    eprintln!(
        "nemesis {}: SEED={} ({} s, {} nodes, {} clients; replay with SEED={} cargo test --test cluster_nemesis)",
        cfg.tag,
        cfg.seed,
        cfg.duration.as_secs(),
        cfg.nodes,
        cfg.clients,
        cfg.seed
    );
    let table = match nft::unavailable() {
        None => Some(NftTable::create(cfg.tag).expect("create nft table")),
        Some(why) => {
            assert!(
                std::env::var("TIDEMARK_REQUIRE_NFT").map_or(true, |v| v != "1"),
                "TIDEMARK_REQUIRE_NFT=1 but partitions cannot run: {why}"
            );
            eprintln!(
                "\n!!!!!!!!\n!!! nemesis {}: PARTITIONS SKIPPED: {why}.\n!!! Only kill -9 and SIGSTOP faults run. Run as root with nftables installed (CI sets TIDEMARK_REQUIRE_NFT=1).\n!!!!!!!!\n",
                cfg.tag
            );
            None
        }
    };
    let mut cluster = Cluster::start(cfg.nodes, cfg.tag);
    let addrs: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.http).collect();
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..cfg.clients)
        .map(|id| {
            let (addrs, stop, history) = (addrs.clone(), Arc::clone(&stop), Arc::clone(&history));
            let seed = cfg.seed;
            std::thread::spawn(move || client::run_client(id, seed, addrs, start, stop, history))
        })
        .collect();
    let mut nemesis = Nemesis {
        tag: cfg.tag,
        cluster: &mut cluster,
        nft: table.as_ref(),
        rng: ChaCha8Rng::seed_from_u64(cfg.seed),
        start,
        agent: client::agent(Duration::from_secs(2)),
        history: Arc::clone(&history),
        probes: Vec::new(),
        faults: Faults::default(),
    };
    while start.elapsed() < cfg.duration {
        nemesis.sleep_ms(300, 1_500);
        let first = if nemesis.nft.is_some() { 0 } else { 1 };
        match nemesis.rng.random_range(first..3) {
            0 => {
                if let Some(t) = nemesis.nft {
                    nemesis.partition(t);
                }
            }
            1 => nemesis.kill(),
            _ => nemesis.pause(),
        }
    }
    let Nemesis { probes, faults, .. } = nemesis;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }
    if let Some(t) = &table {
        t.heal().expect("heal");
    }
    cluster.heal_processes();
    log(
        cfg.tag,
        start,
        "healed; quiet period until every node agrees",
    );
    let agent = client::agent(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(120);
    let finals: Vec<NodeState> = loop {
        let states: Result<Vec<_>, _> = addrs
            .iter()
            .map(|&a| client::node_state(&agent, a, &probes))
            .collect();
        if let Ok(states) = &states
            && states.iter().all(|s| s == &states[0])
        {
            break states.clone();
        }
        if Instant::now() >= deadline {
            // Check what we have: the checker names the differences.
            match states {
                Ok(s) => break s,
                Err(e) => panic!(
                    "a node cannot answer after healing: {e}\n{}",
                    cluster.logs(30)
                ),
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    log(
        cfg.tag,
        start,
        "converged (or gave up); checking the history",
    );
    let history = history.lock().expect("history").clone();
    // Kept with the node logs when the check fails.
    let dump: String = history.iter().map(|op| format!("{op:?}\n")).collect();
    let _ = std::fs::write(cluster.dir.join("history.txt"), dump);
    match history::check(&history, &finals) {
        Ok(s) => eprintln!(
            "nemesis {}: SEED={} OK: {} ops ({} ok, {} failed, {} indeterminate); {} set elements present, {} removed; \
             faults: {} partitions ({} verified), {} kill -9, {} SIGSTOP; counters {:?}",
            cfg.tag,
            cfg.seed,
            history.len(),
            s.ok,
            s.fail,
            s.info,
            s.present,
            s.removed,
            faults.partitions,
            faults.partitions_verified,
            faults.kills,
            faults.pauses,
            COUNTERS
                .iter()
                .map(|k| finals[0].counters.get(*k).copied().unwrap_or(0))
                .collect::<Vec<_>>()
        ),
        Err(errors) => panic!(
            "nemesis {} SEED={}: {} violations:\n{}\n\nnode logs:\n{}",
            cfg.tag,
            cfg.seed,
            errors.len(),
            errors
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n"),
            cluster.logs(30)
        ),
    }
    if table.is_some() {
        assert!(
            faults.partitions_verified >= 1,
            "no partition was verified to cut traffic ({faults:?})"
        );
    }
    assert!(
        history.iter().filter(|o| o.outcome == Outcome::Ok).count() > 100,
        "too few acknowledged ops"
    );
}
