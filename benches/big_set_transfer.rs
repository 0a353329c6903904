//! Sending one large set by state transfer: the time to read every chunk of the transfer of a
//! store holding one orset of N elements (the sender's side: the row is too large for one
//! message, so it goes in parts by runs of its dots). The set is read once per
//! transfer, not once per part (which would cost O(set² / chunk)).
//! Run: `cargo bench --bench big_set_transfer` (`BIG_SET_ELEMENTS` = comma-separated sizes,
//! default `50000,200000`). Prints parts, bytes and milliseconds per size; no assertion.
use std::time::Instant;
use tidemark::config::{Durability, Limits};
use tidemark::crdts::{Key, KeyKind, Mutation, ReplicaId};
use tidemark::proto::StateStore;
use tidemark::store::{LocalWrite, OpenOptions, RedbStore};

fn main() {
    let sizes: Vec<usize> = std::env::var("BIG_SET_ELEMENTS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![50_000, 200_000]);
    println!("| set elements | chunks (parts of the set) | bytes read | ms to read the transfer |");
    println!("|---:|---:|---:|---:|");
    for n in sizes {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = RedbStore::open(
            dir.path(),
            OpenOptions {
                new_replica_id: Some(ReplicaId(1)),
                durability: Durability::Relaxed,
                limits: Limits::default(),
            },
        )
        .expect("open");
        let key = Key::new(KeyKind::ORSet, "big");
        for start in (0..n).step_by(10_000) {
            let writes: Vec<LocalWrite> = (start..(start + 10_000).min(n))
                .map(|i| LocalWrite {
                    ops: vec![(key.clone(), Mutation::Add(format!("\"element-{i:09}\"")))],
                    event: None,
                    stamps: Vec::new(),
                    late: None,
                    own_dots: false,
                })
                .collect();
            store.commit_local(&writes, 1).expect("commit");
        }
        let bytes_max = Limits::default().message_bytes_target;
        let started = Instant::now();
        let (mut after, mut resume, mut chunks, mut bytes) = (None, None, 0usize, 0usize);
        loop {
            let read = store
                .read_chunk_from(None, after.as_ref(), resume.as_ref(), bytes_max)
                .expect("read chunk");
            chunks += 1;
            for (_, e) in &read.entries {
                bytes += tidemark::codec::encoded_len("row", e).unwrap_or(0);
            }
            resume = read
                .part
                .as_ref()
                .and_then(|p| p.slice.upto.map(|d| (p.key.clone(), d)));
            if read.done {
                break;
            }
            if resume.is_none() {
                after = read.last_key.clone();
            }
        }
        println!(
            "| {n} | {chunks} | {bytes} | {:.0} |",
            started.elapsed().as_secs_f64() * 1e3
        );
    }
}
