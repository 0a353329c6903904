//! Sets stored as rows per element (store format 3) against the in-memory reference.
//!
//! Seeded (`SEED=<n>` replays a run): two replicas grow a big set and some small ones with
//! adds, re-adds, removes and deletes in commit groups, exchange their log deltas (removals
//! included), reopen, and finally serve state transfers whose chunks slice the big set into
//! many parts. After every step each redb store must hold exactly the entries and context of a
//! [`tidemark_crdts::Store`] that saw the same operations and deltas, and pass `verify()`
//! (dot index per element row, header rows, no orphan element rows).

use super::{LocalWrite, OpenOptions, RedbStore};
use crate::model::StateChunk;
use crate::proto::{PeerId, StateStore};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tidemark_crdts::{
    DedupMarks, DotStore, Entry, Key, KeyKind, Mutation, ReplicaId, Store, Value,
};

use super::test_rng::Rng;

fn seed() -> u64 {
    std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5E7_F0D5)
}

fn options(id: u64) -> OpenOptions {
    OpenOptions {
        new_replica_id: Some(ReplicaId(u128::from(id))),
        ..OpenOptions::default()
    }
}

fn set(name: &str) -> Key {
    Key::new(KeyKind::ORSet, name)
}

/// The store holds exactly the model's entries and context, and its invariants.
fn check(store: &RedbStore, model: &Store, what: &str) {
    let got = store.reader().entries().expect("read entries");
    let want: Vec<(Key, Entry)> = model
        .entries()
        .iter()
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect();
    assert_eq!(got.len(), want.len(), "{what}: number of keys");
    for ((gk, ge), (wk, we)) in got.iter().zip(&want) {
        assert_eq!(gk, wk, "{what}");
        assert!(ge == we, "{what}: entry of {gk} differs");
    }
    assert_eq!(store.ctx(), model.context(), "{what}: context");
    for (k, _) in &want {
        let v = store.reader().get(k).expect("read").expect("present");
        assert_eq!(v, model.get(k), "{what}: value of {k}");
    }
    store.verify().unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// One commit group of `n` single-op writes at `store`, mirrored in `model`.
fn group(
    store: &mut RedbStore,
    model: &mut Store,
    rng: &mut Rng,
    tag: char,
    fresh: &mut u64,
    n: u64,
    big_deletes: bool,
) {
    let me = store.replica();
    let mut writes = Vec::new();
    let keys = [set("big"), set("big"), set("big"), set("s1"), set("s2")];
    for _ in 0..n {
        let key = keys[rng.below(keys.len() as u64) as usize].clone();
        let members = match model.get(&key) {
            Value::ORSet(v) => v,
            _ => Vec::new(),
        };
        let existing = |rng: &mut Rng| members.get(rng.below(members.len() as u64) as usize);
        let p = rng.below(100);
        let m = if p < 55 || members.is_empty() {
            *fresh += 1;
            Mutation::Add(format!("\"{tag}{fresh}\""))
        } else if p < 70 {
            Mutation::Add(existing(rng).cloned().unwrap_or_default())
        } else if p < 97 {
            Mutation::Remove(existing(rng).cloned().unwrap_or_default())
        } else if key.name != "big" || big_deletes {
            Mutation::Delete
        } else {
            Mutation::Remove(format!("\"{tag}-absent\""))
        };
        writes.push(LocalWrite {
            ops: vec![(key, m)],
            event: None,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        });
    }
    store.commit_local(&writes, 1_000).expect("commit");
    for w in &writes {
        for (key, m) in &w.ops {
            model.mutate(me, key, m, None).expect("model applies");
        }
    }
}

/// Ships every delta of `from`'s log that `to` lacks; the model of `to` joins the same.
fn sync(from: &RedbStore, to: &mut RedbStore, to_model: &mut Store) {
    loop {
        let remote = to.ctx().clone();
        let (delta, more) = match from.deltas_since(&remote, 1 << 20).expect("deltas") {
            super::DeltasSince::Deltas { delta, more } => (delta, more),
            super::DeltasSince::NeedsStateTransfer => panic!("log was not compacted"),
        };
        if delta.is_empty() {
            return;
        }
        to_model.apply(delta.state.clone());
        to.apply_remote_delta(PeerId(1), delta, 1_000)
            .expect("storage")
            .expect("valid delta");
        if !more {
            return;
        }
    }
}

/// The chunks of a state transfer from `from` as the replication core reads them: at most
/// `bytes_max` each, a large row in dot slices, all under `from`'s context at the start.
/// Returns the chunks (the last one marked) and the number of row parts among them.
pub(super) fn transfer_chunks(from: &mut RedbStore, bytes_max: usize) -> (Vec<StateChunk>, usize) {
    let ctx = from.ctx().clone();
    let mut after: Option<Key> = None;
    let mut resume = None;
    let mut chunks = Vec::new();
    let mut parts = 0;
    loop {
        let read = from
            .read_chunk_from(None, after.as_ref(), resume.as_ref(), bytes_max)
            .expect("read chunk");
        let finished = read.part.is_none() && (read.done || read.last_key.is_none());
        let chunk_after = after.clone();
        let (upto, dots) = match read.part {
            Some(part) => {
                parts += 1;
                match part.slice.upto {
                    Some(d) => resume = Some((part.key.clone(), d)),
                    None => {
                        resume = None;
                        after = Some(part.key.clone());
                    }
                }
                (Some(part.key), Some(part.slice))
            }
            None if finished => (None, None),
            None => {
                after.clone_from(&read.last_key);
                (read.last_key, None)
            }
        };
        chunks.push(StateChunk {
            after: chunk_after,
            upto,
            entries: read.entries,
            ctx: ctx.clone(),
            marks: DedupMarks::new(),
            last: finished,
            dots,
        });
        if finished {
            return (chunks, parts);
        }
    }
}

/// A state transfer from `from` to `to` as the replication core does it: chunks of at most
/// `bytes_max`, a large row in dot slices, merged and joined once. Returns the number of
/// row parts.
fn transfer(from: &mut RedbStore, to: &mut RedbStore, bytes_max: usize) -> usize {
    let ctx = from.ctx().clone();
    let (chunks, parts) = transfer_chunks(from, bytes_max);
    // The receiver's reassembly: the dot slices of one row are disjoint parts of one entry.
    let mut entries: Vec<(Key, Entry)> = Vec::new();
    for c in chunks {
        for (k, e) in c.entries {
            match entries.last_mut() {
                Some((prev, mine)) if *prev == k => {
                    let (md, td) = (mine.dots(), e.dots());
                    mine.join(&md, e, &td);
                }
                _ => entries.push((k, e)),
            }
        }
    }
    let merged = StateChunk {
        after: None,
        upto: None,
        entries,
        ctx,
        marks: DedupMarks::new(),
        last: true,
        dots: None,
    };
    to.apply_chunk(PeerId(2), merged, None, 1_000)
        .expect("storage")
        .expect("valid chunk");
    parts
}

#[test]
fn sets_as_element_rows_match_the_reference_through_deltas_reopen_and_transfers() {
    let seed = seed();
    let mut rng = Rng(seed);
    let (da, db, dc) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let mut a = RedbStore::open(da.path(), options(1)).expect("open a");
    let mut b = RedbStore::open(db.path(), options(2)).expect("open b");
    let (mut ma, mut mb) = (Store::new(), Store::new());
    let (mut fa, mut fb) = (0u64, 0u64);
    // Grow the big set first (adds only), so later removals and re-adds hit a big set.
    for _ in 0..4 {
        let writes: Vec<LocalWrite> = (0..500)
            .map(|_| {
                fa += 1;
                LocalWrite {
                    ops: vec![(set("big"), Mutation::Add(format!("\"a{fa}\"")))],
                    event: None,
                    stamps: Vec::new(),
                    late: None,
                    own_dots: false,
                }
            })
            .collect();
        a.commit_local(&writes, 1_000).expect("fill");
        for w in &writes {
            for (k, m) in &w.ops {
                ma.mutate(a.replica(), k, m, None).expect("model");
            }
        }
    }
    check(&a, &ma, &format!("seed {seed}: after the fill"));
    for round in 0..24u64 {
        let what = format!("seed {seed}, round {round}");
        let n = 20 + rng.below(200);
        group(&mut a, &mut ma, &mut rng, 'a', &mut fa, n, round == 17);
        let n = 5 + rng.below(60);
        group(&mut b, &mut mb, &mut rng, 'b', &mut fb, n, false);
        check(&a, &ma, &format!("{what}: a after its group"));
        check(&b, &mb, &format!("{what}: b after its group"));
        if rng.below(3) > 0 {
            sync(&a, &mut b, &mut mb);
            check(&b, &mb, &format!("{what}: b after a's deltas"));
        }
        if rng.below(3) > 0 {
            sync(&b, &mut a, &mut ma);
            check(&a, &ma, &format!("{what}: a after b's deltas"));
        }
        if round % 7 == 6 {
            drop(a);
            drop(b);
            a = RedbStore::open(da.path(), options(1)).expect("reopen a");
            b = RedbStore::open(db.path(), options(2)).expect("reopen b");
            check(&a, &ma, &format!("{what}: a after reopen"));
            check(&b, &mb, &format!("{what}: b after reopen"));
        }
    }
    // State transfers slicing the big set: into an empty store, and into b (which holds
    // concurrent adds and removals a has not seen).
    let mut c = RedbStore::open(dc.path(), options(3)).expect("open c");
    let mut mc = Store::new();
    let parts = transfer(&mut a, &mut c, 2_048);
    assert!(parts > 2, "seed {seed}: the big set went in {parts} parts");
    mc.apply(ma.to_delta());
    check(&c, &mc, &format!("seed {seed}: c after a's transfer"));
    group(&mut b, &mut mb, &mut rng, 'b', &mut fb, 40, true);
    transfer(&mut a, &mut b, 4_096);
    mb.apply(ma.to_delta());
    check(&b, &mb, &format!("seed {seed}: b after a's transfer"));
    // And back: a converges with b, then everything survives a reopen.
    sync(&b, &mut a, &mut ma);
    check(&a, &ma, &format!("seed {seed}: a after b's deltas"));
    assert_eq!(
        a.reader().entries().expect("a"),
        b.reader().entries().expect("b"),
        "seed {seed}: a and b converge"
    );
    drop(c);
    let c = RedbStore::open(dc.path(), options(3)).expect("reopen c");
    check(&c, &mc, &format!("seed {seed}: c after reopen"));
}

/// A redb backend in memory that counts the bytes redb writes to it.
#[derive(Debug)]
struct Counting {
    inner: redb::backends::InMemoryBackend,
    written: Arc<AtomicU64>,
}

impl redb::StorageBackend for Counting {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.written.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write(offset, data)
    }
}

/// Bytes written per commit by `adds` single-add commits (then as many single-remove
/// commits) to set `big` after filling it with `size` elements in groups of 1,000.
fn bytes_per_commit(size: u64, adds: u64) -> (f64, f64) {
    let written = Arc::new(AtomicU64::new(0));
    let backend = Counting {
        inner: redb::backends::InMemoryBackend::new(),
        written: Arc::clone(&written),
    };
    let mut store = RedbStore::open_with_backend(backend, options(1)).expect("open");
    let mut u = 0;
    while u < size {
        let n = (size - u).min(1_000);
        let writes: Vec<LocalWrite> = (u..u + n)
            .map(|i| LocalWrite {
                ops: vec![(set("big"), Mutation::Add(format!("\"e{i}\"")))],
                event: None,
                stamps: Vec::new(),
                late: None,
                own_dots: false,
            })
            .collect();
        store.commit_local(&writes, 1_000).expect("fill");
        u += n;
    }
    let one = |store: &mut RedbStore, m: Mutation| {
        store
            .commit_local(
                &[LocalWrite {
                    ops: vec![(set("big"), m)],
                    event: None,
                    stamps: Vec::new(),
                    late: None,
                    own_dots: false,
                }],
                1_000,
            )
            .expect("commit");
    };
    let before = written.load(Ordering::Relaxed);
    for i in 0..adds {
        one(&mut store, Mutation::Add(format!("\"new{i}\"")));
    }
    let add = (written.load(Ordering::Relaxed) - before) as f64 / adds as f64;
    let before = written.load(Ordering::Relaxed);
    for i in 0..adds {
        one(&mut store, Mutation::Remove(format!("\"new{i}\"")));
    }
    let remove = (written.load(Ordering::Relaxed) - before) as f64 / adds as f64;
    store.verify().expect("invariants");
    (add, remove)
}

/// The big-set goal in bytes (BENCHMARKS.md): an add to (and a remove from) a big set writes no
/// more than 2× the bytes of one to an empty set, and the cost does not grow with the set. Byte
/// counts of redb's page writes are deterministic (no timing is measured).
#[test]
fn an_add_to_a_big_set_writes_about_the_bytes_of_an_add_to_an_empty_set() {
    let (empty_add, empty_remove) = bytes_per_commit(0, 20);
    let (mid_add, _) = bytes_per_commit(5_000, 20);
    let (big_add, big_remove) = bytes_per_commit(40_000, 20);
    eprintln!(
        "bytes/commit add: empty {empty_add:.0}, 5k {mid_add:.0}, 40k {big_add:.0}; \
         remove: empty {empty_remove:.0}, 40k {big_remove:.0}"
    );
    assert!(
        big_add <= 2.0 * empty_add,
        "add to a 40,000-element set writes {big_add:.0} B/commit, to an empty one {empty_add:.0}"
    );
    assert!(
        big_remove <= 2.0 * empty_remove,
        "remove from a 40,000-element set writes {big_remove:.0} B/commit, from a small one {empty_remove:.0}"
    );
    // Eight times the elements: (nearly) the same bytes (one more B-tree level at most).
    assert!(
        big_add <= 1.5 * mid_add,
        "40k: {big_add:.0} B/commit vs 5k: {mid_add:.0}"
    );
}
