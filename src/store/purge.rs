//! Stream-view retention hooks of the store: a filter that drops the entries of
//! expired view windows from remote deltas and state chunks before they are joined, and the
//! physical removal of expired rows.
//!
//! Both leave the causal context alone: a dropped or purged entry's dots stay in the context,
//! so to the join it is exactly as if the entry had been removed (observed-remove). A later
//! delta or chunk holding those dots cannot bring the entry back (the join keeps no dot the
//! context has seen and the state lacks), and the version vector — hence anti-entropy and
//! dot accounting — is unchanged. Counters are never deleted through the CRDT
//! (docs/design/principles.md, "What delete means"):
//! removal is a local, deterministic decision each node takes from the replicated horizon.

use super::RedbStore;
use super::error::StoreError;
use super::rows::with_txn_rows;
use crate::model::{Delta, StateChunk};
use std::sync::Arc;
use tidemark_crdts::{Key, Rows};

/// Decides, per key of a remote delta or chunk, whether its entry is joined (`true`) or
/// dropped before the join (`false`).
pub type RemoteFilter = Arc<dyn Fn(&Key) -> bool + Send + Sync>;

impl RedbStore {
    /// Installs the filter applied to every remote delta and state chunk (after validation,
    /// before the join).
    pub fn set_remote_filter(&mut self, filter: RemoteFilter) {
        self.remote_filter = Some(filter);
    }

    /// `delta` without the entries the remote filter drops; returns how many it dropped.
    pub(crate) fn filter_remote_delta(&self, delta: &mut Delta) -> usize {
        let Some(keep) = &self.remote_filter else {
            return 0;
        };
        let drop: Vec<Key> = delta
            .state
            .store
            .keys()
            .filter(|k| !keep(k))
            .cloned()
            .collect();
        for k in &drop {
            delta.state.store.take(k);
        }
        drop.len()
    }

    /// `chunk` without the entries the remote filter drops; returns how many it dropped.
    pub(crate) fn filter_remote_chunk(&self, chunk: &mut StateChunk) -> usize {
        let Some(keep) = &self.remote_filter else {
            return 0;
        };
        let before = chunk.entries.len();
        chunk.entries.retain(|(k, _)| keep(k));
        before - chunk.entries.len()
    }

    /// Removes the rows of `keys` and their dot-index entries in one transaction, keeping the
    /// context (their dots stay seen). Returns the number of rows removed.
    ///
    /// # Errors
    /// Storage failures (the store halts).
    pub fn purge_rows(&mut self, keys: &[Key]) -> Result<usize, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        self.guarded(|s| {
            let txn = s.begin()?;
            let removed = with_txn_rows(&txn, s.options.limits.record_bytes_max, |rows| {
                let mut removed = 0;
                for key in keys {
                    if let Some(old) = rows.get(key)? {
                        rows.put(key, Some(&old), None)?;
                        removed += 1;
                    }
                }
                Ok(removed)
            })?;
            if removed > 0 {
                super::late::forget_marks(&txn, keys.iter().map(|k| k.name.as_str()))?;
            }
            if removed == 0 {
                txn.abort().map_err(StoreError::redb)?;
            } else {
                s.commit(txn)?;
                s.stats.commits += 1;
            }
            Ok(removed)
        })
    }
}
