//! The receiving side of a state transfer staged on disk (`StateStore::stage_chunk`,
//! `StateStore::apply_staged`): the streamed join gives exactly the state the merged transfer
//! (`merge_chunks` + `apply_chunk`, the former receiver) gives, the receiver holds about one
//! chunk (or one large row) in memory whatever the transfer's size, and a bad or interrupted
//! transfer leaves nothing applied. The harness is `proto::tests`'s.

use super::tests::{Node, TestStore, WALL, config, run};
use super::transfer::{OutTransfer, merge_chunks};
use crate::limits::Limits;
use crate::model::{DotSlice, Rejected, StateChunk};
use crate::proto::{Message, PeerId, ReplicaConfig, StateStore, TransferId};
use crate::store::{EventId, LocalWrite, OpenOptions, RedbStore};
use tidemark_crdts::{Key, KeyKind, Mutation, ReplicaId};

pub(super) const SENDER: PeerId = PeerId(1);
pub(super) const RECEIVER: PeerId = PeerId(2);

pub(super) fn mv(name: &str) -> Key {
    Key::new(KeyKind::MvReg, name)
}

pub(super) fn set(store: &mut TestStore, name: &str, value: &str) {
    store
        .apply_local(&[(mv(name), Mutation::Set(format!("\"{value}\"")))], WALL)
        .expect("store");
}

/// A sender holding plain rows (most of the state), a set too large for one chunk, dedup marks of several
/// sources, and removals of keys it once held (`gone…`). Returns it with the state a receiver
/// got from it before the removals.
fn sender() -> (TestStore, crate::model::Delta) {
    let mut s = TestStore::new(ReplicaId(1001), Limits::default());
    for i in 0..5 {
        set(&mut s, &format!("gone{i}"), "old");
    }
    for i in 0..400 {
        set(&mut s, &format!("k{i:03}"), &format!("first-{i}-{}", "x".repeat(20)));
    }
    let early = s.state();
    for i in 0..5 {
        s.apply_local(&[(mv(&format!("gone{i}")), Mutation::Delete)], WALL)
            .expect("store");
    }
    for i in (0..400).step_by(3) {
        set(&mut s, &format!("k{i:03}"), &format!("second-{i}"));
    }
    let big = Key::new(KeyKind::ORSet, "big");
    let adds: Vec<(Key, Mutation)> = (0..300)
        .map(|i| (big.clone(), Mutation::Add(format!("\"element-{i:05}\""))))
        .collect();
    s.apply_local(&adds, WALL).expect("store");
    s.apply_local(
        &[(big.clone(), Mutation::Remove("\"element-00007\"".into()))],
        WALL,
    )
    .expect("store");
    let counter = Key::new(KeyKind::GCounter, "events");
    for src in 0..12 {
        for seq in 1..=3 {
            let write = LocalWrite {
                ops: vec![(counter.clone(), Mutation::Inc(1))],
                event: Some(EventId {
                    stream: "stream".into(),
                    source: format!("source-{src:03}"),
                    seq,
                }),
                stamps: Vec::new(),
                late: None,
                own_dots: false,
            };
            s.commit_local(&[write], WALL).expect("store");
        }
    }
    (s, early)
}

/// Every chunk of one transfer from `s` to `peer`, read as the replica reads them
/// (`read_piece`): rows from the pinned snapshot, then the marks.
pub(super) fn chunks(s: &mut TestStore, peer: PeerId, target: usize) -> (Vec<StateChunk>, u64) {
    let ctx = s.transfer_context().expect("ctx");
    s.pin_transfer_snapshot(peer).expect("pin");
    let end = s.log_bounds().1;
    let mut out = OutTransfer::new(1, ctx, end, target, 0);
    let mut all = Vec::new();
    loop {
        let rows = if out.pos.rows_done {
            None
        } else {
            Some(
                s.read_chunk_from(
                    Some(peer),
                    out.pos.after.as_ref(),
                    out.pos.resume.as_ref(),
                    target,
                )
                .expect("read rows"),
            )
        };
        let used = rows.as_ref().map_or(0, |r| {
            crate::codec::encoded_len("chunk entries", &r.entries).unwrap_or(target)
        });
        let marks = if rows.as_ref().is_none_or(OutTransfer::rows_finished) {
            Some(
                s.read_marks(
                    Some(peer),
                    out.pos.marks_after.as_ref(),
                    target.saturating_sub(used),
                )
                .expect("read marks"),
            )
        } else {
            None
        };
        let sent = out.chunk(1, s.replica_id(), rows, marks);
        out.pos = sent.next.clone();
        out.index += 1;
        let Message::Chunk { chunk, .. } = sent.msg else {
            panic!("a chunk message");
        };
        let last = chunk.last;
        all.push(chunk);
        if last {
            break;
        }
    }
    s.release_transfer_snapshots(&|_| false);
    (all, end)
}

/// A receiver holding what the sender had before its removals, and a key of its own.
fn receiver(early: &crate::model::Delta) -> TestStore {
    let mut r = TestStore::new(ReplicaId(1002), Limits::default());
    r.apply_remote(SENDER, early.clone(), None, WALL)
        .expect("store")
        .expect("valid");
    set(&mut r, "mine", "local");
    r
}

fn stage_all(
    r: &mut TestStore,
    id: TransferId,
    chunks: &[StateChunk],
) -> Result<(), Rejected> {
    for (i, c) in chunks.iter().enumerate() {
        let index = u32::try_from(i).expect("index");
        r.stage_chunk(SENDER, id, index, c.clone()).expect("store")?;
    }
    Ok(())
}

/// The streamed join of the staged chunks gives exactly the merged join's state: rows (a
/// large set put back together from its parts, removals of keys the sender dropped, the
/// receiver's own key kept), context, dedup marks, cursor, the changed keys, and the log's
/// inflation (the same delta once joined, one run of records); both stores pass `verify`
/// (every dot indexed to its row). The receiver's memory: one chunk, or the parts of the one
/// large row, never the whole transfer.
#[test]
fn the_staged_join_equals_the_merged_join_and_holds_one_chunk() {
    let (mut s, early) = sender();
    let target = 700;
    let (all, end) = chunks(&mut s, RECEIVER, target);
    let parts = all.iter().filter(|c| c.dots.is_some()).count();
    assert!(all.len() >= 10, "a transfer of {} chunks", all.len());
    assert!(parts >= 2, "the set went in {parts} parts");
    assert!(
        all.iter().any(|c| !c.marks.is_empty()),
        "the marks go with the transfer"
    );
    let cursor = Some((s.replica_id(), end));
    let id: TransferId = (s.replica_id(), 1, 1);
    let (held, last) = {
        let mut v = all.clone();
        let last = v.pop().expect("a last chunk");
        (v, last)
    };

    let mut merged = receiver(&early);
    let start = merged.log_bounds().1;
    let one = merge_chunks(held.clone(), last.clone()).expect("valid parts");
    let a = merged
        .apply_chunk(SENDER, one, cursor, WALL)
        .expect("store")
        .expect("valid transfer");

    let mut streamed = receiver(&early);
    assert_eq!(streamed.log_bounds().1, start);
    stage_all(&mut streamed, id, &held).expect("staged");
    let staged = streamed.stats().transfer_staged_bytes;
    assert!(staged > 0, "the chunks are staged");
    assert_eq!(
        streamed.entries(),
        receiver(&early).entries(),
        "nothing staged is applied"
    );
    let index = u32::try_from(held.len()).expect("index");
    let b = streamed
        .apply_staged(SENDER, id, index, last, cursor, WALL)
        .expect("store")
        .expect("valid transfer");

    let mut changed_a = a.changed.to_vec();
    let mut changed_b = b.changed.to_vec();
    changed_a.sort();
    changed_b.sort();
    assert_eq!(changed_a, changed_b);
    assert_eq!((a.inflated, a.hlc_rejected), (b.inflated, b.hlc_rejected));
    assert_eq!(merged.entries(), streamed.entries());
    assert_eq!(merged.ctx(), streamed.ctx());
    assert_eq!(
        merged.dedup_marks().expect("marks"),
        streamed.dedup_marks().expect("marks")
    );
    assert_eq!(merged.peer_cursor(SENDER), streamed.peer_cursor(SENDER));
    merged.verify().expect("merged store invariants");
    streamed.verify().expect("streamed store invariants");
    // The sender's rows, the removals, the receiver's own key.
    let names: Vec<String> = streamed.entries().iter().map(|(k, _)| k.name.clone()).collect();
    assert!(names.iter().all(|n| !n.starts_with("gone")), "{names:?}");
    assert!(names.contains(&"mine".to_owned()));
    let sender_rows = s.entries();
    let received: Vec<_> = streamed
        .entries()
        .into_iter()
        .filter(|(k, _)| k.name != "mine")
        .collect();
    assert_eq!(received, sender_rows);
    // The log: the same inflation, logged as one run.
    let log_a = merged
        .log_interval(start, None, usize::MAX)
        .expect("log")
        .delta;
    let log_b = streamed
        .log_interval(start, None, usize::MAX)
        .expect("log")
        .delta;
    assert_eq!(log_a, log_b, "the same delta is forwarded");
    // Memory: at most one chunk, or the parts of the one large row, at once.
    let sizes: Vec<usize> = all
        .iter()
        .map(|c| crate::codec::encode("transfer chunk", c).expect("encode").len())
        .collect();
    let whole_max = all
        .iter()
        .zip(&sizes)
        .filter(|(c, _)| c.dots.is_none())
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0);
    let row_total: usize = all
        .iter()
        .zip(&sizes)
        .filter(|(c, _)| c.dots.is_some())
        .map(|(_, n)| *n)
        .sum();
    let total: usize = sizes.iter().sum();
    let peak = usize::try_from(streamed.stats().transfer_held_bytes_peak).expect("peak");
    eprintln!(
        "transfer: {} chunks, {total} bytes; largest chunk {whole_max}, large row in parts \
         {row_total}; receiver held at most {peak} bytes",
        all.len()
    );
    assert!(peak > 0);
    assert!(
        peak <= whole_max.max(row_total),
        "held {peak} bytes, more than one chunk ({whole_max}) or the large row ({row_total})"
    );
    assert!(peak * 2 < total, "held {peak} of {total} bytes");
    assert_eq!(streamed.stats().transfer_staged_bytes, 0, "staging dropped");
    assert_eq!(
        streamed.stats().transfer_chunks_staged,
        u64::try_from(held.len()).expect("n")
    );
}

/// A bad part in the middle (a gap in the large row's dot slices) is refused when it is
/// staged: the staging is dropped, the last chunk finds nothing to join to, and nothing of the
/// transfer was applied. A chunk that does not follow the staged ones, or carries another
/// context, is refused too.
#[test]
fn a_bad_staged_chunk_rejects_the_transfer_with_nothing_applied() {
    let (mut s, early) = sender();
    let (all, end) = chunks(&mut s, RECEIVER, 700);
    let cursor = Some((s.replica_id(), end));
    let id: TransferId = (s.replica_id(), 1, 1);
    let n = all.len() - 1;
    let mut r = receiver(&early);
    let before = (r.entries(), r.ctx().clone(), r.log_bounds());
    // A gap: the second part of the set claims to start after a later dot.
    let second = all
        .iter()
        .enumerate()
        .filter(|(_, c)| c.dots.is_some())
        .nth(1)
        .map(|(i, _)| i)
        .expect("a second part");
    let mut bad = all.clone();
    if let Some(slice) = bad[second].dots.as_mut() {
        let after = slice.after.expect("a later part starts after a dot");
        *slice = DotSlice {
            after: Some(tidemark_crdts::Dot::new(after.replica, after.seq + 1)),
            upto: slice.upto,
        };
    }
    let refused = stage_all(&mut r, id, &bad[..n]);
    assert!(matches!(refused, Err(Rejected::BadChunk(_))), "{refused:?}");
    assert_eq!(r.stats().transfer_staged_bytes, 0);
    let last = all[n].clone();
    let index = u32::try_from(n).expect("index");
    let applied = r
        .apply_staged(SENDER, id, index, last.clone(), cursor, WALL)
        .expect("store");
    assert!(matches!(applied, Err(Rejected::BadChunk(_))), "{applied:?}");
    assert_eq!((r.entries(), r.ctx().clone(), r.log_bounds()), before);
    // Out of order, and another context.
    assert!(
        r.stage_chunk(SENDER, id, 3, all[3].clone())
            .expect("store")
            .is_err()
    );
    let mut other_ctx = all[1].clone();
    other_ctx.ctx.insert(tidemark_crdts::Dot::new(ReplicaId(5), 1));
    r.stage_chunk(SENDER, id, 0, all[0].clone())
        .expect("store")
        .expect("first");
    assert!(r.stage_chunk(SENDER, id, 1, other_ctx).expect("store").is_err());
    assert_eq!((r.entries(), r.ctx().clone(), r.log_bounds()), before);
    // The whole transfer still applies afterwards.
    stage_all(&mut r, id, &all[..n]).expect("staged");
    r.apply_staged(SENDER, id, index, last, cursor, WALL)
        .expect("store")
        .expect("valid");
    let received: Vec<_> = r
        .entries()
        .into_iter()
        .filter(|(k, _)| k.name != "mine")
        .collect();
    assert_eq!(received, s.entries());
}

/// A crash (here a close) in the middle of a transfer: the reopened store holds nothing of it
/// (the staging table is gone), the interrupted transfer cannot be finished (its last chunk
/// is refused), and the restarted transfer applies.
#[test]
fn a_transfer_interrupted_by_a_restart_starts_over_with_nothing_applied() {
    let (mut s, early) = sender();
    let (all, end) = chunks(&mut s, RECEIVER, 700);
    let cursor = Some((s.replica_id(), end));
    let id: TransferId = (s.replica_id(), 1, 1);
    let n = all.len() - 1;
    let dir = tempfile::tempdir().expect("tempdir");
    let options = || OpenOptions {
        new_replica_id: Some(ReplicaId(1002)),
        ..OpenOptions::default()
    };
    let before = {
        let mut r = RedbStore::open(dir.path(), options()).expect("open");
        r.apply_remote(SENDER, early.clone(), None, WALL)
            .expect("store")
            .expect("valid");
        for (i, c) in all[..n / 2].iter().enumerate() {
            let index = u32::try_from(i).expect("index");
            r.stage_chunk(SENDER, id, index, c.clone())
                .expect("store")
                .expect("staged");
        }
        assert!(r.stats().transfer_staged_bytes > 0);
        (r.reader().entries().expect("rows"), r.ctx().clone())
    };
    let mut r = RedbStore::open(dir.path(), options()).expect("reopen");
    assert_eq!((r.reader().entries().expect("rows"), r.ctx().clone()), before);
    let index = u32::try_from(n).expect("index");
    let refused = r
        .apply_staged(SENDER, id, index, all[n].clone(), cursor, WALL)
        .expect("store");
    assert!(refused.is_err(), "the staged chunks did not survive");
    assert_eq!((r.reader().entries().expect("rows"), r.ctx().clone()), before);
    for (i, c) in all[..n].iter().enumerate() {
        let index = u32::try_from(i).expect("index");
        r.stage_chunk(SENDER, id, index, c.clone())
            .expect("store")
            .expect("staged");
    }
    r.apply_staged(SENDER, id, index, all[n].clone(), cursor, WALL)
        .expect("store")
        .expect("valid");
    assert_eq!(r.reader().entries().expect("rows"), s.entries());
    r.verify().expect("invariants");
}

/// Over the replication core: a bootstrap of many chunks stages them as they come (the
/// receiver's core holds none), applies them at the last one, and the receiver's memory for
/// the transfer stays at one chunk's size.
#[test]
fn a_bootstrap_stages_its_chunks_and_holds_one_in_memory() {
    let cfg = ReplicaConfig {
        message_bytes_target: 600,
        ..config()
    };
    let mut a = Node::new(0, &[1], cfg.clone());
    let mut b = Node::new(1, &[0], cfg);
    for i in 0..120 {
        a.write(0, &format!("key{i:03}"), &format!("value-{i}-{}", "x".repeat(40)));
    }
    a.up(0, 1);
    b.up(0, 0);
    let mut staged_max = 0u64;
    let mut t = 0;
    while t < 20_000 && b.replica.stats().transfers_received == 0 {
        t += 10;
        for tx in a.out() {
            b.recv(t, a.id, tx.msg);
            staged_max = staged_max.max(b.store.stats().transfer_staged_bytes);
        }
        for tx in b.out() {
            a.recv(t, b.id, tx.msg);
        }
        a.tick(t);
        b.tick(t);
    }
    run(&mut [&mut a, &mut b], t, t + 2_000);
    assert_eq!(b.replica.stats().transfers_received, 1);
    let chunks = b.store.stats().transfer_chunks_staged;
    let peak = b.store.stats().transfer_held_bytes_peak;
    eprintln!("{chunks} chunks staged, {staged_max} bytes on disk at most, {peak} held");
    assert!(chunks >= 10, "{chunks} chunks");
    assert!(staged_max > 5 * peak, "staged {staged_max}, held {peak}");
    assert!(peak <= 2 * 600, "held {peak} bytes for a 600-byte target");
    assert_eq!(b.store.stats().transfer_staged_bytes, 0);
    assert_eq!(a.store.entries(), b.store.entries());
}

/// What the receiver logs for forwarding, replayed record by record to a third peer that
/// holds an older state of the sender (an interval may end inside a run of records): every
/// record that brings a counter's new dot also removes that replica's older dot of it (counter
/// dots have no index rows: a peer removes an overwritten counter dot only while joining the
/// counter's entry), so the peer ends with the sender's state, never two live dots of one
/// replica in a counter. (The simulation found this when the removals went only with the
/// transfer's context, logged after the rows.)
#[test]
fn a_staged_transfer_forwards_counter_removals_with_the_counter() {
    let (mut s, _) = sender();
    // The third peer holds the sender's state with the counter's older dot; the sender then
    // counts on (its new dot supersedes the older one) and writes more rows.
    let mid = s.state();
    let counter = Key::new(KeyKind::GCounter, "events");
    s.apply_local(&[(counter.clone(), Mutation::Inc(5))], WALL)
        .expect("store");
    for i in 0..50 {
        set(&mut s, &format!("later{i:03}"), "v");
    }
    let (all, end) = chunks(&mut s, RECEIVER, 700);
    let cursor = Some((s.replica_id(), end));
    let id: TransferId = (s.replica_id(), 1, 1);
    let n = all.len() - 1;
    // A fresh receiver: it never saw the counter's older dot.
    let mut r = TestStore::new(ReplicaId(1002), Limits::default());
    stage_all(&mut r, id, &all[..n]).expect("staged");
    let index = u32::try_from(n).expect("index");
    r.apply_staged(SENDER, id, index, all[n].clone(), cursor, WALL)
        .expect("store")
        .expect("valid");
    let mut p = TestStore::new(ReplicaId(1003), Limits::default());
    p.apply_remote(SENDER, mid, None, WALL)
        .expect("store")
        .expect("valid");
    // Replay the receiver's log one record at a time.
    let (start, log_end) = r.log_bounds();
    let mut from = start;
    let mut records = 0;
    while from < log_end {
        let interval = r.log_interval(from, None, 1).expect("log");
        if let Some(delta) = interval.delta {
            p.apply_remote(RECEIVER, delta, None, WALL)
                .expect("store")
                .expect("valid");
        }
        records += 1;
        from = interval.end;
    }
    assert!(records > 3, "{records} records");
    assert_eq!(p.entries(), s.entries());
    p.verify().expect("invariants");
}

/// The sender's link drops mid-transfer: the receiver's core forgets the transfer, and its
/// staged chunks are dropped at the next timer (not kept until some later transfer); the
/// transfer then starts over when the link is back, and completes.
#[test]
fn a_link_lost_mid_transfer_drops_the_staged_chunks() {
    let cfg = ReplicaConfig {
        message_bytes_target: 600,
        ..config()
    };
    let mut a = Node::new(0, &[1], cfg.clone());
    let mut b = Node::new(1, &[0], cfg);
    for i in 0..120 {
        a.write(0, &format!("key{i:03}"), &format!("value-{i}-{}", "x".repeat(40)));
    }
    a.up(0, 1);
    b.up(0, 0);
    let mut t = 0;
    while t < 20_000 && b.store.stats().transfer_chunks_staged < 4 {
        t += 10;
        for tx in a.out() {
            b.recv(t, a.id, tx.msg);
        }
        for tx in b.out() {
            a.recv(t, b.id, tx.msg);
        }
        a.tick(t);
        b.tick(t);
    }
    assert!(b.store.stats().transfer_staged_bytes > 0, "chunks staged");
    b.replica.peer_down(super::tests::now(t), a.id);
    a.replica.peer_down(super::tests::now(t), b.id);
    b.tick(t + 10);
    assert_eq!(b.store.stats().transfer_staged_bytes, 0, "staging dropped");
    assert_eq!(b.replica.stats().transfers_received, 0);
    t += 20;
    a.up(t, 1);
    b.up(t, 0);
    run(&mut [&mut a, &mut b], t, t + 20_000);
    assert_eq!(b.replica.stats().transfers_received, 1);
    assert_eq!(a.store.entries(), b.store.entries());
}

/// Re-identification (the store turned out to be a restored copy) starts replication over:
/// the chunks staged under the old identity are dropped with it.
#[test]
fn reidentify_drops_the_staged_chunks() {
    let (mut s, _) = sender();
    let (all, end) = chunks(&mut s, RECEIVER, 700);
    let id: TransferId = (s.replica_id(), 1, 1);
    let n = all.len() - 1;
    let mut r = TestStore::new(ReplicaId(1002), Limits::default());
    stage_all(&mut r, id, &all[..n]).expect("staged");
    assert!(r.stats().transfer_staged_bytes > 0);
    r.reidentify().expect("reidentify");
    assert_eq!(r.stats().transfer_staged_bytes, 0);
    let index = u32::try_from(n).expect("index");
    let refused = r
        .apply_staged(SENDER, id, index, all[n].clone(), Some((s.replica_id(), end)), WALL)
        .expect("store");
    assert!(refused.is_err());
    assert!(r.entries().is_empty());
}

/// A receiver whose data directory runs short of room refuses the transfer (`NoRoom`) before
/// the disk fills: the chunks staged so far are dropped, nothing is applied, and the store
/// still takes writes. Its data directory is a small tmpfs (root only: CI runs as root and sets
/// `TIDEMARK_REQUIRE_MOUNT`; elsewhere the test says it was skipped).
#[cfg(unix)]
#[test]
fn a_receiver_short_of_disk_refuses_the_transfer_before_the_disk_fills() {
    use std::process::Command;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mnt = tmp.path().join("small");
    std::fs::create_dir(&mnt).expect("mkdir");
    // The staging keeps 256 MiB free besides twice what is staged: about 5 MiB of room.
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=268m", "tmpfs"])
        .arg(&mnt)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        assert!(
            std::env::var_os("TIDEMARK_REQUIRE_MOUNT").is_none(),
            "cannot mount a tmpfs, and TIDEMARK_REQUIRE_MOUNT is set"
        );
        println!("skipped: cannot mount a tmpfs (not root?)");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    // A sender with about 12 MiB of rows.
    let mut s = TestStore::new(ReplicaId(1001), Limits::default());
    let value = "v".repeat(400);
    for batch in 0..30 {
        let ops: Vec<(Key, Mutation)> = (0..1000)
            .map(|i| (mv(&format!("k{batch:02}-{i:04}")), Mutation::Set(format!("\"{value}\""))))
            .collect();
        s.apply_local(&ops, WALL).expect("sender");
    }
    let (all, _) = chunks(&mut s, RECEIVER, 1 << 20);
    assert!(all.len() > 8, "{} chunks", all.len());
    let id: TransferId = (s.replica_id(), 1, 1);
    let dir = mnt.join("data");
    let mut r = RedbStore::open(
        &dir,
        OpenOptions {
            new_replica_id: Some(ReplicaId(1002)),
            ..OpenOptions::default()
        },
    )
    .expect("open");
    let ctx = r.ctx().clone();
    let mut refused = None;
    for (i, c) in all[..all.len() - 1].iter().enumerate() {
        let index = u32::try_from(i).expect("index");
        match r.stage_chunk(SENDER, id, index, c.clone()).expect("store") {
            Ok(()) => {}
            Err(reason) => {
                refused = Some((i, reason));
                break;
            }
        }
    }
    let (at, reason) = refused.expect("the staging was refused before the last chunk");
    assert!(at > 0, "the first chunk fits");
    assert!(
        matches!(reason, Rejected::NoRoom { .. }),
        "refused for room: {reason}"
    );
    assert_eq!(r.stats().transfer_staged_bytes, 0, "the staging is dropped");
    assert_eq!(r.ctx(), &ctx, "nothing applied");
    let st = rustix::fs::statvfs(&mnt).expect("statvfs");
    assert!(
        st.f_bavail.saturating_mul(st.f_frsize) > 200 << 20,
        "the disk kept its room"
    );
    r.commit_local(
        &[LocalWrite {
            ops: vec![(mv("after"), Mutation::Set("\"ok\"".into()))],
            ..LocalWrite::default()
        }],
        WALL,
    )
    .expect("the store still takes writes");
}
