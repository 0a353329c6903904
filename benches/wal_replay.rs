//! Recovery time: how long an open takes to replay the largest write-ahead log the checkpoint
//! size allows (issue 21, "recovery after kill -9 with the largest log the checkpoint interval
//! allows: replay time reported").
//!
//! For each workload a store in a temp directory commits groups (relaxed durability, so the
//! fill does not wait for the disk: the log's content is the same) until the log is just short
//! of `store::CHECKPOINT_BYTES`; its two files are then copied — what a kill -9 leaves — and the
//! copy is opened, timed. Beside it, in the same run, the open of a copy taken right after a
//! checkpoint (nothing to replay) is the baseline. Prints records, log bytes, open time, and
//! the replay time per million events.
//!
//! `cargo bench --bench wal_replay`

use std::path::Path;
use std::time::Instant;
use tidemark::crdts::{Key, KeyKind, Mutation, ReplicaId};
use tidemark::store::{
    CHECKPOINT_BYTES, DB_FILE, EventId, LocalWrite, OpenOptions, RedbStore, WAL_FILE,
};

fn options() -> OpenOptions {
    OpenOptions {
        new_replica_id: Some(ReplicaId(1)),
        durability: tidemark::Durability::Relaxed,
        ..OpenOptions::default()
    }
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for f in [DB_FILE, WAL_FILE] {
        std::fs::copy(from.join(f), to.join(f)).expect("copy");
    }
}

fn timed_open(dir: &Path) -> (f64, u64, u64) {
    let t = Instant::now();
    let store = RedbStore::open(dir, options()).expect("open the copy");
    let secs = t.elapsed().as_secs_f64();
    let scan = store.wal_scan().clone();
    std::mem::forget(store); // no closing checkpoint in the figure (the process would go on)
    (secs, scan.replayed, scan.replayed_bytes)
}

fn write(i: u64, batch: u64) -> Vec<LocalWrite> {
    (0..batch)
        .map(|j| {
            let n = i * batch + j;
            LocalWrite {
                ops: vec![(
                    Key::new(KeyKind::ORSet, format!("set-{}", n % 10_000)),
                    Mutation::Add(format!("\"e{n}\"")),
                )],
                event: Some(EventId {
                    stream: "s".into(),
                    source: format!("src-{}", n % 64),
                    seq: n / 64 + 1,
                }),
                stamps: Vec::new(),
                late: None,
                own_dots: false,
            }
        })
        .collect()
}

fn workload(name: &str, batch: u64) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let live = tmp.path().join("live");
    let mut store = RedbStore::open(&live, options()).expect("open");
    // A little state first, checkpointed: the baseline copy.
    for i in 0..10 {
        store.commit_local(&write(i, batch), 1_000).expect("commit");
    }
    store.checkpoint().expect("checkpoint");
    store.sync().expect("sync");
    copy(&live, &tmp.path().join("base"));
    let mut i = 10;
    let margin = 4 * 1024 * batch; // stay under the size at which the next group checkpoints
    while store.wal_pending_bytes() + margin < CHECKPOINT_BYTES {
        store.commit_local(&write(i, batch), 1_000).expect("commit");
        i += 1;
    }
    store.sync().expect("sync");
    copy(&live, &tmp.path().join("crash"));
    let (base_secs, ..) = timed_open(&tmp.path().join("base"));
    let (secs, records, bytes) = timed_open(&tmp.path().join("crash"));
    let replay = (secs - base_secs).max(0.0);
    println!(
        "{name:<34} {records:>6} records ({:>7} events) {:>5.1} MiB  open {:>6.1} ms (no log: {:>5.1} ms)  replay {:>5.2} s per million events, {:>5.1} MiB/s",
        records * batch,
        bytes as f64 / (1 << 20) as f64,
        secs * 1e3,
        base_secs * 1e3,
        replay / (records * batch).max(1) as f64 * 1e6,
        bytes as f64 / (1 << 20) as f64 / replay.max(1e-9),
    );
}

fn main() {
    println!(
        "wal_replay: open after a kill -9 with a log just under the checkpoint size ({} MiB)",
        CHECKPOINT_BYTES >> 20
    );
    workload("single set adds (1 per group)", 1);
    workload("set adds, groups of 100", 100);
    workload("set adds, groups of 1,000", 1_000);
}
