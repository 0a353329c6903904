//! The simulation's node storage: the production [`RedbStore`] on an in-memory redb backend
//! (`tests/common`'s [`FaultBackend`], not recording), so every line the simulation exercises is a
//! line users run. A crash reopens the store from the backend's image (every commit is synced in
//! `Immediate` durability) and checks that the reopened store serves exactly what the crashed
//! one did.

use crate::common::FaultBackend;
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use tidemark::codec::{self, CodecError};
use tidemark::config::Limits;
use tidemark::model::Delta;
use tidemark::proto::{PeerId, StateStore};
use tidemark::store::{EventId, LocalWrite, OpenOptions, RedbStore, StoreError};
use tidemark_crdts::{
    CausalContext, DedupMarks, DotMap, Entry, Key, Mutation, ReplicaId, StoreDelta, Value,
};

/// A [`RedbStore`] plus its backend (dereferences to the store).
pub struct SimStore {
    db: RedbStore,
    backend: FaultBackend,
    options: OpenOptions,
}

impl Deref for SimStore {
    type Target = RedbStore;
    fn deref(&self) -> &RedbStore {
        &self.db
    }
}

impl DerefMut for SimStore {
    fn deref_mut(&mut self) -> &mut RedbStore {
        &mut self.db
    }
}

impl SimStore {
    /// A new, empty store for `replica`.
    pub fn new(replica: ReplicaId, limits: Limits) -> Self {
        let options = OpenOptions {
            limits,
            new_replica_id: Some(replica),
            ..OpenOptions::default()
        };
        let backend = FaultBackend::default();
        let db = RedbStore::open_with_backend(backend.clone(), options.clone())
            .expect("open an in-memory store");
        Self {
            db,
            backend,
            options,
        }
    }

    /// Commits one client write (with its event id, if any) as one group; returns the group's
    /// logged delta (`None` when every write was a duplicate event).
    ///
    /// # Errors
    /// [`StoreError::InvalidOp`] for a write that does not apply (nothing was written).
    pub fn apply_local(
        &mut self,
        ops: &[(Key, Mutation)],
        event: Option<EventId>,
        wall_ms: u64,
    ) -> Result<Option<Delta>, StoreError> {
        let write = LocalWrite {
            ops: ops.to_vec(),
            event,
            stamps: Vec::new(),
            late: None,
            own_dots: false,
        };
        let commit = self.db.commit_local(&[write], wall_ms)?;
        let Some(seq) = commit.log_seq else {
            return Ok(None);
        };
        let iv = self.db.log_interval(seq, None, usize::MAX)?;
        Ok(iv.delta)
    }

    /// Every entry, ascending by key.
    pub fn entries(&self) -> BTreeMap<Key, Entry> {
        self.db
            .reader()
            .entries()
            .expect("read the rows")
            .into_iter()
            .collect()
    }

    /// The value of `key` (the empty value of its kind when absent).
    pub fn value(&self, key: &Key) -> Value {
        self.db
            .reader()
            .get(key)
            .expect("read a row")
            .unwrap_or_else(|| Value::empty(key.kind))
    }

    /// Every dedup mark.
    pub fn marks(&mut self) -> DedupMarks {
        self.db.dedup_marks().expect("read the dedup marks")
    }

    /// The replicated state (entries, context, marks) as one delta.
    pub fn state(&mut self) -> Delta {
        let mut store = DotMap::default();
        for (k, e) in self.entries() {
            store.set(k, e);
        }
        Delta {
            state: StoreDelta {
                store,
                ctx: self.db.ctx().clone(),
            },
            marks: self.marks(),
        }
    }

    /// The canonical encoding of the replicated state: equal bytes iff equal state.
    ///
    /// # Errors
    /// Over the codec's ceiling.
    pub fn canonical_bytes(&mut self) -> Result<Vec<u8>, CodecError> {
        let state = self.state();
        codec::encode("state", &state)
    }

    /// Number of retained log entries.
    pub fn log_len(&self) -> usize {
        usize::try_from(self.db.log_len()).unwrap_or(usize::MAX)
    }

    /// What a restart sees: the store reopened from its durable image. Panics unless it serves
    /// exactly what this one did (state, log, cursors of `peers`, clock mark) and passes redb's
    /// integrity check and `verify`.
    pub fn reopen(&mut self, peers: usize) -> SimStore {
        let backend = FaultBackend::from_image(self.backend.live());
        let mut db = RedbStore::open_with_backend(backend.clone(), self.options.clone())
            .expect("reopen from the durable image");
        assert!(db.check_integrity().expect("integrity check"));
        db.verify().expect("verify after reopen");
        let mut again = SimStore {
            db,
            backend,
            options: self.options.clone(),
        };
        assert_eq!(again.replica(), self.replica(), "the replica id changed");
        assert_eq!(again.state(), self.state(), "the reopened state differs");
        assert_eq!(
            again.log_bounds(),
            self.log_bounds(),
            "the log bounds differ"
        );
        for j in 0..peers {
            let p = PeerId(j as u64);
            assert_eq!(
                again.peer_cursor(p),
                self.peer_cursor(p),
                "a cursor differs"
            );
        }
        assert_eq!(again.hlc_mark(), self.hlc_mark(), "the clock mark differs");
        let start = self.log_bounds().0;
        assert_eq!(
            again.log_interval(start, None, usize::MAX).ok(),
            self.log_interval(start, None, usize::MAX).ok(),
            "the retained log differs"
        );
        again
    }

    /// The context (shorthand for the store's).
    pub fn context(&self) -> &CausalContext {
        self.db.ctx()
    }
}
