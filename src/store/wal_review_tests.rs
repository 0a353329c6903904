//! Hostile review of the write-ahead log (commit 09985b8): damage to `tidemark.wal` that the
//! open did not notice. Each test states what it expects a safe store to do; they failed on
//! 09985b8 (the file header, the look-ahead past a damaged frame, the seq bump over dropped
//! relaxed frames and the restored store's own log id make them pass).

use super::tables::{META, META_WAL_ID};
use super::{DB_FILE, DeltasSince, LocalWrite, OpenOptions, RedbStore, WAL_FILE};
use crate::codec::wal::{FILE_HEADER, FRAME_HEADER};
use crate::proto::PeerId;
use redb::ReadableDatabase;
use std::path::Path;
use tidemark_crdts::{Key, KeyKind, Mutation, ReplicaId};

fn options() -> OpenOptions {
    OpenOptions {
        new_replica_id: Some(ReplicaId(5)),
        durability: crate::Durability::Immediate,
        ..OpenOptions::default()
    }
}

fn relaxed() -> OpenOptions {
    OpenOptions {
        durability: crate::Durability::Relaxed,
        ..options()
    }
}

fn add(elem: &str) -> LocalWrite {
    LocalWrite {
        ops: vec![(
            Key::new(KeyKind::ORSet, "s"),
            Mutation::Add(format!("\"{elem}\"")),
        )],
        event: None,
        stamps: Vec::new(),
        late: None,
        own_dots: false,
    }
}

fn inc(by: u64) -> LocalWrite {
    LocalWrite {
        ops: vec![(Key::new(KeyKind::GCounter, "g"), Mutation::Inc(by))],
        event: None,
        stamps: Vec::new(),
        late: None,
        own_dots: false,
    }
}

/// What a kill -9 leaves: both files as they are on disk (page cache included).
fn crash_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    std::fs::copy(from.join(DB_FILE), to.join(DB_FILE)).expect("copy db");
    std::fs::copy(from.join(WAL_FILE), to.join(WAL_FILE)).expect("copy log");
}

fn ship(from: &RedbStore, to: &mut RedbStore, wall: u64) {
    let delta = match from.deltas_since(to.ctx(), 1 << 20).expect("deltas") {
        DeltasSince::Deltas { delta, .. } => delta,
        DeltasSince::NeedsStateTransfer => panic!("log is whole"),
    };
    to.apply_remote_delta(PeerId(5), delta, wall)
        .expect("storage")
        .expect("valid");
}

/// A node acknowledges two writes (each fsynced in its log), a peer receives them (Immediate
/// durability serves them at once), the node is killed, and its log is then lost or damaged
/// in one of the ways an operator or a disk can: deleted, zeroed, replaced with garbage, or one
/// byte of its FIRST record flipped (a later record is intact: this is not a torn tail).
///
/// Expected of a safe store: the reopen either keeps the acknowledged writes, or refuses to
/// open, or at least continues under a new replica id — never reopens under the same replica
/// id with a context behind what its peer holds (it then reissues those dots with other
/// content: divergence). On 09985b8 every variant reopens silently under the same id, behind.
#[test]
fn a_lost_or_damaged_log_is_not_silently_accepted_behind_a_peer() {
    let mut failures = Vec::new();
    for variant in ["deleted", "zeroed", "garbage", "first-record-bitflip"] {
        let live = tempfile::tempdir().expect("tempdir");
        let scratch = tempfile::tempdir().expect("tempdir");
        let mut a = RedbStore::open(live.path(), options()).expect("open");
        let me = a.replica();
        let mut peer = RedbStore::open_with_backend(
            redb::backends::InMemoryBackend::new(),
            OpenOptions {
                new_replica_id: Some(ReplicaId(6)),
                ..OpenOptions::default()
            },
        )
        .expect("peer");
        a.commit_local(&[add("x1")], 1_000).expect("ack x1");
        a.commit_local(&[add("x2")], 1_001).expect("ack x2");
        ship(&a, &mut peer, 1_002);
        let held = peer.ctx().max_seq(me);
        assert!(held >= 2, "the peer holds the node's dots");
        let copy = scratch.path().join("crash");
        crash_copy(live.path(), &copy);
        let wal = copy.join(WAL_FILE);
        let len = std::fs::metadata(&wal).expect("log").len();
        match variant {
            "deleted" => std::fs::remove_file(&wal).expect("rm"),
            "zeroed" => std::fs::write(&wal, vec![0u8; len as usize]).expect("zero"),
            "garbage" => std::fs::write(
                &wal,
                (0..len).map(|i| (i * 7 + 13) as u8).collect::<Vec<u8>>(),
            )
            .expect("garbage"),
            _ => {
                let mut bytes = std::fs::read(&wal).expect("read");
                bytes[FILE_HEADER + FRAME_HEADER + 3] ^= 0x01;
                std::fs::write(&wal, bytes).expect("flip");
            }
        }
        match RedbStore::open(&copy, options()) {
            Err(e) => eprintln!("{variant}: refused to open (safe): {e}"),
            Ok(reopened) => {
                let mine = reopened.ctx().max_seq(me);
                let same_id = reopened.replica() == me;
                eprintln!(
                    "{variant}: opened, replica kept: {same_id}, own max seq {mine} (peer holds {held}), scan {:?}",
                    reopened.wal_scan()
                );
                if same_id && mine < held {
                    failures.push(format!(
                        "{variant}: reopened under the same replica id {me} at own seq {mine} < {held} held by a peer (acknowledged writes lost silently; the next writes reissue dots)"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// After a scan stops early at a damaged frame, the frames past it keep this store's id and
/// seqs at or above the new `wal_covered`; the log restarts at offset 0 reusing those seqs, so
/// once the new records line up with the old ones, the scan walks on into the stale frames and
/// replays them over newer state. Here: two increments whose first frame is damaged (a
/// power loss in relaxed durability persisting the second write but not all of the first, or a
/// flipped bit); the reopen rightly drops both; one new increment of the same size is
/// acknowledged; a crash later the store reopened with the stale second increment resurrected
/// on top of it (g = 2 where 1 was ever acknowledged since). In relaxed durability (in
/// immediate durability an intact record after a damaged one refuses the open: see
/// `a_lost_or_damaged_log_is_not_silently_accepted_behind_a_peer`).
#[test]
fn stale_frames_past_a_damaged_one_are_never_replayed_later() {
    let live = tempfile::tempdir().expect("tempdir");
    let scratch = tempfile::tempdir().expect("tempdir");
    let g = Key::new(KeyKind::GCounter, "g");
    let mut a = RedbStore::open(live.path(), relaxed()).expect("open");
    a.commit_local(&[inc(1)], 5_000).expect("g+1");
    let first = a.wal_pending_bytes();
    a.commit_local(&[inc(1)], 5_000).expect("g+1 again");
    let second = a.wal_pending_bytes() - first;
    let c1 = scratch.path().join("c1");
    crash_copy(live.path(), &c1);
    drop(a);
    // Damage the first frame's payload only.
    let wal = c1.join(WAL_FILE);
    let mut bytes = std::fs::read(&wal).expect("read");
    bytes[FILE_HEADER + FRAME_HEADER + 5] ^= 0x40;
    std::fs::write(&wal, bytes).expect("write");
    let c2 = scratch.path().join("c2");
    let after_new = {
        let mut b = RedbStore::open(&c1, relaxed()).expect("reopen");
        assert_eq!(b.wal_scan().replayed, 0, "the damaged first frame ends the log");
        let value = format!("{:?}", b.reader().get(&g).expect("read"));
        eprintln!("after the damaged log: g = {value}");
        b.commit_local(&[inc(1)], 5_000).expect("new g+1");
        let new = b.wal_pending_bytes();
        eprintln!("frame sizes: old {first} and {second}, new {new}");
        assert_eq!(new, first, "precondition: the new record is the size of the old first one");
        let v = format!("{:?}", b.reader().get(&g).expect("read"));
        crash_copy(&c1, &c2);
        std::mem::forget(b); // a kill -9: no clean close
        v
    };
    let c = RedbStore::open(&c2, relaxed()).expect("reopen after the second crash");
    let value = format!("{:?}", c.reader().get(&g).expect("read"));
    eprintln!("acknowledged state {after_new}, reopened state {value}, scan {:?}", c.wal_scan());
    assert_eq!(
        value,
        after_new,
        "the reopen replayed a stale frame of an earlier pass (scan: {:?})",
        c.wal_scan()
    );
}

/// A store restored from a snapshot takes its source's `wal_id` (the snapshot copies `meta`
/// whole), so the log frames of the source and of every store restored from its snapshots
/// carry the same store id: the "another store's frame" check cannot tell them apart.
#[test]
fn a_restored_store_has_a_log_id_of_its_own() {
    let src = tempfile::tempdir().expect("tempdir");
    let out = tempfile::tempdir().expect("tempdir");
    let a = RedbStore::open(src.path(), options()).expect("open");
    let snap = out.path().join("s.tmsnap");
    a.snapshot(&snap, 1).expect("snapshot");
    let restored = out.path().join("restored");
    super::snapshot::restore_snapshot(&snap, &restored, Some(ReplicaId(77)), &a.options.limits)
        .expect("restore");
    let b = RedbStore::open(&restored, OpenOptions::default()).expect("open restored");
    let id = |s: &RedbStore| -> Vec<u8> {
        let r = s.db.begin_read().expect("read");
        let t = r.open_table(META).expect("meta");
        t.get(META_WAL_ID).expect("get").expect("wal id").value().to_vec()
    };
    assert_ne!(id(&a), id(&b), "the restored store reuses its source's write-ahead log id");
}
