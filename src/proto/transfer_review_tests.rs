//! Tests from the hostile review of the pinned transfer snapshots
//! (`StateStore::pin_transfer_snapshot`) and of the chunks read from them one at a time: a
//! stalled transfer gives its snapshot up, a large row is read once per transfer whatever is
//! written or sent to other peers between its parts, each transfer sends its own start, and a
//! pinned snapshot's cost on disk ends with it. The harness is `proto::tests`'s (two or three
//! replicas over the production store on redb's in-memory backend, messages moved by hand).

use super::tests::{Node, TestStore, WALL, config, run};
use crate::limits::Limits;
use crate::model::Delta;
use crate::proto::{ChunkRead, Message, PeerId, ReplicaConfig, StateStore};
use crate::store::{LocalWrite, OpenOptions, RedbStore};
use tidemark_crdts::{Key, KeyKind, Mutation, ReplicaId};

fn write_group(ops: &[(Key, Mutation)]) -> LocalWrite {
    LocalWrite {
        ops: ops.to_vec(),
        event: None,
        stamps: Vec::new(),
        late: None,
        own_dots: false,
    }
}

fn big_set(store: &mut TestStore, key: &Key, n: usize) {
    let adds: Vec<(Key, Mutation)> = (0..n)
        .map(|i| (key.clone(), Mutation::Add(format!("\"element-{i:06}\""))))
        .collect();
    store.apply_local(&adds, WALL).expect("store");
}

// ---- Finding: a transfer that never progresses pins its snapshot forever -------------------

/// A receiver that stays in touch (its own writes go out as deltas and are acknowledged, so it
/// is heard and never evicted) but never acknowledges a chunk (a frame limit below the
/// sender's message target, a middlebox dropping large frames, a hostile peer): the sender
/// retransmits the first chunk forever, and the snapshot pinned for it is never released,
/// however long it lasts and whatever the sender writes meanwhile (redb cannot reuse any page
/// freed after the snapshot: the file grows with every rewrite). Expected: a transfer that
/// makes no progress for a bounded time (here 10 x `peer_evict_after_ms`) gives up its
/// snapshot (and restarts later from a new one).
#[test]
fn a_transfer_that_never_progresses_does_not_pin_its_snapshot_forever() {
    let cfg = ReplicaConfig {
        message_bytes_target: 600,
        ..config()
    };
    let mut a = Node::new(0, &[1], cfg.clone());
    let mut b = Node::new(1, &[0], cfg);
    for i in 0..40 {
        a.write(0, &format!("key{i:03}"), &format!("value{i}"));
    }
    a.up(0, 1);
    b.up(0, 0);
    let mut t = 0;
    let mut dropped_chunks = 0u64;
    let mut pinned_since: Option<u64> = None;
    let mut longest_pin = 0u64;
    while t < 120_000 {
        t += 10;
        for tx in a.out() {
            if matches!(tx.msg, Message::Chunk { .. }) {
                dropped_chunks += 1;
                continue;
            }
            b.recv(t, a.id, tx.msg);
        }
        for tx in b.out() {
            a.recv(t, b.id, tx.msg);
        }
        if t % 1_000 == 0 {
            // The sender keeps overwriting its rows; the receiver keeps writing too (and so
            // keeps being heard).
            a.write(t, &format!("key{:03}", (t / 1_000) % 40), &format!("v{t}"));
            b.write(t, &format!("b{:03}", (t / 1_000) % 40), &format!("v{t}"));
        }
        a.tick(t);
        b.tick(t);
        if a.store.transfer_snapshots_pinned() > 0 {
            let since = *pinned_since.get_or_insert(t);
            longest_pin = longest_pin.max(t - since);
        } else {
            pinned_since = None;
        }
    }
    eprintln!(
        "chunks dropped: {dropped_chunks}, snapshot pinned continuously for {longest_pin} ms, \
         pinned now: {}",
        a.store.transfer_snapshots_pinned()
    );
    assert!(dropped_chunks > 50, "the transfer kept retransmitting");
    assert!(
        longest_pin <= 50_000,
        "a transfer with no acknowledged chunk pinned its snapshot for {longest_pin} ms \
         (peer_evict_after_ms = 5000): never released while the receiver is heard"
    );
}

// ---- Finding: two transfers sending large rows re-read the whole row for every part --------

/// Reads a row too large for one message in parts from the snapshot pinned for `peer`, as
/// `read_piece` does: the first part with no resume, then `resume = (key, upto)`. Returns
/// whether the row's last part was read.
fn next_part(
    store: &mut TestStore,
    peer: PeerId,
    resume: &mut Option<(Key, tidemark_crdts::Dot)>,
    target: usize,
) -> bool {
    let read: ChunkRead = store
        .read_chunk_from(Some(peer), None, resume.as_ref(), target)
        .expect("read a part");
    let part = read.part.expect("a row in parts");
    match part.slice.upto {
        Some(d) => {
            *resume = Some((part.key, d));
            false
        }
        None => true,
    }
}

/// Two transfers under way at once (two nodes bootstrapped together, a restore seen by two
/// peers) that both reach a set too large for one message: their parts alternate (one chunk
/// per peer per round trip), and `big_row` is ONE slot tagged with the peer, so every part of
/// either transfer misses the cache and re-reads and re-sorts the whole row (every element row
/// of a per-element set) for a slice of a few dozen dots: quadratic in the row's size. Before
/// the commit each transfer read its row once (all parts at its start). Expected: sending the
/// same row to two peers with alternating parts costs about twice one transfer, not a
/// multiple of the number of parts.
#[test]
fn alternating_parts_of_two_transfers_do_not_reread_the_large_row_each_time() {
    let key = Key::new(KeyKind::ORSet, "big");
    let mut store = TestStore::new(ReplicaId(7), Limits::default());
    big_set(&mut store, &key, 4_000);
    let target = 600;
    let (pa, pb) = (PeerId(1), PeerId(2));

    // Two transfers, parts alternating.
    store.pin_transfer_snapshot(pa).expect("pin");
    store.pin_transfer_snapshot(pb).expect("pin");
    let reads = store.stats().big_row_reads;
    let (mut ra, mut rb, mut da, mut db, mut parts) = (None, None, false, false, 0u32);
    while !(da && db) {
        if !da {
            da = next_part(&mut store, pa, &mut ra, target);
            parts += 1;
        }
        if !db {
            db = next_part(&mut store, pb, &mut rb, target);
        }
    }
    assert!(parts > 50, "a row in many parts: {parts}");
    assert_eq!(
        store.stats().big_row_reads - reads,
        2,
        "two transfers with alternating parts ({parts} parts each) read the row once each"
    );
}

/// The same with ONE transfer: any write transaction between two parts (a local commit of an
/// unrelated key, a remote join: every `RedbStore::begin`) drops `big_row`, although a row
/// read from a pinned snapshot cannot change; the next part re-reads and re-sorts the whole
/// row. A sender under steady writes (one per chunk round trip is enough) re-reads a large
/// set for every part: quadratic, on the store's single writer. Expected: a write between
/// parts costs about the write, not a re-read of the row.
#[test]
fn writes_between_parts_do_not_make_a_snapshot_transfer_reread_the_large_row() {
    let key = Key::new(KeyKind::ORSet, "big");
    let other = Key::new(KeyKind::MvReg, "other");
    let mut store = TestStore::new(ReplicaId(8), Limits::default());
    big_set(&mut store, &key, 4_000);
    let target = 600;
    let pa = PeerId(1);
    let write = |store: &mut TestStore, i: u32| {
        store
            .apply_local(&[(other.clone(), Mutation::Set(format!("\"{i}\"")))], WALL)
            .expect("write");
    };

    // The parts with one write between each two.
    store.pin_transfer_snapshot(pa).expect("pin");
    let reads = store.stats().big_row_reads;
    let (mut r, mut i) = (None, 0u32);
    while !next_part(&mut store, pa, &mut r, target) {
        write(&mut store, i);
        i += 1;
    }
    assert!(i > 50, "a row in many parts: {i}");
    assert_eq!(
        store.stats().big_row_reads - reads,
        1,
        "a write between each two of {i} parts: the row read from the snapshot is read once"
    );
}

// ---- Checked sound ------------------------------------------------------------------------

/// Two transfers to two peers started at different moments (writes in between, including
/// inside a row sent in parts), parts alternating: each receiver ends with exactly the state
/// its own transfer started from (no chunk of one reflects the other's snapshot or the current
/// state), and both snapshots are released.
#[test]
fn two_transfers_from_two_snapshots_each_send_their_own_start() {
    let cfg = ReplicaConfig {
        message_bytes_target: 600,
        ..config()
    };
    let mut a = Node::new(0, &[1, 2], cfg.clone());
    let mut b = Node::new(1, &[0], cfg.clone());
    let mut c = Node::new(2, &[0], cfg);
    let set = Key::new(KeyKind::ORSet, "big");
    big_set(&mut a.store, &set, 150);
    for i in 0..20 {
        a.write(0, &format!("key{i:03}"), &format!("before{i}"));
    }
    let mut starts: std::collections::BTreeMap<PeerId, Vec<Delta>> = Default::default();
    // The state each transfer started from: taken right after the call that started it
    // (`TransferStarted`), before anything else is written.
    let note = |a: &mut Node, starts: &mut std::collections::BTreeMap<PeerId, Vec<Delta>>| {
        let started: Vec<PeerId> = std::iter::from_fn(|| a.replica.poll_event())
            .filter_map(|e| match e {
                crate::proto::ReplicaEvent::TransferStarted { to, .. } => Some(to),
                _ => None,
            })
            .collect();
        for to in started {
            let s = a.store.state();
            starts.entry(to).or_default().push(s);
        }
    };
    a.up(0, 1);
    note(&mut a, &mut starts);
    b.up(0, 0);
    // B's transfer starts now; C's only after a first round of writes.
    let (mut t, mut done_b, mut done_c, mut c_up) = (0, false, false, false);
    let mut round = 0;
    while !(done_b && done_c) && t < 120_000 {
        t += 10;
        for tx in a.out() {
            let last = matches!(&tx.msg, Message::Chunk { chunk, .. } if chunk.last);
            match (&tx.msg, tx.to) {
                (Message::Delta { .. }, _) => {}
                (_, PeerId(1)) => {
                    done_b |= last;
                    b.recv(t, a.id, tx.msg);
                }
                (_, PeerId(2)) => {
                    done_c |= last;
                    c.recv(t, a.id, tx.msg);
                }
                _ => {}
            }
        }
        for tx in b.out() {
            a.recv(t, b.id, tx.msg);
            note(&mut a, &mut starts);
        }
        for tx in c.out() {
            a.recv(t, c.id, tx.msg);
            note(&mut a, &mut starts);
        }
        if t % 50 == 0 && round < 6 {
            round += 1;
            let ops: Vec<(Key, Mutation)> = (0..150)
                .step_by(7)
                .map(|i| (set.clone(), Mutation::Remove(format!("\"element-{i:06}\""))))
                .chain((0..20).map(|i| {
                    (set.clone(), Mutation::Add(format!("\"r{round}-{i:03}\"")))
                }))
                .collect();
            a.store.apply_local(&ops, WALL + t).expect("store");
            a.write(t, &format!("key{:03}", round), &format!("after{round}"));
            if round == 2 && !c_up {
                c_up = true;
                a.up(t, 2);
                note(&mut a, &mut starts);
                c.up(t, 0);
            }
        }
        a.tick(t);
        note(&mut a, &mut starts);
        b.tick(t);
        c.tick(t);
    }
    assert!(done_b && done_c, "both transfers completed");
    let (sb, sc) = (&starts[&b.id], &starts[&c.id]);
    eprintln!("transfers started: to B {}, to C {}", sb.len(), sc.len());
    assert_ne!(sb.last(), sc.last(), "the two transfers started from different states");
    assert_eq!(Some(&b.store.state()), sb.last(), "B holds the state of its transfer's start");
    assert_eq!(Some(&c.store.state()), sc.last(), "C holds the state of its transfer's start");
    run(&mut [&mut a, &mut b, &mut c], t, t + 3_000);
    assert_eq!(a.store.transfer_snapshots_pinned(), 0);
}

/// The store drops its snapshots on its own mid-transfer (`check_integrity`): the next chunk
/// restarts the transfer from a new snapshot (no fatal "no transfer snapshot is pinned"), and
/// the receiver converges.
#[test]
fn a_snapshot_dropped_mid_transfer_restarts_the_transfer() {
    let cfg = ReplicaConfig {
        message_bytes_target: 600,
        ..config()
    };
    let mut a = Node::new(0, &[1], cfg.clone());
    let mut b = Node::new(1, &[0], cfg);
    let set = Key::new(KeyKind::ORSet, "big");
    big_set(&mut a.store, &set, 150);
    for i in 0..30 {
        a.write(0, &format!("key{i:03}"), &format!("v{i}"));
    }
    a.up(0, 1);
    b.up(0, 0);
    let (mut t, mut chunks, mut dropped) = (0, 0, 0);
    while t < 30_000 {
        t += 10;
        for tx in a.out() {
            if matches!(tx.msg, Message::Chunk { .. }) {
                chunks += 1;
            }
            b.recv(t, a.id, tx.msg);
        }
        if chunks >= 3 && dropped < 2 && a.store.transfer_snapshots_pinned() > 0 {
            dropped += 1;
            chunks = 0;
            assert!(a.store.check_integrity().expect("integrity"));
            a.write(t, "during", &format!("{t}"));
        }
        for tx in b.out() {
            a.recv(t, b.id, tx.msg);
        }
        a.tick(t);
        b.tick(t);
    }
    assert_eq!(dropped, 2);
    assert_eq!(a.store.state(), b.store.state());
    assert_eq!(a.store.transfer_snapshots_pinned(), 0);
}

/// A transfer snapshot pinned when the store is closed (the node stops mid-transfer): the
/// `Database` field drops before the read transactions (declaration order), and redb's close
/// commit runs with them live. The store reopens with everything, is sound, and the pages
/// the snapshot held are reused afterwards (the file does not keep growing).
#[test]
fn closing_with_a_pinned_snapshot_reopens_sound_and_reuses_the_pages() {
    let dir = std::env::temp_dir().join(format!(
        "tidemark-review-close-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let options = || OpenOptions {
        new_replica_id: Some(ReplicaId(5)),
        ..OpenOptions::default()
    };
    let file = dir.join(crate::store::DB_FILE);
    let value = "x".repeat(2_000);
    let overwrite = |store: &mut RedbStore, round: usize| {
        let ops: Vec<(Key, Mutation)> = (0..200)
            .map(|i| {
                (
                    Key::new(KeyKind::MvReg, format!("k{i:04}")),
                    Mutation::Set(format!("\"{value}{round}\"")),
                )
            })
            .collect();
        store
            .commit_local(&[write_group(&ops)], WALL + round as u64)
            .expect("write");
        // The log is compacted as the host would (it is not what this test measures).
        let (_, end) = store.log_bounds();
        store.truncate_log(end).expect("compact");
        store.checkpoint().expect("checkpoint");
    };
    let expected;
    {
        let mut store = RedbStore::open(&dir, options()).expect("open");
        overwrite(&mut store, 0);
        store.pin_transfer_snapshot(PeerId(1)).expect("pin");
        for round in 1..20 {
            overwrite(&mut store, round);
        }
        let mut s = TestStore(store);
        expected = s.state();
        // Dropped with the snapshot pinned.
    }
    let pinned_size = std::fs::metadata(&file).expect("file").len();
    let mut store = RedbStore::open(&dir, options()).expect("reopen");
    assert!(store.check_integrity().expect("integrity"));
    let mut s = TestStore(store);
    assert_eq!(s.state(), expected);
    for round in 20..60 {
        overwrite(&mut s, round);
    }
    let later = std::fs::metadata(&file).expect("file").len();
    eprintln!("file after the pinned run: {pinned_size}; after 40 more rounds: {later}");
    assert!(
        later <= pinned_size + pinned_size / 2,
        "the pages the snapshot held were not reused: {pinned_size} -> {later}"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a pinned snapshot costs on disk, and that the cost ends with it: 200 rows of 2 KB
/// rewritten 30 times grow the file while a snapshot holds the pages of its moment; once it is
/// released, 30 more rounds reuse the freed pages instead of growing the file again.
#[test]
fn a_pinned_snapshot_grows_the_file_only_while_it_is_pinned() {
    let dir = std::env::temp_dir().join(format!(
        "tidemark-review-growth-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let options = OpenOptions {
        new_replica_id: Some(ReplicaId(6)),
        ..OpenOptions::default()
    };
    let file = dir.join(crate::store::DB_FILE);
    let mut store = RedbStore::open(&dir, options).expect("open");
    let value = "y".repeat(2_000);
    let write = |store: &mut RedbStore, round: usize| {
        let ops: Vec<(Key, Mutation)> = (0..200)
            .map(|i| {
                (
                    Key::new(KeyKind::MvReg, format!("k{i:04}")),
                    Mutation::Set(format!("\"{value}{round}\"")),
                )
            })
            .collect();
        store
            .commit_local(&[write_group(&ops)], WALL + round as u64)
            .expect("write");
        let (_, end) = store.log_bounds();
        store.truncate_log(end).expect("compact");
        store.checkpoint().expect("checkpoint");
    };
    write(&mut store, 0);
    let before = std::fs::metadata(&file).expect("file").len();
    store.pin_transfer_snapshot(PeerId(1)).expect("pin");
    for round in 1..30 {
        write(&mut store, round);
    }
    let pinned = std::fs::metadata(&file).expect("file").len();
    store.release_transfer_snapshots(&|_| false);
    for round in 30..60 {
        write(&mut store, round);
    }
    let released = std::fs::metadata(&file).expect("file").len();
    eprintln!("file: {before} before, {pinned} after 29 rounds pinned, {released} after 30 more");
    assert!(
        pinned > before * 4,
        "a pinned snapshot keeps the pages of its moment: {before} -> {pinned}"
    );
    assert!(
        released <= pinned + pinned / 4,
        "once released its pages are reused: {pinned} -> {released}"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
