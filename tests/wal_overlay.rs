//! The write-ahead overlay (issue 10, WAL + checkpoint) under crashes and long ingest.
//!
//! - `a_kill_with_unfolded_rows_loses_no_acknowledged_write`: a child process commits groups
//!   with folds effectively off (every row stays in the overlay, only the log is durable) and
//!   reports each acknowledged group; the parent SIGKILLs it at a seeded moment, reopens the
//!   crash image (replaying the log) and checks every acknowledged write is there exactly,
//!   that something was replayed, the store invariants, and that the next dot is exactly one
//!   above every acknowledged one (no dot reuse). Three kill cycles on one directory.
//! - `overlay_memory_stays_within_its_bound`: a long ingest of distinct keys with a small
//!   `fold_bytes_max`: the overlay never holds more than the bound plus one group, and every
//!   write reads back after a reopen.
//!
//! `SEED=<n>` replays the kill schedule.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidemark::store::{EventId, LocalWrite, OpenOptions, RedbStore};
use tidemark::{Key, KeyKind, ReplicaId, Value};
use tidemark_crdts::Mutation;

const CHILD_DIR: &str = "TIDEMARK_WAL_CHILD_DIR";
const CHILD_CYCLE: &str = "TIDEMARK_WAL_CHILD_CYCLE";

fn options(fold_groups: usize, fold_bytes: usize) -> OpenOptions {
    let mut o = OpenOptions {
        new_replica_id: Some(ReplicaId(0xAA)),
        ..OpenOptions::default()
    };
    o.limits.fold_groups_max = fold_groups;
    o.limits.fold_bytes_max = fold_bytes;
    o
}

fn set_key(cycle: u64) -> Key {
    Key::new(KeyKind::ORSet, format!("acked/{cycle}"))
}

/// The child: commits groups (each: 20 counter increments, one set add naming the group)
/// until killed, printing `ACK <group> <own max seq>` after each durable commit.
#[test]
fn child_commit_until_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // only as a child
    };
    let cycle: u64 = std::env::var(CHILD_CYCLE)
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut store =
        RedbStore::open(std::path::Path::new(&dir), options(1 << 20, 1 << 40)).expect("open");
    let me = store.replica();
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY").expect("stdout");
    out.flush().expect("flush");
    for group in 0u64.. {
        let mut writes: Vec<LocalWrite> = (0..20)
            .map(|i| LocalWrite {
                ops: vec![(
                    Key::new(KeyKind::GCounter, format!("c{}", i % 7)),
                    Mutation::Inc(1),
                )],
                event: None,
            })
            .collect();
        writes.push(LocalWrite {
            ops: vec![(set_key(cycle), Mutation::Add(group.to_string()))],
            event: Some(EventId {
                stream: "wal".into(),
                source: format!("cycle{cycle}"),
                seq: group,
            }),
        });
        store.commit_local(&writes, 1_000 + group).expect("commit");
        writeln!(out, "ACK {group} {}", store.ctx().max_seq(me)).expect("stdout");
        out.flush().expect("flush");
    }
}

fn seed() -> u64 {
    std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0A1_u64)
}

fn counters_total(store: &RedbStore) -> u64 {
    let reader = store.reader();
    (0..7)
        .map(
            |i| match reader.get(&Key::new(KeyKind::GCounter, format!("c{i}"))) {
                Ok(Some(Value::GCounter(n))) => n,
                Ok(None) => 0,
                other => panic!("counter read: {other:?}"),
            },
        )
        .sum()
}

#[test]
fn a_kill_with_unfolded_rows_loses_no_acknowledged_write() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let seed = seed();
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let mut acked_total = 0u64; // groups acknowledged over all cycles
    let mut max_acked_seq = 0u64;
    for cycle in 0..3u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "child_commit_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, dir.path())
            .env(CHILD_CYCLE, cycle.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait for the child to open, then let it commit for a seeded while (≥ 30 groups).
        let mut acked: Vec<(u64, u64)> = Vec::new();
        let kill_after = 30 + (seed.wrapping_mul(31).wrapping_add(cycle * 17)) % 90;
        let deadline = Instant::now() + Duration::from_secs(60);
        while (acked.len() as u64) < kill_after && Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("ACK ") {
                        let mut it = rest.split(' ').map(|x| x.parse::<u64>().expect("number"));
                        let (g, s) = (it.next().expect("group"), it.next().expect("seq"));
                        acked.push((g, s));
                    }
                }
                Err(_) => break,
            }
        }
        // SIGKILL: no drop, no fold, no clean close.
        child.kill().expect("kill");
        let _ = child.wait();
        // Acknowledgements printed before the kill landed count too.
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if let Some(rest) = line.strip_prefix("ACK ") {
                let mut it = rest.split(' ').map(|x| x.parse::<u64>().expect("number"));
                acked.push((it.next().expect("group"), it.next().expect("seq")));
            }
        }
        let _ = reader.join();
        assert!(
            acked.len() >= 30,
            "seed {seed}, cycle {cycle}: child acknowledged {}",
            acked.len()
        );
        let mut store = RedbStore::open(dir.path(), options(16, 64 << 20)).expect("reopen");
        let stats = store.checkpoint_stats();
        assert!(
            stats.replayed_records >= acked.len() as u64,
            "seed {seed}, cycle {cycle}: the rows were only in the log ({} replayed, {} acked)",
            stats.replayed_records,
            acked.len()
        );
        assert!(store.check_integrity().expect("integrity"));
        store.verify().expect("invariants after replay");
        // Every acknowledged group's add is present; nothing else but groups that were sent.
        let Some(Value::ORSet(elems)) = store.reader().get(&set_key(cycle)).expect("read") else {
            panic!("seed {seed}, cycle {cycle}: the set is missing");
        };
        let present: Vec<u64> = elems
            .iter()
            .map(|j| j.as_str().parse::<u64>().expect("group number"))
            .collect();
        for (g, _) in &acked {
            assert!(
                present.contains(g),
                "seed {seed}, cycle {cycle}: acked group {g} lost"
            );
        }
        let groups_applied = present.len() as u64;
        assert!(
            groups_applied <= acked.len() as u64 + 1,
            "seed {seed}: at most one unacked group"
        );
        acked_total += groups_applied;
        assert_eq!(
            counters_total(&store),
            acked_total * 20,
            "seed {seed}, cycle {cycle}: counters"
        );
        // No dot reuse: our max seq covers every acknowledged one, and the next write takes
        // the dot right above it.
        let me = store.replica();
        assert_eq!(me, ReplicaId(0xAA), "same replica id");
        let last = acked.iter().map(|(_, s)| *s).max().unwrap_or(0);
        max_acked_seq = max_acked_seq.max(last);
        let at = store.ctx().max_seq(me);
        assert!(
            at >= max_acked_seq,
            "seed {seed}, cycle {cycle}: own max seq {at} < acked {max_acked_seq}"
        );
        let out = store
            .commit_local(
                &[LocalWrite {
                    ops: vec![(Key::new(KeyKind::GCounter, "after"), Mutation::Inc(1))],
                    event: None,
                }],
                9_000_000,
            )
            .expect("write after replay");
        assert!(out.log_seq.is_some());
        assert_eq!(
            store.ctx().max_seq(me),
            at + 1,
            "seed {seed}: the next dot is fresh"
        );
        max_acked_seq = at + 1;
        store.verify().expect("invariants");
    }
}

#[test]
fn overlay_memory_stays_within_its_bound() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bound = 512 * 1024;
    let mut store = RedbStore::open(dir.path(), options(1 << 20, bound)).expect("open");
    let mut high = 0usize;
    let groups = 150u64;
    for g in 0..groups {
        let writes: Vec<LocalWrite> = (0..200u64)
            .map(|i| LocalWrite {
                ops: vec![
                    (
                        Key::new(KeyKind::Lww, format!("k{:08}", g * 200 + i)),
                        Mutation::Set(format!("\"value {g} {i}\"")),
                    ),
                    (
                        Key::new(KeyKind::ORSet, format!("s{}", i % 50)),
                        Mutation::Add(format!("{}", g * 200 + i)),
                    ),
                ],
                event: None,
            })
            .collect();
        store.commit_local(&writes, 1_000 + g).expect("commit");
        let s = store.checkpoint_stats();
        high = high.max(s.overlay_bytes);
        assert!(
            s.overlay_bytes < bound,
            "group {g}: the overlay holds {} bytes after a commit (bound {bound})",
            s.overlay_bytes
        );
    }
    let s = store.checkpoint_stats();
    assert!(s.folds > 10, "folds happened by bytes: {}", s.folds);
    // While a group is staged the overlay may exceed the bound by that group only.
    assert!(
        s.overlay_bytes_max < bound + s.group_bytes_max,
        "largest overlay {} bytes, largest group {}",
        s.overlay_bytes_max,
        s.group_bytes_max
    );
    assert!(
        s.group_bytes_max < 2 << 20,
        "one group staged {} bytes",
        s.group_bytes_max
    );
    drop(store);
    let store = RedbStore::open(dir.path(), options(1 << 20, bound)).expect("reopen");
    let reader = store.reader();
    for n in [0u64, 12_345, groups * 200 - 1] {
        let v = reader
            .get(&Key::new(KeyKind::Lww, format!("k{n:08}")))
            .expect("read");
        assert!(matches!(v, Some(Value::Lww(Some(_)))), "key {n}: {v:?}");
    }
    store.verify().expect("invariants");
    println!("overlay high-water after commits: {high} bytes (bound {bound})");
}
