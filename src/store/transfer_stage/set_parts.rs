//! A large set received in parts joined part by part (docs/design/replication.md, "State
//! transfer"): each part is validated as the merged row would be, then joined into the
//! element rows under the transfer's context inside its dot slice
//! ([`admission::RangeJoin::join_set_part`]); the last part removes the local dots no part
//! carried ([`admission::RangeJoin::close_set`], a window of elements at a time). So the
//! receiver holds one part (and the local elements it names, or a window), never the whole
//! set, and the result is exactly the join of the set put back together (see
//! `admission::set_parts`).

use super::{RedbStore, Stream};
use crate::model::{DotSlice, Rejected};
use crate::proto::PeerId;
use crate::store::error::StoreError;
use crate::store::rows::with_txn_rows;
use crate::store::split::{Unknown, successors};
use redb::WriteTransaction;
use tidemark_crdts::{DotMap, DotStore, Entry, Key};

/// One part of a large set, as staged.
pub(super) struct SetPart {
    /// The set's key.
    pub key: Key,
    /// The part's entries (the set's part, or none when the slice holds no dot of it).
    pub entries: Vec<(Key, Entry)>,
    /// The part's dot slice.
    pub slice: DotSlice,
    /// The set's last part.
    pub closes: bool,
}

impl RedbStore {
    /// Joins one part of a large set: the first part first joins the local keys between the
    /// previous range and the set (as the range ending at the set would), the last part ends
    /// the set's range; the inflation is logged part by part (`RedbStore::log_batch`), the
    /// set's removals with its last part — its local dots the parts removed, and the
    /// transfer's removals of no known key placed on the set's key (`Stream::set_unknown`).
    pub(super) fn join_set_part(
        &mut self,
        txn: &WriteTransaction,
        origin: PeerId,
        part: SetPart,
        st: &mut Stream,
    ) -> Result<Result<(), Rejected>, StoreError> {
        let SetPart {
            key,
            entries,
            slice,
            closes,
        } = part;
        let after_marks = || Ok(Err(Rejected::BadChunk("rows after the transfer's dedup marks")));
        if st.join.is_none() {
            return after_marks();
        }
        // The checks the merged row would get (per element, so per part alike).
        let entries = match self.check_as_merged(st, st.lo.clone(), entries, false) {
            Ok(entries) => entries,
            Err(reason) => return Ok(Err(reason)),
        };
        let Some(join) = st.join.as_mut() else {
            return after_marks();
        };
        if st.lo.as_ref().is_some_and(|lo| *lo >= key) {
            // Parts of a row at or before a range already joined (no correct sender sends
            // them): the check above refused any entry, so they carry nothing, and the merged
            // transfer would not join the row again either.
            return Ok(Ok(()));
        }
        let mut theirs = DotMap::default();
        for (k, entry) in entries {
            match entry {
                Entry::ORSet(m) if k == key => theirs = m,
                // `PartsCheck` and the kind check above leave nothing else.
                _ => return Ok(Err(Rejected::BadChunk("entry outside the chunk's row"))),
            }
        }
        if let Some(keep) = &self.remote_filter {
            if !keep(&key) {
                theirs = DotMap::default();
            }
        }
        let slice_ctx = slice.clip(&st.tctx);
        let max = self.options.limits.record_bytes_max;
        let (local, tctx, lo) = (&st.local, &st.tctx, st.lo.as_ref());
        let held = with_txn_rows(txn, max, |rows| {
            if join.open_set_key() != Some(&key) {
                join.join_range_before(rows, local, lo, &key, tctx)?;
            }
            let held = join.join_set_part(rows, local, &key, theirs, &slice_ctx)?;
            if closes {
                return Ok(held.max(join.close_set(rows, tctx)?));
            }
            Ok(held)
        })?;
        self.stats.transfer_held_elems_peak = self.stats.transfer_held_elems_peak.max(held as u64);
        if closes {
            st.lo = Some(key.clone());
        }
        let mut batch = join.take_batch();
        // The transfer's removals of no known key placed on the set's key (`split::successors`:
        // with the next dot of their replica, which this part carries) wait for the set's last
        // part: a removal placed so may be an old dot of an element whose new dot a later part
        // carries, and a peer applying the run up to this part would lose that element.
        if let Some((inflation, _)) = &batch {
            if let Some(entry) = inflation.store.get(&key) {
                let unknown = Unknown {
                    removed: &st.removals,
                    carried: &st.carried_indexed,
                    except: None,
                };
                let set_unknown = &mut st.set_unknown;
                entry.for_each_dot(&mut |d| successors(&unknown, d, set_unknown));
            }
        }
        if closes && !st.set_unknown.is_empty() {
            // Logged with the set's retirement (its removals and changed key, reported by
            // `close_set`), in its last part's records.
            let held_back = std::mem::take(&mut st.set_unknown);
            let (inflation, by_key) = batch.get_or_insert_with(Default::default);
            inflation.ctx.join(&held_back);
            by_key.push((key, held_back));
        }
        if let Some((inflation, by_key)) = batch {
            self.log_batch(txn, origin, inflation, by_key, st)?;
        }
        Ok(Ok(()))
    }
}
