//! Upgrades without data loss (issue 21): a data directory, a snapshot file and protocol frames
//! written by an earlier build (store format 5, kept in `tests/fixtures/format5/`) are read by
//! this build exactly.
//!
//! * The data directory is copied to a temporary directory (the committed copy is never opened
//!   in place), opened as a store and as a [`Node`]; every key's value, the causal context, the
//!   replica id and the dedup marks (a `(source, seq)` ingested again is a duplicate) are the
//!   ones written down here; the store's invariants hold (`verify`); a new write survives a
//!   clean close and a reopen.
//! * The snapshot file verifies, restores into a fresh directory under a new replica id and
//!   holds the same values.
//! * Every recorded frame decodes with this build's decoder to the content written down here,
//!   and re-encodes to the same bytes (the codec is canonical).
//!
//! The fixtures are written by `scripts/make-fixtures.sh`, which runs the ignored test
//! [`write_format5_fixtures`] of this file with `TIDEMARK_WRITE_FIXTURES=DIR`. Only the writer
//! uses internal details (a store created first with a chosen replica id, so the ids below are
//! fixed); the checks use the public API, the snapshot functions and the frame decoder.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tidemark::codec;
use tidemark::crdts::{
    CausalContext, DedupMarks, Key, KeyKind, Mutation, ReplicaId, Store, Timestamp, Value,
};
use tidemark::model::{Delta, StateChunk};
use tidemark::proto::Message;
use tidemark::store::{OpenOptions, RedbStore, verify_snapshot};
use tidemark::{Event, Limits, Node, NodeConfig, Op, WriteOutcome};

/// The committed fixtures of store format 5.
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/format5");
/// The snapshot file's name in [`FIXTURES`].
const SNAPSHOT_FILE: &str = "snapshot.tmsnap";
/// The environment variable that makes [`write_format5_fixtures`] write (to the directory it
/// names).
const WRITE_ENV: &str = "TIDEMARK_WRITE_FIXTURES";

/// The replica id of the node whose data directory is the fixture.
const A: ReplicaId = ReplicaId(0x0a0a_0a0a_0a0a_4a0a_8a0a_0a0a_0a0a_0a0a);
/// The replica id of the peer that synced with it (its data directory is not kept).
const B: ReplicaId = ReplicaId(0x0b0b_0b0b_0b0b_4b0b_8b0b_0b0b_0b0b_0b0b);

/// Dots of `A` in the fixture's context (one per op applied at `A`: see the writer).
const A_DOTS: u64 = 25;
/// Dots of `B` in the fixture's context.
const B_DOTS: u64 = 3;

/// The stream the fixture's events were ingested into.
const STREAM: &str = "clicks";

fn key(kind: KeyKind, name: &str) -> Key {
    Key::new(kind, name)
}

fn texts(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Every key of the fixture with its exact value, per kind in listing order (by name).
fn expected_values() -> Vec<(Key, Value)> {
    vec![
        (key(KeyKind::GCounter, "clicks"), Value::GCounter(3)),
        (key(KeyKind::GCounter, "hits"), Value::GCounter(17)),
        (key(KeyKind::GCounter, "jobs"), Value::GCounter(1)),
        (key(KeyKind::PNCounter, "balance"), Value::PNCounter(-8)),
        (key(KeyKind::PNCounter, "stock"), Value::PNCounter(4)),
        (
            key(KeyKind::ORSet, "tags"),
            Value::ORSet(texts(&["\"red\"", "42", "true"])),
        ),
        (
            key(KeyKind::ORSet, "visitors"),
            Value::ORSet(texts(&["\"ada\"", "\"bo\""])),
        ),
        (
            key(KeyKind::Lww, "config"),
            Value::Lww(Some("{\"level\":3,\"mode\":\"safe\"}".to_owned())),
        ),
        (
            key(KeyKind::MvReg, "note"),
            Value::MvReg(texts(&["\"final\""])),
        ),
        (
            key(KeyKind::MvReg, "owner"),
            Value::MvReg(texts(&["\"alice\"", "\"bob\""])),
        ),
    ]
}

/// Keys written and then deleted: they read as empty and are not listed.
fn deleted_keys() -> Vec<Key> {
    vec![key(KeyKind::Lww, "temp"), key(KeyKind::ORSet, "gone")]
}

/// The fixture's causal context: `A`'s dots `1..=A_DOTS` and `B`'s `1..=B_DOTS`.
fn expected_context() -> CausalContext {
    let mut ctx = CausalContext::from_range(A, 1, A_DOTS);
    ctx.insert_range(B, 1, B_DOTS);
    ctx
}

/// The events ingested into [`STREAM`] (the duplicate of `web-1`/1 was sent in a second batch).
fn fixture_events() -> Vec<Event> {
    vec![
        Event::with_ops("web-1", 1, vec![Op::inc_gcounter("clicks", 1)]),
        Event::with_ops("web-1", 2, vec![Op::inc_gcounter("clicks", 1)]),
        Event::with_ops("web-2", 1, vec![Op::add("visitors", "ada")]),
        Event::with_ops(
            "web-1",
            5,
            vec![Op::inc_gcounter("clicks", 1), Op::add("visitors", "bo")],
        ),
        Event::new("web-3", 7, serde_json::json!({"page": "/home"})),
    ]
}

/// The idempotent op applied once (and refused as a duplicate when sent again).
fn fixture_job() -> Op {
    Op::inc_gcounter("jobs", 1).with_id("cron", 1)
}

/// Copies the directory `from` (files and subdirectories) into the new directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's directory");
    for entry in std::fs::read_dir(from).expect("read the fixture directory") {
        let entry = entry.expect("fixture directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a fixture file");
        }
    }
}

/// The fixture data directory, copied into `tmp`.
fn fixture_data_copy(tmp: &Path) -> PathBuf {
    let source = Path::new(FIXTURES).join("data");
    assert!(
        source.is_dir(),
        "{} is missing (scripts/make-fixtures.sh writes it)",
        source.display()
    );
    let copy = tmp.join("data");
    copy_dir(&source, &copy);
    copy
}

async fn open(dir: &Path) -> Node {
    Node::open(NodeConfig::new(dir))
        .await
        .expect("the current build opens the data directory")
}

/// Every key `node` lists, over every kind.
fn listed(node: &Node) -> Vec<(Key, Value)> {
    KeyKind::ALL
        .iter()
        .flat_map(|kind| node.list(*kind, "", None, 1_000).expect("list"))
        .collect()
}

/// `node` holds exactly `values` (and nothing else), and the deleted keys read as empty.
fn assert_values(node: &Node, values: &[(Key, Value)], what: &str) {
    for (k, v) in values {
        assert_eq!(&node.get(k).expect("get"), v, "{what}: {k:?}");
    }
    for k in deleted_keys() {
        assert_eq!(
            node.get(&k).expect("get"),
            Value::empty(k.kind),
            "{what}: deleted {k:?}"
        );
    }
    assert_eq!(listed(node), values, "{what}: the keys listed");
}

/// Every event of the fixture, and its idempotent op, is a duplicate at `node`.
async fn assert_marks(node: &Node, what: &str) {
    let again = node
        .ingest(STREAM, fixture_events())
        .await
        .expect("ingest the fixture's events again");
    assert_eq!(
        again,
        WriteOutcome {
            applied: 0,
            duplicates: 5,
            late: 0
        },
        "{what}: the fixture's events are duplicates"
    );
    let job = node
        .apply(fixture_job())
        .await
        .expect("apply the job again");
    assert_eq!(
        (job.applied, job.duplicates),
        (0, 1),
        "{what}: the idempotent op is a duplicate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format5_data_directory_opens_with_every_value_and_mark() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = fixture_data_copy(tmp.path());

    // The store as it is on disk: the replica id, the context, the invariants.
    {
        let store = RedbStore::open(&dir, OpenOptions::default()).expect("open the store");
        assert_eq!(store.replica(), A, "the replica id survives the upgrade");
        assert_eq!(store.ctx(), &expected_context());
        store.verify().expect("the format 5 store verifies");
        let reader = store.reader();
        for (k, v) in expected_values() {
            assert_eq!(reader.get(&k).expect("read"), Some(v), "store: {k:?}");
        }
    }

    // As a node: values, context, marks; then a new write of every kind.
    let node = open(&dir).await;
    assert_eq!(node.replica_id(), A);
    assert_eq!(node.context().expect("context"), expected_context());
    assert_values(&node, &expected_values(), "opened");
    assert_marks(&node, "opened").await;
    assert_values(&node, &expected_values(), "after the duplicates");

    let new = node
        .ingest(
            STREAM,
            vec![Event::with_ops(
                "web-1",
                3,
                vec![Op::inc_gcounter("clicks", 1)],
            )],
        )
        .await
        .expect("ingest a new event");
    assert_eq!(
        (new.applied, new.duplicates),
        (1, 0),
        "web-1/3 is in the gap of the marks 1, 2, 5: new"
    );
    node.apply_batch(vec![
        Op::inc_gcounter("hits", 3),
        Op::dec_pncounter("balance", 2),
        Op::add("tags", "blue"),
        Op::remove("tags", 42),
        Op::set_lww("config", serde_json::json!({"mode": "fast"})),
        Op::set_mvreg("owner", "carol"),
    ])
    .await
    .expect("new writes");
    let after = updated_values();
    assert_values(&node, &after, "after the new writes");
    node.shutdown().await.expect("shutdown");

    // Reopened: everything, old and new, is there.
    let node = open(&dir).await;
    assert_eq!(node.replica_id(), A);
    let mut ctx = expected_context();
    ctx.insert_range(A, A_DOTS + 1, A_DOTS + 7);
    assert_eq!(node.context().expect("context"), ctx, "7 new dots of A");
    assert_values(&node, &after, "reopened");
    assert_marks(&node, "reopened").await;
    let again = node
        .ingest(
            STREAM,
            vec![Event::with_ops(
                "web-1",
                3,
                vec![Op::inc_gcounter("clicks", 1)],
            )],
        )
        .await
        .expect("ingest web-1/3 again");
    assert_eq!((again.applied, again.duplicates), (0, 1));
    node.shutdown().await.expect("shutdown");

    // The store's invariants over old rows and new writes together. (If the engine ever keeps
    // committed writes outside the redb file, opening the store must recover them, as the
    // node's open does.)
    let store = RedbStore::open(&dir, OpenOptions::default()).expect("open the store");
    assert_eq!(store.ctx(), &ctx);
    store.verify().expect("the upgraded store verifies");
}

/// The fixture's values after the new writes of the test.
fn updated_values() -> Vec<(Key, Value)> {
    expected_values()
        .into_iter()
        .map(|(k, v)| {
            let v = match k.name.as_str() {
                "clicks" => Value::GCounter(4),
                "hits" => Value::GCounter(20),
                "balance" => Value::PNCounter(-10),
                "tags" => Value::ORSet(texts(&["\"blue\"", "\"red\"", "true"])),
                "config" => Value::Lww(Some("{\"mode\":\"fast\"}".to_owned())),
                "owner" => Value::MvReg(texts(&["\"carol\""])),
                _ => v,
            };
            (k, v)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format5_snapshot_verifies_and_restores_with_every_value() {
    let snapshot = Path::new(FIXTURES).join(SNAPSHOT_FILE);
    let tmp = tempfile::tempdir().expect("tempdir");
    // A copy: redb opens even a file it only verifies for writing, and the committed file must
    // stay as the earlier build wrote it.
    let copy = tmp.path().join(SNAPSHOT_FILE);
    std::fs::copy(&snapshot, &copy).expect("copy the snapshot fixture");
    let info = verify_snapshot(&copy, &Limits::default()).expect("the snapshot verifies");
    assert_eq!(info.source_replica, A);
    assert_eq!(info.context, expected_context());

    let dir = tmp.path().join("restored");
    assert_eq!(Node::restore(&copy, &dir).expect("restore"), info);
    let node = open(&dir).await;
    assert_ne!(node.replica_id(), A, "a restore takes a new replica id");
    assert_ne!(node.replica_id(), B);
    // A snapshot of an earlier version records no joining role: the copy runs as configured.
    assert!(!node.is_joining(), "an old snapshot restores as configured");
    assert_eq!(node.context().expect("context"), expected_context());
    assert_values(&node, &expected_values(), "restored");
    assert_marks(&node, "restored").await;
    node.shutdown().await.expect("shutdown");
    let store = RedbStore::open(&dir, OpenOptions::default()).expect("open the store");
    store.verify().expect("the restored store verifies");
}

/// A fixed HLC time of the frames' LWW write (2026-11-29T10:00:00Z).
const FRAME_MS: u64 = 1_795_946_400_000;

/// The state the recorded `Delta` and `Chunk` frames carry, and its dedup marks.
fn frame_state() -> (Store, DedupMarks) {
    let mut store = Store::new();
    let writes = [
        (A, key(KeyKind::GCounter, "hits"), Mutation::Inc(7)),
        (A, key(KeyKind::PNCounter, "balance"), Mutation::Dec(2)),
        (
            A,
            key(KeyKind::ORSet, "tags"),
            Mutation::Add("\"red\"".into()),
        ),
        (A, key(KeyKind::ORSet, "tags"), Mutation::Add("42".into())),
        (
            A,
            key(KeyKind::Lww, "config"),
            Mutation::Set("{\"mode\":\"safe\"}".into()),
        ),
        (
            B,
            key(KeyKind::MvReg, "owner"),
            Mutation::Set("\"bob\"".into()),
        ),
    ];
    for (replica, k, m) in writes {
        let ts = (k.kind == KeyKind::Lww).then_some(Timestamp {
            physical_ms: FRAME_MS,
            logical: 0,
            replica,
        });
        store.mutate(replica, &k, &m, ts).expect("frame write");
    }
    let mut marks = DedupMarks::new();
    for seq in [1, 2, 5] {
        marks.insert(STREAM, "web-1", seq);
    }
    (store, marks)
}

/// The recorded frames: file name and message.
fn frames() -> Vec<(&'static str, Message)> {
    let (store, marks) = frame_state();
    vec![
        (
            "hello.bin",
            Message::Hello {
                replica: A,
                epoch: 3,
                resume: Some((B, 4)),
            },
        ),
        (
            "have.bin",
            Message::Have {
                replica: A,
                ctx: store.context().clone(),
            },
        ),
        (
            "delta.bin",
            Message::Delta {
                epoch: 3,
                log: A,
                from: 1,
                end: 7,
                delta: Delta {
                    state: store.to_delta(),
                    marks: marks.clone(),
                },
            },
        ),
        (
            "ack.bin",
            Message::Ack {
                epoch: 2,
                log: B,
                upto: 4,
            },
        ),
        (
            "chunk.bin",
            Message::Chunk {
                epoch: 3,
                log: A,
                transfer: 1,
                index: 0,
                end: 7,
                chunk: StateChunk {
                    after: None,
                    upto: None,
                    entries: store
                        .entries()
                        .iter()
                        .map(|(k, e)| (k.clone(), e.clone()))
                        .collect(),
                    ctx: store.context().clone(),
                    marks,
                    last: true,
                    dots: None,
                },
            },
        ),
        (
            "chunk_ack.bin",
            Message::ChunkAck {
                epoch: 3,
                transfer: 1,
                index: 0,
            },
        ),
        (
            "chunk_nack.bin",
            Message::ChunkNack {
                epoch: 3,
                transfer: 2,
            },
        ),
        (
            "covered.bin",
            Message::Covered {
                epoch: 3,
                log: A,
                end: 7,
            },
        ),
    ]
}

/// The frames' state: A's dots 1..=5, B's dot 1.
fn frame_context() -> CausalContext {
    let mut ctx = CausalContext::from_range(A, 1, 5);
    ctx.insert_range(B, 1, 1);
    ctx
}

/// The values of the frames' state, written down.
fn frame_values() -> Vec<(Key, Value)> {
    vec![
        (key(KeyKind::GCounter, "hits"), Value::GCounter(7)),
        (key(KeyKind::PNCounter, "balance"), Value::PNCounter(-2)),
        (
            key(KeyKind::ORSet, "tags"),
            Value::ORSet(texts(&["\"red\"", "42"])),
        ),
        (
            key(KeyKind::Lww, "config"),
            Value::Lww(Some("{\"mode\":\"safe\"}".to_owned())),
        ),
        (
            key(KeyKind::MvReg, "owner"),
            Value::MvReg(texts(&["\"bob\""])),
        ),
    ]
}

/// The frames' dedup marks hold `web-1` 1, 2 and 5 of [`STREAM`], nothing else.
fn assert_frame_marks(marks: &DedupMarks, what: &str) {
    for seq in 0..8 {
        assert_eq!(
            marks.contains(STREAM, "web-1", seq),
            [1, 2, 5].contains(&seq),
            "{what}: mark web-1/{seq}"
        );
    }
    assert_eq!(marks.iter().count(), 1, "{what}: one (stream, source)");
}

#[test]
fn format5_frames_decode_to_their_content_and_reencode_to_the_same_bytes() {
    let limit = Limits::default().frame_bytes_max;
    for (file, _) in frames() {
        let path = Path::new(FIXTURES).join("frames").join(file);
        let bytes = std::fs::read(&path).expect("read a recorded frame");
        let message: Message =
            codec::decode("protocol frame", &bytes, limit).expect("the frame decodes");
        // The codec is canonical: one value, one encoding.
        assert_eq!(
            codec::encode("protocol frame", &message).expect("encode"),
            bytes,
            "{file}: re-encoded"
        );
        match (file, message) {
            (
                "hello.bin",
                Message::Hello {
                    replica,
                    epoch,
                    resume,
                },
            ) => {
                assert_eq!((replica, epoch, resume), (A, 3, Some((B, 4))));
            }
            ("have.bin", Message::Have { replica, ctx }) => {
                assert_eq!((replica, ctx), (A, frame_context()));
            }
            (
                "delta.bin",
                Message::Delta {
                    epoch,
                    log,
                    from,
                    end,
                    delta,
                },
            ) => {
                assert_eq!((epoch, log, from, end), (3, A, 1, 7));
                assert_eq!(delta.context(), &frame_context());
                let mut joined = Store::new();
                joined.apply(delta.state);
                assert_eq!(joined.context(), &frame_context());
                for (k, v) in frame_values() {
                    assert_eq!(joined.get(&k), v, "delta: {k:?}");
                }
                assert_eq!(joined.entries().len(), frame_values().len());
                assert_frame_marks(&delta.marks, "delta");
            }
            ("ack.bin", Message::Ack { epoch, log, upto }) => {
                assert_eq!((epoch, log, upto), (2, B, 4));
            }
            (
                "chunk.bin",
                Message::Chunk {
                    epoch,
                    log,
                    transfer,
                    index,
                    end,
                    chunk,
                },
            ) => {
                assert_eq!((epoch, log, transfer, index, end), (3, A, 1, 0, 7));
                assert_eq!((chunk.after, chunk.upto, chunk.last), (None, None, true));
                assert_eq!(chunk.dots, None);
                assert_eq!(chunk.ctx, frame_context());
                let values: Vec<(Key, Value)> = chunk
                    .entries
                    .iter()
                    .map(|(k, e)| (k.clone(), e.value()))
                    .collect();
                assert_eq!(values, frame_values());
                assert_frame_marks(&chunk.marks, "chunk");
            }
            (
                "chunk_ack.bin",
                Message::ChunkAck {
                    epoch,
                    transfer,
                    index,
                },
            ) => {
                assert_eq!((epoch, transfer, index), (3, 1, 0));
            }
            ("chunk_nack.bin", Message::ChunkNack { epoch, transfer }) => {
                assert_eq!((epoch, transfer), (3, 2));
            }
            ("covered.bin", Message::Covered { epoch, log, end }) => {
                assert_eq!((epoch, log, end), (3, A, 7));
            }
            (file, other) => panic!("{file} decoded to another message: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The writer (run by scripts/make-fixtures.sh).
// ---------------------------------------------------------------------------------------------

/// Creates the store in `dir` under `replica`, so a node opened on it afterwards has that id.
fn create_store(dir: &Path, replica: ReplicaId) {
    let options = OpenOptions {
        new_replica_id: Some(replica),
        ..OpenOptions::default()
    };
    drop(RedbStore::open(dir, options).expect("create the store"));
}

/// Waits until `a` and `b` hold the same context and values.
async fn converge(a: &Node, b: &Node) {
    let started = Instant::now();
    loop {
        if a.context().expect("ctx") == b.context().expect("ctx") && listed(a) == listed(b) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no convergence within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes the format 5 fixtures into `$TIDEMARK_WRITE_FIXTURES` (a directory that must be
/// absent or empty): `data/` (node `A`'s data directory, closed cleanly), `snapshot.tmsnap`
/// (its snapshot) and `frames/*.bin`. Run by `scripts/make-fixtures.sh`; without the variable
/// it writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the upgrade fixtures: run by scripts/make-fixtures.sh"]
async fn write_format5_fixtures() {
    let Some(out) = std::env::var_os(WRITE_ENV).map(PathBuf::from) else {
        eprintln!("{WRITE_ENV} is not set: nothing written (see scripts/make-fixtures.sh)");
        return;
    };
    let is_empty =
        |p: &Path| std::fs::read_dir(p).map_or(true, |mut entries| entries.next().is_none());
    assert!(is_empty(&out), "{} must be empty", out.display());
    let data = out.join("data");
    let peer = tempfile::tempdir().expect("tempdir");
    create_store(&data, A);
    create_store(peer.path(), B);
    let a = open(&data).await;
    let b = open(peer.path()).await;
    assert_eq!((a.replica_id(), b.replica_id()), (A, B));

    // A: one dot per op applied.
    a.apply_batch(vec![
        Op::inc_gcounter("hits", 5),
        Op::inc_gcounter("hits", 2),
        Op::inc_pncounter("balance", 3),
        Op::dec_pncounter("balance", 10),
        Op::inc_pncounter("stock", 4),
        Op::add("tags", "red"),
        Op::add("tags", "green"),
        Op::add("tags", 42),
        Op::add("tags", true),
        Op::set_lww("config", serde_json::json!({"mode": "fast", "level": 2})),
        Op::set_mvreg("owner", "alice"),
        Op::set_mvreg("note", "draft"),
    ])
    .await
    .expect("first batch");
    for op in [
        Op::remove("tags", "green"),
        Op::set_lww("config", serde_json::json!({"mode": "safe", "level": 3})),
        Op::set_mvreg("note", "final"),
        Op::set_lww("temp", 1),
        Op::delete(KeyKind::Lww, "temp"),
        Op::add("gone", "x"),
        Op::delete(KeyKind::ORSet, "gone"),
    ] {
        a.apply(op).await.expect("single op");
    }
    let job = a.apply(fixture_job()).await.expect("job");
    assert_eq!((job.applied, job.duplicates), (1, 0));
    let job = a.apply(fixture_job()).await.expect("job again");
    assert_eq!((job.applied, job.duplicates), (0, 1));
    let first = a.ingest(STREAM, fixture_events()).await.expect("ingest");
    assert_eq!((first.applied, first.duplicates), (5, 0));
    let again = a
        .ingest(STREAM, fixture_events()[..3].to_vec())
        .await
        .expect("ingest again");
    assert_eq!((again.applied, again.duplicates), (0, 3));

    // B, concurrently (not connected yet): a second MV value and counter contributions.
    b.apply_batch(vec![
        Op::set_mvreg("owner", "bob"),
        Op::inc_gcounter("hits", 10),
        Op::dec_pncounter("balance", 1),
    ])
    .await
    .expect("peer batch");

    a.connect(&b).expect("connect");
    converge(&a, &b).await;
    a.disconnect(&b).expect("disconnect");
    b.shutdown().await.expect("peer shutdown");
    assert_eq!(a.context().expect("ctx"), expected_context());
    assert_values(&a, &expected_values(), "writer");

    let info = a.snapshot(out.join(SNAPSHOT_FILE)).await.expect("snapshot");
    assert_eq!(info.context, expected_context());
    a.shutdown().await.expect("shutdown");

    let frames_dir = out.join("frames");
    std::fs::create_dir_all(&frames_dir).expect("frames dir");
    for (file, message) in frames() {
        let bytes = codec::encode("protocol frame", &message).expect("encode");
        std::fs::write(frames_dir.join(file), bytes).expect("write a frame");
    }
}
