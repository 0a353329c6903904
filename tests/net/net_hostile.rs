//! An authenticated but hostile peer (valid certificate of the cluster CA, honest name) that
//! breaks the protocol: oversized frames, a future format version, garbage after a valid
//! header, forged dots of the receiver's own replica, many streams. Pass: it is disconnected
//! and counted (or, for streams, never granted more than one), nothing it sent is applied, and
//! the node keeps replicating with its real peer.

use crate::net_support;

use net_support::{Cluster, raw};
use std::time::{Duration, Instant};
use tidemark::model::StateChunk;
use tidemark::proto::Message;
use tidemark::{Key, KeyKind, Op, ReplicaId, Value};

async fn still_serves(c: &Cluster, tag: &str) {
    let key = format!("alive-{tag}");
    c.members[1]
        .node
        .apply(Op::inc_gcounter(&key, 1))
        .await
        .expect("write");
    let k = Key::new(KeyKind::GCounter, &key);
    let started = Instant::now();
    while c.members[0].node.get(&k).expect("get") != Value::GCounter(1) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "n0 stopped serving n1"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The node closed the connection with the protocol-violation code (2).
fn assert_protocol_close(reason: &quinn::ConnectionError) {
    match reason {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, quinn::VarInt::from_u32(2), "{reason}");
        }
        other => panic!("not closed as a protocol violation: {other}"),
    }
}

/// Connects as `n7` (valid), sends `body` as one frame (or `raw_len` as a bare header), and
/// expects n0 to close the connection as a protocol violation, applying nothing.
async fn disconnected_for(body: Vec<u8>, raw_len: Option<u32>) {
    let c = Cluster::start(2, 11).await;
    c.members[0]
        .node
        .apply(Op::inc_gcounter("base", 1))
        .await
        .expect("write");
    let before = c.members[0].node.context().expect("ctx");
    let tls = c.ca.issue("n7").expect("issue");
    let conn = raw::connect(c.members[0].addr, Some(&tls))
        .await
        .expect("handshake");
    let (mut send, _recv) = raw::hello(&conn, "n7").await.expect("accepted as n7");
    match raw_len {
        Some(len) => {
            let _ = send.write_all(&len.to_le_bytes()).await;
        }
        None => {
            let _ = raw::frame(&mut send, &body).await;
        }
    }
    // A valid frame after the bad one must not be applied either.
    let late = tidemark::codec::encode(
        "frame",
        &Message::Have {
            replica: ReplicaId(42),
            ctx: Default::default(),
        },
    )
    .expect("encode");
    let _ = raw::frame(&mut send, &late).await;
    let reason = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .expect("the node closes the connection");
    assert_protocol_close(&reason);
    let status = c.members[0].node.net_status().expect("status");
    assert!(status.stats.peers_disconnected >= 1, "{status:?}");
    assert_eq!(
        c.members[0].node.context().expect("ctx"),
        before,
        "nothing applied"
    );
    still_serves(&c, "after").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_disconnects_the_peer() {
    disconnected_for(Vec::new(), Some(4 * 1024 * 1024 + 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_of_a_future_version_disconnects_the_peer() {
    let mut body = tidemark::codec::encode(
        "frame",
        &Message::Have {
            replica: ReplicaId(1),
            ctx: Default::default(),
        },
    )
    .expect("encode");
    body[0] = tidemark::codec::FORMAT_VERSION + 1;
    disconnected_for(body, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_a_valid_header_disconnects_the_peer() {
    let mut body = vec![tidemark::codec::FORMAT_VERSION];
    body.extend((0..200u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    disconnected_for(body, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailing_bytes_after_a_valid_message_disconnect_the_peer() {
    let mut body = tidemark::codec::encode(
        "frame",
        &Message::Have {
            replica: ReplicaId(1),
            ctx: Default::default(),
        },
    )
    .expect("encode");
    body.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    disconnected_for(body, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_dots_of_the_receivers_own_replica_disconnect_the_peer() {
    // A state chunk claiming the receiver's own replica has made a million more writes.
    let c = Cluster::start(2, 13).await;
    let victim = c.members[0].node.replica_id();
    c.members[0]
        .node
        .apply(Op::inc_gcounter("base", 1))
        .await
        .expect("write");
    let before = c.members[0].node.context().expect("ctx");
    let mut ctx = tidemark::crdts::CausalContext::new();
    ctx.insert_range(victim, 1, 1_000_000);
    let msg = Message::Chunk {
        epoch: 1,
        log: ReplicaId(77),
        transfer: 1,
        index: 0,
        end: 1,
        chunk: StateChunk {
            after: None,
            upto: None,
            entries: Vec::new(),
            ctx,
            dots: None,
            marks: Default::default(),
            last: true,
        },
    };
    let tls = c.ca.issue("n7").expect("issue");
    let conn = raw::connect(c.members[0].addr, Some(&tls))
        .await
        .expect("handshake");
    let (mut send, _recv) = raw::hello(&conn, "n7").await.expect("accepted");
    let body = tidemark::codec::encode("frame", &msg).expect("encode");
    raw::frame(&mut send, &body).await.expect("sent");
    let reason = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .expect("the node closes the connection");
    assert_protocol_close(&reason);
    assert_eq!(
        c.members[0].node.context().expect("ctx"),
        before,
        "nothing applied"
    );
    let status = c.members[0].node.net_status().expect("status");
    assert!(status.stats.peers_disconnected >= 1, "{status:?}");
    assert!(c.members[0].node.metrics().remote_rejected >= 1);
    still_serves(&c, "forged").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_open_more_than_one_stream() {
    let c = Cluster::start(2, 14).await;
    let tls = c.ca.issue("n7").expect("issue");
    let conn = raw::connect(c.members[0].addr, Some(&tls))
        .await
        .expect("handshake");
    let _streams = raw::hello(&conn, "n7").await.expect("accepted");
    // Thousands of streams: QUIC's stream limit grants none beyond the first.
    for _ in 0..3 {
        assert!(
            tokio::time::timeout(Duration::from_millis(200), conn.open_bi())
                .await
                .is_err(),
            "a second bidirectional stream was granted"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(100), conn.open_uni())
                .await
                .is_err(),
            "a unidirectional stream was granted"
        );
    }
    still_serves(&c, "streams").await;
    c.shutdown().await;
}
