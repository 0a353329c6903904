//! The write-ahead log against crashes: a store keeps committing while its data directory is
//! copied after every step — a copy of a live directory is what a `kill -9` leaves (the page
//! cache keeps every write, redb's commits not yet durable exist only in the process). Each
//! copy must reopen to exactly the state the acknowledged steps made, table by table and byte
//! by byte; a copy whose log is cut inside the last record reopens to the state before it.

use super::late::{LateMark, LateNote};
use super::tables::{
    DEDUP, DOTS, ELEMS, LATE, LATE_MARKS, LATE_TOTALS, LOG, META, META_EPOCH, META_WAL_COVERED,
    ROWS,
};
use super::test_rng::Rng;
use super::{DB_FILE, EventId, LocalWrite, OpenOptions, RedbStore, WAL_FILE};
use crate::proto::StateStore;
use redb::{ReadableDatabase, ReadableTable};
use std::collections::BTreeMap;
use std::path::Path;
use tidemark_crdts::{Key, KeyKind, Mutation, ReplicaId};

/// Every table's rows as bytes (meta without the fields an open rewrites).
type Dump = BTreeMap<(&'static str, Vec<u8>), Vec<u8>>;

fn dump(store: &RedbStore) -> Dump {
    let rtxn = store.db.begin_read().expect("read");
    let mut out = Dump::new();
    for (name, def) in [
        ("rows", ROWS),
        ("elems", ELEMS),
        ("dots", DOTS),
        ("dedup", DEDUP),
        ("late", LATE),
        ("late_totals", LATE_TOTALS),
        ("late_marks", LATE_MARKS),
    ] {
        let Ok(t) = rtxn.open_table(def) else {
            continue;
        };
        for item in t.iter().expect("iter") {
            let (k, v) = item.expect("row");
            out.insert((name, k.value().to_vec()), v.value().to_vec());
        }
    }
    let log = rtxn.open_table(LOG).expect("log");
    for item in log.iter().expect("iter") {
        let (k, v) = item.expect("row");
        out.insert(("log", k.value().to_be_bytes().to_vec()), v.value().to_vec());
    }
    let meta = rtxn.open_table(META).expect("meta");
    for item in meta.iter().expect("iter") {
        let (k, v) = item.expect("row");
        if [META_EPOCH, META_WAL_COVERED].contains(&k.value()) {
            continue;
        }
        out.insert(("meta", k.value().as_bytes().to_vec()), v.value().to_vec());
    }
    out
}

fn write(rng: &mut Rng, seq: &mut BTreeMap<u64, u64>) -> LocalWrite {
    let hot = rng.below(4);
    let (key, m) = match rng.below(11) {
        8 => (
            Key::new(KeyKind::ORSet, format!("s{hot}")),
            Mutation::Delete,
        ),
        9 => (Key::new(KeyKind::Lww, format!("l{hot}")), Mutation::Delete),
        10 => (
            Key::new(KeyKind::PNCounter, format!("p{hot}")),
            Mutation::Inc(1 + rng.below(5)),
        ),
        0 | 1 => (
            Key::new(KeyKind::GCounter, format!("g{hot}")),
            Mutation::Inc(1 + rng.below(5)),
        ),
        2 => (
            Key::new(KeyKind::PNCounter, format!("p{hot}")),
            Mutation::Dec(1 + rng.below(5)),
        ),
        3 | 4 => (
            Key::new(KeyKind::ORSet, format!("s{hot}")),
            Mutation::Add(format!("\"e{}\"", rng.below(40))),
        ),
        5 => (
            Key::new(KeyKind::ORSet, format!("s{hot}")),
            Mutation::Remove(format!("\"e{}\"", rng.below(40))),
        ),
        6 => (
            Key::new(KeyKind::Lww, format!("l{hot}")),
            Mutation::Set(rng.below(100).to_string()),
        ),
        _ => (
            Key::new(KeyKind::MvReg, format!("m{hot}")),
            Mutation::Set(rng.below(100).to_string()),
        ),
    };
    let source = rng.below(3);
    let next = seq.entry(source).or_insert(0);
    // One in five is a retry of the source's last event (a duplicate).
    if *next == 0 || rng.below(5) != 0 {
        *next += 1;
    }
    let late = (rng.below(10) == 0).then(|| LateNote {
        stream: "s".into(),
        record: format!("{{\"late\":{}}}", rng.below(1000)),
        mark: (rng.below(2) == 0).then(|| LateMark {
            key: format!("cell{hot}"),
            replica: ReplicaId(9),
            seq: rng.below(100),
        }),
    });
    LocalWrite {
        ops: vec![(key, m)],
        event: Some(EventId {
            stream: "s".into(),
            source: format!("src{source}"),
            seq: *next,
        }),
        stamps: Vec::new(),
        late,
        own_dots: false,
    }
}

/// Copies the store's two files to `to` (what a kill -9 leaves), the log cut at `log_len`.
fn crash_copy(from: &Path, to: &Path, log_len: Option<u64>) {
    std::fs::create_dir_all(to).expect("mkdir");
    std::fs::copy(from.join(DB_FILE), to.join(DB_FILE)).expect("copy db");
    std::fs::copy(from.join(WAL_FILE), to.join(WAL_FILE)).expect("copy log");
    if let Some(len) = log_len {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(to.join(WAL_FILE))
            .expect("open log copy");
        f.set_len(len).expect("cut");
    }
}

fn options(durability: crate::Durability) -> OpenOptions {
    OpenOptions {
        new_replica_id: Some(ReplicaId(5)),
        durability,
        ..OpenOptions::default()
    }
}

/// Random groups (counters, sets, registers, retried events, late notes), with checkpoints,
/// compactions, purges and remote joins between them; after each step a crash copy reopens
/// byte-identical to the live store, and a copy with the last record torn reopens to the
/// state before that step.
#[test]
fn every_crash_copy_reopens_to_exactly_the_acknowledged_state() {
    let seed = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x3A1_u64);
    let mut rng = Rng(seed);
    let live = tempfile::tempdir().expect("tempdir");
    let scratch = tempfile::tempdir().expect("tempdir");
    let mut store =
        RedbStore::open(live.path(), options(crate::Durability::Immediate)).expect("open");
    let mut peer = RedbStore::open_with_backend(
        redb::backends::InMemoryBackend::new(),
        OpenOptions {
            new_replica_id: Some(ReplicaId(6)),
            ..OpenOptions::default()
        },
    )
    .expect("peer");
    let mut seqs = BTreeMap::new();
    let mut before = dump(&store);
    let mut replayed_somewhere = false;
    for step in 0..120u64 {
        let wall = 1_000_000 + step;
        let start = store.wal_pending_bytes();
        let mut logged = false;
        match rng.below(12) {
            0 => store.checkpoint().expect("checkpoint"),
            1 => {
                let (_, end) = store.log_bounds();
                store.compact(end.saturating_sub(3)).expect("compact");
            }
            2 => {
                let key = Key::new(KeyKind::GCounter, format!("g{}", rng.below(4)));
                store.purge_rows(&[key]).expect("purge");
            }
            3 => {
                let w = write(&mut rng, &mut BTreeMap::new());
                peer.commit_local(&[w], wall).expect("peer commit");
                let delta = match peer.deltas_since(store.ctx(), 1 << 20).expect("deltas") {
                    super::DeltasSince::Deltas { delta, .. } => delta,
                    super::DeltasSince::NeedsStateTransfer => panic!("peer log is whole"),
                };
                store
                    .apply_remote_delta(crate::proto::PeerId(6), delta, wall)
                    .expect("storage")
                    .expect("valid");
            }
            _ => {
                let n = 1 + rng.below(30) as usize;
                let writes: Vec<LocalWrite> =
                    (0..n).map(|_| write(&mut rng, &mut seqs)).collect();
                store.commit_local(&writes, wall).expect("commit");
                logged = store.wal_pending_bytes() > start;
            }
        }
        let after = dump(&store);
        let copy = scratch.path().join(format!("c{step}"));
        crash_copy(live.path(), &copy, None);
        {
            let reopened = RedbStore::open(&copy, options(crate::Durability::Immediate))
                .expect("the crash copy opens");
            replayed_somewhere |= reopened.wal_scan().replayed > 0;
            assert_eq!(dump(&reopened), after, "step {step}: crash copy differs");
            reopened.verify().expect("invariants hold after replay");
        }
        if logged {
            let end = store.wal_pending_bytes();
            let cut = start + rng.below(end - start);
            let torn = scratch.path().join(format!("t{step}"));
            crash_copy(
                live.path(),
                &torn,
                Some(cut + crate::codec::wal::FILE_HEADER as u64),
            );
            let reopened = RedbStore::open(&torn, options(crate::Durability::Immediate))
                .expect("a torn copy opens");
            assert_eq!(
                dump(&reopened),
                before,
                "step {step}: a log torn at {cut} (record {start}..{end}) must reopen to the state before the record"
            );
            reopened.verify().expect("invariants hold after a torn tail");
        }
        before = after;
        let _ = std::fs::remove_dir_all(&copy);
    }
    assert!(replayed_somewhere, "some crash copy needed the log");
    let final_dump = dump(&store);
    drop(store);
    let reopened = RedbStore::open(live.path(), options(crate::Durability::Immediate)).expect("open");
    assert_eq!(reopened.wal_scan().replayed, 0, "a clean close checkpoints");
    assert_eq!(dump(&reopened), final_dump);
}

/// A store that has written through its log refuses to open without the log file (after a
/// crash it held acknowledged writes), creating nothing; an empty file put back opens it. A
/// data directory from before the log (no log id in its meta) opens and gets a log.
#[test]
fn a_missing_log_is_refused_not_recreated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = || options(crate::Durability::Immediate);
    {
        let mut store = RedbStore::open(dir.path(), opts()).expect("open");
        let mut seqs = BTreeMap::new();
        store
            .commit_local(&[write(&mut Rng(1), &mut seqs)], 1_000)
            .expect("commit");
    }
    std::fs::remove_file(dir.path().join(WAL_FILE)).expect("remove the log");
    let err = RedbStore::open(dir.path(), opts()).expect_err("must refuse");
    assert!(err.to_string().contains("missing"), "{err}");
    assert!(
        !dir.path().join(WAL_FILE).exists(),
        "the refusal must not create the file (the next open would then pass)"
    );
    std::fs::File::create(dir.path().join(WAL_FILE)).expect("an empty log");
    RedbStore::open(dir.path(), opts()).expect("opens with an empty log put back");
}
