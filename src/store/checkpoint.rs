//! Checkpoints of the write-ahead overlay (issue 10): folding it into the tables inside a
//! commit, and replaying the log above the last fold when a store opens.
//!
//! Invariant: the tables hold exactly the state after the log records below `meta/folded`'s
//! seq, whose context is `meta/folded`'s context; the overlay holds the rest. Both move in the
//! same transaction (a fold writes the overlay's rows and the new `meta/folded`), so after any
//! crash the tables plus the log records from the folded seq to the log end, joined in order
//! through `join_delta` starting from the folded context, are exactly the committed state.
//! Log compaction never drops a record at or above the folded seq (it folds first).

use super::error::StoreError;
use super::overlay;
use super::rows::TxnRows;
use super::tables::{LOG, LogRecord, META_FOLDED};
use super::{RedbStore, meta_get, meta_put};
use crate::codec;
use redb::{ReadableTable, WriteTransaction};
use std::time::Instant;
use tidemark_crdts::CausalContext;
use tidemark_crdts::store::join_delta;

/// What the overlay and its folds have done since open (for metrics and benches).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Folds of the overlay into the tables.
    pub folds: u64,
    /// Microseconds spent writing folded rows and committing fold transactions (total).
    pub fold_micros: u64,
    /// The longest single fold commit, microseconds.
    pub fold_micros_max: u64,
    /// Log records replayed at open.
    pub replayed_records: u64,
    /// Microseconds the replay at open took (join + fold).
    pub replay_micros: u64,
    /// Bytes the overlay holds now (approximate).
    pub overlay_bytes: usize,
    /// Largest overlay size seen since open (approximate bytes, a staged group included).
    pub overlay_bytes_max: usize,
    /// Largest size one transaction staged (approximate bytes): the overlay holds at most
    /// `fold_bytes_max` plus this.
    pub group_bytes_max: usize,
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

impl RedbStore {
    /// Commits `txn` (whose log now ends at `log_end` with context `ctx`) and moves the
    /// overlay: when a fold is due (`limits.fold_groups_max` groups or `limits.fold_bytes_max`
    /// bytes) or `force`d, every pending write goes into the tables in this same transaction,
    /// key-sorted, with `meta/folded = (log_end, ctx)`, and readers switch to the emptied
    /// overlay under the overlay lock; otherwise the group's staged writes are published to
    /// readers once the commit succeeded (before anyone is acknowledged).
    ///
    /// # Errors
    /// Storage failures (the caller's `guarded` halts the store).
    pub(crate) fn commit_staged(
        &mut self,
        txn: WriteTransaction,
        log_end: u64,
        ctx: &CausalContext,
        force: bool,
    ) -> Result<(), StoreError> {
        let limits = &self.options.limits;
        let fold = force
            || self
                .overlay
                .get_mut()
                .wants_fold(limits.fold_groups_max, limits.fold_bytes_max);
        self.checkpoint.overlay_bytes_max = self
            .checkpoint
            .overlay_bytes_max
            .max(self.overlay.get_mut().bytes());
        self.checkpoint.group_bytes_max = self
            .checkpoint
            .group_bytes_max
            .max(self.overlay.get_mut().pending_bytes());
        if !fold {
            if let Err(e) = txn.commit() {
                self.overlay.get_mut().discard_pending();
                return Err(StoreError::redb(e));
            }
            self.overlay.get_mut().publish();
            self.checkpoint.overlay_bytes = self.overlay.get_mut().bytes();
            return Ok(());
        }
        let started = Instant::now();
        self.overlay.get_mut().write_into(&txn)?;
        meta_put(&txn, META_FOLDED, &(log_end, ctx))?;
        let shared = self.overlay.get_mut().shared();
        let mut view = overlay::lock(&shared);
        txn.commit().map_err(StoreError::redb)?;
        self.overlay.get_mut().folded(&mut view);
        drop(view);
        self.folded_seq = log_end;
        let took = micros(started);
        self.checkpoint.folds += 1;
        self.checkpoint.fold_micros = self.checkpoint.fold_micros.saturating_add(took);
        self.checkpoint.fold_micros_max = self.checkpoint.fold_micros_max.max(took);
        self.checkpoint.overlay_bytes = 0;
        Ok(())
    }

    /// Folds the whole overlay into the tables now, in one durable transaction (a snapshot, a
    /// purge and compaction beyond the folded seq need the tables complete). No-op when the
    /// overlay is empty.
    ///
    /// # Errors
    /// Storage failures (the store halts).
    pub fn fold_now(&mut self) -> Result<(), StoreError> {
        if self.overlay.get_mut().is_empty() {
            return Ok(());
        }
        self.guarded(Self::fold_now_inner)
    }

    /// [`RedbStore::fold_now`] inside a `guarded` write path.
    pub(crate) fn fold_now_inner(&mut self) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(StoreError::redb)?;
        txn.set_durability(redb::Durability::Immediate)
            .map_err(StoreError::redb)?;
        let ctx = self.ctx.clone();
        self.commit_staged(txn, self.log_end, &ctx, true)?;
        self.unsynced
            .store(false, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// A read transaction of the committed tables and the overlay view of the same state
    /// (the writer's reads outside a write transaction: state-transfer chunks).
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn begin_overlay_read(
        &self,
    ) -> Result<(redb::ReadTransaction, std::sync::Arc<overlay::View>), StoreError> {
        use redb::ReadableDatabase;
        let shared = self.overlay.borrow().shared();
        let view = overlay::lock(&shared);
        let rtxn = self.db.begin_read().map_err(StoreError::redb)?;
        Ok((rtxn, std::sync::Arc::clone(&view)))
    }

    /// What the overlay and its folds did since open.
    pub fn checkpoint_stats(&self) -> CheckpointStats {
        let mut s = self.checkpoint.clone();
        s.overlay_bytes = self.overlay.borrow().bytes();
        s
    }

    /// The log seq below which the tables hold everything (the last fold).
    pub fn folded_seq(&self) -> u64 {
        self.folded_seq
    }

    /// Brings the tables up to the log end after open: joins every log record from the folded
    /// seq on (through `join_delta`, from the folded context, so exactly as the records were
    /// first joined) into the overlay, then folds it durably. A store without `meta/folded`
    /// (format 2, or new) holds everything in its tables already. Runs before the store serves
    /// anything.
    ///
    /// # Errors
    /// Storage failures and corrupt records (the node must not start then).
    pub(crate) fn replay(&mut self) -> Result<(), StoreError> {
        let started = Instant::now();
        let max = self.options.limits.record_bytes_max;
        let mut txn = self.db.begin_write().map_err(StoreError::redb)?;
        txn.set_durability(redb::Durability::Immediate)
            .map_err(StoreError::redb)?;
        let folded: Option<(u64, CausalContext)> = meta_get(&txn, META_FOLDED, max)?;
        let Some((from, mut ctx)) = folded else {
            let ctx = self.ctx.clone();
            meta_put(&txn, META_FOLDED, &(self.log_end, &ctx))?;
            txn.commit().map_err(StoreError::redb)?;
            self.folded_seq = self.log_end;
            return Ok(());
        };
        if from > self.log_end {
            return Err(StoreError::Corrupt(format!(
                "folded log seq {from} is beyond the log end {}",
                self.log_end
            )));
        }
        if from < self.log_start {
            return Err(StoreError::Corrupt(format!(
                "log records {from}..{} above the last fold were compacted away",
                self.log_start
            )));
        }
        self.folded_seq = from;
        if from == self.log_end {
            return Ok(());
        }
        let mut records = 0u64;
        {
            let log = txn.open_table(LOG).map_err(StoreError::redb)?;
            let (mut rows_t, mut elems_t, mut dots_t) =
                super::rows::open_state_tables(&txn, &self.overlay)?;
            let mut rows = TxnRows {
                rows: &mut rows_t,
                elems: &mut elems_t,
                dots: &mut dots_t,
                record_bytes_max: max,
            };
            for item in log.range(from..self.log_end).map_err(StoreError::redb)? {
                let (_, v) = item.map_err(StoreError::redb)?;
                let record: LogRecord =
                    codec::decode("log record", v.value(), max).map_err(|source| {
                        StoreError::Codec {
                            table: "log",
                            source,
                        }
                    })?;
                join_delta(&mut rows, &mut ctx, record.delta.state)?;
                records += 1;
            }
        }
        if ctx != self.ctx {
            tracing::warn!(
                "the context replayed from the log differs from the committed one; keeping the committed one"
            );
        }
        let committed = self.ctx.clone();
        self.commit_staged(txn, self.log_end, &committed, true)?;
        self.checkpoint.replayed_records = records;
        self.checkpoint.replay_micros = micros(started);
        tracing::info!(
            records,
            micros = self.checkpoint.replay_micros,
            "replayed the log above the last fold"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{PeerId, StateStore};
    use crate::store::{DeltasSince, EventId, LocalWrite, OpenOptions};
    use tidemark_crdts::{Key, KeyKind, Mutation, ReplicaId, Store, Value};

    /// SplitMix64 (seeded, replayable with `SEED=`).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn random_op(rng: &mut Rng) -> (Key, Mutation) {
        let k = rng.below(12);
        match rng.below(9) {
            0 | 1 => (
                Key::new(KeyKind::GCounter, format!("g{k}")),
                Mutation::Inc(1 + rng.below(5)),
            ),
            2 => (
                Key::new(KeyKind::PNCounter, format!("p{k}")),
                Mutation::Dec(1 + rng.below(5)),
            ),
            3 | 4 => (
                Key::new(KeyKind::ORSet, format!("s{k}")),
                Mutation::Add(format!("\"e{}\"", rng.below(8))),
            ),
            5 => (
                Key::new(KeyKind::ORSet, format!("s{k}")),
                Mutation::Remove(format!("\"e{}\"", rng.below(8))),
            ),
            6 => (Key::new(KeyKind::ORSet, format!("s{k}")), Mutation::Delete),
            7 => (
                Key::new(KeyKind::Lww, format!("l{k}")),
                Mutation::Set(rng.below(100).to_string()),
            ),
            _ => (
                Key::new(KeyKind::MvReg, format!("m{k}")),
                Mutation::Set(rng.below(100).to_string()),
            ),
        }
    }

    fn options(me: ReplicaId, fold_groups: usize) -> OpenOptions {
        let mut o = OpenOptions {
            new_replica_id: Some(me),
            ..OpenOptions::default()
        };
        o.limits.fold_groups_max = fold_groups;
        o
    }

    fn assert_matches_model(store: &RedbStore, model: &Store, keys: &[Key], what: &str) {
        let reader = store.reader();
        for key in keys {
            let got = reader
                .get(key)
                .expect("read")
                .unwrap_or_else(|| Value::empty(key.kind));
            assert_eq!(got, model.get(key), "{what}: {key}");
        }
        // `list` merges the overlay's rows over the table's in key order.
        for kind in KeyKind::ALL {
            let listed = reader.list(kind, "", None, usize::MAX).expect("list");
            let want: Vec<(Key, Value)> = keys
                .iter()
                .filter(|k| k.kind == kind)
                .map(|k| (k.clone(), model.get(k)))
                .filter(|(k, v)| {
                    *v != Value::empty(k.kind) || reader.entry(k).ok().flatten().is_some()
                })
                .collect();
            assert_eq!(listed, want, "{what}: list of {kind:?}");
        }
        assert_eq!(store.ctx(), model.context(), "{what}: context");
        store.verify().expect("store invariants");
    }

    /// Seeded model test of the write-ahead overlay: groups of mixed ops interleaved with
    /// folds (due by `fold_groups_max`, or forced), drops without any fold (a crash after
    /// the commits) and reopens (replay). After every step every key reads what a sequential
    /// in-memory model holds (point reads and `list`), the context is the model's, `verify()`
    /// holds; a second replica that joins the first's log (remote joins through the overlay,
    /// also dropped and reopened) converges to the same entries; chunk reads see the overlay.
    #[test]
    fn interleaved_commits_folds_and_reopens_match_the_model() {
        let seed = std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0xF01D_u64);
        let dir_a = tempfile::tempdir().expect("tempdir");
        let dir_b = tempfile::tempdir().expect("tempdir");
        let (me, other) = (ReplicaId(11), ReplicaId(12));
        let mut rng = Rng(seed);
        let mut model = Store::new();
        let mut keys: Vec<Key> = Vec::new();
        let mut a =
            RedbStore::open(dir_a.path(), options(me, 1 + rng.below(6) as usize)).expect("open a");
        let mut b = RedbStore::open(dir_b.path(), options(other, 1 + rng.below(6) as usize))
            .expect("open b");
        let mut seq = 0u64;
        let mut replayed = 0u64;
        for step in 0..300u64 {
            let what = format!("seed {seed}, step {step}");
            match rng.below(10) {
                0 => a.fold_now().expect("fold"),
                1 => {
                    // A crash after the commits: nothing folded, the log is replayed.
                    let before = a.reader().entries().expect("entries");
                    drop(a);
                    a = RedbStore::open(dir_a.path(), options(me, 1 + rng.below(6) as usize))
                        .expect("reopen a");
                    replayed += a.checkpoint_stats().replayed_records;
                    assert_eq!(a.reader().entries().expect("entries"), before, "{what}");
                    assert!(a.overlay.borrow().is_empty(), "{what}: replay folds");
                }
                2 => {
                    let before = b.reader().entries().expect("entries");
                    drop(b);
                    b = RedbStore::open(dir_b.path(), options(other, 1 + rng.below(6) as usize))
                        .expect("reopen b");
                    assert_eq!(b.reader().entries().expect("entries"), before, "{what}");
                }
                3 => {
                    let DeltasSince::Deltas { delta, .. } =
                        a.deltas_since(b.ctx(), usize::MAX).expect("deltas")
                    else {
                        panic!("{what}: no compaction here");
                    };
                    if !delta.is_empty() {
                        b.apply_remote_delta(PeerId(1), delta, 1_000)
                            .expect("store")
                            .expect("valid");
                    }
                    b.verify().expect("b invariants");
                }
                _ => {
                    let mut writes = Vec::new();
                    for _ in 0..1 + rng.below(30) {
                        let ops: Vec<(Key, Mutation)> =
                            (0..1 + rng.below(3)).map(|_| random_op(&mut rng)).collect();
                        seq += 1;
                        writes.push(LocalWrite {
                            ops,
                            event: Some(EventId {
                                stream: "s".into(),
                                source: format!("src{}", seq % 3),
                                seq: seq / 3,
                            }),
                        });
                    }
                    let out = a.commit_local(&writes, 1_000 + step).expect("commit");
                    assert!(out.duplicate.iter().all(|d| !d), "{what}");
                    for w in &writes {
                        for (key, m) in &w.ops {
                            let ts =
                                (key.kind == KeyKind::Lww).then(|| tidemark_crdts::Timestamp {
                                    physical_ms: model.context().len(),
                                    logical: 0,
                                    replica: me,
                                });
                            model.mutate(me, key, m, ts).expect("model applies");
                            keys.push(key.clone());
                        }
                    }
                    keys.sort();
                    keys.dedup();
                    // A retry is all duplicates, also across a fold or a reopen.
                    let again = a.commit_local(&writes, 2_000 + step).expect("retry");
                    assert!(again.duplicate.iter().all(|d| *d), "{what}");
                }
            }
            assert_matches_model(&a, &model, &keys, &what);
            assert!(
                a.overlay.borrow().groups() < a.options.limits.fold_groups_max,
                "{what}: fold every N groups"
            );
            // State-transfer reads see the overlay's rows too.
            let mut chunked = Vec::new();
            let mut after: Option<Key> = None;
            loop {
                let c = a.read_chunk(after.as_ref(), 1 << 20).expect("chunk");
                assert!(c.part.is_none(), "{what}: small rows");
                chunked.extend(c.entries);
                after = c.last_key;
                if c.done {
                    break;
                }
            }
            assert_eq!(chunked, a.reader().entries().expect("entries"), "{what}");
        }
        assert!(replayed > 0, "seed {seed}: some reopen replayed the log");
        // Full exchange: b converges to a's state.
        let DeltasSince::Deltas { delta, .. } =
            a.deltas_since(b.ctx(), usize::MAX).expect("deltas")
        else {
            panic!("no compaction here");
        };
        if !delta.is_empty() {
            b.apply_remote_delta(PeerId(1), delta, 1_000)
                .expect("store")
                .expect("valid");
        }
        assert_eq!(
            b.reader().entries().expect("entries"),
            a.reader().entries().expect("entries"),
            "seed {seed}: b converged"
        );
        drop(b);
        let b = RedbStore::open(dir_b.path(), options(other, 4)).expect("reopen b");
        assert_eq!(
            b.reader().entries().expect("entries"),
            a.reader().entries().expect("entries"),
            "seed {seed}: b after replay"
        );
        b.verify().expect("b invariants");
    }

    /// Compaction never drops a log record the tables do not hold yet: compacting past the
    /// folded seq folds first, and a reopen after it still reads every write.
    #[test]
    fn compaction_past_the_fold_folds_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = ReplicaId(5);
        let mut store = RedbStore::open(dir.path(), options(me, 1_000)).expect("open");
        let key = Key::new(KeyKind::GCounter, "c");
        for i in 0..20u64 {
            let w = LocalWrite {
                ops: vec![(key.clone(), Mutation::Inc(1))],
                event: None,
            };
            store.commit_local(&[w], 1_000 + i).expect("commit");
        }
        assert_eq!(store.folded_seq(), 0);
        assert!(!store.overlay.borrow().is_empty());
        let end = store.log_bounds().1;
        store.compact(end).expect("compact");
        assert!(
            store.overlay.borrow().is_empty(),
            "compaction folded the overlay"
        );
        assert!(store.folded_seq() >= end);
        drop(store);
        let store = RedbStore::open(dir.path(), options(me, 1_000)).expect("reopen");
        assert_eq!(
            store.reader().get(&key).expect("read"),
            Some(Value::GCounter(20))
        );
        store.verify().expect("invariants");
    }
}
