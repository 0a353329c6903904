//! The size invariants at real sizes: every message within `frame_bytes_max` and every record
//! within the message target by construction, every limit of `Limits` enforced, bounded dedup
//! marks, validated remote marks. Values and batches up to the limits, tens of thousands of
//! sources, rows larger than a frame; replication driven through the real `Replica` over the real
//! redb store (in-memory backend), every frame encoded, measured and decoded.

use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tidemark::codec;
use tidemark::crdts::DedupMarks;
use tidemark::proto::{Message, Now, PeerId, Replica, ReplicaConfig, ReplicaEvent, StateStore};
use tidemark::store::{EventId, LocalWrite, OpenOptions, RedbStore};
use tidemark::{Error, Event, Key, KeyKind, Limits, Node, NodeConfig, Op, ReplicaId, Value};

/// A store in its own directory under `root` (files, as in production: redb's in-memory
/// backend copies its whole image on growth, which makes large rows slow).
fn store(root: &tempfile::TempDir, id: u128) -> RedbStore {
    RedbStore::open(
        &root.path().join(format!("r{id}")),
        OpenOptions {
            new_replica_id: Some(ReplicaId(id)),
            limits: limits(),
            ..OpenOptions::default()
        },
    )
    .expect("open store")
}

/// Default limits but set elements up to 16 KiB (a real, valid setting), so a set larger than
/// a 4 MiB frame takes a few hundred adds instead of thousands: a set is one row, and each add
/// to it copies the row, so thousands of adds would cost the test minutes.
fn limits() -> Limits {
    let l = Limits {
        element_bytes_max: 16 * 1024,
        ..Limits::default()
    };
    assert_eq!(l.validate(), Ok(()));
    l
}

/// Elements of 15,000 bytes: 320 of them make a row of about 4.8 MB, over the frame.
const ELEM: usize = 15_000;
const ELEMS: usize = 320;

fn root() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn text(len: usize, tag: usize) -> String {
    let s = format!("v{tag}-");
    let mut out = s.repeat(len / s.len() + 1);
    out.truncate(len);
    serde_json::Value::from(out).to_string()
}

fn lww(name: &str, value_len: usize, tag: usize) -> LocalWrite {
    LocalWrite {
        ops: vec![(
            Key::new(KeyKind::Lww, name),
            tidemark::crdts::Mutation::Set(text(value_len - 2, tag)),
        )],
        event: None,
        stamps: Vec::new(),
        late: None,
        own_dots: false,
    }
}

fn set_add(name: &str, elem_len: usize, tag: usize) -> LocalWrite {
    LocalWrite {
        ops: vec![(
            Key::new(KeyKind::ORSet, name),
            tidemark::crdts::Mutation::Add(text(elem_len - 2, tag)),
        )],
        event: None,
        stamps: Vec::new(),
        late: None,
        own_dots: false,
    }
}

fn source_name(i: usize) -> String {
    format!("{i:06}-{}", "s".repeat(140))
}

fn event(source: &str, seq: u64) -> LocalWrite {
    LocalWrite {
        ops: Vec::new(),
        event: Some(EventId {
            stream: "clicks".into(),
            source: source.into(),
            seq,
        }),
        stamps: Vec::new(),
        late: None,
        own_dots: false,
    }
}

/// Every log record of `s`, one by one: each must be readable and within the message target.
fn assert_records_within_target(s: &mut RedbStore) -> usize {
    let target = Limits::default().message_bytes_target;
    let (start, end) = s.log_bounds();
    let mut seq = start;
    let mut n = 0;
    while seq < end {
        let one = s
            .log_interval(seq, None, 1)
            .expect("every record is readable");
        assert_eq!(one.end, seq + 1, "a 1-byte bound takes exactly one record");
        let len = codec::encoded_len("record", &one.delta).expect("measures");
        assert!(
            len <= target,
            "log record {seq} is {len} bytes, over {target}"
        );
        seq = one.end;
        n += 1;
    }
    n
}

// ---- 2a / 3: one large commit group ---------------------------------------------------------

#[test]
fn a_batch_of_80_values_of_60_kb_is_logged_in_records_within_the_target() {
    let dir = root();
    let mut a = store(&dir, 1);
    let writes: Vec<LocalWrite> = (0..80).map(|i| lww(&format!("k{i}"), 60_000, i)).collect();
    let commit = a.commit_local(&writes, 1).expect("commit");
    let records = assert_records_within_target(&mut a);
    assert!(
        records >= 5,
        "4.8 MB must take several records, got {records}"
    );
    assert_eq!(commit.log_seq, Some(0));
    // The records together are the group: read from the first, they hold every value.
    let all = a.log_interval(0, None, usize::MAX).expect("read");
    assert_eq!(all.delta.expect("delta").state.store.len(), 80);
    // Compaction reads every record back.
    let (_, end) = a.log_bounds();
    a.compact(end).expect("compaction after a large batch");
    a.verify().expect("store invariants");
}

// ---- 2b: the interval bound of the redb store -----------------------------------------------

#[test]
fn a_log_interval_never_exceeds_its_byte_bound() {
    let dir = root();
    let mut a = store(&dir, 1);
    let target = Limits::default().message_bytes_target;
    for batch in 0..6 {
        let writes: Vec<LocalWrite> = (0..10)
            .map(|i| lww(&format!("b{batch}-{i}"), 60_000, i))
            .collect();
        a.commit_local(&writes, 1).expect("commit");
    }
    let (start, end) = a.log_bounds();
    let mut from = start;
    while from < end {
        let iv = a.log_interval(from, None, target).expect("interval");
        let len = codec::encoded_len("interval", &iv.delta).expect("measures");
        assert!(
            len <= target,
            "interval [{from}, {}) is {len} bytes",
            iv.end
        );
        assert!(iv.end > from);
        from = iv.end;
    }
}

// ---- sans-IO pair over the real store: every frame measured --------------------------------

struct Side {
    id: PeerId,
    store: RedbStore,
    replica: Replica,
}

fn config() -> ReplicaConfig {
    ReplicaConfig {
        gossip_interval_ms: 20,
        retransmit_timeout_ms: 5_000,
        retransmit_timeout_max_ms: 5_000,
        catch_up_stagger_ms: 0,
        message_bytes_target: Limits::default().message_bytes_target,
        ..ReplicaConfig::default()
    }
}

fn side(i: u64, store: RedbStore, peers: &[u64]) -> Side {
    let epoch = store.epoch();
    Side {
        id: PeerId(i),
        store,
        replica: Replica::new(config(), epoch, i, peers.iter().map(|p| PeerId(*p))),
    }
}

#[derive(Default, Debug)]
struct Traffic {
    frames: u64,
    largest: usize,
    chunks: u64,
}

fn rows(s: &mut RedbStore) -> Vec<(Key, tidemark::crdts::Entry)> {
    s.read_chunk(None, usize::MAX).expect("rows").entries
}

fn same(a: &mut Side, b: &mut Side) -> bool {
    a.store.ctx() == b.store.ctx()
        && a.store.dedup_marks().expect("marks") == b.store.dedup_marks().expect("marks")
        && rows(&mut a.store) == rows(&mut b.store)
}

/// Runs both replicas (virtual time) until they hold the same state with nothing in flight.
/// Every frame is encoded and must be within `frame_bytes_max`.
fn run(sides: &mut [Side; 2], now: &mut u64, traffic: &mut Traffic) {
    let frame_max = Limits::default().frame_bytes_max;
    for i in 0..2 {
        let peer = sides[1 - i].id;
        let n = Now {
            mono_ms: *now,
            wall_ms: 1_000 + *now,
        };
        let (s, _) = pick(sides, i);
        s.replica.peer_up(n, peer, &mut s.store).expect("peer up");
    }
    for _ in 0..20_000 {
        *now += 10;
        let n = Now {
            mono_ms: *now,
            wall_ms: 1_000 + *now,
        };
        let mut queue: VecDeque<(usize, Vec<u8>)> = VecDeque::new();
        for i in 0..2 {
            let (s, _) = pick(sides, i);
            s.replica.handle_timeout(n, &mut s.store).expect("timeout");
            drain(s, i, &mut queue, traffic, frame_max);
        }
        while let Some((to, bytes)) = queue.pop_front() {
            let msg: Message = codec::decode("frame", &bytes, frame_max).expect("decodes");
            let (s, from) = pick(sides, to);
            s.replica
                .handle_message(n, from, msg, &mut s.store)
                .expect("handle");
            drain(s, to, &mut queue, traffic, frame_max);
        }
        let [a, b] = sides;
        if a.replica.in_flight() == 0 && b.replica.in_flight() == 0 && same(a, b) {
            return;
        }
    }
    panic!("no convergence: {traffic:?}");
}

fn pick(sides: &mut [Side; 2], i: usize) -> (&mut Side, PeerId) {
    let other = sides[1 - i].id;
    (&mut sides[i], other)
}

fn drain(
    s: &mut Side,
    i: usize,
    queue: &mut VecDeque<(usize, Vec<u8>)>,
    t: &mut Traffic,
    max: usize,
) {
    while let Some(tx) = s.replica.poll_transmit() {
        if matches!(tx.msg, Message::Chunk { .. }) {
            t.chunks += 1;
        }
        let bytes = codec::encode("frame", &tx.msg).expect("encodes");
        assert!(
            bytes.len() <= max,
            "a {} message of {} bytes is over frame_bytes_max {max}",
            tx.msg.kind(),
            bytes.len()
        );
        t.frames += 1;
        t.largest = t.largest.max(bytes.len());
        queue.push_back((1 - i, bytes));
    }
    while let Some(e) = s.replica.poll_event() {
        if let ReplicaEvent::Rejected { reason, .. } = e {
            panic!("a correct peer's message was rejected: {reason:?}");
        }
    }
}

// ---- 2c: tens of thousands of sources ------------------------------------------------------

#[test]
fn thirty_thousand_sources_transfer_in_pages_within_the_frame() {
    let dir = root();
    let mut a = store(&dir, 1);
    for batch in 0..3 {
        let writes: Vec<LocalWrite> = (0..10_000)
            .map(|i| event(&source_name(batch * 10_000 + i), 1))
            .collect();
        a.commit_local(&writes, 1).expect("commit");
    }
    assert_records_within_target(&mut a);
    let marks = a.dedup_marks().expect("marks");
    let marks_len = codec::encoded_len("marks", &marks).expect("measures");
    assert!(
        marks_len > Limits::default().frame_bytes_max,
        "{marks_len} bytes of marks"
    );
    // A new peer gets everything by a state transfer.
    let mut sides = [side(1, a, &[2]), side(2, store(&dir, 2), &[1])];
    let (mut now, mut traffic) = (0, Traffic::default());
    run(&mut sides, &mut now, &mut traffic);
    assert!(traffic.chunks >= 5, "{traffic:?}");
    // A retry of any event at the receiver is a duplicate.
    let retry: Vec<LocalWrite> = (0..30_000)
        .step_by(997)
        .map(|i| event(&source_name(i), 1))
        .collect();
    let c = sides[1].store.commit_local(&retry, 1).expect("retry");
    assert!(c.duplicate.iter().all(|d| *d));
}

// ---- 2d: a row larger than a frame ---------------------------------------------------------

#[test]
fn a_set_larger_than_a_frame_transfers_in_parts_without_losing_dots() {
    let dir = root();
    let mut a = store(&dir, 1);
    // One row of about 4.8 MB, larger than a 4 MiB frame.
    for batch in 0..4 {
        let writes: Vec<LocalWrite> = (0..ELEMS / 4)
            .map(|i| set_add("big", ELEM, batch * ELEMS / 4 + i))
            .collect();
        a.commit_local(&writes, 1).expect("commit");
    }
    let row = a
        .reader()
        .get(&Key::new(KeyKind::ORSet, "big"))
        .expect("read");
    let row_len = codec::encoded_len("row", &row).expect("measures");
    assert!(row_len > Limits::default().frame_bytes_max, "{row_len}");
    let mut sides = [side(1, a, &[2]), side(2, store(&dir, 2), &[1])];
    let (mut now, mut traffic) = (0, Traffic::default());
    run(&mut sides, &mut now, &mut traffic);
    let first = traffic.chunks;
    // While the peer is away: remove some elements, add others, and compact the whole log, so
    // the peer — which holds most of the set — gets another transfer in parts. A part must not
    // delete the dots other parts carry.
    let key = Key::new(KeyKind::ORSet, "big");
    let mut writes = Vec::new();
    for i in (0..ELEMS).step_by(10) {
        writes.push(LocalWrite {
            ops: vec![(
                key.clone(),
                tidemark::crdts::Mutation::Remove(text(ELEM - 2, i)),
            )],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        });
    }
    for i in ELEMS..ELEMS + 20 {
        writes.push(set_add("big", ELEM, i));
    }
    sides[0].store.commit_local(&writes, 1).expect("commit");
    let (_, end) = sides[0].store.log_bounds();
    sides[0].store.compact(end).expect("compact");
    sides[0].replica.peer_down(
        Now {
            mono_ms: now,
            wall_ms: now,
        },
        PeerId(2),
    );
    sides[1].replica.peer_down(
        Now {
            mono_ms: now,
            wall_ms: now,
        },
        PeerId(1),
    );
    run(&mut sides, &mut now, &mut traffic);
    assert!(traffic.chunks > first, "a second transfer ran: {traffic:?}");
    let value = sides[1].store.reader().get(&key).expect("read");
    let Some(Value::ORSet(items)) = value else {
        panic!("set missing: {value:?}");
    };
    assert_eq!(items.len(), ELEMS - ELEMS / 10 + 20);
    sides[1].store.verify().expect("receiver invariants");
}

/// A set of many small elements, larger than a message, sent again to a peer that holds most of
/// it (after removals and adds, with the log compacted): the transfer goes in parts, the
/// receiver joins them back into one state and applies it once, and its context then covers
/// far more of the dots it holds than a remote delta's bounded index lookup (4,096), so the
/// set is read whole. The receiver must end with exactly the sender's elements.
#[test]
fn a_large_set_of_small_elements_is_transferred_again_in_parts_exactly() {
    const N: usize = 60_000;
    let dir = root();
    let mut a = store(&dir, 1);
    let key = Key::new(KeyKind::ORSet, "many");
    for start in (0..N).step_by(10_000) {
        let writes: Vec<LocalWrite> = (start..start + 10_000)
            .map(|i| set_add("many", 24, i))
            .collect();
        a.commit_local(&writes, 1).expect("commit");
    }
    let mut sides = [side(1, a, &[2]), side(2, store(&dir, 2), &[1])];
    let (mut now, mut traffic) = (0, Traffic::default());
    run(&mut sides, &mut now, &mut traffic);
    let first = traffic.chunks;
    assert!(first >= 4, "the set went in parts: {traffic:?}");
    let mut writes = Vec::new();
    for i in (0..N).step_by(7) {
        writes.push(LocalWrite {
            ops: vec![(key.clone(), tidemark::crdts::Mutation::Remove(text(22, i)))],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        });
    }
    for i in N..N + 50 {
        writes.push(set_add("many", 24, i));
    }
    sides[0].store.commit_local(&writes, 1).expect("commit");
    let (_, end) = sides[0].store.log_bounds();
    sides[0].store.compact(end).expect("compact");
    for (i, peer) in [(0, PeerId(2)), (1, PeerId(1))] {
        sides[i].replica.peer_down(
            Now {
                mono_ms: now,
                wall_ms: now,
            },
            peer,
        );
    }
    run(&mut sides, &mut now, &mut traffic);
    assert!(
        traffic.chunks - first >= 4,
        "a second transfer in parts ran: {traffic:?}"
    );
    let sent = sides[0].store.reader().get(&key).expect("read");
    let got = sides[1].store.reader().get(&key).expect("read");
    let Some(Value::ORSet(items)) = &got else {
        panic!("set missing: {got:?}");
    };
    assert_eq!(items.len(), N - N.div_ceil(7) + 50);
    assert_eq!(
        got, sent,
        "the receiver holds exactly the sender's elements"
    );
    sides[1].store.verify().expect("receiver invariants");
}

// ---- defect 5 and every limit ---------------------------------------------------------------

#[test]
fn limits_are_checked_against_each_other() {
    assert_eq!(Limits::default().validate(), Ok(()));
    let bad = [
        Limits {
            value_bytes_max: 512 * 1024,
            ..Limits::default()
        },
        Limits {
            element_bytes_max: 512 * 1024,
            ..Limits::default()
        },
        Limits {
            frame_bytes_max: 128 << 20,
            ..Limits::default()
        },
        Limits {
            message_bytes_target: 3 << 20,
            ..Limits::default()
        },
        Limits {
            batch_ops_max: 30_000,
            write_queue_ops_max: 100_000,
            ..Limits::default()
        },
        Limits {
            sources_per_batch_max: 0,
            ..Limits::default()
        },
        Limits {
            dedup_ranges_max: 0,
            ..Limits::default()
        },
    ];
    for l in bad {
        assert!(l.validate().is_err(), "{l:?} must be refused");
    }
}

fn field_of(e: &Error) -> Option<(usize, &'static str)> {
    match e {
        Error::InvalidOp { index, field, .. } | Error::TooLarge { index, field, .. } => {
            Some((*index, field))
        }
        _ => None,
    }
}

#[test]
fn sources_and_sizes_are_validated_up_front() {
    let limits = Limits::default();
    let ok = Op::inc_gcounter("c", 1);
    for bad in ["", "a\0b", "tab\there"] {
        let ops = vec![ok.clone(), ok.clone().with_id(bad, 1)];
        let e = tidemark::ops::validate_ops(&ops, &limits).expect_err("bad source");
        assert_eq!(field_of(&e), Some((1, "source")), "{bad:?}: {e}");
    }
    let long = "x".repeat(1 << 20);
    let e =
        tidemark::ops::validate_ops(&[ok.clone().with_id(&long, 1)], &limits).expect_err("1 MiB");
    assert_eq!(field_of(&e), Some((0, "source")));
    let ev = |source: &str| Event {
        source: source.into(),
        seq: 1,
        ops: vec![ok.clone()],
        ..Default::default()
    };
    let e =
        tidemark::ops::validate_events("s", &[ev("ok"), ev("n\0ul")], &limits).expect_err("NUL");
    assert_eq!(field_of(&e), Some((1, "source")));
    // sources_per_batch_max.
    let few = Limits {
        sources_per_batch_max: 100,
        ..Limits::default()
    };
    let events: Vec<Event> = (0..101).map(|i| ev(&format!("src-{i}"))).collect();
    let e = tidemark::ops::validate_events("s", &events, &few).expect_err("101 sources");
    assert!(
        matches!(
            e,
            Error::TooManySources {
                index: 100,
                len: 101,
                limit: 100
            }
        ),
        "{e}"
    );
    assert_eq!(e.code(), "too_large");
    assert!(tidemark::ops::validate_events("s", &events[..100], &few).is_ok());
    let ops: Vec<Op> = (0..101)
        .map(|i| ok.clone().with_id(&format!("s{i}"), 1))
        .collect();
    assert!(matches!(
        tidemark::ops::validate_ops(&ops, &few),
        Err(Error::TooManySources { .. })
    ));
    // An event that cannot fit one message is refused up front, naming the event and field.
    let big = Event {
        source: "s".into(),
        seq: 1,
        ops: (0..20)
            .map(|i| Op::set_lww(&format!("k{i}"), "x".repeat(60_000)))
            .collect(),
        ..Default::default()
    };
    let e = tidemark::ops::validate_events("s", &[ev("a"), big], &limits).expect_err("too large");
    assert_eq!(field_of(&e), Some((1, "ops")));
    assert_eq!(e.code(), "too_large");
    // Values, elements, batches.
    let e = tidemark::ops::validate_ops(&[Op::set_lww("k", "x".repeat(70_000))], &limits)
        .expect_err("value");
    assert_eq!(field_of(&e), Some((0, "value")));
    let e = tidemark::ops::validate_ops(&[Op::add("k", "x".repeat(2_000))], &limits)
        .expect_err("element");
    assert_eq!(field_of(&e), Some((0, "value")));
    let many = vec![ok.clone(); limits.batch_ops_max + 1];
    assert!(matches!(
        tidemark::ops::validate_ops(&many, &limits),
        Err(Error::BatchTooLarge { .. })
    ));
}

// ---- bounded dedup marks --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_with_many_gaps_is_refused_at_the_bound_never_deduplicated_wrongly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = NodeConfig::new(dir.path());
    cfg.limits.dedup_ranges_max = 16;
    let node = Node::open(cfg).await.expect("open");
    let ev = |seq: u64| Event {
        source: "gappy".into(),
        seq,
        ops: vec![Op::inc_gcounter("n", 1)],
        ..Default::default()
    };
    // Odd seqs: each opens a range. 16 fit.
    for seq in (1..=31).step_by(2) {
        node.ingest("s", vec![ev(seq)])
            .await
            .expect("within the bound");
    }
    let e = node
        .ingest("s", vec![ev(33)])
        .await
        .expect_err("17th range");
    assert!(
        matches!(
            e,
            Error::DedupGaps {
                index: 0,
                ranges: 16,
                limit: 16,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.code(), "dedup_gaps");
    let count = |n: &Node| n.get(&Key::new(KeyKind::GCounter, "n")).expect("get");
    assert_eq!(
        count(&node),
        Value::GCounter(16),
        "the refused event was not applied"
    );
    // Filling a gap merges ranges: accepted; then the refused one fits again.
    node.ingest("s", vec![ev(2)]).await.expect("fills a gap");
    node.ingest("s", vec![ev(33)]).await.expect("fits now");
    // A retry of anything applied is a duplicate, never applied twice.
    let out = node
        .ingest("s", vec![ev(1), ev(2), ev(33)])
        .await
        .expect("retry");
    assert_eq!(out.duplicates, 3);
    assert_eq!(count(&node), Value::GCounter(18));
    // A batch with a refused event fails as a whole; its other events may apply, and a retry of
    // the batch applies none twice.
    let e = node
        .ingest("s", vec![ev(34), ev(100)])
        .await
        .expect_err("100 opens a range");
    assert!(matches!(e, Error::DedupGaps { index: 1, .. }), "{e}");
    let out = node.ingest("s", vec![ev(34)]).await.expect("retry");
    assert_eq!(out.duplicates, 1);
    assert_eq!(count(&node), Value::GCounter(19));
    node.shutdown().await.expect("shutdown");
}

// ---- remote marks validated -----------------------------------------------------------------

#[test]
fn remote_dedup_marks_are_validated() {
    let dir = root();
    let mut b = store(&dir, 2);
    let limits = Limits::default();
    for (stream, source) in [("", "a"), ("s", ""), ("s", "a\0"), ("s", &*"x".repeat(300))] {
        let mut marks = DedupMarks::new();
        marks.insert(stream, source, 7);
        let delta = tidemark::model::Delta {
            state: Default::default(),
            marks,
        };
        assert!(matches!(
            tidemark::admission::validate_delta(&delta, &limits, ReplicaId(2), b.ctx()),
            Err(tidemark::model::Rejected::BadMarks(_))
        ));
        let r = b
            .apply_remote_delta(PeerId(1), delta, 1)
            .expect("no storage failure");
        assert!(r.is_err(), "{stream:?}/{source:?} must be refused");
    }
    assert!(b.dedup_marks().expect("marks").is_empty());
}

// ---- two embedded nodes at real sizes ------------------------------------------------------

async fn converge(a: &Node, b: &Node) {
    let started = Instant::now();
    while a.context().expect("ctx") != b.context().expect("ctx") {
        if started.elapsed() > Duration::from_secs(60) {
            panic!(
                "no convergence within 60 s:\na {:?} {:?}\nb {:?} {:?}",
                a.metrics(),
                a.replication_status().await.map(|s| s.stats),
                b.metrics(),
                b.replication_status().await.map(|s| s.stats)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_converge_with_large_values_large_sets_and_many_sources() {
    two_nodes(tidemark::Durability::Immediate).await;
}

/// The same in relaxed durability, where the core reads through the driver's durable view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relaxed_nodes_converge_with_large_values_large_sets_and_many_sources() {
    two_nodes(tidemark::Durability::Relaxed).await;
}

async fn two_nodes(durability: tidemark::Durability) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = |name: &str| {
        let mut c = NodeConfig::new(dir.path().join(name));
        c.limits = limits();
        c.durability = durability;
        c
    };
    let a = Node::open(config("a")).await.expect("open a");
    let b = Node::open(config("b")).await.expect("open b");
    let values: Vec<Op> = (0..80)
        .map(|i| Op::set_lww(&format!("v{i}"), "x".repeat(60_000)))
        .collect();
    a.apply_batch(values).await.expect("80 values of 60 KB");
    for batch in 0..4 {
        let adds: Vec<Op> = (0..ELEMS / 4)
            .map(|i| {
                Op::add(
                    "big",
                    format!("{}-{}", batch * ELEMS / 4 + i, "e".repeat(ELEM - 20)),
                )
            })
            .collect();
        a.apply_batch(adds).await.expect("set adds");
    }
    let events = |batch: usize| -> Vec<Event> {
        (0..10_000)
            .map(|i| Event {
                source: source_name(batch * 10_000 + i),
                seq: 1,
                ops: Vec::new(),
                ..Default::default()
            })
            .collect()
    };
    for batch in 0..2 {
        a.ingest("clicks", events(batch)).await.expect("events");
    }
    a.compact(None)
        .await
        .expect("compaction after large batches");
    a.connect(&b).expect("connect");
    converge(&a, &b).await;
    // Marks-only events carry no dots: equal contexts do not yet mean the marks arrived. The
    // log was compacted, so b is seeded by one transfer; wait for it to complete.
    let started = Instant::now();
    while b
        .replication_status()
        .await
        .expect("status")
        .stats
        .transfers_received
        == 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "transfer incomplete"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let big = Key::new(KeyKind::ORSet, "big");
    assert_eq!(a.get(&big).expect("a"), b.get(&big).expect("b"));
    let v7 = Key::new(KeyKind::Lww, "v7");
    assert_eq!(b.get(&v7).expect("b"), a.get(&v7).expect("a"));
    // The marks reached b: a retry there is a duplicate.
    let out = b.ingest("clicks", events(1)).await.expect("retry at b");
    assert_eq!(out.duplicates, 10_000);
    for n in [&a, &b] {
        assert_eq!(n.metrics().frames_oversize, 0);
        assert_eq!(
            n.replication_status()
                .await
                .expect("status")
                .frames_rejected,
            0
        );
    }
    a.shutdown().await.expect("shutdown a");
    b.shutdown().await.expect("shutdown b");
}
