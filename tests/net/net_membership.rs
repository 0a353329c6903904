//! SWIM membership over real QUIC on 127.0.0.1 with mutual TLS (embedded nodes in one process,
//! each with its own endpoint and fault-injecting socket):
//! * a peer killed without goodbye (its socket isolated, then its node dropped: nothing it
//!   sends gets out, not even its leave) is declared down by the survivors, evicted after the
//!   grace period, and then the stable frontier advances and compaction runs on the survivors;
//! * the same peer restarted on its data rejoins (new incarnation, new port, one seed) and
//!   receives only deltas (no state transfer anywhere);
//! * restarted wiped, it rejoins with a new replica id and receives exactly ONE state transfer,
//!   started by ONE of its 3 peers, and converges;
//! * a second process holding a certificate for the name of a member that is alive is refused
//!   (counted on both sides) while the real member keeps converging; once the real one is down,
//!   a new process with its name (wiped: a new replica) rejoins.
//!
//! Seeded (`SEED=`) through the fault-injecting sockets' randomness and the node seeds.

use crate::net_support;

use net_support::{all_keys, converge, localhost, seed, test_options};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tidemark::net::{ClusterCa, Faults, MemberState, TlsDir};
use tidemark::{Node, NodeConfig, Op};

struct Peer {
    node: Node,
    addr: SocketAddr,
    faults: Faults,
    tls: TlsDir,
    dir: PathBuf,
}

fn config(dir: &Path, grace_ms: u64, retain: u64) -> NodeConfig {
    let mut c = NodeConfig::new(dir);
    c.replication.member_down_grace_ms = grace_ms;
    c.log_retain_entries = retain;
    c
}

async fn open(dir: &Path, tls: &TlsDir, seed: u64, grace_ms: u64, retain: u64) -> Peer {
    let faults = Faults::new(seed);
    let node = Node::open(config(dir, grace_ms, retain))
        .await
        .expect("open");
    let addr = node
        .listen_with(localhost(), tls.clone(), test_options(&faults))
        .await
        .expect("listen");
    Peer {
        node,
        addr,
        faults,
        tls: tls.clone(),
        dir: dir.to_path_buf(),
    }
}

/// `n` nodes `n0..`, every other one seeded with `n0` only (SWIM tells them of each other).
async fn cluster(
    n: usize,
    seed: u64,
    root: &Path,
    grace_ms: u64,
    retain: u64,
) -> (ClusterCa, Vec<Peer>) {
    let ca = ClusterCa::generate().expect("ca");
    let mut peers = Vec::new();
    for i in 0..n {
        let tls = ca.issue(&format!("n{i}")).expect("issue");
        let p = open(
            &root.join(format!("n{i}")),
            &tls,
            seed.wrapping_add(i as u64),
            grace_ms,
            retain,
        )
        .await;
        if i > 0 {
            p.node.join_peer(peers_addr(&peers, 0)).expect("join");
        }
        peers.push(p);
    }
    (ca, peers)
}

fn peers_addr(peers: &[Peer], i: usize) -> SocketAddr {
    peers[i].addr
}

fn state_of(node: &Node, name: &str) -> Option<MemberState> {
    node.net_status()?
        .members
        .iter()
        .find(|m| m.name == name)
        .map(|m| m.state)
}

fn alive_count(node: &Node) -> usize {
    node.net_status().map_or(0, |s| {
        s.members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .count()
    })
}

async fn wait_until(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

async fn write(node: &Node, tag: &str, n: usize) {
    for k in 0..n {
        node.apply(Op::inc_gcounter(&format!("{tag}-{}", k % 7), 1))
            .await
            .expect("write");
    }
}

/// Kills a member without goodbye: its socket drops everything from now on, then the node is
/// shut down (its leave announcement never gets out).
async fn kill(p: &Peer) {
    p.faults.isolate(true);
    p.node.shutdown().await.expect("shutdown");
}

async fn transfers_started(peers: &[&Node]) -> u64 {
    let mut sum = 0;
    for n in peers {
        sum += n
            .replication_status()
            .await
            .expect("status")
            .stats
            .transfers_started;
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_without_goodbye_is_declared_down_evicted_and_compaction_resumes() {
    let seed = seed("membership_kill");
    let root = tempfile::tempdir().expect("tempdir");
    let (_ca, peers) = cluster(3, seed, root.path(), 1_000, 0).await;
    wait_until("all alive", Duration::from_secs(15), async || {
        peers.iter().all(|p| alive_count(&p.node) == 2)
    })
    .await;
    for (i, p) in peers.iter().enumerate() {
        write(&p.node, &format!("w{i}"), 10).await;
    }
    let nodes: Vec<Node> = peers.iter().map(|p| p.node.clone()).collect();
    converge(&nodes, Duration::from_secs(15)).await;

    kill(&peers[2]).await;
    let down = wait_until("n2 declared down", Duration::from_secs(10), async || {
        peers[..2]
            .iter()
            .all(|p| state_of(&p.node, "n2") == Some(MemberState::Down))
    })
    .await;
    eprintln!("n2 declared down by both survivors after {down:?}");
    // Writes n2 will never acknowledge: only its eviction lets the survivors compact them.
    write(&peers[0].node, "after", 20).await;
    write(&peers[1].node, "after1", 20).await;
    let mut ends = Vec::new();
    for p in &peers[..2] {
        ends.push(
            p.node
                .replication_status()
                .await
                .expect("status")
                .log_bounds
                .1,
        );
    }
    wait_until(
        "eviction, then compaction past writes n2 never acked",
        Duration::from_secs(20),
        async || {
            let mut ok = true;
            for (p, end) in peers[..2].iter().zip(&ends) {
                let s = p.node.replication_status().await.expect("status");
                ok &= s.stats.evictions >= 1 && s.log_bounds.0 >= *end;
            }
            ok
        },
    )
    .await;
    converge(&nodes[..2], Duration::from_secs(10)).await;
    for p in &peers[..2] {
        p.node.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_gets_only_deltas_and_a_wiped_one_one_transfer_from_one_peer() {
    let seed = seed("membership_rejoin");
    let root = tempfile::tempdir().expect("tempdir");
    // A long grace: n3 is not evicted meanwhile, so its cursors stay in the survivors' logs.
    let (_ca, mut peers) = cluster(4, seed, root.path(), 120_000, 10_000).await;
    wait_until("all alive", Duration::from_secs(15), async || {
        peers.iter().all(|p| alive_count(&p.node) == 3)
    })
    .await;
    for (i, p) in peers.iter().enumerate() {
        write(&p.node, &format!("w{i}"), 10).await;
    }
    let nodes: Vec<Node> = peers.iter().map(|p| p.node.clone()).collect();
    converge(&nodes, Duration::from_secs(15)).await;
    // The precondition of "a restart gets only deltas": n3 holds a cursor into every peer's
    // log. A new node gets its cursors from the one sender that bootstraps it and, from the
    // deferred senders, once they see its context cover theirs (at most 2 staggers later).
    // Restarted before that, it lacks a cursor into a deferred sender's log and rightly gets a
    // transfer from it: its announced context cannot show it holds that sender's dedup marks.
    wait_until(
        "every node has a cursor into every other node's log",
        Duration::from_secs(20),
        async || {
            for p in &peers {
                let s = p.node.replication_status().await.expect("status");
                if s.peer_acked.len() < 3 || s.peer_acked.iter().any(|(_, a)| a.is_none()) {
                    return false;
                }
            }
            true
        },
    )
    .await;

    // Restart with its data: new incarnation (epoch, boot time), new port, one seed.
    kill(&peers[3]).await;
    wait_until("n3 declared down", Duration::from_secs(10), async || {
        state_of(&peers[0].node, "n3") == Some(MemberState::Down)
    })
    .await;
    for p in &peers[..3] {
        write(&p.node, "while-down", 10).await;
    }
    let survivors: Vec<Node> = peers[..3].iter().map(|p| p.node.clone()).collect();
    let survivor_refs: Vec<&Node> = survivors.iter().collect();
    let before = transfers_started(&survivor_refs).await;
    let (dir, tls) = (peers[3].dir.clone(), peers[3].tls.clone());
    peers[3] = open(&dir, &tls, seed.wrapping_add(33), 120_000, 10_000).await;
    peers[3].node.join_peer(peers[0].addr).expect("join");
    let mut nodes: Vec<Node> = peers.iter().map(|p| p.node.clone()).collect();
    converge(&nodes, Duration::from_secs(20)).await;
    let s = peers[3].node.replication_status().await.expect("status");
    if s.stats.transfers_received != 0 {
        for (i, p) in peers[..3].iter().enumerate() {
            let st = p.node.replication_status().await.expect("status");
            eprintln!("n{i}: acked {:?}, stats {:?}", st.peer_acked, st.stats);
        }
    }
    assert_eq!(s.stats.transfers_received, 0, "a restart gets only deltas");
    assert!(s.stats.deltas_applied > 0, "it got the writes it missed");
    assert_eq!(
        transfers_started(&survivor_refs).await,
        before,
        "no survivor started a transfer"
    );

    // Wiped: a new replica id, bootstrapped by ONE transfer from ONE peer.
    let old_replica = peers[3].node.replica_id();
    kill(&peers[3]).await;
    wait_until(
        "n3 declared down again",
        Duration::from_secs(10),
        async || state_of(&peers[0].node, "n3") == Some(MemberState::Down),
    )
    .await;
    std::fs::remove_dir_all(&dir).expect("wipe");
    let before = transfers_started(&survivor_refs).await;
    peers[3] = open(&dir, &tls, seed.wrapping_add(34), 120_000, 10_000).await;
    assert_ne!(
        peers[3].node.replica_id(),
        old_replica,
        "a wipe is a new replica"
    );
    peers[3].node.join_peer(peers[0].addr).expect("join");
    nodes[3] = peers[3].node.clone();
    converge(&nodes, Duration::from_secs(20)).await;
    // Deferred senders give up once n3 announces what the one transfer brought.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = peers[3].node.replication_status().await.expect("status");
    assert_eq!(
        s.stats.transfers_received, 1,
        "exactly one transfer received"
    );
    assert_eq!(
        transfers_started(&survivor_refs).await - before,
        1,
        "started by exactly one peer"
    );
    converge(&nodes, Duration::from_secs(10)).await;
    for p in &peers {
        p.node.shutdown().await.expect("shutdown");
    }
}

fn swim_replica(node: &Node, name: &str) -> Option<String> {
    node.net_status()?
        .members
        .into_iter()
        .find(|m| m.name == name)
        .map(|m| m.replica)
}

fn name_conflicts(node: &Node) -> u64 {
    node.net_status().map_or(0, |s| s.stats.name_conflicts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_member_with_an_alive_members_name_is_refused_and_a_restart_still_rejoins() {
    let seed = seed("membership_impostor");
    let root = tempfile::tempdir().expect("tempdir");
    let (ca, mut peers) = cluster(2, seed, root.path(), 120_000, 10_000).await;
    wait_until("both alive", Duration::from_secs(15), async || {
        peers.iter().all(|p| alive_count(&p.node) == 1)
    })
    .await;
    let real = swim_replica(&peers[0].node, "n1").expect("n1 known");

    // Another process with a valid certificate for n1's name joins through n0.
    let impostor = open(
        &root.path().join("impostor"),
        &ca.issue("n1").expect("issue"),
        seed.wrapping_add(77),
        120_000,
        10_000,
    )
    .await;
    impostor.node.join_peer(peers[0].addr).expect("join");
    write(&impostor.node, "impostor", 5).await;
    wait_until(
        "n0 refuses the impostor",
        Duration::from_secs(10),
        async || name_conflicts(&peers[0].node) >= 1,
    )
    .await;
    wait_until(
        "the impostor learns it was refused",
        Duration::from_secs(10),
        async || name_conflicts(&impostor.node) >= 1,
    )
    .await;
    // Meanwhile (many probe periods) the real n1 stays n0's member and keeps converging.
    let pair = [peers[0].node.clone(), peers[1].node.clone()];
    let until = Instant::now() + Duration::from_secs(4);
    let mut round = 0;
    while Instant::now() < until {
        write(&peers[1].node, &format!("real{round}"), 3).await;
        write(&peers[0].node, &format!("n0-{round}"), 3).await;
        converge(&pair, Duration::from_secs(10)).await;
        assert_eq!(
            swim_replica(&peers[0].node, "n1").as_deref(),
            Some(real.as_str()),
            "n0 still has the real n1"
        );
        assert_eq!(state_of(&peers[0].node, "n1"), Some(MemberState::Alive));
        assert_eq!(alive_count(&peers[1].node), 1, "n1 still has n0 alive");
        round += 1;
    }
    let leaked = all_keys(&peers[0].node)
        .iter()
        .any(|(k, _)| format!("{k:?}").contains("impostor"));
    assert!(!leaked, "the impostor's writes reached n0");
    impostor.node.shutdown().await.expect("shutdown");

    // Once the real n1 is down, a new process with its name (wiped: a new replica) rejoins.
    kill(&peers[1]).await;
    wait_until("n1 declared down", Duration::from_secs(10), async || {
        state_of(&peers[0].node, "n1") == Some(MemberState::Down)
    })
    .await;
    let tls = peers[1].tls.clone();
    peers[1] = open(
        &root.path().join("n1-wiped"),
        &tls,
        seed.wrapping_add(78),
        120_000,
        10_000,
    )
    .await;
    peers[1].node.join_peer(peers[0].addr).expect("join");
    wait_until(
        "the new n1 is alive at n0",
        Duration::from_secs(15),
        async || {
            state_of(&peers[0].node, "n1") == Some(MemberState::Alive)
                && swim_replica(&peers[0].node, "n1").is_some_and(|r| r != real)
        },
    )
    .await;
    write(&peers[1].node, "reborn", 3).await;
    let pair = [peers[0].node.clone(), peers[1].node.clone()];
    converge(&pair, Duration::from_secs(20)).await;

    // Killed and restarted at once (n0 still has the old one alive): refused until n0 declares
    // the old incarnation down, then it rejoins without help.
    let before = swim_replica(&peers[0].node, "n1").expect("n1 known");
    let conflicts = name_conflicts(&peers[0].node);
    kill(&peers[1]).await;
    peers[1] = open(
        &root.path().join("n1-again"),
        &tls,
        seed.wrapping_add(79),
        120_000,
        10_000,
    )
    .await;
    peers[1].node.join_peer(peers[0].addr).expect("join");
    write(&peers[1].node, "again", 3).await;
    wait_until(
        "the quick restart is alive at n0",
        Duration::from_secs(20),
        async || {
            state_of(&peers[0].node, "n1") == Some(MemberState::Alive)
                && swim_replica(&peers[0].node, "n1").is_some_and(|r| r != before)
        },
    )
    .await;
    let pair = [peers[0].node.clone(), peers[1].node.clone()];
    converge(&pair, Duration::from_secs(20)).await;
    eprintln!(
        "quick restart: {} name conflicts at n0 meanwhile",
        name_conflicts(&peers[0].node) - conflicts
    );

    // A clean shutdown: n0 lists n1 as down because it left, with when it last heard from it.
    peers[1].node.shutdown().await.expect("shutdown");
    wait_until("n1 left", Duration::from_secs(10), async || {
        peers[0].node.net_status().is_some_and(|s| {
            s.members.iter().any(|m| {
                m.name == "n1"
                    && m.state == MemberState::Down
                    && m.left
                    && m.last_contact_ms.is_some()
            })
        })
    })
    .await;
    for p in &peers[..1] {
        p.node.shutdown().await.expect("shutdown");
    }
}
