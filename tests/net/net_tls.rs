//! The mutual-TLS refusal matrix over real QUIC on 127.0.0.1: each case is a peer that must not
//! become a replication peer. Pass: the connection is refused (counted), nothing the intruder
//! wrote reaches the node, nothing of the node reaches the intruder, and the node keeps
//! replicating with its real peer.

use crate::net_support;

use net_support::{Cluster, localhost, raw, test_options};
use std::time::{Duration, Instant, SystemTime};
use tidemark::net::{ClusterCa, Faults, TlsDir};
use tidemark::{Key, KeyKind, Node, NodeConfig, Op, Value};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn evil() -> Key {
    Key::new(KeyKind::GCounter, "evil")
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The victim `n0` still replicates with `n1` (a write on n1 becomes visible on n0).
async fn still_serves(c: &Cluster, tag: &str) {
    let key = format!("alive-{tag}");
    c.members[1]
        .node
        .apply(Op::inc_gcounter(&key, 1))
        .await
        .expect("write");
    let n0 = c.members[0].node.clone();
    let k = Key::new(KeyKind::GCounter, &key);
    wait_for("the real peer's write", || {
        n0.get(&k).expect("get") == Value::GCounter(1)
    })
    .await;
}

fn refused(c: &Cluster) -> u64 {
    c.members[0]
        .node
        .net_status()
        .expect("listening")
        .stats
        .connections_refused
}

/// A full node with `tls` dials the victim; it must be refused both ways.
async fn intruder_node_is_refused(tls: TlsDir) {
    let c = Cluster::start(2, 1).await;
    c.members[0]
        .node
        .apply(Op::inc_gcounter("secret", 1))
        .await
        .expect("write");
    // Wait for the real pair to settle, then count registrations from here on.
    let n1 = c.members[1].node.clone();
    wait_for("the real peers", || {
        n1.net_status()
            .is_some_and(|s| s.peers == vec!["n0".to_owned()])
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let established_before = c.members[0]
        .node
        .net_status()
        .expect("status")
        .stats
        .connections_established;
    let root = tempfile::tempdir().expect("tempdir");
    let intruder = Node::open(NodeConfig::new(root.path()))
        .await
        .expect("open");
    intruder
        .apply(Op::inc_gcounter("evil", 5))
        .await
        .expect("write");
    intruder
        .listen_with(localhost(), tls.clone(), test_options(&Faults::new(0)))
        .await
        .expect("listen");
    intruder.join_peer(c.members[0].addr).expect("join");
    let (n0, i) = (c.members[0].node.clone(), intruder.clone());
    wait_for("a refused connection", || {
        let a = n0.net_status().expect("status").stats.connections_refused;
        let b = i.net_status().expect("status").stats.connections_refused;
        a + b >= 1
    })
    .await;
    // Several dial attempts later, still nothing crossed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    still_serves(&c, tls.name()).await;
    let status = n0.net_status().expect("status");
    assert!(!status.peers.contains(&tls.name().to_owned()) || tls.name() == "n1");
    assert_eq!(n0.get(&evil()).expect("get"), Value::GCounter(0));
    assert_eq!(
        intruder
            .get(&Key::new(KeyKind::GCounter, "secret"))
            .expect("get"),
        Value::GCounter(0)
    );
    assert_eq!(
        status.stats.connections_established, established_before,
        "the intruder was never registered as a peer: {status:?}"
    );
    intruder.shutdown().await.expect("shutdown");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_refused() {
    let other = ClusterCa::generate().expect("ca");
    intruder_node_is_refused(other.issue("n7").expect("issue")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_that_trusts_ours_is_refused() {
    // The intruder accepts our server certificate; our node must still refuse its client one.
    let ours = ClusterCa::generate().expect("ca");
    let other = ClusterCa::generate().expect("ca");
    let c = Cluster::start(2, 2).await;
    let _ = ours;
    let tls = other.issue("n7").expect("issue").with_ca(&c.ca);
    let conn = raw::connect(c.members[0].addr, Some(&tls)).await;
    if let Ok(conn) = conn {
        assert!(raw::hello(&conn, "n7").await.is_err());
    }
    wait_for("a refused connection", || refused(&c) >= 1).await;
    still_serves(&c, "other-ca").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused() {
    let c = Cluster::start(2, 3).await;
    let now = SystemTime::now();
    let tls =
        c.ca.issue_valid("n7", now - 3 * DAY, now - DAY)
            .expect("issue");
    let conn = raw::connect(c.members[0].addr, Some(&tls)).await;
    if let Ok(conn) = conn {
        assert!(raw::hello(&conn, "n7").await.is_err());
    }
    wait_for("a refused connection", || refused(&c) >= 1).await;
    still_serves(&c, "expired").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_yet_valid_certificate_is_refused() {
    let c = Cluster::start(2, 4).await;
    let now = SystemTime::now();
    let tls =
        c.ca.issue_valid("n7", now + DAY, now + 3 * DAY)
            .expect("issue");
    let conn = raw::connect(c.members[0].addr, Some(&tls)).await;
    if let Ok(conn) = conn {
        assert!(raw::hello(&conn, "n7").await.is_err());
    }
    wait_for("a refused connection", || refused(&c) >= 1).await;
    still_serves(&c, "not-yet-valid").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_client_certificate_is_refused() {
    let c = Cluster::start(2, 5).await;
    let conn = raw::connect(c.members[0].addr, None).await;
    if let Ok(conn) = conn {
        assert!(raw::hello(&conn, "n7").await.is_err());
    }
    wait_for("a refused connection", || refused(&c) >= 1).await;
    still_serves(&c, "no-cert").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_certificate_claiming_another_name_is_refused() {
    let c = Cluster::start(2, 6).await;
    // A certificate for n7, issued by the right CA, claiming to be n1 (a real member) and then
    // an unknown name: both refused before anything reaches the replica.
    let tls = c.ca.issue("n7").expect("issue");
    for claim in ["n1", "mallory"] {
        let conn = raw::connect(c.members[0].addr, Some(&tls))
            .await
            .expect("TLS itself succeeds");
        assert!(raw::hello(&conn, claim).await.is_err(), "claim {claim}");
        let reason = tokio::time::timeout(Duration::from_secs(5), conn.closed())
            .await
            .expect("closed");
        assert!(format!("{reason}").contains("identity"), "{reason}");
    }
    assert!(refused(&c) >= 2);
    still_serves(&c, "wrong-name").await;
    // The real n1 link survived the impersonation attempt.
    let status = c.members[0].node.net_status().expect("status");
    assert_eq!(status.peers, vec!["n1".to_owned()]);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_certificate_with_the_right_name_is_refused() {
    intruder_node_is_refused(TlsDir::self_signed("n7").expect("self-signed")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_udp_flood_does_not_stop_the_node_serving_its_peers() {
    let c = Cluster::start(2, 8).await;
    let target = c.members[0].addr;
    let flood = std::thread::spawn(move || {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut buf = [0u8; 1200];
        for i in 0..20_000u32 {
            for b in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let len = 1 + (x as usize % buf.len());
            // Long-header QUIC-looking packets too, so the endpoint has to parse them.
            if i % 2 == 0 {
                buf[0] = 0xc0;
            }
            let _ = sock.send_to(&buf[..len], target);
        }
    });
    still_serves(&c, "during-flood").await;
    flood.join().expect("flood thread");
    still_serves(&c, "after-flood").await;
    let status = c.members[0].node.net_status().expect("status");
    assert_eq!(status.peers, vec!["n1".to_owned()]);
    c.shutdown().await;
}
